"""The live view's channels, defined once: topics, JSON schemas, and the conversion of the node's and the
simulator's ZeroMQ messages into channel messages. The live server (``server.py``) and ``control-node
export --to json-mcap`` both use it, so a live view and an exported recording carry the same topics and
schemas and one Foxglove layout opens either.

Times: every message is stamped with the sender's CLOCK_MONOTONIC (``t_ns`` of the frame, the tick of the
cycle, the snapshot's time) plus one offset to wall time, fixed once per run (:class:`Converter` ``offset_ns``).

Rates: observation, action and ``/sim/pendulum`` keep one message in ``every`` (frames whose seq, steps
whose index, is a multiple of it); ``/control_node/cycle`` has one message per ``every`` cycles with the
min, max and last of each figure over those cycles, so a spike is never averaged away; events are never
thinned.

A legged node (docs/legged.md) adds, from its snapshots' ``legged`` names and frame layout: ``/control_node/mode``
each snapshot; ``/control_node/base`` and ``/control_node/tf`` (a foxglove.FrameTransform world -> base) from
each kept frame; ``/control_node/joint_states`` per kept frame once the node's command answering that frame
(the action carrying its seq) has arrived too, so a joint's position, velocity and command are of one cycle.
"""
from __future__ import annotations

import math
import re
import struct
from collections import OrderedDict

from control_node import rundir

OBSERVATION = "/control_node/observation"
ACTION = "/control_node/action"
CYCLE = "/control_node/cycle"
EVENTS = "/control_node/events"
SIM_PENDULUM = "/sim/pendulum"
TOPICS = (OBSERVATION, ACTION, CYCLE, EVENTS, SIM_PENDULUM)
MODE = "/control_node/mode"            # a legged node's mode, each diagnostics snapshot (docs/legged.md)
JOINT_STATES = "/control_node/joint_states"    # per joint by name: position, velocity, the node's command
BASE = "/control_node/base"            # the IMU: orientation (quaternion, roll/pitch/yaw), gyro, acc, command
TF = "/control_node/tf"                # foxglove.FrameTransform world -> base: the 3D panel tilts the base
LEGGED_TOPICS = (MODE, JOINT_STATES, BASE, TF)     # advertised once a legged node's snapshot names its layout
FRAME_WORLD, FRAME_BASE = "world", "base"
#: per actuator, the command's fields by output (legged.OUTPUT_ROWS; impedance: rows q*, qd*, kp, kd, tau_ff)
COMMAND_FIELDS = {"torque": ("torque",), "position": ("target",),
                  "impedance": ("target", "target_velocity", "kp", "kd", "tau_ff")}
COMMAND_UNITS = {"torque": "N m, after the clip to tau_max", "target": "rad, the position target q*",
                 "target_velocity": "rad/s", "kp": "N m/rad", "kd": "N m s/rad", "tau_ff": "N m, feed-forward"}
# a kept frame waits at most this many newer frames (seq) for the command carrying its seq, and a command as long
# for its frame (no sensor tap, a rejected frame); then it is dropped, counted in Converter.unpaired
PAIR_WINDOW = 1000
DEFAULT_EVERY = 10          # at 1 kHz: 100 messages a second on each thinned channel

_INT, _NUM, _STR, _BOOL = {"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "boolean"}
_NULLABLE_INT = {"type": ["integer", "null"]}
_SPREAD = {"type": ["object", "null"], "properties": {"min": _INT, "max": _INT, "last": _INT},
           "description": "over the window's cycles (ns); null when no cycle of the window measured it"}
CYCLE_FIGURES = ("wake_latency_ns", "cycle_time_ns", "input_age_ns")


def _named(names, what):
    return {"type": "object", "description": what,
            "properties": {path_name(n): {"type": ["number", "null"]} for n in names}}


def _num(v):
    """A float for JSON: NaN and infinities (a bad frame) as null."""
    v = float(v)
    return v if math.isfinite(v) else None


_XYZ = {"type": ["object", "null"], "properties": {k: {"type": ["number", "null"]} for k in "xyz"}}


def _frame_transform_schema():
    """foxglove.FrameTransform as JSON (the well-known schema's fields: the 3D panel reads it by its name)."""
    vec = {"title": "foxglove.Vector3", "type": "object", "properties": {k: _NUM for k in "xyz"}}
    return {"title": "foxglove.FrameTransform", "type": "object",
            "description": "the base's orientation from the IMU quaternion (no position: the node has none)",
            "properties": {
                "timestamp": {"type": "object", "title": "time", "properties": {
                    "sec": {"type": "integer", "minimum": 0},
                    "nsec": {"type": "integer", "minimum": 0, "maximum": 999999999}}},
                "parent_frame_id": _STR, "child_frame_id": _STR, "translation": vec,
                "rotation": {"title": "foxglove.Quaternion", "type": "object",
                             "properties": {k: _NUM for k in "xyzw"}}}}


def _joint_states_schema(legged):
    lay = legged_names(legged) if legged else None
    fields = ("position", "velocity") + COMMAND_FIELDS.get((legged or {}).get("output"), ())
    joint = {"type": "object", "properties": {f: {"type": ["number", "null"], "description": COMMAND_UNITS.get(
        f, "rad" if f == "position" else "rad/s")} for f in fields}}
    return {"title": "control_node.JointStates", "type": "object", "properties": {
        "seq": {"type": "integer", "description": "the frame the positions and velocities are from"},
        "t_ns": {"type": "integer", "description": "the frame's sender CLOCK_MONOTONIC ns"},
        "cycle": {"type": ["integer", "null"], "description": "the node's cycle whose command this is"},
        "safe": {"type": ["boolean", "null"], "description": "the command was the watchdog's (damping)"},
        "output": {"type": "string", "enum": list(COMMAND_FIELDS)},
        "joints": {"type": "object", "description": "by joint name (joints.robot); the command of an actuator "
                                                    "(joints.actuators), null for a joint without one",
                   "properties": {n: joint for n in (lay["robot"] if lay else ())}}}}


def schema(topic: str, feature_names=(), action_names=(), legged=None) -> dict:
    """The JSON schema of a channel (observation and action name their values; a legged node's joint states
    name its joints from ``legged``, its snapshots' layout)."""
    if topic == JOINT_STATES:
        return _joint_states_schema(legged)
    if topic == BASE:
        cmd = legged_names(legged)["command"] if legged else ()
        return {"title": "control_node.Base", "type": "object", "properties": {
            "seq": _INT, "t_ns": {"type": "integer", "description": "the frame's sender CLOCK_MONOTONIC ns"},
            "quat_order": {"type": ["string", "null"], "description": "the frame's quaternion order "
                                                                      "(observation.quat_order); null: not stated"},
            "quat_raw": {"type": "object", "description": "the frame's four quaternion values as sent (q0..q3)",
                         "properties": {f"q{i}": {"type": ["number", "null"]} for i in range(4)}},
            "orientation": {"type": ["object", "null"], "description": "body -> world, normalised, by component",
                            "properties": {k: _NUM for k in "wxyz"}},
            "rpy_deg": {"type": ["object", "null"], "description": "roll, pitch, yaw in degrees (Z-Y-X: yaw, "
                                                                   "then pitch, then roll)",
                        "properties": {k: _NUM for k in ("roll", "pitch", "yaw")}},
            "projected_gravity": {**_XYZ, "description": "R^T [0, 0, -1]: gravity's direction in the body frame"},
            "gyro": {**_XYZ, "description": "body frame, rad/s"},
            "acc": {**_XYZ, "description": "body frame, the IMU's acceleration"},
            "command": _named(cmd, "the frame's velocity command")}}
    if topic == TF:
        return _frame_transform_schema()
    if topic == OBSERVATION:
        return {"title": "control_node.Observation", "type": "object", "properties": {
            "seq": _INT, "t_ns": {"type": "integer", "description": "sender CLOCK_MONOTONIC ns"},
            "x": _named(feature_names, "the frame's values by feature name")}}
    if topic == ACTION:
        return {"title": "control_node.Action", "type": "object", "properties": {
            "seq": {"type": "integer", "description": "the frame this action answers"},
            "cycle": _INT, "t_ns": _INT, "safe": _BOOL,
            "u": _named(action_names, "continuous policies: the action by name"),
            "action": {"type": "integer", "description": "argmax policies: the class index"}}}
    if topic == CYCLE:
        return {"title": "control_node.Cycle", "type": "object", "properties": {
            "cycle_first": _INT, "cycle_last": _INT, "cycles": _INT,
            **{f: _SPREAD for f in CYCLE_FIGURES},
            "misses": _INT, "stale": _INT, "safe": _INT, "phase_shifts": _INT,
            "phase_offset_ns": {"type": "integer", "description": "the phase lock's net shift of the schedule"}}}
    if topic == EVENTS:
        return {"title": "control_node.Event", "type": "object", "properties": {
            "kind": {"type": "string", "enum": ["miss", "safe", "rejected", "policy", "mode"]},
            "cycle": _NULLABLE_INT, "count": _INT, "text": _STR,
            "wake_latency_ns": _INT, "cycle_time_ns": _INT,
            "cause": {"type": ["string", "null"],
                      "description": "miss: why late, when known (the live view does not know it: the report "
                                     "attributes each miss after the run)"},
            "reason": _STR, "stale": _INT, "event": _STR, "policy": _STR}}
    if topic == MODE:
        return {"title": "control_node.Mode", "type": "object", "properties": {
            "mode": {"type": "string", "enum": ["passive", "damping", "stand", "policy"]},
            "stand_done": _BOOL, "output": _STR, "stale_trips": _INT, "non_finite_trips": _INT,
            "tau_clipped": {"type": "integer", "description": "cycles with a torque clipped to tau_max"}}}
    if topic == SIM_PENDULUM:
        return {"title": "control_node.SimPendulum", "type": "object", "properties": {
            "step": _INT, "t_ns": _INT, "angle": {"type": "number", "description": "rad, 0 upright"},
            "velocity": {"type": "number", "description": "rad/s"}, "torque": {"type": "number",
                                                                                 "description": "N m, applied"}}}
    raise KeyError(topic)


def path_name(name) -> str:
    """A name as a Foxglove message-path field: runs of other than letters, digits and _ become one _
    ("sepal length (cm)" -> "sepal_length_cm")."""
    return re.sub(r"\W+", "_", str(name)).strip("_") or "_"


def names_for(values, names) -> list[str]:
    """``names`` (as :func:`path_name`) when there is one per value, else x0, x1, ..."""
    names = [path_name(n) for n in (names or ())]
    return names if len(names) == len(values) and len(set(names)) == len(names) else [
        f"x{i}" for i in range(len(values))]


def legged_names(legged: dict) -> dict:
    """From a legged snapshot's layout: ``robot`` and ``actuators`` (joint names as message-path fields), the
    frame's slices by signal (``slices``: name -> (offset, width)), its ``width``, the ``command`` names."""
    joints = legged.get("joints") or {}
    frame = legged.get("frame") or []
    slices = {str(f["signal"]): (int(f["offset"]), int(f["width"])) for f in frame}
    robot = joints.get("robot") or []
    acts = joints.get("actuators") or robot
    n_cmd = slices.get("command", (0, 0))[1]
    return {"robot": names_for(robot, robot), "actuators": names_for(acts, acts), "slices": slices,
            "width": sum(w for _, w in slices.values()),
            # the usual three of a velocity command (docs/legged.md), else numbered
            "command": ["vx", "vy", "yaw_rate"] if n_cmd == 3 else [f"c{i}" for i in range(n_cmd)]}


def command_names(legged: dict) -> list[str]:
    """Names of a legged node's published command, in its order: the actuators' (joints.actuators) for a torque
    or position output, ``<field>_<actuator>`` row by row for impedance (COMMAND_FIELDS). The policy's action
    names would mislabel it: the command is in the actuators' order, not the policy's."""
    acts = legged_names(legged)["actuators"]
    fields = COMMAND_FIELDS.get(legged.get("output"), ())
    return list(acts) if len(fields) == 1 else [f"{f}_{a}" for f in fields for a in acts]


def quat_wxyz(q, order):
    """(w, x, y, z) normalised from four values in ``order`` ("wxyz" or "xyzw"); None when not finite or zero."""
    w, x, y, z = (q[0], q[1], q[2], q[3]) if order == "wxyz" else (q[3], q[0], q[1], q[2])
    n = math.sqrt(w * w + x * x + y * y + z * z)
    if not math.isfinite(n) or n == 0.0:
        return None
    return w / n, x / n, y / n, z / n


def rpy_deg(w, x, y, z):
    """Roll, pitch, yaw (degrees) of a body -> world quaternion, Z-Y-X (yaw about z, then pitch about the new
    y, then roll about the new x: R = Rz(yaw) Ry(pitch) Rx(roll))."""
    roll = math.atan2(2 * (w * x + y * z), 1 - 2 * (x * x + y * y))
    pitch = math.asin(max(-1.0, min(1.0, 2 * (w * y - z * x))))
    yaw = math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    return math.degrees(roll), math.degrees(pitch), math.degrees(yaw)


def gravity_in_body(w, x, y, z):
    """R^T [0, 0, -1] for the body -> world rotation R of (w, x, y, z): the projected_gravity term's value."""
    return 2 * (w * y - x * z), -2 * (y * z + w * x), -(1 - 2 * (x * x + y * y))


class Converter:
    """ZeroMQ messages in (decoded msgpack dicts), ``(topic, message, log_time_ns)`` out.

    ``offset_ns``: wall time minus CLOCK_MONOTONIC, fixed once per run. ``every``: see the module doc."""

    def __init__(self, offset_ns: int, every: int = DEFAULT_EVERY, feature_names=None, action_names=None,
                 legged=None):
        if every < 1:
            raise ValueError("every must be >= 1")
        self.offset_ns, self.every = int(offset_ns), int(every)
        self.feature_names, self.action_names = feature_names, action_names
        self.legged = None                 # a legged node's layout (its snapshots' "legged" names and frame)
        self._lay = None
        self.wait_frames = OrderedDict()   # seq -> (t_ns, x): kept frames waiting for the command carrying their seq
        self.wait_cmds = OrderedDict()     # seq -> action: commands waiting for their kept frame (the tap was slower)
        self.paired = OrderedDict()        # seqs whose joint state went out (a later action of the same seq: skip)
        self.answered = -1                 # the newest frame the node published a command for
        self.superseded = 0                # kept frames the node never acted on (a newer one came first): command null
        self.unpaired = 0                  # kept frames or commands dropped without the other (PAIR_WINDOW)
        self.legged_mode = None            # the mode of the last snapshot (passive with position output: no command)
        if legged:
            self._set_legged(legged)
        self.pending = {}                  # the open cycle window's records
        self.rejected = None               # the last snapshot's counts by reason
        self.transitions_seen = -1         # the last lifecycle transition number reported
        self.phase_offset_ns = 0
        self.mode_seen = None              # a legged node's mode in the last snapshot

    def _set_legged(self, legged):
        lay = legged_names(legged)
        if lay["width"] and lay["robot"] and "joint_pos" in lay["slices"]:
            self.legged, self._lay = dict(legged), lay
            # /control_node/action's u is the command, in the actuators' order: named by them
            self.action_names = command_names(legged) or self.action_names

    def sensor(self, m: dict):
        x = m.get("x")
        seq = m.get("seq")
        if not isinstance(seq, int) or seq % self.every or m.get("warmup"):
            return []                       # thinned first: most frames are not unpacked at all
        if isinstance(x, (bytes, bytearray)) and len(x) % 8 == 0:    # a bin x (docs/protocol.md: sim mujoco's)
            x = struct.unpack(f"<{len(x) // 8}d", x)
        if not isinstance(x, (list, tuple)):
            return []
        names = names_for(x, self.feature_names)
        t = int(m.get("t_ns", 0))
        out = [(OBSERVATION, {"seq": seq, "t_ns": t, "x": dict(zip(names, map(_num, x)))}, t + self.offset_ns)]
        if self._lay is not None and len(x) == self._lay["width"]:   # another width: a frame the node rejects
            out += self._base(seq, t, x)
            if self.legged.get("output") == "position" and self.legged_mode == "passive":
                out.append(self._joint_states(seq, (t, x), None))     # passive: the node sends no command
            else:
                out += self._pair(seq, 0, (t, x))
        return out

    def action(self, m: dict):
        seq = m.get("seq")
        if not isinstance(seq, int) or seq < 0:
            return []
        superseded = self._answered(seq) if self._lay is not None else []
        if seq % self.every:
            return superseded
        out = {"seq": seq, "cycle": int(m.get("cycle", -1)), "t_ns": int(m.get("t_ns", 0)),
               "safe": bool(m.get("safe"))}
        if isinstance(m.get("u"), (list, tuple)):
            out["u"] = dict(zip(names_for(m["u"], self.action_names), map(_num, m["u"])))
        else:
            out["action"] = int(m.get("action", -1))
        items = superseded + [(ACTION, out, out["t_ns"] + self.offset_ns)]
        if (self._lay is not None and isinstance(m.get("u"), (list, tuple))
                and len(m["u"]) == len(COMMAND_FIELDS.get(self.legged.get("output"), ())) * len(self._lay["actuators"])):
            items += self._pair(seq, 1, m)
        return items

    def _pair(self, seq, side, value):
        """A kept frame (side 0) or the node's command carrying its seq (side 1): the joint state once both are
        here (the sensor tap and the action stream are separate sockets: either may come first)."""
        if seq in self.paired:
            return []               # a later cycle's command for the same frame (loop faster than the frames)
        mine, other = (self.wait_frames, self.wait_cmds) if side == 0 else (self.wait_cmds, self.wait_frames)
        if seq in other:
            got = other.pop(seq)
            self.paired[seq] = None
            while len(self.paired) > PAIR_WINDOW:         # bounded: the newest
                self.paired.popitem(last=False)
            return [self._joint_states(seq, *((value, got) if side == 0 else (got, value)))]
        if side == 0 and seq < self.answered:
            self.superseded += 1    # the node already acted on a newer frame: none will answer this one
            return [self._joint_states(seq, value, None)]
        if seq not in mine:
            mine[seq] = value
            # by seq, and by count (a robot that restarted its seq leaves older, higher ones behind)
            while len(mine) > 1 and (next(iter(mine)) < seq - PAIR_WINDOW or len(mine) > PAIR_WINDOW):
                mine.popitem(last=False)
                self.unpaired += 1
        return []

    def _answered(self, seq):
        """The node published a command for frame ``seq`` (any frame, kept or not). It acts on the newest frame,
        so a kept frame older than that still waiting for its command was superseded: its joint state goes out
        now, with a null command, rather than never."""
        if seq < self.answered - PAIR_WINDOW:       # the robot restarted its seq
            self.answered = -1
        if seq <= self.answered:
            return []
        self.answered = seq
        out = []
        while self.wait_frames and next(iter(self.wait_frames)) < seq:
            s, frame = self.wait_frames.popitem(last=False)
            self.superseded += 1
            out.append(self._joint_states(s, frame, None))
        return out

    def _joint_states(self, seq, frame, action):
        lay, out_kind = self._lay, self.legged.get("output")
        t, x = frame
        (po, _), (vo, _) = lay["slices"]["joint_pos"], lay["slices"].get("joint_vel", (None, 0))
        joints = {}
        for i, name in enumerate(lay["robot"]):
            joints[name] = {"position": _num(x[po + i]), "velocity": _num(x[vo + i]) if vo is not None else None}
        fields = COMMAND_FIELDS.get(out_kind, ())
        n_act = len(lay["actuators"])
        for i, name in enumerate(lay["actuators"]):
            j = joints.setdefault(name, {"position": None, "velocity": None})
            for r, f in enumerate(fields):      # row r of the command: the actuators' values of that field
                j[f] = _num(action["u"][r * n_act + i]) if action is not None else None
        for j in joints.values():
            for f in fields:
                j.setdefault(f, None)
        msg = {"seq": seq, "t_ns": t, "cycle": int(action["cycle"]) if action is not None else None,
               "safe": bool(action.get("safe")) if action is not None else None, "output": str(out_kind),
               "joints": joints}
        return JOINT_STATES, msg, t + self.offset_ns

    def _base(self, seq, t, x):
        lay, order = self._lay, self.legged.get("quat_order")

        def part(signal, keys):
            o, w = lay["slices"].get(signal, (0, 0))
            return {k: _num(x[o + i]) for i, k in enumerate(keys)} if w == len(keys) else None
        qo, qw = lay["slices"].get("imu_quat", (0, 0))
        raw = [float(v) for v in x[qo:qo + qw]] if qw == 4 else None
        q = quat_wxyz(raw, order) if raw is not None and order in ("wxyz", "xyzw") else None
        msg = {"seq": seq, "t_ns": t, "quat_order": order,
               "quat_raw": {f"q{i}": _num(v) for i, v in enumerate(raw or ())},
               "orientation": dict(zip("wxyz", q)) if q else None,
               "rpy_deg": dict(zip(("roll", "pitch", "yaw"), rpy_deg(*q))) if q else None,
               "projected_gravity": dict(zip("xyz", gravity_in_body(*q))) if q else None,
               "gyro": part("imu_gyro", "xyz"), "acc": part("imu_acc", "xyz"),
               "command": part("command", lay["command"]) or {}}
        log = t + self.offset_ns
        out = [(BASE, msg, log)]
        if q:
            w, qx, qy, qz = q
            out.append((TF, {"timestamp": {"sec": log // 1_000_000_000, "nsec": log % 1_000_000_000},
                             "parent_frame_id": FRAME_WORLD, "child_frame_id": FRAME_BASE,
                             "translation": {"x": 0.0, "y": 0.0, "z": 0.0},
                             "rotation": {"x": qx, "y": qy, "z": qz, "w": w}}, log))
        return out

    def sim_state(self, m: dict):
        step = m.get("step")
        if not isinstance(step, int) or step % self.every:
            return []
        t = int(m["t_ns"])
        return [(SIM_PENDULUM, {"step": step, "t_ns": t, "angle": float(m["theta"]),
                                "velocity": float(m["omega"]), "torque": float(m["u"])}, t + self.offset_ns)]

    def diagnostics(self, m: dict):
        """Cycle windows and events of one snapshot (its ``ring``, rejected counts, lifecycle)."""
        out = []
        pol = m.get("policy") or {}
        if self.action_names is None and pol.get("action_names"):
            self.action_names = list(pol["action_names"])
        if self.feature_names is None and pol.get("feature_names"):
            self.feature_names = list(pol["feature_names"])
        t_snap = int(m.get("t_ns", 0)) + self.offset_ns
        self.phase_offset_ns = int(m.get("phase_offset_ns", self.phase_offset_ns))
        ring = m.get("ring") or {}
        cycles = ring.get("cycle") or []
        fields = [ring.get(f) or [] for f in ("t_tick_ns", "wake_latency_ns", "cycle_time_ns", "input_age_ns",
                                              "flags")]
        safe_run = None                    # [first cycle, count, stale count] of consecutive safe cycles
        for c, tick, wake, ct, age, fl in zip(cycles, *fields):
            if fl & rundir.FLAG_MISS:
                out.append((EVENTS, {"kind": "miss", "cycle": c, "count": 1, "wake_latency_ns": wake,
                                     "cycle_time_ns": ct, "cause": None,
                                     "text": f"cycle {c} missed its deadline: woke {wake / 1e3:.1f} us late, "
                                             f"took {ct / 1e3:.1f} us (why: control-node report after the run)"},
                            tick + self.offset_ns))
            if fl & rundir.FLAG_SAFE:
                if safe_run is not None and safe_run[0] + safe_run[1] == c:
                    safe_run[1] += 1
                    safe_run[2] += bool(fl & rundir.FLAG_STALE)
                else:
                    out += self._safe_event(safe_run)
                    safe_run = [c, 1, int(bool(fl & rundir.FLAG_STALE)), tick]
            out += self._add_cycle(c, tick, wake, ct, age, fl)
        out += self._safe_event(safe_run)
        rej = m.get("rejected")
        if isinstance(rej, dict):
            if self.rejected is not None:
                for reason, n in sorted(rej.items()):
                    d = int(n) - int(self.rejected.get(reason, 0))
                    if d > 0:
                        out.append((EVENTS, {"kind": "rejected", "cycle": None, "count": d, "reason": str(reason),
                                             "text": f"{d} frame(s) rejected: {reason}"}, t_snap))
            self.rejected = dict(rej)
        lg = m.get("legged")
        if isinstance(lg, dict) and self.legged is None and lg.get("joints") and lg.get("frame"):
            self._set_legged(lg)
        if isinstance(lg, dict) and lg.get("mode"):
            self.legged_mode = str(lg["mode"])
            c = lg.get("counts") or {}
            out.append((MODE, {"mode": str(lg["mode"]), "stand_done": bool(lg.get("stand_done")),
                               "output": str(lg.get("output")), "stale_trips": int(c.get("stale_trips", 0)),
                               "non_finite_trips": int(c.get("non_finite_trips", 0)),
                               "tau_clipped": int(c.get("tau_clipped", 0))}, t_snap))
            if lg["mode"] != self.mode_seen:
                if self.mode_seen is not None:
                    out.append((EVENTS, {"kind": "mode", "cycle": int(m.get("cycles", 0)), "count": 1,
                                         "event": "mode", "text": f"mode {self.mode_seen} -> {lg['mode']} "
                                                                  "(seen at this snapshot; the report has the cycle)"},
                                t_snap))
                self.mode_seen = lg["mode"]
        for e in ((m.get("lifecycle") or {}).get("transitions") or []):
            if e.get("n", -1) > self.transitions_seen:
                self.transitions_seen = e["n"]
                out.append((EVENTS, {"kind": "policy", "cycle": e.get("cycle"), "count": 1,
                                     "event": str(e.get("event")), "policy": str(e.get("policy")),
                                     "reason": str(e.get("reason")),
                                     "text": f"{e.get('event')} {e.get('policy')} (from {e.get('from')}, "
                                             f"{e.get('reason')})"},
                            int(e.get("t_ns", 0)) + self.offset_ns))
        return out

    def _safe_event(self, run):
        if run is None:
            return []
        first, n, stale, tick = run
        return [(EVENTS, {"kind": "safe", "cycle": first, "count": n, "stale": stale,
                          "text": f"{n} safe action(s) from cycle {first}" + (f", {stale} stale" if stale else "")},
                 tick + self.offset_ns)]

    def _add_cycle(self, c, tick, wake, ct, age, fl):
        """Add one cycle to its window; a message when the window is complete (or a newer one began)."""
        w = c // self.every
        out = []
        if self.pending and self.pending["w"] != w:
            out.append(self._close_window())
        if not self.pending:
            self.pending = {"w": w, "recs": []}
        self.pending["recs"].append((c, tick, wake, ct, age, fl))
        if c % self.every == self.every - 1:
            out.append(self._close_window())
        return out

    def _close_window(self):
        recs = self.pending["recs"]
        self.pending = {}
        msg = {"cycle_first": recs[0][0], "cycle_last": recs[-1][0], "cycles": len(recs)}
        for i, name in enumerate(CYCLE_FIGURES, start=2):
            v = [r[i] for r in recs if r[i] >= 0]
            msg[name] = {"min": min(v), "max": max(v), "last": v[-1]} if v else None
        for name, bit in (("misses", rundir.FLAG_MISS), ("stale", rundir.FLAG_STALE), ("safe", rundir.FLAG_SAFE),
                          ("phase_shifts", rundir.FLAG_PHASE_SHIFT)):
            msg[name] = sum(1 for r in recs if r[5] & bit)
        msg["phase_offset_ns"] = self.phase_offset_ns
        return CYCLE, msg, recs[-1][1] + self.offset_ns


def offset_from_recording(log_time_ns: int, t_ns: int) -> int:
    """Wall minus monotonic from a recorded message (the recorder's wall clock at receipt, the sender's
    monotonic time): the one offset of an exported run."""
    return int(log_time_ns) - int(t_ns)
