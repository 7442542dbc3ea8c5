/* test_mesh_descriptors.c -- meshing's descriptors and a program that handles its own
 * (docs/meshing.md, "fork").
 *
 *   - A program that closes descriptors it did not open, and gets the numbers back for
 *     files of its own, keeps them in a forked child: the child's fork handler closes
 *     only descriptors that are still meshing's (it closed the program's files once).
 *   - Under a file-size limit smaller than the memory file (ulimit -f), meshing is
 *     refused instead of the program being killed by SIGXFSZ (run in a fresh process:
 *     this program again, with the argument "fsize").
 *
 * Needs KEEL_MESH=on and a write barrier (root, or access to /dev/userfaultfd): skipped
 * (77) without. */
#include "test.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/wait.h>

static bool meshing_on(void) {
  keel_mesh_stats_t ms;
  keel_mesh_now(); /* the first pass opens the memory file and the barrier */
  keel_mesh_stats(&ms);
  return ms.state == KEEL_MESH_STATE_ON;
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "fsize") == 0) {
    struct rlimit small = {100u << 20, 100u << 20};
    if (setrlimit(RLIMIT_FSIZE, &small) != 0) return 3;
    keel_mesh_now();
    return 0;
  }
  assert_keel_in_use();
  if (!meshing_on()) {
    printf("SKIP: meshing is not on (needs KEEL_MESH=on and a write barrier)\n");
    return 77;
  }
  TEST_SECTION("a child keeps the program's descriptors that reuse meshing's numbers");
  for (int fd = 3; fd < 64; fd++) close(fd); /* a program closing what it did not open */
  int mine[4];
  for (int i = 0; i < 4; i++) mine[i] = open("/dev/null", O_WRONLY);
  pid_t pid = fork();
  if (pid == 0) {
    int lost = 0;
    for (int i = 0; i < 4; i++) lost += fcntl(mine[i], F_GETFD) < 0;
    _exit(lost);
  }
  int st = 0;
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
  CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child lost %d of the program's descriptors",
            WIFEXITED(st) ? WEXITSTATUS(st) : -1);

  TEST_SECTION("a file-size limit refuses meshing, it does not kill the program");
  pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", argv[0], "fsize", (char*)NULL);
    _exit(4);
  }
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
  CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "under ulimit -f: status %#x%s", st,
            WIFSIGNALED(st) && WTERMSIG(st) == SIGXFSZ ? " (SIGXFSZ)" : "");
  return test_finish();
}
