"""A torque-limited pendulum, the classic continuous-control benchmark (gym's Pendulum-v1 dynamics).

State ``(theta, theta_dot)``, theta = 0 upright, wrapped to (-pi, pi]. Dynamics of a uniform rod pivoted
at one end: ``theta_ddot = 3 g / (2 l) sin(theta) + 3 / (m l^2) u``, g = 10, m = 1, l = 1, torque
``|u| <= 2`` (gravity's torque at horizontal is 5: the pendulum must be swung up), speed ``|theta_dot| <= 8``.
Observation ``(cos theta, sin theta, theta_dot)`` as in the benchmark. Integrated with RK4.

Also here: the expert controller the policy is trained to imitate (energy-pumping swing-up, LQR balance
near the top) and the score of a closed-loop trace. Plain numpy; the ZeroMQ side is in ``engine.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

G, M, L = 10.0, 1.0, 1.0
MAX_TORQUE, MAX_SPEED = 2.0, 8.0
UPRIGHT_RAD = 0.1             # |theta| below this counts as upright
OBS_NAMES = ["cos_theta", "sin_theta", "theta_dot"]


def wrap(theta):
    """Angle in (-pi, pi]."""
    return np.pi - np.mod(np.pi - theta, 2 * np.pi)


def accel(theta, u):
    """theta_ddot at angle ``theta`` under torque ``u`` (floats)."""
    return 3 * G / (2 * L) * math.sin(theta) + 3.0 / (M * L * L) * u


def rk4(theta, omega, u, dt):
    """One RK4 step of ``dt`` seconds holding torque ``u`` (clipped to the limit) on Python floats:
    (theta wrapped to (-pi, pi], theta_dot clipped to the speed limit). The simulators call it at 1 kHz;
    numpy scalars made a step 49 us, floats 6 us (the GRU trainer's rollouts were 31 of its 52 s)."""
    u = min(max(float(u), -MAX_TORQUE), MAX_TORQUE)          # NaN stays NaN, as np.clip
    h = 0.5 * dt
    k1t, k1o = omega, accel(theta, u)
    k2t, k2o = omega + h * k1o, accel(theta + h * k1t, u)
    k3t, k3o = omega + h * k2o, accel(theta + h * k2t, u)
    k4t, k4o = omega + dt * k3o, accel(theta + dt * k3t, u)
    c = dt / 6.0
    theta = theta + c * (k1t + 2 * k2t + 2 * k3t + k4t)
    omega = omega + c * (k1o + 2 * k2o + 2 * k3o + k4o)
    return math.pi - (math.pi - theta) % (2 * math.pi), min(max(omega, -MAX_SPEED), MAX_SPEED)


def rk4_step(state, u, dt):
    """:func:`rk4` on a state array ``(theta, theta_dot)``; returns a new one (float64 (2,))."""
    return np.array(rk4(float(state[0]), float(state[1]), u, dt))


def observe(state):
    """float64 (3,): cos theta, sin theta, theta_dot."""
    return np.array([np.cos(state[0]), np.sin(state[0]), state[1]])


def lqr_gain(dt=0.01, q=(10.0, 1.0), r=0.1, iters=5000):
    """Discrete LQR gain K (1, 2) for the linearisation at the top (theta_ddot = 15 theta + 3 u)."""
    A = np.array([[1.0, dt], [3 * G / (2 * L) * dt, 1.0]])
    B = np.array([[0.0], [3.0 / (M * L * L) * dt]])
    Q, R = np.diag(q), np.array([[r]])
    P = Q.copy()
    for _ in range(iters):
        K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
        P = Q + A.T @ P @ (A - B @ K)
    return K


_K = lqr_gain()


def expert_torque(obs):
    """The teacher: LQR near the top, energy pumping elsewhere. ``obs`` (..., 3) -> torque (...)."""
    obs = np.asarray(obs, dtype=np.float64)
    theta = np.arctan2(obs[..., 1], obs[..., 0])
    omega = obs[..., 2]
    inertia = M * L * L / 3.0
    energy = 0.5 * inertia * omega ** 2 + M * G * L / 2 * np.cos(theta)
    e_top = M * G * L / 2
    pump = np.clip(3.0 * (e_top - energy) * np.sign(omega + 1e-9 * (omega == 0)), -MAX_TORQUE, MAX_TORQUE)
    balance = np.clip(-(_K[0, 0] * theta + _K[0, 1] * omega), -MAX_TORQUE, MAX_TORQUE)
    near = (np.abs(theta) < 0.6) & (np.abs(omega) < 3.0)
    return np.where(near, balance, pump)


@dataclass
class Score:
    """How a closed-loop run went (angles in rad, times in s)."""

    time_to_upright_s: float | None   # first time |theta| < UPRIGHT_RAD and it stays upright for 1 s
    rms_error_rad: float | None       # RMS |theta| after that time
    effort: float                     # mean |u|
    falls: int                        # times it left the upright band for > 0.2 s after reaching it
    duration_s: float

    def line(self) -> str:
        up = "never" if self.time_to_upright_s is None else f"{self.time_to_upright_s:.2f} s"
        rms = "n/a" if self.rms_error_rad is None else f"{np.degrees(self.rms_error_rad):.2f} deg"
        return (f"control: upright after {up}, RMS angle error after settling {rms}, "
                f"effort {self.effort:.2f} N m, falls {self.falls}")


def score(t, theta, u, hold_s=1.0):
    """Score a trace: times ``t`` (s, increasing), angles ``theta`` (rad), torques ``u``."""
    t, theta, u = (np.asarray(a, dtype=np.float64) for a in (t, theta, u))
    up = np.abs(wrap(theta)) < UPRIGHT_RAD
    t_up = None
    for i in np.flatnonzero(up):
        window = (t >= t[i]) & (t <= t[i] + hold_s)
        if t[i] + hold_s <= t[-1] and up[window].all():
            t_up = float(t[i] - t[0])
            break
    rms, falls = None, 0
    if t_up is not None:
        after = t - t[0] >= t_up
        rms = float(np.sqrt(np.mean(wrap(theta[after]) ** 2)))
        out = ~up & after
        # a fall: out of the band for longer than 0.2 s
        starts = np.flatnonzero(np.diff(np.concatenate([[0], out.astype(int)])) == 1)
        ends = np.flatnonzero(np.diff(np.concatenate([out.astype(int), [0]])) == -1)
        falls = int(sum(1 for s, e in zip(starts, ends) if t[e] - t[s] > 0.2))
    return Score(time_to_upright_s=t_up, rms_error_rad=rms, effort=float(np.mean(np.abs(u))) if u.size else 0.0,
                 falls=falls, duration_s=float(t[-1] - t[0]) if t.size else 0.0)


def rollout(controller, duration_s=10.0, dt=0.001, control_every=1, theta0=np.pi, omega0=0.0, delay_steps=0):
    """Simulate offline: ``controller(obs) -> torque`` every ``control_every`` steps, the torque held in
    between and applied ``delay_steps`` steps late. Returns (t, theta, u) arrays."""
    n = int(round(duration_s / dt))
    state = np.array([wrap(theta0), omega0])
    t = np.arange(n) * dt
    theta, us = np.empty(n), np.empty(n)
    pending = []                        # (step at which it applies, torque)
    u_cmd = 0.0
    for k in range(n):
        if k % control_every == 0:
            pending.append((k + delay_steps, float(controller(observe(state)))))
        while pending and pending[0][0] <= k:
            u_cmd = pending.pop(0)[1]
        theta[k], us[k] = state[0], u_cmd
        state = rk4_step(state, u_cmd, dt)
    return t, theta, us
