/* mallctl.c -- jemalloc's mallctl(), mallctlnametomib() and mallctlbymib(): a static tree
 * of named and indexed nodes whose leaves report Keel's settings and statistics and
 * change the few settings that map onto Keel's. Statistics come from one snapshot, also
 * read by malloc_stats_print (stats_print.c). */
#include <errno.h>

#include "api/jemalloc_compat.h"

/* Names Keel has no answer for return ENOENT, as jemalloc does for names it does not
 * know; wrong value sizes give EINVAL (copying what fits), writes to read-only names
 * EPERM. Statistics are one snapshot, taken when "epoch" is written (and at the first
 * query), so figures read together agree with each other, as in jemalloc. */

#define JE_ARENAS_ALL 4096u
#define JE_ARENAS_DESTROYED 4097u
#define JE_NARENAS 1u
#define JE_TCACHE_IDS 4093u                  /* explicit cache ids that fit in the flag bits */

uint64_t _keel_large_live_bytes(void) KEEL_INTERNAL;    /* large.c */
uint64_t _keel_pageheap_dirty_bytes(void) KEEL_INTERNAL; /* pageheap.c */

/* ---- statistics snapshot --------------------------------------------------------------- */
/* The snapshot lock is a bounded spin: a process forked while another thread held it
 * falls back to fresh figures instead of hanging. */

static je_snap_t snap;
static uint32_t snap_busy; /* spin lock: held only while copying into or out of `snap` */

static void snap_collect(je_snap_t* o) {
  keel_ensure_init();
  _keel_stats_collect(&o->s);
  uint64_t meta = _keel_meta_bytes();
  o->resident = o->s.committed + meta;
  o->mapped = o->s.mapped + meta;
  o->dirty = _keel_pageheap_dirty_bytes();
  uint64_t quarantined_small, quarantined_big; /* checked mode: freed, not allocated */
  _keel_checked_quarantine_bytes(&quarantined_small, &quarantined_big);
  o->large = _keel_large_live_bytes() + o->s.huge_allocated - quarantined_big;
  o->small = o->s.allocated > o->large ? o->s.allocated - o->large : 0;
  uint64_t cached[KEEL_NUM_CLASSES] = {0};
  _keel_tcache_class_counts(cached);
  o->tcache_bytes = 0;
  o->out[0] = o->batched[0] = o->slabs[0] = 0;
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
    o->tcache_bytes += cached[cls] * _keel_classes[cls].size;
    o->out[cls] = o->batched[cls] = o->slabs[cls] = 0;
    if (!_keel_central_active(cls)) continue; /* all zero, and its page maybe untouched */
    keel_central_t* cl = keel_central_of(cls);
    _keel_central_lock_class(cl);
    o->out[cls] = _keel_central_out(cl);
    o->batched[cls] = _keel_central_parked_blocks(cls);
    o->slabs[cls] = cl->slabs;
    _keel_central_unlock_class(cl);
  }
}

/* Bounded: false after about a millisecond of trying (a lock left held across fork). */
static bool snap_lock(void) {
  for (unsigned i = 0; i < 2000; i++) {
    uint32_t free_ = 0;
    if (__atomic_compare_exchange_n(&snap_busy, &free_, 1, false, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED))
      return true;
    if (i < 100) keel_cpu_relax();
    else _keel_prim_yield();
  }
  return false;
}
static void snap_unlock(void) { __atomic_store_n(&snap_busy, 0, __ATOMIC_RELEASE); }

/* Takes a new snapshot (unless `initial` and one exists already); returns its epoch. */
uint64_t _keel_je_snap_refresh(bool initial) {
  je_snap_t f;
  snap_collect(&f);
  if (!snap_lock()) return __atomic_load_n(&snap.epoch, __ATOMIC_RELAXED) + 1;
  if (!(initial && snap.epoch != 0)) {
    /* jemalloc takes its first snapshot (epoch 1) at start-up: the first write reads 2. */
    f.epoch = initial ? 1 : (snap.epoch ? snap.epoch : 1) + 1;
    snap = f;
  }
  uint64_t e = snap.epoch;
  snap_unlock();
  return e;
}

/* Copies the current snapshot (taking the first one if needed), or fresh figures. */
void _keel_je_snap_copy(je_snap_t* out) {
  for (int tries = 0; tries < 2; tries++) {
    if (!snap_lock()) break;
    if (snap.epoch != 0) {
      *out = snap;
      snap_unlock();
      return;
    }
    snap_unlock();
    _keel_je_snap_refresh(true);
  }
  snap_collect(out);
}

static uint64_t snap_u64(size_t off) {
  uint64_t v;
  for (int tries = 0; tries < 2; tries++) {
    if (!snap_lock()) break;
    if (snap.epoch != 0) {
      memcpy(&v, (const char*)&snap + off, sizeof v);
      snap_unlock();
      return v;
    }
    snap_unlock();
    _keel_je_snap_refresh(true);
  }
  je_snap_t f;
  snap_collect(&f);
  memcpy(&v, (const char*)&f + off, sizeof v);
  return v;
}

#define SNAP(field) snap_u64(offsetof(je_snap_t, field))
#define SNAP_CLS(arr, cls) snap_u64(offsetof(je_snap_t, arr) + (size_t)(cls) * sizeof(uint64_t))

/* ---- settings mallctl can change -------------------------------------------------------- */

static int bg_thread = -1; /* "background_thread" as last written; -1: Keel's setting */
static _Thread_local bool tcache_off; /* "thread.tcache.enabled" written false */
static int64_t opt_dirty_ms = INT64_MIN;      /* purge delay at start-up, once changed */
static int64_t arenas_dirty_ms = INT64_MIN;   /* default for new arenas (Keel makes none) */
static int64_t arenas_muzzy_ms = 0;
static uint64_t tcache_ids[(JE_TCACHE_IDS + 63) / 64]; /* explicit cache ids in use */

int64_t _keel_je_purge_delay_ms(void) {
  uint64_t d = keel_opt(purge_delay_ms);
  return d > (uint64_t)INT64_MAX ? -1 : (int64_t)d; /* "never" reads as jemalloc's -1 */
}

/* ---- mallctl: values ------------------------------------------------------------------ */

static size_t val_size(int t) {
  switch (t) {
    case V_BOOL: return sizeof(bool);
    case V_UNSIGNED: return sizeof(unsigned);
    case V_STR: return sizeof(const char*);
    default: return sizeof(uint64_t);
  }
}

static void val_encode(int t, const val_t* v, unsigned char* out) {
  if (t == V_BOOL) {
    bool b = v->n != 0;
    memcpy(out, &b, sizeof b);
  } else if (t == V_UNSIGNED) {
    unsigned u = (unsigned)v->n;
    memcpy(out, &u, sizeof u);
  } else if (t == V_STR) {
    memcpy(out, &v->s, sizeof v->s);
  } else {
    memcpy(out, &v->n, sizeof v->n);
  }
}

static void val_decode(int t, const void* in, val_t* v) {
  v->n = 0;
  v->s = NULL;
  if (t == V_BOOL) {
    bool b;
    memcpy(&b, in, sizeof b);
    v->n = b;
  } else if (t == V_UNSIGNED) {
    unsigned u;
    memcpy(&u, in, sizeof u);
    v->n = u;
  } else if (t == V_STR) {
    memcpy(&v->s, in, sizeof v->s);
  } else {
    memcpy(&v->n, in, sizeof v->n);
  }
}

/* jemalloc's read rule: a wrong *oldlenp copies what fits, reports it, and fails. */
static int ctl_read(int t, const val_t* v, void* oldp, size_t* oldlenp) {
  if (oldp == NULL || oldlenp == NULL) return 0;
  unsigned char buf[8];
  size_t n = val_size(t);
  val_encode(t, v, buf);
  if (*oldlenp != n) {
    size_t c = *oldlenp < n ? *oldlenp : n;
    memcpy(oldp, buf, c);
    *oldlenp = c;
    return EINVAL;
  }
  memcpy(oldp, buf, n);
  return 0;
}

/* ---- mallctl: the tree ------------------------------------------------------------------ */

typedef int (*ctl_get_t)(const size_t* mib, val_t* out);
typedef int (*ctl_set_t)(const size_t* mib, const val_t* in);
typedef int (*ctl_act_t)(const size_t* mib);
/* Leaves with their own protocol get mallctl's arguments as they are. */
#define RAW_ARGS const size_t* mib, void* oldp, size_t* oldlenp, void* newp, size_t newlen
typedef int (*ctl_raw_t)(RAW_ARGS);
typedef bool (*ctl_index_t)(uint64_t i);

/* The tree holds no pointer: every pointer in a constant table is relocated by the loader
 * when libkeel is mapped, which writes its page in every process (the tree's 8 KiB of
 * pointers were two pages of RssAnon in each, and again in each PostgreSQL backend).
 * Names are inline, children and handlers are small indices into the tables at the end
 * of the tree (about 1 KiB of pointers, on the page the loader writes anyway). The lists
 * name every handler and directory once. */
#define CTL_GETTERS(X) \
  X(g_false) X(g_debug) X(g_empty) X(g_true) \
  X(g_disabled) X(g_one) X(g_oversize) X(g_opt_bg) \
  X(g_opt_dirty) X(g_zero) X(g_junk) X(g_opt_tcache) \
  X(g_tcache_max) X(g_default) X(g_stats_print) X(g_minus_one) \
  X(g_free) X(g_tc_enabled) X(g_initialized) X(g_dirty_ms) \
  X(g_bin_size) X(g_bin_nregs) X(g_bin_slab) X(g_lextent_size) \
  X(g_arenas_dirty) X(g_arenas_muzzy) X(g_quantum) X(g_page) \
  X(g_nbins) X(g_nhbins) X(g_nlextents) X(g_bg_threads) \
  X(g_purge_runs) X(g_small_alloc) X(g_large_alloc) X(g_curregs) \
  X(g_curslabs) X(g_nthreads) X(g_dss_na) X(g_pactive) \
  X(g_pdirty) X(g_mapped) X(g_retained) X(g_metadata) \
  X(g_tcache_bytes) X(g_resident) X(g_purged_pages) X(g_allocated) \
  X(g_active) X(g_version) X(g_bg)
#define CTL_SETTERS(X) \
  X(s_tc_enabled) X(s_thread_arena) X(s_dirty_ms) X(s_muzzy_ms) \
  X(s_arenas_dirty) X(s_arenas_muzzy) X(s_bg) X(s_max_bg)
#define CTL_ACTIONS(X) \
  X(a_flush) X(a_decay) X(a_purge) X(a_efault)
#define CTL_RAWS(X) \
  X(r_tcache_create) X(r_tcache_flush) X(r_tcache_destroy) X(r_arena_dss) \
  X(r_arenas_create) X(r_arenas_lookup) X(r_epoch)
#define CTL_INDEXES(X) \
  X(idx_arena) X(idx_bin) X(idx_lextent) X(idx_stats_arena)
#define CTL_DIRS(X) \
  X(config_kids) X(opt_kids) X(thread_tcache_kids) \
  X(thread_kids) X(tcache_kids) X(arena_i_kids) \
  X(arena_idx) X(arenas_bin_i_kids) X(arenas_bin_idx) \
  X(arenas_lextent_i_kids) X(arenas_lextent_idx) X(arenas_kids) \
  X(stats_bg_kids) X(stats_arenas_small_kids) X(stats_arenas_large_kids) \
  X(stats_arenas_bins_j_kids) X(stats_arenas_bins_idx) X(stats_arenas_i_kids) \
  X(stats_arenas_idx) X(stats_kids) X(root_kids)
#define CTL_ID(prefix, fn) prefix##fn,
#define G_ID(fn) CTL_ID(G_, fn)
#define S_ID(fn) CTL_ID(S_, fn)
#define A_ID(fn) CTL_ID(A_, fn)
#define R_ID(fn) CTL_ID(R_, fn)
#define I_ID(fn) CTL_ID(I_, fn)
#define D_ID(fn) CTL_ID(D_, fn)
enum { G_NONE, CTL_GETTERS(G_ID) G_COUNT };
enum { S_NONE, CTL_SETTERS(S_ID) S_COUNT };
enum { A_NONE, CTL_ACTIONS(A_ID) A_COUNT };
enum { R_NONE, CTL_RAWS(R_ID) R_COUNT };
enum { I_NONE, CTL_INDEXES(I_ID) I_COUNT };
enum { D_NONE, CTL_DIRS(D_ID) D_COUNT };
_Static_assert(G_COUNT <= 256 && D_COUNT <= 256, "a handler or directory id is a byte");

typedef struct ctl_node_s {
  char name[28];    /* "" in an index node, which stands for an integer index_ok accepts */
  uint8_t dir;      /* interior nodes: D_ id of the children (one index node = indexed) */
  uint8_t type;     /* V_*: leaves with get (and set) */
  uint8_t get, set; /* value leaves: G_ and S_ ids (read r-, write rw) */
  uint8_t act;      /* void leaves (--): an action */
  uint8_t raw;      /* leaves with their own protocol */
  uint8_t index_ok; /* index nodes: I_ id */
} ctl_node_t;

/* The tree's 4.6 KiB are read by mallctl only: in their own section, which
 * src/hot_text.ld puts with the unwind tables, never mapped in a run that does not call
 * mallctl (in .rodata they made the first segment, read in every process, a page longer). */
#define CTL_TREE __attribute__((section(".keel_cold_rodata")))

#define N_RO(nm, t, g) {nm, D_NONE, t, G_##g, S_NONE, A_NONE, R_NONE, I_NONE}
#define N_RW(nm, t, g, s) {nm, D_NONE, t, G_##g, S_##s, A_NONE, R_NONE, I_NONE}
#define N_ACT(nm, a) {nm, D_NONE, V_NONE, G_NONE, S_NONE, A_##a, R_NONE, I_NONE}
#define N_RAW(nm, r) {nm, D_NONE, V_NONE, G_NONE, S_NONE, A_NONE, R_##r, I_NONE}
#define N_COUNT(k) ((unsigned)(sizeof(k) / sizeof((k)[0])))
#define N_DIR(nm, k) {nm, D_##k, V_NONE, G_NONE, S_NONE, A_NONE, R_NONE, I_NONE}
#define N_IDX(k, ok) {"", D_##k, V_NONE, G_NONE, S_NONE, A_NONE, R_NONE, I_##ok}

#define GETN(fn, expr)                               \
  static int fn(const size_t* mib, val_t* v) {      \
    (void)mib;                                       \
    v->n = (uint64_t)(expr);                         \
    return 0;                                        \
  }
#define GETS(fn, expr)                               \
  static int fn(const size_t* mib, val_t* v) {      \
    (void)mib;                                       \
    v->s = (expr);                                   \
    return 0;                                        \
  }

/* Indices. arena.<i>: Keel's one arena, narenas (jemalloc's deprecated "all"),
 * MALLCTL_ARENAS_ALL and _DESTROYED. stats.arenas.<i>: the same but destroyed (none). */
static bool idx_arena(uint64_t i) {
  return i <= JE_NARENAS || i == JE_ARENAS_ALL || i == JE_ARENAS_DESTROYED;
}
static bool idx_stats_arena(uint64_t i) { return i <= JE_NARENAS || i == JE_ARENAS_ALL; }
static bool idx_bin(uint64_t i) { return i < KEEL_NUM_CLASSES - 1; }
static bool idx_lextent(uint64_t i) { return i < JE_NLEXTENTS; }

/* -- root, config, opt -- */
GETS(g_version, JE_VERSION)

static int r_epoch(RAW_ARGS) {
  (void)mib;
  val_t v = {0, NULL};
  if (newp != NULL) {
    if (newlen != sizeof(uint64_t)) return EINVAL;
    v.n = _keel_je_snap_refresh(false);
  } else {
    v.n = SNAP(epoch);
  }
  return ctl_read(V_U64, &v, oldp, oldlenp);
}

bool _keel_je_bg_enabled(void) {
  int b = __atomic_load_n(&bg_thread, __ATOMIC_RELAXED);
  return b < 0 ? keel_opt(background_purge) : b != 0;
}
GETN(g_bg, _keel_je_bg_enabled())
/* Recorded only: Keel's purger thread runs or not by KEEL_BACKGROUND_PURGE (and without
 * it, frees purge as they go), so memory is returned either way. */
static int s_bg(const size_t* mib, const val_t* v) {
  (void)mib;
  __atomic_store_n(&bg_thread, v->n ? 1 : 0, __ATOMIC_RELAXED);
  return 0;
}
GETN(g_one, 1)
GETN(g_zero, 0)
GETN(g_false, false)
GETN(g_true, true)
GETN(g_debug, KEEL_DEBUG >= 1)
GETS(g_empty, "")
GETS(g_disabled, "disabled")
static int s_max_bg(const size_t* mib, const val_t* v) {
  (void)mib;
  return v->n == 0 ? EINVAL : 0; /* Keel has one purger thread at most */
}

static const ctl_node_t config_kids[] CTL_TREE = {
    N_RO("cache_oblivious", V_BOOL, g_false), N_RO("debug", V_BOOL, g_debug),
    N_RO("fill", V_BOOL, g_false),            N_RO("lazy_lock", V_BOOL, g_false),
    N_RO("malloc_conf", V_STR, g_empty),      N_RO("opt_safety_checks", V_BOOL, g_false),
    N_RO("prof", V_BOOL, g_false),            N_RO("prof_libgcc", V_BOOL, g_false),
    N_RO("prof_libunwind", V_BOOL, g_false),  N_RO("stats", V_BOOL, g_true),
    N_RO("utrace", V_BOOL, g_false),          N_RO("xmalloc", V_BOOL, g_false),
};

GETN(g_opt_bg, keel_opt(background_purge))
static int64_t load_i64(const int64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static int g_opt_dirty(const size_t* mib, val_t* v) {
  (void)mib;
  int64_t ms = load_i64(&opt_dirty_ms);
  v->n = (uint64_t)(ms != INT64_MIN ? ms : _keel_je_purge_delay_ms());
  return 0;
}
GETN(g_oversize, KEEL_LARGE_MAX) /* larger blocks get their own mapping */
GETN(g_stats_print, keel_opt(stats_at_exit))
GETN(g_minus_one, -1)
GETS(g_junk, _keel_options.check ? "true" : "false") /* the checked mode fills and poisons */
GETN(g_opt_tcache, !_keel_options.check)
GETN(g_tcache_max, _keel_options.check ? 0 : KEEL_CLASS_MAX) /* every class is cached */
GETS(g_default, "default")
GETS(g_free, "free") /* realloc(p, 0) frees, as glibc's */

static const ctl_node_t opt_kids[] CTL_TREE = {
    N_RO("abort", V_BOOL, g_false),
    N_RO("abort_conf", V_BOOL, g_false),
    N_RO("cache_oblivious", V_BOOL, g_false),
    N_RO("confirm_conf", V_BOOL, g_false),
    N_RO("retain", V_BOOL, g_true), /* purged units stay reserved inside their chunk */
    N_RO("dss", V_STR, g_disabled),
    N_RO("narenas", V_UNSIGNED, g_one),
    N_RO("percpu_arena", V_STR, g_disabled),
    N_RO("oversize_threshold", V_SIZE, g_oversize),
    N_RO("hpa", V_BOOL, g_false),
    N_RO("metadata_thp", V_STR, g_disabled),
    N_RO("trust_madvise", V_BOOL, g_false),
    N_RO("background_thread", V_BOOL, g_opt_bg),
    N_RO("max_background_threads", V_SIZE, g_one),
    N_RO("dirty_decay_ms", V_SSIZE, g_opt_dirty),
    N_RO("muzzy_decay_ms", V_SSIZE, g_zero),
    N_RO("junk", V_STR, g_junk),
    N_RO("zero", V_BOOL, g_false),
    N_RO("experimental_infallible_new", V_BOOL, g_false),
    N_RO("tcache", V_BOOL, g_opt_tcache),
    N_RO("tcache_max", V_SIZE, g_tcache_max),
    N_RO("thp", V_STR, g_default),
    N_RO("stats_print", V_BOOL, g_stats_print),
    N_RO("stats_print_opts", V_STR, g_empty),
    N_RO("stats_interval", V_I64, g_minus_one),
    N_RO("stats_interval_opts", V_STR, g_empty),
    N_RO("zero_realloc", V_STR, g_free),
};

/* -- thread -- */
GETN(g_tc_enabled, !_keel_options.check && !tcache_off)
/* Disabling flushes the cache (as jemalloc does) and is recorded; Keel's fast paths keep
 * using a thread cache, which refills on demand. */
static int s_tc_enabled(const size_t* mib, const val_t* v) {
  (void)mib;
  if (!v->n) keel_thread_flush();
  tcache_off = !v->n;
  return 0;
}
static int a_flush(const size_t* mib) {
  (void)mib;
  keel_thread_flush();
  return 0;
}
static int s_thread_arena(const size_t* mib, const val_t* v) {
  (void)mib;
  return v->n < JE_NARENAS ? 0 : EFAULT;
}

static const ctl_node_t thread_tcache_kids[] CTL_TREE = {
    N_RW("enabled", V_BOOL, g_tc_enabled, s_tc_enabled),
    N_ACT("flush", a_flush),
};
static const ctl_node_t thread_kids[] CTL_TREE = {
    N_RW("arena", V_UNSIGNED, g_zero, s_thread_arena),
    N_DIR("tcache", thread_tcache_kids),
    N_ACT("idle", a_flush),
};

/* -- tcache: explicit caches are ids; blocks still go through the thread's own cache -- */
static int r_tcache_create(RAW_ARGS) {
  (void)mib;
  if (newp != NULL || newlen != 0) return EPERM;
  if (oldp == NULL || oldlenp == NULL || *oldlenp != sizeof(unsigned)) {
    if (oldlenp != NULL) *oldlenp = 0;
    return EINVAL;
  }
  for (unsigned id = 0; id < JE_TCACHE_IDS; id++) {
    uint64_t bit = (uint64_t)1 << (id % 64);
    uint64_t was = __atomic_fetch_or(&tcache_ids[id / 64], bit, __ATOMIC_RELAXED);
    if (!(was & bit)) {
      memcpy(oldp, &id, sizeof id);
      return 0;
    }
  }
  return EFAULT;
}
static int tcache_write(void* oldp, size_t* oldlenp, void* newp, size_t newlen, bool destroy) {
  if (oldp != NULL || oldlenp != NULL) return EPERM;
  if (newp == NULL) return EFAULT;
  if (newlen != sizeof(unsigned)) return EINVAL;
  unsigned id;
  memcpy(&id, newp, sizeof id);
  if (id >= JE_TCACHE_IDS) return EFAULT;
  keel_thread_flush();
  if (destroy)
    __atomic_fetch_and(&tcache_ids[id / 64], ~((uint64_t)1 << (id % 64)), __ATOMIC_RELAXED);
  return 0;
}
static int r_tcache_flush(RAW_ARGS) {
  (void)mib;
  return tcache_write(oldp, oldlenp, newp, newlen, false);
}
static int r_tcache_destroy(RAW_ARGS) {
  (void)mib;
  return tcache_write(oldp, oldlenp, newp, newlen, true);
}
static const ctl_node_t tcache_kids[] CTL_TREE = {
    N_RAW("create", r_tcache_create),
    N_RAW("flush", r_tcache_flush),
    N_RAW("destroy", r_tcache_destroy),
};

/* -- arena.<i> (mib[1] = i) -- */
static int a_purge(const size_t* mib) {
  if (mib[1] != JE_ARENAS_DESTROYED) keel_purge(); /* flushes this thread's cache too */
  return 0;
}
/* Decay: return what the purge delay allows now, as the background purger would. */
static int a_decay(const size_t* mib) {
  if (mib[1] != JE_ARENAS_DESTROYED) {
    _keel_pageheap_maybe_purge();
    _keel_huge_purge(false);
  }
  return 0;
}
static int a_efault(const size_t* mib) {
  (void)mib;
  return EFAULT; /* reset/destroy: only for arenas made by arenas.create, which Keel has not */
}
static int g_initialized(const size_t* mib, val_t* v) {
  v->n = mib[1] != JE_ARENAS_DESTROYED;
  return 0;
}
static int r_arena_dss(RAW_ARGS) {
  (void)mib;
  if (newp != NULL) {
    if (newlen != sizeof(const char*)) return EINVAL;
    const char* s;
    memcpy(&s, newp, sizeof s);
    if (s == NULL) return EINVAL;
    if (strcmp(s, "primary") == 0 || strcmp(s, "secondary") == 0) return EFAULT; /* no sbrk */
    if (strcmp(s, "disabled") != 0) return EINVAL;
  }
  val_t v = {0, "disabled"};
  return ctl_read(V_STR, &v, oldp, oldlenp);
}
GETN(g_dirty_ms, _keel_je_purge_delay_ms())
/* Setting the decay time purges what is dirty now (jemalloc: "considered fully decayed")
 * and makes it Keel's purge delay from then on; -1 never purges. */
static int s_dirty_ms(const size_t* mib, const val_t* v) {
  int64_t ms = (int64_t)v->n;
  if (ms < -1) return EFAULT;
  if (__atomic_load_n(&opt_dirty_ms, __ATOMIC_RELAXED) == INT64_MIN)
    __atomic_store_n(&opt_dirty_ms, _keel_je_purge_delay_ms(), __ATOMIC_RELAXED);
  __atomic_store_n(&_keel_options.purge_delay_ms, ms < 0 ? UINT64_MAX : (uint64_t)ms,
                   __ATOMIC_RELAXED);
  if (mib[1] != JE_ARENAS_DESTROYED && ms >= 0) keel_purge();
  return 0;
}
static int s_muzzy_ms(const size_t* mib, const val_t* v) {
  (void)mib;
  return (int64_t)v->n < -1 ? EFAULT : 0; /* Keel has no muzzy state: purged is purged */
}
static const ctl_node_t arena_i_kids[] CTL_TREE = {
    N_RO("initialized", V_BOOL, g_initialized),
    N_ACT("decay", a_decay),
    N_ACT("purge", a_purge),
    N_ACT("reset", a_efault),
    N_ACT("destroy", a_efault),
    N_RAW("dss", r_arena_dss),
    N_RW("dirty_decay_ms", V_SSIZE, g_dirty_ms, s_dirty_ms),
    N_RW("muzzy_decay_ms", V_SSIZE, g_zero, s_muzzy_ms),
};
static const ctl_node_t arena_idx[] CTL_TREE = {N_IDX(arena_i_kids, idx_arena)};

/* -- arenas -- */
static int g_arenas_dirty(const size_t* mib, val_t* v) {
  int64_t ms = load_i64(&arenas_dirty_ms);
  return ms != INT64_MIN ? (v->n = (uint64_t)ms, 0) : g_opt_dirty(mib, v);
}
static int s_arenas_dirty(const size_t* mib, const val_t* v) {
  (void)mib;
  if ((int64_t)v->n < -1) return EFAULT;
  __atomic_store_n(&arenas_dirty_ms, (int64_t)v->n, __ATOMIC_RELAXED);
  return 0;
}
GETN(g_arenas_muzzy, load_i64(&arenas_muzzy_ms))
static int s_arenas_muzzy(const size_t* mib, const val_t* v) {
  (void)mib;
  if ((int64_t)v->n < -1) return EFAULT;
  __atomic_store_n(&arenas_muzzy_ms, (int64_t)v->n, __ATOMIC_RELAXED);
  return 0;
}
GETN(g_quantum, 16)
GETN(g_page, _keel_page_size)
GETN(g_nbins, KEEL_NUM_CLASSES - 1)
GETN(g_nhbins, _keel_options.check ? 0 : KEEL_NUM_CLASSES - 1)
GETN(g_nlextents, JE_NLEXTENTS)
/* arenas.bin.<i>: mib[2] = i, Keel's class i + 1. */
static int g_bin_size(const size_t* mib, val_t* v) {
  v->n = _keel_classes[mib[2] + 1].size;
  return 0;
}
static int g_bin_nregs(const size_t* mib, val_t* v) {
  v->n = _keel_classes[mib[2] + 1].count;
  return 0;
}
static int g_bin_slab(const size_t* mib, val_t* v) {
  v->n = (uint64_t)_keel_classes[mib[2] + 1].units * KEEL_UNIT_SIZE;
  return 0;
}
static int g_lextent_size(const size_t* mib, val_t* v) {
  v->n = JE_LARGE_MIN + (uint64_t)mib[2] * KEEL_UNIT_SIZE;
  return 0;
}
static int r_arenas_create(RAW_ARGS) {
  (void)mib;
  if (oldp == NULL || oldlenp == NULL || *oldlenp != sizeof(unsigned)) {
    if (oldlenp != NULL) *oldlenp = 0;
    return EINVAL;
  }
  if (newp != NULL && newlen != sizeof(void*)) return EINVAL;
  return EFAULT; /* Keel has one heap: no arenas (and no extent hooks) to create */
}
static int r_arenas_lookup(RAW_ARGS) {
  (void)mib;
  const void* p = NULL;
  if (newp != NULL) {
    if (newlen != sizeof(void*)) return EINVAL;
    memcpy(&p, newp, sizeof p);
  }
  if (p == NULL) return EINVAL;
  uint8_t kind = keel_pagemap_get(p); /* a slab unit, or the first unit of a block */
  if (kind == KEEL_KIND_NONE || kind == KEEL_KIND_FREED) return EINVAL;
  val_t v = {0, NULL};
  return ctl_read(V_UNSIGNED, &v, oldp, oldlenp);
}
static const ctl_node_t arenas_bin_i_kids[] CTL_TREE = {
    N_RO("size", V_SIZE, g_bin_size),
    N_RO("nregs", V_UNSIGNED, g_bin_nregs),
    N_RO("slab_size", V_SIZE, g_bin_slab),
};
static const ctl_node_t arenas_bin_idx[] CTL_TREE = {N_IDX(arenas_bin_i_kids, idx_bin)};
static const ctl_node_t arenas_lextent_i_kids[] CTL_TREE = {N_RO("size", V_SIZE, g_lextent_size)};
static const ctl_node_t arenas_lextent_idx[] CTL_TREE = {N_IDX(arenas_lextent_i_kids, idx_lextent)};
static const ctl_node_t arenas_kids[] CTL_TREE = {
    N_RO("narenas", V_UNSIGNED, g_one),
    N_RW("dirty_decay_ms", V_SSIZE, g_arenas_dirty, s_arenas_dirty),
    N_RW("muzzy_decay_ms", V_SSIZE, g_arenas_muzzy, s_arenas_muzzy),
    N_RO("quantum", V_SIZE, g_quantum),
    N_RO("page", V_SIZE, g_page),
    N_RO("tcache_max", V_SIZE, g_tcache_max),
    N_RO("nbins", V_UNSIGNED, g_nbins),
    N_RO("nhbins", V_UNSIGNED, g_nhbins),
    N_DIR("bin", arenas_bin_idx),
    N_RO("nlextents", V_UNSIGNED, g_nlextents),
    N_DIR("lextent", arenas_lextent_idx),
    N_RAW("create", r_arenas_create),
    N_RAW("lookup", r_arenas_lookup),
};

/* -- stats -- */
static uint64_t page_count(uint64_t bytes) { return bytes / _keel_page_size; }
GETN(g_allocated, SNAP(s.allocated))
GETN(g_active, SNAP(s.active))
GETN(g_metadata, SNAP(s.metadata))
GETN(g_resident, SNAP(resident))
GETN(g_mapped, SNAP(mapped))
GETN(g_retained, SNAP(s.retained))
GETN(g_bg_threads, _keel_je_bg_enabled() && keel_opt(background_purge) ? 1 : 0)
GETN(g_purge_runs, SNAP(s.purge_runs))
GETN(g_nthreads, SNAP(s.threads))
GETS(g_dss_na, "disabled")
GETN(g_pactive, page_count(SNAP(s.active)))
GETN(g_pdirty, page_count(SNAP(dirty)))
GETN(g_purged_pages, page_count(SNAP(s.purged_bytes)))
GETN(g_tcache_bytes, SNAP(tcache_bytes))
GETN(g_small_alloc, SNAP(small))
GETN(g_large_alloc, SNAP(large))
/* stats.arenas.<i>.bins.<j>: mib[4] = j. Blocks in thread caches count as allocated
 * (as jemalloc's curregs counts regions its thread caches hold). */
static int g_curregs(const size_t* mib, val_t* v) {
  unsigned cls = (unsigned)mib[4] + 1;
  uint64_t out = SNAP_CLS(out, cls), batched = SNAP_CLS(batched, cls);
  v->n = out > batched ? out - batched : 0;
  return 0;
}
static int g_curslabs(const size_t* mib, val_t* v) {
  v->n = SNAP_CLS(slabs, (unsigned)mib[4] + 1);
  return 0;
}

static const ctl_node_t stats_bg_kids[] CTL_TREE = {
    N_RO("num_threads", V_SIZE, g_bg_threads),
    N_RO("num_runs", V_U64, g_purge_runs),
};
static const ctl_node_t stats_arenas_small_kids[] CTL_TREE = {N_RO("allocated", V_SIZE, g_small_alloc)};
static const ctl_node_t stats_arenas_large_kids[] CTL_TREE = {N_RO("allocated", V_SIZE, g_large_alloc)};
static const ctl_node_t stats_arenas_bins_j_kids[] CTL_TREE = {
    N_RO("curregs", V_SIZE, g_curregs),
    N_RO("curslabs", V_SIZE, g_curslabs),
};
static const ctl_node_t stats_arenas_bins_idx[] CTL_TREE = {N_IDX(stats_arenas_bins_j_kids, idx_bin)};
static const ctl_node_t stats_arenas_i_kids[] CTL_TREE = {
    N_RO("nthreads", V_UNSIGNED, g_nthreads),
    N_RO("dss", V_STR, g_dss_na),
    N_RO("dirty_decay_ms", V_SSIZE, g_dirty_ms),
    N_RO("muzzy_decay_ms", V_SSIZE, g_zero),
    N_RO("pactive", V_SIZE, g_pactive),
    N_RO("pdirty", V_SIZE, g_pdirty),
    N_RO("pmuzzy", V_SIZE, g_zero),
    N_RO("mapped", V_SIZE, g_mapped),
    N_RO("retained", V_SIZE, g_retained),
    N_RO("base", V_SIZE, g_metadata),
    N_RO("internal", V_SIZE, g_zero),
    N_RO("metadata_thp", V_SIZE, g_zero),
    N_RO("tcache_bytes", V_SIZE, g_tcache_bytes),
    N_RO("resident", V_SIZE, g_resident),
    N_RO("dirty_npurge", V_U64, g_purge_runs),
    N_RO("dirty_nmadvise", V_U64, g_purge_runs),
    N_RO("dirty_purged", V_U64, g_purged_pages),
    N_RO("muzzy_npurge", V_U64, g_zero),
    N_RO("muzzy_nmadvise", V_U64, g_zero),
    N_RO("muzzy_purged", V_U64, g_zero),
    N_DIR("small", stats_arenas_small_kids),
    N_DIR("large", stats_arenas_large_kids),
    N_DIR("bins", stats_arenas_bins_idx),
};
static const ctl_node_t stats_arenas_idx[] CTL_TREE = {N_IDX(stats_arenas_i_kids, idx_stats_arena)};
static const ctl_node_t stats_kids[] CTL_TREE = {
    N_RO("allocated", V_SIZE, g_allocated),
    N_RO("active", V_SIZE, g_active),
    N_RO("metadata", V_SIZE, g_metadata),
    N_RO("metadata_thp", V_SIZE, g_zero),
    N_RO("resident", V_SIZE, g_resident),
    N_RO("mapped", V_SIZE, g_mapped),
    N_RO("retained", V_SIZE, g_retained),
    N_DIR("background_thread", stats_bg_kids),
    N_DIR("arenas", stats_arenas_idx),
};

static const ctl_node_t root_kids[] CTL_TREE = {
    N_RO("version", V_STR, g_version),
    N_RAW("epoch", r_epoch),
    N_RW("background_thread", V_BOOL, g_bg, s_bg),
    N_RW("max_background_threads", V_SIZE, g_one, s_max_bg),
    N_DIR("thread", thread_kids),
    N_DIR("config", config_kids),
    N_DIR("opt", opt_kids),
    N_DIR("tcache", tcache_kids),
    N_DIR("arena", arena_idx),
    N_DIR("arenas", arenas_kids),
    N_DIR("stats", stats_kids),
};
static const ctl_node_t ctl_root CTL_TREE = N_DIR("", root_kids);

#define CTL_FN(fn) fn,
static const ctl_get_t GET[G_COUNT] = {NULL, CTL_GETTERS(CTL_FN)};
static const ctl_set_t SET[S_COUNT] = {NULL, CTL_SETTERS(CTL_FN)};
static const ctl_act_t ACT[A_COUNT] = {NULL, CTL_ACTIONS(CTL_FN)};
static const ctl_raw_t RAW[R_COUNT] = {NULL, CTL_RAWS(CTL_FN)};
static const ctl_index_t INDEX_OK[I_COUNT] = {NULL, CTL_INDEXES(CTL_FN)};
#define CTL_DIR(k) {k, N_COUNT(k)},
static const struct ctl_dir_s {
  const ctl_node_t* kids;
  unsigned n;
} DIRS[D_COUNT] = {{NULL, 0}, CTL_DIRS(CTL_DIR)};

static const ctl_node_t* kids_of(const ctl_node_t* nd) { return DIRS[nd->dir].kids; }
static unsigned nkids_of(const ctl_node_t* nd) { return DIRS[nd->dir].n; }
static bool is_indexed(const ctl_node_t* dir) { return kids_of(dir)[0].index_ok != I_NONE; }
static bool index_ok(const ctl_node_t* dir, uint64_t i) { return INDEX_OK[kids_of(dir)[0].index_ok](i); }

#define CTL_MAX_DEPTH 8

/* Walks `name` through the tree, filling mib with at most *depth components; sets
 * *depth to the number used and *rest to what is left of the name. NULL: no such name. */
static const ctl_node_t* ctl_lookup(const char* name, size_t* mib, size_t* depth,
                                    const char** rest) {
  const ctl_node_t* nd = &ctl_root;
  size_t i = 0, max = *depth;
  const char* s = name;
  while (i < max) {
    const char* e = s;
    while (*e != 0 && *e != '.') e++;
    size_t len = (size_t)(e - s);
    if (len == 0 || nd->dir == D_NONE) return NULL; /* empty component, or past a leaf */
    if (is_indexed(nd)) {
      uint64_t v = 0;
      for (const char* c = s; c < e; c++) {
        if (*c < '0' || *c > '9' || v > (UINT64_MAX - 9) / 10) return NULL;
        v = v * 10 + (uint64_t)(*c - '0');
      }
      if (!index_ok(nd, v)) return NULL;
      mib[i] = (size_t)v;
      nd = &kids_of(nd)[0];
    } else {
      const ctl_node_t* next = NULL;
      const ctl_node_t* kids = kids_of(nd);
      for (unsigned k = 0; k < nkids_of(nd); k++)
        if (len < sizeof kids[k].name && strncmp(kids[k].name, s, len) == 0 && kids[k].name[len] == 0) {
          next = &kids[k];
          mib[i] = k;
          break;
        }
      if (next == NULL) return NULL;
      nd = next;
    }
    i++;
    s = *e ? e + 1 : e;
    if (*e == 0) break;
  }
  *depth = i;
  *rest = s;
  return nd;
}

static int ctl_call(const ctl_node_t* nd, const size_t* mib, void* oldp, size_t* oldlenp,
                    void* newp, size_t newlen) {
  if (nd->dir != D_NONE) return ENOENT; /* an interior node names no value */
  if (nd->raw) return RAW[nd->raw](mib, oldp, oldlenp, newp, newlen);
  if (nd->act) {
    if (oldp != NULL || oldlenp != NULL || newp != NULL || newlen != 0) return EPERM;
    return ACT[nd->act](mib);
  }
  if (nd->set == S_NONE && (newp != NULL || newlen != 0)) return EPERM;
  val_t old = {0, NULL};
  int r = GET[nd->get](mib, &old);
  if (r != 0) return r;
  if (newp != NULL) {
    if (newlen != val_size(nd->type)) return EINVAL;
    /* A wrong old length fails before the write, as in jemalloc: nothing changes. */
    if (oldp != NULL && oldlenp != NULL && *oldlenp != val_size(nd->type))
      return ctl_read(nd->type, &old, oldp, oldlenp);
    val_t nv;
    val_decode(nd->type, newp, &nv);
    r = SET[nd->set](mib, &nv);
    if (r != 0) return r;
  }
  return ctl_read(nd->type, &old, oldp, oldlenp);
}

API int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen) {
  if (name == NULL) return ENOENT;
  keel_ensure_init();
  size_t mib[CTL_MAX_DEPTH], depth = CTL_MAX_DEPTH;
  const char* rest;
  const ctl_node_t* nd = ctl_lookup(name, mib, &depth, &rest);
  if (nd == NULL || *rest != 0) return ENOENT;
  return ctl_call(nd, mib, oldp, oldlenp, newp, newlen);
}

API int mallctlnametomib(const char* name, size_t* mibp, size_t* miblenp) {
  if (name == NULL || mibp == NULL || miblenp == NULL) return EINVAL;
  keel_ensure_init();
  size_t mib[CTL_MAX_DEPTH], depth = *miblenp < CTL_MAX_DEPTH ? *miblenp : CTL_MAX_DEPTH;
  const char* rest;
  if (ctl_lookup(name, mib, &depth, &rest) == NULL) return ENOENT;
  if (*rest != 0 && depth < *miblenp) return ENOENT; /* deeper than any name */
  memcpy(mibp, mib, depth * sizeof(size_t));
  *miblenp = depth;
  return 0;
}

API int mallctlbymib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp, void* newp,
                     size_t newlen) {
  if (mib == NULL || miblen == 0 || miblen > CTL_MAX_DEPTH) return ENOENT;
  keel_ensure_init();
  const ctl_node_t* nd = &ctl_root;
  for (size_t i = 0; i < miblen; i++) {
    if (nd->dir == D_NONE) return ENOENT;
    if (is_indexed(nd)) {
      if (!index_ok(nd, mib[i])) return ENOENT;
      nd = &kids_of(nd)[0];
    } else {
      if (mib[i] >= nkids_of(nd)) return ENOENT;
      nd = &kids_of(nd)[mib[i]];
    }
  }
  return ctl_call(nd, mib, oldp, oldlenp, newp, newlen);
}

/* Every value leaf of the top-level directory `dir` that reads without an index, in the
 * tree's order: malloc_stats_print's "config." and "opt." lines. */
KEEL_COLD void _keel_je_ctl_each(const char* dir, je_leaf_fn fn, void* ctx) {
  const ctl_node_t* d = NULL;
  for (unsigned k = 0; k < nkids_of(&ctl_root) && d == NULL; k++)
    if (strcmp(root_kids[k].name, dir) == 0) d = &root_kids[k];
  if (d == NULL) return;
  size_t mib[1] = {0};
  for (unsigned k = 0; k < nkids_of(d); k++) {
    const ctl_node_t* nd = &kids_of(d)[k];
    if (nd->get == G_NONE) continue;
    val_t v = {0, NULL};
    if (GET[nd->get](mib, &v) != 0) continue;
    fn(ctx, nd->name, nd->type, &v);
  }
}
