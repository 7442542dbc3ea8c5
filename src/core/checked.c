/* checked.c -- the checked mode (KEEL_CHECK=1): names every misuse where it is seen.
 *
 * Each block is allocated with 16 spare bytes. Its last word holds the requested size
 * (xor a secret, so a stray write there is noticed), and the bytes from the requested
 * size to that word are a canary checked on free: writes past the end are reported with
 * how far they went. Freed blocks are filled with a poison pattern, marked with a
 * secret, and held in a FIFO quarantine before they can be reused; a block leaving the
 * quarantine or handed out again is checked for writes after free. Freeing a block that
 * carries the poison mark is a double free. Interior and foreign pointers are refused.
 * Nothing is cached per thread, so this mode is much slower (see the README). */
#include "core/internal.h"

#define TAIL 16        /* spare bytes per block: canary (>= 8) + size word */
#define CANARY 0xCA
#define POISON 0xDF
#define QUARANTINE_SLOTS 4096
#define QUARANTINE_BYTES ((size_t)32 << 20)

static keel_lock_t q_lock = KEEL_LOCK_INIT;
static void* quarantine[QUARANTINE_SLOTS];
static size_t q_head, q_count, q_bytes;
static uintptr_t size_secret, poison_mark;

static void checked_init(void) {
  if (size_secret == 0) {
    size_secret = (uintptr_t)_keel_prim_random() | 1;
    poison_mark = (uintptr_t)_keel_prim_random() | 1;
  }
}

/* Reports a write after free at byte `offset` of freed block p. */
static _Noreturn void report_uaf(const char* call, void* p, size_t offset) {
  char detail[96];
  keel_buf_t b = {detail, 0, sizeof detail};
  _keel_buf_str(&b, ": byte ");
  _keel_buf_u64(&b, offset);
  _keel_buf_str(&b, " was written after the block was freed");
  _keel_misuse(call, "write after free in block", p, detail, 0);
}

/* Checks that freed block p (usable bytes) still holds only poison past word 1. */
static void check_poison(const char* call, void* p, size_t usable) {
  const unsigned char* c = (const unsigned char*)p;
  for (size_t i = 2 * sizeof(uintptr_t); i < usable; i++)
    if (c[i] != POISON) report_uaf(call, p, i);
}

static uintptr_t* size_word(void* p, size_t usable) {
  return (uintptr_t*)((char*)p + usable - sizeof(uintptr_t));
}

/* Usable bytes of the underlying block, or 0 if p is not a live block start. */
static size_t block_usable(void* p, uint8_t kind) {
  if (kind >= 1 && kind < KEEL_NUM_CLASSES) {
    bool exact;
    _keel_block_start(kind, p, &exact);
    return exact ? _keel_classes[kind].size : 0;
  }
  if (kind == KEEL_KIND_LARGE) return _keel_large_usable(p);
  if (kind == KEEL_KIND_HUGE) return _keel_huge_usable(p);
  return 0;
}

void* _keel_checked_alloc(size_t n, size_t align, bool zero) {
  checked_init();
  if (n > KEEL_MAX_ALLOC - TAIL) {
    _keel_prim_set_errno(_keel_prim_errno_enomem());
    return NULL;
  }
  char* p = (char*)_keel_alloc_any(n + TAIL, align, false, false);
  if (p == NULL) return NULL;
  uint8_t kind = keel_pagemap_get(p);
  size_t usable = block_usable(p, kind);
  /* A reused small block must still be fully poisoned: anything else is a write after
   * free (word 0 is excepted: the central list threads its link through it). */
  if (kind < KEEL_NUM_CLASSES && ((uintptr_t*)p)[1] == poison_mark) check_poison("malloc", p, usable);
  if (zero) memset(p, 0, n);
  else memset(p, 0xAA, n < 64 ? n : 64); /* never hand out the poison mark as data */
  memset(p + n, CANARY, usable - sizeof(uintptr_t) - n);
  *size_word(p, usable) = (uintptr_t)n ^ size_secret;
  return p;
}

/* The requested size of live block p, after checking its size word and canary. */
static size_t check_block(void* p, const char* call, uint8_t kind) {
  size_t usable = block_usable(p, kind);
  if (usable == 0) {
    if (kind == KEEL_KIND_FREED) _keel_misuse(call, "double free of pointer", p, NULL, 0);
    _keel_misuse(call, "invalid pointer", p, ": not the start of a block allocated by keel", 0);
  }
  if (kind < KEEL_NUM_CLASSES && ((uintptr_t*)p)[1] == poison_mark &&
      ((unsigned char*)p)[usable - 1] == POISON)
    _keel_misuse(call, "double free of pointer", p, NULL, 0);
  size_t n = *size_word(p, usable) ^ size_secret;
  if (n > usable - TAIL)
    _keel_misuse(call, "heap buffer overflow: the size word was overwritten in block", p, NULL,
                 usable - TAIL);
  unsigned char* c = (unsigned char*)p;
  for (size_t i = n; i < usable - sizeof(uintptr_t); i++)
    if (c[i] != CANARY) {
      char detail[96];
      keel_buf_t b = {detail, 0, sizeof detail};
      _keel_buf_str(&b, ": written ");
      _keel_buf_u64(&b, i - n + 1);
      _keel_buf_str(&b, " or more bytes past its end");
      _keel_misuse(call, "heap buffer overflow in block", p, detail, n);
    }
  return n;
}

size_t _keel_checked_usable(const void* p, const char* call) {
  return check_block((void*)p, call, keel_pagemap_get(p));
}

static void release(void* p) {
  uint8_t kind = keel_pagemap_get(p);
  ((void**)p)[0] = NULL;
  _keel_central_give(kind, p, 1); /* to its slab: the bitmap catches anything left */
}

void _keel_checked_free(void* p, const char* call) {
  checked_init();
  uint8_t kind = keel_pagemap_get(p);
  check_block(p, call, kind);
  if (kind == KEEL_KIND_LARGE) {
    _keel_large_free(p, call);
    return;
  }
  if (kind == KEEL_KIND_HUGE) {
    _keel_huge_free(p);
    return;
  }
  size_t usable = _keel_classes[kind].size;
  memset(p, POISON, usable);
  ((uintptr_t*)p)[1] = poison_mark;
  void* evicted = NULL;
  keel_lock(&q_lock);
  if (q_count == QUARANTINE_SLOTS || q_bytes + usable > QUARANTINE_BYTES) {
    evicted = quarantine[q_head];
    quarantine[q_head] = NULL;
    q_head = (q_head + 1) % QUARANTINE_SLOTS;
    q_count--;
    q_bytes -= _keel_classes[keel_pagemap_get(evicted)].size;
  }
  quarantine[(q_head + q_count) % QUARANTINE_SLOTS] = p;
  q_count++;
  q_bytes += usable;
  keel_unlock(&q_lock);
  if (evicted) {
    check_poison(call, evicted, _keel_classes[keel_pagemap_get(evicted)].size);
    release(evicted);
  }
}

void* _keel_checked_realloc(void* p, size_t n) {
  size_t old = check_block(p, "realloc", keel_pagemap_get(p));
  void* q = _keel_checked_alloc(n, 0, false);
  if (q == NULL) return NULL;
  memcpy(q, p, old < n ? old : n);
  _keel_checked_free(p, "realloc");
  return q;
}

uint64_t _keel_checked_quarantine_bytes(void) {
  keel_lock(&q_lock);
  uint64_t n = q_bytes;
  keel_unlock(&q_lock);
  return n;
}
