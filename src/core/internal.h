/* internal.h -- Keel's core data structures and the functions the core files share.
 * Read docs/design.md first: it explains the layers and how these structures fit.
 *
 *   address space:  chunk (4 MiB, aligned) = 64 units of 64 KiB; unit 0 is the header
 *   small blocks:   slab = 1..16 units holding blocks of one size class
 *   large blocks:   span of units holding one block (up to KEEL_LARGE_MAX)
 *   huge blocks:    their own mapping, described out of line (huge.c)
 *   lookup:         pagemap: one byte per unit = size class, or a KEEL_KIND_* tag
 */
#ifndef KEEL_INTERNAL_H
#define KEEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/lock.h"
#include "keel.h"
#include "platform/prim.h"

#define KEEL_NOINLINE __attribute__((noinline))
#define KEEL_COLD __attribute__((cold, noinline))
/* Runs in every process (start-up, exit, the purger's tick, the fork handlers, the
 * profiler's countdown stage) though its file is mostly cold: the linker puts .text.hot
 * in libkeel's first code window (src/hot_text.ld). */
#define KEEL_HOT __attribute__((hot))
/* Zero-initialised data that is large and touched sparsely: laid out last by
 * src/hot_text.ld, where its untouched pages cost nothing and its neighbours do not
 * spill onto pages of their own. (In a file whose whole .bss that script already moves
 * with the cold files', it stays with them.) */
#define KEEL_SPARSE_BSS __attribute__((section(".bss.keel_sparse")))
/* Data every process writes though its file's other data may stay untouched: the
 * process-wide locks outside the central lists (the fork handlers take them all, and
 * the child resets them) and the first thread cache. src/hot_text.ld keeps it together
 * on the page where the hot .bss ends, away from the cold files' tables that the locks
 * used to sit beside (checked mode's quarantine, meshing's plans). */
#define KEEL_ALWAYS_BSS __attribute__((section(".bss.keel_always")))
/* The central lists' array: page-aligned, after the data every process writes
 * (src/hot_text.ld). */
#define KEEL_CENTRAL_BSS __attribute__((section(".bss.keel_central"), aligned(4096)))
#define KEEL_LIKELY(x) __builtin_expect(!!(x), 1)
#define KEEL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define KEEL_INTERNAL __attribute__((visibility("hidden")))

#if defined(__SANITIZE_THREAD__)
#define KEEL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KEEL_TSAN 1
#endif
#endif
#ifndef KEEL_TSAN
#define KEEL_TSAN 0
#endif

#if KEEL_DEBUG >= 1
#define keel_assert(cond) \
  ((cond) ? (void)0 : _keel_fatal_internal(__FILE__, __LINE__, #cond))
#else
#define keel_assert(cond) ((void)0)
#endif

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
 * which is as valid as ever. Each thread cache holds a copy of the entries up to
 * KEEL_SMALL_MAX for malloc's fast path (one indexed load). */
extern uint8_t _keel_class_serving[KEEL_NUM_CLASSES] KEEL_INTERNAL;
/* A coarse class's group switches to its fine classes only once the coarse class spans
 * this many slabs (size_class.c, group_big). */
#define KEEL_FINE_GROUP_SLABS 16
/* 1 for a coarse class that still serves finer classes (size_class.c). */
extern uint8_t _keel_class_group_pending[KEEL_NUM_CLASSES] KEEL_INTERNAL;
/* Keel's slabs now span slab_bytes: switch to the fine classes if that is enough. */
void _keel_classes_slabs_grew(uint64_t slab_bytes) KEEL_INTERNAL KEEL_NOINLINE;
/* Coarse class c has no partly used slab left: the classes it served switch if due. */
void _keel_classes_coarse_exhausted(unsigned c) KEEL_INTERNAL KEEL_NOINLINE;
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
  uint16_t ready;    /* slab: bitmap words written so far; the rest are wholly free */
  uint32_t put_tick; /* slab: purger tick when a block last came back */
  uint32_t busy_trim_tick; /* slab: first tick it may be trimmed while blocks come back */
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
  uint32_t pad;
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
  return kind == KEEL_KIND_SAMPLED ? keel_span_head(keel_chunk_of(p), keel_unit_index(p))->cls : 0;
}

/* pageheap.c: spans of units, purging. Callers hold no central lock order violation:
 * lock order is central -> pageheap -> meta. */
keel_slab_t* _keel_pageheap_alloc(size_t units, size_t align_units, bool* zeroed) KEEL_INTERNAL;
void _keel_pageheap_free(keel_slab_t* head) KEEL_INTERNAL;
bool _keel_pageheap_grow_in_place(keel_slab_t* head, size_t units) KEEL_INTERNAL;
void _keel_pageheap_shrink(keel_slab_t* head, size_t units) KEEL_INTERNAL;
size_t _keel_pageheap_purge(bool all) KEEL_INTERNAL; /* returns bytes released */
void _keel_pageheap_maybe_purge(void) KEEL_INTERNAL; /* purge what the delay allows */
void _keel_pageheap_lock_all(void) KEEL_INTERNAL;
void _keel_pageheap_unlock_all(void) KEEL_INTERNAL;
void _keel_pageheap_reset_locks(void) KEEL_INTERNAL;
void _keel_pageheap_stats(keel_stats_t* out) KEEL_INTERNAL;
/* KEEL_THP changed at run time: call after storing the new _keel_options.thp; advises
 * every chunk and huge block (live or cached) as the policy now says, under the page
 * heap lock, then the huge lock (not nested). SYSTEM cannot undo earlier advice. */
void _keel_thp_apply_all(void) KEEL_INTERNAL;
int _keel_thp_advice(void) KEEL_INTERNAL;           /* policy as madvise advice: +1, -1, 0 */
size_t _keel_thp_size(void) KEEL_INTERNAL;          /* huge page size in use (power of two) */
size_t _keel_thp_purge_granule(void) KEEL_INTERNAL; /* smallest purge (0: any; always: a huge page) */
/* KEEL_THP=dense: collapses a few huge pages that are in use and resident into real huge
 * pages (purger thread only). _promoted: whether any of the `units` units from p (in one
 * chunk) lies in one; their pages must not be purged apart. */
void _keel_pageheap_promote(void) KEEL_INTERNAL;
bool _keel_pageheap_promoted(const void* p, size_t units) KEEL_INTERNAL;
/* Makes the collapsed huge pages over those units ordinary base pages again: a slab in
 * one that has become sparse is trimmed like any other (slab_trim.c). */
void _keel_pageheap_demote(const void* p, size_t units) KEEL_INTERNAL;
typedef struct keel_thp_counts_s {
  uint64_t promoted;  /* huge pages collapsed and still whole */
  uint64_t collapses; /* collapses done */
  uint64_t refused;   /* collapses the OS refused */
  uint64_t released;  /* collapsed huge pages given back whole */
  uint64_t demoted;   /* collapsed huge pages that became sparse and went back to base pages */
} keel_thp_counts_t;
void _keel_thp_counts(keel_thp_counts_t* out) KEEL_INTERNAL;
void _keel_huge_thp_apply_all(void) KEEL_INTERNAL;  /* huge.c: advise huge blocks, live and cached */

/* ---- lock statistics (stats.c reads them; each module owns its lock) ---------------- */
extern keel_lock_t* const _keel_lock_pageheap KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_huge KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_threads KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_meta KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_pagemap KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_profile KEEL_INTERNAL;
extern keel_lock_t* const _keel_lock_quarantine KEEL_INTERNAL;

/* ---- page map (pagemap.c) -------------------------------------------------------------
 * Flat: one byte per 64 KiB unit, indexed by (address >> 16) & mask, so the free fast path
 * finds a block's class with a shift, a mask and a load. The map is reserved read-only
 * (unwritten bytes read as KEEL_KIND_NONE) and made writable slice by slice where Keel
 * maps memory; nothing is ever unmapped, so readers need no lock. Before the first Keel
 * mapping, base is a single zero byte and mask is 0 (NULL and every pointer then read
 * that byte). Base and mask are written once, before any block exists, and read with
 * plain loads: a reader that races with that first write can only be freeing a pointer
 * Keel never handed out. */
extern uint8_t* _keel_pagemap_base KEEL_INTERNAL;
extern uintptr_t _keel_pagemap_mask KEEL_INTERNAL;

static inline uint8_t* keel_pagemap_slot(uintptr_t a) {
  return &_keel_pagemap_base[(a >> KEEL_UNIT_SHIFT) & _keel_pagemap_mask];
}
static inline uint8_t keel_pagemap_get(const void* p) {
  return __atomic_load_n(keel_pagemap_slot((uintptr_t)p), __ATOMIC_RELAXED);
}
/* Sets `units` consecutive entries from address a; false if the map cannot describe a
 * (its slice could not be made writable, or, with a reduced map, a lies outside the
 * window the map covers): the caller then treats its mapping as failed. */
bool _keel_pagemap_reserve(void) KEEL_INTERNAL;
bool _keel_pagemap_set(uintptr_t a, size_t units, uint8_t value) KEEL_INTERNAL;
/* True if the map has ever described memory in the 1 GiB slice around a: a walk over
 * the map (checked.c's fault handler) stops where this is false. */
bool _keel_pagemap_slice_used(uintptr_t a) KEEL_INTERNAL;

/* ---- metadata (meta.c) ------------------------------------------------------------- */
void* _keel_meta_alloc(size_t size) KEEL_INTERNAL; /* zeroed, 64-byte aligned; NULL if OOM */
void _keel_meta_lock_all(void) KEEL_INTERNAL;
void _keel_meta_unlock_all(void) KEEL_INTERNAL;
void _keel_meta_reset_locks(void) KEEL_INTERNAL;
uint64_t _keel_meta_bytes(void) KEEL_INTERNAL;

/* ---- transfer caches (transfer.c) -----------------------------------------------------
 * Whole batches of free blocks parked between the thread caches and the slabs, without a
 * lock: per class, slots on up to KEEL_TRANSFER_LINES cache lines, a thread starting on
 * the line of its processor. A put takes an empty slot with one compare-and-swap, a get
 * empties one with one exchange. */
#define KEEL_TRANSFER_LINES 16
#define KEEL_TRANSFER_SLOTS 8 /* the largest transfer_max (size_class.c) */
/* A second thread cache exists: count the processors, use every line from now on. */
void _keel_transfer_spread(void) KEEL_INTERNAL;
unsigned _keel_transfer_lines(void) KEEL_INTERNAL; /* lines in use now */
/* Parks a list of a whole batch of class cls (half: half a batch); false if the lines the
 * thread may use are full. The class is active (central.c). */
bool _keel_transfer_put(unsigned cls, void* list, bool half) KEEL_INTERNAL;
/* A parked list of cls and its length (a batch or half of one), or NULL. */
void* _keel_transfer_get(unsigned cls, uint32_t* n) KEEL_INTERNAL;
bool _keel_transfer_any(unsigned cls) KEEL_INTERNAL; /* a hint: something is parked */
/* A parked list from a line no put or get has used for idle_ticks (0: any), or NULL. */
void* _keel_transfer_take_idle(unsigned cls, uint32_t now, uint32_t idle_ticks, uint32_t* n) KEEL_INTERNAL;
uint32_t _keel_transfer_blocks(unsigned cls) KEEL_INTERNAL; /* parked blocks (racy: statistics) */
/* Calls fn on every parked list (tests, the invariant walk: nothing may run beside it). */
void _keel_transfer_each(unsigned cls, void (*fn)(void* list, uint32_t n, void* ctx), void* ctx) KEEL_INTERNAL;

/* ---- central free lists (central.c, borrow.c, slab_trim.c) ------------------------------
 * One per size class: the slabs that still have free blocks, behind the class's lock,
 * which a thread takes only when the transfer cache has nothing for it or no room. */
typedef struct keel_central_s {
  keel_lock_t lock;
  uint32_t take_tick; /* purger tick when blocks were last taken (slab or transfer cache) */
  keel_slab_t* partial; /* slabs with free blocks */
  keel_slab_t* sampled_partial; /* the same, for slabs holding profile samples */
  uint32_t slabs;       /* slabs of this class */
  uint32_t pad;
  uint64_t out;         /* blocks out of slabs: live, or in a cache */
  /* The second line: state of borrowing and carving (borrow.c), under the class's lock
   * unless said. */
  keel_slab_t* lend_cursor;           /* where the next search for a hole to lend starts */
  struct keel_carve_s* carve_partial; /* holes carved for this class with free blocks */
  uint32_t lend_miss_tick;            /* 1 + the last tick a lend search found nothing */
  uint32_t carved_blocks;             /* blocks of this class handed out of carved holes */
  uint32_t carved_from;               /* holes carved out of this class's slabs */
} __attribute__((aligned(64))) keel_central_t;
/* Two cache lines. The array is in every process's .bss, in slot order (below): a
 * program writes the entries of the classes it uses. */
_Static_assert(sizeof(keel_central_t) == 128, "keel_central_t grew past two cache lines");

/* Purger ticks so far (a coarse clock the central lists stamp without a system call). */
extern uint64_t _keel_ticks KEEL_INTERNAL;

/* The central lists, in the order their classes became active (central.c), so that a
 * program writes as many pages of the array as the classes it uses fill; slot 0 is what
 * an inactive class reads, all zero, never written. Indexed through keel_central_of. */
extern keel_central_t _keel_central_slots[KEEL_NUM_CLASSES] KEEL_INTERNAL;
extern uint8_t _keel_central_slot[KEEL_NUM_CLASSES] KEEL_INTERNAL;
static inline keel_central_t* keel_central_of(unsigned cls) {
  return &_keel_central_slots[__atomic_load_n(&_keel_central_slot[cls], __ATOMIC_ACQUIRE)];
}

/* Free blocks parked in cls's transfer cache (racy: statistics). */
uint32_t _keel_central_parked_blocks(unsigned cls) KEEL_INTERNAL;
/* Whether cls's central list has ever been locked (an inactive one is all zero). */
bool _keel_central_active(unsigned cls) KEEL_INTERNAL;
/* Makes cls active (its own entry, written from now on) and returns its entry. No Keel
 * lock may be held. Before that, keel_central_of(cls) is the shared zero entry, which
 * must not be written. */
keel_central_t* _keel_central_activate(unsigned cls) KEEL_INTERNAL;
/* Class cls has free blocks in its slabs or transfer cache (unlocked: a hint). */
bool _keel_central_has_free(unsigned cls) KEEL_INTERNAL;
/* Whether a take of `want` blocks of cls may come from the transfer cache (at least half
 * a batch of a cached class). */
static inline bool _keel_central_parks(unsigned cls, uint32_t want) {
  const keel_class_t* k = &_keel_classes[cls];
  return k->transfer_max > 0 && want >= (k->batch >= 2 ? k->batch / 2u : k->batch);
}
/* A list parked in cls's transfer cache for a take of `want` blocks (a whole batch, or
 * half of one where want is less), without a lock; NULL (*got 0) if there is none or
 * want is too small (_keel_central_parks). */
void* _keel_central_take_parked(unsigned cls, uint32_t want, uint32_t* got) KEEL_INTERNAL;
/* Class cls has free blocks in its slabs (unlocked: a hint). */
static inline bool _keel_central_slabs_have_free(unsigned cls) {
  return __atomic_load_n(&keel_central_of(cls)->partial, __ATOMIC_RELAXED) != NULL;
}
/* Takes up to `want` blocks of class cls; returns a NULL-terminated list and sets *got.
 * NULL (and *got 0) when memory is exhausted. */
void* _keel_central_take(unsigned cls, uint32_t want, uint32_t* got) KEEL_INTERNAL;
/* The same from the slabs alone, under the class's lock (the transfer cache was tried). */
void* _keel_central_take_slabs(unsigned cls, uint32_t want, uint32_t* got) KEEL_INTERNAL;
/* Gives back a NULL-terminated list of n blocks of class cls. */
void _keel_central_give(unsigned cls, void* list, uint32_t n) KEEL_INTERNAL;
/* A free block of a larger, cold class for a request of class cls that would otherwise
 * take a new slab (borrow.c, "borrowing"); NULL if none. Never through a bin. */
#define KEEL_BORROW_FREE_SHARE 8 /* a class lends while 1/this of its slabs' blocks are free */
void* _keel_central_borrow(unsigned cls) KEEL_INTERNAL;
/* A larger class that may lend to cls and whose entry in heads (a thread cache's bin
 * heads) holds a free block; 0 if none. Not counted in _keel_central_borrowed_blocks,
 * which counts blocks lent from slabs. */
unsigned _keel_central_lender_in(const uintptr_t* heads, unsigned cls) KEEL_INTERNAL;
/* A block of class cls carved out of a free block of a class 4-64 times its size
 * (borrow.c, "carving"); NULL if none. Never through a bin. */
void* _keel_central_carve(unsigned cls) KEEL_INTERNAL;
/* free of p, in a unit tagged KEEL_KIND_CARVED: frees it if it is a carved block and
 * returns 0; else returns its slab's class, for the caller to free it as any other. */
unsigned _keel_central_carved_free(void* p, const char* call) KEEL_INTERNAL;
/* Usable size of the block at p, in a unit tagged KEEL_KIND_CARVED. */
size_t _keel_central_carved_size(const void* p, const char* call) KEEL_INTERNAL;
uint64_t _keel_central_carved_holes(void) KEEL_INTERNAL; /* holes carved now */
/* Central lock of cls held: its list of carved holes is consistent (verify.c). */
bool _keel_central_verify_carved(unsigned cls) KEEL_INTERNAL;
uint64_t _keel_central_borrowed_blocks(void) KEEL_INTERNAL;
/* One block of class cls from a slab reserved for heap-profile samples; NULL if OOM. */
void* _keel_central_take_sampled(unsigned cls) KEEL_INTERNAL;
/* True if block p (of class cls) is free in its slab: proves a double free. */
bool _keel_central_is_free(unsigned cls, void* p) KEEL_INTERNAL;
/* Meshing's hook (mesh.c sets it before it makes any page of a slab a view; NULL until
 * then): class lock held, the pages of [addr, addr + len) of a slab marked meshed leave
 * their mesh, views becoming fresh memory; false if one could not. The central lists call
 * it, never meshing by name; with meshing off no slab is meshed and it is never read. */
extern bool (*_keel_central_unmesh)(void* addr, size_t len) KEEL_INTERNAL;
/* Returns free memory of every class now, not on the purger's timer (slab_trim.c, like
 * _keel_central_decay): transfer caches back to their slabs, empty slabs to the page
 * heap, and the free pages of up to max_trims partly used slabs purged. Returns the
 * bytes purged. */
size_t _keel_central_purge_all(uint32_t max_trims) KEEL_INTERNAL;
/* All of Keel's free memory back to the OS now (keel_purge, `keel purge PID`, before a
 * fork), at most max_trims partly used slabs trimmed; bytes released (init.c). */
size_t _keel_purge_now(uint32_t max_trims) KEEL_INTERNAL;
/* The same for classes whose transfer cache has not been used for `idle_ticks`; and the
 * OS pages inside partly used slabs that hold only free blocks, untouched for as long,
 * go back to the OS - or, in a cold class (one that has taken no blocks for half as
 * long), while blocks still come back (a bounded number of slabs per tick). */
void _keel_central_decay(uint64_t idle_ticks) KEEL_INTERNAL;
uint64_t _keel_central_trimmed_bytes(void) KEEL_INTERNAL;
void _keel_central_lock_all(void) KEEL_INTERNAL;
void _keel_central_unlock_all(void) KEEL_INTERNAL;
void _keel_central_reset_locks(void) KEEL_INTERNAL;
/* Block start for a pointer into a slab of class cls; sets *exact if p is that start. */
void* _keel_block_start(unsigned cls, const void* p, bool* exact) KEEL_INTERNAL;

/* ---- meshing (mesh.c, mesh_estimate.c; docs/meshing.md) --------------------------------
 * Pages of two slabs of a class whose blocks in use sit at different offsets share one
 * physical page: both become private views of one page of a memory file. */
#define KEEL_MESH_MAX_BLOCK 2048u           /* larger blocks: a page touches at most two */
#define KEEL_MESH_MAX_PAGE ((size_t)16 << 10) /* larger OS pages: too few blocks a page */
#define KEEL_MESH_WAYS 8u /* pages that may share one physical page */
/* Called for each group the matcher proposes: 2..KEEL_MESH_WAYS page addresses of the
 * same index in slabs of class cls. Returns false to stop planning. */
typedef bool (*keel_mesh_visit_t)(void* ctx, unsigned cls, const uintptr_t* pages, unsigned n);
/* Runs the candidate search and the matcher on class cls's partly used slabs (their
 * bitmaps copied under the class lock, matched unlocked) and calls visit per group; the
 * slab the class refills from is left out. Returns false if scratch memory ran out. */
bool _keel_mesh_plan(unsigned cls, keel_mesh_visit_t visit, void* ctx) KEEL_INTERNAL;
/* Whether page p may mesh: not a view, or a view written since it was meshed. */
bool _keel_mesh_page_meshable(uintptr_t p) KEEL_INTERNAL;
/* Class lock held: the views among the pages of [addr, addr + len) are replaced by fresh
 * memory (their blocks are all free). Returns false if one could not be (it stays a
 * view: the caller must then keep the memory it is in). The central lists reach it as
 * _keel_central_unmesh. */
bool _keel_mesh_leave(void* addr, size_t len) KEEL_INTERNAL;
void _keel_mesh_tick(void) KEEL_INTERNAL; /* the purger's meshing pass */
void _keel_mesh_lock_all(void) KEEL_INTERNAL;   /* fork: before the central locks */
void _keel_mesh_unlock_all(void) KEEL_INTERNAL;
void _keel_mesh_table_lock(void) KEEL_INTERNAL; /* fork: the innermost lock */
void _keel_mesh_table_unlock(void) KEEL_INTERNAL;
void _keel_mesh_after_fork_child(void) KEEL_INTERNAL;
void _keel_mesh_verify(void) KEEL_INTERNAL; /* central locks held */

/* ---- large and huge blocks (huge.c and pageheap.c) ----------------------------------- */
void* _keel_large_alloc(size_t size, size_t align, bool zero) KEEL_INTERNAL;
void _keel_large_free(void* p, const char* call) KEEL_INTERNAL;
size_t _keel_large_usable(const void* p) KEEL_INTERNAL;
void* _keel_large_realloc(void* p, size_t size) KEEL_INTERNAL; /* NULL: caller copies */

void* _keel_huge_alloc(size_t size, size_t align, bool zero) KEEL_INTERNAL;
size_t _keel_huge_bytes(size_t size) KEEL_INTERNAL; /* mapping size for a request (0: too big) */
bool _keel_huge_free(void* p) KEEL_INTERNAL;               /* false: not a live huge block */
size_t _keel_huge_usable(const void* p) KEEL_INTERNAL;      /* 0: not a live huge block */
void* _keel_huge_realloc(void* p, size_t size) KEEL_INTERNAL; /* NULL: caller falls back */
size_t _keel_huge_purge(bool all) KEEL_INTERNAL;
bool _keel_huge_cache_pending(void) KEEL_INTERNAL; /* the cache holds freed mappings */
/* A block in a mapping its caller made and keeps (the checked mode's guarded blocks):
 * it is found, sized and counted like a huge block of `size` bytes, but huge.c never
 * unmaps, caches or remaps it. Adopt: false if out of memory. Disown: the page map says
 * FREED afterwards; returns the size, 0 if p was not adopted (or already disowned). */
bool _keel_huge_adopt(void* p, size_t size) KEEL_INTERNAL;
size_t _keel_huge_disown(void* p) KEEL_INTERNAL;
void _keel_huge_lock_all(void) KEEL_INTERNAL;
void _keel_huge_unlock_all(void) KEEL_INTERNAL;
void _keel_huge_reset_locks(void) KEEL_INTERNAL;
void _keel_huge_stats(keel_stats_t* out) KEEL_INTERNAL;

/* ---- tiers (tiers.c) ------------------------------------------------------------------ */
/* Any request: align is a power of two (<= 16: no constraint); via_cache = false takes
 * small blocks straight from the central lists. Sets ENOMEM on failure. */
void* _keel_alloc_any(size_t n, size_t align, bool zero, bool via_cache) KEEL_INTERNAL;
void* _keel_alloc_direct(unsigned cls) KEEL_INTERNAL;
enum { TIER_NONE, TIER_SMALL, TIER_LARGE, TIER_HUGE };
size_t _keel_usable_for(size_t n, size_t align, int* tier) KEEL_INTERNAL;
/* Usable size of a live block; reports misuse (naming `call`) for anything else. */
size_t _keel_usable_size(const void* p, const char* call) KEEL_INTERNAL;
/* realloc's and rallocx's resize of a large or huge block (kind: its page-map kind)
 * without a copy; NULL: the caller allocates, copies and frees. */
void* _keel_realloc_big(void* p, uint8_t kind, size_t n) KEEL_INTERNAL;

/* ---- checked mode (checked.c) -------------------------------------------------------
 * KEEL_CHECK=1: every block gets a canary tail and its requested size, freed blocks are
 * poisoned and quarantined, and every misuse is reported where it is seen. Thread
 * caches have no room, so every call reaches these functions through the slow paths. */
void* _keel_checked_alloc(size_t n, size_t align, bool zero) KEEL_INTERNAL;
void _keel_checked_free(void* p, const char* call) KEEL_INTERNAL;
size_t _keel_checked_usable(const void* p, const char* call) KEEL_INTERNAL;
void* _keel_checked_realloc(void* p, size_t n) KEEL_INTERNAL;
void _keel_checked_lock_all(void) KEEL_INTERNAL;   /* fork: the quarantine lock */
void _keel_checked_unlock_all(void) KEEL_INTERNAL;
void _keel_checked_reset_locks(void) KEEL_INTERNAL;

/* ---- thread caches (tcache.c) --------------------------------------------------------
 * A bin is a singly linked list of free blocks threaded through their first word.
 * `avail` is how many more blocks the bin may take before it must give some back:
 * count = max - avail. Fast paths touch only `head`, `avail` and, on malloc, the
 * sampling countdown (which, with profiling off, only reaches zero every 2^32 pops).
 * Heads and the rest are two arrays of 8-byte elements indexed by class, so that one
 * address computation serves both and free() goes from the page-map byte to its bin with
 * no arithmetic.
 * `avail` is signed so that free() can take room and test in one step (decrement, branch
 * if negative); the slow path puts it back to 0. The shared empty cache of young threads
 * is written that way too, by any young thread, always to a small negative number or back
 * to 0, so it never has room: a harmless race on a line only slow paths follow. */
typedef union keel_bin_u {
  struct {
    int16_t avail;
    int16_t countdown;     /* pops left, less one, in this stage of the heap profiler's
                              countdown: 0..0x7FFF, the stage ends when it goes negative */
    uint16_t max;
    uint16_t countdown_hi; /* further stages of 2^15 pops (profile.c) */
  };
  /* avail in the low half, countdown in the high half: malloc updates both with one
   * subtraction of 0xFFFF (avail + 1, countdown - 1) and branches on the sign. */
  int32_t avail_countdown;
} keel_bin_t;
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "keel_bin_t packs avail below countdown");

typedef struct keel_tcache_s {
  /* Serving class of sizes 16i+1..16i+16 (a copy of _keel_class_serving[i + 1]): the
   * fast path's one load more for the coarse classes. 0 (head[0] is always NULL, so a
   * miss) until the cache is set up. */
  uint8_t class_of[KEEL_SMALL_MAX / 16];
  uintptr_t head[KEEL_NUM_CLASSES]; /* first free block, stored encoded (freelist.h); [0] never used */
  keel_bin_t bin[KEEL_NUM_CLASSES];
  struct keel_tcache_s* next;        /* registry of live caches */
  struct keel_tcache_s* prev;
  size_t max_bytes;                  /* sum over bins of max * block size */
  uint64_t refills;                  /* slow-path statistics, owner-written */
  uint64_t flushes;
} keel_tcache_t;

/* free()'s room check: takes one unit of room from the bin, true if there was one. On
 * false the bin is left at -1 (see keel_bin_t), and the slow path that follows must call
 * keel_bin_give_back_room. TSan builds test before writing, so that the empty cache's
 * harmless race does not drown real reports. */
static inline bool keel_bin_take_room(keel_bin_t* b) {
#if KEEL_TSAN
  if (b->avail <= 0) return false;
  b->avail--;
  return true;
#else
  return --b->avail >= 0;
#endif
}
static inline void keel_bin_give_back_room(keel_bin_t* b) {
  if (b->avail < 0) b->avail = 0;
}
/* malloc()'s bookkeeping for a pop: one more unit of room, one pop nearer the next heap
 * profile sample. False when the countdown's stage ran out: the caller then calls
 * _keel_profile_countdown_expired. */
static inline bool keel_bin_count_pop(keel_bin_t* b) {
  b->avail_countdown -= 0xFFFF;
  return b->avail_countdown >= 0;
}
/* The same for a pop whose room was already counted (refills). */
static inline bool keel_bin_count_sample_only(keel_bin_t* b) {
  return --b->countdown >= 0;
}
/* The pops-th pop from now (1 <= pops; at most 2^31, more is clamped) is the one that
 * finds the countdown spent in _keel_profile_countdown_expired. */
static inline void keel_bin_set_countdown(keel_bin_t* b, uint32_t pops) {
  uint32_t left = (pops > 0x80000000u ? 0x80000000u : pops) - 1;
  b->countdown = (int16_t)(left & 0x7FFF);
  b->countdown_hi = (uint16_t)(left >> 15);
}

/* The calling thread's cache. Threads start on the empty cache, whose bins are all empty
 * with no room, so every malloc and free takes the slow path, which serves a young thread
 * from the central lists and gives a thread that keeps going its own cache (tcache.c). */
extern _Thread_local keel_tcache_t* _keel_tc KEEL_INTERNAL;
extern keel_tcache_t _keel_tc_empty KEEL_INTERNAL;

/* Every free block carries this process-random value in its second word, and every
 * path that hands a block out clears it. So a block that still has it is free: freeing
 * it again is a double free, whichever thread freed it first. The low bit is set so the
 * key can never equal a pointer the program stored there. */
extern uintptr_t _keel_free_key KEEL_INTERNAL;

void* _keel_tcache_alloc_slow(keel_tcache_t* t, unsigned cls, bool may_borrow) KEEL_INTERNAL;
void _keel_tcache_free_slow(keel_tcache_t* t, void* p, unsigned cls) KEEL_INTERNAL;
void _keel_tcache_flush(keel_tcache_t* t) KEEL_INTERNAL;
void _keel_tcache_thread_flush(void) KEEL_INTERNAL;
/* True if p is in t's bin of class cls (tests and diagnostics). */
bool _keel_tcache_contains(keel_tcache_t* t, unsigned cls, void* p) KEEL_INTERNAL;
void _keel_tcache_lock_all(void) KEEL_INTERNAL;
void _keel_tcache_unlock_all(void) KEEL_INTERNAL;
void _keel_tcache_after_fork_child(void) KEEL_INTERNAL;
void _keel_tcache_stats(keel_stats_t* out, uint64_t* cached_bytes) KEEL_INTERNAL;
void _keel_tcache_class_counts(uint64_t* counts /* [KEEL_NUM_CLASSES] */) KEEL_INTERNAL;
/* Copies _keel_class_serving into every thread cache (the switch to fine classes). */
void _keel_tcache_classes_changed(void) KEEL_INTERNAL;
/* The heap profiler's hook (profile.c sets it when profiling starts; NULL without):
 * starts the sampling countdowns of a new cache's bins. NULL: no bin ever samples. The
 * thread caches call it, never the profiler by name. */
extern void (*_keel_tcache_sampling)(keel_tcache_t* t) KEEL_INTERNAL;

/* ---- options (options.c) -------------------------------------------------------------- */
typedef struct keel_options_s {
  uint64_t purge_delay_ms;  /* KEEL_PURGE_DELAY: free memory is returned after this long */
  uint64_t tcache_bytes;    /* KEEL_TCACHE_MAX: most bytes one thread cache may hold */
  uint64_t huge_page_size;  /* KEEL_HUGE_PAGE_SIZE: override what the OS reports */
  bool stats_at_exit;       /* KEEL_STATS */
  bool background_purge;    /* KEEL_BACKGROUND_PURGE: a helper thread purges on a timer */
  bool check;               /* KEEL_CHECK: checked mode (canaries, poison, quarantine) */
  bool publish;             /* KEEL_PUBLISH: statistics readable by `keel stats PID` */
  uint64_t profile_rate;    /* KEEL_PROFILE_RATE: bytes between heap samples (0: off) */
  uint64_t profile_growth;  /* KEEL_PROFILE_GROWTH: dump a profile after this much growth */
  bool profile_at_exit;     /* KEEL_PROFILE_AT_EXIT: dump a profile at exit */
  bool profile_leaks;       /* KEEL_PROFILE_LEAKS: report live sampled blocks at exit */
  char profile_prefix[200]; /* KEEL_PROFILE_PREFIX: dumps go to PREFIX.<pid>.<n>.heap */
  int thp;                  /* KEEL_THP: keel_thp_policy_t for Keel's own memory */
  int mesh;                 /* KEEL_MESH: keel_mesh_policy_t */
  uint64_t check_guard;     /* KEEL_CHECK_GUARD: checked-mode blocks this big get a guard
                               page after their end (0: none) */
  uint64_t fine_classes;    /* KEEL_FINE_CLASSES: slab bytes at which the fine size classes
                               take over from the coarse ones (0: fine from the start) */
  uint64_t child_purger;    /* KEEL_CHILD_PURGER: a forked child starts its purger once it
                               has taken this much in spans and huge blocks since the fork
                               (0: at the fork) */
} keel_options_t;

/* KEEL_THP: what Keel asks of transparent huge pages for the memory it maps. */
typedef enum keel_thp_policy_e {
  KEEL_THP_SYSTEM = 0, /* no advice: the machine's setting decides */
  KEEL_THP_ALWAYS = 1, /* MADV_HUGEPAGE: huge pages even where the machine says madvise */
  KEEL_THP_NEVER = 2,  /* MADV_NOHUGEPAGE: never, whatever the machine says */
  KEEL_THP_DENSE = 3,  /* none at fault time; the purger collapses dense huge pages */
} keel_thp_policy_t;

/* KEEL_MESH: whether the purger meshes sparse slab pages (docs/meshing.md). */
typedef enum keel_mesh_policy_e {
  KEEL_MESH_OFF = 0,
  KEEL_MESH_ON = 1,   /* only with a write barrier the kernel's own writes respect too */
  KEEL_MESH_USER = 2, /* also with a user-mode barrier: a read(2) into a block being
                         meshed then fails with EFAULT instead of waiting */
} keel_mesh_policy_t;

extern keel_options_t _keel_options KEEL_INTERNAL;
/* The rule for options. Every read of one that may change while the program runs goes
 * through keel_opt(name), a relaxed atomic load (a plain load on x86-64 and aarch64: a
 * new value lands whole and is seen soon, in no particular order), and every write is a
 * relaxed atomic store (options.c, mallctl). Those fixed before the first block exists
 * (options.c's AT_START: check, huge_page_size) may be read plainly. A reader that needs
 * an order says so with its own __atomic_load_n (publish.c). The one string,
 * profile_prefix, is written and read a byte at a time (keel_opt_str): a read racing a
 * change may mix the two values, never run past the array. */
#define keel_opt(name) __atomic_load_n(&_keel_options.name, __ATOMIC_RELAXED)
static inline void keel_opt_str_copy(char* dst, size_t cap, const char* src, size_t src_cap) {
  size_t n = cap < src_cap ? cap : src_cap, i = 0;
  for (; i + 1 < n && (dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED)) != 0; i++) {}
  if (n > 0) dst[i] = 0;
}
#define keel_opt_str(dst, cap, name) keel_opt_str_copy(dst, cap, _keel_options.name, sizeof _keel_options.name)
void _keel_options_init(void) KEEL_INTERNAL;
/* What a run-time option change sets in motion. */
void _keel_background_start(void) KEEL_INTERNAL; /* start the purger if not running */
void _keel_publish_option_changed(void) KEEL_INTERNAL;

/* ---- process life cycle (init.c) ------------------------------------------------------ */
extern bool _keel_ready KEEL_INTERNAL; /* process state set up (page size, classes, options) */
void _keel_init(void) KEEL_INTERNAL;   /* idempotent; cheap after the first call */
/* Set in a forked child whose purger waits for the child's heap to grow (init.c). The
 * allocation slow path, which runs with no Keel lock held, then asks whether it has. */
extern bool _keel_purger_deferred KEEL_INTERNAL;
void _keel_purger_deferred_check(void) KEEL_INTERNAL KEEL_NOINLINE; /* every forked child runs it */
static inline void keel_ensure_init(void) {
  if (KEEL_UNLIKELY(!__atomic_load_n(&_keel_ready, __ATOMIC_ACQUIRE))) _keel_init();
}
extern size_t _keel_page_size KEEL_INTERNAL;

/* ---- errors (report.c) ---------------------------------------------------------------- */
/* Prints one line "keel: CALL(): WHAT pointer 0x...DETAIL" and aborts. */
_Noreturn void _keel_misuse(const char* call, const char* what, const void* p,
                            const char* detail, size_t size) KEEL_INTERNAL KEEL_COLD;
_Noreturn void _keel_fatal_internal(const char* file, int line, const char* what) KEEL_INTERNAL
    KEEL_COLD;
void _keel_warn(const char* msg, const char* value) KEEL_INTERNAL;

/* A tiny formatter over a fixed buffer (no stdio, no allocation). */
typedef struct keel_buf_s {
  char* p;
  size_t len, cap;
} keel_buf_t;
void _keel_buf_str(keel_buf_t* b, const char* s) KEEL_INTERNAL;
void _keel_buf_u64(keel_buf_t* b, uint64_t v) KEEL_INTERNAL;
void _keel_buf_hex(keel_buf_t* b, uint64_t v) KEEL_INTERNAL;
void _keel_buf_pad(keel_buf_t* b, size_t col) KEEL_INTERNAL;

/* ---- invariants (verify.c) ----------------------------------------------------------
 * Walks every structure and aborts on the first inconsistency. Expensive: tests, and
 * KEEL_DEBUG >= 2 builds (which run it every KEEL_VERIFY_EVERY slow-path calls). */
void _keel_verify(void) KEEL_INTERNAL;
#define KEEL_VERIFY_EVERY 4096

/* ---- heap profiling (profile.c) --------------------------------------------------------
 * KEEL_PROFILE_RATE=N samples about one allocation per N bytes. A sampled small block
 * comes from a sampled slab (page-map tag KEEL_KIND_SAMPLED), so only its free leaves
 * the fast path; large and huge blocks are sampled on their own (slow) paths. */
extern bool _keel_profiling KEEL_INTERNAL;
void _keel_profile_init(void) KEEL_INTERNAL;
/* A bin's countdown stage ran out on popping p for a request of n bytes: starts the next
 * stage, or, when the countdown is spent, serves the request with a sampled block and
 * returns that instead. */
void* _keel_profile_countdown_expired(keel_tcache_t* t, unsigned cls, void* p, size_t n) KEEL_INTERNAL;
/* The same for the malloc fast path, whose bin follows from n (1..KEEL_SMALL_MAX) and
 * the thread cache's class map: the fast path then needs no extra register to make the
 * call. */
void* _keel_profile_countdown_expired_sized(void* p, size_t n) KEEL_INTERNAL;
void _keel_profile_sample_big(void* p, size_t n) KEEL_INTERNAL; /* large/huge, if due */
void _keel_profile_forget(void* p) KEEL_INTERNAL;   /* a sampled block is freed */
uint32_t _keel_profile_first_countdown(unsigned cls) KEEL_INTERNAL;
/* Writes the profile (pprof legacy heap format) to path; returns false on error. */
bool _keel_profile_dump_to(const char* path) KEEL_INTERNAL;
/* Where a profile named tag goes: KEEL_PROFILE_PREFIX.<pid>.<tag>.heap, cut to cap bytes. */
void _keel_profile_path(char* path, size_t cap, const char* tag) KEEL_INTERNAL;
void _keel_profile_tick(void) KEEL_INTERNAL;   /* purger: growth-triggered dumps */
void _keel_profile_at_exit(void) KEEL_INTERNAL;

/* ---- publishing (publish.c) --------------------------------------------------------- */
void _keel_publish_init(void) KEEL_INTERNAL;
void _keel_publish_after_fork_child(void) KEEL_INTERNAL;
void _keel_publish_exit(void) KEEL_INTERNAL;
void _keel_publish_tick(void) KEEL_INTERNAL;

/* ---- statistics (stats.c) ------------------------------------------------------------- */
void _keel_stats_collect(keel_stats_t* out) KEEL_INTERNAL;
void _keel_stats_at_exit(void) KEEL_INTERNAL;

/* The lists of free blocks and the bins' primitives (they need the types above). */
#include "core/freelist.h"

#endif /* KEEL_INTERNAL_H */
