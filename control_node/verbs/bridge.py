"""control-node bridge: join another middleware's graph (ROS 2) through a separate process."""

DESCRIPTION = """\
Run a bridge process between a ROS 2 graph and the node (the node never imports rclpy).

  control-node bridge ros2 --config FILE

reads the [ros2] section of FILE (the same file `control-node run --config FILE` takes): observation
terms (topic, type, field, joints, scale, offset) concatenated in order into one frame, sent to the node
when a message on `trigger` arrives and every term is valid and received within `max_age_ms`; bad or
stale input sends no frame and is counted by reason (the node then gives its safe action by its own stale
rule). Each new action of the node (a new seq, or safe <-> policy) is published once on [ros2.action].
Counters (frames sent, withheld by reason, actions published, callback latency, CPU) go to
RUN_DIR/summary.json. ROS_DOMAIN_ID in the environment overrides [ros2] domain_id.
docs/ros2.md has the mapping reference and a ros2_control example."""


def register(sub):
    p = sub.add_parser("bridge", help="bridge a ROS 2 graph to the node (a separate process; docs/ros2.md)",
                       description=DESCRIPTION, formatter_class=_raw())
    p.add_argument("kind", choices=["ros2"], help="the graph to join: ros2")
    p.add_argument("--config", required=True, metavar="FILE", help="node config with a [ros2] section")
    p.add_argument("--model", metavar="PATH", help="the node's model file, to check the terms against (default: "
                   "[node] model of the config; pass the same --model as `control-node run`)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds (default: "
                   "run until Ctrl-C / SIGINT / SIGTERM)")
    p.add_argument("--run-dir", metavar="DIR", help="where to write summary.json (default: runs/<time>-bridge/)")
    p.add_argument("--status-every", type=float, default=0.0, metavar="S",
                   help="print a counters line every S seconds (default: only at the end)")
    p.add_argument("--check", action="store_true", help="check the config against the model and exit")
    return p


def _raw():
    import argparse
    return argparse.RawDescriptionHelpFormatter


def run(args):
    import os
    import signal
    import time

    from control_node.bridge.recipe import load_recipe
    from control_node.config import client_endpoints
    from control_node.security import client_curve_from_config_path
    recipe = load_recipe(args.config, model=args.model)
    if args.check:
        print(f"config {args.config}: [ros2] ok: {recipe.describe()}")
        return 0
    from control_node.bridge.ros2 import Bridge
    from control_node.sim.engine import write_summary
    eps = client_endpoints(args.config)
    bridge = Bridge(recipe, eps, curve=client_curve_from_config_path(args.config))
    signal.signal(signal.SIGTERM, lambda *_: bridge.stop.set())
    bridge.run(duration_s=args.duration, status_every_s=args.status_every,
               ready=lambda line: print(line, flush=True))
    run_dir = args.run_dir or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S") + f"-bridge-{os.getpid()}")
    summary = bridge.summary()
    write_summary(run_dir, summary)
    print(bridge.status_line(), flush=True)
    print(f"bridge: summary in {os.path.join(run_dir, 'summary.json')}", flush=True)
    return 0
