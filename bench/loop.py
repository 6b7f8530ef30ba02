"""control-node bench loop: the node's 1 kHz loop against cyclictest and a naive Python loop, in one run.

Part 1, wake-up latency (actual wake minus intended tick), each for --duration seconds, one after
the other on the same core settings: cyclictest (rt-tests; installed with apt-get if missing),
the node (fed by a 1 kHz sensor stream), the same cycle as a Python loop over the kernel with the
node's real-time set-up (the design alternative), and the naive loop (time.sleep + pyzmq + msgpack +
numpy, no real-time set-up).
Part 2, sensor-to-action round trip over ipc, one frame per ms, measured by the same client process:
a bare pyzmq msgpack echo (with the node's real-time set-up), the node in sensor clock mode, and the
naive loop. Raw data go to bench/results/raw/, the table to the terminal and --json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from control_node.bench.common import machine_info, machine_lines, save_raw

from control_node.bench.harness import CHILD_CWD, NodeProcess, write_node_config
PCTS = (50, 99, 99.9)


def pct_row(values_ns) -> dict:
    v = np.asarray(values_ns, dtype=np.float64)
    q = np.percentile(v, PCTS)
    return {"p50": q[0] / 1e3, "p99": q[1] / 1e3, "p999": q[2] / 1e3, "max": v.max() / 1e3, "n": int(v.size)}


def ensure_cyclictest() -> str:
    path = shutil.which("cyclictest")
    if path:
        return path
    print("installing rt-tests (cyclictest) with apt-get ...", flush=True)
    for cmd in (["apt-get", "install", "-y", "-q", "rt-tests"], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "rt-tests"]):
        subprocess.run(cmd, capture_output=True)
        if shutil.which("cyclictest"):
            return shutil.which("cyclictest")
    raise SystemExit("cyclictest is not available and apt-get could not install rt-tests")


def run_cyclictest(duration, cpu, prio, tmp, interval_us=1000) -> dict:
    hist = os.path.join(tmp, "cyclictest.hist")
    cmd = [ensure_cyclictest(), "-m", "-q", f"-p{prio}", f"-a{cpu}", "-t1", f"-i{interval_us}", f"-D{int(duration)}",
           "-h20000", f"--histfile={hist}"]
    subprocess.run(cmd, check=True, capture_output=True)
    lat_us, counts, overflows = [], [], 0
    with open(hist) as f:
        for line in f:
            if line.startswith("# Histogram Overflows"):
                overflows = int(line.split(":")[1].split()[0])
            elif line[0].isdigit():
                a, b = line.split()[:2]
                lat_us.append(int(a))
                counts.append(int(b))
    lat_ns = np.repeat(np.array(lat_us, dtype=np.int64) * 1000, counts)
    row = pct_row(lat_ns)
    row["late_over_period"] = int((lat_ns >= interval_us * 1000).sum()) + overflows
    row["overflows"] = overflows
    row["cmd"] = " ".join(cmd)
    return row, lat_ns


def write_config(tmp, extra="[diagnostics]\nattribution = true\n"):
    """A node config on private ipc endpoints in ``tmp`` (with why-late attribution): (path, endpoints)."""
    path = os.path.join(tmp, "node.toml")
    return path, write_node_config(path, tmp, extra)


def py(*args):
    return [sys.executable, "-m", *args]


def wait_ready(proc, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("ready"):
            return
    raise RuntimeError(f"{proc.args} did not become ready")


def run_node(duration, model, tmp, clock="timer", feeder=True, rate=None):
    cfg, eps = write_config(tmp)
    run_dir = os.path.join(tmp, f"node-{clock}" + (f"-{rate:g}" if rate else ""))
    node = NodeProcess(cfg, model, "--quiet", "--clock", clock, "--run-dir", run_dir,
                       *(["--duration", str(duration)] if duration else []), *(["--rate", str(rate)] if rate else []),
                       ready_timeout=60)
    return node.proc, eps, run_dir


def feed_until_done(proc, eps, duration):
    """Feed a running loop at 1 kHz until it exits by itself after ``duration`` seconds."""
    feeder = subprocess.Popen(py("control_node.bench.peers.feeder", eps["sensor"], "1000", str(duration + 2)), cwd=CHILD_CWD)
    proc.communicate(timeout=duration + 60)
    feeder.kill()
    feeder.wait()


def run_peer_loop(module, model, duration, tmp):
    """A bench.peers loop (pyloop, naive) for ``duration`` s; returns its npz (wake_latency_ns, ...)."""
    cfg, eps = write_config(tmp)
    out = os.path.join(tmp, f"{module}.npz")
    proc = subprocess.Popen(py(f"control_node.bench.peers.{module}", model, eps["sensor"], eps["action"], str(duration), out),
                            cwd=CHILD_CWD, stdout=subprocess.PIPE, text=True)
    wait_ready(proc)
    feed_until_done(proc, eps, duration)
    return np.load(out)


def part1(args, tmp, model, cpu):
    rows, raw = {}, {}
    print(f"cyclictest {args.duration:g} s ...", flush=True)
    rows["cyclictest"], raw["cyclictest"] = run_cyclictest(args.duration, cpu, args.priority, tmp)
    print(f"node {args.duration:g} s ...", flush=True)
    node, eps, run_dir = run_node(args.duration, model, tmp)
    feed_until_done(node, eps, args.duration)
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    arrays = np.load(os.path.join(run_dir, "cycles.npz"))
    for name, d in (("node", arrays),
                    ("pyloop", run_peer_loop("pyloop", model, args.duration, tmp)),
                    ("naive", run_peer_loop("naive", model, args.duration, tmp))):
        raw[name] = d["wake_latency_ns"]
        rows[name] = pct_row(raw[name])
        rows[name]["late_over_period"] = int((raw[name] >= 1_000_000).sum())
        if "cycle_time_ns" in d:
            rows[name]["cycle_time_p50_us"] = float(np.percentile(d["cycle_time_ns"], 50)) / 1e3
            rows[name]["cycle_time_p99_us"] = float(np.percentile(d["cycle_time_ns"], 99)) / 1e3
        if name == "pyloop":
            rows[name]["traced_peak_bytes"] = int(d["traced_peak_bytes"])
        if name != "node":
            print(f"{name} {args.duration:g} s done", flush=True)
    rows["node"].update(deadline_misses=s["deadline_misses"], cycles=s["cycles"],
                        rt={k: v["granted"] for k, v in s["rt"].items()})
    return rows, raw


def part_rates(args, tmp, model, cpu):
    """Node and cyclictest at each of --rates, side by side: wake-up percentiles, misses, and the node's
    own account of its misses (summary.json why_late)."""
    rows, raw = {}, {}
    for rate in args.rates:
        interval = int(round(1e6 / rate))
        print(f"{rate:g} Hz: cyclictest -i{interval} {args.duration:g} s ...", flush=True)
        ct, raw[f"cyclictest_{rate:g}"] = run_cyclictest(args.duration, cpu, args.priority, tmp, interval)
        print(f"{rate:g} Hz: node {args.duration:g} s ...", flush=True)
        node, eps, run_dir = run_node(args.duration, model, tmp, rate=rate)
        feed_until_done(node, eps, args.duration)
        s = json.load(open(os.path.join(run_dir, "summary.json")))
        arrays = np.load(os.path.join(run_dir, "cycles.npz"))
        raw[f"node_{rate:g}"] = arrays["wake_latency_ns"]
        nr = pct_row(arrays["wake_latency_ns"])
        wl = s.get("why_late") or {}
        nr.update(deadline_misses=s["deadline_misses"], cycles=s["cycles"], spin_us=s["spin_us"],
                  late_over_period=int((arrays["wake_latency_ns"] >= interval * 1000).sum()),
                  why_late=wl.get("text") or wl.get("detail"), misses_by_cause=wl.get("misses_by_cause"),
                  late_time_named_share=wl.get("late_time_named_share"))
        rows[f"{rate:g}"] = {"cyclictest": ct, "node": nr}
    return rows, raw


def rtt(eps, n, tmp, name):
    out = os.path.join(tmp, f"rtt-{name}.npy")
    subprocess.run(py("control_node.bench.peers.rtt_client", eps["sensor"], eps["action"], str(n), out), cwd=CHILD_CWD,
                   check=True, timeout=n / 1000 * 3 + 120)
    v = np.load(out)
    lost = int((v < 0).sum())
    row = pct_row(v[v >= 0])
    row["lost"] = lost
    return row, v


def part2(args, tmp, model):
    n = int(args.rtt_seconds * 1000)
    rows, raw = {}, {}
    print(f"round trips: echo, node (sensor clock), naive; {n} each ...", flush=True)
    cfg, eps = write_config(tmp)
    echo = subprocess.Popen(py("control_node.bench.peers.echo", eps["sensor"], eps["action"], str(args.rtt_seconds + 60), "--rt"),
                            cwd=CHILD_CWD, stdout=subprocess.PIPE, text=True)
    wait_ready(echo)
    dma = os.open("/dev/cpu_dma_latency", os.O_WRONLY) if os.access("/dev/cpu_dma_latency", os.W_OK) else None
    if dma is not None:
        os.write(dma, (0).to_bytes(4, "little"))       # the node holds this too while it runs
    try:
        rows["echo"], raw["echo"] = rtt(eps, n, tmp, "echo")
    finally:
        if dma is not None:
            os.close(dma)
    echo.kill()
    echo.wait()
    node, eps, _ = run_node(0, model, tmp, clock="sensor")
    rows["node"], raw["node"] = rtt(eps, n, tmp, "node")
    node.terminate()
    node.communicate(timeout=60)
    cfg, eps = write_config(tmp)
    naive = subprocess.Popen(py("control_node.bench.peers.naive", model, eps["sensor"], eps["action"], str(args.rtt_seconds + 60),
                                os.path.join(tmp, "naive-rtt-lat.npz")),
                             cwd=CHILD_CWD, stdout=subprocess.PIPE, text=True)
    wait_ready(naive)
    rows["naive"], raw["naive"] = rtt(eps, n, tmp, "naive")
    naive.kill()
    naive.wait()
    return rows, raw


def verdicts(p1, p2):
    out = []
    if p1:
        node, ct = p1["node"], p1["cyclictest"]
        out.append(("wake p99 <= 10 us", node["p99"] <= 10, f"{node['p99']:.1f} us"))
        out.append(("wake p99.9 <= 50 us", node["p999"] <= 50, f"{node['p999']:.1f} us"))
        out.append(("wake max <= 2x cyclictest max", node["max"] <= 2 * ct["max"],
                    f"{node['max']:.0f} vs {ct['max']:.0f} us"))
        out.append(("misses <= cyclictest wake-ups later than a period",
                    node["deadline_misses"] <= ct["late_over_period"],
                    f"{node['deadline_misses']} vs {ct['late_over_period']} (node wake-ups later than a period: "
                    f"{node['late_over_period']})"))
    if p2:
        n, e, nv = p2["node"], p2["echo"], p2["naive"]
        out.append(("round trip p50 <= 1.3x echo", n["p50"] <= 1.3 * e["p50"], f"{n['p50'] / e['p50']:.2f}x"))
        out.append(("round trip p99 <= 1.3x echo", n["p99"] <= 1.3 * e["p99"], f"{n['p99'] / e['p99']:.2f}x"))
        better = all(n[k] < nv[k] for k in ("p50", "p99", "p999", "max"))
        out.append(("round trip better than naive at every percentile", better,
                    " ".join(f"{k} {n[k]:.0f}/{nv[k]:.0f}" for k in ("p50", "p99", "p999", "max"))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench loop", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per wake-up run (default: 60)")
    ap.add_argument("--rtt-seconds", type=float, default=20.0, help="seconds of round trips per peer (default: 20)")
    ap.add_argument("--quick", action="store_true", help="10 s wake-up runs, 5 s of round trips")
    ap.add_argument("--part", choices=["all", "wake", "rtt", "rates"], default="all",
                    help="all = wake + rtt; rates: node and cyclictest at each of --rates")
    ap.add_argument("--rates", type=lambda v: [float(x) for x in v.split(",")], default=[1000.0, 4000.0, 10000.0],
                    help="loop rates in Hz for --part rates (default: 1000,4000,10000)")
    ap.add_argument("--model", default="models/iris.npz")
    ap.add_argument("--priority", type=int, default=80, help="SCHED_FIFO priority for cyclictest (node uses its config's)")
    ap.add_argument("--json", metavar="FILE", help="write figures, settings and machine here")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.rtt_seconds = 10.0, 5.0
    model = os.path.abspath(args.model)
    if not os.path.exists(model):
        raise SystemExit(f"{args.model} missing: run `control-node train` first")
    from control_node.loop.realtime import choose_cpu
    cpu = choose_cpu("last")
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="cn-bench-loop-")
    p1 = p2 = p3 = None
    raw = {}
    if args.part == "rates":
        p3, raw3 = part_rates(args, tmp, model, cpu)
        raw.update({f"rates_{k}": v for k, v in raw3.items()})
    if args.part in ("all", "wake"):
        p1, raw1 = part1(args, tmp, model, cpu)
        raw.update({f"wake_{k}": v for k, v in raw1.items()})
    if args.part in ("all", "rtt"):
        p2, raw2 = part2(args, tmp, model)
        raw.update({f"rtt_{k}": v for k, v in raw2.items()})
    for line in machine_lines(info):
        print(line)
    print(f"settings: core {cpu}, 1 kHz, wake runs {args.duration:g} s each, round trips {args.rtt_seconds:g} s each")
    if p1:
        print("\nwake-up latency (us)          p50      p99    p99.9      max   wake-ups >1 period   deadline misses")
        for k in ("cyclictest", "node", "pyloop", "naive"):
            r = p1[k]
            misses = r.get("deadline_misses", "")
            print(f"  {k:<24} {r['p50']:8.1f} {r['p99']:8.1f} {r['p999']:8.1f} {r['max']:8.0f}   "
                  f"{r['late_over_period']:>18}   {misses:>15}")
        print("  (the node's deadline misses include every tick skipped during a stall; cyclictest's histogram "
              "counts one late wake-up per stall)")
        print(f"cycle time (wake -> published, us): node p50 {p1['node']['cycle_time_p50_us']:.1f} "
              f"p99 {p1['node']['cycle_time_p99_us']:.1f}; python loop p50 {p1['pyloop']['cycle_time_p50_us']:.1f} "
              f"p99 {p1['pyloop']['cycle_time_p99_us']:.1f} (traced Python memory peak "
              f"{p1['pyloop']['traced_peak_bytes']} bytes)")
    if p2:
        print("\nsensor -> action round trip, ipc (us)   p50      p99    p99.9      max   lost")
        for k in ("echo", "node", "naive"):
            r = p2[k]
            print(f"  {k:<34} {r['p50']:8.1f} {r['p99']:8.1f} {r['p999']:8.1f} {r['max']:8.0f}   {r['lost']}")
        print("  node / echo ratio: " + " ".join(f"{k} {p2['node'][k] / p2['echo'][k]:.2f}x"
                                                 for k in ("p50", "p99", "p999", "max")))
    if p3:
        print("\nwake-up latency by rate (us)         p50      p99    p99.9      max   late>period  misses/cycles")
        for rate, r in p3.items():
            for k in ("cyclictest", "node"):
                x = r[k]
                extra = f"  {x['deadline_misses']}/{x['cycles']}" if k == "node" else ""
                print(f"  {rate:>6} Hz {k:<14} {x['p50']:8.1f} {x['p99']:8.1f} {x['p999']:8.1f} {x['max']:8.0f}   "
                      f"{x['late_over_period']:>11}{extra}")
            print(f"  {rate:>6} Hz why late: {r['node']['why_late']}")
    print("\ntargets:")
    for name, ok, detail in verdicts(p1, p2):
        print(f"  [{'met' if ok else 'NOT met'}] {name}: {detail}")
    raw_path = save_raw("loop", raw)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "settings": vars(args), "core": cpu, "wake": p1, "rtt": p2, "rates": p3,
                       "targets": [{"name": n, "met": bool(o), "detail": d} for n, o, d in verdicts(p1, p2)],
                       "raw": raw_path}, f, indent=2, default=str)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0
