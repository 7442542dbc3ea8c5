/* test_fail_maps.c -- the OS refuses memory: every allocation tier meets a failing mmap
 * through the platform layer's test hook _keel_prim_fail_maps(count) (the next `count`
 * mappings fail). Linked with the static library (keel_static), whose hidden symbols a
 * test can reach; its malloc replaces glibc's in this program.
 *
 * For each tier (small, medium, class max, large > 128 KiB, huge > 1 MiB, calloc of
 * each size tier, aligned small/large/huge):
 *   1. with every mapping failing, allocate until NULL: errno must be ENOMEM, and the
 *      blocks handed out before (from memory Keel already had) must be intact;
 *   2. exactly one failing mapping: the next allocation that needs the OS returns NULL
 *      with ENOMEM, and the one after it succeeds (recovery);
 *   3. free everything; _keel_verify() checks every invariant after each tier.
 * Plus: realloc that needs a new mapping fails with the block intact and succeeds once
 * mappings work again; a new thread whose cache cannot be created still gets blocks or
 * ENOMEM; posix_memalign reports ENOMEM through its result.
 */
#include "faults.h"

#include <pthread.h>

void _keel_prim_fail_maps(long count);
void _keel_verify(void);

static const tier_t tiers[] = {
    {"small 32 B", 32, 0, 0},
    {"small 1000 B", 1000, 0, 0},
    {"medium 40000 B", 40000, 0, 0},
    {"class max 128 KiB", 128 << 10, 0, 0},
    {"large 129 KiB", (128 << 10) + 1024, 0, 0},
    {"large 1 MiB", 1 << 20, 0, 0},
    {"huge 1 MiB + 1", (1 << 20) + 1, 0, 0},
    {"huge 7 MiB", 7 << 20, 0, 0},
    {"calloc small 200 B", 200, 0, 1},
    {"calloc large 600 KiB", 600 << 10, 0, 1},
    {"calloc huge 3 MiB", 3 << 20, 0, 1},
    {"aligned 64 B x 48", 48, 64, 0},
    {"aligned 4 KiB x 5000", 5000, 4096, 0},
    {"aligned 64 KiB x 70000", 70000, 64 << 10, 0},
    {"aligned 2 MiB x 300 KiB", 300 << 10, 2 << 20, 0},
    {"aligned 8 MiB x 3 MiB", 3 << 20, 8 << 20, 0},
};
#define NTIERS (sizeof tiers / sizeof tiers[0])
#define CAP_BYTES ((size_t)2 << 30)

typedef struct node_s {
  struct node_s* next;
  uint64_t seed;
} node_t;

static node_t* push(node_t* chain, void* p, size_t size, uint64_t seed) {
  node_t* n = (node_t*)p;
  n->next = chain;
  n->seed = seed;
  size_t body = size - sizeof *n;
  pattern_fill((char*)p + sizeof *n, body < 512 ? body : 512, seed);
  return n;
}

static size_t release(node_t* chain, size_t size) {
  size_t bad = 0;
  while (chain) {
    node_t* next = chain->next;
    size_t body = size - sizeof *chain;
    if (pattern_check((char*)chain + sizeof *chain, body < 512 ? body : 512, chain->seed) != SIZE_MAX)
      bad++;
    free(chain);
    chain = next;
  }
  return bad;
}

static void* new_thread_main(void* arg) {
  (void)arg;
  int got = 0, null_ok = 0, null_bad = 0;
  void* p[32];
  for (int i = 0; i < 32; i++) {
    errno = 0;
    p[i] = malloc((size_t)24 << (i % 14));
    if (p[i]) {
      memset(p[i], 7, 24);
      got++;
    } else if (errno == ENOMEM) {
      null_ok++;
    } else {
      null_bad++;
    }
  }
  for (int i = 0; i < 32; i++) free(p[i]);
  CHECK_MSG(null_bad == 0, "new thread under failing mmap: %d NULLs without ENOMEM", null_bad);
  printf("  new thread under failing mmap: %d blocks, %d ENOMEM\n", got, null_ok);
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  watchdog(300);
  /* A thread gets its cache after its first few dozen calls; have it before mappings
   * fail, so that every failure below is the tier's own mapping and its retry. */
  for (int i = 0; i < 1000; i++) free(malloc(32));
  printf("fail_maps: %zu tiers\n", (size_t)NTIERS);
  fflush(stdout);
  uint64_t seed = 1;

  for (size_t i = 0; i < NTIERS; i++) {
    const tier_t* t = &tiers[i];
    keel_purge(); /* empty the huge cache and release free chunks: the OS is needed */

    /* 1. Every mapping fails: allocate until NULL. */
    _keel_prim_fail_maps(1L << 40);
    node_t* chain = NULL;
    size_t n = 0, cap = CAP_BYTES / t->size + 16;
    int err = 0;
    for (;;) {
      errno = 0;
      void* p = tier_alloc(t);
      if (p == NULL) {
        err = errno;
        break;
      }
      if (t->align) EXPECT_ALIGNED(p, t->align);
      chain = push(chain, p, t->size, seed++);
      if (++n > cap) break;
    }
    _keel_prim_fail_maps(0);
    CHECK_MSG(n <= cap, "%s: never failed with every mmap failing", t->name);
    CHECK_MSG(err == ENOMEM, "%s: NULL with errno %d, expected ENOMEM", t->name, err);

    /* 2. Keel answers a failed mapping by giving back what it retains and trying once
     * more: one transient failure is absorbed, two in a row give NULL with ENOMEM. */
    _keel_prim_fail_maps(1);
    errno = 0;
    void* p0 = tier_alloc(t);
    _keel_prim_fail_maps(0);
    CHECK_MSG(p0 != NULL, "%s: one failing mmap was not absorbed by the retry", t->name);
    if (p0) chain = push(chain, p0, t->size, seed++);
    /* Use up what the retry gained, so the next call needs a new mapping again. */
    for (int i = 0; i < 100000; i++) {
      _keel_prim_fail_maps(1L << 40);
      errno = 0;
      void* q = tier_alloc(t);
      _keel_prim_fail_maps(0);
      if (q == NULL) break;
      chain = push(chain, q, t->size, seed++);
    }
    /* Two failures in a row (the mapping and its retry): NULL with ENOMEM. Blocks the
     * reclaim freed up may serve a few more calls first. */
    void* p1 = NULL;
    int err1 = 0;
    for (int i = 0; i < 100000; i++) {
      _keel_prim_fail_maps(2);
      errno = 0;
      p1 = tier_alloc(t);
      err1 = errno;
      _keel_prim_fail_maps(0);
      if (p1 == NULL) break;
      chain = push(chain, p1, t->size, seed++);
    }
    CHECK_MSG(p1 == NULL && err1 == ENOMEM,
              "%s: with memory exhausted and two failing mmaps: %p, errno %d", t->name, p1, err1);
    if (p1) chain = push(chain, p1, t->size, seed++);
    errno = 0;
    void* p2 = tier_alloc(t);
    if (CHECK_MSG(p2 != NULL, "%s: no recovery after the failing mmap (errno %d)", t->name, errno)) {
      if (t->align) EXPECT_ALIGNED(p2, t->align);
      if (t->calloc_) CHECK(first_nonzero(p2, t->size) == SIZE_MAX);
      chain = push(chain, p2, t->size, seed++);
    }

    /* 3. Free everything; the structures are consistent. */
    size_t bad = release(chain, t->size);
    CHECK_MSG(bad == 0, "%s: %zu blocks corrupted", t->name, bad);
    _keel_verify();
    printf("  %-26s %6zu blocks from memory Keel had, then ENOMEM; recovered\n", t->name, n);
  }

  /* realloc that needs a new mapping. */
  keel_purge();
  {
    unsigned char* p = (unsigned char*)malloc(100);
    CHECK(p != NULL);
    pattern_fill(p, 100, 4242);
    _keel_prim_fail_maps(1L << 40);
    errno = 0;
    void* q = realloc(p, 5 << 20);
    int err = errno;
    _keel_prim_fail_maps(0);
    CHECK_MSG(q == NULL && err == ENOMEM, "realloc to 5 MiB under failing mmap: %p errno %d", q, err);
    if (q) p = (unsigned char*)q;
    CHECK(pattern_check(p, 100, 4242) == SIZE_MAX);
    q = realloc(p, 5 << 20);
    if (CHECK(q != NULL)) {
      CHECK(pattern_check(q, 100, 4242) == SIZE_MAX);
      p = (unsigned char*)q;
    }
    free(p);
  }
  /* posix_memalign reports ENOMEM through its result and leaves *out alone. */
  keel_purge();
  {
    void* out = (void*)0x1;
    _keel_prim_fail_maps(1L << 40);
    int rc = posix_memalign(&out, 1 << 22, 9 << 20);
    _keel_prim_fail_maps(0);
    CHECK_MSG(rc == ENOMEM && out == (void*)0x1, "posix_memalign under failing mmap: rc %d", rc);
  }
  /* A thread born while the OS refuses memory. */
  {
    pthread_t th;
    keel_purge();
    if (CHECK(pthread_create(&th, NULL, new_thread_main, NULL) == 0)) {
      /* The thread's stack is mapped by pthread_create (not Keel): fail Keel's maps
       * from now on; the thread waits for nothing, so this races with its first
       * allocations, which is the point. */
      _keel_prim_fail_maps(1L << 40);
      pthread_join(th, NULL);
      _keel_prim_fail_maps(0);
    }
  }
  _keel_verify();
  return test_finish();
}
