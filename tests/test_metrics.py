"""[diagnostics] prometheus: a real HTTP client scrapes a running node; after the loop ends the final
counters equal summary.json."""
from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

import pytest

from support.nodeutil import Robot, load_run, start_node
from control_node.bench.harness import free_tcp_ports, run_cli


def scrape(port) -> dict:
    """{'name{labels}': float} of one /metrics scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


@pytest.mark.slow
def test_metrics_scraped_during_a_run_and_final_counters_equal_the_summary(tmp_path, continuous_f64_model_path):
    port = free_tcp_ports(1)[0]
    extra = (f'[diagnostics]\nprometheus = "127.0.0.1:{port}"\nprometheus_linger_s = 3.0\n'
             "[watchdog]\nstale_after_ms = 20.0\n")
    # 6 s, not 3: the connect, the 50 frames and the rejection below must fall inside the run, and a loaded
    # host slows the connect (the test waits up to 5 s for the rejection's count)
    node, cfg = start_node(tmp_path, continuous_f64_model_path, extra=extra, args=("--duration", 6))
    robot = Robot(node.endpoints)
    robot.connect([0.1] * 6)
    first = scrape(port)
    for _ in range(50):
        robot.send([0.2] * 6)
        time.sleep(0.002)
    robot.send_raw(b"\xc1 not msgpack")
    deadline = time.monotonic() + 5      # until the exporter has the rejection (a host stall can delay it)
    while True:
        time.sleep(0.1)
        second = scrape(port)
        if second.get('control_node_rejected_frames_total{reason="malformed"}') or time.monotonic() > deadline:
            break
    assert first["control_node_up"] == 1 and second["control_node_cycles_total"] > first["control_node_cycles_total"]
    assert second["control_node_frames_valid_total"] >= 50
    assert second['control_node_rejected_frames_total{reason="malformed"}'] == 1
    assert 'control_node_policy_info{active="continuous-f64",shadow="",canary="false"}' in second
    final = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            m = scrape(port)
        except (urllib.error.URLError, ConnectionError):
            break
        if m["control_node_up"] == 0:
            final = m
        time.sleep(0.1)
    robot.close()
    node.proc.communicate(timeout=60)
    assert final is not None, "no scrape after the loop ended"
    runs = os.path.join(str(tmp_path), "runs")
    summary, _ = load_run(os.path.join(runs, os.listdir(runs)[0]))
    for metric, key in (("cycles_total", "cycles"), ("deadline_misses_total", "deadline_misses"),
                        ("skipped_ticks_total", "skipped_ticks"), ("stale_cycles_total", "stale_cycles"),
                        ("safe_actions_total", "safe_actions"), ("frames_valid_total", "frames_valid"),
                        ("superseded_frames_total", "superseded")):
        assert final[f"control_node_{metric}"] == summary[key], metric
    for reason, n in summary["rejected"].items():
        assert final[f'control_node_rejected_frames_total{{reason="{reason}"}}'] == n
    assert final["control_node_wake_latency_seconds_count"] == summary["cycles"]


def test_a_remote_metrics_address_needs_allowing(tmp_path, continuous_f64_model_path):
    cfg = tmp_path / "n.toml"
    cfg.write_text('[diagnostics]\nprometheus = "0.0.0.0:9100"\n')
    r = run_cli("run", "--config", cfg, "--model", continuous_f64_model_path, "--duration", 1)
    assert r.returncode == 2 and "diagnostics.prometheus" in r.stderr and "prometheus_allow_remote" in r.stderr
