/* misuse.c -- commits exactly one heap misuse, chosen by argv[1], and expects to be
 * stopped by Keel: run_misuse.sh checks that the process died of SIGABRT and that stderr
 * holds Keel's report, e.g.
 *
 *   keel: free(): double free of pointer 0x7f3a2c001040 (block of 32 bytes)
 *
 * Before the misuse the program writes the pointer it is about to pass, as
 *   misuse: <case>: <call>(0x...)
 * so the driver can compare it with the address in Keel's report. If the misuse is not
 * caught, the program says so and exits 0, which the driver reports as a failure.
 *
 * Usage: misuse <case>       (misuse --list prints the cases)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef KEEL_TESTING_KEEL
#include <keel.h>
#endif

/* Hide pointers from the optimiser (and from -Wfree-nonheap-object / -Wuse-after-free:
 * every misuse here is deliberate). */
static void* opaque(void* p) {
  __asm__ __volatile__("" : "+r"(p) : : "memory");
  return p;
}

static const char* current_case;

static void announce(const char* call, const void* p) {
  fprintf(stderr, "misuse: %s: %s(%p)\n", current_case, call, p);
  fflush(stderr);
}

static void do_free(void* p) {
  announce("free", p);
  free(opaque(p));
}

static void* do_realloc(void* p, size_t n) {
  announce("realloc", p);
  return realloc(opaque(p), n);
}

/* ------------------------------------------------------------------ cases --- */

/* free(a); free(b); free(a): the classic double free with another free of the same size
 * class in between (a is no longer at the head of any free list). */
static void double_free_small(void) {
  char* a = malloc(32);
  char* b = malloc(32);
  memset(a, 1, 32);
  memset(b, 2, 32);
  free(opaque(a));
  free(opaque(b));
  do_free(a);
}

static void double_free_small_immediate(void) {
  char* a = malloc(32);
  memset(a, 1, 32);
  free(opaque(a));
  do_free(a);
}

/* The first free is followed by thousands of frees of the same size, so the block has
 * most likely left the thread cache for a shared list before the second free. */
static void double_free_small_flushed(void) {
  enum { N = 5000 };
  static char* others[N];
  for (int i = 0; i < N; i++) others[i] = malloc(32);
  char* a = malloc(32);
  memset(a, 1, 32);
  free(opaque(a));
  for (int i = 0; i < N; i++) free(others[i]);
  do_free(a);
}

/* The first free happens on another thread (which then exits). */
static void* free_on_thread(void* p) {
  free(opaque(p));
  return NULL;
}
static void double_free_small_cross_thread(void) {
  char* a = malloc(32);
  memset(a, 1, 32);
  pthread_t t;
  if (pthread_create(&t, NULL, free_on_thread, a) != 0) {
    fprintf(stderr, "misuse: pthread_create failed\n");
    exit(2);
  }
  pthread_join(t, NULL);
  do_free(a);
}

static void double_free_large(void) {
  char* a = malloc(300000);
  memset(a, 1, 300000);
  free(opaque(a));
  do_free(a);
}

static void double_free_huge(void) {
  size_t n = (size_t)8 << 20;
  char* a = malloc(n);
  memset(a, 1, 4096);
  free(opaque(a));
  do_free(a);
}

static void double_free_aligned(void) {
  char* a = memalign(4096, 5000);
  memset(a, 1, 5000);
  free(opaque(a));
  do_free(a);
}

static void free_stack(void) {
  char buf[256];
  memset(buf, 0, sizeof buf);
  do_free(buf + 64);
}

static void free_mmap(void) {
  size_t n = 64 << 10;
  char* p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("misuse: mmap");
    exit(2);
  }
  memset(p, 0, n);
  do_free(p);
}

/* Interior pointer, not 16-aligned. */
static void free_interior(void) {
  char* p = malloc(100);
  memset(p, 1, 100);
  do_free(p + 8);
}

/* Interior pointer that is 16-aligned (p + 16 is inside the block, not its start). */
static void free_interior_aligned(void) {
  char* p = malloc(100);
  memset(p, 1, 100);
  do_free(p + 16);
}

/* The cases below are caught by the checked mode (KEEL_CHECK=1). */

/* One byte written past the end of a 100-byte block: the canary is checked on free. */
static void overflow_small(void) {
  char* p = malloc(100);
  memset(p, 1, 101);
  do_free(p);
}

/* Eight bytes past the end of a large block. */
static void overflow_large(void) {
  char* p = malloc(300000);
  memset(p, 1, 300008);
  do_free(p);
}

/* A write into a block after it was freed: found when the quarantine hands it back. */
static void write_after_free(void) {
  char* p = malloc(64);
  free(opaque(p));
  ((char*)opaque(p))[40] = 7;
  announce("free", p);
  for (int i = 0; i < 5000; i++) free(opaque(malloc(64)));
}

/* A write through a dangling pointer after its block has left the quarantine (back in
 * its slab): caught when the block is handed out again. */
static void write_after_quarantine(void) {
  enum { N = 5000 }; /* more than the quarantine's 4,096 slots */
  static char* held[N];
  for (int i = 0; i < N; i++) held[i] = malloc(64);
  char* p = malloc(64);
  free(opaque(p));
  for (int i = 0; i < N; i++) free(opaque(held[i])); /* p leaves the quarantine first */
  ((char*)opaque(p))[40] = 7;
  announce("malloc", p);
  for (int i = 0; i < 2 * N; i++) (void)opaque(malloc(64)); /* p is handed out again */
}

/* realloc of a block that was already freed. */
static void realloc_freed(void) {
  char* p = malloc(48);
  free(opaque(p));
  void* q = do_realloc(p, 200);
  (void)q;
}

/* realloc of a freed block to a size its block still holds: the block would be handed
 * back as it is while it sits on a free list (then given out twice). */
static void realloc_freed_same_size(void) {
  char* p = malloc(48);
  free(opaque(p));
  void* q = do_realloc(p, 40);
  (void)q;
}

/* realloc of a pointer 16 bytes into a block: the result would overlap the next block. */
static void realloc_interior(void) {
  char* p = malloc(64);
  void* q = do_realloc(p + 16, 64);
  (void)q;
}

/* A big block freed twice with a block of its size allocated in between, which would
 * take its units or mapping again where it did not wait in the quarantine. */
static void double_free_big_reused(void) {
  for (size_t n = (size_t)256 << 10; n <= ((size_t)16 << 20); n *= 8) {
    char* a = malloc(n);
    free(opaque(a));
    char* b = malloc(n);
    (void)opaque(b);
    announce("free", a);
    free(opaque(a));
  }
}

/* C23's sized free with a size the block was not asked with. */
void free_sized(void* p, size_t size);
static void free_sized_wrong(void) {
  char* p = malloc(100);
  announce("free_sized", p);
  free_sized(opaque(p), 64);
}

/* free of a pointer into a large block that grew in place over a freed one's units. */
static void free_interior_large_grown(void) {
  char* a = malloc(200 << 10);
  char* b = malloc(200 << 10);
  free(opaque(b));
  char* a2 = realloc(opaque(a), 500 << 10);
  announce("free", a2 + (256 << 10));
  free(opaque(a2 + (256 << 10)));
}

/* The cases below run with KEEL_CHECK=1 KEEL_CHECK_GUARD=64K: blocks of 64 KiB or more
 * end right before an inaccessible guard page. A fault is announced as
 *   misuse: <case>: fault(<address about to be accessed>)
 * and the report must name that address. */
#define GUARDED_SIZE ((size_t)100 << 10)

/* One byte written just past the end of a 100 KiB block: it lands on the guard page. */
static void guard_overflow_write(void) {
  char* p = malloc(GUARDED_SIZE);
  memset(p, 1, GUARDED_SIZE);
  announce("fault", p + GUARDED_SIZE);
  ((volatile char*)opaque(p))[GUARDED_SIZE] = 1;
}

/* A read a page past the end: still in the guard. */
static void guard_overflow_read_page(void) {
  char* p = malloc(GUARDED_SIZE);
  memset(p, 1, GUARDED_SIZE);
  size_t off = GUARDED_SIZE + 4096;
  announce("fault", p + off);
  volatile char c = ((volatile char*)opaque(p))[off];
  (void)c;
}

/* memalign(4096, 70000): the block ends up to 4095 bytes before its guard. A write that
 * runs through that slack reaches the guard. */
static void guard_overflow_aligned(void) {
  size_t n = 70000;
  char* p = memalign(4096, n);
  if (((uintptr_t)p & 4095) != 0) {
    fprintf(stderr, "misuse: memalign(4096) returned %p\n", (void*)p);
    exit(2);
  }
  memset(p, 1, n);
  char* guard = (char*)(((uintptr_t)p + n + 4095) & ~(uintptr_t)4095);
  announce("fault", guard);
  for (volatile char* c = (volatile char*)opaque(p) + n;; c++) *c = 1;
}

/* An odd size leaves 15 bytes of slack before the guard: the canary covers them. */
static void guard_overflow_slack(void) {
  size_t n = GUARDED_SIZE + 1;
  char* p = malloc(n);
  memset(p, 1, n + 1);
  do_free(p);
}

/* A block below KEEL_CHECK_GUARD has no guard: the canary catches the write on free. */
static void guard_below_threshold(void) {
  size_t n = 32 << 10;
  char* p = malloc(n);
  memset(p, 1, n + 1);
  do_free(p);
}

/* A freed guarded block is inaccessible while it waits in the quarantine. */
static void guard_use_after_free(void) {
  char* p = malloc(GUARDED_SIZE);
  memset(p, 1, GUARDED_SIZE);
  free(opaque(p));
  announce("fault", p + 100);
  ((volatile char*)opaque(p))[100] = 2;
}

static void guard_read_after_free(void) {
  char* p = malloc(GUARDED_SIZE);
  memset(p, 1, GUARDED_SIZE);
  free(opaque(p));
  announce("fault", p + GUARDED_SIZE - 1);
  volatile char c = ((volatile char*)opaque(p))[GUARDED_SIZE - 1];
  (void)c;
}

static void guard_double_free(void) {
  char* p = malloc(GUARDED_SIZE);
  memset(p, 1, GUARDED_SIZE);
  free(opaque(p));
  do_free(p);
}

/* The same after the block has left the quarantine (and been unmapped). */
static void guard_double_free_late(void) {
  char* p = malloc(GUARDED_SIZE);
  free(opaque(p));
  for (int i = 0; i < 5000; i++) free(opaque(malloc(GUARDED_SIZE)));
  do_free(p);
}

static void guard_free_interior(void) {
  char* p = malloc(GUARDED_SIZE);
  memset(p, 1, GUARDED_SIZE);
  do_free(p + 16);
}

static void guard_realloc_freed(void) {
  char* p = malloc(GUARDED_SIZE);
  free(opaque(p));
  void* q = do_realloc(p, 200);
  (void)q;
}

static void realloc_stack(void) {
  char buf[256];
  memset(buf, 0, sizeof buf);
  void* q = do_realloc(buf + 64, 100);
  (void)q;
}

struct misuse_case {
  const char* name;
  void (*fn)(void);
};
static const struct misuse_case cases[] = {
    {"double_free_small", double_free_small},
    {"double_free_small_immediate", double_free_small_immediate},
    {"double_free_small_flushed", double_free_small_flushed},
    {"double_free_small_cross_thread", double_free_small_cross_thread},
    {"double_free_large", double_free_large},
    {"double_free_huge", double_free_huge},
    {"double_free_aligned", double_free_aligned},
    {"free_stack", free_stack},
    {"free_mmap", free_mmap},
    {"free_interior", free_interior},
    {"free_interior_aligned", free_interior_aligned},
    {"overflow_small", overflow_small},
    {"overflow_large", overflow_large},
    {"write_after_free", write_after_free},
    {"write_after_quarantine", write_after_quarantine},
    {"realloc_freed", realloc_freed},
    {"realloc_freed_same_size", realloc_freed_same_size},
    {"realloc_interior", realloc_interior},
    {"free_interior_large_grown", free_interior_large_grown},
    {"free_sized_wrong", free_sized_wrong},
    {"double_free_big_reused", double_free_big_reused},
    {"realloc_stack", realloc_stack},
    {"guard_overflow_write", guard_overflow_write},
    {"guard_overflow_read_page", guard_overflow_read_page},
    {"guard_overflow_aligned", guard_overflow_aligned},
    {"guard_overflow_slack", guard_overflow_slack},
    {"guard_below_threshold", guard_below_threshold},
    {"guard_use_after_free", guard_use_after_free},
    {"guard_read_after_free", guard_read_after_free},
    {"guard_double_free", guard_double_free},
    {"guard_double_free_late", guard_double_free_late},
    {"guard_free_interior", guard_free_interior},
    {"guard_realloc_freed", guard_realloc_freed},
};

int main(int argc, char** argv) {
  size_t ncases = sizeof cases / sizeof *cases;
  if (argc != 2) {
    fprintf(stderr, "usage: %s <case>|--list\n", argv[0]);
    return 2;
  }
  if (strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < ncases; i++) printf("%s\n", cases[i].name);
    return 0;
  }
#ifdef KEEL_TESTING_KEEL
  /* Keel really is the allocator: its version is reachable and it counts our blocks
   * (a thread cache exists, or in the checked mode, which keeps none, the block counts
   * as allocated). */
  const char* v = keel_version();
  keel_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  void* probe = opaque(malloc(64));
  if (v == NULL || probe == NULL || keel_stats_get(&s) != 0 ||
      (s.threads_total < 1 && s.allocated < 64)) {
    fprintf(stderr, "misuse: Keel is not the allocator in use\n");
    return 2;
  }
  free(probe);
#endif
  for (size_t i = 0; i < ncases; i++) {
    if (strcmp(argv[1], cases[i].name) == 0) {
      current_case = cases[i].name;
      cases[i].fn();
      fprintf(stderr, "misuse: %s: survived: the allocator did not stop the program\n",
              current_case);
      return 0;
    }
  }
  fprintf(stderr, "misuse: unknown case '%s' (try --list)\n", argv[1]);
  return 2;
}
