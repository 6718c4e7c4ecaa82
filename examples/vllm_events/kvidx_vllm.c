/* kvidx_vllm.c - a small daemon that indexes vLLM's KV-cache events.
 *
 * It subscribes (ZeroMQ SUB) to the KV event publishers of one or more vLLM
 * instances, feeds every event into a kvidx index through kvidx_apply (with
 * an event id, so lost, repeated and restarted streams are recognised), and
 * answers routing queries on a local socket (a unix socket, or TCP on a
 * loopback address only).
 *
 * WIRE FORMAT (vllm/distributed/kv_events.py, ZmqEventPublisher)
 *   multipart [topic, seq (8 bytes, big endian), payload]; payload is a
 *   msgpack EventBatch, either array-like  [ts, [event...], dp_rank?]  or a
 *   map  {"ts":..., "events":[...], "data_parallel_rank":...}  (recent vLLM
 *   uses msgspec's default map encoding, older releases array_like=True).
 *   Events are tagged:
 *     ["BlockStored", block_hashes, parent_block_hash, token_ids,
 *      block_size, lora_id, medium, lora_name?, extra_keys?, group_idx?, ...]
 *     ["BlockRemoved", block_hashes, medium, group_idx?]
 *     ["AllBlocksCleared"]
 *   or maps with the tag under "type" and the fields by name.  A block hash
 *   is an integer, or bytes (sha256 by default since vLLM 0.10); bytes are
 *   reduced to their last 8 bytes, big endian, exactly as vLLM does when
 *   VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is set, so both modes give the same
 *   keys.  The engine's hashes are only per-worker keys for kvidx: the
 *   index matches on local hashes it computes from token_ids (Dynamo's
 *   XXH3 scheme, seed salted by lora_name), so queries need only tokens.
 *   Events for KV cache groups other than 0 are skipped unless --all-groups.
 *
 * EVENT IDS
 *   seq numbers the batches of one publisher (one vLLM engine, one DP rank).
 *   Event i of batch seq gets id  seq << 24 | i  for its (worker, dp_rank),
 *   and after the batch an empty Removed with id  seq << 24 | 0xFFFFFF
 *   (the end marker) closes it, so the first id of a batch follows the last
 *   id of the batch before (kvidx_apply's KVIDX_GAP for the jump to the end
 *   marker over a batch's unused ids is not counted).  Events that are skipped, malformed or
 *   refused still use up their id (an empty Removed), so only lost batches
 *   show as a gap.  Hence:
 *     a batch missing from the stream -> KVIDX_GAP (counted, logged);
 *     seq going backwards (the publisher restarted) -> KVIDX_RESTARTED:
 *       kvidx drops that (worker, dp_rank)'s old blocks (counted, logged);
 *     a batch delivered again (its end marker is the last id) ->
 *       KVIDX_DUPLICATE, its events are not applied again.
 *   The daemon does not use vLLM's replay socket.
 *
 * STORAGE TIERS
 *   vLLM's "medium" (BlockStored and BlockRemoved; None/absent = GPU) is
 *   mapped with kvidx_tier_from_name: a block may be held on the device, on
 *   the host (CPU offload) and on disk at once.  A Removed on one medium
 *   drops that copy only: a CPU-tier eviction keeps the GPU copy.  MATCH
 *   counts blocks on any tier; MATCHT also says how many are on the device.
 *
 * QUERIES (one line in, one line out)
 *   PING                           -> OK pong
 *   MATCH [lora=NAME] tok tok ...  -> OK blocks=N matches=M wid:dp:depth ...
 *   MATCHH hash hash ...           -> same, from local block hashes (decimal)
 *   MATCHT [lora=NAME] tok tok ... -> OK blocks=N matches=M
 *                                     wid:dp:depth:device_blocks ...
 *   WORKER wid [dp]                -> OK blocks=N
 *   STATS                          -> OK batches=... events=... ...
 *   anything else                  -> ERR ...
 *
 * USAGE
 *   kvidx-vllm-events --endpoint tcp://127.0.0.1:5557=1
 *                     [--endpoint tcp://127.0.0.1:5558=2 ...]
 *                     --listen unix:/run/kvidx.sock | --listen 127.0.0.1:7070
 *                     [--block-size 16] [--topic T] [--kind positional|radix]
 *                     [--snapshot PATH] [--all-groups] [--max-seconds S]
 *                     [--quiet]
 *   Each --endpoint is a vLLM publisher (its kv-events endpoint; one per DP
 *   rank, whose events carry the rank) and the worker id its events are
 *   filed under.  --snapshot PATH: warm restart.  At start the index (and
 *   each worker's last event id) is loaded from PATH if it exists; on a
 *   clean stop (SIGTERM, SIGINT, --max-seconds) it is written to PATH.tmp,
 *   synced and renamed over PATH.
 *
 * Build: make vllm-events (needs libzmq3-dev libmsgpack-dev).
 */
#define _POSIX_C_SOURCE 200809L
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_ENDPOINTS 64
#define MAX_CLIENTS 32
#define MAX_LINE (1u << 20)
#define MAX_SCORES 1024

typedef struct {
  const char *url;
  uint64_t worker_id;
  void *sock;
  int have_seq;
  uint64_t last_seq;
} endpoint;

typedef struct {
  int fd;
  char *buf;
  size_t len;
} client;

typedef struct {
  unsigned long long batches, events, stored, removed, cleared, skipped,
      ignored, errors, enoparent, enoent, efull, malformed, queries,
      gaps, restarts, duplicates, lost_batches;
} counters;

static volatile sig_atomic_t g_stop;
static int g_quiet;
static counters g_c;
static kvidx *g_ix;
static size_t g_block_size = 16;
static int g_all_groups;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

static void logf_(const char *fmt, ...) {
  va_list ap;
  if (g_quiet) return;
  va_start(ap, fmt);
  fputs("kvidx-vllm: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- growable scratch buffers --------------------------------------------- */
static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return p;
  {
    size_t c = *cap ? *cap : 64;
    void *q;
    while (c < need) c *= 2;
    q = realloc(p, c * elem);
    if (!q) {
      fprintf(stderr, "kvidx-vllm: out of memory\n");
      exit(1);
    }
    *cap = c;
    return q;
  }
}

static uint32_t *g_tok;
static size_t g_tok_cap;
static uint64_t *g_u64, *g_loc;
static size_t g_u64_cap, g_loc_cap;
static kvidx_block *g_blk;
static size_t g_blk_cap;

/* ---- msgpack helpers --------------------------------------------------- */
static int str_eq(const msgpack_object *o, const char *s) {
  size_t n = strlen(s);
  return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
         memcmp(o->via.str.ptr, s, n) == 0;
}

static const msgpack_object *map_get(const msgpack_object *m, const char *key) {
  uint32_t i;
  if (!m || m->type != MSGPACK_OBJECT_MAP) return NULL;
  for (i = 0; i < m->via.map.size; i++)
    if (str_eq(&m->via.map.ptr[i].key, key)) return &m->via.map.ptr[i].val;
  return NULL;
}

/* Field `idx` of an array-like struct (idx 0 is the tag for events) or
 * field `name` of a map-encoded one.  NULL when absent. */
static const msgpack_object *field(const msgpack_object *o, uint32_t idx,
                                   const char *name) {
  if (o->type == MSGPACK_OBJECT_ARRAY)
    return idx < o->via.array.size ? &o->via.array.ptr[idx] : NULL;
  return map_get(o, name);
}

static int is_nil(const msgpack_object *o) {
  return !o || o->type == MSGPACK_OBJECT_NIL;
}

/* An ExternalBlockHash: int, or bytes reduced to their last 8 (big endian). */
static int hash_of(const msgpack_object *o, uint64_t *out) {
  const unsigned char *p;
  uint32_t n, i;
  uint64_t h = 0;
  switch (o->type) {
  case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = o->via.u64; return 0;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (uint64_t)o->via.i64; return 0;
  case MSGPACK_OBJECT_BIN:
    p = (const unsigned char *)o->via.bin.ptr;
    n = o->via.bin.size;
    break;
  case MSGPACK_OBJECT_STR:
    p = (const unsigned char *)o->via.str.ptr;
    n = o->via.str.size;
    break;
  default: return -1;
  }
  if (n == 0) return -1;
  for (i = n > 8 ? n - 8 : 0; i < n; i++) h = (h << 8) | p[i];
  *out = h;
  return 0;
}

/* Block hashes of an array into g_u64; returns the count or -1. */
static long hashes_of(const msgpack_object *a) {
  uint32_t i;
  if (!a || a->type != MSGPACK_OBJECT_ARRAY) return -1;
  g_u64 = grow(g_u64, &g_u64_cap, a->via.array.size + 1, sizeof *g_u64);
  for (i = 0; i < a->via.array.size; i++)
    if (hash_of(&a->via.array.ptr[i], &g_u64[i]) != 0) return -1;
  return (long)a->via.array.size;
}

static int uint_of(const msgpack_object *o, uint64_t *out) {
  if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return -1;
  *out = o->via.u64;
  return 0;
}

static uint64_t seed_for(const msgpack_object *lora_name) {
  static char cached_name[256];
  static uint64_t cached_seed;
  static int have;
  char name[256];
  uint32_t n;
  if (is_nil(lora_name) || lora_name->type != MSGPACK_OBJECT_STR ||
      lora_name->via.str.size == 0)
    return KVIDX_SEED;
  n = lora_name->via.str.size < 255 ? lora_name->via.str.size : 255;
  memcpy(name, lora_name->via.str.ptr, n);
  name[n] = 0;
  if (!have || strcmp(name, cached_name) != 0) {
    memcpy(cached_name, name, n + 1);
    cached_seed = kvidx_hash_seed(name, NULL);
    have = 1;
  }
  return cached_seed;
}

static void count_status(int rc) {
  if (rc == KVIDX_ENOPARENT) g_c.enoparent++;
  else if (rc == KVIDX_ENOENT) g_c.enoent++;
  else if (rc == KVIDX_EFULL) g_c.efull++;
  else if (rc < 0) g_c.errors++;
}

/* ---- event ids ------------------------------------------------------------- */
#define EV_SHIFT 24
#define EV_END ((1u << EV_SHIFT) - 1) /* index of a batch's end marker */

static uint64_t ev_id(uint64_t seq, uint32_t index) {
  return (seq << EV_SHIFT) | index; /* seq below 2^40: ~35,000 years at 1 kHz */
}

/* Counts and logs kvidx_apply's informational results.  prev: the worker's
 * last event id before the event (have_prev = 0: none). */
static void note(int info, const kvidx_event *ev, int have_prev, uint64_t prev) {
  unsigned long long w = (unsigned long long)ev->worker_id;
  if (info == KVIDX_GAP) {
    uint64_t from = prev >> EV_SHIFT, to = ev->event_id >> EV_SHIFT;
    g_c.gaps++;
    logf_("worker %llu dp %u: batch seq jumped from %llu to %llu (%llu batches "
          "lost): the index may be stale for this worker", w, ev->dp_rank,
          (unsigned long long)from, (unsigned long long)to,
          (unsigned long long)(to > from ? to - from - 1 : 0));
  } else if (info == KVIDX_RESTARTED) {
    g_c.restarts++;
    logf_("worker %llu dp %u: batch seq went back from %llu to %llu: publisher "
          "restarted, its old blocks were dropped", w, ev->dp_rank,
          (unsigned long long)(have_prev ? prev >> EV_SHIFT : 0),
          (unsigned long long)(ev->event_id >> EV_SHIFT));
  } else if (info == KVIDX_DUPLICATE) {
    g_c.duplicates++;
  }
}

/* An empty Removed with this id: uses the id up without changing holdings.
 * A batch's end marker jumps over the ids its events did not use: that jump
 * is no gap (only ids missing before the batch's first id are). */
static int apply_noop(uint64_t id, uint64_t wid, uint32_t dp) {
  kvidx_event ev;
  uint64_t prev = 0;
  int have_prev, info;
  memset(&ev, 0, sizeof ev);
  ev.event_id = id;
  ev.worker_id = wid;
  ev.dp_rank = dp;
  ev.type = KVIDX_EV_REMOVED;
  ev.tier = KVIDX_TIER_ALL;
  have_prev = kvidx_last_event_id(g_ix, wid, dp, &prev) == KVIDX_OK;
  info = kvidx_apply(g_ix, &ev);
  if (info == KVIDX_GAP && (id & EV_END) == EV_END && prev + 1 >= (id & ~(uint64_t)EV_END))
    info = KVIDX_OK;
  if (info < 0) count_status(info);
  else note(info, &ev, have_prev, prev);
  return info;
}

/* Applies one event with its id; returns kvidx_apply's status.  A refused
 * event (negative status) reports only the error: if its id went backwards
 * the worker's old blocks were dropped all the same (counted as a restart
 * here).  kvidx_apply uses the id up for an event that does not fit
 * (unknown parent or seqs) but not for a resource refusal (the caller could
 * retry); this daemon does not retry, so such an id is used up by an empty
 * Removed, and the next event is not taken for a gap. */
static int apply_ev(const kvidx_event *ev) {
  uint64_t prev = 0, now = 0;
  int have_prev = kvidx_last_event_id(g_ix, ev->worker_id, ev->dp_rank, &prev) == KVIDX_OK;
  int rc = kvidx_apply(g_ix, ev);
  if (rc >= 0) {
    note(rc, ev, have_prev, prev);
    return rc;
  }
  count_status(rc);
  if (rc == KVIDX_EINVAL || rc == KVIDX_ENOTSUP) { /* malformed: nothing happened */
    apply_noop(ev->event_id, ev->worker_id, ev->dp_rank);
    return rc;
  }
  if (have_prev && prev > ev->event_id) note(KVIDX_RESTARTED, ev, have_prev, prev);
  if (!(kvidx_last_event_id(g_ix, ev->worker_id, ev->dp_rank, &now) == KVIDX_OK && now == ev->event_id))
    apply_noop(ev->event_id, ev->worker_id, ev->dp_rank);
  return rc;
}

/* vLLM's medium: nil/absent = device; a string through kvidx_tier_from_name.
 * -1 when it is neither. */
static int tier_of(const msgpack_object *medium) {
  char name[32];
  uint32_t n;
  if (is_nil(medium)) return KVIDX_TIER_DEVICE;
  if (medium->type != MSGPACK_OBJECT_STR) return -1;
  n = medium->via.str.size < sizeof name - 1 ? medium->via.str.size
                                             : (uint32_t)sizeof name - 1;
  memcpy(name, medium->via.str.ptr, n);
  name[n] = 0;
  return kvidx_tier_from_name(name);
}

/* KV cache groups other than 0 are skipped unless --all-groups. */
static int skip_group(const msgpack_object *group) {
  return !g_all_groups && !is_nil(group) &&
         !(group->type == MSGPACK_OBJECT_POSITIVE_INTEGER && group->via.u64 == 0);
}

/* Each on_* applies exactly one event with id `id` (the event or a no-op). */
static void on_stored(const msgpack_object *ev, uint64_t id, uint64_t wid, uint32_t dp) {
  const msgpack_object *par = field(ev, 2, "parent_block_hash");
  const msgpack_object *tok = field(ev, 3, "token_ids");
  const msgpack_object *bs_o = field(ev, 4, "block_size");
  long n = hashes_of(field(ev, 1, "block_hashes"));
  int tier = tier_of(field(ev, 6, "medium"));
  uint64_t parent = 0, bs = 0, seed;
  size_t ntok, i, k;
  kvidx_event e;
  int rc;

  if (skip_group(field(ev, 9, "group_idx"))) {
    g_c.skipped++;
    apply_noop(id, wid, dp);
    return;
  }
  if (n < 0 || tier < 0 || !tok || tok->type != MSGPACK_OBJECT_ARRAY ||
      uint_of(bs_o, &bs) != 0 || bs == 0 ||
      (!is_nil(par) && hash_of(par, &parent) != 0)) {
    g_c.malformed++;
    apply_noop(id, wid, dp);
    return;
  }
  if (bs != g_block_size) {
    static int warned;
    if (!warned) logf_("event block_size %llu differs from --block-size %zu: "
                       "queries will not match", (unsigned long long)bs, g_block_size);
    warned = 1;
  }
  ntok = tok->via.array.size;
  if (ntok < (size_t)n * bs) { /* token_ids must cover every stored block */
    g_c.malformed++;
    apply_noop(id, wid, dp);
    return;
  }
  ntok = (size_t)n * bs;
  g_tok = grow(g_tok, &g_tok_cap, ntok + 1, sizeof *g_tok);
  for (i = 0; i < ntok; i++) {
    const msgpack_object *t = &tok->via.array.ptr[i];
    if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX) {
      g_c.malformed++;
      apply_noop(id, wid, dp);
      return;
    }
    g_tok[i] = (uint32_t)t->via.u64;
  }
  seed = seed_for(field(ev, 7, "lora_name"));
  g_loc = grow(g_loc, &g_loc_cap, (size_t)n + 1, sizeof *g_loc);
  g_blk = grow(g_blk, &g_blk_cap, (size_t)n + 1, sizeof *g_blk);
  k = kvidx_block_hashes(g_tok, ntok, (size_t)bs, seed, g_loc);
  for (i = 0; i < k; i++) {
    g_blk[i].local = g_loc[i];
    g_blk[i].seq = g_u64[i];
  }
  memset(&e, 0, sizeof e);
  e.event_id = id;
  e.worker_id = wid;
  e.dp_rank = dp;
  e.type = KVIDX_EV_STORED;
  e.tier = tier;
  e.parent = is_nil(par) ? NULL : &parent;
  e.blocks = g_blk;
  e.n = k;
  rc = apply_ev(&e);
  if (rc >= 0 && rc != KVIDX_DUPLICATE) g_c.stored += k;
  else if (rc < 0)
    logf_("store worker %llu dp %u (%zu blocks, tier %d): %s",
          (unsigned long long)wid, dp, k, tier, kvidx_strerror(rc));
}

static void on_removed(const msgpack_object *ev, uint64_t id, uint64_t wid, uint32_t dp) {
  long n = hashes_of(field(ev, 1, "block_hashes"));
  int tier = tier_of(field(ev, 2, "medium")), rc;
  kvidx_event e;
  if (skip_group(field(ev, 3, "group_idx"))) {
    g_c.skipped++;
    apply_noop(id, wid, dp);
    return;
  }
  if (n < 0 || tier < 0) {
    g_c.malformed++;
    apply_noop(id, wid, dp);
    return;
  }
  memset(&e, 0, sizeof e);
  e.event_id = id;
  e.worker_id = wid;
  e.dp_rank = dp;
  e.type = KVIDX_EV_REMOVED;
  e.tier = tier; /* this medium's copy only */
  e.seqs = g_u64;
  e.n = (size_t)n;
  rc = apply_ev(&e);
  if ((rc >= 0 && rc != KVIDX_DUPLICATE) || rc == KVIDX_ENOENT)
    g_c.removed += (unsigned long long)n;
}

static void on_event(const msgpack_object *ev, uint64_t id, uint64_t wid, uint32_t dp) {
  const msgpack_object *tag = NULL;
  if (ev->type == MSGPACK_OBJECT_ARRAY && ev->via.array.size > 0)
    tag = &ev->via.array.ptr[0];
  else if (ev->type == MSGPACK_OBJECT_MAP)
    tag = map_get(ev, "type");
  g_c.events++;
  if (str_eq(tag, "BlockStored")) {
    on_stored(ev, id, wid, dp);
  } else if (str_eq(tag, "BlockRemoved")) {
    on_removed(ev, id, wid, dp);
  } else if (str_eq(tag, "AllBlocksCleared")) {
    kvidx_event e;
    memset(&e, 0, sizeof e);
    e.event_id = id;
    e.worker_id = wid;
    e.dp_rank = dp;
    e.type = KVIDX_EV_CLEARED;
    if (apply_ev(&e) != KVIDX_DUPLICATE) g_c.cleared++;
  } else {
    if (tag && tag->type == MSGPACK_OBJECT_STR) g_c.ignored++; /* unknown kind */
    else g_c.malformed++;
    apply_noop(id, wid, dp);
  }
}

static void on_batch(const char *data, size_t len, uint64_t seq, uint64_t wid) {
  msgpack_unpacked up;
  size_t off = 0;
  const msgpack_object *root, *events, *dp_o;
  uint64_t dp = 0, last;
  uint32_t i;

  msgpack_unpacked_init(&up);
  if (msgpack_unpack_next(&up, data, len, &off) != MSGPACK_UNPACK_SUCCESS) {
    g_c.malformed++;
    msgpack_unpacked_destroy(&up);
    return;
  }
  root = &up.data;
  if (root->type != MSGPACK_OBJECT_ARRAY && root->type != MSGPACK_OBJECT_MAP) {
    g_c.malformed++;
  } else {
    events = field(root, 1, "events");
    dp_o = field(root, 2, "data_parallel_rank");
    if (!events || events->type != MSGPACK_OBJECT_ARRAY ||
        (!is_nil(dp_o) && (uint_of(dp_o, &dp) != 0 || dp > UINT32_MAX))) {
      g_c.malformed++;
    } else if (kvidx_last_event_id(g_ix, wid, (uint32_t)dp, &last) == KVIDX_OK &&
               last == ev_id(seq, EV_END)) {
      g_c.batches++; /* delivered before: its end marker is the last id */
      apply_noop(last, wid, (uint32_t)dp); /* KVIDX_DUPLICATE, counted */
    } else {
      g_c.batches++;
      for (i = 0; i < events->via.array.size; i++) {
        if (i >= EV_END) { /* more events than ids per batch */
          g_c.malformed += events->via.array.size - i;
          break;
        }
        on_event(&events->via.array.ptr[i], ev_id(seq, i), wid, (uint32_t)dp);
      }
      apply_noop(ev_id(seq, EV_END), wid, (uint32_t)dp);
    }
  }
  msgpack_unpacked_destroy(&up);
}

/* Drains one SUB socket: each message is [topic, seq, payload]. */
static void on_sub(endpoint *e) {
  for (;;) {
    zmq_msg_t part[3], extra;
    int nparts = 0, more = 1, k;
    while (more) {
      zmq_msg_t *m = nparts < 3 ? &part[nparts] : &extra;
      zmq_msg_init(m);
      if (zmq_msg_recv(m, e->sock, nparts == 0 ? ZMQ_DONTWAIT : 0) < 0) {
        zmq_msg_close(m); /* EAGAIN on the first part: drained */
        for (k = 0; k < nparts && k < 3; k++) zmq_msg_close(&part[k]);
        return;
      }
      more = zmq_msg_more(m);
      if (m == &extra) zmq_msg_close(m);
      nparts++;
    }
    if (nparts != 3 || zmq_msg_size(&part[1]) != 8) {
      g_c.malformed++;
    } else {
      const unsigned char *s = zmq_msg_data(&part[1]);
      uint64_t seq = 0;
      for (k = 0; k < 8; k++) seq = (seq << 8) | s[k];
      /* batches this endpoint skipped (kvidx_apply sees the gap per worker) */
      if (e->have_seq && seq > e->last_seq + 1) g_c.lost_batches += seq - e->last_seq - 1;
      e->have_seq = 1;
      e->last_seq = seq;
      on_batch(zmq_msg_data(&part[2]), zmq_msg_size(&part[2]), seq, e->worker_id);
    }
    for (k = 0; k < nparts && k < 3; k++) zmq_msg_close(&part[k]);
  }
}

/* ---- query socket ----------------------------------------------------------- */
static int listen_on(const char *spec, char *unix_path, size_t upcap) {
  int fd, one = 1;
  if (strncmp(spec, "unix:", 5) == 0) {
    struct sockaddr_un a;
    const char *path = spec + 5;
    if (strlen(path) >= sizeof a.sun_path || strlen(path) >= upcap) {
      fprintf(stderr, "kvidx-vllm: unix socket path too long\n");
      return -1;
    }
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, path, strlen(path) + 1);
    unlink(path);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
      perror("kvidx-vllm: bind unix socket");
      return -1;
    }
    memcpy(unix_path, path, strlen(path) + 1);
  } else {
    /* host:port, loopback only: 127.0.0.0/8, ::1 or localhost */
    char host[128];
    const char *colon = strrchr(spec, ':');
    long port;
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    size_t hl;
    int v6 = 0;
    if (!colon || (hl = (size_t)(colon - spec)) == 0 || hl >= sizeof host) goto bad;
    memcpy(host, spec, hl);
    host[hl] = 0;
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
      memmove(host, host + 1, hl - 2);
      host[hl - 2] = 0;
    }
    port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535) goto bad;
    if (!strcmp(host, "localhost")) strcpy(host, "127.0.0.1");
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
      if ((ntohl(a4.sin_addr.s_addr) >> 24) != 127) goto notlocal;
      a4.sin_family = AF_INET;
      a4.sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, host, &a6.sin6_addr) == 1) {
      if (memcmp(&a6.sin6_addr, &in6addr_loopback, sizeof a6.sin6_addr) != 0)
        goto notlocal;
      a6.sin6_family = AF_INET6;
      a6.sin6_port = htons((uint16_t)port);
      v6 = 1;
    } else {
      goto bad;
    }
    fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || (v6 ? bind(fd, (struct sockaddr *)&a6, sizeof a6)
                      : bind(fd, (struct sockaddr *)&a4, sizeof a4)) != 0) {
      perror("kvidx-vllm: bind");
      return -1;
    }
  }
  if (listen(fd, 16) != 0) {
    perror("kvidx-vllm: listen");
    return -1;
  }
  return fd;
bad:
  fprintf(stderr, "kvidx-vllm: --listen wants unix:PATH or HOST:PORT\n");
  return -1;
notlocal:
  fprintf(stderr, "kvidx-vllm: --listen: %s is not a loopback address; "
                  "queries are served on loopback or a unix socket only\n", spec);
  return -1;
}

static void send_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        continue;
      }
      return;
    }
    s += w;
    n -= (size_t)w;
  }
}

/* Appends to a growable reply string. */
typedef struct {
  char *p;
  size_t n, cap;
} sbuf;
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  int k;
  for (;;) {
    size_t room = b->cap - b->n;
    va_start(ap, fmt);
    k = vsnprintf(b->p ? b->p + b->n : NULL, room, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < room) {
      b->n += (size_t)k;
      return;
    }
    b->p = grow(b->p, &b->cap, b->n + (size_t)k + 1, 1);
  }
}

static void reply_matches(sbuf *out, const uint64_t *loc, size_t n) {
  static kvidx_score sc[MAX_SCORES];
  size_t m = kvidx_find_matches(g_ix, loc, n, sc, MAX_SCORES), i;
  sb_printf(out, "OK blocks=%zu matches=%zu", n, m);
  for (i = 0; i < m && i < MAX_SCORES; i++)
    sb_printf(out, " %llu:%u:%u", (unsigned long long)sc[i].worker_id,
              sc[i].dp_rank, sc[i].depth);
  sb_printf(out, "\n");
}

/* Depth on any tier and how many of those blocks are on the device. */
static void reply_matches_tiered(sbuf *out, const uint64_t *loc, size_t n) {
  static kvidx_tier_score sc[MAX_SCORES];
  size_t m = kvidx_find_matches_tiered(g_ix, loc, n, sc, MAX_SCORES), i;
  sb_printf(out, "OK blocks=%zu matches=%zu", n, m);
  for (i = 0; i < m && i < MAX_SCORES; i++)
    sb_printf(out, " %llu:%u:%u:%u", (unsigned long long)sc[i].worker_id,
              sc[i].dp_rank, sc[i].depth, sc[i].device_blocks);
  sb_printf(out, "\n");
}

/* The rest of a MATCH / MATCHT (tokens, optional lora=NAME first) or MATCHH
 * (local hashes) line into g_loc; returns the number of blocks, or -1 after
 * writing an ERR reply. */
static long query_locals(char **save, int hashes, sbuf *out) {
  uint64_t seed = KVIDX_SEED;
  size_t n = 0;
  char *t;
  while ((t = strtok_r(NULL, " \t\r", save)) != NULL) {
    char *end;
    unsigned long long v;
    if (!hashes && n == 0 && !strncmp(t, "lora=", 5)) {
      seed = kvidx_hash_seed(t + 5, NULL);
      continue;
    }
    errno = 0;
    v = strtoull(t, &end, 10);
    if (*end || errno || (!hashes && v > UINT32_MAX)) {
      sb_printf(out, "ERR bad number: %s\n", t);
      return -1;
    }
    if (hashes) {
      g_loc = grow(g_loc, &g_loc_cap, n + 1, sizeof *g_loc);
      g_loc[n++] = v;
    } else {
      g_tok = grow(g_tok, &g_tok_cap, n + 1, sizeof *g_tok);
      g_tok[n++] = (uint32_t)v;
    }
  }
  if (!hashes) {
    g_loc = grow(g_loc, &g_loc_cap, n / g_block_size + 1, sizeof *g_loc);
    n = kvidx_block_hashes(g_tok, n, g_block_size, seed, g_loc);
  }
  return (long)n;
}

static void on_line(char *line, sbuf *out) {
  char *save = NULL, *cmd = strtok_r(line, " \t\r", &save);
  long n;
  g_c.queries++;
  if (!cmd) {
    sb_printf(out, "ERR empty line\n");
  } else if (!strcmp(cmd, "PING")) {
    sb_printf(out, "OK pong\n");
  } else if (!strcmp(cmd, "MATCH") || !strcmp(cmd, "MATCHH")) {
    if ((n = query_locals(&save, cmd[5] == 'H', out)) >= 0)
      reply_matches(out, g_loc, (size_t)n);
  } else if (!strcmp(cmd, "MATCHT")) {
    if ((n = query_locals(&save, 0, out)) >= 0)
      reply_matches_tiered(out, g_loc, (size_t)n);
  } else if (!strcmp(cmd, "WORKER")) {
    char *w = strtok_r(NULL, " \t\r", &save), *d = strtok_r(NULL, " \t\r", &save);
    if (!w) {
      sb_printf(out, "ERR usage: WORKER wid [dp]\n");
      return;
    }
    sb_printf(out, "OK blocks=%zu\n",
              kvidx_worker_blocks(g_ix, strtoull(w, NULL, 10),
                                  d ? (uint32_t)strtoul(d, NULL, 10) : 0));
  } else if (!strcmp(cmd, "STATS")) {
    kvidx_stats st;
    memset(&st, 0, sizeof st);
    kvidx_get_stats(g_ix, &st);
    sb_printf(out,
              "OK batches=%llu events=%llu stored=%llu removed=%llu "
              "cleared=%llu skipped=%llu ignored=%llu malformed=%llu "
              "enoparent=%llu enoent=%llu efull=%llu errors=%llu gaps=%llu "
              "restarts=%llu duplicates=%llu lost_batches=%llu "
              "blocks=%zu workers=%zu entries=%zu bytes=%zu\n",
              g_c.batches, g_c.events, g_c.stored, g_c.removed, g_c.cleared,
              g_c.skipped, g_c.ignored, g_c.malformed, g_c.enoparent,
              g_c.enoent, g_c.efull, g_c.errors, g_c.gaps, g_c.restarts,
              g_c.duplicates, g_c.lost_batches, st.blocks, st.workers,
              st.entries, st.bytes);
  } else {
    sb_printf(out, "ERR unknown command %s (PING MATCH MATCHH MATCHT WORKER STATS)\n", cmd);
  }
}

/* Reads what a client sent; answers each complete line.  0 = keep. */
static int on_client(client *c) {
  sbuf out = {NULL, 0, 0};
  char *nl;
  ssize_t r;
  if (!c->buf) c->buf = malloc(MAX_LINE + 1);
  if (!c->buf) return -1;
  r = recv(c->fd, c->buf + c->len, MAX_LINE - c->len, 0);
  if (r <= 0) return (r < 0 && (errno == EAGAIN || errno == EINTR)) ? 0 : -1;
  c->len += (size_t)r;
  while ((nl = memchr(c->buf, '\n', c->len)) != NULL) {
    size_t ll = (size_t)(nl - c->buf);
    *nl = 0;
    out.n = 0;
    on_line(c->buf, &out);
    send_all(c->fd, out.p, out.n);
    memmove(c->buf, nl + 1, c->len - ll - 1);
    c->len -= ll + 1;
  }
  free(out.p);
  if (c->len == MAX_LINE) {
    send_all(c->fd, "ERR line too long\n", 18);
    return -1;
  }
  return 0;
}

/* ---- snapshots (--snapshot PATH) ---------------------------------------------- */
static int snap_write(void *ctx, const void *buf, size_t len) {
  return fwrite(buf, 1, len, (FILE *)ctx) == len ? 0 : 1;
}

static size_t snap_read(void *ctx, void *buf, size_t len) {
  return fread(buf, 1, len, (FILE *)ctx);
}

/* Loads PATH into the (empty) index if it exists; on any error the index
 * stays empty and the daemon starts cold. */
static void snapshot_load(const char *path) {
  FILE *f = fopen(path, "rb");
  kvidx_stats st;
  int rc;
  if (!f) {
    if (errno == ENOENT) logf_("snapshot %s: none yet, starting empty", path);
    else logf_("snapshot %s: %s; starting empty", path, strerror(errno));
    return;
  }
  rc = kvidx_snapshot_read(g_ix, snap_read, f);
  fclose(f);
  if (rc != KVIDX_OK) {
    logf_("snapshot %s: %s; starting empty", path, kvidx_strerror(rc));
    return;
  }
  memset(&st, 0, sizeof st);
  kvidx_get_stats(g_ix, &st);
  logf_("snapshot %s: loaded %zu blocks of %zu workers", path, st.blocks, st.workers);
}

/* Writes PATH.tmp, syncs it, renames it over PATH.  0 = ok. */
static int snapshot_save(const char *path) {
  size_t n = strlen(path);
  char *tmp = malloc(n + 5);
  FILE *f;
  int rc, ok;
  if (!tmp) return -1;
  memcpy(tmp, path, n);
  memcpy(tmp + n, ".tmp", 5);
  if (!(f = fopen(tmp, "wb"))) {
    fprintf(stderr, "kvidx-vllm: snapshot %s: %s\n", tmp, strerror(errno));
    free(tmp);
    return -1;
  }
  rc = kvidx_snapshot_write(g_ix, snap_write, f);
  ok = rc == KVIDX_OK && fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = (fclose(f) == 0) && ok;
  if (ok && rename(tmp, path) != 0) ok = 0;
  if (!ok) {
    fprintf(stderr, "kvidx-vllm: snapshot %s: %s\n", path,
            rc != KVIDX_OK ? kvidx_strerror(rc) : strerror(errno));
    unlink(tmp);
  } else {
    kvidx_stats st;
    memset(&st, 0, sizeof st);
    kvidx_get_stats(g_ix, &st);
    logf_("snapshot %s: wrote %zu blocks of %zu workers", path, st.blocks, st.workers);
  }
  free(tmp);
  return ok ? 0 : -1;
}

static void usage(void) {
  fprintf(stderr,
          "usage: kvidx-vllm-events --endpoint URL=WORKER_ID [--endpoint ...]\n"
          "         --listen unix:PATH|127.0.0.1:PORT [--block-size N] [--topic T]\n"
          "         [--kind positional|radix] [--snapshot PATH] [--all-groups]\n"
          "         [--max-seconds S] [--quiet]\n");
  exit(2);
}

int main(int argc, char **argv) {
  endpoint ep[MAX_ENDPOINTS];
  client cl[MAX_CLIENTS];
  zmq_pollitem_t items[MAX_ENDPOINTS + 1 + MAX_CLIENTS];
  size_t nep = 0, ncl = 0, i;
  const char *listen_spec = NULL, *topic = "", *snapshot = NULL;
  char unix_path[108] = "";
  double max_seconds = 0, t0;
  kvidx_config cfg = {0};
  void *zctx;
  int lfd, rc, a, status = 0;
  struct sigaction sa;

  cfg.kind = KVIDX_POSITIONAL;
#ifdef KVIDX_F_TIERS
  cfg.flags |= KVIDX_F_TIERS; /* host and disk copies beside device ones */
#endif
  for (a = 1; a < argc; a++) {
    const char *s = argv[a];
    if (!strcmp(s, "--quiet")) { g_quiet = 1; continue; }
    if (!strcmp(s, "--all-media")) continue; /* old flag: every medium is indexed now */
    if (!strcmp(s, "--all-groups")) { g_all_groups = 1; continue; }
    if (a + 1 >= argc) usage();
    if (!strcmp(s, "--endpoint")) {
      char *url = argv[++a], *eq = strrchr(url, '=');
      if (nep == MAX_ENDPOINTS) usage();
      ep[nep].worker_id = nep;
      if (eq) {
        *eq = 0;
        ep[nep].worker_id = strtoull(eq + 1, NULL, 10);
      }
      ep[nep].url = url;
      ep[nep].have_seq = 0;
      nep++;
    } else if (!strcmp(s, "--listen")) listen_spec = argv[++a];
    else if (!strcmp(s, "--block-size")) g_block_size = strtoul(argv[++a], NULL, 10);
    else if (!strcmp(s, "--topic")) topic = argv[++a];
    else if (!strcmp(s, "--snapshot")) snapshot = argv[++a];
    else if (!strcmp(s, "--max-seconds")) max_seconds = strtod(argv[++a], NULL);
    else if (!strcmp(s, "--kind")) {
      const char *k = argv[++a];
      cfg.kind = !strcmp(k, "radix") ? KVIDX_RADIX : KVIDX_POSITIONAL;
    } else usage();
  }
  if (nep == 0 || !listen_spec || g_block_size == 0) usage();

  if ((rc = kvidx_create(&g_ix, &cfg)) != KVIDX_OK) {
    fprintf(stderr, "kvidx-vllm: kvidx_create: %s\n", kvidx_strerror(rc));
    return 1;
  }
  if (snapshot) snapshot_load(snapshot);
  if ((lfd = listen_on(listen_spec, unix_path, sizeof unix_path)) < 0) return 1;
  fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);

  zctx = zmq_ctx_new();
  for (i = 0; i < nep; i++) {
    int hwm = 100000;
    ep[i].sock = zmq_socket(zctx, ZMQ_SUB);
    zmq_setsockopt(ep[i].sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(ep[i].sock, ZMQ_SUBSCRIBE, topic, strlen(topic));
    if (zmq_connect(ep[i].sock, ep[i].url) != 0) {
      fprintf(stderr, "kvidx-vllm: connect %s: %s\n", ep[i].url,
              zmq_strerror(zmq_errno()));
      return 1;
    }
    logf_("subscribed to %s as worker %llu", ep[i].url,
          (unsigned long long)ep[i].worker_id);
  }
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  logf_("kvidx %s, block size %zu, queries on %s", kvidx_version(),
        g_block_size, listen_spec);
  printf("ready\n");
  fflush(stdout);

  t0 = now_s();
  while (!g_stop && (max_seconds <= 0 || now_s() - t0 < max_seconds)) {
    size_t n = 0;
    for (i = 0; i < nep; i++) {
      items[n].socket = ep[i].sock;
      items[n].fd = 0;
      items[n].events = ZMQ_POLLIN;
      items[n++].revents = 0;
    }
    items[n].socket = NULL;
    items[n].fd = lfd;
    items[n].events = ZMQ_POLLIN;
    items[n++].revents = 0;
    for (i = 0; i < ncl; i++) {
      items[n].socket = NULL;
      items[n].fd = cl[i].fd;
      items[n].events = ZMQ_POLLIN;
      items[n++].revents = 0;
    }
    if (zmq_poll(items, (int)n, 200) < 0) {
      if (zmq_errno() == EINTR) continue;
      fprintf(stderr, "kvidx-vllm: zmq_poll: %s\n", zmq_strerror(zmq_errno()));
      break;
    }
    for (i = 0; i < nep; i++)
      if (items[i].revents & ZMQ_POLLIN) on_sub(&ep[i]);
    for (i = ncl; i-- > 0;) {
      if (items[nep + 1 + i].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
        if (on_client(&cl[i]) != 0) {
          close(cl[i].fd);
          free(cl[i].buf);
          cl[i] = cl[--ncl];
        }
      }
    }
    if (items[nep].revents & ZMQ_POLLIN) {
      int fd = accept(lfd, NULL, NULL);
      if (fd >= 0 && ncl < MAX_CLIENTS) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        cl[ncl].fd = fd;
        cl[ncl].buf = NULL;
        cl[ncl].len = 0;
        ncl++;
      } else if (fd >= 0) {
        close(fd);
      }
    }
  }

  logf_("stopping: %llu batches, %llu events, %llu blocks stored, %llu removed, "
        "%llu malformed, %llu gaps, %llu restarts, %llu duplicates", g_c.batches,
        g_c.events, g_c.stored, g_c.removed, g_c.malformed, g_c.gaps,
        g_c.restarts, g_c.duplicates);
  if (snapshot && snapshot_save(snapshot) != 0) status = 1;
  for (i = 0; i < ncl; i++) {
    close(cl[i].fd);
    free(cl[i].buf);
  }
  close(lfd);
  if (unix_path[0]) unlink(unix_path);
  for (i = 0; i < nep; i++) {
    int zero = 0;
    zmq_setsockopt(ep[i].sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(ep[i].sock);
  }
  zmq_ctx_term(zctx);
  kvidx_destroy(g_ix);
  free(g_tok);
  free(g_u64);
  free(g_loc);
  free(g_blk);
  return status;
}
