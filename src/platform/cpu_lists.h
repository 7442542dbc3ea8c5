/* cpu_lists.h -- per-processor lists of free blocks, pushed and popped without an atomic
 * instruction: Linux's restartable sequences (rseq(2)), through the registration glibc
 * (2.35+) makes for every thread.
 *
 * A list belongs to one processor. The push or pop runs as a critical section that the
 * kernel aborts if the thread is preempted, migrated or signalled inside it, so only the
 * one thread running on that processor can be in it, and a plain store commits it.
 * Another thread (the purger) empties a list by setting its area's stop byte, which every
 * section reads first, and then running _keel_prim_cpu_lists_fence: from then on no
 * section is in flight on any processor and none will pass the stop byte.
 *
 * An area (one per processor, the core's): the stop byte at offset 0, list heads (words)
 * at the offsets the core chooses. A head is 0 (empty), or the first block's address
 * (16-byte aligned) plus the list's length (1..KEEL_CPU_LIST_CAP) in its low four bits.
 * A block's first word holds the head below it, xor the caller's key xor the block's own
 * address (a stray write into a free block is then caught, not followed: cpu_lists.c). */
#ifndef KEEL_CPU_LISTS_H
#define KEEL_CPU_LISTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KEEL_CPU_LISTS_MAX 1024 /* processors with an area; the others use no list */
#define KEEL_CPU_LIST_CAP 4     /* blocks a list holds, at most 15 */

#if defined(__linux__) && defined(__x86_64__)
#define KEEL_PRIM_CPU_LISTS 1

extern const ptrdiff_t __rseq_offset __attribute__((weak));
extern const unsigned int __rseq_size __attribute__((weak));

/* The calling thread's rseq area (struct rseq: cpu_id_start, cpu_id, rseq_cs, flags), or
 * NULL where glibc did not register one (older glibc, glibc.pthread.rseq=0, valgrind). */
static inline char* keel_prim_rseq(void) {
  if (&__rseq_size == NULL || __rseq_size == 0) return NULL;
  char* r = (char*)__builtin_thread_pointer() + __rseq_offset;
  return __atomic_load_n((const int32_t*)(r + 4), __ATOMIC_RELAXED) >= 0 ? r : NULL;
}

/* The kernel checks these four bytes before the abort handler: glibc's signature. */
#define KEEL_RSEQ_SIG "0x53053053"

/* The section's descriptor (struct rseq_cs: version, flags, start, length, abort), stored
 * into the thread's rseq area to open it; the abort handler, behind the signature, goes
 * to the failure exit. */
#define KEEL_RSEQ_ENTER                  \
  ".pushsection __rseq_cs, \"aw\"\n\t"   \
  ".balign 32\n\t"                       \
  "3:\n\t"                               \
  ".long 0, 0\n\t"                       \
  ".quad 1f, 2f - 1f, 4f\n\t"            \
  ".popsection\n\t"                      \
  ".pushsection __rseq_failure, \"ax\"\n\t" \
  ".byte 0x0f, 0xb9, 0x3d\n\t"           \
  ".long " KEEL_RSEQ_SIG "\n\t"          \
  "4:\n\t"                               \
  "jmp 5f\n\t"                           \
  ".popsection\n\t"                      \
  "leaq 3b(%%rip), %q[t0]\n\t"           \
  "movq %q[t0], 8(%[rseq])\n\t"          \
  "1:\n\t"                               \
  /* this processor's area, if it has one and it is not stopped */ \
  "movl 4(%[rseq]), %k[t1]\n\t"          \
  "cmpl $1024, %k[t1]\n\t"               \
  "jae 5f\n\t"                           \
  "movq (%[areas], %q[t1], 8), %q[area]\n\t" \
  "testq %q[area], %q[area]\n\t"         \
  "jz 5f\n\t"                            \
  "cmpb $0, (%q[area])\n\t"              \
  "jne 5f\n\t"
_Static_assert(KEEL_CPU_LISTS_MAX == 1024, "KEEL_RSEQ_ENTER compares with 1024");

/* Pops the head of the list at `off` in the calling processor's area: the head word it
 * found (0: nothing popped - no area, stopped, empty or interrupted) and, in *next, the
 * head word it left, decoded with key. */
static inline uintptr_t keel_prim_cpu_list_pop(char* rseq, void* const* areas, size_t off, uintptr_t key,
                                               uintptr_t* next) {
  uintptr_t head, t0, t1, area;
  __asm__ __volatile__(KEEL_RSEQ_ENTER
                       "movq (%q[area], %[off]), %q[head]\n\t"
                       "movq %q[head], %q[t1]\n\t"
                       "andq $-16, %q[t1]\n\t"
                       "jz 5f\n\t"
                       "movq (%q[t1]), %q[t0]\n\t"
                       "xorq %[key], %q[t0]\n\t"
                       "xorq %q[t1], %q[t0]\n\t"
                       "movq %q[t0], (%q[area], %[off])\n\t" /* the commit */
                       "2:\n\t"
                       "jmp 6f\n\t"
                       "5:\n\t"
                       "xorl %k[head], %k[head]\n\t"
                       "6:\n\t"
                       : [head] "=&r"(head), [t0] "=&r"(t0), [t1] "=&r"(t1), [area] "=&r"(area)
                       : [rseq] "r"(rseq), [areas] "r"(areas), [off] "r"(off), [key] "r"(key)
                       : "memory", "cc");
  *next = t0;
  return head;
}

/* Pushes block (16-byte aligned, the caller's to write) on the list at `off` in the
 * calling processor's area; false if it could not (no area, stopped, full, interrupted). */
static inline bool keel_prim_cpu_list_push(char* rseq, void* const* areas, size_t off, uintptr_t block,
                                           uintptr_t key) {
  uintptr_t t0, t1, area;
  uint32_t ok;
  key ^= block;
  __asm__ __volatile__(KEEL_RSEQ_ENTER
                       "movq (%q[area], %[off]), %q[t0]\n\t"
                       "movl %k[t0], %k[t1]\n\t"
                       "andl $15, %k[t1]\n\t"
                       "cmpl %[cap], %k[t1]\n\t"
                       "jae 5f\n\t"
                       "xorq %[key], %q[t0]\n\t"
                       "movq %q[t0], (%[block])\n\t"
                       "leaq 1(%[block], %q[t1]), %q[t0]\n\t"
                       "movq %q[t0], (%q[area], %[off])\n\t" /* the commit */
                       "2:\n\t"
                       "movl $1, %k[ok]\n\t"
                       "jmp 6f\n\t"
                       "5:\n\t"
                       "xorl %k[ok], %k[ok]\n\t"
                       "6:\n\t"
                       : [ok] "=&r"(ok), [t0] "=&r"(t0), [t1] "=&r"(t1), [area] "=&r"(area)
                       : [rseq] "r"(rseq), [areas] "r"(areas), [off] "r"(off), [block] "r"(block), [key] "r"(key),
                         [cap] "i"(KEEL_CPU_LIST_CAP)
                       : "memory", "cc");
  return ok != 0;
}

#else
#define KEEL_PRIM_CPU_LISTS 0
static inline char* keel_prim_rseq(void) { return NULL; }
static inline uintptr_t keel_prim_cpu_list_pop(char* rseq, void* const* areas, size_t off, uintptr_t key,
                                               uintptr_t* next) {
  (void)rseq, (void)areas, (void)off, (void)key;
  *next = 0;
  return 0;
}
static inline bool keel_prim_cpu_list_push(char* rseq, void* const* areas, size_t off, uintptr_t block,
                                           uintptr_t key) {
  (void)rseq, (void)areas, (void)off, (void)block, (void)key;
  return false;
}
#endif

/* Every processor has left any section it was in, and a section started later reads
 * every store made before this call (a stop byte). False where the kernel cannot (no
 * MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: Linux before 5.10): the lists are then unused. */
bool _keel_prim_cpu_lists_fence(void);

#endif /* KEEL_CPU_LISTS_H */
