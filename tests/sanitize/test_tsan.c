/* test_tsan.c -- many threads through every entry point of a KEEL_PREFIX build, for
 * ThreadSanitizer.
 *
 * Built only in a tree configured with -DKEEL_PREFIX=ON (scripts/sanitize.sh tsan uses
 * -DKEEL_SANITIZE=thread as well): TSan's runtime owns malloc, so this program calls
 * keel_malloc, keel_free, ... directly, and Keel's own code is instrumented. Any data
 * race inside Keel (its thread caches, central lists, page heap, huge table, purger
 * thread, statistics) is reported by TSan; with TSAN_OPTIONS=halt_on_error=1 the first
 * report fails the test. The harness's own checks verify every block's contents, so a
 * lost update shows up even where TSan sees no race.
 *
 * What runs at once:
 *   - NWORKERS workers allocate through every API (malloc, calloc, realloc,
 *     reallocarray, posix_memalign, aligned_alloc, memalign, valloc, pvalloc), check
 *     alignment and usable size, fill a pattern, and hand blocks to each other through
 *     mutex-protected inboxes; the receiver verifies, then frees (keel_free, free_sized,
 *     free_aligned_sized), reallocs and keeps, or passes it on;
 *   - a churn loop in main starts short-lived threads that allocate, give blocks to the
 *     workers and exit (their caches are flushed while the blocks are freed elsewhere);
 *   - a statistics thread calls keel_stats_get, keel_stats_print, keel_purge and
 *     keel_thread_flush;
 *   - Keel's background purger thread (KEEL_PURGE_DELAY short) returns memory.
 * Before that, a borrowing phase: two threads take holes of a fragmented larger class
 * (borrow.c) while a third allocates and frees in that class.
 *
 * Environment: KEEL_STRESS_SCALE (default 1) scales the operation counts.
 */
#include "test.h"

#include <keel.h>
#include <pthread.h>

#include "keel_prefix.h"

#define NWORKERS 4
#define SLOTS 48
#define INBOX 256
#define CHURN_BLOCKS 24

typedef struct {
  unsigned char* p;
  size_t n;      /* requested size */
  size_t align;  /* alignment asked for (16 = none) */
  uint64_t seed; /* pattern seed */
  int how;       /* how it was allocated (for the matching free_* call) */
} blk_t;

enum { HOW_PLAIN, HOW_ALIGNED };

typedef struct {
  pthread_mutex_t mu;
  blk_t q[INBOX];
  int head, count;
} inbox_t;

static inbox_t inbox[NWORKERS];
static long ops_per_worker;
static volatile int stop_all;
static long stat_calls, churn_threads, xfrees, xreallocs;

/* Big blocks get a pattern at both ends only: TSan makes every byte access costly. */
#define EDGE 2048
static void fill(const blk_t* b) {
  if (b->n <= 2 * EDGE) {
    pattern_fill(b->p, b->n, b->seed);
  } else {
    pattern_fill(b->p, EDGE, b->seed);
    pattern_fill(b->p + b->n - EDGE, EDGE, b->seed ^ 0x5555);
  }
}
static int verify(const blk_t* b, size_t n, const char* when) {
  size_t off;
  if (n <= 2 * EDGE || b->n <= 2 * EDGE) {
    size_t m = n < b->n ? n : b->n;
    if (b->n > 2 * EDGE && m > EDGE) m = EDGE;
    off = pattern_check(b->p, m, b->seed);
  } else {
    off = pattern_check(b->p, EDGE, b->seed);
    if (off == SIZE_MAX && n >= b->n) {
      size_t t = pattern_check(b->p + b->n - EDGE, EDGE, b->seed ^ 0x5555);
      if (t != SIZE_MAX) off = b->n - EDGE + t;
    }
  }
  return CHECK_MSG(off == SIZE_MAX, "%s: block %p (%zu bytes, align %zu) differs at offset %zu",
                   when, (void*)b->p, b->n, b->align, off);
}

static size_t pick_size(t_rng* r) { return rng_tier_size(r, 1000, 880, 980, 996, 1, 3 << 20); }

static size_t pick_align(t_rng* r) {
  static const size_t al[] = {8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192, 65536, 1 << 20};
  return al[rng_next(r) % (sizeof al / sizeof al[0])];
}

/* Allocates b through one of the API calls; returns 0 on failure (reported). */
static int alloc_blk(blk_t* b, t_rng* r) {
  size_t n = pick_size(r);
  size_t align = 16;
  int how = HOW_PLAIN;
  void* p = NULL;
  switch (rng_next(r) % 10) {
    case 0: {
      size_t cnt = (size_t)rng_range(r, 1, 16);
      n = n / cnt + 1;
      p = keel_calloc(cnt, n);
      n *= cnt;
      if (p) CHECK_MSG(first_nonzero(p, n < 4096 ? n : 4096) == SIZE_MAX, "calloc(%zu) not zeroed", n);
      break;
    }
    case 1:
      align = pick_align(r);
      if (align < 16) align = 16;
      if (keel_posix_memalign(&p, align, n) != 0) p = NULL;
      how = HOW_ALIGNED;
      break;
    case 2:
      align = pick_align(r);
      if (align < 16) align = 16;
      p = keel_aligned_alloc(align, n);
      how = HOW_ALIGNED;
      break;
    case 3:
      align = pick_align(r);
      if (align < 16) align = 16;
      p = keel_memalign(align, n);
      how = HOW_ALIGNED;
      break;
    case 4:
      align = 4096;
      p = rng_next(r) & 1 ? keel_valloc(n) : keel_pvalloc(n);
      how = HOW_ALIGNED;
      break;
    case 5: {
      size_t cnt = (size_t)rng_range(r, 1, 8);
      n = n / cnt + 1;
      p = keel_reallocarray(NULL, cnt, n);
      n *= cnt;
      break;
    }
    default:
      p = keel_malloc(n);
      break;
  }
  if (!CHECK_MSG(p != NULL, "allocation of %zu bytes (align %zu) failed", n, align)) return 0;
  EXPECT_ALIGNED(p, align);
  EXPECT_GE_U(keel_malloc_usable_size(p), n);
  b->p = (unsigned char*)p;
  b->n = n;
  b->align = align;
  b->how = how;
  b->seed = rng_next(r);
  fill(b);
  return 1;
}

static void free_blk(blk_t* b, t_rng* r) {
  verify(b, b->n, "before free");
  switch (rng_next(r) % 3) {
    case 0:
      keel_free(b->p);
      break;
    case 1:
      if (b->how == HOW_ALIGNED) keel_free_aligned_sized(b->p, b->align, b->n);
      else keel_free_sized(b->p, b->n);
      break;
    default:
      if (rng_next(r) & 1) keel_free(b->p);
      else keel_realloc(b->p, 0); /* glibc semantics: frees, returns NULL */
      break;
  }
  b->p = NULL;
}

static void realloc_blk(blk_t* b, t_rng* r) {
  verify(b, b->n, "before realloc");
  size_t n = rng_next(r) % 4 == 0 ? pick_size(r) : (size_t)rng_range(r, 1, b->n * 2 + 16);
  unsigned char* q = (unsigned char*)keel_realloc(b->p, n);
  if (!CHECK_MSG(q != NULL, "realloc(%zu -> %zu) failed", b->n, n)) return;
  EXPECT_ALIGNED(q, 16);
  EXPECT_GE_U(keel_malloc_usable_size(q), n);
  blk_t nb = *b;
  nb.p = q;
  /* The preserved prefix still carries the old pattern. */
  verify(&nb, n, "after realloc");
  nb.n = n;
  nb.align = 16;
  nb.how = HOW_PLAIN;
  nb.seed = rng_next(r);
  fill(&nb);
  *b = nb;
}

/* Hands b to worker `to`; returns 0 if its inbox is full (b stays ours). */
static int send_blk(blk_t* b, int to) {
  inbox_t* ib = &inbox[to];
  int ok = 0;
  pthread_mutex_lock(&ib->mu);
  if (ib->count < INBOX) {
    ib->q[(ib->head + ib->count) % INBOX] = *b;
    ib->count++;
    ok = 1;
  }
  pthread_mutex_unlock(&ib->mu);
  if (ok) b->p = NULL;
  return ok;
}

static int recv_blk(int me, blk_t* out) {
  inbox_t* ib = &inbox[me];
  int ok = 0;
  pthread_mutex_lock(&ib->mu);
  if (ib->count > 0) {
    *out = ib->q[ib->head];
    ib->head = (ib->head + 1) % INBOX;
    ib->count--;
    ok = 1;
  }
  pthread_mutex_unlock(&ib->mu);
  return ok;
}

static void* worker(void* arg) {
  int me = (int)(intptr_t)arg;
  t_rng r;
  rng_seed(&r, 1000 + (uint64_t)me);
  blk_t own[SLOTS];
  memset(own, 0, sizeof own);
  long local_xfree = 0, local_xrealloc = 0;
  for (long op = 0; op < ops_per_worker; op++) {
    /* Blocks from other threads first: verify, then free, realloc or keep. */
    blk_t in;
    for (int k = 0; k < 4 && recv_blk(me, &in); k++) {
      uint64_t u = rng_next(&r) % 10;
      if (u < 6) {
        free_blk(&in, &r);
        local_xfree++;
      } else {
        if (u < 9) {
          realloc_blk(&in, &r);
          local_xrealloc++;
        } else {
          verify(&in, in.n, "received");
        }
        blk_t* s = &own[rng_next(&r) % SLOTS];
        if (s->p) free_blk(s, &r);
        *s = in;
      }
    }
    blk_t* b = &own[rng_next(&r) % SLOTS];
    uint64_t u = rng_next(&r) % 100;
    if (b->p == NULL) {
      alloc_blk(b, &r);
    } else if (u < 40) {
      int to = (me + 1 + (int)(rng_next(&r) % (NWORKERS - 1))) % NWORKERS;
      if (!send_blk(b, to)) free_blk(b, &r);
    } else if (u < 60) {
      realloc_blk(b, &r);
    } else if (u < 62) {
      keel_thread_flush();
    } else {
      free_blk(b, &r);
    }
  }
  for (int i = 0; i < SLOTS; i++)
    if (own[i].p) free_blk(&own[i], &r);
  __atomic_fetch_add(&xfrees, local_xfree, __ATOMIC_RELAXED);
  __atomic_fetch_add(&xreallocs, local_xrealloc, __ATOMIC_RELAXED);
  return NULL;
}

/* A thread that lives briefly: allocates, gives some blocks away, frees the rest, exits
 * while others are still freeing what it allocated. */
static void* short_lived(void* arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  t_rng r;
  rng_seed(&r, seed);
  blk_t b[CHURN_BLOCKS];
  for (int i = 0; i < CHURN_BLOCKS; i++) {
    b[i].p = NULL;
    alloc_blk(&b[i], &r);
  }
  for (int i = 0; i < CHURN_BLOCKS; i++) {
    if (!b[i].p) continue;
    if (i % 2 == 0 && send_blk(&b[i], (int)(rng_next(&r) % NWORKERS))) continue;
    free_blk(&b[i], &r);
  }
  return NULL;
}

static void* stats_thread(void* arg) {
  (void)arg;
  long n = 0;
  int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  while (!__atomic_load_n(&stop_all, __ATOMIC_ACQUIRE)) {
    keel_stats_t s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    CHECK(keel_stats_get(&s) == 0);
    if (n % 8 == 0 && devnull >= 0) keel_stats_print(devnull);
    if (n % 16 == 0) keel_purge();
    void* p = keel_malloc(64);
    keel_free(p);
    if (n % 4 == 0) keel_thread_flush();
    n++;
    usleep(2000);
  }
  if (devnull >= 0) close(devnull);
  __atomic_store_n(&stat_calls, n, __ATOMIC_RELAXED);
  return NULL;
}

/* Borrowing: blocks of 1,500 bytes from the holes of the 2,000-byte class, taken by two
 * threads at once while a third uses the lender's own blocks. */
enum { LENDER_BLOCKS = 2048, BORROWS = 512 };
static void* lender_blocks[LENDER_BLOCKS];

static void* borrower(void* arg) {
  (void)arg;
  static _Thread_local void* got[BORROWS];
  for (int i = 0; i < BORROWS; i++) {
    got[i] = keel_malloc(1500);
    CHECK(got[i] != NULL && keel_malloc_usable_size(got[i]) >= 1500);
    if (got[i]) memset(got[i], 0x5a, 1500);
  }
  for (int i = 0; i < BORROWS; i++) keel_free(got[i]);
  return NULL;
}

static void* lender_user(void* arg) {
  (void)arg;
  for (int i = 0; i < 4 * BORROWS; i++) {
    void* p = keel_malloc(2000);
    CHECK(p != NULL);
    if (p) memset(p, 0xa5, 2000);
    keel_free(p);
  }
  return NULL;
}

/* A counter of keel_stats_json, by its key with quotes and colon. */
static unsigned long long json_count(const char* key) {
  char json[32 * 1024];
  keel_stats_json(json, sizeof json);
  const char* at = strstr(json, key);
  return at ? strtoull(at + strlen(key), NULL, 10) : 0;
}

/* n blocks of `size`, three in four freed again: holes beside live blocks, back in their
 * slabs, and a purger tick later (borrowing and carving need its clock). */
static void make_holes(void** blocks, int n, size_t size) {
  for (int i = 0; i < n; i++) blocks[i] = keel_malloc(size);
  for (int i = 0; i < n; i++)
    if (i % 4 != 0) {
      keel_free(blocks[i]);
      blocks[i] = NULL;
    }
  keel_thread_flush();
  usleep(100 * 1000);
}

static void borrow_phase(void) {
  make_holes(lender_blocks, LENDER_BLOCKS, 2000);
  unsigned long long before = json_count("\"borrowed_blocks\":");
  pthread_t t[3];
  CHECK(pthread_create(&t[0], NULL, borrower, NULL) == 0);
  CHECK(pthread_create(&t[1], NULL, borrower, NULL) == 0);
  CHECK(pthread_create(&t[2], NULL, lender_user, NULL) == 0);
  for (int k = 0; k < 3; k++) pthread_join(t[k], NULL);
  unsigned long long lent = json_count("\"borrowed_blocks\":") - before;
  printf("tsan: borrowing phase: %llu blocks lent\n", lent);
  CHECK(lent > 0);
  for (int i = 0; i < LENDER_BLOCKS; i++) keel_free(lender_blocks[i]);
}

/* Carving: blocks of 48 bytes carved out of the holes of the 704-byte class by two
 * threads, each freeing half of what the other took, while a third uses the lender's
 * own blocks (their frees take the slow path of a carved slab). */
enum { CARVE_LENDERS = 2048, CARVES = 1024 };
static void* carve_lender_blocks[CARVE_LENDERS];
static void* carved[2][CARVES];
static pthread_barrier_t carve_barrier;
static unsigned long long carved_at_barrier;

static void* carver(void* arg) {
  int me = (int)(intptr_t)arg;
  for (int i = 0; i < CARVES; i++) {
    carved[me][i] = keel_malloc(40);
    CHECK(carved[me][i] != NULL && keel_malloc_usable_size(carved[me][i]) == 48);
    if (carved[me][i]) memset(carved[me][i], 0x30 + me, 40);
  }
  if (pthread_barrier_wait(&carve_barrier) == PTHREAD_BARRIER_SERIAL_THREAD)
    __atomic_store_n(&carved_at_barrier, json_count("\"carved_holes\":"), __ATOMIC_RELAXED);
  pthread_barrier_wait(&carve_barrier); /* counted before any is freed */
  /* Mine with even indexes, the other's with odd ones. */
  for (int i = 0; i < CARVES; i++) {
    void* p = carved[i % 2 == 0 ? me : 1 - me][i];
    const unsigned char* c = p;
    CHECK(c[0] == 0x30 + (i % 2 == 0 ? me : 1 - me) && c[39] == c[0]);
    keel_free(p);
  }
  return NULL;
}

static void* carve_lender_user(void* arg) {
  (void)arg;
  for (int i = 0; i < CARVE_LENDERS; i += 4) { /* the live ones, freed and taken again */
    keel_free(carve_lender_blocks[i]);
    carve_lender_blocks[i] = keel_malloc(700);
    CHECK(carve_lender_blocks[i] != NULL);
  }
  return NULL;
}

static void carve_phase(void) {
  make_holes(carve_lender_blocks, CARVE_LENDERS, 700);
  pthread_barrier_init(&carve_barrier, NULL, 2);
  pthread_t t[3];
  CHECK(pthread_create(&t[0], NULL, carver, (void*)(intptr_t)0) == 0);
  CHECK(pthread_create(&t[1], NULL, carver, (void*)(intptr_t)1) == 0);
  CHECK(pthread_create(&t[2], NULL, carve_lender_user, NULL) == 0);
  for (int k = 0; k < 3; k++) pthread_join(t[k], NULL);
  pthread_barrier_destroy(&carve_barrier);
  unsigned long long left = json_count("\"carved_holes\":");
  printf("tsan: carving phase: %llu holes carved, %llu left after the frees\n", carved_at_barrier, left);
  CHECK(carved_at_barrier > 0 && left == 0);
  for (int i = 0; i < CARVE_LENDERS; i += 4) keel_free(carve_lender_blocks[i]);
}

int main(void) {
  double scale = stress_scale();
  ops_per_worker = (long)(20000 * scale);
  if (ops_per_worker < 500) ops_per_worker = 500;
  int churn_total = (int)(200 * scale);
  if (churn_total < 20) churn_total = 20;
  printf("tsan: %d workers x %ld ops, %d short-lived threads (KEEL_STRESS_SCALE=%g)\n", NWORKERS,
         ops_per_worker, churn_total, scale);
  fflush(stdout);
  double t0 = now_sec();

  /* The first allocation initialises Keel in this thread. */
  void* first = keel_malloc(1);
  CHECK(first != NULL);
  keel_free(first);
  borrow_phase();
  carve_phase();

  for (int i = 0; i < NWORKERS; i++) pthread_mutex_init(&inbox[i].mu, NULL);
  pthread_t w[NWORKERS], st;
  CHECK(pthread_create(&st, NULL, stats_thread, NULL) == 0);
  for (int i = 0; i < NWORKERS; i++)
    CHECK(pthread_create(&w[i], NULL, worker, (void*)(intptr_t)i) == 0);
  for (int i = 0; i < churn_total; i++) {
    pthread_t t[4];
    for (int k = 0; k < 4; k++)
      CHECK(pthread_create(&t[k], NULL, short_lived, (void*)(uintptr_t)(i * 4 + k + 1)) == 0);
    for (int k = 0; k < 4; k++) pthread_join(t[k], NULL);
    churn_threads += 4;
  }
  for (int i = 0; i < NWORKERS; i++) pthread_join(w[i], NULL);
  __atomic_store_n(&stop_all, 1, __ATOMIC_RELEASE);
  pthread_join(st, NULL);

  /* Whatever is still in the inboxes. */
  t_rng r;
  rng_seed(&r, 99);
  long left = 0;
  for (int i = 0; i < NWORKERS; i++) {
    blk_t b;
    while (recv_blk(i, &b)) {
      free_blk(&b, &r);
      left++;
    }
  }
  keel_purge();
  keel_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  CHECK(keel_stats_get(&s) == 0);
  printf("tsan: %.1f s; %ld cross-thread frees, %ld cross-thread reallocs, %ld churn threads, "
         "%ld stats calls, %ld left in inboxes; keel allocated %llu bytes at the end, "
         "threads_total %llu\n",
         now_sec() - t0, xfrees, xreallocs, churn_threads, stat_calls, left,
         (unsigned long long)s.allocated, (unsigned long long)s.threads_total);
  /* Everything was freed: only what the caches hold may remain counted. */
  EXPECT_LT_U(s.allocated, (uint64_t)1 << 20);
  return test_finish();
}
