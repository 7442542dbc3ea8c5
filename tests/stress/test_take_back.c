/* test_take_back.c -- the purger takes back the caches of waiting threads, never from
 * under a malloc or free.
 *
 * NTHREADS workers (more than the machine's processors, so that they are preempted in
 * the middle of their calls) allocate and free blocks of 16 B - 2 KiB, each filled with
 * a pattern of its own and checked whole before it is freed, and now and then pause a
 * few milliseconds; meanwhile main calls keel_purge() again and again, which takes back
 * every cache whose thread is not inside malloc or free at that moment. A cache taken
 * back while its thread was using it hands the same block out twice or loses a free
 * block's link: a pattern mismatch, a crash, or a double free report. The run must see
 * caches taken back (KEEL_TESTING_KEEL), and once the workers wait, one keel_purge()
 * leaves almost nothing cached: every waiting thread's cache is empty.
 */
#include "test.h"

#include <pthread.h>
#include <time.h>

#define NTHREADS 8
#define SLOTS 128
#define SECONDS 3.0

static pthread_barrier_t parked, done;
static volatile int stop;
static long failures;

typedef struct {
  unsigned char* p;
  size_t n;
  uint64_t seed;
} slot_t;

static void fill(slot_t* s) { pattern_fill(s->p, s->n, s->seed); }

static int intact(const slot_t* s) {
  size_t off = pattern_check(s->p, s->n, s->seed);
  return CHECK_MSG(off == SIZE_MAX, "block %p of %zu bytes changed at byte %zu while live", (void*)s->p, s->n, off);
}

static void* worker(void* arg) {
  uint64_t x = 0x9e3779b97f4a7c15ull * ((uint64_t)(uintptr_t)arg + 1);
  static _Thread_local slot_t slot[SLOTS];
  long ops = 0;
  while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
    x = mix64(x);
    slot_t* s = &slot[x % SLOTS];
    if (s->p) {
      if (!intact(s)) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
      free(s->p);
      s->p = NULL;
    } else {
      s->n = 16 + (size_t)(x >> 20) % 2033;
      s->p = malloc(opaque_size(s->n));
      if (!CHECK(s->p != NULL)) break;
      s->seed = x;
      fill(s);
    }
    if (++ops % 20000 == 0) {
      struct timespec ts = {0, 2000000}; /* a short wait: the purger may take the cache */
      nanosleep(&ts, NULL);
    }
  }
  for (int i = 0; i < SLOTS; i++)
    if (slot[i].p) {
      intact(&slot[i]);
      free(slot[i].p);
      slot[i].p = NULL;
    }
  pthread_barrier_wait(&parked); /* waiting threads, caches full of free blocks */
  pthread_barrier_wait(&done);
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  pthread_barrier_init(&parked, NULL, NTHREADS + 1);
  pthread_barrier_init(&done, NULL, NTHREADS + 1);
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    if (!CHECK(pthread_create(&th[i], NULL, worker, (void*)(intptr_t)i) == 0)) return test_finish();
  long purges = purge_repeatedly(SECONDS, 200000);
  __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
  pthread_barrier_wait(&parked);
  EXPECT_EQ_I(0, failures);
#ifdef KEEL_TESTING_KEEL
  unsigned long long taken = keel_stats_counter("caches_taken_back");
  printf("%ld purges while %d threads worked: %llu caches taken back\n", purges, NTHREADS, taken);
  CHECK_MSG(taken >= 10, "only %llu caches taken back in %ld purges", taken, purges);
  keel_purge();
  keel_stats_t s = keel_stats_now();
  printf("workers waiting, after keel_purge: %.1f KiB cached\n", s.cached / 1024.0);
  EXPECT_GE_U(64 << 10, s.cached);
#endif
  pthread_barrier_wait(&done);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  return test_finish();
}
