/* lock.c -- the contended path of keel_lock (lock.h), and reading a lock's counters. */
#include "core/internal.h"

static void count(keel_lock_t* lock, uint32_t slept) {
  lock->acquired++;
  lock->contended++;
  lock->sleeps += slept;
}

void _keel_lock_slow(keel_lock_t* lock) {
  /* Spin a little: critical sections are short and the holder is likely running. */
  for (int i = 0; i < 100; i++) {
    keel_cpu_relax();
    uint32_t expected = 0;
    if (atomic_load_explicit(&lock->state, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_weak_explicit(&lock->state, &expected, 1, memory_order_acquire,
                                              memory_order_relaxed)) {
      count(lock, 0);
      return;
    }
  }
  /* Then sleep: mark the lock contended so the holder wakes us on release. */
  uint32_t slept = 0;
  while (atomic_exchange_explicit(&lock->state, 2, memory_order_acquire) != 0) {
    _keel_prim_futex_wait((volatile uint32_t*)&lock->state, 2);
    slept++;
  }
  count(lock, slept);
}

/* Without taking the lock: the counters only grow, a snapshot a moment old is fine, and
 * aligned 64-bit loads do not tear. Taking each lock would write to it, and statistics
 * read all 120 central locks: 32 KiB of memory no allocation had touched became
 * resident in every process once the purger published its first snapshot. */
__attribute__((no_sanitize("thread"))) void _keel_lock_read(keel_lock_t* lock, keel_lock_stats_t* sum) {
  sum->acquired += __atomic_load_n(&lock->acquired, __ATOMIC_RELAXED);
  sum->contended += __atomic_load_n(&lock->contended, __ATOMIC_RELAXED);
  sum->sleeps += __atomic_load_n(&lock->sleeps, __ATOMIC_RELAXED);
}
