/* fuzz_vllm_decode: the vLLM KV-event decoder of examples/vllm_events
 * (vllm_decode.c) on untrusted messages: whole message -> decode -> apply to
 * an index -> invariant check.  After every message kvidx__check must pass
 * and the decoder's identity table must agree with its own count; a query
 * through the decoder's hashing must not fail; at the end the index goes
 * through a snapshot round trip and the identities are rebuilt from it.
 *
 * Input: byte 0 config (bit 0 radix/positional, bit 1 tiers flag, bits 2-3
 * device block size 1/2/4/16, bit 4 --all-groups, bits 5-7 identity bound
 * class); then messages [flags, seq, len_lo, len_hi, payload...]: flags bit 0
 * worker 1 or 2, bit 1 fresh connection, bits 2-7 high bits of seq.  A
 * payload shorter than declared takes what is left. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include "fz_seed.h"
#include "../examples/vllm_events/vllm_decode.h"

typedef struct {
  unsigned char *p;
  size_t len, cap, pos;
} fv_mem;

static int fv_write(void *ctx, const void *buf, size_t len) {
  fv_mem *m = (fv_mem *)ctx;
  if (m->len + len > m->cap) {
    size_t c = m->cap ? m->cap : 4096;
    unsigned char *q;
    while (c < m->len + len) c *= 2;
    q = (unsigned char *)realloc(m->p, c);
    if (!q) return 1;
    m->p = q;
    m->cap = c;
  }
  memcpy(m->p + m->len, buf, len);
  m->len += len;
  return 0;
}

static size_t fv_read(void *ctx, void *buf, size_t len) {
  fv_mem *m = (fv_mem *)ctx;
  size_t k = m->len - m->pos < len ? m->len - m->pos : len;
  memcpy(buf, m->p + m->pos, k);
  m->pos += k;
  return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t len) {
  static const size_t bsz[4] = {1, 2, 4, 16};
  static const size_t bounds[8] = {1, 4, 16, 64, 256, 1024, 4096, 65536};
  kvidx *ix = NULL, *ix2 = NULL;
  kvidx_config c;
  vd_state s;
  size_t pos = 1;
  fv_mem m = {NULL, 0, 0, 0};
  if (len < 1) return 0;
  memset(&c, 0, sizeof c);
  c.seed = FZ_TABLE_SEED;
  c.kind = (d[0] & 1) ? KVIDX_RADIX : KVIDX_POSITIONAL;
  c.flags = (d[0] & 2) ? KVIDX_F_TIERS : 0;
  c.max_workers = 8;
  if (kvidx_create(&ix, &c) != KVIDX_OK) abort();
  if (vd_init(&s, ix, bsz[(d[0] >> 2) & 3], bounds[(d[0] >> 5) & 7]) != 0) abort();
  s.all_groups = (d[0] >> 4) & 1;
  while (pos + 4 <= len) {
    uint8_t fl = d[pos];
    uint64_t seq = ((uint64_t)(fl >> 2) << 8) | d[pos + 1];
    size_t plen = (size_t)d[pos + 2] | (size_t)d[pos + 3] << 8;
    pos += 4;
    if (plen > len - pos) plen = len - pos;
    {
      /* an exact-size copy: reads past the payload are caught by ASan */
      unsigned char *pl = (unsigned char *)malloc(plen ? plen : 1);
      if (!pl) abort();
      memcpy(pl, d + pos, plen);
      vd_batch(&s, pl, plen, seq, 1 + (fl & 1), (fl >> 1) & 1);
      (void)vd_batch_dp(pl, plen);
      free(pl);
    }
    pos += plen;
    if (kvidx__check(ix) != 0) {
      fprintf(stderr, "fuzz_vllm_decode: kvidx__check failed after a message\n");
      abort();
    }
    if (vd_check(&s) != 0) {
      fprintf(stderr, "fuzz_vllm_decode: vd_check failed after a message\n");
      abort();
    }
  }
  { /* a query through the decoder's hashing (salt, mm, LoRA) */
    uint32_t tok[64];
    uint64_t loc[64];
    kvidx_score sc[8];
    vd_mm mm = {"img", 3, 5};
    vd_query q;
    size_t i, n;
    for (i = 0; i < 64; i++) tok[i] = (uint32_t)i;
    memset(&q, 0, sizeof q);
    q.salt = (d[0] & 8) ? "salt" : NULL;
    q.mm = &mm;
    q.n_mm = d[0] & 1;
    n = vd_query_locals(&s, tok, 64, &q, loc);
    if (n != 64 / s.block_size) abort();
    (void)kvidx_find_matches(ix, loc, n, sc, 8);
  }
  /* snapshot round trip: same stats; identities rebuilt from the copy */
  if (kvidx_snapshot_write(ix, fv_write, &m) == KVIDX_OK) {
    kvidx_stats a, b;
    if (kvidx_create(&ix2, &c) != KVIDX_OK) abort();
    if (kvidx_snapshot_read(ix2, fv_read, &m) != KVIDX_OK) {
      fprintf(stderr, "fuzz_vllm_decode: own snapshot refused\n");
      abort();
    }
    kvidx_get_stats(ix, &a);
    kvidx_get_stats(ix2, &b);
    if (a.blocks != b.blocks || a.workers != b.workers || kvidx__check(ix2) != 0) abort();
    {
      vd_state s2;
      if (vd_init(&s2, ix2, s.block_size, s.max_idents) != 0) abort();
      if (vd_rebuild(&s2) != 0) abort();
      if (!s.overflowed && s2.tab_n != s.tab_n) {
        fprintf(stderr, "fuzz_vllm_decode: %zu identities rebuilt, %zu before\n", s2.tab_n, s.tab_n);
        abort();
      }
      vd_free(&s2);
    }
    kvidx_destroy(ix2);
  }
  free(m.p);
  vd_free(&s);
  kvidx_destroy(ix);
  return 0;
}
