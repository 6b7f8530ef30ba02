/* The floor of this core, measured (control-node bench policy / bench recurrent, bench/floor.py):
 *
 *   fp_read_ns       a timed streaming read of a buffer, the way the kernels read weights: the widest
 *                    vectors asked for, 8 independent accumulators, software prefetch 1 KiB ahead for
 *                    buffers over 256 KiB only (kernels/mlp_core.h's MLP_PREFETCH_BYTES / _MIN_BYTES)
 *   fp_fma_ns        a timed multiply-add loop: FP_CHAINS independent accumulator chains, enough to keep
 *                    two FMA pipes of 4-5 cycles latency busy, float32 or float64
 *   fp_add_chain_ns  a chain of dependent register adds: one per cycle on every x86-64 and AArch64 core,
 *                    so adds per ns is the clock the core runs at (what /proc/cpuinfo cannot show in a guest)
 *
 * Each writes `samples` timings (ns per pass / per loop iteration / per add) into out[]; the caller takes
 * the percentiles. One copy per vector width on x86-64 (AVX-512, AVX2 + FMA, SSE2), picked by the caller
 * (FP_ISA_*); fp_isa_supported says which this CPU runs. Elsewhere one portable copy (16-byte vectors). */
#include <stddef.h>
#include <stdint.h>
#include <time.h>

enum { FP_ISA_SSE2 = 0, FP_ISA_AVX2 = 1, FP_ISA_AVX512 = 2 };
enum { FP_CHAINS = 12 };                    /* 12 chains + 2 constants fit AVX2's 16 registers */
#define FP_PREFETCH_BYTES 1024
#define FP_PREFETCH_MIN_BYTES (256 * 1024)

static int64_t fp_now_ns(void) {
    struct timespec t;
#if defined(_WIN32)
    timespec_get(&t, TIME_UTC);
#else
    clock_gettime(CLOCK_MONOTONIC, &t);
#endif
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

#if defined(__GNUC__)
/* the streaming read, one copy per vector type VT (L floats) */
#define FP_READ(VT, SFX, ATTR)                                                        \
ATTR static float fp_read##SFX(const float *p, size_t n, int pf) {                    \
    enum { L = (int)(sizeof(VT) / sizeof(float)), STEP = 8 * L };                     \
    VT a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};\
    for (size_t i = 0; i + STEP <= n; i += STEP) {                                    \
        const VT *v = (const VT *)(p + i);                                            \
        if (pf)                                                                       \
            for (int o = 0; o < STEP * 4; o += 64)                                    \
                __builtin_prefetch((const char *)v + FP_PREFETCH_BYTES + o, 0, 3);    \
        a0 += v[0]; a1 += v[1]; a2 += v[2]; a3 += v[3];                               \
        a4 += v[4]; a5 += v[5]; a6 += v[6]; a7 += v[7];                               \
    }                                                                                 \
    const VT t = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));                   \
    float s = 0;                                                                      \
    for (int k = 0; k < L; k++) s += t[k];                                            \
    return s;                                                                         \
}
/* the multiply-add loop: a <- a * m + c on FP_CHAINS independent accumulators (m just under 1, so the
 * values settle at c / (1 - m) and never overflow or go subnormal); FMA() is one fused multiply-add
 * where the ISA has it, a multiply and an add (counted as one multiply-add) on SSE2 */
#define FP_FMA_LOOP(T, VT, SFX, ATTR, FMA)                                            \
ATTR static T fp_fma##SFX(long iters, T seed) {                                       \
    enum { L = (int)(sizeof(VT) / sizeof(T)) };                                       \
    VT a[FP_CHAINS], m, c;                                                            \
    for (int k = 0; k < L; k++) { m[k] = (T)0.999; c[k] = (T)0.001; }                 \
    for (int j = 0; j < FP_CHAINS; j++)                                               \
        for (int k = 0; k < L; k++) a[j][k] = seed + (T)(j * L + k) * (T)1e-3;        \
    for (long i = 0; i < iters; i++) {                                                \
        a[0] = FMA(a[0], m, c); a[1] = FMA(a[1], m, c); a[2] = FMA(a[2], m, c);       \
        a[3] = FMA(a[3], m, c); a[4] = FMA(a[4], m, c); a[5] = FMA(a[5], m, c);       \
        a[6] = FMA(a[6], m, c); a[7] = FMA(a[7], m, c); a[8] = FMA(a[8], m, c);       \
        a[9] = FMA(a[9], m, c); a[10] = FMA(a[10], m, c); a[11] = FMA(a[11], m, c);   \
    }                                                                                 \
    T s = 0;                                                                          \
    for (int j = 0; j < FP_CHAINS; j++)                                               \
        for (int k = 0; k < L; k++) s += a[j][k];                                     \
    return s;                                                                         \
}
#define FP_MULADD(a, m, c) ((a) * (m) + (c))

typedef float fp_v4f __attribute__((vector_size(16)));
typedef double fp_v2d __attribute__((vector_size(16)));
#if defined(__x86_64__)
#include <immintrin.h>
typedef float fp_v8f __attribute__((vector_size(32)));
typedef double fp_v4d __attribute__((vector_size(32)));
typedef float fp_v16f __attribute__((vector_size(64)));
typedef double fp_v8d __attribute__((vector_size(64)));
#define FP_AVX2 __attribute__((target("avx2,fma"), noinline))
#define FP_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"), noinline))
/* SSE2: separate multiply and add, spelled as intrinsics so no contraction can fuse them */
#define FP_SSE2_PS(a, m, c) ((fp_v4f)_mm_add_ps(_mm_mul_ps((__m128)(a), (__m128)(m)), (__m128)(c)))
#define FP_SSE2_PD(a, m, c) ((fp_v2d)_mm_add_pd(_mm_mul_pd((__m128d)(a), (__m128d)(m)), (__m128d)(c)))
#define FP_AVX2_PS(a, m, c) ((fp_v8f)_mm256_fmadd_ps((__m256)(a), (__m256)(m), (__m256)(c)))
#define FP_AVX2_PD(a, m, c) ((fp_v4d)_mm256_fmadd_pd((__m256d)(a), (__m256d)(m), (__m256d)(c)))
#define FP_AVX512_PS(a, m, c) ((fp_v16f)_mm512_fmadd_ps((__m512)(a), (__m512)(m), (__m512)(c)))
#define FP_AVX512_PD(a, m, c) ((fp_v8d)_mm512_fmadd_pd((__m512d)(a), (__m512d)(m), (__m512d)(c)))
FP_READ(fp_v4f, _sse2, __attribute__((noinline)))
FP_READ(fp_v8f, _avx2, FP_AVX2)
FP_READ(fp_v16f, _avx512, FP_AVX512)
FP_FMA_LOOP(float, fp_v4f, _f32_sse2, __attribute__((noinline)), FP_SSE2_PS)
FP_FMA_LOOP(double, fp_v2d, _f64_sse2, __attribute__((noinline)), FP_SSE2_PD)
FP_FMA_LOOP(float, fp_v8f, _f32_avx2, FP_AVX2, FP_AVX2_PS)
FP_FMA_LOOP(double, fp_v4d, _f64_avx2, FP_AVX2, FP_AVX2_PD)
FP_FMA_LOOP(float, fp_v16f, _f32_avx512, FP_AVX512, FP_AVX512_PS)
FP_FMA_LOOP(double, fp_v8d, _f64_avx512, FP_AVX512, FP_AVX512_PD)

/* the widening multiply-add loop: FP_CHAINS float32 accumulators a[j] += x * widen(w), the stored weights
 * read in order from a small (L1-resident) buffer and widened as the kernels widen them (kernels/mlp_core.h:
 * f16 VCVTPH2PS, bf16 paired: a 32-bit word's low half shifted up / high half masked, int8 VPMOVSXBD +
 * VCVTDQ2PS). Its rate is the compute floor of narrow weights: on a core where the widening issues slower
 * than the FMAs (Zen 4: VCVTPH2PS zmm one per 2 cycles) it is below the float32 FMA rate. n: stored values
 * in the buffer, a multiple of FP_CHAINS vectors (of 32 for bf16). */
#define FP_WIDEN_LOOP(VT, SFX, ATTR, WT, LDW)                                          \
ATTR static float fp_widen##SFX(const WT *w, long n, long iters) {                    \
    enum { L = (int)(sizeof(VT) / sizeof(float)) };                                   \
    VT a[FP_CHAINS], x;                                                               \
    for (int k = 0; k < L; k++) x[k] = 1e-3f;                                         \
    for (int j = 0; j < FP_CHAINS; j++) for (int k = 0; k < L; k++) a[j][k] = 0;      \
    for (long i = 0; i < iters; i++)                                                  \
        for (long v = 0; v < n; v += FP_CHAINS * L)                                   \
            for (int j = 0; j < FP_CHAINS; j++) a[j] += x * LDW(w + v, j * L);        \
    float s = 0;                                                                      \
    for (int j = 0; j < FP_CHAINS; j++) for (int k = 0; k < L; k++) s += a[j][k];     \
    return s;                                                                         \
}
/* the loaders, with the element offset of the vector in the buffer (bf16 paired: groups of 32) */
#define FP_AVX512I __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"), always_inline))
#define FP_AVX2I __attribute__((target("avx2,fma,f16c"), always_inline))
#define FP_BPG(w, off) ((w) + ((off) & ~31L) + 2 * ((off) & 15))
FP_AVX512I static inline fp_v16f fp_ld16_h(const uint16_t *w, long off) {
    return (fp_v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + off))); }
FP_AVX512I static inline fp_v16f fp_ld16_bp(const uint16_t *w, long off) {
    __m512i v = _mm512_loadu_si512((const void *)FP_BPG(w, off));
    __asm__("" : "+v"(v));      /* one load for both halves: not folded into the shift and the mask */
    return (fp_v16f)_mm512_castsi512_ps((off & 16) ? _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u))
                                                   : _mm512_slli_epi32(v, 16)); }
FP_AVX512I static inline fp_v16f fp_ld16_q(const int8_t *w, long off) {
    return (fp_v16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + off)))); }
#define FP_AVX2C __attribute__((target("avx2,fma,f16c"), noinline))
FP_AVX2I static inline fp_v8f fp_ld8_h(const uint16_t *w, long off) {
    return (fp_v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + off))); }
FP_AVX2I static inline fp_v8f fp_ld8_bp(const uint16_t *w, long off) {
    __m256i v = _mm256_loadu_si256((const __m256i *)FP_BPG(w, off));
    __asm__("" : "+x"(v));
    return (fp_v8f)_mm256_castsi256_ps((off & 16) ? _mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))
                                                  : _mm256_slli_epi32(v, 16)); }
FP_AVX2I static inline fp_v8f fp_ld8_q(const int8_t *w, long off) {
    return (fp_v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w + off)))); }
FP_WIDEN_LOOP(fp_v16f, _h_avx512, FP_AVX512, uint16_t, fp_ld16_h)
FP_WIDEN_LOOP(fp_v16f, _bp_avx512, FP_AVX512, uint16_t, fp_ld16_bp)
FP_WIDEN_LOOP(fp_v16f, _q_avx512, FP_AVX512, int8_t, fp_ld16_q)
FP_WIDEN_LOOP(fp_v8f, _h_avx2, FP_AVX2C, uint16_t, fp_ld8_h)
FP_WIDEN_LOOP(fp_v8f, _bp_avx2, FP_AVX2C, uint16_t, fp_ld8_bp)
FP_WIDEN_LOOP(fp_v8f, _q_avx2, FP_AVX2C, int8_t, fp_ld8_q)
#define FP_HAS_WIDEN 1

/* 1 where this CPU runs the copy (the kernels' test for AVX-512: F, DQ, BW and VL) */
static int fp_isa_supported(int isa) {
    __builtin_cpu_init();
    if (isa == FP_ISA_SSE2) return 1;
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == FP_ISA_AVX2) return avx2;
    if (isa == FP_ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
            && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    return 0;
}
static int fp_vector_bytes(int isa) { return isa == FP_ISA_AVX512 ? 64 : isa == FP_ISA_AVX2 ? 32 : 16; }
static float (*fp_read_fn(int isa))(const float *, size_t, int) {
    return isa == FP_ISA_AVX512 ? fp_read_avx512 : isa == FP_ISA_AVX2 ? fp_read_avx2 : fp_read_sse2;
}
static float (*fp_fma_f32_fn(int isa))(long, float) {
    return isa == FP_ISA_AVX512 ? fp_fma_f32_avx512 : isa == FP_ISA_AVX2 ? fp_fma_f32_avx2 : fp_fma_f32_sse2;
}
static double (*fp_fma_f64_fn(int isa))(long, double) {
    return isa == FP_ISA_AVX512 ? fp_fma_f64_avx512 : isa == FP_ISA_AVX2 ? fp_fma_f64_avx2 : fp_fma_f64_sse2;
}
#else   /* not x86-64: one portable copy of 16-byte vectors (the compiler's multiply-add) */
FP_READ(fp_v4f, _portable, __attribute__((noinline)))
FP_FMA_LOOP(float, fp_v4f, _f32_portable, __attribute__((noinline)), FP_MULADD)
FP_FMA_LOOP(double, fp_v2d, _f64_portable, __attribute__((noinline)), FP_MULADD)
static int fp_isa_supported(int isa) { return isa == FP_ISA_SSE2; }
static int fp_vector_bytes(int isa) { (void)isa; return 16; }
static float (*fp_read_fn(int isa))(const float *, size_t, int) { (void)isa; return fp_read_portable; }
static float (*fp_fma_f32_fn(int isa))(long, float) { (void)isa; return fp_fma_f32_portable; }
static double (*fp_fma_f64_fn(int isa))(long, double) { (void)isa; return fp_fma_f64_portable; }
#endif

/* iters x 16 dependent adds of a register the compiler cannot see through (an add of an immediate could
 * be folded at rename on some cores; an add of a register is not) */
__attribute__((noinline)) static uint64_t fp_add_chain(long iters, uint64_t y) {
    uint64_t x = 0;
    __asm__ volatile("" : "+r"(y));
#define FP_ADD1 x += y; __asm__ volatile("" : "+r"(x));
    for (long i = 0; i < iters; i++) {
        FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1
        FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1 FP_ADD1
    }
#undef FP_ADD1
    return x;
}
#define FP_ADDS_PER_ITER 16
#else
#error "bench/c/floor_probe.h needs GCC or Clang (vector extensions)"
#endif

/* Every result goes to this sink: the compiler sees the loops as pure functions and would drop a call
 * whose result is unused. */
static volatile double fp_sink;

/* ns per pass of reading n floats (a multiple of 8 vectors, 64-byte aligned), `passes` passes per sample,
 * after one warm-up pass; returns the sum read so that the loads stay */
static float fp_read_ns(int isa, const float *p, size_t n, int passes, int samples, double *out) {
    float (*f)(const float *, size_t, int) = fp_read_fn(isa);
    int pf = n * sizeof(float) > FP_PREFETCH_MIN_BYTES;
    float s = f(p, n, pf);
    for (int i = 0; i < samples; i++) {
        int64_t t0 = fp_now_ns();
        for (int k = 0; k < passes; k++) fp_sink = f(p, n, pf);
        out[i] = (double)(fp_now_ns() - t0) / passes;
    }
    fp_sink = s;
    return s;
}

/* ns per loop iteration (FP_CHAINS vector multiply-adds) of the float32 (f64 == 0) or float64 loop */
static double fp_fma_ns(int isa, int f64, long iters, int samples, double *out) {
    double s = 0;
    for (int i = -1; i < samples; i++) {       /* i == -1: warm-up (and the wide units powered up) */
        int64_t t0 = fp_now_ns();
        fp_sink = f64 ? fp_fma_f64_fn(isa)(iters, 1.0) : (double)fp_fma_f32_fn(isa)(iters, 1.0f);
        if (i >= 0) out[i] = (double)(fp_now_ns() - t0) / iters;
    }
    return s + fp_sink;
}

enum { FP_W_F16 = 1, FP_W_BF16 = 2, FP_W_INT8 = 3 };
/* ns per widened vector multiply-add (kind FP_W_*) over the n stored values at w, `iters` passes per sample
 * after a warm-up sample; -1 in out[] where this copy has no widening loop (SSE2 and portable: not measured) */
static double fp_widen_ns(int isa, int kind, const void *w, long n, long iters, int samples, double *out) {
#if defined(FP_HAS_WIDEN)
    float (*f16)(const uint16_t *, long, long) = isa == FP_ISA_AVX512 ? fp_widen_h_avx512
        : isa == FP_ISA_AVX2 ? fp_widen_h_avx2 : NULL;
    float (*fbp)(const uint16_t *, long, long) = isa == FP_ISA_AVX512 ? fp_widen_bp_avx512
        : isa == FP_ISA_AVX2 ? fp_widen_bp_avx2 : NULL;
    float (*fq)(const int8_t *, long, long) = isa == FP_ISA_AVX512 ? fp_widen_q_avx512
        : isa == FP_ISA_AVX2 ? fp_widen_q_avx2 : NULL;
    const int lanes = fp_vector_bytes(isa) / 4;
    if (f16 != NULL) {
        for (int i = -1; i < samples; i++) {
            int64_t t0 = fp_now_ns();
            fp_sink = kind == FP_W_F16 ? f16((const uint16_t *)w, n, iters)
                    : kind == FP_W_BF16 ? fbp((const uint16_t *)w, n, iters) : fq((const int8_t *)w, n, iters);
            if (i >= 0) out[i] = (double)(fp_now_ns() - t0) / ((double)iters * (double)(n / lanes));
        }
        return fp_sink;
    }
#endif
    (void)kind; (void)w; (void)n; (void)iters;
    for (int i = 0; i < samples; i++) out[i] = -1;
    return 0;
}

/* ns per dependent add */
static uint64_t fp_add_chain_ns(long iters, int samples, double *out) {
    uint64_t s = fp_add_chain(iters, 1);
    for (int i = 0; i < samples; i++) {
        int64_t t0 = fp_now_ns();
        fp_sink = (double)fp_add_chain(iters, 1);
        out[i] = (double)(fp_now_ns() - t0) / ((double)iters * FP_ADDS_PER_ITER);
    }
    fp_sink = (double)s;
    return s;
}
