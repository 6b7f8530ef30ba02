"""The pendulum through a real node: `control-node launch` with the packaged pendulum config's children
(the node at 1 kHz, `sim pendulum` over ipc), scored; a large added transport delay makes it fail
visibly; the report shows the control trace."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.nodeutil import assert_answered_or_superseded, assert_offline_rollout, quiet_node_toml
from control_node.bench.harness import CHILD_CWD, child_env, make_endpoint_dir
from control_node.endpoints import default_config


def launch_config(tmp_path, model, sim_args, packaged="pendulum.toml", stale_after_ms=None):
    """The packaged config's loop rates and watchdog (``configs/pendulum.toml`` unless said) with private
    endpoints, this model and these sim arguments (and this watchdog time, when given)."""
    import tomllib
    with open(default_config(packaged), "rb") as f:
        cfg = tomllib.load(f)
    ep = make_endpoint_dir()
    lines = [f'[node]\nmodel = "{model}"\n', "[endpoints]\n"]
    lines += [f'{k} = "ipc://{ep}/{k}"\n' for k in ("sensor", "action", "diagnostics")]
    lines.append("[loop]\n" + "".join(f"{k} = {cfg['loop'][k]}\n" for k in ("rate_hz", "policy_rate_hz")
                                                     if k in cfg["loop"]))
    lines.append(f"[watchdog]\nstale_after_ms = {stale_after_ms or cfg['watchdog']['stale_after_ms']}\n"
                 f'safe_action = "{cfg["watchdog"]["safe_action"]}"\n')
    lines.append('[children.sim]\nargs = [' + ", ".join(f'"{a}"' for a in sim_args) + "]\n")
    path = tmp_path / packaged
    path.write_text(quiet_node_toml("".join(lines)))   # no spin, no why-late recorder: the score needs neither
    return path


def run_launch(cfg, run_dir, duration):
    r = subprocess.run([sys.executable, "-m", "control_node", "launch", str(cfg), "--duration", str(duration),
                        "--run-dir", str(run_dir)], cwd=CHILD_CWD, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(os.path.join(run_dir, "sim", "summary.json")) as f:
        return r.stdout, json.load(f)


@pytest.mark.slow
def test_pendulum_swings_up_and_balances_through_a_real_node(tmp_path, pendulum_model):
    out, s = run_launch(launch_config(tmp_path, pendulum_model, ["pendulum"]), tmp_path / "run", 8.0)
    c = s["control"]
    print(c["line"])
    assert "control: upright after" in out                     # launch's closing summary has the score
    assert c["time_to_upright_s"] is not None and c["time_to_upright_s"] < 6.0, c
    assert c["falls"] == 0 and c["rms_error_rad"] < 0.1, c
    # frames at 1 kHz meet ticks at 1 kHz out of phase: after a stall two can land in one tick, and the
    # node answers the newer one and counts the other as superseded (its own record explains it)
    with open(tmp_path / "run" / "node" / "summary.json") as f:
        node = json.load(f)
    assert_answered_or_superseded(s, node)
    r = subprocess.run([sys.executable, "-m", "control_node", "report", str(tmp_path / "run"), "--out",
                        str(tmp_path / "rep")], cwd=CHILD_CWD, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "control: upright after" in r.stdout
    assert (tmp_path / "rep" / "control.png").stat().st_size > 10_000
    assert "Control trace" in (tmp_path / "rep" / "report.html").read_text()


def test_a_lockstep_pendulum_is_the_offline_rollout_bit_for_bit(tmp_path, pendulum_model):
    """`sim pendulum --lockstep`: the simulator's time waits for each answer, so the run through a real node is
    the offline rollout of the same policy (every 10 physics steps, no delay), every torque and angle equal,
    whatever the host's speed; it balances. (The watchdog waits 5 s: a lockstep robot's clock stands still.)"""
    cfg = launch_config(tmp_path, pendulum_model, ["pendulum", "--lockstep", "--rate", "100"], stale_after_ms=5000)
    out, s = run_launch(cfg, tmp_path / "run", 5.0)
    assert s["stream"]["lockstep"] is True
    assert s["frames_answered"] == s["frames_sent"] == 500, s
    assert_offline_rollout(tmp_path / "run" / "sim", pendulum_model, 5.0)
    c = s["control"]
    assert c["time_to_upright_s"] is not None and c["falls"] == 0, c


@pytest.mark.slow
def test_a_large_added_delay_fails_visibly(tmp_path, pendulum_model):
    out, s = run_launch(launch_config(tmp_path, pendulum_model, ["pendulum", "--delay-us", "300000"]),
                        tmp_path / "run", 5.0)
    c = s["control"]
    print(c["line"])
    assert s["stream"]["delay_us"] == 300000
    assert c["time_to_upright_s"] is None or c["falls"] > 0, c
