/* test_jemalloc.c -- jemalloc 5.3's non-standard API (mallocx & co, mallctl*,
 * malloc_stats_print) as a program written for jemalloc uses it, run unchanged on Keel.
 *
 * Built against jemalloc's own header when it is installed (Debian: libjemalloc-dev) and
 * linked against libkeel.so. ctest runs the same binary three ways:
 *   jemalloc.api            on Keel;
 *   jemalloc.api_checked    on Keel's checked mode (KEEL_CHECK=1);
 *   jemalloc.api_reference  with LD_PRELOAD=libjemalloc.so.2, i.e. on the real jemalloc:
 *                           every expectation below that is not marked "Keel" is checked
 *                           against jemalloc itself, which is how they were validated.
 * The allocator is recognised by mallctl("version"): Keel's contains "keel".
 *
 *   ./test_jemalloc                      all sections
 *   ./test_jemalloc sdallocx-wrong-size  misuse case for the checked mode (must abort)
 */
#include "test.h"

#include <dlfcn.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <strings.h>
#include <sys/types.h>

#ifdef KEEL_HAVE_JEMALLOC_H
#include <jemalloc/jemalloc.h>
#else
/* jemalloc 5.3's declarations and flag encodings, for systems without its header. */
#define MALLOCX_LG_ALIGN(la) ((int)(la))
#define MALLOCX_ALIGN(a) ((int)(ffsl((long)(a)) - 1))
#define MALLOCX_ZERO ((int)0x40)
#define MALLOCX_TCACHE(tc) ((int)(((tc) + 2) << 8))
#define MALLOCX_TCACHE_NONE (MALLOCX_TCACHE(-1))
#define MALLOCX_ARENA(a) ((((int)(a)) + 1) << 20)
#define MALLCTL_ARENAS_ALL 4096
#define MALLCTL_ARENAS_DESTROYED 4097
void* mallocx(size_t size, int flags);
void* rallocx(void* ptr, size_t size, int flags);
size_t xallocx(void* ptr, size_t size, size_t extra, int flags);
size_t sallocx(const void* ptr, int flags);
void dallocx(void* ptr, int flags);
void sdallocx(void* ptr, size_t size, int flags);
size_t nallocx(size_t size, int flags);
int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);
int mallctlnametomib(const char* name, size_t* mibp, size_t* miblenp);
int mallctlbymib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp, void* newp,
                 size_t newlen);
void malloc_stats_print(void (*write_cb)(void*, const char*), void* cbopaque, const char* opts);
extern void (*malloc_message)(void* cbopaque, const char* s);
#endif

static bool on_keel;    /* mallctl("version") names Keel */
static bool checked;    /* Keel's checked mode (opt.tcache reads false) */
static size_t page;

/* ------------------------------------------------------------------ helpers --- */

static size_t read_size(const char* name) {
  size_t v = 0, len = sizeof v;
  int r = mallctl(name, &v, &len, NULL, 0);
  CHECK_MSG(r == 0 && len == sizeof v, "mallctl(\"%s\") = %d, len %zu", name, r, len);
  return v;
}
static unsigned read_unsigned(const char* name) {
  unsigned v = 0;
  size_t len = sizeof v;
  int r = mallctl(name, &v, &len, NULL, 0);
  CHECK_MSG(r == 0 && len == sizeof v, "mallctl(\"%s\") = %d, len %zu", name, r, len);
  return v;
}
static bool read_bool(const char* name) {
  bool v = false;
  size_t len = sizeof v;
  int r = mallctl(name, &v, &len, NULL, 0);
  CHECK_MSG(r == 0 && len == sizeof v, "mallctl(\"%s\") = %d, len %zu", name, r, len);
  return v;
}
static uint64_t new_epoch(void) {
  uint64_t e = 1;
  size_t len = sizeof e;
  int r = mallctl("epoch", &e, &len, &e, sizeof e);
  CHECK_MSG(r == 0, "mallctl(\"epoch\") = %d", r);
  return e;
}
static bool all_zero(const void* p, size_t n) {
  const unsigned char* c = (const unsigned char*)p;
  for (size_t i = 0; i < n; i++)
    if (c[i]) return false;
  return true;
}
static void fill(void* p, size_t n, unsigned seed) {
  unsigned char* c = (unsigned char*)p;
  for (size_t i = 0; i < n; i++) c[i] = (unsigned char)(seed + i * 7);
}
static bool filled(const void* p, size_t n, unsigned seed) {
  const unsigned char* c = (const unsigned char*)p;
  for (size_t i = 0; i < n; i++)
    if (c[i] != (unsigned char)(seed + i * 7)) return false;
  return true;
}

/* -------------------------------------------------- nallocx == sallocx(mallocx) --- */

/* One allocation: the block must be non-NULL, aligned, as large as asked, and exactly
 * the size nallocx predicted (sallocx and malloc_usable_size agree). */
static void one_block(size_t n, int flags, size_t align, bool zero_check) {
  size_t predicted = nallocx(n, flags);
  void* p = mallocx(n, flags);
  if (!CHECK_MSG(p != NULL, "mallocx(%zu, 0x%x) failed", n, flags)) return;
  size_t us = sallocx(p, 0);
  CHECK_MSG(us == predicted, "mallocx(%zu, 0x%x): sallocx %zu, nallocx %zu", n, flags, us,
            predicted);
  CHECK_MSG(malloc_usable_size(p) == us, "mallocx(%zu): malloc_usable_size %zu, sallocx %zu",
            n, malloc_usable_size(p), us);
  CHECK_MSG(us >= n, "mallocx(%zu, 0x%x): usable %zu", n, flags, us);
  if (align) CHECK_MSG((uintptr_t)p % align == 0, "mallocx(%zu, 0x%x) = %p", n, flags, p);
  if (zero_check && (flags & MALLOCX_ZERO))
    CHECK_MSG(all_zero(p, us), "mallocx(%zu, MALLOCX_ZERO|0x%x): not zeroed", n, flags);
  memset(p, 0xA5, n < 4096 ? n : 4096);
  if (n & 1) dallocx(p, flags);
  else sdallocx(p, n, flags);
}

static void test_sizes(void) {
  TEST_SECTION("nallocx == sallocx(mallocx) over sizes");
  for (size_t n = 1; n <= 4200; n++) one_block(n, 0, 16, false);
  /* Around every power of two, unit multiple and class edge up to 16 MiB. */
  for (size_t b = 4096; b <= ((size_t)16 << 20); b *= 2)
    for (size_t k = 1; k <= 3; k++)
      for (long d = -17; d <= 17; d += 17) {
        size_t n = b * k / 2 + (size_t)d;
        one_block(n, 0, 16, false);
      }
  for (size_t n = 64 << 10; n <= (2 << 20); n += 64 << 10) {
    one_block(n - 1, 0, 16, false);
    one_block(n, 0, 16, false);
    one_block(n + 1, 0, 16, false);
  }
  t_rng r;
  rng_seed(&r, 6);
  for (int i = 0; i < 3000; i++) {
    size_t n = 1 + rng_next(&r) % (i % 10 == 0 ? (3u << 20) : (160u << 10));
    one_block(n, 0, 16, false);
  }
  TEST_SECTION("nallocx == sallocx(mallocx) with alignments");
  for (unsigned lg = 0; lg <= 23; lg++) {
    size_t a = (size_t)1 << lg;
    static const size_t sizes[] = {1,      8,      15,     16,      17,       100,      1000,
                                   1024,   1025,   4095,   4096,    4097,     10000,    65535,
                                   65536,  65537,  100000, 131072,  131073,   200000,   1048576,
                                   1048577, 3000000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      one_block(sizes[i], MALLOCX_LG_ALIGN(lg), a, false);
      one_block(sizes[i], MALLOCX_ALIGN(a), a, false);
    }
    for (int i = 0; i < 40; i++)
      one_block(1 + rng_next(&r) % (300u << 10), MALLOCX_ALIGN(a), a, false);
  }
  EXPECT_EQ_U(nallocx(SIZE_MAX, 0), 0);
  EXPECT_EQ_U(nallocx((size_t)1 << 63, 0), 0);
  EXPECT_EQ_U(nallocx(1, MALLOCX_LG_ALIGN(63)), 0);
  errno = 0;
  CHECK(mallocx(SIZE_MAX / 2, 0) == NULL);
  if (on_keel) { /* undefined in jemalloc (which crashes); Keel allocates */
    void* p = rallocx(NULL, 10, 0);
    CHECK(p != NULL);
    dallocx(p, 0);
  }
}

static void test_zero(void) {
  TEST_SECTION("MALLOCX_ZERO");
  static const size_t sizes[] = {16, 48, 100, 1000, 5000, 40000, 131072, 200000, 700000,
                                 1048576, 1500000, 3 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    /* Dirty some blocks of this size, free them, then ask for zeroed ones: the usable
     * size (not just n) must read as zero, even on reused memory. */
    void* junk[8];
    for (int k = 0; k < 8; k++) {
      junk[k] = mallocx(n, 0);
      if (junk[k]) memset(junk[k], 0xEE, sallocx(junk[k], 0));
    }
    for (int k = 0; k < 8; k++) dallocx(junk[k], 0);
    for (int k = 0; k < 8; k++) one_block(n, MALLOCX_ZERO, 16, true);
    one_block(n, MALLOCX_ZERO | MALLOCX_ALIGN(4096), 4096, true);
  }
  /* Keel may hand out a free block of a larger class whose slabs have gone quiet
   * (borrowing) rather than start a slab: sallocx is then more than nallocx, and all of
   * it must read as zero too. A short purge delay makes the lender quiet soon. */
  int (*option_set)(const char*, const char*) =
      on_keel ? (int (*)(const char*, const char*))dlsym(RTLD_DEFAULT, "keel_option_set") : NULL;
  enum { LENDERS = 20000, ASKS = 2000 };
  static void* lend[LENDERS];
  if (option_set != NULL) option_set("purge_delay", "100");
  for (int k = 0; k < LENDERS; k++) lend[k] = mallocx(2048, 0);
  for (int k = 0; k < LENDERS; k++) memset(lend[k], 0xEE, 2048);
  for (int k = 0; k < LENDERS; k += 2) dallocx(lend[k], 0);
  usleep(400 * 1000);
  size_t bigger = 0, dirty = 0;
  for (int k = 0; k < ASKS; k++) {
    unsigned char* p = mallocx(1100, MALLOCX_ZERO);
    size_t us = sallocx(p, 0);
    bigger += us > nallocx(1100, MALLOCX_ZERO);
    dirty += !all_zero(p, us);
    lend[2 * (k % (LENDERS / 2))] = p;
  }
  printf("   mallocx(1100, ZERO): %zu of %d blocks bigger than nallocx, %zu not zero\n", bigger, ASKS, dirty);
  EXPECT_EQ_U(0, dirty);
  for (int k = 0; k < ASKS; k++) dallocx(lend[2 * k], 0);
  for (int k = 1; k < LENDERS; k += 2) dallocx(lend[k], 0);
  if (option_set != NULL) option_set("purge_delay", "1000");
}

/* ------------------------------------------------------------- rallocx, xallocx --- */

static void test_rallocx(void) {
  TEST_SECTION("rallocx");
  static const size_t steps[] = {1, 24, 100, 1000, 3000, 70000, 140000, 300000, 1000000,
                                 1100000, 5000000, 2000000, 600000, 130000, 2000, 10};
  void* p = mallocx(1, 0);
  fill(p, 1, 1);
  size_t have = 1; /* bytes known to hold the pattern */
  for (size_t i = 1; i < sizeof steps / sizeof steps[0]; i++) {
    size_t n = steps[i];
    void* q = rallocx(p, n, 0);
    if (!CHECK_MSG(q != NULL, "rallocx(%zu) failed", n)) break;
    size_t keep = have < n ? have : n;
    CHECK_MSG(filled(q, keep, 1), "rallocx(%zu) lost the contents", n);
    size_t us = sallocx(q, 0);
    CHECK_MSG(us >= n, "rallocx(%zu): usable %zu", n, us);
    /* jemalloc sizes every result exactly; Keel keeps a huge mapping that shrinks by
     * less than half (no in-place shrink of a mapping without a move). */
    if (!on_keel || n <= (1u << 20)) EXPECT_EQ_U(us, nallocx(n, 0));
    fill(q, n, 1);
    have = n;
    p = q;
  }
  dallocx(p, 0);

  /* Growing with MALLOCX_ZERO: everything past the old usable size reads as zero. */
  static const size_t grow[] = {16, 100, 2000, 50000, 200000, 900000, 3000000};
  for (size_t i = 0; i + 1 < sizeof grow / sizeof grow[0]; i++) {
    void* junk = mallocx(grow[i + 1], 0);
    memset(junk, 0xCC, grow[i + 1]);
    dallocx(junk, 0);
    void* a = mallocx(grow[i], 0);
    size_t old = sallocx(a, 0);
    memset(a, 0x11, old);
    void* b = rallocx(a, grow[i + 1], MALLOCX_ZERO);
    if (!CHECK(b != NULL)) {
      dallocx(a, 0);
      continue;
    }
    size_t us = sallocx(b, 0);
    unsigned char* c = (unsigned char*)b;
    size_t bad = 0;
    for (size_t k = 0; k < old && k < us; k++) bad += c[k] != 0x11;
    CHECK_MSG(bad == 0, "rallocx(%zu -> %zu, ZERO): %zu old bytes changed", grow[i], grow[i + 1],
              bad);
    CHECK_MSG(all_zero(c + old, us - old), "rallocx(%zu -> %zu, ZERO): tail not zero", grow[i],
              grow[i + 1]);
    dallocx(b, 0);
  }

  /* A huge block grown with MALLOCX_ZERO while the huge cache holds a freed one: Keel
   * fills a grown mapping from that cache (kernels 6.17+), whose pages hold the old
   * block's bytes, unless asked to zero. */
  {
    size_t mb = (size_t)1 << 20;
    unsigned char* a = mallocx(2 * mb, 0);
    unsigned char* junk = mallocx(8 * mb, 0);
    if (CHECK(a != NULL && junk != NULL)) {
      size_t old = sallocx(a, 0);
      memset(a, 0x11, old);
      memset(junk, 0xAB, 8 * mb);
      dallocx(junk, 0);
      unsigned char* b = rallocx(a, 6 * mb, MALLOCX_ZERO);
      if (CHECK(b != NULL)) {
        size_t us = sallocx(b, 0), bad = 0;
        for (size_t k = old; k < us; k++) bad += b[k] != 0;
        CHECK_MSG(bad == 0, "rallocx(2 MiB -> 6 MiB, ZERO): %zu bytes of the tail not zero", bad);
        dallocx(b, 0);
      } else {
        dallocx(a, 0);
      }
    }
  }

  /* A new alignment moves the block if it must. */
  for (unsigned lg = 5; lg <= 22; lg += 3) {
    void* a = mallocx(3000, 0);
    fill(a, 3000, 9);
    void* b = rallocx(a, 5000, MALLOCX_LG_ALIGN(lg));
    if (!CHECK(b != NULL)) continue;
    EXPECT_ALIGNED(b, (size_t)1 << lg);
    CHECK(filled(b, 3000, 9));
    EXPECT_EQ_U(sallocx(b, 0), nallocx(5000, MALLOCX_LG_ALIGN(lg)));
    dallocx(b, 0);
  }
  /* Shrinking a small block to another class moves it to that class. */
  void* s = mallocx(4000, 0);
  void* t = rallocx(s, 100, 0);
  CHECK(t != NULL);
  EXPECT_EQ_U(sallocx(t, 0), nallocx(100, 0));
  dallocx(t, 0);
}

static void test_xallocx(void) {
  TEST_SECTION("xallocx");
  static const size_t sizes[] = {10, 1000, 20000, 200000, 512 << 10, 900000, 3 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    void* p = mallocx(n, 0);
    size_t old = sallocx(p, 0);
    fill(p, old, 3);
    /* No-op: the same size. */
    EXPECT_EQ_U(xallocx(p, old, 0, 0), old);
    EXPECT_EQ_U(sallocx(p, 0), old);
    /* Growing: either it grew in place (>= the request) or it reports the old size. */
    size_t want = old + old / 2 + 1;
    size_t got = xallocx(p, want, 0, MALLOCX_ZERO);
    EXPECT_EQ_U(got, sallocx(p, 0));
    CHECK_MSG(got >= want || got == old, "xallocx(%zu -> %zu) = %zu", old, want, got);
    CHECK(filled(p, old, 3));
    if (got > old) CHECK_MSG(all_zero((char*)p + old, got - old), "xallocx(%zu, ZERO): tail", want);
    /* size + extra: at least size when it grows. */
    size_t cur = sallocx(p, 0);
    got = xallocx(p, cur + 1, 4096, 0);
    CHECK(got == cur || got >= cur + 1);
    EXPECT_EQ_U(got, sallocx(p, 0));
    dallocx(p, 0);
  }
  /* Large blocks shrink in place, to at least the size asked. */
  void* p = mallocx(800 << 10, 0);
  fill(p, 200 << 10, 4);
  size_t old = sallocx(p, 0);
  size_t got = xallocx(p, 200 << 10, 0, 0);
  CHECK_MSG(got >= (200u << 10) && got <= old, "xallocx shrink: %zu (was %zu)", got, old);
  if (on_keel && !checked) EXPECT_EQ_U(got, nallocx(200 << 10, 0));
  CHECK(filled(p, 200 << 10, 4));
  EXPECT_EQ_U(got, sallocx(p, 0));
  dallocx(p, 0);
  if (on_keel && !checked) {
    /* Keel: a large block followed by free units grows into them. Take a fresh chunk's
     * worth so the units after the block are free. */
    void* big = mallocx(200 << 10, 0);
    size_t b0 = sallocx(big, 0);
    size_t g = xallocx(big, 900 << 10, 0, 0);
    CHECK_MSG(g == b0 || g == nallocx(900 << 10, 0), "xallocx grow large: %zu", g);
    dallocx(big, 0);
  }
}

/* ----------------------------------------------------------------- flags misc --- */

static void test_tcache_arena_flags(void) {
  TEST_SECTION("MALLOCX_TCACHE / MALLOCX_ARENA / sdallocx");
  void* a = mallocx(100, MALLOCX_TCACHE_NONE);
  CHECK(a != NULL);
  EXPECT_EQ_U(sallocx(a, 0), nallocx(100, MALLOCX_TCACHE_NONE));
  dallocx(a, MALLOCX_TCACHE_NONE);
  unsigned tc = 0;
  size_t len = sizeof tc;
  int r = mallctl("tcache.create", &tc, &len, NULL, 0);
  EXPECT_EQ_I(r, 0);
  if (r == 0) {
    void* b = mallocx(200, MALLOCX_TCACHE(tc));
    CHECK(b != NULL);
    sdallocx(b, 200, MALLOCX_TCACHE(tc));
    EXPECT_EQ_I(mallctl("tcache.flush", NULL, NULL, &tc, sizeof tc), 0);
    EXPECT_EQ_I(mallctl("tcache.destroy", NULL, NULL, &tc, sizeof tc), 0);
  }
  len = 8; /* a wrong size: no cache is made, *oldlenp becomes 0 */
  uint64_t big = 0;
  EXPECT_EQ_I(mallctl("tcache.create", &big, &len, NULL, 0), EINVAL);
  EXPECT_EQ_U(len, 0);
  void* c = mallocx(300, MALLOCX_ARENA(0));
  CHECK(c != NULL);
  unsigned arena = 99;
  len = sizeof arena;
  EXPECT_EQ_I(mallctl("arenas.lookup", &arena, &len, &c, sizeof c), 0);
  CHECK(arena < read_unsigned("arenas.narenas"));
  if (on_keel) { /* jemalloc crashes on a pointer it does not own; Keel says EINVAL */
    int local = 0;
    void* sp = &local;
    len = sizeof arena;
    EXPECT_EQ_I(mallctl("arenas.lookup", &arena, &len, &sp, sizeof sp), EINVAL);
  }
  dallocx(c, MALLOCX_ARENA(0));
  /* sdallocx with any size from the request up to the usable size. */
  for (size_t n = 1; n < 3000; n += 37) {
    void* p = mallocx(n, 0);
    sdallocx(p, n, 0);
    p = mallocx(n, 0);
    sdallocx(p, nallocx(n, 0), 0);
    p = mallocx(n, MALLOCX_ALIGN(64));
    sdallocx(p, n, MALLOCX_ALIGN(64));
  }
}

/* -------------------------------------------------------------------- mallctl --- */

static void test_mallctl_basics(void) {
  TEST_SECTION("mallctl: version, epoch, errors");
  const char* v = NULL;
  size_t len = sizeof v;
  EXPECT_EQ_I(mallctl("version", &v, &len, NULL, 0), 0);
  CHECK(v != NULL && strncmp(v, "5.", 2) == 0);
  printf("   version %s (%s)\n", v ? v : "?", on_keel ? "Keel" : "jemalloc");
  if (on_keel) CHECK(strstr(v, "keel") != NULL);

  uint64_t e0 = 0;
  len = sizeof e0;
  EXPECT_EQ_I(mallctl("epoch", &e0, &len, NULL, 0), 0);
  uint64_t e1 = new_epoch();
  EXPECT_EQ_U(e1, e0 + 1);
  uint64_t e2 = new_epoch();
  EXPECT_EQ_U(e2, e1 + 1);
  EXPECT_EQ_I(mallctl("epoch", NULL, NULL, &e2, 4), EINVAL);

  static const char* const missing[] = {
      "no.such.name", "stats",  "stats.arenas",   "version.x",        "arena.99999.purge",
      "",             "stats..allocated",          "stats.allocated.", ".stats.allocated",
      "arena.x.purge", "opt.lg_tcache_max",        "stats.arenas.4097.pactive",
      "arenas.bin.9999.size", "stats.arenas.0.bins"};
  for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
    size_t val = 0, vl = sizeof val;
    int r = mallctl(missing[i], &val, &vl, NULL, 0);
    CHECK_MSG(r == ENOENT, "mallctl(\"%s\") = %d, want ENOENT", missing[i], r);
  }

  /* Wrong sizes: EINVAL, and what fits is copied (its length reported). */
  size_t full = read_size("stats.allocated");
  uint32_t half = 0;
  len = sizeof half;
  EXPECT_EQ_I(mallctl("stats.allocated", &half, &len, NULL, 0), EINVAL);
  EXPECT_EQ_U(len, sizeof half);
  CHECK(memcmp(&half, &full, sizeof half) == 0);
  uint64_t wide = 0;
  len = sizeof wide;
  EXPECT_EQ_I(mallctl("arenas.narenas", &wide, &len, NULL, 0), EINVAL);
  EXPECT_EQ_U(len, sizeof(unsigned));
  bool bg = true;
  EXPECT_EQ_I(mallctl("background_thread", NULL, NULL, &bg, 4), EINVAL);
  /* A wrong old length with a new value: EINVAL, and the value is not written. */
  ssize_t decay0 = 0, decay1 = 0;
  len = sizeof decay0;
  EXPECT_EQ_I(mallctl("arena.0.dirty_decay_ms", &decay0, &len, NULL, 0), 0);
  decay1 = decay0 + 1000;
  int32_t decay_narrow = 0;
  len = sizeof decay_narrow;
  EXPECT_EQ_I(mallctl("arena.0.dirty_decay_ms", &decay_narrow, &len, &decay1, sizeof decay1), EINVAL);
  ssize_t decay2 = 0;
  len = sizeof decay2;
  EXPECT_EQ_I(mallctl("arena.0.dirty_decay_ms", &decay2, &len, NULL, 0), 0);
  EXPECT_EQ_I((int)decay2, (int)decay0);

  /* Read-only and void names. */
  size_t five = 5;
  EXPECT_EQ_I(mallctl("stats.allocated", NULL, NULL, &five, sizeof five), EPERM);
  EXPECT_EQ_I(mallctl("version", NULL, NULL, &v, sizeof v), EPERM);
  len = sizeof five;
  EXPECT_EQ_I(mallctl("arena.0.purge", &five, &len, NULL, 0), EPERM);
  EXPECT_EQ_I(mallctl("thread.tcache.flush", &five, &len, NULL, 0), EPERM);
  EXPECT_EQ_I(mallctl("stats.allocated", NULL, NULL, NULL, 0), 0);

  TEST_SECTION("mallctl: actions and settings");
  unsigned narenas = read_unsigned("arenas.narenas");
  CHECK(narenas >= 1);
  char name[64];
  snprintf(name, sizeof name, "arena.%u.purge", narenas); /* what Redis does */
  EXPECT_EQ_I(mallctl(name, NULL, NULL, NULL, 0), 0);
  size_t pa = 0, palen = sizeof pa; /* stats.arenas.<narenas>: the merged figures too */
  snprintf(name, sizeof name, "stats.arenas.%u.pactive", narenas);
  EXPECT_EQ_I(mallctl(name, &pa, &palen, NULL, 0), 0);
  snprintf(name, sizeof name, "arena.%d.purge", MALLCTL_ARENAS_ALL);
  EXPECT_EQ_I(mallctl(name, NULL, NULL, NULL, 0), 0);
  snprintf(name, sizeof name, "arena.%d.decay", MALLCTL_ARENAS_ALL);
  EXPECT_EQ_I(mallctl(name, NULL, NULL, NULL, 0), 0);
  EXPECT_EQ_I(mallctl("arena.0.purge", NULL, NULL, NULL, 0), 0);
  EXPECT_EQ_I(mallctl("arena.0.decay", NULL, NULL, NULL, 0), 0);
  EXPECT_EQ_I(mallctl("thread.tcache.flush", NULL, NULL, NULL, 0), 0);
  EXPECT_EQ_I(mallctl("thread.idle", NULL, NULL, NULL, 0), 0);
  EXPECT_EQ_I(mallctl("arena.0.reset", NULL, NULL, NULL, 0), EFAULT);
  bool on = true;
  EXPECT_EQ_I(mallctl("background_thread", NULL, NULL, &on, sizeof on), 0); /* Redis */
  CHECK(read_bool("background_thread"));

  bool tc_default = read_bool("opt.tcache");
  CHECK(read_bool("thread.tcache.enabled") == tc_default);
  bool off = false, was = true;
  len = sizeof was;
  EXPECT_EQ_I(mallctl("thread.tcache.enabled", &was, &len, &off, sizeof off), 0);
  CHECK(was == tc_default);
  CHECK(!read_bool("thread.tcache.enabled"));
  EXPECT_EQ_I(mallctl("thread.tcache.enabled", NULL, NULL, &on, sizeof on), 0);

  unsigned arena = 7;
  len = sizeof arena;
  EXPECT_EQ_I(mallctl("thread.arena", &arena, &len, NULL, 0), 0);
  CHECK(arena < narenas);
  unsigned bad = 100000;
  EXPECT_EQ_I(mallctl("thread.arena", NULL, NULL, &bad, sizeof bad), EFAULT);

  EXPECT_EQ_U(read_size("arenas.page"), page);
  EXPECT_EQ_U(read_size("arenas.quantum"), 16);
  CHECK(!read_bool("config.debug") || on_keel);
  CHECK(read_bool("config.stats"));
  CHECK(read_unsigned("opt.narenas") >= 1);
  ssize_t decay = -2;
  len = sizeof decay;
  EXPECT_EQ_I(mallctl("opt.dirty_decay_ms", &decay, &len, NULL, 0), 0);
  CHECK(decay >= -1);
  ssize_t adecay = -2;
  len = sizeof adecay;
  EXPECT_EQ_I(mallctl("arena.0.dirty_decay_ms", &adecay, &len, NULL, 0), 0);
  /* Setting the decay time purges now; set it back. */
  EXPECT_EQ_I(mallctl("arena.0.dirty_decay_ms", NULL, NULL, &adecay, sizeof adecay), 0);
  const char* dss = NULL;
  len = sizeof dss;
  EXPECT_EQ_I(mallctl("opt.dss", &dss, &len, NULL, 0), 0);
  CHECK(dss != NULL);
  size_t tmax = read_size("opt.tcache_max");
  CHECK(tmax > 0 || checked);
  if (on_keel) {
    EXPECT_EQ_U(narenas, 1);
    EXPECT_EQ_U(read_unsigned("opt.narenas"), 1);
    EXPECT_EQ_U(read_unsigned("arenas.nbins"), 127);
  }
}

static void test_mib(void) {
  TEST_SECTION("mallctlnametomib / mallctlbymib");
  unsigned nbins = read_unsigned("arenas.nbins");
  size_t mib[8], miblen = 4;
  EXPECT_EQ_I(mallctlnametomib("arenas.bin.0.size", mib, &miblen), 0);
  EXPECT_EQ_U(miblen, 4);
  size_t prev = 0;
  for (unsigned i = 0; i < nbins; i++) {
    size_t size = 0, len = sizeof size;
    mib[2] = i;
    EXPECT_EQ_I(mallctlbymib(mib, miblen, &size, &len, NULL, 0), 0);
    CHECK_MSG(size > prev, "bin %u size %zu after %zu", i, size, prev);
    /* A bin size is a size class. Under Keel a small heap's requests are served by the
     * coarse classes only (docs/design.md, "Size classes"): the class serving a bin's
     * size is then a coarser one, which serves itself. */
    size_t usable = nallocx(size, 0);
    CHECK_MSG(usable >= size && nallocx(usable, 0) == usable, "bin size %zu -> %zu", size, usable);
    prev = size;
  }
  mib[2] = nbins + 1000;
  size_t size = 0, len = sizeof size;
  EXPECT_EQ_I(mallctlbymib(mib, miblen, &size, &len, NULL, 0), ENOENT);
  /* A partial MIB, completed by hand. */
  size_t part[8], plen = 2;
  EXPECT_EQ_I(mallctlnametomib("arenas.bin.3.nregs", part, &plen), 0);
  EXPECT_EQ_U(plen, 2);
  part[2] = 3;
  size_t nmib[8], nlen = 8;
  EXPECT_EQ_I(mallctlnametomib("arenas.bin.3.nregs", nmib, &nlen), 0);
  EXPECT_EQ_U(nlen, 4);
  part[3] = nmib[3];
  uint32_t nregs = 0;
  len = sizeof nregs;
  EXPECT_EQ_I(mallctlbymib(part, 4, &nregs, &len, NULL, 0), 0);
  CHECK(nregs > 0);
  nlen = 8;
  EXPECT_EQ_I(mallctlnametomib("stats.nosuch", nmib, &nlen), ENOENT);
  nlen = 8;
  EXPECT_EQ_I(mallctlnametomib("stats.arenas", nmib, &nlen), 0);
  EXPECT_EQ_U(nlen, 2);
  /* stats.arenas.<MALLCTL_ARENAS_ALL>.pactive by MIB. */
  nlen = 8;
  EXPECT_EQ_I(mallctlnametomib("stats.arenas.0.pactive", nmib, &nlen), 0);
  nmib[2] = MALLCTL_ARENAS_ALL;
  new_epoch();
  size_t pactive = 0;
  len = sizeof pactive;
  EXPECT_EQ_I(mallctlbymib(nmib, nlen, &pactive, &len, NULL, 0), 0);
  CHECK(pactive > 0);
}

static void test_stats(void) {
  TEST_SECTION("mallctl: statistics");
  mallctl("thread.tcache.flush", NULL, NULL, NULL, 0);
  new_epoch();
  size_t a0 = read_size("stats.allocated");
  /* Without a new epoch the figures stay as they were (a snapshot). */
  void* probe = malloc(3 << 20);
  memset(probe, 1, 3 << 20);
  EXPECT_EQ_U(read_size("stats.allocated"), a0);
  free(probe);

  enum { N = 120 };
  void* blocks[N];
  size_t total = 0;
  for (int i = 0; i < N; i++) {
    size_t n = (size_t)(40 << 10) + (size_t)i * 1500; /* 40..218 KiB: past jemalloc's tcache */
    blocks[i] = malloc(n);
    memset(blocks[i], i, n);
    total += n;
  }
  void* huge = mallocx(6 << 20, 0);
  memset(huge, 2, 6 << 20);
  total += 6 << 20;
  new_epoch();
  size_t a1 = read_size("stats.allocated");
  size_t active = read_size("stats.active"), resident = read_size("stats.resident");
  size_t mapped = read_size("stats.mapped"), metadata = read_size("stats.metadata");
  printf("   allocated %zu -> %zu (+%zu for %zu asked), active %zu, resident %zu, mapped %zu, "
         "metadata %zu, retained %zu\n",
         a0, a1, a1 - a0, total, active, resident, mapped, metadata, read_size("stats.retained"));
  CHECK_MSG(a1 >= a0 + total - total / 10, "stats.allocated %zu -> %zu after %zu", a0, a1, total);
  CHECK(active >= a1);
  CHECK(resident >= active);
  CHECK(mapped >= active);
  CHECK(metadata > 0);
  /* small + large allocated is the total, for the merged arena statistics. */
  char name[80];
  snprintf(name, sizeof name, "stats.arenas.%d.small.allocated", MALLCTL_ARENAS_ALL);
  size_t small = read_size(name);
  snprintf(name, sizeof name, "stats.arenas.%d.large.allocated", MALLCTL_ARENAS_ALL);
  size_t large = read_size(name);
  EXPECT_EQ_U(small + large, a1);
  CHECK(large >= (6u << 20));
#ifdef KEEL_TESTING_KEEL
  if (on_keel) {
    /* Keel: the figures are keel_stats_get()'s at the epoch. */
    new_epoch();
    keel_stats_t s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    keel_stats_get(&s);
    EXPECT_EQ_U(read_size("stats.allocated"), s.allocated);
    EXPECT_EQ_U(read_size("stats.active"), s.active);
    EXPECT_EQ_U(read_size("stats.retained"), s.retained);
    CHECK(read_size("stats.resident") >= s.committed);
    CHECK(read_size("stats.mapped") >= s.mapped);
  }
#endif
  for (int i = 0; i < N; i++) free(blocks[i]);
  dallocx(huge, 0);
  mallctl("thread.tcache.flush", NULL, NULL, NULL, 0);
  new_epoch();
  size_t a2 = read_size("stats.allocated");
  CHECK_MSG(a2 + total - total / 10 <= a1, "stats.allocated %zu after freeing %zu (was %zu)", a2,
            total, a1);

  /* Per-bin figures: 2000 live blocks of 100 bytes show in their bin's curregs. */
  unsigned nbins = read_unsigned("arenas.nbins");
  size_t cls = nallocx(100, 0);
  int bin = -1;
  for (unsigned i = 0; i < nbins; i++) {
    snprintf(name, sizeof name, "arenas.bin.%u.size", i);
    if (read_size(name) == cls) bin = (int)i;
  }
  if (checked) bin = -1; /* the checked mode's sizes are the requests, not classes */
  else CHECK(bin >= 0);
  if (bin >= 0) {
    void* b[2000];
    for (int i = 0; i < 2000; i++) b[i] = malloc(100);
    new_epoch();
    snprintf(name, sizeof name, "stats.arenas.%d.bins.%d.curregs", MALLCTL_ARENAS_ALL, bin);
    size_t regs = read_size(name);
    CHECK_MSG(regs >= 2000, "%s = %zu", name, regs);
    snprintf(name, sizeof name, "stats.arenas.%d.bins.%d.curslabs", MALLCTL_ARENAS_ALL, bin);
    CHECK(read_size(name) >= 1);
    for (int i = 0; i < 2000; i++) free(b[i]);
  }
  snprintf(name, sizeof name, "stats.arenas.%d.pdirty", MALLCTL_ARENAS_ALL);
  (void)read_size(name);
  snprintf(name, sizeof name, "stats.arenas.%d.nthreads", MALLCTL_ARENAS_ALL);
  CHECK(read_unsigned(name) >= 1 || checked); /* threads with a cache: none when checked */
  (void)read_size("stats.background_thread.num_threads");
}

/* Two threads allocate, free, refresh and read statistics at once. */
static void* stats_thread(void* arg) {
  t_rng r;
  rng_seed(&r, (uint64_t)(uintptr_t)arg);
  for (int i = 0; i < 3000; i++) {
    size_t n = 1 + rng_next(&r) % 70000;
    void* p = mallocx(n, (i & 1) ? MALLOCX_ZERO : 0);
    if (i % 50 == 0) {
      uint64_t e = 1;
      size_t len = sizeof e;
      mallctl("epoch", &e, &len, &e, sizeof e);
      size_t v = 0;
      len = sizeof v;
      mallctl("stats.allocated", &v, &len, NULL, 0);
      mallctl("stats.resident", &v, &len, NULL, 0);
    }
    p = rallocx(p, n / 2 + 1, 0);
    sdallocx(p, n / 2 + 1, 0);
  }
  return NULL;
}
static void test_threads(void) {
  TEST_SECTION("threads");
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, stats_thread, (void*)(uintptr_t)(i + 1));
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  CHECK(new_epoch() > 0);
}

/* --------------------------------------------------------- malloc_stats_print --- */

typedef struct {
  char* text; /* grown with realloc from inside the callback: it may allocate */
  size_t len;
  int calls;
} sink_t;
static void sink_cb(void* opaque, const char* s) {
  sink_t* k = (sink_t*)opaque;
  size_t n = strlen(s);
  k->text = (char*)realloc(k->text, k->len + n + 1);
  memcpy(k->text + k->len, s, n + 1);
  k->len += n;
  k->calls++;
}
static int message_calls;
static void message_cb(void* opaque, const char* s) {
  (void)opaque;
  (void)s;
  message_calls++;
}

/* Structure of a JSON document: balanced braces and brackets outside strings. */
static bool json_balanced(const char* s) {
  int depth = 0;
  bool in_str = false;
  for (; *s; s++) {
    if (in_str) {
      if (*s == '\\' && s[1]) s++;
      else if (*s == '"') in_str = false;
      continue;
    }
    if (*s == '"') in_str = true;
    else if (*s == '{' || *s == '[') depth++;
    else if (*s == '}' || *s == ']') {
      if (--depth < 0) return false;
    } else if (*s == ',' ) {
      const char* n = s + 1;
      while (*n == ' ' || *n == '\n' || *n == '\t') n++;
      if (*n == '}' || *n == ']') return false; /* trailing comma */
    }
  }
  return depth == 0 && !in_str;
}

static void test_stats_print(void) {
  TEST_SECTION("malloc_stats_print");
  sink_t k = {NULL, 0, 0};
  malloc_stats_print(sink_cb, &k, NULL);
  CHECK(k.calls > 0 && k.text != NULL);
  if (k.text) {
    CHECK(strstr(k.text, "___ Begin jemalloc statistics ___") != NULL);
    CHECK(strstr(k.text, "--- End jemalloc statistics ---") != NULL);
    CHECK(strstr(k.text, "Allocated: ") != NULL);
    CHECK(strstr(k.text, "Version: \"5.") != NULL);
    CHECK(strstr(k.text, "bins:") != NULL);
    if (on_keel) CHECK(strstr(k.text, "keel") != NULL);
    free(k.text);
  }
  sink_t j = {NULL, 0, 0};
  malloc_stats_print(sink_cb, &j, "J");
  if (CHECK(j.text != NULL)) {
    const char* s = j.text;
    while (*s == ' ' || *s == '\n') s++;
    CHECK(*s == '{');
    CHECK(json_balanced(j.text));
    CHECK(strstr(j.text, "\"jemalloc\"") != NULL);
    CHECK(strstr(j.text, "\"stats\"") != NULL);
    CHECK(strstr(j.text, "\"allocated\"") != NULL);
    CHECK(strstr(j.text, "\"stats.arenas\"") != NULL);
    free(j.text);
  }
  sink_t g = {NULL, 0, 0};
  malloc_stats_print(sink_cb, &g, "gmablxe");
  if (CHECK(g.text != NULL)) {
    CHECK(strstr(g.text, "Allocated: ") != NULL);
    CHECK(strstr(g.text, "Version") == NULL);
    CHECK(strstr(g.text, "bins:") == NULL);
    free(g.text);
  }
  sink_t gj = {NULL, 0, 0};
  malloc_stats_print(sink_cb, &gj, "Jgmablxe");
  if (CHECK(gj.text != NULL)) {
    CHECK(json_balanced(gj.text));
    free(gj.text);
  }
  /* NULL write_cb: malloc_message when set, else stderr. */
  message_calls = 0;
  malloc_message = message_cb;
  malloc_stats_print(NULL, NULL, "g");
  malloc_message = NULL;
  CHECK(message_calls > 0);
  fflush(stderr);
  int saved = dup(2), null = open("/dev/null", O_WRONLY);
  dup2(null, 2);
  malloc_stats_print(NULL, NULL, "J");
  dup2(saved, 2);
  close(null);
  close(saved);
}

/* ------------------------------------------------------------------------ main --- */

int main(int argc, char** argv) {
  page = (size_t)sysconf(_SC_PAGESIZE);
  const char* v = NULL;
  size_t len = sizeof v;
  if (mallctl("version", &v, &len, NULL, 0) == 0 && v && strstr(v, "keel")) on_keel = true;
  checked = on_keel && !read_bool("opt.tcache");
  if (argc > 1 && strcmp(argv[1], "sdallocx-wrong-size") == 0) {
    void* p = mallocx(100, 0);
    sdallocx(p, 300, 0); /* aborts in Keel's checked mode */
    printf("sdallocx returned\n");
    return 0;
  }
  printf("allocator: %s%s\n", on_keel ? "Keel" : "jemalloc", checked ? " (checked mode)" : "");
#ifdef KEEL_TESTING_KEEL
  /* Linked against libkeel: unless jemalloc was preloaded over it, Keel must answer. */
  if (getenv("LD_PRELOAD") == NULL || strstr(getenv("LD_PRELOAD"), "jemalloc") == NULL)
    CHECK_MSG(on_keel, "mallctl(\"version\") = %s: not Keel's", v ? v : "(none)");
#endif
  test_mallctl_basics();
  test_mib();
  test_sizes();
  test_zero();
  test_rallocx();
  test_xallocx();
  test_tcache_arena_flags();
  test_stats();
  test_threads();
  test_stats_print();
  return test_finish();
}
