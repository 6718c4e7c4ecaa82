/* kvidx.h - v0.1.0 - KV-block index for LLM routers - public domain / MIT
 *
 * A global index of the KV-cache blocks held by every worker of an LLM
 * inference fleet, fed by KV events (Stored / Removed / Cleared) and queried
 * on every request: for each worker, how many leading blocks of this prompt
 * does it hold?  Compatible with NVIDIA Dynamo's hashing and semantics.
 *
 * USAGE
 *   In exactly one C or C++ file:
 *       #define KVIDX_IMPLEMENTATION
 *       #include "kvidx.h"
 *   Everywhere else include "kvidx.h" alone.  Needs xxhash.h (Debian:
 *   libxxhash-dev) on the include path at build time only: it is inlined under
 *   a private namespace, so no xxhash library is linked and an application's
 *   own copy of xxHash cannot clash.
 *
 * QUICK TOUR
 *       kvidx_config cfg = {0};                 // zero = working defaults
 *       cfg.kind = KVIDX_POSITIONAL;            // or KVIDX_RADIX, KVIDX_REFERENCE
 *       kvidx *ix;  kvidx_create(&ix, &cfg);
 *       uint64_t loc[4], seq[4];
 *       size_t n = kvidx_block_hashes(tokens, n_tokens, 16, KVIDX_SEED, loc);
 *       kvidx_seq_hashes(loc, n, seq);
 *       kvidx_block b[4]; for (i..n) b[i].local = loc[i], b[i].seq = seq[i];
 *       kvidx_store(ix, worker_id, dp_rank, NULL, b, n);   // Stored event
 *       kvidx_score sc[16];
 *       size_t m = kvidx_find_matches(ix, loc, n, sc, 16); // per-worker depth
 *       kvidx_destroy(ix);
 *
 * OPTIONS (define before including the implementation; one place for all)
 *   KVIDX_STATIC          all functions static (private copy per TU).
 *   KVIDX_NO_MALLOC       no malloc/free referenced at all: kvidx_create needs
 *                         cfg->alloc/cfg->free, or use kvidx_init_buffer.
 *   KVIDX_MALLOC(sz) / KVIDX_FREE(p)  default allocator (malloc/free).
 *   KVIDX_NO_THREADS      single-threaded build: plain loads/stores instead of
 *                         atomics; no concurrent readers allowed.
 *   KVIDX_WORKERS_MAX     hard upper bound of cfg.max_workers (default 4096);
 *                         query scratch bitsets live on the stack.
 *   KVIDX_JUMP_MAX        upper bound of cfg.jump (default 256).
 *   KVIDX_TEST_HOOK(ix, where)  test-only: called inside writer critical
 *                         sections (deterministic interleaving tests).
 *
 * SEMANTICS (the reference model, kind KVIDX_REFERENCE, is the definition)
 *   A worker is (worker_id u64, dp_rank u32).  Stored(worker, parent, blocks):
 *   block 0's parent is `parent` (a seq hash the worker holds; NULL = root),
 *   block i's parent is block i-1.  Each new block gets a canonical chain hash
 *   chain = parent ? kvidx_seq_hash_next(chain(parent), local) : local.  The
 *   engine's seq hash is only a per-worker key (for parents and removals), so
 *   engines with opaque seq hashes still match exactly.
 *   - Unknown parent: KVIDX_ENOPARENT, nothing changes.
 *   - Re-storing a seq the worker holds leaves that block as it is (no error);
 *     the next block of the run then chains from that held block.
 *   - Removed(worker, seqs): no cascade; descendants stay held, so the
 *     worker's score stops at the hole.  Unknown seqs are skipped and counted:
 *     KVIDX_ENOENT after the known ones are removed.
 *   - Cleared(worker): the worker holds nothing (unknown worker: KVIDX_OK).
 *     remove_worker(id): every dp_rank of id.
 *   - find_matches(locals): query chains q_i; a worker's score is the largest
 *     k with the worker holding chains q_0..q_{k-1}; only k >= 1 reported,
 *     sorted by depth desc, then worker_id, then dp_rank ascending.
 *     Chains are 64-bit hashes and stand for whole prefixes: every kind
 *     agrees with the reference up to a chain collision (e.g. a crafted
 *     local hash equal to another prefix's chain), which XXH3 makes
 *     vanishingly rare for real token blocks.
 *   - Capacity: cfg.max_blocks bounds (worker, block) holdings, cfg.max_workers
 *     the workers holding >= 1 block: both are semantic (every kind refuses
 *     the same stores with KVIDX_EFULL).  cfg.max_entries bounds the index's
 *     own entries (radix nodes / positional entries): a memory cap that can
 *     refuse earlier than max_blocks for some kinds.  On any error nothing
 *     changed.  With cfg.evict set, a store that would pass max_blocks first
 *     prunes by the policy (every refusal is decided before that).
 *
 * KINDS: which to choose
 *   KVIDX_RADIX       tree of nodes, one per chain, children found through a
 *                     hash of (parent, local).  Queries walk node by node and
 *                     never hash; robust for short prompts and tiny fleets.
 *   KVIDX_POSITIONAL  Dynamo's Flash Indexer made exact: entries keyed by
 *                     (position, local) with the chain verified; jump search
 *                     (cfg.jump, default 16, doubling while every worker
 *                     stays) with binary-searched drain points.  Fastest on
 *                     long shared prefixes (the common case); default choice.
 *   KVIDX_REFERENCE   the naive nested-map model that defines the semantics:
 *                     a correctness oracle for your own tests.  Slow.
 *
 * PRODUCTION EVENTS (see the declarations for details)
 *   kvidx_apply(ix, &ev)       one engine event with its id: gaps (KVIDX_GAP,
 *                              ask for a replay), duplicates (ignored), ids
 *                              going backwards (engine restart: old blocks
 *                              dropped first), storage tiers (a host-tier
 *                              Removed keeps the device copy).
 *   kvidx_find_matches_tiered  depth on any tier + device blocks per worker.
 *   cfg.evict, cfg.max_blocks  bounded memory: refuse (EFULL), or prune least
 *                              recently stored first (deepest first), or by
 *                              earliest expiry (approximate/TTL mode:
 *                              kvidx_store_ttl, kvidx_expire(ix, now)).
 *   kvidx_dump / kvidx_snapshot_write / kvidx_snapshot_read
 *                              rebuild the holdings in a fresh index of any
 *                              kind (warm restart of a router).
 *
 * THREADING
 *   See the "concurrency" section below the API for the full contract.
 *   Short form: any number of threads may call kvidx_find_matches at any time;
 *   writer calls (store/remove/clear/remove_worker) for one worker come from
 *   one thread at a time, writer calls for different workers may come from
 *   different threads at once (they serialize internally on a short spinlock).
 *   create/destroy/init_buffer need exclusive access.  KVIDX_REFERENCE and
 *   KVIDX_NO_THREADS builds allow no concurrency at all.
 *
 * CHANGELOG
 *   0.1.0  first release: hashing, reference model, radix and positional
 *          indexes, caller-buffer mode, seqlock reader path, event ids,
 *          storage tiers, eviction policies and TTL mode, dumps and binary
 *          snapshots.
 *
 * LICENSE: MIT or public domain, your choice.
 */
#ifndef KVIDX_H
#define KVIDX_H

#include <stddef.h>
#include <stdint.h>

#define KVIDX_VERSION_MAJOR 0
#define KVIDX_VERSION_MINOR 1
#define KVIDX_VERSION_PATCH 0
#define KVIDX_VERSION_NUMBER                                                   \
  (KVIDX_VERSION_MAJOR * 10000 + KVIDX_VERSION_MINOR * 100 + KVIDX_VERSION_PATCH)

#ifdef KVIDX_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define KVIDX_API static __attribute__((unused)) /* a TU may use only a few */
#else
#define KVIDX_API static
#endif
#else
#define KVIDX_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes: 0 is success, errors are negative ------------------ */
enum {
  KVIDX_OK = 0,
  KVIDX_EINVAL = -1,    /* bad argument (NULL pointer, bad config, ...)    */
  KVIDX_ENOMEM = -2,    /* allocation hook failed; nothing changed         */
  KVIDX_EFULL = -3,     /* max_blocks / max_workers / max_entries reached  */
  KVIDX_ENOPARENT = -4, /* Stored with a parent the worker does not hold   */
  KVIDX_ENOENT = -5,    /* Removed named seqs the worker does not hold     */
  KVIDX_ENOTSUP = -6,   /* operation not supported by this kind / mode     */
  KVIDX_EAGAIN = -7,    /* a reader met a write in progress for too long:
                           the answer may miss depth; ask again           */
  KVIDX_ECORRUPT = -8,  /* snapshot: bad magic, record or checksum         */
  KVIDX_EVERSION = -9,  /* snapshot: format version this build cannot read */
  KVIDX_ETRUNCATED = -10, /* snapshot: input ended early                   */
  KVIDX_EIO = -11,      /* a caller callback reported an error             */
  /* kvidx_apply's informational results (the event was handled): */
  KVIDX_GAP = 1,        /* applied; event ids were skipped: ask for replay */
  KVIDX_RESTARTED = 2,  /* id went backwards: the worker's old blocks were
                           dropped (engine restart), then it was applied  */
  KVIDX_DUPLICATE = 3   /* id already seen: ignored                        */
};

/* Dynamo's hash seed. */
#define KVIDX_SEED 1337u

/* ---- hashing: Dynamo's contract, byte for byte --------------------------
 * local hash  = XXH3-64(tokens as u32 little endian, seed)   (full blocks)
 * seq[0]      = local[0];  seq[i] = XXH3-64(le64(seq[i-1]) || le64(local[i]), 1337)
 * salted seed = 1337 + XXH3-64(lora, 0) [if non-empty] + XXH3-64(ns, 1) [if non-empty] */
KVIDX_API uint64_t kvidx_hash_seed(const char *lora_name, const char *namespace_);
KVIDX_API uint64_t kvidx_block_hash(const uint32_t *tokens, size_t n_tokens,
                                    uint64_t seed);
/* Hashes the n_tokens / block_size full blocks (block_size 0: none); returns
 * how many were written to out_local.  The partial tail is not hashed. */
KVIDX_API size_t kvidx_block_hashes(const uint32_t *tokens, size_t n_tokens,
                                    size_t block_size, uint64_t seed,
                                    uint64_t *out_local);
KVIDX_API uint64_t kvidx_seq_hash_next(uint64_t parent_seq, uint64_t local);
KVIDX_API void kvidx_seq_hashes(const uint64_t *local, size_t n,
                                uint64_t *out_seq);

/* ---- the index ---------------------------------------------------------- */
typedef struct kvidx kvidx;

typedef enum {
  KVIDX_RADIX = 0,
  KVIDX_POSITIONAL = 1,
  KVIDX_REFERENCE = 2
} kvidx_kind;

typedef struct {
  uint64_t local, seq;
} kvidx_block;

typedef struct {
  uint64_t worker_id;
  uint32_t dp_rank;
  uint32_t depth;
} kvidx_score;

/* Storage tiers of a block (vLLM's "medium"); see kvidx_tier_from_name. */
enum { KVIDX_TIER_DEVICE = 0, KVIDX_TIER_HOST = 1, KVIDX_TIER_DISK = 2, KVIDX_TIER_ALL = 255 };

/* Eviction policies for a bounded index (cfg.evict; needs cfg.max_blocks). */
enum {
  KVIDX_EVICT_NONE = 0,  /* a store past max_blocks fails with KVIDX_EFULL     */
  KVIDX_EVICT_LRS = 1,   /* prune least recently stored blocks first (within
                            one store, its last blocks first: children before
                            parents) down to evict_target_pct of max_blocks   */
  KVIDX_EVICT_EXPIRY = 2 /* approximate (TTL) mode: blocks carry an expiry;
                            kvidx_expire drops them; pruning takes the earliest
                            expiry first (no expiry = last; among equals the
                            newest first, so children go before parents)     */
};

/* Allocation hooks: all memory goes through them (or KVIDX_MALLOC/FREE). */
typedef void *(*kvidx_alloc_fn)(void *ctx, size_t size);
typedef void (*kvidx_free_fn)(void *ctx, void *ptr, size_t size);

/* A config that is zero except .kind works: heap mode, growing capacity,
 * 1,024 worker slots. */
typedef struct {
  int kind;             /* kvidx_kind                                        */
  uint32_t max_workers; /* worker slots (bitset width); 0 = 1024             */
  size_t max_blocks;    /* most (worker, block) holdings; 0 = unlimited in
                           heap mode, KVIDX_BUFFER_DEFAULT_BLOCKS in buffer  */
  size_t max_entries;   /* most index entries; 0 = unlimited (heap) or
                           max_blocks (buffer mode)                          */
  uint32_t jump;        /* positional jump size, 1..KVIDX_JUMP_MAX; 0 = 16   */
  uint32_t flags;       /* KVIDX_F_*                                         */
  kvidx_alloc_fn alloc; /* NULL = KVIDX_MALLOC                               */
  kvidx_free_fn free;   /* NULL = KVIDX_FREE (must be set iff alloc is)      */
  void *alloc_ctx;
  int evict;            /* KVIDX_EVICT_*; 0 = none (needs max_blocks)        */
  uint32_t evict_target_pct; /* prune down to this % of max_blocks; 0 = 80  */
} kvidx_config;

#define KVIDX_BUFFER_DEFAULT_BLOCKS 65536u
/* cfg.flags: KVIDX_F_TIERS tracks host and disk copies (a second bitset per
 * entry).  Without it the index holds device copies only: a Stored event on
 * another tier is refused with KVIDX_ENOTSUP, and the tiered query reports
 * every matched block as a device block. */
#define KVIDX_F_TIERS 1u

KVIDX_API int kvidx_create(kvidx **out, const kvidx_config *cfg);
/* Caller-buffer mode: size needed for cfg (0 if cfg is invalid or the kind
 * has no buffer mode), then init in a buffer of that many bytes (any
 * alignment).  Nothing is allocated, ever. */
KVIDX_API size_t kvidx_buffer_size(const kvidx_config *cfg);
KVIDX_API int kvidx_init_buffer(kvidx **out, const kvidx_config *cfg,
                                void *mem, size_t len);
KVIDX_API void kvidx_destroy(kvidx *ix);

/* Events.  Every call returns a status; on error nothing changed (except
 * KVIDX_ENOENT from kvidx_remove, which removed the known seqs). */
KVIDX_API int kvidx_store(kvidx *ix, uint64_t worker_id, uint32_t dp_rank,
                          const uint64_t *parent_seq, const kvidx_block *b,
                          size_t n);
KVIDX_API int kvidx_remove(kvidx *ix, uint64_t worker_id, uint32_t dp_rank,
                           const uint64_t *seq, size_t n);
KVIDX_API int kvidx_clear(kvidx *ix, uint64_t worker_id, uint32_t dp_rank);
KVIDX_API int kvidx_remove_worker(kvidx *ix, uint64_t worker_id);

/* Queries.  Returns how many workers match (may exceed cap); writes the best
 * min(that, cap) to out, sorted by depth desc, worker_id asc, dp_rank asc.
 * Allocates nothing; 0 for a NULL ix. */
KVIDX_API size_t kvidx_find_matches(const kvidx *ix, const uint64_t *locals,
                                    size_t n, kvidx_score *out, size_t cap);
/* The same with a status: KVIDX_OK, KVIDX_EINVAL, or KVIDX_EAGAIN when a
 * probe could not read a consistent entry within its retry bound (a writer
 * stalled mid-update for about a second); *total = workers matched. */
KVIDX_API int kvidx_find_matches_ex(const kvidx *ix, const uint64_t *locals, size_t n,
                                    kvidx_score *out, size_t cap, size_t *total);
KVIDX_API size_t kvidx_worker_blocks(const kvidx *ix, uint64_t worker_id,
                                     uint32_t dp_rank);

typedef struct {
  size_t blocks;      /* (worker, block) holdings                          */
  size_t workers;     /* workers holding >= 1 block                        */
  size_t entries;     /* index entries (radix nodes / positional entries)  */
  size_t bytes;       /* bytes allocated now (heap) or buffer size (buffer)*/
  size_t peak_bytes;  /* most bytes allocated at once                      */
} kvidx_stats;
KVIDX_API int kvidx_get_stats(const kvidx *ix, kvidx_stats *out);

/* ---- production event handling ------------------------------------------
 * One call applies one engine event and tracks event ids per worker:
 *   first event of a worker: any id;  id == last + 1: applied, KVIDX_OK;
 *   id > last + 1: applied, KVIDX_GAP (ask the engine for a replay);
 *   id == last: ignored, KVIDX_DUPLICATE;
 *   id < last: the engine restarted (as Dynamo reads a stream going
 *   backwards): its old blocks are dropped, then the event is applied,
 *   KVIDX_RESTARTED.  A replay of older ids therefore counts as a restart.
 * An error wins over GAP / RESTARTED in the status (kvidx_last_event_id tells
 * where the stream stands).  Ids and errors:
 *   KVIDX_EINVAL / KVIDX_ENOTSUP (a malformed event): nothing happens.
 *   KVIDX_ENOPARENT / KVIDX_ENOENT (the event does not fit the index: ask for
 *   a resync): the id is used up, so the next event is not a false gap.
 *   KVIDX_ENOMEM / KVIDX_EFULL (resources): the id is not used up, retry the
 *   same event; after a restart the drop stands and the worker starts afresh.
 * Ids are kept for workers holding blocks and, space permitting, for others
 * (the table has 2 x max_workers places; the ids of empty workers are
 * forgotten when it fills, and their next event counts as a first).
 * Cleared drops only that (worker, dp_rank). */
enum { KVIDX_EV_STORED = 1, KVIDX_EV_REMOVED = 2, KVIDX_EV_CLEARED = 3 };
typedef struct {
  uint64_t event_id;
  uint64_t worker_id;
  uint32_t dp_rank;
  int type;                  /* KVIDX_EV_*                                   */
  int tier;                  /* KVIDX_TIER_*: Stored adds the block on this
                                tier (non-device tiers need KVIDX_F_TIERS);
                                Removed drops only this tier's copy
                                (KVIDX_TIER_ALL: every copy)                  */
  const uint64_t *parent;    /* Stored: parent seq, NULL = root              */
  const kvidx_block *blocks; /* Stored                                       */
  const uint64_t *seqs;      /* Removed                                      */
  size_t n;                  /* blocks or seqs                               */
  uint64_t expires_at;       /* Stored, KVIDX_EVICT_EXPIRY: 0 = never        */
} kvidx_event;
KVIDX_API int kvidx_apply(kvidx *ix, const kvidx_event *ev);
/* Last event id seen for a worker: KVIDX_OK, or KVIDX_ENOENT if none. */
KVIDX_API int kvidx_last_event_id(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank, uint64_t *out);
/* Case-insensitive: "cpu", "host", "cpu_pinned", "pinned", "dram" -> HOST;
 * "disk", "ssd", "nvme", "local_disk", "storage" -> DISK; "GPU", "cuda",
 * NULL, empty and any other name -> DEVICE (what engines that send no
 * medium mean).  Check unknown media yourself if that default is wrong for
 * your engine. */
KVIDX_API int kvidx_tier_from_name(const char *medium);

/* Approximate mode (cfg.evict = KVIDX_EVICT_EXPIRY): the router records its
 * own routing decisions with an expiry it chooses; the library never reads
 * a clock.  Re-storing a held block extends its expiry (never shortens it).
 * kvidx_expire drops every block with expires_at <= now. */
KVIDX_API int kvidx_store_ttl(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq,
                              const kvidx_block *b, size_t n, uint64_t expires_at);
KVIDX_API int kvidx_expire(kvidx *ix, uint64_t now, size_t *removed);

/* Per worker: depth matched on any tier, and how many of those blocks are on
 * the device tier (for cost models that weigh device hits above host hits;
 * without KVIDX_F_TIERS every block is a device block).  Walks every matched
 * position (no jumps).  Same order and return value as kvidx_find_matches. */
typedef struct {
  uint64_t worker_id;
  uint32_t dp_rank;
  uint32_t depth;
  uint32_t device_blocks;
  uint32_t reserved_;
} kvidx_tier_score;
KVIDX_API size_t kvidx_find_matches_tiered(const kvidx *ix, const uint64_t *locals, size_t n,
                                           kvidx_tier_score *out, size_t cap);

/* ---- snapshots --------------------------------------------------------------
 * kvidx_dump: per worker, a sequence of single-block Stored events, parents
 * first (one per tier a block is on), then Removed events for stand-in
 * ancestors it had to invent where the worker has a hole, that rebuild the
 * same holdings in a fresh index of any kind.  emit returns 0 to go on; any
 * other value stops the dump with KVIDX_EIO.  Allocates scratch through the
 * hooks (KVIDX_ENOTSUP in caller-buffer mode and for KVIDX_REFERENCE).
 * kvidx_snapshot_write / _read: the same content as a binary stream
 * (versioned header with record count and length, little endian, XXH3-
 * checksummed chunks checked before they are applied: a stream's work and
 * memory are proportional to its length) plus each worker's last
 * event id, through caller callbacks.  read needs an empty target index; on
 * any error (KVIDX_ECORRUPT, KVIDX_EVERSION, KVIDX_ETRUNCATED, KVIDX_EIO, or
 * the target refusing a block) the target is left empty and valid.
 * Eviction recency restarts from load order; expiries are kept. */
typedef int (*kvidx_event_fn)(void *ctx, const kvidx_event *ev);
typedef int (*kvidx_write_fn)(void *ctx, const void *buf, size_t len); /* 0 = ok */
typedef size_t (*kvidx_read_fn)(void *ctx, void *buf, size_t len);    /* bytes read,
                                                  0 = end (short reads are fine) */
KVIDX_API int kvidx_dump(const kvidx *ix, kvidx_event_fn emit, void *ctx);
KVIDX_API int kvidx_snapshot_write(const kvidx *ix, kvidx_write_fn write, void *ctx);
KVIDX_API int kvidx_snapshot_read(kvidx *ix, kvidx_read_fn read, void *ctx);

KVIDX_API const char *kvidx_strerror(int status);
KVIDX_API const char *kvidx_version(void); /* "0.1.0" */

/* Invariant checker (rax style): 0 if every internal invariant holds, else a
 * negative line-number-like code.  O(size); for tests.  Not thread-safe. */
KVIDX_API int kvidx__check(const kvidx *ix);
/* Test hook for the deterministic interleaving test: find_matches that does
 * not retry; *retry = 1 when a probe met a write in progress (the answer is
 * then not to be used). */
KVIDX_API size_t kvidx__find_matches_once(const kvidx *ix, const uint64_t *locals, size_t n,
                                          kvidx_score *out, size_t cap, int *retry);

#ifdef __cplusplus
}
#endif
#endif /* KVIDX_H */

/* ========================================================================== */
/*                              IMPLEMENTATION                                */
/* ========================================================================== */
#ifdef KVIDX_IMPLEMENTATION
#ifndef KVIDX__IMPLEMENTED
#define KVIDX__IMPLEMENTED

#include <string.h>
#include <stdlib.h> /* qsort; malloc/free unless KVIDX_NO_MALLOC */

#ifndef KVIDX_WORKERS_MAX
#define KVIDX_WORKERS_MAX 4096
#endif
#ifndef KVIDX_JUMP_MAX
#define KVIDX_JUMP_MAX 256
#endif
#ifndef KVIDX_TEST_HOOK
#define KVIDX_TEST_HOOK(ix, where) ((void)0)
#endif
#if !defined(KVIDX_NO_MALLOC) && !defined(KVIDX_MALLOC)
#define KVIDX_MALLOC(sz) malloc(sz)
#define KVIDX_FREE(p) free(p)
#endif

#define KVIDX__NW_MAX ((KVIDX_WORKERS_MAX + 63) / 64)
#define KVIDX__DEFAULT_WORKERS 1024u
#define KVIDX__DEFAULT_JUMP 16u /* measured: bench/results/jump.md */
#define KVIDX__NONE 0xFFFFFFFFu   /* "no id": root parent, end of list      */
#define KVIDX__ID_LIMIT 0x7FFFFFF0u /* ids and pool sizes stay below this    */

#if defined(__cplusplus)
#define KVIDX__CAST(T, x) (static_cast<T>(x))
#define KVIDX__RCAST(T, x) (reinterpret_cast<T>(x))
#define KVIDX__MUT(x) (const_cast<kvidx *>(x)) /* readers load atomics only */
#else
#define KVIDX__CAST(T, x) ((T)(x))
#define KVIDX__RCAST(T, x) ((T)(x))
#define KVIDX__MUT(x) ((kvidx *)(x))
#endif

/* ---- atomics: one macro layer --------------------------------------------
 * C11 <stdatomic.h> in C, the same operations from <atomic> when the
 * implementation is compiled as C++, plain memory for KVIDX_NO_THREADS.
 * Readers use relaxed loads plus fences (Boehm, "Can seqlocks get along with
 * programming language memory models?"); every word a racing reader may load
 * is declared KVIDX__A(T).  ThreadSanitizer does not model standalone fences,
 * but every racing access is atomic, so TSan reports no race either way; the
 * fences are what make the seqlock correct on weakly ordered CPUs. */
#if defined(KVIDX_NO_THREADS)
#define KVIDX__YIELD() ((void)0)
#define KVIDX__A(T) T
#define kvidx__ld(p) (*(p))
#define kvidx__ld_acq(p) (*(p))
#define kvidx__st(p, v) (*(p) = (v))
#define kvidx__st_rel(p, v) (*(p) = (v))
#define kvidx__fence_acq() ((void)0)
#define kvidx__fence_rel() ((void)0)
#elif defined(__cplusplus)
#include <atomic>
#include <thread>
#define KVIDX__YIELD() std::this_thread::yield()
#define KVIDX__A(T) std::atomic<T>
#define kvidx__ld(p) std::atomic_load_explicit((p), std::memory_order_relaxed)
#define kvidx__ld_acq(p) std::atomic_load_explicit((p), std::memory_order_acquire)
#define kvidx__st(p, v) std::atomic_store_explicit((p), (v), std::memory_order_relaxed)
#define kvidx__st_rel(p, v) std::atomic_store_explicit((p), (v), std::memory_order_release)
#define kvidx__fence_acq() std::atomic_thread_fence(std::memory_order_acquire)
#define kvidx__fence_rel() std::atomic_thread_fence(std::memory_order_release)
#define kvidx__xchg_acq(p, v) std::atomic_exchange_explicit((p), (v), std::memory_order_acquire)
#else
#include <stdatomic.h>
#if !defined(__STDC_NO_THREADS__)
#include <threads.h>
#define KVIDX__YIELD() thrd_yield()
#else
#define KVIDX__YIELD() ((void)0)
#endif
#define KVIDX__A(T) _Atomic(T)
#define kvidx__ld(p) atomic_load_explicit((p), memory_order_relaxed)
#define kvidx__ld_acq(p) atomic_load_explicit((p), memory_order_acquire)
#define kvidx__st(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define kvidx__st_rel(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define kvidx__fence_acq() atomic_thread_fence(memory_order_acquire)
#define kvidx__fence_rel() atomic_thread_fence(memory_order_release)
#define kvidx__xchg_acq(p, v) atomic_exchange_explicit((p), (v), memory_order_acquire)
#endif

#ifdef KVIDX_STATIC
#define KVIDX_DEF KVIDX_API
#else
#define KVIDX_DEF
#endif
#define KVIDX__PRIV static

/* ========================================================================== */
/* 1. Hashing                                                                 */
/* ========================================================================== */
#define XXH_INLINE_ALL /* private static copy under the XXH_INLINE_ namespace */
#ifndef XXH_NO_STDLIB
#define XXH_NO_STDLIB /* kvidx never asks xxHash to allocate */
#endif
#ifdef KVIDX_NO_MALLOC /* xxHash's state allocators are unused: make them inert */
#define malloc(s) ((void)(s), (void *)0)
#define free(p) ((void)(p))
#endif
#include "xxhash.h"
#ifdef KVIDX_NO_MALLOC
#undef malloc
#undef free
#endif

KVIDX__PRIV int kvidx__little_endian(void) {
  const uint32_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

KVIDX__PRIV void kvidx__le64(unsigned char *p, uint64_t v) {
  int i;
  for (i = 0; i < 8; i++) p[i] = KVIDX__CAST(unsigned char, v >> (8 * i));
}

KVIDX_DEF uint64_t kvidx_hash_seed(const char *lora_name, const char *namespace_) {
  uint64_t s = KVIDX_SEED;
  if (lora_name && lora_name[0]) s += XXH3_64bits_withSeed(lora_name, strlen(lora_name), 0);
  if (namespace_ && namespace_[0]) s += XXH3_64bits_withSeed(namespace_, strlen(namespace_), 1);
  return s;
}

KVIDX_DEF uint64_t kvidx_block_hash(const uint32_t *tokens, size_t n_tokens, uint64_t seed) {
  if (!tokens) n_tokens = 0;
  if (kvidx__little_endian() || n_tokens == 0)
    return XXH3_64bits_withSeed(n_tokens ? tokens : NULL, n_tokens * 4, seed);
  { /* big endian: stream the tokens through a little-endian bounce buffer */
    XXH3_state_t st;
    unsigned char buf[256];
    size_t i = 0;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, seed);
    while (i < n_tokens) {
      size_t k, m = n_tokens - i < 64 ? n_tokens - i : 64;
      for (k = 0; k < m; k++) {
        uint32_t t = tokens[i + k];
        buf[4 * k] = KVIDX__CAST(unsigned char, t);
        buf[4 * k + 1] = KVIDX__CAST(unsigned char, t >> 8);
        buf[4 * k + 2] = KVIDX__CAST(unsigned char, t >> 16);
        buf[4 * k + 3] = KVIDX__CAST(unsigned char, t >> 24);
      }
      XXH3_64bits_update(&st, buf, 4 * m);
      i += m;
    }
    return XXH3_64bits_digest(&st);
  }
}

KVIDX_DEF size_t kvidx_block_hashes(const uint32_t *tokens, size_t n_tokens, size_t block_size,
                                    uint64_t seed, uint64_t *out_local) {
  size_t i, nb;
  if (!tokens || !out_local || block_size == 0) return 0;
  nb = n_tokens / block_size;
  for (i = 0; i < nb; i++) out_local[i] = kvidx_block_hash(tokens + i * block_size, block_size, seed);
  return nb;
}

KVIDX_DEF uint64_t kvidx_seq_hash_next(uint64_t parent_seq, uint64_t local) {
  unsigned char b[16];
  kvidx__le64(b, parent_seq);
  kvidx__le64(b + 8, local);
  return XXH3_64bits_withSeed(b, 16, KVIDX_SEED);
}

KVIDX_DEF void kvidx_seq_hashes(const uint64_t *local, size_t n, uint64_t *out_seq) {
  size_t i;
  if (!local || !out_seq || n == 0) return;
  out_seq[0] = local[0];
  for (i = 1; i < n; i++) out_seq[i] = kvidx_seq_hash_next(out_seq[i - 1], local[i]);
}

/* Bucket hash for the index's own tables (keys may be tiny in tests). */
KVIDX__PRIV uint64_t kvidx__mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/* ========================================================================== */
/* 2. Memory, worker slots and bitsets (shared by every kind)                */
/* ========================================================================== */

/* A record pool with a chained hash over it: used for the writer-side maps
 * (seq records, worker-entry records).  Records have stable 32-bit ids; the
 * pool may be reallocated because readers never look at it. */
typedef struct {
  uint32_t hnext; /* next id in bucket, KVIDX__NONE = end; free list link  */
  uint32_t slot;  /* owning worker slot; KVIDX__NONE = record is free      */
  uint64_t key;
} kvidx__rh;

typedef struct { /* (slot, seq) -> the block a worker holds              */
  kvidx__rh h;
  uint32_t entry;  /* index entry of the block                          */
  uint32_t parent; /* entry of its parent block, KVIDX__NONE = root     */
  uint32_t lnext, lprev; /* the worker's list of records (for Cleared)  */
  uint32_t tiers;  /* bit per KVIDX_TIER_* the worker holds it on       */
  uint32_t hpos;   /* position in the eviction heap                     */
  uint32_t er, pr; /* this worker's records of entry and parent (ids are
                      stable: both live at least as long as this one)   */
  uint64_t k1, k2; /* eviction order (min first); present only when
                      cfg.evict is set: the pool's record size says so  */
} kvidx__srec;
#define KVIDX__SREC_SMALL (offsetof(kvidx__srec, k1))

typedef struct { /* (slot, entry) -> how the worker relates to the entry   */
  kvidx__rh h;
  uint32_t mult;     /* seqs of this worker whose block is this entry      */
  uint32_t children; /* this worker's blocks whose parent is this entry    */
  uint32_t devmult;  /* of mult, those on the device tier                  */
} kvidx__erec;

typedef struct { /* per-worker event id tracking (kvidx_apply)            */
  uint64_t id, last;
  uint32_t rank, used;
} kvidx__evid;

typedef struct {
  unsigned char *recs;
  uint32_t *heads;
  size_t rec_size;
  uint32_t cap, hw, count, free_head, mask;
} kvidx__pool;

/* Reader-visible part of a worker slot plus the writer's bookkeeping. */
typedef struct {
  KVIDX__A(uint64_t) id;
  KVIDX__A(uint32_t) rank;
  KVIDX__A(uint32_t) epoch; /* slot_epoch when assigned: readers skip slots
                               reassigned during their query (6.)         */
  uint32_t used;
  size_t blocks;  /* holdings                                                */
  size_t orphans; /* held blocks whose parent chain the worker does not hold */
  uint32_t list;  /* newest srec, KVIDX__NONE = empty                        */
  uint32_t free_next;
} kvidx__slot;

/* Index entry: one per chain (radix node / positional entry), followed by
 * nw bitset words.  Type-stable: once allocated an entry is only ever reused
 * as an entry, so a racing reader always reads valid atomics (see 6.). */
typedef struct {
  KVIDX__A(uint32_t) ver;  /* seqlock: odd while the writer changes it     */
  KVIDX__A(uint32_t) next; /* hash chain, id + 1, 0 = end                  */
  KVIDX__A(uint32_t) hash; /* key hash: tells a reader the entry moved     */
  KVIDX__A(uint32_t) pos;  /* depth: 0 = child of the root                 */
  KVIDX__A(uint64_t) local;
  KVIDX__A(uint64_t) chain;
  KVIDX__A(uint32_t) parent; /* parent entry, KVIDX__NONE = root          */
  uint32_t refs;             /* writer-only: worker records naming it     */
  uint32_t kids;             /* writer-only: live child entries           */
  uint32_t fnext;            /* writer-only: free list link               */
} kvidx__ent;

typedef struct kvidx__tab {
  uint32_t mask;
  struct kvidx__tab *older; /* retired tables, freed at destroy (6.)      */
  size_t bytes;
} kvidx__tab; /* followed by mask + 1 atomic u32 bucket heads (id + 1) */
#define KVIDX__HEADS(t) (KVIDX__RCAST(KVIDX__A(uint32_t) *, (t) + 1))

#define KVIDX__CHUNKS 40
typedef struct kvidx__ref kvidx__ref;

struct kvidx {
  int kind;
  int buffer_mode;
  kvidx_alloc_fn alloc;
  kvidx_free_fn free;
  void *actx;
  size_t bytes, peak, buf_len, fixed_bytes;
  uint32_t max_workers, nw, jump, stride;
  size_t max_blocks, max_entries;
  /* worker slots */
  kvidx__slot *slots;
  uint32_t *slot_map; /* open addressing over slot ids (+1), keyed by worker */
  uint32_t slot_map_mask, slot_free, slots_used;
  KVIDX__A(uint32_t) slot_epoch; /* bumped when a slot is assigned (6.)   */
  KVIDX__A(uint32_t) nw_live;    /* bitset words that can hold a live slot:
                                    readers touch only these (slots are
                                    handed out lowest first)              */
  KVIDX__A(uint64_t) *holed; /* bitset: slots with orphans > 0 */
  size_t blocks;
  kvidx__pool S, E;
  /* entries */
  KVIDX__A(kvidx__tab *) tab;
  KVIDX__A(uint32_t) tab_ver;
  KVIDX__A(unsigned char *) chunks[KVIDX__CHUNKS];
  uint32_t cap0, shift0, ent_cap, ent_hw, ent_count, ent_free;
  KVIDX__A(int) wlock;
  kvidx__ref *ref;
  int tiers_on; /* KVIDX_F_TIERS: the device bitset exists */
  /* eviction (cfg.evict) */
  int evict;
  size_t evict_target;
  uint64_t stamp, seqno;
  uint32_t *heap; /* srec ids, min-heap on (k1, k2) */
  uint32_t heap_n, heap_cap;
  /* event ids */
  kvidx__evid *evtab;
  uint32_t evtab_mask, evtab_n;
};

KVIDX__PRIV void *kvidx__raw_alloc(kvidx_alloc_fn fn, void *ctx, size_t n) {
  if (fn) return fn(ctx, n);
#ifdef KVIDX_NO_MALLOC
  return NULL;
#else
  return KVIDX_MALLOC(n);
#endif
}

KVIDX__PRIV void *kvidx__alloc(kvidx *ix, size_t n) {
  void *p;
  if (ix->buffer_mode || n == 0) return NULL;
  p = kvidx__raw_alloc(ix->alloc, ix->actx, n);
  if (p) {
    ix->bytes += n;
    if (ix->bytes > ix->peak) ix->peak = ix->bytes;
  }
  return p;
}

KVIDX__PRIV void kvidx__free(kvidx *ix, void *p, size_t n) {
  if (!p || ix->buffer_mode) return;
  ix->bytes -= n;
  if (ix->free) ix->free(ix->actx, p, n);
#ifndef KVIDX_NO_MALLOC
  else KVIDX_FREE(p);
#endif
}

KVIDX__PRIV size_t kvidx__align(size_t n) { return (n + 63) & ~KVIDX__CAST(size_t, 63); }

KVIDX__PRIV uint32_t kvidx__pow2(uint64_t n) { /* smallest power of two >= n, >= 16 */
  uint64_t p = 16;
  while (p < n) p <<= 1;
  return p > 0x80000000u ? 0x80000000u : KVIDX__CAST(uint32_t, p);
}

/* ---- writer-side record pools ----------------------------------------- */
#define KVIDX__REC(pl, id) (KVIDX__RCAST(kvidx__rh *, (pl)->recs + (size_t)(id) * (pl)->rec_size))

KVIDX__PRIV uint32_t kvidx__pool_bucket(const kvidx__pool *pl, uint32_t slot, uint64_t key) {
  return KVIDX__CAST(uint32_t, kvidx__mix(key ^ (KVIDX__CAST(uint64_t, slot) << 40) ^ slot)) & pl->mask;
}

KVIDX__PRIV void kvidx__pool_link(kvidx__pool *pl, uint32_t id) {
  kvidx__rh *r = KVIDX__REC(pl, id);
  uint32_t b = kvidx__pool_bucket(pl, r->slot, r->key);
  r->hnext = pl->heads[b];
  pl->heads[b] = id;
}

KVIDX__PRIV void kvidx__pool_rehash(kvidx__pool *pl) {
  uint32_t i;
  for (i = 0; i <= pl->mask; i++) pl->heads[i] = KVIDX__NONE;
  for (i = 0; i < pl->hw; i++)
    if (KVIDX__REC(pl, i)->slot != KVIDX__NONE) kvidx__pool_link(pl, i);
}

/* Carve a pool of fixed capacity out of memory already owned (buffer mode). */
KVIDX__PRIV size_t kvidx__pool_bytes(size_t rec_size, uint32_t cap) {
  return kvidx__align(rec_size * cap) + kvidx__align(sizeof(uint32_t) * kvidx__pow2(cap));
}

KVIDX__PRIV void kvidx__pool_place(kvidx__pool *pl, unsigned char *mem, size_t rec_size, uint32_t cap) {
  pl->rec_size = rec_size;
  pl->recs = mem;
  pl->heads = KVIDX__RCAST(uint32_t *, mem + kvidx__align(rec_size * cap));
  pl->cap = cap;
  pl->mask = kvidx__pow2(cap) - 1;
  pl->hw = pl->count = 0;
  pl->free_head = KVIDX__NONE;
  kvidx__pool_rehash(pl);
}

/* Make room for `extra` more records; nothing changes on failure. */
KVIDX__PRIV int kvidx__pool_reserve(kvidx *ix, kvidx__pool *pl, size_t extra, size_t limit) {
  size_t need = pl->count + extra, ncap;
  if (need > limit) need = limit; /* past the limit the semantic checks refuse */
  unsigned char *mem;
  if (need <= pl->cap) return KVIDX_OK;
  if (ix->buffer_mode || need > KVIDX__ID_LIMIT) return KVIDX_EFULL;
  ncap = pl->cap ? pl->cap : 16;
  while (ncap < need) ncap *= 2;
  if (ncap > KVIDX__ID_LIMIT) ncap = KVIDX__ID_LIMIT;
  mem = KVIDX__CAST(unsigned char *, kvidx__alloc(ix, kvidx__pool_bytes(pl->rec_size, KVIDX__CAST(uint32_t, ncap))));
  if (!mem) return KVIDX_ENOMEM;
  if (pl->recs) memcpy(mem, pl->recs, pl->rec_size * pl->hw);
  {
    kvidx__pool old = *pl;
    uint32_t hw = pl->hw, count = pl->count, fh = pl->free_head;
    kvidx__pool_place(pl, mem, pl->rec_size, KVIDX__CAST(uint32_t, ncap));
    pl->hw = hw;
    pl->count = count;
    pl->free_head = fh;
    kvidx__pool_rehash(pl);
    if (old.recs) kvidx__free(ix, old.recs, kvidx__pool_bytes(old.rec_size, old.cap));
  }
  return KVIDX_OK;
}

KVIDX__PRIV kvidx__rh *kvidx__pool_find(const kvidx__pool *pl, uint32_t slot, uint64_t key, uint32_t *id_out) {
  uint32_t id;
  if (!pl->count) return NULL;
  for (id = pl->heads[kvidx__pool_bucket(pl, slot, key)]; id != KVIDX__NONE;) {
    kvidx__rh *r = KVIDX__REC(pl, id);
    if (r->key == key && r->slot == slot) {
      if (id_out) *id_out = id;
      return r;
    }
    id = r->hnext;
  }
  return NULL;
}

/* Caller reserved room; the new record is zeroed past its header. */
KVIDX__PRIV uint32_t kvidx__pool_add(kvidx__pool *pl, uint32_t slot, uint64_t key) {
  uint32_t id;
  kvidx__rh *r;
  if (pl->free_head != KVIDX__NONE) {
    id = pl->free_head;
    pl->free_head = KVIDX__REC(pl, id)->hnext;
  } else {
    id = pl->hw++;
  }
  r = KVIDX__REC(pl, id);
  memset(r, 0, pl->rec_size);
  r->slot = slot;
  r->key = key;
  kvidx__pool_link(pl, id);
  pl->count++;
  return id;
}

KVIDX__PRIV void kvidx__pool_del(kvidx__pool *pl, uint32_t id) {
  kvidx__rh *r = KVIDX__REC(pl, id);
  uint32_t *pp = &pl->heads[kvidx__pool_bucket(pl, r->slot, r->key)];
  while (*pp != id) pp = &KVIDX__REC(pl, *pp)->hnext;
  *pp = r->hnext;
  r->slot = KVIDX__NONE;
  r->hnext = pl->free_head;
  pl->free_head = id;
  pl->count--;
}

/* ---- bitsets ------------------------------------------------------------ */
KVIDX__PRIV int kvidx__bs_any(const uint64_t *a, uint32_t nw) {
  uint32_t i;
  for (i = 0; i < nw; i++)
    if (a[i]) return 1;
  return 0;
}

KVIDX__PRIV unsigned kvidx__ctz64(uint64_t x) {
#if defined(__GNUC__) || defined(__clang__)
  return KVIDX__CAST(unsigned, __builtin_ctzll(x));
#else
  unsigned c = 0;
  while (!(x & 1)) { x >>= 1; c++; }
  return c;
#endif
}

/* ---- worker slots: dense ids 0..max_workers-1, recycled when empty ------ */
KVIDX__PRIV uint32_t kvidx__wkey_bucket(const kvidx *ix, uint64_t id, uint32_t rank) {
  return KVIDX__CAST(uint32_t, kvidx__mix(id * 0x9E3779B97F4A7C15ULL + rank)) & ix->slot_map_mask;
}

KVIDX__PRIV uint32_t kvidx__slot_find(const kvidx *ix, uint64_t id, uint32_t rank) {
  uint32_t b = kvidx__wkey_bucket(ix, id, rank), s;
  while ((s = ix->slot_map[b]) != 0) {
    const kvidx__slot *sl = &ix->slots[s - 1];
    if (kvidx__ld(&sl->id) == id && kvidx__ld(&sl->rank) == rank) return s - 1;
    b = (b + 1) & ix->slot_map_mask;
  }
  return KVIDX__NONE;
}

KVIDX__PRIV uint32_t kvidx__slot_alloc(kvidx *ix, uint64_t id, uint32_t rank) {
  uint32_t s = ix->slot_free, b;
  kvidx__slot *sl;
  if (s == KVIDX__NONE) return KVIDX__NONE;
  sl = &ix->slots[s];
  ix->slot_free = sl->free_next;
  { /* epoch first: a reader that sees the new id or any new bit sees it */
    uint32_t ep = kvidx__ld(&ix->slot_epoch) + 1;
    kvidx__st(&ix->slot_epoch, ep);
    kvidx__st(&sl->epoch, ep);
  }
  kvidx__st(&sl->rank, rank);
  kvidx__st_rel(&sl->id, id);
  if (s / 64 + 1 > kvidx__ld(&ix->nw_live)) kvidx__st_rel(&ix->nw_live, s / 64 + 1);
  sl->used = 1;
  sl->blocks = sl->orphans = 0;
  sl->list = KVIDX__NONE;
  b = kvidx__wkey_bucket(ix, id, rank);
  while (ix->slot_map[b]) b = (b + 1) & ix->slot_map_mask;
  ix->slot_map[b] = s + 1;
  ix->slots_used++;
  return s;
}

/* Release an empty slot (linear probing with backward-shift deletion). */
KVIDX__PRIV void kvidx__slot_release(kvidx *ix, uint32_t s) {
  kvidx__slot *sl = &ix->slots[s];
  uint32_t m = ix->slot_map_mask, i = kvidx__wkey_bucket(ix, kvidx__ld(&sl->id), kvidx__ld(&sl->rank)), j;
  while (ix->slot_map[i] != s + 1) i = (i + 1) & m;
  ix->slot_map[i] = 0;
  for (j = (i + 1) & m; ix->slot_map[j]; j = (j + 1) & m) {
    const kvidx__slot *o = &ix->slots[ix->slot_map[j] - 1];
    uint32_t h = kvidx__wkey_bucket(ix, kvidx__ld(&o->id), kvidx__ld(&o->rank));
    /* move j into the hole i if its home h is not cyclically in (i, j] */
    if (((j - h) & m) >= ((j - i) & m)) {
      ix->slot_map[i] = ix->slot_map[j];
      ix->slot_map[j] = 0;
      i = j;
    }
  }
  sl->used = 0;
  sl->free_next = ix->slot_free;
  ix->slot_free = s;
  ix->slots_used--;
}

KVIDX__PRIV void kvidx__set_holed(kvidx *ix, uint32_t s, int on) {
  KVIDX__A(uint64_t) *w = &ix->holed[s >> 6];
  uint64_t v = kvidx__ld(w), bit = KVIDX__CAST(uint64_t, 1) << (s & 63);
  kvidx__st(w, on ? (v | bit) : (v & ~bit));
}

KVIDX__PRIV void kvidx__orphans_add(kvidx *ix, uint32_t s, size_t add, size_t sub) {
  kvidx__slot *sl = &ix->slots[s];
  int was = sl->orphans != 0;
  sl->orphans = sl->orphans + add - sub;
  if (was != (sl->orphans != 0)) {
    KVIDX_TEST_HOOK(ix, 7); /* the holed mark is about to change */
    kvidx__set_holed(ix, s, sl->orphans != 0);
  }
}

/* ---- results: keep the best `cap` scores without allocating ------------- */
/* The sink fills kvidx_score or kvidx_tier_score arrays (esz says which);
 * both start with the same three fields, which is all the ordering reads. */
typedef struct {
  unsigned char *out;
  size_t esz, cap, n, total;
  int heap;
  uint32_t epoch; /* slot_epoch when the query started */
  uint32_t nw;    /* bitset words in play (nw_live when it started) */
} kvidx__sink;
#define KVIDX__SC(k, i) (KVIDX__RCAST(kvidx_score *, (k)->out + (i) * (k)->esz))

/* final order: depth desc, worker_id asc, dp_rank asc; a < b = a first */
KVIDX__PRIV int kvidx__score_before(const kvidx_score *a, const kvidx_score *b) {
  if (a->depth != b->depth) return a->depth > b->depth;
  if (a->worker_id != b->worker_id) return a->worker_id < b->worker_id;
  return a->dp_rank < b->dp_rank;
}

KVIDX__PRIV int kvidx__score_cmp(const void *x, const void *y) {
  const kvidx_score *a = KVIDX__CAST(const kvidx_score *, x), *b = KVIDX__CAST(const kvidx_score *, y);
  return kvidx__score_before(a, b) ? -1 : kvidx__score_before(b, a) ? 1 : 0;
}

KVIDX__PRIV void kvidx__sink_swap(kvidx__sink *k, size_t i, size_t j) {
  kvidx_tier_score t;
  memcpy(&t, KVIDX__SC(k, i), k->esz);
  memcpy(KVIDX__SC(k, i), KVIDX__SC(k, j), k->esz);
  memcpy(KVIDX__SC(k, j), &t, k->esz);
}

/* max-heap on "worst first": the root is the score that sorts last */
KVIDX__PRIV void kvidx__sift(kvidx__sink *k, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, w = i;
    if (l < k->n && kvidx__score_before(KVIDX__SC(k, w), KVIDX__SC(k, l))) w = l;
    if (r < k->n && kvidx__score_before(KVIDX__SC(k, w), KVIDX__SC(k, r))) w = r;
    if (w == i) return;
    kvidx__sink_swap(k, i, w);
    i = w;
  }
}

KVIDX__PRIV void kvidx__sink_push(kvidx__sink *k, uint64_t id, uint32_t rank, size_t depth, uint32_t dev) {
  kvidx_tier_score sc;
  k->total++;
  if (!k->cap) return;
  memset(&sc, 0, sizeof sc);
  sc.worker_id = id;
  sc.dp_rank = rank;
  sc.depth = depth > 0xFFFFFFFFu ? 0xFFFFFFFFu : KVIDX__CAST(uint32_t, depth);
  sc.device_blocks = dev;
  if (k->n < k->cap) {
    memcpy(KVIDX__SC(k, k->n), &sc, k->esz);
    k->n++;
    return;
  }
  if (!k->heap) {
    size_t i = k->n / 2;
    while (i--) kvidx__sift(k, i);
    k->heap = 1;
  }
  if (kvidx__score_before(KVIDX__RCAST(kvidx_score *, &sc), KVIDX__SC(k, 0))) {
    memcpy(KVIDX__SC(k, 0), &sc, k->esz);
    kvidx__sift(k, 0);
  }
}

KVIDX__PRIV size_t kvidx__sink_finish(kvidx__sink *k) {
  if (k->n > 1) qsort(k->out, k->n, k->esz, kvidx__score_cmp);
  return k->total;
}

KVIDX__PRIV void kvidx__sink_init(kvidx__sink *k, void *out, size_t esz, size_t cap) {
  memset(k, 0, sizeof *k);
  k->out = KVIDX__CAST(unsigned char *, out);
  k->esz = esz;
  k->cap = out ? cap : 0;
}

/* Emit every slot of set d with the given depth (cnt: device blocks per
 * slot, tiered queries only). */
KVIDX__PRIV void kvidx__emit_cnt(const kvidx *ix, kvidx__sink *k, const uint64_t *d, size_t depth,
                                 const uint32_t *cnt) {
  uint32_t i;
  for (i = 0; i < k->nw; i++) {
    uint64_t w = d[i];
    while (w) {
      uint32_t s = i * 64 + kvidx__ctz64(w);
      w &= w - 1;
      if (s >= ix->max_workers) continue; /* never set; a reader stays in bounds anyway */
      {
        const kvidx__slot *sl = &ix->slots[s];
        uint64_t id = kvidx__ld_acq(&KVIDX__MUT(ix)->slots[s].id);
        uint32_t rank = kvidx__ld(&sl->rank);
        /* assigned after the query began: its bits may mix two workers */
        if (KVIDX__CAST(int32_t, kvidx__ld(&sl->epoch) - k->epoch) > 0) continue;
        kvidx__sink_push(k, id, rank, depth, cnt ? cnt[s] : 0);
      }
    }
  }
}
#define kvidx__emit(ix, k, d, depth) kvidx__emit_cnt(ix, k, d, depth, NULL)

/* Eviction keys of a new holding (the reference model computes the same). */
KVIDX__PRIV void kvidx__keys(int evict, uint64_t stamp, uint64_t *seqno, size_t i, uint64_t expires, uint64_t *k1,
                             uint64_t *k2) {
  if (evict == KVIDX_EVICT_LRS) { /* oldest store first; in a store, last block first */
    *k1 = stamp;
    *k2 = ~KVIDX__CAST(uint64_t, i);
  } else { /* expiry: earliest first; no expiry last; ties: newest (deepest) first */
    *k1 = expires ? expires : ~KVIDX__CAST(uint64_t, 0);
    *k2 = ~(*seqno)++;
  }
}

/* ========================================================================== */
/* 3. Reference semantics: the naive nested map that defines every answer    */
/* ========================================================================== */
/* worker -> (seq -> block{local, chain}) and worker -> (chain -> count).
 * Written for obviousness, not speed: linear worker search, linear-probing
 * maps with tombstones, find_matches in O(workers x depth).  Heap mode only.
 * Shares nothing with the indexes but the allocation hooks and the sink. */
typedef struct {
  uint64_t key, a, b; /* blocks: a = local, b = chain; chains: a = count, b = on device */
  uint64_t k1, k2;    /* blocks: eviction keys                                       */
  uint32_t tiers;     /* blocks: tier bits                                           */
  unsigned char state; /* 0 empty, 1 full, 2 deleted */
} kvidx__rslot;

typedef struct {
  kvidx__rslot *t;
  size_t cap, len, used; /* used = full + deleted */
} kvidx__rmap;

typedef struct {
  uint64_t id;
  uint32_t rank;
  int live;
  kvidx__rmap blocks; /* seq -> (local, chain) */
  kvidx__rmap chains; /* chain -> count        */
} kvidx__rworker;

struct kvidx__ref {
  kvidx__rworker *w;
  size_t nworkers, blocks;
};

KVIDX__PRIV kvidx__rslot *kvidx__rmap_get(const kvidx__rmap *m, uint64_t key) {
  size_t i;
  if (!m->cap) return NULL;
  for (i = kvidx__mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (m->t[i].state == 0) return NULL;
    if (m->t[i].state == 1 && m->t[i].key == key) return &m->t[i];
  }
}

/* Ensure `extra` inserts fit without growing; rebuilds at double size. */
KVIDX__PRIV int kvidx__rmap_reserve(kvidx *ix, kvidx__rmap *m, size_t extra) {
  size_t ncap, i;
  kvidx__rslot *t;
  if ((m->used + extra) * 4 < m->cap * 3) return KVIDX_OK;
  ncap = m->cap ? m->cap : 8;
  while ((m->len + extra) * 4 >= ncap * 3) ncap *= 2;
  t = KVIDX__CAST(kvidx__rslot *, kvidx__alloc(ix, ncap * sizeof(kvidx__rslot)));
  if (!t) return KVIDX_ENOMEM;
  memset(t, 0, ncap * sizeof(kvidx__rslot));
  for (i = 0; i < m->cap; i++)
    if (m->t[i].state == 1) {
      size_t j = kvidx__mix(m->t[i].key) & (ncap - 1);
      while (t[j].state) j = (j + 1) & (ncap - 1);
      t[j] = m->t[i];
    }
  kvidx__free(ix, m->t, m->cap * sizeof(kvidx__rslot));
  m->t = t;
  m->cap = ncap;
  m->used = m->len;
  return KVIDX_OK;
}

KVIDX__PRIV kvidx__rslot *kvidx__rmap_put(kvidx__rmap *m, uint64_t key) { /* reserved */
  size_t i = kvidx__mix(key) & (m->cap - 1);
  while (m->t[i].state == 1) i = (i + 1) & (m->cap - 1);
  if (m->t[i].state == 0) m->used++;
  m->t[i].state = 1;
  m->t[i].key = key;
  m->t[i].a = m->t[i].b = m->t[i].k1 = m->t[i].k2 = 0;
  m->t[i].tiers = 0;
  m->len++;
  return &m->t[i];
}

KVIDX__PRIV void kvidx__rmap_del(kvidx__rmap *m, kvidx__rslot *e) {
  e->state = 2;
  m->len--;
}

KVIDX__PRIV void kvidx__rmap_drop(kvidx *ix, kvidx__rmap *m) {
  kvidx__free(ix, m->t, m->cap * sizeof(kvidx__rslot));
  memset(m, 0, sizeof *m);
}

KVIDX__PRIV kvidx__rworker *kvidx__ref_worker(const kvidx *ix, uint64_t id, uint32_t rank) {
  size_t i;
  for (i = 0; i < ix->max_workers; i++)
    if (ix->ref->w[i].live && ix->ref->w[i].id == id && ix->ref->w[i].rank == rank) return &ix->ref->w[i];
  return NULL;
}

KVIDX__PRIV void kvidx__ref_forget_if_empty(kvidx *ix, kvidx__rworker *w) {
  if (w->blocks.len) return;
  kvidx__rmap_drop(ix, &w->blocks);
  kvidx__rmap_drop(ix, &w->chains);
  w->live = 0;
  ix->ref->nworkers--;
}

KVIDX__PRIV void kvidx__ref_drop_block(kvidx *ix, kvidx__rworker *w, kvidx__rslot *blk) {
  kvidx__rslot *c = kvidx__rmap_get(&w->chains, blk->b);
  if (blk->tiers & (1u << KVIDX_TIER_DEVICE)) c->b--;
  if (--c->a == 0) kvidx__rmap_del(&w->chains, c);
  kvidx__rmap_del(&w->blocks, blk);
  ix->ref->blocks--;
}

/* Eviction, obviously: scan every block for the smallest (k1, k2). */
KVIDX__PRIV void kvidx__ref_prune(kvidx *ix, size_t limit, kvidx__rworker *pw, const uint64_t *pseq) {
  while (ix->ref->blocks > limit) {
    kvidx__rworker *bw = NULL;
    kvidx__rslot *best = NULL;
    size_t i, j;
    for (i = 0; i < ix->max_workers; i++) {
      kvidx__rworker *w = &ix->ref->w[i];
      if (!w->live) continue;
      for (j = 0; j < w->blocks.cap; j++) {
        kvidx__rslot *bl = &w->blocks.t[j];
        if (bl->state != 1 || (w == pw && pseq && bl->key == *pseq)) continue;
        if (!best || bl->k1 < best->k1 || (bl->k1 == best->k1 && bl->k2 < best->k2)) best = bl, bw = w;
      }
    }
    if (!best) return;
    kvidx__ref_drop_block(ix, bw, best);
    if (bw != pw) kvidx__ref_forget_if_empty(ix, bw); /* the storing worker keeps its reserved maps */
  }
}

KVIDX__PRIV int kvidx__ref_store(kvidx *ix, uint64_t id, uint32_t rank, const uint64_t *parent,
                                 const kvidx_block *b, size_t n, int tier, uint64_t expires) {
  kvidx__rworker *w = kvidx__ref_worker(ix, id, rank), tmp;
  int have_parent = 0, rc;
  uint64_t pchain = 0, stamp = ++ix->stamp;
  size_t i, j, fresh = 0, lim = ix->max_blocks < n ? 0 : ix->max_blocks - n;
  if (parent) {
    kvidx__rslot *p = w ? kvidx__rmap_get(&w->blocks, *parent) : NULL;
    if (!p) return KVIDX_ENOPARENT;
    have_parent = 1;
    pchain = p->b;
  }
  if (n == 0) return KVIDX_OK;
  if (ix->evict) { /* refusals first: a refused store evicts nothing */
    if (n + (parent != NULL) > ix->max_blocks) return KVIDX_EFULL;
  } else if (ix->ref->blocks + n > ix->max_blocks) {
    /* how many seqs are new (first occurrence in the run, not yet held) */
    for (i = 0; i < n; i++) {
      int seen = w && kvidx__rmap_get(&w->blocks, b[i].seq);
      for (j = 0; j < i && !seen; j++) seen = b[j].seq == b[i].seq;
      fresh += !seen;
    }
    if (ix->ref->blocks + fresh > ix->max_blocks) return KVIDX_EFULL;
  }
  if (!w) {
    for (i = 0; i < ix->max_workers && ix->ref->w[i].live; i++) {}
    if (i == ix->max_workers) return KVIDX_EFULL;
    w = &ix->ref->w[i];
    memset(&tmp, 0, sizeof tmp);
    *w = tmp;
    w->id = id;
    w->rank = rank;
  }
  if ((rc = kvidx__rmap_reserve(ix, &w->blocks, n)) != KVIDX_OK ||
      (rc = kvidx__rmap_reserve(ix, &w->chains, n)) != KVIDX_OK) {
    if (!w->live) { /* a worker being created: give its maps back */
      kvidx__rmap_drop(ix, &w->blocks);
      kvidx__rmap_drop(ix, &w->chains);
    }
    return rc;
  }
  if (!w->live) {
    w->live = 1;
    ix->ref->nworkers++;
  }
  if (ix->evict && ix->ref->blocks > lim) /* make room by policy (never the parent), then the store fits */
    kvidx__ref_prune(ix, ix->evict_target < lim ? ix->evict_target : lim, w, parent);
  for (i = 0; i < n; i++) {
    kvidx__rslot *held = kvidx__rmap_get(&w->blocks, b[i].seq), *c;
    uint64_t chain;
    if (held) { /* already held: stays, but gains the tier and a later expiry; the run continues from it */
      if (!(held->tiers & (1u << tier))) {
        held->tiers |= 1u << tier;
        if (tier == KVIDX_TIER_DEVICE) kvidx__rmap_get(&w->chains, held->b)->b++;
      }
      if (ix->evict == KVIDX_EVICT_EXPIRY && expires && expires > held->k1) held->k1 = expires;
      pchain = held->b;
      have_parent = 1;
      continue;
    }
    chain = have_parent ? kvidx_seq_hash_next(pchain, b[i].local) : b[i].local;
    held = kvidx__rmap_put(&w->blocks, b[i].seq);
    held->a = b[i].local;
    held->b = chain;
    held->tiers = 1u << tier;
    if (ix->evict) kvidx__keys(ix->evict, stamp, &ix->seqno, i, expires, &held->k1, &held->k2);
    c = kvidx__rmap_get(&w->chains, chain);
    if (!c) c = kvidx__rmap_put(&w->chains, chain);
    c->a++;
    if (tier == KVIDX_TIER_DEVICE) c->b++;
    ix->ref->blocks++;
    pchain = chain;
    have_parent = 1;
  }
  return KVIDX_OK;
}

KVIDX__PRIV int kvidx__ref_remove(kvidx *ix, uint64_t id, uint32_t rank, const uint64_t *seq, size_t n, int tier) {
  kvidx__rworker *w = kvidx__ref_worker(ix, id, rank);
  size_t i, unknown = 0;
  for (i = 0; i < n; i++) {
    kvidx__rslot *blk = w ? kvidx__rmap_get(&w->blocks, seq[i]) : NULL;
    if (!blk || (tier != KVIDX_TIER_ALL && !(blk->tiers & (1u << tier)))) {
      unknown++;
    } else if (tier == KVIDX_TIER_ALL || blk->tiers == (1u << tier)) {
      kvidx__ref_drop_block(ix, w, blk);
    } else { /* another tier's copy stays */
      blk->tiers &= ~(1u << tier);
      if (tier == KVIDX_TIER_DEVICE) kvidx__rmap_get(&w->chains, blk->b)->b--;
    }
  }
  if (w) kvidx__ref_forget_if_empty(ix, w);
  return unknown ? KVIDX_ENOENT : KVIDX_OK;
}

KVIDX__PRIV size_t kvidx__ref_expire(kvidx *ix, uint64_t now) {
  size_t i, j, n = 0;
  for (i = 0; i < ix->max_workers; i++) {
    kvidx__rworker *w = &ix->ref->w[i];
    if (!w->live) continue;
    for (j = 0; j < w->blocks.cap; j++)
      if (w->blocks.t[j].state == 1 && w->blocks.t[j].k1 <= now) {
        kvidx__ref_drop_block(ix, w, &w->blocks.t[j]);
        n++;
      }
    kvidx__ref_forget_if_empty(ix, w);
  }
  return n;
}

KVIDX__PRIV void kvidx__ref_clear_worker(kvidx *ix, kvidx__rworker *w) {
  ix->ref->blocks -= w->blocks.len;
  w->blocks.len = 0;
  kvidx__ref_forget_if_empty(ix, w);
}

KVIDX__PRIV size_t kvidx__ref_find(const kvidx *ix, const uint64_t *loc, size_t n, kvidx__sink *k) {
  size_t i;
  for (i = 0; i < ix->max_workers; i++) {
    const kvidx__rworker *w = &ix->ref->w[i];
    size_t depth = 0;
    uint64_t q = n ? loc[0] : 0;
    uint32_t dev = 0;
    const kvidx__rslot *c;
    if (!w->live) continue;
    while (depth < n && (c = kvidx__rmap_get(&w->chains, q)) != NULL) {
      dev += c->b != 0;
      depth++;
      if (depth < n) q = kvidx_seq_hash_next(q, loc[depth]);
    }
    if (depth) kvidx__sink_push(k, w->id, w->rank, depth, dev);
  }
  return kvidx__sink_finish(k);
}

/* ========================================================================== */
/* 4. Index entries (shared by the radix tree and the positional index)      */
/* ========================================================================== */
/* Entries live in grow-only chunks: chunk 0 holds ids [0, cap0), chunk k >= 1
 * holds [cap0 (2^k - 1), cap0 (2^(k+1) - 1)).  Chunks are never moved or
 * freed before destroy, so an id a reader picked up, once bounds-checked,
 * always points at an entry (possibly reused: the seqlock and the stored key
 * hash tell).  Both kinds find entries through one chained hash table:
 *   radix:      key (parent entry, local)          - a tree, walked by edge
 *   positional: key (position, local), chain checked - one probe per position */

KVIDX__PRIV kvidx__ent *kvidx__ent_rd(const kvidx *ix, uint32_t id) { /* reader: checked */
  unsigned char *c;
  size_t off;
  unsigned k;
  if (id < ix->cap0) {
    c = kvidx__ld_acq(&KVIDX__MUT(ix)->chunks[0]);
    off = id;
  } else {
    uint32_t t = (id >> ix->shift0) + 1;
#if defined(__GNUC__) || defined(__clang__)
    k = 31u - KVIDX__CAST(unsigned, __builtin_clz(t));
#else
    k = 0;
    while (t >> (k + 1)) k++;
#endif
    if (k == 0 || k >= KVIDX__CHUNKS) return NULL; /* a speculative id out of range */
    c = kvidx__ld_acq(&KVIDX__MUT(ix)->chunks[k]);
    off = id - (((KVIDX__CAST(size_t, 1) << k) - 1) << ix->shift0);
  }
  if (!c) return NULL;
  return KVIDX__RCAST(kvidx__ent *, c + off * ix->stride);
}

/* Writer side: ids it holds are always in range. */
KVIDX__PRIV kvidx__ent *kvidx__ent_at(const kvidx *ix, uint32_t id) {
  size_t off = id;
  unsigned k = 0;
  if (id >= ix->cap0) {
    uint32_t t = (id >> ix->shift0) + 1;
#if defined(__GNUC__) || defined(__clang__)
    k = 31u - KVIDX__CAST(unsigned, __builtin_clz(t));
#else
    while (t >> (k + 1)) k++;
#endif
    off = id - (((KVIDX__CAST(size_t, 1) << k) - 1) << ix->shift0);
  }
  return KVIDX__RCAST(kvidx__ent *, kvidx__ld(&KVIDX__MUT(ix)->chunks[k]) + off * ix->stride);
}

KVIDX__PRIV KVIDX__A(uint64_t) *kvidx__ent_bits(kvidx__ent *e) {
  return KVIDX__RCAST(KVIDX__A(uint64_t) *, KVIDX__RCAST(unsigned char *, e) + sizeof(kvidx__ent));
}
/* the second bitset: workers holding the entry on the device tier */
KVIDX__PRIV KVIDX__A(uint64_t) *kvidx__ent_dev(const kvidx *ix, kvidx__ent *e) {
  return kvidx__ent_bits(e) + ix->nw;
}

KVIDX__PRIV uint32_t kvidx__key_hash(int kind, uint32_t pos, uint32_t parent, uint64_t local) {
  uint64_t k = kind == KVIDX_RADIX ? parent : pos;
  return KVIDX__CAST(uint32_t, kvidx__mix(local ^ (k * 0x9E3779B97F4A7C15ULL) ^ (k << 17)) >> 16);
}

KVIDX__PRIV size_t kvidx__tab_bytes(uint32_t nb) {
  return sizeof(kvidx__tab) + sizeof(KVIDX__A(uint32_t)) * nb;
}

/* Writer side: make room for `extra` more entries; nothing changes on
 * failure.  Growing the bucket array rehashes under tab_ver (see 6.). */
KVIDX__PRIV int kvidx__ent_reserve(kvidx *ix, size_t extra) {
  size_t need = ix->ent_count + extra;
  kvidx__tab *t = kvidx__ld(&ix->tab);
  if (need > ix->max_entries) need = ix->max_entries;
  while (ix->ent_cap < need) { /* add the next chunk */
    unsigned k = 0;
    size_t len;
    unsigned char *c;
    while (k < KVIDX__CHUNKS && kvidx__ld(&ix->chunks[k])) k++;
    if (k == KVIDX__CHUNKS || ix->buffer_mode) return KVIDX_EFULL;
    len = k == 0 ? ix->cap0 : (KVIDX__CAST(size_t, ix->cap0) << k);
    c = KVIDX__CAST(unsigned char *, kvidx__alloc(ix, len * ix->stride));
    if (!c) return KVIDX_ENOMEM;
    memset(c, 0, len * ix->stride);
    kvidx__st_rel(&ix->chunks[k], c);
    ix->ent_cap += KVIDX__CAST(uint32_t, len);
  }
  if (need > KVIDX__CAST(size_t, t->mask) + 1 && !ix->buffer_mode) {
    uint32_t nb = kvidx__pow2(2 * need), i;
    kvidx__tab *nt = KVIDX__CAST(kvidx__tab *, kvidx__alloc(ix, kvidx__tab_bytes(nb)));
    if (!nt) return KVIDX_ENOMEM;
    nt->mask = nb - 1;
    nt->bytes = kvidx__tab_bytes(nb);
    nt->older = t;
    for (i = 0; i < nb; i++) kvidx__st(&KVIDX__HEADS(nt)[i], 0u);
    /* readers that miss while tab_ver is odd or changed retry (6.) */
    kvidx__st(&ix->tab_ver, kvidx__ld(&ix->tab_ver) + 1);
    kvidx__fence_rel();
    for (i = 0; i <= t->mask; i++) {
      uint32_t id = kvidx__ld(&KVIDX__HEADS(t)[i]);
      while (id) {
        kvidx__ent *e = kvidx__ent_at(ix, id - 1);
        uint32_t nx = kvidx__ld(&e->next), b = kvidx__ld(&e->hash) & nt->mask;
        kvidx__st(&e->next, kvidx__ld(&KVIDX__HEADS(nt)[b]));
        kvidx__st(&KVIDX__HEADS(nt)[b], id);
        id = nx;
      }
      if (i == t->mask / 2) KVIDX_TEST_HOOK(ix, 5); /* half the chains relinked */
    }
    kvidx__st_rel(&ix->tab, nt);
    kvidx__st_rel(&ix->tab_ver, kvidx__ld(&ix->tab_ver) + 1);
  }
  return KVIDX_OK;
}

/* Seqlock write side for one entry (Boehm): odd, release fence, relaxed
 * stores, even with release. */
KVIDX__PRIV void kvidx__ent_wbegin(kvidx__ent *e) {
  kvidx__st(&e->ver, kvidx__ld(&e->ver) + 1);
  kvidx__fence_rel();
}
KVIDX__PRIV void kvidx__ent_wend(kvidx__ent *e) { kvidx__st_rel(&e->ver, kvidx__ld(&e->ver) + 1); }

KVIDX__PRIV void kvidx__ent_setbit(kvidx *ix, uint32_t id, uint32_t s, int on, int dev) {
  kvidx__ent *e = kvidx__ent_at(ix, id);
  KVIDX__A(uint64_t) *w = &(dev ? kvidx__ent_dev(ix, e) : kvidx__ent_bits(e))[s >> 6];
  uint64_t bit = KVIDX__CAST(uint64_t, 1) << (s & 63), v = kvidx__ld(w);
  kvidx__ent_wbegin(e);
  KVIDX_TEST_HOOK(ix, 1);
  kvidx__st(w, on ? (v | bit) : (v & ~bit));
  KVIDX_TEST_HOOK(ix, 2);
  kvidx__ent_wend(e);
}

/* Writer-side exact lookup (no concurrent writer exists, plain reads). */
KVIDX__PRIV uint32_t kvidx__ent_lookup_w(const kvidx *ix, uint32_t h, uint32_t pos, uint32_t parent,
                                          uint64_t local, uint64_t chain) {
  kvidx__tab *t = kvidx__ld(&KVIDX__MUT(ix)->tab);
  uint32_t id = kvidx__ld(&KVIDX__HEADS(t)[h & t->mask]);
  while (id) {
    kvidx__ent *e = kvidx__ent_at(ix, id - 1);
    if (kvidx__ld(&e->local) == local && kvidx__ld(&e->hash) == h &&
        (ix->kind == KVIDX_RADIX ? kvidx__ld(&e->parent) == parent
                                 : kvidx__ld(&e->pos) == pos && kvidx__ld(&e->chain) == chain))
      return id - 1;
    id = kvidx__ld(&e->next);
  }
  return KVIDX__NONE;
}

/* Entry for the child of `parent` (KVIDX__NONE = root) with this local hash:
 * found or created (room was reserved).  KVIDX__NONE if max_entries is hit. */
KVIDX__PRIV uint32_t kvidx__ent_get(kvidx *ix, uint32_t parent, uint64_t local, int *created) {
  uint32_t pos = 0, h, id;
  uint64_t chain = local;
  kvidx__ent *e;
  kvidx__tab *t;
  if (parent != KVIDX__NONE) {
    kvidx__ent *p = kvidx__ent_at(ix, parent);
    pos = kvidx__ld(&p->pos) + 1;
    chain = kvidx_seq_hash_next(kvidx__ld(&p->chain), local);
  }
  h = kvidx__key_hash(ix->kind, pos, parent, local);
  id = kvidx__ent_lookup_w(ix, h, pos, parent, local, chain);
  *created = id == KVIDX__NONE;
  if (id != KVIDX__NONE) return id;
  if (ix->ent_count >= ix->max_entries) return KVIDX__NONE;
  if (ix->ent_free != KVIDX__NONE) {
    id = ix->ent_free;
    ix->ent_free = kvidx__ent_at(ix, id)->fnext;
  } else {
    id = ix->ent_hw++;
  }
  e = kvidx__ent_at(ix, id);
  t = kvidx__ld(&ix->tab);
  kvidx__ent_wbegin(e); /* a reader may still be looking at the old key */
  kvidx__st(&e->hash, h);
  kvidx__st(&e->pos, pos);
  KVIDX_TEST_HOOK(ix, 3); /* half re-keyed */
  kvidx__st(&e->local, local);
  kvidx__st(&e->chain, chain);
  kvidx__st(&e->parent, parent);
  kvidx__st(&e->next, kvidx__ld(&KVIDX__HEADS(t)[h & t->mask]));
  e->refs = e->kids = 0;
  kvidx__ent_wend(e); /* bits are already zero: cleared before free */
  kvidx__st_rel(&KVIDX__HEADS(t)[h & t->mask], id + 1);
  KVIDX_TEST_HOOK(ix, 4); /* published, no worker yet */
  if (parent != KVIDX__NONE) kvidx__ent_at(ix, parent)->kids++; /* ancestors live on (dumps need them) */
  ix->ent_count++;
  return id;
}

/* Free entries nobody references, then maybe the parent, upwards.  Both
 * kinds keep an entry while it has live children: the radix tree is keyed by
 * parent, and kvidx_dump rebuilds holes from a block's ancestors. */
KVIDX__PRIV void kvidx__ent_maybe_free(kvidx *ix, uint32_t id) {
  while (id != KVIDX__NONE) {
    kvidx__ent *e = kvidx__ent_at(ix, id);
    kvidx__tab *t = kvidx__ld(&ix->tab);
    KVIDX__A(uint32_t) *pp;
    uint32_t parent = kvidx__ld(&e->parent);
    if (e->refs || e->kids) return;
    pp = &KVIDX__HEADS(t)[kvidx__ld(&e->hash) & t->mask];
    while (kvidx__ld(pp) != id + 1) pp = &kvidx__ent_at(ix, kvidx__ld(pp) - 1)->next;
    /* unlink: e keeps its next, so a reader standing on e walks on */
    kvidx__st_rel(pp, kvidx__ld(&e->next));
    KVIDX_TEST_HOOK(ix, 6); /* unlinked, not yet free */
    e->fnext = ix->ent_free;
    ix->ent_free = id;
    ix->ent_count--;
    if (parent == KVIDX__NONE) return;
    kvidx__ent_at(ix, parent)->kids--;
    id = parent;
  }
}

/* ---- worker <-> entry records: multiplicity, children, orphans ----------- */
#define KVIDX__EREC(ix, id) (KVIDX__RCAST(kvidx__erec *, KVIDX__REC(&(ix)->E, id)))

/* The record of (s, entry), created if missing; returns its id. */
KVIDX__PRIV uint32_t kvidx__erec_get(kvidx *ix, uint32_t s, uint32_t entry, int fresh) {
  uint32_t id;
  /* fresh: the entry was just created, no worker can have a record yet */
  if (!fresh && kvidx__pool_find(&ix->E, s, entry, &id)) return id;
  id = kvidx__pool_add(&ix->E, s, entry);
  kvidx__ent_at(ix, entry)->refs++;
  return id;
}

KVIDX__PRIV void kvidx__erec_maybe_drop(kvidx *ix, uint32_t rid) {
  kvidx__erec *r = KVIDX__RCAST(kvidx__erec *, KVIDX__REC(&ix->E, rid));
  uint32_t entry = KVIDX__CAST(uint32_t, r->h.key);
  if (r->mult || r->children) return;
  kvidx__pool_del(&ix->E, rid);
  kvidx__ent_at(ix, entry)->refs--;
  kvidx__ent_maybe_free(ix, entry);
}

/* ---- eviction heap: srec ids, min-heap on (k1, k2) ------------------------ */
#define KVIDX__SREC(ix, id) (KVIDX__RCAST(kvidx__srec *, KVIDX__REC(&(ix)->S, id)))

KVIDX__PRIV int kvidx__heap_less(const kvidx *ix, uint32_t a, uint32_t b) {
  const kvidx__srec *x = KVIDX__SREC(ix, a), *y = KVIDX__SREC(ix, b);
  return x->k1 != y->k1 ? x->k1 < y->k1 : x->k2 < y->k2;
}
KVIDX__PRIV void kvidx__heap_set(kvidx *ix, uint32_t i, uint32_t rid) {
  ix->heap[i] = rid;
  KVIDX__SREC(ix, rid)->hpos = i;
}
KVIDX__PRIV void kvidx__heap_up(kvidx *ix, uint32_t i) {
  uint32_t rid = ix->heap[i];
  while (i && kvidx__heap_less(ix, rid, ix->heap[(i - 1) / 2])) {
    kvidx__heap_set(ix, i, ix->heap[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  kvidx__heap_set(ix, i, rid);
}
KVIDX__PRIV void kvidx__heap_down(kvidx *ix, uint32_t i) {
  uint32_t rid = ix->heap[i];
  for (;;) {
    uint32_t c = 2 * i + 1;
    if (c >= ix->heap_n) break;
    if (c + 1 < ix->heap_n && kvidx__heap_less(ix, ix->heap[c + 1], ix->heap[c])) c++;
    if (!kvidx__heap_less(ix, ix->heap[c], rid)) break;
    kvidx__heap_set(ix, i, ix->heap[c]);
    i = c;
  }
  kvidx__heap_set(ix, i, rid);
}
KVIDX__PRIV void kvidx__heap_fix(kvidx *ix, uint32_t rid) {
  uint32_t i = KVIDX__SREC(ix, rid)->hpos;
  kvidx__heap_up(ix, i);
  kvidx__heap_down(ix, KVIDX__SREC(ix, rid)->hpos);
}
KVIDX__PRIV void kvidx__heap_del(kvidx *ix, uint32_t rid) {
  uint32_t i = KVIDX__SREC(ix, rid)->hpos, last = ix->heap[--ix->heap_n];
  if (last == rid) return;
  kvidx__heap_set(ix, i, last);
  kvidx__heap_fix(ix, last);
}

/* Device-tier multiplicity: the entry's device bit follows devmult > 0. */
KVIDX__PRIV void kvidx__dev_add(kvidx *ix, uint32_t s, uint32_t e, kvidx__erec *er, int up) {
  if (up) {
    if (er->devmult++ == 0 && ix->tiers_on) kvidx__ent_setbit(ix, e, s, 1, 1);
  } else if (--er->devmult == 0 && ix->tiers_on) {
    kvidx__ent_setbit(ix, e, s, 0, 1);
  }
}

/* Worker s takes block (seq) as entry e under parent entry p, on one tier,
 * with eviction keys k1/k2.  *prev is the record id of p when the caller has
 * it (a run's previous block; KVIDX__NONE if not), and returns the record id
 * of e, saving a lookup per block of a run. */
KVIDX__PRIV void kvidx__hold(kvidx *ix, uint32_t s, uint64_t seq, uint32_t e, int fresh, uint32_t p,
                             uint32_t *prev, int tier, uint64_t k1, uint64_t k2) {
  kvidx__slot *sl = &ix->slots[s];
  uint32_t rid = kvidx__pool_add(&ix->S, s, seq), eid;
  kvidx__srec *r = KVIDX__SREC(ix, rid);
  kvidx__erec *er;
  r->entry = e;
  r->parent = p;
  r->tiers = 1u << tier;
  r->lprev = KVIDX__NONE;
  r->lnext = sl->list;
  if (sl->list != KVIDX__NONE) KVIDX__SREC(ix, sl->list)->lprev = rid;
  sl->list = rid;
  sl->blocks++;
  ix->blocks++;
  if (ix->evict) {
    r->k1 = k1;
    r->k2 = k2;
    ix->heap[ix->heap_n] = rid;
    r->hpos = ix->heap_n++;
    kvidx__heap_up(ix, r->hpos);
  }
  r->pr = KVIDX__NONE;
  if (p != KVIDX__NONE) { /* p is held: no orphan */
    r->pr = *prev != KVIDX__NONE ? *prev : kvidx__erec_get(ix, s, p, 0);
    KVIDX__EREC(ix, r->pr)->children++;
  }
  r->er = eid = kvidx__erec_get(ix, s, e, fresh); /* records never move within a call: room was reserved */
  er = KVIDX__EREC(ix, eid);
  if (er->mult++ == 0) {
    kvidx__ent_setbit(ix, e, s, 1, 0);
    kvidx__orphans_add(ix, s, 0, er->children); /* whole again: unmark after the bit */
  }
  if (tier == KVIDX_TIER_DEVICE) kvidx__dev_add(ix, s, e, er, 1);
  *prev = eid;
}

/* Worker s lets go of the block of seq record rid (every tier). */
KVIDX__PRIV void kvidx__unhold(kvidx *ix, uint32_t s, uint32_t rid) {
  kvidx__slot *sl = &ix->slots[s];
  kvidx__srec *r = KVIDX__SREC(ix, rid);
  uint32_t e = r->entry, p = r->parent, eid = r->er, pid = r->pr;
  kvidx__erec *er = KVIDX__EREC(ix, eid);
  if (r->tiers & (1u << KVIDX_TIER_DEVICE)) kvidx__dev_add(ix, s, e, er, 0);
  if (ix->evict) kvidx__heap_del(ix, rid);
  if (r->lprev != KVIDX__NONE) KVIDX__SREC(ix, r->lprev)->lnext = r->lnext;
  else sl->list = r->lnext;
  if (r->lnext != KVIDX__NONE) KVIDX__SREC(ix, r->lnext)->lprev = r->lprev;
  kvidx__pool_del(&ix->S, rid);
  sl->blocks--;
  ix->blocks--;
  if (--er->mult == 0) {
    /* a hole under its children: mark the worker holed before the bit goes,
     * so a concurrent jump search never skips over the hole */
    kvidx__orphans_add(ix, s, er->children, 0);
    kvidx__ent_setbit(ix, e, s, 0, 0);
  }
  if (p != KVIDX__NONE) {
    kvidx__erec *pr = KVIDX__EREC(ix, pid);
    pr->children--;
    if (!pr->mult) kvidx__orphans_add(ix, s, 0, 1); /* it was an orphan itself */
    /* drop e's record before p's: p may be e's radix parent */
    kvidx__erec_maybe_drop(ix, eid);
    kvidx__erec_maybe_drop(ix, pid);
  } else {
    kvidx__erec_maybe_drop(ix, eid);
  }
}

/* A held block gains a tier. */
KVIDX__PRIV void kvidx__add_tier(kvidx *ix, uint32_t s, kvidx__srec *r, int tier) {
  if (r->tiers & (1u << tier)) return;
  r->tiers |= 1u << tier;
  if (tier == KVIDX_TIER_DEVICE) kvidx__dev_add(ix, s, r->entry, KVIDX__EREC(ix, r->er), 1);
}

/* A held block loses one tier's copy (or all); 0 if it had no such copy. */
KVIDX__PRIV int kvidx__drop_tier(kvidx *ix, uint32_t s, uint32_t rid, int tier) {
  kvidx__srec *r = KVIDX__SREC(ix, rid);
  if (tier == KVIDX_TIER_ALL || r->tiers == (1u << tier)) {
    if (tier != KVIDX_TIER_ALL && !(r->tiers & (1u << tier))) return 0;
    kvidx__unhold(ix, s, rid);
    return 1;
  }
  if (!(r->tiers & (1u << tier))) return 0;
  r->tiers &= ~(1u << tier);
  if (tier == KVIDX_TIER_DEVICE) kvidx__dev_add(ix, s, r->entry, KVIDX__EREC(ix, r->er), 0);
  return 1;
}

/* ---- writer lock: events for different workers may come from different
 * threads; they serialize here (a test-and-test-and-set spinlock from C11
 * atomics: critical sections are short and never block). */
KVIDX__PRIV void kvidx__lock(kvidx *ix) {
#ifdef KVIDX_NO_THREADS
  (void)ix;
#else
  while (kvidx__xchg_acq(&ix->wlock, 1))
    while (kvidx__ld(&ix->wlock)) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
#endif
}
KVIDX__PRIV void kvidx__unlock(kvidx *ix) {
#ifdef KVIDX_NO_THREADS
  (void)ix;
#else
  kvidx__st_rel(&ix->wlock, 0);
#endif
}

/* ---- events --------------------------------------------------------------- */
/* Prune the eviction order's first holdings until at most `limit` remain,
 * never the protected record (a store's parent). */
KVIDX__PRIV void kvidx__prune(kvidx *ix, size_t limit, uint32_t protect) {
  if (protect != KVIDX__NONE) kvidx__heap_del(ix, protect); /* out of the order meanwhile */
  while (ix->blocks > limit && ix->heap_n) {
    uint32_t rid = ix->heap[0], s = KVIDX__SREC(ix, rid)->h.slot;
    kvidx__unhold(ix, s, rid);
    if (!ix->slots[s].blocks) kvidx__slot_release(ix, s);
  }
  if (protect != KVIDX__NONE) { /* back in, where its keys put it */
    kvidx__srec *r = KVIDX__SREC(ix, protect);
    ix->heap[ix->heap_n] = protect;
    r->hpos = ix->heap_n++;
    kvidx__heap_up(ix, r->hpos);
  }
}

KVIDX__PRIV int kvidx__heap_reserve(kvidx *ix, size_t need) {
  uint32_t *h;
  size_t ncap;
  if (!ix->evict || need <= ix->heap_cap) return KVIDX_OK;
  if (ix->buffer_mode) return KVIDX_EFULL;
  ncap = ix->heap_cap ? ix->heap_cap : 16;
  while (ncap < need) ncap *= 2;
  h = KVIDX__CAST(uint32_t *, kvidx__alloc(ix, ncap * sizeof(uint32_t)));
  if (!h) return KVIDX_ENOMEM;
  if (ix->heap) {
    memcpy(h, ix->heap, ix->heap_n * sizeof(uint32_t));
    kvidx__free(ix, ix->heap, ix->heap_cap * sizeof(uint32_t));
  }
  ix->heap = h;
  ix->heap_cap = KVIDX__CAST(uint32_t, ncap);
  return KVIDX_OK;
}

KVIDX__PRIV int kvidx__ix_store(kvidx *ix, uint64_t id, uint32_t rank, const uint64_t *parent,
                                const kvidx_block *b, size_t n, int tier, uint64_t expires) {
  uint32_t s = kvidx__slot_find(ix, id, rank), pe = KVIDX__NONE, prid = KVIDX__NONE, added = 0;
  uint32_t prev = KVIDX__NONE; /* the record of pe, once known */
  uint64_t stamp = ++ix->stamp;
  size_t i, lim = ix->max_blocks < n ? 0 : ix->max_blocks - n;
  int rc;
  if (parent) {
    const kvidx__srec *pr =
        s == KVIDX__NONE ? NULL : KVIDX__RCAST(const kvidx__srec *, kvidx__pool_find(&ix->S, s, *parent, &prid));
    if (!pr) return KVIDX_ENOPARENT;
    pe = pr->entry;
  }
  if (n == 0) return KVIDX_OK;
  if (n > KVIDX__ID_LIMIT) return KVIDX_EFULL;
  if (ix->evict) { /* every refusal comes before the prune: a refused store evicts nothing */
    if (n + (parent != NULL) > ix->max_blocks) return KVIDX_EFULL; /* could never fit */
    if (s == KVIDX__NONE && ix->slot_free == KVIDX__NONE) return KVIDX_EFULL; /* no worker slot */
    if (ix->ent_count + n > ix->max_entries) return KVIDX_EFULL; /* worst case; pruning only frees */
  }
  /* reserve first: after this, only the semantic limits can refuse */
  if ((rc = kvidx__pool_reserve(ix, &ix->S, n, ix->max_blocks)) != KVIDX_OK ||
      /* a run needs at most n + 1 worker records: one per new block, plus
       * one for its first parent; later parents are the run's own blocks */
      (rc = kvidx__pool_reserve(ix, &ix->E, n + 1, 2 * ix->max_blocks)) != KVIDX_OK ||
      (rc = kvidx__ent_reserve(ix, n)) != KVIDX_OK ||
      (rc = kvidx__heap_reserve(ix, ix->S.count + n < ix->max_blocks ? ix->S.count + n : ix->max_blocks)) != KVIDX_OK)
    return rc;
  if (ix->evict && ix->blocks > lim) { /* make room: the store then fits */
    kvidx__prune(ix, ix->evict_target < lim ? ix->evict_target : lim, prid);
    s = kvidx__slot_find(ix, id, rank); /* the worker may have been emptied */
  }
  if (!ix->evict && ix->blocks + n > ix->max_blocks) { /* near the limit: count exactly, as the reference does */
    size_t fresh = 0, j;
    for (i = 0; i < n; i++) {
      int seen = s != KVIDX__NONE && kvidx__pool_find(&ix->S, s, b[i].seq, NULL);
      for (j = 0; j < i && !seen; j++) seen = b[j].seq == b[i].seq;
      fresh += !seen;
    }
    if (ix->blocks + fresh > ix->max_blocks) return KVIDX_EFULL;
  }
  if (s == KVIDX__NONE && (s = kvidx__slot_alloc(ix, id, rank)) == KVIDX__NONE) return KVIDX_EFULL;
  {
    int saw_held = 0;
    for (i = 0; i < n; i++) { /* pass 1: new blocks only; held ones are left as they are */
      uint32_t e;
      int fresh = 0;
      uint64_t k1 = 0, k2 = 0;
      const kvidx__srec *held = KVIDX__RCAST(const kvidx__srec *, kvidx__pool_find(&ix->S, s, b[i].seq, NULL));
      if (held) { /* the run goes on from the held block */
        pe = held->entry;
        prev = held->er;
        saw_held = 1;
        continue;
      }
      if ((e = kvidx__ent_get(ix, pe, b[i].local, &fresh)) == KVIDX__NONE) {
        /* max_entries: roll back; this call's records are the newest of the list */
        while (added--) kvidx__unhold(ix, s, ix->slots[s].list);
        if (!ix->slots[s].blocks) kvidx__slot_release(ix, s);
        return KVIDX_EFULL;
      }
      if (ix->evict) kvidx__keys(ix->evict, stamp, &ix->seqno, i, expires, &k1, &k2);
      kvidx__hold(ix, s, b[i].seq, e, fresh, pe, &prev, tier, k1, k2);
      added++;
      pe = e;
    }
    for (i = 0; saw_held && i < n; i++) { /* pass 2, once nothing can fail: a held block */
      uint32_t rid;                     /* gains the tier and a later expiry */
      kvidx__srec *r = KVIDX__RCAST(kvidx__srec *, kvidx__pool_find(&ix->S, s, b[i].seq, &rid));
      kvidx__add_tier(ix, s, r, tier);
      if (ix->evict == KVIDX_EVICT_EXPIRY && expires && expires > r->k1) {
        r->k1 = expires;
        kvidx__heap_fix(ix, rid);
      }
    }
  }
  return KVIDX_OK;
}

KVIDX__PRIV int kvidx__ix_remove(kvidx *ix, uint64_t id, uint32_t rank, const uint64_t *seq, size_t n, int tier) {
  uint32_t s = kvidx__slot_find(ix, id, rank);
  size_t i, unknown = 0;
  for (i = 0; i < n; i++) {
    uint32_t rid;
    if (s != KVIDX__NONE && kvidx__pool_find(&ix->S, s, seq[i], &rid) && kvidx__drop_tier(ix, s, rid, tier)) continue;
    unknown++;
  }
  if (s != KVIDX__NONE && !ix->slots[s].blocks) kvidx__slot_release(ix, s);
  return unknown ? KVIDX_ENOENT : KVIDX_OK;
}

KVIDX__PRIV size_t kvidx__ix_expire(kvidx *ix, uint64_t now) {
  size_t n = 0;
  while (ix->heap_n && KVIDX__SREC(ix, ix->heap[0])->k1 <= now) {
    uint32_t rid = ix->heap[0], s = KVIDX__SREC(ix, rid)->h.slot;
    kvidx__unhold(ix, s, rid);
    if (!ix->slots[s].blocks) kvidx__slot_release(ix, s);
    n++;
  }
  return n;
}

KVIDX__PRIV void kvidx__ix_clear_slot(kvidx *ix, uint32_t s) {
  while (ix->slots[s].list != KVIDX__NONE) kvidx__unhold(ix, s, ix->slots[s].list);
  kvidx__slot_release(ix, s);
}

/* ========================================================================== */
/* 5. Queries: radix walk and positional jump search                         */
/* ========================================================================== */
/* kvidx__probe: the one reader primitive.  Finds the entry for a key and
 * copies its bitset, as a consistent snapshot, into `bits`; 0 = no entry
 * (bits zeroed).  Lock-free: see the argument in section 6. */
/* Retries: a writer preempted inside a critical section keeps an entry odd
 * for a whole time slice, so readers back off (pause, then yield) instead of
 * giving up early; KVIDX__MAX_TRIES (about a second of yields) bounds it. */
#define KVIDX__MAX_TRIES (1u << 20)
#define KVIDX__MAX_STEPS 4096

KVIDX__PRIV void kvidx__backoff(uint32_t tries) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
  if ((tries & 63) == 0) KVIDX__YIELD();
}

typedef struct {
  uint32_t max_tries; /* KVIDX__MAX_TRIES; 1 in the interleaving test      */
  int gave_up;        /* a probe found no consistent snapshot              */
  uint32_t nw;        /* bitset words in play for this query               */
} kvidx__rctx;

KVIDX__PRIV int kvidx__probe(const kvidx *cix, kvidx__rctx *rc, uint32_t pos, uint32_t parent, uint64_t local,
                             uint64_t chain, uint64_t *bits, uint64_t *dev, uint32_t *id_out) {
  kvidx *ix = KVIDX__MUT(cix); /* atomics are loaded, never stored */
  uint32_t h = kvidx__key_hash(ix->kind, pos, parent, local), tries, i, nw = rc->nw;
  int radix = ix->kind == KVIDX_RADIX;
  for (tries = 0;; tries++) {
    uint32_t tv, b, id, steps = 0;
    kvidx__tab *t;
    int again = 0;
    if (tries == rc->max_tries) {
      rc->gave_up = 1;
      break;
    }
    if (tries) kvidx__backoff(tries);
    tv = kvidx__ld_acq(&ix->tab_ver);
    if (tv & 1) continue; /* the bucket array is being rebuilt */
    t = kvidx__ld_acq(&ix->tab);
    b = h & t->mask;
    id = kvidx__ld_acq(&KVIDX__HEADS(t)[b]);
    while (id && !again) {
      kvidx__ent *e = kvidx__ent_rd(ix, id - 1);
      uint32_t v1, v2, eh, nx;
      int match;
      if (!e || ++steps > KVIDX__MAX_STEPS) { again = 1; break; } /* bounds / cycles */
      v1 = kvidx__ld_acq(&e->ver);
      if (v1 & 1) { again = 1; break; }
      eh = kvidx__ld(&e->hash);
      nx = kvidx__ld(&e->next);
      match = eh == h && kvidx__ld(&e->local) == local &&
              (radix ? kvidx__ld(&e->parent) == parent
                     : kvidx__ld(&e->pos) == pos && kvidx__ld(&e->chain) == chain);
      if (match) {
        KVIDX__A(uint64_t) *src = kvidx__ent_bits(e);
        for (i = 0; i < nw; i++) bits[i] = kvidx__ld(&src[i]);
        if (dev) /* without tiers every copy is a device copy */
          for (src = ix->tiers_on ? kvidx__ent_dev(ix, e) : src, i = 0; i < nw; i++) dev[i] = kvidx__ld(&src[i]);
      }
      kvidx__fence_acq();
      v2 = kvidx__ld(&e->ver);
      if (v1 != v2 || (eh & t->mask) != b) { again = 1; break; } /* changed or moved */
      if (match) {
        if (id_out) *id_out = id - 1;
        return 1;
      }
      id = nx;
    }
    if (again) continue;
    kvidx__fence_acq();
    if (kvidx__ld(&ix->tab_ver) == tv) break; /* a miss is only trusted if no rehash ran */
  }
  for (i = 0; i < nw; i++) bits[i] = 0;
  if (dev)
    for (i = 0; i < nw; i++) dev[i] = 0;
  return 0;
}

/* Radix: walk edge by edge; no hashing on the read path. */
KVIDX__PRIV void kvidx__radix_find(const kvidx *ix, kvidx__rctx *rc, const uint64_t *loc, size_t n,
                                   kvidx__sink *k) {
  uint64_t act[KVIDX__NW_MAX], b[KVIDX__NW_MAX], d[KVIDX__NW_MAX];
  uint32_t nw = rc->nw, cur = KVIDX__NONE, i;
  size_t pos;
  for (pos = 0; pos < n; pos++) {
    int any = 0;
    if (!kvidx__probe(ix, rc, 0, cur, loc[pos], 0, b, NULL, &cur)) break;
    for (i = 0; i < nw; i++) {
      uint64_t nb = pos ? act[i] & b[i] : b[i];
      d[i] = pos ? act[i] & ~nb : 0;
      act[i] = nb;
      any |= nb != 0;
    }
    if (pos) kvidx__emit(ix, k, d, pos);
    if (!any) return;
  }
  if (pos) kvidx__emit(ix, k, act, pos);
}

/* Positional: jump search with binary-searched drain points.
 *
 * Why it is exact.  Let q_i be the query's chain hashes, computed
 * incrementally and only as far as the search reaches.  A probe at position
 * j answers "which workers hold an entry whose (position, local, CHAIN) is
 * (j, l_j, q_j)": the chain is always compared, even when the entry is the
 * only one at (j, l_j), so a worker that diverged earlier and shares a chunk
 * at j is never counted (trap 1, "lazy hashing").
 * A worker with no orphans (every block it holds has its parent chain held
 * too; the writer keeps this count exact per worker, see kvidx__hold and
 * kvidx__unhold) that holds q_j holds q_0..q_j: the parent chain of q_j is
 * q_{j-1}, held, and so on down to q_0.  For such workers "holds q_j" is
 * monotone in j, so one probe at the far end of a jump proves the whole
 * range, and a drain point can be found by bisection (so the jump may also
 * grow: it doubles after each jump that kept every worker).  A worker with a hole
 * (orphans > 0) breaks monotonicity (trap 2, Dynamo's strided check): while
 * any such worker is still active the search steps one position at a time,
 * which verifies every position for it.  Nothing else is skipped. */
typedef struct {
  const kvidx *ix;
  kvidx__rctx *rc;
  const uint64_t *loc;
  size_t n, qn;
  uint64_t q[2 * KVIDX_JUMP_MAX + 2]; /* ring: chains of the last positions */
  kvidx__sink *k;
} kvidx__pq;

#define KVIDX__QRING (2 * KVIDX_JUMP_MAX + 2)

KVIDX__PRIV void kvidx__pq_init(kvidx__pq *p, const kvidx *ix, kvidx__rctx *rc, const uint64_t *loc, size_t n,
                                kvidx__sink *k) {
  p->ix = ix;
  p->rc = rc;
  p->loc = loc;
  p->n = n;
  p->qn = 0;
  p->k = k;
}

KVIDX__PRIV uint64_t kvidx__pq_chain(kvidx__pq *p, size_t j) {
  while (p->qn <= j) {
    size_t i = p->qn++;
    p->q[i % KVIDX__QRING] = i ? kvidx_seq_hash_next(p->q[(i - 1) % KVIDX__QRING], p->loc[i]) : p->loc[0];
  }
  return p->q[j % KVIDX__QRING];
}

KVIDX__PRIV int kvidx__pq_probe(kvidx__pq *p, size_t j, uint64_t *bits) {
  return kvidx__probe(p->ix, p->rc, KVIDX__CAST(uint32_t, j), 0, p->loc[j], kvidx__pq_chain(p, j), bits, NULL, NULL);
}

/* Every worker of d holds q_0..q_lo and not q_hi; none has holes. */
KVIDX__PRIV void kvidx__pq_drain(kvidx__pq *p, size_t lo, size_t hi, uint64_t *d) {
  uint64_t b[KVIDX__NW_MAX], in[KVIDX__NW_MAX];
  uint32_t nw = p->rc->nw, i;
  memset(in, 0, sizeof(uint64_t) * nw); /* quiets -Wmaybe-uninitialized at -O2 */
  if (hi - lo <= 4) { /* short range: a linear scan is cheaper */
    size_t j;
    for (j = lo + 1; j < hi; j++) {
      int any = 0;
      kvidx__pq_probe(p, j, b);
      for (i = 0; i < nw; i++) {
        in[i] = d[i] & ~b[i]; /* dropped at j: score j */
        d[i] &= b[i];
        any |= d[i] != 0;
      }
      kvidx__emit(p->ix, p->k, in, j);
      if (!any) return;
    }
    kvidx__emit(p->ix, p->k, d, hi);
    return;
  } else {
    size_t mid = lo + (hi - lo) / 2;
    int any_in = 0, any_out = 0;
    kvidx__pq_probe(p, mid, b);
    for (i = 0; i < nw; i++) {
      in[i] = d[i] & b[i];
      d[i] &= ~b[i];
      any_in |= in[i] != 0;
      any_out |= d[i] != 0;
    }
    if (any_out) kvidx__pq_drain(p, lo, mid, d); /* shallower first: sink order */
    if (any_in) kvidx__pq_drain(p, mid, hi, in);
  }
}

KVIDX__PRIV void kvidx__pos_find(const kvidx *ix, kvidx__rctx *rc, const uint64_t *loc, size_t n,
                                 kvidx__sink *k) {
  kvidx__pq p;
  uint64_t act[KVIDX__NW_MAX], b[KVIDX__NW_MAX], d[KVIDX__NW_MAX];
  uint32_t nw = rc->nw, i;
  size_t cur = 0, jump = ix->jump;
  kvidx__pq_init(&p, ix, rc, loc, n, k);
  if (!n || !kvidx__pq_probe(&p, 0, act) || !kvidx__bs_any(act, nw)) return;
  while (cur + 1 < n) {
    size_t nxt = cur + jump < n - 1 ? cur + jump : n - 1;
    int same = 1, any = 0;
    for (i = 0; i < nw && nxt > cur + 1; i++)
      if (act[i] & kvidx__ld(&KVIDX__MUT(ix)->holed[i])) nxt = cur + 1; /* a hole: step */
    kvidx__pq_probe(&p, nxt, b);
    for (i = 0; i < nw; i++) {
      b[i] &= act[i];
      d[i] = act[i] & ~b[i];
      same &= d[i] == 0;
      any |= b[i] != 0;
    }
    if (!same) kvidx__pq_drain(&p, cur, nxt, d);
    memcpy(act, b, nw * sizeof(uint64_t));
    cur = nxt;
    if (!any) return;
    /* gallop: a jump that kept every worker doubles the next one (long
     * shared prefixes cost log probes); one that lost a worker resets it */
    jump = same ? (2 * jump < KVIDX_JUMP_MAX ? 2 * jump : KVIDX_JUMP_MAX) : ix->jump;
  }
  kvidx__emit(ix, k, act, cur + 1);
}

/* Tiered query, both kinds: walk every position, count device hits. */
KVIDX__PRIV void kvidx__tier_find(const kvidx *ix, kvidx__rctx *rc, const uint64_t *loc, size_t n, kvidx__sink *k) {
  kvidx__pq p;
  uint64_t act[KVIDX__NW_MAX], b[KVIDX__NW_MAX], dv[KVIDX__NW_MAX], d[KVIDX__NW_MAX];
  uint32_t cnt[KVIDX_WORKERS_MAX], nw = rc->nw, i, cur = KVIDX__NONE;
  size_t pos;
  int radix = ix->kind == KVIDX_RADIX;
  kvidx__pq_init(&p, ix, rc, loc, n, k);
  for (pos = 0; pos < n; pos++) {
    int any = 0, found =
        radix ? kvidx__probe(ix, rc, 0, cur, loc[pos], 0, b, dv, &cur)
              : kvidx__probe(ix, rc, KVIDX__CAST(uint32_t, pos), 0, loc[pos], kvidx__pq_chain(&p, pos), b, dv, NULL);
    if (!found) break;
    for (i = 0; i < nw; i++) {
      uint64_t nb = pos ? act[i] & b[i] : b[i], w;
      d[i] = pos ? act[i] & ~nb : 0;
      act[i] = nb;
      any |= nb != 0;
      for (w = nb; w; w &= w - 1) { /* count device hits of the survivors */
        uint32_t sl = i * 64 + kvidx__ctz64(w);
        uint32_t hit = KVIDX__CAST(uint32_t, (dv[i] >> (sl & 63)) & 1);
        cnt[sl] = pos ? cnt[sl] + hit : hit;
      }
    }
    if (pos) kvidx__emit_cnt(ix, k, d, pos, cnt);
    if (!any) return;
  }
  if (pos) kvidx__emit_cnt(ix, k, act, pos, cnt);
}

/* ========================================================================== */
/* 6. Concurrency: the contract and why the reader path is safe              */
/* ========================================================================== */
/* Contract.
 *  - kvidx_find_matches, _ex and _tiered may run on any number of threads at
 *    any time, beside the writers below, for KVIDX_RADIX and
 *    KVIDX_POSITIONAL: lock-free, no lock, no shared writes, never blocking a
 *    writer.  kvidx_worker_blocks, kvidx_get_stats and kvidx_last_event_id
 *    may also be called at any time: they read writer state under the
 *    writer lock (briefly).  kvidx_dump and kvidx_snapshot_write hold the
 *    writer lock while they run (readers go on, writers wait).
 *  - kvidx_store / _ttl / remove / clear / remove_worker / apply / expire:
 *    events of one worker from
 *    one thread at a time (sticky routing), in order; events of different
 *    workers may come from different threads at once.  Writers serialize on
 *    one short internal spinlock (the shared entry table and pools are one
 *    structure); find_matches never touches it.
 *  - create / init_buffer / destroy / snapshot_read / kvidx__check: no other
 *    call at the same time.  KVIDX_REFERENCE and KVIDX_NO_THREADS builds: one thread.
 * What a reader sees.  Each probed entry is a consistent snapshot (its
 * seqlock version was even and unchanged around the copy), so bitsets are
 * never torn.  A worker whose blocks did not change during the query gets its
 * exact score: its entries keep its bit throughout, entries it holds cannot be
 * freed, and a miss is only believed if the bucket array was not rebuilt
 * meanwhile (tab_ver).  A worker that changed may be seen before, after, or
 * part way through the change.
 * Why no read goes astray.  Readers follow only 32-bit entry ids.  Each id is
 * bounds-checked against the chunk table (kvidx__ent_at returns NULL past it);
 * chunks are never freed or moved before destroy, and entries are type-stable
 * (a freed entry is only ever reused as an entry), so any id in range names
 * valid atomic words.  Chain walks are bounded (KVIDX__MAX_STEPS) because
 * speculative next links can form cycles, and validated: an entry whose
 * version changed, or whose stored key hash no longer belongs to the bucket
 * (it was freed and reused elsewhere), restarts the probe.  Retired bucket
 * arrays are kept until destroy (they total less than the live one), so a
 * reader holding an old array reads valid memory.  Retries are bounded
 * (KVIDX__MAX_TRIES); a probe that exhausts them (a writer rebuilding forever)
 * reports a miss, i.e. a lower score, never a wrong worker or a crash. */

/* ========================================================================== */
/* 7. Public API: lifecycle, events, stats, invariant checker                */
/* ========================================================================== */
typedef struct {
  uint32_t max_workers, nw, jump, stride, slot_map_n, evtab_n;
  size_t max_blocks, max_entries, fixed, total, srec_size;
} kvidx__plan;

KVIDX__PRIV int kvidx__plan_cfg(const kvidx_config *cfg, int buffer, kvidx__plan *pl) {
  if (!cfg || cfg->kind < KVIDX_RADIX || cfg->kind > KVIDX_REFERENCE || (cfg->flags & ~KVIDX_F_TIERS))
    return KVIDX_EINVAL;
  if ((cfg->alloc == NULL) != (cfg->free == NULL)) return KVIDX_EINVAL;
  pl->max_workers = cfg->max_workers ? cfg->max_workers
                                     : (KVIDX__DEFAULT_WORKERS < KVIDX_WORKERS_MAX ? KVIDX__DEFAULT_WORKERS
                                                                                   : KVIDX_WORKERS_MAX);
  if (pl->max_workers > KVIDX_WORKERS_MAX) return KVIDX_EINVAL;
  pl->jump = cfg->jump ? cfg->jump : KVIDX__DEFAULT_JUMP;
  if (pl->jump > KVIDX_JUMP_MAX) return KVIDX_EINVAL;
  pl->nw = (pl->max_workers + 63) / 64;
  /* the any-tier bitset, and the device bitset when tiers are tracked */
  pl->stride = KVIDX__CAST(uint32_t, sizeof(kvidx__ent) + ((cfg->flags & KVIDX_F_TIERS) ? 16 : 8) * pl->nw);
  pl->slot_map_n = kvidx__pow2(2 * KVIDX__CAST(uint64_t, pl->max_workers));
  pl->max_blocks = cfg->max_blocks ? cfg->max_blocks
                                   : buffer ? KVIDX_BUFFER_DEFAULT_BLOCKS : KVIDX__ID_LIMIT / 2;
  if (pl->max_blocks > KVIDX__ID_LIMIT / 2) return KVIDX_EINVAL;
  pl->max_entries = cfg->max_entries ? cfg->max_entries : buffer ? pl->max_blocks : KVIDX__ID_LIMIT;
  if (pl->max_entries > KVIDX__ID_LIMIT) return KVIDX_EINVAL;
  if (cfg->evict < KVIDX_EVICT_NONE || cfg->evict > KVIDX_EVICT_EXPIRY || cfg->evict_target_pct > 100 ||
      (cfg->evict && !cfg->max_blocks))
    return KVIDX_EINVAL;
  pl->srec_size = cfg->evict ? sizeof(kvidx__srec) : KVIDX__SREC_SMALL;
  pl->evtab_n = kvidx__pow2(2 * KVIDX__CAST(uint64_t, pl->max_workers));
  pl->fixed = kvidx__align(sizeof(kvidx)) + kvidx__align(sizeof(kvidx__slot) * pl->max_workers) +
              kvidx__align(sizeof(uint32_t) * pl->slot_map_n) + kvidx__align(8 * pl->nw) +
              kvidx__align(sizeof(kvidx__evid) * pl->evtab_n);
  pl->total = pl->fixed;
  if (buffer) {
    if (cfg->kind == KVIDX_REFERENCE) return KVIDX_ENOTSUP;
    pl->total += kvidx__pool_bytes(pl->srec_size, KVIDX__CAST(uint32_t, pl->max_blocks)) +
                 (cfg->evict ? kvidx__align(sizeof(uint32_t) * pl->max_blocks) : 0) +
                 kvidx__pool_bytes(sizeof(kvidx__erec), KVIDX__CAST(uint32_t, 2 * pl->max_blocks)) +
                 kvidx__align(pl->max_entries * pl->stride) +
                 kvidx__align(kvidx__tab_bytes(kvidx__pow2(pl->max_entries))) + 64;
  }
  return KVIDX_OK;
}

/* Lay out the fixed part (and in buffer mode everything) from mem. */
KVIDX__PRIV kvidx *kvidx__setup(const kvidx_config *cfg, const kvidx__plan *pl, unsigned char *mem, int buffer) {
  kvidx *ix = KVIDX__RCAST(kvidx *, mem);
  uint32_t i;
  memset(mem, 0, pl->fixed);
  ix->kind = cfg->kind;
  ix->buffer_mode = buffer;
  ix->alloc = cfg->alloc;
  ix->free = cfg->free;
  ix->actx = cfg->alloc_ctx;
  ix->max_workers = pl->max_workers;
  ix->nw = pl->nw;
  ix->jump = pl->jump;
  ix->stride = pl->stride;
  ix->max_blocks = pl->max_blocks;
  ix->max_entries = pl->max_entries;
  mem += kvidx__align(sizeof(kvidx));
  ix->slots = KVIDX__RCAST(kvidx__slot *, mem);
  mem += kvidx__align(sizeof(kvidx__slot) * pl->max_workers);
  ix->slot_map = KVIDX__RCAST(uint32_t *, mem);
  ix->slot_map_mask = pl->slot_map_n - 1;
  mem += kvidx__align(sizeof(uint32_t) * pl->slot_map_n);
  ix->holed = KVIDX__RCAST(KVIDX__A(uint64_t) *, mem);
  mem += kvidx__align(8 * pl->nw);
  ix->evtab = KVIDX__RCAST(kvidx__evid *, mem);
  ix->evtab_mask = pl->evtab_n - 1;
  mem += kvidx__align(sizeof(kvidx__evid) * pl->evtab_n);
  ix->evict = cfg->evict;
  ix->tiers_on = (cfg->flags & KVIDX_F_TIERS) != 0;
  ix->evict_target = pl->max_blocks * (cfg->evict_target_pct ? cfg->evict_target_pct : 80) / 100;
  for (i = 0; i < pl->max_workers; i++) {
    ix->slots[i].free_next = i + 1 < pl->max_workers ? i + 1 : KVIDX__NONE;
    ix->slots[i].list = KVIDX__NONE;
  }
  ix->slot_free = 0;
  ix->ent_free = KVIDX__NONE;
  ix->S.rec_size = pl->srec_size;
  ix->E.rec_size = sizeof(kvidx__erec);
  ix->S.free_head = ix->E.free_head = KVIDX__NONE;
  ix->cap0 = 1024;
  ix->shift0 = 10;
  if (buffer) {
    uint32_t nb = kvidx__pow2(pl->max_entries);
    kvidx__tab *t;
    kvidx__pool_place(&ix->S, mem, pl->srec_size, KVIDX__CAST(uint32_t, pl->max_blocks));
    mem += kvidx__pool_bytes(pl->srec_size, KVIDX__CAST(uint32_t, pl->max_blocks));
    if (cfg->evict) {
      ix->heap = KVIDX__RCAST(uint32_t *, mem);
      ix->heap_cap = KVIDX__CAST(uint32_t, pl->max_blocks);
      mem += kvidx__align(sizeof(uint32_t) * pl->max_blocks);
    }
    kvidx__pool_place(&ix->E, mem, sizeof(kvidx__erec), KVIDX__CAST(uint32_t, 2 * pl->max_blocks));
    mem += kvidx__pool_bytes(sizeof(kvidx__erec), KVIDX__CAST(uint32_t, 2 * pl->max_blocks));
    memset(mem, 0, pl->max_entries * pl->stride);
    kvidx__st(&ix->chunks[0], mem);
    ix->cap0 = ix->ent_cap = KVIDX__CAST(uint32_t, pl->max_entries);
    ix->shift0 = 31; /* no further chunks: every id >= cap0 is out of range */
    mem += kvidx__align(pl->max_entries * pl->stride);
    t = KVIDX__RCAST(kvidx__tab *, mem);
    t->mask = nb - 1;
    t->older = NULL;
    for (i = 0; i < nb; i++) kvidx__st(&KVIDX__HEADS(t)[i], 0u);
    kvidx__st(&ix->tab, t);
  }
  return ix;
}

KVIDX_DEF size_t kvidx_buffer_size(const kvidx_config *cfg) {
  kvidx__plan pl;
  return kvidx__plan_cfg(cfg, 1, &pl) == KVIDX_OK ? pl.total + 64 : 0;
}

KVIDX_DEF int kvidx_init_buffer(kvidx **out, const kvidx_config *cfg, void *mem, size_t len) {
  kvidx__plan pl;
  unsigned char *m;
  size_t adj;
  int rc;
  if (!out || !mem) return KVIDX_EINVAL;
  *out = NULL;
  if ((rc = kvidx__plan_cfg(cfg, 1, &pl)) != KVIDX_OK) return rc;
  adj = (64 - (KVIDX__CAST(size_t, KVIDX__RCAST(uintptr_t, mem)) & 63)) & 63;
  if (len < pl.total + 64) return KVIDX_EINVAL;
  m = KVIDX__CAST(unsigned char *, mem) + adj;
  *out = kvidx__setup(cfg, &pl, m, 1);
  (*out)->bytes = (*out)->peak = (*out)->buf_len = len;
  return KVIDX_OK;
}

KVIDX_DEF int kvidx_create(kvidx **out, const kvidx_config *cfg) {
  kvidx__plan pl;
  unsigned char *m;
  kvidx *ix;
  int rc;
  if (!out) return KVIDX_EINVAL;
  *out = NULL;
  if ((rc = kvidx__plan_cfg(cfg, 0, &pl)) != KVIDX_OK) return rc;
#ifdef KVIDX_NO_MALLOC
  if (!cfg->alloc) return KVIDX_EINVAL;
#endif
  m = KVIDX__CAST(unsigned char *, kvidx__raw_alloc(cfg->alloc, cfg->alloc_ctx, pl.fixed));
  if (!m) return KVIDX_ENOMEM;
  ix = kvidx__setup(cfg, &pl, m, 0);
  ix->bytes = ix->peak = ix->fixed_bytes = pl.fixed;
  if (ix->kind == KVIDX_REFERENCE) {
    size_t wb = sizeof(kvidx__rworker) * ix->max_workers;
    ix->ref = KVIDX__CAST(kvidx__ref *, kvidx__alloc(ix, sizeof(kvidx__ref)));
    if (ix->ref) {
      memset(ix->ref, 0, sizeof *ix->ref);
      ix->ref->w = KVIDX__CAST(kvidx__rworker *, kvidx__alloc(ix, wb));
      if (ix->ref->w) memset(ix->ref->w, 0, wb);
    }
    if (!ix->ref || !ix->ref->w) {
      kvidx_destroy(ix);
      return KVIDX_ENOMEM;
    }
  } else {
    kvidx__tab *t = KVIDX__CAST(kvidx__tab *, kvidx__alloc(ix, kvidx__tab_bytes(16)));
    uint32_t i;
    if (!t) {
      kvidx_destroy(ix);
      return KVIDX_ENOMEM;
    }
    t->mask = 15;
    t->older = NULL;
    t->bytes = kvidx__tab_bytes(16);
    for (i = 0; i < 16; i++) kvidx__st(&KVIDX__HEADS(t)[i], 0u);
    kvidx__st(&ix->tab, t);
  }
  *out = ix;
  return KVIDX_OK;
}

KVIDX_DEF void kvidx_destroy(kvidx *ix) {
  unsigned k;
  if (!ix || ix->buffer_mode) return; /* buffer mode: the caller owns the memory */
  if (ix->ref) {
    if (ix->ref->w) {
      uint32_t i;
      for (i = 0; i < ix->max_workers; i++) {
        kvidx__rmap_drop(ix, &ix->ref->w[i].blocks);
        kvidx__rmap_drop(ix, &ix->ref->w[i].chains);
      }
      kvidx__free(ix, ix->ref->w, sizeof(kvidx__rworker) * ix->max_workers);
    }
    kvidx__free(ix, ix->ref, sizeof(kvidx__ref));
  }
  {
    kvidx__tab *t = kvidx__ld(&ix->tab);
    while (t) {
      kvidx__tab *o = t->older;
      kvidx__free(ix, t, t->bytes);
      t = o;
    }
  }
  for (k = 0; k < KVIDX__CHUNKS; k++) {
    unsigned char *c = kvidx__ld(&ix->chunks[k]);
    if (c) kvidx__free(ix, c, (k == 0 ? ix->cap0 : (KVIDX__CAST(size_t, ix->cap0) << k)) * ix->stride);
  }
  if (ix->heap) kvidx__free(ix, ix->heap, ix->heap_cap * sizeof(uint32_t));
  if (ix->S.recs) kvidx__free(ix, ix->S.recs, kvidx__pool_bytes(ix->S.rec_size, ix->S.cap));
  if (ix->E.recs) kvidx__free(ix, ix->E.recs, kvidx__pool_bytes(ix->E.rec_size, ix->E.cap));
  kvidx__free(ix, ix, ix->fixed_bytes);
}

KVIDX__PRIV int kvidx__store(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq,
                             const kvidx_block *b, size_t n, int tier, uint64_t expires) {
  int rc;
  if (!ix || (n && !b) || tier < KVIDX_TIER_DEVICE || tier > KVIDX_TIER_DISK) return KVIDX_EINVAL;
  if (tier != KVIDX_TIER_DEVICE && !ix->tiers_on) return KVIDX_ENOTSUP;
  if (ix->kind == KVIDX_REFERENCE) return kvidx__ref_store(ix, worker_id, dp_rank, parent_seq, b, n, tier, expires);
  kvidx__lock(ix);
  rc = kvidx__ix_store(ix, worker_id, dp_rank, parent_seq, b, n, tier, expires);
  kvidx__unlock(ix);
  return rc;
}

KVIDX__PRIV int kvidx__remove(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *seq, size_t n,
                              int tier) {
  int rc;
  if (!ix || (n && !seq) || (tier != KVIDX_TIER_ALL && (tier < KVIDX_TIER_DEVICE || tier > KVIDX_TIER_DISK)))
    return KVIDX_EINVAL;
  if (ix->kind == KVIDX_REFERENCE) return kvidx__ref_remove(ix, worker_id, dp_rank, seq, n, tier);
  kvidx__lock(ix);
  rc = kvidx__ix_remove(ix, worker_id, dp_rank, seq, n, tier);
  kvidx__unlock(ix);
  return rc;
}

KVIDX_DEF int kvidx_store(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq,
                          const kvidx_block *b, size_t n) {
  return kvidx__store(ix, worker_id, dp_rank, parent_seq, b, n, KVIDX_TIER_DEVICE, 0);
}

KVIDX_DEF int kvidx_store_ttl(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq,
                              const kvidx_block *b, size_t n, uint64_t expires_at) {
  if (ix && ix->evict != KVIDX_EVICT_EXPIRY) return KVIDX_ENOTSUP;
  return kvidx__store(ix, worker_id, dp_rank, parent_seq, b, n, KVIDX_TIER_DEVICE, expires_at);
}

KVIDX_DEF int kvidx_remove(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *seq, size_t n) {
  return kvidx__remove(ix, worker_id, dp_rank, seq, n, KVIDX_TIER_ALL);
}

KVIDX_DEF int kvidx_expire(kvidx *ix, uint64_t now, size_t *removed) {
  size_t n;
  if (removed) *removed = 0;
  if (!ix) return KVIDX_EINVAL;
  if (ix->evict != KVIDX_EVICT_EXPIRY) return KVIDX_ENOTSUP;
  if (ix->kind == KVIDX_REFERENCE) {
    n = kvidx__ref_expire(ix, now);
  } else {
    kvidx__lock(ix);
    n = kvidx__ix_expire(ix, now);
    kvidx__unlock(ix);
  }
  if (removed) *removed = n;
  return KVIDX_OK;
}

/* ---- event ids -------------------------------------------------------------
 * A linear-probing table of (worker, dp_rank) -> last event id with twice as
 * many places as worker slots.  When it is 3/4 full, entries of workers that
 * hold nothing are dropped (their next event counts as a first one); at most
 * max_workers workers hold blocks, so that always makes room. */
KVIDX__PRIV uint32_t kvidx__ev_home(const kvidx *ix, uint64_t id, uint32_t rank) {
  return KVIDX__CAST(uint32_t, kvidx__mix(id ^ (KVIDX__CAST(uint64_t, rank) << 48) ^ rank)) & ix->evtab_mask;
}

KVIDX__PRIV kvidx__evid *kvidx__ev_find(const kvidx *ix, uint64_t id, uint32_t rank) {
  uint32_t i;
  for (i = kvidx__ev_home(ix, id, rank); ix->evtab[i].used; i = (i + 1) & ix->evtab_mask)
    if (ix->evtab[i].id == id && ix->evtab[i].rank == rank) return &ix->evtab[i];
  return NULL;
}

KVIDX__PRIV void kvidx__ev_del(kvidx *ix, uint32_t i) { /* backward-shift deletion */
  uint32_t m = ix->evtab_mask, j;
  ix->evtab[i].used = 0;
  for (j = (i + 1) & m; ix->evtab[j].used; j = (j + 1) & m) {
    uint32_t h = kvidx__ev_home(ix, ix->evtab[j].id, ix->evtab[j].rank);
    if (((j - h) & m) >= ((j - i) & m)) {
      ix->evtab[i] = ix->evtab[j];
      ix->evtab[j].used = 0;
      i = j;
    }
  }
  ix->evtab_n--;
}

KVIDX__PRIV size_t kvidx__blocks_of(const kvidx *ix, uint64_t id, uint32_t rank);

KVIDX__PRIV kvidx__evid *kvidx__ev_put(kvidx *ix, uint64_t id, uint32_t rank) {
  uint32_t i;
  if ((ix->evtab_n + 1) * 4 > (ix->evtab_mask + 1) * 3) {
    int again = 1;
    while (again) /* deletions shift entries back: sweep until none goes */
      for (again = 0, i = 0; i <= ix->evtab_mask; i++)
        if (ix->evtab[i].used && !kvidx__blocks_of(ix, ix->evtab[i].id, ix->evtab[i].rank)) {
          kvidx__ev_del(ix, i);
          again = 1;
        }
  }
  for (i = kvidx__ev_home(ix, id, rank); ix->evtab[i].used; i = (i + 1) & ix->evtab_mask) {}
  ix->evtab[i].used = 1;
  ix->evtab[i].id = id;
  ix->evtab[i].rank = rank;
  ix->evtab_n++;
  return &ix->evtab[i];
}

/* The event's operation, without locking (the caller holds the lock). */
KVIDX__PRIV int kvidx__apply_op(kvidx *ix, const kvidx_event *ev) {
  int ref = ix->kind == KVIDX_REFERENCE;
  switch (ev->type) {
  case KVIDX_EV_STORED:
    return ref ? kvidx__ref_store(ix, ev->worker_id, ev->dp_rank, ev->parent, ev->blocks, ev->n, ev->tier,
                                  ev->expires_at)
               : kvidx__ix_store(ix, ev->worker_id, ev->dp_rank, ev->parent, ev->blocks, ev->n, ev->tier,
                                 ev->expires_at);
  case KVIDX_EV_REMOVED:
    return ref ? kvidx__ref_remove(ix, ev->worker_id, ev->dp_rank, ev->seqs, ev->n, ev->tier)
               : kvidx__ix_remove(ix, ev->worker_id, ev->dp_rank, ev->seqs, ev->n, ev->tier);
  default: /* KVIDX_EV_CLEARED */
    if (ref) {
      kvidx__rworker *w = kvidx__ref_worker(ix, ev->worker_id, ev->dp_rank);
      if (w) kvidx__ref_clear_worker(ix, w);
    } else {
      uint32_t s = kvidx__slot_find(ix, ev->worker_id, ev->dp_rank);
      if (s != KVIDX__NONE) kvidx__ix_clear_slot(ix, s);
    }
    return KVIDX_OK;
  }
}

KVIDX_DEF int kvidx_apply(kvidx *ix, const kvidx_event *ev) {
  kvidx__evid *e;
  int rc, info = KVIDX_OK;
  if (!ix || !ev || ev->type < KVIDX_EV_STORED || ev->type > KVIDX_EV_CLEARED) return KVIDX_EINVAL;
  if (ev->type == KVIDX_EV_STORED &&
      ((ev->n && !ev->blocks) || ev->tier < KVIDX_TIER_DEVICE || ev->tier > KVIDX_TIER_DISK))
    return KVIDX_EINVAL;
  if (ev->type == KVIDX_EV_REMOVED && ((ev->n && !ev->seqs) || (ev->tier != KVIDX_TIER_ALL &&
                                                                (ev->tier < KVIDX_TIER_DEVICE || ev->tier > KVIDX_TIER_DISK))))
    return KVIDX_EINVAL;
  if (ev->type == KVIDX_EV_STORED && ev->expires_at && ix->evict != KVIDX_EVICT_EXPIRY) return KVIDX_ENOTSUP;
  if (ev->type == KVIDX_EV_STORED && ev->tier != KVIDX_TIER_DEVICE && !ix->tiers_on) return KVIDX_ENOTSUP;
  kvidx__lock(ix);
  e = kvidx__ev_find(ix, ev->worker_id, ev->dp_rank);
  if (e && ev->event_id == e->last) {
    kvidx__unlock(ix);
    return KVIDX_DUPLICATE;
  }
  if (e && ev->event_id < e->last) { /* the engine restarted: its cache is gone */
    kvidx_event clr = *ev;
    clr.type = KVIDX_EV_CLEARED;
    kvidx__apply_op(ix, &clr);
    info = KVIDX_RESTARTED;
  } else if (e && ev->event_id > e->last + 1) {
    info = KVIDX_GAP;
  }
  rc = kvidx__apply_op(ix, ev);
  if (rc == KVIDX_ENOMEM || rc == KVIDX_EFULL) {
    /* a resource refusal: the caller may retry the same event, so its id is
     * not used up; after a restart the worker starts afresh */
    if (info == KVIDX_RESTARTED) kvidx__ev_del(ix, KVIDX__CAST(uint32_t, e - ix->evtab));
  } else { /* applied, or refused for good (unknown parent / seqs): the id counts */
    if (!e) e = kvidx__ev_put(ix, ev->worker_id, ev->dp_rank);
    e->last = ev->event_id;
  }
  kvidx__unlock(ix);
  return rc != KVIDX_OK ? rc : info;
}

KVIDX_DEF int kvidx_last_event_id(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank, uint64_t *out) {
  const kvidx__evid *e;
  int rc = KVIDX_ENOENT;
  if (!ix || !out) return KVIDX_EINVAL;
  kvidx__lock(KVIDX__MUT(ix));
  if ((e = kvidx__ev_find(ix, worker_id, dp_rank)) != NULL) {
    *out = e->last;
    rc = KVIDX_OK;
  }
  kvidx__unlock(KVIDX__MUT(ix));
  return rc;
}

KVIDX__PRIV int kvidx__same_name(const char *a, const char *b) { /* ASCII, case-insensitive */
  for (; *a && *b; a++, b++) {
    char x = *a >= 'A' && *a <= 'Z' ? KVIDX__CAST(char, *a + 32) : *a, y = *b;
    if (x != y) return 0;
  }
  return *a == *b;
}

KVIDX_DEF int kvidx_tier_from_name(const char *m) {
  static const char *const host[] = {"cpu", "host", "cpu_pinned", "pinned", "dram"};
  static const char *const disk[] = {"disk", "ssd", "nvme", "local_disk", "storage"};
  size_t i;
  if (!m) return KVIDX_TIER_DEVICE;
  for (i = 0; i < sizeof host / sizeof host[0]; i++)
    if (kvidx__same_name(m, host[i])) return KVIDX_TIER_HOST;
  for (i = 0; i < sizeof disk / sizeof disk[0]; i++)
    if (kvidx__same_name(m, disk[i])) return KVIDX_TIER_DISK;
  return KVIDX_TIER_DEVICE; /* GPU, cuda, device, unknown, empty */
}

KVIDX_DEF int kvidx_clear(kvidx *ix, uint64_t worker_id, uint32_t dp_rank) {
  if (!ix) return KVIDX_EINVAL;
  if (ix->kind == KVIDX_REFERENCE) {
    kvidx__rworker *w = kvidx__ref_worker(ix, worker_id, dp_rank);
    if (w) kvidx__ref_clear_worker(ix, w);
  } else {
    uint32_t s;
    kvidx__lock(ix);
    if ((s = kvidx__slot_find(ix, worker_id, dp_rank)) != KVIDX__NONE) kvidx__ix_clear_slot(ix, s);
    kvidx__unlock(ix);
  }
  return KVIDX_OK;
}

KVIDX_DEF int kvidx_remove_worker(kvidx *ix, uint64_t worker_id) {
  uint32_t i;
  if (!ix) return KVIDX_EINVAL;
  if (ix->kind != KVIDX_REFERENCE) kvidx__lock(ix);
  for (i = 0; i < ix->max_workers; i++) {
    if (ix->kind == KVIDX_REFERENCE) {
      if (ix->ref->w[i].live && ix->ref->w[i].id == worker_id) kvidx__ref_clear_worker(ix, &ix->ref->w[i]);
    } else if (ix->slots[i].used && kvidx__ld(&ix->slots[i].id) == worker_id) {
      kvidx__ix_clear_slot(ix, i);
    }
  }
  if (ix->kind != KVIDX_REFERENCE) kvidx__unlock(ix);
  return KVIDX_OK;
}

KVIDX__PRIV size_t kvidx__find(const kvidx *ix, const uint64_t *locals, size_t n, void *out, size_t esz,
                                size_t cap, kvidx__rctx *rc) {
  kvidx__sink k;
  if (!ix || (n && !locals)) return 0;
  kvidx__sink_init(&k, out, esz, cap);
  if (ix->kind == KVIDX_REFERENCE) return kvidx__ref_find(ix, locals, n, &k);
  k.epoch = kvidx__ld_acq(&KVIDX__MUT(ix)->slot_epoch);
  k.nw = rc->nw = kvidx__ld_acq(&KVIDX__MUT(ix)->nw_live);
  if (!k.nw) return 0; /* no worker was ever assigned a slot */
  if (esz == sizeof(kvidx_tier_score)) kvidx__tier_find(ix, rc, locals, n, &k);
  else if (ix->kind == KVIDX_RADIX) kvidx__radix_find(ix, rc, locals, n, &k);
  else kvidx__pos_find(ix, rc, locals, n, &k);
  return kvidx__sink_finish(&k);
}

KVIDX_DEF size_t kvidx_find_matches(const kvidx *ix, const uint64_t *locals, size_t n, kvidx_score *out,
                                    size_t cap) {
  kvidx__rctx rc = {KVIDX__MAX_TRIES, 0, 0};
  return kvidx__find(ix, locals, n, out, sizeof(kvidx_score), cap, &rc);
}

KVIDX_DEF size_t kvidx_find_matches_tiered(const kvidx *ix, const uint64_t *locals, size_t n,
                                           kvidx_tier_score *out, size_t cap) {
  kvidx__rctx rc = {KVIDX__MAX_TRIES, 0, 0};
  return kvidx__find(ix, locals, n, out, sizeof(kvidx_tier_score), cap, &rc);
}

KVIDX_DEF int kvidx_find_matches_ex(const kvidx *ix, const uint64_t *locals, size_t n, kvidx_score *out,
                                    size_t cap, size_t *total) {
  kvidx__rctx rc = {KVIDX__MAX_TRIES, 0, 0};
  size_t m;
  if (total) *total = 0;
  if (!ix || (n && !locals) || (cap && !out)) return KVIDX_EINVAL;
  m = kvidx__find(ix, locals, n, out, sizeof(kvidx_score), cap, &rc);
  if (total) *total = m;
  return rc.gave_up ? KVIDX_EAGAIN : KVIDX_OK;
}

KVIDX_DEF size_t kvidx__find_matches_once(const kvidx *ix, const uint64_t *locals, size_t n, kvidx_score *out,
                                          size_t cap, int *retry) {
  kvidx__rctx rc = {1, 0, 0};
  size_t m = kvidx__find(ix, locals, n, out, sizeof(kvidx_score), cap, &rc);
  if (retry) *retry = rc.gave_up;
  return m;
}

/* Counters are writer state: these short calls take the writer lock. */
KVIDX_DEF size_t kvidx_worker_blocks(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank) {
  size_t n;
  if (!ix) return 0;
  kvidx__lock(KVIDX__MUT(ix));
  n = kvidx__blocks_of(ix, worker_id, dp_rank);
  kvidx__unlock(KVIDX__MUT(ix));
  return n;
}

KVIDX__PRIV size_t kvidx__blocks_of(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank) {
  uint32_t s;
  if (ix->kind == KVIDX_REFERENCE) {
    const kvidx__rworker *w = kvidx__ref_worker(ix, worker_id, dp_rank);
    return w ? w->blocks.len : 0;
  }
  s = kvidx__slot_find(ix, worker_id, dp_rank);
  return s == KVIDX__NONE ? 0 : ix->slots[s].blocks;
}

KVIDX_DEF int kvidx_get_stats(const kvidx *ix, kvidx_stats *st) {
  if (!ix || !st) return KVIDX_EINVAL;
  kvidx__lock(KVIDX__MUT(ix));
  memset(st, 0, sizeof *st);
  st->bytes = ix->bytes;
  st->peak_bytes = ix->peak;
  if (ix->kind == KVIDX_REFERENCE) {
    st->blocks = ix->ref->blocks;
    st->workers = ix->ref->nworkers;
  } else {
    st->blocks = ix->blocks;
    st->workers = ix->slots_used;
    st->entries = ix->ent_count;
  }
  kvidx__unlock(KVIDX__MUT(ix));
  return KVIDX_OK;
}

KVIDX_DEF const char *kvidx_strerror(int status) {
  switch (status) {
  case KVIDX_OK: return "ok";
  case KVIDX_EINVAL: return "invalid argument";
  case KVIDX_ENOMEM: return "out of memory (allocation hook failed); nothing changed";
  case KVIDX_EFULL: return "capacity reached (max_blocks, max_workers or max_entries); nothing changed";
  case KVIDX_ENOPARENT: return "parent block not held by this worker; nothing changed";
  case KVIDX_ENOENT: return "some removed blocks were not held (the known ones were removed)";
  case KVIDX_ENOTSUP: return "not supported by this index kind or mode";
  case KVIDX_EAGAIN: return "a concurrent write stayed in progress too long; the answer may be short, ask again";
  case KVIDX_ECORRUPT: return "snapshot is corrupt (bad magic, record or checksum); target left empty";
  case KVIDX_EVERSION: return "snapshot format version not supported; target left empty";
  case KVIDX_ETRUNCATED: return "snapshot ended early; target left empty";
  case KVIDX_EIO: return "a caller callback reported an error";
  case KVIDX_GAP: return "applied; event ids were skipped (ask the engine for a replay)";
  case KVIDX_RESTARTED: return "event id went backwards: the worker's old blocks were dropped, then the event applied";
  case KVIDX_DUPLICATE: return "event id already seen: ignored";
  default: return "unknown status";
  }
}

#define KVIDX__STR2(x) #x
#define KVIDX__STR(x) KVIDX__STR2(x)
KVIDX_DEF const char *kvidx_version(void) {
  return KVIDX__STR(KVIDX_VERSION_MAJOR) "." KVIDX__STR(KVIDX_VERSION_MINOR) "." KVIDX__STR(KVIDX_VERSION_PATCH);
}

/* Invariant checker.  Recounts everything from the seq records:
 *  per record: its entry and parent records exist, the entry is live;
 *  per (worker, entry) record: mult and children equal the recount, the
 *  entry's bit is set iff mult > 0; orphans and holed bits match;
 *  per entry: refs = records naming it, kids = live children,
 *  reachable through the table under its key; counts add up.
 * The recount borrows the records' own counters (subtract, check zero, add
 * back), so it allocates nothing. */
#define KVIDX__CHK(c)                                                                                             \
  do {                                                                                                           \
    if (!(c)) return -__LINE__;                                                                                  \
  } while (0)

KVIDX__PRIV int kvidx__check_records(kvidx *ix, int sign) {
  uint32_t i;
  for (i = 0; i < ix->S.hw; i++) {
    kvidx__srec *r = KVIDX__RCAST(kvidx__srec *, KVIDX__REC(&ix->S, i));
    kvidx__erec *er, *pr;
    if (r->h.slot == KVIDX__NONE) continue;
    er = KVIDX__RCAST(kvidx__erec *, kvidx__pool_find(&ix->E, r->h.slot, r->entry, NULL));
    KVIDX__CHK(er && er == KVIDX__EREC(ix, r->er));
    KVIDX__CHK(r->tiers && r->tiers < 8u);
    er->mult = KVIDX__CAST(uint32_t, er->mult + KVIDX__CAST(uint32_t, sign));
    if (r->tiers & 1u) er->devmult = KVIDX__CAST(uint32_t, er->devmult + KVIDX__CAST(uint32_t, sign));
    if (r->parent != KVIDX__NONE) {
      pr = KVIDX__RCAST(kvidx__erec *, kvidx__pool_find(&ix->E, r->h.slot, r->parent, NULL));
      KVIDX__CHK(pr && pr == KVIDX__EREC(ix, r->pr));
      pr->children = KVIDX__CAST(uint32_t, pr->children + KVIDX__CAST(uint32_t, sign));
    }
  }
  return 0;
}

KVIDX__PRIV int kvidx__check_adjust(kvidx *ix, int sign) {
  uint32_t i;
  int bad = 0;
  kvidx__tab *t = kvidx__ld(&ix->tab);
  for (i = 0; i < ix->E.hw; i++) {
    const kvidx__erec *er = KVIDX__RCAST(const kvidx__erec *, KVIDX__REC(&ix->E, i));
    if (er->h.slot != KVIDX__NONE) {
      kvidx__ent *e = kvidx__ent_at(ix, KVIDX__CAST(uint32_t, er->h.key));
      e->refs = KVIDX__CAST(uint32_t, e->refs + KVIDX__CAST(uint32_t, sign));
      if (((kvidx__ld(&kvidx__ent_bits(e)[er->h.slot >> 6]) >> (er->h.slot & 63)) & 1) != (er->mult != 0) ||
          (ix->tiers_on &&
           ((kvidx__ld(&kvidx__ent_dev(ix, e)[er->h.slot >> 6]) >> (er->h.slot & 63)) & 1) != (er->devmult != 0)) ||
          (!ix->tiers_on && er->devmult != er->mult) ||
          er->devmult > er->mult)
        bad++; /* the entry's bits must say whether the worker holds it (on the device) */
    }
  }
  for (i = 0; i <= t->mask; i++) {
    uint32_t id;
    for (id = kvidx__ld(&KVIDX__HEADS(t)[i]); id; id = kvidx__ld(&kvidx__ent_at(ix, id - 1)->next)) {
      uint32_t par = kvidx__ld(&kvidx__ent_at(ix, id - 1)->parent);
      if (par != KVIDX__NONE) {
        kvidx__ent *p = kvidx__ent_at(ix, par);
        p->kids = KVIDX__CAST(uint32_t, p->kids + KVIDX__CAST(uint32_t, sign));
      }
    }
  }
  return bad;
}

KVIDX__PRIV int kvidx__check_entries(kvidx *ix) {
  kvidx__tab *t = kvidx__ld(&ix->tab);
  uint32_t i, w, seen = 0;
  int rc = 0;
  /* structure first: every chain is finite, entries sit in their bucket */
  for (i = 0; i <= t->mask; i++) {
    uint32_t id;
    for (id = kvidx__ld(&KVIDX__HEADS(t)[i]); id; id = kvidx__ld(&kvidx__ent_at(ix, id - 1)->next)) {
      kvidx__ent *e;
      uint32_t par;
      KVIDX__CHK(id - 1 < ix->ent_hw && ++seen <= ix->ent_count);
      e = kvidx__ent_at(ix, id - 1);
      par = kvidx__ld(&e->parent);
      KVIDX__CHK((kvidx__ld(&e->hash) & t->mask) == i && (kvidx__ld(&e->ver) & 1) == 0);
      KVIDX__CHK(kvidx__ld(&e->hash) == kvidx__key_hash(ix->kind, kvidx__ld(&e->pos), par, kvidx__ld(&e->local)));
      KVIDX__CHK(e->refs || e->kids);
      if (par != KVIDX__NONE) {
        kvidx__ent *p = kvidx__ent_at(ix, par);
        KVIDX__CHK(par < ix->ent_hw && (p->refs || p->kids) && kvidx__ld(&p->pos) + 1 == kvidx__ld(&e->pos));
        KVIDX__CHK(kvidx_seq_hash_next(kvidx__ld(&p->chain), kvidx__ld(&e->local)) == kvidx__ld(&e->chain));
      } else if (par == KVIDX__NONE) {
        KVIDX__CHK(kvidx__ld(&e->pos) == 0 && kvidx__ld(&e->chain) == kvidx__ld(&e->local));
      }
      for (w = 0; w < ix->nw; w++) { /* a set bit has a holding record */
        uint64_t bits = kvidx__ld(&kvidx__ent_bits(e)[w]);
        KVIDX__CHK(!ix->tiers_on || (kvidx__ld(&kvidx__ent_dev(ix, e)[w]) & ~bits) == 0);
        while (bits) {
          uint32_t sl = w * 64 + kvidx__ctz64(bits);
          const kvidx__erec *er = KVIDX__RCAST(const kvidx__erec *, kvidx__pool_find(&ix->E, sl, id - 1, NULL));
          bits &= bits - 1;
          KVIDX__CHK(sl < ix->max_workers && er && er->mult);
        }
      }
    }
  }
  KVIDX__CHK(seen == ix->ent_count);
  /* then the counts */
  if (kvidx__check_adjust(ix, -1)) rc = -__LINE__;
  for (i = 0; i <= t->mask && !rc; i++) {
    uint32_t id;
    for (id = kvidx__ld(&KVIDX__HEADS(t)[i]); id && !rc; id = kvidx__ld(&kvidx__ent_at(ix, id - 1)->next)) {
      kvidx__ent *e = kvidx__ent_at(ix, id - 1);
      if (e->refs || e->kids) rc = -__LINE__;
    }
  }
  kvidx__check_adjust(ix, 1);
  return rc;
}

KVIDX_DEF int kvidx__check(const kvidx *cix) {
  kvidx *ix = KVIDX__MUT(cix);
  uint32_t i, s, w;
  size_t total = 0, used = 0, ents = 0, orph[KVIDX_WORKERS_MAX];
  int rc;
  if (!ix) return -__LINE__;
  if (ix->kind == KVIDX_REFERENCE) {
    size_t nb = 0, nwk = 0;
    for (i = 0; i < ix->max_workers; i++) {
      const kvidx__rworker *wk = &ix->ref->w[i];
      if (!wk->live) continue;
      KVIDX__CHK(wk->blocks.len > 0);
      nb += wk->blocks.len;
      nwk++;
    }
    KVIDX__CHK(nb == ix->ref->blocks && nwk == ix->ref->nworkers);
    return 0;
  }
  /* slots, their lists and the slot map */
  for (s = 0; s < ix->max_workers; s++) {
    const kvidx__slot *sl = &ix->slots[s];
    size_t len = 0;
    uint32_t r, prev = KVIDX__NONE;
    int holed = (kvidx__ld(&ix->holed[s >> 6]) >> (s & 63)) & 1;
    orph[s] = 0;
    if (!sl->used) {
      KVIDX__CHK(!holed && sl->list == KVIDX__NONE);
      continue;
    }
    used++;
    KVIDX__CHK(sl->blocks > 0 && kvidx__slot_find(ix, kvidx__ld(&sl->id), kvidx__ld(&sl->rank)) == s);
    KVIDX__CHK(holed == (sl->orphans != 0));
    for (r = sl->list; r != KVIDX__NONE; r = KVIDX__RCAST(kvidx__srec *, KVIDX__REC(&ix->S, r))->lnext) {
      const kvidx__srec *sr = KVIDX__RCAST(const kvidx__srec *, KVIDX__REC(&ix->S, r));
      KVIDX__CHK(r < ix->S.hw && sr->h.slot == s && sr->lprev == prev && ++len <= ix->S.count);
      KVIDX__CHK(kvidx__pool_find(&ix->S, s, sr->h.key, NULL) == &sr->h);
      prev = r;
    }
    KVIDX__CHK(len == sl->blocks);
    total += len;
  }
  KVIDX__CHK(used == ix->slots_used && total == ix->blocks && total == ix->S.count);
  /* orphans: held blocks whose parent entry the worker does not hold */
  for (i = 0; i < ix->S.hw; i++) {
    const kvidx__srec *r = KVIDX__RCAST(const kvidx__srec *, KVIDX__REC(&ix->S, i));
    const kvidx__erec *pr;
    if (r->h.slot == KVIDX__NONE || r->parent == KVIDX__NONE) continue;
    pr = KVIDX__RCAST(const kvidx__erec *, kvidx__pool_find(&ix->E, r->h.slot, r->parent, NULL));
    KVIDX__CHK(pr);
    if (!pr->mult) orph[r->h.slot]++;
  }
  for (s = 0; s < ix->max_workers; s++) KVIDX__CHK(!ix->slots[s].used || orph[s] == ix->slots[s].orphans);
  /* records vs recount */
  if ((rc = kvidx__check_records(ix, -1)) != 0) return rc;
  for (i = 0; i < ix->E.hw && !rc; i++) {
    const kvidx__erec *er = KVIDX__RCAST(const kvidx__erec *, KVIDX__REC(&ix->E, i));
    if (er->h.slot != KVIDX__NONE && (er->mult || er->children || er->devmult)) rc = -__LINE__;
  }
  kvidx__check_records(ix, 1);
  if (rc) return rc;
  /* entries: walk the table (the live set), recount refs and kids by
   * subtracting, check zero, add back; free entries have no bits */
  if ((rc = kvidx__check_entries(ix)) != 0) return rc;
  for (i = ix->ent_free; i != KVIDX__NONE; i = kvidx__ent_at(ix, i)->fnext) {
    kvidx__ent *e = kvidx__ent_at(ix, i);
    KVIDX__CHK(i < ix->ent_hw && ++ents <= ix->ent_hw && !e->refs && !e->kids);
    for (w = 0; w < ix->nw; w++) KVIDX__CHK(kvidx__ld(&kvidx__ent_bits(e)[w]) == 0);
  }
  KVIDX__CHK(ents + ix->ent_count == ix->ent_hw);
  if (ix->evict) { /* the eviction heap holds every record once, in order */
    KVIDX__CHK(ix->heap_n == ix->S.count);
    for (i = 0; i < ix->heap_n; i++) {
      KVIDX__CHK(ix->heap[i] < ix->S.hw && KVIDX__SREC(ix, ix->heap[i])->h.slot != KVIDX__NONE);
      KVIDX__CHK(KVIDX__SREC(ix, ix->heap[i])->hpos == i);
      KVIDX__CHK(!i || !kvidx__heap_less(ix, ix->heap[i], ix->heap[(i - 1) / 2]));
    }
  }
  {
    uint32_t used_ev = 0;
    for (i = 0; i <= ix->evtab_mask; i++)
      if (ix->evtab[i].used) {
        used_ev++;
        KVIDX__CHK(kvidx__ev_find(ix, ix->evtab[i].id, ix->evtab[i].rank) == &ix->evtab[i]);
      }
    KVIDX__CHK(used_ev == ix->evtab_n);
  }
  return 0;
}

/* ========================================================================== */
/* 8. Dump and snapshots                                                       */
/* ========================================================================== */
/* Growable scratch (through the hooks): an entry -> seq map and id stacks. */
typedef struct {
  uint64_t *key, *val; /* key = entry id + 1, 0 = empty */
  size_t cap, n;
} kvidx__dmap;

KVIDX__PRIV int kvidx__dmap_grow(kvidx *ix, kvidx__dmap *m) {
  kvidx__dmap nm;
  size_t i;
  nm.cap = m->cap ? 2 * m->cap : 64;
  nm.n = m->n;
  nm.key = KVIDX__CAST(uint64_t *, kvidx__alloc(ix, nm.cap * 16));
  if (!nm.key) return KVIDX_ENOMEM;
  nm.val = nm.key + nm.cap;
  memset(nm.key, 0, nm.cap * 8);
  for (i = 0; i < m->cap; i++)
    if (m->key[i]) {
      size_t j = kvidx__mix(m->key[i]) & (nm.cap - 1);
      while (nm.key[j]) j = (j + 1) & (nm.cap - 1);
      nm.key[j] = m->key[i];
      nm.val[j] = m->val[i];
    }
  if (m->key) kvidx__free(ix, m->key, m->cap * 16);
  *m = nm;
  return KVIDX_OK;
}
KVIDX__PRIV uint64_t *kvidx__dmap_get(const kvidx__dmap *m, uint32_t entry) {
  size_t j;
  if (!m->cap) return NULL;
  for (j = kvidx__mix(entry + 1ull) & (m->cap - 1); m->key[j]; j = (j + 1) & (m->cap - 1))
    if (m->key[j] == entry + 1ull) return &m->val[j];
  return NULL;
}
KVIDX__PRIV int kvidx__dmap_put(kvidx *ix, kvidx__dmap *m, uint32_t entry, uint64_t seq) {
  size_t j;
  if ((m->n + 1) * 2 > m->cap && kvidx__dmap_grow(ix, m) != KVIDX_OK) return KVIDX_ENOMEM;
  for (j = kvidx__mix(entry + 1ull) & (m->cap - 1); m->key[j]; j = (j + 1) & (m->cap - 1)) {}
  m->key[j] = entry + 1ull;
  m->val[j] = seq;
  m->n++;
  return KVIDX_OK;
}

typedef struct {
  uint64_t *v;
  size_t n, cap;
} kvidx__vec;
KVIDX__PRIV int kvidx__vec_push(kvidx *ix, kvidx__vec *v, uint64_t x) {
  if (v->n == v->cap) {
    size_t nc = v->cap ? 2 * v->cap : 32;
    uint64_t *nv = KVIDX__CAST(uint64_t *, kvidx__alloc(ix, nc * 8));
    if (!nv) return KVIDX_ENOMEM;
    if (v->v) {
      memcpy(nv, v->v, v->n * 8);
      kvidx__free(ix, v->v, v->cap * 8);
    }
    v->v = nv;
    v->cap = nc;
  }
  v->v[v->n++] = x;
  return KVIDX_OK;
}

KVIDX__PRIV int kvidx__cmp_u64(const void *a, const void *b) {
  uint64_t x = *KVIDX__CAST(const uint64_t *, a), y = *KVIDX__CAST(const uint64_t *, b);
  return x < y ? -1 : x > y;
}

typedef struct {
  kvidx *ix;
  kvidx_event_fn emit;
  void *ctx;
  uint32_t slot;
  uint64_t next_id;
  kvidx__dmap map;  /* entry -> a seq of this worker at that entry     */
  kvidx__vec recs;  /* (pos << 32 | srec id), sorted: parents first    */
  kvidx__vec stack; /* ancestors to invent, deepest first              */
  kvidx__vec fake;  /* invented seqs, removed at the end               */
} kvidx__dumper;

KVIDX__PRIV int kvidx__dump_store(kvidx__dumper *d, uint32_t entry, uint64_t seq, int tier, uint64_t expires) {
  kvidx *ix = d->ix;
  kvidx__ent *e = kvidx__ent_at(ix, entry);
  uint32_t par = kvidx__ld(&e->parent);
  uint64_t pseq = 0, *pp = par == KVIDX__NONE ? NULL : kvidx__dmap_get(&d->map, par);
  kvidx_block b;
  kvidx_event ev;
  if (pp) pseq = *pp;
  b.local = kvidx__ld(&e->local);
  b.seq = seq;
  memset(&ev, 0, sizeof ev);
  ev.event_id = d->next_id++;
  ev.worker_id = kvidx__ld(&ix->slots[d->slot].id);
  ev.dp_rank = kvidx__ld(&ix->slots[d->slot].rank);
  ev.type = KVIDX_EV_STORED;
  ev.tier = tier;
  ev.parent = pp ? &pseq : NULL;
  ev.blocks = &b;
  ev.n = 1;
  ev.expires_at = expires;
  return d->emit(d->ctx, &ev) ? KVIDX_EIO : KVIDX_OK;
}

/* Invent a seq for a stand-in ancestor: not one the worker holds, not one
 * invented before. */
KVIDX__PRIV uint64_t kvidx__dump_fake_seq(kvidx__dumper *d, uint64_t chain) {
  uint64_t c = kvidx__mix(chain ^ 0x6b76696478667331ull);
  for (;;) {
    size_t i;
    int clash = kvidx__pool_find(&d->ix->S, d->slot, c, NULL) != NULL;
    for (i = 0; i < d->fake.n && !clash; i++) clash = d->fake.v[i] == c;
    if (!clash) return c;
    c = kvidx__mix(c + 1);
  }
}

KVIDX__PRIV int kvidx__dump_worker(kvidx__dumper *d) {
  kvidx *ix = d->ix;
  uint32_t r;
  size_t i;
  int rc;
  d->map.n = 0;
  if (d->map.key) memset(d->map.key, 0, d->map.cap * 8);
  d->recs.n = d->stack.n = d->fake.n = 0;
  d->next_id = 1;
  for (r = ix->slots[d->slot].list; r != KVIDX__NONE; r = KVIDX__SREC(ix, r)->lnext)
    if ((rc = kvidx__vec_push(ix, &d->recs,
                              (KVIDX__CAST(uint64_t, kvidx__ld(&kvidx__ent_at(ix, KVIDX__SREC(ix, r)->entry)->pos)) << 32) | r)) !=
        KVIDX_OK)
      return rc;
  if (d->recs.n > 1) qsort(d->recs.v, d->recs.n, 8, kvidx__cmp_u64);
  for (i = 0; i < d->recs.n; i++) {
    const kvidx__srec *sr = KVIDX__SREC(ix, KVIDX__CAST(uint32_t, d->recs.v[i]));
    uint32_t a = sr->parent, t;
    uint64_t expires = 0;
    /* a hole: the worker lacks the parent; invent the missing ancestors */
    while (a != KVIDX__NONE && !kvidx__dmap_get(&d->map, a)) {
      if ((rc = kvidx__vec_push(ix, &d->stack, a)) != KVIDX_OK) return rc;
      a = kvidx__ld(&kvidx__ent_at(ix, a)->parent);
    }
    while (d->stack.n) {
      uint32_t anc = KVIDX__CAST(uint32_t, d->stack.v[--d->stack.n]);
      uint64_t fs = kvidx__dump_fake_seq(d, kvidx__ld(&kvidx__ent_at(ix, anc)->chain));
      if ((rc = kvidx__vec_push(ix, &d->fake, fs)) != KVIDX_OK ||
          (rc = kvidx__dump_store(d, anc, fs, KVIDX_TIER_DEVICE, 0)) != KVIDX_OK ||
          (rc = kvidx__dmap_put(ix, &d->map, anc, fs)) != KVIDX_OK)
        return rc;
    }
    if (ix->evict == KVIDX_EVICT_EXPIRY && sr->k1 != ~KVIDX__CAST(uint64_t, 0)) expires = sr->k1;
    for (t = 0; t <= KVIDX_TIER_DISK; t++)
      if ((sr->tiers >> t) & 1 && (rc = kvidx__dump_store(d, sr->entry, sr->h.key, KVIDX__CAST(int, t), expires)) != KVIDX_OK)
        return rc;
    if (!kvidx__dmap_get(&d->map, sr->entry) && (rc = kvidx__dmap_put(ix, &d->map, sr->entry, sr->h.key)) != KVIDX_OK)
      return rc;
  }
  if (d->fake.n) { /* the stand-ins go again: the holes come back */
    kvidx_event ev;
    memset(&ev, 0, sizeof ev);
    ev.event_id = d->next_id++;
    ev.worker_id = kvidx__ld(&ix->slots[d->slot].id);
    ev.dp_rank = kvidx__ld(&ix->slots[d->slot].rank);
    ev.type = KVIDX_EV_REMOVED;
    ev.tier = KVIDX_TIER_ALL;
    ev.seqs = d->fake.v;
    ev.n = d->fake.n;
    if (d->emit(d->ctx, &ev)) return KVIDX_EIO;
  }
  return KVIDX_OK;
}

/* The caller holds the writer lock (writers wait; readers go on). */
KVIDX__PRIV int kvidx__dump_locked(kvidx *ix, kvidx_event_fn emit, void *ctx) {
  kvidx__dumper d;
  int rc = KVIDX_OK;
  if (ix->kind == KVIDX_REFERENCE || ix->buffer_mode) return KVIDX_ENOTSUP;
  memset(&d, 0, sizeof d);
  d.ix = ix;
  d.emit = emit;
  d.ctx = ctx;
  for (d.slot = 0; d.slot < ix->max_workers && rc == KVIDX_OK; d.slot++)
    if (ix->slots[d.slot].used) rc = kvidx__dump_worker(&d);
  if (d.map.key) kvidx__free(ix, d.map.key, d.map.cap * 16);
  if (d.recs.v) kvidx__free(ix, d.recs.v, d.recs.cap * 8);
  if (d.stack.v) kvidx__free(ix, d.stack.v, d.stack.cap * 8);
  if (d.fake.v) kvidx__free(ix, d.fake.v, d.fake.cap * 8);
  return rc;
}

KVIDX_DEF int kvidx_dump(const kvidx *cix, kvidx_event_fn emit, void *ctx) {
  kvidx *ix = KVIDX__MUT(cix);
  int rc;
  if (!ix || !emit) return KVIDX_EINVAL;
  kvidx__lock(ix);
  rc = kvidx__dump_locked(ix, emit, ctx);
  kvidx__unlock(ix);
  return rc;
}

/* ---- binary snapshot --------------------------------------------------------
 * records (48 bytes each, little endian), both versions:
 *   u8 type, u8 tier, u8 has_parent, u8 0, u32 dp_rank, u64 worker_id,
 *   u64 a, u64 b, u64 c, u64 d
 *   type 1 Stored block: a parent seq, b local, c seq, d expires_at
 *   type 2 Removed:      a seq (tier 255 = every copy)
 *   type 3 event id:     a last event id, b the stream's generation (read
 *                        back as is; not checked)
 * Version 2 (written): everything is verified before it is applied, and a
 * stream of L bytes costs O(L) work and memory.
 *   header (48 bytes): "KVIDXSNP", u32 version = 2, u32 record size = 48,
 *     u64 record count N, u64 stream length L = 48 + 48 N + 8 ceil(N / 64),
 *     u32 records per chunk = 64, u32 0, u64 XXH3-64 (seed 0) of the 40
 *     bytes before it
 *   then ceil(N / 64) chunks: 64 records (the last one the rest), then
 *     u64 XXH3-64 of those records seeded with the previous checksum (the
 *     header's for the first), so chunks cannot be dropped, reordered or
 *     spliced in from another stream.
 *   The reader checks the header, then reads each chunk into a fixed
 *   3 KiB buffer and applies it only once its checksum matched; it reads
 *   exactly L bytes (nothing after them).
 * Version 1 (read only): header (24 bytes) "KVIDXSNP", u32 1, u32 48, u64 0;
 *   records; type 255 end record: a number of records before it, d XXH3-64
 *   (seed 0) of every byte before d.  Its records can only be checked at
 *   the end, so they are applied as read: each 48-byte record costs at most
 *   one single-block store, removal or event id (work and memory O(bytes
 *   read)), and a bad checksum at the end empties the target again.
 * Unknown types, flags or a short read fail the whole read. */
#define KVIDX__SNAP_VERSION 2u
#define KVIDX__SNAP_REC 48
#define KVIDX__SNAP_HDR 48
#define KVIDX__SNAP_CHUNK 64 /* records per checksummed chunk */

typedef struct {
  kvidx_write_fn write;
  void *ctx;
  int counting;   /* first pass: only count the records */
  int failed;
  uint64_t count; /* records so far */
  uint64_t seed;  /* the previous checksum */
  size_t nbuf;    /* records in buf */
  unsigned char buf[KVIDX__SNAP_CHUNK * KVIDX__SNAP_REC + 8];
} kvidx__snapw;

KVIDX__PRIV void kvidx__put64(unsigned char *p, uint64_t v) { kvidx__le64(p, v); }
KVIDX__PRIV uint32_t kvidx__get32(const unsigned char *p) {
  return KVIDX__CAST(uint32_t, p[0]) | KVIDX__CAST(uint32_t, p[1]) << 8 | KVIDX__CAST(uint32_t, p[2]) << 16 |
         KVIDX__CAST(uint32_t, p[3]) << 24;
}
KVIDX__PRIV uint64_t kvidx__get64(const unsigned char *p) {
  uint64_t v = 0;
  int i;
  for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Writes the buffered records as one chunk with its chained checksum. */
KVIDX__PRIV int kvidx__snap_flush(kvidx__snapw *w) {
  size_t len = w->nbuf * KVIDX__SNAP_REC;
  if (w->failed) return KVIDX_EIO;
  if (!w->nbuf) return KVIDX_OK;
  w->seed = XXH3_64bits_withSeed(w->buf, len, w->seed);
  kvidx__put64(w->buf + len, w->seed);
  if (w->write(w->ctx, w->buf, len + 8)) w->failed = 1;
  w->nbuf = 0;
  return w->failed ? KVIDX_EIO : KVIDX_OK;
}

KVIDX__PRIV void kvidx__snap_rec(unsigned char *r, int type, int tier, int has_parent, uint32_t rank, uint64_t worker,
                                 uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  memset(r, 0, KVIDX__SNAP_REC);
  r[0] = KVIDX__CAST(unsigned char, type);
  r[1] = KVIDX__CAST(unsigned char, tier);
  r[2] = KVIDX__CAST(unsigned char, has_parent);
  r[4] = KVIDX__CAST(unsigned char, rank);
  r[5] = KVIDX__CAST(unsigned char, rank >> 8);
  r[6] = KVIDX__CAST(unsigned char, rank >> 16);
  r[7] = KVIDX__CAST(unsigned char, rank >> 24);
  kvidx__put64(r + 8, worker);
  kvidx__put64(r + 16, a);
  kvidx__put64(r + 24, b);
  kvidx__put64(r + 32, c);
  kvidx__put64(r + 40, d);
}

/* One record: counted (first pass) or added to the chunk being built. */
KVIDX__PRIV int kvidx__snap_add(kvidx__snapw *w, int type, int tier, int has_parent, uint32_t rank, uint64_t worker,
                                uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  w->count++;
  if (w->counting) return KVIDX_OK;
  kvidx__snap_rec(w->buf + w->nbuf * KVIDX__SNAP_REC, type, tier, has_parent, rank, worker, a, b, c, d);
  return ++w->nbuf == KVIDX__SNAP_CHUNK ? kvidx__snap_flush(w) : KVIDX_OK;
}

KVIDX__PRIV int kvidx__snap_emit(void *ctx, const kvidx_event *ev) {
  kvidx__snapw *w = KVIDX__CAST(kvidx__snapw *, ctx);
  size_t i;
  int rc;
  for (i = 0; i < ev->n; i++) {
    if (ev->type == KVIDX_EV_STORED)
      rc = kvidx__snap_add(w, 1, ev->tier, ev->parent != NULL, ev->dp_rank, ev->worker_id, ev->parent ? *ev->parent : 0,
                           ev->blocks[i].local, ev->blocks[i].seq, ev->expires_at);
    else
      rc = kvidx__snap_add(w, 2, KVIDX_TIER_ALL, 0, ev->dp_rank, ev->worker_id, ev->seqs[i], 0, 0, 0);
    if (rc != KVIDX_OK) return 1;
  }
  return 0;
}

/* Every record of the snapshot through w (the caller holds the lock). */
KVIDX__PRIV int kvidx__snap_records(kvidx *ix, kvidx__snapw *w) {
  uint32_t i;
  int rc = kvidx__dump_locked(ix, kvidx__snap_emit, w);
  for (i = 0; rc == KVIDX_OK && i <= ix->evtab_mask; i++) /* each worker's last event id */
    if (ix->evtab[i].used) rc = kvidx__snap_add(w, 3, 0, 0, ix->evtab[i].rank, ix->evtab[i].id, ix->evtab[i].last, 0, 0, 0);
  if (rc != KVIDX_OK && w->failed) rc = KVIDX_EIO;
  return rc;
}

KVIDX_DEF int kvidx_snapshot_write(const kvidx *cix, kvidx_write_fn write, void *ctx) {
  kvidx *ix = KVIDX__MUT(cix);
  kvidx__snapw w;
  unsigned char h[KVIDX__SNAP_HDR];
  uint64_t n;
  int rc;
  if (!ix || !write) return KVIDX_EINVAL;
  memset(&w, 0, sizeof w);
  w.write = write;
  w.ctx = ctx;
  /* holdings and event ids from one moment: writers wait for the whole
   * write (buffer in memory and flush afterwards if your sink is slow).
   * Two passes over the same state, the first to count for the header. */
  kvidx__lock(ix);
  w.counting = 1;
  rc = kvidx__snap_records(ix, &w);
  n = w.count;
  if (rc == KVIDX_OK) {
    memset(h, 0, sizeof h);
    memcpy(h, "KVIDXSNP", 8);
    h[8] = KVIDX__SNAP_VERSION;
    h[12] = KVIDX__SNAP_REC;
    kvidx__put64(h + 16, n);
    kvidx__put64(h + 24, KVIDX__SNAP_HDR + n * KVIDX__SNAP_REC + (n + KVIDX__SNAP_CHUNK - 1) / KVIDX__SNAP_CHUNK * 8);
    h[32] = KVIDX__SNAP_CHUNK;
    w.seed = XXH3_64bits_withSeed(h, 40, 0);
    kvidx__put64(h + 40, w.seed);
    w.counting = 0;
    w.count = 0;
    rc = write(ctx, h, sizeof h) ? KVIDX_EIO : kvidx__snap_records(ix, &w);
  }
  kvidx__unlock(ix);
  if (rc == KVIDX_OK) rc = kvidx__snap_flush(&w);
  if (rc == KVIDX_OK && w.count != n) rc = KVIDX_EIO; /* cannot happen: the state was locked */
  return rc;
}

/* Empty the index (every worker, every event id): a failed read's cleanup. */
KVIDX__PRIV void kvidx__empty(kvidx *ix) {
  uint32_t i;
  for (i = 0; i < ix->max_workers; i++) {
    if (ix->kind == KVIDX_REFERENCE) {
      if (ix->ref->w[i].live) kvidx__ref_clear_worker(ix, &ix->ref->w[i]);
    } else if (ix->slots[i].used) {
      kvidx__lock(ix);
      kvidx__ix_clear_slot(ix, i);
      kvidx__unlock(ix);
    }
  }
  memset(ix->evtab, 0, sizeof(kvidx__evid) * (ix->evtab_mask + 1));
  ix->evtab_n = 0;
}

/* Streams may return less than asked (pipes, sockets): read until len bytes
 * or the end of the stream (a 0 return). */
KVIDX__PRIV size_t kvidx__read_full(kvidx_read_fn read, void *ctx, unsigned char *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    size_t k = read(ctx, buf + got, len - got);
    if (k == 0 || k > len - got) break;
    got += k;
  }
  return got;
}

/* Applies one record (types 1-3) of either version. */
KVIDX__PRIV int kvidx__snap_apply(kvidx *ix, const unsigned char *r) {
  uint32_t rank = kvidx__get32(r + 4);
  uint64_t worker = kvidx__get64(r + 8), a = kvidx__get64(r + 16), b = kvidx__get64(r + 24),
           c = kvidx__get64(r + 32), d = kvidx__get64(r + 40);
  int rc;
  if (r[3]) return KVIDX_ECORRUPT;
  if (r[0] == 1) {
    kvidx_block blk;
    if (r[1] > KVIDX_TIER_DISK || r[2] > 1 || (!r[2] && a) || (d && ix->evict != KVIDX_EVICT_EXPIRY))
      return KVIDX_ECORRUPT;
    blk.local = b;
    blk.seq = c;
    rc = kvidx__store(ix, worker, rank, r[2] ? &a : NULL, &blk, 1, r[1], d);
    if (rc == KVIDX_ENOPARENT) return KVIDX_ECORRUPT; /* parents come first in a sound snapshot */
    return rc;
  }
  if (r[0] == 2) {
    if (r[1] != KVIDX_TIER_ALL || r[2] || b || c || d) return KVIDX_ECORRUPT;
    return kvidx__remove(ix, worker, rank, &a, 1, KVIDX_TIER_ALL) != KVIDX_OK ? KVIDX_ECORRUPT : KVIDX_OK;
  }
  if (r[0] == 3) { /* b: the stream generation, kept readable as is */
    kvidx__evid *e;
    if (r[1] || r[2] || c || d || kvidx__ev_find(ix, worker, rank)) return KVIDX_ECORRUPT;
    kvidx__lock(ix);
    e = kvidx__ev_put(ix, worker, rank);
    e->last = a;
    kvidx__unlock(ix);
    return KVIDX_OK;
  }
  return KVIDX_ECORRUPT;
}

/* Version 1: records applied as read, the checksum checked at the end. */
KVIDX__PRIV int kvidx__snap_read_v1(kvidx *ix, kvidx_read_fn read, void *ctx, const unsigned char *h) {
  unsigned char r[KVIDX__SNAP_REC];
  XXH3_state_t st;
  uint64_t count = 0;
  int rc;
  if (kvidx__get64(h + 16)) return KVIDX_ECORRUPT;
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, h, 24);
  for (;;) {
    if (kvidx__read_full(read, ctx, r, sizeof r) != sizeof r) return KVIDX_ETRUNCATED;
    if (r[0] == 255) {
      XXH3_64bits_update(&st, r, 40);
      if (kvidx__get64(r + 16) != count || kvidx__get64(r + 40) != XXH3_64bits_digest(&st) || r[1] || r[2] ||
          r[3] || kvidx__get32(r + 4) || kvidx__get64(r + 8) || kvidx__get64(r + 24) || kvidx__get64(r + 32))
        return KVIDX_ECORRUPT;
      return KVIDX_OK;
    }
    XXH3_64bits_update(&st, r, sizeof r);
    count++;
    if ((rc = kvidx__snap_apply(ix, r)) != KVIDX_OK) return rc;
  }
}

/* Version 2: the header, then each chunk verified before it is applied. */
KVIDX__PRIV int kvidx__snap_read_v2(kvidx *ix, kvidx_read_fn read, void *ctx, unsigned char *h) {
  unsigned char buf[KVIDX__SNAP_CHUNK * KVIDX__SNAP_REC + 8];
  uint64_t n, left, seed;
  if (kvidx__read_full(read, ctx, h + 24, KVIDX__SNAP_HDR - 24) != KVIDX__SNAP_HDR - 24) return KVIDX_ETRUNCATED;
  n = kvidx__get64(h + 16);
  if (kvidx__get64(h + 40) != XXH3_64bits_withSeed(h, 40, 0) || kvidx__get32(h + 32) != KVIDX__SNAP_CHUNK ||
      kvidx__get32(h + 36) || n > (~KVIDX__CAST(uint64_t, 0) - KVIDX__SNAP_HDR) / (KVIDX__SNAP_REC + 8) ||
      kvidx__get64(h + 24) != KVIDX__SNAP_HDR + n * KVIDX__SNAP_REC + (n + KVIDX__SNAP_CHUNK - 1) / KVIDX__SNAP_CHUNK * 8)
    return KVIDX_ECORRUPT;
  seed = kvidx__get64(h + 40);
  for (left = n; left;) {
    size_t k = left < KVIDX__SNAP_CHUNK ? KVIDX__CAST(size_t, left) : KVIDX__SNAP_CHUNK, len = k * KVIDX__SNAP_REC, i;
    int rc;
    if (kvidx__read_full(read, ctx, buf, len + 8) != len + 8) return KVIDX_ETRUNCATED;
    seed = XXH3_64bits_withSeed(buf, len, seed);
    if (kvidx__get64(buf + len) != seed) return KVIDX_ECORRUPT;
    for (i = 0; i < k; i++)
      if ((rc = kvidx__snap_apply(ix, buf + i * KVIDX__SNAP_REC)) != KVIDX_OK) return rc;
    left -= k;
  }
  return KVIDX_OK;
}

KVIDX__PRIV int kvidx__snap_read_all(kvidx *ix, kvidx_read_fn read, void *ctx) {
  unsigned char h[KVIDX__SNAP_HDR];
  uint32_t version;
  if (kvidx__read_full(read, ctx, h, 24) != 24) return KVIDX_ETRUNCATED;
  if (memcmp(h, "KVIDXSNP", 8)) return KVIDX_ECORRUPT;
  version = kvidx__get32(h + 8);
  if (version != 1 && version != 2) return KVIDX_EVERSION;
  if (kvidx__get32(h + 12) != KVIDX__SNAP_REC) return KVIDX_ECORRUPT;
  return version == 1 ? kvidx__snap_read_v1(ix, read, ctx, h) : kvidx__snap_read_v2(ix, read, ctx, h);
}

KVIDX_DEF int kvidx_snapshot_read(kvidx *ix, kvidx_read_fn read, void *ctx) {
  kvidx_stats st;
  int rc;
  if (!ix || !read) return KVIDX_EINVAL;
  kvidx_get_stats(ix, &st);
  if (st.blocks || ix->evtab_n) return KVIDX_EINVAL; /* the target must be empty */
  rc = kvidx__snap_read_all(ix, read, ctx);
  if (rc != KVIDX_OK) kvidx__empty(ix);
  return rc;
}

#endif /* KVIDX__IMPLEMENTED */
#endif /* KVIDX_IMPLEMENTATION */
