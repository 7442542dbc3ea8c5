/* prim_linux.c -- Linux implementation of the platform contract (prim.h).
 * The only file in Keel that includes OS headers. */
#include "platform/prim.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <unwind.h>
#include <dlfcn.h>
#include <link.h>

/* Seldom called (meshing, statistics, profiles, THP policy): kept out of libkeel's first
 * code window, which holds what every process runs (src/hot_text.ld). */
#define PRIM_COLD __attribute__((cold, noinline))

extern char** environ;

/* -- memory -------------------------------------------------------------------------- */

static _Atomic long fail_maps; /* test hook: number of maps still to fail */

void _keel_prim_fail_maps(long count) { atomic_store(&fail_maps, count); }

static void* map_raw(void* hint, size_t size) {
  if (atomic_load_explicit(&fail_maps, memory_order_relaxed) > 0 &&
      atomic_fetch_sub(&fail_maps, 1) > 0) {
    errno = ENOMEM;
    return NULL;
  }
  /* MAP_NORESERVE: address space is not charged until touched, so large reservations
   * do not count against strict overcommit accounting before they are used. */
  void* p = mmap(hint, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void* _keel_prim_map(size_t size, size_t align, void* hint) {
  size_t page = _keel_prim_page_size();
  if (align < page) align = page;
  int saved = errno;
  void* p = map_raw(hint, size);
  if (p == NULL) return NULL;
  if (((uintptr_t)p & (align - 1)) == 0) return p;
  /* Not aligned: map a larger range and trim both ends. */
  munmap(p, size);
  if (size + align < size) { errno = ENOMEM; return NULL; }
  p = map_raw(NULL, size + align);
  if (p == NULL) return NULL;
  uintptr_t start = (uintptr_t)p, aligned = (start + align - 1) & ~(uintptr_t)(align - 1);
  if (aligned > start) munmap(p, aligned - start);
  uintptr_t end = start + size + align, aligned_end = aligned + size;
  if (end > aligned_end) munmap((void*)aligned_end, end - aligned_end);
  errno = saved;
  return (void*)aligned;
}

void* _keel_prim_reserve_zero(size_t size) {
  int saved = errno;
  /* Read-only private memory is never charged to the commit limit, even under strict
   * overcommit; reads are served by the kernel's zero page. No huge pages: the map is
   * written sparsely and a 2 MiB page per written slice would be pure waste. */
  void* p = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) madvise(p, size, MADV_NOHUGEPAGE);
  errno = saved;
  return p == MAP_FAILED ? NULL : p;
}

void _keel_prim_unmap(void* addr, size_t size) {
  int saved = errno;
  munmap(addr, size);
  errno = saved;
}

bool _keel_prim_purge(void* addr, size_t size) {
  int saved = errno;
  /* MADV_DONTNEED, not MADV_FREE: the RSS drop must be visible now, not only under
   * memory pressure, and the pages must read as zero on reuse (calloc relies on it). */
  bool ok = madvise(addr, size, MADV_DONTNEED) == 0;
  errno = saved;
  return ok;
}

void* _keel_prim_remap(void* addr, size_t old_size, size_t new_size, bool may_move) {
  int saved = errno;
  void* p = mremap(addr, old_size, new_size, may_move ? MREMAP_MAYMOVE : 0);
  errno = saved;
  return p == MAP_FAILED ? NULL : p;
}

bool _keel_prim_move(void* from, size_t size, void* to) {
  int saved = errno;
  void* p = mremap(from, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, to);
  errno = saved;
  return p == to;
}

/* Builds a two-page range out of two mappings that cannot merge (each has had a page
 * written, so each has its own reverse-map root) and tries to move it. */
static bool probe_move_spans(void) {
  size_t pg = _keel_prim_page_size();
  int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
  char* a = mmap(NULL, 2 * pg, prot, flags, -1, 0);
  char* b = mmap(NULL, pg, prot, flags, -1, 0);
  char* c = mmap(NULL, 2 * pg, prot, flags, -1, 0);
  bool ok = false;
  if (a != MAP_FAILED && b != MAP_FAILED && c != MAP_FAILED) {
    a[0] = 1;
    b[0] = 2;
    if (_keel_prim_move(b, pg, a + pg)) {
      b = MAP_FAILED; /* moved away */
      ok = _keel_prim_move(a, 2 * pg, c) && c[0] == 1 && c[pg] == 2;
      if (ok) a = MAP_FAILED;
    }
  }
  if (a != MAP_FAILED) munmap(a, 2 * pg);
  if (b != MAP_FAILED) munmap(b, pg);
  if (c != MAP_FAILED) munmap(c, 2 * pg);
  return ok;
}

/* In .text, not cold: a busy process asks on its first huge block from the cache, and
 * the purger's huge-page promotion reads residency every tick (tests/override's
 * idle_rss checks that a busy process runs no cold code). */
bool _keel_prim_move_spans_mappings(void) {
  static int known; /* 0: not probed, 1: yes, 2: no; a race only probes twice */
  int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
  if (k == 0) {
    int saved = errno;
    k = probe_move_spans() ? 1 : 2;
    errno = saved;
    __atomic_store_n(&known, k, __ATOMIC_RELAXED);
  }
  return k == 1;
}

bool _keel_prim_protect(void* addr, size_t size, bool accessible) {
  int saved = errno;
  bool ok = mprotect(addr, size, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) == 0;
  errno = saved;
  return ok;
}

void _keel_prim_thp_advise(void* addr, size_t size, int advice) {
  if (advice == 0) return;
  int saved = errno;
  madvise(addr, size, advice > 0 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  errno = saved;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

bool _keel_prim_thp_collapse(void* addr, size_t size) {
  int saved = errno;
  bool ok = madvise(addr, size, MADV_COLLAPSE) == 0;
  errno = saved;
  return ok;
}

size_t _keel_prim_resident_pages(void* addr, size_t size) {
  unsigned char vec[4096]; /* one byte a page: 16 MiB of 4 KiB pages a call */
  size_t page = _keel_prim_page_size(), pages = size / page, resident = 0;
  if (size > ((size_t)64 << 20)) return SIZE_MAX;
  int saved = errno;
  for (size_t done = 0; done < pages;) {
    size_t n = pages - done < sizeof vec ? pages - done : sizeof vec;
    if (mincore((char*)addr + done * page, n * page, vec) != 0) {
      errno = saved;
      return SIZE_MAX;
    }
    for (size_t i = 0; i < n; i++) resident += vec[i] & 1;
    done += n;
  }
  errno = saved;
  return resident;
}

static size_t page_size_cache;
static size_t huge_size_cache = (size_t)-1;

size_t _keel_prim_page_size(void) {
  size_t p = page_size_cache;
  if (p == 0) {
    p = (size_t)getauxval(AT_PAGESZ); /* no allocation, valid before libc init */
    if (p == 0) p = 4096;
    page_size_cache = p;
  }
  return p;
}

/* Reads a small text file into buf with plain syscalls (no stdio). */
/* Decimal or hexadecimal digits at *s (advanced past them); UINT64_MAX if they name a
 * larger number. Inline: the purger's tick reads /proc through it, and its callers sit
 * in both halves of the text (src/hot_text.ld). */
static inline uint64_t parse_number(const char** s, unsigned base) {
  uint64_t v = 0;
  for (;; (*s)++) {
    char c = **s;
    unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 99;
    if (d >= base) return v;
    v = v > (UINT64_MAX - d) / base ? UINT64_MAX : v * base + d;
  }
}

static long read_small_file(const char* path, char* buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t got = 0;
  while (got + 1 < size) {
    ssize_t n = read(fd, buf + got, size - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  buf[got] = 0;
  return (long)got;
}

size_t _keel_prim_huge_page_size(void) {
  if (huge_size_cache != (size_t)-1) return huge_size_cache;
  int saved = errno;
  char buf[64];
  size_t v = 0;
  if (read_small_file("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", buf, sizeof buf) > 0) {
    const char* s = buf;
    v = (size_t)parse_number(&s, 10);
  }
  errno = saved;
  huge_size_cache = v;
  return v;
}

static int thp_mode_cache = -1;

/* Not cold: every new chunk and every purger tick asks (the file is read once). */
int _keel_prim_thp_machine_mode(void) {
  if (thp_mode_cache >= 0) return thp_mode_cache;
  int saved = errno;
  char buf[128];
  int mode = 0; /* the selected word is in brackets: "always [madvise] never" */
  if (read_small_file("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof buf) > 0) {
    if (strstr(buf, "[always]")) mode = 2;
    else if (strstr(buf, "[madvise]")) mode = 1;
  }
  errno = saved;
  thp_mode_cache = mode;
  return mode;
}

/* -- time, randomness, identity ------------------------------------------------------- */

uint64_t _keel_prim_clock_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t _keel_prim_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t _keel_prim_random(void) {
  uint64_t v = 0;
  int saved = errno;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
    /* Early boot or seccomp: fall back to the kernel's per-process AT_RANDOM bytes
     * mixed with the clock and an address (ASLR). */
    const uint64_t* r = (const uint64_t*)getauxval(AT_RANDOM);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    v = (r ? r[0] ^ r[1] : 0) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)(uintptr_t)&v << 16);
  }
  errno = saved;
  return v;
}

int _keel_prim_getpid(void) { return (int)getpid(); }

/* -- environment and output ------------------------------------------------------------ */

/* entry's value's length if it sets name (its first `size` - 1 bytes copied), else -1;
 * whole: the entry is not cut short (a cut one is only known to be longer). */
static long copy_value(const char* entry, size_t whole, const char* name, char* buf, size_t size) {
  size_t n = strlen(name);
  if (strncmp(entry, name, n) != 0 || entry[n] != '=') return -1;
  const char* v = entry + n + 1;
  size_t len = strlen(v), copied = len < size ? len : size - 1;
  memcpy(buf, v, copied);
  buf[copied] = 0;
  return (long)(whole > n + 1 + len ? whole - n - 1 : len);
}

long _keel_prim_getenv(const char* name, char* buf, size_t size) {
  if (size == 0) return -1;
  if (environ != NULL) {
    for (char** e = environ; *e != NULL; e++) {
      long len = copy_value(*e, 0, name, buf, size);
      if (len >= 0) return len;
    }
    return -1;
  }
  /* Called before libc set up environ (from the dynamic loader): read the initial
   * environment from /proc. An entry longer than the buffer below is cut short. */
  int saved = errno;
  int fd = open("/proc/self/environ", O_RDONLY | O_CLOEXEC);
  long found = -1;
  if (fd >= 0) {
    char chunk[4096];
    char entry[512];
    size_t elen = 0;
    ssize_t n;
    while (found < 0) {
      n = read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue; /* a signal must not hide an option */
      if (n <= 0) break;
      for (ssize_t i = 0; i < n && found < 0; i++) {
        if (chunk[i] == 0) {
          entry[elen < sizeof entry ? elen : sizeof entry - 1] = 0;
          found = copy_value(entry, elen, name, buf, size);
          elen = 0;
        } else {
          if (elen < sizeof entry) entry[elen] = chunk[i];
          elen++;
        }
      }
    }
    close(fd);
  }
  errno = saved;
  return found;
}

void _keel_prim_write(int fd, const char* buf, size_t len) {
  int saved = errno;
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf += n;
    len -= (size_t)n;
  }
  errno = saved;
}

_Noreturn void _keel_prim_abort(void) { abort(); }

void _keel_prim_set_errno(int err) { errno = err; }
int _keel_prim_errno_enomem(void) { return ENOMEM; }
int _keel_prim_errno_einval(void) { return EINVAL; }

/* -- threads --------------------------------------------------------------------------- */

static struct timespec ms_timespec(uint64_t ms) {
  return (struct timespec){(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
}

static void futex_wait(volatile uint32_t* addr, uint32_t expected, const struct timespec* timeout) {
  int saved = errno;
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, timeout, NULL, 0);
  errno = saved;
}

void _keel_prim_futex_wait(volatile uint32_t* addr, uint32_t expected) { futex_wait(addr, expected, NULL); }

void _keel_prim_futex_wait_ms(volatile uint32_t* addr, uint32_t expected, uint64_t ms) {
  struct timespec ts = ms_timespec(ms);
  futex_wait(addr, expected, &ts);
}

void _keel_prim_futex_wake(volatile uint32_t* addr, int n) {
  int saved = errno;
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
  errno = saved;
}

void _keel_prim_yield(void) { sched_yield(); }

static _Atomic int barrier_state; /* 0 not registered (yet), 1 registered, 2 unavailable */

bool _keel_prim_barrier_refused(void) { return atomic_load_explicit(&barrier_state, memory_order_relaxed) == 2; }

bool _keel_prim_barrier_all_threads(void) {
  int saved = errno;
  bool ok = false;
  for (int tries = 0; tries < 2 && !ok; tries++) {
    int s = atomic_load_explicit(&barrier_state, memory_order_relaxed);
    if (s == 2) break;
    if (s == 0) { /* also after a fork or an exec: the kernel asks for it again (EPERM) */
      if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0) {
        atomic_store_explicit(&barrier_state, 2, memory_order_relaxed);
        break;
      }
      atomic_store_explicit(&barrier_state, 1, memory_order_relaxed);
    }
    ok = syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
    if (!ok) atomic_store_explicit(&barrier_state, errno == EPERM ? 0 : 2, memory_order_relaxed);
  }
  errno = saved;
  return ok;
}

static pthread_key_t exit_key;
static _Atomic int exit_key_state; /* 0 none, 1 creating, 2 ready, 3 failed */

bool _keel_prim_thread_exit_init(void (*on_exit)(void* value)) {
  int s = atomic_load(&exit_key_state);
  if (s == 2) return true;
  if (s == 3) return false;
  int expected = 0;
  if (atomic_compare_exchange_strong(&exit_key_state, &expected, 1)) {
    /* pthread_key_create does not allocate: safe inside malloc. */
    atomic_store(&exit_key_state, pthread_key_create(&exit_key, on_exit) == 0 ? 2 : 3);
  }
  while ((s = atomic_load(&exit_key_state)) == 1) sched_yield();
  return s == 2;
}

void _keel_prim_thread_bind(void* value) {
  /* Keys below PTHREAD_KEY_2NDLEVEL_SIZE (32) are stored inline: no allocation. */
  if (atomic_load(&exit_key_state) == 2) pthread_setspecific(exit_key, value);
}

void _keel_prim_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void)) {
  pthread_atfork(prepare, parent, child);
}

/* The helper's stack is ours, not glibc's: a forked child forgets threads on stacks
 * the program supplied (glibc keeps only its own stacks, for reuse), so the child can
 * unmap the dead helper's pages. On a stack from glibc's cache they stay mapped, and
 * every child of a process-per-connection server holds them: 8 KiB of RssAnon in each
 * PostgreSQL backend. HELPER_STACK leaves glibc room for the static TLS it puts at the
 * top (it refuses with EINVAL when the rest would be under 16 KiB; then the helper
 * gets a stack from glibc as before). The pages are touched only as used. */
#define HELPER_STACK (128u * 1024)
static void* helper_stack; /* the mapping (guard page first), NULL: none of ours */

static int create_helper(void* (*fn)(void*), void* arg, bool own_stack) {
  pthread_attr_t attr;
  pthread_t tid;
  if (pthread_attr_init(&attr) != 0) return EAGAIN;
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  size_t pg = _keel_prim_page_size();
  char* map = NULL;
  if (own_stack) {
    map = mmap(NULL, HELPER_STACK + pg, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (map == MAP_FAILED || mprotect(map, pg, PROT_NONE) != 0 || /* the guard page */
        pthread_attr_setstack(&attr, map + pg, HELPER_STACK) != 0) {
      if (map != MAP_FAILED) munmap(map, HELPER_STACK + pg);
      pthread_attr_destroy(&attr);
      return EINVAL;
    }
  } else {
    pthread_attr_setstacksize(&attr, 64 * 1024);
  }
  /* The helper must not receive the application's signals. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&tid, &attr, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (map != NULL) {
    if (rc == 0)
      helper_stack = map;
    else
      munmap(map, HELPER_STACK + pg);
  }
  return rc;
}

bool _keel_prim_thread_start(void* (*fn)(void*), void* arg) {
  int rc = create_helper(fn, arg, true);
  if (rc == EINVAL) rc = create_helper(fn, arg, false);
  return rc == 0;
}

void _keel_prim_thread_forget_after_fork(void) {
  if (helper_stack == NULL) return;
  munmap(helper_stack, HELPER_STACK + _keel_prim_page_size());
  helper_stack = NULL;
}

void _keel_prim_sleep_ms(uint64_t ms) {
  struct timespec ts = ms_timespec(ms);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* -- faults ----------------------------------------------------------------------------- */

static void (*fault_callback)(void* addr);

static void set_default_action(int sig) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
}

/* Async-signal-safe: sigaction and raise are, and the callback must be. The signal is
 * blocked while this runs (no SA_NODEFER), so a fault inside the callback ends the
 * process with the default action. */
PRIM_COLD static void on_fault_signal(int sig, siginfo_t* si, void* context) {
  (void)context;
  int saved = errno;
  bool from_kernel = si != NULL && si->si_code > 0; /* not kill, raise or sigqueue */
  void (*cb)(void*) = __atomic_load_n(&fault_callback, __ATOMIC_ACQUIRE);
  if (from_kernel && cb != NULL) cb(si->si_addr); /* returns only if not Keel's fault */
  set_default_action(sig);
  /* A real fault happens again when the access is retried; a sent signal has to be sent
   * again (it stays pending until this handler returns). */
  if (!from_kernel) raise(sig);
  errno = saved;
}

PRIM_COLD bool _keel_prim_fault_handler_install(void (*on_fault)(void* addr)) {
  int saved = errno;
  __atomic_store_n(&fault_callback, on_fault, __ATOMIC_RELEASE);
  bool any = false;
  static const int sigs[] = {SIGSEGV, SIGBUS};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    if (sigaction(sigs[i], NULL, &old) != 0) continue;
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue; /* the program's */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sigs[i], &sa, NULL) == 0) any = true;
  }
  errno = saved;
  return any;
}

/* -- publishing ------------------------------------------------------------------------ */

static const char SHM_DIR[] = "/dev/shm/"; /* where published files live */

static void shm_path(char* out, size_t cap, const char* name) {
  size_t n = 0;
  for (const char* s = SHM_DIR; *s && n + 1 < cap; s++) out[n++] = *s;
  for (const char* s = name; *s && n + 1 < cap; s++) out[n++] = *s;
  out[n] = 0;
}

void* _keel_prim_publish_create(const char* name, size_t size) {
  char path[128];
  shm_path(path, sizeof path, name);
  int saved = errno;
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) { /* left by a dead process with the same pid */
    unlink(path);
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  }
  void* p = NULL;
  if (fd >= 0) {
    if (ftruncate(fd, (off_t)size) == 0) {
      p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) p = NULL;
    }
    close(fd);
    if (p == NULL) unlink(path);
  }
  errno = saved;
  return p;
}

void _keel_prim_publish_remove(const char* name) {
  char path[128];
  shm_path(path, sizeof path, name);
  int saved = errno;
  unlink(path);
  errno = saved;
}

/* getdents64 straight into a stack buffer: opendir would allocate (it may run inside
 * malloc's purger, which must not). A pid is taken as ended when kill(pid, 0) says no
 * such process; a process in another pid namespace sharing this /dev/shm would look
 * ended, hence the owner test (a container's user is rarely the host's). */
static bool publish_file_mapped(int dir, const char* name, int pid);

void _keel_prim_publish_sweep(const char* prefix) {
  int saved = errno;
  int dir = open(SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  size_t plen = strlen(prefix);
  char buf[1024] __attribute__((aligned(8))); /* small: it is on the purger's stack */
  for (;;) {
    long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      struct {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[];
      }* d = (void*)(buf + off);
      off += d->reclen;
      if (strncmp(d->name, prefix, plen) != 0 || d->name[plen] == 0) continue;
      const char* c = d->name + plen;
      uint64_t pid = parse_number(&c, 10);
      if (*c != 0 || pid == 0 || pid >= (1u << 30)) continue;
      bool alive = kill((pid_t)pid, 0) == 0 || errno != ESRCH;
      struct stat st;
      if (fstatat(dir, d->name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != geteuid() ||
          !S_ISREG(st.st_mode))
        continue;
      /* A live pid keeps its file while it maps it: not once it exec'd a program without
       * Keel, nor a new process that got the number. A file made in the last seconds may
       * not be mapped yet. */
      if (alive && (time(NULL) - st.st_mtime <= 5 || publish_file_mapped(dir, d->name, (int)pid))) continue;
      unlinkat(dir, d->name, 0);
    }
  }
  close(dir);
  errno = saved;
}

/* -- stacks and files ------------------------------------------------------------------ */

typedef struct {
  void** out;
  int max, n, skip;
} trace_state;

static _Unwind_Reason_Code trace_one(struct _Unwind_Context* ctx, void* arg) {
  trace_state* st = (trace_state*)arg;
  uintptr_t ip = _Unwind_GetIP(ctx);
  if (ip == 0) return _URC_END_OF_STACK;
  if (st->skip > 0) {
    st->skip--;
    return _URC_NO_REASON;
  }
  if (st->n >= st->max) return _URC_END_OF_STACK;
  st->out[st->n++] = (void*)ip;
  return _URC_NO_REASON;
}

int _keel_prim_backtrace(void** out, int max, int skip) {
  /* libgcc's unwinder, linked statically into libkeel (libgcc_eh): it finds frames
   * through .eh_frame, so programs built without frame pointers are walked correctly,
   * and it does not allocate. */
  trace_state st = {out, max, 0, skip + 1};
  int saved = errno;
  _Unwind_Backtrace(trace_one, &st);
  errno = saved;
  return st.n;
}

int _keel_prim_open_write(const char* path) {
  int saved = errno;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  errno = saved;
  return fd;
}

void _keel_prim_close(int fd) {
  int saved = errno;
  if (fd >= 0) close(fd);
  errno = saved;
}

PRIM_COLD void _keel_prim_copy_file(const char* path, int fd) {
  int saved = errno;
  int in = open(path, O_RDONLY | O_CLOEXEC);
  if (in >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0) _keel_prim_write(fd, buf, (size_t)n);
    close(in);
  }
  errno = saved;
}

typedef struct {
  uintptr_t addr, lo, hi;
  bool found;
} range_query;

static int range_cb(struct dl_phdr_info* info, size_t size, void* arg) {
  (void)size;
  range_query* q = (range_query*)arg;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (q->addr >= lo && q->addr < hi) {
      q->lo = lo;
      q->hi = hi;
      q->found = true;
      return 1;
    }
  }
  return 0;
}

bool _keel_prim_code_range(const void* addr, uintptr_t* lo, uintptr_t* hi) {
  range_query q = {(uintptr_t)addr, 0, 0, false};
  int saved = errno;
  dl_iterate_phdr(range_cb, &q);
  errno = saved;
  *lo = q.lo;
  *hi = q.hi;
  return q.found;
}

PRIM_COLD bool _keel_prim_symbolize(const void* addr, char* buf, size_t size) {
  Dl_info info;
  int saved = errno;
  int ok = dladdr(addr, &info);
  errno = saved;
  if (!ok || size < 8) return false;
  const char* name = info.dli_sname ? info.dli_sname : "??";
  uintptr_t base = info.dli_sname ? (uintptr_t)info.dli_saddr : (uintptr_t)info.dli_fbase;
  size_t n = 0;
  for (const char* c = name; *c && n + 24 < size; c++) buf[n++] = *c;
  buf[n++] = '+';
  buf[n++] = '0';
  buf[n++] = 'x';
  uintptr_t off = (uintptr_t)addr - base;
  char hex[17];
  int h = 0;
  do {
    hex[h++] = "0123456789abcdef"[off & 15];
    off >>= 4;
  } while (off && h < 16);
  while (h > 0 && n + 1 < size) buf[n++] = hex[--h];
  buf[n] = 0;
  return true;
}

int _keel_prim_thread_count(void) {
  char buf[1024];
  int saved = errno;
  long n = read_small_file("/proc/self/stat", buf, sizeof buf);
  errno = saved;
  if (n <= 0) return 0;
  /* Field 20 is num_threads; the command name (field 2) may hold spaces, so count from
   * the last ')'. */
  char* p = strrchr(buf, ')');
  if (p == NULL || p[1] != ' ') return 0;
  /* Field 3: the main thread's state; 'Z' once it ended with pthread_exit (the process
   * lives on, and still counts it, until its other threads end). */
  bool main_gone = p[2] == 'Z';
  int field = 2;
  for (; *p && field < 20; p++)
    if (*p == ' ') field++;
  const char* c = p;
  uint64_t threads = parse_number(&c, 10);
  int v = threads > INT32_MAX ? INT32_MAX : (int)threads;
  return main_gone && v > 0 ? v - 1 : v;
}

static unsigned affinity_count(long tid) {
  uint64_t mask[16]; /* 1,024 processors */
  long n = syscall(SYS_sched_getaffinity, tid, sizeof mask, mask);
  unsigned count = 0;
  for (long i = 0; i < n / 8; i++) count += (unsigned)__builtin_popcountll(mask[i]);
  return count;
}

/* The main thread's processors as well as the caller's: a worker pinned to one
 * processor (a server's, or a test's) is not the process. */
unsigned _keel_prim_cpu_count(void) {
  unsigned own = affinity_count(0), main = affinity_count(syscall(SYS_getpid));
  unsigned count = own > main ? own : main;
  return count ? count : 1;
}

/* glibc 2.35+ registers rseq for every thread and exports where its area lies; weak, so
 * that libkeel still loads where the symbols are absent. __rseq_size is 0 where the
 * registration failed or was turned off (glibc.pthread.rseq=0). */
extern const ptrdiff_t __rseq_offset __attribute__((weak));
extern const unsigned int __rseq_size __attribute__((weak));

unsigned _keel_prim_current_cpu(void) {
  if (&__rseq_size != NULL && __rseq_size != 0) {
    /* struct rseq: cpu_id_start, then cpu_id (negative until registered) */
    int32_t cpu = __atomic_load_n((const int32_t*)((char*)__builtin_thread_pointer() + __rseq_offset + 4),
                                  __ATOMIC_RELAXED);
    if (cpu >= 0) return (unsigned)cpu;
  }
  static unsigned next;
  static _Thread_local unsigned mine;
  if (mine == 0) mine = __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
  return mine - 1;
}

_Noreturn void _keel_prim_exit(int status) { exit(status); }

/* ---- shared pages and write barriers (meshing) -------------------------------------- */

int _keel_prim_file_create(uint64_t size) {
  int saved = errno;
  /* Under a smaller file-size limit (ulimit -f) ftruncate would raise SIGXFSZ, which
   * kills a program that does not block it. */
  struct rlimit fsize;
  if (getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY && fsize.rlim_cur < size) return -1;
  int fd = (int)syscall(SYS_memfd_create, "keel-mesh", MFD_CLOEXEC);
  if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    fd = -1;
  }
  errno = saved;
  return fd;
}

bool _keel_prim_file_write(int fd, uint64_t off, const void* buf, size_t len) {
  int saved = errno;
  const char* p = (const char*)buf;
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n;
    off += (uint64_t)n;
    len -= (size_t)n;
  }
  errno = saved;
  return len == 0;
}

bool _keel_prim_file_release(int fd, uint64_t off, uint64_t len) {
  int saved = errno;
  bool ok = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) == 0;
  errno = saved;
  return ok;
}

uint64_t _keel_prim_file_resident(int fd) {
  int saved = errno;
  struct stat st;
  uint64_t bytes = fstat(fd, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
  errno = saved;
  return bytes;
}

bool _keel_prim_map_view(void* addr, size_t len, int fd, uint64_t off) {
  int saved = errno;
  void* p = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, (off_t)off);
  errno = saved;
  return p == addr;
}

bool _keel_prim_map_fresh(void* addr, size_t len) {
  int saved = errno;
  void* p = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  errno = saved;
  return p == addr;
}

/* /proc/self/pagemap: one 64-bit entry per page; bit 63 present, bit 61 "file page or
 * shared anonymous" (a view still mapping its file page). */
PRIM_COLD bool _keel_prim_view_state(const void* addr, size_t pages, uint8_t* out) {
  int saved = errno;
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  bool ok = fd >= 0;
  size_t pg = _keel_prim_page_size();
  for (size_t i = 0; ok && i < pages; i += 64) {
    uint64_t e[64];
    size_t n = pages - i < 64 ? pages - i : 64;
    off_t at = (off_t)(((uintptr_t)addr / pg + i) * sizeof(uint64_t));
    ok = pread(fd, e, n * sizeof e[0], at) == (ssize_t)(n * sizeof e[0]);
    for (size_t j = 0; ok && j < n; j++)
      out[i + j] = !(e[j] >> 63 & 1) ? KEEL_VIEW_ABSENT : (e[j] >> 61 & 1) ? KEEL_VIEW_SHARED : KEEL_VIEW_PRIVATE;
  }
  if (fd >= 0) close(fd);
  errno = saved;
  return ok;
}

/* A userfaultfd that can write-protect. /dev/userfaultfd (Linux 6.1+) and the system
 * call without flags give one whose protection also holds for the kernel's own writes
 * into the range; only privileged processes (or vm.unprivileged_userfaultfd=1, or
 * access to /dev/userfaultfd) get those. UFFD_USER_MODE_ONLY (5.11+) is open to all. */
static int barrier_api(int fd) {
  struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP};
#ifdef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
  api.features |= UFFD_FEATURE_WP_HUGETLBFS_SHMEM; /* views can be armed too (5.19+) */
  if (ioctl(fd, UFFDIO_API, &api) == 0) return fd;
  /* A file descriptor takes UFFDIO_API once; a refused one needs a new descriptor. */
  return -2;
#else
  return ioctl(fd, UFFDIO_API, &api) == 0 ? fd : -1;
#endif
}

static int barrier_new(int flags, bool dev) {
  int fd = -1;
  if (dev) {
#ifdef USERFAULTFD_IOC_NEW
    int dfd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dfd >= 0) {
      fd = ioctl(dfd, USERFAULTFD_IOC_NEW, flags);
      close(dfd);
    }
#endif
  } else {
    fd = (int)syscall(SYS_userfaultfd, flags);
  }
  return fd;
}

PRIM_COLD static int barrier_try(int flags, bool dev) {
  int fd = barrier_new(flags, dev);
  if (fd < 0) return -1;
  int r = barrier_api(fd);
  if (r >= 0) return r;
  close(fd);
  if (r == -2) { /* retry without shared-memory protection */
    fd = barrier_new(flags, dev);
    if (fd < 0) return -1;
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP};
    if (ioctl(fd, UFFDIO_API, &api) == 0) return fd;
    close(fd);
  }
  return -1;
}

PRIM_COLD int _keel_prim_barrier_open(int* mode) {
  int saved = errno;
  int flags = O_CLOEXEC | O_NONBLOCK;
  *mode = KEEL_BARRIER_KERNEL;
  int fd = barrier_try(flags, true);
  if (fd < 0) fd = barrier_try(flags, false);
#ifdef UFFD_USER_MODE_ONLY
  if (fd < 0) {
    *mode = KEEL_BARRIER_USER;
    fd = barrier_try(flags | UFFD_USER_MODE_ONLY, false);
  }
#endif
  if (fd < 0) *mode = KEEL_BARRIER_NONE;
  errno = saved;
  return fd;
}

PRIM_COLD bool _keel_prim_barrier_arm(int barrier, void* addr, size_t len) {
  int saved = errno;
  /* Write protection holds only over pages present in the mapping: one never written
   * since it was trimmed would let a write through unseen. A read maps the zero page. */
  for (size_t off = 0, step = _keel_prim_page_size(); off < len; off += step)
    (void)*(volatile const char*)((const char*)addr + off);
  struct uffdio_register reg = {.range = {(uintptr_t)addr, len}, .mode = UFFDIO_REGISTER_MODE_WP};
  bool ok = ioctl(barrier, UFFDIO_REGISTER, &reg) == 0;
  if (ok) {
    struct uffdio_writeprotect wp = {.range = {(uintptr_t)addr, len}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    ok = ioctl(barrier, UFFDIO_WRITEPROTECT, &wp) == 0;
    if (!ok) ioctl(barrier, UFFDIO_UNREGISTER, &reg.range);
  }
  errno = saved;
  return ok;
}

bool _keel_prim_barrier_wake(int barrier, void* addr, size_t len) {
  int saved = errno;
  struct uffdio_range r = {(uintptr_t)addr, len};
  bool ok = ioctl(barrier, UFFDIO_WAKE, &r) == 0;
  errno = saved;
  return ok;
}

bool _keel_prim_barrier_disarm(int barrier, void* addr, size_t len) {
  int saved = errno;
  struct uffdio_writeprotect wp = {.range = {(uintptr_t)addr, len}, .mode = 0}; /* wakes too */
  bool ok = ioctl(barrier, UFFDIO_WRITEPROTECT, &wp) == 0;
  ok = ioctl(barrier, UFFDIO_UNREGISTER, &wp.range) == 0 && ok;
  errno = saved;
  return ok;
}

PRIM_COLD uint64_t _keel_prim_map_limit(void) {
  int saved = errno;
  char buf[32];
  long got = read_small_file("/proc/sys/vm/max_map_count", buf, sizeof buf);
  errno = saved;
  const char* c = buf;
  return got > 0 ? parse_number(&c, 10) : 0;
}

PRIM_COLD uint64_t _keel_prim_map_count(void) {
  int saved = errno;
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  uint64_t lines = 0;
  if (fd >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
      for (ssize_t i = 0; i < n; i++) lines += buf[i] == '\n';
    close(fd);
  }
  errno = saved;
  return lines;
}

PRIM_COLD bool _keel_prim_memory_locked(void) {
  int saved = errno;
  char buf[4096];
  long got = read_small_file("/proc/self/status", buf, sizeof buf);
  errno = saved;
  const char* p = got > 0 ? strstr(buf, "VmLck:") : NULL;
  if (p == NULL) return false;
  for (p += 6; *p == ' ' || *p == '\t'; p++) {}
  return *p >= '1' && *p <= '9';
}

uint64_t _keel_prim_fd_identity(int fd) {
  int saved = errno;
  struct stat st;
  uint64_t id = fd >= 0 && fstat(fd, &st) == 0 ? ((uint64_t)st.st_dev << 40) ^ (uint64_t)st.st_ino ^ 1 : 0;
  errno = saved;
  return id;
}

bool _keel_prim_pipe(int fds[2]) {
  int saved = errno;
  bool ok = pipe2(fds, O_CLOEXEC) == 0;
  if (ok) fcntl(fds[0], F_SETFL, O_NONBLOCK);
  if (ok) fcntl(fds[1], F_SETFL, O_NONBLOCK); /* a child never waits to write its pid */
  errno = saved;
  return ok;
}

PRIM_COLD long _keel_prim_pipe_read(int read_fd, void* buf, size_t n) {
  int saved = errno;
  ssize_t got;
  do got = read(read_fd, buf, n);
  while (got < 0 && errno == EINTR);
  errno = saved;
  return got < 0 ? -1 : (long)got;
}

PRIM_COLD void _keel_prim_pipe_write_pid(int write_fd) {
  int saved = errno;
  int32_t pid = (int32_t)getpid();
  ssize_t n;
  do n = write(write_fd, &pid, sizeof pid); /* 4 bytes: atomic on a pipe */
  while (n < 0 && errno == EINTR);
  errno = saved;
}

/* Whether a line of /proc/PID/maps ("start-end perms offset major:minor inode path")
 * maps the file of device dev, inode ino. */
PRIM_COLD static bool maps_line_is(const char* s, const char* end, dev_t dev, ino_t ino) {
  for (int field = 0; field < 3; field++) { /* past the range, perms and offset */
    while (s < end && *s != ' ') s++;
    while (s < end && *s == ' ') s++;
  }
  if (end - s < 5) return false;
  uint64_t dev_major = parse_number(&s, 16);
  if (*s++ != ':') return false;
  uint64_t dev_minor = parse_number(&s, 16);
  if (*s++ != ' ') return false;
  uint64_t inode = parse_number(&s, 10);
  return inode == (uint64_t)ino && dev_major == (uint64_t)major(dev) && dev_minor == (uint64_t)minor(dev);
}

/* Whether process pid maps the file `name` of directory dir. */
static bool publish_file_mapped(int dir, const char* name, int pid) {
  int fd = openat(dir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return true; /* (gone, or not ours to judge) */
  bool mapped = _keel_prim_process_maps(pid, fd);
  close(fd);
  return mapped;
}

PRIM_COLD bool _keel_prim_process_maps(int pid, int fd) {
  int saved = errno;
  struct stat st;
  char path[40] = "/proc/";
  size_t len = 6;
  char digits[12];
  size_t nd = 0;
  for (unsigned v = (unsigned)pid; nd == 0 || v != 0; v /= 10) digits[nd++] = (char)('0' + v % 10);
  while (nd > 0) path[len++] = digits[--nd];
  memcpy(path + len, "/maps", 6);
  int in = fstat(fd, &st) == 0 && pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
  bool found = false;
  char buf[4096];
  size_t have = 0;
  while (in >= 0 && !found) {
    ssize_t n = read(in, buf + have, sizeof buf - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += (size_t)n;
    const char* line = buf;
    for (const char* nl; !found && (nl = memchr(line, '\n', (size_t)(buf + have - line))) != NULL; line = nl + 1)
      found = maps_line_is(line, nl, st.st_dev, st.st_ino);
    have = (size_t)(buf + have - line); /* a line cut by the buffer's end waits for its rest */
    memmove(buf, line, have);
    if (have == sizeof buf) have = 0; /* (no line is that long) */
  }
  if (in >= 0) close(in);
  errno = saved;
  return found;
}
