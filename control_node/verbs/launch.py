"""control-node launch: start the node, the simulator (or a replay) and optionally the recorder together."""


def register(sub):
    p = sub.add_parser("launch", help="start node + simulator (+ recorder) from a launch config, like ros2 launch",
                       description="Start the node, wait for its ready line, then the simulator (or a replay) and "
                                   "optionally the recorder, each in its own process group with prefixed logs. "
                                   "Stops everything after the duration or on Ctrl-C, reports a child that dies, "
                                   "and prints a jitter and accuracy summary. Trains the model if it is missing.")
    p.add_argument("config", nargs="?", default=None,
                   help="launch config, also the node's config (default: the packaged demo.toml; "
                        "`control-node launch --print-config` shows it, copy it to start your own)")
    p.add_argument("--print-config", action="store_true", help="print the default launch config and exit")
    p.add_argument("--duration", type=float, help="seconds to run (default: [launch].duration, 10)")
    p.add_argument("--record", action="store_true", default=None, help="also start the recorder")
    p.add_argument("--run-dir", help="launch run directory (default: runs/<id>/)")
    return p


def ensure_model(path):
    """Train the iris policy into ``path`` if it is missing (the demo's first run)."""
    import os

    from control_node.launch import say
    if os.path.exists(path):
        return
    say(f"model {path} is missing: training it (control-node train)")
    from control_node.train.iris import export_verified, train_iris
    spec = train_iris()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    export_verified(spec, path)
    say(f"trained {' -> '.join(map(str, spec.layer_sizes))}, test accuracy {spec.test_accuracy:.4f}; wrote {path}")


def run(args):
    from control_node.launch import launch
    if args.print_config:
        from control_node.endpoints import default_config
        with open(default_config("demo.toml")) as f:
            print(f.read(), end="")
        return 0
    return launch(args.config, duration=args.duration, record=args.record, run_dir=args.run_dir,
                  ensure_model=ensure_model)
