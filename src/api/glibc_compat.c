/* glibc_compat.c -- glibc's malloc extras (mallinfo2, malloc_stats, malloc_info,
 * mallopt, malloc_trim), answered with Keel's own figures. Programs and tools that call
 * them keep working; the figures mean what glibc's mean as far as Keel can map them. */
#include <stdio.h>

#include "core/internal.h"

#define API __attribute__((visibility("default")))

struct mallinfo2 {
  size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
struct mallinfo {
  int arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};

API struct mallinfo2 mallinfo2(void) {
  keel_stats_t s;
  _keel_stats_collect(&s);
  struct mallinfo2 m = {0};
  m.arena = s.committed - s.huge_allocated; /* non-mmapped space Keel holds */
  m.hblks = _keel_huge_live_blocks(); /* directly mapped blocks */
  m.hblkhd = s.huge_allocated;               /* space in directly mapped blocks */
  m.uordblks = s.allocated - s.huge_allocated; /* in use */
  m.fordblks = m.arena > m.uordblks ? m.arena - m.uordblks : 0; /* free but held */
  m.keepcost = s.committed > s.active ? s.committed - s.active : 0;
  return m;
}

static int clamp_int(size_t v) { return v > 0x7fffffff ? 0x7fffffff : (int)v; }

API struct mallinfo mallinfo(void) {
  struct mallinfo2 m2 = mallinfo2();
  struct mallinfo m = {clamp_int(m2.arena),    clamp_int(m2.ordblks),  clamp_int(m2.smblks),
                       clamp_int(m2.hblks),    clamp_int(m2.hblkhd),   clamp_int(m2.usmblks),
                       clamp_int(m2.fsmblks),  clamp_int(m2.uordblks), clamp_int(m2.fordblks),
                       clamp_int(m2.keepcost)};
  return m;
}

/* glibc prints per-arena figures to stderr; Keel has one heap, so one "arena". */
API void malloc_stats(void) {
  keel_stats_t s;
  _keel_stats_collect(&s);
  char text[512];
  keel_buf_t b = {text, 0, sizeof text};
  /* As mallinfo2: the arena is what is not mapped block by block; the maxima are the
   * current figures (Keel keeps no high-water marks of them). */
  _keel_buf_str(&b, "Arena 0:\nsystem bytes     = ");
  _keel_buf_u64(&b, s.committed - s.huge_allocated);
  _keel_buf_str(&b, "\nin use bytes     = ");
  _keel_buf_u64(&b, s.allocated - s.huge_allocated);
  _keel_buf_str(&b, "\nTotal (incl. mmap):\nsystem bytes     = ");
  _keel_buf_u64(&b, s.committed);
  _keel_buf_str(&b, "\nin use bytes     = ");
  _keel_buf_u64(&b, s.allocated);
  _keel_buf_str(&b, "\nmax mmap regions = ");
  _keel_buf_u64(&b, _keel_huge_live_blocks());
  _keel_buf_str(&b, "\nmax mmap bytes   = ");
  _keel_buf_u64(&b, s.huge_allocated);
  _keel_buf_str(&b, "\n");
  _keel_prim_write(2, text, b.len);
}

/* The same XML shape as glibc's malloc_info, with Keel's totals. */
API int malloc_info(int options, FILE* fp) {
  if (options != 0) return _keel_prim_errno_einval(); /* as glibc: no errno */
  keel_stats_t s;
  _keel_stats_collect(&s);
  fprintf(fp, "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n</sizes>\n");
  fprintf(fp, "<total type=\"fast\" count=\"0\" size=\"0\"/>\n");
  fprintf(fp, "<total type=\"rest\" count=\"0\" size=\"%llu\"/>\n", (unsigned long long)s.cached);
  fprintf(fp, "<system type=\"current\" size=\"%llu\"/>\n", (unsigned long long)s.committed);
  fprintf(fp, "<system type=\"max\" size=\"%llu\"/>\n", (unsigned long long)s.mapped);
  fprintf(fp, "<aspace type=\"total\" size=\"%llu\"/>\n", (unsigned long long)s.mapped);
  fprintf(fp, "<aspace type=\"mprotect\" size=\"%llu\"/>\n", (unsigned long long)s.mapped);
  fprintf(fp, "</heap>\n");
  fprintf(fp, "<total type=\"fast\" count=\"0\" size=\"0\"/>\n");
  fprintf(fp, "<total type=\"rest\" count=\"0\" size=\"%llu\"/>\n", (unsigned long long)s.cached);
  fprintf(fp, "<total type=\"mmap\" count=\"0\" size=\"%llu\"/>\n",
          (unsigned long long)s.huge_allocated);
  fprintf(fp, "<system type=\"current\" size=\"%llu\"/>\n", (unsigned long long)s.committed);
  fprintf(fp, "<system type=\"max\" size=\"%llu\"/>\n", (unsigned long long)s.mapped);
  fprintf(fp, "<aspace type=\"total\" size=\"%llu\"/>\n", (unsigned long long)s.mapped);
  fprintf(fp, "<aspace type=\"mprotect\" size=\"%llu\"/>\n", (unsigned long long)s.mapped);
  fprintf(fp, "</malloc>\n");
  return 0;
}

/* glibc's parameter numbers. Keel accepts them all (its own tuning is KEEL_*); like
 * glibc, an unknown number is accepted too, and only a bad M_MXFAST value fails. */
#define M_MXFAST 1
#define MAX_FAST_SIZE (80 * sizeof(size_t) / 4)
API int mallopt(int param, int value) {
  if (param == M_MXFAST && (value < 0 || (size_t)value > MAX_FAST_SIZE)) return 0;
  return 1;
}

/* Returns 1 if memory was given back to the OS. `pad` (bytes to keep at the top of the
 * heap in glibc) has no meaning for Keel. */
API int malloc_trim(size_t pad) {
  (void)pad;
  return keel_purge() > 0;
}
