/* test_fork.c -- fork() while other threads allocate.
 *
 * Background threads allocate, fill, verify and free without pause while the main thread
 * forks ROUNDS times. Each child (which inherits whatever allocator locks those threads
 * held at the instant of the fork) must be able to:
 *   - read and free blocks the parent allocated before the fork,
 *   - allocate, realloc, verify and free blocks of every size class, including huge ones,
 *   - start a thread of its own that allocates (every few rounds),
 * and then _exit(0). A child that deadlocks is killed by its own alarm() and reported as
 * "killed by signal 14". Some rounds exec /bin/true instead, right after fork or after
 * allocating. A second phase forks from a non-main thread.
 *
 * Children report through write(2) only: the parent's stdio locks may have been held by
 * another thread at fork time.
 * Environment: KEEL_STRESS_SCALE (default 1) scales the number of rounds.
 */
#include "test.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#define NWORKERS 2
#define ROUNDS 200
#define THREAD_ROUNDS 40
#define NINHERIT 48
#define CHILD_TIMEOUT 30 /* seconds before a stuck child is killed by SIGALRM */

static volatile int stop_workers;
static long worker_ops[NWORKERS];

typedef struct {
  unsigned char* p;
  size_t n;
  uint64_t seed;
} blk_t;

static blk_t inherited[NINHERIT];

/* A size for u (0-99): 90% from lo to 1 KiB, 9% up to 100 KB, 1% up to 1 MiB. */
static size_t pick_size(t_rng* r, uint64_t u, uint64_t lo) {
  return u < 90   ? (size_t)rng_range(r, lo, 1024)
         : u < 99 ? (size_t)rng_range(r, 1025, 100000)
                  : (size_t)rng_range(r, 100001, 1 << 20);
}

/* ------------------------------------------------------------ parent side --- */

static void* worker(void* arg) {
  int me = (int)(intptr_t)arg;
  t_rng r;
  rng_seed(&r, 77 + (uint64_t)me);
  enum { SLOTS = 64 };
  blk_t s[SLOTS];
  memset(s, 0, sizeof s);
  long ops = 0;
  while (!__atomic_load_n(&stop_workers, __ATOMIC_RELAXED)) {
    /* Duty cycle: on a small machine, spinning workers would starve the forking thread.
     * They still spend most of their running time inside malloc/free. */
    if ((ops & 255) == 255) usleep(200);
    blk_t* b = &s[rng_next(&r) % SLOTS];
    if (b->p) {
      size_t off = pattern_check(b->p, b->n, b->seed);
      CHECK_MSG(off == SIZE_MAX, "worker %d: block %p size %zu corrupted at %zu", me,
                (void*)b->p, b->n, off);
      if (rng_next(&r) % 4 == 0) {
        size_t n = (size_t)rng_range(&r, 1, 3000);
        unsigned char* q = (unsigned char*)realloc(b->p, n);
        if (CHECK(q != NULL)) {
          size_t keep = n < b->n ? n : b->n;
          CHECK(pattern_check(q, keep, b->seed) == SIZE_MAX);
          b->p = q;
          b->n = n;
          pattern_fill(q, n, b->seed);
          ops++;
          continue;
        }
      }
      free(b->p);
      b->p = NULL;
    }
    size_t n = pick_size(&r, rng_next(&r) % 100, 1);
    b->p = (unsigned char*)malloc(n);
    if (!CHECK(b->p != NULL)) continue;
    b->n = n;
    b->seed = rng_next(&r);
    pattern_fill(b->p, n, b->seed);
    ops++;
  }
  for (int i = 0; i < SLOTS; i++) free(s[i].p);
  worker_ops[me] = ops;
  return NULL;
}

/* -------------------------------------------------------------- child side --- */

__attribute__((format(printf, 1, 2))) static void child_fail(const char* fmt, ...) {
  char buf[300];
  int n = snprintf(buf, sizeof buf, "child %d: ", (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  if (write(2, buf, (size_t)n) < 0) {
  }
}

/* Allocates, verifies and frees a mix of sizes; returns the number of errors. */
static int child_churn(uint64_t seed, int count) {
  t_rng r;
  rng_seed(&r, seed);
  enum { LIVE = 32 };
  blk_t live[LIVE];
  memset(live, 0, sizeof live);
  int errors = 0;
  for (int i = 0; i < count; i++) {
    blk_t* b = &live[rng_next(&r) % LIVE];
    if (b->p) {
      size_t off = pattern_check(b->p, b->n, b->seed);
      if (off != SIZE_MAX) {
        child_fail("block %p size %zu corrupted at offset %zu", (void*)b->p, b->n, off);
        errors++;
      }
      free(b->p);
      b->p = NULL;
    }
    uint64_t u = rng_next(&r) % 100;
    size_t n = pick_size(&r, u, 0);
    unsigned char* p;
    if (u % 10 == 0) {
      p = (unsigned char*)calloc(1, n);
      if (p && first_nonzero(p, n) != SIZE_MAX) {
        child_fail("calloc(1, %zu) memory not zeroed", n);
        errors++;
      }
    } else if (u % 10 == 1) {
      p = (unsigned char*)memalign(256, n);
      if (p && (uintptr_t)p % 256) {
        child_fail("memalign(256, %zu) = %p misaligned", n, (void*)p);
        errors++;
      }
    } else {
      p = (unsigned char*)malloc(n);
    }
    if (!p) {
      child_fail("allocation of %zu bytes failed", n);
      errors++;
      continue;
    }
    b->p = p;
    b->n = n;
    b->seed = rng_next(&r);
    pattern_fill(p, n, b->seed);
    if (u % 7 == 0) { /* grow it */
      size_t n2 = n * 2 + 1;
      unsigned char* q = (unsigned char*)realloc(p, n2);
      if (!q) {
        child_fail("realloc to %zu failed", n2);
        errors++;
      } else {
        if (pattern_check(q, n, b->seed) != SIZE_MAX) {
          child_fail("realloc %zu -> %zu lost data", n, n2);
          errors++;
        }
        b->p = q;
      }
    }
  }
  for (int i = 0; i < LIVE; i++) {
    if (!live[i].p) continue;
    if (pattern_check(live[i].p, live[i].n, live[i].seed) != SIZE_MAX) {
      child_fail("block %p size %zu corrupted", (void*)live[i].p, live[i].n);
      errors++;
    }
    free(live[i].p);
  }
  return errors;
}

static void* child_thread(void* arg) {
  intptr_t errs = child_churn((uint64_t)(uintptr_t)arg, 150);
  return (void*)errs;
}

/* Runs in the child; returns its exit status. */
static int child_main(int round, int with_thread) {
  alarm(CHILD_TIMEOUT);
  int errors = 0;
  /* Blocks allocated by the parent before the fork: intact, and freeable here. */
  for (int i = 0; i < NINHERIT; i++) {
    size_t off = pattern_check(inherited[i].p, inherited[i].n, inherited[i].seed);
    if (off != SIZE_MAX) {
      child_fail("inherited block %d (%p, %zu bytes) corrupted at %zu", i,
                 (void*)inherited[i].p, inherited[i].n, off);
      errors++;
    }
    if (malloc_usable_size(inherited[i].p) < inherited[i].n) {
      child_fail("inherited block %d: usable size %zu < %zu", i,
                 malloc_usable_size(inherited[i].p), inherited[i].n);
      errors++;
    }
    if ((i + round) % 2 == 0) free(inherited[i].p);
  }
  errors += child_churn((uint64_t)round * 7919 + 1, 200);
  /* One huge block for certain (mapped directly by most allocators). Only a stripe of
   * every page is written: this is about the mapping path, not memory bandwidth. */
  size_t hn = ((size_t)8 << 20) + (size_t)round;
  unsigned char* h = (unsigned char*)malloc(hn);
  if (!h) {
    child_fail("malloc(%zu) failed", hn);
    errors++;
  } else {
    for (size_t off = 0; off + 64 <= hn; off += 4096) pattern_fill(h + off, 64, off + round);
    pattern_fill(h + hn - 64, 64, 1);
    for (size_t off = 0; off + 64 <= hn - 64; off += 4096)
      if (pattern_check(h + off, 64, off + round) != SIZE_MAX) {
        child_fail("huge block %p corrupted near offset %zu", (void*)h, off);
        errors++;
        break;
      }
    free(h);
  }
  if (with_thread) {
    pthread_t t;
    if (pthread_create(&t, NULL, child_thread, (void*)(uintptr_t)(round + 1)) != 0) {
      child_fail("pthread_create failed");
      errors++;
    } else {
      void* ret = NULL;
      pthread_join(t, &ret);
      errors += (int)(intptr_t)ret;
    }
  }
#ifdef KEEL_TESTING_KEEL
  keel_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  if (keel_stats_get(&s) != 0) {
    child_fail("keel_stats_get failed");
    errors++;
  }
#endif
  return errors ? 1 : 0;
}

/* ------------------------------------------------------------------ rounds --- */

/* exec_mode: 0 none, 1 exec /bin/true right after fork, 2 allocate first then exec. */
static void one_round(int round, int with_thread, int exec_mode, const char* who) {
  pid_t pid = fork();
  if (!CHECK_MSG(pid >= 0, "%s: fork failed: %s", who, strerror(errno))) return;
  if (pid == 0) {
    if (exec_mode) {
      alarm(CHILD_TIMEOUT);
      if (exec_mode == 2 && child_churn((uint64_t)round, 50) != 0) _exit(3);
      execl("/bin/true", "true", (char*)NULL);
      _exit(127);
    }
    _exit(child_main(round, with_thread));
  }
  int st = 0;
  pid_t w;
  do
    w = waitpid(pid, &st, 0);
  while (w < 0 && errno == EINTR);
  CHECK_MSG(w == pid, "%s: waitpid: %s", who, strerror(errno));
  if (WIFSIGNALED(st))
    CHECK_MSG(0, "%s: round %d child (exec mode %d) killed by signal %d%s", who, round,
              exec_mode, WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (timed out: deadlock?)" : "");
  else
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "%s: round %d child (exec mode %d) exited with status %d", who, round, exec_mode,
              WEXITSTATUS(st));
}

static int thread_rounds;
static void* forking_thread(void* arg) {
  (void)arg;
  for (int i = 0; i < thread_rounds; i++) one_round(100000 + i, i % 3 == 0, i == 5 ? 2 : 0,
                                                     "forking thread");
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  double scale = stress_scale();
  int rounds = (int)(ROUNDS * scale);
  if (rounds < 10) rounds = 10;
  thread_rounds = (int)(THREAD_ROUNDS * scale);
  if (thread_rounds < 6) thread_rounds = 6;

  /* Blocks the children inherit: every size range. */
  t_rng r;
  rng_seed(&r, 5);
  for (int i = 0; i < NINHERIT; i++) {
    size_t n = i < 32 ? (size_t)rng_range(&r, 1, 2048)
                      : i < 45 ? (size_t)rng_range(&r, 2049, 300000)
                               : (size_t)rng_range(&r, 1 << 20, 3 << 19);
    inherited[i].p = (unsigned char*)malloc(n);
    if (!CHECK(inherited[i].p != NULL)) return test_finish();
    inherited[i].n = n;
    inherited[i].seed = rng_next(&r);
    pattern_fill(inherited[i].p, n, inherited[i].seed);
  }

  pthread_t th[NWORKERS];
  for (int i = 0; i < NWORKERS; i++)
    CHECK(pthread_create(&th[i], NULL, worker, (void*)(intptr_t)i) == 0);
  usleep(20000);

  double t0 = now_sec();
  int exec_rounds = 0;
  for (int i = 0; i < rounds; i++) {
    int exec_mode = (i == 3 || i % 50 == 25) ? 1 : (i == 7 || i % 50 == 49) ? 2 : 0;
    exec_rounds += exec_mode != 0;
    one_round(i, i % 4 == 0, exec_mode, "main");
    /* The parent keeps allocating between forks too. */
    void* p = malloc((size_t)rng_range(&r, 1, 100000));
    CHECK(p != NULL);
    free(p);
  }
  CHECK(exec_rounds >= 2);

  /* Phase 2: fork from a thread other than main. */
  pthread_t ft;
  if (CHECK(pthread_create(&ft, NULL, forking_thread, NULL) == 0)) pthread_join(ft, NULL);

  __atomic_store_n(&stop_workers, 1, __ATOMIC_RELAXED);
  long ops = 0;
  for (int i = 0; i < NWORKERS; i++) {
    pthread_join(th[i], NULL);
    ops += worker_ops[i];
  }
  /* The parent's own blocks survived all of it. */
  for (int i = 0; i < NINHERIT; i++) {
    size_t off = pattern_check(inherited[i].p, inherited[i].n, inherited[i].seed);
    CHECK_MSG(off == SIZE_MAX, "parent block %d corrupted at %zu", i, off);
    free(inherited[i].p);
  }
  printf("%d forks from main (%d exec), %d from a thread, %.2f s; worker ops during forks: "
         "%ld\n",
         rounds, exec_rounds, thread_rounds, now_sec() - t0, ops);
  CHECK(ops > 0);
  return test_finish();
}
