/* soak.c - long concurrent run: writer threads (store, remove, clear,
 * eviction, TTL expiry) and reader threads on an index that grows and
 * shrinks, with snapshots taken and restored mid-run.
 *
 *   soak SECONDS [WRITERS [READERS [MAX_BLOCKS]]]
 *
 * Rounds alternate the eviction policy (KVIDX_EVICT_EXPIRY with expiring
 * stores and kvidx_expire, then KVIDX_EVICT_LRS) and the kind (positional,
 * radix); within a round the writers alternate grow and shrink phases.
 * Writers own disjoint workers (the threading contract); all stores come
 * from shared documents, so chains are shared across workers.
 *
 * Checked, any failure exits 1:
 *   - every writer status is one the operation may return (OK, ENOENT,
 *     ENOPARENT, EFULL); every reader answer is sane (sorted, depths within
 *     the query, no worker twice, KVIDX_OK from kvidx_find_matches_ex);
 *   - exact answers during the run: a pinned worker holds documents no
 *     writer stores (EXPIRY rounds: without an expiry, pruned last), and
 *     every query on them must say exactly (pinned, k);
 *   - every checkpoint (~1 s after the last): a snapshot written while the writers run,
 *     read into a fresh index (readers running): kvidx__check passes and it
 *     holds at most max_blocks; then the writers pause, a snapshot of the
 *     quiescent index is read into a fresh index of the other kind while
 *     the readers query both, and the two must answer identically (every
 *     document prefix at several lengths, worker_blocks of every worker,
 *     blocks / workers counts) and pass kvidx__check;
 *   - memory: stats.peak_bytes stays under a bound linear in max_blocks.
 * Timing is printed, never checked. */
#define _POSIX_C_SOURCE 200809L
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include "testutil.h" /* t_mem: snapshot streams in memory */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define NDOC 48
#define DOCLEN 96
#define PINNED_DOCS 4
#define WORKERS_PER_WRITER 6
#define PINNED_WORKER 999999u
#define MAX_THREADS 16

static uint64_t doc_loc[NDOC + PINNED_DOCS][DOCLEN], doc_seq[NDOC + PINNED_DOCS][DOCLEN];

static atomic_int stop, paused_writers, pause_req, fail;
static atomic_uint_fast64_t clock_now; /* the TTL clock (the library reads none) */
static atomic_uint_fast64_t n_ops, n_queries, n_eagain;
static int n_writers = 2, n_readers = 2;
static size_t max_blocks = 8000; /* small enough that growing phases evict */

/* the index readers use; swapped only while readers are paused */
static pthread_rwlock_t ix_lock = PTHREAD_RWLOCK_INITIALIZER;
static kvidx *A, *B; /* B: the restored copy (NULL outside checkpoints) */
static int round_evict;
static atomic_int grow_phase;

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "soak: FAIL: " __VA_ARGS__);                               \
    fputc('\n', stderr);                                                       \
    atomic_store(&fail, 1);                                                    \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void make_docs(void) {
  uint64_t s = 12345;
  for (int d = 0; d < NDOC + PINNED_DOCS; d++) {
    /* documents share prefixes in groups of 4 (a system prompt) */
    for (int i = 0; i < DOCLEN; i++) {
      int shared = d < NDOC && i < 8 + (d % 4) * 8;
      doc_loc[d][i] = shared ? 0x100000ull * (uint64_t)(d / 4 + 1) + (uint64_t)i : t_rand(&s) | 1;
    }
    kvidx_seq_hashes(doc_loc[d], DOCLEN, doc_seq[d]);
  }
}

static kvidx *make_index(int kind, int evict) {
  kvidx_config c;
  kvidx *ix = NULL;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_workers = 256;
  c.max_blocks = max_blocks;
  c.evict = evict;
  c.evict_target_pct = 80;
  c.jump = 8;
  int rc = kvidx_create(&ix, &c);
  if (rc != KVIDX_OK) {
    fprintf(stderr, "soak: create failed: %s\n", kvidx_strerror(rc));
    exit(1);
  }
  return ix;
}

static void store_pinned(kvidx *ix) {
  for (int d = 0; d < PINNED_DOCS; d++) {
    kvidx_block b[DOCLEN];
    for (int i = 0; i < DOCLEN; i++) b[i].local = doc_loc[NDOC + d][i], b[i].seq = doc_seq[NDOC + d][i];
    int rc = kvidx_store(ix, PINNED_WORKER, 0, NULL, b, DOCLEN);
    if (rc != KVIDX_OK) FAIL("pinned store: %s", kvidx_strerror(rc));
  }
}

static void *writer(void *arg) {
  int t = (int)(intptr_t)arg;
  uint64_t s = 777 + (uint64_t)t * 1000003u;
  while (!atomic_load(&stop)) {
    if (atomic_load(&pause_req)) {
      atomic_fetch_add(&paused_writers, 1);
      while (atomic_load(&pause_req) && !atomic_load(&stop)) sched_yield();
      atomic_fetch_sub(&paused_writers, 1);
      continue;
    }
    kvidx *ix = A; /* A changes only while writers are paused */
    uint64_t w = (uint64_t)t * WORKERS_PER_WRITER + t_rand(&s) % WORKERS_PER_WRITER + 1;
    uint32_t rank = (uint32_t)(t_rand(&s) % 2);
    int d = (int)(t_rand(&s) % NDOC), op = (int)(t_rand(&s) % 100), rc;
    int grow = atomic_load(&grow_phase);
    if (op < (grow ? 70 : 35)) { /* store a prefix (re-stores are no-ops), maybe from a held parent */
      int from = t_rand(&s) % 3 == 0 ? (int)(t_rand(&s) % 32) : 0;
      int len = 1 + (int)(t_rand(&s) % (DOCLEN - from));
      kvidx_block b[DOCLEN];
      for (int i = 0; i < len; i++) b[i].local = doc_loc[d][from + i], b[i].seq = doc_seq[d][from + i];
      const uint64_t *par = from ? &doc_seq[d][from - 1] : NULL;
      if (round_evict == KVIDX_EVICT_EXPIRY)
        rc = kvidx_store_ttl(ix, w, rank, par, b, (size_t)len, atomic_load(&clock_now) + 1 + t_rand(&s) % 200);
      else
        rc = kvidx_store(ix, w, rank, par, b, (size_t)len);
      if (rc != KVIDX_OK && rc != KVIDX_ENOPARENT && rc != KVIDX_EFULL) FAIL("store: %s", kvidx_strerror(rc));
    } else if (op < 96) { /* remove a few blocks */
      uint64_t seqs[4];
      int n = 1 + (int)(t_rand(&s) % 4);
      for (int i = 0; i < n; i++) seqs[i] = doc_seq[d][t_rand(&s) % DOCLEN];
      rc = kvidx_remove(ix, w, rank, seqs, (size_t)n);
      if (rc != KVIDX_OK && rc != KVIDX_ENOENT) FAIL("remove: %s", kvidx_strerror(rc));
    } else if (op < 98 || round_evict != KVIDX_EVICT_EXPIRY || t != 0) {
      rc = kvidx_clear(ix, w, rank);
      if (rc != KVIDX_OK) FAIL("clear: %s", kvidx_strerror(rc));
    } else { /* writer 0: the TTL clock moves; expire */
      size_t gone = 0;
      uint64_t now = atomic_fetch_add(&clock_now, 5) + 5;
      rc = kvidx_expire(ix, now, &gone);
      if (rc != KVIDX_OK) FAIL("expire: %s", kvidx_strerror(rc));
    }
    atomic_fetch_add(&n_ops, 1);
  }
  return NULL;
}

/* Sanity of one answer; exactness for queries on pinned documents (1: not
 * exact). */
static int check_answer(const kvidx_score *sc, size_t m, size_t cap, size_t qn, int pinned_len) {
  size_t k = m < cap ? m : cap;
  for (size_t i = 0; i < k; i++) {
    if (sc[i].depth < 1 || sc[i].depth > qn) FAIL("depth %u outside 1..%zu", sc[i].depth, qn);
    for (size_t j = 0; j < i; j++)
      if (sc[j].worker_id == sc[i].worker_id && sc[j].dp_rank == sc[i].dp_rank) FAIL("worker twice in one answer");
    if (i && (sc[i - 1].depth < sc[i].depth ||
              (sc[i - 1].depth == sc[i].depth && sc[i - 1].worker_id > sc[i].worker_id)))
      FAIL("answer out of order");
  }
  if (pinned_len > 0 && round_evict == KVIDX_EVICT_EXPIRY &&
      (m != 1 || sc[0].worker_id != PINNED_WORKER || sc[0].depth != (uint32_t)pinned_len)) {
    FAIL("pinned document prefix %d: %zu workers, first (%llu, depth %u)", pinned_len, m,
         m ? (unsigned long long)sc[0].worker_id : 0ull, m ? sc[0].depth : 0u);
    return 1;
  }
  return 0;
}

static void *reader(void *arg) {
  uint64_t s = 4242 + (uint64_t)(intptr_t)arg * 7919u;
  kvidx_score sc[64];
  while (!atomic_load(&stop)) {
    pthread_rwlock_rdlock(&ix_lock);
    kvidx *ix = (B && t_rand(&s) % 2) ? B : A;
    int pin = t_rand(&s) % 8 == 0;
    int d = pin ? NDOC + (int)(t_rand(&s) % PINNED_DOCS) : (int)(t_rand(&s) % NDOC);
    size_t qn = 1 + t_rand(&s) % DOCLEN, total = 0;
    int rc = kvidx_find_matches_ex(ix, doc_loc[d], qn, sc, 64, &total);
    if (rc == KVIDX_EAGAIN) atomic_fetch_add(&n_eagain, 1);
    else if (rc != KVIDX_OK) FAIL("find_matches_ex: %s", kvidx_strerror(rc));
    else {
      if (check_answer(sc, total, 64, qn, pin && ix == A ? (int)qn : 0)) { /* say whether the blocks were there */
        kvidx_score again[64];
        size_t m2 = kvidx_find_matches(ix, doc_loc[d], qn, again, 64);
        fprintf(stderr, "soak: pinned worker holds %zu blocks; the same query again: %zu workers, depth %u\n",
                kvidx_worker_blocks(ix, PINNED_WORKER, 0), m2, m2 ? again[0].depth : 0u);
      }
    }
    pthread_rwlock_unlock(&ix_lock);
    atomic_fetch_add(&n_queries, 1);
  }
  return NULL;
}

/* A and B quiescent (no writer on either): identical answers. */
static void compare(kvidx *a, kvidx *b) {
  kvidx_score x[256], y[256];
  for (int d = 0; d < NDOC + PINNED_DOCS; d++)
    for (size_t qn = 1; qn <= DOCLEN; qn += 1 + qn / 2) {
      size_t ma = kvidx_find_matches(a, doc_loc[d], qn, x, 256), mb = kvidx_find_matches(b, doc_loc[d], qn, y, 256);
      size_t k = ma < 256 ? ma : 256;
      if (ma != mb || memcmp(x, y, k * sizeof x[0])) FAIL("restored index answers differently (doc %d, %zu blocks)", d, qn);
    }
  for (uint64_t w = 1; w <= (uint64_t)n_writers * WORKERS_PER_WRITER; w++)
    for (uint32_t r = 0; r < 2; r++)
      if (kvidx_worker_blocks(a, w, r) != kvidx_worker_blocks(b, w, r)) FAIL("worker_blocks(%llu, %u) differ", (unsigned long long)w, r);
  kvidx_stats sa, sb;
  memset(&sa, 0, sizeof sa);
  memset(&sb, 0, sizeof sb);
  kvidx_get_stats(a, &sa);
  kvidx_get_stats(b, &sb);
  if (sa.blocks != sb.blocks || sa.workers != sb.workers) FAIL("stats differ: %zu/%zu vs %zu/%zu", sa.blocks, sa.workers, sb.blocks, sb.workers);
}

static kvidx *restore(const t_mem *m, int kind) {
  t_mem r = *m;
  r.pos = 0;
  kvidx *t = make_index(kind, round_evict);
  int rc = kvidx_snapshot_read(t, t_mem_read, &r);
  if (rc != KVIDX_OK) FAIL("snapshot_read: %s", kvidx_strerror(rc));
  return t;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 10;
  if (argc > 2) n_writers = atoi(argv[2]);
  if (argc > 3) n_readers = atoi(argv[3]);
  if (argc > 4) max_blocks = (size_t)atol(argv[4]);
  if (n_writers < 1 || n_writers > MAX_THREADS || n_readers < 0 || n_readers > MAX_THREADS || max_blocks < 1000) {
    fprintf(stderr, "usage: soak SECONDS [WRITERS 1..16 [READERS 0..16 [MAX_BLOCKS >= 1000]]]\n");
    return 2;
  }
  /* memory bound: a fixed part plus a linear one per holding (generous:
   * about 4x what the kinds use today) */
  const size_t mem_bound = (size_t)4 << 20, per_block = 1024;
  make_docs();
  pthread_t wt[MAX_THREADS], rt[MAX_THREADS];
  int kind = KVIDX_POSITIONAL, rounds = 0, checkpoints = 0;
  round_evict = KVIDX_EVICT_EXPIRY;
  A = make_index(kind, round_evict);
  store_pinned(A);
  atomic_store(&grow_phase, 1);
  for (int i = 0; i < n_writers; i++) pthread_create(&wt[i], NULL, writer, (void *)(intptr_t)i);
  for (int i = 0; i < n_readers; i++) pthread_create(&rt[i], NULL, reader, (void *)(intptr_t)i);
  double t0 = now_s(), next = t0 + 1;
  size_t peak_blocks = 0, peak_bytes = 0;
  printf("soak: %.0f s, %d writers, %d readers, max_blocks %zu\n", seconds, n_writers, n_readers, max_blocks);
  while (!atomic_load(&fail)) {
    double t = now_s();
    if (t - t0 >= seconds) break;
    if (t < next) {
      struct timespec ts = {0, 20 * 1000 * 1000};
      nanosleep(&ts, NULL);
      continue;
    }
    checkpoints++;
    /* 1. a snapshot while the writers run, read into a fresh index */
    t_mem m1 = {NULL, 0, 0, 0, -1};
    int rc = kvidx_snapshot_write(A, t_mem_write, &m1);
    if (rc != KVIDX_OK) FAIL("snapshot_write (writers running): %s", kvidx_strerror(rc));
    kvidx *c = restore(&m1, kind == KVIDX_RADIX ? KVIDX_POSITIONAL : KVIDX_RADIX);
    kvidx_stats cs;
    memset(&cs, 0, sizeof cs);
    kvidx_get_stats(c, &cs);
    if (kvidx__check(c)) FAIL("kvidx__check of a mid-run restore");
    if (cs.blocks > max_blocks) FAIL("mid-run restore holds %zu blocks > %zu", cs.blocks, max_blocks);
    kvidx_destroy(c);
    free(m1.buf);
    /* 2. writers pause; the quiescent index, snapshot, restored into the
     * other kind while the readers query both */
    atomic_store(&pause_req, 1);
    while (atomic_load(&paused_writers) < n_writers && !atomic_load(&fail)) sched_yield();
    t_mem m2 = {NULL, 0, 0, 0, -1};
    rc = kvidx_snapshot_write(A, t_mem_write, &m2);
    if (rc != KVIDX_OK) FAIL("snapshot_write: %s", kvidx_strerror(rc));
    kvidx *b = make_index(kind == KVIDX_RADIX ? KVIDX_POSITIONAL : KVIDX_RADIX, round_evict);
    pthread_rwlock_wrlock(&ix_lock);
    B = b; /* readers see B while it fills */
    pthread_rwlock_unlock(&ix_lock);
    m2.pos = 0;
    rc = kvidx_snapshot_read(b, t_mem_read, &m2);
    if (rc != KVIDX_OK) FAIL("snapshot_read: %s", kvidx_strerror(rc));
    compare(A, b);
    /* readers keep querying both: the checker changes nothing they read */
    if (kvidx__check(A) || kvidx__check(b)) FAIL("kvidx__check at a checkpoint");
    kvidx_stats st;
    memset(&st, 0, sizeof st);
    kvidx_get_stats(A, &st);
    if (st.blocks > peak_blocks) peak_blocks = st.blocks;
    if (st.peak_bytes > peak_bytes) peak_bytes = st.peak_bytes;
    if (st.peak_bytes > mem_bound + per_block * max_blocks)
      FAIL("peak bytes %zu over the bound %zu", st.peak_bytes, mem_bound + per_block * max_blocks);
    printf("  checkpoint %d at %.0f s: %s %s, %zu blocks, %zu workers, %zu bytes (peak %zu), snapshot %zu bytes\n",
           checkpoints, now_s() - t0, kind == KVIDX_RADIX ? "radix" : "positional",
           round_evict == KVIDX_EVICT_EXPIRY ? "expiry" : "lrs", st.blocks, st.workers, st.bytes, st.peak_bytes, m2.len);
    /* 3. go on with the restored copy (a restored index under load) or,
     * every second checkpoint, a fresh round with the other policy */
    pthread_rwlock_wrlock(&ix_lock);
    kvidx *old = A;
    B = NULL;
    if (checkpoints % 2 == 0) {
      kvidx_destroy(b);
      round_evict = round_evict == KVIDX_EVICT_EXPIRY ? KVIDX_EVICT_LRS : KVIDX_EVICT_EXPIRY;
      A = make_index(kind, round_evict);
      store_pinned(A);
      rounds++;
    } else {
      A = b;
      kind = kind == KVIDX_RADIX ? KVIDX_POSITIONAL : KVIDX_RADIX;
    }
    kvidx_destroy(old);
    pthread_rwlock_unlock(&ix_lock);
    free(m2.buf);
    atomic_store(&grow_phase, !atomic_load(&grow_phase));
    atomic_store(&pause_req, 0);
    next = now_s() + 1;
  }
  atomic_store(&stop, 1);
  atomic_store(&pause_req, 0);
  for (int i = 0; i < n_writers; i++) pthread_join(wt[i], NULL);
  for (int i = 0; i < n_readers; i++) pthread_join(rt[i], NULL);
  kvidx_destroy(A);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("soak: %.0f s, %d checkpoints, %d policy rounds, %llu writer ops, %llu queries (%llu EAGAIN), "
         "peak %zu blocks / %zu index bytes, max RSS %ld KiB: %s\n",
         now_s() - t0, checkpoints, rounds, (unsigned long long)atomic_load(&n_ops),
         (unsigned long long)atomic_load(&n_queries), (unsigned long long)atomic_load(&n_eagain), peak_blocks,
         peak_bytes, ru.ru_maxrss, atomic_load(&fail) ? "FAILED" : "ok");
  if (!checkpoints && !atomic_load(&fail)) {
    printf("soak: FAIL: no checkpoint ran (SECONDS must be > 2)\n");
    return 1;
  }
  return atomic_load(&fail) ? 1 : 0;
}
