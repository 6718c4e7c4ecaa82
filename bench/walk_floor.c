/* bench/walk_floor.c - see walk_floor.h.  This translation unit holds its
 * own static copy of the implementation, its walk reporting each step. */
#define KVIDX_STATIC
#define KVIDX_IMPLEMENTATION
#include <stddef.h>
#include <stdint.h>

static uint32_t wf_probes, wf_probed, wf_hinted;
static uint64_t wf_blocks;
#define KVIDX_TEST_WALK(ix, step, blocks)                                                                    \
  ((void)(ix), (step) == 0   ? (void)wf_probes++                                                            \
               : (step) == 1 ? (void)wf_probed++                                                            \
               : (step) == 2 ? (void)wf_hinted++                                                            \
                             : (void)0, /* 3: between the passes that order a set of workers */             \
   (void)(wf_blocks += (blocks)))
#include "walk_floor.h"

static size_t wf_find(const kvidx *ix, const uint64_t *locals, size_t n, kvidx_score *out, size_t cap,
                      walk_count *wc) {
  size_t m;
  wf_probes = wf_probed = wf_hinted = 0;
  wf_blocks = 0;
  m = kvidx_find_matches(ix, locals, n, out, cap);
  wc->probes = wf_probes;
  wc->runs_probed = wf_probed;
  wc->runs_hinted = wf_hinted;
  wc->blocks = wf_blocks;
  return m;
}

static const walk_floor_api wf_api = {kvidx_create, kvidx_destroy, kvidx_store, kvidx_remove,
                                      kvidx_clear,  kvidx_get_stats, wf_find};

const walk_floor_api *walk_floor_copy(void) { return &wf_api; }
