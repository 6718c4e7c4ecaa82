/* fuzz_events: the production event API, differentially.  Every kind
 * (reference, radix, positional) gets the same kvidx_apply events (event ids
 * with gaps, duplicates, resent older ids and generation changes; storage tiers; Stored / Removed /
 * Cleared), kvidx_expire calls and queries; after every op the statuses, the
 * tiered and plain answers, per-worker block counts and last event ids must
 * agree, and kvidx__check must pass every 16 ops.
 *
 * Input: byte 0 config (bit 0-1 evict none/LRS/expiry, bits 2-4 max_blocks
 * class, bit 5 tiers flag), byte 1 jump; then ops of 4 bytes
 * [op, worker, a, b]. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include "fz_seed.h"

#define FE_NK 3
static const int FE_KINDS[FE_NK] = {KVIDX_REFERENCE, KVIDX_RADIX, KVIDX_POSITIONAL};

typedef struct {
  uint64_t seq;
  uint32_t plen;
  uint64_t path[12];
} fe_held;

static void fe_fail(const char *what, int op, int k) {
  fprintf(stderr, "fuzz_events: op %d: %s (kind %d differs from the reference)\n", op, what, FE_KINDS[k]);
  abort();
}

static void fe_compare(kvidx **ix, const uint64_t *q, size_t n, int op) {
  kvidx_tier_score a[12], b[12];
  kvidx_score pa[12], pb[12];
  size_t ta = kvidx_find_matches_tiered(ix[0], q, n, a, 12), pta = kvidx_find_matches(ix[0], q, n, pa, 12);
  int k;
  for (k = 1; k < FE_NK; k++) {
    size_t tb = kvidx_find_matches_tiered(ix[k], q, n, b, 12), ptb = kvidx_find_matches(ix[k], q, n, pb, 12);
    if (ta != tb || memcmp(a, b, sizeof(kvidx_tier_score) * (ta < 12 ? ta : 12))) fe_fail("tiered answers", op, k);
    if (pta != ptb || memcmp(pa, pb, sizeof(kvidx_score) * (pta < 12 ? pta : 12))) fe_fail("answers", op, k);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t len) {
  static const size_t caps[8] = {0, 4, 8, 16, 32, 64, 0, 0};
  kvidx *ix[FE_NK];
  kvidx_config c;
  fe_held held[8][24];
  uint32_t nheld[8] = {0};
  uint64_t ids[8] = {0}, gens[8] = {0}, now = 0;
  size_t i;
  int k, op = 0;
  if (len < 2) return 0;
  memset(&c, 0, sizeof c);
  c.seed = FZ_TABLE_SEED;
  c.evict = d[0] & 3;
  if (c.evict == 3) c.evict = 0;
  c.max_blocks = caps[(d[0] >> 2) & 7];
  if (c.evict && !c.max_blocks) c.max_blocks = 12;
  c.flags = (d[0] & 0x20) ? KVIDX_F_TIERS : 0;
  c.jump = 1u + d[1] % 8u;
  c.max_workers = 6;
  c.evict_target_pct = 50;
  for (k = 0; k < FE_NK; k++) {
    c.kind = FE_KINDS[k];
    if (kvidx_create(&ix[k], &c) != KVIDX_OK) abort();
  }
  for (i = 2; i + 4 <= len && op < 300; i += 4, op++) {
    uint8_t o = d[i], wi = d[i + 1] & 7, a = d[i + 2], bb = d[i + 3];
    kvidx_event ev;
    kvidx_block blk[8];
    uint64_t seqs[3], parent = 0;
    int st[FE_NK], j;
    memset(&ev, 0, sizeof ev);
    /* ids: next mostly; a gap, a duplicate, a resent older id or a restart
     * (a new generation) now and then */
    switch ((o >> 4) & 7) {
    case 0: ids[wi] += 3; break;
    case 1: break;
    case 2:
      if (o & 0x80) {
        gens[wi]++;
        ids[wi] /= 2;
      }
      break;
    default: ids[wi]++;
    }
    ev.event_id = ((o >> 4) & 7) == 2 && !(o & 0x80) ? ids[wi] / 2 : ids[wi];
    ev.generation = gens[wi];
    ev.worker_id = wi / 2;
    ev.dp_rank = wi % 2;
    ev.tier = (int)(bb % 3);
    if ((o & 3) <= 1) { /* Stored: root or a held parent, 1..8 blocks, contract or opaque seqs */
      uint32_t n = 1u + (a & 7), plen = 0;
      uint64_t path[12], pseq = 0;
      if (nheld[wi] && (a & 8)) {
        fe_held *h = &held[wi][(a >> 4) % nheld[wi]];
        parent = pseq = h->seq;
        ev.parent = &parent;
        plen = h->plen;
        memcpy(path, h->path, sizeof path);
      }
      for (j = 0; j < (int)n; j++) {
        blk[j].local = 1u + ((uint32_t)(bb >> (j % 4)) + (uint32_t)j * a) % 3u;
        blk[j].seq = (o & 8) ? 0x900u + ((bb + (uint32_t)j) & 15u)
                             : (j == 0 && !ev.parent ? blk[j].local : kvidx_seq_hash_next(j ? blk[j - 1].seq : pseq, blk[j].local));
      }
      ev.type = KVIDX_EV_STORED;
      ev.blocks = blk;
      ev.n = n;
      if (c.evict == KVIDX_EVICT_EXPIRY && (o & 4)) ev.expires_at = now + 1u + (bb & 31u);
      for (k = 0; k < FE_NK; k++) st[k] = kvidx_apply(ix[k], &ev);
      if (st[0] >= 0 && st[0] != KVIDX_DUPLICATE)
        for (j = 0; j < (int)n && nheld[wi] < 24; j++) {
          fe_held *h = &held[wi][nheld[wi]++];
          h->seq = blk[j].seq;
          if (plen < 12) path[plen++] = blk[j].local;
          h->plen = plen;
          memcpy(h->path, path, sizeof path);
        }
    } else if ((o & 3) == 2) { /* Removed: held seqs (one tier or all) or unknown */
      uint32_t n = 1u + (a & 1), at;
      for (at = 0; at < n; at++) seqs[at] = nheld[wi] ? held[wi][(a >> 1 >> at) % nheld[wi]].seq : 0xDEAD;
      if (bb & 0x80) ev.tier = KVIDX_TIER_ALL;
      ev.type = KVIDX_EV_REMOVED;
      ev.seqs = seqs;
      ev.n = n;
      for (k = 0; k < FE_NK; k++) st[k] = kvidx_apply(ix[k], &ev);
    } else if (o & 4) { /* Cleared */
      ev.type = KVIDX_EV_CLEARED;
      for (k = 0; k < FE_NK; k++) st[k] = kvidx_apply(ix[k], &ev);
      if (st[0] >= 0 && st[0] != KVIDX_DUPLICATE) nheld[wi] = 0;
    } else { /* time passes */
      size_t g[FE_NK];
      now += a & 15u;
      for (k = 0; k < FE_NK; k++) st[k] = kvidx_expire(ix[k], now, &g[k]);
      for (k = 1; k < FE_NK; k++)
        if (g[k] != g[0]) fe_fail("expired counts", op, k);
    }
    for (k = 1; k < FE_NK; k++)
      if (st[k] != st[0]) fe_fail("status", op, k);
    { /* answers: along a held path (mutated sometimes) and a random one */
      uint64_t q[12];
      size_t qn = 0;
      if (nheld[wi]) {
        fe_held *h = &held[wi][bb % nheld[wi]];
        qn = h->plen;
        memcpy(q, h->path, sizeof q);
        if (qn > 1 && (a & 0x40)) q[a % qn] = 1u + (bb % 3u);
        fe_compare(ix, q, qn, op);
      }
      qn = 1u + (a % 6u);
      for (j = 0; j < (int)qn; j++) q[j] = 1u + ((uint32_t)(a >> j) + bb) % 3u;
      fe_compare(ix, q, qn, op);
    }
    for (j = 0; j < 8; j++) {
      uint64_t la = 0, lb = 0;
      int ra = kvidx_last_event_id(ix[0], (uint64_t)j / 2, (uint32_t)j % 2, &la);
      size_t wa = kvidx_worker_blocks(ix[0], (uint64_t)j / 2, (uint32_t)j % 2);
      for (k = 1; k < FE_NK; k++) {
        int rb = kvidx_last_event_id(ix[k], (uint64_t)j / 2, (uint32_t)j % 2, &lb);
        if (ra != rb || la != lb) fe_fail("last event id", op, k);
        ra = kvidx_last_event_gen(ix[0], (uint64_t)j / 2, (uint32_t)j % 2, &la);
        rb = kvidx_last_event_gen(ix[k], (uint64_t)j / 2, (uint32_t)j % 2, &lb);
        if (ra != rb || la != lb) fe_fail("last event generation", op, k);
        ra = kvidx_last_event_id(ix[0], (uint64_t)j / 2, (uint32_t)j % 2, &la);
        if (kvidx_worker_blocks(ix[k], (uint64_t)j / 2, (uint32_t)j % 2) != wa) fe_fail("worker blocks", op, k);
      }
    }
    if (op % 16 == 15)
      for (k = 0; k < FE_NK; k++)
        if (kvidx__check(ix[k])) fe_fail("invariant check", op, k);
  }
  for (k = 0; k < FE_NK; k++) {
    if (kvidx__check(ix[k])) fe_fail("invariant check at the end", op, k);
    kvidx_destroy(ix[k]);
  }
  return 0;
}
