"""Policy importers: exported policies (.onnx, TorchScript .pt) -> a verified :class:`ModelSpec`.

``import_policy(path)`` reads the file, recognises the policy it holds (normaliser, an optional LSTM /
GRU layer, dense layers, activations, head), builds the ModelSpec and proves it against the exporter's
own runtime on the caller's observations and random ones (see ``proof.py``; recurrent policies as
sequences with the state carried). Anything it cannot map exactly is refused
whole with :class:`ImportRefused` (a ValueError) naming the node / submodule / field and the fix: there
are no partial imports. docs/policies.md lists what is recognised.

Imports nothing of control_node outside control_node.kernels; onnx, onnxruntime and torch are imported
only when a file needs them.
"""
from __future__ import annotations

import os

import numpy as np

from control_node.kernels.importers.common import ImportRefused, sha256_files

SUFFIXES = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript", ".jit": "torchscript"}

__all__ = ["ImportRefused", "import_policy", "describe", "SUFFIXES"]


def import_policy(path, *, obs_norm=None, dtype=None, check_X=None, n_random=2000, seed=0, kernel=None):
    """Import the policy in ``path`` (.onnx, or TorchScript .pt / .pth / .jit).

    ``obs_norm``: path of SB3 VecNormalize statistics kept outside the graph (.npz with mean, var,
    [epsilon, clip_obs], or the VecNormalize .pkl). ``dtype``: compute dtype ("float32" / "float64";
    default: the graph's). ``check_X``: float64 (n, n_features) raw observations the proof must include.
    ``kernel``: the compiled policy class (``control_node.kernels.Policy``) to check on the proof's
    observations too; this package does not import it (``Policy.load`` imports through this package and
    verifies the kernel itself), so callers that want the kernel in the proof pass it (the CLI does).

    Returns ``(spec, proof)``: a continuous-head :class:`ModelSpec` whose ``check_X`` holds (up to 256
    of) the observations it was proved on, and the proof dict (``reference``, ``samples``,
    ``max_abs_err``, ``tolerance``, ``first_bad``, ``kernel``, ``recognised``). Raises ImportRefused.
    """
    from control_node.kernels.importers import proof as P
    from control_node.kernels.model_file import DTYPES, ModelFileError, ModelSpec, validate_spec
    path = os.fspath(path)
    file = os.path.basename(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ImportRefused(file, "(file name)", f"suffix {suffix or '(none)'!r} is not a policy format the importer "
                            f"reads ({', '.join(SUFFIXES)})", "pass an .onnx or TorchScript .pt file")
    if not os.path.isfile(path):
        raise ImportRefused(file, "(file)", f"no such file {path}", "check the path")
    if dtype is not None and dtype not in DTYPES:
        raise ImportRefused(file, "dtype", f"{dtype!r} is not one of {DTYPES}", "use float32 or float64")
    norm = None
    if obs_norm is not None:
        from control_node.kernels.importers.obs_norm import load_obs_norm
        norm = load_obs_norm(obs_norm)

    fmt = SUFFIXES[suffix]
    folded, graph_dtype, meta, source, runtime = (_read_onnx if fmt == "onnx" else _read_torchscript)(path, file)
    n = folded.n_features
    mean = folded.mean if folded.mean is not None else np.zeros(n)
    scale = folded.scale if folded.scale is not None else np.ones(n)
    norm_clip = folded.norm_clip if folded.norm_clip is not None else (-np.inf, np.inf)
    pre = None
    if norm is not None:
        if folded.mean is not None or folded.scale is not None:
            raise ImportRefused(file, "obs_norm", f"both an in-graph normaliser ({folded.normaliser}) and obs_norm "
                                f"{norm.source['file']} were given: the observation would be normalised twice",
                                "drop --obs-norm (the graph already normalises), or export the graph without it")
        if norm.mean.shape != (n,):
            raise ImportRefused(norm.source["file"], "field 'mean'", f"has {norm.mean.size} values, the policy takes "
                                f"{n} observations", "pass the statistics saved with this policy")
        mean, scale, norm_clip = norm.mean, norm.scale, (-norm.clip_obs, norm.clip_obs)
        pre = norm.apply
        source["obs_norm"] = norm.source
    if check_X is not None:
        check_X = np.asarray(check_X, dtype=np.float64)
        if check_X.ndim != 2 or check_X.shape[1] != n:
            raise ImportRefused(file, "check_X", f"has shape {list(check_X.shape)}, expected (n, {n})",
                                f"pass observations with {n} columns")
        if not np.isfinite(check_X).all():
            raise ImportRefused(file, "check_X", "contains NaN or Inf", "pass finite observations")

    try:
        spec = ModelSpec(
            layers=folded.layers, mean=mean, scale=scale, classes=[],
            feature_names=meta["feature_names"] or [f"obs{i}" for i in range(n)],
            dtype=dtype or graph_dtype, trainer=fmt, activations=folded.activations, alphas=folded.alphas,
            norm_clip_low=norm_clip[0], norm_clip_high=norm_clip[1], head="continuous",
            action_names=meta["action_names"], squash=folded.squash, action_low=folded.action_low,
            action_high=folded.action_high, action_offset=meta["action_offset"], action_scale=meta["action_scale"],
            source=source, **folded.rnn_fields())
        validate_spec(spec, file)
    except ModelFileError as e:
        raise ImportRefused(file, f"field '{e.field}'", e.problem, e.fix) from None

    if int(n_random) < 0 or (int(n_random) == 0 and (check_X is None or not len(check_X))):
        raise ImportRefused(file, "n_random", f"is {n_random} and no check_X rows were given: the proof needs at least "
                            "one observation", "pass n_random > 0 (default 2000) or check_X")
    X = P.observations(spec, check_X, int(n_random), seed)
    n_check = 0 if check_X is None else len(check_X)
    proof = P.prove(file, spec, runtime, X, graph_dtype, pre=pre, starts=(0, n_check))
    proof["kernel"] = P.prove_kernel(file, spec, X, kernel)
    proof["recognised"] = _recognised(fmt, folded, norm, meta)
    # the proof's first rows become check_X, verified at every load (content_hash does not cover check_X)
    spec.check_X = X[:P.CHECK_ROWS].copy()
    return spec, proof


def _read_onnx(path, file):
    """(Folded, graph dtype, metadata mapping, source, runtime) of an .onnx file."""
    from control_node.kernels.importers import onnx as O
    from control_node.kernels.importers import proof as P
    graph = O.load(path)
    folded = O.fold(graph)
    meta = O.map_metadata(file, graph.metadata, folded.n_features, folded.n_actions)
    source = {"file": file, "sha256": sha256_files(graph.files), "format": "onnx", "opset": graph.opset,
              "producer": graph.producer, "metadata_props": dict(graph.metadata)}
    if len(graph.files) > 1:
        source["external_data"] = [os.path.basename(f) for f in graph.files[1:]]
    folded.dropped += [f"output '{o}' (not the action)" for o in graph.dropped_outputs] + graph.dropped_nodes()
    if folded.state:
        source["state"] = {"carried_by": "the caller (graph inputs / outputs)", **folded.state}
    return folded, graph.dtype, meta, source, P.onnx_runtime(graph, graph.dtype)


def _read_torchscript(path, file):
    """(Folded, weights' dtype, metadata mapping (none), source, runtime) of a TorchScript archive."""
    from control_node.kernels.importers import proof as P
    from control_node.kernels.importers import torchscript as T
    module = T.load(path)
    folded, dtype = T.fold(file, module)
    meta = {"action_names": None, "feature_names": None, "action_offset": 0.0, "action_scale": 1.0, "notes": []}
    source = T.source(path)
    if folded.state:
        source["state"] = {"carried_by": "the module's buffers", **folded.state}
    return folded, dtype, meta, source, P.torch_runtime(module, dtype, tuple(folded.state.get("buffers", {}).values()))


def _recognised(fmt, folded, norm, meta) -> dict:
    normaliser = folded.normaliser
    if norm is not None:
        normaliser = (f"obs_norm {norm.source['file']} (VecNormalize: (x - mean) / sqrt(var + {norm.epsilon:g}), "
                      f"clip +-{norm.clip_obs:g})")
    layers = [f"{note}, {act}" + (f"(alpha={al:g})" if act in ("elu", "leaky_relu", "celu") else "")
              for note, act, al in zip(folded.layer_notes, folded.activations, folded.alphas)]
    out = {"format": fmt, "normaliser": normaliser, "layers": layers, "head": folded.head,
           "metadata": meta["notes"], "dropped": folded.dropped, "warnings": folded.warnings}
    if folded.recurrent:
        st = folded.state
        carried = (", ".join(f"{st['outputs'][w]} -> {st['inputs'][w]}" for w in st.get("inputs", {})) or
                   ", ".join(f"buffer {b}" for b in st.get("buffers", {}).values()))
        out["recurrent"] = f"{folded.rnn_note}; state: {carried} (the kernel owns it; reset() zeroes it)"
    return out


def describe(spec, proof) -> str:
    """Human-readable lines: what was recognised and which reference proved it (for the CLI)."""
    r = proof.get("recognised", {})
    lines = [f"recognised {r.get('format', '?')} policy {spec.source.get('file', '')}: "
             f"{' -> '.join(map(str, spec.layer_sizes))} ({spec.dtype})"]
    if spec.source.get("producer"):
        lines.append(f"  producer      {spec.source['producer']}" +
                     (f", opset {spec.source['opset']}" if "opset" in spec.source else ""))
    lines.append(f"  normaliser    {r.get('normaliser') or 'none'}")
    if r.get("recurrent"):
        lines.append(f"  recurrent     {r['recurrent']}")
    for i, layer in enumerate(r.get("layers", [])):
        lines.append(f"  layer {i}       {layer}")
    lines.append(f"  head          {r.get('head', spec.head)}")
    for note in r.get("metadata", []):
        lines.append(f"  metadata      {note}")
    for d in r.get("dropped", []):
        lines.append(f"  dropped       {d}")
    for w in r.get("warnings", []):
        lines.append(f"  warning       {w}")
    seqs = f" in {len(proof['sequences'])} sequences (state carried)" if proof.get("sequences") else ""
    lines.append(f"proved against {proof['reference']} on {proof['samples']} observations{seqs}: max |error| "
                 f"{proof['max_abs_err']:.3g} (tolerance {proof['tolerance']})")
    k = proof.get("kernel")
    if isinstance(k, dict):
        lines.append(f"compiled kernel matches the numpy reference on {k['samples']} observations (rtol {k['rtol']:g})")
    else:
        lines.append(f"compiled kernel: {k}")
    return "\n".join(lines)
