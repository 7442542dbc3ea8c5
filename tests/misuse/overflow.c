/* overflow.c -- the classic heap exploit, tried on whatever allocator runs it: a live
 * block overflows into the free block after it, overwriting its free-list link with an
 * address of the attacker's choice, and the program then allocates that size until the
 * list is used. An allocator that follows the link hands out the chosen address.
 *
 * Plain C on the standard API (no Keel header), so that run_overflow.sh runs the same
 * binary under Keel (LD_PRELOAD) and under glibc and records both outcomes.
 *
 * Usage: overflow CASE SIZE
 *   bin8, bin16  the freed block waits in the freeing thread's cache; the overflow
 *                writes 8 or 16 bytes past the live block
 *   xthread      blocks allocated by one thread are freed by another, one of them after
 *                its link was overwritten; that thread ends, a new one (a connection
 *                thread replacing it) allocates until what it left is used, and then the
 *                first thread (where glibc's arenas keep the blocks) does the same
 *   key          prints the link secret as the program can read it back (a freed
 *                block's link XOR the address it leads to XOR its own), to compare
 *                processes
 *   key-exec     the same, then exec's itself with `key` (the same process, a new image)
 * Exit status: 3 if malloc returned the attacker's address ("RETURNED"), 4 if nothing
 * stopped the program; an allocator that notices stops it first. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 256, ROUNDS = 4096 };

/* Where the attacker wants the next malloc to land: 16-byte aligned, as a real target
 * (a function pointer table, a stack slot) would be made to look. */
static _Alignas(64) char target[4096];
static size_t size;

/* Two live blocks of the same size, the second right after the first in memory. */
static int adjacent(void** b, int n, int* lo, int* hi) {
  size_t best = (size_t)-1;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      uintptr_t a = (uintptr_t)b[i], c = (uintptr_t)b[j];
      if (c > a && c - a < best) {
        best = c - a;
        *lo = i;
        *hi = j;
      }
    }
  return best <= 2 * size + 64;
}

static void check(void* p) {
  if ((char*)p >= target && (char*)p < target + sizeof target) {
    printf("RETURNED the attacker's address %p\n", p);
    fflush(stdout);
    exit(3);
  }
}

/* Writes `bytes` (8 or 16) past the end of live block lo, which is the start of hi. */
static void overflow(void* lo, void* hi, int bytes) {
  uintptr_t forged[2] = {(uintptr_t)target, (uintptr_t)target};
  size_t gap = (size_t)((char*)hi - (char*)lo);
  printf("overflow: %d bytes past %p (%zu bytes) into the free block at %p\n", bytes, lo, gap, hi);
  fflush(stdout);
  memcpy((char*)lo + gap, forged, (size_t)bytes);
}

static int bin_case(int bytes) {
  static void* b[N];
  for (int i = 0; i < N; i++) b[i] = malloc(size);
  int lo = 0, hi = 0;
  if (!adjacent(b, N, &lo, &hi)) return printf("no adjacent blocks\n"), 2;
  /* Two freed: the list is hi -> other, and hi's link is the one overwritten. */
  int other = (hi + 2) % N == lo ? (hi + 3) % N : (hi + 2) % N;
  free(b[other]);
  free(b[hi]);
  overflow(b[lo], b[hi], bytes);
  for (int i = 0; i < ROUNDS; i++) check(malloc(size));
  printf("not stopped\n");
  return 4;
}

static void* blocks[N];
static void* free_all(void* arg) {
  (void)arg;
  /* A thread that works (its own cache, as a server's worker has) frees the odd blocks
   * the main thread allocated; the last one freed right after a live neighbour (an
   * even block) is overwritten once it is free. The thread then ends, handing its
   * cache on. */
  for (int i = 0; i < 200; i++) free(malloc(8));
  int last = -1;
  for (int i = 1; i < N; i += 2) {
    free(blocks[i]);
    if ((char*)blocks[i] > (char*)blocks[i - 1] && (size_t)((char*)blocks[i] - (char*)blocks[i - 1]) <= 2 * size + 64)
      last = i;
  }
  if (last >= 0) overflow(blocks[last - 1], blocks[last], 8);
  else printf("no adjacent blocks\n");
  return NULL;
}

static void* allocate_all(void* arg) {
  (void)arg;
  for (int i = 0; i < ROUNDS; i++) check(malloc(size));
  return NULL;
}

static int xthread_case(void) {
  for (int i = 0; i < N; i++) blocks[i] = malloc(size);
  pthread_t t;
  pthread_create(&t, NULL, free_all, NULL);
  pthread_join(t, NULL);
  pthread_create(&t, NULL, allocate_all, NULL);
  pthread_join(t, NULL);
  allocate_all(NULL);
  printf("not stopped\n");
  return 4;
}

static int key_case(char** argv, int then_exec) {
  for (int i = 0; i < 200; i++) free(malloc(size)); /* a thread cache of its own */
  void* a = malloc(size);
  void* b = malloc(size);
  free(a);
  free(b);
  /* b's first word now links to a: read back, XORed with a and with b's own address, it
   * is the secret (0 where links are plain pointers: then b is printed). Reading a freed
   * block is the test's, not a program's. */
  uintptr_t link;
  memcpy(&link, b, sizeof link);
  printf("key %#lx\n", (unsigned long)(link ^ (uintptr_t)a ^ (uintptr_t)b));
  /* The same process after exec: a new secret. */
  if (then_exec) execl("/proc/self/exe", argv[0], "key", argv[2], (char*)NULL);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s bin8|bin16|xthread|key|key-exec SIZE\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IONBF, 0);
  size = strtoul(argv[2], NULL, 10);
  if (!strcmp(argv[1], "bin8")) return bin_case(8);
  if (!strcmp(argv[1], "bin16")) return bin_case(16);
  if (!strcmp(argv[1], "xthread")) return xthread_case();
  if (!strcmp(argv[1], "key")) return key_case(argv, 0);
  if (!strcmp(argv[1], "key-exec")) return key_case(argv, 1);
  return 2;
}
