"""The compiled loop and its frame codec, in-process: allocation proof and codec vs a reference decoder."""
from __future__ import annotations

import gc
import time
import tracemalloc

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from control_node.loop._rtloop import LoopConfig, RtLoop, decode_frame, encode_action
from control_node.loop.libzmq import libzmq_functions
from control_node.kernels import Policy
from support.nodeutil import FedSockets, start_feeder

IRIS_X = [5.1, 3.5, 1.4, 0.2]


def _run(loop):
    loop.run()      # any Python allocation inside the compiled loop is attributed to this line


def test_hot_path_allocates_nothing_over_100k_cycles(tmp_path, iris_model_path):
    policy = Policy.load(iris_model_path)
    with FedSockets(tmp_path, IRIS_X, 30) as socks:
        # 100k cycles at 20 kHz, a ring of 1000 that wraps 100 times
        cfg = LoopConfig(period_ns=20_000, stale_after_ns=10**9, spin_ns=20_000, max_cycles=100_000,
                         ring_cycles=1000)
        loop = RtLoop(policy, cfg, socks.sub.underlying, socks.pub.underlying, libzmq_functions())
        gc.collect()
        gc.disable()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        _run(loop)
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        gc.enable()
    assert loop.cycles == 100_000
    assert loop.frames_valid > 1_000             # the policy really ran on real frames
    run_line = _run.__code__.co_firstlineno + 1
    in_loop = [d for d in snap1.compare_to(snap0, "lineno")
               if d.traceback[0].filename == __file__ and d.traceback[0].lineno == run_line]
    assert sum(d.count_diff for d in in_loop) == 0   # no Python memory allocated by the loop


X_6 = [0.3, -1.2, 0.8, 2.5, -0.4, 1.1]


def _run_continuous(loop):
    loop.run()      # any Python allocation inside the compiled loop is attributed to this line


def test_continuous_hot_path_allocates_nothing_over_100k_cycles(tmp_path, continuous_model_path):
    """The continuous path (act_ptr, the v2 encoder, the action ring) allocates nothing either."""
    policy = Policy.load(continuous_model_path)
    ctx = zmq.Context()
    sub, pub, watch = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(f"ipc://{tmp_path}/s")
    pub.bind(f"ipc://{tmp_path}/a")
    watch.setsockopt(zmq.SUBSCRIBE, b"")
    watch.setsockopt(zmq.RCVHWM, 0)
    watch.connect(f"ipc://{tmp_path}/a")
    feeder = start_feeder(f"ipc://{tmp_path}/s", X_6, 30)
    try:
        assert sub.poll(10000), "feeder never connected"
        # 100k cycles at 20 kHz; the main ring (1000) and the action ring (700) both wrap
        cfg = LoopConfig(period_ns=20_000, stale_after_ns=10**9, spin_ns=20_000, max_cycles=100_000,
                         ring_cycles=1000, safe_u=[0.0, 0.0, 0.0, 0.0], action_ring_cycles=700)
        loop = RtLoop(policy, cfg, sub.underlying, pub.underlying, libzmq_functions())
        assert loop.continuous and loop.n_actions == 4 and loop.action_capacity == 700
        time.sleep(0.2)             # the watcher is connected
        gc.collect()
        gc.disable()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        _run_continuous(loop)
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        gc.enable()
        published = []
        while watch.poll(100) and len(published) < 1000:
            published.append(msgpack.unpackb(watch.recv()))
    finally:
        feeder.kill()
        feeder.wait()
        sub.close(0)
        pub.close(0)
        watch.close(0)
        ctx.term()
    assert loop.cycles == 100_000
    assert loop.frames_valid > 1_000             # the policy really ran on real frames
    run_line = _run_continuous.__code__.co_firstlineno + 1
    in_loop = [d for d in snap1.compare_to(snap0, "lineno")
               if d.traceback[0].filename == __file__ and d.traceback[0].lineno == run_line]
    assert sum(d.count_diff for d in in_loop) == 0   # no Python memory allocated by the loop
    want = policy.act(np.array(X_6))
    answers = [a for a in published if not a["safe"]]
    assert answers and all(a["u"] == want.tolist() for a in answers)
    assert loop.action_ring.shape == (700, 4)
    last = 100_000 - 1                           # the last cycle published the held policy answer
    assert loop.ring["action"][last % 1000] == 0 and loop.ring["cycle"][last % 1000] == last
    assert np.array_equal(loop.action_ring[last % 700], want.astype(np.float32))


def test_action_encoding_is_msgpack():
    b = encode_action(-1, 123, 7, 2, True)
    assert msgpack.unpackb(b) == {"seq": -1, "t_ns": 123, "cycle": 7, "action": 2, "safe": True}
    assert list(msgpack.unpackb(b)) == ["seq", "t_ns", "cycle", "action", "safe"]


# ---- frame codec against a plain-Python reference decoder (the spec in docs/protocol.md) ----

N = 4


def reference_decode(data: bytes, n: int):
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:
        return "malformed"
    if not isinstance(obj, dict):
        return "not_a_map"
    wrong = count_bad = False
    x = None
    isint = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    for k, v in obj.items():
        if not isinstance(k, str):
            wrong = True
        elif k == "seq":
            wrong |= not (isint(v) and v >= 0)
        elif k == "t_ns":
            wrong |= not (isint(v) and v < 2**63)
        elif k == "v":
            wrong |= not (isint(v) and v == 1)
        elif k == "x":
            if isinstance(v, bytes):
                if len(v) != 8 * n:
                    count_bad = True
                else:
                    x = np.frombuffer(v, "<f8")
            elif isinstance(v, list):
                if len(v) != n:
                    count_bad = True
                elif not all(isint(e) or isinstance(e, float) for e in v):
                    wrong = True
                else:
                    x = np.array(v, dtype=float)
            else:
                wrong = True
    if wrong:
        return "wrong_type"
    if count_bad:
        return "feature_count"
    if not {"seq", "t_ns", "x"} <= set(k for k in obj if isinstance(k, str)):
        return "missing_field"
    if not np.isfinite(x).all():
        return "non_finite"
    return "ok"


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**63, 2**64 - 1))
anything = st.recursive(st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=5), st.binary(max_size=40)),
                        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                        max_leaves=8)
x_values = st.one_of(st.lists(numbers, min_size=N, max_size=N), st.lists(numbers, max_size=7),
                     st.lists(anything, min_size=N, max_size=N),
                     st.lists(st.floats(allow_nan=True), min_size=N, max_size=N).map(
                         lambda v: np.asarray(v, "<f8").tobytes()),
                     st.binary(max_size=40), anything)
frames = st.fixed_dictionaries({}, optional={
    "seq": st.one_of(st.integers(0, 2**64 - 1), anything), "t_ns": st.one_of(st.integers(-2**63, 2**63 - 1), anything),
    "x": x_values, "v": st.one_of(st.just(1), anything), "extra": anything})


@settings(max_examples=1500, deadline=None)
@given(frames, st.sampled_from(["whole", "truncated", "trailing", "array"]))
def test_codec_agrees_with_reference(frame, mangle):
    data = msgpack.packb(frame, use_bin_type=True)
    if mangle == "truncated" and len(data) > 1:
        data = data[:len(data) // 2]
    elif mangle == "trailing":
        data = data + b"\x01"
    elif mangle == "array":
        data = msgpack.packb(list(frame.values()), use_bin_type=True)
    reason, seq, t_ns, x = decode_frame(data, N)
    assert reason == reference_decode(data, N)
    if reason == "ok":
        assert seq == frame["seq"] and t_ns == frame["t_ns"]
        want = frame["x"]
        want = np.frombuffer(want, "<f8") if isinstance(want, bytes) else np.array(want, dtype=float)
        assert np.array_equal(x, want)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x81", b"\xdf\xff\xff\xff\xff", b"\x81\xa1x\xdd\xff\xff\xff\xff",
                                  b"\x81\xa1x\xc6\xff\xff\xff\xff"])
def test_codec_rejects_hostile_lengths(data):
    assert decode_frame(data, N)[0] == "malformed"


def _run_virtual(loop, io, t0, until):
    loop.run_virtual(io, t0, until)      # any Python allocation inside the compiled loop is attributed here


@pytest.mark.parametrize("clock", ["timer", "sensor"])
def test_virtual_drivers_allocate_nothing(iris_model_path, clock):
    """The drivers and the cycle on the virtual clock (tests/test_cycle_rules.py) allocate nothing either:
    100k timer-clock cycles with phase lock, decimation and stalls, or a sensor-clock run of 50k frames."""
    from control_node.loop._rtloop import VirtualIO
    from support.virtual_loop import MS, T0, Stream
    policy = Policy.load(iris_model_path)
    sensor = clock == "sensor"
    s = Stream.periodic(50_000 if sensor else 100_000, 2 * MS if sensor else MS, 370_000,
                        [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])
    for j in range(0, len(s.arrive), 97):
        s.add_bad(s.arrive[j] + 1, b"\xc1")
    s = s.sorted()
    stalls = [] if sensor else [(T0 + j * MS, (j % 50) * 1_000_000 + 500_000) for j in range(1000, 90_000, 5000)]
    cfg = LoopConfig(period_ns=MS, stale_after_ns=5 * MS, max_cycles=0 if sensor else 100_000, ring_cycles=1000,
                     sensor_clock=sensor, phase_lock=not sensor, decimation=1 if sensor else 3)
    loop = RtLoop(policy, cfg)
    io = VirtualIO(s.arrive, s.frames, stalls, read_cost_ns=1_000, send_capacity=1)
    until = T0 + 100_010 * MS if sensor else 0
    gc.collect()
    gc.disable()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    _run_virtual(loop, io, T0, until)
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    gc.enable()
    assert loop.cycles >= (50_000 if sensor else 100_000) and loop.frames_valid > 40_000
    assert loop.rejected_counts()["malformed"] > 400
    run_line = _run_virtual.__code__.co_firstlineno + 1
    in_loop = [d for d in snap1.compare_to(snap0, "lineno")
               if d.traceback[0].filename == __file__ and d.traceback[0].lineno == run_line]
    assert sum(d.count_diff for d in in_loop) == 0
