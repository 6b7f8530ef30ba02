"""Record the node's streams to MCAP, in the format of :mod:`control_node.recording`.

Chunks are compressed (zstd if available, else lz4, else none) and flushed to disk at least every
``flush_interval`` seconds, so a killed recorder leaves a file readable up to its last complete chunk.
"""
from __future__ import annotations

import os
import time

from control_node.recording import MESSAGE_ENCODING, SIM_STATE, TOPIC_ENDPOINTS, TOPICS


def best_compression():
    from mcap.writer import CompressionType
    try:
        import zstandard  # noqa: F401
        return CompressionType.ZSTD
    except ImportError:
        pass
    try:
        import lz4.frame  # noqa: F401
        return CompressionType.LZ4
    except ImportError:
        return CompressionType.NONE


def record(endpoints, out, duration=None, flush_interval=1.0, chunk_size=256 * 1024, stopper=None, log=print,
           curve=None):
    """``curve``: client keys for the node's action/diagnostics sockets (the sensor tap stays plaintext)."""
    import zmq

    from control_node.security import configure_client
    from mcap.writer import Writer

    ctx = zmq.Context.instance()
    socks = {}
    recorded = {t: k for t, k in TOPIC_ENDPOINTS.items() if endpoints.get(k)}   # /sim/state: when named
    for topic, key in recorded.items():
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 100000)
        s.setsockopt(zmq.RECONNECT_IVL, 10)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        if key != "sensor_tap":
            configure_client(s, curve)
        s.connect(endpoints[key])
        socks[topic] = s
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    f = open(out, "wb")
    comp = best_compression()
    w = Writer(f, chunk_size=chunk_size, compression=comp)
    w.start(profile="", library="control-node recorder")
    w.add_metadata("control-node", {k: str(v) for k, v in endpoints.items()})
    def channel(t):
        return w.register_channel(topic=t, message_encoding=MESSAGE_ENCODING, schema_id=0,
                                  metadata={"endpoint": endpoints[recorded[t]]})
    # the node's streams up front; the simulator's state at its first message (most drivers have none)
    chan = {t: channel(t) for t in recorded if t != SIM_STATE}
    counts = {t: 0 for t in TOPICS if t in recorded}
    poller = zmq.Poller()
    by_sock = {}
    for t, s in socks.items():
        poller.register(s, zmq.POLLIN)
        by_sock[s] = t
    log(f"recording to {out} ({comp.name.lower()} chunks): sensor tap {endpoints['sensor_tap']}, "
        f"action {endpoints['action']}, diagnostics {endpoints['diagnostics']}")
    t_end = None if duration is None else time.monotonic() + duration
    next_flush = time.monotonic() + flush_interval
    try:
        while stopper is None or not stopper.stop:
            now = time.monotonic()
            if t_end is not None and now >= t_end:
                break
            if now >= next_flush:
                w.flush()
                next_flush = now + flush_interval
            for s, _ in poller.poll(100):
                t = by_sock[s]
                while True:
                    try:
                        raw = s.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    lt = time.time_ns()
                    if t not in chan:
                        chan[t] = channel(t)
                    w.add_message(chan[t], log_time=lt, data=raw, publish_time=lt, sequence=counts[t])
                    counts[t] += 1
    finally:
        w.finish()
        f.close()
        for s in socks.values():
            s.close()
    return {t: n for t, n in counts.items() if t != SIM_STATE or n}
