"""The floor of this core, measured on the spot: what reading weights from each cache level and what
multiply-adding cost here, for ``bench policy`` / ``bench recurrent``'s floor column.

A shape's floor is max(compute, memory): its multiply-adds at the rate this core sustains, and its weight
bytes at the read rate of the cache level they fit in. The vendors' figures (``bench/policy.py``'s FLOORS)
cover a few CPU families at their nominal clock; the measured floor covers any CPU, at the clock it runs:

* clock: a chain of dependent register adds (one per cycle on every x86-64 and AArch64 core), adds per ns
* memory: for each cache level in /sys (L1d, L2, L3) and DRAM, a buffer sized to sit in it (half of L1d;
  half of L2; 4x L2 but at most half of L3; 2x L3, at least 64 MiB), read once per pass in order with the
  widest vectors the kernels use (8 independent accumulators, the kernels' software prefetch over 256 KiB),
  timed in C: bytes per ns, and bytes per cycle at the measured clock
* compute: ``CHAINS`` independent multiply-add chains on those vectors (enough to keep two FMA pipes of
  4-5 cycles latency busy), float32 and float64: multiply-adds (FMAs) per ns, and per cycle

Every figure is taken over 3 rounds of samples (~50 us each, each level in turn, so a slow moment of the
host lands on all alike); the figure is the samples' 10th percentile (the rate undisturbed: the minimum
would chase one lucky sample, the median the host's stalls), its spread p90 / p10 of the sample times.
``measure()`` is cached: one measurement per process (a bench invocation), about a second.
"""
from __future__ import annotations

import functools
import mmap
import os
import time

import numpy as np

LEVELS = ("L1", "L2", "L3", "DRAM")
PERCENTILE = 10
ROUNDS = 3
SAMPLE_NS = 50_000                 # each timed sample lasts about this long
DRAM_MIN_BYTES = 64 << 20
# A last cache over half of this (a VM's reported 480 MiB L3, a 1 GiB-L3 server part) is not read past: no
# policy this node runs at 1 kHz has weights beyond it, and touching twice that cost 2-14 s of system time on
# a 2-vCPU VM, per process that measures.
DRAM_MAX_BYTES = 256 << 20
SAMPLES_PER_ROUND = {"L1": 20, "L2": 20, "L3": 20, "DRAM": 4, "fma": 20, "clock": 20, "widen": 10}
METHOD = ("timed in C on this core: a streaming read of a buffer sized to each cache level (widest vectors, "
          "8 accumulators), independent multiply-add chains, the same on f16 / bf16 / int8 weights widened as the "
          "kernels widen them (each vector copy that has the loop; the fastest counts), and a dependent-add chain "
          "for the clock; "
          f"p{PERCENTILE} of {ROUNDS} rounds of ~{SAMPLE_NS // 1000} us samples, spread p90 / p{PERCENTILE}")


class FloorProbeError(RuntimeError):
    """The probe cannot run here (no compiled probe in this install, or an ISA the CPU lacks)."""


# ---- what this machine says about itself ---------------------------------------------------------
def cache_sizes() -> dict:
    """Data (or unified) cache sizes of cpu0 by level, bytes: {"L1": ..., "L2": ..., "L3": ...}."""
    out = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    for idx in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            level = open(f"{base}/{idx}/level").read().strip()
            kind = open(f"{base}/{idx}/type").read().strip()
            size = open(f"{base}/{idx}/size").read().strip()
        except OSError:
            continue
        if kind in ("Data", "Unified"):
            mult = {"K": 1024, "M": 1024 ** 2}.get(size[-1], 1)
            out[f"L{level}"] = int(size.rstrip("KM")) * mult
    return out


def clock_hz() -> float:
    """The clock /proc/cpuinfo states (nominal: a guest cannot see the boost clock); NaN if none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":")[1]) * 1e6
    except OSError:
        pass
    return float("nan")


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _probe():
    try:
        from control_node.bench import _floor_probe
    except ImportError as e:
        raise FloorProbeError(f"the floor probe is not built in this install ({e}); rebuild: "
                              "pip install -e . --no-deps --no-build-isolation") from None
    return _floor_probe


def default_isa() -> str:
    """The vector copy the kernels take for large policies: the widest this CPU runs."""
    return _probe().supported()[0]


def level_buffers(caches: dict, mem_available: int | None = None) -> tuple[dict, dict]:
    """(level -> buffer bytes, level -> why not measured): a buffer that sits in each level, rounded down to
    512 bytes (the read's step)."""
    sizes, skipped = {}, {}
    l1, l2, l3 = caches.get("L1", 0), caches.get("L2", 0), caches.get("L3", 0)
    if l1:
        sizes["L1"] = l1 // 2
    if l2 > l1:         # half of it, past L1 (twice L1) where it can be, else between the two
        sizes["L2"] = l2 // 2 if l2 // 2 >= 2 * l1 else (l1 + l2) // 2
    if l3 > l2:         # 4x L2 (the size of the policies that spill L2), at most half of L3
        sizes["L3"] = min(4 * l2, l3 // 2) if l3 // 2 >= 2 * l2 else (l2 + l3) // 2
    last = l3 or l2 or l1
    if last:
        want = max(2 * last, DRAM_MIN_BYTES)
        cap = min(DRAM_MAX_BYTES, mem_available // 4 if mem_available else DRAM_MAX_BYTES)
        if want <= cap:
            sizes["DRAM"] = want
        else:
            limit = f"{DRAM_MAX_BYTES >> 20} MiB" if cap == DRAM_MAX_BYTES else "a quarter of the free memory"
            skipped["DRAM"] = f"a buffer past the last cache ({want >> 20} MiB) is more than {limit}"
    for lv in LEVELS:
        if lv not in sizes and lv not in skipped:
            skipped[lv] = "no such cache level in /sys/devices/system/cpu/cpu0/cache"
    return {lv: b // 512 * 512 for lv, b in sizes.items()}, skipped


def level_of(weight_bytes: int, caches: dict) -> str:
    """The level weights of this many bytes are read from: the smallest cache they fit, else DRAM."""
    return next((lv for lv in ("L1", "L2", "L3") if weight_bytes <= caches.get(lv, 0)), "DRAM")


# ---- the measurement -------------------------------------------------------------------------------
def _figure(ns: np.ndarray) -> tuple[float, float]:
    """(the figure's time: p10, spread: p90 / p10) of sample times."""
    lo = float(np.percentile(ns, PERCENTILE))
    return lo, float(np.percentile(ns, 90)) / lo


def _aligned_floats(nbytes: int) -> np.ndarray:
    """``nbytes`` of float32, page-aligned and resident. An anonymous map asked for huge pages: touching 256 MiB
    4 KiB page by page cost 2.8 s on a 2-vCPU VM, 0.05 s with huge pages; fewer TLB misses also keep the
    figure a floor."""
    m = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):       # no huge pages in this Python or kernel (EINVAL): 4 KiB pages then
        pass
    buf = np.frombuffer(m, dtype=np.float32, count=nbytes // 4)     # holds the map; unmapped with the array
    buf.fill(1e-3)            # touched: every page is resident before a pass is timed
    return buf


@functools.lru_cache(maxsize=None)
def measure(isa: str | None = None) -> dict:
    """The measured floor of this core with ``isa``'s vectors (default: the kernels' choice, ``default_isa``);
    the narrow storages' widening rates (``compute`` f16 / bf16 / int8) from whichever copy is fastest, since the
    kernels run that one (``copy`` says which), whatever ``isa``.

    Returns a dict (units in the keys): ``isa``, ``vector_bytes``, ``chains``; ``clock`` {ghz, spread,
    nominal_ghz}; ``memory`` {level: {buffer_bytes, bytes_per_ns, bytes_per_cycle, spread, samples}};
    ``compute`` {float32 / float64: {fmas_per_ns, fmas_per_cycle, lanes, spread, samples}}; ``skipped``
    {level: why}; ``caches`` (bytes); ``percentile``; ``seconds`` (the measurement's own time); ``method``.
    Cached: one measurement per process and ISA. Raises FloorProbeError if the probe cannot run.
    """
    probe = _probe()
    isa = isa or default_isa()
    if isa not in probe.ISAS:
        raise FloorProbeError(f"isa: {isa!r} is not one of {', '.join(probe.ISAS)}")
    if isa not in probe.supported():
        raise FloorProbeError(f"isa: this CPU does not run the {isa} copy (it runs: {', '.join(probe.supported())})")
    t_start = time.perf_counter()
    caches = cache_sizes()
    buffers, skipped = level_buffers(caches, _mem_available())
    vbytes = probe.vector_bytes(isa)
    big = _aligned_floats(max(buffers.values())) if buffers else None

    # size each sample to ~SAMPLE_NS from a first short timing
    add_iters = max(1, int(SAMPLE_NS / (16 * float(np.min(probe.add_chain_ns(1000, 3))))))
    fma_iters = {dt: max(1, int(SAMPLE_NS / float(np.min(probe.fma_ns(isa, dt, 1000, 3)))))
                 for dt in ("float32", "float64")}
    passes = {lv: max(1, int(SAMPLE_NS / float(np.min(probe.read_ns(big[:b // 4], isa, 1, 2)))))
              for lv, b in buffers.items()}

    # narrow weights: the widening multiply-add loop of every copy that has one (the kernels run the fastest
    # copy, chosen by measurement: on Zen 4 the AVX2 copy's VCVTPH2PS ymm outruns the AVX-512 one's zmm)
    widen_iters = {}
    for c in probe.supported():
        for st in probe.WIDEN:
            t = float(np.min(probe.widen_ns(c, st, 10, 3)))
            if t > 0:
                widen_iters[(c, st)] = max(1, int(SAMPLE_NS / (t * probe.WIDEN_VALUES * 4 / probe.vector_bytes(c))))
    clock, fma, read = [], {dt: [] for dt in fma_iters}, {lv: [] for lv in buffers}
    widen = {k: [] for k in widen_iters}
    for _ in range(ROUNDS):
        clock.append(probe.add_chain_ns(add_iters, SAMPLES_PER_ROUND["clock"]))
        for dt, it in fma_iters.items():
            fma[dt].append(probe.fma_ns(isa, dt, it, SAMPLES_PER_ROUND["fma"]))
        for (c, st), it in widen_iters.items():
            widen[(c, st)].append(probe.widen_ns(c, st, it, SAMPLES_PER_ROUND["widen"]))
        for lv, b in buffers.items():
            read[lv].append(probe.read_ns(big[:b // 4], isa, passes[lv], SAMPLES_PER_ROUND[lv]))
    del big

    ns_per_add, clock_spread = _figure(np.concatenate(clock))
    ghz = 1 / ns_per_add
    memory = {}
    for lv, b in buffers.items():
        t, spread = _figure(np.concatenate(read[lv]))
        memory[lv] = {"buffer_bytes": b, "bytes_per_ns": b / t, "bytes_per_cycle": b / t / ghz, "spread": spread,
                      "samples": ROUNDS * SAMPLES_PER_ROUND[lv], "passes_per_sample": passes[lv]}
    compute = {}
    for dt in fma:
        t, spread = _figure(np.concatenate(fma[dt]))
        lanes = vbytes // np.dtype(dt).itemsize
        rate = probe.CHAINS * lanes / t
        compute[dt] = {"fmas_per_ns": rate, "fmas_per_cycle": rate / ghz, "lanes": lanes, "spread": spread,
                       "samples": ROUNDS * SAMPLES_PER_ROUND["fma"]}
    for (c, st), ts in widen.items():
        t, spread = _figure(np.concatenate(ts))
        lanes = probe.vector_bytes(c) // 4
        rate = lanes / t
        if st not in compute or rate > compute[st]["fmas_per_ns"]:
            compute[st] = {"fmas_per_ns": rate, "fmas_per_cycle": rate / ghz, "lanes": lanes, "spread": spread,
                           "samples": ROUNDS * SAMPLES_PER_ROUND["widen"], "copy": c,
                           "widened": f"float32 multiply-adds on {st} weights widened in registers"}
    nominal = clock_hz()
    return {"isa": isa, "vector_bytes": vbytes, "chains": probe.CHAINS,
            "clock": {"ghz": ghz, "spread": clock_spread, "nominal_ghz": nominal / 1e9 if nominal == nominal else None,
                      "method": "dependent register adds, one per cycle"},
            "memory": memory, "compute": compute, "skipped": skipped, "caches": caches, "percentile": PERCENTILE,
            "seconds": time.perf_counter() - t_start, "method": METHOD}


def _kib(b: float) -> str:
    return f"{b / 1024 ** 2:.1f} MiB" if b >= 1024 ** 2 else f"{b / 1024:.0f} KiB"


def floor_measured(fmas: int, weight_bytes: int, dtype: str, m: dict | None = None, storage: str | None = None) -> dict:
    """The measured floor of a pass of ``fmas`` multiply-adds in ``dtype`` (float32 / float64: the compute
    dtype) over ``weight_bytes`` of weights: {compute, memory (ns), cache_level, how}. ``m``: a ``measure()``
    result (default: this process's measurement). ``storage`` (f16 / bf16 / int8, float32 compute): the compute
    floor is the widening loop's rate, where the probe measured one (a core whose conversions issue slower
    than its FMAs cannot multiply-add those weights at the float32 rate)."""
    m = m or measure()
    caches = m["caches"]
    level = level_of(weight_bytes, caches)
    used = level if level in m["memory"] else next(
        (lv for lv in reversed(LEVELS[:LEVELS.index(level)]) if lv in m["memory"]), None)
    c = m["compute"][dtype]
    what = f"{dtype} FMAs/ns"
    if storage and dtype == "float32" and storage in m["compute"]:
        c = m["compute"][storage]
        what = f"float32 FMAs/ns on {storage} weights widened ({c['copy']} copy)"
    compute = fmas / c["fmas_per_ns"]
    if used is None:
        memory, mem_how = None, f"{_kib(weight_bytes)} of weights: no level measured ({m['skipped']})"
    else:
        r = m["memory"][used]
        memory = weight_bytes / r["bytes_per_ns"]
        mem_how = (f"{_kib(weight_bytes)} of weights from {level} at {r['bytes_per_ns']:.1f} B/ns "
                   f"({r['bytes_per_cycle']:.1f} B/cycle; {_kib(r['buffer_bytes'])} buffer, spread "
                   f"{r['spread']:.2f})")
        if used != level:
            mem_how += f" (the {used} rate: {level} not measured, {m['skipped'][level]})"
    how = (f"{m['isa']} at {m['clock']['ghz']:.2f} GHz (dependent adds): {fmas} FMAs at "
           f"{c['fmas_per_ns']:.1f} {what} ({c['fmas_per_cycle']:.1f}/cycle, spread {c['spread']:.2f}); "
           f"{mem_how}; each figure the p{m['percentile']} of {c['samples']} timed samples in C (bench/floor.py)")
    return {"compute": compute, "memory": memory, "cache_level": level, "how": how}


def summary_lines(m: dict) -> list[str]:
    """The measurement in a few lines, for the bench's header."""
    clk = m["clock"]
    nominal = f", /proc/cpuinfo {clk['nominal_ghz']:.2f} GHz" if clk.get("nominal_ghz") else ""
    levels = "; ".join(f"{lv} ({_kib(r['buffer_bytes'])}) {r['bytes_per_ns']:.1f} B/ns = {r['bytes_per_cycle']:.1f} "
                       f"B/cycle, spread {r['spread']:.2f}" for lv, r in m["memory"].items())
    fmas = "; ".join(f"{dt} {c['fmas_per_ns']:.1f} FMAs/ns = {c['fmas_per_cycle']:.1f}/cycle ({c['lanes']} lanes x "
                     f"{m['chains']} chains{', ' + c['copy'] + ' copy, widened' if c.get('copy') else ''}), spread "
                     f"{c['spread']:.2f}" for dt, c in m["compute"].items())
    lines = [f"floor measured here ({m['isa']}, {m['seconds']:.1f} s): clock {clk['ghz']:.2f} GHz "
             f"(dependent adds{nominal}), spread {clk['spread']:.2f}",
             f"  read: {levels}", f"  multiply-add: {fmas}", f"  method: {m['method']}"]
    if m["skipped"]:
        lines.append(f"  not measured: {m['skipped']}")
    return lines
