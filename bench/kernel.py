"""control-node bench kernel: per-sample policy inference, the kernel against its peers in one run.

Rows (all on the same trained iris policy, 4 -> 16 -> 3 float64, same input, same process):

* numpy expression ``argmax(maximum(0, ((x - mean) / scale) @ W1 + b1) @ W2 + b2)`` - the baseline
* numpy with preallocated ``out=`` buffers
* scikit-learn ``MLPClassifier.predict`` with the same weights (normalisation done before the call)
* onnxruntime and torch when importable (skipped with the reason otherwise)
* kernel ``Policy.predict(x)`` and ``Policy.predict_bound()`` called from Python
* kernel C level: ``Policy.predict_batch`` (throughput, independent samples) and
  ``Policy._chain`` (latency: each sample's row depends on the previous answer)

Python-level calls are timed in batches (up to 1000 calls per timing sample, many samples,
interleaved round-robin between the rows so drift hits all of them alike); the table gives the
median and p99 of the per-call means, and each row's speed-up over the numpy expression.
Then: batch throughput on 1M samples (kernel vs numpy), and a width sweep (hidden 16 .. 1024,
one and two hidden layers). Run it alone: ``flock /tmp/control-node-bench.lock control-node bench kernel``.
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from control_node.bench.common import (LOCK_FILE, calibrate, console, fmt_ns, loop_calls, machine_info, machine_lines,
                          markdown_table, print_table, summary, time_round_robin, write_json)

TARGETS = {
    "python_predict_ns": 100.0,         # Policy.predict(x) from Python, median
    "speedup_vs_numpy": 40.0,           # numpy expression / Policy.predict(x)
    "c_throughput_ns": 12.0,            # 4-16-3 float64, predict_batch per sample
    "batch_vs_numpy": 1.0,              # numpy batch time / kernel batch time on 1M samples
}


# ---- the peers ------------------------------------------------------------------------
def numpy_expression(spec):
    """The obvious numpy one-liner, normalisation included (float64 or the spec's dtype)."""
    mean, scale = spec.mean, spec.scale
    layers = spec.layers
    if len(layers) == 2:
        (W1, b1), (W2, b2) = layers

        def f(x):
            return np.argmax(np.maximum(0, ((x - mean) / scale) @ W1 + b1) @ W2 + b2)
    elif len(layers) == 3:
        (W1, b1), (W2, b2), (W3, b3) = layers

        def f(x):
            return np.argmax(np.maximum(0, np.maximum(0, ((x - mean) / scale) @ W1 + b1) @ W2 + b2) @ W3 + b3)
    else:
        hidden, (Wo, bo) = layers[:-1], layers[-1]

        def f(x):
            h = (x - mean) / scale
            for W, b in hidden:
                h = np.maximum(0, h @ W + b)
            return np.argmax(h @ Wo + bo)
    return f


def numpy_batch(spec):
    mean, scale = spec.mean, spec.scale
    hidden, (Wo, bo) = spec.layers[:-1], spec.layers[-1]

    def f(X):
        h = (X - mean) / scale
        for W, b in hidden:
            h = np.maximum(0, h @ W + b)
        return np.argmax(h @ Wo + bo, axis=1)
    return f


def numpy_out_buffers(spec):
    """The same arithmetic with every temporary preallocated (``out=``): no array allocations."""
    mean, scale = spec.mean, spec.scale
    t0 = np.empty(len(mean))
    steps = [(W, b, np.empty(W.shape[1], dtype=W.dtype)) for W, b in spec.layers]
    hidden, (Wo, bo, zo) = steps[:-1], steps[-1]
    sub, div, matmul, add, maximum = np.subtract, np.divide, np.matmul, np.add, np.maximum

    def f(x):
        sub(x, mean, out=t0)
        div(t0, scale, out=t0)
        h = t0
        for W, b, o in hidden:
            matmul(h, W, out=o)
            add(o, b, out=o)
            maximum(o, 0, out=o)
            h = o
        matmul(h, Wo, out=zo)
        add(zo, bo, out=zo)
        return zo.argmax()
    return f


def sklearn_predict(spec):
    from sklearn.neural_network import MLPClassifier
    n_classes = spec.layer_sizes[-1]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(8 * n_classes, spec.layer_sizes[0]))
    y = np.arange(len(X)) % n_classes
    clf = MLPClassifier(hidden_layer_sizes=tuple(spec.layer_sizes[1:-1]), max_iter=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    clf.coefs_ = [np.asarray(W, dtype=np.float64).copy() for W, _ in spec.layers]
    clf.intercepts_ = [np.asarray(b, dtype=np.float64).copy() for _, b in spec.layers]
    mean, scale = spec.mean, spec.scale
    predict = clf.predict

    def f(x):
        return predict(((x - mean) / scale).reshape(1, -1))[0]
    return f


def onnxruntime_predict(spec):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    d = spec.layer_sizes[0]
    inits = [numpy_helper.from_array(spec.mean.reshape(1, -1), "mean"),
             numpy_helper.from_array(spec.scale.reshape(1, -1), "scale")]
    nodes = [helper.make_node("Sub", ["x", "mean"], ["t"]), helper.make_node("Div", ["t", "scale"], ["h0"])]
    h = "h0"
    for i, (W, b) in enumerate(spec.layers):
        inits += [numpy_helper.from_array(np.asarray(W, np.float64), f"W{i}"),
                  numpy_helper.from_array(np.asarray(b, np.float64), f"b{i}")]
        nodes += [helper.make_node("MatMul", [h, f"W{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        h = f"a{i}"
        if i + 1 < len(spec.layers):
            nodes.append(helper.make_node("Relu", [h], [f"r{i}"]))
            h = f"r{i}"
    nodes.append(helper.make_node("ArgMax", [h], ["y"], axis=1, keepdims=0))
    graph = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, d])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    run = sess.run

    def f(x):
        return run(["y"], {"x": x.reshape(1, -1)})[0][0]
    return f


def torch_predict(spec):
    import torch
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    mods = []
    for i, (W, b) in enumerate(spec.layers):
        lin = torch.nn.Linear(W.shape[0], W.shape[1]).double()
        lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(np.asarray(W, np.float64).T)))
        lin.bias.copy_(torch.from_numpy(np.asarray(b, np.float64)))
        mods.append(lin)
        if i + 1 < len(spec.layers):
            mods.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*mods).eval()
    mean, scale = torch.from_numpy(spec.mean), torch.from_numpy(spec.scale)
    from_numpy, argmax = torch.from_numpy, torch.argmax

    def f(x):
        return int(argmax(net((from_numpy(x) - mean) / scale)))
    return f


OPTIONAL_PEERS = [("onnxruntime InferenceSession.run", onnxruntime_predict),
                  ("torch nn.Sequential (1 thread)", torch_predict)]


# ---- C-level probes --------------------------------------------------------------------
def c_level_bodies(policy, spec, target_s, seed=1):
    """Bodies timing predict_batch (independent rows) and _chain (dependent rows), sized to ~target_s."""
    from control_node.kernels.reference import random_inputs
    X = random_inputs(spec, 256, seed=seed)
    t0 = time.perf_counter()
    policy.predict_batch(X)
    per = max((time.perf_counter() - t0) / len(X), 1e-9)
    rows = int(min(8192, max(policy.n_classes + 2, round(target_s / per))))
    Xr = random_inputs(spec, rows, seed=seed)
    batch = policy.predict_batch
    chain = policy._chain
    return ({"body": lambda: batch(Xr), "units": rows},
            {"body": lambda: chain(Xr, rows), "units": rows})


# ---- sections ---------------------------------------------------------------------------
def per_sample(spec, spec32, settings, log):
    from control_node.kernels import Policy
    from control_node.kernels.reference import random_inputs, reference_predict
    policy, policy32 = Policy(spec), Policy(spec32)
    x = np.ascontiguousarray(spec.check_X[60] if spec.check_X is not None else random_inputs(spec, 1)[0])
    buf = x.copy()
    policy.bind_input(buf)
    policy32.bind_input(buf)
    expect = int(reference_predict(spec, x[None, :])[0])

    rows = [("numpy expression", numpy_expression(spec), x, "baseline: argmax(maximum(0,((x-m)/s)@W1+b1)@W2+b2)"),
            ("numpy, out= buffers", numpy_out_buffers(spec), x, "no temporaries"),
            ("scikit-learn MLPClassifier.predict", sklearn_predict(spec), x, "same weights; x normalised first")]
    skipped = {}
    for name, make in OPTIONAL_PEERS:
        try:
            rows.append((name, make(spec), x, ""))
        except ImportError as e:
            skipped[name] = f"not importable ({e.name or e})"
        except Exception as e:  # present but failed to build: say so, keep going
            skipped[name] = f"failed: {type(e).__name__}: {e}"
    rows += [("kernel Policy.predict(x)", policy.predict, x, "from Python"),
             ("kernel Policy.predict_bound()", policy.predict_bound, None, "registered input buffer"),
             ("kernel Policy.predict(x), float32 model", policy32.predict, x, "from Python")]
    for name, fn, arg, _ in rows:
        got = fn(arg) if arg is not None else fn()
        if int(got) != expect:
            raise SystemExit(f"bench kernel: {name} answers {got}, the numpy reference {expect}")
    # the row for the floor: a Python loop calling a builtin that does nothing
    rows.append(("(floor) Python loop calling int()", int, None, "loop + call overhead only"))

    bodies, notes = {}, {}
    for name, fn, arg, note in rows:
        k = calibrate(fn, arg, settings["target_sample_s"], max_calls=settings["max_calls_per_sample"])
        bodies[name] = (loop_calls(fn, arg, k), k)
        notes[name] = (note, k)
    for name, p, sp in (("kernel C level, throughput (predict_batch)", policy, spec),
                        ("kernel C level, latency (_chain)", policy, spec),
                        ("kernel C level, throughput, float32", policy32, spec32),
                        ("kernel C level, latency, float32", policy32, spec32)):
        thr, lat = c_level_bodies(p, sp, settings["target_sample_s"] / 4)
        b = thr if "throughput" in name else lat
        bodies[name] = (b["body"], b["units"])
        notes[name] = ("independent samples" if "throughput" in name else "dependent samples", b["units"])
    log(f"per-sample: {len(bodies)} rows x {settings['samples']} samples ...")
    times = time_round_robin(bodies, settings["samples"])
    base = float(np.median(times["numpy expression"]))
    result = []
    for name in bodies:
        s = summary(times[name])
        s.update(name=name, note=notes[name][0], calls_per_sample=notes[name][1],
                 speedup_vs_numpy=base / s["median_ns"])
        result.append(s)
    return {"rows": result, "skipped": skipped, "model": f"{' -> '.join(map(str, spec.layer_sizes))}",
            "isa": policy.isa, "layout": policy.layout}


def batch_throughput(spec, settings, log):
    from control_node.kernels import Policy
    from control_node.kernels.reference import random_inputs
    policy = Policy(spec)
    n = settings["batch_n"]
    X = random_inputs(spec, n, seed=2)
    nb = numpy_batch(spec)
    agree = float((policy.predict_batch(X) == nb(X)).mean())
    log(f"batch: {n} samples x {settings['batch_repeats']} repeats ...")
    times = time_round_robin({"numpy batch": (lambda: nb(X), n),
                              "kernel predict_batch": (lambda: policy.predict_batch(X), n)},
                             settings["batch_repeats"])
    out = {"n": n, "agreement": agree}
    for k, v in times.items():
        out[k] = summary(v)
    out["ratio_numpy_over_kernel"] = out["numpy batch"]["median_ns"] / out["kernel predict_batch"]["median_ns"]
    return out


def _random_spec(sizes, seed=0):
    from control_node.kernels import ModelSpec
    rng = np.random.default_rng(seed)
    layers = [(rng.normal(0.0, 1.0 / np.sqrt(a), size=(a, b)), rng.normal(0.0, 0.1, size=b))
              for a, b in zip(sizes[:-1], sizes[1:])]
    d = sizes[0]
    return ModelSpec(layers=layers, mean=np.zeros(d), scale=np.ones(d), classes=[str(i) for i in range(sizes[-1])],
                     feature_names=[f"x{i}" for i in range(d)])


def width_sweep(settings, log):
    from control_node.kernels import Policy
    from control_node.kernels.reference import random_inputs
    out = []
    for depth in (1, 2):
        for width in settings["sweep_widths"]:
            sizes = [4] + [width] * depth + [3]
            spec = _random_spec(sizes, seed=width + depth)
            policy = Policy(spec)
            x = np.ascontiguousarray(random_inputs(spec, 1, seed=3)[0])
            expr = numpy_expression(spec)
            assert int(expr(x)) == policy.predict(x)
            bodies = {}
            for name, fn in (("numpy", expr), ("kernel predict", policy.predict)):
                k = calibrate(fn, x, settings["target_sample_s"], max_calls=settings["max_calls_per_sample"])
                bodies[name] = (loop_calls(fn, x, k), k)
            thr, lat = c_level_bodies(policy, spec, settings["target_sample_s"] / 2)
            bodies["C throughput"] = (thr["body"], thr["units"])
            bodies["C latency"] = (lat["body"], lat["units"])
            log(f"sweep {' -> '.join(map(str, sizes))} ...")
            times = time_round_robin(bodies, settings["sweep_samples"])
            row = {"sizes": sizes, "layout": policy.layout}
            for k, v in times.items():
                row[k] = summary(v)
            row["speedup_python"] = row["numpy"]["median_ns"] / row["kernel predict"]["median_ns"]
            row["speedup_c"] = row["numpy"]["median_ns"] / row["C throughput"]["median_ns"]
            out.append(row)
    return out


# ---- report ---------------------------------------------------------------------------
def targets(per, batch):
    rows = {r["name"]: r for r in per["rows"]}
    pred = rows["kernel Policy.predict(x)"]
    thr = rows["kernel C level, throughput (predict_batch)"]
    checks = [
        ("Policy.predict(x) median <= 100 ns", pred["median_ns"], TARGETS["python_predict_ns"], "<=",
         fmt_ns(pred["median_ns"])),
        ("Policy.predict(x) >= 40x faster than numpy expression", pred["speedup_vs_numpy"],
         TARGETS["speedup_vs_numpy"], ">=", f"{pred['speedup_vs_numpy']:.1f}x"),
        ("C-level throughput 4-16-3 float64 <= 12 ns/sample", thr["median_ns"], TARGETS["c_throughput_ns"], "<=",
         fmt_ns(thr["median_ns"])),
        ("batch throughput (1M) >= numpy", batch["ratio_numpy_over_kernel"], TARGETS["batch_vs_numpy"], ">=",
         f"{batch['ratio_numpy_over_kernel']:.2f}x numpy"),
    ]
    return [{"target": t, "measured": shown, "value": v, "limit": lim,
             "met": bool(v <= lim if op == "<=" else v >= lim)} for t, v, lim, op, shown in checks]


def _ratio(r):
    return f"{r:.0f}x" if r >= 100 else f"{r:.1f}x" if r >= 1 else f"{r:.2f}x"


def report(result, markdown=False):
    con = console()
    out = print if con is None else con.print
    for line in machine_lines(result["machine"]):
        out(line, markup=False) if con is not None else out(line)
    s = result["settings"]
    out(f"settings: {s}", markup=False) if con is not None else out(f"settings: {s}")
    per = result["per_sample"]
    cols = ["per sample, batch = 1 (" + per["model"] + ", float64)", "median", "p99", "vs numpy expr",
            "calls/sample"]
    rows = [[r["name"], fmt_ns(r["median_ns"]), fmt_ns(r["p99_ns"]), _ratio(r["speedup_vs_numpy"]),
             str(r["calls_per_sample"])] for r in per["rows"]]
    rows += [[name, "skipped", reason, "", ""] for name, reason in per["skipped"].items()]
    tables = [("Per-sample latency", cols, rows)]
    b = result["batch"]
    tables.append((f"Batch throughput, {b['n']:,} samples (agreement {b['agreement']:.6f})",
                   ["batch", "median ns/sample", "p99 ns/sample", "samples/s"],
                   [[k, f"{b[k]['median_ns']:.2f}", f"{b[k]['p99_ns']:.2f}", f"{1e9 / b[k]['median_ns'] / 1e6:.1f} M"]
                    for k in ("numpy batch", "kernel predict_batch")]
                   + [["kernel speed-up", f"{b['ratio_numpy_over_kernel']:.2f}x", "", ""]]))
    sw = result["sweep"]
    tables.append(("Width sweep, float64, per sample (batch = 1), medians",
                   ["model", "layout", "numpy expr", "kernel predict", "vs numpy", "C throughput", "C latency",
                    "vs numpy (C)"],
                   [[" -> ".join(map(str, r["sizes"])), "/".join(r["layout"]), fmt_ns(r["numpy"]["median_ns"]),
                     fmt_ns(r["kernel predict"]["median_ns"]), _ratio(r["speedup_python"]),
                     fmt_ns(r["C throughput"]["median_ns"]), fmt_ns(r["C latency"]["median_ns"]),
                     _ratio(r["speedup_c"])] for r in sw]))
    tg = result["targets"]
    tables.append(("Targets", ["target", "measured", "met"],
                   [[t["target"], t["measured"], "yes" if t["met"] else "NO"] for t in tg]))
    for title, c, r in tables:
        print_table(title, c, r, con)
    if markdown:
        print()
        for title, c, r in tables:
            print(f"**{title}**\n\n{markdown_table(c, r)}\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="control-node bench kernel", description=__doc__.split("\n\n")[0],
                                epilog=f"Run alone: flock {LOCK_FILE} control-node bench kernel ...")
    p.add_argument("--json", metavar="FILE", help="write machine, settings and every figure to FILE")
    p.add_argument("--quick", action="store_true", help="fewer samples (~20 s instead of ~1-2 min)")
    p.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    args = p.parse_args(argv)
    settings = {
        "samples": 150 if args.quick else 1500,
        "max_calls_per_sample": 1000,
        "target_sample_s": 0.001 if args.quick else 0.002,
        "batch_n": 1_000_000,
        "batch_repeats": 3 if args.quick else 9,
        "sweep_widths": [16, 64, 256, 1024],
        "sweep_samples": 20 if args.quick else 150,
        "gc": "disabled while timing",
        "input": "one fixed iris sample for Python-level rows; C level walks random rows",
    }
    from control_node.train.iris import train_iris
    t_start = time.perf_counter()
    con = console()

    def log(msg):
        (con.print(f"[dim]{msg}[/dim]") if con is not None else print(msg))

    log("training the iris policy (4 -> 16 -> 3) ...")
    spec = train_iris()
    spec32 = train_iris(dtype="float32")
    result = {"benchmark": "kernel", "machine": machine_info(), "settings": settings}
    result["per_sample"] = per_sample(spec, spec32, settings, log)
    result["batch"] = batch_throughput(spec, settings, log)
    result["sweep"] = width_sweep(settings, log)
    result["targets"] = targets(result["per_sample"], result["batch"])
    result["wall_s"] = time.perf_counter() - t_start
    report(result, markdown=args.markdown)
    log(f"total {result['wall_s']:.1f} s")
    if args.json:
        write_json(args.json, result)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
