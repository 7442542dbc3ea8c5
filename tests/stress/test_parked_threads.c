/* test_parked_threads.c -- the free blocks that threads which worked and then wait keep.
 *
 * NTHREADS threads (a server's connection threads) each allocate BLOCKS blocks of
 * 16-1,024 bytes, fill them and free them all, then wait together; then they all do it
 * again (the second round runs with every thread live, so each cache's share of
 * KEEL_TCACHE_TOTAL, which this test sets to 4 MiB, is what it is at the end). With
 * everyone waiting after the second round:
 *   - (Keel) after keel_purge (which empties the transfer cache), the free blocks cached
 *     in the thread caches are under CACHED_LIMIT: the total, a 16 KiB floor for each
 *     cache and a block of each class it used, where each cache could keep
 *     KEEL_TCACHE_MAX (1 MiB) whatever the number of threads before (about 68 MiB here;
 *     11.3 MiB with shares alone, 9.4 with the sum bounded as well);
 *   - (Keel) nothing is allocated that was not before;
 *   - every block was intact until it was freed.
 */
#include "test.h"

#include <pthread.h>

#define NTHREADS 256
#define BLOCKS 512
#define CACHED_LIMIT ((uint64_t)16 << 20)

static pthread_barrier_t parked, resumed, done;

static void work(unsigned seed) {
  static _Thread_local void* p[BLOCKS];
  static _Thread_local size_t n[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    seed = seed * 1103515245u + 12345u;
    n[i] = 16 + (seed >> 8) % 1009;
    p[i] = malloc(opaque_size(n[i]));
    if (p[i]) memset(p[i], (int)(i & 0xff), n[i]);
  }
  for (int i = 0; i < BLOCKS; i++) {
    if (!p[i]) continue;
    const unsigned char* b = p[i];
    if (b[0] != (unsigned char)(i & 0xff) || b[n[i] - 1] != (unsigned char)(i & 0xff))
      CHECK_MSG(0, "block %d of %zu bytes changed while live", i, n[i]);
    free(p[i]);
  }
}

static void* connection(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1u;
  work(seed);
  pthread_barrier_wait(&parked);
  pthread_barrier_wait(&resumed);
  work(seed + 1u);
  pthread_barrier_wait(&done); /* parked again while main reads the figures */
  pthread_barrier_wait(&done);
  return NULL;
}

int main(void) {
  assert_keel_in_use();
#ifdef KEEL_TESTING_KEEL
  CHECK(keel_option_set("tcache_total", "4M") == 0);
  keel_stats_t s0 = keel_stats_now();
#endif
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 128 << 10);
  pthread_barrier_init(&parked, NULL, NTHREADS + 1);
  pthread_barrier_init(&resumed, NULL, NTHREADS + 1);
  pthread_barrier_init(&done, NULL, NTHREADS + 1);
  static pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    if (!CHECK(pthread_create(&th[i], &attr, connection, (void*)(intptr_t)i) == 0)) return test_finish();
  pthread_barrier_wait(&parked);
  pthread_barrier_wait(&resumed);
  pthread_barrier_wait(&done);
#ifdef KEEL_TESTING_KEEL
  keel_purge();
  keel_stats_t s1 = keel_stats_now();
  printf("%d parked threads: %.1f MiB of free blocks cached (limit %.0f MiB), %.1f KiB a thread\n", NTHREADS,
         s1.cached / 1048576.0, CACHED_LIMIT / 1048576.0, s1.cached / 1024.0 / NTHREADS);
  EXPECT_GE_U(CACHED_LIMIT, s1.cached);
  EXPECT_GE_U(s0.allocated + NTHREADS * 512, s1.allocated); /* glibc's DTVs */
#endif
  pthread_barrier_wait(&done);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  return test_finish();
}
