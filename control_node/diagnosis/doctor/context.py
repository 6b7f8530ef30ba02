"""What every check reads: cached files under ``root`` (through :mod:`control_node.procfs`) and the facts
derived from them on first use (the loop core, the privileges, the kernel config and command line, VM or
not). A check asks the context; it never reads what another check stored, so the order they run in does
not change a verdict."""
from __future__ import annotations

import gzip
import os
import re
import time
from dataclasses import dataclass, field

from control_node.diagnosis.doctor import privileges
from control_node.diagnosis.doctor.registry import item
from control_node.procfs import Procfs, format_cpulist, parse_cpulist


@dataclass
class LoopCore:
    """The core the per-core checks are about, how it was chosen, and the loop-core check's items."""
    cpu: int | None
    spec: object
    reason: str = ""                          # why cpu is None
    allowed: set = field(default_factory=set)
    online: set = field(default_factory=set)
    items: list = field(default_factory=list)


class Ctx:
    """One doctor run: ``cpu`` (a core number, "last" or "none"), ``probe`` (try the privileges in a child
    process), ``priority`` (SCHED_FIFO priority to try), ``spin_us`` ([loop] spin_us, for RT throttling),
    ``sample`` / ``sleep`` (the live steal sample)."""

    def __init__(self, root="/", cpu=None, probe=False, priority=80, spin_us=150.0, sample=0.0, sleep=time.sleep):
        self.fs = Procfs(root)
        self.root = self.fs.root
        self.spec, self.probe, self.priority, self.spin_us = cpu, probe, priority, spin_us
        self.sample, self.sleep = sample, sleep
        self.facts: dict = {}
        self._cache: dict = {}

    def _once(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # ---- files
    def path(self, p: str) -> str:
        return self.fs.path(p)

    def read(self, p: str, limit: int | None = None):
        return self._once(("read", p, limit), lambda: self.fs.read(p, limit))

    def read1(self, p: str):
        text, err = self.read(p)
        return (text.strip(), None) if text is not None else (None, err)

    def exists(self, p) -> bool:
        return os.path.exists(self.path(p))

    def fact(self, key, value):
        self.facts[key] = value

    # ---- kernel config, command line, machine kind
    @property
    def kconfig(self):
        """(dict CONFIG_X -> value ("n" for `is not set`), source) or (None, reason)."""
        return self._once("kconfig", self._load_kconfig)

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
        return self._once("cmdline", self.fs.cmdline)

    @property
    def mounts(self):
        """([Mount], None) or (None, reason), from /proc/mounts."""
        return self._once("mounts", self.fs.mounts)

    @property
    def hz(self) -> int | None:
        cfg, _ = self.kconfig
        v = (cfg or {}).get("CONFIG_HZ", "")
        return int(v) if v.isdigit() else None

    @property
    def virtualized(self):
        """(True/False, how) or (None, reason): the one VM detection (:meth:`Procfs.virtualization`)."""
        return self._once("virt", self.fs.virtualization)

    # ---- the process that runs the node (this one, or the tree's /proc/self)
    @property
    def self_status(self) -> dict:
        return self._once("status", lambda: self.fs.status("self")[0] or {})

    @property
    def limits(self) -> dict:
        """'Max locked memory' -> (soft, hard) strings, from /proc/self/limits."""
        return self._once("limits", lambda: self.fs.limits("self")[0] or {})

    def cap(self, bit: int):
        """True/False for a capability in CapEff, None when unreadable."""
        v = self.self_status.get("CapEff")
        if v is None:
            return None
        try:
            return bool(int(v, 16) >> bit & 1)
        except ValueError:
            return None

    # ---- the loop core and the privileges, derived once
    @property
    def core(self) -> LoopCore:
        return self._once("core", self._resolve_core)

    @property
    def loop_cpu(self) -> int | None:
        return self.core.cpu

    @property
    def cpu_reason(self) -> str:
        return self.core.reason

    @property
    def allowed(self) -> set:
        return self.core.allowed

    @property
    def online(self) -> set:
        return self.core.online

    def _resolve_core(self) -> LoopCore:
        area = "loop core"
        allowed_text = self.self_status.get("Cpus_allowed_list")
        online, online_err = self.fs.online_cpus()
        online = online or set()
        try:
            allowed = parse_cpulist(allowed_text, where="/proc/self/status Cpus_allowed_list") if allowed_text \
                else set()
        except ValueError:
            allowed = set()
        if not allowed and self.root in ("/", "") and hasattr(os, "sched_getaffinity"):
            allowed = set(os.sched_getaffinity(0))
        self.fact("cpus_online", format_cpulist(online) if online else None)
        self.fact("cpus_allowed", format_cpulist(allowed) if allowed else None)
        spec = "last" if self.spec is None else self.spec
        core = LoopCore(None, spec, allowed=allowed, online=online)
        pool = allowed or online
        if isinstance(spec, str) and spec not in ("last", "none"):
            try:
                spec = core.spec = int(spec)
            except ValueError:
                core.reason = f"--cpu {spec!r} is not a core number, 'last' or 'none'"
                core.items = [item(area, "loop core", spec, "bad", core.reason, "pass --cpu N with N a core number")]
                return core
        if isinstance(spec, int):
            core.cpu = spec
            how = f"core {spec} (--cpu / [realtime] cpu)"
        elif not pool:
            core.reason = ("no CPU affinity mask (/proc/self/status Cpus_allowed_list) and no online CPU list "
                           f"({online_err})")
            core.items = [item(area, "loop core", "unknown", "unknown", core.reason, "pass --cpu N")]
            return core
        else:
            core.cpu = max(pool)
            how = f"core {core.cpu}: the highest CPU of the affinity mask {format_cpulist(pool)}"
        c = core.cpu
        self.fact("loop_cpu", c)
        self.fact("loop_cpu_spec", spec)
        if spec == "none":
            core.items = [item(area, "loop core", f"not pinned ([realtime] cpu = none); per-core checks use {how}",
                               "warn", "an unpinned loop thread migrates between cores: each move costs cache "
                                       "refills and it may land on a core busy with interrupts",
                               'set [realtime] cpu = "last" (the default) or a core number')]
        elif allowed and c not in allowed:
            core.items = [item(area, "loop core", how, "bad",
                               f"core {c} is not in this process's affinity mask {format_cpulist(allowed)}: the "
                               "node's sched_setaffinity would fail",
                               f"use --cpu / [realtime] cpu within {format_cpulist(allowed)}, or start the node with "
                               f"a wider cpuset (`taskset -c {format_cpulist(allowed | {c})} ...`)")]
        elif online and c not in online:
            core.items = [item(area, "loop core", how, "bad", f"core {c} is not online "
                               f"(online: {format_cpulist(online)})",
                               f"echo 1 > /sys/devices/system/cpu/cpu{c}/online, or pick an online core")]
        else:
            core.items = [item(area, "loop core", how, "ok",
                               "the node pins its loop thread here; the per-core checks below are about this core")]
        return core

    @property
    def priv(self) -> dict:
        """{affinity, sched_fifo, mlockall, cpu_dma_latency: {"granted": True/False/None, "detail", "how"}}:
        tried in a child process when probing (and the loop core is known), else from the capabilities
        and limits."""
        return self._once("priv", self._gather_privileges)

    @property
    def priv_probed(self) -> bool:
        self.priv
        return self._cache["priv_probed"]

    def _gather_privileges(self) -> dict:
        self._cache["priv_probed"] = False
        try:
            priv = privileges.gather(self, self.probe and self.loop_cpu is not None)
            self._cache["priv_probed"] = self.probe and self.loop_cpu is not None
        except Exception as e:
            priv = {n: {"granted": None, "detail": f"{type(e).__name__}: {e}"} for n in privileges.NAMES}
        for name, v in priv.items():
            self.fact(f"priv_{name}", v["granted"])
        return priv


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


def bracketed(text: str) -> str | None:
    """``"always [madvise] never"`` -> ``"madvise"``."""
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else None


GRUB = ("add it to GRUB_CMDLINE_LINUX in /etc/default/grub, run `update-grub` "
        "(or `grub2-mkconfig -o /boot/grub2/grub.cfg`) and reboot")
