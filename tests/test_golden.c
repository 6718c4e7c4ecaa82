/* Golden checks for the cross-platform part of `make test` (tests/cross.mk).
 *
 *   test_golden GOLDEN OUTDIR   check every hash against GOLDEN
 *                               (tests/golden_hashes.txt), then write
 *                               OUTDIR/snapshot.bin and OUTDIR/answers.txt;
 *                               the Makefile compares both byte for byte with
 *                               the host build's.
 *   test_golden --write GOLDEN  (re)generate the golden file (x86-64 host).
 *
 * The hashes cover every XXH3 input-size path: single blocks of 0..1100
 * tokens (0..4400 bytes: > 64 tokens is XXH3's long-input code, where
 * endianness and vector code paths differ), block runs at block sizes 16, 64,
 * 65, 100 and 512, and salted seeds. */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS 1100
static uint32_t tokens[MAX_TOKENS];
static int fails, checks;

static void make_tokens(void) {
  uint64_t s = 0x6b766964785f676cULL; /* splitmix64: the same on every target */
  size_t i;
  for (i = 0; i < MAX_TOKENS; i++) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    tokens[i] = (uint32_t)(z % 152064u); /* a real vocabulary size */
  }
}

/* Emits the golden lines ("<kind> <args> <hash>") to f, or checks them. */
typedef struct {
  FILE *out;      /* write mode */
  FILE *in;       /* check mode */
  char line[256]; /* check mode: the current expected line */
} golden;

static void emit(golden *g, const char *what) {
  checks++;
  if (g->out) {
    fprintf(g->out, "%s\n", what);
    return;
  }
  if (!fgets(g->line, sizeof g->line, g->in)) {
    fails++;
    fprintf(stderr, "golden file ended early, expected: %s\n", what);
    return;
  }
  g->line[strcspn(g->line, "\n")] = 0;
  if (strcmp(g->line, what) != 0) {
    fails++;
    if (fails <= 20) fprintf(stderr, "MISMATCH\n  golden: %s\n  got:    %s\n", g->line, what);
  }
}

static void hashes(golden *g) {
  static const size_t sizes[5] = {16, 64, 65, 100, 512};
  static const char *loras[3] = {"", "adapter-a", "lora/\xc3\xa9t\xc3\xa9"};
  static const char *nss[3] = {"", "ns1", "tenant-42"};
  uint64_t loc[MAX_TOKENS / 16 + 1], seq[MAX_TOKENS / 16 + 1];
  char buf[200];
  size_t n, b, k, i, j;
  for (n = 0; n <= MAX_TOKENS; n++) { /* one block of n tokens */
    sprintf(buf, "block %u %016llx", (unsigned)n,
            (unsigned long long)kvidx_block_hash(tokens, n, KVIDX_SEED));
    emit(g, buf);
  }
  for (k = 0; k < 5; k++) { /* runs of full blocks, then their chain */
    for (n = 0; n <= MAX_TOKENS; n += (n < 2 * sizes[k] ? 1 : 37)) {
      size_t nb = kvidx_block_hashes(tokens, n, sizes[k], KVIDX_SEED, loc);
      uint64_t fold = 0;
      kvidx_seq_hashes(loc, nb, seq);
      for (b = 0; b < nb; b++) fold = fold * 0x100000001B3ULL ^ loc[b] ^ (seq[b] << 1);
      sprintf(buf, "run bs=%u n=%u blocks=%u last_seq=%016llx fold=%016llx", (unsigned)sizes[k],
              (unsigned)n, (unsigned)nb, (unsigned long long)(nb ? seq[nb - 1] : 0),
              (unsigned long long)fold);
      emit(g, buf);
    }
  }
  for (i = 0; i < 3; i++)
    for (j = 0; j < 3; j++) {
      uint64_t sd = kvidx_hash_seed(loras[i], nss[j]);
      sprintf(buf, "seed lora=%u ns=%u %016llx block512=%016llx", (unsigned)i, (unsigned)j,
              (unsigned long long)sd, (unsigned long long)kvidx_block_hash(tokens + 7, 512, sd));
      emit(g, buf);
    }
  sprintf(buf, "seqnext %016llx", (unsigned long long)kvidx_seq_hash_next(0x0123456789abcdefULL, 0xfedcba9876543210ULL));
  emit(g, buf);
}

/* ---- a deterministic index, its snapshot and its answers ---------------- */
static int write_file(void *ctx, const void *p, size_t n) {
  return fwrite(p, 1, n, (FILE *)ctx) == n ? 0 : 1;
}
static size_t read_file(void *ctx, void *p, size_t n) { return fread(p, 1, n, (FILE *)ctx); }

#define NB 24
static void index_part(const char *dir) {
  kvidx_config c;
  kvidx *ix = NULL, *back = NULL;
  uint64_t loc[4][NB], seq[4][NB];
  kvidx_block blk[NB];
  kvidx_score sc[64], sc2[64];
  char path[512];
  FILE *f, *ans;
  size_t w, i, m, m2;
  int p, rc;
  uint64_t id = 1;
  memset(&c, 0, sizeof c);
  c.kind = KVIDX_POSITIONAL;
  c.max_workers = 64;
  c.flags = KVIDX_F_TIERS;
  if (kvidx_create(&ix, &c) != KVIDX_OK) {
    fprintf(stderr, "create failed\n");
    exit(2);
  }
  /* four prompts sharing a 512-token system prompt, block size 64 */
  for (p = 0; p < 4; p++) {
    kvidx_block_hashes(tokens, 512, 64, KVIDX_SEED, loc[p]); /* 8 shared blocks */
    kvidx_block_hashes(tokens + 100 + 40 * (size_t)p, 9 * 64, 64, KVIDX_SEED, loc[p] + 8);
    kvidx_seq_hashes(loc[p], 17, seq[p]);
  }
  for (w = 0; w < 12; w++) { /* worker w holds a prefix of prompt w % 4 */
    kvidx_event ev;
    size_t depth = 3 + (w * 5) % 15, pr = w % 4;
    for (i = 0; i < depth; i++) blk[i].local = loc[pr][i], blk[i].seq = seq[pr][i];
    memset(&ev, 0, sizeof ev);
    ev.event_id = id++;
    ev.worker_id = 1000 + w;
    ev.dp_rank = (uint32_t)(w % 3);
    ev.type = KVIDX_EV_STORED;
    ev.tier = (w % 5 == 4) ? KVIDX_TIER_HOST : KVIDX_TIER_DEVICE;
    ev.blocks = blk;
    ev.n = depth;
    rc = kvidx_apply(ix, &ev);
    if (rc != KVIDX_OK) fails++, fprintf(stderr, "apply store w=%u: %d\n", (unsigned)w, rc);
    if (w % 4 == 1) { /* a hole */
      memset(&ev, 0, sizeof ev);
      ev.event_id = id++;
      ev.worker_id = 1000 + w;
      ev.dp_rank = (uint32_t)(w % 3);
      ev.type = KVIDX_EV_REMOVED;
      ev.tier = KVIDX_TIER_ALL;
      ev.seqs = &seq[pr][2];
      ev.n = 1;
      rc = kvidx_apply(ix, &ev);
      if (rc != KVIDX_OK) fails++, fprintf(stderr, "apply remove w=%u: %d\n", (unsigned)w, rc);
    }
  }
  checks++;
  if (kvidx__check(ix) != 0) fails++, fprintf(stderr, "invariant check failed\n");
  sprintf(path, "%s/snapshot.bin", dir);
  f = fopen(path, "wb");
  if (!f || kvidx_snapshot_write(ix, write_file, f) != KVIDX_OK || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  /* read it back into another kind: the same answers */
  c.kind = KVIDX_RADIX;
  f = fopen(path, "rb");
  checks++;
  if (!f || kvidx_create(&back, &c) != KVIDX_OK || kvidx_snapshot_read(back, read_file, f) != KVIDX_OK)
    fails++, fprintf(stderr, "snapshot read back failed\n");
  if (f) fclose(f);
  sprintf(path, "%s/answers.txt", dir);
  ans = fopen(path, "w");
  if (!ans) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  for (p = 0; p < 4; p++) {
    m = kvidx_find_matches(ix, loc[p], 17, sc, 64);
    m2 = back ? kvidx_find_matches(back, loc[p], 17, sc2, 64) : 0;
    checks++;
    if (m != m2 || memcmp(sc, sc2, m * sizeof sc[0]) != 0)
      fails++, fprintf(stderr, "prompt %d: answers differ after the snapshot round trip\n", p);
    fprintf(ans, "prompt %d:", p);
    for (i = 0; i < m; i++)
      fprintf(ans, " %llu/%u:%u", (unsigned long long)sc[i].worker_id, (unsigned)sc[i].dp_rank,
              (unsigned)sc[i].depth);
    fprintf(ans, "\n");
  }
  fclose(ans);
  kvidx_destroy(back);
  kvidx_destroy(ix);
}

int main(int argc, char **argv) {
  golden g;
  memset(&g, 0, sizeof g);
  make_tokens();
  if (argc == 3 && strcmp(argv[1], "--write") == 0) {
    g.out = fopen(argv[2], "w");
    if (!g.out) return perror(argv[2]), 2;
    hashes(&g);
    fclose(g.out);
    printf("wrote %d golden lines to %s\n", checks, argv[2]);
    return 0;
  }
  if (argc != 3) {
    fprintf(stderr, "usage: %s GOLDEN OUTDIR | --write GOLDEN\n", argv[0]);
    return 2;
  }
  g.in = fopen(argv[1], "r");
  if (!g.in) { /* no golden data: a failure, never a skip */
    perror(argv[1]);
    return 2;
  }
  hashes(&g);
  checks++;
  if (fgets(g.line, sizeof g.line, g.in)) fails++, fprintf(stderr, "golden file has extra lines\n");
  fclose(g.in);
  index_part(argv[2]);
  printf("golden: %d checks, %d failed (little endian: %d, %u-bit pointers)\n", checks, fails,
         kvidx__little_endian(), (unsigned)(sizeof(void *) * 8));
  return fails ? 1 : 0;
}
