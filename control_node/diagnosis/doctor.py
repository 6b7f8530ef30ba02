"""``control-node doctor``: is this machine ready for a 1 kHz real-time loop?

Every check reads files under a ``root`` prefix (default ``/``), so the tests point it at fake ``/proc``
and ``/sys`` trees. Each check is one item::

    {"area", "check", "value", "verdict", "detail", "fix"}

``verdict`` is ``ok``, ``warn``, ``bad`` or ``unknown``; ``unknown`` means a file could not be read and
``detail`` says which and why (nothing is guessed). ``fix`` is a concrete command or setting.

The privilege probes (affinity, SCHED_FIFO, mlockall, /dev/cpu_dma_latency) run in a short-lived child
process, so doctor itself changes nothing; ``probe_privileges=False`` derives them from the capabilities
and limits in ``/proc/self/status`` and ``/proc/self/limits`` instead (what the fake trees use).

:func:`machine_facts` is the cheap subset (no live sample, no probes, no process scan) the node records in
each run's summary.json; it never raises. docs/doctor.md explains each check for a 1 kHz loop.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
import time

VERDICTS = ("bad", "warn", "ok", "unknown")
AREAS = ("loop core", "kernel", "clock and timers", "power management", "memory", "scheduler", "isolation",
         "interrupts", "virtualization", "kernel threads", "privileges", "tracing")

CAP_IPC_LOCK, CAP_SYS_NICE = 14, 23
PF_KTHREAD = 0x00200000
STEAL_WARN_PCT, STEAL_BAD_PCT = 1.0, 5.0
DEEP_IDLE_US = 10          # an idle state slower than this to leave costs a 1 kHz loop its budget
# kernel threads with a CPU-wide affinity that are known to take long slices (reclaim, compaction, huge
# page collapse, DAMON, KSM): named in the kthreads check when they may run on the loop core
NOTABLE_KTHREADS = ("kswapd", "kcompactd", "khugepaged", "kdamond", "ksmd", "kworker/u", "rcu_preempt",
                    "rcu_sched", "rcuog", "rcuop")
GRUB = ("add it to GRUB_CMDLINE_LINUX in /etc/default/grub, run `update-grub` "
        "(or `grub2-mkconfig -o /boot/grub2/grub.cfg`) and reboot")


# --------------------------------------------------------------------------------------------- helpers

def _item(area, check, value, verdict, detail="", fix=""):
    assert verdict in VERDICTS, verdict
    return {"area": area, "check": check, "value": str(value), "verdict": verdict, "detail": detail, "fix": fix}


def parse_cpulist(text: str, max_cpu: int | None = None) -> set[int]:
    """``"0-3,5,8-11:2/4"`` -> {0, 1, 2, 3, 5, 8, 9}; ``"all"`` and ``"N"`` (the last CPU) need ``max_cpu``.
    Raises ValueError on anything else."""
    out: set[int] = set()
    text = text.strip()
    if not text or text == "(null)":
        return out
    for part in text.split(","):
        part = part.strip()
        if part == "all":
            if max_cpu is None:
                raise ValueError("'all' without a CPU count")
            out.update(range(max_cpu + 1))
            continue
        part = part.replace("N", str(max_cpu)) if "N" in part and max_cpu is not None else part
        rng, _, group = part.partition(":")
        lo, _, hi = rng.partition("-")
        lo_i = int(lo)
        hi_i = int(hi) if hi else lo_i
        if hi_i < lo_i:
            raise ValueError(f"bad range {part!r}")
        if group:
            used, _, size = group.partition("/")
            used_i, size_i = int(used), int(size)
            out.update(c for c in range(lo_i, hi_i + 1) if (c - lo_i) % size_i < used_i)
        else:
            out.update(range(lo_i, hi_i + 1))
    return out


def format_cpulist(cpus) -> str:
    """{0, 1, 2, 5} -> ``"0-2,5"``."""
    cpus = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def parse_hexmask(text: str) -> set[int]:
    """``/proc/irq/default_smp_affinity`` style ``"00000000,00000003"`` -> {0, 1}."""
    value = int(text.strip().replace(",", ""), 16)
    return {i for i in range(value.bit_length()) if value >> i & 1}


def _bracketed(text: str) -> str | None:
    """``"always [madvise] never"`` -> ``"madvise"``."""
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else None


class _Ctx:
    """Cached reads under ``root``; every read returns (text, None) or (None, reason)."""

    def __init__(self, root="/"):
        self.root = os.fspath(root)
        self.facts: dict = {}
        self._cache: dict = {}
        self.loop_cpu: int | None = None
        self.cpu_reason = ""
        self.allowed: set[int] = set()
        self.online: set[int] = set()
        self.priv: dict = {}

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    def read(self, p: str, limit: int | None = None):
        key = (p, limit)
        if key not in self._cache:
            self._cache[key] = self._read(p, limit)
        return self._cache[key]

    def _read(self, p, limit):
        try:
            with open(self.path(p), "rb") as f:
                data = f.read(limit) if limit else f.read()
            return data.decode("utf-8", "replace"), None
        except FileNotFoundError:
            return None, f"{p} does not exist"
        except PermissionError as e:
            why = e.strerror or "permission denied"
            hint = f" (uid {os.getuid()}: run doctor as root to read it)" if os.getuid() != 0 else ""
            return None, f"{p}: {why}{hint}"
        except OSError as e:
            return None, f"{p}: {e.strerror or e}"

    def read1(self, p):
        text, err = self.read(p)
        return (text.strip(), None) if text is not None else (None, err)

    def exists(self, p) -> bool:
        return os.path.exists(self.path(p))

    # ---- kernel config, command line, machine kind
    @property
    def kconfig(self):
        """(dict CONFIG_X -> value ("n" for `is not set`), source) or (None, reason)."""
        if "kconfig" not in self._cache:
            self._cache["kconfig"] = self._load_kconfig()
        return self._cache["kconfig"]

    def _load_kconfig(self):
        reasons = []
        try:
            with gzip.open(self.path("/proc/config.gz"), "rt", errors="replace") as f:
                return _parse_kconfig(f.read()), "/proc/config.gz"
        except FileNotFoundError:
            reasons.append("/proc/config.gz does not exist (modprobe configs)")
        except (OSError, EOFError) as e:
            reasons.append(f"/proc/config.gz: {getattr(e, 'strerror', None) or e}")
        release, err = self.read1("/proc/sys/kernel/osrelease")
        if release is None:
            reasons.append(err)
        else:
            text, err = self.read(f"/boot/config-{release}")
            if text is not None:
                return _parse_kconfig(text), f"/boot/config-{release}"
            reasons.append(err)
        return None, "; ".join(reasons)

    @property
    def cmdline(self):
        """(dict param -> value ("" for a bare flag), None) or (None, reason); stops at `--` (init's args)."""
        if "cmdline" not in self._cache:
            text, err = self.read("/proc/cmdline")
            if text is None:
                self._cache["cmdline"] = (None, err)
            else:
                params = {}
                for tok in text.split():
                    if tok == "--":
                        break
                    k, _, v = tok.partition("=")
                    params[k] = v
                self._cache["cmdline"] = (params, None)
        return self._cache["cmdline"]

    @property
    def virtualized(self):
        """(True/False, how) or (None, reason)."""
        if "virt" not in self._cache:
            self._cache["virt"] = self._virt()
        return self._cache["virt"]

    def _virt(self):
        hv, _ = self.read1("/sys/hypervisor/type")
        if hv:
            return True, f"/sys/hypervisor/type = {hv}"
        info, err = self.read("/proc/cpuinfo", limit=16384)
        if info is not None:
            for line in info.splitlines():
                if line.startswith(("flags", "Features")):
                    if "hypervisor" in line.split():
                        return True, "the `hypervisor` CPU flag is set (/proc/cpuinfo)"
                    break
        for p in ("/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/product_name"):
            v, _ = self.read1(p)
            if v and re.search(r"QEMU|KVM|VMware|VirtualBox|Xen|Bochs|Virtual Machine|Google Compute|Amazon EC2",
                               v, re.I):
                return True, f"{p} = {v}"
        if info is None:
            return None, err
        return False, "no `hypervisor` CPU flag"

    # ---- process status of whoever runs the node (this process, or the fake tree's)
    @property
    def self_status(self) -> dict:
        if "status" not in self._cache:
            text, _ = self.read("/proc/self/status")
            st = {}
            for line in (text or "").splitlines():
                k, _, v = line.partition(":")
                st[k.strip()] = v.strip()
            self._cache["status"] = st
        return self._cache["status"]

    @property
    def limits(self) -> dict:
        """'Max locked memory' -> (soft, hard) strings, from /proc/self/limits."""
        if "limits" not in self._cache:
            text, _ = self.read("/proc/self/limits")
            lim = {}
            for line in (text or "").splitlines()[1:]:
                m = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
                if m:
                    lim[m.group(1)] = (m.group(2), m.group(3))
            self._cache["limits"] = lim
        return self._cache["limits"]

    def cap(self, bit: int):
        """True/False for a capability in CapEff, None when unreadable."""
        v = self.self_status.get("CapEff")
        if v is None:
            return None
        try:
            return bool(int(v, 16) >> bit & 1)
        except ValueError:
            return None

    def fact(self, key, value):
        self.facts[key] = value


def _parse_kconfig(text: str) -> dict:
    cfg = {}
    for line in text.splitlines():
        if line.startswith("CONFIG_"):
            k, _, v = line.partition("=")
            cfg[k] = v.strip().strip('"')
        else:
            m = re.match(r"# (CONFIG_\w+) is not set", line)
            if m:
                cfg[m.group(1)] = "n"
    return cfg


def _per_core_unknown(ctx, area, check):
    return _item(area, check, "unknown", "unknown", f"the loop core is unknown: {ctx.cpu_reason}",
                 "pass --cpu N")


# ------------------------------------------------------------------------------------------ the checks

def check_loop_core(ctx: _Ctx, spec) -> list[dict]:
    area = "loop core"
    st = ctx.self_status
    allowed_text = st.get("Cpus_allowed_list")
    online_text, online_err = ctx.read1("/sys/devices/system/cpu/online")
    try:
        ctx.online = parse_cpulist(online_text) if online_text is not None else set()
    except ValueError:
        ctx.online = set()
    try:
        ctx.allowed = parse_cpulist(allowed_text) if allowed_text else set()
    except ValueError:
        ctx.allowed = set()
    if not ctx.allowed and ctx.root in ("/", "") and hasattr(os, "sched_getaffinity"):
        ctx.allowed = set(os.sched_getaffinity(0))
    ctx.fact("cpus_online", format_cpulist(ctx.online) if ctx.online else None)
    ctx.fact("cpus_allowed", format_cpulist(ctx.allowed) if ctx.allowed else None)
    spec = "last" if spec is None else spec
    pool = ctx.allowed or ctx.online
    if isinstance(spec, str) and spec not in ("last", "none"):
        try:
            spec = int(spec)
        except ValueError:
            ctx.cpu_reason = f"--cpu {spec!r} is not a core number, 'last' or 'none'"
            return [_item(area, "loop core", spec, "bad", ctx.cpu_reason, "pass --cpu N with N a core number")]
    if isinstance(spec, int):
        ctx.loop_cpu = spec
        how = f"core {spec} (--cpu / [realtime] cpu)"
    elif not pool:
        ctx.cpu_reason = ("no CPU affinity mask (/proc/self/status Cpus_allowed_list) and no online CPU list "
                          f"({online_err})")
        return [_item(area, "loop core", "unknown", "unknown", ctx.cpu_reason, "pass --cpu N")]
    else:
        ctx.loop_cpu = max(pool)
        how = f"core {ctx.loop_cpu}: the highest CPU of the affinity mask {format_cpulist(pool)}"
    ctx.fact("loop_cpu", ctx.loop_cpu)
    ctx.fact("loop_cpu_spec", spec)
    if spec == "none":
        return [_item(area, "loop core", f"not pinned ([realtime] cpu = none); per-core checks use {how}",
                      "warn", "an unpinned loop thread migrates between cores: each move costs cache refills and "
                              "it may land on a core busy with interrupts",
                      'set [realtime] cpu = "last" (the default) or a core number')]
    if ctx.allowed and ctx.loop_cpu not in ctx.allowed:
        return [_item(area, "loop core", how, "bad",
                      f"core {ctx.loop_cpu} is not in this process's affinity mask "
                      f"{format_cpulist(ctx.allowed)}: the node's sched_setaffinity would fail",
                      f"use --cpu / [realtime] cpu within {format_cpulist(ctx.allowed)}, or start the node with a "
                      f"wider cpuset (`taskset -c {format_cpulist(ctx.allowed | {ctx.loop_cpu})} ...`)")]
    if ctx.online and ctx.loop_cpu not in ctx.online:
        return [_item(area, "loop core", how, "bad", f"core {ctx.loop_cpu} is not online "
                      f"(online: {format_cpulist(ctx.online)})",
                      f"echo 1 > /sys/devices/system/cpu/cpu{ctx.loop_cpu}/online, or pick an online core")]
    return [_item(area, "loop core", how, "ok",
                  "the node pins its loop thread here; the per-core checks below are about this core")]


def check_preemption(ctx: _Ctx) -> list[dict]:
    area = "kernel"
    version, verr = ctx.read1("/proc/sys/kernel/version")
    release, _ = ctx.read1("/proc/sys/kernel/osrelease")
    ctx.fact("kernel", release)
    ctx.fact("kernel_version", version)
    cfg, cfg_src = ctx.kconfig
    cfg = cfg or {}
    rt_flag, _ = ctx.read1("/sys/kernel/realtime")
    dbg, dbg_err = ctx.read1("/sys/kernel/debug/sched/preempt")
    mounts, _ = ctx.read("/proc/mounts")
    if dbg is None and mounts is not None and not any(
            len(f) > 2 and f[2] == "debugfs" for f in (line.split() for line in mounts.splitlines())):
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
    elif dbg and _bracketed(dbg.replace("(", "[").replace(")", "]")):
        mode = _bracketed(dbg.replace("(", "[").replace(")", "]"))
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
        return [_item(area, "preemption", "unknown", "unknown", "; ".join(why),
                      "mount debugfs (`mount -t debugfs none /sys/kernel/debug`) and rerun as root, or "
                      "`modprobe configs` for /proc/config.gz")]
    rt_fix = ("for a bounded worst case install a PREEMPT_RT kernel (Debian: `apt install linux-image-rt-amd64`; "
              "Ubuntu: `pro enable realtime-kernel`; RHEL/Fedora: kernel-rt)")
    if mode == "rt":
        return [_item(area, "preemption", "PREEMPT_RT", "ok", how + ": interrupt handlers run in threads and "
                      "spinlocks sleep, so a SCHED_FIFO loop preempts nearly all kernel work")]
    if mode in ("full", "lazy"):
        return [_item(area, "preemption", mode, "warn",
                      f"{how}. Kernel code is preemptible except under spinlocks and in interrupt handlers, which "
                      "still delay the loop's wake-up (tens of µs, more under I/O load)", rt_fix)]
    dyn_fix = f"boot with `preempt=full`: {GRUB}; " if dynamic else ""
    return [_item(area, "preemption", mode, "bad",
                  f"{how}. Kernel code runs to the next preemption point before the woken SCHED_FIFO loop gets "
                  "the CPU: a system call or page-cache work on the loop core can delay a tick by milliseconds "
                  "(isolcpus on the loop core narrows it to kernel threads and interrupts)",
                  dyn_fix + rt_fix)]


def check_hz(ctx: _Ctx) -> list[dict]:
    area = "kernel"
    cfg, src = ctx.kconfig
    if not cfg or not cfg.get("CONFIG_HZ", "").isdigit():
        return [_item(area, "HZ", "unknown", "unknown",
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
        return [_item(area, "HZ", f"{hz} ({tick}), no high-resolution timers", "bad" if hz < 1000 else "warn",
                      "without high-resolution timers a sleep ends on a tick, so the 1 ms loop wakes on "
                      f"{1000 / hz:g} ms boundaries",
                      "a kernel with CONFIG_HIGH_RES_TIMERS=y (every distribution kernel), and no highres=off")]
    return [_item(area, "HZ", f"{hz} ({tick}), high-resolution timers on", "ok",
                  "the loop's clock_nanosleep wakes on a high-resolution timer, not on the tick, so HZ does not "
                  f"limit a 1 kHz loop; the tick itself interrupts the loop core {hz} times a second unless "
                  "nohz_full covers it (see isolation)")]


def check_clocksource(ctx: _Ctx) -> list[dict]:
    area = "clock and timers"
    base = "/sys/devices/system/clocksource/clocksource0"
    cur, err = ctx.read1(f"{base}/current_clocksource")
    avail, _ = ctx.read1(f"{base}/available_clocksource")
    avail_l = (avail or "").split()
    ctx.fact("clocksource", cur or "unknown")
    if cur is None:
        return [_item(area, "clocksource", "unknown", "unknown", err,
                      f"check `cat {base}/current_clocksource` as root")]
    value = cur + (f" (available: {' '.join(avail_l)})" if avail_l else "")
    switch = (f"`echo tsc > {base}/current_clocksource` now; keep it with `clocksource=tsc tsc=reliable` at boot "
              f"({GRUB}) only when the host gives an invariant TSC (constant_tsc nonstop_tsc in /proc/cpuinfo)"
              if "tsc" in avail_l else
              "the kernel did not list the TSC (judged unstable): on a host with an invariant TSC boot with "
              f"`tsc=reliable clocksource=tsc` ({GRUB})")
    if cur in ("tsc", "arch_sys_counter", "riscv_clocksource"):
        return [_item(area, "clocksource", value, "ok", "read in user space (vDSO) in tens of ns: the loop reads "
                      "the clock several times per cycle")]
    if cur == "kvm-clock":
        return [_item(area, "clocksource", value, "warn",
                      "kvm-clock (pvclock) is read through a page the host updates: slower than the TSC and "
                      "stepped when the host adjusts it, which shows up as wake-up jitter", switch)]
    if cur in ("hpet", "acpi_pm"):
        return [_item(area, "clocksource", value, "warn",
                      f"{cur} has no vDSO read: every clock_gettime is a system call to a slow device register "
                      "(about 0.5-2 µs), several times per cycle", switch)]
    if cur in ("jiffies", "refined-jiffies"):
        return [_item(area, "clocksource", value, "bad", "a tick-based clock: time advances in 1/HZ steps",
                      switch)]
    return [_item(area, "clocksource", value, "warn", f"{cur} is not a clocksource doctor knows to be fast "
                  "(tsc on x86, arch_sys_counter on arm64)", switch)]


def check_cpuidle(ctx: _Ctx) -> list[dict]:
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
        return [_item(area, "cpuidle", f"idle=poll (driver {drv})", "ok",
                      "idle CPUs spin instead of halting: no exit latency (and no power saving)")]
    if drv is None and not ctx.exists("/sys/devices/system/cpu/cpuidle"):
        err = "/sys/devices/system/cpu/cpuidle does not exist (kernel without CONFIG_CPU_IDLE)"
        drv = "none"
    if drv is None:
        return [_item(area, "cpuidle", "unknown", "unknown", err, "check as root")]
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
        return [_item(area, "cpuidle", f"driver none (governor {gov}){dma_note}", "warn" if virt else "ok", detail,
                      fix or "nothing needed on bare metal (HLT exits in about 1 µs)")]
    value = f"driver {drv}, governor {gov}; core {ctx.loop_cpu}: " + (
        ", ".join(f"{nm} {lat} µs" + (" (disabled)" if off else "") for _, nm, lat, off in states) or "no states"
    ) + dma_note
    deep = [(n, nm, lat) for n, nm, lat, off in states if lat > DEEP_IDLE_US and not off]
    if not deep:
        return [_item(area, "cpuidle", value, "ok", f"no enabled idle state takes longer than {DEEP_IDLE_US} µs "
                      "to leave")]
    worst = max(lat for _, _, lat in deep)
    if dma_w:
        return [_item(area, "cpuidle", value, "ok",
                      f"deep states up to {worst} µs, but {dma} is writable: the node holds it at 0 while it runs, "
                      "so only the shallowest state is used")]
    disable = " && ".join(f"echo 1 > /sys/devices/system/cpu/cpu{ctx.loop_cpu}/cpuidle/{n}/disable"
                          for n, _, _ in deep)
    return [_item(area, "cpuidle", value, "warn",
                  f"idle states up to {worst} µs exit latency and {dma} is not writable by this user, so the node "
                  "cannot keep the core out of them: each wake-up from the sleep before the tick pays that",
                  f"let the node write {dma} (run it as root, or a udev rule: KERNEL==\"cpu_dma_latency\", "
                  f"GROUP=\"realtime\", MODE=\"0660\"), or disable the deep states on the loop core: `{disable}`")]


def check_cpufreq(ctx: _Ctx) -> list[dict]:
    area = "power management"
    if ctx.loop_cpu is None:
        return [_per_core_unknown(ctx, area, "cpufreq governor")]
    d = f"/sys/devices/system/cpu/cpu{ctx.loop_cpu}/cpufreq"
    gov, err = ctx.read1(f"{d}/scaling_governor")
    drv, _ = ctx.read1(f"{d}/scaling_driver")
    ctx.fact("cpufreq_governor", gov)
    if gov is None and not ctx.exists(d):
        virt, _ = ctx.virtualized
        if virt:
            return [_item(area, "cpufreq governor", "no cpufreq (VM: host decides)", "unknown",
                          f"{d} does not exist: the guest cannot see or set the clock of the host core behind "
                          "this vCPU",
                          "on the host: `cpupower frequency-set -g performance` for the cores backing this vCPU "
                          "(and pin the vCPU there)")]
        return [_item(area, "cpufreq governor", "no cpufreq driver", "unknown",
                      f"{d} does not exist: the firmware decides the clock",
                      "BIOS/UEFI: a maximum-performance power profile; or load a cpufreq driver "
                      "(`modprobe acpi-cpufreq`) and set the performance governor")]
    if gov is None:
        return [_item(area, "cpufreq governor", "unknown", "unknown", err, f"`cat {d}/scaling_governor` as root")]
    value = f"{gov}" + (f" ({drv})" if drv else "")
    if gov == "performance":
        return [_item(area, "cpufreq governor", value, "ok", "the core stays at its highest clock")]
    return [_item(area, "cpufreq governor", value, "warn",
                  f"{gov} lowers the clock when the core looks idle; the loop sleeps most of each period, so "
                  "cycles run slower and ramping the clock adds latency",
                  f"`cpupower -c {ctx.loop_cpu} frequency-set -g performance` (or `echo performance > "
                  f"{d}/scaling_governor`)")]


def check_smt(ctx: _Ctx) -> list[dict]:
    area = "loop core"
    if ctx.loop_cpu is None:
        return [_per_core_unknown(ctx, area, "SMT siblings")]
    p = f"/sys/devices/system/cpu/cpu{ctx.loop_cpu}/topology/thread_siblings_list"
    text, err = ctx.read1(p)
    if text is None:
        return [_item(area, "SMT siblings", "unknown", "unknown", err, "check as root")]
    try:
        sib = parse_cpulist(text) - {ctx.loop_cpu}
    except ValueError:
        return [_item(area, "SMT siblings", text, "unknown", f"{p}: cannot parse {text!r}", "")]
    ctx.fact("smt_siblings", format_cpulist(sib) or None)
    virt, _ = ctx.virtualized
    if not sib:
        return [_item(area, "SMT siblings", f"none (core {ctx.loop_cpu} alone)", "ok",
                      "no other hardware thread shares the core" + (
                          " (as far as the guest topology tells: the host may still run another vCPU on the "
                          "same physical core)" if virt else ""))]
    others = format_cpulist(sib)
    return [_item(area, "SMT siblings", f"core {ctx.loop_cpu} shares a physical core with CPU {others}", "warn",
                  f"whatever runs on CPU {others} competes for the same pipeline and caches: the loop's cycle "
                  "time varies with it",
                  f"keep CPU {others} idle too (isolcpus={format_cpulist(sib | {ctx.loop_cpu})} and run nothing "
                  "there), or disable SMT: `echo off > /sys/devices/system/cpu/smt/control` (boot: `nosmt`)")]


def check_thp(ctx: _Ctx) -> list[dict]:
    area = "memory"
    base = "/sys/kernel/mm/transparent_hugepage"
    out = []
    en, err = ctx.read1(f"{base}/enabled")
    sel = _bracketed(en) if en else None
    ctx.fact("thp_enabled", sel or "unknown")
    if en is None:
        if not ctx.exists(base):
            out.append(_item(area, "THP enabled", "not built in", "ok",
                             f"{base} does not exist: no transparent huge pages"))
        else:
            out.append(_item(area, "THP enabled", "unknown", "unknown", err, f"`cat {base}/enabled` as root"))
    elif sel == "always":
        out.append(_item(area, "THP enabled", en, "warn",
                         "every large anonymous mapping gets huge pages: khugepaged scans and collapses the "
                         "node's memory in the background and faults may compact memory first (stalls of ms)",
                         f"`echo madvise > {base}/enabled` (boot: `transparent_hugepage=madvise`)"))
    else:
        out.append(_item(area, "THP enabled", en, "ok", "huge pages only where a program asks (madvise) or never"))
    df, err = ctx.read1(f"{base}/defrag")
    dsel = _bracketed(df) if df else None
    ctx.fact("thp_defrag", dsel or "unknown")
    if df is None:
        if ctx.exists(base):
            out.append(_item(area, "THP defrag", "unknown", "unknown", err, f"`cat {base}/defrag` as root"))
    elif dsel == "always":
        out.append(_item(area, "THP defrag", df, "warn",
                         "a page fault that wants a huge page waits for direct reclaim and compaction",
                         f"`echo defer+madvise > {base}/defrag`"))
    else:
        out.append(_item(area, "THP defrag", df, "ok", "no direct compaction on ordinary page faults"))
    return out


def check_rt_throttling(ctx: _Ctx, spin_us=150) -> list[dict]:
    area = "scheduler"
    rt, err = ctx.read1("/proc/sys/kernel/sched_rt_runtime_us")
    per, err2 = ctx.read1("/proc/sys/kernel/sched_rt_period_us")
    ctx.fact("sched_rt_runtime_us", int(rt) if rt and rt.lstrip("-").isdigit() else None)
    ctx.fact("sched_rt_period_us", int(per) if per and per.isdigit() else None)
    if rt is None or per is None or not rt.lstrip("-").isdigit() or not per.isdigit():
        return [_item(area, "RT throttling", "unknown", "unknown", err or err2 or f"unparsable: {rt!r} {per!r}",
                      "`sysctl kernel.sched_rt_runtime_us kernel.sched_rt_period_us`")]
    rt_i, per_i = int(rt), int(per)
    if rt_i < 0 or rt_i >= per_i:
        return [_item(area, "RT throttling", f"off (runtime {rt_i} / period {per_i} µs)", "ok",
                      "a SCHED_FIFO thread is never stopped for other tasks: a runaway loop owns its core")]
    stop_ms = (per_i - rt_i) / 1000
    return [_item(area, "RT throttling", f"{rt_i} / {per_i} µs ({100 * rt_i / per_i:g}% for real-time tasks)",
                  "warn",
                  f"a SCHED_FIFO thread that is busy 100% of the time is stopped for {stop_ms:g} ms every "
                  f"{per_i / 1000:g} ms. The node sleeps until [loop] spin_us ({spin_us:g} µs) before "
                  "each tick and spins only then, so a 1 kHz loop whose cycles fit is not throttled; a loop that "
                  "overruns continuously, or spin_us near the period, would lose whole milliseconds",
                  "`sysctl -w kernel.sched_rt_runtime_us=-1` (persist: `echo kernel.sched_rt_runtime_us=-1 > "
                  "/etc/sysctl.d/90-rt.conf`): with it off, keep the node's watchdog and a spare core for recovery")]


def check_swap(ctx: _Ctx) -> list[dict]:
    area = "memory"
    text, err = ctx.read("/proc/swaps")
    sw, _ = ctx.read1("/proc/sys/vm/swappiness")
    ctx.fact("swappiness", int(sw) if sw and sw.isdigit() else None)
    if text is None:
        ctx.fact("swap_kb", None)
        return [_item(area, "swap", "unknown", "unknown", err, "`swapon --show`")]
    devs = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) >= 4 and f[2].isdigit():
            devs.append((f[0], int(f[2]), int(f[3]) if f[3].isdigit() else 0))
    total = sum(d[1] for d in devs)
    ctx.fact("swap_kb", total)
    swp = f", vm.swappiness {sw}" if sw is not None else ""
    if not devs:
        return [_item(area, "swap", f"off{swp}", "ok", "no swap: nothing of the node can be paged out")]
    value = (f"on: {', '.join(d[0] for d in devs)} ({total // 1024} MiB, {sum(d[2] for d in devs) // 1024} MiB "
             f"used){swp}")
    m = ctx.priv.get("mlockall", {})
    if m.get("granted"):
        return [_item(area, "swap", value, "ok",
                      f"the node mlocks its memory ({m.get('how', 'granted')}), so none of it is swapped; other "
                      "processes' swapping still costs the machine disk I/O")]
    return [_item(area, "swap", value, "warn",
                  f"mlockall is not granted ({m.get('detail') or 'see privileges'}): the node's pages can be "
                  "swapped out and the next touch waits for the disk (ms)",
                  "`swapoff -a` and remove the swap lines from /etc/fstab, or grant mlock: run the node with "
                  "`ulimit -l unlimited` (limits.conf: `@realtime - memlock unlimited`; systemd: "
                  "LimitMEMLOCK=infinity) or CAP_IPC_LOCK")]


def check_isolation(ctx: _Ctx) -> list[dict]:
    area = "isolation"
    params, err = ctx.cmdline
    names = ("isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity")
    if params is None:
        return [_item(area, n, "unknown", "unknown", err, "`cat /proc/cmdline` as root") for n in names]
    if ctx.loop_cpu is None:
        return [_per_core_unknown(ctx, area, n) for n in names]
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
        out.append(_item(area, "isolcpus", f"isolcpus={v}", "ok",
                         f"the scheduler places no other task on core {c}; only pinned threads (the node's loop) "
                         "run there" + (f" (/sys/devices/system/cpu/isolated: {isolated})" if isolated else "")))
    else:
        out.append(_item(area, "isolcpus", f"isolcpus={v}" if v is not None else "not set", "warn",
                         f"ordinary tasks and unbound kernel threads can run on core {c} and delay the loop's "
                         "wake-up (a SCHED_FIFO thread preempts them, but not inside non-preemptible kernel code)",
                         f"boot with `isolcpus=managed_irq,domain,{c}`{few}: {GRUB}"))
    # nohz_full
    v, cpus = covered("nohz_full")
    nohz_cfg = cfg.get("CONFIG_NO_HZ_FULL")
    kernel_note = ("; this kernel lacks CONFIG_NO_HZ_FULL: nohz_full needs one built with it (e.g. the "
                   "distribution's -rt or lowlatency kernel)" if nohz_cfg == "n" else "")
    hz = ctx.facts.get("hz")
    tick = f"{hz} times a second" if hz else "HZ times a second"
    if v is not None and c in cpus and nohz_cfg != "n":
        out.append(_item(area, "nohz_full", f"nohz_full={v}", "ok",
                         f"the scheduler tick stops on core {c} while only the loop runs there"))
    elif v is not None and c in cpus:
        out.append(_item(area, "nohz_full", f"nohz_full={v} (ignored)", "warn",
                         f"the kernel ignores nohz_full{kernel_note}; the tick interrupts core {c} {tick}",
                         "a kernel with CONFIG_NO_HZ_FULL=y"))
    else:
        out.append(_item(area, "nohz_full", f"nohz_full={v}" if v is not None else "not set", "warn",
                         f"the scheduler tick interrupts core {c} {tick} (a few µs each){kernel_note}",
                         f"boot with `nohz_full={c}`{kernel_note and ' on such a kernel'}: {GRUB}"))
    # rcu_nocbs (nohz_full implies it)
    v, cpus = covered("rcu_nocbs")
    nohz_v, nohz_cpus = covered("nohz_full")
    if (v is not None and (c in cpus or v == "")) or (nohz_cpus and c in nohz_cpus and nohz_cfg != "n") \
            or cfg.get("CONFIG_RCU_NOCB_CPU_DEFAULT_ALL") == "y":
        how = (f"rcu_nocbs={v}" if v is not None else f"implied by nohz_full={nohz_v}" if nohz_v is not None
               else "CONFIG_RCU_NOCB_CPU_DEFAULT_ALL=y")
        out.append(_item(area, "rcu_nocbs", how, "ok", f"RCU callbacks of core {c} run in kthreads elsewhere"))
    else:
        no_nocb = cfg.get("CONFIG_RCU_NOCB_CPU") == "n"
        out.append(_item(area, "rcu_nocbs", f"rcu_nocbs={v}" if v is not None else "not set", "warn",
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
        out.append(_item(area, "irqaffinity", (f"irqaffinity={v}, " if v is not None else "")
                         + f"default IRQ affinity {format_cpulist(dcpus)}", "ok",
                         f"new interrupts are routed away from core {c}"))
    elif v is not None and c not in cpus and dcpus is None:
        out.append(_item(area, "irqaffinity", f"irqaffinity={v}", "ok",
                         f"new interrupts are routed away from core {c}"))
    else:
        shown = (f"irqaffinity={v}" if v is not None else "not set") + (
            f", default IRQ affinity {format_cpulist(dcpus)}" if dcpus is not None else "")
        out.append(_item(area, "irqaffinity", shown, "warn",
                         f"interrupts set up from now on may be routed to core {c} (see interrupts for the ones "
                         "already there)",
                         f"boot with `irqaffinity={housekeeping}`: {GRUB}"))
    return out


def _parse_interrupts(text):
    """(columns: [cpu numbers], rows: [(irq, {cpu: count}, description)])."""
    lines = text.splitlines() or [""]
    cols = [int(t[3:]) for t in lines[0].split() if t.startswith("CPU") and t[3:].isdigit()]
    rows = []
    for line in lines[1:]:
        head, _, rest = line.partition(":")
        fields = rest.split()
        counts = {}
        for i, cpu in enumerate(cols):
            if i < len(fields) and fields[i].isdigit():
                counts[cpu] = int(fields[i])
            else:
                break
        desc = " ".join(fields[len(counts):])
        rows.append((head.strip(), counts, desc))
    return cols, rows


def check_irqs(ctx: _Ctx) -> list[dict]:
    area = "interrupts"
    if ctx.loop_cpu is None:
        return [_per_core_unknown(ctx, area, "IRQs on the loop core")]
    c = ctx.loop_cpu
    text, err = ctx.read("/proc/interrupts")
    if text is None:
        return [_item(area, "IRQs on the loop core", "unknown", "unknown", err, "`cat /proc/interrupts` as root")]
    cols, rows = _parse_interrupts(text)
    if c not in cols:
        return [_item(area, "IRQs on the loop core", "unknown", "unknown",
                      f"/proc/interrupts has no column for CPU {c} (columns: {format_cpulist(cols)})",
                      "check that the loop core is online")]
    landing, unreadable, percpu = [], [], []
    for irq, counts, desc in rows:
        if not irq.isdigit():
            if counts.get(c):
                percpu.append(f"{irq} {counts[c]}")
            continue
        aff, aerr = ctx.read1(f"/proc/irq/{irq}/smp_affinity_list")
        if aff is None:
            unreadable.append(irq)
            continue
        try:
            cpus = parse_cpulist(aff)
        except ValueError:
            unreadable.append(irq)
            continue
        if c in cpus:
            name = desc.split()[-1] if desc.split() else f"irq {irq}"
            landing.append((int(irq), name, counts.get(c, 0), aff))
    housekeeping = format_cpulist((ctx.online or ctx.allowed or {c}) - {c})
    ctx.fact("irqs_on_loop_cpu", len(landing))
    ctx.fact("irqs_fired_on_loop_cpu", sum(1 for x in landing if x[2]))
    percpu_note = (f". Per-CPU interrupts on core {c} so far (not movable; nohz_full cuts LOC, isolation cuts "
                   f"RES/CAL/TLB): {', '.join(percpu)}" if percpu else "")
    unread_note = f"; affinity unreadable for IRQ {', '.join(unreadable)}" if unreadable else ""
    if not landing:
        if unreadable and not any(r[0].isdigit() and r[0] not in unreadable for r in rows):
            return [_item(area, "IRQs on the loop core", "unknown", "unknown",
                          f"no /proc/irq/N/smp_affinity_list was readable ({aerr})", "rerun as root")]
        return [_item(area, "IRQs on the loop core", "none", "ok",
                      f"no device interrupt may be routed to core {c}{unread_note}{percpu_note}")]
    fired = [x for x in landing if x[2]]
    quiet = [x for x in landing if not x[2]]
    listing = ", ".join(f"{irq} {name} ({n} so far)" for irq, name, n, _ in sorted(fired, key=lambda x: -x[2]))
    if quiet:
        listing += ("; " if fired else "") + "allowed there but not fired yet: " + ", ".join(
            f"{irq} {name}" for irq, name, _, _ in sorted(quiet))
    irq_ids = " ".join(str(x[0]) for x in sorted(landing))
    fix = (f"`for i in {irq_ids}; do echo {housekeeping} > /proc/irq/$i/smp_affinity_list; done` and keep "
           f"irqbalance off the core (IRQBALANCE_BANNED_CPULIST={c} in /etc/default/irqbalance, or `systemctl "
           f"disable --now irqbalance`); at boot `irqaffinity={housekeeping}`; managed IRQs (multi-queue NVMe/virtio) "
           f"refuse the write: boot with `isolcpus=managed_irq,{c}`"
           if housekeeping else "there is no other CPU to move them to")
    have = "has" if len(fired) == 1 else "have"
    return [_item(area, "IRQs on the loop core", f"{len(landing)} IRQs may land on core {c}, {len(fired)} {have} "
                  "fired there", "bad" if fired else "warn",
                  f"a device interrupt preempts the loop for its handler (µs to tens of µs, softirq work after "
                  f"it). On core {c}: {listing}{unread_note}{percpu_note}", fix)]


def _read_stat(ctx):
    """{cpu: (steal, total)} from /proc/stat, or (None, reason)."""
    text, err = ctx._read("/proc/stat", None)       # uncached: the live sample reads it twice
    if text is None:
        return None, err
    out = {}
    for line in text.splitlines():
        m = re.match(r"cpu(\d+)\s+(.*)", line)
        if m:
            vals = [int(v) for v in m.group(2).split()]
            if len(vals) < 8:
                return None, f"/proc/stat: cpu{m.group(1)} has {len(vals)} values, no steal column (the 8th)"
            out[int(m.group(1))] = (vals[7], sum(vals[:8]))
    if not out:
        return None, "/proc/stat has no cpuN lines"
    return out, None


def _steal_verdict(pct):
    return "bad" if pct >= STEAL_BAD_PCT else "warn" if pct >= STEAL_WARN_PCT else "ok"


STEAL_FIX = ("the host runs other work on this VM's physical cores: give the VM dedicated cores (pin its vCPUs, "
             "libvirt <vcputune><vcpupin>; isolcpus on the host), a dedicated/bare-metal instance type, or no CPU "
             "overcommit on the host")


def check_steal(ctx: _Ctx) -> list[dict]:
    area = "virtualization"
    stat, err = _read_stat(ctx)
    if stat is None:
        ctx.fact("steal_pct_since_boot", None)
        return [_item(area, "steal since boot", "unknown", "unknown", err, "`cat /proc/stat`")]
    pct = {cpu: (100.0 * s / t if t else 0.0) for cpu, (s, t) in stat.items()}
    ctx.fact("steal_pct_since_boot", {str(k): round(v, 2) for k, v in sorted(pct.items())})
    value = ", ".join(f"cpu{k} {v:.2f}%" for k, v in sorted(pct.items()))
    key = ctx.loop_cpu if ctx.loop_cpu in pct else max(pct, key=pct.get)
    verdict = _steal_verdict(pct[key])
    return [_item(area, "steal since boot", value, verdict,
                  f"time the host ran something else while this vCPU wanted to run, as a share of all its time since "
                  f"boot (core {key}: {pct[key]:.2f}%); each steal is a stall the loop cannot see coming",
                  "" if verdict == "ok" else STEAL_FIX)]


def check_steal_live(ctx: _Ctx, seconds: float, sleep=time.sleep) -> list[dict]:
    area = "virtualization"
    name = f"steal live ({seconds:g} s)"
    first, err = _read_stat(ctx)
    if first is None:
        return [_item(area, name, "unknown", "unknown", err, "`cat /proc/stat`")]
    sleep(seconds)
    second, err = _read_stat(ctx)
    if second is None:
        return [_item(area, name, "unknown", "unknown", err, "`cat /proc/stat`")]
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
        return [_item(area, name, "unknown", "unknown", "/proc/stat did not advance during the sample",
                      "rerun with a longer --sample")]
    value = ", ".join(f"cpu{k} {v:.1f}%" for k, v in sorted(pct.items()))
    key = ctx.loop_cpu if ctx.loop_cpu in pct else max(pct, key=pct.get)
    verdict = _steal_verdict(floor[key])
    ctx.fact("steal_pct_live", {str(k): round(v, 2) for k, v in sorted(pct.items())})
    return [_item(area, name, value, verdict,
                  f"steal over the last {seconds:g} s (core {key}: {pct[key]:.1f}%, {ticks[key]} ticks). /proc/stat "
                  "counts whole ticks (10 ms), so the verdict uses one tick less; steal comes in bursts: --sample "
                  "10 sees more",
                  "" if verdict == "ok" else STEAL_FIX)]


def check_kthreads(ctx: _Ctx) -> list[dict]:
    area = "kernel threads"
    if ctx.loop_cpu is None:
        return [_per_core_unknown(ctx, area, "kthreads on the loop core")]
    c = ctx.loop_cpu
    try:
        pids = [p for p in os.listdir(ctx.path("/proc")) if p.isdigit()]
    except OSError as e:
        return [_item(area, "kthreads on the loop core", "unknown", "unknown", f"/proc: {e.strerror}", "")]
    bound, movable, unread = [], [], 0
    for pid in pids:
        st, _ = ctx._read(f"/proc/{pid}/stat", None)
        if st is None or ")" not in st:
            continue                                  # gone meanwhile
        comm = st[st.find("(") + 1:st.rfind(")")]
        rest = st[st.rfind(")") + 2:].split()
        try:
            flags = int(rest[6])                      # field 9 of /proc/PID/stat
        except (IndexError, ValueError):
            continue
        if not flags & PF_KTHREAD:
            continue
        status, _ = ctx._read(f"/proc/{pid}/status", None)
        m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status or "", re.M)
        if not m:
            unread += 1
            continue
        try:
            cpus = parse_cpulist(m.group(1))
        except ValueError:
            unread += 1
            continue
        if c not in cpus:
            continue
        (bound if cpus == {c} else movable).append((int(pid), comm))
    if not bound and not movable and unread == 0 and not pids:
        return [_item(area, "kthreads on the loop core", "unknown", "unknown", "no processes under /proc", "")]
    notable = [(pid, comm) for pid, comm in movable if comm.startswith(NOTABLE_KTHREADS)]
    bnames = ", ".join(sorted({re.sub(r"/\d+(:\d+)?H?", "/N", comm).split("-")[0] for _, comm in bound}))
    value = f"{len(movable)} may run on core {c} ({len(notable)} notable), {len(bound)} bound to it"
    detail = (f"notable: {', '.join(comm for _, comm in sorted(notable, key=lambda x: x[1]))}. " if notable else "") + (
        f"bound to core {c} by design (per-CPU work, shrinks with isolcpus/nohz_full): {bnames}" if bound else "")
    if unread:
        detail += f"; {unread} kernel threads' affinity unreadable"
    housekeeping = format_cpulist((ctx.online or ctx.allowed or {c}) - {c})
    if not notable:
        return [_item(area, "kthreads on the loop core", value, "ok",
                      "no reclaim/compaction/huge-page/RCU kernel thread may run there. " + detail)]
    movable_pids = [p for p, comm in sorted(notable) if not comm.startswith("kworker/")]
    pids_s = " ".join(str(p) for p in movable_pids)
    mask = format(sum(1 << i for i in parse_cpulist(housekeeping)), "x") if housekeeping else "1"
    return [_item(area, "kthreads on the loop core", value, "warn",
                  "these unbound kernel threads (memory reclaim, compaction, huge-page collapse, DAMON, RCU, unbound "
                  f"workqueues) may be scheduled on core {c}; a SCHED_FIFO loop preempts them only at preemption "
                  "points. " + detail,
                  (f"`for p in {pids_s}; do taskset -pc {housekeeping or 0} $p; done`; " if pids_s else "")
                  + f"unbound workqueues (kworker/u*): `echo {mask} > /sys/devices/virtual/workqueue/cpumask`; at "
                  f"boot `isolcpus=domain,{c}` keeps kernel threads on the housekeeping CPUs")]


# ------------------------------------------------------------------------------------------ privileges

_PROBE = r"""
import ctypes, json, os, struct, sys
cpu, prio = int(sys.argv[1]), int(sys.argv[2])
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = [True, ""]
    except (OSError, ValueError, AttributeError) as e:
        out[name] = [False, (e.strerror if isinstance(e, OSError) and e.strerror else str(e))]
def mlock():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlockall(3) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    libc.munlockall()
def dma():
    fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    try:
        os.write(fd, struct.pack("i", 0))
    finally:
        os.close(fd)
def fifo():
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
attempt("affinity", lambda: os.sched_setaffinity(0, {cpu}))
attempt("mlockall", mlock)
attempt("cpu_dma_latency", dma)
attempt("sched_fifo", fifo)
print(json.dumps(out))
"""


def _limit(ctx, name):
    """Soft limit of /proc/self/limits `name`: int, "unlimited" or None."""
    v = ctx.limits.get(name)
    if v is None:
        return None
    return "unlimited" if v[0] == "unlimited" else int(v[0]) if v[0].isdigit() else None


def _static_privileges(ctx, priority):
    """What the capabilities and limits say, without trying."""
    nice, ipc = ctx.cap(CAP_SYS_NICE), ctx.cap(CAP_IPC_LOCK)
    rtprio, memlock = _limit(ctx, "Max realtime priority"), _limit(ctx, "Max locked memory")
    out = {}
    caps = f"CapEff {'has' if nice else 'lacks'} CAP_SYS_NICE, RLIMIT_RTPRIO {rtprio}"
    if nice is None and rtprio is None:
        out["sched_fifo"] = {"granted": None, "detail": "/proc/self/status and /proc/self/limits unreadable"}
    else:
        ok = bool(nice) or rtprio == "unlimited" or (isinstance(rtprio, int) and rtprio >= priority)
        out["sched_fifo"] = {"granted": ok, "detail": caps, "how": caps}
    mem = "unlimited" if memlock == "unlimited" else (f"{memlock // 1024} KiB" if isinstance(memlock, int) else None)
    caps = f"CapEff {'has' if ipc else 'lacks'} CAP_IPC_LOCK, RLIMIT_MEMLOCK {mem}"
    if ipc is None and memlock is None:
        out["mlockall"] = {"granted": None, "detail": "/proc/self/status and /proc/self/limits unreadable"}
    else:
        out["mlockall"] = {"granted": bool(ipc) or memlock == "unlimited", "how": caps,
                           "detail": caps + ("" if ipc or memlock == "unlimited" else
                                             ": mlockall(MCL_CURRENT|MCL_FUTURE) locks the node's whole mapped "
                                             "size (hundreds of MiB with numpy and libzmq)")}
    if ctx.loop_cpu is not None and ctx.allowed:
        ok = ctx.loop_cpu in ctx.allowed
        how = f"Cpus_allowed_list {format_cpulist(ctx.allowed)}"
        out["affinity"] = {"granted": ok, "detail": how, "how": how}
    else:
        out["affinity"] = {"granted": None, "detail": "affinity mask or loop core unknown"}
    dma = ctx.path("/dev/cpu_dma_latency")
    if os.path.exists(dma):
        ok = os.access(dma, os.W_OK)
        how = f"/dev/cpu_dma_latency {'writable' if ok else 'not writable'} by uid {os.getuid()}"
        out["cpu_dma_latency"] = {"granted": ok, "how": how, "detail": how}
    else:
        out["cpu_dma_latency"] = {"granted": False, "detail": "/dev/cpu_dma_latency does not exist", "how": ""}
    return out


def try_privileges(cpu: int, priority: int = 80, timeout: float = 20.0) -> dict:
    """Try affinity, mlockall, /dev/cpu_dma_latency and SCHED_FIFO in a child process (which then exits,
    so nothing stays changed). {name: (granted, error)} or {"error": reason}."""
    try:
        r = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, str(cpu), str(priority)],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            return {"error": f"probe child exited {r.returncode}: {r.stderr.strip()[-300:]}"}
        return {k: tuple(v) for k, v in json.loads(r.stdout).items()}
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return {"error": f"probe child failed: {e}"}


def gather_privileges(ctx: _Ctx, probe: bool, priority: int = 80) -> None:
    ctx.priv = _static_privileges(ctx, priority)
    ctx.priv_probed = False
    if probe and ctx.loop_cpu is not None:
        res = try_privileges(ctx.loop_cpu, priority)
        ctx.priv_probed = True
        for name in ("affinity", "sched_fifo", "mlockall", "cpu_dma_latency"):
            static = ctx.priv[name]
            if "error" in res:
                ctx.priv[name] = {"granted": None, "detail": res["error"]}
            else:
                ok, err = res[name]
                ctx.priv[name] = {"granted": ok, "how": "tried in a child process",
                                  "detail": ("granted when tried in a child process" if ok else f"refused: {err}")
                                  + (f" ({static['how']})" if static.get("how") else "")}
    for name, v in ctx.priv.items():
        ctx.fact(f"priv_{name}", v["granted"])


def check_privileges(ctx: _Ctx, priority: int = 80) -> list[dict]:
    area = "privileges"
    how = "" if getattr(ctx, "priv_probed", False) else " (from capabilities/limits, not tried)"
    c = ctx.loop_cpu
    specs = {   # name: (verdict when refused, what the node does with it, what is lost without it, fix)
        "affinity": ("bad", f"the node pins its loop thread to core {c}",
                     f"the loop thread could not be pinned to core {c} and would migrate",
                     "use --cpu / [realtime] cpu within the process's affinity (`taskset -p $$`), or widen the "
                     "cpuset the node starts in"),
        "sched_fifo": ("bad", f"the loop thread runs SCHED_FIFO priority {priority}",
                       "without SCHED_FIFO the loop is an ordinary task: any other runnable task on the core "
                       "delays it by up to a scheduler slice (ms)",
                       "grant real-time priority: limits.conf `@realtime - rtprio 99` (and add the user to group "
                       "realtime), systemd `LimitRTPRIO=99` or `AmbientCapabilities=CAP_SYS_NICE`; in a container "
                       "`--cap-add SYS_NICE` (cgroup v1 with RT_GROUP_SCHED also needs cpu.rt_runtime_us > 0)"),
        "mlockall": ("warn", "the node locks all its memory (mlockall MCL_CURRENT|MCL_FUTURE)",
                     "without mlockall a page of the node can be reclaimed and faulted back in inside the loop",
                     "raise the locked-memory limit: `ulimit -l unlimited` (limits.conf `@realtime - memlock "
                     "unlimited`; systemd `LimitMEMLOCK=infinity`) or grant CAP_IPC_LOCK"),
        "cpu_dma_latency": ("warn", "the node holds /dev/cpu_dma_latency at 0 while it runs",
                            "without it idle CPUs may enter deep idle states and wake slowly",
                            "run the node as root, or a udev rule: KERNEL==\"cpu_dma_latency\", GROUP=\"realtime\", "
                            "MODE=\"0660\" (and the user in group realtime)"),
    }
    out = []
    for name, (sev, what, loss, fix) in specs.items():
        p = ctx.priv.get(name, {"granted": None, "detail": "not checked"})
        if p["granted"] is None:
            out.append(_item(area, name, "unknown", "unknown", p["detail"], fix))
        elif p["granted"]:
            out.append(_item(area, name, "granted" + how, "ok", f"{what}: {p['detail']}"))
        else:
            out.append(_item(area, name, "refused" + how, sev, f"{loss}: {p['detail']}", fix))
    return out


def check_tracefs(ctx: _Ctx) -> list[dict]:
    area = "tracing"
    mounts, merr = ctx.read("/proc/mounts")
    cfg, _ = ctx.kconfig
    cfg = cfg or {}
    dirs = []
    for line in (mounts or "").splitlines():
        f = line.split()
        if len(f) >= 3 and f[2] == "tracefs":
            dirs.append(f[1])
        elif len(f) >= 3 and f[2] == "debugfs":
            dirs.append(f[1].rstrip("/") + "/tracing")
    missing_cfg = [k for k in ("CONFIG_OSNOISE_TRACER", "CONFIG_TIMERLAT_TRACER") if cfg.get(k) == "n"]
    kfix = ("a kernel with " + " and ".join(f"{k}=y" for k in missing_cfg) + " (distribution kernels since 5.14 "
            "and PREEMPT_RT kernels have them)") if missing_cfg else ""
    for d in dirs + ["/sys/kernel/tracing"]:
        tracers, err = ctx.read1(f"{d}/available_tracers")
        if tracers is None:
            if os.path.exists(ctx.path(d)) and "does not exist" not in (err or ""):
                ctx.fact("tracefs", "unreadable")
                return [_item(area, "tracefs", f"{d}: unreadable", "unknown", err,
                              "run doctor (and the stall attributor) as root")]
            continue
        have = [t for t in ("osnoise", "timerlat") if t in tracers.split()]
        ctx.fact("tracefs", d)
        ctx.fact("tracers", tracers.split())
        value = f"{d}: {tracers}"
        if len(have) == 2:
            return [_item(area, "tracefs", value, "ok", "osnoise and timerlat are there: a stall can be "
                          "attributed to the interrupt, softirq or thread that caused it")]
        lacking = [t for t in ("osnoise", "timerlat") if t not in have]
        return [_item(area, "tracefs", value, "warn", f"tracefs is mounted but has no {' or '.join(lacking)} "
                      "tracer: stalls can be measured but not attributed",
                      kfix or "a kernel with CONFIG_OSNOISE_TRACER=y and CONFIG_TIMERLAT_TRACER=y")]
    ctx.fact("tracefs", None)
    if mounts is None:
        return [_item(area, "tracefs", "unknown", "unknown", merr, "`mount | grep tracefs`")]
    detail = "tracefs is not mounted (not at /sys/kernel/tracing, no debugfs)"
    if missing_cfg:
        detail += "; and this kernel lacks " + ", ".join(missing_cfg)
    fix = "`mount -t tracefs nodev /sys/kernel/tracing`" + (f"; {kfix}" if kfix else "")
    return [_item(area, "tracefs", "not mounted", "warn", detail + ": a stall attributor needs it", fix)]


# ------------------------------------------------------------------------------------------- the runs

def _safe(fn, ctx, area, check, *a, **kw):
    try:
        return fn(ctx, *a, **kw)
    except Exception as e:    # a check must never take doctor down: it becomes unknown with the reason
        return [_item(area, check, "unknown", "unknown", f"doctor could not evaluate it: {type(e).__name__}: {e}",
                      "report this as a doctor bug")]


def _gather(ctx, cpu, probe, priority):
    checks = _safe(check_loop_core, ctx, "loop core", "loop core", cpu)
    try:
        gather_privileges(ctx, probe, priority)
    except Exception as e:
        ctx.priv = {n: {"granted": None, "detail": f"{type(e).__name__}: {e}"}
                    for n in ("affinity", "sched_fifo", "mlockall", "cpu_dma_latency")}
    return checks


def _cheap_checks(ctx, spin_us):
    """The checks machine_facts runs too: file reads only (no sample, no probe, no /proc/PID scan)."""
    out = []
    out += _safe(check_smt, ctx, "loop core", "SMT siblings")
    out += _safe(check_preemption, ctx, "kernel", "preemption")
    out += _safe(check_hz, ctx, "kernel", "HZ")
    out += _safe(check_clocksource, ctx, "clock and timers", "clocksource")
    out += _safe(check_cpuidle, ctx, "power management", "cpuidle")
    out += _safe(check_cpufreq, ctx, "power management", "cpufreq governor")
    out += _safe(check_thp, ctx, "memory", "THP")
    out += _safe(check_swap, ctx, "memory", "swap")
    out += _safe(check_rt_throttling, ctx, "scheduler", "RT throttling", spin_us)
    out += _safe(check_isolation, ctx, "isolation", "kernel command line")
    out += _safe(check_irqs, ctx, "interrupts", "IRQs on the loop core")
    out += _safe(check_steal, ctx, "virtualization", "steal since boot")
    out += _safe(check_tracefs, ctx, "tracing", "tracefs")
    return out


def run_doctor(root="/", cpu=None, sample: float = 1.0, probe_privileges: bool = True, priority: int = 80,
               spin_us: float = 150, sleep=time.sleep) -> dict:
    """Every check. ``cpu``: a core number, "last" (default: the highest CPU of the affinity mask) or "none".
    ``sample``: seconds of live steal sampling (0: skip). ``probe_privileges``: try them in a child process
    (else judge them from capabilities and limits). Returns {"checks", "summary", "machine", "exit_code", ...}."""
    ctx = _Ctx(root)
    checks = _gather(ctx, cpu, probe_privileges, priority)
    checks += _cheap_checks(ctx, spin_us)
    if sample and sample > 0:
        checks += _safe(check_steal_live, ctx, "virtualization", "steal live", sample, sleep)
    checks += _safe(check_kthreads, ctx, "kernel threads", "kthreads on the loop core")
    checks += _safe(check_privileges, ctx, "privileges", "privileges", priority)
    order = {a: i for i, a in enumerate(AREAS)}
    checks.sort(key=lambda c: order.get(c["area"], len(order)))        # stable: keeps order within an area
    virt, _ = ctx.virtualized
    ctx.fact("virtualized", virt)
    counts = {v: sum(1 for c in checks if c["verdict"] == v) for v in VERDICTS}
    return {"root": ctx.root, "loop_cpu": ctx.loop_cpu, "privileges_probed": bool(getattr(ctx, "priv_probed", 0)),
            "checks": checks, "summary": dict(counts, line=summary_line(counts)),
            "machine": ctx.facts, "exit_code": 1 if counts["bad"] else 0,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def machine_facts(root="/", cpu=None) -> dict:
    """The facts doctor finds, cheaply (file reads only: no live sample, no privilege probe, no process
    scan; about 10 ms): kernel, preemption model, HZ, clocksource, cpuidle, governor, SMT, THP, RT
    throttling, swap, command-line isolation, IRQs on the loop core, steal since boot, tracefs, and the
    privileges as capabilities and limits grant them, plus ``verdicts`` {check: verdict}. Never raises:
    what cannot be read is "unknown" or None. The node records it in each run's summary.json."""
    try:
        ctx = _Ctx(root)
        checks = _gather(ctx, cpu, False, 80)
        checks += _cheap_checks(ctx, 150)
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


# ------------------------------------------------------------------------------------------- output

def _header(result) -> str:
    m = result["machine"]
    virt = {True: "VM", False: "bare metal", None: "VM unknown"}[m.get("virtualized")]
    spec = m.get("loop_cpu_spec", "last")
    core = result["loop_cpu"]
    return (f"control-node doctor: kernel {m.get('kernel') or '?'} ({virt}), CPUs {m.get('cpus_online') or '?'}, "
            f"loop core {core if core is not None else '?'} ([realtime] cpu = {spec})")


def format_text(result: dict, width: int = 100) -> str:
    """Plain text, grouped by area: verdict, check, what was found, detail, fix."""
    lines = [_header(result), ""]
    wrap = dict(width=width, break_long_words=False, break_on_hyphens=False)
    area = None
    for c in result["checks"]:
        if c["area"] != area:
            area = c["area"]
            lines.append(area.upper())
        lines += textwrap.wrap(f"{c['verdict']:<7} {c['check']}: {c['value']}", subsequent_indent=" " * 10,
                               initial_indent="  ", **wrap)
        if c["detail"]:
            lines += textwrap.wrap(c["detail"], initial_indent=" " * 10, subsequent_indent=" " * 10, **wrap)
        if c["fix"] and c["verdict"] != "ok":
            lines += textwrap.wrap("fix: " + c["fix"], initial_indent=" " * 10, subsequent_indent=" " * 15, **wrap)
    lines += ["", f"summary: {result['summary']['line']}"
              + ("" if result["privileges_probed"] else " (privileges from capabilities/limits, not tried)")]
    return "\n".join(lines)


def print_rich(result: dict, console=None) -> None:
    """A rich table grouped by area (for a terminal)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
    console = console or Console()
    style = {"ok": "green", "warn": "yellow", "bad": "bold red", "unknown": "magenta"}
    t = Table(title=Text(_header(result)), show_lines=False, expand=True, title_justify="left")
    t.add_column("verdict", no_wrap=True)
    t.add_column("check", no_wrap=True, style="bold")
    t.add_column("found", ratio=3)
    t.add_column("fix", ratio=2)
    area = None
    for c in result["checks"]:
        if c["area"] != area:
            if area is not None:
                t.add_section()
            area = c["area"]
            t.add_row("", Text(area.upper(), style="bold cyan"), "", "")
        found = Text(c["value"])
        if c["detail"]:
            found.append("\n" + c["detail"], style="dim")
        t.add_row(Text(c["verdict"], style=style[c["verdict"]]), Text(c["check"]), found,
                  Text(c["fix"] if c["verdict"] != "ok" else ""))
    console.print(t)
    s = result["summary"]
    line = Text("summary: ")
    for i, v in enumerate(VERDICTS):
        line.append(f"{s[v]} {v}", style=style[v] if s[v] else "")
        if i < len(VERDICTS) - 1:
            line.append(", ")
    if not result["privileges_probed"]:
        line.append(" (privileges from capabilities/limits, not tried)")
    console.print(line)
