/* child_report.h -- runs a function in a forked child whose stderr is captured: for tests
 * that expect the allocator to stop the process with a one-line report. */
#ifndef KEEL_TEST_CHILD_REPORT_H
#define KEEL_TEST_CHILD_REPORT_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn(arg) in a child with SIGABRT at its default action (so that a harness's own
 * crash handler does not take over) and stderr into `report` (NUL-terminated, at most
 * cap - 1 bytes). Returns the child's wait status, -1 if it could not be run. */
static inline int child_report(void (*fn)(void*), void* arg, char* report, size_t cap) {
  int fds[2];
  report[0] = 0;
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGABRT, SIG_DFL);
    dup2(fds[1], 2);
    fn(arg);
    _exit(0);
  }
  close(fds[1]);
  size_t len = 0;
  while (pid > 0 && len < cap - 1) {
    ssize_t r = read(fds[0], report + len, cap - 1 - len);
    if (r <= 0) break;
    len += (size_t)r;
  }
  report[len] = 0;
  close(fds[0]);
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid ? status : -1;
}

#endif /* KEEL_TEST_CHILD_REPORT_H */
