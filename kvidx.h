/* kvidx.h - v0.2.0 - KV-block index for LLM routers - public domain / MIT
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
 *       kvidx_config cfg = {0};                 // zero = working defaults (C++: cfg{})
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
 *   KVIDX_MALLOC(sz) / KVIDX_FREE(p)  default allocator (malloc/free);
 *                         KVIDX_CALLOC(sz) zeroed (calloc) if defined too:
 *                         new hash tables come from it, and the control
 *                         bytes of tables that keep them (whose entries
 *                         are never zeroed) (defining KVIDX_MALLOC alone:
 *                         malloc + memset).
 *   KVIDX_NO_THREADS      single-threaded build: plain loads/stores instead of
 *                         atomics; no concurrent readers allowed.
 *   KVIDX_NO_SIMD         no control bytes (and no <emmintrin.h> or
 *                         <arm_neon.h>): worker seq tables and the holdings
 *                         map probe place by place and delete by backward
 *                         shift like every other map (same answers, less
 *                         code: caller-buffer mode never uses control
 *                         bytes, so firmware defines it; 5.8 KB of
 *                         Cortex-M4 code).  Without it they keep control
 *                         bytes on every target: 16 compared with SSE2
 *                         (x86) or NEON (AArch64) under GCC or Clang, else
 *                         as two 64-bit words.
 *   KVIDX_NO_RUN_SPLIT    leave out kvidx__run_split, which moves a run's
 *                         rest out when a store leaves the run before its
 *                         end (STORAGE): same answers, a conversation's
 *                         turns then each a run below the last (slower
 *                         deep queries); 2.8 KB less code.  Caller-buffer
 *                         mode never moves a run's rest, so firmware
 *                         defines it.
 *   KVIDX_TEST_GROUP_WORDS test-only: control bytes compared as 64-bit
 *                         words even where SSE2 or NEON is there.
 *   KVIDX_WORKERS_MAX     hard upper bound of cfg.max_workers (default 4096, at
 *                         most 65535); a query's scratch (a hit record per
 *                         possible worker, the result sort) lives on the stack.
 *   KVIDX_JUMP_MAX        upper bound of cfg.jump (default 256; unused since 0.2).
 *   KVIDX_DEFER_FREE_MIN  with cfg.flags KVIDX_F_DEFER_FREE: blocks of at least
 *                         this many bytes wait for kvidx_reclaim (default
 *                         65536; at least 64).  Smaller ones are freed at once.
 *   KVIDX_TEST_WALK(ix, step, blocks)  test-only: called by the query walk
 *                         at each child-map probe (step 0, blocks 0) and
 *                         each run it reads (step 1: the run a probe found,
 *                         2: the run a hint named; blocks: how many of the
 *                         run's blocks the query matched), and between the
 *                         two passes that put the walk's answer in order
 *                         (step 3, blocks 0).  kvidx-bench --walk-floor
 *                         counts them in a copy of its own.
 *   KVIDX_TEST_GEN_STEP   test-only: how far each slot assignment advances the
 *                         64-bit slot generation (default 1).
 *   KVIDX_TEST_HOOK(ix, where)  test-only: called inside writer critical
 *                         sections and mid-way through kvidx__check
 *                         (deterministic interleaving tests).
 *   KVIDX_TEST_DRAIN_STEP test-only: places of a grown map's old table each
 *                         call drains at least (default 64, and 16
 *                         times that in a worker's seq table; 1 keeps
 *                         growths in flight for long, for the tests).
 *   KVIDX_TEST_BULK_MAX   test-only: a table with control bytes (seq tables,
 *                         holdings) whose new table's entries take at most
 *                         this many bytes (default 512 KiB) grows or shrinks
 *                         into it in one pass; larger ones drain (0: every
 *                         one drains, as the tests' clang ASan build has it).
 *   KVIDX_TEST_SHRINK_MIN test-only: seq tables of at most this many places
 *                         never shrink (default 64; 8 makes the tests'
 *                         small workers shrink and regrow).
 *   Language: C11 or C++11 and later; C99 and compilers without
 *   <stdatomic.h> (tcc) only with KVIDX_NO_THREADS.  xxhash.h 0.8.0 or later
 *   (earlier XXH3 output differs).  Anything else stops at one #error.
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
 *     own entries (block positions stored in runs, counted whether held or
 *     not): a memory cap that can refuse earlier than max_blocks.  On any error nothing
 *     changed.  With cfg.evict set, a store that would pass max_blocks first
 *     prunes by the policy (every refusal is decided before that).
 *
 * KINDS: which to choose
 *   KVIDX_RADIX and KVIDX_POSITIONAL share one storage and one query walk
 *   since 0.2 (below): a compressed radix tree whose edges are runs of up to
 *   64 blocks.  Dynamo's positional index needs jump search because it
 *   hashes and probes per position; a run compares one local hash per block
 *   and checks each holder once per run, which is what a jump buys, without
 *   the hashing.  Both names stay valid; cfg.jump is accepted and unused.
 *   KVIDX_REFERENCE   the naive nested-map model that defines the semantics:
 *                     a correctness oracle for your own tests.  Slow.
 *
 * STORAGE (what the memory holds; section 4 and 5 of the implementation)
 *   Shared by every worker, one copy per path of blocks:
 *
 *     root --(local a)--> run R1 [a b c d e f]         runs: up to 64 blocks
 *                           |        \                  of one path, their
 *                           |         (offset 2, local x)   local hashes in one
 *                           |          --> run R2 [x y]     chunk
 *                           (offset 5, local g) --> run R3 [g h i]
 *
 *   A child run hangs below (parent run, offset); the one child map finds it
 *   by ((parent + 1) << 8 | offset, first local).  A query walks from the
 *   root: compare locals along the run, then one child-map probe.  A store
 *   walks the same way, appending to a run's end in place while it has room
 *   (decode steps store one block at a time: they grow one run; a stretch
 *   of new blocks goes in with one write) and starting a new run where the
 *   path leaves the existing ones.
 *
 *   Unless it can move the rest out instead: a store that leaves run R
 *   after its block k - 1 makes R's blocks k.. a run T hung below
 *   (R, k - 1), with their holders, cutoffs and seq entries, and goes on in
 *   R, in place (kvidx__run_split):
 *
 *     before:  R [a b c x o]            store a b c d e: leaves R after c
 *     after:   R [a b c d e]            R grows in place
 *                    \ (offset 2, local x) T [x o]    R's old rest
 *
 *   Conversations are why: a turn's prompt is the last turn's up to where
 *   that one's partial block and output began, so without it each turn is
 *   a run hung below the last and a query for a long conversation reads a
 *   run per turn, one dependent load after another; with it the
 *   conversation is one run of up to 64 blocks, its old turns' rests
 *   hanging off it.  The rest's seq entries are found by folding its
 *   locals onto the store's own seq for block k - 1 (where its holders
 *   hash as the storing worker does: Dynamo's hashing, kvidx_seq_hashes),
 *   or else from the seq hints that workers with their own engines'
 *   hashes leave in the runs they store into (below), each believed only
 *   if it names the very block; and only if no child hangs at k or later, it has
 *   at most 8 holders and 16 seq entries, the store has not grown R
 *   itself, and outside caller-buffer mode and tiers; else the store
 *   starts a run as above.
 *
 *   Run header (32 bytes, two to a cache line, type-stable array, 32-bit ids):
 *     +-----+--------+--------------------------------+-------+--------+---------+------+------+
 *     | ver | parent | len:8 poff:8 lclass:8 hclass:8 | nhold | locals | holders | kids | cont |
 *     +-----+--------+--------------------------------+-------+--------+---------+------+------+
 *       seqlock          shape (len 0 = free)           :16    word indices      (a)    (b)
 *     (a) children hanging below; a free run's link in the free list.
 *     (b) a hint: a run hung below this run, at any offset (a long
 *         store's next 64 blocks, or the next turn of a conversation,
 *         which leaves the run where the last turn's partial block did):
 *         the first hung while the one it names still hangs there, and the
 *         only child once a store passes through it; nhold's top byte says
 *         at which offset.  Below a run with one child, where the query
 *         leaves the run at that offset, the walk tries it before the
 *         child map, reads it like any run, and believes it only if it
 *         hangs below (this run, that offset) and starts with the query's
 *         next local: the child map holds one run per such key, so that is
 *         the run the probe would find.  Along a chain of hints the walk
 *         asks for the next runs' lines a step or two ahead.
 *   locals:  [local 0][local 1]...[local len-1]          (2^lclass words)
 *   holders: [slot:32 | cutoff:8 | top:8 | 0:16]([device bits]) x nhold
 *     (2^hclass words); cutoff = how many leading blocks of the run that
 *     worker holds, top = 1 + its last held block's offset (writers: which
 *     holders a moving tail concerns, kvidx__run_split); the device bits
 *     only with KVIDX_F_TIERS.
 *
 *   Seq hints (writer side only, section 5): for a worker whose seqs are
 *   its engine's own block hashes (vLLM, SGLang, TRT-LLM; seen at its first
 *   store), the seqs it stored a run's blocks under, a chunk per run beside
 *   the locals (8 bytes per position of such workers' runs), so that a move
 *   of the run's rest finds their seq entries without Dynamo's folding.
 *
 *   Per worker (writer side only):
 *     seq table: engine seq -> run:32 | tag:16 | offset:8 | tiers:8
 *                (16 bytes; 32 with eviction keys).  Parents and removals
 *                are one probe.  tag: the low 16 bits of the seq's hash, so
 *                a growth's drain learns an entry's home without hashing
 *                its key again (in tables of at most 2^16 places; larger
 *                ones hash).  Except in caller-buffer mode and
 *                KVIDX_NO_SIMD builds, the table also keeps a control
 *                byte per place (+1 byte), 16 matched at once by a
 *                probe, and a deletion moves nothing:
 *                the place becomes empty, or deleted where a probe may
 *                have passed it (section 2, the Swiss tables' rule).
 *   Per (worker, run), one shared "holds" map (control bytes as above):
 *     held bits (u64: a run has at most 64 blocks), multi bits (positions the
 *     worker holds under >= 2 seqs, counted exactly in the "multi" map),
 *     the worker's index in the run's holder list, device bits (tiers).
 *   Holes (a removed middle block) are a cutoff below a later held bit: the
 *   score stops there, exactly, with no per-position check.
 *
 *   Every map is one open-addressing table (section 2): linear probing from
 *   a home keyed by a per-index random seed (cfg.seed), load <= 3/4,
 *   backward-shift deletion (seq tables with control bytes: none needed).
 *   Growth never stops a call for a whole rehash:
 *
 *     past 11/16 full      tab [####### ]   next [ zeroed a share per call ]
 *     next zeroed          old [####### ]   tab  [ every insert goes here  ]
 *                              ^ each reservation moves a bounded share of
 *                                old's places (whole clusters) into tab
 *
 *   (A table with control bytes zeroes only them: its bytes alone say
 *   which places are used, so next takes the inserts at once; and one
 *   whose next table takes at most 512 KiB moves into it in one pass.)
 *
 *   All memory comes from the allocation hooks, or in caller-buffer mode
 *   from the buffer through size classes.  There the shared maps (child
 *   map, holdings, multi, worker slots) are made at their largest when the
 *   index is, so they never grow and their old tables never take room; a
 *   table's header is an allocation of its own, so 2^k places fill a class.
 *
 *   Memory: a held block costs its seq entry (16 bytes and a control byte
 *   at a table load between 3/8 and 3/4 while a worker gains blocks: 23-45
 *   bytes) plus its
 *   share of the run it sits in (8 bytes per block of locals, the run header
 *   and holder entries per run, not per block; 8 more per block of seq
 *   hints in runs that workers with their own hashes stored into, and 4
 *   bytes per run for the hints' chunk index).  A seq table under 1/8 full
 *   (past 64 places) shrinks to at most 3/8, draining like a growth, so a
 *   worker that let go of most of its blocks stops paying for its peak.
 *   Run headers and word chunks live in grow-only arrays (readers may hold
 *   any id: they never shrink) that grow in steps of at most a quarter of
 *   their new size.
 *
 *   Detached runs: memory follows what is held, not the paths to it.  A run
 *   nobody holds is freed once nothing hangs below it; one that still has
 *   children (a worker holds blocks below a hole) leaves its place and
 *   hangs below the detached root, keyed by its first block's chain hash,
 *   which replaces that block's local; then the runs above it that only it
 *   kept go:
 *
 *     before:  root -> A [unheld] -> B [unheld] -> C [held by w]
 *     after:   detached root --(chain of B's first block)--> B -> C
 *
 *   Queries never look below the detached root (a query starts at the
 *   real one).  A store that makes that chain's position again (the prefix
 *   comes back) hangs B back there with everything below it, so no block
 *   ever has two positions; a store that fails afterwards detaches it
 *   again.  So every run nobody holds is at the top (a root or detached
 *   run) and holds up only runs someone holds: at most as many runs as held
 *   runs, each at most 64 positions.  Chains are computed from the runs
 *   only on this path (stores and removals while detached runs exist), from
 *   the nearest run whose first-block chain is known (a writer-only array
 *   per run id keeps it: a run's chain names its position for its life)
 *   down; a 1,024-cell counting filter of detached chains spares a store
 *   the child-map probe for all but a few of its new positions.  A dump
 *   writes a detached run's first block (a stand-in it removes again: nobody
 *   holds it) as a Stored event with .detached set (snapshot format
 *   version 4, with .stand_in set too).
 *
 *   Concurrency: readers copy one run at a time under its seqlock and probe
 *   the child map (its table, then the one draining), validated by the map's
 *   seqlock around deletions and drain steps (section 7).
 *
 * PRODUCTION EVENTS (see the declarations for details)
 *   kvidx_apply(ix, &ev)       one engine event with its id and generation:
 *                              gaps (KVIDX_GAP, ask for a replay), resent or
 *                              old ids (ignored), a new generation (engine
 *                              restart: old blocks dropped first), storage
 *                              tiers (a host-tier Removed keeps the device
 *                              copy).
 *   kvidx_find_matches_tiered  depth on any tier + device blocks per worker.
 *   cfg.blocks_per_worker      the engines' KV cache size in blocks, if known:
 *                              each worker's seq table starts with that room
 *                              (no growth on the way there; a worker that
 *                              holds fewer pays for the room).
 *   cfg.evict, cfg.max_blocks  bounded memory: refuse (EFULL), or prune least
 *                              recently stored first (deepest first), or by
 *                              earliest expiry (approximate/TTL mode:
 *                              kvidx_store_ttl, kvidx_expire(ix, now)).
 *   kvidx_dump / kvidx_snapshot_write / kvidx_snapshot_read
 *                              rebuild the holdings in a fresh index of any
 *                              kind (warm restart of a router).
 *
 * THREADING
 *   See section 7 of the implementation for the full contract.
 *   Short form: any number of threads may call kvidx_find_matches at any time;
 *   writer calls (store/remove/clear/remove_worker) for one worker come from
 *   one thread at a time, writer calls for different workers may come from
 *   different threads at once (they serialize internally on a short spinlock).
 *   kvidx_reclaim may run beside writers and readers (KVIDX_REFERENCE: not).
 *   create/destroy/init_buffer need exclusive access.  KVIDX_REFERENCE and
 *   KVIDX_NO_THREADS builds allow no concurrency at all.
 *
 * CHANGELOG
 *   0.2.0  Storage redesign.  Runs of up to 64 blocks stored once for
 *          every worker that holds them, per-worker seq tables, one
 *          open-addressing map keyed by a per-index seed (cfg.seed); no
 *          hashing on the read path; the radix and positional kinds share
 *          it.  Memory follows what is held: runs nobody holds detach
 *          instead of staying for the runs below a hole (they hang back
 *          when the prefix returns), a seq table under 1/8 full shrinks,
 *          and caller-buffer mode makes its shared maps at their
 *          largest up front.
 *          Maps grow incrementally, so no call pays for a whole rehash;
 *          the writer's one-word-key maps keep a control byte per place
 *          and delete without moving entries; 16 are compared at once
 *          with SSE2, NEON, or as two 64-bit words.
 *          A store that leaves a run before its end moves the run's rest
 *          out and goes on in the run (the rest's seq entries found by
 *          Dynamo's folding, or by the seq hints that workers with their
 *          own engines' hashes leave), so a conversation stays one run
 *          (KVIDX_NO_RUN_SPLIT leaves it out).
 *          Queries follow a hint from each run to the run continuing it
 *          (checked, then prefetched along the chain) and place answers
 *          by each worker slot's hint of its order (no sort in fleets of
 *          up to 64 slots).
 *          New in the API: kvidx_event.generation and kvidx_last_event_gen
 *          (restarts only on a generation change); KVIDX_F_DEFER_FREE,
 *          kvidx_reclaim and stats.deferred_bytes; kvidx_event.detached
 *          and .stand_in with snapshot format versions 3 and 4 (versions
 *          1 and 2 are still read); cfg.blocks_per_worker (a worker's seq
 *          table starts with the engines' cache size as its room).
 *          Fixed: slot generations are 64 bits (a 32-bit epoch wrapped);
 *          slot identities are read under a seqlock; a refused store
 *          gives the runs it grew their length back; kvidx__check puts
 *          back the counts it takes apart when it finds a fault.
 *          Test hooks: KVIDX_TEST_WALK, KVIDX_TEST_BULK_MAX.
 *          Each step's measurements: bench/perf-log.md; current figures:
 *          README, "Performance".
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
#define KVIDX_VERSION_MINOR 2
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
  KVIDX_RESTARTED = 2,  /* generation changed: the worker's old blocks were
                           dropped (engine restart), then it was applied  */
  KVIDX_DUPLICATE = 3   /* id at or below the last one: ignored            */
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
  uint32_t max_workers; /* worker slots; 0 = 1024                           */
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
  uint64_t seed;        /* keys the index's hash tables; 0 = a random one
                           (set it only to make layouts reproducible)      */
  size_t blocks_per_worker; /* the blocks a worker is expected to hold (its
                           engine's KV cache size in blocks), 0 = not known:
                           a worker's seq table then starts with room for
                           that many and never grows on the way there (a
                           worker holding fewer pays for the room); at most
                           max_blocks; heap mode only                       */
} kvidx_config;

#define KVIDX_BUFFER_DEFAULT_BLOCKS 65536u
/* cfg.flags: KVIDX_F_TIERS tracks host and disk copies (device bits per
 * holding and per holder entry).  Without it the index holds device copies only: a Stored event on
 * another tier is refused with KVIDX_ENOTSUP, and the tiered query reports
 * every matched block as a device block. */
#define KVIDX_F_TIERS 1u
/* cfg.flags: KVIDX_F_DEFER_FREE keeps writer calls from handing large blocks
 * (KVIDX_DEFER_FREE_MIN bytes and up: the old tables a growing map lets go
 * of, the seq table of a worker that empties) back to the allocator: they
 * wait, counted in stats.bytes and stats.deferred_bytes, until
 * kvidx_reclaim.  Why: glibc's free() of such a block can return memory to
 * the kernel inside the call (munmap or heap trim, measured at 1-6 ms on a
 * VM), which no bounded growth step can prevent.  Heap mode only;
 * no effect in caller-buffer mode (nothing goes back to a system there). */
#define KVIDX_F_DEFER_FREE 2u
#ifndef KVIDX_DEFER_FREE_MIN /* smaller blocks are freed at once (OPTIONS) */
#define KVIDX_DEFER_FREE_MIN 65536u
#endif
#if KVIDX_DEFER_FREE_MIN < 64
#error "KVIDX_DEFER_FREE_MIN must be at least 64 (a deferred block holds its list link)"
#endif

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
  size_t entries;     /* block positions stored in runs                     */
  size_t bytes;       /* bytes allocated now (heap) or buffer size (buffer)*/
  size_t peak_bytes;  /* most bytes allocated at once                      */
  size_t deferred_bytes; /* part of bytes: let go of by writer calls, waiting
                            for kvidx_reclaim (KVIDX_F_DEFER_FREE)          */
} kvidx_stats;
KVIDX_API int kvidx_get_stats(const kvidx *ix, kvidx_stats *out);
/* KVIDX_F_DEFER_FREE: hand the blocks writer calls let go of to the free
 * hook (or KVIDX_FREE) now; *freed_bytes (may be NULL) = how many bytes.
 * Call it where a pause is harmless: between events in a single-threaded
 * router, or from a housekeeping thread (it may run beside writers and
 * readers: it holds the writer lock only to take the list, and frees
 * outside it, so the hooks must be callable from that thread).  Without
 * the flag there is nothing to free: KVIDX_OK, 0 bytes. */
KVIDX_API int kvidx_reclaim(kvidx *ix, size_t *freed_bytes);

/* ---- production event handling ------------------------------------------
 * One call applies one engine event and tracks, per worker, the stream
 * generation (a publisher instance number the caller sets: a new one each
 * time the engine or its publisher restarts) and the last event id in it:
 *   first event of a worker: any generation, any id;
 *   generation changed: the engine restarted: its old blocks are dropped,
 *   then the event is applied (any id), KVIDX_RESTARTED;
 *   same generation:  id == last + 1: applied, KVIDX_OK;
 *   id > last + 1: applied, KVIDX_GAP (ask the engine for a replay);
 *   id <= last: ignored, KVIDX_DUPLICATE (a resent, reordered or replayed
 *   event never wipes the worker; only a generation change does).
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
  uint64_t generation;       /* stream generation (publisher instance): a
                                change means the engine restarted           */
  int detached;              /* Stored, parent NULL only (else EINVAL):
                                block 0 continues a prefix nobody holds any
                                more and its local is that block's chain
                                hash.  kvidx_dump writes these for blocks
                                whose ancestors are gone (see "Detached
                                runs" in the design comment).  Meant for
                                replaying a dump into an empty index, where
                                nobody ends up holding such a block and the
                                answers are exact.  Otherwise: the block
                                joins its prefix only when a store makes
                                its position, while the reference kind,
                                which keys blocks by chain alone (a root
                                block whose local is that chain), joins
                                them at once; a worker holding both the
                                block and its prefix then scores deeper
                                there.  0 otherwise                        */
  int stand_in;              /* set by kvidx_dump on a stand-in ancestor's
                                Stored event (a block the worker does not
                                hold, invented so that a block below a hole
                                has a parent) and on the Removed event that
                                takes the stand-ins away again; ignored by
                                kvidx_apply, which counts stand-ins like any
                                block (replaying a dump into an index at its
                                max_blocks needs room for one worker's
                                stand-ins; kvidx_snapshot_read does not)   */
} kvidx_event;
KVIDX_API int kvidx_apply(kvidx *ix, const kvidx_event *ev);
/* Last event id seen for a worker: KVIDX_OK, or KVIDX_ENOENT if none. */
KVIDX_API int kvidx_last_event_id(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank, uint64_t *out);
/* The generation that id belongs to: KVIDX_OK, or KVIDX_ENOENT if none. */
KVIDX_API int kvidx_last_event_gen(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank, uint64_t *out);
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
 * event id and its generation, through caller callbacks.  read needs an empty target index; on
 * any error (KVIDX_ECORRUPT, KVIDX_EVERSION, KVIDX_ETRUNCATED, KVIDX_EIO, or
 * the target refusing a block) the target is left empty and valid.  Stand-
 * ins do not count against the target's max_blocks while a snapshot is
 * read (caller-buffer mode excepted): a snapshot of an index at its
 * max_blocks loads into one of the same size.  A target with cfg.evict may
 * be smaller than the snapshot: it evicts as the blocks come (recency is
 * load order), and a block whose parent it evicted (or, at max_blocks 1,
 * any block with a parent) is left out with everything below it; what it
 * keeps is a subset of the snapshot's holdings at the same positions.
 * Eviction recency restarts from load order; expiries are kept. */
typedef int (*kvidx_event_fn)(void *ctx, const kvidx_event *ev);
typedef int (*kvidx_write_fn)(void *ctx, const void *buf, size_t len); /* 0 = ok */
typedef size_t (*kvidx_read_fn)(void *ctx, void *buf, size_t len);    /* bytes read,
                                                  0 = end (short reads are fine) */
KVIDX_API int kvidx_dump(const kvidx *ix, kvidx_event_fn emit, void *ctx);
KVIDX_API int kvidx_snapshot_write(const kvidx *ix, kvidx_write_fn write, void *ctx);
KVIDX_API int kvidx_snapshot_read(kvidx *ix, kvidx_read_fn read, void *ctx);

KVIDX_API const char *kvidx_strerror(int status);
KVIDX_API const char *kvidx_version(void); /* "0.2.0" */

/* Invariant checker (rax style): 0 if every internal invariant holds, else a
 * negative line-number-like code.  O(size); for tests.  No writer may run
 * meanwhile; readers may (it changes nothing they read). */
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

/* ---- language and compiler checks: one clear #error, then the rest of the
 * implementation is skipped (compilers go on after #error) -------------- */
#if defined(__cplusplus) && __cplusplus < 201103L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 201103L)
#error "kvidx.h: the implementation needs C++11 or later (-std=c++11), or compile it as C11"
#define KVIDX__IMPLEMENTED
#elif !defined(__cplusplus) && !defined(KVIDX_NO_THREADS) && \
    (!defined(__STDC_VERSION__) || __STDC_VERSION__ < 201112L)
#error "kvidx.h: C before C11 has no atomics: compile with -std=c11 or later, or define KVIDX_NO_THREADS (single-threaded build)"
#define KVIDX__IMPLEMENTED
#elif !defined(__cplusplus) && !defined(KVIDX_NO_THREADS) && \
    (defined(__STDC_NO_ATOMICS__) || (defined(__TINYC__) && __TINYC__ <= 927))
#error "kvidx.h: this compiler has no <stdatomic.h> (tcc 0.9.27, or __STDC_NO_ATOMICS__): define KVIDX_NO_THREADS (single-threaded build)"
#define KVIDX__IMPLEMENTED
#endif

#ifndef KVIDX__IMPLEMENTED
#define KVIDX__IMPLEMENTED

#include <string.h>
#include <stdlib.h> /* qsort; malloc/free unless KVIDX_NO_MALLOC */

#ifndef KVIDX_WORKERS_MAX
#define KVIDX_WORKERS_MAX 4096
#endif
#if KVIDX_WORKERS_MAX > 65535
#error "kvidx.h: KVIDX_WORKERS_MAX above 65535 (a run's holder count is 16 bits)"
#endif
#ifndef KVIDX_JUMP_MAX
#define KVIDX_JUMP_MAX 256
#endif
#ifndef KVIDX_TEST_HOOK
#define KVIDX_TEST_HOOK(ix, where) ((void)0)
#endif
#ifndef KVIDX_TEST_WALK /* test-only: the query walk's steps (see OPTIONS) */
#define KVIDX_TEST_WALK(ix, step, blocks) ((void)0)
#endif
#ifndef KVIDX_TEST_GEN_STEP /* test-only: slot generations advance by this much */
#define KVIDX_TEST_GEN_STEP 1u
#endif
#ifndef KVIDX_TEST_DRAIN_STEP /* test-only: places a growing map drains per reservation, at least */
#define KVIDX_TEST_DRAIN_STEP 64u
#endif
#ifndef KVIDX_TEST_BULK_MAX /* test-only: new tables with control bytes of at most this many bytes fill at once */
#define KVIDX_TEST_BULK_MAX 524288u
#endif
#ifndef KVIDX_TEST_SHRINK_MIN /* test-only: seq tables of this many places or fewer never shrink */
#define KVIDX_TEST_SHRINK_MIN 64u
#endif
#if !defined(KVIDX_NO_MALLOC) && !defined(KVIDX_MALLOC)
#define KVIDX_MALLOC(sz) malloc(sz)
#define KVIDX_FREE(p) free(p)
#define KVIDX_CALLOC(sz) calloc(1, sz) /* zeroed tables: fresh pages need no memset */
#endif

#define KVIDX__NW_MAX ((KVIDX_WORKERS_MAX + 63) / 64)
#define KVIDX__DEFAULT_WORKERS 1024u
#define KVIDX__DEFAULT_JUMP 16u /* measured: bench/results/jump.md */

#if defined(__cplusplus)
#define KVIDX__CAST(T, x) (static_cast<T>(x))
/* RCAST: pointers into caller buffers and pools, whose layout aligns every
 * record; through void * so -Wcast-align has nothing to say. */
#define KVIDX__RCAST(T, x) (reinterpret_cast<T>(const_cast<void *>(static_cast<const volatile void *>(x))))
#define KVIDX__MUT(x) (const_cast<kvidx *>(x)) /* readers load atomics only */
#define KVIDX__UNC(T, x) (const_cast<T>(x))
#define KVIDX__ADDR(p) (reinterpret_cast<uintptr_t>(p))
#else
#define KVIDX__CAST(T, x) ((T)(x))
#define KVIDX__RCAST(T, x) ((T)(void *)(x))
#define KVIDX__MUT(x) ((kvidx *)(x))
#define KVIDX__UNC(T, x) ((T)(x))
#define KVIDX__ADDR(p) ((uintptr_t)(p))
#endif

/* ---- atomics: one macro layer --------------------------------------------
 * C11 <stdatomic.h> in C, the same operations from <atomic> when the
 * implementation is compiled as C++, plain memory for KVIDX_NO_THREADS.
 * Readers use relaxed loads plus fences (Boehm, "Can seqlocks get along with
 * programming language memory models?"); every word a racing reader may load
 * is declared KVIDX__A(T).  ThreadSanitizer does not model standalone fences,
 * but every racing access is atomic, so TSan reports no race either way; the
 * fences are what make the seqlock correct on weakly ordered CPUs. */
/* KVIDX__PAUSE: a spin-wait hint (x86 pause, Arm yield), else nothing.
 * KVIDX__YIELD: give up the time slice: std::this_thread::yield in C++,
 * sched_yield on POSIX systems (in libc proper: no -pthread, unlike
 * thrd_yield on glibc before 2.34), thrd_yield where <threads.h> is known to
 * exist, else nothing (readers then spin with pauses: still correct). */
#if defined(KVIDX_NO_THREADS)
#define KVIDX__PAUSE() ((void)0)
#elif (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define KVIDX__PAUSE() __builtin_ia32_pause()
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <intrin.h>
#define KVIDX__PAUSE() _mm_pause()
#elif (defined(__GNUC__) || defined(__clang__)) && (defined(__aarch64__) || (defined(__ARM_ARCH) && __ARM_ARCH >= 7))
#define KVIDX__PAUSE() __asm__ __volatile__("yield" ::: "memory")
#else
#define KVIDX__PAUSE() ((void)0)
#endif
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
#if defined(__unix__) || defined(__unix) || (defined(__APPLE__) && defined(__MACH__))
#include <sched.h>
#define KVIDX__YIELD() ((void)sched_yield())
#elif defined(_WIN32) && !defined(__STDC_NO_THREADS__) && defined(_MSC_VER) && _MSC_VER >= 1933
#include <threads.h> /* MSVC 17.3+ ships C11 threads; mingw does not */
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

/* A prefetch hint: the writer touches one random line per block of an event,
 * so it asks for the lines of blocks a few places ahead. */
#if defined(__GNUC__) || defined(__clang__)
#define KVIDX__PREFETCH(p) __builtin_prefetch(p)
#else
#define KVIDX__PREFETCH(p) ((void)(p))
#endif
#define KVIDX__AHEAD 8

/* Control bytes (a byte per place beside the writer's one-word-key tables,
 * 16 compared at once: see the map section): with SSE2 (x86, GCC or Clang),
 * NEON (AArch64, GCC or Clang), elsewhere as two 64-bit words
 * (KVIDX__GROUP_WORDS; KVIDX_TEST_GROUP_WORDS picks it on any target, for
 * the tests).  KVIDX_NO_SIMD: no control bytes, every table probes place by
 * place. */
#if defined(KVIDX_NO_SIMD)
#define KVIDX__CTRL 0
#else
#define KVIDX__CTRL 1
#if !defined(KVIDX_TEST_GROUP_WORDS) && defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
#define KVIDX__GROUP_SSE2 1
#elif !defined(KVIDX_TEST_GROUP_WORDS) && defined(__aarch64__) && defined(__ARM_NEON) &&                        \
    (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>
#define KVIDX__GROUP_NEON 1
#else
#define KVIDX__GROUP_WORDS 1
#endif
#endif
/* A used place's byte from its key's hash; a deleted place's; their size
 * in bytes (the bytes and the first 16 again). */
#define KVIDX__CTRL_BYTE(h) KVIDX__CAST(unsigned char, 0x80u | ((h) >> 57))
#define KVIDX__CTRL_USED(b) ((b) >> 7) /* byte b marks a used place (empty and deleted: top bit clear) */
#define KVIDX__CTRL_DELETED 1u /* a free place a probe goes past (a tombstone) */
#define KVIDX__CTRL_SIZE(slots) KVIDX__CAST(size_t, (slots) + 16) /* the bytes and the copy */

#if KVIDX_WORKERS_MAX > 65535
#error "KVIDX_WORKERS_MAX must stay below 65536 (a query's hit records keep 16 bits per slot)"
#endif

#ifdef KVIDX_STATIC
#define KVIDX_DEF KVIDX_API
#else
#define KVIDX_DEF
#endif
#define KVIDX__PRIV static
#if defined(__GNUC__) || defined(__clang__)
#define KVIDX__HOT static inline __attribute__((always_inline)) /* a few hot, small paths */
#else
#define KVIDX__HOT static
#endif

#define KVIDX__NONE 0xFFFFFFFFu     /* "no id": the root as a parent, end of list */
#define KVIDX__SIZE_MAX (~KVIDX__CAST(size_t, 0))
#define KVIDX__ID_LIMIT 0x7FFFFFF0u /* ids and element counts stay below this     */
#define KVIDX__RUN_MAX 64           /* blocks per run: a worker's share is one u64 */
#define KVIDX__SLOT_MEMO 64u        /* slots a store or removal finds without a probe */
#define KVIDX__SEGS 96              /* grow-only segments per array (4 per size)  */
#define KVIDX__WCLASSES 14          /* word chunks of 1 << 0 .. 1 << 13 words    */
#define KVIDX__NOCLASS 0xFFu


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
/* XXH3's output was frozen in xxHash 0.8.0: an older xxhash.h builds but
 * computes other (non-Dynamo) hashes. */
#if !defined(XXH_VERSION_NUMBER) || XXH_VERSION_NUMBER < 800
#error "kvidx.h: xxhash.h 0.8.0 or later needed (XXH3 output before 0.8.0 differs from Dynamo's)"
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
/* Buffer mode carves every allocation out of the caller's buffer: size
 * classes of 2^k, 1.25, 1.5 and 1.75 x 2^k bytes (a table's header past a
 * power of two costs a quarter, not double), a free list each, never split
 * or merged (firmware-simple). */
typedef struct {
  unsigned char *next, *end;
  void *free_list[4 * 48];
} kvidx__arena;

/* ---- the types, in the data's path ------------------------------------- */
typedef struct { /* a grow-only array of es-byte elements (see 2.) */
  KVIDX__A(unsigned char *) seg[KVIDX__SEGS];
  uint64_t cap;
  size_t es;
  uint32_t shift0, nseg;
} kvidx__grow;

typedef struct {
  kvidx__grow g;            /* atomic u64 words                          */
  uint64_t hw, used;        /* bump mark; words in live chunks           */
  uint32_t free_head[14];   /* per class: first free chunk, or NONE      */
} kvidx__words;

typedef struct kvidx__mtab { /* a map's table: this header and its entries */
  uint64_t mask, bytes;         /* bytes: of the entries                      */
  KVIDX__A(uint64_t) *words;    /* the entries, an allocation of their own so
                                   a table of 2^k places fills a size class  */
  unsigned char *ctrl;          /* control bytes (a seq table's, the holdings'
                                   map section), or NULL: writer-only, so plain */
  uint64_t tombs;               /* with ctrl: places marked deleted         */
  struct kvidx__mtab *retired;
} kvidx__mtab;

typedef struct {
  KVIDX__A(kvidx__mtab *) tab; /* every insert goes here                      */
  KVIDX__A(kvidx__mtab *) old; /* the table being drained after a growth     */
  kvidx__mtab *retired;      /* shared maps: older tables, freed at destroy */
  KVIDX__A(uint32_t) moves;  /* shared maps: seqlock around deletions and
                                entries moving from old to tab             */
  uint64_t drain_from, drained; /* old: where the sweep began, places swept */
  kvidx__mtab *next;         /* the next table, being zeroed ahead of use   */
  uint64_t zeroed;           /* next: entry bytes zeroed so far             */
  uint32_t ew, kw, occ, n;   /* n: entries in both tables                   */
  uint64_t most;             /* entries it can ever hold (0: no bound): a
                                reservation never asks for more            */
  int shared;
  int seq;                   /* a worker's seq table (entries carry tags)  */
} kvidx__map;

/* A run: up to 64 consecutive blocks of one path, stored once for every
 * worker (see the pictures in the design comment). */
typedef struct {
  KVIDX__A(uint32_t) ver;     /* seqlock: odd while the writer changes the run */
  KVIDX__A(uint32_t) parent;  /* parent run, KVIDX__NONE = the root            */
  KVIDX__A(uint32_t) shape;   /* len | parent offset << 8 | locals class << 16
                                 | holders class << 24; len 0 = a free run     */
  KVIDX__A(uint32_t) nhold;   /* low 16 bits: holder entries in use (read them
                                 with KVIDX__NHOLD); bits 16-23: the checker's
                                 count of children, zero otherwise; top 8: the
                                 offset cont hangs at (KVIDX__CONT_OFF)       */
  KVIDX__A(uint32_t) locals;  /* word index of the locals chunk                */
  KVIDX__A(uint32_t) holders; /* word index of the holder chunk                */
  KVIDX__A(uint32_t) kids;    /* child runs hanging below: readers and stores
                                 skip the child map when there are none; in a
                                 free run (kids 0), the next free run         */
  KVIDX__A(uint32_t) cont;    /* a hint: a run hung below this run (a long
                                 store's next 64, a conversation's next turn;
                                 see the picture), or NONE; the walk tries it
                                 before the child map and believes it only if
                                 it checks out                                 */
} kvidx__run;
#define KVIDX__NHOLD(word) ((word) & 0xFFFFu)
#define KVIDX__CONT_OFF(word) ((word) >> 24)
#define KVIDX__DETACHED 64u /* parent offset of a detached run (see kvidx__run_detach) */
#define KVIDX__DET_FILTER 1024u
#define KVIDX__DET_SLOT(chain) KVIDX__CAST(uint32_t, (chain) >> 54)

/* A worker slot's identity, what readers load: 32 bytes, two to a cache
 * line, in an array of their own (the writer's per-slot state below
 * changes on every store and would share their lines). */
typedef struct {
  KVIDX__A(uint32_t) ver;  /* seqlock over id, rank, gen                    */
  KVIDX__A(uint32_t) rank;
  KVIDX__A(uint64_t) id;
  KVIDX__A(uint64_t) gen;  /* assignment generation: readers skip slots
                              assigned after their query began (64 bits:
                              never wraps)                                 */
  KVIDX__A(uint32_t) order; /* a hint: this worker's place among the live
                               ones by (id, rank); written outside the
                               seqlock (every slot's shifts when one comes
                               or goes), so readers check what it sorts  */
  KVIDX__A(uint32_t) at_order; /* the inverse, also a hint: the slot whose
                               order is this slot's index (the walk places
                               its answer by it: kvidx__stopped_emit)      */
} kvidx__ident;

/* A worker slot: the writer's per-worker state. */
typedef struct {
  uint32_t used, free_next;
  size_t blocks;
  kvidx__map seqs;         /* engine seq -> position | tiers (+ eviction keys) */
#ifndef KVIDX_NO_RUN_SPLIT
  unsigned char hashing;   /* its seqs, seen at its first store: 0 not yet,
                              1 Dynamo's folding of the locals, 2 its own  */
#endif
} kvidx__slot;

typedef struct { /* per-worker event id tracking (kvidx_apply)            */
  uint64_t id, last, gen;
  uint32_t rank, used;
} kvidx__evid;

typedef struct kvidx__ref kvidx__ref;
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


typedef struct { /* a lazily deleted eviction heap element */
  uint64_t k1, k2, seq;
  uint32_t slot, pad_;
} kvidx__victim;

struct kvidx {
  int kind, buffer_mode, tiers_on, evict;
  kvidx_alloc_fn alloc;
  kvidx_free_fn free;
  void *actx;
  kvidx__arena arena;          /* buffer mode                              */
  size_t bytes, peak, buf_len, fixed_bytes;
  int defer_free;              /* KVIDX_F_DEFER_FREE                       */
  void *deferred;              /* blocks waiting for kvidx_reclaim, linked  */
  size_t deferred_bytes;       /* through a kvidx__deferred in each         */
  uint64_t seed;               /* keys every map's hash                    */
  uint64_t seq_room;           /* cfg.blocks_per_worker (heap mode), 0 = none */
  uint32_t max_workers, jump, hw; /* hw: words per holder entry (2 with tiers) */
  uint32_t hdev;               /* the device bits' word in a holding          */
  unsigned chunk_top;          /* class of the largest word chunk it asks for */
  size_t max_blocks, max_entries, blocks, entries;
  /* worker slots */
  kvidx__slot *slots;
  kvidx__ident *idents;        /* slot identities (readers)                */
  kvidx__map slot_map;         /* (worker_id, dp_rank + 1) -> slot         */
  uint32_t slot_memo[KVIDX__SLOT_MEMO]; /* kvidx__slot_of's: slots by (id, rank) */
  uint32_t slot_free, slots_used;
  KVIDX__A(uint32_t) order_ver; /* seqlock over every slot's order hints  */
  KVIDX__A(uint64_t) gen;      /* slot assignments so far                  */
  KVIDX__A(uint32_t) nw_live;  /* bitset words that can hold a live slot   */
  /* shared storage */
  kvidx__words words;
  kvidx__grow runs;
  kvidx__grow chains;          /* per run id, writer-only: its first block's
                                  chain hash once known, 0 if not (see
                                  kvidx__chain_at)                          */
  kvidx__grow kid_hi;          /* per run id, writer-only, a byte: past the
                                  highest offset a child hangs at (0: no
                                  child); see kvidx__run_split              */
#ifndef KVIDX_NO_RUN_SPLIT
  kvidx__grow hints;           /* per run id, writer-only (hints_on): a word
                                  chunk of the seqs its blocks were stored
                                  under by workers with their own hashes, or
                                  KVIDX__NONE (see kvidx__hints_put)        */
  int hints_on;                /* heap mode without tiers: moves can happen */
#endif
  uint32_t run_free, runs_live, runs_hw; /* runs_hw: ids handed out so far */
  uint32_t detached;           /* runs whose prefix nobody holds (below) */
  uint32_t chain_hint_run, chain_hint_off; /* writer: a position's chain, */
  uint64_t chain_hint;                     /* the last store's end (run NONE: none) */
  unsigned char det_filter[KVIDX__DET_FILTER]; /* detached runs per chain >> 54,
                                  saturating at 255 (then until no detached
                                  run is left, when all are zeroed): a store
                                  probes for one only where a count is set  */
  kvidx__map children;         /* (parent run + 1) << 8 | offset, local -> run */
  kvidx__map holds;            /* (slot << 32 | run): held, device, multi bits,
                                  holder index                               */
  kvidx__map multi;            /* (slot, run << 8 | off): seqs at a position
                                  held under >= 2 seqs: count | device << 32 */
  KVIDX__A(int) wlock;
  kvidx__ref *ref;
  /* eviction (cfg.evict) */
  size_t evict_target;
  uint64_t pruned;             /* blocks the size bound evicted so far      */
  uint64_t stamp, seqno;
  kvidx__victim *heap;
  size_t heap_n, heap_cap;
  /* event ids */
  kvidx__evid *evtab;
  uint32_t evtab_mask, evtab_n;
};

/* ========================================================================== */
/* 2. Memory: allocation, grow-only arrays, word chunks, the one map          */
/* ========================================================================== */
KVIDX__PRIV unsigned kvidx__log2(uint64_t x) { /* floor, x > 0 */
#if defined(__GNUC__) || defined(__clang__)
  return 63u - KVIDX__CAST(unsigned, __builtin_clzll(x));
#else
  unsigned k = 0;
  while (x >>= 1) k++;
  return k;
#endif
}

KVIDX__PRIV unsigned kvidx__ctz64(uint64_t x) { /* x != 0 */
#if defined(__GNUC__) || defined(__clang__)
  return KVIDX__CAST(unsigned, __builtin_ctzll(x));
#else
  unsigned c = 0;
  while (!(x & 1)) { x >>= 1; c++; }
  return c;
#endif
}

/* Without a popcount instruction (-mpopcnt, or ARM's) GCC's builtin is a
 * call into libgcc: the few lines below are inline (the query's answer
 * counts its sets with it). */
KVIDX__PRIV unsigned kvidx__popcount64(uint64_t x) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__POPCNT__) || defined(__aarch64__))
  return KVIDX__CAST(unsigned, __builtin_popcountll(x));
#else
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
  return KVIDX__CAST(unsigned, (x * 0x0101010101010101ull) >> 56);
#endif
}

KVIDX__PRIV uint32_t kvidx__pow2(uint64_t n) { /* smallest power of two >= n, >= 16 */
  uint64_t p = 16;
  while (p < n) p <<= 1;
  return p > 0x80000000u ? 0x80000000u : KVIDX__CAST(uint32_t, p);
}

KVIDX__PRIV unsigned kvidx__class_of(uint64_t n) { /* smallest c with 2^c >= n */
  return n <= 1 ? 0u : kvidx__log2(n - 1) + 1u;
}

KVIDX__PRIV void *kvidx__raw_alloc(kvidx_alloc_fn fn, void *ctx, size_t n) {
  if (fn) return fn(ctx, n);
#ifdef KVIDX_NO_MALLOC
  return NULL;
#else
  return KVIDX_MALLOC(n);
#endif
}

/* The arena's class for n bytes, and its size. */
KVIDX__PRIV unsigned kvidx__arena_class(uint64_t n, uint64_t *size) {
  unsigned k = kvidx__class_of(n < 64 ? 64 : n), q;
  uint64_t base = KVIDX__CAST(uint64_t, 1) << (k - 1);
  for (q = 1; q < 4 && base + q * (base / 4) < n; q++) {}
  *size = q < 4 ? base + q * (base / 4) : base * 2;
  return q < 4 ? 4 * (k - 1) + q : 4 * k;
}

KVIDX__PRIV void *kvidx__arena_alloc(kvidx__arena *a, size_t n) {
  uint64_t size;
  unsigned c = kvidx__arena_class(n, &size);
  void *p;
  if (c >= 4 * 48) return NULL;
  if ((p = a->free_list[c]) != NULL) {
    memcpy(&a->free_list[c], p, sizeof(void *));
    return p;
  }
  if (KVIDX__CAST(uint64_t, a->end - a->next) < size) return NULL;
  p = a->next;
  a->next += KVIDX__CAST(size_t, size);
  return p;
}

KVIDX__PRIV void *kvidx__alloc(kvidx *ix, size_t n) {
  void *p;
  if (n == 0) return NULL;
  if (ix->buffer_mode) return kvidx__arena_alloc(&ix->arena, n);
  p = kvidx__raw_alloc(ix->alloc, ix->actx, n);
  if (p) {
    ix->bytes += n;
    if (ix->bytes > ix->peak) ix->peak = ix->bytes;
  }
  return p;
}

/* Zeroed memory for a new table: the default allocator's calloc takes fresh
 * pages from the kernel without writing them; hooks and buffers get memset. */
KVIDX__PRIV void *kvidx__alloc_zeroed(kvidx *ix, size_t n) {
  void *p;
#if !defined(KVIDX_NO_MALLOC) && defined(KVIDX_CALLOC)
  if (!ix->buffer_mode && !ix->alloc && n) {
    p = KVIDX_CALLOC(n);
    if (p) {
      ix->bytes += n;
      if (ix->bytes > ix->peak) ix->peak = ix->bytes;
    }
    return p;
  }
#endif
  p = kvidx__alloc(ix, n);
  if (p) memset(p, 0, n);
  return p;
}

/* The allocator's own free (heap mode). */
KVIDX__PRIV void kvidx__raw_free(const kvidx *ix, void *p, size_t n) {
  if (ix->free) ix->free(ix->actx, p, n);
#ifndef KVIDX_NO_MALLOC
  else KVIDX_FREE(p);
#endif
}

/* A block waiting for kvidx_reclaim starts with its link (the block is
 * the library's until then, and at least KVIDX_DEFER_FREE_MIN bytes). */
typedef struct kvidx__deferred {
  void *next;
  size_t bytes;
} kvidx__deferred;

KVIDX__PRIV void kvidx__free(kvidx *ix, void *p, size_t n) {
  if (!p) return;
  if (ix->buffer_mode) {
    uint64_t size;
    unsigned c = kvidx__arena_class(n, &size);
    memcpy(p, &ix->arena.free_list[c], sizeof(void *));
    ix->arena.free_list[c] = p;
    return;
  }
  if (ix->defer_free && n >= KVIDX_DEFER_FREE_MIN) { /* still counted in bytes */
    kvidx__deferred d;
    d.next = ix->deferred;
    d.bytes = n;
    memcpy(p, &d, sizeof d);
    ix->deferred = p;
    ix->deferred_bytes += n;
    return;
  }
  ix->bytes -= n;
  kvidx__raw_free(ix, p, n);
}

/* Take the deferred blocks off the index (they leave stats.bytes now);
 * *bytes = their total.  Writer-side state: under the lock. */
KVIDX__PRIV void *kvidx__take_deferred(kvidx *ix, size_t *bytes) {
  void *list = ix->deferred;
  *bytes = ix->deferred_bytes;
  ix->bytes -= ix->deferred_bytes;
  ix->deferred = NULL;
  ix->deferred_bytes = 0;
  return list;
}

/* Free a list kvidx__take_deferred took (no index state: outside the lock). */
KVIDX__PRIV void kvidx__free_deferred(const kvidx *ix, void *p) {
  while (p) {
    kvidx__deferred d;
    memcpy(&d, p, sizeof d);
    kvidx__raw_free(ix, p, d.bytes);
    p = d.next;
  }
}

/* Out of memory: the hooks said no (heap) or the buffer is full (buffer). */
KVIDX__PRIV int kvidx__oom(const kvidx *ix) { return ix->buffer_mode ? KVIDX_EFULL : KVIDX_ENOMEM; }

KVIDX__PRIV size_t kvidx__align(size_t n) { return (n + 63) & ~KVIDX__CAST(size_t, 63); }

/* ---- grow-only arrays: four segments of each size, doubling ----------------
 * Segment k holds 1 << (shift0 + k / 4) elements: capacities of 1, 2, 3,
 * 4, 6, 8, 10, 12, 16, 20, ... segment-0 sizes, each new segment a seventh
 * to a quarter of the capacity once past the first few.  So the part
 * allocated ahead of use, less than the last segment, stays under a
 * quarter of the array (about a fifth when large); plain doubling left up
 * to half of it unused.
 *
 *   element i, u = i + 4 * seg0:   u in [2^L, 2^(L+1))
 *   [ 2^(L-2) | 2^(L-2) | 2^(L-2) | 2^(L-2) ]   segments 4 (L - shift0 - 2) + 0..3
 *
 * Segments never move and are never freed before destroy, so an index a
 * reader picked up, once bounds-checked, always names valid atomic memory
 * (freed elements are only reused as elements of the same array:
 * type-stable).  Segment boundaries are multiples of segment 0's size, so
 * word chunks (at most 1 << 13 words, aligned to their size) never cross
 * one when shift0 >= 13. */
KVIDX__PRIV uint64_t kvidx__seg_elems(const kvidx__grow *g, unsigned k) {
  return KVIDX__CAST(uint64_t, 1) << (g->shift0 + k / 4);
}

KVIDX__HOT void *kvidx__grow_get(const kvidx__grow *g, uint64_t i, uint64_t count, int reader) {
  /* one bit scan finds the power of two, its next two bits the quarter */
  uint64_t u = i + (KVIDX__CAST(uint64_t, 4) << g->shift0);
  unsigned L = kvidx__log2(u), k = 4 * (L - g->shift0 - 2) + KVIDX__CAST(unsigned, (u >> (L - 2)) & 3u);
  uint64_t size = KVIDX__CAST(uint64_t, 1) << (L - 2), off = u & (size - 1);
  unsigned char *base;
  if (k >= KVIDX__SEGS || off + count > size) return NULL; /* crosses a segment */
  base = reader ? kvidx__ld_acq(&KVIDX__UNC(kvidx__grow *, g)->seg[k]) : kvidx__ld(&KVIDX__UNC(kvidx__grow *, g)->seg[k]);
  return base ? base + off * g->es : NULL;
}

KVIDX__PRIV int kvidx__grow_reserve(kvidx *ix, kvidx__grow *g, uint64_t need) {
  while (g->cap < need) {
    unsigned k = g->nseg;
    uint64_t elems;
    unsigned char *p;
    if (k >= KVIDX__SEGS || g->cap + (elems = kvidx__seg_elems(g, k)) > KVIDX__ID_LIMIT) return KVIDX_EFULL;
    if (elems * g->es > KVIDX__SIZE_MAX) return kvidx__oom(ix);
    p = KVIDX__CAST(unsigned char *, kvidx__alloc(ix, KVIDX__CAST(size_t, elems * g->es)));
    if (!p) return kvidx__oom(ix);
    /* not zeroed: nothing reads an element before it is written (ids and word
     * indices a reader can hold were published after their contents), and
     * touching every page here would stall this one call */
    kvidx__st_rel(&g->seg[k], p);
    g->nseg++;
    g->cap += elems;
  }
  return KVIDX_OK;
}

KVIDX__PRIV void kvidx__grow_drop(kvidx *ix, kvidx__grow *g) {
  unsigned k;
  for (k = 0; k < g->nseg; k++) kvidx__free(ix, kvidx__ld(&g->seg[k]), KVIDX__CAST(size_t, kvidx__seg_elems(g, k) * g->es));
}

/* ---- word chunks: runs' locals and holder lists ---------------------------
 * Chunks of 1 << c atomic u64 words, aligned to their size (so one never
 * crosses a segment), a free list per class (the link lives in word 0). */
KVIDX__HOT KVIDX__A(uint64_t) *kvidx__word(const kvidx *ix, uint32_t i) {
  return KVIDX__RCAST(KVIDX__A(uint64_t) *, kvidx__grow_get(&ix->words.g, i, 1, 0));
}

/* Copy n words of a chunk into another (chunks never cross a segment, so
 * each is one address lookup). */
KVIDX__PRIV void kvidx__words_copy(kvidx *ix, uint32_t to, uint32_t from, uint32_t n) {
  KVIDX__A(uint64_t) *d = kvidx__word(ix, to), *f = kvidx__word(ix, from);
  uint32_t i;
  for (i = 0; i < n; i++) kvidx__st(&d[i], kvidx__ld(&f[i]));
}

/* Room past the bump mark for `need` words of new chunks plus the largest
 * chunk this index asks for (a run's locals or a holder list of every
 * worker): not the largest class there is, which in a small caller buffer
 * would be most of the buffer. */
KVIDX__PRIV int kvidx__words_reserve(kvidx *ix, uint64_t need) {
  return kvidx__grow_reserve(ix, &ix->words.g, ix->words.hw + need + (KVIDX__CAST(uint64_t, 1) << ix->chunk_top));
}

KVIDX__PRIV void kvidx__chunk_free(kvidx *ix, uint32_t at, unsigned c) {
  kvidx__st(kvidx__word(ix, at), KVIDX__CAST(uint64_t, ix->words.free_head[c]));
  ix->words.free_head[c] = at;
  ix->words.used -= KVIDX__CAST(uint64_t, 1) << c;
}

/* A chunk of class c, or KVIDX__NONE when the pool cannot grow. */
KVIDX__PRIV uint32_t kvidx__chunk_alloc(kvidx *ix, unsigned c) {
  kvidx__words *w = &ix->words;
  uint64_t size = KVIDX__CAST(uint64_t, 1) << c, at;
  if (w->free_head[c] != KVIDX__NONE) {
    uint32_t i = w->free_head[c];
    w->free_head[c] = KVIDX__CAST(uint32_t, kvidx__ld(kvidx__word(ix, i)));
    w->used += size;
    return i;
  }
  at = (w->hw + size - 1) & ~(size - 1);
  if (kvidx__grow_reserve(ix, &w->g, at + size) != KVIDX_OK) return KVIDX__NONE;
  while (w->hw < at) { /* the alignment gap becomes smaller free chunks */
    unsigned cc = kvidx__ctz64(w->hw);
    while (w->hw + (KVIDX__CAST(uint64_t, 1) << cc) > at) cc--;
    w->used += KVIDX__CAST(uint64_t, 1) << cc;
    kvidx__chunk_free(ix, KVIDX__CAST(uint32_t, w->hw), cc);
    w->hw += KVIDX__CAST(uint64_t, 1) << cc;
  }
  w->hw = at + size;
  w->used += size;
  return KVIDX__CAST(uint32_t, at);
}

/* ---- the map: one open-addressing table for every keyed lookup -----------
 * Entries of `ew` atomic u64 words, the key in the first `kw`; word `occ` is
 * never 0 in a used entry (so 0 marks a free place).  Linear probing from a
 * home keyed by the index's random seed (crafted keys cannot build long
 * probe chains), at most 3/4 full, backward-shift deletion.  The maps
 * only the writer probes with one-word keys (the worker seq tables, the
 * holdings) add a control byte per place, 16 compared at once, and delete
 * without the shift (below; the holdings 0.98x-0.99x the time on the W16
 * C2048 files).  Lookups in the seq tables are nearly all hits, and once
 * the tables take several MiB a probe misses on the bytes and again on the
 * place (both lines asked for ahead); what pays for that is the deletion
 * (session 28; session 26's prototype of Swiss-table groups for every map:
 * 1.07x-1.78x the time).  The child map stays plain: readers probe it,
 * and a reader-safe deletion without the shift would need its seqlock
 * around probes that pass deleted places; so do the small two-word-key
 * maps (worker slots, multiplicities).
 *
 * Growth is incremental, so no call pays for a whole rehash.  The grown
 * table becomes `tab` (every insert goes there) and the previous one `old`;
 * each later reservation drains a bounded number of old's places (16 per
 * reserved entry, at least 1,024 in a seq table and 64 in the other maps:
 * kvidx__drain_step), in one sweep that starts after a free place and stops
 * only before one:
 *
 *     old:  [ swept: all free | unswept clusters, untouched ] .. free | ..
 *             ^drain_from       ^drain_from + drained
 *
 * So an unswept cluster is never cut, deleting in old shifts entries only
 * within the unswept part, and a key whose home was swept is not in old.
 * (With control bytes a probe may pass an empty place, so the sweep stops
 * only where that cannot leave a swept home behind: kvidx__drain_can_stop.)
 * A position names its table (KVIDX__OLD marks one in old).  The sweep is
 * done long before tab fills: it needs old's size / 16 reserved entries, tab
 * has room for 3/4 of old's size more.
 *
 * A shared map (the child map) is probed by lock-free readers: an insert
 * fills a free place and writes the `occ` word last (release); every
 * deletion and every drain step runs inside the map's `moves` seqlock, so a
 * reader whose probe overlapped one retries; readers probe tab, then old,
 * and believe a miss only if moves, tab and old did not change.  Tables a
 * shared map let go of are kept until destroy (each is half the next). */
#define KVIDX__OLD 0x80000000u           /* a position in the table being drained       */
/* How many of old's places a call that adds or lets go of `entries`
 * entries drains: 16 per entry, at least KVIDX_TEST_DRAIN_STEP (64), and in
 * a worker's seq table at least 16 times that (1,024).  While a seq table
 * drains, its lookups probe two tables through the general code, and a
 * small store's own budget kept it draining through many of its stores
 * (the floor: W16 C16384's events 0.86x-0.93x the time).  The other maps
 * keep the plain floor: a larger one for them too (holdings, multi counts)
 * raised the growth bench's p99 store latency by a fifth, and readers
 * retry over the shared child map's drain steps. */
KVIDX__PRIV uint64_t kvidx__drain_step(const kvidx__map *m, uint64_t entries) {
  uint64_t least = m->seq ? 16u * KVIDX_TEST_DRAIN_STEP : KVIDX_TEST_DRAIN_STEP;
  return 16 * entries > least ? 16 * entries : least;
}
/* A seq table's entry keeps the low 16 bits of its key's hash in bits 16-31
 * of its position word (KVIDX__POS_TAG): in a table of at most 2^16 places
 * its home follows from them, so a growth's drain and a deletion's backward
 * shift need not load the key and hash it again. */
#define KVIDX__TAG_MASK 0xFFFFu
#define KVIDX__POS_TAG(h) (((h) & KVIDX__TAG_MASK) << 16)
#define KVIDX__TAG_HOME(pos, mask) (((pos) >> 16) & (mask)) /* mask <= KVIDX__TAG_MASK */
/* An entry's home in a table of mask + 1 places, one-word key `key`: from
 * the tag of its position word `pos` where `tagged` (a seq table of at most
 * 2^16 places), else from the key's hash.  A macro: only the expression
 * taken is evaluated (each may be an atomic load). */
#define KVIDX__HOME(tagged, pos, key, seed, mask)                                                            \
  ((tagged) ? KVIDX__TAG_HOME(pos, mask) : kvidx__mix((key) ^ (seed)) & (mask))
#define KVIDX__MAP_SLOTS_MAX 0x40000000u /* so no position is KVIDX__NONE or has the bit */

KVIDX__PRIV KVIDX__A(uint64_t) *kvidx__mtab_words(const kvidx__mtab *t) { return t->words; }

KVIDX__HOT uint64_t kvidx__mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

KVIDX__HOT uint64_t kvidx__key_hash(uint64_t seed, const uint64_t *key, uint32_t kw) {
  uint64_t h = kvidx__mix(key[0] ^ seed);
  if (kw > 1) h = kvidx__mix(h ^ (key[1] + (seed >> 7)));
  return h;
}

KVIDX__PRIV void kvidx__map_init(kvidx__map *m, uint32_t ew, uint32_t kw, uint32_t occ, int shared) {
  kvidx__st(&m->tab, KVIDX__CAST(kvidx__mtab *, NULL));
  kvidx__st(&m->old, KVIDX__CAST(kvidx__mtab *, NULL));
  m->retired = NULL;
  kvidx__st(&m->moves, 0u);
  m->drain_from = m->drained = 0;
  m->next = NULL;
  m->zeroed = 0;
  m->n = 0;
  m->most = 0;
  m->ew = ew;
  m->kw = kw;
  m->occ = occ;
  m->shared = shared;
  m->seq = 0;
}

KVIDX__PRIV uint64_t kvidx__mtab_bytes(uint64_t slots, uint32_t ew) { /* entries; 64-bit: checked before use */
  return slots * ew * sizeof(uint64_t);
}

KVIDX__PRIV void kvidx__mtab_free(kvidx *ix, kvidx__mtab *t) {
  if (t->ctrl) kvidx__free(ix, t->ctrl, KVIDX__CTRL_SIZE(t->mask + 1));
  kvidx__free(ix, t->words, KVIDX__CAST(size_t, t->bytes));
  kvidx__free(ix, t, sizeof *t);
}

/* The table a position is in, and the entry at it. */
KVIDX__PRIV kvidx__mtab *kvidx__map_tab_of(const kvidx__map *m, uint32_t at) {
  kvidx__map *mm = KVIDX__UNC(kvidx__map *, m);
  return (at & KVIDX__OLD) ? kvidx__ld(&mm->old) : kvidx__ld(&mm->tab);
}

KVIDX__PRIV KVIDX__A(uint64_t) *kvidx__map_at(const kvidx__map *m, uint32_t at) {
  return kvidx__mtab_words(kvidx__map_tab_of(m, at)) + KVIDX__CAST(size_t, at & ~KVIDX__OLD) * m->ew;
}

/* Control bytes: a worker's seq table, and the holdings map (the writer's
 * maps with one-word keys; outside caller-buffer mode), keep a
 * byte per place: 0 when the place is empty, 1 when it is
 * deleted, else 0x80 | the top 7 bits of its key's hash; then the first 16
 * bytes again, so 16 bytes from any home are one unaligned load:
 *
 *     ctrl:  [ b0 b1 .. b(n-1) | b0 .. b15 ]     (n places; copies for n < 16
 *     words: [ key0 pos0 | key1 pos1 | ..  ]      repeat the table)
 *
 * A probe reads 16 bytes at a time from the key's home, reads the places
 * whose byte matches the key's, and goes on to the next 16 only if these
 * hold no empty place (Abseil's Swiss tables do the same with aligned
 * groups): one predictable branch per 16 places, not one per place.  An
 * insert takes the first place from the home that is not used, as linear
 * probing does, so every 16 bytes a probe passes before its key's are
 * without an empty place.  A deletion keeps that true without moving
 * anything: the place becomes empty when the used places around it make a
 * row of fewer than 16 (no probe ever read 16 bytes from it without an
 * empty one), or, in a seq table whose tags give each entry's home, when
 * no entry after it has it in 16 bytes its probe reads before its own
 * last 16 (only entries 16 or more places past their home can: the scan
 * goes through the row and 15 places past its end); else deleted: probes
 * go past it, inserts reuse it, and a reservation counts it as used, so a
 * table whose deleted places would take it past 3/4 is rebuilt at its
 * size without them (a drain like a growth's).  The backward shift, with
 * its mispredicted exit, is gone (W16 C2048's whole replays 0.87x-0.89x
 * the time; W64 F16, with 3.3M removals, 0.82x); the scan then spared most deleted
 * places and the rebuilds they forced (W16 C2048 0.87x-0.96x more, W64
 * F16 1.00x-1.03x).  A growth's
 * sweep may stop only at an empty place with no entry in the 15 after it
 * whose home it swept (kvidx__drain_can_stop).  The price is a byte per
 * place (2 bytes per held block at the files' loads).  Without control
 * bytes (KVIDX_NO_SIMD, caller-buffer mode) a seq table is plain
 * linear probing with backward-shift deletion, like every other map. */
/* Whether map m's tables keep control bytes. */
KVIDX__PRIV int kvidx__ctrl_wanted(const kvidx *ix, const kvidx__map *m) {
  return KVIDX__CTRL && m->kw == 1 && !m->shared && !ix->buffer_mode;
}

/* Whether place i of table t (map m) holds an entry.  In a table with
 * control bytes only its byte says so: such a table's words are not
 * zeroed when it is made (zeroing a growing seq table was a write of every
 * place before the drain's), so a free place's words may hold anything.
 * Elsewhere a used entry's `occ` word is not 0 and a free place's is. */
KVIDX__HOT int kvidx__place_used(const kvidx__map *m, const kvidx__mtab *t, uint64_t i) {
  return t->ctrl ? KVIDX__CTRL_USED(t->ctrl[i]) : kvidx__ld(&kvidx__mtab_words(t)[i * m->ew + m->occ]) != 0;
}

KVIDX__HOT void kvidx__ctrl_set(unsigned char *ctrl, uint64_t mask, uint64_t i, unsigned char b) {
  uint64_t k;
  ctrl[i] = b;
  for (k = i; k < 16; k += mask + 1) ctrl[mask + 1 + k] = b; /* the copy after the last place */
}

/* An insert's byte at place i (it may reuse a deleted place). */
KVIDX__HOT void kvidx__ctrl_fill(kvidx__mtab *t, uint64_t i, unsigned char b) {
  if (t->ctrl[i] == KVIDX__CTRL_DELETED) t->tombs--;
  kvidx__ctrl_set(t->ctrl, t->mask, i, b);
}

#if KVIDX__CTRL
/* 16 control bytes at p, as masks of 16 bits (bit k: byte k): the bytes
 * equal to b (kvidx__group_eq), the bytes of used places, whose top bit
 * is set (kvidx__group_used).  One compare and a movemask with SSE2; with
 * NEON a compare, then each byte's bit picked and the halves summed;
 * elsewhere two little-endian 64-bit words, a byte's test ending in its
 * top bit and a multiply gathering the 8 top bits of a word into a byte. */
#if defined(KVIDX__GROUP_SSE2)
KVIDX__HOT unsigned kvidx__group_eq(const unsigned char *p, unsigned char b) {
  return KVIDX__CAST(unsigned, _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128(KVIDX__RCAST(const __m128i *, p)),
                                                                _mm_set1_epi8(KVIDX__CAST(char, b)))));
}
KVIDX__HOT unsigned kvidx__group_used(const unsigned char *p) {
  return KVIDX__CAST(unsigned, _mm_movemask_epi8(_mm_loadu_si128(KVIDX__RCAST(const __m128i *, p))));
}
#elif defined(KVIDX__GROUP_NEON)
KVIDX__HOT unsigned kvidx__group_bits(uint8x16_t m) { /* bytes 0xFF or 0 */
  const uint8x8_t w = vcreate_u8(0x8040201008040201ULL); /* byte k: bit k % 8 */
  uint8x16_t b = vandq_u8(m, vcombine_u8(w, w));
  return KVIDX__CAST(unsigned, vaddv_u8(vget_low_u8(b))) | KVIDX__CAST(unsigned, vaddv_u8(vget_high_u8(b))) << 8;
}
KVIDX__HOT unsigned kvidx__group_eq(const unsigned char *p, unsigned char b) {
  return kvidx__group_bits(vceqq_u8(vld1q_u8(p), vdupq_n_u8(b)));
}
KVIDX__HOT unsigned kvidx__group_used(const unsigned char *p) {
  return kvidx__group_bits(vtstq_u8(vld1q_u8(p), vdupq_n_u8(0x80)));
}
#else
#define KVIDX__BYTES_LOW7 0x7F7F7F7F7F7F7F7FULL
#define KVIDX__BYTES_TOP 0x8080808080808080ULL
KVIDX__HOT uint64_t kvidx__group_word(const unsigned char *p) { /* 8 bytes, byte k at bits 8k (any endianness) */
  return KVIDX__CAST(uint64_t, p[0]) | KVIDX__CAST(uint64_t, p[1]) << 8 | KVIDX__CAST(uint64_t, p[2]) << 16 |
         KVIDX__CAST(uint64_t, p[3]) << 24 | KVIDX__CAST(uint64_t, p[4]) << 32 | KVIDX__CAST(uint64_t, p[5]) << 40 |
         KVIDX__CAST(uint64_t, p[6]) << 48 | KVIDX__CAST(uint64_t, p[7]) << 56;
}
/* t: only top bits set -> byte k's top bit as bit k.  Each bit lands at
 * 56 + k, and no two of the product's terms share a position, so nothing
 * carries into the top byte. */
KVIDX__HOT unsigned kvidx__group_gather(uint64_t t) {
  return KVIDX__CAST(unsigned, ((t >> 7) * 0x0102040810204080ULL) >> 56);
}
KVIDX__HOT unsigned kvidx__group_eq8(uint64_t v, unsigned char b) {
  uint64_t x = v ^ (0x0101010101010101ULL * b); /* the bytes equal to b are 0 */
  /* a byte's top bit after the add: its low 7 bits were not 0 (no carry
   * leaves a byte); with x's own top bit, set exactly in the bytes not 0 */
  uint64_t nonzero = ((x & KVIDX__BYTES_LOW7) + KVIDX__BYTES_LOW7) | x;
  return kvidx__group_gather(~nonzero & KVIDX__BYTES_TOP);
}
KVIDX__HOT unsigned kvidx__group_eq(const unsigned char *p, unsigned char b) {
  return kvidx__group_eq8(kvidx__group_word(p), b) | kvidx__group_eq8(kvidx__group_word(p + 8), b) << 8;
}
KVIDX__HOT unsigned kvidx__group_used(const unsigned char *p) {
  return kvidx__group_gather(kvidx__group_word(p) & KVIDX__BYTES_TOP) |
         kvidx__group_gather(kvidx__group_word(p + 8) & KVIDX__BYTES_TOP) << 8;
}
#endif
#endif

/* Bit k set: byte k of the 16 at p is 0 (an empty place). */
KVIDX__HOT unsigned kvidx__ctrl_empties(const unsigned char *p) {
#if KVIDX__CTRL
  return kvidx__group_eq(p, 0u);
#else
  unsigned k, e = 0;
  for (k = 0; k < 16; k++)
    if (p[k] == 0u) e |= 1u << k;
  return e;
#endif
}

/* The home of the entry at place q of table t (v: its `occ` word): from
 * its tag in a seq table of at most 2^16 places, else from its key's hash
 * (control bytes are only on maps with one-word keys). */
KVIDX__HOT uint64_t kvidx__home_at(const kvidx *ix, const kvidx__map *m, const kvidx__mtab *t, uint64_t q, uint64_t v) {
  return KVIDX__HOME(m->seq && t->mask <= KVIDX__TAG_MASK, v, kvidx__ld(&kvidx__mtab_words(t)[q * m->ew]), ix->seed,
                     t->mask);
}

/* Whether a probe may go past free place i of table t (map m) on its way
 * to an entry after it: i is in 16 bytes that probe reads before the 16
 * holding the entry (see above).  Homes come from the seq tables' tags
 * (tables of at most 2^16 places); without them, assume so. */
KVIDX__HOT int kvidx__ctrl_passed(const kvidx *ix, const kvidx__map *m, const kvidx__mtab *t, uint64_t i) {
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(t);
  uint64_t mask = t->mask, k, end = mask;
  if (!m->seq || mask > KVIDX__TAG_MASK) return 1; /* no tags: assume so (hashing every key scanned) */
  for (k = 1; k <= end; k++) {
    uint64_t q = (i + k) & mask, v, h, d;
    if (!t->ctrl[q]) {
      if (end == mask) end = k + 15 < mask ? k + 15 : mask; /* past the first empty place, 15 more */
      continue;
    }
    if (t->ctrl[q] == KVIDX__CTRL_DELETED) continue;
    v = kvidx__ld(&w[q * m->ew + m->occ]);
    h = kvidx__home_at(ix, m, t, q, v);
    d = (q - h) & mask;
    if (((i - h) & mask) < (d & ~KVIDX__CAST(uint64_t, 15))) return 1; /* i is in 16 its probe goes past */
  }
  return 0;
}

/* Free place i (still marked used) of a table with control bytes: empty if
 * the used places around it make a row of fewer than 16, so that no 16
 * bytes a probe reads past held it used, or if no probe goes past it
 * (kvidx__ctrl_passed); else deleted, which probes go past and inserts
 * reuse.  Tables of at most 16 places: a probe's 16 bytes cover them all,
 * so always empty. */
KVIDX__HOT void kvidx__ctrl_erase(const kvidx *ix, const kvidx__map *m, kvidx__mtab *t, uint64_t i) {
  uint64_t mask = t->mask;
  unsigned before, after;
  unsigned char b = 0;
  if (mask >= 16) {
    before = kvidx__ctrl_empties(t->ctrl + ((i - 16) & mask)); /* places i-16 .. i-1 (the copy: no wrap) */
    after = kvidx__ctrl_empties(t->ctrl + i);                   /* places i .. i+15 */
    /* the row of used places around i: ctz(after) from i on, 15 - log2(before) just before it */
    if ((!before || !after || kvidx__ctz64(after) + 15 - kvidx__log2(before) >= 16) && kvidx__ctrl_passed(ix, m, t, i)) {
      b = KVIDX__CTRL_DELETED;
      t->tombs++;
    }
  }
  kvidx__ctrl_set(t->ctrl, mask, i, b);
}

#if KVIDX__CTRL
/* Probe a table with control bytes (see above); as kvidx__mtab_probe_seq. */
KVIDX__HOT uint32_t kvidx__mtab_probe_ctrl(const kvidx__mtab *t, uint64_t ew, uint64_t key, uint64_t h,
                                            uint32_t *free_at) {
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(t);
  uint64_t mask = t->mask, i = h & mask;
  const unsigned char want = KVIDX__CTRL_BYTE(h);
  uint32_t first_free = KVIDX__NONE;
  for (;;) {
    const unsigned char *g = t->ctrl + i;
    unsigned hit = kvidx__group_eq(g, want);
    unsigned empty = kvidx__group_eq(g, 0u);
    unsigned open = ~kvidx__group_used(g) & 0xFFFFu; /* empty or deleted */
    for (; hit; hit &= hit - 1) {
      uint64_t j = (i + kvidx__ctz64(hit)) & mask;
      if (kvidx__ld(&w[j * ew]) == key) return KVIDX__CAST(uint32_t, j);
    }
    if (open && first_free == KVIDX__NONE) first_free = KVIDX__CAST(uint32_t, (i + kvidx__ctz64(open)) & mask);
    if (empty) {
      if (free_at) *free_at = first_free;
      return KVIDX__NONE;
    }
    i = (i + 16) & mask; /* no empty place in these 16: the next 16 */
  }
}
#endif

/* Probe one table for key (home hash h): its place, or NONE and (free_at)
 * the free place that ended the probe. */
KVIDX__PRIV uint32_t kvidx__mtab_probe(const kvidx__map *m, const kvidx__mtab *t, const uint64_t *key, uint64_t h,
                                       uint32_t *free_at) {
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(t);
  uint64_t i, ew = m->ew, occ = m->occ;
  uint32_t k;
#if KVIDX__CTRL
  if (t->ctrl) return kvidx__mtab_probe_ctrl(t, ew, key[0], h, free_at); /* one-word keys */
#endif
  for (i = h & t->mask;; i = (i + 1) & t->mask) {
    KVIDX__A(uint64_t) *e = w + i * ew;
    if (!kvidx__ld(&e[occ])) {
      if (free_at) *free_at = KVIDX__CAST(uint32_t, i);
      return KVIDX__NONE;
    }
    if (kvidx__ld(&e[0]) != key[0]) continue; /* most places differ in the first word */
    for (k = 1; k < m->kw && kvidx__ld(&e[k]) == key[k]; k++) {}
    if (k == m->kw) return KVIDX__CAST(uint32_t, i);
  }
}

/* The same for one-word keys whose word 1 marks the place used (seq
 * tables): the shape in locals, each place's first line read once. */
KVIDX__HOT uint32_t kvidx__mtab_probe_seq(const kvidx__mtab *t, uint64_t ew, uint64_t key, uint64_t h,
                                           uint32_t *free_at) {
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(t);
  uint64_t i, mask = t->mask;
#if KVIDX__CTRL
  if (t->ctrl) return kvidx__mtab_probe_ctrl(t, ew, key, h, free_at);
#endif
  for (i = h & mask;; i = (i + 1) & mask) {
    KVIDX__A(uint64_t) *e = w + i * ew;
    if (!kvidx__ld(&e[1])) {
      if (free_at) *free_at = KVIDX__CAST(uint32_t, i);
      return KVIDX__NONE;
    }
    if (kvidx__ld(&e[0]) == key) return KVIDX__CAST(uint32_t, i);
  }
}

/* Writer: the place holding key (h = its hash), or KVIDX__NONE and
 * (free_at) where an insert would go.  Old is probed only while the key's
 * home there is unswept. */
KVIDX__PRIV uint32_t kvidx__map_slot(const kvidx__map *m, const uint64_t *key, uint64_t h, uint32_t *free_at) {
  kvidx__map *mm = KVIDX__UNC(kvidx__map *, m);
  const kvidx__mtab *o = kvidx__ld(&mm->old);
  int seq = m->kw == 1 && m->occ == 1;
  uint32_t at = seq ? kvidx__mtab_probe_seq(kvidx__ld(&mm->tab), m->ew, key[0], h, free_at)
                    : kvidx__mtab_probe(m, kvidx__ld(&mm->tab), key, h, free_at);
  if (at == KVIDX__NONE && o && ((h - m->drain_from) & o->mask) >= m->drained &&
      (at = seq ? kvidx__mtab_probe_seq(o, m->ew, key[0], h, NULL) : kvidx__mtab_probe(m, o, key, h, NULL)) !=
          KVIDX__NONE)
    at |= KVIDX__OLD;
  return at;
}

/* Writer: the place holding key, or KVIDX__NONE. */
KVIDX__PRIV uint32_t kvidx__map_find(const kvidx *ix, const kvidx__map *m, const uint64_t *key) {
  if (!m->n) return KVIDX__NONE; /* also: no table yet */
  return kvidx__map_slot(m, key, kvidx__key_hash(ix->seed, key, m->kw), NULL);
}

/* Every entry by position, both tables: the first occupied position after
 * `pos` (KVIDX__NONE: from the start), or KVIDX__NONE at the end. */
KVIDX__PRIV uint32_t kvidx__map_next(const kvidx__map *m, uint32_t pos) {
  kvidx__map *mm = KVIDX__UNC(kvidx__map *, m);
  const kvidx__mtab *t = kvidx__ld(&mm->tab), *o = kvidx__ld(&mm->old);
  uint64_t i = pos == KVIDX__NONE ? 0 : (pos & ~KVIDX__OLD) + 1;
  if (pos == KVIDX__NONE || !(pos & KVIDX__OLD)) {
    for (; t && i <= t->mask; i++)
      if (kvidx__place_used(m, t, i)) return KVIDX__CAST(uint32_t, i);
    i = 0;
  }
  for (; o && i <= o->mask; i++)
    if (kvidx__place_used(m, o, i)) return KVIDX__CAST(uint32_t, i) | KVIDX__OLD;
  return KVIDX__NONE;
}

/* Start loading the line where a probe with hash h begins (and, for a
 * deletion, whose backward shift reads on, the line after it).  Readers
 * call it too (the walk's early child probe), so the table is loaded with
 * acquire: its mask was written before the release that published it. */
KVIDX__PRIV void kvidx__map_prefetch(const kvidx__map *m, uint64_t h, int lines) {
  const kvidx__mtab *t = kvidx__ld_acq(&KVIDX__UNC(kvidx__map *, m)->tab);
  if (t) {
    KVIDX__A(uint64_t) *w = kvidx__mtab_words(t) + (h & t->mask) * m->ew;
    KVIDX__PREFETCH(w);
    if (lines > 1) KVIDX__PREFETCH(w + 8);
    if (t->ctrl) KVIDX__PREFETCH(t->ctrl + (h & t->mask));
  }
}

KVIDX__PRIV void kvidx__map_place(const kvidx *ix, const kvidx__map *m, kvidx__mtab *t, const uint64_t *e,
                                  uint32_t *at) {
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(t);
  uint64_t h = kvidx__key_hash(ix->seed, e, m->kw), i = h & t->mask;
  uint32_t k;
  while (kvidx__place_used(m, t, i)) i = (i + 1) & t->mask;
  for (k = 0; k < m->ew; k++)
    if (k != m->occ) kvidx__st(&w[i * m->ew + k], e[k]);
  kvidx__st_rel(&w[i * m->ew + m->occ], e[m->occ]); /* readers see the rest first */
  if (t->ctrl) kvidx__ctrl_fill(t, i, KVIDX__CTRL_BYTE(h));
  if (at) *at = KVIDX__CAST(uint32_t, i);
}

/* Let go of a table the map no longer uses (readers may still be in a
 * shared map's). */
KVIDX__PRIV void kvidx__map_retire(kvidx *ix, kvidx__map *m, kvidx__mtab *t) {
  if (m->shared) {
    t->retired = m->retired;
    m->retired = t;
  } else {
    kvidx__mtab_free(ix, t);
  }
}

/* Copy an entry of ew words to place j of table words tw (a seq table's
 * two straight: its address a shift, not a multiply, which cost a growth
 * microbenchmark 2.5%): a drain's or a one-pass move's. */
KVIDX__HOT void kvidx__entry_copy(KVIDX__A(uint64_t) *tw, uint64_t j, KVIDX__A(uint64_t) *from, uint64_t ew) {
  uint64_t k;
  if (ew == 2) {
    kvidx__st(&tw[2 * j], kvidx__ld(&from[0]));
    kvidx__st(&tw[2 * j + 1], kvidx__ld(&from[1]));
  } else {
    for (k = 0; k < ew; k++) kvidx__st(&tw[j * ew + k], kvidx__ld(&from[k]));
  }
}

/* Whether a drain may stop at old's free place i, leaving the places from
 * i on in old: no entry among them would then sit past a swept home.  In a
 * table without control bytes, a probe stops at the first free place, so
 * any will do.  With them, a probe goes past deleted places and, inside
 * its last 16, past empty ones: an entry's home can be before an empty
 * place at most 15 places back.  So i must be empty, and none of the 15
 * entries after it may have its home before i (a home past the entry, in
 * a table of at most 16 places, counts as before: it only drains on). */
KVIDX__PRIV int kvidx__drain_can_stop(const kvidx *ix, const kvidx__map *m, const kvidx__mtab *o, uint64_t i) {
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(o);
  uint64_t k, mask = o->mask;
  if (!o->ctrl) return 1;
  if (o->ctrl[i] != 0) return 0;
  for (k = 1; k < 16 && k <= mask; k++) {
    uint64_t q = (i + k) & mask;
    if (KVIDX__CTRL_USED(o->ctrl[q]) && ((q - kvidx__home_at(ix, m, o, q, kvidx__ld(&w[q * m->ew + m->occ]))) & mask) > k)
      return 0; /* its home is before i */
  }
  return 1;
}

/* Writer: move old's entries into tab, sweeping at least `budget` places,
 * then on to the next free place where it may stop (see the picture
 * above). */
KVIDX__PRIV void kvidx__map_drain(kvidx *ix, kvidx__map *m, uint64_t budget) {
  kvidx__mtab *o = kvidx__ld(&m->old), *t = kvidx__ld(&m->tab);
  KVIDX__A(uint64_t) *w, *tw;
  uint64_t size, e[8], at, end, stop, ew = m->ew, occ = m->occ, omask, tmask;
  uint32_t k;
  if (!o) return;
  w = kvidx__mtab_words(o);
  tw = kvidx__mtab_words(t);
  size = o->mask + 1;
  omask = o->mask;
  tmask = t->mask;
  if (m->shared) {
    kvidx__st(&m->moves, kvidx__ld(&m->moves) + 1);
    kvidx__fence_rel();
  }
  at = m->drained;
  end = m->drain_from;
  stop = size - at < budget ? size : at + budget; /* then on to the next free place */
#if KVIDX__CTRL
  if (o->ctrl) {
    /* A table with control bytes (one-word keys, no reader: the seq
     * tables, the holdings), 16 places at a time while the budget lasts:
     * old's bytes say which are used, and only those are read and moved (a
     * branch per group, not per place); then place by place on to where
     * the sweep may stop.  An entry's home comes from its tag (seq tables
     * of at most 2^16 places) or its key, its byte from old.  The free
     * place in tab is found byte by byte: a 16-byte load of bytes this loop
     * has just stored waits for them (no store forwarding), which cost more
     * than the branches it saves.  Old's words are left as they are
     * (kvidx__place_used).  Seq-table drain 22 -> 14 cycles a place (W16
     * C16384 0.93x-0.95x the time), holdings 43 -> 29 (session 30). */
    uint64_t seed = ix->seed; /* locals: the atomics below pin fields in memory */
    int tagged = m->seq && tmask <= KVIDX__TAG_MASK;
    while (at < size) {
      uint64_t xi = (end + at) & omask;
      unsigned used = 1;
      if (at + 16 <= stop) {
        used = kvidx__group_used(o->ctrl + xi);
        at += 16;
      } else if (KVIDX__CTRL_USED(o->ctrl[xi])) {
        at++;
      } else if (at >= stop && kvidx__drain_can_stop(ix, m, o, xi)) {
        break;
      } else {
        at++;
        continue;
      }
      for (; used; used &= used - 1) {
        uint64_t q = (xi + kvidx__ctz64(used)) & omask, j;
        KVIDX__A(uint64_t) *x = w + q * ew;
        j = KVIDX__HOME(tagged, kvidx__ld(&x[1]), kvidx__ld(&x[0]), seed, tmask);
        while (KVIDX__CTRL_USED(t->ctrl[j])) j = (j + 1) & tmask;
        kvidx__entry_copy(tw, j, x, ew);
        kvidx__ctrl_fill(t, j, o->ctrl[q]);
        kvidx__ctrl_set(o->ctrl, omask, q, 0);
      }
    }
  } else
#endif
  if (ew == 2 && m->kw == 1 && occ == 1 && !m->shared) {
    /* seq tables without control bytes, straight.  No branch on whether a
     * place is used while the budget lasts (the loop waits on branches, not
     * memory): a free place's "move" goes to a stand-in that stays free
     * (W16 C16384's events 0.92x-0.94x the time, before the control
     * bytes). */
    uint64_t seed = ix->seed;
    int tagged = m->seq && tmask <= KVIDX__TAG_MASK;
    KVIDX__A(uint64_t) spare[2], *p;
    kvidx__st(&spare[1], KVIDX__CAST(uint64_t, 0));
    for (; at < size; at++) {
      uint64_t xi = (end + at) & omask;
      KVIDX__A(uint64_t) *x = w + 2 * xi;
      uint64_t v = kvidx__ld(&x[1]), k0 = kvidx__ld(&x[0]), j;
      if (at >= stop && !v && kvidx__drain_can_stop(ix, m, o, xi)) break;
      j = KVIDX__HOME(tagged, v, k0, seed, tmask);
      for (p = v ? tw + 2 * j : spare; kvidx__ld(&p[1]); p = tw + 2 * j) j = (j + 1) & tmask;
      kvidx__st(&p[0], k0);
      kvidx__st(&p[1], v);
      kvidx__st(&x[1], KVIDX__CAST(uint64_t, 0));
    }
  } else {
    for (; at < size; at++) {
      KVIDX__A(uint64_t) *x = w + ((end + at) & omask) * ew;
      if (kvidx__ld(&x[occ])) {
        for (k = 0; k < ew; k++) e[k] = kvidx__ld(&x[k]);
        kvidx__map_place(ix, m, t, e, NULL);
        kvidx__st(&x[occ], KVIDX__CAST(uint64_t, 0));
        if (m->shared) KVIDX_TEST_HOOK(ix, 9); /* an entry between the tables */
      } else if (at >= stop && kvidx__drain_can_stop(ix, m, o, (end + at) & omask)) {
        break;
      }
    }
  }
  m->drained = at;
  if (at == size) {
    kvidx__st_rel(&m->old, KVIDX__CAST(kvidx__mtab *, NULL));
    kvidx__map_retire(ix, m, o);
  }
  if (m->shared) kvidx__st_rel(&m->moves, kvidx__ld(&m->moves) + 1);
}

/* Writer: finish a growth (before walking a whole table by position). */
KVIDX__PRIV void kvidx__map_settle(kvidx *ix, kvidx__map *m) { kvidx__map_drain(ix, m, ~KVIDX__CAST(uint64_t, 0)); }

/* Zero up to `budget` more bytes of the next table; 1 when it is all zero. */
KVIDX__PRIV int kvidx__map_zero(kvidx__map *m, uint64_t budget) {
  kvidx__mtab *nt = m->next;
  uint64_t all = nt->bytes, k = all - m->zeroed < budget ? all - m->zeroed : budget;
  memset(KVIDX__RCAST(unsigned char *, kvidx__mtab_words(nt)) + m->zeroed, 0, KVIDX__CAST(size_t, k));
  m->zeroed += k;
  return m->zeroed == all;
}

#if KVIDX__CTRL
/* The one-pass move's loop over t's used places (kvidx__map_rehash_all).
 * nt's bitmap is read and written through one word per half of nt held in
 * a local: the entries arrive in old's order, so each half's homes climb
 * and a word stays in use for about 64 places (the bitmap in memory made
 * each placement wait for the last one's store).  Inline, so the two-word
 * tagged case (a seq table without eviction keys) is compiled with its
 * constants. */
KVIDX__HOT void kvidx__rehash_loop(const kvidx__mtab *t, kvidx__mtab *nt, uint64_t *bits, uint64_t from, uint64_t ew,
                                   int tagged, uint64_t seed) {
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(t), *tw = kvidx__mtab_words(nt);
  uint64_t size = t->mask + 1, tmask = nt->mask, words = (tmask + 1) / 64, at;
  unsigned half = words > 1 ? kvidx__log2(words) - 1 : 1; /* word i is in half i >> half */
  uint64_t word_at[2], word[2];
  word_at[0] = 0, word_at[1] = words / 2, word[0] = word[1] = 0; /* the bitmap starts zeroed */
  for (at = 0; at < size; at += 16) { /* from a free place, as a drain sweeps: rows keep their order */
    uint64_t xi = (from + at) & t->mask;
    unsigned used = kvidx__group_used(t->ctrl + xi);
    if (at + 16 > size) used &= (1u << (size - at)) - 1; /* a table of 8 places: not twice */
    for (; used; used &= used - 1) {
      uint64_t q = (xi + kvidx__ctz64(used)) & t->mask, j, f, hi;
      KVIDX__A(uint64_t) *x = w + q * ew;
      j = KVIDX__HOME(tagged, kvidx__ld(&x[1]), kvidx__ld(&x[0]), seed, tmask);
      for (;;) {
        uint64_t wi = j >> 6;
        hi = wi >> half;
        if (wi != word_at[hi]) { /* this half moves to another word: keep the one it leaves */
          bits[word_at[hi]] = word[hi];
          word[hi] = bits[word_at[hi] = wi];
        }
        if ((f = ~word[hi] >> (j & 63)) != 0) break;
        j = ((j | 63) + 1) & tmask; /* this word full: the next */
      }
      j += kvidx__ctz64(f);
      word[hi] |= KVIDX__CAST(uint64_t, 1) << (j & 63); /* j stayed in word hi's word */
      kvidx__entry_copy(tw, j, x, ew);
      kvidx__ctrl_set(nt->ctrl, tmask, j, t->ctrl[q]);
    }
  }
}

/* Move every entry of t into the empty table nt at once: a map no reader
 * probes, both tables with control bytes, nt of at least 64 places whose
 * entries take at most KVIDX_TEST_BULK_MAX bytes (512 KiB: the call also
 * takes the page faults of nt's fresh memory, all of them).  0 if the
 * scratch bitmap could not be had (then the drain moves them as for
 * larger tables).  nt's used places are kept as bits, so the free place
 * at or after an entry's home is a shift and a bit scan of one word, not
 * a loop over bytes; old's bytes need no clearing (the table goes) and
 * nt has no deleted places.  W16 C16384's events 0.93x-0.95x the time
 * (session 31). */
KVIDX__PRIV int kvidx__map_rehash_all(kvidx *ix, kvidx__map *m, kvidx__mtab *t, kvidx__mtab *nt, uint64_t from) {
  size_t nb = KVIDX__CAST(size_t, (nt->mask + 64) / 64) * sizeof(uint64_t);
  uint64_t *bits = KVIDX__CAST(uint64_t *, kvidx__alloc(ix, nb));
  int tagged = m->seq && nt->mask <= KVIDX__TAG_MASK;
  if (!bits) return 0;
  memset(bits, 0, nb);
  if (m->ew == 2 && tagged) kvidx__rehash_loop(t, nt, bits, from, 2, 1, 0);
  else kvidx__rehash_loop(t, nt, bits, from, m->ew, tagged, ix->seed);
  kvidx__free(ix, bits, nb);
  return 1;
}
#endif

/* Make the zeroed table nt the one inserts go to; the current one (if any)
 * becomes old and drains from now on, or (a small table with control
 * bytes) moves into it at once. */
KVIDX__PRIV void kvidx__map_switch(kvidx *ix, kvidx__map *m, kvidx__mtab *nt, uint64_t step) {
  kvidx__mtab *t = kvidx__ld(&m->tab);
  uint64_t i = 0;
  if (t) /* the sweep starts after a free place (there is one: load <= 3/4) */
    while (kvidx__place_used(m, t, i)) i++;
#if KVIDX__CTRL
  if (t && !m->shared && t->ctrl && nt->ctrl && nt->mask >= 63 && nt->bytes <= KVIDX_TEST_BULK_MAX &&
      kvidx__map_rehash_all(ix, m, t, nt, i)) {
    kvidx__st_rel(&m->tab, nt);
    kvidx__map_retire(ix, m, t);
    return;
  }
#endif
  if (t) {
    m->drain_from = i;
    m->drained = 0;
    kvidx__st_rel(&m->old, t); /* before tab: a reader that sees the new tab sees old */
  }
  kvidx__st_rel(&m->tab, nt);
  if (t) kvidx__map_drain(ix, m, step);
}

/* Places for `entries` at most 3/4 full: `from` doubled as often as needed. */
KVIDX__PRIV uint64_t kvidx__map_slots_for(uint64_t entries, uint64_t from) {
  while (entries * 4 > from * 3) from *= 2;
  return from;
}

/* A table of `slots` places for map m, its entries zeroed if `zeroed`;
 * with control bytes (always zeroed) if kvidx__ctrl_wanted, and then its
 * entries never are (kvidx__place_used). */
KVIDX__PRIV kvidx__mtab *kvidx__mtab_new(kvidx *ix, const kvidx__map *m, uint64_t slots, int zeroed) {
  size_t bytes = KVIDX__CAST(size_t, kvidx__mtab_bytes(slots, m->ew));
  kvidx__mtab *t = KVIDX__CAST(kvidx__mtab *, kvidx__alloc(ix, sizeof(kvidx__mtab)));
  void *w;
  if (!t) return NULL;
  t->ctrl = NULL;
  t->tombs = 0;
  if (kvidx__ctrl_wanted(ix, m) &&
      !(t->ctrl = KVIDX__CAST(unsigned char *, kvidx__alloc_zeroed(ix, KVIDX__CTRL_SIZE(slots))))) {
    kvidx__free(ix, t, sizeof *t);
    return NULL;
  }
  if (!(w = zeroed && !t->ctrl ? kvidx__alloc_zeroed(ix, bytes) : kvidx__alloc(ix, bytes))) { /* kvidx__place_used */
    if (t->ctrl) kvidx__free(ix, t->ctrl, KVIDX__CTRL_SIZE(slots));
    kvidx__free(ix, t, sizeof *t);
    return NULL;
  }
  t->words = KVIDX__CAST(KVIDX__A(uint64_t) *, w);
  t->mask = slots - 1;
  t->bytes = bytes;
  t->retired = NULL;
  return t;
}

/* Room for `extra` more entries, at most 3/4 full.  Growth is spread over
 * the reservations: past 11/16 full, a table of twice the size is allocated
 * and zeroed a share per reservation (twice the pace it needs; a table
 * with control bytes needs none), then takes the inserts while the old one
 * drains (see above).  Small tables and a
 * reservation that outgrows all that are done at once; so is every growth
 * in caller-buffer mode, whose size bound counts one growing table at a
 * time (spread growth would keep many workers' tables doubled at once).
 * There the shared maps never grow: kvidx_init_buffer makes them at their
 * largest.  A reservation asks for no more than the map's bound (m->most):
 * a store of n blocks reserves n, most of which are rarely new. */
KVIDX__PRIV int kvidx__map_reserve_slow(kvidx *ix, kvidx__map *m, uint64_t extra, uint64_t over) {
  kvidx__mtab *t = kvidx__ld(&m->tab), *nt;
  uint64_t need = m->n + extra, slots = t ? t->mask + 1 : 0, ns, step = kvidx__drain_step(m, extra);
  if (m->most && need > m->most) need = m->most; /* a store asks for n; far fewer can be new */
  need += over;
  if (kvidx__ld(&m->old)) kvidx__map_drain(ix, m, step);
  if (m->next && kvidx__map_zero(m, step * 32 * m->ew) && !kvidx__ld(&m->old)) {
    kvidx__map_switch(ix, m, m->next, step);
    m->next = NULL;
    t = kvidx__ld(&m->tab);
    slots = t->mask + 1;
  }
  if ((need + (t ? t->tombs : 0)) * 4 <= slots * 3) { /* deleted places fill it too: then rebuilt */
    if (!ix->buffer_mode && !m->next && !kvidx__ld(&m->old) && need * 16 > slots * 11 &&
        kvidx__mtab_bytes(slots, m->ew) >= KVIDX_TEST_DRAIN_STEP * 1024u && 2 * slots <= KVIDX__MAP_SLOTS_MAX &&
        kvidx__mtab_bytes(2 * slots, m->ew) <= KVIDX__SIZE_MAX &&
        (m->next = kvidx__mtab_new(ix, m, 2 * slots, 0)) != NULL) { /* may fail: tried again later */
      m->zeroed = m->next->ctrl ? m->next->bytes : 0; /* with control bytes: nothing (kvidx__place_used) */
      kvidx__map_zero(m, step * 32 * m->ew);
    }
    return KVIDX_OK;
  }
  if (need > KVIDX__ID_LIMIT) return KVIDX_EFULL;
  ns = kvidx__map_slots_for(need, slots ? slots : 8);
  if (ns > KVIDX__MAP_SLOTS_MAX) return KVIDX_EFULL;
  if (kvidx__mtab_bytes(ns, m->ew) > KVIDX__SIZE_MAX) return kvidx__oom(ix); /* a 32-bit address space */
  kvidx__map_settle(ix, m); /* at most two tables at once */
  if (m->next && m->next->mask + 1 >= ns) {
    kvidx__map_zero(m, ~KVIDX__CAST(uint64_t, 0));
    nt = m->next;
  } else {
    if (m->next) kvidx__mtab_free(ix, m->next);
    m->next = NULL;
    if ((nt = kvidx__mtab_new(ix, m, ns, 1)) == NULL) return kvidx__oom(ix);
  }
  m->next = NULL;
  kvidx__map_switch(ix, m, nt, ix->buffer_mode ? ~KVIDX__CAST(uint64_t, 0) : step);
  return KVIDX_OK;
}

/* Room for `extra` more entries, and `over` more places past the map's
 * bound (m->most): deletions to come before the inserts, whose places stay
 * deleted (control bytes) while the bound caps only the entries (with
 * eviction a store's prune deletes holdings after its reservation; a move
 * of a run's rest deletes the holdings of holders that leave the run).
 * Most calls (every store reserves in five maps) find a table under 11/16
 * full with no growth under way, where the slow path would do nothing:
 * that test inline (W16 C16384's store path 2.6% fewer instructions).  A
 * drain or a next table's zeroing under way goes on in the slow path at
 * every call (t_grow_drains); a request past KVIDX__ID_LIMIT, which the
 * slow path refuses, would wrap the product. */
KVIDX__HOT int kvidx__map_reserve_over(kvidx *ix, kvidx__map *m, uint64_t extra, uint64_t over) {
  kvidx__mtab *t = kvidx__ld(&m->tab);
  if (t && !m->next && !kvidx__ld(&m->old) && extra <= KVIDX__ID_LIMIT && over <= KVIDX__ID_LIMIT &&
      (m->n + extra + over + t->tombs) * 16 <= (t->mask + 1) * 11)
    return KVIDX_OK;
  return kvidx__map_reserve_slow(ix, m, extra, over);
}
KVIDX__HOT int kvidx__map_reserve(kvidx *ix, kvidx__map *m, uint64_t extra) {
  return kvidx__map_reserve_over(ix, m, extra, 0);
}

/* Writer, after deletions from a map no reader probes (a worker's seq
 * table): a drain under way goes on by `budget` places; a table at most
 * 1/8 full is replaced by one at most 3/8 full (at least halved) that
 * drains like a growth, so a worker that let go of most of its blocks
 * stops paying for its peak; a seq table keeps cfg.blocks_per_worker's
 * room (kvidx__seq_reserve_new).  No memory: the table stays, nothing
 * fails. */
KVIDX__PRIV void kvidx__map_tidy(kvidx *ix, kvidx__map *m, uint64_t budget) {
  kvidx__mtab *t = kvidx__ld(&m->tab), *nt;
  uint64_t room = m->seq ? ix->seq_room : 0;
  if (kvidx__ld(&m->old)) {
    kvidx__map_drain(ix, m, budget);
    return;
  }
  /* a table of T places (a power of two past 8) is no larger than `room`
   * entries need exactly when T / 2 places are too few: room * 4 > T / 2 * 3 */
  if (m->shared || !t || t->mask + 1 <= KVIDX_TEST_SHRINK_MIN || KVIDX__CAST(uint64_t, m->n) * 8 >= t->mask + 1 ||
      room * 8 > (t->mask + 1) * 3)
    return;
  if (m->next) { /* a growth being prepared: not needed now */
    kvidx__mtab_free(ix, m->next);
    m->next = NULL;
  }
  /* at least half, and room for cfg.blocks_per_worker */
  if ((nt = kvidx__mtab_new(ix, m, kvidx__map_slots_for(room, kvidx__map_slots_for(2 * KVIDX__CAST(uint64_t, m->n), 8)),
                            1)) != NULL)
    kvidx__map_switch(ix, m, nt, ix->buffer_mode ? ~KVIDX__CAST(uint64_t, 0) : budget);
}

/* A new worker's seq table, before anything of its first store changes:
 * room for that store, or for cfg.blocks_per_worker where that is more (the
 * table then never grows on the way there: W16 C16384's replay 0.85x the
 * time).  The larger table is a wish: when it cannot be had, the store's
 * own room does. */
KVIDX__PRIV int kvidx__seq_reserve_new(kvidx *ix, kvidx__map *m, uint64_t n) {
  if (ix->seq_room > n && kvidx__map_reserve(ix, m, ix->seq_room) == KVIDX_OK) return KVIDX_OK;
  return kvidx__map_reserve(ix, m, n);
}

/* Insert an entry whose key is absent; room was reserved. */
KVIDX__PRIV uint32_t kvidx__map_insert(kvidx *ix, kvidx__map *m, const uint64_t *e) {
  uint32_t at;
  kvidx__map_place(ix, m, kvidx__ld(&m->tab), e, &at);
  m->n++;
  return at;
}

/* Insert at the free place kvidx__map_slot found (nothing changed since);
 * h: the key's hash. */
KVIDX__PRIV void kvidx__map_put_at(kvidx__map *m, uint32_t at, const uint64_t *e, uint64_t h) {
  KVIDX__A(uint64_t) *w = kvidx__map_at(m, at);
  kvidx__mtab *t = kvidx__map_tab_of(m, at);
  uint32_t k;
  for (k = 0; k < m->ew; k++)
    if (k != m->occ) kvidx__st(&w[k], e[k]);
  kvidx__st_rel(&w[m->occ], e[m->occ]);
  if (t->ctrl) kvidx__ctrl_fill(t, at & ~KVIDX__OLD, KVIDX__CTRL_BYTE(h));
  m->n++;
}

/* Backward-shift deletion in a table of two-word entries whose word 1 marks
 * a place used (and no control bytes), the place i just emptied: later
 * entries of its cluster whose home is not in (i, j] move back.  The home
 * comes from an entry's tag in a seq table of at most 2^16 places (tagged),
 * else from hashing its key. */
KVIDX__HOT void kvidx__shift_back2(KVIDX__A(uint64_t) *w, uint64_t i, uint64_t mask, uint64_t seed, int tagged) {
  uint64_t j, v;
  for (j = (i + 1) & mask; (v = kvidx__ld(&w[2 * j + 1])) != 0; j = (j + 1) & mask) {
    uint64_t h = KVIDX__HOME(tagged, v, kvidx__ld(&w[2 * j]), seed, mask);
    if (((j - h) & mask) >= ((j - i) & mask)) { /* j's home is not in (i, j]: move it back */
      kvidx__st(&w[2 * i], kvidx__ld(&w[2 * j]));
      kvidx__st(&w[2 * i + 1], v);
      kvidx__st(&w[2 * j + 1], KVIDX__CAST(uint64_t, 0));
      i = j;
    }
  }
}

KVIDX__PRIV void kvidx__map_delete(kvidx *ix, kvidx__map *m, uint32_t at) {
  kvidx__mtab *t = kvidx__map_tab_of(m, at);
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(t);
  uint64_t i = at & ~KVIDX__OLD, j, mask = t->mask, ew = m->ew, occ = m->occ, seed = ix->seed;
  uint32_t k, kw = m->kw;
  int shared = m->shared; /* locals: the atomics below pin fields in memory */
  if (shared) {
    kvidx__st(&m->moves, kvidx__ld(&m->moves) + 1);
    kvidx__fence_rel();
  }
  kvidx__st(&w[i * ew + occ], KVIDX__CAST(uint64_t, 0));
  if (t->ctrl) { /* no shift (see the control bytes above) */
    kvidx__ctrl_erase(ix, m, t, i);
  } else if (ew == 2 && kw == 1 && occ == 1 && !shared) { /* seq tables: the common case, straight */
    kvidx__shift_back2(w, i, mask, seed, m->seq && mask <= KVIDX__TAG_MASK);
  } else {
    for (j = (i + 1) & mask; kvidx__ld(&w[j * ew + occ]); j = (j + 1) & mask) {
      uint64_t key[2], h;
      key[0] = kvidx__ld(&w[j * ew]);
      if (kw > 1) key[1] = kvidx__ld(&w[j * ew + 1]);
      h = kvidx__key_hash(seed, key, kw) & mask;
      if (shared) KVIDX_TEST_HOOK(ix, 5); /* a deletion shifting entries */
      if (((j - h) & mask) >= ((j - i) & mask)) { /* j's home is not in (i, j]: move it back */
        for (k = 0; k < ew; k++) kvidx__st(&w[i * ew + k], kvidx__ld(&w[j * ew + k]));
        kvidx__st(&w[j * ew + occ], KVIDX__CAST(uint64_t, 0));
        i = j;
      }
    }
  }
  m->n--;
  if (shared) kvidx__st_rel(&m->moves, kvidx__ld(&m->moves) + 1);
}

/* Writer: a worker's seq table as a store's pass 1 or a removal's loop
 * sees it.  Nothing grows or moves the table before such a call ends (a
 * store reserved first; removals only shift entries), so its words, mask
 * and stride are taken once. */
typedef struct {
  kvidx__map *m;
  kvidx__mtab *t;
  KVIDX__A(uint64_t) *w;
  uint64_t mask, ew;
  int draining; /* a growth drains: probes and puts go through the map's code */
} kvidx__seqview;

KVIDX__HOT void kvidx__seqview_of(kvidx__seqview *v, kvidx__map *m) {
  v->m = m;
  v->t = kvidx__ld(&m->tab);
  v->w = kvidx__mtab_words(v->t);
  v->mask = v->t->mask;
  v->ew = m->ew;
  v->draining = kvidx__ld(&m->old) != NULL;
}

/* The line where the probe for hash h starts (and the next one). */
KVIDX__HOT void kvidx__seqview_prefetch(const kvidx__seqview *v, uint64_t h, int lines) {
  KVIDX__A(uint64_t) *w = v->w + (h & v->mask) * v->ew;
  KVIDX__PREFETCH(w);
  if (lines > 1) KVIDX__PREFETCH(w + 8);
  if (v->t->ctrl) KVIDX__PREFETCH(v->t->ctrl + (h & v->mask));
}

/* The place holding seq (hash h), or KVIDX__NONE and (free_at) where an
 * insert would go. */
KVIDX__HOT uint32_t kvidx__seqview_find(const kvidx__seqview *v, uint64_t seq, uint64_t h, uint32_t *free_at) {
  return v->draining ? kvidx__map_slot(v->m, &seq, h, free_at) : kvidx__mtab_probe_seq(v->t, v->ew, seq, h, free_at);
}

/* Writer: delete a seq table's entry at `at`: the two-word entries of an
 * index without eviction in the table inserts go to, straight; others as
 * any map's. */
KVIDX__HOT void kvidx__seq_delete(kvidx *ix, kvidx__map *m, uint32_t at) {
  kvidx__mtab *t = kvidx__ld(&m->tab);
  KVIDX__A(uint64_t) *w = kvidx__mtab_words(t);
  if (m->ew != 2 || (at & KVIDX__OLD) || !m->seq) {
    kvidx__map_delete(ix, m, at);
    return;
  }
  kvidx__st(&w[2 * KVIDX__CAST(uint64_t, at) + 1], KVIDX__CAST(uint64_t, 0));
  if (t->ctrl) kvidx__ctrl_erase(ix, m, t, at);
  else kvidx__shift_back2(w, at, t->mask, ix->seed, t->mask <= KVIDX__TAG_MASK);
  m->n--;
}

KVIDX__PRIV void kvidx__map_move(kvidx__map *dst, kvidx__map *src) { /* src was never shared nor grown */
  kvidx__map_init(dst, src->ew, src->kw, src->occ, src->shared);
  dst->seq = src->seq;
  kvidx__st(&dst->tab, kvidx__ld(&src->tab));
  dst->n = src->n;
  kvidx__st(&src->tab, KVIDX__CAST(kvidx__mtab *, NULL));
  src->n = 0;
}

KVIDX__PRIV void kvidx__map_drop(kvidx *ix, kvidx__map *m) {
  kvidx__mtab *t = kvidx__ld(&m->tab), *o = kvidx__ld(&m->old);
  if (t) kvidx__mtab_free(ix, t);
  if (o) kvidx__mtab_free(ix, o);
  if (m->next) kvidx__mtab_free(ix, m->next);
  m->next = NULL;
  while (m->retired) {
    kvidx__mtab *r = m->retired;
    m->retired = r->retired;
    kvidx__mtab_free(ix, r);
  }
  kvidx__st(&m->tab, KVIDX__CAST(kvidx__mtab *, NULL));
  kvidx__st(&m->old, KVIDX__CAST(kvidx__mtab *, NULL));
  m->n = 0;
}


/* ---- results: keep the best `cap` scores without allocating ------------- */
/* The sink fills kvidx_score or kvidx_tier_score arrays (esz says which);
 * both start with the same three fields, which is all the ordering reads. */
#define KVIDX__SORT_BUF (KVIDX_WORKERS_MAX < 512 ? KVIDX_WORKERS_MAX : 512) /* results never exceed max_workers */
#define KVIDX__NO_ORDER 0xFFFFFFFFu
typedef struct {
  unsigned char *out;
  size_t esz, cap, n, total;
  int heap;
  int ordered;    /* every score so far came with its slot's order hint */
  int grouped;    /* 2: came in final order (kvidx__stopped); 1: nearly
                     (order hints changed or stale); 0: in any order    */
  uint64_t gen;   /* slot generation when the query started */
  uint16_t order[KVIDX__SORT_BUF]; /* the hints, by place in out */
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

/* Store a score at place i (a plain copy for the common kvidx_score). */
KVIDX__PRIV void kvidx__sink_put(kvidx__sink *k, size_t i, const kvidx_tier_score *sc) {
  if (k->esz == sizeof(kvidx_score)) {
    kvidx_score *d = KVIDX__SC(k, i);
    d->worker_id = sc->worker_id;
    d->dp_rank = sc->dp_rank;
    d->depth = sc->depth;
  } else {
    memcpy(KVIDX__SC(k, i), sc, k->esz);
  }
}

/* A depth as a score holds it (saturated, never wrapped). */
KVIDX__HOT uint32_t kvidx__depth32(size_t depth) {
  return depth > 0xFFFFFFFFu ? 0xFFFFFFFFu : KVIDX__CAST(uint32_t, depth);
}

/* The score about to go to place k->n came with this order hint. */
KVIDX__HOT void kvidx__sink_note_order(kvidx__sink *k, uint32_t order) {
  if (k->n >= KVIDX__SORT_BUF || order > 0xFFFFu) k->ordered = 0;
  else k->order[k->n] = KVIDX__CAST(uint16_t, order);
}

/* The rest of kvidx__sink_push (below): tier scores, a full sink (keep the
 * best cap). */
KVIDX__PRIV void kvidx__sink_push_slow(kvidx__sink *k, uint64_t id, uint32_t rank, size_t depth, uint32_t dev,
                                       uint32_t order) {
  kvidx_tier_score sc;
  k->total++;
  if (!k->cap) return;
  memset(&sc, 0, sizeof sc);
  sc.worker_id = id;
  sc.dp_rank = rank;
  sc.depth = kvidx__depth32(depth);
  sc.device_blocks = dev;
  if (k->n < k->cap) {
    kvidx__sink_note_order(k, order);
    kvidx__sink_put(k, k->n++, &sc);
    return;
  }
  k->ordered = k->grouped = 0; /* the heap moves scores around */
  if (!k->heap) {
    size_t i = k->n / 2;
    while (i--) kvidx__sift(k, i);
    k->heap = 1;
  }
  if (kvidx__score_before(KVIDX__RCAST(kvidx_score *, &sc), KVIDX__SC(k, 0))) {
    kvidx__sink_put(k, 0, &sc);
    kvidx__sift(k, 0);
  }
}

/* One score into the sink; order: the slot's order hint, or KVIDX__NO_ORDER.
 * The common case (room left, plain scores) stays inline in the walk. */
KVIDX__HOT void kvidx__sink_push(kvidx__sink *k, uint64_t id, uint32_t rank, size_t depth, uint32_t dev,
                                 uint32_t order) {
  if (k->n < k->cap && k->esz == sizeof(kvidx_score)) {
    kvidx_score *d = KVIDX__SC(k, k->n);
    d->worker_id = id;
    d->dp_rank = rank;
    d->depth = kvidx__depth32(depth);
    kvidx__sink_note_order(k, order);
    k->n++;
    k->total++;
    return;
  }
  kvidx__sink_push_slow(k, id, rank, depth, dev, order);
}

/* Sort plain scores by comparison (answers whose hints are stale or
 * missing): insertion sort for a few, else a bottom-up merge sort
 * through a stack buffer (up to 512), else a heap sort: no qsort callbacks
 * on the query path (a fleet of 256 workers sorts hundreds per query). */
KVIDX__PRIV void kvidx__score_sort(kvidx_score *a, size_t n) {
  kvidx_score buf[KVIDX__SORT_BUF], t, *src = a, *dst = buf, *sw;
  size_t i, j, w;
  if (n <= 16) {
    for (i = 1; i < n; i++) {
      t = a[i];
      for (j = i; j > 0 && kvidx__score_before(&t, &a[j - 1]); j--) a[j] = a[j - 1];
      a[j] = t;
    }
    return;
  }
  if (n > KVIDX__SORT_BUF) { /* heap sort: max-heap on "sorts last" */
    size_t end;
    for (i = n / 2; i-- > 0;)
      for (j = i; 2 * j + 1 < n;) {
        size_t c = 2 * j + 1;
        if (c + 1 < n && kvidx__score_before(&a[c], &a[c + 1])) c++;
        if (!kvidx__score_before(&a[j], &a[c])) break;
        t = a[j], a[j] = a[c], a[c] = t, j = c;
      }
    for (end = n - 1; end > 0; end--) {
      t = a[0], a[0] = a[end], a[end] = t;
      for (j = 0; 2 * j + 1 < end;) {
        size_t c = 2 * j + 1;
        if (c + 1 < end && kvidx__score_before(&a[c], &a[c + 1])) c++;
        if (!kvidx__score_before(&a[j], &a[c])) break;
        t = a[j], a[j] = a[c], a[c] = t, j = c;
      }
    }
    return;
  }
  for (w = 1; w < n; w *= 2) {
    for (i = 0; i < n; i += 2 * w) {
      size_t l = i, m = i + w < n ? i + w : n, r = i + 2 * w < n ? i + 2 * w : n, o = i, x = l, y = m;
      while (x < m && y < r) dst[o++] = kvidx__score_before(&src[y], &src[x]) ? src[y++] : src[x++];
      while (x < m) dst[o++] = src[x++];
      while (y < r) dst[o++] = src[y++];
    }
    sw = src, src = dst, dst = sw;
  }
  if (src != a) memcpy(a, src, n * sizeof *a);
}

/* Put plain scores in order by their slots' order hints instead of
 * comparing them: per depth (at most 8 distinct, deepest first), the hints
 * mark a bitmap that is read back in order.  A fleet's usual answer is many
 * workers at one or two depths, where this costs about half of the merge
 * sort (measured: 64 scores at one depth 240 vs 515 ns).  Hints may be stale
 * (a worker came or went during the query): a repeated hint or an order the
 * final pass finds wrong returns 0, and the caller sorts by comparison. */
KVIDX__PRIV int kvidx__score_place(kvidx_score *a, size_t n, const uint16_t *order) {
  uint64_t bits[KVIDX__NW_MAX];
  uint16_t at[KVIDX_WORKERS_MAX];
  kvidx_score placed[KVIDX__SORT_BUF];
  uint32_t depths[8], d;
  size_t nd = 0, i, j, g, o = 0, words;
  unsigned top = 0;
  for (i = 0; i < n; i++) {
    for (j = 0; j < nd && depths[j] != a[i].depth; j++) {}
    if (j == nd) {
      if (nd == 8) return 0;
      depths[nd++] = a[i].depth;
    }
    if (order[i] > top) top = order[i];
  }
  if (top >= KVIDX_WORKERS_MAX) return 0;
  for (i = 1; i < nd; i++) { /* deepest first */
    d = depths[i];
    for (j = i; j > 0 && depths[j - 1] < d; j--) depths[j] = depths[j - 1];
    depths[j] = d;
  }
  words = top / 64 + 1;
  memset(bits, 0, words * sizeof bits[0]);
  for (g = 0; g < nd; g++) {
    for (i = 0; i < n; i++) {
      uint64_t bit = KVIDX__CAST(uint64_t, 1) << (order[i] & 63);
      if (a[i].depth != depths[g]) continue;
      if (bits[order[i] >> 6] & bit) return 0; /* two scores, one hint: stale */
      bits[order[i] >> 6] |= bit;
      at[order[i]] = KVIDX__CAST(uint16_t, i);
    }
    for (j = 0; j < words; j++)
      for (; bits[j]; bits[j] &= bits[j] - 1) placed[o++] = a[at[j * 64 + kvidx__ctz64(bits[j])]];
  }
  for (i = 1; i < n; i++)
    if (!kvidx__score_before(&placed[i - 1], &placed[i])) return 0;
  memcpy(a, placed, n * sizeof *a);
  return 1;
}

/* Put the scores in final order.  The walk's need nothing when the order
 * hints held (kvidx__stopped): a fleet's answer took a quarter of W16
 * C2048's query time to sort.  Nearly ordered ones (hints that changed
 * during the query) get an insertion sort: O(n + pairs out of order), and
 * small code, which a rare path needs (session 28's sorting network, run
 * cold there, cost a query 800-1,000 cycles).  Others (fleets of more than
 * 64 slots, a full sink): plain scores by their order hints, checked, else
 * by comparison. */
KVIDX__PRIV size_t kvidx__sink_finish(kvidx__sink *k) {
  size_t i, j;
  if (k->n < 2 || k->grouped == 2) return k->total; /* also: no output array at all (cap 0) */
  if (k->grouped == 1) {
    for (i = 1; i < k->n; i++)
      for (j = i; j > 0 && kvidx__score_before(KVIDX__SC(k, j), KVIDX__SC(k, j - 1)); j--) kvidx__sink_swap(k, j, j - 1);
  } else if (k->esz != sizeof(kvidx_score)) {
    qsort(k->out, k->n, k->esz, kvidx__score_cmp);
  } else if (!k->ordered || !kvidx__score_place(KVIDX__SC(k, 0), k->n, k->order)) {
    kvidx__score_sort(KVIDX__SC(k, 0), k->n); /* stale hints: by comparison */
  }
  return k->total;
}

KVIDX__PRIV void kvidx__sink_init(kvidx__sink *k, void *out, size_t esz, size_t cap) {
  k->out = KVIDX__CAST(unsigned char *, out); /* not the order array: written before read */
  k->esz = esz;
  k->cap = out ? cap : 0;
  k->n = k->total = 0;
  k->heap = 0;
  k->ordered = 1;
  k->grouped = 0; /* the walk says otherwise (kvidx__find) */
  k->gen = 0;
}


/* The reference model lives at the end (section 10); the API calls it here. */
KVIDX__PRIV int kvidx__ref_store(kvidx *ix, uint64_t id, uint32_t rank, const uint64_t *parent, const kvidx_block *b,
                                 size_t n, int tier, uint64_t expires);
KVIDX__PRIV int kvidx__ref_remove(kvidx *ix, uint64_t id, uint32_t rank, const uint64_t *seq, size_t n, int tier);
KVIDX__PRIV size_t kvidx__ref_expire(kvidx *ix, uint64_t now);
KVIDX__PRIV kvidx__rworker *kvidx__ref_worker(const kvidx *ix, uint64_t id, uint32_t rank);
KVIDX__PRIV void kvidx__ref_clear_worker(kvidx *ix, kvidx__rworker *w);
KVIDX__PRIV size_t kvidx__ref_find(const kvidx *ix, const uint64_t *loc, size_t n, kvidx__sink *k);
KVIDX__PRIV size_t kvidx__ref_blocks(const kvidx *ix, uint64_t id, uint32_t rank);
KVIDX__PRIV void kvidx__ref_stats(const kvidx *ix, kvidx_stats *st);
KVIDX__PRIV int kvidx__ref_check(const kvidx *ix);
KVIDX__PRIV void kvidx__ref_drop_all(kvidx *ix);
KVIDX__PRIV void kvidx__ref_prune(kvidx *ix, size_t limit, kvidx__rworker *pw, const uint64_t *pseq);
KVIDX__PRIV size_t kvidx__blocks_of(const kvidx *ix, uint64_t id, uint32_t rank);
KVIDX__PRIV kvidx__evid *kvidx__ev_find(const kvidx *ix, uint64_t id, uint32_t rank);

/* ========================================================================== */
/* 3. Worker slots: dense ids, recycled when empty                           */
/* ========================================================================== */
/* Readers name workers by slot (bits of their query sets); a slot's identity
 * is published under its own seqlock, with a 64-bit generation so a reader
 * can tell a slot reassigned during its query. */
KVIDX__PRIV uint32_t kvidx__slot_find(const kvidx *ix, uint64_t id, uint32_t rank) {
  uint64_t key[2];
  uint32_t at;
  key[0] = id;
  key[1] = KVIDX__CAST(uint64_t, rank) + 1;
  at = kvidx__map_find(ix, &ix->slot_map, key);
  return at == KVIDX__NONE ? KVIDX__NONE : KVIDX__CAST(uint32_t, kvidx__ld(&kvidx__map_at(&ix->slot_map, at)[2]));
}

/* Writer (stores and removals): the same through a small direct-mapped memo
 * of slots found, each checked against its slot's identity before use (a
 * slot let go of and given to another worker fails the check), so nothing
 * needs to forget it. */
KVIDX__PRIV uint32_t kvidx__slot_of(kvidx *ix, uint64_t id, uint32_t rank) {
  uint32_t *memo = &ix->slot_memo[((id + rank) * 0x9E3779B97F4A7C15ull) >> 58], s = *memo;
  if (s < ix->max_workers && ix->slots[s].used && kvidx__ld(&ix->idents[s].id) == id &&
      kvidx__ld(&ix->idents[s].rank) == rank)
    return s;
  if ((s = kvidx__slot_find(ix, id, rank)) != KVIDX__NONE) *memo = s;
  return s;
}

KVIDX__PRIV void kvidx__slot_publish(kvidx__ident *sl, uint64_t id, uint32_t rank, uint64_t gen) {
  kvidx__st(&sl->ver, kvidx__ld(&sl->ver) + 1);
  kvidx__fence_rel();
  kvidx__st(&sl->id, id);
  kvidx__st(&sl->rank, rank);
  kvidx__st(&sl->gen, gen);
  kvidx__st_rel(&sl->ver, kvidx__ld(&sl->ver) + 1);
}

/* Slot a's worker sorts before slot b's: (id, rank) ascending. */
KVIDX__PRIV int kvidx__ident_before(const kvidx *ix, uint32_t a, uint32_t b) {
  kvidx__ident *x = &KVIDX__MUT(ix)->idents[a], *y = &KVIDX__MUT(ix)->idents[b];
  uint64_t xi = kvidx__ld(&x->id), yi = kvidx__ld(&y->id);
  return xi != yi ? xi < yi : kvidx__ld(&x->rank) < kvidx__ld(&y->rank);
}

/* Keep the order hints (see kvidx__score_place) and their inverse
 * (at_order, see kvidx__stopped_emit) when slot s comes (came 1) or goes (came
 * 0): the live workers after it in (id, rank) order move one place.
 * O(slots), once per worker arriving or leaving. */
KVIDX__PRIV void kvidx__order_update(kvidx *ix, uint32_t s, int came) {
  uint32_t t, end = kvidx__ld(&ix->nw_live) * 64, place = 0, mine = kvidx__ld(&ix->idents[s].order);
  if (end > ix->max_workers) end = ix->max_workers;
  kvidx__st(&ix->order_ver, kvidx__ld(&ix->order_ver) + 1);
  kvidx__fence_rel(); /* odd before any hint changes */
  for (t = 0; t < end; t++) {
    KVIDX__A(uint32_t) *o = &ix->idents[t].order;
    if (t == s || !ix->slots[t].used) continue;
    if (came) {
      if (kvidx__ident_before(ix, t, s)) place++;
      else kvidx__st(o, kvidx__ld(o) + 1);
    } else if (kvidx__ld(o) > mine) {
      kvidx__st(o, kvidx__ld(o) - 1);
    }
    KVIDX_TEST_HOOK(ix, 11); /* hints half rewritten */
  }
  if (came) kvidx__st(&ix->idents[s].order, place);
  for (t = 0; t < end; t++) /* the live slots' places (< max_workers) */
    if (t == s ? came != 0 : ix->slots[t].used != 0) {
      kvidx__st(&ix->idents[kvidx__ld(&ix->idents[t].order)].at_order, t);
      KVIDX_TEST_HOOK(ix, 11);
    }
  kvidx__st_rel(&ix->order_ver, kvidx__ld(&ix->order_ver) + 1);
}

/* A slot for a new worker; the caller checked one is free and reserved the map. */
KVIDX__PRIV uint32_t kvidx__slot_alloc(kvidx *ix, uint64_t id, uint32_t rank) {
  uint32_t s = ix->slot_free;
  kvidx__slot *sl = &ix->slots[s];
  uint64_t e[3], gen = kvidx__ld(&ix->gen) + KVIDX_TEST_GEN_STEP;
  ix->slot_free = sl->free_next;
  kvidx__st_rel(&ix->gen, gen); /* before the slot: a reader that sees the new gen */
  kvidx__slot_publish(&ix->idents[s], id, rank, gen);
  if (s / 64 + 1 > kvidx__ld(&ix->nw_live)) kvidx__st_rel(&ix->nw_live, s / 64 + 1);
  sl->used = 1;
  sl->blocks = 0;
#ifndef KVIDX_NO_RUN_SPLIT
  sl->hashing = 0;
#endif
  e[0] = id;
  e[1] = KVIDX__CAST(uint64_t, rank) + 1;
  e[2] = s;
  kvidx__map_insert(ix, &ix->slot_map, e);
  ix->slots_used++;
  kvidx__order_update(ix, s, 1);
  return s;
}

KVIDX__PRIV void kvidx__slot_release(kvidx *ix, uint32_t s) {
  kvidx__slot *sl = &ix->slots[s];
  uint64_t key[2];
  key[0] = kvidx__ld(&ix->idents[s].id);
  key[1] = KVIDX__CAST(uint64_t, kvidx__ld(&ix->idents[s].rank)) + 1;
  kvidx__map_delete(ix, &ix->slot_map, kvidx__map_find(ix, &ix->slot_map, key));
  kvidx__map_drop(ix, &sl->seqs);
  kvidx__order_update(ix, s, 0);
  sl->used = 0;
  sl->free_next = ix->slot_free;
  ix->slot_free = s;
  ix->slots_used--;
}

/* ========================================================================== */
/* 4. Shared storage: runs, their locals and holder lists, the child map     */
/* ========================================================================== */
#define KVIDX__LEN(shape) ((shape) & 0xFFu)
#define KVIDX__POFF(shape) (((shape) >> 8) & 0xFFu)
#define KVIDX__LCLS(shape) (((shape) >> 16) & 0xFFu)
#define KVIDX__HCLS(shape) (((shape) >> 24) & 0xFFu)
#define KVIDX__SHAPE(len, poff, lc, hc)                                                                          \
  (KVIDX__CAST(uint32_t, len) | KVIDX__CAST(uint32_t, poff) << 8 | KVIDX__CAST(uint32_t, lc) << 16 |          \
   KVIDX__CAST(uint32_t, hc) << 24)

KVIDX__HOT kvidx__run *kvidx__run_at(const kvidx *ix, uint32_t r) { /* writer: in range */
  return KVIDX__RCAST(kvidx__run *, kvidx__grow_get(&ix->runs, r, 1, 0));
}

/* Writer: run r's byte of ix->kid_hi. */
KVIDX__PRIV unsigned char *kvidx__kid_hi(const kvidx *ix, uint32_t r) {
  return KVIDX__RCAST(unsigned char *, kvidx__grow_get(&ix->kid_hi, r, 1, 0));
}

KVIDX__PRIV void kvidx__kids_add(kvidx *ix, uint32_t r, uint32_t d) {
  kvidx__run *rn = kvidx__run_at(ix, r);
  kvidx__st(&rn->kids, kvidx__ld(&rn->kids) + d);
}

KVIDX__PRIV void kvidx__run_wbegin(kvidx__run *rn) {
  kvidx__st(&rn->ver, kvidx__ld(&rn->ver) + 1);
  kvidx__fence_rel();
}
KVIDX__PRIV void kvidx__run_wend(kvidx__run *rn) { kvidx__st_rel(&rn->ver, kvidx__ld(&rn->ver) + 1); }

KVIDX__PRIV uint64_t kvidx__local_at(const kvidx *ix, const kvidx__run *rn, uint32_t off) {
  return kvidx__ld(kvidx__word(ix, kvidx__ld(&rn->locals) + off));
}

/* The child map's key for "the run hanging below offset off of run r". */
KVIDX__PRIV void kvidx__child_key(uint64_t *key, uint32_t r, uint32_t off, uint64_t local) {
  key[0] = (KVIDX__CAST(uint64_t, r) + 1) << 8 | off;
  key[1] = local;
}

/* Reader: ask for the child map's line where the probe for (r, off, local)
 * will start (a hint: the probe validates whatever it reads); returns the
 * key's hash, so the probe that follows need not hash it again. */
KVIDX__PRIV uint64_t kvidx__child_prefetch(const kvidx *ix, uint32_t r, uint32_t off, uint64_t local) {
  uint64_t key[2], h;
  kvidx__child_key(key, r, off, local);
  kvidx__map_prefetch(&ix->children, h = kvidx__key_hash(ix->seed, key, 2), 1);
  return h;
}

KVIDX__PRIV uint32_t kvidx__child_find(const kvidx *ix, uint32_t r, uint32_t off, uint64_t local) {
  uint64_t key[2];
  uint32_t at;
  kvidx__child_key(key, r, off, local);
  at = kvidx__map_find(ix, &ix->children, key);
  return at == KVIDX__NONE ? KVIDX__NONE : KVIDX__CAST(uint32_t, kvidx__ld(&kvidx__map_at(&ix->children, at)[2]));
}

/* Room for a store of n blocks in the shared structures (nothing can fail
 * later except a holder list growing); pruned: at most how many blocks
 * the store's prune lets go of first (their holdings' places may stay
 * deleted: kvidx__map_reserve_over). */
KVIDX__PRIV int kvidx__shared_reserve(kvidx *ix, size_t n, size_t pruned) {
  int rc;
  if ((rc = kvidx__map_reserve(ix, &ix->children, n)) != KVIDX_OK ||
      (rc = kvidx__map_reserve_over(ix, &ix->holds, n, pruned)) != KVIDX_OK ||
      (rc = kvidx__map_reserve(ix, &ix->multi, n)) != KVIDX_OK ||
      (rc = kvidx__grow_reserve(ix, &ix->runs, KVIDX__CAST(uint64_t, ix->runs_hw) + n + 1)) != KVIDX_OK ||
      (rc = kvidx__grow_reserve(ix, &ix->chains, KVIDX__CAST(uint64_t, ix->runs_hw) + n + 1)) != KVIDX_OK ||
      (rc = kvidx__grow_reserve(ix, &ix->kid_hi, KVIDX__CAST(uint64_t, ix->runs_hw) + n + 1)) != KVIDX_OK ||
#ifndef KVIDX_NO_RUN_SPLIT
      (ix->hints_on &&
       (rc = kvidx__grow_reserve(ix, &ix->hints, KVIDX__CAST(uint64_t, ix->runs_hw) + n + 1)) != KVIDX_OK) ||
#endif
      (rc = kvidx__words_reserve(ix, 2 * KVIDX__CAST(uint64_t, n) + 128)) != KVIDX_OK)
    return rc;
  return KVIDX_OK;
}

/* Point run pn's hint at its child r, hung below offset poff.  Release: a
 * reader that takes the hint finds r's record written (a fresh record's
 * memory is not zeroed); the offset goes with it (a reader that pairs an
 * old offset with the new hint finds a run that does not check out, and
 * asks the child map). */
KVIDX__PRIV void kvidx__hint_set(kvidx__run *pn, uint32_t r, uint32_t poff) {
  kvidx__st(&pn->nhold, (kvidx__ld(&pn->nhold) & 0x00FFFFFFu) | poff << 24);
  kvidx__st_rel(&pn->cont, r);
}

/* Run r, its child-map key (parent, poff, key) just inserted, now hangs
 * there: the parent's count and hint, or the count and filter of detached
 * runs.  A hint that still names another child stays: a branch made and
 * let go of below a run's middle (an evicted turn) would otherwise take it
 * from the run that continues the run, for good. */
KVIDX__PRIV void kvidx__run_hang(kvidx *ix, uint32_t r, uint32_t parent, uint32_t poff, uint64_t key) {
  if (parent != KVIDX__NONE) {
    kvidx__run *pn = kvidx__run_at(ix, parent), *cn;
    uint32_t c = kvidx__ld(&pn->cont);
    int keep = c != KVIDX__NONE && c != r && kvidx__ld(&pn->kids) &&
               KVIDX__LEN(kvidx__ld(&(cn = kvidx__run_at(ix, c))->shape)) && kvidx__ld(&cn->parent) == parent;
    unsigned char *hi = kvidx__kid_hi(ix, parent);
    kvidx__kids_add(ix, parent, 1);
    if (*hi <= poff) *hi = KVIDX__CAST(unsigned char, poff + 1);
    if (!keep) kvidx__hint_set(pn, r, poff);
  } else if (poff == KVIDX__DETACHED) {
    unsigned char *f = &ix->det_filter[KVIDX__DET_SLOT(key)];
    ix->detached++;
    if (*f < 255) ++*f;
  }
}

/* ... and no longer hangs there (its child-map key is deleted). */
KVIDX__PRIV void kvidx__run_unhang(kvidx *ix, uint32_t parent, uint32_t poff, uint64_t key) {
  if (parent != KVIDX__NONE) {
    kvidx__kids_add(ix, parent, KVIDX__CAST(uint32_t, -1));
    if (!kvidx__ld(&kvidx__run_at(ix, parent)->kids)) *kvidx__kid_hi(ix, parent) = 0;
  } else if (poff == KVIDX__DETACHED) {
    unsigned char *f = &ix->det_filter[KVIDX__DET_SLOT(key)];
    ix->detached--;
    if (*f < 255) --*f;
    if (!ix->detached) memset(ix->det_filter, 0, sizeof ix->det_filter); /* saturated cells too */
  }
}

/* Writer: the slot for run r's first-block chain hash (0: not known). */
KVIDX__PRIV uint64_t *kvidx__chain_memo(const kvidx *ix, uint32_t r) {
  return KVIDX__RCAST(uint64_t *, kvidx__grow_get(&ix->chains, r, 1, 0));
}

#ifndef KVIDX_NO_RUN_SPLIT
/* ---- seq hints: where a move of a run's rest finds seq entries without
 * Dynamo's folding.  A worker whose seqs are its own engine's block hashes
 * (vLLM, SGLang, TRT-LLM publish theirs; seen at its first store:
 * kvidx__slot.hashing) leaves, for each block it puts into a run, the seq
 * it stored it under: a word chunk per run of its locals' class, at the
 * block's offset (writer-only, ix->hints by run id).  A move of the run's
 * rest probes a holder's seq table with the hint when the folded chain is
 * not there, and believes it, as the folded one, only if the entry found
 * names the very block.  So a hint is never trusted: one a later store
 * overwrote, or a block another worker holds under its own hash, just
 * fails the check and the rest stays (as without hints).  Best effort: no
 * memory, no chunk (the run keeps none).  8 bytes per position of such
 * workers' runs; none for workers that fold as Dynamo does. */
KVIDX__PRIV uint32_t *kvidx__hints_of(const kvidx *ix, uint32_t r) {
  return KVIDX__RCAST(uint32_t *, kvidx__grow_get(&ix->hints, r, 1, 0));
}

/* Blocks b[0..k) were put at offsets off.. of run r by a worker with its
 * own hashes (the run's locals already hold them). */
KVIDX__PRIV void kvidx__hints_put(kvidx *ix, uint32_t r, uint32_t off, const kvidx_block *b, size_t k) {
  uint32_t *h = kvidx__hints_of(ix, r), lc = KVIDX__LCLS(kvidx__ld(&kvidx__run_at(ix, r)->shape)), j;
  if (*h == KVIDX__NONE) {
    if ((*h = kvidx__chunk_alloc(ix, lc)) == KVIDX__NONE) return;
    for (j = 0; j < off; j++) kvidx__st(kvidx__word(ix, *h + j), KVIDX__CAST(uint64_t, 0)); /* not known */
  }
  for (j = 0; j < k; j++) kvidx__st(kvidx__word(ix, *h + off + j), b[j].seq);
}

/* Run r's locals moved from a chunk of class lc to one of class nlc with
 * len blocks: its hints follow (or go, without memory). */
KVIDX__PRIV void kvidx__hints_move(kvidx *ix, uint32_t r, uint32_t lc, uint32_t nlc, uint32_t len) {
  uint32_t *h = kvidx__hints_of(ix, r), n;
  if (*h == KVIDX__NONE) return;
  if ((n = kvidx__chunk_alloc(ix, nlc)) != KVIDX__NONE) kvidx__words_copy(ix, n, *h, len);
  kvidx__chunk_free(ix, *h, lc);
  *h = n;
}

/* Run r (locals of class lc) goes: so do its hints. */
KVIDX__PRIV void kvidx__hints_drop(kvidx *ix, uint32_t r, uint32_t lc) {
  uint32_t *h = kvidx__hints_of(ix, r);
  if (*h != KVIDX__NONE) kvidx__chunk_free(ix, *h, lc);
  *h = KVIDX__NONE;
}
#endif

/* A run id: a freed one, or the next never used (room was reserved). */
KVIDX__PRIV uint32_t kvidx__run_id(kvidx *ix) {
  uint32_t r = ix->run_free;
  if (r != KVIDX__NONE) {
    ix->run_free = kvidx__ld(&kvidx__run_at(ix, r)->kids); /* the free list's link */
  } else {
    r = ix->runs_hw++;
    kvidx__st(&kvidx__run_at(ix, r)->ver, 0u); /* fresh memory: the seqlock starts even */
  }
  return r;
}

/* Run r, its locals (shape's length and class, from li, the first one
 * `local`) and holder entries (hi, nhold) written, hangs below (parent,
 * poff): its record, then the child map names it.  chain: its first
 * block's chain hash (0: not known). */
KVIDX__PRIV void kvidx__run_publish(kvidx *ix, uint32_t r, uint32_t parent, uint32_t li, uint32_t hi, uint32_t nhold,
                                    uint32_t shape, uint64_t local, uint64_t chain) {
  kvidx__run *rn = kvidx__run_at(ix, r);
  uint64_t e[3];
  kvidx__run_wbegin(rn);
  kvidx__st(&rn->parent, parent);
  kvidx__st(&rn->locals, li);
  kvidx__st(&rn->holders, hi);
  kvidx__st(&rn->nhold, nhold);
  kvidx__st(&rn->kids, 0u);
  kvidx__st(&rn->cont, KVIDX__NONE);
  kvidx__st(&rn->shape, shape);
  kvidx__run_wend(rn);
  *kvidx__chain_memo(ix, r) = chain;
  *kvidx__kid_hi(ix, r) = 0;
#ifndef KVIDX_NO_RUN_SPLIT
  if (ix->hints_on) *kvidx__hints_of(ix, r) = KVIDX__NONE;
#endif
  kvidx__child_key(e, parent, KVIDX__POFF(shape), local);
  e[2] = r;
  kvidx__map_insert(ix, &ix->children, e);
  KVIDX_TEST_HOOK(ix, 4); /* published, its holders (if any) with it */
  kvidx__run_hang(ix, r, parent, KVIDX__POFF(shape), local);
  ix->runs_live++;
}

/* A new run below (parent, poff) starting with `local`, sized for `hint`
 * blocks, whose first block's chain hash is `chain` (0: not known); room
 * was reserved. */
KVIDX__PRIV uint32_t kvidx__run_new(kvidx *ix, uint32_t parent, uint32_t poff, uint64_t local, size_t hint,
                                    uint64_t chain) {
  unsigned lc = kvidx__class_of(hint < KVIDX__RUN_MAX ? hint : KVIDX__RUN_MAX);
  uint32_t r, li = kvidx__chunk_alloc(ix, lc);
  if (li == KVIDX__NONE) return KVIDX__NONE;
  r = kvidx__run_id(ix);
  kvidx__st(kvidx__word(ix, li), local);
  kvidx__run_publish(ix, r, parent, li, KVIDX__NONE, 0u, KVIDX__SHAPE(1, poff, lc, KVIDX__NOCLASS), local, chain);
  ix->entries++;
  return r;
}

/* A run grows in two steps: room for `want` blocks in all (at most 64),
 * then the blocks, written past the length (no reader reads there), taken
 * in one seqlock section.  The room: the locals at lw, or a chunk of the
 * class that fits with them copied in (*shape gets the class, *nli the
 * chunk, which kvidx__run_take publishes); NULL with nothing changed when
 * no chunk can be had. */
KVIDX__PRIV KVIDX__A(uint64_t) *kvidx__run_room(kvidx *ix, kvidx__run *rn, KVIDX__A(uint64_t) *lw, uint32_t want,
                                               uint32_t *shape, uint32_t *nli) {
  uint32_t len = KVIDX__LEN(*shape), c;
  *nli = KVIDX__NONE;
  if (want <= (1u << KVIDX__LCLS(*shape))) return lw;
  c = kvidx__class_of(want);
  if ((*nli = kvidx__chunk_alloc(ix, c)) == KVIDX__NONE) return NULL;
  kvidx__words_copy(ix, *nli, kvidx__ld(&rn->locals), len);
  *shape = KVIDX__SHAPE(len, KVIDX__POFF(*shape), c, KVIDX__HCLS(*shape));
  return kvidx__word(ix, *nli);
}

/* The run takes the k blocks written past its length (shape and nli from
 * kvidx__run_room); a chunk it left goes back to its class. */
KVIDX__PRIV void kvidx__run_take(kvidx *ix, uint32_t r, kvidx__run *rn, uint32_t shape, uint32_t k, uint32_t nli) {
  uint32_t li = kvidx__ld(&rn->locals), lc = KVIDX__LCLS(kvidx__ld(&rn->shape));
  kvidx__run_wbegin(rn);
  KVIDX_TEST_HOOK(ix, 2); /* a run growing */
  if (nli != KVIDX__NONE) kvidx__st(&rn->locals, nli);
  kvidx__st(&rn->shape, shape + k); /* the length is the low byte (< 64) */
  kvidx__run_wend(rn);
  if (nli != KVIDX__NONE) {
    kvidx__chunk_free(ix, li, lc);
#ifndef KVIDX_NO_RUN_SPLIT
    if (ix->hints_on) kvidx__hints_move(ix, r, lc, KVIDX__LCLS(shape), KVIDX__LEN(shape));
#endif
  }
#ifdef KVIDX_NO_RUN_SPLIT
  (void)r;
#endif
  ix->entries += k;
}

/* Append one block to run rn (len < 64) whose locals are at *lw (updated
 * when they move to a bigger chunk); 0 if the locals could not grow. */
KVIDX__HOT int kvidx__run_append(kvidx *ix, uint32_t r, kvidx__run *rn, KVIDX__A(uint64_t) **lw, uint64_t local) {
  uint32_t shape = kvidx__ld(&rn->shape), nli;
  KVIDX__A(uint64_t) *w = kvidx__run_room(ix, rn, *lw, KVIDX__LEN(shape) + 1, &shape, &nli);
  if (!w) return 0;
  kvidx__st(&w[KVIDX__LEN(shape)], local);
  kvidx__run_take(ix, r, rn, shape, 1, nli);
  *lw = w;
  return 1;
}

/* The chain hash of position (r, off): the path's locals folded from the
 * nearest run above whose first block's chain is known, or from the top
 * run (a root run or a detached one; either way its first local is its
 * chain).  Each run's first-block chain met on the way is kept: it names
 * the run's position, which detaching and hanging back keep, so it holds
 * for the run's life, and a store deep in a long path folds at most one
 * run's locals once the path is known.  Writer, no allocation: the path is
 * halved until a piece has at most 8 runs, O(d log d) header reads for d
 * runs. */
KVIDX__PRIV uint64_t kvidx__chain_at(const kvidx *ix, uint32_t r, uint32_t off) {
  uint32_t todo[40][3], top = 0, runs = 0, x; /* (run, offset, runs) pieces, the top one next */
  uint64_t c = 0;
  int have = 0;
  if (r == ix->chain_hint_run && off >= ix->chain_hint_off) { /* the last store ended here or before */
    const kvidx__run *rn = kvidx__run_at(ix, r);
    for (c = ix->chain_hint, x = ix->chain_hint_off + 1; x <= off; x++) c = kvidx_seq_hash_next(c, kvidx__local_at(ix, rn, x));
    return c;
  }
  for (x = r;; x = kvidx__ld(&kvidx__run_at(ix, x)->parent)) {
    runs++;
    if (*kvidx__chain_memo(ix, x) || kvidx__ld(&kvidx__run_at(ix, x)->parent) == KVIDX__NONE) break;
  }
  todo[top][0] = r, todo[top][1] = off, todo[top++][2] = runs;
  while (top) {
    uint32_t pr = todo[--top][0], po = todo[top][1], pn = todo[top][2], i, o;
    if (pn > 8) { /* the lower half waits below the upper one */
      uint32_t a = pr, ao = po;
      for (i = 0; i < pn / 2; i++) {
        const kvidx__run *an = kvidx__run_at(ix, a);
        ao = KVIDX__POFF(kvidx__ld(&an->shape));
        a = kvidx__ld(&an->parent);
      }
      todo[top][0] = pr, todo[top][1] = po, todo[top++][2] = pn / 2;
      todo[top][0] = a, todo[top][1] = ao, todo[top++][2] = pn - pn / 2;
      continue;
    }
    {
      uint32_t pieces[8], ends[8];
      for (i = pn; i-- > 0;) {
        const kvidx__run *pnr = kvidx__run_at(ix, pr);
        pieces[i] = pr;
        ends[i] = po;
        po = KVIDX__POFF(kvidx__ld(&pnr->shape));
        pr = kvidx__ld(&pnr->parent);
      }
      for (i = 0; i < pn; i++) {
        uint64_t *memo = kvidx__chain_memo(ix, pieces[i]);
        for (o = 0; o <= ends[i]; o++) {
          uint64_t l = kvidx__local_at(ix, kvidx__run_at(ix, pieces[i]), o);
          if (o) c = kvidx_seq_hash_next(c, l);
          else if (have) *memo = c = kvidx_seq_hash_next(c, l);
          else *memo = c = *memo ? *memo : l; /* the top piece's first block */
          have = 1;
        }
      }
    }
  }
  return c;
}

/* Hang run k below (p, off), first local `local`, instead of where it hangs
 * now: detached (p NONE, off KVIDX__DETACHED, local its chain) or back below
 * a rebuilt prefix.  Readers that meet it mid-move see a run that is not
 * where they looked (a miss, retried or stable).  0 if the key is taken. */
KVIDX__PRIV int kvidx__run_move(kvidx *ix, uint32_t k, uint32_t p, uint32_t off, uint64_t local) {
  kvidx__run *kn = kvidx__run_at(ix, k);
  uint32_t shape = kvidx__ld(&kn->shape), was = kvidx__ld(&kn->parent);
  uint64_t e[3];
  if (kvidx__child_find(ix, p, off, local) != KVIDX__NONE) return 0;
  kvidx__child_key(e, was, KVIDX__POFF(shape), kvidx__local_at(ix, kn, 0));
  kvidx__map_delete(ix, &ix->children, kvidx__map_find(ix, &ix->children, e));
  kvidx__run_unhang(ix, was, KVIDX__POFF(shape), e[1]);
  kvidx__run_wbegin(kn);
  KVIDX_TEST_HOOK(ix, 10); /* a run moving */
  kvidx__st(&kn->parent, p);
  kvidx__st(kvidx__word(ix, kvidx__ld(&kn->locals)), local);
  kvidx__st(&kn->shape, KVIDX__SHAPE(KVIDX__LEN(shape), off, KVIDX__LCLS(shape), KVIDX__HCLS(shape)));
  kvidx__run_wend(kn);
  kvidx__child_key(e, p, off, local);
  e[2] = k;
  kvidx__map_insert(ix, &ix->children, e);
  kvidx__run_hang(ix, k, p, off, local);
  return 1;
}

/* Run r is held by nobody but has children (a worker holds blocks below a
 * hole): it moves to the detached root, keyed by its first block's chain
 * hash (a prefix's identity), which replaces its first local.  The runs
 * above it that only it kept can then go: memory follows what is held, not
 * the paths to it.  A store that makes that chain's position again hangs r
 * back there with all below it (kvidx__advance): every prefix of r's
 * blocks passes through that position.  0 if another detached run has the
 * chain (a chain collision): r stays where it is. */
KVIDX__PRIV int kvidx__run_detach(kvidx *ix, uint32_t r) {
  return kvidx__run_move(ix, r, KVIDX__NONE, KVIDX__DETACHED, kvidx__chain_at(ix, r, 0));
}

/* Free runs that nobody holds, walking up.  One with children stays for
 * them, detached unless it is at the top already (a root or detached run),
 * so a run nobody holds is always at the top and holds up only held runs. */
KVIDX__PRIV void kvidx__run_release(kvidx *ix, uint32_t r) {
  while (r != KVIDX__NONE) {
    kvidx__run *rn = kvidx__run_at(ix, r);
    uint32_t shape = kvidx__ld(&rn->shape), parent = kvidx__ld(&rn->parent);
    uint64_t key[2];
    if (KVIDX__NHOLD(kvidx__ld(&rn->nhold))) return;
    if (kvidx__ld(&rn->kids)) {
      if (parent == KVIDX__NONE || !kvidx__run_detach(ix, r)) return;
      r = parent; /* one child fewer: maybe nothing keeps it now */
      continue;
    }
    kvidx__child_key(key, parent, KVIDX__POFF(shape), kvidx__local_at(ix, rn, 0));
    kvidx__map_delete(ix, &ix->children, kvidx__map_find(ix, &ix->children, key));
    kvidx__run_wbegin(rn);
    KVIDX_TEST_HOOK(ix, 6); /* unlinked, being freed */
    kvidx__st(&rn->shape, KVIDX__SHAPE(0, 0, KVIDX__NOCLASS, KVIDX__NOCLASS));
    kvidx__run_wend(rn);
    kvidx__chunk_free(ix, kvidx__ld(&rn->locals), KVIDX__LCLS(shape));
    if (KVIDX__HCLS(shape) != KVIDX__NOCLASS) kvidx__chunk_free(ix, kvidx__ld(&rn->holders), KVIDX__HCLS(shape));
#ifndef KVIDX_NO_RUN_SPLIT
    if (ix->hints_on) kvidx__hints_drop(ix, r, KVIDX__LCLS(shape));
#endif
    kvidx__st(&rn->kids, ix->run_free); /* readers see len 0 and never read it */
    ix->run_free = r;
    if (ix->chain_hint_run == r) ix->chain_hint_run = KVIDX__NONE;
    ix->runs_live--;
    ix->entries -= KVIDX__LEN(shape);
    kvidx__run_unhang(ix, parent, KVIDX__POFF(shape), key[1]);
    r = parent;
  }
}

/* ---- holder lists: per run, (slot, cutoff) of every worker holding part
 * of it; cutoff = how many of its leading blocks that worker holds.  With
 * tiers a second word: the device-tier bits. ------------------------------ */
KVIDX__PRIV KVIDX__A(uint64_t) *kvidx__holder(const kvidx *ix, const kvidx__run *rn, uint32_t j) {
  return kvidx__word(ix, kvidx__ld(&rn->holders) + j * ix->hw);
}

/* Add slot s with cutoff 0; returns its index or KVIDX__NONE (no memory). */
KVIDX__PRIV uint32_t kvidx__holder_add(kvidx *ix, uint32_t r, uint32_t s) {
  kvidx__run *rn = kvidx__run_at(ix, r);
  uint32_t shape = kvidx__ld(&rn->shape), hc = KVIDX__HCLS(shape), nh = KVIDX__NHOLD(kvidx__ld(&rn->nhold));
  uint32_t hi = kvidx__ld(&rn->holders), nhi = hi, nhc = hc;
  if (hc == KVIDX__NOCLASS || (nh + 1) * ix->hw > (1u << hc)) {
    nhc = hc == KVIDX__NOCLASS ? kvidx__class_of(ix->hw) : hc + 1;
    if (nhc >= KVIDX__WCLASSES || (nhi = kvidx__chunk_alloc(ix, nhc)) == KVIDX__NONE) return KVIDX__NONE;
    kvidx__words_copy(ix, nhi, hi, nh * ix->hw);
  }
  kvidx__run_wbegin(rn);
  KVIDX_TEST_HOOK(ix, 3); /* a holder joining */
  kvidx__st(kvidx__word(ix, nhi + nh * ix->hw), KVIDX__CAST(uint64_t, s));
  if (ix->hw > 1) kvidx__st(kvidx__word(ix, nhi + nh * ix->hw + 1), KVIDX__CAST(uint64_t, 0));
  kvidx__st(&rn->holders, nhi);
  kvidx__st(&rn->shape, KVIDX__SHAPE(KVIDX__LEN(shape), KVIDX__POFF(shape), KVIDX__LCLS(shape), nhc));
  kvidx__st(&rn->nhold, (kvidx__ld(&rn->nhold) & 0xFF000000u) | (nh + 1));
  kvidx__run_wend(rn);
  if (nhi != hi && hc != KVIDX__NOCLASS) kvidx__chunk_free(ix, hi, hc);
  return nh;
}

/* ---- a worker's holding of a run: held / device / multi bits -------------- */
/* Words of a holding: key, held bits, multi bits (positions with >= 2 seqs),
 * holder index, and with tiers the device bits (ix->hdev; without tiers every
 * copy is a device copy and hdev names the held word). */
enum { KVIDX__H_HELD = 1, KVIDX__H_MULTI = 2, KVIDX__H_INDEX = 3 };

KVIDX__PRIV uint32_t kvidx__hold_find(const kvidx *ix, uint32_t s, uint32_t r) {
  uint64_t key[2]; /* one word is the key; two keep GCC's inlined bounds check quiet */
  key[0] = (KVIDX__CAST(uint64_t, s) + 1) << 32 | r;
  key[1] = 0;
  return kvidx__map_find(ix, &ix->holds, key);
}

KVIDX__PRIV uint32_t kvidx__cutoff(uint64_t held) {
  return ~held ? kvidx__ctz64(~held) : 64u;
}

/* A holder entry's first word for slot s holding `held` of the run. */
KVIDX__PRIV uint64_t kvidx__holder_word(uint32_t s, uint64_t held) {
  uint64_t top = held ? kvidx__log2(held) + 1u : 0u;
  return KVIDX__CAST(uint64_t, kvidx__cutoff(held)) << 32 | top << 40 | s;
}
#define KVIDX__HOLDER_CUT(e) KVIDX__CAST(uint32_t, ((e) >> 32) & 0xFFu)
#define KVIDX__HOLDER_TOP(e) KVIDX__CAST(uint32_t, ((e) >> 40) & 0xFFu)

/* Publish a holding's cutoff (and device bits) in the run's holder list. */
KVIDX__PRIV void kvidx__holder_set(kvidx *ix, uint32_t r, KVIDX__A(uint64_t) *h) {
  kvidx__run *rn = kvidx__run_at(ix, r);
  uint32_t j = KVIDX__CAST(uint32_t, kvidx__ld(&h[KVIDX__H_INDEX]));
  KVIDX__A(uint64_t) *e = kvidx__holder(ix, rn, j);
  uint64_t v = kvidx__holder_word(KVIDX__CAST(uint32_t, kvidx__ld(&e[0]) & 0xFFFFFFFFu), kvidx__ld(&h[KVIDX__H_HELD]));
  uint64_t dev = kvidx__ld(&h[ix->hdev]);
  if (kvidx__ld(&e[0]) == v && (ix->hw < 2 || kvidx__ld(&e[1]) == dev)) return;
  kvidx__run_wbegin(rn);
  KVIDX_TEST_HOOK(ix, 1); /* a holder entry changing */
  kvidx__st(&e[0], v);
  if (ix->hw > 1) kvidx__st(&e[1], dev);
  kvidx__run_wend(rn);
}

/* Worker s stops holding run r at all. */
KVIDX__PRIV void kvidx__hold_drop(kvidx *ix, uint32_t r, uint32_t at) {
  kvidx__run *rn = kvidx__run_at(ix, r);
  uint32_t j = KVIDX__CAST(uint32_t, kvidx__ld(&kvidx__map_at(&ix->holds, at)[KVIDX__H_INDEX]));
  uint32_t last = KVIDX__NHOLD(kvidx__ld(&rn->nhold)) - 1, k;
  kvidx__run_wbegin(rn);
  KVIDX_TEST_HOOK(ix, 7); /* a holder leaving */
  if (j != last) { /* the last entry fills the gap; its holding learns its new index */
    KVIDX__A(uint64_t) *src = kvidx__holder(ix, rn, last), *dst = kvidx__holder(ix, rn, j);
    uint32_t moved = KVIDX__CAST(uint32_t, kvidx__ld(&src[0]) & 0xFFFFFFFFu);
    for (k = 0; k < ix->hw; k++) kvidx__st(&dst[k], kvidx__ld(&src[k]));
    kvidx__st(&kvidx__map_at(&ix->holds, kvidx__hold_find(ix, moved, r))[KVIDX__H_INDEX], KVIDX__CAST(uint64_t, j));
  }
  kvidx__st(&rn->nhold, (kvidx__ld(&rn->nhold) & 0xFF000000u) | last);
  kvidx__run_wend(rn);
  kvidx__map_delete(ix, &ix->holds, at);
  kvidx__run_release(ix, r);
}

/* ---- positions held under several seqs: exact counts on the side --------- */
KVIDX__PRIV uint32_t kvidx__multi_find(const kvidx *ix, uint32_t s, uint32_t r, uint32_t off) {
  uint64_t key[2];
  key[0] = (KVIDX__CAST(uint64_t, s) + 1) << 32 | r;
  key[1] = off;
  return kvidx__map_find(ix, &ix->multi, key);
}

/* Position word of a seq entry: run << 32 | hash tag << 16 (KVIDX__POS_TAG)
 * | offset << 8 | tier bits. */
#define KVIDX__POS(r, off, tiers) (KVIDX__CAST(uint64_t, r) << 32 | KVIDX__CAST(uint64_t, off) << 8 | (tiers))
#define KVIDX__POS_RUN(p) KVIDX__CAST(uint32_t, (p) >> 32)
#define KVIDX__POS_OFF(p) KVIDX__CAST(uint32_t, ((p) >> 8) & 0xFFu)
#define KVIDX__POS_TIERS(p) KVIDX__CAST(uint32_t, (p) & 0xFFu)
#define KVIDX__DEVBIT (1u << KVIDX_TIER_DEVICE)

/* A store's current holding: consecutive blocks of one run find it once and
 * publish the run's holder entry once (holds entries do not move while a
 * store adds: open addressing moves entries only on deletion). */
typedef struct {
  uint32_t run, at;
  KVIDX__A(uint64_t) *h; /* the holding's entry (holds entries move only when one is deleted) */
} kvidx__hcache;

KVIDX__PRIV void kvidx__hcache_flush(kvidx *ix, kvidx__hcache *hc) {
  if (hc->run != KVIDX__NONE) kvidx__holder_set(ix, hc->run, hc->h);
  hc->run = KVIDX__NONE;
}

/* One more seq of worker s at (r, off), with or without a device copy;
 * keeps held / device / multi bits and the side counts.  The holder entry is
 * published when the cache moves on (kvidx__hcache_flush). */
KVIDX__PRIV int kvidx__position_add(kvidx *ix, uint32_t s, uint32_t r, uint32_t off, int dev, kvidx__hcache *hc) {
  uint32_t at;
  uint64_t bit = KVIDX__CAST(uint64_t, 1) << off;
  KVIDX__A(uint64_t) *h;
  if (hc->run == r && !(kvidx__ld(&hc->h[KVIDX__H_HELD]) & bit)) { /* the common case: the next block of the run */
    h = hc->h;
    kvidx__st(&h[KVIDX__H_HELD], kvidx__ld(&h[KVIDX__H_HELD]) | bit);
    if (dev && ix->tiers_on) kvidx__st(&h[ix->hdev], kvidx__ld(&h[ix->hdev]) | bit); /* else hdev is the held word */
    return KVIDX_OK;
  }
  if (hc->run == r) {
    at = hc->at;
  } else { /* one probe finds the holding or where it goes (room was reserved) */
    uint64_t e[5], hash;
    uint32_t free_at = KVIDX__NONE, j;
    e[0] = (KVIDX__CAST(uint64_t, s) + 1) << 32 | r;
    hash = kvidx__key_hash(ix->seed, e, 1);
    at = kvidx__map_slot(&ix->holds, e, hash, &free_at);
    kvidx__hcache_flush(ix, hc);
    if (at == KVIDX__NONE) {
      if ((j = kvidx__holder_add(ix, r, s)) == KVIDX__NONE) return kvidx__oom(ix);
      e[KVIDX__H_HELD] = e[KVIDX__H_MULTI] = e[4] = 0;
      e[KVIDX__H_INDEX] = j;
      kvidx__map_put_at(&ix->holds, free_at, e, hash);
      at = free_at;
    }
  }
  hc->run = r;
  hc->at = at;
  hc->h = h = kvidx__map_at(&ix->holds, at);
  if (kvidx__ld(&h[KVIDX__H_HELD]) & bit) { /* a second seq for the same block */
    uint32_t m = kvidx__multi_find(ix, s, r, off);
    uint64_t c;
    if (m == KVIDX__NONE) {
      uint64_t e[3];
      e[0] = (KVIDX__CAST(uint64_t, s) + 1) << 32 | r;
      e[1] = off;
      e[2] = 1 | ((kvidx__ld(&h[ix->hdev]) & bit) ? KVIDX__CAST(uint64_t, 1) << 32 : 0);
      m = kvidx__map_insert(ix, &ix->multi, e);
      kvidx__st(&h[KVIDX__H_MULTI], kvidx__ld(&h[KVIDX__H_MULTI]) | bit);
    }
    c = kvidx__ld(&kvidx__map_at(&ix->multi, m)[2]) + 1 + (dev ? KVIDX__CAST(uint64_t, 1) << 32 : 0);
    kvidx__st(&kvidx__map_at(&ix->multi, m)[2], c);
  } else {
    kvidx__st(&h[KVIDX__H_HELD], kvidx__ld(&h[KVIDX__H_HELD]) | bit);
  }
  if (dev) kvidx__st(&h[ix->hdev], kvidx__ld(&h[ix->hdev]) | bit);
  return KVIDX_OK;
}

/* One seq of worker s at (r, off) goes (gone = 1) or loses its device copy
 * (gone = 0, dev = 1).  With a cache (removals) consecutive blocks of one run
 * find the holding once and publish its holder entry once. */
KVIDX__PRIV void kvidx__position_sub_slow(kvidx *ix, uint32_t s, uint32_t r, uint32_t off, int dev, int gone,
                                          kvidx__hcache *hc) {
  int hit = hc && hc->run == r;
  uint32_t at = hit ? hc->at : kvidx__hold_find(ix, s, r);
  uint64_t bit = KVIDX__CAST(uint64_t, 1) << off;
  KVIDX__A(uint64_t) *h = hit ? hc->h : kvidx__map_at(&ix->holds, at);
  if (hc && !hit) kvidx__hcache_flush(ix, hc); /* before any holding is deleted (entries shift) */
  if (kvidx__ld(&h[KVIDX__H_MULTI]) & bit) {
    uint32_t m = kvidx__multi_find(ix, s, r, off);
    uint64_t c = kvidx__ld(&kvidx__map_at(&ix->multi, m)[2]) - (gone ? 1u : 0u) -
                 (dev ? KVIDX__CAST(uint64_t, 1) << 32 : 0);
    if (!(c >> 32)) kvidx__st(&h[ix->hdev], kvidx__ld(&h[ix->hdev]) & ~bit);
    if ((c & 0xFFFFFFFFu) == 1) { /* back to one seq: the bits say it all */
      kvidx__map_delete(ix, &ix->multi, m);
      kvidx__st(&h[KVIDX__H_MULTI], kvidx__ld(&h[KVIDX__H_MULTI]) & ~bit);
    } else {
      kvidx__st(&kvidx__map_at(&ix->multi, m)[2], c);
    }
  } else {
    if (dev) kvidx__st(&h[ix->hdev], kvidx__ld(&h[ix->hdev]) & ~bit);
    if (gone) kvidx__st(&h[KVIDX__H_HELD], kvidx__ld(&h[KVIDX__H_HELD]) & ~bit);
  }
  if (!kvidx__ld(&h[KVIDX__H_HELD])) {
    if (hc) hc->run = KVIDX__NONE;
    kvidx__hold_drop(ix, r, at);
    return;
  }
  if (hc) { /* published when the caller moves on */
    hc->run = r;
    hc->at = at;
    hc->h = h;
  } else {
    kvidx__holder_set(ix, r, h);
  }
}

/* The common case inline: a block of the cached run, held under one seq,
 * goes and more of the run stays held. */
KVIDX__HOT void kvidx__position_sub(kvidx *ix, uint32_t s, uint32_t r, uint32_t off, int dev, int gone,
                                    kvidx__hcache *hc) {
  uint64_t bit = KVIDX__CAST(uint64_t, 1) << off, held;
  if (gone && hc && hc->run == r && !(kvidx__ld(&hc->h[KVIDX__H_MULTI]) & bit) &&
      (held = kvidx__ld(&hc->h[KVIDX__H_HELD]) & ~bit) != 0) {
    kvidx__st(&hc->h[KVIDX__H_HELD], held);
    if (dev && ix->tiers_on) kvidx__st(&hc->h[ix->hdev], kvidx__ld(&hc->h[ix->hdev]) & ~bit); /* else hdev is held */
    return;
  }
  kvidx__position_sub_slow(ix, s, r, off, dev, gone, hc);
}

/* A held seq gains a device copy. */
KVIDX__PRIV void kvidx__position_add_dev(kvidx *ix, uint32_t s, uint32_t r, uint32_t off) {
  KVIDX__A(uint64_t) *h = kvidx__map_at(&ix->holds, kvidx__hold_find(ix, s, r));
  uint64_t bit = KVIDX__CAST(uint64_t, 1) << off;
  if (kvidx__ld(&h[KVIDX__H_MULTI]) & bit) {
    KVIDX__A(uint64_t) *c = &kvidx__map_at(&ix->multi, kvidx__multi_find(ix, s, r, off))[2];
    kvidx__st(c, kvidx__ld(c) + (KVIDX__CAST(uint64_t, 1) << 32));
  }
  kvidx__st(&h[ix->hdev], kvidx__ld(&h[ix->hdev]) | bit);
  kvidx__holder_set(ix, r, h);
}

/* ========================================================================== */
/* 5. Per-worker holdings: stores, removals, eviction                        */
/* ========================================================================== */
/* ---- writer lock: events for different workers may come from different
 * threads; they serialize here (test-and-test-and-set from C11 atomics:
 * critical sections are short and never block). */
KVIDX__PRIV void kvidx__lock(kvidx *ix) {
#ifdef KVIDX_NO_THREADS
  (void)ix;
#else
  uint32_t spins = 0;
  while (kvidx__xchg_acq(&ix->wlock, 1))
    while (kvidx__ld(&ix->wlock)) { /* the holder may be off its core: give the core away now and then */
      KVIDX__PAUSE();
      if ((++spins & 127) == 0) KVIDX__YIELD();
    }
  /* Every write this holder makes outside a seqlock section (a run's
   * blocks written past its length, a chunk reused) comes after the last
   * holder's version changes for a reader that reads it: a reader's
   * acquire fence synchronizes with this one, so it then sees those
   * versions and retries (a free fence on x86; C11 orders nothing through
   * the lock alone between the two holders' writes). */
  kvidx__fence_rel();
#endif
}
KVIDX__PRIV void kvidx__unlock(kvidx *ix) {
#ifdef KVIDX_NO_THREADS
  (void)ix;
#else
  kvidx__st_rel(&ix->wlock, 0);
#endif
}

/* ---- eviction order: a lazily deleted min-heap of (k1, k2) ---------------
 * An element is current while the worker still holds that seq with the same
 * keys; stale ones are skipped when they surface and swept when they pass
 * half the heap. */
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

KVIDX__PRIV int kvidx__victim_less(const kvidx__victim *a, const kvidx__victim *b) {
  return a->k1 != b->k1 ? a->k1 < b->k1 : a->k2 < b->k2;
}

KVIDX__PRIV void kvidx__heap_up(kvidx__victim *h, size_t i) {
  kvidx__victim x = h[i];
  while (i && kvidx__victim_less(&x, &h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = x;
}

KVIDX__PRIV void kvidx__heap_down(kvidx__victim *h, size_t n, size_t i) {
  kvidx__victim x = h[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && kvidx__victim_less(&h[c + 1], &h[c])) c++;
    if (!kvidx__victim_less(&h[c], &x)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = x;
}

/* The seq entry an element names, if it is still current. */
KVIDX__PRIV KVIDX__A(uint64_t) *kvidx__victim_entry(const kvidx *ix, const kvidx__victim *v) {
  const kvidx__slot *sl = &ix->slots[v->slot];
  uint32_t at;
  KVIDX__A(uint64_t) *e;
  if (!sl->used || (at = kvidx__map_find(ix, &sl->seqs, &v->seq)) == KVIDX__NONE) return NULL;
  e = kvidx__map_at(&sl->seqs, at);
  return kvidx__ld(&e[2]) == v->k1 && kvidx__ld(&e[3]) == v->k2 ? e : NULL;
}

KVIDX__PRIV void kvidx__heap_pop(kvidx *ix) {
  ix->heap[0] = ix->heap[--ix->heap_n];
  if (ix->heap_n) kvidx__heap_down(ix->heap, ix->heap_n, 0);
}

/* Drop stale elements from the top, then the current minimum (or NULL). */
KVIDX__PRIV KVIDX__A(uint64_t) *kvidx__heap_top(kvidx *ix) {
  while (ix->heap_n) {
    KVIDX__A(uint64_t) *e = kvidx__victim_entry(ix, &ix->heap[0]);
    if (e) return e;
    kvidx__heap_pop(ix);
  }
  return NULL;
}

/* Room for `extra` more elements; sweeps stale ones first when it can. */
KVIDX__PRIV int kvidx__heap_reserve(kvidx *ix, size_t extra) {
  kvidx__victim *h;
  size_t i, n = 0, ncap;
  if (!ix->evict || ix->heap_n + extra <= ix->heap_cap) return KVIDX_OK;
  if (ix->heap_n > 2 * ix->blocks + 64) { /* mostly stale: sweep and re-heapify */
    for (i = 0; i < ix->heap_n; i++)
      if (kvidx__victim_entry(ix, &ix->heap[i])) ix->heap[n++] = ix->heap[i];
    ix->heap_n = n;
    for (i = n / 2; i-- > 0;) kvidx__heap_down(ix->heap, n, i);
    if (n + extra <= ix->heap_cap) return KVIDX_OK;
  }
  ncap = ix->heap_cap ? 2 * ix->heap_cap : 64;
  while (ncap < ix->heap_n + extra) ncap *= 2;
  if (ncap > KVIDX__SIZE_MAX / sizeof(kvidx__victim)) return kvidx__oom(ix);
  h = KVIDX__CAST(kvidx__victim *, kvidx__alloc(ix, ncap * sizeof(kvidx__victim)));
  if (!h) return kvidx__oom(ix);
  if (ix->heap) {
    memcpy(h, ix->heap, ix->heap_n * sizeof(kvidx__victim));
    kvidx__free(ix, ix->heap, ix->heap_cap * sizeof(kvidx__victim));
  }
  ix->heap = h;
  ix->heap_cap = ncap;
  return KVIDX_OK;
}

KVIDX__PRIV void kvidx__heap_push(kvidx *ix, uint32_t s, uint64_t seq, uint64_t k1, uint64_t k2) {
  kvidx__victim *v = &ix->heap[ix->heap_n];
  v->k1 = k1;
  v->k2 = k2;
  v->seq = seq;
  v->slot = s;
  v->pad_ = 0;
  kvidx__heap_up(ix->heap, ix->heap_n++);
}

/* ---- holding and letting go of one seq ------------------------------------ */
KVIDX__PRIV uint32_t kvidx__seq_words(const kvidx *ix) { return ix->evict ? 4u : 2u; }

/* Worker s lets go of the seq entry at `at` (every tier). */
KVIDX__HOT void kvidx__unhold_cached(kvidx *ix, uint32_t s, uint32_t at, uint64_t pos, kvidx__hcache *hc) {
  kvidx__slot *sl = &ix->slots[s];
  kvidx__seq_delete(ix, &sl->seqs, at);
  sl->blocks--;
  ix->blocks--;
  kvidx__position_sub(ix, s, KVIDX__POS_RUN(pos), KVIDX__POS_OFF(pos), (KVIDX__POS_TIERS(pos) & KVIDX__DEVBIT) != 0, 1,
                      hc);
}

KVIDX__PRIV void kvidx__unhold(kvidx *ix, uint32_t s, uint32_t at) {
  kvidx__unhold_cached(ix, s, at, kvidx__ld(&kvidx__map_at(&ix->slots[s].seqs, at)[1]), NULL);
}

KVIDX__PRIV void kvidx__clear_slot(kvidx *ix, uint32_t s) {
  kvidx__slot *sl = &ix->slots[s];
  const kvidx__mtab *t;
  uint64_t i;
  kvidx__map_settle(ix, &sl->seqs);
  t = kvidx__ld(&sl->seqs.tab);
  for (i = 0; t && sl->blocks && i <= t->mask;) { /* deletions shift later entries back: stay on i */
    if (kvidx__place_used(&sl->seqs, t, i)) kvidx__unhold(ix, s, KVIDX__CAST(uint32_t, i));
    else i++;
  }
  kvidx__slot_release(ix, s);
}

/* Prune by the eviction order until at most `limit` blocks remain, never the
 * protected seq (a store's parent). */
KVIDX__PRIV void kvidx__prune(kvidx *ix, size_t limit, uint32_t ps, const uint64_t *pseq) {
  /* ps: the storing worker; it keeps its slot and seq table even if emptied */
  kvidx__victim keep, top;
  int kept = 0;
  while (ix->blocks > limit) {
    KVIDX__A(uint64_t) *e = kvidx__heap_top(ix);
    uint32_t s;
    if (!e) break;
    s = ix->heap[0].slot;
    if (pseq && s == ps && ix->heap[0].seq == *pseq) { /* out of the order meanwhile */
      keep = ix->heap[0];
      kept = 1;
      kvidx__heap_pop(ix);
      continue;
    }
    top = ix->heap[0];
    kvidx__heap_pop(ix);
    kvidx__unhold(ix, s, kvidx__map_find(ix, &ix->slots[s].seqs, &top.seq));
    ix->pruned++;
    if (!ix->slots[s].blocks && s != ps) kvidx__slot_release(ix, s);
  }
  if (kept) {
    ix->heap[ix->heap_n] = keep;
    kvidx__heap_up(ix->heap, ix->heap_n++);
  }
}

/* A store's position, with what it needs of its run at hand: consecutive
 * blocks of one run look nothing up again. */
typedef struct {
  uint32_t r, off, len, kids;
  kvidx__run *rn;         /* the run (NULL at the root) */
  KVIDX__A(uint64_t) *lw; /* its locals */
  int made;               /* this store made the run and the cursor has stayed
                             in it (a made run it comes back to is logged as
                             grown: harmless, the rollback frees it first) */
  int logged;             /* its growth is in the undo log since the cursor came */
} kvidx__cursor;

/* What a store changed in runs that were there before it, so that a failed
 * store leaves them as they were: (run, length before) for a run it grew at
 * its end, (run, KVIDX__REJOINED) for a detached run it hung back.  8
 * records inline, then doubled through the hooks; a record is logged before
 * its change, so a failed doubling refuses the store with the log whole. */
#define KVIDX__REJOINED KVIDX__NONE
typedef struct {
  uint32_t *rec;
  size_t n, cap;
  uint32_t small[16];
} kvidx__undo;

KVIDX__PRIV int kvidx__undo_push(kvidx *ix, kvidx__undo *u, uint32_t r, uint32_t len) {
  if (u->n == u->cap) {
    uint32_t *g = KVIDX__CAST(uint32_t *, kvidx__alloc(ix, u->cap * 16));
    if (!g) return 0;
    memcpy(g, u->rec, u->n * 8);
    if (u->rec != u->small) kvidx__free(ix, u->rec, u->cap * 8);
    u->rec = g;
    u->cap *= 2;
  }
  u->rec[2 * u->n] = r;
  u->rec[2 * u->n + 1] = len;
  u->n++;
  return 1;
}

#ifndef KVIDX_NO_RUN_SPLIT
/* Whether this store grew run r past a length it logged, so that r's
 * blocks from there on are its own.  A move of r's rest must not take them
 * along: a failed store shortens r back to the logged length, not the run
 * the rest went to, which would keep them as positions nobody holds
 * (fuzz/BUGS.md, bug 11: a store that comes back into a run it grew, sent
 * there by a seq it already holds). */
KVIDX__PRIV int kvidx__undo_grew(const kvidx__undo *u, uint32_t r, uint32_t len) {
  size_t j;
  for (j = 0; j < u->n; j++)
    if (u->rec[2 * j] == r && u->rec[2 * j + 1] != KVIDX__REJOINED && u->rec[2 * j + 1] < len) return 1;
  return 0;
}
#endif

/* A failed store's growth of run r taken back: it is `len` long again.
 * The positions past len are this store's, nobody holds them any more and
 * nothing hangs below them (the rollback let go of them first; a run hung
 * back below one stays only if its detach found its chain taken, a chain
 * collision, and then hangs past the run's end, out of every walk). */
KVIDX__PRIV void kvidx__run_shorten(kvidx *ix, uint32_t r, uint32_t len) {
  kvidx__run *rn = kvidx__run_at(ix, r);
  uint32_t shape = kvidx__ld(&rn->shape), now = KVIDX__LEN(shape);
  if (now <= len) return; /* freed (length 0), or already back */
  if (ix->chain_hint_run == r && ix->chain_hint_off >= len) ix->chain_hint_run = KVIDX__NONE;
  kvidx__run_wbegin(rn);
  kvidx__st(&rn->shape, KVIDX__SHAPE(len, KVIDX__POFF(shape), KVIDX__LCLS(shape), KVIDX__HCLS(shape)));
  kvidx__run_wend(rn);
  ix->entries -= now - len;
}

#ifndef KVIDX_NO_RUN_SPLIT
/* Worker s's seq entry for (r, off) if its seq table holds `seq` there
 * (a block held under one seq has one entry), else KVIDX__NONE. */
KVIDX__PRIV uint32_t kvidx__seq_at(kvidx *ix, uint32_t s, uint32_t r, uint32_t off, uint64_t seq) {
  kvidx__map *m = &ix->slots[s].seqs;
  uint32_t at = kvidx__map_find(ix, m, &seq);
  uint64_t pos;
  if (at == KVIDX__NONE) return KVIDX__NONE;
  pos = kvidx__ld(&kvidx__map_at(m, at)[1]);
  return KVIDX__POS_RUN(pos) == r && KVIDX__POS_OFF(pos) == off ? at : KVIDX__NONE;
}

/* ---- a run's tail moves out ------------------------------------------------
 * A store that leaves run r after its block k - 1 (its next block is not
 * r's block k) would start a run of its own there.  Instead, when it can,
 * r's blocks k.. move to a new run hung below (r, k - 1) and the store goes
 * on at r's end, in place.  Why: conversations.  A turn's prompt is the
 * last turn's up to where that one's partial block and output began, so a
 * run per turn hangs below the last and a long conversation's query reads
 * a run per turn, each a dependent load (W16 C16384's slowest 1%: 11 runs
 * for 45 blocks, a turn adding one block each); with the tails moved out
 * the conversation is one run of up to 64 blocks and the old turns' tails
 * hang off it.  The tail's holders keep every block and cutoff; their seq
 * entries point at the new run.  They are found by folding the tail's
 * locals onto the store's own seq for block k - 1 (seq_before), as
 * kvidx_seq_hashes does, or else from the run's seq hints (the seqs a
 * worker with its own engine's hashes stored its blocks under), and each is
 * believed only if it names the very block it should (a block held under
 * one seq has one entry): so a split happens where the tail's holders hash
 * as the store's worker does (Dynamo's hashing) or put the blocks there
 * themselves; a holder with other engine hashes that no hint names, or two
 * seqs for a tail block, keeps the run as it is.  Not with tiers (device bits) or
 * in caller-buffer mode (whose size bound counts the chunks a store makes), not when a child hangs
 * at k or later (kid_hi: those would have to move too), nor past
 * KVIDX__SPLIT_HOLDERS holders or KVIDX__SPLIT_SEQS seq entries to update;
 * nor (the caller's test, kvidx__undo_grew) in a run the store has grown.
 * Semantics do not change: the same workers hold the same chains, and the
 * index's entries stay as many.  1 if done; 0 with nothing changed. */
#define KVIDX__SPLIT_HOLDERS 8u /* holders of the tail */
#define KVIDX__SPLIT_SEQS 16u
KVIDX__PRIV int kvidx__run_split(kvidx *ix, uint32_t r, uint32_t k, uint64_t seq_before, size_t left,
                                  kvidx__hcache *hc) {
  kvidx__run *rn = kvidx__run_at(ix, r);
  uint32_t shape = kvidx__ld(&rn->shape), len = KVIDX__LEN(shape), nh = KVIDX__NHOLD(kvidx__ld(&rn->nhold));
  uint32_t tail = len - k, j, kept = 0, moving = 0, nseq = 0, t, li, hi, count, moved_slot[KVIDX__SPLIT_HOLDERS];
  uint32_t idx[KVIDX__SPLIT_HOLDERS], slot[KVIDX__SPLIT_HOLDERS], seq_at[KVIDX__SPLIT_SEQS], nmoved = 0;
  uint32_t moved_to[KVIDX__SPLIT_HOLDERS];
  unsigned char seq_off[KVIDX__SPLIT_SEQS], lc, hcl;
  uint64_t low[KVIDX__SPLIT_HOLDERS], high[KVIDX__SPLIT_HOLDERS], chain[KVIDX__RUN_MAX], e[5], any = 0;
  uint32_t hints;
  if (ix->tiers_on || ix->buffer_mode || k == 0 || k >= len || *kvidx__kid_hi(ix, r) > k) return 0;
  kvidx__hcache_flush(ix, hc); /* every holder entry current (and holdings may move below) */
  /* from the holder list alone: the tail's holders (idx, slot), at most
   * how many seq entries they have there (their tops); and the lines the
   * move will most likely read asked for at once: their holdings and their
   * seq entries for block k */
  chain[0] = kvidx_seq_hash_next(seq_before, kvidx__local_at(ix, rn, k));
  for (j = 0; j < nh; j++) {
    uint64_t v = kvidx__ld(kvidx__holder(ix, rn, j)), key;
    uint32_t top = KVIDX__HOLDER_TOP(v);
    if (top <= k) {
      kept++;
      continue;
    }
    if (moving == KVIDX__SPLIT_HOLDERS || (nseq += top - k) > KVIDX__SPLIT_SEQS) return 0;
    idx[moving] = j;
    slot[moving++] = KVIDX__CAST(uint32_t, v & 0xFFFFFFFFu);
    key = (KVIDX__CAST(uint64_t, v & 0xFFFFFFFFu) + 1) << 32 | r;
    kvidx__map_prefetch(&ix->holds, kvidx__key_hash(ix->seed, &key, 1), 1);
    kvidx__map_prefetch(&ix->slots[v & 0xFFFFFFFFu].seqs, kvidx__key_hash(ix->seed, &chain[0], 1), 1);
  }
  /* a rest nobody holds stays (cutting it would change the index's
   * entries, which a store that fails later must leave as they were) */
  if (!moving) return 0;
  /* and the child map's place for the tail, the free chunks and run
   * record it would take (their links) */
  lc = KVIDX__CAST(unsigned char, kvidx__class_of(tail));
  hcl = KVIDX__CAST(unsigned char, kvidx__class_of(moving));
  if (ix->words.free_head[lc] != KVIDX__NONE) KVIDX__PREFETCH(kvidx__word(ix, ix->words.free_head[lc]));
  if (ix->words.free_head[hcl] != KVIDX__NONE) KVIDX__PREFETCH(kvidx__word(ix, ix->words.free_head[hcl]));
  if (ix->run_free != KVIDX__NONE) KVIDX__PREFETCH(kvidx__run_at(ix, ix->run_free));
  kvidx__child_prefetch(ix, r, k - 1, kvidx__local_at(ix, rn, k));
  for (j = 0; j < moving; j++) { /* their blocks before k and from k */
    KVIDX__A(uint64_t) *h = kvidx__map_at(&ix->holds, kvidx__hold_find(ix, slot[j], r));
    uint64_t held = kvidx__ld(&h[KVIDX__H_HELD]);
    if (kvidx__ld(&h[KVIDX__H_MULTI]) >> k) return 0; /* a tail block under two seqs */
    low[j] = held & ((KVIDX__CAST(uint64_t, 1) << k) - 1);
    high[j] = held >> k;
    any |= high[j];
    kept += low[j] != 0;
  }
  if (!kept) return 0; /* (the store's own worker holds block k - 1: not met, a guard) */
  for (j = 1; j <= kvidx__log2(any); j++) chain[j] = kvidx_seq_hash_next(chain[j - 1], kvidx__local_at(ix, rn, k + j));
  hints = ix->hints_on ? *kvidx__hints_of(ix, r) : KVIDX__NONE;
  for (j = 0, nseq = 0; j < moving; j++) { /* each tail block's seq entry: the folded chain, or the hint */
    uint64_t bits = high[j];
    for (; bits; bits &= bits - 1) {
      uint32_t o = kvidx__ctz64(bits), at = kvidx__seq_at(ix, slot[j], r, k + o, chain[o]);
      if (at == KVIDX__NONE && hints != KVIDX__NONE)
        at = kvidx__seq_at(ix, slot[j], r, k + o, kvidx__ld(kvidx__word(ix, hints + k + o)));
      if (at == KVIDX__NONE) return 0; /* hashed otherwise, and no hint names it */
      seq_at[nseq] = at;
      seq_off[nseq++] = KVIDX__CAST(unsigned char, o);
    }
  }
  /* room, before anything changes: the rest's holdings and one for each
   * of the store's `left` blocks (its own reservation counted those, not
   * these), and the places of the holdings that leave r may stay deleted */
  if (kvidx__map_reserve_over(ix, &ix->holds, moving + KVIDX__CAST(uint64_t, left), moving) != KVIDX_OK ||
      kvidx__map_reserve(ix, &ix->children, 1) != KVIDX_OK ||
      kvidx__grow_reserve(ix, &ix->runs, KVIDX__CAST(uint64_t, ix->runs_hw) + 1) != KVIDX_OK ||
      kvidx__grow_reserve(ix, &ix->chains, KVIDX__CAST(uint64_t, ix->runs_hw) + 1) != KVIDX_OK ||
      kvidx__grow_reserve(ix, &ix->kid_hi, KVIDX__CAST(uint64_t, ix->runs_hw) + 1) != KVIDX_OK ||
      kvidx__grow_reserve(ix, &ix->hints, KVIDX__CAST(uint64_t, ix->runs_hw) + 1) != KVIDX_OK)
    return 0;
  if ((li = kvidx__chunk_alloc(ix, lc)) == KVIDX__NONE) return 0;
  if ((hi = kvidx__chunk_alloc(ix, hcl)) == KVIDX__NONE) {
    kvidx__chunk_free(ix, li, lc);
    return 0;
  }
  /* the tail's run (chain memo 0: chain[0] is the store's worker's
   * hashing, maybe not the chain) */
  t = kvidx__run_id(ix);
  kvidx__words_copy(ix, li, kvidx__ld(&rn->locals) + k, tail);
  for (j = 0; j < moving; j++) kvidx__st(kvidx__word(ix, hi + j), kvidx__holder_word(slot[j], high[j]));
  kvidx__run_publish(ix, t, r, li, hi, moving, KVIDX__SHAPE(tail, k - 1, lc, hcl), kvidx__local_at(ix, rn, k), 0);
  if (hints != KVIDX__NONE) { /* the rest's hints go with it (best effort) */
    uint32_t th = kvidx__chunk_alloc(ix, lc);
    if (th != KVIDX__NONE) kvidx__words_copy(ix, th, hints + k, tail);
    *kvidx__hints_of(ix, t) = th;
  }
  for (j = 0; j < moving; j++) { /* the tail's holdings */
    e[0] = (KVIDX__CAST(uint64_t, slot[j]) + 1) << 32 | t;
    e[KVIDX__H_HELD] = high[j];
    e[KVIDX__H_MULTI] = 0;
    e[KVIDX__H_INDEX] = j;
    e[4] = 0;
    kvidx__map_insert(ix, &ix->holds, e);
  }
  for (j = 0, nseq = 0; j < moving; j++) { /* their seq entries (tag and tier bits stay) */
    uint64_t bits = high[j];
    for (; bits; bits &= bits - 1, nseq++) {
      KVIDX__A(uint64_t) *p = &kvidx__map_at(&ix->slots[slot[j]].seqs, seq_at[nseq])[1];
      uint64_t pos = kvidx__ld(p);
      kvidx__st(p, KVIDX__CAST(uint64_t, t) << 32 | (pos & 0xFFFF00FFu) | KVIDX__CAST(uint64_t, seq_off[nseq]) << 8);
    }
  }
  /* r ends at k: the tail's holders keep their blocks before k, or leave
   * (the last entry fills the gap, from the highest index down, so the
   * entries that move are ones that stay) */
  count = nh;
  KVIDX_TEST_HOOK(ix, 12); /* the tail's run published, r still whole */
  kvidx__run_wbegin(rn);
  KVIDX_TEST_HOOK(ix, 13); /* r being shortened */
  for (j = 0; j < moving; j++)
    if (low[j]) kvidx__st(kvidx__holder(ix, rn, idx[j]), kvidx__holder_word(slot[j], low[j]));
  for (j = moving; j-- > 0;)
    if (!low[j] && idx[j] != --count) {
      KVIDX__A(uint64_t) *src = kvidx__holder(ix, rn, count);
      uint64_t v = kvidx__ld(src);
      kvidx__st(kvidx__holder(ix, rn, idx[j]), v);
      moved_slot[nmoved] = KVIDX__CAST(uint32_t, v & 0xFFFFFFFFu);
      moved_to[nmoved++] = idx[j];
    }
  kvidx__st(&rn->nhold, (kvidx__ld(&rn->nhold) & 0xFFFF0000u) | count);
  kvidx__st(&rn->shape, KVIDX__SHAPE(k, KVIDX__POFF(shape), KVIDX__LCLS(shape), KVIDX__HCLS(shape)));
  kvidx__run_wend(rn); /* the store now writes r's blocks from k on, which a reader that took r's old
                          length may read: wbegin's release fence put them after the version change */
  for (j = 0; j < moving; j++) /* their holdings of r (entries move only on deletion: last) */
    if (low[j]) kvidx__st(&kvidx__map_at(&ix->holds, kvidx__hold_find(ix, slot[j], r))[KVIDX__H_HELD], low[j]);
  for (j = 0; j < nmoved; j++)
    kvidx__st(&kvidx__map_at(&ix->holds, kvidx__hold_find(ix, moved_slot[j], r))[KVIDX__H_INDEX],
              KVIDX__CAST(uint64_t, moved_to[j]));
  for (j = 0; j < moving; j++)
    if (!low[j]) kvidx__map_delete(ix, &ix->holds, kvidx__hold_find(ix, slot[j], r));
  if (ix->chain_hint_run == r && ix->chain_hint_off >= k) {
    ix->chain_hint_run = t;
    ix->chain_hint_off -= k;
  }
  return 1;
}
#endif

KVIDX__PRIV void kvidx__cursor_at(const kvidx *ix, kvidx__cursor *c, uint32_t r, uint32_t off) {
  c->r = r;
  c->off = off;
  c->made = c->logged = 0;
  if (r == KVIDX__NONE) { /* the root: its children are root runs */
    c->len = 0;
    c->kids = 1;
    c->rn = NULL;
    c->lw = NULL;
  } else {
    kvidx__run *rn = c->rn = kvidx__run_at(ix, r);
    c->len = KVIDX__LEN(kvidx__ld(&rn->shape));
    c->kids = kvidx__ld(&rn->kids);
    c->lw = kvidx__word(ix, kvidx__ld(&rn->locals));
  }
}

/* Where block `local` goes after the cursor's position: along the run, into
 * a child run, a detached run hung back, appended to the run's end, or a
 * new run.  chain: the block's chain hash, when the index has detached runs
 * (else 0): a position this store is about to make may be one of them.
 * seq_before: the store's seq for the block at the cursor (a new run's
 * place may go to the store when the run's tail can move out:
 * kvidx__run_split).  own: the block itself when its worker leaves seq
 * hints (kvidx__hints_put), else NULL.
 * Changes to runs that were there go into the undo log. */
KVIDX__PRIV int kvidx__advance(kvidx *ix, kvidx__cursor *c, uint64_t local, size_t hint, uint64_t chain,
                               uint64_t seq_before, const kvidx_block *own, kvidx__undo *u, kvidx__hcache *hc) {
  uint32_t ch;
  if (c->off + 1 < c->len && kvidx__ld(&c->lw[c->off + 1]) == local) {
    c->off++;
    return KVIDX_OK;
  }
  if (c->kids && (ch = kvidx__child_find(ix, c->r, c->off, local)) != KVIDX__NONE) {
    if (c->kids == 1 && c->rn && kvidx__ld(&c->rn->cont) != ch) /* the only child: name it (the hint named */
      kvidx__hint_set(c->rn, ch, c->off);                          /* one let go of, or nothing) */
    kvidx__cursor_at(ix, c, ch, 0);
    return KVIDX_OK;
  }
  if (ix->detached && ix->det_filter[KVIDX__DET_SLOT(chain)] &&
      (ch = kvidx__child_find(ix, KVIDX__NONE, KVIDX__DETACHED, chain)) != KVIDX__NONE) {
    /* the prefix is back: so is what hung below it (the key below the
     * cursor is free: the child lookup above missed) */
    if (!kvidx__undo_push(ix, u, ch, KVIDX__REJOINED)) return kvidx__oom(ix);
    kvidx__run_move(ix, ch, c->r, c->off, local);
    kvidx__cursor_at(ix, c, ch, 0);
    return KVIDX_OK;
  }
  if (ix->entries >= ix->max_entries) return KVIDX_EFULL;
#ifndef KVIDX_NO_RUN_SPLIT
  if (c->r != KVIDX__NONE && c->off + 1 < c->len && !kvidx__undo_grew(u, c->r, c->len) &&
      kvidx__run_split(ix, c->r, c->off + 1, seq_before, hint, hc)) {
    /* the run ends here now, and nothing hangs past here: its end grows */
    c->len = c->off + 1;
    c->kids = 0;
  }
#else
  (void)seq_before, (void)hc;
#endif
  if (c->r != KVIDX__NONE && c->off + 1 == c->len && c->len < KVIDX__RUN_MAX) {
    /* the run's end: grow it in place (holders' cutoffs stay as they are) */
    if (!c->made && !c->logged) {
      if (!kvidx__undo_push(ix, u, c->r, c->len)) return kvidx__oom(ix);
      c->logged = 1;
    }
    if (!kvidx__run_append(ix, c->r, c->rn, &c->lw, local)) return kvidx__oom(ix);
    c->len++;
    c->off++;
#ifndef KVIDX_NO_RUN_SPLIT
    if (own) kvidx__hints_put(ix, c->r, c->off, own, 1);
#endif
    return KVIDX_OK;
  }
  if ((ch = kvidx__run_new(ix, c->r, c->off, local, hint, chain)) == KVIDX__NONE) return kvidx__oom(ix);
  kvidx__cursor_at(ix, c, ch, 0);
  c->made = 1;
#ifndef KVIDX_NO_RUN_SPLIT
  if (own) kvidx__hints_put(ix, ch, 0, own, 1);
#else
  (void)own;
#endif
  return KVIDX_OK;
}

/* How many distinct seqs of b the worker does not hold yet: sorted scratch
 * when it can have some (O(n log n)), pairwise otherwise. */
KVIDX__PRIV int kvidx__cmp_u64(const void *a, const void *b) {
  uint64_t x = *KVIDX__CAST(const uint64_t *, a), y = *KVIDX__CAST(const uint64_t *, b);
  return x < y ? -1 : x > y;
}

KVIDX__PRIV size_t kvidx__fresh_seqs(kvidx *ix, uint32_t s, const kvidx_block *b, size_t n) {
  uint64_t *v = n > 32 ? KVIDX__CAST(uint64_t *, kvidx__alloc(ix, n * 8)) : NULL;
  size_t i, j, m = 0, fresh = 0;
  for (i = 0; i < n; i++) {
    int seen = s != KVIDX__NONE && kvidx__map_find(ix, &ix->slots[s].seqs, &b[i].seq) != KVIDX__NONE;
    if (v) {
      if (!seen) v[m++] = b[i].seq;
      continue;
    }
    for (j = 0; j < i && !seen; j++) seen = b[j].seq == b[i].seq;
    fresh += !seen;
  }
  if (!v) return fresh;
  qsort(v, m, 8, kvidx__cmp_u64);
  for (i = 0; i < m; i++) fresh += !i || v[i] != v[i - 1];
  kvidx__free(ix, v, n * 8);
  return fresh;
}

/* A store's put into its worker's plain seq table (words w, table t) at
 * the free place `at` its probe found: the entry, then the control byte. */
KVIDX__HOT void kvidx__seq_put(KVIDX__A(uint64_t) *w, kvidx__mtab *t, uint32_t at, uint64_t seq, uint64_t pos,
                               uint64_t h) {
  KVIDX__A(uint64_t) *e = w + 2 * KVIDX__CAST(size_t, at);
  kvidx__st(&e[0], seq);
  kvidx__st_rel(&e[1], pos);
  if (t->ctrl) kvidx__ctrl_fill(t, at, KVIDX__CTRL_BYTE(h));
}

/* A store at block j asks for the seq line of block j + KVIDX__AHEAD (its
 * hash kept in homes until that block's turn). */
KVIDX__HOT void kvidx__store_ahead(const kvidx *ix, const kvidx__seqview *sv, uint64_t *homes, const kvidx_block *b,
                                   size_t j, size_t n) {
  if (j + KVIDX__AHEAD < n)
    kvidx__seqview_prefetch(sv, homes[j % KVIDX__AHEAD] = kvidx__key_hash(ix->seed, &b[j + KVIDX__AHEAD].seq, 1), 1);
}

/* A store's stretch of new blocks at the end of the cursor's run (a run
 * this store made or logged, nothing below it, its holding cached in hc):
 * blocks i.. of b, block i new (the caller probed it: its seq's hash hi,
 * its free place free_at; the next blocks' hashes are in homes, as the
 * caller's loop keeps them).  Each block's seq is probed and put in turn
 * (a put moves the next probe's free place) and its local written past the
 * run's length; at the end the run takes them all in one write (one
 * seqlock section, one length) and the holding its bits in one word.
 * Stops before a block the worker holds (the caller probes it again), at
 * the run's 64th block and at max_entries.  Nothing can run out part way:
 * a locals chunk too small is replaced first, and if that fails, 0 with
 * nothing changed (the caller's general path takes block i).  The plain
 * seq table only (two words, not draining).  own: the worker leaves seq
 * hints (kvidx__hints_put).  Returns the blocks taken;
 * the caller counts them.  Two blocks in three of W16 C16384's stores come
 * this way: its store path 10% fewer instructions, events 0.93x the time. */
KVIDX__PRIV size_t kvidx__store_tail(kvidx *ix, kvidx__cursor *cur, const kvidx__seqview *sv, kvidx__hcache *hc,
                                     const kvidx_block *b, size_t i, size_t n, uint64_t *homes, uint64_t hi,
                                     uint32_t free_at, uint32_t tbit, int dev, int own) {
  kvidx__run *rn = cur->rn;
  uint32_t shape = kvidx__ld(&rn->shape), len = KVIDX__LEN(shape), nli;
  KVIDX__A(uint64_t) *lw, *h = hc->h;
  uint64_t held = kvidx__ld(&h[KVIDX__H_HELD]), room = KVIDX__RUN_MAX - len, ones, mask;
  uint64_t pos0 = KVIDX__POS(cur->r, 0, tbit), hj = hi; /* the caller's loop has moved homes[i] on */
  KVIDX__A(uint64_t) *sw = sv->w; /* the fields in locals: the stores below may alias them */
  kvidx__mtab *t = sv->t;
  size_t j = i, k; /* no bit of held is past len (kvidx__check_holdings) */
  if (room > n - i) room = n - i;
  if (room > ix->max_entries - ix->entries) room = ix->max_entries - ix->entries;
  /* room for the whole stretch before anything changes */
  if ((lw = kvidx__run_room(ix, rn, cur->lw, len + KVIDX__CAST(uint32_t, room), &shape, &nli)) == NULL) return 0;
  for (;;) { /* block j is new: its seq goes to free_at, its local past the length */
    uint64_t at = len + (j - i);
    kvidx__seq_put(sw, t, free_at, b[j].seq, pos0 | at << 8 | KVIDX__POS_TAG(hj), hj);
    kvidx__st(&lw[at], b[j].local);
    if (++j - i == room) break;
    hj = homes[j % KVIDX__AHEAD];
    if (kvidx__seqview_find(sv, b[j].seq, hj, &free_at) != KVIDX__NONE) break; /* held: homes[j] stays */
    kvidx__store_ahead(ix, sv, homes, b, j, n); /* as the caller's loop does, a step later */
  }
  k = j - i;
  kvidx__run_take(ix, cur->r, rn, shape, KVIDX__CAST(uint32_t, k), nli);
#ifndef KVIDX_NO_RUN_SPLIT
  if (own) kvidx__hints_put(ix, cur->r, len, b + i, k);
#else
  (void)own;
#endif
  ones = k == 64 ? ~KVIDX__CAST(uint64_t, 0) : (KVIDX__CAST(uint64_t, 1) << k) - 1;
  mask = ones << len;
  kvidx__st(&h[KVIDX__H_HELD], held | mask);
  if (dev) kvidx__st(&h[ix->hdev], kvidx__ld(&h[ix->hdev]) | mask); /* hdev is the held word without tiers */
  cur->lw = lw;
  cur->len = len + KVIDX__CAST(uint32_t, k);
  cur->off = cur->len - 1;
  return k;
}

/* detached: block 0 continues a prefix nobody holds; its local is its chain
 * (a dump's record of a detached run, kvidx_event.detached). */
KVIDX__PRIV int kvidx__ix_store(kvidx *ix, uint64_t id, uint32_t rank, const uint64_t *parent, const kvidx_block *b,
                                size_t n, int tier, uint64_t expires, int detached) {
  uint32_t s = kvidx__slot_of(ix, id, rank), r = KVIDX__NONE, off = 0, tbit = 1u << tier;
  kvidx__cursor cur;
  uint64_t stamp = ++ix->stamp;
  uint64_t held_small[16], *held = held_small; /* blocks found held */
  kvidx__hcache hc;
  kvidx__map spare;
  uint64_t homes[KVIDX__AHEAD]; /* seq hashes of the next blocks, computed once */
  uint64_t chain = 0;           /* the cursor's chain hash, if track and chain_ok */
  kvidx__seqview sv;            /* the worker's seq table, as pass 1 sees it */
  int plain;                    /* its puts: two words, straight */
  kvidx__undo undo;
  size_t i, lim = ix->max_blocks < n ? 0 : ix->max_blocks - n;
  int rc = KVIDX_OK, saw_held = 0, track, chain_ok = 0, tail = 0, own = 0;
  kvidx__slot *sl;
  for (i = 0; i < n && i < KVIDX__AHEAD; i++) /* the first blocks' seq lines, while the parent's loads */
    homes[i] = kvidx__key_hash(ix->seed, &b[i].seq, 1);
  if (s != KVIDX__NONE)
    for (i = 0; i < n && i < KVIDX__AHEAD; i++) kvidx__map_prefetch(&ix->slots[s].seqs, homes[i], 1);
  if (parent) {
    uint32_t at = s == KVIDX__NONE ? KVIDX__NONE : kvidx__map_find(ix, &ix->slots[s].seqs, parent);
    uint64_t pos;
    if (at == KVIDX__NONE) return KVIDX_ENOPARENT;
    pos = kvidx__ld(&kvidx__map_at(&ix->slots[s].seqs, at)[1]);
    r = KVIDX__POS_RUN(pos);
    off = KVIDX__POS_OFF(pos);
  }
  if (n == 0) return KVIDX_OK;
  if (n > KVIDX__ID_LIMIT) return KVIDX_EFULL;
  if (ix->evict) { /* every refusal comes before the prune: a refused store evicts nothing */
    if (n + (parent != NULL) > ix->max_blocks) return KVIDX_EFULL; /* could never fit */
    if (s == KVIDX__NONE && ix->slot_free == KVIDX__NONE) return KVIDX_EFULL; /* no worker slot */
    if (ix->entries + n > ix->max_entries) return KVIDX_EFULL; /* worst case; pruning only frees */
  }
  /* reserve first: after this only a holder list growing can run out */
  if ((rc = kvidx__shared_reserve(ix, n, ix->evict && ix->blocks > lim
                                              ? ix->blocks - (ix->evict_target < lim ? ix->evict_target : lim)
                                              : 0)) != KVIDX_OK ||
      (s == KVIDX__NONE && (rc = kvidx__map_reserve(ix, &ix->slot_map, 1)) != KVIDX_OK) ||
      (s != KVIDX__NONE && (rc = kvidx__map_reserve(ix, &ix->slots[s].seqs, n)) != KVIDX_OK) ||
      (rc = kvidx__heap_reserve(ix, n)) != KVIDX_OK)
    return rc;
  if (s == KVIDX__NONE) { /* a new worker: its seq table too before anything changes */
    kvidx__map_init(&spare, kvidx__seq_words(ix), 1, 1, 0);
    spare.seq = 1;
    if ((rc = kvidx__seq_reserve_new(ix, &spare, n)) != KVIDX_OK) return rc;
  }
  if (ix->evict && ix->blocks > lim) /* make room: the store then fits */
    kvidx__prune(ix, ix->evict_target < lim ? ix->evict_target : lim, s, parent);
  if (!ix->evict && ix->blocks + n > ix->max_blocks && ix->blocks + kvidx__fresh_seqs(ix, s, b, n) > ix->max_blocks)
    rc = KVIDX_EFULL; /* near the limit: count exactly, as the reference does */
  if (rc == KVIDX_OK && s == KVIDX__NONE && ix->slot_free == KVIDX__NONE) rc = KVIDX_EFULL;
  if (rc != KVIDX_OK) {
    if (s == KVIDX__NONE) kvidx__map_drop(ix, &spare);
    return rc;
  }
  if (s == KVIDX__NONE) {
    s = kvidx__slot_alloc(ix, id, rank);
    kvidx__map_move(&ix->slots[s].seqs, &spare);
  }
  sl = &ix->slots[s];
#ifndef KVIDX_NO_RUN_SPLIT
  if (ix->hints_on && !detached) { /* its seqs: Dynamo's folding or its own (then it leaves hints) */
    if (!sl->hashing)
      sl->hashing = b[0].seq == (parent ? kvidx_seq_hash_next(*parent, b[0].local) : b[0].local) ? 1 : 2;
    own = sl->hashing == 2;
  }
#endif
  if (n > 64 * 16) { /* which blocks were held: a rollback takes exactly the others back */
    held = KVIDX__CAST(uint64_t *, kvidx__alloc(ix, (n + 63) / 64 * 8));
    if (!held) {
      if (!sl->blocks) kvidx__slot_release(ix, s);
      return kvidx__oom(ix);
    }
  }
  if (n <= 64) held[0] = 0; /* most stores: no call */
  else memset(held, 0, (n + 63) / 64 * 8);
  undo.rec = undo.small;
  undo.n = 0;
  undo.cap = 8;
  hc.run = hc.at = KVIDX__NONE;
  hc.h = NULL;
  if (detached) off = KVIDX__DETACHED;
  kvidx__cursor_at(ix, &cur, r, off);
  /* while detached runs exist (only this store can add one), a block's
   * chain tells whether a position it makes is one of them; it is folded
   * from the runs only when a new block needs it (not for held ones) */
  track = ix->detached || detached;
  kvidx__seqview_of(&sv, &sl->seqs);
  plain = !ix->evict && !sv.draining;
  for (i = 0; i < n; i++) { /* pass 1: new blocks; held ones are left as they are */
    uint32_t free_at = KVIDX__NONE, at;
    uint64_t h = homes[i % KVIDX__AHEAD], pos;
    kvidx__store_ahead(ix, &sv, homes, b, i, n); /* the seq table's line for a block further on */
    at = kvidx__seqview_find(&sv, b[i].seq, h, &free_at);
    if (at != KVIDX__NONE) { /* the run goes on from the held block */
      pos = kvidx__ld(&kvidx__map_at(&sl->seqs, at)[1]);
      kvidx__cursor_at(ix, &cur, KVIDX__POS_RUN(pos), KVIDX__POS_OFF(pos));
      chain_ok = 0;
      saw_held = 1;
      held[i >> 6] |= KVIDX__CAST(uint64_t, 1) << (i & 63);
      tail = 0;
      continue;
    }
    if (tail && plain && hc.run == cur.r && ix->entries < ix->max_entries) {
      /* the commonest case: new blocks at the end of a run this store made
       * or logged, its holding at hand (kvidx__store_tail) */
      size_t k = kvidx__store_tail(ix, &cur, &sv, &hc, b, i, n, homes, h, free_at, tbit, tier == KVIDX_TIER_DEVICE, own);
      if (k) {
        sl->seqs.n += KVIDX__CAST(uint32_t, k);
        sl->blocks += k;
        ix->blocks += k;
        tail = cur.len < KVIDX__RUN_MAX;
        i += k - 1;
        continue;
      }
    }
    if (tail && ix->entries < ix->max_entries) {
      /* the common case: one more block at the end of a run this store made
       * or already logged, with nothing below it (kvidx__advance's last
       * case without the cases before it) */
      if (!kvidx__run_append(ix, cur.r, cur.rn, &cur.lw, b[i].local)) {
        rc = kvidx__oom(ix);
        break;
      }
      cur.off = cur.len++;
#ifndef KVIDX_NO_RUN_SPLIT
      if (own) kvidx__hints_put(ix, cur.r, cur.off, &b[i], 1);
#endif
      tail = cur.len < KVIDX__RUN_MAX;
    } else {
      if (track) {
        if (cur.r == KVIDX__NONE) chain = b[i].local; /* a root or detached store's first block */
        else chain = kvidx_seq_hash_next(chain_ok ? chain : kvidx__chain_at(ix, cur.r, cur.off), b[i].local);
        chain_ok = 1;
      }
      if ((rc = kvidx__advance(ix, &cur, b[i].local, n - i, chain, i ? b[i - 1].seq : parent ? *parent : 0,
                               own ? &b[i] : NULL, &undo, &hc)) != KVIDX_OK) {
        kvidx__run_release(ix, cur.r); /* a run made for this block and left empty */
        break;
      }
      /* at the end of a run this store made or logged, nothing below it: the
       * next new blocks append there (the run's kids cannot change while the
       * cursor stays) */
      tail = !track && cur.rn && cur.off + 1 == cur.len && cur.len < KVIDX__RUN_MAX && !cur.kids &&
             (cur.made || cur.logged);
    }
    if ((rc = kvidx__position_add(ix, s, cur.r, cur.off, tier == KVIDX_TIER_DEVICE, &hc)) != KVIDX_OK) {
      kvidx__run_release(ix, cur.r);
      break;
    }
    pos = KVIDX__POS(cur.r, cur.off, tbit) | KVIDX__POS_TAG(h);
    if (!plain) {
      uint64_t e[4];
      e[0] = b[i].seq;
      e[1] = pos;
      if (ix->evict) {
        kvidx__keys(ix->evict, stamp, &ix->seqno, i, expires, &e[2], &e[3]);
        kvidx__heap_push(ix, s, b[i].seq, e[2], e[3]);
      }
      kvidx__map_put_at(&sl->seqs, free_at, e, h);
    } else { /* a two-word entry */
      kvidx__seq_put(sv.w, sv.t, free_at, b[i].seq, pos, h);
      sl->seqs.n++;
    }
    sl->blocks++;
    ix->blocks++;
  }
  kvidx__hcache_flush(ix, &hc);
  if (rc != KVIDX_OK) { /* roll back: runs hung back detach again, this call's seqs go (newest
                          first), runs it grew get their length back */
    size_t j;
    for (j = undo.n; j-- > 0;) {
      kvidx__run *kn = kvidx__run_at(ix, undo.rec[2 * j]);
      /* hung below a run or at the root; the failed block's own may be
       * detached already (the only detach since), the others' old keys are
       * free again */
      if (undo.rec[2 * j + 1] == KVIDX__REJOINED &&
          (kvidx__ld(&kn->parent) != KVIDX__NONE || KVIDX__POFF(kvidx__ld(&kn->shape)) != KVIDX__DETACHED))
        kvidx__run_detach(ix, undo.rec[2 * j]);
    }
    while (i-- > 0)
      if (!(held[i >> 6] >> (i & 63) & 1)) kvidx__unhold(ix, s, kvidx__map_find(ix, &sl->seqs, &b[i].seq));
    for (j = undo.n; j-- > 0;)
      if (undo.rec[2 * j + 1] != KVIDX__REJOINED) kvidx__run_shorten(ix, undo.rec[2 * j], undo.rec[2 * j + 1]);
    if (undo.rec != undo.small) kvidx__free(ix, undo.rec, undo.cap * 8);
    if (held != held_small) kvidx__free(ix, held, (n + 63) / 64 * 8);
    if (!sl->blocks) kvidx__slot_release(ix, s);
    return rc;
  }
  if (undo.rec != undo.small) kvidx__free(ix, undo.rec, undo.cap * 8);
  if (held != held_small) kvidx__free(ix, held, (n + 63) / 64 * 8);
  if (track && chain_ok) { /* where the worker's next store (a decode step) most likely goes on */
    ix->chain_hint_run = cur.r;
    ix->chain_hint_off = cur.off;
    ix->chain_hint = chain;
  }
  for (i = 0; saw_held && i < n; i++) { /* pass 2, once nothing can fail: a held block */
    uint32_t at = kvidx__map_find(ix, &sl->seqs, &b[i].seq); /* gains the tier and a later expiry */
    KVIDX__A(uint64_t) *e = kvidx__map_at(&sl->seqs, at);
    uint64_t pos = kvidx__ld(&e[1]);
    if (!(KVIDX__POS_TIERS(pos) & tbit)) {
      kvidx__st(&e[1], pos | tbit);
      if (tier == KVIDX_TIER_DEVICE) kvidx__position_add_dev(ix, s, KVIDX__POS_RUN(pos), KVIDX__POS_OFF(pos));
    }
    if (ix->evict == KVIDX_EVICT_EXPIRY && expires && expires > kvidx__ld(&e[2])) {
      kvidx__st(&e[2], expires);
      kvidx__heap_push(ix, s, b[i].seq, expires, kvidx__ld(&e[3]));
    }
  }
  return KVIDX_OK;
}

KVIDX__PRIV int kvidx__ix_remove(kvidx *ix, uint64_t id, uint32_t rank, const uint64_t *seq, size_t n, int tier) {
  uint32_t s = kvidx__slot_of(ix, id, rank);
  size_t i, unknown = 0;
  kvidx__hcache hc;
  uint64_t homes[KVIDX__AHEAD]; /* seq hashes of the next seqs, computed once */
  kvidx__seqview sv;
  if (s == KVIDX__NONE) return n ? KVIDX_ENOENT : KVIDX_OK;
  hc.run = hc.at = KVIDX__NONE;
  hc.h = NULL;
  kvidx__seqview_of(&sv, &ix->slots[s].seqs);
  for (i = 0; i < n && i < KVIDX__AHEAD; i++) /* a deletion's shift reads on: two lines */
    kvidx__seqview_prefetch(&sv, homes[i] = kvidx__key_hash(ix->seed, &seq[i], 1), 2);
  for (i = 0; i < n; i++) {
    uint64_t h = homes[i % KVIDX__AHEAD], pos;
    uint32_t at, tiers, tb;
    KVIDX__A(uint64_t) *e;
    if (i + KVIDX__AHEAD < n)
      kvidx__seqview_prefetch(&sv, homes[i % KVIDX__AHEAD] = kvidx__key_hash(ix->seed, &seq[i + KVIDX__AHEAD], 1), 2);
    at = kvidx__seqview_find(&sv, seq[i], h, NULL);
    if (at == KVIDX__NONE) {
      unknown++;
      continue;
    }
    e = sv.draining ? kvidx__map_at(sv.m, at) : sv.w + KVIDX__CAST(size_t, at) * sv.ew;
    pos = kvidx__ld(&e[1]);
    tiers = KVIDX__POS_TIERS(pos);
    tb = tier == KVIDX_TIER_ALL ? tiers : (1u << tier);
    if (!(tiers & tb)) {
      unknown++; /* no copy on that tier */
    } else if (tiers == tb) {
      kvidx__unhold_cached(ix, s, at, pos, &hc);
    } else { /* another tier's copy stays */
      kvidx__st(&e[1], pos & ~KVIDX__CAST(uint64_t, tb));
      if (tb & KVIDX__DEVBIT) kvidx__position_sub(ix, s, KVIDX__POS_RUN(pos), KVIDX__POS_OFF(pos), 1, 0, &hc);
    }
  }
  kvidx__hcache_flush(ix, &hc);
  if (!ix->slots[s].blocks) kvidx__slot_release(ix, s);
  else kvidx__map_tidy(ix, &ix->slots[s].seqs, kvidx__drain_step(&ix->slots[s].seqs, n));
  return unknown ? KVIDX_ENOENT : KVIDX_OK;
}

KVIDX__PRIV size_t kvidx__ix_expire(kvidx *ix, uint64_t now) {
  size_t n = 0;
  KVIDX__A(uint64_t) *e;
  while ((e = kvidx__heap_top(ix)) != NULL && kvidx__ld(&e[2]) <= now) {
    uint32_t s = ix->heap[0].slot;
    kvidx__unhold(ix, s, kvidx__map_find(ix, &ix->slots[s].seqs, &ix->heap[0].seq));
    kvidx__heap_pop(ix);
    if (!ix->slots[s].blocks) kvidx__slot_release(ix, s);
    else kvidx__map_tidy(ix, &ix->slots[s].seqs, kvidx__drain_step(&ix->slots[s].seqs, 1));
    n++;
  }
  return n;
}

/* ========================================================================== */
/* 6. Queries: one walk over the runs                                        */
/* ========================================================================== */
/* From the root, each step reads one run as a consistent snapshot (its
 * seqlock even and unchanged around the copy): how far the query's locals
 * follow the run's (m), and every holder's cutoff.  Workers still in the
 * running whose cutoff covers m go on; the others score where their held
 * prefix ends.  Then one child-map probe for the run hanging below offset
 * m - 1 with the query's next local.  No hashing, one comparison per block,
 * per-holder work once per run. */
#define KVIDX__MAX_TRIES (1u << 20)

KVIDX__PRIV void kvidx__backoff(uint32_t tries) {
  KVIDX__PAUSE();
  if ((tries & 63) == 0) KVIDX__YIELD();
}

typedef struct {
  uint32_t max_tries; /* KVIDX__MAX_TRIES; 1 in the interleaving test      */
  int gave_up;        /* a probe found no consistent snapshot              */
  uint32_t nw;        /* bitset words in play for this query               */
} kvidx__rctx;

/* Reader: one child-map table's run for key, or NONE (bounded: one lap). */
KVIDX__PRIV uint32_t kvidx__child_scan(const kvidx__mtab *t, const uint64_t *key, uint64_t h) {
  uint64_t i, steps;
  for (i = h & t->mask, steps = 0; steps <= t->mask; i = (i + 1) & t->mask, steps++) {
    KVIDX__A(uint64_t) *e = kvidx__mtab_words(t) + i * 3;
    uint64_t k0 = kvidx__ld_acq(&e[0]);
    if (!k0) break;
    if (k0 == key[0] && kvidx__ld(&e[1]) == key[1]) return KVIDX__CAST(uint32_t, kvidx__ld(&e[2]));
  }
  return KVIDX__NONE;
}

/* Reader: the run below (r, off) whose first local is `local`, or NONE.  A
 * miss is believed only if no deletion or drain step ran meanwhile and the
 * tables stayed. */
KVIDX__PRIV uint32_t kvidx__child_probe(const kvidx *cix, kvidx__rctx *rc, uint32_t r, uint32_t off, uint64_t local,
                                       uint64_t h) { /* h: the key's hash if known (kvidx__child_prefetch), else 0 */
  kvidx *ix = KVIDX__MUT(cix);
  uint64_t key[2];
  uint32_t tries;
  KVIDX_TEST_WALK(cix, 0, 0);
  kvidx__child_key(key, r, off, local);
  if (!h) h = kvidx__key_hash(ix->seed, key, 2);
  for (tries = 0; tries < rc->max_tries; tries++) {
    uint32_t mv = kvidx__ld_acq(&ix->children.moves), found;
    kvidx__mtab *t = kvidx__ld_acq(&ix->children.tab), *o = kvidx__ld_acq(&ix->children.old);
    if (tries) kvidx__backoff(tries);
    if (mv & 1) continue;
    if (!t) return KVIDX__NONE;
    found = kvidx__child_scan(t, key, h);
    if (found == KVIDX__NONE && o) found = kvidx__child_scan(o, key, h); /* not moved to t yet */
    kvidx__fence_acq();
    if (kvidx__ld(&ix->children.moves) == mv && kvidx__ld(&ix->children.tab) == t && kvidx__ld(&ix->children.old) == o)
      return found;
  }
  rc->gave_up = 1;
  return KVIDX__NONE;
}

/* Reader: slot s's worker under the slot's seqlock, if it was assigned
 * before the query began (gen: the slot generation then); 0 if not, or if
 * the slot never held still (a later one may mix two workers' holdings). */
KVIDX__HOT int kvidx__ident_read(const kvidx *ix, uint32_t s, uint64_t gen, uint64_t *id, uint32_t *rank,
                                 uint32_t *order) {
  kvidx__ident *sl = &KVIDX__MUT(ix)->idents[s];
  uint32_t tries;
  for (tries = 0; tries < KVIDX__MAX_TRIES; tries++) {
    uint32_t v1 = kvidx__ld_acq(&sl->ver);
    uint64_t g;
    if (v1 & 1) {
      kvidx__backoff(tries + 1);
      continue;
    }
    *id = kvidx__ld(&sl->id);
    *rank = kvidx__ld(&sl->rank);
    g = kvidx__ld(&sl->gen);
    *order = kvidx__ld(&sl->order);
    kvidx__fence_acq();
    if (kvidx__ld(&sl->ver) != v1) continue;
    return g <= gen;
  }
  return 0;
}

KVIDX__HOT void kvidx__emit_slot(const kvidx *ix, kvidx__sink *k, uint32_t s, size_t depth, uint32_t dev) {
  uint64_t id;
  uint32_t rank, order;
  if (depth && kvidx__ident_read(ix, s, k->gen, &id, &rank, &order)) kvidx__sink_push(k, id, rank, depth, dev, order);
}

/* Emit every slot of `set` (nw words; cleared here) at one depth, in slot
 * order: not the final order when there are two or more (the walk's
 * answers in final order come from kvidx__stopped_emit; these are larger
 * fleets' and answers that outgrow the caller's array). */
KVIDX__PRIV void kvidx__emit_set(const kvidx *ix, kvidx__sink *k, uint64_t *set, uint32_t nw, size_t depth,
                                 const uint32_t *dev) {
  uint32_t w, s, many = 0;
  for (w = 0; w < nw; w++) many += set[w] ? 1u + ((set[w] & (set[w] - 1)) != 0) : 0u;
  if (many > 1) k->grouped = 0;
  for (w = 0; w < nw; w++)
    for (; set[w]; set[w] &= set[w] - 1) {
      s = w * 64 + kvidx__ctz64(set[w]);
      kvidx__emit_slot(ix, k, s, depth, dev ? dev[s] : 0);
    }
}

/* The workers a walk saw stop, by depth: the sets that stop at one depth
 * (one 64-bit word: a fleet of at most 64 slots), depths ascending.  Each
 * slot stops once, so there are at most 64.  The walk emits them when it
 * ends, deepest first (kvidx__stopped_emit): in final order, no sorting.
 * Larger fleets emit as they go (kvidx__emit_set) and sort at the end. */
typedef struct {
  uint64_t set[64];
  size_t depth[64];
  uint32_t n;
} kvidx__stopped;

/* Workers (`set`, nw words, not empty; cleared) that stopped at `depth`,
 * no less than any before. */
KVIDX__PRIV void kvidx__stopped_add(const kvidx *ix, kvidx__sink *k, kvidx__stopped *st, uint64_t *set, uint32_t nw,
                                    size_t depth, const uint32_t *dev) {
  if (nw == 1 && st->n && st->depth[st->n - 1] == depth) {
    st->set[st->n - 1] |= set[0];
    set[0] = 0;
  } else if (nw == 1 && st->n < 64) {
    st->set[st->n] = set[0];
    st->depth[st->n++] = depth;
    set[0] = 0;
  } else { /* a larger fleet (or no room, which a consistent walk never meets) */
    if (nw == 1 && k->grouped) k->grouped = 1;
    kvidx__emit_set(ix, k, set, nw, depth, dev);
  }
}

/* Emit the stopped sets, deepest first.  With room for all of them (plain
 * or tier scores), each worker goes straight to its place: the sets' places
 * are counted first, then one pass over the order hints of all their
 * slots puts each after the ones before it in its set (one placement for
 * the answer, not one per set: W16 C2048's slowest queries stop in 3 sets
 * on average).  A slot that gives no score (assigned after the query
 * began) leaves a hole, closed at the end.  Else set by set. */
KVIDX__PRIV void kvidx__stopped_emit(const kvidx *ix, kvidx__sink *k, kvidx__stopped *st, const uint32_t *dev) {
  kvidx *mix = KVIDX__MUT(ix);
  uint64_t all = 0, placed = 0, b, id, gen = k->gen;
  size_t at[64], total = 0, i, holes = 0, esz = k->esz;
  unsigned char in_set[64], *out = k->out;
  uint32_t g, s, h, rank, order, lim = ix->max_workers < 64 ? ix->max_workers : 64, top = 0;
  if (st->n && !st->depth[0]) top = 1; /* depth 0: not reported */
  for (g = top; g < st->n; g++) total += kvidx__popcount64(st->set[g]);
  if ((k->esz != sizeof(kvidx_score) && k->esz != sizeof(kvidx_tier_score)) || k->cap - k->n < total) {
    while (st->n > top) {
      st->n--;
      kvidx__emit_set(ix, k, &st->set[st->n], 1, st->depth[st->n], dev);
    }
    return;
  }
  for (i = k->n, g = st->n; g-- > top;) {
    at[g] = i;
    i += kvidx__popcount64(st->set[g]);
    all |= st->set[g];
    for (b = st->set[g]; b; b &= b - 1) in_set[kvidx__ctz64(b)] = KVIDX__CAST(unsigned char, g);
  }
  for (b = all; b; b &= b - 1) {
    h = kvidx__ld(&mix->idents[kvidx__ctz64(b)].order);
    placed |= KVIDX__CAST(uint64_t, h < lim) << (h & 63);
  }
  KVIDX_TEST_WALK(ix, 3, 0);
  for (;;) {
    for (; placed; placed &= placed - 1) {
      s = kvidx__ld(&mix->idents[kvidx__ctz64(placed)].at_order);
      if (s < lim && (all >> s & 1)) break;
    }
    if (!placed) { /* the rest (stale hints): slot order, and a sort */
      if (!all) break;
      s = kvidx__ctz64(all);
      if (k->grouped) k->grouped = 1;
    } else {
      placed &= placed - 1;
    }
    all &= ~(KVIDX__CAST(uint64_t, 1) << s);
    g = in_set[s];
    i = at[g]++;
    if (kvidx__ident_read(ix, s, gen, &id, &rank, &order)) { /* the sink's fields in locals: stores to sc may alias them */
      kvidx_score *sc = KVIDX__RCAST(kvidx_score *, out + i * esz);
      sc->worker_id = id;
      sc->dp_rank = rank;
      sc->depth = kvidx__depth32(st->depth[g]);
      if (esz == sizeof(kvidx_tier_score)) {
        KVIDX__RCAST(kvidx_tier_score *, sc)->device_blocks = dev ? dev[s] : 0;
        KVIDX__RCAST(kvidx_tier_score *, sc)->reserved_ = 0;
      }
    } else {
      KVIDX__SC(k, i)->depth = 0; /* a hole */
      holes++;
    }
  }
  for (i = k->n; holes && i < k->n + total; i++) { /* close the holes, keeping the order */
    size_t j = i;
    if (KVIDX__SC(k, i)->depth) continue;
    while (j < k->n + total && !KVIDX__SC(k, j)->depth) j++;
    memmove(KVIDX__SC(k, i), KVIDX__SC(k, j), (k->n + total - j) * k->esz);
    total -= j - i;
    holes -= j - i;
  }
  k->n += total;
  k->total += total;
  st->n = 0;
}

/* A query's worker sets: one word in a fleet of at most 64 slots, set
 * without calling memset / memcpy (four calls a run: W16 C2048's p99
 * over per-query minima 0.93x). */
KVIDX__HOT void kvidx__set_zero(uint64_t *a, uint32_t nw) {
  if (nw == 1) a[0] = 0;
  else memset(a, 0, nw * sizeof(uint64_t));
}
KVIDX__HOT void kvidx__set_copy(uint64_t *to, const uint64_t *from, uint32_t nw) {
  if (nw == 1) to[0] = from[0];
  else memcpy(to, from, nw * sizeof(uint64_t));
}

/* One holder seen in a run: slot | cutoff << 16 | device blocks << 24. */
#define KVIDX__HIT(s, cut, dev) ((s) | (cut) << 16 | (dev) << 24)

/* The holders of a run (hits) that stop inside it (cutoff < m): a set per
 * cutoff, cutoffs ascending. */
KVIDX__PRIV void kvidx__stopped_hits(const kvidx *ix, kvidx__sink *k, kvidx__stopped *st, uint32_t *hits,
                                     uint32_t nhits, uint32_t m, uint32_t nw, size_t p, const uint32_t *dev) {
  uint64_t set[KVIDX__NW_MAX];
  uint32_t j, lo = 0, cut;
  if (nw == 1) { /* slots < 64, at most 64 hits: sorted by cutoff in place, then one pass */
    for (j = 1; j < nhits; j++) { /* insertion sort: a dozen or so hits, often nearly in order */
      uint32_t h = hits[j], i = j;
      for (; i && (hits[i - 1] & 0xFF0000u) > (h & 0xFF0000u); i--) hits[i] = hits[i - 1];
      hits[i] = h;
    }
    set[0] = 0;
    for (j = 0; j < nhits && (cut = (hits[j] >> 16) & 0xFFu) < m; j++) { /* (past m: listed for device counts) */
      set[0] |= KVIDX__CAST(uint64_t, 1) << (hits[j] & 63);
      if (j + 1 == nhits || ((hits[j + 1] >> 16) & 0xFFu) != cut) kvidx__stopped_add(ix, k, st, set, 1, p + cut, dev);
    }
    return;
  }
  for (;;) {
    uint32_t c = m; /* the least cutoff >= lo */
    for (j = 0; j < nhits; j++)
      if ((cut = (hits[j] >> 16) & 0xFFu) >= lo && cut < c) c = cut;
    if (c == m) return;
    kvidx__set_zero(set, nw);
    for (j = 0; j < nhits; j++)
      if (((hits[j] >> 16) & 0xFFu) == c) set[(hits[j] & 0xFFFFu) >> 6] |= KVIDX__CAST(uint64_t, 1) << (hits[j] & 63);
    kvidx__stopped_add(ix, k, st, set, nw, p + c, dev);
    lo = c + 1;
  }
}

/* Reader: ask for the lines of a run's locals from word `from` on and of
 * its holder list, all at once (the walk reads them in turn). */
KVIDX__PRIV void kvidx__warm_chunks(KVIDX__A(uint64_t) *lw, uint32_t from, uint32_t len, KVIDX__A(uint64_t) *hp,
                                    uint32_t hwords) {
  uint32_t j;
  if (lw)
    for (j = from; j < len; j += 8) KVIDX__PREFETCH(&lw[j]);
  if (hp)
    for (j = 0; j < hwords; j += 8) KVIDX__PREFETCH(&hp[j]);
}

/* Reader: warm the lines the walk will read at run r, a step ahead: its
 * locals and holders, and the record of its cont hint, which it returns
 * (NONE if out of range).  Nothing here is validated: the values only pick
 * what to prefetch, each bounds-checked, and the walk reads the run again
 * under its seqlock. */
KVIDX__PRIV uint32_t kvidx__walk_peek(kvidx *ix, uint32_t r, uint32_t hw) {
  kvidx__run *rn = KVIDX__RCAST(kvidx__run *, kvidx__grow_get(&ix->runs, r, 1, 1));
  KVIDX__A(uint64_t) *lw, *hp = NULL;
  const void *cn;
  uint32_t len, nh, c;
  if (!rn) return KVIDX__NONE;
  len = KVIDX__LEN(kvidx__ld(&rn->shape));
  nh = KVIDX__NHOLD(kvidx__ld(&rn->nhold));
  lw = KVIDX__RCAST(KVIDX__A(uint64_t) *, kvidx__grow_get(&ix->words.g, kvidx__ld(&rn->locals), len, 1));
  if (nh && nh <= ix->max_workers)
    hp = KVIDX__RCAST(KVIDX__A(uint64_t) *,
                      kvidx__grow_get(&ix->words.g, kvidx__ld(&rn->holders), KVIDX__CAST(uint64_t, nh) * hw, 1));
  kvidx__warm_chunks(lw, 0, len, hp, nh * hw);
  c = kvidx__ld(&rn->cont);
  if (c == KVIDX__NONE) return KVIDX__NONE;
  /* a guess: a long store makes its runs with consecutive ids (2 of 3
   * hinted steps of W64 F16's slowest queries go to the next id), so the
   * records after c's are likely the chain's next ones (the next 2 lines;
   * where they are in c's segment) */
  if ((cn = kvidx__grow_get(&ix->runs, c, 5, 1)) != NULL) {
    KVIDX__PREFETCH(cn);
    KVIDX__PREFETCH(KVIDX__CAST(const kvidx__run *, cn) + 2);
    KVIDX__PREFETCH(KVIDX__CAST(const kvidx__run *, cn) + 4);
  } else if ((cn = kvidx__grow_get(&ix->runs, c, 1, 1)) != NULL) {
    KVIDX__PREFETCH(cn);
  } else {
    return KVIDX__NONE;
  }
  return c;
}

/* Reader: ask for the query's own locals up to KVIDX__QUERY_AHEAD past
 * position p, a line at a time from *warmed on.  A router that has just
 * hashed its prompt has them in cache; one that built the array earlier
 * (both replay tools build every query's array before their clock) would
 * otherwise wait for a long prompt's array line by line. */
#define KVIDX__QUERY_AHEAD 128
KVIDX__HOT void kvidx__warm_query(const uint64_t *loc, size_t n, size_t p, size_t *warmed) {
  size_t upto = n - p > KVIDX__QUERY_AHEAD ? p + KVIDX__QUERY_AHEAD : n;
  for (; *warmed < upto; *warmed += 8) KVIDX__PREFETCH(&loc[*warmed]);
}

/* How many leading locals of a run (lw) equal the query's (q), of at most
 * max: four at a time while they all match (a long prompt compares
 * thousands: one branch per four). */
KVIDX__HOT uint32_t kvidx__match_len(KVIDX__A(uint64_t) *lw, const uint64_t *q, uint32_t max) {
  uint32_t m = 0;
  for (; m + 4 <= max; m += 4)
    if (((kvidx__ld(&lw[m]) ^ q[m]) | (kvidx__ld(&lw[m + 1]) ^ q[m + 1]) | (kvidx__ld(&lw[m + 2]) ^ q[m + 2]) |
         (kvidx__ld(&lw[m + 3]) ^ q[m + 3])) != 0)
      break;
  for (; m < max && kvidx__ld(&lw[m]) == q[m]; m++) {}
  return m;
}

/* Walk the query from the root.  act: workers still matching (nw words). */
KVIDX__PRIV void kvidx__walk(const kvidx *cix, kvidx__rctx *rc, const uint64_t *loc, size_t n, kvidx__sink *k,
                             uint32_t *dev) {
  kvidx *ix = KVIDX__MUT(cix);
  uint64_t act[KVIDX__NW_MAX], seen[KVIDX__NW_MAX], next[KVIDX__NW_MAX], any;
  uint32_t stops;
  uint64_t next_h = 0; /* the hash of the child-map key this run's probe will ask for, 0 if not known */
  kvidx__stopped stopped;
  uint32_t hits[KVIDX_WORKERS_MAX];
  uint32_t nw = rc->nw, r, w, hw = ix->hw, first = 1, prev = KVIDX__NONE, poff = 0, nhits = 0, m = 0, j, kids = 0;
  uint32_t len = 0, cont = KVIDX__NONE, cont_off = 0, hinted = 0; /* hinted: r is the last run's cont, not the child map's */
  int by_hint = 0; /* the next run is the hint's to try: one child, hung where the query leaves r */
  uint32_t ahead1 = KVIDX__NONE, ahead2 = KVIDX__NONE; /* the cont chain past r, being warmed */
  size_t p = 0, warmed = 8; /* the query's locals asked for below here (its first line is read at once) */
  if (!n) return;
  stopped.n = 0;
  kvidx__set_zero(act, nw);
  kvidx__warm_query(loc, n, 0, &warmed);
  r = kvidx__child_probe(ix, rc, KVIDX__NONE, 0, loc[0], 0);
  while (r != KVIDX__NONE) {
    kvidx__run *rn = KVIDX__RCAST(kvidx__run *, kvidx__grow_get(&ix->runs, r, 1, 1));
    uint32_t tries;
    int ok = 0;
    for (tries = 0; rn && tries < rc->max_tries && !ok; tries++) {
      uint32_t v1 = kvidx__ld_acq(&rn->ver), shape, nh, max, hword;
      KVIDX__A(uint64_t) *lw, *hp = NULL;
      if (tries) kvidx__backoff(tries);
      if (v1 & 1) continue;
      shape = kvidx__ld(&rn->shape);
      len = KVIDX__LEN(shape);
      hword = kvidx__ld(&rn->nhold);
      nh = KVIDX__NHOLD(hword);
      if (!len || kvidx__ld(&rn->parent) != prev || KVIDX__POFF(shape) != poff) {
        kvidx__fence_acq(); /* freed, or reused for another path: a miss if that is stable */
        if (kvidx__ld(&rn->ver) == v1) ok = 2;
        continue;
      }
      lw = KVIDX__RCAST(KVIDX__A(uint64_t) *, kvidx__grow_get(&ix->words.g, kvidx__ld(&rn->locals), len, 1));
      if (nh)
        hp = KVIDX__RCAST(KVIDX__A(uint64_t) *,
                          kvidx__grow_get(&ix->words.g, kvidx__ld(&rn->holders), KVIDX__CAST(uint64_t, nh) * hw, 1));
      if (!lw || (nh && !hp) || nh > ix->max_workers) continue; /* torn: retry */
      if (!tries) kvidx__warm_chunks(lw, 8, len, hp, nh * hw); /* the first locals line is read next */
      kids = kvidx__ld(&rn->kids);
      cont = kvidx__ld(&rn->cont);
      cont_off = KVIDX__CONT_OFF(hword);
      max = n - p < len ? KVIDX__CAST(uint32_t, n - p) : len;
      if (!tries) kvidx__warm_query(loc, n, p, &warmed);
      m = kvidx__match_len(lw, loc + p, max);
      if (hinted && !m) break; /* a sibling, not the query's path: ask the child map */
      by_hint = kids == 1 && cont != KVIDX__NONE && cont_off + 1 == m;
      next_h = m && p + m < n && kids && !by_hint /* the probe after this run: ask now, use after the holders */
                   ? kvidx__child_prefetch(ix, r, m - 1, loc[p + m])
                   : 0;
      /* seen: the holders still in the running; next: those of them that
       * go on past the run; hits: the others (each one's stop), and with
       * dev every holder seen (its device blocks).  Down a path every
       * worker holds (W64 F16's deep queries: 64 holders in each of 20+
       * runs) a holder costs a test and two bits.  A fleet of at most 64
       * slots without device counts keeps both sets in registers and
       * branches only where a holder stops (W64 F16's p99 over per-query
       * minima 0.90x, W16 C2048's 0.94x). */
      nhits = 0;
      if (nw == 1 && !dev) {
        uint64_t in = first ? ~KVIDX__CAST(uint64_t, 0) : act[0], sn = 0, stop = 0;
        for (j = 0; j < nh; j++) {
          uint64_t e = kvidx__ld(&hp[j * hw]), bit;
          uint32_t s = KVIDX__CAST(uint32_t, e & 0xFFFFFFFFu), cut = KVIDX__HOLDER_CUT(e);
          if (cut > KVIDX__RUN_MAX) break; /* torn: retry */
          bit = (s < 64 ? KVIDX__CAST(uint64_t, 1) << s : 0) & in; /* s >= 64: as below */
          sn |= bit;
          if (cut < m && bit) { /* (a slot is listed once: the rest of sn goes on) */
            stop |= bit;
            hits[nhits++] = KVIDX__HIT(s, cut, 0u);
          }
        }
        seen[0] = sn;
        next[0] = sn & ~stop;
      } else {
        kvidx__set_zero(seen, nw);
        kvidx__set_zero(next, nw);
        for (j = 0; j < nh; j++) {
          uint64_t e = kvidx__ld(&hp[j * hw]), bit;
          uint32_t s = KVIDX__CAST(uint32_t, e & 0xFFFFFFFFu), cut = KVIDX__HOLDER_CUT(e), upto, c = 0;
          if (cut > KVIDX__RUN_MAX) break; /* torn: retry */
          /* a slot past our word count was assigned after the query began
           * (emit_slot would skip it too), or the copy is torn: skip it, the
           * seqlock check below tells the two apart */
          if (s >= nw * 64) continue;
          bit = KVIDX__CAST(uint64_t, 1) << (s & 63);
          if (!first && !(act[s >> 6] & bit)) continue;
          seen[s >> 6] |= bit;
          if (cut >= m) {
            next[s >> 6] |= bit;
            if (!dev) continue;
          }
          if (dev) { /* device blocks among the ones this worker matched here */
            uint64_t bs;
            upto = cut < m ? cut : m;
            bs = kvidx__ld(&hp[j * hw + hw - 1]) & (upto >= 64 ? ~KVIDX__CAST(uint64_t, 0)
                                                              : (KVIDX__CAST(uint64_t, 1) << upto) - 1);
            c = ix->tiers_on ? kvidx__popcount64(bs) : upto;
          }
          hits[nhits++] = KVIDX__HIT(s, cut, c);
        }
      }
      if (j < nh) continue;
      kvidx__fence_acq();
      if (kvidx__ld(&rn->ver) == v1) ok = 1;
    }
    if (ok == 1) KVIDX_TEST_WALK(cix, hinted ? 2 : 1, m);
    if (ok != 1 || m == 0) {
      if (hinted) { /* the hint did not check out: ask the child map */
        hinted = 0;
        r = kvidx__child_probe(ix, rc, prev, poff, loc[p], 0);
        continue;
      }
      if (ok == 0) rc->gave_up = 1; /* the run never held still: give up */
      break;                        /* it went away: a miss */
    }
    /* Here a hinted run is the child map's answer: it hangs below (prev,
     * poff) and starts with loc[p] (m > 0), and the map holds one run per
     * key.  Long prompts walk dozens of runs, each a few cache misses deep.  Once
     * the walk is on a cont chain (r came by its hint), the misses overlap:
     * the next run's locals and holders were asked for one step ago, the
     * record after it two steps ago.  Off a chain, only the hinted record is
     * asked for.  The hint is taken only below a run with one child, where
     * the query leaves the run at the hint's offset: where runs branch (a
     * shared system prompt's end) the last child made is rarely the
     * query's, and reading it cost the median query two misses (W64 F16 p50
     * +15%); a query that leaves the run elsewhere would read a record
     * that cannot be its child. */
    if (by_hint && p + m < n) {
      if (hinted) {
        uint32_t after;
        if (ahead1 != cont) ahead2 = kvidx__walk_peek(ix, cont, hw); /* joined the chain here */
        after = ahead2 != KVIDX__NONE ? kvidx__walk_peek(ix, ahead2, hw) : KVIDX__NONE;
        ahead1 = ahead2;
        ahead2 = after;
      } else {
        const void *nx = kvidx__grow_get(&ix->runs, cont, 1, 1);
        if (nx) KVIDX__PREFETCH(nx);
      }
    }
    hinted = 0;
    /* commit the copy: the workers of act not seen here stopped where the
     * run begins, holders stop inside it or go on (kept in that order:
     * depths ascend) */
    for (any = 0, w = 0; w < nw; w++) any |= seen[w] = act[w] & ~seen[w];
    if (any) kvidx__stopped_add(ix, k, &stopped, seen, nw, p, dev);
    for (stops = 0, j = 0; j < nhits; j++) {
      uint32_t s = hits[j] & 0xFFFFu, cut = (hits[j] >> 16) & 0xFFu;
      if (dev) dev[s] = (first ? 0 : dev[s]) + (hits[j] >> 24);
      stops |= cut < m;
    }
    if (stops) kvidx__stopped_hits(ix, k, &stopped, hits, nhits, m, nw, p, dev);
    kvidx__set_copy(act, next, nw);
    first = 0;
    p += m;
    if (p == n) break;
    for (w = 0; w < nw && !act[w]; w++) {}
    if (w == nw) break;
    prev = r;
    poff = m - 1;
    if (!kids) r = KVIDX__NONE;
    else if (by_hint) r = cont, hinted = 1;
    else r = kvidx__child_probe(ix, rc, r, m - 1, loc[p], next_h);
  }
  for (any = 0, w = 0; w < nw; w++) any |= act[w];
  if (any) kvidx__stopped_add(ix, k, &stopped, act, nw, p, dev); /* still matching where the walk ended */
  kvidx__stopped_emit(ix, k, &stopped, dev);
}

/* ========================================================================== */
/* 7. Concurrency: the contract and why the reader path is safe              */
/* ========================================================================== */
/* Contract.
 *  - kvidx_find_matches, _ex and _tiered may run on any number of threads at
 *    any time, beside the writers: lock-free, no shared writes, never waiting
 *    for a writer (they retry a run that changed under them, bounded).
 *    kvidx_worker_blocks, kvidx_get_stats, kvidx_last_event_id/_gen read
 *    writer state under the writer lock (briefly).  kvidx_dump and
 *    kvidx_snapshot_write hold the writer lock while they run.
 *  - Writers (store / remove / clear / remove_worker / apply / expire):
 *    events of one worker from one thread at a time, in order; events of
 *    different workers may come from different threads at once.  They
 *    serialize on one short spinlock: runs, holder lists and the child map
 *    are shared by every worker (see the README on writer scaling).
 *  - create / init_buffer / destroy: alone.  snapshot_read / kvidx__check:
 *    no writer at the same time, readers may query (the reader-visible words
 *    change only through the writer paths; the checker counts each run's
 *    children in bits 16-23 of its nhold word, which readers do not read,
 *    and clears them again).
 *    KVIDX_REFERENCE and KVIDX_NO_THREADS builds: one thread.
 * What a reader sees.  Each run it reads is a consistent copy (the run's
 * seqlock even and unchanged around it: shape, locals, holder entries).  A
 * run's kids count, hint and hint offset are written outside its seqlock:
 * kids lets a reader skip the child map below a run that has no child (a
 * child hung meanwhile is one the query may miss, as if it came after) and
 * try the hint below a run that has one, and a hint is believed only once
 * the run it names checks out.  A
 * worker whose blocks did not change during the query gets its exact score:
 * its holder entries keep their cutoffs, runs it holds are not freed, and a
 * child-map miss is believed only if no deletion ran meanwhile (the map's
 * `moves` seqlock) and the table was not replaced.  A worker that changed
 * may be seen before, after, or part way through the change.  A slot
 * reassigned during the query (64-bit generation newer than the query) is
 * left out rather than reported under the wrong identity; a slot's (id,
 * rank, generation) is read under the slot's own seqlock.  Its order hint
 * is an atomic word the writer rewrites outside that seqlock when workers
 * come or go: a reader may see old and new hints mixed, which the
 * placement's final check refuses (then the reader sorts); a hint never
 * decides a score or an identity, only where a checked score goes.
 * Why no read goes astray.  Readers follow only 32-bit run ids and word
 * indices, each bounds-checked against a grow-only array whose segments are
 * never moved or freed before destroy; freed runs and word chunks are reused
 * only as runs and word chunks (type-stable), so a stale id still names
 * valid atomic words, and the seqlock or the parent / offset / first-local
 * check tells it is stale.  Retired child-map tables stay until destroy
 * (each is half the next: together less than the live one); while the child
 * map grows, readers probe its new table, then the draining one, and a miss
 * stands only if neither table pointer nor the moves seqlock changed.  Retries are
 * bounded (KVIDX__MAX_TRIES, about a second of backoff); a reader that runs
 * out reports a shorter answer and KVIDX_EAGAIN from kvidx_find_matches_ex,
 * never a wrong worker or a crash.  Every word a racing reader loads is
 * atomic; the seqlock follows Boehm (relaxed loads, acquire fence). */

/* ========================================================================== */
/* 8. Public API: lifecycle, events, stats, invariant checker                */
/* ========================================================================== */
/* Entries the multi map can need: each is a position held under >= 2 seqs. */
#define KVIDX__MULTI_MAX(blocks) ((blocks) / 2 + 1)

typedef struct {
  uint32_t max_workers, jump;
  size_t max_blocks, max_entries, fixed, total, arena;
  uint64_t shared[4];  /* buffer mode: entries of the child map, holdings,
                          multi and worker-slot map, made at init        */
  unsigned words_shift, runs_shift;
} kvidx__plan;

/* Bytes of the smallest power-of-two class holding n bytes (buffer arena). */
KVIDX__PRIV uint64_t kvidx__cls_bytes(uint64_t n) { /* 64-bit: a plan's sums must not wrap */
  uint64_t size;
  kvidx__arena_class(n, &size);
  return size;
}

/* A map of up to `entries` whose table is made at that size when the index
 * is (the shared maps in caller-buffer mode): one table, never grown. */
KVIDX__PRIV uint64_t kvidx__map_fixed(uint64_t entries, uint32_t ew) {
  return kvidx__cls_bytes(sizeof(kvidx__mtab)) + kvidx__cls_bytes(kvidx__mtab_bytes(kvidx__map_slots_for(entries, 8), ew));
}

/* A map of up to `entries` that grows on demand (a worker's seq table): its
 * table at the largest size a store's reservation can ask for, the one
 * before it while it grows, and room for the free lists' leftovers (classes
 * are never split or merged). */
KVIDX__PRIV uint64_t kvidx__map_worst(uint64_t entries, uint32_t ew) {
  uint64_t slots = kvidx__map_slots_for(entries, 8);
  return 3 * kvidx__cls_bytes(sizeof(kvidx__mtab)) + 2 * kvidx__cls_bytes(kvidx__mtab_bytes(slots, ew)) +
         kvidx__cls_bytes(kvidx__mtab_bytes(slots / 2, ew));
}

KVIDX__PRIV int kvidx__plan_cfg(const kvidx_config *cfg, int buffer, kvidx__plan *pl) {
  uint64_t B, E, words, a;
  if (!cfg || cfg->kind < KVIDX_RADIX || cfg->kind > KVIDX_REFERENCE || (cfg->flags & ~(KVIDX_F_TIERS | KVIDX_F_DEFER_FREE)))
    return KVIDX_EINVAL;
  if ((cfg->alloc == NULL) != (cfg->free == NULL)) return KVIDX_EINVAL;
  pl->max_workers = cfg->max_workers ? cfg->max_workers
                                     : (KVIDX__DEFAULT_WORKERS < KVIDX_WORKERS_MAX ? KVIDX__DEFAULT_WORKERS
                                                                                   : KVIDX_WORKERS_MAX);
  if (pl->max_workers > KVIDX_WORKERS_MAX) return KVIDX_EINVAL;
  pl->jump = cfg->jump ? cfg->jump : KVIDX__DEFAULT_JUMP;
  if (pl->jump > KVIDX_JUMP_MAX) return KVIDX_EINVAL;
  pl->max_blocks = cfg->max_blocks ? cfg->max_blocks : buffer ? KVIDX_BUFFER_DEFAULT_BLOCKS : KVIDX__ID_LIMIT / 2;
  if (pl->max_blocks > KVIDX__ID_LIMIT / 2) return KVIDX_EINVAL;
  pl->max_entries = cfg->max_entries ? cfg->max_entries : buffer ? pl->max_blocks : KVIDX__ID_LIMIT;
  if (pl->max_entries > KVIDX__ID_LIMIT) return KVIDX_EINVAL;
  if (cfg->evict < KVIDX_EVICT_NONE || cfg->evict > KVIDX_EVICT_EXPIRY || cfg->evict_target_pct > 100 ||
      (cfg->evict && !cfg->max_blocks) || cfg->blocks_per_worker > KVIDX__ID_LIMIT / 2)
    return KVIDX_EINVAL;
  pl->fixed = kvidx__align(sizeof(kvidx)) + kvidx__align(sizeof(kvidx__slot) * pl->max_workers) +
              kvidx__align(sizeof(kvidx__ident) * pl->max_workers) +
              kvidx__align(sizeof(kvidx__evid) * kvidx__pow2(2 * KVIDX__CAST(uint64_t, pl->max_workers)));
  pl->total = pl->fixed;
  pl->words_shift = 13;
  pl->runs_shift = 10;
  pl->arena = 0;
  if (buffer) { /* every structure at its largest, in power-of-two classes (see kvidx_buffer_size) */
    uint32_t hw = (cfg->flags & KVIDX_F_TIERS) ? 2u : 1u, ew = cfg->evict ? 4u : 2u;
    if (cfg->kind == KVIDX_REFERENCE) return KVIDX_ENOTSUP;
    B = pl->max_blocks;
    E = pl->max_entries < B ? pl->max_entries : B;
    words = 3 * E + 3 * B * hw + 2 * (KVIDX__CAST(uint64_t, 1) << kvidx__class_of(pl->max_workers * hw + 1));
    pl->words_shift = kvidx__class_of(words);
    pl->runs_shift = kvidx__class_of(E + 2);
    pl->shared[0] = E;
    pl->shared[1] = B;
    pl->shared[2] = KVIDX__MULTI_MAX(B);
    pl->shared[3] = pl->max_workers;
    a = kvidx__cls_bytes((KVIDX__CAST(uint64_t, 1) << pl->words_shift) * 8) +
        kvidx__cls_bytes((KVIDX__CAST(uint64_t, 1) << pl->runs_shift) * sizeof(kvidx__run)) +
        kvidx__cls_bytes((KVIDX__CAST(uint64_t, 1) << pl->runs_shift) * 8) +
        kvidx__cls_bytes(KVIDX__CAST(uint64_t, 1) << pl->runs_shift) +
        kvidx__map_fixed(pl->shared[0], 3) + kvidx__map_fixed(pl->shared[1], hw + 3) +
        kvidx__map_fixed(pl->shared[2], 3) + kvidx__map_fixed(pl->shared[3], 3) + 2 * kvidx__map_worst(B + 8, ew) +
        KVIDX__CAST(uint64_t, pl->max_workers) * 512 + kvidx__cls_bytes(B / 8 + 8) +
        (cfg->evict ? 2 * kvidx__cls_bytes((2 * B + 128) * sizeof(kvidx__victim)) : 0) + 65536;
    if (a > (~KVIDX__CAST(size_t, 0) >> 2)) return KVIDX_EINVAL; /* does not fit this address space */
    pl->arena = KVIDX__CAST(size_t, a);
    pl->total += pl->arena;
  }
  return KVIDX_OK;
}

KVIDX__PRIV uint64_t kvidx__pick_seed(const kvidx_config *cfg, const void *where) {
  static KVIDX__A(uint64_t) counter;
  uint64_t c = kvidx__ld(&counter) + 1;
  kvidx__st(&counter, c); /* a racing create may reuse a count: the address still differs */
  if (cfg->seed) return cfg->seed;
  return kvidx__mix(KVIDX__CAST(uint64_t, KVIDX__ADDR(where)) ^ kvidx__mix(c) ^
                    KVIDX__CAST(uint64_t, KVIDX__ADDR(&counter)) << 17);
}

/* Lay out the fixed part (and the arena in buffer mode) from mem. */
/* The shared maps max_blocks bounds (a reservation asks for no more): a
 * holding (worker, run) has >= 1 held block, a multi position >= 2. */
KVIDX__PRIV void kvidx__bound_by_blocks(kvidx *ix) {
  ix->holds.most = ix->max_blocks;
  ix->multi.most = KVIDX__MULTI_MAX(ix->max_blocks);
}

KVIDX__PRIV kvidx *kvidx__setup(const kvidx_config *cfg, const kvidx__plan *pl, unsigned char *mem, int buffer) {
  kvidx *ix = KVIDX__RCAST(kvidx *, mem);
  uint32_t i;
  unsigned c;
  memset(mem, 0, pl->fixed);
  ix->kind = cfg->kind;
  ix->buffer_mode = buffer;
  ix->alloc = cfg->alloc;
  ix->free = cfg->free;
  ix->actx = cfg->alloc_ctx;
  ix->max_workers = pl->max_workers;
  ix->jump = pl->jump;
  ix->max_blocks = pl->max_blocks;
  ix->max_entries = pl->max_entries;
  ix->evict = cfg->evict;
  ix->tiers_on = (cfg->flags & KVIDX_F_TIERS) != 0;
  ix->defer_free = !buffer && (cfg->flags & KVIDX_F_DEFER_FREE) != 0;
  ix->hw = ix->tiers_on ? 2u : 1u;
  ix->hdev = ix->tiers_on ? 4u : KVIDX__CAST(uint32_t, KVIDX__H_HELD);
  ix->chunk_top = kvidx__class_of(pl->max_workers * ix->hw > KVIDX__RUN_MAX ? pl->max_workers * ix->hw : KVIDX__RUN_MAX);
  ix->evict_target = pl->max_blocks * (cfg->evict_target_pct ? cfg->evict_target_pct : 80) / 100;
  ix->seed = kvidx__pick_seed(cfg, ix);
  ix->seq_room = buffer ? 0 : cfg->blocks_per_worker < pl->max_blocks ? cfg->blocks_per_worker : pl->max_blocks;
  mem += kvidx__align(sizeof(kvidx));
  ix->slots = KVIDX__RCAST(kvidx__slot *, mem);
  mem += kvidx__align(sizeof(kvidx__slot) * pl->max_workers);
  ix->idents = KVIDX__RCAST(kvidx__ident *, mem);
  mem += kvidx__align(sizeof(kvidx__ident) * pl->max_workers);
  ix->evtab = KVIDX__RCAST(kvidx__evid *, mem);
  ix->evtab_mask = kvidx__pow2(2 * KVIDX__CAST(uint64_t, pl->max_workers)) - 1;
  mem += kvidx__align(sizeof(kvidx__evid) * (ix->evtab_mask + 1));
  for (i = 0; i < pl->max_workers; i++) ix->slots[i].free_next = i + 1 < pl->max_workers ? i + 1 : KVIDX__NONE;
  ix->slot_free = 0;
  ix->run_free = KVIDX__NONE;
  ix->chain_hint_run = KVIDX__NONE;
  for (c = 0; c < KVIDX__WCLASSES; c++) ix->words.free_head[c] = KVIDX__NONE;
  ix->words.g.es = 8;
  ix->words.g.shift0 = pl->words_shift;
  ix->runs.es = sizeof(kvidx__run);
  ix->runs.shift0 = pl->runs_shift;
  ix->chains.es = 8;
  ix->chains.shift0 = pl->runs_shift;
  ix->kid_hi.es = 1;
  ix->kid_hi.shift0 = pl->runs_shift;
#ifndef KVIDX_NO_RUN_SPLIT
  ix->hints.es = 4;
  ix->hints.shift0 = pl->runs_shift;
  ix->hints_on = !buffer && !ix->tiers_on;
#endif
  kvidx__map_init(&ix->slot_map, 3, 2, 1, 0);
  kvidx__map_init(&ix->children, 3, 2, 0, 1);
  kvidx__map_init(&ix->holds, ix->tiers_on ? 5u : 4u, 1, 0, 0);
  kvidx__map_init(&ix->multi, 3, 2, 0, 0);
  /* what bounds each shared map: a run has >= 1 entry (the rest: see
   * kvidx__bound_by_blocks) */
  ix->children.most = pl->max_entries;
  kvidx__bound_by_blocks(ix);
  ix->slot_map.most = pl->max_workers;
  if (buffer) {
    ix->arena.next = mem;
    ix->arena.end = mem + pl->arena;
  }
  return ix;
}

KVIDX_DEF size_t kvidx_buffer_size(const kvidx_config *cfg) {
  kvidx__plan pl;
  return kvidx__plan_cfg(cfg, 1, &pl) == KVIDX_OK ? pl.total + 64 : 0;
}

KVIDX_DEF int kvidx_init_buffer(kvidx **out, const kvidx_config *cfg, void *mem, size_t len) {
  kvidx__plan pl;
  kvidx *ix;
  kvidx__map *shared[4];
  unsigned char *m;
  size_t adj, i;
  int rc;
  if (!out || !mem) return KVIDX_EINVAL;
  *out = NULL;
  if ((rc = kvidx__plan_cfg(cfg, 1, &pl)) != KVIDX_OK) return rc;
  adj = (64 - (KVIDX__CAST(size_t, KVIDX__RCAST(uintptr_t, mem)) & 63)) & 63;
  if (len < pl.total + 64) return KVIDX_EINVAL;
  m = KVIDX__CAST(unsigned char *, mem) + adj;
  ix = kvidx__setup(cfg, &pl, m, 1);
  ix->bytes = ix->peak = ix->buf_len = len;
  /* The shared maps at their largest now (kvidx__plan_cfg counts one table
   * each, in this order): growing one at once would need its old table
   * beside it. */
  shared[0] = &ix->children, shared[1] = &ix->holds, shared[2] = &ix->multi, shared[3] = &ix->slot_map;
  for (i = 0; i < 4; i++)
    if ((rc = kvidx__map_reserve(ix, shared[i], pl.shared[i])) != KVIDX_OK)
      return rc; /* the plan is short: a bug (nothing to free, the buffer is the caller's) */
  *out = ix;
  return KVIDX_OK;
}

KVIDX_DEF int kvidx_create(kvidx **out, const kvidx_config *cfg) {
  kvidx__plan pl;
  unsigned char *m;
  kvidx *ix;
  if (!out) return KVIDX_EINVAL;
  *out = NULL;
  {
    int rc = kvidx__plan_cfg(cfg, 0, &pl);
    if (rc != KVIDX_OK) return rc;
  }
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
  }
  *out = ix;
  return KVIDX_OK;
}

KVIDX__PRIV void kvidx__ref_drop_all(kvidx *ix);

KVIDX_DEF void kvidx_destroy(kvidx *ix) {
  uint32_t i;
  size_t n;
  if (!ix || ix->buffer_mode) return; /* buffer mode: the caller owns the memory */
  kvidx__free_deferred(ix, kvidx__take_deferred(ix, &n));
  ix->defer_free = 0; /* from here every block goes back at once */
  if (ix->ref) kvidx__ref_drop_all(ix);
  for (i = 0; i < ix->max_workers; i++)
    if (ix->slots[i].used) kvidx__map_drop(ix, &ix->slots[i].seqs);
  kvidx__map_drop(ix, &ix->slot_map);
  kvidx__map_drop(ix, &ix->children);
  kvidx__map_drop(ix, &ix->holds);
  kvidx__map_drop(ix, &ix->multi);
  kvidx__grow_drop(ix, &ix->words.g);
  kvidx__grow_drop(ix, &ix->runs);
  kvidx__grow_drop(ix, &ix->chains);
  kvidx__grow_drop(ix, &ix->kid_hi);
#ifndef KVIDX_NO_RUN_SPLIT
  kvidx__grow_drop(ix, &ix->hints);
#endif
  if (ix->heap) kvidx__free(ix, ix->heap, ix->heap_cap * sizeof(kvidx__victim));
  kvidx__free(ix, ix, ix->fixed_bytes);
}

KVIDX__PRIV int kvidx__store(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq,
                             const kvidx_block *b, size_t n, int tier, uint64_t expires, int detached) {
  int rc;
  if (!ix || (n && !b) || tier < KVIDX_TIER_DEVICE || tier > KVIDX_TIER_DISK) return KVIDX_EINVAL;
  if (tier != KVIDX_TIER_DEVICE && !ix->tiers_on) return KVIDX_ENOTSUP;
  if (ix->kind == KVIDX_REFERENCE) return kvidx__ref_store(ix, worker_id, dp_rank, parent_seq, b, n, tier, expires);
  kvidx__lock(ix);
  rc = kvidx__ix_store(ix, worker_id, dp_rank, parent_seq, b, n, tier, expires, detached);
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
  return kvidx__store(ix, worker_id, dp_rank, parent_seq, b, n, KVIDX_TIER_DEVICE, 0, 0);
}

KVIDX_DEF int kvidx_store_ttl(kvidx *ix, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent_seq,
                              const kvidx_block *b, size_t n, uint64_t expires_at) {
  if (ix && ix->evict != KVIDX_EVICT_EXPIRY) return KVIDX_ENOTSUP;
  return kvidx__store(ix, worker_id, dp_rank, parent_seq, b, n, KVIDX_TIER_DEVICE, expires_at, 0);
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
                                 ev->expires_at, ev->detached);
  case KVIDX_EV_REMOVED:
    return ref ? kvidx__ref_remove(ix, ev->worker_id, ev->dp_rank, ev->seqs, ev->n, ev->tier)
               : kvidx__ix_remove(ix, ev->worker_id, ev->dp_rank, ev->seqs, ev->n, ev->tier);
  default: /* KVIDX_EV_CLEARED */
    if (ref) {
      kvidx__rworker *w = kvidx__ref_worker(ix, ev->worker_id, ev->dp_rank);
      if (w) kvidx__ref_clear_worker(ix, w);
    } else {
      uint32_t s = kvidx__slot_find(ix, ev->worker_id, ev->dp_rank);
      if (s != KVIDX__NONE) kvidx__clear_slot(ix, s);
    }
    return KVIDX_OK;
  }
}

KVIDX_DEF int kvidx_apply(kvidx *ix, const kvidx_event *ev) {
  kvidx__evid *e;
  int rc, info = KVIDX_OK;
  if (!ix || !ev || ev->type < KVIDX_EV_STORED || ev->type > KVIDX_EV_CLEARED) return KVIDX_EINVAL;
  if (ev->detached && (ev->type != KVIDX_EV_STORED || ev->parent)) return KVIDX_EINVAL;
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
  if (e && ev->generation == e->gen && ev->event_id <= e->last) {
    kvidx__unlock(ix);
    return KVIDX_DUPLICATE;
  }
  if (e && ev->generation != e->gen) { /* the engine restarted: its cache is gone */
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
    e->gen = ev->generation;
  }
  kvidx__unlock(ix);
  return rc != KVIDX_OK ? rc : info;
}

/* A worker's stream position (which = 0: last id, 1: its generation). */
KVIDX__PRIV int kvidx__stream_get(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank, uint64_t *out, int which) {
  const kvidx__evid *e;
  int rc = KVIDX_ENOENT;
  if (!ix || !out) return KVIDX_EINVAL;
  kvidx__lock(KVIDX__MUT(ix));
  if ((e = kvidx__ev_find(ix, worker_id, dp_rank)) != NULL) {
    *out = which ? e->gen : e->last;
    rc = KVIDX_OK;
  }
  kvidx__unlock(KVIDX__MUT(ix));
  return rc;
}

KVIDX_DEF int kvidx_last_event_id(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank, uint64_t *out) {
  return kvidx__stream_get(ix, worker_id, dp_rank, out, 0);
}

KVIDX_DEF int kvidx_last_event_gen(const kvidx *ix, uint64_t worker_id, uint32_t dp_rank, uint64_t *out) {
  return kvidx__stream_get(ix, worker_id, dp_rank, out, 1);
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
    if ((s = kvidx__slot_find(ix, worker_id, dp_rank)) != KVIDX__NONE) kvidx__clear_slot(ix, s);
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
    } else if (ix->slots[i].used && kvidx__ld(&ix->idents[i].id) == worker_id) {
      kvidx__clear_slot(ix, i);
    }
  }
  if (ix->kind != KVIDX_REFERENCE) kvidx__unlock(ix);
  return KVIDX_OK;
}


KVIDX__PRIV size_t kvidx__find(const kvidx *ix, const uint64_t *locals, size_t n, void *out, size_t esz,
                               size_t cap, kvidx__rctx *rc) {
  kvidx__sink k;
  uint32_t order_ver;
  if (!ix || (n && !locals)) return 0;
  kvidx__sink_init(&k, out, esz, cap);
  if (ix->kind == KVIDX_REFERENCE) return kvidx__ref_find(ix, locals, n, &k);
  order_ver = kvidx__ld_acq(&KVIDX__MUT(ix)->order_ver);
  k.grouped = order_ver & 1 ? 1 : 2; /* the walk's scores: see kvidx__stopped */
  k.gen = kvidx__ld_acq(&KVIDX__MUT(ix)->gen);
  rc->nw = kvidx__ld_acq(&KVIDX__MUT(ix)->nw_live);
  if (!rc->nw) return 0; /* no worker was ever assigned a slot */
  if (rc->nw != 1) k.grouped = 0; /* emitted in slot order */
  if (esz == sizeof(kvidx_tier_score)) {
    uint32_t dev[KVIDX_WORKERS_MAX];
    kvidx__walk(ix, rc, locals, n, &k, dev);
  } else {
    kvidx__walk(ix, rc, locals, n, &k, NULL);
  }
  kvidx__fence_acq(); /* the hints were read before this: did they hold? */
  if (kvidx__ld(&KVIDX__MUT(ix)->order_ver) != order_ver && k.grouped) k.grouped = 1;
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
  if (ix->kind == KVIDX_REFERENCE) return kvidx__ref_blocks(ix, worker_id, dp_rank);
  s = kvidx__slot_find(ix, worker_id, dp_rank);
  return s == KVIDX__NONE ? 0 : ix->slots[s].blocks;
}

KVIDX_DEF int kvidx_get_stats(const kvidx *ix, kvidx_stats *st) {
  if (!ix || !st) return KVIDX_EINVAL;
  kvidx__lock(KVIDX__MUT(ix));
  memset(st, 0, sizeof *st);
  st->bytes = ix->bytes;
  st->peak_bytes = ix->peak;
  st->deferred_bytes = ix->deferred_bytes;
  if (ix->kind == KVIDX_REFERENCE) {
    kvidx__ref_stats(ix, st);
  } else {
    st->blocks = ix->blocks;
    st->workers = ix->slots_used;
    st->entries = ix->entries;
  }
  kvidx__unlock(KVIDX__MUT(ix));
  return KVIDX_OK;
}

KVIDX_DEF int kvidx_reclaim(kvidx *ix, size_t *freed_bytes) {
  void *list;
  size_t n;
  if (freed_bytes) *freed_bytes = 0;
  if (!ix) return KVIDX_EINVAL;
  kvidx__lock(ix);
  list = kvidx__take_deferred(ix, &n);
  kvidx__unlock(ix);
  kvidx__free_deferred(ix, list); /* outside the lock: writers go on meanwhile */
  if (freed_bytes) *freed_bytes = n;
  return KVIDX_OK;
}

/* Invariant checker.  Recounts every worker's seqs against its holdings
 * (held / device / multi bits and side counts: subtract, check zero, add
 * back, so it allocates nothing), every holding against its run's holder
 * list, every run against the child map and its parent, and the eviction
 * order against the holdings. */
#define KVIDX__CHK(c)                                                                                             \
  do {                                                                                                           \
    if (!(c)) return -__LINE__;                                                                                  \
  } while (0)

/* sign -1: take slot s's first `limit` seqs (by position) out of their
 * holdings' bits/counts; +1: put them back.  *done: how many it took out or
 * put back, so a check that failed midway can put back what it took. */
KVIDX__PRIV int kvidx__check_seqs(kvidx *ix, uint32_t s, int sign, uint64_t limit, uint64_t *done) {
  const kvidx__slot *sl = &ix->slots[s];
  uint32_t i;
  *done = 0;
  for (i = kvidx__map_next(&sl->seqs, KVIDX__NONE); i != KVIDX__NONE && *done < limit;
       i = kvidx__map_next(&sl->seqs, i)) {
    KVIDX__A(uint64_t) *e = kvidx__map_at(&sl->seqs, i), *h;
    uint64_t pos = kvidx__ld(&e[1]), bit;
    uint32_t r, off, tiers, at;
    kvidx__run *rn;
    r = KVIDX__POS_RUN(pos);
    off = KVIDX__POS_OFF(pos);
    tiers = KVIDX__POS_TIERS(pos);
    KVIDX__CHK(r < ix->runs_hw && (rn = kvidx__run_at(ix, r)) != NULL && off < KVIDX__LEN(kvidx__ld(&rn->shape)));
    KVIDX__CHK(tiers && tiers < 8u && (ix->tiers_on || tiers == KVIDX__DEVBIT));
    {
      uint64_t seq = kvidx__ld(&e[0]);
      KVIDX__CHK(kvidx__map_find(ix, &sl->seqs, &seq) == i);
    }
    KVIDX__CHK((at = kvidx__hold_find(ix, s, r)) != KVIDX__NONE);
    h = kvidx__map_at(&ix->holds, at);
    bit = KVIDX__CAST(uint64_t, 1) << off;
    KVIDX__CHK(sign > 0 || (kvidx__ld(&h[KVIDX__H_HELD]) & bit)); /* putting back: toggled off */
    if (kvidx__ld(&h[KVIDX__H_MULTI]) & bit) {
      uint32_t m = kvidx__multi_find(ix, s, r, off);
      KVIDX__A(uint64_t) *c;
      KVIDX__CHK(m != KVIDX__NONE);
      c = &kvidx__map_at(&ix->multi, m)[2];
      kvidx__st(c, kvidx__ld(c) + KVIDX__CAST(uint64_t, KVIDX__CAST(int64_t, sign)) *
                                      (1 + ((tiers & KVIDX__DEVBIT) ? KVIDX__CAST(uint64_t, 1) << 32 : 0)));
    } else {
      kvidx__st(&h[KVIDX__H_HELD], kvidx__ld(&h[KVIDX__H_HELD]) ^ bit); /* each single once */
      if ((tiers & KVIDX__DEVBIT) && ix->tiers_on) kvidx__st(&h[ix->hdev], kvidx__ld(&h[ix->hdev]) ^ bit);
    }
    (*done)++;
  }
  KVIDX__CHK(i != KVIDX__NONE || (*done == sl->blocks && *done == sl->seqs.n)); /* stopped short: no count */
  return 0;
}

/* Put back what kvidx__check_seqs(-1) took apart: every used slot below s
 * whole, then s's first `done` seqs. */
KVIDX__PRIV void kvidx__check_put_back(kvidx *ix, uint32_t s, uint64_t done) {
  uint64_t all = ~KVIDX__CAST(uint64_t, 0), n;
  uint32_t t;
  for (t = 0; t < s; t++)
    if (ix->slots[t].used) kvidx__check_seqs(ix, t, 1, all, &n);
  if (s < ix->max_workers && done) kvidx__check_seqs(ix, s, 1, done, &n);
}

KVIDX__PRIV int kvidx__check_holdings(kvidx *ix, int after_sub) {
  uint32_t i;
  for (i = kvidx__map_next(&ix->holds, KVIDX__NONE); i != KVIDX__NONE; i = kvidx__map_next(&ix->holds, i)) {
    KVIDX__A(uint64_t) *h = kvidx__map_at(&ix->holds, i);
    uint64_t key = kvidx__ld(&h[0]), held = kvidx__ld(&h[KVIDX__H_HELD]), multi = kvidx__ld(&h[KVIDX__H_MULTI]);
    uint64_t dev = kvidx__ld(&h[ix->hdev]);
    uint32_t s, r, j;
    kvidx__run *rn;
    if (!key) continue;
    s = KVIDX__CAST(uint32_t, (key >> 32) - 1);
    r = KVIDX__CAST(uint32_t, key & 0xFFFFFFFFu);
    if (after_sub) { /* every single seq toggled its bit off; multi counts at zero */
      KVIDX__CHK((held & ~multi) == 0 && (dev & ~multi) == 0);
      continue;
    }
    KVIDX__CHK(s < ix->max_workers && ix->slots[s].used && r < ix->runs_hw);
    rn = kvidx__run_at(ix, r);
    KVIDX__CHK(held && (multi & ~held) == 0 && (dev & ~held) == 0);
    KVIDX__CHK(KVIDX__LEN(kvidx__ld(&rn->shape)) == 64 || (held >> KVIDX__LEN(kvidx__ld(&rn->shape))) == 0);
    j = KVIDX__CAST(uint32_t, kvidx__ld(&h[KVIDX__H_INDEX]));
    KVIDX__CHK(j < KVIDX__NHOLD(kvidx__ld(&rn->nhold)));
    KVIDX__CHK(kvidx__ld(kvidx__holder(ix, rn, j)) == kvidx__holder_word(s, held));
    KVIDX__CHK(ix->hw < 2 || kvidx__ld(kvidx__holder(ix, rn, j) + 1) == dev);
    KVIDX__CHK(ix->tiers_on || dev == held);
  }
  return 0;
}

KVIDX__PRIV int kvidx__check_multi(kvidx *ix) { /* after the subtraction every count is zero */
  uint32_t i;
  for (i = kvidx__map_next(&ix->multi, KVIDX__NONE); i != KVIDX__NONE; i = kvidx__map_next(&ix->multi, i))
    KVIDX__CHK(kvidx__ld(&kvidx__map_at(&ix->multi, i)[2]) == 0);
  return 0;
}

/* A table's control bytes: there exactly when kvidx__ctrl_wanted, each
 * used place's byte from its key's hash, a free one's 0 or deleted (as many
 * deleted as counted, with the entries at most 3/4 of the places), the
 * first 16 again after the last; no table without them has deleted places.
 * (kvidx__check_map finds every entry by probing: the probes' rule holds.) */
KVIDX__PRIV int kvidx__check_ctrl(kvidx *ix, const kvidx__map *m, const kvidx__mtab *t) {
  uint64_t i, n = t->mask + 1, tombs = 0;
  KVIDX__CHK(!t->ctrl == !kvidx__ctrl_wanted(ix, m));
  if (!t->ctrl) return t->tombs != 0;
  for (i = 0; i < n; i++) {
    KVIDX__A(uint64_t) *e = kvidx__mtab_words(t) + i * m->ew;
    if (KVIDX__CTRL_USED(t->ctrl[i])) { /* a free place's words may hold anything (kvidx__place_used): unread */
      uint64_t key = kvidx__ld(&e[0]);
      KVIDX__CHK(kvidx__ld(&e[m->occ]) && t->ctrl[i] == KVIDX__CTRL_BYTE(kvidx__key_hash(ix->seed, &key, 1)));
    } else {
      KVIDX__CHK(t->ctrl[i] == 0 || t->ctrl[i] == KVIDX__CTRL_DELETED);
      tombs += t->ctrl[i] == KVIDX__CTRL_DELETED;
    }
  }
  KVIDX__CHK(tombs == t->tombs && (kvidx__ld(&m->old) == t || (m->n + tombs) * 4 <= n * 3));
  for (i = 0; i < 16; i++) KVIDX__CHK(t->ctrl[n + i] == t->ctrl[i & t->mask]);
  return 0;
}

/* A map: n entries over both tables, each found where it is, at most 3/4
 * full, old's swept places free, control bytes right. */
KVIDX__PRIV int kvidx__check_map(kvidx *ix, const kvidx__map *m) {
  kvidx__map *mm = KVIDX__UNC(kvidx__map *, m);
  const kvidx__mtab *t = kvidx__ld(&mm->tab), *o = kvidx__ld(&mm->old);
  uint64_t n = 0, i;
  uint32_t at, k;
  for (at = kvidx__map_next(m, KVIDX__NONE); at != KVIDX__NONE; at = kvidx__map_next(m, at)) {
    uint64_t key[2];
    for (k = 0; k < m->kw; k++) key[k] = kvidx__ld(&kvidx__map_at(m, at)[k]);
    KVIDX__CHK(kvidx__map_find(ix, m, key) == at);
    KVIDX__CHK(!m->seq || KVIDX__POS_TAG(kvidx__key_hash(ix->seed, key, 1)) ==
                              (kvidx__ld(&kvidx__map_at(m, at)[1]) & KVIDX__POS_TAG(~KVIDX__CAST(uint64_t, 0))));
    n++;
  }
  KVIDX__CHK(n == m->n && (!t || n * 4 <= (t->mask + 1) * 3) && (!o || t));
  for (i = 0; o && i < m->drained; i++) KVIDX__CHK(!kvidx__place_used(m, o, (m->drain_from + i) & o->mask));
  KVIDX__CHK(!t || kvidx__check_ctrl(ix, m, t) == 0);
  KVIDX__CHK(!o || kvidx__check_ctrl(ix, m, o) == 0);
  return 0;
}

KVIDX__PRIV int kvidx__check_runs(kvidx *ix) {
  uint32_t r, live = 0, freed = 0;
  size_t entries = 0, holders = 0;
  for (r = 0; r < ix->runs_hw; r++) {
    kvidx__run *rn = kvidx__run_at(ix, r);
    uint32_t shape = kvidx__ld(&rn->shape), len = KVIDX__LEN(shape), parent = kvidx__ld(&rn->parent), j, hword, nh;
    KVIDX__CHK((kvidx__ld(&rn->ver) & 1) == 0);
    if (!len) continue;
    live++;
    entries += len;
    KVIDX__CHK(len <= KVIDX__RUN_MAX && len <= (1u << KVIDX__LCLS(shape)));
    KVIDX__CHK(kvidx__child_find(ix, parent, KVIDX__POFF(shape), kvidx__local_at(ix, rn, 0)) == r);
    if (parent != KVIDX__NONE) {
      kvidx__run *pn;
      KVIDX__CHK(parent < ix->runs_hw);
      pn = kvidx__run_at(ix, parent);
      KVIDX__CHK(KVIDX__POFF(shape) < KVIDX__LEN(kvidx__ld(&pn->shape)));
    } else {
      KVIDX__CHK(KVIDX__POFF(shape) == 0 || KVIDX__POFF(shape) == KVIDX__DETACHED);
    }
    hword = kvidx__ld(&rn->nhold);
    nh = KVIDX__NHOLD(hword);
    KVIDX__CHK((hword & 0x00FF0000u) == 0);              /* no count left behind by a checker */
    KVIDX__CHK(KVIDX__CONT_OFF(hword) < KVIDX__RUN_MAX); /* an offset, or 0 */
    { /* the hint's offset went with it: a hint still hanging here says where */
      uint32_t c = kvidx__ld(&rn->cont);
      kvidx__run *cn = c != KVIDX__NONE && c < ix->runs_hw ? kvidx__run_at(ix, c) : NULL;
      KVIDX__CHK(c == KVIDX__NONE || c < ix->runs_hw);
      KVIDX__CHK(!cn || !KVIDX__LEN(kvidx__ld(&cn->shape)) || kvidx__ld(&cn->parent) != r ||
                 KVIDX__POFF(kvidx__ld(&cn->shape)) == KVIDX__CONT_OFF(hword));
    }
    KVIDX__CHK(nh || kvidx__ld(&rn->kids)); /* nobody holds it and nothing hangs below: freed */
    /* nobody holds it: at the top (root or detached), unless its chain was
     * taken by another detached run (a chain collision) */
    KVIDX__CHK(nh || kvidx__ld(&rn->parent) == KVIDX__NONE ||
               kvidx__child_find(ix, KVIDX__NONE, KVIDX__DETACHED, kvidx__chain_at(ix, r, 0)) != KVIDX__NONE);
    KVIDX__CHK(nh == 0 || (KVIDX__HCLS(shape) != KVIDX__NOCLASS && nh * ix->hw <= (1u << KVIDX__HCLS(shape))));
    for (j = 0; j < nh; j++) { /* each entry has its holding */
      uint32_t s = KVIDX__CAST(uint32_t, kvidx__ld(kvidx__holder(ix, rn, j)) & 0xFFFFFFFFu), at;
      KVIDX__CHK(s < ix->max_workers && (at = kvidx__hold_find(ix, s, r)) != KVIDX__NONE);
      KVIDX__CHK(kvidx__ld(&kvidx__map_at(&ix->holds, at)[KVIDX__H_INDEX]) == j);
    }
    holders += nh;
  }
  for (r = ix->run_free; r != KVIDX__NONE; r = kvidx__ld(&kvidx__run_at(ix, r)->kids)) {
    KVIDX__CHK(r < ix->runs_hw && ++freed <= ix->runs_hw && KVIDX__LEN(kvidx__ld(&kvidx__run_at(ix, r)->shape)) == 0);
  }
  KVIDX__CHK(live == ix->runs_live && live + freed == ix->runs_hw && entries == ix->entries);
  /* kids: count each live run's children (mod 2^8) in bits 16-23 of its
   * nhold word (every live run's parent lives, see above), compare, reset;
   * and the sum of all kids against the runs with a parent, which an error
   * of a multiple of 2^8 in one run does not pass.  Readers beside the
   * checker read only the other bits, which stay as they are, and kids
   * itself is untouched: readers skip the child map below a run whose kids
   * read 0. */
  {
    uint64_t hung = 0, kids = 0;
    for (r = 0; r < ix->runs_hw; r++) {
      kvidx__run *rn = kvidx__run_at(ix, r);
      uint32_t parent = kvidx__ld(&rn->parent);
      if (KVIDX__LEN(kvidx__ld(&rn->shape)) && parent != KVIDX__NONE) {
        kvidx__run *pn = kvidx__run_at(ix, parent);
        uint32_t v = kvidx__ld(&pn->nhold);
        if (*kvidx__kid_hi(ix, parent) <= KVIDX__POFF(kvidx__ld(&rn->shape))) freed = KVIDX__NONE; /* kid_hi low */
        kvidx__st(&pn->nhold, (v & 0xFF00FFFFu) | (((v >> 16) + 1) & 0xFFu) << 16);
        hung++;
      }
    }
    KVIDX_TEST_HOOK(ix, 8); /* the checker, its counts in the nhold words */
    for (r = 0; r < ix->runs_hw; r++) {
      kvidx__run *rn = kvidx__run_at(ix, r);
      uint32_t v = kvidx__ld(&rn->nhold);
      if (!KVIDX__LEN(kvidx__ld(&rn->shape))) continue;
      if (((v >> 16) & 0xFFu) != (kvidx__ld(&rn->kids) & 0xFFu)) freed = KVIDX__NONE;
      kids += kvidx__ld(&rn->kids);
      kvidx__st(&rn->nhold, v & 0xFF00FFFFu);
    }
    KVIDX__CHK(freed != KVIDX__NONE && kids == hung);
  }
  KVIDX__CHK(holders == ix->holds.n && ix->children.n == live);
  { /* detached runs: counted, each in a filter cell that counts it, and
       the cells that have not saturated count exactly their runs */
    uint32_t det = 0, unsat = 0, sum = 0;
    for (r = 0; r < ix->runs_hw; r++) {
      kvidx__run *rn = kvidx__run_at(ix, r);
      uint32_t shape = kvidx__ld(&rn->shape);
      if (KVIDX__LEN(shape) && kvidx__ld(&rn->parent) == KVIDX__NONE && KVIDX__POFF(shape) == KVIDX__DETACHED) {
        unsigned char f = ix->det_filter[KVIDX__DET_SLOT(kvidx__local_at(ix, rn, 0))];
        det++;
        unsat += f < 255;
        KVIDX__CHK(f);
      }
    }
    for (r = 0; r < KVIDX__DET_FILTER; r++) {
      sum += ix->det_filter[r] < 255 ? ix->det_filter[r] : 0;
      KVIDX__CHK(ix->detached || !ix->det_filter[r]); /* none left: no cell set (not even a saturated one) */
    }
    KVIDX__CHK(det == ix->detached && sum == unsat);
  }
  return 0;
}

KVIDX_DEF int kvidx__check(const kvidx *cix) {
  kvidx *ix = KVIDX__MUT(cix);
  uint32_t s, i;
  size_t total = 0, used = 0;
  int rc;
  if (!ix) return -__LINE__;
  if (ix->kind == KVIDX_REFERENCE) return kvidx__ref_check(ix);
  for (s = 0; s < ix->max_workers; s++) {
    const kvidx__slot *sl = &ix->slots[s];
    if (!sl->used) continue;
    used++;
    KVIDX__CHK(sl->blocks > 0 && kvidx__slot_find(ix, kvidx__ld(&ix->idents[s].id), kvidx__ld(&ix->idents[s].rank)) == s);
    KVIDX__CHK(s / 64 < kvidx__ld(&ix->nw_live) && kvidx__ld(&ix->idents[s].gen) <= kvidx__ld(&ix->gen));
    total += sl->blocks;
  }
  KVIDX__CHK(used == ix->slots_used && total == ix->blocks && ix->slot_map.n == used);
  { /* order hints: the live slots' places in (id, rank) order, 0..used-1 */
    uint32_t by_place[KVIDX_WORKERS_MAX];
    for (i = 0; i < used; i++) by_place[i] = KVIDX__NONE;
    for (s = 0; s < ix->max_workers; s++) {
      uint32_t o = kvidx__ld(&ix->idents[s].order);
      if (!ix->slots[s].used) continue;
      KVIDX__CHK(o < used && by_place[o] == KVIDX__NONE);
      by_place[o] = s;
    }
    for (i = 1; i < used; i++) KVIDX__CHK(kvidx__ident_before(ix, by_place[i - 1], by_place[i]));
    for (i = 0; i < used; i++) KVIDX__CHK(kvidx__ld(&ix->idents[i].at_order) == by_place[i]); /* the inverse */
    KVIDX__CHK((kvidx__ld(&ix->order_ver) & 1) == 0);
  }
  if ((rc = kvidx__check_map(ix, &ix->slot_map)) != 0 || (rc = kvidx__check_map(ix, &ix->children)) != 0 ||
      (rc = kvidx__check_map(ix, &ix->holds)) != 0 || (rc = kvidx__check_map(ix, &ix->multi)) != 0)
    return rc;
  for (s = 0; s < ix->max_workers; s++)
    if (ix->slots[s].used && (rc = kvidx__check_map(ix, &ix->slots[s].seqs)) != 0) return rc;
  if ((rc = kvidx__check_holdings(ix, 0)) != 0 || (rc = kvidx__check_runs(ix)) != 0) return rc;
  for (s = 0; s < ix->max_workers; s++) {
    uint64_t done;
    if (ix->slots[s].used && (rc = kvidx__check_seqs(ix, s, -1, ~KVIDX__CAST(uint64_t, 0), &done)) != 0) {
      kvidx__check_put_back(ix, s, done); /* found wrong: change nothing more */
      return rc;
    }
  }
  rc = kvidx__check_holdings(ix, 1);
  if (!rc) rc = kvidx__check_multi(ix);
  KVIDX_TEST_HOOK(ix, 8); /* the checker, its counts taken apart */
  kvidx__check_put_back(ix, ix->max_workers, 0);
  if (rc) return rc;
  if (ix->evict) { /* heap order; each holding has exactly one current element */
    size_t cur = 0;
    for (i = 0; i < ix->heap_n; i++) {
      KVIDX__CHK(ix->heap[i].slot < ix->max_workers);
      KVIDX__CHK(!i || !kvidx__victim_less(&ix->heap[i], &ix->heap[(i - 1) / 2]));
      cur += kvidx__victim_entry(ix, &ix->heap[i]) != NULL;
    }
    KVIDX__CHK(cur == ix->blocks);
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
  case KVIDX_RESTARTED: return "stream generation changed: the worker's old blocks were dropped, then the event applied";
  case KVIDX_DUPLICATE: return "event id at or below the last one of its generation: ignored";
  default: return "unknown status";
  }
}

#define KVIDX__STR2(x) #x
#define KVIDX__STR(x) KVIDX__STR2(x)
KVIDX_DEF const char *kvidx_version(void) {
  return KVIDX__STR(KVIDX_VERSION_MAJOR) "." KVIDX__STR(KVIDX_VERSION_MINOR) "." KVIDX__STR(KVIDX_VERSION_PATCH);
}

/* ========================================================================== */
/* 9. Dump and snapshots                                                        */
/* ========================================================================== */
/* Growable scratch (through the hooks): id stacks; the maps are section 2's. */
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


typedef struct {
  kvidx *ix;
  kvidx_event_fn emit;
  void *ctx;
  uint32_t slot;
  uint64_t next_id;
  kvidx__map map;   /* position + 1 -> a seq of this worker at that position */
  kvidx__map fakes; /* invented seqs (value 1)                             */
  kvidx__vec recs;  /* (depth << 32 | seq table place), sorted: parents first */
  kvidx__vec stack; /* ancestors to invent, deepest first                  */
  kvidx__vec fake;  /* invented seqs, removed at the end                   */
} kvidx__dumper;

/* The seq the dump gave position pl, if it gave one. */
KVIDX__PRIV int kvidx__dump_seq_at(const kvidx__dumper *d, uint64_t pl, uint64_t *seq) {
  uint64_t key = pl + 1;
  uint32_t at = kvidx__map_find(d->ix, &d->map, &key);
  if (at == KVIDX__NONE) return 0;
  if (seq) *seq = kvidx__ld(&kvidx__map_at(&d->map, at)[1]);
  return 1;
}

KVIDX__PRIV int kvidx__dump_put(kvidx *ix, kvidx__map *m, uint64_t key, uint64_t val) {
  uint64_t e[2];
  int rc = kvidx__map_reserve(ix, m, 1);
  if (rc != KVIDX_OK) return rc;
  e[0] = key;
  e[1] = val;
  kvidx__map_insert(ix, m, e);
  return KVIDX_OK;
}

/* A position as one number: run << 8 | offset. */
#define KVIDX__PLACE(r, off) (KVIDX__CAST(uint64_t, r) << 8 | (off))

KVIDX__PRIV uint64_t kvidx__place_parent(const kvidx *ix, uint64_t pl) { /* KVIDX__NONE: the root */
  uint32_t r = KVIDX__CAST(uint32_t, pl >> 8), off = KVIDX__CAST(uint32_t, pl & 0xFFu);
  kvidx__run *rn = kvidx__run_at(ix, r);
  if (off) return pl - 1;
  if (kvidx__ld(&rn->parent) == KVIDX__NONE) return KVIDX__NONE;
  return KVIDX__PLACE(kvidx__ld(&rn->parent), KVIDX__POFF(kvidx__ld(&rn->shape)));
}

KVIDX__PRIV uint64_t kvidx__place_depth(const kvidx *ix, uint64_t pl) {
  uint32_t r = KVIDX__CAST(uint32_t, pl >> 8);
  uint64_t d = pl & 0xFFu;
  for (;;) {
    kvidx__run *rn = kvidx__run_at(ix, r);
    if (kvidx__ld(&rn->parent) == KVIDX__NONE) return d;
    d += KVIDX__POFF(kvidx__ld(&rn->shape)) + 1u;
    r = kvidx__ld(&rn->parent);
  }
}

KVIDX__PRIV int kvidx__dump_store(kvidx__dumper *d, uint64_t pl, uint64_t seq, int tier, uint64_t expires,
                                  int stand_in) {
  kvidx *ix = d->ix;
  uint64_t par = kvidx__place_parent(ix, pl), pseq = 0;
  int has_parent = par != KVIDX__NONE && kvidx__dump_seq_at(d, par, &pseq);
  const kvidx__run *rn = kvidx__run_at(ix, KVIDX__CAST(uint32_t, pl >> 8));
  kvidx_block b;
  kvidx_event ev;
  b.local = kvidx__local_at(ix, rn, KVIDX__CAST(uint32_t, pl & 0xFFu));
  b.seq = seq;
  memset(&ev, 0, sizeof ev);
  ev.event_id = d->next_id++;
  ev.worker_id = kvidx__ld(&ix->idents[d->slot].id);
  ev.dp_rank = kvidx__ld(&ix->idents[d->slot].rank);
  ev.type = KVIDX_EV_STORED;
  ev.tier = tier;
  ev.parent = has_parent ? &pseq : NULL;
  ev.blocks = &b;
  ev.n = 1;
  ev.expires_at = expires;
  ev.detached = par == KVIDX__NONE && KVIDX__POFF(kvidx__ld(&rn->shape)) == KVIDX__DETACHED; /* no parent: a top's first block */
  ev.stand_in = stand_in;
  return d->emit(d->ctx, &ev) ? KVIDX_EIO : KVIDX_OK;
}

/* Invent a seq for a stand-in ancestor: not one the worker holds, not one
 * invented before. */
KVIDX__PRIV uint64_t kvidx__dump_fake_seq(kvidx__dumper *d, uint64_t pl) {
  uint64_t c = kvidx__mix(pl ^ 0x6b76696478667331ull);
  for (;;) {
    if (kvidx__map_find(d->ix, &d->ix->slots[d->slot].seqs, &c) == KVIDX__NONE &&
        kvidx__map_find(d->ix, &d->fakes, &c) == KVIDX__NONE)
      return c;
    c = kvidx__mix(c + 1);
  }
}

KVIDX__PRIV int kvidx__dump_worker(kvidx__dumper *d) {
  kvidx *ix = d->ix;
  const kvidx__map *seqs = &ix->slots[d->slot].seqs;
  uint64_t i;
  uint32_t at;
  int rc;
  kvidx__map_drop(ix, &d->map); /* a fresh map per worker */
  kvidx__map_drop(ix, &d->fakes);
  d->recs.n = d->stack.n = d->fake.n = 0;
  d->next_id = 1;
  for (at = kvidx__map_next(seqs, KVIDX__NONE); at != KVIDX__NONE; at = kvidx__map_next(seqs, at)) {
    uint64_t pos = kvidx__ld(&kvidx__map_at(seqs, at)[1]);
    if ((rc = kvidx__vec_push(ix, &d->recs, kvidx__place_depth(ix, KVIDX__PLACE(KVIDX__POS_RUN(pos), KVIDX__POS_OFF(pos))) << 32 | at)) != KVIDX_OK)
      return rc;
  }
  if (d->recs.n > 1) qsort(d->recs.v, d->recs.n, 8, kvidx__cmp_u64);
  for (i = 0; i < d->recs.n; i++) {
    KVIDX__A(uint64_t) *e = kvidx__map_at(seqs, KVIDX__CAST(uint32_t, d->recs.v[i] & 0xFFFFFFFFu));
    uint64_t seq = kvidx__ld(&e[0]), pos = kvidx__ld(&e[1]), pl = KVIDX__PLACE(KVIDX__POS_RUN(pos), KVIDX__POS_OFF(pos));
    uint64_t a = kvidx__place_parent(ix, pl), expires = 0;
    uint32_t tb;
    /* a hole: the worker lacks the parent; invent the missing ancestors */
    while (a != KVIDX__NONE && !kvidx__dump_seq_at(d, a, NULL)) {
      if ((rc = kvidx__vec_push(ix, &d->stack, a)) != KVIDX_OK) return rc;
      a = kvidx__place_parent(ix, a);
    }
    while (d->stack.n) {
      uint64_t anc = d->stack.v[--d->stack.n], fs = kvidx__dump_fake_seq(d, anc);
      if ((rc = kvidx__vec_push(ix, &d->fake, fs)) != KVIDX_OK || (rc = kvidx__dump_put(ix, &d->fakes, fs, 1)) != KVIDX_OK ||
          (rc = kvidx__dump_store(d, anc, fs, KVIDX_TIER_DEVICE, 0, 1)) != KVIDX_OK ||
          (rc = kvidx__dump_put(ix, &d->map, anc + 1, fs)) != KVIDX_OK)
        return rc;
    }
    if (ix->evict == KVIDX_EVICT_EXPIRY && kvidx__ld(&e[2]) != ~KVIDX__CAST(uint64_t, 0)) expires = kvidx__ld(&e[2]);
    for (tb = 0; tb <= KVIDX_TIER_DISK; tb++)
      if ((KVIDX__POS_TIERS(pos) >> tb) & 1 && (rc = kvidx__dump_store(d, pl, seq, KVIDX__CAST(int, tb), expires, 0)) != KVIDX_OK)
        return rc;
    if (!kvidx__dump_seq_at(d, pl, NULL) && (rc = kvidx__dump_put(ix, &d->map, pl + 1, seq)) != KVIDX_OK) return rc;
  }
  if (d->fake.n) { /* the stand-ins go again: the holes come back */
    kvidx_event ev;
    memset(&ev, 0, sizeof ev);
    ev.event_id = d->next_id++;
    ev.worker_id = kvidx__ld(&ix->idents[d->slot].id);
    ev.dp_rank = kvidx__ld(&ix->idents[d->slot].rank);
    ev.type = KVIDX_EV_REMOVED;
    ev.tier = KVIDX_TIER_ALL;
    ev.seqs = d->fake.v;
    ev.n = d->fake.n;
    ev.stand_in = 1;
    if (d->emit(d->ctx, &ev)) return KVIDX_EIO;
  }
  return KVIDX_OK;
}

/* The caller holds the writer lock (writers wait; readers go on). */
KVIDX__PRIV int kvidx__dump_locked(kvidx *ix, kvidx_event_fn emit, void *ctx) {
  kvidx__dumper d;
  int rc = KVIDX_OK;
  if (ix->kind == KVIDX_REFERENCE || ix->buffer_mode) return KVIDX_ENOTSUP;
  d.ix = ix;
  d.emit = emit;
  d.ctx = ctx;
  d.slot = 0;
  d.next_id = 0;
  d.recs.v = d.stack.v = d.fake.v = NULL;
  d.recs.n = d.recs.cap = d.stack.n = d.stack.cap = d.fake.n = d.fake.cap = 0;
  kvidx__map_init(&d.map, 2, 1, 0, 0);
  kvidx__map_init(&d.fakes, 2, 1, 1, 0);
  for (d.slot = 0; d.slot < ix->max_workers && rc == KVIDX_OK; d.slot++)
    if (ix->slots[d.slot].used) rc = kvidx__dump_worker(&d);
  kvidx__map_drop(ix, &d.map);
  kvidx__map_drop(ix, &d.fakes);
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
 * records (48 bytes each, little endian), every version:
 *   u8 type, u8 tier, u8 has_parent, u8 flags, u32 dp_rank, u64 worker_id,
 *   u64 a, u64 b, u64 c, u64 d
 *   type 1 Stored block: a parent seq, b local, c seq, d expires_at;
 *                        has_parent 1: a is its parent, 0: a root block,
 *                        2 (version 3): a detached block (kvidx_event's
 *                        detached; a is 0)
 *   type 2 Removed:      a seq (tier 255 = every copy)
 *   type 3 event id:     a last event id, b the stream's generation (read
 *                        back as is; not checked)
 *   flags: 0, or (version 4, types 1 and 2) 1: a stand-in ancestor's
 *   Stored record or its Removed record (kvidx_event.stand_in).  The
 *   reader lets stand-ins go past the target's max_blocks (they are gone
 *   when the stream ends), so a snapshot taken at max_blocks loads back
 *   into an index of the same size; every stand-in stored must be removed
 *   again by the end of the stream (else KVIDX_ECORRUPT).  Not in caller-
 *   buffer mode, whose memory is sized by max_blocks: there stand-ins count
 *   (and in streams before version 4, which do not mark them).
 * Version 3 is version 2 with detached blocks; version 4 is version 3 with
 * flags.  Version 4 is written when a worker has a hole or the index has
 * detached runs (a detached run's first block is written as a stand-in),
 * else version 2, so builds before version 4 read what does not need it
 * and refuse the rest with KVIDX_EVERSION.  Versions 1-4 are read.
 * Version 2: everything is verified before it is applied, and a
 * stream of L bytes costs O(L) work and memory.
 *   header (48 bytes): "KVIDXSNP", u32 version = 2 (3, 4), u32 record size = 48,
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
#define KVIDX__SNAP_VERSION 4u
#define KVIDX__SNAP_REC 48
#define KVIDX__SNAP_HDR 48
#define KVIDX__SNAP_CHUNK 64 /* records per checksummed chunk */

typedef struct {
  kvidx_write_fn write;
  void *ctx;
  int counting;   /* first pass: only count the records */
  int failed;
  uint64_t count; /* records so far */
  uint64_t stand_ins; /* stand-in records so far (they need version 4) */
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

KVIDX__PRIV void kvidx__snap_rec(unsigned char *r, int type, int tier, int has_parent, int flags, uint32_t rank,
                                 uint64_t worker, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  memset(r, 0, KVIDX__SNAP_REC);
  r[0] = KVIDX__CAST(unsigned char, type);
  r[1] = KVIDX__CAST(unsigned char, tier);
  r[2] = KVIDX__CAST(unsigned char, has_parent);
  r[3] = KVIDX__CAST(unsigned char, flags);
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
KVIDX__PRIV int kvidx__snap_add(kvidx__snapw *w, int type, int tier, int has_parent, int flags, uint32_t rank,
                                uint64_t worker, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  w->count++;
  w->stand_ins += flags & 1;
  if (w->counting) return KVIDX_OK;
  kvidx__snap_rec(w->buf + w->nbuf * KVIDX__SNAP_REC, type, tier, has_parent, flags, rank, worker, a, b, c, d);
  return ++w->nbuf == KVIDX__SNAP_CHUNK ? kvidx__snap_flush(w) : KVIDX_OK;
}

KVIDX__PRIV int kvidx__snap_emit(void *ctx, const kvidx_event *ev) {
  kvidx__snapw *w = KVIDX__CAST(kvidx__snapw *, ctx);
  size_t i;
  int rc;
  for (i = 0; i < ev->n; i++) {
    if (ev->type == KVIDX_EV_STORED)
      rc = kvidx__snap_add(w, 1, ev->tier, ev->detached ? 2 : ev->parent != NULL, ev->stand_in != 0, ev->dp_rank,
                           ev->worker_id, ev->parent ? *ev->parent : 0, ev->blocks[i].local, ev->blocks[i].seq,
                           ev->expires_at);
    else
      rc = kvidx__snap_add(w, 2, KVIDX_TIER_ALL, 0, ev->stand_in != 0, ev->dp_rank, ev->worker_id, ev->seqs[i], 0, 0, 0);
    if (rc != KVIDX_OK) return 1;
  }
  return 0;
}

/* Every record of the snapshot through w (the caller holds the lock). */
KVIDX__PRIV int kvidx__snap_records(kvidx *ix, kvidx__snapw *w) {
  uint32_t i;
  int rc = kvidx__dump_locked(ix, kvidx__snap_emit, w);
  for (i = 0; rc == KVIDX_OK && i <= ix->evtab_mask; i++) /* each worker's last event id */
    if (ix->evtab[i].used) rc = kvidx__snap_add(w, 3, 0, 0, 0, ix->evtab[i].rank, ix->evtab[i].id, ix->evtab[i].last, ix->evtab[i].gen, 0, 0);
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
    h[8] = w.stand_ins || ix->detached ? KVIDX__SNAP_VERSION : 2u; /* 2 when it holds the index (see above) */
    h[12] = KVIDX__SNAP_REC;
    kvidx__put64(h + 16, n);
    kvidx__put64(h + 24, KVIDX__SNAP_HDR + n * KVIDX__SNAP_REC + (n + KVIDX__SNAP_CHUNK - 1) / KVIDX__SNAP_CHUNK * 8);
    h[32] = KVIDX__SNAP_CHUNK;
    w.seed = XXH3_64bits_withSeed(h, 40, 0);
    kvidx__put64(h + 40, w.seed);
    w.counting = 0;
    w.count = w.stand_ins = 0;
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
      kvidx__clear_slot(ix, i);
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

typedef struct {
  uint32_t version;
  uint64_t stand_ins; /* stand-ins stored and not removed yet               */
  size_t max_blocks;  /* the target's own; max_blocks is raised by stand_ins
                         while the stream is read (heap mode)               */
  uint64_t pruned;    /* ix->pruned when the read began                     */
  uint64_t dropped;   /* blocks the target could never keep, left out       */
} kvidx__snapr;

/* Whether the read has lost a block (the target evicted or left one out):
 * only then may a parent be missing or a removal find nothing. */
KVIDX__PRIV int kvidx__snap_lossy(const kvidx *ix, const kvidx__snapr *rd) {
  return ix->evict && (ix->pruned != rd->pruned || rd->dropped);
}

/* The target's capacity while a snapshot is read: max_blocks plus the
 * stand-ins it holds (caller-buffer mode: max_blocks, which sized its
 * memory).  The maps' bounds follow it. */
KVIDX__PRIV void kvidx__snap_room(kvidx *ix, const kvidx__snapr *rd) {
  kvidx__lock(ix);
  ix->max_blocks = rd->max_blocks + (ix->buffer_mode ? 0 : KVIDX__CAST(size_t, rd->stand_ins));
  kvidx__bound_by_blocks(ix);
  kvidx__unlock(ix);
}

/* Applies one record (types 1-3) of any version (a detached store, r[2] 2,
 * only from version 3, the stand-in flag from version 4). */
KVIDX__PRIV int kvidx__snap_apply(kvidx *ix, const unsigned char *r, kvidx__snapr *rd) {
  uint32_t rank = kvidx__get32(r + 4);
  uint64_t worker = kvidx__get64(r + 8), a = kvidx__get64(r + 16), b = kvidx__get64(r + 24),
           c = kvidx__get64(r + 32), d = kvidx__get64(r + 40);
  int rc, stand_in = r[3] == 1;
  if (r[3] > (rd->version >= 4 && r[0] != 3 ? 1 : 0)) return KVIDX_ECORRUPT;
  if (r[0] == 1) {
    kvidx_block blk;
    if (r[1] > KVIDX_TIER_DISK || r[2] > (rd->version >= 3 ? 2 : 1) || (r[2] != 1 && a) ||
        (d && ix->evict != KVIDX_EVICT_EXPIRY))
      return KVIDX_ECORRUPT;
    blk.local = b;
    blk.seq = c;
    if (stand_in) { /* room first: it does not count against max_blocks */
      rd->stand_ins++;
      kvidx__snap_room(ix, rd);
    }
    rc = kvidx__store(ix, worker, rank, r[2] == 1 ? &a : NULL, &blk, 1, r[1], d, r[2] == 2);
    /* parents come first in a sound snapshot; a target smaller than the
     * snapshot that evicts may have let the parent go (or, at max_blocks
     * 1, never keep a block with its parent): the block goes too */
    if ((rc == KVIDX_ENOPARENT && kvidx__snap_lossy(ix, rd)) ||
        (rc == KVIDX_EFULL && ix->evict && r[2] == 1 && ix->max_blocks < 2)) {
      rd->dropped++;
      return KVIDX_OK;
    }
    return rc == KVIDX_ENOPARENT ? KVIDX_ECORRUPT : rc;
  }
  if (r[0] == 2) {
    if (r[1] != KVIDX_TIER_ALL || r[2] || b || c || d || (stand_in && !rd->stand_ins)) return KVIDX_ECORRUPT;
    rc = kvidx__remove(ix, worker, rank, &a, 1, KVIDX_TIER_ALL);
    /* a dump removes only stand-ins: one may be gone already (evicted, or
     * left out), flagged or not (streams before version 4) */
    if (rc != KVIDX_OK && !(rc == KVIDX_ENOENT && kvidx__snap_lossy(ix, rd))) return KVIDX_ECORRUPT;
    if (stand_in) { /* gone: its room goes too */
      rd->stand_ins--;
      kvidx__snap_room(ix, rd);
    }
    return KVIDX_OK;
  }
  if (r[0] == 3) { /* b: the stream generation, kept readable as is */
    kvidx__evid *e;
    if (r[1] || r[2] || c || d || kvidx__ev_find(ix, worker, rank)) return KVIDX_ECORRUPT;
    kvidx__lock(ix);
    e = kvidx__ev_put(ix, worker, rank);
    e->last = a;
    e->gen = b;
    kvidx__unlock(ix);
    return KVIDX_OK;
  }
  return KVIDX_ECORRUPT;
}

/* Version 1: records applied as read, the checksum checked at the end. */
KVIDX__PRIV int kvidx__snap_read_v1(kvidx *ix, kvidx_read_fn read, void *ctx, const unsigned char *h,
                                   kvidx__snapr *rd) {
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
    if ((rc = kvidx__snap_apply(ix, r, rd)) != KVIDX_OK) return rc;
  }
}

/* Versions 2 to 4: the header, then each chunk verified before it is
 * applied. */
KVIDX__PRIV int kvidx__snap_read_v2(kvidx *ix, kvidx_read_fn read, void *ctx, unsigned char *h, kvidx__snapr *rd) {
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
      if ((rc = kvidx__snap_apply(ix, buf + i * KVIDX__SNAP_REC, rd)) != KVIDX_OK) return rc;
    left -= k;
  }
  return KVIDX_OK;
}

KVIDX__PRIV int kvidx__snap_read_all(kvidx *ix, kvidx_read_fn read, void *ctx, kvidx__snapr *rd) {
  unsigned char h[KVIDX__SNAP_HDR];
  int rc;
  if (kvidx__read_full(read, ctx, h, 24) != 24) return KVIDX_ETRUNCATED;
  if (memcmp(h, "KVIDXSNP", 8)) return KVIDX_ECORRUPT;
  rd->version = kvidx__get32(h + 8);
  if (rd->version < 1 || rd->version > KVIDX__SNAP_VERSION) return KVIDX_EVERSION;
  if (kvidx__get32(h + 12) != KVIDX__SNAP_REC) return KVIDX_ECORRUPT;
  rc = rd->version == 1 ? kvidx__snap_read_v1(ix, read, ctx, h, rd) : kvidx__snap_read_v2(ix, read, ctx, h, rd);
  return rc == KVIDX_OK && rd->stand_ins ? KVIDX_ECORRUPT : rc; /* a stand-in must not stay */
}

KVIDX_DEF int kvidx_snapshot_read(kvidx *ix, kvidx_read_fn read, void *ctx) {
  kvidx_stats st;
  kvidx__snapr rd;
  int rc;
  if (!ix || !read) return KVIDX_EINVAL;
  kvidx_get_stats(ix, &st);
  if (st.blocks || ix->evtab_n) return KVIDX_EINVAL; /* the target must be empty */
  rd.version = 0;
  rd.stand_ins = rd.dropped = 0;
  rd.max_blocks = ix->max_blocks;
  rd.pruned = ix->pruned;
  rc = kvidx__snap_read_all(ix, read, ctx, &rd);
  if (rc != KVIDX_OK) kvidx__empty(ix);
  rd.stand_ins = 0; /* the configured capacity again */
  kvidx__snap_room(ix, &rd);
  if (rc == KVIDX_OK && ix->evict) { /* room a stand-in had that was evicted early may have gone to
                                        blocks: back under max_blocks, as a store would prune */
    kvidx__lock(ix);
    if (ix->kind == KVIDX_REFERENCE) {
      if (ix->ref->blocks > ix->max_blocks) kvidx__ref_prune(ix, ix->evict_target, NULL, NULL);
    } else if (ix->blocks > ix->max_blocks) {
      kvidx__prune(ix, ix->evict_target, KVIDX__NONE, NULL);
    }
    kvidx__unlock(ix);
  }
  return rc;
}
/* ========================================================================== */
/* 10. Reference semantics: the naive nested map that defines every answer    */
/* ========================================================================== */
/* worker -> (seq -> block{local, chain}) and worker -> (chain -> count).
 * Written for obviousness, not speed: linear worker search, linear-probing
 * maps with tombstones, find_matches in O(workers x depth).  Heap mode only.
 * Shares nothing with the indexes but the allocation hooks and the sink. */

KVIDX__PRIV kvidx__rslot *kvidx__rmap_get(const kvidx__rmap *m, uint64_t key) {
  size_t i;
  if (!m->cap) return NULL;
  for (i = KVIDX__CAST(size_t, kvidx__mix(key) & (m->cap - 1));; i = (i + 1) & (m->cap - 1)) {
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
      size_t j = KVIDX__CAST(size_t, kvidx__mix(m->t[i].key) & (ncap - 1));
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
  size_t i = KVIDX__CAST(size_t, kvidx__mix(key) & (m->cap - 1));
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
    ix->pruned++;
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
    if (depth) kvidx__sink_push(k, w->id, w->rank, depth, dev, KVIDX__NO_ORDER);
  }
  return kvidx__sink_finish(k);
}



KVIDX__PRIV size_t kvidx__ref_blocks(const kvidx *ix, uint64_t id, uint32_t rank) {
  const kvidx__rworker *w = kvidx__ref_worker(ix, id, rank);
  return w ? w->blocks.len : 0;
}

KVIDX__PRIV void kvidx__ref_stats(const kvidx *ix, kvidx_stats *st) {
  st->blocks = ix->ref->blocks;
  st->workers = ix->ref->nworkers;
}

KVIDX__PRIV int kvidx__ref_check(const kvidx *ix) {
  size_t nb = 0, nwk = 0, i;
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

KVIDX__PRIV void kvidx__ref_drop_all(kvidx *ix) {
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

#endif /* KVIDX__IMPLEMENTED */
#endif /* KVIDX_IMPLEMENTATION */
