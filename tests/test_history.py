"""Observation history ([policy] history = N): the last N frames the policy acted on, stacked into its input,
over a real node and real sockets. The policy's n_features is N x the frame width; before N frames have
arrived (after a start or a watchdog trip) the missing slots repeat the first frame."""
from __future__ import annotations

import json
import os

import msgpack
import numpy as np
import pytest

from support.nodeutil import write_node_config, Robot, start_node
from control_node.bench.harness import run_cli
from control_node.kernels import Policy, save_model

W, N = 4, 3                     # frame width, history: the policy takes 12 inputs


@pytest.fixture(scope="module")
def history_model_path(make_continuous_spec, tmp_path_factory):
    """A continuous float64 policy 12 -> 16 -> 3 (three frames of four features)."""
    spec = make_continuous_spec("float64", seed=5, sizes=(W * N, 16, 3))
    path = tmp_path_factory.mktemp("models") / "history.npz"
    save_model(spec, path)
    Policy.load(path)
    return path


def stacked(frames, order):
    """The input the test expects: the last N frames (the missing ones repeat the first), in ``order``."""
    last = list(frames[-N:])
    last = [last[0]] * (N - len(last)) + last                    # oldest first
    if order == "newest_first":
        last = last[::-1]
    return np.ascontiguousarray(np.concatenate(last))


@pytest.mark.parametrize("order", ["oldest_first", "newest_first"])
def test_history_stacks_the_last_frames(tmp_path, history_model_path, order):
    policy = Policy.load(history_model_path)
    node, _ = start_node(tmp_path, history_model_path,
                         extra=f'[policy]\nhistory = {N}\nhistory_order = "{order}"\n'
                               "[watchdog]\nstale_after_ms = 1000.0\n")  # over a host stall between frames
    robot = Robot(node.endpoints)
    rng = np.random.default_rng(11)
    try:
        x0 = rng.normal(size=W)
        a = robot.connect(x0)          # since start every frame is x0: the filled history is x0 x N
        assert a["safe"] is False and a["u"] == policy.act(np.tile(x0, N)).tolist()
        for rnd in range(2):           # fill after a watchdog trip, twice
            quiet = robot.after_the_trip()     # no frames: the watchdog trips (waited for), the history empties
            assert quiet and all(q["safe"] for q in quiet)
            frames = []
            for i in range(7):
                x = rng.normal(size=W)
                frames.append(x)
                seq = robot.send(x, binary=(i % 2 == 1))
                a = robot.wait_answer(seq)
                assert a is not None and a["safe"] is False, f"frame {i} not answered"
                want = policy.act(stacked(frames, order))
                assert a["u"] == want.tolist(), (f"round {rnd} frame {i}: the node's input is not the stacked "
                                                 f"history {order}")
        # a frame of the policy's full width is not a frame: the frame width is n_features / history
        robot.send_raw(msgpack.packb({"seq": robot.seq + 1, "t_ns": 1, "x": [0.0] * (W * N)}))
        seq = robot.send(rng.normal(size=W))
        assert robot.wait_answer(seq) is not None
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    assert f"history {N} x {W} features {order}" in err
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    assert s["policy"]["history"] == {"frames": N, "order": order, "frame_width": W}
    assert s["rejected"]["feature_count"] == 1 and s["rejected_total"] == 1


def test_history_one_is_the_frame_alone(tmp_path, continuous_f64_model_path):
    """The default (history = 1): the input is the frame, as before."""
    policy = Policy.load(continuous_f64_model_path)
    node, _ = start_node(tmp_path, continuous_f64_model_path, extra="[watchdog]\nstale_after_ms = 2000.0\n")
    robot = Robot(node.endpoints)
    rng = np.random.default_rng(2)
    try:
        robot.connect(rng.normal(size=6))
        for _ in range(5):
            x = np.ascontiguousarray(rng.normal(size=6))
            a = robot.wait_answer(robot.send(x))
            assert a is not None and a["u"] == policy.act(x).tolist()
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    assert s["policy"]["history"] == {"frames": 1, "order": "oldest_first", "frame_width": 6}


@pytest.mark.parametrize("text, field, words", [
    ("[policy]\nhistory = 5\n", "policy.history", "divides 12"),
    ("[policy]\nhistory = 0\n", "policy.history", "use 1"),
    ('[policy]\nhistory_order = "sideways"\n', "policy.history_order", "oldest_first"),
])
def test_bad_history_fails_naming_the_field(tmp_path, history_model_path, text, field, words):
    cfg = tmp_path / "n.toml"
    write_node_config(cfg, str(tmp_path), extra=text)
    r = run_cli("run", "--config", cfg, "--model", history_model_path, "--duration", "1")
    assert r.returncode == 2, r.stderr
    assert f"field '{field}'" in r.stderr and "Fix:" in r.stderr and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr




def _run(loop):
    loop.run()      # any Python allocation inside the compiled loop is attributed to this line


def test_history_and_decimation_allocate_nothing(tmp_path, continuous_f64_model_path):
    """Decimation 7 and a history of 2 frames of 3 (the 6-input policy): 50k cycles under tracemalloc."""
    import gc
    import tracemalloc

    from support.nodeutil import FedSockets
    from control_node.loop._rtloop import LoopConfig, RtLoop
    from control_node.loop.libzmq import libzmq_functions
    policy = Policy.load(continuous_f64_model_path)
    with FedSockets(tmp_path, [0.4, -0.3, 1.2], 30) as socks:
        cfg = LoopConfig(period_ns=20_000, stale_after_ns=10**9, spin_ns=6_000, max_cycles=50_000,
                         ring_cycles=1000, safe_u=[0.0] * 4, action_ring_cycles=700, decimation=7, history=2,
                         history_newest_first=True)
        loop = RtLoop(policy, cfg, socks.sub.underlying, socks.pub.underlying, libzmq_functions())
        assert (loop.decimation, loop.history, loop.frame_width) == (7, 2, 3)
        gc.collect()
        gc.disable()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        _run(loop)
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        gc.enable()
    assert loop.cycles == 50_000
    assert loop.frames_valid > 1_000 and loop.rejected_counts()["feature_count"] == 0
    # one inference per block of 7 ticks at most; skipped ticks (a stall) are ticks of the grid too
    assert 0 < loop.inference_ticks <= (loop.cycles + loop.skipped_ticks) // 7 + 1
    run_line = _run.__code__.co_firstlineno + 1
    in_loop = [d for d in snap1.compare_to(snap0, "lineno")
               if d.traceback[0].filename == __file__ and d.traceback[0].lineno == run_line]
    assert sum(d.count_diff for d in in_loop) == 0


@pytest.mark.parametrize("how", ["auto", "model"])
def test_the_simulator_sends_one_frame_to_a_node_with_history(tmp_path, history_model_path, how):
    """`control-node sim` beside a node with history = 3: it sends frames of the frame width (4), not of the
    policy's 12 inputs, learnt from the node's diagnostics (--features auto) or from --model and the node's
    config; the node accepts every frame (no feature_count rejections) and acts on them."""
    from support.nodeutil import assert_answered_or_superseded, cli_popen, load_run, stop_node
    node, cfg = start_node(tmp_path, history_model_path, extra=f"[policy]\nhistory = {N}\n")
    args = ["--features", "auto"] if how == "auto" else ["--model", str(history_model_path)]
    sim = cli_popen("sim", "gauss", "--config", cfg, "--rate", 500, "--duration", 1.0,
                    "--run-dir", tmp_path / "sim", *args)
    out = sim.communicate(timeout=60)[0]
    rc, _, err, run_dir = stop_node(node)
    assert sim.returncode == 0, out
    assert rc == 0, err
    if how == "auto":
        assert f"12 features = {N} frames x {W}" in out, out
    else:
        assert f"stacks {N} frames per input" in out, out
    summary, a = load_run(run_dir)
    assert summary["rejected_total"] == 0, summary["rejected"]
    assert summary["frames_valid"] >= 450
    sim_summary = json.load(open(tmp_path / "sim" / "summary.json"))
    # a frame replaced by a newer one in the same tick (after a host stall) is the node's superseded count
    assert_answered_or_superseded(sim_summary, summary)
