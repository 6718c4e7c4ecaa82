/* Production event handling: event ids, tiers, eviction (LRS and expiry),
 * a differential run through kvidx_apply against the reference model, dump
 * and snapshot round trips across kinds, corrupt / truncated snapshots. */
#define XXH_INLINE_ALL /* the test's own copy, to make a stream's checksums again */
#include <xxhash.h>
#include "testutil.h"

static int t_no_tiers; /* mk without KVIDX_F_TIERS (the apply differential's untiered runs) */
static kvidx *mk(int kind, uint32_t workers, size_t max_blocks, int evict, uint32_t pct) {
  kvidx_config c;
  kvidx *ix = NULL;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_workers = workers;
  c.max_blocks = max_blocks;
  c.evict = evict;
  c.evict_target_pct = pct;
  c.jump = 3;
  c.flags = t_no_tiers ? 0u : KVIDX_F_TIERS;
  if (kvidx_create(&ix, &c) != KVIDX_OK) {
    fprintf(stderr, "create failed\n");
    exit(2);
  }
  return ix;
}
static void run(const uint64_t *loc, size_t n, kvidx_block *b) {
  uint64_t seq[64];
  size_t i;
  kvidx_seq_hashes(loc, n, seq);
  for (i = 0; i < n; i++) b[i].local = loc[i], b[i].seq = seq[i];
}
static kvidx_event ev_store(uint64_t id, uint64_t w, const uint64_t *parent, const kvidx_block *b, size_t n, int tier) {
  kvidx_event e;
  memset(&e, 0, sizeof e);
  e.event_id = id;
  e.worker_id = w;
  e.type = KVIDX_EV_STORED;
  e.tier = tier;
  e.parent = parent;
  e.blocks = b;
  e.n = n;
  return e;
}
static kvidx_event ev_remove(uint64_t id, uint64_t w, const uint64_t *seqs, size_t n, int tier) {
  kvidx_event e;
  memset(&e, 0, sizeof e);
  e.event_id = id;
  e.worker_id = w;
  e.type = KVIDX_EV_REMOVED;
  e.tier = tier;
  e.seqs = seqs;
  e.n = n;
  return e;
}
static uint32_t depth_of(kvidx *ix, const uint64_t *q, size_t n, uint64_t w, uint32_t *dev) {
  kvidx_tier_score sc[64];
  size_t m = kvidx_find_matches_tiered(ix, q, n, sc, 64), i;
  for (i = 0; i < m && i < 64; i++)
    if (sc[i].worker_id == w) {
      if (dev) *dev = sc[i].device_blocks;
      return sc[i].depth;
    }
  if (dev) *dev = 0;
  return 0;
}

/* ---- event ids ----------------------------------------------------------- */
static void test_event_ids(int kind) {
  kvidx *ix = mk(kind, 8, 0, 0, 0);
  uint64_t L[6] = {1, 2, 3, 4, 5, 6}, last = 0, bogus = 77;
  kvidx_block b[6];
  kvidx_event e;
  run(L, 6, b);
  e = ev_store(10, 1, NULL, b, 3, KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK); /* the first id is taken as it comes */
  CHECK_EQ(kvidx_last_event_id(ix, 1, 0, &last), KVIDX_OK);
  CHECK_EQ(last, 10);
  CHECK_EQ(kvidx_last_event_id(ix, 2, 0, &last), KVIDX_ENOENT);
  e = ev_store(11, 1, &b[2].seq, b + 3, 1, KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 4);
  e = ev_store(11, 1, &b[3].seq, b + 4, 1, KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_DUPLICATE); /* ignored */
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 4);
  e = ev_store(14, 1, &b[3].seq, b + 4, 1, KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_GAP); /* applied, gap reported */
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 5);
  e = ev_store(15, 1, &bogus, b + 5, 1, KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_ENOPARENT); /* refused for good: the id is used up */
  CHECK_EQ(kvidx_last_event_id(ix, 1, 0, &last), KVIDX_OK);
  CHECK_EQ(last, 15);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 5);
  e = ev_store(16, 1, &b[4].seq, b + 5, 1, KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK); /* no false gap */
  /* another dp_rank of the same worker: its own stream; Cleared drops only it */
  e = ev_store(3, 1, NULL, b, 2, KVIDX_TIER_DEVICE);
  e.dp_rank = 1;
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
  memset(&e, 0, sizeof e);
  e.event_id = 4;
  e.worker_id = 1;
  e.dp_rank = 1;
  e.type = KVIDX_EV_CLEARED;
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 1), 0);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 6);
  /* a resent or reordered event (an older id, same generation) is a
   * duplicate: it neither applies nor wipes the worker */
  e = ev_remove(12, 1, &b[0].seq, 1, KVIDX_TIER_ALL);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_DUPLICATE);
  e = ev_store(1, 1, NULL, b, 2, KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_DUPLICATE);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 6);
  CHECK_EQ(depth_of(ix, L, 6, 1, NULL), 6);
  CHECK_EQ(kvidx_last_event_id(ix, 1, 0, &last), KVIDX_OK);
  CHECK_EQ(last, 16);
  CHECK_EQ(kvidx_last_event_gen(ix, 1, 0, &last), KVIDX_OK);
  CHECK_EQ(last, 0);
  CHECK_EQ(kvidx_last_event_gen(ix, 2, 0, &last), KVIDX_ENOENT);
  CHECK_EQ(kvidx_last_event_gen(NULL, 1, 0, &last), KVIDX_EINVAL);
  CHECK_EQ(kvidx_last_event_gen(ix, 1, 0, NULL), KVIDX_EINVAL);
  /* the engine restarted (a new generation): old blocks go first, whatever
   * the id (here a higher one: ids are not compared across generations) */
  e = ev_store(100, 1, NULL, b, 2, KVIDX_TIER_DEVICE);
  e.generation = 1;
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_RESTARTED);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 2);
  CHECK_EQ(depth_of(ix, L, 6, 1, NULL), 2);
  CHECK_EQ(kvidx_last_event_id(ix, 1, 0, &last), KVIDX_OK);
  CHECK_EQ(last, 100);
  CHECK_EQ(kvidx_last_event_gen(ix, 1, 0, &last), KVIDX_OK);
  CHECK_EQ(last, 1);
  /* the old generation's late events are not duplicates of the new one:
   * going back to a generation is a restart too */
  e = ev_store(1, 1, NULL, b, 1, KVIDX_TIER_DEVICE);
  e.generation = 1;
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_DUPLICATE);
  e.generation = 2;
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_RESTARTED);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 1);
  CHECK_EQ(kvidx_last_event_id(ix, 1, 0, &last), KVIDX_OK);
  CHECK_EQ(last, 1);
  /* a restart whose event is refused for resources: the drop stands, the id
   * is not used up, and the same event goes through when retried */
  {
    kvidx *small = mk(kind, 8, 3, 0, 0);
    e = ev_store(50, 7, NULL, b, 3, KVIDX_TIER_DEVICE);
    CHECK_EQ(kvidx_apply(small, &e), KVIDX_OK);
    e = ev_store(60, 8, NULL, b, 1, KVIDX_TIER_DEVICE);
    CHECK_EQ(kvidx_apply(small, &e), KVIDX_EFULL); /* 4 > 3: id 60 not used */
    CHECK_EQ(kvidx_last_event_id(small, 8, 0, &last), KVIDX_ENOENT);
    e = ev_store(40, 7, NULL, b, 4, KVIDX_TIER_DEVICE);
    e.generation = 5;
    CHECK_EQ(kvidx_apply(small, &e), KVIDX_EFULL); /* restart: dropped, then 4 > 3 */
    CHECK_EQ(kvidx_worker_blocks(small, 7, 0), 0);
    CHECK_EQ(kvidx_last_event_id(small, 7, 0, &last), KVIDX_ENOENT);
    e.n = 3;
    CHECK_EQ(kvidx_apply(small, &e), KVIDX_OK); /* the retry: a first event again */
    CHECK_EQ(kvidx_worker_blocks(small, 7, 0), 3);
    CHECK_EQ(kvidx__check(small), 0);
    kvidx_destroy(small);
  }
  /* bad events */
  e.type = 9;
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_EINVAL);
  CHECK_EQ(kvidx_apply(ix, NULL), KVIDX_EINVAL);
  e = ev_store(2, 1, NULL, b, 1, 7);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_EINVAL);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

/* ---- tiers ----------------------------------------------------------------- */
static void test_tiers(int kind) {
  kvidx *ix = mk(kind, 8, 0, 0, 0);
  uint64_t L[4] = {9, 8, 7, 6};
  kvidx_block b[4];
  kvidx_event e;
  uint32_t dev;
  run(L, 4, b);
  CHECK_EQ(kvidx_tier_from_name("GPU"), KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_tier_from_name("CPU"), KVIDX_TIER_HOST);
  CHECK_EQ(kvidx_tier_from_name("cpu_pinned"), KVIDX_TIER_HOST);
  CHECK_EQ(kvidx_tier_from_name("DISK"), KVIDX_TIER_DISK);
  CHECK_EQ(kvidx_tier_from_name(NULL), KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_tier_from_name("tape?"), KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_tier_from_name("Cpu"), KVIDX_TIER_HOST);
  CHECK_EQ(kvidx_tier_from_name("cpux"), KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_tier_from_name("cp"), KVIDX_TIER_DEVICE);
  e = ev_store(1, 5, NULL, b, 4, KVIDX_TIER_DEVICE);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
  e = ev_store(2, 5, NULL, b, 2, KVIDX_TIER_HOST); /* offloaded copies of the first two */
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 5, 0), 4);
  CHECK_EQ(depth_of(ix, L, 4, 5, &dev), 4);
  CHECK_EQ(dev, 4);
  e = ev_remove(3, 5, &b[0].seq, 1, KVIDX_TIER_DEVICE); /* GPU evicts block 0: host copy stays */
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 4, 5, &dev), 4);
  CHECK_EQ(dev, 3);
  e = ev_remove(4, 5, &b[2].seq, 1, KVIDX_TIER_HOST); /* no host copy of block 2 */
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_ENOENT);
  CHECK_EQ(depth_of(ix, L, 4, 5, &dev), 4);
  e = ev_remove(5, 5, &b[0].seq, 1, KVIDX_TIER_HOST); /* the last copy: a hole at 0 */
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 4, 5, &dev), 0);
  CHECK_EQ(kvidx_worker_blocks(ix, 5, 0), 3);
  e = ev_store(6, 5, NULL, b, 1, KVIDX_TIER_DISK);
  CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
  CHECK_EQ(depth_of(ix, L, 4, 5, &dev), 4);
  CHECK_EQ(dev, 3);
  CHECK_EQ(kvidx_remove(ix, 5, 0, &b[1].seq, 1), KVIDX_OK); /* the plain call drops every copy */
  CHECK_EQ(depth_of(ix, L, 4, 5, &dev), 1);
  CHECK_EQ(dev, 0);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
  { /* without KVIDX_F_TIERS: device copies only */
    kvidx_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
    e = ev_store(1, 5, NULL, b, 4, KVIDX_TIER_HOST);
    CHECK_EQ(kvidx_apply(ix, &e), KVIDX_ENOTSUP);
    CHECK_EQ(kvidx_worker_blocks(ix, 5, 0), 0);
    e = ev_store(1, 5, NULL, b, 4, KVIDX_TIER_DEVICE);
    CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
    CHECK_EQ(depth_of(ix, L, 4, 5, &dev), 4);
    CHECK_EQ(dev, 4);
    e = ev_remove(2, 5, &b[3].seq, 1, KVIDX_TIER_HOST); /* there is no host copy */
    CHECK_EQ(kvidx_apply(ix, &e), KVIDX_ENOENT);
    e = ev_remove(3, 5, &b[3].seq, 1, KVIDX_TIER_DEVICE);
    CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
    CHECK_EQ(depth_of(ix, L, 4, 5, &dev), 3);
    CHECK_EQ(dev, 3);
    CHECK_EQ(kvidx__check(ix), 0);
    kvidx_destroy(ix);
  }
}

/* ---- eviction ---------------------------------------------------------------- */
static void test_evict_lrs(int kind) {
  kvidx *ix = mk(kind, 8, 10, KVIDX_EVICT_LRS, 50);
  uint64_t A[4] = {1, 2, 3, 4}, B[4] = {5, 6, 7, 8}, C[4] = {9, 10, 11, 12};
  kvidx_block a[4], b[4], c[4];
  run(A, 4, a);
  run(B, 4, b);
  run(C, 4, c);
  CHECK_EQ(kvidx_store(ix, 1, 0, NULL, a, 4), KVIDX_OK);
  CHECK_EQ(kvidx_store(ix, 2, 0, NULL, b, 4), KVIDX_OK);
  /* 8 held; 4 more do not fit in 10: prune to min(50% of 10, 10 - 4) = 5:
   * the oldest store goes first, its deepest blocks first */
  CHECK_EQ(kvidx_store(ix, 3, 0, NULL, c, 4), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 1);
  CHECK_EQ(kvidx_worker_blocks(ix, 2, 0), 4);
  CHECK_EQ(kvidx_worker_blocks(ix, 3, 0), 4);
  CHECK_EQ(depth_of(ix, A, 4, 1, NULL), 1);
  /* the parent of a store is never pruned, even when it is the oldest */
  CHECK_EQ(kvidx_store(ix, 1, 0, &a[0].seq, a + 1, 3), KVIDX_OK);
  CHECK_EQ(depth_of(ix, A, 4, 1, NULL), 4);
  CHECK_EQ(kvidx_store(ix, 4, 0, NULL, a, 4), KVIDX_OK);
  CHECK(kvidx_worker_blocks(ix, 1, 0) + kvidx_worker_blocks(ix, 2, 0) + kvidx_worker_blocks(ix, 3, 0) +
            kvidx_worker_blocks(ix, 4, 0) <= 10);
  {
    kvidx_block big[11];
    uint64_t L[11];
    int i;
    for (i = 0; i < 11; i++) L[i] = 100 + (uint64_t)i;
    run(L, 11, big);
    CHECK_EQ(kvidx_store(ix, 5, 0, NULL, big, 11), KVIDX_EFULL); /* can never fit */
    CHECK_EQ(kvidx_store(ix, 4, 0, &a[3].seq, big, 10), KVIDX_EFULL); /* fits only without its parent */
    CHECK_EQ(kvidx_store(ix, 5, 0, NULL, big, 10), KVIDX_OK);
    CHECK_EQ(kvidx_worker_blocks(ix, 5, 0), 10);
  }
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
}

static void test_ttl(int kind) {
  kvidx *ix = mk(kind, 8, 7, KVIDX_EVICT_EXPIRY, 100);
  uint64_t A[3] = {1, 2, 3}, B[3] = {4, 5, 6}, C[2] = {7, 8};
  kvidx_block a[3], b[3], c[2];
  size_t gone = 0;
  run(A, 3, a);
  run(B, 3, b);
  run(C, 2, c);
  CHECK_EQ(kvidx_store_ttl(ix, 1, 0, NULL, a, 3, 100), KVIDX_OK);
  CHECK_EQ(kvidx_store_ttl(ix, 2, 0, NULL, b, 3, 50), KVIDX_OK);
  CHECK_EQ(kvidx_expire(ix, 49, &gone), KVIDX_OK);
  CHECK_EQ(gone, 0);
  CHECK_EQ(kvidx_store_ttl(ix, 2, 0, NULL, b, 1, 200), KVIDX_OK); /* routed again: lives longer */
  CHECK_EQ(kvidx_expire(ix, 50, &gone), KVIDX_OK);
  CHECK_EQ(gone, 2);
  CHECK_EQ(kvidx_worker_blocks(ix, 2, 0), 1);
  /* size bound: earliest expiry first */
  CHECK_EQ(kvidx_store_ttl(ix, 3, 0, NULL, c, 2, 300), KVIDX_OK); /* 6 held */
  CHECK_EQ(kvidx_store_ttl(ix, 4, 0, NULL, c, 1, 400), KVIDX_OK); /* 7 held: full */
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 3);
  CHECK_EQ(kvidx_store_ttl(ix, 6, 0, NULL, c, 1, 500), KVIDX_OK); /* prunes worker 1's first-expiring block */
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 2);
  CHECK_EQ(depth_of(ix, A, 3, 1, NULL), 2); /* same expiry: the newest (deepest) went first */
  CHECK_EQ(kvidx_store(ix, 5, 0, NULL, c, 1), KVIDX_OK); /* no expiry: pruned last; prunes another of worker 1 */
  CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 1);
  CHECK_EQ(kvidx_expire(ix, 1000, &gone), KVIDX_OK);
  CHECK_EQ(kvidx_worker_blocks(ix, 5, 0), 1);
  {
    kvidx_stats st;
    kvidx_get_stats(ix, &st);
    CHECK_EQ(st.blocks, 1);
  }
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
  ix = mk(kind, 8, 0, 0, 0);
  CHECK_EQ(kvidx_store_ttl(ix, 1, 0, NULL, a, 1, 5), KVIDX_ENOTSUP);
  CHECK_EQ(kvidx_expire(ix, 5, NULL), KVIDX_ENOTSUP);
  kvidx_destroy(ix);
}

/* ---- differential through kvidx_apply ------------------------------------ */
typedef struct {
  uint64_t w, seq;
  uint32_t rank, plen;
  uint64_t path[16];
} held_t;

static int compare_all(kvidx **ix, const uint64_t *q, size_t n, int op) {
  kvidx_tier_score a[40], b[40];
  kvidx_score pa[40], pb[40];
  size_t ta = kvidx_find_matches_tiered(ix[0], q, n, a, 40), k, tb, i;
  size_t pta = kvidx_find_matches(ix[0], q, n, pa, 40), ptb;
  for (k = 1; k < 3; k++) {
    tb = kvidx_find_matches_tiered(ix[k], q, n, b, 40);
    ptb = kvidx_find_matches(ix[k], q, n, pb, 40);
    if (ta != tb || pta != ptb || memcmp(a, b, sizeof(kvidx_tier_score) * (ta < 40 ? ta : 40)) ||
        memcmp(pa, pb, sizeof(kvidx_score) * (pta < 40 ? pta : 40))) {
      fprintf(stderr, "op %d: %s answers differ from the reference (n=%zu)\n", op, t_kind_name(k), n);
      for (i = 0; i < ta && i < 40; i++)
        fprintf(stderr, "  ref w%llu d%u dev%u\n", (unsigned long long)a[i].worker_id, a[i].depth, a[i].device_blocks);
      for (i = 0; i < tb && i < 40; i++)
        fprintf(stderr, "  got w%llu d%u dev%u\n", (unsigned long long)b[i].worker_id, b[i].depth, b[i].device_blocks);
      return 0;
    }
  }
  return 1;
}

static void test_apply_differential(uint64_t seed, int evict, size_t max_blocks, int nops) {
  kvidx *ix[3];
  static held_t hd[2048];
  size_t nh = 0;
  uint64_t rs = seed, ids[8] = {0}, gens[8] = {0}, now = 0;
  int op, k, bad = 0;
  for (k = 0; k < 3; k++) ix[k] = mk(T_KINDS[k], 6, max_blocks, evict, 60);
  for (op = 0; op < nops && !bad; op++) {
    uint32_t r = t_below(&rs, 100), w = t_below(&rs, 8);
    kvidx_event e;
    kvidx_block b[10];
    uint64_t seqs[4], parent = 0;
    int st[3];
    memset(&e, 0, sizeof e);
    /* event ids: mostly next, sometimes a gap, a duplicate or a restart */
    {
      uint32_t j = t_below(&rs, 20);
      ids[w] = j == 0 ? ids[w] + 3 : j == 1 ? ids[w] : j == 2 ? ids[w] / 2 : ids[w] + 1;
      if (j == 3) gens[w]++; /* a restart; j == 2 is a resent older event */
    }
    e.event_id = ids[w];
    e.generation = gens[w];
    e.worker_id = w / 2;
    e.dp_rank = w % 2;
    e.tier = (int)t_below(&rs, 3);
    if (t_no_tiers) e.tier = KVIDX_TIER_DEVICE; /* the only tier there is */
    if (r < 50) {
      uint32_t n = 1 + t_below(&rs, 8), i, plen = 0;
      uint64_t path[16], pseq = 0;
      e.type = KVIDX_EV_STORED;
      if (nh && t_below(&rs, 3)) {
        held_t *h = &hd[t_below(&rs, (uint32_t)nh)];
        if (t_below(&rs, 5)) { /* prefer this worker's own */
          size_t j;
          for (j = 0; j < nh; j++)
            if (hd[j].w == e.worker_id && hd[j].rank == e.dp_rank) h = &hd[j];
        }
        parent = pseq = h->seq;
        e.parent = &parent;
        plen = h->plen;
        memcpy(path, h->path, sizeof path);
      }
      for (i = 0; i < n; i++) {
        b[i].local = 1 + t_below(&rs, 3);
        b[i].seq = t_below(&rs, 4) == 0 ? 500 + t_below(&rs, 30)
                                          : (i == 0 && !e.parent ? b[i].local : kvidx_seq_hash_next(i ? b[i - 1].seq : pseq, b[i].local));
      }
      e.blocks = b;
      e.n = n;
      if (evict == KVIDX_EVICT_EXPIRY && t_below(&rs, 4)) e.expires_at = now + 1 + t_below(&rs, 40);
      for (k = 0; k < 3; k++) st[k] = kvidx_apply(ix[k], &e);
      if (st[0] >= 0 && st[0] != KVIDX_DUPLICATE)
        for (i = 0; i < n; i++) {
          held_t *h = &hd[nh < 2048 ? nh++ : t_below(&rs, 2048)];
          h->w = e.worker_id;
          h->rank = e.dp_rank;
          h->seq = b[i].seq;
          if (plen < 16) path[plen++] = b[i].local;
          h->plen = plen;
          memcpy(h->path, path, sizeof path);
        }
    } else if (r < 80) {
      uint32_t n = 1 + t_below(&rs, 3), i;
      e.type = KVIDX_EV_REMOVED;
      if (t_below(&rs, 3) == 0 && !t_no_tiers) e.tier = KVIDX_TIER_ALL;
      for (i = 0; i < n; i++) seqs[i] = nh && t_below(&rs, 6) ? hd[t_below(&rs, (uint32_t)nh)].seq : 0xBEEF;
      e.seqs = seqs;
      e.n = n;
      for (k = 0; k < 3; k++) st[k] = kvidx_apply(ix[k], &e);
    } else if (r < 84) {
      e.type = KVIDX_EV_CLEARED;
      for (k = 0; k < 3; k++) st[k] = kvidx_apply(ix[k], &e);
    } else if (r < 88 && evict == KVIDX_EVICT_EXPIRY) {
      size_t g[3];
      now += t_below(&rs, 10);
      for (k = 0; k < 3; k++) st[k] = kvidx_expire(ix[k], now, &g[k]);
      if (g[1] != g[0] || g[2] != g[0]) {
        fprintf(stderr, "op %d: expire counts differ\n", op);
        bad = 1;
      }
    } else {
      for (k = 0; k < 3; k++) st[k] = 0;
    }
    if (!t_same_status(st, op, r)) bad = 1;
    {
      uint64_t q[16];
      uint32_t i, n;
      if (nh) {
        held_t *h = &hd[t_below(&rs, (uint32_t)nh)];
        memcpy(q, h->path, sizeof q);
        n = h->plen;
        if (!compare_all(ix, q, n, op)) bad = 1;
      }
      n = 1 + t_below(&rs, 8);
      for (i = 0; i < n; i++) q[i] = 1 + t_below(&rs, 3);
      if (!compare_all(ix, q, n, op)) bad = 1;
      for (i = 0; i < 8; i++) {
        uint64_t la = 0, lb = 0;
        int ra = kvidx_last_event_id(ix[0], i / 2, i % 2, &la);
        for (k = 1; k < 3; k++) {
          int rb = kvidx_last_event_id(ix[k], i / 2, i % 2, &lb);
          if (kvidx_worker_blocks(ix[k], i / 2, i % 2) != kvidx_worker_blocks(ix[0], i / 2, i % 2) || ra != rb ||
              la != lb) {
            fprintf(stderr, "op %d: %s worker %u blocks or event id differ\n", op, t_kind_name(k), i);
            bad = 1;
          }
        }
      }
    }
    if (op % 20 == 0 || bad)
      for (k = 0; k < 3; k++)
        if (kvidx__check(ix[k])) {
          fprintf(stderr, "op %d: kvidx__check(%s) = %d\n", op, t_kind_name(k), kvidx__check(ix[k]));
          bad = 1;
        }
  }
  CHECK(!bad);
  if (bad) fprintf(stderr, "apply differential failed: seed %llu evict %d max_blocks %zu\n", (unsigned long long)seed, evict, max_blocks);
  for (k = 0; k < 3; k++) kvidx_destroy(ix[k]);
}

/* ---- dump and snapshots ------------------------------------------------------ */
static int replay(void *ctx, const kvidx_event *ev) {
  return kvidx_apply((kvidx *)ctx, ev) < 0;
}

/* A source with holes, tiers, opaque seqs, several workers and dp ranks. */
static void fill(kvidx *ix, uint64_t seed, int with_ttl) {
  uint64_t rs = seed;
  int i;
  for (i = 0; i < 400; i++) {
    kvidx_block b[8];
    uint64_t L[8], w = t_below(&rs, 5);
    uint32_t n = 1 + t_below(&rs, 8), j, rank = t_below(&rs, 2);
    kvidx_event e;
    for (j = 0; j < n; j++) L[j] = 1 + t_below(&rs, 4);
    run(L, n, b);
    if (t_below(&rs, 5) == 0)
      for (j = 0; j < n; j++) b[j].seq = 9000 + t_below(&rs, 500);
    e = ev_store((uint64_t)i * 2 + 2, w, NULL, b, n, (int)t_below(&rs, 3));
    e.dp_rank = rank;
    e.generation = 3 + w; /* snapshots carry it */
    if (with_ttl) e.expires_at = 1000 + t_below(&rs, 1000);
    kvidx_apply(ix, &e);
    if (t_below(&rs, 3) == 0) { /* a hole, or a tier's copy going */
      uint32_t at = t_below(&rs, n);
      e = ev_remove((uint64_t)i * 2 + 3, w, &b[at].seq, 1, t_below(&rs, 2) ? KVIDX_TIER_ALL : (int)t_below(&rs, 3));
      e.dp_rank = rank;
      e.generation = 3 + w;
      if (e.tier == KVIDX_TIER_ALL) kvidx_remove(ix, w, rank, &b[at].seq, 1);
      else kvidx_apply(ix, &e);
    }
  }
}

static int same_state(kvidx *a, kvidx *b, uint64_t seed) {
  uint64_t rs = seed;
  int i, ok = 1;
  kvidx_tier_score x[16], y[16];
  for (i = 0; i < 300 && ok; i++) {
    uint64_t q[8];
    uint32_t n = 1 + t_below(&rs, 8), j;
    size_t ta, tb;
    for (j = 0; j < n; j++) q[j] = 1 + t_below(&rs, 4);
    ta = kvidx_find_matches_tiered(a, q, n, x, 16);
    tb = kvidx_find_matches_tiered(b, q, n, y, 16);
    ok = ta == tb && !memcmp(x, y, sizeof(kvidx_tier_score) * (ta < 16 ? ta : 16));
    if (!ok) {
      size_t z;
      fprintf(stderr, "state differs on query %d (n=%u): %zu vs %zu\n", i, n, ta, tb);
      for (z = 0; z < ta && z < 16; z++) fprintf(stderr, "  a w%llu/%u d%u dev%u\n", (unsigned long long)x[z].worker_id, x[z].dp_rank, x[z].depth, x[z].device_blocks);
      for (z = 0; z < tb && z < 16; z++) fprintf(stderr, "  b w%llu/%u d%u dev%u\n", (unsigned long long)y[z].worker_id, y[z].dp_rank, y[z].depth, y[z].device_blocks);
    }
  }
  for (i = 0; i < 10 && ok; i++) ok = kvidx_worker_blocks(a, (uint64_t)i / 2, (uint32_t)i % 2) ==
                                      kvidx_worker_blocks(b, (uint64_t)i / 2, (uint32_t)i % 2);
  return ok;
}

static void test_snapshots(int src_kind, int ttl) {
  int evict = ttl ? KVIDX_EVICT_EXPIRY : 0;
  kvidx *src = mk(src_kind, 16, ttl ? 100000 : 0, evict, 0), *dst;
  t_mem m = {NULL, 0, 0, 0, -1};
  int k, rc;
  uint64_t la, lb;
  fill(src, 77 + (uint64_t)src_kind, ttl);
  CHECK_EQ(kvidx_snapshot_write(src, t_mem_write, &m), KVIDX_OK);
  CHECK(m.len >= 48 && (m.len - 48) % 8 == 0);
  CHECK_EQ(m.buf[8], 4); /* version 4 (holes: stand-ins): 48 + 48 n + 8 ceil(n / 64) bytes */
  {
    uint64_t n = 0, len = 0;
    int b;
    for (b = 7; b >= 0; b--) n = n << 8 | m.buf[16 + b], len = len << 8 | m.buf[24 + b];
    CHECK_EQ(len, (uint64_t)m.len);
    CHECK_EQ((uint64_t)m.len, 48 + 48 * n + 8 * ((n + 63) / 64));
  }
  for (k = 0; k < 3; k++) {
    /* binary snapshot into every kind */
    dst = mk(T_KINDS[k], 16, ttl ? 100000 : 0, evict, 0);
    m.pos = 0;
    CHECK_EQ(kvidx_snapshot_read(dst, t_mem_read, &m), KVIDX_OK);
    CHECK(same_state(src, dst, 5));
    CHECK_EQ(kvidx_last_event_id(src, 1, 0, &la), kvidx_last_event_id(dst, 1, 0, &lb));
    CHECK_EQ(la, lb);
    CHECK_EQ(kvidx_last_event_gen(src, 1, 0, &la), kvidx_last_event_gen(dst, 1, 0, &lb));
    CHECK_EQ(la, lb);
    CHECK_EQ(kvidx__check(dst), 0);
    m.pos = 0;
    CHECK_EQ(kvidx_snapshot_read(dst, t_mem_read, &m), KVIDX_EINVAL); /* not empty */
    if (ttl && k == 2) { /* expiries came along (the source expires last) */
      size_t g1 = 0, g2 = 0;
      kvidx_expire(src, 1500, &g1);
      kvidx_expire(dst, 1500, &g2);
      CHECK(g1 > 0 && g1 == g2);
      CHECK(same_state(src, dst, 6));
    }
    kvidx_destroy(dst);
    /* dump replayed as events into every kind */
    if (!ttl) {
      dst = mk(T_KINDS[k], 16, 0, 0, 0);
      CHECK_EQ(kvidx_dump(src, replay, dst), KVIDX_OK);
      CHECK(same_state(src, dst, 7));
      CHECK_EQ(kvidx__check(dst), 0);
      kvidx_destroy(dst);
    }
  }
  /* a failing writer callback: EIO */
  {
    t_mem f = {NULL, 0, 0, 0, 3};
    CHECK_EQ(kvidx_snapshot_write(src, t_mem_write, &f), KVIDX_EIO);
    free(f.buf);
  }
  /* corrupt, truncated, wrong version: a clear status, the target empty and valid */
  if (!ttl && src_kind == KVIDX_POSITIONAL) {
    size_t i, len = m.len < 48 + 48 * 70 ? m.len : 48 + 48 * 70;
    kvidx_stats st;
    unsigned char save;
    dst = mk(KVIDX_RADIX, 16, 0, 0, 0);
    for (i = 0; i < m.len; i += (i < len ? 1 : 97)) { /* every truncation point early on */
      t_mem t = m;
      t.len = i;
      t.pos = 0;
      rc = kvidx_snapshot_read(dst, t_mem_read, &t);
      CHECK_EQ(rc, KVIDX_ETRUNCATED);
      kvidx_get_stats(dst, &st);
      CHECK_EQ(st.blocks, 0);
    }
    for (i = 0; i < m.len; i += (i < len ? 1 : 53)) { /* one flipped bit anywhere */
      t_mem t = m;
      save = m.buf[i];
      m.buf[i] ^= (unsigned char)(1u << (i % 8));
      t.pos = 0;
      rc = kvidx_snapshot_read(dst, t_mem_read, &t);
      CHECK(rc == KVIDX_ECORRUPT || rc == KVIDX_EVERSION);
      if (rc == KVIDX_OK) fprintf(stderr, "flipped byte %zu accepted\n", i);
      kvidx_get_stats(dst, &st);
      CHECK_EQ(st.blocks, 0);
      CHECK_EQ(kvidx__check(dst), 0);
      m.buf[i] = save;
    }
    m.buf[8] = 5; /* a future version */
    m.pos = 0;
    CHECK_EQ(kvidx_snapshot_read(dst, t_mem_read, &m), KVIDX_EVERSION);
    m.buf[8] = 4;
    m.pos = 0;
    CHECK_EQ(kvidx_snapshot_read(dst, t_mem_read, &m), KVIDX_OK); /* and the intact one still loads */
    kvidx_destroy(dst);
  }
  /* kinds and modes without a dump */
  {
    kvidx *ref = mk(KVIDX_REFERENCE, 4, 0, 0, 0);
    CHECK_EQ(kvidx_dump(ref, replay, NULL), KVIDX_ENOTSUP);
    kvidx_destroy(ref);
  }
  free(m.buf);
  kvidx_destroy(src);
}

/* A snapshot taken at max_blocks where a worker has holes: the dump's
 * stand-in ancestors (stored, then removed again) must not count against
 * the target's max_blocks.  Before they were exempt, the read failed with
 * EFULL, and with LRS eviction it evicted real blocks to make room for
 * them (a warm restart that silently lost holdings). */
static void test_snapshot_at_capacity(int src_kind, int evict) {
  static const uint64_t LA[6] = {1, 2, 3, 4, 1, 2}, LB[6] = {2, 3, 4, 1, 2, 3};
  kvidx_block a[6], b[6];
  uint64_t hole[2];
  kvidx *src = mk(src_kind, 4, 0, 0, 0), *dst; /* it held 10 for a moment */
  t_mem m = {NULL, 0, 0, 0, -1};
  kvidx_score x[4], y[4];
  kvidx_stats st;
  int k;
  run(LA, 6, a);
  run(LB, 6, b);
  CHECK_EQ(kvidx_store(src, 2, 0, NULL, b, 4), KVIDX_OK); /* dumped first: it fills the target first */
  CHECK_EQ(kvidx_store(src, 1, 0, NULL, a, 6), KVIDX_OK);
  hole[0] = a[1].seq;
  hole[1] = a[2].seq;
  CHECK_EQ(kvidx_remove(src, 1, 0, hole, 2), KVIDX_OK); /* a hole of 2: blocks 0, 3, 4, 5; 8 = max_blocks */
  kvidx_get_stats(src, &st);
  CHECK_EQ(st.blocks, 8);
  CHECK_EQ(kvidx_snapshot_write(src, t_mem_write, &m), KVIDX_OK);
  CHECK_EQ(m.buf[8], 4); /* stand-in records are marked: version 4 */
  for (k = 0; k < 3; k++) {
    size_t i, nx, ny;
    dst = mk(T_KINDS[k], 4, 8, evict, 0);
    m.pos = 0;
    CHECK_EQ(kvidx_snapshot_read(dst, t_mem_read, &m), KVIDX_OK);
    kvidx_get_stats(dst, &st);
    CHECK_EQ(st.blocks, 8);
    CHECK_EQ(kvidx_worker_blocks(dst, 1, 0), 4);
    CHECK_EQ(kvidx_worker_blocks(dst, 2, 0), 4);
    nx = kvidx_find_matches(src, LA, 6, x, 4);
    ny = kvidx_find_matches(dst, LA, 6, y, 4);
    CHECK_EQ(nx, ny);
    for (i = 0; i < nx && i < ny; i++) CHECK(x[i].worker_id == y[i].worker_id && x[i].depth == y[i].depth);
    nx = kvidx_find_matches(src, LB, 6, x, 4);
    ny = kvidx_find_matches(dst, LB, 6, y, 4);
    CHECK_EQ(nx, ny);
    for (i = 0; i < nx && i < ny; i++) CHECK(x[i].worker_id == y[i].worker_id && x[i].depth == y[i].depth);
    CHECK(same_state(src, dst, 9));
    CHECK_EQ(kvidx__check(dst), 0);
    /* the capacity is the configured one again: one block more is refused (or evicts) */
    if (!evict) CHECK_EQ(kvidx_store(dst, 2, 0, &b[3].seq, &b[4], 1), KVIDX_EFULL);
    kvidx_destroy(dst);
  }
  free(m.buf);
  kvidx_destroy(src);
}

/* The stream as a build before version 4 wrote it: no stand-in flags,
 * version 2 (the source has no detached runs), checksums made again. */
static void snap_to_v2(t_mem *m) {
  size_t n, i, len;
  uint64_t seed, h;
  int b;
  for (b = 7, n = 0; b >= 0; b--) n = n << 8 | m->buf[16 + b];
  m->buf[8] = 2;
  seed = XXH3_64bits_withSeed(m->buf, 40, 0);
  for (b = 0; b < 8; b++) m->buf[40 + b] = (unsigned char)(seed >> (8 * b));
  for (i = 0; i < n; i += 64) {
    unsigned char *c = m->buf + 48 + i / 64 * (48 * 64 + 8);
    size_t k;
    len = (n - i < 64 ? n - i : 64) * 48;
    for (k = 0; k < len; k += 48) c[k + 3] = 0;
    seed = h = XXH3_64bits_withSeed(c, len, seed);
    for (b = 0; b < 8; b++) c[len + b] = (unsigned char)(h >> (8 * b));
  }
}

/* A snapshot into a smaller target that evicts (LRS or expiry): it loads
 * (before, a stand-in evicted early made its removal, or a parent evicted
 * early made its child, look like corruption: KVIDX_ECORRUPT; at
 * max_blocks 1 a block with a parent was refused: KVIDX_EFULL), stays
 * within max_blocks, and keeps a subset of the source's holdings at the
 * same positions (no worker scores deeper than in the source). */
static void test_snapshot_into_smaller(int src_kind, int old_format) {
  kvidx *src = mk(src_kind, 16, 0, 0, 0), *dst;
  t_mem m = {NULL, 0, 0, 0, -1};
  kvidx_stats st;
  int k, e, q4;
  fill(src, 91 + (uint64_t)src_kind, 0);
  kvidx_get_stats(src, &st);
  CHECK_EQ(kvidx_snapshot_write(src, t_mem_write, &m), KVIDX_OK);
  CHECK_EQ(m.buf[8], 4);
  if (old_format) { /* unmarked stand-ins: the read cannot tell them, the rest holds */
    kvidx *full = mk(KVIDX_POSITIONAL, 16, 0, 0, 0);
    snap_to_v2(&m);
    m.pos = 0;
    CHECK_EQ(kvidx_snapshot_read(full, t_mem_read, &m), KVIDX_OK); /* the checksums are right */
    CHECK(same_state(src, full, 10));
    kvidx_destroy(full);
  }
  for (k = 0; k < 3; k++)
    for (e = 0; e < 2; e++)
      for (q4 = 0; q4 <= 3; q4++) { /* q4 0: max_blocks 1, which keeps no block with its parent */
        size_t cap = q4 ? st.blocks * (size_t)q4 / 4 : 1, i, j, l;
        uint64_t rs = 5 + (uint64_t)q4;
        kvidx_stats ds;
        int sub = 1;
        dst = mk(T_KINDS[k], 16, cap, e ? KVIDX_EVICT_EXPIRY : KVIDX_EVICT_LRS, 0);
        m.pos = 0;
        CHECK_EQ(kvidx_snapshot_read(dst, t_mem_read, &m), KVIDX_OK);
        kvidx_get_stats(dst, &ds);
        CHECK(ds.blocks <= cap && ds.blocks > 0);
        CHECK_EQ(kvidx__check(dst), 0);
        for (i = 0; i < 300 && sub; i++) {
          kvidx_score x[16], y[16];
          uint64_t qq[8];
          size_t n = 1 + t_below(&rs, 8), nx, ny;
          for (j = 0; j < n; j++) qq[j] = 1 + t_below(&rs, 4);
          nx = kvidx_find_matches(src, qq, n, x, 16);
          ny = kvidx_find_matches(dst, qq, n, y, 16);
          for (j = 0; j < ny && j < 16; j++) {
            for (l = 0; l < nx && l < 16 && (x[l].worker_id != y[j].worker_id || x[l].dp_rank != y[j].dp_rank); l++) {}
            if (l == nx || l == 16 || y[j].depth > x[l].depth) sub = 0;
          }
        }
        CHECK(sub);
        if (!sub) fprintf(stderr, "into %s, cap %zu, evict %d: a worker scores deeper than in the source\n", t_kind_name(k), cap, e);
        kvidx_destroy(dst);
      }
  free(m.buf);
  kvidx_destroy(src);
}

int main(void) {
  int k;
  for (k = 0; k < 3; k++) {
    test_event_ids(T_KINDS[k]);
    test_tiers(T_KINDS[k]);
    test_evict_lrs(T_KINDS[k]);
    test_ttl(T_KINDS[k]);
  }
  printf("event ids, tiers, eviction, ttl: done\n");
  for (k = 0; k < 6; k++) {
    test_apply_differential(100 + (uint64_t)k, 0, 0, 1500);
    test_apply_differential(200 + (uint64_t)k, 0, 30, 1500);
    test_apply_differential(300 + (uint64_t)k, KVIDX_EVICT_LRS, 25, 1500);
    test_apply_differential(400 + (uint64_t)k, KVIDX_EVICT_EXPIRY, 25, 1500);
  }
  t_no_tiers = 1; /* eviction without tiers: seq entries of four words, holdings without device bits (and the
                     move of a run's rest, which tiers rule out) */
  for (k = 0; k < 6; k++) {
    test_apply_differential(500 + (uint64_t)k, KVIDX_EVICT_LRS, 25, 1500);
    test_apply_differential(600 + (uint64_t)k, KVIDX_EVICT_EXPIRY, 25, 1500);
  }
  t_no_tiers = 0;
  printf("apply differential: 36 runs (unbounded, bounded, LRS, expiry; LRS and expiry again without tiers)\n");
  test_snapshots(KVIDX_RADIX, 0);
  test_snapshots(KVIDX_POSITIONAL, 0);
  test_snapshots(KVIDX_POSITIONAL, 1);
  for (k = 0; k < 2; k++) {
    test_snapshot_at_capacity(T_KINDS[1 + k], 0);
    test_snapshot_at_capacity(T_KINDS[1 + k], KVIDX_EVICT_LRS);
    test_snapshot_into_smaller(T_KINDS[1 + k], 0);
    test_snapshot_into_smaller(T_KINDS[1 + k], 1);
  }
  printf("snapshots: round trips across kinds, truncation, corruption, stand-ins at max_blocks, into smaller evicting targets\n");
  printf("%d passed, %d failed\n", t_checks - t_fails, t_fails);
  return t_fails ? 1 : 0;
}
