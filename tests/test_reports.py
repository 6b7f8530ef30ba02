"""control-node report: run-dir loading, percentiles, plots, HTML, .hgrm, comparison, errors, CLI."""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from control_node import report as R
from control_node import rundir
from control_node.errors import UserError
from control_node.bench.harness import CHILD_CWD, free_tcp_ports, run_cli

PY = sys.executable
LAT_FIELDS = ["wake_latency_ns", "cycle_time_ns", "recv_ns", "infer_ns", "publish_ns", "period_ns_stats",
              "input_age_ns"]


# ------------------------------------------------------------------------------ synthetic run dirs

def _stats(v):
    v = np.asarray(v)
    if v.size == 0:
        return {k: None for k in ("p50", "p90", "p99", "p999", "p9999", "max", "mean")} | {"count": 0}
    q = np.percentile(v, [50, 90, 99, 99.9, 99.99])
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "p999": float(q[3]),
            "p9999": float(q[4]), "max": float(v.max()), "mean": float(v.mean()), "count": int(v.size)}


def make_node_run(d: Path, n=5000, seed=0, complete=True, rate_hz=1000, misses=(1234,), stale=(),
                  run_id=None, total_cycles=None, spike_at=None, scale=1.0) -> Path:
    """Write a node run dir as the node would (summary.json + cycles.npz), per the run-dir spec."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    period = 10**9 // rate_hz
    total = total_cycles or n
    cycle = np.arange(total - n, total, dtype=np.int64)
    wake = (rng.gamma(2.0, 15_000 * scale, n)).astype(np.int64) + 2_000
    recv = rng.integers(1_000, 8_000, n, dtype=np.int64)
    infer = rng.integers(3_000, 12_000, n, dtype=np.int64)
    publish = rng.integers(2_000, 9_000, n, dtype=np.int64)
    ct = recv + infer + publish
    flags = np.full(n, 16, np.uint8)
    for m in misses:
        i = m - cycle[0]
        if 0 <= i < n:
            ct[i] = 1_500_000
            wake[i] = 900_000
            flags[i] |= 1
    if spike_at is not None:
        wake[spike_at] = 5_000_000
    for s in stale:
        i = s - cycle[0]
        if 0 <= i < n:
            flags[i] = (int(flags[i]) | 2 | 8) & 0xEF
    age = rng.integers(20_000, 200_000, n, dtype=np.int64)
    age[::97] = -1
    per = period + np.diff(np.concatenate([[0], wake])).astype(np.int64)
    per[0] = period
    t_tick = (cycle * period).astype(np.int64)
    arrays = dict(cycle=cycle, t_tick_ns=t_tick, wake_latency_ns=wake, recv_ns=recv, infer_ns=infer,
                  publish_ns=publish, cycle_time_ns=ct, period_ns=per, input_age_ns=age, flags=flags,
                  action=rng.integers(0, 3, n).astype(np.int16), seq=np.arange(n, dtype=np.int64))
    np.savez(d / "cycles.npz", **arrays)
    st = {"wake_latency_ns": _stats(wake), "cycle_time_ns": _stats(ct), "recv_ns": _stats(recv),
          "infer_ns": _stats(infer), "publish_ns": _stats(publish), "period_ns_stats": _stats(per),
          "input_age_ns": _stats(age[age >= 0])}
    if not complete:  # the streaming histogram saw more cycles than the ring holds: different numbers
        st = {k: {kk: (vv * 1.5 if isinstance(vv, float) else vv) for kk, vv in s.items()} for k, s in st.items()}
    summary = {
        "role": "node", "format": 1, "run_id": run_id or d.name, "started_at": "2026-11-29T15:00:00+00:00",
        "duration_s": total / rate_hz, "rate_hz": rate_hz, "period_ns": period, "clock_mode": "timer",
        "cycles": total, "achieved_rate_hz": rate_hz * 0.9999, "deadline_misses": len(misses),
        "stale_cycles": len(stale), "safe_actions": len(stale), "superseded": 3, "frames_valid": total - 10,
        "rejected": {"malformed": 2, "non_finite": 1, "oversized": 0}, "rejected_total": 3, **st,
        "worst_cycles": [{"cycle": int(cycle[i]), "wake_latency_ns": int(wake[i]), "cycle_time_ns": int(ct[i]),
                          "flags": int(flags[i])} for i in np.argsort(wake)[::-1][:5]],
        "budget": {"wake_latency_p99_ns": 200_000, "cycle_time_max_ns": 800_000},
        "rt": {"cpu": {"requested": 3, "granted": True, "detail": "pinned to CPU 3"},
               "sched": {"requested": "fifo:80", "granted": False, "detail": "EPERM: no CAP_SYS_NICE"},
               "mlock": {"requested": True, "granted": True, "detail": "mlockall(MCL_CURRENT|MCL_FUTURE)"},
               "gc": {"requested": True, "granted": True, "detail": "gc frozen and disabled"},
               "cpu_dma_latency": {"requested": 0, "granted": False, "detail": "/dev/cpu_dma_latency: EACCES"}},
        "model": {"path": "models/iris.npz", "sha256": "ab" * 32, "layer_sizes": [4, 16, 3], "dtype": "float64",
                  "isa": "avx2"},
        "config": {}, "host": {"cpu_model": "Synthetic CPU", "cores": 8, "kernel": "6.1", "clocksource": "tsc",
                               "python": "3.11"},
        "process": {"rss_bytes": 50_000_000}, "ring": {"capacity": n, "recorded": n, "complete": complete},
    }
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def make_sim_run(d: Path, n=3000, seed=1) -> Path:
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    t_send = np.arange(n, dtype=np.int64) * 1_000_000
    rtt = rng.gamma(3.0, 40_000, n).astype(np.int64)
    rtt[::500] = -1  # lost
    t_act = np.where(rtt >= 0, t_send + rtt, -1)
    truth = rng.integers(0, 3, n).astype(np.int16)
    action = truth.copy()
    action[::50] = (action[::50] + 1) % 3
    np.savez(d / "roundtrip.npz", seq=np.arange(n, dtype=np.int64), t_send_ns=t_send, t_action_ns=t_act,
             rtt_ns=rtt, truth=truth, action=action, safe=np.zeros(n, bool))
    summary = {"role": "sim", "format": 1, "run_id": "sim-" + d.parent.name, "frames_sent": n,
               "actions_received": int((rtt >= 0).sum()), "actions_lost": int((rtt < 0).sum()), "safe_actions": 0,
               "accuracy": float((action == truth).mean()), "round_trip_ns": _stats(rtt[rtt >= 0]),
               "stream": {"rate_hz": 1000}}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def cli(*args, timeout=120):
    return run_cli(*args, timeout=timeout, env={"COLUMNS": "200"})


# ------------------------------------------------------------------------------ percentiles

def test_percentiles_equal_numpy_when_ring_complete(tmp_path):
    d = make_node_run(tmp_path / "r1", n=20000)
    run = R.load_run(d)
    st = R.node_stats(run.node)
    a = np.load(d / "cycles.npz")
    for name, arr in [("wake_latency_ns", a["wake_latency_ns"]), ("infer_ns", a["infer_ns"]),
                      ("period_ns", a["period_ns"]), ("input_age_ns", a["input_age_ns"][a["input_age_ns"] >= 0])]:
        expect = np.percentile(arr, [50, 90, 99, 99.9, 99.99])
        got = [st[name][k] for k in ("p50", "p90", "p99", "p999", "p9999")]
        assert got == [float(x) for x in expect], name
        assert st[name]["max"] == arr.max()
        assert st[name]["source"] == "arrays"
    assert st["input_age_ns"]["count"] == int((a["input_age_ns"] >= 0).sum())


def test_summary_is_authority_when_ring_incomplete(tmp_path):
    d = make_node_run(tmp_path / "r", n=3000, complete=False, total_cycles=100000, misses=(99500,))
    run = R.load_run(d)
    st = R.node_stats(run.node)
    s = json.loads((d / "summary.json").read_text())
    assert st["wake_latency_ns"]["p99"] == s["wake_latency_ns"]["p99"]
    assert st["wake_latency_ns"]["source"] == "summary"
    ev = R.worst_events(run.node)
    assert ev["source"] == "summary"
    summ = R.run_summary(run)
    assert "incomplete" in summ["node"]["percentile_method"]


def test_null_latency_fields_allowed(tmp_path):
    d = make_node_run(tmp_path / "r", n=100, complete=False)
    s = json.loads((d / "summary.json").read_text())
    s["input_age_ns"] = {k: None for k in ("p50", "p90", "p99", "p999", "p9999", "max", "mean")} | {"count": 0}
    (d / "summary.json").write_text(json.dumps(s))
    rs = R.run_summary(R.load_run(d))
    assert rs["node"]["stats"]["input_age_ns"]["p99"] is None


def test_worst_events_and_verdict(tmp_path):
    d = make_node_run(tmp_path / "r", n=5000, misses=(100, 4000))
    run = R.load_run(d)
    ev = R.worst_events(run.node)
    assert sorted(ev["deadline_miss_cycles"]) == [100, 4000]
    assert ev["worst_cycles"][0]["wake_latency_ns"] == 900_000
    v = R.verdict(run.node, R.node_stats(run.node))
    assert not v["ok"] and v["text"].startswith("FAIL") and "2 deadline misses" in v["text"]
    d2 = make_node_run(tmp_path / "ok", n=5000, misses=())
    run2 = R.load_run(d2)
    v2 = R.verdict(run2.node, R.node_stats(run2.node))
    assert v2["ok"], v2["text"]
    assert "wake-up p99" in v2["text"]
    # a budget that allows misses (the other budgets opened wide): 2 pass a budget of 2, not of 1
    for allowed, ok in ((2, True), (1, False)):
        s = json.loads((d / "summary.json").read_text())
        s["budget"] = {"wake_latency_p99_ns": 10**9, "cycle_time_max_ns": 10**9, "deadline_misses": allowed}
        (d / "summary.json").write_text(json.dumps(s))
        run = R.load_run(d)
        v = R.verdict(run.node, R.node_stats(run.node))
        assert v["ok"] is ok and f"2 deadline misses {'within' if ok else 'over'} budget {allowed}" in v["text"]


# ------------------------------------------------------------------------------ decimation / long runs

def test_decimate_keeps_spikes_and_is_bounded():
    from control_node.report.plots import bucket_any, decimate_minmax
    y = np.zeros(3_600_000, np.int64)
    y[1_234_567] = 10**7
    y[17] = -5
    starts, lo, hi = decimate_minmax(y)
    assert len(starts) == 4000 and starts[0] == 0
    assert hi.max() == 10**7 and lo.min() == -5
    mask = np.zeros(y.size, bool)
    mask[3_599_999] = True
    assert bucket_any(mask, starts)[-1] and bucket_any(mask, starts).sum() == 1
    s2, lo2, hi2 = decimate_minmax(np.arange(10))
    assert list(s2) == list(range(10)) and list(hi2) == list(range(10))


@pytest.mark.slow
def test_long_run_report(tmp_path):
    """3.6M cycles (an hour at 1 kHz): the whole report, plots included, in O(n) numpy."""
    d = make_node_run(tmp_path / "hour", n=3_600_000, misses=(2_000_000,), stale=(5, 3_000_000),
                      spike_at=1_800_000)
    doc, out = R.generate([d])
    node = doc["runs"][0]["node"]
    assert node["stats"]["wake_latency_ns"]["max"] == 5_000_000
    assert node["stats"]["wake_latency_ns"]["count"] == 3_600_000
    for f in ("timeline.png", "histogram.png", "percentiles.png", "phases.png", "wake_latency.hgrm"):
        assert (out / f).stat().st_size > 1000, f


# ------------------------------------------------------------------------------ outputs

def test_full_report_outputs(tmp_path):
    launch = tmp_path / "launch1"
    make_node_run(launch / "node", n=8000, misses=(1234,), stale=(10, 11, 12), run_id="launch1")
    make_sim_run(launch / "sim")
    r = cli("report", launch)
    assert r.returncode == 0, r.stderr
    out = launch / "report"
    text = r.stdout
    for needle in ["wake-up latency", "recv phase", "infer phase", "publish phase", "cycle time", "period",
                   "input age", "sim round trip", "p99.99", "deadline misses", "1234", "malformed 2",
                   "non_finite 1", "superseded", "refused", "EPERM", "granted", "FAIL"]:
        assert needle in text, needle
    for f in ("report.html", "report.json", "histogram.png", "timeline.png", "phases.png", "percentiles.png",
              "wake_latency.hgrm", "cycle_time.hgrm", "recv.hgrm", "infer.hgrm", "publish.hgrm", "period.hgrm",
              "input_age.hgrm", "round_trip.hgrm"):
        assert (out / f).is_file(), f
    for f in out.glob("*.png"):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html), "external resource in report.html"
    assert "<link" not in html and "<script" not in html
    for m in re.finditer(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html):
        assert base64.b64decode(m.group(1))[:4] == b"\x89PNG"
    assert "EPERM: no CAP_SYS_NICE" in html and "sim round trip" in html
    doc = json.loads((out / "report.json").read_text())
    assert doc["runs"][0]["sim"]["stats"]["round_trip_ns"]["count"] == 3000 - 6


def test_json_flag_and_no_plots(tmp_path):
    d = make_node_run(tmp_path / "run1", n=2000, misses=())
    r = cli("report", d, "--json", "--no-plots", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    node = doc["runs"][0]["node"]
    a = np.load(d / "cycles.npz")
    assert node["stats"]["cycle_time_ns"]["p99"] == float(np.percentile(a["cycle_time_ns"], 99))
    assert node["verdict"]["ok"] is True
    assert node["rt"]["sched"]["granted"] is False
    assert not list((tmp_path / "o").glob("*.png"))
    assert (tmp_path / "o" / "report.html").is_file()


def test_hgrm_format(tmp_path):
    v = np.array([100, 200, 300, 1000, 5000]) * 1000
    text = R.hgrm_text(v)
    lines = text.splitlines()
    assert lines[0].split() == ["Value", "Percentile", "TotalCount", "1/(1-Percentile)"]
    assert lines[1] == ""
    assert lines[2].split() == ["100.000", "0.000000000000", "1", "1.00"]
    assert lines[3].split() == ["100.000", "0.100000000000", "1", "1.11"]
    assert lines[-4].split() == ["5000.000", "1.000000000000", "5"]
    assert lines[-3].startswith("#[Mean    =     1320.000, StdDeviation   =")
    assert float(lines[-3].split("=")[-1].rstrip("]")) == pytest.approx(np.std(v) / 1e3, abs=1e-3)
    assert lines[-2] == "#[Max     =     5000.000, Total count    =            5]"
    assert lines[-1].startswith("#[Buckets =")
    # ticks follow HdrHistogram's PercentileIterator: 0, 10, 20 ... 50, 55, 60 ... 75, 77.5 ...
    rng = np.random.default_rng(3)
    big = rng.integers(1000, 10**6, 100_000)
    rows = [ln.split() for ln in R.hgrm_text(big).splitlines()[2:] if ln and not ln.startswith("#")]
    pct = [float(r[1]) for r in rows]
    assert pct[:8] == pytest.approx([0, .1, .2, .3, .4, .5, .55, .6])
    assert all(b >= a for a, b in zip(pct, pct[1:]))
    srt = np.sort(big)
    for r in rows[1:-1]:  # value = first sample whose cumulative count reaches the percentile
        p, val, cnt = float(r[1]), float(r[0]), int(r[2])
        need = max(1, int(np.ceil(p * big.size - 1e-6)))
        assert val == pytest.approx(srt[need - 1] / 1e3, abs=6e-4)
        assert cnt == np.searchsorted(srt, srt[need - 1], side="right")
    assert float(rows[-1][0]) == pytest.approx(srt[-1] / 1e3)


def test_hgrm_against_hdrhistogram_package():
    """Values agree with the hdrhistogram package's histogram within its 3 significant digits."""
    from hdrh.histogram import HdrHistogram
    rng = np.random.default_rng(5)
    v = (rng.lognormal(3, 0.6, 20000) * 1000).astype(np.int64)
    h = HdrHistogram(1, 10**10, 3)
    for x in v:
        h.record_value(int(x))
    for line in R.hgrm_text(v).splitlines()[2:-4]:
        val, p = float(line.split()[0]), float(line.split()[1])
        # the package rounds the count to the nearest (Java: ceil), so allow the next order statistic
        refs = [h.get_value_at_percentile(min(100.0, p * 100 + d * 100 / v.size)) / 1e3 for d in (0, 1)]
        assert any(val == pytest.approx(ref, rel=2e-3, abs=2e-3) for ref in refs), (line, refs)


def test_comparison_two_runs(tmp_path):
    a = make_node_run(tmp_path / "base", n=4000, seed=1, misses=(), run_id="base")
    b = make_node_run(tmp_path / "slow", n=4000, seed=1, misses=(), run_id="slow", scale=2.0)
    out = tmp_path / "cmp"
    r = cli("report", a, b, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "comparison" in r.stdout and "ratio" in r.stdout
    doc = json.loads((out / "report.json").read_text())
    rows = {(x["metric"], x["stat"]): x for x in doc["comparison"]}
    wa = doc["runs"][0]["node"]["stats"]["wake_latency_ns"]["p99"]
    wb = doc["runs"][1]["node"]["stats"]["wake_latency_ns"]["p99"]
    assert rows[("wake_latency_ns", "p99")]["ratios"][0] == pytest.approx(wb / wa)
    assert 1.5 < wb / wa < 2.1
    assert rows[("infer_ns", "p50")]["ratios"][0] == pytest.approx(1.0)
    html = (out / "report.html").read_text()
    assert "Comparison" in html and "ratio slow / base" in html
    assert (out / "1-base" / "timeline.png").is_file() and (out / "2-slow" / "timeline.png").is_file()
    assert (out / "comparison.png").is_file()


def test_launch_dir_with_replay(tmp_path):
    launch = tmp_path / "l"
    make_node_run(launch / "node", n=1000, misses=())
    make_sim_run(launch / "replay")
    s = json.loads((launch / "replay" / "summary.json").read_text())
    s["role"] = "replay"
    (launch / "replay" / "summary.json").write_text(json.dumps(s))
    rs = R.run_summary(R.load_run(launch))
    assert rs["sim"]["role"] == "replay" and rs["sim"]["stats"]["round_trip_ns"]["count"] > 0
    assert rs["node"]["stats"]["wake_latency_ns"]["count"] == 1000


def test_sim_only_run(tmp_path):
    d = make_sim_run(tmp_path / "l" / "simrun")
    doc, out = R.generate([d])
    assert doc["runs"][0]["sim"]["stats"]["round_trip_ns"]["source"] == "arrays"
    assert (out / "round_trip.hgrm").is_file() and (out / "percentiles.png").is_file()


def hist_index(v):
    """numpy version of control_node/loop/rt_hist.h's cn_hist_index."""
    v = np.maximum(np.asarray(v, dtype=np.int64), 0)
    e = np.floor(np.log2(np.maximum(v, 1))).astype(np.int64)
    big = v >= 128
    e = np.where(big & ((np.int64(1) << e) > v), e - 1, e)  # guard float rounding
    mant = (v >> np.maximum(e - 7, 0)) & 127
    return np.where(big, ((e - 6) << 7) + mant, v)


def test_incomplete_ring_uses_streaming_histograms(tmp_path):
    d = make_node_run(tmp_path / "r", n=2000, complete=False, total_cycles=50000, misses=())
    rng = np.random.default_rng(9)
    whole = {"wake_latency_ns": rng.gamma(2.0, 15_000, 50000).astype(np.int64),
             "cycle_time_ns": rng.integers(5_000, 30_000, 50000)}
    whole["wake_latency_ns"][123] = 7_777_777
    hist = {k: np.bincount(hist_index(v), minlength=(64 - 7) << 7) for k, v in whole.items()}
    np.savez(d / "histograms.npz", **hist)
    lows = rundir.hist_lower_bounds((64 - 7) << 7)
    assert lows[hist_index([0, 127, 128, 255, 256, 1000, 7_777_777])].tolist() == [0, 127, 128, 255, 256, 1000, 7_766_016]
    doc, out = R.generate([d])
    text = (out / "wake_latency.hgrm").read_text()
    assert "Total count    =        50000]" in text
    assert "#[Max     =     7766.016" in text
    assert not (out / "recv.hgrm").exists()  # no histogram for it and the ring is only the tail
    q = rundir.hist_quantiles(hist["wake_latency_ns"], [50.0, 99.0])
    exact = np.percentile(whole["wake_latency_ns"], [50, 99])
    assert np.all(q <= exact + 1) and np.all(q >= exact * 0.99 - 1)  # bucket lower bounds, <= 0.8% low
    assert (out / "percentiles.png").is_file()


# ------------------------------------------------------------------------------ errors

def _err(path, *needles):
    with pytest.raises(UserError) as e:
        R.load_run(path)
    msg = str(e.value)
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_errors_name_the_file(tmp_path):
    _err(tmp_path / "nope", "no such run dir")
    f = tmp_path / "file.txt"
    f.write_text("x")
    _err(f, "not a directory")
    (tmp_path / "empty").mkdir()
    _err(tmp_path / "empty", "empty directory")

    d = make_node_run(tmp_path / "nosum", n=100)
    (d / "summary.json").unlink()
    _err(d, "summary.json", "missing")

    d = make_node_run(tmp_path / "badjson", n=100)
    (d / "summary.json").write_text('{"role": "node", "form')
    _err(d, "summary.json", "not valid JSON")

    d = make_node_run(tmp_path / "fmt", n=100)
    s = json.loads((d / "summary.json").read_text())
    s["format"] = 2
    (d / "summary.json").write_text(json.dumps(s))
    _err(d, "summary.json", "format 2")

    d = make_node_run(tmp_path / "trunc", n=5000)
    raw = (d / "cycles.npz").read_bytes()
    (d / "cycles.npz").write_bytes(raw[: len(raw) // 2])
    _err(d, "cycles.npz", "corrupt or truncated")

    d = make_node_run(tmp_path / "nonpz", n=100)
    (d / "cycles.npz").unlink()
    _err(d, "cycles.npz", "missing")

    d = make_node_run(tmp_path / "lack", n=100)
    with np.load(d / "cycles.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "flags"}
    np.savez(d / "cycles.npz", **arrays)
    _err(d, "cycles.npz", "flags")

    d = make_node_run(tmp_path / "ragged", n=100)
    with np.load(d / "cycles.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["seq"] = arrays["seq"][:50]
    np.savez(d / "cycles.npz", **arrays)
    _err(d, "cycles.npz", "different lengths")

    d = make_node_run(tmp_path / "badhist", n=100)
    (d / "histograms.npz").write_bytes(b"PK\x03\x04garbage")
    _err(d, "histograms.npz", "corrupt or truncated")

    d = make_node_run(tmp_path / "launchbad" / "node", n=100)
    (tmp_path / "launchbad" / "sim").mkdir()
    _err(tmp_path / "launchbad", str(tmp_path / "launchbad" / "sim" / "summary.json"))


def test_cli_error_is_message_not_traceback(tmp_path):
    d = make_node_run(tmp_path / "trunc", n=3000)
    raw = (d / "cycles.npz").read_bytes()
    (d / "cycles.npz").write_bytes(raw[:100])
    r = cli("report", d)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "control-node report: error:" in r.stderr and "cycles.npz" in r.stderr


# ------------------------------------------------------------------------------ real node

@pytest.mark.slow
def test_real_node_run_report(tmp_path, iris_model_path):
    """A real short node run with the simulator, laid out as a launch dir (node/ + sim/), reported."""
    ports = free_tcp_ports(3)
    cfg = tmp_path / "node.toml"  # private TCP endpoints: no clash with other nodes on this host
    cfg.write_text("[endpoints]\n" + "".join(f'{k} = "tcp://127.0.0.1:{p}"\n'
                                             for k, p in zip(("sensor", "action", "diagnostics"), ports)))
    launch = tmp_path / "launch"
    # --duration is a cap: SIGINT ends the node once the simulator is done (a fixed 3 s ran out before a
    # simulator started on a loaded host)
    node = subprocess.Popen([PY, "-m", "control_node", "run", "--config", cfg, "--model", iris_model_path,
                             "--duration", "120", "--cpu", "none", "--run-dir", launch / "node"], cwd=CHILD_CWD,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ)
    try:
        ready = ""
        for line in node.stdout:            # the node's [node] lines, then `ready`
            ready += line
            if line.startswith("ready"):
                break
        assert "\nready" in "\n" + ready, ready + (node.communicate(timeout=30)[0] if node.poll() is not None else "")
        sim = cli("sim", "--config", cfg, "--duration", "1.5", "--run-dir", launch / "sim", timeout=60)
        node.send_signal(signal.SIGINT)
        node_out, _ = node.communicate(timeout=60)
        node_out = ready + node_out
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    assert node.returncode == 0, node_out
    assert str(launch / "node") in node_out  # the node prints its run dir
    assert sim.returncode == 0, "sim failed: " + sim.stdout + sim.stderr
    r2 = cli("report", launch, "--out", tmp_path / "rep", "--json")
    assert r2.returncode == 0, r2.stderr
    doc = json.loads(r2.stdout)
    node = doc["runs"][0]["node"]
    assert node["cycles"] > 1000
    assert node["ring"]["complete"]          # 3 s of cycles fit the default 600k-cycle ring
    with np.load(Path(node["path"]) / "cycles.npz") as z:
        assert node["stats"]["wake_latency_ns"]["p99"] == float(np.percentile(z["wake_latency_ns"], 99))
        assert node["stats"]["cycle_time_ns"]["max"] == z["cycle_time_ns"].max()
    assert doc["runs"][0]["sim"]["stats"]["round_trip_ns"]["count"] > 0
    for f in ("report.html", "wake_latency.hgrm", "timeline.png"):
        assert (tmp_path / "rep" / f).is_file(), f
