"""The MuJoCo robot (sim/mujoco_robot.py) and the quadruped authored here: real MuJoCo, no mocks.

User models are written from the shipped MJCF's text with one thing changed (actuator order, actuator kind,
no IMU, no floating base...), so each test names exactly what differs.
"""
import math
import re

import numpy as np
import pytest

mujoco = pytest.importorskip("mujoco", reason="mujoco is not installed: pip install -e '.[mujoco]'")

from control_node.errors import UserError  # noqa: E402
from control_node.sim.mujoco_robot import (CommandSchedule, Impedance, ModelError, MujocoRobot,  # noqa: E402
                                           Score, packaged_quadruped)
from control_node.sim.stand_controller import stand  # noqa: E402

LEGS, PARTS = ("FL", "FR", "RL", "RR"), ("hip", "thigh", "calf")
JOINTS = [f"{leg}_{part}_joint" for leg in LEGS for part in PARTS]
SHIPPED = open(packaged_quadruped()).read()
ACTUATORS = re.compile(r"<actuator>.*?</actuator>", re.S)


def model(tmp_path, text, name="robot.xml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


RANGE = {"hip": "-0.8 0.8", "thigh": "-1.0 3.0", "calf": "-2.7 -0.8"}
EFFORT = {"hip": 23.7, "thigh": 23.7, "calf": 45.0}


def actuators(legs=LEGS, kind="motor", skip=()):
    """An <actuator> block, legs in the order given (FR, FL, RR, RL is the Unitree SDK's); position servos
    target the joint's range with the motor's effort limit."""
    rows = []
    for leg in legs:
        for part in PARTS:
            j = f"{leg}_{part}_joint"
            if j in skip:
                continue
            extra = (f' kp="80" kv="2" ctrlrange="{RANGE[part]}" forcerange="-{EFFORT[part]} {EFFORT[part]}"'
                     if kind == "position" else f' class="{part}"')
            rows.append(f'<{kind} name="{leg}_{part}" joint="{j}"{extra}/>')
    return "<actuator>\n" + "\n".join(rows) + "\n</actuator>"


def zero_g(text):
    return text.replace('<option timestep="0.002"', '<option gravity="0 0 0" timestep="0.002"')


def test_the_shipped_quadruped_is_a_12_joint_robot_of_10_to_15_kg(tmp_path):
    r = MujocoRobot()
    mass = float(r.model.body_mass.sum())
    assert 10.0 <= mass <= 15.0, mass
    assert r.joint_names == JOINTS and r.commanded == JOINTS
    assert set(r.actuator_kind.values()) == {"motor"} and r.imu_site == "imu" and r.dt == 0.002
    assert r.effort_limit["FL_hip_joint"] == pytest.approx(23.7) and r.effort_limit["RR_calf_joint"] == 45.0
    # shipped actuator order = joint order
    assert [r.actuator_names[j] for j in JOINTS] == [j[:-len("_joint")] for j in JOINTS]
    assert list(r._act_idx) == list(range(12))
    # "home" stands on its four feet: each foot touches the floor, nothing else does
    touching = {mujoco.mj_id2name(r.model, mujoco.mjtObj.mjOBJ_GEOM, int(g))
                for c in r.data.contact[:r.data.ncon] for g in (c.geom1, c.geom2)}
    assert touching == {"floor", "FL_foot", "FR_foot", "RL_foot", "RR_foot"}
    assert packaged_quadruped().endswith("models/quadruped.xml")


def test_the_quadruped_stands_5_s_under_pd_at_physics_rate_and_stands_up_from_a_crouch():
    r = MujocoRobot()
    score = r.score()
    h = stand(r, 5.0, duration_s=0.5, score=score)
    s = score.summary()
    assert s["falls"] == 0 and s["time_upright_s"] == pytest.approx(5.0)
    settled = h[int(1.0 / r.dt):]
    assert 0.28 < settled.min() and settled.max() < 0.32 and np.ptp(settled) < 0.005, (settled.min(), settled.max())
    assert np.hypot(*r.base_pos[:2]) < 0.05
    assert 0 < s["torque_peak_nm"] < 23.7 and r.clipped == 0
    # from lying on folded legs (a run that starts below the fall height is no fall) to standing in 1 s
    r.reset("crouch")
    score = r.score()
    h = stand(r, 2.5, duration_s=1.0, score=score)
    assert score.summary()["falls"] == 0 and h[0] < 0.16 and abs(h[-1] - settled[-1]) < 0.002


def test_commands_by_joint_name_move_that_joint_whatever_the_actuator_order(tmp_path):
    # actuators listed FR, FL, RR, RL: actuator 0 drives FR_hip_joint, joint 0 is FL_hip_joint
    text = zero_g(ACTUATORS.sub(actuators(("FR", "FL", "RR", "RL")), SHIPPED))
    r = MujocoRobot(model(tmp_path, text))
    assert r.joint_names == JOINTS and r.actuator_names["FR_hip_joint"] == "FR_hip"
    assert int(r._act_idx[JOINTS.index("FR_hip_joint")]) == 0
    q0 = r.joint_pos
    hold = {j: q for j, q in zip(JOINTS, q0) if j != "FR_hip_joint"}
    r.apply(Impedance(q=hold, kp=80.0, kd=2.0))       # the other joints held by PD, this one by torque
    r.apply({"FR_hip_joint": -3.0})
    r.step(50)
    assert r.data.ctrl[0] == -3.0
    moved = dict(zip(JOINTS, np.abs(r.joint_pos - q0)))
    assert moved["FR_hip_joint"] > 0.2, moved
    assert max(v for j, v in moved.items() if j != "FR_hip_joint") < 0.05 * moved["FR_hip_joint"], moved
    # an array command is in the robot's commanded (joint) order, not the actuator order
    tau = np.zeros(12)
    tau[JOINTS.index("RL_calf_joint")] = 1.5
    r.apply(tau)
    r.step()
    assert r.data.ctrl[mujoco.mj_name2id(r.model, mujoco.mjtObj.mjOBJ_ACTUATOR, "RL_calf")] == 1.5


def test_position_and_torque_actuators_both_reach_a_target_angle(tmp_path):
    target = -1.2
    ends = {}
    for kind in ("motor", "position"):
        r = MujocoRobot(model(tmp_path, zero_g(ACTUATORS.sub(actuators(kind=kind), SHIPPED)), f"{kind}.xml"))
        assert set(r.actuator_kind.values()) == {kind}
        home = dict(zip(JOINTS, r.keyframe_joint_pos()))
        home["FL_calf_joint"] = target
        if kind == "motor":            # PD in the simulator at physics rate, the same gains as the servo
            r.apply(Impedance(q=home, kp=80.0, kd=2.0))
        else:
            r.apply(home)
            with pytest.raises(UserError, match="position actuator applies its own PD"):
                r.apply(Impedance(q={"FL_calf_joint": 0.0}, kp=1.0, kd=0.0))
        r.step(250)
        ends[kind] = r.joint_pos[JOINTS.index("FL_calf_joint")]
        assert abs(ends[kind] - target) < 0.02, (kind, ends[kind])
    # the same PD law either way: the two end within a hair of each other
    assert abs(ends["motor"] - ends["position"]) < 1e-3, ends


def test_stepping_is_mujocos_mj_step_bit_for_bit_with_current_sensors():
    r = MujocoRobot()
    m = mujoco.MjModel.from_xml_path(packaged_quadruped())
    d = mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, 0)
    tau = np.tile([0.5, 3.0, -6.0], 4)
    r.apply(tau)
    for _ in range(200):
        d.ctrl[:] = tau
        mujoco.mj_step(m, d)
        r.step()
    assert np.array_equal(d.qpos, r.data.qpos) and np.array_equal(d.qvel, r.data.qvel)
    np.testing.assert_array_equal(r.signals()["imu_acc"], d.sensordata[7:10])
    mujoco.mj_forward(m, d)          # mj_step's framequat and gyro are of the state before its last step
    np.testing.assert_array_equal(r.signals()["imu_quat"], d.sensordata[0:4])
    np.testing.assert_array_equal(r.signals()["imu_gyro"], d.sensordata[4:7])


def test_torques_are_clipped_to_the_effort_limit_and_counted():
    r = MujocoRobot()
    r.apply({"FL_calf_joint": 100.0, "FL_hip_joint": 1.0})
    r.step()
    assert r.data.ctrl[2] == 45.0 and r.data.ctrl[0] == 1.0 and r.clipped == 1
    r.apply(Impedance(q={"FR_thigh_joint": 3.0}, kp=1000.0, kd=0.0))
    r.step(3)
    assert r.data.ctrl[4] == 23.7 and r.clipped == 4          # the PD's torque: each physics step


def test_a_model_without_an_imu_is_refused_naming_the_fix(tmp_path):
    text = re.sub(r"<sensor>.*?</sensor>", "", SHIPPED, flags=re.S)
    with pytest.raises(ModelError) as e:
        MujocoRobot(model(tmp_path, text))
    msg = str(e.value)
    assert "no IMU on the base body trunk" in msg and '<site name="imu"' in msg
    assert '<framequat name="imu_quat" objtype="site" objname="imu"/>' in msg and "<gyro" in msg
    # a gyro alone is not enough; a named site without sensors neither
    text = re.sub(r'<framequat[^>]*/>', "", SHIPPED)
    with pytest.raises(ModelError, match="no IMU"):
        MujocoRobot(model(tmp_path, text))
    with pytest.raises(ModelError, match="no site named 'imu2'"):
        MujocoRobot(imu_site="imu2")


def test_a_model_without_a_floating_base_is_refused(tmp_path):
    text = re.sub(r"<keyframe>.*?</keyframe>", "", SHIPPED.replace('<freejoint name="root"/>', ""), flags=re.S)
    with pytest.raises(ModelError, match=r"no floating base.*Fix: make <freejoint/> the first child"):
        MujocoRobot(model(tmp_path, text))


def test_a_commanded_joint_without_an_actuator_is_refused(tmp_path):
    path = model(tmp_path, ACTUATORS.sub(actuators(skip=("RR_calf_joint",)), SHIPPED))
    with pytest.raises(ModelError, match=r'joint RR_calf_joint has no actuator.*<motor joint="RR_calf_joint"'):
        MujocoRobot(path)
    r = MujocoRobot(path, joints=JOINTS[:-1])            # not commanded: fine, still read
    assert "RR_calf_joint" in r.signals()["joint_pos"]
    with pytest.raises(UserError, match="'RR_calf_joint': it has no actuator"):
        r.apply({"RR_calf_joint": 1.0})
    with pytest.raises(UserError, match="is not a joint of this robot"):
        r.apply({"FL_knee": 1.0})


def test_unsupported_actuator_kinds_are_refused_naming_the_actuator(tmp_path):
    block = actuators().replace('<motor name="FL_hip" joint="FL_hip_joint" class="hip"/>',
                                '<velocity name="FL_hip" joint="FL_hip_joint" kv="2" ctrlrange="-9 9"/>')
    with pytest.raises(ModelError, match=r"actuator FL_hip is a velocity servo.*Fix: use <motor"):
        MujocoRobot(model(tmp_path, ACTUATORS.sub(block, SHIPPED)))
    block = actuators(kind="position").replace('kv="2"', 'timeconst="0.01"', 1)
    with pytest.raises(ModelError, match="actuator FL_hip has activation dynamics"):
        MujocoRobot(model(tmp_path, ACTUATORS.sub(block, SHIPPED)))


def test_dt_comes_from_the_model_or_the_override():
    assert MujocoRobot(dt=0.001).dt == 0.001
    with pytest.raises(ModelError, match="dt=0"):
        MujocoRobot(dt=0)


def test_body_frame_velocity_of_a_base_yawed_90_degrees():
    r = MujocoRobot()
    d = r.data
    d.qpos[2] = 1.0                                   # in the air: nothing touches
    d.qpos[3:7] = [math.cos(math.pi / 4), 0.0, 0.0, math.sin(math.pi / 4)]    # yaw +90 deg: body x = world y
    d.qvel[:] = 0.0
    d.qvel[0:3] = [1.0, 0.0, 0.0]                     # free joint: world-frame linear velocity
    d.qvel[3:6] = [0.0, 0.0, 0.5]                     # free joint: body-frame angular velocity
    r.forward()
    s = r.signals(privileged=True)
    # moving along world +x while facing world +y is moving to the robot's right: body -y
    np.testing.assert_allclose(s["base_lin_vel_body"], [0.0, -1.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(s["imu_gyro"], [0.0, 0.0, 0.5], atol=1e-15)
    np.testing.assert_allclose(s["imu_quat"], d.qpos[3:7], atol=1e-15)       # (w, x, y, z)
    # any orientation: the same as MuJoCo's own local-frame velocity of the base body
    q = np.array([0.9, 0.2, -0.3, 0.25])
    d.qpos[3:7] = q / np.linalg.norm(q)
    d.qvel[0:6] = [0.3, -0.7, 0.2, 0.1, 0.4, -0.6]
    r.forward()
    ref = np.zeros(6)
    mujoco.mj_objectVelocity(r.model, d, mujoco.mjtObj.mjOBJ_BODY, r.base_body, ref, 1)
    np.testing.assert_allclose(r.signals(privileged=True)["base_lin_vel_body"], ref[3:], atol=1e-12)
    np.testing.assert_allclose(r.signals()["imu_gyro"], ref[:3], atol=1e-12)


def test_the_imu_at_rest_reads_gravity_up_in_its_own_frame():
    r = MujocoRobot()
    stand(r, 1.0, duration_s=0.2)
    s = r.signals()
    assert np.linalg.norm(s["imu_acc"]) == pytest.approx(9.81, abs=0.01)
    assert s["imu_acc"][2] > 9.7 and abs(s["imu_quat"][0]) > 0.999 and np.abs(s["imu_gyro"]).max() < 0.01


def test_the_command_schedule_grammar():
    s = CommandSchedule.parse("0:0.0,2:0.4,10:0.4@0.5")
    assert s(0.0) == (0.0, 0.0, 0.0) and s(1.999) == (0.0, 0.0, 0.0)
    assert s(2.0) == (0.4, 0.0, 0.0) and s(9.9) == (0.4, 0.0, 0.0) and s(10.0) == (0.4, 0.0, 0.5) and s(99) == \
        (0.4, 0.0, 0.5)
    s = CommandSchedule.parse(" 1: 0.3, 0.1@-0.2, 3:0 ")
    assert s(0.5) == (0.0, 0.0, 0.0) and s(1.5) == (0.3, 0.1, -0.2) and s(3) == (0.0, 0.0, 0.0)
    assert str(s) == "1:0.3,0.1@-0.2,3:0" and CommandSchedule.parse(str(s)).entries == s.entries
    for bad, says in (("", "is empty"), ("0:x", "vx 'x' is not a finite number"), ("0.5", "has no TIME:"),
                      ("2:0.4,1:0", "time 1 does not come after 2"), ("0:0.1,0.2,0.3", "a second VY"),
                      ("0:0.1@0.5,0.2", "VY after @YAW_RATE"), ("-1:0", "negative"),
                      ("0:0.1@nan", "yaw rate 'nan' is not a finite number")):
        with pytest.raises(UserError, match=re.escape(says)) as e:
            CommandSchedule.parse(bad)
        assert "Fix: write TIME:VX[,VY][@YAW_RATE]" in str(e.value)


def test_latency_delays_a_command_by_whole_physics_steps():
    r = MujocoRobot(latency_steps=3)
    r.apply({"FL_calf_joint": 5.0})
    for _ in range(3):
        r.step()
        assert r.data.ctrl[2] == 0.0              # the first three steps still ran the old command
    r.step()
    assert r.data.ctrl[2] == 5.0 and r.commands_applied == 1


def test_dropped_commands_follow_the_seed():
    def pattern(seed):
        r = MujocoRobot(drop=0.3, seed=seed)
        kept = [r.apply({"FL_hip_joint": 0.0}) for _ in range(200)]
        assert r.commands_dropped == kept.count(False)
        return kept
    a = pattern(7)
    assert a == pattern(7) and a != pattern(8)
    assert 40 < a.count(False) < 80


def test_two_runs_with_the_same_seed_are_bit_identical():
    def run(seed):
        r = MujocoRobot(latency_steps=2, drop=0.2, seed=seed)
        home = r.keyframe_joint_pos()
        out = []
        for k in range(300):
            if k % 4 == 0:
                q = home + 0.2 * math.sin(0.05 * k) * np.tile([0.0, 1.0, -1.0], 4)
                r.apply(Impedance(q=q, kp=80.0, kd=2.0))
            if k == 100:
                r.push(dv=(0.3, -0.2, 0.0))
            if k == 200:
                r.push(force=(0.0, 30.0, 0.0), duration=0.05)
            r.step()
            out.append(np.concatenate([r.data.qpos, r.data.qvel, r.data.sensordata]))
        return np.array(out)
    a = run(3)
    assert np.array_equal(a, run(3))
    assert not np.array_equal(a, run(4))


def test_pushes_change_the_base_velocity():
    r = MujocoRobot()
    r.data.qpos[2] = 2.0
    r.forward()
    r.push(dv=(0.5, 0.0, 0.0))
    assert r.data.qvel[0] == 0.5 and r.base_lin_vel_body()[0] == 0.5
    r.push(force=(0.0, 13.4, 0.0), duration=0.1)      # 1 m/s^2 on 13.4 kg for 0.1 s
    r.step(100)                                        # 0.2 s: the force is gone after the first 0.1 s
    assert r.data.qvel[1] == pytest.approx(0.1, abs=0.01) and not r.data.xfrc_applied.any()
    with pytest.raises(UserError, match="not both"):
        r.push(dv=(1, 0, 0), force=(1, 0, 0))


def test_the_score_counts_fall_events_distance_tracking_and_torque():
    s = Score(dt=0.1, min_height=0.15, max_tilt_rad=1.0, recover_s=0.45)
    up, flat = (1.0, 0.0, 0.0, 0.0), (math.cos(0.7), math.sin(0.7), 0.0, 0.0)    # tilt 1.4 rad
    heights = [0.3] * 10 + [0.1] * 3 + [0.3] * 2 + [0.1] + [0.3] * 10          # a stumble inside recovery
    for k, h in enumerate(heights):
        s.update((0.05 * k, 0.0, h), up, (0.5, 0.0, 0.0), (0, 0, 0.1), cmd=(0.4, 0.0, 0.0), torque=(1.0, -2.0))
    for _ in range(3):
        s.update((1.25, 0.0, 0.3), flat, (0.0, 0.0, 0.0), (0, 0, 0), cmd=(0.4, 0.0, 0.0), torque=(3.0, 0.0))
    out = s.summary()
    assert out["falls"] == 2                         # one low stretch (its stumble inside it), one tip-over
    assert out["time_upright_s"] == pytest.approx(0.1 * (10 + 6))     # back up on the 5th sample and out["duration_s"] == pytest.approx(2.9)
    assert out["distance_m"] == pytest.approx(1.25) and out["path_m"] == pytest.approx(1.25)
    assert out["mean_velocity"]["vx"] == pytest.approx(0.5 * 26 / 29)
    assert out["tracking_rms"]["vx"] == pytest.approx(math.sqrt((26 * 0.01 + 3 * 0.16) / 29))
    assert out["tracking_rms"]["yaw_rate"] == pytest.approx(math.sqrt(26 * 0.01 / 29))
    assert out["torque_peak_nm"] == 3.0
    assert out["torque_rms_nm"] == pytest.approx(math.sqrt((26 * 5 + 3 * 9) / 58))
    import json
    json.dumps(out)
