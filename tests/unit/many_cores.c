/* many_cores.c -- the many-core policies (transfer.h, "many processors"), on any machine:
 * run with KEEL_CPUS=16, Keel sizes its per-processor structures for sixteen processors.
 * Two threads pinned to two processors (the test skips what needs two where it has one):
 *   - a thread that allocates a query's working set of one size and frees it all, over
 *     and over, leaves batches on its own transfer line only (at most a line's seven
 *     slots), the rest going to its slabs, which are on its line's list;
 *   - a thread on another line whose list is empty takes over one of those slabs rather
 *     than a new one;
 *   - each line has its own lock: the first thread's trips took its line's only, the
 *     second's its own, and the class's lock (the purger's, statistics') is both;
 *   - the heap passes _keel_verify (every partial slab on its home line's list, each
 *     line's count of blocks out that of its slabs). */
#include <pthread.h>
#include <sched.h>

#include "core/internal.h"
#include "test.h"

enum { SIZE = 512, SET = 600, ROUNDS = 20, LINE_SLOTS = 7 };

static unsigned cls;

static bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

static unsigned home_list_of(void* p) {
  keel_chunk_t* c = keel_chunk_of(p);
  return keel_span_head(c, keel_unit_index(p))->home;
}

typedef struct {
  int cpu;
  unsigned line;
  void* first;
  uint32_t slabs_before, slabs_after;
} worker_t;

/* Acquisitions of line's lock of the class so far. */
static uint64_t taken(unsigned line) {
  return __atomic_load_n(&_keel_central_home(keel_central_of(cls), line)->lock.acquired, __ATOMIC_RELAXED);
}

static void* working_sets(void* arg) {
  worker_t* w = arg;
  pin(w->cpu);
  void* blocks[SET];
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < SET; i++) blocks[i] = malloc(SIZE);
    for (int i = 0; i < SET; i++) free(blocks[i]);
  }
  w->line = _keel_transfer_home();
  return NULL;
}

static void* one_block(void* arg) {
  worker_t* w = arg;
  pin(w->cpu);
  w->line = _keel_transfer_home();
  w->slabs_before = __atomic_load_n(&keel_central_of(cls)->slabs, __ATOMIC_RELAXED);
  w->first = malloc(SIZE); /* a young thread's take: one block, from the slabs */
  w->slabs_after = __atomic_load_n(&keel_central_of(cls)->slabs, __ATOMIC_RELAXED);
  return NULL;
}

static void run(void* (*fn)(void*), worker_t* w) {
  pthread_t th;
  CHECK(pthread_create(&th, NULL, fn, w) == 0);
  pthread_join(th, NULL);
}

int main(void) {
  _keel_init();
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof allowed, &allowed);
  int cpu0 = -1, cpu1 = -1;
  for (int c = 0; c < CPU_SETSIZE && cpu1 < 0; c++)
    if (CPU_ISSET(c, &allowed)) *(cpu0 < 0 ? &cpu0 : &cpu1) = c;
  /* The main thread takes a cache, so the first worker's is the second: the process
   * spreads over its lines then, numbered from the processor the main thread's cache
   * was made on (transfer.c): cpu0, the first worker's, so its slabs are line 0's. */
  /* Lines follow processors only where Keel can see them (rseq; not under qemu, which
   * numbers threads instead): then pinning decides a thread's line. */
  for (int i = 1; i >= 0; i--) {
    int c = i ? cpu1 : cpu0;
    if (c >= 0 && (!pin(c) || _keel_prim_current_cpu() != (unsigned)c)) {
      printf("SKIP: Keel does not see the processor a thread is pinned to\n");
      return 77;
    }
  }
  for (int i = 0; i < 200; i++) free(malloc(32));
  void* probe = malloc(SIZE);
  cls = keel_pagemap_get(probe);
  free(probe);
  CHECK(cls > 0 && cls < KEEL_NUM_CLASSES);
  const keel_class_t* k = &_keel_classes[cls];
  pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed); /* unpinned again */

  TEST_SECTION("a working set given back goes to its own line and its line's slabs");
  worker_t a = {.cpu = cpu0};
  uint64_t line0_before = taken(0);
  run(working_sets, &a);
  CHECK(keel_many_cores());
  CHECK(_keel_transfer_blocks(cls) <= LINE_SLOTS * k->batch);
  keel_central_t* cl = keel_central_of(cls);
  _keel_central_lock_class(cl);
  CHECK(cl->partial_lines == 1u << a.line);
  CHECK(_keel_partial_head(cl, a.line) != NULL);
  CHECK(cl->lines & (1u << a.line) || a.line == 0);
  _keel_central_unlock_class(cl);
  CHECK(taken(a.line) > (a.line == 0 ? line0_before : 0) + ROUNDS); /* its trips, its line's lock */
  if (a.line != 0) CHECK(taken(0) - line0_before <= 4); /* line 0's: the class's lock alone */

  TEST_SECTION("a thread on another line takes over a slab rather than a new one");
  if (cpu1 < 0) {
    printf("   (one processor: skipped)\n");
  } else {
    worker_t b = {.cpu = cpu1};
    uint64_t a_before = taken(a.line);
    run(one_block, &b);
    if (b.line == a.line) {
      printf("   (both processors on one line: skipped)\n");
    } else {
      CHECK(b.first != NULL);
      CHECK(b.slabs_after == b.slabs_before);
      CHECK(home_list_of(b.first) == b.line);
      CHECK(taken(b.line) >= 1);
      /* the take locked b's line, and a's only to add b's line to the class (the first
       * slab there) and to move the slab over */
      CHECK(taken(a.line) - a_before <= 2);
      _keel_central_lock_class(cl);
      CHECK(cl->partial_lines & (1u << b.line));
      _keel_central_unlock_class(cl);
    }
    free(b.first);
  }
  _keel_verify();
  return test_finish();
}
