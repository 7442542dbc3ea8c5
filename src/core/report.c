/* report.c -- messages to stderr without stdio or allocation: misuse reports (which end
 * the process), internal errors, and option warnings. */
#include "core/internal.h"

KEEL_HOT void _keel_buf_str(keel_buf_t* b, const char* s) {
  while (*s && b->len + 1 < b->cap) b->p[b->len++] = *s++;
  b->p[b->len] = 0;
}

KEEL_HOT void _keel_buf_u64(keel_buf_t* b, uint64_t v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  char out[24];
  for (int i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
  out[n] = 0;
  _keel_buf_str(b, out);
}

void _keel_buf_hex(keel_buf_t* b, uint64_t v) {
  char out[20] = "0x";
  int n = 2;
  int shift = 60;
  while (shift > 0 && ((v >> shift) & 0xf) == 0) shift -= 4;
  for (; shift >= 0; shift -= 4) out[n++] = "0123456789abcdef"[(v >> shift) & 0xf];
  out[n] = 0;
  _keel_buf_str(b, out);
}

void _keel_buf_pad(keel_buf_t* b, size_t col) {
  while (b->len < col && b->len + 1 < b->cap) b->p[b->len++] = ' ';
  b->p[b->len] = 0;
}

void _keel_misuse(const char* call, const char* what, const void* p, const char* detail,
                  size_t size) {
  char line[256];
  keel_buf_t b = {line, 0, sizeof line};
  _keel_buf_str(&b, "keel: ");
  _keel_buf_str(&b, call);
  _keel_buf_str(&b, "(): ");
  _keel_buf_str(&b, what);
  _keel_buf_str(&b, " ");
  _keel_buf_hex(&b, (uint64_t)(uintptr_t)p);
  if (detail) _keel_buf_str(&b, detail);
  if (size) {
    _keel_buf_str(&b, " (block of ");
    _keel_buf_u64(&b, size);
    _keel_buf_str(&b, " bytes)");
  }
  _keel_buf_str(&b, "\n");
  _keel_prim_write(2, line, b.len);
  _keel_publish_exit(); /* abort skips destructors: do not leave the stats file behind */
  _keel_prim_abort();
}

void _keel_freelist_corrupt(const char* call, unsigned cls, const void* at) {
  char what[96];
  keel_buf_t b = {what, 0, sizeof what};
  _keel_buf_str(&b, "free list of the ");
  _keel_buf_u64(&b, _keel_classes[cls].size);
  _keel_buf_str(&b, "-byte class corrupted at");
  _keel_misuse(call, what, at, ": a link was overwritten (a heap overflow?)", 0);
}

void _keel_fatal_internal(const char* file, int line_no, const char* what) {
  char line[256];
  keel_buf_t b = {line, 0, sizeof line};
  _keel_buf_str(&b, "keel: internal error at ");
  _keel_buf_str(&b, file);
  _keel_buf_str(&b, ":");
  _keel_buf_u64(&b, (uint64_t)line_no);
  _keel_buf_str(&b, ": ");
  _keel_buf_str(&b, what);
  _keel_buf_str(&b, "\n");
  _keel_prim_write(2, line, b.len);
  _keel_publish_exit();
  _keel_prim_abort();
}

void _keel_warn(const char* msg, const char* value) {
  char line[256];
  keel_buf_t b = {line, 0, sizeof line};
  _keel_buf_str(&b, "keel: warning: ");
  _keel_buf_str(&b, msg);
  if (value) _keel_buf_str(&b, value);
  _keel_buf_str(&b, "\n");
  _keel_prim_write(2, line, b.len);
}
