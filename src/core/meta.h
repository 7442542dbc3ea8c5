/* meta.h -- Keel's own metadata memory (meta.c). */
#ifndef KEEL_META_H
#define KEEL_META_H

#include <stddef.h>
#include <stdint.h>

#include "core/base.h"

/* ---- metadata (meta.c) ------------------------------------------------------------- */
void* _keel_meta_alloc(size_t size) KEEL_INTERNAL; /* zeroed, 64-byte aligned; NULL if OOM */
/* Zeroed whole pages of a mapping of their own, whose pages the caller may purge. */
void* _keel_meta_alloc_pages(size_t size) KEEL_INTERNAL;
void _keel_meta_lock_all(void) KEEL_INTERNAL;
void _keel_meta_unlock_all(void) KEEL_INTERNAL;
void _keel_meta_reset_locks(void) KEEL_INTERNAL;
uint64_t _keel_meta_bytes(void) KEEL_INTERNAL;

#endif /* KEEL_META_H */
