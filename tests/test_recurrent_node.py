"""A recurrent policy through a real node: the node carries the LSTM/GRU state from frame to frame exactly as
Policy.act does, starts from zero state, and zeroes it when the watchdog trips ([watchdog] reset_state),
so the first frame after a silence is answered as by a fresh policy."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support.nodeutil import Robot, start_node, stop_node
from control_node.kernels import Policy, save_model

from test_recurrent import rnn_spec


def answers(robot, X):
    """Lockstep: send each row, wait for its answer; the actions (len(X), n_actions)."""
    out = []
    for x in X:
        seq = robot.send(x)
        a = robot.wait_answer(seq, timeout=3.0)
        assert a is not None and not a["safe"], a
        out.append(a["u"])
    return np.array(out)


@pytest.mark.parametrize("kind,reset", [("lstm", True), ("gru", True), ("lstm", False)])
def test_state_is_carried_and_reset_on_a_watchdog_trip(tmp_path, kind, reset):
    spec = rnn_spec(kind, 6, 32, [16, 3], dtype="float64", seed=3)
    model = tmp_path / "rnn.npz"
    save_model(spec, model)
    node, _ = start_node(tmp_path, model, extra="[watchdog]\nstale_after_ms = 1000.0\n"
                                                 f"reset_state = {'true' if reset else 'false'}\n")
    robot = Robot(node.endpoints)
    X = np.random.default_rng(0).normal(0, 1.5, (40, 6)) * spec.scale + spec.mean
    try:
        robot.connect(X[0], timeout=10.0)         # the connect frames step the node's state too
        robot.after_the_trip(timeout=30.0)         # ... so let the watchdog trip: with reset, back to zero
        got = answers(robot, X)
        local = Policy(spec)
        if reset:
            want = local.act_batch(X)              # state carried from zero, row by row
            assert np.array_equal(got, want)       # float64: the same compiled code, bit for bit
        robot.after_the_trip(timeout=30.0)         # silence > stale_after: the watchdog trips again
        again = answers(robot, X[:5])
    finally:
        robot.close()
        rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    s = json.load(open(f"{run_dir}/summary.json"))
    fresh = Policy(spec).act_batch(X[:5])
    if reset:
        assert np.array_equal(again, fresh)       # answered as by a fresh policy
        assert s["recurrent"]["state_resets_watchdog"] >= 2
    else:
        assert not np.allclose(again, fresh)      # the state went on from where it was
        assert s["recurrent"]["state_resets_watchdog"] == 0
    assert s["recurrent"]["kind"] == kind and s["recurrent"]["hidden_size"] == 32
