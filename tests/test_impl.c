/* The one implementation TU of the core tests. */
#define KVIDX_IMPLEMENTATION
#include "testutil.h"

int t_fails, t_checks;

void *t_alloc(void *ctx, size_t n) {
  t_alloc_ctx *c = (t_alloc_ctx *)ctx;
  if (c->fail_at >= 0 && c->calls++ >= c->fail_at) return NULL;
  if (c->fail_at < 0) c->calls++;
  c->live++;
  c->bytes += n;
  return malloc(n);
}
void t_free(void *ctx, void *p, size_t n) {
  t_alloc_ctx *c = (t_alloc_ctx *)ctx;
  c->live--;
  c->bytes -= n;
  free(p);
}

/* Grow-only arrays (four segments of each size): every element has its own
 * address inside one segment, a span is refused exactly when it crosses a
 * segment's end, the capacity allocated ahead of need is less than the last
 * segment and, past the first few, under a quarter of the whole (plain
 * doubling left up to half), and the bytes come and go through the index's
 * accounting.  The number of failed checks. */
int t_grow_layout(void) {
  kvidx_config cfg;
  kvidx *ix;
  kvidx__grow g;
  kvidx_stats st0, st;
  uint64_t need, i, start = 0, bytes = 0;
  unsigned k;
  int fails = 0;
  memset(&cfg, 0, sizeof cfg);
  if (kvidx_create(&ix, &cfg) != KVIDX_OK) return 1;
  kvidx_get_stats(ix, &st0);
  memset(&g, 0, sizeof g);
  g.es = 8;
  g.shift0 = 3;
  for (need = 1; need <= 5000; need += 1 + need / 8) {
    uint64_t last;
    if (kvidx__grow_reserve(ix, &g, need) != KVIDX_OK) {
      fails++;
      break;
    }
    last = kvidx__seg_elems(&g, g.nseg - 1);
    fails += g.cap < need || g.cap - need >= last;
    fails += g.cap >= 16 * 8 && (g.cap - need) * 4 >= g.cap;
  }
  for (i = 0; i < g.cap; i++) {
    uint64_t *p = (uint64_t *)kvidx__grow_get(&g, i, 1, 0);
    if (!p) fails++;
    else *p = i;
  }
  for (i = 0; i < g.cap; i++) {
    uint64_t *p = (uint64_t *)kvidx__grow_get(&g, i, 1, 1);
    fails += !p || *p != i;
  }
  for (k = 0; k < g.nseg; k++) {
    uint64_t n = kvidx__seg_elems(&g, k);
    fails += kvidx__grow_get(&g, start, n, 0) == NULL;
    fails += kvidx__grow_get(&g, start + 1, n, 0) != NULL; /* ends one past the segment */
    start += n;
    bytes += n * g.es;
  }
  fails += start != g.cap || kvidx__grow_get(&g, g.cap, 1, 0) != NULL;
  kvidx_get_stats(ix, &st);
  fails += st.bytes != st0.bytes + bytes;
  kvidx__grow_drop(ix, &g);
  kvidx_get_stats(ix, &st);
  fails += st.bytes != st0.bytes;
  kvidx_destroy(ix);
  return fails;
}

/* Caller-buffer mode makes the shared maps (child map, holdings, multi,
 * worker slots) at their largest in kvidx_init_buffer and kvidx_buffer_size
 * counts one table each: a churning workload filled to capacity, again and
 * again, must never grow or retire one (a growth would need its old table
 * beside it, which the size bound no longer counts).  Also: the index
 * reaches max_blocks holdings.  The number of failed checks. */
int t_buffer_fixed_maps(void) {
  static const struct {
    size_t blocks;
    uint32_t workers, flags;
  } cfgs[] = {{64, 1, 0}, {300, 3, KVIDX_F_TIERS}, {2048, 8, 0}, {1000, 64, 0}};
  int fails = 0;
  size_t ci;
  for (ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
    kvidx_config cfg;
    kvidx *ix;
    kvidx__map *maps[4];
    kvidx__mtab *tabs[4];
    kvidx_block b[80];
    uint64_t rng = 7 + ci, seqs[80], seqno = 1, held_max = 0;
    size_t need, round, m, full = 0;
    void *mem;
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = KVIDX_POSITIONAL;
    cfg.max_blocks = cfgs[ci].blocks;
    cfg.max_workers = cfgs[ci].workers;
    cfg.flags = cfgs[ci].flags;
    need = kvidx_buffer_size(&cfg);
    if (!(mem = malloc(need)) || kvidx_init_buffer(&ix, &cfg, mem, need) != KVIDX_OK) {
      free(mem);
      fails++;
      continue;
    }
    maps[0] = &ix->children, maps[1] = &ix->holds, maps[2] = &ix->multi, maps[3] = &ix->slot_map;
    for (m = 0; m < 4; m++) {
      tabs[m] = kvidx__ld(&maps[m]->tab);
      fails += !tabs[m];
    }
    for (round = 0; round < 4000; round++) {
      uint64_t w = t_below(&rng, cfg.max_workers), parent = 0;
      uint32_t op = t_below(&rng, 10), n = 1 + t_below(&rng, 79), i;
      kvidx_stats st;
      int rc;
      if (op < 7) { /* a prompt: a shared prefix of the few locals, then its own */
        uint32_t shared = t_below(&rng, n + 1);
        for (i = 0; i < n; i++) {
          b[i].local = i < shared ? i + 1 : 1000 + t_rand(&rng) % 50;
          b[i].seq = seqs[i] = seqno++;
        }
        rc = kvidx_store(ix, w, 0, NULL, b, n);
        if (rc == KVIDX_EFULL) full++;
        else fails += rc != KVIDX_OK;
        if (rc == KVIDX_OK && n > 1 && t_below(&rng, 2)) { /* a hole at i, a block j < i under a second seq */
          uint32_t j;
          i = 1 + t_below(&rng, n - 1);
          j = t_below(&rng, i);
          fails += kvidx_remove(ix, w, 0, &seqs[i], 1) != KVIDX_OK;
          parent = j ? seqs[j - 1] : 0;
          b[j].seq = seqno++;
          rc = kvidx_store(ix, w, 0, j ? &parent : NULL, b + j, 1);
          fails += rc != KVIDX_OK && rc != KVIDX_EFULL;
        }
      } else if (op < 9) { /* remove 80 recent seqs, some this worker's, some not */
        for (i = 0; i < 80 && i < seqno; i++) seqs[i] = seqno - 1 - t_below(&rng, 400 < seqno ? 400 : (uint32_t)seqno);
        rc = kvidx_remove(ix, w, 0, seqs, 80);
        fails += rc != KVIDX_OK && rc != KVIDX_ENOENT;
      } else {
        fails += kvidx_clear(ix, w, 0) != KVIDX_OK;
      }
      kvidx_get_stats(ix, &st);
      if (st.blocks > held_max) held_max = st.blocks;
      fails += st.blocks > cfg.max_blocks;
    }
    for (m = 0; m < 4; m++)
      fails += kvidx__ld(&maps[m]->tab) != tabs[m] || kvidx__ld(&maps[m]->old) != NULL || maps[m]->retired != NULL ||
               maps[m]->next != NULL || maps[m]->n * 4 > (tabs[m]->mask + 1) * 3;
    fails += full == 0 || held_max + 80 < cfg.max_blocks; /* it filled up, to within one prompt */
    fails += kvidx__check(ix) != 0;
    kvidx_destroy(ix);
    free(mem);
  }
  return fails;
}

/* A worker's seq table follows its holdings down as well as up: a worker
 * that held 20,000 blocks and let go of all but 100 ends with a table of
 * at most 512 places (2^k >= 8/3 of its entries), nothing left draining,
 * and the same answers and removals as the reference on the way.  Before
 * shrinking, the table kept its 32,768 places.  The number of failed
 * checks. */
int t_seq_shrink(void) {
  enum { N = 20000, KEEP = 100, STEP = 50 };
  kvidx_config cfg;
  kvidx *ix, *ref;
  kvidx__map *m;
  kvidx_block b[STEP];
  kvidx_score s1[4], s2[4];
  uint64_t seqs[STEP], parent, q[N], peak_slots;
  uint32_t i, j;
  int fails = 0, tiers;
  for (tiers = 0; tiers < 2; tiers++) {
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = KVIDX_POSITIONAL;
    cfg.flags = tiers ? KVIDX_F_TIERS : 0;
    if (kvidx_create(&ix, &cfg) != KVIDX_OK) return fails + 1;
    cfg.kind = KVIDX_REFERENCE;
    if (kvidx_create(&ref, &cfg) != KVIDX_OK) {
      kvidx_destroy(ix);
      return fails + 1;
    }
    for (i = 0; i < N; i += STEP) {
      for (j = 0; j < STEP; j++) {
        b[j].local = q[i + j] = 1 + (i + j) % 7; /* a repeating path: locals collide, chains do not */
        b[j].seq = 1000 + i + j;
      }
      parent = 1000 + i - 1;
      fails += kvidx_store(ix, 5, 0, i ? &parent : NULL, b, STEP) != KVIDX_OK;
      fails += kvidx_store(ref, 5, 0, i ? &parent : NULL, b, STEP) != KVIDX_OK;
    }
    m = &ix->slots[kvidx__slot_find(ix, 5, 0)].seqs;
    peak_slots = kvidx__ld(&m->tab)->mask + 1;
    for (i = N; i > KEEP; i -= STEP) { /* from the end: no hole in what stays */
      for (j = 0; j < STEP; j++) seqs[j] = 1000 + i - STEP + j;
      fails += kvidx_remove(ix, 5, 0, seqs, STEP) != kvidx_remove(ref, 5, 0, seqs, STEP);
      if (i % 250 == 0) { /* stores and removals while a shrunk table drains */
        kvidx_block side = {99, 900000};
        uint64_t keep_end = 1000 + KEEP - 1, q2[KEEP + 1];
        memcpy(q2, q, KEEP * sizeof q[0]);
        q2[KEEP] = 99;
        side.seq += i;
        fails += kvidx_store(ix, 5, 0, &keep_end, &side, 1) != KVIDX_OK;
        fails += kvidx_store(ref, 5, 0, &keep_end, &side, 1) != KVIDX_OK;
        fails += kvidx_find_matches(ix, q2, KEEP + 1, s1, 4) != 1 || s1[0].depth != KEEP + 1;
        if (i % 500 == 0) {
          fails += kvidx_remove(ix, 5, 0, &side.seq, 1) != KVIDX_OK;
          fails += kvidx_remove(ref, 5, 0, &side.seq, 1) != KVIDX_OK;
        }
      }
      if (i % 1000 == 0) {
        fails += kvidx_find_matches(ix, q, N, s1, 4) != kvidx_find_matches(ref, q, N, s2, 4) ||
                 s1[0].depth != s2[0].depth;
        fails += kvidx__check(ix) != 0;
      }
    }
    for (j = 0; j < N; j += 250) { /* the side blocks left (odd multiples of 250; the rest: ENOENT) */
      seqs[0] = 900000 + j;
      fails += kvidx_remove(ix, 5, 0, seqs, 1) != kvidx_remove(ref, 5, 0, seqs, 1);
    }
    /* a drain goes on in every later call of the worker's, even one that
     * removes nothing (a few hundred with KVIDX_TEST_DRAIN_STEP=1) */
    for (j = 0; j < 1000 && kvidx__ld(&m->old); j++) {
      seqs[0] = 7;
      fails += kvidx_remove(ix, 5, 0, seqs, 1) != KVIDX_ENOENT;
    }
    fails += peak_slots < 32768 || kvidx__ld(&m->tab)->mask + 1 > 512 || kvidx__ld(&m->old) != NULL || m->n != KEEP;
    fails += kvidx_find_matches(ix, q, N, s1, 4) != 1 || s1[0].depth != KEEP;
    fails += kvidx__check(ix) != 0;
    kvidx_destroy(ix);
    kvidx_destroy(ref);
  }
  return fails;
}
