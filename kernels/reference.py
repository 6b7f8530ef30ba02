"""Plain numpy reference of the policy, and the proof that the kernel matches it.

The reference is the specification (kernels/model_file.py's docstring says what each step computes):
the compiled kernel must give the same argmax on every check sample, the last layer's outputs within
a dtype-appropriate tolerance, and continuous actions within that tolerance after the head.
"""
from __future__ import annotations

import numpy as np

#: relative logit tolerance per compute dtype (scaled by max(1, max |logit|) per sample)
RTOL = {"float64": 1e-9, "float32": 2e-4}


class ConsistencyError(RuntimeError):
    """The compiled kernel disagrees with the numpy reference."""


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _sigmoid(h):
    e = np.exp(-np.abs(h))                      # never overflows
    return np.where(h >= 0, 1 / (1 + e), e / (1 + e))


def activate(name, h, alpha=0.0):
    """The activation ``name`` applied to ``h`` in h's dtype (the ONNX / torch definitions)."""
    t = h.dtype.type
    if name == "identity":
        return h
    if name == "relu":
        return np.maximum(h, t(0))
    if name == "elu":
        return np.where(h > 0, h, t(alpha) * np.expm1(np.minimum(h, t(0))))
    if name == "selu":
        return t(SELU_SCALE) * np.where(h > 0, h, t(SELU_ALPHA) * np.expm1(np.minimum(h, t(0))))
    if name == "leaky_relu":
        return np.where(h >= 0, h, t(alpha) * h)
    if name == "celu":
        return np.maximum(h, t(0)) + np.minimum(t(0), t(alpha) * np.expm1(np.minimum(h, t(0)) / t(alpha)))
    if name == "tanh":
        return np.tanh(h)
    if name == "sigmoid":
        return _sigmoid(h).astype(h.dtype)
    if name == "softplus":
        return np.logaddexp(t(0), h)
    if name == "silu":
        return (h * _sigmoid(h)).astype(h.dtype)
    raise ValueError(f"activation {name!r} is not supported")


def preprocess(spec, X) -> np.ndarray:
    """Steps 1-4 of the model (scale, clip, normalise, clip) in float64, then cast to ``spec.dtype``."""
    x = np.asarray(X, dtype=np.float64) * spec.obs_scale
    x = np.clip(x, spec.obs_clip_low, spec.obs_clip_high)
    z = (x - spec.mean) / spec.scale
    z = np.clip(z, spec.norm_clip_low, spec.norm_clip_high)
    return z.astype(np.dtype(spec.dtype))


def reference_logits(spec, X) -> np.ndarray:
    """The last layer's outputs (n, n_outputs) in ``spec.dtype`` for raw inputs ``X`` (n, n_features)
    float64: the logits of an argmax policy, the pre-head outputs of a continuous one.

    Pre-processing is computed in float64 and then cast, exactly as the kernel does.
    """
    h = preprocess(spec, X)
    with np.errstate(over="ignore", invalid="ignore"):
        for (W, b), name, alpha in zip(spec.layers, spec.activations, spec.alphas):
            h = activate(name, h @ W + b, alpha)
    return h


def apply_head(spec, out) -> np.ndarray:
    """float64 actions (n, n_actions) from the last layer's outputs: argmax -> the class index
    (as float, -1 where an output is not finite); continuous -> squash, clip, affine."""
    out = np.asarray(out)
    finite = np.isfinite(out).all(axis=1)
    if spec.head == "argmax":
        return np.where(finite, np.argmax(out, axis=1), -1).astype(np.float64)[:, None]
    a = out.astype(np.float64)
    if spec.squash:
        a = np.tanh(a)
    a = np.clip(a, spec.action_low, spec.action_high)
    return spec.action_offset + spec.action_scale * a


def reference_act(spec, X) -> np.ndarray:
    """float64 actions (n, n_actions) after the head: what ``Policy.act`` must give."""
    return apply_head(spec, reference_logits(spec, X))


def reference_predict(spec, X) -> np.ndarray:
    """Argmax of :func:`reference_logits`, int64 (n,)."""
    return np.argmax(reference_logits(spec, X), axis=1)


def random_inputs(spec, n, seed=0) -> np.ndarray:
    """Raw inputs around the training distribution and well beyond it (3 sigma spread after the
    per-feature obs_scale is undone)."""
    rng = np.random.default_rng(seed)
    z = spec.mean + spec.scale * rng.normal(0.0, 3.0, size=(n, len(spec.mean)))
    return z / np.where(spec.obs_scale != 0, spec.obs_scale, 1.0)


def check_consistency(policy, spec, X=None, n_random=2000, seed=0) -> dict:
    """Compare the kernel with the reference on the check samples and on random inputs.

    An argmax difference counts only where the reference's own margin between the
    two classes exceeds the logit tolerance (a true near-tie may round either way).
    Returns counts; raises :class:`ConsistencyError` naming the first bad sample.
    """
    parts = []
    if X is not None:
        parts.append(("given", np.asarray(X, dtype=np.float64)))
    elif spec.check_X is not None:
        parts.append(("check_X", spec.check_X))
    parts.append(("random", random_inputs(spec, n_random, seed)))
    rtol = RTOL[spec.dtype]
    checked = 0
    continuous = spec.head == "continuous"
    for name, Xs in parts:
        ref = reference_logits(spec, Xs).astype(np.float64)
        ref_arg = np.argmax(ref, axis=1)
        got_arg = None if continuous else policy.predict_batch(Xs)
        ref_u = reference_act(spec, Xs) if continuous else None
        tol = rtol * np.maximum(1.0, np.abs(ref).max(axis=1))
        for i in range(len(Xs)):
            x = np.ascontiguousarray(Xs[i])
            got = policy.logits(x).astype(np.float64)
            err = np.abs(got - ref[i]).max()
            if not err <= tol[i]:
                raise ConsistencyError(
                    f"kernel and numpy reference differ on {name} sample {i} (x={Xs[i].tolist()}): "
                    f"max |output difference| {err:.3g} > tolerance {tol[i]:.3g}")
            if continuous:
                u = policy.act(x)
                # tanh and clip do not amplify an output error; the affine step scales it by |action_scale|
                tol_u = tol[i] * np.abs(spec.action_scale) + 4 * np.finfo(np.float64).eps * np.abs(ref_u[i])
                bad = np.flatnonzero(~(np.abs(u - ref_u[i]) <= tol_u))
                if bad.size:
                    j = int(bad[0])
                    raise ConsistencyError(
                        f"kernel and numpy reference differ on {name} sample {i} (x={Xs[i].tolist()}): "
                        f"action {j} ({spec.action_names[j]}) {u[j]!r} vs reference {ref_u[i, j]!r} "
                        f"(tolerance {tol_u[j]:.3g})")
            elif got_arg[i] != ref_arg[i]:
                margin = ref[i, ref_arg[i]] - ref[i, got_arg[i]] if got_arg[i] >= 0 else np.inf
                if margin > tol[i]:
                    raise ConsistencyError(
                        f"kernel and numpy reference differ on {name} sample {i} (x={Xs[i].tolist()}): "
                        f"argmax {got_arg[i]} vs reference {ref_arg[i]} (margin {margin:.3g})")
        checked += len(Xs)
    return {"checked": checked, "rtol": rtol}
