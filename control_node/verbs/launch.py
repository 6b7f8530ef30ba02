"""control-node launch: start the node, the simulator (or a replay) and optionally the recorder together."""


def register(sub):
    p = sub.add_parser("launch", help="start node + simulator (+ recorder) from a launch config, like ros2 launch",
                       description="Start the node, wait for its ready line, then the simulator (or a replay) and "
                                   "optionally the recorder, each in its own process group with prefixed logs. "
                                   "Stops everything after the duration or on Ctrl-C, reports a child that dies, "
                                   "and prints a jitter and accuracy summary. Trains the model if it is missing.")
    p.add_argument("config", nargs="?", default="configs/demo.toml",
                   help="launch config, also the node's config (default: %(default)s)")
    p.add_argument("--duration", type=float, help="seconds to run (default: [launch].duration, 10)")
    p.add_argument("--record", action="store_true", default=None, help="also start the recorder")
    p.add_argument("--run-dir", help="launch run directory (default: runs/<id>/)")
    return p


def run(args):
    from control_node.launch import launch
    return launch(args.config, duration=args.duration, record=args.record, run_dir=args.run_dir)
