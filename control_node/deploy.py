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

The node owns two of the actuator's settings: its period is ``1 / [loop] rate_hz`` and its stale limit is
``[watchdog] stale_after_ms``; a recipe that states other values is refused. The recipe's ``policy_dt``
must be the node's policy period (``decimation / rate_hz``): the gait clock counts policy ticks of it.
"""
from __future__ import annotations

import numpy as np

from control_node.errors import ConfigError

NODE_KEYS = ("output", "start_mode", "sequence")


def build_legged(cfg: dict, policy, decimation: int, capacity: int):
    """The LeggedCycle of ``cfg``'s [legged] section for ``policy`` (None without one). Raises ConfigError
    naming the key and the fix."""
    from control_node.loop import legged as L
    from control_node.loop._legged import LeggedCycle
    raw = cfg.get("legged")
    if not raw:
        return None
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
