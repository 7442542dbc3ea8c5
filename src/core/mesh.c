/* mesh.c -- meshing: giving back memory that deletes left scattered over slabs.
 *
 * After random deletes every slab of a class still holds a few live blocks, so no page
 * is wholly free. When page j of slab A and page j of slab B (two slabs of a class share
 * one layout) have no block in use at the same index, both can be served by one
 * physical page: their blocks are copied into one page of a memory file, and both
 * addresses become private views of it (docs/meshing.md, the design and its figures).
 *
 * Why this is correct without telling the program:
 * - A view is MAP_PRIVATE. Reading it reads the shared file page; the first write to it
 *   gives that address its own copy again (copy-on-write). So each address keeps the
 *   meaning of a page of its own: A's blocks read what A wrote, a block A allocates
 *   later at an offset where B has data is written before it is read (or zeroed by
 *   calloc), and nothing written through A is ever seen through B. A written view is
 *   "eroded": correct, only no longer sharing. Across fork, the kernel's copy-on-write
 *   gives the child a snapshot, as for any private memory.
 * - While the page image is built, writers are held at the two pages by a userfaultfd
 *   write barrier, in the kernel (no signal handler); readers go on reading the old
 *   page until mmap replaces it atomically. The purger holds the class lock for the
 *   whole operation, so the one piece of Keel that writes into blocks under a lock,
 *   slab_take, cannot be waiting on the barrier while the purger needs that lock; every
 *   other writer (free's link word, the program) holds no Keel lock.
 * - The file page must not change while anyone may read it through a view: it is
 *   written once, before the views exist, and released (hole-punched) only when no
 *   view still reads it - every view eroded or replaced - and no child process forked
 *   since may map it (a pipe per fork tells when those children are gone).
 * - Memory that leaves a slab goes back to the page heap as anonymous memory again
 *   (_keel_mesh_leave), because the page heap counts on purged memory reading zero.
 *
 * Off by default (KEEL_MESH=on): its cost is one kernel mapping per view (the kernel
 * limits them, vm.max_map_count) and purger time, and RSS does not show its gain -
 * VmRSS counts a shared page once per view, PSS misses views not read since; RssAnon +
 * RssFile + the file's resident bytes (keel_mesh_stats) is what the process holds.
 * Offset in the file = group number x page size, so the file needs no allocator. */
#include "core/internal.h"

#define GROUPS_MAX ((uint32_t)1 << 20) /* file pages (the file is sparse) */
#define PIPES_MAX 16u                  /* children we can wait for */
#define SWEEP_PER_TICK 4096u           /* views checked for erosion per pass */
#define PASS_BUDGET_NS (50u * 1000 * 1000) /* purger time per tick (of 250 ms) */
/* While a class's plan is cut short by the budget (a class with more to mesh than one
 * tick does: each tick plans it again from its bitmaps before meshing on), ticks get
 * twice the time, so a heap left sparse by deletes is meshed within the idle time the
 * gain is measured over (redis-frag, 1 KiB values: meshing still going 30 s after the
 * deletes at 50 ms a tick once busy classes wait). At most 40 % of a core, meanwhile. */
#define CATCH_UP_BUDGET_NS (100u * 1000 * 1000)
#define BUDGET_TICKS 40u               /* re-read the mapping budget every ~10 s */

enum { G_FREE = 0, G_SHARED, G_PUNCHED };

typedef struct mesh_group_s {
  uintptr_t page[KEEL_MESH_WAYS]; /* the views (0: none, or replaced by fresh memory) */
  uint32_t next_free;
  uint32_t epoch; /* forks made while views existed, when it was made */
  uint8_t state;
  uint8_t eroded; /* bit m: view m was written (it has a private copy) */
} mesh_group_t;

#define MEMBER_BITS 3 /* view table value: group << MEMBER_BITS | member */
_Static_assert(KEEL_MESH_WAYS <= (1 << MEMBER_BITS) && KEEL_MESH_WAYS <= 8, "members fit");

static bool group_empty(const mesh_group_t* gr) {
  for (unsigned m = 0; m < KEEL_MESH_WAYS; m++)
    if (gr->page[m]) return false;
  return true;
}

static keel_lock_t mesh_lock KEEL_ALWAYS_BSS;  /* one pass at a time; before the central locks */
static keel_lock_t table_lock KEEL_ALWAYS_BSS; /* groups, view table, counters: innermost */

static int file_fd = -1, barrier_fd = -1, barrier_mode = -1;
static uint64_t file_id, barrier_id;
/* On the page every process writes: every forked child sets them. */
static bool disabled KEEL_ALWAYS_BSS; /* refused for good: no barrier, no file, or a forked child */
static bool in_child KEEL_ALWAYS_BSS; /* a forked child: leaves views but never meshes or releases */
static bool warned;

static mesh_group_t* groups; /* GROUPS_MAX entries, reserved, touched as used */
static uint32_t groups_top, free_head = UINT32_MAX;
/* View table: page address -> group << MEMBER_BITS | member, open addressing, linear
 * probing. */
static uintptr_t* view_keys;
static uint32_t* view_vals;
static size_t view_slots; /* a power of two, or 0 */

/* Forks. A child maps the groups that existed when it was forked, so their file pages
 * stay until it is gone. Each fork made while views exist starts a new epoch; a group
 * records the epoch it was made in, each child the epoch it was forked in. A child and
 * the children it forks hold the write end of its pipe, and each writes its pid there as
 * it starts: the pipe reads end-of-file once they all exited, exec'd or closed it, and
 * the pids then say which of them still map the file (one that closed descriptors it did
 * not open lives on). */
#define CHILD_PIDS 16u /* pids a child's pipe may name; beyond, it is never known gone */
typedef struct {
  int fd;         /* the pipe's read end, -1 once it read end-of-file */
  uint32_t epoch;
  uint64_t id;    /* the read end's identity: still ours? */
  uint32_t npids; /* pids read from it (more than CHILD_PIDS: too many to follow) */
  int32_t pids[CHILD_PIDS];
} child_t;
static uint32_t epoch;
static child_t children[PIPES_MAX];
static unsigned npipes;
static int parent_pipe = -1; /* in a child: the write end its pid goes to */
static uint64_t parent_pipe_id;
static int64_t lost_epoch = -1; /* the last child we could not track (it may live on) */
static int new_pipe[2] = {-1, -1};

static uint64_t view_cap, budget_tick;
static uint32_t sweep_cursor;
static uint64_t last_plan[KEEL_NUM_CLASSES];
/* Busy classes wait: a block allocated on a meshed page, or a free writing its link word
 * into one, gives that view a private page again at once (erosion), so meshing a class
 * the program is churning wastes the operation and leaves half-eroded groups behind,
 * which pack worse than a matching made once the class is quiet (redis-frag, 3 B values:
 * 12,000 of 70,000 views eroded before the idle phase). Busy = the class lock taken more
 * than MESH_BUSY_LOCKS times a tick by others (a lock round trip moves a batch of up to
 * 32 blocks; the purger's own decay takes it once a tick). */
#define MESH_BUSY_LOCKS 8
static uint64_t seen_locks[KEEL_NUM_CLASSES], seen_tick[KEEL_NUM_CLASSES];

static uint64_t class_locks(unsigned cls) {
  keel_lock_stats_t sum = {"central", 0, 0, 0};
  _keel_central_lock_read(cls, &sum);
  return sum.acquired;
}

/* Whether others took cls's lock more than MESH_BUSY_LOCKS times a tick since the last
 * look; remembers this look. */
static bool class_busy(unsigned cls, uint64_t now) {
  uint64_t locks = class_locks(cls), ticks = now - seen_tick[cls];
  bool busy = seen_tick[cls] != 0 && locks - seen_locks[cls] > MESH_BUSY_LOCKS * (ticks ? ticks : 1);
  seen_locks[cls] = locks;
  seen_tick[cls] = now;
  return busy;
}
static unsigned resume_class; /* the class whose plan the last pass cut short (0: none) */
static _Alignas(64) unsigned char image[KEEL_MESH_MAX_PAGE];

static keel_mesh_stats_t st; /* counters under table_lock */

/* ---- the view table -------------------------------------------------------------- */

static size_t slot_of(uintptr_t page) {
  return (size_t)(((uint64_t)page * 0x9E3779B97F4A7C15ull) >> 20) & (view_slots - 1);
}

static size_t view_find(uintptr_t page) {
  if (view_slots == 0) return SIZE_MAX;
  for (size_t i = slot_of(page);; i = (i + 1) & (view_slots - 1)) {
    if (view_keys[i] == page) return i;
    if (view_keys[i] == 0) return SIZE_MAX;
  }
}

static void view_put_raw(uintptr_t page, uint32_t val) {
  size_t i = slot_of(page);
  while (view_keys[i] != 0) i = (i + 1) & (view_slots - 1);
  view_keys[i] = page;
  view_vals[i] = val;
}

/* Room for `more` views at a load of at most a half; false if no memory. */
static bool view_reserve(uint64_t more) {
  uint64_t need = (st.views + more) * 2;
  if (need <= view_slots) return true;
  size_t slots = view_slots ? view_slots : 4096;
  while (slots < need) slots *= 2;
  uintptr_t* keys = (uintptr_t*)_keel_prim_map(slots * sizeof(uintptr_t), 0, NULL);
  uint32_t* vals = keys ? (uint32_t*)_keel_prim_map(slots * sizeof(uint32_t), 0, NULL) : NULL;
  if (vals == NULL) {
    if (keys) _keel_prim_unmap(keys, slots * sizeof(uintptr_t));
    return false;
  }
  uintptr_t* old_keys = view_keys;
  uint32_t* old_vals = view_vals;
  size_t old_slots = view_slots;
  view_keys = keys;
  view_vals = vals;
  view_slots = slots;
  for (size_t i = 0; i < old_slots; i++)
    if (old_keys[i]) view_put_raw(old_keys[i], old_vals[i]);
  if (old_keys) {
    _keel_prim_unmap(old_keys, old_slots * sizeof(uintptr_t));
    _keel_prim_unmap(old_vals, old_slots * sizeof(uint32_t));
  }
  return true;
}

/* Removes slot i, moving later entries of its probe run back (no tombstones). */
static void view_del(size_t i) {
  size_t mask = view_slots - 1;
  view_keys[i] = 0;
  for (size_t j = (i + 1) & mask; view_keys[j] != 0; j = (j + 1) & mask) {
    size_t home = slot_of(view_keys[j]);
    /* Entry j may fill the hole at i unless its home lies cyclically in (i, j]. */
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    view_keys[i] = view_keys[j];
    view_vals[i] = view_vals[j];
    view_keys[j] = 0;
    i = j;
  }
}

/* ---- groups ------------------------------------------------------------------------ */

static uint32_t group_new(void) {
  if (groups == NULL) {
    groups = (mesh_group_t*)_keel_prim_map((size_t)GROUPS_MAX * sizeof(mesh_group_t), 0, NULL);
    if (groups == NULL) return UINT32_MAX;
  }
  uint32_t g = free_head;
  if (g != UINT32_MAX) free_head = groups[g].next_free;
  else if (groups_top < GROUPS_MAX) g = groups_top++;
  return g;
}

static void group_free(uint32_t g) {
  groups[g].state = G_FREE;
  groups[g].next_free = free_head;
  free_head = g;
  st.groups--;
}

static uint64_t group_offset(uint32_t g) { return (uint64_t)g * _keel_page_size; }

/* Table lock held. Whether the file page of g may be released now: no view reads it and
 * no forked child may map it. */
static bool group_releasable(const mesh_group_t* gr) {
  if (in_child || (int64_t)gr->epoch <= lost_epoch) return false;
  for (unsigned i = 0; i < npipes; i++)
    if (gr->epoch <= children[i].epoch) return false; /* that child may map it */
  for (unsigned m = 0; m < KEEL_MESH_WAYS; m++)
    if (gr->page[m] && !(gr->eroded >> m & 1)) return false;
  return true;
}

/* Table lock held. Whether page p can mesh: not a view, or a view written since. */
static bool meshable(uintptr_t p) {
  size_t i = view_find(p);
  if (i == SIZE_MAX) return true;
  uint32_t v = view_vals[i];
  return groups[v >> MEMBER_BITS].eroded >> (v & ((1u << MEMBER_BITS) - 1)) & 1;
}

bool _keel_mesh_page_meshable(uintptr_t p) {
  if (view_slots == 0) return true; /* (read unlocked: only the pass adds views) */
  keel_lock(&table_lock);
  bool ok = meshable(p);
  keel_unlock(&table_lock);
  return ok;
}

/* Table lock held. View p (if it is one) leaves its group: it maps something else now.
 * A group whose file page was released ends with its last view; one still holding it
 * waits for the pass, which may release it (never from inside free(), and a child may
 * still map the page). */
static void leave_group(uintptr_t p) {
  size_t i = view_find(p);
  if (i == SIZE_MAX) return;
  uint32_t v = view_vals[i], g = v >> MEMBER_BITS, m = v & ((1u << MEMBER_BITS) - 1);
  mesh_group_t* gr = &groups[g];
  gr->page[m] = 0;
  gr->eroded &= (uint8_t)~(1u << m);
  view_del(i);
  st.views--;
  if (group_empty(gr) && gr->state == G_PUNCHED) group_free(g);
}

/* ---- leaving: a view whose blocks are all free becomes fresh memory ------------------ */

bool _keel_mesh_leave(void* addr, size_t len) {
  size_t page = _keel_page_size;
  bool ok = true;
  for (uintptr_t p = (uintptr_t)addr; p < (uintptr_t)addr + len; p += page) {
    keel_lock(&table_lock);
    size_t i = view_find(p);
    keel_unlock(&table_lock);
    if (i == SIZE_MAX) continue;
    /* The class lock is held: nothing can be allocated on this page meanwhile. */
    if (!_keel_prim_map_fresh((void*)p, page)) {
      ok = false;
      continue;
    }
    keel_lock(&table_lock);
    leave_group(p);
    st.left++;
    keel_unlock(&table_lock);
  }
  return ok;
}

/* ---- the operation ----------------------------------------------------------------- */

static inline bool block_free(const keel_slab_t* s, uint32_t i) {
  return (keel_slab_word(s, _keel_classes[s->cls].count, i / 64) >> (i % 64)) & 1;
}

/* Mesh lock held. Pages of the same index in slabs of class cls: those whose blocks in
 * use are still disjoint from the ones before them (at least two) become views of one
 * file page. Returns the pages that gives back. */
static size_t mesh_group(unsigned cls, const uintptr_t* cand, unsigned ncand) {
  keel_central_t* cl = keel_central_of(cls);
  const keel_class_t* k = &_keel_classes[cls];
  size_t page = _keel_page_size;
  size_t saved = 0;
  uintptr_t pg[KEEL_MESH_WAYS];
  keel_slab_t* sl[KEEL_MESH_WAYS];
  uintptr_t base[KEEL_MESH_WAYS];
  unsigned n = 0;
  uint64_t taken[(KEEL_MESH_MAX_PAGE / 16 + 2 + 63) / 64] = {0}; /* blocks in use so far */
  _keel_central_lock_class(cl);
  size_t off = 0;
  uint32_t first = 0, last = 0;
  for (unsigned c = 0; c < ncand && n < KEEL_MESH_WAYS; c++) {
    uintptr_t a = cand[c];
    /* The plan was made unlocked: the page map says whether the page is still in a slab
     * of cls (it is set and cleared under this lock); the bitmap is read again. */
    if (keel_pagemap_get((void*)a) != cls) continue;
    keel_chunk_t* ch = keel_chunk_of((void*)a);
    keel_slab_t* s = keel_span_head(ch, keel_unit_index((void*)a));
    /* A home line's refills come from the head of its list: it would be written soon. */
    if (s->in_partial && s->prev == NULL) continue;
    uintptr_t b = (uintptr_t)keel_unit_addr(ch, (unsigned)(s - ch->units));
    if (n == 0) {
      off = a - b;
      first = (uint32_t)(off / k->size);
      last = (uint32_t)((off + page - 1) / k->size);
      if (off % page || first >= k->count) break;
      if (last >= k->count) last = k->count - 1;
    } else if (a - b != off) {
      continue;
    }
    bool fits = true, used = false;
    for (unsigned m = 0; m < n; m++) fits &= sl[m] != s;
    for (uint32_t i = first; i <= last && fits; i++) {
      bool u = !block_free(s, i);
      used |= u;
      fits = !(u && (taken[(i - first) / 64] >> ((i - first) % 64) & 1));
    }
    if (!fits || !used) continue; /* (a wholly free page is purged instead) */
    for (uint32_t i = first; i <= last; i++)
      if (!block_free(s, i)) taken[(i - first) / 64] |= (uint64_t)1 << ((i - first) % 64);
    pg[n] = a;
    sl[n] = s;
    base[n++] = b;
  }
  if (n < 2) goto out;

  /* A page may be a view already only if it was written since (eroded): then it is a
   * private page again and may mesh anew, leaving its old group. */
  keel_lock(&table_lock);
  uint32_t g = UINT32_MAX;
  bool ok = st.views + n <= view_cap && view_reserve(n);
  for (unsigned m = 0; m < n && ok; m++) ok = meshable(pg[m]);
  if (ok) g = group_new();
  keel_unlock(&table_lock);
  if (g == UINT32_MAX) goto out;

  uint64_t t0 = _keel_prim_clock_ns();
  bool armed[KEEL_MESH_WAYS], view[KEEL_MESH_WAYS];
  unsigned narmed = 0, nviews = 0;
  for (unsigned m = 0; m < n; m++) {
    armed[m] = _keel_prim_barrier_arm(barrier_fd, (void*)pg[m], page);
    view[m] = false;
    narmed += armed[m];
  }
  if (narmed >= 2) {
    /* The first armed page, then the other armed pages' blocks in use (clipped to the
     * page) over its free ones. */
    bool copied = false;
    for (unsigned m = 0; m < n; m++) {
      if (!armed[m]) continue;
      if (!copied) {
        memcpy(image, (const void*)pg[m], page);
        copied = true;
        continue;
      }
      for (uint32_t i = first; i <= last; i++) {
        if (block_free(sl[m], i)) continue;
        size_t lo = (size_t)i * k->size, hi = lo + k->size;
        if (lo < off) lo = off;
        if (hi > off + page) hi = off + page;
        memcpy(image + (lo - off), (const void*)(base[m] + lo), hi - lo);
      }
    }
    if (_keel_prim_file_write(file_fd, group_offset(g), image, page))
      for (unsigned m = 0; m < n; m++)
        if (armed[m]) nviews += view[m] = _keel_prim_map_view((void*)pg[m], page, file_fd, group_offset(g));
  }
  /* A replaced range lost its registration with the mapping; one still armed is given
   * back. Either way its waiting writers are woken. */
  for (unsigned m = 0; m < n; m++) {
    if (armed[m] && !view[m]) _keel_prim_barrier_disarm(barrier_fd, (void*)pg[m], page);
    if (view[m]) _keel_prim_barrier_wake(barrier_fd, (void*)pg[m], page);
  }
  uint64_t ns = _keel_prim_clock_ns() - t0;

  keel_lock(&table_lock);
  st.busy_ns += ns;
  if (ns > st.longest_ns) st.longest_ns = ns;
  if (nviews == 0) { /* nothing changed: the file page may hold the image, never read */
    _keel_prim_file_release(file_fd, group_offset(g), page);
    groups[g].next_free = free_head;
    free_head = g;
    st.failed++;
  } else {
    /* Members the kernel refused stay as they were; one view alone saves nothing. */
    mesh_group_t* gr = &groups[g];
    memset(gr->page, 0, sizeof gr->page);
    gr->eroded = 0;
    gr->epoch = epoch;
    gr->state = G_SHARED;
    unsigned member = 0;
    for (unsigned m = 0; m < n; m++) {
      if (!view[m]) continue;
      leave_group(pg[m]);
      gr->page[member] = pg[m];
      view_put_raw(pg[m], g << MEMBER_BITS | member);
      member++;
      /* The central lists hand a meshed slab's pages back through the hook when they
       * leave it (released, or purged): set before the first slab is marked, under its
       * class's lock, which every reader of the mark holds. */
      __atomic_store_n(&_keel_central_unmesh, _keel_mesh_leave, __ATOMIC_RELAXED);
      sl[m]->meshed = 1;
    }
    st.views += nviews;
    st.groups++;
    saved = nviews - 1;
    st.meshed += saved;
    if (nviews < n) st.failed++;
  }
  keel_unlock(&table_lock);
out:
  _keel_central_unlock_class(cl);
  return saved;
}

/* ---- the pass ------------------------------------------------------------------------ */

/* Mesh lock held: whether meshing can run (opening the file and the barrier the first
 * time), and the mapping budget. */
static bool ready(void) {
  if (disabled) return false;
  if (_keel_page_size > KEEL_MESH_MAX_PAGE || _keel_options.check) goto refuse;
  if (barrier_fd < 0) {
    barrier_fd = _keel_prim_barrier_open(&barrier_mode);
    file_fd = _keel_prim_file_create((uint64_t)GROUPS_MAX * _keel_page_size);
    barrier_id = _keel_prim_fd_identity(barrier_fd);
    file_id = _keel_prim_fd_identity(file_fd);
    if (barrier_fd < 0 || file_fd < 0) goto refuse;
  }
  /* A program that closes descriptors it does not know may get these numbers back for
   * files of its own: then meshing stops rather than write into them. */
  if (_keel_prim_fd_identity(file_fd) != file_id || _keel_prim_fd_identity(barrier_fd) != barrier_id) {
    _keel_warn("meshing stops: its descriptors were closed by the program", "");
    disabled = true;
    file_fd = barrier_fd = -1;
    return false;
  }
  int policy = keel_opt(mesh);
  if (barrier_mode != KEEL_BARRIER_KERNEL && !(policy == KEEL_MESH_USER && barrier_mode == KEEL_BARRIER_USER)) {
    if (!warned)
      _keel_warn("KEEL_MESH=on needs userfaultfd for all writes (root, CAP_SYS_PTRACE, access to "
                 "/dev/userfaultfd, or vm.unprivileged_userfaultfd=1); meshing stays off. "
                 "KEEL_MESH=user accepts EFAULT from system calls writing into blocks being meshed: ",
                 barrier_mode == KEEL_BARRIER_USER ? "user-mode barrier only" : "no barrier");
    warned = true;
    return false;
  }
  st.barrier = (uint32_t)barrier_mode;
  uint64_t now = __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  if (view_cap == 0 || now - budget_tick >= BUDGET_TICKS) {
    /* Each view is a mapping and may split its slab's mapping once more; meshing keeps
     * to a third of the kernel's limit, as Mesh does, so the program's own mmap never
     * fails because of it. */
    uint64_t limit = _keel_prim_map_limit(), count = _keel_prim_map_count();
    if (limit == 0) limit = 65530;
    uint64_t room = limit / 3 > count ? (limit / 3 - count) / 2 : 0;
    /* Under mlockall(MCL_FUTURE) (MariaDB's memlock) a new view is populated for
     * writing, i.e. copied at once: no new views while memory is locked. */
    if (_keel_prim_memory_locked()) room = 0;
    keel_lock(&table_lock);
    view_cap = st.views + room;
    st.view_limit = view_cap;
    keel_unlock(&table_lock);
    budget_tick = now;
  }
  return true;
refuse:
  disabled = true;
  _keel_prim_close(barrier_fd);
  _keel_prim_close(file_fd);
  file_fd = barrier_fd = -1;
  st.barrier = 0;
  return false;
}

/* Whether child c (and the children it forked) is gone: its pipe read end-of-file and
 * none of the pids it named still maps the memory file. A read end the program closed
 * and whose number it reuses is not read (nor closed): whether that child lives is
 * unknown, so the groups it may map keep their pages (lost_epoch), as do those of a child
 * that named too many pids. */
static bool child_gone(child_t* c) {
  if (c->fd >= 0) {
    if (_keel_prim_fd_identity(c->fd) != c->id) {
      c->npids = UINT32_MAX;
    } else {
      int32_t got[CHILD_PIDS];
      long n;
      while ((n = _keel_prim_pipe_read(c->fd, got, sizeof got)) > 0)
        for (long k = 0; k < n / (long)sizeof got[0]; k++, c->npids += c->npids != UINT32_MAX)
          if (c->npids < CHILD_PIDS) c->pids[c->npids] = got[k];
      if (n != 0) return false; /* a writer still holds it */
      _keel_prim_close(c->fd);
      c->fd = -1;
    }
  }
  if (c->npids > CHILD_PIDS) {
    if ((int64_t)c->epoch > lost_epoch) lost_epoch = c->epoch;
    return true;
  }
  for (uint32_t k = 0; k < c->npids; k++)
    if (_keel_prim_process_maps(c->pids[k], file_fd)) return false;
  return true;
}

static void reap_children(void) {
  for (unsigned i = 0; i < npipes;) {
    if (child_gone(&children[i])) children[i] = children[--npipes];
    else i++;
  }
}

/* Checks up to SWEEP_PER_TICK views for erosion and releases the file pages no view
 * reads any more. */
static void sweep(void) {
  size_t page = _keel_page_size;
  for (uint32_t n = 0; n < SWEEP_PER_TICK && groups_top > 0; n++) {
    uint32_t g = sweep_cursor++ % groups_top;
    keel_lock(&table_lock);
    mesh_group_t* gr = &groups[g];
    uintptr_t pages[KEEL_MESH_WAYS];
    memcpy(pages, gr->page, sizeof pages);
    uint8_t state = gr->state, eroded = gr->eroded;
    keel_unlock(&table_lock);
    if (state != G_SHARED) continue;
    uint8_t found = 0;
    for (unsigned m = 0; m < KEEL_MESH_WAYS; m++) {
      uint8_t vs;
      if (pages[m] && !(eroded >> m & 1) && _keel_prim_view_state((void*)pages[m], 1, &vs) &&
          vs == KEEL_VIEW_PRIVATE)
        found |= (uint8_t)(1u << m);
    }
    keel_lock(&table_lock);
    for (unsigned m = 0; m < KEEL_MESH_WAYS; m++) /* (a view that left meanwhile is not counted) */
      if ((found >> m & 1) && gr->page[m] == pages[m] && gr->state == G_SHARED) {
        gr->eroded |= (uint8_t)(1u << m);
        st.eroded++;
      }
    bool release = gr->state == G_SHARED && group_releasable(gr);
    if (release) {
      _keel_prim_file_release(file_fd, group_offset(g), page);
      st.released++;
      gr->state = G_PUNCHED;
      if (group_empty(gr)) group_free(g);
    }
    keel_unlock(&table_lock);
  }
}

typedef struct pass_s {
  uint64_t deadline_ns;
  size_t meshed;
  bool stop;
} pass_t;

static bool visit(void* ctx, unsigned cls, const uintptr_t* pages, unsigned n) {
  pass_t* p = (pass_t*)ctx;
  p->meshed += mesh_group(cls, pages, n);
  keel_lock(&table_lock);
  bool full = st.views + 2 > view_cap;
  keel_unlock(&table_lock);
  if (full || _keel_prim_clock_ns() > p->deadline_ns) p->stop = true;
  return !p->stop;
}

/* Worth a plan: the class's slabs hold 1 MiB more than a quarter over its blocks. */
static bool class_sparse(unsigned cls) {
  const keel_class_t* k = &_keel_classes[cls];
  keel_central_t* cl = keel_central_of(cls);
  uint64_t slab_bytes = __atomic_load_n(&cl->slabs, __ATOMIC_RELAXED) * ((uint64_t)k->units << KEEL_UNIT_SHIFT);
  uint64_t used = _keel_central_out(cl) * k->size;
  return slab_bytes > used + used / 4 + ((uint64_t)1 << 20);
}

static size_t pass(uint64_t budget_ns, bool every_class) {
  if (!ready()) return 0;
  reap_children();
  sweep();
  /* Never split huge pages: under ALWAYS every one, under DENSE the collapsed ones. */
  if (_keel_thp_purge_granule() > _keel_page_size ||
      keel_opt(thp) == KEEL_THP_DENSE)
    return 0;
  keel_lock(&table_lock);
  bool full = st.views + 2 > view_cap; /* (the sweep may have made room) */
  keel_unlock(&table_lock);
  if (full) return 0;
  pass_t p = {_keel_prim_clock_ns() + budget_ns, 0, false};
  uint64_t now = __atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  /* A class whose last plan ran out of time goes first, and again on the next tick;
   * the others are planned at most once a second (planning reads every partly used
   * slab's bitmap: wasted work when little changed). */
  unsigned first = resume_class;
  resume_class = 0;
  for (unsigned i = 0; i < KEEL_NUM_CLASSES && !p.stop; i++) {
    unsigned cls = i == 0 ? first : i;
    if (cls == 0 || (i > 0 && cls == first)) continue;
    if (_keel_classes[cls].size > KEEL_MESH_MAX_BLOCK) break;
    if (!class_sparse(cls)) continue;
    if (!every_class && cls != first && last_plan[cls] && now - last_plan[cls] < 4) continue;
    if (class_busy(cls, now) && !every_class) continue;
    last_plan[cls] = now;
    _keel_mesh_plan(cls, visit, &p);
    seen_locks[cls] = class_locks(cls); /* the plan's own lock use is not the program's */
    if (p.stop) resume_class = cls;
  }
  return p.meshed;
}

KEEL_HOT void _keel_mesh_tick(void) {
  if (keel_opt(mesh) == KEEL_MESH_OFF || disabled) return;
  keel_lock(&mesh_lock);
  pass(resume_class ? CATCH_UP_BUDGET_NS : PASS_BUDGET_NS, false);
  keel_unlock(&mesh_lock);
}

KEEL_API size_t keel_mesh_now(void) {
  keel_ensure_init();
  if (keel_opt(mesh) == KEEL_MESH_OFF) return 0;
  keel_lock(&mesh_lock);
  size_t n = pass(UINT64_MAX / 2, true);
  keel_unlock(&mesh_lock);
  return n;
}

KEEL_API void keel_mesh_stats(keel_mesh_stats_t* out) {
  if (out == NULL) return;
  keel_ensure_init();
  keel_lock(&table_lock);
  *out = st;
  keel_unlock(&table_lock);
  out->state = in_child ? KEEL_MESH_STATE_CHILD
               : disabled ? KEEL_MESH_STATE_REFUSED
               : keel_opt(mesh) == KEEL_MESH_OFF ? KEEL_MESH_STATE_OFF
                                                 : KEEL_MESH_STATE_ON;
  int fd = file_fd;
  out->file_bytes = fd >= 0 ? _keel_prim_file_resident(fd) : 0;
}

/* ---- invariants (verify.c, central locks held) ---------------------------------------- */

#define VERIFY(cond) ((cond) ? (void)0 : _keel_fatal_internal(__FILE__, __LINE__, "invariant: " #cond))

void _keel_mesh_verify(void) {
  keel_lock(&table_lock);
  uint64_t views = 0, live_groups = 0;
  for (size_t i = 0; i < view_slots; i++) {
    uintptr_t p = view_keys[i];
    if (p == 0) continue;
    views++;
    uint32_t v = view_vals[i], g = v >> MEMBER_BITS;
    VERIFY(g < groups_top && groups[g].page[v & ((1u << MEMBER_BITS) - 1)] == p && groups[g].state != G_FREE);
    /* A view is a page of a live slab of a meshable class that knows it has views. */
    unsigned cls = keel_pagemap_get((void*)p);
    VERIFY(cls >= 1 && cls < KEEL_NUM_CLASSES && _keel_classes[cls].size <= KEEL_MESH_MAX_BLOCK);
    keel_slab_t* s = keel_span_head(keel_chunk_of((void*)p), keel_unit_index((void*)p));
    VERIFY(s->state == KEEL_UNIT_SLAB && s->cls == cls && s->meshed);
  }
  for (uint32_t g = 0; g < groups_top; g++) {
    if (groups[g].state == G_FREE) continue;
    live_groups++;
    for (unsigned m = 0; m < KEEL_MESH_WAYS; m++)
      if (groups[g].page[m]) VERIFY(view_find(groups[g].page[m]) != SIZE_MAX);
  }
  VERIFY(views == st.views && live_groups == st.groups);
  keel_unlock(&table_lock);
}

/* ---- fork ---------------------------------------------------------------------------- */

/* Before fork, with no operation in flight: a child maps every view as it is now, so
 * while it lives no file page of a group made so far is released. A pipe tells when it
 * is gone: the child (and its own children) hold the write end until they exit or
 * exec. Groups made after the fork are not the child's and go on as usual. */
/* The fork handlers (every forking process) run these: libkeel's first code window. */
KEEL_HOT void _keel_mesh_lock_all(void) {
  keel_lock(&mesh_lock);
  new_pipe[0] = new_pipe[1] = -1;
  if (st.groups == 0 || in_child) return;
  if (!_keel_prim_pipe(new_pipe)) lost_epoch = epoch;
  epoch++;
}

KEEL_HOT void _keel_mesh_unlock_all(void) {
  if (new_pipe[1] >= 0) {
    _keel_prim_close(new_pipe[1]);
    if (npipes < PIPES_MAX) {
      children[npipes++] = (child_t){new_pipe[0], epoch - 1, _keel_prim_fd_identity(new_pipe[0]), 0, {0}};
    } else { /* too many children at once: the groups made so far keep their pages */
      _keel_prim_close(new_pipe[0]);
      lost_epoch = epoch - 1;
    }
  }
  keel_unlock(&mesh_lock);
}

KEEL_HOT void _keel_mesh_table_lock(void) { keel_lock(&table_lock); }
KEEL_HOT void _keel_mesh_table_unlock(void) { keel_unlock(&table_lock); }

/* The child's part that only a process that meshed (or its child) has: its pid on the
 * pipe of the process that meshes, and the inherited descriptors closed - only those
 * still Keel's: a program that closed them may have reused the numbers for its files. */
static KEEL_COLD void child_descriptors(bool forked_by_mesher) {
  if (forked_by_mesher) {
    parent_pipe = new_pipe[1];
    parent_pipe_id = parent_pipe >= 0 ? _keel_prim_fd_identity(parent_pipe) : 0;
  }
  /* (a child's children inherit the write end, and name themselves too) */
  if (parent_pipe >= 0 && _keel_prim_fd_identity(parent_pipe) == parent_pipe_id)
    _keel_prim_pipe_write_pid(parent_pipe);
  if (npipes != 0) { /* its page is written only by a process that meshed */
    for (unsigned i = 0; i < npipes; i++)
      if (children[i].fd >= 0 && _keel_prim_fd_identity(children[i].fd) == children[i].id)
        _keel_prim_close(children[i].fd);
    npipes = 0;
  }
  if (new_pipe[0] >= 0) _keel_prim_close(new_pipe[0]);
  if (file_fd >= 0 && _keel_prim_fd_identity(file_fd) == file_id) _keel_prim_close(file_fd);
  if (barrier_fd >= 0 && _keel_prim_fd_identity(barrier_fd) == barrier_id) _keel_prim_close(barrier_fd);
  file_fd = barrier_fd = -1;
}

/* The child keeps the write end (its parent waits for it) and leaves the views it
 * inherited to the kernel's copy-on-write; it never meshes: its parent owns the file. */
KEEL_HOT void _keel_mesh_after_fork_child(void) {
  keel_lock_reset(&mesh_lock);
  keel_lock_reset(&table_lock);
  bool forked_by_mesher = !in_child;
  in_child = true;
  disabled = true;
  if (npipes != 0 || new_pipe[0] >= 0 || parent_pipe >= 0 || file_fd >= 0 || barrier_fd >= 0)
    child_descriptors(forked_by_mesher);
}
