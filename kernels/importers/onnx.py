"""ONNX policies (rsl_rl / IsaacLab, SB3 ``OnnxableSB3Policy``, tf2onnx / Brax) -> :class:`Folded`.

How a graph is read:

1. Parse with the ``onnx`` package. External data files are loaded only from inside the model's folder
   (a ``location`` that resolves outside it is refused, naming it). Opset 11 or newer.
2. The action output is the output named ``action`` / ``actions``, else the first output. Every node
   that does not feed it (SB3's value and log-prob outputs, ...) is dropped.
3. The remaining graph is run once on a batch-1 observation with the importer's own numpy evaluator
   (``onnx_eval.py``). That gives every tensor's shape and the value of every *constant* sub-graph:
   anything that does not depend on the observation's values (weights behind Identity, shapes computed
   with Shape / ConstantOfShape / Expand, SAC's log-std branch that only feeds a Shape).
4. What depends on the observation's values must be one chain, folded step by step into the model
   file's terms by :class:`common.Builder`: ``Sub`` / ``Div`` / ``Mul`` normaliser, ``Gemm`` (transB 0 or
   1, alpha, beta) or ``MatMul`` + ``Add``, one activation per layer (``Sigmoid(x) * x`` = silu), no-ops
   on a batch-1 vector (Identity, Flatten, Reshape, Squeeze, Unsqueeze, Expand, Cast to the same float
   type), ``Split`` / ``Slice`` / ``Gather`` of output columns (Brax's mean half), ``Tanh`` on the
   output (squash) and ``Clip`` on the output (action_low / action_high).

Anything else is refused whole (:class:`ImportRefused` names the node, the operator and what is
supported). The graph's own dtype (float32 / float64) is the model's default compute dtype.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from control_node.kernels.importers import onnx_eval
from control_node.kernels.importers.common import Builder, ImportRefused
from control_node.kernels.importers.onnx_eval import Node

MIN_OPSET = 11
ACTION_OUTPUT_NAMES = ("action", "actions")
ACTIVATION_OPS = {"Relu": "relu", "Elu": "elu", "Selu": "selu", "LeakyRelu": "leaky_relu", "Celu": "celu",
                  "Tanh": "tanh", "Sigmoid": "sigmoid", "Softplus": "softplus"}
NOOP_OPS = ("Identity", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Expand", "Cast")
SELECT_OPS = ("Split", "Slice", "Gather")
#: operators accepted on the observation's path
DATA_OPS = frozenset(ACTIVATION_OPS) | set(NOOP_OPS) | set(SELECT_OPS) | {
    "Sub", "Div", "Mul", "Add", "Gemm", "MatMul", "Clip"}
#: operators accepted only where they compute constants (shapes, parameter transforms)
CONST_OPS = frozenset({"Constant", "Shape", "ConstantOfShape", "Gather", "Concat", "Exp", "Neg", "Sqrt",
                       "Reciprocal", "Equal", "Where", "Transpose"})
RECURRENT_OPS = ("LSTM", "GRU", "RNN")
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875   # the ONNX defaults (float32)
HINTS = {
    "Erf": " (torch exports GELU as Div, Erf, Add, Mul; the kernel has no GELU)",
    "Conv": " (convolutional policies are not supported: the kernel runs dense layers only)",
    "Softmax": " (a discrete-action head; the importer maps continuous actions)",
    **{op: " (recurrent policies are not supported yet)" for op in RECURRENT_OPS},
}
FIX_OP = "export a plain MLP policy (dense layers with one supported activation each), or retrain with one"


@dataclass
class OnnxGraph:
    """A parsed, pruned and once-evaluated ONNX policy graph (what :func:`fold` works on)."""

    path: str
    file: str                      # basename, for messages
    files: list                    # the model file, then its external data files (hashed in this order)
    opset: int
    producer: str
    metadata: dict
    input_name: str
    dtype: str                     # "float32" / "float64": the input's element type
    n_features: int
    action_output: str
    dropped_outputs: list
    nodes: list                    # onnx_eval.Node, topologically sorted, only those the action needs
    env: dict                      # name -> array from the batch-1 run (initializers and every output)
    data: set                      # names whose values depend on the observation's values
    live: list                     # nodes on the observation's path to the action
    need: set = field(default_factory=set)   # names the action needs through the observation's path
    n_nodes: int = 0                         # nodes in the file

    def dropped_nodes(self) -> list:
        """What was left out: nodes that do not feed the action, and constant sub-graphs (evaluated once)."""
        out = []
        if self.n_nodes > len(self.nodes):
            out.append(f"{self.n_nodes - len(self.nodes)} node(s) that do not feed the action (other outputs' "
                       "branches)")
        live = {id(n) for n in self.live}
        const = sorted({n.op for n in self.nodes if id(n) not in live})
        k = sum(1 for n in self.nodes if id(n) not in live)
        if k:
            out.append(f"{k} node(s) off the observation's path to the action (constants, shape computations, "
                       f"branches that only feed a Shape, e.g. a log-std), evaluated once: {', '.join(const)}")
        return out


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ImportRefused("(onnx)", "package onnx", "is not installed", "pip install 'onnx>=1.15'") from None
    return onnx


def _all_tensors(graph):
    """Every TensorProto a graph holds (initializers, sparse parts, attribute tensors, subgraphs)."""
    for t in graph.initializer:
        yield t
    for s in graph.sparse_initializer:
        yield s.values
        yield s.indices
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _all_tensors(a.g)
            for g in a.graphs:
                yield from _all_tensors(g)


def _external_files(onnx, model, path, file):
    """Check every external-data location is a file inside the model's folder; return them in order."""
    base = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    files = []
    for t in _all_tensors(model.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        loc = {e.key: e.value for e in t.external_data}.get("location", "")
        full = os.path.realpath(os.path.join(base, loc))
        if not loc or os.path.isabs(loc) or os.path.commonpath([base, full]) != base or full == base:
            raise ImportRefused(file, f"initializer '{t.name}'", f"external data location {loc!r} resolves to "
                                f"{full}, outside the model's folder {base}",
                                "keep the .onnx and its data file(s) in one folder (re-save with "
                                "onnx.save(..., save_as_external_data=True, location='<name>.data'))")
        if not os.path.isfile(full):
            raise ImportRefused(file, f"initializer '{t.name}'", f"external data file {loc!r} is missing "
                                f"(looked for {full})", "copy the data file next to the .onnx file")
        if full not in files:
            files.append(full)
    return files


def _name(node: Node) -> str:
    return f"node '{node.name}' ({node.op})"


def parse_nodes(onnx, graph, file) -> list:
    """The graph's nodes as :class:`onnx_eval.Node` (names filled in, attributes as numpy/Python)."""
    from onnx import helper, numpy_helper
    out = []
    for k, n in enumerate(graph.node):
        name = n.name or f"#{k} -> {n.output[0] if n.output else '?'}"
        if n.domain not in ("", "ai.onnx"):
            raise ImportRefused(file, f"node '{name}' ({n.domain}::{n.op_type})",
                                f"operator domain {n.domain!r} is not supported (standard ONNX operators only)",
                                FIX_OP)
        attrs = {}
        for a in n.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                raise ImportRefused(file, f"node '{name}' ({n.op_type})", "operators with sub-graphs (If, Loop, "
                                    "Scan) are not supported", FIX_OP)
            v = helper.get_attribute_value(a)
            if a.type == onnx.AttributeProto.TENSOR:
                v = numpy_helper.to_array(v)
            elif isinstance(v, bytes):
                v = v.decode()
            attrs[a.name] = v
        if n.op_type == "Cast" and "to" in attrs:
            try:
                attrs["to"] = np.dtype(helper.tensor_dtype_to_np_dtype(attrs["to"]))
            except (KeyError, TypeError):
                raise ImportRefused(file, f"node '{name}' (Cast)", f"casts to element type {attrs['to']}",
                                    "export the policy in float32 or float64") from None
        out.append(Node(name, n.op_type, list(n.input), list(n.output), attrs))
    return out


def _toposort(nodes, known, file):
    """Nodes in an order where every input is produced before it is used (ONNX requires this already)."""
    done, out, pending = set(known), [], list(nodes)
    while pending:
        ready = [n for n in pending if all((not i) or i in done for i in n.inputs)]
        if not ready:
            n = pending[0]
            missing = [i for i in n.inputs if i and i not in done]
            raise ImportRefused(file, _name(n), f"input(s) {missing} are produced by no node, initializer or "
                                "graph input (or form a cycle)", "re-export the policy")
        for n in ready:
            out.append(n)
            done.update(o for o in n.outputs if o)
        pending = [n for n in pending if n not in ready]
    return out


def _float_dtype(onnx, elem_type):
    return {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64"}.get(elem_type)


def load(path) -> OnnxGraph:
    """Parse, check, prune and evaluate once. Raises :class:`ImportRefused`; never returns a partial graph."""
    onnx = _onnx()
    from onnx import external_data_helper, numpy_helper
    path = os.fspath(path)
    file = os.path.basename(path)
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:       # protobuf DecodeError, OSError, ... : not an ONNX file
        raise ImportRefused(file, "(file)", f"not a readable ONNX model ({type(e).__name__}: {e})",
                            "pass the .onnx file the exporter wrote") from None
    data_files = _external_files(onnx, model, path, file)
    if data_files:
        external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise ImportRefused(file, "(model)", f"the ONNX checker rejects it: {e}", "re-export the policy") from None
    opsets = {o.domain: o.version for o in model.opset_import}
    opset = opsets.get("", opsets.get("ai.onnx", 0))
    if opset < MIN_OPSET:
        raise ImportRefused(file, "opset_import", f"opset {opset} is older than {MIN_OPSET}",
                            f"re-export with torch.onnx.export(..., opset_version={MIN_OPSET}) or newer")
    g = model.graph
    if len(g.sparse_initializer):
        raise ImportRefused(file, f"sparse initializer '{g.sparse_initializer[0].values.name}'",
                            "sparse initializers are not supported", "re-export with dense weights")
    init_names = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in init_names]
    ops = {n.op_type for n in g.node}
    names = [i.name for i in inputs]
    state_like = [n for n in names if any(k in n.lower() for k in ("h_in", "c_in", "hidden", "cell", "state"))]
    if ops & set(RECURRENT_OPS) or (len(inputs) > 1 and state_like):
        rec = sorted(ops & set(RECURRENT_OPS))
        raise ImportRefused(file, f"graph inputs {names}" + (f", operators {rec}" if rec else ""),
                            "recurrent policies (LSTM / GRU with h_in / c_in state) are not supported yet",
                            "import a feed-forward (MLP) policy; recurrent support is planned")
    if len(inputs) != 1:
        raise ImportRefused(file, f"graph inputs {names}", f"the graph has {len(inputs)} inputs; the importer "
                            "maps exactly one observation input", "export the policy with a single observation "
                            "input [1, n_features]")
    inp = inputs[0]
    tt = inp.type.tensor_type
    dtype = _float_dtype(onnx, tt.elem_type)
    if dtype is None:
        raise ImportRefused(file, f"input '{inp.name}'", f"element type {tt.elem_type} "
                            f"({onnx.TensorProto.DataType.Name(tt.elem_type)}) is not float32 or float64",
                            "export the policy in float32")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if len(dims) != 2 or dims[1] is None or dims[1] < 1:
        raise ImportRefused(file, f"input '{inp.name}'", f"shape {dims}: expected [1 or a dynamic batch, "
                            "n_features]", "export with a dummy input of shape (1, n_features)")
    if dims[0] not in (None, 1):
        raise ImportRefused(file, f"input '{inp.name}'", f"fixed batch {dims[0]}: the node runs one observation "
                            "at a time", "re-export with a batch of 1 or a dynamic batch axis")
    n_features = int(dims[1])
    outputs = [o.name for o in g.output]
    named = [o for o in outputs if o.lower() in ACTION_OUTPUT_NAMES]
    action = named[0] if named else outputs[0]
    nodes = _toposort(parse_nodes(onnx, g, file), init_names | {inp.name}, file)

    # keep only what the action output depends on
    producer_of = {o: n for n in nodes for o in n.outputs if o}
    need, keep = {action}, []
    for n in reversed(nodes):
        if any(o in need for o in n.outputs):
            keep.append(n)
            need.update(i for i in n.inputs if i)
    keep.reverse()
    if action not in producer_of and action != inp.name:
        raise ImportRefused(file, f"output '{action}'", "is produced by no node", "re-export the policy")
    for n in keep:
        if n.op not in DATA_OPS and n.op not in CONST_OPS:
            supported = ", ".join(sorted(DATA_OPS))
            raise ImportRefused(file, _name(n), f"operator {n.op} is not supported{HINTS.get(n.op, '')}; "
                                f"supported on the observation path: {supported}", FIX_OP)
        if n.op == "Gemm" and n.attrs.get("transA", 0):
            raise ImportRefused(file, _name(n), "transA=1 is not supported (a batch-1 policy never transposes "
                                "its input)", "export with torch.nn.Linear / tf2onnx Dense (transA=0)")
    env = {}
    for t in g.initializer:
        if t.name in need:
            arr = numpy_helper.to_array(t)
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                bad = int(np.flatnonzero(~np.isfinite(arr.reshape(-1)))[0])
                raise ImportRefused(file, f"initializer '{t.name}'", f"contains NaN or Inf (first at flat index "
                                    f"{bad} of shape {list(arr.shape)})", "re-export a trained, finite policy")
            env[t.name] = arr
    env[inp.name] = np.full((1, n_features), 0.5, dtype=dtype)
    try:
        env = onnx_eval.run(keep, env, opset)
    except onnx_eval.EvalError as e:
        raise ImportRefused(file, _name(e.node), e.problem, "re-export the policy (the graph is inconsistent) "
                            "or export a plain MLP") from None
    data = {inp.name}
    for n in keep:
        if n.op not in ("Shape",) and any(i in data for i in n.inputs if i):
            data.update(o for o in n.outputs if o)
    live, on_path = [], {action}
    for n in reversed(keep):
        if any(o in on_path and o in data for o in n.outputs):
            live.append(n)
            on_path.update(i for i in n.inputs if i in data)
    live.reverse()
    for n in live:
        if n.op not in DATA_OPS:
            raise ImportRefused(file, _name(n), f"operator {n.op} is applied to the observation's path; it is "
                                "accepted only where it computes constants (shapes, parameters). Supported on the "
                                f"observation path: {', '.join(sorted(DATA_OPS))}", FIX_OP)
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return OnnxGraph(path=path, file=file, files=[path] + data_files, opset=int(opset), producer=producer,
                     metadata={p.key: p.value for p in model.metadata_props}, input_name=inp.name, dtype=dtype,
                     n_features=n_features, action_output=action, dropped_outputs=[o for o in outputs if o != action],
                     nodes=keep, env=env, data=data, live=live, need=on_path, n_nodes=len(g.node))


def _vec_width(shape):
    """n when ``shape`` is (1, ..., 1, n) (a batch-1 vector), else None."""
    if len(shape) == 0 or any(d != 1 for d in shape[:-1]):
        return None
    return int(shape[-1])


def fold(g: OnnxGraph):
    """Walk the observation's path from the input to the action output and fold it (see module doc)."""
    b = Builder(g.file, g.n_features)
    consumers = {}
    for n in g.live:
        for i in n.inputs:
            if i in g.data:
                consumers.setdefault(i, [])
                if n not in consumers[i]:
                    consumers[i].append(n)
    cur = g.input_name
    while cur != g.action_output:
        cons = consumers.get(cur, [])
        silu = _silu(cons, cur, consumers)
        if silu is not None:
            b.activation("silu", 0.0, f"nodes '{cons[0].name}', '{cons[1].name}' (Sigmoid(x) * x)")
            cur = silu
            continue
        if len(cons) != 1:
            where = ", ".join(_name(n) for n in cons)
            b.refuse(f"value '{cur}'", f"feeds {len(cons)} nodes on the way to the action ({where}): the importer "
                     "folds one chain (plus Sigmoid(x) * x); branches that merge again (residuals, concatenated "
                     "features) are not supported", FIX_OP)
        n = cons[0]
        pos = [k for k, i in enumerate(n.inputs) if i == cur]
        others = [i for k, i in enumerate(n.inputs) if i and k not in pos and i in g.data]
        if len(pos) != 1 or others:
            b.refuse(_name(n), "combines two values computed from the observation; only Sigmoid(x) * x "
                     "(silu) is recognised", FIX_OP)
        outs = [o for o in n.outputs if o in g.need]
        if len(outs) != 1:
            b.refuse(_name(n), f"{len(outs)} of its outputs lead to the action; the importer keeps one", FIX_OP)
        _step(b, g, n, pos[0], cur, outs[0])
        width = _vec_width(g.env[outs[0]].shape)
        if width is None or width != b.width:
            b.refuse(_name(n), f"produces shape {list(g.env[outs[0]].shape)}; the importer maps batch-1 vectors "
                     f"of {b.width} values", "export the plain MLP on a (1, n) observation")
        cur = outs[0]
    return b.finish(f"output '{g.action_output}'")


def _silu(cons, cur, consumers):
    """The Mul's output when ``cons`` is exactly {Sigmoid(cur), Mul(cur, that sigmoid)}, else None."""
    if len(cons) != 2:
        return None
    sig = next((n for n in cons if n.op == "Sigmoid"), None)
    mul = next((n for n in cons if n.op == "Mul"), None)
    if sig is None or mul is None or sorted(mul.inputs) != sorted([cur, sig.outputs[0]]):
        return None
    if consumers.get(sig.outputs[0]) != [mul]:
        return None
    return mul.outputs[0]


def _const(g, n, k):
    name = n.inputs[k] if k < len(n.inputs) else ""
    return g.env[name] if name else None


def _step(b: Builder, g: OnnxGraph, n: Node, pos: int, cur: str, out: str):
    """Fold one node of the chain (``cur`` is its input number ``pos``; ``out`` its output on the path)."""
    where, op, a = _name(n), n.op, n.attrs
    if op in NOOP_OPS:
        if pos != 0:
            b.refuse(where, "the observation's value is not its data input", FIX_OP)
        if op == "Cast" and a.get("to") != g.env[cur].dtype:
            b.refuse(where, f"casts the {g.env[cur].dtype} value to {a.get('to')}, which changes it; only a Cast to "
                     "the same float type is a no-op", "export the policy in one float type")
        return
    if op in ("Sub", "Div") and pos != 0:
        b.refuse(where, f"{op}(constant, x) is not a normaliser; the importer maps {op}(x, constant)", FIX_OP)
    other = n.inputs[1 - pos] if op in ("Sub", "Div", "Add", "Mul") else None
    if op == "Sub":
        return b.sub_mean(g.env[other], where)
    if op == "Div":
        return b.div_scale(g.env[other], where)
    if op == "Mul":
        return b.mul_scale(g.env[other], where)
    if op == "Add":
        return b.bias(g.env[other], where)
    if op == "Gemm":
        if pos != 0:
            b.refuse(where, "the observation's value is the weight operand B; the importer maps Gemm(x, W, b)",
                     FIX_OP)
        B = _const(g, n, 1).astype(np.float64)
        if B.ndim != 2:
            b.refuse(where, f"weight '{n.inputs[1]}' has shape {list(B.shape)}, expected 2-D", FIX_OP)
        tb, alpha, beta = int(a.get("transB", 0)), float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        W = alpha * (B.T if tb else B)
        C = _const(g, n, 2)
        bias = None if C is None else beta * C.astype(np.float64)
        extra = "".join(f", {k}={v:g}" for k, v in (("alpha", alpha), ("beta", beta)) if v != 1.0)
        return b.dense(W, bias, where, f"Gemm '{n.name}' (transB={tb}{extra}) {W.shape[0]} -> {W.shape[1]}")
    if op == "MatMul":
        if pos != 0:
            b.refuse(where, "MatMul(W, x): the importer maps MatMul(x, W)", FIX_OP)
        W = _const(g, n, 1).astype(np.float64)
        if W.ndim != 2:
            b.refuse(where, f"weight '{n.inputs[1]}' has shape {list(W.shape)}, expected 2-D (n_in, n_out)", FIX_OP)
        return b.dense(W, None, where, f"MatMul '{n.name}' (+ Add bias) {W.shape[0]} -> {W.shape[1]}")
    if op in ACTIVATION_OPS:
        name = ACTIVATION_OPS[op]
        alpha = 0.0
        if op in ("Elu", "Celu"):
            alpha = float(a.get("alpha", 1.0))
        elif op == "LeakyRelu":
            alpha = float(a.get("alpha", 0.01))
        elif op == "Selu":
            for attr, default in (("alpha", SELU_ALPHA), ("gamma", SELU_GAMMA)):
                v = float(a.get(attr, default))
                if abs(v - default) > 1e-6 * default:
                    b.refuse(where, f"attribute {attr}={v!r} differs from the SELU constant {default!r}; the kernel's "
                             "selu uses the standard alpha and gamma only", "export torch.nn.SELU unchanged")
        return b.activation(name, alpha, where)
    if op in SELECT_OPS:
        if pos != 0:
            b.refuse(where, "the observation's value is not its data input", FIX_OP)
        x = g.env[cur]
        index = np.arange(x.size, dtype=np.float64).reshape(x.shape)
        ins = [index] + [g.env[i] if i else None for i in n.inputs[1:]]
        outs = onnx_eval.eval_node(n, ins, g.opset)
        sel = outs[n.outputs.index(out)]
        if _vec_width(sel.shape) is None:
            b.refuse(where, f"selects shape {list(sel.shape)}; the importer maps a selection of output columns",
                     FIX_OP)
        idx = sel.reshape(-1).astype(np.int64)
        kept = (f"columns {int(idx[0])}..{int(idx[-1])} of {x.size}" if len(idx) and
                (np.diff(idx) == 1).all() else f"columns {idx.tolist()} of {x.size}")
        return b.select(idx, where, f"{where}: keep output '{out}' = {kept}"
                        + (" (the mean half)" if len(idx) * 2 == x.size and idx[0] == 0 else ""))
    if op == "Clip":
        if pos != 0:
            b.refuse(where, "the observation's value is not its data input", FIX_OP)
        lo = _const(g, n, 1) if len(n.inputs) > 1 and n.inputs[1] else a.get("min")
        hi = _const(g, n, 2) if len(n.inputs) > 2 and n.inputs[2] else a.get("max")
        return b.clip(lo, hi, where)
    b.refuse(where, f"operator {op} is not supported here", FIX_OP)


# -- metadata_props (legged_control2 keys) ---------------------------------------------------------------
def _csv(s):
    return [p.strip() for p in str(s).split(",") if p.strip()]


def _numbers(file, key, s, n):
    try:
        v = np.array([float(p) for p in _csv(s)])
    except ValueError:
        raise ImportRefused(file, f"metadata_props '{key}'", f"is not a comma-separated list of numbers: {s!r}",
                            "fix the metadata") from None
    if len(v) not in (1, n) or not np.isfinite(v).all():
        raise ImportRefused(file, f"metadata_props '{key}'", f"has {len(v)} value(s) (or NaN/Inf); the policy has "
                            f"{n} actions", f"give 1 or {n} finite values")
    return np.broadcast_to(v, (n,)).copy()


def map_metadata(file, meta, n_features, n_actions) -> dict:
    """What the legged_control2 metadata keys map to (see docs/policies.md).

    * ``joint_names`` -> action_names, when it names one joint per action.
    * ``observation_names`` -> feature_names, when it names one value per input (it usually names
      observation *terms*, e.g. ``base_lin_vel,...``: then it stays in ``source`` only).
    * ``default_joint_pos`` -> action_offset and ``action_scale`` -> action_scale only when the metadata
      also says ``action_type=relative`` (target = default_joint_pos + action_scale * a). Without it the
      file does not say how they combine (legged_control2 keeps action_type in the controller's YAML:
      position_delta, relative or absolute), so they are not mapped and the action stays the raw output.
    * joint_stiffness, joint_damping, command_names and every other key: kept in ``source`` only.
    """
    out = {"action_names": None, "feature_names": None, "action_offset": 0.0, "action_scale": 1.0, "notes": []}
    if "joint_names" in meta:
        names = _csv(meta["joint_names"])
        if len(names) == n_actions:
            out["action_names"] = names
            out["notes"].append(f"joint_names -> action_names ({n_actions})")
        else:
            out["notes"].append(f"joint_names has {len(names)} names for {n_actions} actions: not mapped")
    if "observation_names" in meta:
        names = _csv(meta["observation_names"])
        if len(names) == n_features:
            out["feature_names"] = names
            out["notes"].append(f"observation_names -> feature_names ({n_features})")
        else:
            out["notes"].append(f"observation_names names {len(names)} terms for {n_features} inputs: kept in "
                                "source only")
    action_type = str(meta.get("action_type", "")).strip().lower()
    has_affine = "default_joint_pos" in meta or "action_scale" in meta
    if action_type == "relative":
        if "default_joint_pos" not in meta or "action_scale" not in meta:
            missing = "default_joint_pos" if "default_joint_pos" not in meta else "action_scale"
            raise ImportRefused(file, f"metadata_props '{missing}'", "is missing while action_type=relative says "
                                "target = default_joint_pos + action_scale * a", "add it to the metadata")
        out["action_offset"] = _numbers(file, "default_joint_pos", meta["default_joint_pos"], n_actions)
        out["action_scale"] = _numbers(file, "action_scale", meta["action_scale"], n_actions)
        out["notes"].append("action_type=relative: default_joint_pos -> action_offset, action_scale -> action_scale")
    elif has_affine:
        out["notes"].append("default_joint_pos / action_scale not mapped: the metadata has no action_type=relative, "
                            "so it does not say how they combine with the action (the action is the raw output)")
    return out
