"""The report as one self-contained HTML page (plots inlined as PNG).
"""
from __future__ import annotations

import html

from control_node import rundir
from control_node.report.load import PCT_LABELS, STAT_KEYS, METRIC_TITLES, EXTRA_COUNTERS
from control_node.report.stats import (all_stats, comparison, fmt_num, fmt_us, lifecycle_changed, mode_line, mode_rows,
                                       phase_lock_line,
                                       policy_rate_line, shadow_line, timeline_rows, us_num, why_late_evidence_line,
                                       why_late_rows)

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
            ["duration", _h(fmt_num(n.get("duration_s"))) + " s"],
            ["rate", f"{_h(None if rate is None else f'{rate:.3f}')} Hz achieved / {_h(n.get('rate_hz'))} Hz configured"],
            ["clock mode", _h(n.get("clock_mode"))], ["cycles", _h(n.get("cycles"))],
            *([["policy rate", _h(policy_rate_line(n["policy_rate"]))]] if n.get("policy_rate") else []),
            *([["phase lock", _h(phase_lock_line(n["phase_lock"]))]] if phase_lock_line(n.get("phase_lock"))
              else []),
            *([["policy weights", _h(n["weights"])]] if n.get("weights") else []),
            *([["kernel copy", _h(n["copy"])]] if n.get("copy") else []),
            *([["policy input", _h(f"history {n['history']['frames']} x {n['history']['frame_width']} features, "
                                   f"{n['history']['order']}")]]
              if (n.get("history") or {}).get("frames", 1) > 1 else []),
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
        wl = n.get("why_late")
        if wl and wl.get("enabled"):
            parts.append(f"<h3>Why late</h3><p>{_h(wl.get('text'))}</p><p class='note'>"
                         f"{_h(why_late_evidence_line(wl))}</p>"
                         + _table(["cycle", "what", "wake-up", "cycle time", "cause", "evidence"],
                                  [[_h(c) for c in row] for row in why_late_rows(wl, 50)], numeric_from=2,
                                  numeric_to=4))
        elif wl:
            parts.append(f"<h3>Why late</h3><p class='note'>not collected: {_h(wl.get('detail'))}</p>")
        lc = n.get("lifecycle")
        if lifecycle_changed(lc):
            parts.append(f"<h3>Policy timeline</h3><p class='note'>active at the end: {_h(lc.get('active'))}"
                         + (f"; {_h(shadow_line(lc))}" if shadow_line(lc) else "") + "</p>"
                         + _table(["cycle", "event", "policy", "from", "reason"],
                                  [[_h(c) for c in row] for row in timeline_rows(lc)], numeric_from=0, numeric_to=1))
        lg = n.get("legged")
        if lg:
            parts.append(f"<h3>Mode timeline (legged)</h3><p class='note'>{_h(mode_line(lg))}</p>"
                         + _table(["cycle", "t (s)", "from", "to", "reason"],
                                  [[_h(c) for c in row] for row in mode_rows(lg)], numeric_from=0, numeric_to=2))
        ac = n.get("actions")
        if ac:
            sa = ac.get("safe_action") or {}
            parts.append(f"<h3>Actions (continuous policy, {_h(ac.get('n_actions'))} actions)</h3>" + _table(
                ["what", "count", "detail"],
                [["actions published", _h(ac.get("published")), ""],
                 ["from the policy", _h(ac.get("policy")), ""],
                 ["safe actions", _h(ac.get("safe")), _h(f"{sa.get('mode')} {sa.get('u')}")]],
                numeric_from=1, numeric_to=2))
            if ac["components"]:
                parts.append(_table(["action", "min", "mean", "max"],
                                    [[_h(c["name"]), _h(f"{c['min']:.6g}"), _h(f"{c['mean']:.6g}"),
                                      _h(f"{c['max']:.6g}")] for c in ac["components"]]))
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
                  _h(rundir.flag_names(w.get("flags", 0)))] for w in wc]))
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
        rows = [[_h(k), _h(sm.get(k))] for k in ("frames_sent", "actions_received", "actions_lost", "frames_held", "safe_actions")
                if k != "frames_held" or sm.get(k) is not None]
        rows.append(["accuracy", "n/a (continuous policy)" if sm.get("policy") == "continuous"
                     else _h(sm.get("accuracy"))])
        if isinstance(sm.get("control"), dict) and sm["control"].get("line"):
            rows.append(["control score", _h(sm["control"]["line"].removeprefix("control: "))])
        if sm.get("expected"):
            ex = sm["expected"]
            rows.append(["expected actions", _h(f"{ex.get('compared')} compared, {ex.get('mismatches')} mismatches "
                                                f"(atol {ex.get('atol')})")])
        parts.append("<h3>Simulator</h3>" + _table(None, rows, numeric_from=1))
    titles = {"histogram": "Latency histogram", "timeline": "Wake-up latency timeline", "phases": "Per-phase breakdown",
              "percentiles": "Percentile distribution", "actions": "Published actions over time",
              "control": "Control trace"}
    for key, title in titles.items():
        if pngs.get(key):
            parts.append(f"<h3>{title}</h3>" + _img(pngs[key], title))
    return "\n".join(parts)


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
