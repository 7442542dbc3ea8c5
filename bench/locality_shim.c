/* locality_shim.c -- records where malloc puts blocks, for bench/locality.py.
 *
 * Preloaded in front of the allocator under test (LD_PRELOAD="shim.so ALLOCATOR.so"):
 * every malloc and calloc of 1 byte to 128 KiB and every free is passed on to the next
 * definition and recorded in a buffer, which is written to $LOCALITY_TRACE at exit as
 * pairs of 64-bit words (address, size | thread << 32), size 0 for a free (of any
 * block), threads numbered from 0 in the order of their first record. Records past the buffer's end are counted,
 * not kept. Nothing here allocates. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_RECORDS ((size_t)1 << 26) /* 1 GiB of address space, reserved, touched as used */
#define MAX_SIZE ((size_t)128 << 10)

static void* (*next_malloc)(size_t);
static void* (*next_calloc)(size_t, size_t);
static void (*next_free)(void*);
static uint64_t* records;
static size_t used, dropped;
static __thread int resolving;
static uint64_t threads;
static __thread uint64_t thread_no; /* 1 + the thread's number, 0 before its first record */
/* dlsym could allocate before the next malloc is known (glibc's does not on success):
 * such a request is served from here, and freeing it does nothing. */
static _Alignas(16) char early[4096];
static size_t early_used;

static void* early_alloc(size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (early_used + n > sizeof early) return NULL;
  void* p = early + early_used;
  early_used += n;
  return p;
}

static void resolve(void) {
  resolving = 1;
  next_malloc = (void* (*)(size_t))dlsym(RTLD_NEXT, "malloc");
  next_calloc = (void* (*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
  next_free = (void (*)(void*))dlsym(RTLD_NEXT, "free");
  void* r = mmap(NULL, MAX_RECORDS * 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  records = r == MAP_FAILED ? NULL : (uint64_t*)r;
  resolving = 0;
}

static void record(void* p, size_t n) {
  if (p == NULL || n > MAX_SIZE || records == NULL) return;
  size_t i = __atomic_fetch_add(&used, 1, __ATOMIC_RELAXED);
  if (i >= MAX_RECORDS) {
    __atomic_fetch_add(&dropped, 1, __ATOMIC_RELAXED);
    return;
  }
  if (thread_no == 0) thread_no = 1 + __atomic_fetch_add(&threads, 1, __ATOMIC_RELAXED);
  records[2 * i] = (uint64_t)(uintptr_t)p;
  records[2 * i + 1] = (uint64_t)n | (thread_no - 1) << 32;
}

void* malloc(size_t n) {
  if (next_malloc == NULL) {
    if (resolving) return early_alloc(n);
    resolve();
  }
  void* p = next_malloc(n);
  record(p, n);
  return p;
}

void* calloc(size_t count, size_t size) {
  if (next_calloc == NULL) {
    if (resolving) return early_alloc(count * size); /* zero: early[] is static */
    resolve();
  }
  void* p = next_calloc(count, size);
  if (size != 0 && count <= MAX_SIZE / size) record(p, count * size);
  return p;
}

void free(void* p) {
  if (p == NULL || ((char*)p >= early && (char*)p < early + sizeof early)) return;
  if (next_free == NULL) resolve();
  record(p, 0);
  next_free(p);
}

__attribute__((destructor)) static void write_trace(void) {
  const char* path = getenv("LOCALITY_TRACE");
  if (path == NULL || records == NULL) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  size_t n = used < MAX_RECORDS ? used : MAX_RECORDS;
  const char* b = (const char*)records;
  size_t left = n * 16;
  while (left > 0) {
    ssize_t w = write(fd, b, left);
    if (w <= 0) break;
    b += w;
    left -= (size_t)w;
  }
  close(fd);
  if (dropped != 0) {
    static const char msg[] = "locality_shim: the trace is full; later mallocs were not recorded\n";
    (void)!write(2, msg, sizeof msg - 1);
  }
}
