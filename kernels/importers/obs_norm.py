"""Observation normalisation kept outside the graph (SB3 ``VecNormalize``).

Two file kinds:

* ``.npz`` with ``mean`` (n,), ``var`` (n,), optional ``epsilon`` (default 1e-8) and ``clip_obs``
  (default 10), loaded with ``allow_pickle=False``;
* a ``VecNormalize.save()`` ``.pkl``, read WITHOUT stable_baselines3 installed and without running
  pickled code: a restricted ``pickle.Unpickler`` maps SB3's VecNormalize / RunningMeanStd and
  gymnasium's Box to plain stand-in classes, allows numpy's own array reconstruction, and refuses every
  other class by name.

The model then computes VecNormalize's ``clip((x - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)``:
``mean``, ``scale = sqrt(var + epsilon)`` and ``norm_clip = +-clip_obs``.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import numpy as np

from control_node.kernels.importers.common import ImportRefused, sha256_files


@dataclass
class ObsNorm:
    """VecNormalize statistics: float64 (n,) arrays and the two scalars."""

    mean: np.ndarray
    var: np.ndarray
    epsilon: float
    clip_obs: float
    source: dict

    @property
    def scale(self) -> np.ndarray:
        return np.sqrt(self.var + self.epsilon)

    def apply(self, X) -> np.ndarray:
        """float64 (n, n_features): what VecNormalize feeds the policy for raw observations ``X``."""
        z = (np.asarray(X, dtype=np.float64) - self.mean) / self.scale
        return np.clip(z, -self.clip_obs, self.clip_obs)


class _Stub:
    """Stand-in for a pickled class: keeps the pickled state as attributes, runs nothing."""

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:        # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)


class VecNormalizeStub(_Stub):
    pass


class RunningMeanStdStub(_Stub):
    pass


class SpaceStub(_Stub):
    pass


STUBS = {
    ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize"): VecNormalizeStub,
    ("stable_baselines3.common.running_mean_std", "RunningMeanStd"): RunningMeanStdStub,
    ("gymnasium.spaces.box", "Box"): SpaceStub,
    ("gym.spaces.box", "Box"): SpaceStub,
}
NUMPY_ALLOWED = {
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, f, file):
        super().__init__(f)
        self.file = file

    def find_class(self, module, name):
        if (module, name) in STUBS:
            return STUBS[(module, name)]
        if (module, name) in NUMPY_ALLOWED:
            import importlib
            return getattr(importlib.import_module(module), name)
        raise ImportRefused(self.file, f"pickled class {module}.{name}", "is not allowed: a VecNormalize .pkl may "
                            "reference only VecNormalize, RunningMeanStd, gymnasium Box and numpy arrays (nothing "
                            "pickled is executed)", "save the statistics as .npz: np.savez('obs_norm.npz', "
                            "mean=venv.obs_rms.mean, var=venv.obs_rms.var, epsilon=venv.epsilon, "
                            "clip_obs=venv.clip_obs)")


def _vector(file, key, v):
    a = np.asarray(v)
    if a.dtype.kind not in "fiu" or a.ndim != 1 or not np.isfinite(a).all():
        raise ImportRefused(file, f"field '{key}'", f"is {a.dtype} {list(a.shape)} (or has NaN/Inf); expected a finite "
                            "1-D float array", "save VecNormalize's obs_rms.mean / obs_rms.var")
    return a.astype(np.float64)


def _scalar(file, key, v, default):
    if v is None:
        return default
    try:
        f = float(np.asarray(v).reshape(()))
    except (TypeError, ValueError):
        raise ImportRefused(file, f"field '{key}'", f"is {v!r}, expected a number", "fix the file") from None
    if not np.isfinite(f) or f < 0:
        raise ImportRefused(file, f"field '{key}'", f"is {f}, expected a finite number >= 0", "fix the file")
    return f


def load_obs_norm(path) -> ObsNorm:
    """Read VecNormalize statistics from ``.npz`` or ``.pkl``. Raises :class:`ImportRefused`."""
    path = os.fspath(path)
    file = os.path.basename(path)
    if not os.path.isfile(path):
        raise ImportRefused(file, "(file)", "no such obs-norm file", "pass the VecNormalize .pkl or a .npz")
    src = {"file": file, "sha256": sha256_files([path])}
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as z:
                d = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise ImportRefused(file, "(file)", f"not a readable .npz ({e})", "np.savez(path, mean=..., var=...)") \
                from None
        for key in ("mean", "var"):
            if key not in d:
                raise ImportRefused(file, f"field '{key}'", "is missing", "np.savez(path, mean=..., var=..., "
                                    "epsilon=1e-8, clip_obs=10.0)")
        mean, var = _vector(file, "mean", d["mean"]), _vector(file, "var", d["var"])
        eps, clip = _scalar(file, "epsilon", d.get("epsilon"), 1e-8), _scalar(file, "clip_obs", d.get("clip_obs"), 10.0)
        src["kind"] = "npz"
    elif path.endswith((".pkl", ".pickle")):
        try:
            with open(path, "rb") as f:
                obj = _RestrictedUnpickler(f, file).load()
        except ImportRefused:
            raise
        except Exception as e:
            raise ImportRefused(file, "(file)", f"not a readable VecNormalize pickle ({type(e).__name__}: {e})",
                                "pass the file VecNormalize.save() wrote, or a .npz") from None
        if not isinstance(obj, VecNormalizeStub):
            raise ImportRefused(file, "(file)", f"holds a {type(obj).__name__}, not a VecNormalize",
                                "pass the file VecNormalize.save() wrote")
        if not getattr(obj, "norm_obs", True):
            raise ImportRefused(file, "field 'norm_obs'", "is False: this VecNormalize does not normalise "
                                "observations", "drop --obs-norm")
        rms = getattr(obj, "obs_rms", None)
        if not isinstance(rms, RunningMeanStdStub):
            raise ImportRefused(file, "field 'obs_rms'", f"is {type(rms).__name__} (dict observation spaces are not "
                                "supported)", "use a Box observation space")
        mean, var = _vector(file, "obs_rms.mean", rms.mean), _vector(file, "obs_rms.var", rms.var)
        eps = _scalar(file, "epsilon", getattr(obj, "epsilon", None), 1e-8)
        clip = _scalar(file, "clip_obs", getattr(obj, "clip_obs", None), 10.0)
        src["kind"] = "VecNormalize pickle"
    else:
        raise ImportRefused(file, "(file)", "unknown obs-norm file type (expected .npz or .pkl)",
                            "pass the VecNormalize .pkl or a .npz with mean and var")
    if mean.shape != var.shape:
        raise ImportRefused(file, "field 'var'", f"has {var.size} values, mean has {mean.size}", "fix the file")
    if (var < 0).any():
        raise ImportRefused(file, "field 'var'", "is negative for some feature", "fix the file")
    if ((var + eps) == 0).any():
        raise ImportRefused(file, "field 'var'", "var + epsilon is 0 for some feature", "use epsilon > 0")
    src.update(epsilon=eps, clip_obs=clip)
    return ObsNorm(mean=mean, var=var, epsilon=eps, clip_obs=clip, source=src)
