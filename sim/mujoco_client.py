"""`control-node sim mujoco`: a MuJoCo robot (any MJCF with a floating base) on the wire, closed loop with a
legged node (a node config with a ``[legged]`` recipe).

What it reads from the node's config (``--config``): the endpoints, and from ``[legged]`` the robot's joint
names (``joints.robot``: the frame's joint order; ``joints.actuators``: the command's, default the same),
the quaternion order, the number of command values and the node's ``output``. The frame layout is the node's
own (``control_node.loop.legged.frame_layout``): joint_pos and joint_vel in joints.robot's order, imu_quat in
observation.quat_order, imu_gyro, imu_acc (body frame, from the model's IMU site), the velocity command.
Joints are matched to the MJCF's BY NAME; a joint the config names and the model lacks is refused, naming it.

Each control step (``rate_hz``, a whole number of physics steps) it sends one frame and applies the node's
newest command, by actuator joint name:

* ``torque``: motor torques (clipped to the motors' ctrlrange, counted);
* ``position``: targets of position actuators, or on motors a PD in the simulator at physics rate with the
  recipe's kp / kd (said at start);
* ``impedance``: a PD in the simulator at physics rate with the command's q*, qd*, kp, kd, tau_ff.

Real time: the physics is paced to wall time (frame k at t0 + k / rate_hz; held more than 5 ms, the simulated
clock slips by the delay rather than run the physics through it on an old command, counted in ``slips``). ``lockstep``: frame k waits for
the first command carrying its seq, which applies at once (``delay_us`` later in simulated time): the run is a
function of the frames and the node's answers, whatever the host's speed.

The walk is scored (``Score``) over the time the node is in policy mode (its commands are not ``safe``):
time upright, falls, distance, mean velocity against the command, tracking error, torque peak and RMS.

One loop (``MujocoSim.run``) serves every transport: ``MujocoClient`` here (ZeroMQ, the node's own protocol) and
``mujoco_ros2.MujocoRos2`` (the robot as a ROS 2 robot, beside ``control-node bridge ros2``).

A tool: never imported by the node.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from control_node import rundir
from control_node.errors import UserError
from control_node.sim.engine import client_sockets, close_client, percentiles, sleep_until, write_summary
from control_node.sim.mujoco_robot import CommandSchedule, Impedance, MujocoRobot, packaged_quadruped

#: real time: when this process runs more than this late (a host stall), the simulated clock slips by the delay
#: instead of running the physics through it with a command the node could not update (counted: "slips")
MAX_LAG_NS = 5_000_000


class LeggedSide:
    """What the simulator needs of a node config's ``[legged]`` section: the frame layout (the node's own
    definition), the joint names, the output kind and the recipe's PD gains (for position output on motors)."""

    def __init__(self, config):
        from control_node.config import load_config
        from control_node.deploy import NODE_KEYS
        from control_node.loop import legged as L
        cfg = load_config(config)
        raw = cfg.get("legged")
        src = config or "the packaged node.toml"
        if not raw:
            raise UserError(f"{src} has no [legged] section: `sim mujoco` drives a legged node (the frame layout, "
                            "joint names and output come from its recipe). Fix: --config a node config with "
                            "[legged], e.g. the packaged quadruped.toml (control-node launch --print-config "
                            "quadruped)")
        recipe = {k: v for k, v in raw.items() if k not in NODE_KEYS}
        try:
            self.obs_plan = L.build_obs_plan(recipe)
            self.act_plan = L.build_actuator_plan(recipe)
        except L.RecipeError as e:
            raise UserError(f"{src}: [legged] {e}") from None
        self.output = raw.get("output", "torque")
        if self.output not in L.OUTPUTS:
            raise UserError(f"{src}: legged.output is {self.output!r}. Fix: use one of {', '.join(L.OUTPUTS)}")
        self.start_mode = raw.get("start_mode", "passive")
        self.layout = L.frame_layout(self.obs_plan)
        self.width = sum(w for _, _, w in self.layout)
        self.robot_joints = list(recipe["joints"]["robot"])
        self.out_joints = list(self.act_plan.out_joints)
        self.quat_xyzw = self.obs_plan.quat_order == L.QUAT_ORDERS["xyzw"]
        self.quat_order = "xyzw" if self.quat_xyzw else "wxyz"
        self.n_cmd = int(self.obs_plan.n_cmd)
        self.rows = L.OUTPUT_ROWS[self.output]
        # the recipe's gains in the actuators' order (the plan keeps them in the policy's)
        kp, kd = self.act_plan.row("kp"), self.act_plan.row("kd")
        order = [list(self.act_plan.policy_joints).index(j) for j in self.out_joints]
        self.kp, self.kd = np.asarray(kp)[order], np.asarray(kd)[order]
        self.rate_hz = float(cfg["loop"]["rate_hz"])
        self.stale_after_ms = float(cfg["watchdog"]["stale_after_ms"])
        self.source = src


def build_robot(model, side: LeggedSide, *, dt=None, latency_steps=0, drop=0.0, seed=0, keyframe=None):
    """The MujocoRobot for ``model`` commanded in the node's actuator order, with every joint the config
    names matched by name (refused naming the joint and the fix), and the output checked against the
    model's actuators."""
    path = packaged_quadruped() if model is None else os.fspath(model)

    def refuse(names, what, have):
        missing = [j for j in names if j not in have]
        if missing:
            raise UserError(f"model {path} has no joint {missing[0]}"
                            + (f" (nor {', '.join(missing[1:])})" if len(missing) > 1 else "")
                            + f", which the node's [legged] {what} names ({side.source}); joints are met by name. "
                            f"Fix: rename the MJCF's joint to {missing[0]!r}, or set {what} to the model's joint "
                            f"names: {', '.join(have)}")
    have = _hinge_joints(path)          # None when MuJoCo cannot load it: MujocoRobot then says why
    if have is not None:
        refuse(side.robot_joints, "joints.robot", have)
        refuse(side.out_joints, "joints.actuators", have)
    robot = MujocoRobot(path, dt=dt, joints=side.out_joints, latency_steps=latency_steps, drop=drop, seed=seed)
    kinds = set(robot.actuator_kind.values())
    if len(kinds) > 1:
        pos = [j for j, k in robot.actuator_kind.items() if k == "position"]
        raise UserError(f"model {path} mixes motor and position actuators (position: {', '.join(pos)}): one output "
                        "kind drives them all. Fix: give every commanded joint the same kind of actuator")
    robot.kind = kinds.pop()
    if robot.kind == "position" and side.output in ("torque", "impedance"):
        raise UserError(f"model {path} has position actuators and the node's [legged] output is {side.output!r}: a "
                        "position servo cannot take a torque. Fix: set [legged] output = \"position\" in "
                        f"{side.source}, or use <motor joint=\"...\"/> actuators")
    if keyframe is not None:
        robot.reset(keyframe)
    robot._seq_order = [robot.joint_names.index(j) for j in side.robot_joints]
    return robot


def _hinge_joints(path):
    """The MJCF's hinge and slide joint names, or None when it does not load."""
    try:
        import mujoco
        m = mujoco.MjModel.from_xml_path(path)
    except (ImportError, ValueError):
        return None
    kinds = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
    return [mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(m.njnt) if int(m.jnt_type[j]) in kinds]


class MujocoSim:
    """The closed loop every transport shares: the control rate, the command schedule, pushes, the damping
    request, the physics steps per frame, the score and the result arrays (:meth:`run`). A transport (ZeroMQ:
    :class:`MujocoClient`; ROS 2: ``mujoco_ros2.MujocoRos2``) subclasses it and supplies:

    * ``_handshake(x0, stopper) -> (seq0, warm)``: until the node answers; warm = [(seq, t_ns, x)] sent meanwhile;
    * ``_flush()``: drop what arrived during the handshake;
    * ``_send(seq, x) -> t_ns``: one frame out;
    * ``_collect(wait_ms)``: yields each command that arrived (waiting up to ``wait_ms`` for the first) as a dict
      ``u`` (values in the actuators' order, or None), ``bad`` (None, or why the transport refused it: never
      applied), ``safe``, ``frame`` (the index of the frame it answers, or -1), ``seq`` (the id of the command
      in force once applied), ``t_ns`` (arrival); a generator left early keeps the rest for the next call;
    * ``_request_damping() -> (ok, message)``; ``close()``; ``where()`` (the start line's transport part).
    """

    transport = "?"

    def _setup(self, side: LeggedSide, robot: MujocoRobot, *, rate_hz=None, schedule=None, push_every_s=0.0,
               push=0.0, seed=0, lockstep=False, pd_in_sim=False, timeout=10.0, damp_at_s=None):
        self.side, self.robot = side, robot
        physics_hz = 1.0 / robot.dt
        rate = physics_hz if rate_hz is None else float(rate_hz)
        every = physics_hz / rate
        if rate <= 0 or every < 1 - 1e-9 or abs(every - round(every)) > 1e-6:
            raise UserError(f"--rate {rate:g}: a frame every {every:g} physics steps; the rate must be the physics "
                            f"rate {physics_hz:g} Hz divided by a whole number. Fix: --rate {physics_hz:g} (or "
                            f"{physics_hz / 2:g}, ...), or --dt {1 / rate:g} for a physics step per frame")
        self.rate_hz, self.every = rate, int(round(every))
        if pd_in_sim and side.output == "torque":
            raise UserError(f"--pd-in-sim: the node's [legged] output is \"torque\" (its PD runs at {side.rate_hz:g} "
                            f"Hz): nothing for the simulator's PD. Fix: set output = \"impedance\" in {side.source} "
                            "(the PD then runs here, every physics step), or drop --pd-in-sim")
        if lockstep and side.output == "position" and side.start_mode == "passive":
            raise UserError("--lockstep waits for a command per frame, and a position node sends none while "
                            f"passive. Fix: set [legged] start_mode = \"damping\" in {side.source}, or run in real "
                            "time (without --lockstep)")
        self.schedule = schedule or CommandSchedule([])
        self.push_every_s, self.push = float(push_every_s), float(push)
        self.rng = np.random.default_rng(seed + 1)
        self.lockstep, self.timeout = bool(lockstep), float(timeout)
        self.damp_at_s = damp_at_s
        if side.output == "impedance" or (side.output == "position" and robot.kind == "motor"):
            self.pd = {"where": "sim", "rate_hz": physics_hz,
                       "gains": "the command's" if side.output == "impedance" else "the recipe's kp, kd"}
        elif side.output == "position":
            self.pd = {"where": "actuator", "rate_hz": physics_hz, "gains": "the MJCF position actuators'"}
        else:
            self.pd = {"where": "node", "rate_hz": side.rate_hz, "gains": "the recipe's kp, kd"}
        self._slices = {name: slice(o, o + w) for name, o, w in side.layout}

    # -- the frame --------------------------------------------------------------------------------------
    def frame(self, cmd) -> np.ndarray:
        """The robot's raw signals in the node's frame layout (legged.frame_layout)."""
        r, s, x = self.robot, self._slices, np.empty(self.side.width)
        d = r.data
        x[s["joint_pos"]] = d.qpos[r._qadr_all[r._seq_order]]
        x[s["joint_vel"]] = d.qvel[r._vadr_all[r._seq_order]]
        sd = d.sensordata
        q = sd[r._quat_adr:r._quat_adr + 4]
        x[s["imu_quat"]] = (q[1], q[2], q[3], q[0]) if self.side.quat_xyzw else q
        x[s["imu_gyro"]] = sd[r._gyro_adr:r._gyro_adr + 3]
        x[s["imu_acc"]] = sd[r._acc_adr:r._acc_adr + 3] if r._acc_adr is not None else (0.0, 0.0, 0.0)
        n = self.side.n_cmd
        if n:
            c = np.zeros(n)
            c[:min(n, 3)] = np.asarray(cmd, dtype=np.float64)[:min(n, 3)]
            x[s["command"]] = c
        return x

    # -- the command ------------------------------------------------------------------------------------
    def command(self, u):
        """The node's published command (rows of n_out values in the actuators' order) as a MujocoRobot
        command, or None when it is not one (a wrong width)."""
        n = len(self.side.out_joints)
        u = np.asarray(u, dtype=np.float64)
        if u.shape != (self.side.rows * n,):
            return None
        if self.side.output == "torque":
            return u
        if self.side.output == "position":
            return u if self.robot.kind == "position" else Impedance(q=u, kp=self.side.kp, kd=self.side.kd)
        q, qd, kp, kd, ff = u.reshape(5, n)
        return Impedance(q=q, qd=qd, kp=kp, kd=kd, tau_ff=ff)

    def _flush(self):
        pass

    def _after_frame(self, f):
        """Called after frame ``f``'s physics steps (a transport that publishes more, e.g. a ROS clock)."""

    def run(self, duration_s=10.0, stopper=None):
        """Closed loop for ``duration_s`` seconds of simulated time; returns arrays and counters."""
        r = self.robot
        n_frames = int(round(duration_s * self.rate_hz))
        period_ns = int(round(1e9 / self.rate_hz))
        x0 = self.frame(self.schedule(0.0))
        seq0, warm = self._handshake(x0, stopper)
        self._seq0 = seq0
        self._flush()
        width = self.side.width
        pub_w = self.side.rows * len(self.side.out_joints)
        X = np.zeros((n_frames, width))
        t_send = np.full(n_frames, -1, dtype=np.int64)
        t_ans = np.full(n_frames, -1, dtype=np.int64)
        U = np.full((n_frames, pub_w), np.nan)
        safe_ans = np.zeros(n_frames, dtype=bool)
        applied_seq = np.full(n_frames, -1, dtype=np.int64)        # the seq of the command in force per frame
        tr_pos = np.zeros((n_frames, 3))
        tr_vel = np.zeros((n_frames, 3))
        tr_tau = np.zeros((n_frames, len(self.side.out_joints)))
        tr_policy = np.zeros(n_frames, dtype=bool)
        score = r.score()
        counters = dict(actions=0, safe_actions=0, bad_width=0, policy_steps=0)
        state = {"in_policy": False, "cmd_seq": -1}
        pushes, damping, slips = [], None, []
        push_every = int(round(self.push_every_s * self.rate_hz)) if self.push_every_s > 0 else 0
        collect, lockstep = self._collect, self.lockstep

        def record(a):
            """Count a command from the node; the first answering a frame is that frame's answer (a refused one
            too: the frame was answered, with something not applied)."""
            counters["actions"] += 1
            u = a["u"]
            if u is None and a.get("bad") is None:
                return False
            safe = bool(a["safe"])
            counters["safe_actions"] += safe
            s = a["frame"]
            if 0 <= s < n_frames and t_ans[s] < 0:
                t_ans[s], safe_ans[s] = a["t_ns"], safe
                if u is not None and len(u) == pub_w:
                    U[s] = u
                return True
            return False

        def apply(a):
            if a["u"] is None:
                return                  # refused by the transport, counted there by reason
            c = self.command(a["u"])
            if c is None:
                counters["bad_width"] += 1
                return
            r.apply(c)
            state["cmd_seq"] = a["seq"]
            state["in_policy"] = not a["safe"]

        def drain(wait_ms, f_now):
            """Real time: every command that arrived is counted, the newest applies. Lockstep: only the frame's
            answer applies (the first command answering it), not the node's later repeats of it."""
            newest = None
            for a in collect(wait_ms):
                first = record(a)
                if a["u"] is None and a.get("bad") is None:
                    continue
                if lockstep:
                    if first and a["frame"] == f_now:
                        apply(a)
                        return
                else:
                    newest = a
            if newest is not None:
                apply(newest)

        t0 = time.monotonic_ns() + 2_000_000
        sim_t0 = r.time
        n_done = 0
        for f in range(n_frames):
            if stopper is not None and stopper.stop:
                break
            if not lockstep:
                late = time.monotonic_ns() - (t0 + f * period_ns)
                if late > MAX_LAG_NS:
                    # this process was held (a host stall): the physics does not run the missed time with a
                    # command it cannot update; the simulated clock slips instead, counted
                    t0 += late
                    slips.append(late)
                sleep_until(t0 + f * period_ns)
                drain(0, f)
            t_sim = r.time - sim_t0
            cmd = self.schedule(t_sim)
            if push_every and f and f % push_every == 0:
                ang = float(self.rng.uniform(0, 2 * math.pi))
                dv = (self.push * math.cos(ang), self.push * math.sin(ang), 0.0)
                r.push(dv=dv)
                pushes.append({"t_s": t_sim, "dv": list(dv)})
            if damping is None and self.damp_at_s is not None and t_sim >= self.damp_at_s:
                ok, msg = self._request_damping()
                damping = {"t_s": t_sim, "ok": ok, "message": msg}
                if lockstep:
                    drain(0, -1)        # what the mode change made the node send: counted, answers no frame
            x = self.frame(cmd)
            X[f] = x
            t_send[f] = self._send(seq0 + f, x)
            if lockstep:
                deadline = time.monotonic() + self.timeout
                while t_ans[f] < 0:
                    if stopper is not None and stopper.stop:
                        break
                    if time.monotonic() > deadline:
                        raise UserError(f"lockstep: no command answered frame {seq0 + f} within {self.timeout:g} s "
                                        f"({self.where()}); did the node stop? (--timeout sets the wait)")
                    drain(20, f)
            applied_seq[f] = state["cmd_seq"]
            scoring = state["in_policy"]
            for _ in range(self.every):
                r.step()
                if scoring:
                    score.update_from(r, cmd)
            counters["policy_steps"] += self.every if scoring else 0
            tr_pos[f], tr_vel[f], tr_tau[f], tr_policy[f] = r.base_pos, r.base_lin_vel_body(), r.torque, scoring
            self._after_frame(f)
            n_done = f + 1
        n = n_done
        sent = t_send[:n] >= 0
        answered = sent & (t_ans[:n] >= 0)
        return {"n": n, "seq": np.arange(n, dtype=np.int64) + seq0, "x": X[:n], "t_send_ns": t_send[:n],
                "t_action_ns": t_ans[:n], "u": U[:n], "safe": safe_ans[:n], "applied_seq": applied_seq[:n],
                "rtt_ns": np.where(answered, t_ans[:n] - t_send[:n], -1), "warmup": warm, "seq_base": seq0,
                "frames_sent": int(sent.sum()), "frames_answered": int(answered.sum()),
                "base_pos": tr_pos[:n], "lin_vel_body": tr_vel[:n], "torque": tr_tau[:n], "in_policy": tr_policy[:n],
                "score": score.summary(), "policy_s": counters["policy_steps"] * r.dt, "pushes": pushes,
                "damping": damping, "counters": counters, "clipped": r.clipped,
                "commands_applied": r.commands_applied, "commands_dropped": r.commands_dropped, "t0_ns": t0,
                "slips": {"count": len(slips), "total_ms": sum(slips) / 1e6, "max_ms": max(slips, default=0) / 1e6}}


class MujocoClient(MujocoSim):
    """The ZeroMQ transport: a PUB to the node's sensor endpoint (an XPUB: the node's subscription is seen before
    the first frame) and a SUB to its commands, driving a :class:`MujocoRobot`."""

    transport = "zmq"

    def __init__(self, endpoints, side: LeggedSide, robot: MujocoRobot, *, curve=None, rate_hz=None,
                 schedule=None, push_every_s=0.0, push=0.0, seed=0, lockstep=False, pd_in_sim=False,
                 timeout=10.0, tap=None, damp_at_s=None, control_endpoint=None):
        import zmq

        self._setup(side, robot, rate_hz=rate_hz, schedule=schedule, push_every_s=push_every_s, push=push,
                    seed=seed, lockstep=lockstep, pd_in_sim=pd_in_sim, timeout=timeout, damp_at_s=damp_at_s)
        self.zmq = zmq
        self.endpoints = endpoints
        self.control_endpoint, self.curve = control_endpoint, curve
        ctx = zmq.Context.instance()
        self.pub, self.sub = client_sockets(ctx, endpoints, curve, xpub=True)
        self.tap, self.bound = None, []
        if tap:
            from control_node.endpoints import ensure_ipc_dir
            ensure_ipc_dir(tap)
            self.tap = ctx.socket(zmq.PUB)
            self.tap.setsockopt(zmq.LINGER, 0)
            try:
                self.tap.bind(tap)
            except zmq.ZMQError as e:
                raise UserError(f"cannot bind the sensor tap {tap}: {e}") from None
            self.bound.append(tap)

    def where(self):
        return f"sensor {self.endpoints['sensor']}, action {self.endpoints['action']}"

    def close(self):
        close_client((self.pub, self.sub, self.tap), self.bound)

    def _handshake(self, x0, stopper):
        """The node's subscription seen on the XPUB (no frame is lost to the slow joiner); then, when the node
        publishes in its start mode, warm-up frames every 20 ms until a command carries one of their seqs (our
        SUB is connected). Returns (next seq, warm-up frames [(seq, t_ns, x)])."""
        import msgpack
        zmq = self.zmq
        deadline = time.monotonic() + self.timeout
        while not self.pub.poll(20):
            if stopper is not None and stopper.stop:
                raise KeyboardInterrupt
            if time.monotonic() > deadline:
                raise UserError(f"no node subscribed at {self.endpoints['sensor']} within {self.timeout:g} s; is it "
                                "running? (start `control-node run --config SAME_CONFIG` first)")
        while self.pub.poll(0):
            self.pub.recv()
        warm = []
        if self.side.output == "position" and self.side.start_mode == "passive":
            return 0, warm              # such a node sends nothing until its stand: nothing to wait for
        seq = 0
        while time.monotonic() < deadline:
            if stopper is not None and stopper.stop:
                raise KeyboardInterrupt
            t = time.monotonic_ns()
            self.pub.send(msgpack.packb({"seq": seq, "t_ns": t, "x": x0.astype("<f8").tobytes(), "warmup": True}))
            warm.append((seq, t, x0.copy()))
            seq += 1
            t_end = time.monotonic() + 0.02
            while time.monotonic() < t_end:
                if not self.sub.poll(5):
                    continue
                a = msgpack.unpackb(self.sub.recv(zmq.NOBLOCK))
                if 0 <= a.get("seq", -1) < seq:
                    if "u" not in a:
                        raise UserError("the node answers with a class index, not a command vector: it runs no "
                                        "[legged] recipe. Fix: start it with the same --config")
                    return seq, warm
        raise UserError(f"no command from a node within {self.timeout:g} s (sensor {self.endpoints['sensor']}, "
                        f"action {self.endpoints['action']}); is it running with the same --config?")

    def _flush(self):
        while self.sub.poll(0):
            self.sub.recv()

    def _send(self, seq, x):
        import msgpack
        t = time.monotonic_ns()
        raw = msgpack.packb({"seq": seq, "t_ns": t, "x": x.astype("<f8").tobytes()})
        self.pub.send(raw)
        if self.tap is not None:
            self.tap.send(raw, self.zmq.NOBLOCK)
        return t

    def _collect(self, wait_ms):
        import msgpack
        zmq, seq0 = self.zmq, self._seq0
        while self.sub.poll(wait_ms):
            wait_ms = 0
            try:
                a = msgpack.unpackb(self.sub.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            seq = a.get("seq", -1)
            yield {"u": a.get("u"), "bad": None, "safe": bool(a.get("safe")), "frame": seq - seq0, "seq": seq,
                   "t_ns": time.monotonic_ns()}

    def _request_damping(self):
        from control_node.lifecycle import PolicyClient
        try:
            with PolicyClient(self.control_endpoint, self.curve, timeout=2.0) as client:
                reply = client.request({"op": "mode", "mode": "damping"})
            return bool(reply.get("ok")), reply.get("message", "")
        except Exception as e:       # noqa: BLE001 - the run goes on; the summary says it failed
            return False, str(e)


def walk_line(sc: dict, policy_s: float) -> str:
    """``walked X m at Y m/s (command Z m/s), falls N, tracking error ...``"""
    if policy_s <= 0:
        return "never walked: the node did not enter policy mode (its commands stayed safe)"
    v, c, e = sc["mean_velocity"], sc["mean_command"], sc["tracking_rms"]
    turn = (f", yaw {v['yaw_rate']:.2f} rad/s (command {c['yaw_rate']:.2f})" if abs(c["yaw_rate"]) > 1e-9 or
            abs(v["yaw_rate"]) > 0.2 else "")
    return (f"walked {sc['distance_m']:.2f} m at {v['vx']:.3f} m/s (command {c['vx']:.2f} m/s){turn}, falls "
            f"{sc['falls']}, tracking error rms vx {e['vx']:.3f} vy {e['vy']:.3f} m/s yaw {e['yaw_rate']:.3f} rad/s, "
            f"torque peak {sc['torque_peak_nm'] or 0:.1f} rms {sc['torque_rms_nm'] or 0:.1f} N m, "
            f"{policy_s:.1f} s in policy")


def summarize(res, client: MujocoSim, settings: dict) -> dict:
    """summary.json of a MuJoCo run (role "sim", task "mujoco")."""
    sc, r, side = res["score"], client.robot, client.side
    rtt = res["rtt_ns"][res["rtt_ns"] >= 0]
    line = walk_line(sc, res["policy_s"])
    out = {
        "role": "sim", "task": "mujoco", "transport": client.transport, "format": rundir.SUMMARY_FORMAT,
        "frames_sent": res["frames_sent"], "frames_answered": res["frames_answered"],
        "actions_received": res["counters"]["actions"], "safe_actions": res["counters"]["safe_actions"],
        "actions_lost": int(res["frames_sent"] - res["frames_answered"]), "accuracy": None,
        "commands_applied": res["commands_applied"], "commands_dropped": res["commands_dropped"],
        "commands_bad_width": res["counters"]["bad_width"], "torque_clipped": res["clipped"],
        "round_trip_ns": percentiles(rtt), "seq_base": res["seq_base"], "lockstep": client.lockstep,
        "robot": {"model": r.path, "dt_s": r.dt, "rate_hz": client.rate_hz, "imu_site": r.imu_site,
                  "actuators": r.kind, "joints": {"frame": side.robot_joints, "commands": side.out_joints},
                  "actuator_names": r.actuator_names},
        "node": {"output": side.output, "start_mode": side.start_mode, "quat_order": side.quat_order,
                 "n_commands": side.n_cmd, "frame_width": side.width, "config": side.source},
        "pd": client.pd, "pushes": res["pushes"], "slips": res["slips"], "damping_request": res["damping"],
        "score": sc, "policy_s": res["policy_s"],
        "control": {"line": line, "falls": sc["falls"], "distance_m": sc["distance_m"],
                    "mean_vx": sc["mean_velocity"]["vx"], "command_vx": sc["mean_command"]["vx"],
                    "t0_ns": int(res["t0_ns"])},
        "stream": settings,
    }
    if client.transport == "ros2":
        ros = client.ros2_summary(int(res["t0_ns"]))
        out["ros2"] = ros
        out["commands_refused"] = ros["commands_refused"]
        out["commands_bad_width"] += ros["commands_refused"].get("wrong_width", 0)
    return out


def write_run_dir(run_dir, summary, res):
    """summary.json; frames.npz (every frame sent: seq, t_send_ns, x, warmup; the node's record replays on
    it), commands.npz (per frame: its answer u, safe, t_action_ns, rtt_ns, the seq of the command in force),
    trace.npz (per frame after its physics steps: base position, body-frame velocity, joint torques, policy)."""
    write_summary(run_dir, summary)
    w = res["warmup"]
    seq = np.concatenate([np.array([s for s, _, _ in w], dtype=np.int64), res["seq"]])
    x = np.concatenate([np.array([v for _, _, v in w]).reshape(len(w), res["x"].shape[1]), res["x"]])
    t = np.concatenate([np.array([t for _, t, _ in w], dtype=np.int64), res["t_send_ns"]])
    np.savez(os.path.join(run_dir, "frames.npz"), seq=seq, x=x, t_send_ns=t,
             warmup=np.arange(len(seq)) < len(w))
    np.savez(os.path.join(run_dir, "commands.npz"), seq=res["seq"], u=res["u"], safe=res["safe"],
             t_action_ns=res["t_action_ns"], rtt_ns=res["rtt_ns"], applied_seq=res["applied_seq"])
    np.savez(os.path.join(run_dir, "trace.npz"), base_pos=res["base_pos"], lin_vel_body=res["lin_vel_body"],
             torque=res["torque"], in_policy=res["in_policy"])
