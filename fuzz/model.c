/* model.c - the naive model (see model.h).  Every worker is an array of
 * (seq, chain) pairs; the workers are kept sorted by (worker_id, dp_rank)
 * and found by binary search; a worker's blocks are linear scans, except in
 * a query: it follows the SEMANTICS definition (a worker's depth is the
 * largest k with the worker holding chains q_0..q_{k-1}) with each "holds"
 * one binary search in a sorted copy of the worker's chains, made when the
 * query needs it and kept until the worker changes (fuzz_ops asks ~30
 * queries in a row in its full checks: a scan of every held block per query
 * cost 10^5-10^6 compares each).  Nothing here shares code or data layout
 * with kvidx.h beyond the public hash function. */
#include "model.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  uint64_t seq;   /* the engine's key for the block (per worker)      */
  uint64_t chain; /* canonical chain hash: the whole prefix           */
} fm_block;

typedef struct {
  uint64_t worker_id;
  uint32_t dp_rank;
  fm_block *b;
  size_t n, cap;
  uint64_t *sorted; /* the chains of b[0..n), sorted; valid unless dirty */
  size_t sorted_cap;
  int dirty;
} fm_worker;

struct fm_model {
  fm_worker *w; /* workers ever seen, sorted by (worker_id, dp_rank); n == 0: holding nothing */
  size_t nw, capw;
  /* query scratch, grown as needed and kept (a malloc per query is what
   * ASan makes slow) */
  uint64_t *q;
  size_t capq;
  kvidx_score *all;
  size_t capall;
  /* store scratch: per block of the run, where its seq sits in the worker
   * (held before the call, or pushed by it), -1 while unknown; and the
   * first block of the run with the same seq */
  long *at;
  size_t *first;
  size_t capat;
  size_t max_blocks;
  uint32_t max_workers;
  size_t n_blocks, n_workers; /* running totals (recounted in fm_check) */
};

fm_model *fm_create(size_t max_blocks, uint32_t max_workers) {
  fm_model *m = (fm_model *)calloc(1, sizeof *m);
  if (!m) return NULL;
  m->max_blocks = max_blocks;
  m->max_workers = max_workers ? max_workers : 1024;
  return m;
}

void fm_destroy(fm_model *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nw; i++) {
    free(m->w[i].b);
    free(m->w[i].sorted);
  }
  free(m->w);
  free(m->q);
  free(m->all);
  free(m->at);
  free(m->first);
  free(m);
}

/* Workers are kept sorted by (worker_id, dp_rank): the first at or after
 * (id, dp), by binary search (a linear scan made a bulk store of 1,000
 * workers cost 10^6 compares). */
static size_t fm_lower(const fm_model *m, uint64_t id, uint32_t dp) {
  size_t lo = 0, hi = m->nw;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const fm_worker *w = &m->w[mid];
    if (w->worker_id < id || (w->worker_id == id && w->dp_rank < dp)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static fm_worker *fm_find_worker(const fm_model *m, uint64_t id, uint32_t dp) {
  size_t i = fm_lower(m, id, dp);
  return i < m->nw && m->w[i].worker_id == id && m->w[i].dp_rank == dp ? &m->w[i] : NULL;
}

/* index of seq in w's blocks, or -1 */
static long fm_find_seq(const fm_worker *w, uint64_t seq) {
  for (size_t i = 0; i < w->n; i++)
    if (w->b[i].seq == seq) return (long)i;
  return -1;
}

size_t fm_blocks(const fm_model *m) { return m->n_blocks; }
size_t fm_workers(const fm_model *m) { return m->n_workers; }

int fm_check(const fm_model *m) {
  size_t b = 0, w = 0;
  for (size_t i = 0; i < m->nw; i++) {
    b += m->w[i].n;
    w += m->w[i].n > 0;
  }
  return b == m->n_blocks && w == m->n_workers ? 0 : -1;
}

size_t fm_worker_blocks(const fm_model *m, uint64_t worker_id, uint32_t dp_rank) {
  const fm_worker *w = fm_find_worker(m, worker_id, dp_rank);
  return w ? w->n : 0;
}

static int fm_push(fm_worker *w, uint64_t seq, uint64_t chain) {
  if (w->n == w->cap) {
    size_t nc = w->cap ? 2 * w->cap : 8;
    fm_block *nb = (fm_block *)realloc(w->b, nc * sizeof *nb);
    if (!nb) return -1;
    w->b = nb;
    w->cap = nc;
  }
  w->b[w->n].seq = seq;
  w->b[w->n].chain = chain;
  w->dirty = 1;
  return 0;
}

int fm_store(fm_model *m, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq,
             const kvidx_block *b, size_t n) {
  fm_worker *w = fm_find_worker(m, worker_id, dp_rank);
  uint64_t chain = 0;
  int have_chain = 0;
  /* unknown parent: nothing changes */
  if (parent_seq) {
    long p = w ? fm_find_seq(w, *parent_seq) : -1;
    if (p < 0) return KVIDX_ENOPARENT;
    chain = w->b[p].chain;
    have_chain = 1;
  }
  /* first pass: how many new blocks (a seq repeated inside the run is new
   * only the first time); each block's place in the worker is kept for the
   * second pass (one scan of the worker per block, not two) */
  if (n > m->capat) {
    free(m->at);
    free(m->first);
    m->at = (long *)malloc(n * sizeof *m->at);
    m->first = (size_t *)malloc(n * sizeof *m->first);
    if (!m->at || !m->first) abort();
    m->capat = n;
  }
  size_t added = 0;
  for (size_t i = 0; i < n; i++) {
    m->at[i] = w ? fm_find_seq(w, b[i].seq) : -1;
    m->first[i] = i;
    for (size_t j = 0; j < i && m->first[i] == i; j++)
      if (b[j].seq == b[i].seq) m->first[i] = j;
    added += m->at[i] < 0 && m->first[i] == i;
  }
  if (added) {
    if (m->max_blocks && fm_blocks(m) + added > m->max_blocks) return KVIDX_EFULL;
    if ((!w || w->n == 0) && fm_workers(m) >= m->max_workers) return KVIDX_EFULL;
  }
  if (!w) {
    if (!added) return KVIDX_OK;
    if (m->nw == m->capw) {
      size_t nc = m->capw ? 2 * m->capw : 16;
      fm_worker *nw = (fm_worker *)realloc(m->w, nc * sizeof *nw);
      if (!nw) abort();
      m->w = nw;
      m->capw = nc;
    }
    size_t at = fm_lower(m, worker_id, dp_rank);
    memmove(&m->w[at + 1], &m->w[at], (m->nw - at) * sizeof *m->w);
    m->nw++;
    w = &m->w[at];
    memset(w, 0, sizeof *w);
    w->worker_id = worker_id;
    w->dp_rank = dp_rank;
  }
  /* second pass: apply; a held seq stays as it is and the run chains from it */
  for (size_t i = 0; i < n; i++) {
    long h = m->at[i] >= 0 ? m->at[i] : m->at[m->first[i]]; /* held before, or pushed above */
    if (h >= 0) {
      chain = w->b[h].chain;
    } else {
      chain = have_chain ? kvidx_seq_hash_next(chain, b[i].local) : b[i].local;
      if (fm_push(w, b[i].seq, chain)) abort();
      m->at[i] = (long)w->n;
      m->n_workers += w->n == 0;
      m->n_blocks++;
      w->n++;
    }
    have_chain = 1;
  }
  return KVIDX_OK;
}

int fm_remove(fm_model *m, uint64_t worker_id, uint32_t dp_rank, const uint64_t *seqs, size_t n) {
  fm_worker *w = fm_find_worker(m, worker_id, dp_rank);
  size_t unknown = 0;
  for (size_t i = 0; i < n; i++) {
    long h = w ? fm_find_seq(w, seqs[i]) : -1;
    if (h < 0) {
      unknown++;
      continue;
    }
    w->b[h] = w->b[--w->n]; /* no cascade: the rest stays */
    w->dirty = 1;
    m->n_blocks--;
    m->n_workers -= w->n == 0;
  }
  return unknown ? KVIDX_ENOENT : KVIDX_OK;
}

int fm_clear(fm_model *m, uint64_t worker_id, uint32_t dp_rank) {
  fm_worker *w = fm_find_worker(m, worker_id, dp_rank);
  if (w && w->n) {
    m->n_blocks -= w->n;
    m->n_workers--;
    w->n = 0;
    w->dirty = 1;
  }
  return KVIDX_OK;
}

int fm_remove_worker(fm_model *m, uint64_t worker_id) {
  for (size_t i = fm_lower(m, worker_id, 0); i < m->nw && m->w[i].worker_id == worker_id; i++)
    fm_clear(m, worker_id, m->w[i].dp_rank);
  return KVIDX_OK;
}

/* a goes before b: depth desc, then worker_id, then dp_rank ascending */
static int fm_before(const kvidx_score *a, const kvidx_score *b) {
  if (a->depth != b->depth) return a->depth > b->depth;
  if (a->worker_id != b->worker_id) return a->worker_id < b->worker_id;
  return a->dp_rank < b->dp_rank;
}

static int fm_cmp(const void *x, const void *y) {
  const kvidx_score *a = (const kvidx_score *)x, *b = (const kvidx_score *)y;
  return fm_before(a, b) ? -1 : fm_before(b, a) ? 1 : 0;
}

static int fm_u64cmp(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* does w hold a block with this chain?  (sorts its chains first if it
 * changed since the last query) */
static int fm_holds(fm_worker *w, uint64_t chain) {
  if (w->dirty) {
    if (w->n > w->sorted_cap) {
      free(w->sorted);
      w->sorted = (uint64_t *)malloc(w->n * sizeof *w->sorted);
      if (!w->sorted) abort();
      w->sorted_cap = w->n;
    }
    for (size_t j = 0; j < w->n; j++) w->sorted[j] = w->b[j].chain;
    qsort(w->sorted, w->n, sizeof *w->sorted, fm_u64cmp);
    w->dirty = 0;
  }
  size_t lo = 0, hi = w->n; /* first sorted chain >= chain */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (w->sorted[mid] < chain) lo = mid + 1;
    else hi = mid;
  }
  return lo < w->n && w->sorted[lo] == chain;
}

/* The query's chains q_i, then for each worker the largest k with the
 * worker holding q_0..q_{k-1}; sorted by fm_before. */
size_t fm_find_matches(fm_model *m, const uint64_t *locals, size_t n, kvidx_score *out, size_t cap) {
  if (!n) return 0;
  if (n > m->capq) {
    free(m->q);
    m->q = (uint64_t *)malloc(n * sizeof *m->q);
    if (!m->q) abort();
    m->capq = n;
  }
  if (m->nw > m->capall) {
    free(m->all);
    m->all = (kvidx_score *)malloc(m->nw * sizeof *m->all);
    if (!m->all) abort();
    m->capall = m->nw;
  }
  uint64_t *q = m->q;
  kvidx_score *all = m->all;
  q[0] = locals[0];
  for (size_t i = 1; i < n; i++) q[i] = kvidx_seq_hash_next(q[i - 1], locals[i]);
  size_t found = 0;
  for (size_t i = 0; i < m->nw; i++) {
    fm_worker *w = &m->w[i];
    if (!w->n) continue;
    size_t k = 0;
    while (k < n && fm_holds(w, q[k])) k++;
    if (k == 0) continue;
    all[found].worker_id = w->worker_id;
    all[found].dp_rank = w->dp_rank;
    all[found].depth = (uint32_t)k;
    found++;
  }
  if (found > 1) qsort(all, found, sizeof *all, fm_cmp);
  for (size_t i = 0; i < found && i < cap; i++) out[i] = all[i];
  return found;
}
