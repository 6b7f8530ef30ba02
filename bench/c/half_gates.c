/* What 16-bit weights would buy the LSTM(48->256) step (issue 12's ">= 5x onnxruntime" target, blocked in
 * float32 by the memory floor): the gate products g = W^T [x; h] (304 inputs -> 4 gates x 256 = 1024
 * outputs, 311 296 weights, 1.19 MiB in float32, the bulk of the step's 1.39 MB), timed at C level with
 * the kernel's axpy panel layout (mlp_core.h: 256-byte panels of outputs, n_in rows each, read in order),
 * in four weight formats:
 *   f32        the kernel's format: one FMA per 16 weights
 *   f16        IEEE half weights (0.6 MiB: fits the 1 MiB L2), vcvtph2ps to float32, then the same FMA
 *   bf16       bfloat16 weights, widened to float32 by a shift (exactly representable), then the FMA
 *   bf16-dp    bfloat16 weights AND inputs, vdpbf16ps (AVX512_BF16): one instruction per 32 weights;
 *              the inputs are rounded too
 * Each row reports the p50 / p99 of 2001 single steps (weights warm, as in the loop) and the largest error
 * of the 1024 gate pre-activations against a float64 product of the float32 weights.
 *   gcc -O3 -o /tmp/half_gates bench/c/half_gates.c -lm
 *   flock /tmp/control-node-bench.lock taskset -c 1 /tmp/half_gates
 * Needs AVX-512 F/BW/VL and AVX512_BF16 (Zen 4 / Zen 5, Sapphire Rapids and later). */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NIN 304           /* 48 observations + 256 of h */
#define NOUT 1024         /* 4 gates x 256 */
#define PW 64             /* float32 outputs per 256-byte panel */
#define NP (NOUT / PW)
#define REPS 2001
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma"), noinline))

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* W32[p][i][0..63]: panel p, input i (the kernel's axpy layout) */
TGT static void gates_f32(const float *W, const float *x, float *g) {
    for (int p = 0; p < NP; p++) {
        const float *w = W + (size_t)p * NIN * PW;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < NIN; i++, w += PW) {
            __m512 xi = _mm512_set1_ps(x[i]);
            a0 = _mm512_fmadd_ps(xi, _mm512_load_ps(w), a0);
            a1 = _mm512_fmadd_ps(xi, _mm512_load_ps(w + 16), a1);
            a2 = _mm512_fmadd_ps(xi, _mm512_load_ps(w + 32), a2);
            a3 = _mm512_fmadd_ps(xi, _mm512_load_ps(w + 48), a3);
        }
        _mm512_store_ps(g + p * PW, a0); _mm512_store_ps(g + p * PW + 16, a1);
        _mm512_store_ps(g + p * PW + 32, a2); _mm512_store_ps(g + p * PW + 48, a3);
    }
}

/* W16[p][i][0..63] as IEEE half */
TGT static void gates_f16(const unsigned short *W, const float *x, float *g) {
    for (int p = 0; p < NP; p++) {
        const unsigned short *w = W + (size_t)p * NIN * PW;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < NIN; i++, w += PW) {
            __m512 xi = _mm512_set1_ps(x[i]);
            a0 = _mm512_fmadd_ps(xi, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)w)), a0);
            a1 = _mm512_fmadd_ps(xi, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(w + 16))), a1);
            a2 = _mm512_fmadd_ps(xi, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(w + 32))), a2);
            a3 = _mm512_fmadd_ps(xi, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(w + 48))), a3);
        }
        _mm512_store_ps(g + p * PW, a0); _mm512_store_ps(g + p * PW + 16, a1);
        _mm512_store_ps(g + p * PW + 32, a2); _mm512_store_ps(g + p * PW + 48, a3);
    }
}

/* bfloat16, stored so that one 64-byte load widens to two float32 vectors by a shift and a mask:
 * 32-bit word k of a row holds output k in its high half and output k + 16 in its low half. */
TGT static void gates_bf16(const unsigned short *W, const float *x, float *g) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (int p = 0; p < NP; p++) {
        const unsigned short *w = W + (size_t)p * NIN * PW;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < NIN; i++, w += PW) {
            __m512 xi = _mm512_set1_ps(x[i]);
            __m512i v0 = _mm512_load_si512((const void *)w), v1 = _mm512_load_si512((const void *)(w + 32));
            a0 = _mm512_fmadd_ps(xi, _mm512_castsi512_ps(_mm512_and_si512(v0, hi)), a0);
            a1 = _mm512_fmadd_ps(xi, _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)), a1);
            a2 = _mm512_fmadd_ps(xi, _mm512_castsi512_ps(_mm512_and_si512(v1, hi)), a2);
            a3 = _mm512_fmadd_ps(xi, _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16)), a3);
        }
        _mm512_store_ps(g + p * PW, a0); _mm512_store_ps(g + p * PW + 16, a1);
        _mm512_store_ps(g + p * PW + 32, a2); _mm512_store_ps(g + p * PW + 48, a3);
    }
}

/* vdpbf16ps: lane k of a row pair holds (W[2j][k], W[2j+1][k]); inputs as bf16 pairs (x[2j], x[2j+1]) */
TGT static void gates_bf16dp(const unsigned short *W, const unsigned *xp, float *g) {
    for (int p = 0; p < NP; p++) {
        const unsigned short *w = W + (size_t)p * NIN * PW;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int j = 0; j < NIN / 2; j++, w += 2 * PW) {
            __m512bh xj = (__m512bh)_mm512_set1_epi32((int)xp[j]);
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_load_si512((const void *)w), xj);
            a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_load_si512((const void *)(w + 32)), xj);
            a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_load_si512((const void *)(w + 64)), xj);
            a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_load_si512((const void *)(w + 96)), xj);
        }
        _mm512_store_ps(g + p * PW, a0); _mm512_store_ps(g + p * PW + 16, a1);
        _mm512_store_ps(g + p * PW + 32, a2); _mm512_store_ps(g + p * PW + 48, a3);
    }
}

static unsigned short to_bf16(float f) {           /* round to nearest even */
    unsigned u;
    memcpy(&u, &f, 4);
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

TGT static unsigned short to_f16(float f) {
    return (unsigned short)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

static double urand(void) { return rand() / (double)RAND_MAX * 2 - 1; }

static void report(const char *name, double *t, const float *g, const double *ref, size_t bytes) {
    qsort(t, REPS, sizeof *t, cmp);
    double err = 0, scale = 0;
    for (int k = 0; k < NOUT; k++) {
        err = fmax(err, fabs(g[k] - ref[k]));
        scale = fmax(scale, fabs(ref[k]));
    }
    printf("%-8s %8.1f KiB  p50 %6.2f us  p99 %6.2f us  max |err| %.2e (%.1e of max |g|)\n", name,
           bytes / 1024.0, t[REPS / 2] / 1e3, t[REPS * 99 / 100] / 1e3, err, err / scale);
}

int main(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
        fprintf(stderr, "half_gates: needs AVX-512 and AVX512_BF16\n");
        return 2;
    }
    srand(1);
    const double r = 1 / sqrt(256.0);                  /* torch's LSTM init: U(-1/sqrt(H), 1/sqrt(H)) */
    static float Wm[NIN][NOUT];                         /* the weights, input-major */
    for (int i = 0; i < NIN; i++)
        for (int k = 0; k < NOUT; k++) Wm[i][k] = (float)(r * urand());
    static float x[NIN];
    for (int i = 0; i < NIN; i++) x[i] = (float)(i < 48 ? 2 * urand() : urand());   /* obs, then h in (-1, 1) */
    static double ref[NOUT];
    for (int k = 0; k < NOUT; k++) {
        double s = 0;
        for (int i = 0; i < NIN; i++) s += (double)Wm[i][k] * x[i];
        ref[k] = s;
    }
    float *W32 = aligned_alloc(64, sizeof(float) * NIN * NOUT);
    unsigned short *W16 = aligned_alloc(64, 2 * NIN * NOUT), *Wb = aligned_alloc(64, 2 * NIN * NOUT);
    unsigned short *Wd = aligned_alloc(64, 2 * NIN * NOUT);
    for (int p = 0; p < NP; p++)
        for (int i = 0; i < NIN; i++)
            for (int c = 0; c < PW; c++) {
                size_t o = ((size_t)p * NIN + i) * PW;
                float w = Wm[i][p * PW + c];
                W32[o + c] = w;
                W16[o + c] = to_f16(w);
                /* bf16 word order: (c % 32) < 16 -> high half of word c % 16, else low half */
                int half = c / 32, q = c % 32, word = q % 16;
                Wb[o + half * 32 + 2 * word + (q < 16 ? 1 : 0)] = to_bf16(w);
                size_t od = ((size_t)p * NIN + (i & ~1)) * PW;          /* row pairs interleaved */
                Wd[od + 2 * c + (i & 1)] = to_bf16(w);
            }
    static unsigned xp[NIN / 2];
    for (int j = 0; j < NIN / 2; j++) xp[j] = to_bf16(x[2 * j]) | ((unsigned)to_bf16(x[2 * j + 1]) << 16);
    float *g = aligned_alloc(64, sizeof(float) * NOUT);
    static double t[REPS];
    printf("gates of LSTM(48->256): %d x %d weights, single steps, p50 / p99 of %d\n", NIN, NOUT, REPS);
    for (int round = 0; round < 2; round++) {           /* the second round is reported: caches and clocks warm */
        for (int v = 0; v < 4; v++) {
            for (int k = 0; k < 50; k++) {               /* warm the weights */
                if (v == 0) gates_f32(W32, x, g);
                else if (v == 1) gates_f16(W16, x, g);
                else if (v == 2) gates_bf16(Wb, x, g);
                else gates_bf16dp(Wd, xp, g);
            }
            for (int k = 0; k < REPS; k++) {
                double t0 = now_ns();
                if (v == 0) gates_f32(W32, x, g);
                else if (v == 1) gates_f16(W16, x, g);
                else if (v == 2) gates_bf16(Wb, x, g);
                else gates_bf16dp(Wd, xp, g);
                t[k] = now_ns() - t0;
            }
            if (round == 1) {
                const char *names[] = {"f32", "f16", "bf16", "bf16-dp"};
                report(names[v], t, g, ref, (v == 0 ? 4 : 2) * (size_t)NIN * NOUT);
            }
        }
    }
    return 0;
}
