/* test_mesh_child_closes.c -- a forked child that closes descriptors it did not open
 * (a daemon closing everything from 3 up) and goes on running keeps its heap (docs/
 * meshing.md, "fork").
 *
 * Meshing gives back a file page once no view of the parent reads it and no child
 * forked since may map it. A child's pipe reading end-of-file once meant it was gone;
 * this child closes its end and lives on, and its untouched views of released pages read
 * zero (992 of its blocks changed). Now the pids the child and its own children wrote on
 * the pipe say who still maps the file.
 *
 * Needs KEEL_MESH=on, a write barrier (root, or access to /dev/userfaultfd) and 4 KiB
 * pages: skipped (77) without. */
#include "test.h"
#include "mesh_heap.h"

#include <sys/wait.h>

enum { SIZE = 1024, NBLK = 64 * 64 };

static void* blk[NBLK];
static unsigned char pat(size_t i) { return (unsigned char)(i * 7 + 1) | 1; }

int main(void) {
  assert_keel_in_use();
  keel_mesh_stats_t ms;
  keel_mesh_now();
  keel_mesh_stats(&ms);
  if (ms.state != KEEL_MESH_STATE_ON || sysconf(_SC_PAGESIZE) != 4096) {
    printf("SKIP: needs KEEL_MESH=on, a write barrier and 4 KiB pages\n");
    return 77;
  }
  for (int i = 0; i < NBLK; i++) blk[i] = malloc(SIZE);
  static uintptr_t scratch[NBLK];
  static size_t order[NBLK];
  mesh_slab_order(blk, NBLK, scratch, order);
  for (int i = 0; i < NBLK; i++) {
    size_t slot = (((uintptr_t)blk[i] & MESH_SLAB_MASK) / SIZE) % 4;
    if (slot == order[i] % 2) memset(blk[i], pat((size_t)i), SIZE);
    else { free(blk[i]); blk[i] = NULL; }
  }
  keel_purge();
  size_t pairs = keel_mesh_now();
  keel_mesh_stats(&ms);
  printf("meshed: %zu pages given back, %llu views\n", pairs, (unsigned long long)ms.views);
  if (!CHECK_MSG(pairs > 0, "nothing meshed: the test proves nothing")) return test_finish();
  fflush(stdout);

  int up[2], down[2];
  if (pipe(up) || pipe(down)) return 2;
  pid_t pid = fork();
  if (pid == 0) {
    /* A daemon-style child: closes every descriptor but the ones it uses. */
    for (int fd = 3; fd < 1024; fd++)
      if (fd != up[1] && fd != down[0]) close(fd);
    char c = 'r';
    if (write(up[1], &c, 1) != 1) _exit(3);
    if (read(down[0], &c, 1) != 1) _exit(3);
    int bad = 0;
    for (int i = 0; i < NBLK; i++) {
      if (!blk[i]) continue;
      const unsigned char* p = blk[i];
      for (int j = 0; j < SIZE; j++)
        if (p[j] != pat((size_t)i)) { bad++; break; }
    }
    char msg[96];
    int n = snprintf(msg, sizeof msg, "child: %d of its blocks changed under it\n", bad);
    if (write(1, msg, (size_t)n) < 0) {}
    _exit(bad ? 1 : 0);
  }
  close(up[1]);
  close(down[0]);
  char c;
  if (read(up[0], &c, 1) != 1) return 2;
  /* The parent writes its own blocks (its views erode), then the purger's pass runs. */
  for (int i = 0; i < NBLK; i++)
    if (blk[i]) memset(blk[i], 0x5A, SIZE);
  keel_mesh_now();
  keel_mesh_stats(&ms);
  printf("parent: file pages released %llu, file bytes %llu\n", (unsigned long long)ms.released,
         (unsigned long long)ms.file_bytes);
  fflush(stdout);
  if (write(down[1], "g", 1) != 1) return 2;
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's heap changed under it (status %#x)", st);
  return test_finish();
}
