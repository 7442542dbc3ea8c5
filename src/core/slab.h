/* slab.h -- what the three files of the central lists share, and no one else includes:
 * central.c (the shared free lists: slabs, and batches taken from and put back to them),
 * borrow.c (holes of a larger class lent or carved for a smaller one) and slab_trim.c
 * (free pages inside slabs returned to the OS; the purger's pass over the lists).
 *
 * The helpers of a take or a put of a batch stay static in central.c, where they are
 * inlined; the other two files get from it only what their cold paths need, as calls. */
#ifndef KEEL_SLAB_H
#define KEEL_SLAB_H

#include "core/internal.h"

static inline void* slab_base(keel_chunk_t* c, keel_slab_t* head) {
  return keel_unit_addr(c, (unsigned)(head - c->units));
}

/* Line share h's count of blocks out changes (its lock held): a relaxed store, as it is
 * read without the lock (summed, _keel_central_out). */
static inline void home_out_add(keel_home_t* h, int64_t n) {
  __atomic_store_n(&h->out, h->out + (uint64_t)n, __ATOMIC_RELAXED);
}

/* Takes the class lock of cls (every line's), activating the class first if needed. No
 * Keel lock may be held (activate_lock comes before the central locks in the fork
 * handlers' order). */
static inline keel_central_t* lock_class(unsigned cls) {
  keel_central_t* cl = KEEL_UNLIKELY(!_keel_central_active(cls)) ? _keel_central_activate(cls) : keel_central_of(cls);
  _keel_central_lock_class(cl);
  return cl;
}

/* central.c, the class's lock held. */
/* Slab s gets its rows of its chunk's free_rest (chunk.h) if it has none. */
void _keel_slab_rows_take(keel_slab_t* s, const keel_class_t* k) KEEL_INTERNAL;
/* Slab s handed out its last free block: it leaves the partial list. */
void _keel_slab_became_full(keel_central_t* cl, keel_slab_t* s, const keel_class_t* k) KEEL_INTERNAL;
/* Block p of class cls goes back to its slab (a stop if it is not out of it). The pages
 * it leaves free wait for the purger's trim even in a cold class: a carved hole coming
 * back (borrow.c) keeps the free keys of the blocks freed in it for the purge delay, so
 * freeing one of them again is still named a double free, not taken for a block of the
 * lender's. */
void _keel_slab_put(keel_central_t* cl, unsigned cls, void* p) KEEL_INTERNAL;
/* Every block of a list of class cls goes back to its slab. */
void _keel_slab_put_list(keel_central_t* cl, unsigned cls, void* list) KEEL_INTERNAL;
/* Slab s of the partial list, if it is empty and may go, goes back to the page heap;
 * returns whether it went. */
bool _keel_slab_release_empty(keel_central_t* cl, unsigned cls, keel_slab_t* s) KEEL_INTERNAL;

/* slab_trim.c. */
/* A class that has taken nothing from its slabs for this many purger ticks is cold: its
 * frees purge the pages they empty, and it may lend its holes. 0 until the purger runs. */
extern uint32_t _keel_cold_ticks KEEL_INTERNAL;
/* True if the OS page at offset off of slab s holds free blocks only, or only the slab's
 * unused tail. */
bool _keel_slab_page_free(const keel_slab_t* s, const keel_class_t* k, size_t off) KEEL_INTERNAL;
/* Lock held, in a cold class: the blocks of mask (bits of bitmap word w of slab s, which
 * still holds live blocks) just came back; purges the pages they leave free, if s may be
 * purged. */
void _keel_slab_purge_freed(const keel_class_t* k, keel_slab_t* s, unsigned w, uint64_t mask) KEEL_INTERNAL;
/* Blocks of this many OS pages and more are big: a free one leaves at least three pages
 * to give back whatever its neighbours hold. */
#define KEEL_BIG_BLOCK_PAGES 4
static inline bool keel_class_big(const keel_class_t* k) {
  return k->size >= KEEL_BIG_BLOCK_PAGES * _keel_page_size;
}
/* Lock held: a block came back to slab s of a big class; trims s unless a free did in
 * the last 16 ms. */
void _keel_slab_trim_on_free(unsigned cls, keel_slab_t* s) KEEL_INTERNAL;

#endif /* KEEL_SLAB_H */
