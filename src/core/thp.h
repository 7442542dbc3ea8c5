/* thp.h -- the calls between the page heap (pageheap.c) and its huge-page policy (thp.c).
 * The page heap owns the chunks, their lists and dirty-unit counts; the policy decides
 * what a purge may take and collapses huge pages. Private to those two files (the rest
 * of the core uses pageheap.h's _keel_thp_*); the page heap lock is held unless said. */
#ifndef KEEL_THP_H
#define KEEL_THP_H

#include "core/internal.h"

#define ALL_UNITS (~(uint64_t)0)
#define UNIT_BITS(k, n) (((n) >= 64 ? ALL_UNITS : (((uint64_t)1 << (n)) - 1)) << (k))

/* pageheap.c */
keel_chunk_t* _keel_pageheap_first_chunk(unsigned run) KEEL_INTERNAL; /* list by longest free run */
size_t _keel_pageheap_purge_units(keel_chunk_t* c, unsigned k, unsigned n) KEEL_INTERNAL;
bool _keel_pageheap_release_if_free(keel_chunk_t* c, uint64_t due, bool all, size_t* released) KEEL_INTERNAL;
void _keel_pageheap_make_dirty(keel_chunk_t* c, uint64_t bits) KEEL_INTERNAL;

/* thp.c */
extern keel_chunk_t* _keel_thp_promoting KEEL_INTERNAL; /* being collapsed: not released */
size_t _keel_thp_purge_whole_huge_pages(keel_chunk_t* c, uint64_t due, size_t granule, bool all) KEEL_INTERNAL;
size_t _keel_thp_purge_promoted(keel_chunk_t* c, uint64_t due, bool all, bool* gone) KEEL_INTERNAL;
void _keel_thp_chunk_released(keel_chunk_t* c) KEEL_INTERNAL;

#endif
