"""A private network namespace holding only loopback (``ip netns``), for processes that must not reach a real
interface (DDS discovers over multicast) or that need TCP settings of their own (``net.ipv4.tcp_*`` sysctls are
per namespace). Ipc sockets are files, so a process inside still reaches a node outside."""
from __future__ import annotations

import itertools
import os
import signal
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_COUNT = itertools.count()


class Namespace:
    """``ip netns`` named ``cn-<tag>-<pid>-<n>`` (unique in this run: a namespace left behind by one test cannot
    make the next one's ``add`` fail); ``sysctls`` ({"net.ipv4.tcp_rmem": "4096 8192 16384"}) are set inside it
    before anything runs there; ``env`` is every process's environment."""

    def __init__(self, tag, env=None, sysctls=None):
        self.name = f"cn-{tag}-{os.getpid()}-{next(_COUNT)}"[-48:]
        self.env = env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.sysctls = dict(sysctls or {})

    def up(self):
        if os.geteuid() != 0:
            pytest.skip("this test needs a private network namespace: run as root (ip netns add)")
        r = subprocess.run(["ip", "netns", "add", self.name], capture_output=True, text=True)
        if r.returncode:
            if any(w in r.stderr for w in ("Operation not permitted", "Permission denied", "not supported")):
                pytest.skip(f"cannot create a network namespace (ip netns add: {r.stderr.strip()})")
            raise RuntimeError(f"ip netns add {self.name}: {r.stderr.strip()}")
        try:
            self.run("ip", "link", "set", "lo", "up")
            links = self.run("ip", "-o", "link").stdout
            assert [ln.split(":")[1].strip() for ln in links.splitlines()] == ["lo"], links
            for key, value in self.sysctls.items():
                self.run("sysctl", "-q", "-w", f"{key}={value}")
                assert self.run("sysctl", "-n", key).stdout.split() == value.split(), key
        except BaseException:
            self.close()
            raise
        return self

    def run(self, *cmd):
        """``cmd`` inside, to completion (raises if it fails)."""
        return subprocess.run(["ip", "netns", "exec", self.name, *cmd], capture_output=True, text=True, check=True)

    def popen(self, *cmd, **kw):
        kw.setdefault("cwd", ROOT)
        kw.setdefault("env", self.env)
        return subprocess.Popen(["ip", "netns", "exec", self.name, *map(str, cmd)], text=True, **kw)

    def close(self):
        pids = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout.split()
        for p in pids:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        r = subprocess.run(["ip", "netns", "del", self.name], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"ip netns del {self.name}: {r.stderr.strip()}")
