"""Model files: one ``.npz`` holding a policy and what is needed to trust it.

A policy is: observation pre-processing, an optional recurrent layer (LSTM or GRU), a stack of dense
layers each with its own activation, and a head. For raw observations ``x`` (float64, n_features):

1. ``x1 = x * obs_scale``                        per-feature scale (legged_gym's obs_scales)
2. ``x2 = clip(x1, obs_clip_low, obs_clip_high)`` (legged_gym's clip_observations)
3. ``z  = (x2 - mean) / scale``                   ``scale`` is the divisor with the exporter's epsilon
                                                  folded in: rsl_rl ``std + 0.01``, SB3 ``sqrt(var + 1e-8)``
4. ``z  = clip(z, norm_clip_low, norm_clip_high)`` (SB3 VecNormalize's clip_obs)
4r. recurrent policies only (``recurrent`` = ``"lstm"`` / ``"gru"``, hidden size H, in ``dtype``), on the
   state carried from the previous step (zero after a reset), torch's definitions and gate order:

   * ``gx = rnn_W_ih @ z + rnn_b_ih``, ``gh = rnn_W_hh @ h + rnn_b_hh`` (G*H values each, gate blocks of H)
   * LSTM (G = 4, blocks i, f, g, o): ``i, f, o = sigmoid(gx + gh)`` blocks, ``g = tanh(gx + gh)`` block,
     ``c = f * c + i * g``, ``h = o * tanh(c)``
   * GRU (G = 3, blocks r, z, n; torch = ONNX ``linear_before_reset=1``): ``r, u = sigmoid(gx + gh)``
     blocks (u: the update gate torch calls z), ``n = tanh(gx_n + r * gh_n)``, ``h = (1 - u) * n + u * h``

   then ``h`` (H values) is the input of the dense stack. If the new state (h, or c) is not finite,
   the state is reset to zero and the step has no action (the kernel returns -1).
5. ``h  = act_l(h @ W_l + b_l)`` for each layer l, in the compute ``dtype`` (steps 1-4 run in float64)
6. head ``argmax``: the class index of the last layer's output (first maximum, as numpy);
   head ``continuous`` (float64): ``a = tanh(h)`` if ``squash``, ``a = clip(a, action_low, action_high)``,
   ``u = action_offset + action_scale * a`` (e.g. joint target = default pose + 0.25 * action).

Keys (all plain arrays; the file loads with ``allow_pickle=False``). Version 1 files (ReLU hidden
layers, argmax head, no pre-processing beyond mean/scale) and version 2 files (no recurrent layer) still
load, with their hashes; a policy without a recurrent layer is still written as version 2. Version 3
is written only for recurrent policies and adds the ``recurrent`` and ``rnn_*`` keys.

==================  =======================  ==========================================
key                 dtype / shape            meaning
==================  =======================  ==========================================
format_version      int64 ()                 1, 2, or 3 (recurrent policies only)
dtype               str ()                   ``"float64"`` or ``"float32"``: compute dtype
layer_sizes         int64 (L + 1,)           ``[n_features, hidden..., n_outputs]``; v3 (L + 2,):
                                             ``[n_features, H, hidden..., n_outputs]``
W{i}, b{i}          dtype (n_in, n_out), (n_out,)  dense layer i, ``y = x @ W + b``
recurrent           str ()                   v3: ``"lstm"`` or ``"gru"``
rnn_W_ih            dtype (G*H, n_features)  v3: input weights, torch layout (``weight_ih_l0``):
                                             rows are gate blocks of H, LSTM i,f,g,o (G=4), GRU r,z,n (G=3)
rnn_W_hh            dtype (G*H, H)           v3: hidden weights (``weight_hh_l0``), same blocks
rnn_b_ih, rnn_b_hh  dtype (G*H,)             v3: the two biases (``bias_ih_l0``, ``bias_hh_l0``), kept
                                             apart (GRU's n gate needs b_hh inside r * (...))
activations         str (L,)                 v2: one of :data:`ACTIVATIONS` per layer
alphas              float64 (L,)             v2: alpha of elu / leaky_relu / celu (else 0)
mean, scale         float64 (n_features,)    normalisation ``(x - mean) / scale``
obs_scale           float64 (n_features,)    v2: per-feature scale before clipping (default 1)
obs_clip_low/high   float64 (n_features,)    v2: clip before normalising (default -inf / inf)
norm_clip_low/high  float64 (n_features,)    v2: clip after normalising (default -inf / inf)
head                str ()                   v2: ``"argmax"`` or ``"continuous"`` (v1: argmax)
classes             str (n_classes,)         argmax: class names, index = action
action_names        str (n_actions,)         continuous: names (joint names)
squash              bool ()                  continuous: tanh before clipping
action_low/high     float64 (n_actions,)     continuous: clip bounds (may be -inf / inf)
action_offset       float64 (n_actions,)     continuous: ``u = offset + scale * a``
action_scale        float64 (n_actions,)
feature_names       str (n_features,)
source              str ()                   v2: JSON: where it came from (file, sha256, exporter,
                                             opset, producer, metadata_props)
check_X             float64 (n, n_features)  inputs the kernel is verified on at load (recurrent: in
                                             order, as sequences of 300 steps from the zero state)
train_accuracy      float64 ()               may be NaN when unknown
test_accuracy       float64 ()               may be NaN when unknown
trainer             str ()                   ``"numpy"``, ``"sklearn"``, ``"onnx"``, ``"torchscript"`` ...
sha256              str ()                   content hash, see :func:`content_hash`
weights             str ()                   optional: weight storage ``f16`` / ``bf16`` / ``int8``
                                             (kernels/weights.py; absent: ``f32``, the exact model dtype).
                                             The file keeps the full-precision weights; the kernel stores
                                             them narrower at load. In the hash when not f32.
weights_error       str ()                   optional: JSON, the error measured against the float32 policy
                                             at import (kernels.weights.measure_error)
deploy              str ()                   optional: JSON, the deploy contract (:data:`DEPLOY_KEYS`): the
                                             policy's side of a legged recipe (joints.policy, default_pos,
                                             policy_dt, observation terms, action scale / clip, actuator kp /
                                             kd) read from the exporter's metadata at import, and where each
                                             value came from. In the hash when present (files without it
                                             keep theirs); builds before it refuse a file that has it.
==================  =======================  ==========================================
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import zipfile
from dataclasses import dataclass, field

import numpy as np

FORMAT_VERSION = 3          # written for recurrent policies; everything else is still written as version 2
READS_VERSIONS = (1, 2, 3)
DTYPES = ("float64", "float32")
HEADS = ("argmax", "continuous")
#: recurrent layer kind -> gates (blocks of H rows in rnn_W_ih / rnn_W_hh), in torch's order
RECURRENT = {"lstm": ("i", "f", "g", "o"), "gru": ("r", "z", "n")}
RNN_KEYS = ("rnn_W_ih", "rnn_W_hh", "rnn_b_ih", "rnn_b_hh")
#: activation name -> (kernel code, default alpha); the codes are kernels/mlp_core.h's MLP_ACT_*
ACTIVATIONS = {
    "identity": (0, 0.0), "relu": (1, 0.0), "elu": (2, 1.0), "selu": (3, 0.0), "leaky_relu": (4, 0.01),
    "celu": (5, 1.0), "tanh": (6, 0.0), "sigmoid": (7, 0.0), "softplus": (8, 0.0), "silu": (9, 0.0),
}
WITH_ALPHA = ("elu", "leaky_relu", "celu")
#: the most bytes the arrays of one model file may take together, unless the caller names its own bound: the
#: node's policy memory bound, [lifecycle] max_resident_mb (control_node/config.py), 256 MiB by default. Every
#: array is checked against it by its .npy header, before a byte of it is allocated.
MAX_FILE_BYTES = 256 << 20


class ModelFileError(ValueError):
    """A model file is unreadable or invalid. ``field`` names the offending key."""

    def __init__(self, path, field, problem, fix):
        self.path, self.field, self.problem, self.fix = str(path), field, problem, fix
        super().__init__(f"cannot load {path}: field '{field}': {problem}. Fix: {fix}")


@dataclass
class ModelSpec:
    """A policy in memory (see the module docstring for what each part computes).

    ``layers`` holds ``(W, b)`` with W shaped (n_in, n_out), in ``dtype``. Everything after
    ``feature_names`` has a default that gives the version-1 policy: ReLU hidden layers, an identity
    output layer, an argmax head and no pre-processing beyond ``(x - mean) / scale``. Per-feature and
    per-action arrays may be given as scalars (broadcast).

    ``recurrent`` (``None``, ``"lstm"`` or ``"gru"``) puts one recurrent layer between the pre-processing
    and the dense layers; its weights ``rnn_W_ih`` (G*H, n_features), ``rnn_W_hh`` (G*H, H), ``rnn_b_ih``,
    ``rnn_b_hh`` (G*H,) are in torch's layout and gate order (see the module docstring), and the first
    dense layer then takes H inputs.
    """

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
    activations: list | None = None
    alphas: list | None = None
    obs_scale: np.ndarray | float = 1.0
    obs_clip_low: np.ndarray | float = -np.inf
    obs_clip_high: np.ndarray | float = np.inf
    norm_clip_low: np.ndarray | float = -np.inf
    norm_clip_high: np.ndarray | float = np.inf
    head: str = "argmax"
    action_names: list | None = None
    squash: bool = False
    action_low: np.ndarray | float = -np.inf
    action_high: np.ndarray | float = np.inf
    action_offset: np.ndarray | float = 0.0
    action_scale: np.ndarray | float = 1.0
    source: dict = field(default_factory=dict)
    recurrent: str | None = None
    rnn_W_ih: np.ndarray | None = None
    rnn_W_hh: np.ndarray | None = None
    rnn_b_ih: np.ndarray | None = None
    rnn_b_hh: np.ndarray | None = None
    weights: str = "f32"
    weights_error: dict | None = None
    deploy: dict | None = None

    def __post_init__(self):
        dt = np.dtype(self.dtype)
        self.weights = str(self.weights or "f32").lower()
        self.layers = [(np.ascontiguousarray(W, dtype=dt), np.ascontiguousarray(b, dtype=dt))
                       for W, b in self.layers]
        if self.recurrent is not None:
            self.recurrent = str(self.recurrent).lower()
            if self.recurrent in ("", "none"):
                self.recurrent = None
        for key in RNN_KEYS:
            v = getattr(self, key)
            if v is not None:
                setattr(self, key, np.ascontiguousarray(v, dtype=dt))
        n_layers = len(self.layers)
        n_in = self.n_features
        n_out = self.layers[-1][0].shape[1] if self.layers else 0
        if self.activations is None:
            self.activations = ["relu"] * (n_layers - 1) + ["identity"]
        self.activations = [str(a) for a in self.activations]
        if self.alphas is None:
            self.alphas = [ACTIVATIONS.get(a, (0, 0.0))[1] for a in self.activations]
        self.alphas = [float(a) for a in self.alphas]

        def per(v, n):
            a = np.asarray(v, dtype=np.float64)
            return np.ascontiguousarray(np.broadcast_to(a, (n,)) if a.ndim == 0 else a)

        self.mean = per(self.mean, n_in)
        self.scale = per(self.scale, n_in)
        self.obs_scale = per(self.obs_scale, n_in)
        self.obs_clip_low, self.obs_clip_high = per(self.obs_clip_low, n_in), per(self.obs_clip_high, n_in)
        self.norm_clip_low, self.norm_clip_high = per(self.norm_clip_low, n_in), per(self.norm_clip_high, n_in)
        self.head = str(self.head)
        self.classes = [str(c) for c in (self.classes or [])]
        if self.action_names is None:
            self.action_names = [f"u{i}" for i in range(n_out)] if self.head == "continuous" else []
        self.action_names = [str(a) for a in self.action_names]
        self.squash = bool(self.squash)
        self.action_low, self.action_high = per(self.action_low, n_out), per(self.action_high, n_out)
        self.action_offset, self.action_scale = per(self.action_offset, n_out), per(self.action_scale, n_out)
        self.feature_names = [str(f) for f in self.feature_names]
        self.source = dict(self.source or {})
        self.deploy = _canonical_deploy(self.deploy)
        if not self.sha256:
            self.sha256 = content_hash(self)

    @property
    def layer_sizes(self):
        """Widths along the network: ``[n_features, hidden..., n_outputs]``; with a recurrent layer
        ``[n_features, H, hidden..., n_outputs]``."""
        return ([self.n_features] if self.recurrent else []) + self.dense_sizes

    @property
    def dense_sizes(self):
        """Widths of the dense stack: ``[n_in of the first dense layer, ..., n_outputs]``."""
        return [self.layers[0][0].shape[0]] + [W.shape[1] for W, _ in self.layers]

    @property
    def n_features(self) -> int:
        """Width of the raw observation (the recurrent layer's input, else the first dense layer's)."""
        if self.recurrent and self.rnn_W_ih is not None and self.rnn_W_ih.ndim == 2:
            return int(self.rnn_W_ih.shape[1])
        return int(self.layers[0][0].shape[0]) if self.layers else 0

    @property
    def hidden_size(self) -> int:
        """H of the recurrent layer (0 without one)."""
        if self.recurrent and self.rnn_W_hh is not None and self.rnn_W_hh.ndim == 2:
            return int(self.rnn_W_hh.shape[1])
        return 0

    @property
    def n_actions(self) -> int:
        """Width of the action the head gives: 1 (the class index) for argmax, else the vector's length."""
        return 1 if self.head == "argmax" else self.layer_sizes[-1]

    @property
    def is_v1(self) -> bool:
        """True when the policy is exactly what a version-1 file can hold (ReLU MLP, argmax, mean/scale)."""
        L = len(self.layers)
        return (self.head == "argmax" and self.activations == ["relu"] * (L - 1) + ["identity"]
                and not self.has_preprocessing and not self.recurrent)

    @property
    def has_preprocessing(self) -> bool:
        """True when steps 1, 2 or 4 of the pre-processing do anything."""
        return bool((self.obs_scale != 1).any() or np.isfinite(self.obs_clip_low).any()
                    or np.isfinite(self.obs_clip_high).any() or np.isfinite(self.norm_clip_low).any()
                    or np.isfinite(self.norm_clip_high).any())


def format_version_of(spec: ModelSpec) -> int:
    """The version a file holding ``spec`` is written as: 3 for a recurrent policy, else 2."""
    return 3 if spec.recurrent else 2


def content_hash(spec: ModelSpec) -> str:
    """SHA-256 over everything that changes what the policy answers.

    A policy a version-1 file can hold hashes as it always did, so version-1 files keep their hash; a
    policy without a recurrent layer hashes as in version 2, so version-2 files keep theirs too."""
    h = hashlib.sha256()
    v1 = spec.is_v1
    h.update(f"v{1 if v1 else format_version_of(spec)};{spec.dtype};{spec.layer_sizes};".encode())
    for W, b in spec.layers:
        h.update(np.ascontiguousarray(W).tobytes())
        h.update(np.ascontiguousarray(b).tobytes())
    h.update(spec.mean.tobytes())
    h.update(spec.scale.tobytes())
    h.update("\x00".join(spec.classes).encode())
    if not v1:
        h.update(json.dumps([spec.activations, spec.alphas, spec.head, spec.squash, spec.action_names]).encode())
        for a in (spec.obs_scale, spec.obs_clip_low, spec.obs_clip_high, spec.norm_clip_low, spec.norm_clip_high,
                  spec.action_low, spec.action_high, spec.action_offset, spec.action_scale):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    if spec.recurrent:
        h.update(f"recurrent;{spec.recurrent};".encode())
        for key in RNN_KEYS:
            a = getattr(spec, key)
            h.update(f"{key}{list(np.shape(a))};".encode())
            h.update(np.ascontiguousarray(a).tobytes())
    if spec.weights != "f32":       # narrower storage changes the answers (f32 files keep their hash)
        h.update(f"weights;{spec.weights};".encode())
    if spec.deploy:                 # the contract changes what the robot does (files without one keep their hash)
        h.update(b"deploy;" + deploy_text(spec.deploy).encode())
    return h.hexdigest()


#: the deploy contract's top-level keys: ``version`` (1), ``recipe`` (the policy's side of a legged recipe, in
#: control_node/loop/legged.py's format), ``from`` (where it came from: exporter, file, sha256, the keys read),
#: ``info`` (what the exporter gave that the recipe does not take: command ranges, effort limits, quat order...)
DEPLOY_KEYS = ("version", "recipe", "from", "info")
DEPLOY_VERSION = 1
#: the recipe keys a contract may hold (the robot's side, joints.robot, limits, modes, stays in the config)
DEPLOY_RECIPE_KEYS = {"joints": ("policy",), "default_pos": None, "policy_dt": None,
                      "observation": ("terms", "n_commands", "history", "clip_stage", "first_tick"),
                      "action": ("scale", "clip_to_limits"), "actuator": ("kp", "kd", "q_lo", "q_hi")}


def _jsonable(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON")


def _canonical_deploy(d):
    """The contract as plain JSON values (numpy numbers become Python's), or None for none / an empty one."""
    if not d:
        return None
    try:
        return json.loads(json.dumps(d, default=_jsonable))
    except (TypeError, ValueError):
        return d                    # validate_spec names the field


def deploy_text(d) -> str:
    """The contract's JSON text as the file holds it and the hash covers it (sorted keys, no spaces)."""
    return json.dumps(d, sort_keys=True, separators=(",", ":"), default=_jsonable)


def save_model(spec: ModelSpec, path) -> str:
    """Write ``spec`` to ``path`` (.npz), atomically. Returns the content hash."""
    validate_spec(spec, path)
    arrays = _arrays_of(spec)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return spec.sha256


def model_bytes(spec: ModelSpec) -> bytes:
    """The model file of ``spec`` as bytes (what :func:`save_model` writes; :func:`load_model` reads them)."""
    validate_spec(spec)
    buf = io.BytesIO()
    np.savez(buf, **_arrays_of(spec))
    return buf.getvalue()


def _arrays_of(spec: ModelSpec) -> dict:
    """The arrays of a model file holding ``spec``, by key (the module docstring's table)."""
    arrays = {
        "format_version": np.int64(format_version_of(spec)),
        "dtype": np.str_(spec.dtype),
        "layer_sizes": np.asarray(spec.layer_sizes, dtype=np.int64),
        "mean": spec.mean,
        "scale": spec.scale,
        "classes": np.asarray(spec.classes, dtype=str),
        "feature_names": np.asarray(spec.feature_names, dtype=str),
        "activations": np.asarray(spec.activations, dtype=str),
        "alphas": np.asarray(spec.alphas, dtype=np.float64),
        "obs_scale": spec.obs_scale, "obs_clip_low": spec.obs_clip_low, "obs_clip_high": spec.obs_clip_high,
        "norm_clip_low": spec.norm_clip_low, "norm_clip_high": spec.norm_clip_high,
        "head": np.str_(spec.head),
        "action_names": np.asarray(spec.action_names, dtype=str),
        "squash": np.bool_(spec.squash),
        "action_low": spec.action_low, "action_high": spec.action_high,
        "action_offset": spec.action_offset, "action_scale": spec.action_scale,
        "source": np.str_(json.dumps(spec.source, sort_keys=True, default=str)),
        "train_accuracy": np.float64(spec.train_accuracy),
        "test_accuracy": np.float64(spec.test_accuracy),
        "trainer": np.str_(spec.trainer),
        "sha256": np.str_(spec.sha256),
    }
    if spec.weights != "f32":
        arrays["weights"] = np.str_(spec.weights)
        arrays["weights_error"] = np.str_(json.dumps(spec.weights_error or {}, sort_keys=True))
    if spec.deploy:
        arrays["deploy"] = np.str_(deploy_text(spec.deploy))
    if spec.check_X is not None:
        arrays["check_X"] = np.ascontiguousarray(spec.check_X, dtype=np.float64)
    for i, (W, b) in enumerate(spec.layers):
        arrays[f"W{i}"], arrays[f"b{i}"] = W, b
    if spec.recurrent:
        arrays["recurrent"] = np.str_(spec.recurrent)
        for key in RNN_KEYS:
            arrays[key] = getattr(spec, key)
    return arrays


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


# ---------------------------------------------------------------------------------------------------------------
# Reading a file: every array is bounded by what the format implies, from its .npy header, before it is read.
# np.load allocates whatever a header declares (a 6 MB file of two compressed 3 GiB zero arrays made the node
# allocate and lock 6 GB); this reader refuses such a file after reading its zip directory and a few headers.

#: the zip directory of a model file: at most this many entries and bytes (a policy of 64 dense layers has
#: 128 weight arrays and ~40 others); checked from the end-of-directory record before the directory is parsed
MAX_ENTRIES = 512
MAX_DIRECTORY_BYTES = 1 << 20
#: the most layers a model file may hold (W0..W63): far more than any policy the node runs
MAX_LAYERS = 64
#: the longest name (class, feature, action, activation) and the longest JSON text (source, weights_error, deploy)
MAX_NAME_CHARS = 4096
MAX_TEXT_CHARS = 4 << 20
#: the keys that decide every other array's shape; read first, each at most this many bytes
SHAPE_KEYS = ("format_version", "dtype", "layer_sizes", "recurrent", "head", "weights")
SMALL_BYTES = 64 << 10
_SCALARS = {"format_version": "iu", "dtype": "U", "recurrent": "U", "head": "U", "squash": "b", "source": "U",
            "train_accuracy": "fiu", "test_accuracy": "fiu", "trainer": "U", "sha256": "U", "weights": "U",
            "weights_error": "U", "deploy": "U"}
_LAYER_KEY = re.compile(r"([Wb])(0|[1-9][0-9]?)")
_NUMBERS = "fiub"       # what a numeric field may hold before its own check (booleans are refused by that check)


def fmt_bytes(n) -> str:
    """``n`` bytes for a message: exact below 1 MiB, else in MiB / GiB / TiB / PiB."""
    n = int(n)
    for unit, k in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n >= 1 << k:
            return f"{n / (1 << k):.4g} {unit}"
    return f"{n} bytes"


def _refuse(label, key, problem, fix="re-export the model with `control-node train` or `control-node import`"):
    raise ModelFileError(label, key, problem, fix)


def _zip_directory_size(f, size, label):
    """(entries, directory bytes) from the zip's end-of-directory record (zip64 too), without parsing the
    directory: Python's zipfile builds an object per entry, so a small file of many entries is refused first."""
    tail_len = min(size, 22 + 0xFFFF)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    i = tail.rfind(b"PK\x05\x06")
    if i < 0 or len(tail) < i + 22:
        _refuse(label, "(file)", "not a readable .npz archive (no zip end-of-directory record)")
    _, _, _, entries, dir_bytes, dir_at, _ = struct.unpack("<HHHHIIH", tail[i + 4:i + 22])
    if entries == 0xFFFF or dir_bytes == 0xFFFFFFFF or dir_at == 0xFFFFFFFF:
        at = size - tail_len + i - 20                  # the zip64 locator sits just before the record
        if at < 0:
            _refuse(label, "(file)", "not a readable .npz archive (zip64 locator missing)")
        f.seek(at)
        loc = f.read(20)
        if len(loc) < 20 or loc[:4] != b"PK\x06\x07":
            _refuse(label, "(file)", "not a readable .npz archive (zip64 locator missing)")
        (rec_at,) = struct.unpack("<Q", loc[8:16])
        if rec_at > size - 56:
            _refuse(label, "(file)", "not a readable .npz archive (zip64 record outside the file)")
        f.seek(rec_at)
        rec = f.read(56)
        if rec[:4] != b"PK\x06\x06":
            _refuse(label, "(file)", "not a readable .npz archive (zip64 record missing)")
        entries, dir_bytes = struct.unpack("<QQ", rec[32:48])
    return entries, dir_bytes


class _Entry:
    """One array of the archive: its zip entry and, once read, its .npy header."""

    def __init__(self, zf, info):
        self.zf, self.info = zf, info
        self.stream = None
        self.shape = self.dtype = self.fortran = None

    def header(self, label, key):
        from numpy.lib import format as npy
        try:
            self.stream = self.zf.open(self.info)
            version = npy.read_magic(self.stream)
            if version == (1, 0):
                self.shape, self.fortran, self.dtype = npy.read_array_header_1_0(self.stream)
            elif version == (2, 0):
                self.shape, self.fortran, self.dtype = npy.read_array_header_2_0(self.stream)
            else:
                _refuse(label, key, f"is a .npy file of version {version}, this build reads 1.0 and 2.0")
        except ModelFileError:
            raise
        except Exception as e:       # whatever the bytes: one line naming the field, never a traceback
            _refuse(label, key, f"has no readable .npy header ({type(e).__name__}: {str(e)[:160]})")
        if any(d < 0 for d in self.shape):
            _refuse(label, key, f"declares shape {self.shape}")
        if self.dtype.hasobject or self.dtype.kind not in "fiubU" or self.dtype.fields is not None \
                or self.dtype.subdtype is not None:
            _refuse(label, key, f"has dtype {self.dtype.str} ({_kind_name(self.dtype)}); a model file holds plain "
                    "numbers and text only")
        return self

    @property
    def nbytes(self):
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n

    def read(self, label, key):
        """The array, read in 1 MiB pieces into one allocation of the size its (checked) header declares; its
        zip entry must end exactly there, and its CRC is checked at that end."""
        try:
            arr = np.empty(self.shape, dtype=self.dtype, order="F" if self.fortran else "C")
            flat = (arr.T if self.fortran else arr).reshape(-1).view(np.uint8)
            at, n = 0, flat.size
            while at < n:
                piece = self.stream.read(min(n - at, 1 << 20))
                if not piece:
                    _refuse(label, key, f"is cut short: its header declares {self.shape} {self.dtype.str}, "
                            f"{n} bytes, the file holds {at}")
                flat[at:at + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
                at += len(piece)
            if self.stream.read(1):
                _refuse(label, key, f"holds more bytes than its header's shape {self.shape} {self.dtype.str}")
        except ModelFileError:
            raise
        except Exception as e:       # a CRC mismatch, a broken deflate stream, an unsupported compression
            _refuse(label, key, f"cannot be read ({type(e).__name__}: {str(e)[:160]})")
        finally:
            self.stream.close()
        if arr.dtype.byteorder not in "=|":
            arr = arr.astype(arr.dtype.newbyteorder("="))
        return arr


def _declared(zf, info, label, key, max_bytes):
    """What a stray entry's .npy header declares, for the refusal (its header only: never its data)."""
    if not info.filename.endswith(".npy"):
        return ""
    try:
        e = _Entry(zf, info).header(label, key)
        e.stream.close()
    except ModelFileError:
        return ""
    return (f": an array of shape {e.shape} {e.dtype.str} ({fmt_bytes(e.nbytes)}; the bound for a model file's "
            f"arrays is {fmt_bytes(max_bytes)}), refused before reading it")


def _fits(shape, want, free, key):
    """Whether an array's shape is the one the format implies (``free``: check_X's rows; a head's unused names)."""
    if key == "check_X":
        return len(shape) == 2 and shape[1] == want[1]
    return shape == want or (free and shape == (0,))


def _printable(name):
    """A name from the file, cut and with control characters replaced, for a one-line message."""
    return "".join(c if c.isprintable() else "?" for c in name[:80])


def _kind_name(dt):
    if dt.hasobject:
        return "Python objects: the file would run pickle on load"
    return {"V": "raw or structured records", "S": "bytes", "c": "complex numbers", "M": "dates",
            "m": "time deltas", "O": "Python objects"}.get(dt.kind, dt.kind)


def _shape_of_scalar(entry, label, key, kinds, max_items):
    if entry.dtype.kind not in kinds:
        _refuse(label, key, f"has dtype {entry.dtype.str}, expected {'text' if kinds == 'U' else 'a number'}")
    if entry.shape != ():
        _refuse(label, key, f"has shape {entry.shape}, the format holds one value there")
    if entry.dtype.kind == "U" and entry.dtype.itemsize > 4 * max_items:
        _refuse(label, key, f"is text of {entry.dtype.itemsize // 4} characters, more than the limit of {max_items}")


def _implied(small, label):
    """key -> (shape, free first dimension) of every array the file may hold, from its shape keys
    (checked here, with the messages load_model always gave)."""
    version = small.get("format_version")
    if version is None:
        _refuse(label, "format_version", "missing")
    version = int(version)
    if version not in READS_VERSIONS:
        _refuse(label, "format_version", f"is {version}, this build reads {READS_VERSIONS}",
                "re-export the model with this version's `control-node train` or `import`")
    sizes = small.get("layer_sizes")
    if sizes is None:
        _refuse(label, "layer_sizes", "missing")
    if sizes.dtype.kind not in "iu":
        _refuse(label, "layer_sizes", f"has dtype {sizes.dtype}, expected numbers", "re-export the model")
    if sizes.ndim != 1 or len(sizes) < 2 or (sizes < 1).any():
        _refuse(label, "layer_sizes", f"is {sizes.tolist()}", "it must list at least [n_features, n_classes], all >= 1")
    sizes = [int(s) for s in sizes]
    recurrent = version >= 3
    if recurrent:
        kind = small.get("recurrent")
        if kind is None or str(kind) not in RECURRENT:
            _refuse(label, "recurrent", f"is {kind!r}", f"a version-3 file holds one of {sorted(RECURRENT)}")
        if len(sizes) < 3:
            _refuse(label, "layer_sizes", f"is {sizes}", "a recurrent policy lists [n_features, H, ..., n_outputs]")
    dense = sizes[1:] if recurrent else sizes
    if len(dense) - 1 > MAX_LAYERS:
        _refuse(label, "layer_sizes", f"lists {len(dense) - 1} dense layers, more than the limit of {MAX_LAYERS}")
    n_in, n_out = sizes[0], sizes[-1]
    shapes = {key: ((), False) for key in _SCALARS}
    for i in range(len(dense) - 1):
        shapes[f"W{i}"] = ((dense[i], dense[i + 1]), False)
        shapes[f"b{i}"] = ((dense[i + 1],), False)
    if recurrent:
        G, H = len(RECURRENT[str(small["recurrent"])]), sizes[1]
        shapes.update(rnn_W_ih=((G * H, n_in), False), rnn_W_hh=((G * H, H), False), rnn_b_ih=((G * H,), False),
                      rnn_b_hh=((G * H,), False))
    for key in ("mean", "scale", "obs_scale", "obs_clip_low", "obs_clip_high", "norm_clip_low", "norm_clip_high",
                "feature_names"):
        shapes[key] = ((n_in,), False)
    for key in ("action_low", "action_high", "action_offset", "action_scale"):
        shapes[key] = ((n_out,), False)
    shapes["layer_sizes"] = ((len(sizes),), False)
    shapes["activations"] = shapes["alphas"] = ((len(dense) - 1,), False)
    # a head names its outputs in one list and leaves the other empty (v1: classes only)
    shapes["classes"] = shapes["action_names"] = ((n_out,), True)
    shapes["check_X"] = ((0, n_in), True)
    return shapes


def read_arrays(source, max_bytes=MAX_FILE_BYTES, label=None) -> dict:
    """The arrays of a model file (a path, or the bytes of one), each checked against the shape the format
    implies by its .npy header before it is read, and all of them together against ``max_bytes``.

    Raises :class:`ModelFileError` naming the field, its shape and the bound; never allocates more than
    ``max_bytes`` plus a few MiB, whatever the bytes (zip bombs, lying headers, object arrays, stray keys)."""
    label = label or str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        f = io.BytesIO(source)
    else:
        if not os.path.exists(source):
            _refuse(label, "(file)", "no such file", "train one with `control-node train --out PATH` or pass --model")
        try:
            f = open(source, "rb")
        except OSError as e:
            _refuse(label, "(file)", f"not a readable .npz archive ({e})")
    with f:
        try:
            size = os.fstat(f.fileno()).st_size if not isinstance(f, io.BytesIO) else len(f.getbuffer())
        except OSError as e:
            _refuse(label, "(file)", f"not a readable .npz archive ({e})")
        # deflate never makes an array larger, and the zip adds ~100 bytes per entry: a larger file is no model
        if size > max_bytes + MAX_DIRECTORY_BYTES + (1 << 20):
            _refuse(label, "(file)", f"is {fmt_bytes(size)}, more than the bound of {fmt_bytes(max_bytes)} for a "
                    "model file's arrays (max_resident_bytes)", "a policy must fit in the node's policy memory "
                    "([lifecycle] max_resident_mb); re-export the policy or raise the limit")
        try:
            entries, dir_bytes = _zip_directory_size(f, size, label)
            if entries > MAX_ENTRIES or dir_bytes > MAX_DIRECTORY_BYTES:
                _refuse(label, "(file)", f"its zip directory lists {entries} entries in {fmt_bytes(dir_bytes)}, more "
                        f"than the {MAX_ENTRIES} entries / {fmt_bytes(MAX_DIRECTORY_BYTES)} a model file may have")
            zf = zipfile.ZipFile(f)
        except ModelFileError:
            raise
        except Exception as e:
            _refuse(label, "(file)", f"not a readable .npz archive ({type(e).__name__}: {str(e)[:160]})")
        with zf:
            found = {}
            for info in zf.infolist():
                name = info.filename
                key = name[:-4] if name.endswith(".npy") else name
                if key not in _SCALARS and key not in _KNOWN and not _LAYER_KEY.fullmatch(key):
                    _refuse(label, _printable(key) or "(empty name)", "is not a field of the model format "
                            f"(kernels/model_file.py lists them){_declared(zf, info, label, key, max_bytes)}",
                            "re-export the model; a model file holds only its format's fields")
                if not name.endswith(".npy"):
                    _refuse(label, key, f"is stored as {name!r}, not as an .npy array")
                if key in found:
                    _refuse(label, key, "appears twice in the archive")
                found[key] = _Entry(zf, info)
            small = {}
            for key in SHAPE_KEYS:
                if key in found:
                    e = found[key].header(label, key)
                    if e.nbytes > SMALL_BYTES:
                        _refuse(label, key, f"has shape {e.shape} {e.dtype.str} ({fmt_bytes(e.nbytes)}), more than "
                                f"the {fmt_bytes(SMALL_BYTES)} this field may take")
                    small[key] = e.read(label, key)
            shapes = _implied(small, label)
            arrays = dict(small)
            total = sum(a.nbytes for a in small.values())
            for key, entry in found.items():
                if key in small:
                    continue
                if key not in shapes:        # W5 in a file of three layers
                    _refuse(label, key, "is not a field of a file with these layer_sizes "
                            f"({small['layer_sizes'].tolist()})", "re-export the model")
                entry.header(label, key)
                want, free = shapes[key]
                if key in _SCALARS:
                    _shape_of_scalar(entry, label, key, _SCALARS[key], MAX_TEXT_CHARS)
                elif not _fits(entry.shape, want, free, key):
                    _refuse(label, key, f"has shape {entry.shape}, layer_sizes implies "
                            f"{want if key != 'check_X' else ('n',) + want[1:]}", "re-export the model")
                if entry.dtype.kind == "U" and entry.dtype.itemsize > 4 * MAX_NAME_CHARS and key not in _SCALARS:
                    _refuse(label, key, f"holds names of up to {entry.dtype.itemsize // 4} characters, more than the "
                            f"limit of {MAX_NAME_CHARS}")
                total += entry.nbytes
                if total > max_bytes:
                    _refuse(label, key, f"has shape {entry.shape} {entry.dtype.str} ({fmt_bytes(entry.nbytes)}): with "
                            f"the fields before it, more than the bound of {fmt_bytes(max_bytes)} for a model file's "
                            "arrays (max_resident_bytes); refused before reading it", "a policy must fit in the node's "
                            "policy memory ([lifecycle] max_resident_mb); re-export the policy or raise the limit")
            for key, entry in found.items():
                if key not in small:
                    arrays[key] = entry.read(label, key)
            return arrays


#: the array fields of the format (scalars: _SCALARS; dense layers: W<i>, b<i>)
_KNOWN = frozenset(("layer_sizes", "mean", "scale", "classes", "feature_names", "activations", "alphas", "obs_scale",
                    "obs_clip_low", "obs_clip_high", "norm_clip_low", "norm_clip_high", "action_names", "action_low",
                    "action_high", "action_offset", "action_scale", "check_X") + RNN_KEYS)


def load_model(path, max_bytes=MAX_FILE_BYTES, label=None) -> ModelSpec:
    """Read and validate a model file (a path, or its bytes). Raises :class:`ModelFileError` naming the field.

    ``max_bytes``: the bound on its arrays together (:func:`read_arrays`), the node's configured
    ``[lifecycle] max_resident_mb``; nothing larger is allocated, whatever the file holds."""
    label = label or str(path)
    data = read_arrays(path, max_bytes, label)
    path = label
    version = int(data["format_version"])      # read_arrays checked it and the shape keys
    dtype = str(_require(data, path, "dtype"))
    if dtype not in DTYPES:
        raise ModelFileError(path, "dtype", f"is {dtype!r}", f"use one of {DTYPES}")
    sizes = data["layer_sizes"]
    rnn = {}
    dense = sizes
    if version >= 3:
        kind = _require(data, path, "recurrent")
        if kind.dtype.kind != "U" or kind.ndim != 0 or str(kind) not in RECURRENT:
            raise ModelFileError(path, "recurrent", f"is {kind!r}", f"a version-3 file holds one of {sorted(RECURRENT)}")
        if len(sizes) < 3:
            raise ModelFileError(path, "layer_sizes", f"is {sizes.tolist()}",
                                 "a recurrent policy lists [n_features, H, ..., n_outputs]")
        kind = str(kind)
        G, n_feat, H = len(RECURRENT[kind]), int(sizes[0]), int(sizes[1])
        for key, shape in (("rnn_W_ih", (G * H, n_feat)), ("rnn_W_hh", (G * H, H)), ("rnn_b_ih", (G * H,)),
                           ("rnn_b_hh", (G * H,))):
            arr = _numeric(data, path, key)
            if arr.shape != shape:
                raise ModelFileError(path, key, f"has shape {arr.shape}, layer_sizes and recurrent={kind!r} imply "
                                     f"{shape}", "re-export the model")
            rnn[key] = arr
        rnn["recurrent"] = kind
        dense = sizes[1:]
    layers = []
    for i in range(len(dense) - 1):
        W = _numeric(data, path, f"W{i}")
        b = _numeric(data, path, f"b{i}")
        if W.shape != (dense[i], dense[i + 1]):
            raise ModelFileError(path, f"W{i}", f"has shape {W.shape}, layer_sizes implies "
                                 f"({dense[i]}, {dense[i + 1]})", "re-export the model")
        if b.shape != (dense[i + 1],):
            raise ModelFileError(path, f"b{i}", f"has shape {b.shape}, layer_sizes implies "
                                 f"({dense[i + 1]},)", "re-export the model")
        layers.append((W, b))
    extra = dict(rnn)
    if version >= 2:
        L = len(layers)
        acts = _require(data, path, "activations")
        if acts.dtype.kind != "U" or acts.shape != (L,):
            raise ModelFileError(path, "activations", f"is {acts.dtype} {acts.shape}, expected {L} names",
                                 "re-export the model")
        n_in, n_out = int(sizes[0]), int(sizes[-1])
        extra.update(activations=acts.tolist(), alphas=_numeric(data, path, "alphas").tolist(),
                     head=str(_require(data, path, "head")),
                     action_names=_require(data, path, "action_names").tolist(),
                     squash=bool(_require(data, path, "squash")))
        for key, n in (("obs_scale", n_in), ("obs_clip_low", n_in), ("obs_clip_high", n_in),
                       ("norm_clip_low", n_in), ("norm_clip_high", n_in), ("action_low", n_out),
                       ("action_high", n_out), ("action_offset", n_out), ("action_scale", n_out)):
            arr = _numeric(data, path, key)
            if arr.shape != (n,):
                raise ModelFileError(path, key, f"has shape {arr.shape}, expected ({n},)", "re-export the model")
            extra[key] = arr
        try:
            extra["source"] = json.loads(str(data.get("source", "{}")))
        except ValueError as e:
            raise ModelFileError(path, "source", f"is not JSON ({e})", "re-export the model") from None
    if "weights" in data:
        from control_node.kernels.weights import STORAGE
        w = data["weights"]
        if w.dtype.kind != "U" or w.ndim != 0 or str(w) not in STORAGE:
            raise ModelFileError(path, "weights", f"is {w!r}", f"one of {', '.join(STORAGE)}")
        extra["weights"] = str(w)
        try:
            extra["weights_error"] = json.loads(str(data.get("weights_error", "{}"))) or None
        except ValueError as e:
            raise ModelFileError(path, "weights_error", f"is not JSON ({e})", "re-import the model") from None
    if "deploy" in data:
        try:
            extra["deploy"] = json.loads(str(data["deploy"]))
        except ValueError as e:
            raise ModelFileError(path, "deploy", f"is not JSON ({e})", "re-import the policy") from None
        if not isinstance(extra["deploy"], dict) or not extra["deploy"]:
            raise ModelFileError(path, "deploy", f"is {str(data['deploy'])[:60]!r}, not a JSON object",
                                 "re-import the policy")
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
        **extra,
    )
    validate_spec(spec, path)
    actual = content_hash(spec)
    if actual != spec.sha256:
        raise ModelFileError(path, "sha256", f"content hash {actual[:12]}... does not match the "
                             f"recorded {spec.sha256[:12]}... (file corrupted or edited)",
                             "re-export the model with `control-node train`")
    return spec


def _validate_recurrent(spec: ModelSpec, path) -> None:
    if spec.recurrent is None:
        given = [k for k in RNN_KEYS if getattr(spec, k) is not None]
        if given:
            raise ModelFileError(path, "recurrent", f"is None but {', '.join(given)} are given",
                                 f"set recurrent to one of {sorted(RECURRENT)}, or drop the rnn_* weights")
        return
    if spec.recurrent not in RECURRENT:
        raise ModelFileError(path, "recurrent", f"is {spec.recurrent!r}", f"use one of {sorted(RECURRENT)} or None")
    G = len(RECURRENT[spec.recurrent])
    for key in RNN_KEYS:
        if getattr(spec, key) is None:
            raise ModelFileError(path, key, f"missing for recurrent={spec.recurrent!r}",
                                 "give rnn_W_ih, rnn_W_hh, rnn_b_ih and rnn_b_hh (torch's layout)")
    W_ih, W_hh = spec.rnn_W_ih, spec.rnn_W_hh
    if W_hh.ndim != 2 or W_hh.shape[1] < 1 or W_hh.shape[0] != G * W_hh.shape[1]:
        raise ModelFileError(path, "rnn_W_hh", f"has shape {W_hh.shape}, expected ({G} * H, H) for "
                             f"recurrent={spec.recurrent!r} (gates {', '.join(RECURRENT[spec.recurrent])})",
                             "give torch's weight_hh_l0")
    H = W_hh.shape[1]
    if W_ih.ndim != 2 or W_ih.shape[0] != G * H or W_ih.shape[1] < 1:
        raise ModelFileError(path, "rnn_W_ih", f"has shape {W_ih.shape}, expected ({G * H}, n_features) for H={H}",
                             "give torch's weight_ih_l0")
    for key in ("rnn_b_ih", "rnn_b_hh"):
        if getattr(spec, key).shape != (G * H,):
            raise ModelFileError(path, key, f"has shape {getattr(spec, key).shape}, expected ({G * H},)",
                                 "give torch's bias_ih_l0 / bias_hh_l0 (zeros for bias=False)")
    for key in RNN_KEYS:
        if not np.isfinite(getattr(spec, key)).all():
            raise ModelFileError(path, key, "contains NaN or Inf", "retrain; check the training data")
    n_in = spec.layers[0][0].shape[0]
    if n_in != H:
        raise ModelFileError(path, "W0", f"takes {n_in} inputs but the recurrent layer gives H={H}",
                             "the first dense layer takes the recurrent layer's hidden state")


def validate_spec(spec: ModelSpec, path="(in memory)") -> None:
    """Shape, finiteness and range checks shared by save and load."""
    if not spec.layers:
        raise ModelFileError(path, "layer_sizes", "no dense layer", "give at least one dense layer")
    from control_node.kernels.weights import STORAGE
    if spec.weights not in STORAGE:
        raise ModelFileError(path, "weights", f"is {spec.weights!r}", f"one of {', '.join(STORAGE)}")
    _validate_recurrent(spec, path)
    n_features = spec.n_features
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
    n_out = spec.layers[-1][0].shape[1]
    L = len(spec.layers)
    if len(spec.activations) != L:
        raise ModelFileError(path, "activations", f"names {len(spec.activations)} activations for {L} layers",
                             "give one activation per dense layer")
    for i, a in enumerate(spec.activations):
        if a not in ACTIVATIONS:
            raise ModelFileError(path, "activations", f"layer {i}: {a!r} is not supported",
                                 f"use one of {sorted(ACTIVATIONS)}")
    if len(spec.alphas) != L or not np.isfinite(spec.alphas).all():
        raise ModelFileError(path, "alphas", f"is {spec.alphas}", f"give {L} finite values (0 where unused)")
    for i, a in enumerate(spec.activations):
        if a == "celu" and spec.alphas[i] == 0:
            raise ModelFileError(path, "alphas", f"layer {i}: celu with alpha 0", "use alpha > 0 (torch: 1.0)")
    for name in ("obs_scale", "obs_clip_low", "obs_clip_high", "norm_clip_low", "norm_clip_high"):
        arr = getattr(spec, name)
        if arr.shape != (n_features,):
            raise ModelFileError(path, name, f"has shape {arr.shape}, expected ({n_features},)", "re-export the model")
    if not np.isfinite(spec.obs_scale).all():
        raise ModelFileError(path, "obs_scale", "contains NaN or Inf", "use finite per-feature scales")
    for lo, hi in (("obs_clip_low", "obs_clip_high"), ("norm_clip_low", "norm_clip_high")):
        a, b = getattr(spec, lo), getattr(spec, hi)
        if np.isnan(a).any() or np.isnan(b).any() or (a > b).any():
            raise ModelFileError(path, lo, f"{lo} > {hi} or NaN for some feature",
                                 "use low <= high (-inf / inf for no clip)")
    if spec.head not in HEADS:
        raise ModelFileError(path, "head", f"is {spec.head!r}", f"use one of {HEADS}")
    if spec.head == "argmax":
        if len(spec.classes) != n_out:
            raise ModelFileError(path, "classes", f"names {len(spec.classes)} classes, the output layer has "
                                 f"{n_out}", "re-export the model")
    else:
        if len(spec.action_names) != n_out:
            raise ModelFileError(path, "action_names", f"names {len(spec.action_names)} actions, the output "
                                 f"layer has {n_out}", "give one name per output (joint names)")
        for name in ("action_low", "action_high", "action_offset", "action_scale"):
            arr = getattr(spec, name)
            if arr.shape != (n_out,):
                raise ModelFileError(path, name, f"has shape {arr.shape}, expected ({n_out},)", "re-export the model")
        for name in ("action_offset", "action_scale"):
            if not np.isfinite(getattr(spec, name)).all():
                raise ModelFileError(path, name, "contains NaN or Inf", "use finite values")
        if np.isnan(spec.action_low).any() or np.isnan(spec.action_high).any() or \
                (spec.action_low > spec.action_high).any():
            raise ModelFileError(path, "action_low", "action_low > action_high or NaN for some action",
                                 "use low <= high (-inf / inf for no clip)")
    if len(spec.feature_names) != n_features:
        raise ModelFileError(path, "feature_names", f"names {len(spec.feature_names)} features, the "
                             f"input layer takes {n_features}", "re-export the model")
    if spec.check_X is not None and (spec.check_X.ndim != 2 or spec.check_X.shape[1] != n_features):
        raise ModelFileError(path, "check_X", f"has shape {spec.check_X.shape}, expected (n, {n_features})",
                             "re-export the model")
    if spec.deploy is not None:
        _validate_deploy(spec, path)


def _validate_deploy(spec: ModelSpec, path) -> None:
    """The contract's shape: its keys, one joint name per action, per-joint lists of finite numbers. What the
    recipe's terms mean is checked where the node builds its plans (control_node/deploy.py), naming the key."""
    d = spec.deploy

    def bad(key, problem, fix="re-import the policy with `control-node import`"):
        raise ModelFileError(path, f"deploy.{key}" if key else "deploy", problem, fix)
    if not isinstance(d, dict):
        bad("", f"is a {type(d).__name__}, not a JSON object")
    try:
        json.dumps(d, allow_nan=False)
    except (TypeError, ValueError) as e:
        bad("", f"is not plain JSON ({e})")
    for k in d:
        if k not in DEPLOY_KEYS:
            bad(k, "is not a key of the deploy contract", f"use only {', '.join(DEPLOY_KEYS)}")
    if d.get("version") != DEPLOY_VERSION:
        bad("version", f"is {d.get('version')!r}, this build reads version {DEPLOY_VERSION}")
    if spec.head != "continuous":
        bad("", "is given for an argmax policy", "a deploy contract belongs to a continuous (joint) policy")
    for k in ("from", "info"):
        if not isinstance(d.get(k, {}), dict):
            bad(k, "is not a JSON object")
    r = d.get("recipe")
    if not isinstance(r, dict):
        bad("recipe", "missing or not a JSON object")
    n = spec.layers[-1][0].shape[1]
    for k, v in r.items():
        if k not in DEPLOY_RECIPE_KEYS:
            bad(f"recipe.{k}", "is not a key a contract holds (the robot's side lives in the node's [legged])",
                f"use only {', '.join(DEPLOY_RECIPE_KEYS)}")
        sub = DEPLOY_RECIPE_KEYS[k]
        if sub is not None:
            if not isinstance(v, dict):
                bad(f"recipe.{k}", "is not a JSON object")
            for kk in v:
                if kk not in sub:
                    bad(f"recipe.{k}.{kk}", "is not a key a contract holds", f"use only {', '.join(sub)}")
    names = (r.get("joints") or {}).get("policy")
    if not (isinstance(names, list) and len(names) == n and all(isinstance(x, str) and x for x in names)
            and len(set(names)) == n):
        bad("recipe.joints.policy", f"is not {n} distinct joint names (one per action)")

    def per_joint(key, v, lo=None):
        if not (isinstance(v, list) and len(v) == n and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                            for x in v)):
            bad(key, f"is not a list of {n} numbers (one per joint, in joints.policy's order)")
        if lo is not None and min(v) < lo:
            bad(key, f"holds a value below {lo}")
    if "default_pos" in r:
        per_joint("recipe.default_pos", r["default_pos"])
    for k in ("kp", "kd"):
        if k in r.get("actuator", {}):
            per_joint(f"recipe.actuator.{k}", r["actuator"][k], lo=0)
    if "scale" in r.get("action", {}):
        per_joint("recipe.action.scale", r["action"]["scale"])
    if "policy_dt" in r and not (isinstance(r["policy_dt"], (int, float)) and r["policy_dt"] > 0):
        bad("recipe.policy_dt", f"is {r['policy_dt']!r}, not a positive number of seconds")
    terms = r.get("observation", {}).get("terms")
    if terms is not None and not (isinstance(terms, list) and terms and all(isinstance(t, dict) for t in terms)):
        bad("recipe.observation.terms", "is not a non-empty list of terms")
