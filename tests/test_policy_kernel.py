"""The compiled kernel on the policies robots run: every activation and head, both dtypes, tail widths,
1-4 hidden layers, against the numpy reference (kernels/reference.py) and against onnxruntime running the
same network as an ONNX graph; saturating and non-finite inputs; no allocation per call."""
from __future__ import annotations

import re

import numpy as np
import pytest

from control_node.kernels import ACTIVATIONS, ModelSpec, Policy, check_consistency, reference_act, reference_logits
from control_node.kernels.reference import RTOL

from support.alloc import bytes_left_by_calls

ACTS = sorted(ACTIVATIONS)
ORT_OPS = {"relu": "Relu", "elu": "Elu", "selu": "Selu", "leaky_relu": "LeakyRelu", "celu": "Celu",
           "tanh": "Tanh", "sigmoid": "Sigmoid", "softplus": "Softplus"}


def continuous_spec(sizes, act, dtype, seed=0, squash=True, pre=True, weight_scale=1.0):
    rng = np.random.default_rng(seed)
    layers = [(rng.normal(0, weight_scale / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b))
              for a, b in zip(sizes[:-1], sizes[1:])]
    n, m = sizes[0], sizes[-1]
    extra = dict(obs_scale=rng.uniform(0.5, 2, n), obs_clip_low=-6.0, obs_clip_high=6.0,
                 norm_clip_low=-10.0, norm_clip_high=10.0) if pre else {}
    # float32-representable: an ONNX attribute is a float32, so an exported alpha is one
    alpha = {"elu": 0.7, "leaky_relu": 0.05, "celu": 1.3}.get(act)
    alpha = None if alpha is None else float(np.float32(alpha))
    acts = [act] * (len(layers) - 1) + ["identity"]
    return ModelSpec(layers=layers, mean=rng.normal(size=n), scale=rng.uniform(0.5, 2, n), classes=[],
                     feature_names=[f"x{i}" for i in range(n)], dtype=dtype, activations=acts,
                     alphas=[alpha if (a == act and alpha is not None) else ACTIVATIONS[a][1] for a in acts],
                     head="continuous", squash=squash, action_low=-0.9, action_high=0.8,
                     action_offset=rng.normal(size=m), action_scale=rng.uniform(0.1, 0.5, m),
                     action_names=[f"joint{j}" for j in range(m)], **extra)


SHAPES = [[3, 64, 64, 1], [5, 13, 7], [17, 33, 29], [48, 96, 64, 40, 12], [9, 31, 17, 23, 11, 5], [2, 1]]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("act", ACTS)
def test_every_activation_matches_the_reference(act, dtype):
    for k, sizes in enumerate(SHAPES):
        spec = continuous_spec(sizes, act, dtype, seed=k)
        p = Policy(spec)
        res = check_consistency(p, spec, n_random=400, seed=k)
        assert res["checked"] == 400
        X = np.random.default_rng(k).normal(0, 3, (50, sizes[0]))
        got = p.act_batch(X)
        assert got.shape == (50, sizes[-1])
        tol = RTOL[dtype] * np.maximum(1, np.abs(reference_logits(spec, X)).max(axis=1, keepdims=True))
        assert np.all(np.abs(got - reference_act(spec, X)) <= tol * spec.action_scale + 1e-15)


def _onnx_graph(spec):
    """The spec as an ONNX graph a runtime can run on the pre-processed input (Gemm + activation)."""
    from onnx import TensorProto, helper, numpy_helper
    dt = TensorProto.FLOAT if spec.dtype == "float32" else TensorProto.DOUBLE
    nodes, inits, cur = [], [], "z"
    for i, ((W, b), act, alpha) in enumerate(zip(spec.layers, spec.activations, spec.alphas)):
        inits += [numpy_helper.from_array(W, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"b{i}"], [f"g{i}"]))
        cur = f"g{i}"
        if act == "identity":
            continue
        out = f"a{i}"
        if act == "silu":
            nodes += [helper.make_node("Sigmoid", [cur], [f"s{i}"]), helper.make_node("Mul", [cur, f"s{i}"], [out])]
        else:
            kw = {"alpha": alpha} if act in ("elu", "leaky_relu", "celu") else {}
            nodes.append(helper.make_node(ORT_OPS[act], [cur], [out], **kw))
        cur = out
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    n, m = spec.layer_sizes[0], spec.layer_sizes[-1]
    g = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("z", dt, [None, n])],
                          [helper.make_tensor_value_info("y", dt, [None, m])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("act", ACTS)
def test_every_activation_matches_onnxruntime(act, dtype):
    ort = pytest.importorskip("onnxruntime")
    from control_node.kernels.reference import preprocess
    for k, sizes in enumerate([[48, 512, 256, 128, 12], [3, 64, 64, 1], [7, 19, 5], [11, 40, 33, 9, 3]]):
        spec = continuous_spec(sizes, act, dtype, seed=10 + k, squash=False, pre=True)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        try:
            sess = ort.InferenceSession(_onnx_graph(spec).SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as e:        # onnxruntime lacks some float64 activation kernels
            if dtype == "float64" and ("NOT_IMPLEMENTED" in str(e) or "tensor(double)" in str(e)):
                pytest.skip(f"onnxruntime {ort.__version__} has no float64 kernel for {act} (float32 is checked; "
                            f"float64 is checked against the numpy reference)")
            raise
        X = np.random.default_rng(k).normal(0, 2, (300, sizes[0]))
        want = sess.run(None, {"z": preprocess(spec, X)})[0].astype(np.float64)
        p = Policy(spec)
        got = np.array([p.logits(np.ascontiguousarray(x)) for x in X], dtype=np.float64)
        tol = RTOL[dtype] * np.maximum(1, np.abs(want).max(axis=1, keepdims=True))
        worst = np.abs(got - want).max()
        assert np.all(np.abs(got - want) <= tol), (act, dtype, sizes, worst)
        # the head on top, as numpy computes it from onnxruntime's outputs
        u_want = spec.action_offset + spec.action_scale * np.clip(want, spec.action_low, spec.action_high)
        assert np.all(np.abs(p.act_batch(X) - u_want) <= tol * spec.action_scale + 1e-15)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_saturating_inputs_give_finite_actions(dtype):
    """Huge pre-activations saturate every activation without overflow or NaN (the clips are off)."""
    for act in ACTS:
        spec = continuous_spec([6, 40, 40, 3], act, dtype, seed=3, pre=False, weight_scale=1.0)
        p = Policy(spec)
        for mag in (1e3, 1e6, 1e12, 1e30 if dtype == "float64" else 1e15):
            X = np.random.default_rng(1).normal(0, 1, (20, 6)) * mag
            ref = reference_act(spec, X)
            got = p.act_batch(X)
            finite = np.isfinite(ref).all(axis=1)
            assert np.isfinite(got[finite]).all(), (act, mag)
            if act not in ("identity", "relu", "leaky_relu", "elu", "celu", "selu", "softplus", "silu"):
                # bounded activations: the outputs themselves stay comparable
                tol = RTOL[dtype] * np.maximum(1, np.abs(reference_logits(spec, X)).max(axis=1, keepdims=True))
                assert np.all(np.abs(got - ref)[finite] <= (tol * spec.action_scale + 1e-12)[finite]), (act, mag)


def test_non_finite_output_is_reported_never_an_action():
    spec = continuous_spec([4, 8, 2], "identity", "float32", pre=False, squash=False)
    W, b = spec.layers[0]
    big = ModelSpec(layers=[(W * 1e30, b), spec.layers[1]], mean=spec.mean, scale=spec.scale, classes=[],
                    feature_names=spec.feature_names, dtype="float32", activations=["identity", "identity"],
                    head="continuous", action_names=["a", "b"])
    p = Policy(big)
    out = np.zeros(2)
    assert p.act_into(np.full(4, 1e10), out) == -1          # float32 overflow -> inf -> refused
    assert np.isnan(out).all()
    assert p.act_into(np.zeros(4), out) == 0 and np.isfinite(out).all()
    nan_in = np.array([np.nan, 0, 0, 0])
    assert p.act_into(nan_in, out) == -1                     # NaN never looks valid


def test_tanh_squash_clip_and_affine_head():
    spec = continuous_spec([5, 16, 3], "tanh", "float64", squash=True, pre=False)
    p = Policy(spec)
    X = np.random.default_rng(4).normal(0, 30, (200, 5))
    u = p.act_batch(X)
    lo = spec.action_offset + spec.action_scale * -0.9
    hi = spec.action_offset + spec.action_scale * 0.8
    assert np.all(u >= lo - 1e-12) and np.all(u <= hi + 1e-12)
    assert np.isclose(u, lo).any() and np.isclose(u, hi).any()      # both clips were reached


def test_api_shapes_names_and_argmax_guards(iris_model_path):
    spec = continuous_spec([6, 12, 4], "elu", "float32")
    p = Policy(spec)
    assert p.continuous and p.n_actions == 4 and p.action_names == ["joint0", "joint1", "joint2", "joint3"]
    assert p.head == "continuous"
    x = np.zeros(6)
    with pytest.raises(TypeError, match="continuous"):
        p.predict(x)
    with pytest.raises(TypeError, match="shape \\(4,\\)"):
        p.act_into(x, np.zeros(3))
    iris = Policy.load(iris_model_path)
    assert not iris.continuous and iris.n_actions == 1 and iris.action_names == ["class"]
    xi = np.ascontiguousarray(iris.mean)
    assert iris.act(xi)[0] == iris.predict(xi)
    assert iris.kernel == "specialised"          # the small-shape iris kernel still runs


def test_act_into_allocates_nothing():
    """20,000 calls each (was 100,000: 19 s of a loaded run for the same proof): a block kept per call would
    count 20,000, and test_the_allocation_count_sees_calls_that_keep_memory shows the count sees such blocks."""
    spec = continuous_spec([48, 512, 256, 128, 12], "elu", "float32")
    p = Policy(spec)
    x, out = np.random.default_rng(0).normal(size=48), np.zeros(12)
    p.bind_input(x)
    assert bytes_left_by_calls(p.act_into, x, out, n=20_000) == (0, 0)
    assert bytes_left_by_calls(p.act_bound, out, n=20_000) == (0, 0)


def test_the_allocation_count_sees_calls_that_keep_memory():
    """bytes_left_by_calls, which the zero-allocation checks use, sees what a C call keeps (list.append
    growing a list) and what Python code run by the call keeps (one list per call), so their zeros are a
    measurement, not a filter that matches nothing."""
    kept = []
    size, blocks = bytes_left_by_calls(kept.append, 1.5, n=10_000)
    assert size >= 8 * 10_000 and blocks >= 1
    size, blocks = bytes_left_by_calls(lambda: kept.append([0.0]), n=1000, warm=0)
    assert blocks >= 1000 and size >= 1000 * 56


def test_model_file_round_trip_keeps_the_policy(tmp_path):
    from control_node.kernels import load_model, save_model
    spec = continuous_spec([10, 20, 6], "silu", "float32")
    save_model(spec, tmp_path / "p.npz")
    back = load_model(tmp_path / "p.npz")
    assert back.sha256 == spec.sha256 and back.activations == spec.activations and back.squash
    X = np.random.default_rng(2).normal(size=(30, 10))
    assert np.array_equal(Policy(back).act_batch(X), Policy(spec).act_batch(X))
    p = Policy.load(tmp_path / "p.npz")           # verified at load
    assert p.n_actions == 6


@pytest.mark.parametrize("isa", ["sse2", "avx2", "avx512"])
def test_selected_copies_match(isa, tmp_path):
    """Policy.load(path, isa=...) selects the SSE2, AVX2 or AVX-512 copy in-process (no environment variable,
    no subprocess): each matches the reference on its own (verified at load, and here on more rows)."""
    from control_node.kernels import isa_missing, save_model
    if isa_missing(isa):
        pytest.skip(f"this CPU cannot run the {isa} copy: it lacks {isa_missing(isa)}")
    spec = continuous_spec([33, 70, 45, 7], "selu", "float32")
    save_model(spec, tmp_path / "p.npz")
    p = Policy.load(tmp_path / "p.npz", isa=isa)
    assert p.isa == {"sse2": "sse2", "avx2": "avx2+fma", "avx512": "avx512"}[isa]
    check_consistency(p, spec, n_random=300)
    assert Policy(spec).isa == Policy(spec, isa=None).isa       # None: the widest this CPU runs


def test_avx512_copy_is_chosen_where_the_cpu_has_it():
    with open("/proc/cpuinfo") as f:
        flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    p = Policy(continuous_spec([48, 512, 12], "elu", "float32"))
    if not {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= set(flags):
        assert p.isa == "avx2+fma"
        pytest.skip("this CPU has no AVX-512 (F/DQ/BW/VL): the avx512 copy is compiled but cannot run here")
    assert p.isa == "avx512"


@pytest.mark.parametrize("isa", [None, "sse2", "avx2", "avx512"])
def test_stream_read_probe_reads_every_value(isa):
    """bench's measured memory floor reads each value once: its sum is the array's, with each copy's vectors
    (selected by name, in this process, as ``Policy(spec, isa=...)`` selects a kernel copy)."""
    from control_node.bench.common import weights_read_row
    from control_node.kernels._policy import isa_missing
    missing = isa_missing(isa)
    if missing:
        with pytest.raises(ValueError, match=re.escape(f"lacks {missing}")):
            weights_read_row(100_000, isa)
        pytest.skip(f"this CPU cannot run the {isa} copy (it lacks {missing}); refused by name, as checked")
    name, fn, buf = weights_read_row(100_000, isa)
    assert buf.size % 128 == 0 and buf.size * 4 >= 100_000
    buf[:] = np.arange(buf.size, dtype=np.float32) % 7
    assert float(fn(buf)) == pytest.approx(float(buf.astype(np.float64).sum()), rel=1e-5)
    for bad in (buf[:100], buf[1:129], buf.astype(np.float64)):
        with pytest.raises(ValueError, match="multiple of 128 values"):
            fn(bad)
    with pytest.raises(ValueError, match="isa: 'neon' is not a kernel copy"):
        weights_read_row(100_000, "neon")
