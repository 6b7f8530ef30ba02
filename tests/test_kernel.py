"""The compiled kernel against the numpy reference: random shapes, both dtypes, edge inputs, no allocation."""
from __future__ import annotations

import gc
import itertools
import os
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_node.kernels import ConsistencyError, Policy, check_consistency, reference_logits
from control_node.kernels.reference import RTOL, random_inputs
from conftest import random_spec

DTYPES = ["float64", "float32"]


def assert_matches_reference(policy, spec, X):
    """predict_batch, predict and logits agree with the reference (argmax modulo true near-ties)."""
    ref = reference_logits(spec, X).astype(np.float64)
    ref_arg = np.argmax(ref, axis=1)
    tol = RTOL[spec.dtype] * np.maximum(1.0, np.abs(ref).max(axis=1))
    batch = policy.predict_batch(X)
    assert batch.dtype == np.int64 and batch.shape == (len(X),)
    for i in range(len(X)):
        x = np.ascontiguousarray(X[i])
        got = policy.logits(x)
        assert got.dtype == np.dtype(spec.dtype) and got.shape == (policy.n_classes,)
        err = np.abs(got.astype(np.float64) - ref[i]).max()
        assert err <= tol[i], f"sample {i}: logit error {err:.3g} > {tol[i]:.3g} ({spec.layer_sizes}, {spec.dtype})"
        one = policy.predict(x)
        assert one == batch[i], f"sample {i}: predict {one} != predict_batch {batch[i]}"
        if one != ref_arg[i]:
            assert one >= 0
            margin = ref[i, ref_arg[i]] - ref[i, one]
            assert margin <= tol[i], (f"sample {i}: argmax {one} vs reference {ref_arg[i]} "
                                      f"with margin {margin:.3g} > {tol[i]:.3g}")


widths = st.integers(min_value=1, max_value=70)


@settings(max_examples=int(os.environ.get("KERNEL_TEST_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_features=st.integers(1, 12),
       hidden=st.one_of(st.lists(widths, min_size=1, max_size=1), st.lists(widths, min_size=3, max_size=3)),
       n_classes=st.integers(1, 12),
       dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_random_shapes_match_reference(make_spec, n_features, hidden, n_classes, dtype, seed):
    spec = make_spec([n_features, *hidden, n_classes], dtype=dtype, seed=seed)
    policy = Policy(spec)
    assert (policy.n_features, policy.n_classes) == (n_features, n_classes)
    X = random_inputs(spec, 40, seed=seed % 1000)
    assert_matches_reference(policy, spec, X)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes", [[4, 13, 3], [4, 16, 3], [12, 70, 3], [5, 70, 70, 70, 2], [1, 1, 1],
                                   [7, 9, 1], [3, 1024, 3], [4, 256, 256, 3], [1000, 9, 2], [1000, 3, 2]])
def test_fixed_shapes_match_reference(make_spec, sizes, dtype):
    spec = make_spec(sizes, dtype=dtype, seed=sum(sizes))
    policy = Policy(spec)
    X = random_inputs(spec, 300, seed=1)
    assert_matches_reference(policy, spec, X)
    # the full load-time proof agrees too
    assert check_consistency(policy, spec, n_random=200)["checked"] >= 200


def test_4_13_3_layout_and_answers(make_spec):
    """Width 13 is not a multiple of the 4/8 lanes: the padded lanes must stay invisible."""
    for dtype in DTYPES:
        spec = make_spec([4, 13, 3], dtype=dtype, seed=13)
        policy = Policy(spec)
        assert policy.layout == ["axpy", "dot"]
        assert_matches_reference(policy, spec, random_inputs(spec, 500, seed=2))


def test_both_layer_layouts_are_exercised(make_spec):
    """Wide-in, narrow-out layers use the dot form; the sweep above must cover both forms,
    including a dot-form hidden layer (ReLU) spanning several output vectors (1000 -> 9)."""
    assert Policy(make_spec([4, 16, 32])).layout == ["axpy", "axpy"]
    assert Policy(make_spec([4, 16, 3])).layout == ["axpy", "dot"]
    assert Policy(make_spec([12, 200, 3])).layout == ["axpy", "dot"]
    assert "dot" in Policy(make_spec([3, 1024, 3], dtype="float32")).layout
    assert Policy(make_spec([1000, 9, 2])).layout == ["dot", "dot"]
    assert Policy(make_spec([1000, 3, 40], dtype="float32")).layout == ["dot", "axpy"]


def test_predict_on_iris(iris_spec):
    from control_node.train.iris import load_iris_split
    policy = Policy(iris_spec)
    Xtr, Xte, ytr, yte, _, _ = load_iris_split()
    assert (policy.predict_batch(Xte) == yte).mean() >= 0.93
    assert repr(policy).startswith("Policy(4 -> 16 -> 3, float64")
    assert policy.isa in ("avx2+fma", "sse2", "native", "generic")


@pytest.mark.parametrize("bad", [
    np.zeros(4, dtype=np.float32),                 # wrong dtype
    np.zeros(4, dtype=np.int64),                   # wrong dtype
    np.zeros(5),                                   # wrong length
    np.zeros(3),                                   # wrong length
    np.zeros((1, 4)),                              # wrong ndim
    np.zeros(8)[::2],                              # non-contiguous
    [0.0, 0.0, 0.0, 0.0],                          # not an ndarray
    np.zeros(4).view(np.ma.MaskedArray),           # ndarray subclass
    None,
], ids=["f32", "i64", "len5", "len3", "2d", "strided", "list", "subclass", "none"])
def test_predict_rejects_bad_input(iris_spec, bad):
    policy = Policy(iris_spec)
    with pytest.raises(TypeError, match="float64"):
        policy.predict(bad)
    with pytest.raises(TypeError):
        policy.logits(bad)
    with pytest.raises(TypeError):
        policy.bind_input(bad)


def test_policy_requires_spec(tmp_path):
    with pytest.raises(TypeError, match="ModelSpec"):
        Policy(str(tmp_path / "x.npz"))


def test_predict_batch_shapes(iris_spec):
    policy = Policy(iris_spec)
    X = random_inputs(iris_spec, 64, seed=3)
    want = policy.predict_batch(X)
    # non-contiguous and Fortran-order inputs are converted, same answers
    assert (policy.predict_batch(np.asfortranarray(X)) == want).all()
    assert (policy.predict_batch(np.repeat(X, 2, axis=0)[::2]) == want).all()
    assert (policy.predict_batch(X.astype(np.float32)) == policy.predict_batch(X.astype(np.float32).astype(np.float64))).all()
    assert policy.predict_batch(np.empty((0, 4))).shape == (0,)
    with pytest.raises(ValueError, match=r"\(n, 4\)"):
        policy.predict_batch(np.zeros((3, 5)))
    with pytest.raises(ValueError):
        policy.predict_batch(np.zeros(4))


def test_bind_input_and_predict_bound(iris_spec):
    policy = Policy(iris_spec)
    with pytest.raises(RuntimeError, match="bind_input"):
        policy.predict_bound()
    buf = np.zeros(4)
    policy.bind_input(buf)
    X = random_inputs(iris_spec, 200, seed=4)
    want = policy.predict_batch(X)
    for i in range(len(X)):
        buf[:] = X[i]                  # fill in place, no argument per call
        assert policy.predict_bound() == want[i]
    # rebinding to another buffer switches the input
    other = np.ascontiguousarray(X[7])
    policy.bind_input(other)
    assert policy.predict_bound() == want[7]
    # the bound buffer is kept alive by the policy
    policy.bind_input(np.array(X[9]))
    gc.collect()
    assert policy.predict_bound() == want[9]


def test_chain_probe(iris_spec):
    policy = Policy(iris_spec)
    X = random_inputs(iris_spec, 64, seed=5)
    # reproduce the dependent walk in Python
    pred = policy.predict_batch(X)
    s, row = 0, 0
    for _ in range(500):
        a = int(pred[row])
        s += a
        row = (row + 1 + a) % len(X)
    assert policy._chain(X, 500) == s
    with pytest.raises(ValueError):
        policy._chain(X[:3], 10)   # needs more rows than classes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e308, -1e308])
def test_non_finite_and_huge_inputs_give_minus_one(iris_spec, dtype, value):
    from control_node.kernels import ModelSpec
    spec = ModelSpec(layers=iris_spec.layers, mean=iris_spec.mean, scale=iris_spec.scale,
                     classes=iris_spec.classes, feature_names=iris_spec.feature_names, dtype=dtype)
    policy = Policy(spec)
    x = np.full(4, value)
    assert policy.predict(x) == -1
    assert not np.isfinite(policy.logits(x)).all()
    buf = np.full(4, value)
    policy.bind_input(buf)
    assert policy.predict_bound() == -1
    assert policy.predict_batch(x[None, :])[0] == -1
    # no sticky state: a normal sample afterwards gets the reference answer again
    X = random_inputs(spec, 50, seed=6)
    assert_matches_reference(policy, spec, X)


@pytest.mark.parametrize("sizes", [[4, 16, 3], [12, 70, 3], [3, 1024, 3], [1000, 9, 2]])   # axpy and dot ReLU layers
def test_nan_in_one_feature_gives_minus_one(make_spec, sizes):
    for dtype in DTYPES:
        spec = make_spec(sizes, dtype=dtype, weight_scale=1.0, seed=21)
        # all-positive weights: a NaN cannot be hidden by ReLU
        from control_node.kernels import ModelSpec
        spec = ModelSpec(layers=[(np.abs(W), np.abs(b)) for W, b in spec.layers], mean=spec.mean,
                         scale=spec.scale, classes=spec.classes, feature_names=spec.feature_names, dtype=dtype)
        policy = Policy(spec)
        X = random_inputs(spec, 20, seed=7)
        want = policy.predict_batch(X)
        for j in range(sizes[0]):
            x = X[0].copy()
            x[j] = np.nan
            assert policy.predict(x) == -1
            assert policy.predict(np.ascontiguousarray(X[1])) == want[1]


def _loop_predict(policy, x, n):
    predict = policy.predict
    for _ in itertools.repeat(None, n):    # repeat() itself allocates nothing per step
        predict(x)


def _loop_bound(policy, x, n):
    predict_bound = policy.predict_bound
    for _ in itertools.repeat(None, n):
        predict_bound()


def _loop_logits(policy, x, n):
    logits = policy.logits
    for _ in itertools.repeat(None, n):
        logits(x)


def _allocations(loop, policy, x, n):
    """(blocks still allocated, bytes still traced, peak traced bytes) over ``loop(policy, x, n)``."""
    loop(policy, x, 1000)   # warm up
    gc.collect()
    gc.disable()
    try:
        blocks = sys.getallocatedblocks()
        loop(policy, x, n)
        blocks = sys.getallocatedblocks() - blocks
        tracemalloc.start()
        try:
            loop(policy, x, 10)
            tracemalloc.reset_peak()
            current0 = tracemalloc.get_traced_memory()[0]
            loop(policy, x, n)
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        gc.enable()
    return blocks, current - current0, peak - current0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loop", [_loop_predict, _loop_bound], ids=["predict", "predict_bound"])
def test_calls_allocate_nothing(iris_spec, dtype, loop):
    """100k calls leave nothing behind and allocate nothing even transiently (peak as for 0 calls)."""
    from control_node.kernels import ModelSpec
    spec = ModelSpec(layers=iris_spec.layers, mean=iris_spec.mean, scale=iris_spec.scale,
                     classes=iris_spec.classes, feature_names=iris_spec.feature_names, dtype=dtype)
    policy = Policy(spec)
    x = np.ascontiguousarray(iris_spec.check_X[0])
    policy.bind_input(x.copy())
    n = 100_000
    baseline = min(_allocations(loop, policy, x, 0) for _ in range(3))
    measured = min(_allocations(loop, policy, x, n) for _ in range(3))
    # sys.getallocatedblocks counts the whole process: under pytest -n the worker's I/O thread can hold a block
    # or two while the loop runs (a fresh-clone run saw 2 against 1). Any allocation kept per call would leave
    # thousands; the peak below catches transient ones.
    assert measured[0] <= baseline[0] + 2, f"{measured[0]} blocks still allocated after {n} calls"
    assert measured[1] <= baseline[1], f"{measured[1]} bytes still traced after {n} calls"
    assert measured[2] <= baseline[2], f"peak {measured[2]} bytes over {n} calls vs {baseline[2]} for none"


def test_allocation_probe_detects_allocations(iris_spec):
    """The probe above is sensitive: logits() returns a new array per call and must show up."""
    policy = Policy(iris_spec)
    x = np.ascontiguousarray(iris_spec.check_X[0])
    baseline = _allocations(_loop_logits, policy, x, 0)
    measured = _allocations(_loop_logits, policy, x, 1000)
    assert measured[2] > baseline[2]


def test_consistency_error_on_mismatched_spec(make_spec):
    spec = make_spec([4, 13, 3], seed=1)
    other = make_spec([4, 13, 3], seed=2)
    policy = Policy(spec)
    check_consistency(policy, spec)
    with pytest.raises(ConsistencyError, match="differ"):
        check_consistency(policy, other)


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_shape_kernels_cover_their_range_and_match_reference(dtype):
    """One hidden layer, <= 8 inputs, <= 32 hidden units, classes in 64 bytes run the compile-time-
    shaped kernels (head groups of 32 bytes: one or two); the shapes just outside run the generic ones.
    Every input count 1-8 (one compile-time kernel each)."""
    max_out = 64 // np.dtype(dtype).itemsize
    seen = set()
    for n_in in range(1, 10):
        for hidden in (1, 5, 8, 9, 16, 17, 32, 33):
            for n_out in (1, 2, 3, 4, 5, 8, 9, 16, 17):
                spec = random_spec([n_in, hidden, n_out], dtype=dtype, seed=n_in * 1000 + hidden * 20 + n_out)
                policy = Policy(spec)
                small = n_in <= 8 and hidden <= 32 and n_out <= max_out
                assert policy.kernel == ("specialised" if small else "generic"), (n_in, hidden, n_out)
                assert_matches_reference(policy, spec, random_inputs(spec, 40, seed=n_out))
                seen.add(policy.kernel)
    assert seen == {"specialised", "generic"}


def test_baseline_sse2_copy_matches_reference():
    """The SSE2 copy (old CPUs), selected with Policy(spec, isa="sse2") in-process, checked like the AVX2 one:
    the small compile-time-shaped kernels and the generic ones, both dtypes."""
    from conftest import random_spec
    seen = set()
    for sizes in ([4, 16, 3], [4, 13, 3], [1, 8, 2], [2, 24, 3], [5, 16, 7], [6, 20, 4], [7, 32, 5], [8, 9, 8], [3, 70, 9], [12, 200, 3], [4, 16, 16, 3]):
        for dtype in ("float64", "float32"):
            spec = random_spec(sizes, dtype=dtype, seed=len(sizes))
            p = Policy(spec, isa="sse2")
            assert p.isa == "sse2", p.isa
            check_consistency(p, spec, n_random=500)
            seen.add(p.kernel)
    assert seen == {"specialised", "generic"}     # both kinds of kernel were exercised




def test_act_of_a_specialised_argmax_policy_agrees_with_predict():
    """act() (the node's act_ptr) of a policy a small compile-time-shaped kernel computes runs that kernel: the
    generic act read the small layout as panels and answered another class far from the mean (found measuring
    iris weights at the proof's edge samples)."""
    from control_node.kernels.importers.proof import edge_samples
    from control_node.train.iris import train_iris
    spec = train_iris()
    X = np.concatenate([random_inputs(spec, 500, seed=1), edge_samples(spec)[0]])
    for isa in ("sse2", "avx2", None):
        p = Policy(spec, isa=isa)
        assert p.kernel == "specialised"
        want = p.predict_batch(X)
        got = np.array([p.act(np.ascontiguousarray(x))[0] for x in X])
        assert np.array_equal(got, want), np.flatnonzero(got != want)[:5]
