"""Bad input into a RUNNING node (real process, real sockets): a hand-made corpus of malformed frames and
hypothesis-generated ones, interleaved with valid frames.

Checked every time: the node keeps answering and exits 0 on SIGTERM; every valid frame is answered with
``Policy.predict`` of its features; no non-safe action carries the seq of a frame that was not valid (invalid
frames carry features of a class different from their valid neighbours, and seqs of their own); the
``rejected`` counters in summary.json equal, reason by reason, what was sent.
"""
from __future__ import annotations

import math
import time

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_node.loop._rtloop import decode_frame
from control_node.rundir import FLAGS
from support.nodeutil import ActionCollector, Robot, load_run, start_node, stop_node

N_FEATURES = 4
MAX_FRAME = 4096
QUIET = "[watchdog]\nstale_after_ms = 2000.0\n"       # the watchdog never trips between lockstep frames


def predict(policy, x):
    return policy.predict(np.ascontiguousarray(x, dtype=np.float64))


def class_examples(policy):
    """One feature vector per predicted class (from the model's check set)."""
    out = {}
    for x in policy.spec.check_X:
        out.setdefault(predict(policy, x), np.asarray(x, dtype=float))
    return out


def other_class_x(examples, cls):
    """Features of a class different from ``cls``."""
    return next(x for c, x in sorted(examples.items()) if c != cls)


# ---------------------------------------------------------------- the hand-made corpus
def corpus(seq_bad, last_valid_seq, x_bad, t):
    """Malformed frames by expected reason: list of (reason, [parts]).

    seq_bad: a seq no valid frame uses; last_valid_seq: the last accepted seq (for the seq cases);
    x_bad: features of a class other than the surrounding valid frames'."""
    x = [float(v) for v in x_bad]
    good = {"seq": seq_bad, "t_ns": t, "x": x}
    packed = msgpack.packb(good)
    pk = msgpack.packb
    f = []
    add = lambda reason, *parts: f.append((reason, list(parts)))  # noqa: E731
    # truncated and invalid msgpack, empty frame, trailing bytes
    add("malformed", b"")
    add("malformed", b"\xc1")
    for cut in (1, 2, len(packed) // 2, len(packed) - 1):
        add("malformed", packed[:cut])
    add("malformed", packed + b"\x00")
    add("malformed", packed + packed)
    add("malformed", b"\x85")                                  # a map of 5 keys, none there
    add("malformed", b"\xdf\xff\xff\xff\xff")                 # map32 with 4G keys in 5 bytes
    add("malformed", b"\x83\xa3seq\xdb\xff\xff\xff\xff")       # str32 longer than the frame
    add("malformed", b"\x83\xa1x\xdd\xff\xff\xff\xff")         # array32 longer than the frame
    add("malformed", b"\x83\xa1x\xc6\x00\x01\x00\x00")         # bin32 longer than the frame
    add("malformed", bytes([0x83, 0xa3]) + b"seq" + b"\xcf\x00\x00")   # uint64 cut short
    # not a map
    for v in ([1, 2, 3], "frame", 7, None, 1.5, b"bin", True, [good]):
        add("not_a_map", pk(v))
    # missing fields
    add("missing_field", pk({}))
    add("missing_field", pk({"t_ns": t, "x": x}))
    add("missing_field", pk({"seq": seq_bad, "x": x}))
    add("missing_field", pk({"seq": seq_bad, "t_ns": t}))
    add("missing_field", pk({"seq": seq_bad, "t_ns": t, "X": x, "pad": 1}))
    # wrong types, for every field
    for bad in ("one", 1.0, -1, -(2**63), True, None, [1], {"a": 1}, b"\x01"):
        add("wrong_type", pk({"seq": bad, "t_ns": t, "x": x}))
    for bad in ("now", 1.5, None, [1], 2**63, 2**64 - 1, False):
        add("wrong_type", pk({"seq": seq_bad, "t_ns": bad, "x": x}))
    for bad in ("text", 4, 1.0, None, {"a": 1}, True):
        add("wrong_type", pk({"seq": seq_bad, "t_ns": t, "x": bad}))
    for elem in ("a", None, True, [1.0], b"\x00"):
        add("wrong_type", pk({"seq": seq_bad, "t_ns": t, "x": [x[0], elem, x[2], x[3]]}))
    for bad in (2, 0, -1, "1", 1.0):
        add("wrong_type", pk({"seq": seq_bad, "t_ns": t, "x": x, "v": bad}))
    add("wrong_type", pk({"seq": seq_bad, "t_ns": t, "x": x, 1: 2}, strict_types=False))   # non-string key
    # wrong feature counts
    for n in (0, 1, 3, 5, 16, 100):
        add("feature_count", pk({"seq": seq_bad, "t_ns": t, "x": [1.0] * n}))
    for nb in (0, 8, 24, 31, 33, 40, 800):
        add("feature_count", pk({"seq": seq_bad, "t_ns": t, "x": b"\x00" * nb}))
    # NaN / Inf, as msgpack floats (64 and 32 bit) and in a bin
    for bad in (math.nan, math.inf, -math.inf):
        for i in range(N_FEATURES):
            xv = list(x)
            xv[i] = bad
            add("non_finite", pk({"seq": seq_bad, "t_ns": t, "x": xv}))
        add("non_finite", pk({"seq": seq_bad, "t_ns": t, "x": np.array([bad, 1, 1, 1], "<f8").tobytes()}))
        add("non_finite", pk({"seq": seq_bad, "t_ns": t, "x": [bad, 1.0, 1.0, 1.0]}, use_single_float=True))
    # oversized: a valid frame padded past max_frame_bytes (but below ZeroMQ's 16x MAXMSGSIZE cap)
    for size in (MAX_FRAME + 1, MAX_FRAME + 100, 3 * MAX_FRAME, 15 * MAX_FRAME):
        n = size
        frame = pk({"seq": seq_bad, "t_ns": t, "x": x, "pad": b"p" * n})
        while len(frame) != size:                 # the bin header grows with its length
            n += size - len(frame)
            frame = pk({"seq": seq_bad, "t_ns": t, "x": x, "pad": b"p" * n})
        add("oversized", frame)
    # extra multipart frames (the first part a perfectly valid frame)
    add("multipart", packed, b"extra")
    add("multipart", packed, b"")
    add("multipart", b"", packed)
    add("multipart", packed, packed, packed)
    add("multipart", b"\xc1", b"\xc1")
    # seq repeated, backwards, restarting from 0
    for s in (last_valid_seq, last_valid_seq - 1, last_valid_seq - 1000, 0):
        add("seq_not_increasing", pk({"seq": s, "t_ns": t, "x": x}))
    return f


def test_corpus_matches_the_decoder():
    """The corpus' expected reasons are the decoder's (the node-level test counts them)."""
    t = time.monotonic_ns()
    for reason, parts in corpus(10**9 + 1, 10**9, [5.1, 3.5, 1.4, 0.2], t):
        if reason in ("multipart", "oversized", "seq_not_increasing"):
            continue
        assert decode_frame(parts[0], N_FEATURES)[0] == reason, (reason, parts)


# ---------------------------------------------------------------- lockstep: exact answers
class Lockstep:
    """Valid frames one at a time (each answered before the next), bad frames sent in between."""

    def __init__(self, robot, policy, examples, seq0):
        self.robot, self.policy, self.examples = robot, policy, examples
        self.seq = seq0
        self.valid = {}            # seq -> expected action (-1: safe expected, logits overflow)
        self.sent = {}             # reason -> count
        self.n_bad = 0
        self.k = 0

    def bad(self, reason, parts):
        if len(parts) == 1:
            self.robot.send_raw(parts[0])
        else:
            self.robot.send_raw(parts[0], more=parts[1:])
        self.sent[reason] = self.sent.get(reason, 0) + 1
        self.n_bad += 1

    def good(self, x=None, expect_safe=False):
        if x is None:
            x = self.policy.spec.check_X[self.k % len(self.policy.spec.check_X)]
            self.k += 1
        self.seq += 10
        seq = self.robot.send(x, seq=self.seq, binary=(self.seq // 10) % 2 == 1)
        want = -1 if expect_safe else predict(self.policy, x)
        self.valid[seq] = want
        a = self.robot.wait_answer(seq, timeout=3.0)
        assert a is not None, f"valid frame {seq} not answered (node alive: {self.robot})"
        if expect_safe:
            assert a["safe"] is True
        else:
            assert a["safe"] is False and a["action"] == want, (seq, a, want)
        return seq

    def next_class(self):
        x = self.policy.spec.check_X[self.k % len(self.policy.spec.check_X)]
        return predict(self.policy, x)


def check_no_action_from_invalid(actions, valid):
    """Every non-safe action carries a valid frame's seq and that frame's policy answer."""
    for a in actions:
        if a["safe"]:
            continue
        assert a["seq"] in valid, f"non-safe action for a seq never sent valid: {a}"
        assert valid[a["seq"]] >= 0 and a["action"] == valid[a["seq"]], f"action not from its frame: {a}"


def run_and_check_counts(node, sent, n_valid_min, n_valid_max=None):
    rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    summary, arrays = load_run(run_dir)
    rejected = {k: v for k, v in summary["rejected"].items() if v}
    assert rejected == {k: v for k, v in sent.items() if v}, (rejected, sent)
    assert summary["rejected_total"] == sum(sent.values())
    # every valid frame sent after the connection was up was accepted (some of connect()'s first
    # frames are lost to ZeroMQ's slow joiner, before the node could see them)
    assert n_valid_min <= summary["frames_valid"] <= (n_valid_max or n_valid_min)
    return summary, arrays


def test_corpus_into_running_node(tmp_path, iris_model_path, policy):
    node, _ = start_node(tmp_path, iris_model_path, QUIET, spin_us=None)
    robot = Robot(node.endpoints)
    col = ActionCollector(node.endpoints["action"])
    examples = class_examples(policy)
    X = policy.spec.check_X
    try:
        robot.connect(X[0], timeout=20)
        ls = Lockstep(robot, policy, examples, seq0=10**7)
        ls.valid.update({s: predict(policy, X[0]) for s in range(1, robot.seq + 1)})
        ls.n_connect = robot.seq   # connect() frames
        ls.good()
        t_start = time.monotonic()
        for rep in range(3):                               # the whole corpus, three times over
            items = corpus(ls.seq + 5, ls.seq, other_class_x(examples, ls.next_class()), time.monotonic_ns())
            for i, (reason, parts) in enumerate(items):
                if reason == "seq_not_increasing":         # duplicates carry a different class on purpose
                    parts = [msgpack.packb({**msgpack.unpackb(parts[0]),
                                            "x": list(other_class_x(examples, ls.valid.get(ls.seq, 0)))})]
                ls.bad(reason, parts)
                if i % 4 == 3:
                    ls.good()
            ls.good()
        # a valid frame of exactly max_frame_bytes is accepted
        x = X[7]
        ls.seq += 10
        n = MAX_FRAME
        frame = msgpack.packb({"seq": ls.seq, "t_ns": 1, "x": list(map(float, x)), "pad": b"p" * n})
        while len(frame) != MAX_FRAME:
            n += MAX_FRAME - len(frame)
            frame = msgpack.packb({"seq": ls.seq, "t_ns": 1, "x": list(map(float, x)), "pad": b"p" * n})
        robot.send_raw(frame)
        ls.valid[ls.seq] = predict(policy, x)
        a = robot.wait_answer(ls.seq)
        assert a is not None and not a["safe"] and a["action"] == ls.valid[ls.seq]
        # huge finite features overflow the logits: the node answers with the safe action
        for big in ([1e308] * 4, [1e308, -1e308, 1e308, -1e308], [-1e308] * 4):
            ls.good(big, expect_safe=True)
            ls.sent["non_finite_output"] = ls.sent.get("non_finite_output", 0) + 1
            ls.good()
        elapsed = time.monotonic() - t_start
        time.sleep(0.05)
    finally:
        actions = col.close()
        robot.close()
    print(f"corpus: {ls.n_bad} bad + {len(ls.valid)} valid frames in {elapsed:.2f} s; by reason {ls.sent}")
    n_connect = ls.n_connect
    summary, arrays = run_and_check_counts(node, ls.sent, len(ls.valid) - n_connect + 1, len(ls.valid))
    check_no_action_from_invalid(actions, ls.valid)
    assert summary["stale_cycles"] <= summary["cycles"]


# ---------------------------------------------------------------- hypothesis-driven frames
_scalar = st.one_of(st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=4), st.binary(max_size=40), st.booleans(), st.none())
_feature = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**63, 2**64 - 1),
                     st.floats(width=32), st.just("x"), st.none())
_x = st.one_of(st.lists(_feature, min_size=4, max_size=4),
               st.lists(st.sampled_from([math.nan, math.inf, -math.inf, 1.0, 1e308]), min_size=4, max_size=4), st.lists(st.floats(), min_size=4, max_size=4),
               st.lists(_feature, min_size=0, max_size=7), st.binary(min_size=0, max_size=48),
               st.binary(min_size=32, max_size=32), _scalar)
_field = st.sampled_from(["seq", "t_ns", "x", "v", "w", "seq"])
_map = st.dictionaries(_field, st.one_of(_scalar, _x, st.integers(0, 10**6)), max_size=5)


@st.composite
def fuzz_frame(draw):
    """Raw bytes: mostly near-valid maps with random field types, sometimes mangled bytes."""
    d = draw(_map)
    if draw(st.booleans()):
        d.setdefault("seq", draw(st.integers(0, 10**6)))          # seqs of our own, below every valid one
        d.setdefault("t_ns", draw(st.integers(0, 2**62)))
        d.setdefault("x", draw(_x))
    data = msgpack.packb(d)
    how = draw(st.sampled_from(["as-is", "as-is", "truncate", "flip", "append", "random"]))
    if how == "truncate" and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif how == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    elif how == "append":
        data = data + draw(st.binary(min_size=1, max_size=8))
    elif how == "random":
        data = draw(st.binary(max_size=64))
    return data


def expected_reason(frame):
    """The node's reason for a fuzzed frame: the decoder's, and a decodable one is a seq repeat
    (fuzzed seqs are all below the valid stream's)."""
    if len(frame) > MAX_FRAME:
        return "oversized"
    reason, seq, _, x = decode_frame(frame, N_FEATURES)
    if reason == "ok":
        assert seq <= 10**6 or seq >= 2**63, seq   # msgpack of a fuzzed seq below the valid stream
        return "seq_not_increasing" if seq < 10**7 else None
    return reason


def test_hypothesis_frames_into_running_node(tmp_path, iris_model_path, policy):
    node, _ = start_node(tmp_path, iris_model_path, QUIET, spin_us=None)
    robot = Robot(node.endpoints)
    col = ActionCollector(node.endpoints["action"])
    examples = class_examples(policy)
    X = policy.spec.check_X
    skipped = []
    try:
        robot.connect(X[0], timeout=20)
        ls = Lockstep(robot, policy, examples, seq0=10**7)
        ls.valid.update({s: predict(policy, X[0]) for s in range(1, robot.seq + 1)})
        ls.n_connect = robot.seq
        ls.good()

        @settings(max_examples=150, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(fuzz_frame(), min_size=1, max_size=25))
        def burst(frames):
            for fr in frames:
                reason = expected_reason(fr)
                if reason is None:       # a seq >= 2**63 that decodes: see test_seq_edges (skipped here)
                    skipped.append(fr)
                    continue
                ls.bad(reason, [fr])
            ls.good()

        burst()
    finally:
        actions = col.close()
        robot.close()
    print(f"hypothesis: {ls.n_bad} bad + {len(ls.valid)} valid frames; by reason {ls.sent}; skipped {len(skipped)}")
    assert ls.n_bad > 200
    assert len([r for r, n in ls.sent.items() if n]) >= 5      # the generator reaches many reasons
    summary, _ = run_and_check_counts(node, ls.sent, len(ls.valid) - ls.n_connect + 1, len(ls.valid))
    check_no_action_from_invalid(actions, ls.valid)


# ---------------------------------------------------------------- timer mode at several kHz
@pytest.mark.parametrize("rate", [2000.0, 10000.0])
def test_interleaved_at_khz_rates_keeps_rate_and_counts(tmp_path, iris_model_path, policy, rate):
    """Frames paced at 2 or 10 kHz, one in five valid, no lockstep, timer clock, ~2.5 s each."""
    # after a host stall the pacer below sends every frame it owes at once (1000 per 100 ms at 10 kHz), and a
    # stalled node lets them pile up: past either default high-water mark (1000) libzmq drops them unseen and
    # the node cannot count them. Queue them on both ends (the node drains its whole queue every cycle, so the
    # counts stay exact however long the host stalls either process)
    # the default spin: with spin_us = 0 one fresh-clone run (of four) saw only 55 % of a 10 kHz stream by the
    # stop, the node behind the sender (not explained yet; the node's drain under load is the suspect)
    node, _ = start_node(tmp_path, iris_model_path, QUIET + "[limits]\nrecv_hwm = 100000\n", spin_us=None)
    robot = Robot(node.endpoints, sndhwm=100_000)
    col = ActionCollector(node.endpoints["action"])
    examples = class_examples(policy)
    X = policy.spec.check_X
    valid, sent = {}, {}
    try:
        robot.connect(X[0], timeout=20)
        valid.update({s: predict(policy, X[0]) for s in range(1, robot.seq + 1)})
        n_connect = robot.seq
        seq = 10**7
        frames = []                                   # (is_valid, payload)
        k = 0
        for rep in range(max(1, int(rate / 50))):          # ~2.5 s of frames
            x = X[k % len(X)]
            items = corpus(seq + 5, seq, other_class_x(examples, predict(policy, x)), time.monotonic_ns())
            for i, (reason, parts) in enumerate(items):
                if i % 4 == 0:
                    x = X[k % len(X)]
                    k += 1
                    seq += 10
                    frames.append((True, (seq, x)))
                    valid[seq] = predict(policy, x)   # here, not in the pacer: it only sends
                if reason == "seq_not_increasing":
                    parts = [msgpack.packb({"seq": seq - 20 * (i % 3), "t_ns": 1,
                                            "x": list(other_class_x(examples, predict(policy, x)))})]
                if reason == "oversized" and len(parts[0]) > 4 * MAX_FRAME:
                    continue                          # keep the byte rate modest
                frames.append((False, (reason, parts)))
        t0 = time.monotonic()
        for n, (is_valid, payload) in enumerate(frames):
            while time.monotonic() < t0 + n / rate:
                pass
            if is_valid:
                s, x = payload
                robot.send(x, seq=s, binary=s % 20 == 0)
            else:
                reason, parts = payload
                robot.send_raw(parts[0], more=parts[1:] if len(parts) > 1 else None)
                sent[reason] = sent.get(reason, 0) + 1
        send_s = time.monotonic() - t0
        # a last valid frame, and its answer: ZeroMQ keeps one connection's order and the node counts every
        # frame it drains, so once this one is answered every frame above was counted. A fixed 0.1 s wait
        # failed once: a stalled host left the last 1/8 of a 2 kHz stream queued (each reason 7/8 counted)
        marker = seq + 10
        robot.send(X[0], seq=marker)
        valid[marker] = predict(policy, X[0])
        deadline, seen = time.monotonic() + 60, 0
        while True:
            got = col.actions[seen:]
            if any(a["seq"] == marker and not a["safe"] for a in got):
                break
            seen += len(got)
            assert time.monotonic() < deadline, "the last frame was never answered"
            time.sleep(0.02)
    finally:
        actions = col.close()
        robot.close()
    print(f"paced: {len(frames)} frames in {send_s:.2f} s ({len(frames) / send_s:.0f}/s), "
          f"{sum(sent.values())} bad by reason {sent}")
    assert len(frames) / send_s > 0.8 * rate
    summary, arrays = run_and_check_counts(node, sent, len(valid) - n_connect + 1, len(valid))
    check_no_action_from_invalid(actions, valid)
    # every valid frame accepted (above), and answered or superseded by a newer one in the same cycle
    new = (arrays["flags"] & FLAGS["new_frame"]) != 0
    assert int(new.sum()) + summary["superseded"] == summary["frames_valid"]
    # the loop kept its rate: cycles (plus ticks skipped during stalls) ~ duration x rate
    expected = summary["duration_s"] * summary["rate_hz"]
    # (the rule, not the host's speed: series run 2 of 17b86f2 ran 2085 cycles of 2854 ticks on a loaded host,
    # every other tick counted as skipped; a bound on cycles alone tested the host)
    assert abs(summary["cycles"] + summary["skipped_ticks"] - expected) <= 0.02 * expected + 5
    assert summary["deadline_misses"] == int(((arrays["flags"] & FLAGS["miss"]) != 0).sum()) + summary["skipped_ticks"]
    print(f"cycles {summary['cycles']} in {summary['duration_s']:.2f} s, misses {summary['deadline_misses']}")


# ---------------------------------------------------------------- seq edge cases (uint64)
def _lockstep_seqs(tmp_path, iris_model_path, policy, seqs, trip_first=False, rejected_at=()):
    """Send frames with these seqs one by one, each after the last one's answer, after connecting and, with
    trip_first, after letting the watchdog trip so that the first one is accepted whatever its seq. A frame
    the test expects answered is waited for up to 10 s (its answer ends the wait: a host stall only delays
    it); the one at each position in ``rejected_at`` for 0.3 s (it gets no answer: two rejected frames in a
    row stay inside the watchdog's 1 s); the node's rejection counts in the summary are the evidence for those.
    Returns (actions received after each frame, summary)."""
    node, _ = start_node(tmp_path, iris_model_path, "[watchdog]\nstale_after_ms = 1000.0\n", spin_us=None)
    robot = Robot(node.endpoints)
    x = policy.spec.check_X[0]
    got = []
    try:
        robot.connect(x, timeout=20)
        if trip_first:
            # wait for the watchdog's trip and drain up to it: what is queued before it are held actions
            # for the connect frames, which must not be mistaken for answers to the frames below
            robot.after_the_trip()
        for i, s in enumerate(seqs):
            robot.pub.send(msgpack.packb({"seq": s, "t_ns": time.monotonic_ns(), "x": list(map(float, x))}))
            got.append(robot.actions(timeout=0.3 if i in rejected_at else 10.0, until=s))
    finally:
        robot.close()
    rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    summary, _ = load_run(run_dir)
    return got, summary


def test_seq_increasing_below_2_63_accepted_repeats_rejected(tmp_path, iris_model_path, policy):
    """seq within int64 range: increasing accepted and echoed; a repeat and a step back rejected."""
    seqs = [2**40, 2**62, 2**63 - 2, 2**63 - 1, 2**63 - 1, 2**62]
    got, summary = _lockstep_seqs(tmp_path, iris_model_path, policy, seqs, rejected_at={4, 5})
    answered = [{a["seq"] for a in g if not a["safe"]} for g in got]
    for s, ans in zip(seqs[:4], answered[:4]):
        assert s in ans, (s, ans)
    assert summary["rejected"]["seq_not_increasing"] == 2


# regression test, was a strict xfail until 8187681 fixed the node: BUG: seq is uint64 on the wire but the
#   loop compares it as int64 (_rtloop.pyx _drain: <int64_t> seq <= last_seq): seq 2**63 right after 2**63-1
#   is rejected as seq_not_increasing (so is every seq >= 2**63 after a small one)
def test_seq_2_63_after_2_63_minus_1_accepted(tmp_path, iris_model_path, policy):
    seqs = [2**63 - 1, 2**63, 2**63 + 1]
    got, summary = _lockstep_seqs(tmp_path, iris_model_path, policy, seqs, trip_first=True)
    assert summary["rejected"]["seq_not_increasing"] == 0
    for s, g in zip(seqs, got):
        assert any(a["seq"] == s and not a["safe"] for a in g), (s, [a["seq"] for a in g])


# regression test, was a strict xfail until 8187681 fixed the node: BUG: the action echoes seq as msgpack
#   int64 (frame_codec.h cn_encode_action 0xd3): a frame with seq 2**64-2 is answered with seq -2
def test_seq_above_2_63_echoed_unchanged(tmp_path, iris_model_path, policy):
    got, summary = _lockstep_seqs(tmp_path, iris_model_path, policy, [2**64 - 2], trip_first=True)
    answers = [a for a in got[0] if not a["safe"]]
    assert answers, "the first frame after the watchdog tripped was not answered"
    assert answers[0]["seq"] == 2**64 - 2, answers[0]


# regression test, was a strict xfail until 8187681 fixed the node: BUG: after seq 2**64-1 (int64 -1) a
#   wrapped seq 0 compares as larger and is accepted while the watchdog has not tripped; protocol.md: seq
#   strictly increasing, only a tripped watchdog lets a sender start again from 0
def test_seq_wrap_to_zero_rejected_while_fresh(tmp_path, iris_model_path, policy):
    seqs = [2**64 - 2, 2**64 - 1, 0, 1]
    got, summary = _lockstep_seqs(tmp_path, iris_model_path, policy, seqs, trip_first=True, rejected_at={2, 3})
    assert summary["rejected"]["seq_not_increasing"] == 2
    assert not any(a["seq"] in (0, 1) and not a["safe"] for g in got[2:] for a in g)
