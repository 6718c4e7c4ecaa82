/* fuzz_common.h - shared pieces of the kvidx fuzz targets (fuzz_ops.c,
 * fuzz_capacity.c): the input reader, the worker set, the harness's own shadow
 * of which seqs each worker holds (with the local-hash path of each, to build
 * queries), op generation, and result comparison with printed diffs.
 *
 * The shadow is driven by the reference kind's statuses, so it mirrors the
 * reference model; it only steers op generation (parents, removals, queries).
 * Correctness is always judged by comparing index answers.
 *
 * Set FUZZ_VERBOSE=1 in the environment to print every decoded op. */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx.h"

/* ---- input reader: reads past the end give zeros ------------------------ */
typedef struct {
  const uint8_t *p;
  size_t n, i;
} fz_rd;

static inline uint8_t fz_u8(fz_rd *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static inline int fz_more(const fz_rd *r) { return r->i < r->n; }
static inline uint64_t fz_u64(fz_rd *r) {
  uint64_t v = 0;
  for (int k = 0; k < 8; k++) v |= (uint64_t)fz_u8(r) << (8 * k);
  return v;
}

static int fz_verbose = -1;
static inline int fz_is_verbose(void) {
  if (fz_verbose < 0) {
    const char *e = getenv("FUZZ_VERBOSE");
    fz_verbose = (e && *e && *e != '0') ? 1 : 0;
  }
  return fz_verbose;
}
#define FZ_LOG(...)                                                            \
  do {                                                                         \
    if (fz_is_verbose()) fprintf(stderr, __VA_ARGS__);                         \
  } while (0)

#define FZ_FAIL(...)                                                           \
  do {                                                                         \
    fprintf(stderr, "\n*** FUZZ MISMATCH (%s:%d): ", __FILE__, __LINE__);      \
    fprintf(stderr, __VA_ARGS__);                                              \
    fputc('\n', stderr);                                                       \
    fflush(stderr);                                                            \
    abort();                                                                   \
  } while (0)

static inline const char *fz_kind_name(int k) {
  return k == KVIDX_RADIX ? "radix"
       : k == KVIDX_POSITIONAL ? "positional"
       : k == KVIDX_REFERENCE ? "reference" : "?";
}

/* ---- workers: a small set of (worker_id, dp_rank) pairs ------------------
 * Two pairs share worker_id 1 and two share 3 (remove_worker hits both);
 * extreme values included. */
#define FZ_NW 8
static const uint64_t FZ_WID[FZ_NW] = {1, 1, 2, 3, 3, UINT64_MAX, 0, 42};
static const uint32_t FZ_WDP[FZ_NW] = {0, 1, 0, 0, 7, UINT32_MAX, 0, 3};

/* Bulk workers (to push worker slots past bitset word boundaries):
 * worker_id FZ_BULK_BASE + i, dp_rank 0, one block each. */
#define FZ_BULK_BASE 0x100000u
#define FZ_BULK_MAX 1300

/* Tiny local-hash alphabet, so chunk / position collisions are common. */
static const uint64_t FZ_ALPHA[8] = {0x11, 0x22, 0x33, 0x44,
                                     0,    UINT64_MAX, 0x11, 0x22};
static inline uint64_t fz_local(uint8_t b) { return FZ_ALPHA[b & 7]; }
/* Opaque engine seq hashes: a small alphabet too (re-store collisions). */
static inline uint64_t fz_opaque(uint8_t b) { return 0xA5A5000000000000ull + (b & 15); }

/* ---- shadow ---------------------------------------------------------------- */
#define FZ_NODES 65536 /* path nodes (append-only per input)      */
#define FZ_HELD 2048   /* shadow entries per worker               */
#define FZ_QMAX 512    /* longest query                            */
#define FZ_MAXN 256    /* most blocks per store / seqs per remove  */
#define FZ_SWEEP 32    /* most queries per full comparison         */

typedef struct {
  uint64_t local;
  int32_t parent; /* -1: root */
  uint32_t depth; /* 1 for a root block */
} fz_node;

typedef struct {
  uint64_t seq;
  int32_t node;
} fz_held;

typedef struct {
  fz_node nodes[FZ_NODES];
  uint32_t n_nodes;
  fz_held held[FZ_NW][FZ_HELD];
  uint32_t n_held[FZ_NW];
} fz_shadow;

static inline void fz_shadow_reset(fz_shadow *s) {
  s->n_nodes = 0;
  memset(s->n_held, 0, sizeof s->n_held);
}

static inline int fz_find_held(const fz_shadow *s, int w, uint64_t seq) {
  for (uint32_t i = 0; i < s->n_held[w]; i++)
    if (s->held[w][i].seq == seq) return (int)i;
  return -1;
}

/* Path of locals root..node into q (at most cap, the prefix); returns length. */
static inline size_t fz_path(const fz_shadow *s, int32_t node, uint64_t *q, size_t cap) {
  if (node < 0) return 0;
  size_t d = s->nodes[node].depth;
  /* walk up, writing from the end; drop the part beyond cap */
  size_t len = d < cap ? d : cap;
  for (size_t i = d; node >= 0; i--) {
    if (i - 1 < len) q[i - 1] = s->nodes[node].local;
    node = s->nodes[node].parent;
  }
  return len;
}

/* ---- ops ------------------------------------------------------------------ */
enum { FZ_STORE, FZ_REMOVE, FZ_CLEAR, FZ_RMW, FZ_FIND, FZ_BULK, FZ_BULK_RM, FZ_CHECK, FZ_EXPIRE };

/* Set by the harness when the index runs with cfg.evict = KVIDX_EVICT_EXPIRY:
 * stores then carry an expiry (kvidx_store_ttl) and op 13 is kvidx_expire. */
static int fz_expiry_mode;

typedef struct {
  int type;
  int w;          /* small-worker index, or -1 */
  uint64_t wid;   /* worker_id (store/remove/clear/remove_worker) */
  uint32_t dp;
  int has_parent;
  uint64_t parent;
  uint64_t expires; /* FZ_STORE in expiry mode: 0 = plain kvidx_store; FZ_EXPIRE: now */
  kvidx_block b[FZ_MAXN];
  uint64_t seqs[64];
  size_t n;
  uint64_t q[FZ_QMAX];
  size_t qn, cap;
  unsigned bulk_lo, bulk_k, bulk_distinct;
} fz_op;

/* Builds a query from a stored chain with a mutation. */
static inline void fz_gen_query(fz_rd *r, const fz_shadow *s, uint64_t *q, size_t *qn) {
  uint8_t src = fz_u8(r), ix = fz_u8(r), mut = fz_u8(r), arg = fz_u8(r);
  size_t n = 0;
  int w = src % FZ_NW;
  if (src < 224 && s->n_held[w]) {
    n = fz_path(s, s->held[w][ix % s->n_held[w]].node, q, FZ_QMAX);
  } else if (src < 240) {
    /* any worker's entry */
    for (int k = 0; k < FZ_NW; k++) {
      int ww = (w + k) % FZ_NW;
      if (s->n_held[ww]) {
        n = fz_path(s, s->held[ww][ix % s->n_held[ww]].node, q, FZ_QMAX);
        break;
      }
    }
  } else {
    n = ix % 24; /* random alphabet query, maybe empty */
    for (size_t i = 0; i < n; i++) q[i] = fz_local((uint8_t)(arg + i * (ix | 1)));
  }
  size_t pos = n ? ((size_t)(mut & 63) << 8 | arg) % (n + 1) : 0;
  switch (mut >> 6) {
  case 0: break; /* as stored */
  case 1:        /* replace one local */
    if (pos < n) q[pos] = fz_local(arg);
    break;
  case 2: n = pos; break; /* truncate */
  case 3: {               /* append */
    size_t k = 1 + (arg & 15);
    for (size_t i = 0; i < k && n < FZ_QMAX; i++) q[n++] = fz_local((uint8_t)(arg >> 4) + (uint8_t)i);
    break;
  }
  }
  *qn = n;
}

static inline size_t fz_gen_cap(fz_rd *r) {
  uint8_t c = fz_u8(r);
  if (c < 96) return c & 7;
  return FZ_NW + FZ_BULK_MAX + 8; /* enough for everyone */
}

/* Decodes one op.  `bulk_budget` limits bulk work per input. */
static inline void fz_gen_op(fz_rd *r, const fz_shadow *s, fz_op *op, unsigned *bulk_budget) {
  uint8_t code = fz_u8(r);
  memset(op, 0, offsetof(fz_op, b));
  op->w = -1;
  switch (code % 16) {
  case 0: case 1: case 2: case 3: case 4: case 5: { /* store (5: a long run) */
    uint8_t wb = fz_u8(r), pm = fz_u8(r), pi = fz_u8(r), nb = fz_u8(r), sm = fz_u8(r);
    int w = wb % FZ_NW;
    op->type = FZ_STORE;
    op->w = w;
    op->wid = FZ_WID[w];
    op->dp = FZ_WDP[w];
    uint64_t prev = 0;
    switch (pm & 3) {
    case 0: op->has_parent = 0; break;
    case 1: case 2:
      if (s->n_held[w]) {
        op->has_parent = 1;
        op->parent = s->held[w][pi % s->n_held[w]].seq;
        break;
      }
      op->has_parent = 0;
      break;
    case 3: { /* unknown parent: opaque value, or a seq another worker holds */
      op->has_parent = 1;
      int o = (w + 1 + (pi % (FZ_NW - 1))) % FZ_NW;
      if ((pm & 4) && s->n_held[o])
        op->parent = s->held[o][(pi >> 3) % s->n_held[o]].seq;
      else
        op->parent = fz_opaque(pi);
      break;
    }
    }
    if (op->has_parent) prev = op->parent;
    if (fz_expiry_mode) op->expires = fz_u8(r); /* tiny clock: expiries collide */
    size_t n = (nb & 0x80) ? (size_t)(nb & 63) : (size_t)1 + (nb & 7);
    /* a long run (64..256 blocks) from a PRNG seeded by two input bytes:
     * pushes the entry count past the first entry chunk */
    int longrun = code % 16 == 5;
    uint32_t rng = 0;
    if (longrun) {
      n = 64 + (size_t)nb * 3 / 4; /* 64..255 */
      rng = (uint32_t)fz_u8(r) << 8 | fz_u8(r);
      rng = rng * 2654435761u + 1;
    }
    op->n = n;
    for (size_t i = 0; i < n; i++) {
      uint8_t lb;
      if (longrun) {
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        lb = (uint8_t)(rng >> 8);
      } else {
        lb = fz_u8(r);
      }
      uint64_t local = fz_local(lb);
      uint64_t seq;
      /* sm: 0..1 contract, 2 opaque, 3 mixed per block */
      int opaque = (sm & 3) == 2 || ((sm & 3) == 3 && (lb & 0x80));
      if (opaque)
        seq = fz_opaque((uint8_t)(lb >> 3));
      else
        seq = (i == 0 && !op->has_parent) ? local : kvidx_seq_hash_next(prev, local);
      op->b[i].local = local;
      op->b[i].seq = seq;
      prev = seq;
    }
    break;
  }
  case 6: case 7: case 8: { /* remove */
    uint8_t wb = fz_u8(r), nb = fz_u8(r);
    int w = wb % FZ_NW;
    op->type = FZ_REMOVE;
    op->w = w;
    op->wid = FZ_WID[w];
    op->dp = FZ_WDP[w];
    op->n = (nb & 0x80) ? (size_t)(nb & 63) : (size_t)1 + (nb & 3);
    for (size_t i = 0; i < op->n; i++) {
      uint8_t sb = fz_u8(r);
      if (sb < 224 && s->n_held[w])
        op->seqs[i] = s->held[w][sb % s->n_held[w]].seq;
      else
        op->seqs[i] = fz_opaque(sb);
    }
    break;
  }
  case 9: { /* clear */
    uint8_t wb = fz_u8(r);
    op->type = FZ_CLEAR;
    if (wb < 240) {
      op->w = wb % FZ_NW;
      op->wid = FZ_WID[op->w];
      op->dp = FZ_WDP[op->w];
    } else {
      op->wid = FZ_BULK_BASE + (wb & 15); /* a bulk worker (or unknown) */
      op->dp = 0;
    }
    break;
  }
  case 10: { /* remove_worker */
    uint8_t wb = fz_u8(r);
    op->type = FZ_RMW;
    op->wid = wb < 240 ? FZ_WID[wb % FZ_NW] : (uint64_t)FZ_BULK_BASE + (wb & 15);
    break;
  }
  case 13:
    if (fz_expiry_mode) {
      op->type = FZ_EXPIRE;
      op->expires = fz_u8(r);
      break;
    }
    /* fall through */
  case 11: case 12: /* find_matches */
    op->type = FZ_FIND;
    fz_gen_query(r, s, op->q, &op->qn);
    op->cap = fz_gen_cap(r);
    break;
  case 14: { /* bulk store / bulk remove */
    uint8_t kb = fz_u8(r), lb = fz_u8(r);
    unsigned k = (kb & 0x40) ? 1000u + (kb & 63u) * 4u : 1u + (kb & 63u);
    if (k > *bulk_budget) k = *bulk_budget;
    *bulk_budget -= k;
    op->type = (kb & 0x80) ? FZ_BULK_RM : FZ_BULK;
    op->bulk_lo = lb & 31;
    op->bulk_k = k;
    op->bulk_distinct = (lb >> 5) & 3; /* 0 shared local, 1 own local, 2-3 staircase */
    if (op->bulk_distinct >= 2) {
      op->bulk_distinct = 2;
      if (op->bulk_k > 96) op->bulk_k = 96; /* ~3,000 holdings */
    }
    break;
  }
  default:
    op->type = FZ_CHECK;
    break;
  }
}

/* A store op on one index: kvidx_store, or kvidx_store_ttl when it has an
 * expiry. */
static inline int fz_store(kvidx *ix, const fz_op *op) {
  const uint64_t *par = op->has_parent ? &op->parent : NULL;
  const kvidx_block *b = op->n ? op->b : NULL;
  if (op->expires) return kvidx_store_ttl(ix, op->wid, op->dp, par, b, op->n, op->expires);
  return kvidx_store(ix, op->wid, op->dp, par, b, op->n);
}

/* Bulk worker i's blocks (returns how many): mode 0 one block with a shared
 * local, 1 one block with a local of its own (then every bulk worker adds an
 * index entry), 2 a "staircase": a prefix, of length 1 + (i * 7) % 61, of
 * one common chain fz_stair(), so that ~hundreds of workers drain at
 * different depths of one query. */
#define FZ_BULK_LOCAL 0xB0000000u
#define FZ_STAIR 64
static inline uint64_t fz_stair(unsigned j) { return FZ_ALPHA[(j * j + 3 * j) % 5 & 3]; }
static inline size_t fz_bulk_blocks(unsigned i, unsigned mode, kvidx_block *b) {
  if (mode == 2) {
    size_t n = 1 + (i * 7u) % 61u;
    for (size_t j = 0; j < n; j++) {
      b[j].local = fz_stair((unsigned)j);
      b[j].seq = j ? kvidx_seq_hash_next(b[j - 1].seq, b[j].local) : b[j].local;
    }
    return n;
  }
  b[0].local = mode ? FZ_BULK_LOCAL + i : FZ_ALPHA[(i * 7u) & 3];
  b[0].seq = b[0].local;
  return 1;
}

/* Shadow update after an op the reference applied with status st. */
static inline void fz_shadow_apply(fz_shadow *s, const fz_op *op, int st) {
  switch (op->type) {
  case FZ_STORE: {
    if (st != KVIDX_OK) return;
    int w = op->w;
    int32_t cur = -1;
    if (op->has_parent) {
      int h = fz_find_held(s, w, op->parent);
      if (h < 0) return; /* the shadow lost it (full) */
      cur = s->held[w][h].node;
    }
    for (size_t i = 0; i < op->n; i++) {
      int h = fz_find_held(s, w, op->b[i].seq);
      if (h >= 0) {
        cur = s->held[w][h].node;
        continue;
      }
      if (s->n_nodes >= FZ_NODES || s->n_held[w] >= FZ_HELD) return;
      int32_t nd = (int32_t)s->n_nodes++;
      s->nodes[nd].local = op->b[i].local;
      s->nodes[nd].parent = cur;
      s->nodes[nd].depth = cur < 0 ? 1 : s->nodes[cur].depth + 1;
      s->held[w][s->n_held[w]].seq = op->b[i].seq;
      s->held[w][s->n_held[w]].node = nd;
      s->n_held[w]++;
      cur = nd;
    }
    break;
  }
  case FZ_REMOVE:
    if (st != KVIDX_OK && st != KVIDX_ENOENT) return;
    for (size_t i = 0; i < op->n; i++) {
      int h = fz_find_held(s, op->w, op->seqs[i]);
      if (h >= 0) s->held[op->w][h] = s->held[op->w][--s->n_held[op->w]];
    }
    break;
  case FZ_CLEAR:
    if (st != KVIDX_OK) return;
    for (int w = 0; w < FZ_NW; w++)
      if (FZ_WID[w] == op->wid && FZ_WDP[w] == op->dp) s->n_held[w] = 0;
    break;
  case FZ_RMW:
    if (st != KVIDX_OK) return;
    for (int w = 0; w < FZ_NW; w++)
      if (FZ_WID[w] == op->wid) s->n_held[w] = 0;
    break;
  default: break;
  }
}

static inline void fz_print_u64s(const char *what, const uint64_t *v, size_t n) {
  fprintf(stderr, "%s[%zu] = {", what, n);
  for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%#llx", i ? ", " : "", (unsigned long long)v[i]);
  fprintf(stderr, "}\n");
}

static inline void fz_log_op(const fz_op *op, int idx) {
  if (!fz_is_verbose()) return;
  fprintf(stderr, "op %d: ", idx);
  switch (op->type) {
  case FZ_STORE:
    fprintf(stderr, "store(w=(%llu,%u), parent=", (unsigned long long)op->wid, op->dp);
    if (op->has_parent) fprintf(stderr, "%#llx", (unsigned long long)op->parent);
    else fprintf(stderr, "root");
    fprintf(stderr, ", n=%zu", op->n);
    if (op->expires) fprintf(stderr, ", expires_at=%llu", (unsigned long long)op->expires);
    fprintf(stderr, ") blocks(local/seq):");
    for (size_t i = 0; i < op->n; i++)
      fprintf(stderr, " %#llx/%#llx", (unsigned long long)op->b[i].local, (unsigned long long)op->b[i].seq);
    fputc('\n', stderr);
    break;
  case FZ_REMOVE:
    fprintf(stderr, "remove(w=(%llu,%u)) ", (unsigned long long)op->wid, op->dp);
    fz_print_u64s("seqs", op->seqs, op->n);
    break;
  case FZ_CLEAR: fprintf(stderr, "clear(w=(%llu,%u))\n", (unsigned long long)op->wid, op->dp); break;
  case FZ_RMW: fprintf(stderr, "remove_worker(%llu)\n", (unsigned long long)op->wid); break;
  case FZ_FIND:
    fprintf(stderr, "find_matches(cap=%zu) ", op->cap);
    fz_print_u64s("q", op->q, op->qn);
    break;
  case FZ_BULK:
    fprintf(stderr, "bulk_store(k=%u, ids %#x+%u.., %s)\n", op->bulk_k, FZ_BULK_BASE, op->bulk_lo,
            op->bulk_distinct == 2 ? "staircase" : op->bulk_distinct ? "own locals" : "shared local");
    break;
  case FZ_BULK_RM: fprintf(stderr, "bulk_remove_worker(k=%u from %u)\n", op->bulk_k, op->bulk_lo); break;
  case FZ_CHECK: fprintf(stderr, "check\n"); break;
  case FZ_EXPIRE: fprintf(stderr, "expire(now=%llu)\n", (unsigned long long)op->expires); break;
  }
}

/* ---- comparing answers ----------------------------------------------------- */
static inline void fz_print_scores(const char *name, const kvidx_score *sc, size_t n) {
  fprintf(stderr, "  %-10s [%zu]:", name, n);
  for (size_t i = 0; i < n; i++)
    fprintf(stderr, " (%llu,%u):%u", (unsigned long long)sc[i].worker_id, sc[i].dp_rank, sc[i].depth);
  fputc('\n', stderr);
}

/* Sanity of one answer by itself: sorted, depths in 1..qn, no duplicates. */
static inline void fz_sane_scores(const char *name, const kvidx_score *sc, size_t n, size_t qn) {
  for (size_t i = 0; i < n; i++) {
    if (sc[i].depth < 1 || sc[i].depth > qn) {
      fz_print_scores(name, sc, n);
      FZ_FAIL("%s: score %zu has depth %u outside 1..%zu", name, i, sc[i].depth, qn);
    }
    if (i) {
      const kvidx_score *a = &sc[i - 1], *b = &sc[i];
      int ok = a->depth > b->depth ||
               (a->depth == b->depth && (a->worker_id < b->worker_id ||
                                         (a->worker_id == b->worker_id && a->dp_rank < b->dp_rank)));
      if (!ok) {
        fz_print_scores(name, sc, n);
        FZ_FAIL("%s: scores %zu,%zu out of order or duplicated", name, i - 1, i);
      }
    }
  }
}

/* Query and answer buffers: static, and each call places its data at the
 * END of one (exactly qn / cap elements before the array's end), so ASan's
 * redzone after a global catches any overrun, as an exact-size malloc
 * would, without a malloc per query (ASan's quarantine made fresh pages, and
 * their page faults, most of fuzz_ops' run time). */
#define FZ_CAPALL (FZ_NW + FZ_BULK_MAX + 8) /* a cap enough for everyone */
#define FZ_NBUF 3
static kvidx_score fz_sbuf[FZ_NBUF][FZ_CAPALL];
static uint64_t fz_qbuf[FZ_QMAX + 64];

/* Runs find_matches on ix with answer buffer `slot` and returns the count;
 * *out points at the written scores (min(count, cap) in *nout). */
static inline size_t fz_query_slot(const kvidx *ix, int slot, const uint64_t *q, size_t qn, size_t cap,
                                   kvidx_score **out, size_t *nout) {
  if (cap > FZ_CAPALL || qn > FZ_QMAX + 64) FZ_FAIL("fz_query: cap %zu / qn %zu too large", cap, qn);
  kvidx_score *buf = fz_sbuf[slot] + (FZ_CAPALL - cap);
  uint64_t *qq = fz_qbuf + (FZ_QMAX + 64 - qn);
  if (qn) memmove(qq, q, qn * sizeof *qq);
  if (!cap) memset(fz_sbuf[slot] + FZ_CAPALL - 1, 0xAB, sizeof *buf);
  size_t m = kvidx_find_matches(ix, qq, qn, buf, cap);
  if (!cap) {
    const unsigned char *c = (const unsigned char *)(fz_sbuf[slot] + FZ_CAPALL - 1);
    for (size_t i = 0; i < sizeof *buf; i++)
      if (c[i] != 0xAB) FZ_FAIL("find_matches wrote to out with cap 0");
  }
  *nout = m < cap ? m : cap;
  *out = buf;
  return m;
}
static inline size_t fz_query(const kvidx *ix, const uint64_t *q, size_t qn, size_t cap, kvidx_score **out,
                              size_t *nout) {
  return fz_query_slot(ix, 0, q, qn, cap, out, nout);
}

/* Compares the answers of `a` (the oracle) and `b` for query q/cap; returns
 * the number of scores compared. */
static inline size_t fz_cmp_query(const kvidx *a, const char *an, const kvidx *b, const char *bn,
                         const uint64_t *q, size_t qn, size_t cap) {
  kvidx_score *sa, *sb;
  size_t na, nb;
  size_t ma = fz_query_slot(a, 0, q, qn, cap, &sa, &na);
  size_t mb = fz_query_slot(b, 1, q, qn, cap, &sb, &nb);
  int bad = ma != mb;
  for (size_t i = 0; i < na && !bad; i++)
    if (sa[i].worker_id != sb[i].worker_id || sa[i].dp_rank != sb[i].dp_rank || sa[i].depth != sb[i].depth)
      bad = 1;
  if (bad) {
    fprintf(stderr, "find_matches mismatch, cap=%zu: %s returned %zu, %s returned %zu\n", cap,
            an, ma, bn, mb);
    fz_print_u64s("  query", q, qn);
    fz_print_scores(an, sa, na);
    fz_print_scores(bn, sb, nb);
    FZ_FAIL("find_matches: %s != %s", bn, an);
  }
  fz_sane_scores(an, sa, na, qn);
  fz_sane_scores(bn, sb, nb, qn);
  return na;
}

static inline void fz_cmp_worker_blocks(const kvidx *a, const char *an, const kvidx *b, const char *bn,
                                 uint64_t wid, uint32_t dp) {
  size_t x = kvidx_worker_blocks(a, wid, dp), y = kvidx_worker_blocks(b, wid, dp);
  if (x != y)
    FZ_FAIL("worker_blocks(%llu,%u): %s=%zu %s=%zu", (unsigned long long)wid, dp, an, x, bn, y);
}

static inline void fz_cmp_stats(const kvidx *a, const char *an, const kvidx *b, const char *bn) {
  kvidx_stats x, y;
  memset(&x, 0, sizeof x);
  memset(&y, 0, sizeof y);
  int sx = kvidx_get_stats(a, &x), sy = kvidx_get_stats(b, &y);
  if (sx != KVIDX_OK || sy != KVIDX_OK) FZ_FAIL("get_stats: %s=%d %s=%d", an, sx, bn, sy);
  if (x.blocks != y.blocks || x.workers != y.workers)
    FZ_FAIL("stats: %s blocks=%zu workers=%zu, %s blocks=%zu workers=%zu", an, x.blocks,
            x.workers, bn, y.blocks, y.workers);
}

static inline void fz_check(const kvidx *ix, const char *name) {
  int c = kvidx__check(ix);
  if (c != 0) FZ_FAIL("kvidx__check(%s) = %d", name, c);
}

/* Everything the shadow knows, as a sweep: every held entry's path as a
 * query (at most ~FZ_SWEEP, a stride through each worker's entries;
 * truncations come for free: scores are per worker), worker_blocks of every
 * small worker and a sample of bulk workers, single-block and staircase
 * queries.  qf / wf compare one query / one worker_blocks across whatever
 * the caller compares. */
typedef void (*fz_query_fn)(void *ctx, const uint64_t *q, size_t n, size_t cap);
typedef void (*fz_wb_fn)(void *ctx, uint64_t wid, uint32_t dp);
static inline void fz_sweep(const fz_shadow *s, unsigned bulk_hi, fz_query_fn qf, fz_wb_fn wf, void *ctx) {
  static uint64_t q[FZ_QMAX];
  uint32_t total = 0;
  for (int w = 0; w < FZ_NW; w++) total += s->n_held[w];
  uint32_t stride = total / FZ_SWEEP + 1;
  for (int w = 0; w < FZ_NW; w++) {
    wf(ctx, FZ_WID[w], FZ_WDP[w]);
    for (uint32_t i = (uint32_t)w % stride; i < s->n_held[w]; i += stride) {
      size_t n = fz_path(s, s->held[w][i].node, q, FZ_QMAX);
      qf(ctx, q, n, FZ_CAPALL);
    }
  }
  for (unsigned i = 0; i < bulk_hi; i += 1 + i / 8) wf(ctx, FZ_BULK_BASE + i, 0);
  for (int k = 0; k < 4; k++) {
    q[0] = FZ_ALPHA[k];
    qf(ctx, q, 1, FZ_CAPALL);
  }
  for (unsigned i = 0; i < bulk_hi; i += 1 + i / 4) {
    q[0] = FZ_BULK_LOCAL + i;
    qf(ctx, q, 1, 4);
  }
  if (bulk_hi) { /* the staircase chain, whole and with a change half way */
    for (unsigned j = 0; j < FZ_STAIR; j++) q[j] = fz_stair(j);
    qf(ctx, q, FZ_STAIR, FZ_CAPALL);
    q[bulk_hi % FZ_STAIR] ^= 0x77;
    qf(ctx, q, FZ_STAIR, 16);
  }
}

typedef struct {
  const kvidx *a, *b;
  const char *an, *bn;
} fz_pair;
static inline void fz_pair_query(void *ctx, const uint64_t *q, size_t n, size_t cap) {
  const fz_pair *p = (const fz_pair *)ctx;
  fz_cmp_query(p->a, p->an, p->b, p->bn, q, n, cap);
}
static inline void fz_pair_wb(void *ctx, uint64_t wid, uint32_t dp) {
  const fz_pair *p = (const fz_pair *)ctx;
  fz_cmp_worker_blocks(p->a, p->an, p->b, p->bn, wid, dp);
}

/* The full sweep between two indexes, plus the semantic stats. */
static inline void fz_cmp_full(const fz_shadow *s, const kvidx *a, const char *an, const kvidx *b,
                        const char *bn, unsigned bulk_hi) {
  fz_pair p = {a, b, an, bn};
  fz_sweep(s, bulk_hi, fz_pair_query, fz_pair_wb, &p);
  fz_cmp_stats(a, an, b, bn);
}

#endif
