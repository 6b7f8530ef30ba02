"""Memory and scheduler: transparent huge pages, swap, RT throttling."""
from __future__ import annotations

from control_node.diagnosis.doctor.context import Ctx, bracketed
from control_node.diagnosis.doctor.registry import check, item


@check("memory", "THP")
def check_thp(ctx: Ctx) -> list[dict]:
    area = "memory"
    base = "/sys/kernel/mm/transparent_hugepage"
    out = []
    en, err = ctx.read1(f"{base}/enabled")
    sel = bracketed(en) if en else None
    ctx.fact("thp_enabled", sel or "unknown")
    if en is None:
        if not ctx.exists(base):
            out.append(item(area, "THP enabled", "not built in", "ok",
                             f"{base} does not exist: no transparent huge pages"))
        else:
            out.append(item(area, "THP enabled", "unknown", "unknown", err, f"`cat {base}/enabled` as root"))
    elif sel == "always":
        out.append(item(area, "THP enabled", en, "warn",
                         "every large anonymous mapping gets huge pages: khugepaged scans and collapses the "
                         "node's memory in the background and faults may compact memory first (stalls of ms)",
                         f"`echo madvise > {base}/enabled` (boot: `transparent_hugepage=madvise`)"))
    else:
        out.append(item(area, "THP enabled", en, "ok", "huge pages only where a program asks (madvise) or never"))
    df, err = ctx.read1(f"{base}/defrag")
    dsel = bracketed(df) if df else None
    ctx.fact("thp_defrag", dsel or "unknown")
    if df is None:
        if ctx.exists(base):
            out.append(item(area, "THP defrag", "unknown", "unknown", err, f"`cat {base}/defrag` as root"))
    elif dsel == "always":
        out.append(item(area, "THP defrag", df, "warn",
                         "a page fault that wants a huge page waits for direct reclaim and compaction",
                         f"`echo defer+madvise > {base}/defrag`"))
    else:
        out.append(item(area, "THP defrag", df, "ok", "no direct compaction on ordinary page faults"))
    return out


@check("memory", "swap")
def check_swap(ctx: Ctx) -> list[dict]:
    area = "memory"
    devs, err = ctx.fs.swaps()
    sw, _ = ctx.read1("/proc/sys/vm/swappiness")
    ctx.fact("swappiness", int(sw) if sw and sw.isdigit() else None)
    if devs is None:
        ctx.fact("swap_kb", None)
        return [item(area, "swap", "unknown", "unknown", err, "`swapon --show`")]
    total = sum(d.size_kb for d in devs)
    ctx.fact("swap_kb", total)
    swp = f", vm.swappiness {sw}" if sw is not None else ""
    if not devs:
        return [item(area, "swap", f"off{swp}", "ok", "no swap: nothing of the node can be paged out")]
    value = (f"on: {', '.join(d.name for d in devs)} ({total // 1024} MiB, {sum(d.used_kb for d in devs) // 1024} MiB "
             f"used){swp}")
    m = ctx.priv.get("mlockall", {})
    if m.get("granted"):
        return [item(area, "swap", value, "ok",
                      f"the node mlocks its memory ({m.get('how', 'granted')}), so none of it is swapped; other "
                      "processes' swapping still costs the machine disk I/O")]
    return [item(area, "swap", value, "warn",
                  f"mlockall is not granted ({m.get('detail') or 'see privileges'}): the node's pages can be "
                  "swapped out and the next touch waits for the disk (ms)",
                  "`swapoff -a` and remove the swap lines from /etc/fstab, or grant mlock: run the node with "
                  "`ulimit -l unlimited` (limits.conf: `@realtime - memlock unlimited`; systemd: "
                  "LimitMEMLOCK=infinity) or CAP_IPC_LOCK")]


@check("scheduler", "RT throttling")
def check_rt_throttling(ctx: Ctx) -> list[dict]:
    spin_us = ctx.spin_us
    area = "scheduler"
    rt, err = ctx.read1("/proc/sys/kernel/sched_rt_runtime_us")
    per, err2 = ctx.read1("/proc/sys/kernel/sched_rt_period_us")
    ctx.fact("sched_rt_runtime_us", int(rt) if rt and rt.lstrip("-").isdigit() else None)
    ctx.fact("sched_rt_period_us", int(per) if per and per.isdigit() else None)
    if rt is None or per is None or not rt.lstrip("-").isdigit() or not per.isdigit():
        return [item(area, "RT throttling", "unknown", "unknown", err or err2 or f"unparsable: {rt!r} {per!r}",
                      "`sysctl kernel.sched_rt_runtime_us kernel.sched_rt_period_us`")]
    rt_i, per_i = int(rt), int(per)
    if rt_i < 0 or rt_i >= per_i:
        return [item(area, "RT throttling", f"off (runtime {rt_i} / period {per_i} µs)", "ok",
                      "a SCHED_FIFO thread is never stopped for other tasks: a runaway loop owns its core")]
    stop_ms = (per_i - rt_i) / 1000
    return [item(area, "RT throttling", f"{rt_i} / {per_i} µs ({100 * rt_i / per_i:g}% for real-time tasks)",
                  "warn",
                  f"a SCHED_FIFO thread that is busy 100% of the time is stopped for {stop_ms:g} ms every "
                  f"{per_i / 1000:g} ms. The node sleeps until [loop] spin_us ({spin_us:g} µs) before "
                  "each tick and spins only then, so a 1 kHz loop whose cycles fit is not throttled; a loop that "
                  "overruns continuously, or spin_us near the period, would lose whole milliseconds",
                  "`sysctl -w kernel.sched_rt_runtime_us=-1` (persist: `echo kernel.sched_rt_runtime_us=-1 > "
                  "/etc/sysctl.d/90-rt.conf`): with it off, keep the node's watchdog and a spare core for recovery")]


