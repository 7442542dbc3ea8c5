/* measure -- run one program and report its wall time and resource usage.
 *
 * Usage: measure REPORT_FILE PRELOAD PROGRAM [ARGS...]
 *   PRELOAD is the library to put in LD_PRELOAD for PROGRAM, or "-" for none (any
 *   inherited LD_PRELOAD is removed). The program's stdin/stdout/stderr are inherited.
 *   When it has ended, one line is written to REPORT_FILE:
 *     status=<raw wait status> wall_ns=<fork to reap> maxrss_kib=<ru_maxrss>
 *     peak_kib=<largest exact RSS seen> samples=<RSS readings> at_exit=<1 if one was
 *     taken as it exited> utime_us=... stime_us=... minflt=... majflt=... nvcsw=...
 *     nivcsw=...
 *   Exit status: 0 if the report was written (whatever the program did), 3 otherwise.
 *
 * Why this exists (run.py uses it): Linux carries the peak RSS of a process across
 * execve() -- ru_maxrss of a child forked from the Python runner is at least the RSS
 * of the Python interpreter (10-20 MiB), which would swamp the peak RSS of the
 * small benchmarks. This launcher is small, so forking the program from here gives a
 * peak RSS that is the program's own (to within the ~1 MiB of this launcher).
 *
 * Why it reads the RSS itself: ru_maxrss is not exact. Since Linux 6.2 a process's RSS
 * counters are per-CPU counters; reads of /proc sum them, but the high-water mark
 * behind ru_maxrss comes from the unsummed global value, which is off by up to a batch
 * of pages per CPU and counter. Measured here (6.18, 2 CPUs): a child that touched
 * 200 KiB reported a ru_maxrss 168 KiB below the VmRSS it had read itself, and lower
 * than a child that touched nothing; falseshare's ru_maxrss under glibc spread over
 * 1,252-1,604 KiB in five runs. On programs of 1-5 MiB that is the size of the
 * differences being measured. So the launcher reads the program's exact RSS
 * (/proc/PID/statm) every millisecond while it runs, and once more when it exits: it
 * traces the program (PTRACE_SEIZE with PTRACE_O_TRACEEXIT, no other stops) so that the
 * exit stops it before its memory is torn down - the end of a run touches library code
 * (exit handlers, stdio) that a sampler would miss. peak_kib is the largest reading:
 * exact each time, blind only to a peak shorter than a millisecond between them. If
 * the program cannot be traced or sampled, peak_kib is ru_maxrss and samples=0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { SAMPLE_INTERVAL_NS = 1000000 };

static long long tv_us(struct timeval tv) { return (long long)tv.tv_sec * 1000000 + tv.tv_usec; }

typedef struct {
  int statm; /* /proc/PID/statm, or -1 */
  long peak_pages, samples;
} rss_reader;

/* One exact reading of the program's resident pages. */
static void rss_sample(rss_reader* r) {
  char buf[128];
  ssize_t n = r->statm >= 0 ? pread(r->statm, buf, sizeof buf - 1, 0) : -1;
  if (n <= 0) return;
  buf[n] = 0;
  long size, resident;
  if (sscanf(buf, "%ld %ld", &size, &resident) != 2) return;
  r->samples++;
  if (resident > r->peak_pages) r->peak_pages = resident;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s REPORT_FILE PRELOAD|- PROGRAM [ARGS...]\n", argv[0]);
    return 3;
  }
  const char* report = argv[1];
  const char* preload = argv[2];
  pid_t parent = getpid();
  /* SIGCHLD blocked, so that the wait below wakes on it; the child restores the mask. */
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old);
  int go[2]; /* the child execs once the launcher has seized it */
  if (pipe2(go, O_CLOEXEC) != 0) {
    fprintf(stderr, "measure: pipe: %s\n", strerror(errno));
    return 3;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "measure: fork: %s\n", strerror(errno));
    return 3;
  }
  if (pid == 0) {
    /* die with the launcher (run.py kills the launcher on timeout) */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(go[1]);
    char c;
    while (read(go[0], &c, 1) < 0 && errno == EINTR) {
    }
    if (strcmp(preload, "-") == 0)
      unsetenv("LD_PRELOAD");
    else
      setenv("LD_PRELOAD", preload, 1);
    execv(argv[3], argv + 3);
    fprintf(stderr, "measure: cannot execute %s: %s\n", argv[3], strerror(errno));
    _exit(127);
  }
  close(go[0]);
  /* If tracing is refused (a seccomp or Yama policy), the samples alone remain. */
  ptrace(PTRACE_SEIZE, pid, 0, (void*)(long)PTRACE_O_TRACEEXIT);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
  rss_reader rss = {.statm = open(path, O_RDONLY | O_CLOEXEC)};
  close(go[1]); /* the child goes on */

  int status, at_exit = 0;
  struct rusage ru;
  for (;;) {
    pid_t r = wait4(pid, &status, WNOHANG | __WALL, &ru);
    if (r < 0 && errno != EINTR) {
      fprintf(stderr, "measure: wait4: %s\n", strerror(errno));
      return 3;
    }
    if (r == pid && WIFSTOPPED(status)) {
      int event = status >> 16;
      if (event == PTRACE_EVENT_EXIT) { /* exiting, its memory still whole */
        rss_sample(&rss);
        at_exit = 1;
        ptrace(PTRACE_DETACH, pid, 0, 0);
      } else {
        /* a signal for the program (passed on) or a group stop (resumed) */
        ptrace(PTRACE_CONT, pid, 0, (void*)(long)(event == 0 ? WSTOPSIG(status) : 0));
      }
      continue;
    }
    if (r == pid) break; /* exited */
    rss_sample(&rss);
    struct timespec interval = {0, SAMPLE_INTERVAL_NS};
    sigtimedwait(&chld, NULL, &interval);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rss.statm >= 0) close(rss.statm);
  long peak_kib = rss.samples ? rss.peak_pages * (sysconf(_SC_PAGESIZE) / 1024) : ru.ru_maxrss;
  long long wall_ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
  FILE* f = fopen(report, "w");
  if (!f) {
    fprintf(stderr, "measure: cannot write %s: %s\n", report, strerror(errno));
    return 3;
  }
  fprintf(f,
          "status=%d wall_ns=%lld maxrss_kib=%ld peak_kib=%ld samples=%ld at_exit=%d utime_us=%lld "
          "stime_us=%lld minflt=%ld majflt=%ld nvcsw=%ld nivcsw=%ld\n",
          status, wall_ns, ru.ru_maxrss, peak_kib, rss.samples, at_exit, tv_us(ru.ru_utime),
          tv_us(ru.ru_stime), ru.ru_minflt, ru.ru_majflt, ru.ru_nvcsw, ru.ru_nivcsw);
  if (fclose(f) != 0) return 3;
  return 0;
}
