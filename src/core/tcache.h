/* tcache.h -- the thread caches (tcache.c): bins, their room and sampling countdown, and
 * the calling thread's cache. */
#ifndef KEEL_TCACHE_H
#define KEEL_TCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "core/geometry.h"
#include "keel.h"

/* ---- thread caches (tcache.c) --------------------------------------------------------
 * A bin is a singly linked list of free blocks threaded through their first word.
 * `avail` is how many more blocks the bin may take before it must give some back:
 * count = max - avail. Fast paths touch only `head`, `avail` and, on malloc, the
 * sampling countdown (which, with profiling off, only reaches zero every 2^32 pops).
 * Heads and the rest are two arrays of 8-byte elements indexed by class, so that one
 * address computation serves both and free() goes from the page-map byte to its bin with
 * no arithmetic.
 * `avail` is signed so that free() can take room and test in one step (decrement, branch
 * if negative); the slow path puts it back to 0. The shared empty cache of young threads
 * is written that way too, by any young thread, always to a small negative number or back
 * to 0, so it never has room: a harmless race on a line only slow paths follow. */
typedef union keel_bin_u {
  struct {
    int16_t avail;
    int16_t countdown;     /* pops left, less one, in this stage of the heap profiler's
                              countdown: 0..0x7FFF, the stage ends when it goes negative */
    uint16_t max;
    uint16_t countdown_hi; /* further stages of 2^15 pops (profile.c) */
  };
  /* avail in the low half, countdown in the high half: malloc updates both with one
   * subtraction of 0xFFFF (avail + 1, countdown - 1) and branches on the sign. */
  int32_t avail_countdown;
} keel_bin_t;
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "keel_bin_t packs avail below countdown");

typedef struct keel_tcache_s {
  uintptr_t head[KEEL_NUM_CLASSES]; /* first free block or KEEL_LINK_END (freelist.h); [0] always empty */
  keel_bin_t bin[KEEL_NUM_CLASSES];
  struct keel_tcache_s* next;        /* registry of live caches */
  struct keel_tcache_s* prev;
  size_t max_bytes;                  /* sum over bins of max * block size */
  uint64_t refills;                  /* slow-path statistics, owner-written */
  uint64_t flushes;
  union {
    uint64_t spare_since;            /* a spare: purger tick its thread exited, if it kept its blocks */
    uint64_t active_tick;            /* in use: purger tick of its thread's last slow-path call */
  };
  struct keel_thread_s* owner;       /* its thread's _keel_thread, while in the registry */
  bool kept;                         /* a spare cache that still holds its thread's blocks */
  bool taking;                       /* being taken back (the purger's pass) */
} keel_tcache_t;

/* free()'s room check: takes one unit of room from the bin, true if there was one. On
 * false the bin is left at -1 (see keel_bin_t), and the slow path that follows must call
 * keel_bin_give_back_room. TSan builds test before writing, so that the empty cache's
 * harmless race does not drown real reports. */
static inline bool keel_bin_take_room(keel_bin_t* b) {
#if KEEL_TSAN
  if (b->avail <= 0) return false;
  b->avail--;
  return true;
#else
  return --b->avail >= 0;
#endif
}
static inline void keel_bin_give_back_room(keel_bin_t* b) {
  if (b->avail < 0) b->avail = 0;
}
/* malloc()'s bookkeeping for a pop: one more unit of room, one pop nearer the next heap
 * profile sample. False when the countdown's stage ran out: the caller then calls
 * _keel_profile_countdown_expired. */
static inline bool keel_bin_count_pop(keel_bin_t* b) {
  b->avail_countdown -= 0xFFFF;
  return b->avail_countdown >= 0;
}
/* The same for a pop whose room was already counted (refills). */
static inline bool keel_bin_count_sample_only(keel_bin_t* b) {
  return --b->countdown >= 0;
}
/* The pops-th pop from now (1 <= pops; at most 2^31, more is clamped) is the one that
 * finds the countdown spent in _keel_profile_countdown_expired. */
static inline void keel_bin_set_countdown(keel_bin_t* b, uint32_t pops) {
  uint32_t left = (pops > 0x80000000u ? 0x80000000u : pops) - 1;
  b->countdown = (int16_t)(left & 0x7FFF);
  b->countdown_hi = (uint16_t)(left >> 15);
}

/* The calling thread's cache. Threads start on the empty cache, whose bins are all empty
 * with no room, so every malloc and free takes the slow path, which serves a young thread
 * from the central lists and gives a thread that keeps going its own cache (tcache.c).
 * `busy` is set while the thread uses `tc` (keel_tc_enter .. keel_tc_leave): the purger
 * takes back the cache of a thread that has waited only while it is clear (tcache.c,
 * "Caches of waiting threads"). One struct, so the fast paths find both with one
 * address. */
typedef struct keel_thread_s {
  keel_tcache_t* tc;
  uint8_t busy;
  uint8_t tag; /* the thread's number modulo 256, once it has called a slow path */
  keel_tcache_t* own; /* its cache, even while `tc` is the empty one; NULL: none (any more) */
} keel_thread_t;
extern _Thread_local keel_thread_t _keel_thread KEEL_INTERNAL;
extern keel_tcache_t _keel_tc_empty KEEL_INTERNAL;

/* The flag is written before the cache is read; no fence: the purger's membarrier(2)
 * orders the two for the processor, the signal fence for the compiler. The release
 * store keeps every use of the cache before the flag is cleared. */
static inline keel_tcache_t* keel_tc_enter(void) {
  __atomic_store_n(&_keel_thread.busy, 1, __ATOMIC_RELAXED);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  return __atomic_load_n(&_keel_thread.tc, __ATOMIC_RELAXED);
}
static inline void keel_tc_leave(void) { __atomic_store_n(&_keel_thread.busy, 0, __ATOMIC_RELEASE); }

/* Every free block carries this process-random value in its second word, and every
 * path that hands a block out clears it. So a block that still has it is free: freeing
 * it again is a double free, whichever thread freed it first. The low bit is set so the
 * key can never equal a pointer the program stored there. */
extern uintptr_t _keel_free_key KEEL_INTERNAL;

/* Thread caches in use, or kept with their blocks for the next thread (tcache.c). */
extern uint64_t _keel_live_caches KEEL_INTERNAL;
/* Of those, the caches a thread uses now (not spares kept for the next thread). */
extern uint64_t _keel_caches_in_use KEEL_INTERNAL;

/* borrow_for: the request's size where its block may be of a larger class (borrow.c),
 * else 0. */
void* _keel_tcache_alloc_slow(keel_tcache_t* t, unsigned cls, size_t borrow_for) KEEL_INTERNAL;
void _keel_tcache_free_slow(keel_tcache_t* t, void* p, unsigned cls) KEEL_INTERNAL;
/* free()'s slow path (api/malloc.c), with the busy flag set: room_cls is the page-map
 * entry its fast path read, whose bin's room it may have taken. Clears the flag. */
void _keel_free_slow(void* p, keel_tcache_t* t, size_t room_cls) KEEL_INTERNAL;
void _keel_tcache_flush(keel_tcache_t* t) KEEL_INTERNAL;
/* Spare caches that kept an exited thread's blocks for `min_ticks` purger ticks or more
 * give them back to the slabs (0: all of them). */
void _keel_tcache_release_spares(uint64_t min_ticks) KEEL_INTERNAL;
void _keel_tcache_thread_flush(void) KEEL_INTERNAL;
/* Takes back the caches of threads that made no slow-path call for idle_ticks purger
 * ticks or more and are not using them (0: every such cache whose thread is not busy
 * now); false where the process-wide barrier is unavailable. */
bool _keel_tcache_take_back_idle(uint64_t idle_ticks) KEEL_INTERNAL;
extern uint64_t _keel_caches_taken_back KEEL_INTERNAL; /* so far (statistics) */
/* Gathers of a class's blocks from other threads' bins (tcache.c), and the blocks they took. */
extern uint64_t _keel_gathers KEEL_INTERNAL, _keel_blocks_gathered KEEL_INTERNAL;
/* Cache structs' own memory (tcache_slots.c), registry lock held: a zeroed or reused
 * slot (NULL if out of memory); and giving one back, false if t is not in a slot. */
keel_tcache_t* _keel_tcache_slot_alloc(void) KEEL_INTERNAL;
bool _keel_tcache_slot_free(keel_tcache_t* t) KEEL_INTERNAL;
/* The count of caches in use is the registry's, and the live count covers the registry
 * and the kept spares (_keel_verify; takes the registry lock). */
bool _keel_tcache_counts_agree(void) KEEL_INTERNAL;
/* True if p is in t's bin of class cls (tests and diagnostics). */
bool _keel_tcache_contains(keel_tcache_t* t, unsigned cls, void* p) KEEL_INTERNAL;
void _keel_tcache_lock_all(void) KEEL_INTERNAL;
void _keel_tcache_unlock_all(void) KEEL_INTERNAL;
void _keel_tcache_after_fork_child(void) KEEL_INTERNAL;
void _keel_tcache_stats(keel_stats_t* out, uint64_t* cached_bytes) KEEL_INTERNAL;
void _keel_tcache_class_counts(uint64_t* counts /* [KEEL_NUM_CLASSES] */) KEEL_INTERNAL;
/* The heap profiler's hook (profile.c sets it when profiling starts; NULL without):
 * starts the sampling countdowns of a new cache's bins. NULL: no bin ever samples. The
 * thread caches call it, never the profiler by name. */
extern void (*_keel_tcache_sampling)(keel_tcache_t* t) KEEL_INTERNAL;

#endif /* KEEL_TCACHE_H */
