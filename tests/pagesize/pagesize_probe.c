/* pagesize_probe.c -- what Keel commits and reserves, for a trivial program and per
 * parked thread, whatever the page size (issue 8: arm64 with 64 KiB pages and 512 MiB
 * huge pages, where jemalloc sized reservations by the huge page).
 *
 * The program does what a trivial program does (setlocale, a few small strings and a
 * buffer), takes a snapshot -- the "trivial program" figures -- then starts N threads
 * (default 256) with 256 KiB stacks, each of which allocates three small blocks
 * (24, 200 and 1500 bytes), writes them and parks. With all N parked it takes a second
 * snapshot; per thread = (second - first) / N. Then it releases and joins the threads.
 *
 * A snapshot holds
 *   committed, mapped, metadata   keel_stats_get(): what Keel itself has committed
 *                                 (not returned to the OS), mapped (address space for
 *                                 blocks) and uses for bookkeeping;
 *   keel_vm                       the address space Keel holds: the bytes of the mappings
 *                                 Keel made with mmap/mremap less those it unmapped,
 *                                 rounded to pages, writable ones only: Keel's one
 *                                 read-only reservation (the page map, which costs no
 *                                 memory until parts are made writable with mprotect,
 *                                 counted here then) is reported apart as keel_ro. This program defines mmap, munmap and
 *                                 mremap itself (forwarding to the system calls), so
 *                                 libkeel's calls -- and only those: glibc's own, e.g.
 *                                 for thread stacks, do not go through the symbol table --
 *                                 are counted. Same figure natively and under qemu;
 *   vsz                           the sum of the sizes of all mappings in /proc/self/maps:
 *                                 the process's virtual size as the program sees it.
 *                                 Under qemu-user that file is the emulated program's own
 *                                 view (qemu rewrites it), while /proc/self/status is
 *                                 qemu's (its VmSize includes the translator's code
 *                                 buffer and the host threads' stacks), so VmSize and
 *                                 VmRSS are printed too but only mean something natively.
 *                                 qemu 7.2's rewritten maps leave out some mappings when
 *                                 -p is larger than the host's page (the main stack, data
 *                                 segments), so under -p 16384/65536 vsz is a lower bound;
 *                                 the per-thread difference (thread stacks) is complete;
 *   vm_size, vm_rss               VmSize and VmRSS from /proc/self/status.
 * The thread stacks are glibc's, sized by the program (256 KiB here; glibc adds a guard
 * of one page, and at least 64 KiB on arm64), not Keel's: they are found in
 * /proc/self/maps (the mapping holding each parked thread's stack pointer and the
 * PROT_NONE guard right below it), reported apart, and vsz per thread is also given
 * without them.
 *
 * Usage: pagesize_probe [--threads N] [--json] [--check]
 *   --json   one JSON object on stdout (tests/pagesize/pagesize_results.py reads it)
 *   --check  checks the bounds below and ends with "N passed, M failed" (ctest)
 * The bounds hold for any page size from 4 to 64 KiB and any huge page size; the
 * relative targets (64 KiB pages against 4 KiB pages) are checked by
 * pagesize_results.py, which runs this program under each configuration.
 */
#include "test.h"

#include <keel.h>
#include <locale.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define THREAD_STACK (256 * KiB) /* a multiple of every page size up to 64 KiB */

/* Bounds for --check (per parked thread, and for the trivial program). */
#define MAX_THREAD_COMMITTED (64 * KiB)  /* a thread holding 1.7 KiB of blocks */
#define MAX_THREAD_MAPPED (256 * KiB)    /* Keel's address space per thread */
#define MAX_THREAD_VSZ_NOSTACK (2 * MiB) /* "never in huge-page units" */
#define MAX_TRIVIAL_COMMITTED (8 * MiB)
#define MAX_TRIVIAL_MAPPED (64 * MiB)
#define MAX_TRIVIAL_RESERVED_RO (4096 * MiB) /* the page map: 2^32 bytes whatever the page size */

typedef struct {
  uint64_t committed, mapped, metadata, retained, threads;
  uint64_t keel_vm, keel_ro, vsz, vm_size, vm_rss;
} snap_t;

/* ---- Keel's own mappings: mmap, munmap and mremap as seen by libkeel ------------- */

static _Atomic int64_t keel_vm_bytes, keel_ro_bytes;

static int64_t page_round(size_t n) {
  size_t page = (size_t)getauxval(AT_PAGESZ);
  if (page == 0) page = 4096;
  return (int64_t)((n + page - 1) & ~(page - 1));
}

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  if (r == -1) return MAP_FAILED;
  if (prot & PROT_WRITE) keel_vm_bytes += page_round(len);
  else keel_ro_bytes += page_round(len);
  return (void*)r;
}

int mprotect(void* addr, size_t len, int prot) {
  long r = syscall(SYS_mprotect, addr, len, prot);
  if (r == 0 && (prot & PROT_WRITE)) keel_vm_bytes += page_round(len);
  return (int)r;
}

int munmap(void* addr, size_t len) {
  long r = syscall(SYS_munmap, addr, len);
  if (r == 0) keel_vm_bytes -= page_round(len);
  return (int)r;
}

void* mremap(void* old, size_t old_len, size_t new_len, int flags, ...) {
  void* new_addr = NULL;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
  }
  long r = syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
  if (r == -1) return MAP_FAILED;
  keel_vm_bytes += page_round(new_len) - page_round(old_len);
  return (void*)r;
}

/* Reads a /proc file into a static buffer with plain system calls (no allocation, so
 * reading does not change what is measured). */
static char text[4 << 20];
static size_t read_proc(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t got = 0;
  for (;;) {
    ssize_t n = read(fd, text + got, sizeof text - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
    if (got == sizeof text - 1) break;
  }
  close(fd);
  text[got] = 0;
  return got;
}

/* The mappings of the last read of /proc/self/maps. */
#define MAX_MAPS 65536
static struct { uint64_t lo, hi; char perms[5]; char counted; } maps[MAX_MAPS];
static size_t nmaps;

static uint64_t maps_vsz(void) {
  size_t n = read_proc("/proc/self/maps");
  uint64_t total = 0;
  nmaps = 0;
  for (size_t i = 0; i < n;) {
    char* end;
    unsigned long long lo = strtoull(text + i, &end, 16);
    unsigned long long hi = (*end == '-') ? strtoull(end + 1, &end, 16) : lo;
    if (hi > lo) {
      total += hi - lo;
      if (nmaps < MAX_MAPS) {
        maps[nmaps].lo = lo, maps[nmaps].hi = hi, maps[nmaps].counted = 0;
        memcpy(maps[nmaps].perms, *end == ' ' ? end + 1 : "????", 4);
        maps[nmaps].perms[4] = 0;
        nmaps++;
      }
    }
    while (i < n && text[i] != '\n') i++;
    i++;
  }
  return total;
}

/* Bytes of the mappings (from the last maps_vsz()) holding the given stack addresses,
 * with the PROT_NONE guard mapping right below each. Each mapping counts once. */
static uint64_t stack_mappings(const uintptr_t* sps, long n) {
  uint64_t total = 0;
  for (long t = 0; t < n; t++) {
    for (size_t i = 0; i < nmaps; i++) {
      if (sps[t] < maps[i].lo || sps[t] >= maps[i].hi) continue;
      if (!maps[i].counted) total += maps[i].hi - maps[i].lo, maps[i].counted = 1;
      if (i > 0 && maps[i - 1].hi == maps[i].lo && maps[i - 1].perms[0] == '-' &&
          maps[i - 1].perms[1] == '-' && !maps[i - 1].counted)
        total += maps[i - 1].hi - maps[i - 1].lo, maps[i - 1].counted = 1;
      break;
    }
  }
  return total;
}

static uint64_t status_bytes(const char* key) {
  read_proc("/proc/self/status");
  size_t k = strlen(key);
  for (char* line = text; *line;) {
    if (strncmp(line, key, k) == 0 && line[k] == ':') return strtoull(line + k + 1, NULL, 10) * KiB;
    char* nl = strchr(line, '\n');
    if (!nl) break;
    line = nl + 1;
  }
  return 0;
}

static snap_t snapshot(void) {
  snap_t s = {0};
  keel_stats_t st;
  st.size = sizeof st;
  if (keel_stats_get(&st) == 0) {
    s.committed = st.committed;
    s.mapped = st.mapped;
    s.metadata = st.metadata;
    s.retained = st.retained;
    s.threads = st.threads;
  }
  s.keel_vm = (uint64_t)keel_vm_bytes;
  s.keel_ro = (uint64_t)keel_ro_bytes;
  s.vsz = maps_vsz();
  s.vm_size = status_bytes("VmSize");
  s.vm_rss = status_bytes("VmRSS");
  return s;
}

/* ---- parked threads ------------------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t arrived_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t release_cv = PTHREAD_COND_INITIALIZER;
static long arrived;
static int released;
#define MAX_THREADS 4096
static uintptr_t stack_ptrs[MAX_THREADS]; /* an address on each parked thread's stack */
static const size_t sizes[3] = {24, 200, 1500};

static void* parked(void* arg) {
  long id = (long)(intptr_t)arg;
  char* p[3];
  for (int i = 0; i < 3; i++) {
    p[i] = malloc(sizes[i]);
    if (p[i]) memset(p[i], (int)(id + i), sizes[i]);
  }
  char here;
  escape(&here);
  stack_ptrs[id] = (uintptr_t)&here;
  pthread_mutex_lock(&mu);
  arrived++;
  pthread_cond_signal(&arrived_cv);
  while (!released) pthread_cond_wait(&release_cv, &mu);
  pthread_mutex_unlock(&mu);
  int ok = 1;
  for (int i = 0; i < 3; i++) {
    if (!p[i]) { ok = 0; continue; }
    for (size_t j = 0; j < sizes[i]; j++) ok &= p[i][j] == (char)(id + i);
    free(p[i]);
  }
  return (void*)(intptr_t)ok;
}

static uint64_t parse_size(const char* s) {
  char* end;
  uint64_t v = strtoull(s, &end, 10);
  switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    default: break;
  }
  return v;
}

static int64_t per(uint64_t after, uint64_t before, long n) {
  return n > 0 ? ((int64_t)after - (int64_t)before) / n : 0;
}

int main(int argc, char** argv) {
  long nthreads = 256;
  int json = 0, check = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) nthreads = atol(argv[++i]);
    else if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--check") == 0) check = 1;
    else {
      fprintf(stderr, "usage: %s [--threads N] [--json] [--check]\n", argv[0]);
      return 2;
    }
  }
  if (nthreads < 1) nthreads = 1;
  if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;

  /* The trivial program. */
  setlocale(LC_ALL, "");
  char* name = strdup(argv[0]);
  char* home = strdup(getenv("HOME") ? getenv("HOME") : "/");
  char* buf = malloc(4096);
  memset(buf, 1, 4096);
  escape(name), escape(home), escape(buf);
  snap_t base = snapshot();

  keel_stats_t st;
  st.size = sizeof st;
  keel_stats_get(&st);
  uint64_t at_pagesz = getauxval(AT_PAGESZ);

  /* N parked threads. */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, THREAD_STACK);
  pthread_t* tids = calloc((size_t)nthreads, sizeof *tids);
  long started = 0;
  for (long i = 0; i < nthreads; i++) {
    if (pthread_create(&tids[i], &attr, parked, (void*)(intptr_t)i) != 0) break;
    started++;
  }
  pthread_attr_destroy(&attr);
  pthread_mutex_lock(&mu);
  while (arrived < started) pthread_cond_wait(&arrived_cv, &mu);
  pthread_mutex_unlock(&mu);
  /* (tids, 8 bytes per thread, is counted in the per-thread figures: noise.) */
  snap_t with = snapshot();
  uint64_t stacks = stack_mappings(stack_ptrs, started);
  uint64_t stack_bytes = started > 0 ? stacks / (uint64_t)started : 0;

  pthread_mutex_lock(&mu);
  released = 1;
  pthread_cond_broadcast(&release_cv);
  pthread_mutex_unlock(&mu);
  long intact = 0;
  for (long i = 0; i < started; i++) {
    void* r = NULL;
    pthread_join(tids[i], &r);
    intact += (intptr_t)r != 0;
  }
  free(tids);
  snap_t after = snapshot();

  int64_t t_committed = per(with.committed, base.committed, started);
  int64_t t_mapped = per(with.mapped, base.mapped, started);
  int64_t t_metadata = per(with.metadata, base.metadata, started);
  int64_t t_keel_vm = per(with.keel_vm, base.keel_vm, started);
  int64_t t_vsz = per(with.vsz, base.vsz, started);
  int64_t t_vsz_nostack = per(with.vsz - stacks, base.vsz, started);
  int64_t t_rss = per(with.vm_rss, base.vm_rss, started);

  if (json) {
    printf("{\"at_pagesz\": %" PRIu64 ", \"os_page_size\": %" PRIu64 ", \"huge_page_size\": %" PRIu64
           ", \"threads\": %ld, \"threads_started\": %ld, \"threads_intact\": %ld"
           ", \"keel_threads_parked\": %" PRIu64 ", \"stack_per_thread\": %" PRIu64 ",\n",
           at_pagesz, st.os_page_size, st.huge_page_size, nthreads, started, intact,
           with.threads, stack_bytes);
    const snap_t* ss[3] = {&base, &with, &after};
    const char* names[3] = {"trivial", "parked", "joined"};
    for (int i = 0; i < 3; i++)
      printf(" \"%s\": {\"committed\": %" PRIu64 ", \"mapped\": %" PRIu64 ", \"metadata\": %" PRIu64
             ", \"retained\": %" PRIu64 ", \"keel_vm\": %" PRIu64 ", \"keel_ro\": %" PRIu64
             ", \"vsz\": %" PRIu64 ", \"vm_size\": %" PRIu64 ", \"vm_rss\": %" PRIu64 "},\n",
             names[i], ss[i]->committed, ss[i]->mapped, ss[i]->metadata, ss[i]->retained,
             ss[i]->keel_vm, ss[i]->keel_ro, ss[i]->vsz, ss[i]->vm_size, ss[i]->vm_rss);
    printf(" \"per_thread\": {\"committed\": %" PRId64 ", \"mapped\": %" PRId64 ", \"metadata\": %" PRId64
           ", \"keel_vm\": %" PRId64 ", \"vsz\": %" PRId64 ", \"vsz_without_stack\": %" PRId64
           ", \"vm_rss\": %" PRId64 "}}\n",
           t_committed, t_mapped, t_metadata, t_keel_vm, t_vsz, t_vsz_nostack, t_rss);
  } else {
    printf("page size %" PRIu64 " (AT_PAGESZ %" PRIu64 "), huge page size Keel assumes %" PRIu64 "\n",
           st.os_page_size, at_pagesz, st.huge_page_size);
    printf("trivial program: committed %" PRIu64 ", mapped %" PRIu64 ", metadata %" PRIu64
           ", Keel's mappings %" PRIu64 " (and %" PRIu64 " reserved read-only), vsz %" PRIu64
           " (VmSize %" PRIu64 ", VmRSS %" PRIu64 ")\n",
           base.committed, base.mapped, base.metadata, base.keel_vm, base.keel_ro, base.vsz, base.vm_size,
           base.vm_rss);
    printf("%ld parked threads, per thread: committed %" PRId64 ", mapped %" PRId64
           ", metadata %" PRId64 ", Keel's mappings %" PRId64 ", vsz %" PRId64 " (%" PRId64
           " without its %" PRIu64 "-byte stack), VmRSS %" PRId64 "\n",
           started, t_committed, t_mapped, t_metadata, t_keel_vm, t_vsz, t_vsz_nostack,
           stack_bytes, t_rss);
  }
  free(name), free(home), free(buf);

  if (!check) return 0;
  CHECK_MSG(started == nthreads, "started %ld of %ld threads", started, nthreads);
  CHECK_MSG(intact == started, "%ld of %ld threads found their blocks intact", intact, started);
  EXPECT_EQ_U(st.os_page_size, at_pagesz);
  const char* env = getenv("KEEL_HUGE_PAGE_SIZE");
  if (env && *env) EXPECT_EQ_U(st.huge_page_size, parse_size(env));
  CHECK_MSG(with.threads >= (uint64_t)started, "Keel counts %" PRIu64 " thread caches with %ld threads parked",
            with.threads, started);
  CHECK_MSG(base.committed <= MAX_TRIVIAL_COMMITTED, "trivial program: committed %" PRIu64 " > %" PRIu64,
            base.committed, MAX_TRIVIAL_COMMITTED);
  CHECK_MSG(base.mapped <= MAX_TRIVIAL_MAPPED, "trivial program: mapped %" PRIu64 " > %" PRIu64,
            base.mapped, MAX_TRIVIAL_MAPPED);
  CHECK_MSG(t_committed <= (int64_t)MAX_THREAD_COMMITTED, "per thread: committed %" PRId64 " > %" PRIu64,
            t_committed, MAX_THREAD_COMMITTED);
  CHECK_MSG(t_mapped <= (int64_t)MAX_THREAD_MAPPED, "per thread: mapped %" PRId64 " > %" PRIu64,
            t_mapped, MAX_THREAD_MAPPED);
  CHECK_MSG(t_keel_vm <= (int64_t)MAX_THREAD_MAPPED, "per thread: Keel's mappings %" PRId64 " > %" PRIu64,
            t_keel_vm, MAX_THREAD_MAPPED);
  CHECK_MSG(base.keel_vm <= MAX_TRIVIAL_MAPPED, "trivial program: Keel's mappings %" PRIu64 " > %" PRIu64,
            base.keel_vm, MAX_TRIVIAL_MAPPED);
  CHECK_MSG(base.keel_vm > 0, "no mmap call of libkeel was seen: the interposition did not work");
  CHECK_MSG(base.keel_ro <= MAX_TRIVIAL_RESERVED_RO, "trivial program: Keel's read-only reservations %" PRIu64 " > %" PRIu64,
            base.keel_ro, MAX_TRIVIAL_RESERVED_RO);
  CHECK_MSG(t_vsz_nostack <= (int64_t)MAX_THREAD_VSZ_NOSTACK,
            "per thread: virtual size without the stack %" PRId64 " > %" PRIu64, t_vsz_nostack,
            MAX_THREAD_VSZ_NOSTACK);
  CHECK_MSG(stack_bytes >= THREAD_STACK && stack_bytes <= THREAD_STACK + 64 * KiB,
            "stack + guard per thread found in /proc/self/maps: %" PRIu64, stack_bytes);
  return test_finish();
}
