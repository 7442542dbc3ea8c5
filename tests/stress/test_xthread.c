/* test_xthread.c -- multi-threaded stress with cross-thread frees.
 *
 * NTHREADS workers allocate blocks of random sizes (mostly 8..1024 bytes, some up to
 * 256 KiB, a few up to 4 MiB) with malloc/calloc/posix_memalign, fill each across its whole
 * usable size with a pattern derived from (address, size, owner, counter), and then either
 * free it themselves, realloc it, or hand it to another worker through that worker's
 * mutex-protected inbox. Whoever frees (or reallocs) a block first verifies every byte of
 * it, so a block handed out twice, overlapping blocks, or a realloc that loses data shows
 * up as a pattern mismatch naming the block, its owner and the verifying thread.
 *
 * Runtime is bounded: OPS_PER_THREAD * KEEL_STRESS_SCALE operations per worker, and a
 * deadline of 10 s * KEEL_STRESS_SCALE after which workers stop early (still a pass).
 * Environment: KEEL_STRESS_SCALE (default 1), KEEL_STRESS_THREADS (default 8).
 */
#include "test.h"

#include <malloc.h>
#include <pthread.h>

#define MAX_THREADS 64
#define SLOTS 256
#define INBOX_CAP 2048
#define OPS_PER_THREAD 50000

typedef struct {
  unsigned char* p;
  size_t req;      /* requested size: what realloc must preserve */
  size_t len;      /* bytes filled with the pattern: the usable size at fill time */
  uint64_t seed;
  uint32_t owner;  /* thread that allocated (or last realloc'd) it */
} blk_t;

typedef struct {
  pthread_mutex_t mu;
  size_t head, count;
  blk_t ring[INBOX_CAP];
  long received, overflowed;
} inbox_t;

static int nthreads;
static long ops_per_thread;
static double deadline;
static inbox_t inbox[MAX_THREADS];
static pthread_barrier_t barrier;

static struct {
  long allocs, frees, reallocs, sent, remote_frees, remote_reallocs, big;
} totals;

static uint64_t block_seed(const void* p, size_t n, uint32_t owner, uint64_t counter) {
  return mix64((uintptr_t)p ^ ((uint64_t)n << 20) ^ ((uint64_t)owner << 56) ^ (counter * 0x9E37));
}

/* Verifies a block completely; returns 1 if intact. */
static int verify(const blk_t* b, int me, const char* when) {
  size_t us = malloc_usable_size(b->p);
  int ok = CHECK_MSG(us >= b->len,
                     "thread %d (%s): block %p from thread %u: usable size %zu < %zu filled", me,
                     when, (void*)b->p, b->owner, us, b->len);
  size_t off = pattern_check(b->p, b->len, b->seed);
  ok &= CHECK_MSG(off == SIZE_MAX,
                  "thread %d (%s): block %p (req %zu, filled %zu) from thread %u corrupted at "
                  "offset %zu: 0x%02x",
                  me, when, (void*)b->p, b->req, b->len, b->owner, off,
                  off == SIZE_MAX ? 0 : b->p[off]);
  return ok;
}

static size_t pick_size(t_rng* r, long* big) {
  uint64_t u = rng_next(r) % 1000;
  if (u < 900) return (size_t)rng_range(r, 8, 1024);
  if (u < 990) return (size_t)rng_range(r, 1025, 64 << 10);
  if (u < 998) return (size_t)rng_range(r, (64 << 10) + 1, 256 << 10);
  (*big)++;
  return (size_t)rng_range(r, (256 << 10) + 1, 4 << 20);
}

/* b becomes block p (n bytes requested) of thread me, filled with its pattern; what
 * prefixes the call in the message ("" or "realloc "). */
static void own_block(blk_t* b, unsigned char* p, size_t n, int me, uint64_t counter,
                      const char* what) {
  b->p = p;
  b->req = n;
  b->len = malloc_usable_size(p);
  if (b->len < n) {
    CHECK_MSG(0, "thread %d: %susable size %zu < %zu", me, what, b->len, n);
    b->len = n;
  }
  b->owner = (uint32_t)me;
  b->seed = block_seed(p, n, (uint32_t)me, counter);
  pattern_fill(p, b->len, b->seed);
}

static int new_block(blk_t* b, t_rng* r, int me, uint64_t counter, long* big) {
  size_t n = pick_size(r, big);
  uint64_t how = rng_next(r) % 100;
  unsigned char* p;
  if (how < 5) {
    p = (unsigned char*)calloc(1, n);
    if (p) {
      size_t nz = first_nonzero(p, n);
      CHECK_MSG(nz == SIZE_MAX, "thread %d: calloc(1, %zu) = %p byte %zu non-zero", me, n,
                (void*)p, nz);
    }
  } else if (how < 8) {
    size_t align = (size_t)16 << rng_range(r, 0, 8); /* 16 .. 4096 */
    void* q = NULL;
    int rc = posix_memalign(&q, align, n);
    CHECK_MSG(rc == 0, "thread %d: posix_memalign(%zu, %zu) = %d", me, align, n, rc);
    p = (unsigned char*)q;
    if (p) CHECK_MSG((uintptr_t)p % align == 0, "thread %d: posix_memalign(%zu) = %p", me, align,
                     (void*)p);
  } else {
    p = (unsigned char*)malloc(n);
  }
  if (!CHECK_MSG(p != NULL, "thread %d: allocation of %zu bytes failed", me, n)) {
    b->p = NULL;
    return 0;
  }
  CHECK_MSG((uintptr_t)p % 16 == 0, "thread %d: %p (size %zu) not 16-aligned", me, (void*)p, n);
  own_block(b, p, n, me, counter, "");
  return 1;
}

static void verify_free(blk_t* b, int me, const char* when) {
  verify(b, me, when);
  free(b->p);
  b->p = NULL;
}

/* realloc keeps min(old req, new req) bytes; then the block is refilled for its new size. */
static void do_realloc(blk_t* b, t_rng* r, int me, uint64_t counter, long* big,
                       const char* when) {
  verify(b, me, when);
  size_t n = pick_size(r, big);
  unsigned char* q = (unsigned char*)realloc(b->p, n);
  if (!CHECK_MSG(q != NULL, "thread %d: realloc(%p, %zu) failed", me, (void*)b->p, n)) {
    return; /* b->p is still valid */
  }
  size_t keep = b->req < n ? b->req : n;
  size_t off = pattern_check(q, keep, b->seed);
  CHECK_MSG(off == SIZE_MAX,
            "thread %d (%s): realloc %zu -> %zu (%p -> %p, owner %u) lost data at offset %zu", me,
            when, b->req, n, (void*)b->p, (void*)q, b->owner, off);
  CHECK_MSG((uintptr_t)q % 16 == 0, "thread %d: realloc result %p not 16-aligned", me, (void*)q);
  own_block(b, q, n, me, counter, "realloc ");
}

/* Hands b to thread `to`; if its inbox is full, frees b here instead. */
static int send_block(blk_t* b, int to) {
  inbox_t* in = &inbox[to];
  pthread_mutex_lock(&in->mu);
  int ok = in->count < INBOX_CAP;
  if (ok) {
    in->ring[(in->head + in->count) % INBOX_CAP] = *b;
    in->count++;
    in->received++;
  } else {
    in->overflowed++;
  }
  pthread_mutex_unlock(&in->mu);
  if (ok) b->p = NULL;
  return ok;
}

/* Takes everything out of my inbox (under the lock), then verifies and frees or reallocs
 * each block (outside it). */
static void drain(int me, t_rng* r, uint64_t* counter, long* remote_frees,
                  long* remote_reallocs, long* big) {
  static __thread blk_t got[INBOX_CAP];
  inbox_t* in = &inbox[me];
  pthread_mutex_lock(&in->mu);
  size_t n = in->count;
  for (size_t i = 0; i < n; i++) got[i] = in->ring[(in->head + i) % INBOX_CAP];
  in->head = (in->head + n) % INBOX_CAP;
  in->count = 0;
  pthread_mutex_unlock(&in->mu);
  for (size_t i = 0; i < n; i++) {
    if (r && rng_next(r) % 8 == 0) {
      /* realloc of a block another thread allocated, then free it */
      do_realloc(&got[i], r, me, ++*counter, big, "remote realloc");
      (*remote_reallocs)++;
    }
    verify_free(&got[i], me, "remote free");
    (*remote_frees)++;
  }
}

static void* worker(void* arg) {
  int me = (int)(intptr_t)arg;
  t_rng r;
  rng_seed(&r, 1000 + (uint64_t)me);
  blk_t slots[SLOTS];
  memset(slots, 0, sizeof slots);
  uint64_t counter = 0;
  long allocs = 0, frees = 0, reallocs = 0, sent = 0, remote_frees = 0, remote_reallocs = 0,
       big = 0;

  pthread_barrier_wait(&barrier);
  for (long op = 0; op < ops_per_thread; op++) {
    if ((op & 1023) == 0 && now_sec() > deadline) break;
    int s = (int)(rng_next(&r) % SLOTS);
    blk_t* b = &slots[s];
    uint64_t what = rng_next(&r) % 100;
    if (what < 40 || b->p == NULL) {
      if (b->p) {
        verify_free(b, me, "local free (replace)");
        frees++;
      }
      allocs += new_block(b, &r, me, ++counter, &big);
    } else if (what < 55) {
      do_realloc(b, &r, me, ++counter, &big, "local realloc");
      reallocs++;
    } else if (what < 75) {
      verify_free(b, me, "local free");
      frees++;
    } else {
      int to = (int)(rng_next(&r) % (uint64_t)(nthreads - 1));
      if (to >= me) to++;
      if (send_block(b, to)) {
        sent++;
      } else {
        verify_free(b, me, "local free (inbox full)");
        frees++;
      }
    }
    if ((op & 31) == 0) drain(me, &r, &counter, &remote_frees, &remote_reallocs, &big);
  }
  /* Everyone stops sending before anyone drains for the last time. */
  pthread_barrier_wait(&barrier);
  for (int s = 0; s < SLOTS; s++)
    if (slots[s].p) {
      verify_free(&slots[s], me, "final local free");
      frees++;
    }
  pthread_barrier_wait(&barrier);
  drain(me, NULL, &counter, &remote_frees, &remote_reallocs, &big);

  __atomic_fetch_add(&totals.allocs, allocs, __ATOMIC_RELAXED);
  __atomic_fetch_add(&totals.frees, frees, __ATOMIC_RELAXED);
  __atomic_fetch_add(&totals.reallocs, reallocs, __ATOMIC_RELAXED);
  __atomic_fetch_add(&totals.sent, sent, __ATOMIC_RELAXED);
  __atomic_fetch_add(&totals.remote_frees, remote_frees, __ATOMIC_RELAXED);
  __atomic_fetch_add(&totals.remote_reallocs, remote_reallocs, __ATOMIC_RELAXED);
  __atomic_fetch_add(&totals.big, big, __ATOMIC_RELAXED);
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  double scale = stress_scale();
  const char* env = getenv("KEEL_STRESS_THREADS");
  nthreads = env ? atoi(env) : 8;
  if (nthreads < 2) nthreads = 2;
  if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
  ops_per_thread = (long)(OPS_PER_THREAD * scale);
  if (ops_per_thread < 1000) ops_per_thread = 1000;
  double t0 = now_sec();
  deadline = t0 + 10.0 * scale;
  printf("threads %d, ops/thread %ld, deadline %.1f s\n", nthreads, ops_per_thread,
         10.0 * scale);
  fflush(stdout);

#ifdef KEEL_TESTING_KEEL
  keel_stats_t before = keel_stats_now();
#endif
  for (int i = 0; i < nthreads; i++) pthread_mutex_init(&inbox[i].mu, NULL);
  pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
  pthread_t th[MAX_THREADS];
  for (int i = 0; i < nthreads; i++)
    CHECK(pthread_create(&th[i], NULL, worker, (void*)(intptr_t)i) == 0);
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
  double t1 = now_sec();

  long received = 0, overflowed = 0;
  for (int i = 0; i < nthreads; i++) {
    EXPECT_EQ_U(inbox[i].count, 0);
    received += inbox[i].received;
    overflowed += inbox[i].overflowed;
  }
  /* Every block handed over was freed by its receiver. */
  EXPECT_EQ_I(totals.sent, received);
  EXPECT_EQ_I(totals.remote_frees, received);
  /* Every block allocated was freed exactly once (locally or remotely). */
  EXPECT_EQ_I(totals.allocs, totals.frees + totals.remote_frees);
  CHECK(totals.sent > 0);
  printf("%.2f s: allocs %ld, local frees %ld, reallocs %ld, sent %ld (inbox full %ld), "
         "remote frees %ld, remote reallocs %ld, blocks > 256 KiB %ld\n",
         t1 - t0, totals.allocs, totals.frees, totals.reallocs, totals.sent, overflowed,
         totals.remote_frees, totals.remote_reallocs, totals.big);

#ifdef KEEL_TESTING_KEEL
  /* Everything was freed: live bytes are back where they started (slack for stdio). */
  keel_stats_t after = keel_stats_now();
  CHECK_MSG(after.allocated <= before.allocated + ((uint64_t)1 << 20),
            "allocated %" PRIu64 " before, %" PRIu64 " after all blocks were freed",
            before.allocated, after.allocated);
  printf("keel: threads %" PRIu64 ", threads_total %" PRIu64 ", mapped %" PRIu64
         ", committed %" PRIu64 "\n",
         after.threads, after.threads_total, after.mapped, after.committed);
#endif
  return test_finish();
}
