"""Kernel checks: the preemption model and HZ with high-resolution timers."""
from __future__ import annotations

import re

from control_node.diagnosis.doctor.context import GRUB, Ctx, bracketed
from control_node.diagnosis.doctor.registry import check, item


@check("kernel", "preemption")
def check_preemption(ctx: Ctx) -> list[dict]:
    area = "kernel"
    version, verr = ctx.read1("/proc/sys/kernel/version")
    release, _ = ctx.read1("/proc/sys/kernel/osrelease")
    ctx.fact("kernel", release)
    ctx.fact("kernel_version", version)
    cfg, cfg_src = ctx.kconfig
    cfg = cfg or {}
    rt_flag, _ = ctx.read1("/sys/kernel/realtime")
    dbg, dbg_err = ctx.read1("/sys/kernel/debug/sched/preempt")
    mounts, _ = ctx.mounts
    if dbg is None and mounts is not None and not any(m.fstype == "debugfs" for m in mounts):
        dbg_err = "debugfs is not mounted"
    tokens = set(re.findall(r"\bPREEMPT\w*", version or ""))
    if version and re.search(r"\bPREEMPT RT\b", version):
        tokens.add("PREEMPT_RT")
    is_rt = rt_flag == "1" or "PREEMPT_RT" in tokens or cfg.get("CONFIG_PREEMPT_RT") == "y"
    dynamic = "PREEMPT_DYNAMIC" in tokens or cfg.get("CONFIG_PREEMPT_DYNAMIC") == "y"
    mode = how = None
    if is_rt:
        mode, how = "rt", "PREEMPT_RT kernel (" + ("/sys/kernel/realtime = 1" if rt_flag == "1" else
                                                   "uname -v" if "PREEMPT_RT" in tokens else cfg_src) + ")"
    elif dbg and bracketed(dbg.replace("(", "[").replace(")", "]")):
        mode = bracketed(dbg.replace("(", "[").replace(")", "]"))
        how = f"current mode from /sys/kernel/debug/sched/preempt ({dbg})"
    if mode is None and dynamic:
        params, _ = ctx.cmdline
        if params and params.get("preempt"):
            mode, how = params["preempt"], f"PREEMPT_DYNAMIC, preempt={params['preempt']} on the kernel command line"
    if mode is None and cfg:
        for key, m in (("CONFIG_PREEMPT_NONE", "none"), ("CONFIG_PREEMPT_VOLUNTARY", "voluntary"),
                       ("CONFIG_PREEMPT", "full"), ("CONFIG_PREEMPT_LAZY", "lazy")):
            if cfg.get(key) == "y":
                mode = m
                how = (f"PREEMPT_DYNAMIC with boot default {key}=y ({cfg_src}) and no preempt= on the command "
                       f"line; the live mode (/sys/kernel/debug/sched/preempt) is not readable: {dbg_err}"
                       if dynamic else f"{key}=y ({cfg_src})")
                break
    if mode is None and version is not None and not dynamic:
        if "PREEMPT" in tokens:
            mode, how = "full", f"uname -v: {version}"
        elif "PREEMPT_LAZY" in tokens:
            mode, how = "lazy", f"uname -v: {version}"
        elif not tokens:
            mode, how = "none/voluntary", f"no PREEMPT in uname -v ({version}); no kernel config ({cfg_src})"
    ctx.fact("preempt", mode or "unknown")
    if mode is None:
        why = [verr] if verr else []
        why += [f"kernel config: {cfg_src}" if not cfg else "kernel config names no CONFIG_PREEMPT* model",
                f"debugfs: {dbg_err}"]
        if dynamic:
            why.insert(0, "PREEMPT_DYNAMIC kernel and no preempt= on the command line")
        return [item(area, "preemption", "unknown", "unknown", "; ".join(why),
                      "mount debugfs (`mount -t debugfs none /sys/kernel/debug`) and rerun as root, or "
                      "`modprobe configs` for /proc/config.gz")]
    rt_fix = ("for a bounded worst case install a PREEMPT_RT kernel (Debian: `apt install linux-image-rt-amd64`; "
              "Ubuntu: `pro enable realtime-kernel`; RHEL/Fedora: kernel-rt)")
    if mode == "rt":
        return [item(area, "preemption", "PREEMPT_RT", "ok", how + ": interrupt handlers run in threads and "
                      "spinlocks sleep, so a SCHED_FIFO loop preempts nearly all kernel work")]
    if mode in ("full", "lazy"):
        return [item(area, "preemption", mode, "warn",
                      f"{how}. Kernel code is preemptible except under spinlocks and in interrupt handlers, which "
                      "still delay the loop's wake-up (tens of µs, more under I/O load)", rt_fix)]
    dyn_fix = f"boot with `preempt=full`: {GRUB}; " if dynamic else ""
    return [item(area, "preemption", mode, "bad",
                  f"{how}. Kernel code runs to the next preemption point before the woken SCHED_FIFO loop gets "
                  "the CPU: a system call or page-cache work on the loop core can delay a tick by milliseconds "
                  "(isolcpus on the loop core narrows it to kernel threads and interrupts)",
                  dyn_fix + rt_fix)]


@check("kernel", "HZ")
def check_hz(ctx: Ctx) -> list[dict]:
    area = "kernel"
    cfg, src = ctx.kconfig
    if not cfg or not cfg.get("CONFIG_HZ", "").isdigit():
        return [item(area, "HZ", "unknown", "unknown",
                      f"CONFIG_HZ comes from the kernel config: {src if not cfg else 'CONFIG_HZ missing in ' + src}",
                      "`modprobe configs` (for /proc/config.gz) or install /boot/config-$(uname -r)")]
    hz = int(cfg["CONFIG_HZ"])
    ctx.fact("hz", hz)
    hres = cfg.get("CONFIG_HIGH_RES_TIMERS") == "y"
    params, _ = ctx.cmdline
    if params and params.get("highres") == "off":
        hres = False
    ctx.fact("high_res_timers", hres)
    tick = f"tick every {1000 / hz:g} ms"
    if not hres:
        return [item(area, "HZ", f"{hz} ({tick}), no high-resolution timers", "bad" if hz < 1000 else "warn",
                      "without high-resolution timers a sleep ends on a tick, so the 1 ms loop wakes on "
                      f"{1000 / hz:g} ms boundaries",
                      "a kernel with CONFIG_HIGH_RES_TIMERS=y (every distribution kernel), and no highres=off")]
    return [item(area, "HZ", f"{hz} ({tick}), high-resolution timers on", "ok",
                  "the loop's clock_nanosleep wakes on a high-resolution timer, not on the tick, so HZ does not "
                  f"limit a 1 kHz loop; the tick itself interrupts the loop core {hz} times a second unless "
                  "nohz_full covers it (see isolation)")]


