/* fastpath_loop.c -- the loop whose instruction count the fast-path test guards:
 * malloc(SIZE)+free pairs (32 bytes unless a second argument says), with blocks of
 * several sizes kept live so that no slab empties on every free. Run twice with
 * different counts; the difference divided by the extra iterations is the cost of one
 * pair (loop overhead included). */
#include <stdint.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  long iters = argc > 1 ? atol(argv[1]) : 1000000;
  size_t size = argc > 2 ? (size_t)atol(argv[2]) : 32;
  void* keep[256];
  for (int i = 0; i < 256; i++) keep[i] = malloc(16 + (size_t)(i % 8) * 16);
  uintptr_t acc = 0;
  for (long i = 0; i < iters; i++) {
    void* p = malloc(size);
    __asm__ __volatile__("" : : "r"(p) : "memory");
    acc += (uintptr_t)p;
    free(p);
  }
  for (int i = 0; i < 256; i++) free(keep[i]);
  return (int)(acc & 1);
}
