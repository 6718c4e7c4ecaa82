/* fuzz_capacity.c - failures leave the index unchanged.
 *
 * The subject index runs either in caller-buffer mode (kvidx_buffer_size +
 * kvidx_init_buffer, tiny capacities, any alignment, an exactly sized buffer)
 * or in heap mode with an allocation hook that fails at fuzzer-chosen points.
 * The oracle is a reference-kind index (heap; the same max_workers,
 * max_blocks and eviction policy, no entry cap) fed only the ops the subject
 * accepted: after every op that failed with KVIDX_EFULL or
 * KVIDX_ENOMEM the two must answer every query alike, have the same
 * worker_blocks and stats, and the subject must pass kvidx__check.  Ops the
 * subject accepted must give the oracle's status.  Also checked: ENOMEM only
 * when the hook failed during that op, never in buffer mode; EFULL never in
 * heap mode without caps (unless the worker cap is reached); find_matches,
 * worker_blocks and get_stats allocate nothing; buffer mode allocates
 * nothing, ever; the hook's free gets the size given to alloc; a failed
 * create leaks nothing; destroy frees everything.
 *
 * With byte 0's bit 6 (heap mode) the subject defers its frees
 * (KVIDX_F_DEFER_FREE, every block of 64 bytes and up here: the writer calls'
 * frees then wait for kvidx_reclaim, called every 16 ops): stats.bytes must
 * still equal the hook's live bytes, each reclaim must free exactly the
 * deferred bytes, and destroy must free what still waits.
 *
 * Input: byte 0 mode (bit 0: 0 buffer, 1 heap), kind (((b >> 1) & 3) % 3), bit 4
 * LRS eviction, bit 5 evict_target_pct 50, bit 6 deferred frees;
 * byte 1 max_workers; byte 2 max_blocks; byte 3 max_entries; byte 4 jump;
 * byte 5 buffer misalignment / failing allocation during create; then ops as
 * in fuzz_ops (fuzz_common.h), where an op code of 15 is instead "arm the
 * hook": the next byte says which of the coming allocations fail. */
#define KVIDX_IMPLEMENTATION
#define KVIDX_DEFER_FREE_MIN 64 /* with bit 6: nearly every free is deferred */
#include "fuzz_common.h"
#include "fz_seed.h"

/* ---- allocation hook --------------------------------------------------------- */
#define MAXLIVE 65536
typedef struct {
  void *p;
  size_t size;
} live_t;

typedef struct {
  uint64_t count;     /* allocations asked for so far             */
  uint64_t fail_from; /* fail allocations count in [from, to)     */
  uint64_t fail_to;
  int fail_mod;       /* or: fail every fail_mod-th (0: off)      */
  int failed;         /* an allocation failed since last reset    */
  int forbid;         /* any allocation now is a bug              */
  const char *forbid_what;
  size_t live_bytes;
  size_t n_live;
  live_t live[MAXLIVE];
} hook_t;

static hook_t hk;

static void *hook_alloc(void *ctx, size_t size) {
  hook_t *h = (hook_t *)ctx;
  if (h->forbid) FZ_FAIL("allocation of %zu bytes inside %s", size, h->forbid_what);
  uint64_t c = h->count++;
  int fail = (c >= h->fail_from && c < h->fail_to) || (h->fail_mod && c % (uint64_t)h->fail_mod == 0);
  if (fail || h->n_live >= MAXLIVE) {
    h->failed = 1;
    return NULL;
  }
  void *p = malloc(size ? size : 1);
  if (!p) return NULL;
  h->live[h->n_live].p = p;
  h->live[h->n_live].size = size;
  h->n_live++;
  h->live_bytes += size;
  return p;
}

static void hook_free(void *ctx, void *p, size_t size) {
  hook_t *h = (hook_t *)ctx;
  if (!p) return;
  for (size_t i = h->n_live; i-- > 0;) {
    if (h->live[i].p == p) {
      if (h->live[i].size != size)
        FZ_FAIL("free hook got size %zu for a block allocated with size %zu", size, h->live[i].size);
      h->live_bytes -= size;
      h->live[i] = h->live[--h->n_live];
      free(p);
      return;
    }
  }
  FZ_FAIL("free hook got a pointer it never allocated (or freed twice): %p", p);
}

static void *hook_alloc_never(void *ctx, size_t size) {
  (void)ctx;
  FZ_FAIL("buffer mode allocated %zu bytes", size);
  return NULL;
}
static void hook_free_never(void *ctx, void *p, size_t size) {
  (void)ctx;
  (void)size;
  if (p) FZ_FAIL("buffer mode freed %p", p);
}

static void disarm(void) {
  hk.fail_from = hk.fail_to = 0;
  hk.fail_mod = 0;
}

/* ---- harness ------------------------------------------------------------------ */
static fz_shadow sh;
static fz_op op;

static void no_alloc_begin(int heap, const char *what) {
  if (heap) {
    hk.forbid = 1;
    hk.forbid_what = what;
  }
}
static void no_alloc_end(void) { hk.forbid = 0; }

static void compare_all(kvidx *sub, const char *sn, kvidx *orc, int heap, unsigned bulk_hi) {
  no_alloc_begin(heap, "queries / worker_blocks / get_stats");
  fz_cmp_full(&sh, orc, "oracle", sub, sn, bulk_hi);
  no_alloc_end();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_rd r = {data, size, 0};
  uint8_t c0 = fz_u8(&r), c1 = fz_u8(&r), c2 = fz_u8(&r), c3 = fz_u8(&r), c4 = fz_u8(&r),
          c5 = fz_u8(&r);
  int heap = c0 & 1;
  int kind = ((c0 >> 1) & 3) % 3;
  kvidx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.seed = FZ_TABLE_SEED;
  cfg.kind = kind;
  cfg.max_workers = (c1 & 0x80) ? ((c1 & 0x40) ? 1024u + (c1 & 1) : 64u + (c1 & 1)) : 1u + (c1 & 15);
  cfg.max_blocks = (c2 & 0x80) && heap ? 0 : 1 + (size_t)(c2 & 63);
  cfg.max_entries = (c3 & 0x80) ? 1 + (size_t)(c3 & 63) : 0;
  cfg.jump = 1 + (uint32_t)(c4 % 64);
  /* c0 bit 4: LRS eviction (with a block cap), c0 bit 5: evict_target_pct 50 */
  cfg.evict = (c0 & 0x10) && cfg.max_blocks ? KVIDX_EVICT_LRS : KVIDX_EVICT_NONE;
  cfg.evict_target_pct = cfg.evict && (c0 & 0x20) ? 50 : 0;
  const int defer = heap && (c0 & 0x40);
  cfg.flags = defer ? KVIDX_F_DEFER_FREE : 0;
  const char *sn = heap ? "heap" : "buffer";

  memset(&hk, 0, offsetof(hook_t, live));
  kvidx *sub = NULL;
  unsigned char *base = NULL;
  if (!heap) {
    size_t need = kvidx_buffer_size(&cfg);
    if (need == 0) {
      heap = 1; /* this kind has no buffer mode: test heap mode instead */
      sn = "heap";
    } else {
      size_t mis = c5 & 15;
      base = (unsigned char *)malloc(need + mis);
      if (!base) return 0;
      memset(base, 0xCD, need + mis);
      kvidx_config bc = cfg;
      bc.alloc = hook_alloc_never;
      bc.free = hook_free_never;
      bc.alloc_ctx = NULL;
      int st = kvidx_init_buffer(&sub, &bc, base + mis, need);
      if (st == KVIDX_EINVAL) st = kvidx_init_buffer(&sub, &cfg, base + mis, need);
      if (st != KVIDX_OK)
        FZ_FAIL("kvidx_init_buffer(kind=%s, max_workers=%u, max_blocks=%zu, max_entries=%zu) = %d with "
                "kvidx_buffer_size's %zu bytes",
                fz_kind_name(kind), cfg.max_workers, cfg.max_blocks, cfg.max_entries, st, need);
    }
  }
  if (heap) {
    cfg.alloc = hook_alloc;
    cfg.free = hook_free;
    cfg.alloc_ctx = &hk;
    /* fail allocation number c5 % 8 of create (if create makes that many) */
    if (c5 & 0x80) {
      hk.fail_from = c5 & 7;
      hk.fail_to = hk.fail_from + 1;
      int st = kvidx_create(&sub, &cfg);
      if (st == KVIDX_OK) {
        kvidx_destroy(sub);
      } else if (st != KVIDX_ENOMEM || !hk.failed) {
        FZ_FAIL("kvidx_create with a failing allocation returned %d (hook failed: %d)", st, hk.failed);
      }
      if (hk.n_live) FZ_FAIL("create/destroy left %zu allocations (%zu bytes)", hk.n_live, hk.live_bytes);
      sub = NULL;
      disarm();
    }
    hk.failed = 0;
    int st = kvidx_create(&sub, &cfg);
    if (st != KVIDX_OK)
      FZ_FAIL("kvidx_create(kind=%s, max_workers=%u, max_blocks=%zu, max_entries=%zu) = %d",
              fz_kind_name(kind), cfg.max_workers, cfg.max_blocks, cfg.max_entries, st);
  }
  FZ_LOG("config: %s kind=%s max_workers=%u max_blocks=%zu max_entries=%zu jump=%u evict=%d pct=%u\n", sn,
         fz_kind_name(kind), cfg.max_workers, cfg.max_blocks, cfg.max_entries, cfg.jump, cfg.evict,
         cfg.evict_target_pct);

  kvidx_config oc;
  memset(&oc, 0, sizeof oc);
  oc.seed = FZ_TABLE_SEED;
  oc.kind = KVIDX_REFERENCE;
  oc.max_workers = cfg.max_workers;
  oc.max_blocks = cfg.max_blocks; /* the semantic caps; not max_entries */
  oc.evict = cfg.evict;
  oc.evict_target_pct = cfg.evict_target_pct;
  kvidx *orc = NULL;
  if (kvidx_create(&orc, &oc) != KVIDX_OK) FZ_FAIL("oracle create failed");

  fz_shadow_reset(&sh);
  unsigned bulk_budget = 300, bulk_hi = 0;
  int nops = 0;
  while (fz_more(&r) && nops < 2000) {
    size_t save = r.i;
    uint8_t code = fz_u8(&r);
    if (code % 16 == 15) { /* arm the hook */
      uint8_t a = fz_u8(&r);
      disarm();
      if (a < 128) { /* the a % 16-th next allocation fails, a / 16 + 1 in a row */
        hk.fail_from = hk.count + (a & 15);
        hk.fail_to = hk.fail_from + 1 + (a >> 4);
      } else {
        hk.fail_mod = 1 + (a & 7);
      }
      FZ_LOG("op %d: arm(%u)\n", nops, a);
      nops++;
      continue;
    }
    r.i = save;
    fz_gen_op(&r, &sh, &op, &bulk_budget);
    fz_log_op(&op, nops);
    int so = KVIDX_OK, ss = KVIDX_OK;
    hk.failed = 0;
    switch (op.type) {
    case FZ_STORE: {
      int held_before = kvidx_worker_blocks(orc, op.wid, op.dp) != 0;
      kvidx_stats os, before, after;
      kvidx_get_stats(orc, &os);
      kvidx_get_stats(sub, &before);
      ss = fz_store(sub, &op);
      kvidx_get_stats(sub, &after);
      /* a refused store changed nothing, not even a run's length (with
       * eviction a store that runs out of memory after its prune keeps the
       * prune) */
      if ((ss == KVIDX_EFULL || ss == KVIDX_ENOMEM) && !cfg.evict &&
          (after.entries != before.entries || after.blocks != before.blocks || after.workers != before.workers))
        FZ_FAIL("store returned %d but entries %zu -> %zu, blocks %zu -> %zu, workers %zu -> %zu", ss,
                before.entries, after.entries, before.blocks, after.blocks, before.workers, after.workers);
      if (ss == KVIDX_EFULL && heap && cfg.max_blocks == 0 && cfg.max_entries == 0 &&
          (held_before || os.workers < cfg.max_workers))
        FZ_FAIL("store returned EFULL in heap mode without a block or entry cap (workers %zu of %u)",
                os.workers, cfg.max_workers);
      if (ss != KVIDX_EFULL && ss != KVIDX_ENOMEM) so = fz_store(orc, &op);
      break;
    }
    case FZ_REMOVE: {
      const uint64_t *s = op.n ? op.seqs : NULL;
      ss = kvidx_remove(sub, op.wid, op.dp, s, op.n);
      if (ss != KVIDX_EFULL && ss != KVIDX_ENOMEM) so = kvidx_remove(orc, op.wid, op.dp, s, op.n);
      break;
    }
    case FZ_CLEAR:
      ss = kvidx_clear(sub, op.wid, op.dp);
      if (ss != KVIDX_EFULL && ss != KVIDX_ENOMEM) so = kvidx_clear(orc, op.wid, op.dp);
      break;
    case FZ_RMW:
      ss = kvidx_remove_worker(sub, op.wid);
      if (ss != KVIDX_EFULL && ss != KVIDX_ENOMEM) so = kvidx_remove_worker(orc, op.wid);
      break;
    case FZ_FIND:
      no_alloc_begin(heap, "find_matches");
      fz_cmp_query(orc, "oracle", sub, sn, op.q, op.qn, op.cap);
      no_alloc_end();
      break;
    case FZ_BULK:
      for (unsigned i = 0; i < op.bulk_k; i++) {
        unsigned id = op.bulk_lo + i;
        static kvidx_block b[FZ_STAIR];
        size_t nb = fz_bulk_blocks(id, op.bulk_distinct, b);
        hk.failed = 0;
        ss = kvidx_store(sub, FZ_BULK_BASE + id, 0, NULL, b, nb);
        if (ss == KVIDX_ENOMEM && !hk.failed) FZ_FAIL("bulk store %u: ENOMEM but no allocation failed", id);
        if (ss != KVIDX_EFULL && ss != KVIDX_ENOMEM) {
          so = kvidx_store(orc, FZ_BULK_BASE + id, 0, NULL, b, nb);
          if (so != ss) FZ_FAIL("bulk store %u: %s returned %d, oracle %d", id, sn, ss, so);
        }
        if (id + 1 > bulk_hi) bulk_hi = id + 1;
      }
      ss = so = KVIDX_OK;
      break;
    case FZ_BULK_RM:
      for (unsigned i = 0; i < op.bulk_k; i++) {
        unsigned id = op.bulk_lo + i;
        hk.failed = 0;
        ss = kvidx_remove_worker(sub, FZ_BULK_BASE + id);
        if (ss == KVIDX_ENOMEM && !hk.failed) FZ_FAIL("bulk remove %u: ENOMEM but no allocation failed", id);
        if (ss != KVIDX_EFULL && ss != KVIDX_ENOMEM) {
          so = kvidx_remove_worker(orc, FZ_BULK_BASE + id);
          if (so != ss) FZ_FAIL("bulk remove %u: %s returned %d, oracle %d", id, sn, ss, so);
        }
      }
      ss = so = KVIDX_OK;
      break;
    case FZ_CHECK:
      fz_check(sub, sn);
      compare_all(sub, sn, orc, heap, bulk_hi);
      break;
    }
    FZ_LOG("  -> %s %d (%s)%s\n", sn, ss, kvidx_strerror(ss), hk.failed ? " [an allocation failed]" : "");
    if (ss == KVIDX_ENOMEM && (!heap || !hk.failed))
      FZ_FAIL("op %d returned ENOMEM but no allocation failed (%s mode)", nops, sn);
    if (ss == KVIDX_EFULL || ss == KVIDX_ENOMEM) {
      /* nothing changed: the subject still equals the oracle */
      fz_check(sub, sn);
      compare_all(sub, sn, orc, heap, bulk_hi);
    } else {
      if (ss != so) FZ_FAIL("op %d: %s returned %d (%s), oracle %d (%s)", nops, sn, ss, kvidx_strerror(ss), so, kvidx_strerror(so));
      fz_shadow_apply(&sh, &op, so);
      /* cheap per-op comparison */
      no_alloc_begin(heap, "worker_blocks / get_stats");
      for (int w = 0; w < FZ_NW; w++) fz_cmp_worker_blocks(orc, "oracle", sub, sn, FZ_WID[w], FZ_WDP[w]);
      fz_cmp_stats(orc, "oracle", sub, sn);
      kvidx_stats ks;
      memset(&ks, 0, sizeof ks);
      kvidx_get_stats(sub, &ks);
      no_alloc_end();
      if (cfg.max_blocks && ks.blocks > cfg.max_blocks)
        FZ_FAIL("op %d: %s holds %zu blocks, over max_blocks %zu", nops, sn, ks.blocks, cfg.max_blocks);
    }
    nops++;
    if (nops % 8 == 0) {
      fz_check(sub, sn);
      compare_all(sub, sn, orc, heap, bulk_hi);
    }
    if (defer && nops % 16 == 7) {
      kvidx_stats st;
      size_t freed = 1, live = hk.live_bytes;
      memset(&st, 0, sizeof st);
      kvidx_get_stats(sub, &st);
      if (kvidx_reclaim(sub, &freed) != KVIDX_OK) FZ_FAIL("kvidx_reclaim failed");
      if (freed != st.deferred_bytes || hk.live_bytes != live - freed)
        FZ_FAIL("kvidx_reclaim freed %zu bytes (hook: %zu) of %zu deferred", freed, live - hk.live_bytes,
                st.deferred_bytes);
      kvidx_get_stats(sub, &st);
      if (st.deferred_bytes || st.bytes != hk.live_bytes)
        FZ_FAIL("after kvidx_reclaim: %zu bytes deferred, stats.bytes %zu, hook %zu", st.deferred_bytes, st.bytes,
                hk.live_bytes);
    }
  }
  disarm();
  fz_check(sub, sn);
  compare_all(sub, sn, orc, heap, bulk_hi);
  if (heap) {
    kvidx_stats st;
    memset(&st, 0, sizeof st);
    kvidx_get_stats(sub, &st);
    if (st.bytes != hk.live_bytes)
      FZ_FAIL("stats.bytes = %zu but the hook has %zu bytes live", st.bytes, hk.live_bytes);
    if (st.peak_bytes < st.bytes) FZ_FAIL("stats.peak_bytes %zu < bytes %zu", st.peak_bytes, st.bytes);
  }
  kvidx_destroy(sub);
  if (heap && hk.n_live) FZ_FAIL("destroy left %zu allocations (%zu bytes)", hk.n_live, hk.live_bytes);
  kvidx_destroy(orc);
  free(base);
  return 0;
}
