"""Faults and load around a RUNNING node (real processes, real sockets), and the short soak.

Faults: the simulator SIGKILLed and restarted (watchdog timing from cycles.npz, resume on the first fresh
frame), the node SIGTERMed (complete run directory) and SIGKILLed (the recorder's MCAP file stays readable,
a new node binds the same ipc endpoints), the recorder and `control-node top` killed, a subscriber that
never reads. Load: a 20 kHz sensor flood from another process, CPU hogs on both cores, a stopped node.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import psutil
import pytest
import zmq

from control_node.config import load_config
from control_node.rundir import FLAGS
from support.nodeutil import (ActionCollector, Robot, assert_answered_or_superseded, cli_popen, load_run, start_flood,
                      start_hog, start_node, stop_node)
from control_node.bench.harness import CHILD_CWD

MISS, STALE, SAFE, NEW = FLAGS["miss"], FLAGS["stale"], FLAGS["safe"], FLAGS["new_frame"]
PERIOD_NS = 1_000_000
STALE_NS = 5_000_000


def wait_for(pred, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def sim_popen(cfg, *args):
    return cli_popen("sim", "gauss", "--config", cfg, "--rate", 1000, *args)


def finish(p, sig=signal.SIGINT, timeout=15):
    if p.poll() is None:
        p.send_signal(sig)
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        out = p.communicate()[0]
    return p.returncode, out


# ---------------------------------------------------------------- a node bug, in process
# regression test, was a strict xfail until 8187681 fixed the node: BUG: Diagnostics.run has no try around a
#   snapshot: one exception kills the diagnostics thread, and with it SIGTERM/SIGINT handling (signals reach
#   the loop only through that thread), so the node no longer stops on SIGTERM. Seen for real:
#   stats.describe_hist() runs np.flatnonzero on the live histogram the nogil loop writes; a bucket going 0 ->
#   1 meanwhile makes numpy raise RuntimeError('number of non-zero array elements changed during function
#   execution.'): a node under CPU contention then ignored SIGTERM (tests/support/nodeutil.py stop_node recognises
#   this and fails the calling test with that evidence)
def test_diagnostics_error_does_not_disable_sigterm(monkeypatch):
    from control_node import node as node_mod
    from control_node import rundir

    class FakeLoop:
        cycles, capacity = 10, 16
        deadline_misses = stale_cycles = safe_actions = superseded = frames_valid = 0
        ring = {k: np.zeros(16, np.int64) for k in ("wake_latency_ns", "cycle_time_ns", "input_age_ns")}
        histograms = np.zeros((2, 8), np.int64)
        stopped = threading.Event()

        def rejected_counts(self):
            return {}

        def request_stop(self):
            self.stopped.set()

    calls = []

    def racy_describe_hist(counts):            # what np.flatnonzero raises when the loop writes meanwhile
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("number of non-zero array elements changed during function execution.")
        return {}

    monkeypatch.setattr(rundir, "describe_hist", racy_describe_hist)
    sock = zmq.Context.instance().socket(zmq.PUB)
    r, w = os.pipe()
    loop = FakeLoop()
    diag = node_mod.Diagnostics(loop, sock, {}, {"sensor": "s", "action": "a", "diagnostics": "d"}, 50.0, None, r)
    try:
        diag.start()
        time.sleep(0.3)                          # a few snapshots: the first one hits the race
        os.write(w, bytes([signal.SIGTERM]))     # what the C-level handler writes on SIGTERM
        stopped = loop.stopped.wait(2.0)
    finally:
        diag.finished.set()
        diag.join(2)
        os.close(r)
        os.close(w)
        sock.close(0)
    assert calls, "describe_hist was never called"
    assert stopped, "SIGTERM no longer reaches the loop after one failed diagnostics snapshot"


# ---------------------------------------------------------------- faults
def restart_gap(arrays, min_gap_ns=20 * PERIOD_NS):
    """Index of the last NEW_FRAME cycle of the first sender and of the first NEW_FRAME cycle of the
    restarted one (its seq starts over). Found by the seq, not by the first silence: a host stall of the
    first sender can be a silence too. The gap between them must be a real one (>= ``min_gap_ns``)."""
    new = np.flatnonzero(arrays["flags"] & NEW)
    drops = np.flatnonzero(np.diff(arrays["seq"][new].astype(np.int64)) < 0)
    assert drops.size, "the restarted sender's seq did not start over"
    last_new, resume = int(new[drops[0]]), int(new[drops[0] + 1])
    assert arrays["t_tick_ns"][resume] - arrays["t_tick_ns"][last_new] >= min_gap_ns, "no silence at the restart"
    return last_new, resume


def test_sim_sigkill_and_restart_watchdog_and_resume(tmp_path, iris_model_path):
    node, cfg = start_node(tmp_path, iris_model_path)           # default watchdog: 5 ms, safe action 0
    sims = []
    try:
        col = ActionCollector(node.endpoints["action"])
        sims.append(sim_popen(cfg, "--duration", 30, "--run-dir", tmp_path / "sim1"))
        assert wait_for(lambda: any(not a["safe"] for a in col.actions), 20), "sim never got answered"
        time.sleep(1.0)
        sims[0].kill()                                           # SIGKILL mid-run
        sims[0].wait()
        time.sleep(0.5)
        n_before = len(col.actions)
        sims.append(sim_popen(cfg, "--duration", 1.5, "--run-dir", tmp_path / "sim2"))
        rc2 = sims[1].wait(60)
        out2 = sims[1].stdout.read()
        time.sleep(0.1)
        actions = col.close()
    finally:
        for p in sims:
            if p.poll() is None:
                p.kill()
                p.wait()
    rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    assert rc2 == 0, out2
    summary, a = load_run(run_dir)
    flags, tick = a["flags"], a["t_tick_ns"]
    wake = tick + a["wake_latency_ns"]
    last_new, resume = restart_gap(a)
    stale_idx = np.flatnonzero(flags[last_new:] & STALE) + last_new
    first_stale = int(stale_idx[0])
    # the watchdog counts from the wake of the cycle that took the last frame (the loop's last_rx), not from
    # that cycle's tick: a host stall can hold the cycle, and the frame, back (a fresh-clone run: cycle last_new
    # woke 49.1 ms late, 48 ticks skipped, and a tick-to-tick delay of 55 ms broke a tick-based bound of 54 ms
    # while the watchdog was exact). So the first stale cycle wakes no later than stale_after + one period after
    # that wake, plus its own wake latency and any ticks skipped after it.
    delay = int(wake[first_stale] - wake[last_new])
    skipped = int(summary["skipped_ticks"]) if (flags[last_new + 1:first_stale + 1] & MISS).any() else 0
    bound = STALE_NS + PERIOD_NS + int(a["wake_latency_ns"][first_stale]) + skipped * PERIOD_NS
    print(f"watchdog: last frame at cycle {last_new}, first stale cycle {first_stale}, "
          f"{delay / 1e6:.3f} ms later (bound {bound / 1e6:.3f} ms)")
    assert delay <= bound, (delay, bound)
    # ... and exactly by the rule: every cycle more than stale_after after that wake is stale + safe
    gap = slice(last_new + 1, resume)
    late = (wake[gap] - wake[last_new]) > STALE_NS
    assert np.all(flags[gap][late] & STALE) and np.all(flags[gap][late] & SAFE)
    assert not np.any(flags[gap][~late] & STALE)
    # the safe action (class 0) was published while stale
    assert np.all(a["action"][gap][late] == 0)
    # resume: the restarted simulator's first frame (its seq starts again) is answered by the policy
    assert not flags[resume] & STALE and not flags[resume] & SAFE
    assert a["seq"][resume] < a["seq"][last_new]
    after = [x for x in actions[n_before:] if not x["safe"]]
    assert after, "no policy action after the restart"
    # the run directory is complete after SIGTERM
    for f in ("summary.json", "cycles.npz", "histograms.npz"):
        assert os.path.exists(os.path.join(run_dir, f))
    assert summary["stop"]["signal"] == "SIGTERM"
    assert len(a["cycle"]) == summary["cycles"]


def test_node_sigkill_recording_readable_and_restart_serves(tmp_path, iris_model_path):
    from mcap.reader import make_reader
    node, cfg = start_node(tmp_path, iris_model_path)
    mcap_path = tmp_path / "rec.mcap"
    rec = cli_popen("record", "--config", cfg, "--out", mcap_path)
    sim = sim_popen(cfg, "--duration", 30, "--tap", "--run-dir", tmp_path / "sim", "--timeout", 30)
    try:
        line = rec.stdout.readline()
        assert line.startswith("recording to "), line
        col = ActionCollector(node.endpoints["action"])
        assert wait_for(lambda: sum(not a["safe"] for a in col.actions) > 300, 20)
        col.close()
        node.proc.kill()                                         # SIGKILL: no clean-up at all
        node.proc.communicate()
        time.sleep(0.3)
        # the ipc socket files are left behind
        leftovers = [p for p in ("sensor", "action", "diagnostics") if os.path.exists(tmp_path / p)]
        rc_rec, out_rec = finish(rec, signal.SIGINT)
        assert rc_rec == 0, out_rec
        with open(mcap_path, "rb") as f:
            reader = make_reader(f)
            counts = {}
            for _s, ch, m in reader.iter_messages():
                msgpack.unpackb(m.data)
                counts[ch.topic] = counts.get(ch.topic, 0) + 1
        print(f"recording after node SIGKILL: {counts}; ipc files left behind: {leftovers}")
        # the recorder joined the node's topics when it said so, but ZeroMQ may still have been carrying its
        # subscription: it holds most, not all, of the >300 the collector saw (299 once on a loaded host)
        assert counts.get("/action", 0) > 100 and counts.get("/sensor", 0) > 100, counts
        # a new node on the same ipc endpoints serves again, the still running simulator reconnects
        node2, _ = start_node(tmp_path, iris_model_path)
        col = ActionCollector(node2.endpoints["action"])
        ok = wait_for(lambda: sum(not a["safe"] for a in col.actions) > 100, 20)
        col.close()
        rc, out, err, run_dir = stop_node(node2)
        assert ok, "restarted node did not serve the simulator"
        assert rc == 0, err
        summary, _ = load_run(run_dir)
        assert summary["frames_valid"] > 100
    finally:
        for p in (sim, rec):
            if p.poll() is None:
                p.kill()
                p.communicate()
        node.kill()


@pytest.mark.slow
def test_recorder_and_top_killed_node_does_not_notice(tmp_path, iris_model_path):
    node, cfg = start_node(tmp_path, iris_model_path, extra="[diagnostics]\nattribution = true\n", spin_us=None)
    sim = sim_popen(cfg, "--duration", 6, "--tap", "--run-dir", tmp_path / "sim", "--timeout", 30)
    rec = cli_popen("record", "--config", cfg, "--out", tmp_path / "rec.mcap")
    top = cli_popen("top", "--config", cfg)
    try:
        assert rec.stdout.readline().startswith("recording to ")
        time.sleep(2.0)
        t_kill = time.monotonic_ns()
        rec.kill()
        top.kill()
        rec.wait()
        top.wait()
        assert sim.wait(60) == 0
    finally:
        for p in (sim, rec, top):
            if p.poll() is None:
                p.kill()
                p.wait()
    rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    summary, a = load_run(run_dir)
    after = a["t_tick_ns"] >= t_kill
    win = after & (a["t_tick_ns"] < t_kill + 500_000_000)
    # a host stall in that half second is not the kill's doing, nor another process on the loop's core (other
    # tests' processes, 4 misses in the window once): leave out the misses the node's own attribution puts
    # down to the hypervisor (its timer interrupt came late) or to a task or interrupt it saw on the core. What
    # the kill could do (a send blocking on a dead peer) is the loop's own work: those misses stay counted
    foreign = ("hypervisor", "task ", "page faults in task ", "irq ", "softirq ", "vector ")
    elsewhere = {e["cycle"] for e in summary["why_late"]["events"] if e["cause"].startswith(foreign)}
    misses = a["cycle"][win & ((a["flags"] & MISS) != 0)]
    misses_near = int(sum(1 for c in misses.tolist() if c not in elsewhere))
    print(f"after killing recorder+top: {int(after.sum())} cycles, {misses_near} misses in the next 0.5 s, "
          f"{summary['deadline_misses']} misses in the run, send_failures {summary['send_failures']}")
    assert after.sum() > 1000                                     # kept cycling (and publishing)
    assert np.all(np.diff(a["cycle"]) == 1)
    assert summary["send_failures"] == 0 and summary["recv_errors"] == 0
    # the kill's doing would be a window worse than the run around it: a loaded host (three test workers beside
    # it) made 360 misses in one run, 3 of them in the window, so a fixed "<= 2" checked the host
    run_s = (int(a["t_tick_ns"][-1]) - int(a["t_tick_ns"][0])) / 1e9
    missed = a["cycle"][(a["flags"] & MISS) != 0]
    outside = sum(1 for c in missed.tolist() if c not in elsewhere) - misses_near
    per_window = outside / max(run_s - 0.5, 0.5) * 0.5
    assert misses_near <= 2 + 2 * per_window, (misses_near, outside, run_s)
    # the simulator, the node's real client, kept being answered through the kill
    assert_client_answered_through(tmp_path / "sim", summary, a, t_kill)


def assert_client_answered_through(sim_dir, summary, a, t_kill):
    """The sim's frames were answered or superseded (support.nodeutil.assert_answered_or_superseded), except a
    tail the node never received, which counts only when the node kept taking frames after ``t_kill`` until
    the sim's last second. A run (.ci/run, 4 workers) had ZeroMQ delivery starved for 0.3-0.9 s on the loaded
    host while the loop ran on time: the sim's frames 5555-6000 (sent every ms) were still in flight when it
    closed its socket, the last one the node took (5554, sent at 6.61 s) arrived at 7.53 s, and those 446 were
    exactly the frames neither answered nor superseded (answered 2562 + superseded 2991 of 6000). A node that
    stopped receiving at the kill takes its last frame near the kill, not in the sim's last second."""
    sim_summary = json.load(open(sim_dir / "summary.json"))
    rt = np.load(sim_dir / "roundtrip.npz")
    taken = a["seq"][(a["flags"] & NEW) != 0]
    last_taken = int(taken.max())
    sent_seq, t_send = rt["seq"], rt["t_send_ns"]
    k = np.flatnonzero(sent_seq == last_taken)
    assert k.size, f"the node's last frame {last_taken} is not one the sim sent"
    t_last_taken, t_last_sent = int(t_send[k[0]]), int(t_send[t_send > 0].max())
    assert t_last_taken > t_kill and t_last_sent - t_last_taken <= 1_000_000_000, (
        f"the node's last frame ({last_taken}) was sent {(t_last_sent - t_last_taken) / 1e9:.3f} s before the "
        f"sim's last ({(t_last_taken - t_kill) / 1e9:.3f} s after the kill): it stopped receiving")
    in_flight = int(((sent_seq > last_taken) & (t_send > 0)).sum())
    assert_answered_or_superseded(sim_summary, summary, in_flight=in_flight,
                                  why_in_flight=f"sent after the last frame the node took, {last_taken}")


def test_subscriber_that_never_reads_does_not_block(tmp_path, iris_model_path):
    node, cfg = start_node(tmp_path, iris_model_path)
    ctx = zmq.Context.instance()
    deaf = []
    for ep in ("action", "diagnostics"):
        for _ in range(3):
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RCVBUF, 4096)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.setsockopt(zmq.LINGER, 0)
            s.connect(node.endpoints[ep])
            deaf.append(s)
    sim = sim_popen(cfg, "--duration", 3, "--run-dir", tmp_path / "sim", "--timeout", 30)
    try:
        assert sim.wait(60) == 0
    finally:
        if sim.poll() is None:
            sim.kill()
        for s in deaf:
            s.close(0)
    rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    summary, a = load_run(run_dir)
    sim_summary = json.load(open(tmp_path / "sim" / "summary.json"))
    print(f"never-reading subscribers: cycles {summary['cycles']} over {summary['duration_s']:.2f} s, "
          f"misses {summary['deadline_misses']}, send_failures {summary['send_failures']}; sim answered "
          f"{sim_summary['frames_answered']}/{sim_summary['frames_sent']}")
    expected = summary["duration_s"] * 1000
    assert summary["cycles"] + summary["skipped_ticks"] >= 0.98 * expected - 5
    # PUB drops for a full subscriber queue: nothing fails at the sender (send_failures stays 0)
    assert summary["send_failures"] == 0
    assert_answered_or_superseded(sim_summary, summary)


# ---------------------------------------------------------------- load
@pytest.mark.slow
def test_sensor_flood_20khz(tmp_path, iris_model_path, policy):
    node, cfg = start_node(tmp_path, iris_model_path, spin_us=None)
    robot = Robot(node.endpoints)
    X = policy.spec.check_X
    try:
        robot.connect(X[0], timeout=20)
        ps = psutil.Process(node.proc.pid)
        time.sleep(0.5)
        rss0 = ps.memory_info().rss
        flood = start_flood(node.endpoints["sensor"], 20000, 4.0, 1000, X[:30])
        out, err = flood.communicate(timeout=60)
        assert flood.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        time.sleep(0.2)
        rss1 = ps.memory_info().rss
    finally:
        robot.close()
    rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    summary, a = load_run(run_dir)
    flags, seq = a["flags"], a["seq"]
    new = (flags & NEW) != 0
    flood_cycles = new & (seq >= 1000)
    answered = seq[flood_cycles]
    tick = a["t_tick_ns"]
    span = tick[flood_cycles]
    dur = (span[-1] - span[0]) / 1e9
    in_span = (tick >= span[0]) & (tick <= span[-1])
    age = a["input_age_ns"][flood_cycles]
    step = np.diff(answered)
    print(f"flood: sent {report['sent']} in {report['elapsed_s']:.2f} s ({report['sent'] / report['elapsed_s']:.0f}/s, "
          f"{report['send_dropped']} dropped at the sender); node frames_valid {summary['frames_valid']}, "
          f"superseded {summary['superseded']}, answered {int(new.sum())}; cycles in the flood "
          f"{int(in_span.sum())} over {dur:.2f} s; seq step median {np.median(step):.0f}; input age p50 "
          f"{np.median(age) / 1e3:.0f} us p99 {np.percentile(age, 99) / 1e3:.0f} us; misses "
          f"{summary['deadline_misses']}; RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MB")
    assert report["sent"] / report["elapsed_s"] > 15000                # it really was ~20 kHz
    # the loop kept ~1 kHz through the flood
    assert in_span.sum() + summary["skipped_ticks"] >= 0.95 * dur * 1000
    # newest frame always: answered seqs strictly increase, as far apart as the frames sent between, and fresh
    assert np.all(step > 0)
    # newest, not next: each answered frame is ~ the frames the flood sent since the previous answer's tick (its
    # average rate times the ticks' gap), so a host stall that spaces the cycles out spaces the seqs out with them
    # (a fixed "<= 30 frames" failed at 31 on a loaded host)
    per_ms = report["sent"] / report["elapsed_s"] / 1000
    expected = per_ms * np.diff(span) / 1e6
    ratio = np.median(step / expected)
    assert 0.5 <= ratio <= 2, (ratio, np.median(step), per_ms)
    # fresh: answering the next frame instead, the node would work through its full sensor queue (RCVHWM 1000
    # frames = 50 ms at 20 kHz); a bound of 10 ms leaves a loaded host's sender room (1.16 ms median was seen
    # with a CPU hog beside the suite; 1 ms was the bound then)
    assert np.median(age) < 10_000_000
    # every frame counted once: answered + superseded = accepted; accepted ~ received
    assert int(new.sum()) + summary["superseded"] == summary["frames_valid"]
    assert summary["frames_valid"] <= report["sent"] + robot.seq
    # accepted ~ sent, unless the receive side was starved: frames past the full receive queue (limits.recv_hwm)
    # are dropped by libzmq before the node can count them, and only a receive side that stopped draining loses
    # them; its evidence is an answered frame older than a full queue's span (a fresh-clone run with three test
    # workers: 8352 of 79999 accepted, input age p99 823 ms against the queue's 50 ms)
    recv_hwm = load_config(cfg)["limits"]["recv_hwm"]
    queue_span_ns = recv_hwm / per_ms * 1e6
    starved = float(np.max(age)) > queue_span_ns
    assert summary["frames_valid"] >= 0.95 * report["sent"] or starved, (summary["frames_valid"], report["sent"],
                                                                          float(np.max(age)), queue_span_ns)
    assert summary["rejected_total"] == 0
    # memory bounded by the receive queue, whatever the host did. Frames queue in libzmq whenever the node's I/O
    # thread or its loop falls behind the sender, and each queued frame can pin one 8 kB receive batch (libzmq's
    # zero-copy decoder) plus its message and pipe slot; the loop drains the whole queue every cycle, so at most
    # one full queue (limits.recv_hwm frames) is held at once, and the allocator keeps that high-water resident
    # under mlockall. The allowance is that one queue, not the node's stall record: CI saw 5.1 MB of growth with
    # no skipped tick and one late wake (the I/O thread, on the core the suite shares, fell behind on its own)
    queue_bytes = recv_hwm * (8192 + 9960)      # a batch + the message, pipe slot and allocator overhead (the
                                                # per-frame figure of the earlier per-stall allowance, kept)
    assert abs(rss1 - rss0) < 4 * 2**20 + queue_bytes, (rss1 - rss0, queue_bytes)


def _report_text(run_dir):
    r = subprocess.run([sys.executable, "-m", "control_node", "report", run_dir, "--no-plots"], cwd=CHILD_CWD,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    return r.stdout


def _misses_in_report(text):
    for line in text.splitlines():
        if "deadline misses" in line:
            return int(line.replace("│", " ").split()[2])
    raise AssertionError("no 'deadline misses' line in the report:\n" + text)


@pytest.mark.slow
def test_cpu_hogs_and_stall_misses_counted_honestly(tmp_path, iris_model_path):
    """Busy loops on the other core and on the node's core, then the node stopped (SIGSTOP) for 50 ms:
    misses appear in summary.json, in cycles.npz and in `control-node report`, and agree."""
    node, cfg = start_node(tmp_path, iris_model_path, spin_us=None)
    ncpu = os.cpu_count()
    loop_cpu = ncpu - 1                                          # realtime.cpu = "last"
    hogs = []
    sim = sim_popen(cfg, "--duration", 7, "--run-dir", tmp_path / "sim", "--timeout", 30)
    try:
        time.sleep(1.5)
        hogs.append(start_hog(0 if loop_cpu != 0 else None))    # the other core
        time.sleep(1.5)
        hogs.append(start_hog(loop_cpu))                         # the node's own core
        time.sleep(1.5)
        for h in hogs:
            h.kill()
            h.wait()
        hogs = []
        t_stop = time.monotonic_ns()
        os.kill(node.proc.pid, signal.SIGSTOP)                   # a 50 ms stall nobody can hide
        time.sleep(0.05)
        os.kill(node.proc.pid, signal.SIGCONT)
        assert sim.wait(60) == 0
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        if sim.poll() is None:
            sim.kill()
            sim.wait()
    rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    summary, a = load_run(run_dir)
    flags = a["flags"]
    miss_flags = int(((flags & MISS) != 0).sum())
    # honest: every recorded cycle that ended after its deadline is flagged, and the total is flags + skips
    late = a["wake_latency_ns"] + a["cycle_time_ns"] > PERIOD_NS
    assert np.array_equal(late, (flags & MISS) != 0)
    assert summary["deadline_misses"] == miss_flags + summary["skipped_ticks"]
    # the stall: ~50 ticks skipped, each a miss
    assert summary["skipped_ticks"] >= 40, summary["skipped_ticks"]
    after_stop = a["t_tick_ns"] >= t_stop
    text = _report_text(run_dir)
    print(f"hogs + 50 ms SIGSTOP: misses {summary['deadline_misses']} (flagged cycles {miss_flags}, skipped "
          f"ticks {summary['skipped_ticks']}), wake p99.9 {summary['wake_latency_ns']['p999'] / 1e3:.1f} us, "
          f"max {summary['wake_latency_ns']['max'] / 1e3:.0f} us; report says {_misses_in_report(text)}")
    assert after_stop.any()
    assert _misses_in_report(text) == summary["deadline_misses"]


# ---------------------------------------------------------------- soak (short)
@pytest.mark.slow
def test_soak_short(tmp_path, iris_model_path):
    out_json = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "control_node", "bench", "soak", "--duration", "6",
                        "--model", str(iris_model_path),
                        "--json", str(out_json)], cwd=CHILD_CWD, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RSS growth after warm-up" in r.stdout and "deadline misses" in r.stdout
    rep = json.load(open(out_json))["report"]
    for k in ("cycles", "deadline_misses", "miss_rate", "stale_cycles", "safe_actions", "rss_after_warmup_bytes",
              "rss_growth_after_warmup_bytes", "fds_min", "fds_max", "fds_constant", "samples",
              "hot_path_allocations"):
        assert k in rep, k
    assert rep["node_exit_code"] == 0 and rep["sim_exit_code"] == 0
    assert rep["fds_constant"], rep["samples"]
    assert rep["fds_no_peers_start"] == rep["fds_no_peers_end"], (rep["fd_targets_start"], rep["fd_targets_end"])
    assert rep["cycles"] > 5000
    # no leak: the growth stays within 4 MiB plus what the why-late recorder held unsettled at its peak (a
    # bounded deque of trace intervals, ~250 B each as Python tuples; the allocator keeps the pages): on a loaded
    # host its thread lags the trace of a busy core (6.4 MB of growth once, samples not kept then)
    peak = rep["why_late"]["intervals_peak"] or 0
    assert abs(rep["rss_growth_after_warmup_bytes"]) < 4 * 2**20 + 256 * peak, \
        (rep["rss_growth_after_warmup_bytes"], peak, rep["sim_connected_s"], json.dumps(rep["samples"]))
