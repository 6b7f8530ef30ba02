"""The proof of an import: the imported spec against the exporter's own runtime on the same observations.

For raw observations X (n, n_features) float64 (the caller's ``check_X`` rows, then ``n_random`` random
rows from :func:`kernels.reference.random_inputs`, 3 std around the normaliser's mean), then the spec's edge
samples (:func:`edge_samples`: each feature alone and all features at once at mean +- 3 / 10 / 50 std, just
inside and outside the observation clips, the observations driving each action to its extremes and across its
clip), one observation at a time as the node runs them. The edge samples are there because random observations
almost never reach the clips, saturations and squashes: a mapping wrong only where they act (a clamp at 20 std
read as none) would pass on random rows alone. ``samples`` counts X, ``edge_samples`` the edge rows.

* the runtime: onnxruntime (``intra_op_num_threads=1``) for .onnx, torch (``inference_mode``, one thread)
  for TorchScript; or, when onnxruntime is not installed, the importer's numpy forward pass over the ONNX
  graph (``onnx_eval.py``). Observation normalisation that lives outside the graph (SB3 VecNormalize) is
  applied here before the runtime, in float64, then cast to the graph's dtype.
* ``want = action_offset + action_scale * runtime_output`` (the metadata's offset / scale live outside the
  graph too; both are 0 / 1 unless mapped).
* ``got = reference_act(spec, X)``.

Recurrent policies run as sequences, the state carried from step to step as the node carries it: the
rows are cut into sequences of ``kernels.reference.RNN_CHUNK`` (300) steps (the caller's ``check_X`` rows
first, then the random ones, then the edge samples), each from the zero state. onnxruntime is fed ``h_in`` /
``c_in`` and its ``h_out`` / ``c_out`` are fed back on the next call, as the graph's caller does; a TorchScript module runs
on its own ``hidden_state`` / ``cell_state`` buffers, zeroed at the start of each sequence. The import's
side is :func:`kernels.reference.run_sequence` over the same sequences.

Tolerance per sample i and action j: ``rtol * max(1, max_j |runtime_output_i|) * max(1, |action_scale_j|)``
with rtol 2e-4 when the runtime or the spec computes in float32, 1e-9 when both are float64
(kernels.reference.RTOL). The compiled kernel (``Policy(spec).act``, when the caller passes the class) is
checked on the same rows and the edge samples with kernels.reference.check_consistency, when it supports the
spec.
"""
from __future__ import annotations

from dataclasses import replace

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


#: the edge samples (see :func:`edge_samples`): each feature alone, then all at once, at mean +- k std
EDGE_K = (3.0, 10.0, 50.0)
EDGE_STEP = 1e-3          # "just inside / outside" a clip bound: bound -+ EDGE_STEP * max(1, |bound|)


def _raw(spec, Z):
    """Raw observations whose normalised value ((x * obs_scale - mean) / scale, before the clip) is Z."""
    x = spec.mean + np.asarray(Z, dtype=np.float64) * spec.scale
    return x / np.where(spec.obs_scale != 0, spec.obs_scale, 1.0)


def _bounds(lo, hi, n):
    return (np.broadcast_to(np.asarray(lo, dtype=np.float64), (n,)).copy(),
            np.broadcast_to(np.asarray(hi, dtype=np.float64), (n,)).copy())


def _pre_head(spec, X):
    """The spec's continuous action before its clip (after the squash) for raw rows X (one step each)."""
    from control_node.kernels.reference import reference_logits
    with np.errstate(all="ignore"):
        a = reference_logits(spec, X).astype(np.float64)
    return np.tanh(a) if spec.squash else a


def edge_samples(spec, seed=0):
    """Raw observations where the policy's clips, saturations and squashes act, with a label per row.

    * each feature alone at mean +- k std (k in ``EDGE_K``; "std" is the spec's scale), the others at the mean;
    * all features at once at +- k std, and at two random sign patterns of +- k std;
    * the normalised observation's clip (norm_clip) and the raw observation's clip (obs_clip), where finite:
      each feature alone and all at once, just inside and just outside each bound;
    * a feed-forward policy with a continuous head: for each action the observation (among random ones scaled by
      1 .. 50 std and the rows above) that drives it highest and lowest, and where the action's clip bound
      is crossed on the way there (bisection from the mean), the observations just inside and outside it.

    Random observations (3 std around the mean) rarely reach these: a mapping that is wrong only where a clip
    or a saturation acts (a clamp at 20 std read as no clamp) agrees with the runtime on them and not here."""
    n = len(spec.mean)
    names = list(spec.feature_names) if spec.feature_names is not None else [f"obs{i}" for i in range(n)]
    rng = np.random.default_rng(seed + 7919)
    Z, labels = [], []
    for k in EDGE_K:
        for s in (1.0, -1.0):
            z = np.zeros((n, n))
            np.fill_diagonal(z, s * k)
            Z.append(z)
            labels += [f"feature {i} ({names[i]}) alone at mean {'+-'[s < 0]} {k:g} std" for i in range(n)]
    for k in EDGE_K:
        signs = np.vstack([np.ones(n), -np.ones(n), rng.choice([-1.0, 1.0], size=(2, n))])
        Z.append(k * signs)
        labels += [f"all features at mean + {k:g} std", f"all features at mean - {k:g} std"] + \
            [f"all features at mean +- {k:g} std (random signs {j})" for j in (1, 2)]
    lo, hi = _bounds(spec.norm_clip_low, spec.norm_clip_high, n)
    for what, b in (("norm_clip low", lo), ("norm_clip high", hi)):
        fin = np.isfinite(b)
        if not fin.any():
            continue
        for side, sgn in (("inside", 1.0 if what.endswith("low") else -1.0), ("outside", -1.0 if what.endswith("low")
                                                                               else 1.0)):
            d = np.where(fin, b + sgn * EDGE_STEP * np.maximum(1.0, np.abs(b)), 0.0)
            idx = np.flatnonzero(fin)
            z = np.zeros((len(idx), n))
            z[np.arange(len(idx)), idx] = d[idx]
            Z.append(np.vstack([z, d[None, :]]))
            labels += [f"feature {i} ({names[i]}) just {side} the {what} {b[i]:g}" for i in idx] + \
                [f"all features just {side} the {what}"]
    X = [_raw(spec, np.vstack(Z))]
    olo, ohi = _bounds(spec.obs_clip_low, spec.obs_clip_high, n)
    osc = np.where(spec.obs_scale != 0, spec.obs_scale, 1.0)
    base = spec.mean / osc
    for what, b in (("obs_clip low", olo), ("obs_clip high", ohi)):
        idx = np.flatnonzero(np.isfinite(b) & (spec.obs_scale != 0))
        for side, sgn in (("inside", 1.0 if what.endswith("low") else -1.0), ("outside", -1.0 if what.endswith("low")
                                                                               else 1.0)):
            x = np.tile(base, (len(idx), 1))
            x[np.arange(len(idx)), idx] = (b[idx] + sgn * EDGE_STEP * np.maximum(1.0, np.abs(b[idx]))) / osc[idx]
            X.append(x)
            labels += [f"feature {i} ({names[i]}) just {side} the {what} {b[i]:g}" for i in idx]
    X = np.vstack(X)
    if spec.head == "continuous" and not getattr(spec, "recurrent", None):
        A, A_labels = _action_edges(spec, X, rng)
        X = np.vstack([X, A])
        labels += A_labels
    return X, labels


def _action_edges(spec, X_edge, rng, n_rays=256, steps=40):
    """Rows driving each action to its extremes, and just inside / outside its clip bound where one is crossed."""
    n = len(spec.mean)
    C = np.vstack([_raw(spec, k * rng.normal(size=(n_rays, n))) for k in (1.0, 2.0, 5.0, 10.0, 20.0, 50.0)] +
                  [X_edge])
    a = _pre_head(spec, C)
    a = np.where(np.isfinite(a), a, np.nan)
    origin = _raw(spec, np.zeros((1, n)))
    a0 = _pre_head(spec, origin)[0]
    rows, labels = [], []
    low, high = _bounds(spec.action_low, spec.action_high, spec.n_actions)
    names = list(spec.action_names) if spec.action_names is not None else [f"action{j}" for j in range(spec.n_actions)]
    rays = []                      # (row, action, bound, side label)
    for j in range(spec.n_actions):
        col = a[:, j]
        if not np.isfinite(col).any():
            continue
        for side, i, bound in (("highest", int(np.nanargmax(col)), high[j]), ("lowest", int(np.nanargmin(col)), low[j])):
            rows.append(C[i])
            labels.append(f"the observation driving action {j} ({names[j]}) {side} ({col[i]:.3g})")
            crossed = (col[i] > bound) if side == "highest" else (col[i] < bound)
            before = (a0[j] < bound) if side == "highest" else (a0[j] > bound)
            if np.isfinite(bound) and crossed and before:
                rays.append((C[i], j, bound, side))
    if rays:                       # bisection on t in [0, 1] along origin + t (row - origin), all rays at once
        D = np.array([r[0] for r in rays]) - origin
        jj = np.array([r[1] for r in rays])
        bb = np.array([r[2] for r in rays])
        up = np.array([r[3] == "highest" for r in rays])
        t0, t1 = np.zeros(len(rays)), np.ones(len(rays))
        for _ in range(steps):
            t = (t0 + t1) / 2
            v = _pre_head(spec, origin + t[:, None] * D)[np.arange(len(rays)), jj]
            past = np.where(up, v > bb, v < bb)
            t1, t0 = np.where(past, t, t1), np.where(past, t0, t)
        for r, (_, j, bound, side) in enumerate(rays):
            for tt, where in ((t0[r] * (1 - EDGE_STEP), "inside"), (t1[r] * (1 + EDGE_STEP), "outside")):
                rows.append(origin[0] + min(tt, 1.0 + EDGE_STEP) * D[r])
                labels.append(f"just {where} the clip of action {j} ({names[j]}) at {bound:g}")
    return (np.array(rows).reshape(-1, n), labels)


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


def _edge_kinds(labels) -> dict:
    kinds = {}
    for lab in labels:
        k = ("action extremes and clip crossings" if "action" in lab else "norm_clip bounds" if "norm_clip" in lab
             else "obs_clip bounds" if "obs_clip" in lab else "all features at +-k std" if lab.startswith("all")
             else "one feature at +-k std")
        kinds[k] = kinds.get(k, 0) + 1
    return kinds


def prove(file, spec, runtime, X, runtime_dtype, pre=None, starts=(0,), edges=True) -> dict:
    """Compare ``reference_act(spec, X)`` with ``runtime`` (name, f) on every row of X, then on the
    :func:`edge_samples` of the spec (unless ``edges`` is False; see module doc).

    ``pre`` maps raw observations to what the runtime is fed (VecNormalize), or None. For a recurrent spec
    the rows run as sequences (:func:`sequences`; ``starts``: rows where a sequence must start), the
    runtime reset at each; the edge samples are sequences of their own. Raises :class:`ImportRefused`
    naming the first sample (and sequence step) that differs. ``samples`` in the result counts the rows of X,
    ``edge_samples`` the edge rows (``edge_kinds``: how many of each kind)."""
    from control_node.kernels.reference import run_sequence
    name, f = runtime
    recurrent = bool(getattr(spec, "recurrent", None))
    X = np.asarray(X, dtype=np.float64)
    E, E_labels = edge_samples(spec) if edges else (np.zeros((0, X.shape[1])), [])
    nX = len(X)
    XA = np.concatenate([X, E])
    seqs = sequences(len(XA), tuple(starts) + (nX,)) if recurrent else []
    threads = _one_torch_thread()
    try:
        feed = XA if pre is None else pre(XA)
        if recurrent:
            rows = []
            for i, j in seqs:
                f.reset()
                rows += [f(x) for x in feed[i:j]]
            f.reset()
            out = np.array(rows).reshape(len(XA), -1)
        else:
            out = np.array([f(x) for x in feed]).reshape(len(XA), -1)
    finally:
        _restore_torch_threads(threads)
    if out.shape[1] != spec.n_actions:
        raise ImportRefused(file, "proof", f"the runtime gives {out.shape[1]} actions, the import {spec.n_actions}",
                            "report this: the importer mis-read the graph")
    want = spec.action_offset + spec.action_scale * out
    if recurrent:
        got = np.concatenate([run_sequence(spec, XA[i:j])["actions"] for i, j in seqs]) if seqs else \
            np.zeros((0, spec.n_actions))
    else:
        got = reference_act(spec, XA)
    rtol = max(RTOL[spec.dtype], RTOL[runtime_dtype])
    with np.errstate(invalid="ignore", over="ignore"):
        tol = (rtol * np.maximum(1.0, np.abs(out).max(axis=1, initial=0.0)))[:, None] * \
            np.maximum(1.0, np.abs(spec.action_scale))[None, :] + 4 * np.finfo(np.float64).eps * np.abs(want)
        err = np.abs(got - want)
        same = (err <= tol) | (np.isnan(got) & np.isnan(want)) | (got == want)
    bad = np.flatnonzero(~same.all(axis=1))
    finite = np.isfinite(err)
    proof = {"reference": name, "samples": int(nX), "edge_samples": int(len(E)), "edge_kinds": _edge_kinds(E_labels),
             "max_abs_err": float(err[finite].max()) if finite.any() else 0.0,
             "tolerance": f"rtol {rtol:g} x max(1, max|a|) per sample (x |action_scale| when mapped)",
             "first_bad": None}
    if recurrent:
        proof["sequences"] = [[int(i), int(j)] for i, j in seqs if i < nX]
        proof["edge_sequences"] = [[int(i - nX), int(j - nX)] for i, j in seqs if i >= nX]
    if bad.size:
        i = int(bad[0])
        j = int(np.flatnonzero(~same[i])[0])
        proof["first_bad"] = {"index": i, "x": XA[i].tolist(), "got": got[i].tolist(), "want": want[i].tolist()}
        at = f"proof sample {i}" if i < nX else f"proof edge sample {i - nX} ({E_labels[i - nX]})"
        if i >= nX:
            proof["first_bad"]["edge"] = E_labels[i - nX]
        if recurrent:
            k, (s0, _) = next((k, r) for k, r in enumerate(seqs) if r[0] <= i < r[1])
            at += f" (sequence {k}, step {i - s0}, state carried from row {s0})"
            proof["first_bad"].update(sequence=k, step=i - s0)
        e = ImportRefused(file, at, f"the import and {name} differ: action {j} "
                          f"({spec.action_names[j]}) {float(got[i, j])!r} vs {float(want[i, j])!r} (|diff| "
                          f"{float(err[i, j]):.3g} > tolerance {float(tol[i, j]):.3g}); x = {XA[i].tolist()}",
                          "report this with the file: the importer mis-read the graph")
        e.proof = proof                      # with first_bad: {index, x, got, want[, edge]}
        raise e
    return proof


def prove_kernel(file, spec, X, kernel, edges=True) -> dict | str:
    """Check the compiled kernel against the reference on X, then on the spec's :func:`edge_samples` (their
    count in ``edge_samples``); 'not yet supported' when it cannot run the spec.

    ``kernel`` is the compiled policy class (``control_node.kernels.Policy``), passed in by the caller:
    ``Policy.load`` imports through this package, so the package must not import the kernel itself."""
    from control_node.kernels.reference import ConsistencyError, check_consistency
    if kernel is None:
        return "not checked here (import_policy(..., kernel=Policy) checks it; Policy.load verifies it at load)"
    try:
        policy = kernel(spec)
    except (NotImplementedError, ValueError) as e:
        return f"not yet supported ({e})" if str(e) else "not yet supported"
    E = edge_samples(spec)[0] if edges else None
    try:
        report = check_consistency(policy, spec, X=X, n_random=0)
        n_edge = int(check_consistency(policy, spec, X=E, n_random=0)["checked"]) if E is not None and len(E) else 0
    except NotImplementedError as e:
        return f"not yet supported ({e})" if str(e) else "not yet supported"
    except ConsistencyError as e:
        raise ImportRefused(file, "kernel", f"the compiled kernel disagrees with the numpy reference: {e}",
                            "report this: a kernel bug") from None
    return {"samples": int(report["checked"]), "edge_samples": n_edge, "rtol": report["rtol"],
            "against": "numpy reference (reference_act)"}


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


# ---- weight storage (kernels/weights.py): the error measured over the proof set ------------------------------

def proof_set(spec, X=None, n_random=2000, seed=0, starts=(0,)):
    """The rows a storage is measured on: ``X`` (else ``spec.check_X`` and ``n_random`` random observations),
    then the proof's edge samples (kernels.importers.proof.edge_samples: clips, saturations, action extremes).
    Returns ``(rows, seqs)``; ``seqs`` are the recurrent sequences (None for a feed-forward policy)."""
    if X is None:
        X = observations(spec, spec.check_X, n_random, seed)
    X = np.asarray(X, dtype=np.float64)
    rows = np.concatenate([X, edge_samples(spec, seed)[0]])
    seqs = sequences(len(rows), tuple(starts) + (len(X),)) if spec.recurrent else None
    return rows, seqs


def store_weights(spec, weights, *, tolerance=None, X=None, n_random=2000, seed=0, starts=(0,), isa=None,
                  policy_class=None, file="(model)"):
    """``spec`` with its weights stored as ``weights``, the error measured (kernels.weights.measure_error
    through ``policy_class``, the compiled Policy, over :func:`proof_set`) and recorded in ``weights_error`` (written into the model file). f32: the spec as is.
    Raises WeightStorageError (tolerance exceeded: naming the worst action and observation; a weight out of
    the storage's range)."""
    from control_node.kernels.weights import check_storage, measure_error
    weights = check_storage(weights)
    if weights == "f32":
        return replace(spec, weights="f32", weights_error=None) if spec.weights != "f32" else spec
    rows, seqs = proof_set(spec, X, n_random, seed, starts)
    err = measure_error(spec, weights, rows, policy_class=policy_class, isa=isa, seqs=seqs, tolerance=tolerance,
                        file=file)
    return replace(spec, weights=weights, weights_error=err, sha256="")
