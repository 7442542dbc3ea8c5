/* pagemap.c -- address -> size class or block kind, one byte per 64 KiB unit.
 *
 * The map is flat, so that free() reads a block's class with one shift, one mask and one
 * load (a two-level map costs twice the instructions and a null check on every free).
 * 2^32 bytes describe the whole 48-bit address space. They are reserved read-only: that
 * is address space only, charged to nothing, and every byte reads as KEEL_KIND_NONE
 * from the kernel's zero page. A slice of the map (16 KiB, describing 1 GiB) is made
 * writable the first time Keel maps memory in the gigabyte it describes, and stays so;
 * nothing is ever unmapped, so readers take no lock. A server with 100 GiB of heap
 * spread over its address space writes at most a few MiB of map.
 *
 * When the address space is limited (RLIMIT_AS below about 5 GiB) the full reservation
 * fails and a smaller map is used: 2^k bytes tell apart any 2^(k+16) contiguous bytes of
 * address space, so Keel then keeps all its memory inside a window of that length around
 * its first mapping (a 64 MiB map still covers 4 TiB) and refuses memory the kernel
 * places outside it, which then fails like any mapping. What is lost: a pointer from
 * outside the window that another allocator handed out aliases some unit of the window,
 * so freeing it is no longer reported as an invalid free. */
#include "core/internal.h"

#define FULL_BITS 32   /* 2^32 units of 64 KiB = 2^48 bytes */
#define SMALLEST_BITS 22 /* 4 MiB of map: a 256 GiB window */
#define SLICE_BITS 14  /* map bytes per slice: 16 KiB, describing 1 GiB */

static uint8_t unmapped_byte; /* the map before Keel's first mapping: one NONE byte */
uint8_t* _keel_pagemap_base = &unmapped_byte;
uintptr_t _keel_pagemap_mask = 0;

static keel_lock_t map_lock KEEL_ALWAYS_BSS = KEEL_LOCK_INIT;
keel_lock_t* const _keel_lock_pagemap = &map_lock; /* statistics (stats.c) */
static unsigned map_bits;          /* log2 of the map's size; 0 before it exists */
static uintptr_t window_lo, window_len; /* reduced map only: the addresses it covers */
static bool window_placed;               /* window_lo set (at the first address set) */
/* Which slices are writable. The first FIRST_SLICES a process makes writable are listed
 * on the page of data every process writes (a process spans one or two gigabytes
 * unless its heap is big); the rest are bits in a 32 KiB bitmap laid out with the
 * rarely used data (src/hot_text.ld), whose page holding a word is written only then:
 * with every slice in the bitmap, that page was 4 KiB of RssAnon in every process.
 * Listed entries are slice + 1, written under the map lock and read without it. */
#define FIRST_SLICES 8
static uint32_t first_slices[FIRST_SLICES] KEEL_ALWAYS_BSS;
static uint64_t slice_writable[(1u << (FULL_BITS - SLICE_BITS)) / 64] KEEL_SPARSE_BSS;

/* Map lock held. The reduced map's window is placed around the first address set. */
static bool reserve(void) {
  for (unsigned bits = FULL_BITS; bits >= SMALLEST_BITS; bits--) {
    uint8_t* map = (uint8_t*)_keel_prim_reserve_zero((size_t)1 << bits);
    if (map == NULL) continue;
    if (bits < FULL_BITS) window_len = (uintptr_t)1 << (bits + KEEL_UNIT_SHIFT);
    __atomic_store_n(&_keel_pagemap_base, map, __ATOMIC_RELAXED);
    __atomic_store_n(&_keel_pagemap_mask, ((uintptr_t)1 << bits) - 1, __ATOMIC_RELEASE);
    __atomic_store_n(&map_bits, bits, __ATOMIC_RELEASE); /* last: read without the lock */
    return true;
  }
  return false;
}

static bool slice_is_writable(size_t slice) {
  for (unsigned k = 0; k < FIRST_SLICES; k++) {
    uint32_t e = __atomic_load_n(&first_slices[k], __ATOMIC_ACQUIRE);
    if (e == slice + 1) return true;
    if (e == 0) return false; /* listed in order: the bitmap is used only once all are */
  }
  return (__atomic_load_n(&slice_writable[slice / 64], __ATOMIC_ACQUIRE) >> (slice % 64)) & 1;
}

/* Map lock held. */
static void mark_writable(size_t slice) {
  for (unsigned k = 0; k < FIRST_SLICES; k++)
    if (first_slices[k] == 0) {
      __atomic_store_n(&first_slices[k], (uint32_t)slice + 1, __ATOMIC_RELEASE);
      return;
    }
  __atomic_fetch_or(&slice_writable[slice / 64], (uint64_t)1 << (slice % 64), __ATOMIC_RELEASE);
}

/* Makes the slice holding map index i writable. */
static bool make_writable(size_t i) {
  size_t slice = i >> SLICE_BITS;
  if (slice_is_writable(slice)) return true;
  bool ok = true;
  keel_lock(&map_lock);
  if (!slice_is_writable(slice)) {
    /* Whole OS pages: with 64 KiB pages one call covers four slices. */
    size_t page = _keel_page_size, bytes = (size_t)1 << SLICE_BITS;
    uintptr_t lo = ((uintptr_t)_keel_pagemap_base + (slice << SLICE_BITS)) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)_keel_pagemap_base + (slice << SLICE_BITS) + bytes + page - 1) &
                   ~(uintptr_t)(page - 1);
    ok = _keel_prim_protect((void*)lo, hi - lo, true);
    if (ok) mark_writable(slice);
  }
  keel_unlock(&map_lock);
  return ok;
}

/* Before the first chunk is mapped: the kernel places mappings top-down, so a map
 * reserved after the first chunk sat right below it and pushed the next chunks 4 GiB
 * further down, into another gigabyte of the map: a second slice, and a page of map
 * written in every process that takes two chunks (a PostgreSQL backend). Reserved
 * first, the chunks follow each other below it. */
bool _keel_pagemap_reserve(void) {
  if (KEEL_LIKELY(__atomic_load_n(&map_bits, __ATOMIC_ACQUIRE) != 0)) return true;
  keel_lock(&map_lock);
  bool ok = map_bits != 0 || reserve();
  keel_unlock(&map_lock);
  return ok;
}

bool _keel_pagemap_set(uintptr_t a, size_t units, uint8_t value) {
  if (KEEL_UNLIKELY(!_keel_pagemap_reserve())) return false;
  if (KEEL_UNLIKELY(window_len != 0 && !__atomic_load_n(&window_placed, __ATOMIC_ACQUIRE))) {
    keel_lock(&map_lock);
    if (!window_placed) {
      window_lo = a > window_len / 2 ? a - window_len / 2 : 0;
      __atomic_store_n(&window_placed, true, __ATOMIC_RELEASE);
    }
    keel_unlock(&map_lock);
  }
  if (window_len != 0 && (a - window_lo >= window_len || units > (window_len - (a - window_lo)) >> KEEL_UNIT_SHIFT))
    return false;
  for (size_t u = 0; u < units; u++, a += KEEL_UNIT_SIZE) {
    size_t i = (a >> KEEL_UNIT_SHIFT) & _keel_pagemap_mask;
    if (!make_writable(i)) return false;
    __atomic_store_n(&_keel_pagemap_base[i], value, __ATOMIC_RELEASE);
  }
  return true;
}

bool _keel_pagemap_slice_used(uintptr_t a) {
  if (__atomic_load_n(&_keel_pagemap_mask, __ATOMIC_ACQUIRE) == 0) return false;
  if (window_len != 0 && a - window_lo >= window_len) return false;
  return slice_is_writable(((a >> KEEL_UNIT_SHIFT) & _keel_pagemap_mask) >> SLICE_BITS);
}

void _keel_pagemap_lock_all(void) { keel_lock(&map_lock); }
void _keel_pagemap_unlock_all(void) { keel_unlock(&map_lock); }
void _keel_pagemap_reset_locks(void) { keel_lock_reset(&map_lock); }
