"""Plain numpy reference of the policy, and the proof that the kernel matches it.

The reference is the specification (kernels/model_file.py's docstring says what each step computes):
the compiled kernel must give the same argmax on every check sample, the last layer's outputs within
a dtype-appropriate tolerance, and continuous actions within that tolerance after the head.

Recurrent policies (``spec.recurrent``) are run as sequences with the state carried from step to step
(:func:`reference_sequence`); :func:`check_consistency` then compares the kernel step by step.
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


def dense_stack(spec, h) -> np.ndarray:
    """The dense layers on ``h`` (n, n_in of the first dense layer) in ``spec.dtype``."""
    with np.errstate(over="ignore", invalid="ignore"):
        for (W, b), name, alpha in zip(spec.layers, spec.activations, spec.alphas):
            h = activate(name, h @ W + b, alpha)
    return h


def reference_logits(spec, X) -> np.ndarray:
    """The last layer's outputs (n, n_outputs) in ``spec.dtype`` for raw inputs ``X`` (n, n_features)
    float64: the logits of an argmax policy, the pre-head outputs of a continuous one.

    Pre-processing is computed in float64 and then cast, exactly as the kernel does. A recurrent policy's
    rows are one sequence from the zero state (see :func:`reference_sequence`).
    """
    if getattr(spec, "recurrent", None):
        return run_sequence(spec, X)["outputs"]
    return dense_stack(spec, preprocess(spec, X))


# ---- recurrent layer ------------------------------------------------------------------------------------
def zero_state(spec):
    """The reset state ``(h, c)`` in ``spec.dtype`` (``c`` is None for a GRU)."""
    H, dt = spec.hidden_size, np.dtype(spec.dtype)
    return np.zeros(H, dtype=dt), (np.zeros(H, dtype=dt) if spec.recurrent == "lstm" else None)


def rnn_step(spec, z, h, c=None):
    """One step of the recurrent layer in ``spec.dtype`` (torch's definitions, gate order and layout).

    ``z``: the pre-processed observation (n_features,), ``h`` / ``c``: the state (H,) (``c`` None for a GRU).
    Returns the new ``(h, c)`` (not checked for finiteness: :func:`run_sequence` does that)."""
    H = spec.hidden_size
    with np.errstate(over="ignore", invalid="ignore"):
        gx = spec.rnn_W_ih @ z + spec.rnn_b_ih
        gh = spec.rnn_W_hh @ h + spec.rnn_b_hh
        if spec.recurrent == "lstm":
            g = gx + gh
            i = activate("sigmoid", g[:H])
            f = activate("sigmoid", g[H:2 * H])
            gg = np.tanh(g[2 * H:3 * H])
            o = activate("sigmoid", g[3 * H:])
            c = f * c + i * gg
            return o * np.tanh(c), c
        if spec.recurrent == "gru":
            r = activate("sigmoid", gx[:H] + gh[:H])
            u = activate("sigmoid", gx[H:2 * H] + gh[H:2 * H])
            n = np.tanh(gx[2 * H:] + r * gh[2 * H:])
            one = np.ones((), dtype=h.dtype)
            return (one - u) * n + u * h, None
    raise ValueError(f"recurrent {spec.recurrent!r} is not 'lstm' or 'gru'")


def _state_in(spec, h0):
    h, c = zero_state(spec)
    if h0 is None:
        return h, c
    dt = np.dtype(spec.dtype)
    if isinstance(h0, tuple):
        h = np.array(h0[0], dtype=dt).reshape(-1)
        if c is not None and len(h0) > 1 and h0[1] is not None:
            c = np.array(h0[1], dtype=dt).reshape(-1)
    else:
        h = np.array(h0, dtype=dt).reshape(-1)
    return h, c


def run_sequence(spec, X, h0=None, resets=()) -> dict:
    """Run the rows of ``X`` (T, n_features) float64 as one sequence, the state carried from step to step.

    ``h0``: the initial state (``h``, or ``(h, c)``; default zero); ``resets``: step indices before which
    the state is zeroed (what ``Policy.reset()`` between two steps does). A step whose new state is not
    finite resets the state to zero and has no action: its ``status`` is -1, its outputs NaN and its
    actions NaN (continuous) / -1 (argmax); a step whose outputs or actions are not finite (state kept)
    has status -1 and the same NaN actions. Returns ``{"outputs" (T, n_out) dtype, "actions" (T,
    n_actions) float64, "status" (T,) int, "state" (h, c), "state_resets" int}``.
    A policy without a recurrent layer runs each row on its own (status -1 where not finite).
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[None, :]
    Z = preprocess(spec, X)
    T = len(X)
    if not getattr(spec, "recurrent", None):
        out = dense_stack(spec, Z)
        act = apply_head(spec, out)
        ok = np.isfinite(out).all(axis=1) & np.isfinite(act).all(axis=1)
        act[~ok] = np.nan if spec.head == "continuous" else -1.0
        return {"outputs": out, "actions": act, "status": np.where(ok, 0, -1), "state": (None, None),
                "state_resets": 0}
    h, c = _state_in(spec, h0)
    resets = set(int(r) for r in resets)
    n_out = spec.layers[-1][0].shape[1]
    outputs = np.full((T, n_out), np.nan, dtype=np.dtype(spec.dtype))
    actions = np.full((T, spec.n_actions), np.nan if spec.head == "continuous" else -1.0)
    status = np.zeros(T, dtype=np.int64)
    n_resets = 0
    for t in range(T):
        if t in resets:
            h, c = zero_state(spec)
        h2, c2 = rnn_step(spec, Z[t], h, c)
        if not (np.isfinite(h2).all() and (c2 is None or np.isfinite(c2).all())):
            h, c = zero_state(spec)
            status[t] = -1
            n_resets += 1
            continue
        h, c = h2, c2
        out = dense_stack(spec, h[None, :])
        act = apply_head(spec, out)
        outputs[t] = out[0]
        if np.isfinite(out).all() and np.isfinite(act).all():
            actions[t] = act[0]
        else:
            status[t] = -1
    return {"outputs": outputs, "actions": actions, "status": status, "state": (h.copy(), None if c is None
                                                                                  else c.copy()),
            "state_resets": n_resets}


def reference_sequence(spec, X, h0=None):
    """Actions (T, n_actions) float64 for the rows of ``X`` (T, n_features) run as one sequence from ``h0``
    (default: the zero state), and the final state ``(h, c)`` (``c`` None for a GRU). Steps without an action
    (the state or the outputs not finite) are NaN rows (continuous) / -1 (argmax). See :func:`run_sequence`."""
    r = run_sequence(spec, X, h0=h0)
    return r["actions"], r["state"]


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
    """float64 actions (n, n_actions) after the head: what ``Policy.act`` must give (a recurrent policy's
    rows are one sequence from the zero state: :func:`reference_sequence`)."""
    if getattr(spec, "recurrent", None):
        return run_sequence(spec, X)["actions"]
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


#: recurrent policies: random sequences checked by default (3 x 200 steps, a reset in the middle of the
#: second), and the length of the sequences given rows (check_X, X) are cut into
RNN_SEQUENCES, RNN_STEPS, RNN_CHUNK = 3, 200, 300


def _as_stored(policy, spec):
    """The spec the kernel computes: its weights as the policy stores them (kernels.weights.effective_spec),
    so a narrow storage is checked against the reference as tightly as float32 is."""
    from control_node.kernels.weights import effective_spec
    return effective_spec(spec, getattr(policy, "weights", None))


def check_consistency(policy, spec, X=None, n_random=None, seed=0) -> dict:
    """Compare the kernel with the reference on the check samples and on random inputs.

    An argmax difference counts only where the reference's own margin between the
    two classes exceeds the logit tolerance (a true near-tie may round either way).
    Returns counts; raises :class:`ConsistencyError` naming the first bad sample.
    ``n_random`` defaults to 2000 samples (recurrent: 3 sequences of 200 steps).

    Recurrent policies are compared step by step over sequences with the state carried (see
    :func:`check_sequences`); the policy is left reset.
    """
    if getattr(spec, "recurrent", None):
        return check_sequences(policy, spec, X=X, n_random=RNN_SEQUENCES * RNN_STEPS if n_random is None
                               else n_random, seed=seed)
    spec = _as_stored(policy, spec)
    if n_random is None:
        n_random = 2000
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


def check_sequences(policy, spec, X=None, n_random=RNN_SEQUENCES * RNN_STEPS, seed=0) -> dict:
    """:func:`check_consistency` for a recurrent policy: the kernel against :func:`run_sequence` step by step.

    Sequences: the given rows ``X`` (else ``spec.check_X``) cut into sequences of ``RNN_CHUNK`` steps, then
    ``n_random`` random steps as sequences of ``RNN_STEPS`` (the second, or the only one, with a reset in its
    middle). Each sequence starts from ``policy.reset()``; the state is carried between steps by the kernel
    and by the reference independently. Each step's last-layer outputs must agree within
    ``RTOL[dtype] * max(1, max |output|)``, its actions within that times ``|action_scale|``, and its status
    (a step without an action: state or outputs not finite) exactly. Raises :class:`ConsistencyError` naming
    the sequence and the first differing step; leaves the policy reset.
    """
    spec = _as_stored(policy, spec)
    seqs = []
    given = X if X is not None else spec.check_X
    name = "given" if X is not None else "check_X"
    if given is not None and len(given):
        given = np.asarray(given, dtype=np.float64)
        for k, i in enumerate(range(0, len(given), RNN_CHUNK)):
            seqs.append((f"{name} sequence {k} (rows {i}..{min(i + RNN_CHUNK, len(given)) - 1})",
                         given[i:i + RNN_CHUNK], ()))
    n_random = int(n_random)
    if n_random > 0:
        Xr = random_inputs(spec, n_random, seed)
        chunks = [Xr[i:i + RNN_STEPS] for i in range(0, n_random, RNN_STEPS)]
        mid = 1 if len(chunks) > 1 else 0
        for k, Xs in enumerate(chunks):
            resets = (len(Xs) // 2,) if k == mid and len(Xs) > 1 else ()
            seqs.append((f"random sequence {k}" + (f" (reset before step {resets[0]})" if resets else ""), Xs, resets))
    rtol = RTOL[spec.dtype]
    continuous = spec.head == "continuous"
    checked = 0
    out = np.zeros(policy.n_actions)
    try:
        for name, Xs, resets in seqs:
            ref = run_sequence(spec, Xs, resets=resets)
            policy.reset()
            for t in range(len(Xs)):
                if t in resets:
                    policy.reset()
                x = np.ascontiguousarray(Xs[t])
                rc = policy.act_into(x, out)
                st = 0 if (rc >= 0) else -1
                where = f"kernel and numpy reference differ on {name}, step {t} (x={Xs[t].tolist()})"
                if st != ref["status"][t]:
                    raise ConsistencyError(f"{where}: the kernel's step status is {st}, the reference's "
                                           f"{int(ref['status'][t])} (-1: state or outputs not finite)")
                if st < 0:
                    continue
                want = ref["outputs"][t].astype(np.float64)
                got = policy.last_outputs().astype(np.float64)
                tol = rtol * max(1.0, float(np.abs(want).max()))
                err = float(np.abs(got - want).max())
                if not err <= tol:
                    raise ConsistencyError(f"{where}: max |output difference| {err:.3g} > tolerance {tol:.3g}")
                if continuous:
                    tol_u = tol * np.abs(spec.action_scale) + 4 * np.finfo(np.float64).eps * np.abs(ref["actions"][t])
                    bad = np.flatnonzero(~(np.abs(out - ref["actions"][t]) <= tol_u))
                    if bad.size:
                        j = int(bad[0])
                        raise ConsistencyError(f"{where}: action {j} ({spec.action_names[j]}) {out[j]!r} vs "
                                               f"reference {ref['actions'][t, j]!r} (tolerance {tol_u[j]:.3g})")
                else:
                    k_got, k_ref = int(out[0]), int(ref["actions"][t, 0])
                    if k_got != k_ref and want[k_ref] - want[k_got] > tol:
                        raise ConsistencyError(f"{where}: argmax {k_got} vs reference {k_ref} "
                                               f"(margin {want[k_ref] - want[k_got]:.3g})")
            checked += len(Xs)
    finally:
        policy.reset()
    return {"checked": checked, "rtol": rtol, "sequences": len(seqs)}
