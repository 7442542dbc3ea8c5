/* mesh_heap.h -- for the meshing tests that lay out a heap whose pages pair: where each
 * block's 64 KiB slab stands among the slabs the blocks lie in (by address), so a test
 * can keep blocks at one place in even slabs and another in odd ones. */
#ifndef KEEL_TEST_MESH_HEAP_H
#define KEEL_TEST_MESH_HEAP_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define MESH_SLAB_MASK ((uintptr_t)0xFFFF)

static inline int mesh_by_address(const void* a, const void* b) {
  uintptr_t x = *(const uintptr_t*)a, y = *(const uintptr_t*)b;
  return x < y ? -1 : x > y;
}

/* order[i]: the rank of blk[i]'s slab among the n blocks' slabs; scratch holds n entries.
 * Returns the number of slabs. */
static inline size_t mesh_slab_order(void* const* blk, size_t n, uintptr_t* scratch, size_t* order) {
  for (size_t i = 0; i < n; i++) scratch[i] = (uintptr_t)blk[i] & ~MESH_SLAB_MASK;
  qsort(scratch, n, sizeof scratch[0], mesh_by_address);
  size_t slabs = 0;
  for (size_t i = 0; i < n; i++)
    if (slabs == 0 || scratch[slabs - 1] != scratch[i]) scratch[slabs++] = scratch[i];
  for (size_t i = 0; i < n; i++) {
    uintptr_t s = (uintptr_t)blk[i] & ~MESH_SLAB_MASK;
    order[i] = (size_t)((uintptr_t*)bsearch(&s, scratch, slabs, sizeof s, mesh_by_address) - scratch);
  }
  return slabs;
}

#endif
