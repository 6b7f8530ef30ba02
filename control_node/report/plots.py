"""PNG plots for ``control-node report`` (matplotlib, Agg backend, returned as PNG bytes).

Every plot is O(n) numpy on the raw arrays and draws a bounded number of points whatever the run
length: the timeline is decimated into at most ``MAX_BUCKETS`` buckets keeping each bucket's min and
max (so a single spike in 3.6M cycles stays visible).
"""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from control_node import rundir  # noqa: E402
from control_node.report import load as R  # noqa: E402
from control_node.report import stats as S  # noqa: E402
from control_node.report.load import NodeRun, Run  # noqa: E402

MAX_BUCKETS = 4000
MAX_HIST_BINS = 4000
COLORS = {"wake_latency_ns": "tab:blue", "cycle_time_ns": "tab:orange", "recv_ns": "tab:green",
          "infer_ns": "tab:red", "publish_ns": "tab:purple", "period_ns": "tab:brown",
          "input_age_ns": "tab:gray", "round_trip_ns": "tab:cyan"}


class HistCounts:
    """Bucket counts of the node's streaming histogram (control_node/rt_hist.h layout)."""

    def __init__(self, counts):
        self.counts = np.asarray(counts, dtype=np.int64)


def decimate_minmax(y: np.ndarray, n_buckets: int = MAX_BUCKETS):
    """Split ``y`` into at most ``n_buckets`` contiguous buckets: (first index, min, max) per bucket."""
    y = np.asarray(y)
    n = y.size
    if n == 0:
        e = np.array([], dtype=np.int64)
        return e, y[:0], y[:0]
    b = min(n, n_buckets)
    starts = (np.arange(b, dtype=np.int64) * n) // b
    return starts, np.minimum.reduceat(y, starts), np.maximum.reduceat(y, starts)


def bucket_any(mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per bucket (same ``starts`` as :func:`decimate_minmax`): does any element have ``mask`` set?"""
    if mask.size == 0:
        return mask[:0]
    return np.logical_or.reduceat(mask, starts)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _us(v):
    return np.asarray(v, dtype=np.float64) / 1e3


def histogram(series: dict, title: str) -> bytes | None:
    """cyclictest/OSADL style: linear x in microseconds, log y sample counts, one step line per series."""
    series = {k: v for k, v in series.items() if v is not None and v.size}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.5))
    hi = max(float(v.max()) for v in series.values()) / 1e3
    lo = min(0.0, min(float(v.min()) for v in series.values()) / 1e3)
    width = max(1.0, np.ceil((hi - lo) / MAX_HIST_BINS))  # 1 us bins like cyclictest unless too many
    edges = np.arange(np.floor(lo), hi + width + 1e-9, width)
    for name, v in series.items():
        counts, _ = np.histogram(_us(v), bins=edges)
        # empty bins drop below the axis so that a lone outlier still shows as a spike
        ax.step(edges[:-1], np.where(counts > 0, counts, 0.1), where="post", lw=1,
                color=COLORS.get(name), label=f"{R.METRIC_TITLES[name]} (n={v.size}, max {v.max() / 1e3:.1f} us)")
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.8)
    ax.set_xlabel(f"latency (us), {width:g} us bins")
    ax.set_ylabel("samples (log)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def timeline(arrays: dict, title: str, budget_ns=None, period_ns=None, transitions=None) -> bytes | None:
    y = arrays["wake_latency_ns"]
    if y.size == 0:
        return None
    cyc = arrays["cycle"]
    starts, lo, hi = decimate_minmax(y)
    x = cyc[starts]
    flags = arrays["flags"]
    fig, ax = plt.subplots(figsize=(10, 5))
    ax.fill_between(x, _us(lo), _us(hi), step="post", color="tab:blue", alpha=0.35, lw=0,
                    label=f"wake-up latency, min-max per bucket ({len(starts)} buckets of {y.size / len(starts):.3g} cycles)")
    ax.plot(x, _us(hi), drawstyle="steps-post", lw=0.6, color="tab:blue")
    stale = bucket_any((flags & rundir.FLAG_STALE) != 0, starts)
    if stale.any():  # a strip along the bottom: readable whether 1 or every cycle is stale
        ax.vlines(x[stale], 0, 0.04, color="orange", lw=1.5, transform=ax.get_xaxis_transform(),
                  label=f"stale (strip at the bottom; {int(stale.sum())} of {len(starts)} buckets)")
    miss = bucket_any((flags & rundir.FLAG_MISS) != 0, starts)
    if miss.any():
        ax.plot(x[miss], _us(hi[miss]), "x", ms=7, mew=1.5, color="red", label=f"deadline miss ({int(miss.sum())} buckets)")
    if budget_ns:
        ax.axhline(budget_ns / 1e3, color="green", ls="--", lw=1, label=f"p99 budget {budget_ns / 1e3:g} us")
    # policy switches (summary.json lifecycle): a dashed line at each, the rollbacks in red
    sw = [e for e in transitions or [] if e.get("event") in ("activate", "canary", "rollback", "auto_rollback",
                                                              "promote") and e.get("reason") != "start-up policy"
          and cyc.size and cyc[0] <= e.get("cycle", -1) <= cyc[-1]]
    if sw:
        for kind, color in (("switch", "purple"), ("rollback", "red")):
            xs = [e["cycle"] for e in sw if ("rollback" in e["event"]) == (kind == "rollback")]
            if xs:
                ax.vlines(xs, 0, 1, transform=ax.get_xaxis_transform(), color=color, ls=":", lw=0.8,
                          label=f"policy {kind} ({len(xs)})")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylim(bottom=min(0.0, float(lo.min()) / 1e3), top=float(hi.max()) / 1e3 * 2 + 10)
    ax.set_xlabel("cycle")
    ax.set_ylabel("wake-up latency (us)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, frameon=False)
    fig.tight_layout()
    return _png(fig)


def actions_plot(actions: dict, title: str, names=None, cycles_arrays: dict | None = None) -> bytes | None:
    """A continuous policy's published actions (actions.npz) against the cycle: per component a min-max
    band per bucket (at most MAX_BUCKETS), and a strip along the bottom where cycles published the safe
    action (from cycles.npz flags, where it covers the same cycles)."""
    u = np.asarray(actions["u"], dtype=np.float64)
    cyc = np.asarray(actions["cycle"])
    if u.size == 0:
        return None
    starts, lo, hi = decimate_minmax(u[:, 0])
    x = cyc[starts]
    fig, ax = plt.subplots(figsize=(10, 5))
    cmap = plt.get_cmap("tab10")
    for j in range(u.shape[1]):
        _, lo, hi = decimate_minmax(u[:, j], len(starts))
        name = names[j] if names is not None and j < len(names) else f"u{j}"
        color = cmap(j % 10)
        ax.fill_between(x, lo, hi, step="post", color=color, alpha=0.3, lw=0)
        ax.plot(x, (lo + hi) / 2, drawstyle="steps-post", lw=0.8, color=color, label=name)
    if cycles_arrays is not None and cycles_arrays["cycle"].size:
        cc = cycles_arrays["cycle"]
        pos = np.searchsorted(cc, cyc)
        inside = (pos < cc.size) & (cc[np.minimum(pos, cc.size - 1)] == cyc)
        safe = np.zeros(cyc.size, dtype=bool)
        safe[inside] = (cycles_arrays["flags"][pos[inside]] & rundir.FLAG_SAFE) != 0
        sb = bucket_any(safe, starts)
        if sb.any():
            ax.vlines(x[sb], 0, 0.04, color="red", lw=1.5, transform=ax.get_xaxis_transform(),
                      label=f"safe action (strip; {int(sb.sum())} of {len(starts)} buckets)")
    ax.set_xlabel("cycle")
    ax.set_ylabel("action")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=min(6, u.shape[1] + 1),
              frameon=False)
    fig.tight_layout()
    return _png(fig)


def phases(stats: dict, title: str) -> bytes | None:
    """Grouped bars: recv / infer / publish / cycle time at each percentile (log y)."""
    names = [m for m in ("recv_ns", "infer_ns", "publish_ns", "cycle_time_ns") if stats.get(m, {}).get("count")]
    if not names:
        return None
    keys = R.STAT_KEYS
    fig, ax = plt.subplots(figsize=(10, 4.5))
    w = 0.8 / len(names)
    xs = np.arange(len(keys))
    for i, m in enumerate(names):
        vals = [stats[m][k] for k in keys]
        vals = [np.nan if v is None else v / 1e3 for v in vals]
        bars = ax.bar(xs + i * w - 0.4 + w / 2, vals, w, color=COLORS[m], label=R.METRIC_TITLES[m])
        ax.bar_label(bars, fmt="%.1f", fontsize=6, rotation=90, padding=2)
    ax.set_xticks(xs, [R.PCT_LABELS[k] for k in keys])
    ax.set_yscale("log")
    ax.set_ylabel("time (us, log)")
    ax.set_title(title)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.margins(y=0.25)
    fig.tight_layout()
    return _png(fig)


def _pct_curve(v: np.ndarray):
    """(1/(1-p), value) points on a log-spaced grid of p up to the last sample (numpy linear method)."""
    n = v.size
    top = max(1.0, np.log10(n))
    k = np.linspace(0.0, top, 300)
    p = 1.0 - 10.0 ** (-k)
    q = np.percentile(v, p * 100.0)
    return 1.0 / (1.0 - p), q


def percentile_plot(series: dict, title: str, labels: dict | None = None, colors: bool = True) -> bytes | None:
    """HdrHistogram-style percentile distribution: log x axis of 1/(1-p), labelled 90%, 99%, 99.9%..."""
    series = {k: v for k, v in series.items() if v is not None}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xmax = 10.0
    for name, v in series.items():
        label = (labels or {}).get(name, R.METRIC_TITLES.get(name, name))
        color = COLORS.get(name) if colors else None  # None: matplotlib's cycle (one colour per run)
        if isinstance(v, HistCounts):  # node's streaming histogram over the whole run (ring incomplete)
            total = int(v.counts.sum())
            if total == 0:
                continue
            k = np.linspace(0.0, max(1.0, np.log10(total)), 300)
            p = 1.0 - 10.0 ** (-k)
            q = rundir.hist_quantiles(v.counts, p * 100.0)
            ax.plot(1.0 / (1.0 - p), q / 1e3, lw=1.5, color=color, label=label + " (streaming histogram)")
            xmax = max(xmax, 1.0 / (1.0 - p[-1]))
            continue
        if isinstance(v, dict):  # summary percentiles only (ring incomplete)
            pts = [(1 / (1 - p / 100), v.get(k)) for k, p in R.PCTS if v.get(k) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, np.asarray(ys) / 1e3, "o--", color=color, label=label + " (summary.json)")
                xmax = max(xmax, max(xs))
            continue
        if v.size == 0:
            continue
        x, q = _pct_curve(v)
        ax.plot(x, q / 1e3, lw=1.5, color=color, label=label)
        xmax = max(xmax, x[-1])
    ax.set_xscale("log")
    ticks = [2, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7]
    ticks = [t for t in ticks if t <= xmax * 1.01]
    names = {2: "50%", 10: "90%", 100: "99%", 1e3: "99.9%", 1e4: "99.99%", 1e5: "99.999%",
             1e6: "99.9999%", 1e7: "99.99999%"}
    ax.set_xticks(ticks, [names[t] for t in ticks])
    ax.minorticks_off()
    ax.set_xlim(1, max(10.0, xmax))
    ax.set_yscale("log")
    ax.set_xlabel("percentile (x axis is 1/(1-p), log)")
    ax.set_ylabel("latency (us, log)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return _png(fig)


def _series_for(run: Run, names):
    out = {}
    for part, metrics in ((run.node, R.NODE_METRICS), (run.sim, R.SIM_METRICS)):
        if part is None:
            continue
        for name, skey, *_ in metrics:
            if name not in names:
                continue
            complete = part.complete if isinstance(part, NodeRun) else part.arrays is not None
            hist = getattr(part, "hist", None) or {}
            if complete:
                out[name] = S.metric_values(part, name)
            elif name in hist:
                out[name] = HistCounts(hist[name])
            elif isinstance(part.summary.get(skey), dict):
                out[name] = part.summary[skey]
    return out


def control_trace(control: dict, t0_ns, node_arrays, title: str) -> bytes | None:
    """Angle and torque of a physics simulator over time, with the node's deadline misses and stale
    cycles marked (both on CLOCK_MONOTONIC: node ticks are placed with the simulator's t0)."""
    t, theta, u = control["t_s"], control["theta"], control["u"]
    if t.size == 0:
        return None
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True)
    deg = np.degrees(np.angle(np.exp(1j * theta)))
    starts, lo, hi = decimate_minmax(deg, MAX_BUCKETS)
    tb = t[starts]
    ax1.fill_between(tb, lo, hi, step="post", color="tab:blue", alpha=0.8, lw=0.6)
    ax1.axhline(0, color="grey", lw=0.6)
    ax1.set_ylabel("angle (deg, 0 = upright)")
    _, ulo, uhi = decimate_minmax(u, MAX_BUCKETS)
    ax2.fill_between(tb, ulo, uhi, step="post", color="tab:orange", alpha=0.8, lw=0.6)
    ax2.set_ylabel("torque (N m)")
    ax2.set_xlabel("time (s)")
    if node_arrays is not None and t0_ns is not None:
        tt = (node_arrays["t_tick_ns"] - int(t0_ns)) / 1e9
        inside = (tt >= t[0]) & (tt <= t[-1])
        for flag, color, label in ((rundir.FLAG_MISS, "tab:red", "deadline miss"),
                                   (rundir.FLAG_STALE, "tab:purple", "stale (safe action)")):
            x = tt[inside & ((node_arrays["flags"] & flag) != 0)]
            if x.size:
                for ax in (ax1, ax2):
                    ax.vlines(x[:2000], 0, 1, transform=ax.get_xaxis_transform(), color=color, alpha=0.35,
                              lw=0.8, label=label if ax is ax1 else None)
        if ax1.get_legend_handles_labels()[0]:
            ax1.legend(loc="upper right", fontsize=8)
    ax1.set_title(title)
    fig.tight_layout()
    return _png(fig)


def run_plots(run: Run) -> dict:
    out = {}
    label = run.label
    node = run.node
    if node is not None and node.arrays is not None:
        a = node.arrays
        note = "" if node.complete else f" (last {a['cycle'].size} cycles recorded)"
        out["histogram"] = histogram({"wake_latency_ns": a["wake_latency_ns"], "cycle_time_ns": a["cycle_time_ns"]},
                                     f"{label}: latency histogram{note}")
        budget = (node.summary.get("budget") or {}).get("wake_latency_p99_ns")
        out["timeline"] = timeline(a, f"{label}: wake-up latency per cycle{note}", budget,
                                   transitions=(node.summary.get("lifecycle") or {}).get("transitions"))
    if node is not None and node.actions is not None:
        names = (node.summary.get("policy") or {}).get("action_names")
        n_kept = node.actions["cycle"].size
        out["actions"] = actions_plot(node.actions, f"{label}: published actions (last {n_kept} cycles, min-max per "
                                      "bucket)", names, node.arrays)
    if run.sim is not None and run.sim.control is not None:
        ctl = run.sim.summary.get("control") or {}
        out["control"] = control_trace(run.sim.control, ctl.get("t0_ns"), node.arrays if node is not None else None,
                                       f"{label}: control trace ({ctl.get('line', '')})")
    if node is not None:
        out["phases"] = phases(S.node_stats(node), f"{label}: per-phase time at each percentile")
    elif run.sim is not None and run.sim.arrays is not None:
        rtt = S.metric_values(run.sim, "round_trip_ns")
        out["histogram"] = histogram({"round_trip_ns": rtt}, f"{label}: round-trip histogram")
    out["percentiles"] = percentile_plot(
        _series_for(run, ["wake_latency_ns", "cycle_time_ns", "input_age_ns", "round_trip_ns"]),
        f"{label}: percentile distribution")
    return {k: v for k, v in out.items() if v}


def comparison_plot(runs) -> bytes | None:
    series, labels = {}, {}
    for r in runs:
        for name, v in _series_for(r, ["wake_latency_ns", "round_trip_ns"]).items():
            series[f"{r.label}:{name}"] = v
            labels[f"{r.label}:{name}"] = f"{r.label} {R.METRIC_TITLES[name]}"
    if not series:
        return None
    return percentile_plot(series, "comparison: percentile distribution", labels, colors=False)
