/* Slot generations do not wrap: a live worker stays in every answer however
 * many times other workers' slots are reassigned.  0.1 kept a 32-bit epoch
 * compared as a signed difference: after 2^31 assignments a live worker
 * vanished.  Here each assignment advances the generation by 2^30
 * (KVIDX_TEST_GEN_STEP), so a handful of flapping workers crosses 2^31, 2^32
 * and 2^33 at once. */
#define KVIDX_TEST_GEN_STEP (1ull << 30)
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include <stdio.h>

static int fails, checks;
#define CHECK(c) (checks++, (c) ? (void)0 : (void)(fails++, fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c)))

int main(void) {
  static const int kinds[2] = {KVIDX_RADIX, KVIDX_POSITIONAL};
  int k, round;
  for (k = 0; k < 2; k++) {
    kvidx_config cfg = {0};
    kvidx *ix;
    uint64_t loc[3] = {11, 12, 13}, seq[3];
    kvidx_block b[3];
    int i;
    cfg.kind = kinds[k];
    cfg.max_workers = 4;
    CHECK(kvidx_create(&ix, &cfg) == KVIDX_OK);
    kvidx_seq_hashes(loc, 3, seq);
    for (i = 0; i < 3; i++) b[i].local = loc[i], b[i].seq = seq[i];
    CHECK(kvidx_store(ix, 1, 0, NULL, b, 3) == KVIDX_OK); /* the live worker */
    for (round = 0; round < 12; round++) {                 /* 12 x 2^30: past 2^33 */
      kvidx_score sc[4];
      size_t m;
      CHECK(kvidx_store(ix, 2, 0, NULL, b, 2) == KVIDX_OK); /* a flapping worker */
      m = kvidx_find_matches(ix, loc, 3, sc, 4);
      CHECK(m == 2 && sc[0].worker_id == 1 && sc[0].depth == 3 && sc[1].worker_id == 2 && sc[1].depth == 2);
      CHECK(kvidx_clear(ix, 2, 0) == KVIDX_OK);
      m = kvidx_find_matches(ix, loc, 3, sc, 4);
      CHECK(m == 1 && sc[0].worker_id == 1 && sc[0].depth == 3);
    }
    CHECK(kvidx__check(ix) == 0);
    kvidx_destroy(ix);
  }
  printf("generations: %d passed, %d failed\n", checks - fails, fails);
  return fails != 0;
}
