"""Model files: round trip, and every way a file can be wrong names the field."""
from __future__ import annotations

import numpy as np
import pytest

from control_node.kernels import ConsistencyError, ModelFileError, ModelSpec, Policy, check_consistency, load_model, save_model
from control_node.kernels.model_file import content_hash


def _arrays(path):
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _write(path, arrays):
    np.savez(path, **arrays)
    return path


def _rehash(arrays):
    """Recompute sha256 after an edit, so that only the edited field is wrong."""
    sizes = arrays["layer_sizes"]
    layers = [(arrays[f"W{i}"], arrays[f"b{i}"]) for i in range(len(sizes) - 1)]
    spec = ModelSpec(layers=layers, mean=arrays["mean"], scale=arrays["scale"],
                     classes=arrays["classes"].tolist(), feature_names=arrays["feature_names"].tolist(),
                     dtype=str(arrays["dtype"]), sha256="x")
    arrays["sha256"] = np.str_(content_hash(spec))
    return arrays


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_round_trip(iris_spec, tmp_path, dtype):
    spec = ModelSpec(layers=iris_spec.layers, mean=iris_spec.mean, scale=iris_spec.scale,
                     classes=iris_spec.classes, feature_names=iris_spec.feature_names, dtype=dtype,
                     check_X=iris_spec.check_X, train_accuracy=0.5, trainer="numpy")
    path = tmp_path / "m.npz"
    sha = save_model(spec, path)
    assert sha == spec.sha256 and len(sha) == 64
    back = load_model(path)
    assert back.sha256 == sha and back.dtype == dtype and back.layer_sizes == [4, 16, 3]
    assert back.classes == iris_spec.classes and back.feature_names == iris_spec.feature_names
    assert back.train_accuracy == 0.5 and np.isnan(back.test_accuracy) and back.trainer == "numpy"
    for (W, b), (W2, b2) in zip(spec.layers, back.layers):
        assert W2.dtype == np.dtype(dtype) and np.array_equal(W, W2) and np.array_equal(b, b2)
    policy = Policy.load(path)
    assert policy.sha256 == sha and policy.dtype == dtype
    assert (policy.predict_batch(iris_spec.check_X) == Policy(spec).predict_batch(iris_spec.check_X)).all()
    assert not list(tmp_path.glob("*.tmp*")), "atomic save left a temporary file"


def test_hash_changes_with_content(iris_spec):
    W, b = iris_spec.layers[1]
    W = W.copy()
    W[0, 0] = np.nextafter(W[0, 0], np.inf)
    other = ModelSpec(layers=[iris_spec.layers[0], (W, b)], mean=iris_spec.mean, scale=iris_spec.scale,
                      classes=iris_spec.classes, feature_names=iris_spec.feature_names)
    assert other.sha256 != iris_spec.sha256
    f32 = ModelSpec(layers=iris_spec.layers, mean=iris_spec.mean, scale=iris_spec.scale,
                    classes=iris_spec.classes, feature_names=iris_spec.feature_names, dtype="float32")
    assert f32.sha256 != iris_spec.sha256


def _edit_missing_key(a):
    del a["mean"]
    return "mean"


def _edit_missing_layer(a):
    del a["b0"]
    return "b0"


def _edit_shape_W(a):
    a["W0"] = a["W0"][:, :5]
    return "W0"


def _edit_shape_b(a):
    a["b1"] = np.zeros(4)
    return "b1"


def _edit_shape_mean(a):
    a["mean"] = np.zeros(3)
    _rehash(a)
    return "mean"


def _edit_nan_weight(a):
    a["W1"] = a["W1"].copy()
    a["W1"][2, 1] = np.nan
    return "W1"


def _edit_inf_bias(a):
    a["b0"] = a["b0"].copy()
    a["b0"][3] = np.inf
    return "b0"


def _edit_nan_mean(a):
    a["mean"] = a["mean"].copy()
    a["mean"][0] = np.nan
    return "mean"


def _edit_zero_scale(a):
    a["scale"] = a["scale"].copy()
    a["scale"][2] = 0.0
    _rehash(a)
    return "scale"


def _edit_dtype(a):
    a["dtype"] = np.str_("float16")
    return "dtype"


def _edit_version(a):
    a["format_version"] = np.int64(99)
    return "format_version"


def _edit_layer_sizes(a):
    a["layer_sizes"] = np.array([4], dtype=np.int64)
    return "layer_sizes"


def _edit_classes(a):
    a["classes"] = np.array(["a", "b"])
    _rehash(a)
    return "classes"


def _edit_feature_names(a):
    a["feature_names"] = np.array(["a", "b", "c"])
    return "feature_names"


def _edit_check_X(a):
    a["check_X"] = np.zeros((5, 3))
    return "check_X"


def _edit_corrupt_hash(a):
    a["sha256"] = np.str_("0" * 64)
    return "sha256"


def _edit_weight_without_rehash(a):
    a["W0"] = a["W0"].copy()
    a["W0"][0, 0] += 1e-3
    return "sha256"


def _edit_string_weights(a):
    a["W0"] = np.full(a["W0"].shape, "x")
    return "W0"


EDITS = [_edit_missing_key, _edit_missing_layer, _edit_shape_W, _edit_shape_b, _edit_shape_mean,
         _edit_nan_weight, _edit_inf_bias, _edit_nan_mean, _edit_zero_scale, _edit_dtype, _edit_version,
         _edit_layer_sizes, _edit_classes, _edit_feature_names, _edit_check_X, _edit_corrupt_hash,
         _edit_weight_without_rehash, _edit_string_weights]


@pytest.mark.parametrize("edit", EDITS, ids=[e.__name__[len("_edit_"):] for e in EDITS])
def test_bad_file_names_the_field(iris_model_path, tmp_path, edit):
    arrays = _arrays(iris_model_path)
    field = edit(arrays)
    path = _write(tmp_path / "bad.npz", arrays)
    with pytest.raises(ModelFileError) as info:
        load_model(path)
    assert info.value.field == field
    assert f"field '{field}'" in str(info.value)
    assert str(path) in str(info.value) and "Fix:" in str(info.value)
    with pytest.raises(ModelFileError):
        Policy.load(path)


def test_not_a_zip(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_bytes(b"this is not a zip archive\n" * 10)
    with pytest.raises(ModelFileError, match=r"field '\(file\)'.*not a readable"):
        load_model(path)


def test_truncated_zip(iris_model_path, tmp_path):
    data = iris_model_path.read_bytes()
    path = tmp_path / "cut.npz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match=r"field '\(file\)'"):
        load_model(path)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match=r"field '\(file\)'.*no such file") as info:
        Policy.load(tmp_path / "nope.npz")
    assert info.value.field == "(file)"


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(ModelFileError, match=r"field '\(file\)'"):
        load_model(tmp_path)


def test_save_refuses_invalid_spec(iris_spec, tmp_path):
    W, b = iris_spec.layers[0]
    W = W.copy()
    W[0, 0] = np.nan
    spec = ModelSpec(layers=[(W, b), iris_spec.layers[1]], mean=iris_spec.mean, scale=iris_spec.scale,
                     classes=iris_spec.classes, feature_names=iris_spec.feature_names)
    with pytest.raises(ModelFileError, match="'W0'"):
        save_model(spec, tmp_path / "x.npz")
    assert not (tmp_path / "x.npz").exists()


def test_model_file_error_is_value_error():
    assert issubclass(ModelFileError, ValueError)


def test_check_consistency_catches_tampered_kernel(iris_spec, make_spec):
    """A kernel built from other weights than the spec it is checked against is refused."""
    policy = Policy(iris_spec)
    assert check_consistency(policy, iris_spec)["checked"] > 2000
    W, b = iris_spec.layers[1]
    tampered = ModelSpec(layers=[iris_spec.layers[0], (W * 1.001, b)], mean=iris_spec.mean,
                         scale=iris_spec.scale, classes=iris_spec.classes, feature_names=iris_spec.feature_names,
                         check_X=iris_spec.check_X)
    with pytest.raises(ConsistencyError, match="check_X sample 0"):
        check_consistency(policy, tampered)
    # a shape-compatible but unrelated spec fails too
    other = make_spec([4, 16, 3], seed=99)
    with pytest.raises(ConsistencyError):
        check_consistency(Policy(other), iris_spec)


def test_check_consistency_tolerates_near_ties(make_spec):
    """Two classes with identical weights tie exactly; whichever the kernel picks is accepted."""
    spec = make_spec([4, 8, 3], seed=5)
    W, b = spec.layers[1]
    W = W.copy()
    b = b.copy()
    W[:, 2] = W[:, 1]
    b[2] = b[1]
    tie = ModelSpec(layers=[spec.layers[0], (W, b)], mean=spec.mean, scale=spec.scale,
                    classes=spec.classes, feature_names=spec.feature_names)
    check_consistency(Policy(tie), tie)
