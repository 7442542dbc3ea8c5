/* test_mesh_primitives.c -- the kernel behaviour meshing will stand on (docs/meshing.md,
 * plan step 3), through the platform layer's own functions (linked with keel_static,
 * whose hidden symbols a test can reach):
 *
 *   1. two private views of one file page read it; a write gives that view its own copy
 *      and the other view and the file keep the old bytes; the page states say so;
 *   2. a view replaced by fresh memory reads zeros;
 *   3. releasing a file range frees its memory (the file's resident bytes drop);
 *   4. fork: parent and child write into the same view and neither sees the other's
 *      write - and an untouched view in the child sees a later write to the file by the
 *      parent (why meshing must never change a file page a child may map: generations);
 *   5. the write barrier, if this process may have one: a thread writing into an armed
 *      page waits; the page is copied into the file, replaced by a view and woken; the
 *      write lands on the view and nothing else changed;
 *   6. a kernel-mode write (read(2) from a pipe into an armed page) waits and succeeds
 *      with KEEL_BARRIER_KERNEL, and fails with EFAULT with KEEL_BARRIER_USER.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "platform/prim.h"
#include "test.h"

static size_t pg;

static char* anon(size_t pages) {
  char* p = mmap(NULL, pages * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED);
  return p == MAP_FAILED ? NULL : p;
}

static uint8_t state_of(const void* p) {
  uint8_t s = 0xFF;
  CHECK(_keel_prim_view_state(p, 1, &s));
  return s;
}

static void test_views(int fd) {
  TEST_SECTION("two views of one file page; a write makes a private copy");
  char* img = anon(1);
  memset(img, 'A', pg);
  CHECK(_keel_prim_file_write(fd, 0, img, pg));
  char* a = anon(1);
  char* b = anon(1);
  memset(a, 1, pg); /* anonymous pages that the views replace */
  memset(b, 2, pg);
  CHECK(state_of(a) == KEEL_VIEW_PRIVATE);
  CHECK(_keel_prim_map_view(a, pg, fd, 0) && _keel_prim_map_view(b, pg, fd, 0));
  CHECK(a[0] == 'A' && a[pg - 1] == 'A' && b[0] == 'A' && b[pg / 2] == 'A');
  CHECK(state_of(a) == KEEL_VIEW_SHARED && state_of(b) == KEEL_VIEW_SHARED);
  a[100] = 'x';
  CHECK(a[100] == 'x' && b[100] == 'A');
  CHECK(state_of(a) == KEEL_VIEW_PRIVATE && state_of(b) == KEEL_VIEW_SHARED);
  char back = 0;
  CHECK(pread(fd, &back, 1, 100) == 1 && back == 'A');

  TEST_SECTION("a view replaced by fresh memory reads zeros");
  CHECK(_keel_prim_map_fresh(b, pg));
  size_t nz = first_nonzero(b, pg);
  CHECK_MSG(nz == SIZE_MAX, "byte %zu of a fresh page is %d", nz, b[nz]);
  munmap(a, pg);
  munmap(b, pg);
  munmap(img, pg);
}

static void test_release(int fd) {
  TEST_SECTION("releasing a file range frees its memory");
  char* img = anon(64);
  memset(img, 'R', 64 * pg);
  CHECK(_keel_prim_file_write(fd, 64 * pg, img, 64 * pg));
  uint64_t before = _keel_prim_file_resident(fd);
  CHECK(before >= 64 * pg);
  CHECK(_keel_prim_file_release(fd, 64 * pg, 64 * pg));
  uint64_t after = _keel_prim_file_resident(fd);
  CHECK_MSG(before - after >= 64 * pg, "resident %" PRIu64 " -> %" PRIu64, before, after);
  char c = 1;
  CHECK(pread(fd, &c, 1, (off_t)(64 * pg + 5)) == 1 && c == 0);
  munmap(img, 64 * pg);
}

static void test_fork(int fd) {
  TEST_SECTION("fork: views keep parent and child apart; an untouched view sees the file");
  char* img = anon(1);
  memset(img, 'F', pg);
  CHECK(_keel_prim_file_write(fd, 2 * pg, img, pg));
  char* v = anon(2); /* page 0: written by both; page 1: untouched in the child */
  CHECK(_keel_prim_map_view(v, pg, fd, 2 * pg) && _keel_prim_map_view(v + pg, pg, fd, 2 * pg));
  int to_child[2], to_parent[2];
  CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    char go;
    v[0] = 'c';                                    /* child's own copy */
    if (write(to_parent[1], "1", 1) != 1) _exit(10);
    if (read(to_child[0], &go, 1) != 1) _exit(11); /* parent wrote v[0] and the file */
    int bad = 0;
    if (v[0] != 'c') bad |= 1;        /* the parent's write must not show here */
    if (v[pg + 7] != 'G') bad |= 2;   /* untouched private view: sees the file's new bytes */
    _exit(bad ? 20 + bad : 0);
  }
  char go;
  CHECK(read(to_parent[0], &go, 1) == 1);
  CHECK_MSG(v[0] == 'F', "the child's write showed in the parent: %c", v[0]);
  v[0] = 'p';
  char g = 'G';
  CHECK(_keel_prim_file_write(fd, 2 * pg + 7, &g, 1));
  CHECK(write(to_child[1], "1", 1) == 1);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  CHECK(v[0] == 'p');
  munmap(v, 2 * pg);
  munmap(img, pg);
  close(to_child[0]), close(to_child[1]), close(to_parent[0]), close(to_parent[1]);
}

typedef struct writer_s {
  char* at;
  atomic_int started, done;
  int pipe_fd; /* >= 0: read(2) one byte into `at` instead of storing */
  ssize_t got;
  int err;
} writer_t;

static void* writer(void* arg) {
  writer_t* w = arg;
  atomic_store(&w->started, 1);
  if (w->pipe_fd >= 0) {
    w->got = read(w->pipe_fd, w->at, 1);
    w->err = w->got < 0 ? errno : 0;
  } else {
    *(volatile char*)w->at = 'W';
  }
  atomic_store(&w->done, 1);
  return NULL;
}

static void wait_started(writer_t* w) {
  while (!atomic_load(&w->started)) usleep(1000);
  usleep(50 * 1000); /* long enough to reach the armed page */
}

/* Arms page p, lets a writer run into it, copies the page into the file at `off`,
 * replaces it with a view and wakes the writer. Returns the writer's state. */
static void barrier_round(int barrier, int fd, uint64_t off, char* p, writer_t* w) {
  CHECK(_keel_prim_barrier_arm(barrier, p, pg));
  pthread_t th;
  CHECK(pthread_create(&th, NULL, writer, w) == 0);
  wait_started(w);
  bool waited = !atomic_load(&w->done);
  CHECK(_keel_prim_file_write(fd, off, p, pg)); /* the copy: reads go on under the barrier */
  CHECK(_keel_prim_map_view(p, pg, fd, off));
  CHECK(_keel_prim_barrier_wake(barrier, p, pg));
  pthread_join(th, NULL);
  if (w->pipe_fd < 0 || w->err == 0) CHECK_MSG(waited, "the write did not wait for the barrier");
}

static void test_barrier(int fd) {
  int mode = -1;
  int barrier = _keel_prim_barrier_open(&mode);
  printf("   barrier mode: %s\n", mode == KEEL_BARRIER_KERNEL ? "kernel (full userfaultfd)"
                                : mode == KEEL_BARRIER_USER  ? "user (UFFD_USER_MODE_ONLY)"
                                                             : "none");
  if (barrier < 0) {
    CHECK(mode == KEEL_BARRIER_NONE);
    printf("   no userfaultfd write protection here: barrier checks skipped\n");
    return;
  }

  TEST_SECTION("barrier: a writer waits, then writes into the view");
  char* p = anon(1);
  memset(p, 'B', pg);
  writer_t w = {.at = p + 10, .pipe_fd = -1};
  barrier_round(barrier, fd, 3 * pg, p, &w);
  CHECK(p[10] == 'W' && p[9] == 'B' && p[11] == 'B' && p[pg - 1] == 'B');
  CHECK(state_of(p) == KEEL_VIEW_PRIVATE); /* the write copied the view */
  char back = 0;
  CHECK(pread(fd, &back, 1, (off_t)(3 * pg + 10)) == 1 && back == 'B');
  munmap(p, pg);

  TEST_SECTION("barrier: read(2) into an armed page (a kernel-mode write)");
  int pfd[2];
  CHECK(pipe(pfd) == 0);
  CHECK(write(pfd[1], "K", 1) == 1);
  p = anon(1);
  memset(p, 'B', pg);
  writer_t r = {.at = p + 20, .pipe_fd = pfd[0]};
  barrier_round(barrier, fd, 4 * pg, p, &r);
  if (mode == KEEL_BARRIER_KERNEL) {
    CHECK_MSG(r.got == 1 && p[20] == 'K', "read returned %zd errno %d", r.got, r.err);
  } else {
    CHECK_MSG(r.got == -1 && r.err == EFAULT, "user-mode barrier: read returned %zd errno %d", r.got, r.err);
  }
  munmap(p, pg);
  close(pfd[0]), close(pfd[1]);

  TEST_SECTION("barrier: disarming an armed page lets the writer through");
  p = anon(1);
  memset(p, 'D', pg);
  CHECK(_keel_prim_barrier_arm(barrier, p, pg));
  writer_t d = {.at = p, .pipe_fd = -1};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, writer, &d) == 0);
  wait_started(&d);
  CHECK(!atomic_load(&d.done));
  CHECK(_keel_prim_barrier_disarm(barrier, p, pg));
  pthread_join(th, NULL);
  CHECK(p[0] == 'W' && state_of(p) == KEEL_VIEW_PRIVATE);
  p[1] = 'x'; /* unregistered: plain memory again */
  munmap(p, pg);
  close(barrier);
}

int main(void) {
  pg = (size_t)sysconf(_SC_PAGESIZE);
  int fd = _keel_prim_file_create((uint64_t)1 << 30);
  if (!CHECK(fd >= 0)) return test_finish();
  test_views(fd);
  test_release(fd);
  test_fork(fd);
  test_barrier(fd);
  close(fd);
  return test_finish();
}
