/* stats_print.c -- jemalloc's malloc_stats_print(): the statistics snapshot mallctl reads
 * (mallctl.c), printed as jemalloc 5.3 prints it, as text or JSON. */
#include "api/jemalloc_compat.h"

/* Output goes through a stack buffer, handed to the callback in pieces: no allocation,
 * and no Keel lock is held while the callback runs (it may well call malloc). */
typedef struct out_s {
  void (*cb)(void*, const char*);
  void* opaque;
  size_t len;
  char buf[4096];
} out_t;

static KEEL_COLD void out_flush(out_t* o) {
  if (o->len == 0) return;
  o->buf[o->len] = 0;
  if (o->cb) o->cb(o->opaque, o->buf);
  else _keel_prim_write(2, o->buf, o->len);
  o->len = 0;
}
static KEEL_COLD void out_s(out_t* o, const char* s) {
  while (*s) {
    if (o->len + 1 >= sizeof o->buf) out_flush(o);
    o->buf[o->len++] = *s++;
  }
}
static KEEL_COLD void fmt_u(char* tmp, uint64_t v) { /* tmp: 24 bytes */
  keel_buf_t b = {tmp, 0, 24};
  _keel_buf_u64(&b, v);
}
static KEEL_COLD void out_u(out_t* o, uint64_t v) {
  char tmp[24];
  fmt_u(tmp, v);
  out_s(o, tmp);
}
static KEEL_COLD void out_i(out_t* o, int64_t v) {
  if (v < 0) {
    out_s(o, "-");
    out_u(o, (uint64_t)0 - (uint64_t)v);
  } else {
    out_u(o, (uint64_t)v);
  }
}
static KEEL_COLD void out_rpad(out_t* o, const char* s, size_t width) { /* right-aligned */
  for (size_t n = strlen(s); n < width; n++) out_s(o, " ");
  out_s(o, s);
}
static KEEL_COLD void out_ru(out_t* o, uint64_t v, size_t width) {
  char tmp[24];
  fmt_u(tmp, v);
  out_rpad(o, tmp, width);
}
/* num/den with three decimals ("0.390"), right-aligned. */
static KEEL_COLD void out_ratio(out_t* o, uint64_t num, uint64_t den, size_t width) {
  uint64_t milli = den ? (num * 1000 + den / 2) / den : 0;
  char tmp[32], frac[4] = {(char)('0' + milli / 100 % 10), (char)('0' + milli / 10 % 10),
                           (char)('0' + milli % 10), 0};
  fmt_u(tmp, milli / 1000);
  strcat(tmp, ".");
  strcat(tmp, frac);
  out_rpad(o, tmp, width);
}

static KEEL_COLD void out_value(out_t* o, int type, const val_t* v) {
  switch (type) {
    case V_BOOL: out_s(o, v->n ? "true" : "false"); break;
    case V_SSIZE:
    case V_I64: out_i(o, (int64_t)v->n); break;
    case V_STR:
      out_s(o, "\"");
      out_s(o, v->s ? v->s : "");
      out_s(o, "\"");
      break;
    default: out_u(o, v->n); break;
  }
}

/* JSON: each object tracks whether a member was written, for the commas. */
static KEEL_COLD void j_key(out_t* o, bool* first, int indent, const char* key) {
  out_s(o, *first ? "\n" : ",\n");
  *first = false;
  for (int i = 0; i < indent; i++) out_s(o, "\t");
  out_s(o, "\"");
  out_s(o, key);
  out_s(o, "\": ");
}
static KEEL_COLD void j_u(out_t* o, bool* first, int indent, const char* key, uint64_t v) {
  j_key(o, first, indent, key);
  out_u(o, v);
}
static KEEL_COLD void j_close(out_t* o, int indent, char c) {
  out_s(o, "\n");
  for (int i = 0; i < indent; i++) out_s(o, "\t");
  char s[2] = {c, 0};
  out_s(o, s);
}

/* Every value leaf under the mallctl directory `dir`, "  prefix.name: value" or as JSON
 * members. */
typedef struct dir_out_s {
  out_t* o;
  const char* prefix;
  bool json, first;
  int indent;
} dir_out_t;

static KEEL_COLD void print_leaf(void* ctx, const char* name, int type, const val_t* v) {
  dir_out_t* d = (dir_out_t*)ctx;
  if (d->json) {
    j_key(d->o, &d->first, d->indent, name);
  } else {
    out_s(d->o, "  ");
    out_s(d->o, d->prefix);
    out_s(d->o, name);
    out_s(d->o, ": ");
  }
  out_value(d->o, type, v);
  if (!d->json) out_s(d->o, "\n");
}

static KEEL_COLD void print_dir(out_t* o, const char* dir, const char* prefix, bool json, int indent) {
  dir_out_t d = {o, prefix, json, true, indent};
  _keel_je_ctl_each(dir, print_leaf, &d);
}

static KEEL_COLD uint64_t f_curregs(const je_snap_t* x, unsigned cls) {
  return x->out[cls] > x->batched[cls] ? x->out[cls] - x->batched[cls] : 0;
}

static KEEL_COLD void print_text(out_t* o, const je_snap_t* x, bool general, bool arena, bool bins,
                       bool large) {
  out_s(o, "___ Begin jemalloc statistics ___\n");
  if (general) {
    out_s(o, "Version: \"" JE_VERSION "\"\n");
    out_s(o, "Allocator: keel ");
    out_s(o, keel_version());
    out_s(o, " (jemalloc 5.3 API)\n");
    out_s(o, "Build-time option settings\n");
    print_dir(o, "config", "config.", false, 0);
    out_s(o, "Run-time option settings\n");
    print_dir(o, "opt", "opt.", false, 0);
    out_s(o, "Arenas: 1\nQuantum size: 16\nPage size: ");
    out_u(o, _keel_page_size);
    out_s(o, "\nMaximum thread-cached size class: ");
    out_u(o, _keel_options.check ? 0 : KEEL_CLASS_MAX);
    out_s(o, "\nNumber of bin size classes: ");
    out_u(o, KEEL_NUM_CLASSES - 1);
    out_s(o, "\nNumber of thread-cache bin size classes: ");
    out_u(o, _keel_options.check ? 0 : KEEL_NUM_CLASSES - 1);
    out_s(o, "\nNumber of large size classes: ");
    out_u(o, JE_NLEXTENTS);
    out_s(o, "\n");
  }
  out_s(o, "Allocated: ");
  out_u(o, x->s.allocated);
  out_s(o, ", active: ");
  out_u(o, x->s.active);
  out_s(o, ", metadata: ");
  out_u(o, x->s.metadata);
  out_s(o, " (n_thp 0), resident: ");
  out_u(o, x->resident);
  out_s(o, ", mapped: ");
  out_u(o, x->mapped);
  out_s(o, ", retained: ");
  out_u(o, x->s.retained);
  out_s(o, "\nBackground threads: ");
  out_u(o, _keel_je_bg_enabled() && keel_opt(background_purge) ? 1 : 0);
  out_s(o, ", num_runs: ");
  out_u(o, x->s.purge_runs);
  out_s(o, ", run_interval: 0 ns\n");
  if (arena) {
    uint64_t page = _keel_page_size;
    out_s(o, "arenas[0]:\nassigned threads: ");
    out_u(o, x->s.threads);
    out_s(o, "\ndss allocation precedence: \"disabled\"\n");
    out_s(o, "decaying:  time       npages       sweeps     madvises       purged\n   dirty: ");
    char tmp[24];
    int64_t d = _keel_je_purge_delay_ms();
    if (d < 0) strcpy(tmp, "N/A");
    else fmt_u(tmp, (uint64_t)d);
    out_rpad(o, tmp, 5);
    out_ru(o, x->dirty / page, 13);
    out_ru(o, x->s.purge_runs, 13);
    out_ru(o, x->s.purge_runs, 13);
    out_ru(o, x->s.purged_bytes / page, 13);
    out_s(o, "\n   muzzy:     0            0            0            0            0\n");
    out_s(o, "                            allocated\nsmall:     ");
    out_ru(o, x->small, 22);
    out_s(o, "\nlarge:     ");
    out_ru(o, x->large, 22);
    out_s(o, "\ntotal:     ");
    out_ru(o, x->s.allocated, 22);
    static const char* const names[] = {"active:", "mapped:", "retained:", "base:", "internal:",
                                        "metadata_thp:", "tcache_bytes:", "resident:"};
    uint64_t vals[] = {x->s.active, x->mapped, x->s.retained, x->s.metadata, 0, 0, x->tcache_bytes,
                       x->resident};
    out_s(o, "\n");
    for (unsigned i = 0; i < sizeof vals / sizeof vals[0]; i++) {
      out_s(o, names[i]);
      out_ru(o, vals[i], 33 - strlen(names[i]));
      out_s(o, "\n");
    }
    if (bins) {
      out_s(o, "bins:           size ind    allocated      curregs     curslabs  regs  pgs"
               "   util\n");
      bool gap = false;
      for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
        const keel_class_t* k = &_keel_classes[cls];
        if (x->slabs[cls] == 0) {
          gap = true;
          continue;
        }
        if (gap) out_s(o, "                     ---\n");
        gap = false;
        uint64_t regs = f_curregs(x, cls);
        out_ru(o, k->size, 20);
        out_ru(o, cls - 1, 4);
        out_ru(o, regs * k->size, 13);
        out_ru(o, regs, 13);
        out_ru(o, x->slabs[cls], 13);
        out_ru(o, k->count, 6);
        out_ru(o, (uint64_t)k->units * KEEL_UNIT_SIZE / page, 5);
        out_ratio(o, regs, x->slabs[cls] * k->count, 7);
        out_s(o, "\n");
      }
      if (gap) out_s(o, "                     ---\n");
    }
    if (large) {
      out_s(o, "large:          size ind    allocated\n");
      out_s(o, "         (131073..1M)  --");
      out_ru(o, x->large - x->s.huge_allocated, 13);
      out_s(o, "\n            (> 1 MiB)  --");
      out_ru(o, x->s.huge_allocated, 13);
      out_s(o, "\n");
    }
  }
  out_s(o, "--- End jemalloc statistics ---\n");
}

static KEEL_COLD void print_json(out_t* o, const je_snap_t* x, bool general, bool arena, bool bins) {
  bool f0 = true, f1 = true;
  out_s(o, "{");
  j_key(o, &f0, 1, "jemalloc");
  out_s(o, "{");
  if (general) {
    j_key(o, &f1, 2, "version");
    out_s(o, "\"" JE_VERSION "\"");
    j_key(o, &f1, 2, "allocator");
    out_s(o, "\"keel ");
    out_s(o, keel_version());
    out_s(o, "\"");
    j_key(o, &f1, 2, "config");
    out_s(o, "{");
    print_dir(o, "config", "", true, 3);
    j_close(o, 2, '}');
    j_key(o, &f1, 2, "opt");
    out_s(o, "{");
    print_dir(o, "opt", "", true, 3);
    j_close(o, 2, '}');
    j_key(o, &f1, 2, "arenas");
    out_s(o, "{");
    bool f2 = true;
    j_u(o, &f2, 3, "narenas", 1);
    j_key(o, &f2, 3, "dirty_decay_ms");
    out_i(o, _keel_je_purge_delay_ms());
    j_u(o, &f2, 3, "muzzy_decay_ms", 0);
    j_u(o, &f2, 3, "quantum", 16);
    j_u(o, &f2, 3, "page", _keel_page_size);
    j_u(o, &f2, 3, "tcache_max", _keel_options.check ? 0 : KEEL_CLASS_MAX);
    j_u(o, &f2, 3, "nbins", KEEL_NUM_CLASSES - 1);
    j_u(o, &f2, 3, "nhbins", _keel_options.check ? 0 : KEEL_NUM_CLASSES - 1);
    j_key(o, &f2, 3, "bin");
    out_s(o, "[");
    for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
      const keel_class_t* k = &_keel_classes[cls];
      bool f3 = true;
      out_s(o, cls > 1 ? ",\n\t\t\t\t{" : "\n\t\t\t\t{");
      j_u(o, &f3, 5, "size", k->size);
      j_u(o, &f3, 5, "nregs", k->count);
      j_u(o, &f3, 5, "slab_size", (uint64_t)k->units * KEEL_UNIT_SIZE);
      j_close(o, 4, '}');
    }
    j_close(o, 3, ']');
    j_u(o, &f2, 3, "nlextents", JE_NLEXTENTS);
    j_key(o, &f2, 3, "lextent");
    out_s(o, "[");
    for (unsigned i = 0; i < JE_NLEXTENTS; i++) {
      bool f3 = true;
      out_s(o, i ? ",\n\t\t\t\t{" : "\n\t\t\t\t{");
      j_u(o, &f3, 5, "size", JE_LARGE_MIN + (uint64_t)i * KEEL_UNIT_SIZE);
      j_close(o, 4, '}');
    }
    j_close(o, 3, ']');
    j_close(o, 2, '}');
  }
  j_key(o, &f1, 2, "stats");
  out_s(o, "{");
  bool f2 = true;
  j_u(o, &f2, 3, "allocated", x->s.allocated);
  j_u(o, &f2, 3, "active", x->s.active);
  j_u(o, &f2, 3, "metadata", x->s.metadata);
  j_u(o, &f2, 3, "metadata_thp", 0);
  j_u(o, &f2, 3, "resident", x->resident);
  j_u(o, &f2, 3, "mapped", x->mapped);
  j_u(o, &f2, 3, "retained", x->s.retained);
  j_key(o, &f2, 3, "background_thread");
  out_s(o, "{");
  bool f3 = true;
  j_u(o, &f3, 4, "num_threads", _keel_je_bg_enabled() && keel_opt(background_purge) ? 1 : 0);
  j_u(o, &f3, 4, "num_runs", x->s.purge_runs);
  j_u(o, &f3, 4, "run_interval", 0);
  j_close(o, 3, '}');
  j_close(o, 2, '}');
  if (arena) {
    j_key(o, &f1, 2, "stats.arenas");
    out_s(o, "{");
    bool fa = true;
    j_key(o, &fa, 3, "0");
    out_s(o, "{");
    bool f = true;
    uint64_t page = _keel_page_size;
    j_u(o, &f, 4, "nthreads", x->s.threads);
    j_key(o, &f, 4, "dss");
    out_s(o, "\"disabled\"");
    j_key(o, &f, 4, "dirty_decay_ms");
    out_i(o, _keel_je_purge_delay_ms());
    j_u(o, &f, 4, "muzzy_decay_ms", 0);
    j_u(o, &f, 4, "pactive", x->s.active / page);
    j_u(o, &f, 4, "pdirty", x->dirty / page);
    j_u(o, &f, 4, "pmuzzy", 0);
    j_u(o, &f, 4, "dirty_npurge", x->s.purge_runs);
    j_u(o, &f, 4, "dirty_nmadvise", x->s.purge_runs);
    j_u(o, &f, 4, "dirty_purged", x->s.purged_bytes / page);
    j_u(o, &f, 4, "muzzy_npurge", 0);
    j_u(o, &f, 4, "muzzy_nmadvise", 0);
    j_u(o, &f, 4, "muzzy_purged", 0);
    j_key(o, &f, 4, "small");
    out_s(o, "{");
    bool fs = true;
    j_u(o, &fs, 5, "allocated", x->small);
    j_close(o, 4, '}');
    j_key(o, &f, 4, "large");
    out_s(o, "{");
    fs = true;
    j_u(o, &fs, 5, "allocated", x->large);
    j_close(o, 4, '}');
    j_u(o, &f, 4, "mapped", x->mapped);
    j_u(o, &f, 4, "retained", x->s.retained);
    j_u(o, &f, 4, "base", x->s.metadata);
    j_u(o, &f, 4, "internal", 0);
    j_u(o, &f, 4, "metadata_thp", 0);
    j_u(o, &f, 4, "tcache_bytes", x->tcache_bytes);
    j_u(o, &f, 4, "resident", x->resident);
    if (bins) {
      j_key(o, &f, 4, "bins");
      out_s(o, "[");
      for (unsigned cls = 1; cls < KEEL_NUM_CLASSES; cls++) {
        bool fb = true;
        out_s(o, cls > 1 ? ",\n\t\t\t\t\t{" : "\n\t\t\t\t\t{");
        j_u(o, &fb, 6, "curregs", f_curregs(x, cls));
        j_u(o, &fb, 6, "curslabs", x->slabs[cls]);
        j_close(o, 5, '}');
      }
      j_close(o, 4, ']');
    }
    j_close(o, 3, '}');
    j_close(o, 2, '}');
  }
  j_close(o, 1, '}');
  j_close(o, 0, '}');
  out_s(o, "\n");
}

/* opts as jemalloc's: J JSON, g no general information, m/a no arena statistics (Keel has
 * one arena, printed as arenas[0]), b no bins, l no large sizes; the rest is ignored. */
API KEEL_COLD void malloc_stats_print(void (*write_cb)(void*, const char*), void* cbopaque,
                            const char* opts) {
  bool json = false, general = true, arena = true, bins = true, large = true;
  for (const char* c = opts; c && *c; c++) {
    switch (*c) {
      case 'J': json = true; break;
      case 'g': general = false; break;
      case 'm':
      case 'a': arena = false; break;
      case 'b': bins = false; break;
      case 'l': large = false; break;
      default: break;
    }
  }
  keel_ensure_init();
  _keel_je_snap_refresh(false); /* as jemalloc: a fresh epoch */
  je_snap_t x;
  _keel_je_snap_copy(&x);
  out_t o;
  o.cb = write_cb ? write_cb : malloc_message;
  o.opaque = cbopaque;
  o.len = 0;
  if (json) print_json(&o, &x, general, arena, bins);
  else print_text(&o, &x, general, arena, bins, large);
  out_flush(&o);
}
