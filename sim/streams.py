"""Frame streams for the simulator: ``gauss``, ``iris`` and ``replay``.

Each builder returns a :class:`Stream`: all samples generated up front (the send loop only indexes
preallocated arrays), reproducible from the seed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Stream:
    X: np.ndarray                 # (n, n_features) float64, raw features
    truth: np.ndarray             # (n,) int16, ground-truth class (-1 unknown)
    offsets_ns: np.ndarray        # (n,) int64, send time relative to the first frame
    drop: np.ndarray              # (n,) bool, frame deliberately not sent (simulated loss)
    settings: dict = field(default_factory=dict)
    payloads: list | None = None  # replay: the recorded raw frames (msgpack bytes), if any
    recorded_seq: np.ndarray | None = None  # replay: the recorded seq of each frame
    # continuous policies: the action expected for each frame (n, n_actions) float64, NaN where none
    # (sent along as the frame's "u_expected", which the node ignores, so recordings stay self-scoring)
    expected_u: np.ndarray | None = None

    def __len__(self):
        return len(self.X)


@dataclass(frozen=True)
class IrisData:
    X: np.ndarray                 # (150, 4) float64
    y: np.ndarray                 # (150,) int16, index into class_names
    feature_names: list
    class_names: list


def iris_data() -> IrisData:
    """Fisher's iris data from the package's ``iris.csv`` (the copy scikit-learn ships, byte for byte the same
    values): the streams need it in every simulator start, where importing scikit-learn cost 1.6 CPU-s."""
    import csv
    from importlib.resources import files
    rows = [r for r in csv.reader(files("control_node.sim").joinpath("iris.csv").read_text().splitlines())
            if r and not r[0].startswith("#")]
    header, body = rows[0], rows[1:]
    classes = list(dict.fromkeys(r[-1] for r in body))
    return IrisData(X=np.array([[float(v) for v in r[:-1]] for r in body], dtype=np.float64),
                    y=np.array([classes.index(r[-1]) for r in body], dtype=np.int16),
                    feature_names=header[:-1], class_names=classes)


def _iris():
    d = iris_data()
    return d.X, d.y


def fixed_rate_offsets(n, rate_hz):
    period = int(round(1e9 / rate_hz))
    return np.arange(n, dtype=np.int64) * period


def iris_stream(n=None, rate_hz=1000.0, shuffle=False, seed=0):
    """The real iris samples, in order (or shuffled per pass); one pass unless ``n`` is given."""
    X, y = _iris()
    n = len(X) if n is None else int(n)
    rng = np.random.default_rng(seed)
    idx = []
    while len(idx) < n:
        order = rng.permutation(len(X)) if shuffle else np.arange(len(X))
        idx.extend(order.tolist())
    idx = np.asarray(idx[:n], dtype=np.int64)
    return Stream(X=X[idx].copy(), truth=y[idx].copy(), offsets_ns=fixed_rate_offsets(n, rate_hz),
                  drop=np.zeros(n, dtype=bool),
                  settings={"kind": "iris", "frames": n, "rate_hz": rate_hz, "shuffle": shuffle, "seed": seed})


def gauss_stream(n, rate_hz=1000.0, seed=0, dwell_min=0.2, dwell_max=1.0, noise=0.0, drift=0.0,
                 outlier_prob=0.0, outlier_scale=10.0, drop_prob=0.0, n_features=None):
    """Per-class Gaussians fitted to iris; the class switches regime after a random dwell time.

    n_features: None or 4, the iris features; any other width (a continuous policy's observation):
    three regimes with means drawn from N(0, 1) per feature (from the seed) and std 0.3 each, same
    switching; ``truth`` is then the regime.

    dwell_min/max: seconds a class lasts (uniform); noise: extra Gaussian noise, in feature std units;
    drift: slow linear drift, in feature std units per second (added to every feature);
    outlier_prob: chance per frame that one feature is pushed ``outlier_scale`` stds away;
    drop_prob: chance per frame that it is not sent (its seq is skipped, like a lost frame).
    """
    if dwell_min <= 0 or dwell_max < dwell_min:
        raise ValueError("need 0 < dwell_min <= dwell_max")
    iris = n_features is None or int(n_features) == 4
    if not iris and int(n_features) < 1:
        raise ValueError(f"n_features must be >= 1; got {n_features}")
    X0, y0 = _iris()
    classes = np.unique(y0)
    if iris:
        means = np.stack([X0[y0 == c].mean(axis=0) for c in classes])
        covs = np.stack([np.cov(X0[y0 == c], rowvar=False) for c in classes])
        std = X0.std(axis=0)
    else:
        d = int(n_features)
        means = np.random.default_rng([seed, d]).normal(0.0, 1.0, size=(len(classes), d))
        covs = np.stack([np.eye(d) * 0.3 ** 2] * len(classes))
        std = np.ones(d)
    rng = np.random.default_rng(seed)
    n = int(n)
    truth = np.empty(n, dtype=np.int16)
    i = 0
    c = int(rng.integers(len(classes)))
    while i < n:
        dwell = max(1, int(round(rng.uniform(dwell_min, dwell_max) * rate_hz)))
        truth[i:i + dwell] = c
        i += dwell
        c = int(rng.choice([k for k in range(len(classes)) if k != c]))
    X = np.empty((n, means.shape[1]), dtype=np.float64)
    for k in range(len(classes)):
        m = truth == k
        X[m] = rng.multivariate_normal(means[k], covs[k], size=int(m.sum()))
    if noise > 0:
        X += rng.normal(0.0, 1.0, X.shape) * (noise * std)
    if drift != 0:
        t_s = np.arange(n) / rate_hz
        X += (drift * t_s)[:, None] * std[None, :]
    if outlier_prob > 0:
        out = rng.random(n) < outlier_prob
        feat = rng.integers(X.shape[1], size=n)
        sign = rng.choice([-1.0, 1.0], size=n)
        rows = np.flatnonzero(out)
        X[rows, feat[rows]] += sign[rows] * outlier_scale * std[feat[rows]]
    drop = rng.random(n) < drop_prob if drop_prob > 0 else np.zeros(n, dtype=bool)
    return Stream(X=X, truth=truth, offsets_ns=fixed_rate_offsets(n, rate_hz), drop=drop,
                  settings={"kind": "gauss", "frames": n, "rate_hz": rate_hz, "seed": seed,
                            "dwell_min": dwell_min, "dwell_max": dwell_max, "noise": noise, "drift": drift,
                            "outlier_prob": outlier_prob, "outlier_scale": outlier_scale,
                            "drop_prob": drop_prob, "n_features": int(means.shape[1])})


def replay_stream(path, rate=1.0, start=0.0, duration=None):
    """The /sensor channel of an MCAP recording, on its original schedule scaled by ``1/rate``."""
    import msgpack

    from control_node.recording import SENSOR
    from control_node.recording.reader import read_recording
    from control_node.errors import UserError
    if rate <= 0:
        raise UserError("--rate must be > 0")
    rec = read_recording(path, topics=[SENSOR])
    frames = rec[SENSOR]
    if not frames:
        raise UserError(f"{path}: no /sensor messages (was the recorder subscribed to the sensor tap?)")
    seqs, t_ns, xs, truth, payloads, expected = [], [], [], [], [], []
    for raw, _log_time in frames:
        d = msgpack.unpackb(raw, raw=False)
        x = d["x"]
        if isinstance(x, (bytes, bytearray)):
            x = np.frombuffer(x, dtype="<f8").tolist()
        seqs.append(int(d["seq"]))
        t_ns.append(int(d["t_ns"]))
        xs.append([float(v) for v in x])
        truth.append(int(d.get("truth", -1)))
        expected.append(d.get("u_expected"))
        payloads.append(raw)
    t = np.asarray(t_ns, dtype=np.int64)
    rel = t - t[0]
    keep = rel >= int(start * 1e9)
    if duration is not None:
        keep &= rel < int((start + duration) * 1e9)
    idx = np.flatnonzero(keep)
    if len(idx) == 0:
        raise UserError(f"{path}: no /sensor frames within --start {start} --duration {duration}")
    rel = rel[idx] - rel[idx[0]]
    offsets = (rel.astype(np.float64) / rate).astype(np.int64)
    expected_u = None
    widths = {len(e) for e in expected if isinstance(e, list)}
    if len(widths) == 1:       # frames of a continuous sim carry the expected action: keep them
        w = widths.pop()
        expected_u = np.full((len(expected), w), np.nan)
        for i, e in enumerate(expected):
            if isinstance(e, list) and len(e) == w:
                expected_u[i] = e
        expected_u = expected_u[idx]
    return Stream(expected_u=expected_u, X=np.asarray(xs, dtype=np.float64)[idx], truth=np.asarray(truth, dtype=np.int16)[idx],
                  offsets_ns=offsets, drop=np.zeros(len(idx), dtype=bool),
                  payloads=[payloads[i] for i in idx], recorded_seq=np.asarray(seqs, dtype=np.int64)[idx],
                  settings={"kind": "replay", "file": str(path), "frames": int(len(idx)), "rate": rate,
                            "start": start, "duration": duration})
