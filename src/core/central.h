/* central.h -- the central free lists (central.c, borrow.c, slab_trim.c): one per size
 * class, and what the rest of the core calls of them. */
#ifndef KEEL_CENTRAL_H
#define KEEL_CENTRAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "core/chunk.h"
#include "core/geometry.h"
#include "core/lock.h"
#include "core/size_class.h"

/* ---- central free lists (central.c, borrow.c, slab_trim.c) ------------------------------
 * One per size class: the slabs that still have free blocks, which a thread goes to only
 * when the transfer cache has nothing for it or no room. On many cores, and on fewer for
 * threads that are apart (transfer.h), they are split by home line (the processor a
 * thread runs on, central.c "Home lines"): each line has its own lock, list and counts,
 * and a slab belongs to one line, whose lock guards it.
 * What walks or changes a whole class (the purger, borrowing, meshing, statistics, the
 * verifier, fork) takes the class's lock: every line's, in line order. Otherwise every
 * slab is line 0's, whose lock is then the class's only one. */
typedef struct keel_home_s {
  keel_lock_t lock;
  keel_slab_t* partial; /* the line's slabs with free blocks */
  uint64_t out;         /* blocks out of the line's slabs: live, or in a cache */
  uint16_t trips;       /* takes from and gives to the line's slabs in purger tick trips_tick */
  uint8_t trips_tick;   /* (its low bits) */
  uint8_t taker;        /* tag of the thread that last took from the line's slabs */
  uint8_t pad[4];
} keel_home_t;
_Static_assert(sizeof(keel_home_t) == 48, "keel_home_t is 48 bytes");

typedef struct keel_central_s {
  keel_home_t home;       /* line 0's */
  uint32_t take_tick;     /* purger tick when blocks were last taken (slab or transfer cache) */
  uint16_t partial_lines; /* bit L: home line L's partial list has slabs (central.c) */
  uint16_t lines;         /* bit L: line L may hold slabs: its lock is part of the class's */
  keel_slab_t* sampled_partial; /* slabs holding profile samples with free blocks (line 0's) */
  /* The second line: state of borrowing and carving (borrow.c), under the class's lock
   * unless said. */
  keel_slab_t* lend_cursor;           /* where the next search for a hole to lend starts */
  struct keel_carve_s* carve_partial; /* holes carved for this class with free blocks */
  uint32_t slabs;                     /* slabs of this class */
  uint32_t lend_miss_tick;            /* 1 + the last tick a lend search found nothing */
  uint32_t carved_blocks;             /* blocks of this class handed out of carved holes */
  uint32_t carved_from;               /* holes carved out of this class's slabs */
  uint16_t busy_lines; /* bit L: BUSY_TRIPS trips on line L in this tick or the last */
  uint32_t carve_tick; /* carves: the tries of this class to carve in purger tick */
  uint32_t carves;     /* carve_tick (borrow.c; written without a lock, a hint) */
} __attribute__((aligned(64))) keel_central_t;
/* A class carves at most this many times a purger tick, or as many times as it has
 * carved blocks out if more, then takes slabs (borrow.c). */
#define KEEL_CARVES_PER_TICK 64
/* Two cache lines. The array is in every process's .bss, in slot order (below): a
 * program writes the entries of the classes it uses. */
_Static_assert(sizeof(keel_central_t) == 128, "keel_central_t grew past two cache lines");

/* Purger ticks so far (a coarse clock the central lists stamp without a system call). */
extern uint64_t _keel_ticks KEEL_INTERNAL;

/* The central lists, in the order their classes became active (central.c), so that a
 * program writes as many pages of the array as the classes it uses fill; slot 0 is what
 * an inactive class reads, all zero, never written. Indexed through keel_central_of. */
extern keel_central_t _keel_central_slots[KEEL_NUM_CLASSES] KEEL_INTERNAL;
extern uint8_t _keel_central_slot[KEEL_NUM_CLASSES] KEEL_INTERNAL;
static inline keel_central_t* keel_central_of(unsigned cls) {
  return &_keel_central_slots[__atomic_load_n(&_keel_central_slot[cls], __ATOMIC_ACQUIRE)];
}
/* The class's blocks go to and come from its slabs at a rate that makes a lock of it a
 * meeting point (central.c counts the trips): its bins move whole batches even in a
 * small heap (tcache.c). */
static inline bool _keel_central_busy(unsigned cls) {
  return __atomic_load_n(&keel_central_of(cls)->busy_lines, __ATOMIC_RELAXED) != 0;
}

/* The class's lock: every line's that may hold its slabs, in line order (central.c); the
 * try version takes none if one is held. */
void _keel_central_lock_class(keel_central_t* cl) KEEL_INTERNAL;
bool _keel_central_trylock_class(keel_central_t* cl) KEEL_INTERNAL;
void _keel_central_unlock_class(keel_central_t* cl) KEEL_INTERNAL;
/* Line `line`'s share of the class (line 0's is cl->home). */
keel_home_t* _keel_central_home(keel_central_t* cl, unsigned line) KEEL_INTERNAL;
/* The lines whose locks make up the class's: line 0 and those that ever held a slab of it. */
static inline uint32_t keel_central_lines(const keel_central_t* cl) {
  return (uint32_t)__atomic_load_n(&cl->lines, __ATOMIC_RELAXED) | 1u;
}
/* Blocks out of the class's slabs, summed over its lines (exact under the class's lock). */
uint64_t _keel_central_out(const keel_central_t* cl) KEEL_INTERNAL;
struct keel_lock_stats_s;
/* Adds the counters of every lock of class cls to *sum (without taking them). */
void _keel_central_lock_read(unsigned cls, struct keel_lock_stats_s* sum) KEEL_INTERNAL;

/* A class's slabs with free blocks are on one list per home line (central.c), under the
 * class's lock: the first of them all and the one after s, in line order, NULL at the end
 * (a profile-sample slab's list is one, sampled_partial); and the head of one line's list. */
keel_slab_t* _keel_partial_first(keel_central_t* cl) KEEL_INTERNAL;
keel_slab_t* _keel_partial_next(keel_central_t* cl, keel_slab_t* s) KEEL_INTERNAL;
keel_slab_t* _keel_partial_head(keel_central_t* cl, unsigned line) KEEL_INTERNAL;

/* Free blocks parked in cls's transfer cache (racy: statistics). */
uint32_t _keel_central_parked_blocks(unsigned cls) KEEL_INTERNAL;
/* Whether cls's central list has ever been locked (an inactive one is all zero). */
bool _keel_central_active(unsigned cls) KEEL_INTERNAL;
/* Makes cls active (its own entry, written from now on) and returns its entry. No Keel
 * lock may be held. Before that, keel_central_of(cls) is the shared zero entry, which
 * must not be written. */
keel_central_t* _keel_central_activate(unsigned cls) KEEL_INTERNAL;
/* Class cls has free blocks in its slabs or transfer cache (unlocked: a hint). */
bool _keel_central_has_free(unsigned cls) KEEL_INTERNAL;
/* Whether a take of `want` blocks of cls may come from the transfer cache (at least half
 * a batch of a cached class). */
static inline bool _keel_central_parks(unsigned cls, uint32_t want) {
  const keel_class_t* k = &_keel_classes[cls];
  return k->transfer_max > 0 && want >= (k->batch >= 2 ? k->batch / 2u : k->batch);
}
/* A list parked in cls's transfer cache for a take of `want` blocks (a whole batch, or
 * half of one where want is less), without a lock; NULL (*got 0) if there is none or
 * want is too small (_keel_central_parks). */
void* _keel_central_take_parked(unsigned cls, uint32_t want, uint32_t* got) KEEL_INTERNAL;
/* Class cls has free blocks in its slabs (unlocked: a hint). */
static inline bool _keel_central_slabs_have_free(unsigned cls) {
  return __atomic_load_n(&keel_central_of(cls)->partial_lines, __ATOMIC_RELAXED) != 0;
}
/* Takes up to `want` blocks of class cls; returns a NULL-terminated list and sets *got.
 * NULL (and *got 0) when memory is exhausted. */
void* _keel_central_take(unsigned cls, uint32_t want, uint32_t* got) KEEL_INTERNAL;
/* How far a take from the slabs may go for its blocks: a new slab if none has one, or
 * not (NULL where only a new slab would do: the caller gathers first, tcache.c); or,
 * while threads are apart, also another thread's lone slab on a line in use (blocks a
 * gather just gave back to it). */
typedef enum { KEEL_TAKE_OR_GROW, KEEL_TAKE_NO_NEW_SLAB, KEEL_TAKE_ANY_LINE } keel_take_t;
/* The same from the slabs alone, under the class's lock (the transfer cache was tried). */
void* _keel_central_take_slabs_how(unsigned cls, uint32_t want, uint32_t* got, keel_take_t how) KEEL_INTERNAL;
static inline void* _keel_central_take_slabs(unsigned cls, uint32_t want, uint32_t* got) {
  return _keel_central_take_slabs_how(cls, want, got, KEEL_TAKE_OR_GROW);
}
/* The class's lock held: every block of a list of class cls goes back to its slab. */
void _keel_central_put_locked(unsigned cls, void* list) KEEL_INTERNAL;
/* Gives back a NULL-terminated list of n blocks of class cls. */
void _keel_central_give(unsigned cls, void* list, uint32_t n) KEEL_INTERNAL;
/* Gives back the first n blocks of a list of class cls (a bin's); returns the rest. */
void* _keel_central_give_front(unsigned cls, void* list, uint32_t n) KEEL_INTERNAL;
/* The same straight to the slabs, past the transfer cache (blocks no thread wanted for a
 * while: their slabs can then empty and be released). */
void _keel_central_give_slabs(unsigned cls, void* list) KEEL_INTERNAL;
/* A free block of a larger, cold class, at most twice the request's n bytes, for a
 * request of class cls that would otherwise take a new slab (borrow.c, "borrowing");
 * NULL if none. Never through a bin. */
#define KEEL_BORROW_FREE_SHARE 8 /* a class lends while 1/this of its slabs' blocks are free */
void* _keel_central_borrow(unsigned cls, size_t n) KEEL_INTERNAL;
/* A larger class that may lend to cls for a request of n bytes and whose entry in heads
 * (a thread cache's bin heads) holds a free block; 0 if none. Not counted in
 * _keel_central_borrowed_blocks, which counts blocks lent from slabs. */
unsigned _keel_central_lender_in(const uintptr_t* heads, unsigned cls, size_t n) KEEL_INTERNAL;
/* A block of class cls carved out of a free block of a class 4-64 times its size
 * (borrow.c, "carving"); NULL if none. Never through a bin. */
void* _keel_central_carve(unsigned cls) KEEL_INTERNAL;
/* free of p, in a unit tagged KEEL_KIND_CARVED: frees it if it is a carved block and
 * returns 0; else returns its slab's class, for the caller to free it as any other. */
unsigned _keel_central_carved_free(void* p, const char* call) KEEL_INTERNAL;
/* Usable size of the block at p, in a unit tagged KEEL_KIND_CARVED. */
size_t _keel_central_carved_size(const void* p, const char* call) KEEL_INTERNAL;
uint64_t _keel_central_carved_holes(void) KEEL_INTERNAL; /* holes carved now */
/* Central lock of cls held: its list of carved holes is consistent (verify.c). */
bool _keel_central_verify_carved(unsigned cls) KEEL_INTERNAL;
uint64_t _keel_central_borrowed_blocks(void) KEEL_INTERNAL;
/* One block of class cls from a slab reserved for heap-profile samples; NULL if OOM. */
void* _keel_central_take_sampled(unsigned cls) KEEL_INTERNAL;
/* True if block p (of class cls) is free in its slab: proves a double free. */
bool _keel_central_is_free(unsigned cls, void* p) KEEL_INTERNAL;
/* Meshing's hook (mesh.c sets it before it makes any page of a slab a view; NULL until
 * then): class lock held, the pages of [addr, addr + len) of a slab marked meshed leave
 * their mesh, views becoming fresh memory; false if one could not. The central lists call
 * it, never meshing by name; with meshing off no slab is meshed and it is never read. */
extern bool (*_keel_central_unmesh)(void* addr, size_t len) KEEL_INTERNAL;
/* Returns free memory of every class now, not on the purger's timer (slab_trim.c, like
 * _keel_central_decay): transfer caches back to their slabs, empty slabs to the page
 * heap, and the free pages of up to max_trims partly used slabs purged. Returns the
 * bytes purged. */
size_t _keel_central_purge_all(uint32_t max_trims) KEEL_INTERNAL;
/* All of Keel's free memory back to the OS now (keel_purge, `keel purge PID`, before a
 * fork, the purger's answer to threads ending in a shrinking process), at most
 * max_trims partly used slabs trimmed; bytes released (init.c). */
size_t _keel_purge_now(uint32_t max_trims) KEEL_INTERNAL;
/* max_trims outside an explicit request (a fork, the purger's answer): a big heap's many
 * partly used slabs (Redis forking to save) are left to the timer. */
#define KEEL_PURGE_TRIMS_BOUNDED 256u
/* The same for classes whose transfer cache has not been used for `idle_ticks`; and the
 * OS pages inside partly used slabs that hold only free blocks, untouched for as long,
 * go back to the OS - or, in a cold class (one that has taken no blocks for half as
 * long), while blocks still come back (a bounded number of slabs per tick). */
void _keel_central_decay(uint64_t idle_ticks) KEEL_INTERNAL;
uint64_t _keel_central_trimmed_bytes(void) KEEL_INTERNAL;
void _keel_central_lock_all(void) KEEL_INTERNAL;
void _keel_central_unlock_all(void) KEEL_INTERNAL;
void _keel_central_reset_locks(void) KEEL_INTERNAL;
/* Block start for a pointer into a slab of class cls; sets *exact if p is that start. */
void* _keel_block_start(unsigned cls, const void* p, bool* exact) KEEL_INTERNAL;

#endif /* KEEL_CENTRAL_H */
