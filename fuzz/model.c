/* model.c - the naive model (see model.h).  Every worker is an array of
 * (seq, chain) pairs; everything is a linear scan, except that a query
 * sorts its own chains once so that each held block is one binary search
 * (a worker with thousands of blocks against a 500-block query would
 * otherwise cost ~10^6 compares per query).  Nothing here shares code or
 * data layout with kvidx.h beyond the public hash function. */
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
} fm_worker;

typedef struct {
  uint64_t chain;
  size_t pos;
} fm_qpos;

struct fm_model {
  fm_worker *w; /* workers ever seen; n == 0 means holding nothing */
  size_t nw, capw;
  /* query scratch, grown as needed and kept (a malloc per query is what
   * ASan makes slow) */
  fm_qpos *q;
  size_t *mark;
  size_t capq;
  kvidx_score *all;
  size_t capall;
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
  for (size_t i = 0; i < m->nw; i++) free(m->w[i].b);
  free(m->w);
  free(m->q);
  free(m->mark);
  free(m->all);
  free(m);
}

static fm_worker *fm_find_worker(const fm_model *m, uint64_t id, uint32_t dp) {
  for (size_t i = 0; i < m->nw; i++)
    if (m->w[i].worker_id == id && m->w[i].dp_rank == dp) return &m->w[i];
  return NULL;
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
   * only the first time) */
  size_t added = 0;
  for (size_t i = 0; i < n; i++) {
    int held = w && fm_find_seq(w, b[i].seq) >= 0;
    for (size_t j = 0; j < i && !held; j++) held = b[j].seq == b[i].seq;
    added += !held;
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
    w = &m->w[m->nw++];
    memset(w, 0, sizeof *w);
    w->worker_id = worker_id;
    w->dp_rank = dp_rank;
  }
  /* second pass: apply; a held seq stays as it is and the run chains from it */
  for (size_t i = 0; i < n; i++) {
    long h = fm_find_seq(w, b[i].seq);
    if (h >= 0) {
      chain = w->b[h].chain;
    } else {
      chain = have_chain ? kvidx_seq_hash_next(chain, b[i].local) : b[i].local;
      if (fm_push(w, b[i].seq, chain)) abort();
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
  }
  return KVIDX_OK;
}

int fm_remove_worker(fm_model *m, uint64_t worker_id) {
  for (size_t i = 0; i < m->nw; i++)
    if (m->w[i].worker_id == worker_id) fm_clear(m, worker_id, m->w[i].dp_rank);
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

/* q sorted by chain, to mark which positions a worker holds */static int fm_qcmp(const void *x, const void *y) {
  const fm_qpos *a = (const fm_qpos *)x, *b = (const fm_qpos *)y;
  return a->chain < b->chain ? -1 : a->chain > b->chain;
}

/* For each worker: mark the query positions whose chain it holds (each of
 * its blocks looked up in the sorted chains), then its depth is the first
 * unmarked position. */
size_t fm_find_matches(fm_model *m, const uint64_t *locals, size_t n, kvidx_score *out, size_t cap) {
  if (!n) return 0;
  if (n > m->capq) {
    free(m->q);
    free(m->mark);
    m->q = (fm_qpos *)malloc(n * sizeof *m->q);
    m->mark = (size_t *)malloc(n * sizeof *m->mark);
    if (!m->q || !m->mark) abort();
    m->capq = n;
  }
  if (m->nw > m->capall) {
    free(m->all);
    m->all = (kvidx_score *)malloc(m->nw * sizeof *m->all);
    if (!m->all) abort();
    m->capall = m->nw;
  }
  fm_qpos *q = m->q;
  size_t *mark = m->mark;
  kvidx_score *all = m->all;
  memset(mark, 0, n * sizeof *mark);
  q[0].chain = locals[0];
  q[0].pos = 0;
  for (size_t i = 1; i < n; i++) {
    q[i].chain = kvidx_seq_hash_next(q[i - 1].chain, locals[i]);
    q[i].pos = i;
  }
  qsort(q, n, sizeof *q, fm_qcmp);
  size_t found = 0;
  for (size_t i = 0; i < m->nw; i++) {
    const fm_worker *w = &m->w[i];
    for (size_t j = 0; j < w->n; j++) {
      size_t lo = 0, hi = n; /* first q with chain >= the block's */
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (q[mid].chain < w->b[j].chain) lo = mid + 1;
        else hi = mid;
      }
      for (; lo < n && q[lo].chain == w->b[j].chain; lo++) mark[q[lo].pos] = i + 1;
    }
    size_t k = 0;
    while (k < n && mark[k] == i + 1) k++;
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
