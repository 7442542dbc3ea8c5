/* size_class.c -- the size class table.
 * 16-byte steps up to 1 KiB (where most database objects live, and where glibc's
 * 16-byte granularity is the bar for memory use), then nine classes per doubling up
 * to 128 KiB: 2^b + 2^b/64, for the power of two plus a header that servers allocate
 * (a 1 KiB Redis value is a 1,030-byte string), and eight steps of 2^b/8. Each class
 * gets the smallest slab (1..16 units) that wastes little.
 * A small heap is served by a coarse subset of them (internal.h, "Coarse, then fine"). */
#include "core/internal.h"

keel_class_t _keel_classes[KEEL_NUM_CLASSES];
uint8_t _keel_class_serving[KEEL_NUM_CLASSES];
uint8_t _keel_class_group_pending[KEEL_NUM_CLASSES];
static uint8_t coarse_of[KEEL_NUM_CLASSES]; /* the class that serves each one while coarse */
static bool fine; /* the heap has reached KEEL_FINE_CLASSES */

static size_t class_size(unsigned cls) {
  if (cls <= 64) return (size_t)cls * 16;
  unsigned k = cls - 65, b = 10 + k / 9, idx = k % 9;
  if (idx == 0) return ((size_t)1 << b) + ((size_t)1 << (b - 6));
  return ((size_t)1 << b) + (size_t)idx * ((size_t)1 << (b - 3));
}

static size_t clamp(size_t v, size_t lo, size_t hi) { return v < lo ? lo : v > hi ? hi : v; }

void _keel_classes_init(void) {
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    keel_class_t* c = &_keel_classes[cls];
    size_t size = class_size(cls);
    size_t units = 1;
    /* Smallest slab with at least 8 blocks and at most 1/16 of it left over. */
    for (size_t u = 1; u <= 16; u *= 2) {
      size_t bytes = u * KEEL_UNIT_SIZE, count = bytes / size;
      units = u;
      if (count >= 8 && (bytes - count * size) * 16 <= bytes) break;
    }
    size_t count = units * KEEL_UNIT_SIZE / size;
    if (count > KEEL_SLAB_MAX_OBJECTS) count = KEEL_SLAB_MAX_OBJECTS;
    c->size = (uint32_t)size;
    c->units = (uint16_t)units;
    c->count = (uint32_t)count;
    /* Batches of about 8 KiB, bins of about 16 KiB: every class a thread uses can
     * hold that much in its cache, and a program or server with a hundred classes in
     * use keeps that much per class in each thread's bins and in the transfer cache.
     * bench/ (5 alternated runs each): going from 64 to 16 KiB batches cost no time
     * and cut peak RSS 10 % in geometric mean; from 16 to 8 KiB, 1 % more time and
     * 6 % less peak RSS (prodcons 8.2 -> 5.8 MiB, xthread 6.2 -> 5.5); 4 KiB cut
     * another 5 % but cost 2-3 % (larson 8 %). */
    c->batch = (uint16_t)clamp(((size_t)8 << 10) / size, 1, 32);
    if (c->batch > 1) c->batch &= (uint16_t)~1u; /* even: it splits into two half batches */
    c->bin_limit = (uint32_t)clamp(((size_t)16 << 10) / size, 2u * c->batch, 1024);
    /* Enough parked batches to absorb a burst, but about 16 KiB of blocks per class;
     * idle batches also decay back to their slabs (central.c). */
    c->transfer_max = (uint32_t)clamp(((size_t)16 << 10) / (c->batch * size), 1, KEEL_TRANSFER_SLOTS);
    /* Blocks above KEEL_CACHED_MAX are not cached at all (like jemalloc's tcache_max):
     * each is worth at least tens of KiB of touched memory, which in a cache stays
     * resident, while back in its slab its pages are purged once idle; and the central
     * list's lock costs little next to using that much memory. A PostgreSQL postmaster
     * held 290 KiB of such blocks in its cache (AllocSet blocks of freed memory
     * contexts), and every backend it forks inherits them. */
    if (size > KEEL_CACHED_MAX) c->bin_limit = c->transfer_max = 0;
    c->div_magic = (((uint64_t)1 << 40) + size - 1) / size;
  }
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
    _keel_class_serving[cls] = (uint8_t)(_keel_options.fine_classes == 0 ? cls : serving);
    if (serving != cls && _keel_options.fine_classes != 0) _keel_class_group_pending[serving] = 1;
  }
  fine = _keel_options.fine_classes == 0;
  /* Central list slots: the coarse classes first, the others after them (internal.h,
   * _keel_central_slots). Slot 0 stays class 0's, which has none. */
  unsigned slot = 1;
  for (int coarse = 1; coarse >= 0; coarse--)
    for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++)
      if ((coarse_of[cls] == cls) == (coarse == 1)) _keel_central_slot[cls] = (uint8_t)slot++;
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

/* The classes that coarse class c served now serve themselves; false if they did already
 * or if the group is not big enough yet. */
static bool switch_group(unsigned c) {
  if (!group_big(c)) return false;
  if (!__atomic_exchange_n(&_keel_class_group_pending[c], 0, __ATOMIC_RELAXED)) return false;
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++)
    if (coarse_of[cls] == c) __atomic_store_n(&_keel_class_serving[cls], (uint8_t)cls, __ATOMIC_RELAXED);
  return true;
}

bool _keel_classes_are_fine(void) { return __atomic_load_n(&fine, __ATOMIC_RELAXED); }

/* Called after a new slab, with no lock held: the switch takes the thread registry's.
 * Groups whose coarse class has no free block switch now; the others once their
 * coarse class runs out (_keel_classes_coarse_exhausted), so that the free blocks the
 * coarse phase left are used before the finer classes start slabs of their own. (All
 * at once, blocks freed after the switch left holes in the coarse slabs that only
 * requests of the coarse class's own size filled.) */
void _keel_classes_slabs_grew(uint64_t slab_bytes) {
  if (__atomic_load_n(&fine, __ATOMIC_RELAXED) || slab_bytes < _keel_options.fine_classes) return;
  if (__atomic_exchange_n(&fine, true, __ATOMIC_RELAXED)) return;
  bool any = false;
  for (unsigned c = 1; c < KEEL_NUM_CLASSES; c++)
    if (__atomic_load_n(&_keel_class_group_pending[c], __ATOMIC_RELAXED) && !_keel_central_has_free(c))
      any |= switch_group(c);
  if (any) _keel_tcache_classes_changed();
}

void _keel_classes_coarse_exhausted(unsigned c) {
  if (__atomic_load_n(&fine, __ATOMIC_RELAXED) && switch_group(c)) _keel_tcache_classes_changed();
}
