"""Test helpers: start a real node process on private endpoints and talk to it over real sockets."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import msgpack
import numpy as np
import zmq

from control_node import rundir
from control_node.bench import harness
from control_node.bench.harness import CHILD_CWD, NodeProcess

CHILDREN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "children")


def child_script(name):
    """Path of a child process's script in tests/support/children/ (real files: a traceback names its line)."""
    return os.path.join(CHILDREN, name)


def start_feeder(endpoint, x, seconds):
    """children/feeder.py: the observation ``x`` (a list of floats) to ``endpoint`` every ~100 us."""
    import json
    return subprocess.Popen([sys.executable, child_script("feeder.py"), endpoint, str(seconds),
                             json.dumps([float(v) for v in x])])


def subscribed_publisher(endpoint, sndhwm=100_000, linger_ms=2000, timeout_s=30.0):
    """A publisher connected to the node's sensor ``endpoint`` that has seen the node's subscription arrive
    (an XPUB reads it), so no frame it sends is dropped by ZeroMQ's slow joiner: a fixed sleep for that
    lost 35 of 1800 frames once on a loaded host. Sends exactly as a PUB does."""
    pub = zmq.Context.instance().socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, linger_ms)
    pub.setsockopt(zmq.SNDHWM, sndhwm)
    pub.connect(endpoint)
    if not pub.poll(int(timeout_s * 1000)):
        pub.close(0)
        raise TimeoutError(f"no subscription from the node at {endpoint} within {timeout_s} s")
    sub = pub.recv()
    assert sub[:1] == b"\x01", sub                  # a subscribe message (0x01 + topic)
    return pub


class Robot:
    """A client: PUB connected to the node's sensor endpoint, SUB to its actions."""

    def __init__(self, endpoints, sndhwm=1000):
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        # past SNDHWM a PUB drops silently: a burst after a host stall would lose frames the node never sees
        self.pub.setsockopt(zmq.SNDHWM, sndhwm)
        self.pub.connect(endpoints["sensor"])
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoints["action"])
        self.seq = 0

    def send(self, x, seq=None, binary=False, t_ns=None):
        self.seq = self.seq + 1 if seq is None else seq
        xv = np.asarray(x, dtype="<f8").tobytes() if binary else [float(v) for v in x]
        self.pub.send(msgpack.packb({"seq": self.seq, "t_ns": t_ns or time.monotonic_ns(), "x": xv}))
        return self.seq

    def send_raw(self, data, more=None):
        if more is None:
            self.pub.send(data)
        else:
            self.pub.send_multipart([data, *more])

    def actions(self, timeout=1.0, until=None):
        """Every action received within ``timeout`` seconds; with ``until`` (a seq), up to the first that
        answers it (not safe), that one included: a late answer (a host stall) still counts for its frame."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sub.poll(int(left * 1000) + 1):
                return out
            out.append(msgpack.unpackb(self.sub.recv()))
            if until is not None and out[-1]["seq"] == until and not out[-1]["safe"]:
                return out

    def after_the_trip(self, more=0.05, timeout=10.0):
        """The actions from the watchdog's first safe one on, and what follows it for ``more`` seconds (no frame
        is sent meanwhile): waited for, not a fixed silence. A fixed 0.6 s sleep-then-read once saw no trip
        because the host held the node through the silence (test_recurrent_node, stop 34's review)."""
        got, deadline = [], time.monotonic() + timeout
        while not any(a["safe"] for a in got):
            assert time.monotonic() < deadline, f"no safe action within {timeout} s of silence: no watchdog trip"
            got += self.actions(timeout=0.05)
        first = next(i for i, a in enumerate(got) if a["safe"])
        return got[first:] + self.actions(timeout=more)

    def wait_raw(self, seq, timeout=2.0):
        """(raw bytes, decoded map) of the first action answering ``seq`` (safe or not), or (None, None).
        Every action queued by the deadline is read before giving up, so a stall of this process past the
        deadline does not lose an answer that did arrive (the node publishes every cycle, so the reads past the
        deadline are bounded too: at most a full receive queue and what arrives meanwhile)."""
        deadline = time.monotonic() + timeout
        late_reads = 0
        while late_reads < 100_000:
            left = deadline - time.monotonic()
            late_reads += left <= 0
            if not self.sub.poll(max(0, int(left * 1000))):
                break
            raw = self.sub.recv()
            a = msgpack.unpackb(raw)
            if a["seq"] == seq:
                return raw, a
        return None, None

    def wait_answer(self, seq, timeout=2.0):
        """The first action answering ``seq`` (safe or not), or None."""
        return self.wait_raw(seq, timeout)[1]

    def connect(self, x, timeout=10.0):
        """Send frames until the node answers one (ZeroMQ's slow joiner); returns that action."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seq = self.send(x)
            a = self.wait_answer(seq, timeout=0.2)
            if a is not None:
                return a
        raise TimeoutError("node never answered")

    def close(self):
        self.pub.close(linger=0)
        self.sub.close(linger=0)


# ---- helpers for the reliability tests (tests/test_reliability.py, tests/test_fuzz_node.py) ----

def load_run(run_dir):
    """(summary dict, cycles.npz arrays as a dict) of a node run directory."""
    return rundir.read_node_run(run_dir)


class ActionCollector:
    """A SUB on the node's action endpoint drained by a background thread: every action, in order,
    with the local receive time (``t_rx_ns``)."""

    def __init__(self, endpoint, rcvhwm=100_000):
        import threading
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.actions = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            if self.sub.poll(20):
                while True:
                    try:
                        raw = self.sub.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    a = msgpack.unpackb(raw)
                    a["t_rx_ns"] = time.monotonic_ns()
                    self.actions.append(a)

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)
        self.sub.close(linger=0)
        return self.actions


def write_node_config(path, ep_dir, extra="", transport="ipc", spin_us=0, attribution=False, isa="widest"):
    """A test's node config (bench.harness.write_node_config), by default without two things only a test of
    timing needs, both CPU the suite's workers share (measured beside a 1 kHz sender, spin 0: the node took
    18 % of a core with the why-late recorder, 5 % without), and with ``[policy] isa = "widest"``: the copy
    ``Policy(spec)`` runs in the test's own process, so a test compares the node's answers with its own bit for
    bit (the default "fastest" may pick another copy, whose sums differ in the last bits; tests of the choice
    itself, tests/test_kernel_dispatch.py, ask for it):

    - ``spin_us=0``: the loop sleeps to each tick instead of spinning its last 150 us (the default, "auto"),
      12 % of a core per running node;
    - ``attribution=False``: no why-late recorder (its tracefs reader and /proc/stat sampler threads).

    A test of timing (wake-up, misses, why a cycle was late) passes ``spin_us=None`` / ``attribution=None``
    (the default config's) or ``True``; TOML in ``extra`` that sets either wins."""
    return harness.write_node_config(path, ep_dir, extra, transport, spin_us=spin_us, attribution=attribution,
                                     isa=isa)


def quiet_node_toml(toml):
    """A whole node config's TOML (a launch file's, say) with ``write_node_config``'s test defaults: no spin, no
    why-late recorder, the widest copy, unless ``toml`` sets them."""
    return harness.with_node_defaults(toml, spin_us=0, attribution=False, isa="widest")


def start_node(tmp_path, model, extra="", args=(), transport="ipc", spin_us=0, attribution=False):
    """A node on endpoints private to ``tmp_path`` with a test's config (``write_node_config`` above: no spin,
    no why-late recorder unless asked); returns (NodeProcess, config path). Every node is reaped after its
    test by the autouse fixture in conftest.py (NodeProcess.reap)."""
    cfg = os.path.join(str(tmp_path), "node.toml")
    write_node_config(cfg, str(tmp_path), extra, transport, spin_us=spin_us, attribution=attribution)
    return NodeProcess(cfg, model, *args), cfg


def cli_popen(*args, **kw):
    """``python -m control_node ARGS`` as a child process (stdout+stderr piped, text)."""
    return subprocess.Popen([sys.executable, "-m", "control_node", *map(str, args)], cwd=CHILD_CWD,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def start_flood(endpoint, rate_hz, duration_s, seq0, xs):
    """A separate publisher process sending valid frames (seq0, seq0+1, ...; x cycling through ``xs``)
    at ``rate_hz`` for ``duration_s``; its stdout's last line is a JSON report (sent, last_seq, ...)."""
    import json
    return subprocess.Popen([sys.executable, child_script("flood.py"), endpoint, str(rate_hz), str(duration_s),
                             str(seq0), json.dumps(np.asarray(xs).tolist())],
                            cwd=CHILD_CWD, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_hog(cpu=None):
    """A busy-loop process (optionally pinned to ``cpu``). Stop it with ``.kill()``."""
    code = "import os, sys\n"
    if cpu is not None:
        code += f"os.sched_setaffinity(0, {{{int(cpu)}}})\n"
    code += "while True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


DIAG_RACE = "number of non-zero array elements changed"


def stop_node(node, sig=None, timeout=15.0):
    """``node.stop()`` that names a known failure: if the node ignores SIGTERM because its diagnostics
    thread died on the histogram race (fixed in 8187681, see
    tests/test_reliability.py::test_diagnostics_error_does_not_disable_sigterm), the node is killed and
    the calling test fails with that evidence."""
    import pytest
    import signal
    try:
        return node.stop(sig or signal.SIGTERM, timeout=timeout)
    except subprocess.TimeoutExpired:
        node.proc.kill()
        _, err = node.proc.communicate()
        if DIAG_RACE in (err or ""):
            pytest.fail("regression: the node's diagnostics thread died (RuntimeError: " + DIAG_RACE +
                        " in stats.describe_hist), so SIGTERM was ignored")
        raise


def assert_answered_or_superseded(sim_summary, node_summary, share=0.95, in_flight=0, why_in_flight=""):
    """The simulator's frames were answered, or superseded by a newer frame in the same cycle.

    A host stall of the loop (5-20 ms on this VM) lets several frames queue; the node answers the newest
    and counts the others in its own ``superseded``. Those are explained by the node's record, not lost:
    the bound is on frames neither answered nor superseded. ``in_flight`` frames the caller has shown the
    node never received (``why_in_flight`` says how) count as explained too."""
    sent, answered = sim_summary["frames_sent"], sim_summary["frames_answered"]
    superseded = node_summary["superseded"]
    assert answered + superseded + in_flight >= share * sent, (
        f"{sent - answered} of {sent} frames unanswered, only {superseded} superseded by the node's count"
        + (f", {in_flight} never received ({why_in_flight})" if in_flight else ""))


class FedSockets:
    """In-process loop sockets: a SUB bound at ``tmp_path/s`` fed for ``seconds`` by a feeder process
    (children/feeder.py) sending the observation ``x`` every ~100 us, and a PUB bound at ``tmp_path/a``. A
    context manager; waits until the feeder's frames arrive."""

    def __init__(self, tmp_path, x, seconds: float = 60):
        self.ctx = zmq.Context()
        self.sub, self.pub = self.ctx.socket(zmq.SUB), self.ctx.socket(zmq.PUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.bind(f"ipc://{tmp_path}/s")
        self.pub.bind(f"ipc://{tmp_path}/a")
        self.feeder = start_feeder(f"ipc://{tmp_path}/s", x, seconds)

    def __enter__(self):
        assert self.sub.poll(10000), "feeder never connected"
        return self

    def __exit__(self, *exc):
        self.feeder.kill()
        self.feeder.wait()
        self.sub.close(0)
        self.pub.close(0)
        self.ctx.term()
        return False


def assert_replay_compared_every_recorded_answer(mcap, sim_dir, verify_summary):
    """``replay --verify`` compared every answer the simulator got while the recorder was listening.

    The recording's /sensor frames are exactly the simulator's frames between the first and last one it
    holds (nothing lost inside the recording; frames published before the recorder's SUB joined the tap
    are PUB/SUB's slow joiner), and ``compared`` covers every non-safe answer the simulator received for
    them whose first recorded action is not safe. An answer the recording holds no such action for is allowed
    only where the recording shows the loss: a gap in the node's cycle numbers (a subscriber that falls
    more than [limits] send_hwm messages behind loses them, by design, sockets.py; a recorder starved on a
    loaded host lost 171 in a row once, one of them the only answer to a frame). Counts from the run's own
    evidence: a bound like "> 500 compared" measures the host's speed."""
    from control_node.recording.reader import read_recording, recorded_answers
    rec = read_recording(mcap, ["/sensor", "/action"])
    sensor = [msgpack.unpackb(raw)["seq"] for raw, _ in rec["/sensor"]]
    actions = [msgpack.unpackb(raw) for raw, _ in rec["/action"]]
    rt = np.load(os.path.join(sim_dir, "roundtrip.npz"))
    in_span = (rt["seq"] >= min(sensor)) & (rt["seq"] <= max(sensor))
    assert sorted(sensor) == sorted(rt["seq"][in_span].tolist()), "the recording lost /sensor frames inside its span"
    # answers up to the last one the recorder took: it can stop between the last frame and that frame's answer
    # (1587 compared of 1588 once)
    last_answered = max(a["seq"] for a in actions)
    answered = in_span & (rt["seq"] <= last_answered) & (rt["rtt_ns"] >= 0) & ~rt["safe"]
    # the answers verify compares: the first recorded action of a seq, when not safe (recorded_answers)
    held = answered & np.isin(rt["seq"], [q for q, (_, safe) in recorded_answers(mcap).items() if not safe])
    cycles = np.array([a["cycle"] for a in actions])
    lost_cycles = int(np.clip(np.diff(cycles) - 1, 0, None).sum())
    assert held.sum() == answered.sum() or lost_cycles > 0, \
        f"no recorded action for seq {rt['seq'][answered & ~held].tolist()[:10]}, yet no cycle is missing"
    assert verify_summary["mismatches"] == 0
    assert verify_summary["compared"] >= int(held.sum()) > 0, (verify_summary["compared"], int(held.sum()),
                                                               int(answered.sum()), lost_cycles)


def assert_offline_rollout(sim_dir, model, duration_s, control_every=10):
    """The pendulum run in ``sim_dir`` (a lockstep one) is the offline rollout (``sim.pendulum.rollout``, the
    policy every ``control_every`` physics steps, no delay) of ``model``: every step's torque and angle equal,
    bit for bit, so nothing on the way (frames, node, kernel, actions, a bridge) changed a value."""
    from control_node.kernels import Policy
    from control_node.sim import pendulum as P
    policy = Policy.load(str(model))
    _, theta, u = P.rollout(lambda o: policy.act(np.asarray(o, dtype=np.float64))[0], duration_s=duration_s,
                            control_every=control_every)
    trace = np.load(os.path.join(str(sim_dir), "control.npz"))
    assert len(trace["u"]) == len(u), f"the run has {len(trace['u'])} steps of {len(u)}: it was stopped early"
    differ = np.flatnonzero((trace["u"] != u) | (trace["theta"] != theta))
    assert differ.size == 0, (differ[:5], trace["u"][differ[:5]], u[differ[:5]])
