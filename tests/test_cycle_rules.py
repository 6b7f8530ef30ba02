"""The loop's rules, checked on the REAL compiled drivers and cycle with a virtual clock (RtLoop.run_virtual,
control_node/loop/cn_vio.h): frames encoded as the sender encodes them arrive at made-up times, wake-ups
are stalled on purpose, phase-lock probes are answered from the arrival times. Thousands of cycles run in
milliseconds and every assertion is exact: no wall clock, no process, nothing a host stall can break.

A test that took over a process test's rule check says "Replaces" and names it (that check is gone from
the process test, which keeps what needs a process: sockets, signals, recording, a real launch, and checks
evidence, not timing). "Exact form of" names a process test that still runs (it checks its path as
evidence: the CLI, the control socket, a real sender) whose rule is pinned here to the cycle."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest

from conftest import continuous_spec
from control_node import rundir
from control_node.kernels import ModelSpec, Policy, save_model
from control_node.loop._rtloop import LoopConfig, RtLoop, VirtualIO
from support.virtual_loop import MS, T0, Stream, frame, run_virtual

IRIS_X = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]]


def _save(spec, path):
    save_model(spec, path)
    return Policy.load(path)


@pytest.fixture(scope="module")
def pols(tmp_path_factory, iris_model_path):
    """Real policies: iris (argmax, 4 -> 3), A and B (continuous float64 6 -> 4, different weights), A2 (A's
    weights: agrees with A), overflow (6 -> 4, +-inf for inputs of 1e200), gru (recurrent 6 -> 3)."""
    from test_recurrent import rnn_spec
    d = tmp_path_factory.mktemp("rules")
    rng = np.random.default_rng(3)
    W = np.where(rng.random((6, 4)) < 0.5, -1.0, 1.0) * 1e200
    overflow = ModelSpec(
        layers=[(W, np.zeros(4))], mean=np.zeros(6), scale=np.ones(6), classes=[],
        feature_names=[f"obs{i}" for i in range(6)], head="continuous", activations=["identity"],
        action_names=["a", "b", "c", "d"], action_offset=[0.5, -0.5, 0.0, 1.0], action_scale=1.0, squash=False,
        check_X=rng.normal(0.0, 1.0, size=(16, 6)), trainer="random")
    return {"iris": Policy.load(iris_model_path),
            "a": _save(continuous_spec("float64", seed=1), d / "a.npz"),
            "a2": _save(continuous_spec("float64", seed=1), d / "a2.npz"),
            "b": _save(continuous_spec("float64", seed=2), d / "b.npz"),
            "overflow": _save(overflow, d / "overflow.npz"),
            "gru": _save(rnn_spec("gru", 6, 16, [8, 3], dtype="float64", seed=3), d / "gru.npz")}


def xs6(n=97, seed=4):
    return np.random.default_rng(seed).normal(0.0, 1.5, size=(n, 6))


def test_thousands_of_cycles_run_in_milliseconds(pols):
    """The virtual run is cheap enough to check rules over thousands of cycles: 20k cycles of the real loop
    (drain, decode, infer, publish, record) with a frame every tick."""
    s = Stream.periodic(20_000, MS, 300_000, IRIS_X)
    r = run_virtual(pols["iris"], s, period_ns=MS, max_cycles=20_000, stale_after_ns=5 * MS)
    # (no wall-clock bound: ~40 ms here for the run, whose virtual clock covered 20 s)
    assert r.loop.cycles == 20_000 and r.loop.frames_valid == 19_999   # the last frame comes after the last tick
    assert r.io.now >= T0 + 19_999 * MS
    # every tick answered the frame that arrived 0.7 ms before it, with iris's class for it
    want = [int(pols["iris"].predict(np.array(IRIS_X[i % 3]))) for i in range(3)]
    for m in r.sent[1:100]:
        assert not m["safe"] and m["action"] == want[(m["seq"] - 1) % 3] and m["seq"] == m["cycle"]


# ---- decimation ----

def test_decimation_phases_and_held_actions(pols):
    """Replaces the rule checks of test_decimation.py::test_decimation_holds_the_action_between_inference_ticks
    (inference on the policy tick of every clean block, at most one per block, the held action and seq
    published in between, every frame counted on hold ticks too)."""
    n, cycles = 20, 2000
    xs = xs6()
    s = Stream.periodic(cycles, MS, 300_000, xs)
    for j in range(0, cycles, 7):                    # a bad frame after every 7th valid one
        s.add_bad(T0 + j * MS + 400_000, [b"\xc1", msgpack.packb([1, 2, 3])][j % 2])
    r = run_virtual(pols["a"], s, period_ns=MS, max_cycles=cycles, decimation=n, stale_after_ns=5 * MS)
    k, infer = r.k, r.flag("infer")
    assert (k == np.arange(cycles)).all()            # no stall: every tick ran
    # the first frame arrives after tick 0: the policy tick 0 is served at tick 1, then on every 20th tick
    assert np.flatnonzero(infer).tolist() == [1] + list(range(n, cycles, n))
    assert r.loop.inference_ticks == int(infer.sum())
    assert r.loop.frames_valid == cycles - 1
    rej = r.loop.rejected_counts()
    assert rej["malformed"] + rej["not_a_map"] == len(range(0, cycles, 7))
    assert r.flag("rejected").sum() == len(range(0, cycles, 7))
    assert (r.flag("rejected") & ~infer).sum() > 0.9 * len(range(0, cycles, 7))    # counted on hold ticks
    by_seq = r.stream.by_seq()
    for c in range(1, cycles):
        m = r.sent[c]
        assert not m["safe"] and m["cycle"] == c
        if infer[c]:
            assert m["seq"] == c          # the frame that arrived 0.7 ms before tick c
            assert m["u"] == pols["a"].act(r.stream.x[by_seq[m["seq"]]]).tolist()
        else:
            assert (m["seq"], m["u"]) == (r.sent[c - 1]["seq"], r.sent[c - 1]["u"])
    assert (r.rec["action"][1:] == rundir.ACTION_POLICY).all()


def test_decimation_after_skipped_ticks_and_a_watchdog_trip(pols):
    """Replaces test_decimation.py's checks of the schedule around stalls and trips: a skipped policy tick is
    served at the first tick after the stall (off the grid), then the grid resumes; a trip between policy ticks
    publishes the safe action at once and the first frame after it is acted on at the next policy tick at or
    after it (at once when a policy tick passed during the silence)."""
    n = 5
    xs = xs6()
    # a stall of 3.5 ms at tick 103 (its wake comes at 106.5): ticks 104-105 (policy tick 105) are skipped
    # frames stop after the one for tick 300 and come back for tick 330 (stale after 5 ms: trips at tick 306)
    s = Stream.periodic(600, MS, 300_000, xs, skip=set(range(300, 329)))
    r = run_virtual(pols["a"], s, stalls=[(T0 + 103 * MS, 3_500_000)], period_ns=MS, max_cycles=590,
                    decimation=n, stale_after_ns=5 * MS)
    k, infer, stale = r.k, r.flag("infer"), r.flag("stale")
    # (catch-up: the ticks that passed are skipped but the last, 106, which runs late)
    assert r.loop.skipped_ticks == 2 and 104 not in k and 105 not in k and 106 in k
    ik = k[infer].tolist()
    assert 100 in ik and 106 in ik and 110 in ik and not {101, 102, 103, 105, 107} & set(ik)
    # the trip: the last frame (for tick 300) arrived at 299.3 ms: stale from the first tick more than 5 ms
    # after the tick that drained it (300) -> tick 306; safe from then on, nothing inferred
    trip = int(np.flatnonzero(stale & (k > 10))[0])
    assert k[trip] == 306 and r.sent[trip]["safe"] and not infer[trip]
    assert r.sent[trip]["u"] == pols["a"].spec.action_offset.tolist()     # the safe action: the head's offset
    # the sender is back: frame for tick 330 arrives at 329.3 ms, drained at tick 330, a policy tick passed
    # during the silence: acted on at once
    back = int(np.flatnonzero(~stale & (k > 306))[0])
    assert k[back] == 330 and infer[back] and not r.sent[back]["safe"]
    assert k[infer & (k > 330)][0] == 335


# ---- phase lock ----

def _leads(r):
    """Per cycle that acted on a new frame: its tick minus the frame's arrival."""
    idx = r.stream.by_seq()
    new = r.flag("new_frame")
    arrive = np.array(r.stream.arrive)
    return r.rec["t_tick_ns"][new] - arrive[[idx[int(q)] for q in r.rec["seq"][new]]], np.flatnonzero(new)


def test_phase_lock_converges_and_holds_the_margin(pols):
    """Replaces the rule checks of test_phase_lock.py::test_phase_lock_converges_on_a_1khz_sender: frames that
    arrive 370 us after the tick end up arriving phase_margin before it; at the settled phase 1 frame in 10
    comes later than tick - margin (the late step is 9 early steps)."""
    margin = 100_000
    s = Stream.periodic(4000, MS, 370_000, IRIS_X)
    r = run_virtual(pols["iris"], s, period_ns=MS, max_cycles=3990, phase_lock=True, phase_margin_ns=margin,
                    stale_after_ns=50 * MS, read_cost_ns=0)
    lead, cyc = _leads(r)
    assert lead[0] == MS - 370_000                    # at first the frame waits 630 us
    settled = cyc >= 1000
    step = r.loop.phase_min_step_ns                  # 500 ns
    assert lead[settled].min() >= margin - step and lead[settled].max() <= margin + 9 * step
    late = lead[settled] < margin
    assert abs(late.mean() - 0.1) < 0.01
    assert r.loop.phase_shifts == r.flag("new_frame").sum()  # every tick with a new frame moved the schedule
    assert r.flag("phase_shift").sum() == r.loop.phase_shifts
    assert r.loop.phase_early / r.loop.phase_shifts > 0.85          # settled: 9 early steps in 10
    assert r.loop.phase_shift_max_ns == r.loop.phase_max_slew_ns == 10_000     # acquiring: the slew bound
    assert r.loop.phase_shift_abs_ns >= abs(r.loop.phase_offset_ns) > 0
    assert (np.diff(r.rec["t_tick_ns"]) > 0).all()                  # the schedule stays monotonic


@pytest.mark.parametrize("ppm", [200, -200])
def test_phase_lock_follows_a_sender_off_by_200_ppm(pols, ppm):
    """Replaces test_phase_lock.py::test_phase_lock_follows_a_sender_off_by_200_ppm's rule check (and
    test_without_phase_lock_a_200_ppm_sender_drifts): locked, the frames keep arriving margin before the
    tick however far the sender's clock drifts; unlocked, their lead drifts by 200 ns a cycle."""
    margin, n = 100_000, 8000
    period = MS * (1 + ppm * 1e-6)
    s = Stream.periodic(n, period, 500_000, IRIS_X)
    r = run_virtual(pols["iris"], s, period_ns=MS, max_cycles=n - 10, phase_lock=True, phase_margin_ns=margin,
                    stale_after_ns=50 * MS, read_cost_ns=0)
    lead, cyc = _leads(r)
    settled = cyc >= 1500
    assert lead[settled].min() >= margin - 5_000 and lead[settled].max() <= margin + 10_000
    # the schedule followed: its net shift over the settled part is the sender's drift, 200 ns a frame
    t = r.rec["t_tick_ns"]
    drift = (t[-1] - t[1500]) - (len(t) - 1 - 1500) * MS
    assert abs(drift - ppm * 1e-6 * MS * (len(t) - 1 - 1500)) < 10_000      # within 1.5 ppm of the sender
    assert np.sign(r.loop.phase_offset_ns) == np.sign(ppm)          # a slow sender: the schedule moved later
    free = run_virtual(pols["iris"], s, period_ns=MS, max_cycles=n - 10, stale_after_ns=50 * MS, read_cost_ns=0)
    flead, _ = _leads(free)
    per_frame = -ppm * MS // 1_000_000    # the lead changes by 200 ns a frame, wrapping at a period (where a
    step = np.diff(flead) % MS            # faster sender's two frames meet in one tick: 400 ns, the newest acted on)
    assert np.isin(step, [per_frame % MS, 2 * per_frame % MS]).all() and np.ptp(flead) > MS - 1_000


# ---- watchdog ----

def test_stale_publishes_the_safe_action_at_the_exact_tick(pols):
    """Exact form of the stale -> safe checks of test_node.py's watchdog tests and test_decimation.py's trips
    (which the latter replaced its trip-timing checks with): with stale_after 5 ms the first tick more than 5 ms after the last frame's drain is stale and
    publishes the configured safe class with the last valid frame's seq; hold_last repeats the last class."""
    s = Stream.periodic(100, MS, 300_000, IRIS_X)
    for hold in (False, True):
        r = run_virtual(pols["iris"], s, period_ns=MS, max_cycles=130, stale_after_ns=5 * MS, safe_action=2,
                        hold_last=hold)
        stale = r.flag("stale")
        # the last frame (seq 100) arrives at 99.3 ms, drained at tick 100; stale from tick 106 on
        assert np.flatnonzero(stale).tolist() == [0] + list(range(106, 130))
        last_class = r.sent[100]["action"]
        for c in range(106, 130):
            m = r.sent[c]
            assert m["safe"] and m["seq"] == 100 and m["action"] == (last_class if hold else 2)
            assert r.rec["input_age_ns"][c] == -1
        assert r.loop.stale_cycles == 25 and r.loop.safe_actions == 25


def test_watchdog_trip_resets_recurrent_state_and_accepts_a_restarted_sender(pols):
    """Exact form of test_recurrent_node.py::test_state_is_carried_and_reset_on_a_watchdog_trip and of the
    restarted-sender rule (test_node.py), on the cycle: a trip zeroes
    the GRU state (the first answer after it equals a fresh policy's), counts a state reset, and lifts the
    seq rule once so a restarted sender's seq 1 is accepted; without a trip a lower seq is rejected."""
    gru = pols["gru"]
    xs = xs6(40, seed=7) * gru.spec.scale + gru.spec.mean
    s = Stream.periodic(20, MS, 300_000, xs)
    # a lower seq (5) without a silence: rejected
    s.add(T0 + 20 * MS + 300_000, 5, T0 + 20 * MS, xs[0])
    # the sender restarts after 10 ms of silence: seq 1, 2, 3 again
    for i in range(3):
        t = T0 + (31 + i) * MS + 300_000
        s.add(t, 1 + i, t - 50_000, xs[20 + i])
    r = run_virtual(gru, s, period_ns=MS, max_cycles=40, stale_after_ns=5 * MS)
    assert r.loop.rejected_counts()["seq_not_increasing"] == 1
    assert r.loop.state_resets == 1
    answered = {m["cycle"]: m for m in r.sent if not m["safe"]}
    fresh = Policy.load(gru.path) if hasattr(gru, "path") else None
    gru.reset()
    want_first = gru.act(xs[0])          # the first frame of the run, from zero state
    for i in range(1, 20):
        want_last = gru.act(xs[i])
    assert answered[1]["u"] == want_first.tolist() and answered[20]["u"] == want_last.tolist()
    gru.reset()
    after = [gru.act(xs[20 + i]).tolist() for i in range(3)]
    assert [answered[32 + i]["u"] for i in range(3)] == after and [answered[32 + i]["seq"] for i in range(3)] == [1, 2, 3]
    del fresh


# ---- misses and skipped ticks under stalls ----

@pytest.mark.parametrize("stall_ms", [0.5, 2.5, 7.3, 49.6])
@pytest.mark.parametrize("skip", [True, False])
def test_misses_and_skipped_ticks_under_a_stall(pols, stall_ms, skip):
    """Exact form of the miss / skipped-tick accounting that test_node.py and test_why_late.py can only check
    as evidence on a real host (they keep running): one wake-up comes stall_ms late (deadline one period). catch_up_skip on: the late cycle is a
    miss if stall > deadline, and the ticks that passed meanwhile are skipped and counted misses but the last,
    which runs late; off: the
    ticks run back to back, each late one a miss. The wake's lateness is recorded exactly."""
    stall = int(round(stall_ms * MS))
    s = Stream.periodic(300, MS, 300_000, IRIS_X)
    r = run_virtual(pols["iris"], s, stalls=[(T0 + 100 * MS, stall)], period_ns=MS, max_cycles=200,
                    stale_after_ns=100 * MS, catch_up_skip=skip)
    k, miss = r.k, r.flag("miss")
    whole = stall // MS
    i100 = int(np.flatnonzero(k == 100)[0])
    assert r.rec["wake_latency_ns"][i100] == stall
    if skip:
        # the ticks that passed during the stall are skipped (each a miss) but the last one, which runs late
        skipped = max(whole - 1, 0)
        assert r.loop.skipped_ticks == skipped
        assert np.flatnonzero(miss).tolist() == ([i100] if stall > MS else [])
        assert r.loop.deadline_misses == skipped + (1 if stall > MS else 0)
        if whole:
            assert k[i100 + 1] == 100 + whole and 0 < r.rec["wake_latency_ns"][i100 + 1] < MS
        else:
            assert k[i100 + 1] == 101
    else:
        assert r.loop.skipped_ticks == 0 and (k == np.arange(200)).all()
        assert np.flatnonzero(miss).tolist() == list(range(100, 100 + whole))
        assert r.loop.deadline_misses == whole
        # the ticks after the stall ran back to back, each waking as late as the stall left it
        assert [r.rec["wake_latency_ns"][100 + j] >= stall - j * MS for j in range(whole)] == [True] * whole
    assert r.loop.cycles == 200 and r.loop.frames_valid > 150


# ---- input age ----

def test_input_age_is_the_wake_minus_the_frames_stamp(pols):
    """Exact form of the input-age bookkeeping the process tests read from real runs: on an inference tick and on the hold
    ticks after it, the age is the tick's wake minus the t_ns of the frame acted on; -1 on safe ticks."""
    s = Stream.periodic(100, MS, 300_000, xs6(), transit_ns=80_000)
    r = run_virtual(pols["a"], s, period_ns=MS, max_cycles=100, decimation=4, stale_after_ns=5 * MS)
    t_wake = r.rec["t_tick_ns"] + r.rec["wake_latency_ns"]
    for c in range(1, 100):
        seq = r.sent[c]["seq"]
        stamp = T0 + (seq - 1) * MS + 300_000 - 80_000
        assert r.rec["input_age_ns"][c] == t_wake[c] - stamp
    assert r.rec["input_age_ns"][0] == -1 and r.sent[0]["safe"]
    assert r.rec["input_age_ns"][4] == MS - 300_000 + 80_000     # inference tick 4: the frame of 3.3 ms


# ---- history ----

@pytest.mark.parametrize("order", ["oldest_first", "newest_first"])
def test_history_stacks_the_frames_acted_on(pols, order):
    """Exact form of test_history.py::test_history_stacks_the_last_frames (a real node, kept), on the cycle and
    with a watchdog trip in the middle: the 6-input policy gets 2
    frames of 3, stacked in the configured order; the first inference repeats its frame; a trip refills."""
    a = pols["a"]
    rng = np.random.default_rng(5)
    frames3 = rng.normal(0.0, 1.0, size=(60, 3))
    s = Stream.periodic(60, MS, 300_000, frames3, skip=set(range(30, 40)))
    r = run_virtual(a, s, period_ns=MS, max_cycles=60, history=2, history_newest_first=order == "newest_first",
                    stale_after_ns=5 * MS)

    def stack(prev, cur):
        return np.concatenate([cur, prev] if order == "newest_first" else [prev, cur])

    infer = np.flatnonzero(r.flag("infer"))
    assert infer.tolist() == list(range(1, 31)) + list(range(41, 60))
    for c in infer:
        seq = r.sent[c]["seq"]
        cur = frames3[seq - 1]
        prev = frames3[seq - 2] if c not in (1, 41) else cur      # start and after the trip: refilled
        assert r.sent[c]["u"] == a.act(stack(prev, cur)).tolist(), c


# ---- canary and shadow ----

def _continuous_stream(n, x_of=None):
    xs = xs6(n, seed=11)
    if x_of:
        for i, x in x_of.items():
            xs[i] = x
    return Stream.periodic(n, MS, 300_000, xs), xs


def _transitions(loop):
    recs, _ = loop.transitions_since(0)
    return [(c, rundir.TRANSITIONS[kind - 1], slot, frm, rundir.TRANSITION_REASONS[why])
            for c, kind, slot, frm, why, _t, _s in recs]


def test_canary_non_finite_output_rolls_back_in_the_same_tick(pols):
    """Exact form of test_lifecycle.py::test_a_canary_with_non_finite_output_is_rolled_back_in_the_same_tick (the
    CLI path, kept): the canary's non-finite answer is never published; the previous policy answers that very tick."""
    s, xs = _continuous_stream(100, {49: np.full(6, 1e200)})
    r = run_virtual(pols["a"], s, period_ns=MS, max_cycles=100, stale_after_ns=5 * MS,
                    slots=[(1, pols["overflow"])], requests=[("canary", 1)])
    tr = _transitions(r.loop)
    assert tr[0] == (1, "canary", 1, 0, "request")
    assert tr[1] == (50, "auto_rollback", 0, 1, "non_finite")    # within cycle 50 (frame 50), which A answers
    assert r.rec["policy"][1:50].tolist() == [1] * 49 and r.rec["policy"][50:].tolist() == [0] * 50
    m = r.sent[50]
    assert not m["safe"] and m["u"] == pols["a"].act(xs[49]).tolist()
    assert r.loop.active == 0 and not r.loop.canary and r.loop.rejected_counts()["non_finite_output"] == 0


def test_canary_rolled_back_on_disagreement_at_the_window_end(pols):
    """Exact form of test_lifecycle.py::test_canary_rolled_back_on_disagreement_and_an_equal_one_promoted (first
    half; the CLI path, kept): B disagrees with A (the shadow) on every tick: rolled back on the last tick of the first window."""
    s, _ = _continuous_stream(100)
    rules = dict(canary_ticks=1000, window=10, max_disagree=0.2, budget_ns=0, max_over=3, distance=1e-9)
    r = run_virtual(pols["a"], s, period_ns=MS, max_cycles=100, stale_after_ns=5 * MS, rules=rules,
                    slots=[(1, pols["b"])], requests=[("canary", 1)])
    tr = _transitions(r.loop)
    # the canary starts at cycle 1; its 10th policy tick is cycle 10; the rollback takes effect from cycle 11
    assert tr == [(1, "canary", 1, 0, "request"), (11, "auto_rollback", 0, 1, "disagreement")]
    assert (r.rec["shadow"][1:11] == rundir.SHADOW_CODES.index("disagree")).all()
    assert (r.rec["shadow"][11:] == rundir.SHADOW_CODES.index("none")).all()


def test_an_agreeing_canary_is_promoted_after_canary_ticks(pols):
    """Exact form of the second half of test_lifecycle.py::test_canary_rolled_back_on_disagreement_and_an_equal_
    one_promoted (kept): A2 (A's weights) agrees on every tick and is promoted after exactly canary_ticks policy ticks."""
    s, _ = _continuous_stream(100)
    rules = dict(canary_ticks=30, window=10, max_disagree=0.2, budget_ns=0, max_over=3, distance=0.1)
    r = run_virtual(pols["a"], s, period_ns=MS, max_cycles=100, stale_after_ns=5 * MS, rules=rules,
                    slots=[(1, pols["a2"])], requests=[("canary", 1)])
    assert _transitions(r.loop) == [(1, "canary", 1, 0, "request"), (31, "promote", 1, 0, "canary_passed")]
    assert r.loop.active == 1 and not r.loop.canary and r.loop.shadow == -1
    assert (r.rec["shadow"][1:31] == rundir.SHADOW_CODES.index("agree")).all()
    assert (r.rec["shadow_dist"][1:31] == 0.0).all()


def test_a_non_finite_shadow_is_counted_at_its_cycle(pols):
    """A shadow whose output is not finite on one frame: that cycle's verdict is non_finite (distance -1), the
    active policy's answer is published unchanged, and nothing else counts as a failure."""
    s, xs = _continuous_stream(60, {29: np.full(6, 1e200)})
    r = run_virtual(pols["a"], s, period_ns=MS, max_cycles=60, stale_after_ns=5 * MS,
                    slots=[(1, pols["overflow"])], requests=[("shadow", 1)])
    codes = r.rec["shadow"]
    assert np.flatnonzero(codes == rundir.SHADOW_CODES.index("non_finite")).tolist() == [30]
    assert r.rec["shadow_dist"][30] == -1.0 and r.loop.shadow_nonfinite == 1
    assert r.loop.shadow_ticks == 59                      # every inference from cycle 1 on
    assert r.sent[30]["u"] == pols["a"].act(xs[29]).tolist() and not r.sent[30]["safe"]
    assert r.loop.active == 0 and r.loop.rejected_counts()["non_finite_output"] == 0


def test_canary_rolled_back_for_breaking_the_cycle_budget(pols):
    """The cycle-time rule (no process test could hit it at an exact tick): every canary tick costs more than
    the budget on the virtual clock; the canary is rolled back on its (max_over + 1)-th policy tick."""
    s, _ = _continuous_stream(100)
    rules = dict(canary_ticks=1000, window=50, max_disagree=1.0, budget_ns=1_000, max_over=3, distance=10.0)
    r = run_virtual(pols["a"], s, period_ns=MS, max_cycles=100, stale_after_ns=5 * MS, rules=rules,
                    slots=[(1, pols["a2"])], requests=[("canary", 1)], read_cost_ns=1_000)
    assert (r.rec["cycle_time_ns"][1:5] > 1_000).all()
    assert _transitions(r.loop) == [(1, "canary", 1, 0, "request"), (5, "auto_rollback", 0, 1, "cycle_budget")]


def test_shadow_verdicts_argmax(pols, make_spec, tmp_path):
    """The argmax side of test_lifecycle.py::test_shadow_never_changes_an_action_and_counts_what_an_offline_
    comparison_counts (continuous, kept): an argmax shadow agrees when it picks the same class (distance 0, else 1), its
    verdicts count exactly what an offline comparison counts, and the published class stays the active's."""
    other = _save(make_spec([4, 13, 3], seed=9), tmp_path / "other.npz")
    rng = np.random.default_rng(2)
    xs = rng.normal(0.0, 1.0, size=(200, 4)) * 2 + 4
    s = Stream.periodic(200, MS, 300_000, xs)
    r = run_virtual(pols["iris"], s, period_ns=MS, max_cycles=200, stale_after_ns=5 * MS,
                    slots=[(1, other)], requests=[("shadow", 1)])
    iris = pols["iris"]
    agree = disagree = 0
    for c in range(1, 200):             # the shadow starts after cycle 0 (no frame yet), cycle 1 on
        x = xs[r.sent[c]["seq"] - 1]
        a, b = int(iris.predict(x)), int(other.predict(x))
        assert r.sent[c]["action"] == a
        code = rundir.SHADOW_CODES[r.rec["shadow"][c]]
        assert code == ("agree" if a == b else "disagree") and r.rec["shadow_dist"][c] == (0.0 if a == b else 1.0)
        agree += a == b
        disagree += a != b
    assert agree > 10 and disagree > 10
    assert r.loop.shadow_disagree == disagree and r.loop.shadow_ticks == agree + disagree


# ---- the sensor clock ----

def test_sensor_clock_one_cycle_per_frame_and_safe_every_stale_after(pols):
    """The sensor clock on the virtual socket: each frame's arrival is a cycle (its tick), and while none
    comes the safe action is published every stale_after."""
    s = Stream.periodic(50, 2 * MS, 0, IRIS_X)
    r = run_virtual(pols["iris"], s, sensor_clock=True, period_ns=MS, stale_after_ns=10 * MS,
                    run_until_ns=T0 + 200 * MS, read_cost_ns=0)
    new = r.flag("new_frame")
    assert new.sum() == 50 and (r.rec["t_tick_ns"][new] == np.array(s.arrive)).all()
    tail = r.rec["t_tick_ns"][~new & (r.rec["t_tick_ns"] > s.arrive[-1])]
    assert (np.diff(tail) == 10 * MS).all() and len(tail) >= 9
    assert all(m["safe"] for m in r.sent[-len(tail):])


def test_sensor_clock_with_a_long_watchdog_ends_on_time(pols):
    """A 20 s stale_after with no frame coming: the run ends at its --duration (run_until), within one wait
    slice (50 ms), with no cycle (nothing came and the watchdog was not due), instead of after one whole
    stale_after. The process evidence is the ROS 2 bridge tests' nodes, which stop at once on SIGTERM."""
    r = run_virtual(pols["iris"], None, sensor_clock=True, period_ns=MS, stale_after_ns=20_000 * MS,
                    run_until_ns=T0 + 1_000 * MS, read_cost_ns=0)
    assert r.loop.cycles == 0 and r.loop.waiting == 1
    assert T0 + 1_000 * MS <= r.loop.t_end_ns <= T0 + 1_050 * MS, r.loop.t_end_ns - T0
    # and a frame after a second of silence is answered at its arrival, the slices notwithstanding
    s = Stream.periodic(3, 700 * MS, 300 * MS, IRIS_X)
    r = run_virtual(pols["iris"], s, sensor_clock=True, period_ns=MS, stale_after_ns=20_000 * MS,
                    run_until_ns=T0 + 3_000 * MS, read_cost_ns=0)
    assert r.loop.cycles == 3 and (r.rec["t_tick_ns"] == np.array(s.arrive)).all()


def test_a_multipart_and_an_oversized_frame_are_rejected(pols):
    """Bad frames on the virtual socket go through the real drain: each counted under its reason, and the
    good frame after them is still acted on."""
    s = Stream.periodic(10, MS, 300_000, IRIS_X)
    s.add_bad(T0 + 3 * MS + 400_000, (frame(50, 0, IRIS_X[0]), b"more"))
    s.add_bad(T0 + 5 * MS + 400_000, frame(60, 0, IRIS_X[0]) + b"\0" * 5000)
    r = run_virtual(pols["iris"], s, period_ns=MS, max_cycles=11, stale_after_ns=5 * MS, max_frame_bytes=1024)
    rej = r.loop.rejected_counts()
    assert rej["multipart"] == 1 and rej["oversized"] == 1 and sum(rej.values()) == 2
    assert np.flatnonzero(r.flag("rejected")).tolist() == [4, 6]      # drained at the next tick
    assert [m["seq"] for m in r.sent[1:11]] == list(range(1, 11))


# ---- the loop's API ----

def test_loop_config_and_virtual_run_refuse_what_cannot_run(pols):
    with pytest.raises(ValueError, match="decimation"):
        RtLoop(pols["iris"], LoopConfig(period_ns=MS, decimation=2, sensor_clock=True))
    loop = RtLoop(pols["iris"], LoopConfig(period_ns=MS))
    with pytest.raises(RuntimeError, match="run_virtual"):
        loop.run()
    with pytest.raises(ValueError, match="max_cycles or run_until_ns"):
        loop.run_virtual(VirtualIO([], []))
    assert LoopConfig(period_ns=MS).replace(decimation=3).decimation == 3
    assert RtLoop(pols["iris"], LoopConfig(period_ns=MS, safe_action=2)).safe_action == 2
