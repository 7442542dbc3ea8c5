/* init.c -- process life cycle: start-up, fork, exit, and the background purger.
 *
 * Keel may be called before its constructor runs (by the dynamic loader or by other
 * libraries' constructors), so everything needed to allocate is set up lazily by the
 * first slow-path call (_keel_init). The constructor adds what may itself allocate or
 * must not run inside the loader: fork handlers. */
#include "core/internal.h"
#include "core/thp.h"

bool _keel_ready;
uintptr_t _keel_free_key = 1;
/* Until start-up sets the secret, every bin is empty (stored 0), which decodes to this:
 * not a block start, so the first malloc goes to the slow path, which starts Keel. */
uintptr_t _keel_link_key = 6;
size_t _keel_page_size = 4096;
static _Atomic int init_state; /* 0 not started, 1 running, 2 done */

void _keel_init(void) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&init_state, &expected, 1)) {
    _keel_page_size = _keel_prim_page_size();
    if (_keel_page_size > KEEL_UNIT_SIZE)
      _keel_fatal_internal(__FILE__, __LINE__, "OS page size larger than 64 KiB is not supported");
    _keel_options_init();
    _keel_classes_init();
    _keel_free_key = (uintptr_t)_keel_prim_random() | 1;
    /* At least two of the low four bits set: an empty bin, a plain pointer written
     * over a link, and a list's end (stored 0) with one of those bits flipped all decode
     * to an address that is no block start (freelist.h). */
    uintptr_t link_key = (uintptr_t)_keel_prim_random();
    _keel_link_key = __builtin_popcountll(link_key & 15) >= 2 ? link_key : link_key | 6;
    _keel_profile_init();
    atomic_store(&init_state, 2);
    __atomic_store_n(&_keel_ready, true, __ATOMIC_RELEASE);
    return;
  }
  while (atomic_load(&init_state) != 2) _keel_prim_yield();
}

/* ---- fork: every lock is taken before fork and released (parent) or reset (child),
 * so the child never inherits a lock held by a thread that does not exist there. The
 * order is the global lock order: registry, meshing pass, central (by class), page
 * heap, huge, page map leaves, metadata, checked mode's quarantine, mesh view table.
 * The heap profile's lock comes first: it is taken with no other held and none is
 * taken under it (a child that inherited it held hung at its first sample). */
void _keel_pagemap_lock_all(void);
void _keel_pagemap_unlock_all(void);
void _keel_pagemap_reset_locks(void);

/* Here, not beside keel_purge in stats.c: a forking process runs it, and stats.c's code
 * lies outside the window of text every process keeps resident (src/hot_text.ld). */
size_t _keel_purge_now(uint32_t max_trims) {
  _keel_tcache_release_spares(0);
  return _keel_central_purge_all(max_trims) + _keel_pageheap_purge(true) + _keel_huge_purge(true);
}

/* Before a fork, the free memory the purge timer would return later is returned now,
 * starting with the blocks in the forking thread's cache: a child holds every page it
 * inherits, and one forked while the parent is quiet (a PostgreSQL helper or backend)
 * may make too few calls to ever purge them itself: 60 KiB less in a postmaster after
 * start-up, 70-100 KiB less in each of its children. Bounded (KEEL_PURGE_TRIMS_BOUNDED),
 * so that a big heap does not hold up its fork. posix_spawn and vfork run no fork
 * handlers and pay nothing. */
static void fork_prepare(void) {
  if (!_keel_ready) return;
  _keel_tcache_thread_flush();
  _keel_purge_now(KEEL_PURGE_TRIMS_BOUNDED);
  keel_lock(_keel_lock_profile);
  _keel_tcache_lock_all();
  _keel_mesh_lock_all();
  _keel_central_lock_all();
  _keel_pageheap_lock_all();
  _keel_huge_lock_all();
  _keel_pagemap_lock_all();
  _keel_meta_lock_all();
  _keel_checked_lock_all();
  _keel_mesh_table_lock();
}

static void fork_parent(void) {
  if (!_keel_ready) return;
  _keel_mesh_table_unlock();
  _keel_checked_unlock_all();
  _keel_meta_unlock_all();
  _keel_pagemap_unlock_all();
  _keel_huge_unlock_all();
  _keel_pageheap_unlock_all();
  _keel_central_unlock_all();
  _keel_mesh_unlock_all();
  _keel_tcache_unlock_all();
  keel_unlock(_keel_lock_profile);
}

static _Atomic int background_state; /* 0 not started, 1 starting/running */
static void defer_purger(void);

static void fork_child(void) {
  if (!_keel_ready) return;
  keel_lock_reset(_keel_lock_profile);
  _keel_checked_reset_locks();
  _keel_meta_reset_locks();
  _keel_pagemap_reset_locks();
  _keel_huge_reset_locks();
  _keel_pageheap_reset_locks();
  _keel_thp_promoting = NULL; /* a collapse in progress ran on the purger, gone here */
  _keel_central_reset_locks();
  _keel_mesh_after_fork_child();
  _keel_tcache_after_fork_child();
  atomic_store(&background_state, 0); /* the purger thread did not survive the fork */
  _keel_prim_thread_forget_after_fork();    /* nor need its stack */
  defer_purger();
  _keel_publish_after_fork_child();
}

/* ---- background purging: memory freed for longer than the purge delay goes back to
 * the OS even if the program never calls malloc again (an idle server after a burst).
 * The purger is started from the constructor. Without it (KEEL_BACKGROUND_PURGE=0, or
 * if it cannot start) purging still happens, amortised, when spans are freed.
 *
 * A forked child gets its own purger only once it has taken KEEL_CHILD_PURGER (4 MiB)
 * of spans and huge blocks since the fork. A thread costs little memory of its own
 * (a 64 KiB stack, mostly untouched), but creating one in a child maps in pages of
 * every library with thread-local data and of libc's thread code that the child had
 * not touched since the fork: 1.5 MiB more RSS in each PostgreSQL helper process
 * (checkpointer, walwriter, ...), which never hold enough free memory to need a purger.
 * The check runs in the allocation slow path, with no Keel lock held, and never in
 * free: glibc frees thread stacks' TLS under its stack-cache lock, which pthread_create
 * takes too. A caller of malloc may hold the loader's TLS lock, but that one is
 * recursive. */
uint64_t _keel_pageheap_dirty_bytes(void);
uint64_t _keel_pageheap_taken_bytes(void);
uint64_t _keel_huge_taken_bytes(void);

bool _keel_purger_deferred;
static uint64_t taken_at_fork; /* bytes handed out as spans and huge blocks before the fork */

/* Monotonic, so that a child freeing what it inherited and allocating it again counts
 * as growing: it then holds memory a purger would return. */
static uint64_t taken_bytes(void) { return _keel_pageheap_taken_bytes() + _keel_huge_taken_bytes(); }

static void defer_purger(void) {
  if (keel_opt(child_purger) == 0) {
    _keel_background_start();
    return;
  }
  taken_at_fork = taken_bytes();
  __atomic_store_n(&_keel_purger_deferred, true, __ATOMIC_RELAXED);
}

void _keel_purger_deferred_check(void) {
  if (taken_bytes() - taken_at_fork < keel_opt(child_purger)) return;
  _keel_background_start();
}

/* A quarter of the purge delay, but at least 4 ticks a second so that a live statistics
 * request is answered promptly. */
static uint64_t tick_ms(void) {
  uint64_t tick = keel_opt(purge_delay_ms) / 4;
  return tick < 10 ? 10 : tick > 250 ? 250 : tick;
}

/* Purger ticks that span at least ms. */
static uint64_t ticks_for(uint64_t ms) { return ms / tick_ms() + 1; }

uint64_t _keel_delay_ticks(void) { return ticks_for(keel_opt(purge_delay_ms)); }

/* Rung by a thread that ends while the process shrinks (tcache.c): the purger returns
 * the free memory at once, one pass for a burst of such ends, where each ending thread
 * doing it made a thousand threads ending together take 0.15-0.2 ms each, one after
 * another. */
static uint32_t purger_bell;

void _keel_purge_soon(void) {
  if (__atomic_exchange_n(&purger_bell, 1, __ATOMIC_RELEASE) == 0) _keel_prim_futex_wake(&purger_bell, 1);
}

/* A tick's sleep, answering the bell meanwhile. */
static void wait_tick(void) {
  uint64_t start = _keel_prim_clock_ms(), tick = tick_ms();
  for (uint64_t now = start; now - start < tick; now = _keel_prim_clock_ms()) {
    _keel_prim_futex_wait_ms(&purger_bell, 0, tick - (now - start));
    if (__atomic_exchange_n(&purger_bell, 0, __ATOMIC_ACQUIRE) != 0 && keel_opt(background_purge))
      _keel_purge_now(KEEL_PURGE_TRIMS_BOUNDED);
  }
}

static void* purger_main(void* arg) {
  (void)arg;
  for (;;) {
    wait_tick();
    /* If every other thread has ended (main called pthread_exit and the rest finished),
     * the process must end as POSIX says, with exit(0): our thread must not keep it
     * alive. */
    if (_keel_prim_thread_count() == 1) _keel_prim_exit(0);
    __atomic_fetch_add(&_keel_ticks, 1, __ATOMIC_RELAXED);
    /* Transfer batches idle for the purge delay go back to their slabs, so that empty
     * slabs can be released and purged. */
    if (keel_opt(background_purge)) {
      _keel_tcache_release_spares(_keel_delay_ticks());
      if (keel_opt(tcache_idle_ms) != 0) _keel_tcache_take_back_idle(ticks_for(keel_opt(tcache_idle_ms)));
      _keel_central_decay(_keel_delay_ticks());
      if (_keel_pageheap_dirty_bytes() != 0) _keel_pageheap_maybe_purge();
      if (_keel_huge_cache_pending()) _keel_huge_purge(false);
      if (keel_opt(thp) == KEEL_THP_DENSE) _keel_pageheap_promote();
      _keel_mesh_tick();
    }
    _keel_publish_tick();
    _keel_profile_tick();
  }
  return NULL;
}

void _keel_background_start(void) {
  /* Cleared first: thread creation allocates (its TLS vector) and would come back. */
  __atomic_store_n(&_keel_purger_deferred, false, __ATOMIC_RELAXED);
  if (!keel_opt(background_purge)) return;
  int expected = 0;
  if (!atomic_compare_exchange_strong(&background_state, &expected, 1)) return;
  if (!_keel_prim_thread_start(purger_main, NULL)) {
    atomic_store(&background_state, 2);
    _keel_tcache_release_spares(0); /* caches kept in the meantime: no purger to return them */
  }
}

/* Its thread may still tick after background_purge was switched off, but it returns
 * nothing then: an exiting thread must not leave its cache for it. */
bool _keel_purger_running(void) {
  return atomic_load_explicit(&background_state, memory_order_relaxed) == 1 && keel_opt(background_purge);
}

__attribute__((constructor(101))) static void keel_process_init(void) {
  _keel_init();
  _keel_prim_atfork(fork_prepare, fork_parent, fork_child);
  _keel_background_start();
  _keel_publish_init();
}

__attribute__((destructor(101))) static void keel_process_exit(void) {
  if (keel_opt(stats_at_exit)) _keel_stats_at_exit();
  _keel_profile_at_exit();
  _keel_publish_exit();
}
