/* verify.c -- the expensive invariant walk (KEEL_DEBUG >= 2, and tests): every chunk,
 * slab, transfer batch and the calling thread's cache are checked against each other.
 * Stops the process with the first broken invariant. Takes the locks in the global
 * order, so it may run while other threads allocate. */
#include "core/internal.h"

#define VERIFY(cond) ((cond) ? (void)0 : _keel_fatal_internal(__FILE__, __LINE__, "invariant: " #cond))

keel_chunk_t* _keel_pageheap_first_chunk(unsigned run);

/* Blocks out of the slabs of each class, by home line. */
static uint64_t used_by_line[KEEL_NUM_CLASSES][KEEL_TRANSFER_LINES];

static void verify_slab(keel_chunk_t* c, unsigned k, keel_slab_t* s) {
  unsigned cls = s->cls;
  VERIFY(cls >= 1 && cls < KEEL_NUM_CLASSES);
  const keel_class_t* kc = &_keel_classes[cls];
  VERIFY(s->units == kc->units);
  uint32_t free_blocks = 0;
  unsigned words = keel_class_words(kc);
  VERIFY(s->ready <= words && s->scan <= s->ready);
  for (unsigned w = 0; w < words; w++) {
    free_blocks += (uint32_t)__builtin_popcountll(keel_slab_word(s, kc->count, w));
    if (w < s->scan) VERIFY(keel_slab_word(s, kc->count, w) == 0);
  }
  if (kc->count % 64) VERIFY((keel_slab_word(s, kc->count, words - 1) >> (kc->count % 64)) == 0);
  VERIFY(free_blocks + s->used == kc->count);
  VERIFY(s->in_partial == (s->used < kc->count) || s->used == 0);
  uint32_t carved = 0; /* the carved-hole bitmap follows the free one (borrow.c) */
  for (unsigned w = 0; s->carved > 0 && w < words; w++)
    carved += (uint32_t)__builtin_popcountll(KEEL_SLAB_BITS(s, words + w));
  VERIFY(carved == s->carved && !(s->carved && s->sampled));
  for (unsigned u = 0; u < s->units; u++) {
    VERIFY(c->units[k + u].head == k);
    VERIFY(keel_pagemap_get(keel_unit_addr(c, k + u)) ==
           (s->sampled ? KEEL_KIND_SAMPLED : s->carved ? KEEL_KIND_CARVED : cls));
  }
  /* A slab's line is one whose lock makes up the class's (central.c); a sample slab's is 0. */
  VERIFY(s->home < KEEL_TRANSFER_LINES && (keel_central_lines(keel_central_of(cls)) >> s->home & 1) && !(s->sampled && s->home));
  used_by_line[cls][s->home] += s->used;
}

/* The class of a cached block from its page-map tag: a slab with carved holes keeps
 * its own blocks (never the carved ones) in caches. */
static unsigned tag_class(const void* q) {
  uint8_t tag = keel_pagemap_get(q);
  if (tag != KEEL_KIND_CARVED) return tag;
  keel_slab_t* s = keel_span_head(keel_chunk_of(q), keel_unit_index(q));
  return s->carved > 0 ? s->cls : 0;
}

/* A parked list: n blocks of the class, each tagged as parked. */
static void verify_parked(void* list, uint32_t n, void* ctx) {
  unsigned cls = *(unsigned*)ctx;
  uint32_t got = 0;
  for (void* q = list; q != NULL; q = keel_link_next(q, cls), got++) VERIFY(tag_class(q) == cls);
  VERIFY(got == n && (n == _keel_classes[cls].batch || n == _keel_classes[cls].batch / 2));
}

void _keel_verify(void) {
  keel_ensure_init();
  _keel_central_lock_all();
  _keel_pageheap_lock_all();
  memset(used_by_line, 0, sizeof used_by_line);
  for (unsigned r = 0; r < KEEL_CHUNK_UNITS; r++) {
    for (keel_chunk_t* c = _keel_pageheap_first_chunk(r); c != NULL; c = c->next) {
      VERIFY(c->magic == KEEL_CHUNK_MAGIC);
      VERIFY(c->run == r);
      VERIFY((c->free_mask & 1) == 0);
      VERIFY((c->dirty_mask & ~c->free_mask) == 0);
      /* A collapsed huge page is resident whole: none of its free units may be clean. */
      VERIFY((c->promoted_mask & c->free_mask & ~c->dirty_mask) == 0);
      uint64_t rows[2] = {0, 0}; /* the rows of free_rest the chunk's slabs hold */
      for (unsigned k = 1; k < KEEL_CHUNK_UNITS;) {
        keel_slab_t* s = &c->units[k];
        if ((c->free_mask >> k) & 1) {
          VERIFY(s->state == KEEL_UNIT_FREE || s->state == 0);
          uint8_t tag = keel_pagemap_get(keel_unit_addr(c, k));
          VERIFY(tag == KEEL_KIND_NONE || tag == KEEL_KIND_FREED);
          k++;
          continue;
        }
        VERIFY(s->head == k && s->units >= 1 && k + s->units <= KEEL_CHUNK_UNITS);
        if (s->state == KEEL_UNIT_SLAB) {
          verify_slab(c, k, s);
          /* No rows: nothing written past the first word, or full (all words zero). */
          VERIFY(s->row <= KEEL_CHUNK_ROWS &&
                 (s->row != 0 || (s->carved == 0 && (s->ready <= 1 || s->used == _keel_classes[s->cls].count))));
          if (s->row != 0) {
            const keel_class_t* k = &_keel_classes[s->cls];
            unsigned r = (unsigned)s->row - 1;
            uint64_t bits = keel_rows_bits(k, r);
            VERIFY((keel_class_rows(k) == 1 || r % 2 == 0) && (rows[r / 64] & bits) == 0);
            rows[r / 64] |= bits;
          }
        } else {
          VERIFY(s->state == KEEL_UNIT_LARGE);
          /* Large blocks set their page-map tag outside the page-heap lock, so a block
           * being handed out or freed right now may still read NONE or FREED. */
          uint8_t tag = keel_pagemap_get(keel_unit_addr(c, k));
          VERIFY(tag == KEEL_KIND_LARGE || tag == KEEL_KIND_NONE || tag == KEEL_KIND_FREED);
          VERIFY(s->size == (uint64_t)s->units << KEEL_UNIT_SHIFT);
        }
        k += s->units;
      }
      VERIFY(rows[0] == c->rows_used[0] && rows[1] == c->rows_used[1]);
    }
  }
  /* Slot 0 is what inactive classes read (central.c): nothing may have written it. */
  for (size_t i = 0; i < sizeof(keel_central_t); i++) VERIFY(((const uint8_t*)&_keel_central_slots[0])[i] == 0);
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    keel_central_t* cl = keel_central_of(cls);
    const keel_class_t* kc = &_keel_classes[cls];
    for (unsigned line = 0; line < KEEL_TRANSFER_LINES; line++)
      VERIFY(used_by_line[cls][line] == ((keel_central_lines(cl) >> line & 1) ? _keel_central_home(cl, line)->out : 0));
    unsigned check_cls = cls;
    _keel_transfer_each(cls, verify_parked, &check_cls);
    keel_slab_t* cursor = cl->lend_cursor;
    bool cursor_found = cursor == NULL;
    for (unsigned line = 0; line < KEEL_TRANSFER_LINES; line++)
      VERIFY(((cl->partial_lines >> line) & 1) == (_keel_partial_head(cl, line) != NULL));
    for (keel_slab_t* s = _keel_partial_first(cl); s != NULL; s = _keel_partial_next(cl, s)) {
      VERIFY(s->state == KEEL_UNIT_SLAB && s->cls == cls && s->in_partial && !s->sampled);
      VERIFY(s->next == NULL || s->next->home == s->home);
      VERIFY(s->prev != NULL || _keel_partial_head(cl, s->home) == s);
      VERIFY(s->used < kc->count);
      cursor_found |= s == cursor;
    }
    VERIFY(cursor_found); /* borrowing's cursor is a slab of the partial list */
    VERIFY(_keel_central_verify_carved(cls));
    for (keel_slab_t* s = cl->sampled_partial; s != NULL; s = s->next) {
      VERIFY(s->state == KEEL_UNIT_SLAB && s->cls == cls && s->in_partial && s->sampled);
      VERIFY(s->used < kc->count);
    }
  }
  _keel_mesh_verify();
  _keel_pageheap_unlock_all();
  _keel_central_unlock_all();
  VERIFY(_keel_tcache_counts_agree());
  /* The calling thread's own cache (other threads' caches change under our feet). */
  keel_tcache_t* t = _keel_thread.tc;
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    VERIFY(t->bin[cls].avail <= t->bin[cls].max);
    uint32_t n = 0;
    /* (Blocks refilled from a slab have never been handed out, so they need not
     * carry the free key yet.) */
    for (void* q = t == &_keel_tc_empty ? NULL : keel_bin_first(t, cls); q != NULL; q = keel_link_next(q, cls), n++) {
      VERIFY(tag_class(q) == cls);
      VERIFY(n <= t->bin[cls].max);
    }
    VERIFY(n == (uint32_t)(t->bin[cls].max - t->bin[cls].avail));
  }
}
