/* mesh_estimate.c -- how much meshing could give back, measured on the live heap.
 *
 * Step 2 of docs/meshing.md: before anything is remapped, run the candidate search and
 * the matcher of section 7 on copies of the real slab bitmaps, so the decision to build
 * meshing rests on what a real server's heap looks like rather than on a model.
 *
 * Two slabs of a class share one layout, so OS page j of one slab holds the same block
 * indices as page j of another: page j of slab A and page j of slab B can share one
 * physical page when no block in use touches both at the same index. A page's "used
 * mask" has a bit per block touching it (a block crossing a page edge is in both), set
 * when the block is not free in the slab bitmap; blocks in thread and transfer caches
 * are not free there, so they count as used, as a real mesher must treat them. */
#include "core/internal.h"

#define MESH_PROBES 256u
#define MESH_FULL_PERCENT 90u /* pages fuller than this are not worth a view */

/* Scratch memory, mapped for one estimate and unmapped after it (never malloc). */
typedef struct scratch_s {
  void* base;
  size_t bytes;
} scratch_t;

static bool scratch_reserve(scratch_t* s, size_t bytes) {
  if (bytes <= s->bytes) return true;
  bytes = (bytes + bytes / 2 + _keel_page_size - 1) & ~(_keel_page_size - 1);
  void* p = _keel_prim_map(bytes, 0, NULL);
  if (p == NULL) return false;
  if (s->base) _keel_prim_unmap(s->base, s->bytes);
  s->base = p;
  s->bytes = bytes;
  return true;
}

static uint64_t rng_next(uint64_t* state) { /* xorshift64*: deterministic, no locks */
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* Bits [start, start + n) of the complement of `free_bits` (words of one slab) into
 * `out` (wc words, bits past n clear). Returns how many are set. */
static unsigned used_mask(const uint64_t* free_bits, unsigned words, uint32_t start, uint32_t n,
                          uint64_t* out, unsigned wc) {
  unsigned set = 0;
  for (unsigned i = 0; i < wc; i++) {
    uint32_t s = start + i * 64, w = s / 64, sh = s % 64;
    uint64_t f = w < words ? free_bits[w] >> sh : ~(uint64_t)0;
    if (sh) f |= (w + 1 < words ? free_bits[w + 1] : ~(uint64_t)0) << (64 - sh);
    uint64_t u = ~f;
    uint32_t left = n - i * 64;
    if (left < 64) u &= ((uint64_t)1 << left) - 1;
    out[i] = u;
    set += (unsigned)__builtin_popcountll(u);
  }
  return set;
}

typedef struct match_space_s {
  uint64_t* unions;  /* wc words per group */
  uint8_t* members;
  uint32_t* open;    /* groups that can still take a page */
  uint32_t* order;
  /* Pairs with affinity (match_pairs): per candidate, its slab and its partner; per
   * slab, its candidate at this page index and its partner at the previous one. */
  uint32_t* group_of; /* per candidate: its group in the last match() */
  uint32_t* cand_slab;
  uint32_t* partner;
  uint32_t* cand_of;
  uint32_t* prev_partner;
} match_space_t;

#define NONE UINT32_MAX

static bool disjoint(const uint64_t* a, const uint64_t* b, unsigned wc) {
  for (unsigned w = 0; w < wc; w++)
    if (a[w] & b[w]) return false;
  return true;
}

static void shuffle(uint32_t* v, uint32_t n, uint64_t* rng) {
  for (uint32_t i = n; i > 1; i--) {
    uint32_t j = (uint32_t)(rng_next(rng) % i), t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}

/* Randomized first fit (Mesh's matcher, per page index): the pages listed in
 * sp->order[0, m) (candidate indices), in random order, each join the first of up to
 * MESH_PROBES open groups they do not overlap, else open a group; a group takes at most
 * `cap` pages. Sets sp->group_of and sp->members; returns the number of groups. */
static uint32_t match(const uint64_t* masks, uint32_t m, unsigned wc, unsigned cap, match_space_t* sp,
                      uint64_t* rng) {
  shuffle(sp->order, m, rng);
  uint32_t groups = 0, nopen = 0;
  for (uint32_t i = 0; i < m; i++) {
    uint32_t k = sp->order[i];
    const uint64_t* pm = masks + (size_t)k * wc;
    uint32_t g = NONE, tries = nopen < MESH_PROBES ? nopen : MESH_PROBES;
    for (uint32_t t = 0; t < tries && g == NONE; t++) {
      uint32_t oi = nopen <= MESH_PROBES ? t : (uint32_t)(rng_next(rng) % nopen);
      uint64_t* u = sp->unions + (size_t)sp->open[oi] * wc;
      if (!disjoint(u, pm, wc)) continue;
      g = sp->open[oi];
      for (unsigned w = 0; w < wc; w++) u[w] |= pm[w];
      if (++sp->members[g] == cap) sp->open[oi] = sp->open[--nopen];
    }
    if (g == NONE) {
      g = groups++;
      memcpy(sp->unions + (size_t)g * wc, pm, wc * sizeof(uint64_t));
      sp->members[g] = 1;
      sp->open[nopen++] = g;
    }
    sp->group_of[k] = g;
  }
  return groups;
}

/* Groups of up to 8: adds the pages freed and the views needed. */
static void match_groups(const uint64_t* masks, uint32_t m, unsigned wc, match_space_t* sp, uint64_t* rng,
                         keel_mesh_estimate_t* e) {
  for (uint32_t k = 0; k < m; k++) sp->order[k] = k;
  uint32_t groups = match(masks, m, wc, KEEL_MESH_WAYS, sp, rng);
  for (uint32_t g = 0; g < groups; g++)
    if (sp->members[g] >= 2) {
      e->group_saved += sp->members[g] - 1u;
      e->group_views += sp->members[g];
    }
}

static void pair(match_space_t* sp, uint32_t k, uint32_t k2, keel_mesh_estimate_t* e) {
  sp->partner[k] = k2;
  sp->partner[k2] = k;
  e->pair_saved++;
  e->pair_views += 2;
}

/* Pairs, preferring to keep a slab's partner from one page to the next: slabs A and B
 * meshed at pages j and j + 1 can have their two file pages at consecutive offsets, so
 * each keeps one mapping for the run instead of one per page, and mappings, not pages,
 * are what the kernel limits (vm.max_map_count). First every candidate whose partner at
 * the previous page index is a candidate here too, and disjoint, pairs with it again;
 * the rest pair by match(). Adds pages freed, views, and runs (each a mapping, and up
 * to one more where it splits the slab's own mapping). */
static void match_pairs(const uint64_t* masks, uint32_t m, unsigned wc, uint32_t nslabs, match_space_t* sp,
                        uint64_t* rng, keel_mesh_estimate_t* e) {
  for (uint32_t k = 0; k < m; k++) sp->partner[k] = NONE;
  for (uint32_t k = 0; k < m; k++) {
    uint32_t p = sp->prev_partner[sp->cand_slab[k]];
    uint32_t k2 = p == NONE ? NONE : sp->cand_of[p];
    if (k2 == NONE || sp->partner[k] != NONE || sp->partner[k2] != NONE) continue;
    if (disjoint(masks + (size_t)k * wc, masks + (size_t)k2 * wc, wc)) pair(sp, k, k2, e);
  }
  uint32_t left = 0;
  for (uint32_t k = 0; k < m; k++)
    if (sp->partner[k] == NONE) sp->order[left++] = k;
  uint32_t groups = match(masks, left, wc, 2, sp, rng);
  uint32_t* first = sp->open; /* free again: the first member seen of each group */
  for (uint32_t g = 0; g < groups; g++) first[g] = NONE;
  for (uint32_t i = 0; i < left; i++) {
    uint32_t k = sp->order[i], g = sp->group_of[k];
    if (first[g] == NONE) {
      first[g] = k;
    } else {
      pair(sp, first[g], k, e);
      e->pair_runs += 2; /* a new partner: a new run for both slabs */
    }
  }
  for (uint32_t s = 0; s < nslabs; s++) sp->prev_partner[s] = NONE;
  for (uint32_t k = 0; k < m; k++)
    if (sp->partner[k] != NONE) sp->prev_partner[sp->cand_slab[k]] = sp->cand_slab[sp->partner[k]];
}

/* Copies the bitmaps of cls's ordinary partial slabs into the scratch, followed by each
 * slab's address, leaving reserve_per_slab bytes a slab after them. Returns the number
 * copied (the slab refills come from first), or UINT32_MAX if no scratch memory. */
static uint32_t copy_bitmaps(unsigned cls, scratch_t* s, size_t reserve_per_slab, uint64_t* slabs) {
  *slabs = 0;
  if (!_keel_central_active(cls)) return 0; /* no slabs; its entry is the shared zero one */
  keel_central_t* cl = keel_central_of(cls);
  unsigned words = keel_class_words(&_keel_classes[cls]);
  for (;;) {
    _keel_central_lock_class(cl);
    uint32_t n = 0;
    for (keel_slab_t* sl = _keel_partial_first(cl); sl != NULL; sl = _keel_partial_next(cl, sl)) n++;
    size_t need = (size_t)n * (words * sizeof(uint64_t) + sizeof(uintptr_t) + reserve_per_slab);
    if (need <= s->bytes) {
      uint64_t* dst = (uint64_t*)s->base;
      uintptr_t* base = (uintptr_t*)s->base + (size_t)n * words;
      for (keel_slab_t* sl = _keel_partial_first(cl); sl != NULL; sl = _keel_partial_next(cl, sl), dst += words) {
        for (unsigned w = 0; w < words; w++) dst[w] = keel_slab_word(sl, _keel_classes[cls].count, w);
        keel_chunk_t* c = keel_chunk_of(sl);
        *base++ = (uintptr_t)keel_unit_addr(c, (unsigned)(sl - c->units));
      }
      *slabs = cl->slabs;
      _keel_central_unlock_class(cl);
      return n;
    }
    _keel_central_unlock_class(cl);
    if (!scratch_reserve(s, need)) return UINT32_MAX; /* (it leaves room to grow) */
  }
}

/* The estimate for one class (visit NULL), or the plan: the same search, and groups of
 * up to KEEL_MESH_WAYS pages handed to visit. */
static bool plan_class(unsigned cls, scratch_t* s, uint64_t* rng, keel_mesh_estimate_t* e,
                       keel_mesh_visit_t visit, void* ctx) {
  const keel_class_t* k = &_keel_classes[cls];
  size_t page = _keel_page_size, slab_bytes = (size_t)k->units << KEEL_UNIT_SHIFT;
  unsigned words = keel_class_words(k);
  unsigned wc_max = (unsigned)((page / k->size + 2 + 63) / 64);
  /* Per partial slab, besides its bitmap: one mask and one group union (wc_max words
   * each), a member count, and seven 32-bit slots (open list, order, group, and
   * match_pairs' four). */
  size_t per_slab = 2 * wc_max * sizeof(uint64_t) + 1 + 7 * sizeof(uint32_t);
  uint64_t slabs = 0;
  uint32_t n = copy_bitmaps(cls, s, per_slab + 8, &slabs);
  memset(e, 0, sizeof *e);
  e->block_size = k->size;
  size_t pages_per_slab = slab_bytes / page;
  e->pages = slabs * pages_per_slab;
  if (n == UINT32_MAX) return false; /* no scratch memory: report the size only */
  const uint64_t* bitmaps = (const uint64_t*)s->base;
  const uintptr_t* bases = (const uintptr_t*)s->base + (size_t)n * words;
  uint64_t* masks = (uint64_t*)(bases + n);
  match_space_t sp;
  sp.unions = masks + (size_t)n * wc_max;
  sp.open = (uint32_t*)(sp.unions + (size_t)n * wc_max);
  sp.order = sp.open + n;
  sp.group_of = sp.order + n;
  sp.cand_slab = sp.group_of + n;
  sp.partner = sp.cand_slab + n;
  sp.cand_of = sp.partner + n;
  sp.prev_partner = sp.cand_of + n;
  sp.members = (uint8_t*)(sp.prev_partner + n);
  for (uint32_t i = 0; i < n; i++) sp.prev_partner[i] = NONE;
  for (size_t j = 0; j < pages_per_slab; j++) {
    uint32_t first = (uint32_t)(j * page / k->size);
    if (first >= k->count) { /* the slab's tail past its last block: never used */
      e->free_pages += slabs;
      continue;
    }
    uint32_t last = (uint32_t)(((j + 1) * page - 1) / k->size);
    if (last >= k->count) last = k->count - 1;
    uint32_t nb = last - first + 1, m = 0;
    unsigned wc = (nb + 63) / 64;
    /* A plan leaves out slab 0, the one refills come from: it would be written soon. */
    for (uint32_t i = visit ? 1 : 0; i < n; i++) {
      uint64_t* out = masks + (size_t)m * wc;
      unsigned used = used_mask(bitmaps + (size_t)i * words, words, first, nb, out, wc);
      sp.cand_of[i] = NONE;
      if (used == 0) {
        e->free_pages++;
      } else if (used * 100 <= nb * MESH_FULL_PERCENT &&
                 (visit == NULL || _keel_mesh_page_meshable(bases[i] + j * page))) {
        sp.cand_of[i] = m;
        sp.cand_slab[m++] = i;
      }
    }
    e->candidates += m;
    if (visit == NULL) {
      match_pairs(masks, m, wc, n, &sp, rng, e);
      match_groups(masks, m, wc, &sp, rng, e);
      continue;
    }
    /* The plan: groups of up to KEEL_MESH_WAYS, each handed over as a list of pages
     * (partner[] links the members of a group, open[] holds each group's first). */
    for (uint32_t k2 = 0; k2 < m; k2++) sp.order[k2] = k2;
    uint32_t groups = match(masks, m, wc, KEEL_MESH_WAYS, &sp, rng);
    for (uint32_t g = 0; g < groups; g++) sp.open[g] = NONE;
    for (uint32_t c = 0; c < m; c++) {
      uint32_t g = sp.group_of[c];
      sp.partner[c] = sp.open[g];
      sp.open[g] = c;
    }
    for (uint32_t g = 0; g < groups; g++) {
      if (sp.members[g] < 2) continue;
      uintptr_t pages[KEEL_MESH_WAYS];
      unsigned np = 0;
      for (uint32_t c = sp.open[g]; c != NONE && np < KEEL_MESH_WAYS; c = sp.partner[c])
        pages[np++] = bases[sp.cand_slab[c]] + j * page;
      if (!visit(ctx, cls, pages, np)) return true;
    }
  }
  return true;
}

bool _keel_mesh_plan(unsigned cls, keel_mesh_visit_t visit, void* ctx) {
  scratch_t s = {NULL, 0};
  if (!scratch_reserve(&s, _keel_page_size)) return false;
  static uint64_t rng = 0x2545F4914F6CDD1Dull; /* the mesh lock is held */
  keel_mesh_estimate_t e;
  bool ok = plan_class(cls, &s, &rng, &e, visit, ctx);
  _keel_prim_unmap(s.base, s.bytes);
  return ok;
}

KEEL_API size_t keel_mesh_estimate(keel_mesh_estimate_t* out, size_t max) {
  keel_ensure_init();
  if (_keel_page_size > KEEL_MESH_MAX_PAGE || out == NULL) return 0;
  scratch_t s = {NULL, 0};
  if (!scratch_reserve(&s, _keel_page_size)) return 0;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  size_t n = 0;
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES && n < max; cls++) {
    if (_keel_classes[cls].size > KEEL_MESH_MAX_BLOCK) break;
    plan_class(cls, &s, &rng, &out[n], NULL, NULL);
    if (out[n].pages) n++;
  }
  _keel_prim_unmap(s.base, s.bytes);
  return n;
}
