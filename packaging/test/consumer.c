/* consumer.c - a program using an installed kvidx: built once through
 * pkg-config and once through CMake's find_package(kvidx) by
 * `make test-install`. */
#define KVIDX_IMPLEMENTATION
#include <kvidx.h>

#include <stdio.h>

int main(void) {
  uint32_t tok[64];
  uint64_t loc[4];
  kvidx_block b[4];
  kvidx_score sc[2];
  kvidx_config cfg = {0};
  kvidx *ix;
  size_t i, n, m;
  for (i = 0; i < 64; i++) tok[i] = (uint32_t)i;
  n = kvidx_block_hashes(tok, 64, 16, KVIDX_SEED, loc);
  for (i = 0; i < n; i++) b[i].local = loc[i];
  kvidx_seq_hashes(loc, n, loc);
  for (i = 0; i < n; i++) b[i].seq = loc[i];
  n = kvidx_block_hashes(tok, 64, 16, KVIDX_SEED, loc);
  if (kvidx_create(&ix, &cfg) != KVIDX_OK) return 1;
  if (kvidx_store(ix, 7, 0, NULL, b, n) != KVIDX_OK) return 1;
  m = kvidx_find_matches(ix, loc, n, sc, 2);
  printf("consumer: kvidx %s, %zu match, worker %llu depth %u\n", kvidx_version(),
         m, m ? (unsigned long long)sc[0].worker_id : 0ull, m ? sc[0].depth : 0u);
  kvidx_destroy(ix);
  return !(m == 1 && sc[0].depth == 4);
}
