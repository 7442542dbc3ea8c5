/* base.h -- the attributes, branch hints, section placements and assertion macro every
 * core header and file uses (keel_assert calls report.h's _keel_fatal_internal). */
#ifndef KEEL_BASE_H
#define KEEL_BASE_H

#define KEEL_NOINLINE __attribute__((noinline))
#define KEEL_ALWAYS_INLINE inline __attribute__((always_inline))
#define KEEL_COLD __attribute__((cold, noinline))
/* Runs in every process (start-up, exit, the purger's tick, the fork handlers, the
 * profiler's countdown stage) though its file is mostly cold: the linker puts .text.hot
 * in libkeel's first code window (src/hot_text.ld). */
#define KEEL_HOT __attribute__((hot))
/* Zero-initialised data that is large and touched sparsely: laid out last by
 * src/hot_text.ld, where its untouched pages cost nothing and its neighbours do not
 * spill onto pages of their own. (In a file whose whole .bss that script already moves
 * with the cold files', it stays with them.) */
#define KEEL_SPARSE_BSS __attribute__((section(".bss.keel_sparse")))
/* Data every process writes though its file's other data may stay untouched: the
 * process-wide locks outside the central lists (the fork handlers take them all, and
 * the child resets them) and the first thread cache. src/hot_text.ld keeps it together
 * on the page where the hot .bss ends, away from the cold files' tables that the locks
 * used to sit beside (checked mode's quarantine, meshing's plans). */
#define KEEL_ALWAYS_BSS __attribute__((section(".bss.keel_always")))
/* The central lists' array: page-aligned, after the data every process writes
 * (src/hot_text.ld). */
#define KEEL_CENTRAL_BSS __attribute__((section(".bss.keel_central"), aligned(4096)))
#define KEEL_LIKELY(x) __builtin_expect(!!(x), 1)
#define KEEL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define KEEL_INTERNAL __attribute__((visibility("hidden")))

/* Set bits of x, for the paths that count them per block (a slab take). x86-64 before
 * POPCNT (Debian's baseline) makes the builtin a call into libgcc; the same arithmetic
 * inline costs no call, but some 40 bytes of code a use, so the rest (per span, per
 * purge) keep the builtin: libkeel's hot code must fit one 64 KiB window. */
static inline unsigned keel_popcount64(unsigned long long x) {
#if defined(__x86_64__) && !defined(__POPCNT__)
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (unsigned)((x * 0x0101010101010101ull) >> 56);
#else
  return (unsigned)__builtin_popcountll(x);
#endif
}

#if defined(__SANITIZE_THREAD__)
#define KEEL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KEEL_TSAN 1
#endif
#endif
#ifndef KEEL_TSAN
#define KEEL_TSAN 0
#endif

#if KEEL_DEBUG >= 1
#define keel_assert(cond) \
  ((cond) ? (void)0 : _keel_fatal_internal(__FILE__, __LINE__, #cond))
#else
#define keel_assert(cond) ((void)0)
#endif

#endif /* KEEL_BASE_H */
