"""Test and benchmark helpers: unique ipc endpoints, a node config, and starting the real node."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def node_command(config, model, run_dir, extra=()):
    return [sys.executable, "-m", "control_node", "run", "--config", str(config), "--model", str(model),
            "--run-dir", str(run_dir), *extra]


def make_endpoint_dir():
    """A short unique dir for ipc sockets (ipc paths are limited to ~107 bytes)."""
    return tempfile.mkdtemp(prefix="pytest-cn-", dir="/tmp")


def write_node_config(path, ep_dir, extra=""):
    with open(path, "w") as f:
        f.write("[endpoints]\n"
                f'sensor = "ipc://{ep_dir}/sensor"\n'
                f'action = "ipc://{ep_dir}/action"\n'
                f'diagnostics = "ipc://{ep_dir}/diagnostics"\n' + extra)
    return path


def child_env():
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


class Node:
    """Start the node, wait for its ``ready`` line; ``stop()`` sends SIGINT and returns its stdout."""

    def __init__(self, config, model, run_dir, extra=(), timeout=30.0):
        self.proc = subprocess.Popen(node_command(config, model, run_dir, extra), cwd=ROOT, env=child_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"node exited before ready: {''.join(self.lines)}")
            self.lines.append(line)
            if line.startswith("ready "):
                return
        raise RuntimeError("node not ready in time")

    def stop(self, timeout=15.0):
        import signal
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, _ = self.proc.communicate()
        self.lines.append(out or "")
        return "".join(self.lines)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
