/* What 16-bit weights would buy the rsl_rl LSTM(48->256) + 256-128-12 ELU step (issue 12's ">= 5x
 * onnxruntime" target, out of reach in float32: the step's 1.39 MB of weights exceed this core's L2).
 * One whole step at C level, laid out as the kernel lays it out (mlp_core.h: axpy panels of 256-byte output
 * columns, read in order; sigmoid / tanh / ELU from kernels/vmath.h; the state h, c carried from step to
 * step), except that W_ih and W_hh are one (48 + 256) x 1024 matrix here (the kernel runs two products),
 * with the gate weights (304 inputs = 48 obs + 256 of h -> 4 x 256 gates, 1.19 MiB in float32) in:
 *   f32        float32: the kernel's format (the C-level time should match `bench recurrent`'s)
 *   f16        IEEE half (0.6 MiB: fits the 1 MiB L2), widened by vcvtph2ps, float32 FMA
 *   bf16       bfloat16, widened exactly by a shift / mask, float32 FMA
 *   bf16-dp    bfloat16 weights AND inputs (x, h rounded each step), vdpbf16ps (AVX512_BF16)
 * The 256-128-12 head stays float32 in every row (128 KiB: L2-resident). Two panels per pass: 8
 * independent accumulators, so the FMA latency does not bound the loop. Each row reports the p50 / p99
 * of 4001 single steps (weights warm, as in the loop) and the error of the 12 outputs against a float64
 * reference of the float32 model (libm exp / tanh) after 1 step and after 200 steps of one sequence (the
 * error carried through the recurrent state).
 *   gcc -O3 -march=x86-64-v4 -mavx512bf16 -o /tmp/lstm_step_16bit bench/c/lstm_step_16bit.c -lm
 *   flock /tmp/control-node-bench.lock taskset -c 1 /tmp/lstm_step_16bit
 * Needs AVX-512 F/BW/VL and AVX512_BF16 (Zen 4 / Zen 5, Sapphire Rapids and later). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../kernels/vmath.h"

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
MLP_VMATH(float, v16, v16i, vm)

#define NOBS 48
#define H 256
#define NIN (NOBS + H)    /* 304 */
#define NG (4 * H)        /* 1024 gate pre-activations: i, f, g, o (torch's order) */
#define PW 64             /* float32 outputs per 256-byte panel */
#define D1 128
#define D2 12
#define REPS 4001
#define SEQ 200

enum { F32, F16, BF16, BF16DP, NV };
static const char *NAMES[NV] = {"f32", "f16", "bf16", "bf16-dp"};

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static unsigned short to_bf16(float f) {           /* round to nearest even */
    unsigned u;
    memcpy(&u, &f, 4);
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* the weights of one model, in every format */
typedef struct {
    float *Wg32;                 /* [NG/PW panels][NIN][PW] */
    unsigned short *Wg16, *Wgb;  /* same layout: half; bf16 with 32-bit word k = (out k + 16, out k) */
    unsigned short *Wgd;         /* [panels][NIN/2][PW][2]: row pairs interleaved for vdpbf16ps */
    float *bg;                   /* [NG] (b_ih + b_hh) */
    float *W1, *b1;              /* [2 panels][H][PW], [D1] */
    float *W2, *b2;              /* [D1][16] (12 padded), [16] */
} model;

typedef struct {
    float *xin;                  /* [NIN]: obs then h */
    unsigned *xpair;             /* [NIN/2] bf16 pairs */
    float *g, *c, *y1, *y2;
} state;

/* g[0..NG) = Wg^T xin, two panels (8 accumulators) per pass; LOAD(w, k) gives 16 float32 weights */
#define GATES(LOADW, W)                                                                 \
    for (int p = 0; p < NG / PW; p += 2) {                                              \
        const __typeof__(W) wa = W + (size_t)p * NIN * PW, wb = wa + (size_t)NIN * PW;  \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                     \
        __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                                      \
        for (int i = 0; i < NIN; i++) {                                                 \
            const __m512 xi = _mm512_set1_ps(s->xin[i]);                                \
            const __typeof__(W) ra = wa + (size_t)i * PW, rb = wb + (size_t)i * PW;     \
            a0 = _mm512_fmadd_ps(xi, LOADW(ra, 0), a0); a1 = _mm512_fmadd_ps(xi, LOADW(ra, 1), a1); \
            a2 = _mm512_fmadd_ps(xi, LOADW(ra, 2), a2); a3 = _mm512_fmadd_ps(xi, LOADW(ra, 3), a3); \
            b0 = _mm512_fmadd_ps(xi, LOADW(rb, 0), b0); b1 = _mm512_fmadd_ps(xi, LOADW(rb, 1), b1); \
            b2 = _mm512_fmadd_ps(xi, LOADW(rb, 2), b2); b3 = _mm512_fmadd_ps(xi, LOADW(rb, 3), b3); \
        }                                                                               \
        float *o = s->g + p * PW;                                                       \
        _mm512_store_ps(o, a0); _mm512_store_ps(o + 16, a1); _mm512_store_ps(o + 32, a2); \
        _mm512_store_ps(o + 48, a3); _mm512_store_ps(o + 64, b0); _mm512_store_ps(o + 80, b1); \
        _mm512_store_ps(o + 96, b2); _mm512_store_ps(o + 112, b3);                      \
    }

#define LOAD_F32(r, k) _mm512_load_ps((r) + 16 * (k))
#define LOAD_F16(r, k) _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)((r) + 16 * (k))))
/* bf16 words: k = 0, 2 take the high halves (outputs 0-15, 32-47), k = 1, 3 the low ones, shifted up */
#define LOAD_BF16(r, k) ((k) % 2 == 0                                                   \
    ? _mm512_castsi512_ps(_mm512_and_si512(_mm512_load_si512((const void *)((r) + 32 * ((k) / 2))), \
                                           _mm512_set1_epi32((int)0xffff0000u)))         \
    : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512((const void *)((r) + 32 * ((k) / 2))), 16)))

__attribute__((noinline)) static void gates_dp(const model *m, state *s) {
    for (int j = 0; j < NIN; j += 32) {     /* x, h to bf16 pairs (304 = 9.5 x 32: the tail below) */
        __m512 lo = _mm512_loadu_ps(s->xin + j), hi = j + 16 < NIN ? _mm512_loadu_ps(s->xin + j + 16)
                                                                    : _mm512_setzero_ps();
        __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
        if (j + 32 <= NIN) _mm512_storeu_si512((void *)(s->xpair + j / 2), (__m512i)v);
        else _mm256_storeu_si256((__m256i *)(s->xpair + j / 2), _mm512_castsi512_si256((__m512i)v));
    }
    for (int p = 0; p < NG / PW; p += 2) {
        const unsigned short *wa = m->Wgd + (size_t)p * NIN * PW, *wb = wa + (size_t)NIN * PW;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int j = 0; j < NIN / 2; j++) {
            const __m512bh xj = (__m512bh)_mm512_set1_epi32((int)s->xpair[j]);
            const unsigned short *ra = wa + (size_t)j * 2 * PW, *rb = wb + (size_t)j * 2 * PW;
#define DP(acc, r, k) acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_load_si512((const void *)((r) + 32 * (k))), xj)
            DP(a0, ra, 0); DP(a1, ra, 1); DP(a2, ra, 2); DP(a3, ra, 3);
            DP(b0, rb, 0); DP(b1, rb, 1); DP(b2, rb, 2); DP(b3, rb, 3);
#undef DP
        }
        float *o = s->g + p * PW;
        _mm512_store_ps(o, a0); _mm512_store_ps(o + 16, a1); _mm512_store_ps(o + 32, a2);
        _mm512_store_ps(o + 48, a3); _mm512_store_ps(o + 64, b0); _mm512_store_ps(o + 80, b1);
        _mm512_store_ps(o + 96, b2); _mm512_store_ps(o + 112, b3);
    }
}

__attribute__((noinline)) static void gates_f32(const model *m, state *s) { GATES(LOAD_F32, m->Wg32) }
__attribute__((noinline)) static void gates_f16(const model *m, state *s) { GATES(LOAD_F16, m->Wg16) }
__attribute__((noinline)) static void gates_bf16(const model *m, state *s) { GATES(LOAD_BF16, m->Wgb) }

/* one step: obs (48) -> gates -> cell (h, c in place: h lives in xin[48..]) -> 256-128 ELU -> 12 */
__attribute__((noinline)) static void step(const model *m, state *s, const float *obs, int v) {
    memcpy(s->xin, obs, NOBS * sizeof(float));
    if (v == F32) gates_f32(m, s);
    else if (v == F16) gates_f16(m, s);
    else if (v == BF16) gates_bf16(m, s);
    else gates_dp(m, s);
    v16 *g = (v16 *)s->g, *c = (v16 *)s->c;
    const v16 *bg = (const v16 *)m->bg;
    for (int q = 0; q < H / 16; q++) {
        v16 i = vm_sigmoid(g[q] + bg[q]), f = vm_sigmoid(g[q + 16] + bg[q + 16]);
        v16 gg = vm_tanh(g[q + 32] + bg[q + 32]), o = vm_sigmoid(g[q + 48] + bg[q + 48]);
        c[q] = f * c[q] + i * gg;
        v16 h = o * vm_tanh(c[q]);
        memcpy(s->xin + NOBS + 16 * q, &h, sizeof h);      /* xin + 48 is not 64-byte aligned */
    }
    const float *h = s->xin + NOBS;
    for (int p = 0; p < D1 / PW; p += 2) {                   /* one pass: both panels */
        const float *wa = m->W1 + (size_t)p * H * PW, *wb = wa + (size_t)H * PW;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int i = 0; i < H; i++) {
            const __m512 xi = _mm512_set1_ps(h[i]);
            const float *ra = wa + (size_t)i * PW, *rb = wb + (size_t)i * PW;
            a0 = _mm512_fmadd_ps(xi, LOAD_F32(ra, 0), a0); a1 = _mm512_fmadd_ps(xi, LOAD_F32(ra, 1), a1);
            a2 = _mm512_fmadd_ps(xi, LOAD_F32(ra, 2), a2); a3 = _mm512_fmadd_ps(xi, LOAD_F32(ra, 3), a3);
            b0 = _mm512_fmadd_ps(xi, LOAD_F32(rb, 0), b0); b1 = _mm512_fmadd_ps(xi, LOAD_F32(rb, 1), b1);
            b2 = _mm512_fmadd_ps(xi, LOAD_F32(rb, 2), b2); b3 = _mm512_fmadd_ps(xi, LOAD_F32(rb, 3), b3);
        }
        __m512 acc[8] = {a0, a1, a2, a3, b0, b1, b2, b3};
        for (int k = 0; k < 8; k++) {
            v16 y = (v16)acc[k] + ((const v16 *)m->b1)[p * 4 + k];
            ((v16 *)s->y1)[p * 4 + k] = vm_elu(y, 1.0f);
        }
    }
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < D1; i++)
        a[i % 4] = _mm512_fmadd_ps(_mm512_set1_ps(s->y1[i]), _mm512_load_ps(m->W2 + 16 * i), a[i % 4]);
    _mm512_store_ps(s->y2, _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]))
                               + _mm512_load_ps(m->b2));
}

static double urand(void) { return rand() / (double)RAND_MAX * 2 - 1; }

/* the float64 reference of the float32 model, one step */
static void step_ref(double (*Wg)[NG], const double *bg, double (*W1)[D1], const double *b1,
                     double (*W2)[D2], const double *b2, double *h, double *c, const float *obs, double *y) {
    double x[NIN], g[NG], y1[D1];
    for (int i = 0; i < NOBS; i++) x[i] = obs[i];
    for (int i = 0; i < H; i++) x[NOBS + i] = h[i];
    for (int k = 0; k < NG; k++) {
        double t = bg[k];
        for (int i = 0; i < NIN; i++) t += Wg[i][k] * x[i];
        g[k] = t;
    }
    for (int k = 0; k < H; k++) {
        double i = 1 / (1 + exp(-g[k])), f = 1 / (1 + exp(-g[H + k])), gg = tanh(g[2 * H + k]);
        double o = 1 / (1 + exp(-g[3 * H + k]));
        c[k] = f * c[k] + i * gg;
        h[k] = o * tanh(c[k]);
    }
    for (int k = 0; k < D1; k++) {
        double t = b1[k];
        for (int i = 0; i < H; i++) t += W1[i][k] * h[i];
        y1[k] = t > 0 ? t : expm1(t);
    }
    for (int k = 0; k < D2; k++) {
        double t = b2[k];
        for (int i = 0; i < D1; i++) t += W2[i][k] * y1[i];
        y[k] = t;
    }
}

static void *zalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    memset(p, 0, (n + 63) / 64 * 64);
    return p;
}

int main(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
        fprintf(stderr, "lstm_step_16bit: needs AVX-512 and AVX512_BF16\n");
        return 2;
    }
    srand(1);
    /* torch's init: U(-1/sqrt(fan), 1/sqrt(fan)); float32 values, kept in float64 for the reference */
    static double Wg[NIN][NG], bg[NG], W1[H][D1], b1[D1], W2[D1][D2], b2[D2];
    for (int i = 0; i < NIN; i++) for (int k = 0; k < NG; k++) Wg[i][k] = (float)(urand() / 16);
    for (int k = 0; k < NG; k++) bg[k] = (float)(urand() / 8);
    for (int i = 0; i < H; i++) for (int k = 0; k < D1; k++) W1[i][k] = (float)(urand() / 16);
    for (int k = 0; k < D1; k++) b1[k] = (float)(urand() / 16);
    for (int i = 0; i < D1; i++) for (int k = 0; k < D2; k++) W2[i][k] = (float)(urand() / sqrt(128.0));
    for (int k = 0; k < D2; k++) b2[k] = (float)(urand() / sqrt(128.0));
    model m;
    m.Wg32 = zalloc(4 * (size_t)NIN * NG);
    m.Wg16 = zalloc(2 * (size_t)NIN * NG);
    m.Wgb = zalloc(2 * (size_t)NIN * NG);
    m.Wgd = zalloc(2 * (size_t)NIN * NG);
    m.bg = zalloc(4 * NG);
    m.W1 = zalloc(4 * H * D1);
    m.b1 = zalloc(4 * D1);
    m.W2 = zalloc(4 * D1 * 16);
    m.b2 = zalloc(4 * 16);
    for (int p = 0; p < NG / PW; p++)
        for (int i = 0; i < NIN; i++)
            for (int q = 0; q < PW; q++) {
                size_t o = ((size_t)p * NIN + i) * PW;
                float w = (float)Wg[i][p * PW + q];
                m.Wg32[o + q] = w;
                m.Wg16[o + q] = (unsigned short)_cvtss_sh(w, _MM_FROUND_TO_NEAREST_INT);
                int half = q / 32, r = q % 32;      /* word r % 16 of its 64-byte half: r < 16 high, else low */
                m.Wgb[o + half * 32 + 2 * (r % 16) + (r < 16)] = to_bf16(w);
                m.Wgd[((size_t)p * NIN + (i & ~1)) * PW + 2 * q + (i & 1)] = to_bf16(w);
            }
    for (int k = 0; k < NG; k++) m.bg[k] = (float)bg[k];
    for (int p = 0; p < D1 / PW; p++)
        for (int i = 0; i < H; i++)
            for (int q = 0; q < PW; q++) m.W1[((size_t)p * H + i) * PW + q] = (float)W1[i][p * PW + q];
    for (int k = 0; k < D1; k++) m.b1[k] = (float)b1[k];
    for (int i = 0; i < D1; i++) for (int k = 0; k < D2; k++) m.W2[16 * i + k] = (float)W2[i][k];
    for (int k = 0; k < D2; k++) m.b2[k] = (float)b2[k];
    static float obs[SEQ][NOBS];
    for (int t = 0; t < SEQ; t++) for (int i = 0; i < NOBS; i++) obs[t][i] = (float)(2 * urand());
    /* the reference sequence: outputs after step 1 and after step SEQ */
    static double yref[SEQ][D2];
    {
        double h[H] = {0}, c[H] = {0};
        for (int t = 0; t < SEQ; t++) step_ref(Wg, bg, W1, b1, W2, b2, h, c, obs[t], yref[t]);
    }
    state s;
    s.xin = zalloc(4 * (NIN + 32));
    s.xpair = zalloc(4 * (NIN / 2 + 16));
    s.g = zalloc(4 * NG);
    s.c = zalloc(4 * H);
    s.y1 = zalloc(4 * D1);
    s.y2 = zalloc(4 * 16);
    printf("LSTM(48->256) + 256-128-12 ELU, one step at C level: p50 / p99 of %d steps; output error vs a "
           "float64 reference after 1 and %d steps (max |err| / max |y|)\n", REPS, SEQ);
    static double t[REPS];
    for (int round = 0; round < 2; round++) {            /* the second round is reported: caches, clocks warm */
        for (int v = 0; v < NV; v++) {
            double e1 = 0, eN = 0, y1max = 0, yNmax = 0;
            memset(s.xin, 0, 4 * NIN);
            memset(s.c, 0, 4 * H);
            for (int k = 0; k < SEQ; k++) {              /* the sequence from zero state: the error */
                step(&m, &s, obs[k], v);
                for (int j = 0; j < D2; j++) {
                    if (k == 0) { e1 = fmax(e1, fabs(s.y2[j] - yref[0][j])); y1max = fmax(y1max, fabs(yref[0][j])); }
                    if (k == SEQ - 1) { eN = fmax(eN, fabs(s.y2[j] - yref[k][j])); yNmax = fmax(yNmax, fabs(yref[k][j])); }
                }
            }
            for (int k = 0; k < REPS; k++) {             /* timing: the state goes on (bounded: it is an LSTM) */
                double t0 = now_ns();
                step(&m, &s, obs[k % SEQ], v);
                t[k] = now_ns() - t0;
            }
            if (round == 1) {
                qsort(t, REPS, sizeof *t, cmp);
                size_t bytes = (v == F32 ? 4 : 2) * (size_t)NIN * NG + 4 * (size_t)(NG + H * D1 + D1 + D1 * 16 + 16);
                printf("%-8s weights %7.1f KiB  p50 %6.2f us  p99 %6.2f us  err 1 step %.1e  %d steps %.1e\n",
                       NAMES[v], bytes / 1024.0, t[REPS / 2] / 1e3, t[REPS * 99 / 100] / 1e3, e1 / y1max, SEQ,
                       eN / yNmax);
            }
        }
    }
    return 0;
}
