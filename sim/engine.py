"""Closed-loop send/score engine shared by ``control-node sim`` and ``control-node replay``.

Open loop: frame k goes out at ``t0 + offsets[k]`` (absolute schedule: wait on the action socket,
then sleep, then a short spin). Lockstep: send frame i, wait for the action answering it, send the next.
Every action received is matched to its frame by ``seq`` (the first action carrying a frame's seq is
its answer). All per-frame arrays are preallocated; the loop only indexes them.

Both action messages of docs/protocol.md are understood: v1 (``action``, a class index: argmax policies)
and v2 (``u``, an action vector: continuous policies). The handshake's answer tells which one the node
speaks; a v2 run records the vectors (``u``, NaN where unanswered) and, when the stream carries expected
actions (``Stream.expected_u``), compares each answer with its frame's expected action.
"""
from __future__ import annotations

import json
import os
import signal
import time

import numpy as np

from control_node import rundir
from control_node.errors import UserError


class Stopper:
    """SIGINT/SIGTERM set a flag that the send loop checks every frame (stop cleanly, still write results)."""

    def __init__(self):
        self.stop = False
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def _handler(self, signum, frame):
        self.stop = True

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def sleep_until(due_ns):
    """Sleep until CLOCK_MONOTONIC ``due_ns``, spinning the last 100 us; returns the time then."""
    while True:
        now = time.monotonic_ns()
        left = due_ns - now
        if left <= 0:
            return now
        if left > 150_000:
            time.sleep((left - 100_000) / 1e9)


def client_sockets(ctx, endpoints, curve=None, xpub=False):
    """A simulated robot's two sockets: a PUB (an XPUB with ``xpub``: the node's subscription is then seen before
    the first frame) connected to the node's sensor endpoint, and a SUB to its action endpoint; deep queues (a
    lockstep or replay burst), ``curve`` client keys (control_node.security.client_curve) or plaintext."""
    import zmq

    from control_node.security import configure_client
    pub = ctx.socket(zmq.XPUB if xpub else zmq.PUB)
    pub.setsockopt(zmq.LINGER, 200)
    pub.setsockopt(zmq.SNDHWM, 100000)
    configure_client(pub, curve)
    pub.connect(endpoints["sensor"])
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 100000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    configure_client(sub, curve)
    sub.connect(endpoints["action"])
    return pub, sub


def close_client(sockets, bound=()):
    """Close a simulated robot's sockets (None skipped) and remove the ipc socket files of the endpoints it
    bound (a tap, a state stream), so the next run can bind them again."""
    from control_node.endpoints import ipc_path
    for sock in sockets:
        if sock is not None:
            sock.close()
    for ep in bound:
        p = ipc_path(ep)
        if p and os.path.exists(p):
            try:
                os.unlink(p)
            except OSError:
                pass


class ClosedLoop:
    def __init__(self, endpoints, tap=None, handshake_timeout=10.0, curve=None):
        """``curve``: client keys from control_node.security.client_curve (None: plaintext)."""
        import zmq
        self.zmq = zmq
        self.ctx = zmq.Context.instance()
        self.endpoints = endpoints
        self.pub, self.sub = client_sockets(self.ctx, endpoints, curve)
        self.tap = None
        self.tap_ep = tap
        if tap:
            from control_node.endpoints import ensure_ipc_dir
            ensure_ipc_dir(tap)
            self.tap = self.ctx.socket(zmq.PUB)
            self.tap.setsockopt(zmq.LINGER, 200)
            self.tap.setsockopt(zmq.SNDHWM, 100000)
            try:
                self.tap.bind(tap)
            except zmq.ZMQError as e:
                raise UserError(f"cannot bind sensor tap {tap}: {e}")
        self.handshake_timeout = handshake_timeout
        self.actions_received = 0
        self.safe_actions = 0
        self.next_seq = 0  # seqs must increase across handshakes and passes (--loop)
        self.first_action = None  # the handshake's answer: "u" in it means protocol v2 (continuous)

    def close(self):
        for s in (self.pub, self.sub, self.tap):
            if s is not None:
                s.close()
        if self.tap is not None:  # we bound the tap: remove its ipc socket file (libzmq may not at exit)
            from control_node.endpoints import ipc_path
            p = ipc_path(self.tap_ep)
            if p:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass

    def handshake(self, x0, stopper=None):
        """Slow-joiner handshake: send warm-up frames (seq 0, 1, ...) every 20 ms until an action
        answering one of them arrives. Returns the first seq free for real frames."""
        import msgpack
        zmq = self.zmq
        deadline = time.monotonic() + self.handshake_timeout
        w = w0 = self.next_seq
        x0 = [float(v) for v in x0]
        while time.monotonic() < deadline:
            if stopper is not None and stopper.stop:
                raise KeyboardInterrupt
            self.pub.send(msgpack.packb({"seq": w, "t_ns": time.monotonic_ns(), "x": x0, "warmup": True}))
            w += 1
            t_end = time.monotonic() + 0.02
            while True:
                rem = t_end - time.monotonic()
                if rem <= 0 or not self.sub.poll(max(1, int(rem * 1000))):
                    break
                while True:
                    try:
                        d = msgpack.unpackb(self.sub.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    if w0 <= d.get("seq", -1) < w:
                        self.first_action = d
                        return w
        raise UserError(f"no answer from a node within {self.handshake_timeout:g} s "
                        f"(sensor {self.endpoints['sensor']}, action {self.endpoints['action']}); is it running?")

    def run(self, stream, lockstep=False, answer_timeout=None, grace=0.3, spin_us=100, progress=False,
            stopper=None, max_duration=None, before_send=None):
        """Send the stream's frames (on its schedule, or lockstep: each after the previous one's answer)
        and collect the answers. ``before_send(i)``, if given, runs before frame i is sent (replay uses it
        to repeat the recording's policy switches at the same frames). Lockstep waits up to ``answer_timeout``
        s for each answer (default: the handshake's timeout, the verbs' --timeout), so a frame is lost only
        if the node does not answer it: a 1 s wait once lost one to 1.09 s of stalled ZeroMQ delivery on a
        loaded host while the node's loop ran on time, and replay --verify reported a mismatch."""
        if answer_timeout is None:
            answer_timeout = self.handshake_timeout
        import msgpack
        zmq = self.zmq
        n = len(stream)
        xl = stream.X.tolist()
        truth = stream.truth
        truth_l = truth.tolist()
        drop = stream.drop.tolist()
        offsets = stream.offsets_ns.tolist()
        base = self.handshake(xl[0], stopper)
        first_u = self.first_action.get("u") if isinstance(self.first_action, dict) else None
        continuous = isinstance(first_u, list)
        n_act = len(first_u) if continuous else 0
        u = np.full((n, n_act), np.nan) if continuous else None
        expected = getattr(stream, "expected_u", None)
        eu_l = expected.tolist() if (continuous and expected is not None) else None
        # drain whatever the handshake left
        while True:
            try:
                self.sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        t_send = np.zeros(n, dtype=np.int64)
        t_act = np.zeros(n, dtype=np.int64)
        action = np.full(n, -1, dtype=np.int16)
        safe = np.zeros(n, dtype=bool)
        sent = np.zeros(n, dtype=bool)
        pack = msgpack.packb
        unpack = msgpack.unpackb
        mono = time.monotonic_ns
        sub, pub, tap = self.sub, self.pub, self.tap
        NOBLOCK = zmq.NOBLOCK
        from select import select
        fd = sub.getsockopt(zmq.FD)
        Again = zmq.Again
        counts = [0, 0]  # actions received, safe actions received

        def drain():
            while True:
                try:
                    raw = sub.recv(NOBLOCK)
                except Again:
                    return
                t = mono()
                d = unpack(raw)
                counts[0] += 1
                s = d["safe"]
                if s:
                    counts[1] += 1
                k = d["seq"] - base
                if 0 <= k < n and t_act[k] == 0:
                    t_act[k] = t
                    if continuous:
                        uu = d.get("u")
                        if isinstance(uu, list) and len(uu) == n_act:
                            u[k] = uu
                        action[k] = -1 if s else 0      # as the node's ring: 0 policy, -1 safe
                    else:
                        action[k] = d["action"]
                    safe[k] = s

        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=n, unit="frame", mininterval=0.5, disable=None)
        spin_ns = int(spin_us * 1000)
        t0 = mono() + 1_000_000
        stop_at = None if max_duration is None else t0 + int(max_duration * 1e9)
        last_i = -1
        for i in range(n):
            if stopper is not None and stopper.stop:
                break
            if not lockstep:
                target = t0 + offsets[i]
                if stop_at is not None and target > stop_at:
                    break
                while True:
                    rem = target - mono() - spin_ns
                    if rem <= 0:
                        break
                    # the zmq FD is edge-triggered: always drain fully after a wake-up
                    select([fd], [], [], rem / 1e9)
                    drain()
                while mono() < target:
                    drain()
            last_i = i
            if before_send is not None:
                before_send(i)
            if drop[i]:
                continue
            t = mono()
            tr = truth_l[i]
            msg = {"seq": base + i, "t_ns": t, "x": xl[i]}
            if tr >= 0:
                msg["truth"] = tr
            if eu_l is not None:
                msg["u_expected"] = eu_l[i]
            raw = pack(msg)
            pub.send(raw)
            t_send[i] = t
            sent[i] = True
            if tap is not None:
                tap.send(raw)
            if lockstep:
                deadline = t + int(answer_timeout * 1e9)
                while t_act[i] == 0:
                    rem = deadline - mono()
                    if rem <= 0 or (stopper is not None and stopper.stop):
                        break
                    select([fd], [], [], rem / 1e9)
                    drain()
            if bar is not None and (i & 127) == 0:
                bar.n = i + 1
                bar.refresh()
        else:
            last_i = n - 1
        # grace period: wait for the last answers
        deadline = mono() + int(grace * 1e9)
        while mono() < deadline:
            if not (sent & (t_act == 0)).any():
                break
            if sub.poll(10):
                drain()
        drain()
        if bar is not None:
            bar.n = last_i + 1
            bar.close()
        self.actions_received += counts[0]
        self.safe_actions += counts[1]
        self.next_seq = base + n
        wall_s = (mono() - t0) / 1e9
        m = sent
        seq = np.arange(n, dtype=np.int64) + base
        answered = t_act[m] > 0
        rtt = np.where(t_act[m] > 0, t_act[m] - t_send[m], -1).astype(np.int64)
        return {
            "u": u[m] if continuous else None,
            "u_expected": np.asarray(expected, dtype=np.float64)[m] if eu_l is not None else None,
            "seq": seq[m], "t_send_ns": t_send[m], "t_action_ns": t_act[m], "rtt_ns": rtt,
            "truth": truth[m].astype(np.int16), "action": np.where(answered, action[m], -1).astype(np.int16),
            "safe": safe[m] & answered, "frames_in_stream": n, "frames_planned": last_i + 1, "seq_base": base,
            "send_span_s": (int(t_send[m].max()) - int(t_send[m].min())) / 1e9 if m.any() else 0.0,
            "wall_s": wall_s,
        }


def percentiles(x):
    x = np.asarray(x, dtype=np.int64)
    if len(x) == 0:
        return {"p50": None, "p90": None, "p99": None, "p999": None, "p9999": None, "max": None,
                "mean": None, "count": 0}
    q = np.percentile(x, [50, 90, 99, 99.9, 99.99])
    return {"p50": int(q[0]), "p90": int(q[1]), "p99": int(q[2]), "p999": int(q[3]), "p9999": int(q[4]),
            "max": int(x.max()), "mean": float(x.mean()), "count": int(len(x))}


def compare_u(u, expected, answered, safe, seq, atol=1e-6) -> dict:
    """Answers ``u`` (n, n_actions) against ``expected`` (n, n_actions) where answered, not safe and the
    expectation is finite: a component matches when ``|u - e| <= atol * max(1, |e|)``."""
    rows = answered & ~safe & np.isfinite(expected).all(axis=1)
    d = np.abs(u[rows] - expected[rows])
    tol = atol * np.maximum(1.0, np.abs(expected[rows]))
    bad = ~(d <= tol)                                  # NaN answers count as mismatches
    bad_rows = np.flatnonzero(bad.any(axis=1))
    out = {"compared": int(rows.sum()), "mismatches": int(bad_rows.size), "atol": atol,
           "max_abs_err": float(np.nanmax(d)) if d.size else None,
           "max_rel_err": float(np.nanmax(d / np.maximum(1.0, np.abs(expected[rows])))) if d.size else None,
           "first_mismatch": None}
    if bad_rows.size:
        r = bad_rows[0]
        j = int(np.flatnonzero(bad[r])[0])
        i = int(np.flatnonzero(rows)[r])
        out["first_mismatch"] = {"seq": int(seq[i]), "component": j, "got": float(u[i, j]),
                                 "expected": float(expected[i, j])}
    return out


def summarize(res, loop, settings, role="sim", lockstep=False, atol=1e-6):
    answered = res["rtt_ns"] >= 0
    continuous = res.get("u") is not None
    scored = answered & ~res["safe"] & (res["truth"] >= 0) & (not continuous)
    acc = float((res["action"][scored] == res["truth"][scored]).mean()) if scored.any() else None
    extra = {"policy": "argmax"}
    if continuous:       # accuracy is a class's: n/a; the answers may be held against expected actions
        extra = {"policy": "continuous", "n_actions": int(res["u"].shape[1]),
                 "expected": (compare_u(res["u"], res["u_expected"], answered, res["safe"], res["seq"], atol)
                              if res.get("u_expected") is not None else None)}
    return {
        "role": role, "format": rundir.SUMMARY_FORMAT,
        "frames_sent": int(len(res["seq"])),
        "frames_answered": int(answered.sum()),
        "actions_received": int(loop.actions_received),
        "actions_lost": int((~answered).sum()),
        "safe_actions": int(loop.safe_actions),
        "safe_answers": int((answered & res["safe"]).sum()),
        "accuracy": acc,
        "accuracy_count": int(scored.sum()),
        "round_trip_ns": percentiles(res["rtt_ns"][answered]),
        "lockstep": bool(lockstep),
        "seq_base": int(res["seq_base"]),
        "send_span_s": float(res["send_span_s"]),
        "stream": settings,
        **extra,
    }


def write_summary(run_dir, summary):
    """``run_dir/summary.json``, with the cores this process was allowed to run on (``cpus``: launch keeps
    a simulator off the node's loop core; the report says where it ran)."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({**summary, "cpus": sorted(os.sched_getaffinity(0))}, f, indent=2)
        f.write("\n")


def write_run_dir(run_dir, summary, res):
    write_summary(run_dir, summary)
    np.savez(os.path.join(run_dir, "roundtrip.npz"), seq=res["seq"], t_send_ns=res["t_send_ns"],
             t_action_ns=res["t_action_ns"], rtt_ns=res["rtt_ns"], truth=res["truth"],
             action=res["action"], safe=res["safe"],
             **({"u": res["u"]} if res.get("u") is not None else {}),
             **({"u_expected": res["u_expected"]} if res.get("u_expected") is not None else {}))


def new_run_dir(role):
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{stamp}-{role}-{os.getpid()}")


def fmt_ms(ns):
    return "n/a" if ns is None else f"{ns / 1e6:.3f} ms"


def print_summary(summary, run_dir):
    rt = summary["round_trip_ns"]
    acc = summary["accuracy"]
    print(f"frames sent {summary['frames_sent']}, answered {summary['frames_answered']}, "
          f"lost {summary['actions_lost']}, safe actions received {summary['safe_actions']}")
    if summary.get("policy") == "continuous":
        print(f"accuracy n/a (continuous policy, {summary['n_actions']} actions)")
        ex = summary.get("expected")
        if ex is not None:
            line = (f"expected actions: {ex['compared']} answers compared, {ex['mismatches']} mismatches "
                    f"(atol {ex['atol']:g} relative to max(1, |u|)), max error {ex['max_abs_err']}")
            fm = ex.get("first_mismatch")
            if fm:
                line += (f"; first mismatch seq {fm['seq']} component {fm['component']}: got {fm['got']!r}, "
                         f"expected {fm['expected']!r}")
            print(line)
    else:
        print(f"accuracy {'n/a' if acc is None else f'{acc:.4f}'} over {summary['accuracy_count']} answered frames")
    print(f"round trip p50 {fmt_ms(rt['p50'])}  p99 {fmt_ms(rt['p99'])}  max {fmt_ms(rt['max'])}")
    print(f"run directory: {run_dir}", flush=True)
