/* test_thread_exit.c -- threads that exit while others still use and free their memory,
 * and allocation inside thread-exit destructors.
 *
 *   1. Producers allocate blocks (every tier), hand them to consumers and exit at once;
 *      consumers verify and free them after the producer's cache is gone. Some blocks
 *      are realloc'ed by the consumer first (a block whose owner thread is dead).
 *   2. Allocation in pthread key destructors: keys created before Keel's own key (which
 *      Keel creates on a thread's first allocation) and after it, so glibc runs them
 *      both before and after Keel has flushed the thread's cache. The destructors
 *      allocate, free, free the thread's leftovers, and re-arm themselves so that glibc
 *      runs a second round (PTHREAD_DESTRUCTOR_ITERATIONS).
 *   3. A thread that only frees (never allocates) blocks of other, dead threads, then
 *      exits.
 * Linked with libkeel.so. Environment: KEEL_STRESS_SCALE scales the rounds.
 */
#include "faults.h"

#include <pthread.h>

typedef struct {
  unsigned char* p;
  size_t n;
  uint64_t seed;
} blk_t;

#define QCAP 4096
static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcv = PTHREAD_COND_INITIALIZER;
static blk_t queue[QCAP];
static size_t qhead, qcount;
static int producers_done;
static long consumed, realloced;

static size_t pick(t_rng* r) { return rng_tier_size(r, 100, 80, 95, 99, 1, 4 << 20); }

static void put(const blk_t* b) {
  pthread_mutex_lock(&qmu);
  while (qcount == QCAP) {
    pthread_mutex_unlock(&qmu);
    usleep(100);
    pthread_mutex_lock(&qmu);
  }
  queue[(qhead + qcount) % QCAP] = *b;
  qcount++;
  pthread_cond_signal(&qcv);
  pthread_mutex_unlock(&qmu);
}

static void* producer(void* arg) {
  t_rng r;
  rng_seed(&r, (uint64_t)(uintptr_t)arg);
  int n = (int)rng_range(&r, 1, 40);
  for (int i = 0; i < n; i++) {
    blk_t b;
    b.n = pick(&r);
    b.p = (unsigned char*)malloc(b.n);
    if (!CHECK(b.p != NULL)) continue;
    b.seed = rng_next(&r);
    pattern_fill(b.p, b.n, b.seed);
    put(&b);
  }
  /* A few blocks of its own, freed here: its cache holds them when it exits. */
  for (int i = 0; i < 8; i++) free(malloc((size_t)rng_range(&r, 1, 2000)));
  return NULL;
}

static void* consumer(void* arg) {
  t_rng r;
  rng_seed(&r, (uint64_t)(uintptr_t)arg);
  for (;;) {
    pthread_mutex_lock(&qmu);
    while (qcount == 0 && !producers_done) pthread_cond_wait(&qcv, &qmu);
    if (qcount == 0) {
      pthread_mutex_unlock(&qmu);
      return NULL;
    }
    blk_t b = queue[qhead];
    qhead = (qhead + 1) % QCAP;
    qcount--;
    pthread_mutex_unlock(&qmu);
    size_t off = pattern_check(b.p, b.n, b.seed);
    CHECK_MSG(off == SIZE_MAX, "block %p (%zu bytes) from a dead thread differs at %zu", (void*)b.p,
              b.n, off);
    if (rng_next(&r) % 4 == 0) {
      size_t n = pick(&r);
      unsigned char* q = (unsigned char*)realloc(b.p, n);
      if (CHECK(q != NULL)) {
        size_t keep = n < b.n ? n : b.n;
        CHECK(pattern_check(q, keep, b.seed) == SIZE_MAX);
        b.p = q;
        __atomic_fetch_add(&realloced, 1, __ATOMIC_RELAXED);
      }
    }
    free(b.p);
    __atomic_fetch_add(&consumed, 1, __ATOMIC_RELAXED);
  }
}

/* ---- 2. allocation in key destructors ---------------------------------------------- */
static pthread_key_t key_early, key_late;
static long dtor_runs, dtor_allocs;

typedef struct {
  blk_t b;
  pthread_key_t key;
} armed_t;

static void dtor(void* v) {
  armed_t* a = (armed_t*)v;
  blk_t* b = &a->b;
  /* The thread's leftover block: verify and free it. */
  CHECK(pattern_check(b->p, b->n, b->seed) == SIZE_MAX);
  free(b->p);
  /* Allocate and free in the destructor, whatever state the thread's cache is in. */
  void* tmp[16];
  for (int i = 0; i < 16; i++) {
    tmp[i] = malloc((size_t)(i + 1) * 100);
    if (CHECK(tmp[i] != NULL)) memset(tmp[i], i, (size_t)(i + 1) * 100);
  }
  for (int i = 0; i < 16; i++) free(tmp[i]);
  __atomic_fetch_add(&dtor_allocs, 16, __ATOMIC_RELAXED);
  __atomic_fetch_add(&dtor_runs, 1, __ATOMIC_RELAXED);
  if (b->seed == 2) {
    /* Re-arm: glibc runs a second round of destructors after this one. */
    b->n = 333;
    b->seed = 1;
    b->p = (unsigned char*)malloc(b->n);
    if (CHECK(b->p != NULL)) pattern_fill(b->p, b->n, b->seed);
    pthread_setspecific(a->key, a);
    return;
  }
  free(a);
}

static void* dtor_thread(void* arg) {
  intptr_t which = (intptr_t)arg;
  armed_t* a = (armed_t*)malloc(sizeof *a);
  if (!CHECK(a != NULL)) return NULL;
  a->b.n = 1000 + (size_t)which;
  a->b.p = (unsigned char*)malloc(a->b.n);
  a->b.seed = 2; /* even: the destructor re-arms once */
  pattern_fill(a->b.p, a->b.n, a->b.seed);
  a->key = which & 1 ? key_late : key_early;
  pthread_setspecific(a->key, a);
  return NULL;
}

/* ---- 3. a thread that only frees ----------------------------------------------------- */
static blk_t orphans[256];
static void* free_only(void* arg) {
  (void)arg;
  for (int i = 0; i < 256; i++) {
    CHECK(pattern_check(orphans[i].p, orphans[i].n, orphans[i].seed) == SIZE_MAX);
    free(orphans[i].p);
  }
  return NULL;
}
static void* make_orphans(void* arg) {
  t_rng r;
  rng_seed(&r, (uint64_t)(uintptr_t)arg);
  for (int i = 0; i < 256; i++) {
    orphans[i].n = pick(&r);
    orphans[i].p = (unsigned char*)malloc(orphans[i].n);
    orphans[i].seed = rng_next(&r);
    pattern_fill(orphans[i].p, orphans[i].n, orphans[i].seed);
  }
  return NULL;
}

int main(void) {
  /* key_early exists before Keel creates its own key (on this thread's first
   * allocation inside assert_keel_in_use); key_late after. */
  CHECK(pthread_key_create(&key_early, dtor) == 0);
  assert_keel_in_use();
  CHECK(pthread_key_create(&key_late, dtor) == 0);
  watchdog(300);
  double scale = stress_scale();
  int rounds = (int)(400 * scale);
  if (rounds < 20) rounds = 20;
  double t0 = now_sec();

  /* 1. */
  pthread_t cons[2];
  for (int i = 0; i < 2; i++)
    CHECK(pthread_create(&cons[i], NULL, consumer, (void*)(uintptr_t)(100 + i)) == 0);
  for (int i = 0; i < rounds; i++) {
    pthread_t p[4];
    for (int k = 0; k < 4; k++)
      CHECK(pthread_create(&p[k], NULL, producer, (void*)(uintptr_t)(i * 4 + k + 1)) == 0);
    for (int k = 0; k < 4; k++) pthread_join(p[k], NULL);
  }
  pthread_mutex_lock(&qmu);
  producers_done = 1;
  pthread_cond_broadcast(&qcv);
  pthread_mutex_unlock(&qmu);
  for (int i = 0; i < 2; i++) pthread_join(cons[i], NULL);
  printf("exit: %d producer threads exited; consumers verified and freed %ld of their blocks "
         "(%ld realloc'ed first)\n", rounds * 4, consumed, realloced);

  /* 2. */
  int dthreads = rounds / 2;
  for (int i = 0; i < dthreads; i++) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, dtor_thread, (void*)(intptr_t)i) == 0);
    pthread_join(t, NULL);
  }
  printf("exit: %d threads ran %ld key destructors (before and after Keel's own), "
         "%ld allocations inside them\n", dthreads, dtor_runs, dtor_allocs);
  CHECK_MSG(dtor_runs == 2L * dthreads, "destructor runs %ld, expected %d", dtor_runs, 2 * dthreads);

  /* 3. */
  for (int i = 0; i < rounds / 20 + 1; i++) {
    pthread_t a, b;
    CHECK(pthread_create(&a, NULL, make_orphans, (void*)(uintptr_t)(7 + i)) == 0);
    pthread_join(a, NULL);
    CHECK(pthread_create(&b, NULL, free_only, NULL) == 0);
    pthread_join(b, NULL);
  }

  keel_stats_t s = keel_stats_now();
  printf("exit: %.1f s; threads now %llu (total %llu), allocated %llu bytes\n", now_sec() - t0,
         (unsigned long long)s.threads, (unsigned long long)s.threads_total,
         (unsigned long long)s.allocated);
  /* Every thread but main (and Keel's purger, which never allocates) has exited and
   * handed its cache back. */
  CHECK_MSG(s.threads <= 2, "%llu thread caches still live", (unsigned long long)s.threads);
  return test_finish();
}
