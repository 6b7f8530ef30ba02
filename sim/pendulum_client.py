"""`control-node sim pendulum`: the pendulum as a robot on the wire, closed loop with a real node.

The physics (``pendulum.py``) steps with RK4 at ``physics_hz`` on an absolute schedule. Every
``physics_hz / rate_hz`` steps it publishes an observation frame ``{"seq", "t_ns", "x": [cos, sin, theta_dot]}``
(protocol docs/protocol.md) and, every step, drains the node's actions: the newest action's ``u[0]`` is the
torque, held until the next one arrives -- as a motor driver holds its last command. Optional: an added
transport delay (``delay_us``: an action is applied that long after it arrived), dropped frames, sensor
noise on the observation, periodic pushes (an impulse on theta_dot). The run is scored (time to upright,
RMS angle error after settling, effort, falls) and written to a run directory the report reads.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from control_node import rundir
from control_node.errors import UserError
from control_node.sim import pendulum as P
from control_node.sim.engine import client_sockets, close_client, sleep_until, write_summary


class PendulumClient:
    """A PUB to the node's sensor endpoint and a SUB to its actions, driving the pendulum physics."""

    def __init__(self, endpoints, curve=None, rate_hz=1000.0, physics_hz=1000.0, delay_us=0.0, drop=0.0,
                 noise=0.0, push_every_s=0.0, push=0.0, seed=0, handshake_timeout=10.0, tap=None, state=None,
                 lockstep=False):
        """``lockstep``: simulated time waits for the node: each frame is answered before the physics steps on
        (the answer applies at once, ``delay_us`` later in simulated time), so the score does not depend on how
        fast the host runs the loop; a frame unanswered for ``handshake_timeout`` s ends the run with an error.
        ``tap``: bind a PUB there re-publishing every frame sent (the sensor tap, for record and the live
        view); ``state``: bind a PUB there publishing each physics step's state ``{"step", "t_ns", "theta",
        "omega", "u"}`` (the live view's /sim/pendulum). None: not published, nothing spent on it."""
        import zmq

        if physics_hz % rate_hz and abs(physics_hz / rate_hz - round(physics_hz / rate_hz)) > 1e-9:
            raise UserError(f"--rate {rate_hz:g} must divide the physics rate {physics_hz:g} Hz")
        self.zmq = zmq
        ctx = zmq.Context.instance()
        self.pub, self.sub = client_sockets(ctx, endpoints, curve)
        self.bound = []
        self.tap = self._bind_pub(ctx, tap, "sensor tap")
        self.state = self._bind_pub(ctx, state, "state stream")
        self.endpoints = endpoints
        self.rate_hz, self.physics_hz = float(rate_hz), float(physics_hz)
        self.delay_ns = int(delay_us * 1000)
        self.drop, self.noise = float(drop), float(noise)
        self.push_every_s, self.push = float(push_every_s), float(push)
        self.rng = np.random.default_rng(seed)
        self.handshake_timeout = handshake_timeout
        self.seed = seed
        self.lockstep = bool(lockstep)

    def _bind_pub(self, ctx, ep, what):
        if not ep:
            return None
        from control_node.endpoints import ensure_ipc_dir
        ensure_ipc_dir(ep)
        s = ctx.socket(self.zmq.PUB)
        s.setsockopt(self.zmq.LINGER, 0)
        s.setsockopt(self.zmq.SNDHWM, 10000)     # a slow subscriber loses messages, never blocks the physics
        try:
            s.bind(ep)
        except self.zmq.ZMQError as e:
            s.close()
            raise UserError(f"cannot bind the pendulum's {what} {ep}: {e}") from None
        self.bound.append(ep)
        return s

    def close(self):
        close_client((self.pub, self.sub, self.tap, self.state), self.bound)      # and the socket files we bound

    def _handshake(self, x0, stopper):
        """Send the first observation every 20 ms until an action answers one (ZeroMQ's slow joiner)."""
        import msgpack
        deadline = time.monotonic() + self.handshake_timeout
        seq = 0
        while time.monotonic() < deadline:
            if stopper is not None and stopper.stop:
                raise KeyboardInterrupt
            self.pub.send(msgpack.packb({"seq": seq, "t_ns": time.monotonic_ns(), "x": x0, "warmup": True}))
            seq += 1
            t_end = time.monotonic() + 0.02
            while time.monotonic() < t_end:
                if not self.sub.poll(5):
                    continue
                a = msgpack.unpackb(self.sub.recv())
                if 0 <= a.get("seq", -1) < seq:
                    if "u" not in a:
                        raise UserError("the node answers with a class index ('action'), not an action vector "
                                        "('u'): the pendulum needs a continuous policy. Fix: run the node with "
                                        "--model models/pendulum.npz (control-node train --task pendulum)")
                    return seq
        raise UserError(f"no answer from a node within {self.handshake_timeout:g} s (sensor "
                        f"{self.endpoints['sensor']}, action {self.endpoints['action']}); is it running?")

    def _await_answer(self, answered, take, f, stopper):
        """Lockstep: take actions until ``answered()``; a UserError after ``handshake_timeout`` s without."""
        deadline = time.monotonic() + self.handshake_timeout
        while not answered():
            if stopper is not None and stopper.stop:
                return
            if time.monotonic() > deadline:
                raise UserError(f"lockstep: no answer to frame {f} within {self.handshake_timeout:g} s (sensor "
                                f"{self.endpoints['sensor']}, action {self.endpoints['action']}); did the node "
                                "stop? (--timeout sets the wait)")
            take(20)

    def run(self, duration_s=10.0, theta0=math.pi, omega0=0.0, stopper=None):
        """Closed loop for ``duration_s`` seconds; returns the trace and counters (numpy arrays)."""
        import msgpack
        zmq = self.zmq
        dt = 1.0 / self.physics_hz
        every = int(round(self.physics_hz / self.rate_hz))
        n = int(round(duration_s * self.physics_hz))
        theta, omega = float(P.wrap(theta0)), float(omega0)
        seq = self._handshake([math.cos(theta), math.sin(theta), omega], stopper)
        while self.sub.poll(0):               # the handshake's leftovers
            self.sub.recv()
        first_seq = seq
        n_frames = (n + every - 1) // every
        t_send = np.full(n_frames, -1, dtype=np.int64)
        t_ans = np.full(n_frames, -1, dtype=np.int64)
        u_ans = np.full(n_frames, np.nan)
        safe_ans = np.zeros(n_frames, dtype=bool)
        served = np.zeros(n_frames, dtype=bool)   # an action (of this frame or an older one) came after it
        last_f = -1
        tr_t, tr_theta, tr_omega, tr_u = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
        tap, state, pack = self.tap, self.state, msgpack.packb
        tr_safe = np.zeros(n, dtype=bool)
        pending = []                           # (due ns, torque, safe)
        u_cmd, cmd_safe = 0.0, False
        actions = safe_actions = dropped = 0
        push_steps = int(round(self.push_every_s * self.physics_hz)) if self.push_every_s > 0 else 0
        unpack, recv, poll = msgpack.unpackb, self.sub.recv, self.sub.poll
        lockstep = self.lockstep
        t0 = time.monotonic_ns() + 2_000_000

        def drain(wait_ms):
            """Take every action that arrived (waiting up to ``wait_ms`` for the first). Real time: each applies
            ``delay_us`` after this step's time, the newest last. Lockstep: only a frame's answer applies (the
            first action carrying its seq), at the frame's simulated time: not the node's repeats of it, nor
            the watchdog's safe action, which carries the last valid frame's seq too."""
            nonlocal actions, safe_actions
            while poll(wait_ms):
                wait_ms = 0
                try:
                    a = unpack(recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                actions += 1
                if last_f >= 0:
                    served[last_f] = True
                u = a.get("u")
                if not u:
                    continue
                safe = bool(a.get("safe"))
                safe_actions += safe
                s = a.get("seq", -1) - first_seq
                first = 0 <= s < n_frames and t_ans[s] < 0
                if first:
                    t_ans[s], u_ans[s], safe_ans[s] = (time.monotonic_ns() if lockstep else now), float(u[0]), safe
                if not lockstep or (first and s == last_f):
                    pending.append((now + self.delay_ns, float(u[0]), safe))

        for k in range(n):
            due = t0 + int(k * dt * 1e9)
            now = due if lockstep else sleep_until(due)     # lockstep: the step's simulated time
            drain(0)
            if k % every == 0:
                f = k // every
                obs = [math.cos(theta), math.sin(theta), omega]
                if self.noise:
                    obs = [v + float(e) for v, e in zip(obs, self.rng.normal(0, self.noise, 3))]
                if self.drop and self.rng.random() < self.drop:
                    dropped += 1
                else:
                    t_send[f] = time.monotonic_ns()
                    last_f = f
                    raw = pack({"seq": first_seq + f, "t_ns": int(t_send[f]), "x": obs})
                    self.pub.send(raw)
                    if tap is not None:
                        tap.send(raw, zmq.NOBLOCK)
                    if lockstep:
                        self._await_answer(lambda: t_ans[f] >= 0, drain, f, stopper)
            while pending and pending[0][0] <= now:
                _, u_cmd, cmd_safe = pending.pop(0)
            if push_steps and k and k % push_steps == 0:
                omega = max(-P.MAX_SPEED, min(P.MAX_SPEED, omega + self.push))
            u_applied = max(-P.MAX_TORQUE, min(P.MAX_TORQUE, u_cmd))
            tr_t[k], tr_theta[k], tr_u[k], tr_safe[k] = k * dt, theta, u_applied, cmd_safe
            tr_omega[k] = omega
            if state is not None:
                try:
                    state.send(pack({"step": k, "t_ns": now, "theta": theta, "omega": omega, "u": tr_u[k]}),
                               zmq.NOBLOCK)
                except zmq.Again:
                    pass
            theta, omega = P.rk4(theta, omega, u_applied, dt)
            if stopper is not None and stopper.stop:
                n = k + 1
                break
        sent = t_send >= 0
        answered = sent & (t_ans >= 0)
        return {"t_s": tr_t[:n], "theta": tr_theta[:n], "omega": tr_omega[:n], "u": tr_u[:n], "safe": tr_safe[:n],
                "seq": np.arange(n_frames, dtype=np.int64) + first_seq, "t_send_ns": t_send, "t_action_ns": t_ans,
                "rtt_ns": np.where(answered, t_ans - t_send, -1), "u_answer": u_ans, "safe_answer": safe_ans,
                "frames_sent": int(sent.sum()), "frames_answered": int(answered.sum()), "dropped": dropped,
                # not answered, yet an action came before the next frame: the node held its answer to an
                # older frame (decimation, or the frame was superseded); lost: no action at all came
                "frames_held": int((sent & ~answered & served).sum()),
                "frames_lost": int((sent & ~answered & ~served).sum()),
                "actions_received": actions, "safe_actions": safe_actions, "seq_base": first_seq, "t0_ns": t0}


def summarize(res, settings):
    """summary.json of a pendulum run (role "sim", task "pendulum")."""
    from control_node.sim.engine import percentiles
    sc = P.score(res["t_s"], res["theta"], res["u"])
    rtt = res["rtt_ns"][res["rtt_ns"] >= 0]
    return {
        "role": "sim", "task": "pendulum", "format": rundir.SUMMARY_FORMAT,
        "frames_sent": res["frames_sent"], "frames_answered": res["frames_answered"],
        "frames_dropped": res["dropped"], "actions_received": res["actions_received"],
        "actions_lost": res["frames_lost"], "frames_held": res["frames_held"], "safe_actions": res["safe_actions"],
        "accuracy": None, "round_trip_ns": percentiles(rtt), "seq_base": res["seq_base"],
        "states_published": res.get("states_published"),      # ROS 2: every JointState (the handshake's too)
        "control": {"time_to_upright_s": sc.time_to_upright_s, "rms_error_rad": sc.rms_error_rad,
                    "effort": sc.effort, "falls": sc.falls, "duration_s": sc.duration_s, "line": sc.line(),
                    "upright_rad": P.UPRIGHT_RAD,
                    "t0_ns": int(res["t0_ns"])},          # CLOCK_MONOTONIC of t_s = 0 (the node's clock too)
        "stream": settings,
    }


def write_run_dir(run_dir, summary, res):
    write_summary(run_dir, summary)
    n = len(res["seq"])
    np.savez(os.path.join(run_dir, "roundtrip.npz"), seq=res["seq"], t_send_ns=res["t_send_ns"],
             t_action_ns=res["t_action_ns"], rtt_ns=res["rtt_ns"], truth=np.full(n, -1, np.int16),
             action=np.full(n, -1, np.int16), safe=res["safe_answer"], u=res["u_answer"][:, None])
    np.savez(os.path.join(run_dir, "control.npz"), t_s=res["t_s"], theta=res["theta"], u=res["u"], safe=res["safe"],
             omega=res["omega"], t0_ns=np.int64(res["t0_ns"]))
