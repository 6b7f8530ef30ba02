"""Model files: one ``.npz`` holding an MLP policy and what is needed to trust it.

Keys (all plain arrays; the file loads with ``allow_pickle=False``):

==================  =======================  ==========================================
key                 dtype / shape            meaning
==================  =======================  ==========================================
format_version      int64 ()                 ``FORMAT_VERSION``
dtype               str ()                   ``"float64"`` or ``"float32"``: compute dtype
layer_sizes         int64 (L + 1,)           ``[n_features, hidden..., n_classes]``
W{i}, b{i}          dtype (n_in, n_out), (n_out,)  dense layer i, ``y = x @ W + b``
mean, scale         float64 (n_features,)    normalisation ``(x - mean) / scale``
classes             str (n_classes,)         class names, index = action
feature_names       str (n_features,)
check_X             float64 (n, n_features)  inputs the kernel is verified on at load
train_accuracy      float64 ()               may be NaN when unknown
test_accuracy       float64 ()               may be NaN when unknown
trainer             str ()                   ``"numpy"``, ``"sklearn"`` ...
sha256              str ()                   content hash, see :func:`content_hash`
==================  =======================  ==========================================
"""
from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass, field

import numpy as np

FORMAT_VERSION = 1
DTYPES = ("float64", "float32")


class ModelFileError(ValueError):
    """A model file is unreadable or invalid. ``field`` names the offending key."""

    def __init__(self, path, field, problem, fix):
        self.path, self.field, self.problem, self.fix = str(path), field, problem, fix
        super().__init__(f"model file {path}: field '{field}': {problem}. Fix: {fix}")


@dataclass
class ModelSpec:
    """An MLP policy in memory. ``layers`` holds ``(W, b)`` with W shaped (n_in, n_out)."""

    layers: list
    mean: np.ndarray
    scale: np.ndarray
    classes: list
    feature_names: list
    dtype: str = "float64"
    check_X: np.ndarray | None = None
    train_accuracy: float = float("nan")
    test_accuracy: float = float("nan")
    trainer: str = "unknown"
    sha256: str = field(default="")

    def __post_init__(self):
        dt = np.dtype(self.dtype)
        self.layers = [(np.ascontiguousarray(W, dtype=dt), np.ascontiguousarray(b, dtype=dt))
                       for W, b in self.layers]
        self.mean = np.ascontiguousarray(self.mean, dtype=np.float64)
        self.scale = np.ascontiguousarray(self.scale, dtype=np.float64)
        self.classes = [str(c) for c in self.classes]
        self.feature_names = [str(f) for f in self.feature_names]
        if not self.sha256:
            self.sha256 = content_hash(self)

    @property
    def layer_sizes(self):
        return [self.layers[0][0].shape[0]] + [W.shape[1] for W, _ in self.layers]


def content_hash(spec: ModelSpec) -> str:
    """SHA-256 over everything that changes what the policy answers."""
    h = hashlib.sha256()
    h.update(f"v{FORMAT_VERSION};{spec.dtype};{spec.layer_sizes};".encode())
    for W, b in spec.layers:
        h.update(np.ascontiguousarray(W).tobytes())
        h.update(np.ascontiguousarray(b).tobytes())
    h.update(spec.mean.tobytes())
    h.update(spec.scale.tobytes())
    h.update("\x00".join(spec.classes).encode())
    return h.hexdigest()


def save_model(spec: ModelSpec, path) -> str:
    """Write ``spec`` to ``path`` (.npz), atomically. Returns the content hash."""
    validate_spec(spec, path)
    arrays = {
        "format_version": np.int64(FORMAT_VERSION),
        "dtype": np.str_(spec.dtype),
        "layer_sizes": np.asarray(spec.layer_sizes, dtype=np.int64),
        "mean": spec.mean,
        "scale": spec.scale,
        "classes": np.asarray(spec.classes, dtype=str),
        "feature_names": np.asarray(spec.feature_names, dtype=str),
        "train_accuracy": np.float64(spec.train_accuracy),
        "test_accuracy": np.float64(spec.test_accuracy),
        "trainer": np.str_(spec.trainer),
        "sha256": np.str_(spec.sha256),
    }
    if spec.check_X is not None:
        arrays["check_X"] = np.ascontiguousarray(spec.check_X, dtype=np.float64)
    for i, (W, b) in enumerate(spec.layers):
        arrays[f"W{i}"], arrays[f"b{i}"] = W, b
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return spec.sha256


def _require(data, path, key):
    if key not in data:
        raise ModelFileError(path, key, "missing", "re-export the model with `control-node train`")
    return data[key]


def _numeric(data, path, key, kinds="fiu"):
    """``_require`` plus a check that the array holds numbers (not strings or booleans)."""
    arr = _require(data, path, key)
    if arr.dtype.kind not in kinds:
        raise ModelFileError(path, key, f"has dtype {arr.dtype}, expected numbers", "re-export the model")
    return arr


def load_model(path) -> ModelSpec:
    """Read and validate a model file. Raises :class:`ModelFileError` naming the field."""
    if not os.path.exists(path):
        raise ModelFileError(path, "(file)", "no such file",
                             "train one with `control-node train --out PATH` or pass --model")
    try:
        npz = np.load(path, allow_pickle=False)
        data = {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise ModelFileError(path, "(file)", f"not a readable .npz archive ({e})",
                             "re-export the model with `control-node train`") from None
    version = int(_require(data, path, "format_version"))
    if version != FORMAT_VERSION:
        raise ModelFileError(path, "format_version", f"is {version}, this build reads {FORMAT_VERSION}",
                             "re-export the model with this version's `control-node train`")
    dtype = str(_require(data, path, "dtype"))
    if dtype not in DTYPES:
        raise ModelFileError(path, "dtype", f"is {dtype!r}", f"use one of {DTYPES}")
    sizes = _numeric(data, path, "layer_sizes", kinds="iu")
    if sizes.ndim != 1 or len(sizes) < 2 or (sizes < 1).any():
        raise ModelFileError(path, "layer_sizes", f"is {sizes.tolist()}",
                             "it must list at least [n_features, n_classes], all >= 1")
    layers = []
    for i in range(len(sizes) - 1):
        W = _numeric(data, path, f"W{i}")
        b = _numeric(data, path, f"b{i}")
        if W.shape != (sizes[i], sizes[i + 1]):
            raise ModelFileError(path, f"W{i}", f"has shape {W.shape}, layer_sizes implies "
                                 f"({sizes[i]}, {sizes[i + 1]})", "re-export the model")
        if b.shape != (sizes[i + 1],):
            raise ModelFileError(path, f"b{i}", f"has shape {b.shape}, layer_sizes implies "
                                 f"({sizes[i + 1]},)", "re-export the model")
        layers.append((W, b))
    spec = ModelSpec(
        layers=layers,
        mean=_numeric(data, path, "mean"),
        scale=_numeric(data, path, "scale"),
        classes=_require(data, path, "classes").tolist(),
        feature_names=_require(data, path, "feature_names").tolist(),
        dtype=dtype,
        check_X=_numeric(data, path, "check_X") if "check_X" in data else None,
        train_accuracy=float(data.get("train_accuracy", np.nan)),
        test_accuracy=float(data.get("test_accuracy", np.nan)),
        trainer=str(data.get("trainer", "unknown")),
        sha256=str(_require(data, path, "sha256")),
    )
    validate_spec(spec, path)
    actual = content_hash(spec)
    if actual != spec.sha256:
        raise ModelFileError(path, "sha256", f"content hash {actual[:12]}... does not match the "
                             f"recorded {spec.sha256[:12]}... (file corrupted or edited)",
                             "re-export the model with `control-node train`")
    return spec


def validate_spec(spec: ModelSpec, path="(in memory)") -> None:
    """Shape, finiteness and range checks shared by save and load."""
    n_features = spec.layers[0][0].shape[0]
    for i, (W, b) in enumerate(spec.layers):
        for name, arr in ((f"W{i}", W), (f"b{i}", b)):
            if not np.isfinite(arr).all():
                raise ModelFileError(path, name, "contains NaN or Inf", "retrain; check the training data")
        if i and W.shape[0] != spec.layers[i - 1][0].shape[1]:
            raise ModelFileError(path, f"W{i}", f"takes {W.shape[0]} inputs but layer {i - 1} "
                                 f"gives {spec.layers[i - 1][0].shape[1]}", "re-export the model")
    for name, arr in (("mean", spec.mean), ("scale", spec.scale)):
        if arr.shape != (n_features,):
            raise ModelFileError(path, name, f"has shape {arr.shape}, expected ({n_features},)",
                                 "re-export the model")
        if not np.isfinite(arr).all():
            raise ModelFileError(path, name, "contains NaN or Inf", "recompute the normalisation")
    if (spec.scale == 0).any():
        i = int(np.flatnonzero(spec.scale == 0)[0])
        raise ModelFileError(path, "scale", f"is 0 for feature {i}",
                             "a constant feature has no scale: use 1.0 for it")
    n_classes = spec.layers[-1][0].shape[1]
    if len(spec.classes) != n_classes:
        raise ModelFileError(path, "classes", f"names {len(spec.classes)} classes, the output layer has "
                             f"{n_classes}", "re-export the model")
    if len(spec.feature_names) != n_features:
        raise ModelFileError(path, "feature_names", f"names {len(spec.feature_names)} features, the "
                             f"input layer takes {n_features}", "re-export the model")
    if spec.check_X is not None and (spec.check_X.ndim != 2 or spec.check_X.shape[1] != n_features):
        raise ModelFileError(path, "check_X", f"has shape {spec.check_X.shape}, expected (n, {n_features})",
                             "re-export the model")
