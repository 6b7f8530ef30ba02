# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Thin typed wrappers of the legged deploy units (``obs_terms.h``, ``actuator.h``; declared in ``_legged.pxd``).

Each class takes a plan built and checked off the RT thread (``control_node.loop.legged``), keeps the plan's
arrays and its own preallocated state alive, and points the C structs at them once. The per-call methods
(:meth:`ObsTerms.compute`, :meth:`Actuator.tick`, ...) only check their arguments' types and shapes (no
allocation: nothing but pointer reads on the success path), then run the C unit without the GIL.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int8_t, int32_t, int64_t
from libc.string cimport memcpy

from control_node.kernels._policy cimport Policy
from control_node.loop import legged

cnp.import_array()


from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec     # Cython's own POSIX declarations


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t> ts.tv_sec * 1000000000 + ts.tv_nsec


cdef extern from "cn_sync.h" nogil:
    int64_t cn_load_acquire(const int64_t *p)
    void cn_store_release(int64_t *p, int64_t v)

_SIGNAL_NAMES = ("joint_pos", "joint_vel", "quat", "gyro", "acc", "command")


cdef inline const double *_vec(object x, Py_ssize_t n, object what, bint optional) except? NULL:
    """The data of a C-contiguous float64 1-D array of n values, checked without allocating; None -> NULL when
    ``optional`` (the plan does not read it)."""
    cdef cnp.ndarray a
    if x is None and optional:
        return NULL
    if cnp.PyArray_CheckExact(x):
        a = <cnp.ndarray> x
        if (cnp.PyArray_TYPE(a) == cnp.NPY_DOUBLE and cnp.PyArray_NDIM(a) == 1 and cnp.PyArray_DIM(a, 0) == n
                and cnp.PyArray_IS_C_CONTIGUOUS(a)):
            return <const double *> cnp.PyArray_DATA(a)
    raise TypeError(f"{what} must be a C-contiguous float64 ndarray of shape ({n},); got {type(x).__name__} "
                    f"{getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}. Convert once with "
                    "np.ascontiguousarray(x, dtype=np.float64) and reuse the array.")


cdef inline double *_out(object x, Py_ssize_t rows, Py_ssize_t n, object what) except NULL:
    cdef cnp.ndarray a
    if cnp.PyArray_CheckExact(x):
        a = <cnp.ndarray> x
        if (cnp.PyArray_TYPE(a) == cnp.NPY_DOUBLE and cnp.PyArray_IS_C_CONTIGUOUS(a)
                and cnp.PyArray_ISWRITEABLE(a) and cnp.PyArray_SIZE(a) == rows * n
                and (cnp.PyArray_NDIM(a) == 1 or (cnp.PyArray_NDIM(a) == 2 and cnp.PyArray_DIM(a, 0) == rows))):
            return <double *> cnp.PyArray_DATA(a)
    shape = f"({n},)" if rows == 1 else f"({rows}, {n})"
    raise TypeError(f"{what} must be a writeable C-contiguous float64 ndarray of shape {shape}; got "
                    f"{type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}")


def _c(a, dtype):
    return np.ascontiguousarray(a, dtype=dtype)


cdef class ObsTerms:
    """The observation recipe: ``compute(joint_pos, joint_vel, quat, gyro, acc, command, out)`` once per policy
    tick; ``note_action(u)`` after the policy ran (the next tick's last_action); ``reset()`` when the policy is
    entered. A signal the plan does not read may be None."""

    def __cinit__(self, plan):
        if not isinstance(plan, legged.ObsPlan):
            raise TypeError("ObsTerms(plan): plan must come from control_node.loop.legged.build_obs_plan")
        self.plan = plan
        terms, jmap = _c(plan.terms, np.int32), _c(plan.joint_map, np.int32)
        dbl = [_c(getattr(plan, k), np.float64) for k in ("q0", "scale", "offset", "lo", "hi", "params")]
        frame, hist = np.zeros(max(1, plan.frame_width)), np.zeros(max(1, plan.out_width))
        last = np.zeros(max(1, plan.n_act))
        self._keep = (terms, jmap, *dbl, frame, hist, last)
        p = &self.p
        p.n_terms, p.n_robot, p.n_joints = terms.shape[0], plan.n_robot, plan.n_joints
        p.n_cmd, p.n_act, p.quat_order, p.layout = plan.n_cmd, plan.n_act, plan.quat_order, plan.layout
        p.fill, p.frame_hist, p.frame_width, p.out_width = plan.fill, plan.frame_hist, plan.frame_width, plan.out_width
        p.k0, p.policy_dt, p.newest_first = plan.k0, plan.policy_dt, plan.newest_first
        p.terms = <const int32_t *> cnp.PyArray_DATA(terms)
        p.joint_map = <const int32_t *> cnp.PyArray_DATA(jmap)
        p.q0 = <const double *> cnp.PyArray_DATA(dbl[0])
        p.scale = <const double *> cnp.PyArray_DATA(dbl[1])
        p.offset = <const double *> cnp.PyArray_DATA(dbl[2])
        p.lo = <const double *> cnp.PyArray_DATA(dbl[3])
        p.hi = <const double *> cnp.PyArray_DATA(dbl[4])
        p.params = <const double *> cnp.PyArray_DATA(dbl[5])
        self.s.frame = <double *> cnp.PyArray_DATA(frame)
        self.s.hist = <double *> cnp.PyArray_DATA(hist)
        self.s.last_action = <double *> cnp.PyArray_DATA(last)
        self.out_width, self.n_robot, self.n_commands, self.n_actions = plan.out_width, plan.n_robot, plan.n_cmd, \
            plan.n_act
        for i, name in enumerate(_SIGNAL_NAMES):
            self._needs[i] = name in plan.uses
        cn_obs_reset(&self.p, &self.s)

    cdef void compute_ptr(self, const cn_obs_signals *sig, double *out) noexcept nogil:
        cn_obs_compute(&self.p, &self.s, sig, out)

    cdef void note_action_ptr(self, const double *u) noexcept nogil:
        cn_obs_note_action(&self.p, &self.s, u)

    cdef void reset_ptr(self) noexcept nogil:
        cn_obs_reset(&self.p, &self.s)

    def reset(self):
        """The policy was entered: last action, history and gait clock start again."""
        self.reset_ptr()

    def note_action(self, u):
        """The policy's raw output of the tick just run (float64, n_actions): the next last_action."""
        cdef const double *up = _vec(u, self.n_actions, "u", False)
        self.note_action_ptr(up)

    def compute(self, joint_pos, joint_vel, quat, gyro, acc, command, out):
        """One policy tick into ``out`` (float64, out_width); allocates nothing."""
        cdef cn_obs_signals sig
        # a signal no term reads is not looked at (NULL for the C unit, which never reads it)
        sig.joint_pos = _vec(joint_pos, self.n_robot, "joint_pos", False) if self._needs[0] else NULL
        sig.joint_vel = _vec(joint_vel, self.n_robot, "joint_vel", False) if self._needs[1] else NULL
        sig.quat = _vec(quat, 4, "quat", False) if self._needs[2] else NULL
        sig.gyro = _vec(gyro, 3, "gyro", False) if self._needs[3] else NULL
        sig.acc = _vec(acc, 3, "acc", False) if self._needs[4] else NULL
        sig.command = _vec(command, self.n_commands, "command", False) if self._needs[5] else NULL
        cdef double *op = _out(out, 1, self.out_width, "out")
        with nogil:
            self.compute_ptr(&sig, op)

    @property
    def ticks(self):
        """Policy ticks computed since the last reset (the gait clock's k is first_tick + ticks)."""
        return self.s.k


cdef class Actuator:
    """The action path at loop rate and the modes: ``tick(t_ns, frame_age_ns, q, qd, action_or_None, out)``
    every loop tick (out: float64 (6, n_out): q*, qd*, kp, kd, tau_ff, tau; returns the mode | NO_COMMAND |
    RAMPING), ``request_mode(mode, t_ns)`` (legged.REQ_*), ``drain_transitions()`` (off the RT path)."""

    def __cinit__(self, plan):
        if not isinstance(plan, legged.ActuatorPlan):
            raise TypeError("Actuator(plan): plan must come from control_node.loop.legged.build_actuator_plan")
        self.plan = plan
        sens, outm, j = _c(plan.sens_map, np.int32), _c(plan.out_map, np.int32), _c(plan.j, np.float64)
        n = plan.n
        if j.shape != (len(legged.J_FIELDS), n):
            raise ValueError(f"plan.j has shape {j.shape}; expected {(len(legged.J_FIELDS), n)}")
        bufs = [np.zeros(n) for _ in range(5)]
        tr = np.zeros((legged.TR_CAP, CN_TR_FIELDS), dtype=np.int64)
        self._keep = (sens, outm, j, bufs, tr)
        p = &self.p
        p.n, p.n_robot, p.n_out = n, plan.n_robot, plan.n_out
        p.sens_map = <const int32_t *> cnp.PyArray_DATA(sens)
        p.out_map = <const int32_t *> cnp.PyArray_DATA(outm)
        p.j = <const double *> cnp.PyArray_DATA(j)
        p.clip_target, p.rate_limit, p.vel_guard = plan.clip_target, plan.rate_limit, plan.vel_guard
        p.policy_without_stand, p.stale_hold = plan.policy_without_stand, plan.stale_hold
        p.period_ns, p.stale_after_ns, p.pd_max_age_ns = plan.period_ns, plan.stale_after_ns, plan.pd_max_age_ns
        p.pd_ramp_ns, p.stand_ns, p.stand_tol = plan.pd_ramp_ns, plan.stand_ns, plan.stand_tol
        s = &self.s
        s.q_goal = <double *> cnp.PyArray_DATA(bufs[0])
        s.q_cmd = <double *> cnp.PyArray_DATA(bufs[1])
        s.q_start = <double *> cnp.PyArray_DATA(bufs[2])
        s.q_last = <double *> cnp.PyArray_DATA(bufs[3])
        s.tau_fresh = <double *> cnp.PyArray_DATA(bufs[4])
        s.tr = <int64_t *> cnp.PyArray_DATA(tr)
        s.tr_cap = legged.TR_CAP
        self.n, self.n_robot, self.n_out = n, plan.n_robot, plan.n_out
        cn_act_reset(&self.p, &self.s)

    cdef int tick_ptr(self, int64_t t_ns, int64_t frame_age_ns, const double *q, const double *qd,
                      const double *a, double *out) noexcept nogil:
        return cn_act_tick(&self.p, &self.s, t_ns, frame_age_ns, q, qd, a, out)

    cdef int request_ptr(self, int mode, int64_t t_ns) noexcept nogil:
        return cn_act_request(&self.p, &self.s, mode, t_ns)

    cdef void non_finite_ptr(self, int64_t t_ns) noexcept nogil:
        cn_act_non_finite(&self.p, &self.s, t_ns)

    cdef void reset_ptr(self) noexcept nogil:
        cn_act_reset(&self.p, &self.s)

    def reset(self):
        """Back to passive, every counter and the transition ring emptied."""
        self.reset_ptr()

    def tick(self, int64_t t_ns, int64_t frame_age_ns, q, qd, action, out):
        """One loop tick (see the class); ``action`` None on a hold tick. Allocates nothing."""
        cdef const double *qp = _vec(q, self.n_robot, "q", False)
        cdef const double *qdp = _vec(qd, self.n_robot, "qd", False)
        cdef const double *ap = _vec(action, self.n, "action", True)
        cdef double *op = _out(out, CN_O_ROWS, self.n_out, "out")
        cdef int rc
        with nogil:
            rc = self.tick_ptr(t_ns, frame_age_ns, qp, qdp, ap, op)
        return rc

    def request_mode(self, mode, int64_t t_ns=0):
        """Ask for ``mode`` (a name of legged.MODES or its index): legged.REQ_OK, REQ_NO_STAND (policy before
        a completed stand) or REQ_BAD_MODE. Recorded (when it changes the mode) with the next tick's cycle."""
        cdef int m = legged.MODES.index(mode) if isinstance(mode, str) else int(mode)
        return self.request_ptr(m, t_ns)

    def report_non_finite(self, int64_t t_ns):
        """The policy's output was not finite (its kernel returned -1): damping when in policy mode."""
        self.non_finite_ptr(t_ns)

    def drain_transitions(self):
        """The transitions not read yet, oldest first: a list of (cycle, t_ns, from, to, reason) tuples
        (modes: legged.MODES indices; reason: legged.REASONS index). Allocates: not for the RT thread."""
        out = []
        cdef int64_t *r
        while self.s.tr_r < self.s.tr_w:
            r = self.s.tr + (self.s.tr_r % self.s.tr_cap) * CN_TR_FIELDS
            out.append((r[0], r[1], int(r[2]), int(r[3]), int(r[4])))
            self.s.tr_r += 1
        return out

    @property
    def mode(self):
        return self.s.mode

    @property
    def stand_done(self):
        return bool(self.s.stand_done)

    @property
    def counts(self):
        """Each limit and fault, counted whenever it acted (legged.ActRefState.counts has the same keys)."""
        return {"rate_limited": self.s.rate_limited, "velocity_guard": self.s.vel_guard_trips,
                "tau_clipped": self.s.tau_clipped, "pd_ramp_ticks": self.s.ramp_ticks,
                "stale_trips": self.s.stale_trips, "non_finite_trips": self.s.nonfinite_trips,
                "refused": self.s.refused, "transitions_dropped": self.s.tr_dropped}


cdef class LeggedCycle:
    """The legged deploy path of one node, as the loop's cycle calls it (``_rtloop.pyx``): the frame is the
    robot's named raw signals (``legged.frame_layout``), the observation recipe builds the policy's input from
    them on each policy tick, and the actuator turns the held action into the published command every tick.

    ``output``: what is published each tick (``legged.OUTPUTS``): "torque" (tau, actuator order), "position"
    (q*), or "impedance" (q*, qd*, kp, kd, tau_ff: 5 rows of the actuators). Mode requests come from the
    control thread through a one-entry mailbox (release/acquire, as the loop's policy mailbox) and are taken
    at the start of a cycle; the mode of every cycle is kept in a ring of ``capacity`` cycles."""

    def __cinit__(self, obs_plan, act_plan, output="torque", int64_t capacity=100_000, start_mode="passive"):
        if output not in legged.OUTPUTS:
            raise ValueError(f"output {output!r}: use one of {', '.join(legged.OUTPUTS)}")
        if obs_plan.n_act != act_plan.n or obs_plan.n_robot != act_plan.n_robot:
            raise ValueError("the observation and actuator plans are of different recipes")
        self.obs = ObsTerms(obs_plan)
        self.act = Actuator(act_plan)
        self._obs_refs = [None] * LG_SLOTS
        cdef int i
        for i in range(LG_SLOTS):
            self.obs_slot[i] = NULL
            self.x_slot[i] = NULL
        self.output = output
        self.out_kind = legged.OUTPUTS.index(output)
        layout = legged.frame_layout(obs_plan)
        off = {name: o for name, o, _ in layout}
        self.frame_width = sum(w for _, _, w in layout)
        self.off_q, self.off_qd, self.off_quat = off["joint_pos"], off["joint_vel"], off["imu_quat"]
        self.off_gyro, self.off_acc, self.off_cmd = off["imu_gyro"], off["imu_acc"], off["command"]
        self.n_robot, self.n_cmd = obs_plan.n_robot, obs_plan.n_cmd
        cdef int n_out = act_plan.n_out
        cdef int ow = self.obs.out_width
        self.pub_width = legged.OUTPUT_ROWS[output] * n_out
        bufs = np.zeros(self.obs.out_width + CN_O_ROWS * n_out + self.pub_width + self.frame_width)
        self.capacity = max(capacity, 1)
        modes = np.zeros(self.capacity, dtype=np.int8)
        self._keep = (bufs, modes)
        self.x_in = <double *> cnp.PyArray_DATA(bufs)
        self.cmd = self.x_in + ow
        self._obs_refs[0] = (self.obs, bufs)
        self.obs_slot[0] = <void *> self.obs
        self.x_slot[0] = self.x_in
        self.obs_active = self.obs_slot[0]
        self.pub = self.cmd + CN_O_ROWS * n_out
        self.bind(self.pub + self.pub_width)       # a zero frame until the loop binds its own
        self.r_mode = <int8_t *> cnp.PyArray_DATA(modes)
        self.mode_ring = modes
        self.req_seq = self.done_seq = 0
        self.req_mode = self.req_result = 0
        self.status = 0
        self.no_command = 0
        self.set_sequence([])
        if start_mode != "passive":
            rc = self.act.request_mode(start_mode, 0)
            if rc != legged.REQ_OK:
                raise ValueError(f"start mode {start_mode!r} refused ({legged.REQ_NAMES[rc]})")

    cdef void bind(self, const double *frame) noexcept nogil:
        """Point the signals at ``frame`` (the loop's newest valid frame: a buffer fixed for the run)."""
        self.frame = frame
        self.sig.joint_pos = frame + self.off_q
        self.sig.joint_vel = frame + self.off_qd
        self.sig.quat = frame + self.off_quat
        self.sig.gyro = frame + self.off_gyro
        self.sig.acc = frame + self.off_acc
        self.sig.command = frame + self.off_cmd

    cdef bint take_request(self, int64_t t_ns, int64_t cycle, bint fresh) noexcept nogil:
        """At the start of a cycle: a posted mode request, then the sequence's entry due at ``cycle``. A
        sequence entry waits while no frame is fresh (``fresh``: one came within stale_after: a stand ramps from
        the measured pose), and a policy entry while the stand has not completed. True when the policy mode was
        entered: its observation state (last action, history, gait clock) then starts again."""
        cdef int was = self.act.s.mode, rc
        if cn_load_acquire(&self.req_seq) != self.done_seq:
            self.req_result = self.act.request_ptr(self.req_mode, t_ns)
            cn_store_release(&self.done_seq, self.req_seq)
        if self.seq_i < self.seq_n and cycle >= self.seq_cycle[self.seq_i] and fresh:
            rc = self.act.request_ptr(self.seq_mode[self.seq_i], t_ns)
            if rc != CN_REQ_NO_STAND_:
                self.seq_i += 1
        cdef bint entered = was != CN_MODE_POLICY_ and self.act.s.mode == CN_MODE_POLICY_
        if entered:
            (<ObsTerms> self.obs_active).reset_ptr()
        return entered

    cdef bint in_policy(self) noexcept nogil:
        return self.act.s.mode == CN_MODE_POLICY_

    cdef double *input(self) noexcept nogil:
        """The active policy's input for this policy tick, from the newest frame's signals."""
        (<ObsTerms> self.obs_active).compute_ptr(&self.sig, self.x_in)
        return self.x_in

    cdef void took(self, const double *u) noexcept nogil:
        """The active policy's raw output of this tick: its next tick's last_action."""
        (<ObsTerms> self.obs_active).note_action_ptr(u)

    cdef void use_slot(self, int slot) noexcept nogil:
        """The policy of ``slot`` is the active one: its recipe builds the input (a switch, between cycles)."""
        self.obs_active = self.obs_slot[slot]
        self.x_in = self.x_slot[slot]

    cdef void reset_slot(self, int slot) noexcept nogil:
        """The policy of ``slot`` is entered (activated, or started as the shadow): its last action, history and
        gait clock start again."""
        (<ObsTerms> self.obs_slot[slot]).reset_ptr()

    cdef double *shadow_input(self, int slot) noexcept nogil:
        """The shadow's own input (its last action, history, clock) from the same frame."""
        (<ObsTerms> self.obs_slot[slot]).compute_ptr(&self.sig, self.x_slot[slot])
        return self.x_slot[slot]

    cdef void shadow_took(self, int slot, const double *u) noexcept nogil:
        (<ObsTerms> self.obs_slot[slot]).note_action_ptr(u)

    cdef void non_finite(self, int64_t t_ns) noexcept nogil:
        self.act.non_finite_ptr(t_ns)

    cdef const double *tick(self, int64_t t_ns, int64_t frame_age_ns, const double *a, int64_t cycle) noexcept nogil:
        """Every loop tick: the actuator from the newest frame's q, qd (``frame_age_ns`` old; INT64_MAX before the
        first) and this tick's action (NULL on a hold tick); returns the command to publish (pub_width values)."""
        self.status = self.act.tick_ptr(t_ns, frame_age_ns, self.sig.joint_pos, self.sig.joint_vel, a, self.cmd)
        cdef int n_out = self.act.n_out, rows = 1, first = CN_O_TAU_
        if self.out_kind == 1:
            first = CN_O_Q_
        elif self.out_kind == 2:
            first, rows = CN_O_Q_, 5
        memcpy(self.pub, self.cmd + first * n_out, sizeof(double) * rows * n_out)
        self.r_mode[cycle % self.capacity] = <int8_t> self.act.s.mode
        if self.status & CN_ACT_NO_COMMAND_:
            self.no_command += 1
        return self.pub

    cdef bint send_nothing(self) noexcept nogil:
        """Passive with position output: no command at all (a torque or impedance command of zero gains is sent)."""
        return (self.status & CN_ACT_NO_COMMAND_) != 0 and self.out_kind == 1

    # ---- Python side (the control thread, the node) ----
    def set_slot_obs(self, int slot, obs_plan):
        """The recipe of the policy loaded into ``slot`` (a slot the loop does not use: RtLoop.set_slot checks),
        checked off the RT thread to read the same frame and drive the same actuators (control_node.deploy)."""
        if not 0 < slot < LG_SLOTS:
            raise ValueError(f"slot must be 1 to {LG_SLOTS - 1} (0 is the start-up policy's)")
        if (obs_plan.n_act != self.act.n or obs_plan.n_robot != self.n_robot or obs_plan.n_cmd != self.n_cmd
                or legged.frame_layout(obs_plan) != legged.frame_layout(self.obs.plan)):
            raise ValueError("the recipe reads another frame or drives other joints than the running one")
        o = ObsTerms(obs_plan)
        buf = np.zeros(max(1, o.out_width))
        self._obs_refs[slot] = (o, buf)
        self.x_slot[slot] = <double *> cnp.PyArray_DATA(buf)
        self.obs_slot[slot] = <void *> o

    def slot_width(self, int slot):
        """The policy input width of ``slot``'s recipe (None: no recipe set)."""
        r = self._obs_refs[slot] if 0 <= slot < LG_SLOTS else None
        return None if r is None else r[0].out_width

    def clear_slot_obs(self, int slot):
        if 0 < slot < LG_SLOTS:
            self.obs_slot[slot] = NULL
            self.x_slot[slot] = NULL
            self._obs_refs[slot] = None

    def post_mode(self, mode):
        """Post a mode request for the loop (one at a time); returns its number for :meth:`mode_done`."""
        if cn_load_acquire(&self.done_seq) != self.req_seq:
            raise RuntimeError("a mode request is still pending")
        if mode not in legged.MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(legged.MODES)}")
        self.req_mode = legged.MODES.index(mode)
        cn_store_release(&self.req_seq, self.req_seq + 1)
        return self.req_seq

    def mode_done(self, int64_t seq):
        """None while request ``seq`` is pending, else its result (legged.REQ_*)."""
        if cn_load_acquire(&self.done_seq) < seq:
            return None
        return self.req_result

    def set_sequence(self, entries):
        """Modes at chosen cycles: ``entries`` [(cycle, mode name)], cycles increasing (before the run). The
        launch demo's stand -> policy -> damping, and the rule tests' request schedule."""
        cyc = np.array([int(c) for c, _ in entries] or [0], dtype=np.int64)
        for _, m in entries:
            if m not in legged.MODES:
                raise ValueError(f"mode {m!r}: use one of {', '.join(legged.MODES)}")
        if entries and (np.diff(cyc) < 0).any():
            raise ValueError("sequence cycles must not decrease")
        mod = np.array([legged.MODES.index(m) for _, m in entries] or [0], dtype=np.int32)
        self._seq = (cyc, mod)
        self.seq_cycle = <int64_t *> cnp.PyArray_DATA(cyc)
        self.seq_mode = <int32_t *> cnp.PyArray_DATA(mod)
        self.seq_n, self.seq_i = len(entries), 0

    def apply_pending(self, int64_t t_ns=0, int64_t cycle=0, bint fresh=True):
        """Take a posted request (and a due sequence entry) now: only while the loop is not running."""
        with nogil:
            self.take_request(t_ns, cycle, fresh)

    @property
    def mode(self):
        """The current mode's name (read from another thread: one int)."""
        return legged.MODES[self.act.s.mode]

    @property
    def stand_done(self):
        return bool(self.act.s.stand_done)

    def published(self):
        """A copy of the last published command (tests)."""
        return np.array([self.pub[j] for j in range(self.pub_width)], dtype=np.float64)

    def time_paths(self, Policy policy, int calls=2000, int samples=200):
        """Per-call cost (ns, one value per sample: the mean of ``calls`` back-to-back calls timed in C) of
        each part of a legged cycle, on this object's own frame buffer (a unit quaternion, the default pose):
        ``recipe`` (the observation, once per policy tick), ``policy`` (the kernel on it), ``tick_hold`` (the
        actuator on a hold tick) and ``tick_action`` (on a policy tick). For `control-node bench legged`; the
        units' state is reset afterwards."""
        if policy.n_features != self.obs.out_width or policy.n_actions != self.act.n:
            raise ValueError("the policy does not fit this recipe")
        frame = np.zeros(self.frame_width)
        frame[self.off_quat] = 1.0 if self.obs.plan.quat_order == 0 else 0.0
        frame[self.off_quat + 3] = 1.0 if self.obs.plan.quat_order == 1 else 0.0
        frame[self.off_acc + 2] = 9.81
        a = np.full(self.act.n, 0.1)
        out = np.zeros((4, samples), dtype=np.int64)
        cdef const double *saved = self.frame
        cdef double *fp = <double *> cnp.PyArray_DATA(frame)
        cdef double *ap = <double *> cnp.PyArray_DATA(a)
        cdef int64_t[:, ::1] o = out
        cdef int s, i
        cdef int64_t t0
        cdef double *x
        cdef void *pol = <void *> policy
        self.bind(fp)
        self.act.request_ptr(CN_MODE_POLICY_, 0)       # only the policy mode runs every part
        with nogil:
            for s in range(samples):
                t0 = _now_ns()
                for i in range(calls):
                    x = self.input()
                o[0, s] = (_now_ns() - t0) // calls
                t0 = _now_ns()
                for i in range(calls):
                    (<Policy> pol).act_ptr(x, ap)
                o[1, s] = (_now_ns() - t0) // calls
                t0 = _now_ns()
                for i in range(calls):
                    self.tick(t0 + i, 0, NULL, 0)
                o[2, s] = (_now_ns() - t0) // calls
                t0 = _now_ns()
                for i in range(calls):
                    ap[0] = 0.1
                    self.tick(t0 + i, 0, ap, 0)
                o[3, s] = (_now_ns() - t0) // calls
        self.bind(saved)
        self.obs.reset_ptr()
        self.act.reset_ptr()
        return {"recipe": out[0], "policy": out[1], "tick_hold": out[2], "tick_action": out[3]}
