/* cpu_cache.c -- the processors' caches: for each processor a short list of free blocks
 * per class that skips the thread caches (above 8 KiB while two thread caches or more
 * are in use, tcache.c), pushed by a free and popped by a malloc on that processor.
 *
 * Such a block goes from any thread's free to the next malloc of its class on that
 * processor instead of waiting in its thread's bin; the lists are restartable sequences
 * (platform/cpu_lists.h), so the handoff costs no atomic instruction: through the
 * transfer cache it cost a compare-and-swap and an exchange, and threads that churned
 * such blocks ran 3-4 times slower than with bins (design.md, "Blocks above 8 KiB are
 * shared"). A full list overflows into the transfer cache, an empty one refills from
 * it, so the other processors' blocks are still found.
 *
 * Once a purge delay the purger empties them all (as it gives back the transfer cache's
 * idle batches): it stops every processor's cache, fences, and takes the lists back to
 * the slabs, whose idle pages it then purges. A list in use refills at its next free; a
 * stamp of the last use in each get and put would cost them more than the refills do.
 * A cache is made the first time its processor needs one. Off where glibc registered no rseq area
 * (before 2.35, glibc.pthread.rseq=0, valgrind), where the kernel cannot fence (before
 * 5.10), and under ThreadSanitizer, which cannot see the sections. */
#include "core/internal.h"

typedef struct cpu_area_s {
  uint8_t stop; /* read first by every section (platform/cpu_lists.h) */
  uint8_t pad[7];
  uintptr_t head[KEEL_NUM_CLASSES];
} __attribute__((aligned(64))) cpu_area_t;
_Static_assert(offsetof(cpu_area_t, stop) == 0, "the sections read the stop byte at offset 0");

static cpu_area_t* areas[KEEL_CPU_LISTS_MAX] KEEL_SPARSE_BSS;
static int state; /* 0 not tried yet, 1 on, 2 off */
static uint32_t cpus_seen; /* areas made: the drains walk [0, highest cpu + 1) */

static inline size_t head_off(unsigned cls) { return offsetof(cpu_area_t, head) + (size_t)cls * sizeof(uintptr_t); }
static inline uintptr_t link_key(void) { return _keel_link_key; }

/* The head word below head (decoded from its block's first word): a list one shorter,
 * of blocks of cls. A stray write into a free block fails this before the block below is
 * used. */
static inline bool below_ok(uintptr_t head, uintptr_t below, unsigned cls) {
  uintptr_t n = head & 15;
  if (n == 1) return below == 0;
  if ((below & 15) != n - 1) return false;
  const void* b = (const void*)(below & ~(uintptr_t)15);
  uint8_t kind = keel_pagemap_get(b);
  return kind == cls || (kind != 0 && _keel_central_other_tag_ok(b, kind, cls));
}

/* A put that found no cache on its processor (or the caches not tried yet): one is made,
 * and the put tried again. */
static KEEL_NOINLINE bool put_first(char* rseq, unsigned cls, void* block) {
  int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
  uint32_t cpu = (uint32_t)__atomic_load_n((const int32_t*)(rseq + 4), __ATOMIC_RELAXED);
  if (s == 2 || cpu >= KEEL_CPU_LISTS_MAX || __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE) != NULL) return false;
  if (s == 0) {
    /* the fence registers the process for the purger's later ones */
    s = !KEEL_TSAN && KEEL_PRIM_CPU_LISTS && _keel_prim_cpu_lists_fence() ? 1 : 2;
    __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    if (s != 1) return false;
  }
  cpu_area_t* a = (cpu_area_t*)_keel_meta_alloc(sizeof(cpu_area_t));
  if (a == NULL) return false;
  cpu_area_t* none = NULL;
  /* Two threads of one processor racing here (one preempted in between) leave one
   * area unused: a kilobyte of metadata, once. */
  if (__atomic_compare_exchange_n(&areas[cpu], &none, a, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
    for (uint32_t seen = __atomic_load_n(&cpus_seen, __ATOMIC_RELAXED); seen < cpu + 1;)
      if (__atomic_compare_exchange_n(&cpus_seen, &seen, cpu + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) break;
  return keel_prim_cpu_list_push(rseq, (void* const*)areas, head_off(cls), (uintptr_t)block, link_key());
}

void* _keel_cpu_cache_get(unsigned cls) {
  char* rseq = keel_prim_rseq();
  if (rseq == NULL) return NULL;
  uintptr_t next, head = keel_prim_cpu_list_pop(rseq, (void* const*)areas, head_off(cls), link_key(), &next);
  if (head == 0) return NULL;
  void* block = (void*)(head & ~(uintptr_t)15);
  /* The head it leaves came from the block's first word: the length one less, and a
   * block of the class, or a stray write into a free block, caught before it is used. */
  if (KEEL_UNLIKELY(!below_ok(head, next, cls))) _keel_freelist_corrupt("malloc", cls, block);
  return block;
}

bool _keel_cpu_cache_put(unsigned cls, void* block) {
  char* rseq = keel_prim_rseq();
  if (rseq == NULL) return false;
  return keel_prim_cpu_list_push(rseq, (void* const*)areas, head_off(cls), (uintptr_t)block, link_key()) ||
         put_first(rseq, cls, block);
}

/* The blocks of list `head` (the cache's encoding) as a free list (freelist.h). */
static void* list_of(uintptr_t head, unsigned cls) {
  void* first = (void*)(head & ~(uintptr_t)15);
  for (uintptr_t h = head; h != 0;) {
    void* b = (void*)(h & ~(uintptr_t)15);
    uintptr_t below = *(uintptr_t*)b ^ link_key() ^ (uintptr_t)b;
    if (!below_ok(h, below, cls)) _keel_freelist_corrupt("free", cls, b);
    keel_link_set(b, below != 0 ? (void*)(below & ~(uintptr_t)15) : NULL);
    h = below;
  }
  return first;
}

static void drain_stopped(uint32_t seen);

/* One drain at a time (the purger, a fork, keel_purge, the invariant walk): each owns
 * the stop bytes it sets. Another caller meanwhile skips its drain. */
static uint8_t draining;

/* Stops the caches that hold blocks, fences, and gives their lists back to the slabs;
 * the caches start again empty. */
static KEEL_NOINLINE void drain(void) {
  if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) != 1) return;
  if (__atomic_exchange_n(&draining, 1, __ATOMIC_ACQUIRE) != 0) return;
  uint32_t seen = __atomic_load_n(&cpus_seen, __ATOMIC_RELAXED);
  bool any = false;
  for (uint32_t cpu = 0; cpu < seen; cpu++) {
    cpu_area_t* a = __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE);
    if (a == NULL) continue;
    for (unsigned cls = 1; cls < KEEL_NUM_CLASSES && !a->stop; cls++)
      if (__atomic_load_n(&a->head[cls], __ATOMIC_RELAXED) != 0) __atomic_store_n(&a->stop, 1, __ATOMIC_RELAXED);
    any |= a->stop;
  }
  if (any) drain_stopped(seen);
  __atomic_store_n(&draining, 0, __ATOMIC_RELEASE);
}

static void drain_stopped(uint32_t seen) {
  bool fenced = _keel_prim_cpu_lists_fence();
  for (uint32_t cpu = 0; cpu < seen; cpu++) {
    cpu_area_t* a = __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE);
    if (a == NULL || !a->stop) continue;
    for (unsigned cls = 1; fenced && cls < KEEL_NUM_CLASSES; cls++) {
      uintptr_t head = __atomic_load_n(&a->head[cls], __ATOMIC_RELAXED);
      if (head == 0) continue;
      __atomic_store_n(&a->head[cls], 0, __ATOMIC_RELAXED);
      _keel_central_give_slabs(cls, list_of(head, cls));
    }
    __atomic_store_n(&a->stop, 0, __ATOMIC_RELEASE);
  }
}

void _keel_cpu_cache_drain(void) { drain(); }

void _keel_cpu_cache_tick(uint32_t now, uint32_t period) {
  static uint32_t last;
  if (__atomic_load_n(&state, __ATOMIC_RELAXED) != 1 || now - last < period) return;
  last = now;
  drain();
}

/* The child's only thread is in no section: a drain the fork caught midway is undone
 * (its stop bytes would stop those caches for good), and its lists kept. */
void _keel_cpu_cache_after_fork_child(void) {
  for (uint32_t cpu = 0, seen = __atomic_load_n(&cpus_seen, __ATOMIC_RELAXED); cpu < seen; cpu++)
    if (areas[cpu] != NULL) areas[cpu]->stop = 0;
  draining = 0;
}

KEEL_COLD uint32_t _keel_cpu_cache_blocks(unsigned cls) {
  uint32_t blocks = 0, seen = __atomic_load_n(&cpus_seen, __ATOMIC_RELAXED);
  for (uint32_t cpu = 0; cpu < seen; cpu++) {
    const cpu_area_t* a = __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE);
    if (a != NULL) blocks += (uint32_t)(__atomic_load_n(&a->head[cls], __ATOMIC_RELAXED) & 15);
  }
  return blocks;
}

KEEL_COLD bool _keel_cpu_cache_verify(void) {
  /* Emptied rather than walked in place: a walk would need every cache stopped for its
   * length, and the lists' blocks are checked on their way back (list_of). */
  drain();
  return true;
}
