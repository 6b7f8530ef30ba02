"""bench policy / bench recurrent run end to end (tiny sample counts: behaviour, not speed): every row was
checked against the reference before it was timed, and the record holds what the docs quote."""
import json
import subprocess
import sys

import pytest

from control_node.bench.harness import CHILD_CWD, child_env


def run_bench(what, tmp_path, *args):
    out = tmp_path / f"{what}.json"
    r = subprocess.run([sys.executable, "-m", "control_node", "bench", what, "--samples", "5", "--chunks", "5",
                        "--chunk", "20", *args, "--json", str(out)], cwd=CHILD_CWD, env=child_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), r.stdout


@pytest.mark.parametrize("what, shape, extra", [
    ("policy", "SB3 PPO 3-64-64-1 tanh", ()),
    ("recurrent", "G1 LSTM(47->64) + 64-32-12 ELU", ("--alloc-calls", "200")),
])
@pytest.mark.slow
def test_bench_runs_and_records_every_row(what, shape, extra, tmp_path):
    res, text = run_bench(what, tmp_path, "--shape", shape, *extra)
    assert res["machine"] and res["settings"]["samples"] == 5
    for sh in res["shapes"]:
        names = [r["name"] for r in sh["rows"]]
        assert "kernel Policy.act_into(x, out)" in names
        assert any(n.startswith("weights read once in order") for n in names)
        assert {"kernel C level, throughput", "kernel C level, latency (dependent)"} <= set(names)
        for r in sh["rows"]:
            assert 0 < r["p50"] <= r["p99"] <= r["p999"] <= r["max"], r
        assert sh["allocations_per_call_bytes"] < 1     # a one-off (tracemalloc's own) over all calls, never per call
        if not any("onnxruntime" in k for k in sh["skipped"]):
            base = next(r for r in sh["rows"] if "IOBinding" in r["name"])
            assert base["vs_onnxruntime"] == pytest.approx(1.0)
        assert f"{sh['shape']}, {sh['dtype']}" in text and "  floor: " in text
