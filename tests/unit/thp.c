/* thp.c -- the KEEL_THP policy (transparent huge pages for Keel's own memory), linked
 * against the static library so the policy can be set directly and the page heap
 * inspected.
 *
 *  - advice: chunks and huge blocks mapped under ALWAYS / NEVER carry the kernel's VMA
 *    flag (`hg` = MADV_HUGEPAGE, `nh` = MADV_NOHUGEPAGE in /proc/self/smaps), SYSTEM
 *    gives none, and _keel_thp_apply_all() re-advises what is already mapped;
 *  - purging under ALWAYS: a huge page that is partly in use keeps all its pages, a
 *    wholly free aligned one is purged whole, the dirty/clean counters stay exact, and
 *    slab trimming is skipped (checked with mincore, which works whether or not the
 *    kernel really backed the range with a huge page);
 *  - DENSE: nothing at fault time, the purger's promotion collapses dense resident huge
 *    pages (AnonHugePages), which stay whole while less than a quarter is free, go back
 *    to base pages beyond that, and are given back whole when wholly free.
 *
 * Residency checks need a quiet heap: the program re-executes itself with
 * KEEL_BACKGROUND_PURGE=0 so that no purger thread changes it between two looks, and
 * the helpers below read /proc with open/read, never allocating. */
#include "core/internal.h"
#include "test.h"

#include <sys/mman.h>

keel_chunk_t* _keel_pageheap_first_chunk(unsigned run); /* pageheap.c, for verify.c */
uint64_t _keel_pageheap_dirty_bytes(void);               /* pageheap.c */

#define HP ((size_t)2 << 20) /* the huge page size the purge checks assume */

static bool kernel_has_thp;
/* Blocks of 4-8 MiB hold a whole huge page only if huge pages are at most 2 MiB (not on
 * arm64 with 16 or 64 KiB pages: 32 or 512 MiB); otherwise they rightly get no advice. */
static bool blocks_hold_huge_pages;

/* ---- /proc/self/smaps: the VmFlags (and AnonHugePages) of the mapping holding p ---- */
static char smaps_buf[8 << 20];

static size_t read_smaps(void) {
  int fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t got = 0;
  for (;;) {
    ssize_t n = read(fd, smaps_buf + got, sizeof smaps_buf - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  smaps_buf[got] = 0;
  return got;
}

/* Points *flags at the VmFlags line's values of the VMA holding p (NUL-terminated in
 * place) and sets *anon_huge_kb; false if no VMA holds p. */
static bool vma_info(const void* p, char** flags, unsigned long* anon_huge_kb) {
  if (read_smaps() == 0) return false;
  uintptr_t a = (uintptr_t)p;
  bool inside = false;
  *flags = NULL;
  *anon_huge_kb = 0;
  for (char* line = smaps_buf; *line;) {
    char* end = strchr(line, '\n');
    if (end) *end = 0;
    char* dash = strchr(line, '-');
    char* space = strchr(line, ' ');
    if (dash && space && dash < space && line[0] != ' ') { /* "start-end perms ..." */
      char* e;
      unsigned long lo = strtoul(line, &e, 16);
      if (e == dash) {
        if (inside) break; /* past the VMA we wanted */
        unsigned long hi = strtoul(dash + 1, NULL, 16);
        inside = a >= lo && a < hi;
      }
    } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
      *flags = line + 8;
    } else if (inside && strncmp(line, "AnonHugePages:", 14) == 0) {
      *anon_huge_kb = strtoul(line + 14, NULL, 10);
    }
    if (!end) break;
    line = end + 1;
  }
  return *flags != NULL;
}

static bool has_flag(const char* flags, const char* f) {
  size_t n = strlen(f);
  for (const char* s = flags; (s = strstr(s, f)) != NULL; s += n)
    if (s[-1] == ' ' && (s[n] == ' ' || s[n] == 0)) return true;
  return false;
}

static unsigned long anon_huge_kb(const void* p) {
  char* flags;
  unsigned long kb = 0;
  vma_info(p, &flags, &kb);
  return kb;
}

/* "hg", "nh" or "" for the mapping holding p ("?" if unknown). */
static const char* thp_flag(const void* p) {
  char* flags;
  unsigned long ahp;
  if (!vma_info(p, &flags, &ahp)) return "?";
  bool hg = has_flag(flags, "hg"), nh = has_flag(flags, "nh");
  return hg && nh ? "hg+nh" : hg ? "hg" : nh ? "nh" : "";
}

/* ---- residency ----------------------------------------------------------------------- */
static unsigned char vec[(4 << 20) / 4096];

/* Pages of [p, p + n) in memory, or -1 if the range is not mapped. */
static long resident_pages(const void* p, size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), count = n / page;
  if (count > sizeof vec) return -2;
  if (mincore((void*)p, n, vec) != 0) return -1;
  long r = 0;
  for (size_t i = 0; i < count; i++) r += vec[i] & 1;
  return r;
}

static long pages_in(size_t bytes) { return (long)(bytes / (size_t)sysconf(_SC_PAGESIZE)); }

static char* unit_ptr(keel_chunk_t* c, unsigned k) { return (char*)keel_unit_addr(c, k); }

/* The page heap's counters against its masks: every free unit is either dirty (counted
 * as committed) or clean (counted as retained), and the counters agree with the masks. */
static void check_counters(const char* where) {
  uint64_t dirty = 0, clean = 0;
  _keel_pageheap_lock_all();
  for (unsigned r = 0; r < KEEL_CHUNK_UNITS; r++)
    for (keel_chunk_t* c = _keel_pageheap_first_chunk(r); c != NULL; c = c->next) {
      CHECK_MSG((c->dirty_mask & ~c->free_mask) == 0, "%s: dirty unit not free", where);
      dirty += (uint64_t)__builtin_popcountll(c->dirty_mask);
      clean += (uint64_t)__builtin_popcountll(c->free_mask & ~c->dirty_mask);
    }
  uint64_t dirty_bytes = _keel_pageheap_dirty_bytes();
  _keel_pageheap_unlock_all();
  keel_stats_t st = {0};
  _keel_pageheap_stats(&st);
  CHECK_MSG(dirty_bytes == dirty * KEEL_UNIT_SIZE, "%s: dirty counter %ju, masks %ju units",
            where, (uintmax_t)dirty_bytes, (uintmax_t)dirty);
  CHECK_MSG(st.retained == clean * KEEL_UNIT_SIZE, "%s: retained %ju, masks %ju clean units",
            where, (uintmax_t)st.retained, (uintmax_t)clean);
  CHECK_MSG(st.committed == st.mapped - clean * KEEL_UNIT_SIZE, "%s: committed %ju", where,
            (uintmax_t)st.committed);
}

/* A span of 63 units: after a full purge no chunk has that much free, so it comes from a
 * chunk mapped now, under the current policy. Made to look like a large block so that
 * the invariant walk accepts it. */
static keel_slab_t* fresh_chunk_span(void) {
  keel_purge(); /* wholly free chunks and cached huge mappings go back to the OS */
  bool zeroed = false;
  keel_slab_t* s = _keel_pageheap_alloc(KEEL_CHUNK_UNITS - 1, 1, &zeroed);
  if (!CHECK(s != NULL && zeroed)) return NULL;
  keel_chunk_t* c = keel_chunk_of(s);
  CHECK(s == &c->units[1]);
  s->size = (uint64_t)s->units << KEEL_UNIT_SHIFT;
  return s;
}

static void shrink(keel_slab_t* s, size_t units) {
  _keel_pageheap_shrink(s, units);
  s->size = (uint64_t)units << KEEL_UNIT_SHIFT;
}

/* ---- advice ------------------------------------------------------------------------ */
static void test_advice(int policy, const char* want) {
  char title[64];
  snprintf(title, sizeof title, "advice under policy %d: \"%s\"", policy, want);
  TEST_SECTION(title);
  _keel_options.thp = policy;
  keel_slab_t* s = fresh_chunk_span();
  if (s == NULL) return;
  keel_chunk_t* c = keel_chunk_of(s);
  void* huge = malloc(4 << 20); /* own mapping; 4 MiB always holds an aligned 2 MiB */
  void* smallhuge = malloc(1536 << 10); /* own mapping too small for a huge page */
  CHECK(huge != NULL && smallhuge != NULL);
  if (kernel_has_thp) {
    const char* f;
    CHECK_MSG(strcmp(f = thp_flag(c), want) == 0, "chunk %p: \"%s\"", (void*)c, f);
    CHECK_MSG(strcmp(f = thp_flag(unit_ptr(c, 40)), want) == 0, "chunk unit 40: \"%s\"", f);
    CHECK_MSG(strcmp(f = thp_flag(huge), blocks_hold_huge_pages ? want : "") == 0,
              "huge block %p: \"%s\"", huge, f);
    /* A mapping that cannot hold a whole huge page gets no advice (2 MiB pages). */
    if (_keel_prim_huge_page_size() == HP)
      CHECK_MSG(strcmp(f = thp_flag(smallhuge), "") == 0, "1.5 MiB block: \"%s\"", f);
  }
  free(smallhuge);
  free(huge);
  _keel_pageheap_free(s);
}

static void test_apply_all(void) {
  TEST_SECTION("_keel_thp_apply_all: ALWAYS -> NEVER -> ALWAYS");
  _keel_options.thp = KEEL_THP_ALWAYS;
  keel_slab_t* s = fresh_chunk_span();
  if (s == NULL) return;
  keel_chunk_t* c = keel_chunk_of(s);
  void* live = malloc(6 << 20);
  void* cached = malloc(5 << 20);
  CHECK(live != NULL && cached != NULL);
  free(cached); /* stays mapped in the huge cache for the purge delay */
  if (!blocks_hold_huge_pages) printf("   (huge pages > 2 MiB: huge-block checks skipped)\n");
  if (kernel_has_thp && blocks_hold_huge_pages) {
    CHECK(strcmp(thp_flag(c), "hg") == 0);
    CHECK(strcmp(thp_flag(live), "hg") == 0);
    CHECK(strcmp(thp_flag(cached), "hg") == 0);
    _keel_options.thp = KEEL_THP_NEVER;
    _keel_thp_apply_all();
    const char* f;
    CHECK_MSG(strcmp(f = thp_flag(c), "nh") == 0, "chunk: \"%s\"", f);
    CHECK_MSG(strcmp(f = thp_flag(live), "nh") == 0, "live huge block: \"%s\"", f);
    CHECK_MSG(strcmp(f = thp_flag(cached), "nh") == 0, "cached huge block: \"%s\"", f);
    /* Reused from the cache, the block keeps the advice apply_all gave it. */
    void* again = malloc(5 << 20);
    CHECK(again == cached);
    CHECK_MSG(strcmp(f = thp_flag(again), "nh") == 0, "reused huge block: \"%s\"", f);
    /* Grown past what it could hold before: 1.5 MiB -> 8 MiB by mremap. */
    _keel_options.thp = KEEL_THP_ALWAYS;
    _keel_thp_apply_all();
    CHECK(strcmp(thp_flag(c), "hg") == 0 && strcmp(thp_flag(live), "hg") == 0);
    void* grow = malloc(1536 << 10);
    CHECK(grow != NULL && strcmp(thp_flag(grow), "") == 0);
    grow = realloc(grow, 8 << 20);
    CHECK_MSG(grow != NULL && strcmp(f = thp_flag(grow), "hg") == 0, "grown block: \"%s\"", f);
    free(grow);
    free(again);
  }
  free(live);
  _keel_pageheap_free(s);
  _keel_options.thp = KEEL_THP_SYSTEM;
}

/* ---- purging under ALWAYS ------------------------------------------------------------ */
static void test_purge_whole(void) {
  TEST_SECTION("ALWAYS, 2 MiB huge pages: only whole free huge pages are purged");
  _keel_options.thp = KEEL_THP_ALWAYS;
  _keel_options.huge_page_size = HP;
  keel_slab_t* s = fresh_chunk_span();
  if (s == NULL) return;
  keel_chunk_t* c = keel_chunk_of(s);
  const unsigned g = (unsigned)(HP / KEEL_UNIT_SIZE); /* units per huge page: 32 */
  const size_t body = (KEEL_CHUNK_UNITS - 1) * KEEL_UNIT_SIZE; /* units 1..63 */
  memset(unit_ptr(c, 1), 0x5a, body);
  CHECK(resident_pages(unit_ptr(c, 1), body) == pages_in(body));
  /* Whether the kernel really gave huge pages depends on the machine (setting, free
   * memory); when it did, a purge that split one would lower AnonHugePages. */
  unsigned long ahp0 = anon_huge_kb(c), ahp;

  /* Units 41..63 free: the second huge page (units 32..63) is partly used. */
  shrink(s, 40);
  keel_stats_t before = {0}, after = {0};
  before.size = after.size = sizeof(keel_stats_t);
  keel_stats_get(&before);
  keel_purge();
  keel_stats_get(&after);
  CHECK_MSG(resident_pages(unit_ptr(c, g), HP) == pages_in(HP),
            "partly used huge page: %ld of %ld pages resident",
            resident_pages(unit_ptr(c, g), HP), pages_in(HP));
  CHECK(c->dirty_mask == ((~(uint64_t)0) << 41));
  check_counters("partly used huge page kept");
  printf("   (AnonHugePages of the chunk's mapping: %lu kB)\n", ahp0);
  CHECK_MSG((ahp = anon_huge_kb(c)) >= ahp0, "AnonHugePages %lu kB -> %lu kB: split", ahp0, ahp);

  /* Units 21..63 free: the second huge page is wholly free and goes back in one piece;
   * the first holds the chunk header and the live units 1..20, so it stays whole. */
  shrink(s, 20);
  keel_stats_get(&before);
  keel_purge();
  keel_stats_get(&after);
  CHECK_MSG(resident_pages(unit_ptr(c, g), HP) == 0, "free huge page: %ld pages resident",
            resident_pages(unit_ptr(c, g), HP));
  CHECK_MSG(resident_pages(unit_ptr(c, 1), HP - KEEL_UNIT_SIZE) == pages_in(HP - KEEL_UNIT_SIZE),
            "first huge page: %ld pages resident",
            resident_pages(unit_ptr(c, 1), HP - KEEL_UNIT_SIZE));
  CHECK_MSG((ahp = anon_huge_kb(c)) + (HP >> 10) >= ahp0, "AnonHugePages %lu kB -> %lu kB",
            ahp0, ahp);
  CHECK(c->dirty_mask == (((uint64_t)1 << 32) - 1) - (((uint64_t)1 << 21) - 1));
  EXPECT_GE_U(after.purged_bytes - before.purged_bytes, HP); /* units 32..63 were dirty */
  check_counters("free huge page purged");
  CHECK(memcmp(unit_ptr(c, 21), unit_ptr(c, 1), KEEL_UNIT_SIZE) == 0); /* still there */

  /* Under SYSTEM the same heap is purged unit by unit. */
  _keel_options.thp = KEEL_THP_SYSTEM;
  keel_purge();
  CHECK_MSG(resident_pages(unit_ptr(c, 21), 11 * KEEL_UNIT_SIZE) == 0,
            "SYSTEM: units 21..31: %ld pages resident",
            resident_pages(unit_ptr(c, 21), 11 * KEEL_UNIT_SIZE));
  CHECK(c->dirty_mask == 0);
  check_counters("SYSTEM purge");

  /* Back under ALWAYS, a wholly free chunk is unmapped even though units are dirty. */
  _keel_options.thp = KEEL_THP_ALWAYS;
  memset(unit_ptr(c, 1), 0x5a, 20 * KEEL_UNIT_SIZE);
  shrink(s, 10); /* units 11..20 dirty again */
  _keel_verify();
  _keel_pageheap_free(s);
  check_counters("before release");
  keel_purge();
  CHECK_MSG(resident_pages(c, KEEL_UNIT_SIZE) == -1 && errno == ENOMEM, "chunk %p still mapped",
            (void*)c);
  check_counters("chunk released");
  _keel_verify();
  _keel_options.thp = KEEL_THP_SYSTEM;
  _keel_options.huge_page_size = 0;
}

static void test_purge_bigger_than_chunk(void) {
  TEST_SECTION("ALWAYS, 512 MiB huge pages: nothing inside a chunk is purged");
  _keel_options.thp = KEEL_THP_ALWAYS;
  _keel_options.huge_page_size = (size_t)512 << 20;
  keel_slab_t* s = fresh_chunk_span();
  if (s == NULL) return;
  keel_chunk_t* c = keel_chunk_of(s);
  const size_t body = (KEEL_CHUNK_UNITS - 1) * KEEL_UNIT_SIZE;
  memset(unit_ptr(c, 1), 0x5a, body);
  shrink(s, 20);
  keel_purge();
  CHECK(resident_pages(unit_ptr(c, 1), body) == pages_in(body));
  CHECK(c->dirty_mask == ((~(uint64_t)0) << 21));
  check_counters("512 MiB: kept");
  _keel_pageheap_free(s);
  keel_purge();
  CHECK_MSG(resident_pages(c, KEEL_UNIT_SIZE) == -1 && errno == ENOMEM, "chunk %p still mapped",
            (void*)c);
  check_counters("512 MiB: chunk released");
  _keel_options.thp = KEEL_THP_SYSTEM;
  _keel_options.huge_page_size = 0;
}

/* ---- slab trimming ------------------------------------------------------------------- */
static void test_no_slab_trim(void) {
  TEST_SECTION("ALWAYS: the pages inside partly used slabs are not trimmed");
  _keel_options.huge_page_size = HP;
  enum { N = 64 };
  size_t size = 16 << 10;
  unsigned cls = keel_size_class(size);
  void* b[N];
  for (int i = 0; i < N; i++) {
    b[i] = malloc(size);
    memset(b[i], 1, size);
  }
  void* keep = b[0];
  keel_slab_t* s = keel_span_head(keel_chunk_of(keep), keel_unit_index(keep));
  char* base = (char*)keel_unit_addr(keel_chunk_of(keep), (unsigned)(s - keel_chunk_of(keep)->units));
  size_t bytes = (size_t)s->units << KEEL_UNIT_SHIFT;
  CHECK(s->state == KEEL_UNIT_SLAB && s->cls == cls);
  for (int i = 1; i < N; i++) free(b[i]);
  keel_thread_flush();
  _keel_central_purge_all(0); /* back to the slabs, nothing trimmed */
  CHECK(s->used >= 1 && s->used < _keel_classes[cls].count); /* partly used */
  long full = resident_pages(base, bytes);

  _keel_options.thp = KEEL_THP_ALWAYS;
  _keel_central_decay(0);
  CHECK_MSG(resident_pages(base, bytes) == full, "ALWAYS: %ld of %ld pages left",
            resident_pages(base, bytes), full);
  CHECK(s->needs_trim);

  _keel_options.thp = KEEL_THP_SYSTEM;
  _keel_central_decay(0);
  long left = resident_pages(base, bytes);
  CHECK_MSG(left < full, "SYSTEM: %ld of %ld pages left", left, full);
  CHECK(!s->needs_trim);
  free(keep);
  _keel_options.huge_page_size = 0;
}

/* ---- DENSE: huge pages by promotion ------------------------------------------------ */
static keel_thp_counts_t thp_counts(void) {
  keel_thp_counts_t t;
  _keel_thp_counts(&t);
  return t;
}

/* A fresh chunk whose units 1..63 are one span, written (resident), and promoted as far
 * as the kernel agrees; NULL (and a note) where it cannot collapse. */
static keel_slab_t* promoted_chunk_span(void) {
  keel_slab_t* s = fresh_chunk_span();
  if (s == NULL) return NULL;
  keel_chunk_t* c = keel_chunk_of(s);
  memset(unit_ptr(c, 1), 0x5a, (KEEL_CHUNK_UNITS - 1) * KEEL_UNIT_SIZE);
  CHECK(c->promoted_mask == 0); /* nothing at fault time */
  keel_thp_counts_t before = thp_counts();
  for (int i = 0; i < 4 && c->promoted_mask != ~(uint64_t)0; i++) { /* 4 a call */
    c->promote_ms = 0;
    _keel_pageheap_promote();
  }
  keel_thp_counts_t after = thp_counts();
  if (c->promoted_mask != ~(uint64_t)0) {
    printf("   (the kernel collapsed %ju, refused %ju: promotion checks skipped)\n",
           (uintmax_t)(after.collapses - before.collapses), (uintmax_t)(after.refused - before.refused));
    CHECK(after.refused > before.refused); /* refused, not overlooked */
    _keel_pageheap_free(s);
    return NULL;
  }
  CHECK(after.promoted - before.promoted >= 2 && after.collapses - before.collapses >= 2);
  CHECK_MSG(anon_huge_kb(c) >= 2 * (HP >> 10), "AnonHugePages %lu kB after collapsing",
            anon_huge_kb(c));
  check_counters("promoted");
  return s;
}

static void test_dense(void) {
  TEST_SECTION("DENSE: dense huge pages collapsed, kept whole while in use, given back");
  if (!kernel_has_thp || _keel_prim_thp_machine_mode() == 0 || _keel_prim_huge_page_size() != HP) {
    printf("   (no 2 MiB transparent huge pages here: skipped)\n");
    return;
  }
  _keel_options.thp = KEEL_THP_DENSE;
  _keel_options.huge_page_size = HP;
  const unsigned g = (unsigned)(HP / KEEL_UNIT_SIZE);
  keel_slab_t* s = promoted_chunk_span();
  if (s != NULL) {
    keel_chunk_t* c = keel_chunk_of(s);
    keel_thp_counts_t t0 = thp_counts();
    /* A few units free (less than a quarter of the huge page): it stays whole. */
    shrink(s, 60);
    keel_purge();
    CHECK_MSG(resident_pages(unit_ptr(c, g), HP) == pages_in(HP), "whole huge page: %ld pages",
              resident_pages(unit_ptr(c, g), HP));
    CHECK(c->promoted_mask == ~(uint64_t)0 && thp_counts().demoted == t0.demoted);
    check_counters("kept whole");
    /* A quarter or more free: back to base pages, and the free units are purged. */
    shrink(s, 40);
    keel_purge();
    CHECK(c->promoted_mask == (((uint64_t)1 << g) - 1) && thp_counts().demoted == t0.demoted + 1);
    CHECK_MSG(resident_pages(unit_ptr(c, 41), 23 * KEEL_UNIT_SIZE) == 0, "units 41..63: %ld pages",
              resident_pages(unit_ptr(c, 41), 23 * KEEL_UNIT_SIZE));
    CHECK(memcmp(unit_ptr(c, 33), unit_ptr(c, 1), 8 * KEEL_UNIT_SIZE) == 0); /* data kept */
    check_counters("demoted");
    _keel_verify();
    /* The chunk goes back once wholly free, promoted huge page and all. */
    _keel_pageheap_free(s);
    keel_purge();
    CHECK_MSG(resident_pages(c, KEEL_UNIT_SIZE) == -1 && errno == ENOMEM, "chunk %p still mapped",
              (void*)c);
    CHECK(thp_counts().promoted == t0.promoted - 2); /* one demoted, one with the chunk */
    check_counters("chunk released");
  }
  /* A promoted huge page freed all at once goes back whole. */
  s = promoted_chunk_span();
  if (s != NULL) {
    keel_chunk_t* c = keel_chunk_of(s);
    keel_thp_counts_t t0 = thp_counts();
    shrink(s, g - 1); /* units 32..63 free */
    keel_purge();
    CHECK_MSG(resident_pages(unit_ptr(c, g), HP) == 0, "freed huge page: %ld pages resident",
              resident_pages(unit_ptr(c, g), HP));
    keel_thp_counts_t t1 = thp_counts();
    CHECK(t1.released == t0.released + 1 && t1.demoted == t0.demoted && t1.promoted == t0.promoted - 1);
    CHECK(c->promoted_mask == (((uint64_t)1 << g) - 1));
    check_counters("released whole");
    _keel_pageheap_free(s);
    keel_purge();
    check_counters("second chunk released");
  }
  _keel_verify();
  _keel_options.thp = KEEL_THP_SYSTEM;
  _keel_options.huge_page_size = 0;
}

int main(int argc, char** argv) {
  (void)argc;
  const char* bg = getenv("KEEL_BACKGROUND_PURGE");
  if (bg == NULL || strcmp(bg, "0") != 0) { /* options are read at start-up: start again */
    setenv("KEEL_BACKGROUND_PURGE", "0", 1);
    execv("/proc/self/exe", argv);
    perror("execv");
    return 1;
  }
  _keel_init();
  _keel_options.purge_delay_ms = 1000000; /* nothing purges but keel_purge() */
  kernel_has_thp = access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) == 0;
  blocks_hold_huge_pages = _keel_prim_huge_page_size() <= HP;
  if (!kernel_has_thp) printf("   (no THP in this kernel: VmFlags checks skipped)\n");
  test_advice(KEEL_THP_SYSTEM, "");
  test_advice(KEEL_THP_ALWAYS, "hg");
  test_advice(KEEL_THP_NEVER, "nh");
  test_apply_all();
  test_purge_whole();
  test_purge_bigger_than_chunk();
  test_no_slab_trim();
  test_dense();
  _keel_verify();
  return test_finish();
}
