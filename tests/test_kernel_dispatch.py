"""The kernel's vector copy is chosen by measurement (kernels/dispatch.py, issue #47): the fastest copy timed
on this machine for the policy's own shape and storage, cached per machine; an explicit isa forces a copy; the
choice and its times are recorded in the policy's status, summary.json and the report. Behaviour, not speed:
which copy is fastest differs between machine kinds, so a copy is made slow on purpose where a test needs one
to lose."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from support.nodeutil import load_run, start_node
from control_node.bench.harness import run_cli
from control_node.kernels import dispatch


def rsl_rl_like(seed):
    """rsl_rl's actor shape (48-512-256-128-12 ELU, float32), random weights."""
    from control_node.bench.policy import SHAPES, make_spec
    return make_spec(SHAPES["rsl_rl 48-512-256-128-12 ELU + normaliser"], "float32", seed=seed)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def slowed(copy, factor=8):
    """A call hook that makes ``copy`` do ``factor`` calls' work per call: slow on purpose, measured for real."""
    def run(c, policy, x, out):
        for _ in range(factor if c == copy else 1):
            policy.act_into(x, out)
    return run


@pytest.mark.parametrize("victim", ["auto", "avx2"])
def test_the_copy_chosen_is_the_fastest_measured_and_never_one_made_slow(victim, cache_home):
    spec = rsl_rl_like(seed=1)
    if victim not in dispatch.available():
        pytest.skip(f"this CPU runs no {victim} copy ({dispatch.available()})")
    policy, choice = dispatch.policy_for(spec, "fastest", run=slowed(victim))
    t = choice["times_ns"]
    assert set(t) == set(dispatch.available()) and choice["source"] == "measured"
    assert choice["copy"] != victim, choice
    assert t[victim] > 3 * min(v for c, v in t.items() if c != victim), t      # the slowing was measured
    # the rule: the fastest, unless it beats "auto" (the old rule) by no more than MARGIN
    best = min(t, key=t.get)
    want = best if t[best] < t["auto"] * (1 - dispatch.MARGIN) else "auto"
    assert choice["copy"] == want
    assert policy.isa == choice["isa"]
    assert not os.path.exists(dispatch.cache_path())          # a hooked measurement is never cached


def test_the_choice_is_cached_per_machine_and_shape(cache_home):
    spec = rsl_rl_like(seed=2)
    _, first = dispatch.policy_for(spec, "fastest")
    _, again = dispatch.policy_for(spec, "fastest")
    assert first["source"] == "measured" and again["source"] == "cache"
    assert again["copy"] == first["copy"] and again["times_ns"] == first["times_ns"]
    with open(dispatch.cache_path()) as f:
        entries = json.load(f)["entries"]
    assert len(entries) == 1 and next(iter(entries)).startswith(dispatch.machine_key() + "|")
    # another storage is another measurement
    _, f16 = dispatch.policy_for(spec, "fastest", storage="f16")
    assert f16["source"] == "measured"


@pytest.mark.parametrize("copy", ["sse2", "avx2", "avx512"])
def test_a_forced_isa_is_honoured(copy, cache_home, tmp_path):
    from control_node.kernels import save_model
    from control_node.kernels._policy import isa_missing
    if isa_missing(copy):
        pytest.skip(f"this CPU lacks {isa_missing(copy)} for the {copy} copy")
    path = tmp_path / "p.npz"
    save_model(rsl_rl_like(seed=3), path)
    policy = dispatch.load(str(path), copy)
    assert policy.copy_choice["source"] == "forced" and policy.copy_choice["copy"] == copy
    assert policy.isa.startswith(copy)
    assert not os.path.exists(dispatch.cache_path())           # nothing measured


def test_the_choice_is_recorded_in_summary_status_and_report(tmp_path, cache_home):
    """A real node with the default [policy] isa = "fastest": summary.json's model.copy holds the choice and
    the times of every candidate; `policy status` and the report print it. A forced copy is recorded as such."""
    from control_node.kernels import save_model
    model = tmp_path / "p.npz"
    save_model(rsl_rl_like(seed=4), model)
    node, cfg = start_node(tmp_path, str(model), extra="[policy]\nisa = \"fastest\"\n")
    try:
        p = run_cli("policy", "status", "--config", cfg)
        assert p.returncode == 0 and "kernel copy " in p.stdout and "fastest measured on this machine" in p.stdout, \
            p.stdout
    finally:
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary, _ = load_run(run_dir)
    choice = summary["model"]["copy"]
    assert choice["setting"] == "fastest" and choice["source"] in ("measured", "cache")
    assert set(choice["times_ns"]) == set(dispatch.available()) and choice["isa"] == summary["model"]["isa"]
    rep = run_cli("report", run_dir, "--no-plots", "--out", str(tmp_path / "report"))
    assert rep.returncode == 0 and "kernel copy " + choice["copy"] in rep.stdout, rep.stdout
    (tmp_path / "forced").mkdir(mode=0o700)
    node, cfg = start_node(tmp_path / "forced", str(model), extra="[policy]\nisa = \"sse2\"\n")
    rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary, _ = load_run(run_dir)
    assert summary["model"]["copy"]["source"] == "forced" and summary["model"]["isa"] == "sse2"


def test_a_bad_isa_setting_is_refused_naming_the_key(tmp_path, iris_model_path):
    from support.nodeutil import write_node_config
    cfg = tmp_path / "node.toml"
    write_node_config(str(cfg), str(tmp_path), "[policy]\nisa = \"neon\"\n")
    p = run_cli("run", "--config", str(cfg), "--model", iris_model_path, "--duration", "1")
    assert p.returncode == 2 and "field 'policy.isa'" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_measure_times_every_candidate_on_the_same_input():
    spec = rsl_rl_like(seed=5)
    t = dispatch.measure(spec, rounds=3, calls=20)
    assert set(t) == set(dispatch.available()) and all(np.isfinite(v) and v > 0 for v in t.values())
