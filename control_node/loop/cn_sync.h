/* Hand-over between the control thread and the loop thread, without locks.
 *
 * The control thread writes a request's fields, then publishes its sequence number with a release
 * store; the loop reads the number with an acquire load and only then the fields (and the policy slot
 * the request names). The loop publishes its transition records the same way. Plain loads and stores
 * would do on x86 (TSO) but not under the compiler's reordering, nor on other CPUs.
 */
#ifndef CN_SYNC_H
#define CN_SYNC_H
#include <stdint.h>

static inline int64_t cn_load_acquire(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void cn_store_release(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

#endif
