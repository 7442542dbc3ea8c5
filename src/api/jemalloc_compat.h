/* jemalloc_compat.h -- what the jemalloc API's three files share: jemalloc's constants,
 * mallctl's value types, and the statistics snapshot and settings that mallctl.c holds
 * and malloc_stats_print (stats_print.c) reads. Private to src/api. */
#ifndef KEEL_JEMALLOC_COMPAT_H
#define KEEL_JEMALLOC_COMPAT_H

#include "core/internal.h"

#define API __attribute__((visibility("default")))

#define JE_LARGE_MIN (KEEL_CLASS_MAX + KEEL_UNIT_SIZE) /* smallest large span: 3 units */
#define JE_NLEXTENTS ((unsigned)((KEEL_LARGE_MAX - JE_LARGE_MIN) / KEEL_UNIT_SIZE + 1))

#define JE_STR2(x) #x
#define JE_STR(x) JE_STR2(x)
#define JE_VERSION                                                                       \
  "5.3.0-0-keel-" JE_STR(KEEL_VERSION_MAJOR) "." JE_STR(KEEL_VERSION_MINOR) "." JE_STR( \
      KEEL_VERSION_PATCH)

/* jemalloc_compat.c: malloc_stats_print writes here when given no callback. */
extern void (*malloc_message)(void* cbopaque, const char* s);

/* A mallctl value: its type (V_*) says how many bytes it takes in the program's buffer. */
enum { V_NONE, V_BOOL, V_UNSIGNED, V_SIZE, V_SSIZE, V_U64, V_I64, V_STR };

typedef struct val_s {
  uint64_t n; /* integers and bools (signed ones as two's complement) */
  const char* s;
} val_t;

/* mallctl.c: the statistics snapshot. */
typedef struct je_snap_s {
  uint64_t epoch; /* 0: none taken yet */
  keel_stats_t s;
  /* jemalloc's figures, derived once per snapshot: resident and mapped add the
   * metadata Keel maps outside its chunks; dirty is the free units not yet purged
   * (freed huge mappings kept for reuse are not included); small and large split
   * `allocated` by tier (huge blocks count as large). */
  uint64_t resident, mapped, dirty, small, large;
  uint64_t tcache_bytes; /* free blocks held in thread caches */
  uint64_t out[KEEL_NUM_CLASSES];      /* blocks out of slabs (live or cached), per class */
  uint64_t batched[KEEL_NUM_CLASSES];  /* of those, blocks in transfer batches */
  uint64_t slabs[KEEL_NUM_CLASSES];
} je_snap_t;

uint64_t _keel_je_snap_refresh(bool initial) KEEL_INTERNAL; /* a new snapshot; its epoch */
void _keel_je_snap_copy(je_snap_t* out) KEEL_INTERNAL;        /* the current one */

/* mallctl.c: settings as mallctl reads them, and each value leaf of a top-level directory
 * of its tree ("config", "opt") in the tree's order. */
bool _keel_je_bg_enabled(void) KEEL_INTERNAL;       /* "background_thread" */
int64_t _keel_je_purge_delay_ms(void) KEEL_INTERNAL; /* "arena.0.dirty_decay_ms" (-1: never) */
typedef void (*je_leaf_fn)(void* ctx, const char* name, int type, const val_t* v);
void _keel_je_ctl_each(const char* dir, je_leaf_fn fn, void* ctx) KEEL_INTERNAL;

#endif
