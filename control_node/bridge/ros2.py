"""``control-node bridge ros2``: a ROS 2 node between the graph and the control node's own protocol.

ROS 2 -> node: one subscription per topic of the ``[ros2]`` recipe; a message on the trigger topic makes
a frame (``recipe.FrameAssembler``) sent to the node's sensor endpoint (ZeroMQ PUB, protocol v1 frames).
Node -> ROS 2: a thread reads the node's actions (ZeroMQ SUB) and publishes each new one once: a new
``seq``, or a change between safe and policy action (the node repeats its last action every cycle in
timer mode; a ros2_control command controller holds its last command, so repeats carry nothing).

The node never imports this module (nor rclpy): the hot path is untouched. rclpy comes from wherever it is
installed (``control-node[ros2]`` wheels, or a sourced ROS 2 install with any ``RMW_IMPLEMENTATION``).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from control_node.bridge.recipe import INSTALL, FrameAssembler, Recipe
from control_node.errors import UserError

MSG_MODULES = {"sensor_msgs", "std_msgs", "geometry_msgs", "trajectory_msgs", "builtin_interfaces"}
LATENCY_RING = 1 << 20          # callback latencies kept for the summary's percentiles (8 MiB)


def import_rclpy():
    """rclpy, or a :class:`UserError` (exit 2) with the install command."""
    try:
        import rclpy
        import rclpy.qos  # noqa: F401
    except ImportError as e:
        raise UserError(f"bridge ros2 needs rclpy, which cannot be imported ({e}). Install: {INSTALL}") from None
    return rclpy


def message_class(type_name: str):
    """``sensor_msgs/msg/JointState`` -> the rclpy message class."""
    import importlib
    pkg, _, name = type_name.split("/")
    try:
        return getattr(importlib.import_module(f"{pkg}.msg"), name)
    except (ImportError, AttributeError) as e:
        raise UserError(f"the ROS 2 message type {type_name} cannot be imported ({e}). Install: {INSTALL}") from None


def qos_profile(name: str):
    from rclpy.qos import QoSProfile, qos_profile_sensor_data
    from rclpy.qos import ReliabilityPolicy, HistoryPolicy, DurabilityPolicy
    if name == "sensor_data":
        return qos_profile_sensor_data
    return QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST,
                      durability=DurabilityPolicy.VOLATILE)


def make_executor():
    """rclpy's EventsExecutor where it exists (a C++ event queue: at 1 kHz the bridge used 20 % of a core with it,
    32 % with the wait-set executor, `bench bridge`), else the SingleThreadedExecutor."""
    try:
        from rclpy.experimental import EventsExecutor
        return EventsExecutor()
    except ImportError:
        from rclpy.executors import SingleThreadedExecutor
        return SingleThreadedExecutor()


class ActionWriter:
    """Builds the ROS 2 message for an action vector ``u`` (one definition for live and bag output)."""

    def __init__(self, spec, classes: dict):
        self.spec = spec
        self.cls = classes[spec.type]
        self.point_cls = classes.get("trajectory_msgs/msg/JointTrajectoryPoint")
        self.duration_cls = classes.get("builtin_interfaces/msg/Duration")
        self.stamped = spec.type != "std_msgs/msg/Float64MultiArray"     # a header to stamp

    def build(self, u, stamp=None):
        s = self.spec
        m = self.cls()
        vals = [float(v) for v in u]
        if s.type == "std_msgs/msg/Float64MultiArray":
            m.data = vals
        elif s.type == "sensor_msgs/msg/JointState":
            if stamp is not None:
                m.header.stamp = stamp
            m.name = list(s.names)
            setattr(m, s.field, vals)
        else:
            if stamp is not None:
                m.header.stamp = stamp
            m.joint_names = list(s.names)
            p = self.point_cls()
            setattr(p, s.field, vals)
            ns = int(round(s.time_from_start_s * 1e9))
            p.time_from_start = self.duration_cls(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)
            m.points = [p]
        return m


class Bridge:
    """The bridge process: rclpy node + ZeroMQ PUB (frames) + SUB (actions)."""

    def __init__(self, recipe: Recipe, endpoints: dict, curve=None, seq_base=None):
        import zmq

        from control_node.security import configure_client
        self.rclpy = import_rclpy()
        self.recipe = recipe
        self.asm = FrameAssembler(recipe)
        self.zmq = zmq
        ctx = zmq.Context.instance()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 1000)
        configure_client(self.pub, curve)
        self.pub.connect(endpoints["sensor"])
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        configure_client(self.sub, curve)
        self.sub.connect(endpoints["action"])
        self.endpoints = endpoints
        # counters for `control-node top`, on a PUB beside the node's sockets (ipc only: a tcp one would need
        # its own CURVE keys)
        self.diag, self.diag_endpoint = None, None
        if endpoints["sensor"].startswith("ipc://"):
            from control_node.endpoints import derive_bridge_diagnostics
            self.diag_endpoint = derive_bridge_diagnostics(endpoints["sensor"])
            self.diag = ctx.socket(zmq.PUB)
            self.diag.setsockopt(zmq.LINGER, 0)
            try:
                self.diag.bind(self.diag_endpoint)
            except zmq.ZMQError as e:
                print(f"bridge: counters not published on {self.diag_endpoint} ({e})", flush=True)
                self.diag.close()
                self.diag = None
        # frames' seq continue across a bridge restart: the node refuses a seq that goes backwards, and
        # CLOCK_MONOTONIC in us at start grows faster than any frame rate below 1 MHz
        self.seq = int(seq_base if seq_base is not None else time.monotonic_ns() // 1000)
        self.seq_first = self.seq
        self.lat = np.zeros(LATENCY_RING, dtype=np.int64)
        self.n_lat = 0
        self.actions_received = self.actions_published = self.safe_published = 0
        self.actions_undecodable = self.node_restarts = 0
        self.argmax_actions = 0
        self.last_key = None
        self.last_cycle = -1
        self.first_action_ns = self.first_frame_ns = None
        self.stop = threading.Event()
        self.node = None
        self.action_pub = None
        import queue
        self.curve = curve
        self.mode_q = queue.Queue(maxsize=100)
        self.mode_requests = {}             # result -> count ("ok", or the node's refusal code)
        self.mode_thread = None
        self.policy_pub = None              # [ros2.legged] policy_active: the node's policy/safe state
        self.policy_state = None
        self.policy_published = 0

    # -- ROS 2 -> node --------------------------------------------------------------------------------
    def _mode_callback(self, msg):
        """A mode asked on the mode topic: queued for the control endpoint (its reply can take a cycle or two,
        never the executor's time)."""
        self.mode_q.put(str(msg.data).strip())

    def _modes(self):
        """Each asked mode as a control request to the node (`control-node mode`'s), counted by its result."""
        import queue

        from control_node.errors import UserError
        from control_node.lifecycle import PolicyClient
        with PolicyClient(self.endpoints["control"], self.curve, timeout=5.0) as client:
            while not self.stop.is_set():
                try:
                    mode = self.mode_q.get(timeout=0.1)
                except queue.Empty:
                    continue
                try:
                    rep = client.request({"op": "mode", "mode": mode})
                    key = "ok" if rep["ok"] else str(rep["error"])
                    msg = rep["message"]
                except UserError as e:
                    key, msg = "no_reply", str(e)
                self.mode_requests[key] = self.mode_requests.get(key, 0) + 1
                print(f"bridge: mode {mode!r} from {self.recipe.mode_topic}: {key}: {msg}", flush=True)

    def _callback(self, topic):
        import msgpack
        asm, pub, packb, mono = self.asm, self.pub, msgpack.packb, time.monotonic_ns

        def cb(msg):
            now = mono()
            x = asm.on_message(topic, msg, now)
            if x is None:
                return
            self.seq += 1
            try:
                pub.send(packb({"seq": self.seq, "t_ns": now, "x": x.tolist()}), self.zmq.NOBLOCK)
            except self.zmq.Again:
                pass                       # no node connected yet: PUB drops, as for every client
            if self.first_frame_ns is None:
                self.first_frame_ns = now
            self.lat[self.n_lat & (LATENCY_RING - 1)] = mono() - now
            self.n_lat += 1
        return cb

    # -- node -> ROS 2 --------------------------------------------------------------------------------
    def _actions(self):
        import msgpack
        zmq = self.zmq
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        # the node's end of the connection closing (its process exiting) marks a restart for sure: the cycle
        # count alone missed one when PUB/SUB's slow joiner lost the new node's first actions (a fresh-clone
        # run, sensor clock: the old node's last cycle 1, the first one seen from the new node 1)
        mon = self.sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller.register(mon, zmq.POLLIN)
        try:
            self._action_loop(poller, mon, msgpack)
        finally:
            self.sub.disable_monitor()
            mon.close(linger=0)

    def _action_loop(self, poller, mon, msgpack):
        zmq = self.zmq
        node_gone = False
        while not self.stop.is_set():
            if not poller.poll(50):
                continue
            gone, restarts_before = False, self.node_restarts
            while True:                 # first: see below
                try:
                    mon.recv_multipart(zmq.NOBLOCK)
                    gone = True
                except zmq.Again:
                    break
            while True:
                try:
                    raw = self.sub.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.actions_received += 1
                try:
                    a = msgpack.unpackb(raw)
                    seq, safe, cycle = int(a["seq"]), bool(a["safe"]), int(a["cycle"])
                    u = a.get("u")
                except Exception:       # noqa: BLE001 - counted; the node's protocol is fixed, this is a guard
                    self.actions_undecodable += 1
                    continue
                if u is None:
                    self.argmax_actions += 1
                    continue
                if node_gone or cycle <= self.last_cycle:   # a node publishes each cycle number once
                    self.node_restarts += self.last_cycle >= 0
                    self.last_key = None
                    node_gone = False
                self.last_cycle = cycle
                key = (seq, safe)
                if key == self.last_key:
                    continue
                self.last_key = key
                if self.policy_pub is not None and self.policy_state is not (not safe):
                    # before the command: a robot reading both knows the mode of each command it gets
                    self.policy_state = not safe
                    self.policy_pub.publish(self.bool_cls(data=self.policy_state))
                    self.policy_published += 1
                if self.action_pub is not None:
                    stamp = self.node.get_clock().now().to_msg() if self.writer.stamped else None
                    self.action_pub.publish(self.writer.build(u, stamp))
                    self.actions_published += 1
                    self.safe_published += safe
                    if self.first_action_ns is None:
                        self.first_action_ns = time.monotonic_ns()
            # the old node's last actions were queued before its disconnect, so the drain above took them; an
            # action from here on is the new node's, unless the drain already saw the restart by its cycle
            # (possible only after this thread stalled: a node takes hundreds of ms to start and connect)
            if gone and self.node_restarts == restarts_before:
                node_gone = True

    def run(self, duration_s=None, status_every_s=0.0, ready=print):
        rclpy = self.rclpy
        from rclpy.executors import ExternalShutdownException
        os.environ.setdefault("ROS_DOMAIN_ID", str(self.recipe.domain_id))
        ctx_args = {"domain_id": self.recipe.domain_id}
        rclpy.init(**ctx_args)
        th = None
        try:
            self.node = rclpy.create_node(self.recipe.node_name)
            for topic, (typ, qos) in self.recipe.topics.items():
                self.node.create_subscription(message_class(typ), topic, self._callback(topic), qos_profile(qos))
            if self.recipe.action is not None:
                a = self.recipe.action
                classes = {a.type: message_class(a.type)}
                if a.type == "trajectory_msgs/msg/JointTrajectory":
                    classes["trajectory_msgs/msg/JointTrajectoryPoint"] = message_class(
                        "trajectory_msgs/msg/JointTrajectoryPoint")
                    classes["builtin_interfaces/msg/Duration"] = message_class("builtin_interfaces/msg/Duration")
                self.writer = ActionWriter(a, classes)
                self.action_pub = self.node.create_publisher(classes[a.type], a.topic, qos_profile(a.qos))
            if self.recipe.mode_topic:      # best effort: any publisher's QoS matches it
                from rclpy.qos import QoSProfile, ReliabilityPolicy
                self.node.create_subscription(message_class("std_msgs/msg/String"), self.recipe.mode_topic,
                                              self._mode_callback, QoSProfile(
                                                  depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))
                self.mode_thread = threading.Thread(target=self._modes, name="modes", daemon=True)
                self.mode_thread.start()
            if self.recipe.policy_topic:    # latched: a subscriber joining later gets the current state
                from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
                self.bool_cls = message_class("std_msgs/msg/Bool")
                self.policy_pub = self.node.create_publisher(self.bool_cls, self.recipe.policy_topic, QoSProfile(
                    depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
            th = threading.Thread(target=self._actions, name="actions", daemon=True)
            th.start()
            ex = make_executor()
            ex.add_node(self.node)
            self.t_start_ns = time.monotonic_ns()
            self.cpu_start = time.process_time()
            ready(f"ready bridge ros2 domain={self.recipe.domain_id} node={self.recipe.node_name} "
                  f"sensor={self.endpoints['sensor']} action={self.endpoints['action']}: {self.recipe.describe()}")
            t_end = None if duration_s is None else time.monotonic() + duration_s
            next_status = time.monotonic() + status_every_s if status_every_s > 0 else None
            next_diag = time.monotonic()
            while not self.stop.is_set() and rclpy.ok():
                ex.spin_once(timeout_sec=0.05)
                now = time.monotonic()
                if self.diag is not None and now >= next_diag:
                    next_diag = now + 0.5
                    self._publish_counters()
                if t_end is not None and now >= t_end:
                    break
                if next_status is not None and now >= next_status:
                    next_status = now + status_every_s
                    ready(self.status_line())
        except (KeyboardInterrupt, ExternalShutdownException):
            pass        # SIGINT: rclpy's own handler shut the context down, during or between spin_once calls
        finally:
            self.stop.set()
            if th is not None:
                th.join(2.0)            # no publish after the node is gone
            if self.mode_thread is not None:
                self.mode_thread.join(6.0)
            self.t_end_ns = time.monotonic_ns()
            self.cpu_end = time.process_time()
            try:
                if self.node is not None:
                    self.node.destroy_node()
                if rclpy.ok():
                    rclpy.shutdown()
            except Exception:       # noqa: BLE001 - shutting down after a signal: nothing left to save
                pass
            self.pub.close()
            self.sub.close()
            if self.diag is not None:
                self.diag.close()
                from control_node.endpoints import ipc_path
                p = ipc_path(self.diag_endpoint)
                if p and os.path.exists(p):
                    os.unlink(p)

    def _publish_counters(self):
        import msgpack
        n = min(self.n_lat, LATENCY_RING)
        recent = self.lat[max(0, n - 2000):n] if self.n_lat <= LATENCY_RING else self.lat
        msg = {"role": "bridge", "kind": "ros2", **self.asm.counters(), "actions_published": self.actions_published,
               "safe_actions_published": self.safe_published, "node_restarts": self.node_restarts,
               "callback_p99_us": float(np.percentile(recent, 99)) / 1e3 if len(recent) else None}
        try:
            self.diag.send(msgpack.packb(msg), self.zmq.NOBLOCK)
        except self.zmq.Again:
            pass

    def status_line(self) -> str:
        c = self.asm.counters()
        wh = ", ".join(f"{k} {v}" for k, v in c["frames_withheld"].items()) or "none"
        return (f"bridge: frames sent {c['frames_sent']}, withheld {wh}; actions published {self.actions_published} "
                f"(safe {self.safe_published})")

    def summary(self) -> dict:
        from control_node import rundir
        n = min(self.n_lat, LATENCY_RING)
        lat = self.lat[:n]
        wall = max(1, getattr(self, "t_end_ns", time.monotonic_ns()) - getattr(self, "t_start_ns", 0))
        cpu = getattr(self, "cpu_end", time.process_time()) - getattr(self, "cpu_start", 0.0)
        pct = {}
        if n:
            q = np.percentile(lat, [50, 99, 99.9])
            pct = {"p50": int(q[0]), "p99": int(q[1]), "p999": int(q[2]), "max": int(lat.max()), "count": int(n)}
        return {"role": "bridge", "kind": "ros2", "format": rundir.SUMMARY_FORMAT, **self.asm.counters(),
                "seq_first": self.seq_first + 1, "actions_received": self.actions_received,
                "actions_published": self.actions_published, "safe_actions_published": self.safe_published,
                "actions_undecodable": self.actions_undecodable, "argmax_actions_ignored": self.argmax_actions,
                "node_restarts": self.node_restarts, "callback_latency_ns": pct,
                "mode_requests": dict(self.mode_requests),
                "policy_active": {"topic": self.recipe.policy_topic, "published": self.policy_published,
                                  "last": self.policy_state},
                "cpu_share": cpu / (wall / 1e9), "duration_s": wall / 1e9,
                "recipe": {"trigger": self.recipe.trigger, "max_age_ms": self.recipe.max_age_ns / 1e6,
                           "width": self.recipe.width, "domain_id": self.recipe.domain_id,
                           "terms": [{"topic": t.topic, "type": t.type, "field": t.field, "joints": t.joints}
                                     for t in self.recipe.terms],
                           "action": None if self.recipe.action is None else
                           {"topic": self.recipe.action.topic, "type": self.recipe.action.type}},
                "last_refusal": self.asm.last_refusal, "cpus": sorted(os.sched_getaffinity(0))}
