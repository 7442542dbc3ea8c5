/* fuzz_keel.c -- libFuzzer target: the input bytes drive a sequence of allocation calls
 * against a shadow model of every live block.
 *
 * Build (scripts/fuzz.sh does it): clang, a KEEL_PREFIX static library instrumented with
 * -fsanitize=fuzzer-no-link,address,undefined, this file with -fsanitize=fuzzer. Keel is
 * called as keel_malloc, keel_free, ... beside the sanitizer's own malloc, so
 *   - coverage feedback comes from Keel's own code (size classes, slabs, spans, huge
 *     table, realloc paths, failure paths) -- not only from this harness;
 *   - the shadow model and libFuzzer's own data live in the other heap: a Keel bug that
 *     hands out the same memory twice is caught by the content checks below instead of
 *     corrupting the fuzzer;
 *   - ASan and UBSan watch Keel's own globals, stacks and arithmetic (its blocks are
 *     its own mmap'ed memory, which ASan does not police: the model does);
 *   - hidden internals are reachable from the static archive: _keel_verify() (every
 *     invariant) and _keel_prim_fail_maps() (the OS refuses mappings).
 *
 * Operations (one opcode byte, then arguments): malloc, calloc, realloc, reallocarray,
 * posix_memalign / aligned_alloc / memalign with many alignments (valid, odd and absurd),
 * valloc, pvalloc, malloc_usable_size, free, free_sized, free_aligned_sized, hand-over to
 * a helper thread that verifies and frees (cross-thread frees), blocks allocated by the
 * helper and freed here, helper thread exit and restart, thread cache flush, purge, and
 * failing mmaps (allocations may then fail, with ENOMEM, and nothing else may change).
 * Checked after every step: the result of the call against glibc's semantics (NULL and
 * errno, alignment, usable size >= size, calloc zeroes, realloc keeps the prefix), the
 * pattern in the block touched, and the first and last bytes of the block touched and of
 * EDGE_WINDOW more live blocks in turn (each live block every MAXLIVE / EDGE_WINDOW
 * steps); every WALK_EVERY operations (counted across inputs), _keel_verify() and the
 * full contents of all blocks. Each block is filled over its whole usable size, so
 * blocks that overlap corrupt each other visibly. The invariant walk and the edges of
 * all 128 blocks after every step held the fuzzer to 8,900 operations a second; the
 * allocator's own work is what it should spend its time on.
 *
 * Corruption (every CORRUPT_EVERY operations): in a fresh process (this program spawned
 * again, with its own link secret), a block is freed into its bin and its link
 * overwritten - with an aligned address the input chooses, or with one of the link's
 * low four bits flipped - and the process then allocates that size until the link is
 * followed: it must stop with "free list of the N-byte class corrupted", never return
 * the address or crash elsewhere (freelist.h). A flip of a higher bit is not in the
 * mode: it can decode to another block start, which the fast path does not check.
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h" /* keel_pagemap_get: what Keel's page map says of a live block */
#include "keel_prefix.h"

void _keel_prim_fail_maps(long count);
void _keel_verify(void);
size_t keel_purge(void);
void keel_thread_flush(void);

#define MAXLIVE 128
#define LIVE_CAP ((size_t)96 << 20) /* total usable bytes live at once */
#define BIG 8192                    /* above this, blocks are filled in stripes */

typedef struct {
  unsigned char* p;
  size_t n;      /* requested size */
  size_t usable; /* malloc_usable_size at allocation */
  size_t align;  /* alignment guaranteed to us (16, or what we asked for) */
  uint64_t seed;
  int zero;      /* calloc: the first n bytes were checked zero, then filled */
  uint64_t fresh[4]; /* stripe k (bit k) lay in fresh pages at the fill: left zero (see fill_blk) */
} blk_t;
#define FRESH_BITS 256

static blk_t live[MAXLIVE];
static int trace; /* FUZZ_KEEL_TRACE=1: print every step (to debug a crash input) */
/* FUZZ_KEEL_ALIGN_MAX=N: cap the alignments asked for (to fuzz past a known bug with
 * huge alignments; see tests/faults/test_huge_unit_share.c). Default: no cap. */
static size_t align_max = SIZE_MAX;

/* The last steps, printed when a check fails (a crash may depend on earlier inputs of
 * the same process, so the input file alone may not replay it). */
#define RING 256
static struct {
  unsigned long long input, step;
  int op, slot;
  void* p;
  size_t n;
  const char* what;
} ring[RING];
static unsigned long long ring_n;
static void note(int op, int slot, void* p, size_t n, const char* what);
static void dump_ring(void);
#define TRACE(...) \
  do {             \
    if (trace) fprintf(stderr, __VA_ARGS__); \
  } while (0)
static size_t live_bytes;
static size_t page_size;
static unsigned long long stat_ops, stat_inputs;

/* ---------------------------------------------------------------- failing --- */

#define FAIL(...)                                                       \
  do {                                                                  \
    dump_ring();                                                        \
    fprintf(stderr, "fuzz_keel: FAILED at %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                                       \
    fprintf(stderr, "\n");                                              \
    abort();                                                            \
  } while (0)

static unsigned long long cur_step;
static void note(int op, int slot, void* p, size_t n, const char* what) {
  unsigned long long i = ring_n++ % RING;
  ring[i].input = stat_inputs;
  ring[i].step = cur_step;
  ring[i].op = op;
  ring[i].slot = slot;
  ring[i].p = p;
  ring[i].n = n;
  ring[i].what = what;
}
static void dump_ring(void) {
  unsigned long long from = ring_n > RING ? ring_n - RING : 0;
  fprintf(stderr, "fuzz_keel: the last %llu events (input, step, op, slot, pointer, size):\n",
          ring_n - from);
  for (unsigned long long k = from; k < ring_n; k++) {
    unsigned long long i = k % RING;
    fprintf(stderr, "  in %llu step %llu op %d slot %d %s %p %zu\n", ring[i].input, ring[i].step,
            ring[i].op, ring[i].slot, ring[i].what, ring[i].p, ring[i].n);
  }
}

/* ---------------------------------------------------------------- pattern --- */

/* The pattern loops are the harness's hot spot: no coverage instrumentation there
 * (comparison tracing would dominate the run and teaches the fuzzer nothing). */
#define NOCOV __attribute__((no_sanitize("coverage")))

#define PAT_K 0x9E3779B97F4A7C15ull
NOCOV static inline unsigned char pat(uint64_t seed, size_t i) {
  uint64_t x = (seed + (i >> 3)) * PAT_K;
  return (unsigned char)(x >> (8 * (i & 7)));
}

/* Byte i of the pattern is byte i % 8 of the little-endian word (seed + i / 8) * K, so
 * whole words are written and compared 8 bytes at a time; word w + 1 is word w plus K.
 * The checks test 64 bytes at a time (one branch, vectorised) and look closer only
 * where something differs: checking was a sixth of the fuzzer's own instructions. */
static inline uint64_t patw(uint64_t seed, size_t w) { return (seed + w) * PAT_K; }

NOCOV static void fill_range(unsigned char* p, size_t from, size_t to, uint64_t seed) {
  size_t i = from;
  for (; i < to && (i & 7); i++) p[i] = pat(seed, i);
  uint64_t v = patw(seed, i >> 3);
  for (; i + 8 <= to; i += 8, v += PAT_K) memcpy(p + i, &v, 8);
  for (; i < to; i++) p[i] = pat(seed, i);
}
NOCOV static size_t check_range(const unsigned char* p, size_t from, size_t to, uint64_t seed) {
  size_t i = from;
  for (; i < to && (i & 7); i++)
    if (p[i] != pat(seed, i)) return i;
  uint64_t v = patw(seed, i >> 3);
  for (; i + 64 <= to; i += 64) {
    uint64_t diff = 0, w = v;
    for (int k = 0; k < 8; k++, w += PAT_K) {
      uint64_t x;
      memcpy(&x, p + i + 8 * k, 8);
      diff |= x ^ w;
    }
    if (diff) break;
    v = w;
  }
  for (; i + 8 <= to; i += 8, v += PAT_K) {
    uint64_t x;
    memcpy(&x, p + i, 8);
    if (x != v) break;
  }
  for (; i < to; i++)
    if (p[i] != pat(seed, i)) return i;
  return SIZE_MAX;
}

/* The parts of [0, n) that are kept patterned: everything up to 8 KiB; above, the first
 * and last 4 KiB and 64 bytes of every 4 KiB page up to 64 KiB, of every 64 KiB beyond
 * (Keel's unit: large and huge blocks start on one, and no two blocks share one): the
 * stripes. Whole blocks of up to 128 KiB and a stripe in every page of the big ones
 * took two thirds of the fuzzer's time, in its own loops and in page faults. */
#define STRIPE(n) ((n) > (size_t)65536 ? (size_t)65536 : (size_t)4096)

/* Fresh pages. A page of Keel's (private, anonymous) memory that is neither present nor
 * swapped out reads as zero: the kernel has not handed it out since it was mapped or
 * purged. A stripe that lies in such pages at the fill is left alone (bit k of `fresh`)
 * and checked for zeroes instead - wherever the page has become present since: a block
 * that overlaps this one and wrote there shows. Writing the pattern there cost a page
 * fault (about 3 us here) for every fresh stripe: half the fuzzer's page faults, which
 * were two thirds of its time. What a page holds is read from /proc/self/pagemap (one
 * read for the block's pages); without it (or with meshing on: its pages are a file's)
 * every stripe is written, as before. */
static int pagemap_fd = -1;
#define PM_PAGES 4100 /* blocks of up to 16 MiB */
static __thread struct {
  uintptr_t first; /* page number of e[0] */
  size_t count;    /* 0: nothing known, no page is taken for fresh */
  uint64_t e[PM_PAGES];
} pm;
NOCOV static void pm_load(const void* p, size_t n) {
  pm.count = 0;
  if (pagemap_fd < 0 || n == 0 || _keel_options.mesh != KEEL_MESH_OFF) return;
  uintptr_t first = (uintptr_t)p / page_size, last = ((uintptr_t)p + n - 1) / page_size;
  size_t bytes = (last - first + 1) * sizeof pm.e[0];
  if (last - first + 1 > PM_PAGES) return;
  if (pread(pagemap_fd, pm.e, bytes, (off_t)(first * sizeof pm.e[0])) != (ssize_t)bytes) return;
  pm.first = first;
  pm.count = last - first + 1;
}
/* Whether [p + from, p + to) lies in fresh pages (as pm_load found them). */
NOCOV static int pm_fresh(const unsigned char* p, size_t from, size_t to) {
  if (pm.count == 0 || from >= to) return 0;
  for (uintptr_t pg = ((uintptr_t)p + from) / page_size; pg <= ((uintptr_t)p + to - 1) / page_size; pg++)
    if (pg < pm.first || pg - pm.first >= pm.count || (pm.e[pg - pm.first] >> 61) != 0)
      return 0; /* present (bit 63), swapped (62), file or shared (61) */
  return 1;
}
NOCOV static size_t zero_range(const unsigned char* p, size_t from, size_t to) {
  size_t i = from;
  for (; i < to && (i & 7); i++)
    if (p[i]) return i;
  for (; i + 64 <= to; i += 64) {
    uint64_t any = 0;
    for (int k = 0; k < 8; k++) {
      uint64_t x;
      memcpy(&x, p + i + 8 * k, 8);
      any |= x;
    }
    if (any) break;
  }
  for (; i + 8 <= to; i += 8) {
    uint64_t v;
    memcpy(&v, p + i, 8);
    if (v) break;
  }
  for (; i < to; i++)
    if (p[i]) return i;
  return SIZE_MAX;
}
static int fresh_bit(const blk_t* b, unsigned k) { return k < FRESH_BITS && (b->fresh[k / 64] >> (k % 64) & 1); }

NOCOV static void fill_blk(blk_t* b) {
  unsigned char* p = b->p;
  size_t n = b->usable;
  memset(b->fresh, 0, sizeof b->fresh);
  if (n <= BIG) {
    fill_range(p, 0, n, b->seed);
    return;
  }
  pm_load(p, n);
  fill_range(p, 0, 4096, b->seed);
  unsigned k = 0;
  for (size_t off = STRIPE(n); off + 4096 < n; off += STRIPE(n), k++) {
    /* (A stripe that runs into the last 4 KiB gets the pattern the tail writes there.) */
    if (k < FRESH_BITS && off + 64 <= n - 4096 && pm_fresh(p, off, off + 64)) b->fresh[k / 64] |= 1ull << (k % 64);
    else fill_range(p, off, off + 64, b->seed);
  }
  fill_range(p, n - 4096, n, b->seed);
}
/* Checks the bytes of [0, keep) of q that block b kept patterned (or zero) - b itself
 * (q = b->p, keep = b->usable), or where a realloc moved or resized it. The offset of
 * the first wrong byte, SIZE_MAX if none. */
NOCOV static size_t check_stripes(const unsigned char* q, const blk_t* b, size_t keep) {
  size_t n = b->usable;
  if (n <= BIG) return check_range(q, 0, keep, b->seed);
  size_t r = check_range(q, 0, keep < 4096 ? keep : 4096, b->seed);
  int loaded = 0;
  unsigned k = 0;
  for (size_t off = STRIPE(n); r == SIZE_MAX && off + 4096 < n && off < keep; off += STRIPE(n), k++) {
    size_t to = off + 64 < keep ? off + 64 : keep;
    if (!fresh_bit(b, k)) {
      r = check_range(q, off, to, b->seed);
      continue;
    }
    if (!loaded) pm_load(q, keep); /* a page still fresh is zero: not read (no fault) */
    loaded = 1;
    if (!pm_fresh(q, off, to)) r = zero_range(q, off, to);
  }
  if (r == SIZE_MAX && n - 4096 < keep) r = check_range(q, n - 4096, keep, b->seed);
  return r;
}
static void check_blk(const blk_t* b, const char* when) {
  size_t off = check_stripes(b->p, b, b->usable);
  if (off != SIZE_MAX)
    FAIL("%s: block %p (size %zu, usable %zu, align %zu) corrupted at offset %zu%s", when,
         (void*)b->p, b->n, b->usable, b->align, off,
         off >= 4096 && off + 4096 < b->usable && fresh_bit(b, (unsigned)(off / STRIPE(b->usable) - 1))
             ? " (a stripe left fresh at the fill: zero expected)" : "");
}
/* Keel's page map must still describe a live block as live. */
static void check_kind(const blk_t* b) {
  uint8_t k = keel_pagemap_get(b->p);
  /* (CARVED: a slab whose holes hold blocks of smaller classes, the block one of either.) */
  int ok = (k >= 1 && k < KEEL_NUM_CLASSES) || k == KEEL_KIND_LARGE || k == KEEL_KIND_HUGE ||
           k == KEEL_KIND_CARVED;
  if (!ok)
    FAIL("live block %p (size %zu, usable %zu, align %zu): page map says 0x%02x", (void*)b->p,
         b->n, b->usable, b->align, k);
}
static void check_edges(const blk_t* b) {
  check_kind(b);
  size_t u = b->usable, k = u < 16 ? u : 16;
  size_t off = check_range(b->p, 0, k, b->seed);
  if (off == SIZE_MAX) off = check_range(b->p, u - k, u, b->seed);
  if (off != SIZE_MAX)
    FAIL("block %p (size %zu, usable %zu) corrupted at offset %zu (edge check)", (void*)b->p, b->n,
         b->usable, off);
}
/* calloc's zeroes: every byte up to 8 KiB; above, the parts the pattern keeps (where a
 * block's earlier life left its marks: slab pages are filled whole, big blocks on these
 * stripes) and one 64-byte window at an offset the seed picks, so that over many calls
 * every page is sampled. Fresh pages are zero and not read (a read would fault the
 * zero page in, and the fill's write fault again). Reading every page of a calloc'ed
 * block (up to 64 MiB) was a third of the fuzzer's page faults; inlined into adopt(),
 * the byte loop was also instrumented, a comparison callback per byte. */
NOCOV static size_t zero_part(const unsigned char* p, size_t from, size_t to) {
  return pm_fresh(p, from, to) ? SIZE_MAX : zero_range(p, from, to);
}
NOCOV __attribute__((noinline)) static size_t zero_check(const unsigned char* p, size_t n, uint64_t seed) {
  if (n <= BIG) return zero_range(p, 0, n);
  pm_load(p, n);
  size_t r = zero_part(p, 0, 4096);
  for (size_t off = STRIPE(n); r == SIZE_MAX && off + 4096 < n; off += STRIPE(n)) r = zero_part(p, off, off + 64);
  if (r == SIZE_MAX) r = zero_part(p, n - 4096, n);
  size_t w = (size_t)(patw(seed, 0) >> 16) % (n - 64) & ~(size_t)63;
  if (r == SIZE_MAX) r = zero_part(p, w, w + 64);
  return r;
}

/* ----------------------------------------------------------------- input --- */

typedef struct {
  const uint8_t* d;
  size_t n, i;
} in_t;

static uint8_t u8(in_t* in) { return in->i < in->n ? in->d[in->i++] : 0; }
static uint32_t u32(in_t* in) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) v |= (uint32_t)u8(in) << (8 * k);
  return v;
}

static const size_t edge_sizes[] = {
    0,       1,       15,      16,      17,      1023,    1024,    1025,    4095,     4096,
    4097,    65535,   65536,   65537,   131071,  131072,  131073,  1048575, 1048576,  1048577,
    2097152, 4194304, 4194305, 6291456, 8388608,
};
#define NEDGE (sizeof edge_sizes / sizeof edge_sizes[0])

static size_t get_size(in_t* in) {
  uint8_t t = u8(in);
  uint32_t r = u32(in);
  /* Mostly small blocks, as servers allocate (and where Keel's tiers are most
   * intricate); a block of 1-8 MiB costs the fuzzer a fresh mapping's page faults. */
  if (t < 110) return 1 + r % 256;
  if (t < 180) return 257 + r % 16128;
  if (t < 215) return 16385 + r % (131072 + 4096 - 16384);
  if (t < 235) return 131073 + r % (1048576 + 4096 - 131072);
  if (t < 240) return 1048577 + r % (7u << 20);
  if (t < 254) return edge_sizes[r % NEDGE];
  /* absurd: must fail with ENOMEM */
  static const size_t absurd[] = {SIZE_MAX, SIZE_MAX - 4095, (size_t)PTRDIFF_MAX,
                                  (size_t)PTRDIFF_MAX + 1, (size_t)1 << 62};
  return absurd[r % 5];
}
static int absurd_size(size_t n) { return n >= ((size_t)1 << 62); }
#define HUGE_FROM ((size_t)1 << 20) /* KEEL_LARGE_MAX: larger blocks get their own mapping */

static size_t get_align(in_t* in, int* valid_posix) {
  static const size_t al[] = {0,       1,        2,       3,       4,      8,      16,
                              24,      32,       48,      64,      100,    128,    256,
                              512,     1024,     2048,    4096,    8192,   16384,  32768,
                              65536,   131072,   262144,  1 << 20, 2 << 20, 4 << 20, 8 << 20,
                              (size_t)1 << 40,   ((size_t)1 << 63) + 1, (size_t)1 << 63,
                              SIZE_MAX};
  size_t a = al[u8(in) % (sizeof al / sizeof al[0])];
  if (a > align_max && a <= ((size_t)1 << 63)) a = align_max;
  *valid_posix = a != 0 && (a & (a - 1)) == 0 && a % sizeof(void*) == 0;
  return a;
}

/* ---------------------------------------------------------------- helper --- */

typedef enum { H_IDLE, H_FREE, H_ALLOC, H_EXIT } hcmd_t;
static pthread_mutex_t hmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hcv = PTHREAD_COND_INITIALIZER;
static hcmd_t hcmd = H_IDLE;
static int hbusy;
static blk_t hq[MAXLIVE]; /* blocks handed to the helper (H_FREE) or made by it (H_ALLOC) */
static size_t hq_n, halloc_sizes[8], halloc_n;
static pthread_t helper;
static int helper_up;
/* A helper lives for at least helper_life operations (counted across inputs) before an
 * exit step ends it: starting and ending a thread (ASan's stack shadow and thread state,
 * glibc's stack, the hand-offs, 17 page faults) took a sixth of the fuzzer's time at one
 * exit an input (about 80 operations); Keel's part (a thread cache built up, flushed at
 * exit) is the same in a thread that lived longer. FUZZ_KEEL_HELPER_LIFE=0: every exit
 * step ends it (to replay a crash input alone). */
static unsigned long long helper_born, helper_life = 512, helpers_ended;

static void* helper_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&hmu);
  for (;;) {
    while (!hbusy) pthread_cond_wait(&hcv, &hmu);
    if (hcmd == H_EXIT) {
      hbusy = 0;
      pthread_cond_broadcast(&hcv);
      pthread_mutex_unlock(&hmu);
      return NULL;
    }
    if (hcmd == H_FREE) {
      for (size_t i = 0; i < hq_n; i++) {
        check_blk(&hq[i], "cross-thread free");
        if (i & 1) keel_free(hq[i].p);
        else keel_free_sized(hq[i].p, hq[i].n);
      }
      hq_n = 0;
    } else if (hcmd == H_ALLOC) {
      hq_n = 0;
      for (size_t i = 0; i < halloc_n; i++) {
        size_t n = halloc_sizes[i];
        unsigned char* p = (unsigned char*)keel_malloc(n);
        if (!p) FAIL("helper: malloc(%zu) failed", n);
        blk_t b = {p, n, keel_malloc_usable_size(p), 16, 0x1234 + i * 77 + n, 0, {0}};
        if (b.usable < n) FAIL("helper: usable %zu < %zu", b.usable, n);
        fill_blk(&b);
        hq[hq_n++] = b;
      }
    }
    hbusy = 0;
    pthread_cond_broadcast(&hcv);
  }
}

static void helper_run(hcmd_t c) {
  if (!helper_up) {
    if (pthread_create(&helper, NULL, helper_main, NULL) != 0) FAIL("pthread_create");
    helper_up = 1;
    helper_born = stat_ops;
  }
  pthread_mutex_lock(&hmu);
  hcmd = c;
  hbusy = 1;
  pthread_cond_broadcast(&hcv);
  while (hbusy) pthread_cond_wait(&hcv, &hmu);
  pthread_mutex_unlock(&hmu);
  if (c == H_EXIT) {
    pthread_join(helper, NULL);
    helper_up = 0;
    helpers_ended++;
  }
}

/* ----------------------------------------------------------------- model --- */

static void forget(int slot) {
  live_bytes -= live[slot].usable;
  live[slot].p = NULL;
}

/* Registers a fresh block in slot: checks alignment and usable size, zeroes for calloc,
 * then fills the whole usable size. */
static void adopt(int slot, void* p, size_t n, size_t align, int zeroed, uint64_t seed) {
  blk_t* b = &live[slot];
  if ((uintptr_t)p % align != 0) FAIL("%p (size %zu) not aligned to %zu", p, n, align);
  size_t u = keel_malloc_usable_size(p);
  if (u < n) FAIL("usable size %zu < requested %zu for %p", u, n, p);
  /* Keel (like glibc) keeps a block that realloc shrinks to half or more. */
  if (u > 2 * n + ((size_t)128 << 10) + align)
    FAIL("usable size %zu is far above the request %zu (align %zu)", u, n, align);
  if (zeroed) {
    size_t off = zero_check((unsigned char*)p, n, seed);
    if (off != SIZE_MAX) FAIL("calloc(%zu) block %p is not zeroed at offset %zu", n, p, off);
  }
  TRACE("  slot %d <- %p size %zu usable %zu align %zu%s\n", slot, p, n, u, align, zeroed ? " (calloc)" : "");
  note(-1, slot, p, n, "adopt");
  b->p = (unsigned char*)p;
  b->n = n;
  b->usable = u;
  b->align = align;
  b->seed = seed;
  b->zero = zeroed;
  live_bytes += u;
  fill_blk(b);
}

static void release(int slot, int how) {
  blk_t* b = &live[slot];
  TRACE("  free slot %d %p (size %zu) how %d\n", slot, (void*)b->p, b->n, how % 4);
  note(how % 4, slot, b->p, b->n, "free");
  check_blk(b, "before free");
  switch (how % 4) {
    case 0: keel_free(b->p); break;
    case 1: keel_free_sized(b->p, b->n); break;
    case 2: keel_free_aligned_sized(b->p, b->align, b->n); break;
    default:
      if (keel_realloc(b->p, 0) != NULL) FAIL("realloc(p, 0) did not return NULL");
      break;
  }
  forget(slot);
}

/* The corruption trial (see the header): in a fresh process, the link of a block just
 * freed into its bin is overwritten, then its class is allocated until the link is
 * followed; the process must die of SIGABRT with the free list named.
 *
 * The process is this program started again (posix_spawn of its own path with
 * FUZZ_KEEL_TRIAL set: LLVMFuzzerInitialize runs the trial and never returns), not a
 * fork: a fork copied the fuzzer's page tables (hundreds of MB: ASan, the corpus, the
 * live blocks), and each page the fuzzer wrote afterwards faulted once more (12,000
 * faults a trial); a spawn (no page tables copied) costs the same few milliseconds at
 * any heap size: 8 % more operations per CPU second. Each trial also gets its own link
 * secret and address layout (a fork child had its parent's, one per fuzzing process). Its
 * heap is not the fuzzer's: a warm-up the trial's value drives (blocks of several
 * classes, the trial's among them, some freed) gives it partly used slabs and a bin
 * with other blocks beside the two of the trial. */
static unsigned long long corruptions;
struct trial_s {
  size_t n;
  unsigned how;
  uint64_t value;
};
static uint64_t mix64(uint64_t* x) { /* splitmix64 */
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* In the trial process: a warm-up, then two blocks freed into their bin, the top one's
 * link overwritten, then its class allocated until the link is followed. */
static void corrupt_and_allocate(const struct trial_s* t) {
  uint64_t x = t->value ^ t->n;
  void* warm[256];
  /* Blocks of the trial's class allocated and freed (a bin grows by the frees that
   * overflow it, from one block: a fresh process's bins hold one), blocks of other
   * sizes beside them, some of them kept. */
  int k = 64 + (int)(mix64(&x) % 192);
  for (int i = 0; i < k; i++) {
    uint64_t r = mix64(&x);
    size_t n = r % 4 < 2 ? t->n : r % 4 == 2 ? 1 + (r >> 8) % 1024 : 1 + (r >> 8) % (64u << 10);
    warm[i] = keel_malloc(n);
  }
  for (int i = 0; i < k; i++)
    if (mix64(&x) % 8 != 0) keel_free(warm[i]);
  void* a = keel_malloc(t->n);
  void* b = keel_malloc(t->n);
  unsigned cls = keel_pagemap_get(b);
  if (a == NULL || b == NULL || cls == 0 || cls >= KEEL_NUM_CLASSES) _exit(77); /* not a bin's block */
  keel_free(a);
  keel_free(b);
  if (t->how & 1) { /* an overflow's plain pointer (never 0: a list cut short is no corruption) */
    uintptr_t forged = (uintptr_t)(t->value & ~(uint64_t)15);
    if (forged == 0) forged = 16;
    memcpy(b, &forged, sizeof forged);
  } else { /* one of the link's low four bits flipped */
    ((unsigned char*)b)[0] ^= (unsigned char)(1u << ((t->how >> 1) % 4));
  }
  for (int i = 0; i < 256; i++) keel_malloc(_keel_classes[cls].size);
}
#define TRIAL_ENV "FUZZ_KEEL_TRIAL"
/* LLVMFuzzerInitialize, in the trial process (before libFuzzer sets up anything). */
static void trial_main(const char* spec) {
  struct trial_s t;
  unsigned long long n, v;
  if (sscanf(spec, "%llu %u %llu", &n, &t.how, &v) != 3) _exit(78);
  t.n = (size_t)n;
  t.value = v;
  signal(SIGABRT, SIG_DFL);
  corrupt_and_allocate(&t);
  _exit(0);
}
extern char** environ;
static char exe_path[4096]; /* this program (readlink of /proc/self/exe, at start-up) */
static unsigned long long trials_unrun;
/* Runs the trial in a spawned process with stderr into `report` (NUL-terminated).
 * Returns its wait status, -1 if it could not be run. */
static int spawn_trial(const struct trial_s* t, char* report, size_t cap) {
  static char** envp;
  static size_t env_n;
  static char var[96];
  if (!envp) { /* our environment and the trial's variable (the environment does not change) */
    while (environ[env_n]) env_n++;
    envp = (char**)calloc(env_n + 2, sizeof *envp);
    if (!envp) return -1;
    memcpy(envp, environ, env_n * sizeof *envp);
  }
  snprintf(var, sizeof var, TRIAL_ENV "=%llu %u %llu", (unsigned long long)t->n, t->how,
           (unsigned long long)t->value);
  envp[env_n] = var;
  envp[env_n + 1] = NULL;
  int fds[2];
  report[0] = 0;
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2); /* dup2 clears close-on-exec */
  char* argv[] = {(char*)"fuzz_keel-trial", NULL};
  pid_t pid;
  int rc = exe_path[0] ? posix_spawn(&pid, exe_path, &fa, NULL, argv, envp) : ENOENT;
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  size_t len = 0;
  while (rc == 0 && len < cap - 1) {
    ssize_t r = read(fds[0], report + len, cap - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len += (size_t)r;
  }
  report[len] = 0;
  close(fds[0]);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

static void corruption_trial(in_t* in) {
  struct trial_s t = {1 + u32(in) % 1024, u8(in), 0};
  t.value = (uint64_t)u32(in) << 16 ^ u32(in);
  char report[512];
  int status = spawn_trial(&t, report, sizeof report);
  if (status == -1) trials_unrun++;
  if (status == -1 || (WIFEXITED(status) && WEXITSTATUS(status) == 77)) return;
  corruptions++;
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(report, "free list of the") != NULL))
    FAIL("corrupted link (%s, size %zu) not stopped cleanly: status %#x, report: %s",
         t.how & 1 ? "plain pointer" : "low bit flipped", t.n, status, report);
}

static int fits(size_t n) { return n < LIVE_CAP && live_bytes + n < LIVE_CAP; }

/* An allocation result: p may be NULL only when `may_fail` (failing mmaps, absurd
 * requests); then errno must be ENOMEM (EINVAL where einval_ok). */
static int expect(void* p, int err, int may_fail, const char* call, size_t n) {
  if (p) return 1;
  if (!may_fail) FAIL("%s(%zu) returned NULL (errno %d) without a reason", call, n, err);
  if (err != ENOMEM) FAIL("%s(%zu) returned NULL with errno %d, expected ENOMEM", call, n, err);
  return 0;
}

static void end_input(void) {
  _keel_prim_fail_maps(0);
  if (helper_up && hq_n) helper_run(H_FREE);
  for (int i = 0; i < MAXLIVE; i++)
    if (live[i].p) release(i, i);
  if (live_bytes != 0) FAIL("live byte count %zu after freeing everything", live_bytes);
  /* Keel's own count agrees: nothing of the program's is live (a free that kept its
   * block, a block counted twice). Not after a helper thread ended and before the next
   * starts: glibc's pthread_create callocs the thread's DTV (17 x 16 bytes here) and
   * keeps it with the ended thread's cached stack until a new thread reuses the stack,
   * so it is live then (glibc's own mallinfo2 counts it the same way). */
  keel_stats_t st = {.size = sizeof st};
  if ((helper_up || helpers_ended == 0) && keel_stats_get(&st) == 0 && st.allocated != 0)
    FAIL("keel_stats_get counts %llu bytes allocated (%llu huge) after every block was freed",
         (unsigned long long)st.allocated, (unsigned long long)st.huge_allocated);
  if (stat_inputs % 64 == 0) _keel_verify();
}

#define EDGE_WINDOW 2
#define WALK_EVERY 32768
#define CORRUPT_EVERY 16384
static unsigned edge_next; /* the next live slot whose edges are checked */

static void verify_all(void) {
  for (int i = 0; i < MAXLIVE; i++)
    if (live[i].p) check_blk(&live[i], "periodic check");
  _keel_verify();
}

static double start_s;
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
/* scripts/fuzz.sh reads this line: how much the allocator was exercised. */
static void report_ops(void) {
  double secs = now_s() - start_s;
  fprintf(stderr, "fuzz_keel: %llu allocator operations in %llu inputs, %.0f s (%.0f per second); %llu corrupted links stopped\n",
          stat_ops, stat_inputs, secs, secs > 0 ? (double)stat_ops / secs : 0.0, corruptions);
  fprintf(stderr, "fuzz_keel: %llu helper threads ended\n", helpers_ended);
  if (trials_unrun) fprintf(stderr, "fuzz_keel: %llu corruption trials could not be started\n", trials_unrun);
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  const char* trial = getenv(TRIAL_ENV);
  if (trial) trial_main(trial);
  /* The path, not /proc/self/exe itself: under valgrind that is valgrind (it answers
   * readlink with the program's path). */
  ssize_t len = readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
  exe_path[len > 0 ? len : 0] = 0;
  start_s = now_s();
  atexit(report_ops);
  page_size = (size_t)sysconf(_SC_PAGESIZE);
  if (!getenv("FUZZ_KEEL_NO_FRESH")) pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  trace = getenv("FUZZ_KEEL_TRACE") != NULL;
  if (getenv("FUZZ_KEEL_ALIGN_MAX")) align_max = strtoull(getenv("FUZZ_KEEL_ALIGN_MAX"), NULL, 0);
  if (getenv("FUZZ_KEEL_HELPER_LIFE")) helper_life = strtoull(getenv("FUZZ_KEEL_HELPER_LIFE"), NULL, 0);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  in_t in = {data, size, 0};
  long inject = 0; /* failing mmaps are armed for this many more steps */
  stat_inputs++;
  for (unsigned step = 0; in.i < in.n && step < 4096; step++) {
    uint8_t op = u8(&in);
    int slot = u8(&in) % MAXLIVE;
    blk_t* b = &live[slot];
    uint64_t seed = ((uint64_t)step << 32) ^ (uint64_t)in.i * 0x9E3779B97F4A7C15ull ^ op;
    int may_fail = inject > 0;
    stat_ops++;
    TRACE("step %u: op %u slot %d%s\n", step, op % 20, slot, may_fail ? " (mmap failing)" : "");
    cur_step = step;
    note(op % 20, slot, b->p, b->n, "step");
    switch (op % 20) {
      case 0:
      case 1: { /* malloc */
        size_t n = get_size(&in);
        if (b->p) release(slot, op);
        if (!absurd_size(n) && !fits(n)) break;
        errno = 0;
        void* p = keel_malloc(n);
        if (expect(p, errno, may_fail || absurd_size(n), "malloc", n)) {
          if (absurd_size(n)) FAIL("malloc(%zu) succeeded", n);
          adopt(slot, p, n, 16, 0, seed);
        }
        break;
      }
      case 2: { /* calloc */
        size_t n = get_size(&in);
        size_t cnt = 1 + u8(&in) % 8;
        /* The count multiplies small and large sizes only: a huge calloc (over 1 MiB, its
         * own mapping) is as big as a huge malloc. Keel zeroes a reused huge mapping whole,
         * and the model's stripes leave most of its pages untouched, so that memset
         * faults them in: callocs of up to 64 MiB were a quarter of the fuzzer's page
         * faults. (Keel's calloc path depends on the total alone.) */
        if (!absurd_size(n) && n * cnt > HUGE_FROM) cnt = 1;
        if (b->p) release(slot, op);
        size_t total;
        int ovf = __builtin_mul_overflow(n, cnt, &total);
        if (!ovf && !absurd_size(total) && !fits(total)) break;
        errno = 0;
        void* p = keel_calloc(cnt, n);
        int must_fail = ovf || absurd_size(total);
        if (expect(p, errno, may_fail || must_fail, "calloc", total)) {
          if (must_fail) FAIL("calloc(%zu, %zu) succeeded", cnt, n);
          adopt(slot, p, total, 16, 1, seed);
        }
        break;
      }
      case 3:
      case 4: { /* realloc */
        size_t n = get_size(&in);
        if (!absurd_size(n) && !fits(n + (b->p ? 0 : 0))) break;
        errno = 0;
        if (!b->p) {
          void* p = keel_realloc(NULL, n);
          if (expect(p, errno, may_fail || absurd_size(n), "realloc(NULL)", n))
            adopt(slot, p, n, 16, 0, seed);
          break;
        }
        check_blk(b, "before realloc");
        if (n == 0) {
          if (keel_realloc(b->p, 0) != NULL) FAIL("realloc(p, 0) did not return NULL");
          forget(slot);
          break;
        }
        void* q = keel_realloc(b->p, n);
        if (!expect(q, errno, may_fail || absurd_size(n), "realloc", n)) {
          check_blk(b, "after failed realloc"); /* untouched, still ours */
          break;
        }
        if ((uintptr_t)q % 16) FAIL("realloc result %p not 16-aligned", q);
        size_t keep = b->n < n ? b->n : n;
        size_t off = check_stripes((unsigned char*)q, b, keep);
        if (off != SIZE_MAX)
          FAIL("realloc %p (%zu) -> %p (%zu) lost data at offset %zu", (void*)b->p, b->n, q, n, off);
        forget(slot);
        adopt(slot, q, n, 16, 0, seed);
        break;
      }
      case 5: { /* reallocarray, with overflow */
        size_t n = get_size(&in) % (1u << 20);
        size_t cnt = u8(&in) == 255 ? SIZE_MAX / 2 : 1 + u8(&in) % 4;
        size_t total;
        int ovf = __builtin_mul_overflow(n, cnt, &total);
        if (!ovf && !fits(total)) break;
        errno = 0;
        void* q = keel_reallocarray(b->p, cnt, n);
        if (ovf) {
          if (q) FAIL("reallocarray overflow succeeded");
          if (errno != ENOMEM) FAIL("reallocarray overflow: errno %d", errno);
          if (b->p) check_blk(b, "after reallocarray overflow");
          break;
        }
        if (total == 0 && b->p) { /* realloc(p, 0) semantics */
          if (q) FAIL("reallocarray(p, 0) returned %p", q);
          forget(slot);
          break;
        }
        if (!expect(q, errno, may_fail, "reallocarray", total)) break;
        if (b->p) {
          size_t keep = b->n < total ? b->n : total;
          size_t off = check_stripes((unsigned char*)q, b, keep);
          if (off != SIZE_MAX) FAIL("reallocarray lost data at %zu", off);
          forget(slot);
        }
        adopt(slot, q, total, 16, 0, seed);
        break;
      }
      case 6:
      case 7: { /* posix_memalign */
        int valid;
        size_t a = get_align(&in, &valid);
        size_t n = get_size(&in);
        if (b->p) release(slot, op);
        if (!absurd_size(n) && !fits(n + (a < (1u << 24) ? a : 0))) break;
        void* out = (void*)0x1;
        int rc = keel_posix_memalign(&out, a, n);
        if (!valid) {
          if (rc != EINVAL) FAIL("posix_memalign(align %zu) = %d, expected EINVAL", a, rc);
          if (out != (void*)0x1) FAIL("posix_memalign changed *out on EINVAL");
          break;
        }
        int may = may_fail || absurd_size(n) || a > ((size_t)1 << 30);
        if (rc != 0) {
          if (!may) FAIL("posix_memalign(%zu, %zu) = %d", a, n, rc);
          if (rc != ENOMEM) FAIL("posix_memalign(%zu, %zu) = %d, expected ENOMEM", a, n, rc);
          if (out != (void*)0x1) FAIL("posix_memalign changed *out on failure");
          break;
        }
        if (absurd_size(n)) FAIL("posix_memalign(%zu, %zu) succeeded", a, n);
        adopt(slot, out, n, a < 16 ? 16 : a, 0, seed);
        break;
      }
      case 8:
      case 9: { /* aligned_alloc / memalign: glibc 2.36 semantics */
        int valid;
        size_t a = get_align(&in, &valid);
        size_t n = get_size(&in);
        if (b->p) release(slot, op);
        size_t eff = a <= 16 ? 16 : a;
        if (a > 16 && (a & (a - 1))) { /* rounded up to a power of two */
          eff = 1;
          while (eff < a && eff) eff <<= 1;
        }
        int einval = a > ((size_t)1 << 63);
        if (!absurd_size(n) && !einval && !fits(n + (eff < (1u << 24) ? eff : 0))) break;
        errno = 0;
        void* p = op % 20 == 8 ? keel_aligned_alloc(a, n) : keel_memalign(a, n);
        int err = errno;
        if (einval) {
          if (p || err != EINVAL) FAIL("memalign(align %zu) = %p errno %d, expected EINVAL", a, p, err);
          break;
        }
        int may = may_fail || absurd_size(n) || eff > ((size_t)1 << 30);
        if (expect(p, err, may, "memalign", n)) {
          if (absurd_size(n)) FAIL("memalign(%zu, %zu) succeeded", a, n);
          adopt(slot, p, n, eff, 0, seed);
        }
        break;
      }
      case 10: { /* valloc / pvalloc */
        size_t n = get_size(&in) % (3u << 20);
        int pv = u8(&in) & 1;
        if (b->p) release(slot, op);
        size_t want = pv ? (n ? (n + page_size - 1) / page_size * page_size : page_size) : n;
        if (!fits(want + page_size)) break;
        errno = 0;
        void* p = pv ? keel_pvalloc(n) : keel_valloc(n);
        if (expect(p, errno, may_fail, pv ? "pvalloc" : "valloc", n)) adopt(slot, p, want, page_size, 0, seed);
        break;
      }
      case 11:
      case 12: /* free */
        if (b->p) release(slot, op);
        else keel_free(NULL);
        break;
      case 13: /* usable size of a live block: stable */
        if (b->p) {
          size_t u = keel_malloc_usable_size(b->p);
          if (u != b->usable) FAIL("usable size of %p changed: %zu -> %zu", (void*)b->p, b->usable, u);
          check_blk(b, "usable size check");
        } else if (keel_malloc_usable_size(NULL) != 0) {
          FAIL("malloc_usable_size(NULL) != 0");
        }
        break;
      case 14: /* hand the block to the helper thread (freed there on the next sync) */
        if (b->p && hq_n < MAXLIVE) {
          check_blk(b, "before hand-over");
          hq[hq_n++] = *b;
          forget(slot);
        }
        break;
      case 15: { /* helper: free what it was given, then allocate blocks for us */
        if (inject > 0) break; /* the helper must not fail */
        if (hq_n) helper_run(H_FREE);
        halloc_n = u8(&in) % 8;
        for (size_t i = 0; i < halloc_n; i++) halloc_sizes[i] = 1 + u32(&in) % (200u << 10);
        size_t sum = 0;
        for (size_t i = 0; i < halloc_n; i++) sum += halloc_sizes[i] + 4096;
        if (!fits(sum)) halloc_n = 0;
        if (!halloc_n) break;
        helper_run(H_ALLOC);
        for (size_t i = 0; i < hq_n; i++) {
          int s = (slot + (int)i) % MAXLIVE;
          if (live[s].p) release(s, (int)i);
          live[s] = hq[i];
          live_bytes += hq[i].usable;
          check_blk(&live[s], "made by the helper");
        }
        hq_n = 0;
        break;
      }
      case 16: /* helper thread exits (its cache is flushed) and is started again later */
        if (helper_up && inject == 0 && stat_ops - helper_born >= helper_life) {
          if (hq_n) helper_run(H_FREE);
          helper_run(H_EXIT);
        }
        break;
      case 17: { /* flush, or (one time in eight) purge; the full walk has its schedule */
        if (u8(&in) % 8 == 0) keel_purge();
        else keel_thread_flush();
        break;
      }
      case 18: /* failing mmaps for the next few steps */
        inject = 1 + u8(&in) % 8;
        _keel_prim_fail_maps(1 + u8(&in) % 4 == 4 ? 1L << 30 : 1 + u8(&in) % 3);
        break;
      default: /* a block's contents */
        if (b->p) check_blk(b, "content check");
        break;
    }
    if (inject > 0 && --inject == 0) _keel_prim_fail_maps(0);
    if (b->p) check_edges(b);
    for (int i = 0; i < EDGE_WINDOW; i++, edge_next = (edge_next + 1) % MAXLIVE)
      if (live[edge_next].p) check_edges(&live[edge_next]);
    if (stat_ops % WALK_EVERY == 0) verify_all();
    /* On a schedule, not on the input's say: libFuzzer would learn to fork all the time. */
    if (stat_ops % CORRUPT_EVERY == 0 && inject == 0) corruption_trial(&in);
  }
  end_input();
  return 0;
}
