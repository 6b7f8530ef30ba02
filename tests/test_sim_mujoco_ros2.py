"""`control-node sim mujoco --ros2` (issue 46): the MuJoCo quadruped as a ROS 2 robot, with real rclpy processes,
real MuJoCo and a real node.

* `launch quadruped_ros2` (node + `bridge ros2` + `sim mujoco --ros2`, the packaged config) in lockstep walks the
  packaged policy with falls 0; the walk is scored by the bridge's latched policy_active Bool;
* a controller peer answering each JointState with JointState commands whose joints come in an order of their
  own: each torque lands on its joint BY NAME; malformed commands (a joint unknown, missing or twice, NaN, a
  short array; a Float64MultiArray of a wrong width or with an Inf) are counted by reason and never applied;
  with ``--cmd ros`` the velocity command is the one a teleop publishes on /cmd_vel, not a schedule's.

Every ROS 2 process runs in a private network namespace holding only ``lo`` with a private ROS_DOMAIN_ID
(tests/test_ros2_bridge.py's fixtures)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mujoco", reason="sim mujoco needs MuJoCo: pip install 'control-node[mujoco]'")
pytest.importorskip("rclpy", reason="rclpy is missing: pip install -e '.[ros2]' (the ROS 2 wheels)")

from support.nodeutil import quiet_node_toml  # noqa: E402
from test_ros2_bridge import netns  # noqa: E402,F401
from control_node.endpoints import default_config  # noqa: E402

# a lockstep robot's clock stands still while it waits for a command, and DDS discovery on a loaded host can take
# seconds (test_ros2_bridge.ROBOT_TIMEOUT_S says why): the robot waits this long for the bridge
ROBOT_TIMEOUT_S = 60
SIM_ARGS = '["mujoco", "--ros2", "--dt", "0.001", "--keyframe", "crouch", "--damp-before-end", "1.0"]'
JOINTS = [f"{leg}_{p}_joint" for leg in ("FL", "FR", "RL", "RR") for p in ("hip", "thigh", "calf")]


def packaged(**replace) -> str:
    text = open(default_config("quadruped_ros2.toml")).read()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.mark.slow
def test_launch_quadruped_ros2_walks_in_lockstep(netns, tmp_path):  # noqa: F811
    """The packaged launch, the robot in lockstep at 500 Hz (each state waits for the command answering it, so a
    stall of the suite's other workers slows the walk instead of breaking it) for 5 simulated seconds: stand from
    the crouch, the policy at 0.4 m/s, damping asked on the mode topic 1 s before the end."""
    text = packaged(**{
        SIM_ARGS: SIM_ARGS[:-1] + f', "--lockstep", "--rate", "500", "--timeout", "{ROBOT_TIMEOUT_S}"]',
        # the robot's clock stands still while it waits: a host stall must not trip the node's watchdog
        "stale_after_ms = 200.0": "stale_after_ms = 5000.0"})
    cfg = tmp_path / "quadruped_ros2.toml"
    cfg.write_text(quiet_node_toml(text))
    p = netns.popen(sys.executable, "-m", "control_node", "launch", str(cfg), "--duration", "5",
                    "--run-dir", str(tmp_path / "run"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    cwd=str(tmp_path))
    out, _ = p.communicate(timeout=150)
    assert p.returncode == 0, out
    with open(tmp_path / "run" / "sim" / "summary.json") as f:
        s = json.load(f)
    with open(tmp_path / "run" / "bridge" / "summary.json") as f:
        br = json.load(f)
    print(s["control"]["line"])
    assert re.search(r"\[launch\] sim: walked [\d.]+ m at [\d.]+ m/s \(command 0\.40 m/s\).*, falls 0", out), out
    assert "[launch] node: " in out
    assert (s["role"], s["task"], s["transport"]) == ("sim", "mujoco", "ros2"), s
    assert s["frames_sent"] == s["frames_answered"] == 2500 and s["commands_refused"] == {}, s
    # scored only while the bridge said the node's commands were its policy's: it entered (true) and left at the
    # damping request (false), and walked in between
    ch = [c["value"] for c in s["ros2"]["policy_active_changes"]]
    assert ch == [False, True, False] or ch == [True, False], ch
    assert br["policy_active"]["published"] >= 2 and br["policy_active"]["last"] is False, br["policy_active"]
    assert s["damping_request"]["ok"], s["damping_request"]
    assert s["score"]["falls"] == 0 and s["policy_s"] > 1.0, (s["score"], s["policy_s"])
    assert s["score"]["distance_m"] > 0.25 * s["policy_s"], (s["score"], s["policy_s"])
    assert br["frames_withheld"] == {} and br["mode_requests"] == {"ok": 1}, br
    with open(tmp_path / "run" / "node" / "summary.json") as f:
        node = json.load(f)
    tr = [(t["from"], t["to"], t["reason"]) for t in node["legged"]["transitions"]]
    assert tr[-1] == ("policy", "damping", "request"), tr


# A controller standing in for bridge + node: answers the JointState stamped at simulated time t with the command
# of step round(t / step_s) of its script (the handshake's states, at t = 0, get step 0's), on the command topic.
PEER = r'''
import json, sys, threading
import rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

script = json.load(open(sys.argv[1]))
rclpy.init()
node = rclpy.create_node("test_controller")
typ = script["type"]
pub = node.create_publisher(JointState if typ == "JointState" else Float64MultiArray, script["topic"],
                            QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
twist = None
if script.get("twist"):             # a teleop's velocity command on /cmd_vel, sent before each answer
    from geometry_msgs.msg import Twist
    tw_pub = node.create_publisher(Twist, "/cmd_vel", QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
    twist = Twist()
    twist.linear.x, twist.linear.y, twist.angular.z = script["twist"]
done = threading.Event()

def on_state(m):
    k = round((m.header.stamp.sec + m.header.stamp.nanosec * 1e-9) / script["step_s"])
    if k >= len(script["steps"]):
        done.set()
        return
    c = script["steps"][k]
    if twist is not None:
        tw_pub.publish(twist)
    if typ == "JointState":
        out = JointState()
        out.name = c["name"]
        out.effort = [float(v) for v in c["effort"]]
    else:
        out = Float64MultiArray()
        out.data = [float(v) for v in c["data"]]
    pub.publish(out)

node.create_subscription(JointState, "/joint_states", on_state, qos_profile_sensor_data)
print("controller ready", flush=True)
while rclpy.ok() and not done.is_set():
    rclpy.spin_once(node, timeout_sec=0.05)
'''

CFG_EXTRA = 'actuators = ["RR_calf_joint", "RR_thigh_joint", "RR_hip_joint", "RL_calf_joint", "RL_thigh_joint",\n' \
            '             "RL_hip_joint", "FR_calf_joint", "FR_thigh_joint", "FR_hip_joint", "FL_calf_joint",\n' \
            '             "FL_thigh_joint", "FL_hip_joint"]\n'


def run_against_controller(ns, tmp_path, name, typ, steps, n_frames, twist=None):
    """``sim mujoco --ros2 --lockstep`` for ``n_frames`` frames (1 ms each) against the scripted controller;
    ``twist``: the controller also publishes that velocity command on /cmd_vel and the sim reads it (--cmd ros)."""
    script = tmp_path / f"{name}.json"
    script.write_text(json.dumps({"type": typ, "topic": "/test/commands", "step_s": 0.001, "steps": steps,
                                  "twist": twist}))
    peer_py = tmp_path / "controller.py"
    peer_py.write_text(PEER)
    peer = ns.popen(sys.executable, str(peer_py), str(script), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sim = ns.popen(sys.executable, "-m", "control_node", "sim", "mujoco", "--ros2", "--lockstep", "--config",
                   str(tmp_path / "node.toml"), "--command-topic", "/test/commands", "--command-type", typ,
                   "--duration", f"{n_frames / 1000:g}", "--dt", "0.001", "--keyframe", "crouch", "--timeout",
                   str(ROBOT_TIMEOUT_S), "--run-dir", str(tmp_path / name), *(["--cmd", "ros"] if twist else []),
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sout, _ = sim.communicate(timeout=120)
    peer.kill()
    pout, _ = peer.communicate(timeout=10)
    assert sim.returncode == 0, sout + pout
    with open(tmp_path / name / "summary.json") as f:
        s = json.load(f)
    return s, np.load(tmp_path / name / "trace.npz"), sout


@pytest.mark.slow
def test_commands_by_joint_name_and_malformed_ones_refused(netns, tmp_path):  # noqa: F811
    """joints.actuators (the command's order) is RR..FL calf-first, the controller names the joints in a shuffled
    order of its own each step: every applied torque is the one the controller gave that joint's name (the trace's
    actuator torque at that joint). A malformed command answers its state and is not applied: the torque in force
    stays the previous good command's; each is counted by its reason."""
    text = packaged(**{'[legged.joints]\n': '[legged.joints]\n' + CFG_EXTRA})
    (tmp_path / "node.toml").write_text(text)
    actuators = [j.strip(' "\n,[]') for j in CFG_EXTRA.split("=", 1)[1].split(",")]
    assert sorted(actuators) == sorted(JOINTS) and actuators != JOINTS
    rng = np.random.default_rng(5)
    n = 120
    bad = {10: "unknown_joint", 25: "missing_joint", 40: "non_finite", 55: "short_array", 70: "duplicate_joint",
           71: "non_finite"}
    steps, want = [], []
    for k in range(n):
        order = list(rng.permutation(JOINTS))
        tau = dict(zip(order, rng.uniform(-5.0, 5.0, 12).round(6)))
        c = {"name": order, "effort": [tau[j] for j in order]}
        why = bad.get(k)
        if why == "unknown_joint":
            c = {"name": order + ["wheel"], "effort": c["effort"] + [1.0]}
        elif why == "missing_joint":
            c = {"name": order[1:], "effort": c["effort"][1:]}
        elif why == "non_finite":
            c["effort"][3] = float("nan") if k == 40 else float("inf")
        elif why == "short_array":
            c["effort"] = c["effort"][:-1]
        elif why == "duplicate_joint":
            c = {"name": order + [order[0]], "effort": c["effort"] + [0.0]}
        steps.append(c)
        want.append(want[-1] if why else [tau[j] for j in actuators])
    s, tr, out = run_against_controller(netns, tmp_path, "by_name", "JointState", steps, n)
    assert s["frames_answered"] == s["frames_sent"] == n, out
    assert s["robot"]["joints"]["commands"] == actuators
    refused = {}
    for why in bad.values():
        refused[why] = refused.get(why, 0) + 1
    assert s["commands_refused"] == refused, (s["commands_refused"], s["ros2"]["last_refusal"])
    assert s["commands_applied"] == n - len(bad), s["commands_applied"]
    # the trace's torque per frame is the actuator force at each commanded joint, in joints.actuators' order
    np.testing.assert_allclose(tr["torque"], np.asarray(want), rtol=0, atol=1e-9)
    assert "refused" in out and "ROS 2: /joint_states" in out, out

    # Float64MultiArray: by position in joints.actuators' order; a wrong width and an Inf refused
    m = 40
    data = [rng.uniform(-5.0, 5.0, 12).round(6).tolist() for _ in range(m)]
    bad = {5: "wrong_width", 6: "wrong_width", 20: "non_finite"}
    steps, want = [], []
    for k in range(m):
        d = list(data[k])
        if k == 5:
            d = d[:11]
        elif k == 6:
            d = d + [0.0]
        elif k == 20:
            d[0] = float("inf")
        steps.append({"data": d})
        want.append(want[-1] if k in bad else data[k])
    twist = [0.3, 0.1, -0.2]        # and the velocity command a teleop's, read from /cmd_vel (--cmd ros)
    s, tr, out = run_against_controller(netns, tmp_path, "array", "Float64MultiArray", steps, m, twist=twist)
    assert s["commands_refused"] == {"wrong_width": 2, "non_finite": 1} and s["commands_bad_width"] == 2, s
    np.testing.assert_allclose(tr["torque"], np.asarray(want), rtol=0, atol=1e-9)
    # the frames carry the teleop's command (the last n_commands columns) from the step after its first Twist on
    assert s["ros2"]["command_from"].startswith("the command topic (--cmd ros)"), s["ros2"]
    cmd = np.load(tmp_path / "array" / "frames.npz")["x"][:, -3:]
    assert (cmd[:2] == 0).all() or (cmd[:2] == twist).all(), cmd[:3]       # zero before the first Twist
    np.testing.assert_array_equal(cmd[-(m - 5):], np.tile(twist, (m - 5, 1)))


def test_the_policy_state_topic_is_checked_and_joint_state_commands_need_the_output_field(netns, tmp_path):  # noqa: F811
    """[ros2.legged] policy_active must be an absolute topic (refused naming the key); a JointState command
    whose [ros2.action] field does not fit the node's output is refused before anything starts, naming the fix."""
    from control_node.bridge.recipe import load_recipe
    from control_node.errors import ConfigError
    bad = tmp_path / "bad.toml"
    bad.write_text(packaged(**{'policy_active = "/control_node/policy_active"': 'policy_active = "policy"'}))
    with pytest.raises(ConfigError, match="ros2.legged.policy_active"):
        load_recipe(str(bad))
    assert load_recipe(default_config("quadruped_ros2.toml")).policy_topic == "/control_node/policy_active"
    js = tmp_path / "js.toml"
    js.write_text(packaged(**{'type = "std_msgs/msg/Float64MultiArray"': 'type = "sensor_msgs/msg/JointState"'}))
    # in the namespace too: the refusal comes before rclpy starts, and a regression that started it would stay on lo
    p = netns.popen(sys.executable, "-m", "control_node", "sim", "mujoco", "--ros2", "--config", js, "--run-dir",
                    tmp_path / "r", "--duration", "0.1", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, out + err
    assert "[ros2.action] field" in lines[0] and 'field = "effort"' in lines[0], lines[0]
