/* tcache.c -- per-thread caches of free blocks: their slow paths and life cycle.
 *
 * A thread allocates from and frees into its own cache without locks or atomic
 * read-modify-writes, whatever thread allocated the block: a cross-thread free is just
 * a local push, and the block travels back through the central list in a batch.
 * A cache holds only free blocks, never pages, and a thread gets one only once it has
 * shown it needs one (young threads, below); its bins then start small and grow only
 * while the thread keeps missing. So 4,000 parked threads do not pin 4,000 pages per
 * size class, nor 4,000 caches of free blocks.
 * A cache belongs to its thread. An exiting thread hands its whole batches on, and its
 * cache waits with its room and the rest of its blocks for the next thread that starts (a
 * connection thread replacing one that ended takes over a warm cache and no lock); one
 * that nobody takes within the purge delay gives its blocks back. */
#include "core/internal.h"

_Thread_local keel_thread_t _keel_thread = {.tc = &_keel_tc_empty};
/* All bins empty with no room: every access misses, also before start-up. */
keel_tcache_t _keel_tc_empty = {.head = {[0 ... KEEL_NUM_CLASSES - 1] = KEEL_LINK_END}};

/* Young threads. A new thread stays on the empty cache for its first YOUNG_OPS small
 * allocations and frees: each goes straight to the central list (one lock round trip,
 * tens of nanoseconds). A thread that allocates a little and parks -- most of the
 * thousands of threads of a database server -- then costs the blocks it holds and
 * nothing else: no cache struct (about 2 KiB), no free blocks kept for it, no blocks
 * taken ahead of need (its frees go back to the slabs, where the next thread's
 * allocations find them). A thread that keeps going gets its cache at its next slow-path
 * call, having paid at most YOUNG_OPS lock round trips (a few microseconds). With the
 * heap profiler on (its hook _keel_tcache_sampling set), a thread gets its cache at
 * once: sampling counts down in the bins. */
#define YOUNG_OPS 64

enum { THREAD_NEW = 0, THREAD_YOUNG, THREAD_CACHED, THREAD_BUSY, THREAD_GONE };
static _Thread_local uint8_t thread_state;
static _Thread_local uint8_t young_ops; /* slow-path calls made while young */

static keel_lock_t registry_lock KEEL_ALWAYS_BSS = KEEL_LOCK_INIT;
keel_lock_t* const _keel_lock_threads = &registry_lock; /* statistics (stats.c) */
static keel_tcache_t* registry;    /* live caches */
/* The first cache is static, on the page where the hot .bss ends (beside the locks,
 * src/hot_text.ld), which every process writes anyway, and starts on the spare list: a
 * program with one thread that caches then maps no metadata region and writes no page
 * of one (4 KiB of RssAnon in every process, every PostgreSQL backend included). */
static keel_tcache_t first_cache KEEL_ALWAYS_BSS;
static keel_tcache_t* spare = &first_cache; /* caches of exited threads, for reuse */
/* Caches in use or kept with their blocks (cache_budget's share, the transfer cache's
 * many-core policy): written under the registry lock, read without it. */
uint64_t _keel_live_caches;
uint64_t _keel_caches_in_use; /* of those, caches a thread uses (tcache.h); the same lock */
static uint64_t live_threads, total_threads; /* threads seen, young or with a cache */
static uint64_t last_start_tick;            /* purger tick at which a thread last started */

/* A thread's first call: counted, and when (on_thread_exit asks). Registry lock held. */
static void count_thread_start(void) {
  live_threads++;
  total_threads++;
  _keel_thread.tag = (uint8_t)total_threads;
  __atomic_store_n(&last_start_tick, __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* Small classes of a small heap move half batches. A class whose slabs are few holds
 * few blocks in all, and bins of two batches in each thread plus the transfer cache
 * kept a third of them free (xthread: four threads trading 32 B-8 KiB objects, 30
 * classes of one or two slabs each, 0.5-0.8 MiB live and 0.9 MiB cached). So while the
 * heap is small (the coarse classes' phase, KEEL_FINE_CLASSES) and a class spans fewer
 * than SMALL_CLASS_SLABS slabs, its bins grow to one batch only and move half a batch
 * at a time, so a bin still refills and flushes from the middle of its range; the
 * central list joins two halves into a batch for the transfer cache (central.c). In a
 * big heap the few small classes' caches are a small share of it, and half batches
 * would only double their lock round trips (xthread at 64 threads: 5-9 % more time);
 * nor in a class whose lock is busy (central.h). */
#define SMALL_CLASS_SLABS 4
/* One thread cache in use in the process (an exited thread's, kept for the next, waits
 * unused): no other thread could take what its bins hold, so neither rule above nor
 * below spares the class anything (a program's only thread, a PostgreSQL backend). */
static inline bool one_cache(void) { return __atomic_load_n(&_keel_caches_in_use, __ATOMIC_RELAXED) <= 1; }
static uint32_t bin_batch(const keel_class_t* k, unsigned cls) {
  if (k->batch < 2 || one_cache() || _keel_classes_are_fine() ||
      __atomic_load_n(&keel_central_of(cls)->slabs, __ATOMIC_RELAXED) >= SMALL_CLASS_SLABS ||
      _keel_central_busy(cls))
    return k->batch;
  return k->batch / 2u;
}

/* A cache's byte budget: KEEL_TCACHE_MAX, but no more than its share of
 * KEEL_TCACHE_TOTAL among the live caches, and never below CACHE_FLOOR. With a thread
 * per connection, a thousand caches of KEEL_TCACHE_MAX each would hold a gigabyte of
 * free blocks, most of it in threads that wait for their next query. */
#define CACHE_FLOOR (16u << 10)
static size_t cache_budget(void) {
  uint64_t own = keel_opt(tcache_bytes), live = __atomic_load_n(&_keel_live_caches, __ATOMIC_RELAXED);
  uint64_t share = live > 1 ? keel_opt(tcache_total) / live : own;
  if (share < CACHE_FLOOR) share = CACHE_FLOOR;
  return share < own ? share : own;
}

/* The shares alone do not bound the sum: a cache that grew while few threads lived keeps
 * its room until its own thread gives it up, which a waiting thread never does. So the
 * room of all caches beyond CACHE_FLOOR each is also counted, and a bin grows past its
 * cache's floor only while that sum stays within KEEL_TCACHE_TOTAL. */
static uint64_t room_above_floors;
static inline size_t above_floor(size_t bytes) { return bytes > CACHE_FLOOR ? bytes - CACHE_FLOOR : 0; }

/* Sets t's room in bytes; false (and nothing changed) where growing past the floor would
 * take the sum over KEEL_TCACHE_TOTAL. */
static KEEL_NOINLINE bool room_set(keel_tcache_t* t, size_t bytes) {
  size_t was = above_floor(t->max_bytes), now = above_floor(bytes);
  if (now > was) {
    uint64_t sum = __atomic_add_fetch(&room_above_floors, now - was, __ATOMIC_RELAXED);
    if (sum > keel_opt(tcache_total)) {
      __atomic_sub_fetch(&room_above_floors, now - was, __ATOMIC_RELAXED);
      return false;
    }
  } else if (now < was) {
    __atomic_sub_fetch(&room_above_floors, was - now, __ATOMIC_RELAXED);
  }
  t->max_bytes = bytes;
  return true;
}

/* A bin's limit: the class's, or ONE_CACHE_BINS times it for blocks up to
 * ONE_CACHE_BIN_SIZE in the only cache. A thread whose working set of small blocks
 * outgrows its bin hands each surplus block through the transfer cache and back, some
 * 50 instructions a block (glibc's bench-malloc-simple: 1,600 blocks of 16-64 bytes, all
 * freed, again and again); with one cache the bin may hold them instead. Larger blocks
 * keep the limit: their round trip is small beside their use, and a single-threaded
 * server's 1-32 KiB blocks (PostgreSQL's memory contexts) would sit in its bins. */
#define ONE_CACHE_BINS 4u
#define ONE_CACHE_BIN_SIZE 512u
/* Not inlined, nor is bin_grow: copies in each slow path pushed the hot text past its
 * 64 KiB window (src/hot_text.ld). */
static KEEL_NOINLINE uint32_t bin_limit(const keel_class_t* k) {
  return k->size <= ONE_CACHE_BIN_SIZE && one_cache() ? k->bin_limit * ONE_CACHE_BINS : k->bin_limit;
}

/* Slow start: a bin starts with room for one block and doubles each time it runs dry or
 * overflows, up to a batch, then grows by batches up to its limit. A thread that
 * allocates a little therefore takes only a little from the shared slabs (and touches
 * no other memory), while a busy thread reaches full batches after a few misses. No
 * room at all in checked mode, nor for classes above KEEL_CACHED_MAX. */
static uint32_t initial_max(unsigned cls) {
  return _keel_options.check || _keel_classes[cls].bin_limit == 0 ? 0 : 1;
}

/* More room for bin b, if its limit and the thread's byte budget allow. */
static KEEL_NOINLINE void bin_grow(keel_tcache_t* t, unsigned cls) {
  const keel_class_t* k = &_keel_classes[cls];
  uint32_t max = t->bin[cls].max, limit = bin_limit(k);
  if (max >= limit || _keel_options.check) return;
  if (max >= k->batch && bin_batch(k, cls) != k->batch) return; /* a small class */
  uint32_t grow = k->batch; /* past a batch */
  if (max < k->batch) grow = max == 0 ? 1 : max < k->batch - max ? max : k->batch - max; /* doubling */
  if (max + grow > limit) grow = limit - max;
  size_t bytes = t->max_bytes + (size_t)grow * k->size;
  if (bytes > cache_budget() || !room_set(t, bytes)) return;
  t->bin[cls].max += grow;
  t->bin[cls].avail += grow;
}

/* Less room for bin cls, which just handed n blocks back and holds room for at least
 * those, when the cache is over its budget or the bin over its limit (it grew while fewer
 * threads shared the total, or while its cache was the only one): up to n - 1 units,
 * keeping one for the block being freed and at least one. */
static void bin_shrink(keel_tcache_t* t, unsigned cls, uint32_t n) {
  uint32_t max = t->bin[cls].max, limit = bin_limit(&_keel_classes[cls]);
  uint32_t spare_room = max - 1u, drop = n - 1u < spare_room ? n - 1u : spare_room;
  if (t->max_bytes <= cache_budget()) { /* within budget: only the room above the limit */
    uint32_t above = max > limit ? max - limit : 0u;
    if (drop > above) drop = above;
  }
  if (drop == 0) return;
  t->bin[cls].max -= drop;
  t->bin[cls].avail -= drop;
  room_set(t, t->max_bytes - (size_t)drop * _keel_classes[cls].size);
}

void (*_keel_tcache_sampling)(keel_tcache_t* t);

/* A cache's bins sample afresh for its new thread (the profiler's hook, if it is on). */
static void bins_restart_sampling(keel_tcache_t* t) {
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++)
    keel_bin_set_countdown(&t->bin[cls], UINT32_MAX); /* no sample, in effect */
  void (*sampling)(keel_tcache_t*) = __atomic_load_n(&_keel_tcache_sampling, __ATOMIC_RELAXED);
  if (sampling != NULL) sampling(t);
}

static void bins_reset(keel_tcache_t* t) {
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    t->head[cls] = KEEL_LINK_END;
    t->bin[cls].max = initial_max(cls);
    t->bin[cls].avail = t->bin[cls].max;
  }
  bins_restart_sampling(t);
  t->head[0] = KEEL_LINK_END;
  t->bin[0].max = t->bin[0].avail = 0;
  room_set(t, 0);
}

static void on_thread_exit(void* value);

/* Counts a young thread and binds the exit handler to it (with the empty cache as its
 * value: no allocation), so that its end is counted too. False if the thread-exit hook
 * cannot be had: the thread then stays cacheless, as before a cache could exist. */
static bool thread_register(void) {
  thread_state = THREAD_BUSY; /* a malloc inside this one is served from central */
  keel_ensure_init();
  if (!_keel_prim_thread_exit_init(on_thread_exit)) {
    thread_state = THREAD_NEW;
    return false;
  }
  keel_lock(&registry_lock);
  count_thread_start();
  /* A young thread beside a cache: spread now, so that its takes come from its own
   * processor's slabs (transfer.h, apart) rather than from the holes of the other's. */
  if (live_threads >= 2 && _keel_live_caches >= 1) _keel_transfer_spread();
  keel_unlock(&registry_lock);
  _keel_prim_thread_bind(&_keel_tc_empty);
  thread_state = THREAD_YOUNG;
  return true;
}

static keel_tcache_t* tcache_create(void) {
  uint8_t was = thread_state; /* NEW or YOUNG */
  thread_state = THREAD_BUSY;
  keel_ensure_init();
  if (!_keel_prim_thread_exit_init(on_thread_exit)) {
    thread_state = was;
    return NULL;
  }
  keel_lock(&registry_lock);
  keel_tcache_t* t = spare;
  if (t) __atomic_store_n(&spare, t->next, __ATOMIC_RELAXED);
  else t = _keel_tcache_slot_alloc();
  keel_unlock(&registry_lock);
  if (t == NULL) {
    /* Out of memory: stay cacheless and try again only after another YOUNG_OPS
     * slow-path calls, not on every one. */
    thread_state = was;
    young_ops = 0;
    return NULL;
  }
  bool kept = t->kept;
  if (kept) {
    __atomic_store_n(&t->kept, false, __ATOMIC_RELAXED);
    bins_restart_sampling(t);
  } else {
    bins_reset(t);
    t->refills = t->flushes = 0;
  }
  t->owner = &_keel_thread;
  t->active_tick = __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  keel_lock(&registry_lock);
  __atomic_store_n(&_keel_thread.own, t, __ATOMIC_RELAXED); /* read without the lock (transfer.c) */
  t->prev = NULL;
  t->next = registry;
  if (registry) registry->prev = t;
  registry = t;
  if (!kept) __atomic_store_n(&_keel_live_caches, _keel_live_caches + 1, __ATOMIC_RELAXED);
  __atomic_store_n(&_keel_caches_in_use, _keel_caches_in_use + 1, __ATOMIC_RELAXED);
  if (_keel_live_caches == 1 && _keel_transfer_lines() == 1) _keel_transfer_first_cache();
  if (_keel_live_caches >= 2) _keel_transfer_spread();
  if (was == THREAD_NEW) count_thread_start();
  __atomic_store_n(&_keel_thread.tc, t, __ATOMIC_RELAXED); /* the purger swaps it under the lock */
  keel_unlock(&registry_lock);
  _keel_prim_thread_bind(t);
  thread_state = THREAD_CACHED;
  return t;
}

/* A thread on the empty cache that had its own: the purger or a gather was looking at
 * it, and the thread takes it again under the registry lock, so never while they are
 * still at work; or the purger gave it back, and the thread gets a new one (NULL). While
 * the lock is held this call goes to the central lists rather than wait (NULL, the thread
 * still cached): a gathering thread preempted there held it up to 20 ms (Sphinx on 2
 * cores). */
static keel_tcache_t* tcache_rebind(void) {
  if (!keel_trylock(&registry_lock)) return NULL;
  keel_tcache_t* t = _keel_thread.own;
  if (t != NULL) {
    __atomic_store_n(&_keel_thread.tc, t, __ATOMIC_RELAXED);
  }
  keel_unlock(&registry_lock);
  if (t == NULL) { /* young again, but one that has shown it works: a cache at once */
    thread_state = THREAD_YOUNG;
    young_ops = YOUNG_OPS;
  }
  return t;
}

/* A cache an exited thread left is waiting (not the static first one): a young thread
 * takes it at once, since it costs nothing that is not already spent, rather than going
 * to the central lists' locks for its first YOUNG_OPS calls (a server whose connection
 * threads come and go, larson's chains of threads). A hint, read without the lock. */
static inline bool spare_recycled(void) {
  keel_tcache_t* s = __atomic_load_n(&spare, __ATOMIC_RELAXED);
  return s != NULL && (s != &first_cache || __atomic_load_n(&s->kept, __ATOMIC_RELAXED));
}

/* The slow paths of a thread on the empty cache: its cache, or NULL while it is young
 * (or busy creating its cache, or exiting, or cannot have one), in which case the block
 * goes to or comes from the central list directly. */
static keel_tcache_t* tcache_or_young(void) {
  if (thread_state == THREAD_CACHED) {
    keel_tcache_t* t = tcache_rebind();
    if (t != NULL) return t;
  }
  if (thread_state == THREAD_NEW && !thread_register()) return tcache_create();
  if (thread_state != THREAD_YOUNG) return NULL;
  if (young_ops < YOUNG_OPS && __atomic_load_n(&_keel_tcache_sampling, __ATOMIC_RELAXED) == NULL && !spare_recycled()) {
    young_ops++;
    return NULL;
  }
  return tcache_create();
}

/* free's slow path of a thread on the empty cache. A thread whose first calls are frees
 * may be one that glibc is tearing down after its key destructors ran: it frees the
 * thread's DTV there, and those of the cached stacks it evicts. Registered then, the
 * thread would never be counted out, and a cache given to it would keep a pointer into
 * its freed TLS, through which the purger later writes. So a free registers a thread only
 * once it has made YOUNG_OPS of them, gives it no cache in that call, and never the
 * early one (a waiting spare, the profiler's): only a live thread frees that much. */
static keel_tcache_t* tcache_for_free(void) {
  if (thread_state == THREAD_NEW) {
    if (young_ops < YOUNG_OPS) young_ops++;
    else thread_register(); /* its cache at a later call */
    return NULL;
  }
  if (thread_state == THREAD_YOUNG && young_ops < YOUNG_OPS) {
    young_ops++;
    return NULL;
  }
  return tcache_or_young();
}

/* The first n blocks of bin cls go back to the central lists (n at most its count). */
static void bin_hand_front(keel_tcache_t* t, unsigned cls, uint32_t n) {
  keel_bin_set_first(t, cls, _keel_central_give_front(cls, keel_bin_first(t, cls), n));
  t->bin[cls].avail += n;
}

/* Bin cls's blocks go back to the central list in whole batches (to the transfer cache,
 * for the threads that go on), and what does not fill one too unless keep_rest. */
static void bin_give_back(keel_tcache_t* t, unsigned cls, bool keep_rest) {
  uint32_t batch = _keel_classes[cls].batch;
  for (uint32_t left = (uint32_t)(t->bin[cls].max - t->bin[cls].avail); left > 0;) {
    uint32_t n = left < batch ? left : batch;
    if (n < batch && keep_rest) return;
    bin_hand_front(t, cls, n);
    left -= n;
  }
}

/* Gives every cached block back: through the central lists, or straight to the slabs. */
static void cache_flush(keel_tcache_t* t, bool to_slabs) {
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    uint32_t count = (uint32_t)(t->bin[cls].max - t->bin[cls].avail);
    if (to_slabs && count > 0) _keel_central_give_slabs(cls, keel_bin_cut(t, cls, count));
    else bin_give_back(t, cls, false);
    t->bin[cls].max = initial_max(cls);
    t->bin[cls].avail = t->bin[cls].max;
  }
  room_set(t, 0);
  t->flushes++;
}

void _keel_tcache_flush(keel_tcache_t* t) { cache_flush(t, false); }

void _keel_tcache_release_spares(uint64_t min_ticks) {
  uint64_t now = __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  keel_tcache_t* stale = NULL;
  keel_lock(&registry_lock);
  for (keel_tcache_t** at = &spare; *at != NULL;) {
    keel_tcache_t* t = *at;
    if (t->kept && now - t->spare_since >= min_ticks) {
      __atomic_store_n(at, t->next, __ATOMIC_RELAXED); /* `spare` is read without the lock */
      t->next = stale;
      stale = t;
    } else {
      at = &t->next;
    }
  }
  keel_unlock(&registry_lock);
  if (stale == NULL) return;
  for (keel_tcache_t* t = stale; t != NULL; t = t->next) cache_flush(t, true);
  keel_lock(&registry_lock);
  keel_tcache_t* last = stale;
  for (keel_tcache_t* t = stale; t != NULL; last = t, t = t->next) {
    __atomic_store_n(&t->kept, false, __ATOMIC_RELAXED);
    __atomic_store_n(&_keel_live_caches, _keel_live_caches - 1, __ATOMIC_RELAXED);
  }
  last->next = spare;
  __atomic_store_n(&spare, stale, __ATOMIC_RELAXED);
  keel_unlock(&registry_lock);
}

/* Registry lock held: t, a cache in the registry, leaves it and its thread. */
static void registry_unlink(keel_tcache_t* t) {
  if (t->prev) t->prev->next = t->next;
  else registry = t->next;
  if (t->next) t->next->prev = t->prev;
  t->owner = NULL;
}

static void on_thread_exit(void* value) {
  (void)value; /* the cache bound at its creation, which the purger may have given back since */
  thread_state = THREAD_GONE; /* later frees in this thread go straight to central */
  /* Out of the registry first: from then on the purger neither takes this cache back nor
   * writes this thread's pointers, which are about to go with the thread. */
  keel_lock(&registry_lock);
  keel_tcache_t* t = _keel_thread.own;
  __atomic_store_n(&_keel_thread.own, NULL, __ATOMIC_RELAXED);
  __atomic_store_n(&_keel_thread.tc, &_keel_tc_empty, __ATOMIC_RELAXED);
  if (t != NULL) {
    registry_unlink(t);
    __atomic_store_n(&_keel_caches_in_use, _keel_caches_in_use - 1, __ATOMIC_RELAXED);
  } else {
    live_threads--; /* a young thread, or one whose cache was given back */
  }
  keel_unlock(&registry_lock);
  if (t == NULL) return;
  /* Kept whole only where the purger will return it if no thread takes it. Where no
   * thread has started within the purge delay, none is coming to take it: the process is
   * shrinking (its clients have gone), and the purger is asked to return the free memory
   * now rather than after the delay - one pass for a burst of ending threads, each of
   * which only hands its cache on as usual. */
  uint64_t now = __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  bool keep = _keel_purger_running() && t->max_bytes != 0;
  bool shrink = _keel_purger_running() && now - __atomic_load_n(&last_start_tick, __ATOMIC_RELAXED) > _keel_delay_ticks();
  /* Whole batches go on to the transfer cache, where every thread finds them (left in
   * the cache, they waited for the next thread alone: threadchurn at 64 threads on 2
   * cores held 1.11x the peak RSS); the room and the rest stay. */
  if (keep)
    for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) bin_give_back(t, cls, true);
  else
    _keel_tcache_flush(t);
  keel_lock(&registry_lock);
  if (!keep) __atomic_store_n(&_keel_live_caches, _keel_live_caches - 1, __ATOMIC_RELAXED);
  live_threads--;
  __atomic_store_n(&t->kept, keep, __ATOMIC_RELAXED);
  t->spare_since = now;
  t->next = spare;
  __atomic_store_n(&spare, t, __ATOMIC_RELAXED);
  keel_unlock(&registry_lock);
  if (shrink) _keel_purge_soon();
}

void _keel_tcache_thread_flush(void) {
  keel_tcache_t* t = keel_tc_enter();
  if (t != &_keel_tc_empty) _keel_tcache_flush(t);
  keel_tc_leave();
}

static void* one_block(void* p) {
  ((void**)p)[1] = NULL; /* the free key */
  return p;
}

/* Without a cache (while young, while creating one, or after the thread's exit handler
 * ran) blocks come from and go to the central list one at a time; from the slabs where
 * the transfer cache was looked in already. */
static void* central_alloc_one(unsigned cls, bool looked) {
  uint32_t got;
  void* p = looked ? _keel_central_take_slabs(cls, 1, &got) : _keel_central_take(cls, 1, &got);
  if (p == NULL) {
    _keel_prim_set_errno(_keel_prim_errno_enomem());
    return NULL;
  }
  return one_block(p);
}

/* The first block of a bin that has one, handed out. */
static void* bin_pop(keel_tcache_t* t, unsigned cls) {
  t->bin[cls].avail++;
  return keel_bin_pop_block(t, cls);
}

/* How many blocks an empty bin takes: what it has room for now (a first refill takes one
 * block; it grows afterwards, so a thread that allocates once from a class holds only
 * that block), at most a batch - half of one in a small class, but a whole parked batch
 * where the bin has room for it, rather than splitting it. */
static uint32_t refill_want(keel_tcache_t* t, unsigned cls) {
  const keel_class_t* k = &_keel_classes[cls];
  uint32_t max = t->bin[cls].max, batch = bin_batch(k, cls);
  if (batch != k->batch && max >= k->batch) return k->batch;
  return max < batch ? max : batch;
}

/* An empty bin takes the list of `got` blocks and hands out its first. */
static void* bin_refill(keel_tcache_t* t, unsigned cls, void* list, uint32_t got) {
  t->refills++;
  keel_bin_set_first(t, cls, list);
  t->bin[cls].avail -= got;
  bin_grow(t, cls);
  return bin_pop(t, cls);
}

/* The thread is working (the purger takes back only caches that saw no slow path for a
 * while). */
static inline void mark_active(keel_tcache_t* t) {
  __atomic_store_n(&t->active_tick, __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* ---- stopping other threads' caches ------------------------------------------------
 * Registry lock held. Each cache pick() chooses is pointed at the empty cache, one
 * membarrier covers them all, and then act() is given each, with whether its owner is
 * outside every malloc and free (the barrier ran and the busy flag is clear): act() puts
 * the owner's pointer back or takes the cache away. Returns false where a cache was
 * picked and the barrier could not run. The purger's take-back and gathering share it. */
typedef struct stop_s {
  bool (*pick)(keel_tcache_t* t, struct stop_s* self);
  void (*act)(keel_tcache_t* t, bool idle, struct stop_s* self);
} stop_t;

/* Whether other threads' caches can be stopped at all: not under TSan, which cannot see
 * the barrier, nor where membarrier was refused - then not one of them is pointed at the
 * empty cache (each would take its slow path for nothing) and no gather is counted. */
static inline bool caches_stoppable(void) { return !KEEL_TSAN && !_keel_prim_barrier_refused(); }

static bool with_caches_stopped(stop_t* how) {
  if (!caches_stoppable()) return false;
  bool any = false;
  for (keel_tcache_t* t = registry; t != NULL; t = t->next) {
    if (t->owner == &_keel_thread || !how->pick(t, how)) continue; /* never the caller's own */
    __atomic_store_n(&t->owner->tc, &_keel_tc_empty, __ATOMIC_RELAXED);
    t->taking = any = true;
  }
  if (!any) return true;
  bool fenced = _keel_prim_barrier_all_threads();
  for (keel_tcache_t *t = registry, *next; t != NULL; t = next) {
    next = t->next; /* act() may unlink t */
    if (!t->taking) continue;
    t->taking = false;
    how->act(t, fenced && __atomic_load_n(&t->owner->busy, __ATOMIC_ACQUIRE) == 0, how);
  }
  return fenced;
}

/* ---- gathering ----------------------------------------------------------------------
 * Blocks above GATHER_MIN wait in the bins like any others, but each is worth a slab's
 * share of smaller ones: every one of Sphinx's sixteen connection threads held one or two
 * blocks of each 8-32 KiB class it had used, 1.5 MiB in all, flat, while between two
 * queries it needed none. So where such a class's take finds no slab this thread may
 * take from (its transfer cache is empty too) and other caches are in use, the thread
 * gathers the class's blocks from the other threads' bins into the slabs before it takes
 * a new one, the way the purger takes back a waiting thread's cache (below): each holder
 * is pointed at the empty cache, one membarrier(2) covers them all, and a holder whose
 * busy flag is then clear gives up its bin of the class; one inside a malloc or free
 * keeps it. The holders' fast paths pay nothing (a holder that calls in meanwhile is
 * served by the central lists: tcache_rebind). The blocks go back to their own slabs,
 * which may be another line's that the take would pass by while threads are apart
 * (central.c): the take after a gather may use any line's. A gather that finds nothing
 * makes the class wait GATHER_IDLE_MS for the next; one that finds blocks lets the next
 * come at once, as each block it found is a block of new slab not taken. Without
 * membarrier, and under TSan, which cannot see it, nothing is gathered. */
#define GATHER_MIN (8u << 10)
#define GATHER_IDLE_MS 10
static uint64_t gather_after_ms[KEEL_NUM_CLASSES]; /* a class's next gather, after an idle one */
uint64_t _keel_gathers, _keel_blocks_gathered;     /* registry lock (statistics) */

typedef struct gather_s {
  stop_t how;
  unsigned cls;
  uint64_t blocks;
} gather_t;

static bool gather_pick(keel_tcache_t* t, stop_t* how) {
  unsigned cls = ((gather_t*)how)->cls;
  return t->bin[cls].max != t->bin[cls].avail;
}

static void gather_act(keel_tcache_t* t, bool idle, stop_t* how) {
  gather_t* g = (gather_t*)how;
  uint32_t count = (uint32_t)(t->bin[g->cls].max - t->bin[g->cls].avail);
  if (idle && count != 0) {
    _keel_central_give_slabs(g->cls, keel_bin_cut(t, g->cls, count));
    t->bin[g->cls].avail = (int16_t)(t->bin[g->cls].avail + (int32_t)count);
    g->blocks += count;
  }
  /* Release: the owner that finds its cache again finds the bin as left here. */
  __atomic_store_n(&t->owner->tc, t, __ATOMIC_RELEASE);
}

/* Whether blocks went back to cls's slabs: gathered now, or by another thread since this
 * one read `seen` of _keel_gathers (before its take found no slab). */
static bool gather(unsigned cls, uint64_t seen) {
  uint64_t now = _keel_prim_clock_ms();
  if (now < __atomic_load_n(&gather_after_ms[cls], __ATOMIC_RELAXED)) return false;
  keel_lock(&registry_lock);
  if (_keel_gathers != seen) {
    keel_unlock(&registry_lock);
    return true;
  }
  gather_t g = {{gather_pick, gather_act}, cls, 0};
  with_caches_stopped(&g.how);
  __atomic_store_n(&_keel_gathers, _keel_gathers + 1, __ATOMIC_RELAXED);
  __atomic_store_n(&_keel_blocks_gathered, _keel_blocks_gathered + g.blocks, __ATOMIC_RELAXED);
  if (g.blocks == 0) __atomic_store_n(&gather_after_ms[cls], now + GATHER_IDLE_MS, __ATOMIC_RELAXED);
  keel_unlock(&registry_lock);
  return g.blocks != 0;
}

/* An empty bin's take from the slabs (the transfer cache was tried): of a class above
 * GATHER_MIN with other caches in use, a gather comes before a new slab. The first take
 * then costs a second round trip to the class's lock only where it would have grown;
 * where no cache can be stopped (no gather, no count) there is one take, as before. */
static void* take_or_gather(unsigned cls, uint32_t want, uint32_t* got) {
  if (_keel_classes[cls].size <= GATHER_MIN || one_cache() || !caches_stoppable())
    return _keel_central_take_slabs(cls, want, got);
  uint64_t seen = __atomic_load_n(&_keel_gathers, __ATOMIC_RELAXED);
  void* list = _keel_central_take_slabs_how(cls, want, got, KEEL_TAKE_NO_NEW_SLAB);
  if (list != NULL) return list;
  return _keel_central_take_slabs_how(cls, want, got, gather(cls, seen) ? KEEL_TAKE_ANY_LINE : KEEL_TAKE_OR_GROW);
}

void* _keel_tcache_alloc_slow(keel_tcache_t* t, unsigned cls, size_t borrow_for) {
#if KEEL_DEBUG >= 2
  static _Thread_local unsigned verify_tick;
  if (++verify_tick % KEEL_VERIFY_EVERY == 0) _keel_verify();
#endif
  if (t == &_keel_tc_empty) t = tcache_or_young();
  if (t != NULL) mark_active(t);
  bool cached = t != NULL && t->bin[cls].max != 0; /* else cacheless, or an uncached class */
  bool looked = false; /* the transfer cache was searched and had nothing */
  uint32_t want = 0;
  if (cached && keel_bin_empty(t, cls)) {
    want = refill_want(t, cls);
    uint32_t got;
    void* list = _keel_central_take_parked(cls, want, &got);
    if (list != NULL) return bin_refill(t, cls, list, got);
    looked = _keel_central_parks(cls, want);
  }
  /* The class would take a new slab: a hole a larger class can spare first (borrow.c,
   * borrowing) - one in this thread's own bin of that class if there is one. A program
   * that allocates and frees a block of a class that only ever borrowed gets back, each
   * time, the block it just freed, from its bin: without this each of those requests
   * searched the lender's slabs under its lock (several times slower a pair). */
  if (borrow_for != 0 && !_keel_central_slabs_have_free(cls) && (looked || !_keel_transfer_any(cls))) {
    unsigned lender = t != NULL ? _keel_central_lender_in(t->head, cls, borrow_for) : 0;
    if (lender != 0) return bin_pop(t, lender);
    void* p = _keel_central_borrow(cls, borrow_for);
    if (p == NULL) p = _keel_central_carve(cls);
    if (p != NULL) return p;
  }
  if (!cached) return central_alloc_one(cls, looked);
  if (keel_bin_empty(t, cls)) {
    uint32_t got;
    void* list = take_or_gather(cls, want, &got); /* the transfer cache was tried above */
    if (list == NULL) {
      _keel_prim_set_errno(_keel_prim_errno_enomem());
      return NULL;
    }
    return bin_refill(t, cls, list, got);
  }
  return bin_pop(t, cls);
}

void _keel_tcache_free_slow(keel_tcache_t* t, void* p, unsigned cls) {
  if (t == &_keel_tc_empty) t = tcache_for_free();
  if (t != NULL) mark_active(t);
  if (t == NULL || t->bin[cls].max == 0) { /* cacheless, or an uncached class */
    _keel_central_give(cls, keel_freed_one(p), 1);
    return;
  }
  if (t->bin[cls].avail == 0) {
    const keel_class_t* k = &_keel_classes[cls];
    /* Overflowing frees grow a bin only through the slow start (up to a batch): past
     * that, only allocation misses grow it. A thread that frees what others allocated
     * (a consumer, a connection thread releasing shared objects) then holds a batch
     * per class instead of the full bin limit, which it would never reuse. */
    if (t->bin[cls].max < k->batch) bin_grow(t, cls);
    if (t->bin[cls].avail == 0) {
      /* Full: hand a batch back from the front of the bin (so it can park whole in
       * the transfer cache); walking n blocks, not the whole bin. */
      uint32_t batch = bin_batch(k, cls);
      uint32_t count = t->bin[cls].max, n = count < batch ? count : batch;
      bin_hand_front(t, cls, n);
      bin_shrink(t, cls, n);
    }
  }
  keel_bin_push(t, cls, p);
  t->bin[cls].avail--;
}

/* ---- caches of waiting threads ----------------------------------------------------
 * A thread that worked and then waits (a pooled connection between clients, an idle
 * worker) would keep its cache's free blocks for as long as it waits, since only its own
 * thread touches a cache: 1,024 such threads held 20-60 KiB each. The purger takes them
 * back. It points the thread at the empty cache, then has every processor that runs one
 * of the process's threads execute a memory barrier (membarrier(2), once for all the
 * caches it takes), then reads the thread's busy flag: clear, the thread is not using
 * the cache, and its next malloc or free finds the empty cache and takes the slow path:
 * the purger empties the cache into the slabs and gives its struct back as well
 * (tcache_slots.c), and that slow path gives the thread a new one (tcache_rebind). Set (the
 * thread is in a malloc or free, perhaps preempted or in a signal handler there), the
 * pointer is put back and the cache waits for a later tick. The fast paths pay two
 * plain stores for this, no fence and no atomic read-modify-write: the barrier is the
 * purger's. Where membarrier is unavailable nothing is taken back. The registry lock
 * is held throughout: a thread that ends or rebinds waits for it. TSan cannot see the
 * barrier, so its builds take nothing back. */
uint64_t _keel_caches_taken_back; /* written under the registry lock */

typedef struct take_back_s {
  stop_t how;
  uint64_t now, idle_ticks;
} take_back_t;

static bool take_back_pick(keel_tcache_t* t, stop_t* how) {
  take_back_t* b = (take_back_t*)how;
  return b->idle_ticks == 0 || b->now - __atomic_load_n(&t->active_tick, __ATOMIC_RELAXED) >= b->idle_ticks;
}

static void take_back_act(keel_tcache_t* t, bool idle, stop_t* how) {
  (void)how;
  keel_thread_t* owner = t->owner;
  if (!idle) {
    __atomic_store_n(&owner->tc, t, __ATOMIC_RELAXED);
    return;
  }
  /* Emptied, and its struct given back too: the thread's next slow path gives it a
   * new cache (tcache_rebind). */
  cache_flush(t, true);
  registry_unlink(t);
  __atomic_store_n(&owner->own, NULL, __ATOMIC_RELAXED);
  __atomic_store_n(&_keel_live_caches, _keel_live_caches - 1, __ATOMIC_RELAXED);
  __atomic_store_n(&_keel_caches_in_use, _keel_caches_in_use - 1, __ATOMIC_RELAXED);
  if (!_keel_tcache_slot_free(t)) { /* the static first cache waits on the spare list */
    t->kept = false;
    t->next = spare;
    __atomic_store_n(&spare, t, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&_keel_caches_taken_back, _keel_caches_taken_back + 1, __ATOMIC_RELAXED);
}

bool _keel_tcache_take_back_idle(uint64_t idle_ticks) {
  /* (never the caller's own cache: keel_purge flushed it) */
  take_back_t b = {{take_back_pick, take_back_act}, __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED), idle_ticks};
  keel_lock(&registry_lock);
  bool fenced = with_caches_stopped(&b.how);
  keel_unlock(&registry_lock);
  return fenced;
}

bool _keel_tcache_contains(keel_tcache_t* t, unsigned cls, void* p) {
  uint32_t count = t->bin[cls].max - t->bin[cls].avail;
  void* q = keel_bin_first(t, cls);
  for (uint32_t i = 0; i < count && q != NULL; i++, q = keel_link_next(q, cls))
    if (q == p) return true;
  return false;
}

/* The registry is the caches in use, exactly. A cache on its way between the registry
 * and the spares (a thread ending, one adopting a spare, the purger emptying spares) is
 * on neither list for a while, still counted live. */
KEEL_COLD bool _keel_tcache_counts_agree(void) {
  keel_lock(&registry_lock);
  uint64_t in_use = 0, kept = 0;
  for (const keel_tcache_t* t = registry; t != NULL; t = t->next) in_use++;
  for (const keel_tcache_t* t = spare; t != NULL; t = t->next) kept += t->kept;
  bool agree = in_use == _keel_caches_in_use && in_use + kept <= _keel_live_caches;
  keel_unlock(&registry_lock);
  return agree;
}

void _keel_tcache_lock_all(void) { keel_lock(&registry_lock); }
void _keel_tcache_unlock_all(void) { keel_unlock(&registry_lock); }

/* In the child of fork only the forking thread exists. Other threads' caches may have
 * been mid-update when the fork happened, so their blocks are abandoned (a bounded
 * leak in the child) and the cache structures are recycled. */
void _keel_tcache_after_fork_child(void) {
  keel_lock_reset(&registry_lock);
  /* Its own cache: none where it is young or the purger gave its cache back. */
  keel_tcache_t* mine = _keel_thread.own != NULL ? _keel_thread.own : &_keel_tc_empty;
  keel_tcache_t* next;
  for (keel_tcache_t* t = registry; t != NULL; t = next) {
    next = t->next;
    if (t == mine) continue;
    t->next = spare;
    __atomic_store_n(&spare, t, __ATOMIC_RELAXED);
  }
  /* Still counted: this thread's cache and the spares that kept their blocks (whole, the
   * registry lock was held across the fork); a cache the purger was flushing is lost.
   * The others' room is forgotten: their bins are reset when they are reused. */
  uint64_t counted = mine != &_keel_tc_empty ? 1 : 0;
  size_t room = mine != &_keel_tc_empty ? above_floor(mine->max_bytes) : 0;
  for (keel_tcache_t* t = spare; t != NULL; t = t->next) {
    counted += t->kept;
    if (t->kept) room += above_floor(t->max_bytes);
    else t->max_bytes = 0;
  }
  __atomic_store_n(&_keel_live_caches, counted, __ATOMIC_RELAXED);
  __atomic_store_n(&_keel_caches_in_use, mine != &_keel_tc_empty ? 1 : 0, __ATOMIC_RELAXED);
  __atomic_store_n(&room_above_floors, room, __ATOMIC_RELAXED);
  if (mine != &_keel_tc_empty) {
    mine->next = mine->prev = NULL;
    registry = mine;
  } else {
    registry = NULL;
  }
  live_threads = thread_state == THREAD_YOUNG || thread_state == THREAD_CACHED ? 1 : 0;
}

/* Registry lock held: blocks in the live caches and in the spares that kept theirs. */
KEEL_COLD static __attribute__((no_sanitize("thread"))) void class_counts(uint64_t* counts) {
  for (int spares = 0; spares < 2; spares++)
    for (keel_tcache_t* t = spares ? spare : registry; t != NULL; t = t->next) {
      if (spares && !t->kept) continue;
      for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++)
        counts[cls] += (uint64_t)(t->bin[cls].max - t->bin[cls].avail);
    }
}

/* Racy reads of other threads' bins are fine for statistics. */
KEEL_COLD __attribute__((no_sanitize("thread"))) void _keel_tcache_stats(keel_stats_t* out,
                                                                 uint64_t* cached_bytes) {
  uint64_t counts[KEEL_NUM_CLASSES] = {0}, bytes = 0;
  keel_lock(&registry_lock);
  class_counts(counts);
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) bytes += counts[cls] * _keel_classes[cls].size;
  out->threads = live_threads;
  out->threads_total = total_threads;
  keel_unlock(&registry_lock); /* (the caches themselves are in _keel_meta_bytes()) */
  *cached_bytes = bytes;
}

/* Blocks held in all thread caches, per class (racy reads: statistics only). */
KEEL_COLD __attribute__((no_sanitize("thread"))) void _keel_tcache_class_counts(uint64_t* counts) {
  keel_lock(&registry_lock);
  class_counts(counts);
  keel_unlock(&registry_lock);
}
