"""The legged deploy path inside the real compiled cycle (RtLoop + LeggedCycle), on a virtual clock, against
the plain numpy reference of the whole path (legged.DeployReference: mode sequence, recipe, history, policy,
target, PD, limits, modes), cycle by cycle (issue 45, "Reference tests").

Frames arrive half a period before each tick, so the frame a cycle drains is known exactly; the policy's
schedule (which cycles are policy ticks) is the loop's own, checked here against its rule: in policy mode,
the entry cycle and every decimation-th tick after it that holds a frame not acted on."""
from __future__ import annotations

import numpy as np
import pytest

from support.virtual_loop import MS, T0, Stream, run_virtual
from control_node.kernels import ModelSpec, Policy
from control_node.loop import legged as L
from control_node.loop._legged import LeggedCycle

TOL = dict(rtol=1e-9, atol=1e-9)     # the kernel's SIMD sums against numpy's, through a PD of kp <= 60
LEGS = ("FL", "FR", "RL", "RR")
QUAD = [f"{leg}_{p}_joint" for leg in LEGS for p in ("hip", "thigh", "calf")]
# MuJoCo Menagerie's Go2 lists its actuators FR, FL, RR, RL: the robot's order differs from the policy's
QUAD_ROBOT = [f"{leg}_{p}_joint" for leg in ("FR", "FL", "RR", "RL") for p in ("hip", "thigh", "calf")]
Q0 = [0.1, 0.8, -1.5, -0.1, 0.8, -1.5, 0.1, 1.0, -1.5, -0.1, 1.0, -1.5]


def isaaclab_quadruped(history=5, quat="wxyz", scale=0.25):
    """IsaacLab's velocity task layout: base_ang_vel, projected_gravity, velocity_commands, joint_pos_rel,
    joint_vel_rel, last_action, each with a term-major history."""
    h = {"history": history}
    return {"joints": {"policy": QUAD, "robot": QUAD_ROBOT}, "default_pos": Q0, "policy_dt": 0.02,
            "observation": {"terms": [{"kind": "base_ang_vel", "scale": 0.25, **h}, {"kind": "projected_gravity", **h},
                                      {"kind": "velocity_commands", **h}, {"kind": "joint_pos_rel", **h},
                                      {"kind": "joint_vel_rel", "scale": 0.05, **h}, {"kind": "last_action", **h}],
                            "quat_order": quat, "n_commands": 3},
            "action": {"scale": scale},
            "actuator": {"kp": 40.0, "kd": 1.0, "tau_max": 23.7, "period": 0.001, "stale_after": 0.05,
                         "pd_max_age": 0.004, "pd_ramp": 0.02},
            "modes": {"stand_time": 0.4, "damping_kd": 2.0, "stand_kp": 60.0, "stand_kd": 2.0}}


HUMANOID = [f"{side}_{j}" for side in ("left", "right") for j in ("hip_pitch", "hip_roll", "knee", "ankle", "toe")]


def humanoid_with_clock():
    """A humanoid-gym style layout: the two-leg gait clock first, command, q - q0, qd, last action, gyro,
    frame-major history of 3 frames filled with zeros, the quaternion in ROS order, per-joint action scale."""
    return {"joints": {"policy": HUMANOID, "robot": HUMANOID[::-1]}, "default_pos": [0.0, 0.0, 0.3, -0.2, 0.0] * 2,
            "policy_dt": 0.01,
            "observation": {"terms": [{"kind": "gait_clock", "form": "two_leg", "period": 0.64},
                                      {"kind": "command", "scale": [2.0, 2.0, 1.0]}, {"kind": "joint_pos_rel"},
                                      {"kind": "joint_vel", "scale": 0.05, "clip": [-2.0, 2.0]},
                                      {"kind": "last_action", "clip": [-5.0, 5.0]}, {"kind": "gyro"},
                                      {"kind": "projected_gravity"}],
                            "quat_order": "xyzw", "n_commands": 3, "clip_stage": "after_scale",
                            "history": {"layout": "frame", "fill": "zeros", "length": 3}},
            "action": {"scale": [0.25, 0.25, 0.5, 0.5, 0.1] * 2},
            "actuator": {"kp": [60, 60, 80, 30, 10] * 2, "kd": [2, 2, 2, 1, 0.5] * 2, "tau_max": 40.0,
                         "period": 0.001, "stale_after": 0.05, "pd_max_age": 0.004},
            "modes": {"stand_time": 0.2, "policy_without_stand": False}}


def mlp(n_in, n_out, seed, recurrent=None, hidden=32, gain=1.0):
    rng = np.random.default_rng(seed)
    kw = {}
    n0 = n_in
    if recurrent:
        H, G = 16, len(("r", "z", "n") if recurrent == "gru" else "ifgo")
        kw = dict(recurrent=recurrent, rnn_W_ih=rng.normal(0, 0.3, (G * H, n_in)), rnn_W_hh=rng.normal(0, 0.3, (G * H, H)),
                  rnn_b_ih=rng.normal(0, 0.1, G * H), rnn_b_hh=rng.normal(0, 0.1, G * H))
        n0 = H
    return ModelSpec(layers=[(gain * rng.normal(0, 1 / np.sqrt(n0), (n0, hidden)), rng.normal(0, 0.1, hidden)),
                             (rng.normal(0, 0.5 / np.sqrt(hidden), (hidden, n_out)), np.zeros(n_out))],
                     mean=0.0, scale=1.0, classes=[], feature_names=[f"o{i}" for i in range(n_in)],
                     head="continuous", activations=["elu", "identity"], action_names=[f"a{i}" for i in range(n_out)],
                     **kw)


def frames(op, n, seed, q0_robot, stop=None, spike=None):
    """n frames of raw signals (frame_layout), a random walk around the default pose; none from ``stop``;
    frame ``spike`` holds a gyro of 1e300 (finite: the frame is valid, the policy's output is not)."""
    rng = np.random.default_rng(seed)
    lay = {name: (o, w) for name, o, w in L.frame_layout(op)}
    fw = sum(w for _, w in lay.values())
    out = {}
    x = np.zeros(fw)
    o, w = lay["joint_pos"]
    x[o:o + w] = np.asarray(q0_robot) + rng.normal(0, 0.3, w)
    for c in range(n if stop is None else min(n, stop)):
        x = x.copy()
        x[lay["joint_pos"][0]:lay["joint_vel"][0] + w] += rng.normal(0, 0.01, 2 * w)
        q = rng.normal(0, 0.05, 4)
        q[0] += 1.0
        q /= np.linalg.norm(q)
        oq = lay["imu_quat"][0]
        x[oq:oq + 4] = q if op.quat_order == 0 else q[[1, 2, 3, 0]]
        x[lay["imu_gyro"][0]:lay["imu_gyro"][0] + 3] = rng.normal(0, 0.3, 3)
        x[lay["imu_acc"][0]:lay["imu_acc"][0] + 3] = rng.normal(0, 1, 3) + [0, 0, 9.81]
        x[lay["command"][0]:lay["command"][0] + lay["command"][1]] = [0.5, 0.0, 0.2][:lay["command"][1]]
        if c == spike:
            x[lay["imu_gyro"][0]] = 1e300
        out[c] = x
    return out


def run_both(recipe, spec, *, output="torque", sequence=(), n=1600, decimation=20, stop=None, spike=None, seed=1):
    op, ap = L.build_plans(recipe, spec.n_features, spec.n_actions)
    lc = LeggedCycle(op, ap, output, capacity=n + 16)
    lc.set_sequence(list(sequence))
    q0_robot = np.asarray(recipe["default_pos"], dtype=float)[[op.joint_map.tolist().index(i) for i in range(op.n_robot)]] \
        if op.n_robot == op.n_joints else None
    fr = frames(op, n, seed, q0_robot, stop=stop, spike=spike)
    s = Stream([], [], [], [], [])
    for c, x in fr.items():
        s.add(T0 + c * MS - MS // 2, c + 1, T0 + c * MS - MS // 2, x)
    run = run_virtual(Policy(spec), s, legged=lc, period_ns=MS, decimation=decimation,
                      stale_after_ns=ap.stale_after_ns, max_cycles=n)
    ref = L.DeployReference(op, ap, spec, output, sequence)
    t_wake = run.rec["t_tick_ns"] + run.rec["wake_latency_ns"]
    infer = run.flag("infer")
    by_cycle = {m["cycle"]: m for m in run.sent}
    modes = lc.mode_ring[:n]          # each cycle's mode after its tick
    at_start = np.zeros(n, dtype=int)   # the mode the cycle's policy tick saw (after a request, before the tick)
    for c in range(n):
        want, sent = ref.cycle(c, int(t_wake[c]), fr.get(c), bool(infer[c]))
        at_start[c] = ref.mode_at_start
        assert (c in by_cycle) == sent, f"cycle {c}: sent {c in by_cycle}, reference {sent}"
        if sent:
            np.testing.assert_allclose(by_cycle[c]["u"], want, **TOL, err_msg=f"cycle {c} (mode {L.MODES[modes[c]]})")
        assert modes[c] == ref.ra.mode, f"cycle {c}"
    # the schedule's rule: the policy runs only in policy mode, on the first tick at or after a policy tick
    # (every decimation-th, and the mode's entry) that holds a frame it has not acted on
    want, pending, fresh = np.zeros(n, bool), False, False
    for c in range(n):
        fresh |= c in fr
        entered = at_start[c] == L.POLICY and (c == 0 or modes[c - 1] != L.POLICY)
        pending |= c % decimation == 0 or entered
        if pending and fresh and at_start[c] == L.POLICY:
            want[c], pending, fresh = True, False, False
    assert (infer == want).all(), np.flatnonzero(infer != want)[:10]
    return run, lc, ref, modes


def test_isaaclab_quadruped_term_major_history_robot_order_differs():
    """passive -> stand (from the measured pose) -> policy at 50 Hz in a 1 kHz PD loop -> the frames stop ->
    damping after stale_after: every published torque (robot actuator order) equals the reference's."""
    recipe = isaaclab_quadruped()
    op, _ = L.build_plans(recipe)
    spec = mlp(op.out_width, 12, seed=2)
    run, lc, ref, modes = run_both(recipe, spec, sequence=[(100, "stand"), (300, "policy")], stop=1200)
    assert modes[50] == L.PASSIVE and modes[200] == L.STAND and modes[1100] == L.POLICY
    # the policy entered at the cycle boundary after the stand completed (0.4 s after cycle 100), not at 300
    assert np.flatnonzero(modes == L.POLICY)[0] == 501
    assert modes[-1] == L.DAMPING and lc.act.counts["stale_trips"] == 1
    tr = lc.act.drain_transitions()
    assert [(c, L.MODES[a], L.MODES[b], L.REASONS[r]) for c, _, a, b, r in tr] == [
        (100, "passive", "stand", "request"), (501, "stand", "policy", "request"),
        (1250, "policy", "damping", "stale")]
    # torques clipped at tau_max; the last cycles damp with kd only
    u = np.array([m["u"] for m in run.sent])
    assert np.abs(u).max() <= 23.7


def test_the_quaternion_in_either_order_gives_the_same_commands():
    """The same robot state sent with its quaternion in either order (the recipe says which): identical."""
    sent = {}
    for quat in ("wxyz", "xyzw"):
        recipe = isaaclab_quadruped(history=1, quat=quat)
        op, _ = L.build_plans(recipe)
        run, *_ = run_both(recipe, mlp(op.out_width, 12, seed=3), sequence=[(0, "stand"), (10, "policy")], n=600)
        sent[quat] = [m["u"] for m in run.sent]
    assert sent["wxyz"] == sent["xyzw"] and len(sent["wxyz"]) == 600


def test_humanoid_gait_clock_recurrent_frame_major_zeros_per_joint_scale_position_output():
    """A GRU policy at 100 Hz with the two-leg gait clock and frame-major history (zeros); position targets
    published (none while passive: a position interface has no 'no command')."""
    recipe = humanoid_with_clock()
    op, _ = L.build_plans(recipe)
    spec = mlp(op.out_width, 10, seed=4, recurrent="gru")
    run, lc, ref, modes = run_both(recipe, spec, output="position", sequence=[(50, "stand"), (60, "policy")],
                                   n=900, decimation=10)
    assert not any(m["cycle"] < 50 for m in run.sent)          # passive: nothing sent
    assert modes[899] == L.POLICY and lc.obs.ticks > 50


def test_impedance_output_and_a_non_finite_action_goes_to_damping():
    """Impedance commands (q*, qd*, kp, kd, tau_ff per joint); a frame whose gyro (1e300) makes the policy's
    output overflow: the action is never applied, the actuator damps from that tick on."""
    recipe = isaaclab_quadruped(history=1)
    op, _ = L.build_plans(recipe)
    rng = np.random.default_rng(5)
    W = rng.normal(0, 0.01, (op.out_width, 12))
    W[0, :] = 1e200             # gyro x: finite for the walk's values, +-inf for 1e300 (the frame is valid)
    spec = ModelSpec(layers=[(W, np.zeros(12))], mean=0.0, scale=1.0, classes=[], head="continuous",
                     feature_names=[f"o{i}" for i in range(op.out_width)], activations=["identity"],
                     action_names=QUAD)
    run, lc, ref, modes = run_both(recipe, spec, output="impedance", sequence=[(0, "stand"), (1, "policy")],
                                   n=1200, spike=900)
    assert lc.act.counts["non_finite_trips"] == 1 and modes[-1] == L.DAMPING
    assert modes[899] == L.POLICY and modes[900] == L.DAMPING          # the policy tick that met the spike
    last = np.array(run.sent[-1]["u"]).reshape(5, 12)
    assert (last[2] == 0).all() and (last[3] == 2.0).all()        # damping: kp 0, kd = damping_kd


def test_mode_requests_through_the_mailbox_and_policy_refused_before_stand():
    recipe = isaaclab_quadruped(history=1)
    op, ap = L.build_plans(recipe)
    lc = LeggedCycle(op, ap, "torque", capacity=64)
    seq = lc.post_mode("policy")
    lc.apply_pending(0, 0)
    assert lc.mode_done(seq) == L.REQ_NO_STAND and lc.mode == "passive"
    seq = lc.post_mode("damping")
    with pytest.raises(RuntimeError, match="still pending"):
        lc.post_mode("stand")
    lc.apply_pending(0, 0)
    assert lc.mode_done(seq) == L.REQ_OK and lc.mode == "damping"
    with pytest.raises(ValueError, match="use one of"):
        lc.post_mode("walk")


def test_the_loop_refuses_a_recipe_that_does_not_fit_the_policy():
    recipe = isaaclab_quadruped(history=1)
    op, ap = L.build_plans(recipe)
    from control_node.loop._rtloop import LoopConfig, RtLoop
    with pytest.raises(ValueError, match=f"the recipe builds {op.out_width} inputs"):
        RtLoop(Policy(mlp(op.out_width + 1, 12, seed=7)), LoopConfig(period_ns=MS), legged=LeggedCycle(op, ap))
    with pytest.raises(ValueError, match="history = 1"):
        RtLoop(Policy(mlp(2 * op.out_width, 12, seed=7)), LoopConfig(period_ns=MS, history=2),
               legged=LeggedCycle(op, ap))


def test_the_cycle_allocates_nothing_with_the_legged_path():
    """A virtual run of 20,000 cycles with the recipe, the policy and the PD: no Python allocation left behind
    per cycle (the pattern of tests/support/alloc.py)."""
    from support.alloc import bytes_left_by_calls
    recipe = isaaclab_quadruped()
    op, ap = L.build_plans(recipe)
    spec = mlp(op.out_width, 12, seed=8)
    pol = Policy(spec)
    lc = LeggedCycle(op, ap, "torque", capacity=1000)
    lc.set_sequence([(0, "stand"), (1, "policy")])
    from control_node.loop._rtloop import LoopConfig, RtLoop, VirtualIO
    fr = frames(op, 200, 9, np.zeros(12))
    arrive = [T0 + c * MS - MS // 2 for c in fr]
    import msgpack
    data = [msgpack.packb({"seq": c + 1, "t_ns": a, "x": x.tolist()}) for (c, x), a in zip(fr.items(), arrive)]
    loop = RtLoop(pol, LoopConfig(period_ns=MS, decimation=20, stale_after_ns=10**12, max_cycles=200,
                                  ring_cycles=1000), legged=lc)

    # the virtual sockets made before the counted calls: what is counted is the runs' own (the nogil cycles)
    ios = iter([VirtualIO(arrive, data, read_cost_ns=1000, send_capacity=1) for _ in range(23)])

    def run_once():
        loop.run_virtual(next(ios), T0)
    run_once()
    left, blocks = bytes_left_by_calls(run_once, n=20, warm=2)
    # 4,000 cycles run (20 runs of 200): a cycle that left even one block behind would leave thousands
    print(f"left behind by 20 runs of 200 cycles: {left} B in {blocks} blocks")
    assert blocks < 20 and left < 4 * 1024, (left, blocks)


def test_a_legged_canary_that_fails_rolls_back_onto_the_previous_policy_s_own_input():
    """A (slot 0) runs; B (slot 1, its own recipe state) is activated as a canary with A in shadow. B's output
    overflows on a frame whose gyro is 1e300 (a valid frame): the loop rolls back to A at that policy tick, and
    A answers on its own input (its history and last action ran on as the shadow), so the command is A's as if
    A had run all along: equal to the reference of A alone (A ignores gyro x, so on B's input, whose last
    action is B's, its answer differs: checked by reverting the fix, the test fails at the spike's cycle). The
    mode stays policy: a canary's failure is the rollback's, not a fault of the robot's."""
    from control_node import rundir
    recipe = isaaclab_quadruped(history=1)
    recipe["modes"]["policy_without_stand"] = True
    op, ap = L.build_plans(recipe)
    spec_a = mlp(op.out_width, 12, seed=41)
    spec_a.layers[0][0][0, :] = 0.0     # A ignores gyro x, so its answer at the spike shows which input it got
    spec_a = ModelSpec(**{f: getattr(spec_a, f) for f in ("layers", "mean", "scale", "classes", "feature_names",
                                                          "head", "activations", "action_names")})
    rng = np.random.default_rng(42)
    W = rng.normal(0, 0.01, (op.out_width, 12))
    W[0, :] = 1e200                 # gyro x: +-inf for 1e300, finite for the walk's values
    spec_b = ModelSpec(layers=[(W, np.zeros(12))], mean=0.0, scale=1.0, classes=[], head="continuous",
                       feature_names=[f"o{i}" for i in range(op.out_width)], activations=["identity"],
                       action_names=QUAD)
    lc = LeggedCycle(op, ap, "torque", capacity=1016)
    lc.set_sequence([(0, "policy")])
    lc.set_slot_obs(1, op)
    q0_robot = np.asarray(recipe["default_pos"])[[op.joint_map.tolist().index(i) for i in range(12)]]
    fr = frames(op, 1000, 43, q0_robot, spike=600)
    s = Stream([], [], [], [], [])
    for c, x in fr.items():
        s.add(T0 + c * MS - MS // 2, c + 1, T0 + c * MS - MS // 2, x)
    run = run_virtual(Policy(spec_a), s, legged=lc, period_ns=MS, decimation=20, stale_after_ns=ap.stale_after_ns,
                      max_cycles=1000, slots=[(1, Policy(spec_b))], requests=[("canary", 1)],
                      rules=dict(canary_ticks=100_000, window=50, max_disagree=1.0, budget_ns=0, max_over=100_000,
                                 distance=1e300))
    tr, _ = run.loop.transitions_since(0)
    events = [(rundir.TRANSITIONS[k - 1], slot, rundir.TRANSITION_REASONS[why]) for _, k, slot, _, why, _, _ in tr]
    assert events == [("canary", 1, "request"), ("auto_rollback", 0, "non_finite")], events
    c_back = int(tr[1][0])
    assert c_back == 600 and run.loop.active == 0
    assert lc.mode == "policy" and lc.act.counts["non_finite_trips"] == 0
    # A alone, as if it had run all along (as the shadow it did, on its own recipe state)
    ref = L.DeployReference(op, ap, spec_a, "torque", [(0, "policy")])
    t_wake = run.rec["t_tick_ns"] + run.rec["wake_latency_ns"]
    infer = run.flag("infer")
    by_cycle = {m["cycle"]: m for m in run.sent}
    for c in range(1000):
        want = ref.cycle(c, int(t_wake[c]), fr.get(c), bool(infer[c]))[0]
        if c == 0 or c >= c_back:        # A active: its commands are the reference's, the rollback's tick too
            np.testing.assert_allclose(by_cycle[c]["u"], want, **TOL, err_msg=f"cycle {c}")
