"""Policy importers: exported policies (.onnx, TorchScript .pt) -> a verified :class:`ModelSpec`.

``import_policy(path)`` reads the file, recognises the policy it holds (normaliser, an optional LSTM /
GRU layer, dense layers, activations, head), builds the ModelSpec and proves it against the exporter's
own runtime on the caller's observations and random ones (see ``proof.py``; recurrent policies as
sequences with the state carried). Anything it cannot map exactly is refused
whole with :class:`ImportRefused` (a ValueError) naming the node / submodule / field and the fix: there
are no partial imports. docs/policies.md lists what is recognised.

Hostile or broken files: no tensor of more than ``max_bytes`` (common.MAX_TENSOR_BYTES, 256 MiB: the node's
policy memory bound) is allocated while reading a file (see onnx.py / onnx_eval.py; TorchScript archives'
entries are checked before torch reads them), and any exception raised while reading the untrusted bytes
(parsing, reading the graph, building and running the exporter's runtime on it) becomes an ImportRefused
naming the file, the step and the exception, on one line.

Imports nothing of control_node outside control_node.kernels; onnx, onnxruntime and torch are imported
only when a file needs them.
"""
from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from control_node.kernels.importers.common import (
    MAX_TENSOR_BYTES,
    TOTAL_FACTOR,
    ImportRefused,
    exc_text,
    fmt_bytes,
    sha256_files,
)

SUFFIXES = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript", ".jit": "torchscript"}

__all__ = ["ImportRefused", "import_policy", "describe", "SUFFIXES"]


def import_policy(path, *, obs_norm=None, dtype=None, check_X=None, n_random=2000, seed=0, kernel=None,
                  max_bytes=MAX_TENSOR_BYTES, weights=None, tolerance=None, contract=False, deploy_yaml=None,
                  sdk_joints=None):
    """Import the policy in ``path`` (.onnx, or TorchScript .pt / .pth / .jit).

    ``obs_norm``: path of SB3 VecNormalize statistics kept outside the graph (.npz with mean, var,
    [epsilon, clip_obs], or the VecNormalize .pkl). ``dtype``: compute dtype ("float32" / "float64";
    default: the graph's). ``check_X``: float64 (n, n_features) raw observations the proof must include.
    ``kernel``: the compiled policy class (``control_node.kernels.Policy``) to check on the proof's
    observations too; this package does not import it (``Policy.load`` imports through this package and
    verifies the kernel itself), so callers that want the kernel in the proof pass it (the CLI does).
    ``max_bytes``: the most bytes one tensor read from the file may take (checked before it is allocated;
    default 256 MiB, the node's [lifecycle] max_resident_mb default).
    ``weights``: store the weights as 'f16', 'bf16' or 'int8' (kernels/weights.py; default f32, exact): the
    error against the float32 policy is measured through ``kernel`` (required then) over the proof's rows and
    edge samples, refused above ``tolerance`` (default kernels.weights.DEFAULT_TOLERANCE, a fraction of each
    action's range), and kept in ``spec.weights_error`` and ``proof['weights']``.

    ``contract``: read the deploy contract wherever the exporter wrote one (deploy_contract.py: mjlab's
    metadata_props, unitree_rl_lab's deploy.yaml beside the file) into ``spec.deploy``; ``deploy_yaml``: that
    deploy.yaml's path (read whatever ``contract`` says); ``sdk_joints``: the SDK's joint names in motor order,
    which name deploy.yaml's joints (else ``sdk_<k>``). What cannot be mapped is refused naming the key.

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
    folded, graph_dtype, meta, source, runtime = (_read_onnx if fmt == "onnx" else _read_torchscript)(
        path, file, int(max_bytes))
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

    deploy = None
    if contract or deploy_yaml is not None:
        deploy = _deploy_contract(path, file, source, n, folded.n_actions, deploy_yaml, sdk_joints)
    try:
        spec = ModelSpec(
            layers=folded.layers, mean=mean, scale=scale, classes=[],
            feature_names=meta["feature_names"] or [f"obs{i}" for i in range(n)],
            dtype=dtype or graph_dtype, trainer=fmt, activations=folded.activations, alphas=folded.alphas,
            norm_clip_low=norm_clip[0], norm_clip_high=norm_clip[1], head="continuous",
            action_names=meta["action_names"], squash=folded.squash, action_low=folded.action_low,
            action_high=folded.action_high, action_offset=meta["action_offset"], action_scale=meta["action_scale"],
            source=source, deploy=deploy, **folded.rnn_fields())
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
    if weights not in (None, "f32"):
        from control_node.kernels.weights import WeightStorageError
        if kernel is None:
            raise ImportRefused(file, "weights", f"{weights} storage is measured through the compiled kernel, and "
                                "none was passed", "pass kernel=control_node.kernels.Policy")
        try:
            spec = P.store_weights(spec, weights, tolerance=tolerance, X=X, seed=seed, starts=(0, n_check),
                                 policy_class=kernel, file=file)
        except WeightStorageError as e:
            raise ImportRefused(file, f"--weights {weights}", str(e).removeprefix(f"{file}: "),
                                "keep f32 (exact), choose a wider storage, or raise --tolerance") from None
        spec.check_X = X[:P.CHECK_ROWS].copy()
        proof["weights"] = spec.weights_error
    return spec, proof


def _deploy_contract(path, file, source, n_features, n_actions, deploy_yaml, sdk_joints):
    """The deploy contract of the policy at ``path`` (None when the exporter wrote none)."""
    from control_node.kernels.importers import deploy_contract as D
    meta = source.get("metadata_props") or {}
    from_meta = D.from_metadata(file, meta, n_features, n_actions, source.get("sha256", ""))
    yml = deploy_yaml if deploy_yaml is not None else D.find_deploy_yaml(path)
    if yml is not None and not os.path.isfile(yml):
        raise ImportRefused(file, "--deploy-yaml", f"no such file {yml}", "give the deploy.yaml's path")
    from_yaml = D.from_deploy_yaml(yml, n_features, n_actions, sdk_joints) if yml is not None else None
    if from_meta is not None and from_yaml is not None and sdk_joints is None and "joints" in from_meta["recipe"]:
        # deploy.yaml names no joints: the metadata's names, in the same (policy) order, name them
        from_yaml["recipe"]["joints"] = from_meta["recipe"]["joints"]
        from_yaml["from"]["keys"]["joints.policy"] = from_meta["from"]["keys"]["joints.policy"]
        from_yaml["from"]["notes"] = [x for x in from_yaml["from"]["notes"] if "names no joints" not in x]
    return D.merge(file, from_meta, from_yaml)


class _Reading:
    """``with _Reading(file, step, fix):`` turns any exception but ImportRefused raised while the untrusted
    bytes of ``file`` are read into an ImportRefused naming the step and the exception (type, message cut to one
    line of ~200 characters; the original stays chained as ``__cause__``)."""

    def __init__(self, file, step, fix):
        self.file, self.step, self.fix = file, step, fix

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or isinstance(e, ImportRefused) or not isinstance(e, Exception):
            return False
        raise ImportRefused(self.file, self.step, f"failed ({exc_text(e)})", self.fix) from e


FIX_CORRUPT = ("the file is broken (truncated, modified or not written by an exporter): re-export the policy; if "
               "{runtime} runs the file unchanged, report this with the file")


def _guarded_runtime(file, runtime, what, n_actions):
    """``runtime`` (name, f) whose calls refuse (ImportRefused) instead of raising what the exporter's runtime
    raises on a broken graph, or returning another number of actions than the import's ``n_actions``."""
    from control_node.kernels.importers import proof as P
    name, f = runtime
    fix = FIX_CORRUPT.format(runtime=what)

    def step(x):
        with _Reading(file, f"running the file in {name}", fix):
            out = np.asarray(f(x), dtype=np.float64).reshape(-1)
        if out.shape != (n_actions,):
            raise ImportRefused(file, "proof", f"{name} gives {out.size} actions, the import {n_actions}", fix)
        return out
    if isinstance(f, P.Stateful):
        def reset():
            with _Reading(file, f"resetting the state in {name}", fix):
                return f.reset()
        return name, P.Stateful(step, reset)
    return name, step


def _read_onnx(path, file, max_bytes=MAX_TENSOR_BYTES):
    """(Folded, graph dtype, metadata mapping, source, runtime) of an .onnx file."""
    from control_node.kernels.importers import onnx as O
    from control_node.kernels.importers import proof as P
    fix = FIX_CORRUPT.format(runtime="onnxruntime")
    with _Reading(file, "reading the ONNX graph", fix):
        graph = O.load(path, max_bytes)
    with _Reading(file, "reading the ONNX graph's layers", fix):
        folded = O.fold(graph)
    meta = O.map_metadata(file, graph.metadata, folded.n_features, folded.n_actions)
    source = {"file": file, "sha256": sha256_files(graph.files), "format": "onnx", "opset": graph.opset,
              "producer": graph.producer, "metadata_props": dict(graph.metadata)}
    if len(graph.files) > 1:
        source["external_data"] = [os.path.basename(f) for f in graph.files[1:]]
    folded.dropped += [f"output '{o}' (not the action)" for o in graph.dropped_outputs] + graph.dropped_nodes()
    if folded.state:
        source["state"] = {"carried_by": "the caller (graph inputs / outputs)", **folded.state}
    with _Reading(file, "opening the file in onnxruntime", fix):
        runtime = P.onnx_runtime(graph, graph.dtype)
    return folded, graph.dtype, meta, source, _guarded_runtime(file, runtime, "onnxruntime", folded.n_actions)


def _check_archive(path, file, max_bytes):
    """Refuse a TorchScript archive (a zip) whose entries would inflate past the limits before torch reads it."""
    try:
        with zipfile.ZipFile(path) as z:
            entries = z.infolist()
            _check_entry_sizes(file, entries, max_bytes)
            _check_storages(file, z, entries)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as e:
        if isinstance(e, ImportRefused):
            raise
        return                          # not a readable zip: torch.jit.load refuses it, naming what it read


def _check_entry_sizes(file, entries, max_bytes):
    total = 0
    for i in entries:
        total += i.file_size
        if i.file_size > max_bytes or total > TOTAL_FACTOR * max_bytes:
            raise ImportRefused(file, f"archive entry '{i.filename}'", f"inflates to {fmt_bytes(i.file_size)} (the "
                                f"archive's entries to {fmt_bytes(total)} so far), more than the limit of "
                                f"{fmt_bytes(max_bytes)} per tensor (max_resident_bytes; {TOTAL_FACTOR} x for the "
                                "whole archive); refused before reading it", "a policy's weights must fit in the "
                                "node's policy memory ([lifecycle] max_resident_mb); this file is broken or hostile: "
                                "re-export the policy")


STORAGE_ITEMSIZE = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
                    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
                    "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16}


def _storage_records(data: bytes):
    """The ('storage', type name, key, numel) records a TorchScript pickle (data.pkl, constants.pkl) declares, read
    with an unpickler that builds nothing (every class is a name, nothing is called); [] when it cannot be read."""
    import io
    import pickle

    def _inert(*a, **k):
        return None

    class _Reader(pickle.Unpickler):
        def find_class(self, module, name):       # a fresh inert class named like the global: nothing runs
            return type(str(name), (), {"__init__": _inert, "__setstate__": _inert})

        def persistent_load(self, pid):
            records.append(pid)
            return None
    records = []
    try:
        _Reader(io.BytesIO(data)).load()
    except Exception:
        pass                      # torch refuses what it cannot read; the records read so far are still checked
    out = []
    for pid in records:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            kind = getattr(pid[1], "__name__", str(pid[1]))
            out.append((kind, str(pid[2]), pid[4]))
    return out


def _check_storages(file, z, entries):
    """Refuse storages whose archive record is shorter than the storage torch would build on it (torch does not
    check: reading such a tensor reads past the record and can crash the process)."""
    sizes = {i.filename: i.file_size for i in entries}
    for pkl in [n for n in sizes if n.endswith(("/data.pkl", "/constants.pkl"))]:
        prefix = pkl.rsplit("/", 1)[0]
        for kind, key, numel in _storage_records(z.read(pkl)):
            record = f"{prefix}/data/{key}" if not pkl.endswith("constants.pkl") else f"{prefix}/constants/{key}"
            if record not in sizes:
                continue          # torch refuses a missing record itself
            if not isinstance(numel, int) or numel < 0:
                raise ImportRefused(file, f"archive entry '{record}'", f"its storage declares {numel!r} elements",
                                    FIX_CORRUPT.format(runtime="torch"))
            need = numel * STORAGE_ITEMSIZE.get(kind, 1)
            if sizes[record] < need:
                raise ImportRefused(file, f"archive entry '{record}'", f"holds {fmt_bytes(sizes[record])}, its {kind} "
                                    f"of {numel} elements needs {fmt_bytes(need)} (truncated or modified)",
                                    FIX_CORRUPT.format(runtime="torch"))


def _torch_load(path, file):
    """T.load, its refusal's message rebuilt on one line of ~200 characters from torch's (often long) error."""
    from control_node.kernels.importers import torchscript as T
    try:
        return T.load(path)
    except ImportRefused as e:
        cause = e.__cause__ or e.__context__
        if e.where != "(file)" or not isinstance(cause, Exception):
            raise
        raise ImportRefused(file, "(file)", f"not a TorchScript archive ({exc_text(cause)}); checkpoints and "
                            "state_dicts are not unpickled", e.fix) from cause


def _module_tensors(module):
    """(name, tensor) of every parameter, buffer and tensor constant of a scripted module's forward graphs."""
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        yield name, t
    for path, m in module.named_modules():
        try:
            graph = m.graph
        except (AttributeError, RuntimeError):
            continue
        for node in graph.findAllNodes("prim::Constant"):
            out = node.output()
            if out.type().kind() == "TensorType":
                yield f"constant in {path or '(top)'}'s forward", out.toIValue()


def _check_tensors(file, module, max_bytes):
    """Refuse tensors whose sizes / strides reach outside their storage (torch does not check what its archive
    declares; reading such a tensor reads past the storage and can crash the process) or exceed the limit."""
    import torch
    for name, t in _module_tensors(module):
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_quantized:
            continue
        shape, strides = list(t.shape), list(t.stride())
        item = t.element_size()
        nbytes = math.prod(shape) * item
        if nbytes > max_bytes:
            raise ImportRefused(file, f"tensor '{name}'", f"has shape {shape} ({fmt_bytes(nbytes)}), more than the limit "
                                f"of {fmt_bytes(max_bytes)} per tensor (max_resident_bytes)", "a policy's tensors must "
                                "fit in the node's policy memory ([lifecycle] max_resident_mb); re-export the policy")
        if not nbytes:
            continue
        last = t.storage_offset() + sum((d - 1) * st for d, st in zip(shape, strides))
        first = t.storage_offset() + sum((d - 1) * st for d, st in zip(shape, strides) if st < 0)
        if first < 0 or (last + 1) * item > t.untyped_storage().nbytes():
            raise ImportRefused(file, f"tensor '{name}'", f"shape {shape}, strides {strides}, offset "
                                f"{t.storage_offset()} reach outside its {t.untyped_storage().nbytes()}-byte storage",
                                FIX_CORRUPT.format(runtime="torch"))


def _read_torchscript(path, file, max_bytes=MAX_TENSOR_BYTES):
    """(Folded, weights' dtype, metadata mapping (none), source, runtime) of a TorchScript archive."""
    from control_node.kernels.importers import proof as P
    from control_node.kernels.importers import torchscript as T
    fix = FIX_CORRUPT.format(runtime="torch")
    _check_archive(path, file, max_bytes)
    with _Reading(file, "reading the TorchScript archive", fix):
        module = _torch_load(path, file)
    with _Reading(file, "reading the TorchScript module's tensors", fix):
        _check_tensors(file, module, max_bytes)
    with _Reading(file, "reading the TorchScript module's forward graphs", fix):
        folded, dtype = T.fold(file, module)
        source = T.source(path)
    meta = {"action_names": None, "feature_names": None, "action_offset": 0.0, "action_scale": 1.0, "notes": []}
    if folded.state:
        source["state"] = {"carried_by": "the module's buffers", **folded.state}
    with _Reading(file, "preparing the module to run in torch", fix):
        runtime = P.torch_runtime(module, dtype, tuple(folded.state.get("buffers", {}).values()))
    return folded, dtype, meta, source, _guarded_runtime(file, runtime, "torch", folded.n_actions)


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
    if spec.deploy:
        lines += describe_contract(spec.deploy)
    for d in r.get("dropped", []):
        lines.append(f"  dropped       {d}")
    for w in r.get("warnings", []):
        lines.append(f"  warning       {w}")
    seqs = f" in {len(proof['sequences'])} sequences (state carried)" if proof.get("sequences") else ""
    # edge samples: where clips, saturations and squashes act (proof.edge_samples)
    edges = f" + {proof['edge_samples']} edge samples" if proof.get("edge_samples") else ""
    lines.append(f"proved against {proof['reference']} on {proof['samples']} observations{edges}{seqs}: max |error| "
                 f"{proof['max_abs_err']:.3g} (tolerance {proof['tolerance']})")
    if proof.get("weights"):
        from control_node.kernels.weights import describe as describe_weights
        lines.append(f"weights       {describe_weights(proof['weights'])}")
    k = proof.get("kernel")
    if isinstance(k, dict):
        kedges = f" + {k['edge_samples']} edge samples" if k.get("edge_samples") else ""
        lines.append(f"compiled kernel matches the numpy reference on {k['samples']} observations{kedges} "
                     f"(rtol {k['rtol']:g})")
    else:
        lines.append(f"compiled kernel: {k}")
    return "\n".join(lines)


def describe_contract(deploy) -> list:
    """Lines naming what the deploy contract holds and where each value came from (for the CLI)."""
    r, src = deploy.get("recipe", {}), deploy.get("from", {})
    keys = src.get("keys", {})
    lines = [f"  deploy        contract from {src.get('exporter', '?')} ({src.get('file', '?')}):"]
    terms = r.get("observation", {}).get("terms")
    for dotted in sorted(keys):
        sec, _, sub = dotted.partition(".")
        v = r.get(sec, {}).get(sub) if sub else r.get(sec)
        if dotted == "observation.terms" and terms:
            v = ", ".join(t.get("name", t["kind"]) + (f"->{t['kind']}" if t.get("name") != t["kind"] else "")
                          + (f" x{t['history']}" if t.get("history", 1) > 1 else "") for t in terms)
        elif dotted == "joints.policy" and v:
            v = f"{len(v)} joints ({v[0]}, ..., {v[-1]})"
        elif isinstance(v, list) and len(v) > 4:
            v = "[" + ", ".join(f"{x:g}" for x in v[:3]) + f", ... ({len(v)})]" if all(
                isinstance(x, (int, float)) for x in v) else f"{len(v)} values"
        lines.append(f"    {dotted:<22}{v}  <- {keys[dotted]}")
    for note in src.get("notes", []):
        lines.append(f"    note: {note}")
    return lines
