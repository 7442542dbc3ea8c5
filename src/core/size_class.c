/* size_class.c -- the size class table.
 * 16-byte steps up to 1 KiB (where most database objects live, and where glibc's
 * 16-byte granularity is the bar for memory use), then nine classes per doubling up
 * to 128 KiB: 2^b + 2^b/64, for the power of two plus a header that servers allocate
 * (a 1 KiB Redis value is a 1,030-byte string), and eight steps of 2^b/8. Each class
 * gets the smallest slab (1..16 units) that wastes little.
 * A small heap is served by a coarse subset of them (size_class.h, "Coarse, then fine"). */
#include "core/internal.h"

uint8_t _keel_class_serving[KEEL_NUM_CLASSES];
keel_size_table_t _keel_class_of_size;
uint8_t _keel_class_group_pending[KEEL_NUM_CLASSES];
static uint8_t coarse_of[KEEL_NUM_CLASSES]; /* the class that serves each one while coarse */
static bool fine; /* the heap has reached KEEL_FINE_CLASSES */

/* Fine class cls is now served by class serving: both tables say so. */
static void set_serving(unsigned cls, unsigned serving) {
  __atomic_store_n(&_keel_class_serving[cls], (uint8_t)serving, __ATOMIC_RELAXED);
  if (cls > KEEL_SMALL_MAX / 16) return;
  for (size_t n = (cls - 1) * 16 + 1; n <= cls * 16; n++)
    __atomic_store_n(&_keel_class_of_size.cls[n], (uint8_t)serving, __ATOMIC_RELAXED);
}

/* The table is a constant, computed by the compiler: read-only data is file pages shared
 * by every process, where a table filled in at start-up was 4 KiB of RssAnon in each
 * (and in each child of a forking server). tests/unit checks it against the rules,
 * computed at run time. The rules, per class c:
 *   size     16-byte steps up to 1 KiB; above, for b = 10 + (c - 65) / 9 and i = (c - 65)
 *            mod 9: 2^b + 2^b/64 for i = 0, else 2^b + i * 2^b/8;
 *   units    the smallest slab (1, 2, 4, 8 or 16 units) with at least 8 blocks and at most
 *            1/16 of it left over, else 16;
 *   count    blocks in the slab, at most KEEL_SLAB_MAX_OBJECTS;
 *   batch    about 8 KiB of blocks (1-32), even when above 1: it splits into two halves;
 *   bin_limit, transfer_max  about 16 KiB of blocks in a bin (at least two batches and
 *            BIN_MIN blocks) and in the transfer cache (1-8 batches); none above
 *            KEEL_CACHED_MAX;
 *   div_magic  (offset * div_magic) >> 40 == offset / size for every slab offset.
 * Batches of about 8 KiB, bins of about 16 KiB: every class a thread uses can hold that
 * much in its cache, and a program or server with a hundred classes in use keeps that
 * much per class in each thread's bins and in the transfer cache: smaller batches cut peak
 * RSS until 8 KiB, below which they cost time (docs/experiments.md).
 * Blocks above KEEL_CACHED_MAX are not cached at all (like jemalloc's tcache_max): each
 * is worth at least tens of KiB of touched memory, which in a cache stays resident, while
 * back in its slab its pages are purged once idle; and the central list's lock costs
 * little next to using that much memory. A PostgreSQL postmaster held 290 KiB of such
 * blocks in its cache (AllocSet blocks of freed memory contexts), and every backend it
 * forks inherits them. */
#define CK(c) ((c) <= 64 ? 0u : (unsigned)(c) - 65u)
#define CB(c) (10u + CK(c) / 9u)
#define CI(c) (CK(c) % 9u)
#define C_SIZE(c) ((c) <= 64 ? (unsigned)(c) * 16u                                   \
                   : CI(c) == 0 ? (1u << CB(c)) + (1u << (CB(c) - 6u))               \
                                : (1u << CB(c)) + CI(c) * (1u << (CB(c) - 3u)))
#define C_FITS(sz, u) ((u) * 65536u / (sz) >= 8u && ((u) * 65536u % (sz)) * 16u <= (u) * 65536u)
#define C_UNITS(sz) (C_FITS(sz, 1u) ? 1u : C_FITS(sz, 2u) ? 2u : C_FITS(sz, 4u) ? 4u : C_FITS(sz, 8u) ? 8u : 16u)
#define C_MIN(a, b) ((a) < (b) ? (a) : (b))
#define C_CLAMP(v, lo, hi) ((v) < (lo) ? (lo) : (v) > (hi) ? (hi) : (v))
#define C_BATCH0(sz) C_CLAMP(8192u / (sz), 1u, KEEL_BATCH_MAX)
#define C_BATCH(sz) (C_BATCH0(sz) > 1u ? C_BATCH0(sz) & ~1u : 1u)
#define C_CACHED(sz) ((sz) <= KEEL_CACHED_MAX)
/* Above 4 KiB a bin would hold two blocks: a thread that works with three or four
 * buffers of one class at once (a server's per-request buffers) missed at every round. */
#define BIN_MIN 4u
#define C_BIN_FLOOR(sz) (2u * C_BATCH(sz) > BIN_MIN ? 2u * C_BATCH(sz) : BIN_MIN)
#define C_BIN_LIMIT(sz) (C_CACHED(sz) ? C_CLAMP(16384u / (sz), C_BIN_FLOOR(sz), 1024u) : 0u)
#define C_TRANSFER(sz) \
  (C_CACHED(sz) ? C_CLAMP(16384u / (C_BATCH(sz) * (sz)), 1u, (unsigned)KEEL_TRANSFER_SLOTS) : 0u)
#define C_ENTRY(sz)                                                                          \
  {(sz), C_MIN(C_UNITS(sz) * 65536u / (sz), (unsigned)KEEL_SLAB_MAX_OBJECTS), C_UNITS(sz),   \
   C_BATCH(sz), C_BIN_LIMIT(sz), C_TRANSFER(sz), ((1ull << 40) + (sz) - 1u) / (sz)}
#define C1(c) C_ENTRY(C_SIZE(c))
#define C4(c) C1(c), C1((c) + 1), C1((c) + 2), C1((c) + 3)
#define C16(c) C4(c), C4((c) + 4), C4((c) + 8), C4((c) + 12)
const keel_class_t _keel_classes[KEEL_NUM_CLASSES] = {
    {0, 0, 0, 0, 0, 0, 0}, C1(1),   C1(2),   C1(3),   C4(4),   C4(8),   C4(12), C16(16),
    C16(32),               C16(48), C16(64), C16(80), C16(96), C16(112)};
_Static_assert(KEEL_UNIT_SIZE == 65536u, "the table's slabs are in 64 KiB units");

void _keel_classes_init(void) {
  uint64_t fine_at = keel_opt(fine_classes);
  /* Coarse classes: up to 128 bytes every class, above that the four per doubling
   * (sizes a multiple of a quarter of their power of two: 160, 192, 224, 256, 320, ...).
   * Each fine class is served by the smallest coarse class at least as big. */
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    unsigned serving = cls;
    for (;; serving++) {
      size_t size = _keel_classes[serving].size;
      unsigned log = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
      if (size <= 128 || size % ((size_t)1 << (log - 2)) == 0) break;
    }
    coarse_of[cls] = (uint8_t)serving;
    set_serving(cls, fine_at == 0 ? cls : serving);
    if (serving != cls && fine_at != 0) _keel_class_group_pending[serving] = 1;
  }
  fine = fine_at == 0;
}

/* Whether coarse class c's group has grown enough to be worth its finer classes. Each
 * class in use costs a partly used slab (a page or more of free blocks, a bin, transfer
 * batches); what finer classes save is slack, at most 1/8 of the group's bytes. A group
 * spanning a slab or two therefore holds less as it is: split, its 1-16 KiB blocks took
 * a 64-256 KiB slab per fine class for a few blocks each (prodcons, one core: 8.1 MiB
 * against glibc's 4.5). So a group switches only once its coarse class spans
 * KEEL_FINE_GROUP_SLABS slabs, however big the heap. */
static bool group_big(unsigned c) {
  return __atomic_load_n(&keel_central_of(c)->slabs, __ATOMIC_RELAXED) >= KEEL_FINE_GROUP_SLABS;
}

/* The classes that coarse class c served now serve themselves, unless they did already
 * or the group is not big enough yet. */
static void switch_group(unsigned c) {
  if (!group_big(c) || !__atomic_exchange_n(&_keel_class_group_pending[c], 0, __ATOMIC_RELAXED)) return;
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++)
    if (coarse_of[cls] == c) set_serving(cls, cls);
}

bool _keel_classes_are_fine(void) { return __atomic_load_n(&fine, __ATOMIC_RELAXED); }

/* Called after a new slab, with no lock held.
 * Groups whose coarse class has no free block switch now; the others once their
 * coarse class runs out or keeps growing (_keel_classes_coarse_used), so that the free
 * blocks the coarse phase left are used before the finer classes start slabs of their
 * own. (All at once, blocks freed after the switch left holes in the coarse slabs
 * that only requests of the coarse class's own size filled.) */
void _keel_classes_slabs_grew(uint64_t slab_bytes) {
  if (__atomic_load_n(&fine, __ATOMIC_RELAXED) || slab_bytes < keel_opt(fine_classes)) return;
  if (__atomic_exchange_n(&fine, true, __ATOMIC_RELAXED)) return;
  for (unsigned c = 1; c < KEEL_NUM_CLASSES; c++)
    if (__atomic_load_n(&_keel_class_group_pending[c], __ATOMIC_RELAXED) && !_keel_central_has_free(c))
      switch_group(c);
}

/* Exhausted: a take emptied the coarse class's last partly used slab. That alone missed
 * a class that keeps growing: a take that runs past a slab's end goes straight on into
 * a new one, and a class whose blocks cycle through the transfer cache seldom ends a take
 * exactly there (Redis filled with 1 KiB values kept 1,030-byte strings in the 1,280-byte
 * class). So a group also switches once its coarse class has taken GROWN_SLABS new slabs
 * since the heap became big: growing, not living off the free blocks of its coarse phase
 * (switching sooner stranded those in programs whose working set of a class swings). */
#define GROWN_SLABS (2u * KEEL_FINE_GROUP_SLABS)
static uint8_t grown_while_fine[KEEL_NUM_CLASSES];
_Static_assert(GROWN_SLABS <= 255, "counted in a byte");
void _keel_classes_coarse_used(unsigned c, bool exhausted) {
  if (!__atomic_load_n(&fine, __ATOMIC_RELAXED)) return;
  if (!exhausted) {
    unsigned n = __atomic_load_n(&grown_while_fine[c], __ATOMIC_RELAXED) + 1u;
    if (n <= GROWN_SLABS) __atomic_store_n(&grown_while_fine[c], (uint8_t)n, __ATOMIC_RELAXED);
    if (n < GROWN_SLABS) return;
  }
  switch_group(c);
}
