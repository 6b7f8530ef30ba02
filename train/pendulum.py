"""Train a continuous pendulum policy in seconds: imitate the expert (energy swing-up + LQR balance).

``control-node train --task pendulum`` lands here. Behaviour cloning with DAgger: states are drawn
uniformly over the whole state space, then from rollouts of the policy itself (labelled by the expert),
so the policy learns to recover from the states it visits. The network is the SB3 PPO shape,
3 -> 64 -> 64 -> 1 tanh, with a tanh-squashed head scaled to the torque limit (2 N m): the model file
is the same continuous format an imported policy has.
"""
from __future__ import annotations

import os

import numpy as np

from control_node.kernels.model_file import ModelSpec, save_model
from control_node.kernels.reference import check_consistency
from control_node.sim import pendulum as P

DEFAULT_OUT = os.path.join("models", "pendulum.npz")


def _init(sizes, rng):
    return [(rng.normal(0, np.sqrt(1.0 / a), (a, b)), np.zeros(b)) for a, b in zip(sizes[:-1], sizes[1:])]


def _forward(layers, X):
    acts, h = [X], X
    for i, (W, b) in enumerate(layers):
        h = h @ W + b
        if i + 1 < len(layers):
            h = np.tanh(h)
            acts.append(h)
    return acts, np.tanh(h)            # the squashed head, before the torque scale


def fit(layers, X, y, epochs, rng, lr=3e-3, batch=256):
    """Adam on MSE between the squashed output and ``y`` (torque / limit, in [-1, 1])."""
    params = [p for layer in layers for p in layer]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(X))
        for s in range(0, len(X), batch):
            idx = order[s:s + batch]
            acts, out = _forward(layers, X[idx])
            delta = 2 * (out - y[idx, None]) * (1 - out ** 2) / len(idx)
            grads = []
            for i in range(len(layers) - 1, -1, -1):
                W, _ = layers[i]
                grads = [acts[i].T @ delta, delta.sum(axis=0)] + grads
                if i:
                    delta = (delta @ W.T) * (1 - acts[i] ** 2)
            step += 1
            for k, g in enumerate(grads):
                m[k] = 0.9 * m[k] + 0.1 * g
                v[k] = 0.999 * v[k] + 0.001 * g * g
                params[k] -= lr * (m[k] / (1 - 0.9 ** step)) / (np.sqrt(v[k] / (1 - 0.999 ** step)) + 1e-8)
    return [(params[2 * i], params[2 * i + 1]) for i in range(len(layers))]


def to_spec(layers, mean, scale, dtype="float32", check_X=None) -> ModelSpec:
    return ModelSpec(layers=layers, mean=mean, scale=scale, classes=[], feature_names=P.OBS_NAMES, dtype=dtype,
                     activations=["tanh"] * (len(layers) - 1) + ["identity"], head="continuous", squash=True,
                     action_scale=P.MAX_TORQUE, action_names=["torque"], check_X=check_X,
                     trainer="numpy behaviour cloning + DAgger (pendulum expert)",
                     source={"task": "pendulum", "expert": "energy swing-up + LQR"})


def train_pendulum(hidden=(64, 64), dtype="float32", seed=0, dagger_rounds=4, log=None):
    """Returns a verified-ready continuous :class:`ModelSpec` and its offline scores from 4 starts."""
    rng = np.random.default_rng(seed)
    n0 = 40000
    theta = rng.uniform(-np.pi, np.pi, n0)
    omega = rng.uniform(-P.MAX_SPEED, P.MAX_SPEED, n0)
    X = np.stack([np.cos(theta), np.sin(theta), omega], axis=1)
    mean, scale = np.zeros(3), np.array([1.0, 1.0, P.MAX_SPEED])
    y = P.expert_torque(X) / P.MAX_TORQUE
    layers = fit(_init([3, *hidden, 1], rng), (X - mean) / scale, y, epochs=15, rng=rng)
    for r in range(dagger_rounds):
        spec = to_spec(layers, mean, scale, "float64")
        from control_node.kernels.reference import reference_act
        visited = []
        for th0 in rng.uniform(-np.pi, np.pi, 6):
            t, th, _ = P.rollout(lambda o: reference_act(spec, o[None, :])[0, 0], duration_s=6.0, dt=0.02,
                                 theta0=th0, omega0=rng.uniform(-2, 2))
            # the policy's own states, labelled by the expert (omega from finite differences of theta)
            om = np.gradient(np.unwrap(th), t)
            visited.append(np.stack([np.cos(th), np.sin(th), np.clip(om, -P.MAX_SPEED, P.MAX_SPEED)], axis=1))
        Xv = np.concatenate(visited)
        X = np.concatenate([X, Xv])
        y = np.concatenate([y, P.expert_torque(Xv) / P.MAX_TORQUE])
        layers = fit(layers, (X - mean) / scale, y, epochs=4, rng=rng)
        if log:
            log(f"DAgger round {r + 1}/{dagger_rounds}: {len(X)} labelled states")
    spec = to_spec(layers, mean, scale, dtype, check_X=X[rng.choice(len(X), 300, replace=False)])
    return spec


def evaluate(spec, starts=(np.pi, 2.0, -2.5, 0.3), control_every=20, dt=0.001, duration_s=10.0):
    """Offline closed-loop scores (reference forward pass, policy at 1 / (dt * control_every) Hz)."""
    from control_node.kernels.reference import reference_act
    out = []
    for th0 in starts:
        t, th, u = P.rollout(lambda o: reference_act(spec, o[None, :])[0, 0], duration_s=duration_s, dt=dt,
                             control_every=control_every, theta0=th0)
        out.append(P.score(t, th, u))
    return out


def export_verified(spec, path, weights="f32", tolerance=None):
    """Prove the kernel against the reference, write the model file; returns the proof's counts."""
    from control_node.kernels import Policy
    from control_node.kernels.importers.proof import store_weights
    # weights: f16 / bf16 / int8 storage, its error against float32 measured and kept (kernels/weights.py)
    spec = store_weights(spec, weights, tolerance=tolerance, policy_class=Policy, file=str(path))
    report = check_consistency(Policy(spec), spec)
    save_model(spec, path)
    report["spec"] = spec
    return report
