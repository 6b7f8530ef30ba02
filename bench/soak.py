"""control-node bench soak: the node beside the simulator at 1 kHz for a long time.

Starts ``control-node run`` (on private ipc endpoints in a temporary directory) and
``control-node sim`` streaming at 1 kHz, samples the node's RSS and open file
descriptors (psutil on the node's pid) every few seconds, stops both, and reports:
RSS growth after a warm-up, fd count (min/max), cycles, deadline misses and miss
rate, stale cycles and safe actions, from the node's summary.json and the
simulator's. Zero Python allocations on the hot path is proven separately by
tests/test_loop_core.py::test_hot_path_allocates_nothing_over_100k_cycles.

    flock /tmp/control-node-bench.lock control-node bench soak --duration 600 --json bench/results/soak-600s.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from control_node.bench.harness import CHILD_CWD, NodeProcess, write_node_config


def sample(proc_ps):
    """(t_monotonic, rss_bytes, num_fds) of the node process."""
    return time.monotonic(), proc_ps.memory_info().rss, proc_ps.num_fds()


def _settled_fds(proc_ps, timeout=5.0, step=0.1, reads=3):
    """The node's fd count once ``reads`` reads ``step`` apart agree (transient fds closed; a leaked one
    stays). Two reads were too few: a lazy import in the node's threads on a loaded host held a file open
    across them once (22 fds at the start, 21 at the end of a green soak)."""
    n, same, deadline = proc_ps.num_fds(), 1, time.monotonic() + timeout
    while same < reads and time.monotonic() < deadline:
        time.sleep(step)
        m = proc_ps.num_fds()
        same = same + 1 if m == n else 1
        n = m
    return n


def fd_targets(pid):
    """What each open fd of ``pid`` is (``/proc/PID/fd`` link targets, sorted), for the report: a count that
    differs says which file it was."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass                      # closed between the listing and the read
    return sorted(out)


def soak(duration, interval, warmup, model=None, keep=None, rate=1000.0, log=print):
    import psutil
    tmp = tempfile.mkdtemp(prefix="cn-soak-")
    cfg = os.path.join(tmp, "node.toml")
    write_node_config(cfg, tmp)
    node_dir = os.path.join(keep or tmp, "node")
    sim_dir = os.path.join(keep or tmp, "sim")
    node_p = NodeProcess(cfg, os.path.abspath(model or os.path.join("models", "iris.npz")), "--run-dir", node_dir,
                         "--quiet", ready_timeout=60)
    node = node_p.proc
    sim = None
    try:
        ps = psutil.Process(node.pid)
        # without peers, before the simulator exists, once settled: just after `ready` the node's diagnostics
        # thread may still be importing lazily (an open .pyc, e.g. numpy/ma/core.pyc), and a stall stretches it
        fds_no_peers_start = _settled_fds(ps)
        fd_targets_start = fd_targets(node.pid)
        sim = subprocess.Popen([sys.executable, "-m", "control_node", "sim", "gauss", "--config", cfg,
                                "--rate", str(rate), "--duration", str(duration), "--run-dir", sim_dir],
                               cwd=CHILD_CWD, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        t0 = time.monotonic()
        samples = []
        next_t = t0
        while True:
            now = time.monotonic()
            if now >= next_t:
                t, rss, fds = sample(ps)
                samples.append({"t_s": round(t - t0, 3), "rss_bytes": rss, "num_fds": fds,
                                "sim_running": sim.poll() is None})
                next_t += interval
            if sim.poll() is not None or node.poll() is not None:
                break
            time.sleep(min(0.2, max(0.0, next_t - time.monotonic())))
        if node.poll() is None:
            # the node's libzmq I/O thread closes a departed peer's connection asynchronously: give it up
            # to 2 s to do so before the closing "no peers" sample
            settle = time.monotonic() + 2.0
            while True:
                t, rss, fds = sample(ps)
                if fds <= samples[0]["num_fds"] or time.monotonic() >= settle:
                    break
                time.sleep(0.05)
            samples.append({"t_s": round(t - t0, 3), "rss_bytes": rss, "num_fds": fds, "sim_running": False})
        fd_targets_end = fd_targets(node.pid) if node.poll() is None else None
        sim_out = sim.communicate(timeout=60)[0]
        node.send_signal(signal.SIGTERM)
        node_out, node_err = node.communicate(timeout=60)
    finally:
        for p in (sim, node):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    with open(os.path.join(node_dir, "summary.json")) as f:
        ns = json.load(f)
    sim_summary = None
    try:
        with open(os.path.join(sim_dir, "summary.json")) as f:
            sim_summary = json.load(f)
    except OSError:
        log(sim_out)
    # the warm-up counts from the simulator's connection, for RSS as for fds: on a loaded machine its start-up
    # alone took 4 s once, and a baseline taken before it connected counts the connection's buffers as growth
    # (suspected for 4.1 MiB in a 6 s soak of a fresh-clone run, whose samples were not kept); the simulator
    # streams for `duration` after it connected
    connected = next((s["t_s"] for s in samples if s["num_fds"] > fds_no_peers_start), 0.0)
    # (``connected`` is the first sample that saw it: it connected up to one interval before)
    after = [s for s in samples if s["t_s"] >= connected + warmup] or samples[-1:]
    rss_after_warmup = after[0]["rss_bytes"]
    # fds while the simulator is connected (after the warm-up), and at the start/end without peers
    steady = [s for s in samples if s["sim_running"] and connected + warmup <= s["t_s"] <= connected + duration - interval]
    fds = [s["num_fds"] for s in steady] or [s["num_fds"] for s in samples]
    cycles = ns["cycles"]
    why_late = ns.get("why_late") or {}
    late_evidence = why_late.get("evidence") or {}
    report = {
        "duration_s": duration, "rate_hz": rate, "sample_interval_s": interval, "warmup_s": warmup,
        "node_exit_code": node.returncode, "sim_exit_code": sim.returncode,
        "node_run_duration_s": ns["duration_s"], "cycles": cycles,
        "achieved_rate_hz": ns["achieved_rate_hz"],
        "deadline_misses": ns["deadline_misses"], "skipped_ticks": ns["skipped_ticks"],
        "miss_rate": ns["deadline_misses"] / max(1, cycles + ns["skipped_ticks"]),
        "stale_cycles": ns["stale_cycles"], "safe_actions": ns["safe_actions"],
        "frames_valid": ns["frames_valid"], "superseded": ns["superseded"],
        "rejected_total": ns["rejected_total"], "send_failures": ns["send_failures"],
        "recv_errors": ns["recv_errors"],
        "wake_latency_ns": ns["wake_latency_ns"], "cycle_time_ns": ns["cycle_time_ns"],
        "rss_first_bytes": samples[0]["rss_bytes"], "rss_after_warmup_bytes": rss_after_warmup,
        "rss_last_bytes": samples[-1]["rss_bytes"], "rss_max_bytes": max(s["rss_bytes"] for s in samples),
        "rss_growth_after_warmup_bytes": samples[-1]["rss_bytes"] - rss_after_warmup,
        "fds_min": min(fds), "fds_max": max(fds), "fds_constant": min(fds) == max(fds),
        "fds_no_peers_start": fds_no_peers_start, "fds_no_peers_end": samples[-1]["num_fds"],
        "fd_targets_start": fd_targets_start, "fd_targets_end": fd_targets_end,
        "sim_connected_s": connected,
        "n_samples": len(samples),
        "rt": {k: v.get("granted") for k, v in ns.get("rt", {}).items()},
        "sim": None if sim_summary is None else {
            k: sim_summary.get(k) for k in ("frames_sent", "frames_answered", "actions_lost", "safe_actions",
                                            "accuracy", "round_trip_ns")},
        "hot_path_allocations": "none: tests/test_loop_core.py::test_hot_path_allocates_nothing_over_100k_cycles",
        # what the why-late recorder (on by default) cost, and what it said
        "why_late": {"enabled": why_late.get("enabled", False),
                     "recorder_cost": late_evidence.get("recorder_cost"),
                     "text": why_late.get("text"),
                     # the most trace evidence it held unsettled at once (a busy core's trace fills it faster
                     # than the diagnostics thread settles it): the node's memory follows this, not the run
                     "intervals_peak": (late_evidence.get("trace") or {}).get("intervals_peak")},
        "samples": samples,
    }
    if keep is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _mb(b):
    return f"{b / 2**20:.2f} MB"


def print_report(r):
    from control_node.bench.common import print_table
    sim = r["sim"] or {}
    rows = [
        ["duration / rate", f"{r['node_run_duration_s']:.1f} s at {r['rate_hz']:g} Hz"],
        ["cycles (achieved rate)", f"{r['cycles']} ({r['achieved_rate_hz']:.1f} Hz)"],
        ["deadline misses (skipped ticks)", f"{r['deadline_misses']} ({r['skipped_ticks']})"],
        ["miss rate", f"{r['miss_rate']:.2e}"],
        ["stale cycles / safe actions", f"{r['stale_cycles']} / {r['safe_actions']}"],
        ["frames valid / superseded / rejected", f"{r['frames_valid']} / {r['superseded']} / {r['rejected_total']}"],
        ["send failures / recv errors", f"{r['send_failures']} / {r['recv_errors']}"],
        ["RSS first / after warm-up / last", f"{_mb(r['rss_first_bytes'])} / {_mb(r['rss_after_warmup_bytes'])} / "
                                             f"{_mb(r['rss_last_bytes'])}"],
        ["RSS growth after warm-up", f"{r['rss_growth_after_warmup_bytes'] / 1024:+.0f} kB"],
        ["open fds after warm-up min / max", f"{r['fds_min']} / {r['fds_max']} "
                                             f"({'constant' if r['fds_constant'] else 'CHANGED'})"],
        ["open fds without peers start / end", f"{r['fds_no_peers_start']} / {r['fds_no_peers_end']}"],
        ["wake latency p99 / max", f"{r['wake_latency_ns']['p99'] / 1e3:.1f} us / {r['wake_latency_ns']['max'] / 1e3:.1f} us"],
        ["cycle time p99 / max", f"{r['cycle_time_ns']['p99'] / 1e3:.1f} us / {r['cycle_time_ns']['max'] / 1e3:.1f} us"],
        ["sim frames sent / answered / lost", f"{sim.get('frames_sent')} / {sim.get('frames_answered')} / "
                                              f"{sim.get('actions_lost')}"],
        ["sim accuracy", f"{sim.get('accuracy')}"],
        ["hot-path allocations", "none (tests/test_loop_core.py, 100k cycles, tracemalloc)"],
    ]
    wl = r.get("why_late") or {}
    cost = wl.get("recorder_cost") or {}
    if wl.get("enabled"):
        share = cost.get("share_of_one_core")
        rows.append(["why-late recorder CPU", "n/a" if share is None else
                     f"{100 * share:.1f}% of one core ({', '.join(f'{k} {v:.2f} s' for k, v in cost['threads_cpu_s'].items())})"])
        rows.append(["why late", wl.get("text") or ""])
    else:
        rows.append(["why-late recorder", "off"])
    print_table(f"soak: {r['duration_s']:g} s, {r['n_samples']} samples every {r['sample_interval_s']:g} s, "
                f"warm-up {r['warmup_s']:g} s", ["", "value"], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench soak", description=__doc__.split("\n\n")[1])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    ap.add_argument("--rate", type=float, default=1000.0, help="simulator frame rate (default 1000)")
    ap.add_argument("--interval", type=float, default=None,
                    help="seconds between RSS/fd samples (default: 5, or duration/10 for short runs)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds excluded from RSS growth (default: 30, or 20%% of short runs)")
    ap.add_argument("--model", default=None, help="model file (default: models/iris.npz in the working directory)")
    ap.add_argument("--keep", default=None, help="keep the node's and simulator's run directories here")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    a = ap.parse_args(argv)
    interval = a.interval or (5.0 if a.duration >= 60 else max(0.5, a.duration / 10))
    warmup = a.warmup if a.warmup is not None else (30.0 if a.duration >= 150 else max(3.0, 0.3 * a.duration))
    from control_node.bench.common import machine_info, write_json
    r = soak(a.duration, interval, warmup, model=a.model, keep=a.keep, rate=a.rate)
    print_report(r)
    if a.json:
        write_json(a.json, {"machine": machine_info(), "command": "control-node bench soak " + " ".join(argv or []),
                            "report": r})
        print(f"json: {a.json}")
    return 0 if r["node_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
