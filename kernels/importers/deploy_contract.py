"""Deploy contracts: the policy's side of a legged recipe, read from what the exporter wrote beside the weights.

Two formats are read (issue 45, section 4), both into the same contract (kernels/model_file.py ``deploy``):

* **mjlab's ONNX metadata_props** (``tasks/velocity/rl/exporter.py`` ``attach_onnx_metadata``: comma-separated
  strings): ``joint_names`` -> joints.policy, ``default_joint_pos`` -> default_pos, ``joint_stiffness`` /
  ``joint_damping`` -> actuator.kp / kd, ``action_scale`` -> action.scale, ``observation_names`` -> the
  observation terms in order, ``command_names`` -> which terms are commands. Optional keys some exporters add
  are read too: ``observation_dims`` and ``observation_history_lengths`` (per term), ``policy_dt``,
  ``gait_period`` (the gait clock's period). mjlab writes no observation scales or clips: none are applied.
* **unitree_rl_lab's deploy.yaml** (``utils/export_deploy_cfg.py``): ``joint_ids_map`` (policy joint i -> SDK
  motor index), ``step_dt`` -> policy_dt, ``stiffness`` / ``damping`` (SDK order, taken through joint_ids_map),
  ``default_joint_pos``, ``actions.JointPositionAction`` (scale; offset, which must be the default pose; clip ->
  a clip of the target, actuator.q_lo / q_hi), ``observations`` (each term's scale, clip, history_length,
  params), ``commands`` (ranges, kept as information). deploy.yaml names no joints: policy joint i is named
  ``sdk_<k>`` after its motor index k, or by ``sdk_joints`` (the SDK's joint names in motor order) when given.
  It is read by :func:`read_yaml`, a strict reader of the YAML subset ``yaml.dump`` writes (PyYAML is not a
  dependency): anything else is refused naming the line.

Observation names map to the recipe's term kinds (:data:`TERM_NAMES`; IsaacLab's term names and functions):
base_ang_vel -> gyro, projected_gravity, velocity_commands / command / the command_names -> command,
joint_pos / joint_pos_rel -> joint_pos_rel (IsaacLab's ``joint_pos`` term is ``joint_pos_rel``), joint_vel /
joint_vel_rel -> joint_vel, actions / last_action -> last_action, gait_phase / phase -> gait_clock (sin, cos;
needs its period). Anything else (base_lin_vel: no linear-velocity signal; height_scan: no perception) is
refused with :class:`ImportRefused` naming the key; nothing is written.

Imports nothing of control_node outside control_node.kernels.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np

from control_node.kernels.importers.common import ImportRefused, sha256_files

#: observation term name (as exporters write them) -> the recipe's term kind (control_node/loop/legged.py)
TERM_NAMES = {
    "base_ang_vel": "gyro", "ang_vel": "gyro", "gyro": "gyro",
    "projected_gravity": "projected_gravity", "gravity": "projected_gravity",
    "velocity_commands": "command", "command": "command", "commands": "command", "generated_commands": "command",
    "joint_pos": "joint_pos_rel", "joint_pos_rel": "joint_pos_rel",
    "joint_vel": "joint_vel", "joint_vel_rel": "joint_vel",
    "actions": "last_action", "last_action": "last_action",
    "gait_phase": "gait_clock", "phase": "gait_clock", "gait_clock": "gait_clock",
}
#: why a known term cannot be run (its signal does not exist in a legged node's frame)
UNMAPPABLE = {
    "base_lin_vel": "the base's linear velocity needs a state estimator; a legged node's frame has none "
                    "(joint_pos, joint_vel, imu_quat, imu_gyro, imu_acc, command)",
    "height_scan": "a height scan needs perception; a legged node's frame has none",
}
MJLAB_KEYS = ("joint_names", "joint_stiffness", "joint_damping", "default_joint_pos", "action_scale",
              "observation_names", "command_names")
DEPLOY_YAML_NAMES = ("deploy.yaml", os.path.join("params", "deploy.yaml"), os.path.join("..", "params", "deploy.yaml"))
YAML_TOP = ("joint_ids_map", "step_dt", "stiffness", "damping", "default_joint_pos", "commands", "actions",
            "observations")


# ---- the contract -----------------------------------------------------------------------------------------

def _contract(exporter, file, sha, recipe, keys, info, notes):
    return {"version": 1, "recipe": recipe,
            "from": {"exporter": exporter, "file": file, "sha256": sha, "keys": keys, "notes": notes},
            "info": info}


def merge(file, a, b):
    """One contract from two (ONNX metadata and deploy.yaml): every value either gives; a value both give must
    agree (to the 3 significant digits exporters write), else refused naming both keys."""
    if a is None or b is None:
        return a or b
    ra, rb = a["recipe"], b["recipe"]
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in ra.items()}
    keys = dict(a["from"]["keys"])
    for k, v in rb.items():
        subs = v.items() if isinstance(v, dict) else [(None, v)]
        for kk, vv in subs:
            dotted = k if kk is None else f"{k}.{kk}"
            have = ra.get(k, {}).get(kk) if kk is not None else ra.get(k)
            if have is None:
                if kk is None:
                    out[k] = vv
                else:
                    out.setdefault(k, {})[kk] = vv
                keys[dotted] = b["from"]["keys"].get(dotted, b["from"]["exporter"])
            elif not _same(have, vv):
                raise ImportRefused(file, f"{a['from']['keys'].get(dotted, dotted)} and "
                                    f"{b['from']['keys'].get(dotted, dotted)}",
                                    f"give different {dotted} ({_short(have)} and {_short(vv)})",
                                    "export both from the same training run, or pass only one of them")
    return _contract(f"{a['from']['exporter']} + {b['from']['exporter']}", a["from"]["file"],
                     a["from"]["sha256"], out, keys, {**a["info"], **b["info"]},
                     a["from"]["notes"] + b["from"]["notes"])


def _same(x, y):
    if isinstance(x, (list, int, float)) and isinstance(y, (list, int, float)) and not isinstance(x, bool):
        try:
            ax, ay = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            return x == y
        return ax.shape == ay.shape and bool(np.allclose(ax, ay, rtol=5e-3, atol=5e-4))
    return x == y


def _short(v):
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "..."


# ---- mjlab: ONNX metadata_props ---------------------------------------------------------------------------

def _csv(s):
    return [p.strip() for p in str(s).split(",") if p.strip()]


def _meta_numbers(file, key, s, n, *, nonneg=False, integer=False):
    where = f"metadata_props '{key}'"
    try:
        v = [float(p) for p in _csv(s)]
    except ValueError:
        raise ImportRefused(file, where, f"is not a comma-separated list of numbers: {_short(s)!r}",
                            "fix the metadata") from None
    if n is not None and len(v) not in (1, n):
        raise ImportRefused(file, where, f"has {len(v)} values; {n} are needed (one per "
                            f"{'joint' if key.startswith(('joint', 'default', 'action')) else 'term'})",
                            f"give 1 or {n} values")
    if not v or not all(math.isfinite(x) for x in v):
        raise ImportRefused(file, where, "holds NaN / Inf or nothing", "give finite numbers")
    if nonneg and min(v) < 0:
        raise ImportRefused(file, where, "holds a negative value", "gains and lengths are >= 0")
    if integer and any(x != int(x) for x in v):
        raise ImportRefused(file, where, "holds a value that is not a whole number", "give integers")
    if n is not None and len(v) == 1:
        v = v * n
    return [int(x) for x in v] if integer else v


def _kind(file, where, name, command_names):
    if name in command_names:
        return "command"
    if name in TERM_NAMES:
        return TERM_NAMES[name]
    if name in UNMAPPABLE:
        raise ImportRefused(file, where, f"term '{name}' cannot be mapped: {UNMAPPABLE[name]}",
                            "retrain without it (IsaacLab's student / mjlab's deploy policies drop it), or import "
                            "with --no-deploy-contract and write the recipe by hand")
    raise ImportRefused(file, where, f"term '{name}' is not a term the node knows ({', '.join(sorted(TERM_NAMES))}, "
                        "or a name in command_names)", "rename the term as IsaacLab does, or import with "
                        "--no-deploy-contract and write the recipe by hand")


def _widths(kinds, n_joints, n_cmd):
    w = {"gyro": 3, "projected_gravity": 3, "joint_pos_rel": n_joints, "joint_vel": n_joints,
         "last_action": n_joints, "gait_clock": 2, "command": n_cmd}
    return [w[k] for k in kinds]


def from_metadata(file, meta, n_features, n_actions, sha=""):
    """The contract in an ONNX file's metadata_props (mjlab's keys), or None when it holds none of them."""
    if not any(k in meta for k in MJLAB_KEYS[1:]):
        return None
    if str(meta.get("action_type", "")).strip().lower() == "relative":
        return None             # the head already makes the target (map_metadata): the legged node needs raw
    recipe, keys, info, notes = {}, {}, {}, []
    n = n_actions
    if "joint_names" not in meta:
        raise ImportRefused(file, "metadata_props 'joint_names'", "is missing: the contract's gains, default pose "
                            "and scale are per joint, and joints are matched by name", "add joint_names (the "
                            "policy's joint order), or import with --no-deploy-contract")
    names = _csv(meta["joint_names"])
    if len(names) != n or len(set(names)) != n:
        raise ImportRefused(file, "metadata_props 'joint_names'", f"names {len(names)} joints "
                            f"({len(set(names))} distinct); the policy has {n} actions",
                            f"give {n} distinct names in the policy's joint order")
    recipe["joints"] = {"policy": names}
    keys["joints.policy"] = "metadata_props 'joint_names'"
    for key, dotted, nonneg in (("default_joint_pos", "default_pos", False), ("joint_stiffness", "actuator.kp", True),
                                ("joint_damping", "actuator.kd", True), ("action_scale", "action.scale", False)):
        if key in meta:
            v = _meta_numbers(file, key, meta[key], n, nonneg=nonneg)
            sec, _, sub = dotted.partition(".")
            if sub:
                recipe.setdefault(sec, {})[sub] = v
            else:
                recipe[sec] = v
            keys[dotted] = f"metadata_props '{key}'"
    if "policy_dt" in meta:
        dt = _meta_numbers(file, "policy_dt", meta["policy_dt"], None)
        if len(dt) != 1 or dt[0] <= 0:
            raise ImportRefused(file, "metadata_props 'policy_dt'", f"is {meta['policy_dt']!r}",
                                "give one positive number of seconds")
        recipe["policy_dt"] = dt[0]
        keys["policy_dt"] = "metadata_props 'policy_dt'"
    else:
        notes.append("no policy_dt in the metadata: the node's loop.policy_rate_hz sets it (mjlab: 50 Hz)")
    commands = _csv(meta.get("command_names", ""))
    if "observation_names" in meta:
        where = "metadata_props 'observation_names'"
        obs = _csv(meta["observation_names"])
        if not obs:
            raise ImportRefused(file, where, "is empty", "list the policy's observation terms in order")
        kinds = [_kind(file, where, o, commands) for o in obs]
        hist = [1] * len(obs)
        if "observation_history_lengths" in meta:
            hist = _meta_numbers(file, "observation_history_lengths", meta["observation_history_lengths"], len(obs),
                                 nonneg=True, integer=True)
            hist = [max(1, h) for h in hist]
        n_cmd_terms = kinds.count("command")
        if "observation_dims" in meta:
            dims = _meta_numbers(file, "observation_dims", meta["observation_dims"], len(obs), nonneg=True,
                                 integer=True)
            cmd_w = {d for d, k in zip(dims, kinds) if k == "command"}
            if len(cmd_w) > 1:
                raise ImportRefused(file, "metadata_props 'observation_dims'", f"gives the command terms widths "
                                    f"{sorted(cmd_w)}", "the node's command is one signal: give its terms one width")
            n_cmd = cmd_w.pop() if cmd_w else 0
            want = _widths(kinds, n, n_cmd)
            for i, (d, w) in enumerate(zip(dims, want)):
                if d != w:
                    raise ImportRefused(file, "metadata_props 'observation_dims'", f"gives term '{obs[i]}' {d} "
                                        f"values; the node's {kinds[i]} has {w}", "fix the metadata")
        else:
            # the command's width is what the other terms leave of the model's input
            rest = n_features - sum(w * h for w, h, k in zip(_widths(kinds, n, 0), hist, kinds) if k != "command")
            per = sum(h for h, k in zip(hist, kinds) if k == "command")
            n_cmd = rest // per if per and rest > 0 and rest % per == 0 else 0
            if n_cmd_terms and not n_cmd:
                raise ImportRefused(file, where, f"leaves {rest} of the model's {n_features} inputs to "
                                    f"{n_cmd_terms} command term(s)", "add observation_dims to the metadata")
        terms = []
        for name, kind, h in zip(obs, kinds, hist):
            t = {"kind": kind, "name": name}
            if h > 1:
                t["history"] = h
            if kind == "gait_clock":
                if "gait_period" not in meta:
                    raise ImportRefused(file, "metadata_props 'gait_period'", f"is missing: term '{name}' is a gait "
                                        "clock, whose period the node must know", "add gait_period (seconds)")
                period = _meta_numbers(file, "gait_period", meta["gait_period"], None)
                if len(period) != 1 or period[0] <= 0:
                    raise ImportRefused(file, "metadata_props 'gait_period'", f"is {meta['gait_period']!r}",
                                        "give one positive number of seconds")
                t.update(period=period[0], form="sin_cos")
            terms.append(t)
        total = sum(w * h for w, h in zip(_widths(kinds, n, n_cmd), hist))
        if total != n_features:
            raise ImportRefused(file, where, f"terms add up to {total} inputs "
                                f"({', '.join(f'{o} {w}x{h}' for o, w, h in zip(obs, _widths(kinds, n, n_cmd), hist))}"
                                f"); the model takes {n_features}", "fix the metadata (observation_names, "
                                "observation_dims), or import with --no-deploy-contract")
        recipe["observation"] = {"terms": terms}
        if n_cmd:
            recipe["observation"]["n_commands"] = n_cmd
            keys["observation.n_commands"] = ("metadata_props 'observation_dims'" if "observation_dims" in meta else
                                              "the model's input width less the other terms'")
        keys["observation.terms"] = where
        notes.append("mjlab's metadata gives no observation scales or clips: none are applied")
    for k, dest in (("quat_order", "quat_order"), ("command_components", "command_components"),
                    ("joint_effort_limit", "effort_limit"), ("command_names", "command_names")):
        if k in meta:
            info[dest] = (meta[k].strip() if k == "quat_order" else
                          _meta_numbers(file, k, meta[k], n, nonneg=True) if k == "joint_effort_limit" else
                          _csv(meta[k]))
    return _contract("mjlab onnx metadata_props", file, sha, recipe, keys, info, notes)


# ---- unitree_rl_lab: deploy.yaml --------------------------------------------------------------------------

def find_deploy_yaml(policy_path):
    """deploy.yaml beside the policy (or in params/ beside it or beside its folder, unitree_rl_lab's layout)."""
    here = os.path.dirname(os.path.abspath(policy_path))
    for rel in DEPLOY_YAML_NAMES:
        p = os.path.normpath(os.path.join(here, rel))
        if os.path.isfile(p):
            return p
    return None


def from_deploy_yaml(path, n_features, n_actions, sdk_joints=None):
    """The contract in unitree_rl_lab's deploy.yaml at ``path``."""
    file = os.path.basename(path)
    with open(path, "rb") as f:
        raw = f.read((1 << 20) + 1)
    if len(raw) > 1 << 20:
        raise ImportRefused(file, "(file)", "is larger than 1 MiB", "pass the deploy.yaml the exporter wrote")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ImportRefused(file, "(file)", f"is not UTF-8 text ({e})", "pass the deploy.yaml the exporter wrote") \
            from None
    doc = read_yaml(text, file)
    if not isinstance(doc, dict):
        raise ImportRefused(file, "(file)", "is not a mapping of keys", "pass the deploy.yaml the exporter wrote")
    for k in doc:
        if k not in YAML_TOP:
            raise ImportRefused(file, f"key '{k}'", "is not a deploy.yaml key the node maps "
                                f"({', '.join(YAML_TOP)})", "remove it, or import with --no-deploy-contract and "
                                "write the recipe by hand")
    n = n_actions
    recipe, keys, info, notes = {}, {}, {}, []

    def need(key):
        if key not in doc:
            raise ImportRefused(file, f"key '{key}'", "is missing", "pass the deploy.yaml the exporter wrote")
        return doc[key]

    def numbers(key, v, m, *, nonneg=False, integer=False):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = [v] * m
        if not (isinstance(v, list) and len(v) == m and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                            and math.isfinite(x) for x in v)):
            raise ImportRefused(file, f"key '{key}'", f"is not {m} finite numbers ({_short(v)})",
                                f"give {m} numbers")
        if nonneg and min(v) < 0:
            raise ImportRefused(file, f"key '{key}'", "holds a negative value", "give values >= 0")
        if integer and any(x != int(x) for x in v):
            raise ImportRefused(file, f"key '{key}'", "holds a value that is not a whole number", "give integers")
        return [int(x) for x in v] if integer else [float(x) for x in v]

    ids = need("joint_ids_map")
    ids = numbers("joint_ids_map", ids, len(ids) if isinstance(ids, list) else -1, nonneg=True, integer=True)
    if len(ids) != n or len(set(ids)) != n:
        raise ImportRefused(file, "key 'joint_ids_map'", f"maps {len(ids)} joints ({len(set(ids))} distinct); the "
                            f"policy has {n} actions", f"give {n} distinct motor indices, one per policy joint")
    stiff, damp = need("stiffness"), need("damping")
    n_sdk = len(stiff) if isinstance(stiff, list) else -1
    stiff = numbers("stiffness", stiff, n_sdk, nonneg=True)
    damp = numbers("damping", damp, n_sdk, nonneg=True)
    if max(ids) >= n_sdk:
        raise ImportRefused(file, "key 'joint_ids_map'", f"names motor {max(ids)}; stiffness lists {n_sdk} motors",
                            "export deploy.yaml again")
    if sdk_joints is not None:
        if len(sdk_joints) != n_sdk or len(set(sdk_joints)) != n_sdk:
            raise ImportRefused(file, "--sdk-joints", f"names {len(sdk_joints)} joints ({len(set(sdk_joints))} "
                                f"distinct); deploy.yaml's stiffness lists {n_sdk} motors",
                                f"give the {n_sdk} SDK joint names in motor order")
        names = [sdk_joints[k] for k in ids]
        keys["joints.policy"] = "deploy.yaml 'joint_ids_map' through --sdk-joints"
    else:
        names = [f"sdk_{k}" for k in ids]
        keys["joints.policy"] = "deploy.yaml 'joint_ids_map' (named sdk_<motor index>)"
        notes.append("deploy.yaml names no joints: policy joint i is sdk_<its motor index>; the robot's joints in "
                     "motor order are sdk_0, sdk_1, ... (or import with --sdk-joints NAMES)")
    info["sdk_joints"] = list(sdk_joints) if sdk_joints is not None else [f"sdk_{k}" for k in range(n_sdk)]
    recipe["joints"] = {"policy": names}
    recipe["actuator"] = {"kp": [stiff[k] for k in ids], "kd": [damp[k] for k in ids]}
    keys["actuator.kp"], keys["actuator.kd"] = "deploy.yaml 'stiffness'", "deploy.yaml 'damping'"
    q0 = numbers("default_joint_pos", need("default_joint_pos"), n)
    recipe["default_pos"] = q0
    keys["default_pos"] = "deploy.yaml 'default_joint_pos'"
    if "step_dt" in doc:
        dt = doc["step_dt"]
        if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not dt > 0 or not math.isfinite(dt):
            raise ImportRefused(file, "key 'step_dt'", f"is {dt!r}", "give the policy period in seconds")
        recipe["policy_dt"] = float(dt)
        keys["policy_dt"] = "deploy.yaml 'step_dt'"
    # actions: one JointPositionAction over all the joints
    acts = need("actions")
    if not isinstance(acts, dict) or list(acts) != ["JointPositionAction"]:
        got = list(acts) if isinstance(acts, dict) else acts
        raise ImportRefused(file, "key 'actions'", f"holds {_short(got)}; the node runs one JointPositionAction "
                            "(q* = default + scale * a)", "export a policy with one joint-position action term")
    a = acts["JointPositionAction"]
    w = "actions.JointPositionAction"
    if not isinstance(a, dict):
        raise ImportRefused(file, f"key '{w}'", "is not a mapping", "export deploy.yaml again")
    for k in a:
        if k not in ("scale", "offset", "clip", "joint_names", "joint_ids"):
            raise ImportRefused(file, f"key '{w}.{k}'", "is not a key the node maps (scale, offset, clip, "
                                "joint_names, joint_ids)", "remove it, or import with --no-deploy-contract")
    if a.get("joint_ids") is not None:
        raise ImportRefused(file, f"key '{w}.joint_ids'", f"is {_short(a['joint_ids'])}: the action drives a subset "
                            "of the joints", "the node's action drives every policy joint (joint_ids: null)")
    recipe["action"] = {"scale": numbers(f"{w}.scale", a.get("scale", 1.0), n)}
    keys["action.scale"] = f"deploy.yaml '{w}.scale'"
    if a.get("offset") is not None:
        off = numbers(f"{w}.offset", a["offset"], n)
        bad = [i for i in range(n) if abs(off[i] - q0[i]) > 1e-6 + 1e-3 * abs(q0[i])]
        if bad:
            i = bad[0]
            raise ImportRefused(file, f"key '{w}.offset'", f"is {off[i]} for joint {i} ({names[i]}), "
                                f"default_joint_pos is {q0[i]}: the node's target is default_pos + scale * a",
                                "train with use_default_offset=True, or import with --no-deploy-contract")
    if a.get("clip") is not None:
        c = a["clip"]
        if not (isinstance(c, list) and len(c) == n and all(isinstance(p, list) and len(p) == 2 for p in c)):
            raise ImportRefused(file, f"key '{w}.clip'", f"is not {n} pairs [lo, hi] ({_short(c)})",
                                "export deploy.yaml again")
        lo = numbers(f"{w}.clip", [p[0] for p in c], n)
        hi = numbers(f"{w}.clip", [p[1] for p in c], n)
        if any(x > y for x, y in zip(lo, hi)):
            raise ImportRefused(file, f"key '{w}.clip'", "has a pair with lo > hi", "give [lo, hi] with lo <= hi")
        recipe["action"]["clip_to_limits"] = True
        recipe["actuator"].update(q_lo=lo, q_hi=hi)
        keys["actuator.q_lo"] = keys["actuator.q_hi"] = f"deploy.yaml '{w}.clip'"
        keys["action.clip_to_limits"] = f"deploy.yaml '{w}.clip'"
    # observations: the policy group's terms in order
    obs = need("observations")
    if not isinstance(obs, dict) or not obs:
        raise ImportRefused(file, "key 'observations'", "is not a mapping of terms", "export deploy.yaml again")
    terms, n_cmd = [], 0
    for name, t in obs.items():
        where = f"observations.{name}"
        kind = _kind(file, f"key '{where}'", name, ())
        if not isinstance(t, dict):
            raise ImportRefused(file, f"key '{where}'", "is not a mapping", "export deploy.yaml again")
        for k in t:
            if k not in ("params", "clip", "scale", "history_length"):
                raise ImportRefused(file, f"key '{where}.{k}'", "is not a key the node maps (params, clip, scale, "
                                    "history_length)", "remove it, or import with --no-deploy-contract")
        params = t.get("params") or {}
        allowed = {"command": ("command_name",), "gait_clock": ("period",)}.get(kind, ())
        if not isinstance(params, dict):
            raise ImportRefused(file, f"key '{where}.params'", "is not a mapping", "export deploy.yaml again")
        for k in params:
            if k not in allowed:
                raise ImportRefused(file, f"key '{where}.params.{k}'", f"is a parameter the node's {kind} term does "
                                    "not take", "train without it, or import with --no-deploy-contract")
        width = {"gyro": 3, "projected_gravity": 3, "joint_pos_rel": n, "joint_vel": n, "last_action": n,
                 "gait_clock": 2}.get(kind)
        sc = t.get("scale")
        if kind == "command":
            width = len(sc) if isinstance(sc, list) else 3
            if n_cmd and width != n_cmd:
                raise ImportRefused(file, f"key '{where}.scale'", f"gives a command of {width} values, another "
                                    f"command term has {n_cmd}", "the node's command is one signal")
            n_cmd = width
        term = {"kind": kind, "name": name}
        if sc is not None:
            sc = numbers(f"{where}.scale", sc, width)
            if any(x != 1.0 for x in sc):
                term["scale"] = sc if len(set(sc)) > 1 else sc[0]
        clip = t.get("clip")
        if clip is not None:
            if not (isinstance(clip, list) and len(clip) == 2 and all(isinstance(x, (int, float)) for x in clip)
                    and clip[0] <= clip[1]):
                raise ImportRefused(file, f"key '{where}.clip'", f"is {_short(clip)}, not [lo, hi]",
                                    "give [lo, hi] with lo <= hi")
            term["clip"] = [float(clip[0]), float(clip[1])]
        h = t.get("history_length", 1)
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise ImportRefused(file, f"key '{where}.history_length'", f"is {h!r}", "give an integer >= 0")
        if h > 1:
            term["history"] = h
        if kind == "gait_clock":
            p = params.get("period")
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not p > 0:
                raise ImportRefused(file, f"key '{where}.params.period'", f"is {p!r}: a gait clock needs its period",
                                    "give the period in seconds")
            term.update(period=float(p), form="sin_cos")
        terms.append(term)
    total = sum({"command": n_cmd}.get(t["kind"], {"gyro": 3, "projected_gravity": 3, "gait_clock": 2}.get(
        t["kind"], n)) * t.get("history", 1) for t in terms)
    if total != n_features:
        raise ImportRefused(file, "key 'observations'", f"terms add up to {total} inputs; the model takes "
                            f"{n_features}", "pass the deploy.yaml exported with this policy")
    recipe["observation"] = {"terms": terms, "history": {"layout": "term", "fill": "first"}}
    if n_cmd:
        recipe["observation"]["n_commands"] = n_cmd
        keys["observation.n_commands"] = "deploy.yaml 'observations' (the command term's scale list)"
    keys["observation.terms"] = "deploy.yaml 'observations'"
    keys["observation.history"] = "deploy.yaml (term-major, first-value fill: unitree_rl_lab's managers)"
    if isinstance(doc.get("commands"), dict) and doc["commands"]:
        info["commands"] = doc["commands"]
    return _contract("unitree_rl_lab deploy.yaml", file, sha256_files([path]), recipe, keys, info, notes)


# ---- a strict reader of the YAML subset yaml.dump writes ---------------------------------------------------

_NUM = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_INT = re.compile(r"[-+]?\d+")


def read_yaml(text, file="deploy.yaml"):
    """A YAML document of block mappings, block sequences (``- item``), flow lists / mappings (also across
    lines), plain and quoted scalars, numbers, null, true / false and comments: what ``yaml.dump`` writes for
    unitree_rl_lab's deploy.yaml. Anchors, aliases, tags, block scalars and several documents are refused,
    naming the line."""
    lines = []          # (line number, indent, text) of logical lines (flow collections joined)
    buf, start, depth, head = None, 0, 0, (0, 0)
    for i, raw in enumerate(text.splitlines(), 1):
        s = _strip_comment(raw)
        if buf is not None:
            buf += " " + s.strip()
            depth += _depth(s, file, i)
            if depth <= 0:
                lines.append(head + (buf,))
                buf = None
            continue
        if not s.strip():
            continue
        if "\t" in s[:len(s) - len(s.lstrip())]:
            raise ImportRefused(file, f"line {i}", "is indented with a tab", "indent with spaces")
        stripped = s.strip()
        if stripped in ("---", "...") or stripped.startswith(("%", "&", "!", "|", ">")) or \
                re.search(r"(^|[\s:\[,{-])[&*!][^\s,\]}]", stripped) or re.search(r":\s*[|>][-+]?\s*$", stripped):
            raise ImportRefused(file, f"line {i}", f"uses YAML this reader does not take ({stripped[:40]!r}: "
                                "documents, anchors, aliases, tags, block scalars)", "pass the deploy.yaml "
                                "yaml.dump wrote")
        indent = len(s) - len(s.lstrip())
        d = _depth(s, file, i)
        if d > 0:
            buf, head, depth, start = stripped, (i, indent), d, i
        else:
            lines.append((i, indent, stripped))
    if buf is not None:
        raise ImportRefused(file, f"line {start}", "opens a flow collection ([ or {) that is never closed",
                            "close it")
    if not lines:
        return None
    value, at = _block(lines, 0, lines[0][1], file)
    if at != len(lines):
        raise ImportRefused(file, f"line {lines[at][0]}", "is indented less than the document it follows",
                            "fix the indentation")
    return value


def _strip_comment(s):
    out, q = [], None
    for j, c in enumerate(s):
        if q:
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "#" and (j == 0 or s[j - 1] in " \t"):
            break
        out.append(c)
    return "".join(out).rstrip()


def _depth(s, file, i):
    d, q = 0, None
    for c in s:
        if q:
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c in "[{":
            d += 1
        elif c in "]}":
            d -= 1
    return d


def _block(lines, at, indent, file):
    """The block node starting at lines[at] (indent ``indent``): a mapping or a sequence."""
    i, ind, text = lines[at]
    if text.startswith("- ") or text == "-":
        out = []
        while at < len(lines) and lines[at][1] == indent and (lines[at][2].startswith("- ") or lines[at][2] == "-"):
            i, _, text = lines[at]
            item = text[1:].strip()
            at += 1
            if not item:
                if at < len(lines) and lines[at][1] > indent:
                    v, at = _block(lines, at, lines[at][1], file)
                else:
                    v = None
            elif _is_key(item):
                raise ImportRefused(file, f"line {i}", "is a mapping inside a block sequence, which this reader "
                                    "does not take", "pass the deploy.yaml yaml.dump wrote")
            else:
                v = _scalar_or_flow(item, file, i)
            out.append(v)
        return out, at
    out = {}
    while at < len(lines) and lines[at][1] == indent:
        i, _, text = lines[at]
        if text.startswith("- "):
            raise ImportRefused(file, f"line {i}", "is a sequence item where a key was expected", "fix the indentation")
        key, rest = _split_key(text, file, i)
        if key in out:
            raise ImportRefused(file, f"line {i}", f"repeats key '{key}'", "give each key once")
        at += 1
        if rest:
            out[key] = _scalar_or_flow(rest, file, i)
        elif at < len(lines) and (lines[at][1] > indent or (lines[at][1] == indent and lines[at][2].startswith("- "))):
            out[key], at = _block(lines, at, lines[at][1], file)
        else:
            out[key] = None
    if at < len(lines) and lines[at][1] > indent:
        raise ImportRefused(file, f"line {lines[at][0]}", "is indented more than the key before it, which has a value",
                            "fix the indentation")
    return out, at


def _is_key(text):
    try:
        _split_key(text, "", 0)
        return True
    except ImportRefused:
        return False


def _split_key(text, file, i):
    if text[0] in "'\"":
        q = text[0]
        end = text.find(q, 1)
        if end < 0 or text[end + 1:end + 2] != ":":
            raise ImportRefused(file, f"line {i}", f"is not 'key: value' ({text[:40]!r})", "fix the line")
        return text[1:end], text[end + 2:].strip()
    m = re.match(r"([^\s:\[\]{},#][^:]*?):(\s+|$)", text)
    if not m:
        raise ImportRefused(file, f"line {i}", f"is not 'key: value' ({text[:40]!r})", "fix the line")
    return m.group(1), text[m.end():].strip()


def _scalar_or_flow(s, file, i):
    if s[0] in "[{":
        v, at = _flow(s, 0, file, i)
        if s[at:].strip():
            raise ImportRefused(file, f"line {i}", f"has text after a flow collection ({s[at:][:40]!r})",
                                "fix the line")
        return v
    return _scalar(s, file, i)


def _flow(s, at, file, i):
    """A flow list or mapping starting at s[at]; returns (value, index after it)."""
    close = "]" if s[at] == "[" else "}"
    out = [] if close == "]" else {}
    at += 1
    while True:
        while at < len(s) and s[at] == " ":
            at += 1
        if at < len(s) and s[at] == close:
            return out, at + 1
        if at >= len(s):
            raise ImportRefused(file, f"line {i}", "has a flow collection that is never closed", "close it")
        if s[at] in "[{":
            v, at = _flow(s, at, file, i)
        else:
            j = at
            q = None
            while j < len(s) and (q or s[j] not in (",]}" if close == "]" else ",}")):
                if q and s[j] == q:
                    q = None
                elif not q and s[j] in "'\"" and j == at:
                    q = s[j]
                j += 1
            v, at = s[at:j].strip(), j
            if close == "}":
                key, rest = _split_key(v, file, i) if ":" in v else (v, "")
                if rest and rest[0] in "[{":
                    raise ImportRefused(file, f"line {i}", "nests a collection in a flow mapping",
                                        "pass the deploy.yaml yaml.dump wrote")
                if key in out:
                    raise ImportRefused(file, f"line {i}", f"repeats key '{key}'", "give each key once")
                out[key] = _scalar(rest, file, i) if rest else None
                v = None
            else:
                v = _scalar(v, file, i)
        if close == "]":
            out.append(v)
        while at < len(s) and s[at] == " ":
            at += 1
        if at < len(s) and s[at] == ",":
            at += 1
        elif at < len(s) and s[at] == close:
            return out, at + 1
        else:
            raise ImportRefused(file, f"line {i}", "has a flow collection that is never closed", "close it")


def _scalar(s, file, i):
    s = s.strip()
    if not s:
        raise ImportRefused(file, f"line {i}", "has an empty value in a list", "give a value")
    if s[0] in "'\"":
        if len(s) < 2 or s[-1] != s[0]:
            raise ImportRefused(file, f"line {i}", f"has an unterminated quoted string ({s[:40]!r})", "close it")
        body = s[1:-1]
        return body.replace("''", "'") if s[0] == "'" else body.replace('\\"', '"').replace("\\\\", "\\")
    low = s.lower()
    if low in ("null", "~"):
        return None
    if low == "true":
        return True
    if low == "false":
        return False
    if low in (".inf", "+.inf"):
        return math.inf
    if low == "-.inf":
        return -math.inf
    if low == ".nan":
        return math.nan
    if _INT.fullmatch(s):
        return int(s)
    if _NUM.fullmatch(s):
        return float(s)
    if s[0] in "&*!|>%@`":
        raise ImportRefused(file, f"line {i}", f"has {s[:40]!r}: anchors, aliases, tags and block scalars are not "
                            "read", "pass the deploy.yaml yaml.dump wrote")
    return s
