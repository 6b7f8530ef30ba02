/*
 * Accuracy and special-value check of kernels/vmath.h against libm.
 *
 *   cc -O3 -fno-math-errno -fno-trapping-math -Ikernels kernels/tests_c/vmath_check.c -lm
 *
 * Instantiates MLP_VMATH for SSE2 (16-byte vectors), AVX2+FMA (32-byte, under a target
 * pragma), 64-byte vectors under the same AVX2 target ("avx2w": the 8/16-lane code on any AVX2
 * CPU) and AVX-512 (64-byte, under a target pragma; run only when the CPU has it), runs
 * every function over the same inputs in each copy and compares each lane with a reference:
 * long double libm (expl, expm1l, log1pl, tanhl) for double, double libm for float.
 * Prints one line per function / type / ISA with the max error in ULP of the result and where,
 * and exits 1 if an error bound (the table in vmath.h, repeated in BOUND below) is exceeded or
 * any NaN / inf / saturation / signed-zero rule stated in vmath.h is broken.
 * Option -v: list every rule violation, not just the first few.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vmath.h"

#if defined(__GNUC__)
/* 64-byte vectors under the AVX2 target: the inlined helpers take them by value */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

enum { F_EXP, F_EXPM1, F_LOG1P, F_ELU, F_SELU, F_CELU, F_LEAKY, F_TANH, F_SIGMOID, F_SOFTPLUS,
       F_SILU, NFUN };
static const char *const FNAME[NFUN] = {"exp", "expm1", "log1p", "elu", "selu", "celu",
                                        "leaky_relu", "tanh", "sigmoid", "softplus", "silu"};

/* Max error in ULP allowed, [function][0: double, 1: float]; must match the table in vmath.h
 * (tests/test_vmath.py checks that it does). */
static const double BOUND[NFUN][2] = {
    [F_EXP] = {1.5, 1.5},      [F_EXPM1] = {2.0, 2.0},    [F_LOG1P] = {1.5, 2.0},
    [F_ELU] = {2.5, 2.5},      [F_SELU] = {2.5, 2.5},     [F_CELU] = {3.0, 3.0},
    [F_LEAKY] = {0.5, 0.5},    [F_TANH] = {3.0, 3.0},     [F_SIGMOID] = {3.0, 3.0},
    [F_SOFTPLUS] = {2.5, 2.5}, [F_SILU] = {3.5, 3.5},
};

typedef struct { int f; double alpha; } tcase;
static const tcase CASES[] = {
    {F_EXP, 0}, {F_EXPM1, 0}, {F_LOG1P, 0}, {F_ELU, 1.0}, {F_ELU, 0.3}, {F_SELU, 0},
    {F_CELU, 1.0}, {F_CELU, 2.5}, {F_CELU, 0.3}, {F_LEAKY, 0.01}, {F_LEAKY, 0.2}, {F_TANH, 0},
    {F_SIGMOID, 0}, {F_SOFTPLUS, 0}, {F_SILU, 0},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))
static int has_alpha(int f) { return f == F_ELU || f == F_CELU || f == F_LEAKY; }

/* One array -> array driver per instantiation; compiled under the instantiation's target. */
#define VM_APPLY(T, VT, NAME)                                                            \
static void NAME##_apply(int f, const T *in, T *out, size_t n, T alpha) {                \
    enum { L = sizeof(VT) / sizeof(T) };                                                 \
    for (size_t i = 0; i < n; i += L) {                                                  \
        VT x, y;                                                                         \
        memcpy(&x, in + i, sizeof x);                                                    \
        switch (f) {                                                                     \
        case F_EXP: y = NAME##_exp(x); break;                                            \
        case F_EXPM1: y = NAME##_expm1(x); break;                                        \
        case F_LOG1P: y = NAME##_log1p(x); break;                                        \
        case F_ELU: y = NAME##_elu(x, alpha); break;                                     \
        case F_SELU: y = NAME##_selu(x); break;                                          \
        case F_CELU: y = NAME##_celu(x, alpha); break;                                   \
        case F_LEAKY: y = NAME##_leaky_relu(x, alpha); break;                            \
        case F_TANH: y = NAME##_tanh(x); break;                                          \
        case F_SIGMOID: y = NAME##_sigmoid(x); break;                                    \
        case F_SOFTPLUS: y = NAME##_softplus(x); break;                                  \
        default: y = NAME##_silu(x); break;                                              \
        }                                                                                \
        memcpy(out + i, &y, sizeof y);                                                   \
    }                                                                                    \
}

/* SSE2 baseline */
typedef double v2d __attribute__((vector_size(16)));
typedef int64_t v2l __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
MLP_VMATH(double, v2d, v2l, vm_d_sse2)
MLP_VMATH(float, v4f, v4i, vm_f_sse2)
VM_APPLY(double, v2d, vm_d_sse2)
VM_APPLY(float, v4f, vm_f_sse2)

#if defined(__x86_64__)
#define VM_HAVE_X86 1
/* AVX2 + FMA */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#endif
typedef double v4d __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
MLP_VMATH(double, v4d, v4l, vm_d_avx2)
MLP_VMATH(float, v8f, v8i, vm_f_avx2)
VM_APPLY(double, v4d, vm_d_avx2)
VM_APPLY(float, v8f, vm_f_avx2)
/* 64-byte vectors on AVX2 (two registers each): the 8- and 16-lane code paths, run even
 * where the CPU has no AVX-512 */
typedef double w8d __attribute__((vector_size(64)));
typedef int64_t w8l __attribute__((vector_size(64)));
typedef float w16f __attribute__((vector_size(64)));
typedef int32_t w16i __attribute__((vector_size(64)));
MLP_VMATH(double, w8d, w8l, vm_d_avx2w)
MLP_VMATH(float, w16f, w16i, vm_f_avx2w)
VM_APPLY(double, w8d, vm_d_avx2w)
VM_APPLY(float, w16f, vm_f_avx2w)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* AVX-512 (x86-64-v4) */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,avx"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#endif
typedef double v8d __attribute__((vector_size(64)));
typedef int64_t v8l __attribute__((vector_size(64)));
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
MLP_VMATH(double, v8d, v8l, vm_d_avx512)
MLP_VMATH(float, v16f, v16i, vm_f_avx512)
VM_APPLY(double, v8d, vm_d_avx512)
VM_APPLY(float, v16f, vm_f_avx512)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

typedef struct {
    const char *name;
    void (*fd)(int, const double *, double *, size_t, double);
    void (*ff)(int, const float *, float *, size_t, float);
    int avail;
} isa_t;

/* ---------------------------------------------------------------- references */
#define SELU_L 1.0507009873554804934193349852946L
#define SELU_A 1.6732632423543772848170429916717L

static long double ref_ld(int f, long double x, long double al) {
    if (x != x) return x;
    switch (f) {
    case F_EXP: return expl(x);
    case F_EXPM1: return expm1l(x);
    case F_LOG1P: return log1pl(x);
    case F_ELU: return x > 0 ? x : al * expm1l(x);
    case F_SELU: return x > 0 ? SELU_L * x : SELU_L * SELU_A * expm1l(x);
    case F_CELU: return fmaxl(0, x) + fminl(0, al * expm1l(x / al));
    case F_LEAKY: return x >= 0 ? x : al * x;
    case F_TANH: return tanhl(x);
    case F_SIGMOID: return x >= 0 ? 1 / (1 + expl(-x)) : expl(x) / (1 + expl(x));
    case F_SOFTPLUS: return (x > 0 ? x : 0) + log1pl(expl(-fabsl(x)));
    default:
        if (isinf(x)) return x > 0 ? x : -0.0L;
        return x >= 0 ? x / (1 + expl(-x)) : x * expl(x) / (1 + expl(x));
    }
}
static double ref_d(int f, double x, double al) {
    if (x != x) return x;
    switch (f) {
    case F_EXP: return exp(x);
    case F_EXPM1: return expm1(x);
    case F_LOG1P: return log1p(x);
    case F_ELU: return x > 0 ? x : al * expm1(x);
    case F_SELU: return x > 0 ? (double)SELU_L * x : (double)(SELU_L * SELU_A) * expm1(x);
    case F_CELU: return fmax(0, x) + fmin(0, al * expm1(x / al));
    case F_LEAKY: return x >= 0 ? x : al * x;
    case F_TANH: return tanh(x);
    case F_SIGMOID: return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x));
    case F_SOFTPLUS: return (x > 0 ? x : 0) + log1p(exp(-fabs(x)));
    default:
        if (isinf(x)) return x > 0 ? x : -0.0;
        return x >= 0 ? x / (1 + exp(-x)) : x * exp(x) / (1 + exp(x));
    }
}

/* ---------------------------------------------------------------- inputs */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {             /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static double urand(void) { return (double)(rng() >> 11) * 0x1p-53; }

typedef struct { double *x; size_t n, cap; } vec;
static void push(vec *v, double x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 1 << 20;
        v->x = realloc(v->x, v->cap * sizeof *v->x);
        if (!v->x) { perror("realloc"); exit(2); }
    }
    v->x[v->n++] = x;
}

/* is_f: generate float values (every value pushed is exactly a float) */
static double to_t(double x, int is_f) { return is_f ? (double)(float)x : x; }
static double next_t(double x, double dir, int is_f) {
    return is_f ? (double)nextafterf((float)x, (float)dir) : nextafter(x, dir);
}
static void around(vec *v, double c, int k, int is_f) {
    c = to_t(c, is_f);
    push(v, c);
    double lo = c, hi = c;
    for (int i = 0; i < k; i++) {
        lo = next_t(lo, -INFINITY, is_f); hi = next_t(hi, INFINITY, is_f);
        push(v, lo); push(v, hi);
    }
}
static void linear(vec *v, double a, double b, size_t n, int is_f) {
    for (size_t i = 0; i < n; i++) push(v, to_t(a + (b - a) * ((double)i + urand()) / (double)n, is_f));
}

static vec make_inputs(int is_f) {
    vec v = {0};
    const size_t NB = (size_t)1 << 20;         /* per sign, spread over the finite bit patterns */
    if (!is_f) {
        const uint64_t top = 0x7ff0000000000000ull;   /* bits of +inf: all finite below */
        for (size_t i = 0; i < NB; i++) {
            uint64_t b = (uint64_t)(((double)i + urand()) / (double)NB * (double)top);
            if (b >= top) b = top - 1;
            double x; memcpy(&x, &b, 8);
            push(&v, x); push(&v, -x);
        }
    } else {
        const uint32_t top = 0x7f800000u;
        for (size_t i = 0; i < NB; i++) {
            uint32_t b = (uint32_t)(((double)i + urand()) / (double)NB * (double)top);
            if (b >= top) b = top - 1;
            float x; memcpy(&x, &b, 4);
            push(&v, x); push(&v, -(double)x);
        }
    }
    const size_t NL = (size_t)1 << 18;
    if (!is_f) { linear(&v, -800, 720, NL, 0); linear(&v, -40, 40, NL, 0); }
    else { linear(&v, -110, 90, NL, 1); linear(&v, -20, 20, NL, 1); }
    linear(&v, -1, 1, NL, is_f);
    linear(&v, -1, -0.5, NL / 2, is_f);
    /* reduction boundaries: every k*ln2/2 in the clamp range */
    const double ln2 = 0.69314718055994530942;
    const int kmin = is_f ? -433 : -2886, kmax = is_f ? 257 : 2049;
    for (int k = kmin; k <= kmax; k++) around(&v, k * ln2 / 2, 8, is_f);
    /* thresholds: overflow, underflow to 0, subnormal results, clamps, saturation, -1 */
    const double thr_d[] = {709.782712893384, 709.78, -745.13321910194122, -744.44007192138122,
                            -708.39641853226408, -1000, 710, 19.061, 18.715, 36.737, 37.43,
                            -751.7, -40, 40, 0.5493, 0.34657359, -1, -0.5, 1, 2, 1e-300, 1e-20,
                            1e-8, 1e300, -1e300};
    const double thr_f[] = {88.72283172607422, 88.7, -103.97207708399179, -103.27893,
                            -87.336544750553, -150, 89, 9.0109, 8.664, 16.636, 17.33, -108.6,
                            -20, 20, 0.5493, 0.34657359, -1, -0.5, 1, 2, 1e-30, 1e-10, 1e-4,
                            3e38, -3e38};
    const double *thr = is_f ? thr_f : thr_d;
    const int nthr = (int)((is_f ? sizeof thr_f : sizeof thr_d) / sizeof(double));
    for (int i = 0; i < nthr; i++) { around(&v, thr[i], 32, is_f); around(&v, -thr[i], 32, is_f); }
    /* special values */
    const double MX = is_f ? FLT_MAX : DBL_MAX, MN = is_f ? FLT_MIN : DBL_MIN;
    const double DN = is_f ? 0x1p-149 : 0x1p-1074;
    const double sp[] = {0.0, -0.0, INFINITY, -INFINITY, DN, -DN, MN - DN, -(MN - DN), MN, -MN,
                         MX, -MX, 1, -1, 0.5, -0.5, 2 * DN, 3 * DN};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) push(&v, sp[i]);
    /* NaNs: quiet, negative quiet, signalling, payloads (float NaNs exactly representable) */
    if (!is_f) {
        const uint64_t nb[] = {0x7ff8000000000000ull, 0xfff8000000000000ull, 0x7ff0000000000001ull,
                               0x7ff4000000000000ull, 0x7fffffffffffffffull, 0xffffffffffffffffull,
                               0x7ff8000000000123ull};
        for (size_t i = 0; i < sizeof nb / sizeof nb[0]; i++) { double x; memcpy(&x, &nb[i], 8); push(&v, x); }
    } else {
        const uint32_t nb[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u, 0x7fffffffu,
                               0xffffffffu, 0x7fc00123u};
        for (size_t i = 0; i < sizeof nb / sizeof nb[0]; i++) { float x; memcpy(&x, &nb[i], 4); push(&v, x); }
    }
    while (v.n % 64) push(&v, 0.0);
    return v;
}

/* ---------------------------------------------------------------- comparison */
typedef struct {
    double maxerr, at_x;
    long double at_ref;
    double at_out;
    long fails;
} stat_t;

static int verbose = 0;
static long total_fail = 0;

static void fail(stat_t *st, const char *fn, const char *ty, const char *isa, double x, double out,
                 long double ref, const char *why) {
    st->fails++;
    total_fail++;
    if (st->fails <= 5 || verbose)
        printf("  FAIL %s %s %s x=%.17g (%a): out=%.17g ref=%.21Lg: %s\n", fn, ty, isa, x, x, out, ref, why);
}

static int same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* 1 / ulp of the exact value ref in the result type (subnormal ulp below the normal range) */
static long double POW2[2400];          /* POW2[e + 1200] = 2^e */
static long double inv_ulp_of(long double ref, int is_f) {
    const int p = is_f ? 24 : 53, emin = is_f ? -126 : -1022;
    struct { uint64_t m; uint16_t se; } b = {0, 0};
    memcpy(&b, &ref, 10);                /* x87 extended: explicit-one mantissa, 15-bit exponent */
    int e = b.m == 0 ? emin : (int)(b.se & 0x7fff) - 16383;
    if (e < emin) e = emin;
    if (e > 1100) e = 1100;              /* only for refs that overflow anyway */
    return POW2[(p - 1) - e + 1200];
}

/* Check one lane against the reference ref (iulp: inv_ulp_of(ref)). is_f: float type. */
/* Every rule on one output; returns its error in ulp, or -1 when the output was not a finite number
 * compared by error (NaN / inf cases, checked by rule only). */
static double check(stat_t *st, int f, int is_f, const char *ty, const char *isa, double x, double out,
                    long double ref, long double iulp) {
    const char *fn = FNAME[f];
    if (isnan(x)) {
        if (!isnan(out)) fail(st, fn, ty, isa, x, out, ref, "NaN input gave a non-NaN");
        return -1;
    }
    if (isnan(ref)) {
        if (!isnan(out)) fail(st, fn, ty, isa, x, out, ref, "expected NaN");
        return -1;
    }
    if (isnan(out)) { fail(st, fn, ty, isa, x, out, ref, "NaN from a non-NaN input"); return -1; }
    const double rr = is_f ? (double)(float)ref : (double)ref;   /* ref rounded to the type */
    if (isinf(rr) || isinf(out)) {
        if (out != rr) fail(st, fn, ty, isa, x, out, ref, "overflow / inf mismatch");
        return -1;
    }
    /* rules stated in vmath.h */
    if (isinf(x) && out != rr) fail(st, fn, ty, isa, x, out, ref, "+-inf input: not exactly the limit");
    const double sat_tanh = is_f ? 10 : 20, sat_sig = is_f ? 20 : 40, exp0 = is_f ? -104.0 : -745.2;
    switch (f) {
    case F_EXP:
        if (out < 0) fail(st, fn, ty, isa, x, out, ref, "exp < 0");
        if (x == 0 && out != 1) fail(st, fn, ty, isa, x, out, ref, "exp(0) != 1");
        if (x <= exp0 && out != 0) fail(st, fn, ty, isa, x, out, ref, "exp not 0 far below the subnormals");
        break;
    case F_EXPM1:
        if (out < -1) fail(st, fn, ty, isa, x, out, ref, "expm1 < -1");
        if (x == 0 && !same_bits(out, x)) fail(st, fn, ty, isa, x, out, ref, "expm1(+-0) != +-0");
        break;
    case F_LOG1P:
        if (x == 0 && !same_bits(out, x)) fail(st, fn, ty, isa, x, out, ref, "log1p(+-0) != +-0");
        break;
    case F_LEAKY:
        if (x == 0 && !same_bits(out, x)) fail(st, fn, ty, isa, x, out, ref, "leaky_relu(+-0) != +-0");
        break;
    case F_TANH:
        if (fabs(out) > 1) fail(st, fn, ty, isa, x, out, ref, "|tanh| > 1");
        if (fabs(x) >= sat_tanh && out != copysign(1.0, x)) fail(st, fn, ty, isa, x, out, ref, "tanh not saturated to +-1");
        if (fabs(rr) == 1 && out != rr) fail(st, fn, ty, isa, x, out, ref, "tanh not exactly +-1 where rounded tanh is");
        if (x == 0 && !same_bits(out, x)) fail(st, fn, ty, isa, x, out, ref, "tanh(+-0) != +-0");
        break;
    case F_SIGMOID:
        if (out < 0 || out > 1) fail(st, fn, ty, isa, x, out, ref, "sigmoid outside [0, 1]");
        if (x >= sat_sig && out != 1) fail(st, fn, ty, isa, x, out, ref, "sigmoid not saturated to 1");
        if (x == 0 && out != 0.5) fail(st, fn, ty, isa, x, out, ref, "sigmoid(0) != 0.5");
        break;
    case F_SOFTPLUS:
        if (out < 0 || out < x) fail(st, fn, ty, isa, x, out, ref, "softplus < max(x, 0)");
        break;
    default: break;
    }
    const double err = (double)(fabsl((long double)out - ref) * iulp);
    if (err > st->maxerr) { st->maxerr = err; st->at_x = x; st->at_out = out; st->at_ref = ref; }
    if (err > BOUND[f][is_f]) {
        char why[80];
        snprintf(why, sizeof why, "%.3f ulp > bound %.2f", err, BOUND[f][is_f]);
        fail(st, fn, ty, isa, x, out, ref, why);
    }
    return err;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) if (!strcmp(argv[i], "-v")) verbose = 1;
    const clock_t t0 = clock();
    isa_t isas[4];
    int nisa = 0;
    isas[nisa++] = (isa_t){"sse2", vm_d_sse2_apply, vm_f_sse2_apply, 1};
#if defined(VM_HAVE_X86)
    __builtin_cpu_init();
    isas[nisa++] = (isa_t){"avx2", vm_d_avx2_apply, vm_f_avx2_apply,
                           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")};
    isas[nisa++] = (isa_t){"avx2w", vm_d_avx2w_apply, vm_f_avx2w_apply, isas[1].avail};
    isas[nisa++] = (isa_t){"avx512", vm_d_avx512_apply, vm_f_avx512_apply,
                           __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw")};
#endif
    printf("vmath_check: compiler %s\n", __VERSION__);
    for (int i = 0; i < nisa; i++) printf("isa %s: %s\n", isas[i].name, isas[i].avail ? "run" : "not supported by this CPU, skipped");

    enum { CH = 1 << 16 };
    double *xd = aligned_alloc(64, CH * sizeof(double)), *od = aligned_alloc(64, CH * sizeof(double));
    float *xf = aligned_alloc(64, CH * sizeof(float)), *of = aligned_alloc(64, CH * sizeof(float));
    long double *ref = malloc(CH * sizeof(long double)), *ulp = malloc(CH * sizeof(long double));
    double *out0 = malloc(CH * sizeof(double)), *err0 = malloc(CH * sizeof(double));   /* the first copy's */
    if (!xd || !od || !xf || !of || !ref || !ulp || !out0 || !err0) { perror("alloc"); return 2; }
    for (int e = -1200; e < 1200; e++) POW2[e + 1200] = ldexpl(1.0L, e);

    for (int is_f = 0; is_f < 2; is_f++) {
        const char *ty = is_f ? "float" : "double";
        vec in = make_inputs(is_f);
        printf("%s: %zu inputs per function\n", ty, in.n);
        for (int c = 0; c < NCASES; c++) {
            const int f = CASES[c].f;
            const double alpha = is_f ? (double)(float)CASES[c].alpha : CASES[c].alpha;
            stat_t st[4];
            memset(st, 0, sizeof st);
            for (size_t b = 0; b < in.n; b += CH) {
                const size_t n = in.n - b < CH ? in.n - b : CH;
                for (size_t i = 0; i < n; i++) {
                    const double x = in.x[b + i];
                    ref[i] = is_f ? (long double)ref_d(f, x, alpha) : ref_ld(f, x, alpha);
                    ulp[i] = inv_ulp_of(ref[i], is_f);
                    xd[i] = x; xf[i] = (float)x;
                }
                int first = 1;
                for (int k = 0; k < nisa; k++) {
                    if (!isas[k].avail) continue;
                    if (is_f) isas[k].ff(f, xf, of, n, (float)alpha);
                    else isas[k].fd(f, xd, od, n, alpha);
                    for (size_t i = 0; i < n; i++) {
                        const double out = is_f ? (double)of[i] : od[i];
                        /* The copies mostly give the same bits: an output equal to the first copy's, which
                         * passed every rule, has the same error, so the long double checks run once per
                         * input (clang build: 35 -> 16 s); any other output is checked in full. */
                        if (!first && err0[i] >= 0 && same_bits(out, out0[i])) {
                            if (err0[i] > st[k].maxerr) {
                                st[k].maxerr = err0[i]; st[k].at_x = xd[i]; st[k].at_out = out;
                                st[k].at_ref = ref[i];
                            }
                            continue;
                        }
                        const long before = st[k].fails;
                        const double err = check(&st[k], f, is_f, ty, isas[k].name, xd[i], out, ref[i], ulp[i]);
                        if (first) { out0[i] = out; err0[i] = st[k].fails == before ? err : -1; }
                    }
                    first = 0;
                }
            }
            char label[48];
            if (has_alpha(f)) snprintf(label, sizeof label, "%s(alpha=%g)", FNAME[f], CASES[c].alpha);
            else snprintf(label, sizeof label, "%s", FNAME[f]);
            for (int k = 0; k < nisa; k++) {
                if (!isas[k].avail) continue;
                printf("%-20s %-6s %-6s max %6.3f ulp at x=%-24.17g (out %.17g, ref %.20Lg) bound %.2f %s\n",
                       label, ty, isas[k].name, st[k].maxerr, st[k].at_x, st[k].at_out, st[k].at_ref,
                       BOUND[f][is_f], st[k].fails ? "FAIL" : "ok");
            }
        }
        free(in.x);
    }
    printf("vmath_check: %s (%ld violations), %.1f s\n", total_fail ? "FAIL" : "PASS", total_fail,
           (double)(clock() - t0) / CLOCKS_PER_SEC);
    return total_fail ? 1 : 0;
}
