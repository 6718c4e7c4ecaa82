/* matrix/static_a.c - KVIDX_STATIC: a private copy of kvidx in this TU. */
#define KVIDX_STATIC
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include "smoke.h"
#include <stdio.h>

int static_b_smoke(void);

int main(void) {
  int a = kvidx_matrix_smoke(), b = static_b_smoke();
  if (a || b) {
    printf("static smoke FAILED at smoke.h:%d / %d\n", a, b);
    return 1;
  }
  printf("matrix smoke ok (two static copies)\n");
  return 0;
}
