"""control-node bench recurrent: recurrent robot policies (one LSTM / GRU layer + MLP), the kernel against its peers.

Shapes (batch 1, random torch-initialised weights of the real sizes, float32):

* rsl_rl / IsaacLab recurrent actor: 48 observations -> LSTM(256) -> 256 -> 128 -> 12 ELU (legged_gym's
  ``rnn_hidden_size`` is 512 by default; 256 is what the IsaacLab recurrent configs use)
* Unitree G1 ``motion.pt`` (legged_gym PolicyExporterLSTM): 47 -> LSTM(64) -> 32 ELU -> 12
* (``--shape``) the same two with a GRU

Every call is one step: the state is carried from call to call by every row, as a robot runs it:

* kernel ``Policy.act_into(x, out)`` from Python (no allocation), and ``Policy.act(x)``
* kernel at C level: the nogil entry point in a C loop (``Policy._act_loop``), throughput and latency
* onnxruntime 1 intra-op thread, ORT_SEQUENTIAL, the rsl_rl / IsaacLab graph (obs, h_in, c_in -> actions,
  h_out, c_out): ``run_with_iobinding`` with two preallocated bindings used in turn (ping-pong: the call's
  h_out / c_out buffers are the next call's h_in / c_in, nothing copied), and plain ``InferenceSession.run``
  feeding the previous outputs back
* TorchScript: legged_gym's ``PolicyExporterLSTM`` form (state in buffers, updated in place), scripted, 1
  thread, ``inference_mode``

Every row is checked against the numpy reference (``reference_sequence``: 50 steps from the zero state)
before timing. Timing samples are ~100 us of back-to-back calls of one row, interleaved round-robin
between rows (helpers shared with ``bench policy``); the table gives p50 / p99 / p99.9 / max. Beside each
shape: its floor (FMAs and weight bytes of the two gate matrix-vector products and the dense layers, as
``bench policy`` computes it: measured on this core, and from the CPU's published figures where known). Run
it alone:
``flock /tmp/control-node-bench.lock control-node bench recurrent``.
"""
from __future__ import annotations

import argparse

import numpy as np

from control_node.bench.common import (LOCK_FILE, machine_info, weights_read_row, write_json)
from control_node.bench.policy import (allocations_per_call, c_level, compute_dtype_of, floor_from, floor_probe,
                                      per_call, report, shape_figures, storage_bytes, storage_floors, WIDENED,
                                      weight_storage_rows)

SHAPES = {
    "rsl_rl LSTM(48->256) + 256-128-12 ELU": dict(kind="lstm", n=48, H=256, dense=[128, 12]),
    "G1 LSTM(47->64) + 64-32-12 ELU": dict(kind="lstm", n=47, H=64, dense=[32, 12]),
    "rsl_rl GRU(48->256) + 256-128-12 ELU": dict(kind="gru", n=48, H=256, dense=[128, 12]),
    "G1-size GRU(47->64) + 64-32-12 ELU": dict(kind="gru", n=47, H=64, dense=[32, 12]),
}
DEFAULT_SHAPES = ("rsl_rl LSTM(48->256) + 256-128-12 ELU", "G1 LSTM(47->64) + 64-32-12 ELU")
GATES = {"lstm": 4, "gru": 3}
ONNX_PERM = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2)}     # ONNX gate block k = torch block ONNX_PERM[k]


def make_spec(cfg, dtype="float32", seed=0):
    from control_node.kernels import ModelSpec
    rng = np.random.default_rng(seed)
    n, H, G = cfg["n"], cfg["H"], GATES[cfg["kind"]]
    k = 1 / np.sqrt(H)                   # torch's LSTM / GRU initialisation
    sizes = [H] + cfg["dense"]
    layers = [(rng.normal(0, 1 / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b)) for a, b in zip(sizes[:-1], sizes[1:])]
    m = sizes[-1]
    return ModelSpec(layers=layers, mean=rng.normal(size=n), scale=rng.uniform(0.5, 2, n) + 0.01, classes=[],
                     feature_names=[f"x{i}" for i in range(n)], dtype=dtype,
                     activations=["elu"] * (len(layers) - 1) + ["identity"], head="continuous",
                     action_names=[f"j{i}" for i in range(m)], recurrent=cfg["kind"],
                     rnn_W_ih=rng.uniform(-k, k, (G * H, n)), rnn_W_hh=rng.uniform(-k, k, (G * H, H)),
                     rnn_b_ih=rng.uniform(-k, k, G * H), rnn_b_hh=rng.uniform(-k, k, G * H))


# ---- the peers ---------------------------------------------------------------------------
def onnx_model(spec):
    """The policy as rsl_rl / IsaacLab export it: Sub, Div, Unsqueeze, LSTM / GRU (ONNX gate order), Squeeze,
    Gemm (transB=1) + Elu; inputs obs, h_in [, c_in], outputs actions, h_out [, c_out]."""
    from onnx import TensorProto, helper, numpy_helper
    kind, H, n = spec.recurrent, spec.hidden_size, spec.n_features
    lstm = kind == "lstm"

    def onnx_order(M):
        return np.concatenate([M[p * H:(p + 1) * H] for p in ONNX_PERM[kind]], axis=0)
    f32 = np.float32
    inits = [numpy_helper.from_array(spec.mean.astype(f32).reshape(1, -1), "mean"),
             numpy_helper.from_array(spec.scale.astype(f32).reshape(1, -1), "std"),
             numpy_helper.from_array(onnx_order(spec.rnn_W_ih).astype(f32)[None], "W"),
             numpy_helper.from_array(onnx_order(spec.rnn_W_hh).astype(f32)[None], "R"),
             numpy_helper.from_array(np.concatenate([onnx_order(spec.rnn_b_ih), onnx_order(spec.rnn_b_hh)])
                                     .astype(f32)[None], "B"),
             numpy_helper.from_array(np.array([0], dtype=np.int64), "ax0"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "ax1")]
    state_in = ["h_in", "c_in"] if lstm else ["h_in"]
    state_out = ["h_out", "c_out"] if lstm else ["h_out"]
    attrs = {"hidden_size": H} if lstm else {"hidden_size": H, "linear_before_reset": 1}
    nodes = [helper.make_node("Sub", ["obs", "mean"], ["c"]), helper.make_node("Div", ["c", "std"], ["z"]),
             helper.make_node("Unsqueeze", ["z", "ax0"], ["zs"]),
             helper.make_node(kind.upper(), ["zs", "W", "R", "B", ""] + state_in, ["Y"] + state_out, **attrs),
             helper.make_node("Squeeze", ["Y", "ax1"], ["Y1"]), helper.make_node("Squeeze", ["Y1", "ax0"], ["h0"])]
    h = "h0"
    for i, ((W, b), act) in enumerate(zip(spec.layers, spec.activations)):
        inits += [numpy_helper.from_array(np.ascontiguousarray(W.T).astype(f32), f"W{i}"),
                  numpy_helper.from_array(b.astype(f32), f"b{i}")]
        last = i == len(spec.layers) - 1
        out = "actions" if last and act == "identity" else f"g{i}"
        nodes.append(helper.make_node("Gemm", [h, f"W{i}", f"b{i}"], [out], transB=1))
        h = out
        if act != "identity":
            nodes.append(helper.make_node("Elu", [h], [f"a{i}"]))
            h = f"a{i}"
    T = TensorProto.FLOAT
    g = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("obs", T, [1, n])] +
                          [helper.make_tensor_value_info(s, T, [1, 1, H]) for s in state_in],
                          [helper.make_tensor_value_info("actions", T, [1, spec.layer_sizes[-1]])] +
                          [helper.make_tensor_value_info(s, T, [1, 1, H]) for s in state_out], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def onnxruntime_rows(spec):
    """(rows, reset): IOBinding ping-pong and plain run(), each carrying its own state."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(onnx_model(spec).SerializeToString(), so, providers=["CPUExecutionProvider"])
    lstm = spec.recurrent == "lstm"
    H, m = spec.hidden_size, spec.layer_sizes[-1]
    names_in = ["h_in", "c_in"] if lstm else ["h_in"]
    names_out = ["h_out", "c_out"] if lstm else ["h_out"]
    xin = np.zeros((1, spec.n_features), dtype=np.float32)
    out = np.zeros((1, m), dtype=np.float32)
    bufs = [[np.zeros((1, 1, H), dtype=np.float32) for _ in names_in] for _ in range(2)]   # state A, state B
    bindings = []
    for src, dst in ((0, 1), (1, 0)):         # call k reads state k % 2 and writes the other
        io = sess.io_binding()
        io.bind_ortvalue_input("obs", ort.OrtValue.ortvalue_from_numpy(xin))
        for nm, buf in zip(names_in, bufs[src]):
            io.bind_ortvalue_input(nm, ort.OrtValue.ortvalue_from_numpy(buf))
        io.bind_ortvalue_output("actions", ort.OrtValue.ortvalue_from_numpy(out))
        for nm, buf in zip(names_out, bufs[dst]):
            io.bind_ortvalue_output(nm, ort.OrtValue.ortvalue_from_numpy(buf))
        bindings.append(io)
    turn = [0]
    run_io, run = sess.run_with_iobinding, sess.run
    io0, io1 = bindings

    def iobinding(xv):
        xin[0] = xv
        run_io(io1 if turn[0] else io0)
        turn[0] ^= 1
        return out[0]
    state = {nm: np.zeros((1, 1, H), dtype=np.float32) for nm in names_in}
    fetch = ["actions"] + names_out

    def plain(xv):
        res = run(fetch, {"obs": xv.astype(np.float32).reshape(1, -1), **state})
        for nm, v in zip(names_in, res[1:]):
            state[nm] = v
        return res[0][0]

    def reset():
        for pair in bufs:
            for b in pair:
                b[:] = 0
        turn[0] = 0
        for nm in state:
            state[nm] = np.zeros((1, 1, H), dtype=np.float32)
    return [(f"onnxruntime {ort.__version__} IOBinding ping-pong, 1 thread", iobinding),
            (f"onnxruntime {ort.__version__} run(), state fed back, 1 thread", plain)], reset


def torchscript_row(spec):
    """legged_gym's PolicyExporterLSTM form (GRU: rsl-rl-lib's _TorchGRUModel form), with the normaliser."""
    import torch
    torch.set_num_threads(1)
    lstm = spec.recurrent == "lstm"
    H = spec.hidden_size
    rnn = (torch.nn.LSTM if lstm else torch.nn.GRU)(spec.n_features, H)
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(torch.from_numpy(spec.rnn_W_ih.astype(np.float32)))
        rnn.weight_hh_l0.copy_(torch.from_numpy(spec.rnn_W_hh.astype(np.float32)))
        rnn.bias_ih_l0.copy_(torch.from_numpy(spec.rnn_b_ih.astype(np.float32)))
        rnn.bias_hh_l0.copy_(torch.from_numpy(spec.rnn_b_hh.astype(np.float32)))
    mods = []
    for (W, b), act in zip(spec.layers, spec.activations):
        lin = torch.nn.Linear(W.shape[0], W.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(W.T).astype(np.float32)))
            lin.bias.copy_(torch.from_numpy(b.astype(np.float32)))
        mods.append(lin)
        if act != "identity":
            mods.append(torch.nn.ELU())

    class ExporterLSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.memory = rnn
            self.actor = torch.nn.Sequential(*mods)
            self.register_buffer("mean", torch.from_numpy(spec.mean.astype(np.float32)))
            self.register_buffer("std", torch.from_numpy(spec.scale.astype(np.float32)))
            self.register_buffer("hidden_state", torch.zeros(1, 1, H))
            self.register_buffer("cell_state", torch.zeros(1, 1, H))

        def forward(self, x):
            out, (h, c) = self.memory(((x - self.mean) / self.std).unsqueeze(0), (self.hidden_state, self.cell_state))
            self.hidden_state[:] = h
            self.cell_state[:] = c
            return self.actor(out.squeeze(0))

    class ExporterGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.memory = rnn
            self.actor = torch.nn.Sequential(*mods)
            self.register_buffer("mean", torch.from_numpy(spec.mean.astype(np.float32)))
            self.register_buffer("std", torch.from_numpy(spec.scale.astype(np.float32)))
            self.register_buffer("hidden_state", torch.zeros(1, 1, H))

        def forward(self, x):
            out, h = self.memory(((x - self.mean) / self.std).unsqueeze(0), self.hidden_state)
            self.hidden_state[:] = h
            return self.actor(out.squeeze(0))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        net = torch.jit.script((ExporterLSTM if lstm else ExporterGRU)().eval())
    from_numpy = torch.from_numpy

    def f(xv):
        with torch.inference_mode():
            return net(from_numpy(xv.astype(np.float32)).reshape(1, -1)).numpy()[0]

    def reset():
        with torch.no_grad():
            net.hidden_state.zero_()
            if lstm:
                net.cell_state.zero_()
    return (f"TorchScript {torch.__version__} (state in buffers), 1 thread, inference_mode", f), reset


# ---- floors and measurement ---------------------------------------------------------------------------
def _fmas(spec):
    G, H, n = GATES[spec.recurrent], spec.hidden_size, spec.n_features
    sizes = spec.dense_sizes
    return G * H * (n + H) + sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


def weight_bytes_of(spec, storage=None):
    """Bytes of the gate matrices, both gate biases and the dense layers (unpadded), the weights stored as
    ``storage`` (default: the spec's dtype; float16 / bfloat16 / int8 or an itemsize: ``storage_bytes``)."""
    G, H = GATES[spec.recurrent], spec.hidden_size
    channels = 2 * G * H + sum(spec.dense_sizes[1:])
    return storage_bytes(_fmas(spec), channels, storage or spec.dtype, compute_dtype_of(spec.dtype))


def floor_of(spec, storage=None):
    """(compute floor ns, memory floor ns, cache level, explanation) for one step: the gate products
    G*H*(n + H) FMAs and the dense layers' (bench policy's ``floor_from``: measured here, and published where
    the CPU family is known), the weights stored as ``storage`` (default: the spec's dtype)."""
    return floor_from(_fmas(spec), weight_bytes_of(spec, storage), spec.dtype, storage=WIDENED.get(storage))


def check_rows(name, spec, rows, resets, n_steps=50):
    """Each row over the same n_steps-step sequence from the zero state against the numpy reference."""
    from control_node.kernels.reference import RTOL, random_inputs, reference_sequence
    X = random_inputs(spec, n_steps, seed=11)
    want, _ = reference_sequence(spec, X)
    tol = max(RTOL[spec.dtype], RTOL["float32"]) * max(1.0, float(np.abs(want).max())) * 10
    for (rname, fn), reset in zip(rows, resets):
        reset()
        got = np.array([np.array(fn(np.ascontiguousarray(x)), dtype=np.float64).ravel() for x in X])
        reset()
        if not np.allclose(got, want, rtol=0, atol=tol):
            step = int(np.flatnonzero(~np.isclose(got, want, rtol=0, atol=tol).all(axis=1))[0])
            raise SystemExit(f"bench recurrent: {rname} on {name} answers {got[step, :4]}... at step {step}, the "
                             f"reference {want[step, :4]}...")


def bench_shape(name, cfg, dtype, settings, log):
    from control_node.kernels import Policy
    from control_node.kernels.reference import random_inputs
    spec = make_spec(cfg, dtype)
    policy = Policy(spec)
    x = np.ascontiguousarray(random_inputs(spec, 1, seed=7)[0])
    out = np.zeros(policy.n_actions)
    act_into = policy.act_into

    def kernel_act_into(xv):
        act_into(xv, out)
        return out
    rows = [("kernel Policy.act_into(x, out)", kernel_act_into), ("kernel Policy.act(x)", policy.act)]
    resets = [policy.reset, policy.reset]
    skipped = {}
    def torch_rows():
        row, reset = torchscript_row(spec)
        return [row], reset
    for peer, make in (("onnxruntime", lambda: onnxruntime_rows(spec)), ("torch", torch_rows)):
        try:
            more, reset = make()
            rows += more
            resets += [reset] * len(more)
        except ImportError as e:
            skipped[peer] = f"not importable ({e.name or e})"
        except Exception as e:       # say so, keep the others
            skipped[peer] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    check_rows(name, spec, rows, resets)
    storage_rows, storage_errors = weight_storage_rows(spec, x)     # f16 / bf16 / int8, their errors measured
    log(f"{name} {dtype}: {len(rows) + len(storage_rows) + 1} rows x {settings['samples']} samples ...")
    times = per_call([(name, fn, x) for name, fn in rows] + storage_rows + [weights_read_row(weight_bytes_of(spec))],
                     settings["samples"])
    times.update(c_level(policy, spec, settings["chunks"], settings["chunk"]))
    alloc, peak = allocations_per_call(policy, x, n=settings["alloc_calls"])
    policy.reset()
    return {"shape": name, "dtype": dtype, "recurrent": cfg["kind"], "n_features": cfg["n"], "hidden_size": cfg["H"],
            "dense": cfg["dense"], "isa": policy.isa, "weight_storage_errors": storage_errors,
            **shape_figures(times, floor_of(spec), alloc, peak, skipped,
                            storage_floors(storage_errors, lambda w: floor_of(spec, storage=w)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench recurrent", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=400,
                    help="timing samples per row, each ~100 us of back-to-back calls (default: %(default)s)")
    ap.add_argument("--chunks", type=int, default=400, help="C-level timing chunks (default: %(default)s)")
    ap.add_argument("--chunk", type=int, default=1000, help="calls per C-level chunk (default: %(default)s)")
    ap.add_argument("--alloc-calls", type=int, default=100_000,
                    help="act_into calls traced for allocations (default: %(default)s)")
    ap.add_argument("--shape", action="append", choices=list(SHAPES),
                    help=f"only these shapes (repeatable; default: {', '.join(DEFAULT_SHAPES)})")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="kernel compute dtype (the peers run float32: onnxruntime has no float64 LSTM / GRU)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    settings = {"samples": a.samples, "chunks": a.chunks, "chunk": a.chunk, "alloc_calls": a.alloc_calls}
    res = {"machine": machine_info(), "settings": settings, "lock_file": LOCK_FILE, "floor_probe": floor_probe(),
           "shapes": []}
    for name in a.shape or DEFAULT_SHAPES:
        res["shapes"].append(bench_shape(name, SHAPES[name], a.dtype, settings, lambda m: print(m, flush=True)))
    report(res, first_column="row (state carried)")
    if a.json:
        write_json(a.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
