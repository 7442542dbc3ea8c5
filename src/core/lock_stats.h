/* lock_stats.h -- the process-wide locks, each owned by its module, whose counters
 * stats.c reads. */
#ifndef KEEL_LOCK_STATS_H
#define KEEL_LOCK_STATS_H

#include "core/base.h"
#include "core/lock.h"

/* ---- lock statistics (stats.c reads them; each module owns its lock) ---------------- */
extern keel_lock_t* const _keel_lock_pageheap KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_huge KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_threads KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_meta KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_pagemap KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_profile KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_quarantine KEEL_INTERNAL;

#endif /* KEEL_LOCK_STATS_H */
