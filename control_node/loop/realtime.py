"""Real-time set-up of the loop thread: each feature is tried, and what the OS granted is reported.

Call :func:`setup_realtime` from the thread that will run the loop: affinity and
SCHED_FIFO apply to the calling thread only (Linux), so threads started later
(diagnostics) can move themselves elsewhere and stay SCHED_OTHER.
"""
from __future__ import annotations

import ctypes
import gc
import os
import struct

MCL_CURRENT, MCL_FUTURE = 1, 2


def _feature(requested, granted, detail):
    return {"requested": requested, "granted": bool(granted), "detail": detail}


class RealtimeSession:
    """Holds what was changed so :meth:`restore` can undo it."""

    def __init__(self):
        self.report = {}
        self._dma_fd = None
        self._gc_was_enabled = gc.isenabled()
        self._old_sched = None
        self._isolation = None

    def restore(self):
        if self._isolation is not None:
            self.report["isolation"]["restored"] = self._isolation.restore()
            self._isolation = None
        if self._dma_fd is not None:
            os.close(self._dma_fd)
            self._dma_fd = None
        if self._old_sched is not None:
            try:
                os.sched_setscheduler(0, self._old_sched[0], os.sched_param(self._old_sched[1]))
            except OSError:
                pass
            self._old_sched = None
        gc.unfreeze()
        if self._gc_was_enabled:
            gc.enable()


def choose_cpu(spec):
    """Core for the loop thread from the config value: int, "last" or "none" (None)."""
    allowed = sorted(os.sched_getaffinity(0))
    if spec == "none":
        return None
    if spec == "last":
        return allowed[-1]
    return int(spec)


def name_thread(name: str) -> None:
    """Name the calling OS thread (PR_SET_NAME, 15 bytes): what ps, top and the kernel's trace show, so
    the node's own helper threads are told apart from other ``python`` tasks in a why-late report."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def leave_core(cpu) -> None:
    """Move the calling thread onto every allowed core but ``cpu`` (the loop's; None: stay). For the
    node's helper threads (diagnostics, lifecycle): start them before the loop pins itself."""
    others = set(os.sched_getaffinity(0)) - ({cpu} if cpu is not None else set())
    if others:
        try:
            os.sched_setaffinity(0, others)
        except OSError:
            pass


def setup_realtime(rt_cfg: dict) -> RealtimeSession:
    s = RealtimeSession()
    r = s.report
    cpu = choose_cpu(rt_cfg["cpu"])
    if cpu is None:
        r["cpu"] = _feature("none", False, "not pinned (realtime.cpu = none)")
    else:
        try:
            os.sched_setaffinity(0, {cpu})
            r["cpu"] = _feature(cpu, True, f"loop thread pinned to core {cpu}")
        except (OSError, ValueError) as e:
            r["cpu"] = _feature(cpu, False, f"refused: {e}")
    r["cpu"]["core"] = cpu
    if rt_cfg.get("isolate"):
        if cpu is None or not r["cpu"]["granted"]:
            r["isolation"] = _feature(True, False, "not granted: the loop is not pinned to a core")
        else:
            from control_node.endpoints import runtime_dir
            from control_node.loop.isolation import isolate
            try:
                s._isolation = isolate(cpu, runtime_dir())
                r["isolation"] = s._isolation.report()
            except OSError as e:
                r["isolation"] = _feature(True, False, f"not granted: {e}")
    else:
        r["isolation"] = _feature(False, False, "off (realtime.isolate = false)")
    if rt_cfg["sched_fifo"]:
        prio = rt_cfg["priority"]
        try:
            old = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
            s._old_sched = old
            r["sched"] = _feature(f"SCHED_FIFO {prio}", True, f"SCHED_FIFO priority {prio}")
        except (OSError, AttributeError) as e:
            r["sched"] = _feature(f"SCHED_FIFO {prio}", False,
                                  f"refused ({e}); running SCHED_OTHER. Grant it with "
                                  "`setcap cap_sys_nice+ep` or an rtprio limit")
    else:
        r["sched"] = _feature(False, False, "SCHED_OTHER (realtime.sched_fifo = false)")
    if rt_cfg["mlockall"]:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mlockall(MCL_CURRENT | MCL_FUTURE) == 0:
            r["mlock"] = _feature(True, True, "mlockall(MCL_CURRENT|MCL_FUTURE)")
        else:
            err = ctypes.get_errno()
            r["mlock"] = _feature(True, False, f"refused: {os.strerror(err)} (raise RLIMIT_MEMLOCK)")
    else:
        r["mlock"] = _feature(False, False, "off (realtime.mlockall = false)")
    if rt_cfg["gc_freeze"]:
        gc.collect()
        gc.freeze()
        gc.disable()
        r["gc"] = _feature(True, True, "collected, frozen and disabled during the loop")
    else:
        r["gc"] = _feature(False, False, "garbage collector left on")
    if rt_cfg["cpu_dma_latency"]:
        try:
            fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
            os.write(fd, struct.pack("i", 0))
            s._dma_fd = fd
            r["cpu_dma_latency"] = _feature(0, True, "held at 0 us while running")
        except OSError as e:
            r["cpu_dma_latency"] = _feature(0, False, f"refused: {e}")
    else:
        r["cpu_dma_latency"] = _feature(False, False, "off (realtime.cpu_dma_latency = false)")
    return s


def rt_summary_line(report: dict) -> str:
    parts = []
    for name in ("cpu", "sched", "mlock", "gc", "cpu_dma_latency", "isolation"):
        f = report.get(name)
        if f:
            parts.append(f"{name}={'yes' if f['granted'] else 'no'}")
    return " ".join(parts)
