/* threads_park -- how much memory does an allocator keep per thread?
 *
 * Usage: threads_park N [STACK_KIB [BLOCKS [WORK [BURST]]]]
 * Protocol on stdin/stdout (the lab's `threads` suite drives it and reads VmRSS from
 * /proc/PID/status at each step):
 *   1. main does the same small allocations a thread does (so the allocator and its
 *      first thread cache exist), prints "base", and waits for a line on stdin;
 *   2. on that line it starts N threads; each allocates a little (BLOCKS blocks,
 *      default 24, of 16 B to 4 KiB, written, a third of them freed again: what a
 *      connection thread of a server leaves behind; 0: nothing, which measures what
 *      a thread costs before its allocator does anything for it) and parks on a
 *      condition variable; when all N are parked main prints "parked <nanoseconds>";
 *   3. on the next line (or EOF) the threads are released, free what they hold and
 *      exit; main joins them and prints "done checksum=<hex>".
 * With WORK > 0 each thread first works: it allocates and frees WORK blocks of 16 B to
 * 1 KiB (pseudo-random sizes, written), one at a time, or with BURST=1 all of them
 * and then all of them freed (a query's working set) - what a pooled connection thread
 * did before it waits for its next client.
 * Threads get STACK_KIB of stack (default 256, about what database servers use:
 * MariaDB's thread_stack is 292 KiB), so virtual memory stays small with 4096 threads.
 * If a thread cannot be created, main prints "error <count created> <reason>" and
 * exits with status 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCKS 24 /* the most, and the default */
static int nblocks = BLOCKS;
static long nwork = 0;
static int burst = 0;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t parked_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t release_cv = PTHREAD_COND_INITIALIZER;
static long parked = 0;
static int released = 0;
static uint64_t checksum = 0;

static size_t block_size(long id, int i) { return (size_t)16 << ((id + 1 + i) % 9); } /* 16 B .. 4 KiB */

static uint64_t work(long id, void** keep) {
  uint64_t sum = 0;
  for (int i = 0; i < BLOCKS; i++) keep[i] = NULL;
  for (int i = 0; i < nblocks; i++) {
    size_t n = block_size(id, i);
    unsigned char* p = malloc(n);
    if (!p) {
      fprintf(stderr, "threads_park: malloc(%zu) failed\n", n);
      exit(3);
    }
    memset(p, (int)((id + i) & 0xff), n);
    sum += p[n - 1] + n;
    keep[i] = p;
  }
  for (int i = 0; i < nblocks; i += 3) { /* free a third: they stay in the thread's cache */
    free(keep[i]);
    keep[i] = NULL;
  }
  return sum;
}

/* WORK blocks of 16 B - 1 KiB allocated and freed, one at a time or in a burst. */
static uint64_t churn(long id) {
  uint64_t sum = 0, x = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 2);
  void** held = burst && nwork > 0 ? malloc((size_t)nwork * sizeof *held) : NULL;
  if (burst && nwork > 0 && !held) {
    fprintf(stderr, "threads_park: malloc of the burst's array failed\n");
    exit(3);
  }
  for (long i = 0; i < nwork; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t n = 16 + (size_t)(x % 1009);
    unsigned char* p = malloc(n);
    if (!p) {
      fprintf(stderr, "threads_park: malloc(%zu) failed\n", n);
      exit(3);
    }
    memset(p, (int)(i & 0xff), n);
    sum += p[n / 2] + n;
    if (held) held[i] = p;
    else free(p);
  }
  if (held) {
    for (long i = 0; i < nwork; i++) free(held[i]);
    free(held);
  }
  return sum;
}

static void* thread_main(void* arg) {
  long id = (long)(intptr_t)arg;
  void* keep[BLOCKS];
  uint64_t sum = churn(id) + work(id, keep);
  pthread_mutex_lock(&mu);
  parked++;
  checksum += sum;
  pthread_cond_signal(&parked_cv);
  while (!released) pthread_cond_wait(&release_cv, &mu);
  pthread_mutex_unlock(&mu);
  for (int i = 0; i < BLOCKS; i++) free(keep[i]);
  return NULL;
}

static int wait_line(void) {
  char buf[64];
  return fgets(buf, sizeof buf, stdin) != NULL;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s N [STACK_KIB [BLOCKS [WORK [BURST]]]]\n", argv[0]);
    return 1;
  }
  long n = strtol(argv[1], NULL, 10);
  long stack_kib = argc > 2 ? strtol(argv[2], NULL, 10) : 256;
  long blocks = argc > 3 ? strtol(argv[3], NULL, 10) : BLOCKS;
  nwork = argc > 4 ? strtol(argv[4], NULL, 10) : 0;
  burst = argc > 5 ? (int)strtol(argv[5], NULL, 10) : 0;
  if (n < 0 || n > 1000000 || stack_kib < 64 || blocks < 0 || blocks > BLOCKS || nwork < 0 ||
      nwork > 1000000 || burst < 0 || burst > 1) {
    fprintf(stderr, "threads_park: bad arguments\n");
    return 1;
  }
  nblocks = (int)blocks;
  void* mine[BLOCKS];
  uint64_t base_sum = work(-1, mine);
  printf("base\n");
  fflush(stdout);
  if (!wait_line()) return 0;

  pthread_t* tids = calloc((size_t)n + 1, sizeof *tids);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, (size_t)stack_kib * 1024);
  uint64_t t0 = now_ns();
  long created = 0;
  for (; created < n; created++) {
    int rc = pthread_create(&tids[created], &attr, thread_main, (void*)(intptr_t)created);
    if (rc != 0) {
      printf("error %ld pthread_create: %s\n", created, strerror(rc));
      fflush(stdout);
      pthread_mutex_lock(&mu);
      released = 1;
      pthread_cond_broadcast(&release_cv);
      pthread_mutex_unlock(&mu);
      for (long i = 0; i < created; i++) pthread_join(tids[i], NULL);
      return 2;
    }
  }
  pthread_mutex_lock(&mu);
  while (parked < n) pthread_cond_wait(&parked_cv, &mu);
  pthread_mutex_unlock(&mu);
  printf("parked %llu\n", (unsigned long long)(now_ns() - t0));
  fflush(stdout);

  wait_line();
  pthread_mutex_lock(&mu);
  released = 1;
  pthread_cond_broadcast(&release_cv);
  pthread_mutex_unlock(&mu);
  for (long i = 0; i < n; i++) pthread_join(tids[i], NULL);
  for (int i = 0; i < BLOCKS; i++) free(mine[i]);
  free(tids);
  printf("done checksum=%016llx\n", (unsigned long long)(checksum + base_sum));
  fflush(stdout);
  return 0;
}
