# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The node's hot path: one cycle = wait for the tick, read, infer, write, record.

``RtLoop.cycle`` is the cycle after the wait and the drain (everything but sleeping and socket I/O);
the timer-clock and sensor-clock drivers only wait and drain around it. Its parts are declared once in
``_rtloop.pxd``. ``RtLoop.run_virtual`` runs the same drivers and cycle on a virtual clock and virtual
sockets (``cn_vio.h``) for the rule tests (tests/test_cycle_rules.py).

Everything runs without the GIL and without touching a Python object: libzmq is
called through function pointers taken from the library pyzmq itself loaded (no
build-time link against pyzmq's privately named copy), frames are decoded by
``frame_codec.h`` into a preallocated buffer, the policy runs through
``Policy.predict_ptr`` (argmax: the class, protocol v1) or ``Policy.act_ptr``
(continuous: the action vector, protocol v2), and each cycle's figures go into
preallocated arrays. Python sets it all up (``control_node.node``) and reads the
results afterwards.

Policies change while the loop runs (``control_node.lifecycle``): the control thread loads a policy into
one of MAX_POLICIES slots, then posts a request (activate, canary, shadow, unshadow, rollback) in a
one-entry mailbox (``cn_sync.h``: release/acquire). The loop takes it between two cycles and switches by
exchanging one pointer (``pol``); it records each transition with its cycle number in a ring the
control thread reads. A shadow policy runs after the action is published, on the same input; a canary
is rolled back by the loop itself, within the policy tick that broke a rule.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint64_t
from libc.math cimport sqrt
from libc.string cimport memcpy

from control_node.kernels._policy cimport Policy
from control_node.loop._legged cimport LG_SLOTS, LeggedCycle

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

cdef extern from "<stdint.h>" nogil:
    enum: INT64_MAX_ "INT64_MAX"

cdef extern from "cn_sync.h" nogil:
    int64_t cn_load_acquire(const int64_t *p)
    void cn_store_release(int64_t *p, int64_t v)

cdef extern from "rt_hist.h" nogil:
    enum: CN_HIST_BUCKETS
    enum: CN_HIST_SUB_BITS
    void cn_hist_record(int64_t *counts, int64_t v)

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

# policy lifecycle (control_node.rundir: MAX_POLICIES, TRANSITIONS, TRANSITION_REASONS, SHADOW_CODES)
DEF SENSOR_WAIT_SLICE_MS = 50  # the sensor clock's longest wait: a stop request is seen within it
DEF TR_CAP = 4096              # transition records the control thread has not read yet, at most
DEF TR_FIELDS = 7              # cycle, kind, slot, from_slot, reason, t_ns, seq the old policy acted on last
cdef enum:
    TR_ACTIVATE = 1
    TR_CANARY = 2
    TR_SHADOW = 3
    TR_UNSHADOW = 4
    TR_ROLLBACK = 5
    TR_AUTO_ROLLBACK = 6
    TR_PROMOTE = 7
cdef enum:
    WHY_REQUEST = 0
    WHY_NON_FINITE = 1
    WHY_CYCLE_BUDGET = 2
    WHY_DISAGREEMENT = 3
    WHY_CANARY_PASSED = 4
    WHY_NO_PREVIOUS = 5        # a refused rollback (request result only)
cdef enum:
    SH_NONE = 0
    SH_AGREE = 1
    SH_DISAGREE = 2
    SH_NON_FINITE = 3

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


class LoopConfig:
    """The loop's settings, one object (``control_node.node.loop_config`` builds it from the validated
    config; tests build it directly). Times in ns.

    safe_action/hold_last: argmax policies (a class index; hold = repeat the last class). Continuous
    policies: ``safe_u`` is the safe action vector (n_actions finite floats; None: the head's offset),
    ``hold_last`` publishes the last good action instead once there is one; ``action_ring_cycles`` the
    cycles the action ring keeps (0: rundir.action_ring_capacity). ``decimation``: the policy runs on one
    tick in N (timer clock); ``history``: frames of n_features / history each stacked into the policy's
    input, oldest first unless history_newest_first. ``deadline_ns`` 0: one period."""

    FIELDS = ("period_ns", "deadline_ns", "stale_after_ns", "spin_ns", "max_cycles", "sensor_clock",
              "catch_up_skip", "safe_action", "hold_last", "max_frame_bytes", "ring_cycles", "safe_u",
              "action_ring_cycles", "decimation", "history", "history_newest_first", "phase_lock",
              "phase_margin_ns", "reset_on_trip")

    def __init__(self, *, period_ns, deadline_ns=0, stale_after_ns=100_000_000, spin_ns=0, max_cycles=0,
                 sensor_clock=False, catch_up_skip=True, safe_action=0, hold_last=False, max_frame_bytes=4096,
                 ring_cycles=100_000, safe_u=None, action_ring_cycles=0, decimation=1, history=1,
                 history_newest_first=False, phase_lock=False, phase_margin_ns=100_000, reset_on_trip=True):
        self.period_ns, self.deadline_ns = int(period_ns), int(deadline_ns or period_ns)
        self.stale_after_ns, self.spin_ns, self.max_cycles = int(stale_after_ns), int(spin_ns), int(max_cycles)
        self.sensor_clock, self.catch_up_skip = bool(sensor_clock), bool(catch_up_skip)
        self.safe_action, self.hold_last = int(safe_action), bool(hold_last)
        self.max_frame_bytes, self.ring_cycles = int(max_frame_bytes), int(ring_cycles)
        self.safe_u = None if safe_u is None else [float(v) for v in np.asarray(safe_u, dtype=np.float64).reshape(-1)]
        self.action_ring_cycles, self.decimation, self.history = int(action_ring_cycles), int(decimation), int(history)
        self.history_newest_first, self.phase_lock = bool(history_newest_first), bool(phase_lock)
        self.phase_margin_ns, self.reset_on_trip = int(phase_margin_ns), bool(reset_on_trip)

    def replace(self, **changes):
        """A copy with ``changes`` applied."""
        kw = {f: getattr(self, f) for f in self.FIELDS}
        kw.update(changes)
        return LoopConfig(**kw)

    def __repr__(self):
        return "LoopConfig(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"


cdef class VirtualIO:
    """A virtual clock and virtual sockets for :meth:`RtLoop.run_virtual` (``cn_vio.h``): the real drivers
    and the real cycle run on made-up times, thousands of cycles in milliseconds.

    ``arrive_ns``: each frame's arrival time (sorted); ``frames``: its bytes (a list of bytes objects, as
    sent on the wire; a tuple of parts is one multipart message). ``stalls``: (at_ns, late_ns) pairs, sorted:
    the first sleep whose target reaches at_ns wakes late_ns late. ``read_cost_ns``: every clock read
    advances the clock by this (the cycle's virtual cost). ``start_ns``: the clock at the start. Published
    messages are kept (the first ``send_capacity``, up to ``max_message_bytes`` each): :meth:`sent`."""

    def __init__(self, arrive_ns, frames, stalls=(), *, int64_t read_cost_ns=0, int64_t start_ns=0,
                 int64_t send_capacity=20_000, int64_t max_message_bytes=512):
        arrive_ns = list(arrive_ns)
        frames = list(frames)
        if len(arrive_ns) != len(frames):
            raise ValueError(f"arrive_ns has {len(arrive_ns)} times for {len(frames)} frames")
        parts, times, more = [], [], []
        for t, f in zip(arrive_ns, frames):
            ps = list(f) if isinstance(f, tuple) else [f]
            for j, p in enumerate(ps):
                parts.append(bytes(p))
                times.append(int(t))
                more.append(1 if j < len(ps) - 1 else 0)
        arrive = np.array(times, dtype=np.int64).reshape(-1)
        if arrive.size and (np.diff(arrive) < 0).any():
            raise ValueError("arrive_ns must be sorted")
        off = np.zeros(len(parts) + 1, dtype=np.int64)
        off[1:] = np.cumsum([len(p) for p in parts]) if parts else []
        data = np.frombuffer(b"".join(parts) + b"\0", dtype=np.uint8).copy()
        mo = np.array(more + [0], dtype=np.uint8)
        st = np.array(list(stalls), dtype=np.int64).reshape(-1, 2)
        if st.shape[0] and ((np.diff(st[:, 0]) < 0).any() or (st[:, 1] < 0).any()):
            raise ValueError("stalls must be sorted (at_ns, late_ns >= 0) pairs")
        st_at = np.ascontiguousarray(st[:, 0]) if st.shape[0] else np.zeros(1, dtype=np.int64)
        st_ns = np.ascontiguousarray(st[:, 1]) if st.shape[0] else np.zeros(1, dtype=np.int64)
        self.out_stride = max(max_message_bytes, 1)
        out = np.zeros(max(send_capacity, 1) * self.out_stride, dtype=np.uint8)
        out_len = np.zeros(max(send_capacity, 1), dtype=np.int32)
        self._keep = (arrive, off, data, mo, st_at, st_ns, out, out_len)
        self.v.now = start_ns
        self.v.read_cost_ns = read_cost_ns
        self.v.reads = 0
        self.v.stall_at = <const int64_t *> cnp.PyArray_DATA(st_at)
        self.v.stall_ns = <const int64_t *> cnp.PyArray_DATA(st_ns)
        self.v.n_stalls, self.v.i_stall = st.shape[0], 0
        self.v.arrive = <const int64_t *> cnp.PyArray_DATA(arrive) if arrive.size else NULL
        self.v.off = <const int64_t *> cnp.PyArray_DATA(off)
        self.v.data = <const uint8_t *> cnp.PyArray_DATA(data)
        self.v.more = <const uint8_t *> cnp.PyArray_DATA(mo)
        self.v.n_frames, self.v.i_frame = len(parts), 0
        self.v.last_more = 0
        self.v.out = <uint8_t *> cnp.PyArray_DATA(out)
        self.v.out_len = <int32_t *> cnp.PyArray_DATA(out_len)
        self.v.out_cap, self.v.out_stride, self.v.n_sent = max(send_capacity, 1), self.out_stride, 0

    @property
    def now(self):
        """The virtual clock (ns)."""
        return self.v.now

    @property
    def n_sent(self):
        return self.v.n_sent

    @property
    def frames_read(self):
        """Message parts the loop took from the virtual socket."""
        return self.v.i_frame

    def sent(self):
        """The published messages (bytes), in order (the first send_capacity)."""
        out, out_len = self._keep[6], self._keep[7]
        n = min(self.v.n_sent, self.v.out_cap)
        if n and out_len[:n].max() > self.out_stride:
            raise ValueError(f"a message was longer than max_message_bytes={self.out_stride}: raise it")
        return [out[i * self.out_stride:i * self.out_stride + out_len[i]].tobytes() for i in range(n)]


cdef class RtLoop:
    """The cycle engine. Build once, call :meth:`run` once (or :meth:`run_virtual`).

    ``config`` is a :class:`LoopConfig`; socket handles are pyzmq ``Socket.underlying`` addresses and
    ``fns`` maps libzmq function names to addresses (``control_node.loop.libzmq.libzmq_functions``).
    Without them the loop runs only virtually (:meth:`run_virtual`, tests)."""

    def __init__(self, Policy policy, config, size_t sub_handle=0, size_t pub_handle=0, dict fns=None,
                 LeggedCycle legged=None):
        cdef int64_t period_ns = config.period_ns
        cdef bint sensor_clock = config.sensor_clock
        cdef int decimation = config.decimation, history = config.history
        safe_u = config.safe_u
        self.pol = <void *> policy
        self._slot_refs = [None] * MAX_POLICIES
        self._slot_refs[0] = policy
        cdef int i
        for i in range(MAX_POLICIES):
            self.slot_pol[i] = NULL
        self.slot_pol[0] = self.pol
        self.active, self.previous, self.shadow, self.canary = 0, -1, -1, False
        self.req_seq = self.done_seq = 0
        self.req_kind = self.req_slot = self.req_result = 0
        self.tr_count = 0
        self.canary_ticks, self.canary_window, self.canary_budget_ns, self.canary_max_over = 500, 50, 0, 3
        self.canary_max_disagree, self.shadow_distance = 0.2, 0.1
        self.canary_done = self.canary_over = self.window_ticks = self.window_disagree = 0
        self.shadow_ticks = self.shadow_disagree = self.shadow_nonfinite = self.shadow_ns_max = self.shadow_ns_sum = 0
        self.rc_used = -1
        self.x_used = NULL
        self.reset_on_trip = config.reset_on_trip
        self.state_resets = 0
        self.n_features = policy.n_features
        if decimation < 1 or (decimation > 1 and sensor_clock):
            raise ValueError(f"decimation must be >= 1 (and 1 with the sensor clock); got {decimation}")
        if history < 1 or self.n_features % history:
            raise ValueError(f"history must divide the policy's {self.n_features} inputs; got {history}")
        self.decimation, self.history = decimation, history
        self.frame_width = self.n_features // history
        self.legged, self.lg = legged, NULL
        if legged is not None:
            # the frame is the robot's raw signals; the recipe builds the policy's input (its own history)
            if not policy.continuous or history != 1:
                raise ValueError("a legged recipe needs a continuous policy and [policy] history = 1 (the "
                                 "recipe keeps its own history)")
            if policy.n_features != legged.obs.out_width or policy.n_actions != legged.act.n:
                raise ValueError(f"the recipe builds {legged.obs.out_width} inputs for {legged.act.n} joints; the "
                                 f"policy takes {policy.n_features} inputs and gives {policy.n_actions} actions")
            self.frame_width = legged.frame_width
            self.lg = <void *> legged
        self.history_newest_first = config.history_newest_first
        self.infer_pending, self.fresh = True, False
        self.h_head, self.h_count = 0, 0
        self.act_seq, self.act_tns, self.act_have = 0, -1, False
        self.inference_ticks = 0
        if config.phase_lock and (sensor_clock or not 0 < config.phase_margin_ns < period_ns // 2):
            raise ValueError("phase lock needs the timer clock and a margin below half a period")
        self.phase_lock, self.phase_margin_ns = config.phase_lock, config.phase_margin_ns
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
            self.pub_width = legged.pub_width if legged is not None else self.n_actions
            if self.pub_width > CN_ACTION_U_MAX:
                raise ValueError(f"a command of {self.pub_width} values is more than {CN_ACTION_U_MAX}")
            self.tx_cap = cn_action_u_bytes(self.pub_width)
            self.uw = self.n_actions
        else:
            if safe_u is not None:
                raise ValueError("safe_u is for continuous policies; an argmax policy takes safe_action")
            su = np.array([config.safe_action], dtype=np.float64)      # the action: a width-1 class
            self.tx_cap = CN_ACTION_BYTES
            self.uw = 1
            self.pub_width = 1
        tx = np.zeros(self.tx_cap, dtype=np.uint8)
        self.tx = <uint8_t *> cnp.PyArray_DATA(tx)
        cdef int uw = self.uw
        us = np.zeros((3, uw), dtype=np.float64)         # u_new, u_last, u_shadow
        self.u_new = <double *> cnp.PyArray_DATA(us)
        self.u_last = self.u_new + uw
        self.u_shadow = self.u_last + uw
        slot_safe = np.zeros((MAX_POLICIES, uw), dtype=np.float64)
        slot_safe[:, :] = su[None, :] if not self.continuous else 0.0
        slot_safe[0, :] = su
        self.slot_safe = <double *> cnp.PyArray_DATA(slot_safe)
        self.u_safe = self.slot_safe
        self.u_have_good = False
        tr = np.zeros((TR_CAP, TR_FIELDS), dtype=np.int64)
        self.tr = <int64_t *> cnp.PyArray_DATA(tr)
        self.has_sockets = fns is not None
        if self.has_sockets:
            self.sub = <void *> sub_handle
            self.pub = <void *> pub_handle
            self.z_recv = <zmq_recv_t> <size_t> fns["zmq_recv"]
            self.z_send = <zmq_send_t> <size_t> fns["zmq_send"]
            self.z_getsockopt = <zmq_getsockopt_t> <size_t> fns["zmq_getsockopt"]
            self.z_errno = <zmq_errno_t> <size_t> fns["zmq_errno"]
            self.z_poll = <zmq_poll_t> <size_t> fns["zmq_poll"]
        self.vio = NULL
        self.period_ns, self.deadline_ns = period_ns, config.deadline_ns
        self.stale_after_ns = config.stale_after_ns
        self.spin_ns, self.max_cycles = config.spin_ns, config.max_cycles
        self.sensor_clock, self.catch_up_skip = sensor_clock, config.catch_up_skip
        self.hold_last = config.hold_last
        cdef size_t max_frame_bytes = config.max_frame_bytes
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
        self.capacity = max(<int64_t> config.ring_cycles, 1)
        ring = rundir.new_ring(self.capacity)
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
                config.action_ring_cycles if config.action_ring_cycles > 0 else self.capacity, self.pub_width)
            self.action_ring = rundir.new_action_ring(self.action_capacity, self.pub_width)
            self.r_u = <float *> cnp.PyArray_DATA(self.action_ring)
        else:
            self.action_capacity = 0
            self.action_ring = None
            self.r_u = NULL
        self.r_policy = <int8_t *> cnp.PyArray_DATA(ring["policy"])
        self.r_shadow = <uint8_t *> cnp.PyArray_DATA(ring["shadow"])
        self.r_shadow_dist = <float *> cnp.PyArray_DATA(ring["shadow_dist"])
        self.r_shadow_ns = <int64_t *> cnp.PyArray_DATA(ring["shadow_ns"])
        self._keep = (rx, xs, xh, tx, us, slot_safe, tr)
        if legged is not None:
            legged.bind(self.x_cur)         # the signals the recipe and the PD read: the newest valid frame
        for i in range(CN_N_REASONS_CAP):
            self.rejected[i] = 0
        self._reset_driver()

    def _reset_driver(self):
        """The drivers' state at the start of a run: no frame yet, stale, tick 0."""
        self.k = self.next_due = self.prev_wake = 0
        self.seq, self.tns, self.last_rx = 0, -1, 0
        self.have_seq, self.stale_state, self.last_safe = False, True, True
        self.waiting = 0

    # ------------------------------------------------------------------ control
    def request_stop(self):
        """Ask the loop to finish its current cycle and return (safe from any thread)."""
        self.stop_flag = 1

    # ---------------------------------------------------- lifecycle (control thread)
    def set_slot(self, int slot, Policy policy, safe_u=None, int safe_class=0):
        """Put ``policy`` in a free slot (not active, shadow or a running canary's previous) with its safe
        action. The caller checked its widths against the stream's (``control_node.lifecycle``)."""
        if not 0 <= slot < MAX_POLICIES:
            raise ValueError(f"slot must be 0 to {MAX_POLICIES - 1}; got {slot}")
        if slot in self.slots_in_use():
            raise ValueError(f"slot {slot} is in use by the loop")
        if self.lg != NULL:     # each slot's recipe builds its own input: its width is the slot's
            width = (<LeggedCycle> self.lg).slot_width(slot)
            if width is None:
                raise ValueError(f"slot {slot} has no legged recipe: LeggedCycle.set_slot_obs first")
        else:
            width = self.n_features
        if policy.n_features != width or policy.n_actions != self.n_actions \
                or policy.continuous != self.continuous:
            raise ValueError("the policy's widths or head differ from the loop's")
        cdef int j
        if self.continuous:
            su = np.array(policy.spec.action_offset if safe_u is None else safe_u, dtype=np.float64).reshape(-1)
            if su.shape[0] != self.n_actions or not np.isfinite(su).all():
                raise ValueError(f"safe_u must be {self.n_actions} finite floats; got {su.tolist()}")
            for j in range(self.n_actions):
                self.slot_safe[slot * self.uw + j] = su[j]
        else:
            self.slot_safe[slot] = safe_class
        self._slot_refs[slot] = policy
        self.slot_pol[slot] = <void *> policy

    def clear_slot(self, int slot):
        """Forget the policy in ``slot`` (not one the loop uses)."""
        if slot in self.slots_in_use():
            raise ValueError(f"slot {slot} is in use by the loop")
        self.slot_pol[slot] = NULL
        self._slot_refs[slot] = None
        if self.lg != NULL:
            (<LeggedCycle> self.lg).clear_slot_obs(slot)

    def slots_in_use(self):
        """Slots the loop may run now or switch to by itself: active, shadow, a canary's previous."""
        used = {self.active}
        if self.shadow >= 0:
            used.add(self.shadow)
        if self.canary and self.previous >= 0:
            used.add(self.previous)
        return used

    def forget_previous(self):
        """No rollback target any more (its policy is being unloaded). Not during a canary: the loop may
        roll back to it by itself then. The loop reads ``previous`` only when it takes a request."""
        if self.canary:
            raise ValueError("a canary is running: its previous policy is in use")
        self.previous = -1

    def slot_policy(self, int slot):
        """The Policy in ``slot``, or None."""
        return self._slot_refs[slot]

    def post_request(self, int kind, int slot=-1):
        """Post a lifecycle request (a rundir.TRANSITIONS code: activate, canary, shadow, unshadow,
        rollback) for the loop to apply between two cycles; returns its number for :meth:`request_done`.
        One at a time: the previous one must be done."""
        if cn_load_acquire(&self.done_seq) != self.req_seq:
            raise RuntimeError("a lifecycle request is still pending")
        if kind in (TR_ACTIVATE, TR_CANARY, TR_SHADOW) and (
                not 0 <= slot < MAX_POLICIES or self.slot_pol[slot] == NULL):
            raise ValueError(f"slot {slot} holds no policy")
        self.req_kind, self.req_slot, self.req_result = kind, slot, 0
        cn_store_release(&self.req_seq, self.req_seq + 1)
        return self.req_seq

    def request_done(self, int64_t seq):
        """None while request ``seq`` is pending, else its result (0 done, else a TRANSITION_REASONS code
        saying why not)."""
        if cn_load_acquire(&self.done_seq) < seq:
            return None
        return self.req_result

    def apply_pending(self):
        """Apply a posted request now: only while the loop is not running (before or after ``run``)."""
        with nogil:
            self._apply_request()

    def transitions_since(self, int64_t start):
        """(records, next): the loop's transition records from number ``start`` on, as tuples (cycle,
        kind, slot, from_slot, reason, t_ns, seq); records overwritten before they were read are skipped."""
        cdef int64_t end = cn_load_acquire(&self.tr_count)
        start = max(start, end - TR_CAP)
        out = []
        cdef int64_t k
        cdef int64_t *row
        for k in range(start, end):
            row = self.tr + (k % TR_CAP) * TR_FIELDS
            out.append(tuple(int(row[j]) for j in range(TR_FIELDS)))
        return out, end

    def set_rules(self, *, int64_t canary_ticks, int64_t window, double max_disagree, int64_t budget_ns,
                  int64_t max_over, double distance):
        """The canary's rules (policy ticks) and the shadow's disagreement distance (L2, action units)."""
        self.canary_ticks, self.canary_window, self.canary_max_disagree = canary_ticks, window, max_disagree
        self.canary_budget_ns, self.canary_max_over, self.shadow_distance = budget_ns, max_over, distance

    @property
    def safe_vector(self):
        """The continuous policy's safe action (a copy; hold_last: before any good action), else None."""
        if not self.continuous:
            return None
        return np.array([self.u_safe[j] for j in range(self.n_actions)], dtype=np.float64)

    @property
    def safe_action(self):
        """The active slot's safe class (argmax policies), else None."""
        return None if self.continuous else int(self.u_safe[0])

    def rejected_counts(self):
        """Rejected frames by reason (dict reason -> count)."""
        return {REASONS[i]: self.rejected[i] for i in range(1, CN_N_REASONS)}

    def run(self, int64_t t0_ns=0, int64_t run_until_ns=0):
        """Run until stop is requested, ``max_cycles`` (timer clock) or ``run_until_ns``.

        t0_ns: the first tick (CLOCK_MONOTONIC ns); 0 means one period from now.
        """
        if not self.has_sockets:
            raise RuntimeError("this RtLoop was built without sockets: it runs only with run_virtual")
        self._start(t0_ns, run_until_ns)
        with nogil:
            if self.sensor_clock:
                self._run_sensor_clock()
            else:
                self._run_timer_clock()
        self.t_end_ns = now_ns()

    def _start(self, int64_t t0_ns, int64_t run_until_ns):
        if t0_ns == 0:
            t0_ns = self._now() + self.period_ns
        self.t0_ns = t0_ns
        self.run_until_ns = run_until_ns
        self._reset_driver()
        (<Policy> self.pol).reset_ptr()          # a recurrent policy starts from zero state (no-op otherwise)

    def run_virtual(self, VirtualIO io, int64_t t0_ns=0, int64_t run_until_ns=0):
        """Run the real drivers and the real cycle on ``io``'s virtual clock and sockets (tests): as
        :meth:`run`, with t0_ns 0 meaning one period after ``io.now``. The sensor clock needs run_until_ns
        (its virtual socket never stops by itself); spin_ns must be 0 (a virtual clock does not move while
        spinning unless read_cost_ns > 0)."""
        if self.sensor_clock and run_until_ns <= 0:
            raise ValueError("a virtual run of the sensor clock needs run_until_ns")
        if self.spin_ns and io.v.read_cost_ns <= 0:
            raise ValueError("a virtual run with spin_ns > 0 needs read_cost_ns > 0")
        if not self.sensor_clock and self.max_cycles <= 0 and run_until_ns <= 0:
            raise ValueError("a virtual run needs max_cycles or run_until_ns")
        # the real sockets, put back after (C locals: a Python tuple would stay on its free list)
        cdef void *sub = self.sub
        cdef void *pub = self.pub
        cdef zmq_recv_t z_recv = self.z_recv
        cdef zmq_send_t z_send = self.z_send
        cdef zmq_getsockopt_t z_getsockopt = self.z_getsockopt
        cdef zmq_errno_t z_errno = self.z_errno
        cdef zmq_poll_t z_poll = self.z_poll
        self.vio = &io.v
        self.sub = self.pub = <void *> &io.v
        self.z_recv, self.z_send, self.z_getsockopt = cn_vio_recv, cn_vio_send, cn_vio_getsockopt
        self.z_errno, self.z_poll = cn_vio_errno, cn_vio_poll
        try:
            self._start(t0_ns, run_until_ns)
            with nogil:
                if self.sensor_clock:
                    self._run_sensor_clock()
                else:
                    self._run_timer_clock()
            self.t_end_ns = self._now()
        finally:
            self.vio = NULL
            self.sub, self.pub, self.z_recv, self.z_send = sub, pub, z_recv, z_send
            self.z_getsockopt, self.z_errno, self.z_poll = z_getsockopt, z_errno, z_poll

    # ------------------------------------------------------------------ the clock
    cdef inline int64_t _now(self) noexcept nogil:
        if self.vio != NULL:
            return cn_vio_now(self.vio)
        return now_ns()

    cdef inline void _sleep_until(self, int64_t t) noexcept nogil:
        if self.vio != NULL:
            cn_vio_sleep_until(self.vio, t)
        else:
            sleep_until(t)

    cdef inline int64_t _wait_until(self, int64_t t) noexcept nogil:
        """Sleep to spin_ns before ``t``, then spin to it: sleeping alone wakes 50-80 us late (timer slack,
        idle exit); spinning alone gets SCHED_FIFO throttled. Returns the wake time."""
        cdef int64_t now = self._now()
        if t - now > self.spin_ns:
            self._sleep_until(t - self.spin_ns)
        now = self._now()
        while now < t:
            now = self._now()
        return now

    # ------------------------------------------------------------------ the drivers: wait and drain
    cdef void _run_timer_clock(self) noexcept nogil:
        cdef int64_t tick, t_wake
        cdef int got
        cdef bint early = False, mid = False
        cdef cn_pollitem_t probe
        probe.socket = self.sub
        probe.fd = 0
        probe.events = ZMQ_POLLIN
        while not self.stop_flag:
            if self.max_cycles > 0 and self.cycles >= self.max_cycles:
                break
            tick = self.t0_ns + self.k * self.period_ns + self.phase_offset_ns
            if self.run_until_ns > 0 and tick >= self.run_until_ns:
                break
            if self.phase_lock:
                # two probes: is a frame in the socket half a period before the tick (it came just after
                # the last tick: the schedule is early, move later), or only phase_margin_ns before it
                # (it came early enough: move earlier), or not even then (late: move later)?
                if tick - self.period_ns // 2 > self._now():
                    self._sleep_until(tick - self.period_ns // 2)        # no spin: a coarse probe
                probe.revents = 0
                mid = self.z_poll(&probe, 1, 0) > 0
                self._wait_until(tick - self.phase_margin_ns)
                probe.revents = 0
                early = (not mid) and self.z_poll(&probe, 1, 0) > 0
            t_wake = self._wait_until(tick)
            got = self._drain()
            self.cycle(t_wake, got, early)

    cdef void _run_sensor_clock(self) noexcept nogil:
        """One cycle per frame arrival; the safe action every stale_after while none comes. Each wait for a
        frame lasts stale_after, cut into slices of at most SENSOR_WAIT_SLICE_MS so that a stop request,
        --duration and a posted switch are seen within one slice, not one stale_after (with a 20 s watchdog a
        node took 20 s to stop); the slices change nothing else."""
        cdef cn_pollitem_t item
        cdef int64_t t_wake, now
        cdef int64_t wait_until = 0      # the end of the current wait for a frame (0: none begun)
        cdef int64_t wait_ns = max(<int64_t> 1, self.stale_after_ns // 1_000_000) * 1_000_000   # zmq_poll's ms
        cdef int got, rc
        cdef long timeout_ms
        item.socket = self.sub
        item.fd = 0
        item.events = ZMQ_POLLIN
        self.waiting = 1
        while not self.stop_flag:
            now = self._now()
            if self.run_until_ns > 0 and now >= self.run_until_ns:
                break
            self._apply_request()
            if wait_until == 0:
                wait_until = now + wait_ns
            timeout_ms = <long> min(<int64_t> SENSOR_WAIT_SLICE_MS,
                                    max(<int64_t> 0, (wait_until - now + 999_999) // 1_000_000))
            item.revents = 0
            rc = self.z_poll(&item, 1, timeout_ms)
            t_wake = self._now()
            got = self._drain() if rc > 0 else 0
            if got == 0 and t_wake < wait_until:
                continue        # a slice ended (or a signal came): the wait goes on
            wait_until = 0
            if not (got & 1) and self.last_rx != 0 and t_wake - self.last_rx <= self.stale_after_ns:
                continue        # nothing valid to answer and not stale yet
            self.cycle(t_wake, got, False)

    cdef inline int _drain(self) noexcept nogil:
        """Read every waiting frame; keep the newest valid one in x_cur (its seq / t_ns in seq / tns).
        Returns 1 if one was accepted, plus 2 if any was rejected. seq holds the last accepted seq
        (uint64, compared unsigned: no frame can pass by wrapping); after the watchdog tripped
        (stale_state) any seq is accepted, so a restarted sender may start again from 0."""
        cdef int n, reason, more, got = 0, rej = 0
        cdef size_t more_len
        cdef uint64_t seq
        cdef int64_t tns
        cdef bint accept_any_seq = self.stale_state
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
                if reason == CN_OK and self.have_seq and not accept_any_seq and seq <= self.seq:
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
            self.seq = seq
            self.have_seq = True
            accept_any_seq = False
            self.tns = tns
        return got | rej

    # ------------------------------------------------------------------ the cycle
    cdef void cycle(self, int64_t t_wake, int got, bint early) noexcept nogil:
        """One cycle after the wait and the drain, at ``t_wake`` (the clock after the wait): ``got`` is the
        drain's result (1: a valid frame, now in x_cur / seq / tns; +2: a frame was rejected), ``early``
        the phase-lock probe's answer. Timer clock: the tick is the schedule's (t0 + k * period + phase
        offset), the policy tick the first at or after each multiple of decimation (skipped ticks too);
        then decide, publish, record, the phase step, a posted switch, and (catch_up_skip) every tick
        that already passed is skipped and counted a miss. Sensor clock: the frame's arrival is the tick."""
        cdef int64_t tick, wake_lat, period, now, k_next
        cdef bint due
        if self.sensor_clock:
            period = t_wake - self.prev_wake if self.prev_wake else 0
            self.prev_wake = t_wake
            self._act(t_wake, -1, t_wake, period, got, True)   # no wake-up lateness to measure
            return
        tick = self.t0_ns + self.k * self.period_ns + self.phase_offset_ns
        wake_lat = t_wake - tick
        period = t_wake - self.prev_wake if self.prev_wake else self.period_ns
        self.prev_wake = t_wake
        due = self.k >= self.next_due
        if due:
            self.next_due = (self.k // self.decimation + 1) * self.decimation
        self._act(tick, wake_lat, t_wake, period, got, due)
        if self.phase_lock and (got & 1) and self.tns >= 0:
            self._phase_step(tick, self.tns, early)
        self.k += 1
        self._apply_request()           # a switch happens here, between two cycles
        if self.catch_up_skip:
            now = self._now()
            k_next = (now - self.t0_ns - self.phase_offset_ns) // self.period_ns + 1
            if k_next > self.k + 1:
                self.skipped_ticks += k_next - self.k - 1
                self.deadline_misses += k_next - self.k - 1
                self.k = k_next - 1

    cdef inline void _act(self, int64_t tick, int64_t wake_lat, int64_t t_wake, int64_t period, int got,
                          bint due) noexcept nogil:
        """Decide (update), publish (write), then time and record. A cycle misses its deadline when it
        publishes later than deadline_ns after ``tick``. The policy's answer (fresh or held) carries the
        seq / t_ns of the frame it was computed from; a safe action those of the last valid frame."""
        cdef uint8_t flags = FLAG_REJECTED if got & 2 else 0
        cdef int64_t t_recv = self._now()
        if self.lg != NULL and (<LeggedCycle> self.lg).take_request(
                t_wake, self.cycles,
                (got & 1) != 0 or (self.last_rx != 0 and t_wake - self.last_rx <= self.stale_after_ns)):
            # the policy is entered: its recurrent state starts again with the recipe's, and it runs at the
            # first policy tick with a frame
            (<Policy> self.pol).reset_ptr()
            self.infer_pending = True
        cdef const double *u = self._decide(got, due, t_wake, &flags)
        cdef bint safe = flags & FLAG_SAFE
        if self.lg != NULL:     # every tick: the actuator's command from the newest frame and the held action
            u = (<LeggedCycle> self.lg).tick(
                t_wake, (t_wake - self.last_rx) if self.last_rx else INT64_MAX_,
                self.u_new if (flags & FLAG_INFER and self.rc_used >= 0) else NULL, self.cycles)
            safe = not (<LeggedCycle> self.lg).in_policy()
        cdef int action
        if self.continuous:
            action = ACTION_SAFE if safe else ACTION_POLICY
        else:
            action = <int> u[0]
        cdef int64_t t_infer = self._now()
        cdef uint64_t seq = self.seq
        cdef int64_t tns = self.tns
        cdef bint have_seq = self.have_seq
        if not safe and self.lg == NULL:
            # the policy's answer carries the frame it acted on; a legged command, computed every tick from the
            # newest frame's q, qd, carries the newest frame's
            seq, tns, have_seq = self.act_seq, self.act_tns, self.act_have
        if self.lg == NULL or not (<LeggedCycle> self.lg).send_nothing():
            self._publish(seq, have_seq, tns, u, safe)
        cdef int64_t t_pub = self._now()
        if t_pub - tick > self.deadline_ns:
            self.deadline_misses += 1
            flags |= FLAG_MISS
        if not have_seq:
            flags |= FLAG_NO_FRAME_YET
        cdef float *row
        cdef int j
        if self.continuous:     # the published vector into the action ring
            row = self.r_u + (self.cycles % self.action_capacity) * self.pub_width
            for j in range(self.pub_width):
                row[j] = <float> u[j]
        self._record(tick, wake_lat, t_wake, t_recv, t_infer, t_pub, period,
                     # input age only where the policy acted on a frame (not for safe actions)
                     (t_wake - tns) if (tns >= 0 and not safe) else -1, flags, action, seq)
        cdef int sh = SH_NONE
        if flags & FLAG_INFER:
            if self.shadow >= 0:        # after the publish: the shadow never delays or changes the action
                sh = self._run_shadow()
            if self.canary:
                self._canary_tick(t_pub - t_wake, sh)

    # ------------------------------------------------------------------ the decision
    cdef inline bint _schedule(self, int got, bint due, int64_t t_wake, bint *stale_now,
                               uint8_t *flags) noexcept nogil:
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
            self.last_rx = t_wake
            self.stale_state = False
            self.fresh = True
        stale_now[0] = False
        if self.last_rx == 0 or t_wake - self.last_rx > self.stale_after_ns:
            if not self.stale_state:
                self.h_count = 0
                self.fresh = False
                if self.reset_on_trip and (<Policy> self.pol).hidden_size > 0:
                    (<Policy> self.pol).reset_ptr()     # an episode ends: the next frame starts from zero state
                    self.state_resets += 1
                if self.reset_on_trip and self.shadow >= 0:
                    (<Policy> self.slot_pol[self.shadow]).reset_ptr()
            self.stale_state = True
            stale_now[0] = True
            self.stale_cycles += 1
            flags[0] |= FLAG_STALE
        if self.infer_pending and self.fresh and (self.lg == NULL or (<LeggedCycle> self.lg).in_policy()):
            self.infer_pending = False
            self.fresh = False
            flags[0] |= FLAG_NEW_FRAME | FLAG_INFER
            self.inference_ticks += 1
            self.act_seq, self.act_tns, self.act_have = self.seq, self.tns, True
            return True
        return False

    cdef inline double *_policy_input(self) noexcept nogil:
        """The policy's input for this inference: x_cur (history 1), or x_cur pushed into the history
        ring (an empty ring is filled with it: the missing slots repeat the first frame) and the ring
        copied into x_in in the configured order."""
        if self.lg != NULL:
            return (<LeggedCycle> self.lg).input()
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

    cdef inline int _infer(self, void *policy, const double *x, double *u) noexcept nogil:
        """One inference into ``u``: the action vector (continuous), or the class in u[0] (argmax).
        Returns < 0 when the output was not finite (u is then garbage)."""
        cdef int c
        if self.continuous:
            return (<Policy> policy).act_ptr(x, u)
        c = (<Policy> policy).predict_ptr(x)
        u[0] = c
        return c

    cdef inline const double *_decide(self, int got, bint due, int64_t t_wake, uint8_t *flags) noexcept nogil:
        """This cycle's action (uw values): the policy's on an inference tick, the held one, or the safe
        one (FLAG_SAFE). A non-finite output never reaches u_last."""
        cdef bint stale
        cdef const double *x
        cdef int rc
        if self._schedule(got, due, t_wake, &stale, flags):
            x = self._policy_input()
            self.x_used = x
            rc = self._infer(self.pol, x, self.u_new)
            if rc < 0 and self.canary:      # the canary failed: the previous policy answers, this tick
                self._canary_rollback(WHY_NON_FINITE)
                if self.lg != NULL:         # on its own input: its recipe (width, last action, history)
                    x = self._policy_input()
                    self.x_used = x
                rc = self._infer(self.pol, x, self.u_new)
            self.rc_used = rc
            if self.lg != NULL:         # the recipe's last_action, or the actuator's fault
                if rc < 0:
                    (<LeggedCycle> self.lg).non_finite(t_wake)
                else:
                    (<LeggedCycle> self.lg).took(self.u_new)
            if rc < 0:      # not finite: never publish garbage
                self.rejected[CN_NON_FINITE_OUTPUT] += 1
                self.last_safe = True
            else:
                memcpy(self.u_last, self.u_new, sizeof(double) * self.uw)
                self.u_have_good = True
                self.last_safe = False
        if stale:
            self.last_safe = True
        if self.last_safe:
            flags[0] |= FLAG_SAFE
            return self.u_last if (self.hold_last and self.u_have_good) else self.u_safe
        return self.u_last

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

    # ------------------------------------------------------------------ publish and record
    cdef inline void _publish(self, uint64_t seq, bint have_seq, int64_t tns, const double *u,
                              bint safe) noexcept nogil:
        """Encode and send this cycle's action: protocol v2 (the vector) for a continuous policy, v1 (the
        class in u[0]) for an argmax one."""
        cdef size_t n
        if self.continuous:
            n = cn_encode_action_u(self.tx, seq, have_seq, tns, <uint64_t> self.cycles, u, self.pub_width, safe)
        else:
            n = cn_encode_action(self.tx, seq, have_seq, tns, <uint64_t> self.cycles, <int> u[0], safe)
        if self.z_send(self.pub, self.tx, n, ZMQ_DONTWAIT) < 0:
            self.send_failures += 1
        if safe:
            self.safe_actions += 1

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
        self.r_policy[i] = <int8_t> self.active
        self.r_shadow[i] = SH_NONE
        self.r_shadow_dist[i] = -1.0
        self.r_shadow_ns[i] = -1
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

    # ------------------------------------------------------------------ slots, mailbox, canary, shadow
    cdef inline void _use(self, int slot) noexcept nogil:
        """Make ``slot`` the active policy: the pointer exchange, and its safe action (and its legged recipe)."""
        self.pol = self.slot_pol[slot]
        self.active = slot
        self.u_safe = self.slot_safe + slot * self.uw
        if self.lg != NULL:
            (<LeggedCycle> self.lg).use_slot(slot)

    cdef void _transition(self, int kind, int slot, int from_slot, int why) noexcept nogil:
        """Record a transition; its cycle is the first one the new arrangement runs."""
        cdef int64_t *row = self.tr + (self.tr_count % TR_CAP) * TR_FIELDS
        row[0] = self.cycles
        row[1] = kind
        row[2] = slot
        row[3] = from_slot
        row[4] = why
        row[5] = self._now()
        row[6] = <int64_t> self.act_seq if self.act_have else -1
        cn_store_release(&self.tr_count, self.tr_count + 1)

    cdef void _start_shadow(self, int slot) noexcept nogil:
        self.shadow = slot
        self.shadow_ticks = self.shadow_disagree = self.shadow_nonfinite = 0
        self.shadow_ns_max = self.shadow_ns_sum = 0

    cdef void _canary_rollback(self, int why) noexcept nogil:
        """Back to the previous policy, which ran as the shadow on the same inputs (its state and the
        history are current: nothing is reset)."""
        cdef int bad = self.active
        self.canary = False
        self.shadow = -1
        self._use(self.previous)
        self.previous = bad
        self._transition(TR_ROLLBACK if why == WHY_REQUEST else TR_AUTO_ROLLBACK, self.active, bad, why)

    cdef void _apply_request(self) noexcept nogil:
        """Take a posted request between two cycles. Activation resets the new policy's recurrent state
        and the history (it starts as at the start of a run); the previous policy is kept for rollback."""
        cdef int64_t seq = cn_load_acquire(&self.req_seq)
        if seq == self.done_seq:
            return
        cdef int kind = self.req_kind, slot = self.req_slot, old = self.active, result = 0
        if kind == TR_ACTIVATE or kind == TR_CANARY:
            self.canary = False
            if self.shadow == slot or kind == TR_CANARY:
                self.shadow = -1
            if slot != old:
                self._use(slot)
                (<Policy> self.pol).reset_ptr()
                self.h_count = 0
                if self.lg != NULL:             # entered: its last action, history and gait clock anew
                    (<LeggedCycle> self.lg).reset_slot(slot)
                self.previous = old
                if kind == TR_CANARY:       # the old policy goes on, in shadow, as the yardstick
                    self.canary = True
                    self._start_shadow(old)
                    self.canary_done = self.canary_over = self.window_ticks = self.window_disagree = 0
            self._transition(kind, slot, old, WHY_REQUEST)
        elif kind == TR_SHADOW:
            (<Policy> self.slot_pol[slot]).reset_ptr()
            if self.lg != NULL:
                (<LeggedCycle> self.lg).reset_slot(slot)
            self._start_shadow(slot)
            self._transition(kind, slot, old, WHY_REQUEST)
        elif kind == TR_UNSHADOW:
            self._transition(kind, -1, self.shadow, WHY_REQUEST)
            self.shadow = -1
        elif kind == TR_ROLLBACK:
            if self.canary:
                self._canary_rollback(WHY_REQUEST)
            elif self.previous < 0:
                result = WHY_NO_PREVIOUS
            else:
                self._use(self.previous)
                (<Policy> self.pol).reset_ptr()
                self.h_count = 0
                if self.lg != NULL:
                    (<LeggedCycle> self.lg).reset_slot(self.active)
                self.previous = old
                if self.shadow == self.active:
                    self.shadow = -1
                self._transition(kind, self.active, old, WHY_REQUEST)
        self.req_result = result
        cn_store_release(&self.done_seq, seq)

    cdef int _run_shadow(self) noexcept nogil:
        """The shadow on this tick's input; its agreement with the active policy's answer into the ring
        (cycle just recorded) and the running figures. Returns the SHADOW_CODES code. Argmax: agreement is
        the same class (distance 0 or 1); continuous: the L2 distance within shadow_distance."""
        cdef int64_t t0 = self._now(), dt, i = (self.cycles - 1) % self.capacity
        cdef int code, j
        cdef double d = 0.0, e
        cdef const double *x = self.x_used
        if self.lg != NULL:     # a legged shadow builds its own input: its own last action, history, clock
            x = (<LeggedCycle> self.lg).shadow_input(self.shadow)
        if self._infer(self.slot_pol[self.shadow], x, self.u_shadow) < 0:
            code, d = SH_NON_FINITE, -1.0
        elif not self.continuous:
            code = SH_AGREE if self.u_shadow[0] == self.u_new[0] else SH_DISAGREE
            d = 0.0 if code == SH_AGREE else 1.0
        elif self.rc_used < 0:
            code, d = SH_DISAGREE, -1.0         # the active answered nothing finite, the shadow did
            if self.lg != NULL:
                (<LeggedCycle> self.lg).shadow_took(self.shadow, self.u_shadow)
        else:
            for j in range(self.n_actions):
                e = self.u_shadow[j] - self.u_new[j]
                d += e * e
            d = sqrt(d)
            code = SH_DISAGREE if d > self.shadow_distance else SH_AGREE
            if self.lg != NULL:
                (<LeggedCycle> self.lg).shadow_took(self.shadow, self.u_shadow)
        dt = self._now() - t0
        self.shadow_ticks += 1
        if code != SH_AGREE:
            self.shadow_disagree += 1
        if code == SH_NON_FINITE:
            self.shadow_nonfinite += 1
        self.shadow_ns_sum += dt
        if dt > self.shadow_ns_max:
            self.shadow_ns_max = dt
        self.r_shadow[i] = <uint8_t> code
        self.r_shadow_dist[i] = <float> d
        self.r_shadow_ns[i] = dt
        return code

    cdef void _canary_tick(self, int64_t cycle_time, int sh) noexcept nogil:
        """A canary's policy tick: roll back when it broke the cycle-time budget more than canary_max_over
        times, or disagreed with the previous policy (the shadow) on more than canary_max_disagree of a
        window; promote it after canary_ticks policy ticks."""
        self.canary_done += 1
        if self.canary_budget_ns > 0 and cycle_time > self.canary_budget_ns:
            self.canary_over += 1
            if self.canary_over > self.canary_max_over:
                self._canary_rollback(WHY_CYCLE_BUDGET)
                return
        self.window_ticks += 1
        if sh != SH_AGREE:
            self.window_disagree += 1
        if self.window_ticks >= self.canary_window:
            if self.window_disagree > self.canary_max_disagree * self.window_ticks:
                self._canary_rollback(WHY_DISAGREEMENT)
                return
            self.window_ticks = self.window_disagree = 0
        if self.canary_done >= self.canary_ticks:
            self.canary = False
            self.shadow = -1
            self._transition(TR_PROMOTE, self.active, self.previous, WHY_CANARY_PASSED)


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
                 "flags": sizeof(uint8_t), "action": sizeof(int16_t), "seq": sizeof(uint64_t),
                 "policy": sizeof(int8_t), "shadow": sizeof(uint8_t), "shadow_dist": sizeof(float),
                 "shadow_ns": sizeof(int64_t)},
        "action_ring": {"u": sizeof(float)},
        "action_codes": {"policy": ACTION_POLICY, "safe": ACTION_SAFE},
        "max_policies": MAX_POLICIES,
        "transitions": {"activate": TR_ACTIVATE, "canary": TR_CANARY, "shadow": TR_SHADOW, "unshadow": TR_UNSHADOW,
                        "rollback": TR_ROLLBACK, "auto_rollback": TR_AUTO_ROLLBACK, "promote": TR_PROMOTE},
        "transition_reasons": {"request": WHY_REQUEST, "non_finite": WHY_NON_FINITE,
                               "cycle_budget": WHY_CYCLE_BUDGET, "disagreement": WHY_DISAGREEMENT,
                               "canary_passed": WHY_CANARY_PASSED, "no_previous": WHY_NO_PREVIOUS},
        "shadow_codes": {"none": SH_NONE, "agree": SH_AGREE, "disagree": SH_DISAGREE, "non_finite": SH_NON_FINITE},
    }


assert CN_N_REASONS <= CN_N_REASONS_CAP, "frame_codec.h has more reasons than RtLoop counts"
rundir.check_compiled(compiled_constants())   # a reordered C enum or ring field fails here, loudly
assert LG_SLOTS == MAX_POLICIES, "control_node/loop/_legged.pxd's LG_SLOTS must equal RtLoop's MAX_POLICIES"
