/* xthread -- server pattern: threads free each other's objects.
 *
 * N worker threads each produce batches of 64 "request" objects (mostly 32-512 bytes,
 * some 1-8 KiB buffers), fill them, and hand each batch to a randomly chosen other
 * worker, which verifies and frees the objects (so nearly every free is a remote free
 * of memory another thread allocated). Each worker also keeps a small private working
 * set that it churns locally. A worker may have at most 8 batches in flight, so memory
 * in transit stays bounded whatever the scheduling.
 * Checksum: sum of the values of all objects received, checked against the sum sent,
 * plus the hash of the local churn. Total work is fixed; threads share it.
 * Usage: xthread [scale] [threads=4]
 */
#include <pthread.h>
#include <stdatomic.h>

#include "bench.h"

enum { BATCH = 64, MAX_OUTSTANDING = 8, LOCAL_SLOTS = 256, LOCAL_OPS = 32 };

typedef struct obj {
  struct obj* next;
  uint64_t val;
  uint32_t size;
  uint32_t tag;
  unsigned char payload[];
} obj;

typedef struct batch {
  struct batch* next;
  obj* objs;
  uint32_t count;
  int from;
} batch;

typedef struct worker {
  _Alignas(64) pthread_mutex_t m;
  pthread_cond_t cv;
  batch *head, *tail;
  int outstanding;
  int id;
  uint64_t nbatches;
  uint64_t sent, received, local_ck;
  pthread_t th;
} worker;

static worker* W;
static int nworkers;
static atomic_ullong remaining; /* batches not yet consumed */

static void wake_all(void) {
  for (int i = 0; i < nworkers; i++) {
    pthread_mutex_lock(&W[i].m);
    pthread_cond_broadcast(&W[i].cv);
    pthread_mutex_unlock(&W[i].m);
  }
}

static void consume(worker* self, batch* list) {
  while (list) {
    batch* b = list;
    list = b->next;
    uint32_t cnt = 0;
    for (obj* o = b->objs; o;) {
      obj* nx = o->next;
      size_t plen = o->size - sizeof(obj);
      unsigned char t = (unsigned char)o->val;
      BENCH_CHECK(o->tag == (uint32_t)(o->val >> 32) && o->payload[0] == t && o->payload[plen - 1] == t);
      self->received += o->val;
      free(o);
      o = nx;
      cnt++;
    }
    BENCH_CHECK(cnt == b->count);
    worker* from = &W[b->from];
    free(b);
    pthread_mutex_lock(&from->m);
    from->outstanding--;
    pthread_cond_signal(&from->cv);
    pthread_mutex_unlock(&from->m);
    if (atomic_fetch_sub(&remaining, 1) == 1) wake_all();
  }
}

static batch* take_inbox(worker* self) {
  batch* b = self->head;
  self->head = self->tail = NULL;
  return b;
}

static void* run(void* arg) {
  worker* self = arg;
  rng_t rng;
  rng_seed(&rng, 1000 + (uint64_t)self->id);
  void* local[LOCAL_SLOTS] = {0};
  uint32_t local_size[LOCAL_SLOTS] = {0};

  for (uint64_t b = 0; b < self->nbatches; b++) {
    pthread_mutex_lock(&self->m);
    for (;;) {
      batch* in = take_inbox(self);
      if (in) {
        pthread_mutex_unlock(&self->m);
        consume(self, in);
        pthread_mutex_lock(&self->m);
        continue;
      }
      if (self->outstanding < MAX_OUTSTANDING) break;
      pthread_cond_wait(&self->cv, &self->m);
    }
    self->outstanding++;
    pthread_mutex_unlock(&self->m);

    /* private working set: replace a few entries */
    for (int i = 0; i < LOCAL_OPS; i++) {
      uint32_t s = rng_below(&rng, LOCAL_SLOTS);
      if (local[s]) {
        unsigned char* p = local[s];
        BENCH_CHECK(p[0] == (unsigned char)s && p[local_size[s] - 1] == (unsigned char)local_size[s]);
        self->local_ck = ck_step(self->local_ck, local_size[s]);
        free(p);
      }
      uint32_t sz = rng_range(&rng, 16, 256);
      unsigned char* p = xmalloc(sz);
      memset(p, (unsigned char)s, sz);
      p[sz - 1] = (unsigned char)sz;
      local[s] = p;
      local_size[s] = sz;
    }

    /* a batch of requests for another worker */
    batch* bt = xmalloc(sizeof *bt);
    bt->next = NULL;
    bt->objs = NULL;
    bt->count = BATCH;
    bt->from = self->id;
    for (int i = 0; i < BATCH; i++) {
      uint32_t sz = rng_pct(&rng, 95) ? rng_range(&rng, 32, 512) : rng_range(&rng, 1024, 8192);
      obj* o = xmalloc(sz);
      o->val = rng_next(&rng);
      o->size = sz;
      o->tag = (uint32_t)(o->val >> 32);
      memset(o->payload, (unsigned char)o->val, sz - sizeof(obj));
      o->next = bt->objs;
      bt->objs = o;
      self->sent += o->val;
    }
    int to = nworkers > 1 ? (self->id + 1 + (int)rng_below(&rng, (uint32_t)nworkers - 1)) % nworkers : 0;
    worker* dst = &W[to];
    pthread_mutex_lock(&dst->m);
    if (dst->tail)
      dst->tail->next = bt;
    else
      dst->head = bt;
    dst->tail = bt;
    pthread_cond_signal(&dst->cv);
    pthread_mutex_unlock(&dst->m);
  }

  /* drain until every batch of every worker has been consumed */
  pthread_mutex_lock(&self->m);
  while (atomic_load(&remaining) > 0) {
    batch* in = take_inbox(self);
    if (in) {
      pthread_mutex_unlock(&self->m);
      consume(self, in);
      pthread_mutex_lock(&self->m);
      continue;
    }
    pthread_cond_wait(&self->cv, &self->m);
  }
  pthread_mutex_unlock(&self->m);

  for (int s = 0; s < LOCAL_SLOTS; s++) free(local[s]);
  return NULL;
}

int main(int argc, char** argv) {
  bench_init("xthread", argc, argv, 4);
  nworkers = bench_threads;
  uint64_t total = bench_scaled(90000, (uint64_t)nworkers);
  W = xcalloc((size_t)nworkers, sizeof(worker));
  uint64_t assigned = 0;
  for (int i = 0; i < nworkers; i++) {
    W[i].id = i;
    W[i].nbatches = total / (uint64_t)nworkers + ((uint64_t)i < total % (uint64_t)nworkers);
    assigned += W[i].nbatches;
    pthread_mutex_init(&W[i].m, NULL);
    pthread_cond_init(&W[i].cv, NULL);
  }
  atomic_store(&remaining, assigned);
  for (int i = 0; i < nworkers; i++)
    if (pthread_create(&W[i].th, NULL, run, &W[i])) bench_die("pthread_create failed");
  uint64_t sent = 0, received = 0, ck = 0;
  for (int i = 0; i < nworkers; i++) {
    pthread_join(W[i].th, NULL);
    sent += W[i].sent;
    received += W[i].received;
    ck += mix64(W[i].local_ck);
  }
  BENCH_CHECK(sent == received);
  free(W);
  printf("xthread threads=%d batches=%" PRIu64 " objects=%" PRIu64 " checksum=%016" PRIx64 "\n", nworkers,
         assigned, assigned * BATCH, ck_step(ck, received));
  return 0;
}
