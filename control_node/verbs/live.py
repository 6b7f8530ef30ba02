"""control-node live: the Foxglove WebSocket view of a running node (``launch --foxglove`` starts it)."""

DEFAULT_LISTEN = "127.0.0.1:8765"


def register(sub):
    p = sub.add_parser("live", help="serve a running node's streams to Foxglove / Lichtblick over WebSocket",
                       description="A Foxglove WebSocket server (the foxglove extra: pip install "
                                   "'control-node[foxglove]') fed by ZeroMQ subscribers of the node's action and "
                                   "diagnostics streams, the sensor tap and the pendulum simulator's state stream: "
                                   "/control_node/observation, /control_node/action, /control_node/cycle, "
                                   "/control_node/events, /sim/pendulum; a legged node's /control_node/mode, "
                                   "/control_node/joint_states, /control_node/base, /control_node/tf (docs/live.md). "
                                   "A process of its own: the "
                                   "node only publishes, a viewer (slow or not) costs its loop nothing. "
                                   "`launch --foxglove` and `run --foxglove` start it for you.")
    p.add_argument("--config", default=None, help="the node's config: its endpoints, [node] model (feature names) "
                                                  "and [foxglove] listen (default: the packaged node.toml)")
    p.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help=f"where to serve (default: [foxglove] listen, else {DEFAULT_LISTEN})")
    p.add_argument("--every", type=int, default=None, metavar="N",
                   help="keep one frame, action and sim step in N, and one /control_node/cycle message per N "
                        "cycles with the min/max/last over them (default: 10, 100 Hz at 1 kHz); events: all")
    p.add_argument("--model", default=None, help="model file whose feature_names name the observation "
                                                 "(default: [node] model)")
    p.add_argument("--state", default="auto", metavar="ENDPOINT",
                   help='the simulator\'s state stream ("auto": <sensor>_sim_state; "none": no /sim/pendulum)')
    p.add_argument("--avoid-cpu", type=int, default=None, metavar="N", help="stay off this core (the node's loop)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds "
                                                                            "(default: on SIGINT/SIGTERM)")
    p.add_argument("--key", default=None, help=argparse_suppress())     # what a bad address is called
    return p


def argparse_suppress():
    import argparse
    return argparse.SUPPRESS


def listen_of(config, flag, flag_key):
    """(value, key) of where to listen: the flag, else the config's [foxglove] listen, else the default."""
    if flag:
        return flag, flag_key
    from control_node.config import read_toml
    from control_node.endpoints import default_config
    raw = read_toml(config or default_config("node.toml"))
    listen = (raw.get("foxglove") or {}).get("listen")
    if listen:
        return listen, "[foxglove] listen"
    return DEFAULT_LISTEN, flag_key


def run(args):
    from control_node.config import client_endpoints, parse_listen, read_toml
    from control_node.endpoints import default_config, derive_sim_state
    from control_node.live import channels
    from control_node.live.server import require_sdk, run_live
    from control_node.security import client_curve_from_config_path
    require_sdk()
    value, key = listen_of(args.config, args.listen, args.key or "--listen")
    listen = parse_listen(value, args.key or key)
    eps = client_endpoints(args.config)
    every = args.every if args.every is not None else channels.DEFAULT_EVERY
    if every < 1:
        from control_node.errors import UserError
        raise UserError(f"--every {every}: use 1 (every message) or more")
    model = args.model or (read_toml(args.config or default_config("node.toml")).get("node") or {}).get("model")
    state = None if args.state == "none" else (derive_sim_state(eps["sensor"]) if args.state == "auto" else args.state)
    return run_live(eps, listen, args.key or key, every=every, model=model,
                    curve=client_curve_from_config_path(args.config), state_endpoint=state,
                    duration=args.duration, loop_cpu=args.avoid_cpu)
