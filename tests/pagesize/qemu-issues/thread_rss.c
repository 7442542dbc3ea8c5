/* thread_rss.c -- qemu-user issue, no Keel involved (plain glibc malloc): the RSS grows
 * with every thread that ever ran.
 *
 * 500 short threads, one at a time. Natively VmRSS does not move; under Debian 12's
 * qemu-aarch64 (7.2) it grows by ~280 KiB per thread (qemu keeps per-vCPU state of exited
 * threads). On top of that, /proc/self/statm under qemu is qemu's and counts host pages
 * (4 KiB), while sysconf(_SC_PAGESIZE) is the guest's (-p 65536: 16x more). Both are why
 * stress.thread_churn, which bounds the RSS, is left out of the suites under qemu
 * (scripts/cross-aarch64.sh; --qemu-issues runs this).
 *
 *   aarch64-linux-gnu-gcc -O1 -pthread thread_rss.c -o /tmp/tr && qemu-aarch64 -L /usr/aarch64-linux-gnu /tmp/tr
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long rss_kib(void) {
  char line[256];
  long v = -1;
  FILE* f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) v = atol(line + 6);
  if (f) fclose(f);
  return v;
}
static void* work(void* a) {
  free(malloc(100));
  return a;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 500;
  long before = rss_kib();
  for (int i = 0; i < n; i++) {
    pthread_t t;
    pthread_create(&t, NULL, work, NULL);
    pthread_join(t, NULL);
  }
  long after = rss_kib();
  printf("thread_rss: %d threads: VmRSS %ld KiB -> %ld KiB (%+ld KiB per thread)\n", n, before,
         after, (after - before) / n);
  return 0;
}
