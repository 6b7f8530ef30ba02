"""Jitter reports from run directories (``control-node report``).

Loading and validating run dirs, the statistics (percentiles, worst events, verdict), the
machine-readable summary, the terminal tables, the self-contained HTML page and the HdrHistogram
``.hgrm`` percentile-distribution files. Plots live in :mod:`control_node.plots`.

Percentile method: when a node's ring holds every cycle of the run (``ring.complete``) the
percentiles are recomputed from the raw arrays with ``numpy.percentile`` and its default ``linear``
method (type 7 of Hyndman & Fan: linear interpolation between the two nearest order statistics);
otherwise they are taken from ``summary.json`` (the node's streaming histogram, the authority).
Everything is O(n) or O(n log n) numpy; nothing loops over cycles in Python.
"""
from __future__ import annotations

import html
import io
import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from control_node.errors import UserError

FORMAT = 1
PCTS = [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9), ("p9999", 99.99)]
PCT_LABELS = {"p50": "p50", "p90": "p90", "p99": "p99", "p999": "p99.9", "p9999": "p99.99", "max": "max"}
STAT_KEYS = [k for k, _ in PCTS] + ["max"]

# metric name -> (summary.json key, cycles.npz array, title)
NODE_METRICS = [
    ("wake_latency_ns", "wake_latency_ns", "wake_latency_ns", "wake-up latency"),
    ("recv_ns", "recv_ns", "recv_ns", "recv phase"),
    ("infer_ns", "infer_ns", "infer_ns", "infer phase"),
    ("publish_ns", "publish_ns", "publish_ns", "publish phase"),
    ("cycle_time_ns", "cycle_time_ns", "cycle_time_ns", "cycle time"),
    ("period_ns", "period_ns_stats", "period_ns", "period"),
    ("input_age_ns", "input_age_ns", "input_age_ns", "input age"),
]
SIM_METRICS = [("round_trip_ns", "round_trip_ns", "rtt_ns", "sim round trip")]
METRIC_TITLES = {m[0]: m[3] for m in NODE_METRICS + SIM_METRICS}

CYCLE_ARRAYS = {"cycle": "i", "t_tick_ns": "i", "wake_latency_ns": "i", "recv_ns": "i", "infer_ns": "i",
                "publish_ns": "i", "cycle_time_ns": "i", "period_ns": "i", "input_age_ns": "i",
                "flags": "u", "action": "i", "seq": "i"}
SIM_ARRAYS = {"seq": "i", "t_send_ns": "i", "t_action_ns": "i", "rtt_ns": "i", "truth": "i", "action": "i",
              "safe": "b"}

# counters some nodes add beyond the spec; shown when present
EXTRA_COUNTERS = [("skipped_ticks", "skipped ticks"), ("send_failures", "send failures"),
                  ("recv_errors", "receive errors")]
FLAG_MISS, FLAG_STALE, FLAG_REJECT, FLAG_SAFE, FLAG_NEW = 1, 2, 4, 8, 16
NODE_REQUIRED = ["run_id", "rate_hz", "period_ns", "cycles", "ring"]
SIM_REQUIRED = ["frames_sent", "actions_received"]


# ----------------------------------------------------------------------------------------- loading

@dataclass
class NodeRun:
    path: Path
    summary: dict
    arrays: dict | None  # cycles.npz arrays, None when empty
    hist: dict | None = None  # histograms.npz: metric -> bucket counts (whole run), when present

    @property
    def complete(self) -> bool:
        return bool(self.summary.get("ring", {}).get("complete")) and self.arrays is not None


@dataclass
class SimRun:
    path: Path
    summary: dict
    arrays: dict | None  # roundtrip.npz arrays, None when absent


@dataclass
class Run:
    path: Path
    node: NodeRun | None = None
    sim: SimRun | None = None
    label: str = ""
    extra: dict = field(default_factory=dict)


def _read_summary(d: Path) -> dict:
    f = d / "summary.json"
    if not f.is_file():
        raise UserError(f"{f}: missing (not a complete run dir: the node writes summary.json when a run ends)")
    try:
        s = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{f}: not valid JSON ({e}); the file is corrupt or truncated") from None
    if not isinstance(s, dict):
        raise UserError(f"{f}: top level is {type(s).__name__}, expected a JSON object")
    fmt = s.get("format")
    if fmt != FORMAT:
        raise UserError(f"{f}: format {fmt!r} is not supported (this control-node reads format {FORMAT})")
    return s


def _read_npz(f: Path, spec: dict) -> dict:
    if not f.is_file():
        raise UserError(f"{f}: missing (the run dir is incomplete)")
    try:
        with np.load(f, allow_pickle=False) as z:
            names = set(z.files)
            missing = [k for k in spec if k not in names]
            if missing:
                raise UserError(f"{f}: arrays missing: {', '.join(missing)}")
            arrays = {k: np.asarray(z[k]) for k in spec}
    except UserError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"{f}: cannot be read ({type(e).__name__}: {e}); the file is corrupt or truncated") from None
    lengths = {k: a.shape for k, a in arrays.items()}
    n = None
    for k, a in arrays.items():
        if a.ndim != 1:
            raise UserError(f"{f}: array '{k}' has shape {a.shape}, expected 1-D")
        if a.dtype.kind not in (spec[k], "i", "u") and not (spec[k] == "b" and a.dtype.kind == "b"):
            raise UserError(f"{f}: array '{k}' has dtype {a.dtype}, expected a numeric array")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise UserError(f"{f}: arrays have different lengths: "
                            + ", ".join(f"{k}={s[0]}" for k, s in lengths.items()))
    return arrays


def _load_node(d: Path, s: dict) -> NodeRun:
    missing = [k for k in NODE_REQUIRED if k not in s]
    if missing:
        raise UserError(f"{d / 'summary.json'}: node summary lacks {', '.join(missing)}")
    arrays = _read_npz(d / "cycles.npz", CYCLE_ARRAYS)
    rec = s.get("ring", {}).get("recorded")
    n = len(arrays["cycle"])
    if rec is not None and rec != n:
        raise UserError(f"{d / 'cycles.npz'}: holds {n} cycles but summary.json says ring.recorded = {rec}")
    hist = None
    hf = d / "histograms.npz"
    if hf.exists():  # optional: the node's streaming histograms over the whole run
        try:
            with np.load(hf, allow_pickle=False) as z:
                hist = {k: np.asarray(z[k], dtype=np.int64) for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
            raise UserError(f"{hf}: cannot be read ({type(e).__name__}: {e}); the file is corrupt or "
                            "truncated (delete it to report from summary.json and cycles.npz only)") from None
        for k, c in hist.items():
            if c.ndim != 1:
                raise UserError(f"{hf}: array '{k}' has shape {c.shape}, expected 1-D bucket counts")
    return NodeRun(d, s, arrays if n else None, hist)


def _load_sim(d: Path, s: dict) -> SimRun:
    missing = [k for k in SIM_REQUIRED if k not in s]
    if missing:
        raise UserError(f"{d / 'summary.json'}: sim summary lacks {', '.join(missing)}")
    f = d / "roundtrip.npz"
    arrays = _read_npz(f, SIM_ARRAYS) if f.exists() else None
    return SimRun(d, s, arrays)


def _load_one(d: Path):
    s = _read_summary(d)
    role = s.get("role")
    if role == "node":
        return _load_node(d, s)
    if role in ("sim", "replay"):  # the replayer writes the simulator's format
        return _load_sim(d, s)
    raise UserError(f"{d / 'summary.json'}: role {role!r} unknown (expected 'node', 'sim' or 'replay')")


def load_run(path) -> Run:
    """A node run dir, a sim run dir, or a launch dir holding ``node/`` and/or ``sim/``."""
    d = Path(path)
    if not d.exists():
        raise UserError(f"{d}: no such run dir")
    if not d.is_dir():
        raise UserError(f"{d}: not a directory (pass a run dir such as runs/<id>/)")
    run = Run(d)
    subs = [sub for sub in ("node", "sim", "replay") if (d / sub).is_dir()]
    if subs:  # a launch dir: node/ plus the driver's sim/ or replay/
        if "sim" in subs and "replay" in subs:
            raise UserError(f"{d}: holds both sim/ and replay/; report them as separate launch dirs")
        for sub in subs:
            r = _load_one(d / sub)
            if not isinstance(r, NodeRun if sub == "node" else SimRun):
                raise UserError(f"{d / sub / 'summary.json'}: role {r.summary.get('role')!r} in {sub}/")
            setattr(run, "node" if sub == "node" else "sim", r)
    else:
        if not any(d.iterdir()):
            raise UserError(f"{d}: empty directory, not a run dir (expected summary.json and cycles.npz)")
        r = _load_one(d)
        if isinstance(r, NodeRun):
            run.node = r
        else:
            run.sim = r
    if run.node is not None:
        run.label = str(run.node.summary.get("run_id") or d.name)
    else:
        run.label = str(run.sim.summary.get("run_id") or d.name)
    if run.label in ("node", "sim", "replay"):
        run.label = d.name
    return run


# ----------------------------------------------------------------------------------------- stats

def array_stats(values: np.ndarray) -> dict:
    """Percentiles (numpy default linear method), max, mean, count of a 1-D array, in its unit."""
    v = np.asarray(values)
    if v.size == 0:
        return {**{k: None for k in STAT_KEYS}, "mean": None, "count": 0}
    q = np.percentile(v, [p for _, p in PCTS])
    out = {k: float(x) for (k, _), x in zip(PCTS, q)}
    out["max"] = float(v.max())
    out["mean"] = float(v.mean(dtype=np.float64))
    out["count"] = int(v.size)
    return out


def metric_values(run_part, metric: str) -> np.ndarray | None:
    """Raw samples of a metric (ns) from the arrays, or None. Input age -1 / rtt < 0 mean 'none'."""
    a = run_part.arrays
    if a is None:
        return None
    table = {m[0]: m[2] for m in NODE_METRICS + SIM_METRICS}
    v = a[table[metric]]
    if metric in ("input_age_ns", "round_trip_ns"):
        v = v[v >= 0]
    return v


def _summary_stats(d) -> dict:
    if not isinstance(d, dict):
        return {**{k: None for k in STAT_KEYS}, "mean": None, "count": 0}
    out = {k: (None if d.get(k) is None else float(d[k])) for k in STAT_KEYS + ["mean"]}
    out["count"] = int(d.get("count") or 0)
    return out


def node_stats(node: NodeRun) -> dict:
    """metric -> stats dict with 'source' ('arrays' or 'summary')."""
    out = {}
    for name, skey, _akey, _t in NODE_METRICS:
        if node.complete:
            st = array_stats(metric_values(node, name))
            st["source"] = "arrays"
        else:
            st = _summary_stats(node.summary.get(skey))
            st["source"] = "summary"
        out[name] = st
    return out


def sim_stats(sim: SimRun) -> dict:
    if sim.arrays is not None:
        st = array_stats(metric_values(sim, "round_trip_ns"))
        st["source"] = "arrays"
    else:
        st = _summary_stats(sim.summary.get("round_trip_ns"))
        st["source"] = "summary"
    return {"round_trip_ns": st}


def worst_events(node: NodeRun, n: int = 10) -> dict:
    """Cycle numbers of the deadline misses (worst first by cycle time) and the worst wake-ups."""
    a = node.arrays
    if not node.complete:
        # the ring holds only the last cycles: summary.json's worst_cycles cover the whole run; add the
        # misses the ring saw
        wc = list(node.summary.get("worst_cycles") or [])
        misses = {int(w["cycle"]): int(w.get("cycle_time_ns") or 0) for w in wc if int(w.get("flags", 0)) & FLAG_MISS}
        if a is not None:
            idx = np.flatnonzero(a["flags"] & FLAG_MISS)
            for c, t in zip(a["cycle"][idx][:1000].tolist(), a["cycle_time_ns"][idx][:1000].tolist()):
                misses.setdefault(c, t)
        order = sorted(misses, key=lambda c: -misses[c])
        return {"source": "summary", "deadline_miss_cycles": order[:n], "worst_cycles": wc[:n]}
    flags = a["flags"]
    miss_idx = np.flatnonzero(flags & FLAG_MISS)
    if miss_idx.size:
        order = np.argsort(a["cycle_time_ns"][miss_idx], kind="stable")[::-1][:n]
        miss_idx = miss_idx[order]
    k = min(n, a["wake_latency_ns"].size)
    worst = np.argpartition(a["wake_latency_ns"], -k)[-k:] if k else np.array([], dtype=np.int64)
    worst = worst[np.argsort(a["wake_latency_ns"][worst], kind="stable")[::-1]]
    rows = [{"cycle": int(a["cycle"][i]), "wake_latency_ns": int(a["wake_latency_ns"][i]),
             "cycle_time_ns": int(a["cycle_time_ns"][i]), "flags": int(flags[i])} for i in worst]
    return {"source": "arrays", "deadline_miss_cycles": [int(a["cycle"][i]) for i in miss_idx], "worst_cycles": rows}


def verdict(node: NodeRun, stats: dict) -> dict:
    s = node.summary
    budget = s.get("budget") or {}
    checks = []        # (text, within budget)
    wl = stats["wake_latency_ns"]["p99"]
    b = budget.get("wake_latency_p99_ns")
    if b is not None and wl is not None:
        good = wl <= b
        checks.append((f"wake-up p99 {fmt_us(wl)} {'within' if good else 'over'} budget {fmt_us(b)}", good))
    ct = stats["cycle_time_ns"]["max"]
    b = budget.get("cycle_time_max_ns")
    if b is not None and ct is not None:
        good = ct <= b
        checks.append((f"worst cycle time {fmt_us(ct)} {'within' if good else 'over'} budget {fmt_us(b)}", good))
    misses = int(s.get("deadline_misses") or 0)
    allowed = int(budget.get("deadline_misses") or 0)      # runs written before this key allowed none
    checks.append((f"{misses} deadline miss{'es' if misses != 1 else ''}"
                   + (f" {'within' if misses <= allowed else 'over'} budget {allowed}" if allowed else ""),
                   misses <= allowed))
    if not budget:
        checks.append(("no budget in summary.json", True))
    failed = [t for t, good in checks if not good]
    passed = [t for t, good in checks if good]
    text = ("FAIL: " + "; ".join(failed) + (" (ok: " + "; ".join(passed) + ")" if passed else "")
            if failed else "PASS: " + "; ".join(passed))
    return {"ok": not failed, "text": text}


def fmt_us(ns) -> str:
    if ns is None:
        return "-"
    us = ns / 1e3
    a = abs(us)
    if a >= 10000:
        return f"{us / 1e3:.2f} ms"
    if a >= 100:
        return f"{us:.0f} us"
    if a >= 10 or a == 0:
        return f"{us:.1f} us"
    if a >= 1:
        return f"{us:.2f} us"
    return f"{us:.3f} us"


def run_summary(run: Run) -> dict:
    """The machine-readable report of one run (what --json prints)."""
    out = {"path": str(run.path), "label": run.label}
    if run.node is not None:
        s, node = run.node.summary, run.node
        stats = node_stats(node)
        out["node"] = {
            "path": str(node.path), "run_id": s.get("run_id"), "started_at": s.get("started_at"),
            "duration_s": s.get("duration_s"), "rate_hz": s.get("rate_hz"), "clock_mode": s.get("clock_mode"),
            "achieved_rate_hz": s.get("achieved_rate_hz"), "cycles": s.get("cycles"),
            "deadline_misses": s.get("deadline_misses"), "stale_cycles": s.get("stale_cycles"),
            "safe_actions": s.get("safe_actions"), "superseded": s.get("superseded"),
            "frames_valid": s.get("frames_valid"), "rejected": s.get("rejected") or {},
            "rejected_total": s.get("rejected_total"), "ring": s.get("ring"),
            **{k: s[k] for k, _ in EXTRA_COUNTERS if k in s},
            "percentile_method": ("numpy.percentile, linear interpolation, over all cycles" if node.complete
                                  else "summary.json (node's streaming histogram; ring incomplete)"),
            "stats": stats, "events": worst_events(node), "budget": s.get("budget"), "verdict": verdict(node, stats),
            "rt": s.get("rt") or {}, "model": s.get("model"), "host": s.get("host"), "process": s.get("process"),
        }
    if run.sim is not None:
        s = run.sim.summary
        out["sim"] = {"path": str(run.sim.path), "role": s.get("role"), **{k: s.get(k) for k in
                      ("frames_sent", "actions_received", "actions_lost", "safe_actions", "accuracy", "stream")},
                      "stats": sim_stats(run.sim)}
    return out


def all_stats(rs: dict) -> dict:
    st = dict(rs.get("node", {}).get("stats", {}))
    st.update(rs.get("sim", {}).get("stats", {}))
    return st


def comparison(summaries: list[dict]) -> list[dict]:
    """Rows: metric, percentile, value per run (ns), ratio of each later run to the first."""
    rows = []
    stats = [all_stats(s) for s in summaries]
    names = [m[0] for m in NODE_METRICS + SIM_METRICS]
    for name in names:
        if not any(name in st for st in stats):
            continue
        for k in STAT_KEYS:
            vals = [st.get(name, {}).get(k) for st in stats]
            base = vals[0]
            ratios = [None if (base in (None, 0) or v is None) else v / base for v in vals[1:]]
            rows.append({"metric": name, "stat": k, "values_ns": vals, "ratios": ratios})
    return rows


# ----------------------------------------------------------------------------------------- .hgrm

def hgrm_text(values_ns: np.ndarray, ticks_per_half_distance: int = 5, digits: int = 3) -> str:
    """HdrHistogram ``outputPercentileDistribution`` text of raw samples (values in microseconds).

    Same columns, percentile ticks and footer as HdrHistogram's Java/C writers, but with exact values
    (the order statistic that reaches each percentile) instead of a bucket's highest equivalent value.
    """
    vals, counts = np.unique(np.asarray(values_ns, dtype=np.int64), return_counts=True)
    return hgrm_from_counts(vals, counts, ticks_per_half_distance, digits)


def hgrm_from_counts(values_ns, counts, ticks_per_half_distance: int = 5, digits: int = 3,
                     buckets: tuple = (0, 0)) -> str:
    """``.hgrm`` text from distinct ascending values (ns) and their counts (a histogram)."""
    values_ns = np.asarray(values_ns, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    nz = counts > 0
    vals, counts = values_ns[nz], counts[nz]
    cum = np.cumsum(counts)
    n = int(cum[-1]) if cum.size else 0
    buf = io.StringIO()
    buf.write("%12s %14s %10s %14s\n\n" % ("Value", "Percentile", "TotalCount", "1/(1-Percentile)"))
    if n == 0:
        buf.write("#[Mean    = %12.*f, StdDeviation   = %12.*f]\n" % (digits, 0.0, digits, 0.0))
        buf.write("#[Max     = %12.*f, Total count    = %12d]\n" % (digits, 0.0, 0))
        buf.write("#[Buckets = %12d, SubBuckets     = %12d]\n" % buckets)
        return buf.getvalue()
    # percentile ticks as in HdrHistogram's PercentileIterator: the step halves each time the
    # remaining distance to 100% halves; each tick reports the first value whose cumulative count
    # reaches it, and the iteration ends with the tick that reaches the largest value.
    p = 0.0
    while True:
        need = max(1, math.ceil(p * n / 100.0))
        while need > 1 and 100.0 * (need - 1) / n >= p:
            need -= 1
        while 100.0 * need / n < p:
            need += 1
        j = int(np.searchsorted(cum, need, side="left"))
        total = int(cum[j])
        buf.write("%12.*f %2.12f %10d %14.2f\n" % (digits, vals[j] / 1e3, p / 100.0, total, 1.0 / (1.0 - p / 100.0)))
        if total >= n:
            break
        ticks = ticks_per_half_distance * 2 ** (int(math.log2(100.0 / (100.0 - p))) + 1)
        p += 100.0 / ticks
    buf.write("%12.*f %2.12f %10d\n" % (digits, vals[-1] / 1e3, 1.0, n))
    fv = vals.astype(np.float64)
    mean = float((fv * counts).sum() / n)
    std = math.sqrt(max(0.0, float((counts * (fv - mean) ** 2).sum() / n)))
    buf.write("#[Mean    = %12.*f, StdDeviation   = %12.*f]\n" % (digits, mean / 1e3, digits, std / 1e3))
    buf.write("#[Max     = %12.*f, Total count    = %12d]\n" % (digits, vals[-1] / 1e3, n))
    buf.write("#[Buckets = %12d, SubBuckets     = %12d]\n" % buckets)
    return buf.getvalue()


HIST_SUB_BITS = 7  # control_node/rt_hist.h: exact below 128 ns, then 128 sub-buckets per power of two


def hist_lower_bounds(n_buckets: int) -> np.ndarray:
    """Lowest value (ns) of each bucket of the node's streaming histogram (rt_hist.h)."""
    i = np.arange(n_buckets, dtype=np.int64)
    sub = 1 << HIST_SUB_BITS
    lower = (sub + (i & (sub - 1))) << np.maximum((i >> HIST_SUB_BITS) - 1, 0)
    return np.where(i < sub, i, lower)


def hist_quantiles(counts: np.ndarray, pcts: np.ndarray) -> np.ndarray:
    """Values (bucket lower bounds, ns) at percentiles ``pcts`` (0-100) of a streaming histogram."""
    counts = np.asarray(counts, dtype=np.int64)
    cum = np.cumsum(counts)
    total = cum[-1]
    rank = np.maximum(1, np.ceil(np.asarray(pcts) / 100.0 * total)).astype(np.int64)
    return hist_lower_bounds(counts.size)[np.searchsorted(cum, rank)]


def write_hgrms(run: Run, out: Path) -> list[Path]:
    files = []
    parts = [(run.node, NODE_METRICS), (run.sim, SIM_METRICS)]
    for part, metrics in parts:
        if part is None:
            continue
        for name, *_ in metrics:
            f = out / f"{name.removesuffix('_ns')}.hgrm"
            hist = getattr(part, "hist", None) or {}
            if isinstance(part, NodeRun) and not part.complete and name in hist:
                # whole run from the node's streaming histogram (bucket lower bounds, <= 0.8% low)
                c = hist[name]
                text = hgrm_from_counts(hist_lower_bounds(c.size), c, buckets=(c.size >> HIST_SUB_BITS,
                                                                                1 << HIST_SUB_BITS))
            elif part.arrays is not None and (not isinstance(part, NodeRun) or part.complete):
                text = hgrm_text(metric_values(part, name))
            else:
                continue  # incomplete ring and no histogram: the ring's tail is not the run
            f.write_text(text)
            files.append(f)
    return files


# ----------------------------------------------------------------------------------------- terminal

def _num(x, digits=3):
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def us_num(ns) -> str:
    """A latency in microseconds, number only, 3-4 significant digits (tables titled '(us)')."""
    if ns is None:
        return "-"
    us = ns / 1e3
    a = abs(us)
    if a >= 100 or a == 0:
        return f"{us:.0f}" if a >= 100 else "0"
    if a >= 10:
        return f"{us:.1f}"
    if a >= 1:
        return f"{us:.2f}"
    return f"{us:.3f}"


def _cell(ns):
    return us_num(ns)


def print_terminal(summaries: list[dict], console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    console = console or Console()
    for rs in summaries:
        console.rule(f"[bold]{rs['label']}[/]  {rs['path']}")
        n = rs.get("node")
        if n:
            rate = n.get("achieved_rate_hz")
            console.print(f"rate {rate if rate is None else f'{rate:.2f}'} Hz achieved "
                          f"(configured {n.get('rate_hz')} Hz, clock {n.get('clock_mode')}), "
                          f"{n.get('cycles')} cycles over {_num(n.get('duration_s'))} s")
            t = Table(title="events", show_header=True)
            t.add_column("what")
            t.add_column("count", justify="right")
            t.add_column("detail")
            ev = n["events"]
            t.add_row("deadline misses", str(n.get("deadline_misses")),
                      "cycles " + ", ".join(map(str, ev["deadline_miss_cycles"])) if ev["deadline_miss_cycles"] else "")
            t.add_row("stale cycles", str(n.get("stale_cycles")), "")
            t.add_row("safe actions", str(n.get("safe_actions")), "")
            t.add_row("superseded frames", str(n.get("superseded")), "")
            for k, title in EXTRA_COUNTERS:
                if n.get(k) is not None:
                    t.add_row(title, str(n.get(k)), "")
            t.add_row("valid frames", str(n.get("frames_valid")), "")
            rej = n.get("rejected") or {}
            t.add_row("rejected frames", str(n.get("rejected_total")),
                      ", ".join(f"{k} {v}" for k, v in sorted(rej.items()) if v))
            console.print(t)
        st = all_stats(rs)
        if st:
            t = Table(title="latency percentiles (us)" + ("" if not n else
                      f" - {n['percentile_method']}"))
            t.add_column("metric", no_wrap=True)
            for k in STAT_KEYS:
                t.add_column(PCT_LABELS[k], justify="right")
            t.add_column("count", justify="right")
            for name, s in st.items():
                t.add_row(METRIC_TITLES[name], *[_cell(s[k]) for k in STAT_KEYS], str(s["count"]))
            console.print(t)
        if n:
            wc = n["events"]["worst_cycles"]
            if wc:
                console.print("worst wake-ups: " + ", ".join(
                    f"cycle {w['cycle']} ({fmt_us(w['wake_latency_ns'])})" for w in wc[:5]))
            rt = n.get("rt") or {}
            if rt:
                t = Table(title="real-time features")
                for c in ("feature", "requested", "granted", "detail"):
                    t.add_column(c)
                for k, f in rt.items():
                    f = f if isinstance(f, dict) else {"detail": str(f)}
                    g = f.get("granted")
                    t.add_row(k, str(f.get("requested")),
                              "[green]granted[/]" if g else "[red]refused[/]" if g is False else "-",
                              str(f.get("detail", "")))
                console.print(t)
        sm = rs.get("sim")
        if sm:
            acc = sm.get("accuracy")
            console.print(f"{sm.get('role') or 'sim'}: {sm.get('frames_sent')} frames sent, {sm.get('actions_received')} actions received, "
                          f"{sm.get('actions_lost')} lost, {sm.get('safe_actions')} safe, "
                          f"accuracy {acc if acc is None else f'{acc:.4f}'}")
        if n:
            v = n["verdict"]
            console.print(("[bold green]" if v["ok"] else "[bold red]") + v["text"] + "[/]")
    if len(summaries) > 1:
        print_comparison(summaries, console)


def print_comparison(summaries, console):
    from rich.table import Table
    t = Table(title="comparison, us (ratio = run / " + summaries[0]["label"] + ")")
    t.add_column("metric", no_wrap=True)
    t.add_column("stat")
    for i, s in enumerate(summaries):
        t.add_column(s["label"], justify="right")
        if i:
            t.add_column("ratio", justify="right")
    for row in comparison(summaries):
        cells = []
        for i, v in enumerate(row["values_ns"]):
            cells.append(_cell(v))
            if i:
                r = row["ratios"][i - 1]
                cells.append("-" if r is None else f"{r:.2f}x")
        t.add_row(METRIC_TITLES[row["metric"]] if row["stat"] == STAT_KEYS[0] else "", PCT_LABELS[row["stat"]],
                  *cells, end_section=row["stat"] == STAT_KEYS[-1])
    console.print(t)


# ----------------------------------------------------------------------------------------- html

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.25em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.05em}
table{border-collapse:collapse;margin:.6em 0 1.2em}th,td{border:1px solid #ddd;padding:.25em .6em}
th{background:#f4f4f4;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
.pass{background:#e6f6e6;border:1px solid #7c7;padding:.5em 1em;font-weight:bold}
.fail{background:#fbe9e9;border:1px solid #d77;padding:.5em 1em;font-weight:bold}
.granted{color:#080}.refused{color:#b00}.note{color:#666;font-size:.9em}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
"""


def _h(x) -> str:
    return html.escape("" if x is None else str(x))


def _kv(d) -> str:
    if not isinstance(d, dict):
        return _h(d)
    return "; ".join(f"{_h(k)}: {_h(v)}" for k, v in d.items())


def _table(header, rows, numeric_from=1, numeric_to=None) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{_h(c)}</th>" for c in header) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(
            (f'<td class="n">{c}</td>' if numeric_from <= i < (numeric_to or 10**6) else f"<td>{c}</td>")
            for i, c in enumerate(r)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _img(png: bytes | None, alt: str) -> str:
    import base64
    if not png:
        return ""
    return f'<img alt="{_h(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def run_html(rs: dict, pngs: dict) -> str:
    parts = [f"<h2>{_h(rs['label'])}</h2><p class='note'>{_h(rs['path'])}</p>"]
    n = rs.get("node")
    if n:
        v = n["verdict"]
        parts.append(f"<p class='{'pass' if v['ok'] else 'fail'}'>{_h(v['text'])}</p>")
        rate = n.get("achieved_rate_hz")
        parts.append("<h3>Run</h3>" + _table(None, [
            ["run id", _h(n.get("run_id"))], ["started", _h(n.get("started_at"))],
            ["duration", _h(_num(n.get("duration_s"))) + " s"],
            ["rate", f"{_h(None if rate is None else f'{rate:.3f}')} Hz achieved / {_h(n.get('rate_hz'))} Hz configured"],
            ["clock mode", _h(n.get("clock_mode"))], ["cycles", _h(n.get("cycles"))],
            ["ring", _kv(n.get("ring"))],
            ["model", _kv(n.get("model"))], ["host", _kv(n.get("host"))]], numeric_from=99))
        ev = n["events"]
        rej = n.get("rejected") or {}
        parts.append("<h3>Events</h3>" + _table(["what", "count", "detail"], [
            ["deadline misses", _h(n.get("deadline_misses")),
             _h(("cycles " + ", ".join(map(str, ev["deadline_miss_cycles"]))) if ev["deadline_miss_cycles"] else "")],
            ["stale cycles", _h(n.get("stale_cycles")), ""], ["safe actions", _h(n.get("safe_actions")), ""],
            ["superseded frames", _h(n.get("superseded")), ""], ["valid frames", _h(n.get("frames_valid")), ""],
            *[[t, _h(n.get(k)), ""] for k, t in EXTRA_COUNTERS if n.get(k) is not None],
            ["rejected frames", _h(n.get("rejected_total")),
             _h(", ".join(f"{k} {c}" for k, c in sorted(rej.items()) if c))]], numeric_from=1, numeric_to=2))
    st = all_stats(rs)
    if st:
        method = n["percentile_method"] if n else "numpy.percentile, linear interpolation"
        parts.append(f"<h3>Latency percentiles (us)</h3><p class='note'>{_h(method)}</p>")
        parts.append(_table(["metric"] + [PCT_LABELS[k] for k in STAT_KEYS] + ["mean", "count"],
                            [[_h(METRIC_TITLES[m])] + [_h(us_num(s[k])) for k in STAT_KEYS + ["mean"]]
                             + [_h(s["count"])] for m, s in st.items()]))
    if n:
        wc = n["events"]["worst_cycles"]
        if wc:
            parts.append("<h3>Worst wake-ups</h3>" + _table(
                ["cycle", "wake-up latency", "cycle time", "flags"],
                [[_h(w["cycle"]), _h(fmt_us(w["wake_latency_ns"])), _h(fmt_us(w["cycle_time_ns"])),
                  _h(flag_names(w.get("flags", 0)))] for w in wc]))
        rt = n.get("rt") or {}
        if rt:
            rows = []
            for k, f in rt.items():
                f = f if isinstance(f, dict) else {"detail": str(f)}
                g = f.get("granted")
                cls, word = ("granted", "granted") if g else ("refused", "refused") if g is False else ("", "-")
                rows.append([_h(k), _h(f.get("requested")), f"<span class='{cls}'>{word}</span>", _h(f.get("detail"))])
            parts.append("<h3>Real-time features</h3>" + _table(["feature", "requested", "granted", "detail"], rows,
                                                                  numeric_from=99))
    sm = rs.get("sim")
    if sm:
        parts.append("<h3>Simulator</h3>" + _table(None, [[_h(k), _h(sm.get(k))] for k in
                     ("frames_sent", "actions_received", "actions_lost", "safe_actions", "accuracy")], numeric_from=1))
    titles = {"histogram": "Latency histogram", "timeline": "Wake-up latency timeline", "phases": "Per-phase breakdown",
              "percentiles": "Percentile distribution"}
    for key, title in titles.items():
        if pngs.get(key):
            parts.append(f"<h3>{title}</h3>" + _img(pngs[key], title))
    return "\n".join(parts)


def flag_names(flags: int) -> str:
    names = [(FLAG_MISS, "miss"), (FLAG_STALE, "stale"), (FLAG_REJECT, "reject"), (FLAG_SAFE, "safe"),
             (FLAG_NEW, "new-frame")]
    return ",".join(n for b, n in names if int(flags) & b) or "-"


def comparison_html(summaries, png: bytes | None) -> str:
    header = ["metric", "stat"]
    for i, s in enumerate(summaries):
        header.append(s["label"])
        if i:
            header.append(f"ratio {s['label']} / {summaries[0]['label']}")
    rows = []
    for row in comparison(summaries):
        cells = [_h(METRIC_TITLES[row["metric"]]) if row["stat"] == STAT_KEYS[0] else "", _h(PCT_LABELS[row["stat"]])]
        for i, v in enumerate(row["values_ns"]):
            cells.append(_h(us_num(v)))
            if i:
                r = row["ratios"][i - 1]
                cells.append("-" if r is None else f"{r:.2f}x")
        rows.append(cells)
    return ("<h2>Comparison (us)</h2><p class='note'>ratio = later run / first run; above 1 means the later run is "
            "slower at that percentile.</p>" + _table(header, rows, numeric_from=2) + _img(png, "comparison"))


def build_html(summaries, per_run_pngs, compare_png=None) -> str:
    title = "control-node report: " + ", ".join(s["label"] for s in summaries)
    body = [f"<h1>{_h(title)}</h1>"]
    if len(summaries) > 1:
        body.append(comparison_html(summaries, compare_png))
    for rs, pngs in zip(summaries, per_run_pngs):
        body.append(run_html(rs, pngs))
    body.append("<p class='note'>Percentiles: numpy.percentile (default linear interpolation) over every recorded "
                "cycle when the ring is complete, otherwise the node's streaming histogram from summary.json. "
                "See docs/reports.md.</p>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + _h(title) + "</title><style>" + CSS
            + "</style></head><body>" + "\n".join(body) + "</body></html>\n")


# ----------------------------------------------------------------------------------------- driver

def _jsonable(o):
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    return o


def generate(paths, out=None, plots=True) -> tuple[list[dict], Path]:
    """Load the runs, write every output file, return (summaries, out dir)."""
    runs = [load_run(p) for p in paths]
    seen = {}
    for r in runs:  # unique labels for the comparison
        if r.label in seen:
            seen[r.label] += 1
            r.label = f"{r.label}#{seen[r.label]}"
        else:
            seen[r.label] = 1
    summaries = [run_summary(r) for r in runs]
    if out is None:
        out = runs[0].path / "report" / ("compare" if len(runs) > 1 else "")
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot create the output dir ({e.strerror})") from None
    per_run_pngs = []
    for i, r in enumerate(runs):
        d = out if len(runs) == 1 else out / f"{i + 1}-{_safe(r.label)}"
        d.mkdir(parents=True, exist_ok=True)
        files = [str(f) for f in write_hgrms(r, d)]
        pngs = {}
        if plots:
            from control_node import plots as P
            pngs = P.run_plots(r)
            for k, png in pngs.items():
                (d / f"{k}.png").write_bytes(png)
                files.append(str(d / f"{k}.png"))
        summaries[i]["files"] = files
        per_run_pngs.append(pngs)
    compare_png = None
    if plots and len(runs) > 1:
        from control_node import plots as P
        compare_png = P.comparison_plot(runs)
        if compare_png:
            (out / "comparison.png").write_bytes(compare_png)
    (out / "report.html").write_text(build_html(summaries, per_run_pngs, compare_png))
    doc = _jsonable({"format": 1, "runs": summaries,
                     "comparison": comparison(summaries) if len(summaries) > 1 else None,
                     "html": str(out / "report.html")})
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc, out


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)[:64]
