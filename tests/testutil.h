/* Tiny test harness shared by the core tests. */
#ifndef KVIDX_TESTUTIL_H
#define KVIDX_TESTUTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvidx.h"

extern int t_fails, t_checks;
#define CHECK(c)                                                                 \
  do {                                                                           \
    t_checks++;                                                                  \
    if (!(c)) {                                                                  \
      t_fails++;                                                                 \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);      \
    }                                                                            \
  } while (0)
#define CHECK_EQ(a, b)                                                           \
  do {                                                                           \
    long long a_ = (long long)(a), b_ = (long long)(b);                          \
    t_checks++;                                                                  \
    if (a_ != b_) {                                                              \
      t_fails++;                                                                 \
      fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__,      \
              __LINE__, #a, a_, #b, b_);                                         \
    }                                                                            \
  } while (0)

/* splitmix64: deterministic, seedable */
static inline uint64_t t_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
static inline uint32_t t_below(uint64_t *s, uint32_t n) { return (uint32_t)(t_rand(s) % n); }

/* The differential tests drive three indexes in this order: the reference
 * first, whose answers the others must give; t_kind_name(k) names T_KINDS[k]. */
static const int T_KINDS[3] = {KVIDX_REFERENCE, KVIDX_RADIX, KVIDX_POSITIONAL};
static inline const char *t_kind_name(int k) {
  return k == 0 ? "reference" : k == 1 ? "radix" : "positional";
}
/* 1 if the radix and positional indexes returned the reference's status
 * st[0] for op number `op` (r: the op's random draw); else says which not. */
static inline int t_same_status(const int st[3], int op, uint32_t r) {
  int k, same = 1;
  for (k = 1; k < 3; k++)
    if (st[k] != st[0]) {
      fprintf(stderr, "op %d (r=%u): status %s %d vs reference %d\n", op, r, t_kind_name(k), st[k], st[0]);
      same = 0;
    }
  return same;
}

/* Allocation hooks that count and can fail on the k-th call. */
typedef struct {
  long calls, fail_at; /* fail_at < 0: never */
  long live;
  size_t bytes;
} t_alloc_ctx;
void *t_alloc(void *ctx, size_t n);
void t_free(void *ctx, void *p, size_t n);
int t_grow_layout(void); /* grow-only arrays' layout (test_impl.c): failed checks */
int t_buffer_fixed_maps(void); /* caller-buffer shared maps never grow (test_impl.c): failed checks */
int t_seq_shrink(void);        /* seq tables shrink with holdings (test_impl.c): failed checks */
int t_detached(void);          /* holes do not pin their ancestors (test_impl.c): failed checks */
int t_failed_store_shrinks(void); /* a failed store gives grown runs their length back (test_impl.c) */
int t_hint_kept(void);          /* the walk's hint survives a branch let go of (test_impl.c) */
int t_run_split(void);          /* a run's tail moves out, a store goes on in place (test_impl.c) */
int t_seq_tags(void);           /* seq-table entries' hash tags, both regimes (test_impl.c) */
int t_ctrl_collisions(void);    /* seq tables' control bytes under crafted collisions (test_impl.c) */
int t_ctrl_drain_stop(void);    /* a growth's sweep leaves no entry past a swept home (test_impl.c) */
int t_ctrl_tombstones(void);    /* deleted places: made, reused, dropped by a rebuild (test_impl.c) */
int t_check_restores(void);     /* the checker puts back what it took apart, also on failure (test_impl.c) */
int t_grow_drains(void);        /* a growth drains in every later store, the table roomy or not (test_impl.c) */
int t_blocks_per_worker(void);  /* cfg.blocks_per_worker: seq tables start with its room (test_impl.c) */
int t_ctrl_groups(void);        /* control-byte group masks against a byte loop (test_impl.c) */

/* A snapshot stream in memory: kvidx_snapshot_write / _read callbacks. */
typedef struct {
  unsigned char *buf;
  size_t len, cap, pos;
  int fail_after; /* write: fail the call after this many (-1 never) */
} t_mem;
static inline int t_mem_write(void *ctx, const void *p, size_t n) {
  t_mem *m = (t_mem *)ctx;
  if (m->fail_after == 0) return -1;
  if (m->fail_after > 0) m->fail_after--;
  if (m->len + n > m->cap) {
    unsigned char *q = (unsigned char *)realloc(m->buf, (m->len + n) * 2);
    if (!q) return -1;
    m->buf = q;
    m->cap = (m->len + n) * 2;
  }
  memcpy(m->buf + m->len, p, n);
  m->len += n;
  return 0;
}
static inline size_t t_mem_read(void *ctx, void *p, size_t n) {
  t_mem *m = (t_mem *)ctx;
  size_t k = m->len - m->pos < n ? m->len - m->pos : n;
  memcpy(p, m->buf + m->pos, k);
  m->pos += k;
  return k;
}

/* Chains of a run of locals, the way the index and reference compute them. */
static inline void t_chains(const uint64_t *loc, size_t n, uint64_t *out) { kvidx_seq_hashes(loc, n, out); }
#endif
