"""Resolve the node's endpoints from a node config (``[endpoints]`` table) for clients.

Uses ``control_node.config.load_config`` when it exists; otherwise reads the TOML itself.
The sensor *tap* (see docs/simulation.md) is where a simulator/replayer re-publishes every sensor
frame it sends, so that a recorder can subscribe to it (the node's sensor socket is a binding SUB).
"""
from __future__ import annotations

import os
import re

DEFAULTS = {
    "sensor": "ipc://{runtime_dir}/sensor",
    "action": "ipc://{runtime_dir}/action",
    "diagnostics": "ipc://{runtime_dir}/diagnostics",
}
DEFAULT_NODE_CONFIG = os.path.join("configs", "node.toml")


def runtime_dir() -> str:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(xdg, "control-node") if xdg else f"/tmp/control-node-{os.getuid()}"


def expand(ep: str) -> str:
    return ep.replace("{runtime_dir}", runtime_dir())


def derive_tap(sensor_ep: str) -> str:
    """Default tap endpoint: ``<sensor ipc path>_tap``, or the sensor's TCP port + 100."""
    if sensor_ep.startswith("ipc://"):
        return sensor_ep + "_tap"
    m = re.match(r"^(tcp://[^:]+):(\d+)$", sensor_ep)
    if m:
        return f"{m.group(1)}:{int(m.group(2)) + 100}"
    raise ValueError(f"cannot derive a tap endpoint from {sensor_ep!r}; give --tap ENDPOINT")


def _read_toml(path):
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def load_endpoints(config_path=None) -> dict:
    """Endpoints ``sensor``, ``action``, ``diagnostics``, ``sensor_tap`` (all expanded)."""
    from control_node.errors import UserError
    raw = {}
    if config_path is None and os.path.exists(DEFAULT_NODE_CONFIG):
        config_path = DEFAULT_NODE_CONFIG
    if config_path is not None:
        if not os.path.exists(config_path):
            raise UserError(f"node config {config_path} does not exist")
        try:
            from control_node.config import load_config  # the node's loader, when present
        except ImportError:
            load_config = None
        cfg = None
        if load_config is not None:
            try:
                cfg = load_config(config_path)
            except Exception:
                cfg = None
        if not isinstance(cfg, dict) or not isinstance(cfg.get("endpoints"), dict):
            cfg = _read_toml(config_path)
        raw = dict(cfg.get("endpoints", {}) or {})
        # sensor_tap may be absent from the node's resolved config; read it from the file itself
        if not raw.get("sensor_tap"):
            try:
                f = _read_toml(config_path)
                # the node's schema rejects unknown [endpoints] keys: also [record] or [children.record]
                for table in (f.get("endpoints"), f.get("record"), (f.get("children") or {}).get("record")):
                    if isinstance(table, dict) and "sensor_tap" in table:
                        raw["sensor_tap"] = table["sensor_tap"]
                        break
            except Exception:
                pass
    eps = {k: expand(str(raw.get(k, v))) for k, v in DEFAULTS.items()}
    eps["sensor_tap"] = expand(str(raw["sensor_tap"])) if raw.get("sensor_tap") else derive_tap(eps["sensor"])
    return eps


def ipc_path(ep: str):
    return ep[len("ipc://"):] if ep.startswith("ipc://") else None


def ensure_ipc_dir(ep: str):
    p = ipc_path(ep)
    if p:
        os.makedirs(os.path.dirname(p) or ".", mode=0o700, exist_ok=True)
