"""Shared code for the live monitors ``control-node top``, ``hz`` and ``echo``.

They are plain ZeroMQ ``SUB`` clients of the node's ``PUB`` sockets (docs/protocol.md): monitors that
do not connect cost the node nothing, and a slow monitor only loses messages (PUB/SUB drops).

The node's *sensor* socket is a ``SUB`` that binds, so nobody can subscribe to it. ``hz``/``echo``
on ``sensor`` subscribe instead to the sensor *tap*: a ``PUB`` on which the simulator or replayer
re-publishes every frame it sends (``[endpoints] sensor_tap`` in the config, default the sensor's
ipc path + ``_tap``, or its TCP port + 100). Without a tap, sensor frames cannot be observed.
"""
from __future__ import annotations

import math
from collections import deque

from control_node.errors import UserError

TOPICS = ("sensor", "action", "diagnostics")


def load_endpoints(config=None) -> dict:
    from control_node.config import client_endpoints as _load
    return _load(config)


def resolve(topic: str, config=None, endpoint=None) -> tuple[str, str]:
    """(endpoint, kind) for a topic name or an explicit ``ipc://``/``tcp://`` endpoint."""
    if endpoint:
        return endpoint, topic if topic in TOPICS else "raw"
    if "://" in topic:
        return topic, "raw"
    if topic not in TOPICS:
        raise UserError(f"unknown topic {topic!r}: use one of {', '.join(TOPICS)} or an endpoint "
                        "such as tcp://127.0.0.1:5556 or ipc:///path")
    eps = load_endpoints(config)
    if topic == "sensor":
        return eps["sensor_tap"], "sensor"
    return eps[topic], topic


def no_message_hint(endpoint: str, kind: str) -> str:
    where = ""
    if endpoint.startswith("ipc://"):
        import os
        path = endpoint[len("ipc://"):]
        where = (f" (socket file {path} does not exist)" if not os.path.exists(path)
                 else f" (socket file {path} exists but nothing was published)")
    if kind == "sensor":
        return (f"no sensor frames on the sensor tap {endpoint}{where}. The node's sensor socket is a SUB that "
                "binds, so sensor frames cannot be observed there; they are visible only when the simulator or "
                "replayer publishes a tap (its --tap option / [endpoints] sensor_tap). Is one running with a tap?")
    if kind == "diagnostics":
        return f"no diagnostics from {endpoint}{where}: is the node running (control-node run)? Check --endpoint/--config"
    if kind == "action":
        return f"no actions from {endpoint}{where}: is the node running (control-node run)? Check --config"
    return f"no messages from {endpoint}{where}"


def curve_for(kind: str, config=None) -> dict | None:
    """CURVE client keys for the node's own sockets (action, diagnostics) when the config turns CURVE on.

    The sensor tap belongs to the simulator/replayer and stays plaintext (bind it on loopback or ipc)."""
    if kind not in ("action", "diagnostics"):
        return None
    from control_node.security import client_curve_from_config_path
    return client_curve_from_config_path(config)


class Subscriber:
    """A SUB socket connected to ``endpoint``, subscribed to everything."""

    def __init__(self, endpoint: str, rcvhwm: int = 100000, curve: dict | None = None):
        import zmq

        from control_node.security import configure_client
        self.zmq = zmq
        self.endpoint = endpoint
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        configure_client(self.sock, curve)
        try:
            self.sock.connect(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise UserError(f"cannot connect to {endpoint}: {e}") from None

    def recv(self, timeout_s: float | None):
        """One message (list of frames) or None on timeout."""
        ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        if self.sock.poll(ms, self.zmq.POLLIN):
            return self.sock.recv_multipart()
        return None

    def close(self):
        self.sock.close(0)
        self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def decode(frames) -> dict | object:
    """Decode one protocol message (one frame, one msgpack map). ``x`` as bin -> list of float64."""
    import msgpack
    if len(frames) != 1:
        return {"<undecodable>": f"{len(frames)} frames (protocol messages have exactly one)"}
    raw = frames[0]
    try:
        msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - show any garbage as such
        return {"<undecodable>": f"{type(e).__name__}: {e}", "bytes": len(raw)}
    if isinstance(msg, dict) and isinstance(msg.get("x"), (bytes, bytearray)) and len(msg["x"]) % 8 == 0:
        import numpy as np
        msg["x"] = np.frombuffer(msg["x"], dtype="<f8").tolist()
    return msg


def to_yaml(value, indent: int = 0) -> str:
    """ros2-echo-like rendering: ``key: value`` lines, nested maps indented."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            if isinstance(v, dict) and v:
                lines.append(f"{pad}{k}:")
                lines.append(to_yaml(v, indent + 1))
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
        return "\n".join(lines)
    return pad + _scalar(value)


def action_yaml(msg: dict, names=None, digits: int = 6) -> str:
    """:func:`to_yaml` of an action message, with a v2 message's ``u`` one component per line, labelled
    with the action names when known (else the index) and ``digits`` significant digits (``--json``
    prints the exact values)."""
    u = msg.get("u") if isinstance(msg, dict) else None
    if not isinstance(u, list):
        return to_yaml(msg)
    labels = list(names) if names is not None and len(names) == len(u) else [str(i) for i in range(len(u))]
    lines = []
    for k, v in msg.items():
        if k == "u":
            lines.append(f"u:  # {len(u)} action{'s' if len(u) != 1 else ''}")
            width = max(len(x) for x in labels) if labels else 0
            for name, x in zip(labels, u):
                lines.append(f"  {name + ':':<{width + 1}} " + (f"{x:.{digits}g}" if isinstance(x, float) else _scalar(x)))
        else:
            lines.append(to_yaml({k: v}))
    return "\n".join(lines)


def action_names_from(msg) -> list | None:
    """The action names a diagnostics message announces (``policy.action_names``), or None."""
    pol = msg.get("policy") if isinstance(msg, dict) else None
    names = pol.get("action_names") if isinstance(pol, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else None


def _scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    return str(v)


class RateStats:
    """Arrival-interval statistics over the last ``window`` messages (like ``ros2 topic hz``)."""

    def __init__(self, window: int = 10000):
        self.times = deque(maxlen=window + 1)
        self.total = 0

    def add(self, t_ns: int):
        self.times.append(t_ns)
        self.total += 1

    def stats(self) -> dict | None:
        if len(self.times) < 2:
            return None
        t = list(self.times)
        iv = [(b - a) / 1e9 for a, b in zip(t, t[1:])]
        n = len(iv)
        mean = sum(iv) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in iv) / n)
        return {"rate_hz": (1.0 / mean) if mean > 0 else float("inf"), "min_s": min(iv), "max_s": max(iv),
                "std_s": std, "window": n, "total": self.total}


def format_hz(st: dict) -> str:
    return (f"average rate: {st['rate_hz']:.3f}\n"
            f"\tmin: {st['min_s']:.6f}s max: {st['max_s']:.6f}s std dev: {st['std_s']:.6f}s window: {st['window']}")


# ----------------------------------------------------------------------------------------- top

def _us(ns) -> str:
    if ns is None:
        return "-"
    us = float(ns) / 1e3
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def top_renderable(diag: dict, endpoint: str, prev: dict | None = None, age_s: float | None = None):
    """A rich renderable for one diagnostics snapshot (``prev``: the previous one, for deltas)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def delta(key):
        if prev is None or not isinstance(diag.get(key), (int, float)) or not isinstance(prev.get(key), (int, float)):
            return ""
        d = diag[key] - prev[key]
        return f" (+{d})" if d > 0 else ""

    rate = diag.get("rate_hz")
    head = Text.assemble(("control-node top", "bold"), f"  {endpoint}",
                         ("" if age_s is None else f"  last update {age_s:.1f} s ago"),
                         style=None)
    counters = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for c in ("rate (Hz)", "cycles", "misses", "stale", "safe", "superseded", "valid frames", "rejected"):
        counters.add_column(c, justify="right")
    rej = diag.get("rejected") or {}
    rej_total = sum(v for v in rej.values() if isinstance(v, (int, float)))
    miss_style = "bold red" if diag.get("deadline_misses") else ""
    counters.add_row(
        "-" if rate is None else f"{rate:.2f}", str(diag.get("cycles", "-")),
        Text(f"{diag.get('deadline_misses', '-')}{delta('deadline_misses')}", style=miss_style),
        f"{diag.get('stale_cycles', '-')}{delta('stale_cycles')}",
        f"{diag.get('safe_actions', '-')}{delta('safe_actions')}", str(diag.get("superseded", "-")),
        str(diag.get("frames_valid", "-")), str(rej_total))
    parts = [head, counters]
    pol = diag.get("policy")
    if isinstance(pol, dict) and pol.get("kind"):
        sa = pol.get("safe_action") or {}
        parts.append(Text(f"policy {pol['kind']}, {pol.get('n_features')} features -> {pol.get('n_actions')} "
                          + ("actions (" + ", ".join(map(str, pol.get("action_names") or [])) + ")"
                             if pol["kind"] == "continuous" else f"class ({len(pol.get('classes') or [])} classes)")
                          + (f", safe action {sa.get('mode')}" if sa else "")))
    lc = diag.get("lifecycle")
    if isinstance(lc, dict) and lc.get("active"):
        line = f"active policy {lc['active']}" + (" (canary)" if lc.get("canary") else "")
        if lc.get("shadow"):
            ticks, dis = lc.get("shadow_ticks") or 0, lc.get("shadow_disagree") or 0
            cost = lc.get("shadow_cost_mean_ns")
            line += (f", shadow {lc['shadow']}: {ticks} ticks, {dis} disagree"
                     + (f" ({dis / ticks:.1%})" if ticks else "") + (f", +{cost / 1e3:.1f} us mean" if cost else ""))
        line += f"; resident {', '.join(lc.get('resident') or [])}"
        last = (lc.get("transitions") or [])[-1:]
        if last and last[0].get("reason") != "start-up policy":
            e = last[0]
            line += f"; last: {e['event']} {e.get('policy') or ''} at cycle {e['cycle']} ({e.get('reason')})"
        parts.append(Text(line))
    if any(rej.values()):
        parts.append(Text("rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(rej.items()) if v)))
    win = diag.get("window") or {}
    wt = Table(title="window since previous update (us)", show_header=True, header_style="bold")
    wt.add_column("metric")
    for c in ("p50", "p99", "p99.9", "max"):
        wt.add_column(c, justify="right")
    names = {"wake_latency_ns": "wake-up latency", "cycle_time_ns": "cycle time", "input_age_ns": "input age"}
    for k, title in names.items():
        w = win.get(k) or {}
        wt.add_row(title, *[_us(w.get(p)) for p in ("p50", "p99", "p999", "max")])
    parts.append(wt)
    rt = diag.get("rt") or {}
    if rt:
        rtt = Table(title="real-time features", show_header=True, header_style="bold")
        for c in ("feature", "granted", "detail"):
            rtt.add_column(c)
        for k, f in rt.items():
            f = f if isinstance(f, dict) else {"detail": f}
            g = f.get("granted")
            rtt.add_row(k, "[green]granted[/]" if g else "[red]refused[/]" if g is False else "-",
                        str(f.get("detail", "")))
        parts.append(rtt)
    return Group(*parts)


def bridge_line(msg: dict) -> str:
    """One line of a bridge's counters (its ``role = "bridge"`` messages, about 2 Hz) for ``top``."""
    wh = ", ".join(f"{k} {v}" for k, v in (msg.get("frames_withheld") or {}).items()) or "none"
    lat = msg.get("callback_p99_us")
    return (f"bridge ({msg.get('kind', '?')}): frames sent {msg.get('frames_sent', 0)}, withheld {wh}; actions "
            f"published {msg.get('actions_published', 0)} (safe {msg.get('safe_actions_published', 0)}); "
            f"callback p99 {'n/a' if lat is None else f'{lat:.0f} us'}; node restarts {msg.get('node_restarts', 0)}")
