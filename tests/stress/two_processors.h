/* two_processors.h -- for the stress tests of threads apart (transfer.h): two threads
 * pinned to two processors whose numbers differ modulo 4, the tag a parked batch carries. */
#ifndef KEEL_TEST_TWO_PROCESSORS_H
#define KEEL_TEST_TWO_PROCESSORS_H

#include <pthread.h>
#include <sched.h>
#include <stdio.h>

static int cpu_of[2];
static int unpinned; /* a pin the system refused (seccomp, a narrower cpuset) */

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (pthread_setaffinity_np(pthread_self(), sizeof s, &s) != 0) __atomic_store_n(&unpinned, 1, __ATOMIC_RELAXED);
}

/* Fills cpu_of: 0, or 77 (the test's skip status) after saying why. */
static int choose_two_processors(void) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) {
    printf("SKIP: fewer than two processors to pin to\n");
    return 77;
  }
  int found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
    if (CPU_ISSET(c, &allowed) && (found == 0 || (c & 3) != (cpu_of[0] & 3))) cpu_of[found++] = c;
  if (found < 2) {
    printf("SKIP: no two processors to pin to whose numbers differ modulo 4\n");
    return 77;
  }
  return 0;
}

/* After the threads are joined: 77 if a pin was refused, else 0. */
static int pins_refused(void) {
  if (!__atomic_load_n(&unpinned, __ATOMIC_RELAXED)) return 0;
  printf("SKIP: the system refused to pin a thread to a processor\n");
  return 77;
}

#endif
