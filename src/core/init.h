/* init.h -- the process life cycle (init.c): set-up on first use, the forked child's
 * purger. */
#ifndef KEEL_INIT_H
#define KEEL_INIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"

/* ---- process life cycle (init.c) ------------------------------------------------------ */
extern bool _keel_ready KEEL_INTERNAL; /* process state set up (page size, classes, options) */
void _keel_init(void) KEEL_INTERNAL;   /* idempotent; cheap after the first call */
/* Set in a forked child whose purger waits for the child's heap to grow (init.c). The
 * allocation slow path, which runs with no Keel lock held, then asks whether it has. */
extern bool _keel_purger_deferred KEEL_INTERNAL;
void _keel_purger_deferred_check(void) KEEL_INTERNAL KEEL_NOINLINE; /* every forked child runs it */
/* The purger thread runs: memory kept for reuse is returned on its timer. */
bool _keel_purger_running(void) KEEL_INTERNAL;
uint64_t _keel_delay_ticks(void) KEEL_INTERNAL; /* the purge delay in purger ticks, rounded up */
void _keel_purge_soon(void) KEEL_INTERNAL;      /* the purger returns all free memory now */
static inline void keel_ensure_init(void) {
  if (KEEL_UNLIKELY(!__atomic_load_n(&_keel_ready, __ATOMIC_ACQUIRE))) _keel_init();
}
extern size_t _keel_page_size KEEL_INTERNAL;

#endif /* KEEL_INIT_H */
