/* test_profile.c -- the heap profile's estimates, scaled back up as pprof does.
 *
 * Run with KEEL_PROFILE_RATE=256K. pprof takes a sample of s bytes to stand for
 * s / (1 - e^(-s/rate)) bytes; the profile is right when the chance of sampling a block
 * is what that formula assumes and the size recorded is the one the chance went by:
 *   - many small blocks of a size below their class: the estimate is the class bytes;
 *   - blocks of a class not far below the rate: sampled as often as pprof assumes;
 *   - threads that each keep one big block: each thread's first is not sampled for sure;
 *   - big blocks resized in place keep their samples, with their new size.
 */
#include "test.h"

#include <malloc.h>
#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int keel_profile_dump(const char* path);

static double rate;

/* The dump's totals: samples, sampled bytes, and pprof's estimate of the heap. */
typedef struct {
  double count, bytes, estimate;
} totals_t;

static totals_t dump_totals(const char* path) {
  totals_t t = {0, 0, 0};
  CHECK(keel_profile_dump(path) == 0);
  FILE* f = fopen(path, "r");
  if (!CHECK(f != NULL)) return t;
  char line[4096];
  bool first = true;
  while (fgets(line, sizeof line, f) != NULL) {
    double c, b;
    if (first) {
      first = false;
      continue; /* the header's totals: the lines' sums */
    }
    if (sscanf(line, " %lf: %lf [", &c, &b) != 2 || c <= 0) continue;
    t.count += c;
    t.bytes += b;
    t.estimate += b / (1 - exp(-(b / c) / rate));
  }
  fclose(f);
  unlink(path);
  return t;
}

__attribute__((noinline)) static void* site(size_t n) { return malloc(n); }

static void* keep_one_big(void* arg) {
  *(void**)arg = site(200000);
  return NULL;
}

int main(void) {
  const char* r = getenv("KEEL_PROFILE_RATE");
  if (r == NULL || strcmp(r, "256K") != 0) {
    fprintf(stderr, "run with KEEL_PROFILE_RATE=256K\n");
    return 2;
  }
  rate = 262144;
  char path[64];
  snprintf(path, sizeof path, "/tmp/keel-test-profile.%d.heap", (int)getpid());

  TEST_SECTION("small blocks: the estimate is their class bytes");
  enum { SMALL = 2000000 }; /* about 244 samples: 20 % is three standard deviations */
  void** small = mmap(NULL, SMALL * sizeof(void*), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!CHECK(small != MAP_FAILED)) return test_finish();
  for (size_t i = 0; i < SMALL; i++) small[i] = site(17); /* 32-byte blocks */
  totals_t t = dump_totals(path);
  double want = 32.0 * SMALL;
  CHECK_MSG(t.estimate > 0.8 * want && t.estimate < 1.2 * want, "estimate %.0f for %.0f bytes (%.0f samples)",
            t.estimate, want, t.count);
  for (size_t i = 0; i < SMALL; i++) free(small[i]);

  TEST_SECTION("blocks of a class near the rate: each sampled with the chance pprof assumes");
  enum { NEAR = 2000 };
  for (size_t i = 0; i < NEAR; i++) small[i] = site(100000);
  size_t class_size = malloc_usable_size(small[0]);
  t = dump_totals(path);
  want = (double)class_size * NEAR; /* about 670 samples: 15 % is four standard deviations */
  CHECK_MSG(t.estimate > 0.85 * want && t.estimate < 1.15 * want, "estimate %.0f for %.0f bytes (%.0f samples)",
            t.estimate, want, t.count);
  for (size_t i = 0; i < NEAR; i++) free(small[i]);

  TEST_SECTION("one big block in each of many threads: no thread's first is sampled for sure");
  enum { THREADS = 200 };
  static void* big[THREADS];
  for (int i = 0; i < THREADS; i++) {
    pthread_t th;
    CHECK(pthread_create(&th, NULL, keep_one_big, &big[i]) == 0 && pthread_join(th, NULL) == 0);
  }
  t = dump_totals(path);
  /* 1 - e^(-200000/262144) = 0.53 of them: 107 expected (all 200 were sampled) */
  CHECK_MSG(t.count > 60 && t.count < 160, "%.0f of %d blocks sampled", t.count, THREADS);
  for (int i = 0; i < THREADS; i++) free(big[i]);

  TEST_SECTION("big blocks resized in place keep their samples");
  enum { BIG = 400 };
  static void* blocks[BIG];
  for (int i = 0; i < BIG; i++) blocks[i] = site(300000);
  totals_t before = dump_totals(path);
  for (int i = 0; i < BIG; i++) blocks[i] = realloc(blocks[i], 310000);
  totals_t after = dump_totals(path);
  CHECK_MSG(before.count > 150 && after.count > 0.6 * before.count,
            "%.0f samples of %.0f bytes before the reallocs, %.0f of %.0f after", before.count, before.bytes,
            after.count, after.bytes);
  for (int i = 0; i < BIG; i++) free(blocks[i]);
  return test_finish();
}
