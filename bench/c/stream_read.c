/* Read rate of this core by working-set size: the cost of reading N bytes once, in order, with 64-byte
 * vectors and 8 independent accumulators, optionally with a software prefetch PF bytes ahead.
 * Medians of 201 repetitions. Used for the recurrent-policy floor in docs/benchmarks.md:
 *   gcc -O3 -o /tmp/stream_read bench/c/stream_read.c
 *   flock /tmp/control-node-bench.lock taskset -c 1 /tmp/stream_read
 * Needs AVX-512 (x86-64-v4); `control-node bench policy/recurrent` carry the same loop for every ISA. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef float v16 __attribute__((vector_size(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("arch=x86-64-v4"), noinline)) static float read_once(const float *p, size_t n, int pf) {
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (size_t i = 0; i + 128 <= n; i += 128) {
        const v16 *v = (const v16 *)(p + i);
        if (pf)
            for (int o = 0; o < 512; o += 64) __builtin_prefetch((const char *)v + pf + o, 0, 3);
        a0 += v[0]; a1 += v[1]; a2 += v[2]; a3 += v[3]; a4 += v[4]; a5 += v[5]; a6 += v[6]; a7 += v[7];
    }
    v16 t = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    float s = 0;
    for (int k = 0; k < 16; k++) s += t[k];
    return s;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    const size_t sizes[] = {64 << 10, 256 << 10, 512 << 10, 900 << 10, 1391152, 2 << 20, 4 << 20, 16 << 20};
    for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) {
        size_t n = sizes[b] / 4 / 128 * 128;
        float *p = aligned_alloc(64, n * 4);
        for (size_t i = 0; i < n; i++) p[i] = 1e-3f;
        for (int pf = 0; pf <= 2048; pf += 1024) {
            double t[201];
            volatile float sink;
            int reps = sizes[b] < (1 << 20) ? 20 : 5;
            for (int r = 0; r < 201; r++) {
                double t0 = now();
                for (int k = 0; k < reps; k++) sink = read_once(p, n, pf);
                t[r] = (now() - t0) / reps;
            }
            (void)sink;
            qsort(t, 201, sizeof *t, cmp);
            printf("%8zu B prefetch %4d: p50 %7.2f us  %6.1f GB/s\n", n * 4, pf, t[100] * 1e6, n * 4 / t[100] / 1e9);
        }
        free(p);
    }
    return 0;
}
