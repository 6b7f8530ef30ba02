"""The live view's process: a Foxglove WebSocket server fed by ZeroMQ subscribers of the node's action
and diagnostics streams, the sensor tap and the simulator's state stream.

It is a process of its own (``control-node live``; ``launch --foxglove`` and ``run --foxglove`` start it),
never a thread of the node: the node only publishes, as it does for ``top``. Its SUB sockets keep a bounded
queue (RCVHWM) and drop beyond it; the foxglove-sdk server keeps at most ``message_backlog_size`` messages
per viewer and drops the oldest for a slow one (or closes its connection when its control queue fills too). A
viewer, slow or not, costs the node nothing.
"""
from __future__ import annotations

import json
import sys
import time

from control_node.errors import UserError
from control_node.live import channels as ch

INSTALL = "pip install 'control-node[foxglove]'"
RCVHWM = 20000            # per subscription: ~20 s of frames at 1 kHz, then ZeroMQ drops
BACKLOG = 1024            # per viewer, messages (foxglove-sdk drops the oldest beyond it)


def require_sdk():
    """The foxglove-sdk module, or a UserError naming the install command."""
    try:
        import foxglove
        import foxglove.websocket  # noqa: F401
    except ImportError:
        raise UserError("the live view needs the foxglove extra (the foxglove-sdk package). "
                        f"Fix: {INSTALL}") from None
    return foxglove


def model_feature_names(model_path):
    """The model file's feature names, or None (unreadable file: the frames are named x0, x1, ...)."""
    if not model_path:
        return None
    try:
        from control_node.kernels import load_model
        return list(load_model(model_path).feature_names)
    except Exception:       # noqa: BLE001 - names are a nicety; the node refuses a bad model itself
        return None


class LiveServer:
    """SUB sockets in, Foxglove channels out, on the calling thread; ``stop`` from any thread."""

    def __init__(self, endpoints: dict, listen: tuple[str, int], key: str, every=ch.DEFAULT_EVERY,
                 feature_names=None, curve=None, state_endpoint=None):
        import zmq

        from control_node.security import configure_client
        foxglove = require_sdk()
        self.zmq = zmq
        self.stopping = False
        self.counts = {t: 0 for t in ch.TOPICS + ch.LEGGED_TOPICS}
        self.sent_bytes = 0                 # encoded for viewers (each viewer's queue holds at most BACKLOG)
        # wall - monotonic, once per run: every message's time is its sender's monotonic time + this
        self.conv = ch.Converter(time.time_ns() - time.monotonic_ns(), every, feature_names=feature_names)
        self.ctx = zmq.Context()
        self.socks = {}
        sources = {"sensor": endpoints["sensor_tap"], "action": endpoints["action"],
                   "diagnostics": endpoints["diagnostics"]}
        if state_endpoint:
            sources["sim"] = state_endpoint
        for name, ep in sources.items():
            s = self.ctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, RCVHWM)
            s.setsockopt(zmq.RECONNECT_IVL, 50)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            if name in ("action", "diagnostics"):
                configure_client(s, curve)
            s.connect(ep)
            self.socks[name] = s
        self.sources = sources
        host, port = listen
        try:
            self.server = foxglove.start_server(name="control-node", host=host, port=port,
                                                message_backlog_size=BACKLOG)
        except Exception as e:      # noqa: BLE001 - the SDK raises its own error type for a busy port
            self.close()
            raise UserError(f"{key} = \"{host}:{port}\": cannot listen there ({e}). Fix: a free port, or "
                            "another address") from None
        self.channels = {}
        self._foxglove = foxglove

    @property
    def port(self) -> int:
        return self.server.port

    def _channel(self, topic):
        c = self.channels.get(topic)
        if c is None:
            sch = ch.schema(topic, feature_names=self.conv.feature_names or (),
                            action_names=self.conv.action_names or (), legged=self.conv.legged)
            c = self.channels[topic] = self._foxglove.Channel(topic, schema=sch, message_encoding="json")
        return c

    def _emit(self, items):
        for topic, msg, log_time in items:
            c = self._channel(topic)
            self.counts[topic] += 1
            if c.has_sinks():               # nobody subscribed: skip the JSON encoding
                data = json.dumps(msg, allow_nan=False).encode()
                self.sent_bytes += len(data)
                c.log(data, log_time=log_time)

    def _convert(self, name, raw):
        import msgpack
        try:
            m = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception:       # noqa: BLE001 - a torn or foreign message is skipped, not fatal
            return []
        if not isinstance(m, dict):
            return []
        convert = {"sensor": self.conv.sensor, "action": self.conv.action, "sim": self.conv.sim_state,
                   "diagnostics": self.conv.diagnostics}[name]
        try:
            return convert(m)
        except (TypeError, ValueError, KeyError, AttributeError):
            return []           # a frame the node rejects (wrong types) is not plotted either

    def serve(self, duration=None):
        zmq = self.zmq
        poller = zmq.Poller()
        by_sock = {}
        for name, s in self.socks.items():
            poller.register(s, zmq.POLLIN)
            by_sock[s] = name
        t_end = None if duration is None else time.monotonic() + duration
        while not self.stopping and (t_end is None or time.monotonic() < t_end):
            for s, _ in poller.poll(100):
                name = by_sock[s]
                for _ in range(1000):        # bounded: the other sockets get their turn
                    try:
                        raw = s.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._emit(self._convert(name, raw))

    def stop(self):
        self.stopping = True

    def close(self):
        srv = getattr(self, "server", None)
        if srv is not None:
            srv.stop()
            self.server = None
        for s in self.socks.values():
            s.close(linger=0)
        self.ctx.term()


def run_live(endpoints, listen, key, every=ch.DEFAULT_EVERY, model=None, curve=None, state_endpoint=None,
             duration=None, loop_cpu=None):
    """Serve until SIGINT/SIGTERM (or ``duration``); prints ``foxglove listening ws://HOST:PORT`` once up."""
    import os
    import signal

    if loop_cpu is not None:        # keep off the node's loop core (launch does this for its children too)
        rest = set(os.sched_getaffinity(0)) - {int(loop_cpu)}
        if rest:
            os.sched_setaffinity(0, rest)
    srv = LiveServer(endpoints, listen, key, every=every, feature_names=model_feature_names(model), curve=curve,
                     state_endpoint=state_endpoint)
    old = {s: signal.signal(s, lambda *_: srv.stop()) for s in (signal.SIGINT, signal.SIGTERM)}
    host = listen[0] if ":" not in listen[0] else f"[{listen[0]}]"
    try:
        print(f"foxglove listening ws://{host}:{srv.port} (open it in Foxglove or Lichtblick: Open connection, "
              f"Foxglove WebSocket); every {every}th frame, step and cycle window", flush=True)
        srv.serve(duration)
    finally:
        srv.close()
        for s, h in old.items():
            signal.signal(s, h)
    print("foxglove: messages " + ", ".join(f"{t} {n}" for t, n in srv.counts.items())
          + f"; {srv.sent_bytes} bytes encoded for viewers"
          + (f"; joint states: {srv.conv.superseded} of frames the node never acted on (a newer frame came "
             f"first: command null), {srv.conv.unpaired} frames or commands left without the other"
             if srv.conv.legged else ""), file=sys.stderr, flush=True)
    return 0
