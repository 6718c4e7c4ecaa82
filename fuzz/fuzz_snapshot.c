/* fuzz_snapshot.c - kvidx_snapshot_read on arbitrary bytes, and snapshot
 * round trips between kinds.
 *
 * Input byte 0: bits 0-1 target kind (% 3; round-trip mode: bit 0 the
 * source kind, radix or positional), bit 2: round-trip mode, bits 3-4
 * how the read callback delivers: all it is asked for, 1 byte, 7 bytes or
 * 1..40 bytes per call (short reads are allowed; 0 ends the stream).
 *   parse mode: the rest is fed to kvidx_snapshot_read as the stream.  Any
 *     status is fine, but: no crash or sanitizer report; the index passes
 *     kvidx__check; on error it is empty (stats blocks / workers 0) and
 *     usable (a store and a query work); on success its snapshot, written
 *     again and read into a fresh index of each kind, gives the same stats.
 *   round-trip mode: the rest is a fuzz_ops bytecode (fuzz_common.h, at most
 *     RT_MAX_OPS ops) run on a reference index and the source index (radix or
 *     positional: one implementation since 0.2, so one source per input),
 *     the same status from both after every op (bulk stores too); then the
 *     source is written (kvidx_snapshot_write), the stream is read into a
 *     fresh index of one kind (rotating with the input length) which must
 *     answer like the reference (the fz_sweep queries, worker_blocks,
 *     stats) and pass kvidx__check (in 1 input of 2 the target's max_blocks
 *     is what the source holds, with LRS eviction or none; in 1 input of 4
 *     a second target half that size with LRS eviction must load, end
 *     within its max_blocks and pass kvidx__check); kvidx_dump must succeed
 *     too (1 input of 4).  The stream
 *     cut short must fail, and with one bit flipped must fail (every byte is
 *     under a checksum since format version 2); each leaves the target
 *     empty, valid and usable. */
#define KVIDX_IMPLEMENTATION
#include "fz_alloc.h" /* kvidx's allocator: big blocks recycled (ASan page faults) */
#include "fuzz_common.h"
#include "fz_seed.h"

typedef struct {
  const uint8_t *p;
  size_t n, i;
  int chunk; /* 0 full reads, 1 one byte, 2 seven bytes, 3 random sizes */
  uint32_t rng;
} rd_ctx;

static int rd_chunk; /* from input byte 0, bits 3-4 */

/* Short reads (read(2) style) are allowed since 77050f4 (BUGS.md note 2):
 * only a 0 return ends the stream. */
static size_t rd_fn(void *ctx, void *buf, size_t len) {
  rd_ctx *c = (rd_ctx *)ctx;
  size_t left = c->n - c->i, k = len < left ? len : left;
  size_t lim = k;
  switch (c->chunk) {
  case 1: lim = 1; break;
  case 2: lim = 7; break;
  case 3:
    c->rng = c->rng * 1103515245u + 12345u;
    lim = 1 + (c->rng >> 16) % 40;
    break;
  default: break;
  }
  if (k > lim) k = lim;
  memcpy(buf, c->p + c->i, k);
  c->i += k;
  return k;
}

typedef struct {
  uint8_t *p;
  size_t n, cap;
} wr_ctx;

static int wr_fn(void *ctx, const void *buf, size_t len) {
  wr_ctx *c = (wr_ctx *)ctx;
  if (c->n + len > c->cap) {
    size_t nc = c->cap ? c->cap * 2 : 4096;
    while (nc < c->n + len) nc *= 2;
    uint8_t *np = (uint8_t *)realloc(c->p, nc);
    if (!np) abort();
    c->p = np;
    c->cap = nc;
  }
  memcpy(c->p + c->n, buf, len);
  c->n += len;
  return 0;
}

static int count_fn(void *ctx, const kvidx_event *ev) {
  (void)ev;
  ++*(size_t *)ctx;
  return 0;
}

static kvidx *fresh_full(int kind, uint32_t max_workers, size_t max_blocks, int evict) {
  kvidx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.seed = FZ_TABLE_SEED;
  cfg.kind = kind;
  cfg.max_workers = max_workers;
  cfg.max_blocks = max_blocks;
  cfg.evict = evict;
  kvidx *ix = NULL;
  if (kvidx_create(&ix, &cfg) != KVIDX_OK) FZ_FAIL("create(kind=%d) failed", kind);
  return ix;
}

static kvidx *fresh(int kind, uint32_t max_workers) { return fresh_full(kind, max_workers, 0, 0); }

/* On error the target must be empty, valid and usable. */
static void check_failed_target(kvidx *ix, int st, const char *what) {
  kvidx_stats s;
  memset(&s, 0, sizeof s);
  kvidx_get_stats(ix, &s);
  if (s.blocks || s.workers)
    FZ_FAIL("%s: snapshot_read returned %d (%s) but left %zu blocks / %zu workers", what, st,
            kvidx_strerror(st), s.blocks, s.workers);
  fz_check(ix, what);
  kvidx_block b = {0x11, 0x11};
  int rc = kvidx_store(ix, 5, 0, NULL, &b, 1);
  if (rc != KVIDX_OK) FZ_FAIL("%s: store after a failed snapshot_read returned %d", what, rc);
  uint64_t q = 0x11;
  kvidx_score sc[2];
  if (kvidx_find_matches(ix, &q, 1, sc, 2) != 1) FZ_FAIL("%s: query after a failed snapshot_read", what);
}

static int read_into(kvidx *ix, const uint8_t *p, size_t n) {
  rd_ctx rc = {p, n, 0, rd_chunk, 12345};
  return kvidx_snapshot_read(ix, rd_fn, &rc);
}

/* Round-trip size: at most RT_MAX_OPS ops and about RT_BLOCKS blocks
 * stored (bulk stores included).  Every phase after the ops (write, dump,
 * read, compare, the two damaged reads) costs in proportion to the index, so
 * without the block cap a few inputs with wide bulk stores (20+ ms each
 * under ASan) took half of the run time. */
#ifndef RT_MAX_OPS
#define RT_MAX_OPS 128
#endif
#ifndef RT_BLOCKS
#define RT_BLOCKS 384
#endif

static fz_shadow sh;
static fz_op op;

/* Compares a against the reference by everything the shadow knows, plus
 * all-alphabet queries of a few lengths. */
static void cmp_to(const kvidx *ref, const kvidx *b, const char *bn, unsigned bulk_hi) {
  fz_cmp_full(&sh, ref, "reference", b, bn, bulk_hi);
}

static void roundtrip(const uint8_t *data, size_t size, int srckind) {
  fz_rd r = {data, size, 0};
  uint32_t mw = 64;
  kvidx *ix[2];
  const char *nm[2] = {"reference", fz_kind_name(srckind)};
  ix[0] = fresh(KVIDX_REFERENCE, mw);
  ix[1] = fresh(srckind, mw);
  fz_expiry_mode = 0;
  fz_shadow_reset(&sh);
  unsigned bulk_budget = RT_BLOCKS / FZ_STAIR, bulk_hi = 0;
  size_t stored = 0;
  int nops = 0;
  while (fz_more(&r) && nops < RT_MAX_OPS && stored < RT_BLOCKS) {
    fz_gen_op(&r, &sh, &op, &bulk_budget);
    int st[2] = {0, 0};
    switch (op.type) {
    case FZ_STORE:
      for (int k = 0; k < 2; k++) st[k] = fz_store(ix[k], &op);
      stored += op.n;
      break;
    case FZ_REMOVE:
      for (int k = 0; k < 2; k++) st[k] = kvidx_remove(ix[k], op.wid, op.dp, op.n ? op.seqs : NULL, op.n);
      break;
    case FZ_CLEAR:
      for (int k = 0; k < 2; k++) st[k] = kvidx_clear(ix[k], op.wid, op.dp);
      break;
    case FZ_RMW:
      for (int k = 0; k < 2; k++) st[k] = kvidx_remove_worker(ix[k], op.wid);
      break;
    case FZ_BULK:
      for (unsigned i = 0; i < op.bulk_k; i++) {
        unsigned id = op.bulk_lo + i;
        static kvidx_block b[FZ_STAIR];
        size_t nb = fz_bulk_blocks(id, op.bulk_distinct, b);
        int bs[2];
        for (int k = 0; k < 2; k++) bs[k] = kvidx_store(ix[k], FZ_BULK_BASE + id, 0, NULL, b, nb);
        stored += nb;
        if (bs[1] != bs[0]) FZ_FAIL("op %d (bulk store %u): statuses %d %d", nops, id, bs[0], bs[1]);
        if (id + 1 > bulk_hi) bulk_hi = id + 1;
      }
      break;
    default: break;
    }
    if (st[1] != st[0]) FZ_FAIL("op %d: statuses %d %d", nops, st[0], st[1]);
    fz_shadow_apply(&sh, &op, st[0]);
    nops++;
  }
  wr_ctx w = {NULL, 0, 0};
  int st = kvidx_snapshot_write(ix[1], wr_fn, &w);
  if (st != KVIDX_OK) FZ_FAIL("snapshot_write(%s) = %d (%s)", nm[1], st, kvidx_strerror(st));
  const char *out = getenv("FUZZ_SNAPSHOT_OUT"); /* seed maker: save as parse-mode inputs */
  if (out) {
    static unsigned seq;
    char path[512];
    snprintf(path, sizeof path, "%s/seed-snap-%s-%zu-%u", out, nm[1], w.n, seq++);
    FILE *f = fopen(path, "wb");
    if (f) {
      uint8_t hdr = (uint8_t)srckind;
      fwrite(&hdr, 1, 1, f);
      fwrite(w.p, 1, w.n, f);
      fclose(f);
    }
  }
  /* kvidx_dump on its own, in 1 input of 4: snapshot_write above is the
   * same walk (its events are what the read below checks), so running it in
   * every input only doubled the walk's share of the run time */
  if ((size & 3) == 0) {
    size_t nev = 0;
    st = kvidx_dump(ix[1], count_fn, &nev);
    if (st != KVIDX_OK) FZ_FAIL("kvidx_dump(%s) = %d (%s)", nm[1], st, kvidx_strerror(st));
  }
  /* into one kind (rotating with the input; each index creation costs more
   * than the rest of the check) */
  {
    int kinds[3] = {KVIDX_REFERENCE, KVIDX_RADIX, KVIDX_POSITIONAL};
    int dst = (int)((size + (unsigned)srckind) % 3);
    /* in 1 input of 2 the target is exactly as big as what the source
     * holds (LRS eviction or none): the dump's stand-ins for holes must
     * not count against it (they did: EFULL, or real blocks evicted) */
    kvidx_stats sst;
    kvidx_get_stats(ix[1], &sst);
    kvidx *t = (size & 2) && sst.blocks ? fresh_full(kinds[dst], mw, sst.blocks, (size & 4) ? KVIDX_EVICT_LRS : 0)
                                        : fresh(kinds[dst], mw);
    st = read_into(t, w.p, w.n);
    if (st != KVIDX_OK)
      FZ_FAIL("snapshot of %s (%zu bytes) read into %s: %d (%s)", nm[1], w.n, fz_kind_name(kinds[dst]), st,
              kvidx_strerror(st));
    fz_check(t, "restored");
    char what[64];
    snprintf(what, sizeof what, "%s -> snapshot -> %s", nm[1], fz_kind_name(kinds[dst]));
    cmp_to(ix[0], t, what, bulk_hi);
    kvidx_destroy(t);
    /* in 1 input of 4 (others than above), also into a target half as big
     * that evicts: it must load and end within its max_blocks (BUGS.md
     * bug 8: stand-ins or parents evicted early read as corruption) */
    if ((size & 10) == 8 && sst.blocks > 1) {
      t = fresh_full(kinds[(dst + 1) % 3], mw, sst.blocks / 2, KVIDX_EVICT_LRS);
      st = read_into(t, w.p, w.n);
      if (st != KVIDX_OK)
        FZ_FAIL("snapshot of %s read into a %s target of %zu blocks (LRS): %d (%s)", nm[1],
                fz_kind_name(kinds[(dst + 1) % 3]), sst.blocks / 2, st, kvidx_strerror(st));
      kvidx_stats tst;
      kvidx_get_stats(t, &tst);
      if (tst.blocks > sst.blocks / 2) FZ_FAIL("smaller target holds %zu blocks, max %zu", tst.blocks, sst.blocks / 2);
      fz_check(t, "restored into a smaller target");
      kvidx_destroy(t);
    }
  }
  /* damaged copies: cut short, then (format version 2 puts every byte
   * under a checksum) one bit flipped; both must fail and leave the target
   * empty, valid and usable */
  if (w.n) {
    size_t cut = (size * 131u + (size ? data[size - 1] : 0u) + w.n / 3) % w.n;
    kvidx *t = fresh(srckind, mw);
    st = read_into(t, w.p, cut);
    if (st == KVIDX_OK) FZ_FAIL("snapshot cut to %zu of %zu bytes was read as complete", cut, w.n);
    check_failed_target(t, st, "truncated snapshot");
    kvidx_destroy(t);
    size_t bit = ((size_t)size * 2654435761u) % (w.n * 8);
    w.p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    t = fresh(srckind, mw);
    st = read_into(t, w.p, w.n);
    if (st == KVIDX_OK) FZ_FAIL("snapshot with bit %zu of %zu bytes flipped was read as sound", bit, w.n);
    check_failed_target(t, st, "bit-flipped snapshot");
    kvidx_destroy(t);
  }
  free(w.p);
  for (int k = 0; k < 2; k++) kvidx_destroy(ix[k]);
}

static void parse(const uint8_t *data, size_t size, int kind) {
  kvidx *t = fresh(kind, 64); /* 64 slots: the reference kind is O(slots) per call */
  int st = read_into(t, data, size);
  if (st != KVIDX_OK) {
    check_failed_target(t, st, "parse");
    kvidx_destroy(t);
    return;
  }
  fz_check(t, "parsed");
  /* write it again and read into every kind: the same answers as t */
  if (kind != KVIDX_REFERENCE) {
    wr_ctx w = {NULL, 0, 0};
    st = kvidx_snapshot_write(t, wr_fn, &w);
    if (st != KVIDX_OK) FZ_FAIL("snapshot_write of a parsed index = %d", st);
    for (int k = 0; k < 3; k++) {
      kvidx *u = fresh(k, 64);
      st = read_into(u, w.p, w.n);
      if (st != KVIDX_OK) FZ_FAIL("re-read of a written snapshot into kind %d = %d (%s)", k, st, kvidx_strerror(st));
      fz_check(u, "re-read");
      fz_cmp_stats(t, "parsed", u, "re-read");
      kvidx_destroy(u);
    }
    free(w.p);
  }
  kvidx_destroy(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_alloc_next_input();
  if (size < 1) return 0;
  uint8_t c = data[0];
  int kind = (c & 3) % 3;
  rd_chunk = (c >> 3) & 3;
  /* round trip: the source kind from bits 0-1 (since 0.2 radix and
   * positional are one implementation: one source per input) */
  if (c & 4) roundtrip(data + 1, size - 1, (c & 1) ? KVIDX_POSITIONAL : KVIDX_RADIX);
  else parse(data + 1, size - 1, kind);
  return 0;
}
