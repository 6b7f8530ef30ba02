"""HdrHistogram ``.hgrm`` percentile-distribution files of raw samples or streaming histograms.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from control_node import rundir
from control_node.report.load import NODE_METRICS, SIM_METRICS, NodeRun, Run
from control_node.report.stats import metric_values

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
                text = hgrm_from_counts(rundir.hist_lower_bounds(c.size), c,
                                        buckets=(c.size >> rundir.HIST_SUB_BITS, 1 << rundir.HIST_SUB_BITS))
            elif part.arrays is not None and (not isinstance(part, NodeRun) or part.complete):
                text = hgrm_text(metric_values(part, name))
            else:
                continue  # incomplete ring and no histogram: the ring's tail is not the run
            f.write_text(text)
            files.append(f)
    return files
