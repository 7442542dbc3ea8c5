/* lock.h -- Keel's mutex: a word with three states, futex-backed.
 * Uncontended lock/unlock is one atomic exchange each. Waiters spin briefly (the holder
 * is usually on another core and about to release), then sleep in the kernel, so that
 * 64 threads on 2 cores do not burn the holder's time slice. Never allocates.
 * Each lock counts its acquisitions, the acquisitions that found it held, and the waits
 * in the kernel (keel_stats_locks): the holder writes them, so counting costs a plain
 * increment of a line it already owns. */
#ifndef KEEL_LOCK_H
#define KEEL_LOCK_H

#include <stdatomic.h>
#include <stdint.h>

#include "platform/prim.h"

typedef struct keel_lock_s {
  _Atomic uint32_t state; /* 0 free, 1 held, 2 held with sleepers */
  uint32_t sleeps;        /* futex waits before acquiring (holder-written) */
  uint64_t acquired;      /* acquisitions (holder-written) */
  uint64_t contended;     /* acquisitions that found the lock held */
} keel_lock_t;

#define KEEL_LOCK_INIT {0, 0, 0, 0}

void _keel_lock_slow(keel_lock_t* lock);
struct keel_lock_stats_s;
/* Adds the lock's counters to *sum (taking the lock to read them). */
void _keel_lock_read(keel_lock_t* lock, struct keel_lock_stats_s* sum);

/* A hint to the CPU that we are spinning (saves power, yields to the sibling thread). */
static inline void keel_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline void keel_lock(keel_lock_t* lock) {
  uint32_t expected = 0;
  if (__builtin_expect(atomic_compare_exchange_strong_explicit(&lock->state, &expected, 1,
                                                               memory_order_acquire,
                                                               memory_order_relaxed), 1)) {
    lock->acquired++;
    return;
  }
  _keel_lock_slow(lock);
}

/* Takes the lock only if it is free now: for work that is worth doing only when it
 * costs no waiting (and is not counted as contention when it does not happen). */
static inline bool keel_trylock(keel_lock_t* lock) {
  uint32_t expected = 0;
  if (!atomic_compare_exchange_strong_explicit(&lock->state, &expected, 1, memory_order_acquire,
                                               memory_order_relaxed))
    return false;
  lock->acquired++;
  return true;
}

static inline void keel_unlock(keel_lock_t* lock) {
  if (__builtin_expect(atomic_exchange_explicit(&lock->state, 0, memory_order_release) == 2, 0))
    _keel_prim_futex_wake((volatile uint32_t*)&lock->state, 1);
}

/* After fork, in the child: the lock is free whatever state the parent left it in. */
static inline void keel_lock_reset(keel_lock_t* lock) {
  atomic_store_explicit(&lock->state, 0, memory_order_relaxed);
}

#endif
