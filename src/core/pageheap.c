/* pageheap.c -- spans of 64 KiB units inside 4 MiB chunks, and purging.
 *
 * Chunks sit on one of 64 lists by their longest run of free units; a request for n
 * units takes the chunk on the shortest list that fits (best fit by run length), which
 * keeps free space in long runs and packs live data into few chunks. Freed units stay
 * committed ("dirty") for the purge delay so that churn reuses them without page faults;
 * after that they are given back to the OS, and a chunk that is wholly free is unmapped.
 * One lock guards everything here; it is taken only on slab and large-block changes.
 * What transparent huge pages change here (advice, which units may be purged, collapsing)
 * is decided in thp.c. */
#include "core/thp.h"

static keel_lock_t heap_lock KEEL_ALWAYS_BSS = KEEL_LOCK_INIT;
keel_lock_t* const _keel_lock_pageheap = &heap_lock; /* statistics (stats.c) */
static keel_chunk_t* by_run[KEEL_CHUNK_UNITS]; /* chunks by longest free run */
static uint64_t chunk_count;
static uint64_t dirty_units;      /* free units that may hold committed pages */
static uint64_t clean_free_units; /* free units known to hold no pages */
static uint64_t taken_units;      /* units ever handed out as spans */
static uint64_t purged_bytes, purge_runs;
static uint64_t last_purge_ms;
static void* next_hint;

/* KEEL_OWN_LINES: the chunk each line holds, and the purger tick of the line's last
 * slab; a line without a new slab for two ticks no longer keeps its chunk from others. */
static keel_chunk_t* line_chunk[KEEL_TRANSFER_LINES];
static uint32_t line_tick[KEEL_TRANSFER_LINES];

static unsigned longest_run(uint64_t m) {
  unsigned n = 0;
  while (m) {
    m &= m << 1;
    n++;
  }
  return n;
}

/* Lowest unit k such that units k..k+n-1 are free and k is a multiple of `align`. */
/* The first unit of a run of n free units (aligned to `align` units), -1 if none: the
 * lowest run whose units are all dirty if there is one, else the one with the most
 * dirty units at its start, else the lowest. Memory freed a moment ago is still
 * resident: a span that takes it costs no page faults and leaves the clean units clean,
 * where taking the lowest run spread a server's churn of large blocks and slabs over
 * every free unit of its chunks until the purge delay ran out. */
static int find_run(uint64_t free_mask, uint64_t dirty_mask, size_t n, size_t align) {
  uint64_t m = free_mask;
  for (size_t i = 1; i < n && m; i++) m &= free_mask >> i;
  if (align > 1) {
    uint64_t allowed = 0;
    for (size_t k = 0; k < KEEL_CHUNK_UNITS; k += align) allowed |= (uint64_t)1 << k;
    m &= allowed;
  }
  if (m == 0) return -1;
  uint64_t warm = m & dirty_mask;
  for (size_t i = 1; i < n && (warm & (dirty_mask >> i)); i++) warm &= dirty_mask >> i;
  return __builtin_ctzll(warm ? warm : m);
}

static void list_remove(keel_chunk_t* c) {
  if (c->prev) c->prev->next = c->next;
  else by_run[c->run] = c->next;
  if (c->next) c->next->prev = c->prev;
  c->next = c->prev = NULL;
}

static void list_insert(keel_chunk_t* c) {
  c->run = longest_run(c->free_mask);
  if (c->run >= KEEL_CHUNK_UNITS) c->run = KEEL_CHUNK_UNITS - 1;
  c->prev = NULL;
  c->next = by_run[c->run];
  if (c->next) c->next->prev = c;
  by_run[c->run] = c;
}

static size_t purge_locked(bool all, uint64_t now);
static size_t purge_older(uint64_t delay, bool all, uint64_t now);
static void purge_to_cap(uint64_t now);
static void purge_large_over_cap(keel_chunk_t* c, unsigned k, unsigned n);

static keel_chunk_t* chunk_new(void) {
  if (!_keel_pagemap_reserve()) return NULL;
  keel_chunk_t* c = (keel_chunk_t*)_keel_prim_map(KEEL_CHUNK_SIZE, KEEL_CHUNK_SIZE, next_hint);
  if (c == NULL) {
    /* Out of address space or memory (RLIMIT_AS, overcommit): give back everything
     * retained — free chunks and cached huge mappings — and try once more. */
    purge_locked(true, _keel_prim_clock_ms());
    _keel_huge_purge(true);
    c = (keel_chunk_t*)_keel_prim_map(KEEL_CHUNK_SIZE, KEEL_CHUNK_SIZE, NULL);
    if (c == NULL) return NULL;
  }
  /* Before the header is touched, so that its first fault can already be a huge page. */
  _keel_prim_thp_advise(c, KEEL_CHUNK_SIZE, _keel_thp_advice());
  if (!_keel_pagemap_set((uintptr_t)c, KEEL_CHUNK_UNITS, KEEL_KIND_NONE)) {
    _keel_prim_unmap(c, KEEL_CHUNK_SIZE);
    return NULL;
  }
  next_hint = (char*)c + KEEL_CHUNK_SIZE;
  c->magic = KEEL_CHUNK_MAGIC;
  c->free_mask = ALL_UNITS & ~(uint64_t)1; /* unit 0 is this header */
  c->dirty_mask = 0;                        /* fresh units hold no pages */
  /* The unit descriptors stay untouched (zero) until used, so a new chunk costs one
   * page of header, not 36 KiB: a free unit's head is only read once it is in a span. */
  c->units[0].state = KEEL_UNIT_LARGE; /* never handed out */
  chunk_count++;
  clean_free_units += KEEL_CHUNK_UNITS - 1;
  list_insert(c);
  return c;
}

/* A wholly free chunk goes back to the OS; its units may still be dirty under
 * KEEL_THP=always, which releases chunks without purging them first. */
static void chunk_release(keel_chunk_t* c) {
  unsigned dirty = (unsigned)__builtin_popcountll(c->dirty_mask);
  if (c->holder != 0) line_chunk[c->holder - 1] = NULL;
  _keel_thp_chunk_released(c);
  list_remove(c);
  chunk_count--;
  dirty_units -= dirty;
  clean_free_units -= KEEL_CHUNK_UNITS - 1 - dirty;
  _keel_pagemap_set((uintptr_t)c, KEEL_CHUNK_UNITS, KEEL_KIND_NONE);
  _keel_prim_unmap(c, KEEL_CHUNK_SIZE);
}

/* A span's length in units and, for a large block, in bytes: set together under the
 * lock, so the invariant walk never sees one without the other. */
static void span_set_length(keel_slab_t* head, size_t n) {
  head->units = (uint8_t)n;
  head->size = (uint64_t)n << KEEL_UNIT_SHIFT;
}

/* Marks units k..k+n-1 of c as one span; returns whether they were all clean. */
static bool take_units(keel_chunk_t* c, unsigned k, size_t n) {
  uint64_t bits = UNIT_BITS(k, n);
  bool clean = (c->dirty_mask & bits) == 0;
  unsigned dirty = (unsigned)__builtin_popcountll(c->dirty_mask & bits);
  dirty_units -= dirty;
  clean_free_units -= n - dirty;
  c->free_mask &= ~bits;
  c->dirty_mask &= ~bits;
  taken_units += n;
  for (size_t i = 0; i < n; i++) {
    keel_slab_t* u = &c->units[k + i];
    u->head = (uint8_t)k;
    u->state = KEEL_UNIT_LARGE; /* callers set the real state on the head */
  }
  span_set_length(&c->units[k], n);
  return clean;
}

static void give_units(keel_chunk_t* c, unsigned k, size_t n, uint64_t now) {
  uint64_t bits = UNIT_BITS(k, n);
  for (size_t i = 0; i < n; i++) {
    keel_slab_t* u = &c->units[k + i];
    u->state = KEEL_UNIT_FREE;
    u->head = (uint8_t)(k + i);
    u->size = now; /* when it was freed: the purge delay counts from here */
  }
  c->free_mask |= bits;
  c->dirty_mask |= bits;
  dirty_units += n;
}

/* Lock held: the units run k..k+n-1 of c become a span. */
static keel_slab_t* take_span(keel_chunk_t* c, int k, size_t n, bool* zeroed) {
  list_remove(c);
  *zeroed = take_units(c, (unsigned)k, n);
  list_insert(c);
  return &c->units[k];
}

/* Whether c is held by a line other than `line` that made a slab in the last two ticks
 * (line KEEL_TRANSFER_LINES: no line's request, for which nothing is held). */
static bool held_by_other(const keel_chunk_t* c, unsigned line, uint32_t now) {
  if (c->holder == 0 || c->holder == line + 1u || line >= KEEL_TRANSFER_LINES) return false;
  return now - line_tick[c->holder - 1] < 2;
}

/* Lock held: the best-fitting chunk with a run of n free units (aligned), skipping those
 * a working line other than `line` holds (none skipped for KEEL_TRANSFER_LINES); with
 * `resident`, only a run of units still resident, else a new chunk if none fits. *k < 0
 * if none. */
static keel_chunk_t* chunk_fitting(size_t n, size_t align, unsigned line, bool resident, int* k) {
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  for (size_t r = n; r < KEEL_CHUNK_UNITS; r++)
    for (keel_chunk_t* c = by_run[r]; c != NULL; c = c->next)
      if (!held_by_other(c, line, now) &&
          (*k = find_run(resident ? c->free_mask & c->dirty_mask : c->free_mask, c->dirty_mask, n, align)) >= 0)
        return c;
  *k = -1;
  keel_chunk_t* c = resident ? NULL : chunk_new();
  if (c != NULL) *k = find_run(c->free_mask, c->dirty_mask, n, align);
  return c;
}

keel_slab_t* _keel_pageheap_alloc(size_t n, size_t align, bool* zeroed) {
  keel_assert(n >= 1 && n < KEEL_CHUNK_UNITS);
  keel_lock(&heap_lock);
  int k;
  keel_chunk_t* c = chunk_fitting(n, align, KEEL_TRANSFER_LINES, false, &k);
  keel_slab_t* head = k >= 0 ? take_span(c, k, n, zeroed) : NULL;
  keel_unlock(&heap_lock);
  return head;
}

KEEL_COLD keel_slab_t* _keel_pageheap_alloc_for_line(size_t n, unsigned line, bool* zeroed) {
  keel_assert(n >= 1 && n < KEEL_CHUNK_UNITS && line < KEEL_TRANSFER_LINES);
  keel_lock(&heap_lock);
  line_tick[line] = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  /* Resident units before fresh ones (the line's own, then those of a chunk no working
   * line holds), so that the line's memory is no more than it uses. */
  keel_chunk_t* own = line_chunk[line]; /* a chunk's hold and its line's entry change together */
  keel_assert(own == NULL || own->holder == line + 1u);
  keel_chunk_t* c = own;
  int k = own != NULL ? find_run(own->free_mask & own->dirty_mask, own->dirty_mask, n, 1) : -1;
  if (k < 0) c = chunk_fitting(n, 1, line, true, &k);
  if (k < 0 && own != NULL) k = find_run((c = own)->free_mask, own->dirty_mask, n, 1);
  if (k < 0) c = chunk_fitting(n, 1, line, false, &k);
  if (k < 0) c = chunk_fitting(n, 1, KEEL_TRANSFER_LINES, false, &k); /* no new chunk: any */
  if (k >= 0 && c != own) {
    if (own != NULL) own->holder = 0;
    if (c->holder != 0) line_chunk[c->holder - 1] = NULL;
    c->holder = line + 1u;
    line_chunk[line] = c;
  }
  keel_slab_t* head = k >= 0 ? take_span(c, k, n, zeroed) : NULL;
  keel_unlock(&heap_lock);
  return head;
}

static keel_chunk_t* chunk_of_slab(keel_slab_t* s) { return keel_chunk_of(s); }

void _keel_pageheap_free(keel_slab_t* head) {
  keel_chunk_t* c = chunk_of_slab(head);
  unsigned k = (unsigned)(head - c->units);
  uint64_t now = _keel_prim_clock_ms();
  bool large = head->state == KEEL_UNIT_LARGE;
  unsigned n = head->units;
  keel_lock(&heap_lock);
  list_remove(c);
  give_units(c, k, n, now);
  list_insert(c);
  if (large) purge_large_over_cap(c, k, n);
  if (now - last_purge_ms >= keel_opt(purge_delay_ms) / 2 + 1) purge_locked(false, now);
  else purge_to_cap(now);
  keel_unlock(&heap_lock);
}

bool _keel_pageheap_grow_in_place(keel_slab_t* head, size_t n) {
  keel_chunk_t* c = chunk_of_slab(head);
  unsigned k = (unsigned)(head - c->units);
  size_t old = head->units;
  if (k + n > KEEL_CHUNK_UNITS) return false;
  bool ok = false;
  keel_lock(&heap_lock);
  uint64_t extra = UNIT_BITS(k + old, n - old);
  if ((c->free_mask & extra) == extra) {
    list_remove(c);
    take_units(c, (unsigned)(k + old), n - old);
    for (size_t i = old; i < n; i++) c->units[k + i].head = (uint8_t)k;
    span_set_length(head, n);
    list_insert(c);
    ok = true;
  }
  keel_unlock(&heap_lock);
  return ok;
}

/* Cold: a large block shrunk in place by whole units is rare; the hot text has no room. */
KEEL_COLD void _keel_pageheap_shrink(keel_slab_t* head, size_t n) {
  keel_chunk_t* c = chunk_of_slab(head);
  unsigned k = (unsigned)(head - c->units);
  size_t old = head->units;
  if (n >= old) return;
  uint64_t now = _keel_prim_clock_ms();
  keel_lock(&heap_lock);
  list_remove(c);
  give_units(c, (unsigned)(k + n), old - n, now);
  span_set_length(head, n);
  list_insert(c);
  keel_unlock(&heap_lock);
}

/* Gives back units [k, k+n) of chunk c, free and dirty, with one call; they become clean.
 * Returns the bytes released (0 if the OS refused). Lock held. */
size_t _keel_pageheap_purge_units(keel_chunk_t* c, unsigned k, unsigned n) {
  uint64_t bits = UNIT_BITS(k, n);
  unsigned dirty = (unsigned)__builtin_popcountll(c->dirty_mask & bits);
  if (!_keel_prim_purge(keel_unit_addr(c, k), (size_t)n << KEEL_UNIT_SHIFT)) return 0;
  c->dirty_mask &= ~bits;
  dirty_units -= dirty;
  clean_free_units += dirty;
  return (size_t)dirty << KEEL_UNIT_SHIFT;
}

/* Releases c if it is wholly free and every dirty unit is due, keeping one wholly free
 * chunk for the next slab unless `all` (and never the chunk being promoted). Returns
 * whether it went; *released grows by its dirty bytes. Lock held. */
bool _keel_pageheap_release_if_free(keel_chunk_t* c, uint64_t due, bool all, size_t* released) {
  if (c == _keel_thp_promoting || c->free_mask != (ALL_UNITS & ~(uint64_t)1) || (c->dirty_mask & ~due) != 0 ||
      !(all || chunk_count > 1))
    return false;
  *released += (size_t)__builtin_popcountll(c->dirty_mask) << KEEL_UNIT_SHIFT;
  chunk_release(c);
  return true;
}

/* The free units among `bits` of c that were clean become dirty: a huge page collapsed
 * over them made them resident (thp.c). Lock held. */
void _keel_pageheap_make_dirty(keel_chunk_t* c, uint64_t bits) {
  uint64_t clean = c->free_mask & ~c->dirty_mask & bits;
  c->dirty_mask |= clean;
  dirty_units += (uint64_t)__builtin_popcountll(clean);
  clean_free_units -= (uint64_t)__builtin_popcountll(clean);
}

/* Gives back dirty free units freed at least the purge delay ago (all of them if
 * `all`), and unmaps chunks left wholly free and clean. Returns bytes released. */
static size_t purge_locked(bool all, uint64_t now) {
  return purge_older(keel_opt(purge_delay_ms), all, now);
}

/* Free units that may hold pages are purged once freed for the purge delay, and sooner
 * once there are more of them than an eighth of the units in spans (at least a MiB):
 * those freed more than an eighth of the delay ago, and a large block's units as it is
 * freed (as glibc unmaps its big blocks): a server that churns large blocks kept every
 * unit it had freed in the last second resident (docs/design.md, "Giving memory back").
 * A slab's units wait: a program that takes and empties slabs in turn reuses them within
 * milliseconds. Heap lock held. */
#define DIRTY_SHARE 8
#define DIRTY_MIN_UNITS 16
static uint64_t last_cap_ms;
static bool over_cap(void) {
  uint64_t in_spans = chunk_count * (KEEL_CHUNK_UNITS - 1) - dirty_units - clean_free_units;
  uint64_t cap = in_spans / DIRTY_SHARE > DIRTY_MIN_UNITS ? in_spans / DIRTY_SHARE : DIRTY_MIN_UNITS;
  return dirty_units > cap;
}
static void purge_to_cap(uint64_t now) {
  if (!over_cap() || now == last_cap_ms) return; /* at most one pass a millisecond */
  last_cap_ms = now;
  purge_older(keel_opt(purge_delay_ms) / 8, false, now);
}
/* Units k..k+n-1 of c were a large block: purged now if free units are over the cap
 * (never parts of a huge page: KEEL_THP=always and dense give those back whole). */
static void purge_large_over_cap(keel_chunk_t* c, unsigned k, unsigned n) {
  if (!over_cap() || _keel_thp_purge_granule() > KEEL_UNIT_SIZE || (c->promoted_mask & UNIT_BITS(k, n))) return;
  size_t released = _keel_pageheap_purge_units(c, k, n);
  if (released) {
    purged_bytes += released;
    purge_runs++;
  }
}

static size_t purge_older(uint64_t delay, bool all, uint64_t now) {
  size_t released = 0;
  last_purge_ms = now;
  size_t granule = _keel_thp_purge_granule();
  if (granule <= KEEL_UNIT_SIZE) granule = 0; /* a unit is whole huge pages */
  for (unsigned r = 0; r < KEEL_CHUNK_UNITS; r++) {
    keel_chunk_t* next;
    for (keel_chunk_t* c = by_run[r]; c != NULL; c = next) {
      next = c->next;
      uint64_t due = 0;
      for (uint64_t d = c->dirty_mask; d; d &= d - 1) {
        unsigned u = (unsigned)__builtin_ctzll(d);
        if (all || now - c->units[u].size >= delay) due |= (uint64_t)1 << u;
      }
      if (granule) { /* KEEL_THP=always */
        released += _keel_thp_purge_whole_huge_pages(c, due, granule, all);
        continue;
      }
      if (c->promoted_mask) { /* KEEL_THP=dense: collapsed huge pages go back whole */
        bool gone = false;
        released += _keel_thp_purge_promoted(c, due, all, &gone);
        if (gone) continue;
        due &= c->dirty_mask & ~c->promoted_mask;
      }
      while (due) { /* purge each run of due units with one call */
        unsigned k = (unsigned)__builtin_ctzll(due);
        uint64_t rest = ~(due >> k); /* 0 when every unit from k up is due */
        unsigned n = rest ? (unsigned)__builtin_ctzll(rest) : 64 - k;
        released += _keel_pageheap_purge_units(c, k, n);
        due &= ~UNIT_BITS(k, n);
      }
      _keel_pageheap_release_if_free(c, 0, all, &released); /* once clean */
    }
  }
  if (released) {
    purged_bytes += released;
    purge_runs++;
  }
  return released;
}

size_t _keel_pageheap_purge(bool all) {
  keel_lock(&heap_lock);
  size_t n = purge_locked(all, _keel_prim_clock_ms());
  keel_unlock(&heap_lock);
  return n;
}

/* The unlocked reads here are hints (the purger rechecks under the lock). */
__attribute__((no_sanitize("thread"))) void _keel_pageheap_maybe_purge(void) {
  uint64_t now = _keel_prim_clock_ms();
  if (__atomic_load_n(&dirty_units, __ATOMIC_RELAXED) == 0) return;
  if (now - __atomic_load_n(&last_purge_ms, __ATOMIC_RELAXED) < keel_opt(purge_delay_ms) / 4)
    return;
  keel_lock(&heap_lock);
  purge_locked(false, now);
  keel_unlock(&heap_lock);
}

__attribute__((no_sanitize("thread"))) uint64_t _keel_pageheap_dirty_bytes(void) {
  return __atomic_load_n(&dirty_units, __ATOMIC_RELAXED) << KEEL_UNIT_SHIFT;
}

/* Bytes ever handed out as spans (the forked child's purger waits for them, init.c). */
__attribute__((no_sanitize("thread"))) uint64_t _keel_pageheap_taken_bytes(void) {
  return __atomic_load_n(&taken_units, __ATOMIC_RELAXED) << KEEL_UNIT_SHIFT;
}

void _keel_pageheap_lock_all(void) { keel_lock(&heap_lock); }
void _keel_pageheap_unlock_all(void) { keel_unlock(&heap_lock); }
void _keel_pageheap_reset_locks(void) { keel_lock_reset(&heap_lock); }

KEEL_COLD void _keel_pageheap_stats(keel_stats_t* out) {
  keel_lock(&heap_lock);
  uint64_t mapped = chunk_count * KEEL_CHUNK_SIZE;
  out->mapped += mapped;
  out->retained += clean_free_units * KEEL_UNIT_SIZE;
  out->committed += mapped - clean_free_units * KEEL_UNIT_SIZE;
  out->metadata += chunk_count * sizeof(keel_chunk_t);
  out->purged_bytes += purged_bytes;
  out->purge_runs += purge_runs;
  keel_unlock(&heap_lock);
}

/* For the invariant walk (verify.c) and thp.c, which hold the page heap lock. */
keel_chunk_t* _keel_pageheap_first_chunk(unsigned run) { return by_run[run]; }
