/* threads.c - concurrent writers and readers on one index.
 *
 * kvidx's contract: any number of threads may call kvidx_find_matches at any
 * time; writer calls for one worker come from one thread at a time, while
 * writer calls for different workers may come from different threads.  A
 * router gets that for free by "sticky" routing its event streams: writer
 * thread t owns every worker with worker_id % WRITERS == t and applies all
 * of their events, while reader threads answer routing queries.
 *
 * Every worker holds the same 8-block system prompt throughout; writers
 * store and remove 6-block continuations of it.  Readers check what they see:
 * every worker matches the system prompt at depth exactly 8, a continuation
 * at a depth in 8..14, results are sorted.  The run is bounded (operation
 * count and a wall-clock limit); at the end each worker's state is checked
 * against the writers' own record.
 *
 *   build/examples/threads [positional|radix] [seconds]
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
  WRITERS = 2,
  READERS = 2,
  WORKERS = 16,
  BLOCK = 16,
  BASE = 8,       /* system prompt blocks held by every worker   */
  SUF = 6,        /* continuation blocks                          */
  VARIANTS = 12,  /* distinct continuations                       */
  WRITER_OPS = 200000
};

static kvidx *g_ix;
static uint64_t g_base_loc[BASE], g_base_seq[BASE];
static uint64_t g_loc[VARIANTS][BASE + SUF], g_seq[VARIANTS][BASE + SUF];
static unsigned char g_held[WORKERS][VARIANTS]; /* written by the owner only */
static atomic_int g_writers_left = WRITERS;
static atomic_size_t g_errors, g_queries, g_writes;
static double g_deadline;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void make_hashes(void) {
  uint32_t tok[(BASE + SUF) * BLOCK];
  size_t v, i;
  for (v = 0; v < VARIANTS; v++) {
    for (i = 0; i < (BASE + SUF) * BLOCK; i++)
      tok[i] = i < BASE * BLOCK ? (uint32_t)i : (uint32_t)(100000 * (v + 1) + i);
    kvidx_block_hashes(tok, (BASE + SUF) * BLOCK, BLOCK, KVIDX_SEED, g_loc[v]);
    kvidx_seq_hashes(g_loc[v], BASE + SUF, g_seq[v]);
  }
  memcpy(g_base_loc, g_loc[0], sizeof g_base_loc);
  memcpy(g_base_seq, g_seq[0], sizeof g_base_seq);
}

static void *writer(void *arg) {
  size_t t = (size_t)arg, op;
  uint64_t rng = 0x9E3779B97F4A7C15ull * (t + 1);
  kvidx_block b[SUF];
  for (op = 0; op < WRITER_OPS; op++) {
    uint64_t w;
    size_t v, i;
    int rc;
    if ((op & 255) == 0 && now() > g_deadline) break;
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    /* a worker this thread owns, and a continuation */
    w = (uint64_t)((rng >> 8) % (WORKERS / WRITERS)) * WRITERS + t;
    v = (size_t)((rng >> 32) % VARIANTS);
    if (!g_held[w][v]) {
      for (i = 0; i < SUF; i++) b[i].local = g_loc[v][BASE + i], b[i].seq = g_seq[v][BASE + i];
      rc = kvidx_store(g_ix, w, 0, &g_base_seq[BASE - 1], b, SUF);
    } else {
      rc = kvidx_remove(g_ix, w, 0, &g_seq[v][BASE], SUF);
    }
    if (rc != KVIDX_OK) {
      fprintf(stderr, "threads: writer %zu: %s\n", t, kvidx_strerror(rc));
      atomic_fetch_add(&g_errors, 1);
      break;
    }
    g_held[w][v] = (unsigned char)!g_held[w][v];
    atomic_fetch_add_explicit(&g_writes, 1, memory_order_relaxed);
  }
  atomic_fetch_sub(&g_writers_left, 1);
  return NULL;
}

static int sorted(const kvidx_score *s, size_t n) {
  size_t i;
  for (i = 1; i < n; i++) {
    if (s[i - 1].depth < s[i].depth) return 0;
    if (s[i - 1].depth == s[i].depth && s[i - 1].worker_id >= s[i].worker_id) return 0;
  }
  return 1;
}

static void *reader(void *arg) {
  size_t r = (size_t)arg, q = 0, i;
  kvidx_score sc[WORKERS + 1];
  while (atomic_load(&g_writers_left) > 0 && now() < g_deadline + 1.0) {
    size_t v = (q + r) % VARIANTS, m;
    int bad = 0;
    /* The system prompt: all workers, depth exactly BASE. */
    m = kvidx_find_matches(g_ix, g_base_loc, BASE, sc, WORKERS + 1);
    if (m != WORKERS || !sorted(sc, m)) bad = 1;
    for (i = 0; i < m && i <= WORKERS; i++)
      if (sc[i].depth != BASE) bad = 1;
    /* A continuation: all workers, depth within BASE..BASE+SUF. */
    m = kvidx_find_matches(g_ix, g_loc[v], BASE + SUF, sc, WORKERS + 1);
    if (m != WORKERS || !sorted(sc, m)) bad = 1;
    for (i = 0; i < m && i <= WORKERS; i++)
      if (sc[i].depth < BASE || sc[i].depth > BASE + SUF) bad = 1;
    if (bad) atomic_fetch_add(&g_errors, 1);
    q += 2;
  }
  atomic_fetch_add(&g_queries, q);
  return NULL;
}

int main(int argc, char **argv) {
  pthread_t wt[WRITERS], rt[READERS];
  kvidx_config cfg = {0};
  kvidx_block b[BASE];
  kvidx_score sc[WORKERS];
  double secs = 2.0, t0, el;
  size_t i, w, v, m, final_bad = 0;
  int rc;

  cfg.kind = KVIDX_POSITIONAL;
  if (argc > 1 && !strcmp(argv[1], "radix")) cfg.kind = KVIDX_RADIX;
  if (argc > 2) secs = atof(argv[2]);
  make_hashes();
  if ((rc = kvidx_create(&g_ix, &cfg)) != KVIDX_OK) {
    fprintf(stderr, "threads: create: %s\n", kvidx_strerror(rc));
    return 1;
  }
  for (i = 0; i < BASE; i++) b[i].local = g_base_loc[i], b[i].seq = g_base_seq[i];
  for (w = 0; w < WORKERS; w++)
    if ((rc = kvidx_store(g_ix, w, 0, NULL, b, BASE)) != KVIDX_OK) return 1;

  printf("threads: %s index, %d writer threads (sticky: worker_id %% %d), "
         "%d reader threads, %d workers, limit %.1f s\n",
         cfg.kind == KVIDX_RADIX ? "radix" : "positional", WRITERS, WRITERS,
         READERS, WORKERS, secs);
  t0 = now();
  g_deadline = t0 + secs;
  for (i = 0; i < READERS; i++) pthread_create(&rt[i], NULL, reader, (void *)i);
  for (i = 0; i < WRITERS; i++) pthread_create(&wt[i], NULL, writer, (void *)i);
  for (i = 0; i < WRITERS; i++) pthread_join(wt[i], NULL);
  for (i = 0; i < READERS; i++) pthread_join(rt[i], NULL);
  el = now() - t0;

  /* Quiescent: every worker's depth per continuation must match the record. */
  for (v = 0; v < VARIANTS; v++) {
    m = kvidx_find_matches(g_ix, g_loc[v], BASE + SUF, sc, WORKERS);
    if (m != WORKERS) final_bad++;
    for (i = 0; i < m && i < WORKERS; i++) {
      uint32_t want = g_held[sc[i].worker_id][v] ? BASE + SUF : BASE;
      if (sc[i].depth != want) final_bad++;
    }
  }
  if (kvidx__check(g_ix) != 0) final_bad++;
  printf("threads: %zu writes (%.0f/s), %zu queries (%.0f/s) in %.2f s\n",
         (size_t)atomic_load(&g_writes), (double)atomic_load(&g_writes) / el,
         (size_t)atomic_load(&g_queries), (double)atomic_load(&g_queries) / el, el);
  printf("threads: reader violations %zu, final-state mismatches %zu\n",
         (size_t)atomic_load(&g_errors), final_bad);
  kvidx_destroy(g_ix);
  if (atomic_load(&g_errors) || final_bad) {
    printf("threads: FAILED\n");
    return 1;
  }
  printf("threads: ok\n");
  return 0;
}
