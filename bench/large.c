/* large -- big blocks, 1-32 MiB, allocated, touched page by page, freed.
 *
 * Up to 4 blocks are live at a time. Each operation picks a random slot: an empty
 * slot gets a new block of a random byte size between 1 and 32 MiB (not a multiple of
 * the page size); a full one is freed (75%) or reallocated to a new random size
 * (25%, as a growing or shrinking buffer would be). Every page of a new block, and of
 * the new part of a grown block, is written; samples of every page are checked before
 * free and after realloc. The time is dominated by page faults and by how the
 * allocator maps, reuses and returns memory; peak RSS shows what it keeps around.
 * Checksum: hash of the sizes and of the values read back.
 * Usage: large [scale]
 */
#include <unistd.h>

#include "bench.h"

enum { SLOTS = 4 };
#define MIB (1024u * 1024u)

static size_t page;

static unsigned char mark(size_t off, unsigned tag) { return (unsigned char)((off / page) * 31 + tag); }

/* Invariant of a block of n bytes: every page-aligned offset below n holds mark(offset),
   and so does the last byte. touch() writes the page-aligned offsets in [from, to) and
   the last byte; verify() checks the page-aligned offsets below n. */
static void touch(unsigned char* p, size_t from, size_t to, unsigned tag) {
  for (size_t off = from; off < to; off += page) p[off] = mark(off, tag);
  if (to > from) p[to - 1] = mark(to - 1, tag);
}
static uint64_t verify(const unsigned char* p, size_t n, unsigned tag) {
  uint64_t sum = 0;
  for (size_t off = 0; off < n; off += page) {
    BENCH_CHECK(p[off] == mark(off, tag));
    sum += p[off];
  }
  return sum;
}

int main(int argc, char** argv) {
  bench_init("large", argc, argv, 0);
  page = (size_t)sysconf(_SC_PAGESIZE);
  uint64_t ops = bench_scaled(200, 1);
  rng_t rng;
  rng_seed(&rng, 77);
  unsigned char* slot[SLOTS] = {0};
  size_t size[SLOTS] = {0};
  uint64_t ck = 0, touched = 0;
  for (uint64_t i = 0; i < ops; i++) {
    uint32_t s = rng_below(&rng, SLOTS);
    unsigned tag = s + 1;
    size_t sz = MIB + rng_below(&rng, 31 * MIB + 1);
    if (!slot[s]) {
      slot[s] = xmalloc(sz);
      touch(slot[s], 0, sz, tag);
      size[s] = sz;
      touched += sz;
    } else if (rng_pct(&rng, 75)) {
      ck = ck_step(ck, verify(slot[s], size[s], tag) ^ size[s]);
      free(slot[s]);
      slot[s] = NULL;
    } else {
      size_t old = size[s];
      unsigned char* p = xrealloc(slot[s], sz);
      ck = ck_step(ck, verify(p, old < sz ? old : sz, tag) ^ sz);
      if (sz > old) {
        touch(p, (old + page - 1) / page * page, sz, tag); /* page offsets not yet written */
        touched += sz - old;
      } else {
        p[sz - 1] = mark(sz - 1, tag);
      }
      slot[s] = p;
      size[s] = sz;
    }
  }
  for (int s = 0; s < SLOTS; s++) {
    if (slot[s]) ck = ck_step(ck, verify(slot[s], size[s], (unsigned)s + 1));
    free(slot[s]);
  }
  printf("large ops=%" PRIu64 " touched_mib=%" PRIu64 " checksum=%016" PRIx64 "\n", ops, touched / MIB, ck);
  return 0;
}
