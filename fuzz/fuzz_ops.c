/* fuzz_ops.c - differential fuzzing of the radix and positional kinds against
 * the reference kind (the model in kvidx.h that defines the semantics) and
 * against fuzz/model.c (a second, independent naive model written from the
 * SEMANTICS section only; kept in step with every op when the config has no
 * eviction, compared in the full checks).
 *
 * Input = config bytes, then a bytecode of ops:
 *   byte 0  kinds under test besides the reference: &3 -> 0,1 radix,
 *           2 positional, 3 both (one implementation since 0.2);
 *           full check (kvidx__check + sweep) every K ops, K from bits 6-7:
 *           64, 16, 256, only at the end; with bit 2 set: 8, 4, 2, 1
 *   byte 1  max_workers (= worker slots), mostly small: 1..8, 9..40,
 *           63..66, 127..130, 16, 17..48, 33..64, 65..80; 1 in 16 wide
 *           (0xF0..0xFF): 1023..1026, 0 (default 1024), 1088..1280,
 *           4093..4097, 1025.  Bit 2 of byte 0 means K = 16 there.
 *   byte 2  jump: 0 = default, else 1 + (b-1) % 64
 *   byte 3  max_blocks: bit 7 set -> 1 + (b & 63), else 0 (unlimited);
 *           bits 7+6: eviction, KVIDX_EVICT_LRS, or KVIDX_EVICT_EXPIRY when
 *           byte 0 bit 3 is set (then stores carry an expiry byte and op 13
 *           is kvidx_expire); byte 0 bits 4-5: evict_target_pct
 *   ops     see fz_gen_op in fuzz_common.h (store / remove / clear /
 *           remove_worker / find_matches / bulk store / bulk remove / check)
 *
 * After every op (incremental), between every kind and the reference: the
 * same status (and the model's status, blocks and workers totals: O(1)),
 * same worker_blocks for the op's worker(s) and one more small worker in
 * rotation, same stats.blocks / stats.workers, caps never exceeded, and the
 * same find_matches answer for one query derived from the op (a store: the
 * stored run's chain; else a held chain in rotation; a find op: its own
 * query and cap).  In wide configs without eviction there is no reference
 * kind (its O(slots) worker scan) and model.c takes its place after every
 * op.  Every K ops and at the end: kvidx__check on every index plus the
 * full sweep (fz_sweep: up to ~32 held chains, every small worker's
 * worker_blocks, bulk samples, alphabet and staircase queries) across all
 * kinds and the model.  Each input has a work budget (WORK_BUDGET: blocks
 * stored, queries, their positions and scores, full checks included). */
#define KVIDX_IMPLEMENTATION
#include "fz_alloc.h" /* kvidx's allocator: big blocks recycled (ASan page faults) */
#include "fuzz_common.h"
#include "fz_seed.h"
#include "model.h"

#define NKIND 3
#ifndef WORK_BUDGET
/* see `work`.  3,000 (12,000 until session 4): corpus inputs replayed
 * (gcc ASan build, FUZZ_TIME=1) took 1.6 ms each at 4,000 and 1.4 at 2,000:
 * per-input fixed costs (the final full check, index creation) are most of
 * it; deep states still come from bulk ops (one op, many workers) and the
 * corpus. */
#define WORK_BUDGET 3000
#endif
#define PER_OP_Q 128      /* longest rotation query after an op */
static kvidx *ix[NKIND]; /* ix[0] is the reference (radix in wide configs, see below) */
static const char *nm[NKIND];
static int nix;
static fz_shadow sh;
static fz_op op;
static fm_model *fm; /* NULL when the config evicts (outside the model) */

static uint32_t pick_max_workers(uint8_t b) {
  switch (b >> 5) {
  case 0: return 1 + (b & 7);   /* 1..8: the worker cap bites */
  case 1: return 9 + (b & 31);  /* 9..40 */
  case 2: return 63 + (b & 3);  /* around one bitset word */
  case 3: return 127 + (b & 3); /* around two */
  case 4: return 16;
  case 5: return 17 + (b & 31); /* 17..48 */
  case 6: return 33 + (b & 31); /* 33..64 */
  default:
    if (b < 0xF0) return 65 + (b & 15); /* 65..80 */
    switch (b & 15) {                   /* 0xF0..0xFF: the wide cases, 1 in 16 */
    case 0: case 1: case 2: case 3: return 1023 + (b & 3);
    case 4: case 5: return 0; /* default: 1024 */
    case 6: case 7: case 8: case 9: return 1024 + (uint32_t)((b & 15) - 5) * 64;
    case 15: return 1025;
    default: return 4093 + (uint32_t)((b & 15) - 10); /* 4093..4097: 4097 is over the cap */
    }
  }
}

static void cmp_status(const char *what, const int *st) {
  for (int k = 1; k < nix; k++)
    if (st[k] != st[0]) {
      fprintf(stderr, "status mismatch in %s:", what);
      for (int j = 0; j < nix; j++) fprintf(stderr, " %s=%d(%s)", nm[j], st[j], kvidx_strerror(st[j]));
      fputc('\n', stderr);
      FZ_FAIL("%s: %s returned %d, reference %d", what, nm[k], st[k], st[0]);
    }
}

/* Work done in this input, for the budget (WORK_BUDGET): blocks stored,
 * queries, their positions and scores compared (a score costs about two
 * positions), in the per-op checks and the full ones alike. */
static size_t work;
#define WORK_QUERY 32 /* a query's own cost, in positions (~20 us under ASan) */

static int scores_differ(const kvidx_score *a, const kvidx_score *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i].worker_id != b[i].worker_id || a[i].dp_rank != b[i].dp_rank || a[i].depth != b[i].depth) return 1;
  return 0;
}

static void query_mismatch(const char *bn, const uint64_t *q, size_t qn, size_t cap, const kvidx_score *sa,
                           size_t ma, const kvidx_score *sb, size_t mb) {
  fprintf(stderr, "find_matches mismatch, cap=%zu: %s returned %zu, %s returned %zu\n", cap, nm[0], ma, bn, mb);
  fz_print_u64s("  query", q, qn);
  fz_print_scores(nm[0], sa, ma < cap ? ma : cap);
  fz_print_scores(bn, sb, mb < cap ? mb : cap);
  FZ_FAIL("find_matches: %s != %s", bn, nm[0]);
}

/* One query: ix[0]'s answer (asked once, checked sorted and in range) against
 * every other kind's, and the model's when asked (the full checks).  Answer
 * buffers: see fz_query_slot. */
static void cmp_query_all(const uint64_t *q, size_t qn, size_t cap, int model) {
  kvidx_score *sa, *sb;
  size_t na, nb;
  size_t ma = fz_query_slot(ix[0], 0, q, qn, cap, &sa, &na);
  fz_sane_scores(nm[0], sa, na, qn);
  for (int k = 1; k < nix; k++) {
    size_t mb = fz_query_slot(ix[k], 1, q, qn, cap, &sb, &nb);
    if (mb != ma || scores_differ(sa, sb, na)) query_mismatch(nm[k], q, qn, cap, sa, ma, sb, mb);
  }
  if (fm && model) {
    kvidx_score *sm = fz_sbuf[2] + (FZ_CAPALL - cap);
    size_t mm = fm_find_matches(fm, q, qn, sm, cap);
    if (mm != ma || scores_differ(sa, sm, na)) query_mismatch("model.c", q, qn, cap, sa, ma, sm, mm);
  }
  work += WORK_QUERY + qn + 2 * na;
}

static void cmp_wb_all(uint64_t wid, uint32_t dp, int model) {
  for (int k = 1; k < nix; k++) fz_cmp_worker_blocks(ix[0], nm[0], ix[k], nm[k], wid, dp);
  if (fm && model) {
    size_t x = kvidx_worker_blocks(ix[0], wid, dp), y = fm_worker_blocks(fm, wid, dp);
    if (x != y) FZ_FAIL("worker_blocks(%llu,%u): %s=%zu model.c=%zu", (unsigned long long)wid, dp, nm[0], x, y);
  }
}

/* stats.blocks / stats.workers: the same in every kind and the model (its
 * running totals: O(1), so after every op too), and within the caps. */
static void cmp_stats_all(const kvidx_config *cfg, const char *what) {
  kvidx_stats ks[NKIND];
  for (int k = 0; k < nix; k++) {
    memset(&ks[k], 0, sizeof ks[k]);
    int rc = kvidx_get_stats(ix[k], &ks[k]);
    if (rc != KVIDX_OK) FZ_FAIL("%s: get_stats(%s) = %d", what, nm[k], rc);
    if (ks[k].blocks != ks[0].blocks || ks[k].workers != ks[0].workers)
      FZ_FAIL("%s: stats: %s blocks=%zu workers=%zu, %s blocks=%zu workers=%zu", what, nm[0], ks[0].blocks,
              ks[0].workers, nm[k], ks[k].blocks, ks[k].workers);
    /* the caps are semantic: no kind may ever exceed them */
    if (cfg->max_blocks && ks[k].blocks > cfg->max_blocks)
      FZ_FAIL("%s: %s holds %zu blocks, over max_blocks %zu", what, nm[k], ks[k].blocks, cfg->max_blocks);
    if (ks[k].workers > (cfg->max_workers ? cfg->max_workers : 1024u))
      FZ_FAIL("%s: %s has %zu workers, over max_workers %u", what, nm[k], ks[k].workers, cfg->max_workers);
  }
  if (fm && (ks[0].blocks != fm_blocks(fm) || ks[0].workers != fm_workers(fm)))
    FZ_FAIL("%s: stats: %s blocks=%zu workers=%zu, model.c blocks=%zu workers=%zu", what, nm[0], ks[0].blocks,
            ks[0].workers, fm_blocks(fm), fm_workers(fm));
}

static void sweep_query(void *ctx, const uint64_t *q, size_t n, size_t cap) {
  (void)ctx;
  cmp_query_all(q, n, cap, 1);
}
static void sweep_wb(void *ctx, uint64_t wid, uint32_t dp) {
  (void)ctx;
  cmp_wb_all(wid, dp, 1);
}

/* The full check: kvidx__check on every index, the model's own totals, and
 * the sweep across every kind and the model. */
static void check_all(unsigned bulk_hi, const kvidx_config *cfg) {
  uint32_t slots = cfg->max_workers ? cfg->max_workers : 1024;
  work += (size_t)nix * (256 + slots / 4); /* kvidx__check walks every slot and holding */
  for (int k = 0; k < nix; k++) fz_check(ix[k], nm[k]);
  if (fm && fm_check(fm)) FZ_FAIL("model.c: running totals do not add up");
  fz_sweep(&sh, bulk_hi, sweep_query, sweep_wb, NULL);
  cmp_stats_all(cfg, "full check");
}

/* the model's status must equal the reference's */
static void cmp_model_status(const char *what, int ref, int mst) {
  if (fm && mst != ref)
    FZ_FAIL("%s: model.c returned %d (%s), %s %d (%s)", what, mst, kvidx_strerror(mst), nm[0], ref, kvidx_strerror(ref));
}

/* One bulk worker's statuses (every kind, the model's mst unless !fm): the
 * op's name is formatted only for a failure (a snprintf per bulk worker was
 * 1-2% of the run time). */
static void cmp_bulk_status(int nops, const char *verb, unsigned id, const int *st, int mst) {
  int same = !fm || mst == st[0];
  for (int k = 1; k < nix && same; k++) same = st[k] == st[0];
  if (same) return;
  char what[64];
  snprintf(what, sizeof what, "op %d (bulk %s %u)", nops, verb, id);
  cmp_status(what, st);
  cmp_model_status(what, st[0], mst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_alloc_next_input();
  fz_rd r = {data, size, 0};
  uint8_t c0 = fz_u8(&r), c1 = fz_u8(&r), c2 = fz_u8(&r), c3 = fz_u8(&r);
  kvidx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.seed = FZ_TABLE_SEED;
  cfg.max_workers = pick_max_workers(c1);
  cfg.jump = c2 ? 1 + (uint32_t)(c2 - 1) % 64 : 0;
  /* c2 bit 7: seq tables made with room for 1..128 blocks (answers unchanged) */
  cfg.blocks_per_worker = (c2 & 0x80) ? (size_t)1 << (c2 & 7) : 0;
  cfg.max_blocks = (c3 & 0x80) ? 1 + (size_t)(c3 & 63) : 0;
  /* eviction (needs max_blocks): c3 bit 6 with bit 7; c0 bit 3: LRS / EXPIRY;
   * c0 bits 4-5: evict_target_pct 0 (= 80), 50, 1, 100 */
  cfg.evict = (c3 & 0xC0) == 0xC0 ? ((c0 & 8) ? KVIDX_EVICT_EXPIRY : KVIDX_EVICT_LRS) : KVIDX_EVICT_NONE;
  static const uint32_t pcts[4] = {0, 50, 1, 100};
  cfg.evict_target_pct = cfg.evict ? pcts[(c0 >> 4) & 3] : 0;
  fz_expiry_mode = cfg.evict == KVIDX_EVICT_EXPIRY;
  int kinds[NKIND] = {KVIDX_REFERENCE, KVIDX_RADIX, KVIDX_POSITIONAL};
  nix = 0;
  /* kinds under test besides the reference: radix (c0 & 3 = 0, 1),
   * positional (2), both (3).  Since 0.2 the two are one implementation
   * (kvidx.h, KINDS: one storage, one walk; cfg.jump unused), so running
   * both in every input doubled the index work and could not differ; both
   * still run in 1 input of 4, so a future split is compared too. */
  int sel = c0 & 3;
  if (sel == 0) sel = 1;
  static const int every_k[4] = {64, 16, 256, 1 << 30}, every_k_short[4] = {8, 4, 2, 1};
  uint32_t slots = cfg.max_workers ? cfg.max_workers : 1024;
  int every = (c0 & 4) ? (slots >= 1000 ? 16 : every_k_short[c0 >> 6]) : every_k[c0 >> 6];
  int st[NKIND];
  /* Wide configs without eviction: the reference kind costs O(slots) per
   * call (its worker lookup is a scan), ~100x the rest, so there model.c is
   * the oracle, after every op too (it stands in for the reference); ix[0]
   * is then the first index kind. */
  int wide_no_ref = slots >= 1000 && slots <= KVIDX_WORKERS_MAX && cfg.evict == KVIDX_EVICT_NONE;
  for (int k = 0; k < NKIND; k++) {
    if (kinds[k] == KVIDX_REFERENCE && wide_no_ref) continue;
    if ((kinds[k] == KVIDX_RADIX && sel == 2) || (kinds[k] == KVIDX_POSITIONAL && sel == 1)) continue;
    cfg.kind = kinds[k];
    nm[nix] = fz_kind_name(kinds[k]);
    ix[nix] = NULL;
    st[nix] = kvidx_create(&ix[nix], &cfg);
    nix++;
  }
  FZ_LOG("config: kinds=%d max_workers=%u jump=%u max_blocks=%zu evict=%d target_pct=%u blocks_per_worker=%zu\n",
         sel, cfg.max_workers, cfg.jump, cfg.max_blocks, cfg.evict, cfg.evict_target_pct, cfg.blocks_per_worker);
  cmp_status("create", st);
  if (st[0] != KVIDX_OK) {
    for (int k = 0; k < nix; k++)
      if (ix[k]) kvidx_destroy(ix[k]);
    return 0;
  }
  fz_shadow_reset(&sh);
  fm = cfg.evict == KVIDX_EVICT_NONE ? fm_create(cfg.max_blocks, cfg.max_workers) : NULL;
  /* the model after every op only where it is the oracle (no reference
   * kind); elsewhere in the full checks (its status and totals always) */
  int model_per_op = wide_no_ref;
  /* bulk work in proportion to the worker slots: past the cap every bulk
   * store is one more EFULL, so a few dozen show it */
  unsigned bulk_budget = slots >= 1000 ? 1100 : 2 * slots + 64, bulk_hi = 0;
  /* wide configs cost O(slots) per reference call: few ops there, so they
   * stay a small share of the run time */
  int max_ops = slots >= 1000 ? 48 : 4000;
  static uint64_t q[FZ_QMAX];
  char what[64];
  int nops = 0;
  uint32_t roll = 0;
  work = 0;
  int checked = 0; /* a full check ran after the last op */
  while (fz_more(&r) && nops < max_ops && work <= WORK_BUDGET) {
    /* a bulk worker costs ~8 positions, and a scan of every slot in the
     * reference kind: bulk ops get at most what is left of the budget */
    unsigned bulk_unit = 8 + (wide_no_ref ? 0 : slots / 16);
    unsigned bulk_left = work < WORK_BUDGET ? (unsigned)((WORK_BUDGET - work) / bulk_unit) + 1 : 1;
    unsigned bulk_now = bulk_budget < bulk_left ? bulk_budget : bulk_left;
    unsigned bulk_was = bulk_now;
    fz_gen_op(&r, &sh, &op, &bulk_now);
    bulk_budget -= bulk_was - bulk_now;
    fz_log_op(&op, nops);
    snprintf(what, sizeof what, "op %d", nops);
    switch (op.type) {
    case FZ_STORE:
      for (int k = 0; k < nix; k++) st[k] = fz_store(ix[k], &op);
      cmp_status(what, st);
      if (fm) cmp_model_status(what, st[0], fm_store(fm, op.wid, op.dp, op.has_parent ? &op.parent : NULL, op.b, op.n));
      break;
    case FZ_EXPIRE: {
      size_t rm[NKIND];
      for (int k = 0; k < nix; k++) st[k] = kvidx_expire(ix[k], op.expires, &rm[k]);
      cmp_status(what, st);
      for (int k = 1; k < nix; k++)
        if (rm[k] != rm[0]) FZ_FAIL("%s: kvidx_expire removed %zu in %s, %zu in reference", what, rm[k], nm[k], rm[0]);
      break;
    }
    case FZ_REMOVE:
      for (int k = 0; k < nix; k++) st[k] = kvidx_remove(ix[k], op.wid, op.dp, op.n ? op.seqs : NULL, op.n);
      cmp_status(what, st);
      if (fm) cmp_model_status(what, st[0], fm_remove(fm, op.wid, op.dp, op.seqs, op.n));
      break;
    case FZ_CLEAR:
      for (int k = 0; k < nix; k++) st[k] = kvidx_clear(ix[k], op.wid, op.dp);
      cmp_status(what, st);
      if (fm) cmp_model_status(what, st[0], fm_clear(fm, op.wid, op.dp));
      break;
    case FZ_RMW:
      for (int k = 0; k < nix; k++) st[k] = kvidx_remove_worker(ix[k], op.wid);
      cmp_status(what, st);
      if (fm) cmp_model_status(what, st[0], fm_remove_worker(fm, op.wid));
      break;
    case FZ_FIND:
      cmp_query_all(op.q, op.qn, op.cap, model_per_op);
      st[0] = KVIDX_OK;
      break;
    case FZ_BULK:
      for (unsigned i = 0; i < op.bulk_k; i++) {
        unsigned id = op.bulk_lo + i;
        static kvidx_block b[FZ_STAIR];
        size_t nb = fz_bulk_blocks(id, op.bulk_distinct, b);
        for (int k = 0; k < nix; k++) st[k] = kvidx_store(ix[k], FZ_BULK_BASE + id, 0, NULL, b, nb);
        cmp_bulk_status(nops, "store", id, st, fm ? fm_store(fm, FZ_BULK_BASE + id, 0, NULL, b, nb) : 0);
        if (id + 1 > bulk_hi) bulk_hi = id + 1;
      }
      st[0] = KVIDX_OK;
      break;
    case FZ_BULK_RM:
      for (unsigned i = 0; i < op.bulk_k; i++) {
        unsigned id = op.bulk_lo + i;
        for (int k = 0; k < nix; k++)
          st[k] = (i & 1) ? kvidx_clear(ix[k], FZ_BULK_BASE + id, 0)
                          : kvidx_remove_worker(ix[k], FZ_BULK_BASE + id);
        cmp_bulk_status(nops, "remove", id, st,
                        !fm ? 0 : (i & 1) ? fm_clear(fm, FZ_BULK_BASE + id, 0) : fm_remove_worker(fm, FZ_BULK_BASE + id));
      }
      st[0] = KVIDX_OK;
      break;
    case FZ_CHECK: /* a no-op here: full checks run every K ops (config byte 0) */
      st[0] = KVIDX_OK;
      break;
    }
    FZ_LOG("  -> %d (%s)\n", st[0], kvidx_strerror(st[0]));
    fz_shadow_apply(&sh, &op, st[0]);
    /* after every op, between the kinds (the model only in the full
     * checks, but its status and totals above and here: they cost nothing):
     * worker_blocks of the op's worker(s) and one more in rotation, stats
     * and caps, one query derived from the op */
    for (int w = 0; w < FZ_NW; w++)
      if (FZ_WID[w] == op.wid || w == (int)(nops % FZ_NW)) cmp_wb_all(FZ_WID[w], FZ_WDP[w], model_per_op);
    cmp_stats_all(&cfg, what);
    size_t qn = 0;
    if (op.type == FZ_STORE) {
      /* the stored run's chain, as the reference sees it now */
      int h = -1;
      for (size_t i = op.n; i-- > 0 && h < 0;) h = fz_find_held(&sh, op.w, op.b[i].seq);
      if (h >= 0) qn = fz_path(&sh, sh.held[op.w][h].node, q, FZ_QMAX);
    } else { /* a held chain in rotation, its first PER_OP_Q blocks */
      int w = (int)(roll % FZ_NW);
      if (sh.n_held[w]) qn = fz_path(&sh, sh.held[w][(roll / FZ_NW) % sh.n_held[w]].node, q, PER_OP_Q);
    }
    roll = roll * 1103515245u + 12345u;
    if (qn) cmp_query_all(q, qn, FZ_CAPALL, model_per_op);
    /* work budget: blocks stored plus query positions and scores compared
     * (cmp_query_all counts those, the full checks' too), so that no input
     * costs more than a few milliseconds (the fuzzer's speed is the mean) */
    work += (op.type == FZ_STORE ? op.n : 0) + (op.type == FZ_BULK || op.type == FZ_BULK_RM ? bulk_unit * op.bulk_k : 0);
    checked = 0;
    nops++;
    if (nops % every == 0) {
      check_all(bulk_hi, &cfg);
      checked = 1;
    }
  }
  if (!checked) check_all(bulk_hi, &cfg); /* nothing changed since the last one */
  for (int k = 0; k < nix; k++) kvidx_destroy(ix[k]);
  fm_destroy(fm);
  fm = NULL;
  return 0;
}
