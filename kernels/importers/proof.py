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

Recurrent policies run as sequences, the state carried from step to step as the node carries it: the
rows are cut into sequences of ``kernels.reference.RNN_CHUNK`` (300) steps (the caller's ``check_X`` rows
first, then the random ones), each from the zero state. onnxruntime is fed ``h_in`` / ``c_in`` and its
``h_out`` / ``c_out`` are fed back on the next call, as the graph's caller does; a TorchScript module runs
on its own ``hidden_state`` / ``cell_state`` buffers, zeroed at the start of each sequence. The import's
side is :func:`kernels.reference.run_sequence` over the same sequences.

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


class Stateful:
    """A runtime step ``f(x) -> actions`` that carries a recurrent state between calls; ``reset()`` zeroes it."""

    def __init__(self, step, reset):
        self.step, self.reset = step, reset

    def __call__(self, x):
        return self.step(x)


def onnx_runtime(graph, dtype):
    """(name, f) where f(x float64 (n_features,)) -> float64 (n_actions,) runs the .onnx file.

    For a recurrent graph f is a :class:`Stateful`: it feeds the state inputs the state outputs of the previous
    call (zeros after ``f.reset()``), as the graph's caller does."""
    rec = graph.recurrent
    state = {}

    def reset():
        for which, name in rec["state_inputs"].items():
            state[name] = np.zeros(rec["state_shape"], dtype=rec["state_dtype"])
    try:
        import onnxruntime as ort
    except ImportError:
        from control_node.kernels.importers import onnx_eval
        nodes, env0 = graph.nodes, {k: v for k, v in graph.env.items() if k not in graph.data}

        def run_numpy(x):
            env = dict(env0)
            env[graph.input_name] = np.asarray(x, dtype=dtype).reshape(1, -1)
            env.update(state)
            env = onnx_eval.run(nodes, env, graph.opset)
            if rec:          # the node's Y_h / Y_c are what h_out / c_out carry (checked at load)
                node = rec["node"]
                for which, name in rec["state_inputs"].items():
                    state[name] = np.asarray(env[node.outputs[1 if which == "h" else 2]])
            return np.asarray(env[graph.action_output], dtype=np.float64).reshape(-1)
        name = "importer's numpy forward pass (onnxruntime is not installed)"
        if rec:
            reset()
            return name, Stateful(run_numpy, reset)
        return name, run_numpy
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(graph.path, sess_options=so, providers=["CPUExecutionProvider"])
    if rec:
        ins, outs = rec["state_inputs"], rec["state_outputs"]
        order = list(ins)
        fetch = [graph.action_output] + [outs[w] for w in order]

        def run_ort_state(x):
            feed = {graph.input_name: np.asarray(x, dtype=dtype).reshape(1, -1), **state}
            res = sess.run(fetch, feed)
            for w, v in zip(order, res[1:]):
                state[ins[w]] = v                 # h_out -> h_in, c_out -> c_in
            return np.asarray(res[0], dtype=np.float64).reshape(-1)
        reset()
        return f"onnxruntime {ort.__version__} (state carried: " + ", ".join(
            f"{outs[w]} -> {ins[w]}" for w in order) + ")", Stateful(run_ort_state, reset)

    def run_ort(x):
        feed = {graph.input_name: np.asarray(x, dtype=dtype).reshape(1, -1)}
        return np.asarray(sess.run([graph.action_output], feed)[0], dtype=np.float64).reshape(-1)
    return f"onnxruntime {ort.__version__}", run_ort


def torch_runtime(module, dtype, state_buffers=()):
    """(name, f) running the TorchScript module; with ``state_buffers`` (names of its recurrent state buffers)
    f is a :class:`Stateful` whose ``reset()`` zeroes those buffers (the module keeps its state in them)."""
    import torch
    tdtype = {"float32": torch.float32, "float64": torch.float64}[dtype]

    def run_torch(x):
        with torch.inference_mode():
            out = module(torch.from_numpy(np.asarray(x, dtype=np.float64).reshape(1, -1)).to(tdtype))
        return out.detach().double().numpy().reshape(-1)
    if state_buffers:
        bufs = dict(module.named_buffers())

        def reset():
            with torch.no_grad():
                for b in state_buffers:
                    bufs[b].zero_()
        reset()
        return (f"torch {torch.__version__} (the module's own buffers {', '.join(state_buffers)}, zeroed at each "
                "sequence start)"), Stateful(run_torch, reset)
    return f"torch {torch.__version__}", run_torch


def observations(spec, check_X, n_random, seed):
    from control_node.kernels.reference import random_inputs
    parts = []
    if check_X is not None:
        parts.append(np.asarray(check_X, dtype=np.float64))
    if n_random:
        parts.append(random_inputs(spec, n_random, seed))
    return np.concatenate(parts) if parts else np.zeros((0, len(spec.mean)))


def sequences(n_rows, starts=(0,)):
    """Row ranges ``(i, j)`` of the recurrent proof: a new sequence at each of ``starts`` and every
    ``RNN_CHUNK`` rows after it."""
    from control_node.kernels.reference import RNN_CHUNK
    bounds = sorted({s for s in starts if 0 <= s < n_rows} | {0})
    out = []
    for k, s in enumerate(bounds):
        end = bounds[k + 1] if k + 1 < len(bounds) else n_rows
        out += [(i, min(i + RNN_CHUNK, end)) for i in range(s, end, RNN_CHUNK)]
    return out


def prove(file, spec, runtime, X, runtime_dtype, pre=None, starts=(0,)) -> dict:
    """Compare ``reference_act(spec, X)`` with ``runtime`` (name, f) on every row of X (see module doc).

    ``pre`` maps raw observations to what the runtime is fed (VecNormalize), or None. For a recurrent spec
    the rows run as sequences (:func:`sequences`; ``starts``: rows where a sequence must start), the
    runtime reset at each. Raises :class:`ImportRefused` naming the first sample (and sequence step)
    that differs."""
    from control_node.kernels.reference import run_sequence
    name, f = runtime
    recurrent = bool(getattr(spec, "recurrent", None))
    seqs = sequences(len(X), starts) if recurrent else []
    threads = _one_torch_thread()
    try:
        feed = X if pre is None else pre(X)
        if recurrent:
            rows = []
            for i, j in seqs:
                f.reset()
                rows += [f(x) for x in feed[i:j]]
            f.reset()
            out = np.array(rows).reshape(len(X), -1)
        else:
            out = np.array([f(x) for x in feed]).reshape(len(X), -1)
    finally:
        _restore_torch_threads(threads)
    if out.shape[1] != spec.n_actions:
        raise ImportRefused(file, "proof", f"the runtime gives {out.shape[1]} actions, the import {spec.n_actions}",
                            "report this: the importer mis-read the graph")
    want = spec.action_offset + spec.action_scale * out
    if recurrent:
        got = np.concatenate([run_sequence(spec, X[i:j])["actions"] for i, j in seqs]) if seqs else \
            np.zeros((0, spec.n_actions))
    else:
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
    if recurrent:
        proof["sequences"] = [[int(i), int(j)] for i, j in seqs]
    if bad.size:
        i = int(bad[0])
        j = int(np.flatnonzero(~same[i])[0])
        proof["first_bad"] = {"index": i, "x": X[i].tolist(), "got": got[i].tolist(), "want": want[i].tolist()}
        at = f"proof sample {i}"
        if recurrent:
            k, (s0, _) = next((k, r) for k, r in enumerate(seqs) if r[0] <= i < r[1])
            at += f" (sequence {k}, step {i - s0}, state carried from row {s0})"
            proof["first_bad"].update(sequence=k, step=i - s0)
        e = ImportRefused(file, at, f"the import and {name} differ: action {j} "
                          f"({spec.action_names[j]}) {float(got[i, j])!r} vs {float(want[i, j])!r} (|diff| "
                          f"{float(err[i, j]):.3g} > tolerance {float(tol[i, j]):.3g}); x = {X[i].tolist()}",
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
