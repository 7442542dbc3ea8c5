/* keel_prefix.h -- the entry points of a KEEL_PREFIX build of libkeel (cmake
 * -DKEEL_PREFIX=ON): the same allocator exported as keel_malloc, keel_free, ... so that it
 * can live beside another malloc (ThreadSanitizer's, libFuzzer's). Used by the TSan test
 * (tests/sanitize) and the fuzzer (tests/fuzz). */
#ifndef KEEL_PREFIX_H
#define KEEL_PREFIX_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void* keel_malloc(size_t n);
void* keel_calloc(size_t count, size_t size);
void* keel_realloc(void* p, size_t n);
void* keel_reallocarray(void* p, size_t count, size_t size);
void keel_free(void* p);
void keel_free_sized(void* p, size_t size);
void keel_free_aligned_sized(void* p, size_t align, size_t size);
int keel_posix_memalign(void** out, size_t align, size_t n);
void* keel_aligned_alloc(size_t align, size_t n);
void* keel_memalign(size_t align, size_t n);
void* keel_valloc(size_t n);
void* keel_pvalloc(size_t n);
size_t keel_malloc_usable_size(void* p);

#ifdef __cplusplus
}
#endif
#endif
