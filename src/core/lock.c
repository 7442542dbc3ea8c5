/* lock.c -- the contended path of keel_lock (lock.h). */
#include "core/internal.h"

void _keel_lock_slow(keel_lock_t* lock) {
  /* Spin a little: critical sections are short and the holder is likely running. */
  for (int i = 0; i < 100; i++) {
    keel_cpu_relax();
    uint32_t expected = 0;
    if (atomic_load_explicit(&lock->state, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_weak_explicit(&lock->state, &expected, 1, memory_order_acquire,
                                              memory_order_relaxed))
      return;
  }
  /* Then sleep: mark the lock contended so the holder wakes us on release. */
  while (atomic_exchange_explicit(&lock->state, 2, memory_order_acquire) != 0)
    _keel_prim_futex_wait((volatile uint32_t*)&lock->state, 2);
}
