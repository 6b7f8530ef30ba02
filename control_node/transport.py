"""ZeroMQ sockets for the node, and the libzmq entry points its compiled loop calls.

The loop calls libzmq directly (no GIL, no Python objects). Rather than linking
against the privately named libzmq inside pyzmq's wheel at build time (fragile
across pyzmq upgrades), we look up, at run time, the very library that pyzmq
loaded into this process and take the addresses of five stable C functions.
"""
from __future__ import annotations

import ctypes
import os

import zmq

from control_node.errors import UserError

LIBZMQ_FUNCTIONS = ("zmq_recv", "zmq_send", "zmq_getsockopt", "zmq_errno", "zmq_poll")


def _loaded_libzmq_path() -> str:
    import zmq.backend.cython  # noqa: F401  (loads libzmq into the process)
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libzmq" in os.path.basename(path):
                return path
    raise UserError("cannot find the libzmq that pyzmq loaded (no 'libzmq' in /proc/self/maps); "
                    "reinstall pyzmq")


def libzmq_functions() -> dict:
    """Addresses (ints) of the libzmq functions the loop uses, from pyzmq's own libzmq."""
    lib = ctypes.CDLL(_loaded_libzmq_path(), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in LIBZMQ_FUNCTIONS}


def ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


class NodeSockets:
    """The node's three bound sockets: sensor SUB, action PUB, diagnostics PUB."""

    def __init__(self, endpoints: dict, max_frame_bytes: int, send_hwm: int = 1000):
        self.ctx = zmq.Context.instance()
        self.endpoints = dict(endpoints)
        self.sensor = self.ctx.socket(zmq.SUB)
        self.sensor.setsockopt(zmq.SUBSCRIBE, b"")
        # frames up to 16x the cap still arrive and are counted as oversized; beyond
        # that libzmq drops the sender's connection before we see them
        self.sensor.setsockopt(zmq.MAXMSGSIZE, 16 * max_frame_bytes)
        self.sensor.setsockopt(zmq.RCVHWM, 1000)
        self.action = self.ctx.socket(zmq.PUB)
        self.diagnostics = self.ctx.socket(zmq.PUB)
        for s in (self.action, self.diagnostics):
            s.setsockopt(zmq.SNDHWM, send_hwm)       # slow subscribers lose messages, never block us
            s.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
        for sock in (self.sensor, self.action, self.diagnostics):
            sock.setsockopt(zmq.LINGER, 0)
        for name, sock in (("sensor", self.sensor), ("action", self.action),
                           ("diagnostics", self.diagnostics)):
            ep = self.endpoints[name]
            path = ipc_path(ep)
            if path:
                os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            try:
                sock.bind(ep)
            except zmq.ZMQError as e:
                self.close()
                raise UserError(f"cannot bind the {name} endpoint {ep}: {e}. Fix: choose a free endpoint in "
                                f"[endpoints] or stop the other node using it") from None

    def close(self):
        for sock in (self.sensor, self.action, self.diagnostics):
            if not sock.closed:
                sock.close(linger=0)
        for name in ("sensor", "action", "diagnostics"):
            path = ipc_path(self.endpoints.get(name, ""))
            if path and os.path.exists(path):
                try:
                    os.unlink(path)
                except OSError:
                    pass
