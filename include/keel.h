/* keel.h -- the public API of libkeel, a memory allocator for database servers.
 *
 * libkeel replaces the C allocator (malloc, free, ... and C++ operator new/delete) when
 * preloaded (LD_PRELOAD=libkeel.so) or linked. This header declares only what Keel adds
 * on top of the standard API: statistics and control. Everything here is safe to call
 * from any thread at any time after the first allocation.
 */
#ifndef KEEL_H
#define KEEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KEEL_API __attribute__((visibility("default")))
#else
#define KEEL_API
#endif

#define KEEL_VERSION_MAJOR 0
#define KEEL_VERSION_MINOR 1
#define KEEL_VERSION_PATCH 0

/* Version of the running library as "major.minor.patch". */
KEEL_API const char* keel_version(void);

/* Statistics. The struct is versioned: callers set `size` to sizeof(keel_stats_t)
 * (and Keel fills only what both sides know), so a program built against an older
 * header keeps working with a newer library. All byte figures are in bytes. */
#define KEEL_STATS_VERSION 1
typedef struct keel_stats_s {
  uint32_t version;        /* set by Keel: KEEL_STATS_VERSION */
  uint32_t size;           /* set by the caller: sizeof(keel_stats_t) */
  uint64_t allocated;      /* live bytes handed to the program (usable sizes) */
  uint64_t active;         /* bytes in slabs and spans that hold live blocks */
  uint64_t cached;         /* free blocks held in thread caches and central lists */
  uint64_t mapped;         /* address space Keel has mapped for blocks, committed or not */
  uint64_t committed;      /* of `mapped`, bytes not returned to the OS (upper bound of RSS) */
  uint64_t retained;       /* of `mapped`, bytes returned to the OS but kept reserved */
  uint64_t metadata;       /* bytes used by Keel's own bookkeeping */
  uint64_t huge_allocated; /* live bytes in blocks mapped directly */
  uint64_t purged_bytes;   /* total bytes returned to the OS so far */
  uint64_t purge_runs;     /* number of purge passes that returned memory */
  uint64_t threads;        /* live threads that have used Keel (with a thread cache or,
                              while young, without one) */
  uint64_t threads_total;  /* threads that have used Keel so far */
  uint64_t os_page_size;   /* page size read from the OS at start-up */
  uint64_t huge_page_size; /* transparent huge page size Keel assumes (0: none) */
} keel_stats_t;

/* Fills *out (out->size must be set). Returns 0, or -1 if out is NULL or too small. */
KEEL_API int keel_stats_get(keel_stats_t* out);

/* Per size class figures. utilisation = blocks_in_use * block_size / slab_bytes. */
typedef struct keel_class_stats_s {
  uint64_t block_size;    /* bytes per block */
  uint64_t blocks_in_use; /* blocks the program holds */
  uint64_t blocks_cached; /* free blocks in thread caches and transfer caches */
  uint64_t slabs;         /* slabs of this class */
  uint64_t slab_bytes;    /* bytes of those slabs */
} keel_class_stats_t;

/* Fills up to `max` entries (smallest class first); returns the number of classes. */
KEEL_API size_t keel_stats_classes(keel_class_stats_t* out, size_t max);

/* Lock statistics, one entry per kind of lock (all size classes' central locks are
 * one entry): how often it was taken, how often a thread found it held (and spun or
 * slept), and how often a thread slept in the kernel waiting for it. Counted always
 * (by the holder, at the cost of an increment); they show whether Keel's shared
 * structures are a bottleneck for a workload. */
typedef struct keel_lock_stats_s {
  const char* name; /* "central", "page heap", "huge", "threads", "metadata", "page map",
                       "profile", "quarantine" */
  uint64_t acquired;
  uint64_t contended;
  uint64_t sleeps;
} keel_lock_stats_t;

/* Fills up to `max` entries; returns the number of entries there are. */
KEEL_API size_t keel_stats_locks(keel_lock_stats_t* out, size_t max);

/* What meshing (docs/meshing.md) could give back, estimated from the live slab bitmaps
 * without moving anything. Per size class up to 2 KiB: the class's OS pages, those
 * holding no block in use (the purger already returns them once idle), and how many
 * more pages would be freed by meshing pages of equal index in different slabs whose
 * blocks in use do not overlap: in pairs, or in groups of up to 8 (randomized first
 * fit, 256 probes a page, pages over 90 % used skipped). `views` is the pages that would
 * map a shared page (every page of a group). Pairs prefer to keep a slab's partner from
 * one page to the next, so that a run of views can be one kernel mapping: `pair_runs`
 * counts those runs, the mappings pairs need (each may split its slab's mapping once
 * more). Blocks in thread and transfer caches count as in use. Pages are the OS page
 * size (keel_stats_t.os_page_size). */
typedef struct keel_mesh_estimate_s {
  uint64_t block_size;
  uint64_t pages;         /* OS pages in the class's slabs */
  uint64_t free_pages;    /* pages whose blocks are all free */
  uint64_t candidates;    /* pages in use, at most 90 % full, in partly used slabs */
  uint64_t pair_saved;    /* pages meshing in pairs would free */
  uint64_t pair_views;
  uint64_t pair_runs;     /* runs of consecutive views with the same partner */
  uint64_t group_saved;   /* pages meshing up to 8 pages together would free */
  uint64_t group_views;
} keel_mesh_estimate_t;

/* Fills up to `max` entries (classes with slabs, smallest first); returns how many it
 * filled. Runs in the caller: each class's lock is held while its bitmaps are copied,
 * the matching runs unlocked (tens of milliseconds for a gigabyte of slabs). Returns 0
 * with 64 KiB OS pages, where a page is a whole slab unit and meshing is refused. */
KEEL_API size_t keel_mesh_estimate(keel_mesh_estimate_t* out, size_t max);

/* Meshing (KEEL_MESH=on; docs/meshing.md): the purger lets pages of 2 to 8 slabs of a
 * size class whose blocks in use sit at different offsets share one physical page.
 * VmRSS counts such a page once per view, and PSS misses views not read since they
 * were made: RssAnon + RssFile + file_bytes below is the memory held. */
enum {
  KEEL_MESH_STATE_OFF = 0,     /* KEEL_MESH is off */
  KEEL_MESH_STATE_ON = 1,      /* on, and running */
  KEEL_MESH_STATE_REFUSED = 2, /* on, but impossible here (no write barrier, no memory
                                  file, 64 KiB pages, checked mode): see the warning */
  KEEL_MESH_STATE_CHILD = 3,   /* a forked child: its parent owns the views */
};
typedef struct keel_mesh_stats_s {
  uint32_t state;       /* KEEL_MESH_STATE_* */
  uint32_t barrier;     /* write barrier: 0 none (yet), 1 user mode, 2 kernel */
  uint64_t groups;      /* file pages shared by views now (2 to 8 views each) */
  uint64_t views;       /* views now: each a kernel mapping (vm.max_map_count) */
  uint64_t view_limit;  /* views the mapping budget allows (a third of the limit) */
  uint64_t file_bytes;  /* memory the mesh file holds */
  uint64_t meshed;      /* pages given back by meshing since start (k views: k - 1) */
  uint64_t failed;      /* operations given up (the kernel refused a step) */
  uint64_t eroded;      /* views found written since (their page is private again) */
  uint64_t left;        /* views replaced by fresh memory once their blocks were free */
  uint64_t released;    /* file pages given back once no view read them */
  uint64_t longest_ns;  /* the longest operation: writers to its two pages waited */
  uint64_t busy_ns;     /* time spent in operations (barrier armed) */
} keel_mesh_stats_t;
KEEL_API void keel_mesh_stats(keel_mesh_stats_t* out);
/* Runs a meshing pass now in the calling thread (every sparse class, no time limit);
 * returns the pages it gave back. 0 when KEEL_MESH is off or meshing is refused. */
KEEL_API size_t keel_mesh_now(void);

/* Writes the statistics (totals and per class) as one JSON object into buf, NUL-
 * terminated if size > 0. Returns the length the whole document needs (like snprintf);
 * if that is >= size the output was cut. */
KEEL_API size_t keel_stats_json(char* buf, size_t size);

/* Writes a human-readable summary to file descriptor fd (no stdio is used). */
KEEL_API void keel_stats_print(int fd);

/* Returns free memory to the OS now (what the purge timer would do later).
 * Returns the number of bytes released. */
KEEL_API size_t keel_purge(void);

/* Heap profiling (KEEL_PROFILE_RATE=N samples about one allocation per N bytes).
 * Writes the live sampled allocations to `path` in the pprof heap format that
 * `go tool pprof` and `pprof` read. Returns 0, or -1 if profiling is off or the file
 * cannot be written. */
KEEL_API int keel_profile_dump(const char* path);

/* Flushes the calling thread's cache of free blocks back to the shared lists. */
KEEL_API void keel_thread_flush(void);

/* Options. Every option is also an environment variable KEEL_<NAME> (`keel options`
 * lists them with their defaults and meanings). Names: purge_delay, tcache_max,
 * huge_page_size, thp, stats, background_purge, check, check_guard, publish,
 * profile_rate, profile_growth, profile_at_exit, profile_leaks, profile_prefix.
 *
 * A program may define its own defaults, read once at start-up, before the environment
 * (which wins, so an operator can still override the program):
 *     const char* keel_conf = "purge_delay:250,thp:never";
 * ("name:value" or "name=value", comma-separated). Under LD_PRELOAD the program must
 * export the symbol (link with libkeel, or with -rdynamic). */
KEEL_API extern const char* keel_conf;

/* Sets an option while the program runs; the value is text, as in the environment
 * ("250", "4M", "on", "never"). Returns 0, ENOENT for an unknown name, EINVAL for a bad
 * value, or EBUSY for one that can only be chosen at start-up: check, huge_page_size,
 * and profile_rate from or to 0 (a different non-zero rate may be set). */
KEEL_API int keel_option_set(const char* name, const char* value);

/* Copies an option's current value as text into buf (sizes in bytes, durations in
 * milliseconds, booleans 1/0). Returns 0, ENOENT, or ERANGE if buf is too small. */
KEEL_API int keel_option_get(const char* name, char* buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* KEEL_H */
