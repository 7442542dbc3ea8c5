/* test_mesh_writers.c -- meshing while threads write into the blocks being meshed
 * (docs/meshing.md, plan step 6).
 *
 * A sparse heap of 48 to 1152-byte blocks (a quarter of each class kept, at random) is
 * shared out to WRITERS threads. Each writer keeps, per block, the sequence number it
 * last wrote; in a loop it checks a random block of its own against that number (a
 * lost write or a stale page shows as a mismatch), writes the next number across the
 * whole block, and reads it back. Every eighth step frees a block and allocates a new
 * one of the same size. One more thread read()s from a pipe into its blocks, so the
 * kernel writes into pages being meshed: with the kernel-mode barrier those writes must
 * wait, never fail with EFAULT. Meanwhile a mesher thread runs keel_mesh_now() without
 * pause. Pass: no mismatch, no EFAULT, and pages were meshed while the writers ran
 * (else the test proved nothing). The longest stall a writer saw on one block write,
 * and the longest meshing operation, are printed.
 *
 * Runs 4 s x KEEL_STRESS_SCALE. Needs KEEL_MESH=on and a write barrier (root, or access
 * to /dev/userfaultfd): skipped (77) without. */
#include "test.h"

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <time.h>

#define WRITERS 4
#define PER_WRITER 3000
#define NSIZES 6

static const size_t SIZES[NSIZES] = {48, 128, 256, 720, 1024, 1152};

typedef struct {
  uint64_t* p;
  size_t size;
  uint64_t seq;
} owned_t;

typedef struct {
  owned_t blocks[PER_WRITER];
  size_t n;
  uint64_t rng;
  long steps, mismatches, renewed;
  double max_stall_us;
} writer_t;

static writer_t writers[WRITERS + 1]; /* the last one reads from a pipe */
static volatile int stop;
static double deadline;
static long efaults, pipe_mismatches;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t next_random(uint64_t* s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t word(const void* p, uint64_t seq, size_t i) {
  return ((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) ^ (seq << 20) ^ i;
}

static void fill(owned_t* b) {
  for (size_t i = 0; i < b->size / 8; i++) b->p[i] = word(b->p, b->seq, i);
}

static bool holds(const owned_t* b) {
  for (size_t i = 0; i < b->size / 8; i++)
    if (b->p[i] != word(b->p, b->seq, i)) return false;
  return true;
}

static void* writer_main(void* arg) {
  writer_t* w = (writer_t*)arg;
  while (!stop) {
    owned_t* b = &w->blocks[next_random(&w->rng) % w->n];
    if (!holds(b)) {
      if (w->mismatches++ < 5)
        fprintf(stderr, "  block %p (%zu B): does not hold sequence %" PRIu64 "\n", (void*)b->p, b->size, b->seq);
    }
    if (next_random(&w->rng) % 8 == 0) {
      free(b->p);
      b->p = malloc(b->size);
      b->seq = 0;
      w->renewed++;
    }
    b->seq++;
    double t0 = now_s();
    fill(b);
    double us = (now_s() - t0) * 1e6;
    if (us > w->max_stall_us) w->max_stall_us = us;
    if (!holds(b)) w->mismatches++;
    if (++w->steps % 1024 == 0 && now_s() > deadline) stop = 1;
  }
  return NULL;
}

/* The kernel writes: read(2) from a pipe into blocks that may be being meshed. */
static int pipefd[2];

static void* pipe_reader(void* arg) {
  writer_t* w = (writer_t*)arg;
  while (!stop) {
    owned_t* b = &w->blocks[next_random(&w->rng) % w->n];
    if (!holds(b)) pipe_mismatches++;
    uint64_t next[1152 / 8];
    owned_t want = {next, b->size, b->seq + 1};
    for (size_t i = 0; i < b->size / 8; i++) next[i] = word(b->p, want.seq, i);
    if (write(pipefd[1], next, b->size) != (ssize_t)b->size) break;
    size_t got = 0;
    while (got < b->size) {
      ssize_t n = read(pipefd[0], (char*)b->p + got, b->size - got);
      if (n < 0 && errno == EFAULT) {
        efaults++;
        break;
      }
      if (n <= 0) break;
      got += (size_t)n;
    }
    if (got == b->size) b->seq++;
    else fill(b); /* put it back the way it was */
    w->steps++;
  }
  return NULL;
}

static long meshes;
static void* mesher(void* arg) {
  (void)arg;
  while (!stop) meshes += (long)keel_mesh_now();
  return NULL;
}

int main(void) {
  keel_mesh_stats_t ms;
  keel_mesh_now();
  keel_mesh_stats(&ms);
  if (ms.state != KEEL_MESH_STATE_ON) {
    printf("SKIP: meshing is not available here (state %u, barrier %u)\n", ms.state, ms.barrier);
    return 77;
  }
  double scale = 1.0;
  const char* sc = getenv("KEEL_STRESS_SCALE");
  if (sc && atof(sc) > 0) scale = atof(sc);

  TEST_SECTION("a sparse heap shared out to the writers");
  uint64_t seed = 0x1234567;
  size_t total = (WRITERS + 1) * PER_WRITER * 4;
  void** all = calloc(total, sizeof *all);
  size_t* size_of = calloc(total, sizeof *size_of);
  for (size_t i = 0; i < total; i++) {
    size_of[i] = SIZES[i % NSIZES];
    all[i] = malloc(size_of[i]);
  }
  for (size_t i = 0; i < total; i++) {
    writer_t* w = &writers[next_random(&seed) % (WRITERS + 1)];
    if (next_random(&seed) % 4 == 0 && w->n < PER_WRITER) {
      owned_t* b = &w->blocks[w->n++];
      b->p = all[i];
      b->size = size_of[i];
      b->seq = 1;
      fill(b);
    } else {
      free(all[i]);
    }
  }
  free(all);
  free(size_of);
  keel_purge();
  for (int t = 0; t <= WRITERS; t++) writers[t].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
  CHECK(pipe(pipefd) == 0);

  TEST_SECTION("writers, a pipe reader and the mesher, together");
  keel_mesh_stats(&ms);
  uint64_t meshed0 = ms.meshed;
  deadline = now_s() + 4.0 * scale;
  pthread_t th[WRITERS + 2];
  for (int t = 0; t < WRITERS; t++) pthread_create(&th[t], NULL, writer_main, &writers[t]);
  pthread_create(&th[WRITERS], NULL, pipe_reader, &writers[WRITERS]);
  pthread_create(&th[WRITERS + 1], NULL, mesher, NULL);
  for (int t = 0; t < WRITERS + 2; t++) pthread_join(th[t], NULL);

  keel_mesh_stats(&ms);
  long steps = 0, mismatches = 0, renewed = 0;
  double stall = 0;
  for (int t = 0; t < WRITERS; t++) {
    steps += writers[t].steps;
    mismatches += writers[t].mismatches;
    renewed += writers[t].renewed;
    if (writers[t].max_stall_us > stall) stall = writers[t].max_stall_us;
  }
  printf("  %ld writes (%ld blocks renewed), %ld pipe reads; gave back %" PRIu64 " pages during the run, "
         "%" PRIu64 " views now, %" PRIu64 " eroded, %" PRIu64 " left, %" PRIu64 " released\n",
         steps, renewed, writers[WRITERS].steps, ms.meshed - meshed0, ms.views, ms.eroded, ms.left, ms.released);
  printf("  longest operation %.0f us (mean %.0f us); longest block write %.0f us\n", ms.longest_ns / 1e3,
         ms.meshed ? ms.busy_ns / 1e3 / (double)ms.meshed : 0.0, stall);
  CHECK_MSG(mismatches == 0, "%ld blocks lost a write or read stale data", mismatches);
  CHECK_MSG(pipe_mismatches == 0, "%ld blocks filled by read(2) did not hold their data", pipe_mismatches);
  CHECK_MSG(efaults == 0, "read(2) into a block failed with EFAULT %ld times", efaults);
  CHECK_MSG(ms.meshed - meshed0 >= 100, "only %" PRIu64 " pages meshed while writing: the test proved little",
            ms.meshed - meshed0);
  CHECK(ms.failed == 0);

  TEST_SECTION("every block still holds its last write; all freed");
  long bad = 0;
  for (int t = 0; t <= WRITERS; t++)
    for (size_t i = 0; i < writers[t].n; i++) {
      bad += !holds(&writers[t].blocks[i]);
      free(writers[t].blocks[i].p);
    }
  CHECK_MSG(bad == 0, "%ld blocks wrong at the end", bad);
  keel_purge();
  keel_mesh_now();
  keel_mesh_stats(&ms);
  printf("  after freeing everything: %" PRIu64 " views, %" PRIu64 " groups, file %" PRIu64 " B\n", ms.views,
         ms.groups, ms.file_bytes);
  return test_finish();
}
