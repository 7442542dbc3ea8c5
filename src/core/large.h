/* large.h -- large blocks (spans of the page heap) and huge blocks (their own mappings,
 * huge.c). */
#ifndef KEEL_LARGE_H
#define KEEL_LARGE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/base.h"
#include "keel.h"

/* ---- large and huge blocks (huge.c and pageheap.c) ----------------------------------- */
void* _keel_large_alloc(size_t size, size_t align, bool zero) KEEL_INTERNAL;
void _keel_large_free(void* p, const char* call) KEEL_INTERNAL;
size_t _keel_large_usable(const void* p) KEEL_INTERNAL;
void* _keel_large_realloc(void* p, size_t size) KEEL_INTERNAL; /* NULL: caller copies */

void* _keel_huge_alloc(size_t size, size_t align, bool zero) KEEL_INTERNAL;
size_t _keel_huge_bytes(size_t size) KEEL_INTERNAL; /* mapping size for a request (0: too big) */
bool _keel_huge_free(void* p) KEEL_INTERNAL;               /* false: not a live huge block */
size_t _keel_huge_usable(const void* p) KEEL_INTERNAL;      /* 0: not a live huge block */
/* NULL: the caller falls back. zero: the part it grows by reads as zero. */
void* _keel_huge_realloc(void* p, size_t size, bool zero) KEEL_INTERNAL;
size_t _keel_huge_purge(bool all) KEEL_INTERNAL;
bool _keel_huge_cache_pending(void) KEEL_INTERNAL; /* the cache holds freed mappings */
/* A block in a mapping its caller made and keeps (the checked mode's guarded blocks):
 * it is found, sized and counted like a huge block of `size` bytes, but huge.c never
 * unmaps, caches or remaps it. Adopt: false if out of memory. Disown: the page map says
 * FREED afterwards; returns the size, 0 if p was not adopted (or already disowned). */
bool _keel_huge_adopt(void* p, size_t size) KEEL_INTERNAL;
size_t _keel_huge_disown(void* p) KEEL_INTERNAL;
void _keel_huge_lock_all(void) KEEL_INTERNAL;
void _keel_huge_unlock_all(void) KEEL_INTERNAL;
void _keel_huge_reset_locks(void) KEEL_INTERNAL;
void _keel_huge_stats(keel_stats_t* out) KEEL_INTERNAL;
/* Huge blocks live now (each a mapping of its own: glibc's mallinfo2 hblks). */
uint64_t _keel_huge_live_blocks(void) KEEL_INTERNAL;

#endif /* KEEL_LARGE_H */
