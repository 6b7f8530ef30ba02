"""The loop core: which one, its SMT siblings, and the kernel threads that may run on it."""
from __future__ import annotations

import re

from control_node.diagnosis.doctor.context import Ctx
from control_node.diagnosis.doctor.registry import check, item
from control_node.procfs import format_cpulist, parse_cpulist

# kernel threads with a CPU-wide affinity that are known to take long slices (reclaim, compaction, huge
# page collapse, DAMON, KSM): named in the kthreads check when they may run on the loop core
NOTABLE_KTHREADS = ("kswapd", "kcompactd", "khugepaged", "kdamond", "ksmd", "kworker/u", "rcu_preempt",
                    "rcu_sched", "rcuog", "rcuop")


@check("loop core", "loop core")
def check_loop_core(ctx: Ctx) -> list[dict]:
    return ctx.core.items


@check("loop core", "SMT siblings", per_core=True)
def check_smt(ctx: Ctx) -> list[dict]:
    area = "loop core"
    p = f"/sys/devices/system/cpu/cpu{ctx.loop_cpu}/topology/thread_siblings_list"
    text, err = ctx.read1(p)
    if text is None:
        return [item(area, "SMT siblings", "unknown", "unknown", err, "check as root")]
    try:
        sib = parse_cpulist(text) - {ctx.loop_cpu}
    except ValueError:
        return [item(area, "SMT siblings", text, "unknown", f"{p}: cannot parse {text!r}", "")]
    ctx.fact("smt_siblings", format_cpulist(sib) or None)
    virt, _ = ctx.virtualized
    if not sib:
        return [item(area, "SMT siblings", f"none (core {ctx.loop_cpu} alone)", "ok",
                      "no other hardware thread shares the core" + (
                          " (as far as the guest topology tells: the host may still run another vCPU on the "
                          "same physical core)" if virt else ""))]
    others = format_cpulist(sib)
    return [item(area, "SMT siblings", f"core {ctx.loop_cpu} shares a physical core with CPU {others}", "warn",
                  f"whatever runs on CPU {others} competes for the same pipeline and caches: the loop's cycle "
                  "time varies with it",
                  f"keep CPU {others} idle too (isolcpus={format_cpulist(sib | {ctx.loop_cpu})} and run nothing "
                  "there), or disable SMT: `echo off > /sys/devices/system/cpu/smt/control` (boot: `nosmt`)")]


@check("kernel threads", "kthreads on the loop core", cost="scan", per_core=True)
def check_kthreads(ctx: Ctx) -> list[dict]:
    area = "kernel threads"
    c = ctx.loop_cpu
    try:
        pids = ctx.fs.pids()
        kthreads = ctx.fs.kernel_threads(pids)
    except OSError as e:
        return [item(area, "kthreads on the loop core", "unknown", "unknown", f"/proc: {e.strerror}", "")]
    bound, movable, unread = [], [], 0
    for kt in kthreads:
        if kt.cpus is None:
            unread += 1
        elif c in kt.cpus:
            (bound if kt.cpus == {c} else movable).append((kt.pid, kt.comm))
    if not bound and not movable and unread == 0 and not pids:
        return [item(area, "kthreads on the loop core", "unknown", "unknown", "no processes under /proc", "")]
    notable = [(pid, comm) for pid, comm in movable if comm.startswith(NOTABLE_KTHREADS)]
    bnames = ", ".join(sorted({re.sub(r"/\d+(:\d+)?H?", "/N", comm).split("-")[0] for _, comm in bound}))
    value = f"{len(movable)} may run on core {c} ({len(notable)} notable), {len(bound)} bound to it"
    detail = (f"notable: {', '.join(comm for _, comm in sorted(notable, key=lambda x: x[1]))}. " if notable else "") + (
        f"bound to core {c} by design (per-CPU work, shrinks with isolcpus/nohz_full): {bnames}" if bound else "")
    if unread:
        detail += f"; {unread} kernel threads' affinity unreadable"
    housekeeping = format_cpulist((ctx.online or ctx.allowed or {c}) - {c})
    if not notable:
        return [item(area, "kthreads on the loop core", value, "ok",
                      "no reclaim/compaction/huge-page/RCU kernel thread may run there. " + detail)]
    movable_pids = [p for p, comm in sorted(notable) if not comm.startswith("kworker/")]
    pids_s = " ".join(str(p) for p in movable_pids)
    mask = format(sum(1 << i for i in parse_cpulist(housekeeping)), "x") if housekeeping else "1"
    return [item(area, "kthreads on the loop core", value, "warn",
                  "these unbound kernel threads (memory reclaim, compaction, huge-page collapse, DAMON, RCU, unbound "
                  f"workqueues) may be scheduled on core {c}; a SCHED_FIFO loop preempts them only at preemption "
                  "points. " + detail,
                  (f"`for p in {pids_s}; do taskset -pc {housekeeping or 0} $p; done`; " if pids_s else "")
                  + f"unbound workqueues (kworker/u*): `echo {mask} > /sys/devices/virtual/workqueue/cpumask`; at "
                  f"boot `isolcpus=domain,{c}` keeps kernel threads on the housekeeping CPUs")]


