/* test_fork_child_purger.c -- when a forked child starts its own background purger.
 *
 * Creating a thread in a forked child maps in pages of every library with thread-local
 * data (1.5 MiB of RSS in each PostgreSQL helper process), so a child starts its purger
 * only once it has taken KEEL_CHILD_PURGER (default 4 MiB) of spans and huge blocks
 * since the fork (init.c). Checked here, counting the threads in /proc/self/task:
 *   1. the parent runs its purger (2 threads);
 *   2. a child that allocates small blocks and 1 MiB of large ones stays single-threaded;
 *   3. the same child, after 8 MiB more of large blocks, has its purger, and memory it
 *      then frees is returned to the OS without further calls (KEEL_PURGE_DELAY=50);
 *   4. a child that frees what it inherited and takes it again counts as growing;
 *   5. with child_purger set to 0 (keel_option_set), a child has its purger at once.
 * Children report through their exit status. Linked with libkeel.so.
 */
#include "faults.h"

#include <dirent.h>
#include <sys/wait.h>

static int thread_count(void) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static int run_child(int (*fn)(void)) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    _exit(fn());
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void* take_large(size_t n) {
  void* p = malloc(n);
  if (p) memset(p, 7, n);
  return p;
}

/* Cases 2 and 3. */
static int child_grows(void) {
  if (thread_count() != 1) return 2;
  void* small[200];
  for (int i = 0; i < 200; i++)
    if (!(small[i] = malloc((size_t)(i % 50 + 1) * 16))) return 3;
  void* big[40];
  for (int i = 0; i < 4; i++) /* 1 MiB of 256 KiB spans */
    if (!(big[i] = take_large(256 << 10))) return 3;
  if (thread_count() != 1) return 4; /* a small child has no purger */
  for (int i = 4; i < 36; i++) /* 8 MiB more */
    if (!(big[i] = take_large(256 << 10))) return 3;
  if (thread_count() != 2) return 5; /* ... a growing one has */
  keel_stats_t s0 = keel_stats_now();
  for (int i = 0; i < 36; i++) free(big[i]);
  for (int i = 0; i < 200; i++) free(small[i]);
  for (int t = 0; t < 100; t++) { /* up to 5 s */
    usleep(50000);
    keel_stats_t s = keel_stats_now();
    if (s.purged_bytes >= s0.purged_bytes + ((size_t)4 << 20)) return 0;
  }
  return 6; /* freed memory stayed: the purger does not run */
}

static void* inherited[16];

/* Case 4: frees the parent's 8 MiB and takes as much again. */
static int child_recycles(void) {
  for (int i = 0; i < 16; i++) free(inherited[i]);
  for (int i = 0; i < 16; i++)
    if (!(inherited[i] = take_large(512 << 10))) return 3;
  (void)malloc(1 << 20); /* the check runs at the start of an allocation's slow path */
  return thread_count() == 2 ? 0 : 7;
}

static int child_at_once(void) { return thread_count() == 2 ? 0 : 8; }

int main(void) {
  assert_keel_in_use();
  watchdog(60);
  void* p = malloc(100); /* the purger starts from the constructor */
  free(p);
  CHECK_MSG(thread_count() == 2, "parent: %d threads, expected main + purger", thread_count());
  int rc = run_child(child_grows);
  CHECK_MSG(rc == 0, "growing child: status %d (4: purger too early, 5: not started, "
                     "6: freed memory not purged)", rc);
  for (int i = 0; i < 16; i++) CHECK((inherited[i] = take_large(512 << 10)) != NULL);
  rc = run_child(child_recycles);
  CHECK_MSG(rc == 0, "recycling child: status %d", rc);
  for (int i = 0; i < 16; i++) free(inherited[i]);
  CHECK(keel_option_set("child_purger", "0") == 0);
  rc = run_child(child_at_once);
  CHECK_MSG(rc == 0, "child with child_purger=0: status %d", rc);
  return test_finish();
}
