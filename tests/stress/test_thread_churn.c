/* test_thread_churn.c -- many short-lived threads.
 *
 * NTHREADS (10,000 * KEEL_STRESS_SCALE) threads are created in batches of BATCH live at a
 * time. Each allocates a few blocks of assorted sizes, fills them, frees some itself and
 * passes the rest to one long-lived collector thread, which verifies and frees them after
 * the allocating thread may well have exited. At the end:
 *   - every block was verified intact and freed;
 *   - (Keel) `threads`, the number of live thread caches, is small (< 100): the caches
 *     of exited threads were reclaimed, not leaked;
 *   - (Keel) `allocated` is back to its starting value;
 *   - RSS stayed bounded (< 64 MiB), and did not keep growing in the second half.
 */
#include "test.h"

#include <malloc.h>
#include <pthread.h>

#define NTHREADS 10000
#define BATCH 8
#define QCAP 65536
#define RSS_LIMIT ((size_t)64 << 20)

typedef struct {
  unsigned char* p;
  size_t n;
  uint64_t seed;
  int owner;
} blk_t;

/* Collector queue: a mutex-protected ring with a condition variable. */
static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t qspace = PTHREAD_COND_INITIALIZER;
static blk_t queue[QCAP];
static size_t qhead, qcount;
static int qdone;
static long collected, passed_total, self_freed;

static void push(const blk_t* b) {
  pthread_mutex_lock(&qmu);
  while (qcount == QCAP) pthread_cond_wait(&qspace, &qmu);
  queue[(qhead + qcount) % QCAP] = *b;
  qcount++;
  passed_total++;
  pthread_cond_signal(&qcv);
  pthread_mutex_unlock(&qmu);
}

static void check_and_free(blk_t* b, const char* who) {
  size_t off = pattern_check(b->p, b->n, b->seed);
  CHECK_MSG(off == SIZE_MAX, "%s: block %p (%zu bytes) of thread %d corrupted at offset %zu",
            who, (void*)b->p, b->n, b->owner, off);
  CHECK_MSG(malloc_usable_size(b->p) >= b->n, "%s: usable size of %p (%zu bytes, thread %d) is %zu",
            who, (void*)b->p, b->n, b->owner, malloc_usable_size(b->p));
  free(b->p);
}

static void* collector(void* arg) {
  (void)arg;
  static blk_t got[1024];
  for (;;) {
    pthread_mutex_lock(&qmu);
    while (qcount == 0 && !qdone) pthread_cond_wait(&qcv, &qmu);
    if (qcount == 0 && qdone) {
      pthread_mutex_unlock(&qmu);
      break;
    }
    size_t n = qcount < 1024 ? qcount : 1024;
    for (size_t i = 0; i < n; i++) got[i] = queue[(qhead + i) % QCAP];
    qhead = (qhead + n) % QCAP;
    qcount -= n;
    pthread_cond_broadcast(&qspace);
    pthread_mutex_unlock(&qmu);
    for (size_t i = 0; i < n; i++) check_and_free(&got[i], "collector");
    collected += (long)n;
  }
  return NULL;
}

static void* short_lived(void* arg) {
  int id = (int)(intptr_t)arg;
  t_rng r;
  rng_seed(&r, (uint64_t)id * 2654435761u + 1);
  /* A few fixed sizes across the size ranges, plus random small ones. */
  size_t fixed[] = {16, 100, 1000, 5000, 40000, id % 16 == 0 ? (size_t)300000 : 2000};
  enum { NF = sizeof fixed / sizeof *fixed, NR = 14, N = NF + NR };
  blk_t b[N];
  long mine = 0;
  for (int i = 0; i < N; i++) {
    size_t n = i < NF ? fixed[i] : (size_t)rng_range(&r, 1, 512);
    b[i].p = (unsigned char*)malloc(n);
    if (!CHECK_MSG(b[i].p != NULL, "thread %d: malloc(%zu) failed", id, n)) {
      b[i].n = 0;
      continue;
    }
    b[i].n = n;
    b[i].seed = mix64((uint64_t)id << 8 | (uint64_t)i);
    b[i].owner = id;
    pattern_fill(b[i].p, n, b[i].seed);
  }
  for (int i = 0; i < N; i++) {
    if (!b[i].p) continue;
    if (rng_next(&r) % 2) {
      check_and_free(&b[i], "owner");
      mine++;
    } else {
      push(&b[i]);
    }
  }
  __atomic_fetch_add(&self_freed, mine, __ATOMIC_RELAXED);
  /* Exit with a cache that still holds freed blocks: the exit path must reclaim it. */
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  int total = (int)(NTHREADS * stress_scale());
  if (total < 100) total = 100;
#ifdef KEEL_TESTING_KEEL
  keel_stats_t s0 = keel_stats_now();
#endif
  pthread_t col;
  if (!CHECK(pthread_create(&col, NULL, collector, NULL) == 0)) return test_finish();

  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 128 << 10);

  double t0 = now_sec();
  size_t rss_start = rss_bytes(), rss_half = 0, rss_peak = rss_start;
  int created = 0;
#ifdef KEEL_TESTING_KEEL
  uint64_t max_live_caches = 0;
#endif
  while (created < total) {
    pthread_t th[BATCH];
    int k = 0;
    for (; k < BATCH && created < total; k++, created++) {
      int rc = pthread_create(&th[k], &attr, short_lived, (void*)(intptr_t)created);
      if (!CHECK_MSG(rc == 0, "pthread_create #%d: %s", created, strerror(rc))) break;
    }
    for (int i = 0; i < k; i++) pthread_join(th[i], NULL);
    if (k < BATCH && created < total) break; /* creation failed */
    if ((created / BATCH) % 64 == 0) {
      size_t rss = rss_bytes();
      if (rss > rss_peak) rss_peak = rss;
      if (!rss_half && created >= total / 2) rss_half = rss;
#ifdef KEEL_TESTING_KEEL
      keel_stats_t s = keel_stats_now();
      if (s.threads > max_live_caches) max_live_caches = s.threads;
#endif
    }
  }
  pthread_attr_destroy(&attr);

  pthread_mutex_lock(&qmu);
  qdone = 1;
  pthread_cond_broadcast(&qcv);
  pthread_mutex_unlock(&qmu);
  pthread_join(col, NULL);
  double t1 = now_sec();

  EXPECT_EQ_I(created, total);
  EXPECT_EQ_I(collected, passed_total);
  CHECK(passed_total > 0 && self_freed > 0);
  size_t rss_end = rss_bytes();
  if (rss_end > rss_peak) rss_peak = rss_end;
  printf("%d threads in %.2f s; blocks freed by owner %ld, by collector %ld; RSS start %zu KiB, "
         "half %zu KiB, end %zu KiB, peak %zu KiB\n",
         created, t1 - t0, self_freed, collected, rss_start >> 10, rss_half >> 10, rss_end >> 10,
         rss_peak >> 10);
  CHECK_MSG(rss_peak < RSS_LIMIT, "RSS peaked at %zu KiB (limit %zu KiB)", rss_peak >> 10,
            RSS_LIMIT >> 10);
  /* No steady growth per thread: the second half may not add more than 16 MiB. */
  CHECK_MSG(rss_end <= rss_half + ((size_t)16 << 20),
            "RSS grew from %zu KiB at half-time to %zu KiB at the end", rss_half >> 10,
            rss_end >> 10);

#ifdef KEEL_TESTING_KEEL
  keel_stats_t s1 = keel_stats_now();
  printf("keel: threads %" PRIu64 " (max seen %" PRIu64 "), threads_total %" PRIu64
         " -> %" PRIu64 ", allocated %" PRIu64 " -> %" PRIu64 ", metadata %" PRIu64
         " -> %" PRIu64 "\n",
         s1.threads, max_live_caches, s0.threads_total, s1.threads_total, s0.allocated,
         s1.allocated, s0.metadata, s1.metadata);
  CHECK_MSG(s1.threads < 100, "%" PRIu64 " live thread caches after %d threads exited",
            s1.threads, created);
  CHECK_MSG(max_live_caches < 100, "up to %" PRIu64 " live thread caches with <= %d live threads",
            max_live_caches, BATCH + 2);
  CHECK_MSG(s1.allocated <= s0.allocated + ((uint64_t)1 << 20),
            "allocated %" PRIu64 " -> %" PRIu64 " although every block was freed", s0.allocated,
            s1.allocated);
  /* Per-thread bookkeeping must be recycled too, not accumulate with every thread. */
  CHECK_MSG(s1.metadata <= s0.metadata + ((uint64_t)16 << 20),
            "metadata grew %" PRIu64 " -> %" PRIu64, s0.metadata, s1.metadata);
#endif
  return test_finish();
}
