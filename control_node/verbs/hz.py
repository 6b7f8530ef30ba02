"""control-node hz TOPIC: message rate of a topic, like `ros2 topic hz`."""


def register(sub):
    h = sub.add_parser("hz", help="message rate of a topic (sensor, action, diagnostics), like `ros2 topic hz`",
                       description="Print the average rate and the min/max/std of the arrival interval over a "
                                   "window, once a second. The node's sensor socket binds a SUB, so `sensor` "
                                   "reads the simulator's/replayer's sensor tap ([endpoints] sensor_tap).")
    h.add_argument("topic", metavar="TOPIC", help="sensor | action | diagnostics, or an endpoint (tcp://..., ipc://...)")
    h.add_argument("--config", metavar="FILE", help="node config (default: the packaged node.toml)")
    h.add_argument("--window", "-w", type=int, default=10000, metavar="N",
                   help="intervals in the statistics window (default: %(default)s)")
    h.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    h.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="give up when no message arrives for S seconds (default: %(default)s)")
    return h


def run(args):
    import sys
    import time

    from control_node import monitor
    from control_node.errors import UserError
    if args.window < 1:
        raise UserError("--window must be at least 1")
    endpoint, kind = monitor.resolve(args.topic, args.config)
    rs = monitor.RateStats(args.window)
    print(f"subscribed to [{args.topic}] {endpoint}", flush=True)
    start = time.monotonic()
    last_msg = start
    next_print = start + 1.0
    with monitor.Subscriber(endpoint, curve=monitor.curve_for(kind, args.config)) as sub:
        while True:
            now = time.monotonic()
            if args.duration is not None and now - start >= args.duration:
                break
            if now - last_msg > args.timeout:
                raise UserError(monitor.no_message_hint(endpoint, kind) + f" (nothing for {args.timeout:g} s)")
            frames = sub.recv(min(0.1, max(0.0, next_print - now)))
            if frames is not None:
                last_msg = time.monotonic()
                rs.add(time.monotonic_ns())
                while True:  # drain what is queued, stamping each arrival
                    frames = sub.recv(0)
                    if frames is None:
                        break
                    rs.add(time.monotonic_ns())
                    last_msg = time.monotonic()
            if time.monotonic() >= next_print:
                next_print += 1.0
                st = rs.stats()
                if st is not None:
                    print(monitor.format_hz(st), flush=True)
    st = rs.stats()
    if st is None:
        print(f"fewer than 2 messages in {args.duration:g} s", file=sys.stderr)
        return 1
    return 0
