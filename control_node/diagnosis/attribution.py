"""Why was it late: evidence about the loop's core, collected beside the loop, matched to its late cycles.

While the node runs, :class:`Recorder` (two threads of the node, kept off the loop's core; neither
touches the loop thread) collects, for the loop's core only:

- **what ran and what interrupted it**, from the kernel's tracepoints in a private tracefs instance
  (``instances/control-node-PID``; tracefs is mounted by us if it is not, and unmounted after):
  ``sched_switch`` (which task held the core), ``irq_handler_entry/exit`` (device interrupts by name),
  ``softirq_entry/exit``, the x86 vectors (local timer, reschedule and function-call IPIs) and the loop
  thread's own page faults. Timestamps use the ``mono`` trace clock: CLOCK_MONOTONIC, as the loop's ring.
- **hypervisor steal** of the core, sampled from ``/proc/stat`` every 5 ms (its unit is 10 ms).
- **interrupt and softirq counts** by source on the core (``/proc/interrupts``, ``/proc/softirqs``) at
  the start and the end of the run.

After the run, :func:`attribute` takes each deadline miss and each of the worst wake-ups from the ring,
sums what the evidence shows inside its window (the time the loop should have been waking and working),
and names a cause: ``task NAME`` (another thread held the core), ``irq NAME`` / ``softirq NAME`` /
``vector NAME``, ``page fault``, ``own cycle work``, ``hypervisor`` (nothing ran on the core, yet time
passed, and the core's steal time grew), or ``unknown`` (nothing seen, and no steal either: said, never
guessed). Evidence that could not be had (no root for tracefs, no /proc/stat line) is listed as such.
"""
from __future__ import annotations

import errno
import os
import re
import resource
import threading
import time
from collections import deque

import numpy as np

from control_node.procfs import Procfs, StatSampler

TRACEFS = "/sys/kernel/tracing"
EVENTS = ("sched/sched_switch", "sched/sched_wakeup", "irq/irq_handler_entry", "irq/irq_handler_exit", "irq/softirq_entry",
          "irq/softirq_exit", "irq_vectors/local_timer_entry", "irq_vectors/local_timer_exit",
          "irq_vectors/reschedule_entry", "irq_vectors/reschedule_exit", "irq_vectors/call_function_entry",
          "irq_vectors/call_function_exit", "irq_vectors/call_function_single_entry",
          "irq_vectors/call_function_single_exit", "exceptions/page_fault_user",
          "exceptions/page_fault_kernel")
MAX_INTERVALS = 2_000_000        # evidence kept (the newest); about 50 bytes each
STEAL_PERIOD_S = 0.005
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
KINDS = ("task", "irq", "softirq", "vector", "page fault", "faults")
FAULT_DENSE_NS = 10_000            # a task faulting once per 10 us (or more) of its hold was held up faulting

_LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>\d+\.\d+): "
                   r"(?P<event>\w+): (?P<body>.*)$")
_SWITCH = re.compile(r"prev_comm=(?P<pc>.*?) prev_pid=(?P<pp>-?\d+) .*?==> next_comm=(?P<nc>.*?) "
                     r"next_pid=(?P<np>-?\d+)")
# what trace_pipe prints where the ring overran before the reader took its events (kernel/trace/trace.c)
_LOST = re.compile(r"^\s*CPU:\d+ \[LOST (?P<n>\d+) EVENTS\]")
_WAKEUP = re.compile(r"comm=(?P<comm>.*?) pid=(?P<pid>\d+) ")
# the header's name when the kernel's pid -> name cache (saved_cmdlines) has lost the task's: the body of a
# sched_switch or sched_wakeup always carries the name, so the parser learns it there
_UNKNOWN_COMM = "<...>"
_IRQ = re.compile(r"irq=(?P<irq>\d+)(?: name=(?P<name>\S+))?")
_SOFTIRQ = re.compile(r"vec=(?P<vec>\d+) \[action=(?P<name>\w+)\]")


class TraceParser:
    """Turns ``trace_pipe`` lines of one CPU into intervals of foreign activity on it: ``(kind, name,
    t0_ns, t1_ns)`` with kind one of :data:`KINDS`. ``loop_tid``: the loop thread, whose own running (and
    the idle task's) is not foreign. Page faults are points (t0 == t1): the loop's as ``page fault``, another
    task's as ``faults`` with the task's name.

    Who holds the core comes from ``sched_switch`` and, because some kernels (this machine's among them)
    record no ``sched_switch`` out of the idle task, from the task named in each event's header: a task
    seen there that no switch announced started at its ``sched_wakeup`` on this core if one was seen since
    the last event, else at its first event (then its time is a lower bound)."""

    def __init__(self, loop_tid: int, sink):
        self.loop_tid, self.sink = loop_tid, sink
        self.running = None            # (comm, pid, since_ns) of the task on the core, when known
        self.open = {}                 # (kind, key) -> (name, t0_ns) of an interrupt being handled
        self.woken = {}                # pid -> t_ns of its last sched_wakeup seen on this core
        self.names = {}                # pid -> name, from sched_switch / sched_wakeup bodies
        self.last_t = None
        self.lines = self.unparsed = self.inferred_switches = self.events_lost = 0
        self.unparsed_examples = []     # the first few, in the evidence: a line nobody can see is not fixed

    def _unparsed(self, line: str) -> None:
        self.unparsed += 1
        if len(self.unparsed_examples) < 3:
            self.unparsed_examples.append(line[:200])

    def _name(self, comm, pid):
        """The header's task name, or the one the trace's bodies gave this pid when the header has none."""
        return self.names.get(pid, comm) if comm == _UNKNOWN_COMM else comm

    def _switch(self, comm, pid, start, end):
        if self.running is not None:
            pcomm, ppid, since = self.running
            if ppid not in (0, self.loop_tid):
                self.sink(("task", pcomm, since, max(since, end)))
        self.running = (comm, pid, start)
        self.woken.pop(pid, None)

    def feed(self, line: str) -> None:
        self.lines += 1
        m = _LINE.match(line)
        if m is None:
            lost = _LOST.match(line)
            if lost is None:
                self._unparsed(line)
            else:           # evidence the kernel could not keep (a reader behind on a loaded host): counted
                self.events_lost += int(lost.group("n"))
            return
        sec, _, frac = m.group("ts").partition(".")
        t = int(sec) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
        ev, body = m.group("event"), m.group("body")
        pid = int(m.group("pid"))
        if self.running is None or self.running[1] != pid:
            # a switch the trace did not record: the header's task holds the core now
            self.inferred_switches += self.running is not None
            woke = self.woken.get(pid)
            start = woke if (woke is not None and (self.last_t is None or woke >= self.last_t - 1)) else t
            self._switch(self._name(m.group("comm"), pid), pid, start, self.last_t if self.last_t is not None else t)
        self.last_t = t
        if ev == "sched_switch":
            s = _SWITCH.search(body)
            if s is None:
                self._unparsed(line)
                return
            for who, name in ((int(s.group("pp")), s.group("pc")), (int(s.group("np")), s.group("nc"))):
                if name != _UNKNOWN_COMM:
                    self.names[who] = name
            if self.running is not None and self.running[0] == _UNKNOWN_COMM and self.running[1] == int(s.group("pp")):
                self.running = (s.group("pc"),) + self.running[1:]      # named by the switch that ends its hold
            self._switch(s.group("nc"), int(s.group("np")), t, t)
        elif ev in ("sched_wakeup", "sched_waking"):
            s = _WAKEUP.search(body)
            if s is None:
                self._unparsed(line)
                return
            self.woken[int(s.group("pid"))] = t
            if s.group("comm") != _UNKNOWN_COMM:
                self.names[int(s.group("pid"))] = s.group("comm")
        elif ev in ("irq_handler_entry", "irq_handler_exit"):
            s = _IRQ.search(body)
            if s is None:
                self._unparsed(line)
                return
            self._pair("irq", s.group("irq"), s.group("name"), ev.endswith("entry"), t)
        elif ev in ("softirq_entry", "softirq_exit"):
            s = _SOFTIRQ.search(body)
            if s is None:
                self._unparsed(line)
                return
            self._pair("softirq", s.group("vec"), s.group("name"), ev.endswith("entry"), t)
        elif ev.endswith("_entry") or ev.endswith("_exit"):        # x86 vectors: local_timer, reschedule, ...
            name = ev.rsplit("_", 1)[0]
            self._pair("vector", name, name, ev.endswith("entry"), t)
        elif ev.startswith("page_fault"):
            if pid == self.loop_tid:
                self.sink(("page fault", ev.removeprefix("page_fault_"), t, t))
            elif pid != 0:
                self.sink(("faults", self._name(m.group("comm"), pid), t, t))

    def forget(self):
        """Trace text was left out here: what held the core, and open interrupts, are not known."""
        self.running, self.last_t = None, None
        self.open.clear()
        self.woken.clear()

    def _pair(self, kind, key, name, entry, t):
        if entry:
            self.open[(kind, key)] = (name, t)
            return
        began = self.open.pop((kind, key), None)
        if began is not None:
            self.sink((kind, began[0], began[1], t))


def _core_counts(fs: Procfs, cpu: int) -> dict:
    """What the run's start and end compare on core ``cpu``: {source: count} from /proc/interrupts and
    /proc/softirqs, and its /proc/stat times (each None when unreadable or without the CPU)."""
    out = {}
    for key, read in (("interrupts", fs.interrupts), ("softirqs", fs.softirqs)):
        table, _ = read()
        out[key] = table.on_cpu(cpu) if table is not None else None
    stat, _ = fs.stat()
    out["stat"] = (stat or {}).get(cpu)
    return out


PRUNE_EVERY_S = 0.25
HORIZON_NS = 50_000_000            # evidence older than the newest examined tick minus this is settled
MARGIN_NS = 20_000_000             # evidence kept around a late cycle's window (steal: sampled every 5 ms)
MAX_KEPT = 100_000                 # intervals kept for late cycles, at most (the rest: counted, dropped)
MAX_WINDOWS = 5_000                # late cycles whose evidence is kept: misses first, then the worst wake-ups
MAX_KEPT_STEAL = 20_000


class _Store:
    """Fixed-size columns for settled evidence, allocated (and touched) once at start: the node's memory
    does not grow with the run however much it keeps."""

    def __init__(self, capacity: int, width: int):
        self.a = np.zeros((capacity, width), dtype=np.int64)
        self.a.fill(1)
        self.a.fill(0)
        self.n = 0

    def add(self, *row) -> bool:
        if self.n >= self.a.shape[0]:
            return False
        self.a[self.n] = row
        self.n += 1
        return True

    def rows(self):
        return self.a[:self.n]


SLOT_BYTES = 1 << 16
N_SLOTS = 64                       # 4 MB of raw trace text held until the late cycles near it are known
_TS = re.compile(rb"\s(\d+)\.(\d+): ")


def _ts_ns(buf, a: int, b: int) -> int:
    """The timestamp (ns) of the trace line starting at ``a`` (up to ``b``), or -1."""
    m = _TS.search(buf, a, b)
    return int(m.group(1)) * 1_000_000_000 + int(m.group(2).ljust(9, b"0")[:9]) if m else -1


class _RawTrace:
    """Raw ``trace_pipe`` text held in fixed slots (allocated and touched once) until the loop's ring
    says whether a late cycle lies near it: only the text near one is parsed. Parsing every line in Python
    took ~15% of a core at ~10 000 lines/s; the late cycles' neighbourhoods are a small part of a run.
    Each slot holds whole lines of one read, with the time of its first and last line."""

    def __init__(self):
        self.buf = bytearray(N_SLOTS * SLOT_BYTES)
        self.buf[:] = b"\n" * len(self.buf)
        self.view = memoryview(self.buf)
        self.n = np.zeros(N_SLOTS, dtype=np.int64)
        self.t0 = np.zeros(N_SLOTS, dtype=np.int64)
        self.t1 = np.zeros(N_SLOTS, dtype=np.int64)
        self.queue = deque()                # slots filled, oldest first
        self.free = deque(range(N_SLOTS))
        self.cur, self.held = self.free.popleft(), 0     # the slot being filled; bytes of a partial line
        self.overlong = 0

    def read(self, fd: int) -> int:
        """One ``read`` of ``fd`` into the current slot (a free one must exist); returns bytes read."""
        base = self.cur * SLOT_BYTES
        n = os.readv(fd, [self.view[base + self.held:base + SLOT_BYTES]])
        if n <= 0:
            return 0
        end = base + self.held + n
        last = self.buf.rfind(b"\n", base, end)
        if last < 0:
            self.held += n
            if self.held == SLOT_BYTES:            # one line longer than a slot: not a trace line
                self.overlong += 1
                self.held = 0
            return n
        k = self.cur
        self.n[k] = last + 1 - base
        self.t0[k] = _ts_ns(self.buf, base, last)
        self.t1[k] = _ts_ns(self.buf, self.buf.rfind(b"\n", base, last) + 1 or base, last)
        if self.t0[k] < 0 or self.t1[k] < 0:
            self.t0[k] = -1
        self.queue.append(k)
        tail = end - (last + 1)
        self.cur = self.free.popleft()              # the reader settles a slot first when none is free
        nb = self.cur * SLOT_BYTES
        if tail:
            self.view[nb:nb + tail] = self.buf[last + 1:end]
        self.held = tail
        return n


class Recorder:
    """Collects the evidence for core ``cpu`` while the loop runs (``start`` before it, ``stop`` after).
    ``loop_tid``: the loop thread.

    With ``loop`` (the RtLoop), memory stays bounded however long the run: every 0.25 s the recorder
    reads the cycles the loop finished since (its ring, as the diagnostics thread does), notes the
    windows of the late ones (``floor_ns``: wake-ups later than this; and every miss), and of the
    evidence older than the newest tick examined keeps only what lies near such a window. ``lead_ns``:
    how long before its tick the loop's last sleep ends (:func:`sleep_lead_ns`)."""

    def __init__(self, cpu: int, loop_tid: int, tracing: bool = True, loop=None, floor_ns: int = 10_000,
                 lead_ns: int = 0, root="/"):
        self.cpu, self.loop_tid, self.tracing = cpu, loop_tid, tracing
        self.fs = Procfs(root)
        self.loop, self.floor_ns, self.lead_ns = loop, floor_ns, lead_ns
        self.intervals = deque(maxlen=MAX_INTERVALS)
        self.dropped = 0
        self.intervals_peak = 0         # the most unsettled evidence held at once: the node's memory follows it
        self.evidence = {}
        self.steal = deque()            # (t_mono_ns, steal ticks, irq ticks, softirq ticks)
        # settled evidence near late cycles: intervals (kind, name id, t0, t1), steal samples, windows (t0, t1)
        self.kept = _Store(MAX_KEPT, 4)
        self.kept_steal = _Store(MAX_KEPT_STEAL, 4)
        self.windows = _Store(4 * MAX_WINDOWS, 2)
        self._names, self._name_list = {}, []
        self.kept_dropped = 0
        self.windows_dropped = 0
        self._worst = []                # the 20 worst wake-ups examined (a min-heap)
        self._examined = 0              # cycles of the loop examined so far
        self._prune_lock = threading.Lock()
        self._last_prune = 0.0
        self._stop = threading.Event()
        self._threads = []
        self._instance = None
        self._mounted = False
        self.parser = TraceParser(loop_tid, self._sink)
        self._raw = None
        self._examined_tick = -(1 << 62)   # the newest tick of the ring examined so far
        self.lines_skipped = 0
        self.counts0 = {}
        self.stopped = False
        self.thread_cpu_s = {}
        self._t_start = None

    def _near(self, a, b) -> bool:
        """Does [a, b] come within MARGIN_NS of a late cycle's window?"""
        w = self.windows.rows()
        i = int(np.searchsorted(w[:, 0], b + MARGIN_NS, side="right"))
        while i > 0:
            i -= 1
            t0, t1 = int(w[i, 0]), int(w[i, 1])
            if t1 + MARGIN_NS >= a:
                return True
            if t0 < a - 10 * HORIZON_NS:     # windows are short: none further back can reach
                return False
        return False

    def prune(self, force=False):
        """Examine the loop's newly finished cycles and settle the evidence before them."""
        loop = self.loop
        now = time.monotonic()
        if loop is None or (not force and now - self._last_prune < PRUNE_EVERY_S):
            return
        if not self._prune_lock.acquire(blocking=False):
            return
        try:
            self._last_prune = now
            end = int(loop.cycles) - 2                  # the newest record may be mid-write
            start = max(self._examined, end - int(loop.capacity) + 1)
            if end <= start:
                return
            idx = np.arange(start, end) % int(loop.capacity)
            ring = loop.ring
            tick, wake = ring["t_tick_ns"][idx], ring["wake_latency_ns"][idx]
            ct, flags = ring["cycle_time_ns"][idx], ring["flags"][idx]
            for j in np.flatnonzero(((flags & 1) != 0) | (wake >= self.floor_ns)).tolist():
                w = max(int(wake[j]), 0)
                if self.windows.n >= MAX_WINDOWS:
                    # full: from now on only misses and wake-ups among the worst 20 seen
                    if not (flags[j] & 1) and w <= self._worst_floor():
                        continue
                    if self._kept_windows_capped():
                        continue
                self._note_worst(w)
                t0 = int(tick[j]) - self.lead_ns if w >= self.floor_ns else int(tick[j]) + w
                self.windows.add(t0, int(tick[j]) + w + int(ct[j]))
            self._examined = end
            self._examined_tick = int(tick[-1])
            horizon = int(tick[-1]) - HORIZON_NS
            while self.intervals and self.intervals[0][3] < horizon:
                iv = self.intervals.popleft()
                if self._near(iv[2], iv[3]):
                    key = (iv[0], iv[1])
                    nid = self._names.get(key)
                    if nid is None:
                        nid = self._names[key] = len(self._name_list)
                        self._name_list.append(key)
                    if not self.kept.add(0, nid, iv[2], iv[3]):
                        self.kept_dropped += 1
            while self.steal and self.steal[0][0] < horizon - MARGIN_NS:
                sm = self.steal.popleft()
                if self._near(sm[0], sm[0]):
                    self.kept_steal.add(*sm)
        finally:
            self._prune_lock.release()

    def _note_worst(self, w):
        import heapq
        if len(self._worst) < 20:
            heapq.heappush(self._worst, w)
        elif w > self._worst[0]:
            heapq.heapreplace(self._worst, w)

    def _worst_floor(self):
        return self._worst[0] if len(self._worst) >= 20 else -1

    def _kept_windows_capped(self):
        """Past 4 x MAX_WINDOWS late cycles nothing more is kept (counted in ``windows_dropped``)."""
        if self.windows.n >= 4 * MAX_WINDOWS:
            self.windows_dropped += 1
            return True
        return False

    def all_intervals(self) -> list:
        kept = [(*self._name_list[int(nid)], int(t0), int(t1)) for _k, nid, t0, t1 in self.kept.rows()]
        return kept + list(self.intervals)

    def all_steal(self) -> list:
        return sorted([tuple(int(v) for v in r) for r in self.kept_steal.rows()] + list(self.steal))

    def _sink(self, item):
        if len(self.intervals) == self.intervals.maxlen:
            self.dropped += 1
        self.intervals.append(item)
        self.intervals_peak = max(self.intervals_peak, len(self.intervals))

    # ---- tracefs -------------------------------------------------------------------------------
    def _write(self, rel, value):
        with open(os.path.join(self._instance, rel), "w") as f:
            f.write(value)

    def _start_trace(self):
        ev = self.evidence
        if not self.tracing:
            ev["trace"] = {"granted": False, "detail": "off ([diagnostics] attribution_trace = false)"}
            return
        if not os.path.isdir(os.path.join(TRACEFS, "instances")):
            try:
                os.makedirs(TRACEFS, exist_ok=True)
                rc = os.system(f"mount -t tracefs nodev {TRACEFS} >/dev/null 2>&1")
                if rc != 0 or not os.path.isdir(os.path.join(TRACEFS, "instances")):
                    raise OSError(errno.EPERM, "mount -t tracefs refused (needs root or CAP_SYS_ADMIN)")
                self._mounted = True
            except OSError as e:
                ev["trace"] = {"granted": False, "detail": f"tracefs is not mounted at {TRACEFS} and could not be: "
                                                           f"{e.strerror or e}"}
                return
        remove_stale_instances()
        inst = os.path.join(TRACEFS, "instances", f"control-node-{os.getpid()}")
        try:
            os.mkdir(inst)
        except FileExistsError:
            pass
        except OSError as e:
            ev["trace"] = {"granted": False, "detail": f"cannot create a tracefs instance: {e.strerror or e}"}
            self._unmount()
            return
        self._instance = inst
        enabled, missing = [], []
        try:
            self._write("tracing_on", "0")
            self._write("trace_clock", "mono")
            self._write("buffer_size_kb", "4096")
            self._write("tracing_cpumask", f"{1 << self.cpu:x}")
            for name in EVENTS:
                path = os.path.join(inst, "events", name)
                if not os.path.isdir(path):
                    missing.append(name)
                    continue
                if name == "sched/sched_wakeup":          # wake-ups of other tasks onto the loop's core (the
                    # loop's own, every cycle, are no evidence)
                    self._write(f"events/{name}/filter", f"target_cpu == {self.cpu} && pid != {self.loop_tid}")
                if name == "sched/sched_switch":          # the loop going to sleep, every cycle: no evidence
                    self._write(f"events/{name}/filter", f"prev_pid != {self.loop_tid} || next_pid != 0")
                self._write(f"events/{name}/enable", "1")
                enabled.append(name)
            self._write("tracing_on", "1")
        except OSError as e:
            ev["trace"] = {"granted": False, "detail": f"tracefs instance set-up failed: {e.strerror or e}"}
            self._remove_instance()
            return
        ev["trace"] = {"granted": True, "detail": f"tracefs instance {inst} (trace clock mono, core {self.cpu})",
                       "mounted_by_node": self._mounted, "events": enabled, "events_missing": missing}
        t = threading.Thread(target=self._timed, args=(self._read_trace,), name="cn-why-trace", daemon=True)
        self._threads.append(t)
        t.start()

    def _read_trace(self):
        self._leave_core()
        path = os.path.join(self._instance, "per_cpu", f"cpu{self.cpu}", "trace_pipe")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            self.evidence["trace"].update(granted=False, detail=f"cannot read {path}: {e.strerror or e}")
            return
        raw = self._raw = _RawTrace()
        try:
            while True:
                stopping = self._stop.is_set()      # read once more after it is set: the trace is drained
                if not raw.free:
                    self._settle()                   # full: the oldest slot is parsed undecided
                try:
                    n = raw.read(fd)
                except BlockingIOError:
                    n = 0
                if n:
                    self.prune()
                    self._settle()
                    continue
                if stopping:
                    break
                self._stop.wait(0.02)            # poll(): trace_pipe wakes readers only at buffer_percent
        finally:
            os.close(fd)

    def _settle(self, final: bool = False):
        """Hand the raw trace slots whose fate is known to the parser: parsed when a late cycle's window
        comes within MARGIN_NS of them (or none can be known: no loop, no timestamp, or no slot free),
        else dropped, counted in ``lines_skipped``. ``final``: the loop has ended, every window is known."""
        raw = self._raw
        while raw.queue:
            k = raw.queue[0]
            t0, t1 = int(raw.t0[k]), int(raw.t1[k])
            decided = final or self.loop is None or t1 + MARGIN_NS < self._examined_tick
            if not decided and raw.free:
                break
            raw.queue.popleft()
            a, b = k * SLOT_BYTES, k * SLOT_BYTES + int(raw.n[k])
            if not decided or self.loop is None or t0 < 0 or self._near(t0, t1):
                buf, feed = raw.buf, self.parser.feed
                nl = buf.find(b"\n", a, b)
                while nl >= 0:
                    feed(buf[a:nl].decode("utf-8", "replace"))
                    a = nl + 1
                    nl = buf.find(b"\n", a, b)
            else:
                self.parser.forget()
                self.lines_skipped += raw.buf.count(b"\n", a, b)
            raw.free.append(k)

    def _remove_instance(self):
        if self._instance:
            try:
                self._write("tracing_on", "0")
                for name in EVENTS:
                    p = os.path.join(self._instance, "events", name, "enable")
                    if os.path.exists(p):
                        self._write(f"events/{name}/enable", "0")
            except OSError:
                pass
            for _ in range(50):
                try:
                    os.rmdir(self._instance)
                    break
                except OSError:
                    time.sleep(0.02)         # a reader still holds a file of it
            self._instance = None
        self._unmount()

    def _unmount(self):
        if self._mounted:
            rc = os.system(f"umount {TRACEFS} >/dev/null 2>&1")
            self.evidence.setdefault("trace", {})["unmounted"] = rc == 0
            self._mounted = False

    # ---- /proc ---------------------------------------------------------------------------------
    def _leave_core(self):
        from control_node.loop.realtime import leave_core, name_thread
        name_thread(threading.current_thread().name[:15])
        leave_core(self.cpu)

    def _sample_steal(self):
        self._leave_core()
        try:
            sampler = StatSampler(self.cpu, self.fs.root)
        except OSError:
            return
        try:
            self._steal_loop(sampler)
        finally:
            sampler.close()

    def _steal_loop(self, sampler):
        while not self._stop.is_set():
            f = sampler.read()
            if f is not None:
                self.steal.append((time.monotonic_ns(), f.steal, f.irq, f.softirq))
            self.prune()
            self._stop.wait(STEAL_PERIOD_S)

    def _timed(self, work):
        """Run a recorder thread's ``work`` and note the CPU time it took: every run says what its
        evidence cost."""
        try:
            work()
        finally:
            ru = resource.getrusage(resource.RUSAGE_THREAD)
            self.thread_cpu_s[threading.current_thread().name] = round(ru.ru_utime + ru.ru_stime, 3)

    def start(self):
        self._t_start = time.monotonic()
        self.evidence["virtual_machine"] = virtual_machine(self.fs.root)
        self.counts0 = _core_counts(self.fs, self.cpu)
        if self.counts0["stat"] is None:
            self.evidence["steal"] = {"granted": False, "detail": f"/proc/stat has no cpu{self.cpu} steal field"}
        else:
            self.evidence["steal"] = {"granted": True, "detail": f"/proc/stat cpu{self.cpu} every "
                                                                 f"{STEAL_PERIOD_S * 1e3:g} ms (unit {1e3 / USER_HZ:g} ms)"}
            t = threading.Thread(target=self._timed, args=(self._sample_steal,), name="cn-why-steal", daemon=True)
            self._threads.append(t)
            t.start()
        self._start_trace()
        return self

    def stop(self):
        """Stop collecting (after the loop ended): the trace is drained, the instance removed."""
        self.stopped = True
        if self._instance:
            try:
                self._write("tracing_on", "0")
            except OSError:
                pass
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._remove_instance()
        if self._raw is not None and not any(t.is_alive() for t in self._threads):
            self.prune(force=True)                    # the loop's last cycles: every late window is known
            self._settle(final=True)
        end = _core_counts(self.fs, self.cpu)
        for key in ("interrupts", "softirqs"):
            a, b = self.counts0.get(key), end.get(key)
            if a is None or b is None:
                self.evidence[key] = {"granted": False, "detail": f"/proc/{key} unreadable or without cpu{self.cpu}"}
            else:
                delta = {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0) > 0}
                self.evidence[key] = {"granted": True, "on_core_during_run": dict(
                    sorted(delta.items(), key=lambda kv: -kv[1]))}
        a, b = self.counts0.get("stat"), end.get("stat")
        if a is not None and b is not None:
            self.evidence["steal"]["run_total_ms"] = (b.steal - a.steal) * 1e3 / USER_HZ
        self.evidence["smi"] = smi_count(self.cpu)
        wall = time.monotonic() - self._t_start if self._t_start is not None else 0.0
        self.evidence["recorder_cost"] = {
            "threads_cpu_s": dict(self.thread_cpu_s), "wall_s": round(wall, 3),
            "share_of_one_core": round(sum(self.thread_cpu_s.values()) / wall, 4) if wall > 0 else None}
        if "trace" in self.evidence and self.evidence["trace"].get("granted"):
            self.evidence["trace"].update(kept_near_late_cycles=self.kept.n, kept_dropped=self.kept_dropped,
                                          late_cycles_noted=self.windows.n, late_cycles_dropped=self.windows_dropped,
                                          lines=self.parser.lines, unparsed=self.parser.unparsed,
                                          events_lost=self.parser.events_lost,
                                          unparsed_examples=self.parser.unparsed_examples,
                                          lines_skipped_far_from_late_cycles=self.lines_skipped,
                                          switches_inferred=self.parser.inferred_switches,
                                          intervals_kept=len(self.intervals), intervals_dropped=self.dropped,
                                          intervals_peak=self.intervals_peak)
        return self


def remove_stale_instances() -> list[str]:
    """Remove the tracefs instances of nodes that died without removing theirs (SIGKILL): they would go on
    tracing. Returns the names removed."""
    base = os.path.join(TRACEFS, "instances")
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith("control-node-"):
            continue
        try:
            pid = int(name.rsplit("-", 1)[1])
            os.kill(pid, 0)
            continue                          # alive: its own
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        try:
            with open(os.path.join(base, name, "tracing_on"), "w") as f:
                f.write("0")
            os.rmdir(os.path.join(base, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def virtual_machine(root="/") -> dict:
    """Does this run under a hypervisor? Doctor's detection (:meth:`Procfs.virtualization`: /sys/hypervisor,
    the CPU's ``hypervisor`` flag, DMI), so doctor and the why-late report cannot disagree. ``vm`` is
    False when nothing could be read (an unexplained quiet gap then stays unknown)."""
    vm, how = Procfs(root).virtualization()
    if vm:
        return {"vm": True, "detail": how}
    if vm is None:
        return {"vm": False, "detail": f"unknown: {how}"}
    return {"vm": False, "detail": f"{how}: bare metal (an unexplained quiet gap stays unknown)"}


def smi_count(cpu: int) -> dict:
    """System-management interrupts so far (Intel MSR 0x34 via /dev/cpu/N/msr), or why they cannot be read."""
    path = f"/dev/cpu/{cpu}/msr"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return {"granted": False, "detail": f"{path}: {e.strerror or e} (needs the msr module and root)"}
    try:
        raw = os.pread(fd, 8, 0x34)
        return {"granted": True, "count": int.from_bytes(raw, "little")}
    except OSError as e:
        return {"granted": False, "detail": f"MSR_SMI_COUNT (0x34) unreadable: {e.strerror or e} (not an Intel CPU, "
                                            "or the hypervisor hides it)"}
    finally:
        os.close(fd)


# ---- matching ----------------------------------------------------------------------------------
def _overlaps(intervals, t0, t1) -> dict:
    """{(kind, name): ns of overlap with [t0, t1]} (points, e.g. page faults, count as 1 ns each)."""
    out = {}
    for kind, name, a, b in intervals:
        if a == b:
            if t0 <= a <= t1:
                out[(kind, name)] = out.get((kind, name), 0) + 1
            continue
        lo, hi = max(a, t0), min(b, t1)
        if hi > lo:
            out[(kind, name)] = out.get((kind, name), 0) + (hi - lo)
    return out


def _steal_ms(steal, t0, t1) -> float | None:
    """Steal time (ms) of the core between the last sample before t0 and the first after t1, or None."""
    if len(steal) < 2:
        return None
    ts = np.fromiter((s[0] for s in steal), dtype=np.int64, count=len(steal))
    i = max(0, int(np.searchsorted(ts, t0, side="right")) - 1)
    j = min(len(steal) - 1, int(np.searchsorted(ts, t1, side="left")))
    if j <= i:
        j = min(len(steal) - 1, i + 1)
    return (steal[j][1] - steal[i][1]) * 1e3 / USER_HZ


def classify(window_ns, lateness_ns, overlaps: dict, steal_ms, trace_ok: bool, own_ns: int,
             timer_late_ns=None, typical_ns=None, irq_held_ns=0, in_vm=False, woke_late=False) -> tuple[str, dict]:
    """A cause and the figures behind it for one late cycle. ``overlaps``: evidence in the window;
    ``own_ns``: the cycle's own work beyond its deadline share (0 when it woke late); ``timer_late_ns``:
    how late the core's first timer interrupt of the window came after the loop's wake-up timer was due
    (None: none seen); ``irq_held_ns``: how much of that delay other interrupt handlers (which run with
    interrupts off) were running; ``typical_ns``: the run's median cycle time (own work far beyond it is
    not named); ``in_vm``: the CPU says it runs under a hypervisor; ``woke_late``: the loop woke late (its
    own work then counts only past the wake-up).
    The loop's own timer interrupts are not a cause: they are how it wakes."""
    overlaps = {k: v for k, v in overlaps.items() if k != ("vector", "local_timer")}
    foreign = {k: v for k, v in overlaps.items() if k[0] not in ("page fault", "faults")}
    faults = sum(v for k, v in overlaps.items() if k[0] == "page fault")
    task_faults = {name: n for (kind, name), n in overlaps.items() if kind == "faults"}
    figures = {"window_us": window_ns / 1e3, "lateness_us": lateness_ns / 1e3,
               "seen": {f"{k[0]} {k[1]}": round(v / 1e3, 1) for k, v in
                        sorted(foreign.items(), key=lambda kv: -kv[1])[:5]},
               "page_faults": faults, "steal_ms": steal_ms,
               "page_faults_of_tasks": dict(sorted(task_faults.items(), key=lambda kv: -kv[1])[:5]),
               "timer_irq_late_us": None if timer_late_ns is None else timer_late_ns / 1e3,
               "timer_held_by_irqs_us": irq_held_ns / 1e3}
    if (trace_ok and timer_late_ns is not None and timer_late_ns >= 0.5 * lateness_ns and lateness_ns >= 20_000
            and irq_held_ns < 0.5 * timer_late_ns):
        # the loop's wake-up timer interrupt itself came late, and no other interrupt handler held it back.
        # No task can hold off an interrupt (short of running with interrupts masked for that long), so
        # the vCPU was not running: whatever the trace shows on the core then is where the host stopped
        # it, not what delayed the loop
        return "hypervisor", dict(figures, why="the core's timer interrupt came late: the vCPU was not running"
                                  + ("" if steal_ms else " (no steal counted: this host may not report it)"))
    if foreign:
        (kind, name), ns = max(foreign.items(), key=lambda kv: kv[1])
        if ns >= 0.3 * max(lateness_ns, 1) or ns >= 50_000:
            n = task_faults.get(name, 0) if kind == "task" else 0
            if n and n * FAULT_DENSE_NS >= ns:
                # the task that held the core spent its hold faulting pages in (one per <= 10 us of it)
                return f"page faults in task {name}", figures
            return f"{kind} {name}", figures
    if faults:
        return "page fault", figures
    if own_ns > 0 and own_ns >= 0.5 * lateness_ns:
        if typical_ns and own_ns > 5 * typical_ns and own_ns >= 200_000 and in_vm and trace_ok:
            # the loop's cycle has no slow path (no allocation, no I/O, a fixed kernel; its page faults
            # would show): 5x its median and 200 us more, with nothing else on the core, is the host
            # stopping the vCPU mid-cycle. On bare metal that stays unknown (an SMI looks the same)
            return "hypervisor", dict(figures, why=f"the cycle took {own_ns / max(typical_ns, 1):.0f}x its median "
                                                   "with nothing else seen on the core: the vCPU was not running "
                                                   "mid-cycle (a virtual machine)")
        if typical_ns and own_ns > 5 * typical_ns:
            # far longer than the loop's usual cycle, with nothing else on the core: a host stall inside the
            # cycle looks exactly like this (no timer is due mid-cycle to show it), so it is not named
            return "unknown", dict(figures, why=f"the loop held the core for {own_ns / max(typical_ns, 1):.0f}x its "
                                                "median cycle time with nothing else seen: a host stall inside "
                                                "the cycle, or a slow path of its own")
        return "own cycle work", figures
    if steal_ms:
        return "hypervisor", figures
    if trace_ok and in_vm and woke_late and lateness_ns >= 10_000:
        # the loop woke late and nothing the trace sees (no task, no interrupt) held the core. A guest with
        # its most urgent task runnable and nothing else to do loses that time only while the host is not
        # running its vCPU. On bare metal an SMI or an idle-state exit could do it too: there it stays
        # unknown
        if timer_late_ns is None:
            how = ("no timer interrupt in the window: the loop was running (spinning to its tick or probing "
                   "for a frame) and lost the time with nothing else on the core")
        else:
            how = (f"the loop's timer interrupt came {timer_late_ns / 1e3:.0f} us after it was due, then nothing ran "
                   "on the core until the loop did")
        return "hypervisor", dict(figures, why=how + ": the vCPU was not running (a virtual machine)")
    if not trace_ok:
        return "unknown", dict(figures, why="no trace of what ran on the core")
    return "unknown", dict(figures, why="nothing ran on the core and no interrupt came, but no steal was "
                                        "counted (steal is in 10 ms units)")


def sleep_lead_ns(spin_ns: int, phase_margin_ns: int = 0) -> int:
    """How long before its tick the loop's last sleep ends: it spins ``spin_ns`` to the tick, and with phase
    lock it first spins to its probe ``phase_margin_ns`` before the tick. From then on the loop holds the
    core (spinning leaves no trace), so a late wake-up's window starts there."""
    return int(spin_ns) + int(phase_margin_ns)


def _account(rows, totals, late_ns, cyc, wake, ct, tick, flags, i, period_ns, deadline_ns, cause, fig):
    """Add ring cycle ``i``'s row with its cause; count its miss (with the ticks the loop skipped after it
    to catch up, each a miss the loop counted) and its late time under that cause."""
    is_miss = bool(flags[i] & 1)
    skipped = max(0, int(round((int(tick[i + 1]) - int(tick[i])) / period_ns)) - 1) if i + 1 < tick.size else 0
    rows.append({"cycle": int(cyc[i]), "miss": is_miss, "wake_latency_ns": int(wake[i]),
                 "cycle_time_ns": int(ct[i]), "ticks_skipped_after": skipped, "cause": cause, **fig})
    w = max(int(wake[i]), 0)
    late_ns[cause] = late_ns.get(cause, 0) + max(w + int(ct[i]) - deadline_ns, w)
    if is_miss:
        totals[cause] = totals.get(cause, 0) + 1 + skipped


def attribute(recorder: Recorder | None, arrays: dict, period_ns: int, deadline_ns: int, lead_ns: int,
              worst: int = 20, max_events: int = 1000) -> dict:
    """summary.json ``why_late``: each deadline miss (up to ``max_events``) and the ``worst`` wake-ups of
    the ring, with a cause; totals by cause (misses weighted with the ticks skipped before them).
    ``lead_ns``: :func:`sleep_lead_ns`."""
    if recorder is None:
        return {"enabled": False, "detail": "off ([diagnostics] attribution = false)"}
    ev = recorder.evidence
    trace_ok = bool((ev.get("trace") or {}).get("granted"))
    in_vm = bool((ev.get("virtual_machine") or {}).get("vm"))
    intervals = recorder.all_intervals()
    steal = recorder.all_steal()
    if intervals:
        starts = np.fromiter((iv[2] for iv in intervals), dtype=np.int64, count=len(intervals))
        order = np.argsort(starts, kind="stable")
        intervals = [intervals[i] for i in order]
        starts = starts[order]
        ends = np.maximum.accumulate(np.fromiter((iv[3] for iv in intervals), dtype=np.int64,
                                                 count=len(intervals)))
    cyc, flags = arrays["cycle"], arrays["flags"]
    tick, wake, ct = arrays["t_tick_ns"], arrays["wake_latency_ns"], arrays["cycle_time_ns"]
    miss_idx = np.flatnonzero(flags & 1)[:max_events]
    infer = (flags & 64) != 0
    typical = float(np.median(ct[infer])) if infer.any() else (float(np.median(ct)) if ct.size else None)
    # the worst wake-ups worth explaining: later than 10 us and 1 % of a period
    floor = max(10_000, period_ns // 100)
    wake_idx = [int(k) for k in np.argsort(np.where(wake >= 0, wake, -1))[::-1][:worst] if wake[k] >= floor]
    rows, totals, total_misses, late_ns = [], {}, 0, {}
    cause_at = {}                         # ring index -> (cause, cycle) of the cycles explained so far
    for i in sorted(set(miss_idx.tolist()) | set(wake_idx)):
        w, c, tk = max(int(wake[i]), 0), int(ct[i]), int(tick[i])
        prev_end = int(tick[i - 1]) + max(int(wake[i - 1]), 0) + int(ct[i - 1]) if i else None
        if w >= floor and prev_end is not None and prev_end > tk - lead_ns and (i - 1) in cause_at:
            # the previous cycle ended after this one's sleep should have ended: the loop never slept,
            # and this cycle is late because that one was. Same cause, said so
            cause = cause_at[i - 1][0]
            fig = {"window_us": (tk + w + c - prev_end) / 1e3, "lateness_us": max(w + c - deadline_ns, w) / 1e3,
                   "seen": {}, "page_faults": 0, "steal_ms": None, "page_faults_of_tasks": {},
                   "timer_irq_late_us": None, "timer_held_by_irqs_us": 0.0, "carried_from_cycle": cause_at[i - 1][1],
                   "why": f"the previous cycle ended {(prev_end - tk) / 1e3:.0f} us after this one's tick: its "
                          "lateness carried over"}
            _account(rows, totals, late_ns, cyc, wake, ct, tick, flags, i, period_ns, deadline_ns, cause, fig)
            total_misses += rows[-1]["miss"] * (1 + rows[-1]["ticks_skipped_after"])
            cause_at[i] = (cause, int(cyc[i]))
            continue
        # where the loop lost time: waking (from its last timer being due to its wake-up), when it woke
        # late, and working (wake-up -> publish); before its timer was due it slept, and whatever ran
        # then delayed nothing
        woke_late = w >= floor
        t0 = tk - lead_ns if woke_late else tk + w
        t1 = tk + w + c
        late = max(w + c - deadline_ns, w)
        if intervals:
            lo = int(np.searchsorted(ends, t0, side="left"))
            hi = int(np.searchsorted(starts, t1, side="right"))
            near = intervals[lo:hi]
            ov = _overlaps(near, t0, t1)
            timers = [iv[2] for iv in near if iv[0] == "vector" and iv[1] == "local_timer" and t0 <= iv[2] <= t1]
            timer_late = (min(timers) - t0) if (timers and woke_late) else None
            # another interrupt's handler runs with interrupts off: it alone can hold the timer's back
            irq_held = 0 if timer_late is None else sum(
                v for k, v in _overlaps(near, t0, t0 + timer_late).items()
                if k[0] in ("irq", "vector") and k != ("vector", "local_timer"))
            in_work = sum(v for k, v in _overlaps(near, tk + w, t1).items()
                          if k[0] not in ("page fault", "faults") and k != ("vector", "local_timer"))
        else:
            ov, timer_late, in_work, irq_held = {}, None, 0, 0
        # the cycle's own work: its time from wake-up to publish that nothing else took (a cycle that
        # woke late and then worked long is late mostly by its own work when that is the larger part)
        own = max(0, c - in_work)
        # steal is accounted at the next scheduler tick and sampled every 5 ms, in 10 ms units: look a
        # little past the window
        sm = _steal_ms(steal, t0 - 5_000_000, t1 + 10_000_000)
        cause, fig = classify(t1 - t0, late, ov, sm, trace_ok, own,
                              timer_late, typical, irq_held, in_vm, woke_late)
        _account(rows, totals, late_ns, cyc, wake, ct, tick, flags, i, period_ns, deadline_ns, cause, fig)
        total_misses += rows[-1]["miss"] * (1 + rows[-1]["ticks_skipped_after"])
        cause_at[i] = (cause, int(cyc[i]))
    by_cause = dict(sorted(totals.items(), key=lambda kv: -kv[1]))
    text = (f"{total_misses} misses: " + ", ".join(f"{n} {c}" for c, n in by_cause.items())) if total_misses \
        else "no deadline miss in the ring"
    if late_ns and sum(late_ns.values()):
        text += f"; {100 * (1 - late_ns.get('unknown', 0) / sum(late_ns.values())):.0f}% of the late time has a named cause"
    total_late = sum(late_ns.values())
    named = total_late - late_ns.get("unknown", 0)
    return {"enabled": True, "evidence": ev, "events": rows, "misses_by_cause": by_cause,
            # of the time the explained cycles spent late, how much went to each cause, and the named share
            "late_us_by_cause": {c: v / 1e3 for c, v in sorted(late_ns.items(), key=lambda kv: -kv[1])},
            "late_time_named_share": (named / total_late) if total_late else None,
            "misses_attributed": total_misses, "text": text,
            "method": "per late cycle, the window [end of the loop's last sleep (tick - spin - phase-lock "
                      "margin), published] of the loop's core: time other tasks, interrupts and softirqs held it "
                      "(tracefs), page faults, steal growth (/proc/stat), how late the core's timer interrupt "
                      "came; a cycle that could not sleep because the previous one ended late takes that one's "
                      "cause; a miss counts with the ticks the loop skipped after it"}
