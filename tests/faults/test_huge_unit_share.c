/* test_huge_unit_share.c -- regression test for a bug the fuzzer found (tests/fuzz):
 * two huge blocks whose start addresses fall in the same 64 KiB unit share one page-map
 * byte, so freeing one marks the other "freed", and the next free / realloc /
 * malloc_usable_size of the live one ends the process with a false
 *   keel: free(): double free of pointer 0x...
 *
 * Huge blocks get their own page-aligned mapping, tagged KEEL_KIND_HUGE in the unit of
 * their first byte (huge.c: _keel_pagemap_set(p, 1, KEEL_KIND_HUGE); free sets FREED).
 * A huge-kind block can be a single page: an aligned request whose alignment is above
 * what large spans serve (posix_memalign / aligned_alloc / memalign with alignment
 * >= 4 MiB, any size) maps round_pages(size) bytes at an aligned address and leaves the
 * rest of the over-sized mapping as a hole right after it. The next mapping the kernel
 * places in that hole starts in the same 64 KiB unit.
 *
 * The test builds that layout on purpose: malloc_trim(0) (Keel drops its cache of freed
 * mappings), A = aligned_alloc(4 MiB, 100); it reads
 * /proc/self/maps for the size of the hole after A and asks malloc for exactly that
 * much (so the kernel's top-down placement puts B at A + 4 KiB); if B landed in A's
 * unit, it frees A and then uses B (malloc_usable_size, realloc, free) in a child
 * process, which must exit normally. If the kernel placed B elsewhere the round is
 * retried (up to 20 times), then the test is skipped (exit 77) rather than passed.
 * Since the fix (huge blocks are at least a unit, huge.c) A's mapping covers the rest of
 * its unit, so the layout cannot arise: the test checks exactly that (from
 * /proc/self/maps) and passes.
 * Also builds against glibc (where it passes):
 *   gcc -O1 -fno-builtin -D_GNU_SOURCE -pthread -Itests/harness -Itests/faults \
 *       tests/faults/test_huge_unit_share.c -o /tmp/t && /tmp/t
 */
#include "faults.h"

#include <sys/wait.h>

/* End of the mapping that contains address a (0 if none). */
static uintptr_t mapping_end(uintptr_t a) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  uintptr_t end = 0, lo, hi;
  char line[512];
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= a && a < hi) end = hi;
  fclose(f);
  return end;
}

/* Start of the first mapping above address a (0 if none found). */
static uintptr_t next_mapping_above(uintptr_t a) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  uintptr_t best = 0, lo, hi;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    if (lo > a && (best == 0 || lo < best)) best = lo;
  }
  fclose(f);
  return best;
}

int main(void) {
  assert_keel_in_use();
  watchdog(60);
  const size_t unit = 64 << 10, align = 4 << 20;
  int tries = 0, hits = 0;
  for (; tries < 20 && hits == 0; tries++) {
    malloc_trim(0); /* no cached mappings: B must be a new mapping */
    void* a = aligned_alloc(align, 100);
    if (!CHECK(a != NULL)) break;
    memset(a, 0xaa, 100);
    /* Fixed Keel: a huge block's mapping covers at least the rest of its first unit, so
     * no other block can start there. That is the property; check it and stop. */
    uintptr_t map_end = mapping_end((uintptr_t)a);
    if (map_end >= ((uintptr_t)a / unit + 1) * unit) {
      printf("round %d: A %p: its mapping ends at %#lx, past the end of its 64 KiB unit: "
             "no other block can start in that unit\n", tries, a, (unsigned long)map_end);
      CHECK(map_end >= ((uintptr_t)a / unit + 1) * unit);
      free(a);
      hits++;
      break;
    }
    uintptr_t end_a = (uintptr_t)a + 4096;
    uintptr_t above = next_mapping_above((uintptr_t)a);
    size_t hole = above > end_a ? above - end_a : 0;
    void* b = NULL;
    if (hole > (1u << 20) + 4096) b = malloc(hole); /* huge: fits only the hole exactly */
    int same_unit = b && ((uintptr_t)b / unit == (uintptr_t)a / unit);
    printf("round %d: A %p (4 KiB mapping), hole %zu KiB above it, B %p: %s\n", tries, a,
           hole >> 10, b, same_unit ? "same 64 KiB unit as A" : "elsewhere");
    fflush(stdout);
    if (same_unit) {
      hits++;
      memset(b, 0xbb, 4096);
      pid_t pid = fork();
      if (pid == 0) {
        free(a);                               /* A's unit is now tagged "freed" ... */
        size_t u = malloc_usable_size(b);      /* ... and B lives in that unit */
        void* c = realloc(b, hole + (2u << 20));
        if (c == NULL || u < hole) _exit(3);
        free(c);
        _exit(0);
      }
      int st = 0;
      CHECK(waitpid(pid, &st, 0) == pid);
      CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                "after free(A), using the live huge block B (same 64 KiB unit) %s %d "
                "(Keel reports a false double free: both share one page-map byte)",
                WIFSIGNALED(st) ? "killed the child with signal" : "made the child exit with",
                WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      continue; /* A and B stay allocated here: freeing them is what the child tested */
    }
    free(b);
    free(a);
  }
  if (hits == 0) {
    printf("SKIP: the kernel never placed B in A's unit in %d tries\n", tries);
    return 77;
  }
  return test_finish();
}
