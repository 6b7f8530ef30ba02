"""control-node deploy-config MODEL: print the node config a model file's deploy contract implies.

A verb of its own rather than ``import --print-config``: it reads any model file that carries a contract (one
imported earlier, one shipped with a robot, one a colleague sent), needs no exporter file and no re-import (no
proof run, no onnxruntime), and can be run again for another robot (``--robot-joints`` / ``--mjcf``) or output.
"""

DESCRIPTION = """\
Print a node config ([loop], [watchdog] and [legged], TOML) for MODEL's deploy contract (the one
`control-node import` keeps in the model file), to edit rather than write. Every value says where it comes
from: "contract" (the model file: the training values; the node takes them from the model, so they are
printed as comments unless --inline) or "CHECK" (the robot's side: joint names and order, effort limits,
quaternion order, rates, modes: check each for your robot).

The robot's joints: --robot-joints NAMES (comma-separated, in the order the robot's frames send joint_pos and
joint_vel), or --mjcf FILE (its hinge / slide joints in order; its actuators' order when that differs, their
force limits as tau_max); default: the policy's own joint names and order (deploy.yaml: sdk_0, sdk_1, ... in
motor order)."""


def register(sub):
    import argparse
    p = sub.add_parser("deploy-config", help="print the node config ([loop], [legged]) a model's deploy contract "
                                             "implies", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="model file (.npz) with a deploy contract (control-node import)")
    robot = p.add_mutually_exclusive_group()
    robot.add_argument("--robot-joints", metavar="NAMES",
                       help="the robot's joint names, comma-separated, in its frames' order")
    robot.add_argument("--mjcf", metavar="FILE", help="read the robot's joints, actuators and force limits from "
                                                      "a MuJoCo MJCF file")
    p.add_argument("--output", choices=["torque", "position", "impedance"], default="torque",
                   help="what the node publishes: torque (the node runs the PD at loop rate), position (the "
                        "drives run it), impedance (q*, qd*, kp, kd, tau_ff) (default: %(default)s)")
    p.add_argument("--rate", type=float, default=1000.0, metavar="HZ",
                   help="loop rate: the PD / publish rate (default: %(default)s)")
    p.add_argument("--inline", action="store_true",
                   help="write the contract's values as keys too (the node checks they equal the model's)")
    p.add_argument("--out", metavar="FILE", help="write the config to FILE instead of printing it")
    return p


def run(args):
    from control_node.errors import UserError
    from control_node.kernels import load_model
    import os
    if os.path.splitext(args.model)[1].lower() != ".npz":
        raise UserError(f"{args.model}: deploy-config reads a model file (.npz); import the policy first: "
                        f"control-node import {args.model}")
    spec = load_model(args.model)
    if not spec.deploy:
        raise UserError(f"{args.model}: the model file carries no deploy contract (field deploy). Fix: import the "
                        "policy with its exporter's metadata (mjlab metadata_props or unitree_rl_lab deploy.yaml: "
                        "control-node import FILE [--deploy-yaml deploy.yaml]), or write [legged] by hand "
                        "(control_node/loop/legged.py)")
    robot = _robot(args, spec.deploy)
    text = render(spec, args.model, robot, output=args.output, rate=args.rate, inline=args.inline)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def _robot(args, contract):
    """{"joints": robot order, "actuators": output order or None, "tau_max": {name: N m} , "range": {name: (lo,
    hi)}, "from": what named them}."""
    from control_node.errors import UserError
    policy = contract["recipe"]["joints"]["policy"]
    if args.robot_joints:
        names = [n.strip() for n in args.robot_joints.split(",") if n.strip()]
        robot = {"joints": names, "actuators": None, "tau_max": {}, "range": {}, "from": "--robot-joints"}
    elif args.mjcf:
        robot = read_mjcf(args.mjcf)
    else:
        names = contract.get("info", {}).get("sdk_joints") if all(
            n.startswith("sdk_") for n in policy) else None
        robot = {"joints": names or list(policy), "actuators": None, "tau_max": {}, "range": {},
                 "from": "the SDK's motor order (deploy.yaml)" if names else "the policy's joint order"}
    if len(set(robot["joints"])) != len(robot["joints"]):
        raise UserError(f"{robot['from']}: a joint is named twice ({robot['joints']})")
    missing = [n for n in policy if n not in robot["joints"]]
    if missing:
        raise UserError(f"{robot['from']}: the robot has no joint {missing[0]!r} of the policy's "
                        f"({len(missing)} missing of {len(policy)}: {', '.join(missing[:4])}). Fix: name the robot's "
                        "joints as the policy does (the contract's joints.policy), in the robot's order")
    return robot


def read_mjcf(path):
    """The hinge / slide joints of an MJCF file in order, its actuators' joints in order, and per joint the force
    limit (actuator forcerange, else a motor's ctrlrange x gear, else the joint's actuatorfrcrange) and range."""
    import xml.etree.ElementTree as ET

    from control_node.errors import UserError
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise UserError(f"--mjcf {path}: not a readable MJCF file ({e})") from None
    joints, tau, rng = [], {}, {}

    def pair(text):
        try:
            lo, hi = (float(x) for x in text.split())
            return lo, hi
        except (ValueError, AttributeError):
            return None
    wb = root.find("worldbody")
    for j in (wb.iter("joint") if wb is not None else []):
        if j.get("type", "hinge") not in ("hinge", "slide") or not j.get("name"):
            continue
        joints.append(j.get("name"))
        if j.get("range") and pair(j.get("range")):
            rng[j.get("name")] = pair(j.get("range"))
        if j.get("actuatorfrcrange") and pair(j.get("actuatorfrcrange")):
            tau[j.get("name")] = max(abs(x) for x in pair(j.get("actuatorfrcrange")))
    acts = []
    act = root.find("actuator")
    for a in (list(act) if act is not None else []):
        name = a.get("joint")
        if not name:
            continue
        acts.append(name)
        fr, cr = pair(a.get("forcerange") or ""), pair(a.get("ctrlrange") or "")
        gear = float((a.get("gear") or "1").split()[0])
        if fr:
            tau[name] = max(abs(x) for x in fr)
        elif a.tag == "motor" and cr:
            tau[name] = max(abs(x) for x in cr) * abs(gear)
    if not joints:
        raise UserError(f"--mjcf {path}: no named hinge or slide joint in its worldbody")
    return {"joints": joints, "actuators": acts if acts and acts != joints else None, "tau_max": tau,
            "range": rng, "from": f"--mjcf {path}"}


def _v(x):
    """A TOML value (config.toml_value: one TOML writer; imported here, verbs load cheaply)."""
    from control_node.config import toml_value
    return toml_value(x)


def render(spec, model_path, robot, *, output="torque", rate=1000.0, inline=False) -> str:
    """The node config's TOML for ``spec``'s contract and ``robot`` (see :func:`_robot`)."""
    from control_node.errors import UserError
    c = spec.deploy
    r, src, info = c["recipe"], c.get("from", {}), c.get("info", {})
    keys = src.get("keys", {})
    policy = r["joints"]["policy"]
    L = []

    def origin(dotted):
        return f"contract <- {keys.get(dotted, src.get('exporter', 'the import'))}"

    def contract_line(key, value, dotted):
        line = f"{key} = {_v(value)}"
        return (line if inline else "# " + line) + f"    # {origin(dotted)}"
    dt = r.get("policy_dt")
    prate = 1.0 / dt if dt else 50.0
    if abs(rate / prate - round(rate / prate)) > 1e-9 or round(rate / prate) < 1:
        raise UserError(f"--rate {rate:g}: the policy runs at {prate:g} Hz (policy_dt {dt} s), which must divide "
                        "the loop rate. Fix: pass --rate as a multiple of it")
    L += [f"# Node config for {model_path} (sha256 {spec.sha256[:16]}), from its deploy contract:",
          f"#   {src.get('exporter', '?')}, {src.get('file', '?')}",
          "# 'contract' = a training value kept in the model file. The node takes it from the model: keep it out of",
          "#   [legged] (a value given here must equal the model's, or the node refuses to start naming both).",
          "# 'CHECK' = the robot's side: set it for your robot before running it.",
          *(f"# note: {n}" for n in src.get("notes", [])), "",
          "[loop]",
          f"rate_hz = {rate!r}    # CHECK: the PD / publish rate; the actuator's period is 1 / rate_hz",
          f"policy_rate_hz = {prate!r}    # " + (f"contract: 1 / policy_dt ({dt} s) <- {keys.get('policy_dt')}"
                                              if dt else "CHECK: the contract has no policy_dt; 50 Hz assumed"),
          "", "[watchdog]",
          "stale_after_ms = 50.0    # CHECK: no robot frame for this long -> damping (modes.on_stale); it must be",
          "                         #   longer than the PD's own frame-age limit (actuator.pd_max_age, 5 ms)",
          "", "[legged]",
          f"output = {_v(output)}    # CHECK: torque (the node runs the PD), position (the drives do), impedance",
          "start_mode = \"passive\"    # then: control-node mode stand, control-node mode policy",
          "# sequence = [[1.0, \"stand\"], [4.0, \"policy\"]]    # or modes at times from the start",
          contract_line("default_pos", r["default_pos"], "default_pos") if "default_pos" in r else
          "default_pos = 0.0    # CHECK: the contract has no default pose (policy joint order)"]
    if dt:
        L.append(contract_line("policy_dt", dt, "policy_dt"))
    L += ["", "[legged.joints]", contract_line("policy", policy, "joints.policy"),
          f"robot = {_v(robot['joints'])}    # CHECK: the robot's joints in the order its frames send joint_pos / "
          f"joint_vel (from {robot['from']}); matched to the policy's by name"]
    if robot.get("actuators"):
        L.append(f"actuators = {_v(robot['actuators'])}    # CHECK: the output (actuator) order, from {robot['from']}")
    ob = r.get("observation", {})
    L += ["", "[legged.observation]",
          f"quat_order = {_v(info.get('quat_order', 'wxyz'))}    # CHECK: the order the robot's IMU quaternion "
          "arrives in: wxyz (MuJoCo, Unitree) or xyzw (ROS sensor_msgs/Imu)"]
    for k in ("n_commands", "clip_stage", "first_tick"):
        if k in ob:
            L.append(contract_line(k, ob[k], f"observation.{k}"))
    if "history" in ob:
        L.append(contract_line("history", ob["history"], "observation.history"))
    if "terms" in ob:
        terms = ob["terms"]
        head = "terms = [" if inline else "# terms = ["
        L.append(f"{head}    # {origin('observation.terms')}: in this order")
        for t in terms:
            L.append(("" if inline else "# ") + f"  {_v(t)},")
        L.append("]" if inline else "# ]")
    else:
        L.append("# CHECK: the contract has no observation terms: list them (terms = [...])")
    act = r.get("action", {})
    L += ["", "[legged.action]"]
    if "scale" in act:
        L.append(contract_line("scale", act["scale"], "action.scale"))
    else:
        L.append("scale = 1.0    # CHECK: the contract has no action scale: q* = default_pos + scale * a")
    if "clip_to_limits" in act:
        L.append(contract_line("clip_to_limits", act["clip_to_limits"], "action.clip_to_limits"))
    else:
        L.append("# clip_to_limits = true    # opt-in: clip q* to actuator.q_lo / q_hi (changes the trained loop)")
    at = r.get("actuator", {})
    L += ["", "[legged.actuator]"]
    for k in ("kp", "kd"):
        L.append(contract_line(k, at[k], f"actuator.{k}") if k in at else
                 f"{k} = 0.0    # CHECK: the contract has no {k}: give the training {k} per joint (policy order)")
    tau = [robot["tau_max"].get(n) for n in policy]
    if all(t is not None for t in tau):
        L.append(f"tau_max = {_v([float(t) for t in tau])}    # CHECK: effort limits per policy joint, from "
                 f"{robot['from']}")
    elif info.get("effort_limit"):
        L.append(f"tau_max = {_v([float(t) for t in info['effort_limit']])}    # CHECK: the exporter's effort limits "
                 "(training); set your motors'")
    else:
        L.append("tau_max = 0.0    # CHECK: your motors' effort limits per joint (policy order); 0 = no torque at "
                 "all until you set them")
    for k in ("q_lo", "q_hi"):
        if k in at:
            L.append(contract_line(k, at[k], f"actuator.{k}"))
    if "q_lo" not in at and all(n in robot["range"] for n in policy):
        lo = [robot["range"][n][0] for n in policy]
        hi = [robot["range"][n][1] for n in policy]
        L += [f"# q_lo = {_v(lo)}    # CHECK: joint ranges from {robot['from']} (used by action.clip_to_limits)",
              f"# q_hi = {_v(hi)}"]
    L += ["# rate_limit = 10.0    # opt-in (rad/s): limits how fast q* moves; counted when it acts",
          "# velocity_limit = 30.0    # opt-in (rad/s): a joint faster than this -> damping",
          "", "[legged.modes]",
          "stand_time = 2.0    # CHECK: seconds of the ramp from the measured pose to default_pos",
          "stand_tolerance = 0.1    # CHECK: rad; within it of default_pos the stand is done at once",
          "# stand_kp / stand_kd / damping_kd: default to the contract's kp / kd (per joint)",
          "policy_without_stand = false    # the node refuses policy until a stand has completed",
          "on_stale = \"damping\"    # CHECK: damping (default) or hold when the robot's frames stop"]
    return "\n".join(L) + "\n"
