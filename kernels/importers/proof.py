"""The proof of an import: the imported spec against the exporter's own runtime on the same observations.

For raw observations X (n, n_features) float64 (the caller's ``check_X`` rows, then ``n_random`` random
rows from :func:`kernels.reference.random_inputs`), one observation at a time as the node runs them:

* the runtime: onnxruntime (``intra_op_num_threads=1``) for .onnx, torch (``inference_mode``, one thread)
  for TorchScript; or, when onnxruntime is not installed, the importer's numpy forward pass over the ONNX
  graph (``onnx_eval.py``). Observation normalisation that lives outside the graph (SB3 VecNormalize) is
  applied here before the runtime, in float64, then cast to the graph's dtype.
* ``want = action_offset + action_scale * runtime_output`` (the metadata's offset / scale live outside the
  graph too; both are 0 / 1 unless mapped).
* ``got = reference_act(spec, X)``.

Tolerance per sample i and action j: ``rtol * max(1, max_j |runtime_output_i|) * max(1, |action_scale_j|)``
with rtol 2e-4 when the runtime or the spec computes in float32, 1e-9 when both are float64
(kernels.reference.RTOL). The compiled kernel (``Policy(spec).act``, when the caller passes the class) is
checked on the same rows with kernels.reference.check_consistency, when it supports the spec.
"""
from __future__ import annotations

import numpy as np

from control_node.kernels.importers.common import ImportRefused
from control_node.kernels.reference import RTOL, reference_act

CHECK_ROWS = 256        # rows of the proof kept as the model file's check_X


def onnx_runtime(graph, dtype):
    """(name, f) where f(x float64 (n_features,)) -> float64 (n_actions,) runs the .onnx file."""
    try:
        import onnxruntime as ort
    except ImportError:
        from control_node.kernels.importers import onnx_eval
        nodes, env0 = graph.nodes, {k: v for k, v in graph.env.items() if k not in graph.data}

        def run_numpy(x):
            env = dict(env0)
            env[graph.input_name] = np.asarray(x, dtype=dtype).reshape(1, -1)
            out = onnx_eval.run(nodes, env, graph.opset)[graph.action_output]
            return np.asarray(out, dtype=np.float64).reshape(-1)
        return "importer's numpy forward pass (onnxruntime is not installed)", run_numpy
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(graph.path, sess_options=so, providers=["CPUExecutionProvider"])

    def run_ort(x):
        feed = {graph.input_name: np.asarray(x, dtype=dtype).reshape(1, -1)}
        return np.asarray(sess.run([graph.action_output], feed)[0], dtype=np.float64).reshape(-1)
    return f"onnxruntime {ort.__version__}", run_ort


def torch_runtime(module, dtype):
    import torch
    tdtype = {"float32": torch.float32, "float64": torch.float64}[dtype]

    def run_torch(x):
        with torch.inference_mode():
            out = module(torch.from_numpy(np.asarray(x, dtype=np.float64).reshape(1, -1)).to(tdtype))
        return out.detach().double().numpy().reshape(-1)
    return f"torch {torch.__version__}", run_torch


def observations(spec, check_X, n_random, seed):
    from control_node.kernels.reference import random_inputs
    parts = []
    if check_X is not None:
        parts.append(np.asarray(check_X, dtype=np.float64))
    if n_random:
        parts.append(random_inputs(spec, n_random, seed))
    return np.concatenate(parts) if parts else np.zeros((0, len(spec.mean)))


def prove(file, spec, runtime, X, runtime_dtype, pre=None) -> dict:
    """Compare ``reference_act(spec, X)`` with ``runtime`` (name, f) on every row of X (see module doc).

    ``pre`` maps raw observations to what the runtime is fed (VecNormalize), or None. Raises
    :class:`ImportRefused` naming the first sample that differs."""
    name, f = runtime
    threads = _one_torch_thread()
    try:
        feed = X if pre is None else pre(X)
        out = np.array([f(x) for x in feed]).reshape(len(X), -1)
    finally:
        _restore_torch_threads(threads)
    if out.shape[1] != spec.n_actions:
        raise ImportRefused(file, "proof", f"the runtime gives {out.shape[1]} actions, the import {spec.n_actions}",
                            "report this: the importer mis-read the graph")
    want = spec.action_offset + spec.action_scale * out
    got = reference_act(spec, X)
    rtol = max(RTOL[spec.dtype], RTOL[runtime_dtype])
    tol = (rtol * np.maximum(1.0, np.abs(out).max(axis=1, initial=0.0)))[:, None] * \
        np.maximum(1.0, np.abs(spec.action_scale))[None, :] + 4 * np.finfo(np.float64).eps * np.abs(want)
    err = np.abs(got - want)
    same = (err <= tol) | (np.isnan(got) & np.isnan(want)) | (got == want)
    bad = np.flatnonzero(~same.all(axis=1))
    finite = np.isfinite(err)
    proof = {"reference": name, "samples": int(len(X)),
             "max_abs_err": float(err[finite].max()) if finite.any() else 0.0,
             "tolerance": f"rtol {rtol:g} x max(1, max|a|) per sample (x |action_scale| when mapped)",
             "first_bad": None}
    if bad.size:
        i = int(bad[0])
        j = int(np.flatnonzero(~same[i])[0])
        proof["first_bad"] = {"index": i, "x": X[i].tolist(), "got": got[i].tolist(), "want": want[i].tolist()}
        e = ImportRefused(file, f"proof sample {i}", f"the import and {name} differ: action {j} "
                          f"({spec.action_names[j]}) {got[i, j]!r} vs {want[i, j]!r} (|diff| {err[i, j]:.3g} > "
                          f"tolerance {tol[i, j]:.3g}); x = {X[i].tolist()}",
                          "report this with the file: the importer mis-read the graph")
        e.proof = proof                      # with first_bad: {index, x, got, want}
        raise e
    return proof


def prove_kernel(file, spec, X, kernel) -> dict | str:
    """Check the compiled kernel against the reference on X; 'not yet supported' when it cannot run the spec.

    ``kernel`` is the compiled policy class (``control_node.kernels.Policy``), passed in by the caller:
    ``Policy.load`` imports through this package, so the package must not import the kernel itself."""
    from control_node.kernels.reference import ConsistencyError, check_consistency
    if kernel is None:
        return "not checked here (import_policy(..., kernel=Policy) checks it; Policy.load verifies it at load)"
    try:
        policy = kernel(spec)
    except (NotImplementedError, ValueError) as e:
        return f"not yet supported ({e})" if str(e) else "not yet supported"
    try:
        report = check_consistency(policy, spec, X=X, n_random=0)
    except NotImplementedError as e:
        return f"not yet supported ({e})" if str(e) else "not yet supported"
    except ConsistencyError as e:
        raise ImportRefused(file, "kernel", f"the compiled kernel disagrees with the numpy reference: {e}",
                            "report this: a kernel bug") from None
    return {"samples": int(report["checked"]), "rtol": report["rtol"], "against": "numpy reference (reference_act)"}


def _one_torch_thread():
    import sys
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    return n


def _restore_torch_threads(n):
    import sys
    if n is not None:
        sys.modules["torch"].set_num_threads(n)
