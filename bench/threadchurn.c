/* threadchurn -- short-lived threads that exit with live objects.
 *
 * In each round the main thread starts N threads (4 by default) and joins them. Each
 * thread allocates 1500 objects (16 B-2 KiB, a few up to 16 KiB), frees about half of
 * them itself, frees up to 400 objects that threads of earlier rounds left in a shared
 * pool, puts a quarter of its own objects into that pool, and exits still owning the
 * rest, which it hands to the main thread (a "results" list) instead of freeing. The
 * main thread frees the results of a round three rounds later. So an allocator sees
 * thread caches created and torn down all the time, and memory allocated by threads
 * that no longer exist being freed by threads that do.
 * Checksum: sum of the values of all objects, which are all verified and freed exactly
 * once (which thread frees which object depends on scheduling; the sum does not).
 * Usage: threadchurn [scale] [threads=4]
 */
#include <pthread.h>

#include "bench.h"

enum { PER_THREAD = 1500, TAKE = 400, POOL_CAP = 1 << 16 };

typedef struct obj {
  struct obj* next;
  uint64_t val;
  uint32_t size;
  uint32_t check;
} obj;

static struct {
  pthread_mutex_t m;
  obj* items[POOL_CAP];
  size_t n;
} pool = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};

typedef struct {
  BENCH_OWN_LINES uint64_t seed;
  obj* results; /* handed to the main thread */
  uint64_t made, freed;
  pthread_t th;
} task;

static uint64_t free_obj(obj* o) {
  BENCH_CHECK(o->check == ((uint32_t)o->val ^ o->size));
  unsigned char* tail = (unsigned char*)o + o->size - 1;
  BENCH_CHECK(*tail == (unsigned char)o->val);
  uint64_t v = o->val;
  free(o);
  return v;
}

static void* run(void* arg) {
  task* t = arg;
  rng_t rng;
  rng_seed(&rng, t->seed);
  obj** mine = xmalloc(PER_THREAD * sizeof(obj*));
  for (int i = 0; i < PER_THREAD; i++) {
    uint32_t sz = rng_pct(&rng, 97) ? rng_range(&rng, 32, 2048) : rng_range(&rng, 2049, 16384);
    obj* o = xmalloc(sz);
    o->val = rng_next(&rng);
    o->size = sz;
    o->check = (uint32_t)o->val ^ sz;
    memset(o + 1, (unsigned char)o->val, sz - sizeof(obj));
    mine[i] = o;
    t->made += o->val;
  }
  /* free about half of our own, in random order */
  for (int i = 0; i < PER_THREAD / 2; i++) {
    uint32_t k = rng_below(&rng, PER_THREAD);
    if (mine[k]) {
      t->freed += free_obj(mine[k]);
      mine[k] = NULL;
    }
  }
  /* free objects left by earlier threads, then leave some of ours */
  obj* taken[TAKE];
  size_t ntaken = 0;
  pthread_mutex_lock(&pool.m);
  while (ntaken < TAKE && pool.n > 0) taken[ntaken++] = pool.items[--pool.n];
  pthread_mutex_unlock(&pool.m);
  for (size_t i = 0; i < ntaken; i++) t->freed += free_obj(taken[i]);
  pthread_mutex_lock(&pool.m);
  for (int i = 0; i < PER_THREAD; i++) {
    if (mine[i] && rng_pct(&rng, 35) && pool.n < POOL_CAP) {
      pool.items[pool.n++] = mine[i];
      mine[i] = NULL;
    }
  }
  pthread_mutex_unlock(&pool.m);
  /* exit owning the rest: hand them to the main thread */
  for (int i = 0; i < PER_THREAD; i++) {
    if (mine[i]) {
      mine[i]->next = t->results;
      t->results = mine[i];
    }
  }
  free(mine);
  return NULL;
}

int main(int argc, char** argv) {
  bench_init("threadchurn", argc, argv, 4);
  int n = bench_threads;
  uint64_t rounds = bench_scaled(1500.0 / n, 3);
  task* tasks = xcalloc_own_lines((size_t)n, sizeof(task));
  obj* held[3] = {NULL, NULL, NULL}; /* results of the last rounds */
  uint64_t made = 0, freed = 0;
  for (uint64_t r = 0; r < rounds; r++) {
    for (int i = 0; i < n; i++) {
      tasks[i].seed = r * 1024 + (uint64_t)i;
      tasks[i].results = NULL;
      tasks[i].made = tasks[i].freed = 0;
      if (pthread_create(&tasks[i].th, NULL, run, &tasks[i])) bench_die("pthread_create failed");
    }
    /* meanwhile, free the results of round r-3 */
    obj* old = held[r % 3];
    held[r % 3] = NULL;
    while (old) {
      obj* nx = old->next;
      freed += free_obj(old);
      old = nx;
    }
    for (int i = 0; i < n; i++) {
      pthread_join(tasks[i].th, NULL);
      made += tasks[i].made;
      freed += tasks[i].freed;
      obj* o = tasks[i].results;
      while (o) {
        obj* nx = o->next;
        o->next = held[r % 3];
        held[r % 3] = o;
        o = nx;
      }
    }
  }
  for (int k = 0; k < 3; k++) {
    for (obj* o = held[k]; o;) {
      obj* nx = o->next;
      freed += free_obj(o);
      o = nx;
    }
  }
  while (pool.n > 0) freed += free_obj(pool.items[--pool.n]);
  BENCH_CHECK(made == freed);
  free(tasks);
  printf("threadchurn threads=%d rounds=%" PRIu64 " thread_starts=%" PRIu64 " checksum=%016" PRIx64 "\n", n,
         rounds, rounds * (uint64_t)n, mix64(made));
  return 0;
}
