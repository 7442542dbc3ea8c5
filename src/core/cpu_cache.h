/* cpu_cache.h -- the processors' caches (cpu_cache.c): single free blocks of the classes
 * that skip the thread caches, kept per processor and handed on without an atomic
 * instruction. */
#ifndef KEEL_CPU_CACHE_H
#define KEEL_CPU_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/base.h"

/* A free block of cls from the calling processor's cache (its free key still set), or
 * NULL: the cache is empty, or the processor has none (it is made here) or cannot. */
void* _keel_cpu_cache_get(unsigned cls) KEEL_INTERNAL;
/* Keeps block (freed: its free key set) in the calling processor's cache; false if that
 * is full or there is none. */
bool _keel_cpu_cache_put(unsigned cls, void* block) KEEL_INTERNAL;
/* Every cache gives its blocks back to the slabs (keel_purge, a fork, the invariant walk); the purger's tick
 * does so once every `period` ticks. */
void _keel_cpu_cache_drain(void) KEEL_INTERNAL;
void _keel_cpu_cache_tick(uint32_t now, uint32_t period) KEEL_INTERNAL;
void _keel_cpu_cache_after_fork_child(void) KEEL_INTERNAL;
/* Blocks of cls in all caches (racy: statistics). */
uint32_t _keel_cpu_cache_blocks(unsigned cls) KEEL_INTERNAL;

#endif /* KEEL_CPU_CACHE_H */
