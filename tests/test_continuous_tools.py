"""The clients with a continuous policy (protocol v2, `u`): sim, record, replay --verify, echo, export,
report, against a real node process over ipc."""
import csv
import json
import os
import signal

import numpy as np
import pytest

from control_node.bench.harness import NodeProcess, make_endpoint_dir, run_cli as cn
from support.nodeutil import write_node_config, assert_replay_compared_every_recorded_answer
from test_record_replay import start_recorder


@pytest.fixture(scope="module")
def setup(tmp_path_factory, continuous_model_path):
    d = tmp_path_factory.mktemp("crec")
    ep = make_endpoint_dir()
    cfg = d / "node.toml"
    write_node_config(cfg, ep, extra="[watchdog]\nstale_after_ms = 50.0\n")
    node = NodeProcess(cfg, continuous_model_path, "--run-dir", d / "node")
    rec = start_recorder(cfg, d / "rec.mcap")
    r = cn("sim", "gauss", "--duration", 1.5, "--seed", 3, "--model", continuous_model_path, "--tap",
           "--config", cfg, "--run-dir", d / "sim")
    rec.send_signal(signal.SIGINT)
    out, _ = rec.communicate(timeout=10)
    assert r.returncode == 0, r.stdout + r.stderr
    assert rec.returncode == 0, out
    yield {"dir": d, "cfg": cfg, "node": node, "mcap": d / "rec.mcap", "sim_out": r.stdout,
           "model": continuous_model_path}
    node.stop()


def test_sim_records_action_vectors_and_compares_them(setup):
    from control_node.kernels import Policy
    s = json.loads((setup["dir"] / "sim" / "summary.json").read_text())
    rt = np.load(setup["dir"] / "sim" / "roundtrip.npz")
    assert s["policy"] == "continuous" and s["n_actions"] == 4
    assert s["accuracy"] is None and "accuracy n/a (continuous policy, 4 actions)" in setup["sim_out"]
    assert s["stream"]["n_features"] == 6
    assert rt["u"].dtype == np.float64 and rt["u"].shape == (s["frames_sent"], 4)
    answered = rt["rtt_ns"] >= 0
    assert np.isnan(rt["u"][~answered]).all() and np.isfinite(rt["u"][answered]).all()
    ex = s["expected"]
    # every answer that was not safe is compared (how many there are depends on the host's speed, not a rule)
    assert ex["compared"] == int((answered & ~rt["safe"]).sum()) > 0
    assert ex["mismatches"] == 0 and ex["first_mismatch"] is None
    # the answers are the policy's: recomputed here from the expected actions the stream carried
    policy = Policy.load(setup["model"])
    ok = answered & ~rt["safe"]
    assert np.abs(rt["u"][ok] - rt["u_expected"][ok]).max() <= 1e-6
    assert policy.n_actions == rt["u_expected"].shape[1]


def test_replay_verify_compares_u(setup, tmp_path):
    r = cn("replay", setup["mcap"], "--verify", "--config", setup["cfg"], "--run-dir", tmp_path / "rp")
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 mismatches" in r.stdout
    s = json.loads((tmp_path / "rp" / "summary.json").read_text())
    assert_replay_compared_every_recorded_answer(setup["mcap"], setup["dir"] / "sim", s["verify"])
    assert s["policy"] == "continuous" and s["expected"]["mismatches"] == 0     # the recorded u_expected


@pytest.mark.slow
def test_replay_verify_other_policy_reports_the_first_mismatch(setup, tmp_path, make_continuous_spec):
    from control_node.kernels import save_model
    other = tmp_path / "other.npz"
    save_model(make_continuous_spec("float32", seed=9), other)
    ep = make_endpoint_dir()
    cfg = tmp_path / "node2.toml"
    write_node_config(cfg, ep, extra="[watchdog]\nstale_after_ms = 50.0\n")
    with NodeProcess(cfg, other, "--run-dir", tmp_path / "node2"):
        r = cn("replay", setup["mcap"], "--verify", "--config", cfg, "--run-dir", tmp_path / "rp")
        loose = cn("replay", setup["mcap"], "--verify", "--atol", "1e9", "--config", cfg, "--run-dir",
                   tmp_path / "rp2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "first mismatch: seq " in r.stdout and ", component 0: recorded " in r.stdout
    s = json.loads((tmp_path / "rp" / "summary.json").read_text())
    fm = s["verify"]["first_mismatch"]
    assert s["verify"]["mismatches"] > 0 and fm["component"] == 0 and fm["diff"] > fm["tol"]
    assert loose.returncode == 0 and " 0 mismatches" in loose.stdout, loose.stdout + loose.stderr


def test_replay_verify_of_u_against_an_argmax_node_fails(setup, tmp_path, iris_model_path):
    ep = make_endpoint_dir()
    cfg = tmp_path / "node3.toml"
    write_node_config(cfg, ep)
    with NodeProcess(cfg, iris_model_path, "--run-dir", tmp_path / "node3"):
        # the recording's frames have 6 features: the iris node rejects them all, nothing answers
        r = cn("replay", setup["mcap"], "--verify", "--timeout", 2, "--config", cfg, "--run-dir", tmp_path / "rp")
    assert r.returncode != 0


def test_echo_prints_u_by_name(setup):
    r = cn("echo", "action", "--config", setup["cfg"], "--count", 2)
    assert r.returncode == 0, r.stderr
    assert "u:  # 4 actions" in r.stdout
    for name in ("j0", "j1", "j2", "j3"):
        assert f"  {name}: " in r.stdout
    r = cn("echo", "action", "--file", setup["mcap"], "--count", 3)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("u:  # 4 actions") == 3 and "  j3: " in r.stdout and "safe: " in r.stdout
    r = cn("echo", "action", "--file", setup["mcap"], "--count", 1, "--json")
    assert r.returncode == 0, r.stderr
    msg = json.loads(r.stdout.splitlines()[0])
    assert list(msg) == ["seq", "t_ns", "cycle", "u", "safe"] and len(msg["u"]) == 4


def test_export_writes_one_column_per_action(setup, tmp_path):
    import msgpack
    from mcap.reader import make_reader

    from control_node.recording.reader import read_recording
    r = cn("export", setup["mcap"], "--to", "csv", "--out", tmp_path / "csv")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "csv" / "action.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:9] == ["log_time_ns", "sequence", "seq", "t_ns", "cycle", "j0", "j1", "j2", "j3"]
    recorded = [msgpack.unpackb(raw) for raw, _ in read_recording(str(setup["mcap"]), ["/action"])["/action"]]
    assert len(rows) == len(recorded)
    for row, m in zip(rows[:200], recorded[:200]):
        assert [float(row[f"j{i}"]) for i in range(4)] == m["u"]       # exact: repr round-trips
    out = tmp_path / "rec.json.mcap"
    r = cn("export", setup["mcap"], "--to", "json-mcap", "--out", out)
    assert r.returncode == 0, r.stderr
    with open(out, "rb") as f:
        _s, _ch, m = next(make_reader(f).iter_messages(topics=["/action"]))
    d = json.loads(m.data)
    assert len(d["u"]) == 4 and list(d["u_by_name"]) == ["j0", "j1", "j2", "j3"]


def test_sim_learns_the_observation_width_from_the_node(setup, tmp_path):
    # without a width: the node rejects every 4-feature frame, and the sim says why
    r = cn("sim", "gauss", "--duration", 0.5, "--timeout", 1, "--config", setup["cfg"], "--run-dir", tmp_path / "s0")
    assert r.returncode == 2 and "takes 6 features and this stream sends 4" in r.stderr, r.stdout + r.stderr
    assert "Fix: --features 6 (or auto)" in r.stderr
    r = cn("sim", "gauss", "--duration", 0.5, "--lockstep", "--features", "auto", "--config", setup["cfg"],
           "--run-dir", tmp_path / "sim")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the node's policy is continuous (6 features, 4 actions)" in r.stdout
    s = json.loads((tmp_path / "sim" / "summary.json").read_text())
    rt = np.load(tmp_path / "sim" / "roundtrip.npz")
    assert s["policy"] == "continuous" and s["expected"] is None and s["actions_lost"] == 0
    assert rt["u"].shape == (s["frames_sent"], 4) and np.isfinite(rt["u"]).all()


def test_report_shows_actions_of_a_continuous_run(tmp_path, continuous_model_path):
    ep = make_endpoint_dir()
    cfg = tmp_path / "node.toml"
    write_node_config(cfg, ep, extra="[watchdog]\nstale_after_ms = 20.0\n")
    node = NodeProcess(cfg, continuous_model_path, "--run-dir", tmp_path / "node")
    r = cn("sim", "gauss", "--duration", 0.5, "--model", continuous_model_path, "--config", cfg,
           "--run-dir", tmp_path / "sim")
    rc, out, err, run_dir = node.stop()
    assert r.returncode == 0 and rc == 0, r.stdout + err
    rep = cn("report", run_dir, "--out", tmp_path / "rep", env={"COLUMNS": "160"})
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "actions (continuous policy, 4 actions: j0, j1, j2, j3)" in rep.stdout
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    ac = doc["runs"][0]["node"]["actions"]
    s = json.loads((tmp_path / "node" / "summary.json").read_text())
    assert ac["published"] == s["cycles"] and ac["safe"] == s["safe_actions"] > 0
    assert ac["policy"] == s["cycles"] - s["safe_actions"] > 0
    assert [c["name"] for c in ac["components"]] == ["j0", "j1", "j2", "j3"]
    assert os.path.getsize(tmp_path / "rep" / "actions.png") > 1000
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Published actions over time" in html and "Actions (continuous policy, 4 actions)" in html
    # and the sim's run reports accuracy n/a
    rep = cn("report", tmp_path / "sim", "--no-plots", "--out", tmp_path / "rep2", env={"COLUMNS": "200"})
    assert rep.returncode == 0 and "accuracy n/a (continuous policy)" in rep.stdout, rep.stdout + rep.stderr


def test_launch_drives_a_continuous_policy(tmp_path, continuous_model_path):
    from test_launch import launch, write_launch_config
    ep = make_endpoint_dir()
    cfg = write_launch_config(tmp_path / "launch.toml", ep, continuous_model_path, duration=1.0)
    r = launch(cfg, tmp_path / "run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"--model {os.path.abspath(continuous_model_path)}" in r.stdout      # launch passed the node's model
    s = json.loads((tmp_path / "run" / "sim" / "summary.json").read_text())
    assert s["policy"] == "continuous" and s["expected"]["compared"] > 100 and s["expected"]["mismatches"] == 0
    assert "accuracy n/a" in r.stdout
