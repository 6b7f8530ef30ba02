"""control-node replay: publish a recorded /sensor stream to a node (optionally verifying its actions)."""


def register(sub):
    p = sub.add_parser("replay", help="replay a recording's sensor stream to a node; --verify compares actions",
                       description="Publish the /sensor channel of an MCAP recording to the node's sensor endpoint "
                                   "on its original schedule (scaled by --rate), and score the node's answers like "
                                   "`control-node sim`. Frames are renumbered (seq continues after a short "
                                   "handshake) and matched back to their recorded seq. --verify runs lockstep and "
                                   "compares every action with the recorded one (classes exactly, action vectors "
                                   "`u` within --atol); exit code 1 on any mismatch.")
    p.add_argument("file", nargs="?", help="MCAP recording (from `control-node record`)")
    p.add_argument("--rosbag2", metavar="DIR",
                   help="replay a rosbag2 directory instead (MCAP or sqlite3, e.g. from `ros2 bag record`): frames "
                        "assembled by the --config's [ros2] recipe at the bag's log times; --verify compares "
                        "each answer with the policy's own (--model, default the config's [node] model)")
    p.add_argument("--model", help="--rosbag2 --verify: the policy file whose answers the node's must match")
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
    p.add_argument("--no-follow", action="store_true",
                   help="do not repeat the recording's policy switches on the node (by default each switch is "
                        "made through the node's control endpoint before the first frame the new policy acted on; "
                        "a policy not resident is loaded from its recorded path, checked by sha256)")
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
    if args.rosbag2 is not None:
        if args.file:
            raise UserError("give a recording FILE or --rosbag2 DIR, not both")
        return _run_rosbag2(args)
    if not args.file:
        raise UserError("replay needs a recording FILE (or --rosbag2 DIR)")
    from control_node.security import client_curve_from_config_path
    eps = load_endpoints(args.config)
    st = replay_stream(args.file, rate=args.rate, start=args.start, duration=args.duration)
    answers = recorded_answers(args.file) if args.verify else None
    lockstep = args.lockstep or args.verify
    tap = None if args.tap is None else (eps["sensor_tap"] if args.tap == "auto" else args.tap)
    run_dir = args.run_dir or engine.new_run_dir("replay")
    curve = client_curve_from_config_path(args.config)
    loop = engine.ClosedLoop(eps, tap=tap, handshake_timeout=args.timeout, curve=curve)
    follower = None if args.no_follow else SwitchFollower.from_recording(args.file, st.recorded_seq, eps["control"],
                                                                         curve, args.timeout)
    print(f"replay: {args.file}: {len(st)} frames over {st.offsets_ns[-1] / 1e9:.3f} s at rate {args.rate:g}"
          f"{' (lockstep)' if lockstep else ''}", flush=True)
    passes = 0
    try:
        with engine.Stopper() as stopper:
            while True:
                try:
                    if follower is not None:
                        follower.rewind()
                    res = loop.run(st, lockstep=lockstep, stopper=stopper, progress=True,
                                   before_send=follower.before_send if follower is not None else None)
                except KeyboardInterrupt:
                    return 130
                passes += 1
                if not args.loop or stopper.stop:
                    break
    finally:
        loop.close()
        if follower is not None:
            follower.close()
    settings = dict(st.settings, lockstep=lockstep, loop=args.loop, passes=passes, tap=tap,
                    followed_switches=follower.done if follower is not None else [])
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


def _run_rosbag2(args):
    import os
    import sys

    from control_node.bridge.rosbag2 import bag_stream, describe_counters
    from control_node.config import client_endpoints as load_endpoints
    from control_node.config import read_toml
    from control_node.errors import UserError
    from control_node.security import client_curve_from_config_path
    from control_node.sim import engine
    if not args.config:
        raise UserError("--rosbag2 needs --config FILE with a [ros2] section (the recipe that makes frames)")
    raw = read_toml(args.config)
    model = args.model or (raw.get("node") or {}).get("model")
    history = int((raw.get("policy") or {}).get("history", 1))
    recipe = _bag_recipe(args.config, raw, model)
    st, counters = bag_stream(args.rosbag2, recipe, rate=args.rate, start=args.start, duration=args.duration)
    print(f"replay: {args.rosbag2}: {describe_counters(counters)}", flush=True)
    if args.verify:
        if not model or not os.path.exists(model):
            raise UserError("--rosbag2 --verify compares with the policy's own answers: give --model FILE "
                            "(or [node] model in the config)")
        if history != 1:
            raise UserError(f"--rosbag2 --verify: the node stacks {history} frames per input ([policy] history); "
                            "its inputs are not known frame by frame here")
        from control_node.kernels import Policy
        policy = Policy.load(model)
        if not policy.continuous:
            raise UserError(f"--rosbag2 --verify: {model} is an argmax policy; a [ros2] recipe drives a continuous one")
        st.expected_u = policy.act_batch(st.X)
    lockstep = args.lockstep or args.verify
    eps = load_endpoints(args.config)
    tap = None if args.tap is None else (eps["sensor_tap"] if args.tap == "auto" else args.tap)
    run_dir = args.run_dir or engine.new_run_dir("replay")
    loop = engine.ClosedLoop(eps, tap=tap, handshake_timeout=args.timeout,
                             curve=client_curve_from_config_path(args.config))
    print(f"replay: {args.rosbag2}: {len(st)} frames over {st.offsets_ns[-1] / 1e9:.3f} s at rate {args.rate:g}"
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
        ex = summary.get("expected") or {"compared": 0, "mismatches": 0}
        lost = int(summary["actions_lost"])
        safe = int(summary["safe_answers"])
        bad = int(ex["mismatches"]) + lost + safe
        summary["verify"] = {"compared": int(ex["compared"]), "mismatches": bad, "lost": lost, "safe": safe,
                             "atol": args.atol, "first_mismatch": ex.get("first_mismatch"),
                             "against": "policy", "model": model}
        if ex.get("first_mismatch"):
            fm = ex["first_mismatch"]
            print(f"first mismatch: frame {fm['seq'] - res['seq_base']}, component {fm['component']}: "
                  f"node {fm['got']!r}, policy {fm['expected']!r}")
        print(f"verify: {ex['compared']} actions compared with the policy, {bad} mismatches "
              f"({ex['mismatches']} differ, {lost} unanswered, {safe} safe)")
        rc = 1 if bad or not ex["compared"] else 0
        if not ex["compared"]:
            print("verify: nothing to compare", file=sys.stderr)
    engine.write_run_dir(run_dir, summary, res)
    engine.print_summary(summary, run_dir)
    return rc


def _bag_recipe(config, raw, model):
    """The config's [ros2] recipe, checked against ``model`` when it can be read."""
    import os

    from control_node.bridge.recipe import load_recipe, parse_recipe
    from control_node.errors import UserError
    if "ros2" not in raw:
        raise UserError(f"{config} has no [ros2] section: --rosbag2 needs the recipe that makes frames (docs/ros2.md)")
    if model and os.path.exists(model):
        from control_node.kernels import load_model
        spec = load_model(model)
        return parse_recipe(raw["ros2"], config, spec.n_features, spec.feature_names, spec.action_names,
                            int((raw.get("policy") or {}).get("history", 1)))
    return load_recipe(config, check_model=False)


class SwitchFollower:
    """Repeats a recording's policy switches on the live node, each before the first frame (by recorded
    seq) the new policy acted on, through the control endpoint (plain activations: the recorded outcome,
    whatever rule caused it). A policy the node does not hold is loaded from its recorded path; a resident
    one of the same name but another sha256 is an error."""

    def __init__(self, switches, recorded_seq, endpoint, curve, timeout):
        from control_node.lifecycle import PolicyClient
        self.recorded_seq = [int(s) for s in recorded_seq]
        first = self.recorded_seq[0] if self.recorded_seq else 0
        # the policy active for the first replayed frame, then the switches after it
        before = [w for w in switches if w[0] < first]
        self.first = before[-1] if before else None
        self.switches = [w for w in switches if w[0] >= first]
        self.client = PolicyClient(endpoint, curve, timeout=max(timeout, 30.0))
        self.k, self.done = 0, []

    @classmethod
    def from_recording(cls, path, recorded_seq, endpoint, curve, timeout):
        from control_node.recording.reader import policy_switches, recorded_transitions
        f = cls(policy_switches(recorded_transitions(path)), recorded_seq, endpoint, curve, timeout)
        if not f.switches:
            f.close()
            return None
        print(f"replay: the recording switches policy {len(f.switches)} time(s); following them on {endpoint} "
              "(--no-follow: do not)", flush=True)
        return f

    def rewind(self):
        """Back to the recording's start-up policy (a second pass of --loop, or the first)."""
        self.k = 0
        if self.first is not None:
            _seq, name, path, sha, _event = self.first
            self._activate(name, path, sha)

    def _activate(self, name, path, sha, st=None):
        from control_node.errors import UserError
        st = st or self.client.request({"op": "status"})["status"]
        have = _sha_of(st, name)
        if have is None:
            rep = self.client.request({"op": "load", "name": name, "path": path})
            if not rep["ok"]:
                raise UserError(f"replay: cannot load the recorded policy {name} from {path}: {rep['message']}")
            have = _sha_of(rep["status"], name)
        if sha and have != sha:
            raise UserError(f"replay: the node's policy {name} (sha256 {str(have)[:12]}) is not the recorded one "
                            f"({sha[:12]}, {path})")
        if st["active"] != name:
            rep = self.client.request({"op": "activate", "name": name})
            if not rep["ok"] and rep["error"] != "already_active":
                raise UserError(f"replay: the node refused to activate {name}: {rep['message']}")

    def before_send(self, i):
        rs = self.recorded_seq[i]
        while self.k < len(self.switches) and rs > self.switches[self.k][0]:
            seq, name, path, sha, event = self.switches[self.k]
            self._activate(name, path, sha)
            self.done.append({"before_recorded_seq": rs, "policy": name, "event": event})
            self.k += 1

    def close(self):
        self.client.close()


def _sha_of(status, name):
    return next((p["sha256"] for p in status["policies"] if p["name"] == name), None)
