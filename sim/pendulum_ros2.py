"""`control-node sim pendulum --ros2`: the pendulum as a ROS 2 robot, as ros2_control would present it.

It publishes ``sensor_msgs/msg/JointState`` on ``/joint_states`` (one joint, ``theta``: position, velocity,
effort = the torque applied) at the observation rate and takes effort commands as
``std_msgs/msg/Float64MultiArray`` on ``/pendulum_controller/commands`` (a JointGroupEffortController's
topic), each held until the next arrives. The physics is the ZeroMQ simulator's (``pendulum.rk4``,
same schedule, same score), so a run through ROS 2 scores on the same scale as a direct one.

ROS 2 commands carry no frame number: a state's round trip is the time to the first command that arrived
after it (before the next state); a state with none is not counted as answered.
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np

from control_node.errors import UserError
from control_node.sim import pendulum as P
from control_node.sim.engine import sleep_until

JOINT = "theta"
STATE_TOPIC = "/joint_states"
COMMAND_TOPIC = "/pendulum_controller/commands"
QUIET_S = 0.5           # lockstep: the handshake is over when no command came for this long


class PendulumRos2:
    def __init__(self, rate_hz=1000.0, physics_hz=1000.0, delay_us=0.0, drop=0.0, noise=0.0, push_every_s=0.0,
                 push=0.0, seed=0, handshake_timeout=10.0, joint=JOINT, state_topic=STATE_TOPIC,
                 command_topic=COMMAND_TOPIC, lockstep=False):
        """``lockstep``: simulated time waits for a command after each published state (as a simulator stepping
        with the controller does), so the score does not depend on how fast the host runs the three processes.
        A state is never published twice (a command carries no state number: the answers to two copies could
        not be told apart); one unanswered for ``handshake_timeout`` s ends the run with an error. With one
        state in flight no DDS queue overflows, so a best-effort subscriber should lose none on one host
        (none was lost in the tests' runs)."""
        try:
            import rclpy
            from rclpy.qos import qos_profile_sensor_data, QoSProfile, ReliabilityPolicy
            from sensor_msgs.msg import JointState
            from std_msgs.msg import Float64MultiArray
        except ImportError as e:
            from control_node.bridge.recipe import INSTALL
            raise UserError(f"sim pendulum --ros2 needs rclpy ({e}). Install: {INSTALL}") from None
        if physics_hz % rate_hz and abs(physics_hz / rate_hz - round(physics_hz / rate_hz)) > 1e-9:
            raise UserError(f"--rate {rate_hz:g} must divide the physics rate {physics_hz:g} Hz")
        self.rclpy, self.JointState = rclpy, JointState
        rclpy.init()
        self.node = rclpy.create_node("pendulum_sim")
        self.pub = self.node.create_publisher(JointState, state_topic, qos_profile_sensor_data)
        self.cmd_lock = threading.Lock()
        self.cmds = []                                   # (arrival ns, torque) since the last physics step
        self.cmd_arrived = threading.Event()
        self.lockstep = bool(lockstep)
        self.published = 0                               # every state, the handshake's too
        self.n_cmd = self.bad_cmd = 0
        self.cmd_sub = self.node.create_subscription(Float64MultiArray, command_topic, self._on_command,
                                      QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        self.joint, self.state_topic, self.command_topic = joint, state_topic, command_topic
        self.rate_hz, self.physics_hz = float(rate_hz), float(physics_hz)
        self.delay_ns = int(delay_us * 1000)
        self.drop, self.noise = float(drop), float(noise)
        self.push_every_s, self.push = float(push_every_s), float(push)
        self.rng = np.random.default_rng(seed)
        self.handshake_timeout = handshake_timeout
        from rclpy.executors import SingleThreadedExecutor

        from control_node.sim.ros2_spin import Ros2Spin
        self.spin = Ros2Spin(rclpy, self.node, SingleThreadedExecutor())

    def _on_command(self, msg):
        now = time.monotonic_ns()
        data = msg.data
        if len(data) != 1 or not math.isfinite(data[0]):
            self.bad_cmd += 1                   # a command for another joint count, or garbage: not applied
            return
        with self.cmd_lock:
            self.cmds.append((now, float(data[0])))
            self.n_cmd += 1
        self.cmd_arrived.set()

    def close(self):
        self.spin.close()

    def _publish(self, msg):
        self.published += 1
        self.pub.publish(msg)

    def _state(self, theta, omega, u):
        m = self.JointState()
        m.header.stamp = self.node.get_clock().now().to_msg()
        m.name = [self.joint]
        m.position, m.velocity, m.effort = [theta], [omega], [u]
        return m

    def _take_commands(self):
        with self.cmd_lock:
            out, self.cmds = self.cmds, []
        return out

    def _handshake(self, theta, stopper):
        deadline = time.monotonic() + self.handshake_timeout
        while time.monotonic() < deadline:
            if stopper is not None and stopper.stop:
                raise KeyboardInterrupt
            self._publish(self._state(theta, 0.0, 0.0))
            time.sleep(0.01)
            if self._take_commands():
                return
        raise UserError(f"no command on {self.command_topic} within {self.handshake_timeout:g} s after publishing "
                        f"{self.state_topic}: {self._graph_evidence()}")

    def _graph_evidence(self):
        """What DDS discovery had matched when no command came: tells a bridge that is not there from one this
        process has not matched yet (discovery under load can take seconds, one direction before the other)."""
        cmd = self.command_topic
        matched, known = self.cmd_sub.get_publisher_count(), self.node.count_publishers(cmd)
        readers = self.pub.get_subscription_count()
        seen = (f"publishers of {cmd} matched {matched}, known to the graph {known}; "
                f"subscribers matched to {self.state_topic} {readers}")
        if known == 0 and readers == 0:
            return f"{seen}. Is the bridge running (control-node bridge ros2) with the node, on this ROS_DOMAIN_ID?"
        if matched == 0:
            return (f"{seen}. Discovery has not matched a publisher to this subscription yet (a loaded host can "
                    "take seconds): --timeout sets the wait")
        return f"{seen}. A matched publisher sent nothing: is the node answering the bridge?"

    def _await_command(self, t_sent, f, stopper):
        """Lockstep: the commands taken until one arrived at or after ``t_sent`` (state ``f`` went out then);
        a UserError after ``handshake_timeout`` s without one."""
        deadline = time.monotonic() + self.handshake_timeout
        cmds = []
        while stopper is None or not stopper.stop:
            self.cmd_arrived.clear()
            cmds += self._take_commands()
            if any(t_arr >= t_sent for t_arr, _ in cmds):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise UserError(f"lockstep: no command on {self.command_topic} within {self.handshake_timeout:g} s "
                                f"after state {f} on {self.state_topic}; did the bridge or the node stop? "
                                "(--timeout sets the wait)")
            self.cmd_arrived.wait(min(0.1, left))
        return cmds

    def run(self, duration_s=10.0, theta0=math.pi, omega0=0.0, stopper=None):
        dt = 1.0 / self.physics_hz
        every = int(round(self.physics_hz / self.rate_hz))
        n = int(round(duration_s * self.physics_hz))
        theta, omega = float(P.wrap(theta0)), float(omega0)
        self._handshake(theta, stopper)
        time.sleep(0.05)
        self._take_commands()
        if self.lockstep:
            # the handshake's leftovers: in lockstep one taken as state 0's answer would shift every answer by
            # one state, so they are drained until QUIET_S passes without one
            quiet_until = time.monotonic() + QUIET_S
            while time.monotonic() < quiet_until:
                time.sleep(0.01)
                if self._take_commands():
                    quiet_until = time.monotonic() + QUIET_S
        n_frames = (n + every - 1) // every
        t_send = np.full(n_frames, -1, dtype=np.int64)
        rtt = np.full(n_frames, -1, dtype=np.int64)     # first command after each state, to that state
        t_first = np.full(n_frames, -1, dtype=np.int64)
        tr_t, tr_theta, tr_omega, tr_u = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
        pending = []
        u_cmd = 0.0
        dropped = actions = 0
        last_f = -1
        push_steps = int(round(self.push_every_s * self.physics_hz)) if self.push_every_s > 0 else 0
        lockstep = self.lockstep
        t0 = time.monotonic_ns() + 2_000_000

        def take(cmds):
            """Count commands, time the last state's first one; real time: each applies ``delay_us`` after it
            arrived. (Lockstep applies only a state's answer, below.)"""
            nonlocal actions
            for t_arr, u in cmds:
                actions += 1
                if last_f >= 0 and rtt[last_f] < 0 and t_arr >= t_send[last_f]:
                    rtt[last_f], t_first[last_f] = t_arr - t_send[last_f], t_arr
                if not lockstep:
                    pending.append((t_arr + self.delay_ns, u))

        for k in range(n):
            due = t0 + int(k * dt * 1e9)
            if not lockstep:
                sleep_until(due)
            take(self._take_commands())
            now = due if lockstep else time.monotonic_ns()     # lockstep: the step's simulated time
            while pending and pending[0][0] <= now:
                _, u_cmd = pending.pop(0)
            if k % every == 0:
                f = k // every
                th, om = theta, omega
                if self.noise:
                    th, om = (v + float(e) for v, e in zip((th, om), self.rng.normal(0, self.noise, 2)))
                if self.drop and self.rng.random() < self.drop:
                    dropped += 1
                else:
                    t_send[f] = time.monotonic_ns()
                    last_f = f
                    self._publish(self._state(th, om, max(-P.MAX_TORQUE, min(P.MAX_TORQUE, u_cmd))))
                    if lockstep:
                        cmds = self._await_command(t_send[f], f, stopper)
                        take(cmds)
                        # the answer: the first command that arrived after the state went out, applied at the
                        # state's simulated time (+ delay_us); any others (a watchdog's, late ones) are counted only
                        answer = next((u for t_arr, u in cmds if t_arr >= t_send[f]), None)
                        if answer is not None:
                            pending.append((now + self.delay_ns, answer))
                        while pending and pending[0][0] <= now:
                            _, u_cmd = pending.pop(0)
            u_applied = max(-P.MAX_TORQUE, min(P.MAX_TORQUE, u_cmd))
            if push_steps and k and k % push_steps == 0:
                omega = max(-P.MAX_SPEED, min(P.MAX_SPEED, omega + self.push))
            tr_t[k], tr_theta[k], tr_omega[k], tr_u[k] = k * dt, theta, omega, u_applied
            theta, omega = P.rk4(theta, omega, u_applied, dt)
            if stopper is not None and stopper.stop:
                n = k + 1
                break
        sent = t_send >= 0
        return {"t_s": tr_t[:n], "theta": tr_theta[:n], "omega": tr_omega[:n], "u": tr_u[:n], "safe": np.zeros(n, dtype=bool),
                "seq": np.arange(n_frames, dtype=np.int64), "t_send_ns": t_send,
                "t_action_ns": t_first, "rtt_ns": rtt,
                "u_answer": np.full(n_frames, np.nan), "safe_answer": np.zeros(n_frames, dtype=bool),
                "frames_sent": int(sent.sum()), "frames_answered": int((rtt >= 0).sum()), "dropped": dropped,
                "frames_held": 0, "frames_lost": 0, "actions_received": actions, "safe_actions": 0,
                "seq_base": 0, "t0_ns": t0, "bad_commands": self.bad_cmd,
                "states_published": self.published}
