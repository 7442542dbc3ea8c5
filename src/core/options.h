/* options.h -- the options (options.c) and the rule for reading them (keel_opt). */
#ifndef KEEL_OPTIONS_H
#define KEEL_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"

/* ---- options (options.c) -------------------------------------------------------------- */
/* The longest value an option takes (a path prefix), in bytes. */
#define KEEL_OPTION_VALUE_MAX 199

typedef struct keel_options_s {
  uint64_t purge_delay_ms;  /* KEEL_PURGE_DELAY: free memory is returned after this long */
  uint64_t tcache_bytes;    /* KEEL_TCACHE_MAX: most bytes one thread cache may hold */
  uint64_t tcache_total;    /* KEEL_TCACHE_TOTAL: what all thread caches may hold together */
  uint64_t tcache_idle_ms;  /* KEEL_TCACHE_IDLE: the purger takes back the cache of a thread
                               idle this long (0: never) */
  uint64_t huge_page_size;  /* KEEL_HUGE_PAGE_SIZE: override what the OS reports */
  bool stats_at_exit;       /* KEEL_STATS */
  bool background_purge;    /* KEEL_BACKGROUND_PURGE: a helper thread purges on a timer */
  bool check;               /* KEEL_CHECK: checked mode (canaries, poison, quarantine) */
  bool publish;             /* KEEL_PUBLISH: statistics readable by `keel stats PID` */
  uint64_t profile_rate;    /* KEEL_PROFILE_RATE: bytes between heap samples (0: off) */
  uint64_t profile_growth;  /* KEEL_PROFILE_GROWTH: dump a profile after this much growth */
  bool profile_at_exit;     /* KEEL_PROFILE_AT_EXIT: dump a profile at exit */
  bool profile_leaks;       /* KEEL_PROFILE_LEAKS: report live sampled blocks at exit */
  char profile_prefix[KEEL_OPTION_VALUE_MAX + 1]; /* KEEL_PROFILE_PREFIX: dumps go to PREFIX.<pid>.<n>.heap */
  int thp;                  /* KEEL_THP: keel_thp_policy_t for Keel's own memory */
  int mesh;                 /* KEEL_MESH: keel_mesh_policy_t */
  uint64_t check_guard;     /* KEEL_CHECK_GUARD: checked-mode blocks this big get a guard
                               page after their end (0: none) */
  uint64_t fine_classes;    /* KEEL_FINE_CLASSES: slab bytes at which the fine size classes
                               take over from the coarse ones (0: fine from the start) */
  uint64_t child_purger;    /* KEEL_CHILD_PURGER: a forked child starts its purger once it
                               has taken this much in spans and huge blocks since the fork
                               (0: at the fork) */
  uint64_t cpus;            /* KEEL_CPUS: processors the per-processor structures are sized
                               for (0: those the process may run on) */
  bool own_lines;           /* KEEL_OWN_LINES: while threads are apart, a processor's line
                               keeps its slabs, parked batches and chunk to itself */
} keel_options_t;

/* KEEL_THP: what Keel asks of transparent huge pages for the memory it maps. */
typedef enum keel_thp_policy_e {
  KEEL_THP_SYSTEM = 0, /* no advice: the machine's setting decides */
  KEEL_THP_ALWAYS = 1, /* MADV_HUGEPAGE: huge pages even where the machine says madvise */
  KEEL_THP_NEVER = 2,  /* MADV_NOHUGEPAGE: never, whatever the machine says */
  KEEL_THP_DENSE = 3,  /* none at fault time; the purger collapses dense huge pages */
} keel_thp_policy_t;

/* KEEL_MESH: whether the purger meshes sparse slab pages (docs/meshing.md). */
typedef enum keel_mesh_policy_e {
  KEEL_MESH_OFF = 0,
  KEEL_MESH_ON = 1,   /* only with a write barrier the kernel's own writes respect too */
  KEEL_MESH_USER = 2, /* also with a user-mode barrier: a read(2) into a block being
                         meshed then fails with EFAULT instead of waiting */
} keel_mesh_policy_t;

extern keel_options_t _keel_options KEEL_INTERNAL;
/* The rule for options. Every read of one that may change while the program runs goes
 * through keel_opt(name), a relaxed atomic load (a plain load on x86-64 and aarch64: a
 * new value lands whole and is seen soon, in no particular order), and every write is a
 * relaxed atomic store (options.c, mallctl). Those fixed before the first block exists
 * (options.c's AT_START: check, huge_page_size) may be read plainly. A reader that needs
 * an order says so with its own __atomic_load_n (publish.c). The one string,
 * profile_prefix, is written and read a byte at a time (keel_opt_str): a read racing a
 * change may mix the two values, never run past the array. */
#define keel_opt(name) __atomic_load_n(&_keel_options.name, __ATOMIC_RELAXED)
static inline void keel_opt_str_copy(char* dst, size_t cap, const char* src, size_t src_cap) {
  size_t n = cap < src_cap ? cap : src_cap, i = 0;
  for (; i + 1 < n && (dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED)) != 0; i++) {}
  if (n > 0) dst[i] = 0;
}
#define keel_opt_str(dst, cap, name) keel_opt_str_copy(dst, cap, _keel_options.name, sizeof _keel_options.name)
void _keel_options_init(void) KEEL_INTERNAL;
/* What a run-time option change sets in motion. */
void _keel_background_start(void) KEEL_INTERNAL; /* start the purger if not running */
void _keel_publish_option_changed(void) KEEL_INTERNAL;

#endif /* KEEL_OPTIONS_H */
