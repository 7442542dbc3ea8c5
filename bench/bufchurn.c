/* bufchurn -- request buffers: each thread takes a few 9-16 KiB buffers, fills the
 * ends of each, checks and frees them, again and again (a server's per-query read,
 * sort and packet buffers). Keel gathers such blocks from waiting threads' bins before
 * a class takes a new slab (design.md, "Blocks above 8 KiB are gathered"): this is what
 * the thread caches give such threads, with no other work beside it.
 * Checksum: a sum of each round's hash of its sizes, independent of the thread count.
 * Total work is fixed; threads share it.
 * Usage: bufchurn [scale] [threads=2]
 */
#include <pthread.h>

#include "bench.h"

enum { MAX_HELD = 4 };

static const uint32_t sizes[] = {9000, 10240, 12000, 13024, 14048, 15072, 16000};

static void* run(void* arg) {
  bench_share_t* w = arg;
  unsigned char* held[MAX_HELD];
  uint32_t len[MAX_HELD];
  for (uint64_t r = w->first; r < w->end; r++) {
    rng_t rng;
    rng_seed(&rng, 0x62756663ull ^ (r * 0x100000001b3ull));
    uint32_t n = rng_range(&rng, 1, MAX_HELD);
    for (uint32_t i = 0; i < n; i++) {
      len[i] = sizes[rng_below(&rng, sizeof sizes / sizeof sizes[0])];
      held[i] = xmalloc(len[i]);
      held[i][0] = (unsigned char)(r + i);
      held[i][len[i] - 1] = (unsigned char)(len[i] + i);
    }
    uint64_t ck = r;
    for (uint32_t i = 0; i < n; i++) {
      BENCH_CHECK(held[i][0] == (unsigned char)(r + i) && held[i][len[i] - 1] == (unsigned char)(len[i] + i));
      ck = ck_step(ck, len[i]);
      free(held[i]);
    }
    w->ck += mix64(ck);
    w->pairs += n;
  }
  return NULL;
}

int main(int argc, char** argv) {
  bench_init("bufchurn", argc, argv, 2);
  int n = bench_threads;
  uint64_t rounds = bench_scaled(4000000, 1);
  uint64_t ck, pairs = bench_run_shared(n, rounds, run, &ck);
  printf("bufchurn threads=%d rounds=%" PRIu64 " buffers=%" PRIu64 " checksum=%016" PRIx64 "\n", n, rounds, pairs,
         ck_step(ck, pairs));
  return 0;
}
