"""control-node top: live view of a running node's diagnostics (rate, percentiles, misses, RT features)."""


def register(sub):
    t = sub.add_parser("top", help="live view of a running node: rate, latency percentiles, misses, RT features",
                       description="Subscribe to the node's diagnostics (about 10 Hz, docs/protocol.md) and show "
                                   "them refreshing in place. Ctrl-C to quit.")
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

    with monitor.Subscriber(endpoint, curve=monitor.curve_for("diagnostics", args.config)) as sub:
        if args.once:
            deadline = time.monotonic() + timeout
            while True:
                diag = next_diag(sub, max(0.0, deadline - time.monotonic()))
                if diag is None:
                    raise UserError(monitor.no_message_hint(endpoint, "diagnostics") + f" (waited {timeout:g} s)")
                if diag and diag.get("cycles", 1):     # a snapshot of a running loop (not one from before it started)
                    console.print(monitor.top_renderable(diag, endpoint))
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
                return _live_loop(live, sub, next_diag, endpoint, timeout, stop, start)
        finally:
            signal.signal(signal.SIGINT, old)


def _live_loop(live, sub, next_diag, endpoint, timeout, stop, start):
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
            live.update(monitor.top_renderable(last, endpoint, prev, age_s=now - last_t))
        else:
            live.update(Text(f"waiting for diagnostics on {endpoint} ... {now - start:.0f} s"))
    return 130
