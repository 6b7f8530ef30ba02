"""control-node echo TOPIC: print decoded messages of a topic, like `ros2 topic echo`."""


def register(sub):
    e = sub.add_parser("echo", help="print decoded messages of a topic (sensor, action, diagnostics)",
                       description="Decode each MessagePack message and print it as `key: value` lines "
                                   "separated by `---`. The node's sensor socket binds a SUB, so `sensor` reads "
                                   "the simulator's/replayer's sensor tap ([endpoints] sensor_tap). A continuous "
                                   "policy's action vector `u` is printed one component per line, named after "
                                   "the node's action names (from its diagnostics) when they are known, to 6 "
                                   "significant digits (--json: exact). --file reads a recording instead.")
    e.add_argument("topic", metavar="TOPIC", help="sensor | action | diagnostics, or an endpoint (tcp://..., ipc://...)")
    e.add_argument("--config", metavar="FILE", help="node config (default: the packaged node.toml)")
    e.add_argument("--count", "-n", type=int, metavar="N", help="exit after N messages")
    e.add_argument("--json", action="store_true", help="one JSON object per line instead of YAML-like blocks")
    e.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="give up when no message arrives for S seconds (default: %(default)s)")
    e.add_argument("--file", metavar="MCAP", help="print the messages of TOPIC's channel in this recording "
                                                 "(`control-node record`) instead of subscribing")
    return e


def _print(msg, as_json, names):
    import json

    from control_node import monitor
    if as_json:
        print(json.dumps(msg, default=repr), flush=True)
    else:
        print(monitor.action_yaml(msg, names) + "\n---", flush=True)


def _from_file(args):
    from control_node import monitor
    from control_node.errors import UserError
    from control_node.recording import DIAGNOSTICS, TOPICS
    from control_node.recording.reader import read_recording
    topic = "/" + args.topic.strip("/")
    if topic not in TOPICS:
        raise UserError(f"--file: topic {args.topic!r} is not a channel of a recording; use one of "
                        + ", ".join(t.strip("/") for t in TOPICS))
    rec = read_recording(args.file, [topic, DIAGNOSTICS])
    names = None
    for raw, _lt in rec[DIAGNOSTICS]:
        names = monitor.action_names_from(monitor.decode([raw]))
        if names:
            break
    seen = 0
    for raw, _lt in rec[topic]:
        if args.count is not None and seen >= args.count:
            break
        _print(monitor.decode([raw]), args.json, names)
        seen += 1
    if seen == 0:
        raise UserError(f"{args.file}: no {topic} messages")
    return 0


def run(args):
    from control_node import monitor
    from control_node.errors import UserError
    if args.file:
        return _from_file(args)
    endpoint, kind = monitor.resolve(args.topic, args.config)
    names = None
    diag = None
    if kind == "action" and not args.json:      # the action names come with the node's diagnostics
        try:
            diag = monitor.Subscriber(monitor.resolve("diagnostics", args.config)[0],
                                      curve=monitor.curve_for("diagnostics", args.config))
        except UserError:
            diag = None
    seen = 0
    try:
        with monitor.Subscriber(endpoint, curve=monitor.curve_for(kind, args.config)) as sub:
            while args.count is None or seen < args.count:
                frames = sub.recv(args.timeout)
                if frames is None:
                    raise UserError(monitor.no_message_hint(endpoint, kind) + f" (nothing for {args.timeout:g} s)")
                msg = monitor.decode(frames)
                if diag is not None and names is None and isinstance(msg, dict) and isinstance(msg.get("u"), list):
                    d = diag.recv(0.3 if seen == 0 else 0)      # wait a little once, for the names
                    while d is not None and names is None:
                        names = monitor.action_names_from(monitor.decode(d))
                        d = diag.recv(0) if names is None else None
                _print(msg, args.json, names)
                seen += 1
    finally:
        if diag is not None:
            diag.close()
    return 0
