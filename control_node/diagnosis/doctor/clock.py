"""Clock and power: the clocksource, cpuidle (with /dev/cpu_dma_latency) and the cpufreq governor."""
from __future__ import annotations

import os
import re

from control_node.diagnosis.doctor.context import GRUB, Ctx
from control_node.diagnosis.doctor.registry import check, item

DEEP_IDLE_US = 10          # an idle state slower than this to leave costs a 1 kHz loop its budget


@check("clock and timers", "clocksource")
def check_clocksource(ctx: Ctx) -> list[dict]:
    area = "clock and timers"
    base = "/sys/devices/system/clocksource/clocksource0"
    cur, err = ctx.read1(f"{base}/current_clocksource")
    avail, _ = ctx.read1(f"{base}/available_clocksource")
    avail_l = (avail or "").split()
    ctx.fact("clocksource", cur or "unknown")
    if cur is None:
        return [item(area, "clocksource", "unknown", "unknown", err,
                      f"check `cat {base}/current_clocksource` as root")]
    value = cur + (f" (available: {' '.join(avail_l)})" if avail_l else "")
    switch = (f"`echo tsc > {base}/current_clocksource` now; keep it with `clocksource=tsc tsc=reliable` at boot "
              f"({GRUB}) only when the host gives an invariant TSC (constant_tsc nonstop_tsc in /proc/cpuinfo)"
              if "tsc" in avail_l else
              "the kernel did not list the TSC (judged unstable): on a host with an invariant TSC boot with "
              f"`tsc=reliable clocksource=tsc` ({GRUB})")
    if cur in ("tsc", "arch_sys_counter", "riscv_clocksource"):
        return [item(area, "clocksource", value, "ok", "read in user space (vDSO) in tens of ns: the loop reads "
                      "the clock several times per cycle")]
    if cur == "kvm-clock":
        return [item(area, "clocksource", value, "warn",
                      "kvm-clock (pvclock) is read through a page the host updates: slower than the TSC and "
                      "stepped when the host adjusts it, which shows up as wake-up jitter", switch)]
    if cur in ("hpet", "acpi_pm"):
        return [item(area, "clocksource", value, "warn",
                      f"{cur} has no vDSO read: every clock_gettime is a system call to a slow device register "
                      "(about 0.5-2 µs), several times per cycle", switch)]
    if cur in ("jiffies", "refined-jiffies"):
        return [item(area, "clocksource", value, "bad", "a tick-based clock: time advances in 1/HZ steps",
                      switch)]
    return [item(area, "clocksource", value, "warn", f"{cur} is not a clocksource doctor knows to be fast "
                  "(tsc on x86, arch_sys_counter on arm64)", switch)]


@check("power management", "cpuidle")
def check_cpuidle(ctx: Ctx) -> list[dict]:
    area = "power management"
    drv, err = ctx.read1("/sys/devices/system/cpu/cpuidle/current_driver")
    gov, _ = ctx.read1("/sys/devices/system/cpu/cpuidle/current_governor_ro")
    if gov is None:
        gov, _ = ctx.read1("/sys/devices/system/cpu/cpuidle/current_governor")
    params, _ = ctx.cmdline
    idle_param = (params or {}).get("idle")
    dma = "/dev/cpu_dma_latency"
    dma_w = ctx.priv.get("cpu_dma_latency", {}).get("granted")
    if dma_w is None:
        dma_w = os.access(ctx.path(dma), os.W_OK)
    ctx.fact("cpuidle_driver", drv or "unknown")
    dma_note = f"; {dma} {'writable' if dma_w else 'not writable'}"
    if idle_param == "poll":
        return [item(area, "cpuidle", f"idle=poll (driver {drv})", "ok",
                      "idle CPUs spin instead of halting: no exit latency (and no power saving)")]
    if drv is None and not ctx.exists("/sys/devices/system/cpu/cpuidle"):
        err = "/sys/devices/system/cpu/cpuidle does not exist (kernel without CONFIG_CPU_IDLE)"
        drv = "none"
    if drv is None:
        return [item(area, "cpuidle", "unknown", "unknown", err, "check as root")]
    states = []
    if ctx.loop_cpu is not None:
        sdir = ctx.path(f"/sys/devices/system/cpu/cpu{ctx.loop_cpu}/cpuidle")
        try:
            names = sorted((n for n in os.listdir(sdir) if re.fullmatch(r"state\d+", n)), key=lambda n: int(n[5:]))
        except OSError:
            names = []
        for n in names:
            p = f"/sys/devices/system/cpu/cpu{ctx.loop_cpu}/cpuidle/{n}"
            name, _ = ctx.read1(f"{p}/name")
            lat, _ = ctx.read1(f"{p}/latency")
            dis, _ = ctx.read1(f"{p}/disable")
            if lat is not None and lat.isdigit():
                states.append((n, name or n, int(lat), dis == "1"))
    ctx.fact("cpuidle_states", [f"{nm}:{lat}us" + (":off" if off else "") for _, nm, lat, off in states])
    virt, _ = ctx.virtualized
    cfg, _ = ctx.kconfig
    if drv == "none":
        detail = ("no cpuidle driver: an idle CPU executes the architecture's default halt (HLT)"
                  + (", which in a VM exits to the host; waking the loop then takes the host's wake-up latency "
                     "(tens of µs)" if virt else "")
                  + ". /dev/cpu_dma_latency has no idle state to choose from")
        haltpoll = (cfg or {}).get("CONFIG_HALTPOLL_CPUIDLE") in ("y", "m")
        fix = ("boot with `cpuidle_haltpoll.force=1` (this kernel has CONFIG_HALTPOLL_CPUIDLE: the guest polls "
               "briefly before halting) or `idle=poll` (idle vCPUs spin: costs host CPU); " if virt and haltpoll else
               "boot with `idle=poll` (idle CPUs spin; costs power/host CPU); " if virt else "")
        fix += GRUB if fix else ""
        return [item(area, "cpuidle", f"driver none (governor {gov}){dma_note}", "warn" if virt else "ok", detail,
                      fix or "nothing needed on bare metal (HLT exits in about 1 µs)")]
    value = f"driver {drv}, governor {gov}; core {ctx.loop_cpu}: " + (
        ", ".join(f"{nm} {lat} µs" + (" (disabled)" if off else "") for _, nm, lat, off in states) or "no states"
    ) + dma_note
    deep = [(n, nm, lat) for n, nm, lat, off in states if lat > DEEP_IDLE_US and not off]
    if not deep:
        return [item(area, "cpuidle", value, "ok", f"no enabled idle state takes longer than {DEEP_IDLE_US} µs "
                      "to leave")]
    worst = max(lat for _, _, lat in deep)
    if dma_w:
        return [item(area, "cpuidle", value, "ok",
                      f"deep states up to {worst} µs, but {dma} is writable: the node holds it at 0 while it runs, "
                      "so only the shallowest state is used")]
    disable = " && ".join(f"echo 1 > /sys/devices/system/cpu/cpu{ctx.loop_cpu}/cpuidle/{n}/disable"
                          for n, _, _ in deep)
    return [item(area, "cpuidle", value, "warn",
                  f"idle states up to {worst} µs exit latency and {dma} is not writable by this user, so the node "
                  "cannot keep the core out of them: each wake-up from the sleep before the tick pays that",
                  f"let the node write {dma} (run it as root, or a udev rule: KERNEL==\"cpu_dma_latency\", "
                  f"GROUP=\"realtime\", MODE=\"0660\"), or disable the deep states on the loop core: `{disable}`")]


@check("power management", "cpufreq governor", per_core=True)
def check_cpufreq(ctx: Ctx) -> list[dict]:
    area = "power management"
    d = f"/sys/devices/system/cpu/cpu{ctx.loop_cpu}/cpufreq"
    gov, err = ctx.read1(f"{d}/scaling_governor")
    drv, _ = ctx.read1(f"{d}/scaling_driver")
    ctx.fact("cpufreq_governor", gov)
    if gov is None and not ctx.exists(d):
        virt, _ = ctx.virtualized
        if virt:
            return [item(area, "cpufreq governor", "no cpufreq (VM: host decides)", "unknown",
                          f"{d} does not exist: the guest cannot see or set the clock of the host core behind "
                          "this vCPU",
                          "on the host: `cpupower frequency-set -g performance` for the cores backing this vCPU "
                          "(and pin the vCPU there)")]
        return [item(area, "cpufreq governor", "no cpufreq driver", "unknown",
                      f"{d} does not exist: the firmware decides the clock",
                      "BIOS/UEFI: a maximum-performance power profile; or load a cpufreq driver "
                      "(`modprobe acpi-cpufreq`) and set the performance governor")]
    if gov is None:
        return [item(area, "cpufreq governor", "unknown", "unknown", err, f"`cat {d}/scaling_governor` as root")]
    value = f"{gov}" + (f" ({drv})" if drv else "")
    if gov == "performance":
        return [item(area, "cpufreq governor", value, "ok", "the core stays at its highest clock")]
    return [item(area, "cpufreq governor", value, "warn",
                  f"{gov} lowers the clock when the core looks idle; the loop sleeps most of each period, so "
                  "cycles run slower and ramping the clock adds latency",
                  f"`cpupower -c {ctx.loop_cpu} frequency-set -g performance` (or `echo performance > "
                  f"{d}/scaling_governor`)")]


