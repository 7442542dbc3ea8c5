/* jemalloc_compat.c -- jemalloc 5.3's allocation API (mallocx, rallocx, xallocx, sallocx,
 * dallocx, sdallocx, nallocx), answered by Keel for programs built against jemalloc.
 * mallctl is in mallctl.c, malloc_stats_print in stats_print.c; jemalloc_compat.h is
 * what the three share. */
#include <stdlib.h>

#include "api/jemalloc_compat.h"

/* Debian's redis-server, for one, is linked to libjemalloc.so.2: under
 * LD_PRELOAD=libkeel.so its malloc and free come to Keel, and without these symbols its
 * mallctl("stats.allocated") and nallocx() would still ask jemalloc, which holds none of
 * its memory. Signatures, flag encodings and error codes are jemalloc 5.3's (checked
 * against Debian's libjemalloc2 by tests/jemalloc); the figures are Keel's.
 *
 *   flags      bits 0-5 lg(alignment), bit 6 zero, bits 8-19 thread cache (0 automatic,
 *              1 none, tc + 2 an explicit one), bits 20+ arena + 1. Keel has one heap
 *              ("arena 0") and its per-thread caches; explicit caches and arenas map
 *              onto those.
 *   sizes      nallocx() computes the usable size _keel_alloc_any() would hand out (the
 *              tier rules of tiers.c, large.c and huge.c), so nallocx(n, f) ==
 *              sallocx(mallocx(n, f), 0), which programs such as Redis rely on. */

/* ---- flags and limits ------------------------------------------------------------------ */

#define JE_LG_ALIGN_MASK 0x3f
#define JE_ZERO 0x40
#define JE_TCACHE_MASK 0xfff00
#define JE_TCACHE_NONE 0x100
#define JE_MAX_ALIGN ((size_t)1 << 62)        /* larger alignments: nallocx 0, mallocx NULL */
#define JE_CHECKED_TAIL 16                    /* checked.c's spare bytes per block */

/* jemalloc's two configuration globals. Keel reads neither (its settings are KEEL_*),
 * but programs refer to them; malloc_message is honoured by malloc_stats_print. */
API const char* malloc_conf = NULL;
API void (*malloc_message)(void* cbopaque, const char* s) = NULL;

static void* enomem(void) {
  _keel_prim_set_errno(_keel_prim_errno_enomem());
  return NULL;
}

static size_t flag_align(int flags) {
  unsigned lg = (unsigned)flags & JE_LG_ALIGN_MASK;
  return lg ? (size_t)1 << lg : 0;
}

static bool flag_via_cache(int flags) { return (flags & JE_TCACHE_MASK) != JE_TCACHE_NONE; }

static size_t round_up(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }

/* ---- sizes --------------------------------------------------------------------------- */

/* Tiers and usable sizes come from the core (tiers.c), which allocates by the same
 * rules, so nallocx cannot drift from what mallocx hands out. */
static size_t plain_usable(size_t n, size_t align, int* tier) {
  if (align > JE_MAX_ALIGN) {
    *tier = TIER_NONE;
    return 0;
  }
  return _keel_usable_for(n, align, tier);
}

/* ---- allocation ---------------------------------------------------------------------- */

/* With MALLOCX_ZERO all of what sallocx reports reads as zero; a block borrowed from a
 * larger class (borrow.c) is bigger than the `zeroed` bytes nallocx promised. */
static void* zero_rest(void* p, size_t zeroed) {
  size_t usable = p != NULL ? _keel_usable_size(p, "mallocx") : 0;
  if (usable > zeroed) memset((char*)p + zeroed, 0, usable - zeroed);
  return p;
}

API void* mallocx(size_t n, int flags) {
  size_t align = flag_align(flags);
  bool zero = (flags & JE_ZERO) != 0;
  if (n == 0) n = 1; /* undefined in jemalloc; Keel hands out its smallest block */
  keel_ensure_init();
  if (align > JE_MAX_ALIGN) return enomem();
  if (KEEL_UNLIKELY(_keel_options.check)) return _keel_checked_alloc(n, align, zero);
  if (zero) {
    /* Ask for the whole usable size: all of it must read as zero, not just n bytes. */
    int tier;
    n = plain_usable(n, align, &tier);
    if (n == 0) return enomem();
    return zero_rest(_keel_alloc_any(n, align, true, flag_via_cache(flags)), n);
  }
  return _keel_alloc_any(n, align, false, flag_via_cache(flags));
}

/* Usable size of a live block; reports misuse naming `call` for anything else. */
static size_t block_usable(void* p, const char* call) {
  if (KEEL_UNLIKELY(_keel_options.check)) return _keel_checked_usable(p, call);
  return _keel_usable_size(p, call);
}

static void release(void* p, const char* call) {
  if (KEEL_UNLIKELY(_keel_options.check)) _keel_checked_free(p, call);
  else free(p);
}

/* Moves to a block of exactly nallocx(n, flags) bytes unless p already is one (then it
 * stays); large blocks grow and shrink in place when they can, huge ones through mremap.
 * With MALLOCX_ZERO the bytes past the old usable size read as zero. On failure p is
 * left as it was and NULL is returned. */
API void* rallocx(void* p, size_t n, int flags) {
  if (p == NULL) return mallocx(n, flags); /* undefined in jemalloc */
  size_t align = flag_align(flags);
  bool zero = (flags & JE_ZERO) != 0;
  if (n == 0) n = 1;
  keel_ensure_init();
  if (align > JE_MAX_ALIGN) return enomem();
  if (KEEL_UNLIKELY(_keel_options.check)) {
    size_t old = _keel_checked_usable(p, "rallocx");
    void* q = _keel_checked_alloc(n, align, zero);
    if (q == NULL) return NULL;
    memcpy(q, p, old < n ? old : n);
    _keel_checked_free(p, "rallocx");
    return q;
  }
  size_t old = block_usable(p, "rallocx");
  int tier;
  size_t want = plain_usable(n, align, &tier);
  if (want == 0) return enomem();
  if (align <= 16 || ((uintptr_t)p & (align - 1)) == 0) {
    if (want == old) return p;
    uint8_t kind = keel_pagemap_get(p);
    bool large = kind == KEEL_KIND_LARGE && tier == TIER_LARGE;
    if (large || (kind == KEEL_KIND_HUGE && tier == TIER_HUGE && align <= _keel_page_size)) {
      /* A large block takes exactly `want` (whole units). Pages mremap adds to a huge one
       * are fresh anonymous memory, zero without a memset, where the huge cache does not
       * fill them (it does not when asked to zero). A small shrink keeps the
       * mapping as it is (huge.c), so the block may stay bigger. */
      void* q = _keel_realloc_big(p, kind, large ? want : n, zero);
      if (q != NULL) {
        if (large && zero && want > old) memset((char*)p + old, 0, want - old);
        return q;
      }
    }
  }
  void* q = _keel_alloc_any(zero ? want : n, align, zero, flag_via_cache(flags));
  if (q == NULL) return NULL;
  if (zero) zero_rest(q, want);
  memcpy(q, p, old < want ? old : want);
  free(p);
  return q;
}

/* Resizes in place only: large blocks (whole units) grow into free units that follow them
 * or shrink; small blocks keep their class, and huge blocks their mapping (Keel has no
 * in-place-only remap). Returns the usable size afterwards, < size if it could not grow. */
API size_t xallocx(void* p, size_t size, size_t extra, int flags) {
  keel_ensure_init();
  size_t old = block_usable(p, "xallocx");
  if (KEEL_UNLIKELY(_keel_options.check) || keel_pagemap_get(p) != KEEL_KIND_LARGE) return old;
  size_t align = flag_align(flags);
  if (align > 16 && ((uintptr_t)p & (align - 1)) != 0) return old;
  if (size == 0) size = 1;
  if (size > KEEL_LARGE_MAX) return old;
  size_t hi = size + extra < size ? SIZE_MAX : size + extra;
  if (hi > KEEL_LARGE_MAX) hi = KEEL_LARGE_MAX;
  if (hi <= KEEL_CLASS_MAX) return old; /* a large block cannot become a small one */
  size_t hi_u = round_up(hi, KEEL_UNIT_SIZE);
  size_t lo_u = round_up(size > KEEL_CLASS_MAX ? size : KEEL_CLASS_MAX + 1, KEEL_UNIT_SIZE);
  size_t now = old;
  if (hi_u > old) {
    if (_keel_large_realloc(p, hi_u) != NULL) now = hi_u;
    else if (lo_u > old && lo_u < hi_u && _keel_large_realloc(p, lo_u) != NULL) now = lo_u;
  } else if (hi_u < old && _keel_large_realloc(p, hi_u) != NULL) {
    now = hi_u;
  }
  if ((flags & JE_ZERO) && now > old) memset((char*)p + old, 0, now - old);
  if (now != old && _keel_profiling) { /* its record names the old size: sampled afresh */
    _keel_profile_forget(p);
    _keel_profile_sample_big(p, now);
  }
  return now;
}

API size_t sallocx(const void* p, int flags) {
  (void)flags;
  keel_ensure_init();
  return block_usable((void*)p, "sallocx");
}

API void dallocx(void* p, int flags) {
  (void)flags;
  if (p != NULL) release(p, "dallocx");
}

/* In the checked mode the size is verified: from the size the block was asked with up
 * to the usable size Keel would give it (jemalloc's rule: the request up to nallocx). */
API void sdallocx(void* p, size_t size, int flags) {
  if (p == NULL) return;
  if (KEEL_UNLIKELY(_keel_options.check)) {
    size_t asked = _keel_checked_usable(p, "sdallocx");
    int tier;
    size_t most = plain_usable(asked, flag_align(flags), &tier);
    if (size < asked || size > most) _keel_checked_wrong_size("sdallocx", p, size, asked);
    _keel_checked_free(p, "sdallocx");
    return;
  }
  free(p);
}

API size_t nallocx(size_t n, int flags) {
  keel_ensure_init();
  size_t align = flag_align(flags);
  if (KEEL_UNLIKELY(_keel_options.check)) { /* the checked mode's usable size is the request */
    if (n == 0) n = 1;
    return n > KEEL_MAX_ALLOC - JE_CHECKED_TAIL || align > JE_MAX_ALIGN ? 0 : n;
  }
  int tier;
  return plain_usable(n, align, &tier);
}
