"""control-node replay: publish a recorded /sensor stream to a node (optionally verifying its actions)."""


def register(sub):
    p = sub.add_parser("replay", help="replay a recording's sensor stream to a node; --verify compares actions",
                       description="Publish the /sensor channel of an MCAP recording to the node's sensor endpoint "
                                   "on its original schedule (scaled by --rate), and score the node's answers like "
                                   "`control-node sim`. Frames are renumbered (seq continues after a short "
                                   "handshake) and matched back to their recorded seq. --verify runs lockstep and "
                                   "compares every action with the recorded one (classes exactly, action vectors "
                                   "`u` within --atol); exit code 1 on any mismatch.")
    p.add_argument("file", help="MCAP recording (from `control-node record`)")
    p.add_argument("--rate", type=float, default=1.0, help="speed factor: 2.0 plays twice as fast (default: 1.0)")
    p.add_argument("--lockstep", action="store_true", help="send frame i, wait for action i, then the next")
    p.add_argument("--loop", action="store_true", help="start over at the end, until Ctrl-C")
    p.add_argument("--start", type=float, default=0.0, help="skip the first S seconds of the recording")
    p.add_argument("--duration", type=float, help="replay only S seconds of the recording")
    p.add_argument("--verify", action="store_true",
                   help="lockstep, and compare every action with the recorded one (by seq)")
    p.add_argument("--atol", type=float, default=1e-6,
                   help="--verify of action vectors (continuous policies): a component matches when "
                        "|live - recorded| <= ATOL * max(1, |recorded|) (default: %(default)s)")
    p.add_argument("--config", help="node config whose [endpoints] to use (default: the packaged node.toml)")
    p.add_argument("--tap", nargs="?", const="auto", default=None, metavar="ENDPOINT",
                   help="also publish every frame on the sensor tap (to record the replay)")
    p.add_argument("--run-dir", help="where to write summary.json and roundtrip.npz (default: runs/<id>/)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the node (default: %(default)s)")
    return p


def run(args):
    import sys

    from control_node.errors import UserError
    from control_node.recording.reader import recorded_answers, verify
    from control_node.sim import engine
    from control_node.config import client_endpoints as load_endpoints
    from control_node.sim.streams import replay_stream
    if args.verify and args.loop:
        raise UserError("--verify and --loop do not go together")
    from control_node.security import client_curve_from_config_path
    eps = load_endpoints(args.config)
    st = replay_stream(args.file, rate=args.rate, start=args.start, duration=args.duration)
    answers = recorded_answers(args.file) if args.verify else None
    lockstep = args.lockstep or args.verify
    tap = None if args.tap is None else (eps["sensor_tap"] if args.tap == "auto" else args.tap)
    run_dir = args.run_dir or engine.new_run_dir("replay")
    loop = engine.ClosedLoop(eps, tap=tap, handshake_timeout=args.timeout,
                              curve=client_curve_from_config_path(args.config))
    print(f"replay: {args.file}: {len(st)} frames over {st.offsets_ns[-1] / 1e9:.3f} s at rate {args.rate:g}"
          f"{' (lockstep)' if lockstep else ''}", flush=True)
    passes = 0
    try:
        with engine.Stopper() as stopper:
            while True:
                try:
                    res = loop.run(st, lockstep=lockstep, stopper=stopper, progress=True)
                except KeyboardInterrupt:
                    return 130
                passes += 1
                if not args.loop or stopper.stop:
                    break
    finally:
        loop.close()
    settings = dict(st.settings, lockstep=lockstep, loop=args.loop, passes=passes, tap=tap)
    summary = engine.summarize(res, loop, settings, role="replay", lockstep=lockstep, atol=args.atol)
    summary["wall_s"] = res["wall_s"]
    rc = 0
    if args.verify:
        compared, mism = verify(st.recorded_seq, res, answers, atol=args.atol)
        summary["verify"] = {"compared": compared, "mismatches": len(mism), "mismatched": mism[:1000],
                             "atol": args.atol, "first_mismatch": mism[0] if mism else None}
        for m in mism[:50]:
            what = "no answer" if m["lost"] else f"replayed {m['replayed']}{' (safe)' if m['safe'] else ''}"
            if "component" in m:
                what += (f"; component {m['component']} differs by {m['diff']:.3g} > {m['tol']:.3g}"
                         if m["component"] >= 0 else "; a different number of actions")
            if "kind" in m:
                what += f" ({m['kind']})"
            print(f"mismatch seq {m['seq']}: recorded {m['recorded']}, {what}")
        if len(mism) > 50:
            print(f"... and {len(mism) - 50} more")
        if mism:
            m = mism[0]
            print(f"first mismatch: seq {m['seq']}"
                  + (f", component {m['component']}: recorded {m['recorded'][m['component']]!r}, replayed "
                     f"{m['replayed'][m['component']]!r}" if m.get("component", -1) >= 0 else
                     f": recorded {m['recorded']}, replayed {m['replayed']}"))
        print(f"verify: {compared} actions compared, {len(mism)} mismatches")
        rc = 1 if mism else 0
        if compared == 0:
            print("verify: nothing to compare (no recorded non-safe actions matching the /sensor frames)",
                  file=sys.stderr)
            rc = 1
    engine.write_run_dir(run_dir, summary, res)
    engine.print_summary(summary, run_dir)
    return rc
