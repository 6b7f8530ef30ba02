/*
 * The action path at loop rate (issue 45 sections 2 and 3): the held policy action -> joint targets,
 * impedance commands and PD torques every loop tick, and the mode rules (passive, damping, stand, policy)
 * with each transition recorded in a small ring. Its numpy twin is control_node/loop/legged.py's
 * reference_actuator / reference_request, matched step by step by tests/test_legged_units.py.
 *
 * No allocation, no locks: the plan's arrays and the state's buffers are the caller's, sized off the RT
 * thread. The unit works in the POLICY's joint order (gains, defaults and limits come in that order from the
 * deploy contract); it reads q, qd through sens_map (policy joint i -> the robot's sensor slot) and writes
 * each output through out_map (policy joint i -> the robot's actuator slot), so sensor and actuator order
 * may differ (MuJoCo Menagerie's Go2: qpos FL,FR,RL,RR, actuators FR,FL,RR,RL).
 *
 * Outputs (CN_O_ROWS rows of n_out): q*, qd* (always 0), kp, kd, tau_ff (the impedance command a drive
 * runs with its own fresh velocity; row 0 alone is the position target) and tau = clip(kp (q* - q) +
 * kd (0 - qd) + tau_ff, +-tau_max), computed every tick from the newest frame's q, qd.
 *
 * The PD's frame-age limit (pd_max_age_ns, shorter than the watchdog's stale_after_ns): past it the torque
 * is NOT recomputed from the old q, qd (damping with an old velocity pushes the wrong way); the last torque
 * computed from a fresh frame is ramped linearly to zero over pd_ramp_ns of frame age.
 */
#ifndef CONTROL_NODE_ACTUATOR_H
#define CONTROL_NODE_ACTUATOR_H

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { CN_MODE_PASSIVE = 0, CN_MODE_DAMPING = 1, CN_MODE_STAND = 2, CN_MODE_POLICY = 3, CN_N_MODES = 4 };
/* why a transition happened (the ring's reason field) */
enum { CN_WHY_REQUEST = 0, CN_WHY_STALE = 1, CN_WHY_NON_FINITE = 2, CN_WHY_VELOCITY_GUARD = 3 };
/* a request's answer */
enum { CN_REQ_OK = 0, CN_REQ_NO_STAND = 1, CN_REQ_BAD_MODE = 2 };
/* the tick's return: the mode | these bits */
enum { CN_ACT_NO_COMMAND = 16, CN_ACT_RAMPING = 32 };

/* per-joint doubles: CN_J_FIELDS rows of n (policy order) */
enum {
    CN_J_DEFAULT = 0, CN_J_SCALE, CN_J_KP, CN_J_KD, CN_J_TAU_MAX, CN_J_Q_LO, CN_J_Q_HI, CN_J_DAMP_KD,
    CN_J_STAND_KP, CN_J_STAND_KD, CN_J_RATE, CN_J_VEL_MAX, CN_J_TAU_FF, CN_J_FIELDS
};
enum { CN_O_Q = 0, CN_O_QD, CN_O_KP, CN_O_KD, CN_O_TAU_FF, CN_O_TAU, CN_O_ROWS };
enum { CN_TR_FIELDS = 5 };      /* cycle, t_ns, from, to, reason */

typedef struct {
    int n, n_robot, n_out;
    const int32_t *sens_map, *out_map;
    const double *j;                  /* CN_J_FIELDS x n */
    int clip_target, rate_limit, vel_guard, policy_without_stand, stale_hold;
    int64_t period_ns, stale_after_ns, pd_max_age_ns, pd_ramp_ns, stand_ns;
    double stand_tol;
} cn_act_plan;

typedef struct {
    double *q_goal;     /* n: the held target from the last policy action (zero-order hold) */
    double *q_cmd;      /* n: the commanded target (q_goal, or moving toward it under the rate limit) */
    double *q_start;    /* n: the measured pose at stand entry */
    double *q_last;     /* n: the last tick's q* */
    double *tau_fresh;  /* n: the last torque computed from a frame within the PD's age limit */
    int64_t *tr;        /* tr_cap x CN_TR_FIELDS */
    int64_t tr_cap, tr_w, tr_r, tr_dropped;
    int mode, stand_done, stand_fresh, have_t_prev;
    int64_t stand_t0, t_prev, cycle;
    /* counters: each limit or fault counted whenever it acts */
    int64_t rate_limited, vel_guard_trips, tau_clipped, ramp_ticks, stale_trips, nonfinite_trips, refused;
} cn_act_state;

static inline double cn_act_jf(const cn_act_plan *p, int field, int i) { return p->j[(size_t)field * p->n + i]; }

static inline void cn_act_record(cn_act_state *s, int from, int to, int why, int64_t t_ns) {
    if (s->tr_w - s->tr_r >= s->tr_cap) { s->tr_dropped++; return; }   /* never overwrite what is not read */
    int64_t *r = s->tr + (size_t)(s->tr_w % s->tr_cap) * CN_TR_FIELDS;
    r[0] = s->cycle; r[1] = t_ns; r[2] = from; r[3] = to; r[4] = why;
    s->tr_w++;
}

/* Enter `to` (the rules were checked by the caller): record it and set the mode's entry state. */
static inline void cn_act_enter(const cn_act_plan *p, cn_act_state *s, int to, int why, int64_t t_ns) {
    int i;
    cn_act_record(s, s->mode, to, why, t_ns);
    s->mode = to;
    if (to == CN_MODE_PASSIVE || to == CN_MODE_DAMPING) {
        s->stand_done = 0;              /* a fall to passive or damping means standing up again */
    } else if (to == CN_MODE_STAND) {
        s->stand_done = 0;
        s->stand_fresh = 1;             /* the start pose is measured at the next tick */
    } else {
        /* the policy starts from a = 0 (q* = default), approached under the rate limit if one is on */
        for (i = 0; i < p->n; i++) {
            s->q_goal[i] = cn_act_jf(p, CN_J_DEFAULT, i);
            s->q_cmd[i] = p->rate_limit ? s->q_last[i] : s->q_goal[i];
        }
    }
}

static inline void cn_act_reset(const cn_act_plan *p, cn_act_state *s) {
    size_t nb = sizeof(double) * (size_t)p->n;
    memset(s->q_goal, 0, nb); memset(s->q_cmd, 0, nb); memset(s->q_start, 0, nb);
    memset(s->q_last, 0, nb); memset(s->tau_fresh, 0, nb);
    s->tr_w = s->tr_r = s->tr_dropped = 0;
    s->mode = CN_MODE_PASSIVE;
    s->stand_done = s->stand_fresh = s->have_t_prev = 0;
    s->stand_t0 = s->t_prev = s->cycle = 0;
    s->rate_limited = s->vel_guard_trips = s->tau_clipped = s->ramp_ticks = 0;
    s->stale_trips = s->nonfinite_trips = s->refused = 0;
}

/* A mode request (operator, control endpoint): the policy only after a completed stand unless configured. */
static inline int cn_act_request(const cn_act_plan *p, cn_act_state *s, int to, int64_t t_ns) {
    if (to < 0 || to >= CN_N_MODES) return CN_REQ_BAD_MODE;
    if (to == s->mode) return CN_REQ_OK;
    if (to == CN_MODE_POLICY && !s->stand_done && !p->policy_without_stand) { s->refused++; return CN_REQ_NO_STAND; }
    cn_act_enter(p, s, to, CN_WHY_REQUEST, t_ns);
    return CN_REQ_OK;
}

/* The policy's kernel reported a non-finite output (Policy.act_ptr returned -1 and its u is garbage, so the
 * cycle says so here instead of passing u): damping, as for a non-finite action. */
static inline void cn_act_non_finite(const cn_act_plan *p, cn_act_state *s, int64_t t_ns) {
    if (s->mode != CN_MODE_POLICY) return;
    s->nonfinite_trips++;
    cn_act_enter(p, s, CN_MODE_DAMPING, CN_WHY_NON_FINITE, t_ns);
}

/* One loop tick. q, qd: the newest frame (robot sensor order), frame_age_ns old; a: the policy's raw action
 * of this tick (n values, policy order) or NULL on a hold tick; out: CN_O_ROWS x n_out. Returns the mode
 * after the tick | CN_ACT_NO_COMMAND (passive: send nothing) | CN_ACT_RAMPING (torque ramping down). */
static inline int cn_act_tick(const cn_act_plan *p, cn_act_state *s, int64_t t_ns, int64_t frame_age_ns,
                              const double *q, const double *qd, const double *a, double *out) {
    const int n = p->n, no = p->n_out;
    int i, acted;
    /* faults first: an action computed from old or broken data is never applied */
    if (frame_age_ns > p->stale_after_ns) {
        a = NULL;
        if (!p->stale_hold && (s->mode == CN_MODE_POLICY || s->mode == CN_MODE_STAND)) {
            s->stale_trips++;
            cn_act_enter(p, s, CN_MODE_DAMPING, CN_WHY_STALE, t_ns);
        }
    }
    if (a != NULL && s->mode == CN_MODE_POLICY) {
        for (i = 0; i < n; i++) {
            if (!isfinite(a[i])) {
                s->nonfinite_trips++;
                cn_act_enter(p, s, CN_MODE_DAMPING, CN_WHY_NON_FINITE, t_ns);
                a = NULL;
                break;
            }
        }
    }
    if (a != NULL && s->mode == CN_MODE_POLICY) {
        for (i = 0; i < n; i++) {       /* IsaacLab's JointPositionAction: raw * scale + offset, then the clip */
            double g = cn_act_jf(p, CN_J_DEFAULT, i) + cn_act_jf(p, CN_J_SCALE, i) * a[i];
            if (p->clip_target) {
                const double lo = cn_act_jf(p, CN_J_Q_LO, i), hi = cn_act_jf(p, CN_J_Q_HI, i);
                g = g < lo ? lo : (g > hi ? hi : g);
            }
            s->q_goal[i] = g;
        }
    }
    const int fresh = frame_age_ns <= p->pd_max_age_ns;
    /* the velocity guard reads qd, so only a fresh qd can trip it */
    if (p->vel_guard && fresh && s->mode == CN_MODE_POLICY) {
        for (i = 0; i < n; i++) {
            if (fabs(qd[p->sens_map[i]]) > cn_act_jf(p, CN_J_VEL_MAX, i)) {
                s->vel_guard_trips++;
                cn_act_enter(p, s, CN_MODE_DAMPING, CN_WHY_VELOCITY_GUARD, t_ns);
                break;
            }
        }
    }
    const int64_t dt_ns = s->have_t_prev ? t_ns - s->t_prev : p->period_ns;
    s->t_prev = t_ns;
    s->have_t_prev = 1;
    if (s->mode == CN_MODE_POLICY) {
        if (p->rate_limit) {
            acted = 0;
            for (i = 0; i < n; i++) {
                const double step = cn_act_jf(p, CN_J_RATE, i) * (double)dt_ns * 1e-9;
                const double d = s->q_goal[i] - s->q_cmd[i];
                if (d > step) { s->q_cmd[i] += step; acted = 1; }
                else if (d < -step) { s->q_cmd[i] -= step; acted = 1; }
                else s->q_cmd[i] = s->q_goal[i];
            }
            s->rate_limited += acted;
        } else {
            memcpy(s->q_cmd, s->q_goal, sizeof(double) * (size_t)n);
        }
    }
    if (s->mode == CN_MODE_STAND && s->stand_fresh) {
        /* the ramp starts from the MEASURED pose; already within the tolerance: no ramp */
        double err = 0.0;
        for (i = 0; i < n; i++) {
            s->q_start[i] = q[p->sens_map[i]];
            const double e = fabs(s->q_start[i] - cn_act_jf(p, CN_J_DEFAULT, i));
            if (e > err) err = e;
        }
        s->stand_t0 = t_ns;
        s->stand_fresh = 0;
        if (err <= p->stand_tol) s->stand_done = 1;
    }
    double alpha = 1.0;
    if (s->mode == CN_MODE_STAND && !s->stand_done) {
        alpha = p->stand_ns > 0 ? (double)(t_ns - s->stand_t0) / (double)p->stand_ns : 1.0;
        if (alpha >= 1.0) { alpha = 1.0; s->stand_done = 1; }
        if (alpha < 0.0) alpha = 0.0;
    }
    int clipped = 0, ramping = 0;
    double ramp = 1.0;
    if (!fresh) {
        ramp = p->pd_ramp_ns > 0 ? 1.0 - (double)(frame_age_ns - p->pd_max_age_ns) / (double)p->pd_ramp_ns : 0.0;
        if (ramp < 0.0) ramp = 0.0;
        ramping = 1;
        s->ramp_ticks++;
    }
    for (i = 0; i < n; i++) {
        const int si = p->sens_map[i];
        const double qi = q[si], qdi = qd[si];
        double qs, kp, kd, ff;
        switch (s->mode) {
        case CN_MODE_DAMPING: qs = qi; kp = 0.0; kd = cn_act_jf(p, CN_J_DAMP_KD, i); ff = 0.0; break;
        case CN_MODE_STAND: {
            const double q0 = cn_act_jf(p, CN_J_DEFAULT, i);
            qs = alpha >= 1.0 ? q0 : s->q_start[i] + alpha * (q0 - s->q_start[i]);
            kp = cn_act_jf(p, CN_J_STAND_KP, i); kd = cn_act_jf(p, CN_J_STAND_KD, i);
            ff = cn_act_jf(p, CN_J_TAU_FF, i);
            break;
        }
        case CN_MODE_POLICY:
            qs = s->q_cmd[i]; kp = cn_act_jf(p, CN_J_KP, i); kd = cn_act_jf(p, CN_J_KD, i);
            ff = cn_act_jf(p, CN_J_TAU_FF, i);
            break;
        default: qs = qi; kp = 0.0; kd = 0.0; ff = 0.0;      /* passive: no command, zero torque */
        }
        double tau;
        if (s->mode == CN_MODE_PASSIVE) {
            tau = 0.0;
            s->tau_fresh[i] = 0.0;
        } else if (fresh) {
            const double tmax = cn_act_jf(p, CN_J_TAU_MAX, i);
            tau = kp * (qs - qi) + kd * (0.0 - qdi) + ff;
            if (tau > tmax) { tau = tmax; clipped = 1; }
            else if (tau < -tmax) { tau = -tmax; clipped = 1; }
            s->tau_fresh[i] = tau;
        } else {
            tau = s->tau_fresh[i] * ramp;
        }
        s->q_last[i] = qs;
        const int o = p->out_map[i];
        out[(size_t)CN_O_Q * no + o] = qs;
        out[(size_t)CN_O_QD * no + o] = 0.0;
        out[(size_t)CN_O_KP * no + o] = kp;
        out[(size_t)CN_O_KD * no + o] = kd;
        out[(size_t)CN_O_TAU_FF * no + o] = ff;
        out[(size_t)CN_O_TAU * no + o] = tau;
    }
    s->tau_clipped += clipped;
    s->cycle++;
    return s->mode | (s->mode == CN_MODE_PASSIVE ? CN_ACT_NO_COMMAND : 0) | (ramping ? CN_ACT_RAMPING : 0);
}

#endif
