/* report.h -- errors (report.c): misuse reports, internal failures, warnings, and the
 * small formatter they print with. */
#ifndef KEEL_REPORT_H
#define KEEL_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "core/base.h"

/* ---- errors (report.c) ---------------------------------------------------------------- */
/* Prints one line "keel: CALL(): WHAT pointer 0x...DETAIL" and aborts. */
_Noreturn void _keel_misuse(const char* call, const char* what, const void* p,
                            const char* detail, size_t size) KEEL_INTERNAL KEEL_COLD;
_Noreturn void _keel_fatal_internal(const char* file, int line, const char* what) KEEL_INTERNAL
    KEEL_COLD;
void _keel_warn(const char* msg, const char* value) KEEL_INTERNAL;

/* A tiny formatter over a fixed buffer (no stdio, no allocation). */
typedef struct keel_buf_s {
  char* p;
  size_t len, cap;
} keel_buf_t;
void _keel_buf_str(keel_buf_t* b, const char* s) KEEL_INTERNAL;
void _keel_buf_u64(keel_buf_t* b, uint64_t v) KEEL_INTERNAL;
void _keel_buf_hex(keel_buf_t* b, uint64_t v) KEEL_INTERNAL;
void _keel_buf_pad(keel_buf_t* b, size_t col) KEEL_INTERNAL;

#endif /* KEEL_REPORT_H */
