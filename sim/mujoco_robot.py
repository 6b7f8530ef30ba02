"""A MuJoCo robot: any MJCF with a floating base, met by joint name, with disturbances and a score.

The physics is MuJoCo's (``pip install 'control-node[mujoco]'``); this module reads the model, checks what a
legged policy needs (floating base, an actuator per commanded joint, an IMU), and turns raw MuJoCo state into
named signals in the conventions the trainers use: quaternion (w, x, y, z), gyro and accelerometer in the IMU
site's frame, privileged base linear velocity in the *body* frame (a free joint's ``qvel[0:3]`` is world
frame). Commands go in by joint name: torques for ``motor`` actuators, targets for ``position`` actuators, or
an :class:`Impedance` (q*, qd*, kp, kd, tau_ff) whose PD torque is computed here every physics step.

A tool: never imported by the node. ``mujoco`` is imported on first use, so :class:`CommandSchedule` and
:class:`Score` work without it.
"""
from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from control_node.errors import UserError

MODEL_RESOURCE = "models/quadruped.xml"

IMU_FIX = ("add an IMU site on the base body and its sensors, e.g. inside the base <body>: "
           '<site name="imu" pos="0 0 0"/> and in <sensor>: <framequat name="imu_quat" objtype="site" '
           'objname="imu"/> <gyro name="imu_gyro" site="imu"/> <accelerometer name="imu_acc" site="imu"/>')


class ModelError(UserError):
    """An MJCF this simulator cannot run as a robot: the message names what is missing and the fix."""


def _mujoco():
    try:
        import mujoco
    except ImportError as e:
        raise UserError(f"mujoco is not installed ({e}). Fix: pip install 'control-node[mujoco]'") from None
    return mujoco


def packaged_quadruped() -> str:
    """Path of the quadruped MJCF shipped inside the package (``control_node.sim`` package data)."""
    from importlib.resources import files
    path = files("control_node.sim").joinpath(MODEL_RESOURCE)
    if not path.is_file():
        raise UserError(f"the packaged quadruped model {MODEL_RESOURCE} is missing from control_node.sim. "
                        "Fix: reinstall control-node (its package-data must list models/*.xml)")
    return str(path)


@dataclass
class Impedance:
    """A joint impedance command: ``tau = kp (q - q_meas) + kd (qd - qd_meas) + tau_ff``, evaluated every
    physics step. ``q`` is a mapping joint name -> target (the joints it names are the ones commanded) or an
    array in the robot's ``commanded`` order; ``kp``/``kd``/``qd``/``tau_ff`` are a scalar for all of them, a
    mapping by name or such an array (``qd`` and ``tau_ff`` default to 0)."""

    q: object
    kp: object
    kd: object
    qd: object = 0.0
    tau_ff: object = 0.0


@dataclass(frozen=True)
class _Act:
    index: int        # MuJoCo actuator id
    kind: str         # "motor" or "position"
    per_unit: float   # ctrl per joint unit: 1/(gear*gain) for torque, gear for a position target
    lo: float         # ctrl range (-inf, inf when not ctrllimited)
    hi: float


class MujocoRobot:
    """One MuJoCo robot with a floating base.

    ``model``: MJCF path (default: :func:`packaged_quadruped`). ``dt``: physics step (default: the model's
    timestep). ``imu_site``: the IMU site's name (default: the site on the base body carrying a framequat and a
    gyro sensor). ``joints``: the joints commands may name (default: every hinge/slide joint of the robot;
    each needs an actuator). ``latency_steps``: a command takes effect this many physics steps after
    :meth:`apply`. ``drop``: probability that :meth:`apply` loses a command, drawn from ``seed``'s RNG.
    """

    def __init__(self, model=None, *, dt=None, imu_site=None, joints=None, latency_steps=0, drop=0.0, seed=0):
        mj = self._mj = _mujoco()
        self.path = packaged_quadruped() if model is None else os.fspath(model)
        if not os.path.isfile(self.path):
            raise ModelError(f"model {self.path}: no such file. Fix: pass the path of an MJCF (.xml) file")
        try:
            self.model = mj.MjModel.from_xml_path(self.path)
        except ValueError as e:
            raise ModelError(f"model {self.path}: MuJoCo cannot load it: {e}. Fix: correct the MJCF "
                             "(try `python -m mujoco.viewer --mjcf FILE`)") from None
        if dt is not None:
            if not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt > 0):
                raise ModelError(f"dt={dt!r}: the physics step must be a positive number of seconds. "
                                 "Fix: e.g. dt=0.002, or omit it to use the model's <option timestep>")
            self.model.opt.timestep = float(dt)
        self.dt = float(self.model.opt.timestep)
        if int(latency_steps) != latency_steps or latency_steps < 0:
            raise UserError(f"latency_steps={latency_steps!r}: must be a whole number >= 0 of physics steps")
        if not 0.0 <= drop < 1.0:
            raise UserError(f"drop={drop!r}: must be a probability in [0, 1)")
        self.latency_steps, self.drop, self.seed = int(latency_steps), float(drop), seed
        self.data = mj.MjData(self.model)
        self._find_base()
        self._find_joints()
        self._map_actuators(joints)
        self._find_imu(imu_site)
        self._rng = np.random.default_rng(seed)
        self.reset("home" if self._key_id("home") is not None else None)

    # -- reading the model -------------------------------------------------------------------------------

    def _name(self, objtype, i):
        return self._mj.mj_id2name(self.model, objtype, i)

    def _find_base(self):
        mj, m = self._mj, self.model
        free = [j for j in range(m.njnt) if int(m.jnt_type[j]) == int(mj.mjtJoint.mjJNT_FREE)]
        if len(free) > 1:
            # free objects in the scene besides the robot: the robot's base is the one with actuated joints below it
            driven = {int(m.jnt_bodyid[m.actuator_trnid[a, 0]]) for a in range(m.nu)
                      if int(m.actuator_trntype[a]) == int(mj.mjtTrn.mjTRN_JOINT)}
            free = [j for j in free if any(self._descends(b, int(m.jnt_bodyid[j])) for b in driven)]
        if len(free) != 1:
            raise ModelError(f"model {self.path}: {'no' if not free else 'more than one'} floating base (a free "
                             "joint above the actuated joints): control-node drives legged robots whose base moves "
                             "freely. Fix: make <freejoint/> the first child of the robot's root <body>")
        self.base_joint = free[0]
        self.base_body = int(m.jnt_bodyid[free[0]])
        self.base_name = self._name(self._mj.mjtObj.mjOBJ_BODY, self.base_body) or f"body {self.base_body}"
        self._base_qadr = int(m.jnt_qposadr[free[0]])
        self._base_vadr = int(m.jnt_dofadr[free[0]])

    def _descends(self, body, ancestor):
        while body > 0:
            if body == ancestor:
                return True
            body = int(self.model.body_parentid[body])
        return ancestor == 0

    def _find_joints(self):
        mj, m = self._mj, self.model
        names = []
        for j in range(m.njnt):
            if j == self.base_joint or not self._descends(int(m.jnt_bodyid[j]), self.base_body):
                continue
            kind = int(m.jnt_type[j])
            name = self._name(mj.mjtObj.mjOBJ_JOINT, j)
            if kind not in (int(mj.mjtJoint.mjJNT_HINGE), int(mj.mjtJoint.mjJNT_SLIDE)):
                raise ModelError(f"model {self.path}: joint {name or j} is a {'ball' if kind == int(mj.mjtJoint.mjJNT_BALL) else 'free'} "
                                 "joint inside the robot: commands and signals are one value per joint. Fix: model it "
                                 "as hinge joints")
            if not name:
                raise ModelError(f"model {self.path}: joint #{j} has no name: the robot is met by joint name. "
                                 "Fix: give every <joint> a name")
            names.append(name)
        if not names:
            raise ModelError(f"model {self.path}: the floating base {self.base_name} has no joints below it. "
                             "Fix: a legged robot's joints are hinge joints in the bodies under its base")
        self.joint_names = names
        ids = [mj.mj_name2id(m, mj.mjtObj.mjOBJ_JOINT, n) for n in names]
        self._jid = dict(zip(names, ids))
        self._qadr_all = np.array([m.jnt_qposadr[j] for j in ids])
        self._vadr_all = np.array([m.jnt_dofadr[j] for j in ids])

    def _map_actuators(self, joints):
        mj, m = self._mj, self.model
        by_joint = {}
        for a in range(m.nu):
            aname = self._name(mj.mjtObj.mjOBJ_ACTUATOR, a) or f"#{a}"
            if int(m.actuator_trntype[a]) not in (int(mj.mjtTrn.mjTRN_JOINT), int(mj.mjtTrn.mjTRN_JOINTINPARENT)):
                raise ModelError(f"model {self.path}: actuator {aname} does not drive a joint (transmission "
                                 f"{mj.mjtTrn(m.actuator_trntype[a]).name}): control-node commands joints by name. "
                                 "Fix: give it joint=\"...\" (a motor or position actuator on one joint)")
            jname = self._name(mj.mjtObj.mjOBJ_JOINT, int(m.actuator_trnid[a, 0]))
            if jname not in self._jid:
                continue           # drives something outside the robot (a scene object): not ours
            if jname in by_joint:
                raise ModelError(f"model {self.path}: joint {jname} has two actuators ({by_joint[jname][0]} and "
                                 f"{aname}): a command by joint name would be ambiguous. Fix: keep one")
            by_joint[jname] = (aname, self._actuator(a, aname))
        commanded = list(self.joint_names) if joints is None else list(joints)
        unknown = [j for j in commanded if j not in self._jid]
        if unknown:
            raise ModelError(f"joints {unknown} are not joints of {self.path}'s robot. Fix: use its joint names: "
                             f"{', '.join(self.joint_names)}")
        missing = [j for j in commanded if j not in by_joint]
        if missing:
            raise ModelError(f"model {self.path}: joint {missing[0]} has no actuator"
                             + (f" (nor {', '.join(missing[1:])})" if len(missing) > 1 else "")
                             + f", and commands name it. Fix: add to <actuator> e.g. <motor joint=\"{missing[0]}\" "
                             "ctrlrange=\"-EFFORT EFFORT\"/> (or <position .../>), or leave the joint out of the "
                             "commanded joints (joints=[...])")
        self.commanded = commanded
        self._acts = [by_joint[j][1] for j in commanded]
        self.actuator_names = {j: by_joint[j][0] for j in commanded}
        self.actuator_kind = {j: a.kind for j, a in zip(commanded, self._acts)}
        self._act_idx = np.array([a.index for a in self._acts], dtype=np.intp)
        self._per_unit = np.array([a.per_unit for a in self._acts])
        self._lo = np.array([a.lo for a in self._acts])
        self._hi = np.array([a.hi for a in self._acts])
        self._is_motor = np.array([a.kind == "motor" for a in self._acts])
        self._cidx = {j: i for i, j in enumerate(commanded)}
        self._qadr = np.array([m.jnt_qposadr[self._jid[j]] for j in commanded])
        self._vadr = np.array([m.jnt_dofadr[self._jid[j]] for j in commanded])
        # torque limit in joint units: a motor's ctrlrange times its gain; a position actuator's forcerange
        self.effort_limit = {}
        for j, a in zip(commanded, self._acts):
            if a.kind == "motor":
                self.effort_limit[j] = float(max(abs(a.lo), abs(a.hi)) / a.per_unit)
            else:
                fr = m.actuator_forcerange[a.index]
                self.effort_limit[j] = float(max(abs(fr[0]), abs(fr[1])) * abs(m.actuator_gear[a.index, 0])) \
                    if m.actuator_forcelimited[a.index] else math.inf

    def _actuator(self, a, aname) -> _Act:
        mj, m = self._mj, self.model
        gear = float(m.actuator_gear[a, 0])
        gain, bias = m.actuator_gainprm[a], m.actuator_biasprm[a]
        limited = bool(m.actuator_ctrllimited[a])
        lo, hi = (float(m.actuator_ctrlrange[a, 0]), float(m.actuator_ctrlrange[a, 1])) if limited else (-math.inf,
                                                                                                      math.inf)
        fix = ("Fix: use <motor joint=\"...\"/> (torque) or <position joint=\"...\" kp=\"...\"/> (without "
               "timeconst)")
        if int(m.actuator_dyntype[a]) != int(mj.mjtDyn.mjDYN_NONE):
            raise ModelError(f"model {self.path}: actuator {aname} has activation dynamics "
                             f"({mj.mjtDyn(m.actuator_dyntype[a]).name}): supported are motor and position "
                             f"actuators without them. {fix}")
        if int(m.actuator_gaintype[a]) != int(mj.mjtGain.mjGAIN_FIXED) or gain[0] == 0 or gear == 0:
            raise ModelError(f"model {self.path}: actuator {aname} is not a motor or position actuator "
                             f"(gain type {mj.mjtGain(m.actuator_gaintype[a]).name}, gain {gain[0]:g}, gear {gear:g}). "
                             f"{fix}")
        if int(m.actuator_biastype[a]) == int(mj.mjtBias.mjBIAS_NONE):
            return _Act(a, "motor", 1.0 / (gear * float(gain[0])), lo, hi)
        # a position servo: force = kp ctrl - kp length - kv velocity, length = gear q
        if int(m.actuator_biastype[a]) == int(mj.mjtBias.mjBIAS_AFFINE) and bias[0] == 0 and bias[1] == -gain[0]:
            return _Act(a, "position", gear, lo, hi)
        what = "a velocity servo" if bias[1] == 0 and bias[2] == -gain[0] else "a general actuator of another kind"
        raise ModelError(f"model {self.path}: actuator {aname} is {what} (bias {bias[0]:g} {bias[1]:g} {bias[2]:g}): "
                         f"supported are motor (torque) and position actuators. {fix}")

    def _find_imu(self, imu_site):
        mj, m = self._mj, self.model
        S = mj.mjtSensor
        quat, gyro, acc = {}, {}, {}
        for s in range(m.nsensor):
            t, obj = int(m.sensor_type[s]), int(m.sensor_objid[s])
            if t == int(S.mjSENS_FRAMEQUAT) and int(m.sensor_objtype[s]) == int(mj.mjtObj.mjOBJ_SITE) and m.sensor_refid[s] < 0:
                quat.setdefault(obj, s)
            elif t == int(S.mjSENS_GYRO):
                gyro.setdefault(obj, s)
            elif t == int(S.mjSENS_ACCELEROMETER):
                acc.setdefault(obj, s)
        if imu_site is not None:
            site = mj.mj_name2id(m, mj.mjtObj.mjOBJ_SITE, imu_site)
            if site < 0:
                raise ModelError(f"model {self.path}: no site named {imu_site!r} (imu_site). Fix: name an existing "
                                 f"site, or {IMU_FIX}")
            if site not in quat or site not in gyro:
                lacks = [n for n, d in (("framequat", quat), ("gyro", gyro)) if site not in d]
                raise ModelError(f"model {self.path}: site {imu_site!r} has no {' and no '.join(lacks)} sensor, so "
                                 f"it is no IMU. Fix: {IMU_FIX}")
            if not self._rigid_on_base(int(m.site_bodyid[site])):
                raise ModelError(f"model {self.path}: site {imu_site!r} is not on the base body {self.base_name} "
                                 f"(a joint lies between them). Fix: {IMU_FIX}")
        else:
            sites = [s for s in sorted(quat) if s in gyro and self._rigid_on_base(int(m.site_bodyid[s]))]
            if not sites:
                raise ModelError(f"model {self.path}: no IMU on the base body {self.base_name} (a site with a "
                                 f"framequat and a gyro sensor): the policy's orientation and angular velocity "
                                 f"come from it. Fix: {IMU_FIX}")
            site = sites[0]
        self.imu_site = self._name(mj.mjtObj.mjOBJ_SITE, site)
        adr = m.sensor_adr
        self._quat_adr, self._gyro_adr = int(adr[quat[site]]), int(adr[gyro[site]])
        self._acc_adr = int(adr[acc[site]]) if site in acc else None

    def _rigid_on_base(self, body):
        """True when ``body`` is the base or welded to it (no joint on the way up)."""
        m = self.model
        while body != self.base_body:
            if body <= 0 or m.body_jntnum[body] > 0:
                return False
            body = int(m.body_parentid[body])
        return True

    def _key_id(self, name):
        k = self._mj.mj_name2id(self.model, self._mj.mjtObj.mjOBJ_KEY, name)
        return None if k < 0 else k

    def keyframe_joint_pos(self, keyframe="home") -> np.ndarray:
        """The commanded joints' positions in a keyframe (``commanded`` order)."""
        k = self._key_id(keyframe)
        if k is None:
            raise ModelError(f"model {self.path}: no keyframe {keyframe!r}. Fix: add <keyframe><key name="
                             f"\"{keyframe}\" qpos=\"...\"/></keyframe>")
        return self.model.key_qpos[k][self._qadr].copy()

    # -- running -----------------------------------------------------------------------------------------

    def reset(self, keyframe="home", seed=None):
        """Back to a keyframe (None: the model's qpos0). Commands: zero torque on motors, position actuators
        hold the pose; pending commands, pushes and counters cleared; ``seed`` re-seeds the drop RNG."""
        mj, m, d = self._mj, self.model, self.data
        if keyframe is None:
            mj.mj_resetData(m, d)
        else:
            k = self._key_id(keyframe)
            if k is None:
                keys = [self._name(mj.mjtObj.mjOBJ_KEY, i) for i in range(m.nkey)]
                raise ModelError(f"model {self.path}: no keyframe {keyframe!r} (it has {keys or 'none'}). Fix: add "
                                 f"<key name=\"{keyframe}\" qpos=\"...\"/> to <keyframe>, or reset(keyframe=None) "
                                 "for the model's qpos0")
            mj.mj_resetDataKeyframe(m, d, k)
        # the invariant from here on: positions and velocities computed for the current state (mj_step1 done);
        # mj_forward also fills the accelerometer for the first read
        mj.mj_forward(m, d)
        if seed is not None:
            self.seed = seed
            self._rng = np.random.default_rng(seed)
        n = len(self.commanded)
        self._value = np.where(self._is_motor, 0.0, d.qpos[self._qadr])   # torque, or target
        self._imp = np.zeros(n, dtype=bool)
        self._q_ref, self._qd_ref = np.zeros(n), np.zeros(n)
        self._kp, self._kd, self._ff = np.zeros(n), np.zeros(n), np.zeros(n)
        self._pending = deque()
        self._push_until = None
        self.steps = 0
        self.commands_applied = self.commands_dropped = self.clipped = 0
        self.torque = np.zeros(n)       # joint torque of the last physics step (commanded order)

    def apply(self, command) -> bool:
        """Send a command: a mapping joint name -> torque (motor) or target position (position actuator), an
        array of those in ``commanded`` order, or an :class:`Impedance`. Joints it does not name keep their
        last command. It takes effect ``latency_steps`` physics steps later; returns False if dropped."""
        item = self._parse(command)
        if self.drop > 0.0 and self._rng.random() < self.drop:
            self.commands_dropped += 1
            return False
        self._pending.append((self.steps + self.latency_steps, item))
        return True

    def _vector(self, value, idx, what):
        if isinstance(value, Mapping):
            extra = set(value) - set(self.commanded[i] for i in idx)
            if extra:
                raise UserError(f"{what} names joints the command does not target: {sorted(extra)}")
            try:
                return np.array([float(value[self.commanded[i]]) for i in idx])
            except KeyError as e:
                raise UserError(f"{what} has no value for joint {e.args[0]}. Fix: give every commanded joint one, "
                                "or a single number for all") from None
        arr = np.asarray(value, dtype=np.float64)
        if arr.ndim == 0:
            return np.full(len(idx), float(arr))
        if arr.shape != (len(idx),):
            raise UserError(f"{what}: {arr.shape[0] if arr.ndim else 1} values for {len(idx)} joints. Fix: one per "
                            f"joint in the robot's commanded order ({', '.join(self.commanded)}), or a mapping by name")
        return arr

    def _indices(self, target):
        if isinstance(target, Mapping):
            idx = []
            for name in target:
                if name not in self._cidx:
                    why = "has no actuator" if name in self._jid else "is not a joint of this robot"
                    raise UserError(f"command for joint {name!r}: it {why}. Fix: command only {self.commanded}")
                idx.append(self._cidx[name])
            return np.array(idx, dtype=np.intp)
        return np.arange(len(self.commanded))

    def _parse(self, command):
        if isinstance(command, Impedance):
            idx = self._indices(command.q)
            bad = [self.commanded[i] for i in idx if not self._is_motor[i]]
            if bad:
                raise UserError(f"impedance command for {bad}: a position actuator applies its own PD. Fix: give "
                                "those joints a <motor> actuator, or command position targets by name")
            vals = [self._vector(v, idx, f"Impedance.{k}") for k, v in
                    (("q", command.q), ("qd", command.qd), ("kp", command.kp), ("kd", command.kd),
                     ("tau_ff", command.tau_ff))]
            return ("imp", idx, vals)
        idx = self._indices(command)
        return ("set", idx, self._vector(command, idx, "command"))

    def _deliver(self):
        while self._pending and self._pending[0][0] <= self.steps:
            kind, idx, vals = self._pending.popleft()[1]
            self.commands_applied += 1
            if kind == "set":
                # a direct value is clipped (and counted) once, when it takes effect
                ctrl = vals * self._per_unit[idx]
                clipped = np.clip(ctrl, self._lo[idx], self._hi[idx])
                self.clipped += int(np.count_nonzero(clipped != ctrl))
                self._value[idx] = clipped / self._per_unit[idx]
                self._imp[idx] = False
            else:
                self._q_ref[idx], self._qd_ref[idx], self._kp[idx], self._kd[idx], self._ff[idx] = vals
                self._imp[idx] = True

    def step(self, n=1):
        """Advance ``n`` physics steps; commands due are delivered, impedance PD evaluated every step."""
        mj, m, d = self._mj, self.model, self.data
        for _ in range(int(n)):
            if self._pending:
                self._deliver()
            if self._push_until is not None and d.time >= self._push_until:
                d.xfrc_applied[self.base_body] = 0.0
                self._push_until = None
            ctrl = self._value * self._per_unit
            if self._imp.any():
                q, qd = d.qpos[self._qadr], d.qvel[self._vadr]
                tau = self._kp * (self._q_ref - q) + self._kd * (self._qd_ref - qd) + self._ff
                pd = tau * self._per_unit
                lim = np.clip(pd, self._lo, self._hi)
                self.clipped += int(np.count_nonzero((lim != pd) & self._imp))
                ctrl = np.where(self._imp, lim, ctrl)
            d.ctrl[self._act_idx] = ctrl
            # step2 then step1: bit for bit mj_step's trajectory (tested), but after each step the positions,
            # velocities and pos/vel sensors (framequat, gyro) are those of the new state, where mj_step leaves
            # them one step old; the accelerometer is, as with mj_step, the one of the step just taken
            mj.mj_step2(m, d)
            mj.mj_step1(m, d)
            self.steps += 1
        self.torque = d.qfrc_actuator[self._vadr].copy()

    def forward(self):
        """Recompute everything for a state written into ``data`` by hand (qpos, qvel)."""
        self._mj.mj_forward(self.model, self.data)

    def push(self, dv=None, force=None, duration=0.1):
        """Disturb the base: ``dv`` (m/s, world frame) added to its linear velocity at once, or ``force`` (N,
        world frame, at its centre of mass) held for ``duration`` seconds."""
        if (dv is None) == (force is None):
            raise UserError("push: give dv (a velocity impulse, m/s) or force (N, held for duration s), not both")
        d = self.data
        if dv is not None:
            d.qvel[self._base_vadr:self._base_vadr + 3] += np.asarray(dv, dtype=np.float64).reshape(3)
            self._mj.mj_step1(self.model, d)          # velocities changed: recompute what depends on them
        else:
            d.xfrc_applied[self.base_body, :3] = np.asarray(force, dtype=np.float64).reshape(3)
            d.xfrc_applied[self.base_body, 3:] = 0.0
            self._push_until = d.time + float(duration)

    # -- signals -----------------------------------------------------------------------------------------

    @property
    def time(self) -> float:
        return float(self.data.time)

    @property
    def joint_pos(self) -> np.ndarray:
        """Commanded joints' positions, ``commanded`` order."""
        return self.data.qpos[self._qadr].copy()

    @property
    def joint_vel(self) -> np.ndarray:
        return self.data.qvel[self._vadr].copy()

    @property
    def base_pos(self) -> np.ndarray:
        return self.data.qpos[self._base_qadr:self._base_qadr + 3].copy()

    @property
    def base_quat(self) -> np.ndarray:
        """The base body's orientation, (w, x, y, z), world frame."""
        return self.data.qpos[self._base_qadr + 3:self._base_qadr + 7].copy()

    def base_lin_vel_body(self) -> np.ndarray:
        """The base's linear velocity in its own frame: the free joint's qvel[0:3] is world frame, so R^T v."""
        v = self.data.qvel[self._base_vadr:self._base_vadr + 3]
        return quat_to_mat(self.base_quat).T @ v

    def base_ang_vel_body(self) -> np.ndarray:
        """The base's angular velocity in its own frame (a free joint's qvel[3:6] already is)."""
        return self.data.qvel[self._base_vadr + 3:self._base_vadr + 6].copy()

    def signals(self, privileged=False) -> dict:
        """Named raw signals: ``joint_pos``/``joint_vel`` (dicts by joint name, every robot joint), ``imu_quat``
        (w, x, y, z), ``imu_gyro`` (rad/s) and ``imu_acc`` (m/s^2, incl. gravity: +9.81 z at rest; over the
        last step) in the IMU site's frame; with ``privileged`` also ``base_lin_vel_body``,
        ``base_ang_vel_body``, ``base_pos`` and ``base_quat``, which a real robot does not measure."""
        d = self.data
        sd = d.sensordata
        out = {"t": float(d.time),
               "joint_pos": dict(zip(self.joint_names, d.qpos[self._qadr_all].tolist())),
               "joint_vel": dict(zip(self.joint_names, d.qvel[self._vadr_all].tolist())),
               "imu_quat": sd[self._quat_adr:self._quat_adr + 4].copy(),
               "imu_gyro": sd[self._gyro_adr:self._gyro_adr + 3].copy()}
        if self._acc_adr is not None:
            out["imu_acc"] = sd[self._acc_adr:self._acc_adr + 3].copy()
        if privileged:
            out.update(base_lin_vel_body=self.base_lin_vel_body(), base_ang_vel_body=self.base_ang_vel_body(),
                       base_pos=self.base_pos, base_quat=self.base_quat)
        return out

    def score(self, **kw) -> "Score":
        """A :class:`Score` for this robot, updated per physics step; a fall is the base below half its
        "home" height (0.15 m without that keyframe) unless ``min_height`` is given."""
        if "min_height" not in kw:
            k = self._key_id("home")
            kw["min_height"] = 0.5 * float(self.model.key_qpos[k][self._base_qadr + 2]) if k is not None else 0.15
        return Score(self.dt, joint_names=self.commanded, **kw)


def quat_to_mat(q) -> np.ndarray:
    """Rotation matrix of a unit quaternion (w, x, y, z): body -> world."""
    w, x, y, z = (float(v) for v in q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


class CommandSchedule:
    """A velocity-command schedule: (vx, vy, yaw_rate) as a function of time.

    Grammar: ``ENTRY[,ENTRY...]`` with ``ENTRY = TIME:VX[,VY][@YAW_RATE]``. TIME in seconds (>= 0, strictly
    increasing), VX and VY in m/s (body frame: forward, left), YAW_RATE in rad/s (counter-clockwise). A number
    with no ``:`` after an entry is that entry's VY; ``@YAW_RATE`` comes last in its entry. Each entry holds
    from its time until the next (steps, no ramp); before the first entry the command is zero, the last holds
    to the end. Spaces are ignored. ``"0:0,2:0.4,10:0.4@0.5"``: stand 2 s, walk forward at 0.4 m/s, from 10 s
    also turn at 0.5 rad/s; ``"0:0.3,0.1@0.2"``: 0.3 forward, 0.1 left, turning at 0.2 rad/s.
    """

    FIX = "Fix: write TIME:VX[,VY][@YAW_RATE] entries separated by commas, e.g. 0:0,2:0.4,10:0.4@0.5"

    def __init__(self, entries):
        self.entries = [tuple(float(v) for v in e) for e in entries]
        self._times = np.array([e[0] for e in self.entries])

    @classmethod
    def parse(cls, text: str) -> "CommandSchedule":
        src = str(text)
        s = src.replace(" ", "")
        if not s:
            raise UserError(f"command schedule {src!r} is empty. {cls.FIX}")
        entries = []                  # [t, vx, vy, yaw, has_vy, has_yaw]

        def num(tok, what, n):
            try:
                v = float(tok)
            except ValueError:
                v = math.nan
            if not math.isfinite(v):
                raise UserError(f"command schedule {src!r}, entry {n}: {what} {tok!r} is not a finite number. "
                                f"{cls.FIX}") from None
            return v

        for tok in s.split(","):
            n = len(entries)
            body, yaw = tok, None
            if "@" in tok:
                body, _, yaw = tok.partition("@")
            if ":" in body:
                t, _, vx = body.partition(":")
                e = [num(t, "time", n + 1), num(vx, "vx", n + 1), 0.0, 0.0, False, yaw is not None]
                if e[0] < 0:
                    raise UserError(f"command schedule {src!r}, entry {n + 1}: time {t} is negative. {cls.FIX}")
                if entries and e[0] <= entries[-1][0]:
                    raise UserError(f"command schedule {src!r}, entry {n + 1}: time {t} does not come after "
                                    f"{entries[-1][0]:g}; times must increase. {cls.FIX}")
                if yaw is not None:
                    e[3] = num(yaw, "yaw rate", n + 1)
                entries.append(e)
            else:
                if not entries:
                    raise UserError(f"command schedule {src!r}: {tok!r} has no TIME: before it. {cls.FIX}")
                e = entries[-1]
                if e[4] or e[5]:
                    what = "a second VY" if e[4] else "VY after @YAW_RATE"
                    raise UserError(f"command schedule {src!r}, entry {n}: {what} ({tok!r}); an entry is "
                                    f"TIME:VX[,VY][@YAW_RATE]. {cls.FIX}")
                e[2], e[4] = num(body, "vy", n), True
                if yaw is not None:
                    e[3], e[5] = num(yaw, "yaw rate", n), True
        return cls([e[:4] for e in entries])

    def __call__(self, t: float) -> tuple:
        """(vx, vy, yaw_rate) at time ``t``."""
        i = int(np.searchsorted(self._times, t, side="right")) - 1
        return (0.0, 0.0, 0.0) if i < 0 else self.entries[i][1:]

    def __str__(self):
        def one(e):
            s = f"{e[0]:g}:{e[1]:g}" + (f",{e[2]:g}" if e[2] else "")
            return s + (f"@{e[3]:g}" if e[3] else "")
        return ",".join(one(e) for e in self.entries)


class Score:
    """How a run went, accumulated one :meth:`update` at a time (every ``dt`` seconds).

    Fallen: base height below ``min_height`` or tilt (angle of the base's z axis from vertical) above
    ``max_tilt_rad``. A fall is counted when it starts (a run that starts fallen has not fallen); the robot is
    upright again after ``recover_s`` seconds out of those bounds. Velocities are compared with the command in the base frame (as the
    policy's observation and the trainers' tracking rewards have them)."""

    def __init__(self, dt, min_height=0.15, max_tilt_rad=1.0, recover_s=0.5, joint_names=None):
        self.dt, self.min_height, self.max_tilt_rad, self.recover_s = float(dt), float(min_height), \
            float(max_tilt_rad), float(recover_s)
        self.joint_names = list(joint_names) if joint_names is not None else None
        self.n = 0
        self.upright_s = 0.0
        self.falls = 0
        self._fallen, self._ok_s = None, 0.0     # None: no sample yet (a run that starts lying is no fall)
        self._start_xy = self._last_xy = None
        self.path_m = 0.0
        self._sum_v = np.zeros(3)
        self._sum_cmd = np.zeros(3)
        self._sum_err2 = np.zeros(3)
        self._tau_peak = None
        self._tau_sq = 0.0
        self._tau_count = 0

    def update(self, base_pos, base_quat, lin_vel_body, ang_vel_body, cmd=(0.0, 0.0, 0.0), torque=None):
        """One sample: base position (world), orientation (w, x, y, z), body-frame velocities, the command
        (vx, vy, yaw_rate) in force, and the joint torques."""
        self.n += 1
        w, x, y, z = base_quat
        up_z = 1 - 2 * (x * x + y * y)                 # world z of the base's z axis
        tilt = math.acos(max(-1.0, min(1.0, up_z)))
        bad = base_pos[2] < self.min_height or tilt > self.max_tilt_rad
        if self._fallen is None:
            self._fallen = bad
        elif bad:
            self._ok_s = 0.0
            if not self._fallen:
                self._fallen = True
                self.falls += 1
        elif self._fallen:
            self._ok_s += self.dt
            if self._ok_s >= self.recover_s:
                self._fallen = False
        if not self._fallen:
            self.upright_s += self.dt
        xy = (float(base_pos[0]), float(base_pos[1]))
        if self._start_xy is None:
            self._start_xy = xy
        else:
            self.path_m += math.hypot(xy[0] - self._last_xy[0], xy[1] - self._last_xy[1])
        self._last_xy = xy
        v = np.array([lin_vel_body[0], lin_vel_body[1], ang_vel_body[2]], dtype=np.float64)
        c = np.asarray(cmd, dtype=np.float64)
        self._sum_v += v
        self._sum_cmd += c
        self._sum_err2 += (v - c) ** 2
        if torque is not None:
            a = np.abs(np.asarray(torque, dtype=np.float64))
            self._tau_peak = a.copy() if self._tau_peak is None else np.maximum(self._tau_peak, a)
            self._tau_sq += float(np.dot(a, a))
            self._tau_count += a.size

    def update_from(self, robot: MujocoRobot, cmd=(0.0, 0.0, 0.0)):
        """One sample of ``robot``'s current state and last step's torques."""
        self.update(robot.base_pos, robot.base_quat, robot.base_lin_vel_body(), robot.base_ang_vel_body(), cmd,
                    robot.torque)

    def summary(self) -> dict:
        """JSON-ready figures."""
        n = max(self.n, 1)
        mean, cmd = self._sum_v / n, self._sum_cmd / n
        rms = np.sqrt(self._sum_err2 / n)
        disp = 0.0 if self._start_xy is None else math.hypot(self._last_xy[0] - self._start_xy[0],
                                                             self._last_xy[1] - self._start_xy[1])
        out = {"duration_s": self.n * self.dt, "time_upright_s": self.upright_s, "falls": self.falls,
               "distance_m": disp, "path_m": self.path_m,
               "mean_velocity": _vel(mean), "mean_command": _vel(cmd), "tracking_rms": _vel(rms),
               "torque_peak_nm": None if self._tau_peak is None else float(self._tau_peak.max()),
               "torque_rms_nm": None if not self._tau_count else math.sqrt(self._tau_sq / self._tau_count),
               "thresholds": {"min_height_m": self.min_height, "max_tilt_rad": self.max_tilt_rad,
                              "recover_s": self.recover_s}}
        if self._tau_peak is not None and self.joint_names is not None and len(self.joint_names) == \
                len(self._tau_peak):
            out["torque_peak_by_joint"] = dict(zip(self.joint_names, self._tau_peak.tolist()))
        return out


def _vel(v) -> dict:
    return {"vx": float(v[0]), "vy": float(v[1]), "yaw_rate": float(v[2])}
