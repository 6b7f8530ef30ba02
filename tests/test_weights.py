"""Narrow weight storage (f16 / bf16 / int8): every storage against the float32 policy, through each kernel copy
selected explicitly (``Policy(spec, isa=...)``), on every activation, head and recurrent kind.

Two checks per case: the kernel against the numpy reference run on the very weights it stores (kernels.weights.
effective_spec: as tight as float32 is checked), and the storage's error against the float32 policy within
BOUND, recorded per case with pytest's ``record_property`` (``pytest --junitxml=FILE`` keeps them).

BOUND is what these untrained random networks measure at the proof's edge samples (observations at 50 std,
clipped; the worst cases are the linear 'identity' stack), with headroom: f16 1.8e-3, bf16 1.4e-2, int8 5.9e-2
of the action range, all three ISA copies alike. It is above the import's default --tolerance
(kernels.weights.DEFAULT_TOLERANCE: refusing is the safe default) for some of them; a conversion bug (a wrong
shift, a lost scale, a mis-rounded half) is orders of magnitude above it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from control_node.kernels import ACTIVATIONS, ModelSpec, Policy, check_consistency, load_model, save_model
from control_node.kernels._policy import isa_missing
from control_node.kernels.importers.proof import edge_samples, sequences
from control_node.kernels.reference import random_inputs
from control_node.kernels.weights import (DEFAULT_TOLERANCE, WeightStorageError, effective_spec, measure_error,
                                          quantise)

from support.alloc import bytes_left_by_calls

STORAGES = ["f16", "bf16", "int8"]
BOUND = {"f16": 2.5e-3, "bf16": 2e-2, "int8": 8e-2}      # see the module docstring
ISAS = ["sse2", "avx2", "avx512"]
GATES = {"lstm": 4, "gru": 3}


def need(isa):
    missing = isa_missing(isa)
    if missing is not None:
        pytest.skip(f"this CPU cannot run the {isa} copy: it lacks {missing}")


def dense_spec(act, head, dtype="float32", sizes=(11, 64, 40, 5), seed=0):
    rng = np.random.default_rng(seed)
    layers = [(rng.normal(0, 1 / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b)) for a, b in zip(sizes[:-1], sizes[1:])]
    n, m = sizes[0], sizes[-1]
    acts = [act] * (len(layers) - 1) + ["identity"]
    common = dict(layers=layers, mean=rng.normal(size=n), scale=rng.uniform(0.5, 2, n),
                  feature_names=[f"x{i}" for i in range(n)], dtype=dtype, activations=acts,
                  alphas=[ACTIVATIONS[a][1] for a in acts])
    if head == "argmax":
        return ModelSpec(classes=[f"c{j}" for j in range(m)], **common)
    return ModelSpec(classes=[], head="continuous", squash=True, action_low=-0.9, action_high=0.8,
                     action_offset=rng.normal(size=m), action_scale=rng.uniform(0.1, 0.5, m),
                     action_names=[f"joint{j}" for j in range(m)], obs_clip_low=-6.0, obs_clip_high=6.0, **common)


def rnn_spec(kind, n=7, H=40, dense=(24, 3), dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    G, k = GATES[kind], 1 / np.sqrt(H)
    sizes = [H] + list(dense)
    layers = [(rng.normal(0, 1 / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b)) for a, b in zip(sizes[:-1], sizes[1:])]
    m = sizes[-1]
    return ModelSpec(layers=layers, mean=rng.normal(size=n), scale=rng.uniform(0.5, 2, n), classes=[],
                     feature_names=[f"x{i}" for i in range(n)], dtype=dtype,
                     activations=["tanh"] * (len(layers) - 1) + ["identity"], head="continuous", squash=True,
                     action_low=-1.0, action_high=1.0, action_names=[f"j{i}" for i in range(m)], recurrent=kind,
                     rnn_W_ih=rng.uniform(-k, k, (G * H, n)), rnn_W_hh=rng.uniform(-k, k, (G * H, H)),
                     rnn_b_ih=rng.uniform(-k, k, G * H), rnn_b_hh=rng.uniform(-k, k, G * H))


def proof_rows(spec, n=300):
    """Random rows (3 std around the normaliser's mean) then the proof's edge samples, as an import proves."""
    return np.concatenate([random_inputs(spec, n, 0), edge_samples(spec)[0]])


def check_storage_case(spec, storage, isa, record_property, what):
    need(isa)
    p = Policy(spec, isa=isa, weights=storage)
    assert p.weights == storage and p.isa.startswith(isa)
    check_consistency(p, spec, n_random=300)          # the kernel on exactly the weights it stores
    X = proof_rows(spec)
    seqs = sequences(len(X)) if spec.recurrent else None
    err = measure_error(spec, storage, X, policy_class=Policy, isa=isa, seqs=seqs, tolerance=BOUND[storage])
    record_property(f"{what} {storage} {isa}", f"max_abs {err['max_abs']:.3g} p99_abs {err['p99_abs']:.3g} "
                    f"max_rel {err['max_rel']:.3g} p99_rel {err['p99_rel']:.3g} on {err['samples']} rows "
                    f"(default tolerance {DEFAULT_TOLERANCE[storage]:g})")
    assert err["max_rel"] <= BOUND[storage] and err["p99_rel"] <= err["max_rel"]
    assert err["max_abs"] > 0          # a narrower storage that changes nothing would be no storage at all
    return err


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_every_activation_continuous(act, storage, isa, record_property):
    check_storage_case(dense_spec(act, "continuous"), storage, isa, record_property, f"{act} continuous")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("storage", STORAGES)
def test_wide_layers_run_several_panels_at_once(storage, isa, record_property):
    # 300 outputs: five 256-byte panels (float32), so the kernels that take two panels per pass (narrow weights
    # on 64-byte vectors) and the single-panel one both run
    spec = dense_spec("elu", "continuous", sizes=(20, 300, 130, 6))
    need(isa)
    assert Policy(spec, isa=isa, weights=storage).layout[0] == "axpy"      # the panels, not the dot form
    check_storage_case(spec, storage, isa, record_property, "elu wide")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("storage", ["f16", "bf16", "int8"])
@pytest.mark.parametrize("kind", ["dense", "lstm"])
def test_float64_models_with_narrow_weights_on_every_copy(kind, storage, isa, record_property):
    # float64 arithmetic on narrow weights: paired bf16 widened twice, the two-panel pass (AVX-512: 4 vectors of
    # 8 doubles a panel), a recurrent layer's gate panels
    spec = (dense_spec("elu", "continuous", dtype="float64", sizes=(20, 300, 130, 6)) if kind == "dense"
            else rnn_spec("lstm", H=70, dtype="float64"))
    check_storage_case(spec, storage, isa, record_property, f"float64 {kind}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("storage", STORAGES)
def test_argmax_head_dot_and_axpy_layers(storage, isa, record_property):
    # 11 -> 64 -> 40 -> 5: the wide layers axpy, the 5-class head dot form
    spec = dense_spec("relu", "argmax")
    err = check_storage_case(spec, storage, isa, record_property, "relu argmax")
    assert err["measured_on"] == "logits" and "class_changes" in err
    assert Policy(spec, isa=isa, weights=storage).layout[-1] == "dot"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_kinds(kind, storage, isa, record_property):
    check_storage_case(rnn_spec(kind), storage, isa, record_property, f"{kind}")


@pytest.mark.parametrize("storage", STORAGES)
def test_float64_model_keeps_float64_arithmetic(storage, record_property):
    spec = dense_spec("elu", "continuous", dtype="float64")
    p = Policy(spec, weights=storage)
    assert p.dtype == "float64" and p.last_outputs().dtype == np.float64
    check_storage_case(spec, storage, "sse2", record_property, "elu continuous float64")


def test_f32_storage_is_exact_and_the_default():
    spec = dense_spec("tanh", "continuous")
    X = proof_rows(spec)
    a, b = Policy(spec), Policy(spec, weights="f32")
    assert a.weights == "f32" and a.sha256 == spec.sha256
    assert np.array_equal(a.act_batch(X), b.act_batch(X), equal_nan=True)
    assert effective_spec(spec) is spec


def test_int8_is_per_output_channel_symmetric():
    W = np.array([[1.0, -0.01], [-0.5, 0.002], [0.25, 0.0]])
    q, s = quantise(W, "int8")
    assert s.dtype == np.float32 and s.shape == (2,)
    assert q[0, 0] == 127 and q[0, 1] == -127 and np.abs(q).max() <= 127
    np.testing.assert_allclose(s, [1 / 127, 0.01 / 127], rtol=1e-6)
    assert quantise(np.zeros((2, 1)), "int8")[1][0] == 1.0          # an all-zero channel keeps a finite scale


def test_resident_bytes_follow_the_storage():
    spec = dense_spec("relu", "continuous", sizes=(48, 512, 256, 128, 12))
    n = {w: Policy(spec, weights=w).nbytes for w in ["f32", "f16", "bf16", "int8"]}
    W = sum(W.size for W, _ in spec.layers)
    assert n["f32"] - n["f16"] >= 2 * W * 0.95          # every weight two bytes fewer
    assert n["f16"] == n["bf16"]
    assert n["f16"] - n["int8"] >= W * 0.95 - 4 * 1024   # one byte fewer each, float32 scales added


def test_too_tight_tolerance_refuses_naming_action_and_observation():
    spec = dense_spec("elu", "continuous")
    X = proof_rows(spec)
    with pytest.raises(WeightStorageError) as e:
        measure_error(spec, "int8", X, policy_class=Policy, tolerance=1e-9, file="policy.onnx")
    msg = str(e.value)
    assert "policy.onnx: int8 weights" in msg and "above the tolerance 1e-09" in msg
    assert "worst on action" in msg and "(joint" in msg and "at observation row" in msg and "x = [" in msg


def test_unknown_storage_and_isa_are_refused_by_name():
    spec = dense_spec("relu", "continuous")
    with pytest.raises(ValueError, match="weights: 'f8' is not a storage"):
        Policy(spec, weights="f8")
    with pytest.raises(ValueError, match="isa: 'neon' is not a kernel copy"):
        Policy(spec, isa="neon")


def test_f16_model_file_runs_through_the_portable_copy(tmp_path):
    """A model file that says f16 loads on a CPU without F16C: the portable copy (selected here) converts
    the halves in integer arithmetic, and matches the F16C / AVX-512 copies."""
    spec = dense_spec("silu", "continuous")
    X = proof_rows(spec)
    err = measure_error(spec, "f16", X, policy_class=Policy, isa="sse2", tolerance=BOUND["f16"])
    narrow = dataclasses.replace(spec, weights="f16", weights_error=err, sha256="")
    path = tmp_path / "f16.npz"
    save_model(narrow, path)
    loaded = load_model(path)
    assert loaded.weights == "f16" and loaded.weights_error["max_abs"] == err["max_abs"]
    p = Policy.load(path, isa="sse2")                 # verified against the reference at load
    assert p.weights == "f16" and p.isa == "sse2" and p.weights_error["storage"] == "f16"
    got = p.act_batch(X)
    for isa in ("avx2", "avx512"):
        if isa_missing(isa) is None:
            other = Policy.load(path, isa=isa).act_batch(X)
            np.testing.assert_allclose(got, other, rtol=1e-5, atol=1e-6)
    assert loaded.sha256 != spec.sha256    # the hash covers the storage: a reader that ignores it refuses the file


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("kind", [None, "gru"])
def test_no_allocation_per_call(storage, kind):
    spec = rnn_spec(kind) if kind else dense_spec("elu", "continuous", sizes=(48, 512, 256, 128, 12))
    p = Policy(spec, weights=storage)
    x, out = np.random.default_rng(0).normal(size=spec.n_features), np.zeros(p.n_actions)
    assert bytes_left_by_calls(p.act_into, x, out, n=50_000) == (0, 0)


def test_a_real_node_says_what_its_weights_were(tmp_path):
    """A node running an f16 model file: `policy status` shows each resident policy's storage, its measured
    error and resident bytes (an int8 one loaded beside it), and the run's summary.json names the storage and
    error of the policy that ran."""
    import json

    from conftest import continuous_spec
    from support.nodeutil import start_node

    from control_node.bench.harness import run_cli
    from control_node.kernels.importers.proof import store_weights
    spec = continuous_spec("float32", seed=4)
    paths = {}
    for w in ("f16", "int8"):
        stored = store_weights(spec, w, policy_class=Policy, tolerance=1.0, n_random=200)
        paths[w] = str(tmp_path / f"{w}.npz")
        save_model(stored, paths[w])
    node, cfg = start_node(tmp_path, paths["f16"], extra="[watchdog]\nstale_after_ms = 5000.0\n")
    try:
        p = run_cli("policy", "load", "q", paths["int8"], "--config", cfg, "--json", timeout=60)
        assert p.returncode == 0, p.stderr
        p = run_cli("policy", "status", "--config", cfg, "--json", timeout=60)
        st = json.loads(p.stdout)["status"]
        by = {r["weights"]: r for r in st["policies"]}
        assert set(by) == {"f16", "int8"}
        assert by["f16"]["weights_error"]["storage"] == "f16" and by["int8"]["weights_error"]["max_abs"] > 0
        assert by["int8"]["nbytes"] < by["f16"]["nbytes"]        # resident bytes follow the storage
        text = run_cli("policy", "status", "--config", cfg, timeout=60).stdout
        assert "weights f16: max |error|" in text and "weights int8: max |error|" in text and "KiB resident" in text
    finally:
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    with open(f"{run_dir}/summary.json") as f:
        pol = json.load(f)["policy"]
    assert pol["weights"] == "f16" and pol["weights_error"]["storage"] == "f16"
