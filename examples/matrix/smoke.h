/* matrix/smoke.h - a behavioural smoke test shared by the compile-matrix
 * programs: Dynamo hash vector, store/query/remove on every kind, and the
 * caller-buffer mode.  Returns 0 when all is well, else a line number. */
#ifndef KVIDX_MATRIX_SMOKE_H
#define KVIDX_MATRIX_SMOKE_H
#include <string.h>
#include "kvidx.h"

static int kvidx_matrix_smoke(void) {
  /* tests/dynamo_hash_vectors.json: "counting 0..99, block 16" */
  static const uint64_t want_local0 = 15310707395893867146ull;
  static const uint64_t want_seq1 = 13769157705258532664ull;
  static unsigned char buf[1u << 20];
  uint32_t tok[100];
  uint64_t loc[6], seq[6];
  kvidx_block b[6];
  kvidx_score sc[4];
  size_t i, n;
  int kind;
  for (i = 0; i < 100; i++) tok[i] = (uint32_t)i;
  n = kvidx_block_hashes(tok, 100, 16, KVIDX_SEED, loc);
  if (n != 6 || loc[0] != want_local0) return __LINE__;
  kvidx_seq_hashes(loc, n, seq);
  if (seq[1] != want_seq1 || kvidx_seq_hash_next(seq[0], loc[1]) != want_seq1)
    return __LINE__;
  if (kvidx_hash_seed(NULL, NULL) != KVIDX_SEED) return __LINE__;
  for (i = 0; i < n; i++) {
    b[i].local = loc[i];
    b[i].seq = seq[i];
  }
  for (kind = KVIDX_RADIX; kind <= KVIDX_REFERENCE; kind++) {
    int mode;
    for (mode = 0; mode < 2; mode++) {
      kvidx_config cfg;
      kvidx *ix = NULL;
      memset(&cfg, 0, sizeof cfg);
      cfg.kind = kind;
      if (mode == 1) { /* caller buffer */
        cfg.max_blocks = 256;
        cfg.max_workers = 8;
        if (kvidx_buffer_size(&cfg) == 0 || kvidx_buffer_size(&cfg) > sizeof buf)
          continue; /* this kind has no buffer mode */
        if (kvidx_init_buffer(&ix, &cfg, buf, sizeof buf) != KVIDX_OK) return __LINE__;
      } else {
#ifdef KVIDX_NO_MALLOC
        continue;
#else
        if (kvidx_create(&ix, &cfg) != KVIDX_OK) return __LINE__;
#endif
      }
      if (kvidx_store(ix, 1, 0, NULL, b, n) != KVIDX_OK) return __LINE__;
      if (kvidx_store(ix, 2, 0, NULL, b, 2) != KVIDX_OK) return __LINE__;
      if (kvidx_find_matches(ix, loc, n, sc, 4) != 2) return __LINE__;
      if (sc[0].worker_id != 1 || sc[0].depth != 6 || sc[1].depth != 2) return __LINE__;
      if (kvidx_remove(ix, 1, 0, &seq[3], 1) != KVIDX_OK) return __LINE__;
      if (kvidx_find_matches(ix, loc, n, sc, 4) != 2 || sc[0].depth != 3) return __LINE__;
      if (kvidx_clear(ix, 2, 0) != KVIDX_OK) return __LINE__;
      if (kvidx_worker_blocks(ix, 1, 0) != 5) return __LINE__;
      if (kvidx__check(ix) != 0) return __LINE__;
      kvidx_destroy(ix);
    }
  }
  return 0;
}
#endif
