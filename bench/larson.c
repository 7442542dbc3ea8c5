/* larson -- Larson & Krishnan's server simulation, with a fixed amount of work.
 *
 * N "lanes" (4 by default) each own an array of 2000 blocks of 8-1000 bytes, which the
 * main thread allocates at start. A lane is served by a chain of threads: each thread
 * replaces 10000 random blocks of its lane (verify, free, allocate a new random size,
 * write) and then starts its successor, which inherits the lane, and exits. So blocks
 * are freed by threads other than the one that allocated them, often after that
 * thread has exited, and threads come and go all the time. Unlike the original, the
 * run does a fixed number of replacements rather than running for a fixed time.
 * Checksum: sum of the values of all blocks freed, checked against the sum allocated.
 * Usage: larson [scale] [threads=4]
 */
#include <pthread.h>

#include "bench.h"

enum { BLOCKS = 2000, OPS_PER_THREAD = 10000, MIN_SIZE = 8, MAX_SIZE = 1000 };

typedef struct {
  uint64_t* blk[BLOCKS]; /* blk[i][0] = value; last byte (if not in blk[i][0]) = its low byte */
  uint32_t size[BLOCKS];
  rng_t rng;
  uint64_t gens_left;
  uint64_t made, freed;
} lane;

static pthread_mutex_t done_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static int lanes_running;

static uint64_t* new_block(lane* l, uint32_t* size_out) {
  uint32_t sz = rng_range(&l->rng, MIN_SIZE, MAX_SIZE);
  uint64_t* b = xmalloc(sz);
  uint64_t v = rng_next(&l->rng);
  b[0] = v;
  if (sz > 8) {
    memset((char*)b + 8, 0x5a, (sz > 64 ? 64 : sz) - 8); /* "initialise" the first bytes */
    ((unsigned char*)b)[sz - 1] = (unsigned char)v;
  }
  *size_out = sz;
  l->made += v;
  return b;
}

static void free_block(lane* l, uint64_t* b, uint32_t sz) {
  uint64_t v = b[0];
  BENCH_CHECK(sz == 8 || ((unsigned char*)b)[sz - 1] == (unsigned char)v);
  l->freed += v;
  free(b);
}

static void* run(void* arg) {
  lane* l = arg;
  for (int i = 0; i < OPS_PER_THREAD; i++) {
    uint32_t k = rng_below(&l->rng, BLOCKS);
    free_block(l, l->blk[k], l->size[k]);
    l->blk[k] = new_block(l, &l->size[k]);
  }
  if (--l->gens_left > 0) {
    pthread_t next;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&next, &attr, run, l)) bench_die("pthread_create failed");
    pthread_attr_destroy(&attr);
    return NULL; /* the lane belongs to the successor now */
  }
  pthread_mutex_lock(&done_m);
  if (--lanes_running == 0) pthread_cond_signal(&done_cv);
  pthread_mutex_unlock(&done_m);
  return NULL;
}

int main(int argc, char** argv) {
  bench_init("larson", argc, argv, 4);
  int n = bench_threads;
  uint64_t gens = bench_scaled(1200.0 / n, 1); /* threads per lane */
  lane* lanes = xcalloc((size_t)n, sizeof(lane));
  for (int i = 0; i < n; i++) {
    rng_seed(&lanes[i].rng, 0x1a45 + (uint64_t)i);
    lanes[i].gens_left = gens;
    for (int k = 0; k < BLOCKS; k++) lanes[i].blk[k] = new_block(&lanes[i], &lanes[i].size[k]);
  }
  lanes_running = n;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 0; i < n; i++) {
    pthread_t th;
    if (pthread_create(&th, &attr, run, &lanes[i])) bench_die("pthread_create failed");
  }
  pthread_attr_destroy(&attr);
  pthread_mutex_lock(&done_m);
  while (lanes_running > 0) pthread_cond_wait(&done_cv, &done_m);
  pthread_mutex_unlock(&done_m);
  uint64_t made = 0, freed = 0;
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < BLOCKS; k++) free_block(&lanes[i], lanes[i].blk[k], lanes[i].size[k]);
    made += lanes[i].made;
    freed += lanes[i].freed;
  }
  BENCH_CHECK(made == freed);
  free(lanes);
  printf("larson threads=%d threads_started=%" PRIu64 " replacements=%" PRIu64 " checksum=%016" PRIx64 "\n", n,
         gens * (uint64_t)n, gens * (uint64_t)n * OPS_PER_THREAD, mix64(made));
  return 0;
}
