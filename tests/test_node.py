"""The node as users run it: a real process, real ZeroMQ sockets, the real compiled kernel."""
from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest

from support.nodeutil import write_node_config, Robot, start_node
from control_node.bench.harness import CHILD_CWD, run_cli


def start(tmp_path, model, transport="ipc", extra="", args=()):
    return start_node(tmp_path, model, extra=extra, args=args, transport=transport, spin_us=None)[0]


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_actions_equal_policy_predict(tmp_path, iris_model_path, policy, transport):
    node = start(tmp_path, iris_model_path, transport, "[watchdog]\nstale_after_ms = 2000.0\n")
    robot = Robot(node.endpoints)
    try:
        X = policy.spec.check_X
        robot.connect(X[0])
        for i, x in enumerate(X):
            seq = robot.send(x, binary=(i % 2 == 1))       # both encodings of x
            a = robot.wait_answer(seq)
            assert a is not None, f"frame {seq} not answered"
            assert a["safe"] is False
            assert a["action"] == policy.predict(np.ascontiguousarray(x)), f"sample {i}"
            assert set(a) == {"seq", "t_ns", "cycle", "action", "safe"}
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["frames_valid"] >= len(X)
    assert summary["rejected_total"] == 0


def test_watchdog_trips_and_recovers(tmp_path, iris_model_path, policy):
    node = start(tmp_path, iris_model_path, extra="[watchdog]\nstale_after_ms = 5.0\nsafe_action = 2\n"
                 "[budget]\nwake_latency_p99_us = 50.0\ndeadline_misses = 3\n")
    robot = Robot(node.endpoints)
    try:
        x_setosa = np.array([5.1, 3.5, 1.4, 0.2])            # iris sample 0, a setosa
        assert policy.predict(np.ascontiguousarray(x_setosa)) == 0
        robot.connect(x_setosa)
        seq = robot.send(x_setosa)
        assert robot.wait_answer(seq)["safe"] is False
        quiet = robot.after_the_trip()                      # no frames: the watchdog trips, then stays tripped
        assert len(quiet) > 1, "the node stopped publishing while stale"
        assert all(a["safe"] and a["action"] == 2 for a in quiet)
        seq = robot.send(x_setosa)                          # the first fresh frame resumes the policy
        a = robot.wait_answer(seq)
        assert a is not None and a["safe"] is False and a["action"] == 0
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["stale_cycles"] > 0 and summary["safe_actions"] > 0
    # the config's [budget] reaches the run's summary (cycle time: 0 = one period)
    assert summary["budget"] == {"wake_latency_p99_ns": 50_000, "cycle_time_max_ns": summary["period_ns"],
                                 "deadline_misses": 3}


def _bad_frames(seq_ok, t):
    x = [5.1, 3.5, 1.4, 0.2]
    good = {"seq": seq_ok, "t_ns": t, "x": x}
    packed = msgpack.packb(good)
    return {
        "malformed": [b"\xc1", packed[:-3], packed + b"\x00"],
        "not_a_map": [msgpack.packb([1, 2, 3]), msgpack.packb("frame")],
        "missing_field": [msgpack.packb({"seq": seq_ok, "t_ns": t}), msgpack.packb({"t_ns": t, "x": x})],
        "wrong_type": [msgpack.packb({"seq": "one", "t_ns": t, "x": x}),
                       msgpack.packb({"seq": seq_ok, "t_ns": t, "x": "text"}),
                       msgpack.packb({"seq": -4, "t_ns": t, "x": x}),
                       msgpack.packb({"seq": seq_ok, "t_ns": t, "x": [1.0, "a", 2.0, 3.0]})],
        "feature_count": [msgpack.packb({"seq": seq_ok, "t_ns": t, "x": x[:3]}),
                          msgpack.packb({"seq": seq_ok, "t_ns": t, "x": np.zeros(5).tobytes()})],
        "non_finite": [msgpack.packb({"seq": seq_ok, "t_ns": t, "x": [float("nan"), 1.0, 1.0, 1.0]}),
                       msgpack.packb({"seq": seq_ok, "t_ns": t, "x": [1.0, float("inf"), 1.0, 1.0]})],
        "oversized": [msgpack.packb({"seq": seq_ok, "t_ns": t, "x": x, "pad": b"0" * 5000})],
    }


def test_bad_frames_counted_and_good_frames_answered(tmp_path, iris_model_path, policy):
    node = start(tmp_path, iris_model_path, extra="[watchdog]\nstale_after_ms = 2000.0\n")
    robot = Robot(node.endpoints)
    X = policy.spec.check_X
    sent = {}
    try:
        robot.connect(X[0])
        k = 0
        for reason, frames in _bad_frames(10**9, time.monotonic_ns()).items():
            for frame in frames:
                robot.send_raw(frame)
                sent[reason] = sent.get(reason, 0) + 1
                x = X[k % len(X)]
                k += 1
                seq = robot.send(x)                         # a good frame right behind each bad one
                a = robot.wait_answer(seq)
                assert a is not None and not a["safe"], f"good frame after {reason} not answered"
                assert a["action"] == policy.predict(np.ascontiguousarray(x))
        # multipart: a valid frame with an extra part is still rejected
        robot.send_raw(msgpack.packb({"seq": robot.seq + 1, "t_ns": 1, "x": list(X[0])}), more=[b"extra"])
        sent["multipart"] = 1
        # seq repeating and going backwards
        seq = robot.send(X[1])
        assert robot.wait_answer(seq) is not None
        robot.send(X[2], seq=seq)
        robot.send(X[2], seq=seq - 5)
        sent["seq_not_increasing"] = 2
        seq = robot.send(X[3], seq=seq + 1)
        a = robot.wait_answer(seq)
        assert a is not None and a["action"] == policy.predict(np.ascontiguousarray(X[3]))
        # huge finite inputs overflow the logits: safe action, never garbage
        seq = robot.send([1e308, -1e308, 1e308, -1e308])
        a = robot.wait_answer(seq)
        assert a is not None and a["safe"] is True
        sent["non_finite_output"] = 1
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    rejected = {k: v for k, v in summary["rejected"].items() if v}
    assert rejected == sent
    assert summary["rejected_total"] == sum(sent.values())


def test_sigterm_writes_complete_run_dir(tmp_path, iris_model_path):
    node = start(tmp_path, iris_model_path, args=["--run-dir", tmp_path / "run1"])
    time.sleep(0.3)
    rc, out, err, run_dir = node.stop(signal.SIGTERM)
    assert rc == 0, err
    assert os.path.realpath(run_dir) == os.path.realpath(tmp_path / "run1")
    summary = json.load(open(tmp_path / "run1" / "summary.json"))
    for key in ("cycles", "deadline_misses", "stale_cycles", "rejected", "superseded", "wake_latency_ns",
                "cycle_time_ns", "input_age_ns", "rt", "model", "config", "host", "process", "ring"):
        assert key in summary, key
    for key in ("p50", "p90", "p99", "p999", "max"):
        assert key in summary["wake_latency_ns"]
    assert summary["stop"]["signal"] == "SIGTERM"
    assert set(summary["rt"]) == {"cpu", "sched", "mlock", "gc", "cpu_dma_latency", "isolation"}
    assert summary["rt"]["isolation"]["requested"] is False
    arrays = np.load(tmp_path / "run1" / "cycles.npz")
    assert summary["cycles"] > 0
    assert len(arrays["cycle"]) == summary["cycles"]
    assert np.array_equal(arrays["cycle"], np.arange(summary["cycles"]))
    # the percentiles in the summary are numpy's over the raw arrays
    assert summary["wake_latency_ns"]["p99"] == pytest.approx(np.percentile(arrays["wake_latency_ns"], 99))


def test_sensor_clock_answers_each_frame_once(tmp_path, iris_model_path, policy):
    """Lockstep frames on the sensor clock: each answered once, with the policy's action, and every safe action
    is the watchdog's: the node's record shows it a full stale_after_ms after the cycle that took the last frame,
    carrying that frame's seq. A fresh-clone run had a safe action mid-sequence: frame 15 reached the node
    1.403 s after it was stamped (the host starved this process or ZeroMQ's I/O thread), so the node, having
    no frame for 1.000 s, tripped rightly; asserting "no safe action before the last frame" checked the host."""
    from control_node.rundir import FLAGS
    from support.nodeutil import load_run, stop_node
    stale_ns = 1_000_000_000
    node = start(tmp_path, iris_model_path, extra="[watchdog]\nstale_after_ms = 1000.0\n", args=["--clock", "sensor"])
    robot = Robot(node.endpoints)
    try:
        X = policy.spec.check_X
        robot.connect(X[0])
        robot.actions(timeout=0.05)
        seen = []
        for x in X[:30]:                                    # lockstep: each frame alone in the socket
            seq = robot.send(x)
            got, deadline = [], time.monotonic() + 2.0
            while not any(a["seq"] == seq and not a["safe"] for a in got):
                assert time.monotonic() < deadline, f"frame {seq} not answered"
                got += robot.actions(timeout=0.005)
            seen += got
            a = next(a for a in got if a["seq"] == seq and not a["safe"])
            assert a["action"] == policy.predict(np.ascontiguousarray(x))
        seen += robot.after_the_trip()                      # no frame after the last: the watchdog trips
        answers = [a["seq"] for a in seen if not a["safe"]]
        assert len(answers) == len(set(answers)) == 30      # one action per frame, none repeated
        assert seen[-1]["safe"] and seen[-1]["seq"] == robot.seq
    finally:
        robot.close()
        rc, _, err, run_dir = stop_node(node)
    assert rc == 0, err
    _, rec = load_run(run_dir)
    new, stale = (rec["flags"] & FLAGS["new_frame"]) != 0, (rec["flags"] & FLAGS["stale"]) != 0
    for i in np.flatnonzero(stale):
        took = np.flatnonzero(new[:i])[-1]                  # the cycle that took the last frame before it
        waited = int(rec["t_tick_ns"][i] - rec["t_tick_ns"][took])
        assert waited >= stale_ns and rec["seq"][i] == rec["seq"][took], (
            f"cycle {i} tripped {waited / 1e6:.3f} ms after cycle {took} took frame {rec['seq'][took]} "
            f"(seq {rec['seq'][i]}), watchdog {stale_ns / 1e6:.0f} ms")
    tripped = set(rec["seq"][stale].tolist())
    assert {a["seq"] for a in seen if a["safe"]} <= tripped, "safe actions the node's record has no trip for"


@pytest.mark.parametrize("text,field", [
    ('[loop]\nrate_hz = "fast"\n', "loop.rate_hz"),
    ('[loop]\nrat_hz = 500\n', "loop.rat_hz"),
    ('[loop]\nclock = "wall"\n', "loop.clock"),
    ('[watchdog]\nsafe_action = -1\n', "watchdog.safe_action"),
    ('[realtime]\npriority = 120\n', "realtime.priority"),
    ('[budget]\ndeadline_misses = -1\n', "budget.deadline_misses"),
    ('[budget]\nwake_latency_p99_us = 0\n', "budget.wake_latency_p99_us"),
    ('[endpoints]\nsensor = "udp://x"\n', "endpoints.sensor"),
    ('[loop\n', "(syntax)"),
])
def test_bad_config_fails_naming_the_field(tmp_path, iris_model_path, text, field):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    r = run_cli("run", "--config", cfg, "--model", iris_model_path, "--duration", "1")
    assert r.returncode == 2
    assert f"field '{field}'" in r.stderr and "Fix:" in r.stderr
    assert "Traceback" not in r.stderr


def test_safe_action_outside_the_model_fails(tmp_path, iris_model_path):
    cfg = tmp_path / "n.toml"
    write_node_config(cfg, tmp_path, extra="[watchdog]\nsafe_action = 7\n")
    r = run_cli("run", "--config", cfg, "--model", iris_model_path, "--duration", "1")
    assert r.returncode == 2 and "watchdog.safe_action" in r.stderr


def test_bad_model_fails_naming_the_field(tmp_path, iris_model_path):
    data = dict(np.load(iris_model_path))
    data["scale"] = np.zeros_like(data["scale"])
    bad = tmp_path / "bad.npz"
    np.savez(bad, **data)
    cfg = tmp_path / "n.toml"
    write_node_config(cfg, tmp_path)
    r = run_cli("run", "--config", cfg, "--model", bad, "--duration", "1")
    assert r.returncode == 2 and "field 'scale'" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("run", "--config", cfg, "--model", tmp_path / "missing.npz", "--duration", "1")
    assert r.returncode == 2 and "control-node train" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("prlimit"),
                    reason="needs root with setpriv and prlimit (util-linux) to take privileges away")
def test_runs_degraded_without_rt_privileges_and_says_so(tmp_path, iris_model_path):
    """Without CAP_SYS_NICE and with a tiny RLIMIT_MEMLOCK the node still runs and reports what it lacked."""
    cfg = tmp_path / "n.toml"
    write_node_config(cfg, tmp_path)
    r = subprocess.run(["setpriv", "--bounding-set=-sys_nice,-ipc_lock", "--inh-caps=-sys_nice,-ipc_lock",
                        "prlimit", "--memlock=65536", sys.executable, "-m", "control_node", "run", "--config", cfg,
                        "--model", iris_model_path, "--duration", "0.5", "--run-dir", tmp_path / "run"],
                       cwd=CHILD_CWD, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "sched=no" in r.stderr and "mlock=no" in r.stderr     # the start-up line says it
    rt = json.load(open(tmp_path / "run" / "summary.json"))["rt"]
    assert rt["sched"]["granted"] is False and "Operation not permitted" in rt["sched"]["detail"]
    assert rt["mlock"]["granted"] is False and "RLIMIT_MEMLOCK" in rt["mlock"]["detail"]
    assert rt["cpu"]["granted"] is True
