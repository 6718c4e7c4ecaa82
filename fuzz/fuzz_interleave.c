/* fuzz_interleave: reader queries at the writer's hook points (single
 * thread, deterministic), checking the old-or-new-answer rule.
 *
 * kvidx.h calls KVIDX_TEST_HOOK(ix, where) inside every writer critical
 * section (seqlock write windows, entry re-keying, bucket rebuilds, unlinks,
 * holed-mark changes).  Here the hook runs a fuzzer-chosen set of queries
 * with kvidx__find_matches_once (no retries): each answer must either ask to
 * retry (it met a write in progress) or equal the answer before or after the
 * single-block event being applied.
 *
 * Input bytecode: byte 0 kind (radix / positional), byte 1 jump (1..16),
 * then 6 query specs of 1 + up to 8 bytes (length, locals), then ops of
 * 3 bytes: [op, worker, arg]: op&3 = 0..2 store one block (arg: local,
 * parent choice), 3 remove one held block. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct kvidx;
static void fi_hook(struct kvidx *ix, int where);
#define KVIDX_TEST_HOOK(ix, where) fi_hook(ix, where)
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include "fz_seed.h"

#define FI_NQ 6
#define FI_CAP 8
typedef struct {
  size_t total;
  kvidx_score sc[FI_CAP];
} fi_answer;

static uint64_t fi_q[FI_NQ][8];
static size_t fi_qn[FI_NQ];
static fi_answer fi_old[FI_NQ], fi_mid[FI_NQ * 64];
static int fi_midq[FI_NQ * 64], fi_nmid, fi_armed;

static void fi_ask(const kvidx *ix, int q, fi_answer *a, int *retry) {
  memset(a, 0, sizeof *a);
  a->total = kvidx__find_matches_once(ix, fi_q[q], fi_qn[q], a->sc, FI_CAP, retry);
}
static int fi_same(const fi_answer *a, const fi_answer *b) {
  return a->total == b->total && !memcmp(a->sc, b->sc, sizeof(kvidx_score) * (a->total < FI_CAP ? a->total : FI_CAP));
}

static void fi_hook(struct kvidx *ix, int where) {
  int q, retry;
  (void)where;
  if (!fi_armed) return;
  for (q = 0; q < FI_NQ && fi_nmid < FI_NQ * 64; q++) {
    fi_ask(ix, q, &fi_mid[fi_nmid], &retry);
    if (!retry) fi_midq[fi_nmid++] = q;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  size_t i = 0;
  kvidx_config c;
  kvidx *ix;
  uint64_t held[4][32];
  size_t nheld[4] = {0};
  int q, op;
  if (n < 2) return 0;
  memset(&c, 0, sizeof c);
  c.seed = FZ_TABLE_SEED;
  c.kind = d[0] & 1 ? KVIDX_POSITIONAL : KVIDX_RADIX;
  c.jump = 1u + d[1] % 16u;
  c.max_workers = 8;
  i = 2;
  for (q = 0; q < FI_NQ; q++) {
    size_t len = i < n ? 1u + d[i++] % 8u : 1u, k;
    fi_qn[q] = len;
    for (k = 0; k < len; k++) fi_q[q][k] = 1u + (i < n ? d[i++] % 3u : 0u);
  }
  if (kvidx_create(&ix, &c) != KVIDX_OK) abort();
  for (op = 0; i + 3 <= n && op < 400; op++, i += 3) {
    uint8_t o = d[i], w = d[i + 1] % 4, arg = d[i + 2];
    fi_answer now;
    int retry, k;
    for (q = 0; q < FI_NQ; q++) {
      fi_ask(ix, q, &fi_old[q], &retry);
      if (retry) { /* no write is in progress between events */
        fprintf(stderr, "fuzz_interleave: retry outside any write\n");
        abort();
      }
    }
    fi_nmid = 0;
    fi_armed = 1;
    if ((o & 3) != 3 || !nheld[w]) {
      kvidx_block b;
      uint64_t parent = 0;
      int has_parent = nheld[w] && (arg & 0x30);
      b.local = 1u + (arg & 3) % 3u;
      if (has_parent) parent = held[w][(arg >> 2) % nheld[w]];
      b.seq = has_parent ? kvidx_seq_hash_next(parent, b.local) : b.local;
      if (kvidx_store(ix, w, 0, has_parent ? &parent : NULL, &b, 1) == KVIDX_OK && nheld[w] < 32)
        held[w][nheld[w]++] = b.seq;
    } else {
      size_t at = arg % nheld[w];
      kvidx_remove(ix, w, 0, &held[w][at], 1);
      held[w][at] = held[w][--nheld[w]];
    }
    fi_armed = 0;
    for (k = 0; k < fi_nmid; k++) {
      fi_ask(ix, fi_midq[k], &now, &retry);
      if (!fi_same(&fi_mid[k], &fi_old[fi_midq[k]]) && !fi_same(&fi_mid[k], &now)) {
        fprintf(stderr, "fuzz_interleave: op %d (%s): a mid-update answer to query %d is neither old nor new\n",
                op, c.kind == KVIDX_RADIX ? "radix" : "positional", fi_midq[k]);
        abort();
      }
    }
  }
  if (kvidx__check(ix)) abort();
  kvidx_destroy(ix);
  return 0;
}
