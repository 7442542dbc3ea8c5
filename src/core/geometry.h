/* geometry.h -- units, chunks and the size limits; the page map's tags. */
#ifndef KEEL_GEOMETRY_H
#define KEEL_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>

/* ---- geometry ------------------------------------------------------------------------
 * The unit is fixed at 64 KiB whatever the OS page size (4, 16 or 64 KiB): it is the
 * largest page size Linux uses, so a unit can always be purged on its own, and nothing
 * in Keel is sized by the huge page size. */
#define KEEL_UNIT_SHIFT 16
#define KEEL_UNIT_SIZE ((size_t)1 << KEEL_UNIT_SHIFT)
#define KEEL_CHUNK_SHIFT 22
#define KEEL_CHUNK_SIZE ((size_t)1 << KEEL_CHUNK_SHIFT)
#define KEEL_CHUNK_UNITS (KEEL_CHUNK_SIZE / KEEL_UNIT_SIZE) /* 64 */
#define KEEL_CHUNK_MASK (KEEL_CHUNK_SIZE - 1)

#define KEEL_SMALL_MAX 1024              /* sizes served by the table-free fast path */
#define KEEL_CLASS_MAX ((size_t)128 << 10) /* largest size class */
#define KEEL_CACHED_MAX ((size_t)32 << 10) /* larger classes skip the caches (size_class.c) */
#define KEEL_NUM_CLASSES 128              /* classes 1..127 (a page-map byte below 0x80); 0: none */
#define KEEL_LARGE_MAX ((size_t)1 << 20)  /* larger blocks get their own mapping */
#define KEEL_SLAB_MAX_OBJECTS 4096        /* 64 KiB of 16-byte blocks */
#define KEEL_BATCH_MAX 32u                /* blocks moved between the tiers at once */
#define KEEL_MAX_ALLOC ((size_t)PTRDIFF_MAX - (64u << 20)) /* larger requests: ENOMEM */

/* Page map tags (values above the size classes). A byte >= 0x80 reads as negative as
 * int8_t, which is how the free fast path sends every non-class unit to the slow path. */
#define KEEL_KIND_NONE 0x00       /* not Keel's, or inside a block: never a valid pointer */
#define KEEL_KIND_LARGE 0x80      /* first unit of a live large block */
#define KEEL_KIND_HUGE 0x81       /* first unit of a live huge block */
#define KEEL_KIND_FREED 0x82      /* first unit of a large/huge block that was freed */
#define KEEL_KIND_SAMPLED 0x83    /* a unit of a slab holding heap-profile samples only: their
                                     frees leave the fast path so the profiler can forget the
                                     sample; the class is the slab's (keel_sampled_class) */
#define KEEL_KIND_GUARD 0x84      /* checked mode: first unit of a guarded block's guard
                                     pages, live or in the quarantine (checked.c) */
#define KEEL_KIND_CARVED 0x85     /* a unit of a slab some of whose free blocks were carved
                                     into blocks of a smaller class (borrow.c) */
_Static_assert(KEEL_NUM_CLASSES <= 0x80, "a class is a positive int8_t in the page map");

#endif /* KEEL_GEOMETRY_H */
