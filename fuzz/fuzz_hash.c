/* fuzz_hash.c - kvidx's hashing agrees with direct XXH3 calls written out
 * here, byte for byte, and stays in bounds.
 *
 * Input: byte 0 selects the block size (0, 1, 2, 3, 16, 32, 64, 1..255,
 * 256..65535, huge values), byte 1 the seed mode (KVIDX_SEED, 0, from the
 * input, salted via kvidx_hash_seed), then the seed (8 bytes, if used), then
 * two short strings (lora, namespace; length-prefixed), then the rest as u32
 * tokens (little endian; a short tail of < 4 bytes is ignored).  The tokens
 * also serve, read as u64 pairs, as arbitrary local hashes for
 * kvidx_seq_hashes.  Every buffer handed to kvidx is exactly sized (heap), so
 * ASan catches any read or write past it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "\n*** FUZZ MISMATCH (%s:%d): ", __FILE__, __LINE__);      \
    fprintf(stderr, __VA_ARGS__);                                              \
    fputc('\n', stderr);                                                       \
    abort();                                                                   \
  } while (0)

static void le64(unsigned char *p, uint64_t v) {
  for (int k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}

/* Dynamo's contract, written out. */
static uint64_t ref_block(const uint32_t *t, size_t n, uint64_t seed) {
  unsigned char *bytes = (unsigned char *)malloc(n * 4 + 1);
  if (!bytes) abort();
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 4; k++) bytes[4 * i + k] = (unsigned char)(t[i] >> (8 * k));
  uint64_t h = XXH3_64bits_withSeed(bytes, n * 4, seed);
  free(bytes);
  return h;
}

static uint64_t ref_next(uint64_t parent, uint64_t local) {
  unsigned char b[16];
  le64(b, parent);
  le64(b + 8, local);
  return XXH3_64bits_withSeed(b, 16, 1337);
}

static uint64_t ref_seed(const char *lora, const char *ns) {
  uint64_t s = 1337;
  if (lora && *lora) s += XXH3_64bits_withSeed(lora, strlen(lora), 0);
  if (ns && *ns) s += XXH3_64bits_withSeed(ns, strlen(ns), 1);
  return s;
}

static size_t pick_bs(uint8_t b, uint8_t x, uint8_t y) {
  switch (b >> 4) {
  case 0: return 0;
  case 1: return 1;
  case 2: return 2;
  case 3: return 3;
  case 4: case 5: return 16;
  case 6: return 32;
  case 7: return 64;
  case 8: case 9: case 10: return 1 + x;
  case 11: return 256 + ((size_t)x | (size_t)y << 8);
  case 12: return SIZE_MAX;
  case 13: return SIZE_MAX / 4 + 1;
  case 14: /* 2^32 where size_t holds it (32-bit targets: 2^31) */
    return SIZE_MAX > 0xFFFFFFFFu ? (size_t)((uint64_t)1 << 32) : SIZE_MAX / 2 + 1;
  default: return 4 + (b & 15);
  }
}

static const uint8_t *take(const uint8_t **p, size_t *n, size_t k) {
  if (k > *n) k = *n;
  const uint8_t *r = *p;
  *p += k;
  *n -= k;
  return r;
}

static char *take_str(const uint8_t **p, size_t *n, int *is_null) {
  uint8_t len = *n ? **p : 0;
  take(p, n, 1);
  *is_null = len == 0xFF;
  if (*is_null) return NULL;
  len &= 15;
  size_t got = len < *n ? len : *n;
  const uint8_t *s = take(p, n, got);
  char *out = (char *)malloc(got + 1);
  if (!out) abort();
  memcpy(out, s, got);
  out[got] = 0; /* embedded NULs just shorten the string */
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *p = data;
  size_t n = size;
  uint8_t hdr[4] = {0, 0, 0, 0};
  memcpy(hdr, take(&p, &n, 4), size < 4 ? size : 4);
  size_t bs = pick_bs(hdr[0], hdr[1], hdr[2]);
  uint64_t seed = KVIDX_SEED;
  int lnull, nnull;
  char *lora = take_str(&p, &n, &lnull);
  char *ns = take_str(&p, &n, &nnull);
  switch (hdr[3] & 3) {
  case 0: seed = KVIDX_SEED; break;
  case 1: seed = 0; break;
  case 2: {
    unsigned char sb[8] = {0};
    size_t k = n < 8 ? n : 8;
    memcpy(sb, take(&p, &n, k), k);
    seed = 0;
    for (int i = 0; i < 8; i++) seed |= (uint64_t)sb[i] << (8 * i);
    break;
  }
  case 3: seed = kvidx_hash_seed(lora, ns); break;
  }

  /* kvidx_hash_seed */
  uint64_t hs = kvidx_hash_seed(lora, ns), rs = ref_seed(lora, ns);
  if (hs != rs)
    FAIL("kvidx_hash_seed(%s%s%s, %s%s%s) = %#llx, expected %#llx", lora ? "\"" : "",
         lora ? lora : "NULL", lora ? "\"" : "", ns ? "\"" : "", ns ? ns : "NULL",
         ns ? "\"" : "", (unsigned long long)hs, (unsigned long long)rs);

  /* tokens: exactly sized */
  size_t nt = n / 4;
  uint32_t *tok = (uint32_t *)malloc(nt ? nt * sizeof *tok : 1);
  if (!tok) abort();
  for (size_t i = 0; i < nt; i++)
    tok[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
             (uint32_t)p[4 * i + 3] << 24;

  /* kvidx_block_hash over all tokens, and over a prefix */
  uint64_t a = kvidx_block_hash(nt ? tok : NULL, nt, seed), b = ref_block(tok, nt, seed);
  if (a != b)
    FAIL("kvidx_block_hash(n=%zu, seed=%#llx) = %#llx, expected %#llx", nt,
         (unsigned long long)seed, (unsigned long long)a, (unsigned long long)b);
  size_t np = nt ? hdr[1] % (nt + 1) : 0;
  a = kvidx_block_hash(tok, np, seed);
  b = ref_block(tok, np, seed);
  if (a != b) FAIL("kvidx_block_hash(prefix n=%zu) = %#llx, expected %#llx", np, (unsigned long long)a, (unsigned long long)b);

  /* kvidx_block_hashes: exactly n_tokens / bs outputs (0 when bs == 0) */
  size_t nb = bs ? nt / bs : 0;
  uint64_t *loc = (uint64_t *)malloc((nb ? nb : 1) * sizeof *loc);
  if (!loc) abort();
  loc[0] = 0x5A5A5A5A5A5A5A5Aull;
  size_t got = kvidx_block_hashes(tok, nt, bs, seed, loc);
  if (got != nb) FAIL("kvidx_block_hashes(n_tokens=%zu, block_size=%zu) returned %zu, expected %zu", nt, bs, got, nb);
  if (nb == 0 && loc[0] != 0x5A5A5A5A5A5A5A5Aull) FAIL("kvidx_block_hashes wrote with no full block");
  for (size_t i = 0; i < nb; i++) {
    uint64_t e = ref_block(tok + i * bs, bs, seed);
    if (loc[i] != e)
      FAIL("kvidx_block_hashes block %zu/%zu (bs=%zu, seed=%#llx) = %#llx, expected %#llx", i, nb, bs,
           (unsigned long long)seed, (unsigned long long)loc[i], (unsigned long long)e);
  }

  /* kvidx_seq_hashes over those locals */
  uint64_t *seq = (uint64_t *)malloc((nb ? nb : 1) * sizeof *seq);
  if (!seq) abort();
  seq[0] = 0x5A5A5A5A5A5A5A5Aull;
  kvidx_seq_hashes(loc, nb, seq);
  if (nb == 0 && seq[0] != 0x5A5A5A5A5A5A5A5Aull) FAIL("kvidx_seq_hashes wrote with n = 0");
  for (size_t i = 0; i < nb; i++) {
    uint64_t e = i ? ref_next(seq[i - 1], loc[i]) : loc[0];
    if (seq[i] != e)
      FAIL("kvidx_seq_hashes[%zu] = %#llx, expected %#llx", i, (unsigned long long)seq[i], (unsigned long long)e);
  }

  /* kvidx_seq_hashes / kvidx_seq_hash_next over arbitrary u64 locals */
  size_t nl = n / 8;
  uint64_t *l2 = (uint64_t *)malloc((nl ? nl : 1) * sizeof *l2);
  uint64_t *s2 = (uint64_t *)malloc((nl ? nl : 1) * sizeof *s2);
  if (!l2 || !s2) abort();
  for (size_t i = 0; i < nl; i++) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v |= (uint64_t)p[8 * i + k] << (8 * k);
    l2[i] = v;
  }
  kvidx_seq_hashes(l2, nl, s2);
  for (size_t i = 0; i < nl; i++) {
    uint64_t e = i ? ref_next(s2[i - 1], l2[i]) : l2[0];
    if (s2[i] != e)
      FAIL("kvidx_seq_hashes(arbitrary)[%zu] = %#llx, expected %#llx", i, (unsigned long long)s2[i], (unsigned long long)e);
    if (i) {
      uint64_t x = kvidx_seq_hash_next(s2[i - 1], l2[i]);
      if (x != e) FAIL("kvidx_seq_hash_next(%#llx, %#llx) = %#llx, expected %#llx", (unsigned long long)s2[i - 1],
                       (unsigned long long)l2[i], (unsigned long long)x, (unsigned long long)e);
    }
  }
  if (nl) {
    uint64_t x = kvidx_seq_hash_next(seed, l2[0]), e = ref_next(seed, l2[0]);
    if (x != e) FAIL("kvidx_seq_hash_next(%#llx, %#llx) = %#llx, expected %#llx", (unsigned long long)seed,
                     (unsigned long long)l2[0], (unsigned long long)x, (unsigned long long)e);
  }
  free(l2);
  free(s2);
  free(seq);
  free(loc);
  free(tok);
  free(lora);
  free(ns);
  return 0;
}
