/* pagemap.c -- address -> size class or block kind, one byte per 64 KiB unit.
 * Leaves are created on first use and never freed, so readers need no lock: a unit's
 * byte only changes while no live block is in that unit. */
#include "core/internal.h"

uint8_t* _keel_pagemap_top[1u << KEEL_PAGEMAP_TOP_BITS];
static keel_lock_t leaf_lock = KEEL_LOCK_INIT;

static uint8_t* leaf_for(uintptr_t a) {
  size_t i = (a >> (KEEL_UNIT_SHIFT + KEEL_PAGEMAP_LEAF_BITS)) & ((1u << KEEL_PAGEMAP_TOP_BITS) - 1);
  uint8_t* leaf = __atomic_load_n(&_keel_pagemap_top[i], __ATOMIC_ACQUIRE);
  if (leaf) return leaf;
  keel_lock(&leaf_lock);
  leaf = _keel_pagemap_top[i];
  if (!leaf) {
    leaf = (uint8_t*)_keel_meta_alloc((size_t)1 << KEEL_PAGEMAP_LEAF_BITS);
    if (leaf) __atomic_store_n(&_keel_pagemap_top[i], leaf, __ATOMIC_RELEASE);
  }
  keel_unlock(&leaf_lock);
  return leaf;
}

bool _keel_pagemap_set(uintptr_t a, size_t units, uint8_t value) {
  for (size_t i = 0; i < units; i++, a += KEEL_UNIT_SIZE) {
    uint8_t* leaf = leaf_for(a);
    if (!leaf) return false;
    __atomic_store_n(&leaf[(a >> KEEL_UNIT_SHIFT) & ((1u << KEEL_PAGEMAP_LEAF_BITS) - 1)], value,
                     __ATOMIC_RELEASE);
  }
  return true;
}

void _keel_pagemap_lock_all(void) { keel_lock(&leaf_lock); }
void _keel_pagemap_unlock_all(void) { keel_unlock(&leaf_lock); }
void _keel_pagemap_reset_locks(void) { keel_lock_reset(&leaf_lock); }
