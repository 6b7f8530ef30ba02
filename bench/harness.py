"""A harness for checking the node: private endpoints, a node config, and the real node as a child
process that is always reaped.

Used by ``tests/`` and ``bench/`` alike, so that there is one way to start a node for a check. Children
run the installed package (``python -m control_node``) from :data:`CHILD_CWD`, a scratch directory
outside the repository, so that nothing they do depends on (or writes into) the source tree.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

CHILD_CWD = tempfile.mkdtemp(prefix="cn-children-")


def make_endpoint_dir():
    """A short unique dir for ipc sockets (ipc paths are limited to ~107 bytes)."""
    return tempfile.mkdtemp(prefix="pytest-cn-", dir="/tmp")


def free_tcp_ports(n):
    """``n`` distinct free loopback TCP ports. All are held bound until every one is chosen: a port
    released at once can be handed straight out again, giving two endpoints the same port."""
    import socket
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _with_default(extra, table, key, value):
    """``extra`` TOML with ``key = value`` in ``[table]``, unless ``extra`` already sets ``key`` there."""
    if re.search(rf"^{key}\s*=", extra, re.M):
        return extra
    line = f"{key} = {value}\n"
    head = f"[{table}]\n"
    return extra.replace(head, head + line, 1) if head in extra else extra + head + line


def with_node_defaults(toml, spin_us=None, attribution=None, isa=None):
    """``toml`` with ``spin_us`` in ``[loop]``, ``attribution`` in ``[diagnostics]`` and ``isa`` in ``[policy]``
    (None: left out, the config's default), unless ``toml`` already sets them."""
    if isa is not None:
        toml = _with_default(toml, "policy", "isa", f'"{isa}"')
    if spin_us is not None:
        toml = _with_default(toml, "loop", "spin_us", f"{spin_us:g}")
    if attribution is not None:
        toml = _with_default(toml, "diagnostics", "attribution", "true" if attribution else "false")
    return toml


def write_node_config(path, ep_dir, extra="", transport="ipc", spin_us=None, attribution=None, isa=None):
    """Write a node config whose endpoints are private: ipc sockets in ``ep_dir``, or free loopback tcp
    ports; runs go to ``ep_dir/runs``. ``extra`` is appended TOML; ``spin_us`` and ``attribution`` (None:
    the config's default) go into its ``[loop]`` and ``[diagnostics]`` tables unless ``extra`` sets them.
    Returns the endpoints by name."""
    extra = with_node_defaults(extra, spin_us, attribution, isa)
    names = ("sensor", "action", "diagnostics", "control")
    if transport == "ipc":
        eps = {k: f"ipc://{ep_dir}/{k}" for k in names}
    else:
        eps = {k: f"tcp://127.0.0.1:{port}" for k, port in zip(names, free_tcp_ports(len(names)))}
    with open(path, "w") as f:
        f.write("[endpoints]\n" + "".join(f'{k} = "{v}"\n' for k, v in eps.items())
                + f'[node]\nrun_root = "{ep_dir}/runs"\n' + extra)
    return eps


def child_env():
    """The environment for children: this one, unbuffered (their lines arrive as they are printed)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def run_cli(*args, timeout=60, env=None):
    """``python -m control_node ARGS`` to completion (CompletedProcess, text, output captured);
    ``env``: extra environment variables, e.g. ``{"COLUMNS": "160"}`` for a wide terminal layout."""
    return subprocess.run([sys.executable, "-m", "control_node", *map(str, args)], cwd=CHILD_CWD,
                          env={**child_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout)


class NodeProcess:
    """``control-node run --config CONFIG --model MODEL ARGS...`` as a child process in its own session.

    Waits for the node's ``ready`` line (raising with its output if it exits or times out first);
    ``endpoints`` holds what that line announced. ``stop()`` signals it and returns
    ``(returncode, stdout, stderr, run_dir)``; used as a context manager it stops on exit.
    """

    started = []            # every NodeProcess ever started: reap() kills those still running

    def __init__(self, config, model, *args, ready_timeout=30.0):
        cmd = [sys.executable, "-m", "control_node", "run", "--config", str(config), "--model", str(model),
               *map(str, args)]
        self.proc = subprocess.Popen(cmd, cwd=CHILD_CWD, env=child_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        NodeProcess.started.append(self)
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
            self.kill()
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
            run_dir = os.path.join(CHILD_CWD, run_dir)
        return self.proc.returncode, out, err, run_dir

    def kill(self):
        """SIGKILL the node's whole session (nothing of it may keep spinning on the loop core)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.communicate()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.stop(timeout=15.0)
        except subprocess.TimeoutExpired:
            self.kill()
        return False

    @classmethod
    def reap(cls, since: int = 0) -> None:
        """SIGKILL every node started after the first ``since`` that is still running (a failed check
        must not leave a SCHED_FIFO node spinning on the loop core)."""
        while len(cls.started) > since:
            cls.started.pop().kill()
