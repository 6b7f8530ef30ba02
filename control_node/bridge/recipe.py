"""The ``[ros2]`` recipe: which ROS 2 topics and fields make the node's observation, and where its action goes.

One definition, used by the live bridge (``ros2.py``), by rosbag2 replay and export: parse and check the
config once (:func:`load_recipe`, no rclpy needed), then :class:`FrameAssembler` turns messages into frames.
Messages are read by attribute (``msg.position``, ``msg.angular_velocity.x``), so rclpy's message classes
and ``rosbags``' dataclasses are read by the same code.

A frame is assembled when a message on ``trigger`` arrives. Every term must then hold a valid value received
(arrival time at the bridge) at most ``max_age_ms`` ago; otherwise no frame is sent and the reason is
counted. A message with a bad used value (a configured joint missing, NaN/Inf, an array shorter than
``name``, a wrong length, a zero quaternion) invalidates its term until the next good message.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from control_node.errors import ConfigError

# field kinds: a vector3 gives x y z, a quaternion x y z w, "scalar" one value, "joints" one per joint,
# "array" a Float64MultiArray's data (``size`` values), "gravity" the projected gravity (3, from orientation)
VEC3, QUAT, SCALAR, JOINTS, ARRAY, GRAVITY = "vector3", "quaternion", "scalar", "joints", "array", "gravity"
OBS_TYPES = {
    "sensor_msgs/msg/JointState": {"position": JOINTS, "velocity": JOINTS, "effort": JOINTS},
    "sensor_msgs/msg/Imu": {"orientation": QUAT, "angular_velocity": VEC3, "linear_acceleration": VEC3,
                            "projected_gravity": GRAVITY},
    "geometry_msgs/msg/Twist": {"linear": VEC3, "angular": VEC3},
    "geometry_msgs/msg/TwistStamped": {"twist.linear": VEC3, "twist.angular": VEC3},
    "geometry_msgs/msg/Vector3Stamped": {"vector": VEC3},
    "std_msgs/msg/Float64MultiArray": {"data": ARRAY},
    "std_msgs/msg/Float64": {"data": SCALAR},
}
COMPONENTS = {VEC3: ("x", "y", "z"), QUAT: ("x", "y", "z", "w")}
ACTION_TYPES = {"std_msgs/msg/Float64MultiArray": (), "sensor_msgs/msg/JointState": ("position", "effort"),
                "trajectory_msgs/msg/JointTrajectory": ("positions", "velocities", "effort")}
QOS = ("sensor_data", "reliable")
ENCODINGS = ("raw", "cos_sin")     # cos_sin: a joint position as (cos q, sin q), for continuous joints

# why a message or a trigger gave no frame (counted by these names in the bridge's summary)
REASONS = ("missing_joint", "non_finite", "short_array", "wrong_length", "zero_quaternion",
           "never_received", "stale_term", "bad_message")
INSTALL = ("pip install 'control-node[ros2]' (the ROS 2 Python wheels), or source a ROS 2 install's "
           "setup.bash")


class Refused(Exception):
    """A message's used value is bad: ``reason`` is one of REASONS."""

    def __init__(self, reason, detail=""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclass
class Term:
    """One observation term: ``width`` values read from ``field`` of messages on ``topic``."""
    index: int
    topic: str
    type: str
    field: str
    kind: str
    joints: list = field(default_factory=list)
    component: str | None = None          # "x" of "angular_velocity.x"
    encode: str = "raw"
    size: int = 0                         # Float64MultiArray: values expected
    scale: np.ndarray | None = None
    offset: np.ndarray | None = None
    qos: str = "sensor_data"
    width: int = 0
    names: list = field(default_factory=list)   # one per value, e.g. "knee.position", "angular_velocity.z"

    @property
    def key(self):
        return f"ros2.observation[{self.index}]"


@dataclass
class ActionSpec:
    topic: str
    type: str
    field: str                 # JointState: position | effort; JointTrajectory: positions | velocities | effort
    qos: str
    names: list                # joint names for JointState / JointTrajectory (the model's action_names)
    time_from_start_s: float = 0.0


@dataclass
class Recipe:
    domain_id: int
    trigger: str
    max_age_ns: int
    terms: list
    action: ActionSpec | None
    width: int
    source: str
    node_name: str = "control_node_bridge"
    mode_topic: str | None = None          # a legged node's modes, from a std_msgs/String topic ([ros2.legged])
    policy_topic: str | None = None        # a legged node's policy/safe state, as a latched std_msgs/Bool

    @property
    def topics(self) -> dict:
        """topic -> (type, qos) of every subscription (the trigger included), in first-use order."""
        out = {}
        for t in self.terms:
            out.setdefault(t.topic, (t.type, t.qos))
        return out

    def describe(self) -> str:
        parts = [f"{t.topic} {t.field}{'[' + ','.join(t.joints) + ']' if t.joints else ''} ({t.width})"
                 for t in self.terms]
        act = f"; action -> {self.action.topic} ({self.action.type})" if self.action else ""
        return (f"observation {self.width} values = " + " + ".join(parts) +
                f"; trigger {self.trigger}, max age {self.max_age_ns / 1e6:g} ms{act}")


def _bad(path, key, problem, fix):
    return ConfigError(path, key, problem, fix)


def _number_list(path, key, value, width):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        arr = np.full(width, float(value))
    elif isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        if len(value) != width:
            raise _bad(path, key, f"has {len(value)} values, the term gives {width}",
                       f"give one number, or exactly {width} (one per value)")
        arr = np.asarray(value, dtype=np.float64)
    else:
        raise _bad(path, key, f"invalid value {value!r}", "use a number or a list of numbers")
    if not np.isfinite(arr).all():
        raise _bad(path, key, "holds a non-finite number", "use finite numbers")
    return arr


def _qos(path, key, value):
    if value not in QOS:
        raise _bad(path, key, f"invalid value {value!r}", 'use "sensor_data" (best effort) or "reliable"')
    return value


def _term(path, i, raw, default_qos) -> Term:
    key = f"ros2.observation[{i}]"
    if not isinstance(raw, dict):
        raise _bad(path, key, "is not a table", "write each term as [[ros2.observation]]")
    known = {"topic", "type", "field", "joints", "scale", "offset", "qos", "encode", "size"}
    for k in raw:
        if k not in known:
            raise _bad(path, f"{key}.{k}", "unknown key", f"use one of {sorted(known)}")
    topic = raw.get("topic")
    if not isinstance(topic, str) or not topic.startswith("/") or len(topic) < 2:
        raise _bad(path, f"{key}.topic", f"invalid value {topic!r}", 'use an absolute topic name, e.g. "/joint_states"')
    typ = raw.get("type")
    if typ not in OBS_TYPES:
        raise _bad(path, f"{key}.type", f"unknown or unsupported message type {typ!r}",
                   f"use one of {sorted(OBS_TYPES)}")
    fld = raw.get("field")
    if not isinstance(fld, str) or not fld:
        raise _bad(path, f"{key}.field", f"missing or invalid ({fld!r})", f"use one of {sorted(OBS_TYPES[typ])}")
    kind, component = OBS_TYPES[typ].get(fld), None
    if kind is None and "." in fld:                    # a dotted path to one component: "angular.z"
        head, comp = fld.rsplit(".", 1)
        k = OBS_TYPES[typ].get(head)
        if k in COMPONENTS and comp in COMPONENTS[k]:
            kind, component = SCALAR, comp
    if kind is None:
        comps = [f"{f}.{c}" for f, k in OBS_TYPES[typ].items() if k in COMPONENTS for c in COMPONENTS[k]]
        raise _bad(path, f"{key}.field", f"{typ} has no field {fld!r} the bridge reads",
                   f"use one of {sorted(OBS_TYPES[typ])}" + (f" or one component ({', '.join(comps[:4])}, ...)"
                                                              if comps else ""))
    t = Term(index=i, topic=topic, type=typ, field=fld, kind=kind, component=component,
             qos=_qos(path, f"{key}.qos", raw.get("qos", default_qos)))
    joints = raw.get("joints")
    if kind == JOINTS:
        if (not isinstance(joints, list) or not joints or not all(isinstance(j, str) and j for j in joints)):
            raise _bad(path, f"{key}.joints", f"missing or invalid ({joints!r})",
                       'list the joint names in the policy\'s order, e.g. joints = ["hip", "knee"]')
        if len(set(joints)) != len(joints):
            raise _bad(path, f"{key}.joints", "names a joint twice", "list each joint once")
        t.joints = list(joints)
    elif joints is not None:
        raise _bad(path, f"{key}.joints", f"{typ} field {fld!r} has no joints", "drop joints from this term")
    enc = raw.get("encode", "raw")
    if enc not in ENCODINGS:
        raise _bad(path, f"{key}.encode", f"invalid value {enc!r}", f"use one of {list(ENCODINGS)}")
    if enc != "raw" and not (kind == JOINTS and fld == "position"):
        raise _bad(path, f"{key}.encode", f"{enc} applies to JointState position only", 'drop encode here')
    t.encode = enc
    size = raw.get("size")
    if kind == ARRAY:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise _bad(path, f"{key}.size", f"missing or invalid ({size!r})",
                       "give the number of values in data, e.g. size = 12")
        t.size = size
    elif size is not None:
        raise _bad(path, f"{key}.size", f"only {ARRAY} fields (Float64MultiArray data) take a size", "drop size")
    if kind == JOINTS:
        per = 2 if enc == "cos_sin" else 1
        t.width = per * len(t.joints)
        t.names = ([f"{j}.{c}" for j in t.joints for c in ("cos", "sin")] if per == 2 else
                   [f"{j}.{fld}" for j in t.joints])
    elif kind in COMPONENTS:
        t.width, t.names = len(COMPONENTS[kind]), [f"{fld}.{c}" for c in COMPONENTS[kind]]
    elif kind == GRAVITY:
        t.width, t.names = 3, [f"projected_gravity.{c}" for c in "xyz"]
    elif kind == ARRAY:
        t.width, t.names = t.size, [f"{fld}[{k}]" for k in range(t.size)]
    else:
        t.width, t.names = 1, [fld]
    if "scale" in raw:
        t.scale = _number_list(path, f"{key}.scale", raw["scale"], t.width)
    if "offset" in raw:
        t.offset = _number_list(path, f"{key}.offset", raw["offset"], t.width)
    return t


def _action(path, raw, action_names) -> ActionSpec:
    key = "ros2.action"
    if not isinstance(raw, dict):
        raise _bad(path, key, "is not a table", "write it as [ros2.action]")
    known = {"topic", "type", "field", "qos", "time_from_start_ms"}
    for k in raw:
        if k not in known:
            raise _bad(path, f"{key}.{k}", "unknown key", f"use one of {sorted(known)}")
    topic = raw.get("topic")
    if not isinstance(topic, str) or not topic.startswith("/") or len(topic) < 2:
        raise _bad(path, f"{key}.topic", f"invalid value {topic!r}",
                   'use an absolute topic name, e.g. "/leg_controller/commands"')
    typ = raw.get("type", "std_msgs/msg/Float64MultiArray")
    if typ not in ACTION_TYPES:
        raise _bad(path, f"{key}.type", f"unknown or unsupported action type {typ!r}", f"use one of {sorted(ACTION_TYPES)}")
    fields = ACTION_TYPES[typ]
    fld = raw.get("field", fields[0] if fields else "data")
    if fields and fld not in fields:
        raise _bad(path, f"{key}.field", f"{typ} takes the action in one of {list(fields)}, not {fld!r}",
                   f"use one of {list(fields)}")
    if not fields and fld != "data":
        raise _bad(path, f"{key}.field", f"{typ} carries the action in data", "drop field (or write \"data\")")
    tfs = raw.get("time_from_start_ms", 0.0)
    if not isinstance(tfs, (int, float)) or isinstance(tfs, bool) or not math.isfinite(tfs) or tfs < 0:
        raise _bad(path, f"{key}.time_from_start_ms", f"invalid value {tfs!r}", "use a number of ms >= 0")
    if typ == "trajectory_msgs/msg/JointTrajectory" and "time_from_start_ms" not in raw:
        tfs = 0.0
    return ActionSpec(topic=topic, type=typ, field=fld, qos=_qos(path, f"{key}.qos", raw.get("qos", "reliable")),
                      names=list(action_names or []), time_from_start_s=float(tfs) / 1000.0)


def _default_names(names, stem) -> bool:
    return all(n == f"{stem}{i}" for i, n in enumerate(names))


def _check_joint_names(path, terms, feature_names):
    """A joint term's joints must be the joints the model's feature names mention at those positions, when
    the model's names mention them at all (names like "x0" or "cos_theta" say nothing about joints)."""
    if not feature_names or _default_names(feature_names, "x"):
        return
    low = [str(f).lower() for f in feature_names]
    pos = 0
    for t in terms:
        span = low[pos:pos + t.width]
        pos += t.width
        if t.kind != JOINTS:
            continue
        per = t.width // len(t.joints)
        mentioned = [j for j in t.joints if any(j.lower() in f for f in low)]
        if not mentioned:
            continue
        for k, j in enumerate(t.joints):
            for f in span[k * per:(k + 1) * per]:
                if j.lower() not in f:
                    want = [jj for jj in t.joints if jj.lower() in f]
                    raise _bad(path, f"{t.key}.joints", f"joint {j!r} is at the position of the model's feature "
                               f"{feature_names[pos - t.width + k * per]!r}"
                               + (f" (which names {want[0]!r})" if want else ""),
                               "list the joints in the order of the model's feature_names: "
                               + ", ".join(feature_names[pos - t.width:pos]))


LEGGED_TOPICS = {"joint_states": "/joint_states", "imu": "/imu/data", "command": "/cmd_vel",
                 "mode": "/control_node/mode",     # std_msgs/String: passive, damping, stand or policy
                 # std_msgs/Bool, latched (reliable, transient local): true while the node's commands are its
                 # policy's (not its safe ones), published when that changes, before the command that changed it
                 "policy_active": "/control_node/policy_active"}


def legged_observation(path, raw_legged_topics, legged) -> tuple[list, list]:
    """The observation terms of a legged node's frame (control_node.loop.legged.frame_layout: joint_pos,
    joint_vel by ``joints.robot``'s names, the Imu's orientation, angular velocity and linear acceleration, and
    the Twist's (linear.x, linear.y, angular.z) command), from the node config's ``[legged]`` recipe and
    ``[ros2.legged]``'s topics; and the command's joint names (``joints.actuators``, default ``joints.robot``).
    One recipe serves every transport: nothing of the frame is written twice."""
    key = "ros2.legged"
    if not isinstance(raw_legged_topics, dict):
        raise _bad(path, key, "is not a table", "write it as [ros2.legged] (topic names, all optional)")
    for k in raw_legged_topics:
        if k not in LEGGED_TOPICS:
            raise _bad(path, f"{key}.{k}", "unknown key", f"use one of {sorted(LEGGED_TOPICS)}")
    topics = {k: raw_legged_topics.get(k, v) for k, v in LEGGED_TOPICS.items()}
    if not isinstance(legged, dict):
        raise _bad(path, "legged", "missing: [ros2.legged] builds the frame of the node's [legged] recipe",
                   "add the [legged] recipe (docs/legged.md), or list [[ros2.observation]] terms instead")
    joints = legged.get("joints") or {}
    robot = joints.get("robot")
    if not isinstance(robot, list) or not robot or not all(isinstance(j, str) for j in robot):
        raise _bad(path, "legged.joints.robot", f"missing or invalid ({robot!r})", "list the robot's joint names")
    obs = legged.get("observation") or {}
    if obs.get("quat_order") != "xyzw":
        raise _bad(path, "legged.observation.quat_order", f"is {obs.get('quat_order')!r}; a ROS Imu's orientation "
                   "is x, y, z, w", 'set quat_order = "xyzw" for a node fed through ROS 2')
    n_cmd = obs.get("n_commands", 0)
    if n_cmd not in (0, 3):
        raise _bad(path, "legged.observation.n_commands", f"is {n_cmd!r}; the bridge's command is a Twist's "
                   "(linear.x, linear.y, angular.z)", "use 3 (or 0: no command)")
    js, imu, cmd = topics["joint_states"], topics["imu"], topics["command"]
    terms = [{"topic": js, "type": "sensor_msgs/msg/JointState", "field": "position", "joints": list(robot)},
             {"topic": js, "type": "sensor_msgs/msg/JointState", "field": "velocity", "joints": list(robot)},
             {"topic": imu, "type": "sensor_msgs/msg/Imu", "field": "orientation"},
             {"topic": imu, "type": "sensor_msgs/msg/Imu", "field": "angular_velocity"},
             {"topic": imu, "type": "sensor_msgs/msg/Imu", "field": "linear_acceleration"}]
    if n_cmd == 3:
        terms += [{"topic": cmd, "type": "geometry_msgs/msg/Twist", "field": f} for f in ("linear.x", "linear.y",
                                                                                           "angular.z")]
    acts = joints.get("actuators") or robot
    return terms, list(acts)


def parse_recipe(raw_ros2, path, n_features=None, feature_names=None, action_names=None, history=1,
                 legged=None) -> Recipe:
    """Check a ``[ros2]`` table (already read from TOML) against the model's widths and names. With
    ``[ros2.legged]``, the observation is the frame of the ``legged`` recipe (:func:`legged_observation`) and
    the command is the legged node's (one value per actuator, or five rows for an impedance output)."""
    if not isinstance(raw_ros2, dict):
        raise _bad(path, "ros2", "missing or not a table", "add a [ros2] section (docs/ros2.md has an example)")
    known = {"domain_id", "trigger", "max_age_ms", "qos", "observation", "action", "node_name", "legged"}
    for k in raw_ros2:
        if k not in known:
            raise _bad(path, f"ros2.{k}", "unknown key", f"use one of {sorted(known)}")
    dom = raw_ros2.get("domain_id", 0)
    env_dom = os.environ.get("ROS_DOMAIN_ID")
    if env_dom not in (None, ""):          # as for every ROS 2 tool, the environment wins
        try:
            dom = int(env_dom)
        except ValueError:
            raise _bad("(environment)", "ROS_DOMAIN_ID", f"invalid value {env_dom!r}", "use an integer 0..232") from None
    if not isinstance(dom, int) or isinstance(dom, bool) or not 0 <= dom <= 232:
        raise _bad(path, "ros2.domain_id", f"invalid value {dom!r}", "use an integer 0..232 (ROS_DOMAIN_ID)")
    default_qos = _qos(path, "ros2.qos", raw_ros2.get("qos", "sensor_data"))
    age = raw_ros2.get("max_age_ms", 50.0)
    if not isinstance(age, (int, float)) or isinstance(age, bool) or not math.isfinite(age) or age <= 0:
        raise _bad(path, "ros2.max_age_ms", f"invalid value {age!r}", "use a number of ms > 0, e.g. 50")
    obs = raw_ros2.get("observation")
    if "legged" in raw_ros2:
        if obs is not None:
            raise _bad(path, "ros2.observation", "is given beside [ros2.legged], which builds the observation "
                       "from the [legged] recipe", "drop one of them")
        obs, action_names = legged_observation(path, raw_ros2["legged"], legged)
        mode_topic = raw_ros2["legged"].get("mode", LEGGED_TOPICS["mode"])
        if not isinstance(mode_topic, str) or not mode_topic.startswith("/"):
            raise _bad(path, "ros2.legged.mode", f"invalid value {mode_topic!r}", 'use an absolute topic name')
        policy_topic = raw_ros2["legged"].get("policy_active", LEGGED_TOPICS["policy_active"])
        if not isinstance(policy_topic, str) or not policy_topic.startswith("/") or len(policy_topic) < 2:
            raise _bad(path, "ros2.legged.policy_active", f"invalid value {policy_topic!r}",
                       'use an absolute topic name, e.g. "/control_node/policy_active"')
        n_features = feature_names = None       # the node checks the recipe against its policy
        if (legged or {}).get("output", "torque") == "impedance":
            action_names = None                 # five rows per actuator: a Float64MultiArray only
    if not isinstance(obs, list) or not obs:
        raise _bad(path, "ros2.observation", "missing: no observation terms",
                   'add [[ros2.observation]] tables (topic, type, field), one per term, in the policy\'s order')
    terms = [_term(path, i, t, default_qos) for i, t in enumerate(obs)]
    for t in terms:                      # one topic, one type (a subscription has one type)
        first = next(u for u in terms if u.topic == t.topic)
        if first.type != t.type:
            raise _bad(path, f"{t.key}.type", f"topic {t.topic} is {first.type} in {first.key}, {t.type} here",
                       "use one type per topic")
    trigger = raw_ros2.get("trigger", terms[0].topic)
    if trigger not in {t.topic for t in terms}:
        raise _bad(path, "ros2.trigger", f"{trigger!r} is not the topic of any observation term",
                   f"use one of {sorted({t.topic for t in terms})}")
    width = sum(t.width for t in terms)
    if n_features is not None:
        if history < 1 or n_features % history:
            raise _bad(path, "policy.history", f"{history} does not divide the model's {n_features} inputs",
                       "fix [policy] history")
        want = n_features // history
        if width != want:
            detail = " + ".join(f"{t.width} ({t.topic} {t.field})" for t in terms)
            raise _bad(path, "ros2.observation", f"the terms give {width} values ({detail}), the model takes {want} "
                       f"per frame" + (f" ({n_features} / history {history})" if history > 1 else ""),
                       "add or remove terms (or joints) so they add up to the model's input width")
        if history == 1:
            _check_joint_names(path, terms, feature_names)
    action = None
    if "action" in raw_ros2:
        action = _action(path, raw_ros2["action"], action_names)
        if action.type != "std_msgs/msg/Float64MultiArray" and (not action.names or _default_names(action.names, "u")):
            raise _bad(path, "ros2.action.type", f"{action.type} names its joints, but the model has no action_names",
                       "import or train the model with action_names (joint names), or use std_msgs/msg/Float64MultiArray")
    name = raw_ros2.get("node_name", "control_node_bridge")
    if not isinstance(name, str) or not name.replace("_", "a").isalnum() or not name[0].isalpha():
        raise _bad(path, "ros2.node_name", f"invalid value {name!r}", "use letters, digits and '_', starting with a letter")
    return Recipe(domain_id=dom, trigger=trigger, max_age_ns=int(age * 1e6), terms=terms, action=action,
                  width=width, source=str(path), node_name=name,
                  mode_topic=mode_topic if "legged" in raw_ros2 else None,
                  policy_topic=policy_topic if "legged" in raw_ros2 else None)


def load_recipe(path, model=None, check_model=True) -> Recipe:
    """The ``[ros2]`` section of a config file, checked against ``model`` (default: ``[node] model``)."""
    from control_node.config import read_toml
    raw = read_toml(path)
    n_features = feature_names = action_names = None
    history = 1
    if "legged" in (raw.get("ros2") or {}):
        check_model = False         # a legged node's frame is the robot's signals: the node checks its policy
    if check_model:
        from control_node.kernels import ModelFileError, load_model
        model = model or (raw.get("node") or {}).get("model")
        if not model:
            raise _bad(path, "node.model", "missing", "name the model file the node runs: [node] model = \"...\"")
        try:
            spec = load_model(model)
        except (OSError, ModelFileError) as e:
            raise _bad(path, "node.model", f"cannot be read ({e})", "train or import the model first") from None
        if spec.head != "continuous":
            raise _bad(path, "node.model", "is an argmax policy (a class index): a ROS 2 command needs an action vector",
                       "run a continuous policy (control-node import, or train --task pendulum)")
        n_features, feature_names, action_names = spec.n_features, spec.feature_names, spec.action_names
        history = (raw.get("policy") or {}).get("history", 1)
        if not isinstance(history, int) or isinstance(history, bool) or history < 1:
            raise _bad(path, "policy.history", f"invalid value {history!r}", "use an integer >= 1")
    return parse_recipe(raw.get("ros2"), path, n_features, feature_names, action_names, history,
                        legged=raw.get("legged"))


# --- reading messages -------------------------------------------------------------------------------

def _get(msg, dotted):
    for part in dotted.split("."):
        msg = getattr(msg, part)
    return msg


def _finite(vals, term):
    for v in vals:
        if not math.isfinite(v):
            raise Refused("non_finite", f"{term.topic} {term.field}: {v}")
    return vals


def _gravity(q, term):
    x, y, z, w = q
    n = x * x + y * y + z * z + w * w
    if not n > 1e-12:
        raise Refused("zero_quaternion", f"{term.topic} orientation has norm {math.sqrt(n):g}")
    x, y, z, w = (v / math.sqrt(n) for v in q)
    # gravity (0, 0, -1) in the world frame, rotated into the body frame: R(q)^T (0, 0, -1)
    return [-2.0 * (x * z - w * y), -2.0 * (y * z + w * x), -(1.0 - 2.0 * (x * x + y * y))]


def read_term(term: Term, msg, out: np.ndarray) -> None:
    """Write ``term.width`` values of ``msg`` into ``out``, or raise :class:`Refused`."""
    try:
        if term.kind == JOINTS:
            names = list(msg.name)
            arr = _get(msg, term.field)
            if len(arr) < len(names):
                raise Refused("short_array", f"{term.topic} {term.field} has {len(arr)} values for {len(names)} names")
            where = {n: k for k, n in enumerate(names)}
            vals = []
            for j in term.joints:
                k = where.get(j)
                if k is None:
                    raise Refused("missing_joint", f"{term.topic} has no joint {j!r}")
                vals.append(float(arr[k]))
            _finite(vals, term)
            if term.encode == "cos_sin":
                vals = [f(v) for v in vals for f in (math.cos, math.sin)]
        elif term.kind in COMPONENTS:
            v = _get(msg, term.field)
            vals = _finite([float(getattr(v, c)) for c in COMPONENTS[term.kind]], term)
        elif term.kind == GRAVITY:
            v = msg.orientation
            vals = _gravity(_finite([float(v.x), float(v.y), float(v.z), float(v.w)], term), term)
        elif term.kind == ARRAY:
            data = msg.data
            if len(data) != term.size:
                raise Refused("wrong_length", f"{term.topic} data has {len(data)} values, size is {term.size}")
            vals = _finite([float(v) for v in data], term)
        else:                                  # a scalar field, or one component ("angular.z")
            vals = _finite([float(_get(msg, term.field))], term)
    except (AttributeError, TypeError, ValueError) as e:     # a message of another shape than its type says
        raise Refused("bad_message", f"{term.topic}: {e}") from None
    v = np.asarray(vals, dtype=np.float64)
    if term.offset is not None:
        v = v - term.offset
    if term.scale is not None:
        v = v * term.scale
    out[:] = v


class FrameAssembler:
    """The newest valid value of each term, and the frames a trigger makes of them.

    ``on_message(topic, msg, now_ns)`` returns the frame's values (a new float64 array) when the message is on
    the trigger topic and every term is valid and fresh, else None; counters say why not. Plain time in,
    so its rules are tested with made-up times.
    """

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.by_topic = {}
        for t in recipe.terms:
            self.by_topic.setdefault(t.topic, []).append(t)
        self.values = [np.zeros(t.width) for t in recipe.terms]
        self.valid = [False] * len(recipe.terms)
        self.received_ns = [-1] * len(recipe.terms)
        self.invalid_reason = [None] * len(recipe.terms)
        self.messages = {topic: 0 for topic in self.by_topic}
        self.messages_refused = {r: 0 for r in REASONS}
        self.frames_withheld = {r: 0 for r in REASONS}
        self.frames = 0
        self.last_refusal = None

    def on_message(self, topic, msg, now_ns):
        terms = self.by_topic.get(topic)
        if terms is None:
            return None
        self.messages[topic] += 1
        refused = None
        for t in terms:
            try:
                read_term(t, msg, self.values[t.index])
                self.valid[t.index] = True
                self.received_ns[t.index] = now_ns
                self.invalid_reason[t.index] = None
            except Refused as e:
                self.valid[t.index] = False
                self.invalid_reason[t.index] = e.reason
                refused = refused or e
        if refused is not None:
            self.messages_refused[refused.reason] += 1
            self.last_refusal = str(refused)
        if topic != self.recipe.trigger:
            return None
        reason = self.check(now_ns)
        if reason is not None:
            self.frames_withheld[reason] += 1
            return None
        self.frames += 1
        return np.concatenate(self.values)

    def check(self, now_ns):
        """None when every term is valid and fresh at ``now_ns``, else the reason (one of REASONS)."""
        for t in self.recipe.terms:
            i = t.index
            if not self.valid[i]:
                return self.invalid_reason[i] or "never_received"
            if now_ns - self.received_ns[i] > self.recipe.max_age_ns:
                return "stale_term"
        return None

    def counters(self) -> dict:
        return {"frames_sent": self.frames, "messages": dict(self.messages),
                "messages_refused": {k: v for k, v in self.messages_refused.items() if v},
                "frames_withheld": {k: v for k, v in self.frames_withheld.items() if v}}
