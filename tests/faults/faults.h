/* faults.h -- small helpers shared by the fault tests (tests/faults). */
#ifndef KEEL_FAULTS_H
#define KEEL_FAULTS_H

#include "test.h"

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>

/* Address space of this process in bytes, from /proc/self/statm (0 if unreadable). */
static inline size_t vm_bytes(void) { return statm_bytes(0); }

/* One allocation tier: how to allocate a block of it. */
typedef struct {
  const char* name;
  size_t size;  /* request size */
  size_t align; /* 0: malloc; otherwise posix_memalign with this alignment */
  int calloc_;  /* use calloc(1, size) */
} tier_t;

static inline void* tier_alloc(const tier_t* t) {
  if (t->calloc_) return calloc(1, t->size);
  if (t->align) {
    void* p = NULL;
    int rc = posix_memalign(&p, t->align, t->size);
    if (rc != 0) {
      errno = rc; /* posix_memalign reports through its result, not errno */
      return NULL;
    }
    return p;
  }
  return malloc(t->size);
}

/* A watchdog: a test that deadlocks dies by SIGALRM (reported as a failure by ctest). */
static inline void watchdog(unsigned seconds) { alarm(seconds); }

#endif
