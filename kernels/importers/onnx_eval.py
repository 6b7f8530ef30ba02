"""A tiny numpy evaluator for exactly the ONNX operators the importer accepts.

Written from the ONNX operator specification, independently of kernels/reference.py. It is used to
(1) run the graph once on a batch-1 observation, which gives every tensor's shape and the value of
every constant sub-graph (weights behind Identity/Transpose, shapes computed by Shape/Concat, gate
reordering done with Slice/Concat on the initializers, ...), and (2) prove an import when onnxruntime is
not installed. It computes in the tensors' own dtypes (float32 graphs stay float32), batch 1. LSTM and
GRU are implemented from the operator definitions (ONNX gate orders i,o,f,c and z,r,h; forward
direction, default activations; GRU with either linear_before_reset).

Nodes are :class:`Node` tuples (see ``onnx.py: parse_nodes``): attributes already converted to plain
Python / numpy values, ``to`` of Cast already a numpy dtype.

Hostile or broken graphs cannot exhaust memory: before a node runs, the shape and size of what it would
materialise is computed from its inputs' shapes and values in Python integers (no int64 overflow) and
refused with :class:`TooLarge` when one output would take more than ``max_bytes`` (the node's policy
memory bound, common.MAX_TENSOR_BYTES = 256 MiB by default: ConstantOfShape, Expand, Tile, Range,
Reshape, Gather, Concat, broadcasting element-wise ops, MatMul, Gemm, Cast), or when everything the run
holds would exceed ``TOTAL_FACTOR`` times that. Nothing is allocated before the check.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from control_node.kernels.importers.common import MAX_TENSOR_BYTES, TOTAL_FACTOR, fmt_bytes


class Node(NamedTuple):
    name: str
    op: str
    inputs: list        # '' where an optional input is omitted
    outputs: list
    attrs: dict


class EvalError(ValueError):
    """A node could not be evaluated (bad shapes, bad attribute). ``node`` is the :class:`Node`."""

    fix = None

    def __init__(self, node, problem):
        self.node, self.problem = node, problem
        super().__init__(f"node '{node.name}' ({node.op}): {problem}")


FIX_TOO_LARGE = ("a policy's tensors must fit in the node's policy memory ([lifecycle] max_resident_mb); this file "
                 "is broken or hostile: re-export the policy from its checkpoint")


class TooLarge(EvalError):
    """A node would materialise more than the limit (checked before anything is allocated)."""

    fix = FIX_TOO_LARGE

    def __init__(self, node, problem):
        super().__init__(node, problem)


def _nbytes(shape, dtype) -> int:
    """Bytes of an array shaped ``shape`` (Python ints: never overflows) of ``dtype``."""
    return math.prod(int(d) for d in shape) * max(1, np.dtype(dtype).itemsize)


def _check_size(node, shape, dtype, max_bytes, what="its output"):
    """Refuse (:class:`TooLarge`) when an array ``shape`` of ``dtype`` would take more than ``max_bytes``."""
    shape = [int(d) for d in shape]
    if any(d < 0 for d in shape):
        raise EvalError(node, f"{what} would have the negative shape {shape}")
    n = _nbytes(shape, dtype)
    if n > max_bytes:
        raise TooLarge(node, f"{what} would have shape {shape} ({np.dtype(dtype).name}, {fmt_bytes(n)}), more than "
                       f"the limit of {fmt_bytes(max_bytes)} per tensor (max_resident_bytes); refused before "
                       "allocating it")
    return n


def _ints(node, v, what):
    """The values of a (shape / repeats / indices) tensor as Python ints."""
    a = np.asarray(v)
    if a.dtype.kind not in "iu":
        raise EvalError(node, f"{what} has element type {a.dtype}, expected int64")
    return [int(x) for x in a.reshape(-1)]


def _broadcast(node, *shapes):
    """The multidirectional (numpy) broadcast of ``shapes``, in Python ints; EvalError when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = {int(s[len(s) - rank + k]) for s in shapes if len(s) - rank + k >= 0}
        big = dims - {1}
        if len(big) > 1:
            raise EvalError(node, f"shapes {[list(s) for s in shapes]} do not broadcast: dimension mismatch")
        out.append(big.pop() if big else 1)
    return out


def _planned(node, ins, opset):
    """[(shape, dtype)] of the outputs ``node`` would allocate, for the operators whose output can be larger
    than their inputs; None for the others (their outputs are no larger than an input, checked after)."""
    op, a = node.op, node.attrs

    def arr(k):
        return ins[k] if len(ins) > k and ins[k] is not None else None
    if op == "ConstantOfShape":
        value = np.asarray(a.get("value", np.zeros(1, dtype=np.float32)))
        if np.ndim(ins[0]) != 1 or value.size != 1:
            raise EvalError(node, f"the shape input has shape {list(np.shape(ins[0]))} (expected 1-D) or the value "
                            f"{value.size} elements (expected 1)")
        return [(_ints(node, ins[0], "the shape input"), value.dtype)]
    if op == "Expand":
        x = ins[0]
        return [(_broadcast(node, x.shape, _ints(node, ins[1], "the shape input")), x.dtype)]
    if op == "Tile":
        x, reps = ins[0], _ints(node, ins[1], "the repeats input")
        if len(reps) != x.ndim:
            raise EvalError(node, f"repeats {reps} has {len(reps)} values for an input of rank {x.ndim}")
        if any(r < 0 for r in reps):
            raise EvalError(node, f"repeats {reps} has a negative value")
        return [([d * r for d, r in zip(x.shape, reps)], x.dtype)]
    if op == "Range":
        return [([_range_len(node, ins)], np.asarray(ins[0]).dtype)]
    if op == "Reshape":
        x, shape = ins[0], _ints(node, ins[1], "the shape input")
        if not a.get("allowzero", 0):
            shape = [x.shape[i] if s == 0 and i < x.ndim else s for i, s in enumerate(shape)]
        return [([s for s in shape if s != -1], x.dtype)]      # the explicit dims alone must fit
    if op == "Gather":
        x, idx = ins[0], np.asarray(ins[1])
        axis = int(a.get("axis", 0))
        axis = axis + x.ndim if axis < 0 else axis
        if not 0 <= axis < x.ndim:
            raise EvalError(node, f"axis {a.get('axis', 0)} is out of range for rank {x.ndim}")
        return [(list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:]), x.dtype)]
    if op in BINARY:
        x, y = np.asarray(ins[0]), np.asarray(ins[1])
        dt = np.bool_ if op == "Equal" else np.result_type(x, y)
        return [(_broadcast(node, x.shape, y.shape), dt)]
    if op == "Where":
        c, x, y = (np.asarray(v) for v in ins[:3])
        return [(_broadcast(node, c.shape, x.shape, y.shape), np.result_type(x, y))]
    if op == "Concat":
        parts = [np.asarray(i) for i in ins if i is not None]
        if not parts:
            return None
        total = sum(p.size for p in parts)
        return [([total], np.result_type(*parts))]
    if op == "MatMul":
        x, w = np.asarray(ins[0]), np.asarray(ins[1])
        if x.ndim < 2 or w.ndim < 2:
            return None
        return [(_broadcast(node, x.shape[:-2], w.shape[:-2]) + [x.shape[-2], w.shape[-1]], np.result_type(x, w))]
    if op == "Gemm":
        A, B = np.asarray(ins[0]), np.asarray(ins[1])
        if A.ndim != 2 or B.ndim != 2:
            return None
        rows = A.shape[1] if a.get("transA", 0) else A.shape[0]
        cols = B.shape[0] if a.get("transB", 0) else B.shape[1]
        return [([rows, cols], np.result_type(A, B))]
    if op == "Cast":
        return [(ins[0].shape, a["to"])]
    if op == "CastLike":
        return [(ins[0].shape, np.asarray(ins[1]).dtype)]
    if op in ("LSTM", "GRU"):
        X = ins[0]
        H = int(a.get("hidden_size", np.shape(ins[2])[-1]))
        return [([X.shape[0], 1, X.shape[1], H], X.dtype)] if X.ndim == 3 else None
    return None


def _range_len(node, ins):
    """Number of elements of Range(start, limit, delta), computed in Python numbers."""
    vals = []
    for k, what in enumerate(("start", "limit", "delta")):
        v = np.asarray(ins[k])
        if v.size != 1:
            raise EvalError(node, f"{what} has shape {list(v.shape)}, expected a scalar")
        vals.append(v.reshape(-1)[0].item())
    start, limit, delta = vals
    if delta == 0:
        raise EvalError(node, "delta is 0")
    if all(isinstance(v, int) for v in vals):
        return max(0, -((start - limit) // delta))
    q = (limit - start) / delta
    if not math.isfinite(q):
        raise EvalError(node, f"start {start}, limit {limit}, delta {delta} give {q} elements")
    return max(0, math.ceil(q))


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _f(x, v):
    """Scalar ``v`` in x's dtype (ONNX float attributes are float32; the op runs in the tensor's type)."""
    return np.asarray(v, dtype=np.float32).astype(x.dtype)[()]


def _axes(node, ins, opset, rank, attr="axes", pos=1):
    """Axes given as an attribute (old opsets) or an input (opset 13+), normalised to >= 0."""
    if len(ins) > pos and ins[pos] is not None:
        axes = [int(a) for a in np.asarray(ins[pos]).reshape(-1)]
    elif attr in node.attrs:
        axes = [int(a) for a in node.attrs[attr]]
    else:
        return None
    return sorted(a + rank if a < 0 else a for a in axes)


def _gemm(node, A, B, C):
    a = node.attrs
    if A.ndim != 2 or B.ndim != 2:
        raise EvalError(node, f"Gemm needs 2-D operands, got {list(A.shape)} and {list(B.shape)}")
    A = A.T if a.get("transA", 0) else A
    B = B.T if a.get("transB", 0) else B
    if A.shape[1] != B.shape[0]:
        raise EvalError(node, f"dimension mismatch: the input has {A.shape[1]} values per row but the weight "
                        f"takes {B.shape[0]}")
    Y = _f(A, a.get("alpha", 1.0)) * (A @ B)
    if C is not None:
        Y = Y + _f(A, a.get("beta", 1.0)) * C
    return Y.astype(A.dtype)


def _reshape(node, x, shape):
    shape = [int(s) for s in shape]
    if not node.attrs.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _split(node, ins, opset):
    x = ins[0]
    axis = node.attrs.get("axis", 0)
    axis = axis + x.ndim if axis < 0 else axis
    n_out = len(node.outputs)
    if len(ins) > 1 and ins[1] is not None:
        sizes = [int(s) for s in ins[1]]
    elif "split" in node.attrs:
        sizes = [int(s) for s in node.attrs["split"]]
    else:
        n = x.shape[axis]
        k = node.attrs.get("num_outputs", n_out)
        step = -(-n // k)
        sizes = [min(step, n - i * step) for i in range(k)]
    if sum(sizes) != x.shape[axis] or len(sizes) != n_out:
        raise EvalError(node, f"split sizes {sizes} do not match axis {axis} of shape {list(x.shape)}")
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _slice(node, ins):
    x = ins[0]
    starts, ends = [int(v) for v in ins[1]], [int(v) for v in ins[2]]
    axes = [int(v) for v in ins[3]] if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = [int(v) for v in ins[4]] if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    sl = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        sl[ax + x.ndim if ax < 0 else ax] = slice(s, e, st)
    return x[tuple(sl)]


def _constant(node):
    a = node.attrs
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in a:
            v = a[key]
            if key.startswith("value_float"):
                return np.asarray(v, dtype=np.float32)
            if key.startswith("value_int"):
                return np.asarray(v, dtype=np.int64)
            return np.asarray(v)
    raise EvalError(node, f"Constant without a supported value attribute (has {sorted(a)})")


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)
    return (a / b).astype(a.dtype)


UNARY = {
    "Relu": lambda n, x: np.maximum(x, _f(x, 0)),
    "Elu": lambda n, x: np.where(x > 0, x, _f(x, n.attrs.get("alpha", 1.0)) * (np.exp(np.minimum(x, 0)) - 1)),
    "Selu": lambda n, x: _f(x, n.attrs.get("gamma", 1.05070102214813232421875)) * np.where(
        x > 0, x, _f(x, n.attrs.get("alpha", 1.67326319217681884765625)) * (np.exp(np.minimum(x, 0)) - 1)),
    "LeakyRelu": lambda n, x: np.where(x >= 0, x, _f(x, n.attrs.get("alpha", 0.01)) * x),
    "Celu": lambda n, x: (np.maximum(x, _f(x, 0)) + np.minimum(
        _f(x, 0), _f(x, n.attrs.get("alpha", 1.0)) * (np.exp(x / _f(x, n.attrs.get("alpha", 1.0))) - 1))),
    "Tanh": lambda n, x: np.tanh(x),
    "Sigmoid": lambda n, x: _sigmoid(x),
    "Softplus": lambda n, x: np.logaddexp(_f(x, 0), x),
    "Exp": lambda n, x: np.exp(x),
    "Neg": lambda n, x: -x,
    "Sqrt": lambda n, x: np.sqrt(x),
    "Reciprocal": lambda n, x: (1 / x).astype(x.dtype),
    "Identity": lambda n, x: x,
}
BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _div, "Equal": np.equal}

RNN_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _rnn_checks(node, ins, H, G):
    """The recurrent attributes this evaluator implements (forward, layout 0, default activations, no clip)."""
    a = node.attrs
    direction = a.get("direction", "forward")
    if direction != "forward":
        raise EvalError(node, f"direction={direction!r} is not implemented (forward only)")
    if a.get("layout", 0) != 0:
        raise EvalError(node, f"layout={a.get('layout')} is not implemented (0: [seq, batch, ...])")
    acts = a.get("activations")
    if acts is not None and [str(x) for x in acts] != RNN_DEFAULT_ACTIVATIONS[node.op]:
        raise EvalError(node, f"activations={list(acts)} are not implemented (the defaults only)")
    for k in ("clip", "activation_alpha", "activation_beta"):
        if k in a:
            raise EvalError(node, f"attribute {k} is not implemented")
    if node.op == "LSTM" and a.get("input_forget", 0):
        raise EvalError(node, "input_forget=1 is not implemented")
    W, R = ins[1], ins[2]
    if W.ndim != 3 or W.shape[0] != 1 or W.shape[1] != G * H or R.shape != (1, G * H, H):
        raise EvalError(node, f"weights W {list(W.shape)} / R {list(R.shape)} do not match hidden_size {H} "
                        f"(expected [1, {G * H}, n] and [1, {G * H}, {H}])")


def _sig(x):
    return _sigmoid(x)


def _lstm(node, ins):
    """ONNX LSTM (gate order i, o, f, c; B = [Wb, Rb]), forward direction, from the operator definition."""
    X, W, R = ins[0], ins[1], ins[2]
    H = int(node.attrs.get("hidden_size", R.shape[-1]))
    _rnn_checks(node, ins, H, 4)
    B = ins[3] if len(ins) > 3 and ins[3] is not None else np.zeros((1, 8 * H), dtype=X.dtype)
    if len(ins) > 4 and ins[4] is not None:
        raise EvalError(node, "sequence_lens is not implemented")
    if len(ins) > 7 and ins[7] is not None:
        raise EvalError(node, "peephole weights P are not implemented")
    seq, batch = X.shape[0], X.shape[1]
    h = ins[5][0] if len(ins) > 5 and ins[5] is not None else np.zeros((batch, H), dtype=X.dtype)
    c = ins[6][0] if len(ins) > 6 and ins[6] is not None else np.zeros((batch, H), dtype=X.dtype)
    Wt, Rt, b = W[0].T, R[0].T, (B[0, :4 * H] + B[0, 4 * H:])
    Y = np.zeros((seq, 1, batch, H), dtype=X.dtype)
    for t in range(seq):
        g = X[t] @ Wt + h @ Rt + b
        i, o, f, cc = (g[:, k * H:(k + 1) * H] for k in range(4))
        c = _sig(f) * c + _sig(i) * np.tanh(cc)
        h = _sig(o) * np.tanh(c)
        Y[t, 0] = h
    return [Y, h[None].astype(X.dtype), c[None].astype(X.dtype)]


def _gru(node, ins):
    """ONNX GRU (gate order z, r, h; B = [Wb, Rb]; both linear_before_reset forms), forward direction."""
    X, W, R = ins[0], ins[1], ins[2]
    H = int(node.attrs.get("hidden_size", R.shape[-1]))
    _rnn_checks(node, ins, H, 3)
    B = ins[3] if len(ins) > 3 and ins[3] is not None else np.zeros((1, 6 * H), dtype=X.dtype)
    if len(ins) > 4 and ins[4] is not None:
        raise EvalError(node, "sequence_lens is not implemented")
    lbr = int(node.attrs.get("linear_before_reset", 0))
    seq, batch = X.shape[0], X.shape[1]
    h = ins[5][0] if len(ins) > 5 and ins[5] is not None else np.zeros((batch, H), dtype=X.dtype)
    Wz, Wr, Wh = (W[0, k * H:(k + 1) * H] for k in range(3))
    Rz, Rr, Rh = (R[0, k * H:(k + 1) * H] for k in range(3))
    Wbz, Wbr, Wbh, Rbz, Rbr, Rbh = (B[0, k * H:(k + 1) * H] for k in range(6))
    Y = np.zeros((seq, 1, batch, H), dtype=X.dtype)
    one = np.ones((), dtype=X.dtype)
    for t in range(seq):
        x = X[t]
        z = _sig(x @ Wz.T + h @ Rz.T + Wbz + Rbz)
        r = _sig(x @ Wr.T + h @ Rr.T + Wbr + Rbr)
        if lbr:
            n = np.tanh(x @ Wh.T + r * (h @ Rh.T + Rbh) + Wbh)
        else:
            n = np.tanh(x @ Wh.T + (r * h) @ Rh.T + Rbh + Wbh)
        h = (one - z) * n + z * h
        Y[t, 0] = h
    return [Y, h[None].astype(X.dtype)]


def eval_node(node: Node, ins: list, opset: int, max_bytes: int = MAX_TENSOR_BYTES) -> list:
    """Outputs of ``node`` for input arrays ``ins`` (None where an optional input is omitted).

    Raises :class:`TooLarge` before allocating when an output would take more than ``max_bytes``."""
    op = node.op
    try:
        plan = _planned(node, ins, opset)
        for shape, dtype in plan or ():
            _check_size(node, shape, dtype, max_bytes)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            outs = _eval(node, ins, opset, op)
    except EvalError:
        raise
    except (ValueError, IndexError, TypeError, OverflowError, ZeroDivisionError, KeyError) as e:
        shapes = [None if i is None else list(np.shape(i)) for i in ins]
        raise EvalError(node, f"cannot be evaluated on inputs shaped {shapes} ({e}): dimension mismatch") from None
    for v in outs:
        v = np.asarray(v)
        _check_size(node, v.shape, v.dtype, max_bytes)
    return outs


def _eval(node, ins, opset, op):
    a = node.attrs
    if op in UNARY:
        x = ins[0]
        return [np.asarray(UNARY[op](node, x)).astype(x.dtype, copy=False)]
    if op in BINARY:
        return [np.asarray(BINARY[op](ins[0], ins[1]))]
    if op == "Gemm":
        return [_gemm(node, ins[0], ins[1], ins[2] if len(ins) > 2 else None)]
    if op == "MatMul":
        x, w = ins
        if x.shape[-1] != (w.shape[0] if w.ndim == 1 else w.shape[-2]):
            raise EvalError(node, f"dimension mismatch: the input has {x.shape[-1]} values but the weight "
                            f"{list(w.shape)} takes {w.shape[0] if w.ndim == 1 else w.shape[-2]}")
        return [np.matmul(x, w)]
    if op == "Clip":
        x = ins[0]
        lo = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("min")
        hi = ins[2] if len(ins) > 2 and ins[2] is not None else a.get("max")
        out = x
        if lo is not None:
            out = np.maximum(out, np.asarray(lo, dtype=x.dtype))
        if hi is not None:
            out = np.minimum(out, np.asarray(hi, dtype=x.dtype))
        return [out]
    if op == "Flatten":
        x = ins[0]
        axis = a.get("axis", 1)
        axis = axis + x.ndim if axis < 0 else axis
        return [x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)]
    if op == "Reshape":
        return [_reshape(node, ins[0], ins[1])]
    if op == "Squeeze":
        x = ins[0]
        axes = _axes(node, ins, opset, x.ndim)
        return [np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))]
    if op == "Unsqueeze":
        x = ins[0]
        n_new = len(ins[1].reshape(-1)) if len(ins) > 1 and ins[1] is not None else len(a.get("axes", []))
        axes = _axes(node, ins, opset, x.ndim + n_new)
        out = x
        for ax in axes:
            out = np.expand_dims(out, ax)
        return [out]
    if op == "Cast":
        return [ins[0].astype(a["to"])]
    if op == "Expand":
        x = ins[0]
        shape = _broadcast(node, x.shape, [int(s) for s in np.asarray(ins[1]).reshape(-1)])
        return [np.array(np.broadcast_to(x, shape))]
    if op == "Tile":
        return [np.tile(ins[0], [int(r) for r in np.asarray(ins[1]).reshape(-1)])]
    if op == "Range":
        dt = np.asarray(ins[0]).dtype          # output[i] = start + i * delta (the operator definition)
        start, delta = (np.asarray(v, dtype=dt).reshape(-1)[0] for v in (ins[0], ins[2]))
        return [(start + np.arange(_range_len(node, ins), dtype=dt) * delta).astype(dt)]
    if op == "Split":
        return _split(node, ins, opset)
    if op == "Slice":
        return [_slice(node, ins)]
    if op == "Constant":
        return [_constant(node)]
    if op == "Shape":
        shape = np.asarray(ins[0].shape, dtype=np.int64)
        return [shape[a.get("start", 0):a.get("end", len(shape))]]
    if op == "ConstantOfShape":
        value = a.get("value", np.zeros(1, dtype=np.float32))
        return [np.full([int(s) for s in np.asarray(ins[0]).reshape(-1)], np.asarray(value).reshape(-1)[0],
                        dtype=np.asarray(value).dtype)]
    if op == "Gather":
        return [np.take(ins[0], ins[1].astype(np.int64), axis=a.get("axis", 0))]
    if op == "Concat":
        return [np.concatenate([i for i in ins if i is not None], axis=a["axis"])]
    if op == "Where":
        return [np.where(ins[0], ins[1], ins[2])]
    if op == "Transpose":
        perm = a.get("perm")
        return [np.transpose(ins[0], perm)]
    if op == "CastLike":
        return [ins[0].astype(ins[1].dtype)]
    if op == "LSTM":
        return _lstm(node, ins)
    if op == "GRU":
        return _gru(node, ins)
    raise EvalError(node, f"operator {op} is not supported")


OPS = frozenset(UNARY) | frozenset(BINARY) | {"Gemm", "MatMul", "Clip", "Flatten", "Reshape", "Squeeze", "Unsqueeze",
                                              "Cast", "Expand", "Split", "Slice", "Constant", "Shape",
                                              "ConstantOfShape", "Gather", "Concat", "Where", "Transpose",
                                              "CastLike", "LSTM", "GRU", "Tile", "Range"}


def run(nodes, values: dict, opset: int, max_bytes: int = MAX_TENSOR_BYTES) -> dict:
    """Evaluate ``nodes`` (topologically sorted) given ``values`` (name -> array: inputs, initializers).

    Returns a new dict with every node output added. Refuses (:class:`TooLarge`, before allocating) a node
    whose output would take more than ``max_bytes``, or that would bring everything the run holds above
    ``TOTAL_FACTOR * max_bytes``."""
    env = dict(values)
    total = sum(np.asarray(v).nbytes for v in env.values())
    budget = TOTAL_FACTOR * int(max_bytes)
    for node in nodes:
        ins = [env[i] if i else None for i in node.inputs]
        try:
            plan = _planned(node, ins, opset)
        except (ValueError, IndexError, TypeError, OverflowError, ZeroDivisionError, KeyError):
            plan = None                 # eval_node reports it
        for shape, dtype in plan or ():             # each output against the limit first (names its shape)
            _check_size(node, shape, dtype, max_bytes)
        if plan and node.op != "Reshape":          # a Reshape is a view: only its explicit dims are checked
            want = sum(_nbytes(s, d) for s, d in plan)
            if total + want > budget:
                raise TooLarge(node, f"its outputs ({fmt_bytes(want)}) would bring what the importer holds for this "
                               f"graph to {fmt_bytes(total + want)}, more than {TOTAL_FACTOR} x the limit of "
                               f"{fmt_bytes(max_bytes)} per tensor (max_resident_bytes); refused before allocating")
        outs = eval_node(node, ins, opset, max_bytes)
        for name, v in zip(node.outputs, outs):
            if name:
                env[name] = v = np.asarray(v)
                if v.base is None and not any(v is i for i in ins):      # views and pass-throughs hold nothing new
                    total += v.nbytes
        if total > budget:
            raise TooLarge(node, f"what the importer holds for this graph reached {fmt_bytes(total)}, more than "
                           f"{TOTAL_FACTOR} x the limit of {fmt_bytes(max_bytes)} per tensor (max_resident_bytes)")
    return env
