/* guard.c -- guarded blocks (KEEL_CHECK=1 KEEL_CHECK_GUARD=64K) used correctly: they
 * must behave as any block does. The misuse cases (misuse.c, guard_*) check that misuse
 * of them is caught; this checks everything else:
 *   - a program's own SIGSEGV handler is left alone (checked first, in a child, before
 *     any guarded block exists); Keel's is installed otherwise, and faults that are not
 *     Keel's still end the process with SIGSEGV, without a Keel report;
 *   - blocks end less than their alignment before a page boundary (the guard), every
 *     alignment is honoured, malloc_usable_size is the requested size;
 *   - calloc is zeroed, realloc grows and shrinks (across the threshold) keeping contents;
 *   - many blocks through the quarantine (slots, address-space bound) and from two
 *     threads; freed blocks' memory goes back to the OS; statistics count live blocks.
 * Exits 0 when all is well; prints what failed otherwise. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <keel.h>

static int failures;
#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "guard: FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                               \
    }                                                                           \
  } while (0)

static void* opaque(void* p) {
  __asm__ __volatile__("" : "+r"(p) : : "memory");
  return p;
}

static size_t page;

/* Bytes from the block's end to the next page boundary (its guard). */
static size_t slack(const void* p, size_t n) {
  return (size_t)(-((uintptr_t)p + n) & (page - 1));
}

static void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + seed);
}
static int same(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(i * 31 + seed)) return 0;
  return 1;
}

/* ---- a program's own handler --------------------------------------------------------- */

static sigjmp_buf own_jump;
static volatile sig_atomic_t own_calls;
static void own_handler(int sig) {
  (void)sig;
  own_calls++;
  siglongjmp(own_jump, 1);
}

/* In a child that has not allocated a guarded block yet: the program's handler comes
 * first and stays; an overflow into a guard reaches it, not Keel's report. */
static void test_own_handler(void) {
  pid_t pid = fork();
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = own_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    char* p = malloc(100 << 10);
    memset(p, 1, 100 << 10);
    struct sigaction now;
    sigaction(SIGSEGV, NULL, &now);
    if (now.sa_handler != own_handler) _exit(3);
    if (sigsetjmp(own_jump, 1) == 0) ((volatile char*)opaque(p))[100 << 10] = 1;
    _exit(own_calls == 1 ? 0 : 4);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Runs fn in a child; returns its wait status, and whether its stderr had "keel:". */
static int in_child(void (*fn)(void), int* said_keel) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    fn();
    _exit(0);
  }
  close(fds[1]);
  char buf[4096];
  size_t got = 0;
  ssize_t r;
  while (got < sizeof buf - 1 && (r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
    got += (size_t)r;
  buf[got] = 0;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  *said_keel = strstr(buf, "keel:") != NULL;
  return status;
}

/* Address 16, not NULL: a UBSan build would report a null store itself and exit. */
static void null_write(void) { *(volatile char*)opaque((void*)16) = 1; }
static void sent_segv(void) { kill(getpid(), SIGSEGV); }
static void own_prot_none(void) {
  char* m = mmap(NULL, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ((volatile char*)m)[12345] = 1;
}
static void before_guarded(void) { /* the unit before a live guarded block's mapping */
  char* p = malloc(100 << 10);
  char* m = mmap((void*)(((uintptr_t)p & ~(uintptr_t)0xffff) - (64 << 10)), 64 << 10, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (m == MAP_FAILED) raise(SIGSEGV); /* something is there already: same outcome */
  ((volatile char*)m)[100] = 1;
}

/* Keel's handler is in place, and faults that are not Keel's end the process as usual. */
static void test_foreign_faults(void) {
  struct sigaction now;
  sigaction(SIGSEGV, NULL, &now);
  CHECK((now.sa_flags & SA_SIGINFO) && (now.sa_flags & SA_ONSTACK));
  void (*cases[])(void) = {null_write, sent_segv, own_prot_none, before_guarded};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int said_keel = 0;
    int status = in_child(cases[i], &said_keel);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV && !said_keel)) {
      fprintf(stderr, "guard: FAIL: foreign fault %zu: status %#x, keel report %d\n", i, status,
              said_keel);
      failures++;
    }
  }
}

/* ---- layout, alignment, sizes ------------------------------------------------------- */

static void test_layout(void) {
  static const size_t sizes[] = {64 << 10, 100 << 10, (100 << 10) + 1, 65537, 1 << 20,
                                 (3 << 20) + 7, 8 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    unsigned char* p = malloc(n);
    CHECK(p != NULL && ((uintptr_t)p & 15) == 0);
    CHECK(slack(p, n) < 16);
    CHECK(malloc_usable_size(p) == n);
    fill(p, n, (unsigned)i);
    CHECK(same(p, n, (unsigned)i));
    free(p);
  }
  /* Below the threshold: an ordinary checked block. */
  unsigned char* s = malloc(1000);
  CHECK(s != NULL && malloc_usable_size(s) == 1000);
  free(s);
}

static void test_alignment(void) {
  unsigned char* p = memalign(4096, 70000);
  CHECK(p != NULL && ((uintptr_t)p & 4095) == 0);
  CHECK(slack(p, 70000) < 4096);
  CHECK(malloc_usable_size(p) == 70000);
  fill(p, 70000, 7);
  CHECK(same(p, 70000, 7));
  free(p);

  static const size_t aligns[] = {32, 64, 256, 8192, 65536, 1 << 20, 4 << 20};
  for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
    void* q = NULL;
    size_t n = 200000 + i;
    CHECK(posix_memalign(&q, aligns[i], n) == 0);
    CHECK(q != NULL && ((uintptr_t)q & (aligns[i] - 1)) == 0);
    CHECK(slack(q, n) < (aligns[i] > page ? page : aligns[i]) || aligns[i] > page);
    CHECK(malloc_usable_size(q) == n);
    memset(q, 3, n);
    free(q);
  }
  unsigned char* a = aligned_alloc(65536, 3 * 65536);
  CHECK(a != NULL && ((uintptr_t)a & 65535) == 0);
  memset(a, 4, 3 * 65536);
  free(a);
  unsigned char* v = valloc(300000);
  CHECK(v != NULL && ((uintptr_t)v & (page - 1)) == 0);
  free(v);
}

static void test_calloc(void) {
  unsigned char* p = calloc(1, 300000);
  CHECK(p != NULL);
  size_t nonzero = 0;
  for (size_t i = 0; i < 300000; i++) nonzero += p[i] != 0;
  CHECK(nonzero == 0);
  free(p);
  p = calloc(3, 100000);
  CHECK(p != NULL && p[0] == 0 && p[299999] == 0 && malloc_usable_size(p) == 300000);
  free(p);
}

static void test_realloc(void) {
  size_t n = 100 << 10;
  unsigned char* p = malloc(n);
  fill(p, n, 11);
  unsigned char* q = realloc(p, 400 << 10); /* grow */
  CHECK(q != NULL && same(q, n, 11) && malloc_usable_size(q) == (400 << 10));
  CHECK(slack(q, 400 << 10) < 16);
  fill(q, 400 << 10, 12);
  unsigned char* r = realloc(q, 80 << 10); /* shrink, still guarded */
  CHECK(r != NULL && same(r, 80 << 10, 12) && malloc_usable_size(r) == (80 << 10));
  CHECK(slack(r, 80 << 10) < 16);
  unsigned char* s = realloc(r, 1000); /* below the threshold */
  CHECK(s != NULL && same(s, 1000, 12) && malloc_usable_size(s) == 1000);
  unsigned char* t = realloc(s, 200000); /* back above it */
  CHECK(t != NULL && same(t, 1000, 12) && malloc_usable_size(t) == 200000);
  CHECK(slack(t, 200000) < 16);
  unsigned char* u = reallocarray(t, 3, 100001);
  CHECK(u != NULL && same(u, 1000, 12) && malloc_usable_size(u) == 300003);
  free(u);
}

/* ---- volume ------------------------------------------------------------------------- */

static long rss_kib(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * (long)(page / 1024);
}

static void test_quarantine(void) {
  /* More blocks than the quarantine has slots: the oldest are unmapped. */
  for (int i = 0; i < 6000; i++) {
    size_t n = (64 << 10) + (size_t)(i % 7) * 10000;
    unsigned char* p = malloc(n);
    CHECK(p != NULL);
    if (p == NULL) return;
    p[0] = 1;
    p[n - 1] = 2;
    free(p);
  }
  /* Big blocks, each written whole: beyond the quarantine's address-space bound, and
   * their memory must go back to the OS when freed. */
  for (int i = 0; i < 40; i++) {
    size_t n = (size_t)64 << 20;
    unsigned char* p = malloc(n);
    CHECK(p != NULL);
    if (p == NULL) return;
    memset(p, 5, n);
    free(p);
  }
  long rss = rss_kib();
  if (rss > 200 * 1024) {
    fprintf(stderr, "guard: FAIL: RSS %ld KiB after freeing big guarded blocks\n", rss);
    failures++;
  }
}

static void* churn(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void* live[16] = {0};
  for (int i = 0; i < 3000; i++) {
    seed = seed * 1103515245u + 12345u;
    int slot = (int)((seed >> 8) % 16);
    free(live[slot]);
    size_t n = (seed >> 12) % 3 == 0 ? 100 + (seed >> 16) % 5000
                                     : (64 << 10) + (seed >> 16) % 200000;
    unsigned char* p = malloc(n);
    if (p == NULL) return (void*)1;
    p[0] = (unsigned char)n;
    p[n - 1] = (unsigned char)n;
    live[slot] = p;
  }
  for (int i = 0; i < 16; i++) free(live[i]);
  return NULL;
}

static void test_threads(void) {
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, churn, (void*)(uintptr_t)(i + 1));
  for (int i = 0; i < 2; i++) {
    void* r = NULL;
    pthread_join(t[i], &r);
    CHECK(r == NULL);
  }
}

static void test_stats(void) {
  size_t n = 5 << 20;
  void* p = malloc(n);
  keel_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  CHECK(keel_stats_get(&s) == 0);
  CHECK(s.allocated >= n);
  free(p);
}

int main(void) {
  page = (size_t)sysconf(_SC_PAGESIZE);
  const char* check = getenv("KEEL_CHECK");
  const char* guard = getenv("KEEL_CHECK_GUARD");
  if (check == NULL || strcmp(check, "1") != 0 || guard == NULL || strcmp(guard, "64K") != 0) {
    fprintf(stderr, "guard: run with KEEL_CHECK=1 KEEL_CHECK_GUARD=64K\n");
    return 2;
  }
  test_own_handler(); /* first: no guarded block may exist yet */
  test_layout();
  test_foreign_faults();
  test_alignment();
  test_calloc();
  test_realloc();
  test_quarantine();
  test_threads();
  test_stats();
  if (failures) {
    fprintf(stderr, "guard: %d failure(s)\n", failures);
    return 1;
  }
  printf("guard: ok\n");
  return 0;
}
