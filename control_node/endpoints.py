"""Endpoints, defined once: the runtime directory, ``{runtime_dir}`` expansion, ipc paths, tcp hosts,
the sensor tap, and where the packaged default configs are.

Every part of control-node that names a socket or a default config asks this module (the node, the
clients, launch, the simulator, the tests). It imports only the standard library.
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket
from importlib import resources

NAMES = ("sensor", "action", "diagnostics")     # the node's three bound sockets
DEFAULTS = {name: "ipc://{runtime_dir}/" + name for name in NAMES}
LOOPBACK_NAMES = {"localhost", "lo", "127.0.0.1", "::1", "[::1]"}


def default_config(name: str = "node.toml") -> str:
    """Path of a config shipped in the package (``node.toml``, ``demo.toml``), read with
    importlib.resources: never relative to the working directory."""
    ref = resources.files("control_node.configs") / name
    if not ref.is_file():
        raise FileNotFoundError(f"packaged config {name} is missing from control_node.configs")
    return os.fspath(ref)


PACKAGE_SCHEME = "package://"


def packaged_file(path: str) -> str:
    """``package://IMPORT_NAME/FILE`` (a file shipped inside an installed package, as ROS's ``package://``
    names one inside a ROS package) -> its path on disk, read with importlib.resources; any other path as
    given. ``package://control_node.train/quadruped_policy.onnx`` is the walking policy made here. A name
    that is not there raises FileNotFoundError naming it."""
    if not isinstance(path, str) or not path.startswith(PACKAGE_SCHEME):
        return path
    pkg, _, name = path[len(PACKAGE_SCHEME):].partition("/")
    try:
        ref = resources.files(pkg).joinpath(name) if name else None
    except (ModuleNotFoundError, TypeError, ValueError):
        ref = None
    if ref is None or not ref.is_file():
        raise FileNotFoundError(f"{path}: no file {name or '(none)'} in the installed package {pkg or '(none)'}")
    return os.fspath(ref)


def runtime_dir() -> str:
    """``$XDG_RUNTIME_DIR/control-node``, or ``/tmp/control-node-UID`` without it."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "control-node") if base else f"/tmp/control-node-{os.getuid()}"


def expand(ep: str) -> str:
    """``{runtime_dir}`` in an endpoint replaced by :func:`runtime_dir`."""
    return ep.replace("{runtime_dir}", runtime_dir())


def ipc_path(ep: str) -> str | None:
    """The socket file of an ``ipc://`` endpoint, else None."""
    return ep[len("ipc://"):] if ep.startswith("ipc://") else None


def ipc_listened(path: str) -> bool:
    """Whether a process listens on the socket file ``path`` (a connect succeeds). libzmq's ipc bind replaces
    an existing file without a word, and its close unlinks the file it bound: a second node on the same path
    would take the first one's frames, and whichever stops first would cut the other off. A file nobody
    listens on (a killed node's) is stale and free to replace."""
    if not os.path.exists(path):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:          # ECONNREFUSED: nobody listens; ENOENT: gone meanwhile; a non-socket file
        return False
    finally:
        s.close()


def ensure_ipc_dir(ep: str) -> None:
    """Create the (private, 0700) directory of an ipc endpoint; nothing for tcp."""
    p = ipc_path(ep)
    if p:
        os.makedirs(os.path.dirname(p) or ".", mode=0o700, exist_ok=True)


def _beside_sensor(sensor_ep: str, suffix: str, port_offset: int, fix: str) -> str:
    """``<sensor ipc path><suffix>``, or the sensor's TCP port + ``port_offset``."""
    if sensor_ep.startswith("ipc://"):
        return sensor_ep + suffix
    m = re.match(r"^(tcp://[^:]+):(\d+)$", sensor_ep)
    if m:
        return f"{m.group(1)}:{int(m.group(2)) + port_offset}"
    raise ValueError(f"cannot derive an endpoint beside {sensor_ep!r}; {fix}")


def derive_tap(sensor_ep: str) -> str:
    """Default sensor-tap endpoint: ``<sensor ipc path>_tap``, or the sensor's TCP port + 100."""
    return _beside_sensor(sensor_ep, "_tap", 100, "give --tap ENDPOINT")


def derive_control(sensor_ep: str) -> str:
    """Default control endpoint (the node's REP socket for ``control-node policy``): ``<sensor ipc
    path>_control``, or the sensor's TCP port + 200."""
    return _beside_sensor(sensor_ep, "_control", 200, "set [endpoints] control")


def derive_bridge_diagnostics(sensor_ep: str) -> str:
    """Where a bridge publishes its counters (``top`` shows them): ``<sensor ipc path>_bridge``, or the
    sensor's TCP port + 300."""
    return _beside_sensor(sensor_ep, "_bridge", 300, "set [endpoints] sensor")


def derive_sim_state(sensor_ep: str) -> str:
    """Where a simulator publishes its physical state for the live view (``/sim/pendulum``): ``<sensor ipc
    path>_sim_state``, or the sensor's TCP port + 400."""
    return _beside_sensor(sensor_ep, "_sim_state", 400, "set [endpoints] sensor")


def tcp_host(endpoint: str) -> str | None:
    """The host part of a tcp:// endpoint (``tcp://HOST:PORT``, ``tcp://[v6]:PORT``), else None."""
    if not endpoint.startswith("tcp://"):
        return None
    rest = endpoint[len("tcp://"):]
    if ";" in rest:                            # tcp://SOURCE;HOST:PORT (connect only): the host after ';'
        rest = rest.split(";", 1)[1]
    host = rest.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback_host(host: str) -> bool:
    """True for localhost and loopback addresses; False for "*", 0.0.0.0, interface or DNS names."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
