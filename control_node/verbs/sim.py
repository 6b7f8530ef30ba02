"""control-node sim: a simulated robot that streams sensor frames to a node and scores its actions."""


def register(sub):
    p = sub.add_parser("sim", help="simulated robot: stream sensor frames to a node and score its actions",
                       description="Connect a PUB to the node's sensor endpoint and a SUB to its action endpoint, "
                                   "publish frames at a fixed rate (or a recording's schedule) and score the "
                                   "closed loop: accuracy, round-trip latency, lost and safe actions. "
                                   "Writes summary.json and roundtrip.npz to the run directory.")
    p.add_argument("stream", nargs="?", choices=["gauss", "iris", "replay"], default="gauss",
                   help="gauss: per-class Gaussians fitted to iris, regime switching; iris: the real samples; "
                        "replay FILE: an MCAP recording's /sensor stream (default: %(default)s)")
    p.add_argument("file", nargs="?", help="the recording, for the replay stream")
    p.add_argument("--config", help="node config whose [endpoints] to use (default: the packaged node.toml)")
    p.add_argument("--rate", type=float, default=1000.0, help="frames per second (default: %(default)s); "
                   "for replay: speed factor of the recorded schedule (default 1.0)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds to stream (default: 5 for gauss, one pass of 150 samples for iris)")
    p.add_argument("--lockstep", action="store_true", help="send frame i, wait for action i, then send the next")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--shuffle", action="store_true", help="iris: shuffle the samples (per pass)")
    g = p.add_argument_group("gauss stream")
    g.add_argument("--dwell", type=float, nargs=2, default=[0.2, 1.0], metavar=("MIN", "MAX"),
                   help="seconds a class lasts before switching, uniform in [MIN, MAX] (default: 0.2 1.0)")
    g.add_argument("--noise", type=float, default=0.0, help="extra Gaussian noise, feature std units")
    g.add_argument("--drift", type=float, default=0.0, help="slow drift, feature std units per second")
    g.add_argument("--outliers", type=float, default=0.0, metavar="P", help="outlier probability per frame")
    g.add_argument("--drop", type=float, default=0.0, metavar="P", help="dropped-frame probability per frame")
    p.add_argument("--tap", nargs="?", const="auto", default=None, metavar="ENDPOINT",
                   help="also publish every frame on a bound PUB 'sensor tap' for `control-node record` "
                        "(default endpoint: [endpoints].sensor_tap, else <sensor>_tap)")
    p.add_argument("--run-dir", help="where to write summary.json and roundtrip.npz (default: runs/<id>/)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the node (default: %(default)s)")
    p.add_argument("--exit-code", type=int, default=None, help=argparse_suppress())
    return p


def argparse_suppress():
    import argparse
    return argparse.SUPPRESS


def run(args):
    import sys

    from control_node.errors import UserError
    from control_node.sim import engine, streams
    from control_node.config import client_endpoints as load_endpoints
    if args.exit_code is not None:  # test hook: a simulator that dies
        print(f"sim: exiting with code {args.exit_code} as asked (--exit-code)", file=sys.stderr)
        return args.exit_code
    from control_node.security import client_curve_from_config_path
    eps = load_endpoints(args.config)
    try:
        if args.stream == "gauss":
            duration = 5.0 if args.duration is None else args.duration
            st = streams.gauss_stream(int(duration * args.rate), rate_hz=args.rate, seed=args.seed,
                                      dwell_min=args.dwell[0], dwell_max=args.dwell[1], noise=args.noise,
                                      drift=args.drift, outlier_prob=args.outliers, drop_prob=args.drop)
        elif args.stream == "iris":
            n = None if args.duration is None else int(args.duration * args.rate)
            st = streams.iris_stream(n, rate_hz=args.rate, shuffle=args.shuffle, seed=args.seed)
        else:
            if not args.file:
                raise UserError("the replay stream needs a FILE: control-node sim replay FILE.mcap")
            rate = 1.0 if args.rate == 1000.0 else args.rate
            st = streams.replay_stream(args.file, rate=rate, duration=args.duration)
    except ValueError as e:
        raise UserError(str(e))
    if len(st) == 0:
        raise UserError("nothing to send (duration * rate is 0)")
    tap = None if args.tap is None else (eps["sensor_tap"] if args.tap == "auto" else args.tap)
    run_dir = args.run_dir or engine.new_run_dir("sim")
    loop = engine.ClosedLoop(eps, tap=tap, handshake_timeout=args.timeout,
                              curve=client_curve_from_config_path(args.config))
    print(f"sim: {st.settings['kind']} stream, {len(st)} frames, "
          f"{'lockstep' if args.lockstep else 'open loop'}; sensor={eps['sensor']} action={eps['action']}"
          + (f" tap={tap}" if tap else ""), flush=True)
    try:
        with engine.Stopper() as stopper:
            try:
                res = loop.run(st, lockstep=args.lockstep, stopper=stopper)
            except KeyboardInterrupt:
                print("sim: interrupted before the node answered", file=sys.stderr)
                return 130
    finally:
        loop.close()
    settings = dict(st.settings, lockstep=args.lockstep, tap=tap)
    summary = engine.summarize(res, loop, settings, role="sim", lockstep=args.lockstep)
    engine.write_run_dir(run_dir, summary, res)
    engine.print_summary(summary, run_dir)
    return 0
