"""control-node echo TOPIC: print decoded messages of a topic, like `ros2 topic echo`."""


def register(sub):
    e = sub.add_parser("echo", help="print decoded messages of a topic (sensor, action, diagnostics)",
                       description="Decode each MessagePack message and print it as `key: value` lines "
                                   "separated by `---`. The node's sensor socket binds a SUB, so `sensor` reads "
                                   "the simulator's/replayer's sensor tap ([endpoints] sensor_tap).")
    e.add_argument("topic", metavar="TOPIC", help="sensor | action | diagnostics, or an endpoint (tcp://..., ipc://...)")
    e.add_argument("--config", metavar="FILE", help="node config (default: the packaged node.toml)")
    e.add_argument("--count", "-n", type=int, metavar="N", help="exit after N messages")
    e.add_argument("--json", action="store_true", help="one JSON object per line instead of YAML-like blocks")
    e.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="give up when no message arrives for S seconds (default: %(default)s)")
    return e


def run(args):
    import json

    from control_node import monitor
    from control_node.errors import UserError
    endpoint, kind = monitor.resolve(args.topic, args.config)
    seen = 0
    with monitor.Subscriber(endpoint, curve=monitor.curve_for(kind, args.config)) as sub:
        while args.count is None or seen < args.count:
            frames = sub.recv(args.timeout)
            if frames is None:
                raise UserError(monitor.no_message_hint(endpoint, kind) + f" (nothing for {args.timeout:g} s)")
            msg = monitor.decode(frames)
            if args.json:
                print(json.dumps(msg, default=repr), flush=True)
            else:
                print(monitor.to_yaml(msg) + "\n---", flush=True)
            seen += 1
    return 0
