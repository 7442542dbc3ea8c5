/* test_fork_more.c -- fork, spawn and exec while threads allocate: what
 * tests/stress/test_fork.c does not cover.
 *
 * In the parent, all the time: two workers allocate/realloc/free every tier (huge
 * blocks grow and shrink through mremap) and publish finished blocks in lock-free
 * slots; a churn loop starts and ends short-lived threads (so forks land while threads
 * are being created and are exiting, flushing their caches). The main thread forks
 * ROUNDS times (300 x KEEL_STRESS_SCALE); each child
 *   - takes the blocks the parent's *other* threads had published (their caches were
 *     abandoned in the child), verifies and frees them;
 *   - allocates, verifies and frees blocks of every tier, and starts a thread;
 *   - every 8th round forks a grandchild that allocates and exits (fork in a child);
 *   - every 25th round checks that the background purger was restarted in the child:
 *     memory it frees is returned to the OS without further calls;
 *   - exits with _exit(0), or execs /bin/true (every 6th round).
 * Every 5th round the parent also runs posix_spawn(/bin/true) (clone(CLONE_VFORK):
 * no fork handlers run) and popen("echo"), while the threads allocate.
 * Children report through write(2) only. A stuck child is killed by its alarm.
 * Linked with libkeel.so. ctest sets KEEL_PURGE_DELAY=50.
 */
#include "faults.h"

#include <pthread.h>
#include <spawn.h>
#include <sys/wait.h>

extern char** environ;

#define NWORKERS 2
#define PUB 64
#define CHILD_TIMEOUT 30

typedef struct {
  uint64_t size;
  uint64_t seed;
} hdr_t;

static volatile int stop;
static void* published[NWORKERS][PUB]; /* blocks with a hdr_t + pattern, or NULL */
static long worker_ops[NWORKERS], churn_started;

static size_t pick(t_rng* r) { return rng_tier_size(r, 1000, 850, 970, 995, 16, 6 << 20); }

static void* make_block(size_t n, uint64_t seed) {
  hdr_t* h = (hdr_t*)malloc(n);
  if (!h) return NULL;
  h->size = n;
  h->seed = seed;
  size_t body = n - sizeof *h;
  pattern_fill(h + 1, body < 2048 ? body : 2048, seed);
  return h;
}
static int block_ok(const void* p) {
  const hdr_t* h = (const hdr_t*)p;
  size_t body = h->size - sizeof *h;
  return pattern_check(h + 1, body < 2048 ? body : 2048, h->seed) == SIZE_MAX;
}

static void* worker(void* arg) {
  int me = (int)(intptr_t)arg;
  t_rng r;
  rng_seed(&r, 500 + (uint64_t)me);
  void* own[32] = {0};
  long ops = 0;
  while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
    if ((ops & 127) == 127) usleep(100); /* leave the forking thread some CPU */
    int i = (int)(rng_next(&r) % 32);
    if (own[i]) {
      CHECK_MSG(block_ok(own[i]), "worker %d: block corrupted", me);
      uint64_t u = rng_next(&r) % 4;
      if (u == 0) {
        size_t n = pick(&r);
        hdr_t* h = (hdr_t*)own[i];
        uint64_t seed = h->seed;
        size_t old = h->size;
        hdr_t* q = (hdr_t*)realloc(h, n);
        if (CHECK(q != NULL)) {
          size_t keep = (n < old ? n : old) - sizeof *q;
          CHECK(pattern_check(q + 1, keep < 2048 ? keep : 2048, seed) == SIZE_MAX);
          q->size = n;
          pattern_fill(q + 1, n - sizeof *q < 2048 ? n - sizeof *q : 2048, seed);
          own[i] = q;
        }
      } else if (u == 1) {
        /* Publish: a child forked from now on may take it. */
        void* old = __atomic_exchange_n(&published[me][rng_next(&r) % PUB], own[i], __ATOMIC_ACQ_REL);
        own[i] = NULL;
        if (old) {
          CHECK(block_ok(old));
          free(old);
        }
      } else {
        free(own[i]);
        own[i] = NULL;
      }
    } else {
      own[i] = make_block(pick(&r), rng_next(&r));
      CHECK(own[i] != NULL);
    }
    ops++;
  }
  for (int i = 0; i < 32; i++) free(own[i]);
  worker_ops[me] = ops;
  return NULL;
}

static void* short_lived(void* arg) {
  t_rng r;
  rng_seed(&r, (uint64_t)(uintptr_t)arg);
  void* p[16];
  for (int i = 0; i < 16; i++) p[i] = make_block((size_t)rng_range(&r, 16, 5000), i);
  for (int i = 0; i < 16; i++) free(p[i]);
  return NULL;
}

static void* churner(void* arg) {
  (void)arg;
  uintptr_t k = 1;
  while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
    pthread_t t;
    if (pthread_create(&t, NULL, short_lived, (void*)k++) == 0) {
      pthread_join(t, NULL);
      __atomic_fetch_add(&churn_started, 1, __ATOMIC_RELAXED);
    }
    usleep(300);
  }
  return NULL;
}

/* ------------------------------------------------------------- child side --- */

static void say(const char* s) {
  ssize_t w = write(2, s, strlen(s));
  (void)w;
}

static int child_alloc(uint64_t seed) {
  t_rng r;
  rng_seed(&r, seed);
  void* p[48];
  for (int i = 0; i < 48; i++) {
    p[i] = make_block(pick(&r), rng_next(&r));
    if (!p[i]) return 0;
  }
  for (int i = 0; i < 48; i++) {
    if (!block_ok(p[i])) return 0;
    free(p[i]);
  }
  return 1;
}

static void* child_thread(void* arg) { return child_alloc((uint64_t)(uintptr_t)arg) ? arg : NULL; }

static int child_purger_check(void) {
  /* Large spans freed now stay dirty for KEEL_PURGE_DELAY, then the child's own
   * background purger must return them. */
  keel_stats_t s0 = keel_stats_now();
  void* p[24];
  for (int i = 0; i < 24; i++) {
    p[i] = malloc(768 << 10);
    if (!p[i]) return 0;
    memset(p[i], 1, 768 << 10);
  }
  for (int i = 0; i < 24; i++) free(p[i]);
  for (int t = 0; t < 100; t++) { /* up to 5 s */
    usleep(50000);
    keel_stats_t s = keel_stats_now();
    if (s.purged_bytes >= s0.purged_bytes + ((size_t)8 << 20)) return 1;
  }
  return 0;
}

static int child_main(int round) {
  alarm(CHILD_TIMEOUT);
  int bad = 0, taken = 0;
  for (int w = 0; w < NWORKERS; w++)
    for (int i = 0; i < PUB; i++) {
      void* p = published[w][i];
      if (!p) continue;
      if (!block_ok(p)) bad++;
      free(p);
      taken++;
    }
  if (bad) {
    say("child: a block published by another thread is corrupted\n");
    return 2;
  }
  if (!child_alloc((uint64_t)round * 7 + 1)) {
    say("child: allocation failed or corrupted\n");
    return 3;
  }
  pthread_t t;
  if (pthread_create(&t, NULL, child_thread, (void*)(uintptr_t)(round + 1)) != 0) return 4;
  void* res;
  pthread_join(t, &res);
  if (!res) {
    say("child: its thread's allocations failed\n");
    return 5;
  }
  if (round % 8 == 0) {
    pid_t g = fork();
    if (g == 0) {
      alarm(CHILD_TIMEOUT);
      _exit(child_alloc((uint64_t)round * 13 + 5) ? 0 : 6);
    }
    int st = 0;
    if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      say("child: grandchild failed\n");
      return 7;
    }
  }
  if (round % 25 == 0 && !child_purger_check()) {
    say("child: freed memory was not purged within 5 s: no background purger in the child?\n");
    return 8;
  }
  (void)taken;
  return 0;
}

int main(void) {
  assert_keel_in_use();
  watchdog(600);
  int rounds = (int)(300 * stress_scale());
  if (rounds < 30) rounds = 30;
  double t0 = now_sec();

  pthread_t w[NWORKERS], ch;
  for (int i = 0; i < NWORKERS; i++)
    CHECK(pthread_create(&w[i], NULL, worker, (void*)(intptr_t)i) == 0);
  CHECK(pthread_create(&ch, NULL, churner, NULL) == 0);
  usleep(20000);

  int failed = 0, spawned = 0, popened = 0, execs = 0, purger_checks = 0;
  for (int round = 0; round < rounds; round++) {
    int do_exec = round % 6 == 5;
    pid_t pid = fork();
    if (pid == 0) {
      int rc = child_main(round);
      if (rc == 0 && do_exec) {
        char* argv[] = {(char*)"/bin/true", NULL};
        execve("/bin/true", argv, environ);
        _exit(9);
      }
      _exit(rc);
    }
    if (!CHECK(pid > 0)) break;
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      failed++;
      CHECK_MSG(0, "round %d: child %s %d", round, WIFEXITED(st) ? "exited with" : "killed by signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    execs += do_exec;
    purger_checks += round % 25 == 0;
    if (round % 5 == 0) {
      pid_t sp;
      char* argv[] = {(char*)"/bin/true", NULL};
      if (CHECK(posix_spawn(&sp, "/bin/true", NULL, NULL, argv, environ) == 0)) {
        CHECK(waitpid(sp, &st, 0) == sp && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        spawned++;
      }
      FILE* f = popen("echo keel", "r");
      if (CHECK(f != NULL)) {
        char buf[16] = {0};
        CHECK(fgets(buf, sizeof buf, f) != NULL && strcmp(buf, "keel\n") == 0);
        CHECK(pclose(f) == 0);
        popened++;
      }
    }
  }
  __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < NWORKERS; i++) pthread_join(w[i], NULL);
  pthread_join(ch, NULL);
  for (int k = 0; k < NWORKERS; k++)
    for (int i = 0; i < PUB; i++) {
      if (published[k][i]) CHECK(block_ok(published[k][i]));
      free(published[k][i]);
    }
  printf("fork: %d rounds in %.1f s (%d failed): %d exec'ed /bin/true, %d had a grandchild, "
         "%d checked the child's purger; %d posix_spawn, %d popen; worker ops %ld + %ld, "
         "%ld short-lived threads\n",
         rounds, now_sec() - t0, failed, execs, (rounds + 7) / 8, purger_checks, spawned, popened,
         worker_ops[0], worker_ops[1], churn_started);
  return test_finish();
}
