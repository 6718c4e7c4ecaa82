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

/* Grow-only arrays (four segments of each size): every element has its own
 * address inside one segment, a span is refused exactly when it crosses a
 * segment's end, the capacity allocated ahead of need is less than the last
 * segment and, past the first few, under a quarter of the whole (plain
 * doubling left up to half), and the bytes come and go through the index's
 * accounting.  The number of failed checks. */
int t_grow_layout(void) {
  kvidx_config cfg;
  kvidx *ix;
  kvidx__grow g;
  kvidx_stats st0, st;
  uint64_t need, i, start = 0, bytes = 0;
  unsigned k;
  int fails = 0;
  memset(&cfg, 0, sizeof cfg);
  if (kvidx_create(&ix, &cfg) != KVIDX_OK) return 1;
  kvidx_get_stats(ix, &st0);
  memset(&g, 0, sizeof g);
  g.es = 8;
  g.shift0 = 3;
  for (need = 1; need <= 5000; need += 1 + need / 8) {
    uint64_t last;
    if (kvidx__grow_reserve(ix, &g, need) != KVIDX_OK) {
      fails++;
      break;
    }
    last = kvidx__seg_elems(&g, g.nseg - 1);
    fails += g.cap < need || g.cap - need >= last;
    fails += g.cap >= 16 * 8 && (g.cap - need) * 4 >= g.cap;
  }
  for (i = 0; i < g.cap; i++) {
    uint64_t *p = (uint64_t *)kvidx__grow_get(&g, i, 1, 0);
    if (!p) fails++;
    else *p = i;
  }
  for (i = 0; i < g.cap; i++) {
    uint64_t *p = (uint64_t *)kvidx__grow_get(&g, i, 1, 1);
    fails += !p || *p != i;
  }
  for (k = 0; k < g.nseg; k++) {
    uint64_t n = kvidx__seg_elems(&g, k);
    fails += kvidx__grow_get(&g, start, n, 0) == NULL;
    fails += kvidx__grow_get(&g, start + 1, n, 0) != NULL; /* ends one past the segment */
    start += n;
    bytes += n * g.es;
  }
  fails += start != g.cap || kvidx__grow_get(&g, g.cap, 1, 0) != NULL;
  kvidx_get_stats(ix, &st);
  fails += st.bytes != st0.bytes + bytes;
  kvidx__grow_drop(ix, &g);
  kvidx_get_stats(ix, &st);
  fails += st.bytes != st0.bytes;
  kvidx_destroy(ix);
  return fails;
}
