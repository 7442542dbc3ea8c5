/* large.c -- blocks above the largest size class and up to KEEL_LARGE_MAX: a span of
 * whole units in a chunk, freed straight back to the page heap (which keeps the units
 * committed for the purge delay, so large-block churn costs no system call). */
#include "core/internal.h"

static uint64_t large_live_bytes;

static size_t units_for(size_t size) { return (size + KEEL_UNIT_SIZE - 1) >> KEEL_UNIT_SHIFT; }

void* _keel_large_alloc(size_t size, size_t align, bool zero) {
  size_t n = units_for(size);
  size_t align_units = align > KEEL_UNIT_SIZE ? align >> KEEL_UNIT_SHIFT : 1;
  bool zeroed;
  keel_slab_t* head = _keel_pageheap_alloc(n, align_units, &zeroed);
  if (head == NULL) {
    _keel_prim_set_errno(_keel_prim_errno_enomem());
    return NULL;
  }
  keel_chunk_t* c = keel_chunk_of(head);
  void* p = keel_unit_addr(c, (unsigned)(head - c->units));
  head->state = KEEL_UNIT_LARGE; /* the page heap set head->size, under its lock */
  if (!_keel_pagemap_set((uintptr_t)p + KEEL_UNIT_SIZE, n - 1, KEEL_KIND_NONE) ||
      !_keel_pagemap_set((uintptr_t)p, 1, KEEL_KIND_LARGE)) {
    _keel_pageheap_free(head);
    _keel_prim_set_errno(_keel_prim_errno_enomem());
    return NULL;
  }
  __atomic_fetch_add(&large_live_bytes, head->size, __ATOMIC_RELAXED);
  if (zero && !zeroed) memset(p, 0, size);
  /* Dirty units may hold a freed slab block's free key where this block's second word
   * is: a realloc to a small size would copy it into a live block, whose free would then
   * be taken for a double free. */
  else if (!zeroed) ((uintptr_t*)p)[1] = 0;
  return p;
}

/* The head of the live large block that starts at p, or NULL. */
static keel_slab_t* large_head(const void* p) {
  if (((uintptr_t)p & (KEEL_UNIT_SIZE - 1)) != 0) return NULL;
  keel_chunk_t* c = keel_chunk_of(p);
  unsigned k = keel_unit_index(p);
  keel_slab_t* head = &c->units[k];
  if (k == 0 || head->state != KEEL_UNIT_LARGE || head->head != k) return NULL;
  return head;
}

void _keel_large_free(void* p, const char* call) {
  keel_slab_t* head = large_head(p);
  if (head == NULL) _keel_misuse(call, "invalid pointer", p, ": not allocated by keel", 0);
  __atomic_fetch_sub(&large_live_bytes, head->size, __ATOMIC_RELAXED);
  _keel_pagemap_set((uintptr_t)p, 1, KEEL_KIND_FREED);
  _keel_pageheap_free(head);
}

size_t _keel_large_usable(const void* p) {
  keel_slab_t* head = large_head(p);
  return head ? head->size : 0;
}

void* _keel_large_realloc(void* p, size_t size) {
  keel_slab_t* head = large_head(p);
  if (head == NULL) _keel_misuse("realloc", "invalid pointer", p, ": not allocated by keel", 0);
  if (size > KEEL_LARGE_MAX || size <= KEEL_CLASS_MAX) return NULL;
  size_t n = units_for(size), old = head->units;
  uint64_t old_bytes = head->size;
  if (n == old) return p;
  if (n < old) {
    _keel_pageheap_shrink(head, n); /* both set head->size, under the page heap's lock */
  } else if (!_keel_pageheap_grow_in_place(head, n)) {
    return NULL;
  } else {
    /* Units a freed large block's head left tagged FREED: an interior pointer there is
     * not a double free. */
    _keel_pagemap_set((uintptr_t)p + old * KEEL_UNIT_SIZE, n - old, KEEL_KIND_NONE);
  }
  __atomic_fetch_sub(&large_live_bytes, old_bytes, __ATOMIC_RELAXED);
  __atomic_fetch_add(&large_live_bytes, head->size, __ATOMIC_RELAXED);
  return p;
}

uint64_t _keel_large_live_bytes(void) { return __atomic_load_n(&large_live_bytes, __ATOMIC_RELAXED); }
