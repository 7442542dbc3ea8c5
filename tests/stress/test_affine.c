/* test_affine.c -- two threads on two processors do not share cache lines of blocks.
 *
 * glibc's bench-malloc-thread pattern: each thread keeps a working set of WORKING small
 * blocks (three quarters 16 bytes, the rest 32) and replaces a random one at each step,
 * writing every block it gets. With blocks handed between threads through the slabs'
 * holes and the transfer cache, a third to a half of one thread's 16-byte blocks shared
 * a 64-byte line with the other's, and the two cores fought over those lines (a fifth of
 * the program's time). Keel now keeps such threads apart (transfer.h): each processor's
 * blocks in its own slabs while there are no more thread caches than processors.
 *
 * Thread A is pinned to one processor and works alone first (its bins overflow and
 * refill, leaving holes in its slabs), then thread B, pinned to another, starts beside
 * it. At the end the test counts A's live blocks whose line holds the start of one of
 * B's. Skipped (77) where two threads cannot be pinned to two processors. Run without
 * the heap profiler: with it every thread has a cache at once (the main thread's a
 * third, more caches than processors), and threads are not kept apart.
 */
#include "test.h"
#include "two_processors.h"

#include <pthread.h>
#include <malloc.h>

#define WORKING 1024
#define SOLO_STEPS 200000
#define STEPS 400000

static void* set[2][WORKING];
static pthread_barrier_t both;

static void step(void** ws, t_rng* r) {
  unsigned i = (unsigned)rng_range(r, 0, WORKING - 1);
  size_t n = rng_range(r, 0, 3) == 0 ? 32 : 16;
  free(ws[i]);
  unsigned char* p = ws[i] = malloc(opaque_size(n));
  if (!CHECK(p != NULL)) return;
  memset(p, (int)i, n);
}

static void* worker(void* arg) {
  int me = (int)(intptr_t)arg;
  pin(cpu_of[me]);
  t_rng r;
  rng_seed(&r, 0xaff1 + (uint64_t)me);
  if (me == 0)
    for (long s = 0; s < SOLO_STEPS; s++) step(set[0], &r);
  pthread_barrier_wait(&both); /* A has worked alone; B starts now */
  for (long s = 0; s < STEPS; s++) step(set[me], &r);
  return NULL;
}

static int cmp_line(const void* a, const void* b) {
  uintptr_t x = *(const uintptr_t*)a, y = *(const uintptr_t*)b;
  return x < y ? -1 : x > y;
}

int main(void) {
  int skip = choose_two_processors();
  if (skip != 0) return skip;
  pthread_barrier_init(&both, NULL, 2);
  pthread_t t[2];
  for (intptr_t i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, worker, (void*)i) == 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  if (pins_refused()) return 77;

  uintptr_t b_lines[WORKING];
  for (int i = 0; i < WORKING; i++) b_lines[i] = (uintptr_t)set[1][i] >> 6;
  qsort(b_lines, WORKING, sizeof b_lines[0], cmp_line);
  int shared = 0, small = 0;
  for (int i = 0; i < WORKING; i++) {
    uintptr_t line = (uintptr_t)set[0][i] >> 6;
    if (malloc_usable_size(set[0][i]) > 16) continue;
    small++;
    if (bsearch(&line, b_lines, WORKING, sizeof b_lines[0], cmp_line) != NULL) shared++;
  }
  printf("processors %d and %d: %d of thread A's %d 16-byte blocks share a cache line with "
         "thread B's blocks\n", cpu_of[0], cpu_of[1], shared, small);
  /* Before: 164-332 of 732 (3 runs); apart, none. A tenth leaves room for
   * overflow batches taken from a thread's own line. */
  CHECK_MSG(shared * 10 <= small, "%d of %d of A's 16-byte blocks share lines with B's", shared, small);
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < WORKING; i++) free(set[k][i]);
  return test_finish();
}
