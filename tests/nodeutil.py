"""Test helpers: start a real node process on private endpoints and talk to it over real sockets."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import msgpack
import numpy as np
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_config(path, tmp_dir, transport="ipc", extra=""):
    """A node config with endpoints private to ``tmp_dir`` (ipc) or free loopback ports (tcp)."""
    if transport == "ipc":
        eps = {k: f"ipc://{tmp_dir}/{k}" for k in ("sensor", "action", "diagnostics")}
    else:
        ctx = zmq.Context.instance()
        eps = {}
        for k in ("sensor", "action", "diagnostics"):
            s = ctx.socket(zmq.PUB)
            port = s.bind_to_random_port("tcp://127.0.0.1")
            s.close(linger=0)
            eps[k] = f"tcp://127.0.0.1:{port}"
    text = "[endpoints]\n" + "".join(f'{k} = "{v}"\n' for k, v in eps.items())
    text += f'[node]\nrun_root = "{tmp_dir}/runs"\n' + extra
    with open(path, "w") as f:
        f.write(text)
    return eps


class NodeProcess:
    """`control-node run` as a child process; waits for its `ready` line."""

    def __init__(self, config, model, *args, ready_timeout=30.0):
        cmd = [sys.executable, "-m", "control_node", "run", "--config", str(config), "--model", str(model),
               *map(str, args)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + ready_timeout
        self.ready_line = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("ready "):
                self.ready_line = line.strip()
                break
        if self.ready_line is None:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise RuntimeError(f"node did not become ready: rc={self.proc.returncode}\n{out}\n{err}")
        self.endpoints = dict(kv.split("=", 1) for kv in self.ready_line.split()[1:])

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Signal the node, wait, return (returncode, stdout, stderr, run_dir)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=timeout)
        run_dir = None
        for line in out.splitlines():
            if line.startswith("run directory: "):
                run_dir = line[len("run directory: "):].strip()
        if run_dir and not os.path.isabs(run_dir):
            run_dir = os.path.join(ROOT, run_dir)
        return self.proc.returncode, out, err, run_dir

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class Robot:
    """A client: PUB connected to the node's sensor endpoint, SUB to its actions."""

    def __init__(self, endpoints):
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
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

    def actions(self, timeout=1.0):
        """Every action received within ``timeout`` seconds."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sub.poll(int(left * 1000) + 1):
                return out
            out.append(msgpack.unpackb(self.sub.recv()))

    def wait_answer(self, seq, timeout=2.0):
        """The first action answering ``seq`` (safe or not), or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sub.poll(50):
                a = msgpack.unpackb(self.sub.recv())
                if a["seq"] == seq:
                    return a
        return None

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
