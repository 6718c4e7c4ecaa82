/* Worker slots: generations and order hints.
 *
 * Slot generations do not wrap: a live worker stays in every answer however
 * many times other workers' slots are reassigned.  0.1 kept a 32-bit epoch
 * compared as a signed difference: after 2^31 assignments a live worker
 * vanished.  Here each assignment advances the generation by 2^30
 * (KVIDX_TEST_GEN_STEP), so a handful of flapping workers crosses 2^31, 2^32
 * and 2^33 at once. */
#define KVIDX_TEST_GEN_STEP (1ull << 30)
struct kvidx;
static void t_walk(const struct kvidx *ix, int step);
#define KVIDX_TEST_WALK(ix, step, blocks) ((void)(blocks), t_walk(ix, step))
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include <stdio.h>

static int fails, checks;
#define CHECK(c) (checks++, (c) ? (void)0 : (void)(fails++, fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c)))

/* Answers are in (depth desc, worker_id asc, dp_rank asc) order. */
static int in_order(const kvidx_score *sc, size_t m) {
  size_t i;
  for (i = 1; i < m; i++)
    if (!kvidx__score_before(&sc[i - 1], &sc[i])) return 0;
  return 1;
}

/* Order hints (kvidx__score_place): the writer keeps each live slot's place
 * in (id, rank) order through arrivals and departures (kvidx__check verifies
 * it after each), answers of 17+ workers at a few depths are placed by them,
 * and stale hints are caught and sorted by comparison. */
static void test_order_hints(int kind) {
  enum { W = 48 };
  kvidx_config cfg;
  kvidx *ix;
  uint64_t loc[4] = {21, 22, 23, 24}, seq[4], x = 7;
  kvidx_block b[4];
  kvidx_score sc[W];
  int i, round;
  memset(&cfg, 0, sizeof cfg);
  cfg.kind = kind;
  cfg.max_workers = W;
  CHECK(kvidx_create(&ix, &cfg) == KVIDX_OK);
  kvidx_seq_hashes(loc, 4, seq);
  for (i = 0; i < 4; i++) b[i].local = loc[i], b[i].seq = seq[i];
  for (round = 0; round < 200; round++) {
    uint64_t id;
    uint32_t rank;
    size_t m;
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = (x >> 40) % 24;
    rank = (uint32_t)(x >> 20) % 2;
    if ((x >> 10) % 3 == 0)
      kvidx_clear(ix, id, rank); /* the slot goes (if held) */
    else
      CHECK(kvidx_store(ix, id, rank, NULL, b, 1 + (size_t)((x >> 30) % 4)) == KVIDX_OK);
    CHECK(kvidx__check(ix) == 0);
    m = kvidx_find_matches(ix, loc, 4, sc, W);
    CHECK(m <= W && in_order(sc, m));
  }
  kvidx_destroy(ix);
}

/* kvidx__score_place itself: right hints place, stale ones are refused. */
static void test_score_place(void) {
  enum { N = 20 };
  kvidx_score a[N], fresh[N];
  uint16_t order[N];
  int i;
  kvidx__sink k;
  for (i = 0; i < N; i++) {
    fresh[i].worker_id = (uint64_t)(1000 - 10 * i); /* emitted in reverse id order */
    fresh[i].dp_rank = 0;
    fresh[i].depth = (uint32_t)(1 + i % 3);
    order[i] = (uint16_t)(N - 1 - i);
  }
  memcpy(a, fresh, sizeof a);
  CHECK(kvidx__score_place(a, N, order) == 1 && in_order(a, N));
  memcpy(a, fresh, sizeof a);
  order[3] = order[6]; /* two scores at one depth, one hint */
  CHECK(kvidx__score_place(a, N, order) == 0 && memcmp(a, fresh, sizeof a) == 0);
  order[3] = (uint16_t)(N - 1 - 6), order[6] = (uint16_t)(N - 1 - 3); /* swapped at one depth: a wrong order */
  CHECK(kvidx__score_place(a, N, order) == 0 && memcmp(a, fresh, sizeof a) == 0);
  for (i = 0; i < N; i++) order[i] = (uint16_t)(N - 1 - i), a[i].depth = (uint32_t)(1 + i % 9); /* 9 depths */
  CHECK(kvidx__score_place(a, N, order) == 0);
  /* the sink falls back to the comparison sort on stale hints */
  memcpy(a, fresh, sizeof a);
  kvidx__sink_init(&k, a, sizeof(kvidx_score), N);
  k.n = k.total = N;
  for (i = 0; i < N; i++) k.order[i] = (uint16_t)(i % 5); /* nonsense */
  CHECK(kvidx__sink_finish(&k) == N && in_order(a, N));
}

/* Answers come out of the walk in final order, no sorting, when the order
 * hints hold (kvidx__stopped, kvidx__stopped_emit): every worker of the
 * sets that stop at each depth is marked by its slot's hint (pass 1) and
 * read back through at_order into its place (pass 2).  Between the passes
 * (the walk's step 3) this
 * hook plays a writer the reader raced: poke 1 swaps two at_order words
 * and moves the hints' seqlock on, as a worker arriving meanwhile would
 * (a torn read of its update; the walk must see the seqlock moved and
 * sort); poke 2 points one at_order word away from its slot without
 * touching the seqlock (a stale hint the walk must notice by the slot left
 * over); poke 3, as the walk starts, stores two workers the walk then
 * finds holding the path, assigned after the query began (their slots give
 * no score: holes in the placed answer, closed).  Each is undone after the
 * query. */
static int poke, poked;
static uint32_t poke_a, poke_b;
static kvidx_block *poke_blocks;
static void t_walk(const struct kvidx *cix, int step) {
  kvidx *ix = (kvidx *)(uintptr_t)cix;
  if (poke == 3 && step == 0 && !poked) { /* workers arriving as the query starts: no score for them */
    poked = 1;
    CHECK(kvidx_store(ix, 1, 0, NULL, poke_blocks, 6) == KVIDX_OK && kvidx_store(ix, 995, 0, NULL, poke_blocks, 6) == KVIDX_OK);
    return;
  }
  if (poke == 4 && step == 0 && !poked) { /* a worker taking slot 64 as the query starts */
    poked = 1;
    CHECK(kvidx_store(ix, 500, 0, NULL, poke_blocks, 6) == KVIDX_OK);
    return;
  }
  if (step != 3 || !poke || poke >= 3 || poked) return;
  poked = 1;
  poke_a = kvidx__ld(&ix->idents[0].at_order), poke_b = kvidx__ld(&ix->idents[1].at_order);
  if (poke == 1) {
    kvidx__st(&ix->idents[0].at_order, poke_b);
    kvidx__st(&ix->idents[1].at_order, poke_a);
    kvidx__st(&ix->order_ver, kvidx__ld(&ix->order_ver) + 2);
  } else {
    kvidx__st(&ix->idents[0].at_order, 63u); /* no worker's slot */
  }
}
static void unpoke(kvidx *ix) {
  if (poked && poke == 3) {
    CHECK(kvidx_clear(ix, 1, 0) == KVIDX_OK && kvidx_clear(ix, 995, 0) == KVIDX_OK);
  } else if (poked) {
    kvidx__st(&ix->idents[0].at_order, poke_a);
    kvidx__st(&ix->idents[1].at_order, poke_b);
  }
  poke = poked = 0;
}

/* Workers arrive in descending id order (slot order is the reverse of id
 * order), hold prefixes of one path; some stop inside one stored run at one
 * depth, some at others.  Every answer, hooks or not, equals the reference
 * kind's (the law), poked ones too; and the hooks must have run. */
static void test_walk_order(int kind) {
  enum { W = 14, L = 6 };
  kvidx_config cfg, rcfg;
  kvidx *ix, *ref;
  uint64_t loc[L] = {31, 32, 33, 34, 35, 36}, seq[L];
  kvidx_block b[L];
  kvidx_score sc[W + 2], want[W + 2]; /* room for the two coming mid-query (poke 3) */
  kvidx_tier_score tsc[W + 2], twant[W + 2];
  int i, p, q;
  memset(&cfg, 0, sizeof cfg);
  cfg.kind = kind;
  cfg.max_workers = 64;
  rcfg = cfg;
  rcfg.kind = KVIDX_REFERENCE;
  CHECK(kvidx_create(&ix, &cfg) == KVIDX_OK && kvidx_create(&ref, &rcfg) == KVIDX_OK);
  kvidx_seq_hashes(loc, L, seq);
  for (i = 0; i < L; i++) b[i].local = loc[i], b[i].seq = seq[i];
  for (i = 0; i < W - 2; i++) { /* ids 1000, 990, ..; prefixes 6, 6, 3, 3, 3, 5, 6, 1, 3, 6, 2, 4: the first stores the run */
    static const size_t len[W - 2] = {6, 6, 3, 3, 3, 5, 6, 1, 3, 6, 2, 4};
    uint64_t id = 1000 - 10 * (uint64_t)i;
    CHECK(kvidx_store(ix, id, 0, NULL, b, len[i]) == KVIDX_OK && kvidx_store(ref, id, 0, NULL, b, len[i]) == KVIDX_OK);
  }
  for (i = 0; i < 2; i++) { /* two runs, the second below the first; then a hole at its start */
    kvidx *t = i ? ref : ix;
    CHECK(kvidx_store(t, 5, 0, NULL, b, 3) == KVIDX_OK && kvidx_store(t, 5, 0, &seq[2], b + 3, 3) == KVIDX_OK);
    CHECK(kvidx_store(t, 7, 0, NULL, b, L) == KVIDX_OK && kvidx_remove(t, 7, 0, &seq[3], 1) == KVIDX_OK);
  }
  CHECK(kvidx__check(ix) == 0);
  poke_blocks = b;
  for (p = 0; p < 4; p++)
    for (q = 1; q <= L; q++) {
      size_t m, mr;
      poke = p;
      m = kvidx_find_matches(ix, loc, (size_t)q, sc, W + 2);
      CHECK(!p || poked); /* the hook ran between the passes */
      unpoke(ix);
      mr = kvidx_find_matches(ref, loc, (size_t)q, want, W + 2);
      CHECK(m == mr && m >= 1 && memcmp(sc, want, m * sizeof sc[0]) == 0);
      poke = p; /* the same with tier scores (placed the same way, device blocks beside) */
      m = kvidx_find_matches_tiered(ix, loc, (size_t)q, tsc, W + 2);
      CHECK(!p || poked);
      unpoke(ix);
      mr = kvidx_find_matches_tiered(ref, loc, (size_t)q, twant, W + 2);
      CHECK(m == mr && m >= 1 && memcmp(tsc, twant, m * sizeof tsc[0]) == 0);
    }
  CHECK(kvidx__check(ix) == 0);
  kvidx_destroy(ix);
  kvidx_destroy(ref);
}

/* Slot 64 assigned as a query of a 64-slot fleet starts: the walk keeps
 * one-word sets (slots 0..63) and must skip the newcomer's holder entry,
 * not take it for slot 0 (64 mod 64), which holds a shorter prefix. */
static void test_late_slot_64(int kind) {
  enum { L = 6 };
  kvidx_config cfg;
  kvidx *ix;
  uint64_t loc[L] = {41, 42, 43, 44, 45, 46}, seq[L], other = 999;
  kvidx_block b[L], ob;
  kvidx_score sc[4];
  size_t m;
  uint64_t id;
  int i;
  memset(&cfg, 0, sizeof cfg);
  cfg.kind = kind;
  cfg.max_workers = 80;
  CHECK(kvidx_create(&ix, &cfg) == KVIDX_OK);
  kvidx_seq_hashes(loc, L, seq);
  for (i = 0; i < L; i++) b[i].local = loc[i], b[i].seq = seq[i];
  ob.local = ob.seq = other;
  CHECK(kvidx_store(ix, 1, 0, NULL, b, 3) == KVIDX_OK); /* slot 0: 3 blocks of the path */
  for (id = 2; id <= 64; id++) CHECK(kvidx_store(ix, id, 0, NULL, &ob, 1) == KVIDX_OK); /* slots 1..63 */
  poke_blocks = b;
  poke = 4;
  m = kvidx_find_matches(ix, loc, L, sc, 4);
  CHECK(poked);
  CHECK(m == 1 && sc[0].worker_id == 1 && sc[0].depth == 3);
  poke = poked = 0;
  m = kvidx_find_matches(ix, loc, L, sc, 4); /* and once it is there */
  CHECK(m == 2 && sc[0].worker_id == 500 && sc[0].depth == 6 && sc[1].worker_id == 1 && sc[1].depth == 3);
  CHECK(kvidx__check(ix) == 0);
  kvidx_destroy(ix);
}

int main(void) {
  static const int kinds[2] = {KVIDX_RADIX, KVIDX_POSITIONAL};
  int k, round;
  for (k = 0; k < 2; k++) {
    kvidx_config cfg;
    kvidx *ix;
    uint64_t loc[3] = {11, 12, 13}, seq[3];
    kvidx_block b[3];
    int i;
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = kinds[k];
    cfg.max_workers = 4;
    CHECK(kvidx_create(&ix, &cfg) == KVIDX_OK);
    kvidx_seq_hashes(loc, 3, seq);
    for (i = 0; i < 3; i++) b[i].local = loc[i], b[i].seq = seq[i];
    CHECK(kvidx_store(ix, 1, 0, NULL, b, 3) == KVIDX_OK); /* the live worker */
    for (round = 0; round < 12; round++) {                 /* 12 x 2^30: past 2^33 */
      kvidx_score sc[4];
      size_t m;
      CHECK(kvidx_store(ix, 2, 0, NULL, b, 2) == KVIDX_OK); /* a flapping worker */
      m = kvidx_find_matches(ix, loc, 3, sc, 4);
      CHECK(m == 2 && sc[0].worker_id == 1 && sc[0].depth == 3 && sc[1].worker_id == 2 && sc[1].depth == 2);
      CHECK(kvidx_clear(ix, 2, 0) == KVIDX_OK);
      m = kvidx_find_matches(ix, loc, 3, sc, 4);
      CHECK(m == 1 && sc[0].worker_id == 1 && sc[0].depth == 3);
    }
    CHECK(kvidx__check(ix) == 0);
    kvidx_destroy(ix);
  }
  test_order_hints(KVIDX_RADIX);
  test_order_hints(KVIDX_POSITIONAL);
  test_score_place();
  test_walk_order(KVIDX_RADIX);
  test_walk_order(KVIDX_POSITIONAL);
  test_late_slot_64(KVIDX_RADIX);
  test_late_slot_64(KVIDX_POSITIONAL);
  printf("generations and order hints: %d passed, %d failed\n", checks - fails, fails);
  return fails != 0;
}
