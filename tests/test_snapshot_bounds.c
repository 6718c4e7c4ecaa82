/* Hostile snapshots: the work and memory a snapshot stream causes are
 * proportional to its own length, and nothing is applied before it is
 * verified (version 2), or the target is emptied again (version 1).
 *
 * Streams are built by hand here (format: kvidx.h, "binary snapshot"), with
 * a byte-counting reader, so each case shows how far the reader went. */
#define XXH_INLINE_ALL /* the test's own copy, to build checksums */
#include <xxhash.h>

#include "testutil.h"

typedef struct {
  unsigned char *p;
  size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *x, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = (unsigned char *)realloc(b->p, b->cap);
    if (!b->p) exit(2);
  }
  memcpy(b->p + b->n, x, n);
  b->n += n;
}
static void le64(unsigned char *p, uint64_t v) {
  int i;
  for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(buf_t *b, uint64_t v) {
  unsigned char x[8];
  le64(x, v);
  put(b, x, 8);
}

/* one 48-byte record */
static void rec(unsigned char *r, int type, int tier, int has_parent, uint32_t rank, uint64_t worker, uint64_t a,
                uint64_t b, uint64_t c, uint64_t d) {
  memset(r, 0, 48);
  r[0] = (unsigned char)type;
  r[1] = (unsigned char)tier;
  r[2] = (unsigned char)has_parent;
  r[4] = (unsigned char)rank;
  r[5] = (unsigned char)(rank >> 8);
  r[6] = (unsigned char)(rank >> 16);
  r[7] = (unsigned char)(rank >> 24);
  le64(r + 8, worker);
  le64(r + 16, a);
  le64(r + 24, b);
  le64(r + 32, c);
  le64(r + 40, d);
}

/* Records for a chain of n stored blocks of one worker (root first). */
static unsigned char *chain_records(uint64_t worker, size_t n) {
  unsigned char *r = (unsigned char *)malloc(n * 48 + 1);
  uint64_t prev = 0;
  size_t i;
  if (!r) exit(2);
  for (i = 0; i < n; i++) {
    uint64_t local = 0x1000 + i, seq = i ? kvidx_seq_hash_next(prev, local) : local;
    rec(r + i * 48, 1, 0, i > 0, 0, worker, i ? prev : 0, local, seq, 0);
    prev = seq;
  }
  return r;
}

/* A version-2 header for `claimed` records (length field and checksum
 * consistent with it), then the given records in checksummed chunks. */
static void v2(buf_t *b, uint64_t claimed, const unsigned char *recs, size_t n) {
  unsigned char h[48];
  uint64_t seed;
  size_t i;
  memset(h, 0, sizeof h);
  memcpy(h, "KVIDXSNP", 8);
  h[8] = 2;
  h[12] = 48;
  le64(h + 16, claimed);
  le64(h + 24, 48 + 48 * claimed + 8 * ((claimed + 63) / 64));
  h[32] = 64;
  seed = XXH3_64bits_withSeed(h, 40, 0);
  le64(h + 40, seed);
  put(b, h, 48);
  for (i = 0; i < n; i += 64) {
    size_t k = n - i < 64 ? n - i : 64;
    seed = XXH3_64bits_withSeed(recs + i * 48, k * 48, seed);
    put(b, recs + i * 48, k * 48);
    put64(b, seed);
  }
}

/* A version-1 stream: header, records, end record with the checksum. */
static void v1(buf_t *b, const unsigned char *recs, size_t n, int bad_sum) {
  unsigned char h[24], end[48];
  memset(h, 0, sizeof h);
  memcpy(h, "KVIDXSNP", 8);
  h[8] = 1;
  h[12] = 48;
  put(b, h, 24);
  put(b, recs, n * 48);
  rec(end, 255, 0, 0, 0, 0, n, 0, 0, 0);
  put(b, end, 40);
  put64(b, XXH3_64bits(b->p, b->n) ^ (uint64_t)(bad_sum != 0));
}

/* Reader over a buffer, counting what it delivered; `junk` more bytes of
 * garbage after the buffer (a stream that goes on). */
typedef struct {
  const unsigned char *p;
  size_t n, pos, junk, delivered;
} rd_t;
static size_t rd(void *ctx, void *out, size_t len) {
  rd_t *r = (rd_t *)ctx;
  size_t k = 0;
  unsigned char *o = (unsigned char *)out;
  while (k < len && (r->pos < r->n || r->pos < r->n + r->junk)) {
    o[k++] = r->pos < r->n ? r->p[r->pos] : (unsigned char)(r->pos * 131u);
    r->pos++;
  }
  r->delivered += k;
  return k;
}

static kvidx *fresh(int kind, size_t max_blocks) {
  kvidx_config c;
  kvidx *ix = NULL;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_workers = 16;
  c.max_blocks = max_blocks;
  if (kvidx_create(&ix, &c) != KVIDX_OK) exit(2);
  return ix;
}

static void check_empty(kvidx *ix) {
  kvidx_stats st;
  uint64_t id;
  kvidx_block blk = {7, 7};
  memset(&st, 0, sizeof st);
  CHECK_EQ(kvidx_get_stats(ix, &st), KVIDX_OK);
  CHECK_EQ(st.blocks, 0);
  CHECK_EQ(st.workers, 0);
  CHECK_EQ(kvidx_last_event_id(ix, 1, 0, &id), KVIDX_ENOENT);
  CHECK_EQ(kvidx__check(ix), 0);
  /* and usable */
  CHECK_EQ(kvidx_store(ix, 9, 0, NULL, &blk, 1), KVIDX_OK);
  CHECK_EQ(kvidx_clear(ix, 9, 0), KVIDX_OK);
}

static int read_buf(kvidx *ix, const buf_t *b, size_t junk, size_t *delivered) {
  rd_t r = {b->p, b->n, 0, junk, 0};
  int rc = kvidx_snapshot_read(ix, rd, &r);
  *delivered = r.delivered;
  return rc;
}

static void test_kind(int kind) {
  const size_t chunk = 64 * 48 + 8;
  unsigned char *recs = chain_records(1, 200);
  size_t got;
  kvidx *ix;

  /* 1. a header claiming 2^40 records, then a garbage first chunk: refused
   * after the header and one chunk, nothing applied */
  {
    buf_t b = {NULL, 0, 0};
    unsigned char junk[64 * 48 + 8];
    memset(junk, 0x5A, sizeof junk);
    v2(&b, (uint64_t)1 << 40, NULL, 0);
    put(&b, junk, sizeof junk);
    ix = fresh(kind, 0);
    CHECK_EQ(read_buf(ix, &b, 1 << 20, &got), KVIDX_ECORRUPT);
    CHECK_EQ(got, 48 + chunk);
    check_empty(ix);
    kvidx_destroy(ix);
    free(b.p);
  }
  /* 2. the same claim, one sound chunk, then the stream ends: truncated,
   * and the applied chunk is taken back */
  {
    buf_t b = {NULL, 0, 0};
    v2(&b, (uint64_t)1 << 40, recs, 64);
    ix = fresh(kind, 0);
    CHECK_EQ(read_buf(ix, &b, 0, &got), KVIDX_ETRUNCATED);
    CHECK_EQ(got, 48 + chunk);
    check_empty(ix);
    kvidx_destroy(ix);
    free(b.p);
  }
  /* 3. a sound stream whose third chunk is damaged: the index caps at 150
   * blocks, so applying chunk 3 (blocks 129..192) before checking it would
   * say EFULL; it says ECORRUPT */
  {
    buf_t b = {NULL, 0, 0};
    v2(&b, 192, recs, 192);
    b.p[48 + 2 * chunk + 100] ^= 1;
    ix = fresh(kind, 150);
    CHECK_EQ(read_buf(ix, &b, 0, &got), KVIDX_ECORRUPT);
    check_empty(ix);
    kvidx_destroy(ix);
    free(b.p);
    /* undamaged: EFULL, also empty afterwards */
    b.p = NULL, b.n = b.cap = 0;
    v2(&b, 192, recs, 192);
    ix = fresh(kind, 150);
    CHECK_EQ(read_buf(ix, &b, 0, &got), KVIDX_EFULL);
    check_empty(ix);
    kvidx_destroy(ix);
    free(b.p);
  }
  /* 4. header checksum or length field wrong: refused after 48 bytes */
  {
    int which;
    for (which = 0; which < 3; which++) {
      buf_t b = {NULL, 0, 0};
      v2(&b, 200, recs, 200);
      if (which == 0) b.p[40] ^= 0x80;                    /* checksum */
      if (which == 1) b.p[24] ^= 0x08;                    /* length (checksum then fails) */
      if (which == 2) {                                   /* length inconsistent, checksum redone */
        le64(b.p + 24, 48 + 48 * 200 + 8 * 4 + 8);
        le64(b.p + 40, XXH3_64bits_withSeed(b.p, 40, 0));
      }
      ix = fresh(kind, 0);
      CHECK_EQ(read_buf(ix, &b, 1 << 20, &got), KVIDX_ECORRUPT);
      CHECK_EQ(got, 48);
      check_empty(ix);
      kvidx_destroy(ix);
      free(b.p);
    }
  }
  /* 5. a sound stream followed by more bytes: read exactly its length;
   * a type-3 record's field b (the stream generation) is accepted */
  {
    buf_t b = {NULL, 0, 0};
    unsigned char *all = (unsigned char *)malloc(201 * 48);
    uint64_t id = 0;
    if (!all) exit(2);
    memcpy(all, recs, 200 * 48);
    rec(all + 200 * 48, 3, 0, 0, 0, 1, 4242, 7, 0, 0);
    v2(&b, 201, all, 201);
    ix = fresh(kind, 0);
    CHECK_EQ(read_buf(ix, &b, 1 << 20, &got), KVIDX_OK);
    CHECK_EQ(got, b.n);
    CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 200);
    CHECK_EQ(kvidx_last_event_id(ix, 1, 0, &id), KVIDX_OK);
    CHECK_EQ(id, 4242);
    CHECK_EQ(kvidx__check(ix), 0);
    kvidx_destroy(ix);
    free(b.p);
    free(all);
  }
  /* 6. version 1: a sound stream loads; a bad end checksum empties the
   * target again, after reading just that stream (O(its length) work) */
  {
    buf_t b = {NULL, 0, 0};
    v1(&b, recs, 200, 0);
    ix = fresh(kind, 0);
    CHECK_EQ(read_buf(ix, &b, 1 << 20, &got), KVIDX_OK);
    CHECK_EQ(got, b.n);
    CHECK_EQ(kvidx_worker_blocks(ix, 1, 0), 200);
    kvidx_destroy(ix);
    free(b.p);
    b.p = NULL, b.n = b.cap = 0;
    v1(&b, recs, 200, 1);
    ix = fresh(kind, 0);
    CHECK_EQ(read_buf(ix, &b, 1 << 20, &got), KVIDX_ECORRUPT);
    CHECK_EQ(got, b.n);
    check_empty(ix);
    kvidx_destroy(ix);
    free(b.p);
    /* a v1 stream that never ends: each record is one bounded step, and
     * the first junk record (an unknown type) stops it */
    b.p = NULL, b.n = b.cap = 0;
    v1(&b, recs, 200, 0);
    b.n -= 48; /* drop the end record */
    ix = fresh(kind, 0);
    CHECK_EQ(read_buf(ix, &b, 1 << 20, &got), KVIDX_ECORRUPT);
    CHECK(got <= b.n + 48);
    check_empty(ix);
    kvidx_destroy(ix);
    free(b.p);
  }
  free(recs);
}

int main(void) {
  int k;
  for (k = 0; k < 3; k++) test_kind(k);
  printf("snapshot bounds: %d passed, %d failed\n", t_checks - t_fails, t_fails);
  return t_fails ? 1 : 0;
}
