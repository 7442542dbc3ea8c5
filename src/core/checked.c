/* checked.c -- the checked mode (KEEL_CHECK=1): names every misuse where it is seen.
 *
 * Each block is allocated with 16 spare bytes. Its last word holds the requested size
 * (xor a secret, so a stray write there is noticed), and the bytes from the requested
 * size to that word are a canary checked on free: writes past the end are reported with
 * how far they went. Freed blocks are filled with a poison pattern, marked with a
 * secret, and held in a FIFO quarantine before they can be reused; a block leaving the
 * quarantine or handed out again is checked for writes after free. Freeing a block that
 * carries the poison mark is a double free. Interior and foreign pointers are refused.
 * With KEEL_CHECK_GUARD=N, blocks of N bytes or more get their own mapping whose end
 * touches inaccessible pages instead (see "guarded blocks" below): an access past the
 * end faults at once and the fault is reported.
 * Nothing is cached per thread, so this mode is much slower (see the README). */
#include "core/internal.h"

#define TAIL 16        /* spare bytes per block: canary (>= 8) + size word */
#define CANARY 0xCA
#define POISON 0xDF
#define QUARANTINE_SLOTS 4096
#define QUARANTINE_BYTES ((size_t)32 << 20)
/* Address space the quarantine may hold in guarded blocks: their memory goes back to the
 * OS when they are freed, only the reservation waits. */
#define QUARANTINE_SPAN ((size_t)1 << 30)
#define GUARD_STACK_DEPTH 24

static keel_lock_t q_lock KEEL_ALWAYS_BSS = KEEL_LOCK_INIT;
keel_lock_t* const _keel_lock_quarantine = &q_lock; /* statistics (stats.c) */
/* FIFO of freed blocks: a block's address (small, large or huge), or a guarded block's
 * descriptor with its low bit set. q_bytes counts the memory held (q_big_bytes of it in
 * large and huge blocks), q_span the guarded address space. */
static void* quarantine[QUARANTINE_SLOTS];
static size_t q_head, q_count, q_bytes, q_big_bytes, q_span;
/* Each entry's bytes, and whether it is a large or huge block, as it was queued: nothing
 * is looked up under the lock, a leaf (a huge block's size is the huge table's, behind a
 * lock the fork handlers take before this one). */
static size_t q_entry_bytes[QUARANTINE_SLOTS];
static bool q_entry_big[QUARANTINE_SLOTS];
static uintptr_t size_secret, poison_mark;

static void checked_init(void) {
  if (size_secret == 0) {
    size_secret = (uintptr_t)_keel_prim_random() | 1;
    poison_mark = (uintptr_t)_keel_prim_random() | 1;
  }
}

static void* enomem(void) {
  _keel_prim_set_errno(_keel_prim_errno_enomem());
  return NULL;
}

/* Reports a write after free at byte `offset` of freed block p. */
static _Noreturn void report_uaf(const char* call, void* p, size_t offset) {
  char detail[96];
  keel_buf_t b = {detail, 0, sizeof detail};
  _keel_buf_str(&b, ": byte ");
  _keel_buf_u64(&b, offset);
  _keel_buf_str(&b, " was written after the block was freed");
  _keel_misuse(call, "write after free in block", p, detail, 0);
}

/* Checks that freed block p (usable bytes) still holds only poison past word 1. Back in
 * its slab (in_slab), a page of it that is all zero, other than the one holding word 1
 * (which still holds the mark), is one a slab trim gave back. */
static void check_poison(const char* call, void* p, size_t usable, bool in_slab) {
  const unsigned char* c = (const unsigned char*)p;
  uintptr_t at = (uintptr_t)c, page = _keel_page_size, first = (at + sizeof(uintptr_t)) & ~(page - 1);
  for (size_t i = 2 * sizeof(uintptr_t); i < usable; i++) {
    if (c[i] == POISON) continue;
    uintptr_t lo = (at + i) & ~(page - 1);
    size_t end = lo + page - at < usable ? lo + page - at : usable;
    bool purged = in_slab && lo != first;
    for (size_t j = lo - at; purged && j < end; j++) purged = c[j] == 0;
    if (!purged) report_uaf(call, p, i);
    i = end - 1;
  }
}

void _keel_checked_slab_new(void* base, unsigned cls) {
  const keel_class_t* k = &_keel_classes[cls];
  for (uint32_t i = 0; i < k->count; i++) ((uintptr_t*)((char*)base + (size_t)i * k->size))[1] = 0;
}

static uintptr_t* size_word(void* p, size_t usable) {
  return (uintptr_t*)((char*)p + usable - sizeof(uintptr_t));
}

/* Usable bytes of the underlying block, or 0 if p is not a live block start. */
static size_t block_usable(void* p, uint8_t kind) {
  if (kind >= 1 && kind < KEEL_NUM_CLASSES) {
    bool exact;
    _keel_block_start(kind, p, &exact);
    return exact ? _keel_classes[kind].size : 0;
  }
  if (kind == KEEL_KIND_LARGE) return _keel_large_usable(p);
  if (kind == KEEL_KIND_HUGE) return _keel_huge_usable(p);
  return 0;
}

/* ---- guarded blocks (KEEL_CHECK_GUARD) -------------------------------------------------
 * A block of n >= KEEL_CHECK_GUARD bytes gets a mapping of its own, laid out so that its
 * end touches inaccessible pages (P: the page size, U: the 64 KiB unit):
 *
 *   map                  block             block+n   guard                   desc     end
 *    | lead (untouched)  | the n bytes       | slack | PROT_NONE pages       | 1 page |
 *    U-aligned (and aligned as asked)                U-aligned: map + round_up(n, U)
 *
 * The block starts at the highest address with the requested alignment that fits, so
 * the slack is less than the alignment (at most 15 bytes for malloc); it holds the
 * canary, checked on free as in every block. An overflow into the slack is found there,
 * one that reaches the guard faults on the spot: together they see every overflow. The
 * tail [guard, end) is round_up(3P, U) bytes: at least two pages of guard (a read a page
 * past the end still faults), then a descriptor page with the requested size (there is
 * no size word) and the stacks that allocated and freed the block.
 *
 * No registry of its own: the block is entered in huge.c's table (found, sized and
 * counted in the statistics like a huge block; freeing it leaves the FREED tag, so double
 * frees are seen as usual) and the guard's first unit is tagged KEEL_KIND_GUARD in the
 * page map. Those two units lie wholly inside the mapping (map and guard are U-aligned),
 * so no other block shares their page-map bytes. The fault handler finds the descriptor
 * from a fault address with page-map reads only (lock-free, async-signal-safe): the guard
 * tag is in the fault's unit or just before it, and a freed block's units are untagged
 * (FREED for its first) up to its guard.
 *
 * Freeing makes the block's pages inaccessible and gives them back to the OS; the mapping
 * then waits in the quarantine with the small blocks and is unmapped when it leaves.
 * Unmapping at once would be simpler, but Linux gives a freed range to the next mmap
 * straight away, so a stale pointer would silently reach the next block; held
 * inaccessible, the range stays Keel's, a use after free faults, and the report can name
 * the block and where it was freed. That costs address space (QUARANTINE_SPAN bounds it)
 * and a mapping or two per block, not memory. */
typedef struct guard_desc_s {
  uintptr_t seal;   /* the fields below xor a secret: stray writes are noticed */
  uintptr_t block;  /* what malloc returned */
  size_t size;      /* bytes requested */
  uintptr_t map;    /* the whole mapping */
  size_t map_bytes;
  uint32_t freed;   /* set before the block's pages are made inaccessible */
  uint32_t alloc_depth, free_depth;
  void* alloc_stack[GUARD_STACK_DEPTH];
  void* free_stack[GUARD_STACK_DEPTH];
} guard_desc_t;

static int guard_state; /* 0: not set up, 1: being set up, 2: done */
static uintptr_t self_lo, self_hi; /* Keel's own code: dropped from recorded stacks */

static size_t guard_tail(void) {
  return (3 * _keel_page_size + KEEL_UNIT_SIZE - 1) & ~(KEEL_UNIT_SIZE - 1);
}

static guard_desc_t* desc_at(uintptr_t guard) {
  return (guard_desc_t*)(guard + guard_tail() - _keel_page_size);
}

static uintptr_t guard_of_desc(const guard_desc_t* d) {
  return d->map + ((d->size + KEEL_UNIT_SIZE - 1) & ~(KEEL_UNIT_SIZE - 1));
}

static uintptr_t seal_of(const guard_desc_t* d) {
  return d->block ^ (d->size * 0x9E3779B97F4A7C15ull) ^ d->map ^ (d->map_bytes << 1) ^ size_secret;
}

/* True if d is the intact descriptor of the block whose guard starts at `guard`. */
static bool desc_ok(const guard_desc_t* d, uintptr_t guard) {
  return d->seal == seal_of(d) && guard_of_desc(d) == guard && d->block >= d->map &&
         d->block + d->size <= guard;
}

/* The descriptor of guarded block p (usable bytes, from huge.c's table), or NULL if p is
 * another kind of huge block. A guarded block's usable size runs up to its guard. */
static guard_desc_t* guarded(void* p, size_t usable) {
  uintptr_t guard = (uintptr_t)p + usable;
  if ((guard & (KEEL_UNIT_SIZE - 1)) != 0 || keel_pagemap_get((void*)guard) != KEEL_KIND_GUARD)
    return NULL;
  return desc_at(guard);
}

/* The calling thread is unwinding its stack: an allocation the unwinder makes (some
 * libgcc versions do, for registered frames) must not unwind again. */
static _Thread_local bool in_unwind;

static uint32_t record_stack(void** out) {
  if (in_unwind) return 0;
  in_unwind = true;
  void* raw[GUARD_STACK_DEPTH + 8];
  int got = _keel_prim_backtrace(raw, GUARD_STACK_DEPTH + 8, 1);
  in_unwind = false;
  int first = 0;
  if (__atomic_load_n(&guard_state, __ATOMIC_ACQUIRE) == 2)
    while (first < got && (uintptr_t)raw[first] >= self_lo && (uintptr_t)raw[first] < self_hi)
      first++;
  uint32_t n = 0;
  for (int i = first; i < got && n < GUARD_STACK_DEPTH; i++) out[n++] = raw[i];
  return n;
}

static void buf_count(keel_buf_t* b, uint64_t n, const char* what) {
  _keel_buf_u64(b, n);
  _keel_buf_str(b, n == 1 ? " byte " : " bytes ");
  _keel_buf_str(b, what);
}

static void write_stack(const char* title, void* const* stack, uint32_t depth) {
  if (depth == 0) return;
  if (depth > GUARD_STACK_DEPTH) depth = GUARD_STACK_DEPTH; /* the descriptor is writable */
  char line[512];
  keel_buf_t b = {line, 0, sizeof line};
  _keel_buf_str(&b, "keel:   ");
  _keel_buf_str(&b, title);
  for (uint32_t i = 0; i < depth; i++) {
    _keel_buf_str(&b, " ");
    _keel_buf_hex(&b, (uint64_t)(uintptr_t)stack[i]);
  }
  _keel_buf_str(&b, "\n");
  _keel_prim_write(2, line, b.len);
}

/* Signal context: formats on the stack and writes, nothing else. */
static _Noreturn void guard_report(const guard_desc_t* d, uintptr_t a) {
  bool freed = __atomic_load_n(&d->freed, __ATOMIC_ACQUIRE) != 0;
  uintptr_t start = d->block, end = d->block + d->size;
  char line[256];
  keel_buf_t b = {line, 0, sizeof line};
  _keel_buf_str(&b, freed ? "keel: use after free: access at " : "keel: heap overflow: access at ");
  _keel_buf_hex(&b, a);
  _keel_buf_str(&b, " is ");
  if (a >= end) {
    buf_count(&b, a - end + 1, "past the end of a ");
  } else if (a >= start) {
    _keel_buf_str(&b, "byte ");
    _keel_buf_u64(&b, a - start);
    _keel_buf_str(&b, " of a ");
  } else {
    buf_count(&b, start - a, "before a ");
  }
  if (freed) _keel_buf_str(&b, "freed ");
  _keel_buf_u64(&b, d->size);
  _keel_buf_str(&b, "-byte block at ");
  _keel_buf_hex(&b, start);
  _keel_buf_str(&b, "\n");
  _keel_prim_write(2, line, b.len);
  write_stack("allocated at:", d->alloc_stack, d->alloc_depth);
  if (freed) write_stack("freed at:", d->free_stack, d->free_depth);
  _keel_publish_exit();
  _keel_prim_abort();
}

/* The fault handler's question (signal context: page-map reads and the descriptor page
 * only, no lock): is `addr` in a guard, or in a guarded block that was freed? If so it
 * reports and ends the process; otherwise it returns. The descriptor page is mapped as
 * long as the guard tag is set (the tag goes before the unmap); a fault racing with the
 * block leaving the quarantine could make this read fault, which ends the process with
 * SIGSEGV (the signal is blocked in the handler), as it would have ended without Keel. */
static void guard_fault(void* addr) {
  uintptr_t a = (uintptr_t)addr, unit = KEEL_UNIT_SIZE;
  uintptr_t u = a & ~(unit - 1);
  size_t page = _keel_page_size, tail = guard_tail();
  /* In a guard: its first unit is this one or, with 64 KiB pages, the one before. */
  size_t back = (tail - page - 1) / unit;
  for (size_t k = 0; k <= back && k * unit <= u; k++) {
    uintptr_t g = u - k * unit;
    if (keel_pagemap_get((void*)g) != KEEL_KIND_GUARD) continue;
    guard_desc_t* d = desc_at(g);
    if (a >= g && a < g + tail - page && desc_ok(d, g)) guard_report(d, a);
    return;
  }
  /* In a freed block: its units up to the guard are untagged, or FREED for its first. A
   * slice of the map never written holds no Keel memory: the walk stops there. */
  for (uintptr_t g = u + unit; g > u; g += unit) {
    if (!_keel_pagemap_slice_used(g)) return;
    uint8_t tag = keel_pagemap_get((void*)g);
    if (tag == KEEL_KIND_GUARD) {
      guard_desc_t* d = desc_at(g);
      if (desc_ok(d, g) && __atomic_load_n(&d->freed, __ATOMIC_ACQUIRE) && a >= d->map)
        guard_report(d, a);
      return;
    }
    if (tag != KEEL_KIND_NONE && tag != KEEL_KIND_FREED) return;
  }
}

/* Once, before the first guarded block is handed out: Keel's code range (to drop its
 * frames from stacks) and the fault handler (if the program has none of its own now). */
static void guard_setup(void) {
  if (__atomic_load_n(&guard_state, __ATOMIC_ACQUIRE) == 2) return;
  int expected = 0;
  if (!__atomic_compare_exchange_n(&guard_state, &expected, 1, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return; /* another thread is at it */
  _keel_prim_code_range((const void*)&_keel_checked_alloc, &self_lo, &self_hi);
  _keel_prim_fault_handler_install(guard_fault);
  __atomic_store_n(&guard_state, 2, __ATOMIC_RELEASE);
}

static void* guarded_alloc(size_t n, size_t align, bool zero) {
  guard_setup();
  const size_t unit = KEEL_UNIT_SIZE, page = _keel_page_size, tail = guard_tail();
  if (align < 16) align = 16;
  size_t body = (n + unit - 1) & ~(unit - 1); /* n <= KEEL_MAX_ALLOC: no overflow */
  size_t bytes = body + tail;
  size_t map_align = align > unit ? align : unit;
  char* map = (char*)_keel_prim_map(bytes, map_align, NULL);
  if (map == NULL) { /* give back what is retained, then try once more */
    _keel_pageheap_purge(true);
    _keel_huge_purge(true);
    map = (char*)_keel_prim_map(bytes, map_align, NULL);
    if (map == NULL) return enomem();
  }
  char* guard = map + body;
  char* p = map + ((body - n) & ~(align - 1)); /* map is aligned to `align` */
  guard_desc_t* d = desc_at((uintptr_t)guard);
  d->block = (uintptr_t)p;
  d->size = n;
  d->map = (uintptr_t)map;
  d->map_bytes = bytes;
  d->seal = seal_of(d);
  d->alloc_depth = record_stack(d->alloc_stack);
  /* Every unit untagged first: an earlier occupant of the range may have left tags. The
   * descriptor is complete before the guard tag makes it visible to the handler. */
  if (!_keel_prim_protect(guard, tail - page, false) ||
      !_keel_pagemap_set((uintptr_t)map, bytes / unit, KEEL_KIND_NONE) ||
      !_keel_pagemap_set((uintptr_t)guard, 1, KEEL_KIND_GUARD) ||
      !_keel_huge_adopt(p, (size_t)(guard - p))) {
    _keel_pagemap_set((uintptr_t)guard, 1, KEEL_KIND_NONE);
    _keel_prim_unmap(map, bytes);
    return enomem();
  }
  memset(p + n, CANARY, (size_t)(guard - p) - n);
  if (!zero) memset(p, 0xAA, n < 64 ? n : 64); /* fresh pages are zero: calloc needs nothing */
  if (KEEL_UNLIKELY(_keel_profiling)) _keel_profile_sample_big(p, n);
  return p;
}

/* A guarded block leaves the quarantine (or could not be protected): unmapped. Its first
 * unit stays FREED, as a freed huge block's does; the guard tag goes first, so no later
 * mapping of the range looks guarded. */
static void guarded_unmap(guard_desc_t* d) {
  uintptr_t map = d->map, guard = guard_of_desc(d);
  size_t bytes = d->map_bytes;
  _keel_pagemap_set(guard, 1, KEEL_KIND_NONE);
  _keel_prim_unmap((void*)map, bytes);
}

/* ---- the quarantine ------------------------------------------------------------------- */

static bool is_guarded_entry(void* e) { return ((uintptr_t)e & 1) != 0; }
static guard_desc_t* entry_desc(void* e) { return (guard_desc_t*)((uintptr_t)e & ~(uintptr_t)1); }

/* A big block (large or huge, not guarded) is poisoned on its first page and its last
 * byte only: its free would otherwise write, and its leaving the quarantine read, every
 * page of it. */
static size_t poisoned_bytes(size_t usable) { return usable < _keel_page_size ? usable : _keel_page_size; }
static size_t entry_span(void* e) { return is_guarded_entry(e) ? entry_desc(e)->map_bytes : 0; }

static void release(void* p) {
  uint8_t kind = keel_pagemap_get(p);
  keel_link_set(p, NULL);
  _keel_central_give(kind, p, 1); /* to its slab: the bitmap catches anything left */
}

static void leave_quarantine(void* e, const char* call) {
  if (is_guarded_entry(e)) {
    guarded_unmap(entry_desc(e)); /* inaccessible all along: nothing to check */
    return;
  }
  uint8_t kind = keel_pagemap_get(e);
  size_t usable = block_usable(e, kind);
  if (kind < KEEL_NUM_CLASSES) {
    check_poison(call, e, usable, false);
    release(e);
    return;
  }
  check_poison(call, e, poisoned_bytes(usable), false);
  if (((unsigned char*)e)[usable - 1] != POISON) report_uaf(call, e, usable - 1);
  if (kind == KEEL_KIND_LARGE) _keel_large_free(e, call);
  else _keel_huge_free(e);
}

/* Queues entry e (holding `bytes` of memory and `span` of guarded address space),
 * evicting the oldest entries first while it would not fit. */
static void quarantine_put(void* e, size_t bytes, size_t span, const char* call) {
  uint8_t kind = is_guarded_entry(e) ? 0 : keel_pagemap_get(e);
  bool big = kind == KEEL_KIND_LARGE || kind == KEEL_KIND_HUGE;
  for (;;) {
    void* evicted = NULL;
    keel_lock(&q_lock);
    if (q_count > 0 && (q_count == QUARANTINE_SLOTS || q_bytes + bytes > QUARANTINE_BYTES ||
                        q_span + span > QUARANTINE_SPAN)) {
      evicted = quarantine[q_head];
      quarantine[q_head] = NULL;
      q_bytes -= q_entry_bytes[q_head];
      if (q_entry_big[q_head]) q_big_bytes -= q_entry_bytes[q_head];
      q_head = (q_head + 1) % QUARANTINE_SLOTS;
      q_count--;
      q_span -= entry_span(evicted);
    } else {
      size_t slot = (q_head + q_count) % QUARANTINE_SLOTS;
      quarantine[slot] = e;
      q_entry_bytes[slot] = bytes;
      q_entry_big[slot] = big;
      q_count++;
      q_bytes += bytes;
      if (big) q_big_bytes += bytes;
      q_span += span;
    }
    keel_unlock(&q_lock);
    if (evicted == NULL) return;
    leave_quarantine(evicted, call);
  }
}

/* ---- the entry points ----------------------------------------------------------------- */

void* _keel_checked_alloc(size_t n, size_t align, bool zero) {
  checked_init();
  if (n > KEEL_MAX_ALLOC - TAIL) return enomem();
  uint64_t guard_min = keel_opt(check_guard);
  if (guard_min != 0 && n >= guard_min) return guarded_alloc(n, align, zero);
  char* p = (char*)_keel_alloc_any(n + TAIL, align, false, false);
  if (p == NULL) return NULL;
  uint8_t kind = keel_pagemap_get(p);
  size_t usable = block_usable(p, kind);
  /* A small block handed out again must still be poisoned since it left the quarantine
   * (word 0 excepted: the slabs' lists thread their links through it). Not once meshing
   * has run: a free block of a meshed page shows its partner page's bytes. */
  if (kind < KEEL_NUM_CLASSES && ((uintptr_t*)p)[1] == poison_mark &&
      __atomic_load_n(&_keel_central_unmesh, __ATOMIC_RELAXED) == NULL)
    check_poison("malloc", p, usable, true);
  ((uintptr_t*)p)[1] = 0;
  if (zero) memset(p, 0, n);
  else memset(p, 0xAA, n < 64 ? n : 64); /* never hand out the poison mark as data */
  memset(p + n, CANARY, usable - sizeof(uintptr_t) - n);
  *size_word(p, usable) = (uintptr_t)n ^ size_secret;
  /* Not through a bin, so no countdown sampled it: the byte countdown does, by the size
   * asked (the checked free forgets it as any free does). */
  if (KEEL_UNLIKELY(_keel_profiling) && kind < KEEL_NUM_CLASSES) _keel_profile_sample_big(p, n);
  return p;
}

/* The requested size of live block p, after checking its size (the size word, or a
 * guarded block's descriptor) and its canary. Sets *guard to a guarded block's
 * descriptor, NULL for any other block. */
static size_t check_block(void* p, const char* call, uint8_t kind, guard_desc_t** guard) {
  size_t usable = block_usable(p, kind);
  if (usable == 0) {
    if (kind == KEEL_KIND_FREED) _keel_misuse(call, "double free of pointer", p, NULL, 0);
    _keel_misuse(call, "invalid pointer", p, ": not the start of a block allocated by keel", 0);
  }
  guard_desc_t* d = kind == KEEL_KIND_HUGE ? guarded(p, usable) : NULL;
  if (d == NULL && ((uintptr_t*)p)[1] == poison_mark && ((unsigned char*)p)[usable - 1] == POISON)
    _keel_misuse(call, "double free of pointer", p, NULL, 0); /* in the quarantine */
  size_t n, canary_end;
  if (d != NULL) {
    if (!desc_ok(d, (uintptr_t)p + usable) || d->block != (uintptr_t)p)
      _keel_misuse(call, "heap corruption: the guard page descriptor was overwritten for block", p,
                   NULL, 0);
    n = d->size;
    canary_end = usable;
  } else {
    n = *size_word(p, usable) ^ size_secret;
    if (n > usable - TAIL)
      _keel_misuse(call, "heap buffer overflow: the size word was overwritten in block", p, NULL,
                   usable - TAIL);
    canary_end = usable - sizeof(uintptr_t);
  }
  unsigned char* c = (unsigned char*)p;
  for (size_t i = n; i < canary_end; i++)
    if (c[i] != CANARY) {
      char detail[96];
      keel_buf_t b = {detail, 0, sizeof detail};
      _keel_buf_str(&b, ": written ");
      _keel_buf_u64(&b, i - n + 1);
      _keel_buf_str(&b, " or more bytes past its end");
      _keel_misuse(call, "heap buffer overflow in block", p, detail, n);
    }
  *guard = d;
  return n;
}

void _keel_checked_wrong_size(const char* call, const void* p, size_t size, size_t asked) {
  char detail[96];
  keel_buf_t b = {detail, 0, sizeof detail};
  _keel_buf_str(&b, ": size ");
  _keel_buf_u64(&b, size);
  _keel_buf_str(&b, " passed for a block allocated with ");
  _keel_buf_u64(&b, asked);
  _keel_misuse(call, "wrong size for pointer", p, detail, 0);
}

size_t _keel_checked_usable(const void* p, const char* call) {
  guard_desc_t* d;
  return check_block((void*)p, call, keel_pagemap_get(p), &d);
}

static void guarded_free(void* p, guard_desc_t* d, const char* call) {
  /* Two threads freeing p at once both pass check_block; only one disowns it. */
  if (_keel_huge_disown(p) == 0) _keel_misuse(call, "double free of pointer", p, NULL, 0);
  if (KEEL_UNLIKELY(_keel_profiling)) _keel_profile_forget(p);
  d->free_depth = record_stack(d->free_stack);
  __atomic_store_n(&d->freed, 1, __ATOMIC_RELEASE);
  size_t body = guard_of_desc(d) - d->map;
  if (!_keel_prim_protect((void*)d->map, body, false)) { /* the OS refused: no quarantine */
    guarded_unmap(d);
    return;
  }
  _keel_prim_purge((void*)d->map, body);
  quarantine_put((void*)((uintptr_t)d | 1), 0, d->map_bytes, call);
}

void _keel_checked_free(void* p, const char* call) {
  checked_init();
  uint8_t kind = keel_pagemap_get(p);
  guard_desc_t* d;
  check_block(p, call, kind, &d);
  if (d != NULL) {
    guarded_free(p, d, call);
    return;
  }
  size_t usable = block_usable(p, kind);
  /* Sampled for the heap profile: by _keel_alloc_any's big tiers, or above. */
  if (KEEL_UNLIKELY(_keel_profiling)) _keel_profile_forget(p);
  if (kind == KEEL_KIND_LARGE || kind == KEEL_KIND_HUGE) {
    memset(p, POISON, poisoned_bytes(usable));
    ((unsigned char*)p)[usable - 1] = POISON;
  } else {
    memset(p, POISON, usable);
  }
  ((uintptr_t*)p)[1] = poison_mark;
  quarantine_put(p, usable, 0, call);
}

void* _keel_checked_realloc(void* p, size_t n) {
  guard_desc_t* d;
  size_t old = check_block(p, "realloc", keel_pagemap_get(p), &d);
  void* q = _keel_checked_alloc(n, 0, false);
  if (q == NULL) return NULL;
  memcpy(q, p, old < n ? old : n);
  _keel_checked_free(p, "realloc");
  return q;
}

/* fork: the quarantine lock is a leaf (nothing else is taken under it), so it comes
 * last in the global order. */
KEEL_HOT void _keel_checked_lock_all(void) { keel_lock(&q_lock); }
KEEL_HOT void _keel_checked_unlock_all(void) { keel_unlock(&q_lock); }
KEEL_HOT void _keel_checked_reset_locks(void) { q_lock = (keel_lock_t)KEEL_LOCK_INIT; }

void _keel_checked_quarantine_bytes(uint64_t* small, uint64_t* big) {
  keel_lock(&q_lock);
  *small = q_bytes - q_big_bytes;
  *big = q_big_bytes;
  keel_unlock(&q_lock);
}
