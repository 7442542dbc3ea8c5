/* prodcons -- one producer thread allocates, one consumer thread frees.
 *
 * The producer allocates messages (70% 16-128 bytes, 25% 128 bytes-1 KiB, 5% 1-16 KiB),
 * fills them and queues them, 256 at a time, in a pointer array that is itself
 * malloc'd; the consumer verifies and frees every message and the array. At most 16
 * arrays are in flight. Every free is therefore a remote free of memory allocated by
 * the other thread, which never frees anything itself: an allocator must return the
 * memory to the producer for reuse or the footprint grows.
 * Checksum: sum of message values (checked against the sum produced) and sizes.
 * Usage: prodcons [scale]
 */
#include <pthread.h>

#include "bench.h"

enum { BATCH = 256, QCAP = 16 };

typedef struct msg {
  uint64_t val;
  uint32_t size;
  uint32_t check;
  unsigned char body[];
} msg;

static struct {
  pthread_mutex_t m;
  pthread_cond_t not_full, not_empty;
  msg** ring[QCAP];
  unsigned head, count;
} q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0, 0};

static uint64_t nbatches, produced_sum, consumed_sum, consumed_bytes;

static void push(msg** b) {
  pthread_mutex_lock(&q.m);
  while (q.count == QCAP) pthread_cond_wait(&q.not_full, &q.m);
  q.ring[(q.head + q.count) % QCAP] = b;
  q.count++;
  pthread_cond_signal(&q.not_empty);
  pthread_mutex_unlock(&q.m);
}

static msg** pop(void) {
  pthread_mutex_lock(&q.m);
  while (q.count == 0) pthread_cond_wait(&q.not_empty, &q.m);
  msg** b = q.ring[q.head];
  q.head = (q.head + 1) % QCAP;
  q.count--;
  pthread_cond_signal(&q.not_full);
  pthread_mutex_unlock(&q.m);
  return b;
}

static void* producer(void* arg) {
  (void)arg;
  rng_t rng;
  rng_seed(&rng, 99);
  for (uint64_t b = 0; b < nbatches; b++) {
    msg** arr = xmalloc(BATCH * sizeof(msg*));
    for (int i = 0; i < BATCH; i++) {
      uint32_t r = rng_below(&rng, 100);
      uint32_t sz = r < 70 ? rng_range(&rng, 16, 128) : r < 95 ? rng_range(&rng, 129, 1024) : rng_range(&rng, 1025, 16384);
      msg* m = xmalloc(sz);
      m->val = rng_next(&rng);
      m->size = sz;
      m->check = (uint32_t)(m->val >> 32) ^ sz;
      memset(m->body, (unsigned char)m->val, sz - sizeof(msg));
      produced_sum += m->val;
      arr[i] = m;
    }
    push(arr);
  }
  push(NULL);
  return NULL;
}

static void* consumer(void* arg) {
  (void)arg;
  for (;;) {
    msg** arr = pop();
    if (!arr) break;
    for (int i = 0; i < BATCH; i++) {
      msg* m = arr[i];
      uint32_t sz = m->size;
      BENCH_CHECK(m->check == ((uint32_t)(m->val >> 32) ^ sz));
      if (sz > sizeof(msg)) {
        BENCH_CHECK(m->body[0] == (unsigned char)m->val && m->body[sz - sizeof(msg) - 1] == (unsigned char)m->val);
      }
      consumed_sum += m->val;
      consumed_bytes += sz;
      free(m);
    }
    free(arr);
  }
  return NULL;
}

int main(int argc, char** argv) {
  bench_init("prodcons", argc, argv, 0);
  nbatches = bench_scaled(24000, 1);
  pthread_t p, c;
  if (pthread_create(&c, NULL, consumer, NULL) || pthread_create(&p, NULL, producer, NULL))
    bench_die("pthread_create failed");
  pthread_join(p, NULL);
  pthread_join(c, NULL);
  BENCH_CHECK(produced_sum == consumed_sum);
  printf("prodcons messages=%" PRIu64 " bytes=%" PRIu64 " checksum=%016" PRIx64 "\n", nbatches * BATCH,
         consumed_bytes, ck_step(consumed_sum, consumed_bytes));
  return 0;
}
