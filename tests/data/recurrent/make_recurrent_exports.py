"""Make the small real recurrent exporter outputs that tests/test_recurrent.py imports. Run once; outputs are kept.

Written with the exporters themselves, in a throwaway virtualenv (the project's stays clean):

    python3 -m venv /tmp/rec_venv
    /tmp/rec_venv/bin/pip install torch==2.13.0 rsl-rl-lib==5.5.1 onnx onnxscript
    /tmp/rec_venv/bin/python tests/data/recurrent/make_recurrent_exports.py

Files (all tiny):

* ``rsl_rl_lstm_opset11.onnx``: rsl-rl-lib 5.5.1 ``RNNModel`` (rnn_type "lstm", 10 observations -> LSTM(16) ->
  MLP [16] ELU -> 4, ``EmpiricalNormalization`` with statistics updated on random data, Gaussian distribution),
  ``as_onnx()`` exported the way IsaacLab's ``export_policy_as_onnx`` does: the TorchScript-based (legacy)
  exporter, opset 11, ``dynamic_axes={}``; inputs ``obs`` [1, 10], ``h_in``, ``c_in`` [1, 1, 16]; outputs
  ``actions``, ``h_out``, ``c_out``.
* ``rsl_rl_lstm_opset18.onnx``: the same model, legacy exporter at opset 18.
* ``rsl_rl_lstm_dynamo.onnx``: the same model exported as rsl-rl-lib 5.5.1's
  ``OnPolicyRunner.export_policy_to_onnx`` calls ``torch.onnx.export`` (opset 18, no ``dynamo=`` argument, so
  torch 2.13's default dynamo exporter: gate reordering left as Slice / Concat on the initializers).
* ``rsl_rl_gru_opset11.onnx``, ``rsl_rl_gru_dynamo.onnx``: the same with rnn_type "gru" (inputs ``obs``,
  ``h_in``; outputs ``actions``, ``h_out``).
* ``rsl_rl_lstm_policy.pt``, ``rsl_rl_gru_policy.pt``: ``as_jit()`` scripted and saved as rsl-rl-lib 5.5.1's
  ``export_policy_to_jit`` does (``_TorchLSTMModel`` / ``_TorchGRUModel``: obs_normalizer -> rnn -> mlp ->
  deterministic_output, ``hidden_state`` / ``cell_state`` buffers updated in place, ``reset()``).
* ``isaaclab_lstm_policy.pt``: IsaacLab's ``policy.pt`` for a recurrent policy (``_TorchPolicyExporter``:
  normalizer, rnn, actor, h/c buffers, ``forward = forward_lstm``; scripting drops its ``reset``). IsaacLab is
  not installable here, so the wrapper is a plain-torch module with the same structure and code, around
  rsl-rl-lib's EmpiricalNormalization and the model's LSTM and MLP.
* ``legged_gym_g1_lstm.pt``: legged_gym's ``PolicyExporterLSTM`` with the shape of Unitree's G1
  ``deploy/pre_train/g1/motion.pt``: ``memory`` LSTM(47 -> 64), ``actor`` Linear(64, 32) ELU Linear(32, 12), h/c
  buffers (1, 1, 64), ``reset_memory()``; random weights (legged_gym is not a package: plain torch, same code).
* ``rsl_rl_lstm_dynamo_noopt.onnx``: the same LSTM model through the dynamo exporter with ``optimize=False``
  (the form older torch versions wrote by default): the gate reordering is left in the graph as Slice /
  Concat on the initializers, the state input sliced by a Shape-computed Slice, Elu wrapped in Mul by 1.
* ``outputs.npz``: raw observation sequences and what the exporters' own eager modules answer, state carried
  from a zero state (float32): ``X_rsl`` (300, 10), ``y_lstm``, ``y_gru`` (300, 4); ``X_g1`` (300, 47),
  ``y_g1`` (300, 12).
"""
from __future__ import annotations

import copy
import os
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
warnings.filterwarnings("ignore")
N_OBS, H, N_ACT = 10, 16, 4


def rnn_model(rnn_type):
    from rsl_rl.models import RNNModel
    from tensordict import TensorDict
    torch.manual_seed(0 if rnn_type == "lstm" else 1)
    obs = TensorDict({"policy": torch.zeros(4, N_OBS)}, batch_size=[4])
    model = RNNModel(obs, {"actor": ["policy"]}, "actor", N_ACT, hidden_dims=[16], activation="elu",
                     obs_normalization=True, distribution_cfg={"class_name": "GaussianDistribution", "init_std": 1.0},
                     rnn_type=rnn_type, rnn_hidden_dim=H, rnn_num_layers=1)
    model.train()
    data = torch.randn(256, N_OBS) * torch.linspace(0.5, 3.0, N_OBS) + torch.linspace(-2.0, 2.0, N_OBS)
    model.update_normalization(TensorDict({"policy": data}, batch_size=[256]))
    model.eval()
    return model


def export_onnx(onnx_model, name, opset, legacy):
    kw = dict(export_params=True, opset_version=opset, input_names=onnx_model.input_names,
              output_names=onnx_model.output_names)
    if legacy:
        kw.update(dynamo=False, dynamic_axes={})
    else:
        kw.update(verbose=False)            # rsl-rl-lib 5.5.1 export_policy_to_onnx: no dynamo= argument
    torch.onnx.export(onnx_model, onnx_model.get_dummy_inputs(), os.path.join(HERE, name), **kw)


def run_eager(onnx_model, X, lstm):
    """The eager export module, state carried as the caller of the ONNX graph carries it."""
    h = torch.zeros(1, 1, H)
    c = torch.zeros(1, 1, H)
    out = []
    with torch.no_grad():
        for x in X:
            x = torch.as_tensor(x, dtype=torch.float32).reshape(1, -1)
            if lstm:
                a, h, c = onnx_model(x, h, c)
            else:
                a, h, _ = onnx_model(x, h)
            out.append(a.double().numpy().reshape(-1))
    return np.array(out, dtype=np.float32)


class _TorchPolicyExporter(torch.nn.Module):
    """IsaacLab source/isaaclab_rl/isaaclab_rl/rsl_rl/exporter.py ``_TorchPolicyExporter`` (recurrent branch)."""

    def __init__(self, actor, rnn, normalizer=None):
        super().__init__()
        self.is_recurrent = True
        self.actor = copy.deepcopy(actor)
        self.rnn = copy.deepcopy(rnn)
        self.rnn.cpu()
        self.register_buffer("hidden_state", torch.zeros(self.rnn.num_layers, 1, self.rnn.hidden_size))
        self.register_buffer("cell_state", torch.zeros(self.rnn.num_layers, 1, self.rnn.hidden_size))
        self.forward = self.forward_lstm
        self.reset = self.reset_memory
        self.normalizer = copy.deepcopy(normalizer) if normalizer else torch.nn.Identity()

    def forward_lstm(self, x):
        x = self.normalizer(x)
        x, (h, c) = self.rnn(x.unsqueeze(0), (self.hidden_state, self.cell_state))
        self.hidden_state[:] = h
        self.cell_state[:] = c
        x = x.squeeze(0)
        return self.actor(x)

    def forward(self, x):
        return self.actor(self.normalizer(x))

    @torch.jit.export
    def reset(self):
        pass

    def reset_memory(self):
        self.hidden_state[:] = 0.0
        self.cell_state[:] = 0.0


class PolicyExporterLSTM(torch.nn.Module):
    """legged_gym legged_gym/utils/helpers.py ``PolicyExporterLSTM`` (actor_critic.actor, memory_a.rnn)."""

    def __init__(self, actor, memory):
        super().__init__()
        self.actor = copy.deepcopy(actor)
        self.is_recurrent = True
        self.memory = copy.deepcopy(memory)
        self.memory.cpu()
        self.register_buffer("hidden_state", torch.zeros(self.memory.num_layers, 1, self.memory.hidden_size))
        self.register_buffer("cell_state", torch.zeros(self.memory.num_layers, 1, self.memory.hidden_size))

    def forward(self, x):
        out, (h, c) = self.memory(x.unsqueeze(0), (self.hidden_state, self.cell_state))
        self.hidden_state[:] = h
        self.cell_state[:] = c
        return self.actor(out.squeeze(0))

    @torch.jit.export
    def reset_memory(self):
        self.hidden_state[:] = 0.0
        self.cell_state[:] = 0.0


def rsl_rl():
    out = {}
    X = (torch.randn(300, N_OBS, generator=torch.Generator().manual_seed(1)) * 2.0).numpy().astype(np.float64)
    out["X_rsl"] = X.astype(np.float32)
    for rnn_type in ("lstm", "gru"):
        model = rnn_model(rnn_type)
        onnx_model = model.as_onnx(verbose=False)
        onnx_model.eval()
        export_onnx(onnx_model, f"rsl_rl_{rnn_type}_opset11.onnx", 11, legacy=True)
        if rnn_type == "lstm":
            export_onnx(onnx_model, "rsl_rl_lstm_opset18.onnx", 18, legacy=True)
        export_onnx(onnx_model, f"rsl_rl_{rnn_type}_dynamo.onnx", 18, legacy=False)
        if rnn_type == "lstm":
            torch.onnx.export(onnx_model, onnx_model.get_dummy_inputs(), os.path.join(HERE, "rsl_rl_lstm_dynamo_noopt.onnx"),
                              export_params=True, opset_version=18, input_names=onnx_model.input_names,
                              output_names=onnx_model.output_names, optimize=False)
        jit_model = model.as_jit()
        jit_model.to("cpu")
        torch.jit.script(jit_model).save(os.path.join(HERE, f"rsl_rl_{rnn_type}_policy.pt"))
        out[f"y_{rnn_type}"] = run_eager(onnx_model, X, rnn_type == "lstm")
        if rnn_type == "lstm":
            from rsl_rl.modules import EmpiricalNormalization
            normalizer = EmpiricalNormalization(N_OBS)
            normalizer.load_state_dict(model.obs_normalizer.state_dict())
            normalizer.eval()
            actor = torch.nn.Sequential(*[m for m in model.mlp])
            exporter = _TorchPolicyExporter(actor, model.rnn.rnn, normalizer)
            exporter.eval()
            torch.jit.script(exporter).save(os.path.join(HERE, "isaaclab_lstm_policy.pt"))
    return out


def g1():
    torch.manual_seed(2)
    memory = torch.nn.LSTM(input_size=47, hidden_size=64, num_layers=1)
    actor = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ELU(alpha=1.0), torch.nn.Linear(32, 12))
    exporter = PolicyExporterLSTM(actor, memory)
    exporter.eval()
    torch.jit.script(exporter).save(os.path.join(HERE, "legged_gym_g1_lstm.pt"))
    X = (torch.randn(300, 47, generator=torch.Generator().manual_seed(3)) * 1.5).numpy().astype(np.float64)
    exporter.reset_memory()
    with torch.no_grad():
        y = np.array([exporter(torch.as_tensor(x, dtype=torch.float32).reshape(1, -1)).double().numpy().reshape(-1)
                      for x in X], dtype=np.float32)
    return {"X_g1": X.astype(np.float32), "y_g1": y}


def main():
    out = {**rsl_rl(), **g1()}
    np.savez(os.path.join(HERE, "outputs.npz"), **out)
    total = 0
    for f in sorted(os.listdir(HERE)):
        if f != os.path.basename(__file__) and not f.startswith("__"):
            size = os.path.getsize(os.path.join(HERE, f))
            total += size
            print(f"{size:8d}  {f}")
    print(f"{total:8d}  total bytes")


if __name__ == "__main__":
    main()
