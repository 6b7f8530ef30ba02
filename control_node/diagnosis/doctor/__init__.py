"""``control-node doctor``: is this machine ready for a 1 kHz real-time loop?

Every check reads files under a ``root`` prefix (default ``/``) through :mod:`control_node.procfs`, so
the tests point it at fake ``/proc`` and ``/sys`` trees. Each check is registered with
``@check(area, name, cost)`` (:mod:`.registry`) and returns items::

    {"area", "check", "value", "verdict", "detail", "fix"}

``verdict`` is ``ok``, ``warn``, ``bad`` or ``unknown``; ``unknown`` means a file could not be read and
``detail`` says which and why (nothing is guessed). ``fix`` is a concrete command or setting. Checks
share only what the context (:mod:`.context`) derives on first use, so any running order gives the
same verdicts; the report is sorted by area.

The privilege probes (affinity, SCHED_FIFO, mlockall, /dev/cpu_dma_latency) run in a short-lived child
process (``probe_privileges.py``), so doctor itself changes nothing; ``probe_privileges=False`` derives
them from the capabilities and limits in ``/proc/self/status`` and ``/proc/self/limits`` instead (what
the fake trees use).

:func:`machine_facts` is the cheap subset (no live sample, no probes, no process scan) the node records in
each run's summary.json; it never raises. docs/doctor.md explains each check for a 1 kHz loop.
"""
from __future__ import annotations

import time

# the check modules register themselves on import, in report order within each area
from control_node.diagnosis.doctor import core, kernel, clock, memory, isolation, virtualization  # noqa: F401
from control_node.diagnosis.doctor import privileges, tracing  # noqa: F401
from control_node.diagnosis.doctor.context import Ctx
from control_node.diagnosis.doctor.output import format_text, print_rich
from control_node.diagnosis.doctor.registry import AREAS, CHECKS, VERDICTS, check, run_checks

__all__ = ["AREAS", "CHECKS", "VERDICTS", "Ctx", "check", "exit_code", "format_text", "machine_facts", "print_rich",
           "run_checks", "run_doctor", "summary_line"]


def run_doctor(root="/", cpu=None, sample: float = 1.0, probe_privileges: bool = True, priority: int = 80,
               spin_us: float = 150, sleep=time.sleep) -> dict:
    """Every check. ``cpu``: a core number, "last" (default: the highest CPU of the affinity mask) or "none".
    ``sample``: seconds of live steal sampling (0: skip). ``probe_privileges``: try them in a child process
    (else judge them from capabilities and limits). Returns {"checks", "summary", "machine", "exit_code", ...}."""
    ctx = Ctx(root, cpu=cpu, probe=probe_privileges, priority=priority, spin_us=spin_us, sample=sample or 0.0,
              sleep=sleep)
    checks = run_checks(ctx, CHECKS)
    virt, _ = ctx.virtualized
    ctx.fact("virtualized", virt)
    counts = {v: sum(1 for c in checks if c["verdict"] == v) for v in VERDICTS}
    return {"root": ctx.root, "loop_cpu": ctx.loop_cpu, "privileges_probed": ctx.priv_probed,
            "checks": checks, "summary": dict(counts, line=summary_line(counts)),
            "machine": ctx.facts, "exit_code": 1 if counts["bad"] else 0,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def machine_facts(root="/", cpu=None) -> dict:
    """The facts doctor finds, cheaply (the checks of cost ``read``: file reads only, no live sample, no
    privilege probe, no process scan; about 10 ms): kernel, preemption model, HZ, clocksource, cpuidle,
    governor, SMT, THP, RT throttling, swap, command-line isolation, IRQs on the loop core, steal since
    boot, tracefs, and the privileges as capabilities and limits grant them, plus ``verdicts``
    {check: verdict}. Never raises: what cannot be read is "unknown" or None. The node records it in each
    run's summary.json."""
    try:
        ctx = Ctx(root, cpu=cpu)
        checks = run_checks(ctx, [c for c in CHECKS if c.cost == "read"])
        ctx.priv                                          # the priv_* facts, from capabilities and limits
        virt, _ = ctx.virtualized
        ctx.fact("virtualized", virt)
        facts = dict(ctx.facts)
        facts["verdicts"] = {c["check"]: c["verdict"] for c in checks}
        return facts
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def summary_line(counts: dict) -> str:
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)


def exit_code(result: dict) -> int:
    """0 when no check is `bad`, 1 when any is."""
    return 1 if any(c["verdict"] == "bad" for c in result["checks"]) else 0
