/* borrow.c -- a class's free blocks lent to smaller classes: borrowed whole, or carved
 * into rows of much smaller blocks (the two sections below say why and when).
 *
 * Its own file because it is a policy on top of the free lists (central.c), not a part
 * of them: it runs only when a class would otherwise take a new slab, and it reaches
 * into the lists through slab.h alone. Its searches are in the hot code window: a
 * growing process runs them once the purger has started, whether or not it finds a
 * hole. So are the frees and sizes of blocks in slabs that lend carved holes: every
 * block of such a slab, its own too, comes through them. */
#include "core/slab.h"

/* ---- borrowing -----------------------------------------------------------------------
 * A slab holds blocks of one size, so the holes a class leaves when its blocks are
 * freed at random (a server overwriting 1 KiB values with 700-byte ones) are filled
 * only by requests of that class: the pages stay resident for the few live blocks
 * each still holds, while the smaller values take new slabs. glibc's best-fit heap
 * reuses such holes for any smaller size. When a class would have to take a new slab,
 * it may instead borrow one free block of a larger class (at most twice the request)
 * whose own requests will not want the hole soon (can_lend), from pages that already
 * hold blocks in use: memory the process holds anyway, where a new slab would add pages.
 * The block keeps its own class for life (malloc_usable_size says so, and its free
 * goes to that class's bin), and is handed out on its own, never through the borrowing
 * class's bin (a bin holds one class): a class that borrows takes its slow path on each
 * request, and only while it would otherwise grow. Aligned requests never borrow (a
 * larger block need not be as aligned), nor do the heap profiler's samples or the
 * checked mode. jemalloc's nallocx() reports the size of the request's own class, so
 * for a borrowed block it is less than malloc_usable_size(), never more. */
#define BORROW_SPAN 2        /* a lender's blocks are at most this many times the request */
#define BORROW_SLABS 64      /* a lender's partly used slabs looked at per borrow */
#define BORROW_CANDIDATES 512 /* a lender's free blocks looked at per borrow */

/* lend_miss_tick, 1 + the last tick a search of a class found nothing to lend: a class
 * whose free blocks lie on wholly free pages is searched in vain at most once a tick,
 * not on every request of every smaller class. */
static uint64_t borrowed_blocks;

/* True if every OS page under block idx of slab s also holds a block in use. */
static bool pages_in_use(const keel_slab_t* s, const keel_class_t* k, size_t idx, size_t* free_page) {
  size_t page = _keel_page_size, start = idx * k->size;
  for (size_t off = start & ~(page - 1); off < start + k->size; off += page)
    if (_keel_slab_page_free(s, k, off)) {
      *free_page = off;
      return false;
    }
  return true;
}

/* Lock of the lender held: takes a free block of slab s that shares its pages with
 * blocks in use, looking at up to *budget free blocks; -1 if none. Only words a take
 * has reached are searched (the rest were never handed out, so their pages are likely
 * untouched), and a page found free skips the candidates on it. */
static long slab_take_hole(keel_slab_t* s, const keel_class_t* k, unsigned* budget) {
  size_t skip_end = 0; /* candidates starting below this offset lie on a free page */
  for (unsigned w = s->scan; w < s->ready && *budget > 0; w++) {
    uint64_t bits = KEEL_SLAB_BITS(s, w);
    while (bits && *budget > 0) {
      unsigned b = (unsigned)__builtin_ctzll(bits);
      bits &= bits - 1;
      size_t idx = (size_t)w * 64 + b, free_page;
      if (idx >= k->count) break;
      if (idx * k->size < skip_end) continue;
      (*budget)--;
      if (!pages_in_use(s, k, idx, &free_page)) {
        skip_end = free_page + _keel_page_size;
        continue;
      }
      KEEL_SLAB_BITS(s, w) &= ~((uint64_t)1 << b);
      s->used++;
      return (long)idx;
    }
  }
  return -1;
}

/* A class lends when it will not miss the hole: it has gone cold, or at least an
 * eighth of its slabs' blocks are free in them (not counting its caches), so its own
 * requests have plenty left - a server that overwrites at random frees into a class
 * faster than the purge delay lets it go cold (redis-frag's overwrites take 0.3 s).
 * Called without the class's lock as a hint, then again with it. */
__attribute__((no_sanitize("thread"))) static bool can_lend(const keel_central_t* cl, const keel_class_t* k,
                                                            uint32_t now, uint32_t cold) {
  if (now - __atomic_load_n(&cl->take_tick, __ATOMIC_RELAXED) >= cold) return true;
  uint64_t blocks = (uint64_t)cl->slabs * k->count, out = _keel_central_out(cl);
  return blocks > out && (blocks - out) * KEEL_BORROW_FREE_SHARE >= blocks;
}

/* Whether borrowing is on at all; sets the purger's clock and cold threshold. */
static bool borrowing(uint32_t* now, uint32_t* cold) {
  *cold = __atomic_load_n(&_keel_cold_ticks, __ATOMIC_RELAXED);
  *now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  /* Without the purger there is no clock for "cold". Under meshing the holes are left
   * to the mesher: a borrowed block makes the lender's pages denser, so fewer of them
   * pair up once the program idles (redis-frag held more with both than with meshing
   * alone). The settings say so, not the features' state: KEEL_MESH may change at any
   * time, and KEEL_PROFILE_RATE is not 0 exactly when the profiler runs (it cannot be
   * switched on or off once started). */
  return *cold != 0 && keel_opt(profile_rate) == 0 && keel_opt(mesh) == KEEL_MESH_OFF;
}

unsigned _keel_central_lender_in(const uintptr_t* heads, unsigned cls, size_t n) {
  uint32_t now, cold;
  if (!borrowing(&now, &cold)) return 0;
  uint64_t most = (uint64_t)n * BORROW_SPAN;
  for (unsigned lender = cls + 1; lender < KEEL_NUM_CLASSES && _keel_classes[lender].size <= most; lender++)
    if (keel_bin_head_ok(heads[lender]) && can_lend(keel_central_of(lender), &_keel_classes[lender], now, cold))
      return lender;
  return 0;
}

/* ---- carving ------------------------------------------------------------------------
 * Borrowing lends a whole block of at most twice the request. A much smaller class
 * would waste most of such a block, so it carves one instead: a hole of a class 4 to 64
 * times its size (on pages that hold blocks in use, as for borrowing) becomes a row of
 * its own blocks behind a 32-byte header, and goes back to its class when the last of
 * them is freed. glibc's heap does the same by splitting a free chunk: Redis overwriting
 * 700-byte values with 16-byte ones keeps its RSS there, where a heap of size classes
 * takes new slabs. The lender's slab marks the hole in a second bitmap (the words after
 * its free bitmap, in the same row of the chunk header; s->carved counts the holes) and
 * its units get the page-map tag KEEL_KIND_CARVED, so every free in them takes the slow
 * path, which tells a carved block from one of the slab's own under the lender's lock.
 * Carved blocks are handed out one at a time and never enter a cache; what borrowing
 * leaves out (aligned requests, the profiler, meshing) carving leaves out too, and
 * meshing passes carved slabs by (their page-map tag is not their class). */
#define CARVE_HEADER 32
#define CARVE_MIN 4  /* blocks a carved hole holds at least */
#define CARVE_MAX 64 /* and at most: one bitmap word */
_Static_assert(KEEL_CARVE_LENDER_MIN == CARVE_HEADER + CARVE_MIN * 16, "the smallest lender holds 4 of the smallest blocks");

typedef struct keel_carve_s {
  struct keel_carve_s* next; /* the class's list of carved holes with free blocks */
  struct keel_carve_s* prev;
  uint64_t free;             /* bit i: block i is free */
  uint8_t cls;
  uint8_t count;
  uint8_t used;
  uint8_t listed;
} keel_carve_t;
_Static_assert(sizeof(keel_carve_t) <= CARVE_HEADER, "a carved hole's header must fit its 32 bytes");

static uint64_t carved_holes;                         /* holes carved now */
/* Per class, under its lock: carve_partial, its carved holes with free blocks;
 * carved_blocks, its blocks handed out of holes; carved_from, holes carved out of its
 * slabs (counted in its `out`, but holding other classes' blocks: statistics). */

/* The carved-hole bitmap of slab s (of class k) follows its free bitmap: word w of it is
 * bitmap word keel_class_words(k) + w, which its rows have room for
 * (keel_class_can_carve_from). */

/* Lender's lock held: marks block idx of slab s carved (the first of the slab tags its
 * units, after clearing the bitmap). False if the page map refuses. */
static bool carve_mark(keel_slab_t* s, const keel_class_t* k, size_t idx) {
  unsigned words = keel_class_words(k);
  if (s->carved == 0) {
    _keel_slab_rows_take(s, k);
    for (unsigned w = 0; w < words; w++) KEEL_SLAB_BITS(s, words + w) = 0;
    if (!_keel_pagemap_set((uintptr_t)slab_base(keel_chunk_of(s), s), s->units, KEEL_KIND_CARVED))
      return false;
  }
  KEEL_SLAB_BITS(s, words + idx / 64) |= (uint64_t)1 << (idx % 64);
  s->carved++;
  keel_central_of(s->cls)->carved_from++;
  return true;
}

static void carve_list_push(unsigned cls, keel_carve_t* d) {
  d->prev = NULL;
  d->next = keel_central_of(cls)->carve_partial;
  if (d->next) d->next->prev = d;
  __atomic_store_n(&keel_central_of(cls)->carve_partial, d, __ATOMIC_RELAXED);
  d->listed = 1;
}

static void carve_list_remove(unsigned cls, keel_carve_t* d) {
  if (d->prev) d->prev->next = d->next;
  else __atomic_store_n(&keel_central_of(cls)->carve_partial, d->next, __ATOMIC_RELAXED);
  if (d->next) d->next->prev = d->prev;
  d->listed = 0;
}

/* Class cls's lock held: a block of carved hole d. */
static void* carve_take_block(unsigned cls, keel_carve_t* d) {
  unsigned i = (unsigned)__builtin_ctzll(d->free);
  d->free &= d->free - 1;
  d->used++;
  __atomic_store_n(&keel_central_of(cls)->carved_blocks, keel_central_of(cls)->carved_blocks + 1, __ATOMIC_RELAXED);
  if (d->free == 0) carve_list_remove(cls, d);
  void** p = (void**)((char*)d + CARVE_HEADER + (size_t)i * _keel_classes[cls].size);
  p[1] = NULL;
  return p;
}

/* A hole of class lender (see slab_take_hole), if it can lend one now; NULL if not.
 * With carve, the hole is marked carved in its slab (below) under the lender's lock. */
static KEEL_NOINLINE void* take_hole(unsigned lender, uint32_t now, uint32_t cold, bool carve) {
  keel_central_t* cl = keel_central_of(lender);
  const keel_class_t* k = &_keel_classes[lender];
  if (__atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) == 0 || !can_lend(cl, k, now, cold) ||
      __atomic_load_n(&cl->lend_miss_tick, __ATOMIC_RELAXED) == now + 1)
    return NULL;
  unsigned budget = BORROW_CANDIDATES;
  /* Never wait for a lender: threads that borrow at once, or a lender busy with its
   * own traffic, make this request take a slab as it would have. */
  if (!_keel_central_trylock_class(cl)) return NULL;
  long idx = -1;
  /* The search goes round the partial list from where the last one stopped, so the
   * slabs at its head, once lent out, do not end every search. */
  keel_slab_t** cursor = &cl->lend_cursor;
  keel_slab_t* s = NULL;
  if (can_lend(cl, k, now, cold) && cl->partial_lines != 0) {
    s = *cursor != NULL ? *cursor : _keel_partial_first(cl);
    for (unsigned n = 0; n < BORROW_SLABS && budget > 0; n++) {
      if (!s->meshed && (idx = slab_take_hole(s, k, &budget)) >= 0) break;
      keel_slab_t* next = _keel_partial_next(cl, s);
      s = next != NULL ? next : _keel_partial_first(cl);
    }
    *cursor = s;
  }
  if (idx < 0 || (carve && !carve_mark(s, k, (size_t)idx))) {
    if (idx >= 0) { /* the page map refused: the hole goes back */
      KEEL_SLAB_BITS(s, idx / 64) |= (uint64_t)1 << (idx % 64);
      s->used--;
    }
    _keel_central_unlock_class(cl);
    __atomic_store_n(&cl->lend_miss_tick, now + 1, __ATOMIC_RELAXED);
    return NULL;
  }
  void** p = (void**)((char*)slab_base(keel_chunk_of(s), s) + (size_t)idx * k->size);
  if (s->used == k->count) _keel_slab_became_full(cl, s, k);
  home_out_add(_keel_central_home(cl, s->home), 1);
  bool exhausted = cl->partial_lines == 0;
  _keel_central_unlock_class(cl);
  if (KEEL_UNLIKELY(exhausted && __atomic_load_n(&_keel_class_group_pending[lender], __ATOMIC_RELAXED)))
    _keel_classes_coarse_used(lender, true);
  p[1] = NULL;
  return p;
}

void* _keel_central_borrow(unsigned cls, size_t n) {
  uint32_t now, cold;
  if (!borrowing(&now, &cold)) return NULL;
  uint64_t most = (uint64_t)n * BORROW_SPAN;
  for (unsigned lender = cls + 1; lender < KEEL_NUM_CLASSES && _keel_classes[lender].size <= most; lender++) {
    void* p = take_hole(lender, now, cold, false);
    if (p != NULL) {
      __atomic_add_fetch(&borrowed_blocks, 1, __ATOMIC_RELAXED);
      return p;
    }
  }
  return NULL;
}

static KEEL_NOINLINE void* carve(unsigned cls);

/* Whether class cls may try to carve once more in tick now, counting the try if so. A
 * carved block is handed out and freed on the slow path, under locks, one at a time: a
 * class whose demand swings (a query's working set, allocated and freed over and over)
 * would otherwise serve the top of every swing from the same few holes, a lock per
 * malloc and per free, for as long as it runs. Such a class carves many times the
 * blocks it has out each tick; one that fills holes with data it keeps (a server's new
 * values) carves fewer than it has out, and is not held back. Its entry is written only
 * once the class is active (slot 0 is never written). */
static bool carve_allowed(unsigned cls, uint32_t now) {
  if (!_keel_central_active(cls)) return true;
  keel_central_t* cl = keel_central_of(cls);
  uint32_t carves =
      __atomic_load_n(&cl->carve_tick, __ATOMIC_RELAXED) == now ? __atomic_load_n(&cl->carves, __ATOMIC_RELAXED) : 0;
  if (carves >= KEEL_CARVES_PER_TICK && carves >= __atomic_load_n(&cl->carved_blocks, __ATOMIC_RELAXED)) return false;
  __atomic_store_n(&cl->carve_tick, now, __ATOMIC_RELAXED);
  __atomic_store_n(&cl->carves, carves + 1, __ATOMIC_RELAXED);
  return true;
}

/* Every class about to take a new slab asks: the answer is a quick no unless it has
 * carved holes or borrowing is on. */
void* _keel_central_carve(unsigned cls) {
  keel_central_t* cl = keel_central_of(cls);
  uint32_t now, cold;
  bool on = borrowing(&now, &cold);
  if ((__atomic_load_n(&cl->carve_partial, __ATOMIC_RELAXED) == NULL && !on) || !carve_allowed(cls, now)) return NULL;
  return carve(cls);
}

static void* carve(unsigned cls) {
  const keel_class_t* kc = &_keel_classes[cls];
  keel_central_t* cl = keel_central_of(cls);
  if (__atomic_load_n(&cl->carve_partial, __ATOMIC_RELAXED) != NULL) {
    _keel_central_lock_class(cl);
    void* p = cl->carve_partial != NULL ? carve_take_block(cls, cl->carve_partial) : NULL;
    _keel_central_unlock_class(cl);
    if (p != NULL) return p;
  }
  uint32_t now, cold;
  if (!borrowing(&now, &cold)) return NULL;
  uint64_t least = CARVE_HEADER + (uint64_t)CARVE_MIN * kc->size;
  uint64_t most = CARVE_HEADER + (uint64_t)CARVE_MAX * kc->size;
  for (unsigned lender = cls + 1; lender < KEEL_NUM_CLASSES && _keel_classes[lender].size <= most; lender++) {
    const keel_class_t* k = &_keel_classes[lender];
    if (k->size < least || !keel_class_can_carve_from(k)) continue;
    keel_carve_t* d = (keel_carve_t*)take_hole(lender, now, cold, true);
    if (d == NULL) continue;
    __atomic_add_fetch(&carved_holes, 1, __ATOMIC_RELAXED);
    unsigned count = (unsigned)((k->size - CARVE_HEADER) / kc->size);
    if (count > CARVE_MAX) count = CARVE_MAX;
    d->cls = (uint8_t)cls;
    d->count = (uint8_t)count;
    d->used = 0;
    d->listed = 0;
    d->free = count == 64 ? ~(uint64_t)0 : ((uint64_t)1 << count) - 1;
    cl = lock_class(cls); /* it may activate cls: its entry moves from slot 0 */
    carve_list_push(cls, d);
    void* p = carve_take_block(cls, d);
    _keel_central_unlock_class(cl);
    return p;
  }
  return NULL;
}

/* The carved hole that block p (in a unit tagged KEEL_KIND_CARVED) lies in, or NULL if p
 * is in one of the slab's own blocks; *lender gets the slab's class. */
static keel_carve_t* carved_hole_of(const void* p, unsigned* lender) {
  keel_slab_t* s = keel_span_of(p);
  unsigned cls = s->cls;
  const keel_class_t* k = &_keel_classes[cls];
  keel_central_t* cl = keel_central_of(cls);
  keel_carve_t* d = NULL;
  _keel_central_lock_class(cl);
  if (s->state == KEEL_UNIT_SLAB && s->cls == cls && s->carved > 0) {
    char* base = (char*)slab_base(keel_chunk_of(s), s);
    uint64_t idx = ((uint64_t)((uintptr_t)p - (uintptr_t)base) * k->div_magic) >> 40;
    unsigned words = keel_class_words(k);
    if (idx < k->count && (KEEL_SLAB_BITS(s, words + idx / 64) >> (idx % 64)) & 1)
      d = (keel_carve_t*)(base + idx * k->size);
  }
  _keel_central_unlock_class(cl);
  *lender = cls;
  return d;
}

/* Index of block p in carved hole d, or -1 if p is not the start of one of its blocks. */
static long carved_index(const keel_carve_t* d, const void* p) {
  size_t size = _keel_classes[d->cls].size;
  uintptr_t first = (uintptr_t)d + CARVE_HEADER;
  if ((uintptr_t)p < first || ((uintptr_t)p - first) % size != 0) return -1;
  size_t i = ((uintptr_t)p - first) / size;
  return i < d->count ? (long)i : -1;
}

/* Hole d's last block came back: the hole goes back to its class. */
static void carve_release(keel_carve_t* d) {
  keel_slab_t* s = keel_span_of(d);
  unsigned lender = s->cls;
  const keel_class_t* k = &_keel_classes[lender];
  keel_central_t* cl = keel_central_of(lender);
  _keel_central_lock_class(cl);
  char* base = (char*)slab_base(keel_chunk_of(s), s);
  size_t idx = (size_t)((char*)d - base) / k->size;
  KEEL_SLAB_BITS(s, keel_class_words(k) + idx / 64) &= ~((uint64_t)1 << (idx % 64));
  if (--s->carved == 0) _keel_pagemap_set((uintptr_t)base, s->units, (uint8_t)lender);
  cl->carved_from--;
  __atomic_sub_fetch(&carved_holes, 1, __ATOMIC_RELAXED);
  keel_link_set(d, NULL);
  _keel_slab_put(cl, lender, d);
  _keel_central_unlock_class(cl);
}

unsigned _keel_central_carved_free(void* p, const char* call) {
  unsigned lender;
  keel_carve_t* d = carved_hole_of(p, &lender);
  if (d == NULL) return lender;
  unsigned cls = d->cls;
  keel_central_t* cl = keel_central_of(cls);
  _keel_central_lock_class(cl);
  long i = carved_index(d, p);
  if (i < 0) {
    _keel_central_unlock_class(cl);
    _keel_misuse(call, "invalid pointer", p, ": not the start of a block", _keel_classes[cls].size);
  }
  uint64_t bit = (uint64_t)1 << i;
  if (d->free & bit) {
    _keel_central_unlock_class(cl);
    _keel_misuse(call, "double free of pointer", p, NULL, _keel_classes[cls].size);
  }
  d->free |= bit;
  /* As on every free block: once the hole has gone back to its slab, a second free of
   * p finds the key there and is reported as a double free (free_slow). */
  ((uintptr_t*)p)[1] = _keel_free_key;
  __atomic_store_n(&cl->carved_blocks, cl->carved_blocks - 1, __ATOMIC_RELAXED);
  bool empty = --d->used == 0;
  if (empty && d->listed) carve_list_remove(cls, d);
  else if (!empty && !d->listed) carve_list_push(cls, d);
  _keel_central_unlock_class(cl);
  if (empty) carve_release(d);
  return 0;
}

size_t _keel_central_carved_size(const void* p, const char* call) {
  unsigned lender;
  keel_carve_t* d = carved_hole_of(p, &lender);
  unsigned cls = d != NULL ? d->cls : lender;
  bool exact = true;
  if (d == NULL) _keel_block_start(lender, p, &exact); /* one of the slab's own blocks */
  if (!exact || (d != NULL && carved_index(d, p) < 0))
    _keel_misuse(call, "invalid pointer", p, ": not the start of a block", _keel_classes[cls].size);
  return _keel_classes[cls].size;
}

KEEL_COLD bool _keel_central_verify_carved(unsigned cls) {
  for (keel_carve_t* d = keel_central_of(cls)->carve_partial; d != NULL; d = d->next) {
    if (d->cls != cls || !d->listed || d->free == 0 || d->count < CARVE_MIN || d->count > CARVE_MAX ||
        d->used + (unsigned)__builtin_popcountll(d->free) != d->count)
      return false;
    keel_slab_t* s = keel_span_of(d);
    if (s->state != KEEL_UNIT_SLAB || s->carved == 0 || keel_pagemap_get(d) != KEEL_KIND_CARVED) return false;
  }
  return true;
}

uint64_t _keel_central_carved_holes(void) { return __atomic_load_n(&carved_holes, __ATOMIC_RELAXED); }

uint64_t _keel_central_borrowed_blocks(void) { return __atomic_load_n(&borrowed_blocks, __ATOMIC_RELAXED); }
