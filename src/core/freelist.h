/* freelist.h -- the links of Keel's lists of free blocks, and the thread-cache bins.
 *
 * A free block q on a list (a thread-cache bin, a batch in the transfer cache, a list
 * passed between the tiers) holds in its first word the next block's address XOR a
 * per-process secret (_keel_link_key, from getrandom at start-up; at least two of its
 * low four bits are set) XOR q's own address (glibc's safe-linking mixes the address in
 * likewise). The end of a list is the value KEEL_LINK_END (3: misaligned) in place of
 * the next address. A bin's head, which lives in the thread cache and not in a block,
 * holds its first block's address plainly, or KEEL_LINK_END when empty (glibc keeps its
 * tcache heads plain too). So a pop loads the head, and the next head is the block's
 * word XOR (block ^ key), which the processor computes while the word loads; a push
 * stores the head XOR (block ^ key) into the block.
 *
 * A link an overflow wrote (a plain pointer, or garbage) decodes to an address whose low
 * four bits are the key's - not a block start - unless the writer knew the key's low
 * bits (1 in 11); so does a link with one of its low four bits flipped, and a flipped
 * end decodes to 3 with one bit changed (never 0). A valid link copied into another free
 * block decodes to its target XOR the two blocks' addresses, not to the block it named
 * (though within a slab possibly to another of its blocks). malloc's fast
 * path tests the head's low bits where it used to test for NULL (an empty bin holds
 * KEEL_LINK_END, so the same test sends it to the slow path), and every slow path that
 * follows a link checks them too and, where it reads the page map anyway, that the block
 * lies in a slab of the list's class. A failed check ends the process with "keel:
 * malloc(): free list of the N-byte class corrupted at 0x...". KEEL_LINK_ENCODING=0
 * (CMake option KEEL_SAFE_LINKS=OFF) stores plain pointers and NULL ends, for
 * comparisons. */
#ifndef KEEL_FREELIST_H
#define KEEL_FREELIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "core/tcache.h"

#ifndef KEEL_LINK_ENCODING
#define KEEL_LINK_ENCODING 1
#endif

extern uintptr_t _keel_link_key KEEL_INTERNAL;

/* A link that decodes to no block start: reports which list and where, and ends the
 * process. */
_Noreturn void _keel_freelist_corrupt(const char* call, unsigned cls, const void* at) KEEL_INTERNAL KEEL_COLD;

static inline uintptr_t keel_link_key(void) { return KEEL_LINK_ENCODING ? _keel_link_key : 0; }

/* The decoded value of a list's end and the head of an empty bin: misaligned, so the
 * fast path's alignment test finds it, with two low bits set, so no single flipped bit
 * makes it a block address. */
#define KEEL_LINK_END ((uintptr_t)(KEEL_LINK_ENCODING ? 3 : 0))

/* What block q's first word holds for a link to address `to` (a block or KEEL_LINK_END,
 * as a bin's head holds them), and for a link to next (NULL: the end of the list); the
 * first with the key given (a loop that stores through blocks reads it once). Decoding
 * is the same XOR. */
static inline uintptr_t keel_link_encode(uintptr_t key, uintptr_t q, uintptr_t to) {
  return KEEL_LINK_ENCODING ? to ^ key ^ q : to;
}
static inline uintptr_t keel_link_word_to(const void* q, uintptr_t to) {
  return keel_link_encode(keel_link_key(), (uintptr_t)q, to);
}
static inline uintptr_t keel_link_word(const void* q, const void* next) {
  return keel_link_word_to(q, next == NULL ? KEEL_LINK_END : (uintptr_t)next);
}
static inline uintptr_t keel_head_of(const void* first) {
  return first == NULL ? KEEL_LINK_END : (uintptr_t)first;
}

/* A decoded link or a bin's head as a block, NULL at the end; checked (at: where it was
 * read). */
static inline void* keel_link_checked(uintptr_t to, const char* call, unsigned cls, const void* at) {
  if (to == KEEL_LINK_END) return NULL;
  if (KEEL_LINK_ENCODING && KEEL_UNLIKELY((to & 15) != 0)) _keel_freelist_corrupt(call, cls, at);
  return (void*)to;
}

/* The address block q's first word links to, undecoded: no check. */
static inline uintptr_t keel_link_raw_next(const void* q) {
  uintptr_t w = *(const uintptr_t*)q;
  return KEEL_LINK_ENCODING ? w ^ keel_link_key() ^ (uintptr_t)q : w;
}

/* The block after q on its list (NULL at the end), and setting it. */
static inline void* keel_link_next(const void* q, unsigned cls) {
  return keel_link_checked(keel_link_raw_next(q), "malloc", cls, q);
}
static inline void keel_link_set(void* q, const void* next) { *(uintptr_t*)q = keel_link_word(q, next); }

/* The last block of a list of n >= 1 blocks from list (n is at most its length). */
static inline void* keel_list_nth_tail(void* list, uint32_t n, unsigned cls) {
  void* last = list;
  for (uint32_t i = 1; i < n; i++) last = keel_link_next(last, cls);
  return last;
}

/* ---- a batch's index ------------------------------------------------------------------
 * A batch parked by one thread is usually taken by a thread on another core, where each
 * of its blocks is a cache miss, and following the links meets them one after another:
 * one per malloc. So a batch parked whole carries its blocks' addresses in the words
 * after the link and the free key of its first blocks, as a tree in which block j
 * (in list order) names blocks 1 + j*f .. j*f + f; a taker reads it to prefetch every
 * block at once. Each word is encoded like a link, with the word's own address mixed
 * in. Blocks under 32 bytes have no word to spare (f = 0). */
#define KEEL_INDEX_FANOUT 8u /* most addresses one block holds */
static inline unsigned keel_index_fanout(size_t size) {
  size_t f = size / sizeof(uintptr_t) - 2;
  return size < 4 * sizeof(uintptr_t) ? 0u : f < KEEL_INDEX_FANOUT ? (unsigned)f : KEEL_INDEX_FANOUT;
}
static inline void keel_index_set(void* q, unsigned i, const void* to) {
  uintptr_t* w = (uintptr_t*)q + 2 + i;
  *w = keel_link_word_to(w, (uintptr_t)to);
}
/* Entry i of block q's index, or NULL where it does not decode to a block start. */
static inline void* keel_index_get(const void* q, unsigned i) {
  const uintptr_t* w = (const uintptr_t*)q + 2 + i;
  uintptr_t to = keel_link_word_to(w, *w);
  return (to & 15) == 0 && to != 0 ? (void*)to : NULL;
}

/* Whether a bin's head is a block (not KEEL_LINK_END, nor a corrupt link): the fast
 * path's one test. */
static inline bool keel_bin_head_ok(uintptr_t first) {
  return KEEL_LINK_ENCODING ? (first & 15) == 0 : first != 0;
}

/* ---- bins: t->head[cls] holds the first block's address, KEEL_LINK_END when empty ---- */
static inline bool keel_bin_empty(const keel_tcache_t* t, unsigned cls) { return t->head[cls] == KEEL_LINK_END; }
static inline void* keel_bin_first(const keel_tcache_t* t, unsigned cls) {
  return keel_link_checked(t->head[cls], "malloc", cls, &t->head[cls]);
}
static inline void keel_bin_set_first(keel_tcache_t* t, unsigned cls, const void* p) {
  t->head[cls] = keel_head_of(p);
}
/* Pushes block p (whose room the caller has taken) and marks it free. */
static inline void keel_bin_push(keel_tcache_t* t, unsigned cls, void* p) {
  ((uintptr_t*)p)[0] = keel_link_word_to(p, t->head[cls]);
  ((uintptr_t*)p)[1] = _keel_free_key;
  t->head[cls] = (uintptr_t)p;
}
/* Pops the first block of a bin that is not empty, without counting it, and clears its
 * free key (it is handed out). */
static inline void* keel_bin_pop_block(keel_tcache_t* t, unsigned cls) {
  void** p = (void**)keel_bin_first(t, cls);
  t->head[cls] = keel_link_raw_next(p);
  p[1] = NULL;
  return p;
}
/* Takes the first n blocks of a bin holding at least n: a NULL-terminated list. */
static inline void* keel_bin_cut(keel_tcache_t* t, unsigned cls, uint32_t n) {
  void* list = keel_bin_first(t, cls);
  void* last = keel_list_nth_tail(list, n, cls);
  t->head[cls] = keel_link_raw_next(last);
  keel_link_set(last, NULL);
  return list;
}

/* A block freed past the thread caches, one at a time: it ends its list and carries the
 * free key (so freeing it again is named a double free). Returns p, a list of one. */
static inline void* keel_freed_one(void* p) {
  keel_link_set(p, NULL);
  ((uintptr_t*)p)[1] = _keel_free_key;
  return p;
}

#endif /* KEEL_FREELIST_H */
