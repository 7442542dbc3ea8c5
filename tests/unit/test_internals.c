/* test_internals.c -- unit tests of Keel's internal structures, linked against the
 * static library so the hidden internal functions are reachable. */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/slab.h"
#include "core/thp.h"
#include "child_report.h"
#include "test.h"

/* The platform layer's clock, process id and sleep (prim_linux.c) agree with libc's. */
static void test_platform_calls(void) {
  TEST_SECTION("platform clock, process id and sleep");
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  uint64_t ns = _keel_prim_clock_ns();
  clock_gettime(CLOCK_MONOTONIC, &b);
  uint64_t lo = (uint64_t)a.tv_sec * 1000000000u + (uint64_t)a.tv_nsec;
  uint64_t hi = (uint64_t)b.tv_sec * 1000000000u + (uint64_t)b.tv_nsec;
  CHECK(lo <= ns && ns <= hi);
  uint64_t ms = _keel_prim_clock_ms(); /* the coarse clock: within a few ticks of it */
  CHECK(ms + 50 >= hi / 1000000u && ms <= hi / 1000000u + 50);
  CHECK(_keel_prim_getpid() == (int)getpid());
  uint64_t before = _keel_prim_clock_ns();
  _keel_prim_sleep_ms(20);
  CHECK(_keel_prim_clock_ns() - before >= 20000000u);
}

/* A helper thread (the purger) runs on a stack Keel maps, and a forked child, where the
 * thread does not exist, unmaps it (prim_linux.c): on glibc's cached stack its pages
 * stayed resident in every child of a forking server. */
static void* volatile helper_local;
static void* record_stack(void* arg) {
  (void)arg;
  volatile int here = 0;
  helper_local = (void*)&here;
  for (;;) _keel_prim_sleep_ms(1000);
  return NULL;
}

/* keel_popcount64 (base.h): the inline arithmetic where x86-64 lacks POPCNT, the builtin
 * elsewhere, both against a bit-by-bit count. */
static void test_popcount(void) {
  TEST_SECTION("popcount");
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint64_t v = i < 64 ? (uint64_t)1 << i : i < 128 ? ~(uint64_t)0 >> (i - 64) : x & (x >> (i % 7));
    unsigned bits = 0;
    for (uint64_t w = v; w; w >>= 1) bits += (unsigned)(w & 1);
    if (bits != keel_popcount64(v)) {
      CHECK_MSG(0, "keel_popcount64(%#llx) = %u, not %u", (unsigned long long)v, keel_popcount64(v), bits);
      return;
    }
  }
  EXPECT_EQ_U(0, keel_popcount64(0));
  EXPECT_EQ_U(64, keel_popcount64(~(uint64_t)0));
}

static void test_helper_stack_after_fork(void) {
  TEST_SECTION("a helper thread's stack is unmapped in a forked child");
  _keel_init();
  CHECK(_keel_prim_thread_start(record_stack, NULL));
  while (helper_local == NULL) _keel_prim_sleep_ms(1);
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  void* page = (void*)((uintptr_t)helper_local & ~(uintptr_t)(pg - 1));
  unsigned char resident;
  CHECK(mincore(page, pg, &resident) == 0); /* mapped in this process */
  pid_t child = fork();
  if (child == 0) _exit(mincore(page, pg, &resident) == -1 && errno == ENOMEM ? 0 : 1);
  int status = 0;
  CHECK(child > 0 && waitpid(child, &status, 0) == child);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the helper's stack is still mapped in the child");
}

/* A fork while another thread holds the heap profile's lock (recording a sample, writing
 * a profile): the child must find it free. It inherited it held once, and hung at its
 * first sample (stress.fork with KEEL_PROFILE_RATE set). Likewise a chunk the purger was
 * collapsing into huge pages (never released while it is) is not one in the child. */
static void* hold_profile_lock(void* arg) {
  keel_lock(_keel_lock_profile);
  __atomic_store_n((int*)arg, 1, __ATOMIC_RELEASE);
  _keel_prim_sleep_ms(100);
  keel_unlock(_keel_lock_profile);
  return NULL;
}

static void test_fork_profile_lock(void) {
  TEST_SECTION("a fork while another thread holds the profile's lock");
  _keel_init();
  int held = 0;
  pthread_t th;
  CHECK(pthread_create(&th, NULL, hold_profile_lock, &held) == 0);
  while (!__atomic_load_n(&held, __ATOMIC_ACQUIRE)) _keel_prim_sleep_ms(1);
  _keel_thp_promoting = (keel_chunk_t*)KEEL_CHUNK_SIZE; /* (no chunk: never compared equal) */
  pid_t child = fork();
  if (child == 0) {
    alarm(5);
    keel_lock(_keel_lock_profile);
    keel_unlock(_keel_lock_profile);
    _exit(_keel_thp_promoting == NULL ? 0 : 3);
  }
  _keel_thp_promoting = NULL;
  int status = 0;
  CHECK(child > 0 && waitpid(child, &status, 0) == child);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child found the profile's lock held or a chunk being collapsed (status %#x)", status);
  pthread_join(th, NULL);
}

static void test_size_classes(void) {
  TEST_SECTION("size classes");
  _keel_init();
  unsigned prev = 0;
  for (size_t n = 1; n <= KEEL_CLASS_MAX; n++) {
    unsigned cls = keel_fine_class(n);
    const keel_class_t* k = &_keel_classes[cls];
    if (!(cls >= 1 && cls < KEEL_NUM_CLASSES)) { CHECK_MSG(0, "class %u out of range for %zu", cls, n); break; }
    if (k->size < n) { CHECK_MSG(0, "class %u size %u < request %zu", cls, k->size, n); break; }
    if (cls < prev) { CHECK_MSG(0, "classes not monotonic at %zu", n); break; }
    /* The class is the smallest that fits: the one below is too small. */
    if (cls > 1 && _keel_classes[cls - 1].size >= n) { CHECK_MSG(0, "class below also fits %zu", n); break; }
    prev = cls;
  }
  CHECK(keel_fine_class(KEEL_CLASS_MAX) == KEEL_NUM_CLASSES - 1);
  /* Until the heap is big, a coarse class serves: every class up to 128 bytes, four per
   * doubling above, the smallest that fits; it never leaves more than a quarter of the
   * block as slack. */
  CHECK(!_keel_classes_are_fine());
  unsigned coarse = 0;
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    unsigned serving = _keel_class_serving[cls];
    const keel_class_t* k = &_keel_classes[serving];
    CHECK(serving >= cls && _keel_class_serving[serving] == serving);
    unsigned log = 31u - (unsigned)__builtin_clz(k->size);
    CHECK(k->size <= 128 || k->size % (1u << (log - 2)) == 0); /* 1.25, 1.5, 1.75, 2 x 2^log */
    for (unsigned c = cls; c < serving; c++) CHECK(_keel_class_serving[c] != c); /* smallest */
    if (_keel_classes[cls].size > 128) CHECK(k->size * 4 <= _keel_classes[cls].size * 5 + 64);
    coarse += serving == cls;
  }
  CHECK(coarse == 8 + 4 * 10); /* 16..128, then 160 .. 128 KiB */
  CHECK(keel_size_class(200) == keel_fine_class(224) && keel_size_class(1030) == keel_fine_class(1280));
  CHECK(keel_size_class(100) == keel_fine_class(100));
  CHECK(_keel_classes[keel_size_class(KEEL_CLASS_MAX)].size == KEEL_CLASS_MAX);
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    const keel_class_t* k = &_keel_classes[cls];
    CHECK(k->size % 16 == 0);
    CHECK(k->count >= 8 && k->count <= KEEL_SLAB_MAX_OBJECTS);
    CHECK((size_t)k->count * k->size <= (size_t)k->units * KEEL_UNIT_SIZE);
    CHECK(k->units >= 1 && k->units <= 16);
    CHECK(k->batch >= 1 && k->batch <= 32);
    if (k->size > KEEL_CACHED_MAX) { /* never cached: no bin, no parked batches */
      CHECK(k->bin_limit == 0 && k->transfer_max == 0);
    } else {
      CHECK(k->bin_limit >= 4 && k->bin_limit >= 2 * k->batch);
      CHECK(k->transfer_max >= 1 && k->transfer_max <= KEEL_TRANSFER_SLOTS);
    }
    /* The division magic is exact for every block offset in a slab. */
    size_t slab = (size_t)k->units * KEEL_UNIT_SIZE;
    for (size_t off = 0; off < slab; off += (off < 4096 ? 1 : 977)) {
      uint64_t q = ((uint64_t)off * k->div_magic) >> 40;
      if (q != off / k->size) { CHECK_MSG(0, "div magic wrong: class %u off %zu", cls, off); break; }
    }
    /* Slack inside a block is bounded: at most 1/8 above 1 KiB, 15 bytes below. */
    if (k->size > 1024) CHECK(_keel_classes[cls - 1].size * 9 >= k->size * 8 - 1);
  }
  /* The table is computed by the compiler (size_class.c): the same rules at run time. */
  CHECK(_keel_classes[0].size == 0 && _keel_classes[0].count == 0);
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    const keel_class_t* k = &_keel_classes[cls];
    size_t size;
    if (cls <= 64) {
      size = (size_t)cls * 16;
    } else {
      unsigned i = (cls - 65) % 9, b = 10 + (cls - 65) / 9;
      size = ((size_t)1 << b) + (i == 0 ? (size_t)1 << (b - 6) : (size_t)i << (b - 3));
    }
    size_t units = 16;
    for (size_t u = 1; u <= 16; u *= 2) {
      size_t bytes = u * KEEL_UNIT_SIZE, n = bytes / size;
      if (n >= 8 && (bytes - n * size) * 16 <= bytes) {
        units = u;
        break;
      }
    }
    size_t count = units * KEEL_UNIT_SIZE / size;
    if (count > KEEL_SLAB_MAX_OBJECTS) count = KEEL_SLAB_MAX_OBJECTS;
    size_t batch = 8192 / size < 1 ? 1 : 8192 / size > 32 ? 32 : 8192 / size;
    if (batch > 1) batch &= ~(size_t)1;
    size_t bin_floor = 2 * batch > 4 ? 2 * batch : 4;
    size_t bin = 16384 / size < bin_floor ? bin_floor : 16384 / size > 1024 ? 1024 : 16384 / size;
    size_t transfer = 16384 / (batch * size);
    transfer = transfer < 1 ? 1 : transfer > KEEL_TRANSFER_SLOTS ? KEEL_TRANSFER_SLOTS : transfer;
    if (size > KEEL_CACHED_MAX) bin = transfer = 0;
    uint64_t magic = (((uint64_t)1 << 40) + size - 1) / size;
    if (k->size != size || k->units != units || k->count != count || k->batch != batch ||
        k->bin_limit != bin || k->transfer_max != transfer || k->div_magic != magic) {
      CHECK_MSG(0, "class %u: table {%u, %u, %u, %u, %u, %u} against the rules {%zu, %zu, %zu, %zu, %zu, %zu}",
                cls, k->size, k->units, k->count, k->batch, k->bin_limit, k->transfer_max, size, units,
                count, batch, bin, transfer);
      break;
    }
  }
}

static void test_pagemap(void) {
  TEST_SECTION("page map");
  uintptr_t base = (uintptr_t)0x00007e0000000000ull; /* never mapped: map is only data */
  CHECK(keel_pagemap_get((void*)base) == KEEL_KIND_NONE);
  CHECK(_keel_pagemap_set(base, 3, 42));
  CHECK(keel_pagemap_get((void*)base) == 42);
  CHECK(keel_pagemap_get((void*)(base + KEEL_UNIT_SIZE * 2 + 123)) == 42);
  CHECK(keel_pagemap_get((void*)(base + KEEL_UNIT_SIZE * 3)) == KEEL_KIND_NONE);
  CHECK(keel_pagemap_get((void*)(base - 1)) == KEEL_KIND_NONE);
  /* A range across a 1 GiB leaf boundary. */
  uintptr_t edge = base + ((uintptr_t)1 << 30) - KEEL_UNIT_SIZE;
  CHECK(_keel_pagemap_set(edge, 2, 7));
  CHECK(keel_pagemap_get((void*)edge) == 7);
  CHECK(keel_pagemap_get((void*)(edge + KEEL_UNIT_SIZE)) == 7);
  CHECK(_keel_pagemap_set(base, 3, KEEL_KIND_NONE) && _keel_pagemap_set(edge, 2, KEEL_KIND_NONE));
  CHECK(keel_pagemap_get(NULL) == KEEL_KIND_NONE);
}

static void test_pageheap(void) {
  TEST_SECTION("page heap spans");
  bool zeroed;
  keel_slab_t* a = _keel_pageheap_alloc(1, 1, &zeroed);
  CHECK(a != NULL && zeroed);
  keel_chunk_t* c = keel_chunk_of(a);
  CHECK(c->magic == KEEL_CHUNK_MAGIC);
  CHECK(a != &c->units[0]); /* unit 0 is the header */
  keel_slab_t* b = _keel_pageheap_alloc(16, 1, &zeroed);
  CHECK(b != NULL && b->units == 16);
  /* An aligned span starts on a multiple of its alignment. */
  keel_slab_t* al = _keel_pageheap_alloc(4, 8, &zeroed);
  CHECK(al != NULL);
  if (al) CHECK(((uintptr_t)keel_unit_addr(keel_chunk_of(al), (unsigned)(al - keel_chunk_of(al)->units)) & (8 * KEEL_UNIT_SIZE - 1)) == 0);
  /* Every unit of a span points at its head. */
  keel_chunk_t* bc = keel_chunk_of(b);
  unsigned bk = (unsigned)(b - bc->units);
  for (unsigned i = 0; i < 16; i++) CHECK(bc->units[bk + i].head == bk);
  /* Freed units are dirty and reused first-fit; a reused dirty span is not zeroed. */
  char* mem = (char*)keel_unit_addr(bc, bk);
  memset(mem, 0x5a, KEEL_UNIT_SIZE);
  _keel_pageheap_free(b);
  CHECK((bc->free_mask >> bk) & 1);
  CHECK((bc->dirty_mask >> bk) & 1);
  keel_slab_t* b2 = _keel_pageheap_alloc(16, 1, &zeroed);
  CHECK(b2 == b && !zeroed);
  /* Growing in place takes the free units after the span. */
  _keel_pageheap_shrink(b2, 4);
  CHECK(b2->units == 4);
  CHECK(_keel_pageheap_grow_in_place(b2, 10));
  CHECK(b2->units == 10);
  _keel_pageheap_free(b2);
  _keel_pageheap_free(a);
  _keel_pageheap_free(al);
  /* Purging everything makes dirty units clean and reading them gives zeros. */
  _keel_pageheap_purge(true);
  keel_stats_t s = {0};
  s.size = sizeof s;
  keel_stats_get(&s);
  CHECK(s.purged_bytes >= 16 * KEEL_UNIT_SIZE);
}

static void test_central(void) {
  TEST_SECTION("central lists and slabs");
  unsigned cls = keel_size_class(48);
  const keel_class_t* k = &_keel_classes[cls];
  uint32_t got = 0;
  void* list = _keel_central_take(cls, k->batch, &got);
  CHECK(list != NULL && got == k->batch);
  /* The list is NULL-terminated, blocks are distinct, in one slab of the right class. */
  uint32_t n = 0;
  void* first = list;
  for (void* p = list; p; p = keel_link_next(p, cls)) {
    n++;
    CHECK(keel_pagemap_get(p) == cls);
    bool exact;
    CHECK(_keel_block_start(cls, p, &exact) == p && exact);
    CHECK(!_keel_central_is_free(cls, p));
  }
  CHECK(n == got);
  bool exact;
  _keel_block_start(cls, (char*)first + 16, &exact);
  CHECK(!exact);
  /* Returning fewer than a batch puts them back in their slab: now provably free. */
  void* second = keel_link_next(first, cls);
  keel_link_set(first, NULL);
  _keel_central_give(cls, first, 1);
  CHECK(_keel_central_is_free(cls, first));
  /* A whole batch parks in the transfer cache and comes back whole. */
  uint32_t got2;
  void* list2 = _keel_central_take(cls, k->batch, &got2);
  CHECK(got2 == k->batch);
  _keel_central_give(cls, list2, got2);
  CHECK(_keel_central_is_free(cls, list2)); /* found in the transfer cache */
  uint32_t got3;
  void* list3 = _keel_central_take(cls, k->batch, &got3);
  CHECK(list3 == list2 && got3 == got2);
  /* Give everything back. */
  uint32_t rest = 0;
  for (void* p = second; p; p = keel_link_next(p, cls)) rest++;
  _keel_central_give(cls, second, rest);
  _keel_central_give(cls, list3, got3);
  _keel_central_purge_all(0); /* back to the slabs, nothing trimmed */
  CHECK(_keel_central_out(keel_central_of(cls)) == 0);
}

static void test_huge_table(void) {
  TEST_SECTION("huge blocks and their table");
  enum { N = 300 }; /* more than the first table size, to force growth */
  static void* blocks[N];
  for (int i = 0; i < N; i++) {
    blocks[i] = _keel_huge_alloc(KEEL_LARGE_MAX + 1 + (size_t)i * 4096, 0, i % 2 == 0);
    CHECK(blocks[i] != NULL);
    CHECK(keel_pagemap_get(blocks[i]) == KEEL_KIND_HUGE);
  }
  for (int i = 0; i < N; i++) CHECK(_keel_huge_usable(blocks[i]) >= KEEL_LARGE_MAX + 1 + (size_t)i * 4096);
  CHECK(_keel_huge_usable((char*)blocks[3] + 4096) == 0);
  for (int i = 0; i < N; i += 2) CHECK(_keel_huge_free(blocks[i]));
  for (int i = 1; i < N; i += 2) CHECK(_keel_huge_usable(blocks[i]) > 0); /* survive removals */
  for (int i = 0; i < N; i += 2) CHECK(!_keel_huge_free(blocks[i]));    /* already gone */
  for (int i = 1; i < N; i += 2) CHECK(_keel_huge_free(blocks[i]));
  CHECK(_keel_huge_purge(true) > 0);
  /* Alignment larger than a chunk. */
  void* p = _keel_huge_alloc(3 << 20, 8 << 20, false);
  CHECK(p != NULL && ((uintptr_t)p & ((8 << 20) - 1)) == 0);
  CHECK(_keel_huge_free(p));
}

/* A freed huge block stays cached for the purge delay while big blocks are being
 * allocated; once none has been for half the delay the cache is cold: a freed one is
 * unmapped at once and the purger empties the cache without waiting out the delay. */
static void test_huge_cache_cold(void) {
  TEST_SECTION("huge cache: kept while big blocks are in demand, released once cold");
  keel_options_t saved = _keel_options;
  _keel_options.background_purge = false; /* only this test purges */
  _keel_options.purge_delay_ms = 2000;    /* cold after 1 s */
  _keel_huge_purge(true);
  const size_t size = 2 << 20;
  void* a = _keel_huge_alloc(size, 0, false);
  CHECK(a != NULL && _keel_huge_free(a));
  CHECK(_keel_huge_cache_pending()); /* freed just after an allocation: cached */
  CHECK(_keel_huge_purge(false) == 0); /* younger than the delay, and the cache is hot */
  void* b = _keel_huge_alloc(size, 0, false);
  CHECK(b == a); /* the cached mapping served it */
  CHECK(!_keel_huge_cache_pending());
  usleep(1100 * 1000); /* nothing allocated for more than half the delay */
  CHECK(_keel_huge_free(b));
  CHECK(!_keel_huge_cache_pending()); /* cold: unmapped at once */
  void* c = _keel_huge_alloc(size, 0, false);
  CHECK(c != NULL && _keel_huge_free(c));
  CHECK(_keel_huge_cache_pending());
  usleep(1100 * 1000); /* half the delay, not the whole */
  CHECK(_keel_huge_purge(false) == size); /* cold: released before its delay is up */
  CHECK(!_keel_huge_cache_pending());
  /* Growing a block by realloc is demand too. */
  void* d = _keel_huge_alloc(size, 0, false);
  void* e = _keel_huge_alloc(size, 0, false);
  usleep(1100 * 1000);
  d = _keel_huge_realloc(d, 2 * size, false);
  CHECK(d != NULL && _keel_huge_free(e));
  CHECK(_keel_huge_cache_pending());
  CHECK(_keel_huge_free(d));
  _keel_huge_purge(true);
  _keel_options = saved;
}

static void test_options(void) {
  TEST_SECTION("options from the environment");
  keel_options_t saved = _keel_options;
  setenv("KEEL_PURGE_DELAY", "250", 1);
  setenv("KEEL_TCACHE_MAX", "2M", 1);
  setenv("KEEL_STATS", "on", 1);
  setenv("KEEL_HUGE_PAGE_SIZE", "512MiB", 1);
  _keel_options_init();
  CHECK(_keel_options.purge_delay_ms == 250);
  CHECK(_keel_options.tcache_bytes == 2u << 20);
  CHECK(_keel_options.stats_at_exit);
  CHECK(_keel_options.huge_page_size == 512u << 20);
  /* Bad values: a warning and the value is left as it was. */
  setenv("KEEL_TCACHE_MAX", "lots", 1);
  setenv("KEEL_STATS", "maybe", 1);
  _keel_options_init();
  CHECK(_keel_options.tcache_bytes == 2u << 20);
  CHECK(_keel_options.stats_at_exit);
  unsetenv("KEEL_PURGE_DELAY");
  unsetenv("KEEL_TCACHE_MAX");
  unsetenv("KEEL_STATS");
  unsetenv("KEEL_HUGE_PAGE_SIZE");
  _keel_options = saved;
}

/* A new thread is young: no cache of its own, its blocks come from and go straight
 * back to the central lists (tcache.c), so a freed block is not kept for it. */
static void* young_thread(void* arg) {
  (void)arg;
  void* p = malloc(64);
  free(p);
  keel_stats_t s;
  s.size = sizeof s;
  keel_stats_get(&s);
  uintptr_t ok = _keel_thread.tc == &_keel_tc_empty && p != NULL && s.threads >= 2 &&
                 _keel_central_is_free(keel_size_class(64), p) ? 1 : 0;
  return (void*)ok;
}

static void test_thread_cache(void) {
  TEST_SECTION("thread cache bins");
  pthread_t th;
  void* ok = NULL;
  CHECK(pthread_create(&th, NULL, young_thread, NULL) == 0 && pthread_join(th, &ok) == 0);
  CHECK(ok == (void*)1);
  /* After enough malloc/free calls the calling thread has a real cache whose bins
   * respect their limits, and flushing empties it. */
  for (int i = 0; i < 1000; i++) free(malloc(64));
  void* p = malloc(64);
  free(p);
  keel_tcache_t* t = _keel_thread.tc;
  CHECK(t != &_keel_tc_empty);
  unsigned cls = keel_size_class(64);
  CHECK(keel_bin_first(t, cls) == p);
  CHECK(_keel_tcache_contains(t, cls, p));
  for (unsigned c = 1; c < KEEL_NUM_CLASSES; c++) CHECK(t->bin[c].avail <= t->bin[c].max);
  void* many[2000];
  for (int i = 0; i < 2000; i++) many[i] = malloc(64);
  for (int i = 0; i < 2000; i++) free(many[i]);
  /* the only cache: its bins of blocks up to 512 bytes may hold four times the class's limit */
  CHECK(_keel_caches_in_use == 1 && t->bin[cls].max > _keel_classes[cls].bin_limit &&
        t->bin[cls].max <= 4 * _keel_classes[cls].bin_limit);
  /* once another cache lives (counted here without one), overflows give back the room
   * above the class's limit */
  __atomic_add_fetch(&_keel_caches_in_use, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < 2000; i++) many[i] = malloc(64);
  for (int i = 0; i < 2000; i++) free(many[i]);
  __atomic_sub_fetch(&_keel_caches_in_use, 1, __ATOMIC_RELAXED);
  CHECK_MSG(t->bin[cls].max == _keel_classes[cls].bin_limit, "bin %u: max %u, limit %u", cls, t->bin[cls].max,
            _keel_classes[cls].bin_limit);
  keel_thread_flush();
  CHECK(keel_bin_empty(t, cls));
  CHECK(!_keel_tcache_contains(t, cls, p));
  keel_thread_flush();
}

/* Gathering (tcache.c): a thread that holds free 16 KiB blocks in its bin and waits gives
 * them up to a thread whose class is about to take a new slab. Where there are two
 * processors the two threads run on different ones, so that they are apart (transfer.h)
 * and the holder's lone slab, on a line it used a moment ago, is one the other thread's
 * takes pass by (central.c): that slab must not keep the gather from coming, nor the
 * gathered blocks, which go back to it, from being taken (a 2-core CI machine placed
 * them so, and 4,096 mallocs took new slabs and gathered nothing). */
static struct {
  keel_tcache_t* t;
  void* held[2];
  int cpu[2]; /* the holder's and the taker's, -1: not pinned */
  pthread_barrier_t ready, done;
} gh;

static void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  CHECK(pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0);
}

static void* gather_holder(void* arg) {
  (void)arg;
  pin_to(gh.cpu[0]);
  for (int i = 0; i < 200; i++) free(malloc(64)); /* past the young thread's calls: a cache */
  enum { CHURN = 64 };
  static void* churn[CHURN]; /* through its line's transfer cache: the line is in use */
  for (int i = 0; i < CHURN; i++) churn[i] = malloc(16 << 10);
  for (int i = 0; i < CHURN; i++) free(churn[i]);
  gh.held[0] = malloc(16 << 10);
  gh.held[1] = malloc(16 << 10);
  free(gh.held[0]);
  free(gh.held[1]);
  gh.t = _keel_thread.own;
  pthread_barrier_wait(&gh.ready);
  pthread_barrier_wait(&gh.done); /* waits: its busy flag is clear */
  return NULL;
}

static void test_gather(void) {
  TEST_SECTION("gathering");
  unsigned big = keel_size_class(16 << 10);
  cpu_set_t was;
  CHECK(pthread_getaffinity_np(pthread_self(), sizeof was, &was) == 0);
  gh.cpu[0] = gh.cpu[1] = -1;
  for (int c = 0, n = 0; c < CPU_SETSIZE && n < 2; c++)
    if (CPU_ISSET(c, &was)) gh.cpu[n++] = c;
  if (gh.cpu[1] < 0) gh.cpu[0] = -1; /* one processor: both run there */
  pin_to(gh.cpu[1]);
  pthread_barrier_init(&gh.ready, NULL, 2);
  pthread_barrier_init(&gh.done, NULL, 2);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, gather_holder, NULL) == 0);
  pthread_barrier_wait(&gh.ready);
  CHECK(gh.t != NULL && _keel_tcache_contains(gh.t, big, gh.held[1]));
  uint32_t held = gh.t != NULL ? (uint32_t)(gh.t->bin[big].max - gh.t->bin[big].avail) : 0;
  struct timespec pause = {0, 30 * 1000 * 1000}; /* past an idle gather's wait, if one came before */
  nanosleep(&pause, NULL);
  uint64_t gathers = _keel_gathers, blocks = _keel_blocks_gathered;
  enum { MAX = 4096 };
  static void* got[MAX];
  int n = 0;
  while (n < MAX && _keel_gathers == gathers) got[n++] = malloc(16 << 10);
  bool saw = false;
  for (int extra = 0; extra < 64 && n < MAX; extra++) got[n++] = malloc(16 << 10); /* the gatherer's bin too */
  for (int i = 0; i < n; i++) saw |= got[i] == gh.held[1];
  if (_keel_prim_barrier_all_threads() && !KEEL_TSAN) {
    CHECK_MSG(_keel_gathers > gathers, "%d mallocs of 16 KiB, no gather", n);
    CHECK_MSG(_keel_blocks_gathered - blocks == held, "gathered %llu blocks of %u held",
              (unsigned long long)(_keel_blocks_gathered - blocks), held);
    CHECK(keel_bin_empty(gh.t, big));
    CHECK_MSG(saw, "the held block %p not among %d mallocs", gh.held[1], n);
  } else { /* no barrier (an emulator), or TSan: nothing is gathered */
    CHECK(_keel_blocks_gathered == blocks && !saw);
  }
  for (int i = 0; i < n; i++) free(got[i]);
  pthread_barrier_wait(&gh.done);
  pthread_join(th, NULL);
  CHECK(pthread_setaffinity_np(pthread_self(), sizeof was, &was) == 0);
  _keel_verify();
}

/* A thread that works long enough to get a cache, then ends. */
static void* cached_worker(void* arg) {
  (void)arg;
  void* blocks[100];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 100; i++) blocks[i] = malloc(64);
    for (int i = 0; i < 100; i++) free(blocks[i]);
  }
  return NULL;
}

/* An exiting thread leaves its cache, blocks and all, for the purger to return after the
 * purge delay. With background purging switched off at run time nothing would: the kept
 * caches go back at the switch, and a thread that exits afterwards keeps none. */
static void test_purge_off_spares(void) {
  TEST_SECTION("background_purge off: no cache is kept for a purger that returns nothing");
  pthread_t th;
  CHECK(_keel_purger_running());
  uint64_t live = __atomic_load_n(&_keel_live_caches, __ATOMIC_RELAXED);
  uint64_t in_use = __atomic_load_n(&_keel_caches_in_use, __ATOMIC_RELAXED);
  CHECK(pthread_create(&th, NULL, cached_worker, NULL) == 0 && pthread_join(th, NULL) == 0);
  uint64_t kept = __atomic_load_n(&_keel_live_caches, __ATOMIC_RELAXED);
  CHECK_MSG(kept == live || kept == live + 1, "%llu caches, %llu before", (unsigned long long)kept,
            (unsigned long long)live); /* (the purger may have returned it already) */
  /* a kept cache is not one in use (the only-cache bins, threads apart) */
  CHECK(__atomic_load_n(&_keel_caches_in_use, __ATOMIC_RELAXED) == in_use);
  CHECK(keel_option_set("background_purge", "off") == 0);
  CHECK(!_keel_purger_running());
  CHECK(__atomic_load_n(&_keel_live_caches, __ATOMIC_RELAXED) == live);
  CHECK(pthread_create(&th, NULL, cached_worker, NULL) == 0 && pthread_join(th, NULL) == 0);
  CHECK_MSG(__atomic_load_n(&_keel_live_caches, __ATOMIC_RELAXED) == live, "an exited thread's cache was kept");
  CHECK(keel_option_set("background_purge", "on") == 0);
  CHECK(_keel_purger_running());
}

/* free's fast path takes room from the bin of the class it read in the page map; when
 * there is none it leaves that bin at -1 and the slow path gives it back. The page map
 * may name something else by then (another thread carved the block's slab, borrow.c):
 * the room must still go back to the bin it came from, or the bin counts a block it does
 * not hold and a later walk of it (a flush, a batch handed back) runs past its end. */
static void test_free_room_back(void) {
  TEST_SECTION("free's slow path gives room back to the bin its fast path took it from");
  for (int i = 0; i < 100; i++) free(malloc(100)); /* a real cache */
  void* p = malloc(100);
  unsigned a = keel_size_class(100), b = keel_size_class(300);
  keel_tcache_t* t = keel_tc_enter();
  CHECK(t != &_keel_tc_empty && a != b);
  int16_t kept = t->bin[b].avail;
  t->bin[b].avail = -1; /* as if the page map had said b and b's bin were full */
  uint32_t in_a = (uint32_t)(t->bin[a].max - t->bin[a].avail);
  _keel_free_slow(p, t, b); /* p is a's; clears the busy flag */
  CHECK_MSG(t->bin[b].avail == 0, "bin %u left at %d", b, t->bin[b].avail);
  CHECK((uint32_t)(t->bin[a].max - t->bin[a].avail) == in_a + 1 && keel_bin_first(t, a) == p);
  t->bin[b].avail = kept;
}

/* A heap-profile sample in a class the caches do not hold (above KEEL_CACHED_MAX): the
 * block the class's slabs gave goes back to them, not onto the bin, which has no room
 * and would count it wrong (a later flush walked past the bin's list). */
static void test_sample_uncached(void) {
  TEST_SECTION("a profile sample of an uncached class leaves its bin empty");
  unsigned cls = keel_size_class(40000);
  void* p = _keel_alloc_direct(cls); /* from the class's own slabs */
  keel_tcache_t* t = keel_tc_enter();
  bool uncached = t != &_keel_tc_empty && t->bin[cls].max == 0;
  CHECK(uncached);
  bool was = _keel_profiling;
  uint64_t rate = _keel_options.profile_rate;
  _keel_profiling = true;
  _keel_options.profile_rate = 1 << 20;
  t->bin[cls].countdown_hi = 0; /* this stage is the last: the next expiry samples */
  void* q = uncached ? _keel_profile_countdown_expired(t, cls, p, 40000) : p;
  keel_tc_leave();
  CHECK(q != p); /* the program gets a block of a sampled slab instead */
  CHECK_MSG(keel_bin_empty(t, cls) && t->bin[cls].avail == t->bin[cls].max,
            "bin %u: avail %d max %u", cls, t->bin[cls].avail, t->bin[cls].max);
  free(q);
  _keel_profiling = was;
  _keel_options.profile_rate = rate;
  keel_thread_flush();
}

/* A freed profile sample goes back to its own slab. A list of one block is a whole batch
 * (4-32 KiB) or a half one (2-4 KiB), and it was parked in the transfer cache, from which
 * a bin took it as a plain block, still tagged sampled. */
struct find_block_s {
  void* p;
  bool found;
};
static void find_block(void* list, uint32_t n, void* ctx) {
  struct find_block_s* f = (struct find_block_s*)ctx;
  void* q = list;
  for (uint32_t i = 0; i < n && q != NULL; i++, q = keel_link_next(q, 0)) f->found |= q == f->p;
}

static void test_sample_freed_to_slab(void) {
  TEST_SECTION("a freed profile sample goes back to its slab, not the transfer cache");
  unsigned cls = keel_size_class(3000);
  CHECK(_keel_classes[cls].batch == 2 && _keel_classes[cls].transfer_max > 0);
  void** q = (void**)_keel_central_take_sampled(cls);
  CHECK(q != NULL && keel_pagemap_get(q) == KEEL_KIND_SAMPLED);
  if (q == NULL) return;
  q[1] = NULL; /* handed out, as _keel_profile_countdown_expired does */
  free(q);
  struct find_block_s f = {q, false};
  _keel_central_lock_class(keel_central_of(cls));
  _keel_transfer_each(cls, find_block, &f);
  _keel_central_unlock_class(keel_central_of(cls));
  CHECK_MSG(!f.found, "sampled block %p is parked in class %u's transfer cache", (void*)q, cls);
  void* r = _keel_alloc_any(3000, 0, false, true);
  CHECK_MSG(keel_pagemap_get(r) == cls, "malloc handed out block %p of a sampled slab (tag %#x)", r,
            keel_pagemap_get(r));
  free(r);
  keel_thread_flush();
}

/* keel_mesh_estimate reads only the active classes: an inactive one's entry is the shared
 * zero entry, which nothing may write (not even its lock's counter). */
static void test_estimate_inactive(void) {
  TEST_SECTION("keel_mesh_estimate leaves the inactive classes' zero entry alone");
  unsigned inactive = 0;
  for (unsigned c = 1; c < KEEL_NUM_CLASSES && _keel_classes[c].size <= KEEL_MESH_MAX_BLOCK; c++)
    if (!_keel_central_active(c)) inactive = c;
  CHECK(inactive != 0);
  uint64_t before = _keel_central_slots[0].home.lock.acquired;
  keel_mesh_estimate_t rows[128];
  keel_mesh_estimate(rows, 128);
  uint64_t after = _keel_central_slots[0].home.lock.acquired;
  CHECK_MSG(after == before, "the zero entry's lock was taken %llu times (class %u inactive)",
            (unsigned long long)(after - before), inactive);
}

/* Takes blocks of coarse class c straight from its slabs until its group has switched
 * to the fine classes (it spans KEEL_FINE_GROUP_SLABS slabs and has run out), or until
 * `max` blocks; returns how many it took. */
static unsigned take_until_switched(unsigned c, void** taken, unsigned max) {
  unsigned n = 0;
  while (_keel_class_group_pending[c] && n < max) taken[n++] = _keel_alloc_direct(c);
  return n;
}

/* The switch from coarse to fine classes, with a thread cache that exists already and
 * blocks of coarse classes still live: they keep their class and free normally. A
 * group switches once the heap is big, its coarse class spans KEEL_FINE_GROUP_SLABS
 * slabs and it runs out of free blocks (takes a new slab, or empties its last); a group
 * that stays small keeps its coarse class. */
static void test_fine_classes(void) {
  TEST_SECTION("coarse then fine size classes");
  keel_tcache_t* t = _keel_thread.tc;
  CHECK(t != &_keel_tc_empty); /* test_thread_cache gave this thread a cache */
  void* before = malloc(200);
  CHECK(malloc_usable_size(before) == 224);
  CHECK(_keel_class_of_size.cls[200] == keel_fine_class(224));
  _keel_classes_slabs_grew(_keel_options.fine_classes - 1); /* not yet */
  CHECK(!_keel_classes_are_fine());
  _keel_classes_slabs_grew(_keel_options.fine_classes);
  CHECK(_keel_classes_are_fine());
  /* Both groups are small: the 224-byte class serves 200 bytes on, the 1,280-byte class
   * a 1,030-byte string. */
  unsigned c224 = keel_fine_class(224), c208 = keel_fine_class(208), c1280 = keel_fine_class(1280);
  CHECK(keel_central_of(c224)->slabs < KEEL_FINE_GROUP_SLABS);
  CHECK(_keel_class_serving[c208] == c224 && _keel_class_group_pending[c224]);
  void* string = malloc(1030);
  CHECK(malloc_usable_size(string) == 1280);
  CHECK(_keel_class_serving[keel_fine_class(1040)] == c1280 && _keel_class_group_pending[c1280]);
  /* The 224-byte group grows to KEEL_FINE_GROUP_SLABS slabs and runs out: it switches. */
  static void* taken[8192];
  unsigned ntaken = take_until_switched(c224, taken, 8192);
  CHECK(!_keel_class_group_pending[c224]);
  CHECK(keel_central_of(c224)->slabs >= KEEL_FINE_GROUP_SLABS);
  CHECK(_keel_class_group_pending[c1280]); /* the other group is still small */
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++)
    if (!_keel_class_group_pending[_keel_class_serving[cls]]) CHECK(_keel_class_serving[cls] == cls);
  for (unsigned n = 1; n <= KEEL_SMALL_MAX; n++) CHECK(_keel_class_of_size.cls[n] == _keel_class_serving[keel_fine_class(n)]);
  CHECK(_keel_class_of_size.cls[200] == c208);
  void* after = malloc(200);
  CHECK(malloc_usable_size(after) == 208);
  for (unsigned i = 0; i < ntaken; i++) free(taken[i]);
  /* The 1,280-byte group too, taken as a thread's bin refills it: in batches, which seldom
   * end exactly where a slab does (Redis filling with 1 KiB values kept the coarse class
   * so). A coarse class that keeps growing switches once it has taken 2 x
   * KEEL_FINE_GROUP_SLABS new slabs since the heap became big, whether or not a take ever
   * empties its last slab. Then a 1,030-byte string gets the 1,040-byte class, and a
   * power of two plus a header a class of its own. */
  static void* lists[1024];
  unsigned nlists = 0;
  uint64_t slabs_before = keel_central_of(c1280)->slabs;
  while (_keel_class_group_pending[c1280] && nlists < 1024) {
    uint32_t got;
    lists[nlists++] = _keel_central_take_slabs(c1280, _keel_classes[c1280].batch, &got);
  }
  CHECK(!_keel_class_group_pending[c1280]);
  CHECK(keel_central_of(c1280)->slabs <= slabs_before + 2 * KEEL_FINE_GROUP_SLABS);
  ntaken = 0;
  for (unsigned i = 0; i < nlists; i++)
    for (void* p = lists[i]; p != NULL && ntaken < 8192; p = keel_link_next(p, c1280)) taken[ntaken++] = p;
  for (unsigned i = 0; i < ntaken; i++) ((uintptr_t*)taken[i])[1] = 0; /* handed out */
  void* string2 = malloc(1030);
  void* big = malloc(1041);
  CHECK(malloc_usable_size(string2) == 1040 && malloc_usable_size(big) == 1152);
  CHECK(malloc_usable_size(string) == 1280); /* blocks keep their class */
  for (unsigned i = 0; i < ntaken; i++) free(taken[i]);
  free(string);
  free(string2);
  free(big);
  free(before);
  free(after);
  _keel_verify();
}

/* Blocks above KEEL_CACHED_MAX skip the thread cache both ways. */
static void test_uncached_class(void) {
  TEST_SECTION("classes above KEEL_CACHED_MAX are not cached");
  keel_tcache_t* t = _keel_thread.tc;
  CHECK(t != &_keel_tc_empty);
  unsigned cls = keel_size_class(40000);
  CHECK(_keel_classes[cls].size > KEEL_CACHED_MAX);
  for (int i = 0; i < 100; i++) {
    void* p = malloc(40000);
    CHECK(p != NULL && keel_pagemap_get(p) == cls);
    free(p);
    if (i == 99) CHECK(_keel_central_is_free(cls, p)); /* in its slab, not in a bin */
  }
  CHECK(keel_bin_empty(t, cls) && t->bin[cls].max == 0 && t->bin[cls].avail == 0);
  unsigned small = keel_size_class(KEEL_CACHED_MAX);
  void* q = malloc(KEEL_CACHED_MAX);
  free(q);
  CHECK(keel_bin_first(t, small) == q); /* the largest cached class still is */
}

/* Half batches: a small heap's small classes' bins move half a batch at a time (run
 * before the switch to fine classes: a big heap's bins move whole batches); halves park
 * in the transfer cache as they come, a take of half a batch that finds a whole one gets
 * its front half and the back half parks again, and a take of a whole batch gets what is
 * parked, half or whole. */
static void test_half_batches(void) {
  TEST_SECTION("half batches in the transfer cache");
  unsigned cls = keel_fine_class(80);
  const keel_class_t* k = &_keel_classes[cls];
  keel_central_t* cl = _keel_central_activate(cls);
  uint32_t h = k->batch / 2, got = 0;
  CHECK(k->batch % 2 == 0 && h >= 2 && k->transfer_max >= 4 && _keel_transfer_lines() == 1);
  keel_purge(); /* nothing parked */
  CHECK(_keel_central_parked_blocks(cls) == 0 && !_keel_transfer_any(cls));
  void* a = _keel_central_take(cls, h, &got);
  CHECK(got == h);
  void* b = _keel_central_take(cls, h, &got);
  CHECK(got == h && a != b);
  _keel_central_give(cls, a, h);
  CHECK(_keel_central_parked_blocks(cls) == h && _keel_transfer_any(cls));
  CHECK(_keel_central_is_free(cls, a) && _keel_central_has_free(cls));
  keel_class_stats_t cs[KEEL_NUM_CLASSES];
  size_t n = keel_stats_classes(cs, KEEL_NUM_CLASSES);
  CHECK(n > cls - 1 && cs[cls - 1].block_size == k->size && cs[cls - 1].blocks_cached >= h);
  _keel_central_give(cls, b, h);
  CHECK(_keel_central_parked_blocks(cls) == 2 * h);
  _keel_verify();
  void* c = _keel_central_take(cls, k->batch, &got); /* a whole batch's take gets a half */
  CHECK(got == h && (c == a || c == b));
  void* d = _keel_central_take(cls, h, &got);
  CHECK(got == h && d == (c == a ? b : a) && _keel_central_parked_blocks(cls) == 0);
  void* e = _keel_central_take(cls, k->batch, &got); /* from the slabs: a whole batch */
  CHECK(got == k->batch);
  _keel_central_give(cls, e, k->batch);
  CHECK(_keel_central_parked_blocks(cls) == k->batch);
  void* f = _keel_central_take(cls, h, &got); /* the front half; the back half parks again */
  CHECK(got == h && f == e && _keel_central_parked_blocks(cls) == h);
  uint32_t len = 0;
  for (void* q = f; q != NULL; q = keel_link_next(q, cls)) len++;
  CHECK(len == h);
  _keel_verify();
  _keel_central_give(cls, c, h);
  _keel_central_give(cls, d, h);
  _keel_central_give(cls, f, h);
  CHECK(_keel_central_parked_blocks(cls) == 4 * h);
  _keel_verify();
  /* In a small heap the bins of a class spanning fewer than four slabs hold at most one
   * batch while another thread cache lives (counted here without one, so that the process
   * does not spread); the only cache's grow past it. */
  CHECK(!_keel_classes_are_fine());
  keel_tcache_t* t = _keel_thread.tc;
  static void* blocks[300];
  for (int other = 1; other >= 0; other--) {
    __atomic_add_fetch(&_keel_caches_in_use, (uint64_t)other, __ATOMIC_RELAXED);
    for (int r = 0; r < 3; r++) {
      for (int i = 0; i < 300; i++) blocks[i] = malloc(72);
      for (int i = 0; i < 300; i++) free(blocks[i]);
    }
    __atomic_sub_fetch(&_keel_caches_in_use, (uint64_t)other, __ATOMIC_RELAXED);
    CHECK(cl->slabs < 4 && t->bin[cls].max > 1);
    CHECK(other ? t->bin[cls].max <= k->batch : t->bin[cls].max >= 300);
  }
  keel_purge();
  CHECK(_keel_central_parked_blocks(cls) == 0);
  _keel_verify();
}

/* Runs fn(arg) in a forked child; true if the child died of SIGABRT with a line on
 * stderr containing `words`. */
static bool child_stops_with(void (*fn)(void*), void* arg, const char* words) {
  char report[512];
  int status = child_report(fn, arg, report, sizeof report);
  bool ok = status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(report, words) != NULL;
  if (!ok) fprintf(stderr, "child's report: %s\n", report);
  return ok;
}

static void free_it(void* p) { free(p); }

/* Issue 31's attacks on the lists that never pass through a bin: one link of a list is
 * overwritten (a plain pointer, as an overflow writes; or the secret's own encoding of
 * an address outside Keel's slabs, as a writer that knew the key would) and the list
 * is then followed. */
static unsigned attack_cls;
static void* attack_list;
static void attack_take_half(void* arg) { /* a transfer batch split for a half-batch take */
  (void)arg;
  CHECK(_keel_transfer_put(attack_cls, attack_list, false));
  uint32_t got;
  _keel_central_take(attack_cls, _keel_classes[attack_cls].batch / 2, &got);
}
static void attack_to_slabs(void* arg) { /* a list going back to its slabs */
  (void)arg;
  _keel_central_give(attack_cls, attack_list, 3);
}
static void attack_bin(void* arg) { /* a batch refilled into a bin, then popped */
  (void)arg;
  CHECK(_keel_transfer_put(attack_cls, attack_list, false));
  for (uint32_t i = 0; i < 4 * _keel_classes[attack_cls].batch; i++) (void)malloc(_keel_classes[attack_cls].size);
}

static void test_freelist_attacks(void) {
  TEST_SECTION("free-list links: an overwritten link stops the process, naming the list");
  unsigned cls = keel_size_class(48);
  const keel_class_t* k = &_keel_classes[cls];
  attack_cls = cls;
  static _Alignas(64) char outside[256];
  uint32_t got;
  for (int forged = 0; forged < 2; forged++) {
    /* Word 2 of the list: its link to word 3 overwritten. */
    attack_list = _keel_central_take_slabs(cls, k->batch, &got);
    CHECK(got == k->batch);
    void* third = keel_list_nth_tail(attack_list, 3, cls);
    void* second = keel_list_nth_tail(attack_list, 2, cls);
    (void)third;
    if (forged) keel_link_set(second, outside + 64);           /* encoded, but no slab */
    else *(uintptr_t*)second = (uintptr_t)(outside + 64);     /* a plain pointer */
    CHECK(child_stops_with(attack_take_half, NULL, "free list of the 48-byte class corrupted at"));
    CHECK(child_stops_with(attack_to_slabs, NULL, "free list of the 48-byte class corrupted at"));
    if (!forged) CHECK(child_stops_with(attack_bin, NULL, "free list of the 48-byte class corrupted at"));
    /* Mend the link and give the list back. */
    keel_link_set(second, third);
    _keel_central_give(cls, attack_list, got);
  }
  keel_purge();
}

/* A bin's surplus parked whole carries its index (freelist.h): block j of the batch names
 * blocks 1 + j*f .. j*f + f. 16-byte blocks have no room for it. A batch whose index a
 * use-after-free overwrote is still taken whole and intact (the index is only read for
 * prefetches). */
static void test_batch_index(void) {
  TEST_SECTION("a parked batch's index");
  static const size_t sizes[] = {16, 32, 48, 64, 256};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    unsigned cls = keel_size_class(sizes[si]);
    const keel_class_t* k = &_keel_classes[cls];
    unsigned f = keel_index_fanout(k->size);
    CHECK((k->size < 32) == (f == 0) && f <= KEEL_INDEX_FANOUT);
    _keel_central_activate(cls);
    keel_purge();
    uint32_t got;
    void* list = _keel_central_take_slabs(cls, k->batch, &got);
    CHECK(got == k->batch && got >= 3);
    void* blocks[KEEL_BATCH_MAX];
    void* q = list;
    for (uint32_t i = 0; i < got; i++, q = keel_link_next(q, cls)) blocks[i] = q;
    CHECK(_keel_central_give_front(cls, list, got) == NULL); /* parked: the cache is empty */
    CHECK(_keel_central_parked_blocks(cls) == got);
    for (uint32_t j = 0; f != 0 && 1 + j * f < got; j++)
      for (uint32_t c = 0; c < f && 1 + j * f + c < got; c++) CHECK(keel_index_get(blocks[j], c) == blocks[1 + j * f + c]);
    if (f != 0) /* a use-after-free's writes over the index */
      for (uint32_t j = 0; j < 3; j++) memset((uintptr_t*)blocks[j] + 2, 0x41 + (int)j, f * sizeof(uintptr_t));
    void* back = _keel_central_take_parked(cls, k->batch, &got);
    CHECK(back == blocks[0] && got == k->batch);
    q = back;
    for (uint32_t i = 0; i < got; i++, q = keel_link_next(q, cls)) CHECK(q == blocks[i]);
    CHECK(q == NULL);
    _keel_central_give(cls, back, got);
    keel_purge();
  }
}

/* The transfer cache's lines: a full line's puts go on to the next line, every parked
 * batch is found from any line, and nothing is lost or handed out twice. */
static void test_transfer_lines(void) {
  TEST_SECTION("transfer cache lines");
  unsigned cls = keel_size_class(64);
  const keel_class_t* k = &_keel_classes[cls];
  _keel_central_activate(cls);
  keel_purge();
  CHECK(_keel_central_parked_blocks(cls) == 0);
  enum { MAXB = 64 };
  void* lists[MAXB];
  uint32_t nl = 0, got;
  bool indexed;
  /* Park until the lines in use are full: the next give goes to the slabs. */
  for (;;) {
    CHECK(nl < MAXB);
    void* l = _keel_central_take_slabs(cls, k->batch, &got);
    CHECK(got == k->batch);
    if (!_keel_transfer_put(cls, l, false)) {
      _keel_central_give(cls, l, got); /* to the slabs (the put failed, so will its) */
      break;
    }
    lists[nl++] = l;
  }
  CHECK(nl >= 1 && _keel_central_parked_blocks(cls) == nl * k->batch);
  _keel_verify();
  /* Every one comes back exactly once, then the transfer cache is empty. */
  void* back[MAXB];
  for (uint32_t i = 0; i < nl; i++) {
    uint32_t n;
    back[i] = _keel_transfer_get(cls, &n, &indexed);
    CHECK(back[i] != NULL && n == k->batch && !indexed);
    uint32_t seen = 0;
    for (uint32_t j = 0; j < nl; j++) seen += lists[j] == back[i];
    CHECK(seen == 1);
    for (uint32_t j = 0; j < nl; j++)
      if (lists[j] == back[i]) lists[j] = NULL;
  }
  CHECK(!_keel_transfer_any(cls) && _keel_transfer_get(cls, &got, &indexed) == NULL);
  for (uint32_t i = 0; i < nl; i++) _keel_central_give(cls, back[i], k->batch);
  keel_purge();
  CHECK(_keel_central_parked_blocks(cls) == 0 && _keel_central_out(keel_central_of(cls)) == 0);
}

/* n blocks of class cls straight from the central lists, every byte written. */
static void take_touched(unsigned cls, void** b, int n) {
  for (int i = 0; i < n; i++) {
    b[i] = _keel_alloc_direct(cls);
    memset(b[i], 1, _keel_classes[cls].size);
  }
}

/* A trim test's class: the purger thread stops decaying (only the test's own calls
 * trim), and b gets n blocks straight from the class's slabs, every byte written;
 * trim_test_end checks that every block went back and lets the purger go on. */
typedef struct {
  keel_central_t* cl;
  uint64_t out_before;
} trim_test_t;
static trim_test_t trim_test_start(unsigned cls, void** b, int n) {
  _keel_options.background_purge = false;
  trim_test_t tt = {_keel_central_activate(cls), 0};
  tt.out_before = _keel_central_out(tt.cl);
  take_touched(cls, b, n);
  return tt;
}
static void trim_test_end(trim_test_t tt) {
  CHECK(_keel_central_out(tt.cl) == tt.out_before);
  _keel_options.background_purge = true;
}

/* A class that takes nothing from its slabs while blocks keep coming back (a server
 * replacing values by smaller ones) has its wholly free pages purged anyway: by the
 * purger, each slab once per idle period, and from then on by the frees that empty
 * them; a class still taking from its slabs waits until the frees stop. */
static void test_busy_trim(void) {
  TEST_SECTION("pages of a cold class purged while frees go on");
  unsigned cls = keel_size_class(1000);
  const keel_class_t* k = &_keel_classes[cls];
  enum { N = 1024, IDLE = 1000 };
  static void* b[N];
  bool small_pages = _keel_page_size * 4 <= KEEL_UNIT_SIZE; /* else no page of a slab empties */
  trim_test_t tt = trim_test_start(cls, b, N);
  keel_central_t* cl = tt.cl;
  _keel_central_decay(IDLE); /* sets the cold threshold (IDLE / 2 ticks) */
  uint64_t before = _keel_central_trimmed_bytes();
  /* Keep one block in 16: three pages in four hold free blocks only (4 KiB pages). */
  for (int i = 0; i < N; i++)
    if (i % 16) {
      keel_link_set(b[i], NULL);
      _keel_central_give(cls, b[i], 1);
    }
  CHECK(_keel_central_trimmed_bytes() == before); /* the class has just taken */
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  unsigned slabs = 0;
  for (keel_slab_t* s = cl->home.partial; s != NULL; s = s->next, slabs++)
    s->put_tick = now; /* blocks came back just now */
  CHECK(slabs >= 2);
  cl->take_tick = now; /* still taking: wait */
  _keel_central_decay(IDLE);
  CHECK(_keel_central_trimmed_bytes() == before);
  cl->take_tick = now - 2 * IDLE; /* taking nothing for long */
  _keel_central_decay(IDLE);
  uint64_t after = _keel_central_trimmed_bytes();
  if (small_pages)
    CHECK_MSG(after >= before + (uint64_t)slabs * k->units * KEEL_UNIT_SIZE / 2,
              "trimmed %llu bytes of %u slabs", (unsigned long long)(after - before), slabs);
  for (keel_slab_t* s = cl->home.partial; s != NULL; s = s->next) CHECK(!s->needs_trim);
  /* Cold now: a free that empties a page purges it at once... */
  for (int i = 16; i < N; i += 32) {
    keel_link_set(b[i], NULL);
    _keel_central_give(cls, b[i], 1);
    b[i] = NULL;
  }
  uint64_t freed = _keel_central_trimmed_bytes();
  if (small_pages) CHECK(freed > after);
  /* ...and the purger does not trim those slabs again before the idle period is over. */
  _keel_central_decay(IDLE);
  CHECK(_keel_central_trimmed_bytes() == freed);
  for (int i = 0; i < N; i += 16)
    if (b[i]) {
      keel_link_set(b[i], NULL);
      _keel_central_give(cls, b[i], 1);
    }
  trim_test_end(tt);
}

/* Slabs of big blocks (four pages and more) are trimmed while their class keeps taking:
 * under a steady load they are never quiet, and their free blocks stayed resident. */
static unsigned class_of_block(void* p) { /* a borrowed block is its lender's */
  return keel_span_head(keel_chunk_of(p), keel_unit_index(p))->cls;
}

/* Block p straight back to its slab, not parked in the transfer cache. */
static void give_to_slab(void* p) {
  keel_link_set(p, NULL);
  _keel_central_give_slabs(class_of_block(p), p);
}

static void test_busy_trim_big(void) {
  TEST_SECTION("pages of big blocks purged while their class keeps taking");
  unsigned cls = keel_size_class(32768);
  const keel_class_t* k = &_keel_classes[cls];
  enum { N = 64, IDLE = 1000 };
  static void* b[N];
  bool big = keel_class_big(k); /* not at 64 KiB pages */
  trim_test_t tt = trim_test_start(cls, b, N);
  keel_central_t* cl = tt.cl;
  uint64_t before = _keel_central_trimmed_bytes();
  unsigned own = 0;
  for (int i = 0; i < N; i++) /* three blocks in four come back */
    if (i % 4) {
      own += class_of_block(b[i]) == cls;
      give_to_slab(b[i]);
    }
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  uint64_t free_bytes = 0; /* in slabs that keep live blocks (a slab left empty goes) */
  for (keel_slab_t* s = _keel_partial_first(cl); s != NULL; s = _keel_partial_next(cl, s)) {
    s->put_tick = now; /* blocks came back just now */
    s->busy_trim_tick = now;
    free_bytes += (uint64_t)(k->count - s->used) * k->size;
  }
  cl->take_tick = now; /* and the class still takes */
  _keel_central_decay(IDLE);
  uint64_t trimmed = _keel_central_trimmed_bytes() - before;
  if (big)
    CHECK_MSG(free_bytes >= (uint64_t)own * k->size / 2 && trimmed >= free_bytes,
              "trimmed %llu of %llu bytes (%u blocks back)", (unsigned long long)trimmed,
              (unsigned long long)free_bytes, own);
  else
    CHECK(trimmed == 0);
  for (int i = 0; i < N; i += 4) give_to_slab(b[i]);
  trim_test_end(tt);
}

/* A free into a slab of big blocks also trims it, unless a free did so within the last
 * 16 ms: the purger's tick alone left a busy class's free blocks resident for most of a
 * tick, and the pacing keeps a loop that takes and frees one block from paying a
 * madvise and its refaults each time. */
static void test_free_trims_big(void) {
  TEST_SECTION("a free trims its slab of big blocks, at most once per 16 ms");
  unsigned cls = keel_size_class(65536);
  const keel_class_t* k = &_keel_classes[cls];
  enum { N = 4 };
  static void* b[N];
  trim_test_t tt = trim_test_start(cls, b, N);
  keel_slab_t* s = keel_span_head(keel_chunk_of(b[1]), keel_unit_index(b[1]));
  /* b[1] and b[2] of this class's slab s, which stays partly used (not released) */
  bool own = class_of_block(b[1]) == cls && s->used > 2 &&
             keel_span_head(keel_chunk_of(b[2]), keel_unit_index(b[2])) == s;
  s->free_trim_ms = (uint32_t)_keel_prim_clock_ms() - 1000u;
  uint64_t before = _keel_central_trimmed_bytes();
  give_to_slab(b[1]);
  uint64_t trimmed = _keel_central_trimmed_bytes() - before;
  if (own && keel_class_big(k))
    CHECK_MSG(trimmed >= k->size, "a free trimmed %llu bytes", (unsigned long long)trimmed);
  else if (own)
    CHECK(trimmed == 0); /* 64 KiB pages: these blocks are not big */
  /* A second free right after: paced, unless the clock passed 16 ms meanwhile. */
  uint32_t first = s->free_trim_ms;
  before = _keel_central_trimmed_bytes();
  give_to_slab(b[2]);
  trimmed = _keel_central_trimmed_bytes() - before;
  if (own && (uint32_t)_keel_prim_clock_ms() - first < 16u)
    CHECK_MSG(trimmed == 0, "a second free within 16 ms trimmed %llu bytes", (unsigned long long)trimmed);
  for (int i = 0; i < N; i++)
    if (i != 1 && i != 2) give_to_slab(b[i]);
  trim_test_end(tt);
}

/* keel_purge() and a fork give back now what the purger would give back later: the
 * blocks in this thread's cache, and the free pages of partly used slabs (a forked
 * child keeps every page it inherits). */
static unsigned cached_in_bin(unsigned cls) {
  keel_tcache_t* t = _keel_thread.tc;
  return t == &_keel_tc_empty ? 0 : t->bin[cls].max - t->bin[cls].avail;
}

static void fill_and_thin(void** b, int n, unsigned* cls) {
  for (int i = 0; i < n; i++) {
    b[i] = malloc(1000);
    memset(b[i], 1, 1000);
  }
  *cls = class_of_block(b[0]);
  for (int i = 0; i < n; i++) /* one block in 16 stays: most pages hold free blocks only */
    if (i % 16) free(b[i]);
}

static void test_purge_now(void) {
  TEST_SECTION("keel_purge and fork return cached blocks and free pages of partly used slabs");
  _keel_options.background_purge = false; /* only the calls under test may purge */
  enum { N = 1024 };
  static void* b[N];
  bool small_pages = _keel_page_size * 4 <= KEEL_UNIT_SIZE; /* else no page of a slab empties */
  unsigned cls;
  fill_and_thin(b, N, &cls);
  CHECK(cached_in_bin(cls) > 0);
  uint64_t before = _keel_central_trimmed_bytes();
  size_t released = keel_purge();
  uint64_t trimmed = _keel_central_trimmed_bytes() - before;
  CHECK(cached_in_bin(cls) == 0);
  if (small_pages) CHECK_MSG(trimmed >= (uint64_t)N * 1000 / 2, "keel_purge trimmed %llu bytes",
                             (unsigned long long)trimmed);
  CHECK(released >= trimmed);
  for (int i = 0; i < N; i += 16) free(b[i]);

  fill_and_thin(b, N, &cls);
  CHECK(cached_in_bin(cls) > 0);
  before = _keel_central_trimmed_bytes();
  pid_t pid = fork();
  if (pid == 0) _exit(cached_in_bin(cls) == 0 ? 0 : 1); /* the child inherits an empty bin */
  int status = -1;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  trimmed = _keel_central_trimmed_bytes() - before;
  CHECK(cached_in_bin(cls) == 0);
  if (small_pages) CHECK_MSG(trimmed >= (uint64_t)N * 1000 / 2, "fork trimmed %llu bytes",
                             (unsigned long long)trimmed);
  for (int i = 0; i < N; i += 16) free(b[i]);
  _keel_options.background_purge = true;
}

/* Borrowing (borrow.c): a class that would take a new slab gets a free block of a
 * larger class instead - one that has gone cold, or has an eighth of its blocks free -
 * but only a block that shares its pages with blocks in use; never from a class that is
 * taking and has few holes, and never for an aligned request. */
static void test_borrow(void) {
  TEST_SECTION("borrowing holes of a larger class");
  _keel_options.background_purge = false; /* the purger thread must not decay meanwhile */
  enum { N = 256, IDLE = 1000, MAX_DRAINED = 4096 };
  unsigned mine = keel_size_class(1500), lender = keel_size_class(2000);
  const keel_class_t* lk = &_keel_classes[lender];
  keel_central_t* lcl = _keel_central_activate(lender);
  CHECK(_keel_classes[mine].size == 1536 && lk->size == 2048);
  for (unsigned c = mine + 1; c < lender; c++) CHECK(keel_central_of(c)->home.partial == NULL);
  CHECK(lcl->home.partial == NULL && _keel_central_out(lcl) == 0); /* no other test used the lender */
  static void* b[N];
  static bool live[N], lent[N];
  for (int i = 0; i < N; i++) {
    b[i] = _keel_alloc_direct(lender);
    memset(b[i], 1, lk->size);
    live[i] = true;
  }
  _keel_central_decay(IDLE); /* cold threshold: IDLE / 2 ticks */
  static void* drained[MAX_DRAINED];
  unsigned ndrained = 0;
  /* The class of 1,500 bytes has nothing free: no block in this thread's bin, none in
   * its central list. */
#define DRAIN()                                                                       \
  do {                                                                                \
    _keel_tcache_thread_flush();                                                      \
    while (_keel_central_has_free(mine) && ndrained < MAX_DRAINED) drained[ndrained++] = _keel_alloc_direct(mine); \
  } while (0)
#define GIVE_BACK(i)                          \
  do {                                        \
    live[i] = false;                          \
    keel_link_set(b[i], NULL);                 \
    _keel_central_give(lender, b[i], 1);      \
  } while (0)
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  uint64_t borrowed0 = _keel_central_borrowed_blocks();
  /* Few holes, in a class that took just now: no borrowing. */
  for (int i = 1; i < N; i += 2 * KEEL_BORROW_FREE_SHARE) GIVE_BACK(i);
  DRAIN();
  __atomic_store_n(&lcl->take_tick, now, __ATOMIC_RELAXED);
  void* hot = malloc(1500);
  CHECK(malloc_usable_size(hot) == 1536 && _keel_central_borrowed_blocks() == borrowed0);
  /* The same class gone cold lends one of those holes. */
  DRAIN();
  __atomic_fetch_add(&_keel_ticks, 1, __ATOMIC_RELAXED); /* past the miss just recorded */
  __atomic_store_n(&lcl->take_tick, now - 2 * IDLE, __ATOMIC_RELAXED);
  /* A lender whose lock is held is passed by, not waited for. */
  _keel_central_lock_class(lcl);
  void* busy = malloc(1500);
  _keel_central_unlock_class(lcl);
  CHECK(malloc_usable_size(busy) == 1536 && _keel_central_borrowed_blocks() == borrowed0);
  DRAIN();
  void* cold = malloc(1500);
  CHECK(malloc_usable_size(cold) == lk->size && _keel_central_borrowed_blocks() == borrowed0 + 1);
  int cold_at = -1;
  for (int i = 0; i < N; i++)
    if (b[i] == cold) cold_at = i;
  CHECK(cold_at >= 0 && !live[cold_at]);
  if (cold_at >= 0) lent[cold_at] = true;
  /* A free block of the lender in a thread's own bin is lent first (no lock, not
   * counted); only a lender that may lend qualifies. */
  {
    static uintptr_t heads[KEEL_NUM_CLASSES];
    for (unsigned c = 0; c < KEEL_NUM_CLASSES; c++) heads[c] = keel_head_of(NULL);
    CHECK(_keel_central_lender_in(heads, mine, 1500) == 0);
    heads[lender] = keel_head_of(b[0]);
    CHECK(_keel_central_lender_in(heads, mine, 1500) == lender);
    CHECK(_keel_central_lender_in(heads, keel_size_class(900), 900) == 0); /* more than twice */
    /* At most twice the request, whatever its class's size: 2,048 bytes for 1,024 but
     * not for 1,020. */
    CHECK(_keel_central_lender_in(heads, mine, 1020) == 0);
    CHECK(_keel_central_lender_in(heads, mine, 1024) == lender);
    __atomic_store_n(&lcl->take_tick, now, __ATOMIC_RELAXED); /* taking, few holes */
    CHECK(_keel_central_lender_in(heads, mine, 1500) == 0);
    __atomic_store_n(&lcl->take_tick, now - 2 * IDLE, __ATOMIC_RELAXED);
  }
  /* Under meshing the holes are left to the mesher. */
  DRAIN();
  __atomic_store_n(&_keel_options.mesh, KEEL_MESH_ON, __ATOMIC_RELAXED);
  {
    static uintptr_t heads[KEEL_NUM_CLASSES];
    for (unsigned c = 0; c < KEEL_NUM_CLASSES; c++) heads[c] = keel_head_of(NULL);
    heads[lender] = keel_head_of(b[0]);
    CHECK(_keel_central_lender_in(heads, mine, 1500) == 0);
  }
  void* meshing = malloc(1500);
  __atomic_store_n(&_keel_options.mesh, KEEL_MESH_OFF, __ATOMIC_RELAXED);
  CHECK(malloc_usable_size(meshing) == 1536 && _keel_central_borrowed_blocks() == borrowed0 + 1);
  /* Taking again, but with half its blocks free: the odd ones of the first half (holes
   * beside live blocks) and a run in the second half (pages holding free blocks only,
   * but for the last block's page). Every hole beside a live block is lent, then the
   * class takes a slab again. */
  __atomic_store_n(&lcl->take_tick, now, __ATOMIC_RELAXED);
  for (int i = 0; i < N; i++)
    if (live[i] && !((i < N / 2 && i % 2 == 0) || i == N - 1)) GIVE_BACK(i);
  size_t page = _keel_page_size;
  unsigned lendable = 0;
  for (int i = 0; i < N; i++) {
    if (live[i] || lent[i]) continue;
    uintptr_t first = (uintptr_t)b[i] & ~(page - 1), last = ((uintptr_t)b[i] + lk->size - 1) & ~(page - 1);
    bool shared = true;
    for (uintptr_t pg = first; pg <= last; pg += page) {
      bool any = false;
      for (int j = 0; j < N; j++)
        if ((live[j] || lent[j]) && ((uintptr_t)b[j] & ~(page - 1)) <= pg &&
            (((uintptr_t)b[j] + lk->size - 1) & ~(page - 1)) >= pg)
          any = true;
      shared = shared && any;
    }
    lendable += shared;
  }
  CHECK(lendable > 0);
  DRAIN();
  __atomic_fetch_add(&_keel_ticks, 1, __ATOMIC_RELAXED);
  void* aligned = memalign(512, 1500); /* its class was chosen for alignment: never lent */
  CHECK(aligned != NULL && (uintptr_t)aligned % 512 == 0 && malloc_usable_size(aligned) == 1536);
  DRAIN();
  static void* got[N];
  unsigned ngot = 0, strays = 0;
  /* Borrows until a block of the class's own comes; returns how many were lent. */
#define BORROW_ALL()                                                    \
  do {                                                                  \
    for (; ngot < N; ngot++) {                                          \
      got[ngot] = malloc(1500);                                         \
      if (malloc_usable_size(got[ngot]) != lk->size) break;             \
      int at = -1;                                                      \
      for (int i = 0; i < N; i++)                                       \
        if (b[i] == got[ngot]) at = i;                                  \
      strays += at < 0 || live[at] || lent[at];                         \
      if (at >= 0) lent[at] = true;                                     \
    }                                                                   \
  } while (0)
  BORROW_ALL();
  unsigned hot_got = ngot;
  uint64_t blocks = (uint64_t)lcl->slabs * lk->count, in_slabs = blocks - _keel_central_out(lcl);
  /* Lent until no hole is left or until fewer than an eighth of its blocks were free. */
  CHECK_MSG(hot_got > 0 && strays == 0 && (hot_got == lendable || in_slabs * KEEL_BORROW_FREE_SHARE < blocks),
            "borrowed %u blocks (%u not lendable) of %u lendable, %llu of %llu free", hot_got, strays, lendable,
            (unsigned long long)in_slabs, (unsigned long long)blocks);
  CHECK(ngot < N && malloc_usable_size(got[ngot]) == 1536); /* then a slab of its own */
  if (ngot < N) drained[ndrained++] = got[ngot];
  /* Gone cold, it lends the rest. */
  DRAIN();
  __atomic_fetch_add(&_keel_ticks, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&lcl->take_tick, now - 2 * IDLE, __ATOMIC_RELAXED);
  BORROW_ALL();
  CHECK_MSG(ngot == lendable && strays == 0, "borrowed %u blocks (%u not lendable), %u lendable", ngot, strays,
            lendable);
  CHECK(_keel_central_borrowed_blocks() == borrowed0 + 1 + ngot);
  CHECK(ngot < N && malloc_usable_size(got[ngot]) == 1536);
  /* A borrowed block frees into its own class's bin, like any other. */
  keel_tcache_t* t = _keel_thread.tc;
  if (ngot > 0 && t != &_keel_tc_empty && t->bin[lender].max > 0) {
    free(got[0]);
    CHECK(_keel_tcache_contains(t, lender, got[0]));
    got[0] = NULL;
  }
  for (unsigned i = 0; i <= ngot && i < N; i++) free(got[i]);
  for (int i = 0; i < N; i++)
    if (live[i]) free(b[i]);
  for (unsigned i = 0; i < ndrained; i++) free(drained[i]);
  free(hot);
  free(busy);
  free(cold);
  free(meshing);
  free(aligned);
  _keel_tcache_thread_flush();
  _keel_central_purge_all(0); /* back to the slabs, nothing trimmed */
  CHECK(_keel_central_out(lcl) == 0);
  _keel_verify();
#undef DRAIN
#undef GIVE_BACK
#undef BORROW_ALL
  _keel_options.background_purge = true;
}

/* Carving (borrow.c): a class that finds nothing to borrow within twice its size takes
 * a free block of a class 4-64 times its size, on pages in use, and hands out its own
 * blocks from it; the block goes back to its class with the last of them. Frees in the
 * lender's slab take the slow path, which tells its own blocks from carved ones. */
static void test_carve(void) {
  TEST_SECTION("carving holes of a much larger class into small blocks");
  _keel_options.background_purge = false; /* the purger thread must not decay meanwhile */
  enum { N = 256, IDLE = 1000 };
  /* The lender is the smallest class a 48-byte one may carve (4 blocks and the header),
   * so that holes other tests left in larger classes are not taken first. */
  unsigned mine = keel_size_class(40), lender = keel_size_class(32 + 4 * 48);
  const keel_class_t* mk = &_keel_classes[mine];
  const keel_class_t* lk = &_keel_classes[lender];
  keel_central_t* lcl = _keel_central_activate(lender);
  unsigned count = (lk->size - 32) / mk->size;
  CHECK(mk->size == 48 && lk->size == 224 && count == 4);
  CHECK(lcl->home.partial == NULL && _keel_central_out(lcl) == 0); /* no other test used the lender */
  static void* b[N];
  for (int i = 0; i < N; i++) {
    b[i] = _keel_alloc_direct(lender);
    memset(b[i], 1, lk->size);
  }
  _keel_central_decay(IDLE); /* sets the cold threshold: carving needs the purger's clock */
  for (int i = 1; i < N; i += 2) { /* holes beside live blocks */
    keel_link_set(b[i], NULL);
    _keel_central_give(lender, b[i], 1);
  }
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  __atomic_fetch_add(&_keel_ticks, 1, __ATOMIC_RELAXED); /* past any miss recorded before */
  __atomic_store_n(&lcl->take_tick, now - 2 * IDLE, __ATOMIC_RELAXED); /* cold */
  uint64_t holes0 = _keel_central_carved_holes();
  static void* got[2 * 64 + 1];
  unsigned n = count + 1;
  for (unsigned j = 0; j < n; j++) got[j] = _keel_central_carve(mine);
  CHECK(got[0] != NULL && got[count] != NULL);
  CHECK(_keel_central_carved_holes() == holes0 + 2); /* count blocks in one hole, then another */
  /* A class that carved KEEL_CARVES_PER_TICK times in a tick, and more often than it has
   * carved blocks out, takes a slab instead: its demand swings over the same holes. One
   * that keeps what it carves carves on. */
  {
    keel_central_t* mcl = keel_central_of(mine);
    void* capped = NULL;
    for (int attempt = 0; attempt < 8; attempt++) { /* again if the purger ticked meanwhile */
      uint64_t tick = __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
      __atomic_store_n(&mcl->carve_tick, (uint32_t)tick, __ATOMIC_RELAXED);
      __atomic_store_n(&mcl->carves, KEEL_CARVES_PER_TICK, __ATOMIC_RELAXED);
      capped = _keel_central_carve(mine);
      if (__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED) == tick) break;
      free(capped);
      capped = NULL;
    }
    CHECK(capped == NULL);
    __atomic_store_n(&mcl->carves, 0, __ATOMIC_RELAXED);
    enum { KEPT = KEEL_CARVES_PER_TICK + 8 };
    static void* kept[KEPT];
    for (unsigned j = 0; j < KEPT; j++) kept[j] = _keel_central_carve(mine);
    CHECK(kept[KEPT - 1] != NULL && mcl->carved_blocks >= KEPT);
    __atomic_store_n(&mcl->carves, KEPT - 4, __ATOMIC_RELAXED);
    void* more = _keel_central_carve(mine);
    CHECK(more != NULL);
    free(more);
    for (unsigned j = 0; j < KEPT; j++) free(kept[j]);
    __atomic_store_n(&mcl->carves, 0, __ATOMIC_RELAXED);
    CHECK(_keel_central_carved_holes() == holes0 + 2);
  }
  char* hole = NULL;
  for (int i = 1; i < N; i += 2)
    if ((char*)got[0] > (char*)b[i] && (char*)got[0] < (char*)b[i] + lk->size) hole = b[i];
  CHECK(hole != NULL && keel_pagemap_get(hole) == KEEL_KIND_CARVED);
  for (unsigned j = 0; j < count && hole != NULL; j++) {
    CHECK((char*)got[j] >= hole + 32 && (char*)got[j] + mk->size <= hole + lk->size);
    CHECK(((uintptr_t)got[j] & 15) == 0 && malloc_usable_size(got[j]) == mk->size);
    memset(got[j], 2, mk->size);
  }
  CHECK(malloc_usable_size(b[0]) == lk->size); /* the slab's own blocks keep their class */
  CHECK(realloc(got[2], 44) == got[2]); /* in place, as any block that still fits */
  CHECK(realloc(b[0], lk->size - 8) == b[0]);
  _keel_verify();
  /* One of the slab's own blocks freed among carved ones goes back as any other. */
  free(b[0]);
  b[0] = NULL;
  /* A double free of a carved block is named (in a child: it aborts). */
  pid_t pid = fork();
  if (pid == 0) {
    free(got[1]);
    free(got[1]);
    _exit(0);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
  /* The last block of a hole gives the hole back to its class, and the slab its tag. */
  for (unsigned j = 0; j < n; j++) free(got[j]);
  CHECK(_keel_central_carved_holes() == holes0);
  CHECK(keel_pagemap_get(b[2]) == lender);
  /* A block of a hole that went back carries the free key, so a second free of it is
   * named a double free, not an invalid pointer inside a free block of the lender. */
  CHECK(((uintptr_t*)got[1])[1] == _keel_free_key);
  CHECK(child_stops_with(free_it, got[1], "double free"));
  _keel_verify();
  /* Even where the hole's return leaves its pages with free blocks only: the cold lender
   * purged them on that free, and the keys with them (a second free then passed free's
   * fast path as a block of the lender's and was handed out overlapping two of them).
   * They wait for the trim a purge delay later. (Checked here, not in a child: the fork
   * handlers purge free pages.) */
  now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  __atomic_fetch_add(&_keel_ticks, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&lcl->take_tick, now - 2 * IDLE, __ATOMIC_RELAXED); /* cold again */
  void* again = _keel_central_carve(mine);
  bool exact;
  char* hole2 = again != NULL ? (char*)_keel_block_start(lender, again, &exact) : NULL;
  CHECK(again != NULL && keel_pagemap_get(again) == KEEL_KIND_CARVED);
  uintptr_t page = _keel_page_size, lo = (uintptr_t)hole2 & ~(page - 1);
  uintptr_t hi = ((uintptr_t)hole2 + lk->size + page - 1) & ~(page - 1);
  for (int i = 2; i < N; i += 2)
    if (b[i] != NULL && (uintptr_t)b[i] + lk->size > lo && (uintptr_t)b[i] < hi) {
      keel_link_set(b[i], NULL);
      _keel_central_give(lender, b[i], 1);
      b[i] = NULL;
    }
  free(again);
  CHECK(keel_pagemap_get(hole2) == lender && ((uintptr_t*)again)[1] == _keel_free_key);
  for (int i = 2; i < N; i += 2) {
    if (b[i] == NULL) continue;
    keel_link_set(b[i], NULL);
    _keel_central_give(lender, b[i], 1);
  }
  _keel_tcache_thread_flush();
  _keel_options.background_purge = true;
}

/* A slab's bitmap words after the first live in rows of its chunk's header that it
 * takes when it first needs them (chunk.h, free_rest): one row of 32 words, or an
 * aligned pair for 16-byte blocks (63 words); the lowest free, so a few small-block
 * slabs keep their words on a page or two of the header. A full slab gives them back
 * (its words are all zero) and takes them again, zeroed, with its first free; a
 * released one gives them back. */
static void test_bitmap_rows(void) {
  TEST_SECTION("bitmap rows taken on demand, lowest first, given back when full");
  static const size_t sizes[] = {16, 256, 32, 128, 1024};
  enum { NS = sizeof sizes / sizeof sizes[0], PER = 3, MAXB = 4096 * PER };
  static void* blocks[NS][MAXB];
  static uint32_t nblocks[NS];
  keel_slab_t* slabs[NS * PER + NS];
  unsigned nslabs = 0;
  for (unsigned i = 0; i < NS; i++) {
    unsigned cls = keel_size_class(sizes[i]);
    const keel_class_t* k = &_keel_classes[cls];
    /* PER slabs' worth: every new slab hands out all its blocks. */
    uint32_t want = k->count * PER;
    while (nblocks[i] < want) {
      uint32_t got = 0;
      void* list = _keel_central_take(cls, want - nblocks[i] > 4096 ? 4096 : want - nblocks[i], &got);
      CHECK(list != NULL);
      if (list == NULL) break;
      for (void* p = list; p; p = keel_link_next(p, cls)) blocks[i][nblocks[i]++] = p;
    }
    for (uint32_t b = 0; b < nblocks[i]; b++) {
      keel_slab_t* s = keel_span_head(keel_chunk_of(blocks[i][b]), keel_unit_index(blocks[i][b]));
      bool seen = false;
      for (unsigned n = 0; n < nslabs; n++) seen |= slabs[n] == s;
      if (!seen && nslabs < sizeof slabs / sizeof slabs[0]) slabs[nslabs++] = s;
    }
  }
  /* Full slabs past their 64th block hold no rows: every word of theirs reads 0. */
  unsigned full = 0;
  for (unsigned n = 0; n < nslabs; n++) {
    keel_slab_t* s = slabs[n];
    const keel_class_t* k = &_keel_classes[s->cls];
    if (k->count <= 64 || s->used != k->count) continue;
    full++;
    CHECK(s->row == 0 && s->ready == (k->count + 63) / 64);
    for (unsigned w = 0; w < s->ready; w++) CHECK(keel_slab_word(s, k->count, w) == 0);
  }
  CHECK(full >= 4 * (PER - 1)); /* 16, 256, 32 and 128 bytes: all but a last slab */
  _keel_verify();
  /* One block back in each: the slab takes its rows again - the right count (a pair for
   * 16 bytes; 32 bytes need 31 words and are too small to lend holes, so they keep no
   * carved bitmap), a pair aligned, held in the chunk's rows_used, no two slabs' rows
   * shared - and its words read all zero but the block's bit. */
  void* back[sizeof slabs / sizeof slabs[0]] = {0};
  for (unsigned i = 0; i < NS; i++) {
    unsigned cls = keel_size_class(sizes[i]);
    for (uint32_t b = 0; b < nblocks[i]; b++) {
      keel_slab_t* s = keel_span_head(keel_chunk_of(blocks[i][b]), keel_unit_index(blocks[i][b]));
      for (unsigned n = 0; n < nslabs; n++)
        if (slabs[n] == s && back[n] == NULL && s->used == _keel_classes[cls].count) {
          back[n] = blocks[i][b];
          blocks[i][b] = NULL;
          keel_link_set(back[n], NULL);
          _keel_central_give(cls, back[n], 1);
        }
    }
  }
  unsigned restored = 0;
  for (unsigned n = 0; n < nslabs; n++) {
    keel_slab_t* s = slabs[n];
    const keel_class_t* k = &_keel_classes[s->cls];
    if (back[n] == NULL || k->count <= 64) continue;
    restored++;
    CHECK(s->row != 0);
    if (s->row == 0) continue;
    unsigned r = (unsigned)s->row - 1, rows = keel_class_rows(k);
    CHECK(rows == (k->size == 16 ? 2u : 1u) && (rows == 1 || r % 2 == 0));
    for (unsigned q = r; q < r + rows; q++) CHECK((keel_chunk_of(s)->rows_used[q / 64] >> (q % 64)) & 1);
    for (unsigned m = 0; m < n; m++) {
      keel_slab_t* o = slabs[m];
      if (o->row == 0 || keel_chunk_of(o) != keel_chunk_of(s)) continue;
      unsigned ro = (unsigned)o->row - 1, rows_o = keel_class_rows(&_keel_classes[o->cls]);
      CHECK(ro + rows_o <= r || r + rows <= ro);
    }
    size_t idx = (size_t)((char*)back[n] - (char*)keel_unit_addr(keel_chunk_of(s), (unsigned)(s - keel_chunk_of(s)->units))) / k->size;
    for (unsigned w = 0; w < s->ready; w++)
      CHECK(keel_slab_word(s, k->count, w) == (w == idx / 64 ? (uint64_t)1 << (idx % 64) : 0));
    CHECK(_keel_central_is_free(s->cls, back[n]));
  }
  CHECK(restored == full);
  _keel_verify();
  /* Given back and released: the rows go back with the slabs. */
  for (unsigned i = 0; i < NS; i++) {
    unsigned cls = keel_size_class(sizes[i]);
    for (uint32_t b = 0; b < nblocks[i]; b++)
      if (blocks[i][b] != NULL) {
        keel_link_set(blocks[i][b], NULL);
        _keel_central_give(cls, blocks[i][b], 1);
      }
  }
  _keel_central_purge_all(0);
  _keel_verify(); /* rows_used matches the rows of the slabs still there */
  unsigned released = 0;
  for (unsigned n = 0; n < nslabs; n++) released += slabs[n]->state != KEEL_UNIT_SLAB;
  CHECK(released >= nslabs - NS); /* one empty slab per class may be kept */
}

static void test_verify(void) {
  TEST_SECTION("invariant walk over a busy heap");
  void* blocks[3000];
  for (int i = 0; i < 3000; i++) blocks[i] = malloc((size_t)(i * 37) % 200000 + 1);
  for (int i = 0; i < 3000; i += 3) free(blocks[i]);
  _keel_verify(); /* aborts on a broken invariant */
  for (int i = 1; i < 3000; i += 3) free(blocks[i]);
  keel_thread_flush();
  _keel_verify();
  for (int i = 2; i < 3000; i += 3) free(blocks[i]);
  keel_purge();
  _keel_verify();
  CHECK(1);
}

static void test_stats_api(void) {
  TEST_SECTION("statistics: per class and JSON");
  void* held[100];
  for (int i = 0; i < 100; i++) held[i] = malloc(48);
  keel_class_stats_t cs[KEEL_NUM_CLASSES];
  size_t n = keel_stats_classes(cs, KEEL_NUM_CLASSES);
  CHECK(n == KEEL_NUM_CLASSES - 1);
  unsigned cls = keel_size_class(48);
  CHECK(cs[cls - 1].block_size == 48);
  CHECK(cs[cls - 1].blocks_in_use >= 100);
  /* (Blocks carved out of other classes' holes are in use without a slab of their own.) */
  CHECK(cs[cls - 1].slab_bytes + (uint64_t)keel_central_of(cls)->carved_blocks * 48 >= cs[cls - 1].blocks_in_use * 48);
  CHECK(cs[cls - 1].slab_bytes == (uint64_t)cs[cls - 1].slabs * KEEL_UNIT_SIZE);
  char small[16];
  size_t need = keel_stats_json(small, sizeof small);
  CHECK(need > sizeof small && strlen(small) == sizeof small - 1);
  /* (Allocating the buffer changes the figures, so give it room to grow.) */
  size_t cap = need * 2 + 256;
  char* big = malloc(cap);
  size_t len = keel_stats_json(big, cap);
  CHECK(len < cap && strlen(big) == len);
  CHECK(big[0] == '{' && big[len - 1] == '}');
  CHECK(strstr(big, "\"allocated\":") != NULL && strstr(big, "\"block_size\":48,") != NULL);
  CHECK(strstr(big, "\"locks\":{\"central\":{\"acquired\":") != NULL);
  free(big);
  for (int i = 0; i < 100; i++) free(held[i]);
}

/* Lock counters: every kind is named; taking a lock counts; a lock found held counts as
 * contended (held here by the test, taken by a second thread). */
static keel_lock_t test_lock = KEEL_LOCK_INIT;
static void* take_test_lock(void* arg) {
  (void)arg;
  keel_lock(&test_lock);
  keel_unlock(&test_lock);
  return NULL;
}

static void test_lock_stats(void) {
  keel_lock_stats_t ls[16];
  size_t n = keel_stats_locks(ls, 16);
  CHECK(n == 8);
  CHECK(strcmp(ls[0].name, "central") == 0 && strcmp(ls[1].name, "page heap") == 0);
  CHECK(ls[0].acquired > 0 && ls[1].acquired > 0);
  for (size_t i = 0; i < n; i++) CHECK(ls[i].contended <= ls[i].acquired);
  keel_stats_locks(ls, 1); /* a short array is filled as far as it goes */
  uint64_t before = test_lock.acquired;
  keel_lock(&test_lock);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, take_test_lock, NULL) == 0);
  /* Wait until the other thread is in the slow path (spinning or asleep). */
  for (int i = 0; i < 200 && atomic_load(&test_lock.state) != 2; i++) usleep(1000);
  keel_unlock(&test_lock);
  pthread_join(th, NULL);
  CHECK(test_lock.acquired == before + 2);
  CHECK(test_lock.contended >= 1);
  CHECK(test_lock.sleeps >= 1);
  keel_lock_stats_t one = {"test", 0, 0, 0};
  _keel_lock_read(&test_lock, &one);
  CHECK(one.acquired == before + 2 && one.contended == test_lock.contended); /* reading takes no lock */
}

int main(void) {
  /* These tests look inside this thread's cache between calls: the purger must not take
   * it back meanwhile (under qemu a test can run for over a second without a slow path). */
  _keel_options.tcache_idle_ms = 0;
  test_platform_calls();
  test_popcount();
  test_helper_stack_after_fork();
  test_size_classes();
  test_pagemap();
  test_pageheap();
  test_central();
  test_huge_table();
  test_huge_cache_cold();
  test_options();
  test_thread_cache();
  test_free_room_back();
  test_sample_uncached();
  test_sample_freed_to_slab();
  test_estimate_inactive();
  test_half_batches();
  test_batch_index();
  test_transfer_lines();
  test_freelist_attacks();
  test_fine_classes();
  test_uncached_class();
  test_busy_trim();
  test_busy_trim_big();
  test_free_trims_big();
  test_purge_now();
  test_borrow();
  test_carve();
  test_bitmap_rows();
  test_verify();
  test_stats_api();
  test_lock_stats();
  test_purge_off_spares(); /* spreads the transfer cache over its lines (a second cache) */
  test_gather();
  test_fork_profile_lock(); /* last: failing, it waits out the child's alarm */
  return test_finish();
}
