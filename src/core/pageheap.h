/* pageheap.h -- the page heap (pageheap.c): spans of units, purging; the huge-page policy
 * (thp.c) as the rest of the core sees it. */
#ifndef KEEL_PAGEHEAP_H
#define KEEL_PAGEHEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "core/chunk.h"
#include "keel.h"

/* pageheap.c: spans of units, purging. Callers hold no central lock order violation:
 * lock order is central -> pageheap -> meta. */
keel_slab_t* _keel_pageheap_alloc(size_t units, size_t align_units, bool* zeroed) KEEL_INTERNAL;
/* The same for a slab of `line` with KEEL_OWN_LINES (transfer.h): from the chunk that
 * line holds, else from one no working line holds, which it then holds. */
keel_slab_t* _keel_pageheap_alloc_for_line(size_t units, unsigned line, bool* zeroed) KEEL_INTERNAL;
void _keel_pageheap_free(keel_slab_t* head) KEEL_INTERNAL;
bool _keel_pageheap_grow_in_place(keel_slab_t* head, size_t units) KEEL_INTERNAL;
void _keel_pageheap_shrink(keel_slab_t* head, size_t units) KEEL_INTERNAL;
size_t _keel_pageheap_purge(bool all) KEEL_INTERNAL; /* returns bytes released */
void _keel_pageheap_maybe_purge(void) KEEL_INTERNAL; /* purge what the delay allows */
void _keel_pageheap_lock_all(void) KEEL_INTERNAL;
void _keel_pageheap_unlock_all(void) KEEL_INTERNAL;
void _keel_pageheap_reset_locks(void) KEEL_INTERNAL;
void _keel_pageheap_stats(keel_stats_t* out) KEEL_INTERNAL;
/* KEEL_THP changed at run time: call after storing the new _keel_options.thp; advises
 * every chunk and huge block (live or cached) as the policy now says, under the page
 * heap lock, then the huge lock (not nested). SYSTEM cannot undo earlier advice. */
void _keel_thp_apply_all(void) KEEL_INTERNAL;
int _keel_thp_advice(void) KEEL_INTERNAL;           /* policy as madvise advice: +1, -1, 0 */
size_t _keel_thp_size(void) KEEL_INTERNAL;          /* huge page size in use (power of two) */
size_t _keel_thp_purge_granule(void) KEEL_INTERNAL; /* smallest purge (0: any; always: a huge page) */
/* KEEL_THP=dense: collapses a few huge pages that are in use and resident into real huge
 * pages (purger thread only). _promoted: whether any of the `units` units from p (in one
 * chunk) lies in one; their pages must not be purged apart. */
void _keel_pageheap_promote(void) KEEL_INTERNAL;
bool _keel_pageheap_promoted(const void* p, size_t units) KEEL_INTERNAL;
/* Makes the collapsed huge pages over those units ordinary base pages again: a slab in
 * one that has become sparse is trimmed like any other (slab_trim.c). */
void _keel_pageheap_demote(const void* p, size_t units) KEEL_INTERNAL;
typedef struct keel_thp_counts_s {
  uint64_t promoted;  /* huge pages collapsed and still whole */
  uint64_t collapses; /* collapses done */
  uint64_t refused;   /* collapses the OS refused */
  uint64_t released;  /* collapsed huge pages given back whole */
  uint64_t demoted;   /* collapsed huge pages that became sparse and went back to base pages */
} keel_thp_counts_t;
void _keel_thp_counts(keel_thp_counts_t* out) KEEL_INTERNAL;
void _keel_huge_thp_apply_all(void) KEEL_INTERNAL;  /* huge.c: advise huge blocks, live and cached */

#endif /* KEEL_PAGEHEAP_H */
