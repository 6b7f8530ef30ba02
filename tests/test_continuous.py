"""Continuous policies end to end (protocol v2): real node processes, real sockets, the compiled kernel.

The node publishes ``{"seq", "t_ns", "cycle", "u": [float64 x n_actions], "safe"}`` for a continuous policy
and the v1 ``action`` map, unchanged byte for byte, for an argmax one (docs/protocol.md)."""
from __future__ import annotations

import json
import math
import os
import struct
import time

import msgpack
import numpy as np
import pytest
import zmq

from support.nodeutil import write_node_config, Robot, start_node
from control_node.bench.harness import run_cli
from control_node.kernels import Policy
from control_node.loop._rtloop import action_u_bytes, encode_action, encode_action_u

V2_KEYS = ["seq", "t_ns", "cycle", "u", "safe"]


def start(tmp_path, model, transport="ipc", extra="", args=()):
    return start_node(tmp_path, model, extra=extra, args=args, transport=transport)[0]


def raw_actions(robot, timeout):
    """Every action (raw bytes) received within ``timeout`` seconds."""
    out, deadline = [], time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not robot.sub.poll(int(left * 1000) + 1):
            return out
        out.append(robot.sub.recv())


def bits(values):
    return [struct.pack(">d", float(v)) for v in values]


def within(got, want, atol):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return bool((np.abs(got - want) <= atol * np.maximum(1.0, np.abs(want))).all())


def v1_reference_bytes(seq, t_ns, cycle, action, safe):
    """The v1 action message exactly as docs/protocol.md lays it out (independent of the C encoder)."""
    seq_part = b"\xcf" + struct.pack(">Q", seq) if seq >= 0 else b"\xd3" + struct.pack(">q", -1)
    return (b"\x85" + b"\xa3seq" + seq_part + b"\xa4t_ns\xd3" + struct.pack(">q", t_ns)
            + b"\xa5cycle\xcf" + struct.pack(">Q", cycle) + b"\xa6action\xd3" + struct.pack(">q", action)
            + b"\xa4safe" + (b"\xc3" if safe else b"\xc2"))


def v2_reference_bytes(seq, t_ns, cycle, u, safe):
    """The v2 action message exactly as docs/protocol.md lays it out."""
    n = len(u)
    seq_part = b"\xcf" + struct.pack(">Q", seq) if seq >= 0 else b"\xd3" + struct.pack(">q", -1)
    head = bytes([0x90 | n]) if n <= 15 else b"\xdc" + struct.pack(">H", n)
    return (b"\x85" + b"\xa3seq" + seq_part + b"\xa4t_ns\xd3" + struct.pack(">q", t_ns)
            + b"\xa5cycle\xcf" + struct.pack(">Q", cycle) + b"\xa1u" + head
            + b"".join(b"\xcb" + struct.pack(">d", v) for v in u) + b"\xa4safe" + (b"\xc3" if safe else b"\xc2"))


# ---- the node's answers equal Policy.act on the same frames ----

@pytest.mark.parametrize("transport", ["ipc", "tcp"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_continuous_actions_equal_policy_act(tmp_path, continuous_model_path, continuous_f64_model_path, transport,
                                             dtype):
    model = continuous_f64_model_path if dtype == "float64" else continuous_model_path
    policy = Policy.load(model)
    node = start(tmp_path, model, transport, "[watchdog]\nstale_after_ms = 2000.0\n")
    assert "policy=continuous n_actions=4" in node.ready_line
    robot = Robot(node.endpoints)
    rng = np.random.default_rng(7)
    X = np.concatenate([policy.spec.check_X[:20], rng.normal(0.0, 3.0, size=(40, 6))])
    answers = {}
    try:
        robot.connect(X[0])
        for i, x in enumerate(X):
            x = np.ascontiguousarray(x)
            seq = robot.send(x, binary=(i % 2 == 1))       # both encodings of x
            raw, a = robot.wait_raw(seq)
            assert a is not None, f"frame {seq} not answered"
            assert list(a) == V2_KEYS and a["safe"] is False
            want = policy.act(x)
            if dtype == "float64":    # the same compiled code: bit for bit
                assert bits(a["u"]) == bits(want), f"sample {i}: {a['u']} != {want.tolist()}"
            else:
                assert within(a["u"], want, 1e-6), f"sample {i}: {a['u']} != {want.tolist()}"
            # the documented layout: fixed length, fixarray of 4, every element a float64 (0xcb)
            assert len(raw) == action_u_bytes(4) == 51 + 1 + 9 * 4
            assert raw == v2_reference_bytes(a["seq"], a["t_ns"], a["cycle"], a["u"], False)
            answers[a["cycle"]] = a["u"]
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    assert s["policy"]["kind"] == "continuous" and s["policy"]["n_actions"] == 4
    assert s["policy"]["action_names"] == ["j0", "j1", "j2", "j3"]
    assert s["safe_action"]["mode"] == "offset" and s["safe_action"]["config"] == "auto"
    assert s["safe_action"]["u"] == pytest.approx(policy.spec.action_offset.tolist(), abs=0)
    assert s["rejected_total"] == 0
    # the action ring holds what was published, float32
    z = np.load(os.path.join(run_dir, "actions.npz"))
    assert z["u"].dtype == np.float32 and z["u"].shape == (s["action_ring"]["recorded"], 4)
    assert s["action_ring"]["complete"] and s["action_ring"]["recorded"] == s["cycles"]
    rows = dict(zip(z["cycle"].tolist(), z["u"]))
    for cycle, u in answers.items():
        assert np.array_equal(rows[cycle], np.float32(u))
    cyc = np.load(os.path.join(run_dir, "cycles.npz"))
    assert set(np.unique(cyc["action"]).tolist()) <= {0, -1}
    assert ((cyc["action"] == -1) == ((cyc["flags"] & 8) != 0)).all()      # -1 exactly where safe


def test_sensor_clock_answers_each_frame_once_with_u(tmp_path, continuous_f64_model_path):
    policy = Policy.load(continuous_f64_model_path)
    node = start(tmp_path, continuous_f64_model_path, extra="[watchdog]\nstale_after_ms = 200.0\n",
                 args=["--clock", "sensor"])
    robot = Robot(node.endpoints)
    X = policy.spec.check_X[:25]
    try:
        robot.connect(X[0])
        robot.actions(timeout=0.05)
        for x in X:                                         # lockstep: each frame alone in the socket
            seq = robot.send(x)
            a = robot.wait_answer(seq)
            assert a is not None and not a["safe"] and bits(a["u"]) == bits(policy.act(np.ascontiguousarray(x)))
        rest = robot.actions(timeout=0.5)
        assert all(a["safe"] and a["seq"] == robot.seq for a in rest)   # only the watchdog's, after the last
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err


# ---- the safe action: a vector, the offset, hold (watchdog) ----

SAFE_VECTOR = [0.5, -0.5, 0.25, -0.0]


@pytest.mark.parametrize("setting", ["vector", "offset", "hold", "auto"])
def test_watchdog_publishes_the_safe_action(tmp_path, continuous_model_path, setting):
    policy = Policy.load(continuous_model_path)
    offset = policy.spec.action_offset.tolist()
    value = {"vector": json.dumps(SAFE_VECTOR), "offset": '"offset"', "hold": '"hold"', "auto": None}[setting]
    extra = "[watchdog]\nstale_after_ms = 5.0\n" + (f"safe_action = {value}\n" if value else "")
    node = start(tmp_path, continuous_model_path, extra=extra)
    robot = Robot(node.endpoints)
    rng = np.random.default_rng(1)
    try:
        # before any frame: the safe action, seq -1; for hold, the offset (there is no good action yet)
        before = robot.after_the_trip()                     # a subscriber joins late: waited for, not 0.3 s
        assert len(before) > 1, "the node publishes nothing before the first frame"
        want_before = SAFE_VECTOR if setting == "vector" else offset
        for a in before:
            assert a["safe"] is True and a["seq"] == -1 and bits(a["u"]) == bits(want_before)
        robot.connect(rng.normal(size=6))
        x_last = np.ascontiguousarray(rng.normal(size=6))
        seq = robot.send(x_last)
        a = robot.wait_answer(seq)
        assert a is not None and a["safe"] is False
        good = a["u"]
        assert bits(good) == bits(policy.act(x_last)) or within(good, policy.act(x_last), 1e-6)
        quiet = robot.after_the_trip()                      # no frames: the watchdog trips, then stays tripped
        assert len(quiet) > 1, "the node stopped publishing while stale"
        want = {"vector": SAFE_VECTOR, "offset": offset, "auto": offset, "hold": good}[setting]
        for a in quiet:
            assert a["safe"] is True and a["seq"] == seq and bits(a["u"]) == bits(want), (a, want)
        seq = robot.send(x_last)                            # a fresh frame resumes the policy
        a = robot.wait_answer(seq)
        assert a is not None and a["safe"] is False and bits(a["u"]) == bits(good)
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    assert s["stale_cycles"] > 0 and s["safe_actions"] > 0
    assert s["safe_action"]["mode"] == {"vector": "vector", "offset": "offset", "auto": "offset", "hold": "hold"}[setting]
    assert s["safe_action"]["u"] == want_before


@pytest.mark.parametrize("setting", ["vector", "hold"])
def test_non_finite_output_publishes_the_safe_action(tmp_path, overflow_model_path, setting):
    policy = Policy.load(overflow_model_path)
    vec = [1.0, 2.0, 3.0, 4.0]
    value = json.dumps(vec) if setting == "vector" else '"hold"'
    node = start(tmp_path, overflow_model_path, extra=f"[watchdog]\nstale_after_ms = 2000.0\nsafe_action = {value}\n")
    robot = Robot(node.endpoints)
    x_good = np.full(6, 0.01)
    x_huge = np.full(6, 1e200)                              # 6 x (+-1e200 x 1e200): inf - inf
    assert np.isfinite(policy.act(x_good)).all() and not np.isfinite(policy.act(x_huge)).any()
    try:
        robot.connect(x_good)
        seq = robot.send(x_good)
        good = robot.wait_answer(seq)
        assert good is not None and good["safe"] is False
        seq = robot.send(x_huge)
        a = robot.wait_answer(seq)
        assert a is not None and a["safe"] is True
        assert all(math.isfinite(v) for v in a["u"])        # never the garbage
        assert bits(a["u"]) == bits(vec if setting == "vector" else good["u"])
        seq = robot.send(x_good)
        a = robot.wait_answer(seq)
        assert a is not None and a["safe"] is False and bits(a["u"]) == bits(good["u"])
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    assert {k: v for k, v in s["rejected"].items() if v} == {"non_finite_output": 1}


# ---- argmax policies: the v1 message, unchanged byte for byte ----

def test_argmax_messages_are_unchanged_v1_bytes(tmp_path, iris_model_path, policy):
    node = start(tmp_path, iris_model_path, extra="[watchdog]\nstale_after_ms = 2000.0\n")
    assert "policy=argmax n_actions=1" in node.ready_line
    robot = Robot(node.endpoints)
    try:
        before = raw_actions(robot, 0.2)                    # safe actions before any frame: seq -1
        deadline = time.monotonic() + 10
        while not before and time.monotonic() < deadline:   # a subscriber joins late: waited for
            before = raw_actions(robot, 0.2)
        assert before
        for raw in before[-5:]:
            a = msgpack.unpackb(raw)
            assert raw == encode_action(-1, a["t_ns"], a["cycle"], 0, True) == \
                v1_reference_bytes(-1, a["t_ns"], a["cycle"], 0, True)
        X = policy.spec.check_X
        robot.connect(X[0])
        for x in X[:30]:
            seq = robot.send(x)
            raw, a = robot.wait_raw(seq)
            assert a is not None and list(a) == ["seq", "t_ns", "cycle", "action", "safe"]
            assert a["action"] == policy.predict(np.ascontiguousarray(x))
            assert len(raw) == 65
            assert raw == encode_action(a["seq"], a["t_ns"], a["cycle"], a["action"], a["safe"]) == \
                v1_reference_bytes(a["seq"], a["t_ns"], a["cycle"], a["action"], a["safe"])
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    assert s["policy"]["kind"] == "argmax" and s["safe_action"] == {"config": "auto", "mode": "class", "hold": False,
                                                                     "class": 0, "u": None}
    assert not os.path.exists(os.path.join(run_dir, "actions.npz"))


# ---- config refusals name the field and the fix ----

@pytest.mark.parametrize("kind,value,problem", [
    ("continuous", "[0.0, 1.0]", "has 2 values, but the model's policy is continuous (4 actions"),
    ("continuous", "[0.0, 1.0, 2.0, 3.0, 4.0]", "has 5 values"),
    ("continuous", "0", "is the class index 0, but the model's policy is continuous"),
    ("continuous", '[0.0, "a", 1.0, 2.0]', "element 1 is str"),
    ("continuous", "[true, 0.0, 1.0, 2.0]", "element 0 is bool"),
    ("continuous", '"sideways"', "invalid value 'sideways'"),
    ("continuous", "[]", "is an empty list"),
    ("continuous", "1.5", "has type float"),
    ("argmax", "[0.0, 0.0, 0.0]", "is a list of 3 floats, but the model's policy is argmax"),
    ("argmax", '"offset"', "is \"offset\""),
    ("argmax", "7", "class 7 does not exist"),
])
def test_bad_safe_action_fails_naming_the_field(tmp_path, continuous_model_path, iris_model_path, kind, value,
                                                problem):
    cfg = tmp_path / "n.toml"
    write_node_config(cfg, tmp_path, extra=f"[watchdog]\nsafe_action = {value}\n")
    model = continuous_model_path if kind == "continuous" else iris_model_path
    r = run_cli("run", "--config", cfg, "--model", model, "--duration", "1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "field 'watchdog.safe_action'" in r.stderr and "Fix:" in r.stderr, r.stderr
    assert problem in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# ---- the C encoder against msgpack ----

def _special_values(rng, n):
    pool = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308 * 0.5, 1.7976931348623157e308,
            -1.7976931348623157e308, 1e-300, 1.0, -1.0, 1 / 3, math.pi, 2.0 ** 53 + 1, -1e20]
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.3:
            out.append(pool[rng.integers(len(pool))])
        elif r < 0.4:
            out.append(float(rng.uniform(0, 2.2250738585072014e-308)) * (1 if rng.random() < 0.5 else -1))  # subnormal
        elif r < 0.6:
            out.append(float(rng.normal() * 10.0 ** rng.integers(-300, 300)))
        else:
            out.append(float(rng.normal()))
    return out


def test_encoder_bytes_decode_to_the_same_values():
    rng = np.random.default_rng(2024)
    for k in range(400):
        n = int(rng.integers(1, 41))                        # fixarray (<= 15) and array16 (0xdc) headers
        u = _special_values(rng, n)
        seq = -1 if k % 17 == 0 else int(rng.integers(0, 2**63)) * (2 if k % 3 else 1) + (k % 2)
        t_ns = int(rng.integers(-2**63, 2**63 - 1))
        cycle = int(rng.integers(0, 2**63)) * 2 + 1 if k % 5 == 0 else int(rng.integers(0, 10**9))
        safe = bool(k % 2)
        raw = encode_action_u(seq, t_ns, cycle, u, safe)
        assert len(raw) == action_u_bytes(n) == 51 + (1 if n <= 15 else 3) + 9 * n
        d = msgpack.unpackb(raw)
        assert list(d) == V2_KEYS
        assert d["seq"] == seq and d["t_ns"] == t_ns and d["cycle"] == cycle and d["safe"] is safe
        assert bits(d["u"]) == bits(u)                      # bit for bit: -0.0, subnormals, extremes
        # the u array is canonical msgpack: what msgpack itself writes for a list of float64
        start = 45
        assert raw[start:start + len(raw) - 51] == msgpack.packb(u, use_single_float=False)
        assert raw == v2_reference_bytes(seq, t_ns, cycle, u, safe)
    # non-finite values survive the encoder too (the node never publishes them)
    d = msgpack.unpackb(encode_action_u(1, 2, 3, [float("nan"), float("inf"), -float("inf")], False))
    assert math.isnan(d["u"][0]) and d["u"][1:] == [float("inf"), -float("inf")]
    with pytest.raises(ValueError):
        encode_action_u(1, 2, 3, [], False)


def test_a_mismatched_action_ring_constant_fails_loudly():
    from control_node import rundir
    from control_node.loop._rtloop import compiled_constants
    c = compiled_constants()
    rundir.check_compiled(c)
    bad = dict(c, action_ring={"u": 8})
    with pytest.raises(ImportError, match="action ring fields"):
        rundir.check_compiled(bad)
    bad = dict(c, action_codes={"policy": 0, "safe": 1})
    with pytest.raises(ImportError, match="continuous action codes"):
        rundir.check_compiled(bad)


def test_action_ring_is_bounded():
    from control_node import rundir
    assert rundir.action_ring_capacity(600_000, 4) == 600_000
    wide = rundir.action_ring_capacity(600_000, 64)
    assert wide * 64 * 4 <= rundir.ACTION_RING_MAX_BYTES and wide < 600_000
    u = rundir.new_action_ring(5, 2)
    for c in range(12):
        u[c % 5] = c
    z = rundir.ordered_action_ring(u, 12)
    assert z["cycle"].tolist() == [7, 8, 9, 10, 11] and z["u"][:, 0].tolist() == [7, 8, 9, 10, 11]


def test_diagnostics_announce_the_policy(tmp_path, continuous_model_path):
    node = start(tmp_path, continuous_model_path)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(node.endpoints["diagnostics"])
    try:
        assert sub.poll(5000)
        d = msgpack.unpackb(sub.recv())
    finally:
        sub.close(0)
        node.stop()
    assert d["policy"]["kind"] == "continuous" and d["policy"]["n_actions"] == 4 and d["policy"]["n_features"] == 6
    assert d["policy"]["action_names"] == ["j0", "j1", "j2", "j3"] and d["policy"]["safe_action"]["mode"] == "offset"
