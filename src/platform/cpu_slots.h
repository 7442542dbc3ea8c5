/* cpu_slots.h -- per-processor slots, each holding one free block, filled and emptied
 * without an atomic instruction: Linux's restartable sequences (rseq(2)), through the
 * registration glibc (2.35+) makes for every thread.
 *
 * A slot belongs to one processor. A put or take runs as a critical section that the
 * kernel aborts if the thread is preempted, migrated or signalled inside it, so only the
 * one thread running on that processor can be in it, and a plain store commits it.
 * Another thread (the purger) empties a processor's slots by setting its area's stop
 * byte, which every section reads first, and then running _keel_prim_cpu_slots_fence:
 * from then on no section is in flight on any processor and none will pass the stop
 * byte.
 *
 * An area (one per processor, the core's): the stop byte at offset 0, slots (words, 0 or
 * a block's address) at the offsets the core chooses. */
#ifndef KEEL_CPU_SLOTS_H
#define KEEL_CPU_SLOTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KEEL_CPU_SLOTS_MAX 1024 /* processors with an area; the others use no slot */

#if defined(__linux__) && defined(__x86_64__)
#define KEEL_PRIM_CPU_SLOTS 1

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
 * to the failure exit (5). Then the slot's address in this processor's area, if it has
 * one and it is not stopped. */
#define KEEL_RSEQ_ENTER                                 \
  ".pushsection __rseq_cs, \"aw\"\n\t"                  \
  ".balign 32\n\t"                                      \
  "3:\n\t"                                              \
  ".long 0, 0\n\t"                                      \
  ".quad 1f, 2f - 1f, 4f\n\t"                           \
  ".popsection\n\t"                                     \
  ".pushsection __rseq_failure, \"ax\"\n\t"             \
  ".byte 0x0f, 0xb9, 0x3d\n\t"                          \
  ".long " KEEL_RSEQ_SIG "\n\t"                         \
  "4:\n\t"                                              \
  "jmp 5f\n\t"                                          \
  ".popsection\n\t"                                     \
  "leaq 3b(%%rip), %q[t0]\n\t"                          \
  "movq %q[t0], 8(%[rseq])\n\t"                         \
  "1:\n\t"                                              \
  "movl 4(%[rseq]), %k[t0]\n\t"                         \
  "cmpl $1024, %k[t0]\n\t"                              \
  "jae 5f\n\t"                                          \
  "movq (%[areas], %q[t0], 8), %q[t0]\n\t"              \
  "testq %q[t0], %q[t0]\n\t"                            \
  "jz 5f\n\t"                                           \
  "cmpb $0, (%q[t0])\n\t"                               \
  "jne 5f\n\t"                                          \
  "addq %[off], %q[t0]\n\t"
_Static_assert(KEEL_CPU_SLOTS_MAX == 1024, "KEEL_RSEQ_ENTER compares with 1024");

/* Empties the slot at `off` in the calling processor's area: the block it held, or NULL
 * (no area, stopped, empty, or interrupted). */
static inline void* keel_prim_cpu_slot_take(char* rseq, void* const* areas, size_t off) {
  uintptr_t block, t0;
  __asm__ __volatile__(KEEL_RSEQ_ENTER
                       "movq (%q[t0]), %q[block]\n\t"
                       "testq %q[block], %q[block]\n\t"
                       "jz 5f\n\t"
                       "movq $0, (%q[t0])\n\t" /* the commit */
                       "2:\n\t"
                       "jmp 6f\n\t"
                       "5:\n\t"
                       "xorl %k[block], %k[block]\n\t"
                       "6:\n\t"
                       : [block] "=&r"(block), [t0] "=&r"(t0)
                       : [rseq] "r"(rseq), [areas] "r"(areas), [off] "r"(off)
                       : "memory", "cc");
  return (void*)block;
}

/* Puts block in the slot at `off` in the calling processor's area; false if it could not
 * (no area, stopped, full, or interrupted). */
static inline bool keel_prim_cpu_slot_put(char* rseq, void* const* areas, size_t off, void* block) {
  uintptr_t t0;
  uint32_t ok;
  __asm__ __volatile__(KEEL_RSEQ_ENTER
                       "cmpq $0, (%q[t0])\n\t"
                       "jne 5f\n\t"
                       "movq %[block], (%q[t0])\n\t" /* the commit */
                       "2:\n\t"
                       "movl $1, %k[ok]\n\t"
                       "jmp 6f\n\t"
                       "5:\n\t"
                       "xorl %k[ok], %k[ok]\n\t"
                       "6:\n\t"
                       : [ok] "=&r"(ok), [t0] "=&r"(t0)
                       : [rseq] "r"(rseq), [areas] "r"(areas), [off] "r"(off), [block] "r"(block)
                       : "memory", "cc");
  return ok != 0;
}

#else
#define KEEL_PRIM_CPU_SLOTS 0
static inline char* keel_prim_rseq(void) { return NULL; }
static inline void* keel_prim_cpu_slot_take(char* rseq, void* const* areas, size_t off) {
  (void)rseq, (void)areas, (void)off;
  return NULL;
}
static inline bool keel_prim_cpu_slot_put(char* rseq, void* const* areas, size_t off, void* block) {
  (void)rseq, (void)areas, (void)off, (void)block;
  return false;
}
#endif

/* Every processor has left any section it was in, and a section started later reads
 * every store made before this call (a stop byte). False where the kernel cannot (no
 * MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: Linux before 5.10): the slots are then unused. */
bool _keel_prim_cpu_slots_fence(void);

#endif /* KEEL_CPU_SLOTS_H */
