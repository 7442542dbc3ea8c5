/* pageheap.c -- spans of 64 KiB units inside 4 MiB chunks, and purging.
 *
 * Chunks sit on one of 64 lists by their longest run of free units; a request for n
 * units takes the chunk on the shortest list that fits (best fit by run length), which
 * keeps free space in long runs and packs live data into few chunks. Freed units stay
 * committed ("dirty") for the purge delay so that churn reuses them without page faults;
 * after that they are given back to the OS, and a chunk that is wholly free is unmapped.
 * One lock guards everything here; it is taken only on slab and large-block changes. */
#include "core/internal.h"

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
static keel_thp_counts_t thp;   /* KEEL_THP=dense's huge pages (below) */
static keel_chunk_t* promoting; /* the chunk being collapsed: not released meanwhile */
static unsigned promote_units(void);

#define ALL_UNITS (~(uint64_t)0)
#define UNIT_BITS(k, n) (((n) >= 64 ? ALL_UNITS : (((uint64_t)1 << (n)) - 1)) << (k))

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

/* ---- transparent huge pages (KEEL_THP) ----------------------------------------------
 * SYSTEM gives no advice. ALWAYS advises MADV_HUGEPAGE on every chunk and on huge blocks
 * that can hold a whole huge page; NEVER advises MADV_NOHUGEPAGE. Under ALWAYS a huge
 * page is only ever given back whole (TCMalloc Temeraire's rule): a MADV_DONTNEED on part
 * of one splits it into base pages for good, which costs the TLB reach the program asked
 * for, so the purge below releases only free, huge-page-aligned huge pages and
 * central.c stops trimming the pages inside slabs. */
int _keel_thp_advice(void) {
  int policy = __atomic_load_n(&_keel_options.thp, __ATOMIC_RELAXED);
  if (policy == KEEL_THP_DENSE) /* no huge page at fault time, whatever the machine says */
    return _keel_prim_thp_machine_mode() == 2 ? -1 : 0;
  return policy == KEEL_THP_ALWAYS ? 1 : policy == KEEL_THP_NEVER ? -1 : 0;
}

/* The huge page size Keel assumes (KEEL_HUGE_PAGE_SIZE, else the OS's), rounded up to a
 * power of two so that "aligned" means something; 0 when there are none. */
size_t _keel_thp_size(void) {
  size_t hp = (size_t)__atomic_load_n(&_keel_options.huge_page_size, __ATOMIC_RELAXED);
  if (hp == 0) hp = _keel_prim_huge_page_size();
  if (hp > ((size_t)1 << 40)) hp = (size_t)1 << 40; /* a nonsense override */
  if (hp & (hp - 1)) hp = (size_t)1 << (64 - __builtin_clzll((unsigned long long)hp));
  return hp;
}

/* The smallest range a purge may cover: 0 means any (SYSTEM, NEVER, or no huge pages).
 * Under ALWAYS it is the huge page size. With huge pages no larger than a unit, a unit
 * is whole huge pages and the ordinary purge splits nothing. With huge pages larger than
 * a chunk (arm64 with 64 KiB pages: 512 MiB; 16 KiB pages: 32 MiB) no chunk holds a
 * whole one; such a huge page can still form over adjacent chunks, whose mappings the
 * kernel merges, and one MADV_DONTNEED would split it into thousands of base pages. So
 * then nothing inside a chunk is purged and memory goes back as wholly free chunks
 * only: that is what asking for huge pages of that size costs. */
size_t _keel_thp_purge_granule(void) {
  return __atomic_load_n(&_keel_options.thp, __ATOMIC_RELAXED) == KEEL_THP_ALWAYS
             ? _keel_thp_size() : 0;
}

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
  unsigned dirty = (unsigned)__builtin_popcountll(c->dirty_mask), g = promote_units();
  if (c->promoted_mask && g) thp.promoted -= (uint64_t)__builtin_popcountll(c->promoted_mask) / g;
  list_remove(c);
  chunk_count--;
  dirty_units -= dirty;
  clean_free_units -= KEEL_CHUNK_UNITS - 1 - dirty;
  _keel_pagemap_set((uintptr_t)c, KEEL_CHUNK_UNITS, KEEL_KIND_NONE);
  _keel_prim_unmap(c, KEEL_CHUNK_SIZE);
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
  c->units[k].units = (uint8_t)n;
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

keel_slab_t* _keel_pageheap_alloc(size_t n, size_t align, bool* zeroed) {
  keel_assert(n >= 1 && n < KEEL_CHUNK_UNITS);
  keel_lock(&heap_lock);
  keel_chunk_t* c = NULL;
  int k = -1;
  for (size_t r = n; r < KEEL_CHUNK_UNITS && k < 0; r++)
    for (c = by_run[r]; c != NULL; c = c->next)
      if ((k = find_run(c->free_mask, c->dirty_mask, n, align)) >= 0) break;
  if (k < 0) {
    c = chunk_new();
    if (c) k = find_run(c->free_mask, c->dirty_mask, n, align);
    if (k < 0) {
      keel_unlock(&heap_lock);
      return NULL;
    }
  }
  list_remove(c);
  *zeroed = take_units(c, (unsigned)k, n);
  list_insert(c);
  keel_slab_t* head = &c->units[k];
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
  if (now - last_purge_ms >= _keel_options.purge_delay_ms / 2 + 1) purge_locked(false, now);
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
    head->units = (uint8_t)n;
    list_insert(c);
    ok = true;
  }
  keel_unlock(&heap_lock);
  return ok;
}

void _keel_pageheap_shrink(keel_slab_t* head, size_t n) {
  keel_chunk_t* c = chunk_of_slab(head);
  unsigned k = (unsigned)(head - c->units);
  size_t old = head->units;
  if (n >= old) return;
  uint64_t now = _keel_prim_clock_ms();
  keel_lock(&heap_lock);
  list_remove(c);
  give_units(c, (unsigned)(k + n), old - n, now);
  head->units = (uint8_t)n;
  list_insert(c);
  keel_unlock(&heap_lock);
}

/* Gives back units [k, k+n) of chunk c, free and dirty, with one call; they become clean.
 * Returns the bytes released (0 if the OS refused). Lock held. */
static size_t purge_units(keel_chunk_t* c, unsigned k, unsigned n) {
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
static bool release_if_free(keel_chunk_t* c, uint64_t due, bool all, size_t* released) {
  if (c == promoting || c->free_mask != (ALL_UNITS & ~(uint64_t)1) || (c->dirty_mask & ~due) != 0 ||
      !(all || chunk_count > 1))
    return false;
  *released += (size_t)__builtin_popcountll(c->dirty_mask) << KEEL_UNIT_SHIFT;
  chunk_release(c);
  return true;
}

/* KEEL_THP=always: purges the `due` units of chunk c only where they make up, with the
 * other units, a whole free huge page of `granule` bytes (each aligned, since chunks
 * are); the whole huge page is purged with one call. Units of a huge page that is
 * partly in use, or not all due, stay dirty and so stay counted as committed. The
 * first huge page of a chunk holds its header and is never purged: it goes back with
 * the chunk, which is unmapped once wholly free and all due, dirty or not. Returns bytes
 * released. */
static size_t purge_whole_huge_pages(keel_chunk_t* c, uint64_t due, size_t granule, bool all) {
  size_t released = 0;
  if (release_if_free(c, due, all, &released)) return released;
  if (granule > KEEL_CHUNK_SIZE) return 0; /* no whole huge page inside a chunk */
  unsigned g = (unsigned)(granule >> KEEL_UNIT_SHIFT);
  for (unsigned k = 0; k < KEEL_CHUNK_UNITS; k += g) {
    uint64_t bits = UNIT_BITS(k, g), dirty = c->dirty_mask & bits;
    if (dirty == 0 || (c->free_mask & bits) != bits || (dirty & ~due) != 0) continue;
    released += purge_units(c, k, g);
  }
  return released;
}

/* ---- KEEL_THP=dense: huge pages by promotion -----------------------------------------
 * Under ALWAYS the kernel backs a whole huge page at the first touch of any byte in it,
 * so the unused tail of every huge page Keel has touched is resident: bench/ programs
 * held 3-5 MiB more, the lab's sphinx 14 % more. DENSE gives no huge page at fault time
 * and lets the purger collapse, a few a tick, the huge pages that are already in use
 * and resident (MADV_COLLAPSE: the copy is the purger's, no allocating thread waits for
 * it). A collapsed ("promoted") huge page is then treated as ALWAYS treats every one:
 * given back only whole, never trimmed or meshed, so it stays a huge page while it is in
 * use, until a quarter of it is free (or a slab in it half empty: central.c), when it
 * goes back to base pages. The RSS cost is the pages that were not resident, at most
 * 1/16 of each. */
#define PROMOTE_RECHECK_MS 5000 /* a chunk is looked at again at most this often */
#define PROMOTE_PER_TICK 4      /* collapses a tick: a copy of 2 MiB each on x86-64 */
#define PROMOTE_VISITS 4096     /* chunks walked a tick, lock held: about 100 us */
#define PROMOTE_PROBES 16       /* residency reads (mincore) a tick */

/* Units per huge page that promotion works with, or 0 when it cannot: no huge pages,
 * huge pages no bigger than a page or a unit, or bigger than a chunk (arm64 with 16 or
 * 64 KiB pages: no chunk holds one), or the machine's setting is "never". */
static unsigned promote_units(void) {
  size_t hp = _keel_thp_size();
  if (hp <= _keel_page_size || hp <= KEEL_UNIT_SIZE || hp > KEEL_CHUNK_SIZE) return 0;
  if (_keel_prim_thp_machine_mode() == 0) return 0;
  return (unsigned)(hp >> KEEL_UNIT_SHIFT);
}

/* Huge page k of c is an ordinary range of base pages again (the kernel splits it at
 * the first partial purge). Lock held. */
static void demote(keel_chunk_t* c, unsigned k, unsigned g) {
  c->promoted_mask &= ~UNIT_BITS(k, g);
  thp.promoted--;
  thp.demoted++;
  if (_keel_thp_advice() < 0) _keel_prim_thp_advise(keel_unit_addr(c, k), (size_t)g << KEEL_UNIT_SHIFT, -1);
}

void _keel_pageheap_demote(const void* p, size_t units) {
  unsigned g = promote_units();
  if (g == 0) return;
  keel_chunk_t* c = keel_chunk_of(p);
  unsigned first = keel_unit_index(p);
  keel_lock(&heap_lock);
  for (unsigned k = first / g * g; k < first + units; k += g)
    if (c->promoted_mask & UNIT_BITS(k, g)) demote(c, k, g);
  keel_unlock(&heap_lock);
}

/* Purges each promoted huge page of c that is wholly free and due, whole, and releases c
 * if it is wholly free and due (*gone then). Lock held. Returns bytes released. */
static size_t purge_promoted(keel_chunk_t* c, uint64_t due, bool all, bool* gone) {
  size_t released = 0;
  if ((*gone = release_if_free(c, due, all, &released))) return released;
  unsigned g = promote_units();
  if (g == 0) return 0; /* the huge page size changed: keep them until the chunk goes */
  for (unsigned k = 0; k < KEEL_CHUNK_UNITS; k += g) {
    uint64_t bits = UNIT_BITS(k, g), dirty = c->dirty_mask & bits;
    if (!(c->promoted_mask & bits)) continue;
    /* A quarter of it free for the purge delay: memory matters more than the TLB here,
     * so it goes back to base pages and its free units are purged as usual. */
    if ((c->free_mask & bits) != bits && (unsigned)__builtin_popcountll(dirty & due) >= g / 4) {
      demote(c, k, g);
      continue;
    }
    if ((c->free_mask & bits) != bits || (dirty & ~due) != 0) continue;
    size_t bytes = purge_units(c, k, g);
    if (bytes == 0 && dirty != 0) continue; /* the OS refused */
    released += bytes;
    demote(c, k, g);
    thp.demoted--; /* released whole, not demoted */
    thp.released++;
  }
  return released;
}

/* The first huge page of c worth collapsing: not promoted yet, at most 1/8 of its units
 * free, and at least 15/16 of its pages resident (mincore, counted in *probes); or
 * KEEL_CHUNK_UNITS. Lock held. */
static unsigned promote_pick(keel_chunk_t* c, unsigned g, unsigned* probes) {
  size_t hp = (size_t)g << KEEL_UNIT_SHIFT, pages = hp / _keel_page_size;
  for (unsigned k = 0; k < KEEL_CHUNK_UNITS; k += g) {
    uint64_t bits = UNIT_BITS(k, g);
    if ((c->promoted_mask & bits) || (unsigned)__builtin_popcountll(c->free_mask & bits) > g / 8) continue;
    ++*probes;
    size_t resident = _keel_prim_resident_pages(keel_unit_addr(c, k), hp);
    if (resident != SIZE_MAX && resident * 16 >= pages * 15) return k;
  }
  return KEEL_CHUNK_UNITS;
}

/* Marks huge page k of c promoted and collapses it outside the lock (c cannot be
 * released meanwhile). Its free units become dirty: the collapse makes them resident.
 * If the OS refuses, the huge page is left as it was. Lock held on entry and exit. */
static void promote(keel_chunk_t* c, unsigned k, unsigned g) {
  size_t hp = (size_t)g << KEEL_UNIT_SHIFT;
  uint64_t bits = UNIT_BITS(k, g), clean = c->free_mask & ~c->dirty_mask & bits;
  c->promoted_mask |= bits;
  c->dirty_mask |= clean;
  dirty_units += (uint64_t)__builtin_popcountll(clean);
  clean_free_units -= (uint64_t)__builtin_popcountll(clean);
  thp.promoted++;
  promoting = c;
  keel_unlock(&heap_lock);
  void* at = keel_unit_addr(c, k);
  bool refused_by_flag = _keel_thp_advice() < 0; /* MADV_COLLAPSE refuses NOHUGEPAGE */
  if (refused_by_flag) _keel_prim_thp_advise(at, hp, 1);
  bool ok = _keel_prim_thp_collapse(at, hp);
  if (!ok && refused_by_flag) _keel_prim_thp_advise(at, hp, -1);
  keel_lock(&heap_lock);
  promoting = NULL;
  if (ok) {
    thp.collapses++;
  } else { /* in base pages: its free units may be purged apart again */
    thp.refused++;
    if (c->promoted_mask & bits) { /* (a purge meanwhile may have demoted it already) */
      thp.promoted--;
      c->promoted_mask &= ~bits;
    }
  }
}

/* Collapses up to PROMOTE_PER_TICK huge pages that are in use and resident. Each call
 * walks at most PROMOTE_VISITS chunks and reads residency at most PROMOTE_PROBES times
 * (the lock is held meanwhile), starting where the previous call stopped; a chunk is
 * looked at again at most every PROMOTE_RECHECK_MS. Purger thread only. */
void _keel_pageheap_promote(void) {
  if (__atomic_load_n(&_keel_options.thp, __ATOMIC_RELAXED) != KEEL_THP_DENSE) return;
  unsigned g = promote_units();
  if (g == 0) return;
  static unsigned resume_run;
  uint64_t now = _keel_prim_clock_ms();
  unsigned collapsed = 0, probes = 0, visits = 0;
  keel_lock(&heap_lock);
  for (unsigned i = 0; i < KEEL_CHUNK_UNITS; i++) {
    unsigned r = (resume_run + i) % KEEL_CHUNK_UNITS;
    for (keel_chunk_t* c = by_run[r]; c != NULL; c = c->next) {
      if (collapsed == PROMOTE_PER_TICK || probes >= PROMOTE_PROBES || ++visits > PROMOTE_VISITS) {
        resume_run = r;
        keel_unlock(&heap_lock);
        return;
      }
      if (now - c->promote_ms < PROMOTE_RECHECK_MS) continue;
      unsigned k = promote_pick(c, g, &probes);
      if (k == KEEL_CHUNK_UNITS) {
        c->promote_ms = now; /* nothing here for a while */
        continue;
      }
      promote(c, k, g); /* c may have moved to another list meanwhile: fine, go on */
      collapsed++;
    }
  }
  resume_run = 0;
  keel_unlock(&heap_lock);
}

/* Read without the lock: promotion and slab trimming both run on the purger thread. */
__attribute__((no_sanitize("thread"))) bool _keel_pageheap_promoted(const void* p, size_t units) {
  keel_chunk_t* c = keel_chunk_of(p);
  return (__atomic_load_n(&c->promoted_mask, __ATOMIC_RELAXED) & UNIT_BITS(keel_unit_index(p), units)) != 0;
}

void _keel_thp_counts(keel_thp_counts_t* out) {
  keel_lock(&heap_lock);
  *out = thp;
  keel_unlock(&heap_lock);
}

/* Gives back dirty free units freed at least the purge delay ago (all of them if
 * `all`), and unmaps chunks left wholly free and clean. Returns bytes released. */
static size_t purge_locked(bool all, uint64_t now) {
  return purge_older(_keel_options.purge_delay_ms, all, now);
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
  purge_older(_keel_options.purge_delay_ms / 8, false, now);
}
/* Units k..k+n-1 of c were a large block: purged now if free units are over the cap
 * (never parts of a huge page: KEEL_THP=always and dense give those back whole). */
static void purge_large_over_cap(keel_chunk_t* c, unsigned k, unsigned n) {
  if (!over_cap() || _keel_thp_purge_granule() > KEEL_UNIT_SIZE || (c->promoted_mask & UNIT_BITS(k, n))) return;
  size_t released = purge_units(c, k, n);
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
        released += purge_whole_huge_pages(c, due, granule, all);
        continue;
      }
      if (c->promoted_mask) { /* KEEL_THP=dense: collapsed huge pages go back whole */
        bool gone = false;
        released += purge_promoted(c, due, all, &gone);
        if (gone) continue;
        due &= c->dirty_mask & ~c->promoted_mask;
      }
      while (due) { /* purge each run of due units with one call */
        unsigned k = (unsigned)__builtin_ctzll(due);
        uint64_t rest = ~(due >> k); /* 0 when every unit from k up is due */
        unsigned n = rest ? (unsigned)__builtin_ctzll(rest) : 64 - k;
        released += purge_units(c, k, n);
        due &= ~UNIT_BITS(k, n);
      }
      release_if_free(c, 0, all, &released); /* once clean */
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
  if (now - __atomic_load_n(&last_purge_ms, __ATOMIC_RELAXED) < _keel_options.purge_delay_ms / 4)
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

/* The policy changed at run time: advise every chunk as chunk_new would now, then the
 * huge blocks. SYSTEM cannot take earlier advice back (Linux has no madvise for "no
 * advice"), so it only stops new advice. */
KEEL_COLD void _keel_thp_apply_all(void) {
  keel_lock(&heap_lock);
  int advice = _keel_thp_advice();
  if (advice != 0)
    for (unsigned r = 0; r < KEEL_CHUNK_UNITS; r++)
      for (keel_chunk_t* c = by_run[r]; c != NULL; c = c->next)
        _keel_prim_thp_advise(c, KEEL_CHUNK_SIZE, advice);
  keel_unlock(&heap_lock);
  _keel_huge_thp_apply_all();
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

/* For the invariant walk (verify.c), which holds the page heap lock. */
keel_chunk_t* _keel_pageheap_first_chunk(unsigned run) { return by_run[run]; }
