/* test_dying_threads.c -- threads whose only calls come after their key destructors ran.
 *
 * glibc frees memory in an exiting thread after it has run the threads' key destructors,
 * Keel's exit handler among them: the thread's DTV when it ran on a stack the program
 * supplied, and the DTVs of cached stacks it evicts otherwise (all calloc'ed by the
 * creating thread: Keel's blocks). A thread that never called Keel before must not be
 * registered there: it would never be counted out, and a cache given to it (a spare an
 * exited thread left) would stay in the registry pointing into its freed TLS, where the
 * purger's take-back of idle caches writes.
 *   1. Rounds of detached threads on glibc's stacks that never allocate: the count of
 *      live threads must not grow.
 *   2. A detached thread on a stack the program maps, with a spare cache waiting, then
 *      unmaps: the purger must not write there (it crashed with SIGSEGV).
 */
#include "test.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

static void* idle(void* arg) {
  usleep(20000 + (useconds_t)(uintptr_t)arg * 1000);
  return NULL;
}

static void* worker(void* arg) { /* enough small calls for a thread cache */
  void* p[200];
  for (int r = 0; r < 4; r++) {
    for (int i = 0; i < 200; i++) p[i] = malloc(64);
    for (int i = 0; i < 200; i++) free(p[i]);
  }
  return arg;
}

#ifdef KEEL_TESTING_KEEL
static uint64_t live_threads(void) {
  keel_stats_t s = {.size = sizeof s};
  CHECK(keel_stats_get(&s) == 0);
  return s.threads;
}
#endif

int main(void) {
  TEST_SECTION("detached threads that never allocate are not counted after they end");
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  worker(NULL); /* main has its own cache: it does not take the spare below */
  for (int round = 0; round < 4; round++) {
    pthread_t t;
    for (int i = 0; i < 24; i++) CHECK(pthread_create(&t, &a, idle, (void*)(uintptr_t)i) == 0);
    usleep(200000);
  }
#ifdef KEEL_TESTING_KEEL
  uint64_t n = live_threads();
  CHECK_MSG(n <= 2, "%llu live threads counted, 1 running", (unsigned long long)n);
#endif

  TEST_SECTION("a thread on a stack the program unmaps gets no cache after its end");
  pthread_t t;
  CHECK(pthread_create(&t, NULL, worker, NULL) == 0 && pthread_join(t, NULL) == 0); /* a kept spare */
  size_t sz = (size_t)1 << 20;
  void* stack = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(stack != MAP_FAILED);
  pthread_attr_t own;
  pthread_attr_init(&own);
  pthread_attr_setstack(&own, stack, sz);
  pthread_attr_setdetachstate(&own, PTHREAD_CREATE_DETACHED);
  CHECK(pthread_create(&t, &own, idle, NULL) == 0);
  sleep(1); /* it has ended */
  CHECK(munmap(stack, sz) == 0);
  /* The purger takes back caches idle for KEEL_TCACHE_IDLE (1 s by default): a cache
   * registered for the dead thread would be written through its unmapped TLS by now. */
  sleep(3);
  return test_finish();
}
