"""control-node bench switch: policy switches during a 1 kHz run, against the same run without them; and
what a shadow policy adds to a cycle, per policy shape.

Part 1, switching. Runs alternate, --rounds of each: a node at 1 kHz fed at 1 kHz for --duration s with
two resident policies of one shape (6 -> 32 -> 32 -> 4 ELU, float64). In a "switching" run a client
activates them in turn through the control endpoint, --switches times spread over the run; in a
"steady" run nothing changes. Each run gives the wake-up latency and cycle time (wake -> published)
percentiles over all its cycles (the node's ring), deadline misses and skipped ticks; a switching run
also the cycle time of the cycles right after each switch (where the switch's work lands), how long a
request took from send to reply (the loop takes it at the next cycle boundary), and whether the action
stream's cycle numbers stayed contiguous.

Part 2, shadow cost, per policy shape: a node with the shape active runs --shadow-seconds with a
same-shape shadow and as long without; the shadow's own time per policy tick (after the publish) and
the cycle time of inference ticks, with and without.

Run it alone: ``flock /tmp/control-node-bench.lock control-node bench switch``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from control_node.bench.common import machine_info, machine_lines, save_raw, write_json
from control_node.bench.harness import CHILD_CWD, NodeProcess, write_node_config

SHADOW_SHAPES = {
    "small 6-32-32-4 ELU f64": dict(sizes=[6, 32, 32, 4], act="elu", norm=True, squash=True, dtype="float64"),
    "rsl_rl 48-512-256-128-12 ELU f32": dict(sizes=[48, 512, 256, 128, 12], act="elu", norm=True, squash=False,
                                             dtype="float32"),
    "G1 480-512-256-128-29 ELU f32": dict(sizes=[480, 512, 256, 128, 29], act="elu", norm=True, squash=False,
                                          dtype="float32"),
}


def us_row(values_ns) -> dict:
    v = np.asarray(values_ns, dtype=np.float64)
    v = v[v >= 0]
    if v.size == 0:
        return {"p50": None, "p99": None, "p999": None, "max": None, "n": 0}
    q = np.percentile(v, [50, 99, 99.9])
    return {"p50": q[0] / 1e3, "p99": q[1] / 1e3, "p999": q[2] / 1e3, "max": v.max() / 1e3, "n": int(v.size)}


def why_late_brief(summary) -> dict:
    """The misses by cause and the causes of the explained late wake-ups, from a node run's why_late."""
    wl = summary.get("why_late") or {}
    late = {}
    for e in wl.get("events") or []:
        if not e.get("miss"):
            late[e["cause"]] = late.get(e["cause"], 0) + 1
    return {"text": wl.get("text") or wl.get("detail"), "late_wakes_by_cause": late}


def save_shape(path, shape, seed):
    from control_node.bench.policy import make_spec
    from control_node.kernels import Policy, save_model
    save_model(make_spec(shape, shape["dtype"], seed=seed), path)
    Policy.load(path)
    return path


class Collector(threading.Thread):
    """Every action's cycle number (a SUB on the node's action endpoint)."""

    def __init__(self, endpoint):
        import zmq
        super().__init__(daemon=True)
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.cycles, self.stop = [], threading.Event()

    def run(self):
        import msgpack
        import zmq
        while not self.stop.is_set():
            if self.sub.poll(20):
                while True:
                    try:
                        self.cycles.append(msgpack.unpackb(self.sub.recv(zmq.NOBLOCK))["cycle"])
                    except zmq.Again:
                        break
        self.sub.close(0)


def node_run(tmp, tag, model, duration, n_features, extra="", during=None):
    """A node on private endpoints for ``duration`` s, fed at 1 kHz; ``during(node, cfg)`` runs meanwhile.
    Returns (summary, cycles arrays, what ``during`` returned, action cycle numbers)."""
    from control_node import rundir
    d = os.path.join(tmp, tag)
    os.makedirs(d, mode=0o700, exist_ok=True)
    cfg = os.path.join(d, "node.toml")
    write_node_config(cfg, d, "[watchdog]\nstale_after_ms = 50.0\n[diagnostics]\nattribution = true\n" + extra)
    run_dir = os.path.join(d, "run")
    node = NodeProcess(cfg, model, "--quiet", "--duration", str(duration), "--run-dir", run_dir, ready_timeout=60)
    feeder = subprocess.Popen([sys.executable, "-m", "control_node.bench.peers.feeder", node.endpoints["sensor"],
                               "1000", str(duration + 5), str(n_features)], cwd=CHILD_CWD)
    collector = Collector(node.endpoints["action"])
    collector.start()
    try:
        got = during(node, cfg) if during else None
        node.proc.communicate(timeout=duration + 60)     # a --duration node ends by itself
    finally:
        feeder.kill()
        feeder.wait()
        collector.stop.set()
        collector.join(5)
    summary, arrays = rundir.read_node_run(run_dir)
    return summary, arrays, got, np.array(collector.cycles)


def switching(n_switches, duration):
    """``during`` for a switching run: activate b, a, b, ... n_switches times, spread over the run."""
    def during(node, cfg):
        from control_node.lifecycle import PolicyClient
        client = PolicyClient(node.endpoints["control"], timeout=10.0)
        rep = client.request({"op": "load", "name": "b", "path": cfg.replace("node.toml", "b.npz")})
        assert rep["ok"], rep
        start = time.monotonic()
        span = max(1.0, duration - 3.0)            # leave the last seconds for the run to end
        lat, cycles = [], []
        for i in range(n_switches):
            target = start + 1.0 + span * i / n_switches
            time.sleep(max(0.0, target - time.monotonic()))
            t0 = time.monotonic_ns()
            # the start-up policy is named after its file: a.npz -> "a"
            rep = client.request({"op": "activate", "name": "b" if i % 2 == 0 else "a"})
            lat.append(time.monotonic_ns() - t0)
            if not rep["ok"]:
                raise RuntimeError(f"switch {i} refused: {rep['message']}")
            cycles.append(rep["cycle"])
        client.close()
        return {"request_ns": lat, "cycles": cycles}
    return during


def part1(args, tmp):
    a = save_shape(os.path.join(tmp, "a.npz"), SHADOW_SHAPES["small 6-32-32-4 ELU f64"], seed=1)
    rows = {"steady": [], "switching": []}
    raw = {}
    for r in range(args.rounds):
        for kind in ("steady", "switching"):
            tag = f"{kind}-{r}"
            os.makedirs(os.path.join(tmp, tag), mode=0o700, exist_ok=True)
            save_shape(os.path.join(tmp, tag, "b.npz"), SHADOW_SHAPES["small 6-32-32-4 ELU f64"], seed=2)
            print(f"round {r + 1}/{args.rounds}: {kind} {args.duration:g} s ...", flush=True)
            during = switching(args.switches, args.duration) if kind == "switching" else None
            s, arr, got, act_cycles = node_run(tmp, tag, a, args.duration, 6, during=during)
            row = {"wake_us": us_row(arr["wake_latency_ns"]), "cycle_time_us": us_row(arr["cycle_time_ns"]),
                   "cycles": int(s["cycles"]), "deadline_misses": int(s["deadline_misses"]),
                   "skipped_ticks": int(s["skipped_ticks"]),
                   "action_stream_contiguous": bool(act_cycles.size > 1 and np.all(np.diff(act_cycles) == 1)),
                   "actions_received": int(act_cycles.size),
                   # what the node's own attribution says of its misses and worst wake-ups (summary.json why_late)
                   "why_late": why_late_brief(s)}
            if got:
                sw = np.array(got["cycles"], dtype=np.int64)
                cyc = arr["cycle"]
                at = np.isin(cyc, sw)                 # the first cycle after each switch
                row["switches"] = int(sw.size)
                row["switch_cycle_time_us"] = us_row(arr["cycle_time_ns"][at])
                row["switch_wake_us"] = us_row(arr["wake_latency_ns"][at])
                row["switch_cycle_misses"] = int(((arr["flags"][at] & 1) != 0).sum())
                row["request_to_reply_us"] = us_row(got["request_ns"])
                tr = [e for e in s["lifecycle"]["transitions"] if e["event"] == "activate" and e["reason"] == "request"]
                row["transitions_recorded"] = len(tr)
                raw[f"{tag}_request_ns"] = np.array(got["request_ns"])
                raw[f"{tag}_switch_cycles"] = sw
            raw[f"{tag}_wake_ns"] = arr["wake_latency_ns"]
            raw[f"{tag}_cycle_time_ns"] = arr["cycle_time_ns"]
            rows[kind].append(row)
    return rows, raw


def part2(args, tmp):
    rows = {}
    raw = {}
    for name, shape in SHADOW_SHAPES.items():
        d = os.path.join(tmp, "shape-" + name.split()[0])
        os.makedirs(d, mode=0o700, exist_ok=True)
        a = save_shape(os.path.join(d, "a.npz"), shape, seed=1)
        b = save_shape(os.path.join(d, "b.npz"), shape, seed=2)
        res = {}
        for kind in ("without", "with"):
            print(f"shadow, {name}: {kind} a shadow, {args.shadow_seconds:g} s ...", flush=True)

            def during(node, cfg, kind=kind):
                if kind == "without":
                    return None
                from control_node.lifecycle import PolicyClient
                with PolicyClient(node.endpoints["control"], timeout=30.0) as client:
                    for msg in ({"op": "load", "name": "b", "path": b}, {"op": "shadow", "name": "b"}):
                        rep = client.request(msg)
                        assert rep["ok"], rep
                return None
            s, arr, _, _ = node_run(d, kind, a, args.shadow_seconds, shape["sizes"][0], during=during,
                                    extra="[limits]\nmax_frame_bytes = 16384\n")     # 480 floats: 4.3 kB
            infer = (arr["flags"] & 64) != 0
            r = {"cycle_time_infer_us": us_row(arr["cycle_time_ns"][infer]),
                 "wake_us": us_row(arr["wake_latency_ns"]), "deadline_misses": int(s["deadline_misses"])}
            if kind == "with":
                ran = arr["shadow"] != 0
                r["shadow_us"] = us_row(arr["shadow_ns"][ran])
                r["shadow_ticks"] = int(ran.sum())
                # the cycle as the loop spends it: publish, then the shadow
                r["cycle_plus_shadow_us"] = us_row(arr["cycle_time_ns"][ran] + arr["shadow_ns"][ran])
                raw[f"{name}_shadow_ns"] = arr["shadow_ns"][ran]
            res[kind] = r
        rows[name] = res
    return rows, raw


def fmt(r, keys=("p50", "p99", "p999", "max")):
    return " ".join(f"{r[k]:8.1f}" if r[k] is not None else "       -" for k in keys)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench switch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=14.0, help="seconds per run of part 1 (default: %(default)s)")
    ap.add_argument("--switches", type=int, default=1000, help="switches per switching run (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="steady/switching pairs (default: %(default)s)")
    ap.add_argument("--shadow-seconds", type=float, default=6.0,
                    help="seconds per run of part 2, with and without a shadow (default: %(default)s)")
    ap.add_argument("--part", choices=["all", "switch", "shadow"], default="all")
    ap.add_argument("--quick", action="store_true", help="one round of 6 s with 300 switches; 3 s shadow runs")
    ap.add_argument("--json", metavar="FILE", help="write figures, settings and machine here")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.switches, args.rounds, args.shadow_seconds = 6.0, 300, 1, 3.0
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="cn-bench-switch-")
    os.chmod(tmp, 0o700)
    p1 = p2 = None
    raw = {}
    if args.part in ("all", "switch"):
        p1, r = part1(args, tmp)
        raw.update(r)
    if args.part in ("all", "shadow"):
        p2, r = part2(args, tmp)
        raw.update(r)
    for line in machine_lines(info):
        print(line)
    print(f"settings: 1 kHz timer clock, fed at 1 kHz; part 1 {args.rounds} x (steady, switching) runs of "
          f"{args.duration:g} s, {args.switches} switches per switching run; part 2 {args.shadow_seconds:g} s each")
    if p1:
        print("\nwake-up latency / cycle time (us)        p50      p99    p99.9      max | cycle p50  p99    p99.9"
              "      max   misses skipped contiguous")
        for kind in ("steady", "switching"):
            for i, r in enumerate(p1[kind]):
                print(f"  {kind + ' ' + str(i + 1):<38} {fmt(r['wake_us'])} | {fmt(r['cycle_time_us'])} "
                      f"{r['deadline_misses']:>8} {r['skipped_ticks']:>7} {str(r['action_stream_contiguous']):>10}")
        for kind in ("steady", "switching"):
            for i, r in enumerate(p1[kind]):
                wl = r["why_late"]
                print(f"  {kind} {i + 1} why late: {wl['text']}; worst late wake-ups: "
                      + (", ".join(f"{n} {c}" for c, n in wl["late_wakes_by_cause"].items()) or "none"))
        for i, r in enumerate(p1["switching"]):
            print(f"  switching {i + 1}: {r['switches']} switches, {r['transitions_recorded']} recorded; the cycle "
                  f"after a switch: cycle time {fmt(r['switch_cycle_time_us'])} us, misses "
                  f"{r['switch_cycle_misses']}; request -> reply {fmt(r['request_to_reply_us'])} us")
    if p2:
        print("\nshadow cost per policy tick (us)            p50      p99    p99.9      max | inference-tick cycle "
              "p50 / p99 without -> with")
        for name, res in p2.items():
            w, wo = res["with"], res["without"]
            print(f"  {name:<40} {fmt(w['shadow_us'])} | {wo['cycle_time_infer_us']['p50']:.1f} / "
                  f"{wo['cycle_time_infer_us']['p99']:.1f} -> {w['cycle_time_infer_us']['p50']:.1f} / "
                  f"{w['cycle_time_infer_us']['p99']:.1f}; cycle + shadow p50 {w['cycle_plus_shadow_us']['p50']:.1f} "
                  f"p99 {w['cycle_plus_shadow_us']['p99']:.1f}")
    raw_path = save_raw("switch", raw)
    if args.json:
        write_json(args.json, {"machine": info, "settings": vars(args), "switching": p1, "shadow": p2,
                               "raw": raw_path})
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
