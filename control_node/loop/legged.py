"""Legged-robot deploy path, built off the RT thread: the observation recipe and the actuator as plans for the
two C units (``obs_terms.h``, ``actuator.h``, wrapped by ``_legged.pyx``), and a plain numpy reference of each
(``reference_obs``, ``reference_actuator``, ``reference_request``) that tests/test_legged_units.py matches
step by step against the compiled units (issue 45, sections 1-3).

Every check happens here, once, before anything runs: a bad recipe is refused with a :class:`RecipeError`
naming the key and the fix. The compiled units trust the plan and check nothing per call.

The recipe (a dict, e.g. read from TOML or a model file's deploy contract)
---------------------------------------------------------------------------
::

    {
      "joints": {
        "policy": ["FL_hip", ...],      # the policy's joint order (its action and its joint terms)
        "robot": ["FR_hip", ...],       # the robot's sensor order: joint_pos / joint_vel slots in a frame
        "actuators": [...],             # optional: the output order (default: "robot"); must hold exactly the
      },                                #   policy's joints (joints are matched by NAME, never by index)
      "default_pos": [...],             # q0 per policy joint (a number: the same for all)
      "policy_dt": 0.02,                # seconds per policy tick (the gait clock's time base)
      "observation": {
        "terms": [                      # concatenated in this order
          {"kind": "gyro", "scale": 0.25, "history": 5},
          {"kind": "projected_gravity"},
          {"kind": "command", "scale": [2, 2, 0.25]},
          {"kind": "joint_pos_rel"}, {"kind": "joint_vel", "scale": 0.05}, {"kind": "last_action"},
          {"kind": "gait_clock", "period": 0.8, "form": "sin_cos"},
        ],
        "quat_order": "wxyz",           # "wxyz" (MuJoCo, Unitree) or "xyzw" (ROS): required with
                                        #   projected_gravity, never guessed
        "n_commands": 3,                # required with a command term
        "history": {"layout": "term", "fill": "first", "length": 1, "order": "oldest_first"},
        "clip_stage": "before_scale",   # IsaacLab; "after_scale": legged_gym / rl_sar / humanoid-gym
        "first_tick": 1,                # the gait clock's k on the first policy tick after entry
      },
      "action": {"scale": 0.25, "clip_to_limits": False},    # q* = q0 + scale * a, per joint allowed
      "actuator": {"kp": [...], "kd": [...], "tau_max": [...], "tau_ff": 0,
                   "q_lo": [...], "q_hi": [...],              # needed by clip_to_limits
                   "rate_limit": None, "velocity_limit": None,  # opt-in (rad/s per joint); counted when acting
                   "period": 0.001, "stale_after": 0.1,         # loop period; the watchdog's limit (s)
                   "pd_max_age": 0.005, "pd_ramp": 0.05},       # the PD's own frame-age limit, ramp to 0 (s)
      "modes": {"damping_kd": [...], "stand_kp": [...], "stand_kd": [...], "stand_time": 2.0,
                "stand_tolerance": 0.1, "policy_without_stand": False, "on_stale": "damping"},
    }

Term kinds (width): ``joint_pos_rel`` q - q0 (policy joints), ``joint_vel`` q̇ (policy joints), ``gyro``
(3, alias ``base_ang_vel``: the IMU must sit on the base), ``projected_gravity`` (3), ``accelerometer`` (3),
``command`` (n_commands, alias ``velocity_commands``), ``last_action`` (the policy's previous RAW output, zeros
after entry; alias ``actions``), ``gait_clock`` (``form`` "sin_cos": [sin 2πφ, cos 2πφ]; "two_leg":
[cos 2πφ0, cos 2πφ1, sin 2πφ0, sin 2πφ1]; ``period`` T in s; ``offsets`` per leg in periods, default [0] /
[0, 0.5]; φ = (k·policy_dt mod T)/T with k counting policy ticks since entry, from ``first_tick``),
``constant`` (``values``). Each term takes ``scale`` and ``offset`` (a number or one per value), ``clip``
([lo, hi], or [[lo...], [hi...]]), ``clip_stage`` (overrides the observation's), ``history`` (term-major only:
frames kept, 0 or 1 = none) and a ``name``.

Per value, in IsaacLab's order (ObservationManager: func, modifiers, noise, clip, scale): ``v = raw - offset``
(where IsaacLab's modifiers stand), then the clip, then the scale (``clip_stage = "after_scale"`` swaps the
last two, as legged_gym and rl_sar clip the scaled observation).

History: ``layout`` "term" (IsaacLab, unitree_rl_lab: each term's frames oldest to newest, then the next term)
or "frame" (humanoid-gym, rl_sar "time": ``length`` whole frames); ``order`` "oldest_first" (IsaacLab,
humanoid-gym) or "newest_first" (rl_sar's ``observations_history: [0, 1, ...]``); ``fill`` "first" (IsaacLab's
CircularBuffer: the first observation after entry fills every slot) or "zeros".

Modes: passive (no command, zero torque), damping (kp = 0, kd = damping_kd), stand (a linear ramp over
stand_time from the MEASURED pose at entry to q0 with the stand gains; done at once when within
stand_tolerance of q0), policy (refused until stand completed unless policy_without_stand). Stale input
(frame age > stale_after) in stand or policy -> damping (``on_stale = "hold"``: keep the mode and the held
target); a non-finite action -> damping; the velocity guard -> damping.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from control_node.errors import UserError

TERM_KINDS = {"joint_pos_rel": 1, "joint_vel": 2, "gyro": 3, "projected_gravity": 4, "command": 5,
              "last_action": 6, "gait_clock": 7, "constant": 8, "accelerometer": 9}
ALIASES = {"base_ang_vel": "gyro", "velocity_commands": "command", "joint_vel_rel": "joint_vel",
           "actions": "last_action", "gait_phase": "gait_clock"}
TERM_KEYS = {"kind", "name", "scale", "offset", "clip", "clip_stage", "history", "period", "form", "offsets",
             "values"}
QUAT_ORDERS = {"wxyz": 0, "xyzw": 1}
LAYOUTS = {"term": 0, "frame": 1}
FILLS = {"first": 0, "zeros": 1}
CLIP_STAGES = {"before_scale": 0, "after_scale": 1}
ORDERS = {"oldest_first": 0, "newest_first": 1}
CLOCK_FORMS = {"sin_cos": 0, "two_leg": 1}
# obs_terms.h's term table columns
T_KIND, T_WIDTH, T_HIST, T_ELEM, T_PARAM, T_CLIP_STAGE, T_FORM, T_OUT, TERM_FIELDS = range(9)

MODES = ("passive", "damping", "stand", "policy")
PASSIVE, DAMPING, STAND, POLICY = range(4)
REASONS = ("request", "stale", "non_finite", "velocity_guard")
WHY_REQUEST, WHY_STALE, WHY_NON_FINITE, WHY_VELOCITY_GUARD = range(4)
REQ_OK, REQ_NO_STAND, REQ_BAD_MODE = range(3)
REQ_NAMES = ("ok", "stand_not_done", "bad_mode")
#: what the node publishes each tick (LeggedCycle): the actuators' torques, their position targets, or the
#: impedance command (q*, qd*, kp, kd, tau_ff: rows of n_out, as Unitree's low-level command takes them)
OUTPUTS = ("torque", "position", "impedance")
OUTPUT_ROWS = {"torque": 1, "position": 1, "impedance": 5}
#: the frame of a legged node: the robot's named raw signals, in this order (joint_pos and joint_vel by
#: joints.robot's names and order; the quaternion in observation.quat_order; the command's n_commands values)
SIGNALS = ("joint_pos", "joint_vel", "imu_quat", "imu_gyro", "imu_acc", "command")
NO_COMMAND, RAMPING = 16, 32
# actuator.h's per-joint rows and output rows
J_FIELDS = ("default", "scale", "kp", "kd", "tau_max", "q_lo", "q_hi", "damping_kd", "stand_kp", "stand_kd",
            "rate_limit", "velocity_limit", "tau_ff")
OUT_ROWS = ("q", "qd", "kp", "kd", "tau_ff", "tau")
TR_CAP = 64     # transitions the caller has not drained, at most (more are counted as dropped)

TOP_KEYS = {"joints", "default_pos", "policy_dt", "observation", "action", "actuator", "modes"}
OBS_KEYS = {"terms", "quat_order", "n_commands", "history", "clip_stage", "first_tick"}
ACTION_KEYS = {"scale", "clip_to_limits"}
ACTUATOR_KEYS = {"kp", "kd", "tau_max", "tau_ff", "q_lo", "q_hi", "rate_limit", "velocity_limit", "period",
                 "stale_after", "pd_max_age", "pd_ramp"}
MODES_KEYS = {"damping_kd", "stand_kp", "stand_kd", "stand_time", "stand_tolerance", "policy_without_stand",
              "on_stale"}


class RecipeError(UserError):
    """A recipe the node cannot run: ``key`` names the offending entry (dotted, e.g. ``actuator.kp``)."""

    def __init__(self, key, problem, fix):
        self.key = key
        super().__init__(f"recipe key '{key}': {problem}. Fix: {fix}")


# ---- validation helpers -----------------------------------------------------------------------------------

def _section(d, key, allowed, required=False):
    sub = d.get(key.rsplit(".", 1)[-1])
    if sub is None:
        if required:
            raise RecipeError(key, "missing", f"add a '{key}' table")
        return {}
    if not isinstance(sub, dict):
        raise RecipeError(key, f"is a {type(sub).__name__}, not a table", f"make '{key}' a table (dict)")
    _no_unknown(sub, allowed, key)
    return sub


def _no_unknown(d, allowed, where):
    for k in d:
        if k not in allowed:
            raise RecipeError(f"{where}.{k}" if where else k, "unknown key",
                              f"remove it or use one of {sorted(allowed)}")


def _names(v, key):
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, str) and x for x in v):
        raise RecipeError(key, "is not a non-empty list of joint names", f"list the names in '{key}'")
    seen = set()
    for i, x in enumerate(v):
        if x in seen:
            raise RecipeError(f"{key}[{i}]", f"joint '{x}' is listed twice", "name each joint once")
        seen.add(x)
    return list(v)


def _number(v, key, *, lo=None, positive=False, integer=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RecipeError(key, f"{v!r} is not a finite number", f"give '{key}' a number")
    if integer and int(v) != v:
        raise RecipeError(key, f"{v!r} is not a whole number", f"give '{key}' an integer")
    if positive and v <= 0:
        raise RecipeError(key, f"{v!r} is not > 0", f"give '{key}' a positive value")
    if lo is not None and v < lo:
        raise RecipeError(key, f"{v!r} is below {lo}", f"give '{key}' a value >= {lo}")
    return int(v) if integer else float(v)


def _per(v, n, key, what, *, nonneg=False, allow_inf=False):
    """A number (the same for all n) or exactly n numbers."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * n
    if not isinstance(v, (list, tuple, np.ndarray)):
        raise RecipeError(key, f"{v!r} is neither a number nor a list", f"give '{key}' a number or {n} numbers")
    if len(v) != n:
        raise RecipeError(key, f"has {len(v)} values, {what} has {n}",
                          f"give '{key}' exactly {n} values (in the order of {what}) or one number for all")
    a = np.empty(n)
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
            raise RecipeError(f"{key}[{i}]", f"{x!r} is not a number", "give a number")
        if not (math.isfinite(x) or (allow_inf and not math.isnan(x))):
            raise RecipeError(f"{key}[{i}]", f"{x!r} is not finite", "give a finite number")
        if nonneg and x < 0:
            raise RecipeError(f"{key}[{i}]", f"{x!r} is negative", "give a value >= 0")
        a[i] = float(x)
    return a


def _choice(v, table, key, default):
    if v is None:
        v = default
    if v not in table:
        raise RecipeError(key, f"{v!r} is not one of {sorted(table)}", f"set '{key}' to one of {sorted(table)}")
    return table[v]


# ---- the observation plan ---------------------------------------------------------------------------------

@dataclass
class ObsPlan:
    """What obs_terms.h runs (arrays of ints and doubles) and what reference_obs reads (``specs``)."""
    terms: np.ndarray           # int32 (n_terms, TERM_FIELDS)
    joint_map: np.ndarray       # int32 (n_joints,): policy joint i -> robot joint slot
    q0: np.ndarray
    scale: np.ndarray           # frame_width each
    offset: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    params: np.ndarray
    n_robot: int
    n_joints: int
    n_cmd: int
    n_act: int
    quat_order: int
    layout: int
    fill: int
    frame_hist: int
    frame_width: int
    out_width: int
    k0: int
    policy_dt: float
    newest_first: int = 0
    specs: list = field(default_factory=list)     # per term: a dict of its kind name, width, history, params
    uses: frozenset = frozenset()                   # the signals the terms read


def _sensor_map(recipe):
    """Policy joint i -> the robot's sensor slot, by name."""
    j = _section(recipe, "joints", {"policy", "robot", "actuators"}, required=True)
    policy = _names(j.get("policy"), "joints.policy")
    robot = _names(j.get("robot"), "joints.robot")
    where = {name: i for i, name in enumerate(robot)}
    sens = []
    for i, name in enumerate(policy):
        if name not in where:
            raise RecipeError(f"joints.policy[{i}]", f"the robot has no joint '{name}' (joints.robot: {robot})",
                              "name the joint as the robot does, or add it to joints.robot")
        sens.append(where[name])
    return j, policy, robot, np.asarray(sens, np.int32)


def _joint_maps(recipe):
    """The sensor map and policy joint i -> the output (actuator) slot, by name."""
    j, policy, robot, sens = _sensor_map(recipe)
    acts = _names(j["actuators"], "joints.actuators") if "actuators" in j else robot
    akey = "joints.actuators" if "actuators" in j else "joints.robot"
    awhere = {name: i for i, name in enumerate(acts)}
    out = []
    for i, name in enumerate(policy):
        if name not in awhere:
            raise RecipeError(akey, f"no actuator for the policy's joint '{name}'",
                              f"list '{name}' among the actuators")
        out.append(awhere[name])
    extra = sorted(set(acts) - set(policy))
    if extra:
        raise RecipeError(akey, f"actuators {extra} are not joints of the policy (holding joints the policy does "
                          "not drive is not supported yet)", "list only the policy's joints as actuators "
                          "(joints.actuators)")
    return policy, robot, acts, sens, np.asarray(out, np.int32)


def build_obs_plan(recipe: dict, n_inputs: int | None = None) -> ObsPlan:
    """The observation plan for ``recipe``; ``n_inputs``: the model's input width (checked)."""
    _no_unknown(recipe, TOP_KEYS, "")
    _, policy, robot, sens = _sensor_map(recipe)
    nj = len(policy)
    q0 = _per(recipe.get("default_pos", 0.0), nj, "default_pos", "joints.policy")
    ob = _section(recipe, "observation", OBS_KEYS, required=True)
    terms = ob.get("terms")
    if not isinstance(terms, list) or not terms:
        raise RecipeError("observation.terms", "is not a non-empty list of terms", "list the observation terms")
    hist = ob.get("history", {})
    if not isinstance(hist, dict):
        raise RecipeError("observation.history", "is not a table", "give layout / fill / length")
    _no_unknown(hist, {"layout", "fill", "length", "order"}, "observation.history")
    newest_first = _choice(hist.get("order"), ORDERS, "observation.history.order", "oldest_first")
    layout = _choice(hist.get("layout"), LAYOUTS, "observation.history.layout", "term")
    fill = _choice(hist.get("fill"), FILLS, "observation.history.fill", "first")
    frame_hist = _number(hist.get("length", 1), "observation.history.length", lo=1, integer=True)
    if layout == LAYOUTS["term"] and frame_hist != 1:
        raise RecipeError("observation.history.length", "is for the frame layout; the term layout gives each "
                          "term its own 'history'", "set observation.terms[i].history, or layout = \"frame\"")
    stage_default = ob.get("clip_stage", "before_scale")
    _choice(stage_default, CLIP_STAGES, "observation.clip_stage", "before_scale")
    k0 = _number(ob.get("first_tick", 1), "observation.first_tick", integer=True)
    dt = _number(recipe.get("policy_dt", 0.02), "policy_dt", positive=True)
    n_act = nj
    kinds = [ALIASES.get(t.get("kind"), t.get("kind")) if isinstance(t, dict) else None for t in terms]
    n_cmd = 0
    if "command" in kinds:
        if "n_commands" not in ob:
            raise RecipeError("observation.n_commands", "missing: a command term needs the command's width",
                              "set n_commands (e.g. 3 for vx, vy, yaw rate)")
        n_cmd = _number(ob["n_commands"], "observation.n_commands", lo=1, integer=True)
    quat_order = 0
    if "projected_gravity" in kinds:
        if "quat_order" not in ob:
            raise RecipeError("observation.quat_order", "missing: projected_gravity needs the quaternion's "
                              "component order, which is never guessed",
                              "set \"wxyz\" (MuJoCo, Unitree) or \"xyzw\" (ROS sensor_msgs/Imu, scipy)")
        quat_order = _choice(ob["quat_order"], QUAT_ORDERS, "observation.quat_order", None)
    rows, specs, scale, offset, lo, hi, params = [], [], [], [], [], [], []
    elem = out = 0
    uses = set()
    for ti, t in enumerate(terms):
        key = f"observation.terms[{ti}]"
        if not isinstance(t, dict):
            raise RecipeError(key, "is not a table", "give each term as a table with a 'kind'")
        _no_unknown(t, TERM_KEYS, key)
        kind = kinds[ti]
        if kind not in TERM_KINDS:
            raise RecipeError(f"{key}.kind", f"unknown term {t.get('kind')!r}",
                              f"use one of {sorted(TERM_KINDS)} (or an alias: {sorted(ALIASES)})")
        form, par = 0, []
        if kind in ("joint_pos_rel", "joint_vel"):
            w = nj
            uses.add("joint_pos" if kind == "joint_pos_rel" else "joint_vel")
        elif kind in ("gyro", "projected_gravity", "accelerometer"):
            w = 3
            uses.add({"gyro": "gyro", "projected_gravity": "quat", "accelerometer": "acc"}[kind])
        elif kind == "command":
            w = n_cmd
            uses.add("command")
        elif kind == "last_action":
            w = n_act
        elif kind == "gait_clock":
            form = _choice(t.get("form"), CLOCK_FORMS, f"{key}.form", "sin_cos")
            w = 2 if form == 0 else 4
            if "period" not in t:
                raise RecipeError(f"{key}.period", "missing", "give the gait period in seconds (e.g. 0.8)")
            period = _number(t["period"], f"{key}.period", positive=True)
            offs = _per(t.get("offsets", [0.0] if form == 0 else [0.0, 0.5]), 1 if form == 0 else 2,
                        f"{key}.offsets", "the clock's legs")
            par = [period, float(offs[0]), float(offs[1]) if form == 1 else 0.0]
        else:
            vals = t.get("values")
            if not isinstance(vals, (list, tuple)) or not vals:
                raise RecipeError(f"{key}.values", "missing or empty", "give the constant's values as a list")
            par = list(_per(vals, len(vals), f"{key}.values", "the constant"))
            w = len(par)
        for k in ("period", "form", "offsets"):
            if k in t and kind != "gait_clock":
                raise RecipeError(f"{key}.{k}", f"is for gait_clock terms, not {kind}", f"remove '{k}'")
        if "values" in t and kind != "constant":
            raise RecipeError(f"{key}.values", f"is for constant terms, not {kind}", "remove 'values'")
        what = f"term {kind} ({w} values)"
        sc = _per(t.get("scale", 1.0), w, f"{key}.scale", what)
        of = _per(t.get("offset", 0.0), w, f"{key}.offset", what)
        clip = t.get("clip")
        if clip is None:
            cl, ch = np.full(w, -np.inf), np.full(w, np.inf)
        else:
            if not isinstance(clip, (list, tuple)) or len(clip) != 2:
                raise RecipeError(f"{key}.clip", f"{clip!r} is not [lo, hi]", "give [lo, hi] (numbers or lists)")
            cl = _per(clip[0], w, f"{key}.clip[0]", what, allow_inf=True)
            ch = _per(clip[1], w, f"{key}.clip[1]", what, allow_inf=True)
            if (cl > ch).any():
                raise RecipeError(f"{key}.clip", "a lower bound is above its upper bound", "give lo <= hi")
        h = _number(t.get("history", 0), f"{key}.history", lo=0, integer=True)
        if layout == LAYOUTS["frame"] and h > 1:
            raise RecipeError(f"{key}.history", "per-term history is for the term layout",
                              "set observation.history.length for the frame layout, or layout = \"term\"")
        h = max(1, h)
        stage = _choice(t.get("clip_stage", stage_default), CLIP_STAGES,
                        f"{key}.clip_stage" if "clip_stage" in t else "observation.clip_stage", None)
        rows.append([TERM_KINDS[kind], w, h, elem, len(params), stage, form, out])
        specs.append({"kind": kind, "name": t.get("name", kind), "width": w, "history": h, "elem": elem,
                      "out": out, "params": list(par), "form": form, "stage": stage})
        params += par
        scale.append(sc), offset.append(of), lo.append(cl), hi.append(ch)
        elem += w
        out += w * h
    frame_width = elem
    out_width = out if layout == LAYOUTS["term"] else frame_width * frame_hist
    if n_inputs is not None and out_width != n_inputs:
        parts = ", ".join(f"{s['name']} {s['width']}x{s['history']}" for s in specs)
        if layout == LAYOUTS["frame"]:
            parts = f"({parts}) x {frame_hist} frames"
        raise RecipeError("observation.terms", f"the terms add up to {out_width} inputs ({parts}); the model takes "
                          f"{n_inputs}", "add, remove or resize terms (history, n_commands, joints) until the widths "
                          "add up to the model's input")
    return ObsPlan(terms=np.asarray(rows, np.int32).reshape(-1, TERM_FIELDS), joint_map=sens, q0=q0,
                   scale=np.concatenate(scale), offset=np.concatenate(offset), lo=np.concatenate(lo),
                   hi=np.concatenate(hi), params=np.asarray(params + [0.0], np.float64), n_robot=len(robot),
                   n_joints=nj, n_cmd=n_cmd, n_act=n_act, quat_order=quat_order, layout=layout, fill=fill,
                   frame_hist=frame_hist, frame_width=frame_width, out_width=out_width, k0=k0, policy_dt=dt,
                   newest_first=newest_first, specs=specs, uses=frozenset(uses))


# ---- the actuator plan ------------------------------------------------------------------------------------

@dataclass
class ActuatorPlan:
    """What actuator.h runs. ``j``: the per-joint rows (J_FIELDS) in the policy's joint order."""
    n: int
    n_robot: int
    n_out: int
    sens_map: np.ndarray        # int32 (n,): policy joint i -> robot sensor slot
    out_map: np.ndarray         # int32 (n,): policy joint i -> output (actuator) slot
    j: np.ndarray               # float64 (len(J_FIELDS), n)
    clip_target: bool
    rate_limit: bool
    vel_guard: bool
    policy_without_stand: bool
    stale_hold: bool
    period_ns: int
    stale_after_ns: int
    pd_max_age_ns: int
    pd_ramp_ns: int
    stand_ns: int
    stand_tol: float
    policy_joints: list = field(default_factory=list)
    out_joints: list = field(default_factory=list)

    def row(self, name):
        return self.j[J_FIELDS.index(name)]


def _ns(v, key, default, *, positive=False):
    return int(round(_number(v if v is not None else default, key, lo=0, positive=positive) * 1e9))


def build_actuator_plan(recipe: dict, n_outputs: int | None = None) -> ActuatorPlan:
    """The actuator plan for ``recipe``; ``n_outputs``: the model's action width (checked)."""
    _no_unknown(recipe, TOP_KEYS, "")
    policy, robot, acts, sens, outm = _joint_maps(recipe)
    n = len(policy)
    if n_outputs is not None and n_outputs != n:
        raise RecipeError("joints.policy", f"lists {n} joints; the model gives {n_outputs} actions",
                          "list one joint per action, in the policy's order")
    what = "joints.policy"
    q0 = _per(recipe.get("default_pos", 0.0), n, "default_pos", what)
    ac = _section(recipe, "action", ACTION_KEYS)
    scale = _per(ac.get("scale", 1.0), n, "action.scale", what)
    clip_target = bool(ac.get("clip_to_limits", False))
    at = _section(recipe, "actuator", ACTUATOR_KEYS, required=True)
    for k in ("kp", "kd", "tau_max"):
        if k not in at:
            raise RecipeError(f"actuator.{k}", "missing", f"give the training {k} per joint (policy order)")
    kp = _per(at["kp"], n, "actuator.kp", what, nonneg=True)
    kd = _per(at["kd"], n, "actuator.kd", what, nonneg=True)
    tau_max = _per(at["tau_max"], n, "actuator.tau_max", what, nonneg=True)
    tau_ff = _per(at.get("tau_ff", 0.0), n, "actuator.tau_ff", what)
    if clip_target and ("q_lo" not in at or "q_hi" not in at):
        raise RecipeError("actuator.q_lo" if "q_lo" not in at else "actuator.q_hi",
                          "missing: action.clip_to_limits needs the joint limits", "give q_lo and q_hi per joint")
    q_lo = _per(at.get("q_lo", -np.inf), n, "actuator.q_lo", what, allow_inf=True)
    q_hi = _per(at.get("q_hi", np.inf), n, "actuator.q_hi", what, allow_inf=True)
    if (q_lo > q_hi).any():
        i = int(np.flatnonzero(q_lo > q_hi)[0])
        raise RecipeError(f"actuator.q_lo[{i}]", f"is above actuator.q_hi[{i}]", "give q_lo <= q_hi")
    rate = at.get("rate_limit")
    vel = at.get("velocity_limit")
    rate_a = _per(rate, n, "actuator.rate_limit", what, nonneg=True) if rate is not None else np.full(n, np.inf)
    vel_a = _per(vel, n, "actuator.velocity_limit", what, nonneg=True) if vel is not None else np.full(n, np.inf)
    period_ns = _ns(at.get("period"), "actuator.period", 0.001, positive=True)
    stale_ns = _ns(at.get("stale_after"), "actuator.stale_after", 0.1, positive=True)
    age_ns = _ns(at.get("pd_max_age"), "actuator.pd_max_age", 0.005)
    ramp_ns = _ns(at.get("pd_ramp"), "actuator.pd_ramp", 0.05)
    if age_ns >= stale_ns:
        raise RecipeError("actuator.pd_max_age", f"{age_ns / 1e9} s is not shorter than actuator.stale_after "
                          f"({stale_ns / 1e9} s)", "give the PD a frame-age limit shorter than the watchdog's")
    mo = _section(recipe, "modes", MODES_KEYS)
    damp = _per(mo.get("damping_kd", kd), n, "modes.damping_kd", what, nonneg=True)
    skp = _per(mo.get("stand_kp", kp), n, "modes.stand_kp", what, nonneg=True)
    skd = _per(mo.get("stand_kd", kd), n, "modes.stand_kd", what, nonneg=True)
    stand_ns = _ns(mo.get("stand_time"), "modes.stand_time", 2.0)
    tol = _number(mo.get("stand_tolerance", 0.1), "modes.stand_tolerance", lo=0)
    on_stale = _choice(mo.get("on_stale"), {"damping": 0, "hold": 1}, "modes.on_stale", "damping")
    j = np.stack([q0, scale, kp, kd, tau_max, q_lo, q_hi, damp, skp, skd, rate_a, vel_a, tau_ff])
    return ActuatorPlan(n=n, n_robot=len(robot), n_out=len(acts), sens_map=sens, out_map=outm,
                        j=np.ascontiguousarray(j), clip_target=clip_target, rate_limit=rate is not None,
                        vel_guard=vel is not None, policy_without_stand=bool(mo.get("policy_without_stand", False)),
                        stale_hold=bool(on_stale), period_ns=period_ns, stale_after_ns=stale_ns,
                        pd_max_age_ns=age_ns, pd_ramp_ns=ramp_ns, stand_ns=stand_ns, stand_tol=tol,
                        policy_joints=policy, out_joints=list(acts))


def frame_layout(plan: "ObsPlan") -> list:
    """[(signal, offset, width)] of a legged node's frame (:data:`SIGNALS`): every signal is sent, whether or
    not a term reads it, so one layout serves every recipe of the same robot."""
    widths = (plan.n_robot, plan.n_robot, 4, 3, 3, plan.n_cmd)
    out, at = [], 0
    for name, w in zip(SIGNALS, widths):
        out.append((name, at, w))
        at += w
    return out


def build_plans(recipe: dict, n_inputs: int | None = None, n_outputs: int | None = None):
    """(ObsPlan, ActuatorPlan) for ``recipe``, checked against the model's input and output widths."""
    return build_obs_plan(recipe, n_inputs), build_actuator_plan(recipe, n_outputs)


# ---- the numpy reference of obs_terms.h -------------------------------------------------------------------

class ObsRefState:
    """What the reference carries across policy ticks (obs_terms.h's cn_obs_state)."""

    def __init__(self, plan: ObsPlan):
        self.plan = plan
        self.reset()

    def reset(self):
        self.last_action = np.zeros(self.plan.n_act)
        self.history = None           # term layout: one list of frames per term; frame layout: one list
        self.k = 0

    def note_action(self, u):
        self.last_action = np.array(u, dtype=np.float64)


def projected_gravity(quat, order="wxyz"):
    """R^T [0, 0, -1] for the body-to-world rotation R of ``quat`` (normalised)."""
    q = np.asarray(quat, dtype=np.float64)
    w, x, y, z = q if order == "wxyz" else (q[3], q[0], q[1], q[2])
    n = math.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / n, x / n, y / n, z / n
    R = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                  [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                  [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
    return R.T @ np.array([0.0, 0.0, -1.0])


def _raw_term(plan, spec, signals, state):
    kind = spec["kind"]
    if kind == "joint_pos_rel":
        return np.asarray(signals["joint_pos"])[plan.joint_map] - plan.q0
    if kind == "joint_vel":
        return np.asarray(signals["joint_vel"])[plan.joint_map]
    if kind == "gyro":
        return np.asarray(signals["gyro"], dtype=np.float64)
    if kind == "accelerometer":
        return np.asarray(signals["acc"], dtype=np.float64)
    if kind == "projected_gravity":
        return projected_gravity(signals["quat"], "wxyz" if plan.quat_order == 0 else "xyzw")
    if kind == "command":
        return np.asarray(signals["command"], dtype=np.float64)
    if kind == "last_action":
        return state.last_action.copy()
    if kind == "constant":
        return np.array(spec["params"])
    period, o0, o1 = spec["params"]
    k = plan.k0 + state.k
    phi = math.fmod(k * plan.policy_dt, period) / period
    p0 = (phi + o0) % 1.0
    if spec["form"] == CLOCK_FORMS["sin_cos"]:
        return np.array([math.sin(2 * math.pi * p0), math.cos(2 * math.pi * p0)])
    p1 = (phi + o1) % 1.0
    return np.array([math.cos(2 * math.pi * p0), math.cos(2 * math.pi * p1),
                     math.sin(2 * math.pi * p0), math.sin(2 * math.pi * p1)])


def _fill(v, h, fill):
    return [v.copy() for _ in range(h)] if fill == FILLS["first"] else \
        [np.zeros_like(v) for _ in range(h - 1)] + [v.copy()]


def _ordered(plan, frames):
    """The frames (kept oldest first) in the plan's history order."""
    return frames[::-1] if plan.newest_first else frames


def reference_obs(plan: ObsPlan, signals: dict, state: ObsRefState) -> np.ndarray:
    """One policy tick of obs_terms.h in plain numpy: the policy input; advances ``state``."""
    frame = []
    for spec in plan.specs:
        e = slice(spec["elem"], spec["elem"] + spec["width"])
        v = _raw_term(plan, spec, signals, state) - plan.offset[e]
        if spec["stage"] == CLIP_STAGES["before_scale"]:
            v = np.clip(v, plan.lo[e], plan.hi[e]) * plan.scale[e]
        else:
            v = np.clip(v * plan.scale[e], plan.lo[e], plan.hi[e])
        frame.append(v)
    if plan.layout == LAYOUTS["term"]:
        if state.history is None:
            state.history = [_fill(v, s["history"], plan.fill) for v, s in zip(frame, plan.specs)]
        else:
            for frames, v in zip(state.history, frame):
                frames.pop(0)
                frames.append(v)
        out = np.concatenate([f for frames in state.history for f in _ordered(plan, frames)])
    else:
        whole = np.concatenate(frame)
        if state.history is None:
            state.history = _fill(whole, plan.frame_hist, plan.fill)
        else:
            state.history.pop(0)
            state.history.append(whole)
        out = np.concatenate(_ordered(plan, state.history))
    state.k += 1
    return out


# ---- the numpy reference of actuator.h --------------------------------------------------------------------

class ActRefState:
    """What the reference actuator carries across ticks (actuator.h's cn_act_state)."""

    def __init__(self, plan: ActuatorPlan):
        n = plan.n
        self.q_goal, self.q_cmd, self.q_start = np.zeros(n), np.zeros(n), np.zeros(n)
        self.q_last, self.tau_fresh = np.zeros(n), np.zeros(n)
        self.mode, self.stand_done, self.stand_fresh = PASSIVE, False, False
        self.stand_t0, self.t_prev, self.cycle = 0, None, 0
        self.transitions = []
        self.counts = dict.fromkeys(("rate_limited", "velocity_guard", "tau_clipped", "pd_ramp_ticks",
                                     "stale_trips", "non_finite_trips", "refused"), 0)


def _enter(plan, st, to, why, t_ns):
    st.transitions.append((st.cycle, t_ns, st.mode, to, why))
    st.mode = to
    if to in (PASSIVE, DAMPING):
        st.stand_done = False
    elif to == STAND:
        st.stand_done, st.stand_fresh = False, True
    else:
        st.q_goal = plan.row("default").copy()
        st.q_cmd = st.q_last.copy() if plan.rate_limit else st.q_goal.copy()


def reference_request(plan: ActuatorPlan, st: ActRefState, mode: int, t_ns: int) -> int:
    """A mode request: REQ_OK, or REQ_NO_STAND (policy before a completed stand), REQ_BAD_MODE."""
    if mode not in range(len(MODES)):
        return REQ_BAD_MODE
    if mode == st.mode:
        return REQ_OK
    if mode == POLICY and not st.stand_done and not plan.policy_without_stand:
        st.counts["refused"] += 1
        return REQ_NO_STAND
    _enter(plan, st, mode, WHY_REQUEST, t_ns)
    return REQ_OK


def reference_non_finite(plan: ActuatorPlan, st: ActRefState, t_ns: int):
    """The policy's kernel reported a non-finite output: damping when in policy mode."""
    if st.mode == POLICY:
        st.counts["non_finite_trips"] += 1
        _enter(plan, st, DAMPING, WHY_NON_FINITE, t_ns)


def reference_actuator(plan: ActuatorPlan, st: ActRefState, t_ns, frame_age_ns, q, qd, action):
    """One loop tick of actuator.h in plain numpy: (out (len(OUT_ROWS), n_out), status)."""
    q_p = np.asarray(q, dtype=np.float64)[plan.sens_map]          # measured, in the policy's order
    qd_p = np.asarray(qd, dtype=np.float64)[plan.sens_map]
    q0 = plan.row("default")
    if frame_age_ns > plan.stale_after_ns:
        action = None
        if not plan.stale_hold and st.mode in (POLICY, STAND):
            st.counts["stale_trips"] += 1
            _enter(plan, st, DAMPING, WHY_STALE, t_ns)
    if action is not None and st.mode == POLICY and not np.isfinite(action).all():
        st.counts["non_finite_trips"] += 1
        _enter(plan, st, DAMPING, WHY_NON_FINITE, t_ns)
        action = None
    if action is not None and st.mode == POLICY:
        goal = q0 + plan.row("scale") * np.asarray(action, dtype=np.float64)
        st.q_goal = np.clip(goal, plan.row("q_lo"), plan.row("q_hi")) if plan.clip_target else goal
    fresh = frame_age_ns <= plan.pd_max_age_ns
    if plan.vel_guard and fresh and st.mode == POLICY and (np.abs(qd_p) > plan.row("velocity_limit")).any():
        st.counts["velocity_guard"] += 1
        _enter(plan, st, DAMPING, WHY_VELOCITY_GUARD, t_ns)
    dt_ns = plan.period_ns if st.t_prev is None else t_ns - st.t_prev
    st.t_prev = t_ns
    if st.mode == POLICY:
        if plan.rate_limit:
            step = plan.row("rate_limit") * dt_ns * 1e-9
            d = st.q_goal - st.q_cmd
            limited = np.abs(d) > step
            st.q_cmd = np.where(limited, st.q_cmd + np.sign(d) * step, st.q_goal)
            st.counts["rate_limited"] += int(limited.any())
        else:
            st.q_cmd = st.q_goal.copy()
    if st.mode == STAND and st.stand_fresh:
        st.q_start, st.stand_t0, st.stand_fresh = q_p.copy(), t_ns, False
        if np.max(np.abs(q_p - q0)) <= plan.stand_tol:
            st.stand_done = True
    alpha = 1.0
    if st.mode == STAND and not st.stand_done:
        alpha = (t_ns - st.stand_t0) / plan.stand_ns if plan.stand_ns > 0 else 1.0
        if alpha >= 1.0:
            alpha, st.stand_done = 1.0, True
        alpha = max(alpha, 0.0)
    zeros = np.zeros(plan.n)
    if st.mode == DAMPING:
        qs, kp, kd, ff = q_p, zeros, plan.row("damping_kd"), zeros
    elif st.mode == STAND:
        qs = q0 if alpha >= 1.0 else st.q_start + alpha * (q0 - st.q_start)
        kp, kd, ff = plan.row("stand_kp"), plan.row("stand_kd"), plan.row("tau_ff")
    elif st.mode == POLICY:
        qs, kp, kd, ff = st.q_cmd, plan.row("kp"), plan.row("kd"), plan.row("tau_ff")
    else:
        qs, kp, kd, ff = q_p, zeros, zeros, zeros
    ramping = not fresh
    if ramping:
        st.counts["pd_ramp_ticks"] += 1
    if st.mode == PASSIVE:
        tau = zeros
        st.tau_fresh = zeros.copy()
    elif fresh:
        raw = kp * (qs - q_p) + kd * (0.0 - qd_p) + ff
        tau = np.clip(raw, -plan.row("tau_max"), plan.row("tau_max"))
        st.counts["tau_clipped"] += int((raw != tau).any())
        st.tau_fresh = tau.copy()
    else:
        ramp = 1.0 - (frame_age_ns - plan.pd_max_age_ns) / plan.pd_ramp_ns if plan.pd_ramp_ns > 0 else 0.0
        tau = st.tau_fresh * max(ramp, 0.0)
    st.q_last = np.array(qs, dtype=np.float64)
    out = np.zeros((len(OUT_ROWS), plan.n_out))
    for r, v in enumerate((qs, zeros, kp, kd, ff, tau)):
        out[r, plan.out_map] = v
    st.cycle += 1
    status = st.mode | (NO_COMMAND if st.mode == PASSIVE else 0) | (RAMPING if ramping else 0)
    return out, status


# ---- the numpy reference of the whole deploy path (LeggedCycle inside RtLoop's cycle) ----------------------

class PolicyReference:
    """The policy in plain numpy (kernels/reference.py): ``act(x)`` one step (a recurrent policy carries its
    state from step to step), ``reset()`` the zero state. Returns None when the output is not finite (the
    kernel's -1)."""

    def __init__(self, spec):
        from control_node.kernels import reference as R
        self.spec, self.R = spec, R
        self.reset()

    def reset(self):
        self.h, self.c = self.R.zero_state(self.spec) if self.spec.recurrent else (None, None)

    def act(self, x):
        R, spec = self.R, self.spec
        z = R.preprocess(spec, np.asarray(x, dtype=np.float64)[None, :])
        if spec.recurrent:
            h, c = R.rnn_step(spec, z[0], self.h, self.c)
            if not (np.isfinite(h).all() and (c is None or np.isfinite(c).all())):
                self.reset()
                return None
            self.h, self.c = h, c
            out = R.dense_stack(spec, h[None, :])
        else:
            out = R.dense_stack(spec, z)
        if not np.isfinite(out).all():
            return None
        return R.apply_head(spec, out)[0]


class DeployReference:
    """One node's legged deploy path in plain numpy, cycle by cycle: the mode sequence and requests, the
    recipe (:func:`reference_obs`), the policy (:class:`PolicyReference`), the actuator
    (:func:`reference_actuator`) and the published command, as LeggedCycle does inside RtLoop's cycle.

    ``cycle(c, t_ns, frame, infer, request=None)``: cycle ``c`` woke at ``t_ns``; ``frame`` the frame drained
    this cycle (the robot's raw signals, :func:`frame_layout`) or None; ``infer`` whether the loop's schedule
    made this a policy tick (the schedule's own rules are tests/test_cycle_rules.py's); ``request`` a mode asked
    through the mailbox at this cycle. A sequence entry waits for a fresh frame (and a policy entry for the
    stand). Returns the published command (OUTPUT_ROWS[output] x n_out values) and whether it was sent."""

    def __init__(self, obs_plan, act_plan, spec, output="torque", sequence=(), start_mode="passive"):
        self.op, self.ap, self.output = obs_plan, act_plan, output
        self.ro, self.ra = ObsRefState(obs_plan), ActRefState(act_plan)
        self.policy = PolicyReference(spec)
        self.sequence, self.seq_i = [(int(c), MODES.index(m)) for c, m in sequence], 0
        self.layout = {name: (o, w) for name, o, w in frame_layout(obs_plan)}
        self.frame, self.last_rx = np.zeros(sum(w for _, w in self.layout.values())), None
        self.infer_pending = True
        if start_mode != "passive":
            reference_request(act_plan, self.ra, MODES.index(start_mode), 0)

    def signals(self):
        f, L = self.frame, self.layout
        return {"joint_pos": f[slice(L["joint_pos"][0], L["joint_pos"][0] + L["joint_pos"][1])],
                "joint_vel": f[slice(L["joint_vel"][0], L["joint_vel"][0] + L["joint_vel"][1])],
                "quat": f[L["imu_quat"][0]:L["imu_quat"][0] + 4], "gyro": f[L["imu_gyro"][0]:L["imu_gyro"][0] + 3],
                "acc": f[L["imu_acc"][0]:L["imu_acc"][0] + 3],
                "command": f[L["command"][0]:L["command"][0] + L["command"][1]]}

    def cycle(self, c, t_ns, frame, infer, request=None):
        if frame is not None:
            self.frame, self.last_rx = np.asarray(frame, dtype=np.float64), t_ns
        was = self.ra.mode
        if request is not None:
            reference_request(self.ap, self.ra, MODES.index(request), t_ns)
        fresh = self.last_rx is not None and t_ns - self.last_rx <= self.ap.stale_after_ns
        if self.seq_i < len(self.sequence) and c >= self.sequence[self.seq_i][0] and fresh:
            if reference_request(self.ap, self.ra, self.sequence[self.seq_i][1], t_ns) != REQ_NO_STAND:
                self.seq_i += 1
        if was != POLICY and self.ra.mode == POLICY:
            self.ro.reset()
            self.policy.reset()
        self.mode_at_start = self.ra.mode
        a = None
        if infer:
            x = reference_obs(self.op, self.signals(), self.ro)
            u = self.policy.act(x)
            if u is None:
                reference_non_finite(self.ap, self.ra, t_ns)
            else:
                self.ro.note_action(u)
                a = u
        sig = self.signals()
        age = (t_ns - self.last_rx) if self.last_rx is not None else np.iinfo(np.int64).max
        out, status = reference_actuator(self.ap, self.ra, t_ns, age, sig["joint_pos"], sig["joint_vel"], a)
        first, rows = {"torque": (OUT_ROWS.index("tau"), 1), "position": (0, 1), "impedance": (0, 5)}[self.output]
        sent = not (status & NO_COMMAND and self.output == "position")
        return np.asarray(out[first:first + rows]).reshape(-1), sent
