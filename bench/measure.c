/* measure -- run one program and report its wall time and resource usage.
 *
 * Usage: measure REPORT_FILE PRELOAD PROGRAM [ARGS...]
 *   PRELOAD is the library to put in LD_PRELOAD for PROGRAM, or "-" for none (any
 *   inherited LD_PRELOAD is removed). The program's stdin/stdout/stderr are inherited.
 *   When it has ended, one line is written to REPORT_FILE:
 *     status=<raw wait status> wall_ns=<fork to reap> maxrss_kib=<ru_maxrss>
 *     utime_us=... stime_us=... minflt=... majflt=... nvcsw=... nivcsw=...
 *   Exit status: 0 if the report was written (whatever the program did), 3 otherwise.
 *
 * Why this exists (run.py uses it): Linux carries the peak RSS of a process across
 * execve() -- ru_maxrss of a child forked from the Python runner is at least the RSS
 * of the Python interpreter (10-20 MiB), which would swamp the peak RSS of the
 * small benchmarks. This launcher is small, so forking the program from here gives a
 * peak RSS that is the program's own (to within the ~1 MiB of this launcher).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long tv_us(struct timeval tv) { return (long long)tv.tv_sec * 1000000 + tv.tv_usec; }

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s REPORT_FILE PRELOAD|- PROGRAM [ARGS...]\n", argv[0]);
    return 3;
  }
  const char* report = argv[1];
  const char* preload = argv[2];
  pid_t parent = getpid();
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
    if (strcmp(preload, "-") == 0)
      unsetenv("LD_PRELOAD");
    else
      setenv("LD_PRELOAD", preload, 1);
    execv(argv[3], argv + 3);
    fprintf(stderr, "measure: cannot execute %s: %s\n", argv[3], strerror(errno));
    _exit(127);
  }
  int status;
  struct rusage ru;
  while (wait4(pid, &status, 0, &ru) < 0) {
    if (errno != EINTR) {
      fprintf(stderr, "measure: wait4: %s\n", strerror(errno));
      return 3;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long long wall_ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
  FILE* f = fopen(report, "w");
  if (!f) {
    fprintf(stderr, "measure: cannot write %s: %s\n", report, strerror(errno));
    return 3;
  }
  fprintf(f,
          "status=%d wall_ns=%lld maxrss_kib=%ld utime_us=%lld stime_us=%lld minflt=%ld majflt=%ld nvcsw=%ld "
          "nivcsw=%ld\n",
          status, wall_ns, ru.ru_maxrss, tv_us(ru.ru_utime), tv_us(ru.ru_stime), ru.ru_minflt, ru.ru_majflt,
          ru.ru_nvcsw, ru.ru_nivcsw);
  if (fclose(f) != 0) return 3;
  return 0;
}
