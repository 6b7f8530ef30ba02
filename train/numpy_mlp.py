"""The reference training loop: a plain numpy MLP (ReLU hidden layers, softmax cross-entropy, Adam).

Deterministic for a given seed: same data and seed give bit-identical weights.
"""
from __future__ import annotations

import numpy as np


def init_layers(sizes, rng, dtype=np.float64):
    """He-initialised ``[(W (n_in, n_out), b (n_out,)), ...]`` for ``sizes = [n_in, ..., n_out]``."""
    return [(rng.normal(0.0, np.sqrt(2.0 / n_in), size=(n_in, n_out)).astype(dtype),
             np.zeros(n_out, dtype=dtype))
            for n_in, n_out in zip(sizes[:-1], sizes[1:])]


def forward(layers, Xn):
    """Hidden activations (list, input first) and logits for normalised inputs ``Xn`` (n, d)."""
    acts = [Xn]
    h = Xn
    for i, (W, b) in enumerate(layers):
        h = h @ W + b
        if i + 1 < len(layers):
            h = np.maximum(h, 0.0)
            acts.append(h)
    return acts, h


def train_mlp(Xn, y, hidden=(16,), n_classes=None, epochs=400, lr=0.01, batch=16,
              weight_decay=1e-4, seed=0):
    """Fit an MLP on normalised ``Xn`` (n, d) float64 and integer labels ``y`` (n,).

    Returns ``[(W, b), ...]`` in float64. Mini-batch Adam on softmax cross-entropy.
    """
    rng = np.random.default_rng(seed)
    n, d = Xn.shape
    n_classes = int(y.max()) + 1 if n_classes is None else n_classes
    layers = init_layers([d, *hidden, n_classes], rng)
    params = [p for layer in layers for p in layer]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    onehot = np.eye(n_classes)[y]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch):
            idx = order[start:start + batch]
            acts, logits = forward(layers, Xn[idx])
            z = logits - logits.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            delta = (p - onehot[idx]) / len(idx)
            grads = []
            for i in range(len(layers) - 1, -1, -1):
                W, _ = layers[i]
                gW = acts[i].T @ delta + weight_decay * W
                gb = delta.sum(axis=0)
                grads = [gW, gb] + grads
                if i:
                    delta = (delta @ W.T) * (acts[i] > 0)
            step += 1
            for k, g in enumerate(grads):
                m[k] = beta1 * m[k] + (1 - beta1) * g
                v[k] = beta2 * v[k] + (1 - beta2) * g * g
                mhat = m[k] / (1 - beta1 ** step)
                vhat = v[k] / (1 - beta2 ** step)
                params[k] -= lr * mhat / (np.sqrt(vhat) + eps)
    return [(params[2 * i], params[2 * i + 1]) for i in range(len(layers))]
