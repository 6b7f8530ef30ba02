"""`control-node train --task pendulum --recurrent gru`: backpropagation through time checked against
finite differences, and a trained GRU that the compiled kernel runs, state carried, to swing the pendulum
up at 50 Hz (offline and through a real node at policy_rate_hz = 50)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import made_once
from control_node.bench.harness import CHILD_CWD, child_env


def test_bptt_gradients_match_finite_differences():
    """Every parameter's gradient (GRU gates and dense layers) against central differences, over a 6-step
    sequence from a non-zero state."""
    from control_node.train.pendulum_gru import init_params, loss_and_grads
    rng = np.random.default_rng(3)
    p = init_params(5, rng, dense=4)
    Z, target, h0 = rng.normal(size=(6, 3, 3)), rng.uniform(-0.9, 0.9, (6, 3)), rng.normal(0, 0.5, (3, 5))
    _, g = loss_and_grads(p, Z, target, h0)
    for k, v in p.items():
        num = np.zeros_like(v)
        for i in np.ndindex(v.shape):
            old = v[i]
            v[i] = old + 1e-6
            lp, _ = loss_and_grads(p, Z, target, h0)
            v[i] = old - 1e-6
            lm, _ = loss_and_grads(p, Z, target, h0)
            v[i] = old
            num[i] = (lp - lm) / 2e-6
        assert np.allclose(g[k], num, rtol=1e-4, atol=1e-8), (k, np.max(np.abs(g[k] - num)))


def test_the_training_step_matches_the_model_file_reference():
    """The trainer's forward pass is the model file's GRU (torch layout, linear_before_reset) step for step."""
    from control_node.kernels.reference import run_sequence
    from control_node.train.pendulum_gru import MEAN, SCALE, forward, init_params, to_spec
    rng = np.random.default_rng(4)
    p = init_params(8, rng)
    X = np.stack([np.cos(rng.uniform(-3, 3, 40)), np.sin(rng.uniform(-3, 3, 40)), rng.uniform(-8, 8, 40)], axis=1)
    ys, _ = forward(p, ((X - MEAN) / SCALE)[:, None, :], np.zeros((1, 8)))
    ref = run_sequence(to_spec(p, "float64"), X)["actions"][:, 0]
    assert np.allclose(ref, 2.0 * ys[:, 0], rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def gru_model(tmp_path_factory):
    """`train --task pendulum --recurrent gru`'s model file and output, trained once per run (9 CPU-s) however
    the -n workers split this module's tests."""
    def train(path):
        r = subprocess.run([sys.executable, "-m", "control_node", "train", "--task", "pendulum", "--recurrent",
                            "gru", "--out", str(path)], cwd=CHILD_CWD, env=child_env(), capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        (path.parent / "pendulum-gru.out").write_text(r.stdout)       # before the model file is in place
    path = made_once(tmp_path_factory, "pendulum-gru.npz", train)
    return path, (path.parent / "pendulum-gru.out").read_text()


def test_the_trained_gru_swings_up_offline_in_the_compiled_kernel(gru_model):
    path, out = gru_model
    print(out)
    from control_node.kernels import Policy
    from control_node.train.pendulum_gru import evaluate
    policy = Policy.load(path)
    assert policy.recurrent == "gru" and policy.spec.hidden_size == 32
    assert "kernel matches numpy reference" in out and "run it at 50 Hz" in out
    scores = evaluate(policy.spec)
    for sc in scores:
        assert sc.time_to_upright_s is not None and sc.time_to_upright_s < 7.0, sc
        assert sc.falls == 0 and sc.rms_error_rad < 0.1, sc


@pytest.mark.slow
def test_the_gru_swings_up_through_a_real_node_at_50_hz(tmp_path, gru_model):
    """The packaged configs/pendulum_gru.toml's settings (1 kHz loop, policy at 50 Hz, state carried by the
    node), private endpoints, this model: `launch` scores it upright."""
    from test_pendulum_node import launch_config, run_launch
    from control_node.endpoints import default_config
    import tomllib
    with open(default_config("pendulum_gru.toml"), "rb") as f:
        assert tomllib.load(f)["loop"]["policy_rate_hz"] == 50.0
    cfg = launch_config(tmp_path, gru_model[0], ["pendulum"], packaged="pendulum_gru.toml")
    out, s = run_launch(cfg, tmp_path / "run", 8.0)
    c = s["control"]
    print(c["line"])
    assert c["time_to_upright_s"] is not None and c["time_to_upright_s"] < 7.0, c
    assert c["falls"] == 0, c
    with open(tmp_path / "run" / "node" / "summary.json") as f:
        node = json.load(f)
    assert node["policy"]["kind"] == "continuous" and node["policy_rate"]["decimation"] == 20, node["policy_rate"]
    # the 50 Hz schedule, from the run's own counts: the recorded inference ticks are the summary's, at most one
    # per block of 20 ticks (ticks = cycles + ticks skipped after stalls), and the policy ran in most blocks (how
    # many depends on when the simulator's frames came: a stalled host delays them). The exact rule, tick by
    # tick, is test_cycle_rules.py::test_decimation_phases_and_held_actions
    from control_node import rundir
    _, a = rundir.read_node_run(str(tmp_path / "run" / "node"))
    n_infer = int(((a["flags"] & rundir.FLAG_INFER) != 0).sum())
    blocks = -(-(node["cycles"] + node["skipped_ticks"]) // 20)
    assert node["policy_rate"]["inference_ticks"] == n_infer > 0
    assert 0.5 * blocks <= n_infer <= blocks, (n_infer, blocks)
