// new.cc -- C++ operator new and delete, every form, mapped onto Keel's C entry points.
//
// Written without the C++ standard library so that libkeel.so does not depend on
// libstdc++: the few library facilities needed (the new-handler, throwing bad_alloc)
// are reached through weak references, present whenever a C++ program is running.
#include <stddef.h>

extern "C" {
void* malloc(size_t);
void free(void*);
void* memalign(size_t, size_t);
void free_sized(void*, size_t);
void* dlsym(void*, const char*);
}

namespace std {
struct nothrow_t;
enum class align_val_t : size_t {};
typedef void (*new_handler)();
new_handler get_new_handler() noexcept __attribute__((weak));
[[noreturn]] void __throw_bad_alloc() __attribute__((weak));
}  // namespace std

#define API __attribute__((visibility("default")))

namespace {

#define KEEL_RTLD_NEXT ((void*)-1l)

// A nothrow form whose allocation failed with a new-handler installed: the handler may
// throw bad_alloc, which the form must turn into nullptr, and this file has no
// exception support (no libstdc++). The C++ runtime's own nothrow form, `runtime` (its
// mangled name), does exactly that: it calls the throwing form (ours) in a try block.
__attribute__((cold, noinline)) void* runtime_nothrow(const char* runtime, size_t size, size_t align) {
  void* fn = dlsym(KEEL_RTLD_NEXT, runtime);
  if (fn == nullptr) return nullptr;
  const std::nothrow_t& tag = *reinterpret_cast<const std::nothrow_t*>(&fn); // (unread)
  if (align == 0) return reinterpret_cast<void* (*)(size_t, const std::nothrow_t&)>(fn)(size, tag);
  return reinterpret_cast<void* (*)(size_t, std::align_val_t, const std::nothrow_t&)>(fn)(
      size, static_cast<std::align_val_t>(align), tag);
}

// The standard's loop: on failure call the new-handler until it gives up; then throw
// (the nothrow forms return nullptr, through the runtime's if there is a handler).
__attribute__((cold, noinline)) void* new_failed(size_t size, size_t align, const char* nothrow) {
  if (nothrow != nullptr) {
    bool handler = std::get_new_handler && std::get_new_handler() != nullptr;
    return handler ? runtime_nothrow(nothrow, size, align) : nullptr;
  }
  for (;;) {
    std::new_handler h = std::get_new_handler ? std::get_new_handler() : nullptr;
    if (h == nullptr) break;
    h();  // may throw, may free memory
    void* p = align ? memalign(align, size) : malloc(size);
    if (p) return p;
  }
  if (std::__throw_bad_alloc) std::__throw_bad_alloc();
  __builtin_trap();  // no C++ runtime in the process: cannot throw
}

// nothrow: nullptr for the throwing forms, else the runtime's matching nothrow form.
inline void* do_new(size_t size, const char* nothrow) {
  void* p = malloc(size ? size : 1);
  if (__builtin_expect(p != nullptr, 1)) return p;
  return new_failed(size ? size : 1, 0, nothrow);
}

inline void* do_new_aligned(size_t size, std::align_val_t al, const char* nothrow) {
  size_t align = static_cast<size_t>(al);
  void* p = memalign(align, size ? size : 1);
  if (__builtin_expect(p != nullptr, 1)) return p;
  return new_failed(size ? size : 1, align, nothrow);
}

}  // namespace

API void* operator new(size_t n) { return do_new(n, nullptr); }
API void* operator new[](size_t n) { return do_new(n, nullptr); }
API void* operator new(size_t n, const std::nothrow_t&) noexcept { return do_new(n, "_ZnwmRKSt9nothrow_t"); }
API void* operator new[](size_t n, const std::nothrow_t&) noexcept { return do_new(n, "_ZnamRKSt9nothrow_t"); }
API void* operator new(size_t n, std::align_val_t a) { return do_new_aligned(n, a, nullptr); }
API void* operator new[](size_t n, std::align_val_t a) { return do_new_aligned(n, a, nullptr); }
API void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return do_new_aligned(n, a, "_ZnwmSt11align_val_tRKSt9nothrow_t");
}
API void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return do_new_aligned(n, a, "_ZnamSt11align_val_tRKSt9nothrow_t");
}

API void operator delete(void* p) noexcept { free(p); }
API void operator delete[](void* p) noexcept { free(p); }
API void operator delete(void* p, const std::nothrow_t&) noexcept { free(p); }
API void operator delete[](void* p, const std::nothrow_t&) noexcept { free(p); }
API void operator delete(void* p, size_t n) noexcept { free_sized(p, n); }
API void operator delete[](void* p, size_t n) noexcept { free_sized(p, n); }
API void operator delete(void* p, std::align_val_t) noexcept { free(p); }
API void operator delete[](void* p, std::align_val_t) noexcept { free(p); }
API void operator delete(void* p, size_t n, std::align_val_t) noexcept { free_sized(p, n); }
API void operator delete[](void* p, size_t n, std::align_val_t) noexcept { free_sized(p, n); }
API void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { free(p); }
API void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { free(p); }
