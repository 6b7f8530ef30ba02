"""Plain numpy reference of the policy, and the proof that the kernel matches it.

The reference is the specification: the compiled kernel must give the same
argmax on every check sample, and logits within a dtype-appropriate tolerance.
"""
from __future__ import annotations

import numpy as np

#: relative logit tolerance per compute dtype (scaled by max(1, max |logit|) per sample)
RTOL = {"float64": 1e-9, "float32": 2e-4}


class ConsistencyError(RuntimeError):
    """The compiled kernel disagrees with the numpy reference."""


def reference_logits(spec, X) -> np.ndarray:
    """Logits (n, n_classes) in ``spec.dtype`` for raw inputs ``X`` (n, n_features) float64.

    Normalisation is computed in float64 and then cast, exactly as the kernel does.
    """
    dt = np.dtype(spec.dtype)
    h = ((np.asarray(X, dtype=np.float64) - spec.mean) / spec.scale).astype(dt)
    for i, (W, b) in enumerate(spec.layers):
        h = h @ W + b
        if i + 1 < len(spec.layers):
            h = np.maximum(h, dt.type(0))
    return h


def reference_predict(spec, X) -> np.ndarray:
    """Argmax of :func:`reference_logits`, int64 (n,)."""
    return np.argmax(reference_logits(spec, X), axis=1)


def random_inputs(spec, n, seed=0) -> np.ndarray:
    """Inputs around the training distribution and well beyond it (3 sigma spread)."""
    rng = np.random.default_rng(seed)
    return spec.mean + spec.scale * rng.normal(0.0, 3.0, size=(n, len(spec.mean)))


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
    for name, Xs in parts:
        ref = reference_logits(spec, Xs).astype(np.float64)
        ref_arg = np.argmax(ref, axis=1)
        got_arg = policy.predict_batch(Xs)
        tol = rtol * np.maximum(1.0, np.abs(ref).max(axis=1))
        for i in range(len(Xs)):
            got = policy.logits(np.ascontiguousarray(Xs[i])).astype(np.float64)
            err = np.abs(got - ref[i]).max()
            if not err <= tol[i]:
                raise ConsistencyError(
                    f"kernel and numpy reference differ on {name} sample {i} (x={Xs[i].tolist()}): "
                    f"max |logit difference| {err:.3g} > tolerance {tol[i]:.3g}")
            if got_arg[i] != ref_arg[i]:
                margin = ref[i, ref_arg[i]] - ref[i, got_arg[i]] if got_arg[i] >= 0 else np.inf
                if margin > tol[i]:
                    raise ConsistencyError(
                        f"kernel and numpy reference differ on {name} sample {i} (x={Xs[i].tolist()}): "
                        f"argmax {got_arg[i]} vs reference {ref_arg[i]} (margin {margin:.3g})")
        checked += len(Xs)
    return {"checked": checked, "rtol": rtol}
