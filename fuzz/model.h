/* model.h - a second, deliberately naive model of kvidx's semantics, for
 * fuzz_ops: plain arrays, linear scans and binary searches, written from the SEMANTICS
 * section of kvidx.h's top comment only (not from the KVIDX_REFERENCE code),
 * so that a semantic mistake mirrored in the reference kind and the indexes
 * (they share macros and helpers) still shows up as a difference.
 *
 * Covers: stores (parents, re-stores, chaining), removals (no cascade,
 * unknown seqs -> KVIDX_ENOENT), clear, remove_worker, find_matches (depth,
 * order, count, cap), worker_blocks, blocks / workers counts, and the two
 * semantic caps (max_blocks, max_workers: KVIDX_EFULL, nothing changed).
 * Not covered (fuzz_ops does not consult the model there): eviction and TTL
 * (their order is defined outside SEMANTICS), tiers, event ids. */
#ifndef FUZZ_MODEL_H
#define FUZZ_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvidx.h"

typedef struct fm_model fm_model;

/* max_blocks 0 = unlimited; max_workers 0 = 1024 (kvidx's default). NULL if
 * out of memory. */
fm_model *fm_create(size_t max_blocks, uint32_t max_workers);
void fm_destroy(fm_model *m);
int fm_store(fm_model *m, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq,
             const kvidx_block *b, size_t n);
int fm_remove(fm_model *m, uint64_t worker_id, uint32_t dp_rank, const uint64_t *seqs, size_t n);
int fm_clear(fm_model *m, uint64_t worker_id, uint32_t dp_rank);
int fm_remove_worker(fm_model *m, uint64_t worker_id);
size_t fm_find_matches(fm_model *m, const uint64_t *locals, size_t n, kvidx_score *out, size_t cap);
size_t fm_worker_blocks(const fm_model *m, uint64_t worker_id, uint32_t dp_rank);
size_t fm_blocks(const fm_model *m);
size_t fm_workers(const fm_model *m); /* workers holding >= 1 block */
int fm_check(const fm_model *m);       /* 0 if the running totals add up */

#endif
