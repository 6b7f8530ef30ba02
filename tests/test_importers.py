"""Policy importers (kernels/importers): every recognised ONNX / TorchScript pattern, every refusal, the proof.

Graphs are written with ``onnx.helper`` into tmp_path, one per exporter pattern, imported, and checked
against onnxruntime AND ``reference_act`` here (independently of the importer's own proof). Real exporter
outputs (rsl-rl-lib, SB3, torch's dynamo exporter) live in tests/data/ (made by make_exporter_outputs.py).
"""
from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from control_node.kernels import ModelSpec, load_model  # noqa: E402
from control_node.kernels.importers import ImportRefused, describe, import_policy  # noqa: E402
from control_node.kernels.reference import reference_act  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
N_RANDOM = 300


# -- writing small ONNX graphs ------------------------------------------------------------------------------
class Graph:
    """A tiny ONNX graph writer: ``g.op("Gemm", [...], transB=1)`` returns the output name."""

    def __init__(self, n_in, dtype="float32", batch=1, input_name="obs", seed=0):
        self.dtype = np.dtype(dtype)
        self.elem = TensorProto.FLOAT if self.dtype == np.float32 else TensorProto.DOUBLE
        self.nodes, self.inits, self.k = [], [], 0
        self.inputs = [helper.make_tensor_value_info(input_name, self.elem, [batch, n_in])]
        self.x = input_name
        self.rng = np.random.default_rng(seed)

    def init(self, arr, name=None, dtype=None):
        self.k += 1
        name = name or f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=dtype or self.dtype), name))
        return name

    def op(self, op_type, inputs, n_out=1, name=None, **attrs):
        self.k += 1
        outs = [f"t{self.k}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name or f"{op_type}_{self.k}", **attrs))
        return outs[0] if n_out == 1 else outs

    def gemm(self, x, n_in, n_out, transB=1, name=None, **attrs):
        shape = (n_out, n_in) if transB else (n_in, n_out)
        W = self.rng.normal(0, 1.5 / np.sqrt(n_in), size=shape)
        b = self.rng.normal(0, 0.3, size=n_out)
        return self.op("Gemm", [x, self.init(W), self.init(b)], name=name, transB=transB, **attrs)

    def save(self, path, outputs, opset=17, metadata=None, external=None):
        outs = [helper.make_tensor_value_info(n, self.elem, shape) for n, shape in outputs]
        graph = helper.make_graph(self.nodes, "policy", self.inputs, outs, initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="test-writer",
                                  producer_version="1.0")
        model.ir_version = 10 if opset >= 21 else 8
        if metadata:
            helper.set_model_props(model, metadata)
        path = str(path)
        if external:
            onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=external, size_threshold=0)
        else:
            onnx.save(model, path)
        return path


def ort_act(path, X, pre=None, output=None):
    """onnxruntime's action output for raw observations X, one at a time (float64 (n, A))."""
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    dtype = np.float64 if inp.type == "tensor(double)" else np.float32
    name = output or sess.get_outputs()[0].name
    feed = X if pre is None else pre(X)
    return np.array([sess.run([name], {inp.name: np.asarray(x, dtype=dtype)[None]})[0].reshape(-1) for x in feed])


def check(path, spec, X=None, pre=None, output=None, rtol=2e-4):
    """Assert reference_act(spec, X) == onnxruntime's output (through the spec's offset/scale)."""
    if X is None:
        X = np.random.default_rng(5).normal(0, 3, size=(200, spec.layer_sizes[0]))
    want = spec.action_offset + spec.action_scale * ort_act(path, X, pre, output)
    got = reference_act(spec, X)
    tol = rtol * np.maximum(1, np.abs(want).max(axis=1, keepdims=True))
    assert np.all(np.abs(got - want) <= tol), np.abs(got - want).max()


def imp(path, **kw):
    kw.setdefault("n_random", N_RANDOM)
    return import_policy(path, **kw)


def mlp(g, sizes, act="Elu", transB=1, **act_attrs):
    """Gemm + act for each hidden layer, a plain Gemm last; returns the output name."""
    x = g.x
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        x = g.gemm(x, a, b, transB=transB, name=f"gemm{i}")
        if i < len(sizes) - 2:
            x = g.op(act, [x], name=f"act{i}", **act_attrs)
    return x


# -- the exporter patterns -------------------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [11, 18, 21])
def test_rsl_rl_sub_div_gemm_transb1_elu(tmp_path, opset):
    pytest.importorskip("onnxruntime")
    g = Graph(8)
    mean = np.linspace(-1, 1, 8)
    std_eps = np.linspace(0.5, 2.0, 8) + 0.01
    x = g.op("Sub", [g.x, g.init(mean[None])], name="/obs_normalizer/Sub")
    g.x = g.op("Div", [x, g.init(std_eps[None])], name="/obs_normalizer/Div")
    out = mlp(g, [8, 32, 16, 16, 4], act="Elu", alpha=1.0)
    path = g.save(tmp_path / "policy.onnx", [(out, [1, 4])], opset=opset)
    spec, proof = imp(path)
    assert spec.layer_sizes == [8, 32, 16, 16, 4]
    assert spec.activations == ["elu", "elu", "elu", "identity"] and spec.alphas[:3] == [1.0, 1.0, 1.0]
    assert np.allclose(spec.mean, mean) and np.allclose(spec.scale, std_eps.astype(np.float32))
    assert spec.head == "continuous" and not spec.squash and spec.dtype == "float32" and spec.trainer == "onnx"
    assert spec.source["opset"] == opset and spec.source["format"] == "onnx" and spec.source["file"] == "policy.onnx"
    assert proof["reference"].startswith("onnxruntime") and proof["first_bad"] is None
    assert proof["samples"] == N_RANDOM and proof["max_abs_err"] < 1e-4
    check(path, spec)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_tf2onnx_brax_sub_mul_gemm_transb0_swish_split_tanh(tmp_path, opset):
    g = Graph(6)
    mean, inv_std = np.linspace(-0.5, 0.5, 6), np.linspace(0.5, 3.0, 6)
    x = g.op("Sub", [g.x, g.init(mean)])
    x = g.op("Mul", [x, g.init(inv_std)])
    for i, (a, b) in enumerate([(6, 16), (16, 16), (16, 8)]):
        h = g.gemm(x, a, b, transB=0)
        s = g.op("Sigmoid", [h])
        x = g.op("Mul", [h, s] if i % 2 else [s, h])          # both operand orders
    out2 = g.gemm(x, 8, 6, transB=0, name="head")
    if opset < 13:
        mu, _ = g.op("Split", [out2], n_out=2, name="split", axis=1, split=[3, 3])
    elif opset < 18:
        mu, _ = g.op("Split", [out2, g.init([3, 3], dtype=np.int64)], n_out=2, name="split", axis=-1)
    else:
        mu, _ = g.op("Split", [out2], n_out=2, name="split", axis=1, num_outputs=2)
    act = g.op("Tanh", [mu], name="squash")
    path = g.save(tmp_path / "brax.onnx", [(act, [1, 3])], opset=opset)
    spec, proof = imp(path)
    assert spec.layer_sizes == [6, 16, 16, 8, 3]
    assert spec.activations == ["silu", "silu", "silu", "identity"] and spec.squash
    assert np.allclose(spec.scale, 1 / inv_std.astype(np.float32))
    assert "mean half" in proof["recognised"]["head"]
    check(path, spec)


def _sb3_ppo_graph(n_in=3, n_act=2, action_name="53"):
    """The structure torch 2.13 writes for SB3's OnnxableSB3Policy (PPO, Box actions): Cast, Flatten, policy
    and value MLPs, the mean's Expand to the broadcast shape with std, a log-prob branch and a Reshape."""
    g = Graph(n_in, batch="batch", input_name="input")
    f = g.op("Flatten", [g.op("Cast", [g.x], to=TensorProto.FLOAT)], axis=1)
    pi = g.op("Tanh", [g.gemm(f, n_in, 8)])
    pi = g.op("Tanh", [g.gemm(pi, 8, 8)])
    vf = g.op("Tanh", [g.gemm(f, n_in, 8)])
    value = g.op("Identity", [g.gemm(vf, 8, 1)])
    mean = g.gemm(pi, 8, n_act, name="/policy/action_net/Gemm")
    std = g.op("Mul", [g.op("Constant", [], value=numpy_helper.from_array(np.float32(1.0))),
                       g.op("Exp", [g.init(np.full(n_act, -0.5), name="policy.log_std")])])
    a1 = g.op("Add", [g.op("ConstantOfShape", [g.op("Shape", [mean])]), mean])
    a2 = g.op("Add", [a1, std])
    expanded = g.op("Expand", [mean, g.op("Shape", [a2])])
    std_e = g.op("Expand", [std, g.op("Shape", [a2])])
    logp = g.op("Neg", [g.op("Log", [std_e])])
    log_prob = g.op("ReduceSum", [logp, g.init([1], dtype=np.int64)], keepdims=0)
    g.op("Reshape", [expanded, g.init([-1, n_act], dtype=np.int64)])
    g.nodes[-1].output[0] = action_name
    return g, [(action_name, ["batch", n_act]), (value, ["batch", 1]), (log_prob, ["batch"])]


def test_sb3_ppo_graph_keeps_only_the_action_output(tmp_path):
    g, outputs = _sb3_ppo_graph()
    path = g.save(tmp_path / "ppo.onnx", outputs, opset=17)
    spec, proof = imp(path)
    assert spec.layer_sizes == [3, 8, 8, 2] and spec.activations == ["tanh", "tanh", "identity"]
    assert not spec.squash and np.isinf(spec.action_low).all()
    dropped = proof["recognised"]["dropped"]
    assert dropped[:2] == [f"output '{outputs[1][0]}' (not the action)", f"output '{outputs[2][0]}' (not the action)"]
    assert "do not feed the action" in dropped[2] and "Exp" in dropped[3]
    check(path, spec)


def test_an_output_named_actions_is_the_action_even_when_not_first(tmp_path):
    g = Graph(4)
    h = g.op("Relu", [g.gemm(g.x, 4, 8)])
    value = g.gemm(h, 8, 1)
    g.op("Identity", [g.gemm(h, 8, 2)])
    g.nodes[-1].output[0] = "actions"
    path = g.save(tmp_path / "p.onnx", [(value, [1, 1]), ("actions", [1, 2])])
    spec, _ = imp(path)
    assert spec.layer_sizes == [4, 8, 2]
    check(path, spec, output="actions")


def test_sac_actor_drops_the_clip_exp_log_std_branch_and_squashes(tmp_path):
    g = Graph(3, batch="batch", input_name="input")
    f = g.op("Flatten", [g.op("Cast", [g.x], to=TensorProto.FLOAT)])
    h = g.op("Relu", [g.gemm(f, 3, 16)])
    h = g.op("Relu", [g.gemm(h, 16, 16)])
    mu = g.gemm(h, 16, 2, name="/actor/mu/Gemm")
    log_std = g.gemm(h, 16, 2, name="/actor/log_std/Gemm")
    clipped = g.op("Clip", [log_std, g.op("Constant", [], value=numpy_helper.from_array(np.float32(-20))),
                            g.op("Constant", [], value=numpy_helper.from_array(np.float32(2)))])
    std = g.op("Mul", [g.op("Constant", [], value=numpy_helper.from_array(np.float32(1))), g.op("Exp", [clipped])])
    a2 = g.op("Add", [g.op("Add", [g.op("ConstantOfShape", [g.op("Shape", [mu])]), mu]), std])
    out = g.op("Tanh", [g.op("Expand", [mu, g.op("Shape", [a2])])])
    path = g.save(tmp_path / "sac.onnx", [(out, ["batch", 2])], opset=17)
    spec, proof = imp(path)
    assert spec.layer_sizes == [3, 16, 16, 2] and spec.activations == ["relu", "relu", "identity"] and spec.squash
    assert "squash" in proof["recognised"]["head"]
    check(path, spec)


def test_clip_on_the_action_output_gives_action_bounds(tmp_path):
    g = Graph(4)
    h = g.op("Tanh", [g.gemm(g.x, 4, 8)])
    out = g.op("Clip", [g.gemm(h, 8, 3), g.init(np.float32(-0.4)), g.init(np.float32(0.5))], name="action_clip")
    path = g.save(tmp_path / "clip.onnx", [(out, [1, 3])], opset=13)
    spec, _ = imp(path)
    assert np.allclose(spec.action_low, -0.4) and np.allclose(spec.action_high, 0.5) and not spec.squash
    check(path, spec)


def test_matmul_add_dense_layers_and_gemm_alpha_beta(tmp_path):
    g = Graph(5)
    rng = np.random.default_rng(1)
    h = g.op("MatMul", [g.x, g.init(rng.normal(size=(5, 7)))])
    h = g.op("Relu", [g.op("Add", [h, g.init(rng.normal(size=7))])])
    h = g.op("Add", [g.init(rng.normal(size=(1, 6))), g.op("MatMul", [h, g.init(rng.normal(size=(7, 6)) / 3)])])
    h = g.op("LeakyRelu", [h], alpha=0.2)
    out = g.gemm(h, 6, 2, transB=0, alpha=0.5, beta=2.0)
    path = g.save(tmp_path / "mm.onnx", [(out, [1, 2])])
    spec, _ = imp(path)
    assert spec.activations == ["relu", "leaky_relu", "identity"] and abs(spec.alphas[1] - 0.2) < 1e-6
    check(path, spec)


ACTIVATION_CASES = [("Relu", {}, "relu", 0.0), ("Elu", {"alpha": 0.7}, "elu", 0.7), ("Selu", {}, "selu", 0.0),
                    ("LeakyRelu", {"alpha": 0.1}, "leaky_relu", 0.1), ("Celu", {"alpha": 0.5}, "celu", 0.5),
                    ("Tanh", {}, "tanh", 0.0), ("Sigmoid", {}, "sigmoid", 0.0), ("Softplus", {}, "softplus", 0.0),
                    ("silu", {}, "silu", 0.0)]


@pytest.mark.parametrize("op,attrs,name,alpha", ACTIVATION_CASES, ids=[c[0] for c in ACTIVATION_CASES])
def test_every_activation(tmp_path, op, attrs, name, alpha):
    g = Graph(4)
    h = g.gemm(g.x, 4, 12)
    h = g.op("Mul", [h, g.op("Sigmoid", [h])]) if op == "silu" else g.op(op, [h], **attrs)
    out = g.gemm(h, 12, 3)
    path = g.save(tmp_path / f"{op}.onnx", [(out, [1, 3])])
    spec, _ = imp(path)
    assert spec.activations == [name, "identity"] and abs(spec.alphas[0] - alpha) < 1e-6
    check(path, spec)


@pytest.mark.parametrize("opset", [11, 18, 21])
def test_no_op_reshapes_are_folded_in_both_axes_conventions(tmp_path, opset):
    g = Graph(4)
    h = g.op("Relu", [g.gemm(g.x, 4, 8)])
    if opset < 13:
        h = g.op("Squeeze", [g.op("Unsqueeze", [h], axes=[0])], axes=[0])
    else:
        h = g.op("Squeeze", [g.op("Unsqueeze", [h, g.init([0], dtype=np.int64)]), g.init([0], dtype=np.int64)])
    h = g.op("Reshape", [g.op("Identity", [h]), g.init([1, -1], dtype=np.int64)])
    out = g.gemm(h, 8, 2)
    path = g.save(tmp_path / "noop.onnx", [(out, [1, 2])], opset=opset)
    spec, _ = imp(path)
    assert spec.layer_sizes == [4, 8, 2]
    check(path, spec)


def _meta_graph(tmp_path, metadata, name="meta.onnx"):
    g = Graph(4)
    out = g.gemm(g.op("Elu", [g.gemm(g.x, 4, 8)]), 8, 3)
    return g.save(tmp_path / name, [(out, [1, 3])], metadata=metadata)


def test_metadata_props_joint_names_and_unmapped_offsets(tmp_path):
    meta = {"joint_names": "hip, knee ,ankle", "default_joint_pos": "0.1,0.8,-1.5", "action_scale": "0.25",
            "joint_stiffness": "40,40,40", "joint_damping": "1,1,1", "command_names": "vx,vy,wz",
            "observation_names": "base_ang_vel,projected_gravity"}
    path = _meta_graph(tmp_path, meta)
    spec, proof = imp(path)
    assert spec.action_names == ["hip", "knee", "ankle"]
    assert spec.feature_names == ["obs0", "obs1", "obs2", "obs3"]          # 2 terms for 4 inputs: not mapped
    assert (spec.action_offset == 0).all() and (spec.action_scale == 1).all()
    assert spec.source["metadata_props"] == meta
    notes = " ".join(proof["recognised"]["metadata"])
    assert "not mapped" in notes and "action_type=relative" in notes
    check(path, spec)


def test_metadata_action_type_relative_maps_offset_and_scale(tmp_path):
    meta = {"joint_names": "a,b,c", "default_joint_pos": "0.1,0.8,-1.5", "action_scale": "0.25",
            "action_type": "relative", "observation_names": "w,x,y,z"}
    path = _meta_graph(tmp_path, meta)
    spec, proof = imp(path)
    assert np.allclose(spec.action_offset, [0.1, 0.8, -1.5]) and np.allclose(spec.action_scale, 0.25)
    assert spec.feature_names == ["w", "x", "y", "z"]
    check(path, spec)                       # onnxruntime's output through the same offset / scale
    with pytest.raises(ImportRefused, match="default_joint_pos"):
        imp(_meta_graph(tmp_path, {**meta, "default_joint_pos": "0.1,0.2"}, "bad.onnx"))


def test_joint_names_of_another_length_are_not_mapped(tmp_path):
    spec, proof = imp(_meta_graph(tmp_path, {"joint_names": "a,b"}))
    assert spec.action_names == ["u0", "u1", "u2"]
    assert "not mapped" in proof["recognised"]["metadata"][0]


def test_external_data_file_is_loaded_and_hashed(tmp_path):
    g = Graph(6)
    out = g.gemm(g.op("Tanh", [g.gemm(g.x, 6, 16)]), 16, 2)
    path = g.save(tmp_path / "ext.onnx", [(out, [1, 2])], external="ext.onnx.data")
    assert os.path.exists(tmp_path / "ext.onnx.data")
    spec, _ = imp(path)
    assert spec.source["external_data"] == ["ext.onnx.data"]
    check(path, spec)
    h1 = spec.source["sha256"]
    with open(tmp_path / "ext.onnx.data", "r+b") as f:       # change one weight byte: the source hash changes
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    assert imp(path)[0].source["sha256"] != h1


def test_float64_graph_and_dtype_override(tmp_path):
    g = Graph(4, dtype="float64")
    out = g.gemm(g.op("Sigmoid", [g.gemm(g.x, 4, 8)]), 8, 2)
    path = g.save(tmp_path / "f64.onnx", [(out, [1, 2])])
    spec, proof = imp(path)
    assert spec.dtype == "float64" and "1e-09" in proof["tolerance"]
    check(path, spec, rtol=1e-9)
    spec32, proof32 = imp(path, dtype="float32")
    assert spec32.dtype == "float32" and "0.0002" in proof32["tolerance"]


def test_check_x_rows_are_proved_and_kept(tmp_path):
    path = _meta_graph(tmp_path, {})
    X = np.random.default_rng(3).normal(size=(10, 4))
    spec, proof = imp(path, check_X=X, n_random=50)
    assert proof["samples"] == 60
    assert np.array_equal(spec.check_X[:10], X) and spec.check_X.shape == (60, 4)
    with pytest.raises(ImportRefused, match="check_X"):
        imp(path, check_X=np.zeros((3, 5)))


def test_without_onnxruntime_the_importers_numpy_pass_proves_it(tmp_path, monkeypatch):
    g, outputs = _sb3_ppo_graph()
    path = g.save(tmp_path / "ppo.onnx", outputs, opset=17)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)       # `import onnxruntime` now raises ImportError
    spec, proof = imp(path)
    assert proof["reference"].startswith("importer's numpy forward pass")
    assert proof["max_abs_err"] < 1e-5
    monkeypatch.undo()
    check(path, spec)


def test_a_wrong_fold_is_caught_by_the_proof(tmp_path, monkeypatch):
    from control_node.kernels.importers import onnx as O
    path = _meta_graph(tmp_path, {})
    real = O.fold

    def wrong(g):
        f = real(g)
        W, b = f.layers[-1]
        f.layers[-1] = (W, b + np.array([0.0, 0.01, 0.0]))
        return f
    monkeypatch.setattr(O, "fold", wrong)
    with pytest.raises(ImportRefused, match=r"proof sample 0: the import and .* differ: action 1 \(u1\)") as e:
        imp(path)
    bad = e.value.proof["first_bad"]
    assert bad["index"] == 0 and len(bad["x"]) == 4 and abs(bad["got"][1] - bad["want"][1]) > 0.005


def test_kernel_result_is_recorded(tmp_path):
    pytest.importorskip("onnxruntime")
    from control_node.kernels import Policy
    path = _meta_graph(tmp_path, {})
    spec, proof = imp(path, kernel=Policy)
    k = proof["kernel"]
    assert str(k).startswith("not yet supported") or k["samples"] == N_RANDOM
    assert "proved against onnxruntime" in describe(spec, proof)
    assert imp(path)[1]["kernel"].startswith("not checked here")


# -- refusals ------------------------------------------------------------------------------------------------
def refused(path, *patterns, **kw):
    with pytest.raises(ImportRefused) as e:
        imp(path, **kw)
    msg = str(e.value)
    for p in patterns:
        assert p in msg, msg
    return msg


def test_unsupported_operator_is_named(tmp_path):
    g = Graph(4)
    w = g.init(np.ones((2, 1, 1)))
    h = g.op("Unsqueeze", [g.x, g.init([1], dtype=np.int64)])
    h = g.op("Conv", [h, w], name="conv1")
    out = g.op("Flatten", [h])
    path = g.save(tmp_path / "conv.onnx", [(out, [1, 8])])
    refused(path, "node 'conv1' (Conv)", "operator Conv is not supported", "supported on the observation path: ",
            "Gemm")


def test_gelu_as_erf_is_refused_naming_the_erf_node(tmp_path):
    g = Graph(4)
    h = g.gemm(g.x, 4, 8)
    e = g.op("Erf", [g.op("Div", [h, g.init(np.float32(np.sqrt(2)))])], name="/mlp/gelu/Erf")
    h = g.op("Mul", [g.op("Mul", [h, g.op("Add", [e, g.init(np.float32(1))])]), g.init(np.float32(0.5))])
    path = g.save(tmp_path / "gelu.onnx", [(g.gemm(h, 8, 2), [1, 2])])
    refused(path, "node '/mlp/gelu/Erf' (Erf)", "operator Erf is not supported", "GELU")


def test_two_inputs_and_recurrent_inputs_are_refused(tmp_path):
    g = Graph(4)
    g.inputs.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, [1, 4]))
    out = g.gemm(g.op("Add", [g.x, "extra"]), 4, 2)
    refused(g.save(tmp_path / "two.onnx", [(out, [1, 2])]), "2 inputs", "exactly one observation input")
    g = Graph(4)
    g.inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 8]) for n in ("h_in", "c_in")]
    out = g.gemm(g.x, 4, 2)
    refused(g.save(tmp_path / "lstm.onnx", [(out, [1, 2])]), "recurrent policies", "not supported yet", "h_in")


def test_nan_weights_name_the_initializer(tmp_path):
    g = Graph(4)
    h = g.op("Relu", [g.gemm(g.x, 4, 8)])
    W = np.ones((2, 8))
    W[1, 3] = np.nan
    out = g.op("Gemm", [h, g.init(W, name="mlp.2.weight"), g.init(np.zeros(2))], transB=1)
    refused(g.save(tmp_path / "nan.onnx", [(out, [1, 2])]), "initializer 'mlp.2.weight'", "NaN or Inf")


def test_dimension_mismatch_is_refused(tmp_path):
    g = Graph(4)
    h = g.op("Relu", [g.gemm(g.x, 4, 8, name="gemm0")])
    out = g.gemm(h, 9, 2, name="gemm1")                       # takes 9 inputs, gets 8
    refused(g.save(tmp_path / "dim.onnx", [(out, [1, 2])]), "node 'gemm1' (Gemm)", "dimension mismatch")
    g = Graph(4)
    x = g.op("Sub", [g.x, g.init(np.zeros(5))], name="norm")    # a 5-wide mean on a 4-wide input
    out = g.gemm(x, 4, 2)
    refused(g.save(tmp_path / "dim2.onnx", [(out, [1, 2])]), "node 'norm' (Sub)", "dimension mismatch")


def test_external_data_outside_the_folder_is_refused(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    g = Graph(4)
    out = g.gemm(g.x, 4, 2)
    path = g.save(inner / "p.onnx", [(out, [1, 2])], external="w.bin")
    os.replace(inner / "w.bin", tmp_path / "x.bin")
    m = onnx.load(path, load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../x.bin"
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    refused(path, "'../x.bin'", "outside the model's folder")


def test_other_refusals_name_the_field(tmp_path):
    g = Graph(4)
    out = g.gemm(g.op("Selu", [g.gemm(g.x, 4, 8)], alpha=1.5, name="selu0"), 8, 2)
    refused(g.save(tmp_path / "selu.onnx", [(out, [1, 2])]), "node 'selu0' (Selu)", "alpha=1.5")
    g = Graph(4, batch=4)
    refused(g.save(tmp_path / "batch.onnx", [(g.gemm(g.x, 4, 2), [4, 2])]), "input 'obs'", "fixed batch 4")
    g = Graph(4)
    refused(g.save(tmp_path / "ta.onnx", [(g.gemm(g.x, 4, 2, transA=1, transB=0), [1, 2])]), "transA=1")
    g = Graph(4)
    h = g.gemm(g.x, 4, 8)
    out = g.gemm(g.op("Mul", [h, g.op("Tanh", [g.op("Softplus", [h])])]), 8, 2)     # mish
    refused(g.save(tmp_path / "mish.onnx", [(out, [1, 2])]), "feeds 2 nodes")
    g = Graph(4)
    out = g.gemm(g.op("Tanh", [g.op("Relu", [g.gemm(g.x, 4, 8)])]), 8, 2)
    refused(g.save(tmp_path / "two_acts.onnx", [(out, [1, 2])]), "a second activation (tanh)")
    g = Graph(4)
    out = g.op("Add", [g.gemm(g.x, 4, 4), g.x])                                      # a residual
    refused(g.save(tmp_path / "res.onnx", [(out, [1, 4])]), "feeds 2 nodes")
    g = Graph(4)
    refused(g.save(tmp_path / "old.onnx", [(g.gemm(g.x, 4, 2), [1, 2])], opset=9), "opset 9 is older than 11")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    refused(tmp_path / "junk.onnx", "not a readable ONNX model")
    refused(tmp_path / "policy.h5", "suffix '.h5'")


def test_obs_norm_and_an_in_graph_normaliser_are_refused_together(tmp_path):
    g = Graph(4)
    x = g.op("Sub", [g.x, g.init(np.ones(4))])
    path = g.save(tmp_path / "n.onnx", [(g.gemm(x, 4, 2), [1, 2])])
    np.savez(tmp_path / "vn.npz", mean=np.zeros(4), var=np.ones(4))
    refused(path, "both an in-graph normaliser", "drop --obs-norm", obs_norm=tmp_path / "vn.npz")


# -- observation normalisation outside the graph ------------------------------------------------------------------
def test_obs_norm_npz_sets_mean_scale_and_clip(tmp_path):
    g, outputs = _sb3_ppo_graph()
    path = g.save(tmp_path / "ppo.onnx", outputs)
    mean, var = np.array([0.5, -1.0, 2.0]), np.array([0.01, 4.0, 9.0])
    np.savez(tmp_path / "vn.npz", mean=mean, var=var, clip_obs=5.0)
    spec, proof = imp(path, obs_norm=tmp_path / "vn.npz")
    assert np.allclose(spec.mean, mean) and np.allclose(spec.scale, np.sqrt(var + 1e-8))
    assert (spec.norm_clip_low == -5).all() and (spec.norm_clip_high == 5).all()
    assert spec.source["obs_norm"]["file"] == "vn.npz"

    def pre(X):
        return np.clip((X - mean) / np.sqrt(var + 1e-8), -5, 5)
    check(path, spec, X=np.random.default_rng(0).normal(0, 20, size=(200, 3)), pre=pre)
    np.savez(tmp_path / "bad.npz", mean=np.zeros(2), var=np.ones(2))
    refused(path, "has 2 values, the policy takes 3", obs_norm=tmp_path / "bad.npz")
    np.savez(tmp_path / "novar.npz", mean=np.zeros(3))
    refused(path, "field 'var'", "missing", obs_norm=tmp_path / "novar.npz")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/should-never-exist",))


def test_a_pickle_with_another_class_is_refused_without_running_it(tmp_path):
    g, outputs = _sb3_ppo_graph()
    path = g.save(tmp_path / "ppo.onnx", outputs)
    with open(tmp_path / "evil.pkl", "wb") as f:
        pickle.dump(_Evil(), f)
    refused(path, "pickled class posix.system", "is not allowed", obs_norm=tmp_path / "evil.pkl")
    assert not os.path.exists("/tmp/should-never-exist")


# -- real exporter outputs (tests/data, made by make_exporter_outputs.py) ---------------------------------------
@pytest.fixture(scope="module")
def expected():
    with np.load(os.path.join(DATA, "exporter_outputs.npz")) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", ["rsl_rl_actor_opset11.onnx", "rsl_rl_actor_dynamo.onnx"])
def test_real_rsl_rl_onnx(name, expected):
    spec, proof = imp(os.path.join(DATA, name))
    assert spec.layer_sizes == [8, 16, 16, 4] and spec.activations == ["elu", "elu", "identity"]
    assert spec.source["opset"] == (11 if "opset11" in name else 18)
    assert ("external_data" in spec.source) == ("dynamo" in name)
    assert np.abs(reference_act(spec, expected["X_rsl"]) - expected["y_rsl"]).max() < 1e-4
    check(os.path.join(DATA, name), spec, X=expected["X_rsl"])


@pytest.mark.parametrize("name", ["rsl_rl_policy.pt", "isaaclab_policy.pt", "legged_gym_policy_1.pt"])
def test_real_torchscript(name, expected):
    pytest.importorskip("torch")
    spec, proof = imp(os.path.join(DATA, name))
    assert spec.layer_sizes == [8, 16, 16, 4] and spec.trainer == "torchscript"
    assert proof["reference"].startswith("torch ")
    if name == "legged_gym_policy_1.pt":      # the bare actor: no normaliser; the others reproduce the model
        assert (spec.mean == 0).all()
    else:
        assert np.abs(reference_act(spec, expected["X_rsl"]) - expected["y_rsl"]).max() < 1e-4


@pytest.mark.parametrize("obs_norm", ["sb3_ppo_vecnormalize.pkl", "sb3_ppo_vecnormalize.npz"])
def test_real_sb3_ppo_with_vecnormalize(obs_norm, expected):
    spec, proof = imp(os.path.join(DATA, "sb3_ppo.onnx"), obs_norm=os.path.join(DATA, obs_norm))
    assert spec.layer_sizes == [3, 8, 8, 1] and spec.activations == ["tanh", "tanh", "identity"]
    assert np.isfinite(spec.norm_clip_high).all()
    assert np.abs(reference_act(spec, expected["X_sb3"]) - expected["y_ppo"]).max() < 1e-4


def test_vecnormalize_pkl_and_npz_agree():
    from control_node.kernels.importers.obs_norm import load_obs_norm
    a, b = load_obs_norm(os.path.join(DATA, "sb3_ppo_vecnormalize.pkl")), \
        load_obs_norm(os.path.join(DATA, "sb3_ppo_vecnormalize.npz"))
    assert np.array_equal(a.mean, b.mean) and np.array_equal(a.var, b.var)
    assert (a.epsilon, a.clip_obs) == (b.epsilon, b.clip_obs) == (1e-8, 10.0)


def test_real_sb3_sac_actor(expected):
    spec, _ = imp(os.path.join(DATA, "sb3_sac_actor.onnx"))
    assert spec.squash and spec.activations == ["relu", "relu", "identity"]
    assert np.abs(reference_act(spec, expected["X_sb3"]) - expected["y_sac"]).max() < 1e-4


# -- TorchScript ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _script(torch, module, path):
    torch.jit.script(module).save(str(path))
    return str(path)


def test_torchscript_sequential_of_every_activation(tmp_path, torch):
    nn = torch.nn
    torch.manual_seed(0)
    acts = [nn.ELU(alpha=0.7), nn.ReLU(), nn.SELU(), nn.LeakyReLU(0.2), nn.CELU(0.5), nn.Tanh(), nn.Sigmoid(),
            nn.Softplus(), nn.SiLU()]
    layers = []
    for a in acts:
        layers += [nn.Linear(6, 6), a]
    layers += [nn.Identity(), nn.Linear(6, 2), nn.Tanh()]
    path = _script(torch, nn.Sequential(nn.Linear(5, 6), *layers[1:]), tmp_path / "all.pt")
    spec, proof = imp(path)
    assert spec.activations == ["elu", "relu", "selu", "leaky_relu", "celu", "tanh", "sigmoid", "softplus", "silu",
                                "identity"] and spec.squash
    assert abs(spec.alphas[0] - 0.7) < 1e-12 and abs(spec.alphas[3] - 0.2) < 1e-12
    assert proof["max_abs_err"] < 1e-4


def test_torchscript_normaliser_and_actor(tmp_path, torch):
    nn = torch.nn

    class EmpiricalNormalization(nn.Module):        # rsl_rl's buffers and forward
        def __init__(self, n):
            super().__init__()
            self.eps = 1e-2
            self.register_buffer("_mean", torch.linspace(-1, 1, n)[None])
            self.register_buffer("_var", torch.ones(1, n))
            self.register_buffer("_std", torch.linspace(0.2, 2, n)[None])

        def forward(self, x):
            return (x - self._mean) / (self._std + self.eps)

    class Exporter(nn.Module):
        def __init__(self):
            super().__init__()
            self.normalizer = EmpiricalNormalization(4)
            self.actor = nn.Sequential(nn.Linear(4, 8), nn.ELU(), nn.Linear(8, 3))

        def forward(self, x):
            return self.actor(self.normalizer(x))

    path = _script(torch, Exporter(), tmp_path / "policy.pt")
    spec, _ = imp(path)
    assert np.allclose(spec.mean, np.linspace(-1, 1, 4), atol=1e-6)
    assert np.allclose(spec.scale, np.linspace(0.2, 2, 4) + 1e-2, atol=1e-6)


def test_torchscript_clamping_normaliser_and_action_clamp_agree_with_torch_at_50_std(tmp_path, torch):
    """A normaliser is read from its forward graph, never trusted by its class name: a subclass of rsl_rl's
    EmpiricalNormalization that clamps the normalised observation imports as the model file's norm_clip,
    and clamp(actor(obs), -clip_actions, clip_actions) as the head's clip; the compiled kernel then agrees
    with torch at observations of +-50 std, where both clamps act."""
    from control_node.kernels import Policy
    nn = torch.nn
    torch.manual_seed(0)

    class EmpiricalNormalization(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.eps = 1e-2
            self.register_buffer("_mean", torch.linspace(-1, 1, n)[None])
            self.register_buffer("_std", torch.linspace(0.2, 2, n)[None])

        def forward(self, x):
            return torch.clamp((x - self._mean) / (self._std + self.eps), -5.0, 5.0)

    class Exporter(nn.Module):
        def __init__(self):
            super().__init__()
            self.clip_actions = 0.8
            self.normalizer = EmpiricalNormalization(4)
            self.actor = nn.Sequential(nn.Linear(4, 16), nn.ELU(), nn.Linear(16, 2))

        def forward(self, x):
            return torch.clamp(self.actor(self.normalizer(x)), -self.clip_actions, self.clip_actions)

    module = Exporter().eval()
    spec, _ = imp(_script(torch, module, tmp_path / "clamping.pt"))
    assert np.allclose(spec.norm_clip_low, -5.0) and np.allclose(spec.norm_clip_high, 5.0)
    mean, std = np.linspace(-1, 1, 4), np.linspace(0.2, 2, 4)
    X = np.array([mean + k * std * e for k in (-50, -8, 8, 50) for e in np.eye(4)] +
                 [mean + k * std for k in (-50, 50)] + [mean])
    with torch.no_grad():
        want = module(torch.from_numpy(X).float()).double().numpy()
    assert np.abs(want).max() > 0.1 and len({tuple(np.round(w, 4)) for w in want}) > 4    # the rows differ
    pol = Policy(spec)
    got = np.array([pol.act(x) for x in X])
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()
    # without the observation clamp torch answers differently at 50 std: the clamp was read, not guessed
    module.normalizer.forward = lambda x: (x - module.normalizer._mean) / (module.normalizer._std + 1e-2)
    with torch.no_grad():
        unclamped = module(torch.from_numpy(X).float()).double().numpy()
    assert np.abs(unclamped - want).max() > 1e-2


def test_torchscript_dropout_is_refused(tmp_path, torch):
    nn = torch.nn
    refused(_script(torch, nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 2)).eval(),
                    tmp_path / "dropout.pt"), "Dropout")


def test_torchscript_heteroscedastic_first_slice(tmp_path, torch):
    nn = torch.nn

    class _FirstSliceDeterministicOutput(nn.Module):     # rsl-rl-lib 5's mean extractor
        def forward(self, mlp_output):
            return mlp_output[..., 0, :]

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(4, 8), nn.ELU(), nn.Linear(8, 6), nn.Unflatten(-1, (2, 3)))
            self.deterministic_output = _FirstSliceDeterministicOutput()

        def forward(self, x):
            return self.deterministic_output(self.mlp(x))

    spec, proof = imp(_script(torch, Model(), tmp_path / "het.pt"))
    assert spec.layer_sizes == [4, 8, 3] and "mean half" in proof["recognised"]["head"]


def test_torchscript_refusals(tmp_path, torch):
    nn = torch.nn

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(4, 8)
            self.actor = nn.Sequential(nn.Linear(8, 2))

        def forward(self, x):
            y, _ = self.rnn(x.unsqueeze(0))
            return self.actor(y.squeeze(0))

    class Doubles(nn.Module):
        def __init__(self):
            super().__init__()
            self.actor = nn.Sequential(nn.Linear(4, 2))

        def forward(self, x):
            return self.actor(x) * 2.0

    refused(_script(torch, Recurrent(), tmp_path / "lstm.pt"), "submodule 'rnn' (LSTM)", "recurrent policies")
    refused(_script(torch, nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)), tmp_path / "gelu.pt"),
            "submodule '1' (GELU)")
    refused(_script(torch, nn.Sequential(nn.Linear(4, 8), nn.Softplus(beta=2.0), nn.Linear(8, 2)),
                    tmp_path / "sp.pt"), "Softplus(beta=2.0")
    refused(_script(torch, Doubles(), tmp_path / "mul.pt"), "aten::mul")
    torch.save(nn.Linear(4, 2).state_dict(), tmp_path / "ckpt.pt")
    refused(tmp_path / "ckpt.pt", "not a TorchScript archive", "not unpickled")


# -- the CLI verb ------------------------------------------------------------------------------------------------
def test_cli_import_writes_a_verified_model_file(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from control_node.cli import main
    path = _meta_graph(tmp_path, {"joint_names": "a,b,c"})
    obs = tmp_path / "obs.npy"
    np.save(obs, np.random.default_rng(0).normal(size=(7, 4)))
    out = tmp_path / "m.npz"
    assert main(["import", path, "--out", str(out), "--check-obs", str(obs), "--n-random", "100"]) == 0
    text = capsys.readouterr().out
    assert "layer 0" in text and "elu" in text and "proved against onnxruntime" in text and "wrote" in text
    spec = load_model(out)
    assert isinstance(spec, ModelSpec) and spec.head == "continuous" and spec.action_names == ["a", "b", "c"]
    assert spec.check_X.shape == (107, 4)


def test_cli_refusal_exits_2_and_writes_nothing(tmp_path, capsys):
    from control_node.cli import main
    g = Graph(4)
    path = g.save(tmp_path / "conv.onnx", [(g.op("Erf", [g.gemm(g.x, 4, 2)], name="erf0"), [1, 2])])
    out = tmp_path / "m.npz"
    assert main(["import", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "control-node import: error: cannot import conv.onnx: node 'erf0' (Erf)" in err
    assert not out.exists()


# -- weight storage (issue #24) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("weights", ["f16", "int8"])
def test_cli_import_with_narrow_weights_records_the_error(tmp_path, capsys, weights):
    """--weights: the file keeps the storage and its error measured over the proof (edge samples included);
    Policy.load runs it as stored and says so."""
    pytest.importorskip("onnxruntime")
    from control_node.cli import main
    from control_node.kernels import Policy
    path = _meta_graph(tmp_path, {"joint_names": "a,b,c"})
    out = tmp_path / "m.npz"
    assert main(["import", path, "--out", str(out), "--n-random", "200", "--weights", weights,
                 "--tolerance", "0.5"]) == 0
    text = capsys.readouterr().out
    assert f"weights       {weights}: max |error|" in text and f"{weights} weights)" in text
    spec = load_model(out)
    err = spec.weights_error
    assert spec.weights == weights and err["storage"] == weights and err["tolerance"] == 0.5
    assert err["samples"] > 200          # the proof's rows plus its edge samples
    assert 0 < err["p99_abs"] <= err["max_abs"] and 0 < err["max_rel"] <= 0.5
    p = Policy.load(out)
    assert p.weights == weights and p.weights_error["max_abs"] == err["max_abs"]


def test_cli_import_too_tight_tolerance_refuses_naming_action_and_observation(tmp_path, capsys):
    from control_node.cli import main
    path = _meta_graph(tmp_path, {"joint_names": "a,b,c"})
    out = tmp_path / "m.npz"
    assert main(["import", path, "--out", str(out), "--n-random", "100", "--weights", "int8",
                 "--tolerance", "1e-9"]) == 2
    err = capsys.readouterr().err
    assert "cannot import" in err and "--weights int8: int8 weights are off by" in err
    assert "above the tolerance 1e-09" in err and "worst on action" in err and "at observation row" in err
    assert "x = [" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
