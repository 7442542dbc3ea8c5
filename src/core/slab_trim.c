/* slab_trim.c -- the free pages inside slabs given back to the OS, and the purger's pass
 * over the central lists.
 *
 * A slab goes back to the page heap only once every block of it is free, and after
 * deletes most of a heap's memory sits in slabs that still hold a few live blocks: the
 * pages of those slabs that hold free blocks only are purged here - on the purger's
 * timer once no block has come back to the slab for the purge delay (every tick for big
 * blocks, and by their frees every 16 ms), by the free that empties them in a class gone
 * cold, and at once for keel_purge and fork. Its own file because none of it is on a
 * take or a put of a batch (central.c): it runs on the purger's thread, or on a put's
 * cold branch or a big block's. */
#include "core/slab.h"

static uint64_t trimmed_bytes; /* returned to the OS from inside partly used slabs */

/* True if blocks first..last of slab s are all free (a word of the bitmap at a time). */
static bool blocks_free(const keel_slab_t* s, uint32_t count, size_t first, size_t last) {
  for (size_t w = first / 64; w <= last / 64; w++) {
    uint64_t want = ~(uint64_t)0;
    if (w == first / 64) want &= ~(uint64_t)0 << (first % 64);
    if (w == last / 64 && last % 64 != 63) want &= ((uint64_t)1 << (last % 64 + 1)) - 1;
    if ((keel_slab_word(s, count, (unsigned)w) & want) != want) return false;
  }
  return true;
}

/* Free pages are purged on the purger's timer once nothing came back to their slab for
 * the purge delay (_keel_central_decay). But a server that deletes or overwrites at
 * random frees into every slab of a class all the time, and when the class takes
 * nothing from its slabs meanwhile (Redis replacing 1 KiB values by smaller ones),
 * nothing else will use the pages its frees empty: those are purged by the free that
 * empties them, once the class has taken nothing for `_keel_cold_ticks`. A class
 * that takes again stops it, so churn in a busy class never pays madvise and a
 * refault per page. 0 until the purger runs (never without it). */
uint32_t _keel_cold_ticks;

/* True if the OS page at offset off of slab s holds free blocks only (a block that spans
 * two pages keeps both), or only the slab's unused tail. */
bool _keel_slab_page_free(const keel_slab_t* s, const keel_class_t* k, size_t off) {
  size_t first = off / k->size, last = (off + _keel_page_size - 1) / k->size;
  if (first >= k->count) return true;
  return blocks_free(s, k->count, first, last < k->count ? last : k->count - 1);
}

/* Purges bytes [from, from + len) of slab s, if any. A meshed slab's views among them
 * become fresh memory first (meshing's hook: only meshing marks a slab meshed, and it
 * sets the hook before). */
static void purge_run(keel_slab_t* s, size_t from, size_t len) {
  if (len == 0) return;
  char* base = (char*)slab_base(keel_chunk_of(s), s);
  if (s->meshed) __atomic_load_n(&_keel_central_unmesh, __ATOMIC_RELAXED)(base + from, len);
  if (_keel_prim_purge(base + from, len)) __atomic_fetch_add(&trimmed_bytes, len, __ATOMIC_RELAXED);
}

/* Lock held: block idx of slab s (which still holds live blocks) just came back; purges
 * the OS pages under it that now hold free blocks only. */
static void purge_pages_of_block(const keel_class_t* k, keel_slab_t* s, size_t idx) {
  size_t page = _keel_page_size, start = idx * k->size, from = 0, len = 0;
  for (size_t off = start & ~(page - 1); off < start + k->size; off += page) {
    if (!_keel_slab_page_free(s, k, off)) continue;
    if (len == 0) from = off;
    len += page;
  }
  purge_run(s, from, len);
}

/* KEEL_THP=always: a slab (at most 1 MiB) never holds a whole huge page, so trimming
 * its pages would only split the huge page around it. The slabs keep needs_trim and
 * are trimmed if the policy changes back. */
static bool pages_trimmable(void) { return _keel_thp_purge_granule() <= _keel_page_size; }

static bool purge_allowed(keel_slab_t* s) {
  return !s->meshed && pages_trimmable() &&
         !_keel_pageheap_promoted(slab_base(keel_chunk_of(s), s), s->units);
}

void _keel_slab_purge_freed(const keel_class_t* k, keel_slab_t* s, unsigned w, uint64_t mask) {
  if (!purge_allowed(s)) return;
  for (uint64_t m = mask; m != 0; m &= m - 1)
    purge_pages_of_block(k, s, (size_t)w * 64 + (size_t)__builtin_ctzll(m));
}

/* Lock held: the batches parked on lines idle for idle_ticks (0: all) go back to their
 * slabs. */
static void drain_transfer(keel_central_t* cl, unsigned cls, uint32_t now, uint32_t idle_ticks) {
  uint32_t n;
  void* list;
  while ((list = _keel_transfer_take_idle(cls, now, idle_ticks, &n)) != NULL) _keel_slab_put_list(cl, cls, list);
}

/* Lock held. Purges every OS page of slab s whose blocks are all free in the slab (a
 * block that spans two pages keeps both). After deletes, most memory sits in slabs
 * that still hold a few live blocks: this is how it goes back to the OS. Out of line:
 * one copy serves both passes below, whose cost is the madvise calls. */
static KEEL_NOINLINE void trim_slab(unsigned cls, keel_slab_t* s) {
  const keel_class_t* k = &_keel_classes[cls];
  size_t page = _keel_page_size, bytes = (size_t)s->units << KEEL_UNIT_SHIFT;
  size_t run_start = 0, run_len = 0;
  for (size_t off = 0; off < bytes; off += page) {
    if (_keel_slab_page_free(s, k, off)) {
      if (run_len == 0) run_start = off;
      run_len += page;
    } else {
      purge_run(s, run_start, run_len);
      run_len = 0;
    }
  }
  purge_run(s, run_start, run_len);
  s->needs_trim = 0;
}

/* KEEL_THP=dense: a slab in a huge page Keel collapsed is trimmed only once at most half
 * of its blocks are in use; the huge page then goes back to base pages (trimming a few
 * pages out of a dense huge page would cost its TLB reach for little memory). */
static bool trim_allowed(unsigned cls, keel_slab_t* s) {
  void* base = slab_base(keel_chunk_of(s), s);
  if (!_keel_pageheap_promoted(base, s->units)) return true;
  if (s->used * 2 > _keel_classes[cls].count) return false;
  _keel_pageheap_demote(base, s->units);
  return true;
}

size_t _keel_central_purge_all(uint32_t max_trims) {
  uint64_t before = __atomic_load_n(&trimmed_bytes, __ATOMIC_RELAXED);
  bool trim = pages_trimmable();
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    if (!_keel_central_active(cls)) continue;
    keel_central_t* cl = keel_central_of(cls);
    _keel_central_lock_class(cl);
    drain_transfer(cl, cls, 0, 0);
    /* An empty slab kept to avoid churn is released; the free pages of the others are
     * purged without waiting for their slab to go quiet. */
    for (int sampled = 0; sampled < 2; sampled++) {
      keel_slab_t* next;
      for (keel_slab_t* s = sampled ? cl->sampled_partial : _keel_partial_first(cl); s != NULL; s = next) {
        next = _keel_partial_next(cl, s);
        if (_keel_slab_release_empty(cl, cls, s)) continue;
        if (trim && s->needs_trim && max_trims > 0 && trim_allowed(cls, s)) {
          max_trims--;
          trim_slab(cls, s);
        }
      }
    }
    _keel_central_unlock_class(cl);
  }
  return (size_t)(__atomic_load_n(&trimmed_bytes, __ATOMIC_RELAXED) - before);
}

/* Slabs of a class trimmed per tick while blocks keep coming back to them (a cold class,
 * see _keel_cold_ticks, or one of big blocks): each costs a few madvise calls under the
 * class's lock, so this bounds the lock hold. */
#define BUSY_TRIM_SLABS 256

__attribute__((no_sanitize("thread"))) void _keel_central_decay(uint64_t idle_ticks) {
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  uint32_t cold = idle_ticks / 2 < 2 ? 2 : (uint32_t)(idle_ticks / 2);
  __atomic_store_n(&_keel_cold_ticks, cold, __ATOMIC_RELAXED);
  bool trim = pages_trimmable();
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    if (!_keel_central_active(cls)) continue;
    keel_central_t* cl = keel_central_of(cls); /* after: before, it may be the zero entry */
    bool parked = _keel_transfer_any(cls);
    if (!parked && __atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) == 0 &&
        __atomic_load_n(&cl->sampled_partial, __ATOMIC_RELAXED) == NULL)
      continue;
    _keel_central_lock_class(cl);
    if (parked) drain_transfer(cl, cls, now, (uint32_t)idle_ticks);
    /* A slab is trimmed once no block has come back to it for idle_ticks; in a cold
     * class, whose frees purge what they empty from now on, also the pages emptied
     * before it went cold, each slab once per idle_ticks. A slab of big blocks (four
     * pages and more) is trimmed every tick while blocks come back: under a steady load
     * its slabs are never quiet, and each class's free blocks above what its threads
     * hold at once stayed resident (docs/design.md, "Giving memory back"). */
    bool big = keel_class_big(&_keel_classes[cls]);
    bool busy_ok = big || now - __atomic_load_n(&cl->take_tick, __ATOMIC_RELAXED) >= cold;
    unsigned busy_budget = BUSY_TRIM_SLABS;
    for (int sampled = 0; sampled < 2; sampled++)
      for (keel_slab_t* s = sampled ? cl->sampled_partial : _keel_partial_first(cl); s != NULL;
           s = _keel_partial_next(cl, s)) {
        if (!trim || !s->needs_trim) continue;
        bool quiet = now - s->put_tick >= idle_ticks;
        if (!quiet && (!busy_ok || busy_budget == 0 || (!big && (int32_t)(now - s->busy_trim_tick) < 0))) continue;
        if (!trim_allowed(cls, s)) continue;
        if (!quiet) {
          busy_budget--;
          if (!big) s->busy_trim_tick = now + (uint32_t)idle_ticks;
        }
        trim_slab(cls, s);
      }
    _keel_central_unlock_class(cl);
  }
}

/* The tick alone left a big class's free blocks above what its threads held at once
 * resident for most of a tick (a quarter of the purge delay); so a free also trims its
 * slab, at most once per BIG_TRIM_MS, which bounds the madvise calls and refaults a
 * thread that takes and frees one big block in a loop pays. */
#define BIG_TRIM_MS 16
void _keel_slab_trim_on_free(unsigned cls, keel_slab_t* s) {
  uint32_t now = (uint32_t)_keel_prim_clock_ms();
  if (now - s->free_trim_ms < BIG_TRIM_MS) return; /* (the put has just set needs_trim) */
  s->free_trim_ms = now;
  if (pages_trimmable() && trim_allowed(cls, s)) trim_slab(cls, s);
}

uint64_t _keel_central_trimmed_bytes(void) { return __atomic_load_n(&trimmed_bytes, __ATOMIC_RELAXED); }
