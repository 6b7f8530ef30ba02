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
"""
from __future__ import annotations

import math
import re

from control_node import rundir

OBSERVATION = "/control_node/observation"
ACTION = "/control_node/action"
CYCLE = "/control_node/cycle"
EVENTS = "/control_node/events"
SIM_PENDULUM = "/sim/pendulum"
TOPICS = (OBSERVATION, ACTION, CYCLE, EVENTS, SIM_PENDULUM)
MODE = "/control_node/mode"            # a legged node's mode, each diagnostics snapshot (docs/legged.md)
LEGGED_TOPICS = (MODE,)                # advertised when a legged node's snapshot first carries its mode
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


def schema(topic: str, feature_names=(), action_names=()) -> dict:
    """The JSON schema of a channel (observation and action name their values)."""
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


class Converter:
    """ZeroMQ messages in (decoded msgpack dicts), ``(topic, message, log_time_ns)`` out.

    ``offset_ns``: wall time minus CLOCK_MONOTONIC, fixed once per run. ``every``: see the module doc."""

    def __init__(self, offset_ns: int, every: int = DEFAULT_EVERY, feature_names=None, action_names=None):
        if every < 1:
            raise ValueError("every must be >= 1")
        self.offset_ns, self.every = int(offset_ns), int(every)
        self.feature_names, self.action_names = feature_names, action_names
        self.pending = {}                  # the open cycle window's records
        self.rejected = None               # the last snapshot's counts by reason
        self.transitions_seen = -1         # the last lifecycle transition number reported
        self.phase_offset_ns = 0
        self.mode_seen = None              # a legged node's mode in the last snapshot

    def sensor(self, m: dict):
        x = m.get("x")
        seq = m.get("seq")
        if not isinstance(x, (list, tuple)) or not isinstance(seq, int) or seq % self.every or m.get("warmup"):
            return []
        names = names_for(x, self.feature_names)
        t = int(m.get("t_ns", 0))
        return [(OBSERVATION, {"seq": seq, "t_ns": t, "x": dict(zip(names, map(_num, x)))}, t + self.offset_ns)]

    def action(self, m: dict):
        seq = m.get("seq")
        if not isinstance(seq, int) or seq < 0 or seq % self.every:
            return []
        out = {"seq": seq, "cycle": int(m.get("cycle", -1)), "t_ns": int(m.get("t_ns", 0)),
               "safe": bool(m.get("safe"))}
        if isinstance(m.get("u"), (list, tuple)):
            out["u"] = dict(zip(names_for(m["u"], self.action_names), map(_num, m["u"])))
        else:
            out["action"] = int(m.get("action", -1))
        return [(ACTION, out, out["t_ns"] + self.offset_ns)]

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
        if isinstance(lg, dict) and lg.get("mode"):
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
