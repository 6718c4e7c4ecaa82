/* matrix/nomalloc.c - built with KVIDX_NO_MALLOC and/or KVIDX_NO_THREADS:
 * implementation and smoke test (caller-buffer mode) in one TU; nm on its
 * object shows which allocator / pthread symbols it references. */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include "smoke.h"
#include <stdio.h>

int main(void) {
  int line = kvidx_matrix_smoke();
  if (line) {
    printf("matrix smoke FAILED at smoke.h:%d\n", line);
    return 1;
  }
  printf("matrix smoke ok\n");
  return 0;
}
