/* huge.c -- blocks above KEEL_LARGE_MAX, each in its own mapping.
 *
 * Their descriptors live in a hash table keyed by address, not in a header before the
 * block: any alignment works, and a stray pointer never makes Keel read unmapped
 * memory. Freed mappings are kept (committed) in a small cache for the purge delay
 * while big blocks are in demand (cache_cold), because a program that allocates big
 * buffers tends to do so again soon, and a fresh mapping costs a page fault per page.
 * realloc uses mremap: no copy. */
#include "core/internal.h"

typedef struct huge_entry_s {
  uintptr_t addr; /* 0: empty slot */
  size_t size;    /* usable bytes (mapping size) */
} huge_entry_t;

#define CACHE_SLOTS 32
#define CACHE_MAX_BYTES ((size_t)128 << 20) /* committed memory the cache may hold */
typedef struct cached_map_s {
  void* addr;
  size_t size;
  uint64_t freed_ms;
} cached_map_t;

static keel_lock_t huge_lock KEEL_ALWAYS_BSS = KEEL_LOCK_INIT;
keel_lock_t* const _keel_lock_huge = &huge_lock; /* statistics (stats.c) */
static huge_entry_t* table;
static size_t table_cap;  /* power of two */
static size_t table_used;
static cached_map_t cache[CACHE_SLOTS];
static size_t cache_count;
static uint64_t live_bytes, cached_bytes, huge_purged;
static uint64_t live_blocks; /* huge_lock held */
static uint64_t taken_bytes; /* ever handed out, for the forked child's purger (init.c) */
static uint32_t thp_epoch; /* bumped by every run-time KEEL_THP change (huge lock held) */
static uint64_t last_take_ms; /* the last huge allocation or growth (huge lock held) */

/* True if [a, a + n) holds a whole aligned huge page: otherwise the kernel cannot back
 * any of it with one, and advice would only cost a system call (and split the mapping).
 * When the huge page size is unknown the advice is given anyway. */
static bool holds_huge_page(uintptr_t a, size_t n) {
  size_t hp = _keel_thp_size();
  if (hp == 0) return true;
  uintptr_t first = (a + hp - 1) & ~(uintptr_t)(hp - 1);
  return first >= a && first - a <= n && n - (first - a) >= hp;
}

/* Applies the KEEL_THP policy to the mapping [p, p + n). Mappings keep their advice when
 * mremap grows or moves them, so only one that newly holds a whole huge page needs it
 * again. */
static void thp_advise(void* p, size_t n) {
  int advice = _keel_thp_advice();
  if (advice != 0 && holds_huge_page((uintptr_t)p, n)) _keel_prim_thp_advise(p, n, advice);
}

static size_t slot_of(uintptr_t a, size_t cap) {
  uint64_t h = (uint64_t)a * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 32) & (cap - 1);
}

static bool table_grow(void) {
  size_t cap = table_cap ? table_cap * 2 : 256;
  size_t bytes = cap * sizeof(huge_entry_t);
  huge_entry_t* t = (huge_entry_t*)_keel_prim_map((bytes + _keel_page_size - 1) & ~(_keel_page_size - 1), 0, NULL);
  if (t == NULL) return false;
  for (size_t i = 0; i < table_cap; i++) {
    if (table[i].addr == 0) continue;
    size_t j = slot_of(table[i].addr, cap);
    while (t[j].addr != 0) j = (j + 1) & (cap - 1);
    t[j] = table[i];
  }
  if (table) _keel_prim_unmap(table, (table_cap * sizeof(huge_entry_t) + _keel_page_size - 1) & ~(_keel_page_size - 1));
  table = t;
  table_cap = cap;
  return true;
}

static huge_entry_t* table_find(uintptr_t a) {
  if (table_cap == 0) return NULL;
  for (size_t j = slot_of(a, table_cap);; j = (j + 1) & (table_cap - 1)) {
    if (table[j].addr == a) return &table[j];
    if (table[j].addr == 0) return NULL;
  }
}

static bool table_insert(uintptr_t a, size_t size) {
  if ((table_used + 1) * 4 > table_cap * 3 && !table_grow()) return false;
  size_t j = slot_of(a, table_cap);
  while (table[j].addr != 0) j = (j + 1) & (table_cap - 1);
  table[j].addr = a;
  table[j].size = size;
  table_used++;
  return true;
}

/* Linear-probing delete by moving later entries back into the hole. */
static void table_remove(huge_entry_t* e) {
  size_t i = (size_t)(e - table), mask = table_cap - 1;
  table[i].addr = 0;
  table_used--;
  for (size_t j = (i + 1) & mask; table[j].addr != 0; j = (j + 1) & mask) {
    size_t home = slot_of(table[j].addr, table_cap);
    bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
    if (movable) {
      table[i] = table[j];
      table[j].addr = 0;
      i = j;
    }
  }
}

/* The cache is cold once no huge block has been allocated or grown for half the purge
 * delay: what it holds then is memory the program is done with (Redis frees its old
 * hash table when a rehash completes, long after it allocated the new one), and
 * keeping it for the rest of the delay only shows as RSS - glibc unmaps such blocks at
 * once. A cold cache takes no freed mapping and the purger empties it at its next tick.
 * A program that allocates big buffers again within half the delay finds them cached;
 * one that comes back later pays the faults at most once per half delay. Lock held. */
static bool cache_cold(uint64_t now_ms) { return now_ms - last_take_ms >= keel_opt(purge_delay_ms) / 2; }

static size_t round_pages(size_t n) { return (n + _keel_page_size - 1) & ~(_keel_page_size - 1); }

/* Keeps [addr, addr+size), the part of a mapping a block no longer needs, in the cache
 * if there is room without evicting: its pages are already faulted in, and the next
 * big request reuses them instead of faulting fresh ones (bench/large: 17 % fewer page
 * faults than unmapping it). Lock held. False: the caller unmaps it. */
static bool cache_keep(void* addr, size_t size) {
  if (keel_opt(purge_delay_ms) == 0 || size < KEEL_UNIT_SIZE || cache_count == CACHE_SLOTS ||
      cached_bytes + size > CACHE_MAX_BYTES)
    return false;
  cache[cache_count++] = (cached_map_t){addr, size, _keel_prim_clock_ms()};
  cached_bytes += size;
  return true;
}

/* Fills the fresh, untouched range [at, at + n) with cached pages, in address order,
 * by moving them (page tables move, nothing is copied): the block then reuses pages
 * that are already faulted in, whatever the sizes of the cached mappings. A cached
 * mapping that fits the rest is preferred (its tail stays cached); else the largest
 * goes. One the OS refuses to move (it spans mappings that an older kernel cannot move
 * together) is unmapped instead. Returns how many bytes from `at` now hold old data.
 * Lock held. */
static size_t cache_fill(char* at, size_t n) {
  /* Without moves of several mappings (kernels before 6.17), an assembled block could
   * never grow by mremap again and realloc would copy it: keep blocks whole there. */
  if (!_keel_prim_move_spans_mappings()) return 0;
  size_t filled = 0;
  while (filled < n && cache_count > 0) {
    size_t want = n - filled, pick = 0;
    for (size_t i = 1; i < cache_count; i++) {
      bool fits = cache[i].size >= want, pick_fits = cache[pick].size >= want;
      if (fits ? !pick_fits || cache[i].size < cache[pick].size : !pick_fits && cache[i].size > cache[pick].size)
        pick = i;
    }
    cached_map_t m = cache[pick];
    cache[pick] = cache[--cache_count];
    cached_bytes -= m.size;
    size_t move = m.size < want ? m.size : want;
    if (!_keel_prim_move(m.addr, move, at + filled)) {
      _keel_prim_unmap(m.addr, m.size);
      __atomic_fetch_add(&huge_purged, m.size, __ATOMIC_RELAXED);
      break; /* the rest of the range stays fresh */
    }
    if (m.size > move && !cache_keep((char*)m.addr + move, m.size - move)) {
      _keel_prim_unmap((char*)m.addr + move, m.size - move);
      __atomic_fetch_add(&huge_purged, m.size - move, __ATOMIC_RELAXED);
    }
    filled += move;
  }
  return filled;
}

/* Grows the mapping [p, p + old) to `size` bytes, moving it if need be; the new part is
 * fresh. A block assembled by cache_fill spans several kernel mappings, which mremap
 * cannot resize: then its pages are moved into a fresh mapping of the new size (Linux
 * 6.17+ moves several mappings at once; older kernels refuse, and the caller copies).
 * Returns the new address, or NULL with the old mapping untouched. */
/* Lock held: huge block p of old bytes moved to a new mapping of size bytes, entered in
 * the table and the page map first; NULL (p as it was) where any step fails. p's table
 * entry is the caller's to remove. */
static KEEL_COLD void* move_to_new(void* p, size_t old, size_t size) {
  void* q = _keel_prim_map(size, 0, NULL);
  if (q == NULL) return NULL;
  if (table_insert((uintptr_t)q, size)) {
    if (_keel_pagemap_set((uintptr_t)q, 1, KEEL_KIND_HUGE)) {
      /* p's entry goes first: once the move has unmapped p, another thread's new chunk
       * may be mapped there and tag its units. */
      _keel_pagemap_set((uintptr_t)p, 1, KEEL_KIND_NONE);
      if (_keel_prim_move(p, old, q)) return q;
      _keel_pagemap_set((uintptr_t)p, 1, KEEL_KIND_HUGE);
      _keel_pagemap_set((uintptr_t)q, 1, KEEL_KIND_NONE);
    }
    table_remove(table_find((uintptr_t)q));
  }
  _keel_prim_unmap(q, size);
  return NULL;
}

static void* grow_mapping(void* p, size_t old, size_t size) {
  void* q = _keel_prim_remap(p, old, size, true);
  if (q != NULL) return q;
  q = _keel_prim_map(size, 0, NULL);
  if (q == NULL) return NULL;
  if (_keel_prim_move(p, old, q)) return q;
  _keel_prim_unmap(q, size);
  return NULL;
}

/* Takes the cached mapping closest in size to `size` and fits it: a larger one has its
 * tail cached again or unmapped, a smaller one is grown with mremap and the new part
 * filled from the rest of the cache (cache_fill). Sets *dirty_bytes to how much of the
 * result may hold old data. Lock held. */
static void* cache_take(size_t size, size_t* dirty_bytes) {
  size_t best = CACHE_SLOTS, best_gap = SIZE_MAX;
  for (size_t i = 0; i < cache_count; i++) {
    size_t gap = cache[i].size > size ? cache[i].size - size : size - cache[i].size;
    if (gap < best_gap) best = i, best_gap = gap;
  }
  if (best == CACHE_SLOTS) return NULL;
  cached_map_t m = cache[best];
  void* p = m.addr;
  if (m.size < size) {
    p = grow_mapping(m.addr, m.size, size);
    if (p == NULL) return NULL; /* leave it cached; the caller maps afresh */
    if (!holds_huge_page((uintptr_t)m.addr, m.size)) thp_advise(p, size);
  }
  cache[best] = cache[--cache_count];
  cached_bytes -= m.size;
  if (m.size > size && !cache_keep((char*)m.addr + size, m.size - size)) {
    _keel_prim_unmap((char*)m.addr + size, m.size - size);
    __atomic_fetch_add(&huge_purged, m.size - size, __ATOMIC_RELAXED);
  }
  *dirty_bytes = m.size < size ? m.size + cache_fill((char*)p + m.size, size - m.size) : size;
  return p;
}

/* At least a unit: two huge blocks then never start in the same 64 KiB unit, which
 * would make them share one page-map byte (an aligned request may be tiny). */
size_t _keel_huge_bytes(size_t size) {
  size_t bytes = round_pages(size < KEEL_UNIT_SIZE ? KEEL_UNIT_SIZE : size);
  return bytes < size ? 0 : bytes;
}

void* _keel_huge_alloc(size_t size, size_t align, bool zero) {
  size_t bytes = _keel_huge_bytes(size);
  if (bytes == 0) goto oom;
  void* p = NULL;
  size_t dirty = 0;
  keel_lock(&huge_lock);
  uint32_t epoch = thp_epoch;
  last_take_ms = _keel_prim_clock_ms();
  if (align <= _keel_page_size) p = cache_take(bytes, &dirty);
  keel_unlock(&huge_lock);
  if (p == NULL) {
    p = _keel_prim_map(bytes, align, NULL);
    if (p == NULL) { /* give back what is retained, then try once more */
      _keel_pageheap_purge(true);
      _keel_huge_purge(true);
      p = _keel_prim_map(bytes, align, NULL);
    }
    if (p == NULL) goto oom;
    thp_advise(p, bytes);
  }
  keel_lock(&huge_lock);
  /* The policy changed while the block was in no table _keel_thp_apply_all walks. */
  if (thp_epoch != epoch) thp_advise(p, bytes);
  bool ok = table_insert((uintptr_t)p, bytes) && _keel_pagemap_set((uintptr_t)p, 1, KEEL_KIND_HUGE);
  if (ok) {
    live_bytes += bytes;
    live_blocks++;
    taken_bytes += bytes;
  } else if (table_find((uintptr_t)p)) {
    table_remove(table_find((uintptr_t)p));
  }
  keel_unlock(&huge_lock);
  if (!ok) {
    _keel_prim_unmap(p, bytes);
    goto oom;
  }
  if (zero && dirty) memset(p, 0, dirty < size ? dirty : size);
  return p;
oom:
  _keel_prim_set_errno(_keel_prim_errno_enomem());
  return NULL;
}

bool _keel_huge_free(void* p) {
  keel_lock(&huge_lock);
  huge_entry_t* e = table_find((uintptr_t)p);
  if (e == NULL) {
    keel_unlock(&huge_lock);
    return false;
  }
  size_t size = e->size;
  table_remove(e);
  live_bytes -= size;
  live_blocks--;
  _keel_pagemap_set((uintptr_t)p, 1, KEEL_KIND_FREED);
  cached_map_t evict = {p, size, 0}; /* unmapped unless it fits in the cache */
  uint64_t now = _keel_prim_clock_ms();
  if (keel_opt(purge_delay_ms) > 0 && size <= CACHE_MAX_BYTES && !cache_cold(now)) {
    /* Make room: evict the oldest entries until this one fits. */
    while (cache_count > 0 && (cache_count == CACHE_SLOTS || cached_bytes + size > CACHE_MAX_BYTES)) {
      size_t old = 0;
      for (size_t i = 1; i < cache_count; i++)
        if (cache[i].freed_ms < cache[old].freed_ms) old = i;
      cached_map_t gone = cache[old];
      cache[old] = cache[--cache_count];
      cached_bytes -= gone.size;
      keel_unlock(&huge_lock);
      _keel_prim_unmap(gone.addr, gone.size);
      __atomic_fetch_add(&huge_purged, gone.size, __ATOMIC_RELAXED);
      keel_lock(&huge_lock);
    }
    cache[cache_count++] = (cached_map_t){p, size, now};
    cached_bytes += size;
    evict.addr = NULL;
  }
  keel_unlock(&huge_lock);
  if (evict.addr) {
    _keel_prim_unmap(evict.addr, evict.size);
    __atomic_fetch_add(&huge_purged, evict.size, __ATOMIC_RELAXED);
  }
  return true;
}

size_t _keel_huge_usable(const void* p) {
  keel_lock(&huge_lock);
  huge_entry_t* e = table_find((uintptr_t)p);
  size_t n = e ? e->size : 0;
  keel_unlock(&huge_lock);
  return n;
}

/* The checked mode's guarded blocks (checked.c) live in mappings checked.c makes and
 * unmaps itself; they are entered here only so that lookups, the FREED tag and the
 * statistics treat them as huge blocks. */
KEEL_COLD bool _keel_huge_adopt(void* p, size_t size) {
  keel_lock(&huge_lock);
  bool ok = table_insert((uintptr_t)p, size) && _keel_pagemap_set((uintptr_t)p, 1, KEEL_KIND_HUGE);
  if (ok) {
    live_bytes += size;
    live_blocks++;
  } else if (table_find((uintptr_t)p)) table_remove(table_find((uintptr_t)p));
  keel_unlock(&huge_lock);
  return ok;
}

KEEL_COLD size_t _keel_huge_disown(void* p) {
  keel_lock(&huge_lock);
  huge_entry_t* e = table_find((uintptr_t)p);
  size_t size = e ? e->size : 0;
  if (e) {
    table_remove(e);
    live_bytes -= size;
    live_blocks--;
    _keel_pagemap_set((uintptr_t)p, 1, KEEL_KIND_FREED);
  }
  keel_unlock(&huge_lock);
  return size;
}

/* Cold: only a process that grows or shrinks blocks of megabytes runs it. */
KEEL_COLD void* _keel_huge_realloc(void* p, size_t size, bool zero) {
  size_t bytes = round_pages(size);
  if (bytes < size) return NULL;
  keel_lock(&huge_lock);
  huge_entry_t* e = table_find((uintptr_t)p);
  if (e == NULL) {
    keel_unlock(&huge_lock);
    _keel_misuse("realloc", "invalid pointer", p, ": not allocated by keel", 0);
  }
  size_t old = e->size;
  if (bytes > old) last_take_ms = _keel_prim_clock_ms();
  if (bytes <= old && bytes >= old / 2) { /* shrinking a little: keep it as it is */
    keel_unlock(&huge_lock);
    return p;
  }
  if (bytes < old && bytes >= KEEL_UNIT_SIZE && cache_keep((char*)p + bytes, old - bytes)) {
    e->size = bytes; /* shrinking a lot: the block keeps its head, the cache its tail */
    live_bytes -= old - bytes;
    keel_unlock(&huge_lock);
    return p;
  }
  /* In place (a shrink always is), else to a new mapping entered in the table and the
   * page map before the block moves there: entering it afterwards could fail with the
   * block already gone from p. */
  void* q = _keel_prim_remap(p, old, bytes, false);
  if (q == NULL && bytes > old) q = move_to_new(p, old, bytes);
  if (q == NULL) {
    keel_unlock(&huge_lock);
    return NULL; /* the caller allocates, copies and frees */
  }
  if (bytes > old) {
    if (!holds_huge_page((uintptr_t)p, old)) thp_advise(q, bytes);
    /* realloc leaves the new part undefined; cached pages hold freed blocks' bytes */
    if (!zero) cache_fill((char*)q + old, bytes - old);
  }
  if (q == p) table_find((uintptr_t)p)->size = bytes;
  else table_remove(table_find((uintptr_t)p)); /* its page-map entry went before the move */
  live_bytes += bytes - old;
  if (bytes > old) taken_bytes += bytes - old;
  keel_unlock(&huge_lock);
  return q;
}

/* Unmaps cached mappings older than the purge delay, all of them if the cache has gone
 * cold (cache_cold) or if `all`. */
size_t _keel_huge_purge(bool all) {
  cached_map_t out[CACHE_SLOTS];
  size_t n = 0, released = 0;
  uint64_t now = _keel_prim_clock_ms();
  keel_lock(&huge_lock);
  all = all || cache_cold(now);
  for (size_t i = 0; i < cache_count;) {
    if (all || now - cache[i].freed_ms >= keel_opt(purge_delay_ms)) {
      out[n++] = cache[i];
      cached_bytes -= cache[i].size;
      cache[i] = cache[--cache_count];
    } else {
      i++;
    }
  }
  keel_unlock(&huge_lock);
  for (size_t i = 0; i < n; i++) {
    _keel_prim_unmap(out[i].addr, out[i].size);
    released += out[i].size;
  }
  __atomic_fetch_add(&huge_purged, released, __ATOMIC_RELAXED);
  return released;
}

__attribute__((no_sanitize("thread"))) uint64_t _keel_huge_taken_bytes(void) { return __atomic_load_n(&taken_bytes, __ATOMIC_RELAXED); }
__attribute__((no_sanitize("thread"))) bool _keel_huge_cache_pending(void) { return __atomic_load_n(&cached_bytes, __ATOMIC_RELAXED) != 0; }

/* _keel_thp_apply_all's part: live and cached huge blocks take the policy now. */
KEEL_COLD void _keel_huge_thp_apply_all(void) {
  keel_lock(&huge_lock);
  thp_epoch++;
  for (size_t i = 0; i < table_cap; i++)
    if (table[i].addr != 0) thp_advise((void*)table[i].addr, table[i].size);
  for (size_t i = 0; i < cache_count; i++) thp_advise(cache[i].addr, cache[i].size);
  keel_unlock(&huge_lock);
}

KEEL_COLD uint64_t _keel_huge_live_blocks(void) {
  keel_lock(&huge_lock);
  uint64_t n = live_blocks;
  keel_unlock(&huge_lock);
  return n;
}

void _keel_huge_lock_all(void) { keel_lock(&huge_lock); }
void _keel_huge_unlock_all(void) { keel_unlock(&huge_lock); }
void _keel_huge_reset_locks(void) { keel_lock_reset(&huge_lock); }

KEEL_COLD void _keel_huge_stats(keel_stats_t* out) {
  keel_lock(&huge_lock);
  out->huge_allocated += live_bytes;
  out->allocated += live_bytes;
  out->active += live_bytes;
  out->mapped += live_bytes + cached_bytes;
  out->committed += live_bytes + cached_bytes;
  out->cached += cached_bytes;
  out->metadata += table_cap * sizeof(huge_entry_t);
  out->purged_bytes += __atomic_load_n(&huge_purged, __ATOMIC_RELAXED);
  keel_unlock(&huge_lock);
}
