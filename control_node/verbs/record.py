"""control-node record: record sensor frames (via the simulator's sensor tap), actions and diagnostics to MCAP."""


def register(sub):
    p = sub.add_parser("record", help="record sensor (tap), action and diagnostics streams to an MCAP file",
                       description="Subscribe to the node's action and diagnostics PUBs and to the sensor tap that "
                                   "`control-node sim --tap` / `control-node replay --tap` bind (the node's sensor "
                                   "socket is a binding SUB, so it cannot be subscribed to), and write every message "
                                   "as received to an MCAP file: channels /sensor, /action, /diagnostics, message "
                                   "encoding msgpack. Stops on Ctrl-C / SIGTERM or after --duration.")
    p.add_argument("--out", help="MCAP file to write (default: runs/<id>/recording.mcap)")
    p.add_argument("--duration", type=float, help="seconds to record (default: until Ctrl-C)")
    p.add_argument("--config", help="node config whose [endpoints] to use (default: the packaged node.toml)")
    p.add_argument("--tap", help="sensor tap endpoint (default: [endpoints].sensor_tap, else <sensor>_tap)")
    p.add_argument("--flush-interval", type=float, default=1.0,
                   help="seconds between forced chunk flushes (bounds what a crash can lose; default: %(default)s)")
    return p


def run(args):
    import os
    import time

    from control_node.recording.writer import record
    from control_node.security import client_curve_from_config_path
    from control_node.config import client_endpoints as load_endpoints
    from control_node.sim.engine import Stopper
    eps = load_endpoints(args.config)
    if args.tap:
        eps["sensor_tap"] = args.tap
    from control_node.endpoints import derive_sim_state
    eps["sim_state"] = derive_sim_state(eps["sensor"])      # the pendulum's state, when it publishes one
    out = args.out or os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S')}-record-{os.getpid()}",
                                   "recording.mcap")
    with Stopper() as stopper:
        counts = record(eps, out, duration=args.duration, flush_interval=args.flush_interval, stopper=stopper,
                        log=lambda m: print(m, flush=True), curve=client_curve_from_config_path(args.config))
    print("recorded " + ", ".join(f"{t} {n}" for t, n in counts.items()))
    print(f"recording: {out}", flush=True)
    return 0
