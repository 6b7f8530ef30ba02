"""The check registry: ``@check(area, name, cost)`` registers a function ``fn(ctx) -> [item, ...]``.

A check reads only the context (files under its root, and the shared facts the context derives on first
use: the loop core, the privileges, the kernel config), never what another check left behind, so the
checks give the same verdicts in any running order. The report is sorted by area, then by the order the
checks were registered in, whatever order they ran in.

``cost`` says what a check does besides reading files: ``read`` (nothing: ``machine_facts`` runs these),
``sample`` (sleeps for the live steal sample), ``scan`` (walks every /proc/PID) or ``probe`` (the
privileges, tried in a child process when doctor probes). ``per_core``: the check is about the loop core;
while that is unknown (no affinity mask, no online list, a bad ``--cpu``) it is ``unknown`` with the
reason, without running.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

VERDICTS = ("bad", "warn", "ok", "unknown")
AREAS = ("loop core", "kernel", "clock and timers", "power management", "memory", "scheduler", "isolation",
         "interrupts", "virtualization", "kernel threads", "privileges", "tracing")
COSTS = ("read", "sample", "scan", "probe")


def item(area, check, value, verdict, detail="", fix=""):
    """One line of the report: {"area", "check", "value", "verdict", "detail", "fix"}."""
    assert verdict in VERDICTS, verdict
    return {"area": area, "check": check, "value": str(value), "verdict": verdict, "detail": detail, "fix": fix}


@dataclass(frozen=True)
class Check:
    area: str
    name: str
    fn: Callable
    cost: str
    per_core: bool = False


CHECKS: list[Check] = []


def check(area: str, name: str, cost: str = "read", per_core: bool = False):
    """Register ``fn(ctx) -> list[item]`` as the check ``name`` of ``area``; each (area, name) and each
    function once."""
    if area not in AREAS:
        raise ValueError(f"doctor check {name!r}: unknown area {area!r} (one of {', '.join(AREAS)})")
    if cost not in COSTS:
        raise ValueError(f"doctor check {name!r}: cost {cost!r} is not one of {', '.join(COSTS)}")

    def register(fn):
        for c in CHECKS:
            if (c.area, c.name) == (area, name) or c.fn is fn:
                raise ValueError(f"doctor check {area}/{name} ({fn.__qualname__}) is already registered "
                                 f"as {c.area}/{c.name} ({c.fn.__qualname__})")
        CHECKS.append(Check(area, name, fn, cost, per_core))
        return fn
    return register


def run_one(c: Check, ctx) -> list[dict]:
    """A check's items; a check that raises becomes one ``unknown`` item with the reason (a check must
    never take doctor down)."""
    if c.per_core and ctx.loop_cpu is None:
        return [item(c.area, c.name, "unknown", "unknown", f"the loop core is unknown: {ctx.cpu_reason}",
                     "pass --cpu N")]
    try:
        return list(c.fn(ctx))
    except Exception as e:
        return [item(c.area, c.name, "unknown", "unknown", f"doctor could not evaluate it: {type(e).__name__}: {e}",
                     "report this as a doctor bug")]


def run_checks(ctx, checks) -> list[dict]:
    """Run ``checks`` in the order given; the items come back sorted by area, then registration order."""
    rank = {(c.area, c.name): i for i, c in enumerate(CHECKS)}
    area_rank = {a: i for i, a in enumerate(AREAS)}
    tagged = []
    for c in checks:
        for it in run_one(c, ctx):
            tagged.append(((area_rank[it["area"]], rank.get((c.area, c.name), len(rank))), len(tagged), it))
    tagged.sort(key=lambda t: (t[0], t[1]))
    return [it for _, _, it in tagged]
