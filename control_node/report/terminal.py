"""The report in the terminal (rich tables)."""
from __future__ import annotations

from control_node.report.load import PCT_LABELS, STAT_KEYS, METRIC_TITLES, EXTRA_COUNTERS
from control_node.report.stats import (all_stats, comparison, fmt_num, fmt_us, lifecycle_changed, mode_line, mode_rows,
                                       phase_lock_line,
                                       policy_rate_line, shadow_line, timeline_rows, us_num, why_late_evidence_line,
                                       why_late_rows)


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
                          f"{n.get('cycles')} cycles over {fmt_num(n.get('duration_s'))} s")
            if n.get("policy_rate"):
                console.print(policy_rate_line(n["policy_rate"]))
            if phase_lock_line(n.get("phase_lock")):
                console.print(phase_lock_line(n["phase_lock"]))
            if n.get("copy"):
                console.print(n["copy"])
            if n.get("weights"):
                console.print(f"policy weights: {n['weights']}")
            hi = n.get("history")
            if hi and hi.get("frames", 1) > 1:
                console.print(f"policy input: history of {hi['frames']} frames x {hi['frame_width']} features, "
                              f"{hi['order']}")
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
            wl = n.get("why_late")
            if wl and wl.get("enabled"):
                console.print(f"[bold]why late:[/] {wl.get('text')}")
                rows = why_late_rows(wl)
                if rows:
                    t = Table(title="late cycles and their causes (evidence from the loop's core)")
                    for c in ("cycle", "what", "wake-up", "cycle time", "cause", "evidence"):
                        t.add_column(c, justify="right" if c in ("cycle", "wake-up", "cycle time") else "left")
                    for row in rows:
                        t.add_row(*row)
                    console.print(t)
                console.print(why_late_evidence_line(wl))
            elif wl:
                console.print(f"why late: not collected: {wl.get('detail')}")
            lc = n.get("lifecycle")
            if lifecycle_changed(lc):
                t = Table(title=f"policy timeline (active at the end: {lc.get('active')})")
                for c in ("cycle", "event", "policy", "from", "reason"):
                    t.add_column(c, justify="right" if c == "cycle" else "left")
                for row in timeline_rows(lc):
                    t.add_row(*row)
                console.print(t)
                if shadow_line(lc):
                    console.print(shadow_line(lc))
            lg = n.get("legged")
            if lg:
                console.print(mode_line(lg))
                if mode_rows(lg):
                    t = Table(title="mode timeline (legged)")
                    for c in ("cycle", "t (s)", "from", "to", "reason"):
                        t.add_column(c, justify="right" if c in ("cycle", "t (s)") else "left")
                    for row in mode_rows(lg):
                        t.add_row(*row)
                    console.print(t)
            ac = n.get("actions")
            if ac:
                console.print(actions_line(ac))
                if ac["components"]:
                    t = Table(title=f"published actions, {ac.get('recorded_cycles')} cycles recorded")
                    for c in ("action", "min", "mean", "max"):
                        t.add_column(c, justify="left" if c == "action" else "right")
                    for c in ac["components"]:
                        t.add_row(c["name"], f"{c['min']:.6g}", f"{c['mean']:.6g}", f"{c['max']:.6g}")
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
            acc_text = ("n/a (continuous policy)" if sm.get("policy") == "continuous" or sm.get("control")
                        else "n/a" if acc is None else f"{acc:.4f}")
            console.print(f"{sm.get('role') or 'sim'}: {sm.get('frames_sent')} frames sent, {sm.get('actions_received')} actions received, "
                          f"{sm.get('actions_lost')} lost, "
                          + (f"{sm['frames_held']} answered with a held action, " if sm.get("frames_held") else "")
                          + f"{sm.get('safe_actions')} safe, "
                          f"accuracy {acc_text}"
                          + (f", ran on cores {','.join(map(str, sm['cpus']))}" if sm.get("cpus") else ""))
            if isinstance(sm.get("control"), dict) and sm["control"].get("line"):
                console.print(f"{sm.get('task') or 'sim'} {sm['control']['line']}")
            ex = sm.get("expected")
            if ex:
                console.print(f"expected actions: {ex.get('compared')} compared, {ex.get('mismatches')} mismatches "
                              f"(atol {ex.get('atol')}), max error {ex.get('max_abs_err')}")
        if n:
            v = n["verdict"]
            console.print(("[bold green]" if v["ok"] else "[bold red]") + v["text"] + "[/]")
    if len(summaries) > 1:
        print_comparison(summaries, console)


def actions_line(ac: dict) -> str:
    """``actions: 1000 published (990 policy, 10 safe); safe action "offset" [...]``."""
    sa = ac.get("safe_action") or {}
    safe_u = sa.get("u")
    return (f"actions (continuous policy, {ac.get('n_actions')} actions: {', '.join(ac.get('names') or [])}): "
            f"{ac.get('published')} published, {ac.get('policy')} from the policy, {ac.get('safe')} safe; "
            f"safe action {sa.get('mode')}" + (f" {[round(v, 6) for v in safe_u]}" if safe_u else ""))


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
