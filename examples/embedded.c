/* embedded.c - kvidx in a caller-provided static buffer.
 *
 * No heap, no threads: built with -DKVIDX_NO_MALLOC -DKVIDX_NO_THREADS, so
 * the object file references neither malloc/free nor any pthread symbol
 * (`make test-examples` checks that with nm).  All of the index lives in one
 * static array sized at compile time; kvidx_buffer_size tells how much of it
 * a configuration needs, kvidx_init_buffer places the index there, and
 * nothing is allocated afterwards: the capacity is fixed, a store that would
 * exceed it fails with KVIDX_EFULL and changes nothing.
 *
 *   cc -std=c11 -I. -DKVIDX_NO_MALLOC -DKVIDX_NO_THREADS examples/embedded.c
 */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"

#include <stdio.h>

#define MAX_BLOCKS 2048u     /* (worker, block) holdings */
#define MAX_WORKERS 8u
#define ARENA_BYTES (2u << 20) /* 2 MiB reserved at link time */
#define BLOCK 16u
#define PROMPT_BLOCKS 64u

static unsigned char arena[ARENA_BYTES];

static const char *kind_name(int k) {
  return k == KVIDX_POSITIONAL ? "positional" : k == KVIDX_RADIX ? "radix" : "reference";
}

int main(void) {
  static const int kinds[] = {KVIDX_POSITIONAL, KVIDX_RADIX};
  static uint32_t tokens[PROMPT_BLOCKS * BLOCK];
  static uint64_t local[PROMPT_BLOCKS], seq[PROMPT_BLOCKS];
  static kvidx_block blk[PROMPT_BLOCKS];
  kvidx_score sc[MAX_WORKERS];
  size_t ki, i, n, stored = 0, m;
  int failed = 0;

  for (ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
    kvidx_config cfg = {0};
    kvidx_stats st;
    kvidx *ix = NULL;
    size_t need, before;
    uint64_t w;
    int rc = KVIDX_OK;

    cfg.kind = kinds[ki];
    cfg.max_blocks = MAX_BLOCKS;
    cfg.max_workers = MAX_WORKERS;
    need = kvidx_buffer_size(&cfg);
    if (need == 0) {
      printf("%s: no caller-buffer mode\n", kind_name(cfg.kind));
      continue;
    }
    printf("%s: memory %zu bytes for %u blocks x %u workers "
           "(%.1f bytes per block), arena %u bytes\n", kind_name(cfg.kind), need,
           MAX_BLOCKS, MAX_WORKERS, (double)need / MAX_BLOCKS, ARENA_BYTES);
    if (need > sizeof arena) {
      printf("%s: arena too small\n", kind_name(cfg.kind));
      failed = 1;
      continue;
    }
    /* Any alignment works; start at an odd offset to show it. */
    rc = kvidx_init_buffer(&ix, &cfg, arena + 1, sizeof arena - 1);
    if (rc != KVIDX_OK) {
      printf("%s: init_buffer: %s\n", kind_name(cfg.kind), kvidx_strerror(rc));
      failed = 1;
      continue;
    }

    /* Fill it: the workers take turns storing distinct 64-block prompts
     * until the index is full.  Prompts share their first 16 blocks (a
     * system prompt). */
    stored = 0;
    for (w = 0; rc == KVIDX_OK; w++) {
      for (i = 0; i < PROMPT_BLOCKS * BLOCK; i++)
        tokens[i] = i < 16 * BLOCK ? (uint32_t)i : (uint32_t)(w * 100000u + i);
      n = kvidx_block_hashes(tokens, PROMPT_BLOCKS * BLOCK, BLOCK, KVIDX_SEED, local);
      kvidx_seq_hashes(local, n, seq);
      for (i = 0; i < n; i++) blk[i].local = local[i], blk[i].seq = seq[i];
      kvidx_get_stats(ix, &st);
      before = st.blocks;
      rc = kvidx_store(ix, w % MAX_WORKERS, 0, NULL, blk, n);
      kvidx_get_stats(ix, &st);
      if (rc == KVIDX_OK) {
        stored++;
      } else if (st.blocks != before) {
        printf("%s: a refused store changed the index\n", kind_name(cfg.kind));
        failed = 1;
      }
    }
    kvidx_get_stats(ix, &st);
    printf("%s: %zu stores accepted, holding %zu blocks, then: %s "
           "(capacity is fixed)\n", kind_name(cfg.kind), stored, st.blocks,
           kvidx_strerror(rc));
    if (rc != KVIDX_EFULL) failed = 1;

    /* Make room: evict the last worker's prompt; the next store succeeds. */
    kvidx_clear(ix, 0, 0);
    rc = kvidx_store(ix, 0, 0, NULL, blk, n);
    printf("%s: after clearing worker 0, store: %s\n", kind_name(cfg.kind),
           kvidx_strerror(rc));
    if (rc != KVIDX_OK) failed = 1;

    m = kvidx_find_matches(ix, local, n, sc, MAX_WORKERS);
    printf("%s: query of %zu blocks: %zu workers match, best depth %u\n",
           kind_name(cfg.kind), n, m, m ? sc[0].depth : 0);
    kvidx_get_stats(ix, &st);
    printf("%s: stats: %zu blocks, %zu workers, %zu entries, %zu bytes\n",
           kind_name(cfg.kind), st.blocks, st.workers, st.entries, st.bytes);
    if (kvidx__check(ix) != 0) {
      printf("%s: invariant check failed\n", kind_name(cfg.kind));
      failed = 1;
    }
    kvidx_destroy(ix); /* releases nothing: the arena is ours */
  }
  printf("embedded: %s\n", failed ? "FAILED" : "ok, no heap allocation");
  return failed;
}
