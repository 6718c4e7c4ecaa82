/* fuzz_ops.c - differential fuzzing of the radix and positional kinds against
 * the reference kind (the naive model that defines the semantics).
 *
 * Input = config bytes, then a bytecode of ops:
 *   byte 0  kinds under test: &3 -> 0,3 both, 1 radix, 2 positional;
 *           bit 2: run kvidx__check after every op (else every 32 ops)
 *   byte 1  max_workers (= worker slots): 1..8, 9..40, 63..66, 127..130,
 *           16, 0 (default 1024), 1023..1026, 1024+k*64, 4093..4097
 *   byte 2  jump: 0 = default, else 1 + (b-1) % 64
 *   byte 3  max_blocks: bit 7 set -> 1 + (b & 63), else 0 (unlimited);
 *           bits 7+6: eviction, KVIDX_EVICT_LRS, or KVIDX_EVICT_EXPIRY when
 *           byte 0 bit 3 is set (then stores carry an expiry byte and op 13
 *           is kvidx_expire); byte 0 bits 4-5: evict_target_pct
 *   ops     see fz_gen_op in fuzz_common.h (store / remove / clear /
 *           remove_worker / find_matches / bulk store / bulk remove / check)
 *
 * After every op: same status from every kind, same worker_blocks for the
 * op's worker(s) and one more small worker in rotation (all of them at every
 * check), same stats.blocks / stats.workers, and the same find_matches
 * answer for a query derived from the op; every N ops (and at the end) the
 * invariant checker on every index plus a full query sweep. */
#define KVIDX_IMPLEMENTATION
#include "fuzz_common.h"

#define NKIND 3
static kvidx *ix[NKIND]; /* ix[0] is the reference */
static const char *nm[NKIND];
static int nix;
static fz_shadow sh;
static fz_op op;

static uint32_t pick_max_workers(uint8_t b) {
  switch (b >> 5) {
  case 0: return 1 + (b & 7);   /* 1..8: the worker cap bites */
  case 1: return 9 + (b & 31);  /* 9..40 */
  case 2: return 63 + (b & 3);  /* around one bitset word */
  case 3: return 127 + (b & 3); /* around two */
  case 4: return 16;
  case 5: return 0;             /* default: 1024 */
  case 6: return (b & 16) ? 1024 + (b & 15) * 64 : 1023 + (b & 3);
  default: return 4093 + (b & 7) % 5; /* 4093..4097: 4097 is over the default cap */
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

static void cmp_query_all(const uint64_t *q, size_t qn, size_t cap) {
  for (int k = 1; k < nix; k++) fz_cmp_query(ix[0], nm[0], ix[k], nm[k], q, qn, cap);
}

static void check_all(unsigned bulk_hi) {
  for (int k = 0; k < nix; k++) fz_check(ix[k], nm[k]);
  for (int k = 1; k < nix; k++) fz_cmp_full(&sh, ix[0], nm[0], ix[k], nm[k], bulk_hi);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_rd r = {data, size, 0};
  uint8_t c0 = fz_u8(&r), c1 = fz_u8(&r), c2 = fz_u8(&r), c3 = fz_u8(&r);
  kvidx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.max_workers = pick_max_workers(c1);
  cfg.jump = c2 ? 1 + (uint32_t)(c2 - 1) % 64 : 0;
  cfg.max_blocks = (c3 & 0x80) ? 1 + (size_t)(c3 & 63) : 0;
  /* eviction (needs max_blocks): c3 bit 6 with bit 7; c0 bit 3: LRS / EXPIRY;
   * c0 bits 4-5: evict_target_pct 0 (= 80), 50, 1, 100 */
  cfg.evict = (c3 & 0xC0) == 0xC0 ? ((c0 & 8) ? KVIDX_EVICT_EXPIRY : KVIDX_EVICT_LRS) : KVIDX_EVICT_NONE;
  static const uint32_t pcts[4] = {0, 50, 1, 100};
  cfg.evict_target_pct = cfg.evict ? pcts[(c0 >> 4) & 3] : 0;
  fz_expiry_mode = cfg.evict == KVIDX_EVICT_EXPIRY;
  int kinds[NKIND] = {KVIDX_REFERENCE, KVIDX_RADIX, KVIDX_POSITIONAL};
  nix = 0;
  int sel = c0 & 3;
  int every = (c0 & 4) ? 1 : 32;
  int st[NKIND];
  for (int k = 0; k < NKIND; k++) {
    if ((kinds[k] == KVIDX_RADIX && sel == 2) || (kinds[k] == KVIDX_POSITIONAL && sel == 1)) continue;
    cfg.kind = kinds[k];
    nm[nix] = fz_kind_name(kinds[k]);
    ix[nix] = NULL;
    st[nix] = kvidx_create(&ix[nix], &cfg);
    nix++;
  }
  FZ_LOG("config: kinds=%d max_workers=%u jump=%u max_blocks=%zu evict=%d target_pct=%u\n", sel,
         cfg.max_workers, cfg.jump, cfg.max_blocks, cfg.evict, cfg.evict_target_pct);
  cmp_status("create", st);
  if (st[0] != KVIDX_OK) {
    for (int k = 0; k < nix; k++)
      if (ix[k]) kvidx_destroy(ix[k]);
    return 0;
  }
  fz_shadow_reset(&sh);
  unsigned bulk_budget = 2600, bulk_hi = 0;
  static uint64_t q[FZ_QMAX];
  char what[64];
  int nops = 0;
  uint32_t roll = 0;
  while (fz_more(&r) && nops < 4000) {
    fz_gen_op(&r, &sh, &op, &bulk_budget);
    fz_log_op(&op, nops);
    snprintf(what, sizeof what, "op %d", nops);
    switch (op.type) {
    case FZ_STORE:
      for (int k = 0; k < nix; k++) st[k] = fz_store(ix[k], &op);
      cmp_status(what, st);
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
      break;
    case FZ_CLEAR:
      for (int k = 0; k < nix; k++) st[k] = kvidx_clear(ix[k], op.wid, op.dp);
      cmp_status(what, st);
      break;
    case FZ_RMW:
      for (int k = 0; k < nix; k++) st[k] = kvidx_remove_worker(ix[k], op.wid);
      cmp_status(what, st);
      break;
    case FZ_FIND:
      cmp_query_all(op.q, op.qn, op.cap);
      st[0] = KVIDX_OK;
      break;
    case FZ_BULK:
      for (unsigned i = 0; i < op.bulk_k; i++) {
        unsigned id = op.bulk_lo + i;
        static kvidx_block b[FZ_STAIR];
        size_t nb = fz_bulk_blocks(id, op.bulk_distinct, b);
        for (int k = 0; k < nix; k++) st[k] = kvidx_store(ix[k], FZ_BULK_BASE + id, 0, NULL, b, nb);
        snprintf(what, sizeof what, "op %d (bulk store %u)", nops, id);
        cmp_status(what, st);
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
        snprintf(what, sizeof what, "op %d (bulk remove %u)", nops, id);
        cmp_status(what, st);
      }
      st[0] = KVIDX_OK;
      break;
    case FZ_CHECK:
      check_all(bulk_hi);
      st[0] = KVIDX_OK;
      break;
    }
    FZ_LOG("  -> %d (%s)\n", st[0], kvidx_strerror(st[0]));
    fz_shadow_apply(&sh, &op, st[0]);
    /* after every op: worker_blocks, stats, one query derived from the op */
    for (int k = 1; k < nix; k++) {
      /* the op's worker(s) and one more in rotation; all at every check */
      for (int w = 0; w < FZ_NW; w++)
        if (FZ_WID[w] == op.wid || w == (int)(nops % FZ_NW))
          fz_cmp_worker_blocks(ix[0], nm[0], ix[k], nm[k], FZ_WID[w], FZ_WDP[w]);
      fz_cmp_stats(ix[0], nm[0], ix[k], nm[k]);
    }
    /* the caps are semantic: no kind may ever exceed them */
    for (int k = 0; k < nix; k++) {
      kvidx_stats ks;
      memset(&ks, 0, sizeof ks);
      kvidx_get_stats(ix[k], &ks);
      if (cfg.max_blocks && ks.blocks > cfg.max_blocks)
        FZ_FAIL("%s: %s holds %zu blocks, over max_blocks %zu", what, nm[k], ks.blocks, cfg.max_blocks);
      if (ks.workers > (cfg.max_workers ? cfg.max_workers : 1024u))
        FZ_FAIL("%s: %s has %zu workers, over max_workers %u", what, nm[k], ks.workers, cfg.max_workers);
    }
    size_t qn = 0;
    if (op.type == FZ_STORE) {
      /* the stored run's chain, as the reference sees it now */
      int h = -1;
      for (size_t i = op.n; i-- > 0 && h < 0;) h = fz_find_held(&sh, op.w, op.b[i].seq);
      if (h >= 0) qn = fz_path(&sh, sh.held[op.w][h].node, q, FZ_QMAX);
    } else {
      int w = (int)(roll % FZ_NW);
      if (sh.n_held[w]) qn = fz_path(&sh, sh.held[w][(roll / FZ_NW) % sh.n_held[w]].node, q, FZ_QMAX);
    }
    roll = roll * 1103515245u + 12345u;
    if (qn) cmp_query_all(q, qn, FZ_NW + FZ_BULK_MAX + 8);
    nops++;
    if (nops % every == 0) check_all(bulk_hi);
  }
  check_all(bulk_hi);
  for (int k = 0; k < nix; k++) kvidx_destroy(ix[k]);
  return 0;
}
