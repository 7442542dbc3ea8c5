/* profile.c -- sampled heap profiling (KEEL_PROFILE_RATE=N: about one sample per N
 * bytes allocated; off by default).
 *
 * Cost when off: the malloc fast path decrements a per-bin countdown, in the same
 * instruction that counts the pop (keel_bin_t), and leaves the fast path once every 2^15
 * pops to start the countdown's next stage; nothing else. When on, the countdown is set
 * to about N / block-size pops; when it runs out the allocation is served from a
 * "sampled slab" of the same class instead, and its stack is recorded with the class's
 * block size (what the sampling chance depends on). Countdowns are exponential draws
 * (pops: rounded up), so a block of s bytes is sampled with chance 1 - e^(-s/N), which
 * is what pprof assumes when it scales each sample back up. Sampled slabs are
 * tagged in the page map, so only the free of a sampled block leaves the fast path to
 * drop its record; ordinary frees are untouched. Large and huge blocks are sampled on
 * their own slow paths with a per-thread byte countdown.
 *
 * Profiles are written in the legacy pprof heap format ("heap_v2"), which `go tool
 * pprof` and `pprof` read and unsample: one line per distinct stack of live sampled
 * blocks, then the process's memory map for symbolisation. */
#include "core/internal.h"

#define DEPTH 48

typedef struct sample_s {
  uintptr_t ptr; /* 0: empty slot; 1: deleted */
  uint64_t size;   /* bytes sampled: a small block's class size, a big block's request */
  uint64_t weight; /* the heap bytes it stands for: size / (1 - e^(-size/rate)) */
  uint32_t depth;
  uint32_t pad;
  void* stack[DEPTH];
} sample_t;

bool _keel_profiling;
static keel_lock_t prof_lock KEEL_ALWAYS_BSS = KEEL_LOCK_INIT;
keel_lock_t* const _keel_lock_profile = &prof_lock; /* statistics (stats.c) */
static sample_t* table;      /* open addressing by pointer */
static size_t table_cap, table_used, table_deleted;
static uint64_t live_bytes, live_count, total_samples;
static uint64_t live_weight, last_dump_weight; /* estimated heap bytes (growth dumps) */
static uint64_t dumps;
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uintptr_t self_lo, self_hi; /* Keel's own code: dropped from stacks */
static _Thread_local bool in_profiler;
static _Thread_local int64_t big_left;

KEEL_HOT static uint64_t next_random(void) {
  uint64_t x = __atomic_load_n(&rng, __ATOMIC_RELAXED);
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  __atomic_store_n(&rng, x, __ATOMIC_RELAXED);
  return x;
}

/* -ln(u) for a uniform u in (0, 1]: an exponential draw of mean 1. ln(m) for the
 * mantissa m in [1, 2) by the series of 2 atanh((m-1)/(m+1)) to its 9th power (error
 * below 1e-5); no libm. */
static double exp_draw(void) {
  union {
    double d;
    uint64_t i;
  } u = {.d = ((double)(next_random() >> 11) + 1.0) * 0x1p-53};
  int e = (int)((u.i >> 52) & 0x7FF) - 1023;
  u.i = (u.i & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  double t = (u.d - 1.0) / (u.d + 1.0), t2 = t * t;
  double ln_m = 2.0 * t * (1.0 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 / 9))));
  return -((double)e * 0.6931471805599453 + ln_m);
}

/* e^(-x) for x >= 0: 2^(-x log2 e), the fraction's power by its Taylor series. */
static double exp_neg(double x) {
  double y = x * 1.4426950408889634;
  if (y > 64) return 0;
  int k = (int)y;
  double f = (y - k) * 0.6931471805599453; /* 2^-(y-k) = e^-f */
  double ef = 1 - f * (1 - f / 2 * (1 - f / 3 * (1 - f / 4 * (1 - f / 5 * (1 - f / 6)))));
  while (k-- > 0) ef *= 0.5;
  return ef;
}

/* The heap bytes a sample of `size` bytes stands for at the sampling rate. */
static uint64_t weight_of(uint64_t size, uint64_t rate) {
  double p = 1 - exp_neg((double)size / (double)rate);
  return p > 0 ? (uint64_t)((double)size / p) : rate;
}

/* Pops of a class until its next sample: the exponential draw in units of rate/size,
 * rounded up (a geometric draw: each pop samples with chance 1 - e^(-size/rate)). */
KEEL_HOT uint32_t _keel_profile_first_countdown(unsigned cls) {
  if (!_keel_profiling) return UINT32_MAX;
  double d = exp_draw() * (double)keel_opt(profile_rate) / (double)_keel_classes[cls].size + 1.0;
  return d >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)d;
}

/* Bytes of big blocks until the thread's next sample. */
static int64_t big_draw(void) {
  double d = exp_draw() * (double)keel_opt(profile_rate) + 1.0;
  return d >= 0x1p62 ? (int64_t)1 << 62 : (int64_t)d;
}

/* The thread caches' hook (_keel_tcache_sampling): a new cache's bins start counting
 * down to their first sample. */
static void start_countdowns(keel_tcache_t* t) {
  for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++)
    keel_bin_set_countdown(&t->bin[cls], _keel_profile_first_countdown(cls));
}

/* Writes nothing unless profiling is on (it cannot be turned on later): these
 * variables share a page with the profiler's cold tables, and a process that never
 * profiles should not write it, nor walk the loaded objects for Keel's code range. */
KEEL_HOT void _keel_profile_init(void) {
  if (keel_opt(profile_rate) == 0) return;
  _keel_profiling = true;
  __atomic_store_n(&_keel_tcache_sampling, start_countdowns, __ATOMIC_RELAXED);
  rng ^= _keel_prim_random();
  _keel_prim_code_range((const void*)&_keel_profile_init, &self_lo, &self_hi);
}

static size_t slot_of(uintptr_t p, size_t cap) {
  return (size_t)(((uint64_t)p * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

/* Lock held. */
static bool table_grow(void) {
  size_t cap = table_cap ? table_cap * 2 : 1024;
  size_t bytes = (cap * sizeof(sample_t) + _keel_page_size - 1) & ~(_keel_page_size - 1);
  sample_t* t = (sample_t*)_keel_prim_map(bytes, 0, NULL);
  if (t == NULL) return false;
  for (size_t i = 0; i < table_cap; i++) {
    if (table[i].ptr <= 1) continue;
    size_t j = slot_of(table[i].ptr, cap);
    while (t[j].ptr != 0) j = (j + 1) & (cap - 1);
    t[j] = table[i];
  }
  if (table)
    _keel_prim_unmap(table, (table_cap * sizeof(sample_t) + _keel_page_size - 1) & ~(_keel_page_size - 1));
  table = t;
  table_cap = cap;
  table_deleted = 0;
  return true;
}

static void record(void* p, size_t n) {
  if (in_profiler) return;
  in_profiler = true;
  void* raw[DEPTH + 8];
  int got = _keel_prim_backtrace(raw, DEPTH + 8, 1);
  int first = 0;
  while (first < got && (uintptr_t)raw[first] >= self_lo && (uintptr_t)raw[first] < self_hi) first++;
  keel_lock(&prof_lock);
  if ((table_used + table_deleted + 1) * 4 > table_cap * 3 && !table_grow()) {
    keel_unlock(&prof_lock);
    in_profiler = false;
    return;
  }
  size_t j = slot_of((uintptr_t)p, table_cap);
  while (table[j].ptr > 1) j = (j + 1) & (table_cap - 1);
  if (table[j].ptr == 1) table_deleted--;
  sample_t* s = &table[j];
  s->ptr = (uintptr_t)p;
  s->size = n;
  s->weight = weight_of(n, keel_opt(profile_rate));
  s->depth = 0;
  for (int i = first; i < got && s->depth < DEPTH; i++) s->stack[s->depth++] = raw[i];
  table_used++;
  live_bytes += n;
  live_weight += s->weight;
  live_count++;
  total_samples++;
  keel_unlock(&prof_lock);
  in_profiler = false;
}

/* Hot: every 2^15 pops of a bin end a countdown stage here, profiling or not. */
KEEL_HOT void* _keel_profile_countdown_expired(keel_tcache_t* t, unsigned cls, void* p, size_t n) {
  keel_bin_t* b = &t->bin[cls];
  if (b->countdown_hi != 0) { /* the next stage */
    b->countdown_hi--;
    b->countdown = 0x7FFF;
    return p;
  }
  keel_bin_set_countdown(b, _keel_profile_first_countdown(cls));
  if (!_keel_profiling || in_profiler) return p;
  /* A block borrowed from a larger class (borrow.c) just before profiling started
   * cannot go on this bin: it is not sampled. */
  if (keel_pagemap_get(p) != cls) return p;
  void** q = (void**)_keel_central_take_sampled(cls);
  if (q == NULL) return p;
  /* p goes back as a free would put it (the program gets the sampled block instead):
   * onto the bin it came from, or to its slabs in a class the caches do not hold, whose
   * bin has no room for it. */
  _keel_tcache_free_slow(t, p, cls);
  q[1] = NULL;
  (void)n;
  record(q, _keel_classes[cls].size); /* the size its chance of being sampled went by */
  return q;
}

/* malloc's fast path names the bin by its head's address, in the cache t it used, whose
 * busy flag it left set (cleared here). */
KEEL_HOT void* _keel_profile_countdown_expired_at(size_t n, void* p, const uintptr_t* head, keel_tcache_t* t) {
  void* q = _keel_profile_countdown_expired(t, (unsigned)(head - t->head), p, n);
  keel_tc_leave();
  return q;
}

void _keel_profile_sample_big(void* p, size_t n) {
  if (KEEL_UNLIKELY(big_left == 0)) big_left = big_draw(); /* the thread's first */
  big_left -= (int64_t)n;
  if (big_left > 0) return;
  big_left = big_draw();
  record(p, n);
}

void _keel_profile_forget(void* p) {
  if (table_cap == 0) return;
  keel_lock(&prof_lock);
  for (size_t j = slot_of((uintptr_t)p, table_cap);; j = (j + 1) & (table_cap - 1)) {
    if (table[j].ptr == 0) break;
    if (table[j].ptr == (uintptr_t)p) {
      live_bytes -= table[j].size;
      live_weight -= table[j].weight;
      live_count--;
      table[j].ptr = 1; /* deleted: keeps probe chains intact */
      table_used--;
      table_deleted++;
      break;
    }
  }
  keel_unlock(&prof_lock);
}

/* ---- writing profiles ------------------------------------------------------------- */

typedef struct line_s {
  uint64_t hash; /* 0: empty */
  uint64_t count, bytes, weight; /* samples, their sampled bytes, the heap bytes they stand for */
  const sample_t* example;        /* a sample with this stack */
} line_t;

static uint64_t stack_hash(const sample_t* s) {
  uint64_t h = 1469598103934665603ull ^ s->depth;
  for (uint32_t i = 0; i < s->depth; i++) h = (h ^ (uintptr_t)s->stack[i]) * 1099511628211ull;
  return h ? h : 1;
}

static bool same_stack(const sample_t* a, const sample_t* b) {
  if (a->depth != b->depth) return false;
  for (uint32_t i = 0; i < a->depth; i++)
    if (a->stack[i] != b->stack[i]) return false;
  return true;
}

/* Groups live samples by stack into a temporary table; lock held. Returns the table
 * (caller unmaps `*bytes`) or NULL. */
static line_t* group_by_stack(size_t* cap_out, size_t* bytes) {
  size_t cap = 64;
  while (cap < table_used * 2) cap *= 2;
  *bytes = (cap * sizeof(line_t) + _keel_page_size - 1) & ~(_keel_page_size - 1);
  line_t* lines = (line_t*)_keel_prim_map(*bytes, 0, NULL);
  if (lines == NULL) return NULL;
  for (size_t i = 0; i < table_cap; i++) {
    const sample_t* s = &table[i];
    if (s->ptr <= 1) continue;
    uint64_t h = stack_hash(s);
    size_t j = (size_t)h & (cap - 1);
    while (lines[j].hash != 0 && !(lines[j].hash == h && same_stack(lines[j].example, s)))
      j = (j + 1) & (cap - 1);
    lines[j].hash = h;
    lines[j].example = s;
    lines[j].count++;
    lines[j].bytes += s->size;
    lines[j].weight += s->weight;
  }
  *cap_out = cap;
  return lines;
}

static void put(int fd, keel_buf_t* b) {
  _keel_prim_write(fd, b->p, b->len);
  b->len = 0;
  b->p[0] = 0;
}

static void write_counts(keel_buf_t* b, uint64_t count, uint64_t bytes) {
  _keel_buf_u64(b, count);
  _keel_buf_str(b, ": ");
  _keel_buf_u64(b, bytes);
  _keel_buf_str(b, " [");
  _keel_buf_u64(b, count);
  _keel_buf_str(b, ": ");
  _keel_buf_u64(b, bytes);
  _keel_buf_str(b, "] @");
}

static bool dump_fd(int fd) {
  char text[1024];
  keel_buf_t b = {text, 0, sizeof text};
  keel_lock(&prof_lock);
  size_t cap = 0, map_bytes = 0;
  line_t* lines = table_used ? group_by_stack(&cap, &map_bytes) : NULL;
  _keel_buf_str(&b, "heap profile: ");
  write_counts(&b, live_count, live_bytes);
  _keel_buf_str(&b, " heap_v2/");
  _keel_buf_u64(&b, keel_opt(profile_rate));
  _keel_buf_str(&b, "\n");
  put(fd, &b);
  for (size_t i = 0; lines && i < cap; i++) {
    if (lines[i].hash == 0) continue;
    write_counts(&b, lines[i].count, lines[i].bytes);
    for (uint32_t k = 0; k < lines[i].example->depth; k++) {
      _keel_buf_str(&b, " ");
      _keel_buf_hex(&b, (uint64_t)(uintptr_t)lines[i].example->stack[k]);
      if (b.len > sizeof text - 40) put(fd, &b);
    }
    _keel_buf_str(&b, "\n");
    put(fd, &b);
  }
  last_dump_weight = live_weight;
  dumps++;
  keel_unlock(&prof_lock);
  if (lines) _keel_prim_unmap(lines, map_bytes);
  _keel_buf_str(&b, "\nMAPPED_LIBRARIES:\n");
  put(fd, &b);
  _keel_prim_copy_file("/proc/self/maps", fd);
  return true;
}

bool _keel_profile_dump_to(const char* path) {
  int fd = _keel_prim_open_write(path);
  if (fd < 0) return false;
  bool ok = dump_fd(fd);
  _keel_prim_close(fd);
  return ok;
}

void _keel_profile_path(char* path, size_t cap, const char* tag) {
  char prefix[sizeof _keel_options.profile_prefix];
  keel_opt_str(prefix, sizeof prefix, profile_prefix);
  keel_buf_t b = {path, 0, cap};
  _keel_buf_str(&b, prefix);
  _keel_buf_str(&b, ".");
  _keel_buf_u64(&b, (uint64_t)_keel_prim_getpid());
  _keel_buf_str(&b, ".");
  _keel_buf_str(&b, tag);
  _keel_buf_str(&b, ".heap");
}

static void dump_named(const char* tag) {
  char path[256];
  _keel_profile_path(path, sizeof path, tag);
  if (!_keel_profile_dump_to(path)) _keel_warn("cannot write heap profile ", path);
}

__attribute__((no_sanitize("thread"))) KEEL_HOT void _keel_profile_tick(void) {
  uint64_t growth = keel_opt(profile_growth);
  if (!_keel_profiling || growth == 0) return;
  /* What the live samples stand for: a big block for about its own size. */
  uint64_t weight = __atomic_load_n(&live_weight, __ATOMIC_RELAXED);
  if (weight > last_dump_weight && weight - last_dump_weight >= growth) {
    char tag[24];
    keel_buf_t b = {tag, 0, sizeof tag};
    _keel_buf_u64(&b, dumps);
    dump_named(tag);
  }
}

/* The exit dump and the leak report, in the cold text with the rest of this file: only
 * a process that profiles reaches it. */
#define LEAK_SITES 10
#define LEAK_FRAMES 6
static KEEL_COLD void profile_at_exit(void) {
  if (keel_opt(profile_at_exit)) dump_named("exit");
  if (!keel_opt(profile_leaks) || table_used == 0) return;
  /* Leak report: the stacks standing for the most live heap bytes, copied out under the
   * lock and symbolised after it (dladdr takes the loader's lock, which a thread in
   * dlopen may hold while it waits for this one to record a sample). */
  struct {
    uint64_t bytes, count;
    uint32_t depth;
    void* stack[LEAK_FRAMES];
  } top[LEAK_SITES];
  int ntop = 0;
  keel_lock(&prof_lock);
  uint64_t count = live_count, weight = live_weight;
  size_t cap = 0, map_bytes = 0;
  line_t* lines = group_by_stack(&cap, &map_bytes);
  for (; lines && ntop < LEAK_SITES; ntop++) {
    size_t best = cap;
    for (size_t i = 0; i < cap; i++)
      if (lines[i].hash != 0 && (best == cap || lines[i].weight > lines[best].weight)) best = i;
    if (best == cap) break;
    top[ntop].count = lines[best].count;
    top[ntop].bytes = lines[best].weight;
    top[ntop].depth = 0;
    for (uint32_t k = 0; k < lines[best].example->depth && k < LEAK_FRAMES; k++)
      top[ntop].stack[top[ntop].depth++] = lines[best].example->stack[k];
    lines[best].hash = 0;
  }
  keel_unlock(&prof_lock);
  if (lines) _keel_prim_unmap(lines, map_bytes);
  char text[2048];
  keel_buf_t b = {text, 0, sizeof text};
  _keel_buf_str(&b, "keel: leak report: ");
  _keel_buf_u64(&b, count);
  _keel_buf_str(&b, " sampled blocks, about ");
  _keel_buf_u64(&b, weight);
  _keel_buf_str(&b, " bytes, still allocated at exit; largest allocation sites:\n");
  put(2, &b);
  for (int i = 0; i < ntop; i++) {
    _keel_buf_str(&b, "keel:   about ");
    _keel_buf_u64(&b, top[i].bytes);
    _keel_buf_str(&b, " bytes in ");
    _keel_buf_u64(&b, top[i].count);
    _keel_buf_str(&b, " sampled blocks, allocated at\n");
    put(2, &b);
    for (uint32_t k = 0; k < top[i].depth; k++) {
      char sym[160];
      _keel_buf_str(&b, "keel:       ");
      _keel_buf_hex(&b, (uint64_t)(uintptr_t)top[i].stack[k]);
      if (_keel_prim_symbolize(top[i].stack[k], sym, sizeof sym)) {
        _keel_buf_str(&b, " ");
        _keel_buf_str(&b, sym);
      }
      _keel_buf_str(&b, "\n");
      put(2, &b);
    }
  }
}

KEEL_HOT void _keel_profile_at_exit(void) {
  if (_keel_profiling) profile_at_exit();
}

KEEL_API int keel_profile_dump(const char* path) {
  keel_ensure_init();
  if (!_keel_profiling) return -1;
  return _keel_profile_dump_to(path) ? 0 : -1;
}
