/* vllm_decode.h - vLLM KV-event batches -> kvidx_apply, without ZeroMQ.
 *
 * Shared by the daemon (kvidx_vllm.c) and the fuzz target
 * (fuzz/fuzz_vllm_decode.c).  Decodes one msgpack EventBatch with its own
 * bounded msgpack reader (no allocation from a declared length: every
 * declared length or element count is checked against the bytes left), turns
 * each event into a kvidx_event and applies it.  See README.md for what is
 * done with each vLLM field. */
#ifndef VLLM_DECODE_H
#define VLLM_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "../../kvidx.h"

typedef struct {
  unsigned long long batches, events, stored, removed, cleared, skipped,
      ignored, errors, enoparent, enoent, efull, malformed, gaps, restarts,
      duplicates, unresolved, untracked, offloaded;
} vd_counters;

typedef struct vd_ident vd_ident;
typedef struct vd_wstate vd_wstate;

typedef void (*vd_log_fn)(void *ctx, const char *msg);

typedef struct {
  kvidx *ix;
  size_t block_size;  /* the device block size (queries use it too)        */
  int all_groups;     /* keep every KV cache group                         */
  size_t max_idents;  /* identity table bound (blocks remembered)          */
  size_t offload_factor; /* device blocks per offloaded block when an
                            offload event says block_size 0 (newest vLLM) */
  vd_counters c;
  vd_log_fn log;
  void *log_ctx;
  /* engine hash -> identity, per (worker, dp rank, group) */
  vd_ident *tab;
  size_t tab_cap, tab_n;
  int overflowed;     /* a store was not remembered: removals pass unknown hashes */
  vd_wstate *ws;
  size_t ws_n;
  /* scratch */
  uint32_t *tok;
  size_t tok_cap;
  uint64_t *u64, *u64b;
  size_t u64_cap, u64b_cap;
  kvidx_block *blk;
  size_t blk_cap;
  unsigned char *kbuf;
  size_t kbuf_cap;
  char *name;
  size_t name_cap;
} vd_state;

/* Event ids: event i of batch seq is seq << VD_EV_SHIFT | i; the batch's end
 * marker (an empty Removed) is seq << VD_EV_SHIFT | VD_EV_END. */
#define VD_EV_SHIFT 24
#define VD_EV_END ((1u << VD_EV_SHIFT) - 1)
#define VD_MAX_SEQ ((uint64_t)1 << 40)

/* Limits on untrusted input (a message past one is malformed). */
#define VD_MAX_MSG (64u << 20)   /* payload bytes                           */
#define VD_MAX_DEPTH 16          /* msgpack nesting                         */
#define VD_MAX_BLOCK_SIZE (1u << 20)

int vd_init(vd_state *s, kvidx *ix, size_t block_size, size_t max_idents);
void vd_free(vd_state *s);

/* The dp rank a payload declares (0 if none); -1 if the payload is not a
 * batch. */
long vd_batch_dp(const unsigned char *p, size_t len);

/* Applies one batch (payload p, len bytes) published as `seq` by the
 * endpoint filed as worker `wid`.  fresh: the first batch since the daemon
 * (re)connected to that publisher.  The stream generation is derived here:
 * seq returning to 0, or a fresh connection whose seq is below the last one,
 * starts a new generation (the publisher restarted).  Returns 0 applied,
 * 1 duplicate batch (already applied), -1 malformed (nothing applied). */
int vd_batch(vd_state *s, const unsigned char *p, size_t len, uint64_t seq,
             uint64_t wid, int fresh);

/* Forgets what the decoder remembers for a worker (after a clear it did not
 * see as an event, e.g. the daemon's fallback when a gap cannot be healed). */
void vd_forget(vd_state *s, uint64_t wid, uint32_t dp);

/* Rebuilds the identity table from the index (after a snapshot load). */
int vd_rebuild(vd_state *s);

/* For tests: 0 when the identity table is consistent (count, bound, every
 * identity findable and holding a copy on some tier). */
int vd_check(const vd_state *s);

/* ---- queries -------------------------------------------------------------
 * Local block hashes of a prompt as the decoder computes them for stored
 * blocks: seed from the LoRA (name, or id for vLLM before lora_name), and
 * per block the extra keys vLLM hashes (multimodal items, cache salt, prompt
 * embeds hashes), folded into that block's seed.  Returns the block count. */
typedef struct {
  const char *id;        /* mm identifier (hash string)          */
  uint64_t offset, length; /* placeholder tokens in the prompt   */
} vd_mm;
typedef struct {
  const char *lora_name; /* NULL: none                           */
  int has_lora_id;
  uint64_t lora_id;
  const char *salt;      /* cache_salt, NULL: none               */
  const vd_mm *mm;
  size_t n_mm;
  const unsigned char *const *pe; /* per block prompt-embeds hash (32 bytes) or NULL */
  size_t n_pe;
} vd_query;
size_t vd_query_locals(vd_state *s, const uint32_t *tok, size_t n, const vd_query *q,
                       uint64_t *out);

#endif
