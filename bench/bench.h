/* bench.h -- helpers shared by libkeel's benchmark programs.
 *
 * The programs use only the standard C allocator API (malloc, calloc, realloc, free);
 * the allocator under test is chosen by LD_PRELOAD (see run.py). Every program:
 *   - takes an optional scale factor as argv[1] (default 1.0: about 0.3-2 s of work;
 *     the amount of work grows linearly with it) and, if it is threaded, an optional
 *     thread count as argv[2];
 *   - derives all its random choices from a fixed seed, never from addresses, timing
 *     or malloc_usable_size, so it does exactly the same work under every allocator;
 *   - verifies the contents of every block before freeing it;
 *   - prints one line "<name> <parameters> checksum=<16 hex digits>". The checksum
 *     depends only on the work done, so it must be identical under every allocator;
 *     in threaded programs it is built from order-independent sums.
 */
#ifndef KEEL_BENCH_H
#define KEEL_BENCH_H

#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define BENCH_UNUSED __attribute__((unused))
#define BENCH_NORETURN __attribute__((noreturn))
#define BENCH_NOINLINE __attribute__((noinline))
#else
#define BENCH_UNUSED
#define BENCH_NORETURN
#define BENCH_NOINLINE
#endif

static const char* bench_name = "bench";

static BENCH_UNUSED BENCH_NORETURN void bench_die(const char* fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: FAILED: ", bench_name);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  abort();
}

/* Verification that survives -DNDEBUG. */
#define BENCH_CHECK(cond)                                                          \
  do {                                                                             \
    if (!(cond)) bench_die("%s:%d: check `%s` failed", __FILE__, __LINE__, #cond); \
  } while (0)

static inline void* xmalloc(size_t n) {
  void* p = malloc(n);
  if (p == NULL) bench_die("malloc(%zu) returned NULL", n);
  return p;
}
static inline void* xcalloc(size_t n, size_t sz) {
  void* p = calloc(n, sz);
  if (p == NULL) bench_die("calloc(%zu, %zu) returned NULL", n, sz);
  return p;
}
/* Per-thread records that their threads write as they work start on a 128-byte line
 * pair of their own (BENCH_OWN_LINES on the first member, and this allocation): side by
 * side, two threads' counters shared a cache line, and each write took it from the
 * other core, a cost of the harness charged to whichever allocator ran. Zeroed. */
#define BENCH_OWN_LINES _Alignas(128)
static inline void* xcalloc_own_lines(size_t n, size_t sz) {
  size_t bytes = (n * sz + 127) & ~(size_t)127;
  void* p = aligned_alloc(128, bytes);
  if (p == NULL) bench_die("aligned_alloc(128, %zu) returned NULL", bytes);
  return memset(p, 0, bytes);
}
static inline void* xrealloc(void* old, size_t n) {
  void* p = realloc(old, n);
  if (p == NULL) bench_die("realloc(%zu) returned NULL", n);
  return p;
}

/* ---- deterministic pseudo-random numbers (splitmix64) ---- */
typedef struct {
  uint64_t s;
} rng_t;

static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static inline void rng_seed(rng_t* r, uint64_t seed) { r->s = mix64(seed + 0x2545f4914f6cdd1dULL); }
static inline uint64_t rng_next(rng_t* r) { return mix64(r->s += 0x9e3779b97f4a7c15ULL); }
/* Uniform in [0, n), n < 2^32. */
static inline uint32_t rng_below(rng_t* r, uint32_t n) {
  return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}
/* Uniform in [lo, hi]. */
static inline uint32_t rng_range(rng_t* r, uint32_t lo, uint32_t hi) {
  return lo + rng_below(r, hi - lo + 1);
}
/* True with probability pct/100. */
static inline int rng_pct(rng_t* r, uint32_t pct) { return rng_below(r, 100) < pct; }

/* Order-dependent checksum step (single-threaded sequences). */
static inline uint64_t ck_step(uint64_t ck, uint64_t v) { return mix64(ck ^ v) + 0x9e3779b97f4a7c15ULL; }

/* Hash of a byte string (FNV-1a, then mixed). */
static inline uint64_t hash_bytes(const void* p, size_t n) {
  const unsigned char* s = (const unsigned char*)p;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
  return mix64(h);
}

/* ---- command line ---- */
static double bench_scale = 1.0;
static int bench_threads = 1;

/* Parses "[scale] [threads]" (threads only if default_threads > 0). */
static BENCH_UNUSED void bench_init(const char* name, int argc, char** argv, int default_threads) {
  bench_name = name;
  bench_threads = default_threads > 0 ? default_threads : 1;
  int maxargs = default_threads > 0 ? 2 : 1;
  if (argc > 1 + maxargs || (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
    fprintf(stderr, "usage: %s [scale]%s\n  scale: work multiplier, default 1.0\n", argv[0],
            default_threads > 0 ? " [threads]" : "");
    if (default_threads > 0) fprintf(stderr, "  threads: default %d\n", default_threads);
    exit(2);
  }
  if (argc > 1) {
    char* end;
    errno = 0;
    bench_scale = strtod(argv[1], &end);
    if (errno || *end || !(bench_scale > 0) || bench_scale > 1e6) {
      fprintf(stderr, "%s: bad scale '%s' (want a number > 0)\n", name, argv[1]);
      exit(2);
    }
  }
  if (argc > 2) {
    char* end;
    errno = 0;
    long t = strtol(argv[2], &end, 10);
    if (errno || *end || t < 1 || t > 1024) {
      fprintf(stderr, "%s: bad thread count '%s' (want 1..1024)\n", name, argv[2]);
      exit(2);
    }
    bench_threads = (int)t;
  }
}

/* base * scale, rounded, at least `min`. */
static BENCH_UNUSED uint64_t bench_scaled(double base, uint64_t min) {
  double v = base * bench_scale + 0.5;
  uint64_t n = v >= 1.8e19 ? UINT64_MAX : (uint64_t)v;
  return n < min ? min : n;
}

/* A fixed amount of work split among threads: each runs fn on its share [first, end) of
 * the rounds and counts what it did in pairs and ck (sums: the totals do not depend on
 * the thread count or the order). */
typedef struct {
  BENCH_OWN_LINES uint64_t first;
  uint64_t end;
  uint64_t pairs, ck;
  pthread_t th;
} bench_share_t;

/* Runs fn on n threads, each given a bench_share_t of `rounds`, waits for them, and
 * returns the sum of their pairs (*ck: of their checksums). */
static BENCH_UNUSED uint64_t bench_run_shared(int n, uint64_t rounds, void* (*fn)(void*), uint64_t* ck) {
  bench_share_t* w = xcalloc_own_lines((size_t)n, sizeof(bench_share_t));
  for (int i = 0; i < n; i++) {
    w[i].first = rounds * (uint64_t)i / (uint64_t)n;
    w[i].end = rounds * (uint64_t)(i + 1) / (uint64_t)n;
    if (pthread_create(&w[i].th, NULL, fn, &w[i])) bench_die("pthread_create failed");
  }
  uint64_t pairs = 0;
  *ck = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(w[i].th, NULL);
    pairs += w[i].pairs;
    *ck += w[i].ck;
  }
  free(w);
  return pairs;
}

#endif /* KEEL_BENCH_H */
