"""Recurrent policies (one LSTM / GRU layer before the MLP) end to end: the model file (v3), the kernel's step
against onnxruntime and torch over sequences with the state carried (both dtypes, H 32..512, tail widths, the
Unitree G1 shape 47 -> LSTM(64) -> 32 ELU -> 12), reset and non-finite-state semantics, no allocation per step,
the importers on real exporter outputs (tests/data/recurrent/, made by make_recurrent_exports.py) and on
onnx.helper-made graphs, and the refusals.

onnxruntime 1.32 has no float64 LSTM / GRU kernel: float64 policies are compared with torch in float64 (rtol
1e-9) and with onnxruntime running the float32 graph (at the float32 tolerance)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from control_node.kernels import ModelFileError, ModelSpec, Policy, check_consistency, load_model, save_model
from control_node.kernels.model_file import content_hash
from control_node.kernels.reference import RTOL, reference_sequence, run_sequence

from support.alloc import bytes_left_by_calls

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "recurrent")
GATES = {"lstm": 4, "gru": 3}
ONNX_PERM = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2)}   # ONNX block k is torch block PERM[k] (i,o,f,c / z,r,h)


def rnn_spec(kind, n, H, dense, dtype="float32", seed=0, act="elu", head=False, pre=False, w_scale=1.0):
    """A recurrent ModelSpec with torch-like random weights (uniform +-w_scale/sqrt(H)); ``head``: squash,
    clip and a per-action affine; ``pre``: obs_scale and clips."""
    rng = np.random.default_rng(seed)
    G, k = GATES[kind], w_scale / np.sqrt(H)
    sizes = [H] + list(dense)
    layers = [(rng.normal(0, 1 / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b)) for a, b in zip(sizes[:-1], sizes[1:])]
    m = sizes[-1]
    extra = {}
    if head:
        extra = dict(squash=True, action_low=-0.9, action_high=0.8, action_offset=rng.normal(size=m),
                     action_scale=rng.uniform(0.1, 0.5, m))
    if pre:
        extra.update(obs_scale=rng.uniform(0.5, 2, n), obs_clip_low=-6.0, obs_clip_high=6.0, norm_clip_low=-5.0,
                     norm_clip_high=5.0)
    return ModelSpec(layers=layers, mean=rng.normal(size=n), scale=rng.uniform(0.5, 2, n), classes=[],
                     feature_names=[f"x{i}" for i in range(n)], dtype=dtype,
                     activations=[act] * (len(layers) - 1) + ["identity"], head="continuous",
                     action_names=[f"j{i}" for i in range(m)], recurrent=kind,
                     rnn_W_ih=rng.uniform(-k, k, (G * H, n)), rnn_W_hh=rng.uniform(-k, k, (G * H, H)),
                     rnn_b_ih=rng.uniform(-k, k, G * H), rnn_b_hh=rng.uniform(-k, k, G * H), **extra)


def sequence(spec, T, seed=1, sigma=1.5):
    rng = np.random.default_rng(seed)
    return spec.mean + spec.scale * rng.normal(0, sigma, (T, spec.n_features))


def kernel_run(policy, X):
    """Actions (T, n_actions) and h (T, H) of ``policy`` over the rows of X, state carried."""
    out = np.zeros(policy.n_actions)
    acts, hs = [], []
    for x in X:
        policy.act_into(np.ascontiguousarray(x), out)
        acts.append(out.copy())
        hs.append(policy.state()[0].astype(np.float64))
    return np.array(acts), np.array(hs)


def onnx_torch_order(M, kind, H):
    """torch gate blocks -> ONNX blocks along axis 0."""
    return np.concatenate([M[p * H:(p + 1) * H] for p in ONNX_PERM[kind]], axis=0)


# ---- the peers: onnxruntime and torch running the same network ---------------------------------------------
def onnx_graph(spec, opset=17, dtype=np.float32, normaliser=False, form="legacy", names=("obs", "h_in", "c_in"),
               out_names=("actions", "h_out", "c_out"), rnn_attrs=None, extra_inputs=()):
    """The spec as an rsl_rl / IsaacLab-style ONNX graph (ELU / Tanh / identity dense layers, identity head).

    ``normaliser``: Sub / Div on the raw observation in the graph (else the input is the pre-processed one);
    ``form="dynamo"``: torch-order initializers reordered by Slice / Concat, the state sliced, Transpose +
    Reshape + Squeeze on Y (what torch's dynamo exporter writes unoptimised); ``rnn_attrs`` override the
    recurrent node's attributes."""
    from onnx import TensorProto, helper, numpy_helper
    tp = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    kind, H, n = spec.recurrent, spec.hidden_size, spec.n_features
    op = kind.upper()
    inits, nodes = [], []

    def init(a, name, dt=dtype):
        inits.append(numpy_helper.from_array(np.asarray(a, dtype=dt), name))
        return name

    def const_ints(v, name):
        return init(np.asarray(v, dtype=np.int64), name, np.int64)
    x = names[0]
    if normaliser:
        nodes += [helper.make_node("Sub", [x, init(spec.mean.reshape(1, -1), "mean")], ["centred"]),
                  helper.make_node("Div", ["centred", init(spec.scale.reshape(1, -1), "std")], ["z"])]
        x = "z"
    if opset >= 13:
        nodes.append(helper.make_node("Unsqueeze", [x, const_ints([0], "ax0")], ["xs"]))
    else:
        nodes.append(helper.make_node("Unsqueeze", [x], ["xs"], axes=[0]))
    if form == "dynamo":        # torch-order weights, reordered at run time by Slice / Concat
        wi, wh = init(spec.rnn_W_ih, "rnn.weight_ih_l0"), init(spec.rnn_W_hh, "rnn.weight_hh_l0")
        bi, bh = init(spec.rnn_b_ih, "rnn.bias_ih_l0"), init(spec.rnn_b_hh, "rnn.bias_hh_l0")
        const_ints([0], "zero")
        const_ints([1], "one")

        def reorder(src, out):
            parts = []
            for k, p in enumerate(ONNX_PERM[kind]):
                s, e = const_ints([p * H], f"{out}_s{k}"), const_ints([(p + 1) * H], f"{out}_e{k}")
                nodes.append(helper.make_node("Slice", [src, s, e, "zero"], [f"{out}_p{k}"]))
                parts.append(f"{out}_p{k}")
            nodes.append(helper.make_node("Concat", parts, [out], axis=0))
        reorder(wi, "Wc")
        reorder(wh, "Rc")
        reorder(bi, "bic")
        reorder(bh, "bhc")
        nodes += [helper.make_node("Unsqueeze", ["Wc", "zero"], ["W"]), helper.make_node("Unsqueeze", ["Rc", "zero"], ["R"]),
                  helper.make_node("Concat", ["bic", "bhc"], ["bc"], axis=0),
                  helper.make_node("Unsqueeze", ["bc", "zero"], ["B"])]
        state = []
        for nm in names[1:1 + (2 if kind == "lstm" else 1)]:
            nodes.append(helper.make_node("Slice", [nm, "zero", "one", "zero"], [f"{nm}_l0"]))
            state.append(f"{nm}_l0")
    else:
        init(onnx_torch_order(spec.rnn_W_ih, kind, H)[None], "W")
        init(onnx_torch_order(spec.rnn_W_hh, kind, H)[None], "R")
        init(np.concatenate([onnx_torch_order(spec.rnn_b_ih, kind, H),
                             onnx_torch_order(spec.rnn_b_hh, kind, H)])[None], "B")
        state = list(names[1:1 + (2 if kind == "lstm" else 1)])
    attrs = {"hidden_size": H}
    if kind == "gru":
        attrs["linear_before_reset"] = 1
    attrs.update(rnn_attrs or {})
    rnn_outs = ["Y", out_names[1]] + ([out_names[2]] if kind == "lstm" else [])
    nodes.append(helper.make_node(op, ["xs", "W", "R", "B", ""] + state, rnn_outs, name="rnn", **attrs))
    if form == "dynamo":
        nodes += [helper.make_node("Transpose", ["Y"], ["Yt"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["Yt", const_ints([1, 1, H], "shape3")], ["Yr"]),
                  helper.make_node("Squeeze", ["Yr", "zero"], ["feat"])]
    elif opset >= 13:
        nodes += [helper.make_node("Squeeze", ["Y", const_ints([1], "ax1")], ["Y1"]),
                  helper.make_node("Squeeze", ["Y1", "ax0"], ["feat"])]
    else:
        nodes += [helper.make_node("Squeeze", ["Y"], ["Y1"], axes=[1]), helper.make_node("Squeeze", ["Y1"], ["feat"], axes=[0])]
    cur = "feat"
    for i, ((W, b), act) in enumerate(zip(spec.layers, spec.activations)):
        last = i == len(spec.layers) - 1
        out = out_names[0] if last and act == "identity" else f"g{i}"
        nodes.append(helper.make_node("Gemm", [cur, init(W.T, f"W{i}"), init(b, f"b{i}")], [out], transB=1))
        cur = out
        if act != "identity":
            nodes.append(helper.make_node({"elu": "Elu", "tanh": "Tanh"}[act], [cur], [f"a{i}"]))
            cur = f"a{i}"
    st = [helper.make_tensor_value_info(nm, tp, [1, 1, H]) for nm in names[1:1 + (2 if kind == "lstm" else 1)]]
    g = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info(names[0], tp, [1, n])] + st + list(extra_inputs),
                          [helper.make_tensor_value_info(out_names[0], tp, [1, spec.layer_sizes[-1]])] +
                          [helper.make_tensor_value_info(o, tp, [1, 1, H]) for o in rnn_outs[1:]], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def ort_run(model, spec, X, dtype=np.float32, raw=False):
    """onnxruntime over the rows of X, h_out / c_out fed back as h_in / c_in (the caller's job)."""
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    H = spec.hidden_size
    state = {nm: np.zeros((1, 1, H), dtype=dtype) for nm in names[1:]}
    outs = [o.name for o in sess.get_outputs()]
    Z = X if raw else (X - spec.mean) / spec.scale
    acts, hs = [], []
    for z in Z:
        res = sess.run(outs, {names[0]: z.astype(dtype).reshape(1, -1), **state})
        for nm, v in zip(names[1:], res[1:]):
            state[nm] = v
        acts.append(res[0].reshape(-1).astype(np.float64))
        hs.append(res[1].reshape(-1).astype(np.float64))
    return np.array(acts), np.array(hs)


def torch_modules(spec, dtype="float64"):
    import torch
    tdt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    rnn = (torch.nn.LSTM if spec.recurrent == "lstm" else torch.nn.GRU)(spec.n_features, spec.hidden_size).to(tdt)
    mods = []
    for (W, b), act in zip(spec.layers, spec.activations):
        lin = torch.nn.Linear(*W.shape).to(tdt)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(W.T)))
            lin.bias.copy_(torch.from_numpy(b))
        mods.append(lin)
        if act != "identity":
            mods.append({"elu": torch.nn.ELU, "tanh": torch.nn.Tanh}[act]())
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(rnn, name).copy_(torch.from_numpy(getattr(spec, "rnn_" + name.replace("weight", "W").replace(
                "bias", "b").replace("_l0", ""))))
    return rnn, torch.nn.Sequential(*mods)


def torch_run(spec, X, dtype="float64"):
    import torch
    rnn, mlp = torch_modules(spec, dtype)
    tdt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    Z = torch.from_numpy(((X - spec.mean) / spec.scale).astype(dtype))
    H = spec.hidden_size
    state = (torch.zeros(1, 1, H, dtype=tdt), torch.zeros(1, 1, H, dtype=tdt)) if spec.recurrent == "lstm" else \
        torch.zeros(1, 1, H, dtype=tdt)
    acts, hs = [], []
    with torch.inference_mode():
        for z in Z:
            y, state = rnn(z.reshape(1, 1, -1), state)
            acts.append(mlp(y[0]).double().numpy().reshape(-1))
            hs.append(y.double().numpy().reshape(-1))
    return np.array(acts), np.array(hs)


def assert_close(got, want, rtol, what):
    tol = rtol * np.maximum(1.0, np.abs(want).max(axis=1, keepdims=True))
    bad = np.argwhere(~(np.abs(got - want) <= tol))
    assert not bad.size, (f"{what}: first difference at step {bad[0][0]}, value {bad[0][1]}: {got[tuple(bad[0])]!r} vs "
                          f"{want[tuple(bad[0])]!r} (max |diff| {np.abs(got - want).max():.3g})")


# ---- the kernel against onnxruntime and torch -------------------------------------------------------------
@pytest.mark.parametrize("H", [32, 64, 256, 512])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_steps_match_onnxruntime_and_torch_over_500_steps(kind, dtype, H):
    spec = rnn_spec(kind, 47, H, [128, 12] if H >= 256 else [32, 12], dtype=dtype, seed=H)
    p = Policy(spec)
    assert p.recurrent == kind and p.hidden_size == H and p.n_features == 47 and p.n_actions == 12
    X = sequence(spec, 500, seed=H + 1)
    acts, hs = kernel_run(p, X)
    t_acts, t_hs = torch_run(spec, X, dtype)
    assert_close(hs, t_hs, RTOL[dtype], f"h vs torch {dtype}")
    assert_close(acts, t_acts, RTOL[dtype], f"actions vs torch {dtype}")
    o_acts, o_hs = ort_run(onnx_graph(spec), spec, X)      # float32 graph (no float64 LSTM / GRU in onnxruntime)
    assert_close(hs, o_hs, RTOL["float32"], "h vs onnxruntime")
    assert_close(acts, o_acts, RTOL["float32"], "actions vs onnxruntime")
    ref = run_sequence(spec, X)
    assert_close(acts, ref["actions"], RTOL[dtype], "actions vs the numpy reference")
    assert (ref["status"] == 0).all() and p.state_resets_nonfinite == 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("n,H,dense", [(47, 64, [32, 12]), (1, 1, [1]), (5, 7, [3]), (13, 33, [17, 5]),
                                       (100, 9, [40, 20, 2]), (3, 129, [7])])
def test_tail_widths_match_the_reference_and_torch(kind, dtype, n, H, dense):
    """Padding: n, H and the dense widths not multiples of any vector width (the G1 shape first)."""
    spec = rnn_spec(kind, n, H, dense, dtype=dtype, seed=n * 7 + H, head=True, pre=True)
    p = Policy(spec)
    res = check_consistency(p, spec)
    assert res["checked"] == 600 and res["sequences"] == 3
    assert np.all(p.state()[0] == 0), "check_consistency leaves the policy reset"
    X = sequence(spec, 200, seed=n)
    spec_plain = rnn_spec(kind, n, H, dense, dtype=dtype, seed=n * 7 + H)     # identity head for torch
    acts, hs = kernel_run(Policy(spec_plain), X)
    t_acts, t_hs = torch_run(spec_plain, X, dtype)
    assert_close(hs, t_hs, RTOL[dtype], "h vs torch")
    assert_close(acts, t_acts, RTOL[dtype], "actions vs torch")


def test_unitree_g1_shape_against_the_eager_exporter_module():
    """legged_gym_g1_lstm.pt: PolicyExporterLSTM with the G1 motion.pt shape, imported and run by the kernel
    against what its eager module answered in the exporter's venv (outputs.npz)."""
    from control_node.kernels.importers import import_policy
    spec, proof = import_policy(os.path.join(DATA, "legged_gym_g1_lstm.pt"), kernel=Policy, n_random=300)
    assert spec.layer_sizes == [47, 64, 32, 12] and spec.recurrent == "lstm" and spec.activations == ["elu", "identity"]
    d = np.load(os.path.join(DATA, "outputs.npz"))
    acts, _ = kernel_run(Policy(spec), d["X_g1"].astype(np.float64))
    assert_close(acts, d["y_g1"].astype(np.float64), RTOL["float32"], "G1 actions vs the eager module")


# ---- state ownership, reset, non-finite state ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_reset_replays_the_same_actions_and_state_is_owned(kind):
    spec = rnn_spec(kind, 12, 24, [16, 4], seed=3)
    p = Policy(spec)
    assert p.state_resets_nonfinite == 0
    h, c = p.state()
    assert h.shape == (24,) and h.dtype == np.float32 and not h.any()
    assert (c is None) == (kind == "gru")
    X = sequence(spec, 150)
    a1, _ = kernel_run(p, X)
    assert p.state()[0].any()
    p.reset()
    assert not p.state()[0].any() and (kind == "gru" or not p.state()[1].any())
    a2, _ = kernel_run(p, X)
    assert np.array_equal(a1, a2), "reset() then the same sequence gives the same actions"
    fresh, _ = kernel_run(Policy(spec), X)
    assert np.array_equal(a1, fresh), "a new Policy starts from the zero state"
    # the state matters: without a reset the same sequence answers differently
    a3, _ = kernel_run(p, X)
    assert not np.allclose(a3[:5], a1[:5])
    # a reset in the middle matches the reference's reset at that step
    p.reset()
    out = np.zeros(4)
    got = []
    for t, x in enumerate(X):
        if t == 70:
            p.reset()
        p.act_into(np.ascontiguousarray(x), out)
        got.append(out.copy())
    ref = run_sequence(spec, X, resets=(70,))
    assert_close(np.array(got), ref["actions"], RTOL["float32"], "reset at step 70")
    # act_batch runs its rows as one sequence; set_state / h0
    p.reset()
    assert np.array_equal(p.act_batch(X), a1)
    h0 = np.linspace(-0.5, 0.5, 24)
    c0 = np.linspace(0.3, -0.2, 24) if kind == "lstm" else None
    p.set_state(h0, c0)
    want, (hT, cT) = reference_sequence(spec, X[:50], h0=(h0, c0))
    assert_close(p.act_batch(X[:50]), want, RTOL["float32"], "from a given state")
    assert np.allclose(p.state()[0], hT, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_non_finite_state_resets_counts_and_returns_minus_one(kind, dtype):
    spec = rnn_spec(kind, 10, 20, [8, 3], dtype=dtype, seed=4, head=True)
    p = Policy(spec)
    X = sequence(spec, 40)
    out = np.zeros(3)
    for x in X[:20]:
        assert p.act_into(np.ascontiguousarray(x), out) == 0
    bad = X[20].copy()
    bad[3] = np.nan
    assert p.act_into(bad, out) == -1
    assert np.isnan(out).all(), "a step without an action gives NaN actions"
    assert p.state_resets_nonfinite == 1
    assert not p.state()[0].any() and (kind == "gru" or not p.state()[1].any()), "the state was reset to zero"
    assert np.isnan(p.last_outputs()).all()
    # the next step runs from the zero state: as a fresh policy's first step
    nxt = p.act(np.ascontiguousarray(X[21]))
    assert np.array_equal(nxt, Policy(spec).act(np.ascontiguousarray(X[21])))
    # the reference agrees step by step, counting the same reset
    Xb = X.copy()
    Xb[20] = bad
    ref = run_sequence(spec, Xb)
    assert ref["status"][20] == -1 and ref["state_resets"] == 1 and (np.delete(ref["status"], 20) == 0).all()
    p.reset()
    got = p.act_batch(Xb)
    assert np.isnan(got[20]).all() and p.state_resets_nonfinite == 2
    assert_close(np.delete(got, 20, axis=0), np.delete(ref["actions"], 20, axis=0), RTOL[dtype], "around the reset")


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_one_infinite_feature_saturates_the_gates_without_a_reset(kind):
    """x = +inf on one feature: every gate pre-activation is +-inf, the state stays finite (the kernel zeroes its
    pad lanes, where inf * 0 would be NaN) and agrees with the reference; inf on two features of opposite-sign
    weights makes NaN: reset, as in the reference."""
    spec = rnn_spec(kind, 6, 13, [5, 2], seed=5)
    X = sequence(spec, 30)
    X[10, 2] = np.inf
    X[20, [1, 4]] = [np.inf, -np.inf]
    ref = run_sequence(spec, X)
    p = Policy(spec)
    got = p.act_batch(X)
    st = np.where(np.isnan(got).any(axis=1), -1, 0)
    assert (st == ref["status"]).all(), (st, ref["status"])
    assert ref["status"][10] == 0 and p.state_resets_nonfinite == ref["state_resets"]
    ok = ref["status"] == 0
    assert_close(got[ok], ref["actions"][ok], RTOL["float32"], "inf inputs")


def test_non_finite_outputs_with_a_finite_state_keep_the_state():
    """Dense outputs overflow (1e200 * 1e200) while the state is finite: -1 and NaN actions, no state reset."""
    spec = rnn_spec("lstm", 4, 8, [4, 3], dtype="float64", seed=6)
    big = ModelSpec(**{**spec.__dict__, "layers": [(np.full((8, 4), 1e200), np.zeros(4)),
                                                   (np.full((4, 3), 1e200), np.zeros(3))],
                       "activations": ["identity", "identity"], "sha256": ""})
    p = Policy(big)
    X = sequence(big, 5)
    out = np.zeros(3)
    assert [p.act_into(np.ascontiguousarray(x), out) for x in X] == [-1] * 5 and np.isnan(out).all()
    assert p.state_resets_nonfinite == 0 and p.state()[0].any()
    ref = run_sequence(big, X)
    assert (ref["status"] == -1).all() and ref["state_resets"] == 0
    assert np.allclose(p.state()[0], ref["state"][0], rtol=1e-9, atol=1e-12)


def test_argmax_head_and_predict_batch_run_the_sequence():
    spec = rnn_spec("gru", 5, 16, [8, 3], seed=7)
    spec = ModelSpec(**{**spec.__dict__, "head": "argmax", "classes": ["a", "b", "c"], "action_names": None,
                        "sha256": ""})
    p = Policy(spec)
    X = sequence(spec, 100)
    k = p.predict_batch(X)
    p.reset()
    k2 = np.array([p.predict(np.ascontiguousarray(x)) for x in X])
    assert np.array_equal(k, k2)
    p.reset()
    assert np.array_equal(p.act_batch(X)[:, 0], k)
    check_consistency(p, spec)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_no_allocation_per_step(kind):
    spec = rnn_spec(kind, 47, 64, [32, 12], seed=8)
    p = Policy(spec)
    x, out = np.ascontiguousarray(sequence(spec, 1)[0]), np.zeros(12)
    assert bytes_left_by_calls(p.act_into, x, out, n=100_000) == (0, 0)
    assert bytes_left_by_calls(p.reset, n=1000) == (0, 0)


def test_forced_sse2_copy_runs_the_recurrent_kernel(tmp_path):
    """Policy.load(path, isa="sse2"): the portable copy runs the recurrent kernel (verified at load)."""
    spec = rnn_spec("lstm", 9, 21, [6], seed=9, head=True)
    save_model(spec, tmp_path / "r.npz")
    p = Policy.load(tmp_path / "r.npz", isa="sse2")
    assert [p.isa, p.recurrent, p.hidden_size] == ["sse2", "lstm", 21]


# ---- model file v3 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_model_file_v3_round_trip(kind, tmp_path):
    spec = rnn_spec(kind, 11, 19, [7, 3], dtype="float64", seed=10, head=True, pre=True)
    spec.check_X = sequence(spec, 50)
    sha = save_model(spec, tmp_path / "r.npz")
    with np.load(tmp_path / "r.npz") as z:
        assert int(z["format_version"]) == 3 and str(z["recurrent"]) == kind
        assert z["layer_sizes"].tolist() == [11, 19, 7, 3] and z["rnn_W_ih"].shape == (GATES[kind] * 19, 11)
    back = load_model(tmp_path / "r.npz")
    assert back.sha256 == sha == content_hash(back) and back.recurrent == kind and back.hidden_size == 19
    for key in ("rnn_W_ih", "rnn_W_hh", "rnn_b_ih", "rnn_b_hh"):
        assert np.array_equal(getattr(back, key), getattr(spec, key))
    p = Policy.load(tmp_path / "r.npz")             # verified: check_X as a sequence + 3 x 200 random steps
    assert not p.state()[0].any(), "Policy.load leaves the state reset"
    assert np.array_equal(p.act_batch(spec.check_X), Policy(spec).act_batch(spec.check_X))
    assert "lstm(19)" in repr(p) or "gru(19)" in repr(p)


def test_feed_forward_files_stay_version_2_with_their_hash(tmp_path):
    from conftest import continuous_spec
    spec = continuous_spec()
    sha = save_model(spec, tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as z:
        assert int(z["format_version"]) == 2 and "recurrent" not in z.files
    assert load_model(tmp_path / "m.npz").sha256 == sha


def _edit(path, out, **changes):
    with np.load(path) as z:
        a = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            a.pop(k)
        else:
            a[k] = v
    np.savez(out, **a)
    return out


def test_bad_v3_files_name_the_field(tmp_path):
    spec = rnn_spec("lstm", 6, 8, [4], seed=11)
    path = tmp_path / "r.npz"
    save_model(spec, path)
    cases = [({"recurrent": np.str_("rnn")}, "recurrent"), ({"recurrent": None}, "recurrent"),
             ({"rnn_W_hh": np.zeros((24, 8), np.float32)}, "rnn_W_hh"), ({"rnn_b_ih": None}, "rnn_b_ih"),
             ({"rnn_W_ih": np.zeros((32, 5), np.float32)}, "rnn_W_ih"),
             ({"layer_sizes": np.array([6, 4], np.int64)}, "layer_sizes"),
             ({"rnn_b_hh": np.full(32, 0.5, np.float32)}, "sha256")]
    for k, (change, field) in enumerate(cases):
        with pytest.raises(ModelFileError) as e:
            load_model(_edit(path, tmp_path / f"bad{k}.npz", **change))
        assert e.value.field == field, (change, str(e.value))
    W = spec.rnn_W_ih.copy()
    W[0, 0] = np.nan
    for bad, field in ((dict(rnn_W_ih=W), "rnn_W_ih"), (dict(layers=[(np.ones((9, 4)), np.zeros(4))]), "W0"),
                       (dict(recurrent="gru"), "rnn_W_hh"), (dict(recurrent="lstm", rnn_b_hh=None), "rnn_b_hh")):
        s = ModelSpec(**{**spec.__dict__, **bad, "sha256": ""})
        with pytest.raises(ModelFileError) as e:
            save_model(s, tmp_path / "x.npz")
        assert e.value.field == field, str(e.value)
    with pytest.raises(ModelFileError, match="recurrent"):
        save_model(ModelSpec(**{**spec.__dict__, "recurrent": None, "sha256": ""}), tmp_path / "y.npz")


# ---- importers: real exporter outputs -----------------------------------------------------------------------
REAL = ["rsl_rl_lstm_opset11.onnx", "rsl_rl_lstm_opset18.onnx", "rsl_rl_lstm_dynamo.onnx",
        "rsl_rl_lstm_dynamo_noopt.onnx", "rsl_rl_gru_opset11.onnx", "rsl_rl_gru_dynamo.onnx",
        "rsl_rl_lstm_policy.pt", "rsl_rl_gru_policy.pt", "isaaclab_lstm_policy.pt"]


@pytest.mark.parametrize("name", REAL)
def test_real_exports_import_and_match_the_exporters_modules(name):
    pytest.importorskip("onnxruntime" if name.endswith(".onnx") else "torch")
    from control_node.kernels.importers import describe, import_policy
    spec, proof = import_policy(os.path.join(DATA, name), kernel=Policy, n_random=600)
    kind = "gru" if "gru" in name else "lstm"
    assert spec.recurrent == kind and spec.layer_sizes == [10, 16, 16, 4] and spec.activations == ["elu", "identity"]
    assert proof["samples"] == 600 and len(proof["sequences"]) == 2 and isinstance(proof["kernel"], dict)
    assert ("onnxruntime" if name.endswith(".onnx") else "torch") in proof["reference"]
    assert "state carried" in describe(spec, proof) and proof["recognised"]["recurrent"]
    st = spec.source["state"]
    if name.endswith(".onnx"):
        assert st["inputs"] == ({"h": "h_in", "c": "c_in"} if kind == "lstm" else {"h": "h_in"})
        assert st["outputs"] == ({"h": "h_out", "c": "c_out"} if kind == "lstm" else {"h": "h_out"})
    else:
        assert st["buffers"]["h"] == "hidden_state"
    # the exporter's own eager module (run in its venv), state carried from zero: outputs.npz
    d = np.load(os.path.join(DATA, "outputs.npz"))
    acts, _ = kernel_run(Policy(spec), d["X_rsl"].astype(np.float64))
    assert_close(acts, d[f"y_{kind}"].astype(np.float64), RTOL["float32"], f"{name} vs the eager exporter module")


def test_policy_load_imports_a_recurrent_onnx_file_reset():
    pytest.importorskip("onnxruntime")
    p = Policy.load(os.path.join(DATA, "rsl_rl_lstm_opset11.onnx"))
    assert p.recurrent == "lstm" and p.hidden_size == 16 and p.state_resets_nonfinite == 0
    assert not p.state()[0].any() and not p.state()[1].any()


def test_cli_import_writes_a_v3_model_file(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from control_node.cli import main
    out = tmp_path / "g.npz"
    assert main(["import", os.path.join(DATA, "rsl_rl_gru_dynamo.onnx"), "--out", str(out), "--n-random", "300"]) == 0
    text = capsys.readouterr().out
    assert "recurrent" in text and "GRU" in text and "state carried" in text
    spec = load_model(out)
    assert spec.recurrent == "gru" and spec.check_X.shape == (256, 10)


# ---- importers: onnx.helper graphs --------------------------------------------------------------------------
def _save(model, path):
    import onnx
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize("form,opset", [("legacy", 11), ("legacy", 14), ("legacy", 18), ("dynamo", 18)])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_helper_graphs_import_with_gate_orders_converted(tmp_path, kind, form, opset):
    pytest.importorskip("onnxruntime")
    from control_node.kernels.importers import import_policy
    spec = rnn_spec(kind, 7, 12, [9, 3], seed=12, act="tanh")
    path = _save(onnx_graph(spec, opset=opset, normaliser=True, form=form), tmp_path / f"{kind}.onnx")
    got, proof = import_policy(path, kernel=Policy, n_random=300)
    assert got.recurrent == kind and got.layer_sizes == [7, 12, 9, 3] and got.activations == ["tanh", "identity"]
    for key in ("rnn_W_ih", "rnn_W_hh", "rnn_b_ih", "rnn_b_hh"):     # back in torch's gate order
        assert np.allclose(getattr(got, key), getattr(spec, key), atol=1e-7), key
    assert np.allclose(got.mean, spec.mean, atol=1e-6) and np.allclose(got.scale, spec.scale, rtol=1e-6)
    X = sequence(spec, 300)
    o_acts, _ = ort_run(onnx_graph(spec, opset=opset, normaliser=True, form=form), spec, X, raw=True)
    acts, _ = kernel_run(Policy(got), X)
    assert_close(acts, o_acts, RTOL["float32"], "kernel vs onnxruntime on the imported graph")


def test_state_names_come_from_the_data_flow_and_explicit_defaults_are_accepted(tmp_path):
    """Other names for the state inputs / outputs map by where they flow (and their [1, 1, H] shape); an explicit
    activations attribute equal to the defaults is accepted."""
    pytest.importorskip("onnxruntime")
    from control_node.kernels.importers import describe, import_policy
    spec = rnn_spec("lstm", 6, 10, [5], seed=18)
    m = onnx_graph(spec, names=("observation", "hx", "cx"), out_names=("action", "hn", "cn"), normaliser=True,
                   rnn_attrs={"activations": ["Sigmoid", "Tanh", "Tanh"], "direction": "forward"})
    got, proof = import_policy(_save(m, tmp_path / "named.onnx"), kernel=Policy, n_random=300)
    assert got.source["state"]["inputs"] == {"h": "hx", "c": "cx"}
    assert got.source["state"]["outputs"] == {"h": "hn", "c": "cn"}
    assert "hn -> hx, cn -> cx" in describe(got, proof)


def test_without_onnxruntime_the_numpy_evaluator_proves_a_recurrent_graph(tmp_path, monkeypatch):
    import builtins
    from control_node.kernels.importers import import_policy
    real = builtins.__import__

    def no_ort(name, *a, **kw):
        if name == "onnxruntime":
            raise ImportError("no onnxruntime")
        return real(name, *a, **kw)
    spec = rnn_spec("lstm", 5, 6, [4], seed=13)
    path = _save(onnx_graph(spec, normaliser=True, form="dynamo", opset=18), tmp_path / "l.onnx")
    monkeypatch.setattr(builtins, "__import__", no_ort)
    got, proof = import_policy(path, n_random=300)
    assert "numpy forward pass" in proof["reference"] and got.recurrent == "lstm"


def test_a_wrong_gate_order_is_caught_by_the_proof(tmp_path, monkeypatch):
    """Were the importer to keep ONNX's i,o,f,c order, the sequence proof against onnxruntime would refuse it."""
    pytest.importorskip("onnxruntime")
    from control_node.kernels.importers import ImportRefused, import_policy
    from control_node.kernels.importers import onnx as O
    spec = rnn_spec("lstm", 5, 6, [4], seed=14, w_scale=3.0)
    path = _save(onnx_graph(spec, normaliser=True), tmp_path / "l.onnx")
    monkeypatch.setitem(O.GATE_PERM, "LSTM", (0, 1, 2, 3))
    with pytest.raises(ImportRefused, match=r"proof sample \d+ \(sequence \d+, step \d+"):
        import_policy(path, n_random=300)


# ---- refusals -----------------------------------------------------------------------------------------------
def refused(path, *patterns, **kw):
    from control_node.kernels.importers import ImportRefused, import_policy
    with pytest.raises(ImportRefused) as e:
        import_policy(path, n_random=50, **kw)
    msg = str(e.value)
    for p in patterns:
        assert p in msg, msg
    return msg


@pytest.mark.parametrize("attrs,patterns", [
    ({"direction": "bidirectional"}, ["node 'rnn' (LSTM)", "direction='bidirectional'"]),
    ({"direction": "reverse"}, ["direction='reverse'"]),
    ({"clip": 3.0}, ["attribute clip=3"]),
    ({"input_forget": 1}, ["input_forget=1"]),
    ({"activations": ["Sigmoid", "Tanh", "Relu"]}, ["activations=['Sigmoid', 'Tanh', 'Relu']"]),
    ({"activation_alpha": [1.0]}, ["activation_alpha"]),
    ({"layout": 1}, ["layout=1"]),
])
def test_onnx_lstm_attribute_refusals_name_the_attribute(tmp_path, attrs, patterns):
    spec = rnn_spec("lstm", 4, 5, [2], seed=15)
    refused(_save(onnx_graph(spec, opset=14, rnn_attrs=attrs), tmp_path / "r.onnx"), *patterns)


def test_onnx_structure_refusals(tmp_path):
    from onnx import TensorProto, helper, numpy_helper
    spec = rnn_spec("gru", 4, 5, [2], seed=16)
    refused(_save(onnx_graph(spec, rnn_attrs={"linear_before_reset": 0}), tmp_path / "g.onnx"),
            "node 'rnn' (GRU)", "linear_before_reset=0")
    # two layers: num_layers=2 state [2, 1, H]
    lstm = rnn_spec("lstm", 4, 5, [2], seed=17)
    m = onnx_graph(lstm)
    for vi in m.graph.input[1:]:
        vi.type.tensor_type.shape.dim[0].dim_value = 2
    refused(_save(m, tmp_path / "two.onnx"), "input 'h_in'", "num_layers=2")
    # two stacked recurrent nodes
    m = onnx_graph(lstm)
    extra = helper.make_node("LSTM", ["xs", "W", "R"], ["Y2"], hidden_size=5, name="rnn2")
    m.graph.node.insert(len(m.graph.node) - 1, extra)
    refused(_save(m, tmp_path / "stack.onnx"), "2 recurrent nodes", "num_layers > 1")
    # sequence_lens given
    m = onnx_graph(lstm)
    m.graph.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int32), "seqlen"))
    node = next(n for n in m.graph.node if n.op_type == "LSTM")
    node.input[4] = "seqlen"
    refused(_save(m, tmp_path / "seq.onnx"), "input sequence_lens 'seqlen'", "not supported")
    # no state outputs: the caller could not carry the state
    m = onnx_graph(lstm)
    del m.graph.output[1:]
    refused(_save(m, tmp_path / "noout.onnx"), "Y_h is not a graph output")
    # the plain RNN operator
    m = onnx_graph(spec)
    node = next(n for n in m.graph.node if n.op_type == "GRU")
    node.op_type = "RNN"
    del node.attribute[[a.name for a in node.attribute].index("linear_before_reset")]
    refused(_save(m, tmp_path / "rnn.onnx"), "(RNN)", "plain RNN operator")
    # state inputs but no recurrent node (the state would be carried by other operators)
    g = helper.make_graph([helper.make_node("Gemm", ["obs", "W"], ["actions"], transB=1)], "g",
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                           (("obs", [1, 4]), ("h_in", [1, 1, 8]), ("c_in", [1, 1, 8]))],
                          [helper.make_tensor_value_info("actions", TensorProto.FLOAT, [1, 2])],
                          [numpy_helper.from_array(np.ones((2, 4), np.float32), "W")])
    refused(_save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "nornn.onnx"),
            "recurrent policies", "not supported yet", "h_in")
    # h_in and c_in swapped by name
    m = onnx_graph(lstm, names=("obs", "c_in", "h_in"))
    refused(_save(m, tmp_path / "swap.onnx"), "input 'c_in'", "feeds the LSTM's initial_h")


def test_torchscript_refusals(tmp_path):
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def script(module, name):
        import warnings
        path = str(tmp_path / name)
        with warnings.catch_warnings():       # torch 2.13 deprecates TorchScript; the exporters still write it
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.script(module).save(path)
        return path

    class Exporter(nn.Module):
        def __init__(self, rnn, H=8, c=True):
            super().__init__()
            self.memory = rnn
            self.actor = nn.Sequential(nn.Linear(H * (2 if getattr(rnn, "bidirectional", False) else 1), 2))
            L = getattr(rnn, "num_layers", 1) * (2 if getattr(rnn, "bidirectional", False) else 1)
            self.register_buffer("hidden_state", torch.zeros(L, 1, H))
            self.register_buffer("cell_state", torch.zeros(L, 1, H))

        def forward(self, x):
            out, (h, c) = self.memory(x.unsqueeze(0), (self.hidden_state, self.cell_state))
            self.hidden_state[:] = h
            self.cell_state[:] = c
            return self.actor(out.squeeze(0))

    class NoWriteBack(Exporter):
        def forward(self, x):
            out, (h, c) = self.memory(x.unsqueeze(0), (self.hidden_state, self.cell_state))
            self.hidden_state[:] = h
            return self.actor(out.squeeze(0))

    class Stateless(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(4, 8)
            self.actor = nn.Sequential(nn.Linear(8, 2))

        def forward(self, x):
            y, _ = self.rnn(x.unsqueeze(0))
            return self.actor(y.squeeze(0))

    refused(script(Exporter(nn.LSTM(4, 8, num_layers=2)), "two.pt"), "submodule 'memory' (LSTM)", "num_layers=2")
    refused(script(Exporter(nn.LSTM(4, 8, bidirectional=True)), "bi.pt"), "bidirectional=True")
    refused(script(Exporter(nn.LSTM(4, 8, proj_size=4), H=4), "proj.pt"), "proj_size=4")
    refused(script(NoWriteBack(nn.LSTM(4, 8)), "nowb.pt"), "buffer 'cell_state'", "written 0 times")
    refused(script(Stateless(), "lstm.pt"), "submodule 'rnn' (LSTM)", "recurrent policies")
    ok = script(Exporter(nn.LSTM(4, 8)), "ok.pt")               # the same module, well-formed, imports
    from control_node.kernels.importers import import_policy
    spec, _ = import_policy(ok, n_random=300, kernel=Policy)
    assert spec.recurrent == "lstm" and spec.layer_sizes == [4, 8, 2]
