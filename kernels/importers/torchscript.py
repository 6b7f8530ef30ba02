"""TorchScript policies (legged_gym ``policy_1.pt``, IsaacLab / rsl-rl-lib ``policy.pt``) -> :class:`Folded`.

The archive is opened with ``torch.jit.load`` (never ``torch.load``: a pickled checkpoint is refused,
not unpickled). The scripted module is walked through its ``forward`` graphs: a container's forward
must be a straight chain of submodule calls (``nn.Sequential``, rsl_rl's ``MLP``, IsaacLab's
``_TorchPolicyExporter`` = ``actor(normalizer(x))``, rsl-rl-lib 5's ``_TorchMLPModel`` =
``deterministic_output(mlp(obs_normalizer(x)))``), and each leaf must be one of:

* ``Linear`` -> a dense layer (W stored [out, in], transposed to [in, out]);
* ``ELU(alpha)``, ``ReLU``, ``SELU``, ``LeakyReLU(negative_slope)``, ``CELU(alpha)``, ``Tanh``,
  ``Sigmoid``, ``Softplus`` (beta=1, threshold=20 only), ``SiLU``, ``Identity``;
* any other module (rsl_rl's ``EmpiricalNormalization`` included; no class name is trusted): its forward
  read node by node, sub / add / div / mul by constants -> mean, scale, bias; clamp* on the observation ->
  norm_clip, on the action -> the head's clip; anything else refused naming the operator;
* ``Unflatten(-1, (2, A))`` followed by rsl-rl-lib's ``_FirstSliceDeterministicOutput`` -> the mean half.

Recurrent policies are recognised in the exporters' form: a top-level module with one ``nn.LSTM`` / ``nn.GRU``
child (num_layers 1, unidirectional, no proj_size) and ``hidden_state`` [+ ``cell_state``] buffers of shape
(1, 1, H), whose forward is exactly ``[normalizer chain ->] rnn(x.unsqueeze(0), (hidden_state, cell_state))
-> hidden_state[:] = h; cell_state[:] = c -> chain(out.squeeze(0))``: legged_gym's ``PolicyExporterLSTM``
(``memory`` + ``actor``; Unitree's ``motion.pt``), IsaacLab's ``_TorchPolicyExporter`` (``normalizer`` + ``rnn`` +
``actor``), rsl-rl-lib 5's ``_TorchLSTMModel`` / ``_TorchGRUModel`` (``obs_normalizer`` + ``rnn`` + ``mlp`` +
``deterministic_output``). The module keeps its state in the buffers; the kernel keeps its own (the proof
zeroes the buffers at every sequence start). Anything else recurrent (an LSTM without state buffers, which
runs every call from a zero state; LSTMCell / GRUCell / RNN; a second recurrent layer) is refused.
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
    """'torch.nn:<Name>' for a torch.nn leaf, 'first_slice' for rsl-rl-lib's mean extractor, else 'module'
    (whose forward graph is read)."""
    q = _qualname(m)
    if q.startswith("__torch__.torch.nn.modules.") and m.original_name in LEAVES:
        return "torch.nn:" + m.original_name
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


RNN_BUFFERS = {"lstm": ("hidden_state", "cell_state"), "gru": ("hidden_state",)}
FIX_RNN = ("export as the rsl_rl / IsaacLab / legged_gym exporters do: one nn.LSTM / nn.GRU (num_layers=1) with "
           "hidden_state [, cell_state] buffers of shape (1, 1, H), forward rnn(x.unsqueeze(0), state), "
           "state[:] = new state, actor(out.squeeze(0))")


def _recurrent_parts(file, module):
    """None for a feed-forward module; else (path, rnn module, kind) after checking the exporter form's shape."""
    recs = [(path, m) for path, m in module.named_modules() if path and m.original_name in RECURRENT]
    bufs = {n: b for n, b in module.named_buffers(recurse=False)}
    state_bufs = [n for n in ("hidden_state", "cell_state") if n in bufs]
    if not recs:
        for path, m in module.named_modules():
            own = [n for n, _ in m.named_buffers(recurse=False)]
            if {"hidden_state", "cell_state"} & set(own):
                raise ImportRefused(file, _label(path, m), f"has recurrent state buffers {own} but no nn.LSTM / nn.GRU: "
                                    "recurrent policies are recognised with an LSTM or GRU layer only", FIX_RNN)
        return None
    if len(recs) > 1:
        raise ImportRefused(file, ", ".join(_label(p, m) for p, m in recs), f"{len(recs)} recurrent layers: the kernel "
                            "runs one (num_layers=1)", "export a policy with one LSTM / GRU layer")
    path, m = recs[0]
    if m.original_name not in ("LSTM", "GRU"):
        raise ImportRefused(file, _label(path, m), f"{m.original_name} is not supported (recurrent policies: one "
                            "nn.LSTM or nn.GRU layer)", "train with rnn_type='lstm' or 'gru'")
    kind = m.original_name.lower()
    if "." in path:
        raise ImportRefused(file, _label(path, m), "a recurrent layer inside a submodule: recognised only as a direct "
                            "child of the exported module (its rnn / memory)", FIX_RNN)
    for attr, ok, what in (("num_layers", lambda v: int(v) == 1, "the kernel runs one layer (rnn_num_layers=1)"),
                           ("bidirectional", lambda v: not v, "the kernel runs one forward direction"),
                           ("proj_size", lambda v: int(v) == 0, "LSTM projections are not supported")):
        v = getattr(m, attr, 0 if attr == "proj_size" else None)
        if v is None or not ok(v):
            raise ImportRefused(file, _label(path, m), f"attribute {attr}={v}: {what}", FIX_RNN)
    want = RNN_BUFFERS[kind]
    H = int(m.hidden_size)
    if tuple(state_bufs) != want:
        raise ImportRefused(file, _label(path, m), f"the module keeps state buffers {state_bufs}; "
                            f"{'an LSTM' if kind == 'lstm' else 'a GRU'} needs {list(want)}: recurrent policies are recognised in the exporters' form only (an "
                            "LSTM / GRU called without them runs every call from a zero state)", FIX_RNN)
    for n in want:
        if tuple(bufs[n].shape) != (1, 1, H):
            raise ImportRefused(file, f"buffer '{n}'", f"has shape {list(bufs[n].shape)}, expected [1, 1, {H}] "
                                "(num_layers 1, batch 1, H)", FIX_RNN)
    return path, m, kind


def _const_of(value):
    node = value.node()
    if node.kind() != "prim::Constant":
        return "?"
    return value.toIValue()


def _walk_recurrent(file, top, rnn_path, rnn, kind):
    """The exporter form's forward (see the module doc), walked node by node; returns the chain of steps with
    ("rnn", path, module) where the recurrent layer sits. Refuses any other node or data flow, naming it."""
    graph = top.graph
    args = list(graph.inputs())
    where = _label("", top)
    if len(args) != 2:
        raise ImportRefused(file, where, f"forward takes {len(args) - 1} arguments; the importer maps a policy of one "
                            "observation tensor", FIX_RNN)
    mods = {args[0].unique(): (top, "")}
    val = {}                   # value -> what it is: "buf:<name>", "slice:<name>", "state", "rnn_out", "new_state",
    cur = args[1].unique()     # "new:<name>", "seq" (x.unsqueeze(0)), "yseq" (the rnn's output sequence)
    want_bufs = RNN_BUFFERS[kind]
    written, steps, called = {}, [], False

    def bad(node, problem):
        raise ImportRefused(file, where, f"its forward runs {node.kind()} ({problem}); only the exporters' recurrent "
                            "form maps", FIX_RNN)
    for node in graph.nodes():
        k = node.kind()
        ins, outs = list(node.inputs()), list(node.outputs())
        u = [i.unique() for i in ins]
        if k == "prim::Constant":
            continue
        if k == "prim::GetAttr" and u[0] in mods:
            parent, ppath = mods[u[0]]
            name = node.s("name")
            child = getattr(parent, name)
            if hasattr(child, "_c"):
                mods[outs[0].unique()] = (child, f"{ppath}.{name}" if ppath else name)
            elif parent is top and name in want_bufs:
                val[outs[0].unique()] = f"buf:{name}"
            else:
                bad(node, f"reads the attribute '{name}', not a submodule or a state buffer")
            continue
        if k == "aten::unsqueeze" and u[0] == cur and _const_of(ins[1]) == 0 and not called:
            val[outs[0].unique()] = "seq"
            cur = None
            continue
        if k == "prim::TupleConstruct" and kind == "lstm" and [val.get(x) for x in u] == ["buf:hidden_state",
                                                                                           "buf:cell_state"]:
            val[outs[0].unique()] = "state"
            continue
        if k == "prim::CallMethod" and u[0] in mods:
            child, cpath = mods[u[0]]
            if child is rnn:
                state = "state" if kind == "lstm" else "buf:hidden_state"
                if called or len(u) != 3 or val.get(u[1]) != "seq" or val.get(u[2]) != state:
                    bad(node, f"calls '{rnn_path}' other than once as {rnn_path}(x.unsqueeze(0), "
                        f"{'(hidden_state, cell_state)' if kind == 'lstm' else 'hidden_state'})")
                called = True
                steps.append(("rnn", rnn_path, rnn))
                val[outs[0].unique()] = "rnn_out"
                continue
            if node.s("name") == "forward" and len(u) == 2 and u[1] == cur and cur is not None:
                _walk(file, child, cpath, steps)
                cur = outs[0].unique()
                continue
            bad(node, f"a call of '{cpath}' that is not a step of the chain")
        if k == "prim::TupleUnpack":
            src = val.get(u[0])
            if src == "rnn_out" and len(outs) == 2:
                val[outs[0].unique()] = "yseq"
                val[outs[1].unique()] = "new_state" if kind == "lstm" else "new:hidden_state"
                continue
            if src == "new_state" and len(outs) == 2:
                val[outs[0].unique()] = "new:hidden_state"
                val[outs[1].unique()] = "new:cell_state"
                continue
            bad(node, "unpacks something other than the recurrent layer's output")
        if k == "aten::slice" and str(val.get(u[0], "")).startswith("buf:"):
            if [_const_of(i) for i in ins[1:]] != [0, None, None, 1]:
                bad(node, "a slice of a state buffer other than [:]")
            val[outs[0].unique()] = "slice:" + val[u[0]][4:]
            continue
        if k == "aten::copy_" and str(val.get(u[0], "")).startswith("slice:"):
            name = val[u[0]][6:]
            if val.get(u[1]) != f"new:{name}":
                bad(node, f"writes into {name} something other than the recurrent layer's new {name}")
            written[name] = written.get(name, 0) + 1
            continue
        if k == "aten::squeeze" and val.get(u[0]) == "yseq" and len(ins) == 2 and _const_of(ins[1]) == 0:
            cur = outs[0].unique()
            continue
        bad(node, "not part of normalizer -> rnn(x.unsqueeze(0), state) -> state[:] = new state -> "
                  "actor(out.squeeze(0))")
    outs = list(graph.outputs())
    if not called:
        raise ImportRefused(file, where, f"its forward never calls '{rnn_path}'", FIX_RNN)
    for name in want_bufs:
        if written.get(name) != 1:
            raise ImportRefused(file, f"buffer '{name}'", f"is written {written.get(name, 0)} times by forward, "
                                "expected once (state[:] = the new state): the state would not be carried", FIX_RNN)
    if len(outs) != 1 or cur is None or outs[0].unique() != cur:
        raise ImportRefused(file, where, "its forward does not return the result of its chain (e.g. it returns the "
                            "state too)", FIX_RNN)
    return steps


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
    consts = {}                 # value -> its constant (a float attribute, a buffer, arithmetic on them)
    cur = args[1].unique()
    for node in graph.nodes():
        k = node.kind()
        ins = list(node.inputs())
        u = [i.unique() for i in ins]
        if k == "prim::Constant":
            consts[node.output().unique()] = node.output().toIValue()
            continue
        if k == "prim::GetAttr" and u[0] in modules:
            parent, ppath = modules[u[0]]
            name = node.s("name")
            child = getattr(parent, name)
            if hasattr(child, "_c"):
                modules[node.output().unique()] = (child, f"{ppath}.{name}" if ppath else name)
            else:
                consts[node.output().unique()] = child          # a buffer or a float attribute: a constant
            continue
        if k == "prim::CallMethod" and node.s("name") == "forward":
            if u[0] not in modules or len(ins) != 2 or u[1] != cur:
                raise ImportRefused(file, _label(path, m), "its forward does not call its submodules as one chain "
                                    "x -> f(x) -> g(f(x))", FIX)
            child, cpath = modules[u[0]]
            _walk(file, child, cpath, steps)
            cur = node.output().unique()
            continue
        if cur not in u and all(x in consts for x in u) and k in CONST_ARITH:
            consts[node.output().unique()] = CONST_ARITH[k](*[consts[x] for x in u])
            continue
        where = f"node {k} in {_label(path, m)}"
        if cur in u and k in ELEMENTWISE:
            rest = [x for x in u if x != cur]
            if u[0] != cur or len(u) != ELEMENTWISE[k] or not all(x in consts for x in rest):
                raise ImportRefused(file, where, f"{k} on the policy's value other than {k}(value, constants)", FIX)
            steps.append(("op:" + k.split("::")[1], path, (where, [consts[x] for x in rest])))
            cur = node.output().unique()
            continue
        on = "on the policy's value" if cur in u else "on constants the importer does not evaluate"
        raise ImportRefused(file, where, f"{k} {on} is not supported (type {_qualname(m)}); only chains of "
                            "supported modules and Linear / activation / (x - mean) / std / clamp map", FIX)
    outs = list(graph.outputs())
    if len(outs) != 1 or outs[0].unique() != cur:
        raise ImportRefused(file, _label(path, m), "its forward does not return the result of its chain of "
                            "submodules (e.g. it returns a tuple)", FIX)


def _arith(op):
    def f(a, b, alpha=1):
        return op(a, b * alpha if alpha != 1 else b)
    return f


CONST_ARITH = {"aten::add": _arith(lambda a, b: a + b), "aten::sub": _arith(lambda a, b: a - b),
               "aten::mul": lambda a, b: a * b, "aten::div": lambda a, b: a / b, "aten::neg": lambda a: -a}
# ops on the policy's value (the observation, then each layer's output) with constant operands, and their arity
ELEMENTWISE = {"aten::sub": 3, "aten::add": 3, "aten::div": 2, "aten::mul": 2, "aten::clamp": 3, "aten::clamp_min": 2,
               "aten::clamp_max": 2}


def _np(t):
    return t.detach().cpu().double().numpy()


def fold(file, module):
    """The recognised policy as :class:`Folded`, plus the compute dtype of its weights."""
    torch = _torch(file)
    rec = _recurrent_parts(file, module)
    steps = []
    if rec is None:
        _walk(file, module, "", steps)
    else:
        steps = _walk_recurrent(file, module, *rec)
    linears = [s for s in steps if s[0] == "torch.nn:Linear"]
    if not linears:
        raise ImportRefused(file, _label("", module), "no Linear layer was found on the way to the action", FIX)
    first = rec[1] if rec else linears[0][2]
    weight = first.weight_ih_l0 if rec else first.weight
    n_features = int(weight.shape[1])
    dtype = {torch.float32: "float32", torch.float64: "float64"}.get(weight.dtype)
    if dtype is None:
        raise ImportRefused(file, _label(rec[0] if rec else linears[0][1], first), f"weights are {weight.dtype}",
                            "export the policy in float32 (module.float())")
    b = Builder(file, n_features)
    i = 0
    while i < len(steps):
        kind, path, m = steps[i]
        where = m[0] if kind.startswith("op:") else _label(path, m)
        name = kind.split(":", 1)[-1]
        if kind.startswith("op:"):
            _elementwise(file, b, name, *m, torch)
        elif kind == "rnn":
            _rnn(b, m, path, where)
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
    folded = b.finish(_label("", module))
    if rec:
        folded.state = {"buffers": {"h": "hidden_state", **({"c": "cell_state"} if rec[2] == "lstm" else {})},
                        "shape": [1, 1, int(rec[1].hidden_size)]}
        bufs = dict(module.named_buffers(recurse=False))
        nonzero = [n for n in folded.state["buffers"].values() if bool((bufs[n] != 0).any())]
        if nonzero:
            folded.warnings.append(f"the archive was saved with non-zero state buffers {', '.join(nonzero)}; the node "
                                   "does not use them: it resets the state to zero at start and on every activation "
                                   "(the proof zeroes them at each sequence start too)")
    return folded, dtype


def _rnn(b, m, path, where):
    """nn.LSTM / nn.GRU -> the recurrent layer (torch's layout and gate order are the model file's)."""
    kind = m.original_name.lower()
    params = dict(m.named_parameters())
    for n in ("weight_ih_l0", "weight_hh_l0"):
        if n not in params:
            raise ImportRefused(b.file, where, f"has no parameter {n} (it has {sorted(params)})", FIX_RNN)
    bias = [_np(params[n]) if n in params else None for n in ("bias_ih_l0", "bias_hh_l0")]
    W_ih, W_hh = _np(params["weight_ih_l0"]), _np(params["weight_hh_l0"])
    b.recurrent_layer(kind, W_ih, W_hh, bias[0], bias[1], where,
                      f"{m.original_name} '{path}' {W_ih.shape[1]} -> H={W_hh.shape[1]} (torch gate order)")


def _alpha(file, name, m, where):
    if name in ("ELU", "CELU"):
        return float(m.alpha)
    if name == "LeakyReLU":
        return float(m.negative_slope)
    if name == "Softplus" and (float(m.beta) != 1.0 or float(m.threshold) != 20.0):
        raise ImportRefused(file, where, f"Softplus(beta={m.beta}, threshold={m.threshold}): the kernel's softplus "
                            "is log(1 + exp(x)) (beta=1, the default threshold 20)", "use nn.Softplus()")
    return 0.0


def _const_np(c, torch):
    if c is None:
        return None
    if isinstance(c, torch.Tensor):
        return _np(c)
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return np.float64(c)
    raise TypeError(type(c).__name__)


def _elementwise(file, b, op, where, cs, torch):
    """sub / add / div / mul / clamp* of the policy's value by constants -> the builder's normaliser, bias, clip."""
    try:
        cs = [_const_np(c, torch) for c in cs]
    except TypeError as e:
        raise ImportRefused(file, where, f"aten::{op} with a {e} operand", FIX) from None
    if op in ("sub", "add"):
        if cs[1] is None or cs[1] != 1:
            raise ImportRefused(file, where, f"aten::{op} with alpha {cs[1]}", FIX)
        b.bias(-cs[0] if op == "sub" else cs[0], where)
    elif op == "div":
        b.div_scale(cs[0], where)
    elif op == "mul":
        b.mul_scale(cs[0], where) if b.stage == "input" else b.refuse(
            where, "aten::mul of a layer's output is not supported", FIX)
    else:
        lo, hi = {"clamp": (cs + [None])[:2], "clamp_min": [cs[0], None], "clamp_max": [None, cs[0]]}[op]
        b.clip(lo, hi, where)


def source(path):
    ver = _archive_version(path)
    return {"file": os.path.basename(path), "sha256": sha256_files([path]), "format": "torchscript",
            "producer": f"TorchScript archive v{ver}" if ver else "TorchScript archive", "metadata_props": {}}
