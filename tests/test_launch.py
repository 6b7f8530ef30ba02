"""control-node launch with real processes: clean start/stop, no orphans or socket files, crash reports, Ctrl-C."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from control_node.bench.harness import CHILD_CWD, child_env, make_endpoint_dir
from support.nodeutil import quiet_node_toml


def write_launch_config(path, ep_dir, model, duration=2.0, sim_args=("gauss",), record=False, sim_restart=False,
                        launch_extra="", node_extra=""):
    args = ", ".join(f'"{a}"' for a in sim_args)
    # no spin, no why-late recorder: CPU a test of launching does not need
    path.write_text(quiet_node_toml(f"""
[node]
model = "{model}"

[endpoints]
sensor = "ipc://{ep_dir}/sensor"
action = "ipc://{ep_dir}/action"
diagnostics = "ipc://{ep_dir}/diagnostics"

[launch]
duration = {duration}
{launch_extra}

[children.sim]
args = [{args}]
restart = {str(sim_restart).lower()}

[children.record]
enabled = {str(record).lower()}
sensor_tap = "ipc://{ep_dir}/sensor_tap"
{node_extra}
"""))
    return path


def launch(cfg, run_dir, *extra, timeout=60):
    return subprocess.run([sys.executable, "-m", "control_node", "launch", str(cfg), "--run-dir", str(run_dir),
                           *extra], cwd=CHILD_CWD, env=child_env(), capture_output=True, text=True, timeout=timeout)


class Pids(dict):
    """name -> pids (a restarted child has several); iterating ``values()`` gives every pid."""

    def values(self):
        return [p for ps in super().values() for p in ps]


def pids_of(out):
    pids = Pids()
    for name, pid in re.findall(r"\[launch\] started (\w+) \(pid (\d+)\)", out):
        pids.setdefault(name, []).append(int(pid))
    return pids


def assert_gone(pids, ep_dir):
    deadline = time.monotonic() + 2
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"orphans: {alive}"
    assert os.listdir(ep_dir) == [], f"socket files left: {os.listdir(ep_dir)}"


def test_launch_runs_and_stops_everything(tmp_path):
    ep = make_endpoint_dir()
    model = tmp_path / "models" / "iris.npz"   # missing: launch trains it first, in-process
    cfg = write_launch_config(tmp_path / "demo.toml", ep, model, duration=2.0, record=True)
    r = launch(cfg, tmp_path / "run")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "is missing: training it" in out and model.exists()
    pids = pids_of(out)
    assert set(pids) == {"node", "sim", "record"}
    assert "[node] ready " in out and "[sim] frames sent" in out
    assert out.index("[node] ready ") < out.index("[launch] starting sim")
    assert re.search(r"\[launch\] node: \d+ cycles, wake-up latency p50 .* p99 .* max .*deadline misses \d+", out)
    assert re.search(r"\[launch\] sim: \d+ frames, accuracy 0\.\d+, lost \d+, round trip p50 .* p99 ", out)
    assert out.strip().splitlines()[-1] == f"run directory: {tmp_path / 'run'}"
    for sub in ("node/summary.json", "sim/summary.json", "sim/roundtrip.npz", "record/recording.mcap"):
        assert (tmp_path / "run" / sub).exists(), sub
    # the sim and the recorder ran off the node's loop core
    loop_cpu = int(re.search(r"\[node\] ready .* loop_cpu=(\d+)", out).group(1))
    rest = sorted(set(os.sched_getaffinity(0)) - {loop_cpu}) or sorted(os.sched_getaffinity(0))  # 1 core: stay
    if len(os.sched_getaffinity(0)) > 1:
        assert f"[launch] the node's loop runs on core {loop_cpu}: record, sim on cores {','.join(map(str, rest))}" \
            in out
    assert json.loads((tmp_path / "run" / "sim" / "summary.json").read_text())["cpus"] == rest
    assert_gone(pids.values(), ep)


@pytest.mark.slow
def test_launch_can_leave_the_children_on_every_core(tmp_path, iris_model_path):
    ep = make_endpoint_dir()
    cfg = write_launch_config(tmp_path / "demo.toml", ep, iris_model_path, duration=1.0,
                              launch_extra="keep_off_loop_core = false")
    r = launch(cfg, tmp_path / "run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loop runs on core" not in r.stdout
    cores = sorted(os.sched_getaffinity(0))
    assert json.loads((tmp_path / "run" / "sim" / "summary.json").read_text())["cpus"] == cores
    rep = subprocess.run([sys.executable, "-m", "control_node", "report", str(tmp_path / "run")], cwd=CHILD_CWD,
                         env=dict(child_env(), COLUMNS="300"), capture_output=True, text=True, timeout=120)
    assert f"ran on cores {','.join(map(str, cores))}" in rep.stdout, rep.stdout + rep.stderr
    # a node whose loop is not pinned says so, and the children stay on every core
    unpinned = write_launch_config(tmp_path / "unpinned.toml", ep, iris_model_path, duration=1.0,
                                   node_extra='[realtime]\ncpu = "none"')
    r = launch(unpinned, tmp_path / "run3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"\[node\] ready .* loop_cpu=none", r.stdout) and "loop runs on core" not in r.stdout
    assert json.loads((tmp_path / "run3" / "sim" / "summary.json").read_text())["cpus"] == cores
    bad = write_launch_config(tmp_path / "bad.toml", ep, iris_model_path, launch_extra='keep_off_loop_core = "yes"')
    r = launch(bad, tmp_path / "run2")
    assert r.returncode != 0 and "[launch] keep_off_loop_core must be true or false" in r.stdout + r.stderr


def test_launch_reports_child_crash(tmp_path, iris_model_path):
    ep = make_endpoint_dir()
    cfg = write_launch_config(tmp_path / "demo.toml", ep, iris_model_path, duration=5.0, sim_args=("--exit-code", "3"))
    t = time.monotonic()
    r = launch(cfg, tmp_path / "run")
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    assert "[launch] sim died unexpectedly (exit code 3); stopping the others" in out
    assert time.monotonic() - t < 15
    assert_gone(pids_of(out).values(), ep)


def test_launch_bad_sim_argument(tmp_path, iris_model_path):
    ep = make_endpoint_dir()
    cfg = write_launch_config(tmp_path / "demo.toml", ep, iris_model_path, sim_args=("--no-such-option",))
    r = launch(cfg, tmp_path / "run")
    assert r.returncode == 1
    assert "[launch] sim died unexpectedly (exit code 2)" in r.stdout
    assert_gone(pids_of(r.stdout).values(), ep)


def test_launch_ctrl_c_stops_everything(tmp_path, iris_model_path):
    ep = make_endpoint_dir()
    cfg = write_launch_config(tmp_path / "demo.toml", ep, iris_model_path, duration=60.0)
    p = subprocess.Popen([sys.executable, "-m", "control_node", "launch", str(cfg), "--run-dir", str(tmp_path / "run")],
                         cwd=CHILD_CWD, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("[sim] sim: "):
            break
    time.sleep(0.5)
    t = time.monotonic()
    p.send_signal(signal.SIGINT)
    rest, _ = p.communicate(timeout=30)
    out = "".join(lines) + rest
    assert time.monotonic() - t < 15
    assert p.returncode == 130, out
    assert "interrupted: stopping everything" in out
    assert (tmp_path / "run" / "node" / "summary.json").exists()
    assert (tmp_path / "run" / "sim" / "summary.json").exists()   # the sim stops cleanly on SIGINT too
    assert_gone(pids_of(out).values(), ep)


def test_launch_restarts_child_when_configured(tmp_path, iris_model_path):
    ep = make_endpoint_dir()
    cfg = write_launch_config(tmp_path / "demo.toml", ep, iris_model_path, duration=5.0, sim_args=("--exit-code", "3"),
                              sim_restart=True)
    r = launch(cfg, tmp_path / "run")
    out = r.stdout
    assert "[launch] sim died (exit code 3); restarting (1/3)" in out
    assert "[launch] sim died unexpectedly (exit code 3)" in out   # gives up after 3 restarts
    assert r.returncode == 1
    assert_gone(pids_of(out).values(), ep)
