/* Streaming log-linear histogram for int64 nanosecond values (HdrHistogram-style):
 * exact below 128, then 128 sub-buckets per power of two (<= 0.8% relative error).
 * Fixed size, so recording never allocates. */
#ifndef CONTROL_NODE_RT_HIST_H
#define CONTROL_NODE_RT_HIST_H
#include <stdint.h>

#define CN_HIST_SUB_BITS 7
#define CN_HIST_BUCKETS ((64 - CN_HIST_SUB_BITS) << CN_HIST_SUB_BITS)

static inline int cn_hist_index(int64_t v) {
    if (v < 0) v = 0;
    if (v < (1 << CN_HIST_SUB_BITS)) return (int)v;
    const int e = 63 - __builtin_clzll((uint64_t)v);            /* >= 7 */
    const int mant = (int)((v >> (e - CN_HIST_SUB_BITS)) & ((1 << CN_HIST_SUB_BITS) - 1));
    return ((e - CN_HIST_SUB_BITS + 1) << CN_HIST_SUB_BITS) + mant;
}

static inline void cn_hist_record(int64_t *counts, int64_t v) { counts[cn_hist_index(v)]++; }
#endif
