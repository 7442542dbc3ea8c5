/* mixed -- random sizes up to 32 KiB with a live set, realloc included.
 *
 * Each thread (1 by default) owns a table of 16384 slots. Each operation picks a random
 * slot: an empty slot gets a new block; a full one is freed (60%) or reallocated to a
 * new random size (40%). Sizes: 50% 16-128 B, 30% 129 B-1 KiB, 15% 1-8 KiB, 5% 8-32 KiB;
 * about 62% of the slots are in use at any time (~20 MiB live). Blocks are written in
 * full when allocated or grown, and their contents are checked before free and after
 * realloc (the preserved prefix must survive the move).
 * Checksum: hash of the sequence of sizes and contents seen.
 * Usage: mixed [scale] [threads=1]
 */
#include <pthread.h>

#include "bench.h"

enum { SLOTS = 16384 };

typedef struct {
  uint64_t ops;
  int id;
  uint64_t ck;
  pthread_t th;
} task;

static uint32_t pick_size(rng_t* r) {
  uint32_t p = rng_below(r, 100);
  if (p < 50) return rng_range(r, 16, 128);
  if (p < 80) return rng_range(r, 129, 1024);
  if (p < 95) return rng_range(r, 1025, 8192);
  return rng_range(r, 8193, 32768);
}

/* Block layout: bytes [0, size) all equal to tag except the last 4 bytes, which hold size. */
static void fill(unsigned char* p, size_t from, uint32_t size, unsigned char tag) {
  if (size > from) memset(p + from, tag, size - from);
  memcpy(p + size - 4, &size, 4);
}
static void check_tag(const unsigned char* p, uint32_t n, unsigned char tag) {
  BENCH_CHECK(p[0] == tag && p[n / 2] == tag && p[n - 1] == tag);
}
static void check(const unsigned char* p, uint32_t size, unsigned char tag) {
  uint32_t stored;
  memcpy(&stored, p + size - 4, 4);
  BENCH_CHECK(stored == size);
  check_tag(p, size - 4, tag);
}

static void* run(void* arg) {
  task* t = arg;
  rng_t rng;
  rng_seed(&rng, 5000 + (uint64_t)t->id);
  unsigned char** slot = xcalloc(SLOTS, sizeof *slot);
  uint32_t* size = xcalloc(SLOTS, sizeof *size);
  uint64_t ck = 0;
  for (uint64_t i = 0; i < t->ops; i++) {
    uint32_t s = rng_below(&rng, SLOTS);
    unsigned char tag = (unsigned char)(s * 7 + 1);
    if (!slot[s]) {
      uint32_t sz = pick_size(&rng);
      slot[s] = xmalloc(sz);
      fill(slot[s], 0, sz, tag);
      size[s] = sz;
    } else if (rng_pct(&rng, 60)) {
      check(slot[s], size[s], tag);
      ck = ck_step(ck, size[s]);
      free(slot[s]);
      slot[s] = NULL;
    } else {
      uint32_t old = size[s], sz = pick_size(&rng);
      unsigned char* p = xrealloc(slot[s], sz);
      uint32_t keep = (old < sz ? old : sz) - 4; /* bytes still equal to tag */
      check_tag(p, keep, tag);
      if (sz >= old) {
        uint32_t stored;
        memcpy(&stored, p + old - 4, 4);
        BENCH_CHECK(stored == old);
      }
      fill(p, keep, sz, tag);
      ck = ck_step(ck, (uint64_t)old << 32 | sz);
      slot[s] = p;
      size[s] = sz;
    }
  }
  for (uint32_t s = 0; s < SLOTS; s++) {
    if (slot[s]) {
      check(slot[s], size[s], (unsigned char)(s * 7 + 1));
      ck = ck_step(ck, size[s]);
      free(slot[s]);
    }
  }
  free(slot);
  free(size);
  t->ck = ck;
  return NULL;
}

int main(int argc, char** argv) {
  bench_init("mixed", argc, argv, 1);
  int n = bench_threads;
  uint64_t total = bench_scaled(4500000, (uint64_t)n);
  task* tasks = xcalloc((size_t)n, sizeof(task));
  for (int i = 0; i < n; i++) {
    tasks[i].id = i;
    tasks[i].ops = total / (uint64_t)n + ((uint64_t)i < total % (uint64_t)n);
  }
  if (n == 1) {
    run(&tasks[0]);
  } else {
    for (int i = 0; i < n; i++)
      if (pthread_create(&tasks[i].th, NULL, run, &tasks[i])) bench_die("pthread_create failed");
    for (int i = 0; i < n; i++) pthread_join(tasks[i].th, NULL);
  }
  uint64_t ck = 0;
  for (int i = 0; i < n; i++) ck += mix64(tasks[i].ck);
  free(tasks);
  printf("mixed threads=%d ops=%" PRIu64 " checksum=%016" PRIx64 "\n", n, total, ck);
  return 0;
}
