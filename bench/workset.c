/* workset -- a query's working set: many blocks of one size, allocated, then all freed.
 *
 * Each of N threads repeats rounds: take a size from {24, 48, 64, 96, 128, 256, 512,
 * 1000} bytes and a count of 200-1600, allocate that many blocks of that size, write a
 * value into the first word and a tag into the last bytes of each, then verify and free
 * them all -- in allocation order in even rounds, in reverse order in odd ones. The
 * pointers are kept in an array each thread allocates once, before its rounds. Every
 * free is local; the pattern stresses allocating a run of one size class from empty
 * and giving it all back (the working set of one operation of a database query).
 *
 * The total number of rounds is fixed and shared among the threads; a round's size,
 * count and values depend only on its index in the whole run, so the checksum (an
 * order-independent sum of a hash per round) does not depend on the thread count.
 * Usage: workset [scale] [threads=2]
 */
#include <pthread.h>

#include "bench.h"

enum { MIN_COUNT = 200, MAX_COUNT = 1600 };

static const uint32_t sizes[] = {24, 48, 64, 96, 128, 256, 512, 1000};

static void* run(void* arg) {
  bench_share_t* w = arg;
  uint64_t** blocks = xmalloc(MAX_COUNT * sizeof(uint64_t*));
  for (uint64_t g = w->first; g < w->end; g++) {
    rng_t rng;
    rng_seed(&rng, 0x776f726bull ^ (g * 0x100000001b3ull));
    uint32_t sz = sizes[rng_below(&rng, sizeof sizes / sizeof sizes[0])];
    uint32_t n = rng_range(&rng, MIN_COUNT, MAX_COUNT);
    uint64_t v = rng_next(&rng);
    for (uint32_t i = 0; i < n; i++) {
      uint64_t* p = xmalloc(sz);
      uint64_t x = v + i;
      p[0] = x;
      ((unsigned char*)p)[sz - 1] = (unsigned char)(x >> 8);
      ((unsigned char*)p)[sz / 2] = (unsigned char)x;
      blocks[i] = p;
    }
    uint64_t ck = ck_step(sz, n);
    int reverse = g & 1;
    for (uint32_t j = 0; j < n; j++) {
      uint32_t i = reverse ? n - 1 - j : j;
      uint64_t* p = blocks[i];
      uint64_t x = p[0];
      BENCH_CHECK(x == v + i && ((unsigned char*)p)[sz - 1] == (unsigned char)(x >> 8) &&
                  ((unsigned char*)p)[sz / 2] == (unsigned char)x);
      ck = ck_step(ck, x);
      free(p);
    }
    w->ck += mix64(ck);
    w->pairs += n;
  }
  free(blocks);
  return NULL;
}

int main(int argc, char** argv) {
  bench_init("workset", argc, argv, 2);
  int n = bench_threads;
  uint64_t rounds = bench_scaled(40000, 1);
  uint64_t ck, pairs = bench_run_shared(n, rounds, run, &ck);
  printf("workset threads=%d rounds=%" PRIu64 " objects=%" PRIu64 " checksum=%016" PRIx64 "\n", n, rounds, pairs,
         ck_step(ck, pairs));
  return 0;
}
