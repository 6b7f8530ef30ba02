"""TorchScript policies (legged_gym ``policy_1.pt``, IsaacLab / rsl-rl-lib ``policy.pt``) -> :class:`Folded`.

The archive is opened with ``torch.jit.load`` (never ``torch.load``: a pickled checkpoint is refused,
not unpickled). The scripted module is walked through its ``forward`` graphs: a container's forward
must be a straight chain of submodule calls (``nn.Sequential``, rsl_rl's ``MLP``, IsaacLab's
``_TorchPolicyExporter`` = ``actor(normalizer(x))``, rsl-rl-lib 5's ``_TorchMLPModel`` =
``deterministic_output(mlp(obs_normalizer(x)))``), and each leaf must be one of:

* ``Linear`` -> a dense layer (W stored [out, in], transposed to [in, out]);
* ``ELU(alpha)``, ``ReLU``, ``SELU``, ``LeakyReLU(negative_slope)``, ``CELU(alpha)``, ``Tanh``,
  ``Sigmoid``, ``Softplus`` (beta=1, threshold=20 only), ``SiLU``, ``Identity``;
* rsl_rl's ``EmpiricalNormalization`` (buffers ``_mean``, ``_std``, attribute ``eps``; forward
  ``(x - _mean) / (_std + eps)``, eps 1e-2) -> mean, scale = std + eps;
* ``Unflatten(-1, (2, A))`` followed by rsl-rl-lib's ``_FirstSliceDeterministicOutput`` -> the mean half.

Recurrent modules (LSTM / GRU / RNN, or ``hidden_state`` / ``cell_state`` buffers) are refused for now.
"""
from __future__ import annotations

import os
import re
import warnings
import zipfile

import numpy as np

from control_node.kernels.importers.common import Builder, ImportRefused, sha256_files

ACTIVATIONS = {"ELU": "elu", "ReLU": "relu", "SELU": "selu", "LeakyReLU": "leaky_relu", "CELU": "celu",
               "Tanh": "tanh", "Sigmoid": "sigmoid", "Softplus": "softplus", "SiLU": "silu"}
LEAVES = ("Linear", "Identity", "Unflatten") + tuple(ACTIVATIONS)
RECURRENT = ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell")
FIX = ("export the actor as torch.jit.script(nn.Sequential(Linear, activation, ...)) with supported "
       "activations (ELU, ReLU, SELU, LeakyReLU, CELU, Tanh, Sigmoid, Softplus, SiLU, Identity)")


def _torch(file):
    try:
        import torch
    except ImportError:
        raise ImportRefused(file, "package torch", "is not installed (needed to read TorchScript)",
                            "pip install 'control-node[torch]'") from None
    return torch


def _qualname(m) -> str:
    return re.sub(r"___torch_mangle_\d+\.", "", m._c._type().qualified_name())


def _kind(m) -> str:
    """'torch.nn:<Name>' for a torch.nn leaf, 'normalizer' for EmpiricalNormalization, else 'module'."""
    q = _qualname(m)
    if q.startswith("__torch__.torch.nn.modules.") and m.original_name in LEAVES:
        return "torch.nn:" + m.original_name
    if q.endswith(".EmpiricalNormalization"):
        return "normalizer"
    if q.endswith("._FirstSliceDeterministicOutput"):
        return "first_slice"
    return "module"


def _label(path, m):
    return f"submodule '{path or '(top)'}' ({m.original_name})"


def _archive_version(path):
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/version") and n.count("/") == 1), None)
            return z.read(name).decode().strip() if name else None
    except (zipfile.BadZipFile, OSError, KeyError):
        return None


def load(path):
    """``torch.jit.load`` on CPU; refuses what is not a TorchScript archive. Returns the module."""
    torch = _torch(os.path.basename(path))
    file = os.path.basename(path)
    try:
        with warnings.catch_warnings():      # torch 2.13 deprecates TorchScript; exporters still write it
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(os.fspath(path), map_location="cpu")
    except Exception as e:          # RuntimeError from the archive reader for checkpoints / state_dicts
        raise ImportRefused(file, "(file)", f"not a TorchScript archive ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}); checkpoints and state_dicts are not "
                            "unpickled", "export with torch.jit.script(policy).save('policy.pt') (IsaacLab / rsl_rl "
                            "play.py writes exported/policy.pt)") from None


def _refuse_recurrent(file, module):
    for path, m in module.named_modules():
        if m.original_name in RECURRENT:
            raise ImportRefused(file, _label(path, m), "recurrent policies (LSTM / GRU) are not supported yet",
                                "import a feed-forward (MLP) policy; recurrent support is planned")
        bufs = [n for n, _ in m.named_buffers(recurse=False)]
        if {"hidden_state", "cell_state"} & set(bufs):
            raise ImportRefused(file, _label(path, m), f"has recurrent state buffers {bufs}: recurrent policies are "
                                "not supported yet", "import a feed-forward (MLP) policy")


def _walk(file, m, path, steps):
    """Append (kind, path, module) leaves in the order ``forward`` calls them."""
    kind = _kind(m)
    if kind != "module":
        steps.append((kind, path, m))
        return
    graph = m.graph
    args = list(graph.inputs())
    if len(args) != 2:
        raise ImportRefused(file, _label(path, m), f"forward takes {len(args) - 1} arguments; the importer maps a "
                            "policy of one observation tensor", FIX)
    modules = {args[0].unique(): (m, path)}
    cur = args[1].unique()
    for node in graph.nodes():
        k = node.kind()
        if k == "prim::Constant":
            continue
        if k == "prim::GetAttr" and node.inputsAt(0).unique() in modules:
            parent, ppath = modules[node.inputsAt(0).unique()]
            name = node.s("name")
            child = getattr(parent, name)
            if not hasattr(child, "_c"):
                raise ImportRefused(file, _label(path, m), f"its forward reads the attribute '{name}' (not a "
                                    "submodule): only a chain of submodule calls maps", FIX)
            modules[node.output().unique()] = (child, f"{ppath}.{name}" if ppath else name)
            continue
        if k == "prim::CallMethod" and node.s("name") == "forward":
            ins = list(node.inputs())
            if ins[0].unique() not in modules or len(ins) != 2 or ins[1].unique() != cur:
                raise ImportRefused(file, _label(path, m), "its forward does not call its submodules as one chain "
                                    "x -> f(x) -> g(f(x))", FIX)
            child, cpath = modules[ins[0].unique()]
            _walk(file, child, cpath, steps)
            cur = node.output().unique()
            continue
        raise ImportRefused(file, _label(path, m), f"its forward runs {k} (type {_qualname(m)}); only chains of "
                            "supported modules map", FIX)
    outs = list(graph.outputs())
    if len(outs) != 1 or outs[0].unique() != cur:
        raise ImportRefused(file, _label(path, m), "its forward does not return the result of its chain of "
                            "submodules (e.g. it returns a tuple)", FIX)


def _np(t):
    return t.detach().cpu().double().numpy()


def fold(file, module):
    """The recognised policy as :class:`Folded`, plus the compute dtype of its weights."""
    torch = _torch(file)
    _refuse_recurrent(file, module)
    steps = []
    _walk(file, module, "", steps)
    linears = [s for s in steps if s[0] == "torch.nn:Linear"]
    if not linears:
        raise ImportRefused(file, _label("", module), "no Linear layer was found on the way to the action", FIX)
    n_features = int(linears[0][2].weight.shape[1])
    dtype = {torch.float32: "float32", torch.float64: "float64"}.get(linears[0][2].weight.dtype)
    if dtype is None:
        raise ImportRefused(file, _label(linears[0][1], linears[0][2]), f"weights are {linears[0][2].weight.dtype}",
                            "export the policy in float32 (module.float())")
    b = Builder(file, n_features)
    i = 0
    while i < len(steps):
        kind, path, m = steps[i]
        where = _label(path, m)
        name = kind.split(":", 1)[-1]
        if kind == "normalizer":
            _normalizer(file, b, m, where, torch)
        elif name == "Linear":
            W = _np(m.weight).T
            bias = _np(m.bias) if getattr(m, "bias", None) is not None else None
            b.dense(W, bias, where, f"Linear '{path}' {W.shape[0]} -> {W.shape[1]}")
        elif name == "Identity":
            pass
        elif name in ACTIVATIONS:
            b.activation(ACTIVATIONS[name], _alpha(file, name, m, where), where)
        elif name == "Unflatten" and i + 1 < len(steps) and steps[i + 1][0] == "first_slice":
            sizes = tuple(int(s) for s in m.unflattened_size)
            if int(m.dim) != -1 or len(sizes) != 2 or sizes[0] * sizes[1] != b.width:
                raise ImportRefused(file, where, f"Unflatten(dim={m.dim}, {sizes}) on {b.width} outputs; the "
                                    "importer maps Unflatten(-1, (2, A)) + the first slice", FIX)
            b.select(np.arange(sizes[1]), where, f"{where} + first slice: keep the mean half "
                     f"(columns 0..{sizes[1] - 1} of {b.width})")
            i += 1
        else:
            raise ImportRefused(file, where, f"type {_qualname(m)} is not supported here", FIX)
        i += 1
    return b.finish(_label("", module)), dtype


def _alpha(file, name, m, where):
    if name in ("ELU", "CELU"):
        return float(m.alpha)
    if name == "LeakyReLU":
        return float(m.negative_slope)
    if name == "Softplus" and (float(m.beta) != 1.0 or float(m.threshold) != 20.0):
        raise ImportRefused(file, where, f"Softplus(beta={m.beta}, threshold={m.threshold}): the kernel's softplus "
                            "is log(1 + exp(x)) (beta=1, the default threshold 20)", "use nn.Softplus()")
    return 0.0


def _normalizer(file, b, m, where, torch):
    names = {n for n, _ in m.named_buffers(recurse=False)}
    if not {"_mean", "_std"} <= names or not hasattr(m, "eps"):
        raise ImportRefused(file, where, f"an EmpiricalNormalization without the _mean / _std buffers and eps "
                            f"(it has {sorted(names)})", "export with rsl_rl's EmpiricalNormalization")
    with torch.no_grad():
        d = m._std + m.eps                      # exactly the divisor forward() uses, in the buffers' dtype
    b.sub_mean(_np(m._mean), where)
    b.div_scale(_np(d), where)
    b.norm_ops[-2:] = [f"{where}: (x - _mean) / (_std + eps), eps {float(m.eps):g}"]


def source(path):
    ver = _archive_version(path)
    return {"file": os.path.basename(path), "sha256": sha256_files([path]), "format": "torchscript",
            "producer": f"TorchScript archive v{ver}" if ver else "TorchScript archive", "metadata_props": {}}
