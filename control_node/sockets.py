"""The node's ZeroMQ sockets: bound, secured and sized before the loop starts."""
from __future__ import annotations

import os

import zmq

from control_node.endpoints import ipc_listened, ipc_path, runtime_dir
from control_node.errors import UserError

class NodeSockets:
    """The node's bound sockets: sensor SUB, action PUB, diagnostics PUB and control REP (used only by the
    lifecycle thread, control_node.lifecycle).

    ``security`` is the config's [security] table: with ``curve = true`` all three are CURVE servers and a
    ZAP authenticator admits only the client keys in ``allowed_clients`` (control_node/security.py). ipc
    socket directories must be private to this user (created 0700; a wider existing one is refused).
    """

    # PUB sockets only ever receive subscription messages (a few bytes): cap them hard
    PUB_MAXMSGSIZE = 1024
    # control requests are a few hundred bytes (a name and a path)
    CONTROL_MAXMSGSIZE = 64 * 1024

    def __init__(self, endpoints: dict, max_frame_bytes: int, send_hwm: int = 1000, security: dict | None = None,
                 io_cpus=None, recv_hwm: int = 1000):
        """``io_cpus``: the cores libzmq's I/O thread may run on (the loop's left out: it would wake there
        for every frame); None: any."""
        from control_node.security import ServerCurve, check_runtime_dir
        self.ctx = zmq.Context.instance()
        for cpu in sorted(io_cpus or ()):
            self.ctx.set(zmq.THREAD_AFFINITY_CPU_ADD, cpu)     # before the first socket starts the I/O thread
        self.endpoints = dict(endpoints)
        self.curve = None
        self._bound = []
        names = ("sensor", "action", "diagnostics", "control")
        for name in names:     # refuse before anything is created
            path = ipc_path(self.endpoints[name])
            if path:
                check_runtime_dir(path, self.endpoints[name], name, default_dir=runtime_dir())
                if ipc_listened(path):
                    raise UserError(f"cannot bind the {name} endpoint {self.endpoints[name]}: another process "
                                    f"listens there (a node already running with these [endpoints]?). Fix: stop "
                                    f"it, or give this node other [endpoints] (the default {{runtime_dir}} follows "
                                    f"$XDG_RUNTIME_DIR)")
        if security and security.get("curve"):
            self.curve = ServerCurve(self.ctx, security)      # raises UserError on bad/unsafe key files
        self.sensor = self.ctx.socket(zmq.SUB)
        self.sensor.setsockopt(zmq.SUBSCRIBE, b"")
        # frames up to 16x the cap still arrive and are counted as oversized; beyond
        # that libzmq drops the sender's connection before we see them
        self.sensor.setsockopt(zmq.MAXMSGSIZE, 16 * max_frame_bytes)
        # frames that arrive while the loop is stalled queue here; past it libzmq drops them before the node
        # can count them (the loop drains the whole queue every cycle)
        self.sensor.setsockopt(zmq.RCVHWM, recv_hwm)
        self.action = self.ctx.socket(zmq.PUB)
        self.diagnostics = self.ctx.socket(zmq.PUB)
        for s in (self.action, self.diagnostics):
            s.setsockopt(zmq.SNDHWM, send_hwm)       # slow subscribers lose messages, never block us
            s.setsockopt(zmq.MAXMSGSIZE, self.PUB_MAXMSGSIZE)
        self.control = self.ctx.socket(zmq.REP)
        self.control.setsockopt(zmq.MAXMSGSIZE, self.CONTROL_MAXMSGSIZE)
        for sock in (self.sensor, self.action, self.diagnostics, self.control):
            sock.setsockopt(zmq.LINGER, 0)
            if self.curve is not None:
                self.curve.apply(sock)
        for name, sock in zip(names, (self.sensor, self.action, self.diagnostics, self.control)):
            ep = self.endpoints[name]
            try:
                sock.bind(ep)
            except zmq.ZMQError as e:
                self.close()
                raise UserError(f"cannot bind the {name} endpoint {ep}: {e}. Fix: choose a free endpoint in "
                                f"[endpoints] or stop the other node using it") from None
            self._bound.append(name)

    def close(self):
        for sock in (self.sensor, self.action, self.diagnostics, self.control):
            if not sock.closed:
                sock.close(linger=0)
        if self.curve is not None:
            self.curve.stop()
            self.curve = None
        for name in self._bound:                     # only the socket files we created
            path = ipc_path(self.endpoints.get(name, ""))
            if path and os.path.exists(path):
                try:
                    os.unlink(path)
                except OSError:
                    pass
