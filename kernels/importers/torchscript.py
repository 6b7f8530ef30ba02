"""TorchScript policies (legged_gym ``policy_1.pt``, IsaacLab / rsl-rl-lib ``policy.pt``) -> :class:`Folded`.

The archive is opened with ``torch.jit.load`` (never ``torch.load``: a pickled checkpoint is refused,
not unpickled). Exports of ``torch.jit.script`` and of ``torch.jit.trace`` are read the same way: the module's
forward graph is copied and inlined (``torch._C._jit_pass_inline``: every submodule call and every scripted
function call, e.g. ``F.elu`` / ``F.dropout``, becomes its aten ops; each node keeps its module hierarchy, which
names it in refusals), then read node by node. No class name is trusted, torch.nn's included: a module is what
its graph computes. The graph must be one chain of operations on the observation, each with constant operands
(parameters, buffers, attributes, constants, and pure aten ops on them, evaluated with torch; a ``prim::If`` on a
constant such as ``self.training`` takes its branch):

* ``aten::linear(x, W, b)`` (or ``x @ W``) -> a dense layer (W stored [out, in], transposed to [in, out]);
* ``aten::elu`` (alpha; scale and input_scale 1), ``relu``, ``selu``, ``leaky_relu`` (negative_slope), ``celu``
  (alpha), ``tanh``, ``sigmoid``, ``softplus`` (beta 1, threshold 20 only), ``silu`` (and their in-place forms),
  with the constants read from the graph, never from the module's attributes;
* sub / add / div / mul by constants -> the normaliser's mean and scale, or a bias after a dense layer;
  clamp / clamp_min / clamp_max / hardtanh on the (normalised) observation -> norm_clip, on the action -> the
  head's clip (a clamp on a hidden layer is refused);
* ``aten::unflatten(x, -1, (k, A))`` then ``x[..., i, :]`` (rsl-rl-lib's ``Unflatten`` +
  ``_FirstSliceDeterministicOutput``) -> columns i*A .. (i+1)*A - 1; ``x[..., a:b]`` -> those columns;
* anything else (``aten::dropout`` included, which the importer does not drop) is refused naming the aten op
  and the submodule it came from.

Recurrent policies are recognised in the exporters' form: a top-level module with one ``nn.LSTM`` / ``nn.GRU``
child (num_layers 1, unidirectional, no proj_size) and ``hidden_state`` [+ ``cell_state``] buffers of shape
(1, 1, H), whose forward is exactly ``[normalizer chain ->] rnn(x.unsqueeze(0), (hidden_state, cell_state))
-> hidden_state[:] = h; cell_state[:] = c -> chain(out.squeeze(0))``: legged_gym's ``PolicyExporterLSTM``
(``memory`` + ``actor``; Unitree's ``motion.pt``), IsaacLab's ``_TorchPolicyExporter`` (``normalizer`` + ``rnn`` +
``actor``), rsl-rl-lib 5's ``_TorchLSTMModel`` / ``_TorchGRUModel`` (``obs_normalizer`` + ``rnn`` + ``mlp`` +
``deterministic_output``). The module keeps its state in the buffers; the kernel keeps its own (the proof
zeroes the buffers at every sequence start). Anything else recurrent (an LSTM without state buffers, which
runs every call from a zero state; LSTMCell / GRUCell / RNN; a second recurrent layer) is refused. The LSTM /
GRU layer is the one module recognised as torch.nn's (its parameters and attributes are read, not its graph); the
chains before and after it are read as above. Recurrent exports of ``torch.jit.trace`` are refused (script only).
"""
from __future__ import annotations

import os
import re
import warnings
import zipfile

import numpy as np

from control_node.kernels.importers.common import Builder, ImportRefused, sha256_files

RECURRENT = ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell")
FIX = ("export the actor as torch.jit.script (or torch.jit.trace) of nn.Sequential(Linear, activation, ...) with "
       "supported activations (ELU, ReLU, SELU, LeakyReLU, CELU, Tanh, Sigmoid, Softplus, SiLU, Identity)")


def _torch(file):
    try:
        import torch
    except ImportError:
        raise ImportRefused(file, "package torch", "is not installed (needed to read TorchScript)",
                            "pip install 'control-node[torch]'") from None
    return torch


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
    if getattr(m, "hidden_size", None) is None or getattr(m, "num_layers", None) is None:
        raise ImportRefused(file, _label(path, m), f"a traced nn.{m.original_name} (torch.jit.trace keeps none of its "
                            "hidden_size / num_layers attributes, and records the state copies as traced at export): "
                            "recurrent policies are read from torch.jit.script exports only",
                            "export with torch.jit.script(exporter) (the rsl_rl / IsaacLab / legged_gym exporters do)")
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


# ---- the forward graph, inlined, read node by node -----------------------------------------------------------
_HIER = re.compile(r"([^.()]+)\(([^()]*)\)")
INT_MAX = 2 ** 63 - 1
# activations on the policy's value: aten op -> (kernel name, names of its constant operands)
ACT_OPS = {"aten::relu": ("relu", ()), "aten::tanh": ("tanh", ()), "aten::sigmoid": ("sigmoid", ()),
           "aten::silu": ("silu", ()), "aten::selu": ("selu", ()), "aten::elu": ("elu", ("alpha", "scale", "input_scale")),
           "aten::celu": ("celu", ("alpha",)), "aten::leaky_relu": ("leaky_relu", ("negative_slope",)),
           "aten::softplus": ("softplus", ("beta", "threshold"))}
# ops on the policy's value with constant operands (the policy's value first), and their arity
ELEMENTWISE = {"aten::sub": 3, "aten::add": 3, "aten::div": 2, "aten::mul": 2, "aten::clamp": 3, "aten::clamp_min": 2,
               "aten::clamp_max": 2, "aten::hardtanh": 3}
COMMUTATIVE = ("aten::add", "aten::mul")        # c + x, c * x (add with alpha 1 only)
DROPOUT = ("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout")
NO_OPS = ("aten::contiguous", "aten::detach", "aten::clone")
# in-place twins that are the same operation on the policy's value (the value is not read again: a chain)
INPLACE = {k + "_": k for k in tuple(ACT_OPS) + tuple(ELEMENTWISE)}


def _arith(op):
    def f(a, b, alpha=1):
        return op(a, b * alpha if alpha != 1 else b)
    return f


CONST_ARITH = {"aten::add": _arith(lambda a, b: a + b), "aten::sub": _arith(lambda a, b: a - b),
               "aten::mul": lambda a, b: a * b, "aten::div": lambda a, b: a / b, "aten::neg": lambda a: -a}
# ops evaluated on constants (a normaliser's std from its variance, a scaled weight, a transposed matrix)
CONST_OPS = frozenset("aten::" + k for k in (
    "add", "sub", "mul", "div", "neg", "sqrt", "rsqrt", "reciprocal", "pow", "abs", "exp", "log", "square",
    "clamp", "clamp_min", "clamp_max", "t", "transpose", "unsqueeze", "squeeze", "reshape", "view", "to", "float",
    "double", "contiguous", "clone", "detach", "type_as", "Float", "Int", "ScalarImplicit"))


def _inlined(module):
    """A copy of ``module``'s forward graph with every submodule call and scripted function call inlined (the
    nodes keep their module hierarchy, which names them in refusals)."""
    import torch
    g = module.graph.copy()
    torch._C._jit_pass_inline(g)
    return g


class _Walk:
    """Reads one module's inlined forward graph as a chain x -> f(x) -> g(f(x)) of recognised steps.

    Values are tracked as: the policy's value (the observation, then each step's result; exactly one at a time),
    earlier policy values (never read again in a chain), submodules (GetAttr chains from self), and constants
    (parameters, buffers, attributes, prim::Constant, and any pure aten op on constants, evaluated by torch).
    ``steps`` gets ("dense", where, W [in, out] tensor, bias tensor | None, path), ("act", where, name, alpha),
    ("op", where, aten op, [constants]), ("unflatten", where, dim, sizes), ("pick", where, dim, index),
    ("slice", where, dim, start, end, step), all dims negative (from the last), the observation taken as
    (batch, features)."""

    def __init__(self, file, module, prefix, steps):
        self.file, self.module, self.prefix, self.steps = file, module, prefix, steps
        self.top_type = module.original_name
        self.mods, self.consts, self.stale = {}, {}, set()
        self.rank = 2
        self.cur = None

    def run(self):
        graph = _inlined(self.module)
        args = list(graph.inputs())
        if len(args) != 2:
            raise ImportRefused(self.file, _label(self.prefix, self.module), f"forward takes {len(args) - 1} "
                                "arguments; the importer maps a policy of one observation tensor", FIX)
        self.mods[args[0].unique()] = (self.module, self.prefix)
        self.cur = args[1].unique()
        self.block(graph.nodes())
        outs = list(graph.outputs())
        if len(outs) != 1 or outs[0].unique() != self.cur:
            raise ImportRefused(self.file, _label(self.prefix, self.module), "its forward does not return the result "
                                "of its chain of operations on the observation (e.g. it returns a tuple, or a "
                                "constant)", FIX)

    # -- naming ----------------------------------------------------------------------------------------------
    def where(self, node):
        parts = [(n, t) for n, t in _HIER.findall(node.getModuleHierarchy()) if n != "UNKNOWN_INSTANCE"]
        path = ".".join([p for p in [self.prefix] + [n for n, _ in parts] if p])
        typ = parts[-1][1] if parts else self.top_type
        return f"node {node.kind()} in submodule '{path or '(top)'}' ({typ})", path

    def refuse(self, node, problem, fix=FIX):
        raise ImportRefused(self.file, self.where(node)[0], problem, fix)

    # -- the walk --------------------------------------------------------------------------------------------
    def block(self, nodes):
        for node in nodes:
            self.node(node)

    def node(self, node):
        k = node.kind()
        ins = list(node.inputs())
        u = [i.unique() for i in ins]
        if k == "prim::Constant":
            try:
                self.consts[node.output().unique()] = node.output().toIValue()
            except Exception:               # a function or type constant: never a value of the policy
                pass
            return
        if k == "prim::GetAttr" and u[0] in self.mods:
            parent, ppath = self.mods[u[0]]
            name = node.s("name")
            child = getattr(parent, name)
            if hasattr(child, "_c"):
                self.mods[node.output().unique()] = (child, f"{ppath}.{name}" if ppath else name)
            else:
                self.consts[node.output().unique()] = child      # a parameter, buffer or attribute: a constant
            return
        if k == "prim::If":
            return self.branch(node, u)
        if self.cur in u:
            return self.policy_op(node, k, ins, u)
        if any(x in self.stale for x in u):
            self.refuse(node, f"{k} reads an earlier value of the policy (a skip connection or a second branch): "
                        "only a chain of operations on one value maps")
        if all(x in self.consts for x in u) and k not in ("prim::RaiseException", "prim::CallMethod",
                                                          "prim::CallFunction"):
            return self.evaluate(node, k, u)
        if k in ("prim::CallMethod", "prim::CallFunction"):
            self.refuse(node, f"{k} could not be inlined (a call the importer cannot read)")
        self.refuse(node, f"{k} on values the importer does not evaluate is not supported")

    def branch(self, node, u):
        cond = self.consts.get(u[0], "?") if u else "?"
        if not isinstance(cond, bool):
            self.refuse(node, "prim::If on a value computed from the observation (control flow on the policy's "
                        "input) is not supported")
        blk = list(node.blocks())[0 if cond else 1]
        self.block(blk.nodes())
        for out, val in zip(node.outputs(), blk.outputs()):
            v = val.unique()
            if v == self.cur:
                self.cur = out.unique()
            elif v in self.consts:
                self.consts[out.unique()] = self.consts[v]
            elif v in self.mods:
                self.mods[out.unique()] = self.mods[v]

    def evaluate(self, node, k, u):
        """A node on constants only, evaluated: arithmetic, elementwise math and reshapes (CONST_OPS), never
        a result larger than its largest operand (a file cannot make the importer allocate more than it holds)."""
        import torch
        vals = [self.consts[x] for x in u]
        outs = list(node.outputs())
        if k in ("prim::ListConstruct", "prim::TupleConstruct"):
            res = [list(vals) if k == "prim::ListConstruct" else tuple(vals)]
        elif k in ("prim::ListUnpack", "prim::TupleUnpack") and isinstance(vals[0], (list, tuple)) and \
                len(vals[0]) == len(outs):
            res = list(vals[0])
        elif k in CONST_OPS and len(outs) == 1:
            tensors = [v for v in vals if isinstance(v, torch.Tensor)]
            try:
                shape = torch.broadcast_shapes(*[t.shape for t in tensors]) if tensors else ()
            except RuntimeError:
                shape = ()                  # not a broadcast (t, reshape, ...): torch checks the numel itself
            biggest = max([t.numel() for t in tensors] + [1])
            if int(np.prod(shape, dtype=np.float64)) > biggest:
                self.refuse(node, f"{k} on constants would make a tensor of shape {list(shape)}, larger than its "
                            "operands")
            try:
                r = CONST_ARITH[k](*vals) if k in CONST_ARITH else getattr(torch.ops.aten, k[6:])(*vals)
            except Exception as e:
                self.refuse(node, f"{k} on constants could not be evaluated ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else ''})")
            if isinstance(r, torch.Tensor) and r.numel() > biggest:
                self.refuse(node, f"{k} on constants made a tensor of {r.numel()} values, more than its operands")
            res = [r]
        else:
            self.refuse(node, f"{k} on constants is not evaluated by the importer (it evaluates "
                        f"{', '.join(sorted(CONST_OPS))} on constants)")
        for o, r in zip(outs, res):
            self.consts[o.unique()] = r

    def advance(self, node):
        self.stale.add(self.cur)
        self.cur = node.output().unique()

    def dim(self, d, node):
        """``d`` counted from the last axis (the value's rank from its traced type, else as walked from a
        (batch, features) observation)."""
        if not isinstance(d, int) or isinstance(d, bool):
            self.refuse(node, f"{node.kind()} with a dimension that is not a constant int")
        try:
            rank = node.inputsAt(0).type().dim()
        except Exception:           # not a tensor type
            rank = None
        return d if d < 0 else d - (rank if rank is not None else self.rank)

    def policy_op(self, node, k, ins, u):
        where, path = self.where(node)
        cur = self.cur
        consts = self.consts
        if len(list(node.outputs())) != 1:
            self.refuse(node, f"{k} on the policy's value gives {len(list(node.outputs()))} results; only a chain "
                        "of single results maps")
        base = INPLACE.get(k, k)
        others = [x for x in u if x != cur]
        if u.count(cur) != 1 or not all(x in consts for x in others):
            self.refuse(node, f"{k} of the policy's value with itself or with values computed from it (e.g. "
                        "x * sigmoid(x)) is not supported; only operations of the value with constants map")
        c = [consts[x] for x in others]
        if base in ("aten::linear", "aten::matmul", "aten::mm"):
            if u[0] != cur:
                self.refuse(node, f"{k} with the policy's value as the weight is not supported")
            W = c[0]
            if base == "aten::linear":
                W = W.t() if hasattr(W, "t") and getattr(W, "ndim", 0) == 2 else W
            bias = c[1] if len(c) > 1 else None
            if not hasattr(W, "ndim") or W.ndim != 2 or (bias is not None and not hasattr(bias, "ndim")):
                self.refuse(node, f"{k} with a weight that is not a 2-D tensor (dense layers: aten::linear(x, "
                            "weight [out, in], bias) or x @ W [in, out])")
            self.steps.append(("dense", where, W, bias, path))
        elif base in ACT_OPS:
            self.steps.append(("act", where, base, dict(zip(ACT_OPS[base][1], c))))
        elif base in DROPOUT:
            p = c[0] if c else "?"
            train = c[1] if len(c) > 1 else "?"
            self.refuse(node, f"{k} (p={p}, training={train}) is not supported: the importer maps no dropout (in "
                        "eval mode it is the identity)", "export the actor without its Dropout modules, e.g. "
                        "torch.jit.script(nn.Sequential(*[m for m in actor if not isinstance(m, nn.Dropout)]))")
        elif base in ELEMENTWISE:
            swapped_ok = base in COMMUTATIVE and (base == "aten::mul" or c[-1] == 1)     # c * x, c + x
            if len(u) != ELEMENTWISE[base] or (u[0] != cur and not swapped_ok):
                self.refuse(node, f"{k} on the policy's value other than {k}(value, constants)")
            self.steps.append(("op", where, "clamp" if base == "aten::hardtanh" else base[6:], c))
        elif base == "aten::unflatten":
            if len(c) != 2:
                self.refuse(node, "aten::unflatten other than unflatten(value, dim, sizes)")
            self.steps.append(("unflatten", where, self.dim(c[0], node), tuple(int(s) for s in c[1])))
            self.rank += 1
        elif base == "aten::select":
            if u[0] != cur or len(c) != 2 or not isinstance(c[1], int):
                self.refuse(node, "aten::select other than select(value, dim, constant index)")
            self.steps.append(("pick", where, self.dim(c[0], node), int(c[1])))
            self.rank -= 1
        elif base == "aten::slice":
            if u[0] != cur or len(c) != 4:
                self.refuse(node, "aten::slice other than slice(value, dim, start, end, step)")
            self.steps.append(("slice", where, self.dim(c[0], node), c[1], c[2], c[3]))
        elif base in NO_OPS and u[0] == cur and all(x is None for x in c):
            pass
        else:
            self.refuse(node, f"{k} on the policy's value is not supported; only chains of aten::linear, the "
                        "supported activations, (x - mean) / std and clamp map")
        self.advance(node)


def _walk(file, m, path, steps):
    """Append the steps of ``m``'s forward (its graph inlined, read node by node; see :class:`_Walk`)."""
    _Walk(file, m, path, steps).run()


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
    dense = [s for s in steps if s[0] == "dense"]
    if not rec and not dense:
        raise ImportRefused(file, _label("", module), "no dense layer (aten::linear) was found on the way to the "
                            "action", FIX)
    weight = rec[1].weight_ih_l0 if rec else dense[0][2].t()
    n_features = int(weight.shape[1])
    dtype = {torch.float32: "float32", torch.float64: "float64"}.get(weight.dtype)
    if dtype is None:
        raise ImportRefused(file, _label(rec[0], rec[1]) if rec else dense[0][1], f"weights are {weight.dtype}",
                            "export the policy in float32 (module.float())")
    b = Builder(file, n_features)
    split = None                   # (k, A) after unflatten(-1, (k, A)) of the last layer's outputs
    clipped_at = None
    for step in steps:
        kind = step[0]
        if kind == "rnn":
            _rnn(b, step[2], step[1], _label(step[1], step[2]))
            continue
        where = step[1]
        if split is not None and kind != "pick":
            raise ImportRefused(file, where, f"{split[2]} must be followed by selecting one of its {split[0]} "
                                "rows (x[..., i, :]); nothing else on an unflattened value maps", FIX)
        if kind == "dense":
            if clipped_at is not None:
                raise ImportRefused(file, clipped_at, f"{clipped_at.split()[1]} on a hidden layer's output (a dense "
                                    f"layer follows it: {where}) is not supported; only a clamp on the action maps",
                                    FIX)
            _, _, W, bias, path = step
            W = _np(W)
            b.dense(W, None if bias is None else _np(bias), where, f"aten::linear '{path or '(top)'}' "
                    f"{W.shape[0]} -> {W.shape[1]}")
        elif kind == "act":
            _activation(file, b, *step[1:])
        elif kind == "op":
            if step[2] in ("clamp", "clamp_min", "clamp_max") and b.stage in ("pre", "post"):
                clipped_at = where
            _elementwise(file, b, step[2], where, step[3], torch)
        elif kind == "unflatten":
            _, _, dim, sizes = step
            if dim != -1 or len(sizes) != 2 or sizes[0] * sizes[1] != b.width or b.stage in ("input", "rnn"):
                raise ImportRefused(file, where, f"aten::unflatten(dim={dim}, {list(sizes)}) on {b.width} values; the "
                                    "importer maps unflatten(-1, (k, A)) of the last layer's outputs followed by "
                                    "x[..., i, :]", FIX)
            split = (sizes[0], sizes[1], where)
        elif kind == "pick":
            _, _, dim, i = step
            if split is None or dim != -2 or not -split[0] <= i < split[0]:
                raise ImportRefused(file, where, f"aten::select(dim={dim}, index={i}) is not supported here (only "
                                    "x[..., i, :] after unflatten(-1, (k, A)))", FIX)
            k, A = split[:2]
            i %= k
            b.select(np.arange(i * A, (i + 1) * A), where, f"{split[2]} + {where}: keep row {i} of {k} "
                     f"(columns {i * A}..{(i + 1) * A - 1} of {k * A})" + (": the mean half" if k == 2 and i == 0
                                                                             else ""))
            split = None
        elif kind == "slice":
            _slice(file, b, *step[1:])
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


def _slice(file, b, where, dim, start, end, step):
    """x[..., start:end:step]: a column selection on the last axis; a full slice of another axis is a no-op."""
    full = start in (None, 0) and (end is None or end >= INT_MAX) and step in (None, 1)
    if dim != -1:
        if full:
            return
        raise ImportRefused(file, where, f"aten::slice of axis {dim} (not the last): only the batch axis, whole, "
                            "or columns of the last axis map", FIX)
    if full:
        return
    if not all(v is None or isinstance(v, int) for v in (start, end, step)) or (step or 1) <= 0:
        raise ImportRefused(file, where, f"aten::slice({start}, {end}, {step}) with non-constant or negative "
                            "bounds", FIX)
    idx = np.arange(b.width)[slice(start, None if end is None or end >= INT_MAX else end, step)]
    b.select(idx, where, f"{where}: keep columns {start or 0}..{idx[-1] if idx.size else '-'} of {b.width}")


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


def _scalar(file, where, op, name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ImportRefused(file, where, f"{op} with a non-constant or non-scalar {name} ({type(v).__name__})", FIX)
    return float(v)


def _activation(file, b, where, op, consts):
    """An activation read from its aten op and constants (ELU alpha / scale, LeakyReLU slope, Softplus beta)."""
    name = ACT_OPS[op][0]
    c = {n: _scalar(file, where, op, n, v) for n, v in consts.items()}
    alpha = 0.0
    if name == "elu":
        if c["scale"] != 1.0 or c["input_scale"] != 1.0:
            raise ImportRefused(file, where, f"aten::elu with scale={c['scale']:g}, input_scale={c['input_scale']:g}: "
                                "the kernel's elu is alpha * (exp(x) - 1) for x <= 0 (scale and input_scale 1)",
                                "use nn.ELU(alpha)")
        alpha = c["alpha"]
    elif name == "celu":
        alpha = c["alpha"]
        if alpha == 0:
            raise ImportRefused(file, where, "aten::celu with alpha=0", "use nn.CELU(alpha) with alpha != 0")
    elif name == "leaky_relu":
        alpha = c["negative_slope"]
    elif name == "softplus" and (c["beta"] != 1.0 or c["threshold"] != 20.0):
        raise ImportRefused(file, where, f"aten::softplus with beta={c['beta']}, threshold={c['threshold']} "
                            f"(Softplus(beta={c['beta']}, threshold={c['threshold']})): the kernel's softplus is "
                            "log(1 + exp(x)) (beta=1, the default threshold 20)", "use nn.Softplus()")
    b.activation(name, alpha, where)


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
