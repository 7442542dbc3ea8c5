/* transfer.c -- the transfer caches: whole batches of free blocks parked between the
 * thread caches and the slabs, handed from the thread that freed them to the thread that
 * next needs them without a lock.
 *
 * Each class has a row of slots on each of up to KEEL_TRANSFER_LINES cache lines. A slot
 * holds NULL or one batch (a NULL-terminated list; its low bit set for a half batch, the
 * next for one that carries its index, freelist.h): a
 * put is one compare-and-swap from NULL, a get one exchange to NULL, so neither can meet
 * an ABA problem and neither waits for another thread. A thread starts its search on the
 * line of the processor it runs on (rseq's cpu_id) and goes on round the others: threads
 * on different cores put and get on different lines, and meet only where one takes what
 * another left (a consumer's batches found by a producer), two threads on a line rather
 * than all of them on a class's lock. Until a process has a second thread cache (or a
 * second thread beside one, tcache.c), every batch stays on the first line, so a
 * single-threaded process (a PostgreSQL backend) writes one row of one page, whatever
 * the number of processors.
 *
 * The lines of all classes are one sparse array indexed by line, then by the class's
 * central slot (its place in activation order, central.c): a process writes the rows of
 * the lines its threads ran on, each as long as its classes in use. */
#include "core/internal.h"

#define LINE_SLOTS 7
typedef struct transfer_line_s {
  void* slot[LINE_SLOTS]; /* NULL, or a batch (low bits: a half batch, indexed) */
  uint32_t touched;       /* purger tick of the last put or get on this line */
  uint32_t pad;
} __attribute__((aligned(64))) transfer_line_t;
_Static_assert(sizeof(transfer_line_t) == 64, "a transfer line is one cache line");

static transfer_line_t lines[KEEL_TRANSFER_LINES][KEEL_NUM_CLASSES] KEEL_SPARSE_BSS __attribute__((aligned(4096)));
static unsigned line_count = 1; /* power of two: 1, then 8..16 once the process spreads */
static unsigned cpu_count;      /* processors (or KEEL_CPUS) when it spread, at most its lines */
static bool spread;             /* a second thread cache exists: use every line */

/* Few processors: the lines a class puts to and gets from, four unless it is wide: a
 * class of blocks of 128 bytes or less whose slabs' lock is busy (central.h) while more
 * thread caches than four live - many threads trading small blocks, each batch a lock
 * round trip once four lines are full. It stays wide, so that its batches on the other
 * lines are found. The others keep four: more room holds more free memory, and every
 * empty class's refill would read eight lines (design.md, "Scaling past two cores"). */
#define FEW_CORES_LINES 4u
#define WIDE_MAX 128u
static uint64_t wide[KEEL_NUM_CLASSES / 64];

static KEEL_NOINLINE unsigned class_lines(unsigned cls, unsigned used) {
  if (used <= FEW_CORES_LINES || keel_many_cores()) return used;
  uint64_t bit = (uint64_t)1 << (cls % 64);
  if (__atomic_load_n(&wide[cls / 64], __ATOMIC_RELAXED) & bit) return used;
  if (_keel_classes[cls].size > WIDE_MAX || __atomic_load_n(&_keel_live_caches, __ATOMIC_RELAXED) <= FEW_CORES_LINES ||
      !_keel_central_busy(cls))
    return FEW_CORES_LINES;
  __atomic_or_fetch(&wide[cls / 64], bit, __ATOMIC_RELAXED);
  return used;
}

bool _keel_many_cores; /* transfer.h */

/* A line per processor (or per KEEL_CPUS), at least four: past its own line a thread
 * overflows onto the others, so on two cores the lines no core starts on are room for
 * the bursts of a class many threads trade in. Where that makes four (four processors
 * or fewer), eight lines, of which a class uses four until it is wide (above). Counted
 * when a second thread cache appears, or a second thread beside one (the registry lock
 * held), so a single-threaded process makes no system call for it; published before
 * `spread`, which readers load first. */
void _keel_transfer_spread(void) {
  if (__atomic_load_n(&spread, __ATOMIC_ACQUIRE)) return;
  uint64_t asked = keel_opt(cpus);
  unsigned cpus = asked == 0                    ? _keel_prim_cpu_count()
                  : asked < KEEL_TRANSFER_LINES ? (unsigned)asked
                                                : KEEL_TRANSFER_LINES;
  unsigned n = FEW_CORES_LINES;
  while (n < cpus && n < KEEL_TRANSFER_LINES) n *= 2;
  bool many = n >= KEEL_MANY_CORES_LINES;
  unsigned lines = many ? n : KEEL_MANY_CORES_LINES;
  __atomic_store_n(&cpu_count, cpus < lines ? cpus : lines, __ATOMIC_RELAXED);
  __atomic_store_n(&line_count, lines, __ATOMIC_RELAXED);
  __atomic_store_n(&_keel_many_cores, many, __ATOMIC_RELAXED);
  __atomic_store_n(&spread, true, __ATOMIC_RELEASE);
}

unsigned _keel_transfer_lines(void) {
  return __atomic_load_n(&spread, __ATOMIC_ACQUIRE) ? __atomic_load_n(&line_count, __ATOMIC_RELAXED) : 1;
}

bool _keel_transfer_apart(void) {
  /* caches in use, not spares kept for the next thread; a thread without a cache (a
   * young one) is another thread beside any cache */
  uint64_t live = __atomic_load_n(&_keel_caches_in_use, __ATOMIC_RELAXED);
  return live + (__atomic_load_n(&_keel_thread.own, __ATOMIC_RELAXED) == NULL) >= 2 &&
         __atomic_load_n(&spread, __ATOMIC_ACQUIRE) && live <= __atomic_load_n(&cpu_count, __ATOMIC_RELAXED);
}

bool _keel_transfer_own_lines(void) { return keel_opt(own_lines) && _keel_transfer_apart(); }

/* Lines that may hold batches (the walks of the purger, statistics and tests). */
static inline unsigned lines_filled(void) { return __atomic_load_n(&line_count, __ATOMIC_RELAXED); }

/* Batches (whole or half) one line of class k holds when `used` lines are in use: the
 * class's transfer_max while one thread cache uses the one line, as a lock-guarded cache
 * held; all seven slots once threads trade blocks (capped at transfer_max, the classes
 * of 1-8 KiB, two batches each, went back to the slabs' locks far more often). */
static inline unsigned line_cap(const keel_class_t* k, unsigned used) {
  unsigned cap = used == 1 ? k->transfer_max : LINE_SLOTS;
  return cap < LINE_SLOTS ? cap : LINE_SLOTS;
}

static inline transfer_line_t* line_of(unsigned line, unsigned cls) {
  return &lines[line][__atomic_load_n(&_keel_central_slot[cls], __ATOMIC_ACQUIRE)];
}

/* Lines are numbered from the processor the first thread cache was made on: before the
 * process spread, every slab and batch was line 0's, and they are that thread's. */
static unsigned line_base;
void _keel_transfer_first_cache(void) { __atomic_store_n(&line_base, _keel_prim_current_cpu(), __ATOMIC_RELAXED); }

static inline unsigned home_line(unsigned used) {
  return used == 1 ? 0 : (_keel_prim_current_cpu() - __atomic_load_n(&line_base, __ATOMIC_RELAXED)) & (used - 1);
}

unsigned _keel_transfer_home(void) { return home_line(_keel_transfer_lines()); }

static inline void stamp(transfer_line_t* l) {
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  if (__atomic_load_n(&l->touched, __ATOMIC_RELAXED) != now) __atomic_store_n(&l->touched, now, __ATOMIC_RELAXED);
}

_Static_assert(offsetof(transfer_line_t, slot) == 0, "a slot's line is its address rounded down to 64");

void** _keel_transfer_room(unsigned cls) {
  const keel_class_t* k = &_keel_classes[cls];
  unsigned used = class_lines(cls, _keel_transfer_lines()), cap = line_cap(k, used), home = home_line(used);
  /* On many cores, while the thread caches fit the lines (each thread likely alone on
   * its processor: where this was measured), a batch that does not fit on the thread's
   * own line goes to its slabs (its line's, central.c), not to another core. Threads
   * that outnumber the lines share them, and the other lines are the room for bursts,
   * as on few cores. With own lines (transfer.h), on any machine while threads are
   * apart: then no thread parks a batch on another's line, where that thread would take
   * it. */
  bool own_line = (keel_many_cores() && __atomic_load_n(&_keel_live_caches, __ATOMIC_RELAXED) <= used) ||
                  _keel_transfer_own_lines();
  unsigned tries = own_line ? 1 : used;
  for (unsigned i = 0; i < tries; i++) {
    transfer_line_t* l = line_of((home + i) & (used - 1), cls);
    for (unsigned s = 0; s < cap; s++)
      if (__atomic_load_n(&l->slot[s], __ATOMIC_RELAXED) == NULL) return &l->slot[s];
  }
  return NULL;
}

/* Parks entry in slot, if it is still empty. */
static bool park_at(void** slot, void* entry) {
  void* expected = NULL;
  /* release: the getter sees the links written into the batch's blocks */
  if (!__atomic_compare_exchange_n(slot, &expected, entry, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) return false;
  /* the slot's line: slots are 8-byte words of a 64-byte line */
  stamp((transfer_line_t*)((uintptr_t)slot & ~(uintptr_t)63));
  return true;
}

/* An entry's low bits (lists are 16-byte aligned): a half batch, one that carries its
 * index, and the home line of its first block's slab, modulo 4 (HOME_TAG). */
#define ENTRY_HALF 1u
#define ENTRY_INDEXED 2u
#define ENTRY_HOME_SHIFT 2u
#define ENTRY_BITS 15u
#define HOME_TAG(line) ((uintptr_t)((line) & 3u) << ENTRY_HOME_SHIFT)
static KEEL_NOINLINE void* entry_of(void* list, bool half, bool indexed) {
  unsigned home = __atomic_load_n(&keel_span_of(list)->home, __ATOMIC_RELAXED);
  return (void*)((uintptr_t)list | (half ? ENTRY_HALF : 0u) | (indexed ? ENTRY_INDEXED : 0u) | HOME_TAG(home));
}

static bool put(unsigned cls, void* entry) {
  for (void** slot; (slot = _keel_transfer_room(cls)) != NULL;)
    if (park_at(slot, entry)) return true;
  return false;
}

bool _keel_transfer_put(unsigned cls, void* list, bool half) {
  keel_assert(_keel_central_active(cls) && ((uintptr_t)list & 15) == 0);
  return put(cls, entry_of(list, half, false));
}

bool _keel_transfer_put_at(void** slot, unsigned cls, void* list, bool half, bool indexed) {
  keel_assert(_keel_central_active(cls) && ((uintptr_t)list & 15) == 0);
  void* e = entry_of(list, half, indexed);
  return park_at(slot, e) || put(cls, e);
}

static inline void* entry_list(void* e, const keel_class_t* k, uint32_t* n) {
  *n = ((uintptr_t)e & ENTRY_HALF) ? k->batch / 2u : k->batch;
  return (void*)((uintptr_t)e & ~(uintptr_t)ENTRY_BITS);
}

void* _keel_transfer_get(unsigned cls, uint32_t* n, bool* indexed) {
  const keel_class_t* k = &_keel_classes[cls];
  unsigned used = class_lines(cls, _keel_transfer_lines()), home = home_line(used);
  /* Apart (transfer.h): another line's batch only if its blocks' slabs are this
   * processor's. Blocks of another thread's slabs share cache lines with blocks it
   * still uses, and two cores writing one line cost a fifth of glibc's
   * bench-malloc-thread at two threads (design.md, "Threads apart"). The own line is
   * not filtered: filtering it too took mpmcmix at 2 threads from 0.09 to 3.2 lock
   * trips per 1,000 pairs. `home` is the slabs' home line modulo 4 (both count from
   * line_base and use at least four lines once spread). */
  uintptr_t mine = _keel_transfer_apart() ? HOME_TAG(home) : ~(uintptr_t)0;
  /* The slots a put may fill: a line's cap, or all of them on lines filled before the
   * process spread (line 0 with the one-line cap) - cheap to look at, never missed. */
  for (unsigned i = 0; i < used; i++) {
    transfer_line_t* l = line_of((home + i) & (used - 1), cls);
    for (unsigned s = 0; s < LINE_SLOTS; s++) {
      void* seen = __atomic_load_n(&l->slot[s], __ATOMIC_RELAXED);
      if (seen == NULL || (i > 0 && mine != ~(uintptr_t)0 && ((uintptr_t)seen & HOME_TAG(3u)) != mine)) continue;
      void* e = __atomic_exchange_n(&l->slot[s], NULL, __ATOMIC_ACQUIRE);
      if (e != NULL) {
        stamp(l);
        *indexed = ((uintptr_t)e & ENTRY_INDEXED) != 0;
        return entry_list(e, k, n);
      }
    }
  }
  return NULL;
}

bool _keel_transfer_line_idle(unsigned cls, unsigned line) {
  uint32_t now = (uint32_t)__atomic_load_n(&_keel_ticks, __ATOMIC_RELAXED);
  /* the class's transfer line of that processor: a class may use fewer lines than the
   * slabs do (four of eight on few cores); no side effect while threads are apart */
  unsigned used = class_lines(cls, _keel_transfer_lines());
  return now - __atomic_load_n(&line_of(line & (used - 1), cls)->touched, __ATOMIC_RELAXED) >= 2;
}

bool _keel_transfer_any(unsigned cls) {
  unsigned used = _keel_transfer_lines();
  for (unsigned i = 0; i < used; i++) {
    const transfer_line_t* l = line_of(i, cls);
    for (unsigned s = 0; s < LINE_SLOTS; s++)
      if (__atomic_load_n(&l->slot[s], __ATOMIC_RELAXED) != NULL) return true;
  }
  return false;
}

void* _keel_transfer_take_idle(unsigned cls, uint32_t now, uint32_t idle_ticks, uint32_t* n) {
  const keel_class_t* k = &_keel_classes[cls];
  for (unsigned i = 0, lines = lines_filled(); i < lines; i++) {
    transfer_line_t* l = line_of(i, cls);
    if (now - __atomic_load_n(&l->touched, __ATOMIC_RELAXED) < idle_ticks) continue;
    for (unsigned s = 0; s < LINE_SLOTS; s++) {
      if (__atomic_load_n(&l->slot[s], __ATOMIC_RELAXED) == NULL) continue;
      void* e = __atomic_exchange_n(&l->slot[s], NULL, __ATOMIC_ACQUIRE);
      if (e != NULL) return entry_list(e, k, n);
    }
  }
  return NULL;
}

KEEL_COLD uint32_t _keel_transfer_blocks(unsigned cls) {
  const keel_class_t* k = &_keel_classes[cls];
  uint32_t blocks = 0;
  for (unsigned i = 0, lines = lines_filled(); i < lines; i++) {
    const transfer_line_t* l = line_of(i, cls);
    for (unsigned s = 0; s < LINE_SLOTS; s++) {
      void* e = __atomic_load_n(&l->slot[s], __ATOMIC_RELAXED);
      uint32_t n;
      if (e != NULL) entry_list(e, k, &n), blocks += n;
    }
  }
  return blocks;
}

KEEL_COLD void _keel_transfer_each(unsigned cls, void (*fn)(void* list, uint32_t n, void* ctx), void* ctx) {
  const keel_class_t* k = &_keel_classes[cls];
  for (unsigned i = 0, lines = lines_filled(); i < lines; i++) {
    transfer_line_t* l = line_of(i, cls);
    for (unsigned s = 0; s < LINE_SLOTS; s++) {
      void* e = __atomic_exchange_n(&l->slot[s], NULL, __ATOMIC_ACQUIRE);
      if (e == NULL) continue;
      uint32_t n;
      void* list = entry_list(e, k, &n);
      fn(list, n, ctx);
      if (!park_at(&l->slot[s], e) && !put(cls, e)) _keel_central_put_locked(cls, list);
    }
  }
}
