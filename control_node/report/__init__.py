"""Jitter reports from run directories (``control-node report``).

Loading and validating run dirs, the statistics (percentiles, worst events, verdict), the
machine-readable summary, the terminal tables, the self-contained HTML page and the HdrHistogram
``.hgrm`` percentile-distribution files. 

Percentile method: when a node's ring holds every cycle of the run (``ring.complete``) the
percentiles are recomputed from the raw arrays with ``numpy.percentile`` and its default ``linear``
method (type 7 of Hyndman & Fan: linear interpolation between the two nearest order statistics);
otherwise they are taken from ``summary.json`` (the node's streaming histogram, the authority).
Everything is O(n) or O(n log n) numpy; nothing loops over cycles in Python.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from control_node import rundir
from control_node.errors import UserError
from control_node.report.hgrm import hgrm_from_counts, hgrm_text, write_hgrms  # noqa: F401
from control_node.report.html import build_html
from control_node.report.load import (EXTRA_COUNTERS, METRIC_TITLES, NODE_METRICS, PCT_LABELS, PCTS,  # noqa: F401
                                      SIM_METRICS, STAT_KEYS, NodeRun, Run, SimRun, load_run)
from control_node.report.stats import (all_stats, array_stats, comparison, fmt_us, metric_values,  # noqa: F401
                                       node_stats, run_summary, sim_stats, verdict, worst_events)
from control_node.report.terminal import print_comparison, print_terminal  # noqa: F401


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
            from control_node.report import plots as P
            pngs = P.run_plots(r)
            for k, png in pngs.items():
                (d / f"{k}.png").write_bytes(png)
                files.append(str(d / f"{k}.png"))
        summaries[i]["files"] = files
        per_run_pngs.append(pngs)
    compare_png = None
    if plots and len(runs) > 1:
        from control_node.report import plots as P
        compare_png = P.comparison_plot(runs)
        if compare_png:
            (out / "comparison.png").write_bytes(compare_png)
    (out / "report.html").write_text(build_html(summaries, per_run_pngs, compare_png))
    doc = _jsonable({"format": rundir.REPORT_FORMAT, "runs": summaries,
                     "comparison": comparison(summaries) if len(summaries) > 1 else None,
                     "html": str(out / "report.html")})
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc, out


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)[:64]
