/* pagemap.h -- the page map (pagemap.c): one byte per unit, read without a lock. */
#ifndef KEEL_PAGEMAP_H
#define KEEL_PAGEMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"
#include "core/geometry.h"

/* ---- page map (pagemap.c) -------------------------------------------------------------
 * Flat: one byte per 64 KiB unit, indexed by (address >> 16) & mask, so the free fast path
 * finds a block's class with a shift, a mask and a load. The map is reserved read-only
 * (unwritten bytes read as KEEL_KIND_NONE) and made writable slice by slice where Keel
 * maps memory; nothing is ever unmapped, so readers need no lock. Before the first Keel
 * mapping, base is a single zero byte and mask is 0 (NULL and every pointer then read
 * that byte). Base and mask are written once, before any block exists, and read with
 * plain loads: a reader that races with that first write can only be freeing a pointer
 * Keel never handed out. */
extern uint8_t* _keel_pagemap_base KEEL_INTERNAL;
extern uintptr_t _keel_pagemap_mask KEEL_INTERNAL;

static inline uint8_t* keel_pagemap_slot(uintptr_t a) {
  return &_keel_pagemap_base[(a >> KEEL_UNIT_SHIFT) & _keel_pagemap_mask];
}
static inline uint8_t keel_pagemap_get(const void* p) {
  return __atomic_load_n(keel_pagemap_slot((uintptr_t)p), __ATOMIC_RELAXED);
}
/* Sets `units` consecutive entries from address a; false if the map cannot describe a
 * (its slice could not be made writable, or, with a reduced map, a lies outside the
 * window the map covers): the caller then treats its mapping as failed. */
bool _keel_pagemap_reserve(void) KEEL_INTERNAL;
bool _keel_pagemap_set(uintptr_t a, size_t units, uint8_t value) KEEL_INTERNAL;
/* True if the map has ever described memory in the 1 GiB slice around a: a walk over
 * the map (checked.c's fault handler) stops where this is false. */
bool _keel_pagemap_slice_used(uintptr_t a) KEEL_INTERNAL;

#endif /* KEEL_PAGEMAP_H */
