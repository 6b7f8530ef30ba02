"""control-node run: the node itself."""


def register(sub):
    p = sub.add_parser("run", help="run the node: fixed-rate loop over ZeroMQ with the compiled policy",
                       description="Load and verify the model, bind the sensor/action/diagnostics sockets, set the "
                                   "process up for real time, and run the control loop until SIGINT/SIGTERM or "
                                   "--duration. Prints `ready ...` once cycles run, and the run directory at exit. "
                                   "An argmax policy publishes class actions (protocol v1, `action`), a continuous "
                                   "one action vectors (v2, `u`: docs/protocol.md). [watchdog] safe_action "
                                   "defaults to \"auto\": class 0 for an argmax policy, \"offset\" (the head's "
                                   "action_offset) for a continuous one; also a class index, a list of floats "
                                   "(one per action) or \"hold\".")
    p.add_argument("--config", default=None, help="TOML config (default: the packaged node.toml)")
    p.add_argument("--model", default=None, help="model file (default: [node].model, models/iris.npz)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="seconds to run (default: until a signal)")
    p.add_argument("--rate", type=float, default=None, metavar="HZ", help="loop rate (default: [loop].rate_hz, 1000)")
    p.add_argument("--clock", choices=["timer", "sensor"], default=None,
                   help="timer: fixed rate; sensor: one cycle per frame arrival (default: [loop].clock)")
    p.add_argument("--cpu", default=None, help='core to pin the loop to: a number, "last" or "none"')
    p.add_argument("--run-dir", default=None, metavar="DIR", help="write the run directory here (default: runs/<id>/)")
    p.add_argument("--quiet", action="store_true", help="no start-up line on stderr")
    return p


def run(args):
    from control_node.config import load_config
    from control_node.node import Node
    cpu = args.cpu
    if cpu is not None and cpu not in ("last", "none"):
        cpu = int(cpu)
    cfg = load_config(args.config, {"loop.duration_s": args.duration, "loop.rate_hz": args.rate,
                                    "loop.clock": args.clock, "realtime.cpu": cpu})
    run_dir = Node(cfg, model_path=args.model, run_dir=args.run_dir, quiet=args.quiet).run()
    import json
    import os
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    w = s["wake_latency_ns"]
    if w["count"]:
        print(f"cycles {s['cycles']}  misses {s['deadline_misses']}  stale {s['stale_cycles']}  "
              f"rejected {s['rejected_total']}  wake latency us p50 {w['p50'] / 1e3:.1f} p99 {w['p99'] / 1e3:.1f} "
              f"max {w['max'] / 1e3:.1f}")
    else:
        print(f"cycles {s['cycles']}  misses {s['deadline_misses']}  stale {s['stale_cycles']}  "
              f"rejected {s['rejected_total']}")
    print(f"run directory: {run_dir}", flush=True)
    return 0
