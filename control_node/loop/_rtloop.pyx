# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The node's hot path: one cycle = wait for the tick, read, infer, write, record.

Everything runs without the GIL and without touching a Python object: libzmq is
called through function pointers taken from the library pyzmq itself loaded (no
build-time link against pyzmq's privately named copy), frames are decoded by
``frame_codec.h`` into a preallocated buffer, the policy runs through
``Policy.predict_ptr`` (argmax: the class, protocol v1) or ``Policy.act_ptr``
(continuous: the action vector, protocol v2), and each cycle's figures go into
preallocated arrays. Python sets it all up (``control_node.node``) and reads the
results afterwards.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int16_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

from control_node.kernels._policy cimport Policy

from control_node import rundir
from control_node.rundir import HIST_NAMES, REASONS

cnp.import_array()


cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)
    int clock_nanosleep(int clk, int flags, const timespec *req, timespec *rem)
    enum: CLOCK_MONOTONIC
    enum: TIMER_ABSTIME

cdef extern from "<errno.h>" nogil:
    enum: EAGAIN
    enum: EINTR

cdef extern from "frame_codec.h" nogil:
    enum:
        CN_OK
        CN_OVERSIZED
        CN_MULTIPART
        CN_MALFORMED
        CN_NOT_A_MAP
        CN_MISSING_FIELD
        CN_WRONG_TYPE
        CN_FEATURE_COUNT
        CN_NON_FINITE
        CN_SEQ_NOT_INCREASING
        CN_NON_FINITE_OUTPUT
        CN_N_REASONS
        CN_ACTION_BYTES
        CN_ACTION_U_MAX
    int cn_decode_frame(const uint8_t *buf, size_t len, int n_features, double *scratch,
                        double *x_out, uint64_t *seq, int64_t *t_ns)
    size_t cn_encode_action(uint8_t *out, uint64_t seq, int have_seq, int64_t t_ns, uint64_t cycle, int action,
                            int safe)
    size_t cn_action_u_bytes(int n)
    size_t cn_encode_action_u(uint8_t *out, uint64_t seq, int have_seq, int64_t t_ns, uint64_t cycle,
                              const double *u, int n, int safe)

cdef extern from "rt_hist.h" nogil:
    enum: CN_HIST_BUCKETS
    enum: CN_HIST_SUB_BITS
    void cn_hist_record(int64_t *counts, int64_t v)

ctypedef struct zmq_pollitem_t:
    void *socket
    int fd
    short events
    short revents

ctypedef int (*zmq_recv_t)(void *s, void *buf, size_t n, int flags) noexcept nogil
ctypedef int (*zmq_send_t)(void *s, const void *buf, size_t n, int flags) noexcept nogil
ctypedef int (*zmq_getsockopt_t)(void *s, int opt, void *val, size_t *n) noexcept nogil
ctypedef int (*zmq_errno_t)() noexcept nogil
ctypedef int (*zmq_poll_t)(zmq_pollitem_t *items, int n, long timeout_ms) noexcept nogil

cdef enum:
    ZMQ_DONTWAIT = 1
    ZMQ_RCVMORE = 13
    ZMQ_POLLIN = 1

# per-cycle flags (cycles.npz "flags"): the bits of control_node.rundir.FLAGS, checked at import below
cdef enum:
    FLAG_MISS = 1
    FLAG_STALE = 2
    FLAG_REJECTED = 4
    FLAG_SAFE = 8
    FLAG_NEW_FRAME = 16
    FLAG_NO_FRAME_YET = 32     # no valid frame since start: seq in the ring is meaningless
    FLAG_INFER = 64            # the policy ran this tick (an inference tick; else a hold tick)
    FLAG_PHASE_SHIFT = 128     # phase lock moved the schedule after this tick

# the ring's "action" of a continuous policy's cycle (rundir.ACTION_POLICY / ACTION_SAFE, checked below)
cdef enum:
    ACTION_POLICY = 0
    ACTION_SAFE = -1

# phase lock: a late frame moves the schedule this many steps later, an early one one step earlier, so
# the lock settles with 1 frame in PHASE_LATE_STEPS + 1 (10 %) later than tick - phase_margin_ns
DEF PHASE_LATE_STEPS = 9

# streaming histograms (whole run): rows in control_node.rundir.HIST_NAMES order
DEF H_WAKE = 0
DEF H_CYCLE = 1
DEF H_AGE = 2
DEF H_RECV = 3
DEF H_INFER = 4
DEF H_PUB = 5
DEF H_PERIOD = 6
DEF N_HIST = 7


cdef inline int64_t now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t> ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline void sleep_until(int64_t t) noexcept nogil:
    cdef timespec ts
    ts.tv_sec = t // 1000000000
    ts.tv_nsec = t % 1000000000
    while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR:
        pass


cdef class RtLoop:
    """The cycle engine. Build once, call :meth:`run` once.

    Parameters are plain numbers (validated by ``control_node.config``); socket
    handles are pyzmq ``Socket.underlying`` addresses and ``fns`` maps libzmq
    function names to addresses (``control_node.loop.libzmq.libzmq_functions``).
    """
    cdef Policy policy
    cdef void *sub
    cdef void *pub
    cdef zmq_recv_t z_recv
    cdef zmq_send_t z_send
    cdef zmq_getsockopt_t z_getsockopt
    cdef zmq_errno_t z_errno
    cdef zmq_poll_t z_poll
    # settings
    cdef public int64_t period_ns, deadline_ns, stale_after_ns, spin_ns, max_cycles, run_until_ns
    cdef public int sensor_clock, catch_up_skip, safe_action, hold_last, n_features
    # decimation: the policy runs on one tick in `decimation` (see _schedule); history: frames per input
    cdef readonly int decimation, history, frame_width
    cdef readonly bint history_newest_first
    cdef bint infer_pending             # a policy tick came and the policy has not run since
    cdef bint fresh                     # a valid frame arrived that the policy has not acted on
    cdef int h_head, h_count            # history ring: slot of the newest frame, frames held (0: refill)
    cdef uint64_t act_seq               # the frame the last inference acted on (published on hold ticks)
    cdef int64_t act_tns
    cdef bint act_have
    # phase lock (timer clock): the schedule's offset, moved so frames land phase_margin_ns before the tick
    cdef readonly bint phase_lock
    cdef readonly int64_t phase_margin_ns, phase_max_slew_ns, phase_offset_ns
    cdef readonly int64_t phase_shifts, phase_shift_abs_ns, phase_shift_max_ns, phase_error_ns
    cdef readonly int64_t phase_early, phase_min_step_ns, phase_step_ns
    cdef int phase_dir
    cdef int64_t phase_run
    cdef readonly bint continuous       # the policy's head: continuous (v2 actions) or argmax (v1)
    cdef readonly int n_actions
    cdef size_t rx_cap
    # buffers
    cdef object _keep
    cdef uint8_t *rx
    cdef uint8_t *tx                    # the encoded action, sized for the policy's message at init
    cdef readonly size_t tx_cap
    cdef double *x_cur
    cdef double *x_new
    cdef double *scratch
    cdef double *x_in                   # the policy's input: history frames stacked (history > 1)
    cdef double *h_ring                 # the last `history` frames acted on, frame_width each
    # continuous policies: the policy's output, the last good action, the safe action (n_actions each)
    cdef double *u_new
    cdef double *u_last
    cdef double *u_safe
    cdef bint u_have_good
    # counters (read by the diagnostics thread while running: benign races on int64)
    cdef readonly int64_t cycles, deadline_misses, skipped_ticks, stale_cycles, safe_actions
    cdef readonly int64_t superseded, frames_valid, send_failures, recv_errors, t0_ns, t_end_ns
    cdef readonly int64_t inference_ticks
    # recurrent policies: the state is zeroed at start and (reset_on_trip) when the watchdog trips
    cdef public bint reset_on_trip
    cdef readonly int64_t state_resets
    cdef int64_t rejected[CN_N_REASONS]
    cdef volatile int stop_flag
    # ring of per-cycle records
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
    cdef int64_t *hist
    cdef readonly object ring
    cdef readonly object histograms
    # continuous policies: the published action of each of the last action_capacity cycles (float32)
    cdef readonly int64_t action_capacity
    cdef readonly object action_ring
    cdef float *r_u

    def __init__(self, Policy policy, size_t sub_handle, size_t pub_handle, dict fns, *,
                 int64_t period_ns, int64_t deadline_ns, int64_t stale_after_ns, int64_t spin_ns,
                 int64_t max_cycles, bint sensor_clock, bint catch_up_skip, int safe_action, bint hold_last,
                 size_t max_frame_bytes, int64_t ring_cycles, object safe_u=None, int64_t action_ring_cycles=0,
                 int decimation=1, int history=1, bint history_newest_first=False, bint phase_lock=False,
                 int64_t phase_margin_ns=100_000, bint reset_on_trip=True):
        """safe_action/hold_last: argmax policies (a class index; hold = repeat the last class).
        Continuous policies: ``safe_u`` is the safe action vector (n_actions finite floats; None: the
        head's offset), ``hold_last`` publishes the last good action instead once there is one;
        ``action_ring_cycles`` the cycles the action ring keeps (0: rundir.action_ring_capacity).
        ``decimation``: the policy runs on one tick in N (timer clock; _schedule); ``history``: frames of
        n_features / history each stacked into the policy's input, oldest first unless history_newest_first."""
        self.policy = policy
        self.reset_on_trip = reset_on_trip
        self.state_resets = 0
        self.n_features = policy.n_features
        if decimation < 1 or (decimation > 1 and sensor_clock):
            raise ValueError(f"decimation must be >= 1 (and 1 with the sensor clock); got {decimation}")
        if history < 1 or self.n_features % history:
            raise ValueError(f"history must divide the policy's {self.n_features} inputs; got {history}")
        self.decimation, self.history = decimation, history
        self.frame_width = self.n_features // history
        self.history_newest_first = history_newest_first
        self.infer_pending, self.fresh = True, False
        self.h_head, self.h_count = 0, 0
        self.act_seq, self.act_tns, self.act_have = 0, -1, False
        self.inference_ticks = 0
        if phase_lock and (sensor_clock or not 0 < phase_margin_ns < period_ns // 2):     # (off: not used)
            raise ValueError("phase lock needs the timer clock and a margin below half a period")
        self.phase_lock, self.phase_margin_ns = phase_lock, phase_margin_ns
        self.phase_max_slew_ns = max(<int64_t> 1, period_ns // 100)
        self.phase_offset_ns = self.phase_shifts = self.phase_shift_abs_ns = self.phase_shift_max_ns = 0
        self.phase_error_ns = self.phase_early = 0
        self.phase_min_step_ns = max(<int64_t> 1, period_ns // 2000)
        self.phase_step_ns = self.phase_min_step_ns
        self.phase_dir = 0
        self.phase_run = 0
        self.continuous = policy.continuous
        self.n_actions = policy.n_actions
        if self.continuous:
            if not 1 <= self.n_actions <= CN_ACTION_U_MAX:
                raise ValueError(f"a continuous policy needs 1 to {CN_ACTION_U_MAX} actions; this one has "
                                 f"{self.n_actions}")
            su = np.array(policy.spec.action_offset if safe_u is None else safe_u, dtype=np.float64).reshape(-1)
            if su.shape[0] != self.n_actions or not np.isfinite(su).all():
                raise ValueError(f"safe_u must be {self.n_actions} finite floats; got {su.tolist()}")
            self.tx_cap = cn_action_u_bytes(self.n_actions)
        else:
            if safe_u is not None:
                raise ValueError("safe_u is for continuous policies; an argmax policy takes safe_action")
            su = np.zeros(1)
            self.tx_cap = CN_ACTION_BYTES
        tx = np.zeros(self.tx_cap, dtype=np.uint8)
        self.tx = <uint8_t *> cnp.PyArray_DATA(tx)
        cdef int uw = max(self.n_actions, 1)
        us = np.zeros((3, uw), dtype=np.float64)
        us[2, :su.shape[0]] = su
        self.u_new = <double *> cnp.PyArray_DATA(us)
        self.u_last = self.u_new + uw
        self.u_safe = self.u_last + uw
        self.u_have_good = False
        self.sub = <void *> sub_handle
        self.pub = <void *> pub_handle
        self.z_recv = <zmq_recv_t> <size_t> fns["zmq_recv"]
        self.z_send = <zmq_send_t> <size_t> fns["zmq_send"]
        self.z_getsockopt = <zmq_getsockopt_t> <size_t> fns["zmq_getsockopt"]
        self.z_errno = <zmq_errno_t> <size_t> fns["zmq_errno"]
        self.z_poll = <zmq_poll_t> <size_t> fns["zmq_poll"]
        self.period_ns, self.deadline_ns, self.stale_after_ns = period_ns, deadline_ns, stale_after_ns
        self.spin_ns, self.max_cycles = spin_ns, max_cycles
        self.sensor_clock, self.catch_up_skip = sensor_clock, catch_up_skip
        self.safe_action, self.hold_last = safe_action, hold_last
        self.rx_cap = max_frame_bytes
        self.run_until_ns = 0
        # +1 byte: a frame that fills rx_cap + 1 is known to be oversized
        rx = np.zeros(max_frame_bytes + 1, dtype=np.uint8)
        xs = np.zeros((3, self.frame_width), dtype=np.float64)
        xh = np.zeros((2, self.n_features), dtype=np.float64)       # x_in, then the history ring
        self.rx = <uint8_t *> cnp.PyArray_DATA(rx)
        self.x_cur = <double *> cnp.PyArray_DATA(xs)
        self.x_new = self.x_cur + self.frame_width
        self.scratch = self.x_new + self.frame_width
        self.x_in = <double *> cnp.PyArray_DATA(xh)
        self.h_ring = self.x_in + self.n_features
        self.capacity = max(ring_cycles, 1)
        n = self.capacity
        ring = rundir.new_ring(n)
        self.ring = ring
        self.histograms = np.zeros((N_HIST, CN_HIST_BUCKETS), dtype=np.int64)
        self.hist = <int64_t *> cnp.PyArray_DATA(self.histograms)
        self.r_cycle = <int64_t *> cnp.PyArray_DATA(ring["cycle"])
        self.r_tick = <int64_t *> cnp.PyArray_DATA(ring["t_tick_ns"])
        self.r_wake = <int64_t *> cnp.PyArray_DATA(ring["wake_latency_ns"])
        self.r_recv = <int64_t *> cnp.PyArray_DATA(ring["recv_ns"])
        self.r_infer = <int64_t *> cnp.PyArray_DATA(ring["infer_ns"])
        self.r_pub = <int64_t *> cnp.PyArray_DATA(ring["publish_ns"])
        self.r_cycle_time = <int64_t *> cnp.PyArray_DATA(ring["cycle_time_ns"])
        self.r_period = <int64_t *> cnp.PyArray_DATA(ring["period_ns"])
        self.r_age = <int64_t *> cnp.PyArray_DATA(ring["input_age_ns"])
        self.r_flags = <uint8_t *> cnp.PyArray_DATA(ring["flags"])
        self.r_action = <int16_t *> cnp.PyArray_DATA(ring["action"])
        self.r_seq = <uint64_t *> cnp.PyArray_DATA(ring["seq"])
        if self.continuous:
            # never more than rundir.ACTION_RING_MAX_BYTES, whatever is asked for
            self.action_capacity = rundir.action_ring_capacity(
                action_ring_cycles if action_ring_cycles > 0 else self.capacity, self.n_actions)
            self.action_ring = rundir.new_action_ring(self.action_capacity, self.n_actions)
            self.r_u = <float *> cnp.PyArray_DATA(self.action_ring)
        else:
            self.action_capacity = 0
            self.action_ring = None
            self.r_u = NULL
        self._keep = (rx, xs, xh, tx, us)
        cdef int i
        for i in range(CN_N_REASONS):
            self.rejected[i] = 0

    # ------------------------------------------------------------------ control
    def request_stop(self):
        """Ask the loop to finish its current cycle and return (safe from any thread)."""
        self.stop_flag = 1

    @property
    def safe_vector(self):
        """The continuous policy's safe action (a copy; hold_last: before any good action), else None."""
        if not self.continuous:
            return None
        return np.array([self.u_safe[j] for j in range(self.n_actions)], dtype=np.float64)

    def rejected_counts(self):
        """Rejected frames by reason (dict reason -> count)."""
        return {REASONS[i]: self.rejected[i] for i in range(1, CN_N_REASONS)}

    def run(self, int64_t t0_ns=0, int64_t run_until_ns=0):
        """Run until stop is requested, ``max_cycles`` (timer clock) or ``run_until_ns``.

        t0_ns: the first tick (CLOCK_MONOTONIC ns); 0 means one period from now.
        """
        if t0_ns == 0:
            t0_ns = now_ns() + self.period_ns
        self.t0_ns = t0_ns
        self.run_until_ns = run_until_ns
        self.policy.reset_ptr()          # a recurrent policy starts from zero state (no-op otherwise)
        with nogil:
            if self.sensor_clock:
                self._run_sensor_clock()
            else:
                self._run_timer_clock()
        self.t_end_ns = now_ns()

    # ------------------------------------------------------------------ hot path
    cdef inline int _drain(self, uint64_t *seq_io, int64_t *tns_out, bint *have_seq,
                           bint accept_any_seq) noexcept nogil:
        """Read every waiting frame; keep the newest valid one in x_cur. Returns 1 if one
        was accepted, plus 2 if any was rejected. seq_io holds the last accepted seq (uint64,
        compared unsigned: no frame can pass by wrapping); accept_any_seq lifts that rule
        after the watchdog tripped, so a restarted sender may start again from 0."""
        cdef int n, reason, more, got = 0, rej = 0
        cdef size_t more_len
        cdef uint64_t seq
        cdef int64_t tns
        while True:
            n = self.z_recv(self.sub, self.rx, self.rx_cap + 1, ZMQ_DONTWAIT)
            if n < 0:
                if self.z_errno() != EAGAIN:
                    self.recv_errors += 1
                break
            more = 0
            more_len = sizeof(int)
            self.z_getsockopt(self.sub, ZMQ_RCVMORE, &more, &more_len)
            if more:
                while more:   # discard the remaining parts of this message
                    self.z_recv(self.sub, self.rx, self.rx_cap + 1, ZMQ_DONTWAIT)
                    more = 0
                    more_len = sizeof(int)
                    self.z_getsockopt(self.sub, ZMQ_RCVMORE, &more, &more_len)
                reason = CN_MULTIPART
            elif <size_t> n > self.rx_cap:
                reason = CN_OVERSIZED
            else:
                reason = cn_decode_frame(self.rx, n, self.frame_width, self.scratch, self.x_new, &seq, &tns)
                if reason == CN_OK and have_seq[0] and not accept_any_seq and seq <= seq_io[0]:
                    reason = CN_SEQ_NOT_INCREASING
            if reason != CN_OK:
                self.rejected[reason] += 1
                rej = 2
                continue
            if got:
                self.superseded += 1
            got = 1
            self.frames_valid += 1
            memcpy(self.x_cur, self.x_new, sizeof(double) * self.frame_width)
            seq_io[0] = seq
            have_seq[0] = True
            accept_any_seq = False
            tns_out[0] = tns
        return got | rej

    cdef inline void _publish(self, uint64_t seq, bint have_seq, int64_t tns, int action, bint safe) noexcept nogil:
        cdef size_t n = cn_encode_action(self.tx, seq, have_seq, tns, <uint64_t> self.cycles, action, safe)
        if self.z_send(self.pub, self.tx, n, ZMQ_DONTWAIT) < 0:
            self.send_failures += 1
        if safe:
            self.safe_actions += 1

    cdef inline void _publish_u(self, uint64_t seq, bint have_seq, int64_t tns, const double *u,
                                bint safe) noexcept nogil:
        cdef size_t n = cn_encode_action_u(self.tx, seq, have_seq, tns, <uint64_t> self.cycles, u, self.n_actions,
                                           safe)
        if self.z_send(self.pub, self.tx, n, ZMQ_DONTWAIT) < 0:
            self.send_failures += 1
        if safe:
            self.safe_actions += 1

    cdef inline void _record_u(self, const double *u) noexcept nogil:
        """The published action vector into the action ring (call before _record counts the cycle)."""
        cdef float *row = self.r_u + (self.cycles % self.action_capacity) * self.n_actions
        cdef int j
        for j in range(self.n_actions):
            row[j] = <float> u[j]

    cdef inline void _record(self, int64_t tick, int64_t wake_lat, int64_t t_wake, int64_t t_recv,
                             int64_t t_infer, int64_t t_pub, int64_t period, int64_t age, uint8_t flags,
                             int action, uint64_t seq) noexcept nogil:
        cdef int64_t i = self.cycles % self.capacity
        self.r_cycle[i] = self.cycles
        self.r_tick[i] = tick
        self.r_wake[i] = wake_lat
        self.r_recv[i] = t_recv - t_wake
        self.r_infer[i] = t_infer - t_recv
        self.r_pub[i] = t_pub - t_infer
        self.r_cycle_time[i] = t_pub - t_wake
        self.r_period[i] = period
        self.r_age[i] = age
        self.r_flags[i] = flags
        self.r_action[i] = <int16_t> action
        self.r_seq[i] = seq
        cdef int64_t *h = self.hist
        if wake_lat >= 0:
            cn_hist_record(h + H_WAKE * CN_HIST_BUCKETS, wake_lat)
        cn_hist_record(h + H_CYCLE * CN_HIST_BUCKETS, t_pub - t_wake)
        if age >= 0:
            cn_hist_record(h + H_AGE * CN_HIST_BUCKETS, age)
        cn_hist_record(h + H_RECV * CN_HIST_BUCKETS, t_recv - t_wake)
        cn_hist_record(h + H_INFER * CN_HIST_BUCKETS, t_infer - t_recv)
        cn_hist_record(h + H_PUB * CN_HIST_BUCKETS, t_pub - t_infer)
        cn_hist_record(h + H_PERIOD * CN_HIST_BUCKETS, period)
        self.cycles += 1

    cdef inline bint _schedule(self, int got, bint due, int64_t t_wake, int64_t *last_rx, bint *stale_state,
                               bint *stale_now, uint64_t seq, int64_t tns, uint8_t *flags) noexcept nogil:
        """Frame arrival, the watchdog and the policy's schedule: True when the policy runs this tick.

        ``due``: this tick is a policy tick (the first tick at or after each multiple of decimation).
        The policy runs on the first tick at or after a policy tick on which a valid frame it has not
        acted on is held, so at most once per policy tick (tick 0 is one: at start, on the first frame).
        The watchdog runs every tick, before that: ``stale_now`` (and FLAG_STALE) when no valid frame came
        for stale_after. A trip empties the history and forgets a frame not acted on yet (it is older
        than stale_after, so the policy never acts on it); the schedule is kept, so the first valid frame
        after a trip is acted on at the first policy tick at or after it (at once when a policy tick
        passed during the silence)."""
        if due:
            self.infer_pending = True
        if got & 1:
            last_rx[0] = t_wake
            stale_state[0] = False
            self.fresh = True
        stale_now[0] = False
        if last_rx[0] == 0 or t_wake - last_rx[0] > self.stale_after_ns:
            if not stale_state[0]:
                self.h_count = 0
                self.fresh = False
                if self.reset_on_trip and self.policy.hidden_size > 0:
                    self.policy.reset_ptr()     # an episode ends: the next frame starts from zero state
                    self.state_resets += 1
            stale_state[0] = True
            stale_now[0] = True
            self.stale_cycles += 1
            flags[0] |= FLAG_STALE
        if self.infer_pending and self.fresh:
            self.infer_pending = False
            self.fresh = False
            flags[0] |= FLAG_NEW_FRAME | FLAG_INFER
            self.inference_ticks += 1
            self.act_seq, self.act_tns, self.act_have = seq, tns, True
            return True
        return False

    cdef inline double *_policy_input(self) noexcept nogil:
        """The policy's input for this inference: x_cur (history 1), or x_cur pushed into the history
        ring (an empty ring is filled with it: the missing slots repeat the first frame) and the ring
        copied into x_in in the configured order."""
        if self.history == 1:
            return self.x_cur
        cdef int n = self.history, w = self.frame_width, j, slot
        cdef size_t fb = sizeof(double) * w
        if self.h_count == 0:
            for j in range(n):
                memcpy(self.h_ring + j * w, self.x_cur, fb)
            self.h_head = n - 1
            self.h_count = 1
        else:
            self.h_head = (self.h_head + 1) % n
            memcpy(self.h_ring + self.h_head * w, self.x_cur, fb)
            if self.h_count < n:
                self.h_count += 1
        for j in range(n):
            slot = (self.h_head - j + n) % n if self.history_newest_first else (self.h_head + 1 + j) % n
            memcpy(self.x_in + j * w, self.h_ring + slot * w, fb)
        return self.x_in

    cdef inline int _decide(self, int got, bint due, int64_t t_wake, int64_t *last_rx, int *last_action,
                            bint *last_safe, bint *stale_state, uint8_t *flags, uint64_t seq,
                            int64_t tns) noexcept nogil:
        """This cycle's action: the policy's on an inference tick, the held one, or the safe one.
        Sets FLAG_SAFE in flags when the safe action is chosen."""
        cdef int a
        cdef bint stale
        if self._schedule(got, due, t_wake, last_rx, stale_state, &stale, seq, tns, flags):
            a = self.policy.predict_ptr(self._policy_input())
            if a < 0:       # logits overflowed: never publish garbage
                self.rejected[CN_NON_FINITE_OUTPUT] += 1
                last_safe[0] = True
            else:
                last_action[0] = a
                last_safe[0] = False
        if stale:
            last_safe[0] = True
        if last_safe[0]:
            flags[0] |= FLAG_SAFE
            return last_action[0] if (self.hold_last and last_action[0] >= 0) else self.safe_action
        return last_action[0]

    cdef inline const double *_decide_u(self, int got, bint due, int64_t t_wake, int64_t *last_rx,
                                        bint *last_safe, bint *stale_state, uint8_t *flags, uint64_t seq,
                                        int64_t tns) noexcept nogil:
        """_decide for a continuous policy: the action vector to publish (the policy's on an inference
        tick, the held one, or the safe one). A non-finite output never reaches u_last."""
        cdef bint stale
        if self._schedule(got, due, t_wake, last_rx, stale_state, &stale, seq, tns, flags):
            if self.policy.act_ptr(self._policy_input(), self.u_new) < 0:     # not finite: u_new is garbage
                self.rejected[CN_NON_FINITE_OUTPUT] += 1
                last_safe[0] = True
            else:
                memcpy(self.u_last, self.u_new, sizeof(double) * self.n_actions)
                self.u_have_good = True
                last_safe[0] = False
        if stale:
            last_safe[0] = True
        if last_safe[0]:
            flags[0] |= FLAG_SAFE
            return self.u_last if (self.hold_last and self.u_have_good) else self.u_safe
        return self.u_last

    cdef inline void _cycle(self, int64_t tick, int64_t wake_lat, int64_t t_wake, int64_t period, int got,
                            bint due, uint64_t seq, bint have_seq, int64_t tns, int64_t *last_rx, int *last_action,
                            bint *last_safe, bint *stale_state) noexcept nogil:
        """The cycle after the read: decide (update), publish (write), then time and record it.
        A cycle misses its deadline when it publishes later than deadline_ns after ``tick``. The policy's
        answer (fresh or held) carries the seq / t_ns of the frame it was computed from; a safe action
        those of the last valid frame."""
        cdef uint8_t flags = FLAG_REJECTED if got & 2 else 0
        cdef int64_t t_recv = now_ns()
        cdef int action
        cdef const double *u = NULL
        if self.continuous:
            u = self._decide_u(got, due, t_wake, last_rx, last_safe, stale_state, &flags, seq, tns)
            action = ACTION_SAFE if flags & FLAG_SAFE else ACTION_POLICY
        else:
            action = self._decide(got, due, t_wake, last_rx, last_action, last_safe, stale_state, &flags, seq, tns)
        cdef int64_t t_infer = now_ns()
        if not (flags & FLAG_SAFE):
            seq, tns, have_seq = self.act_seq, self.act_tns, self.act_have
        if self.continuous:
            self._publish_u(seq, have_seq, tns, u, flags & FLAG_SAFE)
        else:
            self._publish(seq, have_seq, tns, action, flags & FLAG_SAFE)
        cdef int64_t t_pub = now_ns()
        if t_pub - tick > self.deadline_ns:
            self.deadline_misses += 1
            flags |= FLAG_MISS
        if not have_seq:
            flags |= FLAG_NO_FRAME_YET
        if self.continuous:
            self._record_u(u)
        self._record(tick, wake_lat, t_wake, t_recv, t_infer, t_pub, period,
                     # input age only where the policy acted on a frame (not for safe actions)
                     (t_wake - tns) if (tns >= 0 and not (flags & FLAG_SAFE)) else -1, flags, action, seq)

    cdef inline void _phase_step(self, int64_t tick, int64_t tns, bint early) noexcept nogil:
        """Phase lock, after a tick that drained a new valid frame. ``early``: the frame was in the socket
        at tick - phase_margin_ns but not yet at tick - period/2 (the probes). Early: the schedule moves
        earlier by one step (frames waited longer than the margin); else (the frame came after tick -
        margin, or already in the first half of the period, just after the previous tick) later by
        PHASE_LATE_STEPS steps. So it settles where 1 frame in PHASE_LATE_STEPS + 1 comes later than
        tick - margin: the margin holds for 90 % of the frames, whatever the transport's jitter. The step
        (phase_min_step_ns, period / 2000) doubles every 16 cycles of a run longer than 32 in one
        direction (acquiring a far phase), up to phase_max_slew_ns (1 % of a period) per cycle, and falls
        back when the direction turns; ticks stay strictly increasing. phase_error_ns: tick - t_ns of the
        frame minus the margin (the sender's stamp: one host only; recorded, not used)."""
        self.phase_error_ns = tick - tns - self.phase_margin_ns
        cdef int dirn = -1 if early else 1
        if dirn == self.phase_dir:
            self.phase_run += 1
            if self.phase_run > 32 and self.phase_run % 16 == 0:
                self.phase_step_ns = min(self.phase_step_ns * 2, self.phase_max_slew_ns)
        else:
            self.phase_run = 1
            self.phase_step_ns = self.phase_min_step_ns
        self.phase_dir = dirn
        cdef int64_t mag = self.phase_step_ns if early else min(self.phase_step_ns * PHASE_LATE_STEPS,
                                                                 self.phase_max_slew_ns)
        self.phase_offset_ns += dirn * mag
        self.phase_shifts += 1
        if early:
            self.phase_early += 1
        self.phase_shift_abs_ns += mag
        if mag > self.phase_shift_max_ns:
            self.phase_shift_max_ns = mag
        self.r_flags[(self.cycles - 1) % self.capacity] |= FLAG_PHASE_SHIFT

    cdef inline int64_t _wait_until(self, int64_t t) noexcept nogil:
        """Sleep to spin_ns before ``t``, then spin to it: sleeping alone wakes 50-80 us late (timer slack,
        idle exit); spinning alone gets SCHED_FIFO throttled. Returns the wake time."""
        cdef int64_t now = now_ns()
        if t - now > self.spin_ns:
            sleep_until(t - self.spin_ns)
        now = now_ns()
        while now < t:
            now = now_ns()
        return now

    cdef void _run_timer_clock(self) noexcept nogil:
        cdef int64_t k = 0, tick, t_wake, prev_wake = 0, now, k_next, next_due = 0
        cdef int64_t tns = -1, last_rx = 0, wake_lat, period
        cdef uint64_t seq = 0
        cdef bint have_seq = False, last_safe = True, stale_state = True
        cdef int last_action = -1, got
        cdef bint due, early = False, mid = False
        cdef zmq_pollitem_t probe
        probe.socket = self.sub
        probe.fd = 0
        probe.events = ZMQ_POLLIN
        while not self.stop_flag:
            if self.max_cycles > 0 and self.cycles >= self.max_cycles:
                break
            tick = self.t0_ns + k * self.period_ns + self.phase_offset_ns
            if self.run_until_ns > 0 and tick >= self.run_until_ns:
                break
            if self.phase_lock:
                # two probes: is a frame in the socket half a period before the tick (it came just after
                # the last tick: the schedule is early, move later), or only phase_margin_ns before it
                # (it came early enough: move earlier), or not even then (late: move later)?
                if tick - self.period_ns // 2 > now_ns():
                    sleep_until(tick - self.period_ns // 2)        # no spin: a coarse probe
                probe.revents = 0
                mid = self.z_poll(&probe, 1, 0) > 0
                self._wait_until(tick - self.phase_margin_ns)
                probe.revents = 0
                early = (not mid) and self.z_poll(&probe, 1, 0) > 0
            t_wake = self._wait_until(tick)
            wake_lat = t_wake - tick
            period = t_wake - prev_wake if prev_wake else self.period_ns
            prev_wake = t_wake
            got = self._drain(&seq, &tns, &have_seq, stale_state)
            # a policy tick: the first tick at or after each multiple of decimation (skipped ticks too)
            due = k >= next_due
            if due:
                next_due = (k // self.decimation + 1) * self.decimation
            self._cycle(tick, wake_lat, t_wake, period, got, due, seq, have_seq, tns,
                        &last_rx, &last_action, &last_safe, &stale_state)
            if self.phase_lock and (got & 1) and tns >= 0:
                self._phase_step(tick, tns, early)
            k += 1
            if self.catch_up_skip:
                # every tick that already passed is skipped, and each one is a miss
                now = now_ns()
                k_next = (now - self.t0_ns - self.phase_offset_ns) // self.period_ns + 1
                if k_next > k + 1:
                    self.skipped_ticks += k_next - k - 1
                    self.deadline_misses += k_next - k - 1
                    k = k_next - 1

    cdef void _run_sensor_clock(self) noexcept nogil:
        """One cycle per frame arrival; the safe action every stale_after while none comes."""
        cdef zmq_pollitem_t item
        cdef int64_t t_wake, prev_wake = 0, period
        cdef int64_t tns = -1, last_rx = 0
        cdef uint64_t seq = 0
        cdef bint have_seq = False, last_safe = True, stale_state = True
        cdef int last_action = -1, got, rc
        cdef long timeout_ms = max(<long> 1, <long> (self.stale_after_ns // 1000000))
        item.socket = self.sub
        item.fd = 0
        item.events = ZMQ_POLLIN
        while not self.stop_flag:
            if self.run_until_ns > 0 and now_ns() >= self.run_until_ns:
                break
            item.revents = 0
            rc = self.z_poll(&item, 1, timeout_ms)
            t_wake = now_ns()
            got = self._drain(&seq, &tns, &have_seq, stale_state) if rc > 0 else 0
            if not (got & 1) and last_rx != 0 and t_wake - last_rx <= self.stale_after_ns:
                continue        # nothing valid to answer and not stale yet
            period = t_wake - prev_wake if prev_wake else 0
            prev_wake = t_wake
            # the frame's arrival is the tick: no wake-up lateness to measure
            self._cycle(t_wake, -1, t_wake, period, got, True, seq, have_seq, tns,
                        &last_rx, &last_action, &last_safe, &stale_state)


def decode_frame(bytes frame, int n_features):
    """Python view of the loop's frame decoder (for tests and fuzzing; allocates).

    Returns ``(reason, seq, t_ns, x)``: reason is one of :data:`REASONS`; seq, t_ns
    and x are None unless reason == "ok".
    """
    cdef const uint8_t *buf = frame
    x = np.empty(n_features, dtype=np.float64)
    scratch = np.empty(n_features, dtype=np.float64)
    cdef uint64_t seq = 0
    cdef int64_t tns = 0
    cdef int rc = cn_decode_frame(buf, len(frame), n_features, <double *> cnp.PyArray_DATA(scratch),
                                  <double *> cnp.PyArray_DATA(x), &seq, &tns)
    if rc != CN_OK:
        return REASONS[rc], None, None, None
    return "ok", seq, tns, x


def encode_action(seq, int64_t t_ns, uint64_t cycle, int action, bint safe):
    """The loop's action encoder, for tests: the msgpack bytes it would publish (seq -1: no frame yet)."""
    cdef uint8_t out[96]
    cdef bint have = seq >= 0
    cdef size_t n = cn_encode_action(out, <uint64_t> (seq if have else 0), have, t_ns, cycle, action, safe)
    return out[:n]


def encode_action_u(seq, int64_t t_ns, uint64_t cycle, u, bint safe):
    """The loop's v2 (continuous) action encoder, for tests: the msgpack bytes it would publish for the
    action vector ``u`` (1 to CN_ACTION_U_MAX floats; seq -1: no frame yet)."""
    cdef cnp.ndarray a = np.ascontiguousarray(u, dtype=np.float64).reshape(-1)
    cdef int n = a.shape[0]
    if not 1 <= n <= CN_ACTION_U_MAX:
        raise ValueError(f"u must hold 1 to {CN_ACTION_U_MAX} values; got {n}")
    out = np.zeros(cn_action_u_bytes(n), dtype=np.uint8)
    cdef bint have = seq >= 0
    cdef size_t k = cn_encode_action_u(<uint8_t *> cnp.PyArray_DATA(out), <uint64_t> (seq if have else 0), have,
                                       t_ns, cycle, <const double *> cnp.PyArray_DATA(a), n, safe)
    assert k == <size_t> out.shape[0]
    return out.tobytes()


def action_u_bytes(int n):
    """Length of a v2 action message with ``n`` actions (fixed per n)."""
    return cn_action_u_bytes(n)


def compiled_constants():
    """The C constants this module was compiled with, for :func:`control_node.rundir.check_compiled`."""
    return {
        "flags": {"miss": FLAG_MISS, "stale": FLAG_STALE, "rejected": FLAG_REJECTED, "safe": FLAG_SAFE,
                  "new_frame": FLAG_NEW_FRAME, "no_frame_yet": FLAG_NO_FRAME_YET, "infer": FLAG_INFER,
                  "phase_shift": FLAG_PHASE_SHIFT},
        "reasons": {"ok": CN_OK, "oversized": CN_OVERSIZED, "multipart": CN_MULTIPART, "malformed": CN_MALFORMED,
                    "not_a_map": CN_NOT_A_MAP, "missing_field": CN_MISSING_FIELD, "wrong_type": CN_WRONG_TYPE,
                    "feature_count": CN_FEATURE_COUNT, "non_finite": CN_NON_FINITE,
                    "seq_not_increasing": CN_SEQ_NOT_INCREASING, "non_finite_output": CN_NON_FINITE_OUTPUT},
        "hist": {"wake_latency_ns": H_WAKE, "cycle_time_ns": H_CYCLE, "input_age_ns": H_AGE, "recv_ns": H_RECV,
                 "infer_ns": H_INFER, "publish_ns": H_PUB, "period_ns": H_PERIOD},
        "hist_sub_bits": CN_HIST_SUB_BITS, "hist_buckets": CN_HIST_BUCKETS,
        "ring": {"cycle": sizeof(int64_t), "t_tick_ns": sizeof(int64_t), "wake_latency_ns": sizeof(int64_t),
                 "recv_ns": sizeof(int64_t), "infer_ns": sizeof(int64_t), "publish_ns": sizeof(int64_t),
                 "cycle_time_ns": sizeof(int64_t), "period_ns": sizeof(int64_t), "input_age_ns": sizeof(int64_t),
                 "flags": sizeof(uint8_t), "action": sizeof(int16_t), "seq": sizeof(uint64_t)},
        "action_ring": {"u": sizeof(float)},
        "action_codes": {"policy": ACTION_POLICY, "safe": ACTION_SAFE},
    }


rundir.check_compiled(compiled_constants())   # a reordered C enum or ring field fails here, loudly
