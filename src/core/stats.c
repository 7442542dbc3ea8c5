/* stats.c -- statistics, gathered on demand from the structures that already exist
 * (central counts, thread cache bins, page heap masks), so the fast paths keep no
 * counters at all. */
#include "core/internal.h"

#define LOCK_KINDS 8 /* entries of keel_stats_locks */

uint64_t _keel_large_live_bytes(void);

/* A class without slabs has no blocks anywhere (a block in a cache keeps its slab), so
 * there is nothing to report, and taking its lock would write to its line of
 * _keel_central_slots: locking all 127 classes for one statistics snapshot dirtied 32 KiB of
 * otherwise untouched memory in every process (the purger publishes a snapshot after
 * the first second). A racy read is enough: a class that gets its first slab meanwhile
 * is reported as it was a moment before. */
__attribute__((no_sanitize("thread"))) static bool class_empty(const keel_central_t* cl) {
  return __atomic_load_n(&cl->slabs, __ATOMIC_RELAXED) == 0 &&
         __atomic_load_n(&cl->carved_blocks, __ATOMIC_RELAXED) == 0;
}

void _keel_stats_collect(keel_stats_t* out) {
  memset(out, 0, sizeof *out);
  out->version = KEEL_STATS_VERSION;
  out->size = sizeof *out;
  keel_ensure_init();
  uint64_t in_slabs = 0, slab_bytes = 0, transfer = 0;
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    keel_central_t* cl = keel_central_of(cls);
    const keel_class_t* k = &_keel_classes[cls];
    if (class_empty(cl)) continue;
    _keel_central_lock_class(cl);
    /* Holes carved out of this class's slabs count as the blocks carved from them. */
    in_slabs += (_keel_central_out(cl) - cl->carved_from) * k->size + (uint64_t)cl->carved_blocks * k->size;
    slab_bytes += cl->slabs * k->units * KEEL_UNIT_SIZE;
    transfer += (uint64_t)_keel_central_parked_blocks(cls) * k->size;
    _keel_central_unlock_class(cl);
  }
  uint64_t in_caches = 0;
  _keel_tcache_stats(out, &in_caches);
  /* Freed blocks held in the checked mode's quarantine are cached, not allocated. */
  uint64_t quarantined_small, quarantined_big;
  _keel_checked_quarantine_bytes(&quarantined_small, &quarantined_big);
  uint64_t cached = transfer + in_caches + quarantined_small;
  uint64_t large = _keel_large_live_bytes();
  out->allocated = (in_slabs > cached ? in_slabs - cached : 0) + large;
  out->active = slab_bytes + large;
  out->cached = cached;
  _keel_pageheap_stats(out);
  _keel_huge_stats(out); /* adds huge blocks to allocated/active/mapped/committed */
  out->allocated = out->allocated > quarantined_big ? out->allocated - quarantined_big : 0;
  out->cached += quarantined_big;
  out->metadata += _keel_meta_bytes();
  out->purged_bytes += _keel_central_trimmed_bytes();
  out->os_page_size = _keel_page_size;
  out->huge_page_size =
      _keel_options.huge_page_size ? _keel_options.huge_page_size : _keel_prim_huge_page_size();
}

static void line(keel_buf_t* b, const char* name, uint64_t v) {
  _keel_buf_str(b, "keel:   ");
  _keel_buf_str(b, name);
  size_t n = strlen(name);
  _keel_buf_pad(b, b->len + (n < 16 ? 16 - n : 1)); /* at least one space after a long name */
  _keel_buf_u64(b, v);
  _keel_buf_str(b, "\n");
}

static void print_stats(int fd, const char* title) {
  keel_stats_t s;
  _keel_stats_collect(&s);
  char text[3072];
  keel_buf_t b = {text, 0, sizeof text};
  _keel_buf_str(&b, "keel: statistics (pid ");
  _keel_buf_u64(&b, (uint64_t)_keel_prim_getpid());
  _keel_buf_str(&b, ") ");
  _keel_buf_str(&b, title);
  _keel_buf_str(&b, "\n");
  line(&b, "allocated", s.allocated);
  line(&b, "active", s.active);
  line(&b, "cached", s.cached);
  line(&b, "mapped", s.mapped);
  line(&b, "committed", s.committed);
  line(&b, "retained", s.retained);
  line(&b, "metadata", s.metadata);
  line(&b, "huge_allocated", s.huge_allocated);
  line(&b, "purged_bytes", s.purged_bytes);
  line(&b, "purge_runs", s.purge_runs);
  line(&b, "threads", s.threads);
  line(&b, "threads_total", s.threads_total);
  line(&b, "caches_taken_back", __atomic_load_n(&_keel_caches_taken_back, __ATOMIC_RELAXED));
  line(&b, "gathers", __atomic_load_n(&_keel_gathers, __ATOMIC_RELAXED));
  line(&b, "blocks_gathered", __atomic_load_n(&_keel_blocks_gathered, __ATOMIC_RELAXED));
  line(&b, "os_page_size", s.os_page_size);
  line(&b, "huge_page_size", s.huge_page_size);
  uint64_t borrowed = _keel_central_borrowed_blocks();
  if (borrowed) line(&b, "borrowed_blocks", borrowed); /* borrow.c: holes lent from larger classes' slabs */
  uint64_t carved = _keel_central_carved_holes();
  if (carved) line(&b, "carved_holes", carved); /* borrow.c: holes carved into smaller blocks */
  keel_thp_counts_t thp;
  _keel_thp_counts(&thp);
  if (thp.collapses || thp.refused) { /* KEEL_THP=dense */
    line(&b, "thp_promoted", thp.promoted);
    line(&b, "thp_collapses", thp.collapses);
    line(&b, "thp_refused", thp.refused);
    line(&b, "thp_released", thp.released);
    line(&b, "thp_demoted", thp.demoted);
  }
  /* Locks that were ever taken: acquisitions, and how many found the lock held. */
  keel_lock_stats_t ls[LOCK_KINDS];
  keel_stats_locks(ls, LOCK_KINDS);
  _keel_buf_str(&b, "keel: locks (acquired / contended / slept)\n");
  for (unsigned i = 0; i < LOCK_KINDS; i++) {
    if (ls[i].acquired <= 1) continue; /* only our own read */
    _keel_buf_str(&b, "keel:   ");
    _keel_buf_str(&b, ls[i].name);
    _keel_buf_pad(&b, b.len + (16 - strlen(ls[i].name)));
    _keel_buf_u64(&b, ls[i].acquired);
    _keel_buf_str(&b, " / ");
    _keel_buf_u64(&b, ls[i].contended);
    _keel_buf_str(&b, " / ");
    _keel_buf_u64(&b, ls[i].sleeps);
    _keel_buf_str(&b, "\n");
  }
  _keel_prim_write(fd, text, b.len);
}

void _keel_stats_at_exit(void) { print_stats(2, "at exit"); }

KEEL_API int keel_stats_get(keel_stats_t* out) {
  if (out == NULL || out->size < 2 * sizeof(uint32_t)) return -1;
  keel_stats_t s;
  _keel_stats_collect(&s);
  size_t n = out->size < sizeof s ? out->size : sizeof s;
  s.size = (uint32_t)n;
  memcpy(out, &s, n);
  return 0;
}

KEEL_API void keel_stats_print(int fd) { print_stats(fd, "now"); }

KEEL_API size_t keel_stats_classes(keel_class_stats_t* out, size_t max) {
  keel_ensure_init();
  uint64_t in_caches[KEEL_NUM_CLASSES] = {0};
  _keel_tcache_class_counts(in_caches);
  size_t n = 0;
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES && n < max; cls++, n++) {
    keel_central_t* cl = keel_central_of(cls);
    const keel_class_t* k = &_keel_classes[cls];
    if (class_empty(cl)) {
      out[n] = (keel_class_stats_t){.block_size = k->size, .blocks_cached = in_caches[cls]};
      continue;
    }
    _keel_central_lock_class(cl);
    uint64_t cached = in_caches[cls] + _keel_central_parked_blocks(cls);
    out[n].block_size = k->size;
    out[n].blocks_cached = cached;
    uint64_t out_blocks = _keel_central_out(cl) - cl->carved_from + cl->carved_blocks;
    out[n].blocks_in_use = out_blocks > cached ? out_blocks - cached : 0;
    out[n].slabs = cl->slabs;
    out[n].slab_bytes = cl->slabs * k->units * KEEL_UNIT_SIZE;
    _keel_central_unlock_class(cl);
  }
  return KEEL_NUM_CLASSES - 1;
}

KEEL_API size_t keel_stats_locks(keel_lock_stats_t* out, size_t max) {
  keel_ensure_init();
  keel_lock_stats_t all[LOCK_KINDS] = {{"central", 0, 0, 0}};
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) _keel_central_lock_read(cls, &all[0]);
  static const char* const names[LOCK_KINDS] = {"central", "page heap", "huge", "threads",
                                                "metadata", "page map", "profile", "quarantine"};
  keel_lock_t* const locks[LOCK_KINDS] = {NULL, _keel_lock_pageheap, _keel_lock_huge, _keel_lock_threads,
                                          _keel_lock_meta, _keel_lock_pagemap, _keel_lock_profile,
                                          _keel_lock_quarantine};
  for (unsigned i = 0; i < LOCK_KINDS; i++) {
    all[i].name = names[i];
    if (locks[i]) _keel_lock_read(locks[i], &all[i]);
    if (i < max) out[i] = all[i];
  }
  return LOCK_KINDS;
}

static void json_field(keel_buf_t* b, const char* name, uint64_t v, bool comma) {
  _keel_buf_str(b, "\"");
  _keel_buf_str(b, name);
  _keel_buf_str(b, "\":");
  _keel_buf_u64(b, v);
  if (comma) _keel_buf_str(b, ",");
}

/* Formats into a large enough stack buffer, then copies what fits. */
KEEL_API size_t keel_stats_json(char* out, size_t size) {
  keel_stats_t s;
  _keel_stats_collect(&s);
  keel_class_stats_t cs[KEEL_NUM_CLASSES - 1];
  size_t n = keel_stats_classes(cs, KEEL_NUM_CLASSES - 1);
  char text[24 * 1024];
  keel_buf_t b = {text, 0, sizeof text};
  _keel_buf_str(&b, "{\"version\":");
  _keel_buf_u64(&b, KEEL_STATS_VERSION);
  _keel_buf_str(&b, ",\"pid\":");
  _keel_buf_u64(&b, (uint64_t)_keel_prim_getpid());
  _keel_buf_str(&b, ",");
  json_field(&b, "allocated", s.allocated, true);
  json_field(&b, "active", s.active, true);
  json_field(&b, "cached", s.cached, true);
  json_field(&b, "mapped", s.mapped, true);
  json_field(&b, "committed", s.committed, true);
  json_field(&b, "retained", s.retained, true);
  json_field(&b, "metadata", s.metadata, true);
  json_field(&b, "huge_allocated", s.huge_allocated, true);
  json_field(&b, "purged_bytes", s.purged_bytes, true);
  json_field(&b, "purge_runs", s.purge_runs, true);
  json_field(&b, "threads", s.threads, true);
  json_field(&b, "threads_total", s.threads_total, true);
  json_field(&b, "caches_taken_back", __atomic_load_n(&_keel_caches_taken_back, __ATOMIC_RELAXED), true);
  json_field(&b, "gathers", __atomic_load_n(&_keel_gathers, __ATOMIC_RELAXED), true);
  json_field(&b, "blocks_gathered", __atomic_load_n(&_keel_blocks_gathered, __ATOMIC_RELAXED), true);
  json_field(&b, "os_page_size", s.os_page_size, true);
  json_field(&b, "huge_page_size", s.huge_page_size, true);
  json_field(&b, "borrowed_blocks", _keel_central_borrowed_blocks(), true);
  json_field(&b, "carved_holes", _keel_central_carved_holes(), true);
  keel_lock_stats_t ls[LOCK_KINDS];
  keel_stats_locks(ls, LOCK_KINDS);
  _keel_buf_str(&b, "\"locks\":{");
  for (unsigned i = 0; i < LOCK_KINDS; i++) {
    _keel_buf_str(&b, i ? ",\"" : "\"");
    _keel_buf_str(&b, ls[i].name);
    _keel_buf_str(&b, "\":{");
    json_field(&b, "acquired", ls[i].acquired, true);
    json_field(&b, "contended", ls[i].contended, true);
    json_field(&b, "sleeps", ls[i].sleeps, false);
    _keel_buf_str(&b, "}");
  }
  _keel_buf_str(&b, "},");
  _keel_buf_str(&b, "\"classes\":[");
  bool first = true;
  for (size_t i = 0; i < n; i++) {
    if (cs[i].slabs == 0 && cs[i].blocks_cached == 0 && cs[i].blocks_in_use == 0) continue; /* unused */
    if (!first) _keel_buf_str(&b, ",");
    first = false;
    _keel_buf_str(&b, "{");
    json_field(&b, "block_size", cs[i].block_size, true);
    json_field(&b, "blocks_in_use", cs[i].blocks_in_use, true);
    json_field(&b, "blocks_cached", cs[i].blocks_cached, true);
    json_field(&b, "slabs", cs[i].slabs, true);
    json_field(&b, "slab_bytes", cs[i].slab_bytes, false);
    _keel_buf_str(&b, "}");
  }
  _keel_buf_str(&b, "]}");
  if (size > 0) {
    size_t c = b.len < size - 1 ? b.len : size - 1;
    memcpy(out, text, c);
    out[c] = 0;
  }
  return b.len;
}

KEEL_API const char* keel_version(void) { return "0.1.0"; }

KEEL_API size_t keel_purge(void) {
  keel_ensure_init();
  _keel_tcache_thread_flush();
  if (keel_opt(tcache_idle_ms) != 0) _keel_tcache_take_back_idle(0); /* every thread not in malloc or free now */
  return _keel_purge_now(UINT32_MAX);
}

KEEL_API void keel_thread_flush(void) { _keel_tcache_thread_flush(); }
