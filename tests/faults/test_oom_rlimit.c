/* test_oom_rlimit.c -- out of memory for real: RLIMIT_AS caps the address space.
 *
 * For each allocation tier (small, small calloc, medium, large > 128 KiB, huge > 1 MiB,
 * and aligned small/large/huge), with the limit set HEADROOM above what the process
 * already maps:
 *   1. allocate until the allocator returns NULL (touching every block), and check
 *      errno == ENOMEM (posix_memalign: its result), and that a good share of the
 *      headroom was usable;
 *   2. while memory is exhausted: realloc that cannot grow returns NULL with ENOMEM and
 *      leaves the block intact; calloc/malloc overflow fail cleanly; a thread that makes
 *      its first allocation now (its cache cannot be created, or its class is empty)
 *      gets NULL/ENOMEM or a block, never a crash;
 *   3. free everything, and every tier allocates again under the same limit.
 * Every tier is exhausted in turn in the same process, so memory one tier freed must be
 * reusable by the next (Keel keeps freed memory committed for its purge delay).
 *
 * Linked with libkeel.so (malloc is Keel's). Environment: KEEL_FAULTS_HEADROOM_MB
 * (default 256).
 */
#include "faults.h"

#include <pthread.h>

static size_t headroom;

static const tier_t tiers[] = {
    {"small 48 B", 48, 0, 0},
    {"small calloc 4000 B", 4000, 0, 1},
    {"medium 20000 B", 20000, 0, 0},
    {"large 300 KiB", 300 << 10, 0, 0},
    {"huge 3 MiB", 3 << 20, 0, 0},
    {"huge calloc 5 MiB", 5 << 20, 0, 1},
    {"aligned 256 B x 100", 100, 256, 0},
    {"aligned 64 KiB x 1000", 1000, 64 << 10, 0},
    {"aligned 1 MiB x 200 KiB", 200 << 10, 1 << 20, 0},
    {"aligned 4 MiB x 2 MiB", 2 << 20, 4 << 20, 0},
};
#define NTIERS (sizeof tiers / sizeof tiers[0])

/* A thread that waits until memory is exhausted, then makes its first allocations. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int go, late_done, late_got, late_null, late_bad_errno;

static void* late_thread(void* arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  while (!go) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  void* got[64];
  int n = 0;
  for (int i = 0; i < 64; i++) {
    errno = 0;
    void* p = malloc((size_t)16 << (i % 12));
    if (p) {
      memset(p, 0x5a, 16);
      got[n++] = p;
      late_got++;
    } else {
      late_null++;
      if (errno != ENOMEM) late_bad_errno++;
    }
  }
  for (int i = 0; i < n; i++) free(got[i]);
  pthread_mutex_lock(&mu);
  late_done = 1;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  return NULL;
}

/* Exhausts memory with tier t; returns the chain of blocks (linked through word 0). */
static void** exhaust(const tier_t* t, size_t* count, size_t* usable, int* bad_errno) {
  void** chain = NULL;
  size_t n = 0, u = 0, cap = (4 * headroom) / (t->size < 16 ? 16 : t->size) + 1000;
  *bad_errno = 0;
  for (;;) {
    errno = 0;
    void** p = (void**)tier_alloc(t);
    if (p == NULL) {
      if (errno != ENOMEM) *bad_errno = errno ? errno : -1;
      break;
    }
    if (t->align && ((uintptr_t)p % t->align) != 0) *bad_errno = -2;
    /* Touch the block: first word links the chain, last byte is written. */
    p[0] = chain;
    ((unsigned char*)p)[t->size - 1] = 0xa5;
    chain = p;
    u += malloc_usable_size(p);
    if (++n > cap) break; /* the limit is not working: reported by the caller */
  }
  *count = n;
  *usable = u;
  return chain;
}

static void free_chain(void** chain, const tier_t* t) {
  while (chain) {
    void** next = (void**)chain[0];
    CHECK(((unsigned char*)chain)[t->size - 1] == 0xa5);
    free(chain);
    chain = next;
  }
}

int main(void) {
  assert_keel_in_use();
  watchdog(300);
  const char* h = getenv("KEEL_FAULTS_HEADROOM_MB");
  headroom = (size_t)(h ? atol(h) : 256) << 20;

  /* Allocate stdio's buffers now, before memory runs out. */
  printf("oom: headroom %zu MiB above the current address space\n", headroom >> 20);
  fflush(stdout);

  pthread_t late;
  CHECK(pthread_create(&late, NULL, late_thread, NULL) == 0);

  struct rlimit old;
  CHECK(getrlimit(RLIMIT_AS, &old) == 0);
  size_t base = vm_bytes();
  struct rlimit lim = {base + headroom, old.rlim_max};
  if (!CHECK(setrlimit(RLIMIT_AS, &lim) == 0)) return test_finish();

  char line[160 * NTIERS];
  size_t used = 0;
  for (size_t i = 0; i < NTIERS; i++) {
    const tier_t* t = &tiers[i];
    size_t n, bytes;
    int bad;
    void** chain = exhaust(t, &n, &bytes, &bad);
    CHECK_MSG(bad == 0, "%s: NULL with errno %d (expected ENOMEM) or misaligned (-2)", t->name, bad);
    CHECK_MSG(n <= (4 * headroom) / (t->size < 16 ? 16 : t->size) + 1000,
              "%s: allocation never failed: is RLIMIT_AS in force?", t->name);
    CHECK_MSG(n > 0, "%s: not even one block", t->name);
    /* At least half of the headroom must be usable (malloc_usable_size) by every
     * unaligned tier, whatever the tiers before it allocated and freed: memory freed by
     * one tier must serve the next. (Aligned tiers waste the gaps between aligned
     * blocks, in glibc too; they need only allocate and fail cleanly.) */
    if (t->align == 0)
      CHECK_MSG(bytes >= headroom / 2, "%s: only %zu MiB of %zu MiB headroom usable", t->name,
                bytes >> 20, headroom >> 20);

    if (i == 0) {
      /* While exhausted: realloc that cannot grow, overflows, a late thread. */
      void* keep = chain ? (void*)chain : NULL;
      errno = 0;
      void* q = realloc(keep, headroom); /* cannot fit */
      CHECK_MSG(q == NULL && errno == ENOMEM, "realloc beyond the limit: %p errno %d", q, errno);
      if (q) chain = (void**)q;
      CHECK(((unsigned char*)chain)[t->size - 1] == 0xa5); /* old block untouched */
      errno = 0;
      CHECK(calloc(opaque_size(SIZE_MAX / 2), 4) == NULL && errno == ENOMEM);
      errno = 0;
      CHECK(malloc(opaque_size(SIZE_MAX - 4096)) == NULL && errno == ENOMEM);
      pthread_mutex_lock(&mu);
      go = 1;
      pthread_cond_broadcast(&cv);
      while (!late_done) pthread_cond_wait(&cv, &mu);
      pthread_mutex_unlock(&mu);
      CHECK_MSG(late_bad_errno == 0, "late thread: %d NULLs without ENOMEM", late_bad_errno);
    }
    free_chain(chain, t);
    used += (size_t)snprintf(line + used, sizeof line - used, "  %-26s %9zu blocks, %4zu MiB usable\n",
                             t->name, n, bytes >> 20);
  }
  pthread_join(late, NULL);

  /* Everything is free: every tier allocates again, under the same limit. */
  size_t again_ok = 0;
  for (size_t i = 0; i < NTIERS; i++) {
    void* p[8];
    int ok = 1;
    for (int k = 0; k < 8; k++) {
      errno = 0;
      p[k] = tier_alloc(&tiers[i]);
      if (!CHECK_MSG(p[k] != NULL, "after freeing everything, %s failed (errno %d)",
                     tiers[i].name, errno))
        ok = 0;
      else
        memset(p[k], 1, tiers[i].size);
    }
    for (int k = 0; k < 8; k++) free(p[k]);
    again_ok += ok;
  }
  /* And the whole headroom once more, with the first tier. */
  size_t n2, u2;
  int bad2;
  void** chain2 = exhaust(&tiers[0], &n2, &u2, &bad2);
  CHECK_MSG(u2 >= headroom / 2, "second exhaustion: only %zu MiB", u2 >> 20);
  free_chain(chain2, &tiers[0]);

  CHECK(setrlimit(RLIMIT_AS, &old) == 0);
  fputs(line, stdout);
  printf("oom: late thread got %d blocks and %d NULLs; %zu/%zu tiers allocate again after "
         "freeing; second exhaustion %zu MiB\n",
         late_got, late_null, again_ok, (size_t)NTIERS, u2 >> 20);
  printf("late thread NULL count %d (ENOMEM expected for each)\n", late_null);
  return test_finish();
}
