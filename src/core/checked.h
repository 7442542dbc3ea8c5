/* checked.h -- checked mode (checked.c, KEEL_CHECK=1). */
#ifndef KEEL_CHECKED_H
#define KEEL_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"

/* ---- checked mode (checked.c) -------------------------------------------------------
 * KEEL_CHECK=1: every block gets a canary tail and its requested size, freed blocks are
 * poisoned and quarantined, and every misuse is reported where it is seen. Thread
 * caches have no room, so every call reaches these functions through the slow paths. */
void* _keel_checked_alloc(size_t n, size_t align, bool zero) KEEL_INTERNAL;
void _keel_checked_free(void* p, const char* call) KEEL_INTERNAL;
size_t _keel_checked_usable(const void* p, const char* call) KEEL_INTERNAL;
void* _keel_checked_realloc(void* p, size_t n) KEEL_INTERNAL;
/* A free that names the block's size (free_sized, sized operator delete, sdallocx) with
 * one that does not fit `asked`, the size the block was requested with: reported. */
_Noreturn void _keel_checked_wrong_size(const char* call, const void* p, size_t size, size_t asked) KEEL_INTERNAL KEEL_COLD;
/* Bytes of freed blocks the quarantine holds: of small blocks, and of large and huge
 * ones (statistics: they are cached, not allocated). */
void _keel_checked_quarantine_bytes(uint64_t* small, uint64_t* big) KEEL_INTERNAL;
void _keel_checked_lock_all(void) KEEL_INTERNAL;   /* fork: the quarantine lock */
void _keel_checked_unlock_all(void) KEEL_INTERNAL;
void _keel_checked_reset_locks(void) KEEL_INTERNAL;
/* A new slab over memory that held something else: no block of it may carry a freed
 * block's poison mark from that earlier life (central.c, on dirty units). */
void _keel_checked_slab_new(void* base, unsigned cls) KEEL_INTERNAL;

#endif /* KEEL_CHECKED_H */
