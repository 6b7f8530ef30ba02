"""control-node bench policy: the continuous policies robots run, the kernel against its peers in one run.

Shapes (batch 1, random weights of the real sizes, float32 and float64 where it applies):

* rsl_rl / IsaacLab actor 48 -> 512 -> 256 -> 128 -> 12 ELU, with the (x - mean) / (std + eps) normaliser
* Unitree G1 velocity policy 480 -> 512 -> 256 -> 128 -> 29 ELU (5 stacked frames of 96)
* stable-baselines3 PPO 3 -> 64 -> 64 -> 1 tanh
* stable-baselines3 SAC actor 3 -> 256 -> 256 -> 1 ReLU, tanh-squashed

Rows per shape, interleaved call by call (A B C A B C ...) so that drift and host stalls hit all alike:

* kernel ``Policy.act_into(x, out)`` and ``Policy.act_bound(out)`` (input registered with ``bind_input``) from
  Python, no allocation, called directly (no Python wrapper); and ``Policy.act(x)`` (allocates its result)
* kernel at C level: the nogil entry point in a C loop (``Policy._act_loop``), throughput and latency
* onnxruntime 1 intra-op thread, ORT_SEQUENTIAL: ``run_with_iobinding`` on preallocated input/output
  OrtValues (the fastest call form found), and plain ``InferenceSession.run``
* TorchScript (``torch.jit.script``), 1 thread, ``inference_mode``
* numpy: the expression with preallocated ``out=`` buffers

Every row is checked against the numpy reference before timing. Each timing sample is ~100 us of
back-to-back calls of one row (its per-call mean), samples interleaved round-robin between the rows;
the table gives p50 / p99 / p99.9 / max over the samples. C-level rows: means over chunks of calls. Beside
each shape: its floor, compute (FMAs / the multiply-add rate) and memory (weight bytes / the read rate of the
cache level the weights fit in), measured on this core at the start of the run (a timed read of a buffer
sized to each cache level and DRAM, a timed FMA loop at the kernels' vector width: bench/floor.py) and, for
a CPU family with published figures, from those too as a cross-check (sources in FLOORS).
Run it alone: ``flock /tmp/control-node-bench.lock control-node bench policy``.
"""
from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from control_node.bench.common import (LOCK_FILE, console, fmt_ns, machine_info, machine_lines, print_table,
                                      weights_read_row, write_json)
from control_node.bench.floor import (FloorProbeError, cache_sizes, clock_hz, floor_measured, measure,
                                     summary_lines)
from control_node.kernels.weights import DEFAULT_TOLERANCE

SHAPES = {
    "rsl_rl 48-512-256-128-12 ELU + normaliser": dict(sizes=[48, 512, 256, 128, 12], act="elu", norm=True,
                                                       squash=False, dtypes=("float32", "float64")),
    "G1 480-512-256-128-29 ELU": dict(sizes=[480, 512, 256, 128, 29], act="elu", norm=True, squash=False,
                                      dtypes=("float32",)),
    "SB3 PPO 3-64-64-1 tanh": dict(sizes=[3, 64, 64, 1], act="tanh", norm=False, squash=False,
                                   dtypes=("float32", "float64")),
    "SB3 SAC 3-256-256-1 ReLU + tanh squash": dict(sizes=[3, 256, 256, 1], act="relu", norm=False, squash=True,
                                                   dtypes=("float32", "float64")),
    # 6.5 MB of float32 weights: beyond the L2 of every machine kind so far (512 KiB - 2 MiB), where narrower
    # storage is expected to pay (issue #24: f16 <= 0.6x, int8 <= 0.4x the float32 step there)
    "wide 48-1024-1024-512-12 ELU (beyond L2)": dict(sizes=[48, 1024, 1024, 512, 12], act="elu", norm=True,
                                                     squash=False, dtypes=("float32",)),
}

#: per CPU family: FMA units, vector bytes, and load bandwidth per cycle from L1 / L2 / L3 (bytes),
#: from the vendors' optimisation manuals
FLOORS = {
    "AMD Zen 3": dict(fma_units=2, vector_bytes=32, bw={"L1": 64, "L2": 32, "L3": 32},
                      source="AMD Software Optimization Guide for AMD Family 19h Processors (pub. 56665): "
                             "2 FMA pipes of 256 bits; 2 x 32-byte loads per cycle from L1, 32 B/cycle L2 and L3 fills"),
    "AMD Zen 5": dict(fma_units=2, vector_bytes=64, bw={"L1": 128, "L2": 64, "L3": 32},
                      source="AMD, Next Generation 'Zen 5' Core (Hot Chips 2024) and Software Optimization Guide "
                             "for the AMD Zen5 Microarchitecture (pub. 58455): 512-bit FP datapath with 2 FMA "
                             "pipes; 2 x 64-byte vector loads per cycle from L1, 64 B/cycle L2 fill, 32 B/cycle "
                             "from L3"),
    "Intel Ice Lake-SP": dict(fma_units=2, vector_bytes=64, bw={"L1": 128, "L2": 64, "L3": 16},
                              source="Intel 64 and IA-32 Architectures Optimization Reference Manual (Ice Lake "
                                     "server): 2 x 512-bit FMA, 2 x 64-byte loads/cycle L1, 64 B/cycle L2; "
                                     "L3 ~16 B/cycle/core sustained"),
}


def cpu_family() -> str | None:
    vendor = family = model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k, v = k.strip(), v.strip()
                if k == "vendor_id":
                    vendor = v
                elif k == "cpu family":
                    family = int(v)
                elif k == "model" and model is None:
                    model = int(v)
                if vendor and family is not None and model is not None:
                    break
    except OSError:
        return None
    if vendor == "AuthenticAMD" and family == 25 and model is not None and model < 0x10:
        return "AMD Zen 3"
    if vendor == "AuthenticAMD" and family == 26:
        return "AMD Zen 5"
    if vendor == "GenuineIntel" and family == 6 and model in (106, 108):
        return "Intel Ice Lake-SP"
    return None


#: bytes per stored weight by storage name (bfloat16 is no numpy dtype)
STORAGE_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
DETECT = "detect"       # floor_from's default family: this CPU's (cpu_family())


def itemsize_of(dtype) -> int:
    """Bytes per stored weight: an itemsize (1, 2, 4 or 8) or a storage name (STORAGE_ITEMSIZE) or numpy dtype."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) not in (1, 2, 4, 8):
            raise ValueError(f"weight itemsize: {dtype} is not 1, 2, 4 or 8 bytes")
        return int(dtype)
    name = dtype
    if not isinstance(dtype, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name in STORAGE_ITEMSIZE:
        return STORAGE_ITEMSIZE[name]
    raise ValueError(f"weight dtype: {dtype!r} is not one of {', '.join(STORAGE_ITEMSIZE)} (or an itemsize)")


def compute_dtype_of(dtype) -> str:
    """The dtype a pass computes in: float64 for float64 weights, float32 for everything narrower (16-bit and
    int8 weights are widened to float32 in registers)."""
    return "float64" if itemsize_of(dtype) == 8 else "float32"


def storage_bytes(matrix_values: int, channels: int, dtype, compute_dtype=None) -> int:
    """Bytes of ``matrix_values`` weights and ``channels`` output channels' biases stored as ``dtype`` (an
    itemsize or a name). Storage narrower than the compute dtype (default: ``compute_dtype_of(dtype)``) is
    weight storage only: biases stay at the compute size, and int8 adds one float32 scale per channel."""
    s = itemsize_of(dtype)
    c = itemsize_of(compute_dtype or compute_dtype_of(dtype))
    if s >= c:
        return (matrix_values + channels) * s
    return matrix_values * s + channels * c + (channels * 4 if s == 1 else 0)


def weight_bytes_of(sizes, dtype, compute_dtype=None):
    """Bytes of the dense weights and biases (unpadded) stored as ``dtype``: float64 / float32 / float16 /
    bfloat16 / int8 or an itemsize (``storage_bytes``)."""
    return storage_bytes(sum(a * b for a, b in zip(sizes[:-1], sizes[1:])), sum(sizes[1:]), dtype, compute_dtype)




STORAGE_DTYPE = {"f16": "float16", "bf16": "bfloat16", "int8": "int8"}    # weight_bytes_of's names
#: weight_bytes_of's storage names -> the kernels' (kernels/weights.py), for the floor probe's widening rates
WIDENED = {v: k for k, v in STORAGE_DTYPE.items()}


def floor_of(sizes, dtype, storage=None):
    """(compute floor ns, memory floor ns, cache level, explanation) for one forward pass computing in ``dtype``
    with weights stored as ``storage`` (default: ``dtype``); see ``floor_from``."""
    return floor_from(sum(a * b for a, b in zip(sizes[:-1], sizes[1:])),
                      weight_bytes_of(sizes, storage or dtype, compute_dtype_of(dtype)), dtype,
                      storage=WIDENED.get(storage))


class Floor(tuple):
    """``floor_from``'s answer, the tuple (compute ns, memory ns, cache level, explanation); ``detail`` holds
    both floors: {used: "measured" | "published" | None, family, measured, published} (each {compute, memory,
    cache_level, how} or None)."""

    def __new__(cls, used: dict | None, detail: dict):
        self = super().__new__(cls, (used["compute"], used["memory"], used["cache_level"], used["how"]) if used
                               else (None, None, None, detail["how"]))
        self.detail = detail
        return self


def _published(fam, fmas, weight_bytes, dtype, ghz=None) -> dict:
    """The family's published figures at ``ghz``: the clock the probe measured (a guest's /proc/cpuinfo states
    the nominal clock, 2.60 GHz on the Zen 5 kind whose core ran at 3.76-4.01 GHz, which made "p50 / published
    floor" read 1.09x where the measured floor gave 1.53x); the nominal clock only when nothing was measured."""
    f = FLOORS[fam]
    if ghz:
        hz, clock = ghz * 1e9, f"{ghz:.2f} GHz (measured clock)"
    else:
        hz = clock_hz()
        clock = f"{hz / 1e9:.2f} GHz (nominal clock from /proc/cpuinfo: no clock measured)"
    lanes = f["vector_bytes"] // np.dtype(dtype).itemsize
    compute = fmas / (f["fma_units"] * lanes * hz) * 1e9
    caches = cache_sizes()
    level = next((lv for lv in ("L1", "L2", "L3") if weight_bytes <= caches.get(lv, 0)), "L3")
    memory = weight_bytes / (f["bw"][level] * hz) * 1e9
    return {"compute": compute, "memory": memory, "cache_level": level,
            "how": (f"{fam} at {clock}: {fmas} FMAs / ({f['fma_units']} x {lanes} lanes); "
                    f"{weight_bytes / 1024:.0f} KiB of weights from {level} at {f['bw'][level]} B/cycle. "
                    f"Source: {f['source']}")}


def floor_probe():
    """This process's floor measurement (``bench/floor.py``: measured once, reused by every ``floor_from``),
    or why it could not run."""
    try:
        return measure()
    except FloorProbeError as e:
        return str(e)


def floor_from(fmas, weight_bytes, dtype, family=DETECT, storage=None):
    """(compute floor ns, memory floor ns, cache level, explanation) of a pass of ``fmas`` multiply-adds over
    ``weight_bytes`` of weights (whatever their storage: the caller counts the bytes), computing in ``dtype``
    (16-bit and int8 storage names compute in float32).

    Both floors are computed: measured on this core (bench/floor.py, once per process) and, for a CPU family
    in FLOORS, from its published figures at the measured clock (a cross-check). The tuple is the measured
    one, on every CPU; the published one only when the probe could not run (then at the nominal clock, and
    the explanation says so). ``.detail`` (a ``Floor``) holds both. ``family``: the family whose figures to
    look up (default: this CPU's, ``cpu_family()``; None: an unknown CPU). ``storage`` (f16 / bf16 / int8): the
    measured compute floor is the probe's widening rate for it (``floor_measured``)."""
    fam = cpu_family() if family == DETECT else family
    cdt = compute_dtype_of(dtype)
    ghz = None
    try:
        measured = floor_measured(fmas, weight_bytes, cdt, storage=storage)
        ghz = measure()["clock"]["ghz"]
    except FloorProbeError as e:
        measured = None
        why_not = str(e)
    published = _published(fam, fmas, weight_bytes, cdt, ghz) if fam in FLOORS else None
    unknown = f"{fam or 'unknown CPU'}: no published figures"
    if measured:
        here = (f"compute {fmt_ns(measured['compute'])}, memory {fmt_ns(measured['memory'])} "
                f"({measured['cache_level']}): {measured['how']}")
    if measured and published:
        used, which = measured, "measured"
        how = (f"measured here: {here}; published: compute {fmt_ns(published['compute'])}, memory "
               f"{fmt_ns(published['memory'])} ({published['cache_level']}): {published['how']}")
    elif published:
        used, which = published, "published"
        how = f"published: {published['how']}; not measured: {why_not}"
    elif measured:
        used, which = measured, "measured"
        how = f"measured here ({unknown}): {here}"
    else:
        used, which = None, None
        how = f"{unknown} ({fmas} FMAs, {weight_bytes} weight bytes); not measured: {why_not}"
    detail = {"used": which, "family": fam, "measured": measured, "published": published, "how": how}
    return Floor(dict(used, how=how) if used else None, detail)


def make_spec(cfg, dtype, seed=0):
    from control_node.kernels import ModelSpec
    rng = np.random.default_rng(seed)
    sizes = cfg["sizes"]
    layers = [(rng.normal(0, 1 / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b)) for a, b in zip(sizes[:-1], sizes[1:])]
    n, m = sizes[0], sizes[-1]
    acts = [cfg["act"]] * (len(layers) - 1) + ["identity"]
    return ModelSpec(layers=layers, mean=rng.normal(size=n) if cfg["norm"] else 0.0,
                     scale=rng.uniform(0.5, 2, n) + 0.01 if cfg["norm"] else 1.0, classes=[],
                     feature_names=[f"x{i}" for i in range(n)], dtype=dtype, activations=acts, head="continuous",
                     squash=cfg["squash"], action_offset=rng.normal(size=m) * 0.1, action_scale=0.25,
                     action_names=[f"j{i}" for i in range(m)])


# ---- the peers ---------------------------------------------------------------------------
ONNX_ACT = {"elu": "Elu", "tanh": "Tanh", "relu": "Relu"}


def onnx_model(spec):
    """The policy as the exporters write it: Sub, Div normaliser, Gemm (transB=1) + activation, head."""
    from onnx import TensorProto, helper, numpy_helper
    dt = np.dtype(spec.dtype)
    tp = TensorProto.FLOAT if dt == np.float32 else TensorProto.DOUBLE
    inits = [numpy_helper.from_array(spec.mean.astype(dt).reshape(1, -1), "mean"),
             numpy_helper.from_array(spec.scale.astype(dt).reshape(1, -1), "std")]
    nodes = [helper.make_node("Sub", ["obs", "mean"], ["c"]), helper.make_node("Div", ["c", "std"], ["h0"])]
    h = "h0"
    for i, ((W, b), act) in enumerate(zip(spec.layers, spec.activations)):
        inits += [numpy_helper.from_array(np.ascontiguousarray(W.T), f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Gemm", [h, f"W{i}", f"b{i}"], [f"g{i}"], transB=1))
        h = f"g{i}"
        if act != "identity":
            nodes.append(helper.make_node(ONNX_ACT[act], [h], [f"a{i}"]))
            h = f"a{i}"
    if spec.squash:
        nodes.append(helper.make_node("Tanh", [h], ["t"]))
        h = "t"
    inits += [numpy_helper.from_array(spec.action_scale.astype(dt).reshape(1, -1), "ascale"),
              numpy_helper.from_array(spec.action_offset.astype(dt).reshape(1, -1), "aoff")]
    nodes += [helper.make_node("Mul", [h, "ascale"], ["s"]), helper.make_node("Add", ["s", "aoff"], ["actions"])]
    n, m = spec.layer_sizes[0], spec.layer_sizes[-1]
    g = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("obs", tp, [1, n])],
                          [helper.make_tensor_value_info("actions", tp, [1, m])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def onnxruntime_rows(spec, x):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(onnx_model(spec).SerializeToString(), so, providers=["CPUExecutionProvider"])
    dt = np.dtype(spec.dtype)
    xin = np.zeros((1, len(x)), dtype=dt)
    out = np.zeros((1, spec.layer_sizes[-1]), dtype=dt)
    io = sess.io_binding()
    io.bind_ortvalue_input("obs", ort.OrtValue.ortvalue_from_numpy(xin))
    io.bind_ortvalue_output("actions", ort.OrtValue.ortvalue_from_numpy(out))
    run_io, run = sess.run_with_iobinding, sess.run

    def iobinding(xv):
        xin[0] = xv
        run_io(io)
        return out[0]

    def plain(xv):
        return run(None, {"obs": xv.astype(dt).reshape(1, -1)})[0][0]
    return [(f"onnxruntime {ort.__version__} IOBinding, 1 thread", iobinding),
            (f"onnxruntime {ort.__version__} run(), 1 thread", plain)]


def torchscript_row(spec):
    import torch
    torch.set_num_threads(1)
    dt = torch.float32 if spec.dtype == "float32" else torch.float64
    mods = []
    acts = {"elu": torch.nn.ELU, "tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}
    for (W, b), act in zip(spec.layers, spec.activations):
        lin = torch.nn.Linear(W.shape[0], W.shape[1]).to(dt)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(W.T)))
            lin.bias.copy_(torch.from_numpy(b))
        mods.append(lin)
        if act != "identity":
            mods.append(acts[act]())

    class Actor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(*mods)
            self.register_buffer("mean", torch.from_numpy(spec.mean.astype(spec.dtype)))
            self.register_buffer("std", torch.from_numpy(spec.scale.astype(spec.dtype)))
            self.register_buffer("aoff", torch.from_numpy(spec.action_offset.astype(spec.dtype)))
            self.register_buffer("ascale", torch.from_numpy(spec.action_scale.astype(spec.dtype)))
            self.squash = spec.squash

        def forward(self, x):
            a = self.net((x - self.mean) / self.std)
            if self.squash:
                a = torch.tanh(a)
            return self.aoff + self.ascale * a

    net = torch.jit.freeze(torch.jit.script(Actor().eval()))
    from_numpy = torch.from_numpy
    npdt = np.dtype(spec.dtype)

    def f(xv):
        with torch.inference_mode():
            return net(from_numpy(xv.astype(npdt))).numpy()
    return (f"TorchScript {torch.__version__}, 1 thread, inference_mode", f)


def numpy_row(spec):
    """The forward pass with every temporary preallocated (``out=``)."""
    from control_node.kernels.reference import activate
    dt = np.dtype(spec.dtype)
    mean, scale = spec.mean, spec.scale
    z64, z = np.empty(len(mean)), np.empty(len(mean), dtype=dt)
    bufs = [np.empty(W.shape[1], dtype=dt) for W, _ in spec.layers]
    steps = list(zip(spec.layers, spec.activations, spec.alphas, bufs))
    u = np.empty(spec.layer_sizes[-1])
    off, sc, squash = spec.action_offset, spec.action_scale, spec.squash

    def f(xv):
        np.subtract(xv, mean, out=z64)
        np.divide(z64, scale, out=z64)
        z[:] = z64
        h = z
        for (W, b), act, alpha, o in steps:
            np.matmul(h, W, out=o)
            np.add(o, b, out=o)
            h = activate(act, o, alpha) if act != "identity" else o
        a = np.tanh(h) if squash else h
        np.multiply(a, sc, out=u)
        np.add(u, off, out=u)
        return u
    return ("numpy, out= buffers", f)


# ---- measurement ---------------------------------------------------------------------------
def per_call(rows, n_samples, target_s=100e-6, per_row=False):
    """Each row ``(name, fn, arg)`` timed as ``fn(arg)`` in samples of k calls (k sized so a sample lasts
    ~``target_s``), samples interleaved round-robin (A B C A B C ...), or ``per_row`` (all of A's, then B's:
    for shapes whose rows' weights together exceed L2, see common.time_round_robin), each sample after one
    untimed call of the same row (its weights warm, as in a loop that runs it every cycle); returns name -> ns
    per call."""
    from control_node.bench.common import calibrate, loop_calls, time_round_robin
    bodies, warm = {}, {}
    for name, fn, arg in rows:
        k = calibrate(fn, arg, target_s, max_calls=2000)
        bodies[name] = (loop_calls(fn, arg, k), k)
        warm[name] = loop_calls(fn, arg, 1)
    return time_round_robin(bodies, n_samples, warm, per_row=per_row)


def c_level(policy, spec, n_chunks, chunk):
    """Per-call ns at C level over ``n_chunks`` chunks of ``chunk`` calls: independent inputs (throughput) and
    each input fed by the last answer (latency). A recurrent state starts from zero and is zeroed after."""
    from control_node.kernels.reference import random_inputs
    X = random_inputs(spec, 64, seed=3)
    res = {}
    for label, chained in (("kernel C level, throughput", False), ("kernel C level, latency (dependent)", True)):
        policy.reset()
        policy._act_loop(X, 1000, chained)
        t = np.empty(n_chunks)
        for i in range(n_chunks):
            t0 = time.perf_counter_ns()
            policy._act_loop(X, chunk, chained)
            t[i] = (time.perf_counter_ns() - t0) / chunk
        res[label] = t
    policy.reset()
    return res


def allocations_per_call(policy, x, n=100_000):
    out = np.zeros(policy.n_actions)
    for _ in range(1000):
        policy.act_into(x, out)
    tracemalloc.start()
    a0 = tracemalloc.get_traced_memory()[0]
    for _ in range(n):
        policy.act_into(x, out)
    a1, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return (a1 - a0) / n, peak - a0


def pct(a):
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "p999": float(np.percentile(a, 99.9)), "max": float(a.max()), "n": int(a.size)}


def bench_shape(name, cfg, dtype, settings, log):
    from control_node.kernels import Policy
    from control_node.kernels.reference import RTOL, random_inputs, reference_act
    spec = make_spec(cfg, dtype)
    policy = Policy(spec)
    x = np.ascontiguousarray(random_inputs(spec, 1, seed=7)[0])
    want = reference_act(spec, x[None, :])[0]
    out = np.zeros(policy.n_actions)
    import functools
    xb = x.copy()
    policy.bind_input(xb)
    # (name, callable, argument): each row is called as fn(arg), with no Python wrapper around the kernel
    rows = [("kernel Policy.act_into(x, out)", functools.partial(policy.act_into, x), out),
            ("kernel Policy.act_bound(out), input bound", policy.act_bound, out),
            ("kernel Policy.act(x)", policy.act, x)]
    skipped = {}
    for peer, make in (("onnxruntime", lambda: onnxruntime_rows(spec, x)), ("torch", lambda: [torchscript_row(spec)]),
                       ("numpy", lambda: [numpy_row(spec)])):
        try:
            rows += [(name, fn, x) for name, fn in make()]
        except ImportError as e:
            skipped[peer] = f"not importable ({e.name or e})"
        except Exception as e:       # e.g. onnxruntime has no float64 Elu kernel: say so, keep the others
            skipped[peer] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    tol = RTOL[dtype] * max(1.0, float(np.abs(want).max())) * 10
    for rname, fn, arg in rows:     # (the AVX2-copy and weights-read rows are added after this check)
        r = fn(arg)
        got = np.asarray(out if isinstance(r, int) else r, dtype=np.float64).ravel()
        if not np.allclose(got, want, rtol=0, atol=tol):
            raise SystemExit(f"bench policy: {rname} on {name} {dtype} answers {got[:4]}..., the reference {want[:4]}...")
    if policy.isa == "avx512":      # what the 64-byte copy gains, side by side with the 32-byte one
        narrow = Policy(spec, isa="avx2")
        narrow_out = np.zeros(narrow.n_actions)
        rows.append((f"kernel Policy.act_into(x, out), {narrow.isa} copy", functools.partial(narrow.act_into, x),
                     narrow_out))
    else:
        skipped["avx512 copy"] = f"this CPU has no AVX-512 (F/DQ/BW/VL): the {policy.isa} copy runs"
    storage_rows, storage_errors = weight_storage_rows(spec, x)
    rows += storage_rows
    rows.append(weights_read_row(weight_bytes_of(cfg["sizes"], dtype)))
    # beyond L2 (one policy's weights alone do not fit one core's L2): each row warm, timed on its own
    l2 = cache_sizes().get("L2", 0)
    per_row = bool(l2) and weight_bytes_of(cfg["sizes"], dtype) > l2
    timing = ("per row, warm (the weights exceed L2: interleaved rows would evict each other's)" if per_row
              else "interleaved round-robin")
    log(f"{name} {dtype}: {len(rows)} rows x {settings['samples']} samples, {timing} ...")
    times = per_call(rows, settings["samples"], per_row=per_row)
    times.update(c_level(policy, spec, settings["chunks"], settings["chunk"]))
    alloc, peak = allocations_per_call(policy, x)
    return {"shape": name, "dtype": dtype, "sizes": cfg["sizes"], "activation": cfg["act"], "isa": policy.isa,
            "kernel": policy.kernel, "weight_storage_errors": storage_errors, "timing": timing,
            **shape_figures(times, floor_of(cfg["sizes"], dtype), alloc, peak, skipped,
                            storage_floors(storage_errors, lambda w: floor_of(cfg["sizes"], dtype, storage=w)))}


STORAGES = ("f16", "bf16", "int8")


def weight_storage_rows(spec, x, storages=STORAGES, n_error_rows=200):
    """Rows of the same policy with its weights stored narrower (kernels/weights.py), in the same run as the
    float32 rows and onnxruntime, and each storage's error against the float32 policy (measured here over
    ``n_error_rows`` random observations plus the proof's edge samples, as an import measures it).
    Returns ``(rows, errors)``: rows as bench_shape's (name, fn, argument)."""
    import functools

    from control_node.kernels import Policy
    from control_node.kernels.importers.proof import proof_set
    from control_node.kernels.weights import measure_error
    rows, errors = [], {}
    X, seqs = proof_set(spec, n_random=n_error_rows, seed=3)
    from control_node.kernels.dispatch import policy_for
    for w in storages:
        # the copy a node runs ([policy] isa = "fastest": timed here, now): on Zen 4 f16 runs fastest on the
        # AVX2 copy, whose VCVTPH2PS ymm issues twice as often as the AVX-512 one's zmm
        p, choice = policy_for(spec, "fastest", storage=w, cache=False)
        out = np.zeros(p.n_actions)
        name = f"kernel Policy.act_into(x, out), {w} weights, {p.isa.split()[0]} copy"
        if p.hidden_size:     # recurrent rows are called as fn(x) -> actions (bench recurrent's per_call)
            def step(xv, p=p, out=out):
                p.act_into(xv, out)
                return out
            rows.append((name, step, x))
        else:
            rows.append((name, functools.partial(p.act_into, x), out))
        e = measure_error(spec, w, X, policy_class=Policy, seqs=seqs, tolerance=float("inf"))
        errors[w] = {k: e[k] for k in ("max_abs", "p99_abs", "max_rel", "p99_rel", "samples", "measured_on")}
        errors[w]["within_default_bound"] = e["max_rel"] <= DEFAULT_TOLERANCE[w]
        errors[w]["resident_bytes"] = int(p.nbytes)
        errors[w]["row"] = name
        errors[w]["copy"] = {"isa": p.isa, "times_ns": choice["times_ns"]}
    return rows, errors




def storage_floors(errors, floor_of_storage):
    """Each storage row's own floor (its weights' bytes, not float32's): {row name: floor_from tuple}."""
    return {e["row"]: floor_of_storage(STORAGE_DTYPE[w]) for w, e in errors.items()}


def _bound(fl):
    """max(compute, memory) of a floor dict / tuple's figures, None if neither is known."""
    known = [v for v in fl if v is not None]
    return max(known) if known else None


def _bounds(floor):
    """(the floor's bound, {measured / published: its bound}) of a ``floor_from`` tuple."""
    detail = getattr(floor, "detail", None) or {}
    each = {}
    for which in ("measured", "published"):
        d = detail.get(which)
        each[which] = _bound((d["compute"], d["memory"])) if d else None
    return _bound(floor[:2]), each


def shape_figures(times, floor, alloc, peak, skipped, row_floors=None):
    """The measured part of a shape's record: per row percentiles, the ratio to onnxruntime's IOBinding row
    (the baseline) and to the floor (a ``floor_from`` tuple: ``vs_floor`` to the one it gives, and
    ``vs_measured_floor`` / ``vs_published_floor`` to each where there is one; a row named in ``row_floors``,
    e.g. one with float16 weights, against its own), allocations, what was skipped and why."""
    compute, memory, level, how = floor
    detail = getattr(floor, "detail", None) or {}
    own = {name: _bounds(f) for name, f in (row_floors or {}).items()}
    ort_name = next((r for r in times if "IOBinding" in r), None)
    base = float(np.median(times[ort_name])) if ort_name else None
    result = []
    for rname, t in times.items():
        p = pct(t)
        lo, each = own.get(rname) or _bounds(floor)
        p.update(name=rname, vs_onnxruntime=(base / p["p50"]) if base else None,
                 vs_floor=(p["p50"] / lo) if lo else None,
                 **{f"vs_{k}_floor": (p["p50"] / v) if v else None for k, v in each.items()})
        result.append(p)
    return {"rows": result, "skipped": skipped,
            "floor_ns": {"compute": compute, "memory": memory, "cache_level": level, "how": how,
                         "used": detail.get("used"), "family": detail.get("family"),
                         "measured": detail.get("measured"), "published": detail.get("published")},
            "allocations_per_call_bytes": alloc, "tracemalloc_peak_bytes": peak}


def _ratio(v):
    return "-" if v is None else f"{v:.2f}"


def report(res, first_column="row"):
    """The tables of a bench policy / bench recurrent result, one per shape: each row's p50 over the floor
    measured here and, where the CPU family has published figures, over those too."""
    con = console()
    for line in machine_lines(res["machine"]):
        con.print(line)
    probe = res.get("floor_probe")
    for line in summary_lines(probe) if isinstance(probe, dict) else [f"floor measured here: {probe}"] if probe else []:
        con.print(line)
    for sh in res["shapes"]:
        fl = sh["floor_ns"]
        figures = []
        for which in ("measured", "published"):
            d = fl.get(which)
            if d:
                name = which + (f" ({fl['family']})" if which == "published" else "")
                figures.append(f"{name}: compute {fmt_ns(d['compute'])}, memory {fmt_ns(d['memory'])} "
                               f"({d['cache_level']})")
        if not figures and fl.get("compute") is not None:      # a record written before both were kept
            figures.append(f"compute {fmt_ns(fl['compute'])}, memory {fmt_ns(fl['memory'])} ({fl['cache_level']})")
        kernel = f"kernel {sh['isa']}" + (f", {sh['kernel']}" if sh.get("kernel") else "")
        title = (f"{sh['shape']}, {sh['dtype']} ({kernel}); floor {'; '.join(figures) or 'unknown'}; allocations "
                 f"per call {sh['allocations_per_call_bytes']:.3f} B")
        published = fl.get("published") is not None
        first = "vs_measured_floor" if "measured" in fl else "vs_floor"    # (a record from before: one floor)
        rows = [[r["name"], fmt_ns(r["p50"]), fmt_ns(r["p99"]), fmt_ns(r["p999"]), fmt_ns(r["max"]),
                 "-" if r["vs_onnxruntime"] is None else f"{r['vs_onnxruntime']:.1f}x", _ratio(r.get(first))]
                + ([_ratio(r.get("vs_published_floor"))] if published else []) for r in sh["rows"]]
        print_table(title, [first_column, "p50", "p99", "p99.9", "max", "onnxruntime p50 / row p50",
                            "p50 / measured floor" if "measured" in fl else "p50 / floor"]
                    + (["p50 / published floor"] if published else []), rows, con)
        con.print(f"  floor: {fl['how']}")
        if sh.get("timing"):
            con.print(f"  timing: {sh['timing']}")
        for w, e in (sh.get("weight_storage_errors") or {}).items():
            con.print(f"  {w} weights: max |error| {e['max_abs']:.3g} (p99 {e['p99_abs']:.3g}) = {e['max_rel']:.3g} of "
                      f"the {'action' if e['measured_on'] == 'actions' else 'logit'} range over {e['samples']} "
                      f"observations ({'within' if e['within_default_bound'] else 'ABOVE'} the default bound "
                      f"{DEFAULT_TOLERANCE[w]:g}); {e['resident_bytes'] / 1024:.0f} KiB resident")
        if sh["skipped"]:
            con.print(f"  skipped: {sh['skipped']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench policy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=400,
                    help="timing samples per row, each ~100 us of back-to-back calls (default: %(default)s)")
    ap.add_argument("--chunks", type=int, default=400, help="C-level timing chunks (default: %(default)s)")
    ap.add_argument("--chunk", type=int, default=1000, help="calls per C-level chunk (default: %(default)s)")
    ap.add_argument("--shape", action="append", choices=list(SHAPES), help="only these shapes (repeatable)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    settings = {"samples": a.samples, "chunks": a.chunks, "chunk": a.chunk}
    res = {"machine": machine_info(), "settings": settings, "lock_file": LOCK_FILE, "floor_probe": floor_probe(),
           "shapes": []}
    for name in a.shape or SHAPES:
        cfg = SHAPES[name]
        for dtype in cfg["dtypes"]:
            res["shapes"].append(bench_shape(name, cfg, dtype, settings, lambda m: print(m, flush=True)))
    report(res)
    if a.json:
        write_json(a.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
