/* Compile check: a second TU that only includes the header and links. */
#include "kvidx.h"
#include <stdio.h>
#include <string.h>
int main(void) {
  kvidx_config cfg;
  kvidx *ix;
  kvidx_block b = {42, 42};
  kvidx_score sc[4];
  memset(&cfg, 0, sizeof cfg);
  cfg.kind = KVIDX_POSITIONAL;
  if (kvidx_create(&ix, &cfg) != KVIDX_OK) return 1;
  if (kvidx_store(ix, 7, 0, NULL, &b, 1) != KVIDX_OK) return 2;
  if (kvidx_find_matches(ix, &b.local, 1, sc, 4) != 1 || sc[0].worker_id != 7) return 3;
  kvidx_destroy(ix);
  printf("two-TU build ok (kvidx %s)\n", kvidx_version());
  return 0;
}
