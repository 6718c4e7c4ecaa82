/* basic.c - the smallest complete kvidx program.
 *
 * Hash a prompt into KV blocks, feed Stored events for two workers, ask which
 * worker holds the longest prefix of the prompt, print the scores.
 *
 *   make examples && build/examples/basic
 */
#define KVIDX_IMPLEMENTATION /* in exactly one .c file of your program */
#include "kvidx.h"

#include <stdio.h>
#include <stdlib.h>

enum { BLOCK_SIZE = 16, N_TOKENS = 128, N_BLOCKS = N_TOKENS / BLOCK_SIZE };

static void die(const char *what, int rc) {
  fprintf(stderr, "basic: %s: %s\n", what, kvidx_strerror(rc));
  exit(1);
}

int main(void) {
  uint32_t tokens[N_TOKENS];
  uint64_t local[N_BLOCKS], seq[N_BLOCKS];
  kvidx_block blocks[N_BLOCKS];
  kvidx_score scores[16];
  kvidx_config cfg = {0}; /* zero = working defaults */
  kvidx *ix;
  size_t i, n, m;
  int rc;

  for (i = 0; i < N_TOKENS; i++) tokens[i] = (uint32_t)(1000 + i * 7);

  /* Block hashes exactly as the engine and Dynamo compute them. */
  n = kvidx_block_hashes(tokens, N_TOKENS, BLOCK_SIZE, KVIDX_SEED, local);
  kvidx_seq_hashes(local, n, seq);
  for (i = 0; i < n; i++) {
    blocks[i].local = local[i];
    blocks[i].seq = seq[i];
  }

  cfg.kind = KVIDX_POSITIONAL;
  if ((rc = kvidx_create(&ix, &cfg)) != KVIDX_OK) die("create", rc);

  /* Worker 10 holds the whole prompt, worker 20 only its first 3 blocks,
   * stored as two events: blocks 0-1 from the root, then block 2 chained to
   * block 1 through its parent seq hash. */
  if ((rc = kvidx_store(ix, 10, 0, NULL, blocks, n)) != KVIDX_OK) die("store 10", rc);
  if ((rc = kvidx_store(ix, 20, 0, NULL, blocks, 2)) != KVIDX_OK) die("store 20", rc);
  if ((rc = kvidx_store(ix, 20, 0, &seq[1], &blocks[2], 1)) != KVIDX_OK)
    die("store 20 (child)", rc);

  /* A parent the worker does not hold is refused and changes nothing. */
  rc = kvidx_store(ix, 30, 0, &seq[4], &blocks[5], 1);
  printf("store with unknown parent: %s\n", kvidx_strerror(rc));

  m = kvidx_find_matches(ix, local, n, scores, 16);
  printf("prompt of %zu blocks, %zu workers match\n", n, m);
  for (i = 0; i < m && i < 16; i++)
    printf("worker %llu dp_rank %u depth %u\n",
           (unsigned long long)scores[i].worker_id, scores[i].dp_rank,
           scores[i].depth);

  printf("worker 20 holds %zu blocks\n", kvidx_worker_blocks(ix, 20, 0));
  kvidx_destroy(ix);
  return 0;
}
