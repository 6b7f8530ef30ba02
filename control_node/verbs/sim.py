"""control-node sim: a simulated robot that streams sensor frames to a node and scores its actions."""


def register(sub):
    p = sub.add_parser("sim", help="simulated robot: stream sensor frames to a node and score its actions",
                       description="Connect a PUB to the node's sensor endpoint and a SUB to its action endpoint, "
                                   "publish frames at a fixed rate (or a recording's schedule) and score the "
                                   "closed loop: accuracy, round-trip latency, lost and safe actions. "
                                   "Against a continuous policy (actions `u`, protocol v2) accuracy is n/a; the "
                                   "action vectors are recorded (roundtrip.npz `u`) and, with --model, compared "
                                   "with the policy's own answer for each frame. "
                                   "Writes summary.json and roundtrip.npz to the run directory.")
    p.add_argument("stream", nargs="?", choices=["gauss", "iris", "replay", "pendulum", "mujoco"], default="gauss",
                   help="gauss: per-class Gaussians fitted to iris, regime switching; iris: the real samples; "
                        "replay FILE: an MCAP recording's /sensor stream; pendulum: a torque-limited pendulum "
                        "(RK4 physics, closed loop with a continuous policy, scored: time to upright, RMS error, "
                        "falls); mujoco [MODEL.xml]: a legged robot in MuJoCo (any MJCF with a floating base and an "
                        "IMU; default the packaged quadruped) closed loop with a node running a [legged] recipe, "
                        "scored as a walk (default: %(default)s)")
    p.add_argument("file", nargs="?", help="the recording, for the replay stream; the MJCF, for mujoco")
    p.add_argument("--config", help="node config whose [endpoints] to use (default: the packaged node.toml)")
    p.add_argument("--rate", type=float, default=None, help="frames per second (default: 1000); "
                   "for replay: speed factor of the recorded schedule (default 1.0); for mujoco: the control rate, "
                   "the physics rate divided by a whole number (default: the physics rate, a frame per step)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds to stream (default: 5 for gauss, one pass of 150 samples for iris)")
    p.add_argument("--lockstep", action="store_true",
                   help="send frame i, wait for action i, then send the next; pendulum: simulated time waits for "
                        "each answer (the answer applies at once, --delay-us later in simulated time), so the "
                        "score is the policy's whatever the host's speed; an answer missing for --timeout s "
                        "ends the run with an error. Give the node's [watchdog] stale_after_ms room (e.g. 5000): "
                        "the robot's clock stands still while it waits, and a frame the watchdog answered with "
                        "its safe action gets that (with --ros2, where a command carries no frame number, any "
                        "safe action sent while the robot waits would be taken as the answer)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--shuffle", action="store_true", help="iris: shuffle the samples (per pass)")
    g = p.add_argument_group("gauss stream")
    g.add_argument("--dwell", type=float, nargs=2, default=[0.2, 1.0], metavar=("MIN", "MAX"),
                   help="seconds a class lasts before switching, uniform in [MIN, MAX] (default: 0.2 1.0)")
    g.add_argument("--noise", type=float, default=0.0, help="extra Gaussian noise, feature std units")
    g.add_argument("--drift", type=float, default=0.0, help="slow drift, feature std units per second")
    g.add_argument("--outliers", type=float, default=0.0, metavar="P", help="outlier probability per frame")
    g.add_argument("--drop", type=float, default=0.0, metavar="P", help="dropped-frame probability per frame")
    g.add_argument("--features", default=None, metavar="N|auto",
                   help="observation width: 4 = the iris Gaussians; other widths: three N-dimensional regimes; "
                        "auto: the width the node's diagnostics announce (default: the --model's width, else 4)")
    pe = p.add_argument_group("pendulum", "observation (cos theta, sin theta, theta_dot), torque u[0] held until the "
                                          "next action; --rate is the observation rate, --drop and --noise "
                                          "(observation units) apply too")
    pe.add_argument("--physics-hz", type=float, default=1000.0, help="RK4 steps per second (default: %(default)s)")
    pe.add_argument("--delay-us", type=float, default=0.0,
                    help="added transport delay: an action is applied this long after it arrives (default: 0)")
    pe.add_argument("--theta0", type=float, default=3.141592653589793,
                    help="start angle in rad, 0 = upright (default: pi, hanging)")
    pe.add_argument("--push-every", type=float, default=0.0, metavar="S",
                    help="push the pendulum every S seconds (default: never)")
    pe.add_argument("--push", type=float, default=None,
                    help="push size: added theta_dot in rad/s (default: 2); mujoco: a horizontal velocity impulse "
                         "on the base in m/s, in a direction drawn from --seed (default: 0.3)")
    pe.add_argument("--ros2", action="store_true",
                    help="be a ROS 2 robot instead of a ZeroMQ client (run `control-node bridge ros2` beside the "
                         "node; needs rclpy, control-node[ros2]). pendulum: publish sensor_msgs/msg/JointState on "
                         "/joint_states (joint 'theta': position, velocity, effort) and take effort commands as "
                         "std_msgs/msg/Float64MultiArray on /pendulum_controller/commands "
                         "(configs/pendulum_ros2.toml). mujoco: publish every model joint's JointState on "
                         "/joint_states (effort = applied torque), sensor_msgs/msg/Imu on /imu/data (x, y, z, w; "
                         "body frame) and the --cmd schedule as geometry_msgs/msg/Twist on /cmd_vel (topics from the "
                         "config's [ros2.legged]); take the node's commands on --command-topic; the node's mode from "
                         "the bridge's latched std_msgs/msg/Bool [ros2.legged] policy_active; --damp-before-end "
                         "publishes \"damping\" on [ros2.legged] mode (configs/quadruped_ros2.toml)")
    mj = p.add_argument_group(
        "mujoco", "the robot of a legged node: --config is the node's config, whose [legged] recipe gives the frame "
                  "layout (joint_pos, joint_vel by joints.robot's names, imu_quat in observation.quat_order, "
                  "imu_gyro, imu_acc, the command's n_commands values) and the output the node publishes. Joints "
                  "are matched to the MJCF's by name. Each control step sends one frame and applies the node's "
                  "newest command: torque -> the motors (clipped to ctrlrange, counted); position -> position "
                  "actuators' targets, or on motors a PD here at physics rate with the recipe's kp, kd; impedance "
                  "-> a PD here at physics rate with the command's q*, qd*, kp, kd, tau_ff. Real time: physics paced "
                  "to wall time; --lockstep: each frame waits for the command carrying its seq. The walk is scored "
                  "while the node is in policy mode: time upright, falls, distance, mean velocity against the "
                  "command, tracking error, torque peak and RMS (summary.json, one printed line). --delay-us, "
                  "--drop (each command lost with probability P), --push-every/--push and --duration apply too")
    mj.add_argument("--dt", type=float, default=None, metavar="S",
                    help="physics step in seconds (default: the model's <option timestep>)")
    mj.add_argument("--keyframe", default=None, metavar="NAME",
                    help="start from this keyframe (default: \"home\" when the model has it, else qpos0); the "
                         "packaged quadruped has \"crouch\": lying, for the node's stand-up ramp")
    mj.add_argument("--cmd", default="0:0.4", metavar="SCHEDULE",
                    help="velocity command schedule, seconds from the start: TIME:VX[,VY][@YAW_RATE],... e.g. "
                         "\"0:0,3:0.4,10:0.4@0.5\" (default: %(default)s); with --ros2 it is published as the "
                         "Twist the bridge reads, and \"ros\" instead reads that topic (a teleop's /cmd_vel) and "
                         "scores the walk against what it says")
    mj.add_argument("--pd-in-sim", action="store_true",
                    help="the PD runs here at physics rate from the node's impedance commands (the baseline to "
                         "compare with the node's PD at its loop rate, output \"torque\"); refused when the node "
                         "publishes torques")
    mj.add_argument("--command-topic", default=None, metavar="TOPIC",
                    help="with --ros2: the topic of the node's commands (default: the config's [ros2.action] topic, "
                         "else /leg_controller/commands)")
    mj.add_argument("--command-type", default=None, choices=["Float64MultiArray", "JointState"],
                    help="with --ros2: std_msgs/msg/Float64MultiArray (data in joints.actuators' order) or "
                         "sensor_msgs/msg/JointState (matched by name: effort for a torque output, position for a "
                         "position output); a command of a wrong width, with a non-finite value or an unknown or "
                         "missing joint is counted by reason and never applied (default: the config's "
                         "[ros2.action] type, else Float64MultiArray)")
    mj.add_argument("--damp-before-end", type=float, default=None, metavar="S",
                    help="ask the node for damping (its control endpoint, as `control-node mode damping`) S seconds "
                         "before the end")
    c = p.add_argument_group("continuous policies")
    c.add_argument("--model", metavar="PATH",
                   help="the node's model file: the gauss stream takes its width, and for a continuous policy "
                        "every frame carries the expected action (Policy.act, sent as `u_expected`), which each "
                        "answer is compared with")
    c.add_argument("--atol", type=float, default=1e-6,
                   help="an answer matches its expected action when |u - expected| <= ATOL * max(1, |expected|) "
                        "per component (default: %(default)s)")
    p.add_argument("--tap", nargs="?", const="auto", default=None, metavar="ENDPOINT",
                   help="also publish every frame on a bound PUB 'sensor tap' for `control-node record` "
                        "(default endpoint: [endpoints].sensor_tap, else <sensor>_tap)")
    p.add_argument("--state", nargs="?", const="auto", default=None, metavar="ENDPOINT",
                   help="pendulum: publish each physics step's state (angle, velocity, torque) on a bound PUB for "
                        "the live view's /sim/pendulum (default endpoint: <sensor>_sim_state)")
    p.add_argument("--run-dir", help="where to write summary.json and roundtrip.npz (default: runs/<id>/)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the node (default: %(default)s)")
    p.add_argument("--exit-code", type=int, default=None, help=argparse_suppress())
    return p


def _node_history(config, n_features: int) -> int:
    """``[policy] history`` of the node's config (1 without one), checked against the model's width."""
    from control_node.config import load_config, resolve_history
    cfg = load_config(config)
    resolve_history(cfg, n_features, config or "(config)")      # a history that does not divide: its error
    return int(cfg["policy"]["history"])


def node_policy(eps, config, timeout_s):
    """The node's ``policy`` map from its diagnostics stream (kind, n_features, n_actions, action_names),
    or None when none arrives within ``timeout_s``."""
    import time

    from control_node import monitor
    try:
        sub = monitor.Subscriber(eps["diagnostics"], curve=monitor.curve_for("diagnostics", config))
    except Exception:       # noqa: BLE001 - the stream's width then falls back to its default
        return None
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            frames = sub.recv(left)
            if frames is None:
                return None
            msg = monitor.decode(frames)
            if isinstance(msg, dict) and isinstance(msg.get("policy"), dict):
                return msg["policy"]
    finally:
        sub.close()


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
    if args.stream == "pendulum":
        return _pendulum(args, eps, client_curve_from_config_path(args.config))
    if args.stream == "mujoco":
        return _mujoco(args, eps, client_curve_from_config_path(args.config))
    if args.rate is None:
        args.rate = 1000.0
    policy = None
    if args.model:
        import os

        from control_node.kernels import Policy
        if not os.path.exists(args.model):
            raise UserError(f"--model {args.model} does not exist. Fix: pass the node's model file")
        policy = Policy.load(args.model)        # a bad file ends with its ModelFileError
    n_features = None
    if args.features == "auto":
        info = node_policy(eps, args.config, min(2.0, args.timeout))
        if not info:
            raise UserError(f"--features auto: no diagnostics from the node at {eps['diagnostics']} within "
                            f"{min(2.0, args.timeout):g} s. Fix: start the node first, or pass --features N / --model")
        hist = info.get("history") or {}
        frames = int(hist.get("frames") or 1)
        # with [policy] history = N the node stacks N frames into the policy's input: send one frame's width
        n_features = int(hist.get("frame_width") or info["n_features"])
        print(f"sim: the node's policy is {info.get('kind')} ({info['n_features']} features"
              + (f" = {frames} frames x {n_features}" if frames > 1 else "")
              + f", {info.get('n_actions')} actions)", flush=True)
    elif args.features is not None:
        try:
            n_features = int(args.features)
        except ValueError:
            raise UserError(f"--features {args.features!r}: use a number of features or auto") from None
        if n_features < 1:
            raise UserError(f"--features {n_features}: use 1 or more")
    elif policy is not None:
        n_features = policy.n_features // _node_history(args.config, policy.n_features)
    try:
        if args.stream == "gauss":
            duration = 5.0 if args.duration is None else args.duration
            st = streams.gauss_stream(int(duration * args.rate), rate_hz=args.rate, seed=args.seed,
                                      dwell_min=args.dwell[0], dwell_max=args.dwell[1], noise=args.noise,
                                      drift=args.drift, outlier_prob=args.outliers, drop_prob=args.drop,
                                      n_features=n_features)
        elif args.stream == "iris":
            n = None if args.duration is None else int(args.duration * args.rate)
            st = streams.iris_stream(n, rate_hz=args.rate, shuffle=args.shuffle, seed=args.seed)
        else:
            if not args.file:
                raise UserError("the replay stream needs a FILE: control-node sim replay FILE.mcap")
            rate = 1.0 if args.rate == 1000.0 else args.rate      # --rate given: a speed factor
            st = streams.replay_stream(args.file, rate=rate, duration=args.duration)
    except ValueError as e:
        raise UserError(str(e))
    if len(st) == 0:
        raise UserError("nothing to send (duration * rate is 0)")
    if policy is not None:
        history = _node_history(args.config, policy.n_features)
        if st.X.shape[1] * history != policy.n_features:
            raise UserError(f"the {st.settings['kind']} stream has {st.X.shape[1]} features but --model "
                            f"{args.model} takes {policy.n_features}"
                            + (f" ({history} frames of {policy.n_features // history})" if history > 1 else ""))
        if policy.continuous and history == 1:
            st.expected_u = policy.act_batch(st.X)       # NaN rows where the output is not finite
        elif policy.continuous:
            # the node's input is its own stack of the frames it accepted: not known here frame by frame
            print(f"sim: the node stacks {history} frames per input ([policy] history): actions are recorded, "
                  "not compared with --model", flush=True)
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
            except UserError as e:      # no answer: say why when the node's diagnostics tell (a wrong width)
                # 2 s, as --features auto waits: at diagnostics_hz 10 that is ~20 messages, past a slow join
                info = node_policy(eps, args.config, 2.0) if str(e).startswith("no answer") else None
                if info and info.get("n_features") not in (None, st.X.shape[1]):
                    raise UserError(f"{e}: the node's policy ({info.get('kind')}) takes {info['n_features']} "
                                    f"features and this stream sends {st.X.shape[1]}, so the node rejects every "
                                    f"frame (feature_count). Fix: --features {info['n_features']} (or auto), or "
                                    "--model THE_NODE'S_MODEL") from None
                raise
            except KeyboardInterrupt:
                print("sim: interrupted before the node answered", file=sys.stderr)
                return 130
    finally:
        loop.close()
    settings = dict(st.settings, lockstep=args.lockstep, tap=tap)
    if policy is not None:
        settings["model"] = {"path": str(args.model), "sha256": policy.sha256}
    summary = engine.summarize(res, loop, settings, role="sim", lockstep=args.lockstep, atol=args.atol)
    engine.write_run_dir(run_dir, summary, res)
    engine.print_summary(summary, run_dir)
    return 0


def _pendulum(args, eps, curve):
    import sys

    from control_node.errors import UserError
    from control_node.sim import engine
    from control_node.sim.pendulum_client import PendulumClient, summarize, write_run_dir
    if args.model:
        from control_node.kernels.model_file import load_model
        spec = load_model(args.model)
        if spec.layer_sizes[0] != 3 or spec.head != "continuous":
            raise UserError(f"--model {args.model} is not a pendulum policy (takes {spec.layer_sizes[0]} "
                            f"observations, {spec.head} head); the pendulum sends 3 and needs a torque")
    rate = 1000.0 if args.rate is None else args.rate
    if args.push is None:
        args.push = 2.0
    opts = dict(rate_hz=rate, physics_hz=args.physics_hz, delay_us=args.delay_us, drop=args.drop, noise=args.noise,
                push_every_s=args.push_every, push=args.push, seed=args.seed, handshake_timeout=args.timeout,
                lockstep=args.lockstep)
    if args.ros2:
        from control_node.sim.pendulum_ros2 import PendulumRos2
        client = PendulumRos2(**opts)
        where = f"ROS 2 {client.state_topic} -> {client.command_topic}"
    else:
        from control_node.endpoints import derive_sim_state
        tap = None if args.tap is None else (eps["sensor_tap"] if args.tap == "auto" else args.tap)
        state = None if args.state is None else (derive_sim_state(eps["sensor"]) if args.state == "auto"
                                                 else args.state)
        client = PendulumClient(eps, curve=curve, tap=tap, state=state, **opts)
        where = f"sensor={eps['sensor']} action={eps['action']}"
    duration = 10.0 if args.duration is None else args.duration
    run_dir = args.run_dir or engine.new_run_dir("sim")
    print(f"sim: pendulum, {duration:g} s, physics {args.physics_hz:g} Hz, observations {rate:g} Hz, "
          f"added delay {args.delay_us:g} us{', lockstep' if args.lockstep else ''}; {where}", flush=True)
    try:
        with engine.Stopper() as stopper:
            try:
                res = client.run(duration_s=duration, theta0=args.theta0, stopper=stopper)
            except KeyboardInterrupt:
                print("sim: interrupted before the node answered", file=sys.stderr)
                return 130
    finally:
        client.close()
    settings = {"kind": "pendulum", "transport": "ros2" if args.ros2 else "zmq", "rate_hz": rate, "physics_hz": args.physics_hz, "delay_us": args.delay_us,
                "drop": args.drop, "noise": args.noise, "theta0": args.theta0, "push_every_s": args.push_every,
                "push": args.push, "seed": args.seed, "duration_s": duration, "lockstep": args.lockstep}
    summary = summarize(res, settings)
    write_run_dir(run_dir, summary, res)
    rt = summary["round_trip_ns"]
    print(f"frames sent {summary['frames_sent']}, answered {summary['frames_answered']}, safe actions "
          f"{summary['safe_actions']}; round trip p50 {engine.fmt_ms(rt['p50'])} p99 {engine.fmt_ms(rt['p99'])}")
    print(summary["control"]["line"])
    print(f"run directory: {run_dir}", flush=True)
    return 0


def _mujoco(args, eps, curve):
    import os
    import sys

    from control_node.errors import UserError
    from control_node.sim import engine
    from control_node.sim.mujoco_client import LeggedSide, MujocoClient, build_robot, summarize, write_run_dir
    from control_node.sim.mujoco_robot import CommandSchedule
    if args.model or args.features:
        raise UserError("sim mujoco takes the node's config, not " + ("--model" if args.model else "--features")
                        + ": the frame layout and output come from its [legged] recipe. Fix: drop it and pass "
                        "--config NODE_CONFIG")
    if (args.command_topic or args.command_type) and not args.ros2:
        raise UserError("--command-topic / --command-type are the ROS 2 robot's (the ZeroMQ path reads the node's "
                        "action endpoint). Fix: add --ros2, or drop them")
    if args.ros2 and args.tap is not None:
        raise UserError("--tap re-publishes ZeroMQ frames, and with --ros2 the bridge makes the frames. Fix: drop "
                        "--tap (record the ROS 2 topics with `ros2 bag record`)")
    if args.file is not None and not os.path.isfile(args.file):
        raise UserError(f"model {args.file}: no such file. Fix: pass the path of an MJCF (.xml), or none for the "
                        "packaged quadruped")
    if args.delay_us < 0 or not 0 <= args.drop < 1:
        raise UserError("--delay-us must be >= 0 and --drop a probability in [0, 1)")
    side = LeggedSide(args.config)
    if args.cmd.strip() == "ros":
        if not args.ros2:
            raise UserError("--cmd ros takes the velocity command from a ROS 2 topic, and without --ros2 the frames "
                            "carry the schedule's. Fix: add --ros2, or give a schedule (TIME:VX[,VY][@YAW_RATE],...)")
        from control_node.sim.mujoco_ros2 import TwistCommand
        schedule = TwistCommand()
    else:
        schedule = CommandSchedule.parse(args.cmd)
    duration = 10.0 if args.duration is None else float(args.duration)
    dt_probe = args.dt
    robot = build_robot(args.file, side, dt=dt_probe, drop=args.drop, seed=args.seed, keyframe=args.keyframe)
    latency = int(round(args.delay_us * 1e-6 / robot.dt))
    robot.latency_steps = latency
    push = 0.3 if args.push is None else float(args.push)
    damp_at = None if args.damp_before_end is None else max(0.0, duration - float(args.damp_before_end))
    tap = None if args.tap is None else (eps["sensor_tap"] if args.tap == "auto" else args.tap)
    loop = dict(rate_hz=args.rate, schedule=schedule, push_every_s=args.push_every, push=push, seed=args.seed,
                lockstep=args.lockstep, pd_in_sim=args.pd_in_sim, timeout=args.timeout, damp_at_s=damp_at)
    if args.ros2:
        from control_node.sim.mujoco_ros2 import MujocoRos2, ros2_settings
        ros2 = ros2_settings(args.config, side, args.command_topic, args.command_type)
        client = MujocoRos2(side, robot, ros2, domain_id=_ros_domain(args.config), **loop)
    else:
        client = MujocoClient(eps, side, robot, curve=curve, tap=tap, control_endpoint=eps.get("control"), **loop)
    run_dir = args.run_dir or engine.new_run_dir("sim")
    pd = client.pd
    where = {"node": f"the node's PD at {pd['rate_hz']:g} Hz", "sim": f"PD here at physics rate {pd['rate_hz']:g} Hz "
             f"({pd['gains']} gains)", "actuator": "the MJCF's position actuators"}[pd["where"]]
    via = ""
    if args.ros2:
        via = (f"; ROS 2: {client.topics['joint_states']}, {client.topics['imu']}, {client.topics['command']} -> "
               f"commands {client.command_topic} ({client.command_type.rsplit('/', 1)[1]}"
               + (f" {client.field} by name" if client.field else "") + f"), mode from {client.topics['policy_active']}")
    print(f"sim: mujoco {robot.path}: {len(side.out_joints)} joints by name, {robot.kind} actuators, IMU site "
          f"{robot.imu_site}, physics {1 / robot.dt:g} Hz, frames {client.rate_hz:g} Hz, "
          f"{'lockstep' if args.lockstep else 'real time'}; node output {side.output}: {where}; command {schedule}"
          + (f"; added latency {latency} steps" if latency else "") + via, flush=True)
    try:
        with engine.Stopper() as stopper:
            try:
                res = client.run(duration, stopper=stopper)
            except KeyboardInterrupt:
                print("sim: interrupted before the node answered", file=sys.stderr)
                return 130
    finally:
        client.close()
    settings = {"kind": "mujoco", "model": robot.path, "dt": robot.dt, "rate_hz": client.rate_hz,
                "keyframe": args.keyframe, "cmd": str(schedule), "delay_us": args.delay_us,
                "latency_steps": latency, "drop": args.drop, "push_every_s": args.push_every, "push": push,
                "seed": args.seed, "duration_s": duration, "lockstep": args.lockstep, "pd_in_sim": args.pd_in_sim,
                "damp_before_end_s": args.damp_before_end, "tap": tap, "transport": client.transport}
    summary = summarize(res, client, settings)
    write_run_dir(run_dir, summary, res)
    rt = summary["round_trip_ns"]
    refused = ", ".join(f"{k} {v}" for k, v in (summary.get("commands_refused") or {}).items())
    print(f"frames sent {summary['frames_sent']}, answered {summary['frames_answered']}, commands applied "
          f"{summary['commands_applied']} (dropped {summary['commands_dropped']}"
          + (f"; refused {refused}" if refused else "") + "), torque clipped "
          f"{summary['torque_clipped']}, clock slips {summary['slips']['count']}; round trip p50 {engine.fmt_ms(rt['p50'])} p99 {engine.fmt_ms(rt['p99'])}")
    print(summary["control"]["line"])
    print(f"run directory: {run_dir}", flush=True)
    return 0


def _ros_domain(config):
    """ROS_DOMAIN_ID, else the config's [ros2] domain_id (as the bridge reads it), else None (rclpy's default)."""
    import os

    from control_node.config import read_toml
    if os.environ.get("ROS_DOMAIN_ID") not in (None, ""):
        return None                 # rclpy reads the environment itself
    dom = ((read_toml(config) if config else {}).get("ros2") or {}).get("domain_id")
    return dom if isinstance(dom, int) and not isinstance(dom, bool) else None
