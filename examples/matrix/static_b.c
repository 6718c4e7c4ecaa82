/* matrix/static_b.c - a second private copy; linking it with static_a.c
 * proves KVIDX_STATIC copies do not clash. */
#define KVIDX_STATIC
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include "smoke.h"

int static_b_smoke(void);
int static_b_smoke(void) { return kvidx_matrix_smoke(); }
