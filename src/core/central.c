/* central.c -- the shared free lists, one per size class.
 *
 * Thread caches exchange blocks with a central list in batches. Whole batches park in
 * the transfer cache (transfer.c) without a lock, so a batch freed by one thread is
 * handed to another in O(1) (producer/consumer patterns never touch the slabs). Only
 * when it has nothing for a thread, or no room, does the thread take the class's lock
 * and go to the slabs: a block goes back to its slab's free bitmap, the ground truth
 * that proves a double free, finds interior pointers, and lets an empty slab return to
 * the page heap at once.
 *
 * Lending a class's holes to smaller classes is in borrow.c, returning the free pages
 * inside slabs to the OS (and the purger's pass over these lists) in slab_trim.c; slab.h
 * has what the three share. */
#include "core/slab.h"

keel_central_t _keel_central_slots[KEEL_NUM_CLASSES] KEEL_CENTRAL_BSS;
uint8_t _keel_central_slot[KEEL_NUM_CLASSES];
uint64_t _keel_ticks;
bool (*_keel_central_unmesh)(void* addr, size_t len);

/* Classes whose lock has ever been taken are active. The fork handlers take every lock,
 * and a lock taken is a page written: all 127 central lists are 24 KiB, written in full
 * by every process that forks and again by each child resetting them, though a small
 * process uses a few dozen classes. So they take the locks of active classes only, and
 * a class becomes active under activate_lock, which the handlers hold throughout: a
 * class that was not active when the fork began is not locked by anyone until it ends.
 * Activation happens where a class is first locked (a take, or a carve into it); every
 * other lock of a class follows one of those (its slabs, blocks or holes exist).
 *
 * A class gets its entry in _keel_central_slots when it becomes active, the next one in
 * order, so the entries a process writes are contiguous: a PostgreSQL backend's 34
 * classes write two pages of the array, where a fixed order wrote three. Until then its
 * slot is 0, an entry no one writes: an inactive class reads as all zero (no slabs, no
 * batches), which is what the unlocked hints (decay's skip test, has_free) expect. */
static uint8_t next_slot KEEL_ALWAYS_BSS;
static keel_lock_t activate_lock KEEL_ALWAYS_BSS = KEEL_LOCK_INIT;

bool _keel_central_active(unsigned cls) {
  return __atomic_load_n(&_keel_central_slot[cls], __ATOMIC_ACQUIRE) != 0;
}

KEEL_NOINLINE keel_central_t* _keel_central_activate(unsigned cls) {
  keel_lock(&activate_lock);
  if (_keel_central_slot[cls] == 0) {
    next_slot++;
    __atomic_store_n(&_keel_central_slot[cls], next_slot, __ATOMIC_RELEASE);
  }
  keel_unlock(&activate_lock);
  return keel_central_of(cls);
}

/* Half batches. In a small heap the bins of a class that spans few slabs move half a
 * batch at a time (tcache.c, bin_batch); they park in the transfer cache as they come,
 * and a bin that wants half a batch and finds a whole one takes its front half and parks
 * the back half again. */
static inline uint32_t half_of(const keel_class_t* k) { return k->batch / 2u; }

/* Lock held: one more trip to the slabs. BUSY_TRIPS in a purger tick (a quarter of a
 * second by default: a thousand trips a second) make the class busy for this tick and
 * the next: half batches then only double the trips of a class every thread trades in
 * (mpmc64 at 4 threads on 2 cores: 19.5 trips per 1,000 malloc+free pairs, a third of
 * them finding the lock held), while the classes that half batches keep lean see a few
 * dozen a tick. */
#define BUSY_TRIPS 256u
static inline void set_busy(keel_central_t* cl, unsigned line, bool busy) {
  uint16_t bit = (uint16_t)(1u << line);
  if (((__atomic_load_n(&cl->busy_lines, __ATOMIC_RELAXED) & bit) != 0) == busy) return;
  if (busy) __atomic_or_fetch(&cl->busy_lines, bit, __ATOMIC_RELAXED);
  else __atomic_and_fetch(&cl->busy_lines, (uint16_t)~bit, __ATOMIC_RELAXED);
}
/* Line `line`'s lock held (h is its share of cl): one more trip to its slabs. */
static inline void count_trip(keel_central_t* cl, keel_home_t* h, unsigned line) {
  uint8_t now = (uint8_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  if (h->trips_tick != now) {
    set_busy(cl, line, h->trips >= BUSY_TRIPS && (uint8_t)(h->trips_tick + 1) == now);
    h->trips = 0;
    h->trips_tick = now;
  }
  if (h->trips < UINT16_MAX && ++h->trips == BUSY_TRIPS) set_busy(cl, line, true);
}

/* The block after q on a list of class cls: the link decoded and checked (freelist.h),
 * and the block it leads to in a slab of that class (the page map says so: a link to
 * anywhere else stops the process before the block is touched). */
/* A listed block whose unit is not tagged with its class: one of a sampled slab of it,
 * or of a slab of it with carved holes (which lists only its own blocks), else corrupt. */
static KEEL_COLD void list_next_other_tag(const void* q, const void* next, uint8_t kind, unsigned cls) {
  /* (the tag vouches for the slab before its descriptor is read) */
  bool carved_own = kind == KEEL_KIND_CARVED && keel_span_head(keel_chunk_of(next), keel_unit_index(next))->cls == cls;
  if (!carved_own && keel_sampled_class(next, kind) != cls) _keel_freelist_corrupt("malloc", cls, q);
}

static void* list_next(const void* q, unsigned cls) {
  void* next = keel_link_next(q, cls);
  if (next != NULL) {
    uint8_t kind = keel_pagemap_get(next);
    if (KEEL_UNLIKELY(kind != cls)) list_next_other_tag(q, next, kind, cls);
  }
  return next;
}

uint32_t _keel_central_parked_blocks(unsigned cls) { return _keel_transfer_blocks(cls); }

/* Home lines. On many cores (transfer.h) a class's slabs with free blocks are on one list
 * per transfer line (the processor a thread runs on): a take goes to its own line's
 * slabs first, and to another line's only when its own have none (before the class
 * takes a new slab), moving that slab to its line. So the blocks a thread gives back to
 * its slabs are the ones it, or its processor's next thread, takes again: a batch taken
 * from a slab that another core filled is a cache miss per block. Each line's share
 * (keel_home_t) has its own lock too, which guards the slabs on that line: a take locks
 * its own line, a put the line of each run's slab (central.h). Line 0's share is the
 * entry's own `home`, the only one used on fewer cores unless threads are apart
 * (transfer.h); the others are a sparse array by line, then by the class's central
 * slot. */
static keel_home_t homes[KEEL_TRANSFER_LINES - 1][KEEL_NUM_CLASSES] KEEL_SPARSE_BSS;

static inline keel_home_t* home_of(keel_central_t* cl, unsigned line) {
  return line == 0 ? &cl->home : &homes[line - 1][cl - _keel_central_slots];
}
keel_home_t* _keel_central_home(keel_central_t* cl, unsigned line) { return home_of(cl, line); }

static inline keel_slab_t** home_head(keel_central_t* cl, unsigned line) { return &home_of(cl, line)->partial; }

/* The lock of the lowest line in mask m. */
static inline keel_lock_t* lowest_lock(keel_central_t* cl, uint32_t m) {
  return &home_of(cl, (unsigned)__builtin_ctz(m))->lock;
}

/* The locks of the lines in `lines` (which include line 0), in line order: line 0's
 * first, as a line joins only with it held. */
static void lock_lines(keel_central_t* cl, uint32_t lines) {
  for (uint32_t m = lines; m != 0; m &= m - 1) keel_lock(lowest_lock(cl, m));
}
static void unlock_lines(keel_central_t* cl, uint32_t lines) {
  for (uint32_t m = lines; m != 0; m &= m - 1) keel_unlock(lowest_lock(cl, m));
}

void _keel_central_lock_class(keel_central_t* cl) {
  keel_lock(&cl->home.lock); /* the lines cannot change once it is held */
  lock_lines(cl, keel_central_lines(cl) & ~1u);
}

void _keel_central_unlock_class(keel_central_t* cl) { unlock_lines(cl, keel_central_lines(cl)); }

bool _keel_central_trylock_class(keel_central_t* cl) {
  if (!keel_trylock(&cl->home.lock)) return false;
  uint32_t lines = keel_central_lines(cl) & ~1u;
  for (uint32_t m = lines; m != 0; m &= m - 1) {
    if (keel_trylock(lowest_lock(cl, m))) continue;
    unlock_lines(cl, (lines & ~m) | 1u); /* those taken so far */
    return false;
  }
  return true;
}

/* No Keel lock held: line joins the class's lines (keel_central_lines), with the class's
 * lock and its own held, in line order. A line never leaves, so a slab is only ever on a
 * line the class's lock covers. */
static void class_add_line(keel_central_t* cl, unsigned line) {
  keel_lock(&cl->home.lock);
  uint32_t lines = keel_central_lines(cl) | (1u << line);
  lock_lines(cl, lines & ~1u);
  __atomic_store_n(&cl->lines, (uint16_t)lines, __ATOMIC_RELAXED);
  unlock_lines(cl, lines);
}

uint64_t _keel_central_out(const keel_central_t* cl) {
  uint64_t out = 0;
  for (uint32_t m = keel_central_lines(cl); m != 0; m &= m - 1)
    out += __atomic_load_n(&home_of((keel_central_t*)cl, (unsigned)__builtin_ctz(m))->out, __ATOMIC_RELAXED);
  return out;
}

void _keel_central_lock_read(unsigned cls, struct keel_lock_stats_s* sum) {
  keel_central_t* cl = keel_central_of(cls);
  for (uint32_t m = keel_central_lines(cl); m != 0; m &= m - 1) _keel_lock_read(lowest_lock(cl, m), sum);
}

/* A slab's partial list: ordinary slabs by home line; profile-sample slabs apart. */
static keel_slab_t** partial_list(keel_central_t* cl, keel_slab_t* s) {
  return s->sampled ? &cl->sampled_partial : home_head(cl, s->home);
}

/* The first slab of the home lists from line `line` on, in line order. */
static keel_slab_t* partial_from(keel_central_t* cl, unsigned line) {
  uint32_t lines = (uint32_t)cl->partial_lines >> line;
  return lines == 0 ? NULL : *home_head(cl, line + (unsigned)__builtin_ctz(lines));
}

keel_slab_t* _keel_partial_first(keel_central_t* cl) { return partial_from(cl, 0); }
keel_slab_t* _keel_partial_head(keel_central_t* cl, unsigned line) { return *home_head(cl, line); }

keel_slab_t* _keel_partial_next(keel_central_t* cl, keel_slab_t* s) {
  return s->next != NULL || s->sampled ? s->next : partial_from(cl, s->home + 1u);
}

/* A list head is written under its line's lock but also read without it
 * (_keel_central_has_free, the decay's skip test): relaxed atomic stores, so those reads
 * see a whole value (and the code is race-free as C11 and TSan define it). partial_lines
 * is shared by the lines: its bits change by atomic read-modify-writes. */
static void partial_push(keel_central_t* cl, keel_slab_t* s) {
  keel_slab_t** list = partial_list(cl, s);
  s->prev = NULL;
  s->next = *list;
  if (s->next) s->next->prev = s;
  __atomic_store_n(list, s, __ATOMIC_RELAXED);
  s->in_partial = 1;
  uint16_t bit = (uint16_t)(1u << s->home);
  if (!s->sampled && !(__atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) & bit))
    __atomic_or_fetch(&cl->partial_lines, bit, __ATOMIC_RELAXED);
}

/* A class's lend_cursor: where its next search for a hole to lend starts (borrow.c), a
 * slab of its partial lists or NULL for the first. */

static void partial_remove(keel_central_t* cl, keel_slab_t* s) {
  /* Read by other lines' removes: only the remover of the slab it names writes it. */
  keel_slab_t** cursor = &keel_central_of(s->cls)->lend_cursor;
  if (__atomic_load_n(cursor, __ATOMIC_RELAXED) == s) __atomic_store_n(cursor, s->next, __ATOMIC_RELAXED);
  if (s->prev) s->prev->next = s->next;
  else __atomic_store_n(partial_list(cl, s), s->next, __ATOMIC_RELAXED);
  if (s->next) s->next->prev = s->prev;
  if (!s->sampled && *partial_list(cl, s) == NULL)
    __atomic_and_fetch(&cl->partial_lines, (uint16_t)~(1u << s->home), __ATOMIC_RELAXED);
  s->next = s->prev = NULL;
  s->in_partial = 0;
}

/* Whether class cl has a partial slab besides s (one of them; other lines: a hint). */
static inline bool partial_others(keel_central_t* cl, keel_slab_t* s) {
  return s->prev != NULL || s->next != NULL ||
         (!s->sampled && (__atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) & ~(1u << s->home)) != 0);
}

/* Which slabs of other lines a take may adopt (partial_adopt). */
typedef enum adopt_e {
  ADOPT_ANY,       /* the next line's first, not its head where that has a second */
  ADOPT_APART,     /* not a lone head another thread uses either (transfer.h, apart) */
  ADOPT_OWN_LINES, /* nothing of a line another thread uses (transfer.h, own lines) */
} adopt_t;

/* Line's lock held, no slab on its list: a slab of another line's list that this line
 * takes over (the next line's first, not its head where that has a second: the head is
 * the one its line takes from; while apart, not a lone head that another thread took
 * from last and whose line was used in the last ticks either: its blocks would share
 * cache lines with that thread's; a thread that moved to another processor takes its own
 * back), with what it has out; NULL if there is none. Locks are taken in line order: a
 * line after this one's is waited for, one before only tried. */
static keel_slab_t* partial_adopt(keel_central_t* cl, unsigned line, adopt_t rule) {
  uint32_t others = __atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) & ~(1u << line);
  while (others != 0) {
    uint32_t after = others >> line >> 1;
    unsigned from = after != 0 ? line + 1u + (unsigned)__builtin_ctz(after) : (unsigned)__builtin_ctz(others);
    others &= ~(1u << from);
    keel_home_t* h = home_of(cl, from);
    if (from > line) keel_lock(&h->lock);
    else if (!keel_trylock(&h->lock)) continue;
    keel_slab_t* s = h->partial;
    bool others_line = s != NULL && rule != ADOPT_ANY && h->taker != _keel_thread.tag &&
                       !_keel_transfer_line_idle(s->cls, from); /* another thread works there */
    if (others_line && (rule == ADOPT_OWN_LINES || s->next == NULL)) s = NULL;
    else if (s != NULL && s->next != NULL) s = s->next;
    if (s != NULL) {
      partial_remove(cl, s);
      home_out_add(h, -(int64_t)s->used);
      __atomic_store_n(&s->home, (uint8_t)line, __ATOMIC_RELAXED);
      home_out_add(home_of(cl, line), s->used);
      partial_push(cl, s);
    }
    keel_unlock(&h->lock);
    if (s != NULL) return s;
  }
  return NULL;
}

static uint64_t slab_units; /* units of all classes' slabs (the switch to fine classes) */

/* Gives slab s, which has none, its rows of its chunk's free_rest (chunk.h). The rows
 * are shared by the slabs of every class in the chunk, each under its own class's lock,
 * hence the CAS. A chunk holds at most 63 slabs and each keeps at most one of the 64
 * aligned pairs from being whole, so there is always room: one of the two words has
 * what is asked for, whatever the other slabs take or give back meanwhile. Out of line:
 * its callers inline only the test below. */
static KEEL_NOINLINE void slab_rows_find(keel_slab_t* s, const keel_class_t* k) {
  unsigned rows = keel_class_rows(k);
  uint64_t* used = keel_chunk_of(s)->rows_used;
  /* Both words can look full only to a reader that others overtake between its two
   * loads; so it goes round again, and gives up only when that cannot be the reason. */
  for (unsigned pass = 0; pass < (1u << 20); pass++) {
    unsigned i = pass & 1;
    uint64_t m = __atomic_load_n(&used[i], __ATOMIC_RELAXED);
    for (;;) {
      uint64_t free = ~m;
      if (rows == 2) free &= (free >> 1) & 0x5555555555555555ull;
      if (free == 0) break;
      unsigned r = (unsigned)__builtin_ctzll(free);
      /* Acquire, paired with the give-back's release: the slab that held these rows
       * (another class's, under another lock) has made its last write to them. */
      if (__atomic_compare_exchange_n(&used[i], &m, m | keel_rows_bits(k, r), true,
                                      __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        s->row = i * 64 + r + 1;
        return;
      }
    }
  }
  _keel_fatal_internal(__FILE__, __LINE__, "a chunk's bitmap rows ran out");
}

/* Slab s gets its rows if it has none. */
static inline void slab_rows_take(keel_slab_t* s, const keel_class_t* k) {
  if (s->row == 0) slab_rows_find(s, k);
}

static void slab_rows_give_back(keel_slab_t* s, const keel_class_t* k) {
  if (s->row == 0) return;
  unsigned r = (unsigned)s->row - 1;
  __atomic_and_fetch(&keel_chunk_of(s)->rows_used[r / 64], ~keel_rows_bits(k, r), __ATOMIC_RELEASE);
  s->row = 0;
}

/* Class lock held: slab s handed out its last free block. A full slab's words are all
 * zero, so it gives its rows back (unless it holds carved holes, whose bitmap follows):
 * the next slab to fill takes them, and a heap of full small-block slabs keeps the rows
 * of the few being filled resident, not a row for each (Redis filled with 3-byte values:
 * four pages of rows in each chunk of 32-byte slabs, now one). */
static void slab_became_full(keel_central_t* cl, keel_slab_t* s, const keel_class_t* k) {
  partial_remove(cl, s);
  if (s->carved == 0) slab_rows_give_back(s, k);
}

/* Class lock held: the first block back in a full slab that gave its rows back. */
static void slab_rows_restore(keel_slab_t* s, const keel_class_t* k) {
  slab_rows_take(s, k);
  for (unsigned w = 1; w < s->ready; w++) KEEL_SLAB_BITS(s, w) = 0;
}

/* line: the line whose chunk it comes from (KEEL_OWN_LINES), or -1. */
static keel_slab_t* slab_new(unsigned cls, bool sampled, int line) {
  const keel_class_t* k = &_keel_classes[cls];
  bool zeroed;
  keel_slab_t* s = line >= 0 ? _keel_pageheap_alloc_for_line(k->units, (unsigned)line, &zeroed)
                             : _keel_pageheap_alloc(k->units, 1, &zeroed);
  if (s == NULL) return NULL;
  keel_chunk_t* c = keel_chunk_of(s);
  uint8_t tag = sampled ? KEEL_KIND_SAMPLED : (uint8_t)cls;
  if (!_keel_pagemap_set((uintptr_t)slab_base(c, s), k->units, tag)) {
    _keel_pageheap_free(s);
    return NULL;
  }
  s->state = KEEL_UNIT_SLAB;
  s->cls = (uint8_t)cls;
  s->sampled = sampled;
  s->needs_trim = 0;
  s->busy_trim_tick = 0;
  s->meshed = 0;
  s->used = 0;
  s->carved = 0;
  s->scan = 0;
  s->ready = 0; /* bitmap words are written as takes reach them (slab_bits) */
  __atomic_store_n(&s->home, (uint8_t)0, __ATOMIC_RELAXED);
  s->row = 0;   /* and its row of them only once it needs a second word */
  if (KEEL_UNLIKELY(_keel_options.check) && !zeroed) _keel_checked_slab_new(slab_base(c, s), cls);
  __atomic_add_fetch(&keel_central_of(cls)->slabs, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&slab_units, k->units, __ATOMIC_RELAXED);
  return s;
}

/* An empty slab may go back to the page heap once none of its pages is a mesh view any
 * more (the page heap counts on purged memory reading zero; a view re-reads its file).
 * Only meshing marks a slab meshed, and it sets the hook first. */
static bool slab_releasable(keel_slab_t* s) {
  if (s->meshed && __atomic_load_n(&_keel_central_unmesh, __ATOMIC_RELAXED)(
                       slab_base(keel_chunk_of(s), s), (size_t)s->units << KEEL_UNIT_SHIFT))
    s->meshed = 0;
  return !s->meshed;
}

static void slab_release(unsigned cls, keel_slab_t* s) {
  keel_chunk_t* c = keel_chunk_of(s);
  _keel_pagemap_set((uintptr_t)slab_base(c, s), s->units, KEEL_KIND_NONE);
  __atomic_sub_fetch(&keel_central_of(cls)->slabs, 1, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&slab_units, s->units, __ATOMIC_RELAXED);
  slab_rows_give_back(s, &_keel_classes[cls]);
  _keel_pageheap_free(s);
}

/* False sharing. Blocks smaller than a cache line share lines, and the lowest free bits
 * of a slab are usually the neighbours of blocks other threads hold. A take of less
 * than a line's worth (a young thread's single block, a slow-starting bin's first
 * refills) therefore goes to a group of blocks that is wholly free, so two threads that
 * each allocate a little do not write to one line (Hoard's cache-scratch: 5x slower
 * when they do). Groups are aligned runs of 4 blocks (16 and 48 bytes: one and three
 * lines) or 2 (32 bytes). Returns the first bit of such a group in `bits`, or -1. */
static int free_group(uint64_t bits, uint32_t size) {
  uint64_t m;
  if (size == 32) m = bits & (bits >> 1) & 0x5555555555555555ull;
  else m = bits & (bits >> 1) & (bits >> 2) & (bits >> 3) & 0x1111111111111111ull;
  return m ? __builtin_ctzll(m) : -1;
}

/* Word w of slab s's bitmap for writing: the words before it that were never written
 * are written first, as wholly free (keel_slab_word), so s->ready stays a prefix. */
static uint64_t* slab_bits(keel_slab_t* s, const keel_class_t* k, unsigned w) {
  if (w >= s->ready && w > 0) slab_rows_take(s, k);
  for (; s->ready <= w; s->ready++) KEEL_SLAB_BITS(s, s->ready) = keel_slab_word(s, k->count, s->ready);
  return &KEEL_SLAB_BITS(s, w);
}

/* Blocks taken from slabs under the class lock, as runs of one bitmap word each. They
 * are linked into a list after the lock is released: they are the taker's by then, and
 * writing a link into each block is most of a take's memory traffic. */
#define TAKEN_RUNS 32u
typedef struct taken_s {
  unsigned runs;
  uint32_t size;
  struct {
    uintptr_t first; /* address of the word's block 0 */
    uint64_t bits;   /* the blocks taken */
  } run[TAKEN_RUNS];
} taken_t;

static inline void taken_start(taken_t* t, const keel_class_t* k) {
  t->runs = 0;
  t->size = k->size;
}

static inline bool taken_full(const taken_t* t) { return t->runs == TAKEN_RUNS; }

static inline void taken_add(taken_t* t, char* base, unsigned w, uint64_t bits) {
  t->run[t->runs].first = (uintptr_t)base + (uintptr_t)w * 64 * t->size;
  t->run[t->runs].bits = bits;
  t->runs++;
}

/* No lock: the taken blocks as a list, in slab order. Each block's link is written as
 * the next is found; the first is "linked" from a word on the stack, so the loop has no
 * branch for it, and the key is read once (a store through a block could alias it). */
static void* taken_link(const taken_t* t) {
  uintptr_t key = keel_link_key(), head_word;
  uintptr_t last = (uintptr_t)&head_word;
  for (unsigned r = 0; r < t->runs; r++)
    for (uint64_t m = t->run[r].bits; m != 0; m &= m - 1) {
      uintptr_t obj = t->run[r].first + (uintptr_t)__builtin_ctzll(m) * t->size;
      *(uintptr_t*)last = keel_link_encode(key, last, obj);
      last = obj;
    }
  if (last == (uintptr_t)&head_word) return NULL;
  keel_link_set((void*)last, NULL);
  return (void*)keel_link_encode(key, (uintptr_t)&head_word, head_word); /* decoding is the same XOR */
}

/* Takes want (< a group) blocks from one wholly free group, if the slab has one. */
static uint32_t slab_take_alone(keel_slab_t* s, const keel_class_t* k, uint32_t want, taken_t* taken) {
  char* base = (char*)slab_base(keel_chunk_of(s), s);
  unsigned words = keel_class_words(k);
  for (unsigned w = s->scan; w < words; w++) {
    uint64_t* bits = slab_bits(s, k, w);
    int b = free_group(*bits, k->size);
    if (b < 0) continue;
    uint64_t mask = (((uint64_t)1 << want) - 1) << b;
    *bits &= ~mask;
    taken_add(taken, base, w, mask);
    s->used += want;
    return want;
  }
  return 0;
}

/* Takes up to `want` free blocks of slab s; returns how many (fewer once taken is full). */
static uint32_t slab_take(keel_slab_t* s, unsigned cls, uint32_t want, taken_t* taken) {
  const keel_class_t* k = &_keel_classes[cls];
  if (k->size < 64 && want * k->size < 64) {
    uint32_t got = slab_take_alone(s, k, want, taken);
    if (got) return got;
  }
  char* base = (char*)slab_base(keel_chunk_of(s), s);
  unsigned words = keel_class_words(k);
  uint32_t got = 0;
  unsigned w = s->scan;
  for (; w < words && got < want && !taken_full(taken); w++) {
    uint64_t* word = slab_bits(s, k, w);
    uint64_t bits = *word, mask = bits;
    uint32_t free_here = (uint32_t)keel_popcount64(bits);
    if (free_here <= want - got) { /* the whole word: one step, not one per block */
      bits = 0;
      got += free_here;
    } else {
      uint64_t low = bits & (0 - bits);
      if (((bits + low) & bits) == 0) { /* one run of free blocks (a new slab's words) */
        mask = (((uint64_t)1 << (want - got)) - 1) * low;
        bits ^= mask;
        got = want;
      } else {
        for (; got < want; got++) bits &= bits - 1; /* the lowest want - got blocks */
        mask ^= bits;
      }
    }
    *word = bits;
    if (mask != 0) taken_add(taken, base, w, mask);
    if (bits) break;
  }
  s->scan = (uint16_t)w;
  s->used += got;
  return got;
}

/* Blocks were taken from cls: stamped once a tick (a plain load on the other takes). */
static inline void stamp_take(keel_central_t* cl) {
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  if (__atomic_load_n(&cl->take_tick, __ATOMIC_RELAXED) != now) __atomic_store_n(&cl->take_tick, now, __ATOMIC_RELAXED);
}

/* A batch about to be parked gets its index (freelist.h); false where its blocks have no
 * room for one. */
static bool index_write(void* const* blocks, uint32_t n, const keel_class_t* k) {
  unsigned f = keel_index_fanout(k->size);
  if (f == 0 || n < 3) return false;
  for (uint32_t i = 1, j = 0, c = 0; i < n; i++) { /* block i is entry c of block j */
    keel_index_set(blocks[j], c, blocks[i]);
    if (++c == f) c = 0, j++;
  }
  return true;
}

/* Prefetches the first n blocks of an indexed batch just taken: the misses overlap here
 * instead of falling one by one on the pops. A block is read for its own entries only
 * where the page map says it is one of the class's (the index lies in free blocks, which
 * a use-after-free may have overwritten: it is a hint, never followed as a list). */
static void index_prefetch(void* list, uint32_t n, unsigned cls) {
  unsigned f = keel_index_fanout(_keel_classes[cls].size);
  if (f == 0) return;
  void* node[KEEL_BATCH_MAX];
  node[0] = list;
  for (uint32_t i = 1, j = 0, c = 0; i < n; i++) { /* block i is entry c of block j */
    if (c == 0 && (node[j] == NULL || (j > 0 && keel_pagemap_get(node[j]) != cls))) return;
    void* q = node[i] = keel_index_get(node[j], c);
    if (q != NULL) __builtin_prefetch(q, 1, 3);
    if (++c == f) c = 0, j++;
  }
}

/* A parked list for a take of want blocks, or NULL: whole if it fits, else (a whole
 * batch for a bin that wants half of one) its front half, the back half parked again. */
void* _keel_central_take_parked(unsigned cls, uint32_t want, uint32_t* got) {
  const keel_class_t* k = &_keel_classes[cls];
  uint32_t half = half_of(k);
  *got = 0;
  if (!_keel_central_parks(cls, want)) return NULL;
  uint32_t n;
  bool indexed;
  void* list = _keel_transfer_get(cls, &n, &indexed);
  if (list == NULL) return NULL;
  /* A take from the transfer cache counts too: a class that cycles its blocks through
   * it (PostgreSQL's 8-32 KiB memory-context blocks, batches of one) and spills the
   * surplus into its slabs is not cold, and purging what the spills free would make
   * the next refill fault the pages back in. */
  stamp_take(keel_central_of(cls));
  if (indexed) index_prefetch(list, n > want ? half : n, cls);
  if (n > want) {
    void* last = list;
    for (uint32_t i = 1; i < half; i++) last = list_next(last, cls);
    void* back = list_next(last, cls);
    keel_link_set(last, NULL);
    _keel_central_give(cls, back, n - half);
    n = half;
  }
  *got = n;
  return list;
}


void* _keel_central_take(unsigned cls, uint32_t want, uint32_t* got) {
  void* parked = _keel_central_take_parked(cls, want, got);
  return parked != NULL ? parked : _keel_central_take_slabs(cls, want, got);
}

/* Locks line's share of cls (activating the class, and adding the line to the class's
 * lines, first if needed) and returns the class. No Keel lock may be held. */
static inline keel_central_t* lock_line(unsigned cls, unsigned line) {
  keel_central_t* cl = KEEL_UNLIKELY(!_keel_central_active(cls)) ? _keel_central_activate(cls) : keel_central_of(cls);
  if (KEEL_UNLIKELY(!(keel_central_lines(cl) & (1u << line)))) class_add_line(cl, line);
  keel_lock(&home_of(cl, line)->lock);
  return cl;
}

void* _keel_central_take_slabs_how(unsigned cls, uint32_t want, uint32_t* got, keel_take_t how) {
  const keel_class_t* k = &_keel_classes[cls];
  bool apart = _keel_transfer_apart();
  adopt_t adopt = !apart ? ADOPT_ANY : keel_opt(own_lines) ? ADOPT_OWN_LINES : ADOPT_APART;
  unsigned line = keel_many_cores() || apart ? _keel_transfer_home() : 0;
  keel_central_t* cl = lock_line(cls, line);
  keel_home_t* h = home_of(cl, line);
  count_trip(cl, h, line);
  h->taker = _keel_thread.tag;
  taken_t taken;
  taken_start(&taken, k);
  uint32_t n = 0;
  bool grew = false;
  while (n < want && !taken_full(&taken)) {
    keel_slab_t* s = h->partial;
    if (s == NULL && __atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) != 0)
      s = partial_adopt(cl, line, how == KEEL_TAKE_ANY_LINE ? ADOPT_ANY : adopt);
    if (s == NULL) {
      /* No slab with a free block: a parked batch goes back to its slabs rather than the
       * class taking a new slab beside it (a take too small for a batch - a young
       * thread's, a bin's first - would otherwise grow the heap while batches wait). Its
       * slabs may be other lines', so without this line's lock. */
      uint32_t parked;
      bool indexed;
      void* list = _keel_transfer_get(cls, &parked, &indexed);
      if (list != NULL) {
        keel_unlock(&h->lock);
        if (indexed) index_prefetch(list, parked, cls);
        _keel_central_give_slabs(cls, list);
        keel_lock(&h->lock);
        continue;
      }
      if (how == KEEL_TAKE_NO_NEW_SLAB) break;
      s = slab_new(cls, false, adopt == ADOPT_OWN_LINES ? (int)line : -1);
      if (s == NULL) break;
      grew = true;
      __atomic_store_n(&s->home, (uint8_t)line, __ATOMIC_RELAXED);
      partial_push(cl, s);
    }
    n += slab_take(s, cls, want - n, &taken);
    if (s->used == k->count) slab_became_full(cl, s, k);
  }
  if (n > 0) stamp_take(cl);
  home_out_add(h, n);
  bool exhausted = __atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) == 0;
  keel_unlock(&h->lock);
  void* head = taken_link(&taken);
  *got = n;
  if (KEEL_UNLIKELY(grew))
    _keel_classes_slabs_grew(__atomic_load_n(&slab_units, __ATOMIC_RELAXED) << KEEL_UNIT_SHIFT);
  if (KEEL_UNLIKELY((exhausted || grew) && __atomic_load_n(&_keel_class_group_pending[cls], __ATOMIC_RELAXED)))
    _keel_classes_coarse_used(cls, exhausted);
  return head;
}

bool _keel_central_has_free(unsigned cls) {
  const keel_central_t* cl = keel_central_of(cls);
  return __atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) != 0 || _keel_transfer_any(cls);
}

KEEL_COLD void* _keel_central_take_sampled(unsigned cls) {
  keel_central_t* cl = lock_line(cls, 0); /* profile-sample slabs are line 0's */
  keel_slab_t* s = cl->sampled_partial;
  if (s == NULL && (s = slab_new(cls, true, -1)) != NULL) partial_push(cl, s);
  taken_t taken;
  taken_start(&taken, &_keel_classes[cls]);
  if (s != NULL) {
    slab_take(s, cls, 1, &taken);
    if (s->used == _keel_classes[cls].count) slab_became_full(cl, s, &_keel_classes[cls]);
    home_out_add(&cl->home, 1);
  }
  keel_unlock(&cl->home.lock);
  return taken_link(&taken);
}

/* Index of block p in its slab, or -1 if p is not the start of a block. */
static long block_index(unsigned cls, keel_slab_t* head, const void* p) {
  const keel_class_t* k = &_keel_classes[cls];
  uintptr_t off = (uintptr_t)p - (uintptr_t)slab_base(keel_chunk_of(head), head);
  uint64_t idx = ((uint64_t)off * k->div_magic) >> 40;
  if (idx >= k->count || idx * k->size != off) return -1;
  return (long)idx;
}

void* _keel_block_start(unsigned cls, const void* p, bool* exact) {
  keel_slab_t* s = keel_span_of(p);
  const keel_class_t* k = &_keel_classes[cls];
  uintptr_t base = (uintptr_t)slab_base(keel_chunk_of(s), s);
  uint64_t idx = ((uint64_t)((uintptr_t)p - base) * k->div_magic) >> 40;
  void* start = (void*)(base + idx * k->size);
  *exact = (start == p) && idx < k->count;
  return start;
}

/* Lock held: the n blocks of mask (bits of bitmap word w of slab s, all checked to be
 * out of the slab) come back; in a cold class the pages they leave free are purged now
 * unless !purge_now. Out of line: put_runs's loop stays small. */
static KEEL_NOINLINE void slab_put_bits(keel_central_t* cl, unsigned cls, keel_slab_t* s, unsigned w, uint64_t mask,
                                        unsigned n, bool purge_now) {
  const keel_class_t* k = &_keel_classes[cls];
  if (s->row == 0 && s->ready > 1) slab_rows_restore(s, k);
  KEEL_SLAB_BITS(s, w) |= mask;
  s->needs_trim = 1;
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  s->put_tick = now;
  if (w < s->scan) s->scan = (uint16_t)w;
  s->used = (uint16_t)(s->used - n);
  home_out_add(home_of(cl, s->home), -(int64_t)n);
  uint32_t cold = __atomic_load_n(&_keel_cold_ticks, __ATOMIC_RELAXED);
  if (KEEL_UNLIKELY(cold != 0 && now - __atomic_load_n(&cl->take_tick, __ATOMIC_RELAXED) >= cold) && s->used > 0 &&
      purge_now)
    _keel_slab_purge_freed(k, s, w, mask);
  if (s->used == 0) {
    /* Keep a lone empty slab: releasing it would make a class that is used a little
     * at a time create and destroy the same slab over and over. */
    if (s->in_partial && partial_others(cl, s) && slab_releasable(s)) {
      partial_remove(cl, s);
      slab_release(cls, s);
      return;
    }
    bool others = s->sampled ? cl->sampled_partial != NULL : __atomic_load_n(&cl->partial_lines, __ATOMIC_RELAXED) != 0;
    if (!s->in_partial && others && slab_releasable(s)) {
      slab_release(cls, s);
      return;
    }
  }
  if (!s->in_partial) partial_push(cl, s);
  if (keel_class_big(k)) _keel_slab_trim_on_free(cls, s);
}

/* What a caller holds of a class, let go before a misuse is reported: nothing, one
 * line's lock, or the class's (all of its lines'). */
typedef struct held_s {
  keel_central_t* cl;
  keel_home_t* line;
} held_t;
#define HELD_NOTHING ((held_t){NULL, NULL})
#define HELD_CLASS(c) ((held_t){(c), NULL})

static KEEL_COLD void let_go(held_t held) {
  if (held.line != NULL) keel_unlock(&held.line->lock);
  else if (held.cl != NULL) _keel_central_unlock_class(held.cl);
}

/* Block p of class cls, its slab and its index, or a stop naming the bad free (what is
 * held let go first). */
static KEEL_ALWAYS_INLINE keel_slab_t* slab_of_block(held_t held, unsigned cls, const void* p, size_t* idx) {
  keel_slab_t* s = keel_span_of(p);
  long i = s->state == KEEL_UNIT_SLAB && s->cls == cls ? block_index(cls, s, p) : -1;
  if (i < 0) {
    let_go(held);
    _keel_misuse("free", "invalid pointer", p, ": not the start of a block", _keel_classes[cls].size);
  }
  *idx = (size_t)i;
  return s;
}

static KEEL_COLD _Noreturn void double_free(held_t held, unsigned cls, const void* p) {
  let_go(held);
  _keel_misuse("free", "double free of pointer", p, NULL, _keel_classes[cls].size);
}

/* Returns block p to its slab; the central lock of cls is held (slab.h). */
void _keel_slab_put(keel_central_t* cl, unsigned cls, void* p) {
  size_t idx;
  keel_slab_t* s = slab_of_block(HELD_CLASS(cl), cls, p, &idx);
  /* A block in a word never written was never handed out: reported as free. */
  uint64_t bit = (uint64_t)1 << (idx % 64);
  if (keel_slab_word(s, _keel_classes[cls].count, (unsigned)(idx / 64)) & bit) double_free(HELD_CLASS(cl), cls, p);
  slab_put_bits(cl, cls, s, (unsigned)(idx / 64), bit, 1, false);
}

/* A list going back to its slabs is put in two steps: without the lock, its blocks are
 * grouped into runs of one bitmap word of one slab (a batch mostly holds blocks side by
 * side, taken from a slab in order and freed in or against that order), every link
 * decoded and checked; under the lock, each run is checked against its word and put
 * back with one update of the slab. The lock is held for the bitmap work alone. */
#define PUT_RUNS 32u
typedef struct put_run_s {
  keel_slab_t* slab;
  uint64_t mask; /* the run's blocks, as bits of the word */
  uint32_t word;
  uint32_t n;
} put_run_t;

/* Groups list into at most PUT_RUNS runs, taking at most *left of its blocks (counted
 * down); returns what is left of it. A block twice in a run is a double free; held is
 * the class's central list if its lock is held. */
static KEEL_ALWAYS_INLINE void* group_list(held_t held, unsigned cls, void* list, uint32_t* left,
                                           put_run_t* runs, unsigned* nruns) {
  const keel_class_t* k = &_keel_classes[cls];
  unsigned r = 0;
  while (list != NULL && *left != 0 && r < PUT_RUNS) {
    void* p = list;
    size_t idx;
    keel_slab_t* s = slab_of_block(held, cls, p, &idx);
    unsigned w = (unsigned)(idx / 64);
    uintptr_t first = (uintptr_t)slab_base(keel_chunk_of(s), s) + (size_t)w * 64 * k->size;
    uintptr_t span = (uintptr_t)(k->count - w * 64 < 64 ? k->count - w * 64 : 64) * k->size;
    uint64_t mask = 0;
    unsigned n = 1;
    for (;; n++) {
      uint64_t bit = (uint64_t)1 << (idx % 64);
      if (mask & bit) double_free(held, cls, p);
      mask |= bit;
      void* next = keel_link_next(p, cls);
      if (--*left == 0) { /* the rest is the caller's (a bin's own blocks) */
        list = next;
        break;
      }
      uintptr_t off = (uintptr_t)next - first;
      uint64_t j = ((uint64_t)off * k->div_magic) >> 40;
      if (next == NULL || off >= span || j * k->size != off) {
        /* Off this word: the page map vouches for the class (list_next). */
        list = next != NULL ? list_next(p, cls) : NULL;
        break;
      }
      p = next;
      idx = (size_t)w * 64 + j;
    }
    runs[r++] = (put_run_t){s, mask, w, n};
  }
  *nruns = r;
  return list;
}

/* The runs go back to their slabs, with the lock of run r's slab's line held from r on
 * (the class's lock covers them all). A run's slab was a slab of cls when it was
 * grouped, and stays one while any block of it is out; one that a run before emptied
 * and released means a block came back twice. */
static void put_run(keel_central_t* cl, held_t held, unsigned cls, const put_run_t* run) {
  const keel_class_t* k = &_keel_classes[cls];
  keel_slab_t* s = run->slab;
  uint64_t twice = s->state == KEEL_UNIT_SLAB && s->cls == cls ? keel_slab_word(s, k->count, run->word) & run->mask
                                                               : run->mask;
  if (KEEL_UNLIKELY(twice != 0)) {
    size_t idx = (size_t)run->word * 64 + (size_t)__builtin_ctzll(twice);
    double_free(held, cls, (char*)slab_base(keel_chunk_of(s), s) + idx * k->size);
  }
  slab_put_bits(cl, cls, s, run->word, run->mask, run->n, true);
}

/* Class lock held. */
static void put_runs(keel_central_t* cl, unsigned cls, const put_run_t* runs, unsigned nruns) {
  for (unsigned r = 0; r < nruns; r++) put_run(cl, HELD_CLASS(cl), cls, &runs[r]);
}

/* No lock held: the runs go back under their slabs' lines' locks, one line at a time
 * (a batch freed by another thread mixes the slabs of several lines). A slab's line
 * changes only under that line's lock (partial_adopt), so it is read again once the
 * lock is held; a run whose slab has moved waits for its new line's turn. */
static void put_runs_by_line(keel_central_t* cl, unsigned cls, const put_run_t* runs, unsigned nruns) {
  /* One line: its lock is the class's. A class that has more keeps them; one that seems
   * to have one is asked again with line 0's lock held, which a line needs to join (the
   * first read may be stale, and a slab already another line's). */
  if (keel_central_lines(cl) == 1) {
    keel_lock(&cl->home.lock);
    if (keel_central_lines(cl) == 1) {
      count_trip(cl, &cl->home, 0);
      put_runs(cl, cls, runs, nruns);
      keel_unlock(&cl->home.lock);
      return;
    }
    keel_unlock(&cl->home.lock);
  }
  uint32_t done = 0, all = nruns == 32 ? ~(uint32_t)0 : ((uint32_t)1 << nruns) - 1;
  _Static_assert(PUT_RUNS <= 32, "runs are a 32-bit mask");
  while (done != all) {
    /* (masked: a slab freed twice may no longer be one, which put_run reports) */
    unsigned line =
        __atomic_load_n(&runs[__builtin_ctz(~done)].slab->home, __ATOMIC_RELAXED) & (KEEL_TRANSFER_LINES - 1);
    keel_home_t* h = home_of(cl, line);
    keel_lock(&h->lock);
    count_trip(cl, h, line);
    for (uint32_t m = all & ~done; m != 0; m &= m - 1) {
      unsigned r = (unsigned)__builtin_ctz(m);
      if (__atomic_load_n(&runs[r].slab->home, __ATOMIC_RELAXED) != line) continue;
      put_run(cl, (held_t){cl, h}, cls, &runs[r]);
      done |= (uint32_t)1 << r;
    }
    keel_unlock(&h->lock);
  }
}

KEEL_COLD void _keel_central_put_locked(unsigned cls, void* list) { _keel_slab_put_list(keel_central_of(cls), cls, list); }

/* Lock held: every block of a list goes back to its slab. */
void _keel_slab_put_list(keel_central_t* cl, unsigned cls, void* list) {
  put_run_t runs[PUT_RUNS];
  unsigned n;
  uint32_t left = UINT32_MAX;
  while (list != NULL) {
    list = group_list(HELD_CLASS(cl), cls, list, &left, runs, &n);
    put_runs(cl, cls, runs, n);
  }
}

/* The first n blocks of list go back to their slabs; returns the rest of the list. */
static void* give_slabs_front(unsigned cls, void* list, uint32_t n) {
  keel_central_t* cl = keel_central_of(cls);
  put_run_t runs[PUT_RUNS];
  unsigned nruns;
  while (list != NULL && n != 0) {
    list = group_list(HELD_NOTHING, cls, list, &n, runs, &nruns);
    put_runs_by_line(cl, cls, runs, nruns);
  }
  return list;
}

/* A whole or half batch may park in the transfer cache. */
static inline bool parkable(const keel_class_t* k, uint32_t n) {
  return k->transfer_max > 0 && (n == k->batch || n == half_of(k));
}

void _keel_central_give(unsigned cls, void* list, uint32_t n) {
  const keel_class_t* k = &_keel_classes[cls];
  if (parkable(k, n) && _keel_transfer_put(cls, list, n != k->batch)) return;
  _keel_central_give_slabs(cls, list);
}

void* _keel_central_give_front(unsigned cls, void* list, uint32_t n) {
  const keel_class_t* k = &_keel_classes[cls];
  /* Cut off (a walk of n blocks) only for the transfer cache: a batch for the slabs is
   * grouped in the same walk. */
  void** slot = parkable(k, n) ? _keel_transfer_room(cls) : NULL;
  if (slot == NULL) return give_slabs_front(cls, list, n);
  keel_assert(n <= KEEL_BATCH_MAX);
  void* blocks[KEEL_BATCH_MAX];
  void* last = blocks[0] = list;
  for (uint32_t i = 1; i < n; i++) blocks[i] = last = keel_link_next(last, cls);
  void* rest = keel_link_next(last, cls);
  keel_link_set(last, NULL);
  bool indexed = index_write(blocks, n, k);
  if (!_keel_transfer_put_at(slot, cls, list, n != k->batch, indexed)) _keel_central_give_slabs(cls, list);
  return rest;
}

void _keel_central_give_slabs(unsigned cls, void* list) { give_slabs_front(cls, list, UINT32_MAX); }

struct find_s {
  void* p;
  unsigned cls;
  bool found;
};
static void find_in_list(void* list, uint32_t n, void* ctx) {
  struct find_s* f = (struct find_s*)ctx;
  (void)n;
  for (void* q = list; q != NULL && !f->found; q = list_next(q, f->cls)) f->found = (q == f->p);
}

KEEL_COLD bool _keel_central_is_free(unsigned cls, void* p) {
  keel_central_t* cl = keel_central_of(cls);
  _keel_central_lock_class(cl);
  keel_slab_t* s = keel_span_of(p);
  bool is_free = false;
  if (s->state == KEEL_UNIT_SLAB && s->cls == cls) {
    long idx = block_index(cls, s, p);
    if (idx >= 0) is_free = (keel_slab_word(s, _keel_classes[cls].count, (unsigned)(idx / 64)) >> (idx % 64)) & 1;
  }
  if (!is_free) {
    struct find_s find = {p, cls, false};
    _keel_transfer_each(cls, find_in_list, &find);
    is_free = find.found;
  }
  _keel_central_unlock_class(cl);
  return is_free;
}

/* ---- for borrow.c and slab_trim.c (slab.h): calls on their cold paths, so that the
 * take and put paths above keep these helpers inlined. */

void _keel_slab_rows_take(keel_slab_t* s, const keel_class_t* k) { slab_rows_take(s, k); }

void _keel_slab_became_full(keel_central_t* cl, keel_slab_t* s, const keel_class_t* k) {
  slab_became_full(cl, s, k);
}

bool _keel_slab_release_empty(keel_central_t* cl, unsigned cls, keel_slab_t* s) {
  if (s->used != 0 || !slab_releasable(s)) return false;
  partial_remove(cl, s);
  slab_release(cls, s);
  return true;
}

/* The active classes' locks only (above); the bits cannot change while activate_lock
 * is held, nor a class's lines while its lock is. */
void _keel_central_lock_all(void) {
  keel_lock(&activate_lock);
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++)
    if (_keel_central_active(cls)) _keel_central_lock_class(keel_central_of(cls));
}
void _keel_central_unlock_all(void) {
  for (unsigned cls = KEEL_NUM_CLASSES - 1; cls >= 1; cls--)
    if (_keel_central_active(cls)) _keel_central_unlock_class(keel_central_of(cls));
  keel_unlock(&activate_lock);
}
void _keel_central_reset_locks(void) {
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    if (!_keel_central_active(cls)) continue;
    keel_central_t* cl = keel_central_of(cls);
    for (uint32_t m = keel_central_lines(cl); m != 0; m &= m - 1) keel_lock_reset(lowest_lock(cl, m));
  }
  keel_lock_reset(&activate_lock);
}
