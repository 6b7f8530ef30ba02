"""Drive the real compiled loop (RtLoop's drivers and its cycle) on a virtual clock: frames encoded with
msgpack as a sender encodes them, arriving at made-up times, stalls injected into the loop's wake-ups.
Thousands of cycles run in milliseconds and every time is exact, so the loop's rules are checked without
a wall clock (tests/test_cycle_rules.py)."""
from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np

from control_node.loop._rtloop import LoopConfig, RtLoop, VirtualIO

MS = 1_000_000
T0 = 10 * MS           # the first tick of every virtual run


def frame(seq, t_ns, x) -> bytes:
    """A sensor frame as the sender (sim/, the robot bridge) encodes it."""
    return msgpack.packb({"seq": int(seq), "t_ns": int(t_ns), "x": [float(v) for v in x]})


@dataclass
class Stream:
    """Frames to inject: ``arrive[i]`` is when frame ``frames[i]`` is in the socket; ``sent_at[i]`` its
    t_ns stamp; ``x[i]`` its values (None for a bad frame); ``seq[i]`` its seq (-1: bad)."""
    arrive: list
    frames: list
    seq: list
    sent_at: list
    x: list

    @classmethod
    def periodic(cls, n, period_ns, phase_ns, xs, *, first_seq=1, start_ns=T0, transit_ns=50_000, skip=()):
        """``n`` frames, one per ``period_ns`` from ``start_ns + phase_ns``, stamped ``transit_ns`` before
        they arrive; x cycles through ``xs``; frame numbers in ``skip`` are not sent (a silence)."""
        s = cls([], [], [], [], [])
        for i in range(n):
            if i in skip:
                continue
            t = start_ns + phase_ns + int(round(i * period_ns))
            s.add(t, first_seq + i, t - transit_ns, xs[i % len(xs)])
        return s

    def add(self, arrive, seq, t_ns, x):
        self.arrive.append(int(arrive))
        self.frames.append(frame(seq, t_ns, x))
        self.seq.append(int(seq))
        self.sent_at.append(int(t_ns))
        self.x.append(np.asarray(x, dtype=np.float64))
        return self

    def add_bad(self, arrive, data: bytes | tuple):
        """A frame the loop must reject (malformed bytes, or a tuple of parts: a multipart message)."""
        self.arrive.append(int(arrive))
        self.frames.append(data)
        self.seq.append(-1)
        self.sent_at.append(-1)
        self.x.append(None)
        return self

    def sorted(self):
        order = sorted(range(len(self.arrive)), key=lambda i: (self.arrive[i], i))
        return Stream(*[[col[i] for i in order] for col in (self.arrive, self.frames, self.seq, self.sent_at, self.x)])

    def by_seq(self):
        return {s: i for i, s in enumerate(self.seq) if s >= 0}


@dataclass
class Run:
    loop: RtLoop
    io: VirtualIO
    stream: Stream
    rec: dict           # the ring, cycle order, only the cycles run (no wrap)
    sent: list          # the published messages, decoded

    @property
    def k(self):
        """Each cycle's tick number (no phase lock: exact)."""
        return (self.rec["t_tick_ns"] - T0) // self.loop.period_ns

    def flag(self, name):
        from control_node import rundir
        return (self.rec["flags"] & getattr(rundir, "FLAG_" + name.upper())) != 0


def run_virtual(policy, stream: Stream | None = None, *, stalls=(), read_cost_ns=1_000, requests=(),
                run_until_ns=0, slots=(), rules=None, legged=None, **config) -> Run:
    """Build an RtLoop with ``LoopConfig(**config)`` (ring large enough never to wrap), put ``slots``
    ((slot, Policy) pairs) in place, post ``requests`` ((kind name, slot)) before the run, run it virtually
    from T0. The loop holds one pending request at a time (RtLoop.post_request refuses a second before the
    first is done), so ``requests`` has at most one: it is taken at the run's first cycle boundary. ``legged``: a
    LeggedCycle (the legged deploy path; its mode sequence is the request schedule of modes at chosen cycles)."""
    assert len(requests) <= 1, "the loop holds one pending request at a time: give at most one"
    config.setdefault("ring_cycles", config["max_cycles"] + 16 if config.get("max_cycles") else 100_000)
    loop = RtLoop(policy, LoopConfig(**config), legged=legged)
    for slot, p in slots:
        loop.set_slot(slot, p)
    if rules:
        loop.set_rules(**rules)
    from control_node import rundir
    for kind, slot in requests:
        loop.post_request(rundir.TRANSITIONS.index(kind) + 1, slot)
    stream = (stream or Stream([], [], [], [], [])).sorted()
    io = VirtualIO(stream.arrive, stream.frames, stalls, read_cost_ns=read_cost_ns, start_ns=0,
                   max_message_bytes=512 if legged is None else 16 + 9 * legged.pub_width + 64)
    loop.run_virtual(io, T0, run_until_ns)
    n = loop.cycles
    assert n <= loop.capacity, "a virtual run's ring must not wrap"
    rec = {name: np.array(v[:n]) for name, v in loop.ring.items()}
    sent = [msgpack.unpackb(m) for m in io.sent()]
    return Run(loop, io, stream, rec, sent)
