/* matrix/user.c - the second TU: includes the header only, runs the smoke
 * test against the implementation linked from impl.c. */
#include "kvidx.h"
#include "smoke.h"
#include <stdio.h>

int main(void) {
  int line = kvidx_matrix_smoke();
  if (line) {
    printf("matrix smoke FAILED at smoke.h:%d\n", line);
    return 1;
  }
  printf("matrix smoke ok (kvidx %s)\n", kvidx_version());
  return 0;
}
