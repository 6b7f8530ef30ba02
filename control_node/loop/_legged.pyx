# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Thin typed wrappers of the legged deploy units (``obs_terms.h``, ``actuator.h``; declared in ``_legged.pxd``).

Each class takes a plan built and checked off the RT thread (``control_node.loop.legged``), keeps the plan's
arrays and its own preallocated state alive, and points the C structs at them once. The per-call methods
(:meth:`ObsTerms.compute`, :meth:`Actuator.tick`, ...) only check their arguments' types and shapes (no
allocation: nothing but pointer reads on the success path), then run the C unit without the GIL.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t

from control_node.loop import legged

cnp.import_array()

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
