/* test_oom_reclaim.c -- minimal reproducer: memory the program freed must be usable for
 * a different kind of block when the OS refuses new address space.
 *
 * Under RLIMIT_AS (also: vm.overcommit_memory=2, where every private writable mapping
 * is charged), a program fills 48 MiB with small blocks, frees them all, and then asks
 * for one 32 MiB buffer. glibc returns it (its freed memory went back to the OS or to
 * its top chunk); an allocator that keeps the freed chunks mapped (dirty, for its purge
 * delay) and caches freed huge mappings must give them back and retry before it
 * answers ENOMEM. Same for a 20 MiB buffer after huge blocks were freed (huge cache).
 *
 * Linked with libkeel.so. Also builds against glibc for comparison:
 *   gcc -O1 -fno-builtin -D_GNU_SOURCE -pthread -Itests/harness -Itests/faults \
 *       tests/faults/test_oom_reclaim.c -o /tmp/t && /tmp/t
 */
#include "faults.h"

#define HEADROOM ((size_t)64 << 20)

static int fill_and_free(size_t block, size_t total) {
  void** chain = NULL;
  size_t n = 0;
  for (size_t got = 0; got < total; got += block) {
    void** p = (void**)malloc(block);
    if (!p) break;
    memset(p, 1, block < 4096 ? block : 4096);
    p[0] = chain;
    chain = p;
    n++;
  }
  while (chain) {
    void** next = (void**)chain[0];
    free(chain);
    chain = next;
  }
  return (int)n;
}

static int try_big(const char* what, size_t n) {
  errno = 0;
  void* p = malloc(n);
  int err = errno;
  int ok = CHECK_MSG(p != NULL, "%s: malloc(%zu MiB) failed with errno %d although everything "
                     "allocated before was freed", what, n >> 20, err);
  if (p) memset(p, 2, 4096);
  free(p);
  printf("  %-52s %s\n", what, p ? "ok" : "ENOMEM");
  return ok;
}

int main(void) {
  assert_keel_in_use();
  watchdog(120);
  printf("reclaim: RLIMIT_AS = current address space + %zu MiB\n", HEADROOM >> 20);
  fflush(stdout);
  struct rlimit old;
  CHECK(getrlimit(RLIMIT_AS, &old) == 0);
  struct rlimit lim = {vm_bytes() + HEADROOM, old.rlim_max};
  if (!CHECK(setrlimit(RLIMIT_AS, &lim) == 0)) return test_finish();

  /* 1. small blocks freed -> one big buffer. */
  int n = fill_and_free(256, (size_t)48 << 20);
  CHECK(n > 0);
  try_big("48 MiB of 256 B blocks freed, then malloc(32 MiB)", (size_t)32 << 20);
  /* 2. large blocks freed -> one big buffer. */
  n = fill_and_free(512 << 10, (size_t)48 << 20);
  CHECK(n > 0);
  try_big("48 MiB of 512 KiB blocks freed, then malloc(32 MiB)", (size_t)32 << 20);
  /* 3. huge blocks freed (cached mappings) -> a bigger buffer they cannot serve. */
  n = fill_and_free(12 << 20, (size_t)48 << 20);
  CHECK(n > 0);
  try_big("48 MiB of 12 MiB blocks freed, then malloc(40 MiB)", (size_t)40 << 20);

  CHECK(setrlimit(RLIMIT_AS, &old) == 0);
  return test_finish();
}
