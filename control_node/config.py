"""Node configuration: TOML in, validated dict out; every error names the field and the fix."""
from __future__ import annotations

import math
import os
import re
import tomllib

from control_node import endpoints
from control_node.errors import ConfigError

# section -> key -> (default, type check, description of valid values)
_NUM = (int, float)
SCHEMA = {
    "node": {"model": ("models/iris.npz", str, "a path"), "run_root": ("runs", str, "a path")},
    "endpoints": {
        "sensor": (endpoints.DEFAULTS["sensor"], str, "an ipc:// or tcp:// endpoint"),
        "action": (endpoints.DEFAULTS["action"], str, "an ipc:// or tcp:// endpoint"),
        "diagnostics": (endpoints.DEFAULTS["diagnostics"], str, "an ipc:// or tcp:// endpoint"),
        # not bound by the node: where a simulator/replayer republishes frames for recorders and monitors
        "sensor_tap": ("", str, 'an ipc:// or tcp:// endpoint, or "" for the default (sensor endpoint + "_tap")'),
        # the node's REP socket for `control-node policy` (load, activate, shadow, rollback, status)
        "control": ("", str, 'an ipc:// or tcp:// endpoint, or "" for the default (sensor endpoint + "_control")'),
    },
    "loop": {
        "rate_hz": (1000.0, _NUM, "a rate in Hz, 1 to 100000"),
        "clock": ("timer", str, '"timer" or "sensor"'),
        "deadline_us": (0, _NUM, "microseconds >= 0 (0 = one period)"),
        "catch_up": ("skip", str, '"skip" or "burst"'),
        # "auto": min(150 us, 30 % of the period) (resolve_spin_us)
        "spin_us": ("auto", (int, float, str), '"auto" or microseconds, 0 to one period'),
        "duration_s": (0, _NUM, "seconds >= 0 (0 = until a signal)"),
        # the policy's rate: every tick drains, validates, counts and runs the watchdog; the policy runs on
        # one tick in `decimation` (resolve_decimation). At most one of the two; 0 = not set
        "policy_rate_hz": (0, _NUM, "a rate in Hz that divides loop.rate_hz, or 0 (= rate_hz)"),
        "decimation": (0, int, "an integer >= 1, or 0 (= 1: the policy runs every tick)"),
        # timer clock: move the schedule so the frames of a periodic stream land phase_margin_us before a tick
        "phase_lock": (False, bool, "true or false"),
        "phase_margin_us": (100, _NUM, "microseconds, > 0 and below half a period"),
    },
    # how frames become the policy's input
    "policy": {
        "history": (1, int, "an integer >= 1 (frames stacked into the policy's input)"),
        "history_order": ("oldest_first", str, '"oldest_first" or "newest_first"'),
        # the kernel's vector copy: the fastest measured on this machine for this shape (cached per machine,
        # kernels/dispatch.py), the widest this CPU runs, or one named (forced)
        "isa": ("fastest", str, '"fastest", "widest", "avx512", "avx2" or "sse2"'),
    },
    # policies loaded and switched while the loop runs (control_node.lifecycle, `control-node policy`)
    "lifecycle": {
        "name": ("", str, 'a name for the start-up policy, or "" (the model file\'s stem)'),
        "max_policies": (4, int, "resident policies at most, 1 to 8 (the start-up one included)"),
        "max_resident_mb": (256.0, _NUM, "megabytes > 0: the weights of all resident policies at most"),
        # a shadow disagrees with the active policy when the L2 distance of their action vectors exceeds
        # this (continuous policies; argmax: when the classes differ)
        "shadow_distance": (0.1, _NUM, "a distance >= 0 in action units"),
    },
    # `control-node policy activate NAME --canary`: the new policy runs with the old one in shadow and is
    # rolled back by the loop when it gives a non-finite output, breaks its cycle-time budget more than
    # max_over_budget times, or disagrees on more than max_disagree of a window; promoted after canary_s
    "rollout": {
        "canary_s": (10.0, _NUM, "seconds > 0 of policy ticks before a canary is promoted"),
        "window_ticks": (50, int, "policy ticks >= 1 per disagreement window"),
        "max_disagree": (0.2, _NUM, "a fraction 0 to 1 of a window's policy ticks"),
        "cycle_time_budget_us": (0, _NUM, "microseconds >= 0 (0 = the deadline)"),
        "max_over_budget": (3, int, "policy ticks >= 0 over the budget allowed in a canary"),
    },
    "watchdog": {
        "stale_after_ms": (5.0, _NUM, "milliseconds > 0"),
        # "auto": class 0 for an argmax policy, "offset" for a continuous one (resolve_safe_action)
        "safe_action": ("auto", (int, str, list), 'a class index, a list of floats (one per action), "offset", '
                        '"hold" or "auto"'),
        # recurrent policies: zero the state when the watchdog trips (an episode ends), as rsl_rl resets on done
        "reset_state": (True, bool, "true or false"),
    },
    "limits": {
        "max_frame_bytes": (4096, int, "bytes, 64 to 1048576"),
        "send_hwm": (1000, int, "messages >= 1"),
        "recv_hwm": (1000, int, "messages >= 1"),
    },
    "realtime": {
        "cpu": ("last", (int, str), 'a core number, "last" or "none"'),
        "sched_fifo": (True, bool, "true or false"),
        "priority": (80, int, "1 to 99"),
        "mlockall": (True, bool, "true or false"),
        "gc_freeze": (True, bool, "true or false"),
        "cpu_dma_latency": (True, bool, "true or false"),
        # move other processes' threads, movable kernel threads and IRQs off the loop's core for the run
        # (restored after; `control-node doctor --restore` after a crash)
        "isolate": (False, bool, "true or false"),
    },
    # what the report's verdict holds the run to (control-node report: PASS / FAIL)
    "budget": {
        "wake_latency_p99_us": (10.0, _NUM, "microseconds > 0"),
        "cycle_time_max_us": (0, _NUM, "microseconds >= 0 (0 = one period)"),
        "deadline_misses": (0, int, "a count >= 0"),
    },
    # why cycles were late (control_node.diagnosis.attribution): evidence about the loop's core, collected
    # beside the loop, matched to each miss and the worst wake-ups in summary.json "why_late"
    "diagnostics": {
        # the recorder runs on the other cores (about a tenth of one for its trace parsing, measured on
        # this 2-vCPU machine kind: docs/reports.md); false turns it off
        "attribution": (True, bool, "true or false"),
        "attribution_trace": (True, bool, "true or false (false: /proc evidence only, no tracefs)"),
        "attribution_events": (1000, int, "late cycles to explain, 1 to 100000"),
        # Prometheus metrics over HTTP (control_node.metrics): "" off, or "HOST:PORT"
        "prometheus": ("", str, '"" (off) or "HOST:PORT", e.g. "127.0.0.1:9100"'),
        "prometheus_allow_remote": (False, bool, "true or false (serve on a non-loopback address)"),
        "prometheus_linger_s": (0.0, _NUM, "seconds >= 0 the final metrics stay up after the loop ends"),
    },
    # the live view (control_node.live, `launch --foxglove`): a Foxglove WebSocket server beside the node
    "foxglove": {
        "listen": ("", str, '"" (off) or "HOST:PORT", e.g. "127.0.0.1:8765"'),
    },
    "stats": {
        "ring_cycles": (600000, int, "cycles >= 1000"),
        "diagnostics_hz": (10.0, _NUM, "Hz, 0.1 to 100"),
    },
    "security": {
        "curve": (False, bool, "true or false"),
        # node side: its secret key (certificate file) and the directory of allowed client public keys
        "server_secret_key": ("", str, 'a path to the node\'s NAME.key_secret, or ""'),
        "allowed_clients": ("", str, 'a directory of client public key files (NAME.key), or ""'),
        # client side (sim, replay, record, top): its own secret key and the node's public key
        "client_secret_key": ("", str, 'a path to the client\'s NAME.key_secret, or ""'),
        "server_public_key": ("", str, 'a path to the node\'s NAME.key, or ""'),
        "allow_plaintext_remote": (False, bool, "true or false"),
    },
}


def defaults() -> dict:
    return {sec: {k: v[0] for k, v in keys.items()} for sec, keys in SCHEMA.items()}


def read_toml(path) -> dict:
    """The raw TOML of a config file. Raises :class:`ConfigError` naming the file (missing, not TOML)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(path, "(file)", "no such file", "pass an existing --config or omit it") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, "(syntax)", f"not valid TOML ({e})", "fix the TOML syntax") from None


def load_config(path=None, overrides: dict | None = None) -> dict:
    """Read ``path`` (default: the packaged node.toml), apply ``overrides`` {"loop.rate_hz": 500, ...},
    validate.

    Endpoints come back with ``{runtime_dir}`` expanded. Raises :class:`ConfigError`.
    """
    path = path or endpoints.default_config("node.toml")
    cfg = defaults()
    raw = read_toml(path)
    cfg["legged"] = None
    for sec, table in raw.items():
        if sec == "legged":         # the legged recipe: checked against the policy (control_node.deploy)
            cfg["legged"] = table
            continue
        if sec not in SCHEMA:
            if sec in ("sim", "launch", "record", "replay", "children", "ros2"):
                continue   # read by other verbs
            raise ConfigError(path, sec, "unknown section", f"use one of {sorted(SCHEMA)}")
        if not isinstance(table, dict):
            raise ConfigError(path, sec, "is not a table", f"write it as [{sec}]")
        for key, value in table.items():
            if key not in SCHEMA[sec]:
                raise ConfigError(path, f"{sec}.{key}", "unknown key", f"use one of {sorted(SCHEMA[sec])}")
            cfg[sec][key] = value
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        sec, key = dotted.split(".")
        cfg[sec][key] = value
    validate(cfg, path)
    # "auto" resolved here, so every reader (node, doctor) sees microseconds; what was asked stays beside it
    cfg["loop"]["spin_us_from"] = "auto" if isinstance(cfg["loop"]["spin_us"], str) else "config"
    cfg["loop"]["spin_us"] = resolve_spin_us(cfg)
    cfg["endpoints"] = {k: endpoints.expand(v) for k, v in cfg["endpoints"].items()}
    if not cfg["endpoints"]["control"]:
        cfg["endpoints"]["control"] = endpoints.derive_control(cfg["endpoints"]["sensor"])
    if isinstance(cfg["node"]["model"], str) and cfg["node"]["model"].startswith(endpoints.PACKAGE_SCHEME):
        try:
            cfg["node"]["model"] = endpoints.packaged_file(cfg["node"]["model"])
        except FileNotFoundError as e:
            raise ConfigError(path, "node.model", str(e), "name a file the package ships (package://IMPORT_NAME/"
                              "FILE, e.g. package://control_node.train/quadruped_policy.onnx), or a path") from None
    cfg["source"] = os.fspath(path)
    return cfg


POLICY_NAME_RULE = "use 1 to 64 letters, digits, '_', '-' or '.', starting with a letter or digit"


def valid_policy_name(name) -> bool:
    """A policy name `control-node policy` and [lifecycle] name accept (POLICY_NAME_RULE)."""
    return isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name) is not None


def validate(cfg: dict, path="(config)") -> None:
    def bad(field, fix, problem=None):
        sec, key = field.split(".")
        raise ConfigError(path, field, problem or f"invalid value {cfg[sec][key]!r}", fix)

    for sec, keys in SCHEMA.items():
        for key, (_, typ, desc) in keys.items():
            v = cfg[sec][key]
            ok = isinstance(v, typ) and not (typ is not bool and isinstance(v, bool) and bool not in
                                             (typ if isinstance(typ, tuple) else (typ,)))
            if not ok:
                bad(f"{sec}.{key}", f"use {desc}", f"has type {type(v).__name__} ({v!r})")
    lp, wd, lim, rt, st = cfg["loop"], cfg["watchdog"], cfg["limits"], cfg["realtime"], cfg["stats"]
    if not 1 <= lp["rate_hz"] <= 100000:
        bad("loop.rate_hz", "use a rate from 1 to 100000 Hz")
    if lp["clock"] not in ("timer", "sensor"):
        bad("loop.clock", 'use "timer" or "sensor"')
    if lp["catch_up"] not in ("skip", "burst"):
        bad("loop.catch_up", 'use "skip" or "burst"')
    if lp["deadline_us"] < 0:
        bad("loop.deadline_us", "use 0 (one period) or a positive number of microseconds")
    if isinstance(lp["spin_us"], str):
        if lp["spin_us"] != "auto":
            bad("loop.spin_us", f'use "auto" (min({SPIN_AUTO_MAX_US:g} us, {SPIN_AUTO_SHARE:.0%} of the period)) '
                "or 0 up to one period in microseconds")
    elif not 0 <= lp["spin_us"] * 1e3 <= 1e9 / lp["rate_hz"]:
        bad("loop.spin_us", "use 0 up to one period in microseconds")
    resolve_decimation(cfg, path)
    if lp["phase_lock"] and not 0 < lp["phase_margin_us"] * 1e3 < 0.5e9 / lp["rate_hz"]:
        bad("loop.phase_margin_us", f"use a positive number of microseconds below half a period "
            f"({0.5e6 / lp['rate_hz']:g} us), e.g. {min(100, 0.3 * 1e6 / lp['rate_hz']):g}")
    if lp["phase_lock"] and lp["clock"] != "timer":
        bad("loop.phase_lock", 'use clock = "timer" (the sensor clock follows the frames by itself), or set '
            "phase_lock = false", 'is true with clock = "sensor"')
    po = cfg["policy"]
    if po["history"] < 1:
        bad("policy.history", "use 1 (the frame alone) or more frames")
    if po["history_order"] not in ("oldest_first", "newest_first"):
        bad("policy.history_order", 'use "oldest_first" (the default) or "newest_first"')
    if po["isa"] not in ("fastest", "widest", "avx512", "avx2", "sse2"):
        bad("policy.isa", 'use "fastest" (the default: measured on this machine), "widest", or a copy to force: '
                          '"avx512", "avx2" or "sse2"')
    lc, ro = cfg["lifecycle"], cfg["rollout"]
    if lc["name"] and not valid_policy_name(lc["name"]):
        bad("lifecycle.name", POLICY_NAME_RULE)
    if not 1 <= lc["max_policies"] <= 8:
        bad("lifecycle.max_policies", "use 1 to 8 resident policies")
    if not lc["max_resident_mb"] > 0:
        bad("lifecycle.max_resident_mb", "use a positive number of megabytes, e.g. 256")
    if not lc["shadow_distance"] >= 0:
        bad("lifecycle.shadow_distance", "use a distance >= 0 in action units, e.g. 0.1")
    if not ro["canary_s"] > 0:
        bad("rollout.canary_s", "use a positive number of seconds, e.g. 10")
    if ro["window_ticks"] < 1:
        bad("rollout.window_ticks", "use 1 or more policy ticks, e.g. 50")
    if not 0 <= ro["max_disagree"] <= 1:
        bad("rollout.max_disagree", "use a fraction from 0 to 1, e.g. 0.2")
    if ro["cycle_time_budget_us"] < 0:
        bad("rollout.cycle_time_budget_us", "use 0 (the deadline) or a positive number of microseconds")
    if ro["max_over_budget"] < 0:
        bad("rollout.max_over_budget", "use 0 or more policy ticks")
    prom = cfg["diagnostics"]["prometheus"]
    if prom:
        m = re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", prom)
        if m is None or not 0 < int(m.group(2)) < 65536:
            bad("diagnostics.prometheus", 'use "HOST:PORT", e.g. "127.0.0.1:9100", or "" for off')
        if not endpoints.is_loopback_host(m.group(1).strip("[]")) and not cfg["diagnostics"]["prometheus_allow_remote"]:
            bad("diagnostics.prometheus", 'serve on 127.0.0.1, or set [diagnostics] prometheus_allow_remote = true '
                "(the metrics say how the robot's loop runs: firewall the port)",
                f"binds the non-loopback address {m.group(1)!r}")
    if cfg["foxglove"]["listen"]:
        problem = listen_problem(cfg["foxglove"]["listen"])
        if problem:
            bad("foxglove.listen", 'use "HOST:PORT", e.g. "127.0.0.1:8765", or "" for off', problem)
    if cfg["diagnostics"]["prometheus_linger_s"] < 0:
        bad("diagnostics.prometheus_linger_s", "use 0 or more seconds")
    if not 1 <= cfg["diagnostics"]["attribution_events"] <= 100000:
        bad("diagnostics.attribution_events", "use 1 to 100000 late cycles")
    if lp["duration_s"] < 0:
        bad("loop.duration_s", "use 0 (until a signal) or a positive number of seconds")
    if not wd["stale_after_ms"] > 0:
        bad("watchdog.stale_after_ms", "use a positive number of milliseconds, e.g. 5.0")
    sa = wd["safe_action"]
    if isinstance(sa, str) and sa not in SAFE_ACTION_WORDS or isinstance(sa, int) and sa < 0:
        bad("watchdog.safe_action", SAFE_ACTION_FIX)
    if isinstance(sa, list):
        if not sa:
            bad("watchdog.safe_action", SAFE_ACTION_FIX, "is an empty list")
        for i, v in enumerate(sa):
            if isinstance(v, bool) or not isinstance(v, _NUM):
                bad("watchdog.safe_action", SAFE_ACTION_FIX,
                    f"element {i} is {type(v).__name__} ({v!r}), not a number")
            if not math.isfinite(v):
                bad("watchdog.safe_action", SAFE_ACTION_FIX, f"element {i} is {v!r}, not finite")
    if not 64 <= lim["max_frame_bytes"] <= 1 << 20:
        bad("limits.max_frame_bytes", "use 64 to 1048576 bytes")
    if lim["send_hwm"] < 1:
        bad("limits.send_hwm", "use 1 or more")
    if lim["recv_hwm"] < 1:
        bad("limits.recv_hwm", "use 1 or more")
    cpu = rt["cpu"]
    if isinstance(cpu, str) and cpu not in ("last", "none") or isinstance(cpu, int) and cpu < 0:
        bad("realtime.cpu", 'use a core number, "last" or "none"')
    if not 1 <= rt["priority"] <= 99:
        bad("realtime.priority", "use 1 to 99")
    bu = cfg["budget"]
    if not bu["wake_latency_p99_us"] > 0:
        bad("budget.wake_latency_p99_us", "use a positive number of microseconds, e.g. 10.0")
    if bu["cycle_time_max_us"] < 0:
        bad("budget.cycle_time_max_us", "use 0 (one period) or a positive number of microseconds")
    if bu["deadline_misses"] < 0:
        bad("budget.deadline_misses", "use 0 (no miss allowed) or a positive count")
    if st["ring_cycles"] < 1000:
        bad("stats.ring_cycles", "use 1000 or more")
    if not 0.1 <= st["diagnostics_hz"] <= 100:
        bad("stats.diagnostics_hz", "use 0.1 to 100 Hz")
    eps = {k: v for k, v in cfg["endpoints"].items() if v}
    for name, ep in eps.items():
        if not (ep.startswith("ipc://") or ep.startswith("tcp://") or ep.startswith("inproc://")):
            bad(f"endpoints.{name}", "use ipc://PATH or tcp://HOST:PORT")
    sec = cfg["security"]
    if sec["curve"]:
        if not sec["server_secret_key"]:
            bad("security.server_secret_key", 'set it to the node\'s secret key file, e.g. "keys/node.key_secret" '
                "(`control-node keys --out keys --name node` writes it), or set curve = false",
                "is empty but security.curve = true")
        if not sec["allowed_clients"]:
            bad("security.allowed_clients", 'set it to a directory of allowed client public keys, e.g. '
                '"keys/clients/", or set curve = false', "is empty but security.curve = true")
    else:
        for name in endpoints.NAMES + ("control",):
            host = endpoints.tcp_host(cfg["endpoints"][name])
            if host is not None and not endpoints.is_loopback_host(host) and not sec["allow_plaintext_remote"]:
                bad(f"endpoints.{name}", "bind tcp to 127.0.0.1, or enable CURVE ([security] curve = true, see "
                    "docs/deployment.md), or, on a trusted network only, set [security] "
                    "allow_plaintext_remote = true",
                    f"binds plaintext tcp to the non-loopback address {host!r} "
                    "(security.allow_plaintext_remote is false)")
    if len(set(eps.values())) != len(eps):
        bad("endpoints.sensor", "give sensor, action, diagnostics and control different endpoints",
            "two endpoints are the same")


def listen_problem(value) -> str | None:
    """What is wrong with a ``HOST:PORT`` to listen on (IPv6 as ``[::1]:PORT``), or None."""
    import ipaddress
    host, sep, port = str(value).strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit():
        return f"{value!r} is not HOST:PORT"
    if not 0 < int(port) < 65536:
        return f"port {port} is not in 1-65535"
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"{host!r} is not an IP address (or localhost)"
    return None


def parse_listen(value, key: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); a UserError naming ``key`` (``--foxglove``, ``[foxglove] listen``)."""
    from control_node.errors import UserError
    problem = listen_problem(value)
    if problem:
        raise UserError(f"{key} = {value!r}: {problem}. Fix: an address and port such as \"127.0.0.1:8765\"")
    host, _, port = str(value).strip().rpartition(":")
    return host.strip("[]"), int(port)


SPIN_AUTO_MAX_US = 150.0     # spin_us = "auto": this, or SPIN_AUTO_SHARE of the period when shorter
SPIN_AUTO_SHARE = 0.3


def resolve_spin_us(cfg: dict) -> float:
    """The spin window in microseconds: ``[loop] spin_us`` as given, or for ``"auto"`` (the default)
    min(150 us, 30 % of the period), so a 10 kHz loop (100 us period) spins 30 us, not more than a period."""
    v = cfg["loop"]["spin_us"]
    if isinstance(v, str):
        return min(SPIN_AUTO_MAX_US, SPIN_AUTO_SHARE * 1e6 / float(cfg["loop"]["rate_hz"]))
    return float(v)


def resolve_decimation(cfg: dict, path="(config)") -> int:
    """Ticks per policy step from ``[loop] policy_rate_hz`` or ``[loop] decimation`` (at most one of them);
    1 when neither is set. Raises :class:`ConfigError` naming the field and the fix: the loop rate must be
    an integer multiple of the policy rate, and decimation needs the timer clock."""
    lp = cfg["loop"]
    rate, prate, dec = float(lp["rate_hz"]), lp["policy_rate_hz"], lp["decimation"]
    if prate and dec:
        raise ConfigError(path, "loop.policy_rate_hz", f"is set ({prate!r}) and so is loop.decimation ({dec!r})",
                          "set only one of them: policy_rate_hz = rate_hz / decimation")
    if dec < 0:
        raise ConfigError(path, "loop.decimation", f"invalid value {dec!r}",
                          "use an integer >= 1 (the policy runs every Nth tick), or 0 (every tick)")
    if prate < 0 or prate > rate:
        raise ConfigError(path, "loop.policy_rate_hz", f"invalid value {prate!r}",
                          f"use a rate from 1 Hz up to loop.rate_hz ({rate:g} Hz) that divides it, or 0 (= rate_hz)")
    if prate:
        n = round(rate / prate)
        if n < 1 or abs(n * prate - rate) > 1e-9 * rate:
            near = sorted({rate / m for m in (max(1, math.floor(rate / prate)), math.ceil(rate / prate))
                           if m >= 1})
            raise ConfigError(path, "loop.policy_rate_hz",
                              f"{prate:g} Hz does not divide loop.rate_hz {rate:g} Hz "
                              f"(the loop rate must be an integer multiple of the policy rate)",
                              "use a rate that divides it, e.g. " + " or ".join(f"{r:g}" for r in near)
                              + f" Hz, or set loop.decimation = N (policy at {rate:g} / N Hz)")
    else:
        n = dec or 1
    if n > 1 and lp["clock"] != "timer":
        field = "loop.policy_rate_hz" if prate else "loop.decimation"
        raise ConfigError(path, field, f"asks for decimation {n} with clock = {lp['clock']!r}",
                          'use clock = "timer" (decimation counts ticks), or remove it')
    return int(n)


def resolve_history(cfg: dict, n_features: int, path="(config)") -> int:
    """The frame width for ``[policy] history = N`` and a policy with ``n_features`` inputs: n_features / N.
    Raises :class:`ConfigError` naming ``policy.history`` unless N divides n_features."""
    n = cfg["policy"]["history"]
    if n_features % n:
        divs = [d for d in range(1, n_features + 1) if n_features % d == 0]
        raise ConfigError(path, "policy.history",
                          f"is {n}, but the policy's {n_features} inputs are not {n} frames of equal width",
                          f"use a history that divides {n_features} ({', '.join(map(str, divs))}): "
                          f"the frame width is then {n_features} / history")
    return n_features // n


SAFE_ACTION_WORDS = ("auto", "hold", "offset")
SAFE_ACTION_FIX = ('use a class index (0, 1, ...) for an argmax policy, a list of finite floats (one per action) '
                   'or "offset" for a continuous one, "hold" (the last good action), or "auto" (the default: '
                   'class 0 / "offset")')


def resolve_safe_action(value, policy, path="(config)") -> dict:
    """The safe action ``[watchdog] safe_action = value`` means for ``policy`` (a loaded kernels.Policy),
    or a :class:`ConfigError` naming ``watchdog.safe_action`` and the fix.

    Returns ``{"config": value, "mode": ..., "hold": bool, "class": int | None, "u": [float] | None}``:
    argmax policies: mode ``"class"`` (an index; ``"auto"`` = 0) or ``"hold"`` (the last class; before any,
    class 0); continuous policies: mode ``"vector"`` (the list), ``"offset"`` (the head's action_offset,
    also what ``"auto"`` means) or ``"hold"`` (the last good action; before any, the offset). ``u`` is the
    vector published as the safe action (for hold: before the first good action)."""
    field = "watchdog.safe_action"
    if policy.continuous:
        n = policy.n_actions
        names = ", ".join(policy.action_names)
        offset = [float(v) for v in policy.spec.action_offset]
        fix = (f"use a list of {n} floats, e.g. {[0.0] * n}, \"offset\" (the head's offset, {offset}), \"hold\" "
               f"(the last good action) or \"auto\" (= \"offset\")")
        what = f"the model's policy is continuous ({n} action{'s' if n != 1 else ''}: {names})"
        if isinstance(value, bool) or isinstance(value, int):
            raise ConfigError(path, field, f"is the class index {value!r}, but {what}", fix)
        if isinstance(value, list):
            if len(value) != n:
                raise ConfigError(path, field, f"has {len(value)} value{'s' if len(value) != 1 else ''}, but {what}",
                                  fix)
            return {"config": value, "mode": "vector", "hold": False, "class": None, "u": [float(v) for v in value]}
        if value in ("offset", "auto"):
            return {"config": value, "mode": "offset", "hold": False, "class": None, "u": offset}
        if value == "hold":
            return {"config": value, "mode": "hold", "hold": True, "class": None, "u": offset}
        raise ConfigError(path, field, f"invalid value {value!r}", fix)
    k = policy.n_classes
    fix = f'use a class index 0..{k - 1} (classes {policy.classes}), "hold" or "auto" (= 0)'
    what = f"the model's policy is argmax ({k} classes {policy.classes}): its action is a class index"
    if isinstance(value, list):
        raise ConfigError(path, field, f"is a list of {len(value)} floats, but {what}", fix)
    if value == "offset":
        raise ConfigError(path, field, f"is \"offset\" (a continuous head's offset), but {what}", fix)
    if value == "hold":
        return {"config": value, "mode": "hold", "hold": True, "class": 0, "u": None}
    if value == "auto":
        return {"config": value, "mode": "class", "hold": False, "class": 0, "u": None}
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < k:
        return {"config": value, "mode": "class", "hold": False, "class": int(value), "u": None}
    if isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError(path, field, f"class {value} does not exist; the model has {k} classes {policy.classes}",
                          fix)
    raise ConfigError(path, field, f"invalid value {value!r}", fix)


def client_endpoints(path=None) -> dict:
    """What a client (sim, replay, record, top, hz, echo) connects to, from a node config file:
    ``sensor``, ``action``, ``diagnostics`` and ``sensor_tap``, all expanded.

    Reads the raw TOML (a client's config need not name the node's model or keys); a missing file or a
    syntax error is a :class:`ConfigError`, never a silent fall-back to defaults. ``sensor_tap`` may stand
    in ``[endpoints]``, ``[record]`` or ``[children.record]``; without it, :func:`endpoints.derive_tap`."""
    path = path or endpoints.default_config("node.toml")
    raw = read_toml(path)
    table = raw.get("endpoints", {}) or {}
    if not isinstance(table, dict):
        raise ConfigError(path, "endpoints", "is not a table", "write it as [endpoints]")
    eps = {}
    for name in endpoints.NAMES:
        v = table.get(name, endpoints.DEFAULTS[name])
        if not isinstance(v, str) or not v:
            raise ConfigError(path, f"endpoints.{name}", f"invalid value {v!r}", "use ipc://PATH or tcp://HOST:PORT")
        eps[name] = endpoints.expand(v)
    tap = table.get("sensor_tap")
    for t in (raw.get("record"), (raw.get("children") or {}).get("record")):
        if not tap and isinstance(t, dict) and t.get("sensor_tap"):
            tap = t["sensor_tap"]
    eps["sensor_tap"] = endpoints.expand(str(tap)) if tap else endpoints.derive_tap(eps["sensor"])
    control = table.get("control")
    eps["control"] = endpoints.expand(str(control)) if control else endpoints.derive_control(eps["sensor"])
    return eps


def toml_value(v) -> str:
    """A value as TOML text (strings, booleans, numbers, arrays, inline tables)."""
    import json
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else "nan")
    return str(v)


def section_toml(name: str, table: dict) -> str:
    """``[name]`` with the table's plain keys, then ``[name.sub]`` for each sub-table (one level), as a config
    file holds it (what ``read_toml`` reads back to the same dict)."""
    out = [f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for k, v in table.items():
        if isinstance(v, dict):
            out.append(f"[{name}.{k}]")
            out += [f"{kk} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(out) + "\n"
