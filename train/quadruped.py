"""A velocity-tracking walking policy for the packaged quadruped (sim/models/quadruped.xml), made here.

Run: ``python -m control_node.train.quadruped [--out train/quadruped_policy.onnx] [--minutes 45] [--seed 0]``
(about 6 minutes on 2 cores; deterministic for a seed). ``evaluate(policy, seconds, command_schedule)`` scores
an .onnx file or a callable closed loop in MuJoCo and returns ``Score.summary()``.

Method: DAgger distillation of a gait controller, not PPO. On this 2-core machine PPO from scratch would need
tens of millions of physics steps (hours here, the 45-minute budget is not reliably enough); a hand-built
expert already walks, so imitation needs only the states the student visits, labelled by the expert.

* The expert (:class:`Expert`) is a trot: diagonal pairs (FL+RR, FR+RL), period 0.5 s (2 Hz), stance half of
  it. Each foot's stride comes from the command's velocity at that foot (v + w x r), swept back in stance and
  carried forward in swing (over its landing point by 80 % of the swing, then straight down, lifted 6 cm).
  Joint targets come from leg inverse kinematics with the chain read from the model (hip position on the trunk,
  the thigh's lateral offset, thigh and calf lengths, the foot sphere: :class:`LegGeometry`). The targets are
  tracked by a joint PD (kp 50, kd 1.5) at physics rate. Three corrections make this open loop walk: the feet
  are centred under the centre of mass (the legs hang behind their hips); the stance legs aim past the pose by
  the PD's sag under half the weight (tau = -J^T F, q* += tau / kp); foot heights follow the projected gravity
  (attitude feedback). The stride is calibrated against the speed it gives (``step_gain``, ``vx_bias``,
  ``yaw_gain``). It sees only what the policy observes (clock, command, projected gravity), so an MLP can
  represent it exactly.
* DAgger: round 0 the expert walks; later rounds the student walks, the expert acting on a fraction
  0.5^round of the ticks; every state is labelled by the expert, the data aggregated and the student refit
  (MSE on the raw action). Collection adds uniform observation noise (gyro 0.2 rad/s, gravity 0.03, q 0.01
  rad, q̇ 1.5 rad/s), random pushes (0.1-0.5 m/s, every 2-5 s), command changes every 2-5 s (vx -0.3..0.6,
  vy -0.2..0.2, yaw rate -0.8..0.8, sometimes zero), and starts from a perturbed "home" held by the stand gains.

Observation (47 values, float32, in this order, no scales: the graph normalises with the training mean/std):
  base_ang_vel (3)       the IMU gyro, body frame, rad/s
  projected_gravity (3)  R(q)^T [0, 0, -1] with q the IMU quaternion in (w, x, y, z) order
  velocity_commands (3)  (vx m/s, vy m/s, yaw rate rad/s), body frame
  joint_pos_rel (12)     q - default_joint_pos, joints in JOINT_NAMES order (FL, FR, RL, RR x hip, thigh, calf)
  joint_vel (12)         q̇, same order
  actions (12)           the policy's previous RAW output (zeros on the first tick)
  gait_phase (2)         [sin 2πφ, cos 2πφ], φ = (k·policy_dt mod T) / T, T = 0.5 s, policy_dt = 0.02 s, k the
                         policy ticks since the policy took over, k = 1 on the first tick
Action: a (12, raw output, no clip); target q* = default_joint_pos + 0.25 ⊙ a (IsaacLab's JointPositionAction
with use_default_offset), held between policy ticks; tau = kp (q* - q) - kd q̇ every physics step (2 ms,
decimation 10), kp 50, kd 1.5, clipped to the motors' effort limits. default_joint_pos = keyframe "home".

Export: ONNX opset 17 (Sub, Div, Gemm, Elu: obs -> 256 -> 128 -> 12 ELU), input ``obs`` [1, 47], output
``actions`` [1, 12], the deploy contract in metadata_props as mjlab writes it (joint_names, joint_stiffness,
joint_damping, default_joint_pos, action_scale, observation_names, command_names as comma-separated lists)
plus policy_dt, gait_period, the clock's definition, quat_order and the effort limits (:func:`deploy_metadata`).
No ``action_type``: the model's action is the raw output, and the node's actuator applies q0 + scale * a.

A tool: imports numpy, mujoco (through control_node.sim), torch and onnx (training and export only).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from control_node.sim.mujoco_robot import Impedance, MujocoRobot, quat_to_mat

LEGS = ("FL", "FR", "RL", "RR")
PARTS = ("hip", "thigh", "calf")
JOINT_NAMES = [f"{leg}_{part}_joint" for leg in LEGS for part in PARTS]
HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(HERE, "quadruped_policy.onnx")


@dataclass
class GaitConfig:
    """The deploy contract's numbers and the expert's gait. Gains are the PD's, evaluated every physics step."""

    policy_dt: float = 0.02           # 50 Hz: decimation 10 of the model's 2 ms step
    period: float = 0.5               # gait period T (2 Hz trot); the clock's period too
    action_scale: float = 0.25        # q* = q0 + action_scale * a (IsaacLab's JointPositionAction)
    kp: float = 50.0
    kd: float = 1.5
    stand_height: float = 0.27        # hip-to-foot-centre height the expert walks at (home: 0.2926)
    swing_height: float = 0.06
    # calibration of the open-loop stride against the speed it gives (stance compliance, leg swing losses):
    # stride = foot velocity * stance time, foot velocity from (step_gain vx + vx_bias, step_gain vy,
    # yaw_gain wz)
    step_gain: float = 1.45
    vx_bias: float = 0.1
    yaw_gain: float = 1.15
    sag_comp: float = 1.0            # fraction of the stance legs' load sag fed forward in their targets
    hip_comp: float = 0.0            # the same for the hip (ab/adduction) joints
    yaw_kp: float = 0.0              # yaw-rate feedback from the gyro: turn the feet by yaw_kp (wz* - gyro_z)
    att_kp: float = 2.0               # attitude feedback on foot heights (m per rad per m of lever arm)
    att_kd: float = 0.0
    offsets: tuple = (0.0, 0.5, 0.5, 0.0)   # leg phase offsets FL, FR, RL, RR: diagonal pairs


class LegGeometry:
    """Each leg's chain read from the model: hip joint position on the trunk, the thigh joint's lateral offset,
    thigh and calf lengths, the foot sphere. The model authors the legs with no rotated bodies, so the chain
    is hip (about x) -> thigh (about y) -> calf (about y) with these offsets."""

    def __init__(self, robot: MujocoRobot):
        import mujoco
        m = robot.model

        def body(name):
            return int(mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, name))
        self.hip_pos, self.d, self.l1, self.l2 = [], [], [], []
        for leg in LEGS:
            hip, thigh, calf = body(f"{leg}_hip"), body(f"{leg}_thigh"), body(f"{leg}_calf")
            for b in (hip, thigh, calf):
                if not np.allclose(m.body_quat[b], (1, 0, 0, 0)):
                    raise ValueError(f"{leg}: rotated leg bodies are not what this IK reads")
            foot = int(mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, f"{leg}_foot"))
            self.hip_pos.append(m.body_pos[hip].copy())
            self.d.append(float(m.body_pos[thigh][1]))
            self.l1.append(-float(m.body_pos[calf][2]))
            self.l2.append(-float(m.geom_pos[foot][2]))
            self.foot_radius = float(m.geom_size[foot][0])
        self.hip_pos = np.array(self.hip_pos)
        self.d, self.l1, self.l2 = np.array(self.d), np.array(self.l1), np.array(self.l2)

    def ik(self, p):
        """Joint angles (4, 3) for foot-centre positions ``p`` (4, 3) relative to each hip joint, trunk frame;
        knees bend backwards (calf angle negative), as in the "home" pose."""
        x, y, z = p[:, 0], p[:, 1], p[:, 2]
        L = np.sqrt(np.maximum(y * y + z * z - self.d ** 2, 1e-6))   # the leg's length in its sagittal plane
        hip = np.arctan2(z, y) - np.arctan2(-L, self.d)
        D2 = x * x + L * L
        c = np.clip((D2 - self.l1 ** 2 - self.l2 ** 2) / (2 * self.l1 * self.l2), -1.0, 1.0)
        calf = -np.arccos(c)
        thigh = np.arctan2(-x, L) - np.arctan2(self.l2 * np.sin(calf), self.l1 + self.l2 * np.cos(calf))
        hip = (hip + np.pi) % (2 * np.pi) - np.pi
        return np.stack([hip, thigh, calf], axis=1)

    def jacobian(self, q, eps=1e-6):
        """d(foot position)/d(joint angles) per leg, (4, 3, 3), by central differences of :meth:`fk`."""
        J = np.zeros((4, 3, 3))
        for j in range(3):
            dq = np.zeros_like(q)
            dq[:, j] = eps
            J[:, :, j] = (self.fk(q + dq) - self.fk(q - dq)) / (2 * eps)
        return J

    def fk(self, q):
        """Foot-centre positions (4, 3) relative to each hip joint for joint angles ``q`` (4, 3)."""
        out = []
        for i in range(4):
            h, t, c = q[i]
            sag = np.array([-self.l1[i] * np.sin(t) - self.l2[i] * np.sin(t + c), 0.0,
                            -self.l1[i] * np.cos(t) - self.l2[i] * np.cos(t + c)])
            sag[1] = self.d[i]
            ch, sh = np.cos(h), np.sin(h)
            out.append(np.array([sag[0], ch * sag[1] - sh * sag[2], sh * sag[1] + ch * sag[2]]))
        return np.array(out)


def clock(k, cfg: GaitConfig):
    """The gait clock's phase at policy tick ``k`` (k = 1 on the first tick after entry)."""
    return ((k * cfg.policy_dt) % cfg.period) / cfg.period


def projected_gravity(quat):
    """R(q)^T [0, 0, -1] for a (w, x, y, z) quaternion."""
    return quat_to_mat(quat).T @ np.array([0.0, 0.0, -1.0])


class Expert:
    """A trot from the command: diagonal pairs, stance half of the period, feet placed about the hip by the
    command's velocity at each foot (v + w x r), joint targets by IK. Uses only what the policy observes
    (clock, command, projected gravity, gyro), so a student can represent it."""

    def __init__(self, robot: MujocoRobot, cfg: GaitConfig):
        self.cfg = cfg
        self.geo = LegGeometry(robot)
        self.q0 = robot.keyframe_joint_pos("home")
        # the legs hang behind their hips at "home", so the centre of mass is behind the trunk's centre: centre
        # the feet under it, or the rear legs carry more, sag more, and the trunk pitches up and drifts back
        self.com = robot.data.subtree_com[robot.base_body] - robot.data.xpos[robot.base_body]
        self.p_nom = np.stack([np.full(4, self.com[0]), self.geo.d, np.full(4, -cfg.stand_height)], axis=1)
        self.r_foot = self.geo.hip_pos + self.p_nom          # nominal feet about the trunk centre
        self.offsets = np.asarray(cfg.offsets)
        self.weight = float(robot.model.body_mass.sum()) * 9.81

    def targets(self, phase, cmd, grav=None, gyro=None):
        cfg = self.cfg
        vx, vy, wz = cmd
        if gyro is not None and cfg.yaw_kp:
            wz = wz + cfg.yaw_kp * (wz - gyro[2])
        vx, wz = cfg.step_gain * vx + cfg.vx_bias, cfg.yaw_gain * wz
        vy = cfg.step_gain * vy
        vf = np.stack([vx - wz * self.r_foot[:, 1], vy + wz * self.r_foot[:, 0]], axis=1)   # (4, 2)
        stride = vf * (0.5 * cfg.period)
        psi = (phase + self.offsets) % 1.0
        p = self.p_nom.copy()
        stance = psi < 0.5
        s = np.where(stance, psi / 0.5, (psi - 0.5) / 0.5)
        # stance: the foot sweeps back at the body's speed; swing: forward again on a smooth path, lifted
        # the swing foot is over its landing point by 80 % of the swing and comes straight down: landing while
        # still moving forward would brake the body
        u = np.clip(s / 0.8, 0.0, 1.0)
        along = np.where(stance, 0.5 - s, -0.5 + 0.5 * (1 - np.cos(np.pi * u)))
        p[:, :2] += along[:, None] * stride
        p[:, 2] += np.where(stance, 0.0, cfg.swing_height * np.sin(np.pi * s))
        if grav is not None and (cfg.att_kp or cfg.att_kd):
            r = self.geo.hip_pos
            dz = -cfg.att_kp * (grav[0] * r[:, 0] + grav[1] * r[:, 1])
            if gyro is not None:
                dz -= cfg.att_kd * (gyro[1] * r[:, 0] - gyro[0] * r[:, 1])
            p[:, 2] += dz
        q = self.geo.ik(p)
        if cfg.sag_comp:
            # a joint PD sags under load: aim the stance legs past the pose by tau/kp, where tau = -J^T F holds
            # the leg's share of the weight (half in single support, ramped at touch-down and lift-off)
            share = np.where(stance, np.clip(np.minimum((s + 0.1) / 0.2, (1.1 - s) / 0.2), 0.0, 1.0), 0.0)
            F = np.zeros((4, 3))
            F[:, 2] = 0.5 * self.weight * share * cfg.sag_comp
            tau = -np.einsum("lij,li->lj", self.geo.jacobian(q), F)
            tau[:, 0] *= cfg.hip_comp
            q = q + tau / cfg.kp
        return q.reshape(-1)

    def action(self, phase, cmd, grav=None, gyro=None):
        return (self.targets(phase, cmd, grav, gyro) - self.q0) / self.cfg.action_scale


OBS_TERMS = (("base_ang_vel", 3), ("projected_gravity", 3), ("velocity_commands", 3), ("joint_pos_rel", 12),
             ("joint_vel", 12), ("actions", 12), ("gait_phase", 2))
N_OBS = sum(n for _, n in OBS_TERMS)            # 47
N_ACT = len(JOINT_NAMES)
#: uniform observation noise during data collection (IsaacLab's velocity-task magnitudes, gravity a bit less)
NOISE = {"base_ang_vel": 0.2, "projected_gravity": 0.03, "joint_pos_rel": 0.01, "joint_vel": 1.5}
#: command ranges sampled during data collection (vx, vy, yaw rate)
CMD_RANGE = ((-0.3, 0.6), (-0.2, 0.2), (-0.8, 0.8))


def observation(sig, cmd, last_action, k, cfg: GaitConfig, q0) -> np.ndarray:
    """The policy's observation from the robot's raw signals (``MujocoRobot.signals()``), in OBS_TERMS order:
    gyro (body frame), R(q)^T [0, 0, -1] from the IMU quaternion (w, x, y, z), the command (vx, vy, yaw rate),
    q - q0 and q̇ by joint name in JOINT_NAMES order, the previous raw action, [sin 2πφ, cos 2πφ] at tick k."""
    jp, jv = sig["joint_pos"], sig["joint_vel"]
    ph = clock(k, cfg)
    return np.concatenate([sig["imu_gyro"], projected_gravity(sig["imu_quat"]), np.asarray(cmd, dtype=np.float64),
                           np.array([jp[j] for j in JOINT_NAMES]) - q0, np.array([jv[j] for j in JOINT_NAMES]),
                           last_action, [math.sin(2 * math.pi * ph), math.cos(2 * math.pi * ph)]])


def _noise_vector():
    out, i = np.zeros(N_OBS), 0
    for name, n in OBS_TERMS:
        out[i:i + n] = NOISE.get(name, 0.0)
        i += n
    return out


class NumpyMLP:
    """The student's forward pass in numpy (normaliser, ELU hidden layers, linear head): fast enough to act at
    every tick of data collection without torch's per-call overhead."""

    def __init__(self, mean, std, layers):
        self.mean, self.std, self.layers = mean, std, layers

    def __call__(self, obs):
        h = (np.asarray(obs, dtype=np.float64) - self.mean) / self.std
        for i, (W, b) in enumerate(self.layers):
            h = h @ W.T + b
            if i + 1 < len(self.layers):
                h = np.where(h > 0, h, np.expm1(np.minimum(h, 0.0)))
        return h


def _sample_cmd(rng):
    if rng.random() < 0.1:
        return (0.0, 0.0, 0.0)
    c = [rng.uniform(lo, hi) for lo, hi in CMD_RANGE]
    if rng.random() < 0.3:
        c[1] = 0.0                   # plenty of plain forward / turning walks, the demo's commands
    if rng.random() < 0.2:
        c[2] = 0.0
    return tuple(c)


def collect_episode(robot, expert, cfg, rng, student=None, beta=1.0, seconds=12.0, noisy=True, pushes=True):
    """One data-collection episode: stand-up hold, then the gait with random command changes and pushes. Each
    tick the expert labels the state; the expert acts with probability ``beta``, the student otherwise.
    Returns (observations as the policy saw them, expert actions, fell)."""
    from control_node.sim.stand_controller import StandController
    robot.reset("home")
    d = robot.data
    q0 = expert.q0
    # start near "home" (a stand-up ramp never ends exactly there), held by the stand gains for a moment
    d.qpos[robot._qadr] = q0 + rng.uniform(-0.05, 0.05, N_ACT)
    robot.forward()
    stand = StandController(robot, duration_s=0.2)
    dec = int(round(cfg.policy_dt / robot.dt))
    for _ in range(int(rng.integers(15, 50))):
        robot.apply(stand.command(robot.time))
        robot.step(dec)
    noise = _noise_vector() if noisy else np.zeros(N_OBS)
    n = int(round(seconds / cfg.policy_dt))
    X, Y = np.empty((n, N_OBS)), np.empty((n, N_ACT))
    last = np.zeros(N_ACT)
    cmd, next_cmd = _sample_cmd(rng), int(rng.integers(100, 250))
    next_push = int(rng.integers(50, 200))
    fell = False
    for k in range(1, n + 1):
        if k == next_cmd:
            cmd, next_cmd = _sample_cmd(rng), k + int(rng.integers(100, 250))
        if pushes and k == next_push:
            ang, mag = rng.uniform(0, 2 * np.pi), rng.uniform(0.1, 0.5)
            robot.push(dv=(mag * math.cos(ang), mag * math.sin(ang), 0.0))
            next_push = k + int(rng.integers(100, 250))
        sig = robot.signals()
        obs = observation(sig, cmd, last, k, cfg, q0)
        label = expert.action(clock(k + 0.5, cfg), cmd, projected_gravity(sig["imu_quat"]), sig["imu_gyro"])
        seen = obs + noise * rng.uniform(-1.0, 1.0, N_OBS)
        X[k - 1], Y[k - 1] = seen, label
        act = label if (student is None or rng.random() < beta) else student(seen)
        robot.apply(Impedance(q=q0 + cfg.action_scale * act, kp=cfg.kp, kd=cfg.kd))
        robot.step(dec)
        last = act
        up_z = quat_to_mat(robot.base_quat)[2, 2]
        if robot.base_pos[2] < 0.15 or up_z < math.cos(1.0):
            fell = True
            return X[:k], Y[:k], fell
    return X, Y, fell


def _torch_mlp(hidden):
    import torch
    sizes = [N_OBS, *hidden, N_ACT]
    mods = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        mods.append(torch.nn.Linear(a, b))
        if i + 1 < len(sizes) - 1:
            mods.append(torch.nn.ELU())
    return torch.nn.Sequential(*mods)


class Normalized:
    """Builds the exported module: (obs - mean) / std inside the graph, so the observation the node builds is the
    raw one (no scales to copy by hand)."""

    @staticmethod
    def build(net, mean, std):
        import torch

        class _Policy(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
                self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
                self.net = net

            def forward(self, obs):
                return self.net((obs - self.mean) / self.std)
        return _Policy()


def _fit(net, X, Y, mean, std, epochs, gen, lr=1e-3, batch=512):
    import torch
    Xt = torch.as_tensor((X - mean) / std, dtype=torch.float32)
    Yt = torch.as_tensor(Y, dtype=torch.float32)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        perm = torch.randperm(len(Xt), generator=gen)
        for s in range(0, len(Xt), batch):
            idx = perm[s:s + batch]
            loss = torch.nn.functional.mse_loss(net(Xt[idx]), Yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return float(loss.detach())


def _numpy_student(net, mean, std):
    layers = [(m.weight.detach().numpy().astype(np.float64), m.bias.detach().numpy().astype(np.float64))
              for m in net if hasattr(m, "weight")]
    return NumpyMLP(mean, std, layers)


@dataclass
class TrainResult:
    module: object                      # the torch module (normaliser inside)
    student: NumpyMLP
    cfg: GaitConfig
    samples: int
    rounds: int
    seconds: float
    log: list = field(default_factory=list)


def train(seed=0, rounds=10, episodes=(60, 40), episode_s=12.0, hidden=(256, 128), epochs=(30, 10), minutes=45.0,
          cfg=None, progress=True, log=print) -> TrainResult:
    """DAgger: round 0 the expert walks (noisy observations, pushes, command changes) and the student is fit to
    it; each later round the student walks (the expert acts on a fraction beta = 0.5^round of the ticks), the
    expert labels every state visited, the data are aggregated and the student refit. Stops early (and says so)
    past ``minutes``. Deterministic for a seed (MuJoCo single-threaded, torch on one thread)."""
    import time

    import torch
    from tqdm import tqdm
    t0 = time.monotonic()
    cfg = cfg or GaitConfig()
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    robot = MujocoRobot()
    expert = Expert(robot, cfg)
    net = _torch_mlp(hidden)
    Xs, Ys = [], []
    mean = std = student = None
    msgs = []
    total = episodes[0] + episodes[1] * (rounds - 1)
    bar = tqdm(total=total, desc="DAgger episodes", unit="ep", disable=not progress)
    done = 0
    for r in range(rounds):
        beta = 1.0 if r == 0 else 0.5 ** r
        falls = 0
        for _ in range(episodes[0] if r == 0 else episodes[1]):
            X, Y, fell = collect_episode(robot, expert, cfg, rng, student=None if r == 0 else student, beta=beta,
                                         seconds=episode_s)
            Xs.append(X)
            Ys.append(Y)
            falls += fell
            bar.update(1)
        X, Y = np.concatenate(Xs), np.concatenate(Ys)
        if mean is None:
            # the normaliser is fixed from the expert's data so every round trains the same input scaling
            mean, std = X.mean(axis=0), np.maximum(X.std(axis=0), 1e-2)
            mean[-2:], std[-2:] = 0.0, 1.0        # the clock is already in [-1, 1]
        loss = _fit(net, X, Y, mean, std, epochs[0] if r == 0 else epochs[1], gen)
        student = _numpy_student(net, mean, std)
        done = r + 1
        msg = (f"round {r + 1}/{rounds}: beta {beta:.3f}, {len(X)} samples, falls while collecting {falls}, "
               f"loss {loss:.4f}, {time.monotonic() - t0:.0f} s")
        msgs.append(msg)
        (bar.write if progress else log)(msg)
        if time.monotonic() - t0 > 60.0 * minutes:
            msgs.append(f"stopped after round {r + 1}: past the {minutes:g} min budget")
            bar.write(msgs[-1])
            break
    bar.close()
    return TrainResult(Normalized.build(net, mean, std).eval(), student, cfg, len(X), done,
                       time.monotonic() - t0, msgs)


# -- the deploy contract and the export ---------------------------------------------------------------------
def _csv(values):
    return ",".join(v if isinstance(v, str) else f"{float(v):.6g}" for v in values)


def deploy_metadata(cfg: GaitConfig, robot: MujocoRobot | None = None) -> dict:
    """metadata_props as mjlab writes them (comma-separated lists, joint order = the policy's), plus what this
    policy also needs: the rates, the gait clock and the quaternion order of projected gravity."""
    robot = robot or MujocoRobot()
    q0 = robot.keyframe_joint_pos("home")
    return {
        "joint_names": _csv(JOINT_NAMES),
        "joint_stiffness": _csv([cfg.kp] * N_ACT),
        "joint_damping": _csv([cfg.kd] * N_ACT),
        "default_joint_pos": _csv(q0),
        "action_scale": _csv([cfg.action_scale] * N_ACT),
        "command_names": "twist",
        "observation_names": _csv([name for name, _ in OBS_TERMS]),
        # beyond mjlab's keys
        "observation_dims": _csv([str(n) for _, n in OBS_TERMS]),
        "command_components": "lin_vel_x,lin_vel_y,ang_vel_z",
        "joint_effort_limit": _csv([robot.effort_limit[j] for j in JOINT_NAMES]),
        "policy_dt": f"{cfg.policy_dt:g}",
        "physics_dt": f"{robot.dt:g}",
        "decimation": str(int(round(cfg.policy_dt / robot.dt))),
        "pd": "joint PD every physics step: tau = kp (q* - q) - kd qd, clipped to joint_effort_limit",
        "action": "q* = default_joint_pos + action_scale * a, a the raw output; last action = previous raw output",
        "gait_period": f"{cfg.period:g}",
        "gait_clock": "sin_cos: [sin 2 pi phi, cos 2 pi phi], phi = (k policy_dt mod T) / T, k = 1 on the first tick",
        "quat_order": "wxyz",
        "observation_scales": "none (the graph normalises)",
        "robot": "control_node.sim models/quadruped.xml",
        "trainer": "DAgger distillation of a trot gait controller (train/quadruped.py)",
    }


def export_onnx(module, path, cfg: GaitConfig, opset=17):
    """A plain MLP graph (Sub, Div, Gemm, Elu), input ``obs`` [1, 47], output ``actions`` [1, 12], with the
    deploy contract in metadata_props; one file (the legacy exporter: no external data)."""
    import onnx
    import torch
    import warnings
    dummy = torch.zeros(1, N_OBS)
    with warnings.catch_warnings():
        # the legacy exporter on purpose: one self-contained file, the plain Gemm/Elu graph importers read
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (dummy,), str(path), input_names=["obs"], output_names=["actions"],
                          opset_version=opset, dynamo=False)
    model = onnx.load(str(path))
    for k, v in deploy_metadata(cfg).items():
        e = model.metadata_props.add()
        e.key, e.value = k, v
    onnx.save(model, str(path))
    return path


def onnx_policy(path):
    """obs (47,) -> raw action (12,) through onnxruntime."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name

    def act(obs):
        return sess.run(None, {name: np.asarray(obs, dtype=np.float32).reshape(1, -1)})[0][0].astype(np.float64)
    return act


def evaluate(policy=SHIPPED, seconds=20.0, command_schedule="0:0.4", cfg=None, push=None, stand_s=0.0,
             latency_steps=0):
    """The student closed loop in MuJoCo through :class:`MujocoRobot`: from "home", the policy at 50 Hz (k from
    1, last action zero), PD at physics rate, Score updated every physics step. ``policy``: an .onnx path or a
    callable obs -> raw action. ``command_schedule``: a CommandSchedule, its text ("0:0.4,10:0.4@0.5") or a
    (vx, vy, yaw_rate) tuple. ``push``: optional (time_s, (dvx, dvy, dvz)), time from the policy's start.
    ``stand_s`` > 0: start lying on the "crouch" keyframe and stand up first (StandController's 1 s ramp to
    "home", kp 80, kd 2, held for stand_s in all), as the demo does; not scored. ``latency_steps``: commands take
    effect that many physics steps late. Returns Score.summary() of the policy's ``seconds``."""
    from control_node.sim.mujoco_robot import CommandSchedule
    cfg = cfg or GaitConfig()
    act = onnx_policy(policy) if isinstance(policy, (str, os.PathLike)) else policy
    if isinstance(command_schedule, str):
        sched = CommandSchedule.parse(command_schedule)
    elif isinstance(command_schedule, CommandSchedule) or callable(command_schedule):
        sched = command_schedule
    else:
        c = tuple(float(v) for v in command_schedule)
        sched = lambda t: c      # noqa: E731
    robot = MujocoRobot(latency_steps=latency_steps)
    q0 = robot.keyframe_joint_pos("home")
    dec = int(round(cfg.policy_dt / robot.dt))
    if stand_s > 0:
        from control_node.sim.stand_controller import StandController
        robot.reset("crouch")
        stand = StandController(robot, duration_s=min(1.0, stand_s))
        for _ in range(int(round(stand_s / cfg.policy_dt))):
            robot.apply(stand.command(robot.time))
            robot.step(dec)
    t0 = robot.time
    score = robot.score()
    last = np.zeros(N_ACT)
    for k in range(1, int(round(seconds / cfg.policy_dt)) + 1):
        if push is not None and abs(robot.time - t0 - push[0]) < 0.5 * cfg.policy_dt:
            robot.push(dv=push[1])
        cmd = tuple(sched(robot.time - t0))
        a = np.asarray(act(observation(robot.signals(), cmd, last, k, cfg, q0)), dtype=np.float64)
        robot.apply(Impedance(q=q0 + cfg.action_scale * a, kp=cfg.kp, kd=cfg.kd))
        for _ in range(dec):
            robot.step()
            score.update_from(robot, cmd)
        last = a
    return score.summary()


def run_expert(cfg=None, seconds=20.0, cmd=(0.4, 0.0, 0.0), half_tick=True):
    """The expert closed loop in MuJoCo (for tuning); returns Score.summary()."""
    cfg = cfg or GaitConfig()
    robot = MujocoRobot()
    ex = Expert(robot, cfg)
    score = robot.score()
    dec = int(round(cfg.policy_dt / robot.dt))
    n = int(round(seconds / cfg.policy_dt))
    for k in range(1, n + 1):
        sig = robot.signals()
        ph = clock(k + (0.5 if half_tick else 0.0), cfg)
        c = cmd(robot.time) if callable(cmd) else cmd
        q = ex.targets(ph, c, projected_gravity(sig["imu_quat"]), sig["imu_gyro"])
        robot.apply(Impedance(q=q, kp=cfg.kp, kd=cfg.kd))
        for _ in range(dec):
            robot.step()
            score.update_from(robot, c)
    return score.summary()


def _line(name, s):
    v, c, e = s["mean_velocity"], s["mean_command"], s["tracking_rms"]
    return (f"{name}: walked {s['distance_m']:.2f} m in {s['duration_s']:.0f} s, mean vx {v['vx']:.3f} vy {v['vy']:.3f} "
            f"yaw {v['yaw_rate']:.3f} (command {c['vx']:.2f}, {c['vy']:.2f}, {c['yaw_rate']:.2f}), falls {s['falls']}, "
            f"tracking rms vx {e['vx']:.3f} vy {e['vy']:.3f} yaw {e['yaw_rate']:.3f}, torque peak "
            f"{s['torque_peak_nm']:.1f} rms {s['torque_rms_nm']:.1f} N m")


def main(argv=None):
    import argparse
    import time
    ap = argparse.ArgumentParser(prog="python -m control_node.train.quadruped",
                                 description="Distil a trot gait controller into a 47 -> 256 -> 128 -> 12 ELU "
                                             "walking policy for the packaged quadruped (DAgger) and export it to "
                                             "ONNX with the deploy contract in metadata_props.")
    ap.add_argument("--out", default=SHIPPED, help="ONNX file to write (default: %(default)s)")
    ap.add_argument("--minutes", type=float, default=45.0, help="stop adding DAgger rounds past this (default 45)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=10, help="DAgger rounds (default: %(default)s)")
    ap.add_argument("--episodes", type=int, nargs=2, default=[60, 40], metavar=("FIRST", "LATER"),
                    help="episodes of 12 s in the expert's round and in each later round (default: 60 40)")
    ap.add_argument("--expert-only", action="store_true", help="score the expert and exit")
    args = ap.parse_args(argv)
    if args.expert_only:
        for name, c in (("forward 0.4", (0.4, 0, 0)), ("turn 0.4 @ 0.5", (0.4, 0, 0.5))):
            print(_line(f"expert, {name}", run_expert(seconds=20, cmd=c)))
        return 0
    t0 = time.monotonic()
    res = train(seed=args.seed, rounds=args.rounds, episodes=tuple(args.episodes), minutes=args.minutes)
    export_onnx(res.module, args.out, res.cfg)
    print(f"trained in {res.seconds / 60:.1f} min ({res.rounds} rounds, {res.samples} samples); wrote {args.out} "
          f"({os.path.getsize(args.out) / 1024:.0f} KiB)")
    for name, sched in (("forward 0.4 m/s", "0:0.4"), ("turn 0.3 m/s @ 0.5 rad/s", "0:0.3@0.5"),
                        ("turn in place -0.6 rad/s", "0:0@-0.6")):
        print(_line(f"student, {name}", evaluate(args.out, 20.0, sched, res.cfg)))
    print(f"total {(time.monotonic() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
