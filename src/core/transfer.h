/* transfer.h -- the transfer caches (transfer.c): whole batches parked without a lock. */
#ifndef KEEL_TRANSFER_H
#define KEEL_TRANSFER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/base.h"

/* ---- transfer caches (transfer.c) -----------------------------------------------------
 * Whole batches of free blocks parked between the thread caches and the slabs, without a
 * lock: per class, slots on up to KEEL_TRANSFER_LINES cache lines, a thread starting on
 * the line of its processor. A put takes an empty slot with one compare-and-swap, a get
 * empties one with one exchange. */
#define KEEL_TRANSFER_LINES 16
#define KEEL_TRANSFER_SLOTS 8 /* the largest transfer_max (size_class.c) */
/* A second thread cache exists, or a second thread beside one: count the processors, use
 * every line from now on. */
void _keel_transfer_spread(void) KEEL_INTERNAL;
/* The process's first thread cache is made (the registry lock held), on the caller. */
void _keel_transfer_first_cache(void) KEEL_INTERNAL;
unsigned _keel_transfer_lines(void) KEEL_INTERNAL; /* lines in use now */
unsigned _keel_transfer_home(void) KEEL_INTERNAL;  /* the calling thread's line now */
/* Apart: the process has spread, has no more thread caches in use than processors (each
 * thread likely runs alone on its own) and another thread's cache beside the caller's
 * (or the caller is a young thread beside a cache).
 * A thread then takes blocks from its processor's slabs (central.c) and leaves alone the
 * slab another line's thread takes from and the batches of another line's slabs, whose
 * blocks share cache lines with blocks that thread uses. One busy thread alone takes
 * from one list: split by processor, its blocks would spread over a slab per processor
 * it was moved to. */
bool _keel_transfer_apart(void) KEEL_INTERNAL;
/* Apart with KEEL_OWN_LINES: a thread parks batches on its own line only, the rest going
 * to its slabs, a take adopts no slab of a line whose thread still works (central.c), and
 * a line's slabs come from a chunk it holds (pageheap.c), so that no block and no line of
 * blocks passes between two busy processors. */
bool _keel_transfer_own_lines(void) KEEL_INTERNAL;
/* Many processors: the process has spread over 8 lines or more (five processors or more,
 * or KEEL_CPUS). Every line then has a core behind it, and a block that goes from one
 * core to another is a cache miss each time: batches stay on their thread's line and
 * slabs on their line's list (central.c). On fewer, the lines of idle processors are
 * room for bursts, and every slab is on one list unless threads are apart. */
#define KEEL_MANY_CORES_LINES 8
extern bool _keel_many_cores KEEL_INTERNAL;
static inline bool keel_many_cores(void) { return __atomic_load_n(&_keel_many_cores, __ATOMIC_RELAXED); }
/* Parks a list of a whole batch of class cls (half: half a batch); false if the lines the
 * thread may use are full. The class is active (central.c). */
bool _keel_transfer_put(unsigned cls, void* list, bool half) KEEL_INTERNAL;
/* The empty slot a put would take now, or NULL (a hint: another thread may fill it), and
 * a put that tries that slot first. */
void** _keel_transfer_room(unsigned cls) KEEL_INTERNAL;
bool _keel_transfer_put_at(void** slot, unsigned cls, void* list, bool half, bool indexed) KEEL_INTERNAL;
/* A parked list of cls, its length (a batch or half of one) and whether it carries its
 * index (freelist.h), or NULL. */
void* _keel_transfer_get(unsigned cls, uint32_t* n, bool* indexed) KEEL_INTERNAL;
bool _keel_transfer_any(unsigned cls) KEEL_INTERNAL; /* a hint: something is parked */
/* No put or get on line `line` of cls for a whole purger tick: no thread works there. */
bool _keel_transfer_line_idle(unsigned cls, unsigned line) KEEL_INTERNAL;
/* A parked list from a line no put or get has used for idle_ticks (0: any), or NULL. */
void* _keel_transfer_take_idle(unsigned cls, uint32_t now, uint32_t idle_ticks, uint32_t* n) KEEL_INTERNAL;
uint32_t _keel_transfer_blocks(unsigned cls) KEEL_INTERNAL; /* parked blocks (racy: statistics) */
/* Calls fn on every parked list of cls (the invariant walk, tests), the class's lock
 * held. Each is taken out of its slot while fn reads it, so no other thread takes it and
 * overwrites its links meanwhile, then parked again, or put back to its slabs where the
 * class's slots have filled up. */
void _keel_transfer_each(unsigned cls, void (*fn)(void* list, uint32_t n, void* ctx), void* ctx) KEEL_INTERNAL;

#endif /* KEEL_TRANSFER_H */
