/* freelist.h -- the links of Keel's lists of free blocks, and the thread-cache bins.
 *
 * A free block q on a list (a thread-cache bin, a batch in the transfer cache, a list
 * passed between the tiers) holds in its first word the link to the next block, in two
 * layers: the link's form, next XOR a per-process secret (_keel_link_key, from getrandom
 * at start-up; at least two of its low four bits are set), or 0 for the end of the list;
 * and that XOR q, the block's own address (glibc's safe-linking mixes the address in
 * likewise). A bin's head is stored in the link's form without the address (it has no
 * block), so a pop turns the next link into the new head with one XOR of the block's
 * address, and a push stores the head XOR the block's address: malloc decodes one value
 * and mixes one, free encodes one and mixes one.
 *
 * A link an overflow wrote (a plain pointer, or garbage) decodes to an address whose low
 * four bits are the key's - not a block start - unless the writer knew the key's low
 * bits (1 in 11); so does a link, or a list's end, with one of its low four bits flipped
 * (hence at least two key bits: a flipped end decodes to the key with one bit changed).
 * A valid link copied from another block decodes to its target XOR the two blocks'
 * addresses: elsewhere. malloc's fast path tests the low bits where it used to test for
 * NULL (an empty bin decodes to the key itself, so the same test sends it to the slow
 * path), and every slow path that follows a link checks them too and, where it reads the
 * page map anyway, that the block lies in a slab of the list's class. A failed check ends
 * the process with "keel: malloc(): free list of the N-byte class corrupted at 0x...".
 * KEEL_LINK_ENCODING=0 (CMake option KEEL_SAFE_LINKS=OFF) stores plain pointers, for
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

/* The link's form of next (NULL: the end of the list), as a bin's head holds it. */
static inline uintptr_t keel_link_encode(const void* next) {
  return next == NULL ? 0 : (uintptr_t)next ^ keel_link_key();
}

/* The block a link's form leads to, NULL at the end; checked (at: where it was read). */
static inline void* keel_link_decode(uintptr_t form, const char* call, unsigned cls, const void* at) {
  if (form == 0) return NULL;
  uintptr_t p = form ^ keel_link_key();
  if (KEEL_UNLIKELY((p & 15) != 0)) _keel_freelist_corrupt(call, cls, at);
  return (void*)p;
}

/* What block q's first word holds for a link of the given form, and back: the form
 * mixed with q's address. */
static inline uintptr_t keel_link_mix(const void* q, uintptr_t form) {
  return KEEL_LINK_ENCODING ? form ^ (uintptr_t)q : form;
}

/* The block after q on its list (NULL at the end), and setting it. */
static inline void* keel_link_next(const void* q, unsigned cls) {
  return keel_link_decode(keel_link_mix(q, *(const uintptr_t*)q), "malloc", cls, q);
}
static inline void keel_link_set(void* q, const void* next) {
  *(uintptr_t*)q = keel_link_mix(q, keel_link_encode(next));
}

/* The last block of a list of n >= 1 blocks from list (n is at most its length). */
static inline void* keel_list_nth_tail(void* list, uint32_t n, unsigned cls) {
  void* last = list;
  for (uint32_t i = 1; i < n; i++) last = keel_link_next(last, cls);
  return last;
}

/* Whether a decoded bin head is a block (not the empty bin's key, nor a corrupt link):
 * the fast path's one test. Without encoding, an empty bin is NULL. */
static inline bool keel_bin_head_ok(uintptr_t first) {
  return KEEL_LINK_ENCODING ? (first & 15) == 0 : first != 0;
}

/* ---- bins: t->head[cls] holds the stored form of the first block's address ---------- */
static inline bool keel_bin_empty(const keel_tcache_t* t, unsigned cls) { return t->head[cls] == 0; }
static inline void* keel_bin_first(const keel_tcache_t* t, unsigned cls) {
  return keel_link_decode(t->head[cls], "malloc", cls, &t->head[cls]);
}
static inline void keel_bin_set_first(keel_tcache_t* t, unsigned cls, const void* p) {
  t->head[cls] = keel_link_encode(p);
}
/* Pushes block p (whose room the caller has taken) and marks it free. */
static inline void keel_bin_push(keel_tcache_t* t, unsigned cls, void* p) {
  ((uintptr_t*)p)[0] = keel_link_mix(p, t->head[cls]);
  ((uintptr_t*)p)[1] = _keel_free_key;
  t->head[cls] = (uintptr_t)p ^ keel_link_key();
}
/* Pops the first block of a bin that is not empty, without counting it, and clears its
 * free key (it is handed out). */
static inline void* keel_bin_pop_block(keel_tcache_t* t, unsigned cls) {
  void** p = (void**)keel_bin_first(t, cls);
  t->head[cls] = keel_link_mix(p, ((uintptr_t*)p)[0]);
  p[1] = NULL;
  return p;
}
/* Takes the first n blocks of a bin holding at least n: a NULL-terminated list. */
static inline void* keel_bin_cut(keel_tcache_t* t, unsigned cls, uint32_t n) {
  void* list = keel_bin_first(t, cls);
  void* last = keel_list_nth_tail(list, n, cls);
  t->head[cls] = keel_link_mix(last, *(uintptr_t*)last);
  keel_link_set(last, NULL);
  return list;
}

#endif /* KEEL_FREELIST_H */
