"""Policies changed while the loop runs (control_node.lifecycle): real node processes, real sockets, the
compiled kernel, `control-node policy` as a user runs it."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from conftest import continuous_spec
from support.nodeutil import (ActionCollector, FedSockets, Robot, assert_replay_compared_every_recorded_answer,
                              load_run, start_node)
from control_node import rundir
from control_node.bench.harness import run_cli
from control_node.kernels import ModelSpec, Policy, save_model

CALM = "[watchdog]\nstale_after_ms = 5000.0\n"     # no watchdog trip while a CLI call runs between frames


def _save(spec, path):
    save_model(spec, path)
    Policy.load(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A and B: two continuous float64 policies of one shape (6 -> 32 -> 32 -> 4, ELU, tanh squash); A2 a
    copy of A; wide: 6 -> 5 actions; bad: corrupt bytes; overflow (6 -> 4, finite for inputs of order 1,
    +-inf for 1e200)."""
    d = tmp_path_factory.mktemp("lifecycle-models")
    out = {"a": _save(continuous_spec("float64", seed=1), d / "a.npz"),
           "b": _save(continuous_spec("float64", seed=2), d / "b.npz"),
           "wide": _save(continuous_spec("float64", seed=3, sizes=(6, 16, 5)), d / "wide.npz")}
    out["a2"] = str(d / "a2.npz")
    with open(out["a"], "rb") as f, open(out["a2"], "wb") as g:
        g.write(f.read())
    out["bad"] = str(d / "bad.npz")
    with open(out["bad"], "wb") as f:
        f.write(b"PK\x03\x04 this is not a model file")
    rng = np.random.default_rng(3)
    W = np.where(rng.random((6, 4)) < 0.5, -1.0, 1.0) * 1e200
    out["overflow"] = _save(ModelSpec(
        layers=[(W, np.zeros(4))], mean=np.zeros(6), scale=np.ones(6), classes=[],
        feature_names=[f"obs{i}" for i in range(6)], head="continuous", activations=["identity"],
        action_names=["a", "b", "c", "d"], action_offset=[0.5, -0.5, 0.0, 1.0], action_scale=1.0, squash=False,
        check_X=rng.normal(0.0, 1.0, size=(16, 6)), trainer="random"), d / "overflow.npz")
    return out


def policy_cli(cfg, *args, timeout=60):
    """`control-node policy ARGS --config CFG --json` -> (exit code, reply dict)."""
    p = run_cli("policy", *args, "--config", cfg, "--json", timeout=timeout)
    assert p.stdout.strip(), p.stderr
    return p.returncode, json.loads(p.stdout)


def lockstep(robot, xs, rng, n, policy=None):
    """Send n random frames one at a time, each after the previous one was answered; record x by seq in
    ``xs``. Returns the answers. With ``policy``, each answer must equal its Policy.act bit for bit."""
    answers = []
    for _ in range(n):
        x = rng.normal(0.0, 1.0, 6)
        seq = robot.send(x)
        xs[seq] = x
        a = robot.wait_answer(seq, timeout=5.0)
        assert a is not None, f"no answer to seq {seq}"
        if policy is not None:
            assert not a["safe"]
            assert a["u"] == [float(v) for v in policy.act(x)], f"seq {seq} at cycle {a['cycle']}"
        answers.append(a)
    return answers


def test_switch_changes_the_answering_policy_at_a_cycle_boundary(tmp_path, models):
    """Before the switch the answers are A's, after it B's, after the rollback A's again, bit for bit; the
    action stream's cycle numbers run on without a gap; the ring says which slot acted in every cycle."""
    node, cfg = start_node(tmp_path, models["a"], extra=CALM)
    pa, pb = Policy.load(models["a"]), Policy.load(models["b"])
    robot = Robot(node.endpoints)
    collector = ActionCollector(node.endpoints["action"])
    rng, xs = np.random.default_rng(0), {}
    try:
        robot.connect(np.zeros(6))
        lockstep(robot, xs, rng, 40, pa)
        rc, rep = policy_cli(cfg, "load", "b", models["b"])
        assert rc == 0 and rep["ok"], rep
        lockstep(robot, xs, rng, 20, pa)                 # loading changed nothing
        rc, rep = policy_cli(cfg, "activate", "b")
        assert rc == 0 and rep["status"]["active"] == "b" and rep["status"]["previous"] == "a"
        c_switch = rep["cycle"]
        after = lockstep(robot, xs, rng, 40, pb)
        assert min(a["cycle"] for a in after) >= c_switch
        rc, rep = policy_cli(cfg, "rollback")
        assert rc == 0 and rep["status"]["active"] == "a"
        c_back = rep["cycle"]
        back = lockstep(robot, xs, rng, 40, pa)
        assert min(a["cycle"] for a in back) >= c_back > c_switch
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
        actions = collector.close()
    assert rc == 0, err
    cycles = np.array([a["cycle"] for a in actions])
    # the stream covers both switches (how many cycles that is depends on the machine's speed: ~900 here)
    assert cycles.size > 100 and cycles[0] < c_switch < c_back < cycles[-1], (cycles[[0, -1]], c_switch, c_back)
    assert np.all(np.diff(cycles) == 1), "the action stream skipped or repeated a cycle"
    summary, arrays = load_run(run_dir)
    events = [(e["event"], e["policy"], e["cycle"]) for e in summary["lifecycle"]["transitions"]]
    assert ("activate", "b", c_switch) in events and ("rollback", "a", c_back) in events
    assert summary["ring"]["complete"]
    slot = arrays["policy"]
    cyc = arrays["cycle"]
    assert (slot[cyc < c_switch] == 0).all() and (slot[(cyc >= c_switch) & (cyc < c_back)] == 1).all()
    assert (slot[cyc >= c_back] == 0).all()
    assert summary["lifecycle"]["active"] == "a"


def test_shadow_never_changes_an_action_and_counts_what_an_offline_comparison_counts(tmp_path, models):
    """B runs in shadow of A: every answer is still A's, bit for bit; the node's disagreement count and
    per-cycle distances equal an offline comparison of the frames the node acted on."""
    threshold = 1.0
    node, cfg = start_node(tmp_path, models["a"], extra=CALM + f"[lifecycle]\nshadow_distance = {threshold}\n")
    pa, pb = Policy.load(models["a"]), Policy.load(models["b"])
    robot = Robot(node.endpoints)
    rng, xs = np.random.default_rng(1), {}
    try:
        robot.connect(np.zeros(6))
        assert policy_cli(cfg, "load", "b", models["b"])[0] == 0
        rc, rep = policy_cli(cfg, "shadow", "b")
        assert rc == 0 and rep["status"]["shadow"] == "b" and rep["status"]["active"] == "a"
        c_shadow = rep["cycle"]
        lockstep(robot, xs, rng, 300, pa)
        rc, live = policy_cli(cfg, "status")
        top = run_cli("top", "--once", "--config", cfg, env={"COLUMNS": "200"})
        assert top.returncode == 0 and "active policy a, shadow b:" in top.stdout, top.stdout + top.stderr
        rc, rep = policy_cli(cfg, "unshadow")
        assert rc == 0 and rep["status"]["shadow"] is None
        c_unshadow = rep["cycle"]
        lockstep(robot, xs, rng, 20, pa)
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary, arrays = load_run(run_dir)
    ran = arrays["shadow"] != 0
    assert ran.sum() >= 300
    assert (arrays["cycle"][ran] >= c_shadow).all() and (arrays["cycle"][ran] < c_unshadow).all()
    assert ((arrays["flags"][ran] & rundir.FLAG_INFER) != 0).all()
    offline = []
    for seq in arrays["seq"][ran]:
        x = xs.get(int(seq), np.zeros(6))          # the connect frames were zeros
        offline.append(float(np.sqrt(np.sum((pb.act(x) - pa.act(x)) ** 2))))
    offline = np.array(offline)
    assert np.abs(offline - threshold).min() > 1e-9, "a distance sits on the threshold: pick other frames"
    np.testing.assert_allclose(arrays["shadow_dist"][ran], offline, rtol=1e-6)     # float32 in the ring
    want = int((offline > threshold).sum())
    assert 0 < want < offline.size                 # the check can fail both ways
    fig = summary["lifecycle"]["shadow_figures"]
    assert fig["ticks"] == int(ran.sum()) and fig["disagree"] == want
    codes = arrays["shadow"][ran]
    assert int((codes == rundir.SHADOW_CODES.index("disagree")).sum()) == want
    assert fig["cost_ns"]["ring"]["count"] == int(ran.sum()) and fig["cost_ns"]["max"] > 0
    assert live["status"]["shadow_figures"]["ticks"] >= 300        # status showed it while it ran
    rep = run_cli("report", run_dir, "--no-plots", env={"COLUMNS": "200"})
    assert rep.returncode == 0, rep.stderr
    assert "policy timeline" in rep.stdout and f"shadow b: {fig['ticks']} policy ticks, {want} disagree" in rep.stdout


def test_a_canary_with_non_finite_output_is_rolled_back_in_the_same_tick(tmp_path, models):
    """The canary's first non-finite output is replaced, in that very tick, by the previous policy's answer
    (not the safe action); the transition is recorded at that cycle; every later answer is A's."""
    rules = "[rollout]\nwindow_ticks = 100000\nmax_disagree = 1.0\ncanary_s = 1000.0\n"
    node, cfg = start_node(tmp_path, models["a"], extra=CALM + rules)
    pa, pbad = Policy.load(models["a"]), Policy.load(models["overflow"])
    robot = Robot(node.endpoints)
    rng, xs = np.random.default_rng(2), {}
    try:
        robot.connect(np.zeros(6))
        assert policy_cli(cfg, "load", "bad", models["overflow"])[0] == 0
        rc, rep = policy_cli(cfg, "activate", "bad", "--canary")
        assert rc == 0 and rep["status"]["canary"] is not None and rep["status"]["shadow"] == "a"
        lockstep(robot, xs, rng, 30, pbad)            # finite: the canary answers
        x = np.full(6, 1e200)
        assert np.isnan(pbad.act(x)).all() and np.isfinite(pa.act(x)).all()   # the canary fails here, A not
        seq = robot.send(x)
        a = robot.wait_answer(seq, timeout=5.0)
        assert a is not None and not a["safe"]
        assert a["u"] == [float(v) for v in pa.act(x)]
        lockstep(robot, xs, rng, 20, pa)
        rc, st = policy_cli(cfg, "status")
        assert st["status"]["active"] == "a" and st["status"]["canary"] is None and st["status"]["shadow"] is None
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary, arrays = load_run(run_dir)
    rb = [e for e in summary["lifecycle"]["transitions"] if e["event"] == "auto_rollback"]
    assert len(rb) == 1 and rb[0]["reason"] == "non_finite" and rb[0]["policy"] == "a" and rb[0]["from"] == "bad"
    assert rb[0]["cycle"] == a["cycle"]                 # the tick whose inference failed
    i = int(np.flatnonzero(arrays["cycle"] == a["cycle"])[0])
    assert arrays["policy"][i] == 0 and not arrays["flags"][i] & rundir.FLAG_SAFE
    assert summary["rejected"]["non_finite_output"] == 0   # nothing unsafe reached the robot, nothing was lost


def test_canary_rolled_back_on_disagreement_and_an_equal_one_promoted(tmp_path, models):
    """B disagrees with A on most ticks: rolled back by the window rule. A2 (A's bytes) agrees on every tick:
    promoted after canary_s of policy ticks."""
    rules = "[rollout]\nwindow_ticks = 20\nmax_disagree = 0.2\ncanary_s = 0.06\n[lifecycle]\nshadow_distance = 0.05\n"
    node, cfg = start_node(tmp_path, models["a"], extra=CALM + rules)
    pa = Policy.load(models["a"])
    robot = Robot(node.endpoints)
    rng, xs = np.random.default_rng(4), {}
    try:
        robot.connect(np.zeros(6))
        assert policy_cli(cfg, "load", "b", models["b"])[0] == 0
        assert policy_cli(cfg, "load", "a2", models["a2"])[0] == 0
        assert policy_cli(cfg, "activate", "b", "--canary")[0] == 0
        lockstep(robot, xs, rng, 40)
        rc, st = policy_cli(cfg, "status")
        assert st["status"]["active"] == "a" and st["status"]["canary"] is None
        rc, rep = policy_cli(cfg, "activate", "a2", "--canary")
        assert rc == 0 and rep["status"]["canary"]["ticks_to_promote"] == 60
        lockstep(robot, xs, rng, 80, pa)               # a2 answers exactly as A would
        rc, st = policy_cli(cfg, "status")
        assert st["status"]["active"] == "a2" and st["status"]["canary"] is None and st["status"]["shadow"] is None
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary, _ = load_run(run_dir)
    ev = [(e["event"], e["policy"], e["reason"]) for e in summary["lifecycle"]["transitions"]]
    assert ("auto_rollback", "a", "disagreement") in ev
    assert ("promote", "a2", "canary_passed") in ev


def test_refused_requests_leave_the_active_policy_untouched(tmp_path, models, iris_model_path):
    """A corrupt file, another input width, another action width, a missing file, an unknown name, and
    unloading the active policy: each refused (exit 1) with its reason; A still answers, alone."""
    node, cfg = start_node(tmp_path, models["a"], extra=CALM)
    pa = Policy.load(models["a"])
    robot = Robot(node.endpoints)
    rng, xs = np.random.default_rng(5), {}
    try:
        robot.connect(np.zeros(6))
        cases = [(("load", "bad", models["bad"]), "load_failed"),
                 (("load", "iris", iris_model_path), "size_mismatch"),
                 (("load", "wide", models["wide"]), "size_mismatch"),
                 (("load", "ghost", str(tmp_path / "missing.npz")), "no_file"),
                 (("load", "no/slash", models["b"]), "bad_name"),
                 (("activate", "nobody"), "not_resident"),
                 (("shadow", "nobody"), "not_resident"),
                 (("unload", "a"), "in_use"),
                 (("activate", "a"), "already_active"),
                 (("rollback",), "no_previous"),
                 (("unshadow",), "no_shadow")]
        for args, code in cases:
            rc, rep = policy_cli(cfg, *args)
            assert rc == 1 and not rep["ok"] and rep["error"] == code, (args, rep)
            assert rep["message"]
            assert rep["status"]["active"] == "a" and [p["name"] for p in rep["status"]["policies"]] == ["a"]
            lockstep(robot, xs, rng, 5, pa)
        p = run_cli("policy", "load", "iris", iris_model_path, "--config", cfg)
        assert p.returncode == 1 and "takes 4 inputs" in p.stdout and "6" in p.stdout
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary, _ = load_run(run_dir)
    assert summary["lifecycle"]["active"] == "a"
    assert sum(e["event"] == "refused" for e in summary["lifecycle"]["transitions"]) == 6     # the loads


def test_resident_policies_are_bounded(tmp_path, models):
    """[lifecycle] max_policies bounds how many are resident; unloading frees a place."""
    node, cfg = start_node(tmp_path, models["a"], extra=CALM + "[lifecycle]\nmax_policies = 2\n")
    try:
        assert policy_cli(cfg, "load", "b", models["b"])[0] == 0
        rc, rep = policy_cli(cfg, "load", "a2", models["a2"])
        assert rc == 1 and rep["error"] == "too_many"
        assert policy_cli(cfg, "unload", "b")[0] == 0
        rc, rep = policy_cli(cfg, "load", "a2", models["a2"])
        assert rc == 0 and sorted(p["name"] for p in rep["status"]["policies"]) == ["a", "a2"]
    finally:
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err


def _run(loop):
    loop.run()      # any Python allocation inside the compiled loop is attributed to this line


def test_1000_switches_allocate_nothing_on_the_loop_thread(tmp_path, models):
    """1000 activations (and shadow / canary / rollback requests) posted from another thread while the loop
    runs under tracemalloc: every one taken, none allocating on the loop thread."""
    import gc
    import time
    import tracemalloc

    from control_node.loop._rtloop import LoopConfig, RtLoop
    from control_node.loop.libzmq import libzmq_functions
    from test_loop_core import X_6
    pa, pb = Policy.load(models["a"]), Policy.load(models["b"])
    codes = {name: i + 1 for i, name in enumerate(rundir.TRANSITIONS)}
    done = []

    def switcher(loop):
        while loop.cycles < 100:
            time.sleep(0.001)
        for i in range(1000):
            kind = ("shadow", "unshadow", "canary", "rollback")[i // 2 % 4] if i % 2 else "activate"
            slot = (i // 2) % 2 if kind == "activate" else (1 - loop.active)
            seq = loop.post_request(codes[kind], slot)
            while loop.request_done(seq) is None:
                time.sleep(0.0002)
            done.append(kind)
        loop.request_stop()

    with FedSockets(tmp_path, X_6) as socks:
        cfg = LoopConfig(period_ns=50_000, stale_after_ns=10**9, spin_ns=10_000, ring_cycles=1000,
                         safe_u=[0.0] * 4, action_ring_cycles=500)
        loop = RtLoop(pa, cfg, socks.sub.underlying, socks.pub.underlying, libzmq_functions())
        loop.set_slot(1, pb)
        t = threading.Thread(target=switcher, args=(loop,), daemon=True)
        gc.collect()
        gc.disable()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        t.start()
        _run(loop)
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        gc.enable()
        t.join(timeout=10)
    assert len(done) == 1000
    records, n = loop.transitions_since(0)
    kinds = [rundir.TRANSITIONS[r[1] - 1] for r in records]
    assert n >= 1000 and kinds.count("activate") >= 450 and "shadow" in kinds and "canary" in kinds
    assert loop.frames_valid > 100
    run_line = _run.__code__.co_firstlineno + 1
    in_loop = [d for d in snap1.compare_to(snap0, "lineno")
               if d.traceback[0].filename == __file__ and d.traceback[0].lineno == run_line]
    assert sum(d.count_diff for d in in_loop) == 0   # no Python memory allocated by the loop


@pytest.mark.slow
def test_record_and_replay_follow_a_switch(tmp_path, iris_model_path):
    """A switch made while recording is in the record stream; `replay --verify` repeats it on a fresh node
    before the first frame the new policy answered, so every action matches; --no-follow does not, and the
    answers after the switch then differ."""
    import signal
    import subprocess
    import sys
    import time

    from test_record_replay import start_recorder
    from control_node.bench.harness import CHILD_CWD, NodeProcess, child_env, make_endpoint_dir
    from support.nodeutil import write_node_config
    from control_node.recording.reader import policy_switches, recorded_transitions
    from control_node.train.iris import export_verified, train_iris
    # the other policy answers a different class on every frame (the iris policy's logits rolled by one class),
    # so every frame it answered is a mismatch for a replay that does not follow the switch, however late on a
    # loaded host the switch lands in the stream
    import dataclasses
    import numpy as np
    base = train_iris()
    (W, b) = base.layers[-1]
    other = str(tmp_path / "other.npz")
    export_verified(dataclasses.replace(base, layers=[*base.layers[:-1], (np.roll(W, 1, axis=1), np.roll(b, 1))],
                                        sha256=""), other)          # "": its own content hash, computed anew
    cfg = str(tmp_path / "node.toml")
    write_node_config(cfg, make_endpoint_dir())
    mcap = tmp_path / "rec.mcap"
    with NodeProcess(cfg, iris_model_path, "--run-dir", tmp_path / "node") as node1:
        node_eps = node1.endpoints
        # loaded before the stream, so that only the activation (one CLI start-up) falls inside it
        rc, rep = policy_cli(cfg, "load", "other", other)
        assert rc == 0, rep
        rec = start_recorder(cfg, mcap)
        # a stream longer than the test needs, stopped (SIGINT: it still writes its results) once the other
        # policy has answered 800 frames: the switch lands mid-stream however slowly a loaded host runs the
        # `policy activate` start-up (a 4 s stream once ended before it, and nothing was switched in the stream)
        sim = subprocess.Popen([sys.executable, "-m", "control_node", "sim", "gauss", "--duration", "30", "--noise",
                                "0.3", "--seed", "3", "--tap", "--config", cfg, "--run-dir", str(tmp_path / "sim")],
                               cwd=CHILD_CWD, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        import msgpack
        import zmq
        diag = zmq.Context.instance().socket(zmq.SUB)
        diag.setsockopt(zmq.SUBSCRIBE, b"")
        diag.connect(node_eps["diagnostics"])

        def wait_frames(n):
            """The node's frames_valid once it reaches ``n`` (the diagnostics stream, twice a second)."""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if diag.poll(200):
                    got = msgpack.unpackb(diag.recv())["frames_valid"]
                    if got >= n:
                        return got
            raise AssertionError(f"the node did not reach {n} valid frames in 60 s")

        wait_frames(800)                # switch once the node has acted on a good part of the stream
        rc, rep = policy_cli(cfg, "activate", "other")
        assert rc == 0, rep
        wait_frames(wait_frames(0) + 800)
        diag.close(0)
        sim.send_signal(signal.SIGINT)
        out, _ = sim.communicate(timeout=60)
        assert sim.returncode == 0, out
        rec.send_signal(signal.SIGINT)
        rec.communicate(timeout=10)
    switches = policy_switches(recorded_transitions(mcap))
    assert [w[1] for w in switches] == ["iris", "other"] and switches[1][0] > 0
    for follow in (True, False):
        d = tmp_path / f"replay-{follow}"
        cfg2 = str(tmp_path / f"node-{follow}.toml")
        write_node_config(cfg2, make_endpoint_dir())
        with NodeProcess(cfg2, iris_model_path, "--run-dir", d / "node") as node2:
            r = run_cli("replay", mcap, "--verify", "--config", cfg2, "--run-dir", d / "rp",
                        *([] if follow else ["--no-follow"]), timeout=120)
            node2.stop()
        s = json.loads((d / "rp" / "summary.json").read_text())
        live = json.loads((d / "node" / "summary.json").read_text())
        events = [(e["event"], e["policy"]) for e in live["lifecycle"]["transitions"]]
        if follow:
            assert r.returncode == 0, r.stdout + r.stderr
            assert_replay_compared_every_recorded_answer(mcap, tmp_path / "sim", s["verify"])
            assert [f["policy"] for f in s["stream"]["followed_switches"]] == ["other"]
            assert s["stream"]["followed_switches"][0]["before_recorded_seq"] == switches[1][0] + 1
            assert ("activate", "other") in events
        else:
            assert r.returncode == 1 and s["verify"]["mismatches"] > 0, r.stdout
            assert ("activate", "other") not in events
            first_bad = min(m["seq"] for m in s["verify"]["mismatched"])
            assert first_bad > switches[1][0]          # the frames before the switch still match


def test_activation_resets_recurrent_state_and_a_canary_rollback_keeps_the_shadowed_one(tmp_path):
    """R (an LSTM) runs, B takes over, rollback to R: R answers as a fresh policy from zero state (its old
    state is gone). During a canary, R runs in shadow on every frame, so a rollback hands back a state that
    went on: the answers equal R carried through every frame since its activation."""
    from functools import partial

    from test_recurrent import rnn_spec
    from test_recurrent_node import answers as recurrent_answers
    spec = rnn_spec("lstm", 6, 32, [16, 3], dtype="float64", seed=3)
    r_path, b_path = tmp_path / "r.npz", tmp_path / "b.npz"
    save_model(spec, r_path)
    save_model(rnn_spec("lstm", 6, 32, [16, 3], dtype="float64", seed=4), b_path)
    rules = "[rollout]\nwindow_ticks = 100000\nmax_disagree = 1.0\ncanary_s = 1000.0\n"
    node, cfg = start_node(tmp_path, r_path, extra=CALM + rules)
    robot = Robot(node.endpoints)
    X = np.random.default_rng(0).normal(0, 1.5, (90, 6)) * spec.scale + spec.mean
    answers = partial(recurrent_answers, robot)
    try:
        robot.connect(X[0])
        answers(X[:20])
        assert policy_cli(cfg, "load", "b", str(b_path))[0] == 0
        assert policy_cli(cfg, "activate", "b")[0] == 0
        got_b = answers(X[20:40])
        assert policy_cli(cfg, "rollback")[0] == 0
        got_r = answers(X[40:60])
        assert policy_cli(cfg, "activate", "b", "--canary")[0] == 0      # R goes on in shadow
        answers(X[60:75])
        assert policy_cli(cfg, "rollback")[0] == 0
        got_r2 = answers(X[75:90])
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    assert np.array_equal(got_b, Policy.load(b_path).act_batch(X[20:40]))        # b from zero
    fresh = Policy.load(r_path)
    assert np.array_equal(got_r, fresh.act_batch(X[40:60]))                     # reset on activation
    assert np.array_equal(got_r2, fresh.act_batch(X[60:90])[15:])                # carried in shadow
    assert not np.allclose(got_r, Policy.load(r_path).act_batch(X[:60])[40:])    # the check can fail
