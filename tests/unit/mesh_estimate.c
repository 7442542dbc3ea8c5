/* mesh_estimate.c -- keel_mesh_estimate() on heaps whose answer is known exactly.
 *
 * Slabs are filled with blocks of one size, then all but one block per OS page is
 * freed. Which block survives (its "slot" on the page) depends on the slab, so the
 * used masks of page j are single bits whose overlaps we choose:
 *   - 1024 B: two slots, alternating between slabs. Pages pair exactly: with two kinds
 *     of page the matcher can only leave pages of one kind unpaired, min(#A, #B) pairs,
 *     and a pair made at the first page goes on along the slab (one run per slab).
 *     Groups cannot grow past two (no third disjoint slot is used).
 *   - 512 B: four slots. Randomized first fit builds exactly max(#kind) groups, each
 *     page joining the first open group lacking its slot: group_saved is known; pairs
 *     at least (pages - largest kind) / 2 and at most pages / 2.
 *   - 2048 B: every block freed except block 0 of each slab: every other page is free,
 *     page 0 is a candidate that overlaps every other page 0.
 * Runs with the background purger off, so nothing moves blocks between the caches and
 * the slabs but the test. */
#include <pthread.h>

#include "test.h"

enum { MAX_BLOCKS = 8192 };

static int cmp_uptr(const void* a, const void* b) {
  uintptr_t x = *(const uintptr_t*)a, y = *(const uintptr_t*)b;
  return x < y ? -1 : x > y;
}

static size_t page_size;

typedef struct layout_s {
  uintptr_t bases[MAX_BLOCKS];
  size_t nslabs;
} layout_t;

/* Slab ordinal of p: the slabs of these classes are one 64 KiB unit, unit-aligned. */
static size_t slab_ordinal(const layout_t* l, void* p) {
  uintptr_t base = (uintptr_t)p & ~(uintptr_t)0xFFFF;
  const uintptr_t* hit = bsearch(&base, l->bases, l->nslabs, sizeof base, cmp_uptr);
  return (size_t)(hit - l->bases);
}

/* Allocates n blocks of `size`, records their slabs; returns the blocks. */
static void** fill(size_t size, size_t n, layout_t* l) {
  void** blocks = calloc(n, sizeof *blocks);
  uintptr_t* all = calloc(n, sizeof *all);
  for (size_t i = 0; i < n; i++) {
    blocks[i] = malloc(size);
    all[i] = (uintptr_t)blocks[i] & ~(uintptr_t)0xFFFF;
  }
  qsort(all, n, sizeof *all, cmp_uptr);
  l->nslabs = 0;
  for (size_t i = 0; i < n; i++)
    if (l->nslabs == 0 || l->bases[l->nslabs - 1] != all[i]) l->bases[l->nslabs++] = all[i];
  free(all);
  return blocks;
}

static const keel_mesh_estimate_t* row_for(const keel_mesh_estimate_t* rows, size_t n, uint64_t size) {
  for (size_t i = 0; i < n; i++)
    if (rows[i].block_size == size) return &rows[i];
  return NULL;
}

/* Keeps, on every page of every slab, the block in slot slot_of(slab ordinal). */
static void keep_one_per_page(void** blocks, size_t n, size_t size, const layout_t* l, unsigned kinds,
                              size_t kind_count[4]) {
  size_t per_page = page_size / size;
  for (unsigned k = 0; k < 4; k++) kind_count[k] = 0;
  for (size_t s = 0; s < l->nslabs; s++) kind_count[s % kinds]++;
  for (size_t i = 0; i < n; i++) {
    size_t ord = slab_ordinal(l, blocks[i]);
    size_t index = ((uintptr_t)blocks[i] & 0xFFFF) / size;
    if (index % per_page != ord % kinds) {
      free(blocks[i]);
      blocks[i] = NULL;
    }
  }
}

static void free_all(void** blocks, size_t n) {
  for (size_t i = 0; i < n; i++) free(blocks[i]);
  free(blocks);
}

int main(void) {
  page_size = (size_t)sysconf(_SC_PAGESIZE);
  keel_mesh_estimate_t rows[128];
  if (page_size > 16384) {
    TEST_SECTION("64 KiB pages: meshing refused, no estimate");
    CHECK(keel_mesh_estimate(rows, 128) == 0);
    return test_finish();
  }
  size_t pages_per_slab = 65536 / page_size;
  static layout_t l1024, l512, l2048;

  TEST_SECTION("1024 B, two slots: exact pairs");
  void** b1024 = fill(1024, 64 * 64, &l1024);
  size_t k1024[4];
  keep_one_per_page(b1024, 64 * 64, 1024, &l1024, 2, k1024);

  TEST_SECTION("512 B, four slots: exact groups");
  void** b512 = fill(512, 32 * 128, &l512);
  size_t k512[4];
  keep_one_per_page(b512, 32 * 128, 512, &l512, 4, k512);

  TEST_SECTION("2048 B: one block per slab");
  void** b2048 = fill(2048, 8 * 32, &l2048);
  for (size_t i = 0; i < 8 * 32; i++)
    if (((uintptr_t)b2048[i] & 0xFFFF) != 0) {
      free(b2048[i]);
      b2048[i] = NULL;
    }

  keel_purge(); /* this thread's cache and the transfer caches go back to the slabs */
  size_t n = keel_mesh_estimate(rows, 128);
  CHECK(n >= 3);
  for (size_t i = 1; i < n; i++) CHECK(rows[i].block_size > rows[i - 1].block_size);
  for (size_t i = 0; i < n; i++) {
    CHECK(rows[i].block_size <= 2048);
    CHECK(rows[i].free_pages + rows[i].candidates <= rows[i].pages);
    CHECK(rows[i].pair_saved * 2 <= rows[i].candidates && rows[i].pair_views == 2 * rows[i].pair_saved);
    CHECK(rows[i].group_saved >= rows[i].pair_saved && rows[i].group_views <= rows[i].candidates);
    CHECK(rows[i].pair_runs <= rows[i].pair_views);
  }

  const keel_mesh_estimate_t* r = row_for(rows, n, 1024);
  CHECK(r != NULL);
  if (r) {
    size_t pairs = k1024[0] < k1024[1] ? k1024[0] : k1024[1];
    CHECK_MSG(r->pages == l1024.nslabs * pages_per_slab, "pages %" PRIu64, r->pages);
    CHECK(r->free_pages == 0);
    CHECK(r->candidates == l1024.nslabs * pages_per_slab);
    CHECK_MSG(r->pair_saved == pairs * pages_per_slab, "pair_saved %" PRIu64 " want %zu", r->pair_saved,
              pairs * pages_per_slab);
    CHECK(r->group_saved == r->pair_saved);
    /* Every page index pairs the same two kinds, so each pair made at the first index
     * is kept all along the slab: one run per slab of a pair. */
    CHECK_MSG(r->pair_runs == 2 * pairs, "pair_runs %" PRIu64 " want %zu", r->pair_runs, 2 * pairs);
  }
  r = row_for(rows, n, 512);
  CHECK(r != NULL);
  if (r) {
    size_t most = 0;
    for (int k = 0; k < 4; k++) most = k512[k] > most ? k512[k] : most;
    size_t pages = l512.nslabs * pages_per_slab;
    CHECK(r->candidates == pages && r->free_pages == 0);
    CHECK_MSG(r->group_saved == (l512.nslabs - most) * pages_per_slab, "group_saved %" PRIu64, r->group_saved);
    CHECK(r->pair_saved * 2 <= pages && r->pair_saved * 2 >= (l512.nslabs - most) * pages_per_slab);
  }
  r = row_for(rows, n, 2048);
  CHECK(r != NULL);
  if (r) {
    CHECK(r->pages == l2048.nslabs * pages_per_slab);
    /* Page 0 holds blocks 0 and 1 (block 0 in use) on 4 KiB pages; larger pages hold
     * more, and block 0 is in the first page whatever its size. */
    CHECK(r->free_pages == l2048.nslabs * (pages_per_slab - 1));
    CHECK(r->candidates == l2048.nslabs && r->pair_saved == 0 && r->group_saved == 0);
  }

  free_all(b1024, 64 * 64);
  free_all(b512, 32 * 128);
  free_all(b2048, 8 * 32);
  keel_purge();
  n = keel_mesh_estimate(rows, 128);
  r = row_for(rows, n, 1024);
  CHECK(r == NULL || r->candidates == 0); /* the slabs went back (one may stay, empty) */
  return test_finish();
}
