"""`control-node sim mujoco --ros2`: the MuJoCo robot as a ROS 2 robot, as ros2_control and an IMU driver
would present it; the closed loop, score and run directory are ``mujoco_client.MujocoSim``'s, the same as the
ZeroMQ path's.

Each control step it publishes, in this order (the bridge's trigger, JointState, last, so the frame it makes
holds this step's Imu and Twist):

* ``geometry_msgs/msg/Twist`` on ``[ros2.legged] command`` (default ``/cmd_vel``): the ``--cmd`` schedule's
  (linear.x, linear.y, angular.z);
* ``sensor_msgs/msg/Imu`` on ``imu`` (``/imu/data``): orientation (x, y, z, w), angular_velocity,
  linear_acceleration, body frame, from the model's IMU site, frame_id the site's name;
* ``sensor_msgs/msg/JointState`` on ``joint_states`` (``/joint_states``): every hinge/slide joint of the model by
  name, position, velocity, effort = the actuator torque of the last physics step.

Stamps are simulated time. Commands come on ``[ros2.action] topic`` (``--command-topic``; default
``/leg_controller/commands``) as ``std_msgs/msg/Float64MultiArray`` (data in ``joints.actuators``' order, five
rows for an impedance output) or ``sensor_msgs/msg/JointState`` (matched BY NAME: effort for a torque output,
position for a position output). A malformed command (a wrong width, a non-finite value, a joint the robot
does not command, one missing, a short array, a name twice) is counted by reason and never applied.

ROS 2 commands carry neither a frame number nor the node's ``safe`` flag. A command answers the last state
published before it arrived (lockstep: each control step waits for that command). The node's mode comes from
the bridge's latched ``std_msgs/msg/Bool`` on ``[ros2.legged] policy_active`` (true while the node's commands
are its policy's), which the bridge publishes before the command that changed it: a command is scored as the
policy's when the last Bool that arrived before it said true. The damping request (``--damp-before-end``) is a
``std_msgs/msg/String`` "damping" on ``[ros2.legged] mode``, which the bridge passes to the node.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque

import numpy as np

from control_node.errors import UserError
from control_node.sim.mujoco_client import LeggedSide, MujocoSim

DEFAULT_COMMAND_TOPIC = "/leg_controller/commands"
COMMAND_TYPES = {"Float64MultiArray": "std_msgs/msg/Float64MultiArray", "JointState": "sensor_msgs/msg/JointState"}
QUIET_S = 0.5           # lockstep: the handshake is over when no command came for this long
REASONS = ("wrong_width", "non_finite", "unknown_joint", "missing_joint", "short_array", "duplicate_joint")


def ros2_settings(config, side: LeggedSide, command_topic=None, command_type=None) -> dict:
    """Topics and the command's type from the node config's ``[ros2]`` section (the bridge's own: nothing
    written twice), each overridable; checked against the node's output."""
    from control_node.bridge.recipe import LEGGED_TOPICS
    from control_node.config import read_toml
    raw = (read_toml(config) if config else {}).get("ros2") or {}
    topics = dict(LEGGED_TOPICS)
    legged = raw.get("legged")
    if isinstance(legged, dict):
        topics.update({k: v for k, v in legged.items() if k in LEGGED_TOPICS and isinstance(v, str)})
    action = raw.get("action") if isinstance(raw.get("action"), dict) else {}
    topic = command_topic or action.get("topic") or DEFAULT_COMMAND_TOPIC
    if not topic.startswith("/"):
        raise UserError(f"--command-topic {topic!r}: use an absolute topic name, e.g. {DEFAULT_COMMAND_TOPIC}")
    if command_type is not None:
        typ = COMMAND_TYPES[command_type]
        where = f"--command-type {command_type}"
    else:
        typ = action.get("type", "std_msgs/msg/Float64MultiArray")
        where = f"[ros2.action] type in {side.source}"
    if typ not in COMMAND_TYPES.values():
        raise UserError(f"{where} is {typ!r}: the simulated robot takes {' or '.join(COMMAND_TYPES.values())}. "
                        "Fix: use one of them (or --command-type)")
    field = None
    if typ == "sensor_msgs/msg/JointState":
        if side.output == "impedance":
            raise UserError(f"{where} is a JointState, and the node's [legged] output \"impedance\" publishes five "
                            "rows per joint (q*, qd*, kp, kd, tau_ff), which a JointState cannot carry. Fix: "
                            "std_msgs/msg/Float64MultiArray (or --command-type Float64MultiArray)")
        field = "effort" if side.output == "torque" else "position"
        have = action.get("field", "position")
        if command_type is None and action and have != field:
            raise UserError(f"[ros2.action] field is {have!r} in {side.source}, and the node's [legged] output "
                            f"{side.output!r} needs the JointState's {field}. Fix: set [ros2.action] field = "
                            f"\"{field}\"")
    from control_node.bridge.recipe import QOS
    qos = action.get("qos", "reliable")
    if qos not in QOS:
        raise UserError(f"[ros2.action] qos is {qos!r} in {side.source}. Fix: use one of {', '.join(QOS)}")
    return {"topics": topics, "command_topic": topic, "command_type": typ, "field": field, "command_qos": qos}


class TwistCommand:
    """The velocity command as a ROS robot gets it from a teleop or a planner: the newest Twist on the command
    topic ((linear.x, linear.y, angular.z); zero before the first), read where the schedule would be (``--cmd
    ros``). A non-finite Twist is counted and not taken."""

    def __init__(self):
        self.value, self.received, self.refused = (0.0, 0.0, 0.0), 0, 0

    def on_twist(self, msg):
        v = (float(msg.linear.x), float(msg.linear.y), float(msg.angular.z))
        if not all(math.isfinite(c) for c in v):
            self.refused += 1
            return
        self.value = v
        self.received += 1

    def __call__(self, t_s):
        return self.value


class MujocoRos2(MujocoSim):
    """The ROS 2 transport: an rclpy node publishing the robot's state and taking its commands."""

    transport = "ros2"

    def __init__(self, side: LeggedSide, robot, ros2: dict, *, domain_id=None, **loop):
        try:
            import rclpy
            from geometry_msgs.msg import Twist
            from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
            from sensor_msgs.msg import Imu, JointState
            from std_msgs.msg import Bool, Float64MultiArray, String
        except ImportError as e:
            from control_node.bridge.recipe import INSTALL
            raise UserError(f"sim mujoco --ros2 needs rclpy ({e}). Install: {INSTALL}") from None
        self._setup(side, robot, **loop)
        self.ros2 = ros2
        self.topics = ros2["topics"]
        self.command_topic, self.command_type, self.field = ros2["command_topic"], ros2["command_type"], ros2["field"]
        self.rclpy, self.JointState, self.Imu, self.Twist, self.String = rclpy, JointState, Imu, Twist, String
        self.n_out = len(side.out_joints)
        self._out_index = {j: k for k, j in enumerate(side.out_joints)}
        self.refused = {r: 0 for r in REASONS}
        self.last_refusal = None
        self.q, self.lock, self.arrived = deque(), threading.Lock(), threading.Event()
        self._last = (-1, 0)                     # (frame, t_ns): the last state published
        self._seq0 = 0
        self.policy_active = False               # the bridge's latched Bool
        self.policy_changes = []                 # (t_ns, value)
        self.states_published = self.commands = 0
        if domain_id is None:
            rclpy.init()
        else:
            rclpy.init(domain_id=int(domain_id))
        self.node = rclpy.create_node("mujoco_sim")
        pub = self.node.create_publisher
        # the states are published reliable: a reliable writer matches a subscriber of either QoS the bridge's
        # [ros2] qos may ask for (a best-effort one would miss a reliable reader)
        state_qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.pub_js = pub(JointState, self.topics["joint_states"], state_qos)
        self.pub_imu = pub(Imu, self.topics["imu"], state_qos)
        # --cmd ros: the velocity command is a teleop's or a planner's on the command topic, read not written
        self.twist_in = self.schedule if isinstance(self.schedule, TwistCommand) else None
        if self.twist_in is None:
            self.pub_twist = pub(Twist, self.topics["command"], state_qos)
        else:
            self.node.create_subscription(Twist, self.topics["command"], self.twist_in.on_twist, state_qos)
        self.pub_mode = pub(String, self.topics["mode"], QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        # the mode's Bool first: a single-threaded executor serves ready subscriptions in creation order, so a
        # Bool and a command ready in the same wait are taken Bool first (the bridge sends it first)
        self.node.create_subscription(Bool, self.topics["policy_active"], self._on_policy, QoSProfile(
            depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        # commands with the QoS the bridge publishes them with ([ros2.action] qos): a reliable reader never
        # matches a best-effort writer
        cmd_qos = (qos_profile_sensor_data if ros2.get("command_qos") == "sensor_data"
                   else QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        if self.command_type == "sensor_msgs/msg/JointState":
            self.cmd_sub = self.node.create_subscription(JointState, self.command_topic, self._on_joint_state,
                                                         cmd_qos)
        else:
            self.cmd_sub = self.node.create_subscription(Float64MultiArray, self.command_topic, self._on_array,
                                                         cmd_qos)
        r = robot
        self._js_names = list(r.joint_names)
        self._imu_frame = str(r.imu_site)
        from control_node.bridge.ros2 import make_executor
        from control_node.sim.ros2_spin import Ros2Spin
        self.spin = Ros2Spin(rclpy, self.node, make_executor())

    def where(self):
        return f"ROS 2 {self.topics['joint_states']} -> {self.command_topic}"

    def close(self):
        self.spin.close()

    # -- commands in ------------------------------------------------------------------------------------
    def _on_policy(self, msg):
        self.policy_active = bool(msg.data)
        self.policy_changes.append((time.monotonic_ns(), self.policy_active))

    def _refuse(self, reason, detail):
        self.refused[reason] += 1
        self.last_refusal = f"{reason}: {detail}"
        return reason

    def _on_array(self, msg):
        now = time.monotonic_ns()
        want = self.side.rows * self.n_out
        data = msg.data
        if len(data) != want:
            self._push(now, None, self._refuse("wrong_width", f"{len(data)} values, the node's output takes {want}"))
            return
        u = np.asarray(data, dtype=np.float64)
        if not np.isfinite(u).all():
            self._push(now, None, self._refuse("non_finite", f"{u[~np.isfinite(u)][0]}"))
            return
        self._push(now, u, None)

    def _on_joint_state(self, msg):
        now = time.monotonic_ns()
        names, arr = list(msg.name), getattr(msg, self.field)
        u = np.full(self.n_out, np.nan)
        bad = None
        if len(arr) < len(names):
            bad = ("short_array", f"{self.field} has {len(arr)} values for {len(names)} names")
        elif len(set(names)) != len(names):
            bad = ("duplicate_joint", "a joint named twice")
        else:
            for name, v in zip(names, arr):
                k = self._out_index.get(name)
                if k is None:
                    bad = ("unknown_joint", f"{name!r} is not a joint this robot commands")
                    break
                u[k] = v
            if bad is None:
                missing = [j for j in self.side.out_joints if j not in set(names)]
                finite = np.isfinite(u)
                if missing:
                    bad = ("missing_joint", f"no {missing[0]!r}")
                elif not finite.all():
                    bad = ("non_finite", f"{self.side.out_joints[int(np.flatnonzero(~finite)[0])]}")
        if bad is not None:
            self._push(now, None, self._refuse(*bad))
            return
        self._push(now, u, None)

    def _push(self, t_ns, u, bad):
        f, t_sent = self._last
        frame = f if f >= 0 and t_ns >= t_sent else -1
        a = {"u": u, "bad": bad, "safe": not self.policy_active, "frame": frame, "seq": self._seq0 + frame,
             "t_ns": t_ns}
        with self.lock:
            self.q.append(a)
            self.commands += 1
        self.arrived.set()

    def _collect(self, wait_ms):
        if wait_ms > 0:
            self.arrived.clear()
            if not self.q:
                self.arrived.wait(wait_ms / 1000.0)
        while True:
            with self.lock:
                if not self.q:
                    return
                a = self.q.popleft()
            yield a

    # -- the state out ----------------------------------------------------------------------------------
    def frame(self, cmd):
        self._cmd = cmd
        return super().frame(cmd)

    def _stamp(self):
        from builtin_interfaces.msg import Time
        t = self.robot.time
        sec = int(math.floor(t))
        return Time(sec=sec, nanosec=min(999_999_999, int(round((t - sec) * 1e9))))

    def _publish_state(self, cmd, trigger=True, frame=None):
        r = self.robot
        d, sd = r.data, r.data.sensordata
        stamp = self._stamp()
        if self.twist_in is None:
            tw = self.Twist()
            tw.linear.x, tw.linear.y, tw.angular.z = (float(v) for v in (tuple(cmd) + (0.0, 0.0, 0.0))[:3])
            self.pub_twist.publish(tw)
        imu = self.Imu()
        imu.header.stamp, imu.header.frame_id = stamp, self._imu_frame
        q = sd[r._quat_adr:r._quat_adr + 4]
        o = imu.orientation
        o.w, o.x, o.y, o.z = (float(v) for v in q)
        g = sd[r._gyro_adr:r._gyro_adr + 3]
        imu.angular_velocity.x, imu.angular_velocity.y, imu.angular_velocity.z = (float(v) for v in g)
        a = sd[r._acc_adr:r._acc_adr + 3] if r._acc_adr is not None else (0.0, 0.0, 0.0)
        imu.linear_acceleration.x, imu.linear_acceleration.y, imu.linear_acceleration.z = (float(v) for v in a)
        self.pub_imu.publish(imu)
        if not trigger:
            return None
        js = self.JointState()
        js.header.stamp = stamp
        js.name = self._js_names
        js.position = d.qpos[r._qadr_all].tolist()
        js.velocity = d.qvel[r._vadr_all].tolist()
        js.effort = d.qfrc_actuator[r._vadr_all].tolist()
        t = time.monotonic_ns()
        if frame is not None:
            self._last = (frame, t)          # before the publish: its answer can come back at once
        self.pub_js.publish(js)
        self.states_published += 1
        return t

    def _send(self, seq, x):
        return self._publish_state(self._cmd, frame=seq - self._seq0)

    def _handshake(self, x0, stopper):
        """States every 20 ms until a command comes (the bridge and the node answer: DDS discovery and the
        ZeroMQ joins are done). Returns (seq0, the handshake's states [(seq, t_ns, x)])."""
        deadline = time.monotonic() + self.timeout
        cmd = self.schedule(0.0)
        warm = []
        while time.monotonic() < deadline:
            if stopper is not None and stopper.stop:
                raise KeyboardInterrupt
            t = self._publish_state(cmd)
            warm.append((len(warm), t, x0.copy()))
            time.sleep(0.02)
            if self.q:
                return len(warm), warm
        raise UserError(f"no command on {self.command_topic} within {self.timeout:g} s after publishing "
                        f"{self.topics['joint_states']}: {self._graph_evidence()}")

    def _graph_evidence(self):
        """What DDS discovery had matched when no command came (a bridge that is not there, or not matched yet)."""
        cmd = self.command_topic
        matched, known = self.cmd_sub.get_publisher_count(), self.node.count_publishers(cmd)
        readers = self.pub_js.get_subscription_count()
        seen = (f"publishers of {cmd} matched {matched}, known to the graph {known}; subscribers matched to "
                f"{self.topics['joint_states']} {readers}")
        if known == 0 and readers == 0:
            return (f"{seen}. Is the bridge running (control-node bridge ros2 --config SAME_CONFIG) with the node, on "
                    "this ROS_DOMAIN_ID?")
        if matched == 0:
            return f"{seen}. Discovery has not matched the command's publisher yet (--timeout sets the wait)"
        if any(self.refused.values()):
            return f"{seen}. Every command was refused: {self.last_refusal}"
        return f"{seen}. A matched publisher sent nothing: is the node answering the bridge?"

    def _flush(self):
        """The handshake's leftovers. Lockstep: one taken as the first state's answer would shift every answer by
        a state, so they are drained until QUIET_S passes without one (the Imu and Twist kept fresh meanwhile,
        no JointState: no frame)."""
        quiet = QUIET_S if self.lockstep else 0.05
        until = time.monotonic() + quiet
        cmd = self.schedule(0.0)
        while time.monotonic() < until:
            self._publish_state(cmd, trigger=False)
            time.sleep(0.02)
            with self.lock:
                got = bool(self.q)
                self.q.clear()
            if got and self.lockstep:
                until = time.monotonic() + quiet

    def _request_damping(self):
        """"damping" on the mode topic (the bridge passes it to the node's control endpoint). In lockstep the
        step waits (up to 2 s) for the node to leave the policy (policy_active false), so the commands that
        change makes the node send arrive before the next state and answer none."""
        self.pub_mode.publish(self.String(data="damping"))
        topic = self.topics["mode"]
        if not self.lockstep:
            return True, f"published on {topic}"
        if not self.policy_active:
            return True, f"published on {topic} (the node was not in policy)"
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            if not self.policy_active:
                time.sleep(0.02)        # the command of the change, published after the Bool
                return True, f"published on {topic}; policy_active false after {1e3 * (time.monotonic() - t0):.0f} ms"
            time.sleep(0.002)
        return False, f"published on {topic}; policy_active still true after 2 s"

    def ros2_summary(self, t0_ns=None) -> dict:
        return {"topics": {**self.topics, "command_in": self.command_topic}, "command_type": self.command_type,
                "command_field": self.field, "states_published": self.states_published,
                "commands_received": self.commands, "commands_refused": {k: v for k, v in self.refused.items() if v},
                "last_refusal": self.last_refusal,
                "command_from": ("the command topic (--cmd ros): " + f"{self.twist_in.received} Twist taken, "
                                 f"{self.twist_in.refused} non-finite refused") if self.twist_in else "--cmd schedule",
                "policy_active_changes": [{"t_s": None if t0_ns is None else (t - t0_ns) / 1e9, "value": v}
                                          for t, v in self.policy_changes]}
