"""The pendulum task offline: dynamics, the expert, the trained continuous policy through the compiled
kernel, and how added delay degrades the score (the node-in-the-loop run is in test_pendulum_node)."""
from __future__ import annotations

import numpy as np
import pytest

from control_node.sim import pendulum as P


def test_rk4_conserves_energy_without_torque():
    state = np.array([2.0, 0.0])
    inertia = P.M * P.L ** 2 / 3

    def energy(s):
        return 0.5 * inertia * s[1] ** 2 + P.M * P.G * P.L / 2 * np.cos(s[0])
    e0 = energy(state)
    for _ in range(5000):                      # 5 s at 1 kHz
        state = P.rk4_step(state, 0.0, 0.001)
    assert abs(energy(state) - e0) < 1e-6 * abs(e0) + 1e-9


def test_torque_and_speed_limits_hold():
    s = P.rk4_step(np.array([0.0, 7.99]), 100.0, 0.1)       # 100 N m asked, 2 applied; speed clipped
    assert abs(s[1]) <= P.MAX_SPEED
    ref = P.rk4_step(np.array([0.0, 0.0]), P.MAX_TORQUE, 0.01)
    assert np.allclose(P.rk4_step(np.array([0.0, 0.0]), 50.0, 0.01), ref)


def test_score_finds_upright_and_falls():
    t = np.arange(0, 5, 0.001)
    theta = np.where(t < 1.0, 2.0, 0.01)
    theta = np.where((t > 3.0) & (t < 3.5), 1.0, theta)     # one fall of 0.5 s
    sc = P.score(t, theta, np.zeros_like(t))
    assert sc.time_to_upright_s == pytest.approx(1.0, abs=2e-3)
    assert sc.falls == 1


def test_trained_policy_swings_up_and_balances_through_the_kernel(pendulum_spec):
    from control_node.kernels import Policy, check_consistency
    policy = Policy(pendulum_spec)
    check_consistency(policy, pendulum_spec)
    out = np.zeros(1)

    def controller(obs):
        policy.act_into(np.ascontiguousarray(obs), out)
        return out[0]
    for th0 in (np.pi, -2.5, 1.0):
        t, th, u = P.rollout(controller, duration_s=10.0, dt=0.001, control_every=20, theta0=th0)
        sc = P.score(t, th, u)
        assert sc.time_to_upright_s is not None and sc.time_to_upright_s < 6.0, sc
        assert sc.falls == 0 and sc.rms_error_rad < np.radians(5), sc
        assert np.abs(u).max() <= P.MAX_TORQUE + 1e-12


def test_large_added_delay_fails_visibly(pendulum_spec):
    from control_node.kernels.reference import reference_act

    def controller(obs):
        return reference_act(pendulum_spec, obs[None, :])[0, 0]
    good = P.score(*P.rollout(controller, duration_s=10.0, control_every=20, theta0=np.pi))
    bad = P.score(*P.rollout(controller, duration_s=10.0, control_every=20, theta0=np.pi, delay_steps=300))
    assert good.time_to_upright_s is not None and good.falls == 0
    assert bad.time_to_upright_s is None or bad.falls > 0 or bad.rms_error_rad > 3 * good.rms_error_rad, bad
