# cython: language_level=3
"""The loop's C-level parts, declared once (``_rtloop.pyx`` implements them).

One cycle (:meth:`RtLoop.cycle`) does everything a cycle does except sleeping and socket I/O: the
schedule (tick, decimation, phase lock, catch-up), the decision (watchdog, history, the policy or the
held/safe action), the publish (one path: protocol v1 for an argmax policy, whose action is a width-1
vector holding its class, v2 for a continuous one), the record, the canary/shadow rules and the switch
mailbox. The timer-clock and sensor-clock drivers only wait and drain. The clock and the sockets are
reached through ``_now`` / ``_sleep_until`` and libzmq function pointers, so a virtual run
(``cn_vio.h``) drives the real drivers and the real cycle with made-up times.
"""
cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint64_t

from control_node.loop._legged cimport LeggedCycle

cdef extern from "cn_vio.h" nogil:
    ctypedef struct cn_pollitem_t:
        void *socket
        int fd
        short events
        short revents
    ctypedef struct cn_vio:
        int64_t now
        int64_t read_cost_ns
        int64_t reads
        const int64_t *stall_at
        const int64_t *stall_ns
        int64_t n_stalls, i_stall
        const int64_t *arrive
        const int64_t *off
        const uint8_t *data
        const uint8_t *more
        int64_t n_frames, i_frame
        int last_more
        uint8_t *out
        int32_t *out_len
        int64_t out_cap, out_stride, n_sent
    int64_t cn_vio_now(cn_vio *v)
    void cn_vio_sleep_until(cn_vio *v, int64_t t)
    int cn_vio_recv(void *s, void *buf, size_t n, int flags)
    int cn_vio_send(void *s, const void *buf, size_t n, int flags)
    int cn_vio_getsockopt(void *s, int opt, void *val, size_t *n)
    int cn_vio_errno()
    int cn_vio_poll(cn_pollitem_t *items, int n, long timeout_ms)

ctypedef int (*zmq_recv_t)(void *s, void *buf, size_t n, int flags) noexcept nogil
ctypedef int (*zmq_send_t)(void *s, const void *buf, size_t n, int flags) noexcept nogil
ctypedef int (*zmq_getsockopt_t)(void *s, int opt, void *val, size_t *n) noexcept nogil
ctypedef int (*zmq_errno_t)() noexcept nogil
ctypedef int (*zmq_poll_t)(cn_pollitem_t *items, int n, long timeout_ms) noexcept nogil

cdef enum:
    MAX_POLICIES = 8           # policy slots (control_node.rundir.MAX_POLICIES, checked at import)
    CN_N_REASONS_CAP = 16      # >= frame_codec.h's CN_N_REASONS (checked at import)


cdef class VirtualIO:
    """Made-up frame arrivals, stalls and a clock for :meth:`RtLoop.run_virtual` (tests)."""
    cdef cn_vio v
    cdef object _keep
    cdef readonly int64_t out_stride


@cython.final
cdef class RtLoop:
    # ---- policy slots and the switch mailbox (control thread -> loop, release/acquire) ----
    # slot_pol[i] is a Policy (borrowed: _slot_refs[i] holds it); pol the active one, the one pointer a
    # switch exchanges. Each slot has its safe action (width uw: n_actions, or 1 holding an argmax class)
    cdef void *pol
    cdef void *slot_pol[MAX_POLICIES]
    cdef double *slot_safe                  # MAX_POLICIES x uw
    cdef list _slot_refs
    cdef readonly int active, previous, shadow
    cdef readonly bint canary
    cdef int64_t req_seq, done_seq
    cdef int req_kind, req_slot, req_result
    cdef int64_t *tr                        # transitions (loop -> control thread), tr_count published
    cdef int64_t tr_count
    # canary rules (control_node.config [rollout]); counts of the running canary
    cdef public int64_t canary_ticks, canary_window, canary_budget_ns, canary_max_over
    cdef public double canary_max_disagree, shadow_distance
    cdef readonly int64_t canary_done, canary_over, window_ticks, window_disagree
    cdef readonly int64_t shadow_ticks, shadow_disagree, shadow_nonfinite, shadow_ns_max, shadow_ns_sum

    # ---- sockets and the clock (real libzmq, or a VirtualIO) ----
    cdef void *sub
    cdef void *pub
    cdef zmq_recv_t z_recv
    cdef zmq_send_t z_send
    cdef zmq_getsockopt_t z_getsockopt
    cdef zmq_errno_t z_errno
    cdef zmq_poll_t z_poll
    cdef cn_vio *vio                        # NULL: CLOCK_MONOTONIC and the real sockets
    cdef bint has_sockets
    cdef volatile int stop_flag
    cdef public volatile int waiting        # the driver reached its wait: the node is ready (sensor clock)

    # ---- the schedule (settings, then the driver's state between cycles) ----
    cdef public int64_t period_ns, deadline_ns, stale_after_ns, spin_ns, max_cycles, run_until_ns
    cdef public int sensor_clock, catch_up_skip, hold_last, n_features
    cdef readonly int decimation
    cdef int64_t k, next_due, prev_wake     # tick number, next policy tick, the last wake
    # phase lock (timer clock): the schedule's offset, moved so frames land phase_margin_ns before the tick
    cdef readonly bint phase_lock
    cdef readonly int64_t phase_margin_ns, phase_max_slew_ns, phase_offset_ns
    cdef readonly int64_t phase_shifts, phase_shift_abs_ns, phase_shift_max_ns, phase_error_ns
    cdef readonly int64_t phase_early, phase_min_step_ns, phase_step_ns
    cdef int phase_dir
    cdef int64_t phase_run

    # ---- the frame (the drain's result) and the decision ----
    cdef uint64_t seq                       # the last accepted frame's seq / t_ns
    cdef int64_t tns, last_rx
    cdef bint have_seq, stale_state, last_safe
    cdef readonly int history, frame_width
    cdef readonly bint history_newest_first
    cdef bint infer_pending             # a policy tick came and the policy has not run since
    cdef bint fresh                     # a valid frame arrived that the policy has not acted on
    cdef int h_head, h_count            # history ring: slot of the newest frame, frames held (0: refill)
    cdef uint64_t act_seq               # the frame the last inference acted on (published on hold ticks)
    cdef int64_t act_tns
    cdef bint act_have
    cdef readonly bint continuous       # the policy's head: continuous (v2 actions) or argmax (v1)
    cdef readonly int n_actions
    cdef int uw                         # action width: n_actions, or 1 (an argmax class)
    cdef public bint reset_on_trip      # recurrent policies: zero the state when the watchdog trips
    cdef readonly int64_t state_resets
    cdef const double *x_used           # this tick's policy input and the active policy's return code
    cdef int rc_used
    cdef size_t rx_cap
    cdef object _keep
    cdef uint8_t *rx
    cdef uint8_t *tx                    # the encoded action, sized for the policy's message at init
    cdef readonly size_t tx_cap
    cdef double *x_cur
    cdef double *x_new
    cdef double *scratch
    cdef double *x_in                   # the policy's input: history frames stacked (history > 1)
    cdef double *h_ring                 # the last `history` frames acted on, frame_width each
    cdef double *u_new                  # the policy's output, the last good action, the shadow's output,
    cdef double *u_last                 # the active slot's safe action (uw each)
    cdef double *u_shadow
    cdef double *u_safe
    cdef bint u_have_good
    # the legged deploy path (control_node.loop._legged): the frame is the robot's raw signals, the policy's
    # input is built from them and the actuator's command is published (pub_width values); None otherwise
    cdef readonly object legged
    cdef void *lg                       # borrowed: legged, for the nogil cycle
    cdef readonly int pub_width         # values published per cycle: n_actions, or the legged command's

    # ---- the record ----
    cdef readonly int64_t cycles, deadline_misses, skipped_ticks, stale_cycles, safe_actions
    cdef readonly int64_t superseded, frames_valid, send_failures, recv_errors, t0_ns, t_end_ns
    cdef readonly int64_t inference_ticks
    cdef int64_t rejected[CN_N_REASONS_CAP]
    cdef readonly int64_t capacity
    cdef int64_t *r_cycle
    cdef int64_t *r_tick
    cdef int64_t *r_wake
    cdef int64_t *r_recv
    cdef int64_t *r_infer
    cdef int64_t *r_pub
    cdef int64_t *r_cycle_time
    cdef int64_t *r_period
    cdef int64_t *r_age
    cdef uint8_t *r_flags
    cdef int16_t *r_action
    cdef uint64_t *r_seq
    cdef int8_t *r_policy
    cdef uint8_t *r_shadow
    cdef float *r_shadow_dist
    cdef int64_t *r_shadow_ns
    cdef int64_t *hist
    cdef readonly object ring
    cdef readonly object histograms
    cdef readonly int64_t action_capacity   # continuous: the published action of the last cycles (float32)
    cdef readonly object action_ring
    cdef float *r_u

    # ---- the clock ----
    cdef int64_t _now(self) noexcept nogil
    cdef void _sleep_until(self, int64_t t) noexcept nogil
    cdef int64_t _wait_until(self, int64_t t) noexcept nogil
    # ---- the drivers (wait and drain) and the one cycle ----
    cdef void _run_timer_clock(self) noexcept nogil
    cdef void _run_sensor_clock(self) noexcept nogil
    cdef int _drain(self) noexcept nogil
    cdef void cycle(self, int64_t t_wake, int got, bint early) noexcept nogil
    # ---- the decision ----
    cdef bint _schedule(self, int got, bint due, int64_t t_wake, bint *stale_now, uint8_t *flags) noexcept nogil
    cdef double *_policy_input(self) noexcept nogil
    cdef int _infer(self, void *policy, const double *x, double *u) noexcept nogil
    cdef const double *_decide(self, int got, bint due, int64_t t_wake, uint8_t *flags) noexcept nogil
    cdef void _phase_step(self, int64_t tick, int64_t tns, bint early) noexcept nogil
    # ---- publish and record ----
    cdef void _publish(self, uint64_t seq, bint have_seq, int64_t tns, const double *u, bint safe) noexcept nogil
    cdef void _record(self, int64_t tick, int64_t wake_lat, int64_t t_wake, int64_t t_recv, int64_t t_infer,
                      int64_t t_pub, int64_t period, int64_t age, uint8_t flags, int action,
                      uint64_t seq) noexcept nogil
    cdef void _act(self, int64_t tick, int64_t wake_lat, int64_t t_wake, int64_t period, int got,
                   bint due) noexcept nogil
    # ---- slots, mailbox, canary and shadow ----
    cdef void _use(self, int slot) noexcept nogil
    cdef void _transition(self, int kind, int slot, int from_slot, int why) noexcept nogil
    cdef void _start_shadow(self, int slot) noexcept nogil
    cdef void _canary_rollback(self, int why) noexcept nogil
    cdef void _apply_request(self) noexcept nogil
    cdef int _run_shadow(self) noexcept nogil
    cdef void _canary_tick(self, int64_t cycle_time, int sh) noexcept nogil
