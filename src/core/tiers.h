/* tiers.h -- the tiers (tiers.c): a request sent to the small, large or huge path. */
#ifndef KEEL_TIERS_H
#define KEEL_TIERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"

/* ---- tiers (tiers.c) ------------------------------------------------------------------ */
/* Any request: align is a power of two (<= 16: no constraint); via_cache = false takes
 * small blocks straight from the central lists. Sets ENOMEM on failure. */
void* _keel_alloc_any(size_t n, size_t align, bool zero, bool via_cache) KEEL_INTERNAL;
void* _keel_alloc_direct(unsigned cls) KEEL_INTERNAL;
/* malloc's and calloc's own requests of 1 byte to KEEL_CLASS_MAX, once Keel is set up and
 * not in checked mode: _keel_alloc_any's small tier without its choice of tier. */
void* _keel_alloc_small(size_t n, bool zero) KEEL_INTERNAL;
enum { TIER_NONE, TIER_SMALL, TIER_LARGE, TIER_HUGE };
size_t _keel_usable_for(size_t n, size_t align, int* tier) KEEL_INTERNAL;
/* Usable size of a live block; reports misuse (naming `call`) for anything else. */
size_t _keel_usable_size(const void* p, const char* call) KEEL_INTERNAL;
/* realloc's and rallocx's resize of a large or huge block (kind: its page-map kind)
 * without a copy; NULL: the caller allocates, copies and frees. */
void* _keel_realloc_big(void* p, uint8_t kind, size_t n, bool zero) KEEL_INTERNAL;

#endif /* KEEL_TIERS_H */
