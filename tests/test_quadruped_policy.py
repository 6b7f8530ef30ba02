"""The walking policy shipped beside its script (train/quadruped_policy.onnx): it walks in real MuJoCo, its ONNX
carries the deploy contract, and it imports through the project's importer with the kernel proved against
onnxruntime. Behaviour checks on a deterministic simulation, no timing."""
import numpy as np
import pytest

pytest.importorskip("mujoco", reason="mujoco is not installed: pip install -e '.[mujoco]'")
onnx = pytest.importorskip("onnx", reason="onnx is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install -e '.[onnx]'")

from control_node.sim.mujoco_robot import MujocoRobot  # noqa: E402
from control_node.train import quadruped as Q  # noqa: E402

CONTRACT = ("joint_names", "joint_stiffness", "joint_damping", "default_joint_pos", "action_scale",
            "observation_names", "command_names", "policy_dt", "gait_period")


def floats(s):
    return [float(v) for v in s.split(",")]


def test_the_shipped_policy_walks_10_s_at_0_4_m_s_without_falling():
    s = Q.evaluate(Q.SHIPPED, seconds=10.0, command_schedule="0:0.4")
    assert s["falls"] == 0 and s["time_upright_s"] == pytest.approx(10.0), s
    assert 0.2 <= s["mean_velocity"]["vx"] <= 0.6, s["mean_velocity"]
    assert s["distance_m"] > 2.0, s
    # the simulation is deterministic: the same run gives the same figures
    assert Q.evaluate(Q.SHIPPED, seconds=1.0, command_schedule="0:0.4") == \
        Q.evaluate(Q.SHIPPED, seconds=1.0, command_schedule="0:0.4")


@pytest.mark.parametrize("yaw", [0.5, -0.5])
def test_the_shipped_policy_turns_on_command_both_ways(yaw):
    # walking at 0.3 m/s while asked to turn: the body's mean yaw rate follows the command's sign and size
    s = Q.evaluate(Q.SHIPPED, seconds=6.0, command_schedule=f"0:0.3@{yaw}")
    assert s["falls"] == 0, s
    assert s["mean_command"]["yaw_rate"] == pytest.approx(yaw)
    assert 0.6 * abs(yaw) <= s["mean_velocity"]["yaw_rate"] * np.sign(yaw) <= 1.4 * abs(yaw), s["mean_velocity"]
    assert s["mean_velocity"]["vx"] > 0.15, s["mean_velocity"]       # still walking forward while it turns


def test_the_onnx_metadata_holds_the_deploy_contract():
    model = onnx.load(Q.SHIPPED)
    meta = {p.key: p.value for p in model.metadata_props}
    assert set(CONTRACT) <= set(meta), sorted(set(CONTRACT) - set(meta))
    robot = MujocoRobot()
    assert meta["joint_names"].split(",") == robot.commanded == Q.JOINT_NAMES
    np.testing.assert_allclose(floats(meta["default_joint_pos"]), robot.keyframe_joint_pos("home"), atol=1e-6)
    cfg = Q.GaitConfig()
    assert floats(meta["action_scale"]) == [cfg.action_scale] * 12 == [0.25] * 12
    assert floats(meta["joint_stiffness"]) == [cfg.kp] * 12 and floats(meta["joint_damping"]) == [cfg.kd] * 12
    assert meta["observation_names"].split(",") == [name for name, _ in Q.OBS_TERMS]
    assert sum(map(int, meta["observation_dims"].split(","))) == Q.N_OBS == 47
    assert float(meta["policy_dt"]) == 0.02 and float(meta["gait_period"]) == cfg.period
    assert meta["quat_order"] == "wxyz"
    # the graph's input and output match the contract
    inp, out = model.graph.input[0], model.graph.output[0]
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [1, 47]
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [1, 12]


def test_the_shipped_onnx_imports_and_the_kernel_answers_as_onnxruntime_does():
    from control_node.kernels import Policy
    from control_node.kernels.importers import import_policy
    # observations from a real closed-loop walk, so the proof covers the states the policy meets
    seen = []
    run = Q.onnx_policy(Q.SHIPPED)

    def record(obs):
        seen.append(np.array(obs))
        return run(obs)
    Q.evaluate(record, seconds=2.0, command_schedule="0:0.4,1:0.3@0.5")
    X = np.array(seen)
    spec, proof = import_policy(Q.SHIPPED, check_X=X, kernel=Policy)
    assert proof["first_bad"] is None and proof["samples"] >= len(X)
    assert isinstance(proof["kernel"], dict) and proof["kernel"]["samples"] >= len(X), proof["kernel"]
    assert spec.action_names == Q.JOINT_NAMES and spec.layer_sizes == [47, 256, 128, 12]
    # the compiled kernel's raw actions equal onnxruntime's within the importer's tolerance
    policy = Policy(spec)
    want = np.array([run(x) for x in X])
    got = np.array([policy.act(np.ascontiguousarray(x, dtype=np.float64)) for x in X])
    tol = 2e-4 * np.maximum(1.0, np.abs(want).max(axis=1, keepdims=True))
    assert (np.abs(got - want) <= tol).all(), np.abs(got - want).max()


def test_the_experts_leg_kinematics_match_mujocos():
    import mujoco
    robot = MujocoRobot()
    geo = Q.LegGeometry(robot)
    m, d = robot.model, robot.data
    feet = [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, f"{leg}_foot") for leg in Q.LEGS]
    rng = np.random.default_rng(0)
    home = robot.keyframe_joint_pos("home").reshape(4, 3)
    for _ in range(5):
        q = home + rng.uniform(-0.3, 0.3, home.shape)
        d.qpos[robot._qadr] = q.reshape(-1)
        mujoco.mj_forward(m, d)
        R = d.xmat[robot.base_body].reshape(3, 3)
        got = np.array([R.T @ (d.geom_xpos[f] - d.xpos[robot.base_body]) for f in feet]) - geo.hip_pos
        np.testing.assert_allclose(geo.fk(q), got, atol=1e-9)
        np.testing.assert_allclose(geo.ik(geo.fk(q)), q, atol=1e-6)
