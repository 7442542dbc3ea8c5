/* tcache_slots.c -- where thread cache structs live: slots in chunks of their own, so
 * that the pages of caches the purger took back from waiting threads (tcache.c) go back
 * to the OS like any free memory. A struct is 2,112 bytes; in the metadata regions,
 * among other bookkeeping, its pages could never be returned, and at a thousand waiting
 * threads that was 2 KiB each once their free blocks had gone.
 * Every call is made under the registry lock (tcache.c), which fork holds too. */
#include "core/internal.h"

#define CHUNK_SLOTS 128 /* 264 KiB */

typedef struct slot_chunk_s {
  struct slot_chunk_s* next;
  keel_tcache_t* slots;
  uint64_t used[CHUNK_SLOTS / 64]; /* bit set: the slot holds a cache */
} slot_chunk_t;

static slot_chunk_t* chunks;

static bool slot_used(const slot_chunk_t* c, size_t i) { return (c->used[i / 64] >> (i % 64)) & 1; }

keel_tcache_t* _keel_tcache_slot_alloc(void) {
  for (slot_chunk_t* c = chunks; c != NULL; c = c->next)
    for (size_t w = 0; w < CHUNK_SLOTS / 64; w++)
      if (~c->used[w] != 0) {
        size_t bit = (size_t)__builtin_ctzll(~c->used[w]);
        c->used[w] |= (uint64_t)1 << bit;
        return &c->slots[w * 64 + bit]; /* zero, or as its last cache left it */
      }
  slot_chunk_t* c = (slot_chunk_t*)_keel_meta_alloc(sizeof *c);
  keel_tcache_t* slots = c ? (keel_tcache_t*)_keel_meta_alloc_pages(CHUNK_SLOTS * sizeof(keel_tcache_t)) : NULL;
  if (slots == NULL) return NULL; /* (a header without slots is lost: out of memory) */
  c->slots = slots;
  c->used[0] = 1;
  c->next = chunks;
  chunks = c;
  return &slots[0];
}

/* The slot of t, an empty cache nobody refers to any more, is free; each page that no
 * slot in use overlaps goes back to the OS. False if t is not in a slot (the static
 * first cache). */
bool _keel_tcache_slot_free(keel_tcache_t* t) {
  for (slot_chunk_t* c = chunks; c != NULL; c = c->next) {
    uintptr_t base = (uintptr_t)c->slots, at = (uintptr_t)t, size = sizeof(keel_tcache_t);
    if (at < base || at >= base + CHUNK_SLOTS * size) continue;
    size_t i = (at - base) / size;
    c->used[i / 64] &= ~((uint64_t)1 << (i % 64));
    uintptr_t page = _keel_page_size, end = base + CHUNK_SLOTS * size;
    for (uintptr_t p = at & ~(page - 1); p < at + size; p += page) {
      uintptr_t lo = p < base ? base : p, hi = p + page < end ? p + page : end; /* slots' bytes on it */
      bool free = true;
      for (size_t j = (lo - base) / size; j <= (hi - 1 - base) / size && free; j++) free = !slot_used(c, j);
      if (free) _keel_prim_purge((void*)p, page); /* whole pages of the chunk's own mapping */
    }
    return true;
  }
  return false;
}
