/*
 * Fused policy forward pass: pre-process -> [recurrent layer] -> (Dense + activation) * layers -> head,
 * the model of kernels/model_file.py (its docstring is the definition; kernels/reference.py the numpy
 * reference). Activations per layer (MLP_ACT_*; the exp-based ones from vmath.h); heads: argmax (class
 * index) or continuous (tanh squash, clip, affine; float64, into a caller's buffer).
 *
 * Recurrent layer (rnn = MLP_RNN_LSTM / MLP_RNN_GRU, hidden size H, torch's gate order): per step two
 * matrix-vector products on the axpy kernels below, gx = Wx^T xin + bx and gh = Wh^T h + bh (G*pH
 * outputs each: gate blocks of pH = H padded to 64 bytes, the total padded to pg, a whole number of
 * MLP_PANEL_BYTES panels). Wx and Wh are stored in panels: the (n_in, 256-byte) column block of every
 * panel is contiguous, so each pass of the axpy kernel streams memory in order (a row-major (n_in, G*pH)
 * matrix would be read at a stride of G*pH values: 4 KiB for an LSTM(256) in float32, the L1 set-conflict
 * and 4K-aliasing worst case, which measured twice as slow). Then one vectorised pass over the pH lanes
 * with sigmoid / tanh from vmath.h that writes the new h (and c) in place. The state h, c lives in
 * buffers the caller allocates once (kernels/_policy.pyx: 64-byte aligned, owned by the Policy); h is
 * act[0], the dense stack's input, so the dense layers read the new state where it is. Nothing is
 * allocated per step. Pad lanes of h and c are forced to 0 after each step (an infinite observation
 * times a zero pad weight would otherwise leave NaN there); if any lane of the new h or c is then not
 * finite, h and c are zeroed, *resets is incremented and the step returns -1 without running the dense
 * layers (their outputs, act[L], are set to NaN). mlp_*_reset() zeroes the state.
 *
 * Plain C so that the compiler, not Cython, owns the vector code. The body is mlp_body.h, included once per
 * (dtype, ISA) below (MLP_KERNELS' old macro form had no line numbers for errors, gdb or perf).
 *
 * Layout (set up once by kernels/_policy.pyx, never changed afterwards):
 *   act[0]      normalised input, padded to pdims[0] lanes (pad lanes stay 0)
 *   act[l + 1]  output of dense layer l, padded to pdims[l + 1] (the buffer to whole panels,
 *               which an axpy layer writes). Pad lanes hold act(0) (0, or
 *               0.5 for sigmoid, ln 2 for softplus): finite, and they only ever meet zero weights.
 *               An infinite input can make them NaN (inf * 0), which can only turn the answer
 *               into the safe one (-1), never into a class or an action.
 *   W[l]        "axpy" form (dot_form[l] == 0): the (dims[l], pdims[l+1]) matrix, outputs padded
 *               to whole MLP_PANEL_BYTES panels and stored panel by panel ((panels, dims[l], PW)),
 *               so one input value scales one contiguous panel row of outputs and a pass reads
 *               memory in order (the small kernels below take it row-major, (pdims[l], P1));
 *               "dot" form (dot_form[l] == 1): (pdims[l+1], pdims[l]) row-major
 *               (rows padded to 64 bytes of outputs), one contiguous dot product per output.
 *               Narrow outputs (the 3-class head) are cheaper as dot products,
 *               wide ones as axpy. Pad rows and columns are 0.
 *   b[l]        padded to pdims[l+1] (axpy: to whole panels), pad lanes 0.
 *   mean, scale float64, padded to 64 bytes (pad lanes: mean 0, scale 1).
 * Padding to a whole 64-byte block means the vector loops need no tail code:
 * a 4 -> 13 -> 3 policy runs on 16-lane rows whose last 3 lanes are zero.
 *
 * SIMD without -march=native: the arithmetic is written on GCC/Clang vector
 * types, so it is vectorised without fast-math. On x86-64 the kernels are
 * compiled three times in this one file, for x86-64-v4 (AVX-512, 64-byte vectors),
 * x86-64-v3 (AVX2 + FMA, 32-byte vectors) and the baseline (SSE2, 16-byte vectors),
 * and mlp_*_kernel() picks one at load time with __builtin_cpu_supports (the small
 * compile-time-shaped kernels stay on AVX2: their registers hold 32-byte rows).
 * Policy(spec, isa="sse2" | "avx2" | "avx512") selects a copy (m->isa_want; mlp_isa_missing() first), as
 * the bench's stream-read probe's `want` does. MLP_NATIVE (CONTROL_NODE_NATIVE=1 at build time) compiles a
 * single -march=native copy instead.
 */
#ifndef CONTROL_NODE_MLP_CORE_H
#define CONTROL_NODE_MLP_CORE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vmath.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <cpuid.h>
#endif

#define MLP_MAX_LAYERS 16
/* activation codes: kernels/model_file.py ACTIVATIONS holds the same numbers */
enum { MLP_ACT_IDENTITY = 0, MLP_ACT_RELU = 1, MLP_ACT_ELU = 2, MLP_ACT_SELU = 3, MLP_ACT_LEAKY_RELU = 4,
       MLP_ACT_CELU = 5, MLP_ACT_TANH = 6, MLP_ACT_SIGMOID = 7, MLP_ACT_SOFTPLUS = 8, MLP_ACT_SILU = 9,
       MLP_N_ACT = 10 };
enum { MLP_HEAD_ARGMAX = 0, MLP_HEAD_CONTINUOUS = 1 };
enum { MLP_RNN_NONE = 0, MLP_RNN_LSTM = 1, MLP_RNN_GRU = 2 };     /* model_file.py RECURRENT, in this order */
/* weight storage (kernels/weights.py STORAGE holds the same numbers): the model dtype itself, IEEE half,
 * bfloat16, int8 with a float32 scale per output channel */
enum { MLP_W_NATIVE = 0, MLP_W_F16 = 1, MLP_W_BF16 = 2, MLP_W_INT8 = 3 };
/* the vector copy asked for (Policy(spec, isa=...)): the widest the CPU has, or one named */
enum { MLP_ISA_AUTO = 0, MLP_ISA_PORTABLE = 1, MLP_ISA_AVX2 = 2, MLP_ISA_AVX512 = 3 };
#define MLP_BLOCK_BYTES 64   /* padding and alignment of every row */
#define MLP_PANEL_BYTES 256  /* axpy matrices: column panels of this width (8 AVX2 / 4 AVX-512 vectors) */

#if defined(__GNUC__)
#define MLP_INLINE static inline __attribute__((always_inline))
#define MLP_OUTLINE static __attribute__((noinline))
#else
#define MLP_INLINE static inline
#define MLP_OUTLINE static
#endif


/* IEEE half -> float in integer arithmetic (the portable copies; F16C / AVX-512 use VCVTPH2PS): the 15 bits
 * of exponent and mantissa moved to a float's place and scaled by 2^112 (the bias difference) is exact for
 * normals, subnormals and zero. No inf / NaN reaches here: kernels/weights.py refuses weights a half cannot
 * hold. */
static inline float mlp_half_to_float(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7fff) << 13, u;
    float f;
    memcpy(&f, &em, 4);
    f *= 0x1p112f;
    memcpy(&u, &f, 4);
    u |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &u, 4);
    return f;
}
static inline float mlp_bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Weight loaders for the generic copy (non-x86, or the -march=native build): lane by lane in C, which the
 * compiler vectorises as the target allows. LDP##_h / _bh / _q load one VT from stored f16 / bf16 / int8,
 * LDP##_s one VT of float32 scales; LDP##_bpl / _bph one VT from the low / high halves of paired bf16
 * (MLP_WEIGHTS). */
#define MLP_LD_SCALAR(T, VT, LDP)                                                     \
MLP_INLINE VT LDP##_h(const uint16_t *p) {                                            \
    VT v = {0}; for (int k = 0; k < (int)(sizeof(VT) / sizeof(T)); k++) v[k] = (T)mlp_half_to_float(p[k]); return v; } \
MLP_INLINE VT LDP##_bh(const uint16_t *p) {                                           \
    VT v = {0}; for (int k = 0; k < (int)(sizeof(VT) / sizeof(T)); k++) v[k] = (T)mlp_bf16_to_float(p[k]); return v; } \
MLP_INLINE VT LDP##_q(const int8_t *p) {                                              \
    VT v = {0}; for (int k = 0; k < (int)(sizeof(VT) / sizeof(T)); k++) v[k] = (T)p[k]; return v; } \
MLP_INLINE VT LDP##_s(const float *p) {                                               \
    VT v = {0}; for (int k = 0; k < (int)(sizeof(VT) / sizeof(T)); k++) v[k] = (T)p[k]; return v; } \
MLP_INLINE VT LDP##_bpl(const uint16_t *g) {                                          \
    VT v = {0}; for (int k = 0; k < (int)(sizeof(VT) / sizeof(T)); k++) v[k] = (T)mlp_bf16_to_float(g[2 * k]); return v; } \
MLP_INLINE VT LDP##_bph(const uint16_t *g) {                                          \
    VT v = {0}; for (int k = 0; k < (int)(sizeof(VT) / sizeof(T)); k++) v[k] = (T)mlp_bf16_to_float(g[2 * k + 1]); return v; }

/* Accumulators are GCC vector-extension values, not arrays: arrays get spilled to
 * the stack with mixed-width stores and reloads, and the failed store-to-load
 * forwarding costs more than the arithmetic. One VT is one register (32 bytes
 * with AVX2, 16 with SSE2); NB counts them (8 hide the FMA latency on two pipes).
 * W is a panel (see NAME##SFX##_panels): row i of the NB vectors is at W + i * stride, QP
 * vectors from each of NB / QP panels pstep elements apart (two for narrow weights on 64-byte
 * vectors, one otherwise), and the rows follow each other in memory, so the pass streams them in order; the
 * software prefetch MLP_PREFETCH_BYTES ahead keeps the lines coming from L3 when the
 * weights do not fit L2 (`control-node bench policy` shows the result beside the measured cost
 * of reading the same bytes once in order). Prefetches do not fault, so reading past the end
 * is safe. */
#define MLP_PREFETCH_BYTES 1024
/* ... only for a matrix larger than this: for one that stays in L1 / L2 the prefetches are */
/* pure overhead (4 extra instructions per 8 FMAs; PPO 3-64-64-1 ran 264 -> 326 ns with them). */
#define MLP_PREFETCH_MIN_BYTES (256 * 1024)
/* Weights may be stored narrower than the compute dtype T (m->wkind, MLP_W_*): WT is the stored element,
 * LDA(row, off) loads the vector of T at element offset off of a panel row (every row starts a 32-element
 * group: see MLP_WEIGHTS for paired bf16) and converts it in registers (no wider copy is kept);
 * SCALED (int8): the sums run over the raw integers and each output is multiplied by its channel's float32
 * scale (SLD) before the bias is added. For the native storage LD is a plain load and SCALED 0, so the
 * float32 / float64 kernels compile to what they were. */
#define MLP_AXPY_NB(T, VT, NAME, NB, QP, PF, SUFFIX, WT, LDA, SLD, SCALED)            \
MLP_INLINE void NAME##_axpy_nb##NB##SUFFIX(const T *restrict in, int n_in,            \
                                   const WT *restrict W, int wo, int stride,          \
                                   size_t pstep, const T *restrict b,                 \
                                   const float *restrict s, T *restrict out, int relu) { \
    enum { LN = (int)(sizeof(VT) / sizeof(T)), LINES = (QP * LN * (int)sizeof(WT) + 63) / 64 }; \
    VT acc[NB];                                                                       \
    for (int q = 0; q < NB; q++) acc[q] = SCALED ? (VT){0} : ((const VT *)b)[q];      \
    for (int i = 0; i < n_in; i++) {                                                  \
        const T x0 = in[i];                                                           \
        const WT *w0 = W + (size_t)i * stride;                                        \
        if (PF)                                                                       \
            for (int p = 0; p < NB / QP; p++)                                         \
                for (int k = 0; k < LINES; k++)                                       \
                    __builtin_prefetch((const char *)(w0 + p * pstep + wo) + MLP_PREFETCH_BYTES + 64 * k, 0, 3); \
        for (int q = 0; q < NB; q++) acc[q] += x0 * LDA(w0 + (q / QP) * pstep, wo + (q % QP) * LN); \
    }                                                                                 \
    for (int q = 0; q < NB; q++) {                                                    \
        VT v = acc[q];                                                                \
        if (SCALED) v = v * SLD(s + q * LN) + ((const VT *)b)[q];                     \
        if (relu) v = NAME##_relu(v);                                                 \
        ((VT *)out)[q] = v;                                                           \
    }                                                                                 \
}

/* Transpose-and-sum: c[k] holds output k's partial sums across the lanes; returns the
 * vector whose lane k is the sum of c[k]. log2(lanes) levels, each pairing lanes of two
 * vectors with two shuffles and one add, so L outputs cost L - 1 adds, not L * (L - 1). */
/* MLP_SH(VI, a, b, i0, i1, ...): lanes of a (0..L-1) and b (L..2L-1), picked by constant indices. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define MLP_SH(VI, a, b, ...) __builtin_shufflevector((a), (b), __VA_ARGS__)
#else
#define MLP_SH(VI, a, b, ...) __builtin_shuffle((a), (b), (VI){__VA_ARGS__})
#endif
#define MLP_TSUM_2(VT, VI, NAME)                                                      \
MLP_INLINE VT NAME##_tsum(const VT *c) {                                              \
    return MLP_SH(VI, c[0], c[1], 0, 2) + MLP_SH(VI, c[0], c[1], 1, 3);               \
}
#define MLP_TSUM_4(VT, VI, NAME)                                                      \
MLP_INLINE VT NAME##_tsum(const VT *c) {                                              \
    const VT t0 = MLP_SH(VI, c[0], c[1], 0, 4, 2, 6) + MLP_SH(VI, c[0], c[1], 1, 5, 3, 7); \
    const VT t1 = MLP_SH(VI, c[2], c[3], 0, 4, 2, 6) + MLP_SH(VI, c[2], c[3], 1, 5, 3, 7); \
    return MLP_SH(VI, t0, t1, 0, 1, 4, 5) + MLP_SH(VI, t0, t1, 2, 3, 6, 7);           \
}
#define MLP_TSUM_8(VT, VI, NAME)                                                      \
MLP_INLINE VT NAME##_tsum(const VT *c) {                                              \
    VT t[4], u[2];                                                                    \
    for (int i = 0; i < 4; i++)                                                       \
        t[i] = MLP_SH(VI, c[2 * i], c[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14)          \
             + MLP_SH(VI, c[2 * i], c[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);         \
    for (int i = 0; i < 2; i++)                                                       \
        u[i] = MLP_SH(VI, t[2 * i], t[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13)           \
             + MLP_SH(VI, t[2 * i], t[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);        \
    return MLP_SH(VI, u[0], u[1], 0, 1, 2, 3, 8, 9, 10, 11)                           \
         + MLP_SH(VI, u[0], u[1], 4, 5, 6, 7, 12, 13, 14, 15);                        \
}

#define MLP_TSUM_16(VT, VI, NAME)                                                     \
MLP_INLINE VT NAME##_tsum(const VT *c) {                                              \
    VT t[8], u[4], w[2];                                                              \
    for (int i = 0; i < 8; i++)                                                       \
        t[i] = MLP_SH(VI, c[2 * i], c[2 * i + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) \
             + MLP_SH(VI, c[2 * i], c[2 * i + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31); \
    for (int i = 0; i < 4; i++)                                                       \
        u[i] = MLP_SH(VI, t[2 * i], t[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) \
             + MLP_SH(VI, t[2 * i], t[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31); \
    for (int i = 0; i < 2; i++)                                                       \
        w[i] = MLP_SH(VI, u[2 * i], u[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) \
             + MLP_SH(VI, u[2 * i], u[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31); \
    return MLP_SH(VI, w[0], w[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) \
         + MLP_SH(VI, w[0], w[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31); \
}

/* The weight-reading kernels for one storage WSFX (see MLP_AXPY_NB): WT stored elements at the same element
 * offsets as the T layout (panels and padded rows are counted in T's lanes), so one layout serves every
 * storage and only the bytes read shrink.
 *
 * panels: out = b + W^T in for W in panels (pg / PW panels of (n_in, PW) values, PW = 256 bytes of T, each
 * contiguous): one pass of the 8-vector kernel per panel (two with 16-byte vectors; with 64-byte ones a
 * 4-vector pass, or for narrow weights one 8-vector pass over two panels). Dense axpy layers and the recurrent
 * gates use it.
 * layer_dot: BLK outputs at a time, one partial-sum vector each (the inputs run in the outer loop, so BLK
 * independent FMA chains overlap); the BLK vectors are then transposed and added in one shuffle tree. Wt has
 * its rows padded to 64 bytes of T (zero rows), so whole groups never read past it.
 * Paired bf16 (panels only): each 32-element group of a row holds element j (< 16) in the low half and element
 * 16 + j in the high half of its 32-bit word j (kernels/_policy.pyx lays it out). A float32 is then the word
 * shifted left by 16 (low) or masked (high): two in-lane ops per 32 weights, where the widening load of the
 * plain layout (VPMOVZXWD zmm) issues one per 2 cycles on Zen 4 and bound the bf16 kernel there at half the
 * FMA rate (docs/benchmarks.md, issue #47). The dot form keeps the plain layout (LD). */
#define MLP_WEIGHTS(T, VT, NAME, WSFX, WT, LD, LDA, SLD, SCALED)                       \
MLP_AXPY_NB(T, VT, NAME, 4, 4, 0, WSFX, WT, LDA, SLD, SCALED)                          \
MLP_AXPY_NB(T, VT, NAME, 8, 8, 0, WSFX, WT, LDA, SLD, SCALED)                          \
MLP_AXPY_NB(T, VT, NAME, 4, 4, 1, WSFX##_pf, WT, LDA, SLD, SCALED)                     \
MLP_AXPY_NB(T, VT, NAME, 8, 8, 1, WSFX##_pf, WT, LDA, SLD, SCALED)                     \
MLP_AXPY_NB(T, VT, NAME, 8, 4, 0, WSFX##_2p, WT, LDA, SLD, SCALED)                     \
MLP_AXPY_NB(T, VT, NAME, 8, 4, 1, WSFX##_2p_pf, WT, LDA, SLD, SCALED)                  \
MLP_INLINE void NAME##_panels##WSFX(const T *restrict in, int n_in, const WT *restrict W, \
                                    const T *restrict b, const float *restrict s,     \
                                    T *restrict out, int pg, int relu) {              \
    enum { LNS = (int)(sizeof(VT) / sizeof(T)), PW = MLP_PANEL_BYTES / (int)sizeof(T), \
           NBP = PW / LNS >= 8 ? 8 : 4, STEP = NBP * LNS };                            \
    const int pf = (size_t)n_in * (size_t)pg * sizeof(WT) > MLP_PREFETCH_MIN_BYTES;   \
    const size_t pstep = (size_t)PW * n_in;      /* elements from a panel to the next */ \
    for (int p0 = 0; p0 < pg; p0 += PW) {                                             \
        const WT *Wp = W + (size_t)p0 * n_in;                                         \
        const float *sp = SCALED ? s + p0 : s;                                        \
        /* 64-byte vectors give a panel 4 of them: with narrow weights (half the bytes a row) 4 chains of  \
         * 4-cycle FMAs leave no slack for a late load, so two panels go together (8 chains, two streams) */ \
        if (NBP == 4 && sizeof(WT) < sizeof(T) && p0 + PW < pg) {                     \
            if (pf) NAME##_axpy_nb8##WSFX##_2p_pf(in, n_in, Wp, 0, PW, pstep, b + p0, sp, out + p0, relu); \
            else NAME##_axpy_nb8##WSFX##_2p(in, n_in, Wp, 0, PW, pstep, b + p0, sp, out + p0, relu); \
            p0 += PW;                                                                 \
            continue;                                                                 \
        }                                                                             \
        for (int q = 0; q < PW; q += STEP) {                                          \
            const T *bq = b + p0 + q;                                                 \
            const float *sq = SCALED ? s + p0 + q : s;                                \
            T *oq = out + p0 + q;                                                     \
            if (NBP == 8 && pf) NAME##_axpy_nb8##WSFX##_pf(in, n_in, Wp, q, PW, 0, bq, sq, oq, relu); \
            else if (NBP == 8) NAME##_axpy_nb8##WSFX(in, n_in, Wp, q, PW, 0, bq, sq, oq, relu); \
            else if (pf) NAME##_axpy_nb4##WSFX##_pf(in, n_in, Wp, q, PW, 0, bq, sq, oq, relu); \
            else NAME##_axpy_nb4##WSFX(in, n_in, Wp, q, PW, 0, bq, sq, oq, relu);        \
        }                                                                             \
    }                                                                                 \
}                                                                                     \
MLP_INLINE void NAME##_layer_dot##WSFX(const T *restrict in, int pn_in, const WT *restrict Wt, \
                                       const T *restrict b, const float *restrict s,  \
                                       T *restrict out, int n_out, int relu) {        \
    enum { LNS = (int)(sizeof(VT) / sizeof(T)) };                                     \
    const VT *xv = (const VT *)in;                                                    \
    const int nb = pn_in / LNS;                                                       \
    for (int j0 = 0; j0 < n_out; j0 += LNS) {                                         \
        const WT *w = Wt + (size_t)j0 * pn_in;                                        \
        VT acc[LNS];                                                                  \
        for (int k = 0; k < LNS; k++) acc[k] = xv[0] * LD(w + (size_t)k * pn_in);     \
        for (int q = 1; q < nb; q++)                                                  \
            for (int k = 0; k < LNS; k++) acc[k] += xv[q] * LD(w + (size_t)k * pn_in + q * LNS); \
        VT v = NAME##_tsum(acc);                                                      \
        if (SCALED) v = v * SLD(s + j0);                                              \
        v += *(const VT *)(b + j0);                                                   \
        if (relu) v = NAME##_relu(v);                                                 \
        *(VT *)(out + j0) = v;                                                        \
    }                                                                                 \
}

/* A policy's fields, T the model dtype. Written once: MLP_STRUCT(T, NAME) is the typed struct the kernels
 * run on; mlp_desc (T = void: the same layout, every pointer untyped) is what the loader (_policy.pyx) fills,
 * for either dtype, before mlp_kernel_init copies it into the typed struct. */
#define MLP_FIELDS(T)                                                                 \
    int n_layers;                         /* dense layers: hidden + output */         \
    int dims[MLP_MAX_LAYERS + 1];         /* true widths; dims[0] = features */       \
    int pdims[MLP_MAX_LAYERS + 1];        /* widths rounded up to 64 bytes */         \
    int dot_form[MLP_MAX_LAYERS];                                                     \
    const double *mean;                   /* (dims[0],) float64, padded */            \
    const double *scale;                  /* (dims[0],) float64, never 0, padded */   \
    const void *W[MLP_MAX_LAYERS];        /* T, or the narrower storage of wkind */   \
    const T *b[MLP_MAX_LAYERS];                                                       \
    T *act[MLP_MAX_LAYERS + 1];                                                       \
    int act_code[MLP_MAX_LAYERS];         /* MLP_ACT_* per dense layer */             \
    double alpha[MLP_MAX_LAYERS];         /* elu / leaky_relu / celu parameter */     \
    int pre;                              /* 1: obs_scale and the clips below apply */ \
    const double *obs_scale, *obs_lo, *obs_hi, *norm_lo, *norm_hi;   /* (dims[0],) */ \
    int head;                             /* MLP_HEAD_* */                            \
    int squash;                           /* continuous: tanh before the clip */      \
    const double *act_lo, *act_hi, *act_off, *act_scale;             /* (dims[L],) */ \
    int small_layout;                     /* 1: laid out for the small kernels (row-major W[0]) */ \
    int specialised;                      /* 1: a small-shape kernel was chosen */    \
    const char *isa;                      /* the vector copy chosen: "avx512", ... */ \
    int rnn;                              /* MLP_RNN_*: recurrent layer before the dense ones */ \
    int n_obs;                            /* observation width (dims[0] without a recurrent layer) */ \
    T *xin;                               /* pre-processed observation, padded (act[0] without one) */ \
    int H, pH;                            /* hidden size; padded to 64 bytes */       \
    int pg;                               /* G*pH padded to whole MLP_PANEL_BYTES panels */ \
    const void *Wx, *Wh;                  /* panels (pg/PW, n_obs or H, PW): gate blocks of pH */ \
    const T *bx, *bh;                     /* (pg,): b_ih, b_hh in the same blocks */  \
    T *gx, *gh;                           /* (pg,) scratch: the two matrix-vector products */ \
    T *h, *c;                             /* state (pH,): h == act[0]; c NULL for a GRU */ \
    int64_t *resets;                      /* ++ on every non-finite state reset (or NULL) */ \
    int wkind;                            /* MLP_W_*: how W, Wx, Wh are stored */     \
    const float *ws[MLP_MAX_LAYERS];      /* int8: per-output scales, laid out as b */ \
    const float *wsx, *wsh;               /* int8: scales of Wx, Wh, laid out as bx */ \
    int isa_want;                         /* MLP_ISA_*: the copy asked for (0: widest) */

#define MLP_STRUCT(T, NAME)                                                           \
typedef struct NAME##_s NAME;                                                         \
struct NAME##_s {                                                                     \
    MLP_FIELDS(T)                                                                     \
    int (*forward)(NAME *, const double *);     /* chosen by NAME##_init */           \
    int (*act_fn)(NAME *, const double *, double *);                                   \
    void (*forward_batch)(NAME *, const double *, ptrdiff_t, ptrdiff_t, int64_t *);   \
    int64_t (*chain)(NAME *, const double *, ptrdiff_t, ptrdiff_t, ptrdiff_t);        \
};

/* The vector body lives in mlp_body.h (a real file: line numbers in errors, gdb and perf), included once per
 * (dtype, ISA) by MLP_INSTANCE below. These name its functions and instantiate the macros it uses. */
#define MLP_CAT_(a, b) a##b
#define MLP_CAT(a, b) MLP_CAT_(a, b)
#define MLP_PFX MLP_CAT(NAME, SFX)
#define MLP_FN(x) MLP_CAT(MLP_PFX, MLP_CAT(_, x))
#define MLP_ENTRY(x) MLP_CAT(MLP_CAT(NAME, MLP_CAT(_, x)), SFX)
#define MLP_XVMATH(...) MLP_VMATH(__VA_ARGS__)
#define MLP_XWEIGHTS(...) MLP_WEIGHTS(__VA_ARGS__)
#define MLP_XTSUM(B, ...) MLP_CAT(MLP_TSUM_, B)(__VA_ARGS__)


/* Small one-hidden-layer policies (the common case: n_features <= 8, hidden <= 32, up to
 * 64 bytes of classes: 8 float64 / 16 float32) get kernels with every width fixed at compile
 * time, so the normalised input, the hidden activations and the logits stay in registers and
 * no loop or dispatch code runs between the arithmetic. Chosen at load time when the shape
 * fits (see mlp_*_init); anything else runs the generic kernels above.
 * Normalisation runs on double vectors VD of LD lanes over mean/scale padded to 64 bytes
 * (pad lanes mean 0, scale 1); layer 1 is axpy (W rows of P1), the head is dot form (rows of
 * P1, padded to HO = 32 bytes of outputs) reduced with NAME##SFX##_tsum, one or two HO groups. */
#define MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, NIN, P1, HO)                       \
MLP_INLINE int NAME##SFX##_s##NIN##_##P1##_inline(NAME *m, const double *x) {         \
    enum { NBH = P1 / LANES, NBD = (NIN + LD - 1) / LD };                             \
    const T *restrict W1 = m->W[0], *restrict Wt = m->W[1];                           \
    VD xn[NBD];                                                                       \
    for (int q = 0; q < NBD; q++) xn[q] = (VD){0};                                    \
    for (int i = 0; i < NIN; i++) xn[i / LD][i % LD] = x[i];                          \
    for (int q = 0; q < NBD; q++)                                                     \
        xn[q] = (xn[q] - ((const VD *)m->mean)[q]) / ((const VD *)m->scale)[q];       \
    /* the bias enters with the first input: a plain copy loop becomes a memcpy */    \
    /* through the stack, whose reloads stall on store forwarding */                  \
    VT h[NBH];                                                                        \
    const T x0 = (T)xn[0][0];                                                         \
    for (int q = 0; q < NBH; q++) h[q] = ((const VT *)m->b[0])[q] + x0 * ((const VT *)W1)[q]; \
    for (int i = 1; i < NIN; i++) {                                                   \
        const T xi = (T)xn[i / LD][i % LD];                                           \
        const VT *w = (const VT *)(W1 + i * P1);                                      \
        for (int q = 0; q < NBH; q++) h[q] += xi * w[q];                              \
    }                                                                                 \
    for (int q = 0; q < NBH; q++) h[q] = NAME##SFX##_relu(h[q]);                      \
    T *restrict z = m->act[2];                       /* logits() reads them here */   \
    const int groups = (m->dims[2] + HO - 1) / HO * (HO / LANES);   /* 1 or 2 x HO */ \
    for (int g = 0; g < groups; g++) {                                                \
        VT acc[LANES];                                                                \
        for (int k = 0; k < LANES; k++) {                                             \
            const VT *w = (const VT *)(Wt + (g * LANES + k) * P1);                    \
            VT s0 = h[0] * w[0], s1 = (VT){0};                                        \
            for (int q = 1; q < NBH; q++) { if (q & 1) s1 += h[q] * w[q]; else s0 += h[q] * w[q]; } \
            acc[k] = s0 + s1;                                                         \
        }                                                                             \
        ((VT *)z)[g] = NAME##SFX##_tsum(acc) + ((const VT *)m->b[1])[g];              \
    }                                                                                 \
    return NAME##SFX##_argmax(z, m->dims[2]);                                         \
}                                                                                     \
static int NAME##_forward##SFX##_s##NIN##_##P1(NAME *m, const double *x) {            \
    return NAME##SFX##_s##NIN##_##P1##_inline(m, x);                                  \
}                                                                                     \
static void NAME##_forward_batch##SFX##_s##NIN##_##P1(NAME *m, const double *X,       \
                                   ptrdiff_t n, ptrdiff_t row_stride, int64_t *out) { \
    for (ptrdiff_t r = 0; r < n; r++)                                                 \
        out[r] = NAME##SFX##_s##NIN##_##P1##_inline(m, X + r * row_stride);           \
}

#define MLP_SMALL_NIN(T, VT, VD, LD, NAME, SFX, LANES, P1, HO)                        \
    MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, 1, P1, HO)                             \
    MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, 2, P1, HO)                             \
    MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, 3, P1, HO)                             \
    MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, 4, P1, HO)                             \
    MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, 5, P1, HO)                             \
    MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, 6, P1, HO)                             \
    MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, 7, P1, HO)                             \
    MLP_SMALL(T, VT, VD, LD, NAME, SFX, LANES, 8, P1, HO)

#define MLP_SMALL_CASE(NAME, SFX, NIN, P1)                                            \
    case NIN: m->forward = NAME##_forward##SFX##_s##NIN##_##P1;                       \
              m->forward_batch = NAME##_forward_batch##SFX##_s##NIN##_##P1;           \
              m->act_fn = NAME##_act_small; m->specialised = 1; return 1;
#define MLP_SMALL_SWITCH(NAME, SFX, P1)                                               \
    switch (m->dims[0]) {                                                             \
        MLP_SMALL_CASE(NAME, SFX, 1, P1) MLP_SMALL_CASE(NAME, SFX, 2, P1)             \
        MLP_SMALL_CASE(NAME, SFX, 3, P1) MLP_SMALL_CASE(NAME, SFX, 4, P1)             \
        MLP_SMALL_CASE(NAME, SFX, 5, P1) MLP_SMALL_CASE(NAME, SFX, 6, P1)             \
        MLP_SMALL_CASE(NAME, SFX, 7, P1) MLP_SMALL_CASE(NAME, SFX, 8, P1)             \
        default: return 0;                                                            \
    }

/* Instances: float64 with hidden padded to 8/16/24/32 and up to 8 classes; float32 with
 * hidden padded to 16/32 and up to 16 classes. Returns 1 when m got a small kernel. */
#define MLP_SMALL_ALL(VD, VF, LD, LF, SFX)                                            \
    MLP_SMALL_NIN(double, VD, VD, LD, mlp_f64, SFX, LD, 8, 4)                         \
    MLP_SMALL_NIN(double, VD, VD, LD, mlp_f64, SFX, LD, 16, 4)                        \
    MLP_SMALL_NIN(double, VD, VD, LD, mlp_f64, SFX, LD, 24, 4)                        \
    MLP_SMALL_NIN(double, VD, VD, LD, mlp_f64, SFX, LD, 32, 4)                        \
    MLP_SMALL_NIN(float, VF, VD, LD, mlp_f32, SFX, LF, 16, 8)                         \
    MLP_SMALL_NIN(float, VF, VD, LD, mlp_f32, SFX, LF, 32, 8)                         \
static int mlp_f64_pick_small##SFX(mlp_f64 *m) {                                      \
    if (m->pdims[1] == 8) { MLP_SMALL_SWITCH(mlp_f64, SFX, 8) }                       \
    if (m->pdims[1] == 16) { MLP_SMALL_SWITCH(mlp_f64, SFX, 16) }                     \
    if (m->pdims[1] == 24) { MLP_SMALL_SWITCH(mlp_f64, SFX, 24) }                     \
    if (m->pdims[1] == 32) { MLP_SMALL_SWITCH(mlp_f64, SFX, 32) }                     \
    return 0;                                                                         \
}                                                                                     \
static int mlp_f32_pick_small##SFX(mlp_f32 *m) {                                      \
    if (m->pdims[1] == 16) { MLP_SMALL_SWITCH(mlp_f32, SFX, 16) }                     \
    if (m->pdims[1] == 32) { MLP_SMALL_SWITCH(mlp_f32, SFX, 32) }                     \
    return 0;                                                                         \
}

/* The small-kernel rule, the one definition (kernels/_policy.pyx asks mlp_*_small_rule() before it lays
 * the weights out): one hidden layer, <= 8 inputs, <= 32 hidden units, classes in 64 bytes (8 float64 /
 * 16 float32), and only what those kernels compute: ReLU then identity, argmax, plain normalisation, no
 * recurrent layer. It reads the shape and activation fields only, so it can be asked before W is set. */
static inline int mlp_small_shape(int n_layers, int n_in, int n_hidden, int n_out, int itemsize) {
    return n_layers == 2 && n_in <= 8 && n_hidden <= 32 && n_out * itemsize <= MLP_BLOCK_BYTES;
}
#define MLP_SMALL_RULE(m, itemsize) (mlp_small_shape((m)->n_layers, (m)->dims[0], (m)->dims[1], (m)->dims[2], \
                                                    (itemsize)) \
                           && (m)->act_code[0] == MLP_ACT_RELU && (m)->act_code[1] == MLP_ACT_IDENTITY \
                           && (m)->head == MLP_HEAD_ARGMAX && !(m)->pre && !(m)->rnn && !(m)->wkind)
/* ... and laid out for them: an axpy hidden layer (row-major), a dot head. */
#define MLP_SMALL_FITS(m) (MLP_SMALL_RULE(m, (int)sizeof(*(m)->act[0])) && !(m)->dot_form[0] && (m)->dot_form[1] \
                           && (m)->small_layout)

/* x86 MAXPD/MAXPS return the second operand when either is NaN: max(0, v) keeps NaN. */
#define MLP_RELU_MAXPD256(v) __builtin_ia32_maxpd256((mlp_v4d){0}, (v))
#define MLP_RELU_MAXPS256(v) __builtin_ia32_maxps256((mlp_v8f){0}, (v))

MLP_STRUCT(double, mlp_f64)
MLP_STRUCT(float, mlp_f32)
typedef struct { MLP_FIELDS(void) } mlp_desc;
/* mlp_kernel_init copies a descriptor's bytes into the typed struct: the same fields in the same order, a
 * pointer to void laid out as a pointer to double or float (as on every ABI this builds for). Checked here. */
_Static_assert(offsetof(mlp_f64, isa_want) == offsetof(mlp_desc, isa_want)
               && offsetof(mlp_f32, isa_want) == offsetof(mlp_desc, isa_want)
               && offsetof(mlp_f64, forward) >= sizeof(mlp_desc) && offsetof(mlp_f32, forward) >= sizeof(mlp_desc),
               "mlp_desc must lay out MLP_FIELDS as the typed structs do");
/* The small kernels' rule on a descriptor (shape and activation fields only: asked before W is laid out). */
static inline int mlp_small_rule(const mlp_desc *d, int itemsize) { return MLP_SMALL_RULE(d, itemsize); }

/* Continuous head, in float64 on the last layer's outputs: squash, clip, affine. A dozen to */
/* a few dozen actions: scalar code (libm tanh) costs less than the last layer's FMAs. */
#define MLP_HEAD(T, NAME)                                                             \
static int NAME##_head_continuous(NAME *m, double *u) {                               \
    const T *z = m->act[m->n_layers];                                                 \
    const int n = m->dims[m->n_layers];                                               \
    int finite = 1;                                                                   \
    for (int j = 0; j < n; j++) {                                                     \
        double a = (double)z[j];                                                      \
        finite &= (a - a) == 0;                         /* false for NaN and +-Inf */ \
        if (m->squash) a = tanh(a);                                                   \
        a = a < m->act_lo[j] ? m->act_lo[j] : a;                                      \
        a = a > m->act_hi[j] ? m->act_hi[j] : a;                                      \
        u[j] = m->act_off[j] + m->act_scale[j] * a;                                   \
        finite &= (u[j] - u[j]) == 0;                                                 \
    }                                                                                 \
    return finite ? 0 : -1;                                                           \
}
MLP_HEAD(double, mlp_f64)
MLP_HEAD(float, mlp_f32)

/* act() of a policy a small kernel computes (argmax only: MLP_SMALL_RULE): through that kernel, whose layout
 * is its own; the generic act would read the small (row-major) layout as panels and answer garbage. */
#define MLP_ACT_SMALL(NAME)                                                           \
static int NAME##_act_small(NAME *m, const double *x, double *u) {                    \
    const int k = m->forward(m, x);                                                   \
    u[0] = (double)k;                                                                 \
    return k;                                                                         \
}
MLP_ACT_SMALL(mlp_f64)
MLP_ACT_SMALL(mlp_f32)

/* Zero the recurrent state (h, and c for an LSTM); nothing for a feed-forward policy. */
#define MLP_RESET(T, NAME)                                                            \
static void NAME##_reset(NAME *m) {                                                   \
    if (!m->rnn) return;                                                              \
    memset(m->h, 0, sizeof(T) * (size_t)m->pH);                                       \
    if (m->c) memset(m->c, 0, sizeof(T) * (size_t)m->pH);                             \
}
MLP_RESET(double, mlp_f64)
MLP_RESET(float, mlp_f32)

#define MLP_SET(NAME, m, SFX, ISA) do { (m)->forward = NAME##_forward##SFX;           \
    (m)->forward_batch = NAME##_forward_batch##SFX; (m)->chain = NAME##_chain##SFX;   \
    (m)->act_fn = NAME##_act##SFX; (m)->isa = (ISA);                                  \
    if ((m)->rnn) { (m)->forward = NAME##_forward_rnn##SFX;                           \
        (m)->forward_batch = NAME##_forward_batch_rnn##SFX; (m)->act_fn = NAME##_act_rnn##SFX; } } while (0)

/* Benchmark probe (control-node bench policy / recurrent): read n floats (n a multiple of 128, 64-byte
 * aligned) once, in order, with the kernels' prefetch distance: what streaming a policy's weights costs
 * at best on this machine, a measured floor beside the published one. Returns the sum so that the loads
 * stay. One copy per vector width, the one `want` names or the widest the CPU has: 8 independent accumulators,
 * so the adds never limit it below the cache's rate. */
#define MLP_STREAM_READ(VT, SFX)                                                      \
static float mlp_stream_read##SFX(const float *p, size_t n) {                         \
    enum { L = (int)(sizeof(VT) / sizeof(float)), STEP = 8 * L };                     \
    VT a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};\
    for (size_t i = 0; i + STEP <= n; i += STEP) {                                    \
        const VT *v = (const VT *)(p + i);                                            \
        for (int o = 0; o < STEP * 4; o += 64)                                        \
            __builtin_prefetch((const char *)v + MLP_PREFETCH_BYTES + o, 0, 3);       \
        a0 += v[0]; a1 += v[1]; a2 += v[2]; a3 += v[3];                               \
        a4 += v[4]; a5 += v[5]; a6 += v[6]; a7 += v[7];                               \
    }                                                                                 \
    const VT t = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));                   \
    float s = 0;                                                                      \
    for (int k = 0; k < L; k++) s += t[k];                                            \
    return s;                                                                         \
}

#if defined(MLP_NATIVE) || !defined(__x86_64__) || !defined(__GNUC__)
/* One copy for the build machine (or a non-x86 target): 32-byte vectors. */
typedef double mlp_v4d __attribute__((vector_size(32)));
typedef int64_t mlp_v4l __attribute__((vector_size(32)));
typedef float mlp_v8f __attribute__((vector_size(32)));
typedef int32_t mlp_v8i __attribute__((vector_size(32)));
#if defined(__AVX__)
#define MLP_RELU_V4D MLP_RELU_MAXPD256
#define MLP_RELU_V8F MLP_RELU_MAXPS256
#else
#define MLP_RELU_V4D(v) ((mlp_v4d)((mlp_v4l)(v) & ~(mlp_v4l)((v) < 0)))
#define MLP_RELU_V8F(v) ((mlp_v8f)((mlp_v8i)(v) & ~(mlp_v8i)((v) < 0)))
#endif
MLP_LD_SCALAR(double, mlp_v4d, mlp_ld_f64_one)
MLP_LD_SCALAR(float, mlp_v8f, mlp_ld_f32_one)
#define T double
#define VT mlp_v4d
#define VI mlp_v4l
#define NAME mlp_f64
#define BLK 4
#define SFX _one
#define RELU MLP_RELU_V4D
#define LDP mlp_ld_f64_one
#include "mlp_body.h"
#define T float
#define VT mlp_v8f
#define VI mlp_v8i
#define NAME mlp_f32
#define BLK 8
#define SFX _one
#define RELU MLP_RELU_V8F
#define LDP mlp_ld_f32_one
#include "mlp_body.h"
MLP_SMALL_ALL(mlp_v4d, mlp_v8f, 4, 8, _one)
MLP_STREAM_READ(mlp_v8f, _one)
static float mlp_stream_read(const float *p, size_t n, int want) { (void)want; return mlp_stream_read_one(p, n); }
#define MLP_PICK(NAME, m) do { MLP_SET(NAME, m, _one, mlp_isa()); if (MLP_SMALL_FITS(m)) NAME##_pick_small_one(m); } while (0)
/* One copy only: a named copy cannot be chosen. */
static const char *mlp_isa_missing(int want) {
    return want == MLP_ISA_AUTO ? NULL : "a portable build (this one has a single -march=native / generic copy)";
}
static const char *mlp_isa(void) {
#if defined(MLP_NATIVE)
    return "native";
#else
    return "generic";
#endif
}
#else
/* Baseline x86-64: SSE2, 16-byte vectors (wider generic vectors are lowered badly). */
typedef double mlp_v2d __attribute__((vector_size(16)));
typedef int64_t mlp_v2l __attribute__((vector_size(16)));
typedef float mlp_v4f __attribute__((vector_size(16)));
typedef int32_t mlp_v4i __attribute__((vector_size(16)));
#define MLP_RELU_MAXPD(v) __builtin_ia32_maxpd((mlp_v2d){0}, (v))
#define MLP_RELU_MAXPS(v) __builtin_ia32_maxps((mlp_v4f){0}, (v))
/* SSE2 weight loaders (the portable copy: no F16C): f16 by integer arithmetic (mlp_half_to_float's), */
/* bf16 by interleaving zeros below it, int8 sign-extended by duplicating bytes and an arithmetic shift. */
static inline uint32_t mlp_ld4(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t mlp_ld2(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }
MLP_INLINE __m128 mlp_sse2_h4(__m128i u) {           /* u: 4 halves in the low 16 bits of 32-bit lanes */
    const __m128i em = _mm_slli_epi32(_mm_and_si128(u, _mm_set1_epi32(0x7fff)), 13);
    const __m128i sg = _mm_slli_epi32(_mm_and_si128(u, _mm_set1_epi32(0x8000)), 16);
    const __m128 f = _mm_mul_ps(_mm_castsi128_ps(em), _mm_set1_ps(0x1p112f));
    return _mm_or_ps(f, _mm_castsi128_ps(sg));
}
MLP_INLINE __m128i mlp_sse2_i8x4(uint32_t b) {      /* 4 int8 -> 4 int32 */
    __m128i v = _mm_cvtsi32_si128((int)b);
    v = _mm_unpacklo_epi8(v, v);
    v = _mm_unpacklo_epi16(v, v);
    return _mm_srai_epi32(v, 24);
}
MLP_INLINE mlp_v4f mlp_ld_f32_sse2_h(const uint16_t *p) {
    return (mlp_v4f)mlp_sse2_h4(_mm_unpacklo_epi16(_mm_loadl_epi64((const __m128i *)p), _mm_setzero_si128())); }
MLP_INLINE mlp_v4f mlp_ld_f32_sse2_bh(const uint16_t *p) {
    return (mlp_v4f)_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)p))); }
MLP_INLINE mlp_v4f mlp_ld_f32_sse2_bpl(const uint16_t *g) {
    __m128i w = _mm_loadu_si128((const __m128i *)g);
    __asm__("" : "+x"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v4f)_mm_castsi128_ps(_mm_slli_epi32(w, 16)); }
MLP_INLINE mlp_v4f mlp_ld_f32_sse2_bph(const uint16_t *g) {
    __m128i w = _mm_loadu_si128((const __m128i *)g);
    __asm__("" : "+x"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v4f)_mm_castsi128_ps(_mm_and_si128(w, _mm_set1_epi32((int)0xffff0000u))); }
MLP_INLINE mlp_v4f mlp_ld_f32_sse2_q(const int8_t *p) { return (mlp_v4f)_mm_cvtepi32_ps(mlp_sse2_i8x4(mlp_ld4(p))); }
MLP_INLINE mlp_v4f mlp_ld_f32_sse2_s(const float *p) { return (mlp_v4f)_mm_loadu_ps(p); }
MLP_INLINE mlp_v2d mlp_ld_f64_sse2_h(const uint16_t *p) {
    return (mlp_v2d)_mm_cvtps_pd(mlp_sse2_h4(_mm_unpacklo_epi16(_mm_cvtsi32_si128((int)mlp_ld4(p)), _mm_setzero_si128()))); }
MLP_INLINE mlp_v2d mlp_ld_f64_sse2_bh(const uint16_t *p) {
    return (mlp_v2d)_mm_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(),
                                                                     _mm_cvtsi32_si128((int)mlp_ld4(p))))); }
MLP_INLINE mlp_v2d mlp_ld_f64_sse2_bpl(const uint16_t *g) {
    __m128i w = _mm_loadl_epi64((const __m128i *)g);
    __asm__("" : "+x"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v2d)_mm_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(w, 16))); }
MLP_INLINE mlp_v2d mlp_ld_f64_sse2_bph(const uint16_t *g) {
    __m128i w = _mm_loadl_epi64((const __m128i *)g);
    __asm__("" : "+x"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v2d)_mm_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(w,
                                                               _mm_set1_epi32((int)0xffff0000u)))); }
MLP_INLINE mlp_v2d mlp_ld_f64_sse2_q(const int8_t *p) { return (mlp_v2d)_mm_cvtepi32_pd(mlp_sse2_i8x4(mlp_ld2(p))); }
MLP_INLINE mlp_v2d mlp_ld_f64_sse2_s(const float *p) {
    return (mlp_v2d)_mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)p))); }
#define T double
#define VT mlp_v2d
#define VI mlp_v2l
#define NAME mlp_f64
#define BLK 2
#define SFX _sse2
#define RELU MLP_RELU_MAXPD
#define LDP mlp_ld_f64_sse2
#include "mlp_body.h"
#define T float
#define VT mlp_v4f
#define VI mlp_v4i
#define NAME mlp_f32
#define BLK 4
#define SFX _sse2
#define RELU MLP_RELU_MAXPS
#define LDP mlp_ld_f32_sse2
#include "mlp_body.h"
MLP_SMALL_ALL(mlp_v2d, mlp_v4f, 2, 4, _sse2)
MLP_STREAM_READ(mlp_v4f, _sse2)

#if defined(__clang__)
#pragma clang attribute push (__attribute__((target("avx,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#endif
typedef double mlp_v4d __attribute__((vector_size(32)));
typedef int64_t mlp_v4l __attribute__((vector_size(32)));
typedef float mlp_v8f __attribute__((vector_size(32)));
typedef int32_t mlp_v8i __attribute__((vector_size(32)));
/* AVX2 + F16C weight loaders: VCVTPH2PS; bf16 zero-extended and shifted into place; int8 VPMOVSXBD + convert */
MLP_INLINE mlp_v8f mlp_ld_f32_avx2_h(const uint16_t *p) { return (mlp_v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
MLP_INLINE mlp_v8f mlp_ld_f32_avx2_bh(const uint16_t *p) {
    return (mlp_v8f)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16)); }
MLP_INLINE mlp_v8f mlp_ld_f32_avx2_bpl(const uint16_t *g) {
    __m256i w = _mm256_loadu_si256((const __m256i *)g);
    __asm__("" : "+x"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v8f)_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
MLP_INLINE mlp_v8f mlp_ld_f32_avx2_bph(const uint16_t *g) {
    __m256i w = _mm256_loadu_si256((const __m256i *)g);
    __asm__("" : "+x"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v8f)_mm256_castsi256_ps(_mm256_and_si256(w,
                                                         _mm256_set1_epi32((int)0xffff0000u))); }
MLP_INLINE mlp_v8f mlp_ld_f32_avx2_q(const int8_t *p) {
    return (mlp_v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
MLP_INLINE mlp_v8f mlp_ld_f32_avx2_s(const float *p) { return (mlp_v8f)_mm256_loadu_ps(p); }
MLP_INLINE mlp_v4d mlp_ld_f64_avx2_h(const uint16_t *p) {
    return (mlp_v4d)_mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p))); }
MLP_INLINE mlp_v4d mlp_ld_f64_avx2_bh(const uint16_t *p) {
    return (mlp_v4d)_mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)p)), 16))); }
MLP_INLINE mlp_v4d mlp_ld_f64_avx2_bpl(const uint16_t *g) {
    __m128i w = _mm_loadu_si128((const __m128i *)g);
    __asm__("" : "+x"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v4d)_mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(w, 16))); }
MLP_INLINE mlp_v4d mlp_ld_f64_avx2_bph(const uint16_t *g) {
    __m128i w = _mm_loadu_si128((const __m128i *)g);
    __asm__("" : "+x"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v4d)_mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(w,
                                                                   _mm_set1_epi32((int)0xffff0000u)))); }
MLP_INLINE mlp_v4d mlp_ld_f64_avx2_q(const int8_t *p) {
    return (mlp_v4d)_mm256_cvtepi32_pd(_mm_cvtepi8_epi32(_mm_cvtsi32_si128((int)mlp_ld4(p)))); }
MLP_INLINE mlp_v4d mlp_ld_f64_avx2_s(const float *p) { return (mlp_v4d)_mm256_cvtps_pd(_mm_loadu_ps(p)); }
#define T double
#define VT mlp_v4d
#define VI mlp_v4l
#define NAME mlp_f64
#define BLK 4
#define SFX _avx2
#define RELU MLP_RELU_MAXPD256
#define LDP mlp_ld_f64_avx2
#include "mlp_body.h"
#define T float
#define VT mlp_v8f
#define VI mlp_v8i
#define NAME mlp_f32
#define BLK 8
#define SFX _avx2
#define RELU MLP_RELU_MAXPS256
#define LDP mlp_ld_f32_avx2
#include "mlp_body.h"
MLP_SMALL_ALL(mlp_v4d, mlp_v8f, 4, 8, _avx2)
MLP_STREAM_READ(mlp_v8f, _avx2)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* AVX-512 (x86-64-v4: F, BW, CD, DQ, VL): 64-byte vectors, one whole padded row each. */
#if defined(__clang__)
#pragma clang attribute push (__attribute__((target("avx,avx2,fma,f16c,avx512f,avx512dq,avx512bw,avx512vl"))), \
                              apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#endif
typedef double mlp_v8d __attribute__((vector_size(64)));
typedef int64_t mlp_v8l __attribute__((vector_size(64)));
typedef float mlp_v16f __attribute__((vector_size(64)));
typedef int32_t mlp_v16i __attribute__((vector_size(64)));
/* max(0, v) by mask: v < 0 clears the lane, a NaN compares false and stays */
#define MLP_RELU_V8D(v) ((mlp_v8d)((mlp_v8l)(v) & ~(mlp_v8l)((v) < 0)))
#define MLP_RELU_V16F(v) ((mlp_v16f)((mlp_v16i)(v) & ~(mlp_v16i)((v) < 0)))
/* MLP_BP_ONE_LOAD: the empty asm keeps a paired bf16 word vector in a register, so the two halves' loaders
 * (inlined side by side, the same address) share one load; without it GCC folds the load into both the shift
 * and the mask, two 64-byte loads per 32 weights, and the probe's widening loop ran 36 instead of 57 FMAs/ns
 * on Zen 4 (bench/c/floor_probe.h). */
/* AVX-512 weight loaders: VCVTPH2PS zmm; bf16 by shift (exact: VDPBF16PS is not used, it would round the */
/* activations to bf16 too, which this storage promises not to do); int8 VPMOVSXBD + VCVTDQ2PS. */
MLP_INLINE mlp_v16f mlp_ld_f32_avx512_h(const uint16_t *p) {
    return (mlp_v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
MLP_INLINE mlp_v16f mlp_ld_f32_avx512_bh(const uint16_t *p) {
    return (mlp_v16f)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16)); }
MLP_INLINE mlp_v16f mlp_ld_f32_avx512_bpl(const uint16_t *g) {
    __m512i w = _mm512_loadu_si512((const void *)g);
    __asm__("" : "+v"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v16f)_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
MLP_INLINE mlp_v16f mlp_ld_f32_avx512_bph(const uint16_t *g) {
    __m512i w = _mm512_loadu_si512((const void *)g);
    __asm__("" : "+v"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v16f)_mm512_castsi512_ps(_mm512_and_si512(w,
                                                          _mm512_set1_epi32((int)0xffff0000u))); }
MLP_INLINE mlp_v16f mlp_ld_f32_avx512_q(const int8_t *p) {
    return (mlp_v16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
MLP_INLINE mlp_v16f mlp_ld_f32_avx512_s(const float *p) { return (mlp_v16f)_mm512_loadu_ps(p); }
MLP_INLINE mlp_v8d mlp_ld_f64_avx512_h(const uint16_t *p) {
    return (mlp_v8d)_mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p))); }
MLP_INLINE mlp_v8d mlp_ld_f64_avx512_bh(const uint16_t *p) {
    return (mlp_v8d)_mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16))); }
MLP_INLINE mlp_v8d mlp_ld_f64_avx512_bpl(const uint16_t *g) {
    __m256i w = _mm256_loadu_si256((const __m256i *)g);
    __asm__("" : "+v"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v8d)_mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))); }
MLP_INLINE mlp_v8d mlp_ld_f64_avx512_bph(const uint16_t *g) {
    __m256i w = _mm256_loadu_si256((const __m256i *)g);
    __asm__("" : "+v"(w));    /* MLP_BP_ONE_LOAD */
    return (mlp_v8d)_mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_and_si256(w,
                                                                         _mm256_set1_epi32((int)0xffff0000u)))); }
MLP_INLINE mlp_v8d mlp_ld_f64_avx512_q(const int8_t *p) {
    return (mlp_v8d)_mm512_cvtepi32_pd(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
MLP_INLINE mlp_v8d mlp_ld_f64_avx512_s(const float *p) { return (mlp_v8d)_mm512_cvtps_pd(_mm256_loadu_ps(p)); }
#define T double
#define VT mlp_v8d
#define VI mlp_v8l
#define NAME mlp_f64
#define BLK 8
#define SFX _avx512
#define RELU MLP_RELU_V8D
#define LDP mlp_ld_f64_avx512
#include "mlp_body.h"
#define T float
#define VT mlp_v16f
#define VI mlp_v16i
#define NAME mlp_f32
#define BLK 16
#define SFX _avx512
#define RELU MLP_RELU_V16F
#define LDP mlp_ld_f32_avx512
#include "mlp_body.h"
MLP_STREAM_READ(mlp_v16f, _avx512)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* F16C (the avx2 copy's f16 loads) by CPUID leaf 1, ECX bit 29: clang 14's __builtin_cpu_supports knows
 * neither "f16c" nor "x86-64-v3", and the kernel must build with both compilers. */
static int mlp_cpu_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
}
static int mlp_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
        && mlp_cpu_f16c();
}
static int mlp_has_avx512(void) {
    __builtin_cpu_init();
    return mlp_has_avx2() && __builtin_cpu_supports("avx512f")
        && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl");
}
/* The small compile-time-shaped kernels are AVX2 (their registers hold 32-byte rows); */
/* everything else takes the widest vectors the CPU has, or the copy m->isa_want names (the caller has */
/* asked mlp_isa_missing() first; a forced AVX-512 copy is laid out for the generic kernels). */
#define MLP_PICK(NAME, m) do {                                                        \
    const int w_ = (m)->isa_want;                                                     \
    const int a2_ = w_ == MLP_ISA_AVX2 || (w_ == MLP_ISA_AUTO && mlp_has_avx2());     \
    const int a5_ = w_ == MLP_ISA_AVX512 || (w_ == MLP_ISA_AUTO && mlp_has_avx512()); \
    if (a2_ && MLP_SMALL_FITS(m)) { MLP_SET(NAME, m, _avx2, "avx2+fma"); NAME##_pick_small_avx2(m); } \
    else if (a5_) MLP_SET(NAME, m, _avx512, "avx512");                                \
    else if (a2_) MLP_SET(NAME, m, _avx2, "avx2+fma");                                \
    else { MLP_SET(NAME, m, _sse2, "sse2"); if (MLP_SMALL_FITS(m)) NAME##_pick_small_sse2(m); } \
} while (0)
/* NULL when this CPU runs the copy `want` (MLP_ISA_*), else the first CPU feature it lacks. */
static const char *mlp_isa_missing(int want) {
    __builtin_cpu_init();
    if (want == MLP_ISA_AVX2 || want == MLP_ISA_AVX512) {
        if (!__builtin_cpu_supports("avx2")) return "avx2";
        if (!__builtin_cpu_supports("fma")) return "fma";
        if (!mlp_cpu_f16c()) return "f16c";
    }
    if (want == MLP_ISA_AVX512) {
        if (!__builtin_cpu_supports("avx512f")) return "avx512f";
        if (!__builtin_cpu_supports("avx512dq")) return "avx512dq";
        if (!__builtin_cpu_supports("avx512bw")) return "avx512bw";
        if (!__builtin_cpu_supports("avx512vl")) return "avx512vl";
    }
    return NULL;
}
static const char *mlp_isa(void) {
    return mlp_has_avx512() ? "avx512" : mlp_has_avx2() ? "avx2+fma" : "sse2";
}
/* The copy `want` (MLP_ISA_*) names, or the widest for AUTO; a copy this CPU cannot run reads with the
 * widest it can (never an illegal instruction; callers ask mlp_isa_missing() first and refuse by name).
 * The widest is found on the first call and kept: the F16C test is a CPUID, a VM exit a timed read must not
 * pay. */
static float mlp_stream_read(const float *p, size_t n, int want) {
    static int widest = -1;
    if (widest < 0) widest = mlp_has_avx512() ? MLP_ISA_AVX512 : mlp_has_avx2() ? MLP_ISA_AVX2 : MLP_ISA_PORTABLE;
    if (want == MLP_ISA_AUTO || want > widest) want = widest;
    if (want == MLP_ISA_AVX512) return mlp_stream_read_avx512(p, n);
    if (want == MLP_ISA_AVX2) return mlp_stream_read_avx2(p, n);
    return mlp_stream_read_sse2(p, n);
}
#endif

/* One handle per policy: the model dtype is settled once, when the policy is built (mlp_kernel_init below);
 * every caller (the Cython Policy, the loop) calls through it and never branches on the dtype. Each entry is
 * a tail call into the copy NAME_init chose for this CPU and shape. */
typedef struct {
    void *m;                                        /* the mlp_f64 or mlp_f32 it drives */
    int (*act)(void *, const double *, double *);
    int (*forward)(void *, const double *);
    void (*forward_batch)(void *, const double *, ptrdiff_t, ptrdiff_t, int64_t *);
    int64_t (*chain)(void *, const double *, ptrdiff_t, ptrdiff_t, ptrdiff_t);
    void (*reset)(void *);
    const void *logits;                             /* the last layer's outputs (model dtype) */
    const char *isa;                                /* the copy chosen: "avx512", "avx2+fma", "sse2" */
    int specialised;                                /* 1: a small compile-time-shaped kernel */
    int itemsize;                                   /* of the model dtype: 4 or 8 */
} mlp_kernel;

#define MLP_HANDLE(NAME)                                                              \
static int NAME##_k_act(void *m, const double *x, double *u)                          \
{ return ((NAME *)m)->act_fn((NAME *)m, x, u); }                                      \
static int NAME##_k_forward(void *m, const double *x)                                 \
{ return ((NAME *)m)->forward((NAME *)m, x); }                                        \
static void NAME##_k_forward_batch(void *m, const double *X, ptrdiff_t n, ptrdiff_t s, int64_t *o) \
{ ((NAME *)m)->forward_batch((NAME *)m, X, n, s, o); }                                \
static int64_t NAME##_k_chain(void *m, const double *X, ptrdiff_t n, ptrdiff_t s, ptrdiff_t it) \
{ return ((NAME *)m)->chain((NAME *)m, X, n, s, it); }                                \
static void NAME##_k_reset(void *m) { NAME##_reset((NAME *)m); }                      \
/* Choose the kernels for this CPU and shape (every field filled first) and settle the handle. */ \
static void NAME##_kernel(NAME *m, mlp_kernel *k) {                                   \
    MLP_PICK(NAME, m);                                                                \
    k->m = m; k->act = NAME##_k_act; k->forward = NAME##_k_forward;                   \
    k->forward_batch = NAME##_k_forward_batch; k->chain = NAME##_k_chain;             \
    k->reset = NAME##_k_reset; k->logits = m->act[m->n_layers]; k->isa = m->isa;      \
    k->specialised = m->specialised; k->itemsize = (int)sizeof(*m->act[0]);           \
}
MLP_HANDLE(mlp_f64)
MLP_HANDLE(mlp_f32)

/* A policy's storage: the typed struct of its dtype. */
typedef union { mlp_f64 f64; mlp_f32 f32; } mlp_model;

/* The one place the model dtype is decided: copy the filled descriptor into the typed struct of `itemsize`
 * (4: float32, 8: float64), choose its kernels for this CPU and shape and settle the handle `k`. */
static void mlp_kernel_init(mlp_model *m, const mlp_desc *d, int itemsize, mlp_kernel *k) {
    memset(m, 0, sizeof *m);
    memcpy(m, d, sizeof *d);
    if (itemsize == 4) mlp_f32_kernel(&m->f32, k);
    else mlp_f64_kernel(&m->f64, k);
}

#endif
