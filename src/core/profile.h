/* profile.h -- heap profiling (profile.c): sampling, and dumping profiles. */
#ifndef KEEL_PROFILE_H
#define KEEL_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "core/tcache.h"

/* ---- heap profiling (profile.c) --------------------------------------------------------
 * KEEL_PROFILE_RATE=N samples about one allocation per N bytes. A sampled small block
 * comes from a sampled slab (page-map tag KEEL_KIND_SAMPLED), so only its free leaves
 * the fast path; large and huge blocks are sampled on their own (slow) paths. */
extern bool _keel_profiling KEEL_INTERNAL;
void _keel_profile_init(void) KEEL_INTERNAL;
/* A bin's countdown stage ran out on popping p for a request of n bytes: starts the next
 * stage, or, when the countdown is spent, serves the request with a sampled block and
 * returns that instead. */
void* _keel_profile_countdown_expired(keel_tcache_t* t, unsigned cls, void* p, size_t n) KEEL_INTERNAL;
/* The same for the malloc fast path, which names the bin by its head (head: the
 * address of t->head[cls]), already in a register: the call then costs the fast path
 * no register copy. t is the cache malloc used, whose busy flag this clears. */
void* _keel_profile_countdown_expired_at(size_t n, void* p, const uintptr_t* head, keel_tcache_t* t) KEEL_INTERNAL;
void _keel_profile_sample_big(void* p, size_t n) KEEL_INTERNAL; /* large/huge, if due */
void _keel_profile_forget(void* p) KEEL_INTERNAL;   /* a sampled block is freed */
uint32_t _keel_profile_first_countdown(unsigned cls) KEEL_INTERNAL;
/* Writes the profile (pprof legacy heap format) to path; returns false on error. */
bool _keel_profile_dump_to(const char* path) KEEL_INTERNAL;
/* Where a profile named tag goes: KEEL_PROFILE_PREFIX.<pid>.<tag>.heap, cut to cap bytes. */
void _keel_profile_path(char* path, size_t cap, const char* tag) KEEL_INTERNAL;
void _keel_profile_tick(void) KEEL_INTERNAL;   /* purger: growth-triggered dumps */
void _keel_profile_at_exit(void) KEEL_INTERNAL;

#endif /* KEEL_PROFILE_H */
