"""Percentiles and summaries of per-cycle records.

Percentiles use numpy's default (linear interpolation) on the raw arrays; when the
ring has wrapped, whole-run figures come from the loop's streaming histograms.
"""
from __future__ import annotations

import numpy as np

PCTS = {"p50": 50, "p90": 90, "p99": 99, "p999": 99.9, "p9999": 99.99}
HIST_SUB_BITS = 7


def describe(values) -> dict:
    """{p50, p90, p99, p999, p9999, max, mean, count} of an int array (ns); Nones when empty."""
    v = np.asarray(values)
    if v.size == 0:
        return {**{k: None for k in PCTS}, "max": None, "mean": None, "count": 0}
    q = np.percentile(v, list(PCTS.values()))
    out = {k: float(x) for k, x in zip(PCTS, q)}
    out.update(max=float(v.max()), mean=float(v.mean()), count=int(v.size))
    return out


def hist_lower_bounds(n_buckets: int) -> np.ndarray:
    """Lowest value of each bucket of rt_hist.h's log-linear histogram."""
    i = np.arange(n_buckets, dtype=np.int64)
    sub = 1 << HIST_SUB_BITS
    e = (i >> HIST_SUB_BITS) + HIST_SUB_BITS - 1
    mant = i & (sub - 1)
    lower = (sub + mant) << np.maximum(e - HIST_SUB_BITS, 0)
    return np.where(i < sub, i, lower)


def describe_hist(counts) -> dict:
    """Same fields as :func:`describe`, from a streaming histogram (bucket lower bounds, <= 0.8% low).

    Works on a copy: the running loop may be writing the histogram meanwhile."""
    counts = np.array(counts, dtype=np.int64, copy=True)
    total = int(counts.sum())
    if total == 0:
        return {**{k: None for k in PCTS}, "max": None, "mean": None, "count": 0}
    lows = hist_lower_bounds(len(counts))
    cum = np.cumsum(counts)
    out = {}
    for k, p in PCTS.items():
        rank = max(1, int(np.ceil(p / 100 * total)))
        out[k] = float(lows[np.searchsorted(cum, rank)])
    nz = np.flatnonzero(counts)
    out.update(max=float(lows[nz[-1]]), mean=float((lows * counts).sum() / total), count=total)
    return out
