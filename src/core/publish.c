/* publish.c -- statistics another process can read without stopping this one.
 *
 * Once the process has lived a second (so short commands, and fork children that
 * _exit at once, never create one), the purger creates /dev/shm/keel-<pid> (mode 0600:
 * only the process's user, or root, can read it) holding a keel_published_t. A reader
 * (`keel stats PID`, `keel top`) increments `request`; the background purger, on its
 * next tick, refreshes the figures under a sequence lock and copies `request` to
 * `answered`. The same way, `keel purge PID` increments `purge_request`, `keel profile
 * PID` `profile_request` (the heap profile is written to
 * KEEL_PROFILE_PREFIX.<pid>.req<n>.heap, named in profile_path), and `keel stats PID
 * --mesh` `mesh_request` (the meshing estimate). Nobody looking costs a few loads per
 * purger tick. The layout is fixed (version 10) and documented in docs/design.md; the
 * lab reads it. */
#include "core/internal.h"

#define PUBLISH_MAGIC 0x5441545354454b4bull /* "KKETSTAT" read little-endian */
#define MESH_ROWS 73 /* classes up to 2 KiB, the ones meshing considers */

typedef struct keel_published_s {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_size;     /* offset of `classes` */
  uint64_t pid;
  uint64_t request;         /* readers increment */
  uint64_t answered;        /* = request once refreshed */
  uint64_t purge_request;
  uint64_t purge_answered;
  uint64_t seq;             /* odd while being written */
  uint64_t updated_ms;      /* monotonic clock of the last refresh */
  uint64_t purged_on_request; /* bytes the last purge request released */
  uint64_t profile_request;   /* readers increment: write a heap profile */
  uint64_t profile_answered;
  char profile_path[256];     /* where the last requested profile went ("" if none) */
  uint32_t nclasses;
  uint32_t pad;
  keel_stats_t stats;
  keel_class_stats_t classes[KEEL_NUM_CLASSES - 1];
  /* Layout 3: the lock counters, in keel_stats_locks' order (names in docs/design.md). */
  uint32_t nlocks;
  uint32_t pad2;
  struct {
    uint64_t acquired, contended, sleeps;
  } locks[8];
  /* Layout 4: the meshing estimate (keel_mesh_estimate), computed only on request. */
  uint64_t mesh_request;      /* readers increment */
  uint64_t mesh_answered;
  uint32_t nmesh;             /* rows filled in `mesh` */
  uint32_t pad3;
  keel_mesh_estimate_t mesh[MESH_ROWS];
  /* Layout 5: meshing itself (keel_mesh_stats), refreshed with the statistics. */
  keel_mesh_stats_t mesh_stats;
  /* Layout 7: _keel_central_borrowed_blocks (docs/design.md "Borrowing"), refreshed
   * with the statistics. */
  uint64_t borrowed_blocks;
  /* Layout 8: _keel_central_carved_holes (docs/design.md "Carving"), refreshed with the
   * statistics. */
  uint64_t carved_holes;
  /* Layout 9: _keel_caches_taken_back (docs/design.md "Caches of waiting threads"). */
  uint64_t caches_taken_back;
  /* Layout 10: _keel_gathers, _keel_blocks_gathered (docs/design.md "Blocks above 8 KiB
   * are gathered"). */
  uint64_t gathers;
  uint64_t blocks_gathered;
} keel_published_t;

_Static_assert(sizeof(keel_stats_t) == 120, "published layout: keel_stats_t is 120 bytes");
_Static_assert(__builtin_offsetof(keel_published_t, stats) == 360, "published layout");
/* Layout 6: 127 classes (120 before) and 73 mesh rows (72); the offsets below moved. */
_Static_assert(__builtin_offsetof(keel_published_t, nlocks) == 5560, "published layout 6: 127 classes");
_Static_assert(__builtin_offsetof(keel_published_t, mesh_request) == 5760, "published layout 6");
_Static_assert(__builtin_offsetof(keel_published_t, mesh) == 5784 && sizeof(keel_mesh_estimate_t) == 72,
               "published layout 6: mesh rows");
_Static_assert(__builtin_offsetof(keel_published_t, mesh_stats) == 11040 && sizeof(keel_mesh_stats_t) == 96,
               "published layout 6: mesh statistics");
/* Layout 7 only appends: readers of 2-6 find everything where it was. */
_Static_assert(__builtin_offsetof(keel_published_t, borrowed_blocks) == 11136, "published layout 7");
/* Layout 8 appends too. */
_Static_assert(__builtin_offsetof(keel_published_t, carved_holes) == 11144, "published layout 8");
_Static_assert(__builtin_offsetof(keel_published_t, caches_taken_back) == 11152, "published layout 9");
_Static_assert(__builtin_offsetof(keel_published_t, blocks_gathered) == 11168, "published layout 10");

static keel_published_t* pub;
static char pub_name[32];
static uint64_t born_ms;  /* process start, or the fork that made this child */
static bool tried;        /* creation was attempted (do not retry every tick) */

#define PUB_PREFIX "keel-" /* + the pid: the file's name, and what the sweep looks for */

static void make_name(void) {
  keel_buf_t b = {pub_name, 0, sizeof pub_name};
  _keel_buf_str(&b, PUB_PREFIX);
  _keel_buf_u64(&b, (uint64_t)_keel_prim_getpid());
}

static KEEL_COLD void refresh(keel_published_t* p) {
  keel_stats_t s;
  _keel_stats_collect(&s);
  keel_class_stats_t cs[KEEL_NUM_CLASSES - 1];
  size_t n = keel_stats_classes(cs, KEEL_NUM_CLASSES - 1);
  keel_lock_stats_t ls[8];
  size_t nl = keel_stats_locks(ls, 8);
  keel_mesh_stats_t ms;
  keel_mesh_stats(&ms);
  uint64_t borrowed = _keel_central_borrowed_blocks();
  uint64_t carved = _keel_central_carved_holes();
  __atomic_fetch_add(&p->seq, 1, __ATOMIC_ACQ_REL); /* odd: writing */
  p->stats = s;
  memcpy(p->classes, cs, n * sizeof cs[0]);
  p->nclasses = (uint32_t)n;
  for (size_t i = 0; i < nl && i < 8; i++) {
    p->locks[i].acquired = ls[i].acquired;
    p->locks[i].contended = ls[i].contended;
    p->locks[i].sleeps = ls[i].sleeps;
  }
  p->nlocks = (uint32_t)(nl < 8 ? nl : 8);
  p->mesh_stats = ms;
  p->borrowed_blocks = borrowed;
  p->carved_holes = carved;
  p->caches_taken_back = __atomic_load_n(&_keel_caches_taken_back, __ATOMIC_RELAXED);
  p->gathers = __atomic_load_n(&_keel_gathers, __ATOMIC_RELAXED);
  p->blocks_gathered = __atomic_load_n(&_keel_blocks_gathered, __ATOMIC_RELAXED);
  p->updated_ms = _keel_prim_clock_ms();
  __atomic_fetch_add(&p->seq, 1, __ATOMIC_RELEASE); /* even: consistent */
}

void _keel_publish_init(void) { born_ms = _keel_prim_clock_ms(); }

static bool swept; /* inherited by forked children: one sweep per program, not per child */

static void create(void) {
  __atomic_store_n(&tried, true, __ATOMIC_RELAXED);
  if (!keel_opt(publish)) return;
  /* Files of processes that ended without removing theirs (SIGKILL, _exit, a
   * PostgreSQL immediate shutdown) would pile up in memory-backed /dev/shm: 1,308
   * (8.7 MiB) on the test machine after a day of test runs. */
  if (!swept) {
    swept = true;
    _keel_prim_publish_sweep(PUB_PREFIX);
  }
  make_name();
  keel_published_t* p = (keel_published_t*)_keel_prim_publish_create(pub_name, sizeof *p);
  if (p == NULL) return;
  p->layout_version = 10;
  p->header_size = (uint32_t)__builtin_offsetof(keel_published_t, classes);
  p->pid = (uint64_t)_keel_prim_getpid();
  /* No figures yet (updated_ms 0): a reader asks for them, and a process nobody asks
   * never runs the statistics code nor touches the class rows' pages. */
  __atomic_store_n(&p->magic, PUBLISH_MAGIC, __ATOMIC_RELEASE);
  __atomic_store_n(&pub, p, __ATOMIC_SEQ_CST);
  /* Switched off while the file was being made: whichever of this and
   * _keel_publish_option_changed takes pub back removes the file (sequentially
   * consistent on both sides, so at least one sees the other's write). */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (!__atomic_load_n(&_keel_options.publish, __ATOMIC_SEQ_CST) &&
      __atomic_exchange_n(&pub, NULL, __ATOMIC_SEQ_CST) != NULL)
    _keel_prim_publish_remove(pub_name);
}

/* In the child of fork the inherited mapping is the parent's file: never write it
 * (it stays mapped, a few KiB); the child publishes its own after a second. */
void _keel_publish_after_fork_child(void) {
  pub = NULL;
  tried = false;
  born_ms = _keel_prim_clock_ms();
}

/* KEEL_PUBLISH changed at run time: switched on, the next tick creates the file; off,
 * the file goes now (or, if the purger is creating it at this moment, as soon as it
 * has). The old mapping is left in place (one small block, once per switch) so that a
 * tick in flight still touches valid memory. */
void _keel_publish_option_changed(void) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the option's store, before pub's load */
  if (__atomic_load_n(&_keel_options.publish, __ATOMIC_SEQ_CST)) {
    __atomic_store_n(&tried, false, __ATOMIC_RELAXED);
  } else if (__atomic_exchange_n(&pub, NULL, __ATOMIC_SEQ_CST) != NULL) {
    _keel_prim_publish_remove(pub_name);
  }
}

void _keel_publish_exit(void) {
  if (pub != NULL) _keel_prim_publish_remove(pub_name);
}

/* The answers to requests are functions of their own, kept out of line: their buffers
 * (the mesh rows alone are 5 KiB) would otherwise sit in the tick's frame, and every
 * call the tick makes would write a return address below them - two stack pages of
 * the purger's, resident in every process, for requests that almost never come. Cold:
 * with the other rarely run code, outside the first window of text (src/hot_text.ld). */
static KEEL_COLD void answer_purge(keel_published_t* p, uint64_t purge) {
  p->purged_on_request = _keel_purge_now(UINT32_MAX);
  refresh(p);
  __atomic_store_n(&p->purge_answered, purge, __ATOMIC_RELEASE);
}

static KEEL_COLD void answer_profile(keel_published_t* p, uint64_t prof) {
  char path[sizeof p->profile_path];
  path[0] = 0;
  if (_keel_profiling) {
    char tag[24]; /* req<n> */
    keel_buf_t t = {tag, 0, sizeof tag};
    _keel_buf_str(&t, "req");
    _keel_buf_u64(&t, prof);
    /* A path the dump failed to write is answered with '!' before it: the process does
     * profile, and its reader says where it could not write. */
    _keel_profile_path(path + 1, sizeof path - 1, tag);
    bool written = _keel_profile_dump_to(path + 1);
    if (!written) _keel_warn("cannot write heap profile ", path + 1);
    if (written) memmove(path, path + 1, sizeof path - 1);
    else path[0] = '!';
  }
  memcpy(p->profile_path, path, sizeof path);
  __atomic_store_n(&p->profile_answered, prof, __ATOMIC_RELEASE);
}

static KEEL_COLD void answer_mesh(keel_published_t* p, uint64_t mesh) {
  keel_mesh_estimate_t rows[MESH_ROWS];
  size_t n = keel_mesh_estimate(rows, MESH_ROWS);
  __atomic_fetch_add(&p->seq, 1, __ATOMIC_ACQ_REL);
  memcpy(p->mesh, rows, n * sizeof rows[0]);
  p->nmesh = (uint32_t)n;
  __atomic_fetch_add(&p->seq, 1, __ATOMIC_RELEASE);
  refresh(p);
  __atomic_store_n(&p->mesh_answered, mesh, __ATOMIC_RELEASE);
}

static KEEL_COLD void answer_stats(keel_published_t* p, uint64_t req) {
  refresh(p);
  __atomic_store_n(&p->answered, req, __ATOMIC_RELEASE);
}

/* Called by the purger on every tick. */
void _keel_publish_tick(void) {
  if (__atomic_load_n(&pub, __ATOMIC_ACQUIRE) == NULL && !__atomic_load_n(&tried, __ATOMIC_RELAXED) &&
      _keel_prim_clock_ms() - born_ms >= 1000)
    create();
  keel_published_t* p = __atomic_load_n(&pub, __ATOMIC_ACQUIRE);
  if (p == NULL) return;
  uint64_t purge = __atomic_load_n(&p->purge_request, __ATOMIC_ACQUIRE);
  if (purge != __atomic_load_n(&p->purge_answered, __ATOMIC_RELAXED)) answer_purge(p, purge);
  uint64_t prof = __atomic_load_n(&p->profile_request, __ATOMIC_ACQUIRE);
  if (prof != __atomic_load_n(&p->profile_answered, __ATOMIC_RELAXED)) answer_profile(p, prof);
  uint64_t mesh = __atomic_load_n(&p->mesh_request, __ATOMIC_ACQUIRE);
  if (mesh != __atomic_load_n(&p->mesh_answered, __ATOMIC_RELAXED)) answer_mesh(p, mesh);
  uint64_t req = __atomic_load_n(&p->request, __ATOMIC_ACQUIRE);
  if (req != __atomic_load_n(&p->answered, __ATOMIC_RELAXED)) answer_stats(p, req);
}
