"""A node's legged deploy path from its config: the ``[legged]`` section, checked against the policy and the
node's own loop settings, built into a :class:`control_node.loop._legged.LeggedCycle` off the RT thread.

``[legged]`` holds the recipe (control_node/loop/legged.py's module docstring: joints by name, default_pos,
policy_dt, observation terms, action scale, actuator gains and limits, modes) and three keys of the node's:

* ``output``: what the node publishes every tick: ``"torque"`` (the PD at loop rate, from the newest frame),
  ``"position"`` (q*, for drives that run the PD) or ``"impedance"`` (q*, qd*, kp, kd, tau_ff per joint);
* ``start_mode``: the mode at start, ``"passive"`` (default) or ``"damping"``;
* ``sequence``: modes at chosen times from the loop's start, ``[[seconds, "stand"], [seconds, "policy"],
  ...]``; an entry waits for a fresh frame (the robot connected: a stand ramps from the measured pose), and a
  policy entry for the stand to complete.

The deploy contract lives with the model, the robot in the config (issue 45, decision 5): when the model file
carries a contract (kernels/model_file.py ``deploy``, read by ``control-node import``), every recipe value it
holds (joints.policy, default_pos, policy_dt, the observation terms, action.scale, actuator.kp / kd, a target
clip) that ``[legged]`` omits is taken from it; a value both give must be the same, else the node refuses to
start naming both (never silently preferring one). ``[legged]`` keeps the robot's side: joints.robot /
actuators, limits (tau_max, q_lo / q_hi), modes, quat_order, output.

The node owns two of the actuator's settings: its period is ``1 / [loop] rate_hz`` and its stale limit is
``[watchdog] stale_after_ms``; a recipe that states other values is refused. The recipe's ``policy_dt``
must be the node's policy period (``decimation / rate_hz``): the gait clock counts policy ticks of it.
"""
from __future__ import annotations

import numpy as np

from control_node.errors import ConfigError

NODE_KEYS = ("output", "start_mode", "sequence")


def plans_for(cfg: dict, policy, decimation: int):
    """(ObsPlan, ActuatorPlan) of ``cfg``'s [legged] recipe for ``policy`` (its model's deploy contract merged in,
    the node's own period and stale limit): every check, off the RT thread. Raises ConfigError naming the key."""
    from control_node.loop import legged as L
    raw = cfg.get("legged")
    src = cfg.get("source", "(config)")
    if not isinstance(raw, dict):
        raise ConfigError(src, "legged", "is not a table", "write it as [legged] with the recipe's tables")
    rate = float(cfg["loop"]["rate_hz"])
    if not policy.continuous:
        raise ConfigError(src, "legged", "needs a continuous policy (joint actions); the model is an argmax one",
                          "load the legged policy's model file")
    spec = policy.spec
    for key in ("action_offset", "action_scale"):
        v = getattr(spec, key)
        if not np.all(v == (0.0 if key == "action_offset" else 1.0)):
            raise ConfigError(src, "legged", f"the model's {key} is {v.tolist()}: its head already turns the raw "
                              "action into a target", "re-import the policy with its raw output (the recipe's "
                              "default_pos and action.scale make the target; last_action is the raw output)")
    if int(cfg["policy"]["history"]) != 1:
        raise ConfigError(src, "policy.history", f"is {cfg['policy']['history']} with a [legged] recipe",
                          "set it to 1: the recipe keeps each term's history (observation.history)")
    recipe = {k: v for k, v in raw.items() if k not in NODE_KEYS}
    contract = getattr(spec, "deploy", None)
    if contract:
        recipe = with_contract(recipe, contract, src, int(policy.n_features), int(policy.n_actions))
        if "policy_dt" in contract.get("recipe", {}) and "policy_dt" not in raw:
            dt = float(contract["recipe"]["policy_dt"])
            if not np.isclose(dt, decimation / rate, rtol=1e-9, atol=0):
                raise ConfigError(src, "loop.policy_rate_hz", f"makes the policy period {decimation / rate:g} s "
                                  f"(decimation {decimation} at {rate:g} Hz); the model's deploy contract says "
                                  f"policy_dt = {dt:g} s ({_origin(contract, 'policy_dt')})",
                                  f"set loop.policy_rate_hz = {1.0 / dt:g}, the policy's training rate")
    act = dict(recipe.get("actuator") or {})
    own = {"period": 1.0 / rate, "stale_after": float(cfg["watchdog"]["stale_after_ms"]) / 1e3}
    for key, value in own.items():
        if key in act and not np.isclose(float(act[key]), value, rtol=1e-9, atol=0):
            raise ConfigError(src, f"legged.actuator.{key}", f"is {act[key]} s; the node's is {value:g} s "
                              f"({'1 / loop.rate_hz' if key == 'period' else 'watchdog.stale_after_ms'})",
                              "drop it: the node sets it from its own config")
        act[key] = value
    recipe["actuator"] = act
    policy_dt = decimation / rate
    if "policy_dt" in recipe and not np.isclose(float(recipe["policy_dt"]), policy_dt, rtol=1e-9, atol=0):
        raise ConfigError(src, "legged.policy_dt", f"is {recipe['policy_dt']} s; the node runs the policy every "
                          f"{policy_dt:g} s (decimation {decimation} at {rate:g} Hz)",
                          "set loop.policy_rate_hz to the policy's training rate, or fix policy_dt")
    recipe.setdefault("policy_dt", policy_dt)
    try:
        op, ap = L.build_plans(recipe, int(policy.n_features), int(policy.n_actions))
    except L.RecipeError as e:
        raise ConfigError(src, f"legged.{e.key}", str(e).split(": ", 1)[1].rsplit(". Fix: ", 1)[0],
                          str(e).rsplit(". Fix: ", 1)[-1]) from None
    return op, ap


def build_legged(cfg: dict, policy, decimation: int, capacity: int):
    """The LeggedCycle of ``cfg``'s [legged] section for ``policy`` (None without one). Raises ConfigError
    naming the key and the fix."""
    from control_node.loop import legged as L
    from control_node.loop._legged import LeggedCycle
    raw = cfg.get("legged")
    if not raw:
        return None
    src = cfg.get("source", "(config)")
    rate = float(cfg["loop"]["rate_hz"])
    op, ap = plans_for(cfg, policy, decimation)
    output = raw.get("output", "torque")
    if output not in L.OUTPUTS:
        raise ConfigError(src, "legged.output", f"is {output!r}", f"use one of {', '.join(L.OUTPUTS)}")
    start = raw.get("start_mode", "passive")
    if start not in ("passive", "damping"):
        raise ConfigError(src, "legged.start_mode", f"is {start!r}",
                          "use passive or damping: a stand ramps from a measured pose, which the node has once the "
                          "robot's frames arrive (request it, or put it in legged.sequence, which waits for them)")
    entries = []
    for i, item in enumerate(raw.get("sequence", []) or []):
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], (int, float))
                and item[1] in L.MODES and item[0] >= 0):
            raise ConfigError(src, f"legged.sequence[{i}]", f"is {item!r}",
                              f'give [seconds, mode], mode one of {", ".join(L.MODES)}, e.g. [1.0, "stand"]')
        entries.append((int(round(float(item[0]) * rate)), str(item[1])))
    if [c for c, _ in entries] != sorted(c for c, _ in entries):
        raise ConfigError(src, "legged.sequence", "is not in time order", "list the entries by increasing time")
    try:
        lc = LeggedCycle(op, ap, output, capacity=capacity, start_mode=start)
    except ValueError as e:
        raise ConfigError(src, "legged.start_mode", str(e), "start passive, then request stand") from None
    lc.set_sequence(entries)
    return lc


def _origin(contract, dotted):
    keys = contract.get("from", {}).get("keys", {})
    return f"deploy.recipe.{dotted} <- {keys.get(dotted, contract.get('from', {}).get('exporter', 'the import'))}"


def _same_values(a, b):
    """Whether two recipe values are the same (numbers: a number equals a list of that number, as the recipe
    broadcasts it; tables key by key; anything else by equality)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_values(a[k], b[k]) for k in a)
    try:
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        return a == b
    if isinstance(a, bool) or isinstance(b, bool) or x.ndim > 1 or y.ndim > 1:
        return a == b
    try:
        x, y = np.broadcast_arrays(x, y)
    except ValueError:
        return False
    return bool(np.array_equal(x, y) or np.allclose(x, y, rtol=1e-9, atol=1e-12))


def _show(v):
    s = str(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _terms_plan(recipe, terms, n_features):
    """The observation plan's arrays of ``recipe`` with ``terms`` (None when they do not build)."""
    from control_node.loop import legged as L
    try:
        p = L.build_obs_plan({**recipe, "observation": {**recipe.get("observation", {}), "terms": terms}}, n_features)
    except L.RecipeError:
        return None
    return (p.terms.tolist(), p.scale.tolist(), p.offset.tolist(), p.lo.tolist(), p.hi.tolist(), p.params.tolist())


def with_contract(recipe: dict, contract: dict, src="(config)", n_features=None, n_actions=None) -> dict:
    """``recipe`` ([legged] without the node's keys) completed with the model's deploy contract: every value the
    contract holds and the recipe omits is taken from it; a value both give must be the same (observation terms:
    the same plan), else ConfigError naming both."""
    given = contract.get("recipe", {})
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in recipe.items()}

    def conflict(dotted, mine, theirs):
        raise ConfigError(src, f"legged.{dotted}", f"is {_show(mine)} in the config and {_show(theirs)} in the "
                          f"model's deploy contract ({_origin(contract, dotted)})",
                          f"drop legged.{dotted} to run the contract's (the training value), or re-import the "
                          "policy with the right contract (control-node import)")
    for key, value in given.items():
        if not isinstance(value, dict):
            if key not in out:
                out[key] = value
            elif not _same_values(out[key], value):
                conflict(key, out[key], value)
            continue
        mine = out.get(key)
        if mine is None:
            out[key] = dict(value)
            continue
        if not isinstance(mine, dict):
            continue            # build_plans refuses a non-table, naming it
        for sub, v in value.items():
            dotted = f"{key}.{sub}"
            if sub not in mine:
                mine[sub] = v
            elif sub == "terms":
                if not _same_values(mine[sub], v):
                    base = {**out, key: {**mine}}
                    a, b = _terms_plan(base, mine[sub], n_features), _terms_plan(base, v, n_features)
                    if a is None or a != b:
                        names = [t.get("kind") if isinstance(t, dict) else t for t in mine[sub]]
                        conflict(dotted, names, [t.get("name", t["kind"]) for t in v])
            elif isinstance(v, dict) and isinstance(mine[sub], dict):
                for kk, vv in v.items():        # e.g. observation.history: key by key
                    if kk not in mine[sub]:
                        mine[sub] = {**mine[sub], kk: vv}
                    elif not _same_values(mine[sub][kk], vv):
                        conflict(f"{dotted}.{kk}", mine[sub][kk], vv)
            elif not _same_values(mine[sub], v):
                conflict(dotted, mine[sub], v)
    return out


ACTUATOR_FIELDS = ("n", "n_robot", "n_out", "clip_target", "rate_limit", "vel_guard", "policy_without_stand",
                   "stale_hold", "period_ns", "stale_after_ns", "pd_max_age_ns", "pd_ramp_ns", "stand_ns", "stand_tol",
                   "policy_joints", "out_joints")


def slot_plan(cfg: dict, policy, decimation: int, lc):
    """The observation plan of a policy loaded beside the running one (its own last action, history and gait
    clock), after checking that it drives the same actuators from the same frame: a live switch between policies
    whose signals or actuators differ is refused, naming the difference (ConfigError)."""
    from control_node.loop import legged as L
    op, ap = plans_for(cfg, policy, decimation)
    run_op, run_ap = lc.obs.plan, lc.act.plan
    src = cfg.get("source", "(config)")
    if L.frame_layout(op) != L.frame_layout(run_op) or op.quat_order != run_op.quat_order:
        raise ConfigError(src, "legged.observation", f"the new policy's frame is {L.frame_layout(op)} "
                          f"(quat {op.quat_order}), the running one's {L.frame_layout(run_op)} (quat "
                          f"{run_op.quat_order})", "a live switch keeps the robot's signals: load a policy of "
                          "the same robot")
    for key in ACTUATOR_FIELDS:
        a, b = getattr(ap, key), getattr(run_ap, key)
        if a != b:
            raise ConfigError(src, f"legged.{key}", f"is {a!r} for the new policy, {b!r} for the running one",
                              "a live switch keeps the actuators and their modes: load a policy with the same")
    for key in ("sens_map", "out_map", "j"):
        a, b = getattr(ap, key), getattr(run_ap, key)
        if a.shape != b.shape or not np.array_equal(a, b):
            where = (L.J_FIELDS[int(np.argwhere(a != b)[0][0])] if key == "j" and a.shape == b.shape else key)
            raise ConfigError(src, f"legged.{where}", "differs between the new policy (its deploy contract) and "
                              "the running one", "a live switch keeps the default pose, gains, limits and joint "
                              "maps: load a policy trained with the same")
    return op


def frame_signals(lc) -> list:
    """[(signal, offset, width)] of the node's frame (legged.frame_layout): what a robot sends."""
    from control_node.loop import legged as L
    return L.frame_layout(lc.obs.plan)


def summary(lc, rate_hz: float, cycles: int) -> dict | None:
    """summary.json's "legged": the output, the modes' timeline (each transition: cycle, time from the first
    cycle, from, to, reason), the time in each mode, the limits' and faults' counts (after the run)."""
    if lc is None:
        return None
    from control_node.loop import legged as L
    tr = [{"cycle": int(c), "t_s": int(c) / rate_hz, "from": L.MODES[a], "to": L.MODES[b], "reason": L.REASONS[r]}
          for c, _, a, b, r in lc.act.drain_transitions()]
    ring = np.asarray(lc.mode_ring)[:min(int(cycles), int(lc.capacity))]
    return {"output": lc.output, "publish_width": int(lc.pub_width), "mode": lc.mode,
            "stand_done": lc.stand_done, "transitions": tr, "counts": lc.act.counts,
            "no_command_cycles": int(lc.no_command),
            "joints": {"policy": list(lc.act.plan.policy_joints), "actuators": list(lc.act.plan.out_joints)},
            "frame": [{"signal": s, "offset": o, "width": w} for s, o, w in frame_signals(lc)],
            # over the cycles the mode ring kept (all of them unless the run was longer than its capacity)
            "cycles_by_mode": {m: int((ring == i).sum()) for i, m in enumerate(L.MODES)}}
