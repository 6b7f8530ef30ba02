"""Tracing: is tracefs there with the osnoise and timerlat tracers (what the stall attributor needs)?"""
from __future__ import annotations

import os

from control_node.diagnosis.doctor.context import Ctx
from control_node.diagnosis.doctor.registry import check, item


@check("tracing", "tracefs")
def check_tracefs(ctx: Ctx) -> list[dict]:
    area = "tracing"
    mounts, merr = ctx.mounts
    cfg, _ = ctx.kconfig
    cfg = cfg or {}
    dirs = []
    for m in mounts or ():
        if m.fstype == "tracefs":
            dirs.append(m.path)
        elif m.fstype == "debugfs":
            dirs.append(m.path.rstrip("/") + "/tracing")
    missing_cfg = [k for k in ("CONFIG_OSNOISE_TRACER", "CONFIG_TIMERLAT_TRACER") if cfg.get(k) == "n"]
    kfix = ("a kernel with " + " and ".join(f"{k}=y" for k in missing_cfg) + " (distribution kernels since 5.14 "
            "and PREEMPT_RT kernels have them)") if missing_cfg else ""
    for d in dirs + ["/sys/kernel/tracing"]:
        tracers, err = ctx.read1(f"{d}/available_tracers")
        if tracers is None:
            if os.path.exists(ctx.path(d)) and "does not exist" not in (err or ""):
                ctx.fact("tracefs", "unreadable")
                return [item(area, "tracefs", f"{d}: unreadable", "unknown", err,
                              "run doctor (and the stall attributor) as root")]
            continue
        have = [t for t in ("osnoise", "timerlat") if t in tracers.split()]
        ctx.fact("tracefs", d)
        ctx.fact("tracers", tracers.split())
        value = f"{d}: {tracers}"
        if len(have) == 2:
            return [item(area, "tracefs", value, "ok", "osnoise and timerlat are there: a stall can be "
                          "attributed to the interrupt, softirq or thread that caused it")]
        lacking = [t for t in ("osnoise", "timerlat") if t not in have]
        return [item(area, "tracefs", value, "warn", f"tracefs is mounted but has no {' or '.join(lacking)} "
                      "tracer: stalls can be measured but not attributed",
                      kfix or "a kernel with CONFIG_OSNOISE_TRACER=y and CONFIG_TIMERLAT_TRACER=y")]
    ctx.fact("tracefs", None)
    if mounts is None:
        return [item(area, "tracefs", "unknown", "unknown", merr, "`mount | grep tracefs`")]
    detail = "tracefs is not mounted (not at /sys/kernel/tracing, no debugfs)"
    if missing_cfg:
        detail += "; and this kernel lacks " + ", ".join(missing_cfg)
    fix = "`mount -t tracefs nodev /sys/kernel/tracing`" + (f"; {kfix}" if kfix else "")
    return [item(area, "tracefs", "not mounted", "warn", detail + ": a stall attributor needs it", fix)]


