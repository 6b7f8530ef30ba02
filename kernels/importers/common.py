"""What every importer shares: the refusal, the folding of recognised steps into dense layers, hashing.

An importer reads its format and calls :class:`Builder` once per step it recognises, in the order the
policy computes them (normaliser ops, an LSTM / GRU layer, dense layers, activations, column selections,
a clip on the action). The builder checks that the sequence is one the model file can hold (see
kernels/model_file.py: ``(x - mean) / scale``, then optionally one recurrent layer, then
``act_l(h @ W_l + b_l)``, then the head ``tanh`` / ``clip``) and refuses anything else with the step's
name in the message.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from control_node.kernels.model_file import MAX_FILE_BYTES, fmt_bytes  # noqa: F401  (one definition: there)

#: the most bytes one tensor of an imported file may take (what the importer materialises is checked
#: against it before it is allocated): the node's policy memory bound, [lifecycle] max_resident_mb
#: (control_node/config.py), 256 MiB by default, the same bound as a model file's (model_file.MAX_FILE_BYTES).
#: A policy's weights must fit in it to be resident at all.
MAX_TENSOR_BYTES = MAX_FILE_BYTES
#: all the tensors the importer materialises for one file together: at most this many times the limit
TOTAL_FACTOR = 4


def one_line(text) -> str:
    """``text`` with its line breaks (and the blanks around them) collapsed to one space."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


def exc_text(e, limit=200) -> str:
    """``TypeName: message`` of an exception on one line, cut to about ``limit`` characters."""
    msg = one_line(e)
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


class ImportRefused(ValueError):
    """An exported policy cannot be imported exactly. Nothing is written: there are no partial imports.

    ``where`` names the node / submodule / field, ``problem`` says what is wrong (and what is supported),
    ``fix`` says what to do about it. The message is one line (line breaks in the parts are collapsed).
    """

    def __init__(self, file, where, problem, fix):
        self.file, self.where, self.problem, self.fix = str(file), where, problem, fix
        super().__init__(one_line(f"cannot import {file}: {where}: {problem}. Fix: {fix}"))


def sha256_files(paths) -> str:
    """SHA-256 over the bytes of ``paths`` in the given order (the model file, then its data files)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def per_feature(c, n):
    """``c`` as a float64 vector of length ``n`` when it is a scalar or shaped (1, ..., 1, n or 1), else None."""
    a = np.asarray(c, dtype=np.float64)
    if a.ndim and (any(d != 1 for d in a.shape[:-1]) or a.shape[-1] not in (1, n)):
        return None
    return np.ascontiguousarray(np.broadcast_to(a.reshape(-1) if a.ndim else a, (n,)))


def _bound(v):
    return f"{v[0]:g}" if (v == v[0]).all() else "per-action bounds"


@dataclass
class Folded:
    """The recognised policy in model-file terms (float64 arrays; W shaped (n_in, n_out))."""

    n_features: int
    layers: list
    activations: list
    alphas: list
    mean: np.ndarray | None
    scale: np.ndarray | None
    squash: bool
    action_low: np.ndarray
    action_high: np.ndarray
    layer_notes: list = field(default_factory=list)     # one line per dense layer: where it came from
    normaliser: str | None = None                       # what the in-graph normaliser was, if any
    head: str = ""                                       # what the head was
    dropped: list = field(default_factory=list)          # branches / outputs that were left out
    recurrent: str | None = None                         # "lstm" / "gru": the recurrent layer, if any
    rnn: dict | None = None                              # its rnn_W_ih, rnn_W_hh, rnn_b_ih, rnn_b_hh (torch layout)
    rnn_note: str = ""                                   # where it came from
    state: dict = field(default_factory=dict)            # how the format carries the state (names, buffers)
    norm_clip: tuple | None = None                       # (low, high) clip of the normalised observation
    warnings: list = field(default_factory=list)         # what the import's output must tell the user

    def rnn_fields(self) -> dict:
        """The ModelSpec keyword arguments of the recurrent layer (empty without one)."""
        return {"recurrent": self.recurrent, **(self.rnn or {})} if self.recurrent else {}

    @property
    def n_actions(self) -> int:
        return self.layers[-1][0].shape[1]


class Builder:
    """Folds a sequence of recognised steps into :class:`Folded`; refuses any sequence it cannot hold.

    Stages: ``input`` (before the first dense layer: only normaliser steps), ``pre`` (after a dense
    layer, before its activation: a bias may be added), ``post`` (after an activation), ``clipped``
    (after the clip on the action: nothing but no-ops).
    """

    SUPPORTED = ("elu", "relu", "selu", "leaky_relu", "celu", "tanh", "sigmoid", "softplus", "silu")

    def __init__(self, file, n_features):
        self.file = file
        self.width = int(n_features)
        self.n_features = int(n_features)
        self.layers, self.acts, self.alphas, self.layer_notes = [], [], [], []
        self.mean = self.scale = None
        self.norm_ops = []
        self.stage = "input"
        self.low = self.high = None
        self.head_notes = []
        self.recurrent = self.rnn = None
        self.rnn_note = ""
        self.norm_clip = None

    def refuse(self, where, problem, fix):
        raise ImportRefused(self.file, where, problem, fix)

    def _vector(self, c, where, what):
        v = per_feature(c, self.width)
        if v is None:
            self.refuse(where, f"its {what} has shape {list(np.shape(c))}, which does not broadcast to the "
                        f"{self.width} values it is applied to (dimension mismatch)",
                        "re-export the policy; the importer maps per-feature or scalar constants only")
        if not np.isfinite(v).all():
            i = int(np.flatnonzero(~np.isfinite(v))[0])
            self.refuse(where, f"its {what} is NaN or Inf (first at index {i})", "re-export a trained policy")
        return v

    # -- observation normaliser: (x - mean) / scale -------------------------------------------------
    def _normaliser_stage(self, where, op):
        if self.norm_clip is not None:
            self.refuse(where, f"{op} after the clip of the observation: the model file clips (x - mean) / scale "
                        "last", "export the normaliser as clip((x - mean) / std, lo, hi)")
        if self.stage == "rnn":
            self.refuse(where, f"{op} on the recurrent layer's output is not supported (only the observation is "
                        "normalised, before the recurrent layer; a dense layer must follow it)",
                        "export the policy as normaliser -> LSTM / GRU -> MLP")
        if self.stage != "input":
            self.refuse(where, f"{op} after the first dense layer is not supported (only as the input "
                        "normaliser Sub(x, mean) then Div(., std) or Mul(., 1/std), or as a bias Add after "
                        "a dense layer)", "export the plain MLP; fold the constant into the layer before exporting")

    def sub_mean(self, c, where):
        self._normaliser_stage(where, "Sub")
        if self.mean is not None or self.scale is not None:
            self.refuse(where, "a second offset, or an offset after the scale: the importer maps "
                        "(x - mean) / std only", "export the normaliser as Sub then Div")
        self.mean = self._vector(c, where, "mean")
        self.norm_ops.append(f"{where}: subtract mean")

    def div_scale(self, d, where):
        self._normaliser_stage(where, "Div")
        if self.scale is not None:
            self.refuse(where, "a second scale on the input", "export the normaliser as Sub then Div")
        d = self._vector(d, where, "divisor")
        if (d == 0).any():
            self.refuse(where, f"divides feature {int(np.flatnonzero(d == 0)[0])} by 0", "re-export the normaliser")
        self.scale = d
        self.norm_ops.append(f"{where}: divide by std (+eps)")

    def mul_scale(self, s, where):
        self._normaliser_stage(where, "Mul")
        if self.scale is not None:
            self.refuse(where, "a second scale on the input", "export the normaliser as Sub then Mul")
        s = self._vector(s, where, "factor")
        if (s == 0).any():
            self.refuse(where, f"multiplies feature {int(np.flatnonzero(s == 0)[0])} by 0, which no "
                        "(x - mean) / scale can express", "re-export the normaliser")
        self.scale = 1.0 / s
        self.norm_ops.append(f"{where}: multiply by 1/std")

    # -- recurrent layer ---------------------------------------------------------------------------
    def recurrent_layer(self, kind, W_ih, W_hh, b_ih, b_hh, where, note):
        """One LSTM / GRU layer on the (normalised) observation, in torch's layout and gate order
        (W_ih (G*H, n_in), W_hh (G*H, H), b_ih / b_hh (G*H,) or None; LSTM i,f,g,o, GRU r,z,n)."""
        from control_node.kernels.model_file import RECURRENT
        if self.recurrent is not None:
            self.refuse(where, f"a second recurrent layer (after {self.rnn_note}): the kernel runs one (num_layers=1)",
                        "export a policy with one LSTM / GRU layer (rnn_num_layers=1)")
        if self.stage != "input":
            self.refuse(where, f"a {kind.upper()} after a dense layer: the kernel runs the recurrent layer on the "
                        "(normalised) observation, before the dense layers", "export normaliser -> LSTM / GRU -> MLP")
        G = len(RECURRENT[kind])
        W_ih, W_hh = np.asarray(W_ih, dtype=np.float64), np.asarray(W_hh, dtype=np.float64)
        if W_hh.ndim != 2 or W_hh.shape[0] != G * W_hh.shape[1]:
            self.refuse(where, f"hidden weights have shape {list(W_hh.shape)}, expected [{G} * H, H]",
                        "re-export the policy")
        H = W_hh.shape[1]
        if W_ih.ndim != 2 or W_ih.shape[0] != G * H:
            self.refuse(where, f"input weights have shape {list(W_ih.shape)}, expected [{G * H}, n_in]",
                        "re-export the policy")
        if W_ih.shape[1] != self.width:
            self.refuse(where, f"dimension mismatch: the {kind.upper()} takes {W_ih.shape[1]} inputs but the value it "
                        f"is applied to has {self.width}", "re-export the policy (the graph is inconsistent)")
        biases = []
        for name, b in (("input bias", b_ih), ("hidden bias", b_hh)):
            b = np.zeros(G * H) if b is None else np.asarray(b, dtype=np.float64).reshape(-1)
            if b.shape != (G * H,):
                self.refuse(where, f"{name} has {b.size} values, expected {G * H}", "re-export the policy")
            biases.append(b)
        for name, a in (("input weights", W_ih), ("hidden weights", W_hh), ("input bias", biases[0]),
                        ("hidden bias", biases[1])):
            if not np.isfinite(a).all():
                self.refuse(where, f"{name} contain NaN or Inf", "re-export a trained policy")
        self.recurrent = kind
        self.rnn = {"rnn_W_ih": W_ih, "rnn_W_hh": W_hh, "rnn_b_ih": biases[0], "rnn_b_hh": biases[1]}
        self.rnn_note = note
        self.width = H
        self.stage = "rnn"

    # -- dense layers ------------------------------------------------------------------------------
    def dense(self, W, b, where, note):
        """A dense layer ``h @ W + b``; W (n_in, n_out) float64, b (n_out,) or None."""
        if self.stage == "clipped":
            self.refuse(where, "a dense layer after the Clip: only a Clip on the action output maps "
                        "(to action_low / action_high)", "clip the action outside the policy, or after it")
        W = np.asarray(W, dtype=np.float64)
        if W.ndim != 2:
            self.refuse(where, f"weight has shape {list(W.shape)}, expected 2-D", "export a plain dense layer")
        if W.shape[0] != self.width:
            self.refuse(where, f"dimension mismatch: the weight takes {W.shape[0]} inputs but the value it is "
                        f"applied to has {self.width}", "re-export the policy (the graph is inconsistent)")
        n_out = W.shape[1]
        b = np.zeros(n_out) if b is None else self._vector_out(b, n_out, where)
        if not np.isfinite(W).all():
            self.refuse(where, "weight contains NaN or Inf", "re-export a trained policy")
        if self.stage == "pre":                          # two dense layers in a row: the first is linear
            self.acts.append("identity")
            self.alphas.append(0.0)
        self.layers.append([W, b])
        self.layer_notes.append(note)
        self.width = n_out
        self.stage = "pre"

    def _vector_out(self, c, n, where):
        v = per_feature(c, n)
        if v is None:
            self.refuse(where, f"bias has shape {list(np.shape(c))}, expected ({n},) (dimension mismatch)",
                        "re-export the policy")
        if not np.isfinite(v).all():
            self.refuse(where, "bias contains NaN or Inf", "re-export a trained policy")
        return v

    def bias(self, c, where):
        if self.stage == "rnn":
            self.refuse(where, "Add on the recurrent layer's output: only a dense layer may follow it",
                        "export the policy as normaliser -> LSTM / GRU -> MLP")
        if self.stage == "input":          # Add(x, c) on the input = Sub(x, -c)
            self.sub_mean(-np.asarray(c, dtype=np.float64), where)
            return
        if self.stage != "pre":
            self.refuse(where, "Add after an activation (a residual or an offset) is not supported: an Add "
                        "maps only as the bias right after MatMul/Gemm", "export a plain MLP")
        self.layers[-1][1] = self.layers[-1][1] + self._vector_out(c, self.width, where)

    def activation(self, name, alpha, where):
        if name not in self.SUPPORTED:
            self.refuse(where, f"activation {name!r} is not supported (supported: {', '.join(self.SUPPORTED)})",
                        "retrain or export with a supported activation")
        if self.stage == "input":
            self.refuse(where, f"{name} before the first dense layer is not supported",
                        "export the plain MLP (normaliser, dense layers, activations)")
        if self.stage == "rnn":
            self.refuse(where, f"{name} on the recurrent layer's output before any dense layer is not supported",
                        "export the policy as normaliser -> LSTM / GRU -> MLP")
        if self.stage == "post":
            self.refuse(where, f"a second activation ({name}) after '{self.acts[-1]}' on the same layer: the "
                        "kernel applies one activation per dense layer (mish and gelu export as several ops)",
                        "use one of: " + ", ".join(self.SUPPORTED))
        if self.stage == "clipped":
            self.refuse(where, f"{name} after the Clip: the head applies tanh, then the clip",
                        "export the policy with the Clip last")
        self.acts.append(name)
        self.alphas.append(float(alpha))
        self.stage = "post"

    # -- head --------------------------------------------------------------------------------------
    def select(self, idx, where, note):
        """Keep output columns ``idx`` of the last dense layer (Split / Slice / Gather on the last axis).

        Exact: everything after the last dense layer is elementwise."""
        if self.stage in ("input", "rnn"):
            self.refuse(where, "selects values before the first dense layer",
                        "export the policy on the observation it uses")
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        W, b = self.layers[-1]
        self.layers[-1] = [W[:, idx], b[idx]]
        if self.low is not None:
            self.low, self.high = self.low[idx], self.high[idx]
        self.width = len(idx)
        self.head_notes.append(note)

    def clip(self, lo, hi, where):
        if self.stage == "input":
            return self.obs_clip(lo, hi, where)
        if self.stage == "rnn":
            self.refuse(where, "Clip on the recurrent state is not recognised in the graph",
                        "export the policy as normaliser -> LSTM / GRU -> MLP")
        if self.stage == "clipped":
            self.refuse(where, "a second Clip on the action", "export one Clip on the action output")
        lo = np.full(self.width, -np.inf) if lo is None else self._vector(lo, where, "min")
        hi = np.full(self.width, np.inf) if hi is None else self._vector(hi, where, "max")
        if (lo > hi).any():
            self.refuse(where, "min > max", "re-export the Clip")
        if self.stage == "pre":
            self.acts.append("identity")
            self.alphas.append(0.0)
        self.low, self.high = lo, hi
        self.stage = "clipped"
        self.head_notes.append(f"{where}: clip to [{_bound(lo)}, {_bound(hi)}]")

    def obs_clip(self, lo, hi, where):
        """A clip of the normalised observation, clip((x - mean) / scale, lo, hi): the model file's norm_clip."""
        if self.norm_clip is not None:
            self.refuse(where, "a second clip on the observation", "export one clip in the normaliser")
        lo = np.full(self.width, -np.inf) if lo is None else self._vector(lo, where, "min")
        hi = np.full(self.width, np.inf) if hi is None else self._vector(hi, where, "max")
        if (lo > hi).any():
            self.refuse(where, "min > max", "re-export the clip")
        self.norm_clip = (lo, hi)
        self.norm_ops.append(f"{where}: clip the normalised observation to [{_bound(lo)}, {_bound(hi)}]")

    def finish(self, where) -> Folded:
        if not self.layers:
            self.refuse(where, "no dense layer (Gemm, MatMul or Linear) was found on the way to the action"
                        + (" after the recurrent layer" if self.recurrent else ""), "export an MLP policy")
        if self.stage == "pre":
            self.acts.append("identity")
            self.alphas.append(0.0)
        squash = False
        if self.acts[-1] == "tanh":                      # tanh on the output = the squashing head
            self.acts[-1], self.alphas[-1] = "identity", 0.0
            squash = True
            self.head_notes.insert(0, "tanh on the action (squash)")
        n = self.width
        low = self.low if self.low is not None else np.full(n, -np.inf)
        high = self.high if self.high is not None else np.full(n, np.inf)
        normaliser = "; ".join(self.norm_ops) or None
        head = "continuous: " + ("; ".join(self.head_notes) if self.head_notes else "identity (the last layer's output)")
        return Folded(n_features=self.n_features, layers=[tuple(wb) for wb in self.layers], activations=self.acts,
                      alphas=self.alphas, mean=self.mean, scale=self.scale, squash=squash, action_low=low,
                      action_high=high, layer_notes=self.layer_notes, normaliser=normaliser, head=head,
                      recurrent=self.recurrent, rnn=self.rnn, rnn_note=self.rnn_note, norm_clip=self.norm_clip)
