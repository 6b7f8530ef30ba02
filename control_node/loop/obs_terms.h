/*
 * The observation recipe, run once per policy tick: named raw signals in fixed slots -> the policy's input
 * vector, in the term order, with per-element offset / clip / scale and the history layout the plan states
 * (issue 45 section 1; the recipe format and the plan builder: control_node/loop/legged.py, whose
 * reference_obs is this file's numpy twin, step by step).
 *
 * No allocation, no locks, no libc call but memmove/memcpy and the libm functions: every buffer is owned by
 * the caller (the plan's arrays, the state's buffers), sized when the plan was built off the RT thread.
 *
 * Per element, in this order (IsaacLab's ObservationManager: func -> modifiers -> noise -> clip -> scale;
 * the offset stands where IsaacLab's modifiers stand, before the clip):
 *     v = raw - offset;  v = clip(v, lo, hi);  v = v * scale        (CN_CLIP_BEFORE_SCALE, the default)
 *     v = raw - offset;  v = v * scale;  v = clip(v, lo, hi)        (CN_CLIP_AFTER_SCALE: legged_gym,
 *                                                                    rl_sar, humanoid-gym clip the scaled obs)
 * An unclipped element has lo = -inf, hi = +inf. The clip is written with comparisons, not fmin/fmax, so a NaN
 * stays NaN (fmin would hide it behind a bound).
 */
#ifndef CONTROL_NODE_OBS_TERMS_H
#define CONTROL_NODE_OBS_TERMS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* term kinds (legged.TERM_KINDS holds the same numbers) */
enum {
    CN_OBS_JOINT_POS_REL = 1,   /* q[map[i]] - q0[i], policy joint order */
    CN_OBS_JOINT_VEL = 2,       /* qd[map[i]] */
    CN_OBS_GYRO = 3,            /* body-frame angular velocity (the IMU's gyro) */
    CN_OBS_GRAVITY = 4,         /* projected gravity R^T [0,0,-1] from the IMU quaternion */
    CN_OBS_COMMAND = 5,         /* the command vector */
    CN_OBS_LAST_ACTION = 6,     /* the policy's previous raw output; zeros after a reset */
    CN_OBS_GAIT_CLOCK = 7,      /* sin/cos of the gait phase from the policy tick counter */
    CN_OBS_CONSTANT = 8,        /* fixed values from the plan's params */
    CN_OBS_ACCEL = 9            /* the IMU's accelerometer */
};
enum { CN_QUAT_WXYZ = 0, CN_QUAT_XYZW = 1 };
enum { CN_HIST_TERM_MAJOR = 0, CN_HIST_FRAME_MAJOR = 1 };
enum { CN_FILL_FIRST = 0, CN_FILL_ZEROS = 1 };
enum { CN_CLOCK_SIN_COS = 0, CN_CLOCK_TWO_LEG = 1 };
enum { CN_CLIP_BEFORE_SCALE = 0, CN_CLIP_AFTER_SCALE = 1 };

/* the int fields of one term in the plan's term table (n_terms rows of CN_OBS_TERM_FIELDS) */
enum {
    CN_T_KIND = 0,
    CN_T_WIDTH = 1,       /* values per frame */
    CN_T_HIST = 2,        /* term-major: frames kept (>= 1); frame-major: 1 */
    CN_T_ELEM = 3,        /* where the term starts in the frame (and in scale/offset/lo/hi) */
    CN_T_PARAM = 4,       /* where its doubles start in params (gait clock: T, o0, o1; constant: values) */
    CN_T_CLIP_STAGE = 5,
    CN_T_FORM = 6,        /* gait clock: CN_CLOCK_* */
    CN_T_OUT = 7,         /* term-major: where its block of CN_T_HIST frames starts in the output */
    CN_OBS_TERM_FIELDS = 8
};

typedef struct {
    int n_terms, n_robot, n_joints, n_cmd, n_act;
    int quat_order, layout, fill, frame_hist;
    int newest_first;           /* history order: 0 oldest first (IsaacLab, humanoid-gym), 1 newest first (rl_sar) */
    int frame_width, out_width;
    int64_t k0;                 /* the gait clock's first tick after a reset (1: legged_gym, IsaacLab) */
    double policy_dt;
    const int32_t *terms;       /* n_terms x CN_OBS_TERM_FIELDS */
    const int32_t *joint_map;   /* n_joints: policy joint i -> robot joint slot */
    const double *q0;           /* n_joints, policy order */
    const double *scale, *offset, *lo, *hi;   /* frame_width each */
    const double *params;
} cn_obs_plan;

/* Raw signals, robot order for the joints; a pointer the plan does not use may be NULL. */
typedef struct {
    const double *joint_pos, *joint_vel, *quat, *gyro, *acc, *command;
} cn_obs_signals;

typedef struct {
    double *frame;          /* frame_width: this tick's processed terms */
    double *hist;           /* out_width: the last output, which is the history itself */
    double *last_action;    /* n_act */
    int64_t k;              /* computes since the reset */
    int filled;             /* 0 after a reset: the next compute fills the history */
} cn_obs_state;

/* Everything the policy carries across ticks starts again: last action, history, gait clock. */
static inline void cn_obs_reset(const cn_obs_plan *p, cn_obs_state *s) {
    memset(s->last_action, 0, sizeof(double) * (size_t)p->n_act);
    memset(s->hist, 0, sizeof(double) * (size_t)p->out_width);
    s->k = 0;
    s->filled = 0;
}

/* The raw output of the policy tick just run (the next tick's last_action term). */
static inline void cn_obs_note_action(const cn_obs_plan *p, cn_obs_state *s, const double *u) {
    memcpy(s->last_action, u, sizeof(double) * (size_t)p->n_act);
}

/* g_b = R^T [0,0,-1], R the body-to-world rotation of the (normalised) quaternion: minus R's third row. */
static inline void cn_obs_gravity(const double *q4, int order, double *g) {
    double w, x, y, z;
    if (order == CN_QUAT_WXYZ) { w = q4[0]; x = q4[1]; y = q4[2]; z = q4[3]; }
    else { x = q4[0]; y = q4[1]; z = q4[2]; w = q4[3]; }
    const double n2 = w * w + x * x + y * y + z * z;
    const double s = 2.0 / n2;      /* a zero quaternion gives inf/NaN: visible, never a made-up gravity */
    g[0] = -s * (x * z - w * y);
    g[1] = -s * (y * z + w * x);
    g[2] = -(1.0 - s * (x * x + y * y));
}

static inline double cn_obs_frac(double v) { return v - floor(v); }

/* One term's raw values into dst (width values). */
static inline void cn_obs_raw(const cn_obs_plan *p, const cn_obs_state *s, const int32_t *t,
                              const cn_obs_signals *sig, double *dst) {
    const int w = t[CN_T_WIDTH];
    const double *par = p->params + t[CN_T_PARAM];
    int i;
    switch (t[CN_T_KIND]) {
    case CN_OBS_JOINT_POS_REL:
        for (i = 0; i < w; i++) dst[i] = sig->joint_pos[p->joint_map[i]] - p->q0[i];
        break;
    case CN_OBS_JOINT_VEL:
        for (i = 0; i < w; i++) dst[i] = sig->joint_vel[p->joint_map[i]];
        break;
    case CN_OBS_GYRO: memcpy(dst, sig->gyro, 3 * sizeof(double)); break;
    case CN_OBS_ACCEL: memcpy(dst, sig->acc, 3 * sizeof(double)); break;
    case CN_OBS_GRAVITY: cn_obs_gravity(sig->quat, p->quat_order, dst); break;
    case CN_OBS_COMMAND: memcpy(dst, sig->command, sizeof(double) * (size_t)w); break;
    case CN_OBS_LAST_ACTION: memcpy(dst, s->last_action, sizeof(double) * (size_t)w); break;
    case CN_OBS_CONSTANT: memcpy(dst, par, sizeof(double) * (size_t)w); break;
    case CN_OBS_GAIT_CLOCK: {
        /* phi = (k * policy_dt mod T) / T from the tick counter, never the wall clock; legs offset in periods */
        const double T = par[0];
        const double phi = fmod((double)(p->k0 + s->k) * p->policy_dt, T) / T;
        const double two_pi = 6.283185307179586;
        const double p0 = cn_obs_frac(phi + par[1]);
        if (t[CN_T_FORM] == CN_CLOCK_SIN_COS) {
            dst[0] = sin(two_pi * p0);
            dst[1] = cos(two_pi * p0);
        } else {            /* legged_control2's order: [cos phi0, cos phi1, sin phi0, sin phi1] */
            const double p1 = cn_obs_frac(phi + par[2]);
            dst[0] = cos(two_pi * p0);
            dst[1] = cos(two_pi * p1);
            dst[2] = sin(two_pi * p0);
            dst[3] = sin(two_pi * p1);
        }
        break;
    }
    default:            /* unreachable: the plan builder refuses unknown kinds */
        for (i = 0; i < w; i++) dst[i] = NAN;
    }
}

static inline double cn_obs_clip(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* Add one w-value frame to a history block of h slots, the newest last (or first: newest_first); the first
 * frame after a reset fills every slot with itself or leaves the older ones zero. */
static inline void cn_obs_push(double *block, const double *v, int w, int h, int filled, int fill, int newest_first) {
    const size_t wb = sizeof(double) * (size_t)w;
    double *newest = newest_first ? block : block + (size_t)(h - 1) * w;
    double *older = newest_first ? block + w : block;
    int j;
    if (filled) {
        if (newest_first) memmove(block + w, block, wb * (size_t)(h - 1));
        else memmove(block, block + w, wb * (size_t)(h - 1));
    } else {
        for (j = 0; j < h - 1; j++) {
            if (fill == CN_FILL_FIRST) memcpy(older + (size_t)j * w, v, wb);
            else memset(older + (size_t)j * w, 0, wb);
        }
    }
    memcpy(newest, v, wb);
}

/* One policy tick: out (out_width) = the policy input; advances the gait clock and the history. */
static inline void cn_obs_compute(const cn_obs_plan *p, cn_obs_state *s, const cn_obs_signals *sig, double *out) {
    int ti, j;
    for (ti = 0; ti < p->n_terms; ti++) {
        const int32_t *t = p->terms + (size_t)ti * CN_OBS_TERM_FIELDS;
        const int e0 = t[CN_T_ELEM], w = t[CN_T_WIDTH];
        double *v = s->frame + e0;
        cn_obs_raw(p, s, t, sig, v);
        for (j = e0; j < e0 + w; j++) {
            double x = s->frame[j] - p->offset[j];
            if (t[CN_T_CLIP_STAGE] == CN_CLIP_BEFORE_SCALE) x = cn_obs_clip(x, p->lo[j], p->hi[j]) * p->scale[j];
            else x = cn_obs_clip(x * p->scale[j], p->lo[j], p->hi[j]);
            s->frame[j] = x;
        }
        if (p->layout == CN_HIST_TERM_MAJOR)
            cn_obs_push(s->hist + t[CN_T_OUT], v, w, t[CN_T_HIST], s->filled, p->fill, p->newest_first);
    }
    if (p->layout == CN_HIST_FRAME_MAJOR)
        cn_obs_push(s->hist, s->frame, p->frame_width, p->frame_hist, s->filled, p->fill, p->newest_first);
    s->filled = 1;
    s->k++;
    memcpy(out, s->hist, sizeof(double) * (size_t)p->out_width);
}

#endif
