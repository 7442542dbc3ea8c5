/* thp.c -- transparent huge page policy (KEEL_THP): the advice Keel's memory gets, which
 * units a purge may take (a partial purge splits a huge page for good, so under ALWAYS,
 * and for collapsed ones, only whole huge pages go back), and which resident huge pages
 * the purger collapses (DENSE). The page heap (pageheap.c) owns the chunks and their
 * lock; core/thp.h is what each of the two files calls in the other. */
#include "core/thp.h"

static keel_thp_counts_t thp;      /* KEEL_THP=dense's huge pages (below) */
keel_chunk_t* _keel_thp_promoting; /* the chunk being collapsed: not released meanwhile */
static unsigned promote_units(void);

/* ---- the modes ------------------------------------------------------------------------
 * SYSTEM gives no advice. ALWAYS advises MADV_HUGEPAGE on every chunk and on huge blocks
 * that can hold a whole huge page; NEVER advises MADV_NOHUGEPAGE. Under ALWAYS a huge
 * page is only ever given back whole (TCMalloc Temeraire's rule): a MADV_DONTNEED on part
 * of one splits it into base pages for good, which costs the TLB reach the program asked
 * for, so the purge (pageheap.c) releases only free, huge-page-aligned huge pages and
 * slab_trim.c stops trimming the pages inside slabs. */
int _keel_thp_advice(void) {
  int policy = keel_opt(thp);
  if (policy == KEEL_THP_DENSE) /* no huge page at fault time, whatever the machine says */
    return _keel_prim_thp_machine_mode() == 2 ? -1 : 0;
  return policy == KEEL_THP_ALWAYS ? 1 : policy == KEEL_THP_NEVER ? -1 : 0;
}

/* The huge page size Keel assumes (KEEL_HUGE_PAGE_SIZE, else the OS's), rounded up to a
 * power of two so that "aligned" means something; 0 when there are none. */
size_t _keel_thp_size(void) {
  size_t hp = (size_t)keel_opt(huge_page_size);
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
  return keel_opt(thp) == KEEL_THP_ALWAYS
             ? _keel_thp_size() : 0;
}

/* KEEL_THP=always: purges the `due` units of chunk c only where they make up, with the
 * other units, a whole free huge page of `granule` bytes (each aligned, since chunks
 * are); the whole huge page is purged with one call. Units of a huge page that is
 * partly in use, or not all due, stay dirty and so stay counted as committed. The
 * first huge page of a chunk holds its header and is never purged: it goes back with
 * the chunk, which is unmapped once wholly free and all due, dirty or not. Returns bytes
 * released. */
size_t _keel_thp_purge_whole_huge_pages(keel_chunk_t* c, uint64_t due, size_t granule, bool all) {
  size_t released = 0;
  if (_keel_pageheap_release_if_free(c, due, all, &released)) return released;
  if (granule > KEEL_CHUNK_SIZE) return 0; /* no whole huge page inside a chunk */
  unsigned g = (unsigned)(granule >> KEEL_UNIT_SHIFT);
  for (unsigned k = 0; k < KEEL_CHUNK_UNITS; k += g) {
    uint64_t bits = UNIT_BITS(k, g), dirty = c->dirty_mask & bits;
    if (dirty == 0 || (c->free_mask & bits) != bits || (dirty & ~due) != 0) continue;
    released += _keel_pageheap_purge_units(c, k, g);
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

/* A chunk is going back to the OS (pageheap.c): its collapsed huge pages go with it. */
void _keel_thp_chunk_released(keel_chunk_t* c) {
  unsigned g = promote_units();
  if (c->promoted_mask && g) thp.promoted -= (uint64_t)__builtin_popcountll(c->promoted_mask) / g;
}

/* Huge page k of c is an ordinary range of base pages again (the kernel splits it at
 * the first partial purge). Lock held. */
static void demote(keel_chunk_t* c, unsigned k, unsigned g) {
  c->promoted_mask &= ~UNIT_BITS(k, g);
  thp.promoted--;
  thp.demoted++;
  if (_keel_thp_advice() < 0) _keel_prim_thp_advise(keel_unit_addr(c, k), (size_t)g << KEEL_UNIT_SHIFT, -1);
}

KEEL_COLD void _keel_pageheap_demote(const void* p, size_t units) {
  unsigned g = promote_units();
  if (g == 0) return;
  keel_chunk_t* c = keel_chunk_of(p);
  unsigned first = keel_unit_index(p);
  keel_lock(_keel_lock_pageheap);
  for (unsigned k = first / g * g; k < first + units; k += g)
    if (c->promoted_mask & UNIT_BITS(k, g)) demote(c, k, g);
  keel_unlock(_keel_lock_pageheap);
}

/* Purges each promoted huge page of c that is wholly free and due, whole, and releases c
 * if it is wholly free and due (*gone then). Lock held. Returns bytes released. */
KEEL_COLD size_t _keel_thp_purge_promoted(keel_chunk_t* c, uint64_t due, bool all, bool* gone) {
  size_t released = 0;
  if ((*gone = _keel_pageheap_release_if_free(c, due, all, &released))) return released;
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
    size_t bytes = _keel_pageheap_purge_units(c, k, g);
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
  uint64_t bits = UNIT_BITS(k, g);
  c->promoted_mask |= bits;
  _keel_pageheap_make_dirty(c, bits);
  thp.promoted++;
  _keel_thp_promoting = c;
  keel_unlock(_keel_lock_pageheap);
  void* at = keel_unit_addr(c, k);
  bool refused_by_flag = _keel_thp_advice() < 0; /* MADV_COLLAPSE refuses NOHUGEPAGE */
  if (refused_by_flag) _keel_prim_thp_advise(at, hp, 1);
  bool ok = _keel_prim_thp_collapse(at, hp);
  if (!ok && refused_by_flag) _keel_prim_thp_advise(at, hp, -1);
  keel_lock(_keel_lock_pageheap);
  _keel_thp_promoting = NULL;
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
 * looked at again at most every PROMOTE_RECHECK_MS. Purger thread only, under KEEL_THP=dense
 * (the purger tests that first: this is cold code in every other mode). */
KEEL_COLD void _keel_pageheap_promote(void) {
  if (keel_opt(thp) != KEEL_THP_DENSE) return;
  unsigned g = promote_units();
  if (g == 0) return;
  static unsigned resume_run;
  uint64_t now = _keel_prim_clock_ms();
  unsigned collapsed = 0, probes = 0, visits = 0;
  keel_lock(_keel_lock_pageheap);
  for (unsigned i = 0; i < KEEL_CHUNK_UNITS; i++) {
    unsigned r = (resume_run + i) % KEEL_CHUNK_UNITS;
    for (keel_chunk_t* c = _keel_pageheap_first_chunk(r); c != NULL; c = c->next) {
      if (collapsed == PROMOTE_PER_TICK || probes >= PROMOTE_PROBES || ++visits > PROMOTE_VISITS) {
        resume_run = r;
        keel_unlock(_keel_lock_pageheap);
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
  keel_unlock(_keel_lock_pageheap);
}

/* Read without the lock: a slab trim (the purger's, a free's, keel_purge's) that races a
 * promotion in progress may split the new huge page - a cost, not an error: the trim
 * only purges free pages, and a later pass may collapse the range again. */
__attribute__((no_sanitize("thread"))) bool _keel_pageheap_promoted(const void* p, size_t units) {
  keel_chunk_t* c = keel_chunk_of(p);
  return (__atomic_load_n(&c->promoted_mask, __ATOMIC_RELAXED) & UNIT_BITS(keel_unit_index(p), units)) != 0;
}

void _keel_thp_counts(keel_thp_counts_t* out) {
  keel_lock(_keel_lock_pageheap);
  *out = thp;
  keel_unlock(_keel_lock_pageheap);
}

/* The policy changed at run time: advise every chunk as chunk_new would now, then the
 * huge blocks. SYSTEM cannot take earlier advice back (Linux has no madvise for "no
 * advice"), so it only stops new advice. */
KEEL_COLD void _keel_thp_apply_all(void) {
  keel_lock(_keel_lock_pageheap);
  int advice = _keel_thp_advice();
  if (advice != 0)
    for (unsigned r = 0; r < KEEL_CHUNK_UNITS; r++)
      for (keel_chunk_t* c = _keel_pageheap_first_chunk(r); c != NULL; c = c->next)
        _keel_prim_thp_advise(c, KEEL_CHUNK_SIZE, advice);
  keel_unlock(_keel_lock_pageheap);
  _keel_huge_thp_apply_all();
}

