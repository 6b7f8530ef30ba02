"""ONNX policies (rsl_rl / IsaacLab, SB3 ``OnnxableSB3Policy``, tf2onnx / Brax) -> :class:`Folded`.

How a graph is read:

1. Parse with the ``onnx`` package. External data files are loaded only from inside the model's folder
   (a ``location`` that resolves outside it is refused, naming it), and only after their sizes are checked:
   offset + length within the file, length = the tensor's dims x element size, at most the limit
   (``max_bytes``, common.MAX_TENSOR_BYTES = 256 MiB, the node's policy memory bound) per tensor. Every
   tensor the importer materialises is checked against the same limit before it is allocated (initializers,
   Constant values, what the evaluator computes: see onnx_eval.py). Opset 11 or newer.
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
5. Recurrent policies (rsl_rl / IsaacLab: inputs ``obs``, ``h_in`` [, ``c_in``], outputs ``actions``,
   ``h_out`` [, ``c_out``]): one ``LSTM`` / ``GRU`` node on the observation's path, before the dense layers.
   Its state inputs are graph inputs of shape [1, 1, H] (num_layers 1, batch 1) reaching ``initial_h`` /
   ``initial_c`` through no-ops, and its new state (``Y_h`` / ``Y_c``) must be graph outputs (the caller
   carries the state from call to call: the node's kernel owns it instead). Weights are converted from
   the ONNX gate orders (LSTM i,o,f,c; GRU z,r,h) to the model file's torch order (i,f,g,o; r,z,n). Refused:
   bidirectional / reverse, num_layers > 1, non-default activations, clip, input_forget, layout 1,
   sequence_lens, peepholes, GRU linear_before_reset=0, the plain RNN operator.

Anything else is refused whole (:class:`ImportRefused` names the node, the operator and what is
supported). The graph's own dtype (float32 / float64) is the model's default compute dtype.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from control_node.kernels.importers import onnx_eval
from control_node.kernels.importers.common import (
    MAX_TENSOR_BYTES,
    TOTAL_FACTOR,
    Builder,
    ImportRefused,
    exc_text,
    fmt_bytes,
)
from control_node.kernels.importers.onnx_eval import Node

MIN_OPSET = 11
ACTION_OUTPUT_NAMES = ("action", "actions")
ACTIVATION_OPS = {"Relu": "relu", "Elu": "elu", "Selu": "selu", "LeakyRelu": "leaky_relu", "Celu": "celu",
                  "Tanh": "tanh", "Sigmoid": "sigmoid", "Softplus": "softplus"}
NOOP_OPS = ("Identity", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Expand", "Cast", "Transpose")
SELECT_OPS = ("Split", "Slice", "Gather")
RNN_OPS = ("LSTM", "GRU")
#: operators accepted on the observation's path
DATA_OPS = frozenset(ACTIVATION_OPS) | set(NOOP_OPS) | set(SELECT_OPS) | set(RNN_OPS) | {
    "Sub", "Div", "Mul", "Add", "Gemm", "MatMul", "Clip"}
#: operators accepted only where they compute constants (shapes, parameter transforms)
CONST_OPS = frozenset({"Constant", "Shape", "ConstantOfShape", "Gather", "Concat", "Exp", "Neg", "Sqrt",
                       "Reciprocal", "Equal", "Where", "Transpose", "CastLike", "Tile", "Range"})
RECURRENT_OPS = ("LSTM", "GRU", "RNN")
#: ONNX gate blocks -> torch's: torch block k is ONNX block PERM[k] (LSTM i,o,f,c -> i,f,g,o; GRU z,r,h -> r,z,n)
GATE_PERM = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}
STATE_NAMES = {"h": ("h_in", "hidden", "h0", "hx"), "c": ("c_in", "cell", "c0", "cx")}
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875   # the ONNX defaults (float32)
HINTS = {
    "Erf": " (torch exports GELU as Div, Erf, Add, Mul; the kernel has no GELU)",
    "Conv": " (convolutional policies are not supported: the kernel runs dense layers only)",
    "Softmax": " (a discrete-action head; the importer maps continuous actions)",
    "RNN": " (the plain RNN operator; recurrent policies: one LSTM or GRU layer)",
}
FIX_OP = "export a plain MLP policy (dense layers with one supported activation each), or retrain with one"
FIX_BROKEN = "the file is broken (truncated or modified): re-export the policy"


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
    recurrent: dict | None = None            # the LSTM / GRU node and its state inputs / outputs (see _recurrent)

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


def _tensor_bytes(onnx, t, file, what):
    """(declared bytes, numpy dtype) of TensorProto ``t`` from its dims and element type (Python ints)."""
    from onnx import helper
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise ImportRefused(file, what, f"has negative dims {dims}", FIX_BROKEN)
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    except Exception:
        raise ImportRefused(file, what, f"has element type {t.data_type}, not an ONNX tensor type",
                            FIX_BROKEN) from None
    n = math.prod(dims)
    packed = {getattr(onnx.TensorProto, k, None) for k in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")}
    if t.data_type in packed - {None}:
        return (n + 1) // 2, dt
    return n * max(1, dt.itemsize), dt


def _check_tensor_size(onnx, t, file, what, max_bytes):
    """Refuse a tensor whose dims say it takes more than ``max_bytes``, or whose raw bytes do not match its dims."""
    n, dt = _tensor_bytes(onnx, t, file, what)
    if n > max_bytes:
        raise ImportRefused(file, what, f"has shape {[int(d) for d in t.dims]} ({dt.name}, {fmt_bytes(n)}), more "
                            f"than the limit of {fmt_bytes(max_bytes)} per tensor (max_resident_bytes); refused before "
                            "loading it", "a policy's tensors must fit in the node's policy memory ([lifecycle] "
                            "max_resident_mb); this file is broken or hostile: re-export the policy")
    if t.HasField("raw_data") and dt.kind != "O" and len(t.raw_data) != n:
        raise ImportRefused(file, what, f"holds {len(t.raw_data)} bytes of raw data, its shape "
                            f"{[int(d) for d in t.dims]} ({dt.name}) needs {n}", FIX_BROKEN)
    return n


def _external_files(onnx, model, path, file, max_bytes=MAX_TENSOR_BYTES):
    """Check every external-data location is a file inside the model's folder and that it holds what the
    tensor declares (offset + length within the file, length = dims x element size, at most ``max_bytes``)
    before anything is read from it; return the files in order."""
    base = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    files = []
    total = 0
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
        total += _check_external(onnx, t, file, loc, full, max_bytes)
        if total > TOTAL_FACTOR * max_bytes:
            raise ImportRefused(file, f"initializer '{t.name}'", f"the external data of the graph's tensors adds up to "
                                f"{fmt_bytes(total)} at this one, more than {TOTAL_FACTOR} x the limit of "
                                f"{fmt_bytes(max_bytes)} per tensor (max_resident_bytes)",
                                "a policy's weights must fit in the node's policy memory ([lifecycle] "
                                "max_resident_mb); re-export the policy")
        if full not in files:
            files.append(full)
    return files


def _check_external(onnx, t, file, loc, full, max_bytes) -> int:
    """The bytes tensor ``t`` reads from its external data file ``full``, checked against the file's size and
    the tensor's dims before onnx reads them."""
    what = f"initializer '{t.name}'"
    keys = {e.key: e.value for e in t.external_data}
    try:
        offset = int(keys.get("offset") or 0)
        length = None if keys.get("length") in (None, "") else int(keys["length"])
    except ValueError:
        raise ImportRefused(file, what, f"external data offset {keys.get('offset')!r} / length {keys.get('length')!r} "
                            "are not integers", FIX_BROKEN) from None
    if offset < 0 or (length is not None and length < 0):
        raise ImportRefused(file, what, f"external data offset {offset} / length {length} are negative", FIX_BROKEN)
    declared, dt = _tensor_bytes(onnx, t, file, what)
    size = os.path.getsize(full)
    avail = max(0, size - offset)
    n = avail if length is None else length
    if offset > size or n > avail:
        raise ImportRefused(file, what, f"external data file {loc!r} is {fmt_bytes(size)}: it holds {fmt_bytes(avail)} "
                            f"from offset {offset}, the tensor declares length {fmt_bytes(n)} (shape "
                            f"{[int(d) for d in t.dims]} {dt.name} = {fmt_bytes(declared)})",
                            f"copy the complete {loc} (it is truncated), or re-export the policy")
    if dt.kind != "O" and n != declared:
        raise ImportRefused(file, what, f"external data file {loc!r} gives it {fmt_bytes(n)} (offset {offset}, of a "
                            f"{fmt_bytes(size)} file), its shape {[int(d) for d in t.dims]} ({dt.name}) needs "
                            f"{fmt_bytes(declared)}", f"copy the matching {loc}, or re-export the policy")
    if max(n, declared) > max_bytes:
        raise ImportRefused(file, what, f"has shape {[int(d) for d in t.dims]} ({dt.name}, {fmt_bytes(declared)} in "
                            f"{loc!r}), more than the limit of {fmt_bytes(max_bytes)} per tensor (max_resident_bytes); "
                            "refused before loading it", "a policy's tensors must fit in the node's policy memory "
                            "([lifecycle] max_resident_mb); this file is broken or hostile: re-export the policy")
    return n


def _name(node: Node) -> str:
    return f"node '{node.name}' ({node.op})"


def parse_nodes(onnx, graph, file, max_bytes=MAX_TENSOR_BYTES) -> list:
    """The graph's nodes as :class:`onnx_eval.Node` (names filled in, attributes as numpy/Python).

    A tensor attribute (a Constant's value) is checked against ``max_bytes`` before it is converted."""
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
            where = f"node '{name}' ({n.op_type}) attribute '{a.name}'"
            if a.type == onnx.AttributeProto.TENSOR:
                _check_tensor_size(onnx, a.t, file, where, max_bytes)
            try:
                v = helper.get_attribute_value(a)
                if a.type == onnx.AttributeProto.TENSOR:
                    v = numpy_helper.to_array(v)
                elif isinstance(v, bytes):
                    v = v.decode()
                elif isinstance(v, list) and v and all(isinstance(x, bytes) for x in v):
                    v = [x.decode() for x in v]                 # STRINGS (an LSTM's activations)
            except Exception as e:          # a corrupt attribute: unknown type, bad UTF-8, raw data of another size
                raise ImportRefused(file, where, f"cannot be read ({exc_text(e)})", FIX_BROKEN) from None
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


def _type_name(onnx, elem_type) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return "not an ONNX element type"


def _float_dtype(onnx, elem_type):
    return {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64"}.get(elem_type)


def load(path, max_bytes=MAX_TENSOR_BYTES) -> OnnxGraph:
    """Parse, check, prune and evaluate once. Raises :class:`ImportRefused`; never returns a partial graph.

    No tensor of more than ``max_bytes`` is allocated (external data, initializers, Constant values and what the
    evaluator computes are checked first), nor a file of more than 2 x ``max_bytes`` + 1 MiB parsed."""
    onnx = _onnx()
    from onnx import external_data_helper, numpy_helper
    path = os.fspath(path)
    file = os.path.basename(path)
    size = os.path.getsize(path)
    if size > 2 * max_bytes + (1 << 20):           # 1 MiB for the graph's structure
        raise ImportRefused(file, "(file)", f"is {fmt_bytes(size)}, more than 2 x the limit of {fmt_bytes(max_bytes)} "
                            "per tensor (max_resident_bytes) + 1 MiB: its weights could not be resident",
                            "a policy's weights "
                            "must fit in the node's policy memory ([lifecycle] max_resident_mb); re-export the policy")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:       # protobuf DecodeError, OSError, ... : not an ONNX file
        raise ImportRefused(file, "(file)", f"not a readable ONNX model ({exc_text(e)})",
                            "pass the .onnx file the exporter wrote") from None
    data_files = _external_files(onnx, model, path, file, max_bytes)
    if data_files:
        try:
            external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
        except Exception as e:      # sizes were checked: what is left is an unreadable file
            raise ImportRefused(file, "(external data)", f"cannot be read ({exc_text(e)})",
                                "copy the complete data file(s) next to the .onnx file, or re-export") from None
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise ImportRefused(file, "(model)", f"the ONNX checker rejects it: {exc_text(e, 300)}",
                            "re-export the policy") from None
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
    names = [i.name for i in inputs]
    rnn_nodes = [n for n in g.node if n.op_type in RECURRENT_OPS]
    state_in = [i for i in inputs if len(i.type.tensor_type.shape.dim) == 3]
    state_like = [n for n in names if any(k in n.lower() for k in ("h_in", "c_in", "hidden", "cell", "state"))]
    if not rnn_nodes and len(inputs) > 1 and (state_in or state_like):
        shown = [i.name for i in state_in] or state_like
        raise ImportRefused(file, f"graph inputs {names}", f"state inputs {shown} but no LSTM or GRU node: recurrent "
                            "policies whose state is carried by other operators are not supported yet",
                            "export the recurrent layer as torch.nn.LSTM / GRU (the rsl_rl / IsaacLab exporters do), "
                            "or a feed-forward (MLP) policy")
    rnn_inputs = _state_inputs(onnx, file, rnn_nodes, state_in, inputs) if rnn_nodes else {}
    inputs = [i for i in inputs if i.name not in rnn_inputs]
    names = [i.name for i in inputs]
    if len(inputs) != 1:
        raise ImportRefused(file, f"graph inputs {names}", f"the graph has {len(inputs)} inputs; the importer "
                            "maps exactly one observation input", "export the policy with a single observation "
                            "input [1, n_features]")
    inp = inputs[0]
    tt = inp.type.tensor_type
    dtype = _float_dtype(onnx, tt.elem_type)
    if dtype is None:
        raise ImportRefused(file, f"input '{inp.name}'", f"element type {tt.elem_type} "
                            f"({_type_name(onnx, tt.elem_type)}) is not float32 or float64",
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
    nodes = _toposort(parse_nodes(onnx, g, file, max_bytes), init_names | {inp.name} | set(rnn_inputs), file)

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
        if n.op in RNN_OPS:
            _check_rnn_attrs(file, n)
        if n.op == "Gemm" and n.attrs.get("transA", 0):
            raise ImportRefused(file, _name(n), "transA=1 is not supported (a batch-1 policy never transposes "
                                "its input)", "export with torch.nn.Linear / tf2onnx Dense (transA=0)")
    env = {}
    total = 0
    for t in g.initializer:
        if t.name in need:
            what = f"initializer '{t.name}'"
            total += _check_tensor_size(onnx, t, file, what, max_bytes)
            if total > TOTAL_FACTOR * max_bytes:
                raise ImportRefused(file, what, f"the initializers add up to {fmt_bytes(total)} at this one, more "
                                    f"than {TOTAL_FACTOR} x the limit of {fmt_bytes(max_bytes)} per tensor "
                                    "(max_resident_bytes)", "a policy's weights must fit in the node's policy memory "
                                    "([lifecycle] max_resident_mb); re-export the policy")
            try:
                arr = numpy_helper.to_array(t)
            except Exception as e:          # data of another size than its dims, an unknown element type
                raise ImportRefused(file, what, f"cannot be read ({exc_text(e)})", FIX_BROKEN) from None
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                bad = int(np.flatnonzero(~np.isfinite(arr.reshape(-1)))[0])
                raise ImportRefused(file, f"initializer '{t.name}'", f"contains NaN or Inf (first at flat index "
                                    f"{bad} of shape {list(arr.shape)})", "re-export a trained, finite policy")
            env[t.name] = arr
    for name, shape, dt in [(inp.name, [1, n_features], dtype)] + [(k, sh, d) for k, (sh, d) in rnn_inputs.items()]:
        n = math.prod(shape) * np.dtype(dt).itemsize
        if n > max_bytes:
            raise ImportRefused(file, f"input '{name}'", f"has shape {shape} ({dt}, {fmt_bytes(n)}), more than the "
                                f"limit of {fmt_bytes(max_bytes)} per tensor (max_resident_bytes)",
                                "export the policy with its real observation / state width")
    env[inp.name] = np.full((1, n_features), 0.5, dtype=dtype)
    for name, (shape, sdtype) in rnn_inputs.items():
        env[name] = np.zeros(shape, dtype=sdtype)
    try:
        env = onnx_eval.run(keep, env, opset, max_bytes)
    except onnx_eval.EvalError as e:
        raise ImportRefused(file, _name(e.node), e.problem, e.fix or "re-export the policy (the graph is "
                            "inconsistent) or export a plain MLP") from None
    data = {inp.name} | set(rnn_inputs)
    for n in keep:
        if n.op == "Shape" or (n.op == "CastLike" and n.inputs[0] not in data):   # only shapes / dtypes flow
            continue
        if any(i in data for i in n.inputs if i):
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
    recurrent = None
    if rnn_nodes:
        recurrent = _recurrent(file, nodes, keep, live, env, data, rnn_inputs, inp.name, action, outputs)
    state_outputs = set(recurrent["state_outputs"].values()) if recurrent else set()
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return OnnxGraph(path=path, file=file, files=[path] + data_files, opset=int(opset), producer=producer,
                     metadata={p.key: p.value for p in model.metadata_props}, input_name=inp.name, dtype=dtype,
                     n_features=n_features, action_output=action,
                     dropped_outputs=[o for o in outputs if o != action and o not in state_outputs],
                     nodes=keep, env=env, data=data, live=live, need=on_path, n_nodes=len(g.node), recurrent=recurrent)


# -- recurrent graphs: the LSTM / GRU node and its state ------------------------------------------------------
def _state_inputs(onnx, file, rnn_nodes, state_in, inputs) -> dict:
    """The graph's state inputs {name: (shape [1, 1, H], dtype)} for a graph with an LSTM / GRU node.

    Refuses the plain RNN operator, more than one recurrent node (num_layers > 1), and state inputs that are
    not [num_layers=1, batch=1, H] float tensors."""
    first = rnn_nodes[0]
    label = f"node '{first.name or first.output[0]}' ({first.op_type})"
    if first.op_type == "RNN":
        raise ImportRefused(file, label, "the plain RNN operator is not supported (recurrent policies: one LSTM or GRU "
                            "layer)", "train with rnn_type='lstm' or 'gru'")
    if len(rnn_nodes) > 1:
        which = ", ".join(f"'{n.name}' ({n.op_type})" for n in rnn_nodes)
        raise ImportRefused(file, f"nodes {which}", f"{len(rnn_nodes)} recurrent nodes (num_layers > 1, or stacked "
                            "recurrent layers): the kernel runs one recurrent layer", "train with rnn_num_layers=1")
    H = next((int(a.i) for a in first.attribute if a.name == "hidden_size"), None)
    want = 2 if first.op_type == "LSTM" else 1
    out = {}
    for i in state_in:
        tt = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if dims[0] not in (None, 1):
            raise ImportRefused(file, f"input '{i.name}'", f"state shape {dims}: num_layers={dims[0]}; the kernel runs "
                                "one recurrent layer", "train with rnn_num_layers=1")
        if dims[1] not in (None, 1):
            raise ImportRefused(file, f"input '{i.name}'", f"state shape {dims}: batch {dims[1]}; the node runs one "
                                "observation at a time", "export with a batch of 1 (h_in / c_in shaped [1, 1, H])")
        if dims[2] is None or (H is not None and dims[2] != H):
            raise ImportRefused(file, f"input '{i.name}'", f"state shape {dims} does not match the {first.op_type}'s "
                                f"hidden_size {H}", "re-export the policy")
        dt = _float_dtype(onnx, tt.elem_type)
        if dt is None:
            raise ImportRefused(file, f"input '{i.name}'", "state element type is not float32 or float64",
                                "export the policy in float32")
        out[i.name] = ([1, 1, dims[2]], dt)
    if len(out) != want:
        names = [i.name for i in inputs]
        raise ImportRefused(file, f"graph inputs {names}", f"the {first.op_type} needs {want} state input(s) shaped "
                            f"[1, 1, H] ({'h_in, c_in' if want == 2 else 'h_in'}); the graph has {len(out)}",
                            "export as rsl_rl / IsaacLab do: inputs obs, h_in" + (", c_in" if want == 2 else ""))
    return out


STATE_NOOPS = ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Cast", "Slice", "Transpose", "Expand")


def _trace_back(name, producer_of, env, stop, file, what):
    """Follow ``name`` back through value-preserving no-ops until a name in ``stop``; returns (that name, path)."""
    path = []
    while name not in stop:
        n = producer_of.get(name)
        if n is None or n.op not in STATE_NOOPS:
            where = _name(n) if n is not None else f"value '{name}'"
            raise ImportRefused(file, where, f"{what} passes through {n.op if n else 'nothing'} on its way; only "
                                f"no-ops ({', '.join(STATE_NOOPS)}) that keep the [1, 1, H] state whole are recognised",
                                "export the state as rsl_rl / IsaacLab do (h_in -> LSTM -> h_out)")
        src = n.inputs[0]
        if src in env and name in env and np.size(env[src]) != np.size(env[name]):
            raise ImportRefused(file, _name(n), f"{what}: {n.op} changes the state's size "
                                f"({list(np.shape(env[src]))} -> {list(np.shape(env[name]))})",
                                "export the state whole ([1, 1, H])")
        path.append(n)
        name = src
    return name, path


def _check_rnn_attrs(file, n):
    """The LSTM / GRU node's attributes and optional inputs: what the kernel implements, else refused naming it
    (checked before the graph is evaluated once)."""
    where, a, op = _name(n), n.attrs, n.op
    direction = a.get("direction", "forward")
    if direction != "forward":
        raise ImportRefused(file, where, f"attribute direction={direction!r}: bidirectional / reverse recurrent layers "
                            "are not supported (the kernel runs one forward layer)", "train a unidirectional LSTM / GRU")
    if int(a.get("layout", 0)) != 0:
        raise ImportRefused(file, where, f"attribute layout={a.get('layout')} (batch-first) is not supported",
                            "export with the default layout 0 (torch.onnx does)")
    acts = a.get("activations")
    default = onnx_eval.RNN_DEFAULT_ACTIVATIONS[op]
    if acts is not None and [str(x) for x in acts] != default:
        raise ImportRefused(file, where, f"attribute activations={list(acts)}: only the defaults {default} are "
                            "supported", "export torch.nn.LSTM / GRU")
    for k in ("activation_alpha", "activation_beta"):
        if k in a:
            raise ImportRefused(file, where, f"attribute {k} is not supported (default activations only)",
                                "export torch.nn.LSTM / GRU")
    if "clip" in a:
        raise ImportRefused(file, where, f"attribute clip={a['clip']:g}: cell clipping is not supported",
                            "export without clip (torch.nn.LSTM has none)")
    if op == "LSTM" and int(a.get("input_forget", 0)):
        raise ImportRefused(file, where, "attribute input_forget=1 (coupled input and forget gates) is not supported",
                            "export torch.nn.LSTM")
    if op == "GRU" and int(a.get("linear_before_reset", 0)) != 1:
        raise ImportRefused(file, where, f"attribute linear_before_reset={int(a.get('linear_before_reset', 0))}: the "
                            "kernel implements torch's GRU (linear_before_reset=1: r * (R h + Rb))",
                            "export torch.nn.GRU (torch.onnx writes linear_before_reset=1)")
    ins = list(n.inputs) + [""] * (8 - len(n.inputs))
    if ins[4]:
        raise ImportRefused(file, f"{where} input sequence_lens '{ins[4]}'", "sequence_lens is not supported (the node "
                            "runs one step per call)", "export without sequence_lens (torch.onnx does)")
    if op == "LSTM" and ins[7]:
        raise ImportRefused(file, f"{where} input P '{ins[7]}'", "peephole weights are not supported",
                            "export torch.nn.LSTM (no peepholes)")


def _recurrent(file, nodes, keep, live, env, data, rnn_inputs, obs_name, action, outputs) -> dict:
    """Check how the LSTM / GRU node's state flows (its attributes: _check_rnn_attrs); returns what fold and the
    proof need:
    ``{"op", "node", "H", "state_inputs": {"h": name, "c": name}, "state_outputs": {"h": name, "c": name}}``."""
    rnn = [n for n in keep if n.op in RNN_OPS]
    if not rnn:
        raise ImportRefused(file, f"output '{action}'", "does not depend on the graph's recurrent node: the state "
                            "inputs would be ignored", "export the policy whose actions come from the LSTM / GRU")
    n = rnn[0]
    where, a, op = _name(n), n.attrs, n.op
    if n.inputs[0] not in data or n.inputs[0] in rnn_inputs:
        b_where = f"{where} input X '{n.inputs[0]}'"
        raise ImportRefused(file, b_where, "is not computed from the observation", FIX_OP)
    ins = list(n.inputs) + [""] * (8 - len(n.inputs))
    for k, label in ((1, "W"), (2, "R"), (3, "B")):
        if ins[k] and ins[k] in data:
            raise ImportRefused(file, f"{where} input {label} '{ins[k]}'", "is computed from the graph's inputs; the "
                                "weights must be constants", "re-export the policy")
    producer_of = {o: m for m in nodes for o in m.outputs if o}
    slots = {"h": 5, "c": 6} if op == "LSTM" else {"h": 5}
    state_inputs = {}
    for which, k in slots.items():
        if not ins[k]:
            raise ImportRefused(file, f"{where} input initial_{which}", "is absent: the graph runs every call from a "
                                "zero state, so the state is not carried between calls (the kernel carries it)",
                                "export the policy with h_in / c_in inputs and h_out / c_out outputs "
                                "(rsl_rl / IsaacLab exporters)")
        src, _path = _trace_back(ins[k], producer_of, env, set(rnn_inputs) | {obs_name}, file,
                                 f"the {op}'s initial_{which}")
        if src not in rnn_inputs:
            raise ImportRefused(file, f"{where} input initial_{which}", "comes from the observation, not a state input",
                                "export the state as its own input")
        other = "c" if which == "h" else "h"
        if any(k2 in src.lower() for k2 in STATE_NAMES[other]) and not any(k2 in src.lower()
                                                                           for k2 in STATE_NAMES[which]):
            raise ImportRefused(file, f"input '{src}'", f"its name says {'cell' if other == 'c' else 'hidden'} state "
                                f"but it feeds the {op}'s initial_{which}", "re-export with h_in -> initial_h, "
                                "c_in -> initial_c")
        state_inputs[which] = src
    if len(set(state_inputs.values())) != len(state_inputs):
        raise ImportRefused(file, where, f"one input '{state_inputs['h']}' feeds both initial_h and initial_c",
                            "export h_in and c_in as two inputs")
    # the state reaches nothing but the recurrent node (through its no-ops)
    state_vals = set(rnn_inputs)
    for m in live:
        if m is n:
            continue
        if any(i in state_vals for i in m.inputs if i):
            if m.op in STATE_NOOPS and m.inputs[0] in state_vals:
                state_vals.update(o for o in m.outputs if o)
            else:
                raise ImportRefused(file, _name(m), "uses the recurrent state outside the recurrent node: only "
                                    "h_in -> [no-ops] -> LSTM / GRU is recognised", FIX_OP)
    for k in range(1, 8):
        if ins[k] and ins[k] in state_vals and k not in slots.values():
            raise ImportRefused(file, f"{where} input {k}", "is computed from the state inputs", FIX_OP)
    # the new state must be graph outputs (the caller carries it)
    state_outputs = {}
    out_slot = {1: "h", 2: "c"}
    for o in outputs:
        if o == action:
            continue
        name, m = o, producer_of.get(o)
        while m is not None and m is not n and m.op in STATE_NOOPS:
            name = m.inputs[0]
            m = producer_of.get(name)
        if m is n and name in n.outputs:
            k = n.outputs.index(name)
            if k in out_slot and out_slot[k] in slots:
                if out_slot[k] in state_outputs:
                    raise ImportRefused(file, f"output '{o}'", f"a second output of the {op}'s new "
                                        f"{'hidden' if k == 1 else 'cell'} state", "export h_out / c_out once")
                state_outputs[out_slot[k]] = o
    for which in slots:
        if which not in state_outputs:
            outs = "h_out and c_out" if op == "LSTM" else "h_out"
            raise ImportRefused(file, where, f"its new state Y_{which} is not a graph output: the caller of the graph "
                                "could not carry the state from call to call",
                                f"export {outs} as outputs (rsl_rl / IsaacLab do)")
    H = int(a.get("hidden_size", env[ins[2]].shape[-1]))
    return {"op": op, "node": n, "H": H, "state_inputs": state_inputs, "state_outputs": state_outputs,
            "state_shape": [1, 1, H], "state_dtype": rnn_inputs[state_inputs["h"]][1]}


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
        state_slots = (5, 6) if n.op in RNN_OPS else ()       # initial_h / initial_c: checked by _recurrent
        others = [i for k, i in enumerate(n.inputs) if i and k not in pos and k not in state_slots and i in g.data]
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
    folded = b.finish(f"output '{g.action_output}'")
    if g.recurrent:
        r = g.recurrent
        folded.state = {"inputs": r["state_inputs"], "outputs": r["state_outputs"], "shape": r["state_shape"]}
    return folded


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
        if op == "Transpose":
            x = g.env[cur]
            index = np.arange(x.size).reshape(x.shape)
            if not (np.transpose(index, a.get("perm")).reshape(-1) == np.arange(x.size)).all():
                b.refuse(where, f"perm={a.get('perm')} reorders the values of shape {list(x.shape)}; only a "
                         "Transpose that moves size-1 axes is a no-op", FIX_OP)
        return
    if op in RNN_OPS:
        if pos != 0:
            b.refuse(where, "the observation's value is not its input X", FIX_OP)
        return _recurrent_step(b, g, n)
    if op in ("Mul", "Div") and (op == "Mul" or pos == 0) and np.all(np.asarray(g.env[n.inputs[1 - pos]]) == 1):
        return                                           # x * 1, x / 1 (dynamo's unoptimised Elu wrapper)
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


def _recurrent_step(b: Builder, g: OnnxGraph, n: Node):
    """The LSTM / GRU node (checked by _recurrent): its weights in torch's gate order."""
    where, op = _name(n), n.op
    G = len(GATE_PERM[op])
    W, R = _const(g, n, 1), _const(g, n, 2)
    B = _const(g, n, 3)
    H = g.recurrent["H"]
    if W is None or R is None or W.ndim != 3 or W.shape[:2] != (1, G * H) or R.shape != (1, G * H, H):
        b.refuse(where, f"weights W {None if W is None else list(W.shape)} / R {None if R is None else list(R.shape)}: "
                 f"expected [1, {G * H}, n_in] and [1, {G * H}, {H}] (one direction, hidden_size {H})",
                 "re-export the policy")
    if B is not None and B.shape != (1, 2 * G * H):
        b.refuse(where, f"bias B has shape {list(B.shape)}, expected [1, {2 * G * H}]", "re-export the policy")

    def torch_order(M):          # (G*H, ...) in ONNX blocks -> torch blocks
        return np.concatenate([M[k * H:(k + 1) * H] for k in GATE_PERM[op]], axis=0)
    W_ih, W_hh = torch_order(W[0].astype(np.float64)), torch_order(R[0].astype(np.float64))
    b_ih = b_hh = None
    if B is not None:
        B = B[0].astype(np.float64)
        b_ih, b_hh = torch_order(B[:G * H]), torch_order(B[G * H:])
    kind = op.lower()
    order = "i,o,f,c -> i,f,g,o" if op == "LSTM" else "z,r,h -> r,z,n"
    b.recurrent_layer(kind, W_ih, W_hh, b_ih, b_hh, where,
                      f"{op} '{n.name}' {W_ih.shape[1]} -> H={H} (ONNX gates {order}"
                      + (", linear_before_reset=1" if op == "GRU" else "") + ")")


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
