/* cpu_cache.c -- the processors' caches: for each processor a slot per class for one
 * free block of the classes that skip the thread caches (above 8 KiB while two thread
 * caches or more are in use, tcache.c), filled by a free and emptied by a malloc on that
 * processor.
 *
 * Such a block goes from any thread's free to the next malloc of its class on that
 * processor instead of waiting in its thread's bin; the slots are restartable sequences
 * (platform/cpu_slots.h), so the handoff costs no atomic instruction: through the
 * transfer cache it cost a compare-and-swap and an exchange, and threads that churned
 * such blocks ran 3-4 times slower than with bins (design.md, "Blocks above 8 KiB are
 * shared"). A full slot sends the block on to the transfer cache, an empty one takes
 * from it, so the other processors' blocks are still found. One block, not a list: what
 * a processor holds the others cannot reach (Sphinx peaked 5 % higher with lists of two
 * or four than with none).
 *
 * Once a purge delay the purger empties them all (as it gives back the transfer cache's
 * idle batches): it stops every processor's cache, fences, and takes the blocks back to
 * the slabs, whose idle pages it then purges. A slot in use refills at its next free; a
 * stamp of the last use in each put and take would cost them more than the refills do.
 * A cache is made the first time its processor needs one. Off where glibc registered no
 * rseq area (before 2.35, glibc.pthread.rseq=0, valgrind), where the kernel cannot fence
 * (before 5.10), and under ThreadSanitizer, which cannot see the sections. */
#include "core/internal.h"

typedef struct cpu_area_s {
  uint8_t stop; /* read first by every section (platform/cpu_slots.h) */
  uint8_t pad[7];
  void* slot[KEEL_NUM_CLASSES];
} __attribute__((aligned(64))) cpu_area_t;
_Static_assert(offsetof(cpu_area_t, stop) == 0, "the sections read the stop byte at offset 0");

static cpu_area_t* areas[KEEL_CPU_SLOTS_MAX] KEEL_SPARSE_BSS;
static int state; /* 0 not tried yet, 1 on, 2 off */
static uint32_t cpus_seen; /* areas made: the drains walk [0, highest cpu + 1) */

static inline size_t slot_off(unsigned cls) { return offsetof(cpu_area_t, slot) + (size_t)cls * sizeof(void*); }

/* A put that found no cache on its processor (or the caches not tried yet): one is made,
 * and the put tried again. */
static KEEL_NOINLINE bool put_first(char* rseq, unsigned cls, void* block) {
  int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
  uint32_t cpu = (uint32_t)__atomic_load_n((const int32_t*)(rseq + 4), __ATOMIC_RELAXED);
  if (s == 2 || cpu >= KEEL_CPU_SLOTS_MAX || __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE) != NULL) return false;
  if (s == 0) {
    /* the fence registers the process for the purger's later ones */
    s = !KEEL_TSAN && KEEL_PRIM_CPU_SLOTS && _keel_prim_cpu_slots_fence() ? 1 : 2;
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
  return keel_prim_cpu_slot_put(rseq, (void* const*)areas, slot_off(cls), block);
}

void* _keel_cpu_cache_get(unsigned cls) {
  char* rseq = keel_prim_rseq();
  return rseq != NULL ? keel_prim_cpu_slot_take(rseq, (void* const*)areas, slot_off(cls)) : NULL;
}

bool _keel_cpu_cache_put(unsigned cls, void* block) {
  char* rseq = keel_prim_rseq();
  if (rseq == NULL) return false;
  return keel_prim_cpu_slot_put(rseq, (void* const*)areas, slot_off(cls), block) || put_first(rseq, cls, block);
}

/* The stopped caches' blocks of cls back to its slabs, under the class's lock: the
 * statistics, which read the slabs and the caches under it, never see a block that is
 * in neither. */
static void drain_class(unsigned cls, uint32_t seen) {
  keel_central_t* cl = NULL;
  void* list = NULL;
  for (uint32_t cpu = 0; cpu < seen; cpu++) {
    cpu_area_t* a = __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE);
    void* block = a != NULL && a->stop ? __atomic_load_n(&a->slot[cls], __ATOMIC_RELAXED) : NULL;
    if (block == NULL) continue;
    if (cl == NULL) _keel_central_lock_class(cl = keel_central_of(cls));
    __atomic_store_n(&a->slot[cls], NULL, __ATOMIC_RELAXED);
    keel_link_set(block, list);
    list = block;
  }
  if (cl == NULL) return;
  _keel_central_put_locked(cls, list);
  _keel_central_unlock_class(cl);
}

/* One drain at a time (the purger, a fork, keel_purge, the invariant walk): each owns
 * the stop bytes it sets. Another caller meanwhile skips its drain. */
static uint8_t draining;

/* Stops the caches that hold blocks, fences, and gives their blocks back to the slabs;
 * the caches start again empty. */
void _keel_cpu_cache_drain(void) {
  if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) != 1) return;
  if (__atomic_exchange_n(&draining, 1, __ATOMIC_ACQUIRE) != 0) return;
  uint32_t seen = __atomic_load_n(&cpus_seen, __ATOMIC_RELAXED);
  bool any = false;
  for (uint32_t cpu = 0; cpu < seen; cpu++) {
    cpu_area_t* a = __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE);
    if (a == NULL) continue;
    for (unsigned cls = 1; cls < KEEL_NUM_CLASSES && !a->stop; cls++)
      if (__atomic_load_n(&a->slot[cls], __ATOMIC_RELAXED) != NULL) __atomic_store_n(&a->stop, 1, __ATOMIC_RELAXED);
    any |= a->stop;
  }
  if (any && _keel_prim_cpu_slots_fence())
    for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) drain_class(cls, seen);
  for (uint32_t cpu = 0; any && cpu < seen; cpu++) {
    cpu_area_t* a = __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE);
    if (a != NULL && a->stop) __atomic_store_n(&a->stop, 0, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&draining, 0, __ATOMIC_RELEASE);
}

void _keel_cpu_cache_tick(uint32_t now, uint32_t period) {
  static uint32_t last;
  if (__atomic_load_n(&state, __ATOMIC_RELAXED) != 1 || now - last < period) return;
  last = now;
  _keel_cpu_cache_drain();
}

/* The child's only thread is in no section: a drain the fork caught midway is undone
 * (its stop bytes would stop those caches for good), and its slots kept. */
void _keel_cpu_cache_after_fork_child(void) {
  for (uint32_t cpu = 0, seen = __atomic_load_n(&cpus_seen, __ATOMIC_RELAXED); cpu < seen; cpu++)
    if (areas[cpu] != NULL) areas[cpu]->stop = 0;
  draining = 0;
}

KEEL_COLD uint32_t _keel_cpu_cache_blocks(unsigned cls) {
  uint32_t blocks = 0, seen = __atomic_load_n(&cpus_seen, __ATOMIC_RELAXED);
  for (uint32_t cpu = 0; cpu < seen; cpu++) {
    const cpu_area_t* a = __atomic_load_n(&areas[cpu], __ATOMIC_ACQUIRE);
    if (a != NULL) blocks += __atomic_load_n(&a->slot[cls], __ATOMIC_RELAXED) != NULL;
  }
  return blocks;
}
