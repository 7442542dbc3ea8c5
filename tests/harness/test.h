/* test.h -- the tiny test harness shared by Keel's test suites (api, stress, unit).
 *
 * No framework: CHECK/EXPECT macros print file:line and the failing expression, count
 * passes and failures (thread-safely), and test_finish() prints the final line
 *
 *     N passed, M failed
 *
 * and returns the exit status (non-zero if M > 0). Usable from C11 and C++17.
 *
 * Every suite is written so that it also builds and passes against plain glibc:
 *   gcc -O1 -fno-builtin -D_GNU_SOURCE -pthread -Itests/harness tests/api/test_api.c -o /tmp/t
 * Keel-specific checks (keel.h: keel_version, keel_stats_get, ...) are compiled in only
 * when KEEL_TESTING_KEEL is defined, which tests/CMakeLists.txt does for the real build.
 */
#ifndef KEEL_TEST_H
#define KEEL_TEST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef KEEL_TESTING_KEEL
#include <keel.h>
#endif

/* ---------------------------------------------------------------- counters --- */

static long t_passed_;
static long t_failed_;
/* Failure messages are rationed: a failing check inside a loop of a million iterations
 * would otherwise drown the log (and hide the other failures). At most T_SITE_REPORTS
 * messages per check site (file:line) and T_MAX_REPORTS in all; failures beyond that are
 * still counted. */
#define T_MAX_REPORTS 200
#define T_SITE_REPORTS 3
#define T_SITES 1024
static long t_reports_;
static struct {
  const char* file;
  int line;
  int count;
} t_sites_[T_SITES];
static char t_sites_lock_;

/* Returns how many failures this site had before this one. */
static inline int t_site_count_(const char* file, int line) {
  int n = 0;
  while (__atomic_test_and_set(&t_sites_lock_, __ATOMIC_ACQUIRE)) {
  }
  unsigned h = ((unsigned)(uintptr_t)file * 31u + (unsigned)line) % T_SITES;
  for (unsigned i = 0; i < T_SITES; i++, h = (h + 1) % T_SITES) {
    if (t_sites_[h].file == NULL) {
      t_sites_[h].file = file;
      t_sites_[h].line = line;
    }
    if (t_sites_[h].file == file && t_sites_[h].line == line) {
      n = t_sites_[h].count++;
      break;
    }
  }
  __atomic_clear(&t_sites_lock_, __ATOMIC_RELEASE);
  return n;
}

static inline int t_pass_(void) {
  __atomic_fetch_add(&t_passed_, 1, __ATOMIC_RELAXED);
  return 1;
}

static inline int t_fail_(const char* file, int line, const char* what, const char* detail) {
  __atomic_fetch_add(&t_failed_, 1, __ATOMIC_RELAXED);
  int site = t_site_count_(file, line);
  if (site > T_SITE_REPORTS) return 0;
  if (site == T_SITE_REPORTS) {
    fprintf(stderr, "%s:%d: (further failures of this check are counted, not printed)\n", file,
            line);
    return 0;
  }
  long n = __atomic_fetch_add(&t_reports_, 1, __ATOMIC_RELAXED);
  if (n < T_MAX_REPORTS)
    fprintf(stderr, "%s:%d: FAILED: %s%s%s\n", file, line, what, detail ? "  -- " : "",
            detail ? detail : "");
  else if (n == T_MAX_REPORTS)
    fprintf(stderr, "(further failure messages suppressed; failures are still counted)\n");
  return 0;
}

static inline long t_failures(void) { return __atomic_load_n(&t_failed_, __ATOMIC_RELAXED); }

/* CHECK(expr): records a pass or a failure; evaluates to expr's truth value so a test
 * can bail out of a block whose later steps depend on it:  if (!CHECK(p)) return; */
#define CHECK(expr) ((expr) ? t_pass_() : t_fail_(__FILE__, __LINE__, #expr, NULL))

/* CHECK_MSG(expr, fmt, ...): as CHECK, with a printf-style detail on failure. */
#define CHECK_MSG(expr, ...) T_CHECK_((expr), #expr, __VA_ARGS__)
#define T_CHECK_(cond, text, ...) \
  ((cond) ? t_pass_() : t_failm_(__FILE__, __LINE__, text, __VA_ARGS__))

__attribute__((format(printf, 4, 5))) static inline int t_failm_(const char* file, int line,
                                                                 const char* what,
                                                                 const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return t_fail_(file, line, what, buf);
}

/* EXPECT_* family: print both operands' values on failure. */
#define EXPECT_EQ_U(a, b)                                                                \
  do {                                                                                   \
    uintmax_t t_a_ = (uintmax_t)(a), t_b_ = (uintmax_t)(b);                              \
    T_CHECK_(t_a_ == t_b_, #a " == " #b, "%ju (0x%jx) vs %ju (0x%jx)", t_a_, t_a_, t_b_,  \
             t_b_);                                                                      \
  } while (0)
#define EXPECT_EQ_I(a, b)                                                                \
  do {                                                                                   \
    intmax_t t_a_ = (intmax_t)(a), t_b_ = (intmax_t)(b);                                 \
    T_CHECK_(t_a_ == t_b_, #a " == " #b, "%jd vs %jd", t_a_, t_b_);                      \
  } while (0)
#define EXPECT_EQ_P(a, b)                                                                \
  do {                                                                                   \
    const void* t_a_ = (const void*)(a);                                                 \
    const void* t_b_ = (const void*)(b);                                                 \
    T_CHECK_(t_a_ == t_b_, #a " == " #b, "%p vs %p", t_a_, t_b_);                        \
  } while (0)
#define EXPECT_GE_U(a, b)                                                                \
  do {                                                                                   \
    uintmax_t t_a_ = (uintmax_t)(a), t_b_ = (uintmax_t)(b);                              \
    T_CHECK_(t_a_ >= t_b_, #a " >= " #b, "%ju vs %ju", t_a_, t_b_);                      \
  } while (0)
#define EXPECT_LT_U(a, b)                                                                \
  do {                                                                                   \
    uintmax_t t_a_ = (uintmax_t)(a), t_b_ = (uintmax_t)(b);                              \
    T_CHECK_(t_a_ < t_b_, #a " < " #b, "%ju vs %ju", t_a_, t_b_);                        \
  } while (0)
#define EXPECT_ALIGNED(p, align)                                                         \
  do {                                                                                   \
    uintptr_t t_p_ = (uintptr_t)(p);                                                     \
    uintmax_t t_al_ = (uintmax_t)(align);                                                \
    T_CHECK_(t_al_ != 0 && t_p_ % t_al_ == 0, #p " aligned to " #align,                  \
             "%p is not a multiple of %ju", (void*)t_p_, t_al_);                         \
  } while (0)

/* Prints the final summary line and returns the process exit status. */
static inline int test_finish(void) {
  long p = __atomic_load_n(&t_passed_, __ATOMIC_RELAXED);
  long f = __atomic_load_n(&t_failed_, __ATOMIC_RELAXED);
  fflush(stdout);
  printf("%ld passed, %ld failed\n", p, f);
  fflush(stdout);
  return f > 0 ? 1 : 0;
}

/* Section banner, so a failure can be placed in the log without reading line numbers. */
#define TEST_SECTION(name) \
  do {                     \
    printf("-- %s\n", name); \
    fflush(stdout);        \
  } while (0)

/* ----------------------------------------------------------------- helpers --- */

/* Hides a value from the optimiser: the compiler cannot prove anything about the result
 * (so malloc(opaque_size(SIZE_MAX)) draws no -Walloc-size-larger-than warning and no
 * constant folding), and a pointer passed through it escapes. */
static inline size_t opaque_size(size_t v) {
  __asm__ __volatile__("" : "+r"(v));
  return v;
}
static inline void* opaque_ptr(void* p) {
  __asm__ __volatile__("" : "+r"(p) : : "memory");
  return p;
}
/* Marks memory as used, so stores into it cannot be eliminated. */
static inline void escape(const void* p) { __asm__ __volatile__("" : : "r"(p) : "memory"); }

/* xorshift64*: a small deterministic PRNG, one state per thread. */
typedef struct {
  uint64_t s;
} t_rng;
static inline void rng_seed(t_rng* r, uint64_t seed) {
  r->s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  if (r->s == 0) r->s = 1;
}
static inline uint64_t rng_next(t_rng* r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return x * 0x2545F4914F6CDD1Dull;
}
/* Uniform-ish in [lo, hi] (inclusive). */
static inline uint64_t rng_range(t_rng* r, uint64_t lo, uint64_t hi) {
  return lo + rng_next(r) % (hi - lo + 1);
}

/* A block size from Keel's four tiers, drawn with the given odds (out of `per`): small
 * (small_min..1 KiB), slab classes (to 128 KiB), large spans (to 1 MiB), huge (to
 * huge_max). One rng_next and one rng_range per call, whatever the mix. */
static inline size_t rng_tier_size(t_rng* r, unsigned per, unsigned small, unsigned classes,
                                   unsigned large, size_t small_min, size_t huge_max) {
  uint64_t u = rng_next(r) % per;
  if (u < small) return (size_t)rng_range(r, small_min, 1024);
  if (u < classes) return (size_t)rng_range(r, 1025, 128 << 10);
  if (u < large) return (size_t)rng_range(r, (128 << 10) + 1, 1 << 20);
  return (size_t)rng_range(r, (1 << 20) + 1, huge_max);
}

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* Deterministic fill pattern: byte i of a block with seed s is a function of (s, i).
 * Position-based, so after a realloc the preserved prefix still verifies against the
 * old seed. Written 8 bytes at a time (blocks are 16-aligned; memcpy keeps it legal). */
static inline uint64_t pattern_word(uint64_t seed, size_t word_index) {
  return (seed + word_index) * 0x9E3779B97F4A7C15ull ^ (seed >> 7);
}
static inline void pattern_fill(void* p, size_t n, uint64_t seed) {
  unsigned char* b = (unsigned char*)p;
  size_t w = n / 8, i;
  for (i = 0; i < w; i++) {
    uint64_t v = pattern_word(seed, i);
    memcpy(b + 8 * i, &v, 8);
  }
  if (n % 8) {
    uint64_t v = pattern_word(seed, w);
    memcpy(b + 8 * w, &v, n % 8);
  }
}
/* Returns the offset of the first byte that differs from the pattern, or SIZE_MAX if
 * all n bytes match. */
static inline size_t pattern_check(const void* p, size_t n, uint64_t seed) {
  const unsigned char* b = (const unsigned char*)p;
  size_t w = n / 8, i, j;
  for (i = 0; i < w; i++) {
    uint64_t v = pattern_word(seed, i), got;
    memcpy(&got, b + 8 * i, 8);
    if (got != v) {
      const unsigned char* e = (const unsigned char*)&v;
      for (j = 0; j < 8; j++)
        if (b[8 * i + j] != e[j]) return 8 * i + j;
    }
  }
  if (n % 8) {
    uint64_t v = pattern_word(seed, w);
    const unsigned char* e = (const unsigned char*)&v;
    for (j = 0; j < n % 8; j++)
      if (b[8 * w + j] != e[j]) return 8 * w + j;
  }
  return SIZE_MAX;
}
/* Offset of the first non-zero byte in p[0..n), or SIZE_MAX. */
static inline size_t first_nonzero(const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    memcpy(&v, b + i, 8);
    if (v) break;
  }
  for (; i < n; i++)
    if (b[i]) return i;
  return SIZE_MAX;
}

static inline double now_sec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Calls keel_purge() again and again for `seconds` (under Keel), pausing pause_ns between
 * two calls; returns how many rounds it made. */
static inline long purge_repeatedly(double seconds, long pause_ns) {
  long rounds = 0;
  for (double t0 = now_sec(); now_sec() - t0 < seconds; rounds++) {
#ifdef KEEL_TESTING_KEEL
    keel_purge();
#endif
    struct timespec ts = {0, pause_ns};
    nanosleep(&ts, NULL);
  }
  return rounds;
}

/* KEEL_STRESS_SCALE (default 1; fractions allowed, e.g. 0.2 for a quick run). */
static inline double stress_scale(void) {
  const char* s = getenv("KEEL_STRESS_SCALE");
  double v = s ? strtod(s, NULL) : 1.0;
  return v > 0 ? v : 1.0;
}

/* One of the first two fields of /proc/self/statm in bytes: 0 the address space, 1 the
 * resident set (0 if unreadable). No stdio streams: they would allocate while we
 * measure. */
static inline size_t statm_bytes(int field) {
  char buf[128];
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  unsigned long v[2] = {0, 0};
  if (sscanf(buf, "%lu %lu", &v[0], &v[1]) != 2) return 0;
  return (size_t)v[field] * (size_t)sysconf(_SC_PAGESIZE);
}

/* Resident set size in bytes (0 if unreadable). */
static inline size_t rss_bytes(void) { return statm_bytes(1); }

static inline int is_pow2(size_t x) { return x && !(x & (x - 1)); }
static inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* --------------------------------------------------------- keel in use? --- */

#ifdef KEEL_TESTING_KEEL
static inline keel_stats_t keel_stats_now(void) {
  keel_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = (uint32_t)sizeof s;
  if (keel_stats_get(&s) != 0) t_fail_(__FILE__, __LINE__, "keel_stats_get(&s) == 0", NULL);
  return s;
}

/* A counter of keel_stats_json by name ("caches_taken_back"), 0 if absent. */
static inline unsigned long long keel_stats_counter(const char* name) {
  char json[8192], key[64];
  keel_stats_json(json, sizeof json);
  snprintf(key, sizeof key, "\"%s\":", name);
  const char* at = strstr(json, key);
  return at ? strtoull(at + strlen(key), NULL, 10) : 0;
}
#endif

/* Asserts that the allocator under test really is Keel (the test binary links libkeel.so
 * ahead of libc, so its malloc must interpose glibc's). Against glibc it only prints a
 * note. Call first thing in main(). */
static inline void assert_keel_in_use(void) {
#ifdef KEEL_TESTING_KEEL
  const char* v = keel_version();
  CHECK_MSG(v != NULL && v[0] != 0, "keel_version() returned %s", v ? "\"\"" : "NULL");
  /* A small block first: it goes through the calling thread's cache, creating it. */
  void* small = malloc(opaque_size(32));
  CHECK(small != NULL);
  keel_stats_t s0 = keel_stats_now();
  /* 8 MiB: large enough to be mapped directly, so it shows up at once in the stats even
   * if small-object counters are aggregated lazily from thread caches. */
  size_t big = (size_t)8 << 20;
  void* p = malloc(opaque_size(big));
  CHECK(p != NULL);
  if (p) memset(p, 1, 4096);
  keel_stats_t s1 = keel_stats_now();
  EXPECT_EQ_U(s1.version, KEEL_STATS_VERSION);
  EXPECT_GE_U(s1.threads_total, 1);
  EXPECT_GE_U(s1.os_page_size, 4096);
  /* If malloc were still glibc's, Keel's counters would not move. */
  CHECK_MSG(s1.allocated >= s0.allocated + big,
            "malloc(8 MiB) did not raise keel allocated (%" PRIu64 " -> %" PRIu64
            "): is malloc really Keel's?",
            s0.allocated, s1.allocated);
  free(p);
  free(small);
  printf("allocator: keel %s\n", v ? v : "?");
#else
  printf("allocator: system (KEEL_TESTING_KEEL not defined; keel-specific checks skipped)\n");
#endif
  fflush(stdout);
}

#endif /* KEEL_TEST_H */
