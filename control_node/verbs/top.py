"""control-node top: live view of a running node's diagnostics (rate, percentiles, misses, RT features)."""


def register(sub):
    t = sub.add_parser("top", help="live view of a running node: rate, latency percentiles, misses, RT features",
                       description="Subscribe to the node's diagnostics (about 10 Hz, docs/protocol.md) and show "
                                   "them refreshing in place, and under them the counters of a `control-node bridge` "
                                   "beside the node when one runs. Ctrl-C to quit.")
    t.add_argument("--endpoint", metavar="ENDPOINT",
                   help="diagnostics endpoint (default: [endpoints] diagnostics from --config)")
    t.add_argument("--config", metavar="FILE", help="node config (default: the packaged node.toml)")
    t.add_argument("--once", action="store_true", help="print one snapshot and exit (for scripts)")
    t.add_argument("--timeout", type=float, metavar="S",
                   help="give up when no diagnostics arrive for S seconds (default: 5 with --once, "
                        "otherwise wait forever)")
    return t


def run(args):
    import signal
    import time

    from rich.console import Console

    from control_node import monitor
    from control_node.errors import UserError
    endpoint, _ = monitor.resolve("diagnostics", args.config, args.endpoint)
    timeout = args.timeout if args.timeout is not None else (5.0 if args.once else None)
    console = Console()

    def next_diag(sub, wait):
        frames = sub.recv(wait)
        if frames is None:
            return None
        msg = monitor.decode(frames)
        return msg if isinstance(msg, dict) and "<undecodable>" not in msg else {}

    bridge = _bridge_subscriber(args.config)

    def with_bridge(renderable, wait=0.0):
        """The node's table, and under it the newest counters of a bridge beside the node, if one runs."""
        if bridge is None:
            return renderable
        import msgpack
        from rich.console import Group
        from rich.text import Text
        frames = bridge.recv(wait)
        while frames is not None:
            try:
                msg = msgpack.unpackb(frames[0])
                if isinstance(msg, dict) and msg.get("role") == "bridge":
                    bridge.last = msg
            except ValueError:
                pass
            frames = bridge.recv(0)
        return Group(renderable, Text(monitor.bridge_line(bridge.last))) if bridge.last else renderable

    try:
        with monitor.Subscriber(endpoint, curve=monitor.curve_for("diagnostics", args.config)) as sub:
            if args.once:
                deadline = time.monotonic() + timeout
                while True:
                    diag = next_diag(sub, max(0.0, deadline - time.monotonic()))
                    if diag is None:
                        raise UserError(monitor.no_message_hint(endpoint, "diagnostics") + f" (waited {timeout:g} s)")
                    if diag and diag.get("cycles", 1):     # a snapshot of a running loop (not one from before it started)
                        console.print(with_bridge(monitor.top_renderable(diag, endpoint), wait=2.0))
                        return 0
            from rich.live import Live
            from rich.text import Text
            start = time.monotonic()
            # Ctrl-C sets a flag that the loop checks every 0.25 s: a KeyboardInterrupt raised anywhere inside rich's
            # Live (while its refresh thread holds the console) could leave top hanging instead of exiting
            stop = []
            old = signal.signal(signal.SIGINT, lambda *_: stop.append(1))
            try:
                with Live(Text(f"waiting for diagnostics on {endpoint} ..."), console=console, refresh_per_second=4,
                          transient=False) as live:
                    return _live_loop(live, sub, next_diag, endpoint, timeout, stop, start, with_bridge)
            finally:
                signal.signal(signal.SIGINT, old)
    finally:
        if bridge is not None:
            bridge.close()


def _bridge_subscriber(config):
    """A SUB to the counters a bridge beside the node publishes (``endpoints.derive_bridge_diagnostics``), or
    None when the node's endpoints are not ipc."""
    from control_node import monitor
    from control_node.config import client_endpoints
    from control_node.endpoints import derive_bridge_diagnostics
    sensor = client_endpoints(config)["sensor"]
    if not sensor.startswith("ipc://"):
        return None
    sub = monitor.Subscriber(derive_bridge_diagnostics(sensor))
    sub.last = None
    return sub


def _live_loop(live, sub, next_diag, endpoint, timeout, stop, start, with_bridge=lambda r: r):
    """Refresh ``live`` from the diagnostics until ``stop`` fills (Ctrl-C); returns 130 then."""
    import time

    from rich.text import Text

    from control_node import monitor
    from control_node.errors import UserError
    prev = last = None
    last_t = start
    while not stop:
        diag = next_diag(sub, 0.25)
        now = time.monotonic()
        if diag:
            prev, last, last_t = last, diag, now
        if timeout is not None and now - last_t > timeout:
            raise UserError(monitor.no_message_hint(endpoint, "diagnostics")
                            + f" (nothing for {timeout:g} s)")
        if last is not None:
            live.update(with_bridge(monitor.top_renderable(last, endpoint, prev, age_s=now - last_t)))
        else:
            live.update(Text(f"waiting for diagnostics on {endpoint} ... {now - start:.0f} s"))
    return 130
