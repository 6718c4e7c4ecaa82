/* Edge statuses and config flags that neither the other tests nor the fuzz
 * corpus reach (found with `make coverage`): every status code's message,
 * invalid eviction configs, malformed events, the event-id table filling
 * up, and snapshot records that pass their checksum but not the format. */
#define XXH_INLINE_ALL /* the test's own copy, to build a checksummed stream */
#include <xxhash.h>

#include "testutil.h"

static void test_strerror(void) {
  static const int codes[] = {KVIDX_OK,      KVIDX_EINVAL,   KVIDX_ENOMEM,   KVIDX_EFULL,     KVIDX_ENOPARENT,
                              KVIDX_ENOENT,  KVIDX_ENOTSUP,  KVIDX_EAGAIN,   KVIDX_ECORRUPT,  KVIDX_EVERSION,
                              KVIDX_ETRUNCATED, KVIDX_EIO,   KVIDX_GAP,      KVIDX_RESTARTED, KVIDX_DUPLICATE};
  const size_t n = sizeof codes / sizeof codes[0];
  size_t i, j;
  for (i = 0; i < n; i++) {
    const char *m = kvidx_strerror(codes[i]);
    CHECK(m != NULL && m[0] != 0);
    for (j = 0; j < i; j++) CHECK(strcmp(m, kvidx_strerror(codes[j])) != 0); /* each its own */
  }
  CHECK(kvidx_strerror(12345) != NULL);
  CHECK(strcmp(kvidx_strerror(12345), kvidx_strerror(KVIDX_OK)) != 0);
}

static void test_bad_configs(void) {
  kvidx_config c;
  kvidx *ix = NULL;
  int k;
  for (k = 0; k < 3; k++) {
    memset(&c, 0, sizeof c);
    c.kind = k;
    c.max_blocks = 100;
    c.evict = 3; /* no such policy */
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_EINVAL);
    c.evict = KVIDX_EVICT_LRS;
    c.evict_target_pct = 101;
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_EINVAL);
    c.evict_target_pct = 50;
    c.max_blocks = 0; /* eviction needs a bound */
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_EINVAL);
    c.max_blocks = 100;
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
    kvidx_destroy(ix);
  }
}

static void test_bad_events(void) {
  kvidx_config c;
  kvidx *ix = NULL;
  kvidx_event e;
  uint64_t s = 1;
  int k;
  for (k = 0; k < 3; k++) {
    memset(&c, 0, sizeof c);
    c.kind = k;
    c.flags = KVIDX_F_TIERS;
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
    memset(&e, 0, sizeof e);
    e.event_id = 1;
    e.worker_id = 1;
    e.type = KVIDX_EV_REMOVED;
    e.tier = 7; /* neither a tier nor KVIDX_TIER_ALL */
    e.seqs = &s;
    e.n = 1;
    CHECK_EQ(kvidx_apply(ix, &e), KVIDX_EINVAL);
    e.tier = KVIDX_TIER_ALL;
    e.seqs = NULL; /* n seqs promised, none given */
    CHECK_EQ(kvidx_apply(ix, &e), KVIDX_EINVAL);
    CHECK_EQ(kvidx_remove(ix, 1, 0, NULL, 1), KVIDX_EINVAL);
    kvidx_destroy(ix);
  }
}

/* The event-id table keeps 2 x max_workers places: ids of workers holding
 * nothing are forgotten when it fills, and their next event counts as a
 * first one (any id, KVIDX_OK). */
static void test_event_table_fills(void) {
  kvidx_config c;
  kvidx *ix = NULL;
  kvidx_event e;
  kvidx_block b = {0x11, 0x11};
  uint64_t w, last = 0;
  int k;
  for (k = 0; k < 3; k++) {
    memset(&c, 0, sizeof c);
    c.kind = k;
    c.max_workers = 2;
    CHECK_EQ(kvidx_create(&ix, &c), KVIDX_OK);
    for (w = 1; w <= 40; w++) { /* each stores, then clears: holds nothing */
      memset(&e, 0, sizeof e);
      e.event_id = 10;
      e.worker_id = w;
      e.type = KVIDX_EV_STORED;
      e.blocks = &b;
      e.n = 1;
      CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
      e.event_id = 11;
      e.type = KVIDX_EV_CLEARED;
      e.blocks = NULL;
      e.n = 0;
      CHECK_EQ(kvidx_apply(ix, &e), KVIDX_OK);
    }
    /* the last worker is still known; the first was forgotten */
    CHECK_EQ(kvidx_last_event_id(ix, 40, 0, &last), KVIDX_OK);
    CHECK_EQ(last, 11);
    CHECK_EQ(kvidx_last_event_id(ix, 1, 0, &last), KVIDX_ENOENT);
    CHECK_EQ(kvidx__check(ix), 0);
    kvidx_destroy(ix);
  }
}

/* A stream (format version 2 or 3) with one record whose checksum is right
 * but whose content is not a valid record: refused, the target empty. */
static size_t rd(void *ctx, void *out, size_t len) {
  unsigned char **p = (unsigned char **)ctx;
  memcpy(out, *p, len);
  *p += len;
  return len;
}
static void le64(unsigned char *p, uint64_t v) {
  int i;
  for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static int read_records_v(int kind, const unsigned char *recs, int n, unsigned version, size_t *blocks,
                          size_t max_blocks, int evict) {
  unsigned char s[48 + 4 * 48 + 8], *p = s;
  kvidx_config c;
  kvidx *ix = NULL;
  kvidx_stats st;
  int rc;
  memset(s, 0, sizeof s);
  memcpy(s, "KVIDXSNP", 8);
  s[8] = (unsigned char)version;
  s[12] = 48;
  le64(s + 16, (uint64_t)n);
  le64(s + 24, 48 + 48 * (uint64_t)n + 8);
  s[32] = 64;
  le64(s + 40, XXH3_64bits_withSeed(s, 40, 0));
  memcpy(s + 48, recs, 48 * (size_t)n);
  le64(s + 48 + 48 * n, XXH3_64bits_withSeed(s + 48, 48 * (size_t)n, XXH3_64bits_withSeed(s, 40, 0)));
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.max_blocks = max_blocks;
  c.evict = evict;
  if (kvidx_create(&ix, &c) != KVIDX_OK) exit(2);
  rc = kvidx_snapshot_read(ix, rd, &p);
  memset(&st, 0, sizeof st);
  kvidx_get_stats(ix, &st);
  *blocks = st.blocks;
  if (rc != KVIDX_OK) CHECK_EQ(st.blocks, 0);
  CHECK_EQ(kvidx__check(ix), 0);
  kvidx_destroy(ix);
  return rc;
}
static int read_one_record_v(int kind, const unsigned char *r48, unsigned version) {
  size_t blocks;
  int rc = read_records_v(kind, r48, 1, version, &blocks, 0, 0);
  CHECK_EQ(blocks, rc == KVIDX_OK ? 1 : 0);
  return rc;
}
static int read_one_record(int kind, const unsigned char *r48) { return read_one_record_v(kind, r48, 2); }
static void test_bad_records(void) {
  unsigned char r[48];
  int k;
  for (k = 0; k < 3; k++) {
    memset(r, 0, sizeof r);
    r[0] = 9; /* unknown type */
    CHECK_EQ(read_one_record(k, r), KVIDX_ECORRUPT);
    r[0] = 1; /* a store on tier 5 */
    r[1] = 5;
    CHECK_EQ(read_one_record(k, r), KVIDX_ECORRUPT);
    r[1] = 0; /* an expiry in an index without expiry eviction */
    r[40] = 1;
    CHECK_EQ(read_one_record(k, r), KVIDX_ECORRUPT);
    r[40] = 0; /* the reserved byte set */
    r[3] = 1;
    CHECK_EQ(read_one_record(k, r), KVIDX_ECORRUPT);
    r[3] = 0; /* a removal of a seq nobody holds */
    r[0] = 2;
    r[1] = 255;
    CHECK_EQ(read_one_record(k, r), KVIDX_ECORRUPT);
    r[0] = 1; /* and a sound one loads */
    r[1] = 0;
    r[24] = 0x11; /* local */
    r[32] = 0x11; /* seq */
    CHECK_EQ(read_one_record(k, r), KVIDX_OK);
    CHECK_EQ(read_one_record_v(k, r, 3), KVIDX_OK);
    r[2] = 2; /* a detached block: version 3 only */
    CHECK_EQ(read_one_record(k, r), KVIDX_ECORRUPT);
    CHECK_EQ(read_one_record_v(k, r, 3), KVIDX_OK);
    r[2] = 3; /* no such parent kind */
    CHECK_EQ(read_one_record_v(k, r, 3), KVIDX_ECORRUPT);
    r[2] = 2; /* a detached block with a parent seq */
    r[16] = 5;
    CHECK_EQ(read_one_record_v(k, r, 3), KVIDX_ECORRUPT);
    r[16] = 0;
    r[2] = 0;
    { /* stand-in flags (version 4): a stand-in stored and removed again
         loads, past max_blocks; one left standing, a flag of 2, a flag in
         version 2 or a flagged removal with no stand-in stored are not */
      unsigned char two[3 * 48];
      size_t blocks = 9;
      memcpy(two, r, 48);         /* a block the target holds: max_blocks 1 is full */
      memcpy(two + 48, r, 48);    /* a stand-in of another worker */
      two[48 + 3] = 1;
      two[48 + 8] = 7;
      memcpy(two + 96, two + 48, 48); /* its removal, flagged too */
      two[96] = 2;
      two[96 + 1] = 255;
      memcpy(two + 96 + 16, two + 48 + 32, 8); /* a = the stand-in's seq */
      memset(two + 96 + 24, 0, 24);
      CHECK_EQ(read_records_v(k, two, 3, 4, &blocks, 1, 0), KVIDX_OK);
      CHECK_EQ(blocks, 1);
      CHECK_EQ(read_records_v(k, two, 3, 2, &blocks, 0, 0), KVIDX_ECORRUPT);
      CHECK_EQ(read_records_v(k, two, 3, 3, &blocks, 0, 0), KVIDX_ECORRUPT); /* flags: version 4 only */
      CHECK_EQ(read_records_v(k, two, 3, 5, &blocks, 0, 0), KVIDX_EVERSION);
      CHECK_EQ(read_records_v(k, two, 2, 4, &blocks, 0, 0), KVIDX_ECORRUPT); /* left standing */
      two[96 + 3] = 0; /* removed unflagged: its room stays, the stream ends with one */
      CHECK_EQ(read_records_v(k, two, 3, 4, &blocks, 0, 0), KVIDX_ECORRUPT);
      two[96 + 3] = 1;
      two[96 + 16] ^= 1; /* a flagged removal of a seq not held, in a target that evicts but */
      CHECK_EQ(read_records_v(k, two, 3, 4, &blocks, 1000, KVIDX_EVICT_LRS), KVIDX_ECORRUPT); /* evicted nothing */
      two[96 + 16] ^= 1;
      memcpy(two + 48, r, 48); /* a block whose parent never came, the same target */
      two[48 + 2] = 1;
      two[48 + 16] = 0x55;
      CHECK_EQ(read_records_v(k, two, 2, 4, &blocks, 1000, KVIDX_EVICT_LRS), KVIDX_ECORRUPT);
      memcpy(two + 48, r, 48); /* the stand-in again */
      two[48 + 3] = 1;
      two[48 + 8] = 7;
      two[48 + 3] = 0; /* a flagged removal with no stand-in stored */
      CHECK_EQ(read_records_v(k, two, 3, 4, &blocks, 0, 0), KVIDX_ECORRUPT);
      two[48 + 3] = 2;
      CHECK_EQ(read_records_v(k, two, 3, 4, &blocks, 0, 0), KVIDX_ECORRUPT);
    }
  }
}

int main(void) {
  test_strerror();
  test_bad_configs();
  test_bad_events();
  test_event_table_fills();
  test_bad_records();
  printf("edges: %d passed, %d failed\n", t_checks - t_fails, t_fails);
  return t_fails ? 1 : 0;
}
