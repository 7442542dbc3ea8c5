/* mpmc.h -- many producers, many consumers: the code of mpmc64.c and mpmcmix.c.
 *
 * N threads, each both a producer and a consumer, none of which ever frees a block it
 * allocated itself. The total work is a fixed number of arrays of 64 blocks (whatever
 * the thread count), divided evenly among the threads. A thread alternates between
 * consuming what is queued for it and producing one array: it allocates 64 blocks,
 * writes into each a value, its size, a check word derived from both and a fill byte,
 * and hands the 64 pointers to thread (self + 1 + k % (N-1)) % N for its k-th array --
 * each of the other threads in turn (with N = 1, to itself). The receiver verifies and
 * frees every block. So every free is a remote free, and every thread allocates while
 * blocks allocated by all the others are being freed into its heap.
 *
 * Hand-off: each thread has an inbound ring of 8 slots of 64 pointers (the pointers are
 * copied in and out; the rings are allocated once, before the work, so every malloc and
 * free of the run is a block). Before each array it produces, a thread consumes what
 * is queued for it, at most 8 arrays. A producer whose receiver's ring is full consumes
 * its own ring meanwhile; with its own ring empty too it yields (up to 32 times) and,
 * if still stuck, registers with the full ring and sleeps until that ring's owner takes
 * a slot or something arrives for itself. Once its share is produced a thread keeps
 * consuming until every array of the run has been freed. So at most 8 arrays wait for
 * each thread, besides the one each thread is filling or emptying.
 *
 * What the blocks hold and how large they are depends only on the array's index in the
 * whole run, never on which thread made it or the thread count; so the checksum (sum of
 * the values freed, checked against the sum allocated, and the bytes freed) is the same
 * for every thread count at a given scale.
 *
 * The including file defines MPMC_NAME (the program name) and MPMC_MIXED_SIZES: 0 for
 * 64-byte blocks only (all threads meet on one size class), 1 for 16 B-1 KiB (80%
 * 16-256 B, 20% 257-1024 B).
 * Usage: NAME [scale] [threads=4]
 */
#ifndef MPMC_NAME
#error "define MPMC_NAME and MPMC_MIXED_SIZES before including mpmc.h"
#endif

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "bench.h"

/* SPINS: how many times a thread with nothing to do yields and looks again before it
 * sleeps on its condition variable (a futex wait and wake per array hand-off made the
 * times noisy and measured the kernel more than the allocator). */
enum { ARRAY = 64, QCAP = 8, SPINS = 32 };

typedef struct blk {
  uint64_t val;
  uint32_t size;
  uint32_t check;
  unsigned char body[];
} blk;

typedef struct mpmc_thread {
  _Alignas(64) pthread_mutex_t m; /* guards everything down to `nwaiting` */
  pthread_cond_t cv;              /* this thread sleeps on it */
  unsigned head, count;           /* the inbound ring */
  int sleeping;
  int kick;          /* set by the owner of a ring this thread waits on, when it took a slot */
  uint64_t* waiters; /* bit per thread waiting for room in this ring */
  int nwaiting;      /* bits set in `waiters` (some may be stale: a spurious kick only) */
  blk* ring[QCAP][ARRAY];
  /* the owner's own */
  int id;
  uint64_t first, end; /* global array indexes it produces */
  uint64_t made_val, made_bytes, freed_val, freed_bytes;
  uint64_t* kick_list; /* scratch copy of waiters */
  pthread_t th;
} mpmc_thread;

static mpmc_thread** T;
static int nthreads, nwords;
static atomic_ullong arrays_left; /* arrays not yet freed */

static inline uint32_t block_size(rng_t* r) {
#if MPMC_MIXED_SIZES
  return rng_pct(r, 80) ? rng_range(r, 16, 256) : rng_range(r, 257, 1024);
#else
  (void)r;
  return 64;
#endif
}

static inline uint32_t check_word(uint64_t val, uint32_t size) { return (uint32_t)(val >> 32) ^ (size * 0x9e3779b1u); }

/* Wakes the threads in `list` (a copy of a ring's waiter bits). */
static void kick_all(uint64_t* list) {
  for (int w = 0; w < nwords; w++) {
    uint64_t bits = list[w];
    while (bits) {
      int i = w * 64 + __builtin_ctzll(bits);
      bits &= bits - 1;
      mpmc_thread* t = T[i];
      pthread_mutex_lock(&t->m);
      t->kick = 1;
      if (t->sleeping) pthread_cond_signal(&t->cv);
      pthread_mutex_unlock(&t->m);
    }
  }
}

static void wake_everyone(void) {
  for (int i = 0; i < nthreads; i++) {
    pthread_mutex_lock(&T[i]->m);
    pthread_cond_signal(&T[i]->cv);
    pthread_mutex_unlock(&T[i]->m);
  }
}

/* Takes one array off self's ring into `out`; 0 if the ring is empty. */
static int pop(mpmc_thread* self, blk** out) {
  pthread_mutex_lock(&self->m);
  if (self->count == 0) {
    pthread_mutex_unlock(&self->m);
    return 0;
  }
  memcpy(out, self->ring[self->head], sizeof(blk*) * ARRAY);
  self->head = (self->head + 1) % QCAP;
  int was_full = self->count-- == QCAP;
  int kick = was_full && self->nwaiting;
  if (kick) {
    memcpy(self->kick_list, self->waiters, sizeof(uint64_t) * (size_t)nwords);
    memset(self->waiters, 0, sizeof(uint64_t) * (size_t)nwords);
    self->nwaiting = 0;
  }
  pthread_mutex_unlock(&self->m);
  if (kick) kick_all(self->kick_list);
  return 1;
}

static void consume_array(mpmc_thread* self, blk** a) {
  for (int i = 0; i < ARRAY; i++) {
    blk* b = a[i];
    uint32_t sz = b->size;
    BENCH_CHECK(sz >= sizeof(blk) && b->check == check_word(b->val, sz));
    if (sz > sizeof(blk)) {
      unsigned char f = (unsigned char)b->val;
      BENCH_CHECK(b->body[0] == f && b->body[sz - sizeof(blk) - 1] == f);
    }
    self->freed_val += b->val;
    self->freed_bytes += sz;
    free(b);
  }
  if (atomic_fetch_sub(&arrays_left, 1) == 1) wake_everyone();
}

/* Consumes what is queued for self, at most QCAP arrays (so that a thread kept busy
 * consuming by a fast producer still gets to produce); returns how many arrays. */
static int drain(mpmc_thread* self) {
  blk* a[ARRAY];
  int n = 0;
  while (n < QCAP && pop(self, a)) {
    consume_array(self, a);
    n++;
  }
  return n;
}

/* Puts the array on dst's ring if there is room; if not and `waiter` is given,
 * registers it to be kicked when dst takes a slot. */
static int try_push(mpmc_thread* dst, blk** a, const mpmc_thread* waiter) {
  pthread_mutex_lock(&dst->m);
  if (dst->count == QCAP) {
    if (waiter) {
      uint64_t bit = 1ull << (waiter->id % 64);
      if (!(dst->waiters[waiter->id / 64] & bit)) {
        dst->waiters[waiter->id / 64] |= bit;
        dst->nwaiting++;
      }
    }
    pthread_mutex_unlock(&dst->m);
    return 0;
  }
  memcpy(dst->ring[(dst->head + dst->count) % QCAP], a, sizeof(blk*) * ARRAY);
  dst->count++;
  if (dst->sleeping) pthread_cond_signal(&dst->cv);
  pthread_mutex_unlock(&dst->m);
  return 1;
}

static void push(mpmc_thread* self, mpmc_thread* dst, blk** a) {
  for (int tries = 0;; tries++) {
    if (try_push(dst, a, NULL)) return;
    if (drain(self)) {
      tries = -1;
      continue;
    }
    if (tries < SPINS) {
      sched_yield();
      continue;
    }
    /* Both rings stuck: register with dst, then sleep unless dst made room since or
     * something arrived for self. `kick` is cleared before registering, so a kick for
     * this registration cannot be lost; an older one only costs a spurious retry. */
    pthread_mutex_lock(&self->m);
    self->kick = 0;
    pthread_mutex_unlock(&self->m);
    if (try_push(dst, a, self)) return;
    pthread_mutex_lock(&self->m);
    while (self->count == 0 && !self->kick) {
      self->sleeping = 1;
      pthread_cond_wait(&self->cv, &self->m);
      self->sleeping = 0;
    }
    pthread_mutex_unlock(&self->m);
    tries = -1;
  }
}

static void* run(void* arg) {
  mpmc_thread* self = arg;
  blk* a[ARRAY];
  uint64_t k = 0;
  for (uint64_t g = self->first; g < self->end; g++, k++) {
    drain(self);
    rng_t rng;
    rng_seed(&rng, 0x6d706d63ull ^ (g * 0x100000001b3ull));
    for (int i = 0; i < ARRAY; i++) {
      uint32_t sz = block_size(&rng);
      blk* b = xmalloc(sz);
      b->val = rng_next(&rng);
      b->size = sz;
      b->check = check_word(b->val, sz);
      memset(b->body, (unsigned char)b->val, sz - sizeof(blk));
      self->made_val += b->val;
      self->made_bytes += sz;
      a[i] = b;
    }
    int to = nthreads > 1 ? (self->id + 1 + (int)(k % (uint64_t)(nthreads - 1))) % nthreads : self->id;
    push(self, T[to], a);
  }
  /* share produced: consume until every array of the run is freed */
  for (int tries = 0;; tries++) {
    if (drain(self)) {
      tries = -1;
      continue;
    }
    if (atomic_load(&arrays_left) == 0) break;
    if (tries < SPINS) {
      sched_yield();
      continue;
    }
    pthread_mutex_lock(&self->m);
    while (self->count == 0 && atomic_load(&arrays_left) > 0) {
      self->sleeping = 1;
      pthread_cond_wait(&self->cv, &self->m);
      self->sleeping = 0;
    }
    pthread_mutex_unlock(&self->m);
    tries = -1;
  }
  return NULL;
}

int main(int argc, char** argv) {
  bench_init(MPMC_NAME, argc, argv, 4);
  nthreads = bench_threads;
  nwords = (nthreads + 63) / 64;
#if MPMC_MIXED_SIZES
  uint64_t total = bench_scaled(100000, 1);
#else
  uint64_t total = bench_scaled(200000, 1);
#endif
  atomic_store(&arrays_left, total);
  T = xcalloc((size_t)nthreads, sizeof(mpmc_thread*));
  for (int i = 0; i < nthreads; i++) {
    mpmc_thread* t = aligned_alloc(_Alignof(mpmc_thread), sizeof(mpmc_thread));
    if (!t) bench_die("aligned_alloc(%zu) returned NULL", sizeof(mpmc_thread));
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->m, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->waiters = xcalloc((size_t)nwords, sizeof(uint64_t));
    t->kick_list = xcalloc((size_t)nwords, sizeof(uint64_t));
    t->id = i;
    t->first = total * (uint64_t)i / (uint64_t)nthreads;
    t->end = total * (uint64_t)(i + 1) / (uint64_t)nthreads;
    T[i] = t;
  }
  for (int i = 0; i < nthreads; i++)
    if (pthread_create(&T[i]->th, NULL, run, T[i])) bench_die("pthread_create failed");
  uint64_t made = 0, freed = 0, made_bytes = 0, freed_bytes = 0;
  for (int i = 0; i < nthreads; i++) pthread_join(T[i]->th, NULL);
  for (int i = 0; i < nthreads; i++) {
    mpmc_thread* t = T[i];
    BENCH_CHECK(t->count == 0);
    made += t->made_val;
    freed += t->freed_val;
    made_bytes += t->made_bytes;
    freed_bytes += t->freed_bytes;
    pthread_mutex_destroy(&t->m);
    pthread_cond_destroy(&t->cv);
    free(t->waiters);
    free(t->kick_list);
    free(t);
  }
  free(T);
  BENCH_CHECK(made == freed && made_bytes == freed_bytes);
  printf("%s threads=%d objects=%" PRIu64 " bytes=%" PRIu64 " checksum=%016" PRIx64 "\n", MPMC_NAME, nthreads,
         total * ARRAY, freed_bytes, ck_step(freed, freed_bytes));
  return 0;
}
