"""Virtualization: steal time since boot and over a live sample."""
from __future__ import annotations

from control_node.diagnosis.doctor.context import Ctx
from control_node.diagnosis.doctor.registry import check, item

STEAL_WARN_PCT, STEAL_BAD_PCT = 1.0, 5.0


def _steal_verdict(pct):
    return "bad" if pct >= STEAL_BAD_PCT else "warn" if pct >= STEAL_WARN_PCT else "ok"


STEAL_FIX = ("the host runs other work on this VM's physical cores: give the VM dedicated cores (pin its vCPUs, "
             "libvirt <vcputune><vcpupin>; isolcpus on the host), a dedicated/bare-metal instance type, or no CPU "
             "overcommit on the host")


def _steal_and_total(ctx: Ctx):
    """{cpu: (steal, total)} from /proc/stat read now (uncached: the live sample reads it twice), or
    (None, reason)."""
    stat, err = ctx.fs.stat()
    if stat is None:
        return None, err
    return {cpu: (t.steal, t.total) for cpu, t in stat.items()}, None


@check("virtualization", "steal since boot")
def check_steal(ctx: Ctx) -> list[dict]:
    area = "virtualization"
    stat, err = _steal_and_total(ctx)
    if stat is None:
        ctx.fact("steal_pct_since_boot", None)
        return [item(area, "steal since boot", "unknown", "unknown", err, "`cat /proc/stat`")]
    pct = {cpu: (100.0 * s / t if t else 0.0) for cpu, (s, t) in stat.items()}
    ctx.fact("steal_pct_since_boot", {str(k): round(v, 2) for k, v in sorted(pct.items())})
    value = ", ".join(f"cpu{k} {v:.2f}%" for k, v in sorted(pct.items()))
    key = ctx.loop_cpu if ctx.loop_cpu in pct else max(pct, key=pct.get)
    verdict = _steal_verdict(pct[key])
    return [item(area, "steal since boot", value, verdict,
                  f"time the host ran something else while this vCPU wanted to run, as a share of all its time since "
                  f"boot (core {key}: {pct[key]:.2f}%); each steal is a stall the loop cannot see coming",
                  "" if verdict == "ok" else STEAL_FIX)]


@check("virtualization", "steal live", cost="sample")
def check_steal_live(ctx: Ctx) -> list[dict]:
    seconds = ctx.sample
    if not seconds or seconds <= 0:
        return []
    area = "virtualization"
    name = f"steal live ({seconds:g} s)"
    first, err = _steal_and_total(ctx)
    if first is None:
        return [item(area, name, "unknown", "unknown", err, "`cat /proc/stat`")]
    ctx.sleep(seconds)
    second, err = _steal_and_total(ctx)
    if second is None:
        return [item(area, name, "unknown", "unknown", err, "`cat /proc/stat`")]
    pct, floor, ticks = {}, {}, {}
    for cpu, (s1, t1) in second.items():
        if cpu in first:
            s0, t0 = first[cpu]
            if t1 > t0:
                pct[cpu] = 100.0 * (s1 - s0) / (t1 - t0)
                # the counters are whole ticks: n ticks may be as little as n-1 ticks of real steal
                floor[cpu] = 100.0 * max(0, s1 - s0 - 1) / (t1 - t0)
                ticks[cpu] = s1 - s0
    if not pct:
        return [item(area, name, "unknown", "unknown", "/proc/stat did not advance during the sample",
                      "rerun with a longer --sample")]
    value = ", ".join(f"cpu{k} {v:.1f}%" for k, v in sorted(pct.items()))
    key = ctx.loop_cpu if ctx.loop_cpu in pct else max(pct, key=pct.get)
    verdict = _steal_verdict(floor[key])
    ctx.fact("steal_pct_live", {str(k): round(v, 2) for k, v in sorted(pct.items())})
    return [item(area, name, value, verdict,
                  f"steal over the last {seconds:g} s (core {key}: {pct[key]:.1f}%, {ticks[key]} ticks). /proc/stat "
                  "counts whole ticks (10 ms), so the verdict uses one tick less; steal comes in bursts: --sample "
                  "10 sees more",
                  "" if verdict == "ok" else STEAL_FIX)]


