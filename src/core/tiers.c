/* tiers.c -- which tier serves a request: a size class (thread cache or, for the
 * checked mode and cacheless threads, the central list), a large span, or a huge
 * mapping. The malloc/free fast paths in api/malloc.c bypass this for small sizes. */
#include "core/internal.h"

static void* enomem(void) {
  _keel_prim_set_errno(_keel_prim_errno_enomem());
  return NULL;
}

/* A block of class cls from the central list, skipping the thread cache. */
void* _keel_alloc_direct(unsigned cls) {
  uint32_t got;
  void** p = (void**)_keel_central_take(cls, 1, &got);
  if (p == NULL) return enomem();
  /* Word 1 is the free key; in checked mode, the poison mark the caller checks first. */
  if (!_keel_options.check) p[1] = NULL;
  return p;
}

/* may_borrow: the block may be of a larger class (borrow.c); false for
 * aligned requests, whose class was chosen for its blocks' alignment. */
static inline void* alloc_class(unsigned cls, size_t n, bool via_cache, bool may_borrow) {
  if (!via_cache) return _keel_alloc_direct(cls);
  keel_tcache_t* t = keel_tc_enter();
  void* p;
  if (KEEL_LIKELY(!keel_bin_empty(t, cls))) {
    p = keel_bin_pop_block(t, cls);
    if (KEEL_UNLIKELY(!keel_bin_count_pop(&t->bin[cls]))) p = _keel_profile_countdown_expired(t, cls, p, n);
  } else {
    p = _keel_tcache_alloc_slow(t, cls, may_borrow ? n : 0);
    if (p != NULL && t != &_keel_tc_empty && KEEL_UNLIKELY(!keel_bin_count_sample_only(&t->bin[cls])))
      p = _keel_profile_countdown_expired(t, cls, p, n);
  }
  keel_tc_leave();
  return p;
}

/* The tier a request of n bytes aligned to align goes to, and for the small tier its class:
 * the one choice that _keel_alloc_any acts on and _keel_usable_for reports. Small classes
 * whose size is a multiple of the alignment hold only aligned blocks (slabs start on
 * 64 KiB boundaries). n is at least 1. */
static inline int choose_tier(size_t n, size_t align, unsigned* cls) {
  if (n > KEEL_MAX_ALLOC) return TIER_NONE;
  if (align <= 16) {
    if (n <= KEEL_CLASS_MAX) {
      *cls = keel_size_class(n);
      return TIER_SMALL;
    }
    return n <= KEEL_LARGE_MAX ? TIER_LARGE : TIER_HUGE;
  }
  size_t rounded = (n + align - 1) & ~(align - 1); /* no overflow: n < 2^63, align <= 2^62 */
  if (align <= KEEL_UNIT_SIZE && rounded <= KEEL_CLASS_MAX) {
    unsigned c = keel_size_class(rounded);
    while (c < KEEL_NUM_CLASSES && _keel_classes[c].size % align != 0) c++;
    if (c < KEEL_NUM_CLASSES) {
      *cls = c;
      return TIER_SMALL;
    }
  }
  return n <= KEEL_LARGE_MAX && align <= KEEL_CHUNK_SIZE / 2 ? TIER_LARGE : TIER_HUGE;
}

/* A large block spans more than the small classes' range (an aligned request of a small
 * size that no small class could align lands here too). */
static inline size_t large_bytes(size_t n) { return n > KEEL_CLASS_MAX ? n : KEEL_CLASS_MAX + 1; }

/* The small tier: a block of class cls for n bytes, zeroed if asked. */
static inline void* alloc_small_tier(unsigned cls, size_t n, bool zero, bool via_cache, bool may_borrow) {
  void* p = alloc_class(cls, n, via_cache, may_borrow);
  if (zero && p) memset(p, 0, n);
  return p;
}

void* _keel_alloc_small(size_t n, bool zero) { return alloc_small_tier(keel_size_class(n), n, zero, true, true); }

void* _keel_alloc_any(size_t n, size_t align, bool zero, bool via_cache) {
  keel_ensure_init();
  if (n == 0) n = 1;
  unsigned cls = 0;
  int tier = choose_tier(n, align, &cls);
  if (tier == TIER_SMALL) return alloc_small_tier(cls, n, zero, via_cache, align <= 16);
  if (tier == TIER_NONE) return enomem();
  void* p = tier == TIER_LARGE ? _keel_large_alloc(large_bytes(n), align <= 16 ? 0 : align, zero)
                               : _keel_huge_alloc(n, align <= 16 ? 0 : align, zero);
  if (KEEL_UNLIKELY(_keel_profiling) && p) _keel_profile_sample_big(p, n);
  return p;
}

/* Block p of a slab of class cls, checked: the start of a block, and not a free one (its
 * second word holds the free key, tcache.h). realloc would otherwise hand back a block
 * that overlaps its neighbour, or one that is on a free list. */
static KEEL_NOINLINE size_t slab_block_usable(unsigned cls, const void* p, const char* call) {
  size_t size = _keel_classes[cls].size;
  bool exact;
  _keel_block_start(cls, p, &exact);
  if (!exact) _keel_misuse(call, "invalid pointer", p, ": not the start of a block", size);
  if (((const uintptr_t*)p)[1] == _keel_free_key) _keel_misuse(call, "use of freed pointer", p, NULL, size);
  return size;
}

size_t _keel_usable_size(const void* p, const char* call) {
  uint8_t kind = keel_pagemap_get(p);
  if (kind >= 1 && kind < KEEL_NUM_CLASSES) return slab_block_usable(kind, p, call);
  if (kind == KEEL_KIND_CARVED) {
    size_t size = _keel_central_carved_size(p, call); /* checks a carved block's start */
    if (((const uintptr_t*)p)[1] == _keel_free_key) _keel_misuse(call, "use of freed pointer", p, NULL, size);
    return size;
  }
  unsigned sampled = keel_sampled_class(p, kind);
  if (sampled) return slab_block_usable(sampled, p, call);
  size_t n = 0;
  if (kind == KEEL_KIND_LARGE) n = _keel_large_usable(p);
  else if (kind == KEEL_KIND_HUGE) n = _keel_huge_usable(p);
  if (n == 0) {
    if (kind == KEEL_KIND_FREED) _keel_misuse(call, "use of freed pointer", p, NULL, 0);
    _keel_misuse(call, "invalid pointer", p, ": not allocated by keel", 0);
  }
  return n;
}

/* A large block grows or shrinks in place (whole units, n within the large tier); a huge
 * one, asked for more than the large tier holds, is resized through its mapping and may
 * move. Either way its heap-profile record goes (it names the old size, perhaps the old
 * address) and the block is sampled afresh, as a new one of n bytes. One function for
 * realloc and rallocx, so the two cannot drift apart. */
void* _keel_realloc_big(void* p, uint8_t kind, size_t n, bool zero) {
  void* q = NULL;
  if (kind == KEEL_KIND_LARGE) {
    if (_keel_profiling) _keel_profile_forget(p);
    q = _keel_large_realloc(p, n);
  } else if (kind == KEEL_KIND_HUGE && n > KEEL_LARGE_MAX) {
    if (_keel_profiling) _keel_profile_forget(p);
    q = _keel_huge_realloc(p, n, zero);
  }
  if (q != NULL && _keel_profiling) _keel_profile_sample_big(q, n);
  return q;
}

static size_t keel_round_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

/* The usable size of the block _keel_alloc_any(n, align, ...) hands out, computed without
 * allocating, and its tier; 0 if the request can never succeed (tests/jemalloc checks
 * nallocx against real blocks). */
size_t _keel_usable_for(size_t n, size_t align, int* tier) {
  if (n == 0) n = 1;
  unsigned cls = 0;
  *tier = choose_tier(n, align, &cls);
  switch (*tier) {
    case TIER_SMALL: return _keel_classes[cls].size;
    case TIER_LARGE: return keel_round_up(large_bytes(n), KEEL_UNIT_SIZE);
    case TIER_HUGE: return _keel_huge_bytes(n);
    default: return 0;
  }
}
