/* malloc.c -- the C allocation API (glibc semantics), mapped onto Keel's core.
 *
 * malloc and free have a fast path each: a thread cache pop or push, no lock, no atomic
 * read-modify-write, and one unlikely branch to a noinline slow path. Everything else
 * (first use in a thread, empty or full bins, large and huge blocks, errors) is there. */
#include "core/internal.h"

#define API __attribute__((visibility("default")))

/* KEEL_PREFIX builds export keel_malloc, keel_free, ... instead of replacing the C
 * allocator: for sanitizer builds (TSan brings its own malloc) and for programs that
 * want Keel beside the system allocator. */
#ifdef KEEL_PREFIX
#define KEEL_FN(name) keel_##name
#else
#define KEEL_FN(name) name
#endif

/* ---- allocation -------------------------------------------------------------------- */

static void* enomem(void) {
  _keel_prim_set_errno(_keel_prim_errno_enomem());
  return NULL;
}

/* Any size, any alignment <= 16; zero: the caller needs zeroed memory. Clears the busy
 * flag that malloc's fast path leaves set (tiers.c sets it again around the cache). */
static KEEL_NOINLINE void* alloc_slow(size_t n, bool zero) {
  keel_ensure_init();
  if (KEEL_UNLIKELY(__atomic_load_n(&_keel_purger_deferred, __ATOMIC_RELAXED)))
    _keel_purger_deferred_check(); /* a forked child: start its purger once it grows */
  void* p;
  if (KEEL_UNLIKELY(_keel_options.check)) p = _keel_checked_alloc(n, 0, zero);
  else if (KEEL_LIKELY(n - 1 < KEEL_CLASS_MAX)) p = _keel_alloc_small(n, zero); /* 1 B - 128 KiB: a size class */
  else p = _keel_alloc_any(n, 0, zero, true);
  keel_tc_leave();
  return p;
}

/* The pop of both malloc paths once they know the class: the bin's first block, its free
 * key cleared and the pop counted in both halves of the bin's word (room, and the heap
 * profiler's countdown). The head's low bits are tested (freelist.h): an empty bin and
 * a corrupt link both go to the slow path, which tells them apart. The caller set the
 * busy flag. */
static KEEL_ALWAYS_INLINE void* alloc_from_bin(keel_tcache_t* t, size_t cls, size_t n) {
  uintptr_t first = t->head[cls];
  if (KEEL_LIKELY(keel_bin_head_ok(first))) {
    void** p = (void**)first;
    t->head[cls] = keel_link_raw_next(p);
    p[1] = NULL; /* clear the double-free key */
    if (KEEL_UNLIKELY(!keel_bin_count_pop(&t->bin[cls]))) return _keel_profile_countdown_expired_at(n, p, &t->head[cls], t);
    keel_tc_leave();
    return p;
  }
  return alloc_slow(n, false);
}

/* Sizes above the fast path's table up to the largest class (1 KiB - 128 KiB: a server's
 * buffers): the class is computed rather than looked up. Before Keel is set up, in
 * checked mode and in a thread without a cache every bin is empty, and the request goes
 * on to alloc_slow. */
static KEEL_NOINLINE void* alloc_medium(size_t n) {
  unsigned cls = keel_size_class(n);
  return alloc_from_bin(keel_tc_enter(), cls, n);
}

/* Fast path: about a dozen instructions for sizes 1..1024 when the bin has a block. */
API void* KEEL_FN(malloc)(size_t n) {
  if (KEEL_LIKELY(n <= KEEL_SMALL_MAX)) {
    keel_tcache_t* t = keel_tc_enter();
    return alloc_from_bin(t, __atomic_load_n(&_keel_class_of_size.cls[n], __ATOMIC_RELAXED), n);
  }
  if (KEEL_LIKELY(n <= KEEL_CLASS_MAX)) return alloc_medium(n);
  return alloc_slow(n, false);
}

API void* KEEL_FN(calloc)(size_t count, size_t size) {
  size_t n;
  if (KEEL_UNLIKELY(__builtin_mul_overflow(count, size, &n))) return enomem();
  if (n <= KEEL_SMALL_MAX && n > 0) {
    void* p = KEEL_FN(malloc)(n);
    if (p) memset(p, 0, n);
    return p;
  }
  return alloc_slow(n, true);
}

/* Alignment is a power of two > 16. */
static void* alloc_aligned(size_t align, size_t n) {
  keel_ensure_init();
  if (KEEL_UNLIKELY(_keel_options.check)) return _keel_checked_alloc(n, align, false);
  return _keel_alloc_any(n, align, false, true);
}

static bool is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* glibc 2.36 memalign: alignments up to 16 are plain malloc; others are rounded up to
 * a power of two; absurd alignments fail with EINVAL. aligned_alloc is the same. */
API void* KEEL_FN(memalign)(size_t align, size_t n) {
  if (align <= 16) return KEEL_FN(malloc)(n);
  if (align > ((size_t)1 << (sizeof(size_t) * 8 - 1))) {
    _keel_prim_set_errno(_keel_prim_errno_einval());
    return NULL;
  }
  if (!is_pow2(align)) align = (size_t)1 << (64 - __builtin_clzll((unsigned long long)align));
  return alloc_aligned(align, n);
}

API void* KEEL_FN(aligned_alloc)(size_t align, size_t n) { return KEEL_FN(memalign)(align, n); }

API int KEEL_FN(posix_memalign)(void** out, size_t align, size_t n) {
  if (align % sizeof(void*) != 0 || !is_pow2(align)) return _keel_prim_errno_einval();
  void* p = align <= 16 ? KEEL_FN(malloc)(n) : alloc_aligned(align, n);
  if (p == NULL) return _keel_prim_errno_enomem();
  *out = p;
  return 0;
}

API void* KEEL_FN(valloc)(size_t n) {
  keel_ensure_init();
  return KEEL_FN(memalign)(_keel_page_size, n);
}

API void* KEEL_FN(pvalloc)(size_t n) {
  keel_ensure_init();
  size_t page = _keel_page_size;
  if (n > SIZE_MAX - page) return enomem();
  return KEEL_FN(memalign)(page, n ? (n + page - 1) & ~(page - 1) : page);
}

/* ---- free -------------------------------------------------------------------------- */

/* With the busy flag still set by free's fast path, t the cache it used and room_cls the
 * page-map entry it read: its room check may have left that bin at -1, and between the
 * two the purger may have pointed the thread at the empty cache for a moment (tcache.c).
 * The room goes back to the bin it was taken from, not to the class the page map names
 * now: another thread may have carved the block's slab meanwhile (borrow.c), and a bin
 * left at -1 counts a block it does not hold, which a later walk of it runs past.
 * _keel_free_slow clears the flag. */
static inline void free_slow_busy(void* p, keel_tcache_t* t, size_t room_cls, const char* call) {
  if (room_cls >= 1 && room_cls < KEEL_NUM_CLASSES) keel_bin_give_back_room(&t->bin[room_cls]);
  if (p == NULL) return;
  uint8_t kind = keel_pagemap_get(p);
  if (KEEL_UNLIKELY(_keel_options.check)) {
    _keel_checked_free(p, call);
    return;
  }
  if (kind == KEEL_KIND_CARVED) { /* a carved block, or one of its slab's own */
    kind = (uint8_t)_keel_central_carved_free(p, call);
    if (kind == 0) return;
  }
  if (kind >= 1 && kind < KEEL_NUM_CLASSES) {
    unsigned cls = kind;
    if (((uintptr_t)p & 15) != 0) {
      bool exact;
      _keel_block_start(cls, p, &exact);
      if (!exact) _keel_misuse(call, "invalid pointer", p, ": not the start of a block", _keel_classes[cls].size);
    }
    if (((uintptr_t*)p)[1] == _keel_free_key)
      _keel_misuse(call, "double free of pointer", p, NULL, _keel_classes[cls].size);
    _keel_tcache_free_slow(t, p, cls);
    return;
  }
  unsigned sampled = keel_sampled_class(p, kind);
  if (sampled) { /* a heap-profile sample: forget it, then back to its own slab */
    bool exact;
    _keel_block_start(sampled, p, &exact);
    if (!exact) _keel_misuse(call, "invalid pointer", p, ": not the start of a block", _keel_classes[sampled].size);
    if (((uintptr_t*)p)[1] == _keel_free_key)
      _keel_misuse(call, "double free of pointer", p, NULL, _keel_classes[sampled].size);
    _keel_profile_forget(p);
    /* Straight to the slab: a list of one is a whole or half batch in the 2-32 KiB
     * classes, and parked in the transfer cache it refilled some bin as a plain block. */
    _keel_central_give_slabs(sampled, keel_freed_one(p));
    return;
  }
  switch (kind) {
    case KEEL_KIND_LARGE:
      if (_keel_profiling) _keel_profile_forget(p);
      _keel_large_free(p, call);
      return;
    case KEEL_KIND_HUGE:
      if (_keel_profiling) _keel_profile_forget(p);
      if (_keel_huge_free(p)) return;
      break;
    case KEEL_KIND_FREED:
      _keel_misuse(call, "double free of pointer", p, NULL, 0);
    default:
      break;
  }
  _keel_misuse(call, "invalid pointer", p, ": not allocated by keel", 0);
}

KEEL_NOINLINE void _keel_free_slow(void* p, keel_tcache_t* t, size_t room_cls) {
  free_slow_busy(p, t, room_cls, "free");
  keel_tc_leave();
}

/* Fast path: the page map gives the size class; the block is pushed on the thread's bin.
 * A block whose second word holds the free key is already free (see _keel_free_key):
 * the slow path reports the double free. */
API void KEEL_FN(free)(void* p) {
  uintptr_t a = (uintptr_t)p;
  /* The block is read (its free key) and then written: fetched for a write at once, a
   * block last written on another core moves here in one transfer, not a read and then
   * an upgrade (a cross-thread free; prefetching NULL does nothing). */
  __builtin_prefetch(p, 1, 3);
  /* Plain loads: any entry we can see for a live block was written before the block was
   * handed out (through a lock). */
  size_t cls = keel_pagemap_get(p);
  keel_tcache_t* t = keel_tc_enter();
  uintptr_t key = _keel_free_key;
  if (KEEL_LIKELY((int8_t)cls > 0 && (a & 15) == 0 && ((uintptr_t*)p)[1] != key)) {
    if (KEEL_LIKELY(keel_bin_take_room(&t->bin[cls]))) {
      ((uintptr_t*)p)[1] = key;
      ((uintptr_t*)p)[0] = keel_link_word_to(p, t->head[cls]); /* freelist.h */
      t->head[cls] = a;
      keel_tc_leave();
      return;
    }
  }
  _keel_free_slow(p, t, cls);
}

API void KEEL_FN(cfree)(void* p) { KEEL_FN(free)(p); }
/* The size (and alignment) must be those the block was asked with (C23; C++'s sized
 * delete comes here): the checked mode, which keeps the requested size, verifies it. */
static KEEL_COLD void checked_free_sized(void* p, size_t size, const char* call) {
  size_t asked = _keel_checked_usable(p, call);
  if (size != asked && !(size == 0 && asked <= 1)) _keel_checked_wrong_size(call, p, size, asked);
  _keel_checked_free(p, call);
}
API void KEEL_FN(free_sized)(void* p, size_t size) {
  if (KEEL_UNLIKELY(_keel_options.check) && p != NULL) checked_free_sized(p, size, "free_sized");
  else KEEL_FN(free)(p);
}
API void KEEL_FN(free_aligned_sized)(void* p, size_t align, size_t size) {
  if (KEEL_UNLIKELY(_keel_options.check) && p != NULL) {
    if (align != 0 && ((uintptr_t)p & (align - 1)) != 0)
      _keel_misuse("free_aligned_sized", "invalid pointer", p, ": not aligned as passed", 0);
    checked_free_sized(p, size, "free_aligned_sized");
  } else {
    KEEL_FN(free)(p);
  }
}

/* ---- sizes and realloc ------------------------------------------------------------- */

static size_t usable_size(const void* p, const char* call) {
  if (KEEL_UNLIKELY(_keel_options.check)) return _keel_checked_usable(p, call);
  return _keel_usable_size(p, call);
}

API size_t KEEL_FN(malloc_usable_size)(void* p) { return p ? usable_size(p, "malloc_usable_size") : 0; }

API void* KEEL_FN(realloc)(void* p, size_t n) {
  if (p == NULL) return KEEL_FN(malloc)(n);
  if (n == 0) { /* glibc: frees and returns NULL */
    KEEL_FN(free)(p);
    return NULL;
  }
  if (n > KEEL_MAX_ALLOC) return enomem();
  if (KEEL_UNLIKELY(_keel_options.check)) return _keel_checked_realloc(p, n);
  uint8_t kind = keel_pagemap_get(p);
  size_t old = usable_size(p, "realloc");
  if (kind < KEEL_NUM_CLASSES || kind == KEEL_KIND_CARVED) { /* a slab's block, or a carved one */
    /* Same block if it fits and shrinking would not free at least half of it. */
    if (n <= old && n >= old / 2) return p;
  } else {
    void* q = _keel_realloc_big(p, kind, n, false); /* large in place, huge by remapping */
    if (q) return q;
  }
  void* q = KEEL_FN(malloc)(n);
  if (q == NULL) return NULL;
  memcpy(q, p, old < n ? old : n);
  KEEL_FN(free)(p);
  return q;
}

API void* KEEL_FN(reallocarray)(void* p, size_t count, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) return enomem();
  return KEEL_FN(realloc)(p, n);
}
