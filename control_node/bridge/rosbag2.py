"""rosbag2 in and out: ``control-node export --to rosbag2`` and ``control-node replay --rosbag2``.

Both go through ``rosbags`` (0.11.9; no ROS 2 install needed): its Writer (metadata version 9, MCAP
storage, CDR, type description hashes RIHS01 from its typestore, offered QoS filled in here) and its
AnyReader (MCAP and sqlite3 bags, e.g. from ``ros2 bag record``). No CDR is written by hand: every
message is a ``rosbags`` typestore dataclass serialised by ``Typestore.serialize_cdr``.

Export (:func:`export_rosbag2`) turns a ``control-node record`` MCAP into a bag:

* observations: with a ``[ros2]`` recipe whose terms can be inverted exactly (raw fields, scale / offset,
  ``cos_sin`` joint positions as ``atan2(sin, cos)``), one message per recipe topic per frame, of the
  configured type (the trigger topic's written last, at the same log time); a recipe with a term that cannot
  be inverted (``projected_gravity``: the orientation's yaw is gone; a scale of 0) or no recipe:
  ``std_msgs/msg/Float64MultiArray`` on ``/control_node/observation`` (the frame's ``x``);
* actions: each new action (a new ``seq``, or a switch between safe and policy action, as the live bridge
  publishes them) as the ``[ros2.action]`` type on its topic (``ros2.ActionWriter``), else
  Float64MultiArray on ``/control_node/action``; an argmax policy's class index as a one-value
  Float64MultiArray on ``/control_node/action``;
* diagnostics: each recorded diagnostics snapshot as ``diagnostic_msgs/msg/DiagnosticArray`` on
  ``/diagnostics`` (one status "control_node", its numbers as key/value strings; level WARN when deadline
  misses or stale cycles grew since the previous snapshot).

Bag timestamps and header stamps are the recording's log times (the recorder's wall clock).

Replay (:func:`bag_stream`) reads a bag's recipe topics in log-time order through the recipe's
:class:`~control_node.bridge.recipe.FrameAssembler` (now_ns = the bag's log time) and returns a
``sim.streams.Stream`` of the frames it assembled, on the bag's schedule.
"""
from __future__ import annotations

import math
import os

import numpy as np

from control_node.bridge.recipe import (ARRAY, COMPONENTS, GRAVITY, JOINTS, SCALAR, FrameAssembler, Recipe, _get)
from control_node.errors import UserError

OBS_TOPIC, ACT_TOPIC, DIAG_TOPIC = "/control_node/observation", "/control_node/action", "/diagnostics"
FLOAT_ARRAY = "std_msgs/msg/Float64MultiArray"
DIAG_TYPE = "diagnostic_msgs/msg/DiagnosticArray"
INSTALL_ROSBAGS = "pip install rosbags==0.11.9 (or 'control-node[ros2]')"
_NUMERIC = {"bool": np.bool_, "byte": np.uint8, "char": np.uint8, "octet": np.uint8, "int8": np.int8,
            "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32,
            "int64": np.int64, "uint64": np.uint64, "float32": np.float32, "float64": np.float64}


def typestore():
    """rosbags' typestore of ROS 2 Kilted (the distribution of the ``control-node[ros2]`` wheels)."""
    try:
        from rosbags.typesys import Stores, get_typestore
    except ImportError as e:
        raise UserError(f"rosbag2 export / replay needs rosbags, which cannot be imported ({e}). "
                        f"Install: {INSTALL_ROSBAGS}") from None
    return get_typestore(Stores.ROS2_KILTED)


# --- rosbags messages ---------------------------------------------------------------------------------

def _zero(ts, nodetype, rest):
    from rosbags.typesys.store import Nodetype
    if nodetype == Nodetype.BASE:
        t = rest[0]
        return "" if t in ("string", "wstring") else False if t == "bool" else 0.0 if t.startswith("float") else 0
    if nodetype == Nodetype.NAME:
        return blank(ts, rest)
    (sub_type, sub_rest), n = rest
    numeric = sub_type == Nodetype.BASE and sub_rest[0] in _NUMERIC
    if nodetype == Nodetype.ARRAY:
        if numeric:
            return np.zeros(n, dtype=_NUMERIC[sub_rest[0]])
        return [_zero(ts, sub_type, sub_rest) for _ in range(n)]
    return np.zeros(0, dtype=_NUMERIC[sub_rest[0]]) if numeric else []      # a sequence: empty


def blank(ts, typename):
    """A ``typename`` message of the typestore with every field zero / empty (a Quaternion's w is 1, as
    in its .msg definition)."""
    _consts, fields = ts.fielddefs[typename]
    m = ts.types[typename](**{name: _zero(ts, nt, rest) for name, (nt, rest) in fields})
    if typename == "geometry_msgs/msg/Quaternion":
        m.w = 1.0
    return m


def numpyify(ts, msg, typename):
    """Sequences of numbers set as lists (``ros2.ActionWriter`` does) to the numpy arrays rosbags'
    serialiser takes, in place, nested messages included. Returns ``msg``."""
    from rosbags.typesys.store import Nodetype
    _consts, fields = ts.fielddefs[typename]
    for name, (nt, rest) in fields:
        v = getattr(msg, name)
        if nt == Nodetype.NAME:
            numpyify(ts, v, rest)
        elif nt in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            (sub_type, sub_rest), _n = rest
            if sub_type == Nodetype.BASE and sub_rest[0] in _NUMERIC:
                setattr(msg, name, np.asarray(v, dtype=_NUMERIC[sub_rest[0]]))
            elif sub_type == Nodetype.NAME:
                for e in v:
                    numpyify(ts, e, sub_rest)
    return msg


class Blank:
    """A rosbags type as a class ``ros2.ActionWriter`` can call: ``cls()`` and ``cls(sec=.., nanosec=..)``
    (rosbags' dataclasses need every field as an argument; this starts from :func:`blank`)."""

    def __init__(self, ts, typename):
        self.ts, self.typename = ts, typename

    def __call__(self, **fields):
        m = blank(self.ts, self.typename)
        for k, v in fields.items():
            setattr(m, k, v)
        return m


def stamp(ts, t_ns):
    """builtin_interfaces/msg/Time of a time in ns."""
    return ts.types["builtin_interfaces/msg/Time"](sec=int(t_ns // 1_000_000_000), nanosec=int(t_ns % 1_000_000_000))


def offered_qos(name):
    """The offered QoS written into metadata.yaml, as rclpy's profiles: "sensor_data" (best effort, keep
    last 5) or "reliable" (keep last 10), volatile, automatic liveliness, no deadline / lifespan."""
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
    inf = QosTime(sec=9223372036, nsec=854775807)          # rmw's "infinite" duration, as ros2 bag writes it
    best = name == "sensor_data"
    return Qos(history=QosHistory.KEEP_LAST, depth=5 if best else 10,
               reliability=QosReliability.BEST_EFFORT if best else QosReliability.RELIABLE,
               durability=QosDurability.VOLATILE, deadline=inf, lifespan=inf, liveliness=QosLiveliness.AUTOMATIC,
               liveliness_lease_duration=inf, avoid_ros_namespace_conventions=False)


def float_array(ts, values, label):
    m = blank(ts, FLOAT_ARRAY)
    m.data = np.asarray(values, dtype=np.float64)
    n = len(m.data)
    m.layout.dim = [ts.types["std_msgs/msg/MultiArrayDimension"](label=label, size=n, stride=n)]
    return m


# --- observations: the recipe inverted ------------------------------------------------------------------

def not_invertible(recipe: Recipe):
    """Why the recipe's frames cannot be turned back into its messages exactly, or None when they can."""
    for t in recipe.terms:
        if t.kind == GRAVITY:
            return (f"{t.key} ({t.topic} projected_gravity) is not invertible: the gravity direction does not "
                    "give the orientation back (its yaw is gone)")
        if t.scale is not None and not np.all(t.scale != 0):
            return f"{t.key} ({t.topic} {t.field}) has a scale of 0: its raw values are gone"
    return None


class FrameMessages:
    """The messages of the recipe's topics that make a given frame: the inverse of FrameAssembler for a
    recipe :func:`not_invertible` accepts. Unused fields stay zero / empty (JointState: a field no term
    reads is an empty array, as ROS 2 drivers send a field they do not measure)."""

    def __init__(self, ts, recipe: Recipe):
        self.ts, self.recipe = ts, recipe
        self.topics = list(recipe.topics)
        # the trigger last: a reader in log-time order sees every term before the frame's trigger
        self.topics.sort(key=lambda tp: tp == recipe.trigger)
        self.joints = {}
        for t in recipe.terms:
            if t.kind == JOINTS:
                names = self.joints.setdefault(t.topic, [])
                names += [j for j in t.joints if j not in names]
        self.slices, pos = [], 0
        for t in recipe.terms:
            self.slices.append(slice(pos, pos + t.width))
            pos += t.width

    def build(self, x, t_ns):
        """[(topic, type, message)] for frame ``x`` (the recipe's values) at ``t_ns`` (header stamps)."""
        ts = self.ts
        msgs = {}
        for topic in self.topics:
            typ = self.recipe.topics[topic][0]
            m = blank(ts, typ)
            if hasattr(m, "header"):
                m.header.stamp = stamp(ts, t_ns)
            msgs[topic] = m
        for t, sl in zip(self.recipe.terms, self.slices):
            v = np.asarray(x[sl], dtype=np.float64)
            if t.scale is not None:
                v = v / t.scale
            if t.offset is not None:
                v = v + t.offset
            m = msgs[t.topic]
            if t.kind == JOINTS:
                names = self.joints[t.topic]
                m.name = list(names)
                arr = getattr(m, t.field)
                if len(arr) != len(names):
                    arr = np.zeros(len(names))
                if t.encode == "cos_sin":
                    v = np.array([math.atan2(v[2 * k + 1], v[2 * k]) for k in range(len(t.joints))])
                for j, val in zip(t.joints, v):
                    arr[names.index(j)] = val
                setattr(m, t.field, arr)
            elif t.kind in COMPONENTS:
                obj = _get(m, t.field)
                for c, val in zip(COMPONENTS[t.kind], v):
                    setattr(obj, c, float(val))
            elif t.kind == ARRAY:
                m.data = v.copy()
            elif t.kind == SCALAR and t.component is not None:
                head, comp = t.field.rsplit(".", 1)
                setattr(_get(m, head), comp, float(v[0]))
            elif t.kind == SCALAR:
                setattr(m, t.field, float(v[0]))
            else:                       # not_invertible refused it
                raise ValueError(f"{t.key}: {t.kind} cannot be inverted")
        return [(topic, self.recipe.topics[topic][0], msgs[topic]) for topic in self.topics]


# --- export -----------------------------------------------------------------------------------------

def _x_of(d):
    x = d.get("x")
    if isinstance(x, (bytes, bytearray)):
        x = np.frombuffer(x, dtype="<f8")
    return np.asarray(x, dtype=np.float64)


def _flat(d, prefix=""):
    """Scalars of a (nested) diagnostics dict as "a.b" -> str; lists as JSON."""
    import json
    out = []
    for k, v in d.items():
        key = f"{prefix}{k.decode() if isinstance(k, bytes) else k}"
        if isinstance(v, dict):
            out += _flat(v, key + ".")
        elif isinstance(v, (list, tuple)):
            try:
                out.append((key, json.dumps(v)))
            except (TypeError, ValueError):
                out.append((key, str(v)))
        elif isinstance(v, (bytes, bytearray)):
            out.append((key, v.hex()))
        else:
            out.append((key, str(v)))
    return out


def diagnostic_array(ts, d, t_ns, prev):
    """A DiagnosticArray of one snapshot ``d``; ``prev``: the previous snapshot (or None) for the level."""
    status = blank(ts, "diagnostic_msgs/msg/DiagnosticStatus")
    status.name, status.hardware_id = "control_node", "control_node"
    grew = [k for k in ("deadline_misses", "stale_cycles")
            if prev is not None and isinstance(d.get(k), int) and isinstance(prev.get(k), int) and d[k] > prev[k]]
    status.level = 1 if grew else 0          # WARN / OK
    status.message = (f"cycles {d.get('cycles')}, deadline misses {d.get('deadline_misses')}, "
                      f"stale cycles {d.get('stale_cycles')}" + (f" ({', '.join(grew)} grew)" if grew else ""))
    kv = ts.types["diagnostic_msgs/msg/KeyValue"]
    status.values = [kv(key=k, value=v) for k, v in _flat(d)]
    arr = blank(ts, DIAG_TYPE)
    arr.header.stamp = stamp(ts, t_ns)
    arr.status = [status]
    return arr


def new_actions(actions):
    """The recorded actions the live bridge would publish: [(log_time, decoded)], each new (seq, safe)
    once (the node repeats its last action every cycle in timer mode); a new node process (cycle going
    back) starts over."""
    import msgpack
    out, last_key, last_cycle = [], None, -1
    for raw, lt in actions:
        try:
            d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            seq, safe, cycle = int(d["seq"]), bool(d["safe"]), int(d.get("cycle", 0))
        except Exception:       # noqa: BLE001 - a torn message carries no action
            continue
        if cycle < last_cycle:
            last_key = None
        last_cycle = cycle
        if (seq, safe) == last_key:
            continue
        last_key = (seq, safe)
        out.append((lt, d))
    return out


def export_rosbag2(recording, out, recipe: Recipe | None = None, log=print) -> dict:
    """Write the rosbag2 directory ``out`` (must not exist) from a ``control-node record`` MCAP.
    Returns {"topics": {topic: (type, count)}, "notes": [...], "out": out}."""
    import msgpack

    from control_node.bridge.ros2 import ActionWriter
    from control_node.recording import ACTION, DIAGNOSTICS, SENSOR
    from control_node.recording.reader import read_recording
    ts = typestore()
    from rosbags.rosbag2 import StoragePlugin, Writer
    if os.path.exists(out):
        raise UserError(f"{out} exists: rosbag2 writes a new directory (remove it or give another --out)")
    rec = read_recording(recording, topics=[SENSOR, ACTION, DIAGNOSTICS])
    notes = []
    frames = []
    for raw, lt in rec[SENSOR]:
        try:
            d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception:       # noqa: BLE001 - a torn frame is no frame
            continue
        if isinstance(d, dict) and "x" in d and not d.get("warmup"):
            frames.append((lt, _x_of(d)))
    frame_writer = None
    if recipe is not None:
        why = not_invertible(recipe)
        widths = {len(x) for _lt, x in frames}
        if why is None and widths and widths != {recipe.width}:
            raise UserError(f"the recording's frames have {sorted(widths)} values, the [ros2] recipe of "
                            f"{recipe.source} makes {recipe.width}: not the config of this recording")
        if why is None:
            frame_writer = FrameMessages(ts, recipe)
        else:
            notes.append(f"observations as {FLOAT_ARRAY} on {OBS_TOPIC}: {why}")
    elif frames:
        notes.append(f"observations as {FLOAT_ARRAY} on {OBS_TOPIC} (no [ros2] recipe: --config FILE "
                     "with a [ros2] section writes its topics and types)")
    actions = new_actions(rec[ACTION])
    act_writer = None
    if recipe is not None and recipe.action is not None and any("u" in d for _lt, d in actions):
        a = recipe.action
        classes = {n: Blank(ts, n) for n in (a.type, "trajectory_msgs/msg/JointTrajectoryPoint",
                                             "builtin_interfaces/msg/Duration")}
        act_writer = ActionWriter(a, classes)
    elif actions:
        notes.append(f"actions as {FLOAT_ARRAY} on {ACT_TOPIC}" +
                     ("" if recipe is None or recipe.action is not None else " (the recipe has no [ros2.action])"))

    # every message to write, in log-time order (within a frame: the trigger topic last)
    events = []
    for i, (lt, _x) in enumerate(frames):
        events.append((lt, 0, i))
    for i, (lt, _d) in enumerate(actions):
        events.append((lt, 1, i))
    snaps = []
    for raw, lt in rec[DIAGNOSTICS]:
        try:
            d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception:       # noqa: BLE001
            continue
        if isinstance(d, dict):
            snaps.append((lt, d))
    for i, (lt, _d) in enumerate(snaps):
        events.append((lt, 2, i))
    events.sort()

    counts = {}
    w = Writer(out, version=9, storage_plugin=StoragePlugin.MCAP)
    w.set_custom_data("control_node.source", os.path.abspath(str(recording)))
    w.set_custom_data("control_node.notes", "; ".join(notes) or "none")
    conns = {}

    def conn(topic, typ, qos):
        if topic not in conns:
            conns[topic] = w.add_connection(topic, typ, typestore=ts, offered_qos_profiles=[offered_qos(qos)])
            counts[topic] = [typ, 0]
        return conns[topic]

    def put(topic, typ, qos, msg, t_ns):
        w.write(conn(topic, typ, qos), int(t_ns), ts.serialize_cdr(numpyify(ts, msg, typ), typ))
        counts[topic][1] += 1

    prev = None
    w.open()
    try:
        for lt, kind, i in events:
            if kind == 0:
                x = frames[i][1]
                if frame_writer is not None:
                    for topic, typ, msg in frame_writer.build(x, lt):
                        put(topic, typ, recipe.topics[topic][1], msg, lt)
                else:
                    put(OBS_TOPIC, FLOAT_ARRAY, "sensor_data", float_array(ts, x, "observation"), lt)
            elif kind == 1:
                d = actions[i][1]
                if "u" in d and act_writer is not None:
                    a = recipe.action
                    put(a.topic, a.type, a.qos, act_writer.build(d["u"], stamp(ts, lt)), lt)
                else:
                    u = d["u"] if "u" in d else [float(d.get("action", -1))]
                    put(ACT_TOPIC, FLOAT_ARRAY, "reliable", float_array(ts, u, "action"), lt)
            else:
                d = snaps[i][1]
                put(DIAG_TOPIC, DIAG_TYPE, "reliable", diagnostic_array(ts, d, lt, prev), lt)
                prev = d
    finally:
        w.close()
    return {"out": str(out), "topics": {k: tuple(v) for k, v in counts.items()}, "notes": notes,
            "frames": len(frames), "actions": len(actions), "diagnostics": len(snaps)}


# --- replay -----------------------------------------------------------------------------------------

def bag_storage(path):
    """metadata.yaml's storage_identifier (mcap, sqlite3), or None."""
    try:
        from ruamel.yaml import YAML
        with open(os.path.join(path, "metadata.yaml")) as f:
            return YAML(typ="safe").load(f)["rosbag2_bagfile_information"].get("storage_identifier")
    except Exception:       # noqa: BLE001 - informative only
        return None


def bag_stream(path, recipe: Recipe, rate=1.0, start=0.0, duration=None):
    """``(Stream, counters)``: the frames the recipe assembles from a rosbag2 (MCAP or sqlite3) directory,
    each at its trigger message's log time, scaled by ``1/rate``. ``counters`` is the assembler's
    (frames_sent, messages, messages_refused, frames_withheld by reason) plus ``undecodable``."""
    from pathlib import Path

    from control_node.sim.streams import Stream
    ts = typestore()
    from rosbags.highlevel import AnyReader
    if rate <= 0:
        raise UserError("--rate must be > 0")
    if not os.path.isdir(path):
        raise UserError(f"{path} is not a rosbag2 directory (the folder holding metadata.yaml)")
    asm = FrameAssembler(recipe)
    xs, times = [], []
    undecodable = 0
    try:
        reader = AnyReader([Path(path)], default_typestore=ts)
        reader.open()
    except Exception as e:       # noqa: BLE001 - rosbags' errors for an unreadable bag are several classes
        raise UserError(f"{path}: cannot be read as a rosbag2 ({type(e).__name__}: {e})") from None
    try:
        have = {c.topic: c.msgtype for c in reader.connections}
        for topic, (typ, _qos) in recipe.topics.items():
            if topic not in have:
                raise UserError(f"{path} has no topic {topic} (the [ros2] recipe of {recipe.source} reads it); "
                                f"its topics: {', '.join(sorted(have)) or 'none'}")
            if have[topic] != typ:
                raise UserError(f"{path}: {topic} is {have[topic]}, the recipe reads it as {typ}")
        conns = [c for c in reader.connections if c.topic in recipe.topics]
        storage = bag_storage(path)
        for c, t_ns, raw in reader.messages(connections=conns):
            try:
                msg = reader.deserialize(raw, c.msgtype)
            except Exception:       # noqa: BLE001 - a message that does not decode is counted, not fatal
                undecodable += 1
                continue
            x = asm.on_message(c.topic, msg, int(t_ns))
            if x is not None:
                xs.append(x)
                times.append(int(t_ns))
    finally:
        reader.close()
    counters = {**asm.counters(), "undecodable": undecodable}
    if not xs:
        wh = ", ".join(f"{k} {v}" for k, v in counters["frames_withheld"].items()) or "none"
        raise UserError(f"{path}: the recipe assembled no frame ({counters['messages']} messages; withheld: {wh}"
                        + (f"; last refusal: {asm.last_refusal}" if asm.last_refusal else "") + ")")
    t = np.asarray(times, dtype=np.int64)
    rel = t - t[0]
    keep = rel >= int(start * 1e9)
    if duration is not None:
        keep &= rel < int((start + duration) * 1e9)
    idx = np.flatnonzero(keep)
    if len(idx) == 0:
        raise UserError(f"{path}: no frames within --start {start} --duration {duration}")
    rel = rel[idx] - rel[idx[0]]
    X = np.asarray(xs, dtype=np.float64)[idx]
    st = Stream(X=X, truth=np.full(len(idx), -1, dtype=np.int16),
                offsets_ns=(rel.astype(np.float64) / rate).astype(np.int64), drop=np.zeros(len(idx), dtype=bool),
                recorded_seq=idx.astype(np.int64),
                settings={"kind": "rosbag2", "file": str(path), "frames": int(len(idx)), "rate": rate,
                          "start": start, "duration": duration, "trigger": recipe.trigger,
                          "storage": storage, "bag": counters,
                          "first_log_time_ns": int(t[idx[0]])})
    return st, counters


def describe_counters(c) -> str:
    wh = ", ".join(f"{k} {v}" for k, v in c["frames_withheld"].items()) or "none"
    ref = ", ".join(f"{k} {v}" for k, v in c["messages_refused"].items()) or "none"
    msgs = ", ".join(f"{k} {v}" for k, v in c["messages"].items())
    return (f"messages {msgs}; frames assembled {c['frames_sent']}, withheld {wh}; messages refused {ref}"
            + (f"; undecodable {c['undecodable']}" if c.get("undecodable") else ""))
