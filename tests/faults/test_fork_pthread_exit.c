/* test_fork_pthread_exit.c -- regression test for a difference from glibc found by
 * CPython's test suite (test_threading.ThreadTests.
 * test_main_thread_after_fork_from_nonmain_thread hangs for 10 minutes under Keel):
 *
 * A process forks from a thread; in the child that thread is the only one, and it ends
 * with pthread_exit() instead of exit() (CPython does this: the child returns from the
 * thread's function). POSIX: when the last thread of a process terminates, the process
 * exits with status 0. Keel's fork handler starts its background purger thread in every
 * child (init.c: fork_child -> background_start), so the child is never left without
 * threads: its main thread becomes a zombie, the purger sleeps on forever, and the
 * parent's waitpid() never returns.
 *
 * The same holds without fork: a program whose main() ends with pthread_exit() never
 * exits under Keel (its purger, started by the constructor, outlives it), and SIGTERM
 * does not end it either: the purger blocks every signal, so a signal sent to the
 * process stays pending forever (only SIGKILL works).
 *
 * Two cases: (1) fork from a non-main thread, the child's thread ends with pthread_exit;
 * (2) fork from main, the child's main thread calls pthread_exit; if it is still alive
 * after 3 s it gets SIGTERM, which must end it. Each child is SIGKILLed after 10 s.
 * Linked with libkeel.so. Also builds against glibc (where it passes):
 *   gcc -O1 -D_GNU_SOURCE -pthread -Itests/harness -Itests/faults \
 *       tests/faults/test_fork_pthread_exit.c -o /tmp/t && /tmp/t
 */
#include "faults.h"

#include <pthread.h>
#include <sys/wait.h>

static int child_status = -1;
static double child_secs;
static int term_sent;

static void* forker(void* arg) {
  int send_term = arg != NULL;
  double t0 = now_sec();
  term_sent = 0;
  pid_t pid = fork();
  if (pid == 0) {
    void* p = malloc(100); /* the child allocates, then its only thread ends */
    free(p);
    pthread_exit(NULL); /* last thread: the process must exit with status 0 */
  }
  if (pid < 0) return NULL;
  /* Wait up to 10 s, then kill it. */
  int st = 0;
  for (int i = 0; i < 1000; i++) {
    if (send_term && i == 300) {
      kill(pid, SIGTERM);
      term_sent = 1;
    }
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      child_status = st;
      child_secs = now_sec() - t0;
      return NULL;
    }
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  child_status = st;
  child_secs = now_sec() - t0;
  return NULL;
}

static int check_case(const char* what, int term_ok) {
  int exited = child_status >= 0 && WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0;
  int termed = child_status >= 0 && WIFSIGNALED(child_status) && WTERMSIG(child_status) == SIGTERM;
  int ok = exited || (term_ok && termed);
  printf("%s: %s after %.1f s%s\n", what,
         exited ? "exited 0" : termed ? "ended by SIGTERM" : "never exited (SIGKILLed)", child_secs,
         term_sent ? " (SIGTERM sent after 3 s)" : "");
  return CHECK_MSG(ok, "%s: the child did not exit (status 0x%x): a thread Keel started in it "
                   "keeps it alive%s", what, child_status, term_sent ? ", and it ignores SIGTERM" : "");
}

int main(void) {
  assert_keel_in_use();
  watchdog(60);
  /* (1) from a non-main thread */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, forker, NULL) == 0);
  pthread_join(t, NULL);
  check_case("fork from a thread, child's thread ends with pthread_exit", 0);
  /* (2) from main; SIGTERM after 3 s must end it at the latest */
  forker((void*)1);
  check_case("fork from main, child's main() ends with pthread_exit", 1);
  return test_finish();
}
