/* bench/walk_floor.h - a second, private copy of kvidx whose query walk
 * counts its steps (KVIDX_TEST_WALK), for kvidx-bench --walk-floor.  The
 * copy is compiled apart (bench/walk_floor.c, KVIDX_STATIC), so the timed
 * replays of kvidx-bench run the library exactly as a user builds it. */
#ifndef KVIDX_BENCH_WALK_FLOOR_H
#define KVIDX_BENCH_WALK_FLOOR_H
#include <stddef.h>
#include <stdint.h>
#include "../kvidx.h"

/* One query's walk: each is a dependent step (its address comes from the
 * step before it). */
typedef struct {
  uint32_t probes;      /* child-map probes (the root's, and below runs) */
  uint32_t runs_probed; /* runs read that a probe found                   */
  uint32_t runs_hinted; /* runs read that a run's hint named             */
  uint64_t blocks;      /* blocks the query matched in the runs it read  */
} walk_count;

/* The copy's entry points (the public API's, and find_matches counting
 * into *wc). */
typedef struct {
  int (*create)(kvidx **out, const kvidx_config *cfg);
  void (*destroy)(kvidx *ix);
  int (*store)(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq, const kvidx_block *b,
               size_t n);
  int (*remove)(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *seq, size_t n);
  int (*clear)(kvidx *ix, uint64_t worker_id, uint32_t dp_rank);
  int (*stats)(const kvidx *ix, kvidx_stats *st);
  size_t (*find)(const kvidx *ix, const uint64_t *locals, size_t n, kvidx_score *out, size_t cap, walk_count *wc);
} walk_floor_api;

const walk_floor_api *walk_floor_copy(void);
#endif
