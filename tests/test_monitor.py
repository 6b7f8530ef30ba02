"""control-node top / hz / echo against real ZeroMQ PUB sockets (and the real node when it is built)."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from control_node import monitor
from control_node.bench.harness import CHILD_CWD, free_tcp_ports, run_cli

PY = sys.executable
ENV = {**os.environ, "COLUMNS": "160", "PYTHONUNBUFFERED": "1"}

RT = {"cpu": {"requested": 3, "granted": True, "detail": "pinned to CPU 3"},
      "sched": {"requested": True, "granted": False, "detail": "SCHED_FIFO refused: EPERM"},
      "mlock": {"requested": True, "granted": True, "detail": "mlockall ok"}}


def diag_msg(i):
    return {"t_ns": time.monotonic_ns(), "cycles": 1000 + 100 * i, "rate_hz": 999.5, "deadline_misses": 2 + i // 10,
            "stale_cycles": 7, "safe_actions": 7, "superseded": 1, "frames_valid": 990 + 100 * i,
            "rejected": {"malformed": 3, "non_finite": 0},
            "window": {"wake_latency_ns": {"p50": 12_300.0, "p99": 45_600.0, "p999": 78_900.0, "max": 123_400.0},
                       "cycle_time_ns": {"p50": 20_000.0, "p99": 30_000.0, "p999": 40_000.0, "max": 50_000.0},
                       "input_age_ns": None},
            "rt": RT}


class Publisher:
    """A PUB socket bound on a random TCP port, publishing make(i) every `interval` seconds in a thread."""

    def __init__(self, make, interval):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.make, self.interval = make, interval
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        t = time.monotonic()
        while not self.stop.is_set():
            self.sock.send(msgpack.packb(self.make(self.sent)))
            self.sent += 1
            t += self.interval
            d = t - time.monotonic()
            if d > 0:
                time.sleep(d)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.sock.close(0)
        self.ctx.term()


def cli(*args, timeout=60):
    return run_cli(*args, timeout=timeout, env={"COLUMNS": "160"})


def tcp_config(tmp_path, tap=True) -> Path:
    """A node config whose endpoints are private TCP ports (no clash with other nodes on this host).

    The node's config loader does not know ``sensor_tap`` (only clients read it), so tap=False for the node.
    """
    p = free_tcp_ports(4)
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'[endpoints]\nsensor = "tcp://127.0.0.1:{p[0]}"\naction = "tcp://127.0.0.1:{p[1]}"\n'
                   f'diagnostics = "tcp://127.0.0.1:{p[2]}"\n'
                   + (f'sensor_tap = "tcp://127.0.0.1:{p[3]}"\n' if tap else ""))
    return cfg


# ------------------------------------------------------------------------------ unit

def test_decode_and_yaml():
    x = np.array([5.1, 3.5, 1.4, 0.2])
    m = monitor.decode([msgpack.packb({"seq": 3, "t_ns": 9, "x": x.astype("<f8").tobytes()})])
    assert m == {"seq": 3, "t_ns": 9, "x": [5.1, 3.5, 1.4, 0.2]}
    assert "<undecodable>" in monitor.decode([b"\xc1garbage"])
    assert "<undecodable>" in monitor.decode([b"a", b"b"])
    y = monitor.to_yaml({"seq": 1, "safe": False, "w": {"p50": 1.5, "none": None}, "e": {}})
    assert y.splitlines() == ["seq: 1", "safe: false", "w:", "  p50: 1.5", "  none: null", "e: {}"]


def test_rate_stats():
    rs = monitor.RateStats(window=100)
    for i in range(1000):
        rs.add(i * 1_000_000 + (50_000 if i % 2 else 0))
    st = rs.stats()
    assert st["window"] == 100 and st["total"] == 1000
    assert st["rate_hz"] == pytest.approx(1000, rel=1e-3)
    assert st["min_s"] == pytest.approx(0.00095) and st["max_s"] == pytest.approx(0.00105)
    assert "average rate: 1000.000" in monitor.format_hz(st)


def test_resolve_topics(tmp_path):
    cfg = tcp_config(tmp_path)
    text = cfg.read_text()
    assert monitor.resolve("action", cfg)[0] in text
    ep, kind = monitor.resolve("sensor", cfg)
    assert kind == "sensor" and ep == re.search(r'sensor_tap = "(.*)"', text).group(1)
    assert monitor.resolve("tcp://127.0.0.1:1", cfg) == ("tcp://127.0.0.1:1", "raw")
    from control_node.errors import UserError
    with pytest.raises(UserError, match="unknown topic"):
        monitor.resolve("bogus", cfg)


# ------------------------------------------------------------------------------ top

def test_top_once_against_real_pub():
    with Publisher(diag_msg, 0.05) as pub:
        r = cli("top", "--endpoint", pub.endpoint, "--once", "--timeout", "20")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for needle in ["999.50", "wake-up latency", "12.3", "45.6", "78.9", "123", "malformed 3", "refused",
                   "SCHED_FIFO refused: EPERM", "granted", "pinned to CPU 3", pub.endpoint]:
        assert needle in out, (needle, out)


def test_top_once_times_out_with_message():
    r = cli("top", "--endpoint", f"tcp://127.0.0.1:{free_tcp_ports(1)[0]}", "--once", "--timeout", "0.5")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "no diagnostics from" in r.stderr and "is the node running" in r.stderr


def _read_pty(fd, seconds):
    buf = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace")


def test_top_live_refreshes_in_place_in_a_pty():
    with Publisher(diag_msg, 0.05) as pub:
        master, slave = pty.openpty()
        os.set_blocking(master, True)
        p = subprocess.Popen([PY, "-m", "control_node", "top", "--endpoint", pub.endpoint], cwd=CHILD_CWD,
                             stdin=slave, stdout=slave, stderr=slave, env={**ENV, "TERM": "xterm-256color"},
                             start_new_session=True)
        os.close(slave)
        try:
            # refreshed: several different cycle counts rendered, with cursor movement in between (read until
            # three have appeared: top's start-up on a busy 2-core VM has taken seconds)
            out, cycles = "", set()
            deadline = time.monotonic() + 20
            while len(cycles) < 3 and time.monotonic() < deadline:
                out += _read_pty(master, 0.5)
                cycles = set(re.findall(r"\b(\d{4,})\b", out)) & {str(1000 + 100 * i) for i in range(2000)}
            assert len(cycles) >= 3, out[-2000:]
            assert "\x1b[" in out  # rich Live redraws with ANSI control sequences
            assert "wake-up latency" in out and "SCHED_FIFO refused: EPERM" in out
            os.killpg(p.pid, signal.SIGINT)
            # keep draining the pty, as a terminal does: a full pty blocks rich's refresh thread in write(),
            # and top's exit joins that thread (the test once timed out here in a fresh-clone run)
            deadline = time.monotonic() + 20
            while p.poll() is None and time.monotonic() < deadline:
                _read_pty(master, 0.2)
            rc = p.wait(1)
            assert rc == 130
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            os.close(master)


# ------------------------------------------------------------------------------ hz / echo

def action_msg(i):
    return {"seq": i, "t_ns": time.monotonic_ns(), "cycle": i, "action": i % 3, "safe": i % 5 == 0}


def test_hz_against_real_pub():
    with Publisher(action_msg, 0.005) as pub:  # 200 Hz
        r = cli("hz", pub.endpoint, "--duration", "2.5", "--timeout", "10")
    assert r.returncode == 0, r.stderr
    rates = [float(x) for x in re.findall(r"average rate: ([\d.]+)", r.stdout)]
    assert rates, r.stdout
    assert 120 < rates[-1] < 260, r.stdout
    assert re.search(r"min: [\d.]+s max: [\d.]+s std dev: [\d.]+s window: \d+", r.stdout)


def test_echo_count_and_json():
    with Publisher(action_msg, 0.01) as pub:
        r = cli("echo", pub.endpoint, "--count", "3", "--timeout", "10")
        rj = cli("echo", pub.endpoint, "--count", "2", "--json", "--timeout", "10")
    assert r.returncode == 0, r.stderr
    blocks = [b for b in r.stdout.split("---\n") if b.strip()]
    assert len(blocks) == 3
    for b in blocks:
        keys = [ln.split(":")[0] for ln in b.strip().splitlines()]
        assert keys == ["seq", "t_ns", "cycle", "action", "safe"]
    assert rj.returncode == 0, rj.stderr
    msgs = [json.loads(ln) for ln in rj.stdout.splitlines()]
    assert len(msgs) == 2 and msgs[1]["seq"] > msgs[0]["seq"]


def test_echo_sensor_needs_tap(tmp_path):
    cfg = tcp_config(tmp_path)
    r = cli("echo", "sensor", "--config", cfg, "--count", "1", "--timeout", "0.5")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "SUB that binds" in r.stderr and "tap" in r.stderr
    r = cli("hz", "sensor", "--config", cfg, "--timeout", "0.5")
    assert r.returncode == 2 and "tap" in r.stderr


def test_echo_sensor_through_a_tap(tmp_path):
    """With a tap publishing sensor frames (as the simulator does), echo sensor decodes them (bin x too)."""
    ctx = zmq.Context()
    cfg = tcp_config(tmp_path)
    tap = re.search(r'sensor_tap = "(.*)"', cfg.read_text()).group(1)

    def frame(i):
        return {"seq": i, "t_ns": time.monotonic_ns(), "x": np.array([1.0, 2.0, 3.0, 4.5]).tobytes(), "v": 1}

    pub = Publisher(frame, 0.01)
    pub.sock.close(0)
    pub.sock = ctx.socket(zmq.PUB)
    pub.sock.bind(tap)
    with pub:
        r = cli("echo", "sensor", "--config", cfg, "--count", "2", "--timeout", "10")
    ctx.term()
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("x: [1.0, 2.0, 3.0, 4.5]") == 2


def test_unknown_topic():
    r = cli("echo", "bogus", "--count", "1")
    assert r.returncode == 2 and "unknown topic 'bogus'" in r.stderr


# ------------------------------------------------------------------------------ real node

def test_top_hz_echo_against_real_node(tmp_path, iris_model_path):
    cfg = tcp_config(tmp_path, tap=False)
    node = subprocess.Popen([PY, "-m", "control_node", "run", "--config", cfg, "--model", iris_model_path,
                             # a cap, not the test's length: SIGINT below ends it when the tools are done
                             # (four tool processes in a row can take longer than 8 s on a loaded host)
                             "--duration", "120", "--cpu", "none",
                             "--run-dir", tmp_path / "run"], cwd=CHILD_CWD, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        # once cycles run, and a second of them: a first snapshot right at start-up averages its rate over
        # the loop's first ticks (59.9 Hz once, on a loaded machine)
        line = node.stdout.readline()
        assert line.startswith("ready"), line + (node.stderr.read() if node.poll() is not None else "")
        time.sleep(1.0)
        r = cli("top", "--config", cfg, "--once", "--timeout", "20")
        assert r.returncode == 0, r.stderr + (node.stderr.read() if node.poll() is not None else "")
        assert "wake-up latency" in r.stdout and "real-time features" in r.stdout
        rate = float(re.search(r"^\s*([\d.]+)\s+\d+", r.stdout, re.M).group(1))
        assert rate > 100
        h = cli("hz", "action", "--config", cfg, "--duration", "2")
        assert h.returncode == 0, h.stderr
        rates = [float(x) for x in re.findall(r"average rate: ([\d.]+)", h.stdout)]
        assert rates and rates[-1] > 300, h.stdout
        e = cli("echo", "action", "--config", cfg, "--count", "2", "--json")
        assert e.returncode == 0, e.stderr
        msgs = [json.loads(ln) for ln in e.stdout.splitlines()]
        assert set(msgs[0]) == {"seq", "t_ns", "cycle", "action", "safe"}
    finally:
        if node.poll() is None:
            node.send_signal(signal.SIGINT)
        try:
            node.wait(20)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
