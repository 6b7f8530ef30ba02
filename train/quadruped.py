"""A velocity-tracking walking policy for the packaged quadruped (sim/models/quadruped.xml), made here.

(Docstring completed below, once the method is settled.)
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
