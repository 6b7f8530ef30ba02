"""Train a recurrent (GRU) pendulum policy in seconds: ``control-node train --task pendulum --recurrent gru``.

The same imitation as :mod:`train.pendulum` (energy swing-up + LQR expert, DAgger), but the policy is
``GRU(3 -> H)`` then ``H -> 32 tanh -> 1``, tanh-squashed to the torque limit, and it runs as a sequence
at the policy rate (``STEP_S``: 50 Hz, as legged_gym and IsaacLab run theirs): the state carries from
step to step, as the node carries it. Training is backpropagation through time over windows of
``WINDOW`` steps, in plain numpy, with torch's GRU definitions and gate layout (r, z, n; the reset gate
applied after the hidden matmul, ONNX ``linear_before_reset = 1``), so the model file is the same v3
format an imported IsaacLab/rsl_rl GRU has.

Run it with the node at the rate it was trained for: ``[loop] policy_rate_hz = 50`` (the launch config
``configs/pendulum_gru.toml``).
"""
from __future__ import annotations

import os

import numpy as np

from control_node.kernels.model_file import ModelSpec
from control_node.sim import pendulum as P

DEFAULT_OUT = os.path.join("models", "pendulum-gru.npz")
STEP_S = 0.02                  # one policy step: 50 Hz
WINDOW = 25                    # BPTT window, steps (0.5 s)
MEAN, SCALE = np.zeros(3), np.array([1.0, 1.0, P.MAX_SPEED])


def _sig(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def init_params(hidden, rng, dense=32):
    """GRU and dense weights, torch layout: W_ih (3H, 3), W_hh (3H, H), b_ih, b_hh (3H,); dense (W, b)
    with W (n_in, n_out)."""
    H = hidden
    k = 1.0 / np.sqrt(H)
    return {"W_ih": rng.uniform(-k, k, (3 * H, 3)), "W_hh": rng.uniform(-k, k, (3 * H, H)),
            "b_ih": rng.uniform(-k, k, 3 * H), "b_hh": rng.uniform(-k, k, 3 * H),
            "W1": rng.normal(0, np.sqrt(1.0 / H), (H, dense)), "b1": np.zeros(dense),
            "W2": rng.normal(0, np.sqrt(1.0 / dense), (dense, 1)), "b2": np.zeros(1)}


def forward(p, Z, h0):
    """Z (T, B, 3) pre-processed observations, h0 (B, H). Returns (y (T, B) squashed outputs, cache)."""
    H = p["W_hh"].shape[1]
    T, B = Z.shape[:2]
    h = h0
    cache = []
    ys = np.empty((T, B))
    for t in range(T):
        gx = Z[t] @ p["W_ih"].T + p["b_ih"]
        gh = h @ p["W_hh"].T + p["b_hh"]
        r = _sig(gx[:, :H] + gh[:, :H])
        u = _sig(gx[:, H:2 * H] + gh[:, H:2 * H])
        n = np.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
        h_new = (1 - u) * n + u * h
        a1 = np.tanh(h_new @ p["W1"] + p["b1"])
        y = np.tanh(a1 @ p["W2"] + p["b2"])[:, 0]
        cache.append((Z[t], h, r, u, n, gh[:, 2 * H:], h_new, a1, y))
        ys[t] = y
        h = h_new
    return ys, cache


def loss_and_grads(p, Z, target, h0):
    """MSE of the squashed output against ``target`` (T, B) (torque / limit), and its gradients."""
    H = p["W_hh"].shape[1]
    ys, cache = forward(p, Z, h0)
    T, B = target.shape
    g = {k: np.zeros_like(v) for k, v in p.items()}
    dh_next = np.zeros((B, H))
    for t in range(T - 1, -1, -1):
        z, h, r, u, n, ghn, h_new, a1, y = cache[t]
        dy = 2 * (y - target[t]) / (T * B)
        dout = (dy * (1 - y ** 2))[:, None]
        g["W2"] += a1.T @ dout
        g["b2"] += dout.sum(0)
        da1 = (dout @ p["W2"].T) * (1 - a1 ** 2)
        g["W1"] += h_new.T @ da1
        g["b1"] += da1.sum(0)
        dh = da1 @ p["W1"].T + dh_next
        dn = dh * (1 - u) * (1 - n ** 2)
        du = dh * (h - n) * u * (1 - u)
        dr = dn * ghn * r * (1 - r)
        dgx = np.concatenate([dr, du, dn], axis=1)
        dgh = np.concatenate([dr, du, dn * r], axis=1)
        g["W_ih"] += dgx.T @ z
        g["b_ih"] += dgx.sum(0)
        g["W_hh"] += dgh.T @ h
        g["b_hh"] += dgh.sum(0)
        dh_next = dh * u + dgh @ p["W_hh"]
    return float(np.mean((ys - target) ** 2)), g


def _adam(p, data, epochs, rng, lr=3e-3, batch=64, state=None):
    """Adam over windows: ``data`` = (Z (N, WINDOW, 3), target (N, WINDOW), h0 (N, H))."""
    Z, Y, H0 = data
    m, v, step = state or ({k: np.zeros_like(x) for k, x in p.items()}, {k: np.zeros_like(x) for k, x in p.items()}, 0)
    for _ in range(epochs):
        order = rng.permutation(len(Z))
        for s in range(0, len(Z), batch):
            idx = order[s:s + batch]
            _, g = loss_and_grads(p, Z[idx].transpose(1, 0, 2), Y[idx].T, H0[idx])
            step += 1
            for k in p:
                m[k] = 0.9 * m[k] + 0.1 * g[k]
                v[k] = 0.999 * v[k] + 0.001 * g[k] ** 2
                p[k] -= lr * (m[k] / (1 - 0.9 ** step)) / (np.sqrt(v[k] / (1 - 0.999 ** step)) + 1e-8)
    return m, v, step


def _rollouts(controller_factory, starts, rng, duration_s=6.0, noise=0.0):
    """Closed-loop trajectories at the policy rate (RK4 at 1 ms inside each 20 ms step): observations (T, 3)
    per start, from ``controller_factory()`` (a fresh controller, i.e. a fresh state, per rollout)."""
    sub = int(round(STEP_S / 0.001))
    out = []
    for th0, om0 in starts:
        ctl = controller_factory()
        state = np.array([P.wrap(th0), om0])
        obs = []
        for _ in range(int(round(duration_s / STEP_S))):
            o = P.observe(state)
            obs.append(o)
            u = float(np.clip(ctl(o) + noise * rng.normal(), -P.MAX_TORQUE, P.MAX_TORQUE))
            for _ in range(sub):
                state = P.rk4_step(state, u, 0.001)
        out.append(np.array(obs))
    return out


def _windows(trajs, p, rng):
    """Training windows from trajectories, labelled by the expert, each with the policy's own state at
    its start (the state the policy would carry into it)."""
    H = p["W_hh"].shape[1]
    Zs, Ys, H0s = [], [], []
    for obs in trajs:
        Z = (obs - MEAN) / SCALE
        # the state the policy carries along this trajectory, from zero at its start
        h = np.zeros((1, H))
        states = [h[0]]
        for t in range(len(Z)):
            _, cache = forward(p, Z[t:t + 1, None, :], h)
            h = cache[-1][6]
            states.append(h[0])
        y = P.expert_torque(obs) / P.MAX_TORQUE
        for s in range(0, len(Z) - WINDOW + 1, WINDOW // 2):
            Zs.append(Z[s:s + WINDOW])
            Ys.append(y[s:s + WINDOW])
            H0s.append(states[s] if s else np.zeros(H))
    return np.array(Zs), np.array(Ys), np.array(H0s)


class Controller:
    """The policy as the node runs it: one step per call, state carried, zero at construction."""

    def __init__(self, p):
        self.p = p
        self.h = np.zeros((1, p["W_hh"].shape[1]))

    def __call__(self, obs):
        _, cache = forward(self.p, ((np.asarray(obs) - MEAN) / SCALE)[None, None, :], self.h)
        self.h = cache[-1][6]
        return float(cache[-1][8][0]) * P.MAX_TORQUE


def to_spec(p, dtype="float32", check_X=None) -> ModelSpec:
    return ModelSpec(layers=[(p["W1"], p["b1"]), (p["W2"], p["b2"])], mean=MEAN, scale=SCALE, classes=[],
                     feature_names=P.OBS_NAMES, dtype=dtype, activations=["tanh", "identity"],
                     head="continuous", squash=True, action_scale=P.MAX_TORQUE, action_names=["torque"],
                     check_X=check_X, recurrent="gru", rnn_W_ih=p["W_ih"], rnn_W_hh=p["W_hh"], rnn_b_ih=p["b_ih"],
                     rnn_b_hh=p["b_hh"],
                     trainer="numpy BPTT behaviour cloning + DAgger (pendulum expert), GRU at 50 Hz",
                     source={"task": "pendulum", "expert": "energy swing-up + LQR", "recurrent": "gru",
                             "policy_rate_hz": 1.0 / STEP_S})


def train_pendulum_gru(hidden=32, dtype="float32", seed=0, dagger_rounds=3, log=None, progress=None):
    """Returns a continuous recurrent :class:`ModelSpec` (GRU, ``hidden`` units). ``progress(i, n)``: called
    after each of the ``2 + dagger_rounds`` stages."""
    rng = np.random.default_rng(seed)
    p = init_params(hidden, rng)
    starts = [(rng.uniform(-np.pi, np.pi), rng.uniform(-3, 3)) for _ in range(48)]
    # the expert's own trajectories, with torque noise so they cover states around its path
    trajs = _rollouts(lambda: (lambda o: float(P.expert_torque(o[None, :])[0])), starts, rng, noise=0.6)
    data = _windows(trajs, p, rng)
    n_stages = 1 + dagger_rounds
    state = _adam(p, data, epochs=30, rng=rng)
    if progress:
        progress(1, n_stages)
    for r in range(dagger_rounds):
        mine = _rollouts(lambda: Controller(p), [(rng.uniform(-np.pi, np.pi), rng.uniform(-2, 2))
                                                 for _ in range(16)], rng)
        trajs = trajs + mine
        data = _windows(trajs, p, rng)        # states recomputed: the policy has changed
        state = _adam(p, data, epochs=8, rng=rng, state=state)
        if log:
            log(f"DAgger round {r + 1}/{dagger_rounds}: {len(data[0])} windows of {WINDOW} steps")
        if progress:
            progress(2 + r, n_stages)
    check = np.concatenate(trajs)[:300]          # one sequence the kernel is proved on at load
    return to_spec(p, dtype, check_X=check)


def evaluate(spec, starts=(np.pi, 2.0, -2.5, 0.3), duration_s=10.0):
    """Offline closed-loop scores of the compiled kernel at 50 Hz, its state carried (reset per start)."""
    from control_node.kernels import Policy
    policy = Policy(spec)
    out = []
    for th0 in starts:
        policy.reset()
        t, th, u = P.rollout(lambda o: float(policy.act(o)[0]), duration_s=duration_s, dt=0.001,
                             control_every=int(round(STEP_S / 0.001)), theta0=th0)
        out.append(P.score(t, th, u))
    return out
