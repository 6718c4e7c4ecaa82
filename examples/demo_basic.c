/* demo_basic.c - `make demo`: what kvidx does, in one screen.
 *
 * Two workers of an LLM fleet report the KV-cache blocks they hold (as
 * vLLM / SGLang / TensorRT-LLM "Stored" events would); a router then asks,
 * for a new prompt, how many leading blocks each worker already holds.
 *
 * Build: cc -std=c11 -O2 -I. -o demo_basic examples/demo_basic.c
 */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"

#include <stdio.h>

#define BLOCK 16   /* tokens per KV block (engine's block_size) */
#define NTOK 100   /* 100 tokens = 6 full blocks + a 4-token tail */

static int check(int rc, const char *what) {
  if (rc != KVIDX_OK)
    fprintf(stderr, "demo: %s failed: %s\n", what, kvidx_strerror(rc));
  return rc;
}

int main(void) {
  uint32_t sys_prompt[NTOK], other[NTOK];
  uint64_t loc[NTOK / BLOCK], seq[NTOK / BLOCK];
  uint64_t oloc[NTOK / BLOCK], oseq[NTOK / BLOCK];
  kvidx_block b[NTOK / BLOCK];
  kvidx_score sc[8];
  kvidx_config cfg = {0};
  kvidx *ix = NULL;
  size_t i, n, m;

  for (i = 0; i < NTOK; i++) {
    sys_prompt[i] = (uint32_t)i;              /* the prompt the router sees  */
    other[i] = (uint32_t)(i < 32 ? i : 7000 + i); /* shares only 2 blocks   */
  }

  printf("kvidx %s demo: which worker already holds this prompt's KV blocks?\n\n",
         kvidx_version());

  /* 1. Hash the prompt the way Dynamo does: one XXH3 hash per full block. */
  n = kvidx_block_hashes(sys_prompt, NTOK, BLOCK, KVIDX_SEED, loc);
  kvidx_seq_hashes(loc, n, seq);
  printf("1. hashed %d tokens into %zu blocks of %d (the %d-token tail is not a "
         "full block)\n", NTOK, n, BLOCK, NTOK % BLOCK);
  for (i = 0; i < n; i++)
    printf("   block %zu: local %016llx  seq %016llx\n", i,
           (unsigned long long)loc[i], (unsigned long long)seq[i]);

  cfg.kind = KVIDX_POSITIONAL;
  if (check(kvidx_create(&ix, &cfg), "kvidx_create")) return 1;

  /* 2. Worker 1 has served this whole prompt: it stores all 6 blocks. */
  for (i = 0; i < n; i++) b[i].local = loc[i], b[i].seq = seq[i];
  if (check(kvidx_store(ix, 1, 0, NULL, b, n), "store worker 1")) return 1;

  /* 3. Worker 2 served a different prompt that shares the first 2 blocks. */
  kvidx_block_hashes(other, NTOK, BLOCK, KVIDX_SEED, oloc);
  kvidx_seq_hashes(oloc, n, oseq);
  for (i = 0; i < n; i++) b[i].local = oloc[i], b[i].seq = oseq[i];
  if (check(kvidx_store(ix, 2, 0, NULL, b, n), "store worker 2")) return 1;
  printf("\n2. worker 1 stored all %zu blocks of the prompt\n", n);
  printf("3. worker 2 stored %zu blocks of another prompt sharing the first 2\n", n);

  /* 4. Query: per worker, how many leading blocks of the prompt it holds. */
  m = kvidx_find_matches(ix, loc, n, sc, 8);
  printf("\n4. query with the prompt's %zu local hashes -> %zu workers match:\n", n, m);
  for (i = 0; i < m && i < 8; i++)
    printf("   worker %llu (dp_rank %u): %u of %zu blocks cached\n",
           (unsigned long long)sc[i].worker_id, sc[i].dp_rank, sc[i].depth, n);

  /* 5. Worker 1 evicts block 3: its score stops at the hole. */
  if (check(kvidx_remove(ix, 1, 0, &seq[3], 1), "remove")) return 1;
  m = kvidx_find_matches(ix, loc, n, sc, 8);
  printf("\n5. worker 1 evicted block 3 (Removed event); query again:\n");
  for (i = 0; i < m && i < 8; i++)
    printf("   worker %llu (dp_rank %u): %u of %zu blocks cached\n",
           (unsigned long long)sc[i].worker_id, sc[i].dp_rank, sc[i].depth, n);

  printf("\nA router sends the request to the worker with the deepest match "
         "(weighed against its load; see examples/router.c).\n");
  kvidx_destroy(ix);
  return 0;
}
