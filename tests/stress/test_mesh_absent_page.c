/* test_mesh_absent_page.c -- the write barrier holds a writer on a page that has no page
 * in memory (docs/meshing.md, "write barrier").
 *
 * userfaultfd's write protection covers only pages present in the mapping: one that a
 * slab trim gave back, and no write touched since, let a write through while the mesher
 * copied the page, and the view that replaced it lost that write. The heap: 1280-byte
 * blocks, 51 to a 64 KiB slab, so OS page 1 of a slab holds block 3's tail, blocks 4-5 and
 * block 6's head. Even slabs keep block 3, odd slabs block 4, so page 1 of an even slab
 * pairs with page 1 of an odd one. Page 1 of each even slab is then given back
 * (MADV_DONTNEED, as a trim leaves it), and a thread writes block 3's tail - its own block
 * - at the moment the mesher writes the page image to the memory file (pwrite is
 * interposed to give it that moment). The writer must wait, and its bytes must be on
 * the view afterwards.
 *
 * Needs KEEL_MESH=on, a write barrier (root, or access to /dev/userfaultfd) and 4 KiB
 * pages: skipped (77) without. */
#include "test.h"
#include "mesh_heap.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>

enum { SIZE = 1280, NBLK = 3600, MAX_EVEN = 64 };

static void* blk[NBLK];
static uintptr_t even_tail[MAX_EVEN]; /* block 3's part on page 1, in each even slab */
static int neven;
static atomic_int trigger, go, done, held;

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off);
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  if (atomic_exchange(&trigger, 0)) { /* the mesher's first image write */
    atomic_store(&go, 1);
    for (int i = 0; i < 300 && !atomic_load(&done); i++) usleep(1000);
    atomic_store(&held, !atomic_load(&done));
  }
  return syscall(SYS_pwrite64, fd, buf, n, off);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off);
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }

static void* writer(void* arg) {
  (void)arg;
  while (!atomic_load(&go)) usleep(100);
  for (int i = 0; i < neven; i++) memset((void*)even_tail[i], 0xAB, 1024);
  atomic_store(&done, 1);
  return NULL;
}

int main(void) {
  assert_keel_in_use();
  if (sysconf(_SC_PAGESIZE) != 4096) {
    printf("SKIP: laid out for 4 KiB pages\n");
    return 77;
  }
  keel_mesh_stats_t ms;
  keel_mesh_now();
  keel_mesh_stats(&ms);
  if (ms.state != KEEL_MESH_STATE_ON) {
    printf("SKIP: meshing is not on (state %u; needs KEEL_MESH=on and a write barrier)\n", ms.state);
    return 77;
  }
  for (int i = 0; i < NBLK; i++) {
    blk[i] = malloc(SIZE);
    if (!CHECK_MSG(blk[i] != NULL && malloc_usable_size(blk[i]) == SIZE, "a 1280-byte block")) return test_finish();
  }
  static uintptr_t scratch[NBLK];
  static size_t order[NBLK];
  size_t ns = mesh_slab_order(blk, NBLK, scratch, order);
  for (int i = 0; i < NBLK; i++) {
    size_t ord = order[i];
    size_t idx = ((uintptr_t)blk[i] & MESH_SLAB_MASK) / SIZE;
    if (idx == (ord % 2 ? 4u : 3u)) {
      memset(blk[i], 0x11, SIZE);
      if (ord % 2 == 0 && neven < MAX_EVEN) even_tail[neven++] = (uintptr_t)blk[i] + (4096 - 3 * SIZE);
    } else {
      free(blk[i]);
      blk[i] = NULL;
    }
  }
  keel_purge(); /* the caches' blocks back to their slabs */
  for (int i = 0; i < neven; i++) madvise((void*)(even_tail[i] & ~(uintptr_t)4095), 4096, MADV_DONTNEED);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, writer, NULL) == 0);
  atomic_store(&trigger, 1);
  size_t pages = keel_mesh_now();
  atomic_store(&go, 1); /* (if nothing was meshed) */
  pthread_join(t, NULL);
  int lost = 0;
  for (int i = 0; i < neven; i++) {
    const unsigned char* p = (const unsigned char*)even_tail[i];
    for (int j = 0; j < 1024; j++)
      if (p[j] != 0xAB) {
        lost++;
        break;
      }
  }
  printf("%zu slabs, %d pages emptied and written; %zu pages given back by meshing; writer %s\n", ns, neven,
         pages, atomic_load(&held) ? "held" : "not held");
  CHECK_MSG(pages > 0, "nothing meshed: the test proved nothing");
  CHECK_MSG(atomic_load(&held), "a write to a page not in memory was not held by the barrier");
  CHECK_MSG(lost == 0, "%d blocks lost their own write", lost);
  return test_finish();
}
