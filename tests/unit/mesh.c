/* mesh.c -- meshing on a heap whose pages pair exactly (docs/meshing.md, step 5).
 *
 * 1024-byte blocks fill 64 slabs; then all but one block per OS page is freed, the
 * survivor in slot 0 on the pages of even slabs and slot 1 on odd ones, so every page
 * of an even slab meshes with the same page of an odd one. Each survivor holds a
 * pattern of its own. The test then checks, against the patterns:
 *   - keel_mesh_now() meshes, and PSS falls by about a page per pair;
 *   - every block reads what was written, before and after writes through either view
 *     (a write through one view is never seen through the other: copy-on-write);
 *   - writes are found by the sweep (eroded) and a file page nobody reads is released;
 *   - new blocks allocated onto meshed pages work;
 *   - 512-byte blocks kept in four slots mesh in groups of four (three pages in four
 *     given back);
 *   - a forked child sees the parent's heap as it was at fork; while it lives no file
 *     page it may map is released (pages of groups made after the fork are), after it
 *     exits they are; written pages mesh anew;
 *   - freeing everything turns the views back into fresh memory (left), the slabs go
 *     back to the page heap, and large calloc() blocks carved from that memory read
 *     zero; the heap passes _keel_verify.
 * Needs a write barrier (root, or access to /dev/userfaultfd): skipped (77) without. */
#include <pthread.h>
#include <sys/wait.h>

#include "core/internal.h"
#include "test.h"

enum { SLABS = 64, PER_SLAB = 64, SIZE = 1024 };

static size_t page_size;

static uint64_t pattern(const void* p, unsigned gen, size_t word) {
  return ((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)gen << 56) ^ (word * 0x100000001b3ull);
}

static void write_block(void* p, unsigned gen) {
  uint64_t* w = (uint64_t*)p;
  for (size_t i = 0; i < SIZE / 8; i++) w[i] = pattern(p, gen, i);
}

static bool block_is(const void* p, unsigned gen) {
  const uint64_t* w = (const uint64_t*)p;
  for (size_t i = 0; i < SIZE / 8; i++)
    if (w[i] != pattern(p, gen, i)) return false;
  return true;
}

static long pss_kib(void) {
  FILE* f = fopen("/proc/self/smaps_rollup", "r");
  if (f == NULL) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Pss: %ld kB", &kib) == 1) break;
  fclose(f);
  return kib;
}

static int cmp_uptr(const void* a, const void* b) {
  uintptr_t x = *(const uintptr_t*)a, y = *(const uintptr_t*)b;
  return x < y ? -1 : x > y;
}

static void* blocks[SLABS * PER_SLAB];
static unsigned gen_of[SLABS * PER_SLAB];
static unsigned char odd_slab[SLABS * PER_SLAB]; /* the block's slab is an odd one */

static size_t check_all(void) {
  size_t bad = 0;
  for (size_t i = 0; i < SLABS * PER_SLAB; i++)
    if (blocks[i] && !block_is(blocks[i], gen_of[i])) bad++;
  return bad;
}

int main(void) {
  page_size = (size_t)sysconf(_SC_PAGESIZE);
  keel_mesh_stats_t ms;
  keel_mesh_now();
  keel_mesh_stats(&ms);
  if (page_size > 16384 || ms.state != KEEL_MESH_STATE_ON) {
    printf("SKIP: meshing is not available here (state %u, barrier %u, page %zu)\n", ms.state,
           ms.barrier, page_size);
    return 77;
  }
  CHECK(ms.barrier == 2); /* KEEL_MESH=on runs only with the kernel-mode barrier */

  TEST_SECTION("a sparse heap: one block per page, alternating slots");
  static uintptr_t bases[SLABS * PER_SLAB];
  for (size_t i = 0; i < SLABS * PER_SLAB; i++) {
    blocks[i] = malloc(SIZE);
    bases[i] = (uintptr_t)blocks[i] & ~(uintptr_t)0xFFFF;
  }
  qsort(bases, SLABS * PER_SLAB, sizeof bases[0], cmp_uptr);
  size_t nslabs = 0;
  for (size_t i = 0; i < SLABS * PER_SLAB; i++)
    if (nslabs == 0 || bases[nslabs - 1] != bases[i]) bases[nslabs++] = bases[i];
  CHECK(nslabs >= SLABS);
  size_t per_page = page_size / SIZE, kept = 0;
  for (size_t i = 0; i < SLABS * PER_SLAB; i++) {
    uintptr_t base = (uintptr_t)blocks[i] & ~(uintptr_t)0xFFFF;
    size_t ord = (size_t)((uintptr_t*)bsearch(&base, bases, nslabs, sizeof base, cmp_uptr) - bases);
    size_t index = ((uintptr_t)blocks[i] & 0xFFFF) / SIZE;
    if (index % per_page != ord % 2) {
      free(blocks[i]);
      blocks[i] = NULL;
    } else {
      odd_slab[i] = ord % 2;
      gen_of[i] = 1;
      write_block(blocks[i], 1);
      kept++;
    }
  }
  keel_purge(); /* caches back to the slabs: what is free is free in the bitmaps */

  TEST_SECTION("mesh: pairs made, PSS falls, every block intact");
  long pss0 = pss_kib();
  size_t pairs = keel_mesh_now();
  long pss1 = pss_kib();
  keel_mesh_stats(&ms);
  size_t pages = nslabs * (65536 / page_size);
  printf("  %zu pages given back (pairs) of %zu; PSS %ld -> %ld KiB; longest operation %.0f us\n", pairs, pages, pss0,
         pss1, ms.longest_ns / 1e3);
  CHECK_MSG(pairs * 2 >= pages * 3 / 4, "only %zu pairs", pairs);
  CHECK(ms.meshed == pairs && ms.views == 2 * pairs && ms.groups == pairs && ms.failed == 0);
  CHECK(ms.file_bytes >= pairs * page_size * 3 / 4);
  CHECK_MSG(check_all() == 0, "%zu blocks changed", check_all());
  CHECK(keel_mesh_now() == 0); /* nothing left to pair */
  _keel_verify(); /* views, groups and slabs agree */

  long pss_read = pss_kib(); /* now that every view was read (mapped) */
  printf("  PSS with every view read: %ld KiB\n", pss_read);
  CHECK_MSG(pss0 - pss_read >= (long)(pairs * page_size / 1024) * 3 / 4, "PSS fell %ld KiB", pss0 - pss_read);

  TEST_SECTION("writes through views: copy-on-write, found by the sweep");
  for (size_t i = 0; i < SLABS * PER_SLAB; i++)
    if (blocks[i] && !odd_slab[i]) {
      write_block(blocks[i], 2);
      gen_of[i] = 2;
    }
  CHECK_MSG(check_all() == 0, "%zu blocks wrong after writes", check_all());
  keel_mesh_now();
  keel_mesh_stats(&ms);
  /* One view of each group was written; the other still reads the file page. */
  CHECK_MSG(ms.eroded == pairs, "eroded %" PRIu64 " of %zu", ms.eroded, pairs);
  CHECK_MSG(ms.released == 0, "released %" PRIu64, ms.released);

  TEST_SECTION("fork: the child sees the heap as it was; nothing released while it lives");
  keel_mesh_stats(&ms);
  uint64_t released_before = ms.released;
  /* The groups the child will map: the first pass's pairs, and any the writes since let
   * the second pass make (how many depends on where the blocks lie). */
  uint64_t groups_at_fork = ms.groups;
  CHECK(groups_at_fork >= pairs);
  int go[2];
  CHECK(pipe(go) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    char c;
    if (read(go[0], &c, 1) != 1) _exit(2);
    size_t wrong = check_all(); /* the parent has rewritten its blocks meanwhile */
    for (size_t i = 0; i < SLABS * PER_SLAB; i++)
      if (blocks[i]) write_block(blocks[i], 9);
    keel_mesh_stats(&ms);
    _exit(wrong == 0 && ms.state == KEEL_MESH_STATE_CHILD ? 0 : 1);
  }
  CHECK(pid > 0);
  /* The parent rewrites the other half (gen_of too: the child keeps its own copy):
   * now no view of the parent reads the file, but the child's do. */
  for (size_t i = 0; i < SLABS * PER_SLAB; i++)
    if (blocks[i] && odd_slab[i]) {
      write_block(blocks[i], 4);
      gen_of[i] = 4;
    }
  keel_mesh_now(); /* the written pages mesh anew: groups the child does not map */
  keel_mesh_stats(&ms);
  CHECK_MSG(ms.released == released_before, "released %" PRIu64 " while a child lives",
            ms.released - released_before);
  uint64_t meshed_after_fork = ms.meshed - (pairs + 0);
  /* Those new groups, once written, are released at once: the child cannot map them. */
  for (size_t i = 0; i < SLABS * PER_SLAB; i++)
    if (blocks[i]) {
      write_block(blocks[i], 5);
      gen_of[i] = 5;
    }
  keel_mesh_now();
  keel_mesh_stats(&ms);
  uint64_t during = ms.released - released_before;
  CHECK_MSG(meshed_after_fork > 0 && during > 0 && during <= meshed_after_fork,
            "meshed %" PRIu64 " after the fork, released %" PRIu64 " while the child lives", meshed_after_fork,
            during);
  CHECK(write(go[1], "x", 1) == 1);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  CHECK_MSG(check_all() == 0, "%zu blocks changed by the child", check_all());
  /* The file pages of the groups the child mapped, which no view of ours reads, are
   * released now. */
  keel_mesh_now();
  keel_mesh_stats(&ms);
  CHECK_MSG(ms.released == released_before + during + groups_at_fork,
            "released %" PRIu64 " of %" PRIu64 " after the child exited", ms.released - released_before - during,
            groups_at_fork);
  CHECK_MSG((ms.meshed - pairs) * 4 >= pairs * 3 && ms.views <= 2 * ms.groups,
            "meshed anew: %" PRIu64 " groups of %zu, %" PRIu64 " views, %" PRIu64 " meshed in all", ms.groups,
            pairs, ms.views, ms.meshed);
  CHECK_MSG(check_all() == 0, "%zu blocks changed by meshing written views", check_all());
  _keel_verify();

  TEST_SECTION("new blocks onto meshed pages");
  static void* fresh[2048];
  for (size_t i = 0; i < 2048; i++) {
    fresh[i] = malloc(SIZE);
    write_block(fresh[i], 3);
  }
  size_t bad = 0;
  for (size_t i = 0; i < 2048; i++) bad += !block_is(fresh[i], 3);
  CHECK(bad == 0);
  CHECK_MSG(check_all() == 0, "%zu blocks wrong after new allocations", check_all());
  for (size_t i = 0; i < 2048; i++) free(fresh[i]);

  TEST_SECTION("groups of four: 512-byte blocks in four slots");
  {
    enum { N512 = 64 * 128 };
    static void* b512[N512];
    static uintptr_t base512[N512];
    keel_mesh_now(); /* the 1 KiB class first: written views there mesh anew */
    for (size_t i = 0; i < N512; i++) {
      b512[i] = malloc(512);
      base512[i] = (uintptr_t)b512[i] & ~(uintptr_t)0xFFFF;
    }
    qsort(base512, N512, sizeof base512[0], cmp_uptr);
    size_t ns = 0;
    for (size_t i = 0; i < N512; i++)
      if (ns == 0 || base512[ns - 1] != base512[i]) base512[ns++] = base512[i];
    size_t per = page_size / 512;
    for (size_t i = 0; i < N512; i++) {
      uintptr_t base = (uintptr_t)b512[i] & ~(uintptr_t)0xFFFF;
      size_t ord = (size_t)((uintptr_t*)bsearch(&base, base512, ns, sizeof base, cmp_uptr) - base512);
      if ((((uintptr_t)b512[i] & 0xFFFF) / 512) % per != ord % 4) {
        free(b512[i]);
        b512[i] = NULL;
      } else {
        memset(b512[i], (int)(ord & 0xFF), 512);
      }
    }
    keel_purge();
    keel_mesh_stats_t before;
    keel_mesh_stats(&before);
    size_t saved = keel_mesh_now();
    keel_mesh_stats(&ms);
    size_t pages512 = ns * (65536 / page_size);
    printf("  %zu pages of 512-byte blocks: %zu pages given back (views now %" PRIu64 ", were %" PRIu64 ")\n",
           pages512, saved, ms.views, before.views);
    /* Four kinds of page: groups of four give back three pages in four (pairs could
     * give back at most one in two). */
    CHECK_MSG(saved * 4 >= pages512 * 3 * 3 / 4, "gave back %zu of %zu pages", saved, pages512);
    size_t wrong = 0;
    for (size_t i = 0; i < N512; i++) {
      if (b512[i] == NULL) continue;
      uintptr_t base = (uintptr_t)b512[i] & ~(uintptr_t)0xFFFF;
      unsigned char want = (unsigned char)((uintptr_t*)bsearch(&base, base512, ns, sizeof base, cmp_uptr) - base512);
      for (size_t j = 0; j < 512; j++) wrong += ((unsigned char*)b512[i])[j] != want;
    }
    CHECK_MSG(wrong == 0, "%zu bytes changed in groups of four", wrong);
    CHECK_MSG(check_all() == 0, "%zu 1 KiB blocks changed", check_all());
    _keel_verify();
    for (size_t i = 0; i < N512; i++) free(b512[i]);
  }

  TEST_SECTION("free everything: views become fresh memory, slabs go, calloc reads zero");
  for (size_t i = 0; i < SLABS * PER_SLAB; i++) free(blocks[i]);
  keel_purge();
  keel_mesh_now();
  keel_mesh_stats(&ms);
  printf("  views %" PRIu64 " groups %" PRIu64 " left %" PRIu64 " released %" PRIu64 " file %" PRIu64 " B\n",
         ms.views, ms.groups, ms.left, ms.released, ms.file_bytes);
  CHECK(ms.views == 0 && ms.groups == 0 && ms.file_bytes == 0);
  bad = 0;
  for (int round = 0; round < 8; round++) {
    static unsigned char* big[32];
    for (int i = 0; i < 32; i++) {
      big[i] = calloc(1, 96 << 10);
      for (size_t j = 0; j < (96 << 10); j += 8) bad += *(uint64_t*)(big[i] + j) != 0;
      memset(big[i], 0xA5, 96 << 10);
    }
    for (int i = 0; i < 32; i++) free(big[i]);
  }
  CHECK_MSG(bad == 0, "%zu non-zero words in calloc'd memory", bad);
  _keel_verify();
  return test_finish();
}
