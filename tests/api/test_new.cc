// test_new.cc -- every replaceable operator new/delete form (C++17) against Keel.
//
// Encodes what libstdc++ + glibc do, and builds and passes against them too:
//   g++ -std=c++17 -O1 -fno-builtin -fsized-deallocation -faligned-new -Itests/harness
//       tests/api/test_new.cc -o /tmp/tn && /tmp/tn
// Facts relied on (libstdc++ 12):
//  - plain new returns memory aligned to __STDCPP_DEFAULT_NEW_ALIGNMENT__ (16) and
//    new(0) returns distinct non-null pointers;
//  - the throwing forms call the installed new_handler until it is uninstalled, then
//    throw std::bad_alloc; the nothrow forms do the same but return nullptr, also when
//    the handler itself throws bad_alloc;
//  - memory from operator new is malloc memory: malloc_usable_size() works on it.
// One libstdc++ 12 defect is NOT encoded: its aligned operator new rounds the size up to
// a multiple of the alignment without an overflow check, so operator new(SIZE_MAX,
// align_val_t(64)) returns a tiny block instead of throwing. The standard requires
// bad_alloc (nullptr for nothrow); Keel is held to that, and only the non-Keel build skips
// the sizes that wrap.
#include "test.h"

#include <malloc.h>

#include <cstddef>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

static size_t page_size;

template <typename T>
static T opaque(T v) {
  __asm__ __volatile__("" : "+r"(v));
  return v;
}

// Fills [p, p+n), checks the alignment and that the block is big enough.
static void use_block(const char* what, void* p, size_t n, size_t align) {
  if (!CHECK_MSG(p != nullptr, "%s(%zu) returned nullptr", what, n)) return;
  CHECK_MSG(reinterpret_cast<uintptr_t>(p) % align == 0, "%s(%zu) = %p not %zu-aligned", what,
            n, p, align);
  size_t us = malloc_usable_size(p);
  CHECK_MSG(us >= n, "%s(%zu): malloc_usable_size %zu", what, n, us);
  pattern_fill(p, n, n * 7 + align);
  size_t off = pattern_check(p, n, n * 7 + align);
  CHECK_MSG(off == SIZE_MAX, "%s(%zu): readback mismatch at %zu", what, n, off);
}

static const size_t kSizes[] = {0, 1, 8, 15, 16, 17, 100, 1000, 4096, 5000, 65536, 70000,
                                300000, size_t(1) << 20, (size_t(8) << 20) + 3};

static void test_plain_forms() {
  TEST_SECTION("operator new/delete, new[]/delete[], sized delete");
  const size_t A = __STDCPP_DEFAULT_NEW_ALIGNMENT__;
  for (size_t n : kSizes) {
    void* p = ::operator new(opaque(n));
    use_block("operator new", p, n, A);
    ::operator delete(p);

    p = ::operator new[](opaque(n));
    use_block("operator new[]", p, n, A);
    ::operator delete[](p);

    p = ::operator new(opaque(n));
    use_block("operator new", p, n, A);
    ::operator delete(p, n);  // sized

    p = ::operator new[](opaque(n));
    use_block("operator new[]", p, n, A);
    ::operator delete[](p, n);  // sized

    p = ::operator new(opaque(n), std::nothrow);
    use_block("operator new(nothrow)", p, n, A);
    ::operator delete(p, std::nothrow);

    p = ::operator new[](opaque(n), std::nothrow);
    use_block("operator new[](nothrow)", p, n, A);
    ::operator delete[](p, std::nothrow);
  }
  // Deleting nullptr is a no-op in every form.
  ::operator delete(opaque<void*>(nullptr));
  ::operator delete[](opaque<void*>(nullptr));
  ::operator delete(opaque<void*>(nullptr), size_t(0));
  ::operator delete[](opaque<void*>(nullptr), size_t(0));
  ::operator delete(opaque<void*>(nullptr), std::nothrow);
  ::operator delete[](opaque<void*>(nullptr), std::nothrow);
  ::operator delete(opaque<void*>(nullptr), std::align_val_t(64));
  ::operator delete[](opaque<void*>(nullptr), std::align_val_t(64));
  ::operator delete(opaque<void*>(nullptr), size_t(0), std::align_val_t(64));
  ::operator delete[](opaque<void*>(nullptr), size_t(0), std::align_val_t(64));
  ::operator delete(opaque<void*>(nullptr), std::align_val_t(64), std::nothrow);
  ::operator delete[](opaque<void*>(nullptr), std::align_val_t(64), std::nothrow);
  CHECK(true);

  // new(0) gives distinct pointers.
  enum { N = 256 };
  void* z[N];
  for (int i = 0; i < N; i++) z[i] = ::operator new(opaque(size_t(0)));
  int dup = 0;
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++) dup += z[i] == z[j];
  EXPECT_EQ_I(dup, 0);
  for (int i = 0; i < N; i++) ::operator delete(z[i], size_t(0));
}

static void test_aligned_forms() {
  TEST_SECTION("aligned operator new/delete (std::align_val_t), 16 .. 64 KiB");
  for (size_t a = 16; a <= 65536; a *= 2) {
    std::align_val_t al{a};
    size_t sizes[] = {1, a - 1, a, 3 * a + 5, 100000};
    for (size_t n : sizes) {
      void* p = ::operator new(opaque(n), al);
      use_block("operator new(align)", p, n, a);
      ::operator delete(p, al);

      p = ::operator new[](opaque(n), al);
      use_block("operator new[](align)", p, n, a);
      ::operator delete[](p, al);

      p = ::operator new(opaque(n), al);
      use_block("operator new(align)", p, n, a);
      ::operator delete(p, n, al);

      p = ::operator new[](opaque(n), al);
      use_block("operator new[](align)", p, n, a);
      ::operator delete[](p, n, al);

      p = ::operator new(opaque(n), al, std::nothrow);
      use_block("operator new(align, nothrow)", p, n, a);
      ::operator delete(p, al, std::nothrow);

      p = ::operator new[](opaque(n), al, std::nothrow);
      use_block("operator new[](align, nothrow)", p, n, a);
      ::operator delete[](p, al, std::nothrow);
    }
    // Several live at once with the same alignment: distinct, non-overlapping.
    enum { K = 8 };
    void* live[K];
    for (int i = 0; i < K; i++) {
      live[i] = ::operator new(opaque(a + 8), al);
      if (live[i]) pattern_fill(live[i], a + 8, a + size_t(i));
    }
    for (int i = 0; i < K; i++) {
      if (!live[i]) continue;
      CHECK_MSG(pattern_check(live[i], a + 8, a + size_t(i)) == SIZE_MAX,
                "aligned new(%zu, align %zu) block %d corrupted", a + 8, a, i);
      ::operator delete(live[i], a + 8, al);
    }
  }
}

// new-expressions: the compiler picks the forms (sized, aligned, array cookie).
struct alignas(64) Over64 {
  char c[100];
};
struct alignas(4096) OverPage {
  int v;
  OverPage() : v(42) {}
};
static int g_live;
struct WithDtor {  // non-trivial destructor: new[] stores an array cookie
  uint64_t x[3];
  WithDtor() : x{1, 2, 3} { g_live++; }
  ~WithDtor() { g_live--; }
};
struct alignas(256) AlignedWithDtor {
  uint64_t x;
  AlignedWithDtor() : x(7) { g_live++; }
  ~AlignedWithDtor() { g_live--; }
};

static void test_new_expressions() {
  TEST_SECTION("new-expressions (sized/aligned/array-cookie forms chosen by the compiler)");
  int* i = new int(5);
  CHECK(*i == 5);
  delete i;

  Over64* o = new Over64;
  EXPECT_ALIGNED(o, 64);
  memset(o->c, 1, sizeof o->c);
  delete o;

  Over64* oa = new Over64[opaque(size_t(17))];
  EXPECT_ALIGNED(oa, 64);
  for (int k = 0; k < 17; k++) memset(oa[k].c, k, sizeof oa[k].c);
  delete[] oa;

  OverPage* pg = new OverPage;
  EXPECT_ALIGNED(pg, 4096);
  EXPECT_EQ_I(pg->v, 42);
  delete pg;

  OverPage* pga = new OverPage[opaque(size_t(5))];
  EXPECT_ALIGNED(pga, 4096);
  for (int k = 0; k < 5; k++) EXPECT_EQ_I(pga[k].v, 42);
  delete[] pga;

  g_live = 0;
  WithDtor* w = new WithDtor[opaque(size_t(1000))];
  EXPECT_EQ_I(g_live, 1000);
  CHECK(w[999].x[2] == 3);
  delete[] w;
  EXPECT_EQ_I(g_live, 0);

  AlignedWithDtor* aw = new AlignedWithDtor[opaque(size_t(33))];
  EXPECT_ALIGNED(aw, 256);
  for (int k = 0; k < 33; k++) EXPECT_ALIGNED(&aw[k], 256);
  EXPECT_EQ_I(g_live, 33);
  delete[] aw;
  EXPECT_EQ_I(g_live, 0);

  AlignedWithDtor* one = new (std::nothrow) AlignedWithDtor;
  if (CHECK(one != nullptr)) {
    EXPECT_ALIGNED(one, 256);
    delete one;
  }

  // The standard library allocates through operator new too.
  std::vector<std::string> v;
  for (int k = 0; k < 5000; k++) v.push_back(std::string(size_t(k % 200), char('a' + k % 26)));
  size_t bad = 0;
  for (int k = 0; k < 5000; k++)
    bad += v[size_t(k)] != std::string(size_t(k % 200), char('a' + k % 26));
  EXPECT_EQ_U(bad, 0);
  std::map<int, std::unique_ptr<int[]>> m;
  for (int k = 0; k < 3000; k++) {
    m[k].reset(new int[size_t(k % 50 + 1)]);
    m[k][0] = k;
  }
  bad = 0;
  for (int k = 0; k < 3000; k++) bad += m[k][0] != k;
  EXPECT_EQ_U(bad, 0);
}

// ------------------------------------------------------------ failure paths --- */

static int g_handler_calls;
static int g_handler_limit;
static void throwing_handler() { throw std::bad_alloc(); }
static void counting_handler() {
  if (++g_handler_calls >= g_handler_limit) std::set_new_handler(nullptr);
}

template <typename F>
static void expect_bad_alloc(const char* what, F f) {
  bool threw = false, other = false;
  try {
    void* p = f();
    CHECK_MSG(false, "%s returned %p instead of throwing", what, p);
  } catch (const std::bad_alloc&) {
    threw = true;
  } catch (...) {
    other = true;
  }
  CHECK_MSG(threw, "%s did not throw std::bad_alloc%s", what, other ? " (threw something else)" : "");
}

static void test_impossible_sizes() {
  TEST_SECTION("impossible sizes: throwing forms throw std::bad_alloc, nothrow forms nullptr");
  const size_t huge[] = {SIZE_MAX, SIZE_MAX / 2, size_t(PTRDIFF_MAX) + 1, SIZE_MAX - 4095};
  for (size_t n : huge) {
    char what[96];
    void* p = ::operator new(opaque(n), std::nothrow);
    CHECK_MSG(p == nullptr, "operator new(%zu, nothrow) = %p", n, p);
    p = ::operator new[](opaque(n), std::nothrow);
    CHECK_MSG(p == nullptr, "operator new[](%zu, nothrow) = %p", n, p);
    snprintf(what, sizeof what, "operator new(%zu)", n);
    expect_bad_alloc(what, [n] { return ::operator new(opaque(n)); });
    snprintf(what, sizeof what, "operator new[](%zu)", n);
    expect_bad_alloc(what, [n] { return ::operator new[](opaque(n)); });
#ifndef KEEL_TESTING_KEEL
    if (n > SIZE_MAX - 65536) continue;  // libstdc++ 12 defect, see the top of the file
#endif
    p = ::operator new(opaque(n), std::align_val_t(64), std::nothrow);
    CHECK_MSG(p == nullptr, "operator new(%zu, align 64, nothrow) = %p", n, p);
    p = ::operator new[](opaque(n), std::align_val_t(4096), std::nothrow);
    CHECK_MSG(p == nullptr, "operator new[](%zu, align 4096, nothrow) = %p", n, p);
    snprintf(what, sizeof what, "operator new(%zu, align 64)", n);
    expect_bad_alloc(what, [n] { return ::operator new(opaque(n), std::align_val_t(64)); });
    snprintf(what, sizeof what, "operator new[](%zu, align 65536)", n);
    expect_bad_alloc(what,
                     [n] { return ::operator new[](opaque(n), std::align_val_t(65536)); });
  }
  // new-expressions.
  size_t n = opaque(SIZE_MAX / 2);
  char* c = new (std::nothrow) char[n];
  CHECK_MSG(c == nullptr, "new (std::nothrow) char[SIZE_MAX/2] = %p", (void*)c);
  delete[] c;
  expect_bad_alloc("new char[SIZE_MAX/2]", [n] { return (void*)new char[n]; });
  Over64* o = new (std::nothrow) Over64[opaque(SIZE_MAX / 256)];
  CHECK_MSG(o == nullptr, "new (std::nothrow) Over64[SIZE_MAX/256] = %p", (void*)o);
  delete[] o;
  expect_bad_alloc("new Over64[SIZE_MAX/256]",
                   [] { return (void*)new Over64[opaque(SIZE_MAX / 256)]; });

  // Still healthy afterwards.
  void* p = ::operator new(opaque(size_t(100)));
  use_block("operator new", p, 100, 16);
  ::operator delete(p, size_t(100));
}

static void test_new_handler() {
  TEST_SECTION("std::new_handler is called until it uninstalls itself");
  std::new_handler old = std::set_new_handler(nullptr);
  CHECK(old == nullptr);

  g_handler_calls = 0;
  g_handler_limit = 3;
  std::set_new_handler(counting_handler);
  expect_bad_alloc("operator new(SIZE_MAX) with new_handler",
                   [] { return ::operator new(opaque(SIZE_MAX)); });
  EXPECT_EQ_I(g_handler_calls, 3);

  g_handler_calls = 0;
  g_handler_limit = 2;
  std::set_new_handler(counting_handler);
  expect_bad_alloc("operator new(SIZE_MAX/2, align 128) with new_handler",
                   [] { return ::operator new(opaque(SIZE_MAX / 2), std::align_val_t(128)); });
  EXPECT_EQ_I(g_handler_calls, 2);

  g_handler_calls = 0;
  g_handler_limit = 4;
  std::set_new_handler(counting_handler);
  void* p = ::operator new(opaque(SIZE_MAX), std::nothrow);
  CHECK(p == nullptr);
  EXPECT_EQ_I(g_handler_calls, 4);

  g_handler_calls = 0;
  g_handler_limit = 2;
  std::set_new_handler(counting_handler);
  p = ::operator new[](opaque(SIZE_MAX / 2), std::align_val_t(256), std::nothrow);
  CHECK(p == nullptr);
  EXPECT_EQ_I(g_handler_calls, 2);

  // A handler may throw bad_alloc itself: the nothrow forms still return nullptr.
  std::set_new_handler(throwing_handler);
  CHECK(::operator new(opaque(SIZE_MAX), std::nothrow) == nullptr);
  CHECK(::operator new[](opaque(SIZE_MAX), std::nothrow) == nullptr);
  CHECK(::operator new(opaque(SIZE_MAX / 2), std::align_val_t(64), std::nothrow) == nullptr);
  CHECK(::operator new[](opaque(SIZE_MAX / 2), std::align_val_t(64), std::nothrow) == nullptr);
  expect_bad_alloc("operator new(SIZE_MAX) with a throwing new_handler",
                   [] { return ::operator new(opaque(SIZE_MAX)); });

  // A handler that is never needed is never called.
  g_handler_calls = 0;
  g_handler_limit = 1;
  std::set_new_handler(counting_handler);
  p = ::operator new(opaque(size_t(1000)));
  CHECK(p != nullptr);
  ::operator delete(p);
  EXPECT_EQ_I(g_handler_calls, 0);
  std::set_new_handler(nullptr);
}

#ifdef KEEL_TESTING_KEEL
static void test_new_is_keel() {
  TEST_SECTION("operator new is served by Keel");
  size_t big = size_t(32) << 20;
  keel_stats_t a = keel_stats_now();
  void* p = ::operator new(opaque(big));
  void* q = ::operator new[](opaque(big), std::align_val_t(4096));
  keel_stats_t b = keel_stats_now();
  CHECK_MSG(b.allocated >= a.allocated + 2 * big,
            "operator new(32 MiB) x2 moved keel allocated only %" PRIu64 " -> %" PRIu64,
            a.allocated, b.allocated);
  ::operator delete(p, big);
  ::operator delete[](q, std::align_val_t(4096));
  keel_stats_t c = keel_stats_now();
  CHECK_MSG(c.allocated + 2 * big <= b.allocated, "delete did not lower allocated: %" PRIu64
            " -> %" PRIu64, b.allocated, c.allocated);
}
#endif

int main() {
  page_size = size_t(sysconf(_SC_PAGESIZE));
  assert_keel_in_use();
#ifdef KEEL_TESTING_KEEL
  test_new_is_keel();
#endif
  test_plain_forms();
  test_aligned_forms();
  test_new_expressions();
  test_impossible_sizes();
  test_new_handler();
  return test_finish();
}
