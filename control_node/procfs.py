"""Every ``/proc`` and ``/sys`` read the node does, parsed once (a leaf: standard library only).

:class:`Procfs` reads under a root prefix (default ``/``), so tests point it at a tree of real-format
files. The parsers are pure functions of the text; on a malformed file they raise :class:`ProcfsError`
naming the file and the line. Readers that may meet a missing or unreadable file return ``(value, None)``
or ``(None, reason)`` (:class:`Read`), the reason naming the file and why: doctor turns it into an
``unknown`` verdict, the why-late recorder into "not granted" evidence.

Users: ``control-node doctor`` (every check), the why-late recorder (interrupt, softirq and steal counts of
the loop's core; the VM verdict) and ``[realtime] isolate`` (threads, kernel threads and IRQs of a core).
There is one VM detection (:meth:`Procfs.virtualization`), so doctor and the why-late report agree.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

PF_KTHREAD = 0x00200000          # task flag (field 9 of /proc/PID/stat): a kernel thread
DMI_VM = re.compile(r"QEMU|KVM|VMware|VirtualBox|Xen|Bochs|Virtual Machine|Google Compute|Amazon EC2", re.I)


class ProcfsError(ValueError):
    """A file that does not have the kernel's format; the message names the file and the line."""

    def __init__(self, path: str, what: str, line: int | None = None):
        self.path, self.line = path, line
        super().__init__(f"{path}{f':{line}' if line else ''}: {what}")


class Read(NamedTuple):
    """A file's text, or why it could not be read (exactly one of the two is None)."""
    text: str | None
    error: str | None


# ------------------------------------------------------------------------------------------ CPU lists

def parse_cpulist(text: str, max_cpu: int | None = None, where: str = "cpu list") -> set[int]:
    """The kernel's CPU list format (``cpulist_parse``): ``"0-3,5,8-11:2/4"`` -> {0, 1, 2, 3, 5, 8, 9};
    empty (or ``(null)``) -> set(). ``"all"`` and ``N`` (the last CPU), which only the boot command line
    uses, need ``max_cpu``. Raises :class:`ProcfsError` naming ``where`` on anything else."""
    out: set[int] = set()
    text = text.strip()
    if not text or text == "(null)":
        return out
    for part in text.split(","):
        part = part.strip()
        if part == "all":
            if max_cpu is None:
                raise ProcfsError(where, f"{part!r} without a CPU count")
            out.update(range(max_cpu + 1))
            continue
        if "N" in part:
            if max_cpu is None:
                raise ProcfsError(where, f"{part!r}: N (the last CPU) without a CPU count")
            part = part.replace("N", str(max_cpu))
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?", part)
        if not m:
            raise ProcfsError(where, f"{part!r} is not a CPU, a range a-b or a group a-b:used/size")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise ProcfsError(where, f"{part!r}: the range ends before it starts")
        if m.group(3):
            used, size = int(m.group(3)), int(m.group(4))
            if size == 0 or used > size:
                raise ProcfsError(where, f"{part!r}: a group needs 0 < used <= size")
            out.update(c for c in range(lo, hi + 1) if (c - lo) % size < used)
        else:
            out.update(range(lo, hi + 1))
    return out


def format_cpulist(cpus) -> str:
    """{0, 1, 2, 5} -> ``"0-2,5"`` (what the kernel writes, and accepts in ``smp_affinity_list``)."""
    cpus = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def parse_hexmask(text: str, where: str = "CPU mask") -> set[int]:
    """``/proc/irq/default_smp_affinity`` style ``"00000000,00000003"`` -> {0, 1}."""
    try:
        value = int(text.strip().replace(",", ""), 16)
    except ValueError:
        raise ProcfsError(where, f"{text.strip()!r} is not a hexadecimal CPU mask") from None
    return {i for i in range(value.bit_length()) if value >> i & 1}


# ------------------------------------------------------------------------- /proc/interrupts, softirqs

@dataclass(frozen=True)
class CounterRow:
    """One line of /proc/interrupts or /proc/softirqs: ``name`` is the IRQ number or the short name
    (``LOC``, ``TIMER``); ``counts`` is per CPU column (a line may have fewer columns than the header:
    ``ERR``, ``MIS``); ``desc`` the rest (chip, hwirq, trigger, device names)."""
    name: str
    counts: dict[int, int]
    desc: str = ""

    @property
    def numbered(self) -> bool:
        return self.name.isdigit()

    @property
    def device(self) -> str:
        """The last word of the description (the device action's name), or ``irq N``."""
        words = self.desc.split()
        return words[-1] if words else f"irq {self.name}"


@dataclass(frozen=True)
class CounterTable:
    """/proc/interrupts or /proc/softirqs: the CPU columns of the header and the rows."""
    cpus: tuple[int, ...]
    rows: tuple[CounterRow, ...]

    def on_cpu(self, cpu: int) -> dict[str, int] | None:
        """{source: count on ``cpu``}, None when there is no column for it. A numbered IRQ's source is
        ``"N description"``, a named line's its name."""
        if cpu not in self.cpus:
            return None
        return {(f"{r.name} {r.desc}".strip() if r.numbered else r.name): r.counts[cpu]
                for r in self.rows if cpu in r.counts}


def parse_counter_table(text: str, where: str = "/proc/interrupts") -> CounterTable:
    """The per-CPU counter tables /proc/interrupts and /proc/softirqs: a header ``CPU0 CPU1 ...`` (only
    online CPUs: the numbers may skip), then ``NAME: count count ... description``."""
    lines = text.splitlines()
    if not lines:
        raise ProcfsError(where, "empty: no CPU header")
    head = lines[0].split()
    if not head or not all(re.fullmatch(r"CPU\d+", t) for t in head):
        raise ProcfsError(where, f"the header is not CPU columns: {lines[0].strip()!r}", 1)
    cpus = tuple(int(t[3:]) for t in head)
    rows = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, colon, rest = line.partition(":")
        if not colon or not name.strip() or " " in name.strip():
            raise ProcfsError(where, f"not `NAME: counts`: {line.strip()!r}", n)
        fields = rest.split()
        counts = {}
        for i, cpu in enumerate(cpus):
            if i < len(fields) and fields[i].isdigit():
                counts[cpu] = int(fields[i])
            else:
                break
        rows.append(CounterRow(name.strip(), counts, " ".join(fields[len(counts):])))
    return CounterTable(cpus, tuple(rows))


# ----------------------------------------------------------------------------------------- /proc/stat

class CpuTimes(NamedTuple):
    """A ``cpuN`` line of /proc/stat, in USER_HZ ticks (guest time is already inside user)."""
    cpu: int
    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int

    @property
    def total(self) -> int:
        return self.user + self.nice + self.system + self.idle + self.iowait + self.irq + self.softirq + self.steal


def _cpu_times(line: str, where: str, n: int) -> CpuTimes:
    name, *vals = line.split()
    if len(vals) < 8 or not all(v.isdigit() for v in vals):
        raise ProcfsError(where, f"{name} has {len(vals)} values, not 8 or more numbers (the 8th is steal)", n)
    return CpuTimes(int(name[3:]), *(int(v) for v in vals[:8]))


def parse_stat(text: str, where: str = "/proc/stat") -> dict[int, CpuTimes]:
    """{cpu: CpuTimes} of the ``cpuN`` lines (the ``cpu`` total line is left out)."""
    out = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if re.match(r"cpu\d+\s", line):
            t = _cpu_times(line, where, n)
            out[t.cpu] = t
    if not out:
        raise ProcfsError(where, "no cpuN lines")
    return out


class StatSampler:
    """One CPU's /proc/stat line, read again and again through one open descriptor into a buffer allocated
    once: a sampler running every 5 ms then makes no large allocation (a fresh 64 kB read each time
    fragments the C heap, and under mlockall every page the heap grows by stays resident)."""

    def __init__(self, cpu: int, root: str = "/", size: int = 1 << 16):
        self.cpu, self.path = cpu, os.path.join(os.fspath(root), "proc/stat")
        self._key = f"cpu{cpu} ".encode()
        self._buf = bytearray(size)
        self._fd = os.open(self.path, os.O_RDONLY)

    def read(self) -> CpuTimes | None:
        """The line now, None when it is missing (CPU offline) or the read fails."""
        try:
            n = os.preadv(self._fd, [self._buf], 0)
        except OSError:
            return None
        buf, key = self._buf, self._key
        at = 0 if buf.startswith(key) else buf.find(b"\n" + key, 0, n) + 1
        if at == 0:
            return None
        stop = buf.find(b"\n", at, n)
        try:
            return _cpu_times(buf[at:stop if stop >= 0 else n].decode(), "/proc/stat", 0)
        except ProcfsError:
            return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# ------------------------------------------------------------------------------ /proc/PID, kthreads

class TaskStat(NamedTuple):
    """The fields of /proc/PID/stat the node uses (``man 5 proc``)."""
    pid: int
    comm: str
    state: str
    flags: int           # field 9
    start_time: int      # field 22, clock ticks since boot: tells a thread from a later one reusing its id

    @property
    def kthread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def parse_task_stat(text: str, where: str = "/proc/PID/stat") -> TaskStat:
    """/proc/PID/stat; ``comm`` is between the first ``(`` and the last ``)`` (it may hold both)."""
    a, b = text.find("("), text.rfind(")")
    rest = text[b + 2:].split() if b > a >= 0 else []
    if len(rest) < 20 or not text[:a].strip().isdigit():
        raise ProcfsError(where, f"not `pid (comm) state ...` with 52 fields: {text.strip()[:80]!r}", 1)
    try:
        return TaskStat(int(text[:a]), text[a + 1:b], rest[0], int(rest[6]), int(rest[19]))
    except ValueError:
        raise ProcfsError(where, f"flags or start time not a number: {text.strip()[:80]!r}", 1) from None


def parse_status(text: str) -> dict[str, str]:
    """/proc/PID/status: ``Key: value`` lines -> {key: value}."""
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class KernelThread:
    pid: int
    comm: str
    cpus: frozenset | None       # Cpus_allowed_list; None when unreadable or unparsable


def parse_limits(text: str) -> dict[str, tuple[str, str]]:
    """/proc/PID/limits: {"Max locked memory": (soft, hard)}."""
    out = {}
    for line in text.splitlines()[1:]:
        m = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


# ------------------------------------------------------------------------ mounts, swaps, cmdline

class Mount(NamedTuple):
    device: str
    path: str            # octal escapes (``\040`` for a space) decoded
    fstype: str


def _unescape(field_: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def parse_mounts(text: str, where: str = "/proc/mounts") -> list[Mount]:
    """/proc/mounts (or /proc/self/mounts): ``device path fstype options 0 0`` per line."""
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        f = line.split()
        if not f:
            continue
        if len(f) < 3:
            raise ProcfsError(where, f"not `device path fstype ...`: {line.strip()!r}", n)
        out.append(Mount(_unescape(f[0]), _unescape(f[1]), f[2]))
    return out


class Swap(NamedTuple):
    name: str
    size_kb: int
    used_kb: int


def parse_swaps(text: str, where: str = "/proc/swaps") -> list[Swap]:
    """/proc/swaps: a header, then ``Filename Type Size Used Priority`` (KiB) per swap area."""
    out = []
    for n, line in enumerate(text.splitlines()[1:], start=2):
        f = line.split()
        if not f:
            continue
        if len(f) < 4 or not f[2].isdigit() or not f[3].isdigit():
            raise ProcfsError(where, f"not `name type size used priority`: {line.strip()!r}", n)
        out.append(Swap(_unescape(f[0]), int(f[2]), int(f[3])))
    return out


def parse_cmdline(text: str) -> dict[str, str]:
    """/proc/cmdline: {param: value} ("" for a bare flag); stops at ``--`` (what follows is init's)."""
    params = {}
    for tok in text.split():
        if tok == "--":
            break
        k, _, v = tok.partition("=")
        params[k] = v
    return params


# ------------------------------------------------------------------------------------------ cpuinfo

@dataclass(frozen=True)
class CpuInfo:
    """/proc/cpuinfo: one {key: value} per processor block; ``flags`` of the first (x86 ``flags``, arm64
    ``Features``)."""
    processors: tuple[dict, ...]
    flags: frozenset = field(default_factory=frozenset)

    @property
    def model(self) -> str:
        """The first processor's ``model name`` (x86), or "" (arm64 names no model)."""
        return next((p["model name"] for p in self.processors if "model name" in p), "")


def parse_cpuinfo(text: str) -> CpuInfo:
    blocks, cur = [], {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        k, _, v = line.partition(":")
        cur[k.strip()] = v.strip()
    if cur:
        blocks.append(cur)
    flags = next((b.get("flags", b.get("Features", "")) for b in blocks if "flags" in b or "Features" in b), "")
    return CpuInfo(tuple(blocks), frozenset(flags.split()))


class Virtualization(NamedTuple):
    """``vm``: True, False, or None when nothing could be read; ``how``: the evidence, or why unknown."""
    vm: bool | None
    how: str


# ------------------------------------------------------------------------------------------- reading

class Procfs:
    """Reads under ``root``. ``read`` gives a :class:`Read`; the typed readers give ``(value, None)`` or
    ``(None, reason)``, a malformed file's reason naming the file and line."""

    def __init__(self, root="/"):
        self.root = os.fspath(root)

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    def read(self, p: str, limit: int | None = None) -> Read:
        try:
            with open(self.path(p), "rb") as f:
                data = f.read(limit) if limit else f.read()
            return Read(data.decode("utf-8", "replace"), None)
        except FileNotFoundError:
            return Read(None, f"{p} does not exist")
        except PermissionError as e:
            why = e.strerror or "permission denied"
            hint = f" (uid {os.getuid()}: run doctor as root to read it)" if os.getuid() != 0 else ""
            return Read(None, f"{p}: {why}{hint}")
        except OSError as e:
            return Read(None, f"{p}: {e.strerror or e}")

    def read1(self, p: str) -> Read:
        """One stripped value (a /sys attribute)."""
        text, err = self.read(p)
        return Read(text.strip() if text is not None else None, err)

    def _parsed(self, p: str, parse):
        text, err = self.read(p)
        if text is None:
            return None, err
        try:
            return parse(text, p), None
        except ProcfsError as e:
            return None, str(e)

    def cpulist(self, p: str):
        """A CPU list file (``/sys/devices/system/cpu/online``, ``/proc/irq/N/smp_affinity_list``)."""
        return self._parsed(p, lambda t, w: parse_cpulist(t, where=w))

    def online_cpus(self):
        return self.cpulist("/sys/devices/system/cpu/online")

    def irq_affinity(self, irq) -> Read:
        """(set of CPUs, None) or (None, reason) for ``/proc/irq/N/smp_affinity_list``."""
        return self.cpulist(f"/proc/irq/{irq}/smp_affinity_list")

    def irqs(self) -> list[int]:
        """The IRQ numbers under /proc/irq (empty when unreadable)."""
        try:
            return sorted(int(n) for n in os.listdir(self.path("/proc/irq")) if n.isdigit())
        except OSError:
            return []

    def interrupts(self):
        return self._parsed("/proc/interrupts", parse_counter_table)

    def softirqs(self):
        return self._parsed("/proc/softirqs", parse_counter_table)

    def stat(self):
        return self._parsed("/proc/stat", parse_stat)

    def mounts(self):
        return self._parsed("/proc/mounts", parse_mounts)

    def swaps(self):
        return self._parsed("/proc/swaps", parse_swaps)

    def cmdline(self):
        return self._parsed("/proc/cmdline", lambda t, w: parse_cmdline(t))

    def cpuinfo(self):
        return self._parsed("/proc/cpuinfo", lambda t, w: parse_cpuinfo(t))

    def status(self, pid="self"):
        return self._parsed(f"/proc/{pid}/status", lambda t, w: parse_status(t))

    def limits(self, pid="self"):
        return self._parsed(f"/proc/{pid}/limits", lambda t, w: parse_limits(t))

    def task(self, pid):
        """(TaskStat, None) or (None, reason) of /proc/PID/stat (a thread id works too)."""
        return self._parsed(f"/proc/{pid}/stat", parse_task_stat)

    def comm(self, pid) -> str:
        text, _ = self.read1(f"/proc/{pid}/comm")
        return text if text is not None else "?"

    def pids(self) -> list[int]:
        """Process ids under /proc; raises OSError when /proc cannot be listed."""
        return [int(p) for p in os.listdir(self.path("/proc")) if p.isdigit()]

    def tids(self, pid) -> list[int]:
        """Thread ids of a process; raises OSError when it is gone."""
        return [int(t) for t in os.listdir(self.path(f"/proc/{pid}/task"))]

    def kernel_threads(self, pids=None) -> list[KernelThread]:
        """Every kernel thread (PF_KTHREAD) among ``pids`` (default: all) with its allowed CPUs; processes
        gone meanwhile are left out. Raises OSError when /proc cannot be listed."""
        out = []
        for pid in self.pids() if pids is None else pids:
            st, _ = self.task(pid)
            if st is None or not st.kthread:
                continue
            status, _ = self.status(pid)
            cpus = None
            if status and "Cpus_allowed_list" in status:
                try:
                    cpus = frozenset(parse_cpulist(status["Cpus_allowed_list"]))
                except ProcfsError:
                    pass
            out.append(KernelThread(pid, st.comm, cpus))
        return out

    def virtualization(self) -> Virtualization:
        """One VM detection for doctor and the why-late report: ``/sys/hypervisor/type``, the CPU's
        ``hypervisor`` flag, then the DMI vendor and product names."""
        hv, _ = self.read1("/sys/hypervisor/type")
        if hv:
            return Virtualization(True, f"/sys/hypervisor/type = {hv}")
        info, err = self.cpuinfo()
        if info is not None and "hypervisor" in info.flags:
            return Virtualization(True, "the `hypervisor` CPU flag is set (/proc/cpuinfo)")
        for p in ("/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/product_name"):
            v, _ = self.read1(p)
            if v and DMI_VM.search(v):
                return Virtualization(True, f"{p} = {v}")
        if info is None:
            return Virtualization(None, err)
        return Virtualization(False, "no `hypervisor` CPU flag, no /sys/hypervisor, no VM vendor in DMI")
