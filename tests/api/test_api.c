/* test_api.c -- conformance of Keel's C allocation API with glibc 2.36 (Debian 12).
 *
 * Every check here encodes what glibc itself does: the file builds and passes without
 * Keel too (no KEEL_TESTING_KEEL), which is how the expectations were validated:
 *
 *   gcc -O1 -fno-builtin -D_GNU_SOURCE -Itests/harness tests/api/test_api.c -o /tmp/t && /tmp/t
 *
 * glibc 2.36 facts this file relies on (each confirmed by running it against glibc):
 *  - malloc results are 16-byte aligned for every size, malloc(0) is a unique pointer.
 *  - realloc(p, 0) frees p and returns NULL; realloc(NULL, 0) behaves as malloc(0).
 *  - aligned_alloc is an alias of memalign: it accepts any alignment, rounding a
 *    non-power-of-two up to the next power of two, and alignment 0 means malloc.
 *    (glibc >= 2.38 makes aligned_alloc(3, n) fail with EINVAL; Keel targets 2.36.)
 *  - memalign/aligned_alloc with alignment > SIZE_MAX/2+1: NULL, errno EINVAL.
 *  - posix_memalign with a bad alignment returns EINVAL, leaves *memptr and errno alone.
 *  - mallopt returns 1 for every parameter number it does not know (no default case in
 *    glibc's switch); known parameters with in-range values also return 1.
 *  - malloc_info(options != 0, fp) returns EINVAL and writes nothing.
 */
#include "test.h"

#include <limits.h>
#include <malloc.h>
#include <sys/stat.h>

/* C23 sized frees: glibc 2.36's headers lack them (glibc gained them in 2.41). Against
 * Keel they must exist; against glibc they are weak, so the checks are skipped. */
#ifdef KEEL_TESTING_KEEL
void free_sized(void* p, size_t size);
void free_aligned_sized(void* p, size_t alignment, size_t size);
#else
extern void free_sized(void* p, size_t size) __attribute__((weak));
extern void free_aligned_sized(void* p, size_t alignment, size_t size) __attribute__((weak));
#endif

static size_t page_size;

/* ------------------------------------------------------------------ helpers --- */

/* The checks every block from malloc/calloc/realloc must pass. Returns whether p is
 * non-NULL (i.e. the caller owns a block, even if another check failed). */
static int check_block(const char* fn, void* p, size_t n, size_t align) {
  if (!CHECK_MSG(p != NULL, "%s(%zu) returned NULL", fn, n)) return 0;
  size_t us = malloc_usable_size(p);
  CHECK_MSG(us >= n, "%s(%zu): malloc_usable_size %zu < request", fn, n, us);
  CHECK_MSG((uintptr_t)p % align == 0, "%s(%zu) = %p not %zu-aligned", fn, n, p, align);
  return 1;
}

/* Allocates k blocks of size n with alloc_fn, fills each across its whole usable size with
 * its own pattern, then verifies all of them: a block that overlaps a neighbour, or a
 * usable size that reaches into someone else's memory, shows up as a pattern mismatch. */
#define GROUP_MAX 16
static void group_test(size_t n, int k) {
  void* p[GROUP_MAX];
  size_t us[GROUP_MAX];
  if (k > GROUP_MAX) k = GROUP_MAX;
  for (int i = 0; i < k; i++) {
    p[i] = malloc(opaque_size(n));
    us[i] = 0;
    if (!check_block("malloc", p[i], n, 16)) continue;
    us[i] = malloc_usable_size(p[i]);
    /* Sanity bound: a usable size wildly beyond the request means a wrong size lookup. */
    size_t bound = n < ((size_t)1 << 20) ? 2 * n + 64 : n + n / 4 + ((size_t)2 << 20);
    CHECK_MSG(us[i] <= bound, "malloc(%zu): usable size %zu implausibly large", n, us[i]);
    pattern_fill(p[i], us[i], mix64((uintptr_t)p[i] ^ n ^ (uint64_t)i));
  }
  for (int i = 0; i < k; i++) {
    if (!p[i]) continue;
    size_t bad = pattern_check(p[i], us[i], mix64((uintptr_t)p[i] ^ n ^ (uint64_t)i));
    CHECK_MSG(bad == SIZE_MAX, "malloc(%zu) block %d (%p, usable %zu) corrupted at offset %zu",
              n, i, p[i], us[i], bad);
  }
  for (int i = 0; i < k; i++) free(p[i]);
}

/* Page growth of the resident set while running fn: used to prove that a "free" entry
 * point really releases memory (a no-op free would leak what the loop touches). */
static size_t rss_growth(void (*fn)(void)) {
  malloc_trim(0);
  size_t before = rss_bytes();
  fn();
  malloc_trim(0);
  size_t after = rss_bytes();
  return after > before ? after - before : 0;
}
#define LEAK_ITERS 20000
#define LEAK_SIZE 1024 /* 20000 x 1 KiB: a leak would grow RSS by ~20 MiB */
#define LEAK_LIMIT ((size_t)8 << 20)

/* ---------------------------------------------------------------- malloc --- */

static void test_malloc_zero(void) {
  TEST_SECTION("malloc(0)");
  enum { N = 1000 };
  static void* p[N];
  for (int i = 0; i < N; i++) {
    p[i] = malloc(opaque_size(0));
    check_block("malloc", p[i], 0, 16);
  }
  /* All distinct (sort-free O(N^2) is fine for 1000). */
  int dup = 0;
  for (int i = 0; i < N && !dup; i++)
    for (int j = i + 1; j < N; j++)
      if (p[i] && p[i] == p[j]) {
        dup = 1;
        CHECK_MSG(0, "malloc(0) returned %p twice (#%d and #%d)", p[i], i, j);
        break;
      }
  CHECK(!dup);
  for (int i = 0; i < N; i++) free(p[i]);
  /* malloc(0) again after frees still works, and the block is freeable. */
  void* q = malloc(opaque_size(0));
  CHECK(q != NULL);
  free(q);
}

static void test_free_null(void) {
  TEST_SECTION("free(NULL), malloc_usable_size(NULL)");
  errno = 1234;
  free(opaque_ptr(NULL));
  EXPECT_EQ_I(errno, 1234);
  EXPECT_EQ_U(malloc_usable_size(opaque_ptr(NULL)), 0);
  CHECK(1); /* reached: free(NULL) did not crash */
}

static void test_malloc_small_medium(void) {
  TEST_SECTION("malloc sizes 0..70000 (every size up to 1100, then steps), neighbours");
  for (size_t n = 0; n <= 1100; n++) group_test(n, 8);
  for (size_t n = 1100; n <= 70000; n += 61) group_test(n, 4);
  /* Around every power of two and every multiple of 4 KiB up to 70000. */
  for (size_t b = 16; b <= 70000; b *= 2)
    for (size_t d = 0; d < 3; d++) group_test(b - 1 + d, 4);
  for (size_t b = 4096; b <= 70000; b += 4096)
    for (size_t d = 0; d < 3; d++) group_test(b - 1 + d, 4);
}

static void test_malloc_large(void) {
  TEST_SECTION("malloc sizes 64 KiB .. 64 MiB");
  for (size_t b = (size_t)64 << 10; b <= (size_t)64 << 20; b *= 2) {
    if (b <= ((size_t)4 << 20)) {
      size_t ds[] = {b - 4097, b - 1, b, b + 1, b + 4095, b + 4097, b + b / 2};
      for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) group_test(ds[i], 3);
    } else {
      group_test(b, 2);
      group_test(b + 1, 2);
    }
  }
}

/* Many live blocks of random sizes (log-distributed up to 128 KiB), replaced at random:
 * blocks of different size classes next to each other, verified when freed. */
static void test_malloc_random_mix(void) {
  TEST_SECTION("malloc random mix of live blocks");
  enum { SLOTS = 512, OPS = 20000 };
  static void* p[SLOTS];
  static size_t sz[SLOTS];
  static uint64_t seed[SLOTS];
  t_rng r;
  rng_seed(&r, 42);
  long bad = 0;
  for (int op = 0; op < OPS; op++) {
    int i = (int)(rng_next(&r) % SLOTS);
    if (p[i]) {
      size_t off = pattern_check(p[i], sz[i], seed[i]);
      if (off != SIZE_MAX && bad++ < 5)
        CHECK_MSG(0, "block %p size %zu corrupted at offset %zu", p[i], sz[i], off);
      free(p[i]);
    }
    size_t n = (size_t)1 << rng_range(&r, 0, 16);
    n = n + rng_next(&r) % n;
    p[i] = malloc(opaque_size(n));
    sz[i] = 0;
    if (!check_block("malloc", p[i], n, 16)) continue;
    sz[i] = malloc_usable_size(p[i]);
    seed[i] = rng_next(&r);
    pattern_fill(p[i], sz[i], seed[i]);
  }
  for (int i = 0; i < SLOTS; i++) {
    if (!p[i]) continue;
    size_t off = pattern_check(p[i], sz[i], seed[i]);
    if (off != SIZE_MAX && bad++ < 5)
      CHECK_MSG(0, "block %p size %zu corrupted at offset %zu", p[i], sz[i], off);
    free(p[i]);
    p[i] = NULL;
  }
  EXPECT_EQ_I(bad, 0);
}

static void test_malloc_impossible(void) {
  TEST_SECTION("malloc of impossible sizes");
  size_t sizes[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 4096, (size_t)PTRDIFF_MAX + 1,
                    (size_t)PTRDIFF_MAX, (size_t)PTRDIFF_MAX - 4096, SIZE_MAX / 2 + 4097};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    errno = 0;
    void* p = malloc(opaque_size(sizes[i]));
    CHECK_MSG(p == NULL, "malloc(%zu) = %p", sizes[i], p);
    CHECK_MSG(errno == ENOMEM, "malloc(%zu): errno %d, want ENOMEM", sizes[i], errno);
    if (p) free(p);
  }
  /* Still usable afterwards. */
  void* q = malloc(opaque_size(100));
  check_block("malloc", q, 100, 16);
  free(q);
}

/* ---------------------------------------------------------------- calloc --- */

static void test_calloc(void) {
  TEST_SECTION("calloc zeroing, dirty reuse, overflow");
  /* Fresh memory. */
  for (size_t n = 0; n <= 5000; n += 7) {
    char* p = (char*)calloc(1, opaque_size(n));
    if (!check_block("calloc", p, n, 16)) continue;
    size_t nz = first_nonzero(p, n);
    CHECK_MSG(nz == SIZE_MAX, "calloc(1, %zu): byte %zu non-zero", n, nz);
    memset(p, 0x5C, n);
    free(p);
  }
  /* Reuse of dirty memory: malloc, write 0xAA everywhere, free, calloc the same size. */
  size_t sizes[] = {1,     8,      16,     24,     32,      48,      64,      100,
                    128,   200,    256,    512,    1000,    1024,    2000,    4096,
                    5000,  8192,   16384,  20000,  32768,   65536,   100000,  131072,
                    262144, 300000, 1 << 20, (1 << 20) + 1, 2 << 20, 4 << 20, 8 << 20,
                    (16 << 20) + 12345, 32 << 20};
  enum { K = 8 };
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    size_t n = sizes[si];
    int k = n >= ((size_t)1 << 20) ? 2 : K;
    void* p[K];
    for (int i = 0; i < k; i++) {
      p[i] = malloc(opaque_size(n));
      if (p[i]) memset(p[i], 0xAA, malloc_usable_size(p[i]));
    }
    for (int i = k - 1; i >= 0; i--) free(p[i]);
    for (int i = 0; i < k; i++) {
      p[i] = calloc(opaque_size(n), 1);
      if (!check_block("calloc", p[i], n, 16)) continue;
      size_t nz = first_nonzero(p[i], n);
      CHECK_MSG(nz == SIZE_MAX, "calloc(%zu, 1) after dirty free: byte %zu is 0x%02x", n, nz,
                nz == SIZE_MAX ? 0 : ((unsigned char*)p[i])[nz]);
      memset(p[i], 0xAA, malloc_usable_size(p[i]));
    }
    for (int i = 0; i < k; i++) free(p[i]);
  }
  /* nmemb * size combinations, including the same total split differently. */
  size_t dims[][2] = {{0, 0}, {0, 1}, {1, 0}, {0, SIZE_MAX}, {SIZE_MAX, 0}, {3, 7},
                      {7, 3}, {1000, 33}, {33, 1000}, {4096, 16}, {100, 3000}};
  for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
    size_t a = dims[i][0], b = dims[i][1];
    errno = 0;
    char* p = (char*)calloc(opaque_size(a), opaque_size(b));
    if (!CHECK_MSG(p != NULL, "calloc(%zu, %zu) = NULL errno %d", a, b, errno)) continue;
    size_t n = a * b;
    EXPECT_GE_U(malloc_usable_size(p), n);
    size_t nz = first_nonzero(p, n);
    CHECK_MSG(nz == SIZE_MAX, "calloc(%zu, %zu): byte %zu non-zero", a, b, nz);
    free(p);
  }
  /* Overflowing or impossible products: NULL with ENOMEM. */
  size_t bad[][2] = {{SIZE_MAX / 2 + 1, 2},
                     {2, SIZE_MAX / 2 + 1},
                     {SIZE_MAX, SIZE_MAX},
                     {(size_t)1 << 32, (size_t)1 << 32},
                     {SIZE_MAX, 1},
                     {1, SIZE_MAX},
                     {(size_t)PTRDIFF_MAX / 2 + 1, 2},
                     {((size_t)1 << 61) + 1, 8} /* product wraps to 8 */,
                     {((size_t)1 << 32) + 1, (size_t)1 << 32} /* wraps to 4 GiB */};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    errno = 0;
    void* p = calloc(opaque_size(bad[i][0]), opaque_size(bad[i][1]));
    CHECK_MSG(p == NULL, "calloc(%zu, %zu) = %p, want NULL", bad[i][0], bad[i][1], p);
    CHECK_MSG(errno == ENOMEM, "calloc(%zu, %zu): errno %d, want ENOMEM", bad[i][0], bad[i][1],
              errno);
    if (p) free(p);
  }
}

/* --------------------------------------------------------------- realloc --- */

static void realloc_step(char** pp, size_t* cur, uint64_t* seed, size_t n, const char* what) {
  char* p = *pp;
  char* q = (char*)realloc(p, opaque_size(n));
  if (!check_block("realloc", q, n, 16)) {
    /* p is still valid after a failed realloc: keep it. */
    return;
  }
  size_t keep = *cur < n ? *cur : n;
  size_t off = pattern_check(q, keep, *seed);
  CHECK_MSG(off == SIZE_MAX, "%s: realloc %zu -> %zu (%p -> %p) lost contents at offset %zu",
            what, *cur, n, (void*)p, (void*)q, off);
  *seed = mix64(*seed + n);
  pattern_fill(q, n, *seed);
  *pp = q;
  *cur = n;
}

static void test_realloc(void) {
  TEST_SECTION("realloc");
  /* realloc(NULL, n) is malloc(n). */
  size_t ns[] = {0, 1, 100, 5000, 300000, (size_t)8 << 20};
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
    char* p = (char*)realloc(opaque_ptr(NULL), opaque_size(ns[i]));
    if (check_block("realloc(NULL)", p, ns[i], 16)) memset(p, 1, ns[i]);
    free(p);
  }
  /* realloc(p, 0) frees p and returns NULL (glibc: REALLOC_ZERO_BYTES_FREES). */
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
    char* p = (char*)malloc(opaque_size(ns[i] + 1));
    errno = 0;
    void* q = realloc(p, opaque_size(0));
    CHECK_MSG(q == NULL, "realloc(malloc(%zu), 0) = %p, want NULL", ns[i] + 1, q);
    EXPECT_EQ_I(errno, 0);
    if (q) free(q);
  }

  /* Contents preserved across every size range, up and down the ladder. */
  size_t ladder[] = {16,      24,      100,     128,     512,     1000,    2048,
                     4000,    8192,    20000,   65536,   100000,  262144,  300000,
                     1 << 20, (2 << 20) + 1, 4 << 20, (16 << 20) + 5, 64 << 20};
  size_t nl = sizeof ladder / sizeof *ladder;
  char* p = (char*)malloc(opaque_size(1));
  size_t cur = 1;
  uint64_t seed = 7;
  pattern_fill(p, 1, seed);
  for (size_t i = 0; i < nl; i++) realloc_step(&p, &cur, &seed, ladder[i], "ladder up");
  for (size_t i = nl; i-- > 0;) realloc_step(&p, &cur, &seed, ladder[i], "ladder down");
  /* Jumps between the extremes. */
  for (size_t i = 0; i < nl; i++) {
    realloc_step(&p, &cur, &seed, ladder[nl - 1 - i], "jump");
    realloc_step(&p, &cur, &seed, ladder[i], "jump");
  }
  /* Same size, and +-1 around the current size. */
  realloc_step(&p, &cur, &seed, cur, "same size");
  realloc_step(&p, &cur, &seed, cur + 1, "+1");
  realloc_step(&p, &cur, &seed, cur - 1, "-1");
  free(p);

  /* Growing a byte-ish at a time, then shrinking the same way (in-place paths). */
  t_rng r;
  rng_seed(&r, 99);
  p = (char*)malloc(opaque_size(1));
  cur = 1;
  seed = 11;
  pattern_fill(p, 1, seed);
  while (cur < 70000) realloc_step(&p, &cur, &seed, cur + rng_range(&r, 1, 97), "grow");
  while (cur > 100) realloc_step(&p, &cur, &seed, cur - rng_range(&r, 1, 97), "shrink");
  free(p);

  /* Random walk with a second live block next to it. */
  p = (char*)malloc(opaque_size(10));
  cur = 10;
  seed = 12;
  pattern_fill(p, 10, seed);
  char* other = (char*)malloc(opaque_size(10));
  size_t ocur = 10;
  uint64_t oseed = 13;
  pattern_fill(other, 10, oseed);
  for (int i = 0; i < 3000; i++) {
    size_t n = (size_t)1 << rng_range(&r, 0, 20);
    n += rng_next(&r) % n;
    if (i & 1)
      realloc_step(&p, &cur, &seed, n, "walk");
    else
      realloc_step(&other, &ocur, &oseed, n / 3 + 1, "walk (other)");
  }
  free(p);
  free(other);

  /* A block from memalign keeps its contents through realloc. */
  p = (char*)memalign(4096, opaque_size(100));
  CHECK(p != NULL);
  if (p) {
    cur = 100;
    seed = 14;
    pattern_fill(p, 100, seed);
    realloc_step(&p, &cur, &seed, 10000, "memalign block grow");
    realloc_step(&p, &cur, &seed, 50, "memalign block shrink");
    free(p);
  }

  /* Impossible sizes: NULL, ENOMEM, the old block untouched and still valid. */
  size_t from[] = {32, 5000, 300000, (size_t)8 << 20};
  size_t impossible[] = {SIZE_MAX, SIZE_MAX - 15, (size_t)PTRDIFF_MAX + 1, (size_t)PTRDIFF_MAX};
  for (size_t i = 0; i < sizeof from / sizeof *from; i++) {
    for (size_t j = 0; j < sizeof impossible / sizeof *impossible; j++) {
      char* b = (char*)malloc(opaque_size(from[i]));
      if (!CHECK(b != NULL)) continue;
      pattern_fill(b, from[i], 77 + i);
      errno = 0;
      void* q = realloc(opaque_ptr(b), opaque_size(impossible[j]));
      CHECK_MSG(q == NULL, "realloc(malloc(%zu), %zu) = %p, want NULL", from[i],
                impossible[j], q);
      CHECK_MSG(errno == ENOMEM, "realloc(malloc(%zu), %zu): errno %d, want ENOMEM", from[i],
                impossible[j], errno);
      size_t off = pattern_check(b, from[i], 77 + i);
      CHECK_MSG(off == SIZE_MAX, "failed realloc(%zu -> %zu) damaged the block at offset %zu",
                from[i], impossible[j], off);
      /* Still a valid heap block: it can grow and be freed. */
      char* c = (char*)realloc(b, opaque_size(from[i] * 2));
      if (CHECK(c != NULL)) {
        off = pattern_check(c, from[i], 77 + i);
        CHECK(off == SIZE_MAX);
        b = c;
      }
      free(b);
    }
  }
}

/* Big blocks built from several freed ones: freed mappings of mixed sizes are reused
 * for the next big request whatever their sizes (Keel moves their pages into one
 * block), so calloc must still see zeros everywhere and realloc must keep every byte,
 * through growth (which may then move several mappings) and shrinking. */
static void test_big_reuse(void) {
  TEST_SECTION("big blocks reusing freed ones of other sizes: calloc zeroes, realloc keeps");
  const size_t MiB = (size_t)1 << 20;
  uint64_t rng = 12345;
  for (int round = 0; round < 12; round++) {
    void* dirty[5];
    for (int i = 0; i < 5; i++) { /* 2-9 MiB each, not page multiples */
      size_t n = 2 * MiB + (size_t)(mix64(rng + (uint64_t)i) % (7 * MiB)) + 123;
      dirty[i] = malloc(opaque_size(n));
      if (dirty[i]) memset(dirty[i], 0xAA, n);
    }
    rng = mix64(rng);
    for (int i = 0; i < 5; i++) free(dirty[i]);
    size_t n = 10 * MiB + (size_t)(rng % (20 * MiB)) + 77;
    char* z = (char*)calloc(1, opaque_size(n));
    if (!check_block("calloc", z, n, 16)) continue;
    size_t nz = first_nonzero(z, n);
    CHECK_MSG(nz == SIZE_MAX, "round %d: calloc(%zu) after freeing dirty blocks: byte %zu is 0x%02x",
              round, n, nz, nz == SIZE_MAX ? 0 : (unsigned char)z[nz]);
    uint64_t seed = rng;
    pattern_fill(z, n, seed);
    size_t cur = n;
    size_t steps[] = {cur + 9 * MiB + 4321, cur / 3 + 5, cur * 2 + 17, 3 * MiB + 1};
    for (size_t s = 0; s < sizeof steps / sizeof *steps; s++) {
      void* more = malloc(opaque_size(4 * MiB)); /* freed next: something to reuse */
      if (more) memset(more, 0x55, 4 * MiB);
      free(more);
      realloc_step(&z, &cur, &seed, steps[s], "big reuse");
    }
    free(z);
  }
}

/* A big block over memory that small blocks freed a moment ago, shrunk by realloc to a
 * small size after only its first bytes were written: the copy takes the block's second
 * word as it was. Whatever freed blocks left there, the small block is live and its free
 * is no double free. */
static void test_realloc_shrink_unwritten(void) {
  TEST_SECTION("realloc of a big block to a small one, its second word never written");
  for (size_t size = 256; size <= 8192; size *= 4) {
    enum { N = 2000 };
    static void* held[N];
    for (int i = 0; i < N; i++) held[i] = malloc(opaque_size(size));
    for (int i = 0; i < N; i++) free(held[i]);
    char* buf = (char*)malloc(opaque_size((size_t)512 << 10));
    if (!CHECK(buf != NULL)) return;
    strcpy(buf, "hello");
    buf = (char*)realloc(buf, opaque_size(64));
    if (!CHECK(buf != NULL)) return;
    CHECK(strcmp(buf, "hello") == 0);
    free(buf); /* stopped the program as a double free */
  }
}

static void test_reallocarray(void) {
  TEST_SECTION("reallocarray");
  char* p = (char*)reallocarray(opaque_ptr(NULL), opaque_size(10), opaque_size(10));
  if (!check_block("reallocarray", p, 100, 16)) return;
  pattern_fill(p, 100, 5);
  char* q = (char*)reallocarray(p, opaque_size(1000), opaque_size(10));
  if (check_block("reallocarray", q, 10000, 16)) {
    CHECK(pattern_check(q, 100, 5) == SIZE_MAX);
    p = q;
  }
  pattern_fill(p, 100, 6);
  size_t bad[][2] = {{SIZE_MAX / 2 + 1, 2}, {2, SIZE_MAX / 2 + 1}, {SIZE_MAX, SIZE_MAX},
                     {(size_t)1 << 32, (size_t)1 << 32}, {SIZE_MAX, 1}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    errno = 0;
    void* r = reallocarray(opaque_ptr(p), opaque_size(bad[i][0]), opaque_size(bad[i][1]));
    CHECK_MSG(r == NULL, "reallocarray(p, %zu, %zu) = %p", bad[i][0], bad[i][1], r);
    CHECK_MSG(errno == ENOMEM, "reallocarray(p, %zu, %zu): errno %d", bad[i][0], bad[i][1],
              errno);
    CHECK(pattern_check(p, 100, 6) == SIZE_MAX);
  }
  /* reallocarray(p, 0, n) is realloc(p, 0): frees, returns NULL. */
  void* z = reallocarray(p, opaque_size(0), opaque_size(10));
  EXPECT_EQ_P(z, NULL);
  if (z) free(z);
}

/* ---------------------------------------------------- aligned allocation --- */

typedef void* (*aligned_fn)(size_t align, size_t n);
static void* via_posix_memalign(size_t align, size_t n) {
  void* p = (void*)0x1;
  int rc = posix_memalign(&p, align, n);
  CHECK_MSG(rc == 0, "posix_memalign(%zu, %zu) = %d", align, n, rc);
  return rc == 0 ? p : NULL;
}
static void* via_aligned_alloc(size_t align, size_t n) { return aligned_alloc(align, n); }
static void* via_memalign(size_t align, size_t n) { return memalign(align, n); }

/* For each alignment, allocates blocks of sizes 1, 100, align-1, align, 3*align+5 (all
 * live at once), fills them across their usable size, verifies all, frees. */
static void aligned_sweep(const char* name, aligned_fn fn, size_t min_align) {
  for (size_t a = min_align; a <= ((size_t)4 << 20); a *= 2) {
    size_t sizes[] = {0, 1, 100, a - 1, a, 3 * a + 5};
    enum { NS = sizeof sizes / sizeof *sizes };
    void* p[NS];
    size_t us[NS];
    for (int i = 0; i < NS; i++) {
      size_t n = sizes[i];
      errno = 0;
      p[i] = fn(opaque_size(a), opaque_size(n));
      us[i] = 0;
      if (!CHECK_MSG(p[i] != NULL, "%s(%zu, %zu) = NULL errno %d", name, a, n, errno))
        continue;
      CHECK_MSG((uintptr_t)p[i] % a == 0, "%s(%zu, %zu) = %p misaligned", name, a, n, p[i]);
      us[i] = malloc_usable_size(p[i]);
      CHECK_MSG(us[i] >= n, "%s(%zu, %zu): usable %zu", name, a, n, us[i]);
      pattern_fill(p[i], us[i], a * 31 + (uint64_t)i);
    }
    for (int i = 0; i < NS; i++) {
      if (!p[i]) continue;
      size_t off = pattern_check(p[i], us[i], a * 31 + (uint64_t)i);
      CHECK_MSG(off == SIZE_MAX, "%s(%zu, %zu) block %p corrupted at %zu", name, a, sizes[i],
                p[i], off);
    }
    for (int i = 0; i < NS; i++) free(p[i]);
  }
}

static size_t next_pow2(size_t x) {
  size_t p = 1;
  while (p < x) p *= 2;
  return p;
}

static void test_posix_memalign(void) {
  TEST_SECTION("posix_memalign");
  aligned_sweep("posix_memalign", via_posix_memalign, sizeof(void*));
  /* Bad alignments: EINVAL, *memptr untouched, errno untouched. */
  size_t bad[] = {0,  1,  2,  3,  sizeof(void*) / 2, 12,  24,   40,   48, 96,
                  4097, 4096 + 8, 3 << 20, SIZE_MAX, SIZE_MAX / 2 + 2, SIZE_MAX - 7};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    void* sentinel = (void*)0x1234;
    void* p = sentinel;
    errno = 4321;
    int rc = posix_memalign(&p, opaque_size(bad[i]), opaque_size(64));
    CHECK_MSG(rc == EINVAL, "posix_memalign(align %zu) = %d, want EINVAL", bad[i], rc);
    CHECK_MSG(p == sentinel, "posix_memalign(align %zu) wrote *memptr = %p", bad[i], p);
    CHECK_MSG(errno == 4321, "posix_memalign(align %zu) changed errno to %d", bad[i], errno);
    if (rc == 0 && p != sentinel) free(p);
  }
  /* Valid alignment, impossible size: ENOMEM, *memptr untouched. */
  struct {
    size_t a, n;
  } nomem[] = {{64, SIZE_MAX},
               {4096, (size_t)PTRDIFF_MAX + 1},
               {(size_t)1 << 20, SIZE_MAX - ((size_t)1 << 19)},
               {SIZE_MAX / 2 + 1, 1}};
  for (size_t i = 0; i < sizeof nomem / sizeof *nomem; i++) {
    void* sentinel = (void*)0x1234;
    void* p = sentinel;
    int rc = posix_memalign(&p, opaque_size(nomem[i].a), opaque_size(nomem[i].n));
    CHECK_MSG(rc == ENOMEM, "posix_memalign(%zu, %zu) = %d, want ENOMEM", nomem[i].a,
              nomem[i].n, rc);
    CHECK_MSG(p == sentinel, "posix_memalign(%zu, %zu) wrote *memptr = %p", nomem[i].a,
              nomem[i].n, p);
  }
  /* Success leaves errno alone as well. */
  void* p = NULL;
  errno = 4321;
  int rc = posix_memalign(&p, 64, opaque_size(100));
  EXPECT_EQ_I(rc, 0);
  EXPECT_EQ_I(errno, 4321);
  free(p);
}

/* memalign and aligned_alloc (the same function in glibc 2.36). */
static void memalign_like(const char* name, aligned_fn fn) {
  aligned_sweep(name, fn, 1);
  /* Non-power-of-two alignments are rounded up to the next power of two. */
  size_t odd[] = {3, 5, 6, 7, 12, 17, 24, 48, 100, 1000, 4095, 4097, 65537, (1 << 20) + 1};
  for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
    size_t a = odd[i], want = next_pow2(a);
    size_t sizes[] = {1, a, 3 * a + 5};
    for (size_t j = 0; j < 3; j++) {
      errno = 0;
      void* p = fn(opaque_size(a), opaque_size(sizes[j]));
      if (!CHECK_MSG(p != NULL, "%s(%zu, %zu) = NULL errno %d (glibc 2.36 rounds the "
                                "alignment up to a power of two)",
                     name, a, sizes[j], errno))
        continue;
      CHECK_MSG((uintptr_t)p % want == 0, "%s(%zu, %zu) = %p not aligned to %zu", name, a,
                sizes[j], p, want);
      EXPECT_GE_U(malloc_usable_size(p), sizes[j]);
      memset(p, 0x3C, sizes[j]);
      free(p);
    }
  }
  /* Alignment 0 means plain malloc. */
  void* p = fn(opaque_size(0), opaque_size(100));
  if (CHECK_MSG(p != NULL, "%s(0, 100) = NULL", name)) {
    EXPECT_ALIGNED(p, 16);
    memset(p, 1, 100);
    free(p);
  }
  /* Alignment above SIZE_MAX/2+1 cannot be a power of two: NULL, EINVAL. */
  size_t inval[] = {SIZE_MAX / 2 + 2, SIZE_MAX - 1, SIZE_MAX};
  for (size_t i = 0; i < sizeof inval / sizeof *inval; i++) {
    errno = 0;
    void* q = fn(opaque_size(inval[i]), opaque_size(16));
    CHECK_MSG(q == NULL, "%s(%zu, 16) = %p, want NULL", name, inval[i], q);
    CHECK_MSG(errno == EINVAL, "%s(%zu, 16): errno %d, want EINVAL", name, inval[i], errno);
  }
  /* Impossible sizes (or alignment 2^63): NULL, ENOMEM. */
  struct {
    size_t a, n;
  } nomem[] = {{16, SIZE_MAX},
               {64, (size_t)PTRDIFF_MAX + 1},
               {4096, SIZE_MAX - 4096},
               {SIZE_MAX / 2 + 1, 1}};
  for (size_t i = 0; i < sizeof nomem / sizeof *nomem; i++) {
    errno = 0;
    void* q = fn(opaque_size(nomem[i].a), opaque_size(nomem[i].n));
    CHECK_MSG(q == NULL, "%s(%zu, %zu) = %p, want NULL", name, nomem[i].a, nomem[i].n, q);
    CHECK_MSG(errno == ENOMEM, "%s(%zu, %zu): errno %d, want ENOMEM", name, nomem[i].a,
              nomem[i].n, errno);
  }
}

static void test_memalign(void) {
  TEST_SECTION("memalign");
  memalign_like("memalign", via_memalign);
}
static void test_aligned_alloc(void) {
  TEST_SECTION("aligned_alloc (glibc 2.36: same semantics as memalign)");
  memalign_like("aligned_alloc", via_aligned_alloc);
}

static void test_valloc_pvalloc(void) {
  TEST_SECTION("valloc, pvalloc");
  size_t sizes[] = {0,        1,         100,           page_size - 1, page_size,
                    page_size + 1, 3 * page_size + 5, 100000, (1 << 20) + 3, (size_t)5 << 20};
  void* keep[2 * sizeof sizes / sizeof *sizes];
  int nk = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    void* p = valloc(opaque_size(n));
    if (CHECK_MSG(p != NULL, "valloc(%zu) = NULL", n)) {
      CHECK_MSG((uintptr_t)p % page_size == 0, "valloc(%zu) = %p not page aligned", n, p);
      EXPECT_GE_U(malloc_usable_size(p), n);
      memset(p, 0x11, malloc_usable_size(p));
      keep[nk++] = p;
    }
    void* q = pvalloc(opaque_size(n));
    if (CHECK_MSG(q != NULL, "pvalloc(%zu) = NULL", n)) {
      CHECK_MSG((uintptr_t)q % page_size == 0, "pvalloc(%zu) = %p not page aligned", n, q);
      /* pvalloc rounds the size up to a whole number of pages. (pvalloc(0): glibc gives
       * a minimal block, so nothing beyond "valid and aligned" is required there.) */
      size_t want = round_up(n, page_size);
      CHECK_MSG(malloc_usable_size(q) >= want, "pvalloc(%zu): usable %zu < %zu", n,
                malloc_usable_size(q), want);
      memset(q, 0x22, want > 0 ? want : 1);
      keep[nk++] = q;
    }
  }
  for (int i = 0; i < nk; i++) free(keep[i]);
  size_t impossible[] = {SIZE_MAX, SIZE_MAX - page_size + 2, (size_t)PTRDIFF_MAX + 1};
  for (size_t i = 0; i < sizeof impossible / sizeof *impossible; i++) {
    errno = 0;
    void* p = valloc(opaque_size(impossible[i]));
    CHECK_MSG(p == NULL && errno == ENOMEM, "valloc(%zu) = %p errno %d", impossible[i], p,
              errno);
    errno = 0;
    p = pvalloc(opaque_size(impossible[i]));
    CHECK_MSG(p == NULL && errno == ENOMEM, "pvalloc(%zu) = %p errno %d", impossible[i], p,
              errno);
  }
}

/* ----------------------------------------------------- sized frees (C23) --- */

static void loop_free_sized(void) {
  for (int i = 0; i < LEAK_ITERS; i++) {
    void* p = malloc(opaque_size(LEAK_SIZE));
    if (!p) continue;
    memset(p, 1, LEAK_SIZE);
    free_sized(p, LEAK_SIZE);
  }
}
static void loop_free_aligned_sized(void) {
  for (int i = 0; i < LEAK_ITERS; i++) {
    void* p = aligned_alloc(256, opaque_size(LEAK_SIZE));
    if (!p) continue;
    memset(p, 1, LEAK_SIZE);
    free_aligned_sized(p, 256, LEAK_SIZE);
  }
}

static void test_free_sized(void) {
  TEST_SECTION("free_sized, free_aligned_sized");
#ifndef KEEL_TESTING_KEEL
  if (!free_sized || !free_aligned_sized) {
    printf("   (skipped: this libc has no free_sized/free_aligned_sized)\n");
    return;
  }
#endif
  free_sized(opaque_ptr(NULL), 0);
  free_sized(opaque_ptr(NULL), 100);
  free_aligned_sized(opaque_ptr(NULL), 64, 0);
  size_t sizes[] = {0, 1, 15, 16, 17, 100, 1000, 4096, 5000, 70000, 300000, (size_t)8 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    void* p = malloc(opaque_size(n));
    if (CHECK(p != NULL)) {
      memset(p, 1, n);
      free_sized(p, n);
    }
    p = calloc(3, opaque_size(n));
    if (CHECK(p != NULL)) free_sized(p, 3 * n);
    p = malloc(opaque_size(n));
    void* q = realloc(p, opaque_size(2 * n + 1));
    if (CHECK(q != NULL)) free_sized(q, 2 * n + 1);
    else
      free(p);
    for (size_t a = 1; a <= ((size_t)1 << 20); a *= 4) {
      size_t m = n < a ? a : n; /* C17-style: size a multiple of the alignment is fine too */
      void* r = aligned_alloc(opaque_size(a), opaque_size(m));
      if (CHECK(r != NULL)) {
        EXPECT_ALIGNED(r, a);
        memset(r, 2, m);
        free_aligned_sized(r, a, m);
      }
    }
  }
  /* They really free: a no-op would leak ~20 MiB here. */
  size_t g = rss_growth(loop_free_sized);
  CHECK_MSG(g < LEAK_LIMIT, "free_sized loop grew RSS by %zu bytes", g);
  g = rss_growth(loop_free_aligned_sized);
  CHECK_MSG(g < LEAK_LIMIT, "free_aligned_sized loop grew RSS by %zu bytes", g);
}

static void loop_realloc_zero(void) {
  for (int i = 0; i < LEAK_ITERS; i++) {
    void* p = malloc(opaque_size(LEAK_SIZE));
    if (!p) continue;
    memset(p, 1, LEAK_SIZE);
    void* q = realloc(p, opaque_size(0));
    if (q) free(q); /* not glibc behaviour; reported by test_realloc */
  }
}
static void loop_free(void) {
  for (int i = 0; i < LEAK_ITERS; i++) {
    void* p = malloc(opaque_size(LEAK_SIZE));
    if (!p) continue;
    memset(p, 1, LEAK_SIZE);
    free(p);
  }
}
static void test_frees_release(void) {
  TEST_SECTION("free and realloc(p, 0) release memory");
  size_t g = rss_growth(loop_free);
  CHECK_MSG(g < LEAK_LIMIT, "malloc/free loop grew RSS by %zu bytes", g);
  g = rss_growth(loop_realloc_zero);
  CHECK_MSG(g < LEAK_LIMIT, "malloc/realloc(p, 0) loop grew RSS by %zu bytes", g);
}

/* ------------------------------------------------------- glibc extras --- */

static void test_mallopt_trim(void) {
  TEST_SECTION("mallopt, malloc_trim");
  /* Known parameters with in-range values (chosen to be harmless if applied). */
  struct {
    int param, value;
    const char* name;
  } known[] = {{M_MXFAST, 64 * (int)sizeof(size_t) / 4, "M_MXFAST"},
               {M_TRIM_THRESHOLD, 128 * 1024, "M_TRIM_THRESHOLD"},
               {M_TOP_PAD, 128 * 1024, "M_TOP_PAD"},
               {M_MMAP_THRESHOLD, 128 * 1024, "M_MMAP_THRESHOLD"},
               {M_MMAP_MAX, 65536, "M_MMAP_MAX"},
               {M_CHECK_ACTION, 3, "M_CHECK_ACTION"},
               {M_PERTURB, 0, "M_PERTURB"},
               {M_ARENA_TEST, 8, "M_ARENA_TEST"},
               {M_ARENA_MAX, 8, "M_ARENA_MAX"}};
  for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
    int rc = mallopt(known[i].param, known[i].value);
    CHECK_MSG(rc == 1, "mallopt(%s, %d) = %d, want 1", known[i].name, known[i].value, rc);
  }
  /* Unknown parameter numbers: glibc 2.36 returns 1 (its switch has no default case, so
   * res keeps its initial value 1). Verified against the system glibc. */
  int unknown[] = {0, 2, 3, 4, 5, 6, 7, 8, 9, 12345, -9, -100, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
    int rc = mallopt(unknown[i], 1);
    CHECK_MSG(rc == 1, "mallopt(%d (unknown), 1) = %d, want 1 as glibc 2.36", unknown[i], rc);
  }
  /* The allocator still works after all that. */
  void* p = malloc(opaque_size(200000));
  CHECK(p != NULL);
  free(p);
  for (int i = 0; i < 3; i++) {
    int rc = malloc_trim(i == 0 ? 0 : (size_t)1 << 20);
    CHECK_MSG(rc == 0 || rc == 1, "malloc_trim = %d", rc);
  }
}

static void test_mallinfo2(void) {
  TEST_SECTION("mallinfo2");
  size_t big = (size_t)1 << 20, small = 1000;
  void* a = malloc(opaque_size(big));
  void* b = malloc(opaque_size(small));
  CHECK(a && b);
  if (a) memset(a, 1, big);
  if (b) memset(b, 1, small);
  struct mallinfo2 mi = mallinfo2();
  /* In-use bytes (heap + directly mapped) cover at least what is live. */
  CHECK_MSG(mi.uordblks + mi.hblkhd >= big + small,
            "mallinfo2: uordblks %zu + hblkhd %zu < %zu live bytes", mi.uordblks, mi.hblkhd,
            big + small);
  /* A block mapped on its own (64 MiB is one in glibc and in Keel) counts in hblks as its
   * bytes count in hblkhd. */
  size_t mapped_size = (size_t)64 << 20;
  void* c = malloc(opaque_size(mapped_size));
  CHECK(c != NULL);
  struct mallinfo2 with = mallinfo2();
  CHECK_MSG(with.hblks == mi.hblks + 1 && with.hblkhd >= mi.hblkhd + mapped_size,
            "mallinfo2: hblks %zu -> %zu, hblkhd %zu -> %zu", mi.hblks, with.hblks, mi.hblkhd, with.hblkhd);
  free(c);
  CHECK(mallinfo2().hblks == mi.hblks);
  CHECK((mi.hblks == 0) == (mi.hblkhd == 0));
  free(a);
  free(b);
}

/* Runs fn with fd 2 redirected to a temporary file; returns the number of bytes written. */
static long capture_stderr(void (*fn)(void)) {
  char path[] = "/tmp/keel-test-stderr-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  unlink(path);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  struct stat st;
  long n = fstat(fd, &st) == 0 ? (long)st.st_size : -1;
  close(fd);
  return n;
}
static void call_malloc_stats(void) { malloc_stats(); }

static void test_malloc_stats_info(void) {
  TEST_SECTION("malloc_stats, malloc_info");
  void* keep = malloc(opaque_size(5000));
  long n = capture_stderr(call_malloc_stats);
  CHECK_MSG(n > 0, "malloc_stats wrote %ld bytes to stderr", n);

  FILE* f = tmpfile();
  if (!CHECK(f != NULL)) return;
  int rc = malloc_info(0, f);
  EXPECT_EQ_I(rc, 0);
  fflush(f);
  long len = ftell(f);
  CHECK_MSG(len > 0, "malloc_info wrote %ld bytes", len);
  char* buf = (char*)malloc(opaque_size(len > 0 ? (size_t)len + 1 : 1));
  if (buf && len > 0) {
    rewind(f);
    size_t got = fread(buf, 1, (size_t)len, f);
    buf[got] = 0;
    CHECK_MSG(strncmp(buf, "<malloc version=", 16) == 0, "malloc_info output starts \"%.40s\"",
              buf);
    /* A complete document: the root element is closed at the end. */
    size_t l = strlen(buf);
    while (l && (buf[l - 1] == '\n' || buf[l - 1] == ' ')) buf[--l] = 0;
    CHECK_MSG(l >= 9 && strcmp(buf + l - 9, "</malloc>") == 0, "malloc_info output ends \"%s\"",
              l > 40 ? buf + l - 40 : buf);
  }
  free(buf);
  fclose(f);

  /* Non-zero options: EINVAL, nothing written. */
  f = tmpfile();
  if (CHECK(f != NULL)) {
    rc = malloc_info(1, f);
    EXPECT_EQ_I(rc, EINVAL);
    fflush(f);
    EXPECT_EQ_I(ftell(f), 0);
    fclose(f);
  }
  free(keep);
}

/* ------------------------------------------------------- keel extras --- */

#ifdef KEEL_TESTING_KEEL
static void test_keel_api(void) {
  TEST_SECTION("keel.h API");
  EXPECT_EQ_I(keel_stats_get(NULL), -1);
  keel_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = 4; /* too small for anything */
  EXPECT_EQ_I(keel_stats_get(&s), -1);
  s.size = sizeof s;
  EXPECT_EQ_I(keel_stats_get(&s), 0);
  EXPECT_EQ_U(s.version, KEEL_STATS_VERSION);
  EXPECT_GE_U(s.threads, 1);
  EXPECT_GE_U(s.threads_total, s.threads);
  EXPECT_EQ_U(s.os_page_size, page_size);
  CHECK_MSG(s.committed + s.retained <= s.mapped,
            "committed %" PRIu64 " + retained %" PRIu64 " > mapped %" PRIu64, s.committed,
            s.retained, s.mapped);

  /* allocated tracks a big block up and back down. */
  size_t big = (size_t)32 << 20;
  keel_stats_t a = keel_stats_now();
  void* p = malloc(opaque_size(big));
  keel_stats_t b = keel_stats_now();
  free(p);
  keel_stats_t c = keel_stats_now();
  CHECK_MSG(b.allocated >= a.allocated + big, "allocated %" PRIu64 " -> %" PRIu64, a.allocated,
            b.allocated);
  CHECK_MSG(c.allocated + big <= b.allocated, "after free: allocated %" PRIu64 " -> %" PRIu64,
            b.allocated, c.allocated);
  CHECK_MSG(b.huge_allocated >= a.huge_allocated + big,
            "huge_allocated %" PRIu64 " -> %" PRIu64 " for a 32 MiB block", a.huge_allocated,
            b.huge_allocated);

  FILE* f = tmpfile();
  if (CHECK(f != NULL)) {
    keel_stats_print(fileno(f));
    struct stat st;
    CHECK(fstat(fileno(f), &st) == 0 && st.st_size > 0);
    fclose(f);
  }
  keel_thread_flush();
  size_t released = keel_purge();
  printf("   keel_purge released %zu bytes\n", released);
  keel_stats_t d = keel_stats_now();
  CHECK(d.committed + d.retained <= d.mapped);
}
#endif

int main(void) {
  page_size = (size_t)sysconf(_SC_PAGESIZE);
  assert_keel_in_use();
  test_free_null();
  test_malloc_zero();
  test_malloc_small_medium();
  test_malloc_large();
  test_malloc_random_mix();
  test_malloc_impossible();
  test_calloc();
  test_realloc();
  test_big_reuse();
  test_realloc_shrink_unwritten();
  test_reallocarray();
  test_posix_memalign();
  test_memalign();
  test_aligned_alloc();
  test_valloc_pvalloc();
  test_free_sized();
  test_frees_release();
  test_mallopt_trim();
  test_mallinfo2();
  test_malloc_stats_info();
#ifdef KEEL_TESTING_KEEL
  test_keel_api();
#endif
  return test_finish();
}
