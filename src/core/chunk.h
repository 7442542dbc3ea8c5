/* chunk.h -- chunks, slabs and spans: a chunk's header, a unit's descriptor, a slab's
 * free bitmap and the inlines that find them from an address. */
#ifndef KEEL_CHUNK_H
#define KEEL_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/geometry.h"
#include "core/size_class.h"

/* ---- chunks, slabs and spans (pageheap.c, central.c) ---------------------------------- */
enum { KEEL_UNIT_FREE = 0, KEEL_UNIT_SLAB = 1, KEEL_UNIT_LARGE = 2 };

/* Describes one unit of a chunk. For a span (slab or large block) the head unit's entry
 * describes the whole span; the others only point back to the head. */
typedef struct keel_slab_s {
  struct keel_slab_s* next; /* central partial list of the class */
  struct keel_slab_s* prev;
  uint8_t state;     /* KEEL_UNIT_* */
  uint8_t cls;       /* size class of a slab */
  uint8_t head;      /* unit index of the span's head */
  uint8_t units;     /* span length (head only) */
  uint8_t in_partial;
  uint8_t sampled;   /* slab: holds heap-profile samples only */
  uint8_t needs_trim; /* slab: blocks came back since its free pages were last purged */
  uint8_t meshed;    /* slab: some of its pages may be mesh views (mesh.c) */
  uint16_t used;     /* slab: blocks out of the slab (live, in a cache, or carved) */
  uint16_t carved;   /* slab: its blocks carved into smaller classes' (borrow.c) */
  uint16_t scan;     /* slab: first bitmap word that may have a free bit */
  uint8_t ready;     /* slab: bitmap words written so far (at most 63); the rest are wholly free */
  uint8_t home;      /* slab: the transfer line whose partial list holds it (central.c) */
  uint32_t put_tick; /* slab: purger tick when a block last came back */
  union {
    uint32_t busy_trim_tick; /* slab: first tick it may be trimmed while blocks come back */
    uint32_t free_trim_ms;   /* slab of big blocks (trimmed every tick): when a free last
                              * trimmed it (ms clock, low bits) */
  };
  union {
    uint64_t size;   /* large: usable size; free head: ms timestamp when freed */
    uint64_t row;    /* slab: 1 + its row of the chunk's free_rest, 0 while it has none */
  };
} keel_slab_t;

#define KEEL_ROW_WORDS 32   /* bitmap words in a row of a chunk's free_rest */
#define KEEL_CHUNK_ROWS 128 /* 64 aligned pairs, one per slab at most */
#define KEEL_CHUNK_MAGIC 0x4b45454c43484e4bull /* "KEELCHNK" */

typedef struct keel_chunk_s {
  uint64_t magic;
  struct keel_chunk_s* next; /* page heap list of chunks with the same longest free run */
  struct keel_chunk_s* prev;
  uint64_t free_mask;  /* bit u: unit u is free */
  uint64_t dirty_mask; /* bit u: free unit u may still hold committed pages */
  uint32_t run;        /* longest run of free units (the list it is on) */
  uint32_t holder;     /* 1 + the line whose slabs it holds (KEEL_OWN_LINES), else 0 */
  uint64_t promoted_mask; /* units in huge pages Keel collapsed (KEEL_THP=dense): freed
                           * only whole, never trimmed or meshed */
  uint64_t promote_ms;    /* when the purger last looked for huge pages to collapse */
  uint64_t rows_used[2];  /* bit r of word r/64: row r of free_rest is a slab's (atomic) */
  keel_slab_t units[KEEL_CHUNK_UNITS];
  /* Each slab's bitmap (bit set = block free in the slab): the first word of every
   * unit's slab together in one row (free_first, by unit), the other words in rows of
   * free_rest that the slab takes when it first writes a word after its first (a take
   * past its 64th block, or a carve, whose bitmap follows the free one) - the lowest
   * rows free, one of 32 words or, for the one class that needs up to 63 (16-byte
   * blocks), an aligned pair - and gives back when it is full (its words are all zero
   * then) or released; a full slab takes them again, zeroed, with its first free. A slab
   * of blocks of 1 KiB and up has one word, so a heap of them touches one page of
   * bitmaps per chunk (Redis holding 1 KiB values), and only the slabs being filled hold
   * rows. With a bitmap in each unit's descriptor, a full chunk kept 36 KiB resident
   * whatever its slabs held; with 63-word rows by unit, a few small-block slabs of a
   * PostgreSQL backend wrote five pages of its header where two hold them, and a chunk
   * full of 32-byte slabs (Redis holding 3-byte values) all eight pages of rows. 64
   * pairs: a chunk's 63 slabs always find theirs. Unit 0 holds this header, never a
   * slab. */
  uint64_t free_first[KEEL_CHUNK_UNITS];
  uint64_t free_rest[KEEL_CHUNK_ROWS * KEEL_ROW_WORDS]; /* row r: words r*32 .. r*32+31 */
} keel_chunk_t;

_Static_assert(sizeof(keel_chunk_t) <= KEEL_UNIT_SIZE, "chunk header must fit in unit 0");

static inline keel_chunk_t* keel_chunk_of(const void* p) {
  return (keel_chunk_t*)((uintptr_t)p & ~(uintptr_t)KEEL_CHUNK_MASK);
}
static inline unsigned keel_unit_index(const void* p) {
  return (unsigned)(((uintptr_t)p >> KEEL_UNIT_SHIFT) & (KEEL_CHUNK_UNITS - 1));
}
static inline void* keel_unit_addr(keel_chunk_t* c, unsigned unit) {
  return (char*)c + ((size_t)unit << KEEL_UNIT_SHIFT);
}
static inline keel_slab_t* keel_span_head(keel_chunk_t* c, unsigned unit) {
  return &c->units[c->units[unit].head];
}
/* The head of the span that p lies in. */
static inline keel_slab_t* keel_span_of(const void* p) { return keel_span_head(keel_chunk_of(p), keel_unit_index(p)); }
/* Word w of the free bitmap of slab s (kept by its head unit); a word after the first
 * only once the slab has its rows (central.c, slab_rows_take). */
#define KEEL_SLAB_BITS(s, w)                                              \
  (*((w) == 0 ? &keel_chunk_of(s)->free_first[(s) - keel_chunk_of(s)->units] \
              : &keel_chunk_of(s)->free_rest[((s)->row - 1) * KEEL_ROW_WORDS + (w) - 1]))
/* Words of the free bitmap of a slab of class k. */
static inline unsigned keel_class_words(const keel_class_t* k) { return (k->count + 63) / 64; }
/* Whether holes may be carved out of a slab of class k (borrow.c, "carving"): its
 * blocks hold a row of at least four of the smallest blocks behind the hole's header,
 * and its rows have room after its free bitmap for the bitmap of its holes. */
#define KEEL_CARVE_LENDER_MIN 96 /* 32-byte header + 4 x 16 bytes */
static inline bool keel_class_can_carve_from(const keel_class_t* k) {
  return k->size >= KEEL_CARVE_LENDER_MIN && 2 * keel_class_words(k) <= KEEL_SLAB_MAX_OBJECTS / 64;
}
/* Rows of free_rest (1 or 2) a slab of class k takes: its words after the first, and the
 * carved-hole bitmap's if it may have one. */
static inline unsigned keel_class_rows(const keel_class_t* k) {
  unsigned rest = (keel_class_can_carve_from(k) ? 2 * keel_class_words(k) : keel_class_words(k)) - 1;
  return rest <= KEEL_ROW_WORDS ? 1 : 2;
}
/* The bits of chunk's rows_used[row / 64] that a slab of class k holding `row` (0-based)
 * owns. */
static inline uint64_t keel_rows_bits(const keel_class_t* k, unsigned row) {
  return (uint64_t)(keel_class_rows(k) == 2 ? 3 : 1) << (row % 64);
}
/* Word w of slab s's bitmap as it stands: words from s->ready on were never written
 * (a slab writes its bitmap a word at a time as takes reach it, so a slab that hands out
 * a few blocks touches no page of the chunk header's bitmap rows) and are wholly free. */
static inline uint64_t keel_slab_word(const keel_slab_t* s, uint32_t count, unsigned w) {
  /* A full slab gives its rows back (central.c, slab_became_full): all its words are 0. */
  if (w < s->ready) return w == 0 || s->row != 0 ? KEEL_SLAB_BITS(s, w) : 0;
  return (w + 1) * 64 <= count ? ~(uint64_t)0 : ((uint64_t)1 << (count % 64)) - 1;
}
/* The class of a block whose unit is tagged kind if it lies in a sampled slab, else 0. The
 * slab's class is written before its units are tagged and never changes while they are. */
static inline unsigned keel_sampled_class(const void* p, uint8_t kind) {
  return kind == KEEL_KIND_SAMPLED ? keel_span_of(p)->cls : 0;
}

#endif /* KEEL_CHUNK_H */
