"""Isolation of the loop core: the kernel command line (isolcpus, nohz_full, rcu_nocbs, irqaffinity) and
the IRQs that may land on it."""
from __future__ import annotations

import re

from control_node.diagnosis.doctor.context import GRUB, Ctx
from control_node.diagnosis.doctor.registry import check, item
from control_node.procfs import format_cpulist, parse_cpulist, parse_hexmask


@check("isolation", "kernel command line")
def check_isolation(ctx: Ctx) -> list[dict]:
    area = "isolation"
    params, err = ctx.cmdline
    names = ("isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity")
    if params is None:
        return [item(area, n, "unknown", "unknown", err, "`cat /proc/cmdline` as root") for n in names]
    if ctx.loop_cpu is None:
        return [item(area, n, "unknown", "unknown", f"the loop core is unknown: {ctx.cpu_reason}", "pass --cpu N")
                for n in names]
    c = ctx.loop_cpu
    everyone = ctx.online or ctx.allowed or {c}
    max_cpu = max(everyone | {c})
    housekeeping = format_cpulist(everyone - {c}) or "0"
    cfg, _ = ctx.kconfig
    cfg = cfg or {}
    ctx.fact("cmdline", {n: params[n] for n in names if n in params})
    out = []

    def covered(name):
        v = params.get(name)
        if v is None:
            return None, None
        cpus = ",".join(p for p in v.split(",") if not re.fullmatch(r"[a-z_]+", p) or p == "all")
        try:
            return v, parse_cpulist(cpus, max_cpu)
        except ValueError:
            return v, set()

    # isolcpus
    v, cpus = covered("isolcpus")
    isolated, _ = ctx.read1("/sys/devices/system/cpu/isolated")
    few = f" (with {len(everyone)} CPUs this leaves {housekeeping} for everything else)" if len(everyone) <= 4 else ""
    if v is not None and c in cpus:
        out.append(item(area, "isolcpus", f"isolcpus={v}", "ok",
                         f"the scheduler places no other task on core {c}; only pinned threads (the node's loop) "
                         "run there" + (f" (/sys/devices/system/cpu/isolated: {isolated})" if isolated else "")))
    else:
        out.append(item(area, "isolcpus", f"isolcpus={v}" if v is not None else "not set", "warn",
                         f"ordinary tasks and unbound kernel threads can run on core {c} and delay the loop's "
                         "wake-up (a SCHED_FIFO thread preempts them, but not inside non-preemptible kernel code)",
                         f"boot with `isolcpus=managed_irq,domain,{c}`{few}: {GRUB}"))
    # nohz_full
    v, cpus = covered("nohz_full")
    nohz_cfg = cfg.get("CONFIG_NO_HZ_FULL")
    kernel_note = ("; this kernel lacks CONFIG_NO_HZ_FULL: nohz_full needs one built with it (e.g. the "
                   "distribution's -rt or lowlatency kernel)" if nohz_cfg == "n" else "")
    hz = ctx.hz
    tick = f"{hz} times a second" if hz else "HZ times a second"
    if v is not None and c in cpus and nohz_cfg != "n":
        out.append(item(area, "nohz_full", f"nohz_full={v}", "ok",
                         f"the scheduler tick stops on core {c} while only the loop runs there"))
    elif v is not None and c in cpus:
        out.append(item(area, "nohz_full", f"nohz_full={v} (ignored)", "warn",
                         f"the kernel ignores nohz_full{kernel_note}; the tick interrupts core {c} {tick}",
                         "a kernel with CONFIG_NO_HZ_FULL=y"))
    else:
        out.append(item(area, "nohz_full", f"nohz_full={v}" if v is not None else "not set", "warn",
                         f"the scheduler tick interrupts core {c} {tick} (a few µs each){kernel_note}",
                         f"boot with `nohz_full={c}`{kernel_note and ' on such a kernel'}: {GRUB}"))
    # rcu_nocbs (nohz_full implies it)
    v, cpus = covered("rcu_nocbs")
    nohz_v, nohz_cpus = covered("nohz_full")
    if (v is not None and (c in cpus or v == "")) or (nohz_cpus and c in nohz_cpus and nohz_cfg != "n") \
            or cfg.get("CONFIG_RCU_NOCB_CPU_DEFAULT_ALL") == "y":
        how = (f"rcu_nocbs={v}" if v is not None else f"implied by nohz_full={nohz_v}" if nohz_v is not None
               else "CONFIG_RCU_NOCB_CPU_DEFAULT_ALL=y")
        out.append(item(area, "rcu_nocbs", how, "ok", f"RCU callbacks of core {c} run in kthreads elsewhere"))
    else:
        no_nocb = cfg.get("CONFIG_RCU_NOCB_CPU") == "n"
        out.append(item(area, "rcu_nocbs", f"rcu_nocbs={v}" if v is not None else "not set", "warn",
                         f"RCU callbacks queued on core {c} run there in softirq, between the loop's cycles or "
                         "delaying its wake-up" + (" (this kernel lacks CONFIG_RCU_NOCB_CPU)" if no_nocb else ""),
                         f"boot with `rcu_nocbs={c}` (nohz_full={c} implies it): {GRUB}"))
    # irqaffinity: the default affinity of IRQs; /proc/irq/default_smp_affinity is the live value
    v, cpus = covered("irqaffinity")
    dflt, _ = ctx.read1("/proc/irq/default_smp_affinity")
    try:
        dcpus = parse_hexmask(dflt) if dflt else None
    except ValueError:
        dcpus = None
    if dcpus is not None and c not in dcpus:
        out.append(item(area, "irqaffinity", (f"irqaffinity={v}, " if v is not None else "")
                         + f"default IRQ affinity {format_cpulist(dcpus)}", "ok",
                         f"new interrupts are routed away from core {c}"))
    elif v is not None and c not in cpus and dcpus is None:
        out.append(item(area, "irqaffinity", f"irqaffinity={v}", "ok",
                         f"new interrupts are routed away from core {c}"))
    else:
        shown = (f"irqaffinity={v}" if v is not None else "not set") + (
            f", default IRQ affinity {format_cpulist(dcpus)}" if dcpus is not None else "")
        out.append(item(area, "irqaffinity", shown, "warn",
                         f"interrupts set up from now on may be routed to core {c} (see interrupts for the ones "
                         "already there)",
                         f"boot with `irqaffinity={housekeeping}`: {GRUB}"))
    return out


@check("interrupts", "IRQs on the loop core", per_core=True)
def check_irqs(ctx: Ctx) -> list[dict]:
    area = "interrupts"
    c = ctx.loop_cpu
    table, err = ctx.fs.interrupts()
    if table is None:
        return [item(area, "IRQs on the loop core", "unknown", "unknown", err, "`cat /proc/interrupts` as root")]
    cols, rows = table.cpus, table.rows
    if c not in cols:
        return [item(area, "IRQs on the loop core", "unknown", "unknown",
                      f"/proc/interrupts has no column for CPU {c} (columns: {format_cpulist(cols)})",
                      "check that the loop core is online")]
    landing, unreadable, percpu = [], [], []
    for row in rows:
        irq = row.name
        if not row.numbered:
            if row.counts.get(c):
                percpu.append(f"{irq} {row.counts[c]}")
            continue
        cpus, aerr = ctx.fs.irq_affinity(irq)
        if cpus is None:
            unreadable.append(irq)
            continue
        if c in cpus:
            landing.append((int(irq), row.device, row.counts.get(c, 0)))
    housekeeping = format_cpulist((ctx.online or ctx.allowed or {c}) - {c})
    ctx.fact("irqs_on_loop_cpu", len(landing))
    ctx.fact("irqs_fired_on_loop_cpu", sum(1 for x in landing if x[2]))
    percpu_note = (f". Per-CPU interrupts on core {c} so far (not movable; nohz_full cuts LOC, isolation cuts "
                   f"RES/CAL/TLB): {', '.join(percpu)}" if percpu else "")
    unread_note = f"; affinity unreadable for IRQ {', '.join(unreadable)}" if unreadable else ""
    if not landing:
        if unreadable and not any(r.numbered and r.name not in unreadable for r in rows):
            return [item(area, "IRQs on the loop core", "unknown", "unknown",
                          f"no /proc/irq/N/smp_affinity_list was readable ({aerr})", "rerun as root")]
        return [item(area, "IRQs on the loop core", "none", "ok",
                      f"no device interrupt may be routed to core {c}{unread_note}{percpu_note}")]
    fired = [x for x in landing if x[2]]
    quiet = [x for x in landing if not x[2]]
    listing = ", ".join(f"{irq} {name} ({n} so far)" for irq, name, n in sorted(fired, key=lambda x: -x[2]))
    if quiet:
        listing += ("; " if fired else "") + "allowed there but not fired yet: " + ", ".join(
            f"{irq} {name}" for irq, name, _ in sorted(quiet))
    irq_ids = " ".join(str(x[0]) for x in sorted(landing))
    fix = (f"`for i in {irq_ids}; do echo {housekeeping} > /proc/irq/$i/smp_affinity_list; done` and keep "
           f"irqbalance off the core (IRQBALANCE_BANNED_CPULIST={c} in /etc/default/irqbalance, or `systemctl "
           f"disable --now irqbalance`); at boot `irqaffinity={housekeeping}`; managed IRQs (multi-queue NVMe/virtio) "
           f"refuse the write: boot with `isolcpus=managed_irq,{c}`"
           if housekeeping else "there is no other CPU to move them to")
    have = "has" if len(fired) == 1 else "have"
    return [item(area, "IRQs on the loop core", f"{len(landing)} IRQs may land on core {c}, {len(fired)} {have} "
                  "fired there", "bad" if fired else "warn",
                  f"a device interrupt preempts the loop for its handler (µs to tens of µs, softirq work after "
                  f"it). On core {c}: {listing}{unread_note}{percpu_note}", fix)]


