"""Shared helpers for ``control-node bench``: machine description, timing, tables, JSON.

Every benchmark records the machine and its own settings next to the numbers, so a
figure quoted in docs/benchmarks.md can always be traced back to where it was measured.
Run benchmarks one at a time (``flock /tmp/control-node-bench.lock control-node bench ...``):
on a 2-core machine two concurrent benchmarks measure each other.
"""
from __future__ import annotations

import datetime as _dt
import gc
import itertools
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

LOCK_FILE = "/tmp/control-node-bench.lock"


# ---- machine ------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _git_commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    """CPU, kernel, Python and library versions, BLAS threading: what the numbers depend on."""
    info = {
        "cpu": _cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "numpy": np.__version__,
        "cpufreq_governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "virtualised": "hypervisor" in (_read("/proc/cpuinfo") or ""),
        "git_commit": _git_commit(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    try:
        import sklearn
        info["scikit_learn"] = sklearn.__version__
    except ImportError:
        pass
    try:
        from control_node.kernels._policy import Policy as _P
        from control_node.kernels.model_file import ModelSpec
        spec = ModelSpec(layers=[(np.zeros((1, 1)), np.zeros(1))], mean=[0.0], scale=[1.0],
                         classes=["a"], feature_names=["x"])
        info["kernel_isa"] = _P(spec).isa
        info["kernel_build_native"] = info["kernel_isa"] == "native"   # CONTROL_NODE_NATIVE=1 build
    except Exception as e:  # a benchmark of something else may still run
        info["kernel_isa"] = f"unavailable ({e})"
    try:
        from threadpoolctl import threadpool_info
        info["blas"] = [{k: v for k, v in d.items() if k in ("user_api", "internal_api", "version",
                                                            "num_threads", "architecture", "filepath")}
                        for d in threadpool_info()]
    except ImportError:
        info["blas"] = "threadpoolctl not installed"
    return info


def machine_lines(info: dict) -> list[str]:
    blas = info.get("blas")
    if isinstance(blas, list):
        blas = ", ".join(f"{d.get('internal_api')} {d.get('version')} ({d.get('num_threads')} threads, "
                         f"{d.get('architecture')})" for d in blas) or "none loaded"
    return [
        f"CPU: {info['cpu']}, {info['cores_usable']} usable cores"
        + (" (virtualised)" if info.get("virtualised") else "")
        + (f", governor {info['cpufreq_governor']}" if info.get("cpufreq_governor") else ""),
        f"OS: {info['kernel']}; {info['python']}; numpy {info['numpy']}; "
        f"scikit-learn {info.get('scikit_learn', '-')}",
        f"kernel ISA: {info.get('kernel_isa')}"
        + (" (CONTROL_NODE_NATIVE build)" if info.get("kernel_build_native") else " (portable build)"),
        f"BLAS: {blas}",
        f"git {info.get('git_commit')}, {info.get('date_utc')}",
    ]


# ---- timing -------------------------------------------------------------------------
def loop_calls(fn, arg, k):
    """A zero-argument timer body: ``k`` calls of ``fn(arg)`` (or ``fn()`` when ``arg`` is None)."""
    rep = itertools.repeat
    if arg is None:
        def body():
            for _ in rep(None, k):
                fn()
    else:
        def body():
            for _ in rep(None, k):
                fn(arg)
    return body


def calibrate(fn, arg, target_s, max_calls=1000):
    """Calls per timing sample so that one sample lasts about ``target_s`` (1 .. max_calls)."""
    body = loop_calls(fn, arg, 1)
    body()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < min(0.02, target_s * 5) or n < 3:
        body()
        n += 1
    per_call = (time.perf_counter() - t0) / n
    return int(max(1, min(max_calls, round(target_s / per_call))))


def time_round_robin(bodies: dict, n_samples: int, warm: dict | None = None, per_row: bool = False) -> dict:
    """Time each body ``n_samples`` times, interleaved (A B C A B C ...) so drift hits all alike.

    ``bodies`` maps name -> (body, units): ``units`` is how many calls/samples one body run
    covers. ``warm`` maps a name to a zero-argument call run untimed just before each of its samples:
    interleaving evicts a row's weights from L2 when the rows together exceed it, and a sample of a few
    calls would then time the cold first call; a loop running one policy every cycle finds them warm.
    Returns name -> array of ns per unit, one entry per sample. GC is off while timing.

    ``per_row``: all of a row's samples, then the next row's (warm, per row): where the rows' weights together
    exceed a cache level, interleaving has each row read the next one's weights back from further out (a
    beyond-L2 shape's ``act_into`` read 2x slower than its ``act`` in the same interleaved run); a robot's loop
    runs one policy, so its weights stay where one policy's fit.
    """
    warm = warm or {}
    out = {name: np.empty(n_samples) for name in bodies}
    clock = time.perf_counter_ns
    for body, _ in bodies.values():   # warm up
        body()
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        order = ([(s, name) for name in bodies for s in range(n_samples)] if per_row else
                 [(s, name) for s in range(n_samples) for name in bodies])
        for s, name in order:
            body, units = bodies[name]
            if name in warm:
                warm[name]()
            t0 = clock()
            body()
            out[name][s] = (clock() - t0) / units
    finally:
        if was_enabled:
            gc.enable()
    return out


def summary(samples) -> dict:
    a = np.asarray(samples, dtype=np.float64)
    return {"median_ns": float(np.median(a)), "p99_ns": float(np.percentile(a, 99)),
            "min_ns": float(a.min()), "n_samples": int(a.size)}


def fmt_ns(ns: float) -> str:
    if ns is None or not np.isfinite(ns):
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e4:
        return f"{ns / 1e3:.1f} µs"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.1f} ns"


# ---- output -------------------------------------------------------------------------
def console():
    try:
        from rich.console import Console
        return Console(width=max(110, min(160, os.get_terminal_size().columns if sys.stdout.isatty() else 130)))
    except ImportError:
        return None


def print_table(title, columns, rows, con=None):
    """A rich table (plain text fallback). ``rows`` are lists of already formatted strings."""
    con = con or console()
    if con is not None:
        from rich.table import Table
        t = Table(title=title, title_justify="left")
        for i, c in enumerate(columns):
            t.add_column(c, justify="left" if i == 0 else "right")
        for r in rows:
            t.add_row(*r)
        con.print(t)
        return
    print(title)
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))


def markdown_table(columns, rows) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" if i == 0 else "---:"
                                                               for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def save_raw(name: str, raw: dict) -> str:
    """Write a benchmark's raw arrays to bench/results/raw/NAME-<stamp>.npz; returns the path."""
    os.makedirs(os.path.join("bench", "results", "raw"), exist_ok=True)
    path = os.path.join("bench", "results", "raw", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.npz")
    np.savez_compressed(path, **raw)
    print(f"raw data: {path}")
    return path


def write_json(path, payload):
    def default(o):
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        return str(o)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=default)
        f.write("\n")


STREAM_ROW = "weights read once in order, C loop (measured memory floor)"


def weights_read_row(weight_bytes: int, isa: str | None = None):
    """A ``(name, fn, arg)`` row that reads ``weight_bytes`` (rounded up to 512) once, in order, at C level
    (``mlp_stream_read``, the kernels' prefetch distance, the vectors of the kernel copy ``isa`` names, as for
    ``Policy``; default the widest): the memory floor measured on this machine, timed in the same round-robin
    as the kernel, so under the same cache conditions."""
    import functools

    from control_node.kernels._policy import _stream_read, stream_read_code
    fn = _stream_read if isa is None else functools.partial(_stream_read, want=stream_read_code(isa))
    n = -(-int(weight_bytes) // 512) * 128
    raw = np.zeros(n * 4 + 64, dtype=np.uint8)
    off = (-raw.ctypes.data) % 64
    buf = raw[off:off + n * 4].view(np.float32)
    buf[:] = 1e-3
    return STREAM_ROW, fn, buf

