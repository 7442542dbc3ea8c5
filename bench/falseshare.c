/* falseshare -- allocator-induced false sharing (after Hoard's cache-scratch).
 *
 * The main thread allocates one small object (8 bytes by default) per thread, back to
 * back, and hands object i to thread i. Each thread frees the object it was given,
 * then repeatedly allocates an object of the same size, writes and reads every byte
 * of it many times, and frees it. An allocator that gives a thread back the block it
 * just freed (which sits on the same cache line as the blocks of the other threads)
 * makes the threads fight over that cache line; one that serves each thread from its
 * own memory does not. The time is dominated by the writes, so the program measures
 * the placement of blocks, not the speed of malloc.
 * Checksum: sum of the bytes read back.
 * Usage: falseshare [scale] [threads=2]
 */
#include <pthread.h>

#include "bench.h"

enum { OBJ_SIZE = 8, ITERATIONS = 1000 };

static uint64_t repetitions;

typedef struct {
  char* given;
  int id;
  uint64_t iterations;
  uint64_t sum;
  pthread_t th;
} task;

static void* run(void* arg) {
  task* t = arg;
  free(t->given);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < t->iterations; i++) {
    volatile char* a = xmalloc(OBJ_SIZE);
    for (uint64_t j = 0; j < repetitions; j++) {
      for (int k = 0; k < OBJ_SIZE; k++) {
        a[k] = (char)(k + j + (uint64_t)t->id);
        sum += (unsigned char)a[k];
      }
    }
    free((void*)a);
  }
  t->sum = sum;
  return NULL;
}

int main(int argc, char** argv) {
  bench_init("falseshare", argc, argv, 2);
  int n = bench_threads;
  /* total writes = ITERATIONS * repetitions * OBJ_SIZE, shared among the threads */
  repetitions = bench_scaled(90000, 1);
  task* tasks = xcalloc((size_t)n, sizeof(task));
  for (int i = 0; i < n; i++) {
    tasks[i].id = i;
    tasks[i].iterations = ITERATIONS / (uint64_t)n + ((uint64_t)i < ITERATIONS % (uint64_t)n);
    tasks[i].given = xmalloc(OBJ_SIZE); /* consecutive small blocks: likely one cache line */
    memset(tasks[i].given, 0, OBJ_SIZE);
  }
  for (int i = 0; i < n; i++)
    if (pthread_create(&tasks[i].th, NULL, run, &tasks[i])) bench_die("pthread_create failed");
  uint64_t sum = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(tasks[i].th, NULL);
    sum += tasks[i].sum;
  }
  free(tasks);
  printf("falseshare threads=%d object=%d iterations=%d repetitions=%" PRIu64 " checksum=%016" PRIx64 "\n", n,
         OBJ_SIZE, ITERATIONS, repetitions, mix64(sum));
  return 0;
}
