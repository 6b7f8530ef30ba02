/*
 * Lane-wise exp / expm1 / log1p and the activations built on them, on GCC/Clang vector
 * extension types, for the kernels in mlp_core.h. No libm call, no scalar loop, no branch on
 * data, no gather, no int<->float conversion instruction (so SSE2 is enough): straight-line
 * vector code; a*b+c contracts to FMA under the AVX2 / AVX-512 targets, and every bound below
 * holds with and without contraction. No fast-math needed or assumed (the project builds with
 * -O3 -fno-math-errno -fno-trapping-math). C only (_Generic, GNU vector extensions).
 *
 * MLP_VMATH(T, VT, VI, NAME) instantiates, for T = double (VI: int64 lanes) or T = float (VI:
 * int32 lanes) and a vector VT of any width (16, 32 or 64 bytes), the static inline
 * (always_inline) functions
 *
 *   NAME_exp(x)      e^x
 *   NAME_expm1(x)    e^x - 1
 *   NAME_log1p(x)    log(1 + x)
 *   NAME_elu(x, alpha)         x > 0 ? x : alpha*(e^x - 1)
 *   NAME_selu(x)               1.0507009873554804934193349852946 *
 *                              (x > 0 ? x : 1.6732632423543772848170429916717*(e^x - 1))
 *   NAME_celu(x, alpha)        max(0, x) + min(0, alpha*(e^(x/alpha) - 1))     (alpha > 0)
 *   NAME_leaky_relu(x, alpha)  x >= 0 ? x : alpha*x
 *   NAME_tanh(x), NAME_sigmoid(x) = 1/(1 + e^-x), NAME_softplus(x) = log(1 + e^x),
 *   NAME_silu(x) = x*sigmoid(x)
 *
 * and helpers named NAME_vm_*. Every function returns NaN for a NaN lane (a broken input never
 * looks valid), and none returns NaN or +-inf for a finite lane unless the exact result
 * overflows: only exp and expm1 (x above the threshold below) and selu (x > T_MAX/1.0507) can.
 *
 * Special values and saturation, exactly (double / float); "checked" = vmath_check enforces it:
 *   exp:   +inf iff x > 709.782712893384 (0x1.62e42fefa39efp+9) / 88.72283172607422
 *          (0x1.62e42ep+6), the largest x whose correctly rounded e^x is finite; at or below
 *          it the result is finite (clamped to DBL_MAX / FLT_MAX should the polynomial
 *          overshoot; it did not at any point checked). exp(+inf) = +inf, exp(-inf) = +0,
 *          exp(+-0) = 1. Results in the subnormal range are rounded once (2^k is applied as
 *          2^k1 * 2^k2), so their ULP error (in subnormal ulps) is as small as elsewhere;
 *          exp(x) = +0 for x <= -745.2 / -104 (checked).
 *   expm1: +inf iff x > the same threshold; expm1(-inf) = -1, expm1(+inf) = +inf,
 *          expm1(+-0) = +-0, >= -1 always; relative accuracy near 0 (there the result is the
 *          polynomial itself).
 *   log1p: domain x >= -1: log1p(-1) = -inf, log1p(+inf) = +inf, log1p(+-0) = +-0; NaN for
 *          x < -1 (including -inf). Accurate on the whole of (-1, +inf).
 *   tanh:  exactly +-1 wherever the correctly rounded tanh is +-1 (from |x| = 19.06 / 9.01
 *          on) and for all |x| >= 20 / 10 (checked); |tanh| <= 1 always; tanh(+-0) = +-0;
 *          tanh(+-inf) = +-1.
 *   sigmoid: in [0, 1] always; exactly 1 for x >= 40 / 20 (checked); +0 where e^x rounds
 *          to 0; subnormal results rounded once; sigmoid(+-0) = 0.5, sigmoid(+inf) = 1,
 *          sigmoid(-inf) = +0.
 *   softplus: >= max(x, 0) always; softplus(+inf) = +inf, softplus(-inf) = +0.
 *   silu:  silu(+inf) = +inf, silu(-inf) = -0 (the limit; x*sigmoid(x) would be NaN);
 *          subnormal results (x in about [-751.7, -715]) rounded once.
 *   elu, celu: -alpha at -inf; selu: -(1.0507*1.6733 rounded to T) at -inf; all +inf at +inf.
 *   Signs of zero: kept by expm1, log1p, tanh and leaky_relu (checked); the others may
 *   return +0 for -0.
 *
 * How: exp/expm1 reduce x = k*ln2 + r, |r| <= ln2/2, k = rint(x/ln2) by the 1.5*2^52
 * (1.5*2^23) shifter, r by a two-constant Cody-Waite split of ln2 (k*ln2_hi exact);
 * e^r - 1 = r + r^2*P(r), P minimax of degree 10 (double, Estrin) / 4 (float, Horner-Estrin),
 * fitted by Remez in 60-digit arithmetic (approximation error 0.01 / 0.4 ulp);
 * 2^k = 2^k1 * 2^k2 (k1 = rint(k/2)) built by integer adds and shifts on the lanes.
 * expm1 = 2^k1 * (2^k2 * q + (2^k2 - 2^-k1)): exact bookkeeping of the "-1" at every k.
 * x is clamped to [-1000, 710] / [-150, 89] first (NaN passes through the clamp).
 * log1p: u = 1 + x with its exact rounding error c = x - (u - 1), u = 2^k * m with m in
 * [sqrt(1/2), sqrt(2)) from the bits, f = (m - 1) + c*2^-k, then fdlibm's
 * log(1 + f) = f - f^2/2 + s*(f^2/2 + R(s^2)), s = f/(2 + f) (one division).
 * tanh(x) = sign(x) * -e/(2 + e), e = expm1(-2|x|) in (-1, 0] (no overflow; exactly 1 when
 * e rounds to -1). sigmoid = (x >= 0 ? 1 : e)/(1 + e), e = exp(-|x|). silu = (x >= 0 ? x :
 * x*e)/(1 + e), the x*e product taken before the last 2^k2 scaling, so that subnormal results
 * are rounded once. softplus = max(x, 0) + log1p(exp(-|x|)). elu/selu: expm1 of min(x, 0).
 * Each activation costs one exp-type reduction plus one division (tanh, sigmoid, silu, celu)
 * or one log1p (softplus); exp is ~37 vector instructions besides constants with clang, ~49
 * with gcc at AVX2 (gcc writes the lane selects as 3 logic ops there, vpternlog at AVX-512).
 *
 * Accuracy: MEASURED by kernels/tests_c/vmath_check.c (built and run by tests/test_vmath.py),
 * which compares every lane with a long double libm reference (expl, expm1l, log1pl, tanhl;
 * the double libm for float) and exits non-zero if a bound below is exceeded or any rule above
 * that it checks is broken. Error = |result - exact| / ulp(exact) in the result type (the
 * subnormal ulp below the normal range). Inputs, per type and function (3.10M double, 3.03M
 * float): 2^21 spread evenly over the bit patterns of all finite values of both signs
 * (log-spaced: every binade from the smallest subnormal to DBL_MAX / FLT_MAX, so the
 * saturating ends up to 1e308 / 3e38 are in); 2^18 each linear on [-800, 720] / [-110, 90],
 * [-40, 40] / [-20, 20] and [-1, 1], 2^17 on [-1, -0.5]; +-8 ulps around every k*ln2/2 in the
 * clamp range (the reduction's rounding boundaries); +-32 ulps around +-(overflow threshold,
 * e^x underflow to 0 and to subnormal, clamp ends, tanh / sigmoid saturation, silu underflow,
 * 1e300 / 3e38, 1, 0.5, -1, ...); and 0, -0, +-inf, 7 NaNs (quiet, signalling, negative,
 * payloads), the smallest / largest subnormals and normals, +-DBL_MAX / FLT_MAX. Max over
 * the whole finite line (log1p: x >= -1), over the builds gcc 12 and clang 14 and over the ISA
 * copies SSE2, AVX2+FMA and 64-byte vectors under the AVX2 target; the AVX-512 copy is checked
 * the same way when the CPU has AVX-512, but the machine these numbers come from (AMD EPYC,
 * AVX2 only) does not, so AVX-512 is compiled but NOT measured here. Alpha functions: max over
 * elu alpha 1, 0.3; celu alpha 1, 2.5, 0.3; leaky_relu alpha 0.01, 0.2. In relative terms a
 * bound of b ULP is at most b * 2^-52 (double) / b * 2^-23 (float) for normal results.
 *
 * ACCURACY TABLE (max ULP measured, (bound enforced by vmath_check))
 *   function     double          float           where the double max was
 *   exp          0.99  (1.5)     1.04  (1.5)     x = 408.6
 *   expm1        1.51  (2.0)     1.33  (2.0)     x = 0.383 (k = 1)
 *   log1p        1.05  (1.5)     1.38  (2.0)     x = 0.5
 *   elu          1.83  (2.5)     1.53  (2.5)     x = -0.348, alpha = 0.3
 *   selu         1.65  (2.5)     1.81  (2.5)     x = -0.318
 *   celu         2.33  (3.0)     2.02  (3.0)     x = -0.897, alpha = 2.5 (x/alpha rounds)
 *   leaky_relu   0.50  (0.5)     0.50  (0.5)     correctly rounded
 *   tanh         2.49  (3.0)     2.48  (3.0)     x = -4.64
 *   sigmoid      2.12  (3.0)     2.25  (3.0)     x = -2.72
 *   softplus     1.64  (2.5)     1.64  (2.5)     x = -0.769
 *   silu         2.87  (3.5)     2.79  (3.5)     x = -5.09
 * END ACCURACY TABLE
 */
#ifndef CONTROL_NODE_VMATH_H
#define CONTROL_NODE_VMATH_H

#include <stdint.h>

#if defined(__GNUC__)
#define MLP_VM_INLINE static inline __attribute__((always_inline))
#else
#define MLP_VM_INLINE static inline
#endif

/* Per-type constant: D for double, F for float (sizeof is folded at compile time). */
#define MLP_VM_K(T, D, F) ((T)(sizeof(T) == 8 ? (D) : (F)))

#define MLP_VMATH(T, VT, VI, NAME)                                                        \
/* unsigned lanes of T's width: integer bit manipulation wraps, never overflows */        \
typedef __typeof__(_Generic((T)0, double: (uint64_t)0, float: (uint32_t)0)) NAME##_vm_ue; \
typedef NAME##_vm_ue NAME##_vm_vu __attribute__((vector_size(sizeof(VT))));               \
typedef struct { VT xc, r, h, q, s1, s2, is1; } NAME##_vm_red;                            \
                                                                                          \
MLP_VM_INLINE VT NAME##_vm_splat(T c) { return (VT){0} + c; }                             \
/* m ? a : b lane-wise, m all-ones / all-zeros lanes (a comparison result) */             \
MLP_VM_INLINE VT NAME##_vm_sel(VI m, VT a, VT b) {                                        \
    const NAME##_vm_vu mu = (NAME##_vm_vu)m;                                              \
    return (VT)((mu & (NAME##_vm_vu)a) | (~mu & (NAME##_vm_vu)b));                        \
}                                                                                         \
MLP_VM_INLINE NAME##_vm_vu NAME##_vm_ubits(T c) { return (NAME##_vm_vu)NAME##_vm_splat(c); } \
/* the sign bit of every lane (a splat of -0.0 would be +0.0: 0 + -0 = +0) */             \
MLP_VM_INLINE NAME##_vm_vu NAME##_vm_signbit(void) {                                      \
    return (NAME##_vm_vu){0} + (NAME##_vm_ue)(sizeof(T) == 8 ? 0x8000000000000000ull : 0x80000000ull); \
}                                                                                         \
/* max(x, 0) that keeps NaN (and -0 stays -0) */                                          \
MLP_VM_INLINE VT NAME##_vm_relu(VT x) {                                                   \
    return (VT)((NAME##_vm_vu)x & ~(NAME##_vm_vu)(VI)(x < (T)0));                         \
}                                                                                         \
                                                                                          \
/* x = k ln2 + r after clamping x to [LO, HI] (HI only if clamp_hi; NaN passes through). */ \
/* Returns q = e^r - 1 = r + h, s1 = 2^k1, s2 = 2^k2, is1 = 2^-k1 (k1 + k2 = k), xc. */   \
MLP_VM_INLINE NAME##_vm_red NAME##_vm_reduce(VT x, int clamp_hi) {                        \
    typedef NAME##_vm_vu VU;                                                              \
    const int MB = sizeof(T) == 8 ? 52 : 23;                                              \
    NAME##_vm_red o;                                                                      \
    if (clamp_hi) {                                                                       \
        const VT hi = NAME##_vm_splat(MLP_VM_K(T, 710.0, 89.0));                          \
        x = NAME##_vm_sel((VI)(x > hi), hi, x);                                           \
    }                                                                                     \
    const VT lo = NAME##_vm_splat(MLP_VM_K(T, -1000.0, -150.0));                          \
    x = NAME##_vm_sel((VI)(x < lo), lo, x);                                               \
    o.xc = x;                                                                             \
    const T shift = MLP_VM_K(T, 0x1.8p52, 0x1.8p23);                                      \
    const VT t = x * MLP_VM_K(T, 0x1.71547652b82fep+0, 0x1.715476p+0) + shift;            \
    const VT kd = t - shift;                                                              \
    VT r = x - kd * MLP_VM_K(T, 0x1.62e42fee00000p-1, 0x1.62e4p-1);                       \
    r = r - kd * MLP_VM_K(T, 0x1.a39ef35793c76p-33, 0x1.7f7d1cp-20);                      \
    const VT t1 = kd * (T)0.5 + shift;             /* k1 = rint(k/2), |k1|, |k - k1| small */ \
    const VU u = (VU)t, u1 = (VU)t1;                                                      \
    const VU e1 = u1 << MB, e2 = (u - u1) << MB;   /* k1, k2 in the exponent field */     \
    const VU one = NAME##_vm_ubits((T)1);                                                 \
    o.s1 = (VT)(one + e1);                                                                \
    o.s2 = (VT)(one + e2);                                                                \
    o.is1 = (VT)(one - e1);                                                               \
    const VT r2 = r * r;                                                                  \
    VT P;                                                                                 \
    if (sizeof(T) == 8) {                    /* (e^r - 1 - r)/r^2, degree 10, Estrin */   \
        const VT a0 = (T)0x1p-1 + r * (T)0x1.5555555555557p-3;                            \
        const VT a1 = (T)0x1.5555555555558p-5 + r * (T)0x1.11111111100dfp-7;              \
        const VT a2 = (T)0x1.6c16c16c15200p-10 + r * (T)0x1.a01a01abe6512p-13;            \
        const VT a3 = (T)0x1.a01a01acf95d9p-16 + r * (T)0x1.71de0236f3404p-19;            \
        const VT a4 = (T)0x1.27e4ccd17c546p-22 + r * (T)0x1.af4dde3e59e01p-26;            \
        const VT r4 = r2 * r2;                                                            \
        const VT b0 = a0 + r2 * a1;                                                       \
        const VT b1 = a2 + r2 * a3;                                                       \
        const VT b2 = a4 + r2 * (T)0x1.1f8b4633f71dep-29;                                 \
        P = b0 + r4 * (b1 + r4 * b2);                                                     \
    } else {                                 /* degree 4 */                               \
        const VT a0 = (T)0x1p-1f + r * (T)0x1.5554dcp-3f;                                 \
        const VT a1 = (T)0x1.5554b8p-5f + r * (T)0x1.120b66p-7f;                          \
        P = a0 + r2 * (a1 + r2 * (T)0x1.6d753cp-10f);                                     \
    }                                                                                     \
    o.r = r;                                                                              \
    o.h = r2 * P;                                                  /* >= 0 */             \
    o.q = r + o.h;                                                                        \
    return o;                                                                             \
}                                                                                         \
/* e^x scaled by 2^k1 only: e^x = m * s2, rounded once at the last product */             \
MLP_VM_INLINE VT NAME##_vm_exp_m(NAME##_vm_red o) { return ((T)1 + o.q) * o.s1; }         \
/* e^x - 1 = 2^k1 * (2^k2 * q + (2^k2 - 2^-k1)): the rounding error of q is scaled by */  \
/* 2^k2 <= 1 for k <= 0 (the form used where x <= 0); for k >= 1, (A + 2^k2 r) + 2^k2 h */ \
/* with A = 2^k2 - 2^-k1 > 0 and h >= 0 rounds the first sum into a result no larger. */  \
MLP_VM_INLINE VT NAME##_vm_expm1_r(NAME##_vm_red o) {                                     \
    return o.s1 * (o.s2 * o.q + (o.s2 - o.is1));                                          \
}                                                                                         \
MLP_VM_INLINE VT NAME##_vm_expm1_rp(NAME##_vm_red o) {                                    \
    const VT A = o.s2 - o.is1;                                                            \
    return o.s1 * NAME##_vm_sel((VI)(A > (T)0), (A + o.s2 * o.r) + o.s2 * o.h, o.s2 * o.q + A); \
}                                                                                         \
/* overflow: +inf iff x > XOVF (where the rounded e^x is inf), else at most T's max */    \
MLP_VM_INLINE VT NAME##_vm_ovf(VT y, VT x) {                                              \
    const VT big = NAME##_vm_splat(MLP_VM_K(T, 0x1.fffffffffffffp+1023, 0x1.fffffep+127)); \
    y = NAME##_vm_sel((VI)(y > big), big, y);                                             \
    return NAME##_vm_sel((VI)(x > MLP_VM_K(T, 0x1.62e42fefa39efp+9, 0x1.62e42ep+6)),      \
                         NAME##_vm_splat((T)__builtin_inf()), y);                         \
}                                                                                         \
                                                                                          \
MLP_VM_INLINE VT NAME##_exp(VT x) {                                                       \
    const NAME##_vm_red o = NAME##_vm_reduce(x, 1);                                       \
    return NAME##_vm_ovf(NAME##_vm_exp_m(o) * o.s2, x);                                   \
}                                                                                         \
MLP_VM_INLINE VT NAME##_expm1(VT x) {                                                     \
    const NAME##_vm_red o = NAME##_vm_reduce(x, 1);                                       \
    const VT y = NAME##_vm_ovf(NAME##_vm_expm1_rp(o), x);                                 \
    return NAME##_vm_sel((VI)(x == (T)0), x, y);                /* keeps -0 */            \
}                                                                                         \
                                                                                          \
/* log(1 + x) for x in (-1, +inf) finite or NaN (no special-value fix-ups) */             \
MLP_VM_INLINE VT NAME##_vm_log1p_core(VT x) {                                             \
    typedef NAME##_vm_vu VU;                                                              \
    typedef NAME##_vm_ue UE;                                                              \
    const int MB = sizeof(T) == 8 ? 52 : 23;                                              \
    const VT one = NAME##_vm_splat((T)1);                                                 \
    const VT u = one + x;                                                                 \
    const VT c = x - (u - one);                  /* u + c == 1 + x exactly */             \
    /* u = 2^k * m, m in [sqrt(1/2), sqrt(2)): bias the bits so that the exponent field */ \
    /* steps at sqrt(1/2) * 2^j */                                                        \
    const VU iu = (VU)u + (UE)(sizeof(T) == 8 ? 0x00095f619980c433ull : 0x004afb0dull);   \
    const VU mbits = (iu & (UE)(sizeof(T) == 8 ? 0x000fffffffffffffull : 0x007fffffull))  \
                   + (UE)(sizeof(T) == 8 ? 0x3fe6a09e667f3bcdull : 0x3f3504f3ull);        \
    const VT m = (VT)mbits;                                                               \
    const VT kd = (VT)((iu >> MB) | NAME##_vm_ubits(MLP_VM_K(T, 0x1p52, 0x1p23)))         \
                - MLP_VM_K(T, 0x1p52 + 1023, 0x1p23 + 127);                               \
    /* 2^-k for the correction term, zeroed where u is huge (c is then negligible and */  \
    /* 2^-k would not be representable) */                                                \
    VU sc = (UE)(sizeof(T) == 8 ? 0x7fe0000000000000ull : 0x7f000000ull)                  \
          - (iu & (UE)(sizeof(T) == 8 ? 0x7ff0000000000000ull : 0x7f800000ull));          \
    sc &= (VU)(VI)(u < MLP_VM_K(T, 0x1p1000, 0x1p100));                                   \
    const VT f = (m - one) + c * (VT)sc;                                                  \
    const VT hfsq = (T)0.5 * f * f;                                                       \
    const VT s = f / ((T)2 + f);                                                          \
    const VT z = s * s, w = z * z;                                                        \
    VT R;                                                                                 \
    if (sizeof(T) == 8) {                    /* fdlibm Lg1..Lg7 */                        \
        const VT t1 = w * ((T)3.999999999940941908e-01 + w * ((T)2.222219843214978396e-01 \
                    + w * (T)1.531383769920937332e-01));                                  \
        const VT t2 = z * ((T)6.666666666666735130e-01 + w * ((T)2.857142874366239149e-01 \
                    + w * ((T)1.818357216161805012e-01 + w * (T)1.479819860511658591e-01))); \
        R = t2 + t1;                                                                      \
    } else {                                 /* fdlibm logf Lg1..Lg4 */                   \
        const VT t1 = w * ((T)0xccce13.0p-25f + w * (T)0xf89e26.0p-26f);                  \
        const VT t2 = z * ((T)0xaaaaaa.0p-24f + w * (T)0x91e9ee.0p-25f);                  \
        R = t2 + t1;                                                                      \
    }                                                                                     \
    return ((s * (hfsq + R) + kd * MLP_VM_K(T, 0x1.a39ef35793c76p-33, 0x1.7f7d1cp-20))    \
            - hfsq + f) + kd * MLP_VM_K(T, 0x1.62e42fee00000p-1, 0x1.62e4p-1);            \
}                                                                                         \
MLP_VM_INLINE VT NAME##_log1p(VT x) {                                                     \
    VT y = NAME##_vm_log1p_core(x);                                                       \
    const VT inf = NAME##_vm_splat((T)__builtin_inf());                                   \
    y = NAME##_vm_sel((VI)(x == inf) | (VI)(x == (T)0), x, y);                            \
    const VT bad = NAME##_vm_sel((VI)(x < (T)-1), NAME##_vm_splat((T)__builtin_nan("")), -inf); \
    return NAME##_vm_sel((VI)(x <= (T)-1), bad, y);                                       \
}                                                                                         \
                                                                                          \
MLP_VM_INLINE VT NAME##_elu(VT x, T alpha) {                                              \
    const VT xn = NAME##_vm_sel((VI)(x > (T)0), (VT){0}, x);                              \
    const VT em = NAME##_vm_expm1_r(NAME##_vm_reduce(xn, 0));                             \
    return NAME##_vm_sel((VI)(x > (T)0), x, alpha * em);                                  \
}                                                                                         \
MLP_VM_INLINE VT NAME##_selu(VT x) {                                                      \
    const VT xn = NAME##_vm_sel((VI)(x > (T)0), (VT){0}, x);                              \
    const VT em = NAME##_vm_expm1_r(NAME##_vm_reduce(xn, 0));                             \
    /* lambda and lambda*alpha, each rounded once to T */                                 \
    return NAME##_vm_sel((VI)(x > (T)0), x * MLP_VM_K(T, 0x1.0cfabd6a91132p+0, 0x1.0cfabep+0), \
                         em * MLP_VM_K(T, 0x1.c212cc640f031p+0, 0x1.c212ccp+0));          \
}                                                                                         \
MLP_VM_INLINE VT NAME##_celu(VT x, T alpha) {                                             \
    const VT em = NAME##_vm_expm1_r(NAME##_vm_reduce(x / alpha, 1));                      \
    const VT v = alpha * em;                                                              \
    return NAME##_vm_relu(x) + NAME##_vm_sel((VI)(v > (T)0), (VT){0}, v);                 \
}                                                                                         \
MLP_VM_INLINE VT NAME##_leaky_relu(VT x, T alpha) {                                       \
    return NAME##_vm_sel((VI)(x >= (T)0), x, alpha * x);                                  \
}                                                                                         \
MLP_VM_INLINE VT NAME##_tanh(VT x) {                                                      \
    typedef NAME##_vm_vu VU;                                                              \
    const VU sign = NAME##_vm_signbit();                                                  \
    const VT a = (VT)((VU)x & ~sign);                                                     \
    const VT em = NAME##_vm_expm1_r(NAME##_vm_reduce(a * (T)-2, 0));     /* in (-1, 0] */ \
    const VT t = -em / ((T)2 + em);                                                       \
    return (VT)(((VU)t & ~sign) | ((VU)x & sign));       /* t >= 0, but may be -0 */      \
}                                                                                         \
MLP_VM_INLINE VT NAME##_sigmoid(VT x) {                                                   \
    typedef NAME##_vm_vu VU;                                                              \
    const VT a = (VT)((VU)x & ~NAME##_vm_signbit());                                      \
    const NAME##_vm_red o = NAME##_vm_reduce(-a, 0);                                      \
    const VT e = NAME##_vm_exp_m(o) * o.s2;                              /* e^-|x| */     \
    return NAME##_vm_sel((VI)(x >= (T)0), NAME##_vm_splat((T)1), e) / ((T)1 + e);         \
}                                                                                         \
MLP_VM_INLINE VT NAME##_silu(VT x) {                                                      \
    typedef NAME##_vm_vu VU;                                                              \
    const VT a = (VT)((VU)x & ~NAME##_vm_signbit());                                      \
    const NAME##_vm_red o = NAME##_vm_reduce(-a, 0);     /* o.xc == max(x, LO) if x < 0 */ \
    const VT m = NAME##_vm_exp_m(o);                                                      \
    const VT e = m * o.s2;                                                                \
    return NAME##_vm_sel((VI)(x >= (T)0), x, (o.xc * m) * o.s2) / ((T)1 + e);             \
}                                                                                         \
MLP_VM_INLINE VT NAME##_softplus(VT x) {                                                  \
    typedef NAME##_vm_vu VU;                                                              \
    const VT a = (VT)((VU)x & ~NAME##_vm_signbit());                                      \
    const NAME##_vm_red o = NAME##_vm_reduce(-a, 0);                                      \
    const VT e = NAME##_vm_exp_m(o) * o.s2;                              /* (0, 1] */     \
    return NAME##_vm_relu(x) + NAME##_vm_log1p_core(e);                                   \
}

#endif
