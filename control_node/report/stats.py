"""The report's statistics: percentiles of raw arrays (numpy linear) or of summary.json, worst
events, the verdict against the run's budget, the machine-readable run summary and comparisons.
"""
from __future__ import annotations

import numpy as np

from control_node.rundir import FLAG_MISS, copy_line
from control_node.report.load import PCTS, STAT_KEYS, NODE_METRICS, SIM_METRICS, EXTRA_COUNTERS, NodeRun, SimRun, Run

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


def action_summary(node: NodeRun) -> dict | None:
    """A continuous policy's actions: how many the node published, how many were the policy's and how many
    the safe action, and per component min / mean / max of the published actions in actions.npz."""
    s = node.summary
    pol = s.get("policy") or {}
    if pol.get("kind") != "continuous":
        return None
    cycles, safe = s.get("cycles"), s.get("safe_actions")
    out = {"n_actions": pol.get("n_actions"), "names": pol.get("action_names"), "published": cycles,
           "safe": safe, "policy": (cycles - safe) if isinstance(cycles, int) and isinstance(safe, int) else None,
           "safe_action": s.get("safe_action"), "ring": s.get("action_ring"), "components": []}
    a = node.actions
    if a is not None:
        u = np.asarray(a["u"], dtype=np.float64)
        names = pol.get("action_names") or []
        for j in range(u.shape[1]):
            col = u[:, j]
            out["components"].append({"name": names[j] if j < len(names) else f"u{j}", "min": float(col.min()),
                                      "mean": float(col.mean()), "max": float(col.max())})
        out["recorded_cycles"] = int(u.shape[0])
    return out


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
            "policy_kind": (s.get("policy") or {}).get("kind", "argmax"), "actions": action_summary(node),
            # loop rate vs policy rate, and an inference tick's cost against a hold tick's (None: older runs)
            "policy_rate": s.get("policy_rate"), "history": (s.get("policy") or {}).get("history"),
            "phase_lock": s.get("phase_lock"),
            # weight storage and its measured error (issue #24; older runs: f32, nothing measured)
            "weights": weights_line(s.get("policy") or {}),
            # the kernel's vector copy and how it was chosen (issue #47; older runs: not recorded)
            "copy": copy_line((s.get("model") or {}).get("copy")),
            # policies switched, shadowed, rolled back while the loop ran (None: older runs)
            "lifecycle": s.get("lifecycle"),
            "legged": s.get("legged"),           # the legged deploy path: output, mode timeline, counts
            # each miss and the worst wake-ups with a cause, from evidence about the loop's core (None: older)
            "why_late": s.get("why_late"),
        }
    if run.sim is not None:
        s = run.sim.summary
        out["sim"] = {"path": str(run.sim.path), "role": s.get("role"), **{k: s.get(k) for k in
                      ("frames_sent", "actions_received", "actions_lost", "frames_held", "safe_actions", "accuracy", "stream",
                       "expected", "control", "task", "cpus")},
                      "policy": s.get("policy", "argmax"),
                      "stats": sim_stats(run.sim)}
    return out


def weights_line(policy: dict) -> str:
    """What the run's weights were (summary.json ``policy.weights`` / ``weights_error``, the fields of
    kernels.weights.measure_error): 'f32 (exact)', or the storage with the error measured at import."""
    w, e = policy.get("weights", "f32"), policy.get("weights_error") or {}
    if w == "f32":
        return "f32 (exact)"
    if not e:
        return f"{w} (no error recorded)"
    return (f"{w}: max |error| {e['max_abs']:.3g} (p99 {e['p99_abs']:.3g}) = {e['max_rel']:.3g} of the "
            f"{'action' if e.get('measured_on') == 'actions' else 'logit'} range (tolerance {e['tolerance']:g}) "
            f"over {e['samples']} observations")


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


def policy_rate_line(pr: dict | None) -> str:
    """``loop 1000 Hz, policy 50 Hz (decimation 20): 150 inference ticks, cycle time p50 4.1 us p99 6.0 us;
    2850 hold ticks, p50 2.0 us p99 3.1 us`` from summary.json ``policy_rate``; "" when absent."""
    if not pr:
        return ""

    def part(name, count, d):
        d = d or {}
        return f"{count} {name} ticks, cycle time p50 {fmt_us(d.get('p50'))} p99 {fmt_us(d.get('p99'))}"
    return (f"loop {pr.get('loop_rate_hz'):g} Hz, policy {pr.get('policy_rate_hz'):g} Hz (decimation "
            f"{pr.get('decimation')}): " + part("inference", pr.get("inference_ticks"), pr.get("cycle_time_infer_ns"))
            + "; " + part("hold", pr.get("hold_ticks"), pr.get("cycle_time_hold_ns"))
            + (f" ({pr['source']})" if pr.get("source") else ""))


def phase_lock_line(pl: dict | None) -> str:
    """``phase lock: margin 100 us, 812 shifts (net +203.4 us, largest 10.0 us), frame lead p50 98.2 us``;
    "" when it was off or the run predates it."""
    if not pl or not pl.get("enabled"):
        return ""
    lead = pl.get("frame_lead_ns") or {}
    net = pl.get("net_shift_ns") or 0
    return (f"phase lock: margin {fmt_us(pl.get('margin_ns'))}, {pl.get('shifts')} shifts (net "
            f"{'+' if net >= 0 else '-'}{fmt_us(abs(net))}, largest {fmt_us(pl.get('max_shift_ns'))}, bound "
            f"{fmt_us(pl.get('max_slew_ns_per_cycle'))} per cycle), frame lead p50 {fmt_us(lead.get('p50'))} "
            f"p99 {fmt_us(lead.get('p99'))}")


def fmt_num(x, digits=3) -> str:
    """A float with ``digits`` decimals; anything else as str()."""
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


def lifecycle_changed(lc: dict | None) -> bool:
    """True when the run did more than start its one policy (a load, switch, shadow, refusal...)."""
    return bool(lc) and any(e.get("reason") != "start-up policy" for e in lc.get("transitions") or [])


def timeline_rows(lc: dict | None) -> list[list[str]]:
    """The policy timeline: [cycle, event, policy, from, reason] per transition of summary.json
    ``lifecycle`` (the start-up load and activation included)."""
    return [[str(e.get("cycle")), str(e.get("event")), str(e.get("policy") or "-"), str(e.get("from") or "-"),
             str(e.get("reason") or "")] for e in (lc or {}).get("transitions") or []]


def mode_rows(lg: dict | None) -> list[list[str]]:
    """A legged run's mode timeline: [cycle, time (s), from, to, reason] per transition of summary.json
    ``legged`` (passive, damping, stand, policy; docs/legged.md)."""
    return [[str(t.get("cycle")), f"{t.get('t_s', 0):.3f}", str(t.get("from")), str(t.get("to")),
             str(t.get("reason"))] for t in (lg or {}).get("transitions") or []]


def mode_line(lg: dict | None) -> str:
    """``legged: output torque, mode at the end policy; cycles passive 499, stand 400, policy 2101; stale trips 0,
    non-finite 0, torque clipped 12 cycles``; "" for a run without a [legged] recipe."""
    if not lg:
        return ""
    c = lg.get("counts") or {}
    by = lg.get("cycles_by_mode") or {}
    return (f"legged: output {lg.get('output')}, mode at the end {lg.get('mode')}; cycles "
            + ", ".join(f"{m} {n}" for m, n in by.items() if n)
            + f"; stale trips {c.get('stale_trips', 0)}, non-finite {c.get('non_finite_trips', 0)}, torque clipped "
              f"{c.get('tau_clipped', 0)} cycles, PD ramp {c.get('pd_ramp_ticks', 0)} cycles, refused requests "
              f"{c.get('refused', 0)}")


def shadow_line(lc: dict | None) -> str:
    """``shadow: 300 ticks, 41 disagree (13.7%), 0 non-finite; cost p50 1.4 us p99 2.9 us; distance p50 ...``
    from summary.json ``lifecycle.shadow_figures``; "" when no shadow ran."""
    sf = (lc or {}).get("shadow_figures") or {}
    if not sf.get("ticks"):
        return ""
    ring = (sf.get("cost_ns") or {}).get("ring") or {}
    d = sf.get("distance")
    rate = sf.get("disagree_rate")
    return (f"shadow{' ' + sf['policy'] if sf.get('policy') else ''}: {sf['ticks']} policy ticks, {sf['disagree']} "
            f"disagree ({'-' if rate is None else f'{rate:.1%}'}), {sf.get('non_finite')} non-finite; added time "
            f"after the publish p50 {fmt_us(ring.get('p50'))} p99 {fmt_us(ring.get('p99'))} max "
            f"{fmt_us((sf.get('cost_ns') or {}).get('max'))}"
            + (f"; distance p50 {d['p50']:.3g} p99 {d['p99']:.3g} max {d['max']:.3g}"
               + (f" (threshold {sf['distance_threshold']:g})" if sf.get("distance_threshold") is not None else "")
               if d else ""))


def why_late_rows(wl: dict | None, n: int = 12) -> list[list[str]]:
    """The explained late cycles, misses first then by lateness: [cycle, miss, wake-up, cycle time, cause,
    evidence] (at most ``n``)."""
    events = sorted((wl or {}).get("events") or [], key=lambda e: (not e.get("miss"), -(e.get("lateness_us") or 0)))
    rows = []
    for e in events[:n]:
        seen = ", ".join(f"{k} {v:g} us" for k, v in (e.get("seen") or {}).items())
        extra = [seen] if seen else []
        if e.get("page_faults"):
            extra.append(f"{e['page_faults']} page faults")
        if e.get("steal_ms"):
            extra.append(f"steal +{e['steal_ms']:g} ms")
        if e.get("timer_irq_late_us") is not None and e["timer_irq_late_us"] >= 10:
            extra.append(f"timer interrupt {e['timer_irq_late_us']:.0f} us late")
        if e.get("why"):
            extra.append(e["why"])
        rows.append([str(e.get("cycle")), "miss" if e.get("miss") else "late wake", fmt_us(e.get("wake_latency_ns")),
                     fmt_us(e.get("cycle_time_ns")), str(e.get("cause")), "; ".join(extra) or "-"])
    return rows


def why_late_evidence_line(wl: dict | None) -> str:
    """``evidence: trace granted, steal granted, smi not granted (...), collecting it took 9.8% of one core``."""
    ev = (wl or {}).get("evidence") or {}
    parts = []
    for k, v in ev.items():
        if isinstance(v, dict) and "granted" in v:
            parts.append(f"{k} {'granted' if v['granted'] else 'not granted'}" + ("" if v["granted"] else
                                                                                    f" ({v.get('detail')})"))
    cost = ev.get("recorder_cost") or {}
    if cost.get("share_of_one_core") is not None:
        parts.append(f"collecting it took {100 * cost['share_of_one_core']:.1f}% of one core")
    return "evidence: " + ", ".join(parts) if parts else ""
