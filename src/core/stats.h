/* stats.h -- statistics (stats.c). */
#ifndef KEEL_STATS_H
#define KEEL_STATS_H

#include "core/base.h"
#include "keel.h"

/* ---- statistics (stats.c) ------------------------------------------------------------- */
void _keel_stats_collect(keel_stats_t* out) KEEL_INTERNAL;
void _keel_stats_at_exit(void) KEEL_INTERNAL;

#endif /* KEEL_STATS_H */
