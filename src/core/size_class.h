/* size_class.h -- the size classes (size_class.c): the table, the coarse-to-fine switch,
 * and a request's class. */
#ifndef KEEL_SIZE_CLASS_H
#define KEEL_SIZE_CLASS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "core/geometry.h"

/* ---- size classes (size_class.c) ------------------------------------------------------ */
typedef struct keel_class_s {
  uint32_t size;       /* block size in bytes */
  uint32_t count;      /* blocks per slab */
  uint16_t units;      /* slab length in units */
  uint16_t batch;      /* blocks moved between a thread cache and the central list at once */
  uint32_t bin_limit;  /* most blocks one thread cache bin may hold */
  uint32_t transfer_max; /* most full batches the central transfer cache keeps */
  uint64_t div_magic;  /* (offset * div_magic) >> 40 == offset / size for slab offsets */
} keel_class_t;

extern const keel_class_t _keel_classes[KEEL_NUM_CLASSES] KEEL_INTERNAL;
void _keel_classes_init(void) KEEL_INTERNAL;

/* Coarse, then fine. A small heap pays for every class it uses (a partly used page of
 * slab, a thread cache bin, a transfer cache), a big heap for the slack inside blocks.
 * So requests are first served by the coarse classes - 16-byte steps up to 128 bytes,
 * then four per doubling - and once Keel's slabs span KEEL_FINE_CLASSES bytes by all
 * the classes (16-byte steps to 1 KiB, nine per doubling above), for good: each coarse
 * class's group switches once that class spans KEEL_FINE_GROUP_SLABS slabs. The fine
 * class of a request is computed; _keel_class_serving maps it to the class that serves
 * it (itself once fine). Blocks keep their class for life, so the switch needs no
 * synchronisation: a thread that reads an old entry gets a block of a coarse class,
 * which is as valid as ever. _keel_class_of_size repeats the entries up to
 * KEEL_SMALL_MAX per request size, for malloc's fast path (one indexed load). */
extern uint8_t _keel_class_serving[KEEL_NUM_CLASSES] KEEL_INTERNAL;
/* The class serving a request of n bytes, 0 <= n <= KEEL_SMALL_MAX (0: class 0, whose bin
 * is always empty). Indexed by the size itself, so malloc's fast path needs no arithmetic
 * before the load; on cache lines of its own, as every malloc reads it. */
typedef struct {
  _Alignas(64) uint8_t cls[(KEEL_SMALL_MAX + 1 + 63) / 64 * 64];
} keel_size_table_t;
extern keel_size_table_t _keel_class_of_size KEEL_INTERNAL;
/* A coarse class's group switches to its fine classes only once the coarse class spans
 * this many slabs (size_class.c, group_big). */
#define KEEL_FINE_GROUP_SLABS 16
/* 1 for a coarse class that still serves finer classes (size_class.c). */
extern uint8_t _keel_class_group_pending[KEEL_NUM_CLASSES] KEEL_INTERNAL;
/* Keel's slabs now span slab_bytes: switch to the fine classes if that is enough. */
void _keel_classes_slabs_grew(uint64_t slab_bytes) KEEL_INTERNAL KEEL_NOINLINE;
/* Coarse class c has no partly used slab left (exhausted), or it took a new slab: the
 * classes it served switch if due (size_class.c). */
void _keel_classes_coarse_used(unsigned c, bool exhausted) KEEL_INTERNAL KEEL_NOINLINE;
/* The heap has reached KEEL_FINE_CLASSES (some groups may still wait for their coarse
 * class to run out). */
bool _keel_classes_are_fine(void) KEEL_INTERNAL;

/* The fine class of a request of n bytes, 1 <= n <= KEEL_CLASS_MAX. */
static inline unsigned keel_fine_class(size_t n) {
  if (n <= KEEL_SMALL_MAX) return (unsigned)((n - 1) >> 4) + 1; /* 16-byte steps */
  /* Above 1 KiB, nine classes per doubling 2^b: 2^b + 2^b/64 for a power of two plus a
   * header (a 1 KiB Redis value is 1,030 bytes), then eight steps of 2^b/8, so at most
   * 12.5 % of a block is slack. */
  unsigned b = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1)); /* 2^b < n <= 2^(b+1) */
  size_t over = n - 1 - ((size_t)1 << b);
  unsigned first = 65u + (b - 10u) * 9u;
  return over < ((size_t)1 << (b - 6)) ? first : first + 1u + (unsigned)(over >> (b - 3));
}

/* The class that serves a request of n bytes now, 1 <= n <= KEEL_CLASS_MAX. */
static inline unsigned keel_size_class(size_t n) {
  return __atomic_load_n(&_keel_class_serving[keel_fine_class(n)], __ATOMIC_RELAXED);
}

#endif /* KEEL_SIZE_CLASS_H */
