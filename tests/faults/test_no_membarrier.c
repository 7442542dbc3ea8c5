/* test_no_membarrier.c -- a process where membarrier(2) is refused (a seccomp filter, as
 * in a container whose profile leaves it out, or an old kernel).
 *
 * Gathering and the purger's take-back stop other threads' caches with membarrier
 * (src/core/tcache.c). Where it is refused, the first attempt learns so, and from then on
 * no cache is pointed at the empty cache (which would send its owner's calls to the slow
 * path for nothing) and no gather is counted. Here a holder keeps 16 KiB blocks in its
 * bin and waits while this thread makes that class grow for 300 ms, the purger set to
 * take back caches idle for 10 ms: at most one gather is counted, no block is gathered
 * and no cache is taken back; every block stays intact.
 */
#include "faults.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#define THIS_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define THIS_ARCH AUDIT_ARCH_AARCH64
#endif

/* membarrier fails with ENOSYS in every thread; every other call is allowed. */
static int refuse_membarrier(void) {
#ifdef THIS_ARCH
  struct sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, THIS_ARCH, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_membarrier, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof code / sizeof code[0]), code};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  /* on every thread, Keel's purger included */
  return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
#else
  return -1;
#endif
}

enum { HELD = 4, KEPT = 256, BLOCK = 16 << 10 };
static void* held[HELD];
static pthread_barrier_t ready, done;

static void* holder(void* arg) {
  (void)arg;
  for (int i = 0; i < 200; i++) free(malloc(64)); /* past the young thread's calls: a cache */
  for (int i = 0; i < HELD; i++) {
    held[i] = malloc(BLOCK);
    pattern_fill(held[i], BLOCK, 7u + (uint64_t)i);
  }
  void* in_bin[HELD];
  for (int i = 0; i < HELD; i++) in_bin[i] = malloc(BLOCK);
  for (int i = 0; i < HELD; i++) free(in_bin[i]); /* these wait in its bin */
  pthread_barrier_wait(&ready);
  pthread_barrier_wait(&done);
  for (int i = 0; i < HELD; i++) {
    CHECK_MSG(pattern_check(held[i], BLOCK, 7u + (uint64_t)i) == SIZE_MAX, "held block %d changed", i);
    free(held[i]);
  }
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  watchdog(120);
  if (refuse_membarrier() != 0) {
    printf("no seccomp filter here (%s): skipped\n", strerror(errno));
    return 77;
  }
  CHECK(syscall(SYS_membarrier, 0 /* MEMBARRIER_CMD_QUERY */, 0, 0) == -1 && errno == ENOSYS);
  CHECK(keel_option_set("tcache_idle", "10") == 0);
  unsigned long long gathers = keel_stats_counter("gathers"), taken = keel_stats_counter("caches_taken_back");
  unsigned long long blocks = keel_stats_counter("blocks_gathered");
  pthread_barrier_init(&ready, NULL, 2);
  pthread_barrier_init(&done, NULL, 2);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, holder, NULL) == 0);
  pthread_barrier_wait(&ready);
  static void* kept[KEPT];
  struct timespec pause = {0, 1000 * 1000};
  double t0 = now_sec();
  for (int round = 0; now_sec() - t0 < 0.3; round++) { /* the class grows, again and again */
    for (int i = 0; i < KEPT; i++) kept[i] = malloc(BLOCK);
    for (int i = 0; i < KEPT; i++) free(kept[i]);
    keel_purge(); /* its slabs go, so that the next round grows again */
    nanosleep(&pause, NULL);
  }
  unsigned long long g = keel_stats_counter("gathers") - gathers;
  CHECK_MSG(g <= 1, "%llu gathers counted where membarrier is refused", g);
  CHECK(keel_stats_counter("blocks_gathered") == blocks);
  CHECK(keel_stats_counter("caches_taken_back") == taken);
  pthread_barrier_wait(&done);
  pthread_join(th, NULL);
  printf("membarrier refused: %llu gathers counted, none taken back\n", g);
  return test_finish();
}
