/* Core tests: hash vectors, semantics, the two positional traps, the
 * randomized differential test against the reference model, capacity,
 * allocation failure, caller-buffer mode, memory reuse. */
#include "testutil.h"
#define XXH_INLINE_ALL
#include "xxhash.h"

static kvidx *mk(int kind, uint32_t workers, uint32_t jump) {
  kvidx_config c;
  kvidx *ix = NULL;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_workers = workers;
  c.jump = jump;
  if (kvidx_create(&ix, &c) != KVIDX_OK) {
    fprintf(stderr, "create failed\n");
    exit(2);
  }
  return ix;
}

/* ---- 1. hash vectors (a scanner for the vectors file's fixed layout) ---- */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *b;
  long n;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  b = (char *)malloc((size_t)n + 1);
  if (fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
  b[n] = 0;
  fclose(f);
  return b;
}
/* After key "k" within [p, end): parse a string value into out, or a number. */
static const char *find_key(const char *p, const char *end, const char *k) {
  char pat[64];
  const char *q;
  snprintf(pat, sizeof pat, "\"%s\"", k);
  q = strstr(p, pat);
  if (!q || q >= end) return NULL;
  q = strchr(q + strlen(pat), ':');
  return q ? q + 1 : NULL;
}
static int get_str(const char *p, const char *end, const char *k, char *out, size_t cap) {
  const char *q = find_key(p, end, k), *e;
  if (!q) return 0;
  q = strchr(q, '"') + 1;
  e = strchr(q, '"');
  if ((size_t)(e - q) >= cap) return 0;
  memcpy(out, q, (size_t)(e - q));
  out[e - q] = 0;
  return 1;
}
/* Array of numbers or numeric strings. */
static size_t get_u64s(const char *p, const char *end, const char *k, uint64_t *out, size_t cap) {
  const char *q = find_key(p, end, k);
  size_t n = 0;
  if (!q) return 0;
  q = strchr(q, '[') + 1;
  while (*q && *q != ']') {
    if ((*q >= '0' && *q <= '9')) {
      char *e;
      uint64_t v = strtoull(q, &e, 10);
      if (n < cap) out[n] = v;
      n++;
      q = e;
    } else {
      q++;
    }
  }
  return n;
}

static void test_vectors(const char *path) {
  char *js = slurp(path), buf[256];
  const char *p, *end;
  int cases = 0;
  if (!js) {
    fprintf(stderr, "cannot read %s\n", path);
    t_fails++;
    return;
  }
  /* the raw XXH3 check */
  CHECK(get_str(js, js + strlen(js), "bytes", buf, sizeof buf));
  { /* the raw XXH3 vector: the inlined xxHash agrees with the independent one */
    char xs[32];
    CHECK(get_str(js, js + strlen(js), "xxh3_64", xs, sizeof xs));
    CHECK(XXH3_64bits_withSeed(buf, strlen(buf), 1337) == strtoull(xs, NULL, 10));
  }
  p = strstr(js, "\"cases\"");
  while (p && (p = strstr(p, "\"name\"")) != NULL) {
    const char *nx = strstr(p + 6, "\"name\"");
    static uint32_t tok[4096];
    static uint64_t tmp[4096], loc[512], seq[512], got[512], gseq[512];
    char lora[128], ns[128], seed[32];
    size_t nt, nl, ns_, bs, nb, i;
    uint64_t sd;
    end = nx ? nx : js + strlen(js);
    lora[0] = ns[0] = 0;
    get_str(p, end, "lora_name", lora, sizeof lora);
    get_str(p, end, "namespace", ns, sizeof ns);
    CHECK(get_str(p, end, "seed", seed, sizeof seed));
    bs = (size_t)strtoull(find_key(p, end, "block_size"), NULL, 10);
    nt = get_u64s(p, end, "tokens", tmp, 4096);
    for (i = 0; i < nt; i++) tok[i] = (uint32_t)tmp[i];
    nl = get_u64s(p, end, "local_hashes", loc, 512);
    ns_ = get_u64s(p, end, "seq_hashes", seq, 512);
    sd = kvidx_hash_seed(lora, ns);
    CHECK(sd == strtoull(seed, NULL, 10));
    nb = kvidx_block_hashes(tok, nt, bs, sd, got);
    CHECK_EQ(nb, nl);
    CHECK_EQ(ns_, nl);
    for (i = 0; i < nl && i < nb; i++) CHECK(got[i] == loc[i]);
    kvidx_seq_hashes(got, nb, gseq);
    for (i = 0; i < ns_ && i < nb; i++) CHECK(gseq[i] == seq[i]);
    for (i = 1; i < nb; i++) CHECK(kvidx_seq_hash_next(gseq[i - 1], got[i]) == seq[i]);
    cases++;
    p = end;
  }
  CHECK(cases >= 4);
  /* edge cases: block size 0, no tokens, NULL pointers */
  {
    uint32_t t4[4] = {1, 2, 3, 4};
    uint64_t o[4] = {7, 7, 7, 7};
    CHECK_EQ(kvidx_block_hashes(t4, 4, 0, KVIDX_SEED, o), 0);
    CHECK_EQ(kvidx_block_hashes(t4, 3, 4, KVIDX_SEED, o), 0);
    CHECK_EQ(kvidx_block_hashes(NULL, 4, 4, KVIDX_SEED, o), 0);
    CHECK_EQ(kvidx_block_hashes(t4, 4, 2, KVIDX_SEED, o), 2);
    CHECK(o[0] == kvidx_block_hash(t4, 2, KVIDX_SEED) && o[2] == 7);
    CHECK(kvidx_hash_seed(NULL, NULL) == KVIDX_SEED && kvidx_hash_seed("", "") == KVIDX_SEED);
    CHECK(kvidx_hash_seed("a", NULL) != kvidx_hash_seed(NULL, "a"));
    kvidx_seq_hashes(NULL, 3, o); /* no crash */
  }
  printf("hash vectors: %d cases\n", cases);
  free(js);
}

/* ---- helpers ------------------------------------------------------------ */
static void run(const uint64_t *loc, size_t n, kvidx_block *b) { /* contract seqs */
  uint64_t seq[64];
  size_t i;
  kvidx_seq_hashes(loc, n, seq);
  for (i = 0; i < n; i++) b[i].local = loc[i], b[i].seq = seq[i];
}
static uint32_t depth_of(kvidx *ix, const uint64_t *q, size_t n, uint64_t w, uint32_t r) {
  kvidx_score sc[64];
  size_t m = kvidx_find_matches(ix, q, n, sc, 64), i;
  for (i = 0; i < m && i < 64; i++)
    if (sc[i].worker_id == w && sc[i].dp_rank == r) return sc[i].depth;
  return 0;
}

/* ---- 2. hand-written semantics, for every kind ------------------------- */
static void test_semantics(int kind, uint32_t jump) {
  kvidx *ix = mk(kind, 0, jump);
  uint64_t L[8] = {11, 22, 33, 44, 55, 66, 77, 88}, seq[8], unknown = 999;
  kvidx_block b[8];
  kvidx_score sc[8];
  size_t i;
  run(L, 5, b);
  kvidx_seq_hashes(L, 8, seq);
  CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 5), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 5);
  CHECK_EQ(depth_of(ix, L, 5, 1, 0), 5);
  CHECK_EQ(depth_of(ix, L, 3, 1, 0), 3);
  CHECK_EQ(depth_of(ix, L, 8, 1, 0), 5);
  {
    uint64_t q[3] = {11, 22, 99};
    CHECK_EQ(depth_of(ix, q, 3, 1, 0), 2);
    CHECK_EQ(depth_of(ix, q + 1, 2, 1, 0), 0); /* a chunk elsewhere is no prefix */
  }
  /* unknown parent: ENOPARENT, nothing changes, no worker created */
  CHECK_EQ(kvidx_store(ix, 1, 0, &unknown, b, 2), KVIDX_ENOPARENT);
  CHECK_EQ(kvidx_store(ix, 2, 0, &seq[0], b, 1), KVIDX_ENOPARENT);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 5);
  CHECK_EQ(kvidx_worker_blocks(ix, 2, 0), 0);
  /* continue from a parent */
  {
    kvidx_block c[3];
    run(L, 8, b);
    memcpy(c, b + 5, sizeof c);
    CHECK_EQ(kvidx_store(ix, 1, 0, &seq[4], c, 3), KVIDX_OK);
    CHECK_EQ(depth_of(ix, L, 8, 1, 0), 8);
  }
  /* duplicate store: idempotent */
  CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 8), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 8);
  /* a seq is per worker: another worker holds the same seqs independently */
  CHECK_EQ(kvidx_store(ix, 2, 3, NULL, b, 3), KVIDX_OK);
  CHECK_EQ(kvidx_find_matches(ix, L, 8, sc, 8), 2);
  CHECK(sc[0].worker_id == 1 && sc[0].depth == 8 && sc[1].worker_id == 2 && sc[1].dp_rank == 3 && sc[1].depth == 3);
  /* removing a middle block: no cascade, the score stops at the hole */
  CHECK_EQ(kvidx_remove(ix, 1, 0, &seq[3], 1), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 7);
  CHECK_EQ(depth_of(ix, L, 8, 1, 0), 3);
  CHECK_EQ(depth_of(ix, L, 8, 2, 3), 3);
  /* re-storing the hole heals it */
  CHECK_EQ(kvidx_store(ix, 1, 0, &seq[2], b + 3, 1), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 8, 1, 0), 8);
  /* unknown seqs: ENOENT after removing the known ones */
  {
    uint64_t rm[3] = {seq[7], unknown, seq[6]};
    CHECK_EQ(kvidx_remove(ix, 1, 0, rm, 3), KVIDX_ENOENT);
    CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 6);
    CHECK_EQ(depth_of(ix, L, 8, 1, 0), 6);
    CHECK_EQ(kvidx_remove(ix, 77, 0, rm, 1), KVIDX_ENOENT);
    CHECK_EQ(kvidx_remove(ix, 1, 0, rm, 0), KVIDX_OK);
  }
  /* clear: that (worker, dp_rank) only; unknown worker is fine */
  CHECK_EQ(kvidx_store(ix, 2, 4, NULL, b, 2), KVIDX_OK);
  CHECK_EQ(kvidx_clear(ix, 2, 3), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 2, 3), 0);
  CHECK_EQ(kvidx_worker_blocks(ix, 2, 4), 2);
  CHECK_EQ(kvidx_clear(ix, 12345, 0), KVIDX_OK);
  /* remove_worker: every dp_rank */
  CHECK_EQ(kvidx_store(ix, 2, 5, NULL, b, 4), KVIDX_OK);
  CHECK_EQ(kvidx_remove_worker(ix, 2), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 2, 4) + kvidx_worker_blocks(ix, 2, 5), 0);
  CHECK_EQ(depth_of(ix, L, 8, 1, 0), 6);
  /* opaque seq hashes still match exactly (chains are computed) */
  {
    kvidx_block o[4];
    uint64_t parent = 5000;
    for (i = 0; i < 4; i++) o[i].local = L[i], o[i].seq = 5000 + i;
    CHECK_EQ(kvidx_store(ix, 3, 0, NULL, o, 4), KVIDX_OK);
    CHECK_EQ(depth_of(ix, L, 8, 3, 0), 4);
    o[0].local = L[4];
    o[0].seq = 6000;
    parent = 5003;
    CHECK_EQ(kvidx_store(ix, 3, 0, &parent, o, 1), KVIDX_OK);
    CHECK_EQ(depth_of(ix, L, 8, 3, 0), 5);
    /* a duplicate seq in the middle of a run: the run continues from the
     * held block (seq 5001, depth 2), so 777 lands at depth 3 */
    o[0].local = 1;
    o[0].seq = 7000; /* new root block */
    o[1].local = 2;
    o[1].seq = 5001; /* held: stays as it is, chain of L[0],L[1] */
    o[2].local = 777;
    o[2].seq = 7002;
    CHECK_EQ(kvidx_store(ix, 3, 0, NULL, o, 3), KVIDX_OK);
    {
      uint64_t q[3] = {L[0], L[1], 777};
      CHECK_EQ(depth_of(ix, q, 3, 3, 0), 3);
    }
    CHECK_EQ(kvidx_worker_blocks(ix, 3, 0), 7);
  }
  /* n = 0, bad arguments */
  CHECK_EQ(kvidx_store(ix, 9, 0, NULL, b, 0), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 9, 0), 0);
  CHECK_EQ(kvidx_store(ix, 9, 0, NULL, NULL, 2), KVIDX_EINVAL);
  CHECK_EQ(kvidx_store(NULL, 9, 0, NULL, b, 1), KVIDX_EINVAL);
  CHECK_EQ(kvidx_find_matches(ix, L, 0, sc, 8), 0);
  CHECK_EQ(kvidx_find_matches(NULL, L, 3, sc, 8), 0);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

/* "Predict the next token. Learn from the error. Predict the next token." */
static void test_repeated_chunk(int kind) {
  uint32_t tok[12] = {101, 102, 103, 104, 201, 202, 203, 204, 101, 102, 103, 104};
  uint64_t loc[3], seq[3];
  kvidx_block b[3];
  kvidx *ix = mk(kind, 0, 0);
  size_t i, n = kvidx_block_hashes(tok, 12, 4, KVIDX_SEED, loc);
  CHECK_EQ(n, 3);
  CHECK(loc[0] == loc[2] && seq != NULL);
  kvidx_seq_hashes(loc, 3, seq);
  CHECK(seq[0] != seq[2]);
  for (i = 0; i < 3; i++) b[i].local = loc[i], b[i].seq = seq[i];
  CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 3), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 2, 0, NULL, b, 1), KVIDX_OK);
  CHECK_EQ(depth_of(ix, loc, 3, 1, 0), 3);
  CHECK_EQ(depth_of(ix, loc, 3, 2, 0), 1);
  {
    uint64_t q[2] = {loc[0], loc[0]}; /* block 2's chunk at position 1 */
    CHECK_EQ(depth_of(ix, q, 2, 1, 0), 1);
  }
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

/* The walk's cont hint (the last run made below a run's last block) is tried
 * before the child map where a run has one child, and must be believed only
 * when it checks out: a freed sibling and a run reused elsewhere are behind
 * the hint here at some point (6 checks fail if a failed hint is taken for
 * a miss), siblings side by side are not (two children: the map decides),
 * and every answer must stay exact. */
static void store_path(kvidx *ix, uint64_t w, const uint64_t *loc, size_t from, size_t to) {
  uint64_t seq[160];
  kvidx_block b[160];
  size_t i;
  kvidx_seq_hashes(loc, to, seq);
  for (i = from; i < to; i++) b[i - from].local = loc[i], b[i - from].seq = seq[i];
  CHECK_EQ(kvidx_store(ix, w, 0, from ? &seq[from - 1] : NULL, b, to - from), KVIDX_OK);
}
static void test_cont_hint(int kind) {
  kvidx *ix = mk(kind, 0, 0);
  uint64_t L[150], X[150], Y[150], Z[150], seqX[150];
  size_t i;
  for (i = 0; i < 150; i++) {
    L[i] = 1000 + i;
    X[i] = i < 64 ? L[i] : 5000 + i;    /* leaves L after its first run */
    Y[i] = i < 128 ? L[i] : 7000 + i;   /* leaves L after two runs */
    Z[i] = 9000 + i;                    /* elsewhere */
  }
  store_path(ix, 1, L, 0, 140);       /* runs of 64, 64, 12 */
  CHECK_EQ(depth_of(ix, L, 150, 1, 0), 140);
  store_path(ix, 2, X, 0, 100);       /* a sibling below L's block 63: the hint now */
  CHECK_EQ(depth_of(ix, L, 150, 1, 0), 140);
  CHECK_EQ(depth_of(ix, L, 150, 2, 0), 64);
  CHECK_EQ(depth_of(ix, X, 150, 1, 0), 64);
  CHECK_EQ(depth_of(ix, X, 150, 2, 0), 100);
  store_path(ix, 3, Y, 0, 150);       /* and below block 127 */
  CHECK_EQ(depth_of(ix, L, 150, 1, 0), 140);
  CHECK_EQ(depth_of(ix, L, 150, 3, 0), 128);
  CHECK_EQ(depth_of(ix, Y, 150, 1, 0), 128);
  CHECK_EQ(depth_of(ix, Y, 150, 3, 0), 150);
  CHECK_EQ(kvidx_clear(ix, 2, 0), KVIDX_OK); /* the hinted sibling is freed */
  CHECK_EQ(depth_of(ix, L, 150, 1, 0), 140);
  CHECK_EQ(depth_of(ix, X, 150, 1, 0), 64);
  CHECK_EQ(depth_of(ix, X, 150, 2, 0), 0);
  store_path(ix, 4, Z, 0, 90);        /* reuses freed runs elsewhere */
  CHECK_EQ(depth_of(ix, L, 150, 1, 0), 140);
  CHECK_EQ(depth_of(ix, L, 150, 4, 0), 0);
  CHECK_EQ(depth_of(ix, Z, 150, 4, 0), 90);
  CHECK_EQ(depth_of(ix, Y, 150, 3, 0), 150);
  /* the sibling again, then a hole in L's second run for worker 1 */
  store_path(ix, 2, X, 0, 100);
  kvidx_seq_hashes(X, 100, seqX);
  CHECK_EQ(depth_of(ix, X, 150, 2, 0), 100);
  {
    uint64_t seqL[150];
    kvidx_seq_hashes(L, 150, seqL);
    CHECK_EQ(kvidx_remove(ix, 1, 0, &seqL[100], 1), KVIDX_OK);
  }
  CHECK_EQ(depth_of(ix, L, 150, 1, 0), 100);
  CHECK_EQ(depth_of(ix, Y, 150, 1, 0), 100);
  CHECK_EQ(depth_of(ix, L, 150, 3, 0), 128);
  CHECK_EQ(kvidx_remove(ix, 2, 0, &seqX[64], 1), KVIDX_OK);
  CHECK_EQ(depth_of(ix, X, 150, 2, 0), 64);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

/* The hint below a run's middle (a conversation's next turn leaves the
 * last turn's run where its partial block was): taken where the query
 * leaves the run at the hint's offset, never believed elsewhere, and right
 * again after the child it named is freed and its record reused below
 * another offset.  kvidx__check asserts the hint's offset goes with it. */
typedef struct {
  const uint64_t *query; /* 40 blocks */
  uint64_t worker;
  uint32_t depth;
} mid_run_case;
static void check_depths(kvidx *ix, const char *phase, const mid_run_case *c, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    uint32_t d = depth_of(ix, c[i].query, 40, c[i].worker, 0);
    CHECK(d == c[i].depth);
    if (d != c[i].depth) fprintf(stderr, "  %s, case %zu: depth %u, expected %u\n", phase, i, d, c[i].depth);
  }
  CHECK_EQ(kvidx__check(ix), 0);
}
static void test_mid_run_hint(int kind) {
  kvidx *ix = mk(kind, 0, 0);
  uint64_t P[40], T[40], U[40], V[40], W[40], X[40];
  size_t i;
  for (i = 0; i < 40; i++) {
    P[i] = 100 + i;                   /* turn 1: 20 blocks */
    T[i] = i < 19 ? P[i] : 300 + i;   /* turn 2 leaves it at block 19 */
    U[i] = i < 6 ? P[i] : 500 + i;    /* a query leaving it at block 6 */
    V[i] = i < 6 ? P[i] : 700 + i;    /* later a child there */
    W[i] = i < 19 ? P[i] : 900 + i;   /* leaves it at the hint's offset, into no child */
    X[i] = i < 6 ? P[i] : 313 + i;    /* leaves it at block 6 with T's tail: the child's
                                         locals, at another offset */
  }
  {
    const mid_run_case one_child[] = {{T, 2, 35}, {T, 1, 19}, {P, 1, 20}, {P, 2, 19},
                                      {U, 1, 6},  {U, 2, 6},  {W, 2, 19}, {W, 1, 19},
                                      {X, 2, 6},  {X, 1, 6}};
    const mid_run_case reused[] = {{T, 2, 0}, {T, 1, 19}, {T, 3, 6}, {V, 3, 30}, {V, 1, 6}, {U, 3, 6}};
    const mid_run_case two_children[] = {{T, 2, 35}, {V, 3, 30}, {V, 2, 6}, {W, 2, 19}};
    store_path(ix, 1, P, 0, 20);
    store_path(ix, 2, T, 0, 35); /* the run's one child, below offset 18 */
    check_depths(ix, "one child", one_child, sizeof one_child / sizeof one_child[0]);
    CHECK_EQ(kvidx_clear(ix, 2, 0), KVIDX_OK); /* the child goes; its record is free */
    store_path(ix, 3, V, 0, 30);               /* a child below offset 5 */
    check_depths(ix, "record reused", reused, sizeof reused / sizeof reused[0]);
    store_path(ix, 2, T, 0, 35); /* two children now: the child map decides */
    check_depths(ix, "two children", two_children, sizeof two_children / sizeof two_children[0]);
  }
  kvidx_destroy(ix);
}

/* Decode steps: one block below the block stored last.  A parent the
 * worker no longer holds (removed, cleared, evicted) is ENOPARENT however
 * recently it was stored (a memo of the last block stored, tried and
 * dropped in session 18, fails 10 of these checks when it outlives it). */
static int decode_step(kvidx *ix, uint64_t w, const uint64_t *L, const uint64_t *seq, size_t i,
                       const uint64_t *parent) { /* block i alone, below parent */
  kvidx_block b;
  b.local = L[i];
  b.seq = seq[i];
  return kvidx_store(ix, w, 0, parent, &b, 1);
}
static void test_decode_steps(int kind) {
  uint64_t L[64], seq[64], other = 999;
  kvidx_config c;
  kvidx *ix = mk(kind, 0, 0);
  size_t i;
  for (i = 0; i < 64; i++) L[i] = 40 + i;
  kvidx_seq_hashes(L, 64, seq);
  for (i = 0; i < 10; i++) CHECK_EQ(decode_step(ix, 1, L, seq, i, i ? &seq[i - 1] : NULL), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 64, 1, 0), 10);
  CHECK_EQ(kvidx_remove(ix, 1, 0, &seq[9], 1), KVIDX_OK); /* the block stored last */
  CHECK_EQ(decode_step(ix, 1, L, seq, 10, &seq[9]), KVIDX_ENOPARENT);
  CHECK_EQ(depth_of(ix, L, 64, 1, 0), 9);
  CHECK_EQ(decode_step(ix, 1, L, seq, 9, &seq[8]), KVIDX_OK);
  CHECK_EQ(decode_step(ix, 1, L, seq, 10, &seq[9]), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 64, 1, 0), 11);
  CHECK_EQ(decode_step(ix, 1, L, seq, 11, &other), KVIDX_ENOPARENT);   /* a parent never stored */
  CHECK_EQ(decode_step(ix, 2, L, seq, 11, &seq[10]), KVIDX_ENOPARENT); /* another worker's last block */
  CHECK_EQ(kvidx_clear(ix, 1, 0), KVIDX_OK);
  CHECK_EQ(decode_step(ix, 1, L, seq, 11, &seq[10]), KVIDX_ENOPARENT);
  CHECK_EQ(depth_of(ix, L, 64, 1, 0), 0);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
  /* evicted: LRS prunes the oldest store first, its last block first, so a
   * 3-block store by another worker at max_blocks 4 takes worker 1's last
   * two blocks, the one stored last among them */
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_blocks = 4;
  c.evict = KVIDX_EVICT_LRS;
  c.evict_target_pct = 100;
  CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
  {
    kvidx_block bb[3];
    for (i = 0; i < 3; i++) bb[i].local = L[i], bb[i].seq = seq[i];
    CHECK_EQ(kvidx_store(ix, 1, 0, NULL, bb, 3), KVIDX_OK);
    for (i = 0; i < 3; i++) bb[i].local = L[40 + i], bb[i].seq = 7777 + i;
    CHECK_EQ(kvidx_store(ix, 2, 0, NULL, bb, 3), KVIDX_OK);
  }
  CHECK_EQ(depth_of(ix, L, 64, 1, 0), 1);
  CHECK_EQ(decode_step(ix, 1, L, seq, 3, &seq[2]), KVIDX_ENOPARENT);
  CHECK_EQ(decode_step(ix, 1, L, seq, 1, &seq[0]), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 64, 1, 0), 2);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

/* ---- 3. the positional index's two traps, for every kind and jump size --- */
static void test_traps(int kind, uint32_t jump) {
  kvidx *ix = mk(kind, 0, jump);
  uint64_t xqz[3] = {1, 2, 3}, xyz[3] = {1, 9, 3}, L[12] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, seq[12];
  kvidx_block b[12];
  /* trap 1: B diverged at 1 and shares the chunk at 2, alone at its slot */
  run(xqz, 3, b);
  CHECK_EQ(kvidx_store(ix, 20, 0, NULL, b, 3), KVIDX_OK);
  CHECK_EQ(depth_of(ix, xyz, 3, 20, 0), 1);
  /* trap 2: a hole in the middle, descendants kept */
  run(L, 12, b);
  kvidx_seq_hashes(L, 12, seq);
  CHECK_EQ(kvidx_store(ix, 30, 0, NULL, b, 12), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 31, 0, NULL, b, 12), KVIDX_OK);
  CHECK_EQ(kvidx_remove(ix, 30, 0, &seq[2], 1), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 12, 30, 0), 2);
  CHECK_EQ(depth_of(ix, L, 12, 31, 0), 12);
  CHECK_EQ(kvidx_remove(ix, 31, 0, &seq[9], 1), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 12, 31, 0), 9);
  /* the hole heals: the worker is whole again and may be jumped over */
  CHECK_EQ(kvidx_store(ix, 30, 0, &seq[1], b + 2, 1), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 12, 30, 0), 12);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

/* ---- 4. randomized differential test --------------------------------------- */
typedef struct {
  uint64_t worker;
  uint32_t rank;
  uint64_t seq;
  uint32_t plen;
  uint64_t path[24]; /* locals from the root, as stored */
} shadow_t;
#define SHADOW_MAX 4096

static int same_answers(kvidx **ix, int nk, const uint64_t *q, size_t n) {
  kvidx_score a[80], b[80];
  size_t ta, tb, i;
  int k, ok = 1;
  size_t cap = n % 3 == 0 ? 2 : 80; /* sometimes truncate: the top of the order must agree */
  ta = kvidx_find_matches(ix[0], q, n, a, cap);
  for (k = 1; k < nk; k++) {
    tb = kvidx_find_matches(ix[k], q, n, b, cap);
    if (ta != tb) ok = 0;
    for (i = 0; ok && i < ta && i < cap; i++)
      if (a[i].worker_id != b[i].worker_id || a[i].dp_rank != b[i].dp_rank || a[i].depth != b[i].depth) ok = 0;
    if (!ok) {
      fprintf(stderr, "find_matches differ: %s total %zu vs %zu (n=%zu)\n", t_kind_name(k), ta, tb, n);
      for (i = 0; i < ta && i < cap; i++) fprintf(stderr, "  ref %llu/%u:%u\n", (unsigned long long)a[i].worker_id, a[i].dp_rank, a[i].depth);
      for (i = 0; i < tb && i < cap; i++) fprintf(stderr, "  got %llu/%u:%u\n", (unsigned long long)b[i].worker_id, b[i].dp_rank, b[i].depth);
      return 0;
    }
  }
  return 1;
}

/* same_answers for two indexes (an array literal would not compile as C++) */
static int same_pair(kvidx *ref, kvidx *ix, const uint64_t *q, size_t n) {
  kvidx *two[2];
  two[0] = ref;
  two[1] = ix;
  return same_answers(two, 2, q, n);
}

static void test_differential(uint64_t seed, uint32_t max_workers, uint32_t jump, int nops, uint32_t alpha,
                              size_t max_blocks) {
  kvidx *ix[3];
  kvidx_config c;
  static shadow_t sh[SHADOW_MAX];
  size_t nsh = 0;
  int op, k, bad = 0;
  uint64_t rs = seed;
  uint32_t nwk = max_workers + 2 < 6 ? max_workers + 2 : 6;
  for (k = 0; k < 3; k++) {
    memset(&c, 0, sizeof c);
    c.kind = T_KINDS[k];
    c.max_workers = max_workers;
    c.jump = jump;
    c.max_blocks = max_blocks;
    CHECK_EQ(kvidx_create(&ix[k], &c), KVIDX_OK);
  }
  for (op = 0; op < nops && !bad; op++) {
    uint32_t r = t_below(&rs, 100), wi = t_below(&rs, nwk);
    uint64_t wid = 100 + wi / 2;
    uint32_t rank = wi % 2;
    int st[3];
    if (r < 45) { /* store */
      kvidx_block b[16];
      uint64_t parent = 0, pseq = 0;
      const uint64_t *pp = NULL;
      uint32_t n = 1 + t_below(&rs, 8), i, plen = 0;
      uint64_t path[24];
      int opaque = t_below(&rs, 3) == 0;
      uint32_t pc = t_below(&rs, 10);
      if (pc < 6 && nsh) { /* a held (or once-held) seq of some worker */
        shadow_t *s = &sh[t_below(&rs, (uint32_t)nsh)];
        if (t_below(&rs, 4)) { /* mostly this worker's own */
          size_t j, tries = 0;
          for (j = t_below(&rs, (uint32_t)nsh); tries < nsh; j = (j + 1) % nsh, tries++)
            if (sh[j].worker == wid && sh[j].rank == rank) {
              s = &sh[j];
              break;
            }
        }
        parent = s->seq;
        pp = &parent;
        plen = s->plen;
        memcpy(path, s->path, sizeof path);
        pseq = s->seq;
      } else if (pc < 7) {
        parent = 0xDEADull + t_below(&rs, 3); /* unknown */
        pp = &parent;
      }
      for (i = 0; i < n; i++) {
        b[i].local = 1 + t_below(&rs, alpha);
        if (opaque) b[i].seq = 1000 + t_below(&rs, 40); /* collisions, duplicates */
        else b[i].seq = (i == 0 && !pp) ? b[i].local : kvidx_seq_hash_next(i ? b[i - 1].seq : pseq, b[i].local);
      }
      for (k = 0; k < 3; k++) st[k] = kvidx_store(ix[k], wid, rank, pp, b, n);
      if (st[0] == KVIDX_OK)
        for (i = 0; i < n && nsh < SHADOW_MAX; i++) {
          shadow_t *s = &sh[nsh++];
          s->worker = wid;
          s->rank = rank;
          s->seq = b[i].seq;
          if (plen < 24) path[plen++] = b[i].local;
          s->plen = plen;
          memcpy(s->path, path, sizeof path);
        }
    } else if (r < 65) { /* remove */
      uint64_t rm[4];
      uint32_t n = 1 + t_below(&rs, 3), i;
      for (i = 0; i < n; i++) {
        if (nsh && t_below(&rs, 5)) {
          size_t j = t_below(&rs, (uint32_t)nsh);
          rm[i] = sh[j].seq;
          if (t_below(&rs, 2)) wid = sh[j].worker, rank = sh[j].rank;
        } else {
          rm[i] = 0xBEEF;
        }
      }
      for (k = 0; k < 3; k++) st[k] = kvidx_remove(ix[k], wid, rank, rm, n);
    } else if (r < 68) {
      for (k = 0; k < 3; k++) st[k] = kvidx_clear(ix[k], wid, rank);
    } else if (r < 70) {
      for (k = 0; k < 3; k++) st[k] = kvidx_remove_worker(ix[k], wid);
    } else {
      for (k = 0; k < 3; k++) st[k] = 0;
    }
    if (!t_same_status(st, op, r)) bad = 1;
    /* answers after every op */
    {
      uint64_t q[24];
      uint32_t i, n;
      if (nsh) {
        shadow_t *s = &sh[t_below(&rs, (uint32_t)nsh)];
        n = s->plen;
        memcpy(q, s->path, sizeof q);
        if (n > 1 && t_below(&rs, 2)) q[t_below(&rs, n)] = 1 + t_below(&rs, alpha); /* mutation point */
        if (!same_answers(ix, 3, q, n)) bad = 1;
      }
      n = 1 + t_below(&rs, 10);
      for (i = 0; i < n; i++) q[i] = 1 + t_below(&rs, alpha);
      if (!same_answers(ix, 3, q, n)) bad = 1;
      for (i = 0; i < nwk; i++) {
        size_t a = kvidx_worker_blocks(ix[0], 100 + i / 2, i % 2);
        for (k = 1; k < 3; k++)
          if (kvidx_worker_blocks(ix[k], 100 + i / 2, i % 2) != a) {
            fprintf(stderr, "op %d: worker_blocks differ (%s)\n", op, t_kind_name(k));
            bad = 1;
          }
      }
    }
    if (op % 25 == 0 || bad)
      for (k = 0; k < 3; k++) {
        int rc = kvidx__check(ix[k]);
        if (rc) {
          fprintf(stderr, "op %d: kvidx__check(%s) = %d\n", op, t_kind_name(k), rc);
          bad = 1;
        }
      }
    /* keep the shadow fresh: drop the oldest half when full */
    if (nsh == SHADOW_MAX) {
      memmove(sh, sh + SHADOW_MAX / 2, sizeof(shadow_t) * (SHADOW_MAX / 2));
      nsh = SHADOW_MAX / 2;
    }
  }
  CHECK(!bad);
  if (bad)
    fprintf(stderr, "differential failed: seed %llu workers %u jump %u alpha %u max_blocks %zu\n",
            (unsigned long long)seed, max_workers, jump, alpha, max_blocks);
  for (k = 0; k < 3; k++) {
    kvidx_stats st;
    CHECK_EQ(kvidx__check(ix[k]), 0);
    CHECK_EQ(kvidx_get_stats(ix[k], &st), KVIDX_OK);
    kvidx_destroy(ix[k]);
  }
}

/* ---- 5. capacity: EFULL changes nothing ---------------------------------- */
static void test_capacity(int kind) {
  kvidx_config c;
  kvidx *ix;
  uint64_t L[6] = {1, 2, 3, 4, 5, 6};
  kvidx_block b[6];
  run(L, 6, b);
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_workers = 2;
  c.max_blocks = 8;
  CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 6), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 2, 0, NULL, b, 3), KVIDX_EFULL); /* 9 > 8 */
  CHECK_EQ(kvidx_worker_blocks(ix, 2, 0), 0);
  CHECK_EQ(kvidx_store(ix, 2, 0, NULL, b, 2), KVIDX_OK);    /* exactly 8 */
  CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 6), KVIDX_OK);    /* duplicates need no room */
  CHECK_EQ(kvidx_remove(ix, 2, 0, &b[1].seq, 1), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 3, 0, NULL, b, 1), KVIDX_EFULL); /* third worker */
  CHECK_EQ(kvidx_worker_blocks(ix, 3, 0), 0);
  CHECK_EQ(kvidx_clear(ix, 2, 0), KVIDX_OK);                /* frees a slot */
  CHECK_EQ(kvidx_store(ix, 3, 0, NULL, b, 2), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 6, 1, 0), 6);
  CHECK_EQ(depth_of(ix, L, 6, 3, 0), 2);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
  if (kind == KVIDX_REFERENCE) return;
  /* max_entries: a kind-level cap; the failed store rolls back */
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_entries = 4;
  CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 3), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 2, 0, NULL, b, 5), KVIDX_EFULL); /* needs entries 4 and 5 */
  CHECK_EQ(kvidx_worker_blocks(ix, 2, 0), 0);
  CHECK_EQ(depth_of(ix, L, 6, 2, 0), 0);
  CHECK_EQ(kvidx_store(ix, 2, 0, NULL, b, 4), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 6, 2, 0), 4);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

/* ---- 6. allocation failure at every point: nothing changes --------------- */
static void test_alloc_failure(int kind) {
  long k;
  int completed = 0;
  for (k = 0; k < 400 && !completed; k++) {
    t_alloc_ctx ac = {0, -1, 0, 0};
    kvidx_config c;
    kvidx *ix = NULL, *ref;
    uint64_t rs = 7;
    int op, rc;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.max_workers = 8;
    c.alloc = t_alloc;
    c.free = t_free;
    c.alloc_ctx = &ac;
    ac.fail_at = k;
    rc = kvidx_create(&ix, &c);
    if (rc != KVIDX_OK) {
      CHECK_EQ(rc, KVIDX_ENOMEM);
      CHECK(ix == NULL && ac.live == 0);
      continue;
    }
    ref = mk(KVIDX_REFERENCE, 8, 0);
    completed = 1;
    for (op = 0; op < 300; op++) {
      kvidx_block b[40];
      uint32_t n = 1 + t_below(&rs, 40), i, w = t_below(&rs, 4);
      uint64_t q[40];
      for (i = 0; i < n; i++) q[i] = b[i].local = 1 + t_below(&rs, 50);
      run(q, n, b);
      if (t_below(&rs, 4) == 0) {
        rc = kvidx_remove(ix, w, 0, &b[0].seq, 1);
        CHECK_EQ(rc, kvidx_remove(ref, w, 0, &b[0].seq, 1));
      } else {
        rc = kvidx_store(ix, w, 0, NULL, b, n);
        if (rc == KVIDX_ENOMEM) completed = 0;
        else CHECK_EQ(rc, kvidx_store(ref, w, 0, NULL, b, n));
      }
      CHECK(same_pair(ref, ix, q, n));
      for (i = 0; i < 4; i++) CHECK_EQ(kvidx_worker_blocks(ix, i, 0), kvidx_worker_blocks(ref, i, 0));
      if (rc == KVIDX_ENOMEM) {
        CHECK_EQ(kvidx__check(ix), 0);
        ac.fail_at = -1; /* fail once per run, then go on working */
      }
    }
    CHECK_EQ(kvidx__check(ix), 0);
    kvidx_destroy(ix);
    kvidx_destroy(ref);
    CHECK_EQ(ac.live, 0); /* every allocation was given back */
    CHECK_EQ(ac.bytes, 0);
  }
  CHECK(completed); /* some k let the whole workload run without failing */
}

/* ---- 7. caller-buffer mode: nothing is allocated after init -------------- */
static void test_buffer(int kind) {
  kvidx_config c;
  kvidx *ix, *ref;
  t_alloc_ctx ac = {0, 0, 0, 0}; /* fails every call */
  size_t need;
  void *mem;
  uint64_t rs = 99;
  int op, efull = 0;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_workers = 16;
  c.max_blocks = 300;
  c.alloc = t_alloc;
  c.free = t_free;
  c.alloc_ctx = &ac;
  need = kvidx_buffer_size(&c);
  if (kind == KVIDX_REFERENCE) {
    CHECK_EQ(need, 0);
    return;
  }
  CHECK(need > 0);
  mem = malloc(need);
  CHECK_EQ(kvidx_init_buffer(&ix, &c, mem, need - 1), KVIDX_EINVAL);
  CHECK_EQ(kvidx_init_buffer(&ix, &c, (char *)mem + 1, need - 1), KVIDX_EINVAL);
  CHECK_EQ(kvidx_init_buffer(&ix, &c, mem, need), KVIDX_OK);
  ref = mk(KVIDX_REFERENCE, 16, 0);
  {
    kvidx_config rc;
    memset(&rc, 0, sizeof rc);
    rc.kind = KVIDX_REFERENCE;
    rc.max_workers = 16;
    rc.max_blocks = 300;
    kvidx_destroy(ref);
    CHECK_EQ(kvidx_create(&ref, &rc), KVIDX_OK);
  }
  for (op = 0; op < 3000; op++) {
    kvidx_block b[12];
    uint64_t q[12];
    uint32_t n = 1 + t_below(&rs, 12), i, w = t_below(&rs, 20);
    int a, r;
    for (i = 0; i < n; i++) q[i] = 1 + t_below(&rs, 6);
    run(q, n, b);
    if (t_below(&rs, 3) == 0) {
      uint32_t at = t_below(&rs, n);
      a = kvidx_remove(ix, w, 0, &b[at].seq, 1);
      r = kvidx_remove(ref, w, 0, &b[at].seq, 1);
      CHECK_EQ(a, r);
    } else {
      a = kvidx_store(ix, w, 0, NULL, b, n);
      r = kvidx_store(ref, w, 0, NULL, b, n);
      efull += a == KVIDX_EFULL;
      CHECK_EQ(a, r);
    }
    CHECK(same_pair(ref, ix, q, n));
  }
  CHECK(efull > 0);
  CHECK_EQ(ac.calls, 0); /* the hook was never called */
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix); /* a no-op in buffer mode */
  kvidx_destroy(ref);
  free(mem);
}

/* ---- 8. memory is reused: a second identical workload does not grow ------- */
static void test_reuse(int kind) {
  t_alloc_ctx ac = {0, -1, 0, 0};
  kvidx_config c;
  kvidx *ix;
  size_t after_first = 0, base;
  int round;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.alloc = t_alloc;
  c.free = t_free;
  c.alloc_ctx = &ac;
  CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
  base = ac.bytes;
  for (round = 0; round < 3; round++) {
    uint64_t rs = 5, w;
    int i;
    kvidx_stats st;
    for (i = 0; i < 2000; i++) {
      kvidx_block b[16];
      uint64_t q[16];
      uint32_t n = 1 + t_below(&rs, 16), j;
      for (j = 0; j < n; j++) q[j] = t_rand(&rs);
      run(q, n, b);
      kvidx_store(ix, t_below(&rs, 30), 0, NULL, b, n);
    }
    for (w = 0; w < 30; w++) kvidx_clear(ix, w, 0);
    CHECK_EQ(kvidx_get_stats(ix, &st), KVIDX_OK);
    CHECK_EQ(st.blocks + st.workers + st.entries, 0);
    CHECK_EQ(st.bytes, ac.bytes);
    CHECK(ac.bytes >= base);
    if (round == 0) after_first = ac.bytes;
    else CHECK_EQ(ac.bytes, after_first);
  }
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
  CHECK_EQ(ac.live, 0);
}

/* ---- 8b. KVIDX_F_DEFER_FREE: no large block goes back inside a writer call -- */
typedef struct {
  t_alloc_ctx base;
  long big_frees; /* frees of at least KVIDX_DEFER_FREE_MIN bytes */
} t_defer_ctx;
static void *t_defer_alloc(void *ctx, size_t n) { return t_alloc(&((t_defer_ctx *)ctx)->base, n); }
static void t_defer_free(void *ctx, void *p, size_t n) {
  t_defer_ctx *c = (t_defer_ctx *)ctx;
  if (n >= KVIDX_DEFER_FREE_MIN) c->big_frees++;
  t_free(&c->base, p, n);
}

static void test_defer_free(int kind) {
  t_defer_ctx ctx[2];
  kvidx *ix[2];
  kvidx_config c;
  kvidx_stats st;
  size_t freed = 1, before;
  uint64_t rs = 17;
  int k, i, w;
  for (k = 0; k < 2; k++) { /* ix[0] defers, ix[1] does not: same workload, same answers */
    memset(&ctx[k], 0, sizeof ctx[k]);
    ctx[k].base.fail_at = -1;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.flags = k == 0 ? KVIDX_F_DEFER_FREE : 0;
    c.alloc = t_defer_alloc;
    c.free = t_defer_free;
    c.alloc_ctx = &ctx[k];
    CHECK_EQ(kvidx_create(&ix[k], &c), KVIDX_OK);
  }
  for (i = 0; i < 400; i++) { /* 4 workers x ~6,400 blocks: seq tables pass 64 KiB */
    kvidx_block b[64];
    uint64_t q[64];
    uint32_t j, n = 64;
    w = i % 4;
    for (j = 0; j < n; j++) q[j] = t_rand(&rs);
    run(q, n, b);
    for (k = 0; k < 2; k++) CHECK_EQ(kvidx_store(ix[k], (uint64_t)w, 0, NULL, b, n), KVIDX_OK);
    if (i % 50 == 49) {
      CHECK(same_answers(ix, 2, q, n));
      CHECK_EQ(kvidx_remove(ix[0], (uint64_t)w, 0, &b[3].seq, 1), kvidx_remove(ix[1], (uint64_t)w, 0, &b[3].seq, 1));
      CHECK(same_answers(ix, 2, q, n));
    }
  }
  CHECK_EQ(kvidx_clear(ix[0], 0, 0), kvidx_clear(ix[1], 0, 0)); /* an emptied worker's seq table goes */
  CHECK_EQ(ctx[0].big_frees, 0);  /* none inside a writer call ... */
  CHECK(ctx[1].big_frees > 0);    /* ... where the default frees some */
  CHECK_EQ(kvidx_get_stats(ix[0], &st), KVIDX_OK);
  CHECK(st.deferred_bytes >= KVIDX_DEFER_FREE_MIN);
  CHECK_EQ(st.bytes, ctx[0].base.bytes); /* still allocated, still counted */
  CHECK_EQ(kvidx__check(ix[0]), 0);
  before = ctx[0].base.bytes;
  CHECK_EQ(kvidx_reclaim(ix[0], &freed), KVIDX_OK);
  CHECK_EQ(freed, st.deferred_bytes);
  CHECK_EQ(ctx[0].base.bytes, before - freed);
  CHECK(ctx[0].big_frees > 0);
  CHECK_EQ(kvidx_get_stats(ix[0], &st), KVIDX_OK);
  CHECK_EQ(st.deferred_bytes, 0);
  CHECK_EQ(st.bytes, ctx[0].base.bytes);
  CHECK_EQ(kvidx_reclaim(ix[0], &freed), KVIDX_OK); /* nothing left */
  CHECK_EQ(freed, 0);
  CHECK_EQ(kvidx_reclaim(ix[1], NULL), KVIDX_OK);  /* without the flag: nothing to do */
  CHECK_EQ(kvidx_reclaim(NULL, &freed), KVIDX_EINVAL);
  for (w = 1; w < 4; w++) kvidx_clear(ix[0], (uint64_t)w, 0);
  CHECK_EQ(kvidx_get_stats(ix[0], &st), KVIDX_OK);
  CHECK(st.deferred_bytes > 0);
  kvidx_destroy(ix[0]); /* frees what still waits */
  kvidx_destroy(ix[1]);
  for (k = 0; k < 2; k++) {
    CHECK_EQ(ctx[k].base.live, 0);
    CHECK_EQ(ctx[k].base.bytes, 0);
  }
  if (kind != KVIDX_REFERENCE) { /* caller-buffer mode: the flag is accepted, nothing waits */
    kvidx *bx;
    void *mem;
    size_t need;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.flags = KVIDX_F_DEFER_FREE;
    c.max_blocks = 4096;
    need = kvidx_buffer_size(&c);
    CHECK(need > 0);
    mem = malloc(need);
    CHECK_EQ(kvidx_init_buffer(&bx, &c, mem, need), KVIDX_OK);
    for (i = 0; i < 60; i++) {
      kvidx_block b[64];
      uint64_t q[64];
      uint32_t j;
      for (j = 0; j < 64; j++) q[j] = t_rand(&rs);
      run(q, 64, b);
      kvidx_store(bx, (uint64_t)(i % 3), 0, NULL, b, 64);
      if (i % 20 == 19) kvidx_clear(bx, (uint64_t)(i % 3), 0);
    }
    CHECK_EQ(kvidx_get_stats(bx, &st), KVIDX_OK);
    CHECK_EQ(st.deferred_bytes, 0);
    CHECK_EQ(kvidx_reclaim(bx, &freed), KVIDX_OK);
    CHECK_EQ(freed, 0);
    CHECK_EQ(kvidx__check(bx), 0);
    free(mem);
  }
}

/* ---- 9. ordering and truncation of results ---------------------------------- */
static void test_order(int kind) {
  kvidx *ix = mk(kind, 0, 0);
  uint64_t L[4] = {1, 2, 3, 4};
  kvidx_block b[4];
  kvidx_score sc[10];
  uint64_t w;
  run(L, 4, b);
  for (w = 0; w < 10; w++) CHECK_EQ(kvidx_store(ix, 50 - w, (uint32_t)(w % 2), NULL, b, 1 + (w % 4)), KVIDX_OK);
  CHECK_EQ(kvidx_find_matches(ix, L, 4, sc, 10), 10);
  for (w = 1; w < 10; w++) {
    CHECK(sc[w - 1].depth >= sc[w].depth);
    if (sc[w - 1].depth == sc[w].depth) CHECK(sc[w - 1].worker_id < sc[w].worker_id);
  }
  {
    kvidx_score top[3];
    CHECK_EQ(kvidx_find_matches(ix, L, 4, top, 3), 10);
    CHECK(memcmp(top, sc, sizeof top) == 0);
    CHECK_EQ(kvidx_find_matches(ix, L, 4, NULL, 0), 10);
  }
  kvidx_destroy(ix);
}

/* ---- 10. many worker slots: the far end of the bitset -------------------- */
static void test_wide(int kind) {
  kvidx *ix = mk(kind, 1030, 0);
  uint64_t L[5] = {1, 2, 3, 4, 5};
  kvidx_block b[5];
  kvidx_score sc[4];
  uint64_t w;
  run(L, 5, b);
  for (w = 0; w < 1030; w++) CHECK_EQ(kvidx_store(ix, w, 0, NULL, b, 1 + (w == 1029) * 4), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 5000, 0, NULL, b, 1), KVIDX_EFULL);
  CHECK_EQ(kvidx_find_matches(ix, L, 5, sc, 4), 1030);
  CHECK(sc[0].worker_id == 1029 && sc[0].depth == 5 && sc[1].worker_id == 0 && sc[1].depth == 1);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

/* ---- large stores and wide answers: the paths small tests never take ---- */
static void test_large(int kind) {
  enum { N = 1500, W = 600 };
  static kvidx_block b[N];
  static uint64_t loc[N];
  static kvidx_score sc[W];
  kvidx_config c;
  kvidx *ix = NULL, *ref = NULL;
  kvidx_stats st0, st1;
  size_t i, m;
  uint64_t s = 99;
  for (i = 0; i < N; i++) { /* a chained run of N blocks, seq = index */
    loc[i] = t_rand(&s);
    b[i].local = loc[i];
    b[i].seq = 1000 + i;
  }
  /* a store longer than 1,024 blocks that fails at its end rolls back whole
   * (max_entries: the reference has no entries of its own) */
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_workers = 4;
  c.max_entries = N - 10;
  if (kind != KVIDX_REFERENCE) {
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
    CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 20), KVIDX_OK);
    kvidx_get_stats(ix, &st0);
    CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, N), KVIDX_EFULL);
    kvidx_get_stats(ix, &st1);
    CHECK(st0.blocks == st1.blocks && st0.workers == st1.workers);
    CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 20);
    CHECK_EQ(kvidx__check(ix), 0);
    kvidx_destroy(ix);
  }
  /* near max_blocks the exact count of new seqs (> 32 of them: sorted) */
  if (kind != KVIDX_REFERENCE) {
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.max_workers = 4;
    c.max_blocks = 100;
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
    c.kind = KVIDX_REFERENCE;
    CHECK_EQ(kvidx_create(&ref, &c), KVIDX_OK);
    CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 60), KVIDX_OK);
    CHECK_EQ(kvidx_store(ref, 1, 0, NULL, b, 60), KVIDX_OK);
    /* 90 blocks, 60 already held: 30 new fit (100 - 60 = 40) */
    CHECK_EQ(kvidx_store(ix, 1, 0, NULL, b, 90), kvidx_store(ref, 1, 0, NULL, b, 90));
    CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 90);
    /* 80 more from the start of another worker: 80 new, 10 left: refused */
    CHECK_EQ(kvidx_store(ix, 2, 0, NULL, b + 100, 80), KVIDX_EFULL);
    CHECK_EQ(kvidx_store(ref, 2, 0, NULL, b + 100, 80), KVIDX_EFULL);
    CHECK_EQ(kvidx__check(ix), 0);
    kvidx_destroy(ix);
    kvidx_destroy(ref);
  }
  /* more than 512 matching workers: the answer is sorted all the same */
  ix = mk(kind, W + 8, 0);
  for (i = 0; i < W; i++) { /* worker i holds i % 7 + 1 blocks */
    uint64_t w = (t_rand(&s) & 0xFFFFFFFFu) * 16 + i; /* ids in no particular order */
    CHECK_EQ(kvidx_store(ix, w, (uint32_t)(i & 1), NULL, b, i % 7 + 1), KVIDX_OK);
  }
  m = kvidx_find_matches(ix, loc, 10, sc, W);
  CHECK_EQ(m, W);
  for (i = 1; i < W; i++)
    CHECK(sc[i - 1].depth > sc[i].depth ||
          (sc[i - 1].depth == sc[i].depth && (sc[i - 1].worker_id < sc[i].worker_id ||
                                              (sc[i - 1].worker_id == sc[i].worker_id && sc[i - 1].dp_rank < sc[i].dp_rank))));
  CHECK(sc[0].depth == 7 && sc[W - 1].depth == 1);
  kvidx_destroy(ix);
}

static void test_config(void) {
  kvidx_config c;
  kvidx *ix = (kvidx *)&c;
  memset(&c, 0, sizeof c);
  c.kind = 7;
  CHECK_EQ(kvidx_create(&ix, &c), KVIDX_EINVAL);
  CHECK(ix == NULL);
  c.kind = KVIDX_POSITIONAL;
  c.jump = 100000;
  CHECK_EQ(kvidx_create(&ix, &c), KVIDX_EINVAL);
  c.jump = 0;
  c.max_workers = 1u << 30;
  CHECK_EQ(kvidx_create(&ix, &c), KVIDX_EINVAL);
  c.max_workers = 0;
  { /* the largest buffer: its size never wraps (on 32 bits it does not fit: 0) */
    size_t n;
    c.max_blocks = 0x3FFFFFF0u;
    n = kvidx_buffer_size(&c);
    CHECK(n == 0 ? sizeof(size_t) < 8 : n / 8 > c.max_blocks);
    CHECK_EQ(kvidx_init_buffer(&ix, &c, &c, sizeof c), KVIDX_EINVAL); /* far too small */
    c.max_blocks = 0;
  }
  c.max_workers = 1u << 30;
  CHECK_EQ(kvidx_buffer_size(&c), 0);
  c.max_workers = 0;
  c.alloc = t_alloc;
  CHECK_EQ(kvidx_create(&ix, &c), KVIDX_EINVAL); /* alloc without free */
  CHECK_EQ(kvidx_create(NULL, &c), KVIDX_EINVAL);
  CHECK(strcmp(kvidx_strerror(KVIDX_ENOPARENT), kvidx_strerror(KVIDX_ENOENT)) != 0);
  CHECK(strcmp(kvidx_strerror(12345), "unknown status") == 0);
  CHECK(strcmp(kvidx_version(), "0.2.0") == 0 && KVIDX_VERSION_NUMBER == 200);
}

int main(int argc, char **argv) {
  int k;
  uint32_t jumps[4] = {1, 2, 7, 64}, workers[4] = {1, 2, 64, 1030};
  int j, w;
  int quick = getenv("KVIDX_QUICK") != NULL;
  test_vectors(argc > 1 ? argv[1] : "tests/dynamo_hash_vectors.json");
  /* first, and alone if it fails: every table with control bytes probes
   * through these masks, and wrong ones can loop a probe for good */
  k = t_ctrl_groups();
  CHECK_EQ(k, 0);
  if (k) {
    printf("%d checks, %d failed (control-byte groups wrong: nothing else run)\n", t_checks, t_fails);
    return 1;
  }
  test_config();
  CHECK_EQ(t_grow_layout(), 0);
  CHECK_EQ(t_buffer_fixed_maps(), 0);
  CHECK_EQ(t_seq_shrink(), 0);
  CHECK_EQ(t_detached(), 0);
  CHECK_EQ(t_failed_store_shrinks(), 0);
  CHECK_EQ(t_hint_kept(), 0);
  CHECK_EQ(t_run_split(), 0);
  CHECK_EQ(t_seq_tags(), 0);
  CHECK_EQ(t_ctrl_collisions(), 0);
  CHECK_EQ(t_ctrl_tombstones(), 0);
  CHECK_EQ(t_ctrl_drain_stop(), 0);
  CHECK_EQ(t_check_restores(), 0);
  CHECK_EQ(t_grow_drains(), 0);
  CHECK_EQ(t_blocks_per_worker(), 0);
  for (k = 0; k < 3; k++) {
    for (j = 0; j < 4; j++) {
      test_semantics(T_KINDS[k], jumps[j]);
      test_traps(T_KINDS[k], jumps[j]);
    }
    test_repeated_chunk(T_KINDS[k]);
    test_cont_hint(T_KINDS[k]);
    test_mid_run_hint(T_KINDS[k]);
    test_decode_steps(T_KINDS[k]);
    test_capacity(T_KINDS[k]);
    test_alloc_failure(T_KINDS[k]);
    test_buffer(T_KINDS[k]);
    test_reuse(T_KINDS[k]);
    test_defer_free(T_KINDS[k]);
    test_order(T_KINDS[k]);
    test_wide(T_KINDS[k]);
    test_large(T_KINDS[k]);
  }
  printf("semantic, trap, capacity, allocation and buffer tests done\n");
  for (w = 0; w < 4; w++)
    for (j = 0; j < 4; j++) {
      uint32_t alpha;
      for (alpha = 2; alpha <= 5; alpha += 3) {
        test_differential(1000 + (uint64_t)(w * 16 + j) * 7 + alpha, workers[w], jumps[j], quick ? 500 : 2500, alpha, 0);
        test_differential(5000 + (uint64_t)(w * 16 + j) * 7 + alpha, workers[w], jumps[j], quick ? 300 : 1000, alpha, 40);
      }
    }
  printf("differential: 64 runs (workers 1/2/64/1030 x jump 1/2/7/64 x alphabets 2/5 x unbounded/40 blocks)\n");
  printf("%d checks, %d failed\n", t_checks, t_fails);
  printf("%d passed, %d failed\n", t_checks - t_fails, t_fails);
  return t_fails ? 1 : 0;
}
