"""The [ros2] recipe: config checks naming the key, and frame assembly with made-up times (no clock, no ROS).

Messages are rosbags' dataclasses of the real ROS 2 message definitions (the same field names rclpy's
classes have); the live bridge against rclpy processes is tests/test_ros2_bridge.py.
"""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from control_node.bridge.recipe import FrameAssembler, parse_recipe
from control_node.errors import ConfigError

rosbags = pytest.importorskip("rosbags", reason="rosbags is missing: pip install -e '.[ros2]'")
from rosbags.typesys import Stores, get_typestore  # noqa: E402

TS = get_typestore(Stores.ROS2_KILTED)
JS, IMU, TWIST = (TS.types[t] for t in ("sensor_msgs/msg/JointState", "sensor_msgs/msg/Imu",
                                        "geometry_msgs/msg/Twist"))
V3, Q = TS.types["geometry_msgs/msg/Vector3"], TS.types["geometry_msgs/msg/Quaternion"]
MS = 1_000_000


def header():
    H, T = TS.types["std_msgs/msg/Header"], TS.types["builtin_interfaces/msg/Time"]
    return H(stamp=T(sec=0, nanosec=0), frame_id="")


def joint_state(names, position=(), velocity=(), effort=()):
    f = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    return JS(header=header(), name=list(names), position=f(position), velocity=f(velocity), effort=f(effort))


def imu(q=(0.0, 0.0, 0.0, 1.0), w=(0.0, 0.0, 0.0), a=(0.0, 0.0, 9.81)):
    z9 = np.zeros(9)
    return IMU(header=header(), orientation=Q(*q), orientation_covariance=z9, angular_velocity=V3(*w),
               angular_velocity_covariance=z9, linear_acceleration=V3(*a), linear_acceleration_covariance=z9)


def twist(lin=(0.0, 0.0, 0.0), ang=(0.0, 0.0, 0.0)):
    return TWIST(linear=V3(*lin), angular=V3(*ang))


LEGGED = {
    "trigger": "/joint_states", "max_age_ms": 50,
    "observation": [
        {"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "field": "position", "joints": ["hip", "knee"]},
        {"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "field": "velocity", "joints": ["hip", "knee"],
         "scale": 0.5},
        {"topic": "/imu/data", "type": "sensor_msgs/msg/Imu", "field": "projected_gravity"},
        {"topic": "/imu/data", "type": "sensor_msgs/msg/Imu", "field": "angular_velocity"},
        {"topic": "/cmd_vel", "type": "geometry_msgs/msg/Twist", "field": "angular.z", "offset": 1.0},
    ],
    "action": {"topic": "/leg_controller/commands", "type": "std_msgs/msg/Float64MultiArray"},
}


def recipe(table=None, **kw):
    return parse_recipe(table or LEGGED, "test.toml", **kw)


def feed_all(asm, t):
    asm.on_message("/imu/data", imu(w=(0.1, 0.2, 0.3)), t)
    asm.on_message("/cmd_vel", twist(ang=(0, 0, 1.5)), t)


def test_a_frame_is_the_terms_in_order_joints_by_name():
    asm = FrameAssembler(recipe(n_features=11))
    feed_all(asm, 0)
    x = asm.on_message("/joint_states", joint_state(["knee", "toe", "hip"], [0.2, 9.0, -0.1], [4.0, 9.0, -2.0]),
                       1 * MS)
    # position hip, knee; velocity * 0.5; gravity upright (0, 0, -1); angular velocity; angular.z - 1
    np.testing.assert_array_equal(x, [-0.1, 0.2, -1.0, 2.0, 0.0, 0.0, -1.0, 0.1, 0.2, 0.3, 0.5])
    assert asm.counters()["frames_sent"] == 1


def test_only_the_trigger_makes_a_frame_and_the_newest_value_is_used():
    asm = FrameAssembler(recipe())
    feed_all(asm, 0)
    assert asm.on_message("/joint_states", joint_state(["hip", "knee"], [0, 0], [0, 0]), 0) is not None
    assert asm.on_message("/cmd_vel", twist(ang=(0, 0, 3.0)), 1 * MS) is None      # not the trigger
    x = asm.on_message("/joint_states", joint_state(["hip", "knee"], [0, 0], [0, 0]), 2 * MS)
    assert x[-1] == 2.0


@pytest.mark.parametrize("msg, reason", [
    (joint_state(["hip"], [0.0], [0.0]), "missing_joint"),
    (joint_state(["hip", "knee"], [math.nan, 0.0], [0.0, 0.0]), "non_finite"),
    (joint_state(["hip", "knee"], [0.0, 0.0], [math.inf, 0.0]), "non_finite"),
    (joint_state(["hip", "knee"], [0.0], [0.0, 0.0]), "short_array"),
    (joint_state(["hip", "knee"], [0.0, 0.0], []), "short_array"),       # velocity is used: an empty one is short
])
def test_a_bad_used_value_gives_no_frame_and_is_counted(msg, reason):
    asm = FrameAssembler(recipe())
    feed_all(asm, 0)
    assert asm.on_message("/joint_states", msg, 1 * MS) is None
    c = asm.counters()
    assert c["messages_refused"] == {reason: 1} and c["frames_withheld"] == {reason: 1} and c["frames_sent"] == 0
    # the next good message brings the term back
    assert asm.on_message("/joint_states", joint_state(["hip", "knee"], [0, 0], [0, 0]), 2 * MS) is not None


def test_unused_joints_and_fields_are_not_judged():
    asm = FrameAssembler(recipe())
    feed_all(asm, 0)
    msg = joint_state(["hip", "knee", "toe"], [0.0, 0.0, math.nan], [0.0, 0.0, math.inf], effort=[])
    assert asm.on_message("/joint_states", msg, 1 * MS) is not None


def test_stale_and_never_received_terms_by_arrival_time():
    asm = FrameAssembler(recipe())
    good = joint_state(["hip", "knee"], [0, 0], [0, 0])
    assert asm.on_message("/joint_states", good, 0) is None                 # no IMU nor Twist yet
    assert asm.counters()["frames_withheld"] == {"never_received": 1}
    feed_all(asm, 10 * MS)
    assert asm.on_message("/joint_states", good, 60 * MS) is not None       # exactly max_age_ms old: fresh
    assert asm.on_message("/joint_states", good, 60 * MS + 1) is None       # 1 ns later: stale
    assert asm.counters()["frames_withheld"] == {"never_received": 1, "stale_term": 1}
    asm.on_message("/imu/data", imu(), 70 * MS)
    assert asm.on_message("/joint_states", good, 71 * MS) is None           # the Twist is still stale
    asm.on_message("/cmd_vel", twist(), 72 * MS)
    assert asm.on_message("/joint_states", good, 73 * MS) is not None


def test_a_refused_imu_invalidates_its_terms_until_a_good_one():
    asm = FrameAssembler(recipe())
    feed_all(asm, 0)
    good = joint_state(["hip", "knee"], [0, 0], [0, 0])
    asm.on_message("/imu/data", imu(q=(0.0, 0.0, 0.0, 0.0)), 1 * MS)        # zero quaternion
    assert asm.on_message("/joint_states", good, 2 * MS) is None
    assert asm.counters()["frames_withheld"] == {"zero_quaternion": 1}
    asm.on_message("/imu/data", imu(), 3 * MS)
    assert asm.on_message("/joint_states", good, 4 * MS) is not None


def test_projected_gravity_rotates_world_down_into_the_body():
    asm = FrameAssembler(recipe())
    asm.on_message("/cmd_vel", twist(), 0)
    s = math.sqrt(0.5)
    asm.on_message("/imu/data", imu(q=(s, 0.0, 0.0, s)), 0)              # rolled +90 deg about x
    x = asm.on_message("/joint_states", joint_state(["hip", "knee"], [0, 0], [0, 0]), 0)
    np.testing.assert_allclose(x[4:7], [0.0, -1.0, 0.0], atol=1e-12)
    # against the rotation matrix written out: R^T (0, 0, -1)
    q = np.array([0.1, -0.3, 0.2, 0.9])
    q /= np.linalg.norm(q)
    xq, yq, zq, w = q
    R = np.array([[1 - 2 * (yq * yq + zq * zq), 2 * (xq * yq - w * zq), 2 * (xq * zq + w * yq)],
                  [2 * (xq * yq + w * zq), 1 - 2 * (xq * xq + zq * zq), 2 * (yq * zq - w * xq)],
                  [2 * (xq * zq - w * yq), 2 * (yq * zq + w * xq), 1 - 2 * (xq * xq + yq * yq)]])
    asm.on_message("/imu/data", imu(q=tuple(q * 3.0)), 0)                  # not normalised: the bridge does it
    x = asm.on_message("/joint_states", joint_state(["hip", "knee"], [0, 0], [0, 0]), 0)
    np.testing.assert_allclose(x[4:7], R.T @ [0, 0, -1], atol=1e-12)


def test_cos_sin_encoding_of_a_continuous_joint():
    t = {"observation": [{"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "field": "position",
                          "joints": ["theta"], "encode": "cos_sin"}]}
    asm = FrameAssembler(recipe(t, n_features=2))
    x = asm.on_message("/joint_states", joint_state(["theta"], [0.5]), 0)
    np.testing.assert_array_equal(x, [math.cos(0.5), math.sin(0.5)])


def _mistake(change):
    import copy
    t = copy.deepcopy(LEGGED)
    change(t)
    return t


@pytest.mark.parametrize("change, key, words", [
    (lambda t: t["observation"].pop(), "ros2.observation", "the terms give 10 values"),
    (lambda t: t["observation"][2].update(type="sensor_msgs/msg/Imuu"), "ros2.observation[2].type", "unknown"),
    (lambda t: t["observation"][3].update(field="angular_velocty"), "ros2.observation[3].field", "no field"),
    (lambda t: t["observation"][4].update(field="angular.w"), "ros2.observation[4].field", "no field"),
    (lambda t: t["observation"][0].pop("joints"), "ros2.observation[0].joints", "missing"),
    (lambda t: t["observation"][0].update(joints=["hip", "hip"]), "ros2.observation[0].joints", "twice"),
    (lambda t: t["observation"][1].update(scale=[1, 2, 3]), "ros2.observation[1].scale", "has 3 values"),
    (lambda t: t.update(trigger="/tf"), "ros2.trigger", "not the topic"),
    (lambda t: t.update(qos="fast"), "ros2.qos", "invalid"),
    (lambda t: t.update(max_age_ms=0), "ros2.max_age_ms", "invalid"),
    (lambda t: t.update(rate=5), "ros2.rate", "unknown key"),
    (lambda t: t["observation"][4].update(topic="/joint_states"), "ros2.observation[4].type", "one type per topic"),
    (lambda t: t["action"].update(type="sensor_msgs/msg/JointState", field="velocity"), "ros2.action.field", "position"),
    (lambda t: t["action"].update(type="std_msgs/msg/String"), "ros2.action.type", "unsupported"),
])
def test_each_config_mistake_is_refused_naming_the_key(change, key, words):
    with pytest.raises(ConfigError) as e:
        parse_recipe(_mistake(change), "test.toml", n_features=11)
    assert e.value.field == key and words in str(e.value) and "Fix:" in str(e.value), str(e.value)


def test_joints_out_of_the_models_feature_order_are_refused():
    names = ["knee_pos", "hip_pos", "hip_vel", "knee_vel"] + [f"imu{i}" for i in range(7)]
    with pytest.raises(ConfigError) as e:
        parse_recipe(LEGGED, "test.toml", n_features=11, feature_names=names)
    assert e.value.field == "ros2.observation[0].joints" and "knee_pos, hip_pos" in str(e.value)
    ok = ["hip_pos", "knee_pos", "hip_vel", "knee_vel"] + [f"imu{i}" for i in range(7)]
    parse_recipe(LEGGED, "test.toml", n_features=11, feature_names=ok)


def test_a_joint_state_action_needs_the_models_joint_names():
    t = _mistake(lambda t: t["action"].update(type="sensor_msgs/msg/JointState", field="effort"))
    with pytest.raises(ConfigError, match="no action_names"):
        parse_recipe(t, "test.toml", action_names=["u0", "u1"])
    r = parse_recipe(t, "test.toml", action_names=["hip", "knee"])
    assert r.action.names == ["hip", "knee"] and r.action.field == "effort"


def test_ros_domain_id_in_the_environment_overrides_the_config(monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", "42")
    assert recipe({**LEGGED, "domain_id": 3}).domain_id == 42
    monkeypatch.delenv("ROS_DOMAIN_ID")
    assert recipe({**LEGGED, "domain_id": 3}).domain_id == 3


def _run_cli(*args, pre=""):
    code = pre + "import sys\nfrom control_node.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_bridge_check_refuses_a_wrong_width_at_start(tmp_path, continuous_f64_model_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[ros2]\n[[ros2.observation]]\ntopic = "/joint_states"\ntype = "sensor_msgs/msg/JointState"\n'
                   'field = "position"\njoints = ["a", "b"]\n')
    r = _run_cli("bridge", "ros2", "--config", cfg, "--model", continuous_f64_model_path, "--check")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "field 'ros2.observation'" in r.stderr and "the model takes 6" in r.stderr


def test_bridge_without_rclpy_exits_2_with_the_install_command(tmp_path, continuous_f64_model_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[ros2]\n[[ros2.observation]]\ntopic = "/x"\ntype = "std_msgs/msg/Float64MultiArray"\n'
                   'field = "data"\nsize = 6\n')
    # rclpy made unimportable in this interpreter, as on a machine with neither the wheels nor a sourced ROS 2
    r = _run_cli("bridge", "ros2", "--config", cfg, "--model", continuous_f64_model_path,
                 pre="import sys\nsys.modules['rclpy'] = None\n")
    assert r.returncode == 2, r.stderr
    assert "pip install 'control-node[ros2]'" in r.stderr and "setup.bash" in r.stderr and "Traceback" not in r.stderr


def test_run_accepts_the_same_config_file():
    from control_node.config import load_config
    from control_node.endpoints import default_config
    cfg = load_config(default_config("pendulum_ros2.toml"))
    assert cfg["loop"]["rate_hz"] == 1000.0


@pytest.mark.parametrize("typ, field", [("std_msgs/msg/Float64MultiArray", "data"),
                                        ("sensor_msgs/msg/JointState", "effort"),
                                        ("trajectory_msgs/msg/JointTrajectory", "positions")])
def test_action_messages_built_with_rclpys_classes(typ, field):
    """The action message of each type, built from rclpy's own classes (no ROS graph is joined)."""
    pytest.importorskip("rclpy", reason="rclpy is missing: pip install -e '.[ros2]'")
    from control_node.bridge.recipe import ActionSpec
    from control_node.bridge.ros2 import ActionWriter, message_class
    spec = ActionSpec(topic="/cmd", type=typ, field=field, qos="reliable", names=["hip", "knee"],
                      time_from_start_s=0.02)
    names = [typ, "trajectory_msgs/msg/JointTrajectoryPoint", "builtin_interfaces/msg/Duration"]
    w = ActionWriter(spec, {n: message_class(n) for n in names})
    stamp = message_class("builtin_interfaces/msg/Time")(sec=5, nanosec=7)
    m = w.build(np.array([0.5, -1.25]), stamp if w.stamped else None)
    if typ.endswith("Float64MultiArray"):
        assert list(m.data) == [0.5, -1.25] and not w.stamped
    elif typ.endswith("JointState"):
        assert list(m.name) == ["hip", "knee"] and list(m.effort) == [0.5, -1.25] and list(m.position) == []
        assert (m.header.stamp.sec, m.header.stamp.nanosec) == (5, 7)
    else:
        assert list(m.joint_names) == ["hip", "knee"] and len(m.points) == 1
        p = m.points[0]
        assert list(p.positions) == [0.5, -1.25] and (p.time_from_start.sec, p.time_from_start.nanosec) == (0, 20_000_000)
    from rclpy.serialization import deserialize_message, serialize_message
    back = deserialize_message(serialize_message(m), type(m))       # a well-formed message of its type
    assert back == m


def test_a_bad_policy_history_is_refused_naming_the_key(tmp_path, continuous_f64_model_path):
    from control_node.bridge.recipe import load_recipe
    cfg = tmp_path / "c.toml"
    cfg.write_text('[policy]\nhistory = "two"\n[ros2]\n[[ros2.observation]]\ntopic = "/x"\n'
                   'type = "std_msgs/msg/Float64MultiArray"\nfield = "data"\nsize = 6\n')
    with pytest.raises(ConfigError) as e:
        load_recipe(cfg, model=continuous_f64_model_path)
    assert e.value.field == "policy.history"
