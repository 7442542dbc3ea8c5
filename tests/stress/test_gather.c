/* test_gather.c -- blocks above 8 KiB gathered from threads' bins while those threads
 * work, and while the purger takes caches back.
 *
 * NTHREADS workers (more than the machine's processors, so that they are preempted
 * inside their calls) allocate and free blocks of 8-32 KiB, each filled with a pattern of
 * its own and checked whole before it is freed; some go to another worker, which frees
 * them. Meanwhile main calls keel_purge() again and again, which releases the empty slabs,
 * so that the classes keep taking new ones: before each, the taking thread gathers the
 * class's free blocks from the other workers' bins (src/core/tcache.c, "gathering"),
 * skipping a worker caught inside a malloc or free. A block taken from a bin its owner
 * was using, handed out twice, or a bin left inconsistent shows up as a pattern
 * mismatch, a crash, or a corruption report.
 */
#include "test.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NTHREADS 8
#define SLOTS 16
#define SECONDS 3.0
#define MAILBOX 64
#define PURGE_PAUSE_NS 2000000 /* between two keel_purge calls: each takes back the caches, bins and all, of the workers not in a call */

static volatile int stop;
static long failures, handed;

typedef struct {
  unsigned char* p;
  size_t n;
  uint64_t seed;
} slot_t;

static struct {
  pthread_mutex_t mu;
  slot_t box[MAILBOX];
  int count;
} mail = {PTHREAD_MUTEX_INITIALIZER, {{0}}, 0};

/* A gather needs membarrier(2)'s private expedited barrier (not every kernel or emulator
 * has it). */
static int barrier_available(void) {
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  return cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0;
}

static int intact(const slot_t* s) {
  size_t off = pattern_check(s->p, s->n, s->seed);
  return CHECK_MSG(off == SIZE_MAX, "block %p of %zu bytes changed at byte %zu while live", (void*)s->p, s->n, off);
}

static void release(slot_t* s) {
  if (!intact(s)) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
  free(s->p);
  s->p = NULL;
}

static void* worker(void* arg) {
  uint64_t x = 0x9e3779b97f4a7c15ull * ((uint64_t)(uintptr_t)arg + 1);
  slot_t slot[SLOTS] = {{0}};
  long ops = 0;
  while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
    x = mix64(x);
    slot_t* s = &slot[x % SLOTS];
    if (s->p) {
      if ((x >> 8) % 4 == 0) { /* another worker frees it */
        pthread_mutex_lock(&mail.mu);
        if (mail.count < MAILBOX) {
          mail.box[mail.count++] = *s;
          s->p = NULL;
        }
        pthread_mutex_unlock(&mail.mu);
        if (s->p == NULL) {
          __atomic_add_fetch(&handed, 1, __ATOMIC_RELAXED);
          continue;
        }
      }
      release(s);
    } else {
      s->n = 8193 + (size_t)(x >> 20) % (24 << 10);
      s->p = malloc(opaque_size(s->n));
      if (!CHECK(s->p != NULL)) break;
      s->seed = x;
      pattern_fill(s->p, s->n, s->seed);
    }
    if (++ops % 64 == 0) {
      slot_t got = {0};
      pthread_mutex_lock(&mail.mu);
      if (mail.count > 0) got = mail.box[--mail.count];
      pthread_mutex_unlock(&mail.mu);
      if (got.p) release(&got);
    }
  }
  for (int i = 0; i < SLOTS; i++)
    if (slot[i].p) release(&slot[i]);
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    if (!CHECK(pthread_create(&th[i], NULL, worker, (void*)(intptr_t)i) == 0)) return test_finish();
  long purges = purge_repeatedly(SECONDS * stress_scale(), PURGE_PAUSE_NS);
#ifdef KEEL_TESTING_KEEL
  /* A slow run (an emulator: the purges took the workers' caches back as fast as they
   * filled them) may have gathered nothing yet: main then holds blocks of the workers'
   * classes, purging no more, until one of its mallocs gathers from their bins. */
  enum { HOARD = 2048 };
  static void* hoard[HOARD];
  int held = 0;
  while (barrier_available() && held < HOARD && (held % 32 != 0 || keel_stats_counter("blocks_gathered") == 0)) {
    hoard[held] = malloc(opaque_size(8193 + (size_t)held * 4099 % (24 << 10)));
    if (!CHECK(hoard[held] != NULL)) break;
    if (++held % 32 == 0) nanosleep(&(struct timespec){0, 2000000}, NULL);
  }
  while (held > 0) free(hoard[--held]);
#endif
  __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  while (mail.count > 0) release(&mail.box[--mail.count]);
  printf("%ld purges while %d threads worked, %ld blocks freed by another thread\n", purges, NTHREADS, handed);
  EXPECT_EQ_I(0, failures);
  CHECK(handed > 0);
#ifdef KEEL_TESTING_KEEL
  unsigned long long gathers = keel_stats_counter("gathers"), blocks = keel_stats_counter("blocks_gathered");
  printf("%llu gathers took %llu blocks\n", gathers, blocks);
  if (barrier_available()) CHECK_MSG(blocks > 0, "%llu gathers took no block", gathers);
#endif
  return test_finish();
}
