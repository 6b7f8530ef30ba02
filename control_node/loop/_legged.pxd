# cython: language_level=3
"""The legged deploy units' C level, declared once (``_legged.pyx`` implements them): the observation recipe
(``obs_terms.h``) and the actuator with its modes (``actuator.h``), each a small cdef class that owns its
plan's arrays and its preallocated state. Their ``*_ptr`` methods are the nogil entry points the cycle will
call (nothing allocated, no Python object touched); the Python methods wrap them for tests and tools.
"""
from libc.stdint cimport int8_t, int32_t, int64_t


cdef extern from "obs_terms.h" nogil:
    ctypedef struct cn_obs_plan:
        int n_terms, n_robot, n_joints, n_cmd, n_act
        int quat_order, layout, fill, frame_hist
        int newest_first
        int frame_width, out_width
        int64_t k0
        double policy_dt
        const int32_t *terms
        const int32_t *joint_map
        const double *q0
        const double *scale
        const double *offset
        const double *lo
        const double *hi
        const double *params
    ctypedef struct cn_obs_signals:
        const double *joint_pos
        const double *joint_vel
        const double *quat
        const double *gyro
        const double *acc
        const double *command
    ctypedef struct cn_obs_state:
        double *frame
        double *hist
        double *last_action
        int64_t k
        int filled
    void cn_obs_reset(const cn_obs_plan *p, cn_obs_state *s)
    void cn_obs_note_action(const cn_obs_plan *p, cn_obs_state *s, const double *u)
    void cn_obs_compute(const cn_obs_plan *p, cn_obs_state *s, const cn_obs_signals *sig, double *out)


cdef extern from "actuator.h" nogil:
    enum: CN_TR_FIELDS
    enum: CN_O_ROWS
    enum: CN_MODE_POLICY_ "CN_MODE_POLICY"
    enum: CN_REQ_NO_STAND_ "CN_REQ_NO_STAND"
    enum: CN_ACT_NO_COMMAND_ "CN_ACT_NO_COMMAND"
    enum: CN_O_Q_ "CN_O_Q"
    enum: CN_O_TAU_ "CN_O_TAU"
    ctypedef struct cn_act_plan:
        int n, n_robot, n_out
        const int32_t *sens_map
        const int32_t *out_map
        const double *j
        int clip_target, rate_limit, vel_guard, policy_without_stand, stale_hold
        int64_t period_ns, stale_after_ns, pd_max_age_ns, pd_ramp_ns, stand_ns
        double stand_tol
    ctypedef struct cn_act_state:
        double *q_goal
        double *q_cmd
        double *q_start
        double *q_last
        double *tau_fresh
        int64_t *tr
        int64_t tr_cap, tr_w, tr_r, tr_dropped
        int mode, stand_done, stand_fresh, have_t_prev
        int64_t stand_t0, t_prev, cycle
        int64_t rate_limited, vel_guard_trips, tau_clipped, ramp_ticks, stale_trips, nonfinite_trips, refused
    void cn_act_reset(const cn_act_plan *p, cn_act_state *s)
    int cn_act_request(const cn_act_plan *p, cn_act_state *s, int to, int64_t t_ns)
    void cn_act_non_finite(const cn_act_plan *p, cn_act_state *s, int64_t t_ns)
    int cn_act_tick(const cn_act_plan *p, cn_act_state *s, int64_t t_ns, int64_t frame_age_ns,
                    const double *q, const double *qd, const double *a, double *out)


cdef class ObsTerms:
    cdef cn_obs_plan p
    cdef cn_obs_state s
    cdef object _keep                   # the plan's arrays and the state's buffers the structs point into
    cdef readonly object plan
    cdef readonly int out_width, n_robot, n_commands, n_actions
    cdef int _needs[6]                  # joint_pos, joint_vel, quat, gyro, acc, command: read by a term
    cdef void compute_ptr(self, const cn_obs_signals *sig, double *out) noexcept nogil
    cdef void note_action_ptr(self, const double *u) noexcept nogil
    cdef void reset_ptr(self) noexcept nogil


cdef class Actuator:
    cdef cn_act_plan p
    cdef cn_act_state s
    cdef object _keep
    cdef readonly object plan
    cdef readonly int n, n_robot, n_out
    cdef int tick_ptr(self, int64_t t_ns, int64_t frame_age_ns, const double *q, const double *qd,
                      const double *a, double *out) noexcept nogil
    cdef int request_ptr(self, int mode, int64_t t_ns) noexcept nogil
    cdef void non_finite_ptr(self, int64_t t_ns) noexcept nogil
    cdef void reset_ptr(self) noexcept nogil


cdef enum:
    LG_SLOTS = 8                        # policy slots (RtLoop's MAX_POLICIES, checked at its import)


cdef class LeggedCycle:
    cdef readonly ObsTerms obs          # slot 0's recipe (the start-up policy): the frame's layout
    cdef readonly Actuator act
    cdef void *obs_active               # the active slot's ObsTerms (borrowed: _obs_refs keeps each alive)
    cdef void *obs_slot[LG_SLOTS]
    cdef double *x_slot[LG_SLOTS]       # each slot's policy input
    cdef list _obs_refs
    cdef readonly object output, mode_ring
    cdef readonly int out_kind, frame_width, pub_width, n_robot, n_cmd
    cdef int off_q, off_qd, off_quat, off_gyro, off_acc, off_cmd
    cdef cn_obs_signals sig
    cdef const double *frame
    cdef double *x_in                   # the policy's input (obs.out_width)
    cdef double *cmd                    # the actuator's rows (CN_O_ROWS x n_out)
    cdef double *pub                    # the published command (pub_width)
    cdef int8_t *r_mode                 # the mode of each cycle (a ring of capacity)
    cdef readonly int64_t capacity, no_command
    cdef int64_t req_seq, done_seq      # the mode mailbox (control thread -> loop, release/acquire)
    cdef int req_mode, req_result
    cdef int64_t *seq_cycle             # the sequence: modes at chosen cycles (set_sequence)
    cdef int32_t *seq_mode
    cdef readonly int64_t seq_n, seq_i
    cdef object _seq
    cdef readonly int status
    cdef object _keep
    cdef void bind(self, const double *frame) noexcept nogil
    cdef bint take_request(self, int64_t t_ns, int64_t cycle, bint fresh) noexcept nogil
    cdef bint in_policy(self) noexcept nogil
    cdef double *input(self) noexcept nogil
    cdef void took(self, const double *u) noexcept nogil
    cdef void use_slot(self, int slot) noexcept nogil
    cdef void reset_slot(self, int slot) noexcept nogil
    cdef double *shadow_input(self, int slot) noexcept nogil
    cdef void shadow_took(self, int slot, const double *u) noexcept nogil
    cdef void non_finite(self, int64_t t_ns) noexcept nogil
    cdef const double *tick(self, int64_t t_ns, int64_t frame_age_ns, const double *a, int64_t cycle) noexcept nogil
    cdef bint send_nothing(self) noexcept nogil
