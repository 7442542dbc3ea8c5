/* test_signals.c -- signals that interrupt allocation.
 *
 * Two threads allocate, realloc and free without pause (small thread caches, so they
 * meet on the central lists' locks and sleep in futex waits), passing blocks to each
 * other, while
 *   - an ITIMER_PROF timer fires SIGPROF every 500 us of CPU time, and
 *   - a third thread sends SIGUSR1/SIGUSR2 to both of them every ~100 us.
 * The handlers are installed without SA_RESTART, so interrupted system calls (futex
 * waits in Keel's lock, madvise/munmap/mremap are not interruptible but are retried by
 * nothing) return EINTR. The handlers do NOT allocate (malloc is not async-signal-safe):
 * they save errno, write and check a pattern in a block allocated before the storm,
 * count, and restore errno.
 * Checked: every block's contents, that no successful allocation leaves errno == EINTR
 * (Keel restores errno around its system calls), that the signals really arrived, and
 * that nothing deadlocks (alarm watchdog).
 * Linked with libkeel.so. Environment: KEEL_STRESS_SCALE scales the run.
 */
#include "faults.h"

#include <pthread.h>
#include <sys/time.h>

#define SLOTS 256
#define XSLOTS 64

static unsigned char* sig_block; /* allocated before the storm; handlers write into it */
static _Thread_local int my_index; /* 0: main, 1: the other churning thread */
static volatile sig_atomic_t in_handler;
static long sig_count[3];
static long sig_bad;
static volatile int stop;
static void* xfer[XSLOTS]; /* blocks passed between the two threads (atomic exchange) */

static void on_signal(int sig) {
  int saved = errno;
  int idx = sig == SIGPROF ? 0 : sig == SIGUSR1 ? 1 : 2;
  __atomic_fetch_add(&sig_count[idx], 1, __ATOMIC_RELAXED);
  /* Touch memory Keel handed out: a 1 KiB stripe per thread and signal, written then
   * checked. Handlers do not nest in a thread (sa_mask blocks the others meanwhile). */
  unsigned char* s = sig_block + (size_t)(my_index * 3 + idx) * 1024;
  uint64_t seed = (uint64_t)__atomic_load_n(&sig_count[idx], __ATOMIC_RELAXED);
  pattern_fill(s, 1024, seed);
  if (pattern_check(s, 1024, seed) != SIZE_MAX) __atomic_fetch_add(&sig_bad, 1, __ATOMIC_RELAXED);
  errno = saved;
}

typedef struct {
  unsigned char* p;
  size_t n;
  uint64_t seed;
} blk_t;

static long eintr_leaks, ops_done[2];

static size_t pick(t_rng* r) { return rng_tier_size(r, 1000, 900, 990, 998, 1, 3 << 20); }

static void* churn(void* arg) {
  int me = (int)(intptr_t)arg;
  my_index = me;
  t_rng r;
  rng_seed(&r, 31 + (uint64_t)me);
  blk_t s[SLOTS];
  memset(s, 0, sizeof s);
  long ops = 0;
  while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
    blk_t* b = &s[rng_next(&r) % SLOTS];
    if (b->p) {
      size_t off = pattern_check(b->p, b->n < 4096 ? b->n : 4096, b->seed);
      CHECK_MSG(off == SIZE_MAX, "thread %d: block %p (%zu) differs at %zu", me, (void*)b->p, b->n, off);
      uint64_t u = rng_next(&r) % 8;
      if (u == 0) {
        size_t n = pick(&r);
        errno = 0;
        unsigned char* q = (unsigned char*)realloc(b->p, n);
        if (CHECK(q != NULL)) {
          if (errno == EINTR) __atomic_fetch_add(&eintr_leaks, 1, __ATOMIC_RELAXED);
          size_t keep = n < b->n ? n : b->n;
          CHECK(pattern_check(q, keep < 4096 ? keep : 4096, b->seed) == SIZE_MAX);
          b->p = q;
          b->n = n;
          pattern_fill(q, n < 4096 ? n : 4096, b->seed);
        }
      } else if (u == 1) {
        /* Pass it to the other thread (its free is a cross-thread free). */
        unsigned char* hdr = b->p;
        if (b->n >= 16) {
          memcpy(hdr, &b->n, sizeof b->n); /* the receiver learns the size... */
          void* old = __atomic_exchange_n(&xfer[rng_next(&r) % XSLOTS], hdr, __ATOMIC_ACQ_REL);
          if (old) free(old);
          b->p = NULL;
        }
      } else {
        free(b->p);
        b->p = NULL;
      }
    } else {
      b->n = pick(&r);
      errno = 0;
      switch (rng_next(&r) % 4) {
        case 0:
          b->p = (unsigned char*)calloc(1, b->n);
          break;
        case 1: {
          void* p = NULL;
          b->p = posix_memalign(&p, 64, b->n) == 0 ? (unsigned char*)p : NULL;
          break;
        }
        default:
          b->p = (unsigned char*)malloc(b->n);
      }
      if (CHECK(b->p != NULL)) {
        if (errno == EINTR) __atomic_fetch_add(&eintr_leaks, 1, __ATOMIC_RELAXED);
        b->seed = rng_next(&r);
        pattern_fill(b->p, b->n < 4096 ? b->n : 4096, b->seed);
      }
    }
    /* ... and frees what the other thread passed. */
    if ((ops & 7) == 0) {
      void* got = __atomic_exchange_n(&xfer[rng_next(&r) % XSLOTS], NULL, __ATOMIC_ACQ_REL);
      if (got) free(got);
    }
    ops++;
  }
  for (int i = 0; i < SLOTS; i++) free(s[i].p);
  ops_done[me] = ops;
  return NULL;
}

static pthread_t targets[2];

static double run_until;

static void* signaller(void* arg) {
  (void)arg;
  struct timespec ts = {0, 100 * 1000};
  long n = 0;
  while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
    if ((++n & 63) == 0 && now_sec() >= run_until) __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    pthread_kill(targets[0], SIGUSR1);
    pthread_kill(targets[1], SIGUSR2);
    nanosleep(&ts, NULL);
  }
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  watchdog(240);
  double secs = 8 * stress_scale();
  if (secs < 2) secs = 2;
  sig_block = (unsigned char*)malloc(6 * 1024);
  if (!CHECK(sig_block != NULL)) return test_finish();

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGPROF);
  sigaddset(&sa.sa_mask, SIGUSR1);
  sigaddset(&sa.sa_mask, SIGUSR2);
  sa.sa_flags = 0; /* no SA_RESTART: interrupted system calls fail with EINTR */
  CHECK(sigaction(SIGPROF, &sa, NULL) == 0);
  CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
  CHECK(sigaction(SIGUSR2, &sa, NULL) == 0);

  /* The signaller must not receive the signals itself. */
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigaddset(&block, SIGUSR2);
  sigaddset(&block, SIGPROF);

  double t0 = now_sec();
  run_until = t0 + secs;
  targets[0] = pthread_self();
  CHECK(pthread_create(&targets[1], NULL, churn, (void*)(intptr_t)1) == 0);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  pthread_t sig_thread;
  CHECK(pthread_create(&sig_thread, NULL, signaller, NULL) == 0);
  pthread_sigmask(SIG_SETMASK, &old, NULL);

  struct itimerval it = {{0, 500}, {0, 500}};
  CHECK(setitimer(ITIMER_PROF, &it, NULL) == 0);

  /* The signaller ends the run after `secs`; main churns until then. */
  churn((void*)(intptr_t)0);

  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  pthread_join(targets[1], NULL);
  pthread_join(sig_thread, NULL);
  for (int k = 0; k < XSLOTS; k++) free(xfer[k]);
  free(sig_block);

  printf("signals: %.1f s; ops %ld + %ld; SIGPROF %ld, SIGUSR1 %ld, SIGUSR2 %ld; "
         "handler pattern errors %ld; successful calls leaving errno EINTR %ld\n",
         now_sec() - t0, ops_done[0], ops_done[1], sig_count[0], sig_count[1], sig_count[2],
         sig_bad, eintr_leaks);
  CHECK(sig_bad == 0);
  CHECK_MSG(eintr_leaks == 0, "%ld successful allocations left errno == EINTR", eintr_leaks);
  CHECK_MSG(sig_count[1] > 100 && sig_count[2] > 100, "too few signals arrived: %ld %ld",
            sig_count[1], sig_count[2]);
  return test_finish();
}
