"""The legged deploy units (control_node/loop/obs_terms.h, actuator.h through _legged.pyx) against their plain
numpy reference (control_node.loop.legged), step by step on made-up time: a virtual 1 kHz clock (T0 + c ms),
a 50 Hz policy tick every 20th cycle, frame ages chosen per cycle, mode requests at chosen cycles. No wall
clock, no process: every comparison is exact up to libm rounding (rtol 1e-12), every time is the test's own.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_node.loop import legged
from control_node.loop._legged import Actuator, ObsTerms
from control_node.loop.legged import (DAMPING, MODES, PASSIVE, POLICY, REQ_NO_STAND, REQ_OK, STAND, WHY_NON_FINITE,
                                      WHY_REQUEST, WHY_STALE, WHY_VELOCITY_GUARD, ActRefState, ObsRefState,
                                      RecipeError, build_actuator_plan, build_obs_plan, build_plans,
                                      projected_gravity, reference_actuator, reference_non_finite, reference_obs,
                                      reference_request)
from support.alloc import bytes_left_by_calls

MS = 1_000_000
T0 = 10 * MS
DECIMATION = 20           # 50 Hz policy in a 1 kHz loop
TOL = dict(rtol=1e-12, atol=1e-12)

LEGS_POLICY = ["FL", "FR", "RL", "RR"]        # IsaacLab / Isaac Gym order
LEGS_ROBOT = ["FR", "FL", "RR", "RL"]         # Unitree SDK / Menagerie actuator order
PARTS = ["hip", "thigh", "calf"]


def quad_joints(legs):
    return [f"{leg}_{p}_joint" for leg in legs for p in PARTS]


def quadruped_recipe(**over):
    """An IsaacLab velocity-policy layout (ω, g, cmd, q - q0, q̇, a_prev), term-major history 5, the robot's
    joints in Unitree order, per-joint action scale (robot_lab's go2: hip 0.125, others 0.25)."""
    pj = quad_joints(LEGS_POLICY)
    h = 5
    r = {
        "joints": {"policy": pj, "robot": quad_joints(LEGS_ROBOT)},
        "default_pos": [0.1, 0.8, -1.5, -0.1, 0.8, -1.5, 0.1, 1.0, -1.5, -0.1, 1.0, -1.5],
        "policy_dt": 0.02,
        "observation": {
            "terms": [{"kind": "base_ang_vel", "scale": 0.25, "history": h},
                      {"kind": "projected_gravity", "history": h},
                      {"kind": "velocity_commands", "history": h},
                      {"kind": "joint_pos_rel", "history": h},
                      {"kind": "joint_vel", "scale": 0.05, "history": h},
                      {"kind": "last_action", "history": h, "clip": [-5, 5]}],
            "quat_order": "wxyz", "n_commands": 3,
        },
        "action": {"scale": [0.125, 0.25, 0.25] * 4},
        "actuator": {"kp": 25.0, "kd": 0.5, "tau_max": [23.7, 23.7, 45.4] * 4, "period": 0.001,
                     "stale_after": 0.1, "pd_max_age": 0.005, "pd_ramp": 0.05},
        "modes": {"damping_kd": 3.0, "stand_kp": 50.0, "stand_kd": 2.0, "stand_time": 1.0,
                  "stand_tolerance": 0.05},
    }
    for k, v in over.items():
        r[k] = v
    return r


def humanoid_recipe(**over):
    """A humanoid layout ending with the two-leg gait clock [cos φ0, cos φ1, sin φ0, sin φ1] (legs half a
    period apart), no history, k starting at 1."""
    joints = [f"{s}_{p}" for s in ("left", "right") for p in ("hip_pitch", "hip_roll", "hip_yaw", "knee",
                                                                "ankle_pitch", "ankle_roll")]
    r = {
        "joints": {"policy": joints, "robot": joints[6:] + joints[:6]},
        "default_pos": [-0.1, 0, 0, 0.3, -0.2, 0] * 2,
        "policy_dt": 0.02,
        "observation": {
            "terms": [{"kind": "gyro", "scale": 0.25}, {"kind": "projected_gravity"},
                      {"kind": "command", "scale": [2.0, 2.0, 0.25]}, {"kind": "joint_pos_rel"},
                      {"kind": "joint_vel", "scale": 0.05}, {"kind": "last_action"},
                      {"kind": "gait_clock", "period": 0.8, "form": "two_leg", "offsets": [0.0, 0.5]}],
            "quat_order": "xyzw", "n_commands": 3,
        },
        "action": {"scale": 0.25},
        "actuator": {"kp": [100, 100, 100, 150, 40, 40] * 2, "kd": [2, 2, 2, 4, 2, 2] * 2, "tau_max": 88.0},
        "modes": {"damping_kd": 8.0, "stand_time": 1.0},
    }
    r.update(over)
    return r


def frame_major_recipe():
    """humanoid-gym's layout: [sin, cos] clock first, 3 frames oldest first, filled with zeros, the scaled
    observation clipped at ±18."""
    joints = [f"j{i}" for i in range(6)]
    return {
        "joints": {"policy": joints, "robot": joints},
        "policy_dt": 0.01,
        "observation": {
            "terms": [{"kind": "gait_clock", "period": 0.64}, {"kind": "command", "scale": [2.0, 2.0, 1.0]},
                      {"kind": "joint_pos_rel", "clip": [-18, 18]}, {"kind": "joint_vel", "scale": 0.05},
                      {"kind": "last_action", "clip": [-18, 18]}, {"kind": "gyro", "clip": [-18, 18]},
                      {"kind": "constant", "values": [1.0, -2.0]}],
            "n_commands": 3, "clip_stage": "after_scale",
            "history": {"layout": "frame", "length": 3, "fill": "zeros"},
        },
        "actuator": {"kp": 200.0, "kd": 10.0, "tau_max": 18.0},
    }


def unit_quat(rng):
    q = rng.normal(size=4)
    return q / np.linalg.norm(q)


class Signals:
    """One frame's raw signals in preallocated arrays (the compiled call reuses them; no per-call allocation)."""

    def __init__(self, n_robot, n_cmd):
        self.joint_pos, self.joint_vel = np.zeros(n_robot), np.zeros(n_robot)
        self.quat, self.gyro, self.acc = np.array([1.0, 0, 0, 0]), np.zeros(3), np.zeros(3)
        self.command = np.zeros(max(n_cmd, 0))

    def randomise(self, rng, scale=1.0):
        self.joint_pos[:] = rng.normal(0, scale, self.joint_pos.size)
        self.joint_vel[:] = rng.normal(0, 3 * scale, self.joint_vel.size)
        self.quat[:] = unit_quat(rng)
        self.gyro[:] = rng.normal(0, 2, 3)
        self.acc[:] = rng.normal(0, 9.8, 3)
        self.command[:] = rng.uniform(-1, 1, self.command.size)

    def args(self):
        return (self.joint_pos, self.joint_vel, self.quat, self.gyro, self.acc, self.command)

    def as_dict(self):
        return {"joint_pos": self.joint_pos, "joint_vel": self.joint_vel, "quat": self.quat, "gyro": self.gyro,
                "acc": self.acc, "command": self.command}


def run_obs(plan, ticks, *, seed=0, reset_at=(), u_max=3.0, closed_loop=True):
    """``ticks`` policy ticks of the compiled recipe and the reference side by side, a made-up linear policy
    closing the last-action loop; reset (the policy re-entered) at the ticks in ``reset_at``. Returns the
    compiled observations. ``closed_loop`` False: actions drawn at random (the same for any layout)."""
    rng = np.random.default_rng(seed)
    obs, ref = ObsTerms(plan), ObsRefState(plan)
    sig = Signals(plan.n_robot, plan.n_cmd)
    W = rng.normal(0, 2.0 / math.sqrt(plan.out_width), (plan.n_act, plan.out_width))
    x = np.zeros(plan.out_width)
    got = []
    for k in range(ticks):
        if k in reset_at:
            obs.reset()
            ref.reset()
        sig.randomise(rng)
        obs.compute(*sig.args(), x)
        want = reference_obs(plan, sig.as_dict(), ref)
        np.testing.assert_allclose(x, want, **TOL, err_msg=f"policy tick {k}")
        # the raw output (beyond a clip of the term, sometimes)
        u = u_max * np.tanh(W @ x if closed_loop else rng.normal(size=plan.n_act))
        obs.note_action(u)
        ref.note_action(u)
        got.append(x.copy())
    return got


class Drive:
    """The compiled actuator (with the recipe) and the reference, ticked together on the virtual clock."""

    def __init__(self, recipe, seed=0):
        self.op, self.ap = build_plans(recipe)
        self.obs, self.act = ObsTerms(self.op), Actuator(self.ap)
        self.ro, self.ra = ObsRefState(self.op), ActRefState(self.ap)
        self.rng = np.random.default_rng(seed)
        self.sig = Signals(self.op.n_robot, self.op.n_cmd)
        self.W = self.rng.normal(0, 0.3 / math.sqrt(self.op.out_width), (self.ap.n, self.op.out_width))
        self.x = np.zeros(self.op.out_width)
        self.out = np.zeros((len(legged.OUT_ROWS), self.ap.n_out))
        self.c = 0
        self.statuses, self.outs, self.actions = [], [], []

    def t(self, c=None):
        return T0 + (self.c if c is None else c) * MS

    def request(self, mode):
        m = MODES.index(mode)
        r = self.act.request_mode(mode, self.t())
        assert r == reference_request(self.ap, self.ra, m, self.t())
        if r == REQ_OK and m == POLICY:      # the caller's rule: entering the policy resets its observation
            self.obs.reset()
            self.ro.reset()
        return r

    def tick(self, *, age=200_000, q=None, qd=None, action="policy"):
        """One loop cycle: on a policy tick in policy mode the recipe and a made-up policy run first."""
        a = None
        if q is not None:
            self.sig.joint_pos[:] = q
        if qd is not None:
            self.sig.joint_vel[:] = qd
        if isinstance(action, str) and self.c % DECIMATION == 0 and self.act.mode == POLICY and age <= \
                self.ap.stale_after_ns:
            self.obs.compute(*self.sig.args(), self.x)
            np.testing.assert_allclose(self.x, reference_obs(self.op, self.sig.as_dict(), self.ro), **TOL)
            a = np.tanh(self.W @ self.x)
            self.obs.note_action(a)
            self.ro.note_action(a)
        elif action is not None and not isinstance(action, str):
            a = np.asarray(action, dtype=np.float64)
        st = self.act.tick(self.t(), age, self.sig.joint_pos, self.sig.joint_vel, a, self.out)
        want, st_r = reference_actuator(self.ap, self.ra, self.t(), age, self.sig.joint_pos, self.sig.joint_vel, a)
        assert st == st_r, (self.c, st, st_r)
        np.testing.assert_allclose(self.out, want, **TOL, err_msg=f"cycle {self.c}")
        self.statuses.append(st)
        self.outs.append(self.out.copy())
        self.actions.append(a)
        self.c += 1
        return st

    def run(self, n, **kw):
        for _ in range(n):
            self.tick(**kw)

    def check_transitions(self):
        got = self.act.drain_transitions()
        assert got == self.ra.transitions
        self.ra.transitions = []
        return got

    def check_counts(self):
        c = dict(self.act.counts)
        assert c.pop("transitions_dropped") == 0
        assert c == self.ra.counts


# ---- the observation recipe -------------------------------------------------------------------------------

def test_isaaclab_quadruped_term_major_history_5():
    plan = build_obs_plan(quadruped_recipe(), n_inputs=(3 + 3 + 3 + 12 + 12 + 12) * 5)
    xs = run_obs(plan, 60, reset_at={31})
    x0 = xs[0].reshape(-1)
    # IsaacLab's CircularBuffer: the first observation after entry fills all 5 slots of each term
    gyro = x0[:15].reshape(5, 3)
    assert (gyro == gyro[-1]).all()
    act = x0[-60:].reshape(5, 12)
    assert (act == 0).all()                       # last_action is zeros when the policy is entered
    # term-major: the newest value of each term is the last of its block; the block shifts by one per tick
    np.testing.assert_array_equal(xs[5][:12], xs[4][3:15])
    assert (xs[31][-60:] == 0).all() and not (xs[30][-60:] == 0).all()     # the reset zeroed the last action


def test_humanoid_two_leg_gait_clock_counts_policy_ticks_from_1():
    plan = build_obs_plan(humanoid_recipe(), n_inputs=3 + 3 + 3 + 12 + 12 + 12 + 4)
    xs = run_obs(plan, 50, reset_at={45})
    for k, x in enumerate(xs):
        kk = (k if k < 45 else k - 45) + 1          # k = 1 on the first tick after entry
        phi = math.fmod(kk * 0.02, 0.8) / 0.8
        p1 = (phi + 0.5) % 1.0
        want = [math.cos(2 * math.pi * phi), math.cos(2 * math.pi * p1), math.sin(2 * math.pi * phi),
                math.sin(2 * math.pi * p1)]
        np.testing.assert_allclose(x[-4:], want, **TOL)


def test_frame_major_history_filled_with_zeros_and_clipped_after_scale():
    plan = build_obs_plan(frame_major_recipe())
    fw = 2 + 3 + 6 + 6 + 6 + 3 + 2
    assert (plan.frame_width, plan.out_width) == (fw, 3 * fw)
    xs = run_obs(plan, 40, reset_at={20}, u_max=30.0)   # large actions: the clip at 18 acts
    assert (xs[0][:2 * fw] == 0).all() and (xs[0][2 * fw:] != 0).any()
    np.testing.assert_array_equal(xs[1][fw:2 * fw], xs[0][2 * fw:])        # oldest first, newest last
    assert (xs[20][:2 * fw] == 0).all()
    la = np.concatenate([x[-fw + 17:-fw + 23] for x in xs[1:20]])
    assert np.abs(la).max() == 18.0                                        # the clip acted
    # the [sin, cos] clock of the newest frame, k from 1, humanoid-gym's period
    phi = math.fmod(3 * 0.01, 0.64) / 0.64
    np.testing.assert_allclose(xs[2][2 * fw:2 * fw + 2], [math.sin(2 * math.pi * phi), math.cos(2 * math.pi * phi)],
                               **TOL)


def test_newest_first_history_is_the_oldest_first_one_reversed():
    """rl_sar's order (observations_history [0, 1, ...]): the same frames, newest first."""
    r = frame_major_recipe()
    plans = {}
    for order in ("oldest_first", "newest_first"):
        r["observation"]["history"]["order"] = order
        plans[order] = build_obs_plan(r)
    a = run_obs(plans["oldest_first"], 6, seed=3, closed_loop=False)
    b = run_obs(plans["newest_first"], 6, seed=3, closed_loop=False)
    fw = plans["oldest_first"].frame_width
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.reshape(3, fw)[::-1].reshape(-1), y)


def test_robot_joints_in_another_order_are_matched_by_name():
    r = quadruped_recipe()
    plan = build_obs_plan(r)
    obs = ObsTerms(plan)
    q0 = dict(zip(r["joints"]["policy"], r["default_pos"]))
    robot = r["joints"]["robot"]
    sig = Signals(12, 3)
    sig.joint_pos[:] = np.arange(12) * 0.1               # robot slot i holds 0.1 i
    sig.joint_vel[:] = np.arange(12) * 1.0
    x = np.zeros(plan.out_width)
    obs.compute(*sig.args(), x)
    newest = x.reshape(-1)
    qrel = newest[45 + 4 * 12:45 + 5 * 12]                # joint_pos_rel block, newest slot
    qd = newest[105 + 4 * 12:105 + 5 * 12]
    for i, name in enumerate(r["joints"]["policy"]):
        assert qrel[i] == pytest.approx(0.1 * robot.index(name) - q0[name], abs=1e-15)
        assert qd[i] == pytest.approx(0.05 * robot.index(name), abs=1e-15)
    # the policy's FL hip is the robot's slot 3 (FR, FL, ...): the map by name, not by index
    assert plan.joint_map[0] == 3 and plan.joint_map[3] == 0


def test_the_quaternion_in_either_order_gives_the_same_gravity():
    rng = np.random.default_rng(5)
    base = humanoid_recipe()
    plans = {}
    for order in ("wxyz", "xyzw"):
        r = humanoid_recipe()
        r["observation"] = dict(base["observation"], quat_order=order, terms=[{"kind": "projected_gravity"}])
        plans[order] = build_obs_plan(r, n_inputs=3)
    units = {o: ObsTerms(p) for o, p in plans.items()}
    sig = Signals(12, 3)
    xa, xb = np.zeros(3), np.zeros(3)
    for _ in range(50):
        wxyz = unit_quat(rng)
        sig.quat[:] = wxyz
        units["wxyz"].compute(*sig.args(), xa)
        sig.quat[:] = np.roll(wxyz, -1)                  # the same rotation as x, y, z, w
        units["xyzw"].compute(*sig.args(), xb)
        np.testing.assert_allclose(xa, xb, **TOL)
        np.testing.assert_allclose(xa, projected_gravity(wxyz, "wxyz"), **TOL)
        assert np.linalg.norm(xa) == pytest.approx(1.0)
    # upright: [0, 0, -1]; rolled 90° about x (w = cos 45°, x = sin 45°): gravity along -y in the body frame
    sig.quat[:] = [1, 0, 0, 0]
    units["wxyz"].compute(*sig.args(), xa)
    np.testing.assert_allclose(xa, [0, 0, -1], atol=1e-15)
    s = math.sqrt(0.5)
    sig.quat[:] = [s, s, 0, 0]
    units["wxyz"].compute(*sig.args(), xa)
    np.testing.assert_allclose(xa, [0, -1, 0], atol=1e-15)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_layouts_match_the_reference(data):
    """Random term lists, scales, offsets, clips, history lengths, both layouts and fills, both quaternion
    orders, both clip stages: the compiled recipe equals the reference tick by tick."""
    nj = data.draw(st.integers(1, 8))
    names = [f"j{i}" for i in range(nj)]
    robot = names + [f"extra{i}" for i in range(data.draw(st.integers(0, 3)))]
    robot = data.draw(st.permutations(robot))
    layout = data.draw(st.sampled_from(["term", "frame"]))
    kinds = data.draw(st.lists(st.sampled_from(sorted(legged.TERM_KINDS) + ["base_ang_vel"]), min_size=1,
                               max_size=7))
    num = st.floats(-3, 3, allow_nan=False)
    terms = []
    for kind in kinds:
        t = {"kind": kind}
        if kind == "gait_clock":
            t.update(period=data.draw(st.floats(0.1, 2.0)), form=data.draw(st.sampled_from(["sin_cos", "two_leg"])))
        if kind == "constant":
            t["values"] = data.draw(st.lists(num, min_size=1, max_size=3))
        if data.draw(st.booleans()):
            t["scale"] = data.draw(num)
        if data.draw(st.booleans()):
            t["offset"] = data.draw(num)
        if data.draw(st.booleans()):
            lo = data.draw(st.floats(-2, 0))
            t["clip"] = [lo, lo + data.draw(st.floats(0, 3))]
        if layout == "term":
            t["history"] = data.draw(st.integers(0, 4))
        if data.draw(st.booleans()):
            t["clip_stage"] = data.draw(st.sampled_from(["before_scale", "after_scale"]))
        terms.append(t)
    recipe = {"joints": {"policy": names, "robot": robot}, "default_pos": data.draw(st.lists(num, min_size=nj,
                                                                                           max_size=nj)),
              "policy_dt": data.draw(st.sampled_from([0.01, 0.02, 0.025])),
              "observation": {"terms": terms, "quat_order": data.draw(st.sampled_from(["wxyz", "xyzw"])),
                              "n_commands": data.draw(st.integers(1, 4)), "first_tick": data.draw(st.integers(0, 2)),
                              "history": {"layout": layout, "fill": data.draw(st.sampled_from(["first", "zeros"])),
                                          "order": data.draw(st.sampled_from(["oldest_first", "newest_first"])),
                                          "length": data.draw(st.integers(1, 4)) if layout == "frame" else 1}},
              "actuator": {"kp": 1.0, "kd": 0.1, "tau_max": 1.0}}
    run_obs(build_obs_plan(recipe), 12, seed=data.draw(st.integers(0, 1000)), reset_at={7})


# ---- the actuator and the modes ---------------------------------------------------------------------------

def _stand_up(d, ticks=1100):
    assert d.request("stand") == REQ_OK
    d.run(ticks)
    assert d.act.stand_done


def test_quadruped_passive_stand_policy_stale_damping_sequence():
    """The whole deploy sequence on the virtual clock, compiled vs reference at every cycle: passive, stand
    (1 s ramp from the measured pose), policy at 50 Hz with the PD at 1 kHz, then the frames stop: the PD
    ramps its torque down past its 5 ms age limit and the watchdog (100 ms) moves to damping."""
    d = Drive(quadruped_recipe())
    rng = np.random.default_rng(1)
    d.sig.joint_pos[:] = rng.normal(0, 0.5, 12)
    d.run(10)
    assert all(s == PASSIVE | legged.NO_COMMAND for s in d.statuses)
    assert all((o[1:] == 0).all() for o in d.outs)           # passive: no gains, no torque
    d.request("stand")
    start = d.c
    for _ in range(1100):
        d.sig.joint_pos += rng.normal(0, 1e-3, 12)         # the robot moves a little; the ramp starts where it was
        d.sig.joint_vel[:] = rng.normal(0, 0.1, 12)
        d.tick()
    assert d.act.stand_done and d.statuses[-1] == STAND
    assert d.request("policy") == REQ_OK
    pol = d.c
    for _ in range(200):
        d.sig.joint_pos += rng.normal(0, 1e-3, 12)
        d.tick()
    assert sum(a is not None for a in d.actions[pol:]) == 10      # 50 Hz inside 1 kHz
    # zero-order hold: the target changes only on policy ticks
    qs = np.array([o[0] for o in d.outs[pol:]])
    changed = np.flatnonzero((np.diff(qs, axis=0) != 0).any(axis=1)) + 1
    assert set(changed) <= {k for k in range(200) if (pol + k) % DECIMATION == 0}
    # the frames stop: age grows 1 ms per cycle from the last frame
    last = d.c - 1
    for _ in range(120):
        d.tick(age=(d.c - last) * MS)
    trip = next(i for i, s in enumerate(d.statuses) if i > last and s & 3 == DAMPING)
    assert (trip - last) * MS > d.ap.stale_after_ns and (trip - 1 - last) * MS <= d.ap.stale_after_ns
    got = d.check_transitions()
    assert [(c, f, t, why) for c, _, f, t, why in got] == [
        (10, PASSIVE, STAND, WHY_REQUEST), (start + 1100, STAND, POLICY, WHY_REQUEST), (trip, POLICY, DAMPING,
                                                                                        WHY_STALE)]
    assert got[2][1] == T0 + trip * MS
    d.check_counts()
    # a policy request now is refused: the robot must stand up again
    assert d.request("policy") == REQ_NO_STAND


def test_per_joint_action_scale_and_the_target_through_the_actuator_map():
    r = quadruped_recipe()
    d = Drive(r)
    d.sig.joint_pos[:] = [r["default_pos"][r["joints"]["policy"].index(n)] for n in r["joints"]["robot"]]
    _stand_up(d, 2)                        # within tolerance: no ramp
    d.request("policy")
    a = np.linspace(-1, 1, 12)
    d.tick(action=a)
    q_star = d.outs[-1][0]
    scale = np.array([0.125, 0.25, 0.25] * 4)
    for i, name in enumerate(r["joints"]["policy"]):
        o = r["joints"]["robot"].index(name)         # outputs in the robot's (actuator) order
        assert q_star[o] == r["default_pos"][i] + scale[i] * a[i]


def test_pd_torque_and_its_clip():
    r = quadruped_recipe()
    d = Drive(r)
    rng = np.random.default_rng(2)
    d.sig.joint_pos[:] = [r["default_pos"][r["joints"]["policy"].index(n)] for n in r["joints"]["robot"]]
    _stand_up(d, 2)
    d.request("policy")
    clipped = 0
    for k in range(200):
        d.sig.joint_pos[:] = rng.normal(0, 1.5, 12)
        d.sig.joint_vel[:] = rng.normal(0, 20, 12)
        d.tick(action=rng.normal(0, 1, 12) if k % DECIMATION == 0 else None)
        o = d.outs[-1]
        kp, kd, tau = o[2], o[3], o[5]
        raw = kp * (o[0] - d.sig.joint_pos) + kd * (0 - d.sig.joint_vel)   # robot order (identity sensor/actuator)
        tmax = np.array([23.7, 23.7, 45.4] * 4)
        np.testing.assert_allclose(tau, np.clip(raw, -tmax, tmax), **TOL)
        clipped += int((np.abs(raw) > tmax).any())
    assert clipped > 0 and d.act.counts["tau_clipped"] == clipped
    d.check_counts()


def test_past_the_pd_age_limit_the_torque_ramps_to_zero_without_old_velocity():
    d = Drive(quadruped_recipe())
    d.sig.joint_vel[:] = 2.0
    d.request("stand")
    d.run(50)
    tau_fresh = d.outs[-1][5].copy()
    assert (tau_fresh != 0).any()
    lim, ramp = d.ap.pd_max_age_ns, d.ap.pd_ramp_ns          # 5 ms, 50 ms
    for age_ms in range(1, 60):
        d.sig.joint_vel[:] = -50.0                       # an old frame's values must not enter the torque
        st = d.tick(age=age_ms * MS)
        tau = d.outs[-1][5]
        f = min(1.0, max(0.0, 1.0 - (age_ms * MS - lim) / ramp)) if age_ms * MS > lim else 1.0
        if age_ms * MS <= lim:
            assert not st & legged.RAMPING
        else:
            assert st & legged.RAMPING
            np.testing.assert_allclose(tau, tau_fresh * f, **TOL)
        if age_ms * MS <= lim:
            tau_fresh = tau.copy()
    assert (d.outs[-1][5] == 0).all() and d.act.counts["pd_ramp_ticks"] == 59 - 5
    d.check_counts()


def test_stand_ramps_from_the_measured_pose_and_is_skipped_within_tolerance():
    r = quadruped_recipe()
    d = Drive(r)
    q0 = np.array([r["default_pos"][r["joints"]["policy"].index(n)] for n in r["joints"]["robot"]])
    measured = q0 + 0.5
    d.sig.joint_pos[:] = measured
    d.request("stand")
    d.tick()
    np.testing.assert_allclose(d.outs[-1][0], measured, **TOL)        # t = 0: the measured pose
    d.sig.joint_pos[:] = 0.0                                            # later readings do not move the start
    d.run(499)
    np.testing.assert_allclose(d.outs[-1][0], measured + (q0 - measured) * 0.499, **TOL)
    assert not d.act.stand_done
    d.run(501)
    assert d.act.stand_done
    np.testing.assert_array_equal(d.outs[-1][0], q0)
    assert (d.outs[-1][2] == 50.0).all() and (d.outs[-1][3] == 2.0).all()      # the stand gains
    # already standing (within 0.05 rad): done at its first tick, target the default pose
    d2 = Drive(r)
    d2.sig.joint_pos[:] = q0 + 0.04
    d2.request("stand")
    d2.tick()
    assert d2.act.stand_done
    np.testing.assert_array_equal(d2.outs[-1][0], q0)


def test_non_finite_action_goes_to_damping_and_is_never_applied():
    d = Drive(humanoid_recipe())
    _stand_up(d)
    d.request("policy")
    d.run(40)
    held = d.outs[-1][0].copy()
    bad = np.ones(12)
    bad[4] = np.nan
    st = d.tick(action=bad)
    assert st & 3 == DAMPING
    o = d.outs[-1]
    assert (o[2] == 0).all() and (o[3] == d.ap.row("damping_kd")[0]).all()   # kp = 0, kd per joint
    # damping: q* is the measured pose (kp = 0), not the held policy target
    np.testing.assert_array_equal(o[0][d.ap.out_map], d.sig.joint_pos[d.ap.sens_map])
    assert not np.array_equal(o[0], held)
    tr = d.check_transitions()
    assert tr[-1][2:] == (POLICY, DAMPING, WHY_NON_FINITE)
    assert d.act.counts["non_finite_trips"] == 1
    d.check_counts()
    # the kernel's own report (act_ptr returned -1, its output garbage): the same rule
    _stand_up(d)
    d.request("policy")
    d.run(3)
    d.act.report_non_finite(d.t())
    reference_non_finite(d.ap, d.ra, d.t())
    assert d.act.mode == DAMPING and d.check_transitions()[-1][2:] == (POLICY, DAMPING, WHY_NON_FINITE)
    d.run(3)
    d.check_counts()


def test_policy_is_refused_before_stand_completed_unless_configured():
    d = Drive(quadruped_recipe())
    assert d.request("policy") == REQ_NO_STAND
    d.request("stand")
    d.run(10)                                          # the ramp (1 s) is not over
    assert d.request("policy") == REQ_NO_STAND and d.act.mode == STAND
    assert d.act.counts["refused"] == 2
    d.run(1000)
    assert d.request("policy") == REQ_OK
    r = quadruped_recipe()
    r["modes"] = dict(r["modes"], policy_without_stand=True)
    d2 = Drive(r)
    assert d2.request("policy") == REQ_OK and d2.act.mode == POLICY
    d2.run(30)
    d.check_counts()
    d2.check_counts()


def test_stale_hold_keeps_the_mode_and_the_held_target():
    r = quadruped_recipe()
    r["modes"] = dict(r["modes"], on_stale="hold", policy_without_stand=True)
    d = Drive(r)
    d.request("policy")
    d.run(25)
    for k in range(200):
        d.tick(age=(k + 1) * MS)           # the frames stop at cycle 24: stale (> 100 ms) from cycle 125
    assert d.act.mode == POLICY and d.act.counts["stale_trips"] == 0
    stale = [a for a in d.actions[125:]]
    assert all(a is None for a in stale)     # the policy does not run on stale input
    for o in d.outs[125:]:
        np.testing.assert_array_equal(o[0], d.outs[124][0])
    assert (d.outs[-1][5] == 0).all()                   # the PD's own age limit still ramped the torque out


def test_rate_limit_counted_when_it_acts():
    r = quadruped_recipe()
    r["actuator"] = dict(r["actuator"], rate_limit=2.0)          # rad/s: 2 mrad per 1 ms tick
    r["modes"] = dict(r["modes"], policy_without_stand=True)
    d = Drive(r)
    d.request("policy")
    d.tick(action=np.zeros(12))             # the passive pose (q = 0) toward the default pose
    d.run(5, action=None)
    q = np.array([o[0] for o in d.outs])
    steps = np.abs(np.diff(q, axis=0))
    assert steps.max() <= 2e-3 + 1e-15 and d.act.counts["rate_limited"] == 6
    d.check_counts()
    # off by default: never counted
    d2 = Drive(quadruped_recipe(modes=dict(quadruped_recipe()["modes"], policy_without_stand=True)))
    d2.request("policy")
    d2.tick(action=np.ones(12))
    assert d2.act.counts["rate_limited"] == 0


def test_velocity_guard_goes_to_damping():
    r = quadruped_recipe()
    r["actuator"] = dict(r["actuator"], velocity_limit=10.0)
    r["modes"] = dict(r["modes"], policy_without_stand=True)
    d = Drive(r)
    d.request("policy")
    d.run(30)
    d.sig.joint_vel[5] = -10.5
    assert d.tick() & 3 == DAMPING
    assert d.check_transitions()[-1][2:] == (POLICY, DAMPING, WHY_VELOCITY_GUARD)
    d.check_counts()


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), rate=st.sampled_from([None, 0.5, 5.0]), clip=st.booleans(),
       hold=st.booleans(), guard=st.sampled_from([None, 8.0]))
def test_random_schedules_match_the_reference(seed, rate, clip, hold, guard):
    """Random requests, frame ages (fresh, PD-old, stale), non-finite actions and options: the compiled
    actuator equals the reference at every cycle, transitions and counts included."""
    r = quadruped_recipe()
    r["actuator"] = dict(r["actuator"], rate_limit=rate, velocity_limit=guard, q_lo=-1.0, q_hi=1.0)
    r["action"] = dict(r["action"], clip_to_limits=clip)
    r["modes"] = dict(r["modes"], on_stale="hold" if hold else "damping", stand_time=0.05)
    d = Drive(r, seed=seed)
    rng = np.random.default_rng(seed)
    age = 0
    for c in range(400):
        if rng.random() < 0.02:
            d.request(MODES[rng.integers(0, 4)])
        age = 0 if rng.random() < 0.9 else age + int(rng.integers(1, 40)) * MS
        d.sig.randomise(rng, 0.3)
        a = rng.normal(0, 2, 12) if c % DECIMATION == 0 else None
        if a is not None and rng.random() < 0.1:
            a[rng.integers(0, 12)] = np.inf
        d.tick(age=age, action=a)
    d.check_transitions()
    d.check_counts()


# ---- refusals ---------------------------------------------------------------------------------------------

def _mut(path, value):
    def f(r):
        node = r
        for k in path[:-1]:
            node = node[k]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return r
    return f


REFUSALS = [
    ("widths", lambda r: r, "observation.terms", {"n_inputs": 224}),
    ("joint", _mut(("joints", "policy", 4), "FL_knee_joint"), "joints.policy[4]", {}),
    ("kp length", _mut(("actuator", "kp"), [25.0] * 11), "actuator.kp", {}),
    ("default length", _mut(("default_pos",), [0.0] * 13), "default_pos", {}),
    ("limit length", _mut(("actuator", "q_lo"), [0.0] * 3), "actuator.q_lo", {}),
    ("scale length", _mut(("action", "scale"), [0.25] * 2), "action.scale", {}),
    ("tau_max missing", _mut(("actuator", "tau_max"), KeyError), "actuator.tau_max", {}),
    ("unknown term", _mut(("observation", "terms", 2, "kind"), "height_scan"), "observation.terms[2].kind", {}),
    ("unknown key", _mut(("observation", "terms", 0, "scael"), 0.25), "observation.terms[0].scael", {}),
    ("quat order", _mut(("observation", "quat_order"), KeyError), "observation.quat_order", {}),
    ("quat order value", _mut(("observation", "quat_order"), "wxzy"), "observation.quat_order", {}),
    ("n_commands", _mut(("observation", "n_commands"), KeyError), "observation.n_commands", {}),
    ("term scale", _mut(("observation", "terms", 0, "scale"), [0.25, 0.25]), "observation.terms[0].scale", {}),
    ("outputs", lambda r: r, "joints.policy", {"n_outputs": 29}),
    ("pd age", _mut(("actuator", "pd_max_age"), 0.2), "actuator.pd_max_age", {}),
    ("duplicate", _mut(("joints", "robot", 1), "FR_hip_joint"), "joints.robot[1]", {}),
    ("on_stale", _mut(("modes", "on_stale"), "panic"), "modes.on_stale", {}),
    ("kd negative", _mut(("actuator", "kd"), -1.0), "actuator.kd[0]", {}),
    ("frame history", _mut(("observation", "history"), {"layout": "frame", "length": 2}),
     "observation.terms[0].history", {}),
]


@pytest.mark.parametrize("what,mutate,key,kw", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_every_refusal_names_the_key_and_the_fix(what, mutate, key, kw):
    r = mutate(quadruped_recipe())
    with pytest.raises(RecipeError) as e:
        build_plans(r, **kw)
    assert e.value.key == key, str(e.value)
    assert f"recipe key '{key}'" in str(e.value) and "Fix: " in str(e.value)


def test_the_quadruped_recipe_adds_up():
    op, ap = build_plans(quadruped_recipe(), n_inputs=225, n_outputs=12)
    assert op.out_width == 225 and ap.n == 12
    assert build_actuator_plan(humanoid_recipe(), 12).n_out == 12


def test_the_wrappers_refuse_arrays_of_the_wrong_shape_naming_the_argument():
    op, ap = build_plans(quadruped_recipe())
    obs, act = ObsTerms(op), Actuator(ap)
    sig = Signals(12, 3)
    with pytest.raises(TypeError, match=r"quat must be .* shape \(4,\)"):
        obs.compute(sig.joint_pos, sig.joint_vel, np.zeros(3), sig.gyro, sig.acc, sig.command, np.zeros(225))
    with pytest.raises(TypeError, match=r"out must be .* shape \(225,\)"):
        obs.compute(*sig.args(), np.zeros(224))
    with pytest.raises(TypeError, match=r"action must be"):
        act.tick(T0, 0, sig.joint_pos, sig.joint_vel, np.zeros(12, dtype=np.float32), np.zeros((6, 12)))
    with pytest.raises(TypeError, match=r"out must be .* shape \(6, 12\)"):
        act.tick(T0, 0, sig.joint_pos, sig.joint_vel, None, np.zeros((12, 6)))
    # a signal no term reads may be None
    op2 = build_obs_plan(dict(quadruped_recipe(), observation={"terms": [{"kind": "joint_pos_rel"}]}))
    ObsTerms(op2).compute(sig.joint_pos, None, None, None, None, None, np.zeros(12))


# ---- allocation -------------------------------------------------------------------------------------------

def test_the_per_call_methods_allocate_nothing():
    d = Drive(quadruped_recipe(modes=dict(quadruped_recipe()["modes"], policy_without_stand=True)))
    d.request("policy")
    args = d.sig.args() + (d.x,)
    assert bytes_left_by_calls(d.obs.compute, *args, n=20_000) == (0, 0)
    a = np.zeros(12)
    assert bytes_left_by_calls(d.obs.note_action, a, n=20_000) == (0, 0)
    q, qd, out = d.sig.joint_pos, d.sig.joint_vel, d.out
    for action in (a, None):
        assert bytes_left_by_calls(d.act.tick, T0, 100_000, q, qd, action, out, n=20_000) == (0, 0)
    # past the PD's age limit (the ramp path) and after the watchdog's trip (damping)
    assert bytes_left_by_calls(d.act.tick, T0, 10 * MS, q, qd, None, out, n=5_000) == (0, 0)
    assert bytes_left_by_calls(d.act.tick, T0, 200 * MS, q, qd, a, out, n=5_000) == (0, 0)
    assert d.act.mode == DAMPING
    assert bytes_left_by_calls(d.obs.reset, n=5_000) == (0, 0)
