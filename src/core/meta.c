/* meta.c -- memory for Keel's own bookkeeping (thread caches, page map leaves, the huge
 * block table). A bump allocator over 1 MiB regions: metadata is small, long-lived and
 * recycled by its owners (thread caches keep their own free list), so it needs no free. */
#include "core/internal.h"

#define META_REGION ((size_t)1 << 20)

static keel_lock_t meta_lock KEEL_ALWAYS_BSS = KEEL_LOCK_INIT;
keel_lock_t* const _keel_lock_meta = &meta_lock; /* statistics (stats.c) */
static char* meta_cur;
static char* meta_end;
static uint64_t meta_total;

void* _keel_meta_alloc(size_t size) {
  size = (size + 63) & ~(size_t)63;
  if (size > META_REGION / 4) return _keel_meta_alloc_pages(size);
  keel_lock(&meta_lock);
  if (meta_cur == NULL || (size_t)(meta_end - meta_cur) < size) {
    char* region = (char*)_keel_prim_map(META_REGION, 0, NULL);
    if (region == NULL) {
      keel_unlock(&meta_lock);
      return NULL;
    }
    meta_cur = region;
    meta_end = region + META_REGION;
  }
  void* p = meta_cur; /* fresh mappings read as zero */
  meta_cur += size;
  __atomic_fetch_add(&meta_total, size, __ATOMIC_RELAXED); /* read without the lock */
  keel_unlock(&meta_lock);
  return p;
}

void* _keel_meta_alloc_pages(size_t size) {
  void* p = _keel_prim_map((size + _keel_page_size - 1) & ~(_keel_page_size - 1), 0, NULL);
  if (p) __atomic_fetch_add(&meta_total, size, __ATOMIC_RELAXED);
  return p;
}

uint64_t _keel_meta_bytes(void) { return __atomic_load_n(&meta_total, __ATOMIC_RELAXED); }
void _keel_meta_lock_all(void) { keel_lock(&meta_lock); }
void _keel_meta_unlock_all(void) { keel_unlock(&meta_lock); }
void _keel_meta_reset_locks(void) { keel_lock_reset(&meta_lock); }
