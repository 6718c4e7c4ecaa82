/* The one implementation TU of the core tests. */
#define KVIDX_IMPLEMENTATION
#include "testutil.h"

int t_fails, t_checks;

void *t_alloc(void *ctx, size_t n) {
  t_alloc_ctx *c = (t_alloc_ctx *)ctx;
  if (c->fail_at >= 0 && c->calls++ >= c->fail_at) return NULL;
  if (c->fail_at < 0) c->calls++;
  c->live++;
  c->bytes += n;
  return malloc(n);
}
void t_free(void *ctx, void *p, size_t n) {
  t_alloc_ctx *c = (t_alloc_ctx *)ctx;
  c->live--;
  c->bytes -= n;
  free(p);
}
