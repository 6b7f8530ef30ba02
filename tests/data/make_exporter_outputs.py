"""Make the small real exporter outputs that tests/test_importers.py imports. Run once; the outputs are kept.

Written with the exporters themselves, in a throwaway virtualenv (so the project's stays clean):

    python -m venv /tmp/exporters
    /tmp/exporters/bin/pip install torch==2.13.0 rsl-rl-lib==5.5.1 stable-baselines3==2.9.2 onnx onnxscript
    /tmp/exporters/bin/python tests/data/make_exporter_outputs.py

Files (all tiny, < 200 kB together):

* ``rsl_rl_actor_opset11.onnx``: rsl-rl-lib 5.5.1 ``MLPModel`` 8 -> 16 -> 16 -> 4 ELU with
  ``EmpiricalNormalization`` (statistics updated on random data), ``as_onnx()`` exported the way IsaacLab's
  exporter does: the TorchScript-based (legacy) exporter, opset 11, input ``obs`` [1, 8], output ``actions``.
* ``rsl_rl_actor_dynamo.onnx`` + ``rsl_rl_actor_dynamo.onnx.data``: the same model exported the way
  rsl-rl-lib 5.5.1's ``OnPolicyRunner.export_policy_to_onnx`` calls ``torch.onnx.export`` (opset 18, no
  ``dynamo=`` argument, so torch 2.13's default dynamo exporter), which writes the larger weights to an
  external ``.onnx.data`` file.
* ``rsl_rl_policy.pt``: the same model's ``as_jit()`` scripted and saved as rsl-rl-lib 5.5.1's
  ``export_policy_to_jit`` does (``_TorchMLPModel``: obs_normalizer -> mlp -> deterministic_output).
* ``isaaclab_policy.pt``: IsaacLab's ``policy.pt`` layout (a module with ``normalizer`` and an ``actor``
  ``nn.Sequential``; forward ``actor(normalizer(x))``). IsaacLab itself is not installable here, so the
  wrapper is a plain-torch module with the same structure, around rsl-rl-lib's EmpiricalNormalization.
* ``legged_gym_policy_1.pt``: legged_gym's ``torch.jit.script(actor)`` of a plain ``nn.Sequential``
  (8 -> 16 -> 16 -> 4 ELU), no normaliser (plain torch: legged_gym is not a package).
* ``sb3_ppo.onnx``: stable-baselines3 2.9.2 PPO on Pendulum-v1 (3 obs, 1 action, net_arch [8, 8], Tanh),
  exported with ``OnnxableSB3Policy`` as in SB3's export guide (outputs action, value, log_prob), opset 17.
  ``sb3_ppo_vecnormalize.pkl`` is the ``VecNormalize.save()`` of its environment after 200 random steps and
  ``sb3_ppo_vecnormalize.npz`` the same statistics (mean, var, epsilon, clip_obs).
* ``sb3_sac_actor.onnx``: SB3 SAC on Pendulum-v1 (net_arch [8, 8], ReLU), the actor exported as in SB3's
  guide (Clip / Exp log-std branch, Tanh squash), opset 17.
* ``exporter_outputs.npz``: raw observations and what the exporters' own modules answer to them
  (``X_rsl``, ``y_rsl`` from the rsl_rl model; ``X_sb3``; ``y_ppo`` = PPO's deterministic action before
  SB3's clipping, for VecNormalize-normalised observations; ``y_sac``) so the tests can check imports
  without any runtime.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
warnings.filterwarnings("ignore")


def rsl_rl():
    from rsl_rl.models import MLPModel
    from rsl_rl.modules import EmpiricalNormalization
    from tensordict import TensorDict
    torch.manual_seed(0)
    obs = TensorDict({"policy": torch.zeros(4, 8)}, batch_size=[4])
    model = MLPModel(obs, {"actor": ["policy"]}, "actor", 4, hidden_dims=[16, 16], activation="elu",
                     obs_normalization=True, distribution_cfg={"class_name": "GaussianDistribution", "init_std": 1.0})
    model.train()
    data = torch.randn(256, 8) * torch.linspace(0.5, 3.0, 8) + torch.linspace(-2.0, 2.0, 8)
    model.update_normalization(TensorDict({"policy": data}, batch_size=[256]))
    model.eval()

    onnx_model = model.as_onnx(verbose=False)
    onnx_model.eval()
    torch.onnx.export(onnx_model, onnx_model.get_dummy_inputs(), os.path.join(HERE, "rsl_rl_actor_opset11.onnx"),
                      export_params=True, opset_version=11, input_names=onnx_model.input_names,
                      output_names=onnx_model.output_names, dynamic_axes={}, dynamo=False)
    torch.onnx.export(onnx_model, onnx_model.get_dummy_inputs(), os.path.join(HERE, "rsl_rl_actor_dynamo.onnx"),
                      export_params=True, opset_version=18, verbose=False, input_names=onnx_model.input_names,
                      output_names=onnx_model.output_names)
    torch.jit.script(model.as_jit()).save(os.path.join(HERE, "rsl_rl_policy.pt"))

    class PolicyExporter(torch.nn.Module):          # IsaacLab's policy.pt layout (normalizer + actor)
        def __init__(self, actor, normalizer):
            super().__init__()
            self.is_recurrent = False
            self.actor = actor
            self.normalizer = normalizer

        def forward(self, x):
            return self.actor(self.normalizer(x))

        @torch.jit.export
        def reset(self):
            pass

    actor = torch.nn.Sequential(*[m for m in model.mlp])
    normalizer = EmpiricalNormalization(8)
    normalizer.load_state_dict(model.obs_normalizer.state_dict())
    normalizer.eval()
    torch.jit.script(PolicyExporter(actor, normalizer)).save(os.path.join(HERE, "isaaclab_policy.pt"))
    torch.jit.script(torch.nn.Sequential(*[m for m in model.mlp])).save(os.path.join(HERE, "legged_gym_policy_1.pt"))

    X = (torch.randn(64, 8, generator=torch.Generator().manual_seed(1)) * 3.0).double()
    with torch.no_grad():
        y = onnx_model(X.float()).double()
    return {"X_rsl": X.numpy(), "y_rsl": y.numpy()}


def sb3():
    import gymnasium as gym
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    class OnnxableSB3Policy(torch.nn.Module):       # SB3 docs/guide/export.rst
        def __init__(self, policy):
            super().__init__()
            self.policy = policy

        def forward(self, observation):
            return self.policy(observation, deterministic=True)

    class OnnxablePolicy(torch.nn.Module):          # the SAC actor, as in the same guide
        def __init__(self, actor):
            super().__init__()
            self.actor = actor

        def forward(self, observation):
            return self.actor(observation, deterministic=True)

    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), norm_obs=True, norm_reward=True, clip_obs=10.0)
    venv.seed(0)
    venv.reset()
    rng = np.random.default_rng(0)
    for _ in range(200):
        venv.step(rng.uniform(-2, 2, size=(1, 1)))
    venv.save(os.path.join(HERE, "sb3_ppo_vecnormalize.pkl"))
    np.savez(os.path.join(HERE, "sb3_ppo_vecnormalize.npz"), mean=venv.obs_rms.mean, var=venv.obs_rms.var,
             epsilon=venv.epsilon, clip_obs=venv.clip_obs)

    ppo = PPO("MlpPolicy", venv, policy_kwargs=dict(net_arch=[8, 8]), device="cpu", seed=0)
    dummy = torch.randn(1, 3)
    torch.onnx.export(OnnxableSB3Policy(ppo.policy), dummy, os.path.join(HERE, "sb3_ppo.onnx"), opset_version=17,
                      input_names=["input"], dynamo=False)
    sac = SAC("MlpPolicy", gym.make("Pendulum-v1"), policy_kwargs=dict(net_arch=[8, 8]), device="cpu", seed=0)
    torch.onnx.export(OnnxablePolicy(sac.policy.actor), dummy, os.path.join(HERE, "sb3_sac_actor.onnx"),
                      opset_version=17, input_names=["input"], dynamo=False)

    X = rng.normal(0.0, 1.0, size=(64, 3)) * [1.0, 1.0, 6.0]
    Z = np.clip((X - venv.obs_rms.mean) / np.sqrt(venv.obs_rms.var + venv.epsilon), -venv.clip_obs, venv.clip_obs)
    with torch.no_grad():
        y_ppo = ppo.policy(torch.as_tensor(Z, dtype=torch.float32), deterministic=True)[0].double().numpy()
        y_sac = sac.policy.actor(torch.as_tensor(X, dtype=torch.float32), deterministic=True).double().numpy()
    return {"X_sb3": X, "y_ppo": y_ppo, "y_sac": y_sac}


def main():
    out = {**rsl_rl(), **sb3()}
    np.savez(os.path.join(HERE, "exporter_outputs.npz"), **out)
    total = 0
    for f in sorted(os.listdir(HERE)):
        if f != os.path.basename(__file__):
            size = os.path.getsize(os.path.join(HERE, f))
            total += size
            print(f"{size:8d}  {f}")
    print(f"{total:8d}  total bytes")


if __name__ == "__main__":
    main()
