"""Core isolation for one run: other threads, movable kernel threads and IRQs off the loop's core, and back.

``[realtime] isolate = true``: before the loop starts, :func:`isolate` moves every thread of every other
process whose affinity includes the loop's core onto the remaining cores (``sched_setaffinity``), does
the same for kernel threads the kernel lets move (per-CPU ones refuse: counted, with the reason), and
writes each IRQ's ``/proc/irq/N/smp_affinity_list`` without the core. What it changed is written first
to a restore file (``<runtime dir>/isolation-PID.json``), so that a node killed before it could undo it
leaves the way back: ``control-node doctor --restore``. :meth:`Isolation.restore` undoes it after the
run (also after SIGTERM, which ends the run normally), checking each thread is still the one it moved
(its start time), then deletes the file. Without privileges nothing moves and the report says "not
granted", like the other real-time features.
"""
from __future__ import annotations

import json
import os
import time

from control_node.procfs import Procfs, format_cpulist

_FS = Procfs()


def _start_time(tid: int):
    """Field 22 of /proc/TID/stat (start time in clock ticks): tells a thread from a later one that
    reused its id. None when it is gone."""
    st, _ = _FS.task(tid)
    return st.start_time if st is not None else None


def restore_file(runtime_dir: str, pid: int | None = None) -> str:
    return os.path.join(runtime_dir, f"isolation-{pid or os.getpid()}.json")


class Isolation:
    """What :func:`isolate` changed; :meth:`restore` undoes it."""

    def __init__(self, cpu: int, path: str):
        self.cpu, self.path = cpu, path
        self.threads = []            # [tid, comm, old cpu list, start time]
        self.irqs = []               # [irq, old list]
        self.refused_threads = []    # [tid, comm, reason]
        self.refused_irqs = []       # [irq, reason]
        self.kernel_threads_moved = 0
        self.restored = None

    def _save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "cpu": self.cpu, "threads": self.threads, "irqs": self.irqs,
                       "written": time.time()}, f)
        os.replace(tmp, self.path)

    def report(self) -> dict:
        moved = len(self.threads)
        granted = moved > 0 or bool(self.irqs)
        detail = (f"core {self.cpu}: {moved} threads moved off ({self.kernel_threads_moved} kernel threads), "
                  f"{len(self.refused_threads)} could not move; {len(self.irqs)} IRQs moved, "
                  f"{len(self.refused_irqs)} could not")
        if not granted:
            detail = f"not granted: nothing could be moved off core {self.cpu} (needs root or CAP_SYS_NICE)"
        return {"requested": True, "granted": granted, "detail": detail, "core": self.cpu,
                "threads_moved": moved, "kernel_threads_moved": self.kernel_threads_moved,
                "threads_refused": [{"tid": t, "comm": c, "reason": r} for t, c, r in self.refused_threads[:50]],
                "threads_refused_count": len(self.refused_threads),
                "irqs_moved": [i for i, _ in self.irqs],
                "irqs_refused": [{"irq": i, "reason": r} for i, r in self.refused_irqs[:50]],
                "restore_file": self.path, "restored": self.restored}

    def restore(self) -> dict:
        """Put every moved thread (still alive and the same) and IRQ back; delete the restore file."""
        self.restored = restore_changes(self.threads, self.irqs)
        try:
            os.unlink(self.path)
        except OSError:
            pass
        return self.restored


def restore_changes(threads, irqs) -> dict:
    back = gone = failed = 0
    for tid, _comm_, old, start in threads:
        if _start_time(tid) != start:
            gone += 1                 # exited (or its id was reused): nothing to give back
            continue
        try:
            os.sched_setaffinity(tid, set(old))
            back += 1
        except OSError:
            failed += 1
    irq_back = irq_failed = 0
    for irq, old in irqs:
        try:
            with open(f"/proc/irq/{irq}/smp_affinity_list", "w") as f:
                f.write(old)
            irq_back += 1
        except OSError:
            irq_failed += 1
    return {"threads_restored": back, "threads_gone": gone, "threads_failed": failed, "irqs_restored": irq_back,
            "irqs_failed": irq_failed}


def isolate(cpu: int, runtime_dir: str, keep=()) -> Isolation:
    """Move other threads and IRQs off ``cpu`` (see the module doc). ``keep``: thread ids left alone (this
    process's own, which the node places itself)."""
    os.makedirs(runtime_dir, mode=0o700, exist_ok=True)
    iso = Isolation(cpu, restore_file(runtime_dir))
    own = os.getpid()
    keep = set(keep)
    for pid in _FS.pids():
        if pid == own:
            continue
        try:
            tids = _FS.tids(pid)
        except OSError:
            continue
        st, _ = _FS.task(pid)
        kthread = st is None or st.kthread          # no stat: gone, or a kernel thread we may not read
        for tid in tids:
            if tid in keep:
                continue
            try:
                mask = os.sched_getaffinity(tid)
            except OSError:
                continue
            if cpu not in mask:
                continue
            rest = mask - {cpu}
            if not rest:
                iso.refused_threads.append([tid, _FS.comm(tid), f"allowed only on core {cpu}"])
                continue
            start = _start_time(tid)
            try:
                os.sched_setaffinity(tid, rest)
            except OSError as e:
                iso.refused_threads.append([tid, _FS.comm(tid), e.strerror or str(e)])
                continue
            iso.threads.append([tid, _FS.comm(tid), sorted(mask), start])
            iso.kernel_threads_moved += kthread
        if len(iso.threads) % 64 == 0:
            iso._save()
    for irq in _FS.irqs():
        path = _FS.path(f"/proc/irq/{irq}/smp_affinity_list")
        cpus, _ = _FS.irq_affinity(irq)
        if cpus is None or cpu not in cpus:
            continue
        old = format_cpulist(cpus)                  # what restore writes back (the kernel's own format)
        rest = cpus - {cpu} or (set(os.sched_getaffinity(0)) - {cpu})
        if not rest:
            iso.refused_irqs.append([irq, f"no other core to move it to ({old})"])
            continue
        try:
            with open(path, "w") as f:
                f.write(format_cpulist(rest))
            iso.irqs.append([irq, old])
            iso._save()
        except OSError as e:
            iso.refused_irqs.append([irq, e.strerror or str(e)])
    iso._save()
    return iso


def restore_leftovers(runtime_dir: str) -> list[dict]:
    """Undo what nodes that died before restoring left in their restore files (``doctor --restore``):
    one result per file; files of nodes still running are left alone."""
    out = []
    try:
        names = sorted(os.listdir(runtime_dir))
    except OSError:
        return out
    for name in names:
        if not (name.startswith("isolation-") and name.endswith(".json")):
            continue
        path = os.path.join(runtime_dir, name)
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            out.append({"file": path, "error": f"unreadable: {e}"})
            continue
        pid = int(data.get("pid", 0))
        try:
            os.kill(pid, 0)
            out.append({"file": path, "pid": pid, "skipped": "the node is still running"})
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            out.append({"file": path, "pid": pid, "skipped": "the node is running as another user"})
            continue
        res = restore_changes(data.get("threads", []), data.get("irqs", []))
        os.unlink(path)
        out.append({"file": path, "pid": pid, "core": data.get("cpu"), **res})
    return out
