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
 *
 * The same file is the firmware of `make test-firmware` (examples/firmware/):
 * built with -DKVIDX_EMBEDDED_SEMIHOSTING for a Cortex-M4 it prints through
 * Arm semihosting instead of stdio (no stdio symbol is linked there), and its
 * output must equal the host build's line for line.  There it also defines
 * KVIDX_NO_SIMD: a caller buffer never uses the control bytes, whose code
 * would otherwise be linked for heap mode; and KVIDX_NO_RUN_SPLIT: nor does
 * it move a run's rest out.
 */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"

#define MAX_BLOCKS 2048u     /* (worker, block) holdings */
#define MAX_WORKERS 8u
#ifndef ARENA_BYTES
#define ARENA_BYTES (2u << 20) /* 2 MiB reserved at link time */
#endif
#define BLOCK 16u
#define PROMPT_BLOCKS 64u

static unsigned char arena[ARENA_BYTES];

/* ---- output: stdio on a host, semihosting on the firmware --------------- */
#ifdef KVIDX_EMBEDDED_SEMIHOSTING
/* Arm semihosting call: operation in r0, argument in r1, `bkpt 0xab` (Thumb);
 * the debugger (here qemu -semihosting) performs it. */
static int semihost(int op, const void *arg) {
  register int r0 __asm__("r0") = op;
  register const void *r1 __asm__("r1") = arg;
  __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}
static void out(const char *s) { semihost(0x04, s); } /* SYS_WRITE0 */
#else
#include <stdio.h>
static void out(const char *s) { fputs(s, stdout); }
#endif

static void out_u(size_t v) { /* decimal, no printf */
  char b[24], *p = b + sizeof b - 1;
  *p = 0;
  do *--p = (char)('0' + v % 10); while ((v /= 10) != 0);
  out(p);
}

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
      out(kind_name(cfg.kind)), out(": no caller-buffer mode\n");
      continue;
    }
    out(kind_name(cfg.kind)), out(": memory "), out_u(need), out(" bytes for "), out_u(MAX_BLOCKS);
    out(" blocks x "), out_u(MAX_WORKERS), out(" workers ("), out_u(need / MAX_BLOCKS), out(".");
    out_u(need * 10 / MAX_BLOCKS % 10), out(" bytes per block), arena "), out_u(ARENA_BYTES);
    out(" bytes\n");
    if (need > sizeof arena) {
      out(kind_name(cfg.kind)), out(": arena too small\n");
      failed = 1;
      continue;
    }
    /* Any alignment works; start at an odd offset to show it. */
    rc = kvidx_init_buffer(&ix, &cfg, arena + 1, sizeof arena - 1);
    if (rc != KVIDX_OK) {
      out(kind_name(cfg.kind)), out(": init_buffer: "), out(kvidx_strerror(rc)), out("\n");
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
        out(kind_name(cfg.kind)), out(": a refused store changed the index\n");
        failed = 1;
      }
    }
    kvidx_get_stats(ix, &st);
    out(kind_name(cfg.kind)), out(": "), out_u(stored), out(" stores accepted, holding ");
    out_u(st.blocks), out(" blocks, then: "), out(kvidx_strerror(rc)), out(" (capacity is fixed)\n");
    if (rc != KVIDX_EFULL) failed = 1;

    /* Make room: evict the last worker's prompt; the next store succeeds. */
    kvidx_clear(ix, 0, 0);
    rc = kvidx_store(ix, 0, 0, NULL, blk, n);
    out(kind_name(cfg.kind)), out(": after clearing worker 0, store: "), out(kvidx_strerror(rc));
    out("\n");
    if (rc != KVIDX_OK) failed = 1;

    m = kvidx_find_matches(ix, local, n, sc, MAX_WORKERS);
    out(kind_name(cfg.kind)), out(": query of "), out_u(n), out(" blocks: "), out_u(m);
    out(" workers match, best depth "), out_u(m ? sc[0].depth : 0), out("\n");
    kvidx_get_stats(ix, &st);
    out(kind_name(cfg.kind)), out(": stats: "), out_u(st.blocks), out(" blocks, "), out_u(st.workers);
    out(" workers, "), out_u(st.entries), out(" entries, "), out_u(st.bytes), out(" bytes\n");
    if (kvidx__check(ix) != 0) {
      out(kind_name(cfg.kind)), out(": invariant check failed\n");
      failed = 1;
    }
    kvidx_destroy(ix); /* releases nothing: the arena is ours */
  }
  out(failed ? "embedded: FAILED\n" : "embedded: ok, no heap allocation\n");
  return failed;
}
