/* A virtual clock and virtual ZeroMQ sockets for the loop's tests (RtLoop.run_virtual).
 *
 * The loop calls libzmq through function pointers (zmq_recv, zmq_send, zmq_getsockopt, zmq_errno,
 * zmq_poll) and reads the clock through RtLoop._now / _sleep_until. A virtual run points them here:
 * frames arrive at made-up times (frame i, bytes data[off[i]:off[i+1]], is in the socket from arrive[i]
 * on), a sleep whose target reaches stall_at[j] wakes stall_ns[j] late, every clock read advances the
 * clock by read_cost_ns (the cycle's virtual cost), and each published message is kept. The real
 * drivers and the real cycle run unchanged, thousands of cycles in milliseconds, with exact times.
 * Nothing here allocates; the owner (RtLoop's VirtualIO) holds every buffer.
 */
#ifndef CN_VIO_H
#define CN_VIO_H

#include <stdint.h>
#include <string.h>
#include <errno.h>

typedef struct {
    void *socket;
    int fd;
    short events;
    short revents;
} cn_pollitem_t;          /* zmq_pollitem_t's layout (zmq.h) */

typedef struct {
    int64_t now;                  /* the virtual CLOCK_MONOTONIC, ns */
    int64_t read_cost_ns;         /* each clock read advances it by this */
    int64_t reads;                /* clock reads so far */
    const int64_t *stall_at;      /* sorted; a sleep to t >= stall_at[j] wakes stall_ns[j] late (once) */
    const int64_t *stall_ns;
    int64_t n_stalls, i_stall;
    const int64_t *arrive;        /* sorted arrival times of the frames */
    const int64_t *off;           /* n_frames + 1 offsets into data */
    const uint8_t *data;
    const uint8_t *more;          /* more[i]: frame i is followed by another part of the same message */
    int64_t n_frames, i_frame;
    int last_more;
    uint8_t *out;                 /* sent messages: out_cap slots of out_stride bytes, out_len each */
    int32_t *out_len;
    int64_t out_cap, out_stride, n_sent;
} cn_vio;

static __thread int cn_vio_err = 0;

static inline int64_t cn_vio_now(cn_vio *v) {
    int64_t t = v->now;
    v->now += v->read_cost_ns;
    v->reads++;
    return t;
}

static inline void cn_vio_sleep_until(cn_vio *v, int64_t t) {
    if (t > v->now)
        v->now = t;
    while (v->i_stall < v->n_stalls && v->stall_at[v->i_stall] <= t) {
        v->now += v->stall_ns[v->i_stall];
        v->i_stall++;
    }
}

static inline int cn_vio_ready(const cn_vio *v) {
    return v->i_frame < v->n_frames && v->arrive[v->i_frame] <= v->now;
}

static int cn_vio_recv(void *s, void *buf, size_t n, int flags) {
    cn_vio *v = (cn_vio *)s;
    (void)flags;
    if (!cn_vio_ready(v)) {
        cn_vio_err = EAGAIN;
        return -1;
    }
    int64_t i = v->i_frame++;
    size_t len = (size_t)(v->off[i + 1] - v->off[i]);
    memcpy(buf, v->data + v->off[i], len < n ? len : n);
    v->last_more = v->more ? v->more[i] : 0;
    return (int)len;               /* as zmq_recv: the message's length, even when truncated */
}

static int cn_vio_send(void *s, const void *buf, size_t n, int flags) {
    cn_vio *v = (cn_vio *)s;
    (void)flags;
    if (v->n_sent < v->out_cap) {
        size_t k = n < (size_t)v->out_stride ? n : (size_t)v->out_stride;
        memcpy(v->out + v->n_sent * v->out_stride, buf, k);
        v->out_len[v->n_sent] = (int32_t)n;
    }
    v->n_sent++;
    return (int)n;
}

static int cn_vio_getsockopt(void *s, int opt, void *val, size_t *n) {
    (void)opt;
    *(int *)val = ((cn_vio *)s)->last_more;
    *n = sizeof(int);
    return 0;
}

static int cn_vio_errno(void) {
    return cn_vio_err;
}

/* zmq_poll on one virtual socket: ready now, or (timeout) at the next arrival within it. */
static int cn_vio_poll(cn_pollitem_t *items, int n, long timeout_ms) {
    cn_vio *v = (cn_vio *)items[0].socket;
    (void)n;
    if (cn_vio_ready(v)) {
        items[0].revents = items[0].events;
        return 1;
    }
    if (timeout_ms <= 0)
        return 0;
    int64_t until = v->now + (int64_t)timeout_ms * 1000000;
    if (v->i_frame < v->n_frames && v->arrive[v->i_frame] <= until) {
        v->now = v->arrive[v->i_frame];
        items[0].revents = items[0].events;
        return 1;
    }
    v->now = until;
    return 0;
}

#endif
