/* kvidx-bench - replay Mooncake production traces through a mock engine and
 * measure kvidx: throughput, find_matches latency, memory, concurrency and an
 * offered-load sweep.  See bench/README.md.
 *
 * Build (the top Makefile does this): cc -std=c11 -O2 -I. bench/kvidx-bench.c
 *   -pthread.  The kvidx implementation is compiled into this file unless
 *   KVIDX_BENCH_EXTERNAL_IMPL is defined (then link one in).
 *
 * Phases:
 *   1. parse the JSONL trace (plain or .gz through `gzip -dc`);
 *   2. derive blocks: trace id x length factor F -> tokens -> local hash
 *      (kvidx_block_hash, KVIDX_SEED), seq hash (kvidx_seq_hash_next);
 *   3. mock engine: W workers, each an LRU cache of C blocks; requests routed
 *      randomly or by kvidx's best match; a find_matches query per request,
 *      Removed events for LRU evictions, Stored events (with parent) for new
 *      blocks; finished requests release blocks tail first.  The resulting
 *      op stream lives in memory and is generated once, before any timing;
 *   4. replay the op stream into each kind, single threaded, timed; compare
 *      checksums of every score and status across kinds.
 * Optional: concurrency (--writers/--readers), offered-load sweep (--sweep),
 * routing showcase (--demo). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef KVIDX_BENCH_EXTERNAL_IMPL
#define KVIDX_IMPLEMENTATION
#endif
#include "kvidx.h"
#include "walk_floor.h"

#ifndef KVIDX_NO_THREADS
#include <pthread.h>
#define BENCH_HAVE_THREADS 1
#else
#define BENCH_HAVE_THREADS 0
#endif

#ifndef KVIDX_WORKERS_MAX
#define BENCH_WORKERS_MAX 4096u
#else
#define BENCH_WORKERS_MAX ((uint32_t)KVIDX_WORKERS_MAX)
#endif

#define DEFAULT_TRACE "bench/data/mooncake_conversation_trace.jsonl.gz"
#define NIL UINT32_MAX

/* ---- small utilities ------------------------------------------------------ */
static int g_quiet = 0;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("kvidx-bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) die("out of memory (%zu bytes)", n);
  return q;
}
static void *xcalloc(size_t n, size_t sz) {
  void *q = calloc(n ? n : 1, sz ? sz : 1);
  if (!q) die("out of memory (%zu x %zu bytes)", n, sz);
  return q;
}

/* grow *p (element size es, capacity *cap) to hold at least need elements */
static void reserve(void *pp, size_t *cap, size_t need, size_t es) {
  void **p = (void **)pp;
  if (need <= *cap) return;
  size_t c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  *p = xrealloc(*p, c * es);
  *cap = c;
}

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
static inline uint64_t rng_next(uint64_t *s) {
  *s += 0x9e3779b97f4a7c15ULL;
  return mix64(*s);
}
static inline double rng_u01(uint64_t *s) {
  return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* progress line on stderr for long phases */
typedef struct {
  uint64_t start, last;
  int shown;
  const char *what;
} progress_t;
static void progress_begin(progress_t *p, const char *what) {
  p->start = p->last = now_ns();
  p->shown = 0;
  p->what = what;
}
static void progress_tick(progress_t *p, size_t done, size_t total) {
  uint64_t t = now_ns();
  if (g_quiet || t - p->start < 2000000000u) return;
  int tty = isatty(2);
  if (t - p->last < (tty ? 250000000u : 5000000000u)) return;
  p->last = t;
  fprintf(stderr, "%s[%s] %zu/%zu (%.0f%%) %.1fs%s", tty ? "\r" : "", p->what,
          done, total, total ? 100.0 * (double)done / (double)total : 0.0,
          (double)(t - p->start) / 1e9, tty ? "   " : "\n");
  p->shown = 1;
}
static void progress_end(progress_t *p) {
  if (p->shown && isatty(2)) fputc('\n', stderr);
  p->shown = 0;
}

/* ---- trace ------------------------------------------------------------------ */
typedef struct {
  double ts_ms;
  uint32_t in_len, out_len;
  size_t id_off; /* into trace.ids */
  uint32_t n_ids;
  uint32_t line;
} req_t;

typedef struct {
  req_t *r;
  size_t nr, capr;
  uint64_t *ids;
  size_t nids, capids;
} trace_t;

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
  return p;
}

/* skips one JSON value; NULL on malformed input */
static const char *skip_value(const char *p) {
  int depth = 0;
  do {
    p = skip_ws(p);
    if (*p == '"') {
      for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && p[1]) p++;
      if (*p != '"') return NULL;
      p++;
    } else if (*p == '{' || *p == '[') {
      depth++;
      p++;
      continue;
    } else if (*p == '}' || *p == ']') {
      if (depth == 0) return NULL;
      depth--;
      p++;
    } else if (*p == ',' || *p == ':') {
      if (depth == 0) return NULL;
      p++;
      continue;
    } else {
      const char *q = p;
      while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ' &&
             *p != '\t' && *p != '\r' && *p != '\n')
        p++;
      if (p == q) return NULL;
    }
    if (depth > 0) {
      p = skip_ws(p);
      if (*p == ',' || *p == ':') p++;
    }
  } while (depth > 0);
  return p;
}

/* parses one line; 1 = request added, 0 = blank, -1 = error */
static int parse_line(trace_t *T, const char *s, uint32_t lineno) {
  const char *p = skip_ws(s);
  if (!*p) return 0;
  if (*p != '{') return -1;
  p++;
  req_t r;
  memset(&r, 0, sizeof r);
  r.line = lineno;
  r.id_off = T->nids;
  int have_ids = 0;
  for (;;) {
    p = skip_ws(p);
    if (*p == '}') break;
    if (*p != '"') return -1;
    const char *k = ++p;
    while (*p && *p != '"') {
      if (*p == '\\' && p[1]) p++;
      p++;
    }
    if (*p != '"') return -1;
    size_t klen = (size_t)(p - k);
    p = skip_ws(p + 1);
    if (*p != ':') return -1;
    p = skip_ws(p + 1);
#define KEYIS(lit) (klen == sizeof(lit) - 1 && memcmp(k, lit, klen) == 0)
    if (KEYIS("hash_ids")) {
      if (*p != '[') return -1;
      p = skip_ws(p + 1);
      T->nids = r.id_off; /* a repeated key replaces the earlier list */
      r.n_ids = 0;
      if (*p == ']') {
        p++;
      } else {
        for (;;) {
          p = skip_ws(p);
          if (*p < '0' || *p > '9') return -1;
          errno = 0;
          char *e;
          unsigned long long v = strtoull(p, &e, 10);
          if (errno || e == p) return -1;
          p = skip_ws(e);
          reserve(&T->ids, &T->capids, T->nids + 1, sizeof *T->ids);
          T->ids[T->nids++] = (uint64_t)v;
          r.n_ids++;
          if (*p == ',') {
            p++;
            continue;
          }
          if (*p == ']') {
            p++;
            break;
          }
          return -1;
        }
      }
      have_ids = 1;
    } else if (KEYIS("timestamp") || KEYIS("input_length") ||
               KEYIS("output_length")) {
      char *e;
      double v = strtod(p, &e);
      if (e == p || !(v >= 0) || v > 1e15) return -1;
      p = e;
      if (KEYIS("timestamp")) r.ts_ms = v;
      else if (KEYIS("input_length")) r.in_len = (uint32_t)(v > 4e9 ? 4e9 : v);
      else r.out_len = (uint32_t)(v > 4e9 ? 4e9 : v);
    } else {
      p = skip_value(p);
      if (!p) return -1;
    }
#undef KEYIS
    p = skip_ws(p);
    if (*p == ',') {
      p++;
      continue;
    }
    if (*p == '}') break;
    return -1;
  }
  if (*skip_ws(p + 1)) return -1;
  if (!have_ids) return -1;
  reserve(&T->r, &T->capr, T->nr + 1, sizeof *T->r);
  T->r[T->nr++] = r;
  return 1;
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static int cmp_req(const void *a, const void *b) {
  const req_t *x = a, *y = b;
  if (x->ts_ms != y->ts_ms) return x->ts_ms < y->ts_ms ? -1 : 1;
  return (x->line > y->line) - (x->line < y->line);
}

static void load_trace(trace_t *T, const char *path, size_t max_req) {
  FILE *f;
  int piped = 0;
  memset(T, 0, sizeof *T);
  if (ends_with(path, ".gz")) {
    if (strchr(path, '\'')) die("trace path may not contain a quote: %s", path);
    if (access(path, R_OK) != 0) die("cannot read %s: %s", path, strerror(errno));
    size_t n = strlen(path) + 32;
    char *cmd = xcalloc(n, 1);
    snprintf(cmd, n, "gzip -dc -- '%s'", path);
    f = popen(cmd, "r");
    free(cmd);
    piped = 1;
  } else {
    f = fopen(path, "r");
  }
  if (!f) die("cannot open %s: %s", path, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  uint32_t lineno = 0;
  while (getline(&line, &cap, f) >= 0) {
    lineno++;
    int rc = parse_line(T, line, lineno);
    if (rc < 0) die("%s:%u: malformed trace line (want JSON with hash_ids)", path, lineno);
  }
  free(line);
  if (piped) {
    int st = pclose(f);
    if (st != 0) die("gzip -dc %s failed (status %d)", path, st);
  } else {
    fclose(f);
  }
  if (T->nr == 0) die("%s: no requests", path);
  qsort(T->r, T->nr, sizeof *T->r, cmp_req);
  if (max_req && max_req < T->nr) T->nr = max_req;
}

/* ---- options ---------------------------------------------------------------- */
typedef struct {
  const char *trace;
  uint32_t W, D, R; /* workers, duplication, dp ranks per worker id */
  uint32_t C;       /* blocks per worker */
  uint32_t F;       /* blocks per trace id */
  double collide;   /* fraction of blocks whose local hash collides */
  uint32_t collide_pool;
  uint32_t block_tokens;
  uint64_t seed;
  int route_kvidx;
  double balance; /* kvidx routing: weight of a worker's active blocks */
  double time_scale;
  size_t max_req;
  int kinds[3];
  int nkinds;
  size_t ref_max_ops;
  uint32_t jump;
  int slots; /* cfg.max_workers: -1 = the fleet size, 0 = library default */
  double min_time;
  int writers, readers;
  double conc_time;
  int conc_kind;
  int sweep;
  double sweep_step;
  const char *csv, *png, *md, *label;
  int demo;
  size_t check_every;
  size_t dump_from, dump_to;
  const char *write_events; /* --write-events FILE */
  int opaque_seqs;          /* --opaque-seqs */
  const char *replay;       /* --replay FILE */
  int replay_kind;          /* --kind (replay, growth) */
  int replay_reps;          /* --time REPS */
  int no_event_buffers;     /* --no-event-buffers */
  int seq_floor;            /* --seq-floor */
  int walk_floor;           /* --walk-floor */
  const char *expect;       /* --expect ANSWERS */
  int growth;               /* --growth */
  size_t growth_blocks;
  uint32_t growth_workers, growth_len;
  int defer_free;           /* --defer-free: KVIDX_F_DEFER_FREE, kvidx_reclaim after each store */
  int scaling; /* --scaling */
  size_t order_n, order_depths; /* --order-bench N[,D] */
  int scale_writers[16], nscale;
  int mixed_writers;
  int argc;
  char **argv;
} opts_t;

static const char *kind_name(int k) {
  return k == KVIDX_RADIX ? "radix" : k == KVIDX_POSITIONAL ? "positional" : "reference";
}
static int parse_kind(const char *s) {
  if (!strcmp(s, "radix")) return KVIDX_RADIX;
  if (!strcmp(s, "positional") || !strcmp(s, "pos")) return KVIDX_POSITIONAL;
  if (!strcmp(s, "reference") || !strcmp(s, "ref")) return KVIDX_REFERENCE;
  die("unknown kind '%s' (radix, positional, reference)", s);
  return -1;
}

/* ---- derived blocks ---------------------------------------------------------- */
/* id -> dense index map (linear probing) */
typedef struct {
  uint64_t *keys;
  uint32_t *vals;
  size_t mask;
} idmap_t;

static void idmap_init(idmap_t *m, size_t n) {
  size_t c = 1024;
  while (c < 2 * n) c *= 2;
  m->keys = xcalloc(c, sizeof *m->keys);
  m->vals = xcalloc(c, sizeof *m->vals);
  for (size_t i = 0; i < c; i++) m->vals[i] = NIL;
  m->mask = c - 1;
}
static uint32_t *idmap_slot(idmap_t *m, uint64_t k) {
  size_t i = (size_t)mix64(k) & m->mask;
  while (m->vals[i] != NIL && m->keys[i] != k) i = (i + 1) & m->mask;
  m->keys[i] = k;
  return &m->vals[i];
}

typedef struct {
  uint32_t type; /* OP_* */
  uint32_t worker; /* 0..K-1 */
  uint32_t n;
  uint32_t has_parent;
  size_t off; /* QUERY: locals pool; STORE: blocks pool; REMOVE: rm pool */
  uint64_t parent;
} op_t;
enum { OP_QUERY = 0, OP_STORE = 1, OP_REMOVE = 2, OP_CLEAR = 3 };

typedef struct {
  opts_t *o;
  trace_t T;
  uint32_t K; /* total workers = W * D */
  /* per request block arrays (locals and (local, seq) pairs) */
  size_t *req_off;
  uint32_t *req_n;
  uint64_t *locals;
  kvidx_block *blocks;
  size_t nblocks;
  size_t distinct_ids;
  /* removals */
  uint64_t *rm;
  size_t nrm, caprm;
  /* ops */
  op_t *ops;
  size_t nops, capops;
  size_t n_queries, n_events;
  uint64_t bo_query, bo_store, bo_remove; /* block-ops by kind */
  size_t *qidx; /* indices of query ops */
  /* engine results */
  uint64_t prompt_blocks, hit_blocks, stored_blocks, evicted, truncated_reqs;
  uint64_t peak_holdings; /* most (worker, block) holdings at once (x D) */
  uint64_t *expect_blocks; /* per worker k, at the end */
  uint64_t expect_total;
  uint32_t *req_per_worker;
  double gen_seconds;
} bench_t;

static inline uint64_t worker_id_of(const bench_t *B, uint32_t k) {
  return 100u + k / B->o->R;
}
static inline uint32_t dp_rank_of(const bench_t *B, uint32_t k) {
  return k % B->o->R;
}

static void derive_blocks(bench_t *B) {
  opts_t *o = B->o;
  trace_t *T = &B->T;
  size_t nids = 0;
  for (size_t i = 0; i < T->nr; i++) nids += T->r[i].n_ids;
  idmap_t m;
  idmap_init(&m, nids);
  uint64_t *by_id = NULL; /* distinct * F locals */
  size_t cap_by = 0, ndist = 0;
  uint32_t *tok = xcalloc(o->block_tokens, sizeof *tok);
  B->req_off = xcalloc(T->nr, sizeof *B->req_off);
  B->req_n = xcalloc(T->nr, sizeof *B->req_n);
  B->nblocks = nids * o->F;
  B->locals = xcalloc(B->nblocks, sizeof *B->locals);
  B->blocks = xcalloc(B->nblocks, sizeof *B->blocks);
  progress_t pg;
  progress_begin(&pg, "hashing");
  size_t at = 0;
  for (size_t i = 0; i < T->nr; i++) {
    const req_t *r = &T->r[i];
    B->req_off[i] = at;
    B->req_n[i] = r->n_ids * o->F;
    uint64_t seq = 0;
    for (uint32_t a = 0; a < r->n_ids; a++) {
      uint64_t id = T->ids[r->id_off + a];
      uint32_t *v = idmap_slot(&m, id);
      if (*v == NIL) {
        *v = (uint32_t)ndist++;
        reserve(&by_id, &cap_by, ndist * o->F, sizeof *by_id);
        for (uint32_t j = 0; j < o->F; j++) {
          uint64_t key = id * o->F + j, tkey = key;
          uint64_t cs = o->seed ^ mix64(key + 0x51ed);
          if (o->collide > 0 && rng_u01(&cs) < o->collide)
            tkey = 0xC011000000000000ULL | (rng_next(&cs) % o->collide_pool);
          for (uint32_t t = 0; t < o->block_tokens; t++)
            tok[t] = (uint32_t)mix64(tkey * 0x9E3779B97F4A7C15ULL + t) & 0x3ffffu;
          by_id[(size_t)*v * o->F + j] = kvidx_block_hash(tok, o->block_tokens, KVIDX_SEED);
        }
      }
      for (uint32_t j = 0; j < o->F; j++) {
        uint64_t loc = by_id[(size_t)*v * o->F + j];
        seq = (a == 0 && j == 0) ? loc : kvidx_seq_hash_next(seq, loc);
        B->locals[at] = loc;
        B->blocks[at].local = loc;
        B->blocks[at].seq = seq;
        at++;
      }
    }
    if ((i & 1023) == 0) progress_tick(&pg, i, T->nr);
  }
  progress_end(&pg);
  B->distinct_ids = ndist;
  free(by_id);
  free(tok);
  free(m.keys);
  free(m.vals);
}

/* ---- mock engine --------------------------------------------------------------- */
typedef struct {
  uint64_t *mkeys; /* seq -> slot map */
  uint32_t *mvals;
  size_t mmask;
  uint64_t *seq;
  uint32_t *ref, *prev, *next;
  uint32_t lru_head, lru_tail; /* unreferenced blocks: head = least recent */
  uint32_t *freel;
  uint32_t nfree, used, cap;
  uint64_t active; /* blocks of in-flight requests */
} wcache_t;

static void wc_init(wcache_t *w, uint32_t C) {
  size_t c = 16;
  while (c < 2 * (size_t)C) c *= 2;
  w->mkeys = xcalloc(c, sizeof *w->mkeys);
  w->mvals = xcalloc(c, sizeof *w->mvals);
  for (size_t i = 0; i < c; i++) w->mvals[i] = NIL;
  w->mmask = c - 1;
  w->seq = xcalloc(C, sizeof *w->seq);
  w->ref = xcalloc(C, sizeof *w->ref);
  w->prev = xcalloc(C, sizeof *w->prev);
  w->next = xcalloc(C, sizeof *w->next);
  w->freel = xcalloc(C, sizeof *w->freel);
  for (uint32_t i = 0; i < C; i++) w->freel[i] = C - 1 - i;
  w->nfree = C;
  w->cap = C;
  w->used = 0;
  w->lru_head = w->lru_tail = NIL;
  w->active = 0;
}
static void wc_free(wcache_t *w) {
  free(w->mkeys), free(w->mvals), free(w->seq), free(w->ref);
  free(w->prev), free(w->next), free(w->freel);
}
static uint32_t wc_find(const wcache_t *w, uint64_t s) {
  size_t i = (size_t)mix64(s) & w->mmask;
  while (w->mvals[i] != NIL) {
    if (w->mkeys[i] == s) return w->mvals[i];
    i = (i + 1) & w->mmask;
  }
  return NIL;
}
static void wc_insert(wcache_t *w, uint64_t s, uint32_t slot) {
  size_t i = (size_t)mix64(s) & w->mmask;
  while (w->mvals[i] != NIL) i = (i + 1) & w->mmask;
  w->mkeys[i] = s;
  w->mvals[i] = slot;
}
static void wc_erase(wcache_t *w, uint64_t s) {
  size_t i = (size_t)mix64(s) & w->mmask;
  while (w->mkeys[i] != s || w->mvals[i] == NIL) i = (i + 1) & w->mmask;
  /* backward-shift deletion */
  size_t j = i;
  for (;;) {
    j = (j + 1) & w->mmask;
    if (w->mvals[j] == NIL) break;
    size_t h = (size_t)mix64(w->mkeys[j]) & w->mmask;
    if (((j - h) & w->mmask) >= ((j - i) & w->mmask)) {
      w->mkeys[i] = w->mkeys[j];
      w->mvals[i] = w->mvals[j];
      i = j;
    }
  }
  w->mvals[i] = NIL;
}
static void lru_unlink(wcache_t *w, uint32_t s) {
  uint32_t p = w->prev[s], n = w->next[s];
  if (p != NIL) w->next[p] = n; else w->lru_head = n;
  if (n != NIL) w->prev[n] = p; else w->lru_tail = p;
}
static void lru_push_tail(wcache_t *w, uint32_t s) {
  w->prev[s] = w->lru_tail;
  w->next[s] = NIL;
  if (w->lru_tail != NIL) w->next[w->lru_tail] = s; else w->lru_head = s;
  w->lru_tail = s;
}
static void wc_acquire(wcache_t *w, uint32_t s) {
  if (w->ref[s]++ == 0) lru_unlink(w, s);
}
static void wc_release(wcache_t *w, uint32_t s) {
  if (--w->ref[s] == 0) lru_push_tail(w, s);
}

typedef struct {
  double finish;
  uint32_t worker;
  uint32_t n;
  size_t off; /* into held slots pool */
} inflight_t;

typedef struct {
  inflight_t *h;
  size_t n, cap;
} heap_t;
static void heap_push(heap_t *H, inflight_t x) {
  reserve(&H->h, &H->cap, H->n + 1, sizeof *H->h);
  size_t i = H->n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (H->h[p].finish <= x.finish) break;
    H->h[i] = H->h[p];
    i = p;
  }
  H->h[i] = x;
}
static inflight_t heap_pop(heap_t *H) {
  inflight_t top = H->h[0], x = H->h[--H->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= H->n) break;
    if (c + 1 < H->n && H->h[c + 1].finish < H->h[c].finish) c++;
    if (x.finish <= H->h[c].finish) break;
    H->h[i] = H->h[c];
    i = c;
  }
  if (H->n) H->h[i] = x;
  return top;
}

static void push_op(bench_t *B, op_t op) {
  reserve(&B->ops, &B->capops, B->nops + 1, sizeof *B->ops);
  B->ops[B->nops++] = op;
  if (op.type == OP_QUERY) {
    B->n_queries++;
    B->bo_query += op.n;
  } else {
    B->n_events++;
    if (op.type == OP_STORE) B->bo_store += op.n;
    if (op.type == OP_REMOVE) B->bo_remove += op.n;
  }
}

/* allocation counting hooks ------------------------------------------------- */
typedef struct {
  _Atomic size_t cur, peak, nalloc, nfree, mismatch;
} memctr_t;
#define HDR 16u
static void *hook_alloc(void *ctx, size_t sz) {
  memctr_t *m = ctx;
  unsigned char *p = malloc(sz + HDR);
  if (!p) return NULL;
  memcpy(p, &sz, sizeof sz);
  size_t c = atomic_fetch_add(&m->cur, sz) + sz;
  size_t pk = atomic_load(&m->peak);
  while (c > pk && !atomic_compare_exchange_weak(&m->peak, &pk, c)) {
  }
  atomic_fetch_add(&m->nalloc, 1);
  return p + HDR;
}
static void hook_free(void *ctx, void *ptr, size_t sz) {
  memctr_t *m = ctx;
  if (!ptr) return;
  unsigned char *p = (unsigned char *)ptr - HDR;
  size_t real;
  memcpy(&real, p, sizeof real);
  if (real != sz) atomic_fetch_add(&m->mismatch, 1);
  atomic_fetch_sub(&m->cur, real);
  atomic_fetch_add(&m->nfree, 1);
  free(p);
}

static kvidx *make_index(const bench_t *B, int kind, memctr_t *mc) {
  kvidx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.kind = kind;
  /* bitset width: by default the fleet size (a router knows its fleet);
   * --slots 0 for the library's 1,024-slot default */
  cfg.max_workers = B->o->slots < 0 ? B->K : (uint32_t)B->o->slots;
  if (B->o->slots == 0 && B->K > 1024) cfg.max_workers = B->K;
  cfg.jump = B->o->jump;
  if (mc) {
    memset(mc, 0, sizeof *mc);
    cfg.alloc = hook_alloc;
    cfg.free = hook_free;
    cfg.alloc_ctx = mc;
  }
  kvidx *ix = NULL;
  int rc = kvidx_create(&ix, &cfg);
  if (rc != KVIDX_OK || !ix)
    die("kvidx_create(kind=%s, max_workers=%u) failed: %s", kind_name(kind),
        cfg.max_workers, kvidx_strerror(rc));
  return ix;
}

static inline int apply_event(kvidx *ix, const bench_t *B, const op_t *op) {
  uint64_t wid = worker_id_of(B, op->worker);
  uint32_t r = dp_rank_of(B, op->worker);
  switch (op->type) {
  case OP_STORE:
    return kvidx_store(ix, wid, r, op->has_parent ? &op->parent : NULL,
                       B->blocks + op->off, op->n);
  case OP_REMOVE: return kvidx_remove(ix, wid, r, B->rm + op->off, op->n);
  case OP_CLEAR: return kvidx_clear(ix, wid, r);
  default: return KVIDX_EINVAL;
  }
}

/* Runs the mock engine; fills B->ops.  route_ix (kvidx routing) gets the
 * events of the W unique workers applied as they are generated. */
static void generate(bench_t *B) {
  opts_t *o = B->o;
  trace_t *T = &B->T;
  uint64_t t0 = now_ns();
  wcache_t *wc = xcalloc(o->W, sizeof *wc);
  for (uint32_t w = 0; w < o->W; w++) wc_init(&wc[w], o->C);
  B->req_per_worker = xcalloc(o->W, sizeof *B->req_per_worker);
  heap_t H = {0};
  uint32_t *held = NULL;
  size_t nheld = 0, capheld = 0;
  uint64_t rng = o->seed * 0x2545F4914F6CDD1DULL + 7;
  kvidx *rix = NULL;
  kvidx_score *sc = NULL;
  double *cost = NULL;
  if (o->route_kvidx) {
    rix = make_index(B, KVIDX_POSITIONAL, NULL);
    sc = xcalloc(B->K, sizeof *sc);
    cost = xcalloc(o->W, sizeof *cost);
  }
  uint64_t holdings = 0;
  progress_t pg;
  progress_begin(&pg, "mock engine");
  for (size_t i = 0; i < T->nr; i++) {
    const req_t *r = &T->r[i];
    double t = r->ts_ms;
    while (H.n && H.h[0].finish <= t) {
      inflight_t f = heap_pop(&H);
      wcache_t *w = &wc[f.worker];
      for (uint32_t j = f.n; j-- > 0;) wc_release(w, held[f.off + j]); /* tail first */
      w->active -= f.n;
    }
    uint32_t n = B->req_n[i];
    size_t off = B->req_off[i];
    const kvidx_block *blk = B->blocks + off;
    op_t q = {OP_QUERY, 0, n, 0, off, 0};
    push_op(B, q);
    /* route */
    uint32_t w;
    if (rix && n > 0) {
      size_t m = kvidx_find_matches(rix, B->locals + off, n, sc, B->K);
      if (m > B->K) m = B->K;
      for (uint32_t k = 0; k < o->W; k++) cost[k] = (double)n + o->balance * (double)wc[k].active;
      for (size_t j = 0; j < m; j++) {
        uint32_t k = (uint32_t)(sc[j].worker_id - 100u) * o->R + sc[j].dp_rank;
        if (k < o->W) cost[k] -= sc[j].depth;
      }
      uint32_t start = (uint32_t)(rng_next(&rng) % o->W);
      w = start;
      for (uint32_t a = 0; a < o->W; a++) {
        uint32_t k = (start + a) % o->W;
        if (cost[k] < cost[w]) w = k;
      }
    } else {
      w = (uint32_t)(rng_next(&rng) % o->W);
    }
    wcache_t *c = &wc[w];
    B->req_per_worker[w]++;
    /* prefix hits */
    size_t hoff = nheld;
    reserve(&held, &capheld, nheld + n, sizeof *held);
    uint32_t a = 0;
    for (; a < n; a++) {
      uint32_t s = wc_find(c, blk[a].seq);
      if (s == NIL) break;
      wc_acquire(c, s);
      held[nheld++] = s;
    }
    B->prompt_blocks += n;
    B->hit_blocks += a;
    /* new blocks: evict LRU unreferenced blocks as needed */
    size_t rm0 = B->nrm;
    uint32_t e = a;
    for (; e < n; e++) {
      uint32_t s = wc_find(c, blk[e].seq);
      if (s != NIL) { /* held past a hole: re-stored, stays as it is */
        wc_acquire(c, s);
        held[nheld++] = s;
        continue;
      }
      if (c->nfree) {
        s = c->freel[--c->nfree];
      } else if (c->lru_head != NIL) {
        s = c->lru_head;
        lru_unlink(c, s);
        wc_erase(c, c->seq[s]);
        reserve(&B->rm, &B->caprm, B->nrm + 1, sizeof *B->rm);
        B->rm[B->nrm++] = c->seq[s];
        c->used--;
        holdings -= o->D;
        B->evicted++;
      } else {
        B->truncated_reqs++; /* every block referenced: cache the prefix only */
        break;
      }
      c->seq[s] = blk[e].seq;
      c->ref[s] = 1;
      wc_insert(c, blk[e].seq, s);
      c->used++;
      holdings += o->D;
      held[nheld++] = s;
    }
    if (holdings > B->peak_holdings) B->peak_holdings = holdings;
    if (B->nrm > rm0) {
      for (uint32_t d = 0; d < o->D; d++) {
        op_t x = {OP_REMOVE, w + d * o->W, (uint32_t)(B->nrm - rm0), 0, rm0, 0};
        push_op(B, x);
      }
      if (rix) {
        int rc = apply_event(rix, B, &B->ops[B->nops - o->D]);
        if (rc != KVIDX_OK) die("routing index: remove failed: %s", kvidx_strerror(rc));
      }
    }
    if (e > a) {
      B->stored_blocks += e - a;
      for (uint32_t d = 0; d < o->D; d++) {
        op_t x = {OP_STORE, w + d * o->W, e - a, a > 0, off + a, a > 0 ? blk[a - 1].seq : 0};
        push_op(B, x);
      }
      if (rix) {
        int rc = apply_event(rix, B, &B->ops[B->nops - o->D]);
        if (rc != KVIDX_OK) die("routing index: store failed: %s", kvidx_strerror(rc));
      }
    }
    /* request duration: prefill of uncached blocks + decode */
    double ids_uncached = (double)(n - a) / o->F;
    double dur = o->time_scale * (30.0 * ids_uncached + 20.0 * r->out_len);
    inflight_t f = {t + dur, w, (uint32_t)(nheld - hoff), hoff};
    c->active += f.n;
    heap_push(&H, f);
    if ((i & 255) == 0) progress_tick(&pg, i, T->nr);
  }
  progress_end(&pg);
  B->expect_blocks = xcalloc(B->K, sizeof *B->expect_blocks);
  for (uint32_t k = 0; k < B->K; k++) {
    B->expect_blocks[k] = wc[k % o->W].used;
    B->expect_total += wc[k % o->W].used;
  }
  for (uint32_t w = 0; w < o->W; w++) wc_free(&wc[w]);
  free(wc);
  free(H.h);
  free(held);
  free(sc);
  free(cost);
  if (rix) kvidx_destroy(rix);
  B->qidx = xcalloc(B->n_queries, sizeof *B->qidx);
  size_t nq = 0;
  for (size_t i = 0; i < B->nops; i++)
    if (B->ops[i].type == OP_QUERY) B->qidx[nq++] = i;
  B->gen_seconds = (double)(now_ns() - t0) / 1e9;
}

/* ---- single-threaded replay ----------------------------------------------------- */
typedef struct {
  int kind;
  int ran, full, slow_path;
  size_t ops_run;
  uint64_t cs_prefix, cs_full; /* scores */
  uint64_t ss_prefix, ss_full; /* statuses */
  uint64_t depth_sum;
  size_t bad_status, first_bad_op;
  int first_bad_rc;
  uint64_t t_all, t_ev, t_q_timed, t_e_timed; /* per rep, ns */
  size_t reps_timed, reps_all, reps_ev;
  uint32_t *lat;
  size_t nlat;
  uint64_t *qh; /* per-query score hash (rep 0), to find the first divergence */
  size_t check_fail_op;
  int check_fail_rc;
  double p50, p99, p999, qmean;
  size_t peak_bytes, end_bytes, stats_bytes, stats_peak, mismatch, leaked;
  size_t blocks_end, workers_end, entries_end;
  int check_rc;
  size_t holdings_bad;
  double ev_s, q_s, bops_s, ops_s;
  double cpu_share; /* thread CPU time / wall time over the kind's passes */
  size_t n_q_run, n_e_run;
  uint64_t bo_run;
} result_t;

static inline uint64_t fold(uint64_t h, uint64_t v) {
  return mix64(h ^ v) + 0x9E3779B97F4A7C15ULL;
}

static uint64_t g_timer_overhead = 0;
static void calibrate_timer(void) {
  uint32_t s[1001];
  for (int i = 0; i < 1001; i++) {
    uint64_t a = now_ns(), b = now_ns();
    s[i] = (uint32_t)(b - a);
  }
  qsort(s, 1001, sizeof s[0], cmp_u32);
  g_timer_overhead = s[500];
}

/* One full pass.  mode 0: timed per op with checksums; 1: untimed all ops;
 * 2: untimed events only.  Returns elapsed ns (mode 0: sum of op times). */
static uint64_t replay_pass(const bench_t *B, kvidx *ix, int mode, size_t limit,
                            size_t prefix_at, result_t *res, kvidx_score *sc,
                            progress_t *pg) {
  size_t cap = B->K;
  uint64_t cs = 0x1234, ss = 0x5678, tq = 0, te = 0, dsum = 0, junk = 0;
  uint64_t start = now_ns();
  for (size_t i = 0; i < limit; i++) {
    const op_t *op = &B->ops[i];
    if (mode == 0) {
      if (i == prefix_at) res->cs_prefix = cs, res->ss_prefix = ss;
      if (op->type == OP_QUERY) {
        uint64_t a = now_ns();
        size_t m = kvidx_find_matches(ix, B->locals + op->off, op->n, sc, cap);
        uint64_t b = now_ns();
        uint64_t dt = b - a;
        tq += dt;
        res->lat[res->nlat++] = dt > UINT32_MAX ? UINT32_MAX : (uint32_t)dt;
        cs = fold(cs, m);
        uint64_t qh = fold(0, m);
        if (m > cap) m = cap;
        for (size_t j = 0; j < m; j++) {
          uint64_t v = sc[j].worker_id ^ ((uint64_t)sc[j].dp_rank << 32) ^ ((uint64_t)sc[j].depth << 48);
          cs = fold(cs, v);
          qh = fold(qh, v);
          dsum += sc[j].depth;
        }
        if (res->qh) res->qh[res->nlat - 1] = qh;
      } else {
        uint64_t a = now_ns();
        int rc = apply_event(ix, B, op);
        uint64_t b = now_ns();
        te += b - a;
        ss = fold(ss, (uint64_t)(int64_t)rc);
        if (rc != KVIDX_OK) {
          if (res->bad_status++ == 0) res->first_bad_op = i, res->first_bad_rc = rc;
        }
      }
    } else if (op->type == OP_QUERY) {
      if (mode == 1) junk += kvidx_find_matches(ix, B->locals + op->off, op->n, sc, cap);
    } else {
      junk += (uint64_t)(apply_event(ix, B, op) != KVIDX_OK);
    }
    if (mode == 0 && B->o->check_every && !res->check_fail_rc &&
        (i + 1) % B->o->check_every == 0) {
      int rc = kvidx__check(ix);
      if (rc) res->check_fail_rc = rc, res->check_fail_op = i;
    }
    if (pg && (i & 4095) == 0) progress_tick(pg, i, limit);
  }
  uint64_t el = now_ns() - start;
  if (mode == 0) {
    if (limit == prefix_at) res->cs_prefix = cs, res->ss_prefix = ss;
    res->cs_full = cs;
    res->ss_full = ss;
    res->depth_sum = dsum;
    res->t_q_timed += tq;
    res->t_e_timed += te;
    return tq + te;
  }
  if (junk == 0xFFFFFFFFFFFFFFFFULL) fputc(' ', stderr); /* keep junk live */
  return el;
}

static double pct(const uint32_t *s, size_t n, double p) {
  if (!n) return 0;
  size_t i = (size_t)ceil(p * (double)n) - 1;
  if (i >= n) i = n - 1;
  return s[i];
}

static void run_kind(const bench_t *B, int kind, size_t limit, size_t prefix_at,
                     result_t *res) {
  const opts_t *o = B->o;
  memset(res, 0, sizeof *res);
  res->kind = kind;
  res->ran = 1;
  res->ops_run = limit;
  res->full = limit == B->nops;
  size_t nq = 0, ne = 0;
  uint64_t bo = 0;
  for (size_t i = 0; i < limit; i++) {
    if (B->ops[i].type == OP_QUERY) nq++; else ne++;
    if (B->ops[i].type != OP_CLEAR) bo += B->ops[i].n;
  }
  res->n_q_run = nq, res->n_e_run = ne, res->bo_run = bo;
  kvidx_score *sc = xcalloc(B->K, sizeof *sc);
  size_t caplat = nq, maxreps = 64;
  res->lat = xcalloc(caplat ? caplat : 1, sizeof *res->lat);
  res->qh = xcalloc(caplat ? caplat : 1, sizeof *res->qh);
  char what[64];
  snprintf(what, sizeof what, "%s replay", kind_name(kind));
  progress_t pg;
  progress_begin(&pg, what);
  uint64_t wall0 = now_ns(), cpu0 = thread_cpu_ns();

  /* rep 0: timed, checksummed, memory and invariants */
  memctr_t mc;
  kvidx *ix = make_index(B, kind, &mc);
  uint64_t t = replay_pass(B, ix, 0, limit, prefix_at, res, sc, &pg);
  res->reps_timed = 1;
  res->peak_bytes = atomic_load(&mc.peak);
  res->end_bytes = atomic_load(&mc.cur);
  kvidx_stats st;
  memset(&st, 0, sizeof st);
  kvidx_get_stats(ix, &st);
  res->stats_bytes = st.bytes, res->stats_peak = st.peak_bytes;
  res->blocks_end = st.blocks, res->workers_end = st.workers, res->entries_end = st.entries;
  res->check_rc = kvidx__check(ix);
  if (res->full) {
    for (uint32_t k = 0; k < B->K; k++)
      if (kvidx_worker_blocks(ix, worker_id_of(B, k), dp_rank_of(B, k)) != B->expect_blocks[k])
        res->holdings_bad++;
  }
  kvidx_destroy(ix);
  res->leaked = atomic_load(&mc.cur);
  res->mismatch = atomic_load(&mc.mismatch);
  uint64_t budget = (uint64_t)(o->min_time * 1e9 / 3);
  int slow = t > 2 * (uint64_t)(o->min_time * 1e9) && o->min_time > 0;
  if (kind == KVIDX_REFERENCE && t > 2000000000u) slow = 1;
  res->slow_path = slow;
  /* more timed reps for latency samples */
  uint64_t tt = t;
  while (!slow && tt < budget && res->reps_timed < maxreps) {
    caplat += nq;
    res->lat = xrealloc(res->lat, caplat * sizeof *res->lat);
    result_t tmp = *res;
    tmp.qh = NULL;
    ix = make_index(B, kind, NULL);
    tt += replay_pass(B, ix, 0, limit, prefix_at, &tmp, sc, NULL);
    kvidx_destroy(ix);
    if (tmp.cs_full != res->cs_full || tmp.ss_full != res->ss_full)
      die("%s: checksum differs between repetitions: nondeterministic index", kind_name(kind));
    res->lat = tmp.lat, res->nlat = tmp.nlat;
    res->t_q_timed = tmp.t_q_timed, res->t_e_timed = tmp.t_e_timed;
    res->reps_timed++;
  }
  if (!slow) { /* the fastest repetition: least disturbed by other load */
    uint64_t ta = 0, te = 0, best = UINT64_MAX;
    do {
      ix = make_index(B, kind, NULL);
      uint64_t x = replay_pass(B, ix, 1, limit, prefix_at, res, sc, NULL);
      kvidx_destroy(ix);
      ta += x;
      if (x < best) best = x;
      res->reps_all++;
    } while (ta < budget && res->reps_all < maxreps);
    res->t_all = best;
    best = UINT64_MAX;
    do {
      ix = make_index(B, kind, NULL);
      uint64_t x = replay_pass(B, ix, 2, limit, prefix_at, res, sc, NULL);
      kvidx_destroy(ix);
      te += x;
      if (x < best) best = x;
      res->reps_ev++;
    } while (te < budget && res->reps_ev < maxreps);
    res->t_ev = best;
  }
  progress_end(&pg);
  res->cpu_share = (double)(thread_cpu_ns() - cpu0) / (double)(now_ns() - wall0);
  uint64_t tq_timed = res->t_q_timed / res->reps_timed, te_timed = res->t_e_timed / res->reps_timed;
  if (slow) {
    res->t_all = tq_timed + te_timed;
    res->t_ev = te_timed;
  }
  /* queries/s from the per-call timings, minus the timer's own cost */
  double tq = (double)tq_timed - (double)g_timer_overhead * (double)nq;
  if (tq < 0.5 * (double)tq_timed) tq = 0.5 * (double)tq_timed;
  res->ops_s = (double)limit / ((double)res->t_all / 1e9);
  res->bops_s = (double)bo / ((double)res->t_all / 1e9);
  res->ev_s = res->t_ev ? (double)ne / ((double)res->t_ev / 1e9) : 0;
  res->q_s = tq > 0 ? (double)nq / (tq / 1e9) : 0;
  qsort(res->lat, res->nlat, sizeof *res->lat, cmp_u32);
  res->p50 = pct(res->lat, res->nlat, 0.50);
  res->p99 = pct(res->lat, res->nlat, 0.99);
  res->p999 = pct(res->lat, res->nlat, 0.999);
  res->qmean = res->nlat ? (double)res->t_q_timed / (double)res->nlat : 0;
  free(sc);
}

/* ---- human-readable numbers ----------------------------------------------------- */
static const char *si(double v, char *buf, size_t n) {
  if (v >= 1e9) snprintf(buf, n, "%.2fG", v / 1e9);
  else if (v >= 1e6) snprintf(buf, n, "%.2fM", v / 1e6);
  else if (v >= 1e3) snprintf(buf, n, "%.1fk", v / 1e3);
  else snprintf(buf, n, "%.0f", v);
  return buf;
}
static const char *bytes_str(double v, char *buf, size_t n) {
  if (v >= 1048576.0) snprintf(buf, n, "%.1f MiB", v / 1048576.0);
  else if (v >= 1024.0) snprintf(buf, n, "%.1f KiB", v / 1024.0);
  else snprintf(buf, n, "%.0f B", v);
  return buf;
}

static FILE *open_md(const opts_t *o) {
  if (!o->md) return NULL;
  FILE *f = fopen(o->md, "a");
  if (!f) die("cannot open %s: %s", o->md, strerror(errno));
  return f;
}

static void config_line(const bench_t *B, char *buf, size_t n) {
  const opts_t *o = B->o;
  snprintf(buf, n, "W=%u C=%u F=%u D=%u dp=%u collide=%g route=%s seed=%" PRIu64
           " requests=%zu", o->W, o->C, o->F, o->D, o->R, o->collide,
           o->route_kvidx ? "kvidx" : "random", o->seed, B->T.nr);
}

static void print_engine(const bench_t *B, FILE *f, int md) {
  double hit = B->prompt_blocks ? 100.0 * (double)B->hit_blocks / (double)B->prompt_blocks : 0;
  uint64_t bo = B->bo_query + B->bo_store + B->bo_remove;
  fprintf(f, "%sengine: %zu requests, %" PRIu64 " prompt blocks (%zu distinct ids x F=%u), prefix "
          "hits %.1f%%, %" PRIu64 " blocks stored, %" PRIu64 " evicted, %" PRIu64
          " truncated requests; generated in %.2fs%s\n",
          md ? "- " : "", B->T.nr, B->prompt_blocks, B->distinct_ids, B->o->F, hit,
          B->stored_blocks, B->evicted, B->truncated_reqs, B->gen_seconds, md ? "" : "");
  fprintf(f, "%sops: %zu (%zu find_matches, %zu events); block-ops %" PRIu64 " (queried %" PRIu64
          ", stored %" PRIu64 ", removed %" PRIu64 "); final holdings %" PRIu64 ", peak %" PRIu64 "\n",
          md ? "- " : "", B->nops, B->n_queries, B->n_events, bo, B->bo_query, B->bo_store,
          B->bo_remove, B->expect_total, B->peak_holdings);
}

/* ---- concurrency ---------------------------------------------------------------- */
#if BENCH_HAVE_THREADS
typedef struct {
  const bench_t *B;
  kvidx *ix;
  size_t start;
  uint32_t *lat;
  size_t nlat, caplat;
  uint64_t nq, seen, bad;
  uint64_t rng;
  atomic_int *go, *stop;
  uint64_t t0, t1;
} reader_t;

static void *reader_main(void *arg) {
  reader_t *r = arg;
  const bench_t *B = r->B;
  size_t nq = B->n_queries;
  kvidx_score *sc = xcalloc(B->K, sizeof *sc);
  while (!atomic_load(r->go)) {
  }
  r->t0 = now_ns();
  size_t i = r->start;
  while (!atomic_load_explicit(r->stop, memory_order_relaxed)) {
    const op_t *op = &B->ops[B->qidx[i]];
    if (++i == nq) i = 0;
    uint64_t a = now_ns();
    size_t m = kvidx_find_matches(r->ix, B->locals + op->off, op->n, sc, B->K);
    uint64_t b = now_ns();
    uint32_t dt = b - a > UINT32_MAX ? UINT32_MAX : (uint32_t)(b - a);
    if (r->nlat < r->caplat) r->lat[r->nlat++] = dt;
    else {
      uint64_t j = rng_next(&r->rng) % (r->seen + 1);
      if (j < r->caplat) r->lat[j] = dt; /* reservoir sample */
    }
    r->seen++;
    r->nq++;
    /* sanity: results must be well formed even under concurrent writes */
    if (m > B->K) m = B->K;
    for (size_t j = 0; j < m; j++) {
      int ok = sc[j].depth >= 1 && sc[j].depth <= op->n && sc[j].worker_id >= 100 &&
               sc[j].worker_id < 100u + B->K / B->o->R + 1 && sc[j].dp_rank < B->o->R;
      if (j > 0) {
        const kvidx_score *p = &sc[j - 1];
        ok = ok && (p->depth > sc[j].depth ||
                    (p->depth == sc[j].depth && (p->worker_id < sc[j].worker_id ||
                                                 (p->worker_id == sc[j].worker_id &&
                                                  p->dp_rank < sc[j].dp_rank))));
      }
      if (!ok) {
        r->bad++;
        break;
      }
    }
  }
  r->t1 = now_ns();
  free(sc);
  return NULL;
}

typedef struct {
  const bench_t *B;
  kvidx *ix;
  int id, nw;
  uint64_t budget_ns;
  uint64_t events, blockops, bad, cycles;
  int first_rc;
  atomic_int *go;
  uint64_t t0, t1;
} writer_t;

static void *writer_main(void *arg) {
  writer_t *w = arg;
  const bench_t *B = w->B;
  while (!atomic_load(w->go)) {
  }
  w->t0 = now_ns();
  do {
    for (uint32_t k = (uint32_t)w->id; k < B->K; k += (uint32_t)w->nw) {
      int rc = kvidx_clear(w->ix, worker_id_of(B, k), dp_rank_of(B, k));
      w->events++;
      if (rc != KVIDX_OK && w->bad++ == 0) w->first_rc = rc;
    }
    for (size_t i = 0; i < B->nops; i++) {
      const op_t *op = &B->ops[i];
      if (op->type == OP_QUERY || op->worker % (uint32_t)w->nw != (uint32_t)w->id) continue;
      int rc = apply_event(w->ix, B, op);
      w->events++;
      w->blockops += op->n;
      if (rc != KVIDX_OK && w->bad++ == 0) w->first_rc = rc;
    }
    w->cycles++;
  } while (now_ns() - w->t0 < w->budget_ns && w->cycles < 1000);
  w->t1 = now_ns();
  return NULL;
}

static uint64_t all_queries_checksum(const bench_t *B, kvidx *ix) {
  kvidx_score *sc = xcalloc(B->K, sizeof *sc);
  uint64_t cs = 77;
  for (size_t q = 0; q < B->n_queries; q++) {
    const op_t *op = &B->ops[B->qidx[q]];
    size_t m = kvidx_find_matches(ix, B->locals + op->off, op->n, sc, B->K);
    cs = fold(cs, m);
    if (m > B->K) m = B->K;
    for (size_t j = 0; j < m; j++)
      cs = fold(cs, sc[j].worker_id ^ ((uint64_t)sc[j].dp_rank << 32) ^ ((uint64_t)sc[j].depth << 48));
  }
  free(sc);
  return cs;
}

typedef struct {
  double q_s, p50, p99, p999;
  uint64_t nq, bad;
} rstat_t;

static rstat_t run_readers(const bench_t *B, kvidx *ix, int nr, writer_t *ws, int nw,
                           double seconds) {
  rstat_t out;
  memset(&out, 0, sizeof out);
  atomic_int go = 0, stop = 0;
  reader_t *rs = xcalloc((size_t)nr, sizeof *rs);
  pthread_t *rt = xcalloc((size_t)nr, sizeof *rt), *wt = xcalloc((size_t)nw + 1, sizeof *wt);
  for (int i = 0; i < nr; i++) {
    rs[i].B = B, rs[i].ix = ix, rs[i].go = &go, rs[i].stop = &stop;
    rs[i].start = (B->n_queries / (size_t)nr) * (size_t)i;
    rs[i].caplat = 1u << 20;
    rs[i].lat = xcalloc(rs[i].caplat, sizeof *rs[i].lat);
    rs[i].rng = 99u + (uint64_t)i;
    if (pthread_create(&rt[i], NULL, reader_main, &rs[i])) die("pthread_create failed");
  }
  for (int i = 0; i < nw; i++) {
    ws[i].go = &go;
    if (pthread_create(&wt[i], NULL, writer_main, &ws[i])) die("pthread_create failed");
  }
  atomic_store(&go, 1);
  if (nw) {
    for (int i = 0; i < nw; i++) pthread_join(wt[i], NULL);
  } else {
    struct timespec ts = {(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
    nanosleep(&ts, NULL);
  }
  atomic_store(&stop, 1);
  size_t tot = 0;
  double rate = 0;
  for (int i = 0; i < nr; i++) {
    pthread_join(rt[i], NULL);
    tot += rs[i].nlat;
    out.nq += rs[i].nq;
    out.bad += rs[i].bad;
    rate += (double)rs[i].nq / ((double)(rs[i].t1 - rs[i].t0) / 1e9);
  }
  uint32_t *all = xcalloc(tot, sizeof *all);
  size_t at = 0;
  for (int i = 0; i < nr; i++) {
    memcpy(all + at, rs[i].lat, rs[i].nlat * sizeof *all);
    at += rs[i].nlat;
    free(rs[i].lat);
  }
  qsort(all, tot, sizeof *all, cmp_u32);
  out.q_s = rate;
  out.p50 = pct(all, tot, 0.5), out.p99 = pct(all, tot, 0.99), out.p999 = pct(all, tot, 0.999);
  free(all), free(rs), free(rt), free(wt);
  return out;
}

static int run_concurrency(const bench_t *B, FILE *md) {
  const opts_t *o = B->o;
  int kind = o->conc_kind, fail = 0;
  if (kind == KVIDX_REFERENCE) die("--conc-kind reference: the reference model allows no concurrency");
  int nw = o->writers, nr = o->readers;
  kvidx *ix = make_index(B, kind, NULL);
  for (size_t i = 0; i < B->nops; i++)
    if (B->ops[i].type != OP_QUERY) (void)apply_event(ix, B, &B->ops[i]);
  uint64_t before = all_queries_checksum(B, ix);
  rstat_t alone = {0};
  if (nr) alone = run_readers(B, ix, nr, NULL, 0, o->conc_time);
  writer_t *ws = xcalloc((size_t)(nw ? nw : 1), sizeof *ws);
  for (int i = 0; i < nw; i++) {
    ws[i].B = B, ws[i].ix = ix, ws[i].id = i, ws[i].nw = nw;
    ws[i].budget_ns = (uint64_t)(o->conc_time * 1e9);
  }
  rstat_t mixed = run_readers(B, ix, nr, ws, nw, o->conc_time);
  uint64_t ev = 0, bo = 0, bad = 0, t0 = UINT64_MAX, t1 = 0, cycles = 0;
  for (int i = 0; i < nw; i++) {
    ev += ws[i].events, bo += ws[i].blockops, bad += ws[i].bad, cycles += ws[i].cycles;
    if (ws[i].t0 < t0) t0 = ws[i].t0;
    if (ws[i].t1 > t1) t1 = ws[i].t1;
  }
  double wsec = nw ? (double)(t1 - t0) / 1e9 : 0;
  uint64_t after = all_queries_checksum(B, ix);
  int chk = kvidx__check(ix);
  kvidx_destroy(ix);
  char b1[32], b2[32], b3[32], b4[32];
  printf("\nconcurrency (%s, %d writer%s x %d reader%s, %ld cores online):\n", kind_name(kind), nw,
         nw == 1 ? "" : "s", nr, nr == 1 ? "" : "s", sysconf(_SC_NPROCESSORS_ONLN));
  if (nr)
    printf("  readers alone:        %s queries/s  p50 %.0f ns  p99 %.0f ns  p99.9 %.0f ns\n",
           si(alone.q_s, b1, sizeof b1), alone.p50, alone.p99, alone.p999);
  if (nr && nw)
    printf("  readers with writers: %s queries/s  p50 %.0f ns  p99 %.0f ns  p99.9 %.0f ns\n",
           si(mixed.q_s, b1, sizeof b1), mixed.p50, mixed.p99, mixed.p999);
  if (nw)
    printf("  writers:              %s events/s  %s block-ops/s  (%" PRIu64 " events over %.2fs, %"
           PRIu64 " replay cycles of clear + full history)\n",
           si((double)ev / wsec, b2, sizeof b2), si((double)bo / wsec, b3, sizeof b3), ev, wsec, cycles);
  if (bad) {
    printf("  FAIL: %" PRIu64 " writer calls failed\n", bad);
    fail = 1;
  }
  if (alone.bad + mixed.bad) {
    printf("  FAIL: %" PRIu64 " malformed query results seen by readers\n", alone.bad + mixed.bad);
    fail = 1;
  }
  if (before != after) {
    printf("  FAIL: state after concurrent replay differs from the sequential one (checksum %016" PRIx64
           " vs %016" PRIx64 ")\n", after, before);
    fail = 1;
  } else if (chk != 0) {
    printf("  FAIL: kvidx__check = %d after the concurrent replay\n", chk);
    fail = 1;
  } else {
    printf("  final state identical to the sequential replay (checksum %016" PRIx64 ")\n", after);
  }
  if (md) {
    fprintf(md, "\nConcurrency (%s, %d writers x %d readers, %ld cores):\n\n", kind_name(kind), nw, nr,
            sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(md, "| phase | reader queries/s | reader p50 ns | reader p99 ns | writer events/s |\n");
    fprintf(md, "|---|---:|---:|---:|---:|\n");
    if (nr) fprintf(md, "| readers alone | %s | %.0f | %.0f | - |\n", si(alone.q_s, b1, sizeof b1), alone.p50, alone.p99);
    if (nw)
      fprintf(md, "| readers + writers | %s | %.0f | %.0f | %s |\n", nr ? si(mixed.q_s, b1, sizeof b1) : "-",
              mixed.p50, mixed.p99, si((double)ev / wsec, b4, sizeof b4));
    fprintf(md, "\nFinal state after concurrent replay %s the sequential one.\n", fail ? "DIFFERS from" : "equals");
  }
  free(ws);
  return fail;
}
#endif

/* ---- offered-load sweep ----------------------------------------------------------- */
typedef struct {
  int kind;
  double offered, achieved, bops, p50, p99, p999;
  int kept_up;
} sweep_row_t;

static void sweep_kind(const bench_t *B, int kind, double base, sweep_row_t *rows, int *nrows) {
  static const double mult[] = {0.05, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0};
  const int nm = (int)(sizeof mult / sizeof mult[0]);
  kvidx_score *sc = xcalloc(B->K, sizeof *sc);
  uint32_t *lat = xcalloc(B->n_queries + 1, sizeof *lat);
  progress_t pg;
  char what[64];
  snprintf(what, sizeof what, "%s sweep", kind_name(kind));
  progress_begin(&pg, what);
  for (int s = 0; s < nm; s++) {
    double rate = base * mult[s];
    size_t want = (size_t)(rate * B->o->sweep_step);
    if (want < 2000) want = 2000;
    if (want > B->nops) want = B->nops;
    size_t from = B->nops - want;
    kvidx *ix = make_index(B, kind, NULL);
    for (size_t i = 0; i < from; i++)
      if (B->ops[i].type != OP_QUERY) (void)apply_event(ix, B, &B->ops[i]);
    size_t nl = 0;
    uint64_t bo = 0;
    double step = 1e9 / rate;
    uint64_t t0 = now_ns(), end = t0;
    for (size_t i = from; i < B->nops; i++) {
      const op_t *op = &B->ops[i];
      uint64_t sched = t0 + (uint64_t)((double)(i - from) * step);
      while (now_ns() < sched) {
      }
      if (op->type == OP_QUERY) {
        (void)kvidx_find_matches(ix, B->locals + op->off, op->n, sc, B->K);
        end = now_ns();
        uint64_t d = end - sched;
        lat[nl++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
      } else {
        (void)apply_event(ix, B, op);
        end = now_ns();
      }
      if (op->type != OP_CLEAR) bo += op->n;
    }
    kvidx_destroy(ix);
    double secs = (double)(end - t0) / 1e9;
    sweep_row_t *r = &rows[(*nrows)++];
    qsort(lat, nl, sizeof *lat, cmp_u32);
    r->kind = kind;
    r->offered = rate;
    r->achieved = (double)want / secs;
    r->bops = (double)bo / secs;
    r->p50 = pct(lat, nl, 0.5), r->p99 = pct(lat, nl, 0.99), r->p999 = pct(lat, nl, 0.999);
    r->kept_up = r->achieved >= 0.95 * rate;
    progress_tick(&pg, (size_t)s + 1, (size_t)nm);
  }
  progress_end(&pg);
  free(sc);
  free(lat);
}

static void run_sweep(const bench_t *B, const result_t *res, int nres, FILE *md) {
  const opts_t *o = B->o;
  sweep_row_t rows[64];
  int nrows = 0;
  for (int i = 0; i < nres; i++) {
    if (res[i].kind == KVIDX_REFERENCE || !res[i].ran || !res[i].full) continue;
    sweep_kind(B, res[i].kind, res[i].ops_s, rows, &nrows);
  }
  if (!nrows) return;
  FILE *f = fopen(o->csv, "w");
  if (!f) die("cannot write %s: %s", o->csv, strerror(errno));
  fprintf(f, "kind,offered_ops_s,achieved_ops_s,achieved_block_ops_s,p50_ns,p99_ns,p999_ns,kept_up\n");
  for (int i = 0; i < nrows; i++)
    fprintf(f, "%s,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%d\n", kind_name(rows[i].kind), rows[i].offered,
            rows[i].achieved, rows[i].bops, rows[i].p50, rows[i].p99, rows[i].p999, rows[i].kept_up);
  fclose(f);
  printf("\noffered-load sweep (latency = completion - scheduled arrival, includes queueing):\n");
  printf("  %-10s %12s %12s %14s %9s %9s %9s\n", "kind", "offered/s", "achieved/s", "block-ops/s",
         "p50 ns", "p99 ns", "p99.9 ns");
  if (md) {
    fprintf(md, "\nOffered-load sweep (single thread; latency includes queueing; CSV `%s`):\n\n", o->csv);
    fprintf(md, "| kind | offered ops/s | achieved ops/s | block-ops/s | p50 ns | p99 ns |\n|---|---:|---:|---:|---:|---:|\n");
  }
  char a[32], b[32], c[32];
  for (int i = 0; i < nrows; i++) {
    printf("  %-10s %12s %12s %14s %9.0f %9.0f %9.0f%s\n", kind_name(rows[i].kind),
           si(rows[i].offered, a, sizeof a), si(rows[i].achieved, b, sizeof b),
           si(rows[i].bops, c, sizeof c), rows[i].p50, rows[i].p99, rows[i].p999,
           rows[i].kept_up ? "" : "  (fell behind)");
    if (md)
      fprintf(md, "| %s | %s | %s | %s | %.0f | %.0f |\n", kind_name(rows[i].kind),
              si(rows[i].offered, a, sizeof a), si(rows[i].achieved, b, sizeof b),
              si(rows[i].bops, c, sizeof c), rows[i].p50, rows[i].p99);
  }
  /* threshold throughput: most achieved load that kept up with p99 within 4x
   * of the lightest load's p99 */
  for (int i = 0; i < nrows;) {
    int k = rows[i].kind, j = i;
    double base = rows[i].p99, thr = 0, thr_b = 0;
    for (; j < nrows && rows[j].kind == k; j++)
      if (rows[j].kept_up && rows[j].p99 <= 4 * base + 1000 && rows[j].achieved > thr)
        thr = rows[j].achieved, thr_b = rows[j].bops;
    printf("  %s threshold throughput: %s ops/s (%s block-ops/s)\n", kind_name(k), si(thr, a, sizeof a),
           si(thr_b, b, sizeof b));
    if (md)
      fprintf(md, "\n%s threshold throughput: %s ops/s (%s block-ops/s).\n", kind_name(k),
              si(thr, a, sizeof a), si(thr_b, b, sizeof b));
    i = j;
  }
  printf("  csv: %s\n", o->csv);
  if (o->png && system("command -v gnuplot >/dev/null 2>&1") == 0) {
    FILE *g = popen("gnuplot", "w");
    if (g) {
      fprintf(g, "set terminal png size 900,560 noenhanced\nset output '%s'\nset datafile separator ','\n", o->png);
      fprintf(g, "set logscale xy\nset xlabel 'achieved ops/s (events + find_matches)'\n");
      fprintf(g, "set ylabel 'find_matches p99 latency incl. queueing (ns)'\nset key top left\nset grid\n");
      fprintf(g, "set title 'kvidx offered-load sweep (%u workers, C=%u, F=%u)'\n", o->W, o->C, o->F);
      fprintf(g, "plot '%s' every ::1 using (strcol(1) eq 'positional' ? $3 : 1/0):6 with linespoints "
                 "title 'positional', '' every ::1 using (strcol(1) eq 'radix' ? $3 : 1/0):6 with linespoints "
                 "title 'radix'\n", o->csv);
      if (pclose(g) == 0) printf("  png: %s\n", o->png);
      else remove(o->png);
    }
  }
}

/* ---- results table ------------------------------------------------------------------ */
static int report(const bench_t *B, result_t *res, int nres, size_t prefix_at, FILE *md) {
  char b1[32], b2[32], b3[32], b4[32], cfg[256];
  int fail = 0;
  config_line(B, cfg, sizeof cfg);
  printf("\n%-10s %10s %10s %12s %8s %8s %8s %11s %8s  %s\n", "kind", "events/s", "queries/s",
         "block-ops/s", "p50 ns", "p99 ns", "p99.9 ns", "peak", "B/block", "checksum");
  if (md) {
    fprintf(md, "| kind | events/s | queries/s | block-ops/s | p50 ns | p99 ns | p99.9 ns | peak bytes | bytes/block | checksum |\n");
    fprintf(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  }
  const result_t *first = NULL;
  for (int i = 0; i < nres; i++) {
    result_t *r = &res[i];
    double bpb = r->blocks_end ? (double)r->end_bytes / (double)r->blocks_end : 0;
    char note[64] = "";
    if (!r->full) snprintf(note, sizeof note, " (first %zu ops)", r->ops_run);
    printf("%-10s %10s %10s %12s %8.0f %8.0f %8.0f %11s %8.1f  %016" PRIx64 "%s%s\n", kind_name(r->kind),
           si(r->ev_s, b1, sizeof b1), si(r->q_s, b2, sizeof b2), si(r->bops_s, b3, sizeof b3), r->p50,
           r->p99, r->p999, bytes_str((double)r->peak_bytes, b4, sizeof b4), bpb,
           r->full ? r->cs_full : r->cs_prefix, note, r->slow_path ? " *" : "");
    if (md) {
      char b5[32];
      fprintf(md, "| %s%s | %s | %s | %s | %.0f | %.0f | %.0f | %s | %.1f | `%016" PRIx64 "` |\n",
              kind_name(r->kind), note, si(r->ev_s, b1, sizeof b1), si(r->q_s, b2, sizeof b2),
              si(r->bops_s, b3, sizeof b3), r->p50, r->p99, r->p999,
              bytes_str((double)r->peak_bytes, b5, sizeof b5), bpb, r->full ? r->cs_full : r->cs_prefix);
    }
    /* per-kind verification */
    if (r->bad_status) {
      printf("  FAIL %s: %zu events returned an error; first: op #%zu -> %s\n", kind_name(r->kind),
             r->bad_status, r->first_bad_op, kvidx_strerror(r->first_bad_rc));
      fail = 1;
    }
    if (r->check_fail_rc) {
      printf("  FAIL %s: kvidx__check = %d first seen after op #%zu (--check-every %zu)\n",
             kind_name(r->kind), r->check_fail_rc, r->check_fail_op, B->o->check_every);
      fail = 1;
    }
    if (r->check_rc != 0) {
      printf("  FAIL %s: kvidx__check = %d after replay\n", kind_name(r->kind), r->check_rc);
      fail = 1;
    }
    if (r->full && (r->blocks_end != B->expect_total || r->holdings_bad)) {
      printf("  FAIL %s: holdings differ from the mock engine's caches (%zu vs %" PRIu64
             " blocks, %zu workers differ)\n", kind_name(r->kind), r->blocks_end, B->expect_total,
             r->holdings_bad);
      fail = 1;
    }
    if (r->mismatch) printf("  NOTE %s: %zu frees passed a size different from the allocation\n",
                            kind_name(r->kind), r->mismatch);
    if (r->leaked) {
      printf("  FAIL %s: %zu bytes still allocated after kvidx_destroy\n", kind_name(r->kind), r->leaked);
      fail = 1;
    }
    if (r->stats_peak && (r->stats_peak != r->peak_bytes || r->stats_bytes != r->end_bytes))
      printf("  note %s: kvidx_get_stats bytes %zu / peak %zu; hooks counted %zu / %zu\n",
             kind_name(r->kind), r->stats_bytes, r->stats_peak, r->end_bytes, r->peak_bytes);
    if (r->cpu_share < 0.9)
      printf("  WARNING %s: the replay got only %.0f%% of a core (other load on the machine); "
             "its numbers are inflated\n", kind_name(r->kind), 100 * r->cpu_share);
    if (!first) first = r;
  }
  /* cross-kind checksums */
  int agree = 1;
  for (int i = 1; i < nres; i++) {
    if (res[i].cs_prefix != res[0].cs_prefix || res[i].ss_prefix != res[0].ss_prefix) agree = 0;
  }
  const result_t *ff = NULL;
  for (int i = 0; i < nres; i++) {
    if (!res[i].full) continue;
    if (ff && (res[i].cs_full != ff->cs_full || res[i].ss_full != ff->ss_full ||
               res[i].blocks_end != ff->blocks_end || res[i].workers_end != ff->workers_end))
      agree = 0;
    if (!ff) ff = &res[i];
  }
  if (nres > 1) {
    if (agree) {
      printf("checksums: all %d kinds agree (scores %016" PRIx64 " over %zu ops, statuses %016" PRIx64 ")\n",
             nres, res[0].cs_prefix, prefix_at, res[0].ss_prefix);
    } else {
      printf("CHECKSUM MISMATCH: the kinds disagree; rerun with smaller --max-requests to minimize\n");
      for (int i = 1; i < nres; i++) {
        size_t nq = res[0].n_q_run < res[i].n_q_run ? res[0].n_q_run : res[i].n_q_run;
        for (size_t q = 0; q < nq; q++)
          if (res[0].qh[q] != res[i].qh[q]) {
            printf("  first differing find_matches between %s and %s: query #%zu = op #%zu "
                   "(see --dump-ops)\n", kind_name(res[0].kind), kind_name(res[i].kind), q, B->qidx[q]);
            break;
          }
      }
      for (int i = 0; i < nres; i++)
        printf("  %-10s scores@%zu %016" PRIx64 " statuses@%zu %016" PRIx64 " full %016" PRIx64
               " blocks %zu workers %zu\n", kind_name(res[i].kind), prefix_at, res[i].cs_prefix, prefix_at,
               res[i].ss_prefix, res[i].cs_full, res[i].blocks_end, res[i].workers_end);
      fail = 1;
    }
  }
  if (md) {
    fputc('\n', md);
    for (int i = 0; i < nres; i++)
      if (res[i].cpu_share < 0.9)
        fprintf(md, "- %s: the replay got only %.0f%% of a core (machine busy): its numbers are inflated.\n",
                kind_name(res[i].kind), 100 * res[i].cpu_share);
    fprintf(md, "- Checksums: %s.\n", agree ? "all kinds agree" : "**MISMATCH**");
  }
  /* ratios */
  const result_t *pos = NULL, *rad = NULL, *ref = NULL;
  for (int i = 0; i < nres; i++) {
    if (res[i].kind == KVIDX_POSITIONAL) pos = &res[i];
    if (res[i].kind == KVIDX_RADIX) rad = &res[i];
    if (res[i].kind == KVIDX_REFERENCE) ref = &res[i];
  }
  char rl[256] = "";
  size_t at = 0;
  if (pos && rad)
    at += (size_t)snprintf(rl + at, sizeof rl - at, "positional/radix %.2fx block-ops/s, p99 %.2fx lower",
                           pos->bops_s / rad->bops_s, pos->p99 > 0 ? rad->p99 / pos->p99 : 0);
  if (pos && ref && at < sizeof rl)
    at += (size_t)snprintf(rl + at, sizeof rl - at, "%spositional/reference %.*fx block-ops/s, p99 %.*fx lower%s",
                           at ? "; " : "", pos->bops_s / ref->bops_s < 10 ? 2 : 0, pos->bops_s / ref->bops_s,
                           ref->p99 / pos->p99 < 10 ? 2 : 0, pos->p99 > 0 ? ref->p99 / pos->p99 : 0,
                           ref->full ? "" : " (reference on a prefix)");
  if (at) {
    printf("ratios: %s\n", rl);
    if (md) fprintf(md, "- Ratios: %s.\n", rl);
  }
  printf("score sums (= --replay --time checksum):");
  for (int i = 0; i < nres; i++)
    printf(" %s=%" PRIu64 "%s", kind_name(res[i].kind), res[i].depth_sum, res[i].full ? "" : "(prefix)");
  printf("\n");
  printf("(timer overhead ~%" PRIu64 " ns is included in each latency; '*' = throughput from the timed pass)\n",
         g_timer_overhead);
  return fail;
}

/* ---- demo ----------------------------------------------------------------------------- */
static void free_ops(bench_t *B) {
  free(B->ops), free(B->rm), free(B->qidx), free(B->expect_blocks), free(B->req_per_worker);
  B->ops = NULL, B->rm = NULL, B->qidx = NULL, B->expect_blocks = NULL, B->req_per_worker = NULL;
  B->nops = B->capops = B->nrm = B->caprm = 0;
  B->n_queries = B->n_events = 0;
  B->bo_query = B->bo_store = B->bo_remove = 0;
  B->prompt_blocks = B->hit_blocks = B->stored_blocks = B->evicted = B->truncated_reqs = 0;
  B->peak_holdings = B->expect_total = 0;
}

static double imbalance(const bench_t *B) {
  uint32_t mx = 0;
  uint64_t sum = 0;
  for (uint32_t w = 0; w < B->o->W; w++) {
    sum += B->req_per_worker[w];
    if (B->req_per_worker[w] > mx) mx = B->req_per_worker[w];
  }
  return sum ? (double)mx / ((double)sum / B->o->W) : 0;
}

static int run_demo(bench_t *B) {
  opts_t *o = B->o;
  o->route_kvidx = 0;
  generate(B);
  double hit_rand = 100.0 * (double)B->hit_blocks / (double)B->prompt_blocks, imb_rand = imbalance(B);
  free_ops(B);
  o->route_kvidx = 1;
  generate(B);
  double hit_kv = 100.0 * (double)B->hit_blocks / (double)B->prompt_blocks, imb_kv = imbalance(B);
  double ideal = 100.0 * (1.0 - (double)B->distinct_ids * o->F / (double)B->prompt_blocks);
  printf("kvidx %s demo: Mooncake conversation trace (%zu requests, %" PRIu64 " prompt blocks of 512 tokens)\n",
         kvidx_version(), B->T.nr, B->prompt_blocks);
  printf("replayed through a mock engine: %u workers, LRU cache of %u blocks each\n\n", o->W, o->C);
  printf("  prefix cache-hit rate, random routing:        %5.1f%%   (busiest worker %.2fx the mean load)\n",
         hit_rand, imb_rand);
  printf("  prefix cache-hit rate, kvidx-guided routing:  %5.1f%%   (busiest worker %.2fx the mean load)\n",
         hit_kv, imb_kv);
  printf("  upper bound (one infinite cache):             %5.1f%%\n", ideal);
  printf("  -> %.1fx the cache hits, i.e. %.0f%% fewer prompt blocks to prefill\n\n",
         hit_rand > 0 ? hit_kv / hit_rand : 0,
         100.0 * (1.0 - (100.0 - hit_kv) / (100.0 - hit_rand)));
  result_t r;
  o->min_time = 0.3;
  run_kind(B, KVIDX_POSITIONAL, B->nops, B->nops, &r);
  char b1[32], b2[32];
  printf("index (positional, single thread) on the kvidx-guided run: %zu events + %zu find_matches\n",
         B->n_events, B->n_queries);
  printf("  %s block-ops/s, %s find_matches/s, find_matches p50 %.0f ns, p99 %.0f ns, %.1f bytes/block\n",
         si(r.bops_s, b1, sizeof b1), si(r.q_s, b2, sizeof b2), r.p50, r.p99,
         r.blocks_end ? (double)r.end_bytes / (double)r.blocks_end : 0.0);
  int fail = r.bad_status || r.check_rc || r.blocks_end != B->expect_total;
  if (fail) printf("  FAIL: index disagrees with the mock engine (errors %zu, check %d)\n", r.bad_status, r.check_rc);
  printf("\nfull suite: make bench   (tool: build/kvidx-bench --help)\n");
  free(r.lat);
  free(r.qh);
  return fail;
}

static void dump_ops(const bench_t *B, size_t from, size_t to) {
  static const char *tn[] = {"find_matches", "store", "remove", "clear"};
  if (to > B->nops) to = B->nops;
  for (size_t i = from; i < to; i++) {
    const op_t *op = &B->ops[i];
    if (op->type == OP_QUERY) printf("op #%zu %s n=%u", i, tn[op->type], op->n);
    else printf("op #%zu %s worker_id=%" PRIu64 " dp_rank=%u n=%u", i, tn[op->type],
                worker_id_of(B, op->worker), dp_rank_of(B, op->worker), op->n);
    if (op->type == OP_QUERY) {
      printf("\n  locals:");
      for (uint32_t j = 0; j < op->n; j++) printf(" %016" PRIx64, B->locals[op->off + j]);
    } else if (op->type == OP_STORE) {
      if (op->has_parent) printf(" parent=%016" PRIx64, op->parent);
      printf("\n  (local, seq):");
      for (uint32_t j = 0; j < op->n; j++)
        printf(" (%016" PRIx64 ", %016" PRIx64 ")", B->blocks[op->off + j].local, B->blocks[op->off + j].seq);
    } else if (op->type == OP_REMOVE) {
      printf("\n  seqs:");
      for (uint32_t j = 0; j < op->n; j++) printf(" %016" PRIx64, B->rm[op->off + j]);
    }
    printf("\n");
  }
}

/* ---- event files: the format of Dynamo's replay tool ------------------------------
 * One event per line, decimal u64, single spaces (see bench/README.md):
 *   S worker parent|- n local seq local seq ...
 *   R worker n seq seq ...
 *   C worker
 *   Q n local local ...
 * --write-events writes the mock engine's op stream in this form; --replay reads
 * such a file and times kvidx on it with the conventions of dynamo-replay --time,
 * so the two tools' lines compare field by field. */
typedef struct {
  FILE *f;
  size_t n;
  char buf[1u << 16];
} ewriter_t;

static void ew_flush(ewriter_t *w) {
  if (w->n && fwrite(w->buf, 1, w->n, w->f) != w->n) die("write failed: %s", strerror(errno));
  w->n = 0;
}
static void ew_char(ewriter_t *w, char c) {
  if (w->n == sizeof w->buf) ew_flush(w);
  w->buf[w->n++] = c;
}
/* a space, then v in decimal */
static void ew_u64(ewriter_t *w, uint64_t v) {
  char t[24];
  int i = 0;
  do t[i++] = (char)('0' + v % 10), v /= 10;
  while (v);
  if (w->n + 24 > sizeof w->buf) ew_flush(w);
  w->buf[w->n++] = ' ';
  while (i) w->buf[w->n++] = t[--i];
}

/* --opaque-seqs: a seq as an engine with its own block hashes (vLLM,
 * SGLang, TRT-LLM) would publish it: murmur3's 64-bit finalizer, a
 * bijection, so parents and removals name the same blocks as before and
 * the answers (matched on locals) stay the same, but a store's seqs no
 * longer follow Dynamo's chain of its locals (kvidx_seq_hash_next), which
 * the index uses where it holds (a moving rest's seq entries are found by
 * that folding, else by the seq hints such workers leave). */
static uint64_t opaque_seq(const bench_t *B, uint64_t seq) {
  if (!B->o->opaque_seqs) return seq;
  seq ^= seq >> 33;
  seq *= 0xff51afd7ed558ccdull;
  seq ^= seq >> 33;
  seq *= 0xc4ceb9fe1a85ec53ull;
  return seq ^ (seq >> 33);
}

static void write_events(const bench_t *B, const char *path) {
  if (B->o->R != 1) die("--write-events: the file format has no dp rank (use --dp-ranks 1)");
  ewriter_t *w = xcalloc(1, sizeof *w);
  w->f = fopen(path, "w");
  if (!w->f) die("cannot write %s: %s", path, strerror(errno));
  for (size_t i = 0; i < B->nops; i++) {
    const op_t *op = &B->ops[i];
    switch (op->type) {
    case OP_QUERY:
      ew_char(w, 'Q');
      ew_u64(w, op->n);
      for (uint32_t j = 0; j < op->n; j++) ew_u64(w, B->locals[op->off + j]);
      break;
    case OP_STORE:
      ew_char(w, 'S');
      ew_u64(w, worker_id_of(B, op->worker));
      if (op->has_parent) ew_u64(w, opaque_seq(B, op->parent));
      else ew_char(w, ' '), ew_char(w, '-');
      ew_u64(w, op->n);
      for (uint32_t j = 0; j < op->n; j++) {
        ew_u64(w, B->blocks[op->off + j].local);
        ew_u64(w, opaque_seq(B, B->blocks[op->off + j].seq));
      }
      break;
    case OP_REMOVE:
      ew_char(w, 'R');
      ew_u64(w, worker_id_of(B, op->worker));
      ew_u64(w, op->n);
      for (uint32_t j = 0; j < op->n; j++) ew_u64(w, opaque_seq(B, B->rm[op->off + j]));
      break;
    default:
      ew_char(w, 'C');
      ew_u64(w, worker_id_of(B, op->worker));
      break;
    }
    ew_char(w, '\n');
  }
  ew_flush(w);
  if (fclose(w->f) != 0) die("write %s failed: %s", path, strerror(errno));
  free(w);
}

/* A parsed event file: ops in file order; op_t.worker indexes wid[]; op_t.off
 * points into blocks (S) or words (R seqs, Q locals). */
typedef struct {
  op_t *ops;
  size_t nops, capops;
  kvidx_block *blocks;
  size_t nblocks, capblocks;
  uint64_t *words;
  size_t nwords, capwords;
  uint64_t *wid;
  size_t nwid, capwid;
  idmap_t wmap; /* worker id -> index into wid */
  size_t nq, ne;
  uint64_t block_ops;
} efile_t;

/* reads one decimal u64 token preceded by spaces; 0 on malformed input */
static int rd_u64(const char **pp, uint64_t *out) {
  const char *p = *pp;
  while (*p == ' ' || *p == '\t') p++;
  if (*p < '0' || *p > '9') return 0;
  uint64_t v = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return 0;
    v = v * 10 + d;
  }
  if (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') return 0;
  *pp = p;
  *out = v;
  return 1;
}

static uint32_t efile_worker(efile_t *E, uint64_t id) {
  if (2 * (E->nwid + 1) > E->wmap.mask + 1) { /* grow the map: rehash */
    idmap_t old = E->wmap;
    idmap_init(&E->wmap, 2 * (E->nwid + 1));
    for (size_t i = 0; old.vals && i <= old.mask; i++)
      if (old.vals[i] != NIL) *idmap_slot(&E->wmap, old.keys[i]) = old.vals[i];
    free(old.keys), free(old.vals);
  }
  uint32_t *v = idmap_slot(&E->wmap, id);
  if (*v == NIL) {
    reserve(&E->wid, &E->capwid, E->nwid + 1, sizeof *E->wid);
    E->wid[E->nwid] = id;
    *v = (uint32_t)E->nwid++;
  }
  return *v;
}

static void load_events(efile_t *E, const char *path) {
  memset(E, 0, sizeof *E);
  /* The whole file is read into one heap buffer and freed after parsing, as
   * dynamo-replay does (read_to_string): glibc raises its mmap and trim
   * thresholds to the largest mapped chunk freed, so this decides whether each
   * repetition's fresh index finds the last one's pages (17 MB file: 246 page
   * faults per repetition) or has them trimmed back at every destroy (2,329
   * when kvidx-bench read by getline). */
  FILE *f = fopen(path, "rb");
  if (!f) die("cannot open %s: %s", path, strerror(errno));
  long hint = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (hint < 0 || fseek(f, 0, SEEK_SET) != 0) hint = 0; /* a pipe: grown as read */
  size_t size = 0, cap = (size_t)hint + 1, got;
  char *text = xrealloc(NULL, cap);
  for (;; size += got) {
    if (size + 1 == cap) { /* full: one byte more tells whether there is more */
      int c = fgetc(f);
      if (c == EOF) break;
      text = xrealloc(text, cap = 2 * cap + 4096);
      text[size++] = (char)c;
    }
    if (!(got = fread(text + size, 1, cap - size - 1, f))) break;
  }
  if (ferror(f)) die("read %s failed", path);
  fclose(f);
  text[size] = 0;
  size_t lineno = 0;
  for (char *line = text, *next; line < text + size; line = next) {
    char *nl = memchr(line, '\n', (size_t)(text + size - line));
    next = nl ? nl + 1 : text + size;
    if (nl) *nl = 0;
    size_t len = (size_t)(next - line);
    lineno++;
    const char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\n' || *p == '\r' || !*p) continue;
    char tag = *p++;
    op_t op;
    memset(&op, 0, sizeof op);
    uint64_t w = 0, n = 0;
    /* every number takes at least two characters: n is bounded by the line */
#define BAD() die("%s:%zu: malformed event line", path, lineno)
#define NUM(x) do { if (!rd_u64(&p, &(x))) BAD(); } while (0)
    if (tag == 'S') {
      NUM(w);
      while (*p == ' ' || *p == '\t') p++;
      if (*p == '-') {
        p++;
        if (*p != ' ' && *p != '\t') BAD();
      } else {
        NUM(op.parent);
        op.has_parent = 1;
      }
      NUM(n);
      if (n == 0 || n > len / 4 || n > UINT32_MAX) BAD();
      reserve(&E->blocks, &E->capblocks, E->nblocks + n, sizeof *E->blocks);
      op.type = OP_STORE, op.off = E->nblocks, op.n = (uint32_t)n;
      for (uint64_t j = 0; j < n; j++) {
        NUM(E->blocks[E->nblocks + j].local);
        NUM(E->blocks[E->nblocks + j].seq);
      }
      E->nblocks += n;
    } else if (tag == 'R' || tag == 'Q') {
      if (tag == 'R') NUM(w);
      NUM(n);
      if ((tag == 'R' && n == 0) || n > len / 2 || n > UINT32_MAX) BAD();
      reserve(&E->words, &E->capwords, E->nwords + n, sizeof *E->words);
      op.type = tag == 'R' ? OP_REMOVE : OP_QUERY, op.off = E->nwords, op.n = (uint32_t)n;
      for (uint64_t j = 0; j < n; j++) NUM(E->words[E->nwords + j]);
      E->nwords += n;
    } else if (tag == 'C') {
      NUM(w);
      op.type = OP_CLEAR;
    } else {
      BAD();
    }
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    if (*p) BAD(); /* trailing garbage */
#undef NUM
#undef BAD
    if (op.type != OP_QUERY) op.worker = efile_worker(E, w), E->ne++;
    else E->nq++;
    E->block_ops += op.n;
    reserve(&E->ops, &E->capops, E->nops + 1, sizeof *E->ops);
    E->ops[E->nops++] = op;
  }
  free(text);
}

static void free_events(efile_t *E) {
  free(E->ops), free(E->blocks), free(E->words), free(E->wid);
  free(E->wmap.keys), free(E->wmap.vals);
}

/* One S/R/C line through a store / remove / clear triple: the library's
 * (apply_file_event_from) or --walk-floor's counting copy's.  A macro, so
 * the timed replays call kvidx_store etc. directly, not through pointers. */
#define APPLY_EVENT_WITH(store_fn, remove_fn, clear_fn, ix, E, op, payload)                                   \
  ((op)->type == OP_STORE                                                                                      \
       ? store_fn(ix, (E)->wid[(op)->worker], 0, (op)->has_parent ? &(op)->parent : NULL,                      \
                  (const kvidx_block *)(payload), (op)->n)                                                     \
   : (op)->type == OP_REMOVE ? remove_fn(ix, (E)->wid[(op)->worker], 0, (const uint64_t *)(payload), (op)->n) \
   : (op)->type == OP_CLEAR  ? clear_fn(ix, (E)->wid[(op)->worker], 0)                                         \
                             : KVIDX_EINVAL)

/* One S/R/C line applied; payload = its blocks (S) or seqs (R), from the
 * parsed file or from a per-line buffer (see materialise_events). */
static inline int apply_file_event_from(kvidx *ix, const efile_t *E, const op_t *op, const void *payload) {
  return APPLY_EVENT_WITH(kvidx_store, kvidx_remove, kvidx_clear, ix, E, op, payload);
}

static inline const void *file_payload(const efile_t *E, const op_t *op) {
  return op->type == OP_STORE ? (const void *)(E->blocks + op->off) : (const void *)(E->words + op->off);
}

static inline int apply_file_event(kvidx *ix, const efile_t *E, const op_t *op) {
  return apply_file_event_from(ix, E, op, file_payload(E, op));
}

/* --blocks-per-worker N: cfg.blocks_per_worker of every index made (0: unset) */
static size_t g_blocks_per_worker = 0;

/* an index with the default config except the kind (as a user would), and
 * --blocks-per-worker when given */
static kvidx *make_index_flags(int kind, uint32_t flags) {
  kvidx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.kind = kind;
  cfg.flags = flags;
  cfg.blocks_per_worker = g_blocks_per_worker;
  kvidx *ix = NULL;
  int rc = kvidx_create(&ix, &cfg);
  if (rc != KVIDX_OK || !ix) die("kvidx_create(kind=%s) failed: %s", kind_name(kind), kvidx_strerror(rc));
  return ix;
}

static kvidx *make_default_index(int kind) { return make_index_flags(kind, 0); }

typedef struct {
  double secs;
  uint64_t checksum, errors;
  uint64_t *lat;
  size_t held; /* blocks held at the end */
} frep_t;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}
static int cmp_frep(const void *a, const void *b) {
  double x = ((const frep_t *)a)->secs, y = ((const frep_t *)b)->secs;
  return (x > y) - (x < y);
}
/* dynamo-replay's percentile rule: sorted[p * n / 1000] */
static uint64_t pct_permille(const uint64_t *s, size_t n, uint64_t p) {
  if (!n) return 0;
  size_t i = (size_t)((uint64_t)n * p / 1000);
  return s[i < n ? i : n - 1];
}

/* Each line's payload (blocks, seqs or locals) copied into its own heap buffer
 * before the clock and freed right after it is applied: what dynamo-replay does
 * (build_ops materialises every RouterEvent and query Vec outside its clock; the
 * loop drops each after use), and what a router does with decoded messages.
 * Without it the two tools' indexes meet different heaps (page faults per
 * repetition on W16 C16384: 3,329 without, 2,355 with it while the file was
 * read by getline, 50 once read whole as dynamo-replay reads it; arena_c 246;
 * see load_events). */
static void **materialise_events(const efile_t *E) {
  void **buf = xcalloc(E->nops + 1, sizeof *buf);
  for (size_t i = 0; i < E->nops; i++) {
    const op_t *op = &E->ops[i];
    if (op->type == OP_CLEAR) continue;
    size_t sz = op->type == OP_STORE ? sizeof(kvidx_block) : sizeof(uint64_t);
    buf[i] = xcalloc(op->n ? op->n : 1, sz);
    memcpy(buf[i], file_payload(E, op), (size_t)op->n * sz);
  }
  return buf;
}

/* One timed replay into a fresh index: creation and destruction outside the
 * clock, every line applied in file order inside it, each find_matches timed
 * (without queries: Q lines skipped, sc unused).  With event_buffers, each
 * line's payload comes from (and is freed after use from) its own buffer, as
 * in dynamo-replay (see materialise_events). */
static void replay_file_rep(const efile_t *E, int kind, int event_buffers, int queries, frep_t *r, kvidx_score *sc,
                            size_t cap) {
  void **buf = event_buffers ? materialise_events(E) : NULL;
  kvidx *ix = make_default_index(kind);
  uint64_t cs = 0, errs = 0;
  size_t q = 0;
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < E->nops; i++) {
    const op_t *op = &E->ops[i];
    const void *payload = buf ? buf[i] : file_payload(E, op);
    if (op->type == OP_QUERY) {
      if (!queries) {
        if (buf) free(buf[i]);
        continue;
      }
      uint64_t a = now_ns();
      size_t m = kvidx_find_matches(ix, (const uint64_t *)payload, op->n, sc, cap);
      uint64_t b = now_ns();
      r->lat[q++] = b - a;
      if (m > cap) m = cap;
      for (size_t j = 0; j < m; j++) cs += sc[j].depth;
    } else {
      errs += apply_file_event_from(ix, E, op, payload) != KVIDX_OK;
    }
    if (buf) free(buf[i]);
  }
  r->secs = (double)(now_ns() - t0) / 1e9;
  {
    kvidx_stats st;
    r->held = kvidx_get_stats(ix, &st) == KVIDX_OK ? st.blocks : 0;
  }
  kvidx_destroy(ix);
  free(buf);
  r->checksum = cs, r->errors = errs;
}

/* REPS timed replays (replay_file_rep, queries timed), sorted by time: the
 * median one is [reps / 2].  Every repetition must give the same answers.
 * *query_secs: the median repetition's find_matches calls, summed. */
static frep_t *timed_reps(const efile_t *E, int kind, int event_buffers, int reps, kvidx_score *sc, size_t cap,
                          double *query_secs) {
  frep_t *rs = xcalloc((size_t)reps, sizeof *rs);
  uint64_t qns = 0;
  for (int i = 0; i < reps; i++) {
    rs[i].lat = xcalloc(E->nq + 1, sizeof *rs[i].lat);
    replay_file_rep(E, kind, event_buffers, 1, &rs[i], sc, cap);
    if (rs[i].checksum != rs[0].checksum) die("kvidx-%s: checksum differs between repetitions", kind_name(kind));
  }
  qsort(rs, (size_t)reps, sizeof *rs, cmp_frep);
  for (size_t i = 0; i < E->nq; i++) qns += rs[reps / 2].lat[i];
  *query_secs = (double)qns / 1e9;
  return rs;
}

static void free_reps(frep_t *rs, int reps) {
  for (int i = 0; i < reps; i++) free(rs[i].lat);
  free(rs);
}

/* --seq-floor: the worker seq tables' share of the event lines.  Every
 * design that keeps, per worker, a map from each held engine seq to its
 * position (kvidx, Dynamo's arena_c, the plain design of
 * ../shared/design/performance-facts.md) does this work on every S and R
 * line, whatever else it stores.  One repetition replays the file's S/R/C
 * lines (queries skipped) twice, into fresh state each time: through
 * kvidx, and through the seq tables alone, made and used by kvidx's own
 * map code the way kvidx__ix_store and kvidx__ix_remove use them (keys
 * hashed and their lines asked for KVIDX__AHEAD blocks ahead, the parent
 * looked up, room reserved, each new seq put / each removed seq deleted
 * with the table tidied after).  Both read each line from its own heap
 * buffer (materialise_events). */
static double seq_tables_rep(const efile_t *E, void **buf, size_t *held, size_t *tables, uint64_t *places) {
  kvidx *ix = make_default_index(KVIDX_POSITIONAL); /* its seed and allocator */
  kvidx__map *maps = xcalloc(E->nwid ? E->nwid : 1, sizeof *maps);
  unsigned char *live = xcalloc(E->nwid ? E->nwid : 1, 1);
  uint64_t homes[KVIDX__AHEAD], t0 = now_ns();
  for (size_t i = 0; i < E->nops; i++) {
    const op_t *op = &E->ops[i];
    kvidx__map *m = &maps[op->worker];
    kvidx__seqview sv;
    size_t n = op->n, j;
    if (op->type == OP_QUERY) {
      free(buf[i]);
      continue;
    }
    if (!live[op->worker]) {
      kvidx__map_init(m, 2, 1, 1, 0);
      m->seq = 1;
      live[op->worker] = 1;
    }
    if (op->type == OP_STORE) {
      const kvidx_block *b = (const kvidx_block *)buf[i];
      for (j = 0; j < n && j < KVIDX__AHEAD; j++) {
        homes[j] = kvidx__key_hash(ix->seed, &b[j].seq, 1);
        kvidx__map_prefetch(m, homes[j], 1);
      }
      if ((op->has_parent && kvidx__map_find(ix, m, &op->parent) == KVIDX__NONE) || !n)
        goto next; /* refused (kvidx: ENOPARENT) */
      if (kvidx__map_reserve(ix, m, n) != KVIDX_OK) die("seq-floor: out of memory");
      kvidx__seqview_of(&sv, m);
      for (j = 0; j < n; j++) {
        uint32_t free_at = KVIDX__NONE;
        uint64_t h = homes[j % KVIDX__AHEAD], e[2];
        if (j + KVIDX__AHEAD < n)
          kvidx__seqview_prefetch(&sv, homes[j % KVIDX__AHEAD] = kvidx__key_hash(ix->seed, &b[j + KVIDX__AHEAD].seq, 1), 1);
        if (kvidx__seqview_find(&sv, b[j].seq, h, &free_at) != KVIDX__NONE) continue; /* held */
        e[0] = b[j].seq;
        e[1] = KVIDX__POS(i & 0xFFFFFFu, j & 63u, 1u) | KVIDX__POS_TAG(h); /* a position word */
        kvidx__map_put_at(m, free_at, e, h);
      }
    } else if (op->type == OP_REMOVE) {
      const uint64_t *seq = (const uint64_t *)buf[i];
      if (!m->n) goto next;
      kvidx__seqview_of(&sv, m);
      for (j = 0; j < n && j < KVIDX__AHEAD; j++)
        kvidx__seqview_prefetch(&sv, homes[j] = kvidx__key_hash(ix->seed, &seq[j], 1), 2);
      for (j = 0; j < n; j++) {
        uint64_t h = homes[j % KVIDX__AHEAD];
        uint32_t at;
        if (j + KVIDX__AHEAD < n)
          kvidx__seqview_prefetch(&sv, homes[j % KVIDX__AHEAD] = kvidx__key_hash(ix->seed, &seq[j + KVIDX__AHEAD], 1), 2);
        if ((at = kvidx__seqview_find(&sv, seq[j], h, NULL)) != KVIDX__NONE) kvidx__seq_delete(ix, m, at);
      }
      kvidx__map_tidy(ix, m, kvidx__drain_step(m, n));
    } else {
      kvidx__map_drop(ix, m);
      live[op->worker] = 0;
    }
  next:
    free(buf[i]);
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  *held = *tables = 0;
  *places = 0;
  for (size_t w = 0; w < E->nwid; w++)
    if (live[w]) {
      const kvidx__mtab *t = kvidx__ld(&maps[w].tab);
      *held += maps[w].n;
      if (maps[w].n) ++*tables;
      if (t && t->mask + 1 > *places) *places = t->mask + 1;
      kvidx__map_drop(ix, &maps[w]);
    }
  free(maps);
  free(live);
  kvidx_destroy(ix);
  free(buf);
  return secs;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* What the machine gives for the same kind of access: `tables` tables of
 * `places` two-word places, half of them used, probed for random absent
 * keys (linear probing to a free place, as a put's probe), 20 keys on one
 * table then another table, each key's line asked for 8 keys ahead: ns per
 * probe, the median of 3 rounds of `ops` probes (no writes: a floor under
 * the seq tables' puts and deletions, which also write). */
static volatile uint64_t bare_probe_sink;
static double bare_probe_ns(size_t tables, uint64_t places, uint64_t ops) {
  enum { GROUP = 20, AHEAD = 8 };
  uint64_t **tab = xcalloc(tables, sizeof *tab), x = 0x9E3779B97F4A7C15ull, sum = 0, mask = places - 1;
  double ns[3];
  for (size_t t = 0; t < tables; t++) {
    tab[t] = xcalloc((size_t)places * 2, sizeof **tab);
    for (uint64_t i = 0; i < places; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      if (x & 1) tab[t][2 * i] = x, tab[t][2 * i + 1] = 1;
    }
  }
  for (int r = 0; r < 3; r++) {
    uint64_t t0 = now_ns();
    for (uint64_t o = 0; o < ops; o += GROUP) {
      uint64_t h[GROUP];
      const uint64_t *w = tab[kvidx__mix(o + (uint64_t)r) % tables];
      for (int j = 0; j < GROUP; j++) h[j] = kvidx__mix(o * GROUP + (uint64_t)j + ((uint64_t)r << 40));
      for (int j = 0; j < AHEAD; j++) KVIDX__PREFETCH(&w[2 * (h[j] & mask)]);
      for (int j = 0; j < GROUP; j++) {
        uint64_t i = h[j] & mask;
        if (j + AHEAD < GROUP) KVIDX__PREFETCH(&w[2 * (h[j + AHEAD] & mask)]);
        while (w[2 * i + 1] && w[2 * i] != h[j]) i = (i + 1) & mask;
        sum += i;
      }
    }
    ns[r] = (double)(now_ns() - t0) / (double)ops;
  }
  for (size_t t = 0; t < tables; t++) free(tab[t]);
  free(tab);
  qsort(ns, 3, sizeof *ns, cmp_dbl);
  bare_probe_sink = sum; /* the probes are not optimised out */
  return ns[1];
}

/* The machine's dependent-load latency over `bytes` of memory: one 8-byte
 * word per 64-byte line, the lines chained in one random cycle, each load's
 * address the value of the one before (a pointer chase, no prefetch can
 * help).  ns per load over up to 2^20 loads after 2^14 to warm up. */
static volatile uint64_t chase_sink;
static double chase_ns(size_t bytes) {
  size_t lines = bytes / 64 > 1024 ? bytes / 64 : 1024, steps = lines < ((size_t)1 << 20) ? lines : (size_t)1 << 20;
  uint64_t *mem = xcalloc(lines, 64), x = 0x2545F4914F6CDD1Dull, at = 0;
  uint32_t *order = xcalloc(lines, sizeof *order);
  for (size_t i = 0; i < lines; i++) order[i] = (uint32_t)i;
  for (size_t i = lines - 1; i > 0; i--) { /* Fisher-Yates: the cycle's order */
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t j = (size_t)(x % (i + 1));
    uint32_t t = order[i];
    order[i] = order[j], order[j] = t;
  }
  for (size_t i = 0; i < lines; i++) mem[(size_t)order[i] * 8] = (uint64_t)order[(i + 1) % lines] * 8;
  free(order);
  for (size_t i = 0; i < ((size_t)1 << 14); i++) at = mem[at];
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < steps; i++) at = mem[at];
  double ns = (double)(now_ns() - t0) / (double)steps;
  chase_sink = at;
  free(mem);
  return ns;
}

/* --replay FILE --walk-floor [--time REPS]: what the slowest queries do.
 * REPS timed replays run kvidx as built (the median repetition's
 * latencies, secs and query_secs, as --time); one more replays the file through the copy in
 * bench/walk_floor.c, whose walk counts each query's dependent steps:
 * child-map probes, and runs read (found by a probe, or named by the hint
 * of the run before).  Each step's address comes from the step before it,
 * so without prefetching ahead a query takes at least about its steps x
 * the machine's latency for a load that misses every cache (miss_ns: a
 * pointer chase over 64 MiB, or the index's peak if larger; the event
 * lines between two queries push even a small index out of cache).
 * Printed for the queries at or above p99 (the median latency and mean
 * counts of those: the slowest 1%) and for all (means). */
static int run_walk_floor(const efile_t *E, int kind, int reps, kvidx_score *sc, size_t cap) {
  const walk_floor_api *wf = walk_floor_copy();
  frep_t *rs;
  walk_count *wc = xcalloc(E->nq + 1, sizeof *wc);
  uint64_t *lat = xcalloc(E->nq + 1, sizeof *lat), *sorted = xcalloc(E->nq + 1, sizeof *sorted);
  uint64_t cs = 0, errs = 0;
  kvidx_config cfg;
  kvidx_stats st;
  kvidx *ix = NULL;
  size_t q = 0;
  double query_secs;
  if (kind == KVIDX_REFERENCE) die("--walk-floor: the reference kind has no walk");
  rs = timed_reps(E, kind, 1, reps, sc, cap, &query_secs);
  memcpy(lat, rs[reps / 2].lat, E->nq * sizeof *lat);
  memset(&cfg, 0, sizeof cfg);
  cfg.kind = kind;
  if (wf->create(&ix, &cfg) != KVIDX_OK) die("--walk-floor: the counting copy's kvidx_create failed");
  for (size_t i = 0; i < E->nops; i++) {
    const op_t *op = &E->ops[i];
    if (op->type == OP_QUERY) {
      size_t m = wf->find(ix, E->words + op->off, op->n, sc, cap, &wc[q++]);
      if (m > cap) m = cap;
      for (size_t j = 0; j < m; j++) cs += sc[j].depth;
    } else {
      errs += APPLY_EVENT_WITH(wf->store, wf->remove, wf->clear, ix, E, op, file_payload(E, op)) != KVIDX_OK;
    }
  }
  if (wf->stats(ix, &st) != KVIDX_OK) die("--walk-floor: kvidx_get_stats failed");
  wf->destroy(ix);
  if (cs != rs[0].checksum || errs != rs[0].errors)
    die("--walk-floor: the counting copy answered differently (checksum %" PRIu64 " vs %" PRIu64 ")", cs,
        rs[0].checksum);
  memcpy(sorted, lat, E->nq * sizeof *sorted);
  qsort(sorted, E->nq, sizeof *sorted, cmp_u64);
  uint64_t p50 = pct_permille(sorted, E->nq, 500), p99 = pct_permille(sorted, E->nq, 990);
  size_t chase_bytes = st.peak_bytes > ((size_t)64 << 20) ? st.peak_bytes : (size_t)64 << 20;
  double chase = chase_ns(chase_bytes);
  /* sums over [0] every query, [1] the queries at or above p99 (their
   * latency: the median, below; a preempted call would drag a mean) */
  double n[2] = {0, 0}, ns[2] = {0, 0}, probes[2] = {0, 0}, probed[2] = {0, 0}, hinted[2] = {0, 0}, blocks[2] = {0, 0};
  for (size_t i = 0; i < E->nq; i++)
    for (int k = 0; k < 2; k++) {
      if (k && lat[i] < p99) continue;
      n[k]++, ns[k] += k ? 0 : (double)lat[i], probes[k] += wc[i].probes, probed[k] += wc[i].runs_probed;
      hinted[k] += wc[i].runs_hinted, blocks[k] += (double)wc[i].blocks;
    }
  for (int k = 0; k < 2; k++)
    if (n[k]) ns[k] /= n[k], probes[k] /= n[k], probed[k] /= n[k], hinted[k] /= n[k], blocks[k] /= n[k];
  {
    size_t from = 0;
    while (from < E->nq && sorted[from] < p99) from++;
    ns[1] = from < E->nq ? (double)sorted[from + (E->nq - from) / 2] : 0;
  }
  double steps = probes[1] + probed[1] + hinted[1];
  printf("walk_floor backend=kvidx-%s queries=%zu p50_ns=%" PRIu64 " p99_ns=%" PRIu64 " index_peak_bytes=%zu"
         " miss_bytes=%zu miss_ns=%.1f slow_queries=%.0f slow_ns=%.0f slow_probes=%.2f slow_runs_probed=%.2f"
         " slow_runs_hinted=%.2f slow_blocks=%.1f slow_steps=%.2f slow_ns_per_step=%.1f"
         " slow_steps_x_miss_ns=%.0f all_ns=%.0f all_probes=%.2f all_runs_probed=%.2f all_runs_hinted=%.2f"
         " all_blocks=%.1f secs=%.4f query_secs=%.4f checksum=%" PRIu64 " apply_errors=%" PRIu64 "\n",
         kind_name(kind), E->nq, p50, p99, st.peak_bytes, chase_bytes, chase, n[1], ns[1], probes[1], probed[1], hinted[1],
         blocks[1], steps, steps > 0 ? ns[1] / steps : 0.0, steps * chase, ns[0], probes[0], probed[0], hinted[0],
         blocks[0], rs[reps / 2].secs, query_secs, cs, errs);
  free_reps(rs, reps);
  free(wc), free(lat), free(sorted);
  return errs != 0;
}

/* --replay FILE --seq-floor [--time REPS]: REPS repetitions, the two
 * replays alternating which goes first; medians and the median ratio. */
static int run_seq_floor(const efile_t *E, int kind, int reps) {
  double *ev = xcalloc((size_t)reps, sizeof *ev), *sq = xcalloc((size_t)reps, sizeof *sq);
  double *ratio = xcalloc((size_t)reps, sizeof *ratio);
  uint64_t errs = 0, sblocks = 0, rblocks = 0, places = 0, nparents = 0;
  size_t tables = 0;
  for (size_t i = 0; i < E->nops; i++) {
    if (E->ops[i].type == OP_STORE) sblocks += E->ops[i].n;
    if (E->ops[i].type == OP_REMOVE) rblocks += E->ops[i].n;
    nparents += E->ops[i].type == OP_STORE && E->ops[i].has_parent;
  }
  for (int r = 0; r < reps; r++) {
    size_t held_kvidx = 0, held_seqs = 0;
    for (int k = 0; k < 2; k++) {
      if ((r + k) & 1) {
        sq[r] = seq_tables_rep(E, materialise_events(E), &held_seqs, &tables, &places);
      } else { /* the same lines through kvidx, queries skipped */
        frep_t fr;
        memset(&fr, 0, sizeof fr);
        replay_file_rep(E, kind, 1, 0, &fr, NULL, 0);
        ev[r] = fr.secs;
        errs += fr.errors;
        held_kvidx = fr.held;
      }
    }
    /* the seq tables hold what the index holds: one entry per held seq */
    if (held_seqs != held_kvidx)
      die("seq-floor: the seq tables end with %zu entries, kvidx with %zu held blocks", held_seqs, held_kvidx);
    ratio[r] = ev[r] > 0 ? sq[r] / ev[r] : 0;
  }
  qsort(ev, (size_t)reps, sizeof *ev, cmp_dbl);
  qsort(sq, (size_t)reps, sizeof *sq, cmp_dbl);
  qsort(ratio, (size_t)reps, sizeof *ratio, cmp_dbl);
  /* seq operations: a probe per stored block, a lookup per parent, a probe
   * (and deletion) per removed block */
  uint64_t seq_ops = sblocks + rblocks + nparents;
  double bare = tables && places && seq_ops ? bare_probe_ns(tables, places, seq_ops) : 0;
  printf("seq_floor backend=kvidx-%s events=%zu stored_blocks=%" PRIu64 " removed_blocks=%" PRIu64
         " events_secs=%.4f seq_tables_secs=%.4f seq_share=%.3f seq_ops=%" PRIu64 " seq_ns_per_op=%.1f"
         " bare_tables=%zu bare_places=%" PRIu64 " bare_probe_ns=%.1f apply_errors=%" PRIu64 "\n",
         kind_name(kind), E->ne, sblocks, rblocks, ev[reps / 2], sq[reps / 2], ratio[reps / 2], seq_ops,
         seq_ops ? sq[reps / 2] * 1e9 / (double)seq_ops : 0.0, tables, places, bare, errs / (uint64_t)reps);
  free(ev);
  free(sq);
  free(ratio);
  return 0;
}

/* formats one query's answer as dynamo-replay does: worker:score, score desc,
 * worker asc, zero scores omitted */
static size_t format_scores(char **buf, size_t *cap, const kvidx_score *sc, size_t m) {
  size_t at = 0;
  reserve(buf, cap, m * 32 + 2, 1);
  for (size_t j = 0; j < m; j++) {
    if (!sc[j].depth) continue;
    at += (size_t)snprintf(*buf + at, *cap - at, "%s%" PRIu64 ":%u", at ? " " : "", sc[j].worker_id, sc[j].depth);
  }
  (*buf)[at] = 0;
  return at;
}

/* --order-bench N[,D]: the result ordering alone, on N scores of random
 * worker ids spread over D depths (1): the comparison merge sort against
 * the placement by order hints (kvidx__score_place), ns per call, median of
 * 7 rounds of 20,000 calls each.  The hints are the scores' ranks among
 * themselves, as in a fleet whose every live worker answered. */
static int run_order_bench(const opts_t *o) {
  enum { ROUNDS = 7, CALLS = 20000 };
  size_t n = o->order_n, i, j, r, c;
  kvidx_score base[KVIDX__SORT_BUF], a[KVIDX__SORT_BUF];
  uint16_t order[KVIDX__SORT_BUF];
  uint32_t took[2][ROUNDS];
  uint64_t x = 88172645463325252ull, sum = 0;
  if (n < 2 || n > KVIDX__SORT_BUF) die("--order-bench N: 2..%d", KVIDX__SORT_BUF);
  if (o->order_depths < 1 || o->order_depths > 8) die("--order-bench N,D: D in 1..8");
  for (i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    base[i].worker_id = x % 1000000;
    base[i].dp_rank = 0;
    base[i].depth = (uint32_t)(16 * (1 + (x >> 32) % o->order_depths));
  }
  for (i = 0; i < n; i++) {
    for (order[i] = 0, j = 0; j < n; j++)
      if (base[j].worker_id < base[i].worker_id || (base[j].worker_id == base[i].worker_id && j < i)) order[i]++;
    base[i].dp_rank = order[i]; /* equal random ids: ranks keep (id, rank) distinct */
  }
  memcpy(a, base, n * sizeof *a);
  kvidx__score_sort(a, n);
  {
    kvidx_score placed[KVIDX__SORT_BUF];
    memcpy(placed, base, n * sizeof *a);
    if (!kvidx__score_place(placed, n, order) || memcmp(placed, a, n * sizeof *a))
      die("order-bench: the placement differs from the merge sort");
  }
  for (r = 0; r < ROUNDS; r++)
    for (int way = 0; way < 2; way++) {
      uint64_t t0 = now_ns();
      for (c = 0; c < CALLS; c++) {
        memcpy(a, base, n * sizeof *a);
        if (way == 0) kvidx__score_sort(a, n);
        else if (!kvidx__score_place(a, n, order)) die("order-bench: the hints were refused");
        sum += a[c % n].worker_id;
      }
      took[way][r] = (uint32_t)((now_ns() - t0) / CALLS);
    }
  qsort(took[0], ROUNDS, sizeof took[0][0], cmp_u32);
  qsort(took[1], ROUNDS, sizeof took[1][0], cmp_u32);
  printf("order-bench scores=%zu depths=%zu merge_sort_ns=%u place_ns=%u (checksum %" PRIu64 ")\n", n, o->order_depths,
         took[0][ROUNDS / 2], took[1][ROUNDS / 2], sum);
  return 0;
}

/* --replay FILE [--kind K] [--time REPS | --expect ANSWERS] */
static int run_replay(const opts_t *o) {
  uint64_t t0 = now_ns();
  efile_t E;
  load_events(&E, o->replay);
  double tparse = (double)(now_ns() - t0) / 1e9;
  int kind = o->replay_kind;
  size_t cap = E.nwid ? E.nwid : 1;
  kvidx_score *sc = xcalloc(cap, sizeof *sc);
  char name[32];
  snprintf(name, sizeof name, "kvidx-%s%s", kind_name(kind), g_blocks_per_worker ? "-sized" : "");
  int fail = 0;
  if (o->seq_floor) {
    fail = run_seq_floor(&E, kind, o->replay_reps ? o->replay_reps : 5);
  } else if (o->walk_floor) {
    fail = run_walk_floor(&E, kind, o->replay_reps ? o->replay_reps : 5, sc, cap);
  } else if (o->replay_reps) {
    int reps = o->replay_reps;
    double query_secs;
    frep_t *rs = timed_reps(&E, kind, !o->no_event_buffers, reps, sc, cap, &query_secs);
    frep_t *med = &rs[reps / 2];
    qsort(med->lat, E.nq, sizeof *med->lat, cmp_u64);
    /* memory, from one more (untimed) replay: kvidx_get_stats after every
     * Stored event, taken where the most blocks are held */
    kvidx *ix = make_default_index(kind);
    kvidx_stats st, at_peak;
    memset(&at_peak, 0, sizeof at_peak);
    for (size_t i = 0; i < E.nops; i++) {
      const op_t *op = &E.ops[i];
      if (op->type == OP_QUERY) continue;
      (void)apply_file_event(ix, &E, op);
      if (op->type == OP_STORE && kvidx_get_stats(ix, &st) == KVIDX_OK && st.blocks > at_peak.blocks)
        at_peak = st;
    }
    memset(&st, 0, sizeof st);
    kvidx_get_stats(ix, &st);
    kvidx_destroy(ix);
    printf("backend=%s events=%zu queries=%zu block_ops=%" PRIu64 " secs=%.4f block_ops_per_s=%.0f p50_ns=%" PRIu64
           " p99_ns=%" PRIu64 " p999_ns=%" PRIu64 " checksum=%" PRIu64 " apply_errors=%" PRIu64
           " held_blocks_peak=%zu bytes_per_held_block=%.1f peak_bytes=%zu held_blocks_end=%zu bytes_end=%zu"
           " query_secs=%.4f\n",
           name, E.ne, E.nq, E.block_ops, med->secs, (double)E.block_ops / med->secs,
           pct_permille(med->lat, E.nq, 500), pct_permille(med->lat, E.nq, 990),
           pct_permille(med->lat, E.nq, 999), med->checksum, med->errors, at_peak.blocks,
           at_peak.blocks ? (double)at_peak.bytes / (double)at_peak.blocks : 0.0, st.peak_bytes, st.blocks,
           st.bytes, query_secs);
    fprintf(stderr, "kvidx-bench: backend=%s parse %.2fs, rep_secs(sorted)=[", name, tparse);
    for (int i = 0; i < reps; i++) fprintf(stderr, "%s%.4f", i ? "," : "", rs[i].secs);
    fprintf(stderr, "]; bytes_per_held_block = kvidx_get_stats().bytes / .blocks at the peak of held blocks\n");
    fail = med->errors != 0;
    free_reps(rs, reps);
  } else {
    /* answers: one line per Q, as dynamo-replay prints them; with --expect,
     * compared line by line against that file instead of printed */
    FILE *ex = NULL;
    if (o->expect) {
      ex = fopen(o->expect, "r");
      if (!ex) die("cannot open %s: %s", o->expect, strerror(errno));
    }
    kvidx *ix = make_default_index(kind);
    char *buf = NULL, *eline = NULL;
    size_t bcap = 0, ecap = 0, q = 0, differ = 0, shown = 0;
    uint64_t errs = 0, cs = 0;
    ewriter_t *w = ex ? NULL : xcalloc(1, sizeof *w);
    if (w) w->f = stdout;
    for (size_t i = 0; i < E.nops; i++) {
      const op_t *op = &E.ops[i];
      if (op->type != OP_QUERY) {
        errs += apply_file_event(ix, &E, op) != KVIDX_OK;
        continue;
      }
      size_t m = kvidx_find_matches(ix, E.words + op->off, op->n, sc, cap);
      if (m > cap) m = cap;
      for (size_t j = 0; j < m; j++) cs += sc[j].depth;
      size_t len = format_scores(&buf, &bcap, sc, m);
      if (w) {
        for (size_t j = 0; j < len; j++) ew_char(w, buf[j]);
        ew_char(w, '\n');
      } else {
        ssize_t el = getline(&eline, &ecap, ex);
        if (el < 0) die("%s: fewer lines than queries (%zu)", o->expect, q);
        while (el > 0 && (eline[el - 1] == '\n' || eline[el - 1] == '\r')) eline[--el] = 0;
        if (strcmp(eline, buf) != 0) {
          differ++;
          if (shown++ < 3)
            printf("  query #%zu (line %zu of %s) differs:\n    kvidx:    %.300s\n    expected: %.300s\n", q,
                   i + 1, o->replay, buf, eline);
        }
      }
      q++;
    }
    if (w) ew_flush(w), free(w);
    if (ex) {
      if (getline(&eline, &ecap, ex) >= 0) die("%s: more lines than queries (%zu)", o->expect, q);
      fclose(ex);
      printf("answers: backend=%s queries=%zu differ=%zu checksum=%" PRIu64 " apply_errors=%" PRIu64 " (vs %s)\n",
             name, q, differ, cs, errs, o->expect);
      fail = differ != 0;
    }
    fprintf(stderr, "kvidx-bench: backend=%s events=%zu queries=%zu apply_errors=%" PRIu64 " checksum=%" PRIu64 "\n",
            name, E.ne, E.nq, errs, cs);
    kvidx_destroy(ix);
    free(buf), free(eline);
    fail |= errs != 0;
  }
  free(sc);
  free_events(&E);
  return fail;
}

#if BENCH_HAVE_THREADS
/* ---- growth latency: one index from empty to N held blocks ----------------------
 * Synthetic stores (no removals) by many workers; every kvidx_store is timed
 * while reader threads query chains already stored.  Each query has a known
 * answer (the worker that stored the chain holds all of it, nothing is ever
 * removed), so the readers also count answers that miss it. */
typedef struct {
  kvidx *ix;
  const uint64_t *qlocals; /* len locals per store: the chain from the root */
  const uint64_t *qwid;    /* the worker that stored it */
  uint32_t len, cap;
  _Atomic size_t *published;
  atomic_int *stop;
  uint64_t rng;
  uint64_t nq, max_ns, eagain, wrong;
  uint32_t *lat;
  size_t nlat, caplat, seen;
} greader_t;

static void *greader_main(void *arg) {
  greader_t *r = arg;
  kvidx_score *sc = xcalloc(r->cap, sizeof *sc);
  while (!atomic_load_explicit(r->stop, memory_order_relaxed)) {
    size_t np = atomic_load_explicit(r->published, memory_order_acquire);
    if (!np) continue;
    size_t i = (size_t)(rng_next(&r->rng) % np);
    size_t total = 0;
    uint64_t a = now_ns();
    int rc = kvidx_find_matches_ex(r->ix, r->qlocals + i * r->len, r->len, sc, r->cap, &total);
    uint64_t dt = now_ns() - a;
    r->nq++;
    if (dt > r->max_ns) r->max_ns = dt;
    uint32_t d32 = dt > UINT32_MAX ? UINT32_MAX : (uint32_t)dt;
    if (r->nlat < r->caplat) r->lat[r->nlat++] = d32;
    else {
      uint64_t j = rng_next(&r->rng) % (r->seen + 1);
      if (j < r->caplat) r->lat[j] = d32; /* reservoir sample */
    }
    r->seen++;
    if (rc == KVIDX_EAGAIN) r->eagain++;
    int found = 0;
    size_t m = total < r->cap ? total : r->cap;
    for (size_t j = 0; j < m; j++)
      if (sc[j].worker_id == r->qwid[i] && sc[j].depth == r->len) found = 1;
    if (!found && rc == KVIDX_OK) r->wrong++;
  }
  free(sc);
  return NULL;
}

static int run_growth(const opts_t *o) {
  const uint32_t W = o->growth_workers, L = o->growth_len, P = L / 4, NPREFIX = 32;
  const size_t target = o->growth_blocks;
  int kind = o->replay_kind;
  if (W < 1 || W > BENCH_WORKERS_MAX || L < 2 || NPREFIX > 64) die("bad --growth-workers / --growth-len");
  /* pre-generate every store (outside any timing) */
  size_t maxstores = target / (L - P) + 2;
  kvidx_block *blk = xcalloc(maxstores * L, sizeof *blk);
  uint64_t *ql = xcalloc(maxstores * L, sizeof *ql), *qwid = xcalloc(maxstores, sizeof *qwid);
  uint32_t *soff = xcalloc(maxstores, sizeof *soff), *sn = xcalloc(maxstores, sizeof *sn);
  uint8_t *hasp = xcalloc(maxstores, 1);
  uint64_t *pseq = xcalloc(maxstores, sizeof *pseq);
  uint64_t *pref_local = xcalloc((size_t)NPREFIX * P + 1, sizeof *pref_local);
  uint64_t *held_mask = xcalloc(W, sizeof *held_mask);
  for (size_t i = 0; i < (size_t)NPREFIX * P; i++) pref_local[i] = mix64(0xA11CE + i);
  uint64_t rng = o->seed * 7919 + 3, uniq = 1;
  size_t ns = 0, held = 0, nb = 0;
  while (held < target) {
    uint32_t w = (uint32_t)(rng_next(&rng) % W);
    uint32_t p = (uint32_t)(rng_next(&rng) % NPREFIX);
    uint64_t *q = ql + ns * L, seq = 0;
    for (uint32_t j = 0; j < L; j++) {
      q[j] = j < P ? pref_local[(size_t)p * P + j] : mix64(0xB10C5000000000ULL + uniq++);
      seq = j ? kvidx_seq_hash_next(seq, q[j]) : q[j];
      blk[ns * L + j].local = q[j];
      blk[ns * L + j].seq = seq;
    }
    int have = (held_mask[w] >> p) & 1;
    held_mask[w] |= 1ull << p;
    soff[ns] = have ? P : 0; /* the worker holds the prefix: store the rest under it */
    sn[ns] = L - soff[ns];
    hasp[ns] = (uint8_t)have;
    pseq[ns] = have ? blk[ns * L + P - 1].seq : 0;
    qwid[ns] = 1000u + w;
    held += sn[ns];
    nb += sn[ns];
    ns++;
  }
  kvidx *ix = make_index_flags(kind, o->defer_free ? KVIDX_F_DEFER_FREE : 0);
  uint32_t *lat = xcalloc(ns, sizeof *lat);
  _Atomic size_t published = 0;
  atomic_int stop = 0;
  int nr = o->readers;
  greader_t *rs = xcalloc((size_t)(nr ? nr : 1), sizeof *rs);
  pthread_t *rt = xcalloc((size_t)(nr ? nr : 1), sizeof *rt);
  for (int i = 0; i < nr; i++) {
    rs[i].ix = ix, rs[i].qlocals = ql, rs[i].qwid = qwid, rs[i].len = L, rs[i].cap = W;
    rs[i].published = &published, rs[i].stop = &stop, rs[i].rng = 77u + (uint64_t)i;
    rs[i].caplat = 1u << 20;
    rs[i].lat = xcalloc(rs[i].caplat, sizeof *rs[i].lat);
    if (pthread_create(&rt[i], NULL, greader_main, &rs[i])) die("pthread_create failed");
  }
  /* the writer: this thread */
  uint64_t worst = 0, over1ms = 0, errs = 0;
  size_t worst_at = 0, cum = 0;
  const size_t seg = target / 8 ? target / 8 : 1;
  uint64_t segworst[9] = {0};
  uint64_t t0 = now_ns();
  uint64_t worst_cpu = 0, over1ms_cpu = 0, reclaim_worst = 0, reclaim_over1ms = 0, reclaim_calls = 0;
  size_t worst_cpu_at = 0, reclaimed = 0;
  for (size_t i = 0; i < ns; i++) {
    uint64_t c = thread_cpu_ns(), a = now_ns();
    int rc = kvidx_store(ix, qwid[i], 0, hasp[i] ? &pseq[i] : NULL, blk + i * L + soff[i], sn[i]);
    uint64_t dt = now_ns() - a, dc = thread_cpu_ns() - c;
    if (dc > worst_cpu) worst_cpu = dc, worst_cpu_at = cum;
    if (dc > 1000000) over1ms_cpu++;
    atomic_store_explicit(&published, i + 1, memory_order_release);
    errs += rc != KVIDX_OK;
    lat[i] = dt > UINT32_MAX ? UINT32_MAX : (uint32_t)dt;
    if (dt > worst) worst = dt, worst_at = cum;
    if (dt > 1000000) over1ms++;
    size_t sgi = cum / seg < 8 ? cum / seg : 8;
    if (dt > segworst[sgi]) segworst[sgi] = dt;
    cum += sn[i];
    if (o->defer_free) { /* a single-threaded router's pattern: reclaim between events */
      size_t got = 0;
      uint64_t r0 = now_ns();
      kvidx_reclaim(ix, &got);
      uint64_t rt0 = now_ns() - r0;
      if (got) {
        reclaim_calls++, reclaimed += got;
        if (rt0 > reclaim_worst) reclaim_worst = rt0;
        if (rt0 > 1000000) reclaim_over1ms++;
      }
    }
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  atomic_store(&stop, 1);
  uint64_t rq = 0, rmax = 0, reagain = 0, rwrong = 0;
  size_t tot = 0;
  for (int i = 0; i < nr; i++) {
    pthread_join(rt[i], NULL);
    rq += rs[i].nq, reagain += rs[i].eagain, rwrong += rs[i].wrong, tot += rs[i].nlat;
    if (rs[i].max_ns > rmax) rmax = rs[i].max_ns;
  }
  uint32_t *all = xcalloc(tot + 1, sizeof *all);
  size_t at = 0;
  for (int i = 0; i < nr; i++) memcpy(all + at, rs[i].lat, rs[i].nlat * sizeof *all), at += rs[i].nlat, free(rs[i].lat);
  qsort(all, tot, sizeof *all, cmp_u32);
  kvidx_stats st;
  memset(&st, 0, sizeof st);
  kvidx_get_stats(ix, &st);
  kvidx_destroy(ix);
  qsort(lat, ns, sizeof *lat, cmp_u32);
  printf("growth: kind=%s workers=%u store_blocks=%u(shared prefix %u) stores=%zu held_blocks=%zu secs=%.2f"
         " block_ops_per_s=%.0f store_worst_ns=%" PRIu64 " store_worst_at_held=%zu store_p999_ns=%.0f"
         " store_p99_ns=%.0f store_p50_ns=%.0f stores_over_1ms=%" PRIu64 " store_errors=%" PRIu64 "\n",
         kind_name(kind), W, L, P, ns, nb, secs, (double)nb / secs, worst, worst_at, pct(lat, ns, 0.999),
         pct(lat, ns, 0.99), pct(lat, ns, 0.5), over1ms, errs);
  printf("growth: store_worst_cpu_ns=%" PRIu64 " store_worst_cpu_at_held=%zu stores_over_1ms_cpu=%" PRIu64
         " (thread CPU time: without the time the writer was not running)\n",
         worst_cpu, worst_cpu_at, over1ms_cpu);
  if (o->defer_free)
    printf("growth: defer_free=1 reclaims_that_freed=%" PRIu64 " reclaimed_bytes=%zu reclaim_worst_ns=%" PRIu64
           " reclaims_over_1ms=%" PRIu64 " (kvidx_reclaim after each store, outside the store's timing)\n",
           reclaim_calls, reclaimed, reclaim_worst, reclaim_over1ms);
  printf("growth: readers=%d queries=%" PRIu64 " query_max_ns=%" PRIu64 " query_p999_ns=%.0f query_p99_ns=%.0f"
         " eagain=%" PRIu64 " wrong_answers=%" PRIu64 " bytes_per_held_block=%.1f peak_bytes=%zu\n",
         nr, rq, rmax, pct(all, tot, 0.999), pct(all, tot, 0.99), reagain, rwrong,
         st.blocks ? (double)st.bytes / (double)st.blocks : 0.0, st.peak_bytes);
  printf("growth: worst store per eighth of the growth (us):");
  for (int i = 0; i < 9; i++)
    if (segworst[i] || i < 8) printf(" %.0f", (double)segworst[i] / 1e3);
  printf("\n");
  free(all), free(rs), free(rt), free(lat), free(blk), free(ql), free(qwid), free(soff), free(sn);
  free(hasp), free(pseq), free(pref_local), free(held_mask);
  return errs != 0 || rwrong != 0;
}

/* ---- writer scaling: N writer threads on disjoint workers ----------------------- */
typedef struct {
  const bench_t *B;
  kvidx *ix;
  size_t *idx; /* its events (op indices), in stream order */
  size_t nidx;
  uint32_t *workers;
  size_t nworkers;
  atomic_int *go, *stop;
  uint64_t blockops, events, bad, cycles, t0, t1;
} swriter_t;

static void *swriter_main(void *arg) {
  swriter_t *w = arg;
  const bench_t *B = w->B;
  while (!atomic_load(w->go)) {
  }
  w->t0 = now_ns();
  for (;;) {
    /* a cycle: drop the workers' blocks, then replay their whole history */
    for (size_t k = 0; k < w->nworkers; k++)
      (void)kvidx_clear(w->ix, worker_id_of(B, w->workers[k]), dp_rank_of(B, w->workers[k]));
    w->events += w->nworkers;
    size_t i = 0;
    for (; i < w->nidx; i++) {
      const op_t *op = &B->ops[w->idx[i]];
      if (apply_event(w->ix, B, op) != KVIDX_OK) w->bad++;
      w->blockops += op->n;
      if ((i & 63) == 63 && atomic_load_explicit(w->stop, memory_order_relaxed)) break;
    }
    w->events += i;
    if (i < w->nidx) break;
    w->cycles++;
    if (atomic_load_explicit(w->stop, memory_order_relaxed)) break;
  }
  w->t1 = now_ns();
  return NULL;
}

static void swriters_init(const bench_t *B, kvidx *ix, swriter_t *ws, int nw, atomic_int *go, atomic_int *stop) {
  for (int i = 0; i < nw; i++) {
    memset(&ws[i], 0, sizeof ws[i]);
    ws[i].B = B, ws[i].ix = ix, ws[i].go = go, ws[i].stop = stop;
    ws[i].idx = xcalloc(B->nops, sizeof *ws[i].idx);
    ws[i].workers = xcalloc(B->K, sizeof *ws[i].workers);
    for (uint32_t k = (uint32_t)i; k < B->K; k += (uint32_t)nw) ws[i].workers[ws[i].nworkers++] = k;
    for (size_t j = 0; j < B->nops; j++)
      if (B->ops[j].type != OP_QUERY && B->ops[j].worker % (uint32_t)nw == (uint32_t)i) ws[i].idx[ws[i].nidx++] = j;
  }
}

/* runs nw writers and nr readers for `seconds`; readers' stats into *rq */
static void run_mixed(const bench_t *B, kvidx *ix, swriter_t *ws, int nw, int nr, double seconds, rstat_t *rq,
                      double *wtotal) {
  atomic_int go = 0, stop = 0;
  swriters_init(B, ix, ws, nw, &go, &stop);
  reader_t *rs = xcalloc((size_t)(nr ? nr : 1), sizeof *rs);
  pthread_t *rt = xcalloc((size_t)(nr ? nr : 1), sizeof *rt), *wt = xcalloc((size_t)(nw ? nw : 1), sizeof *wt);
  for (int i = 0; i < nr; i++) {
    rs[i].B = B, rs[i].ix = ix, rs[i].go = &go, rs[i].stop = &stop;
    rs[i].start = (B->n_queries / (size_t)nr) * (size_t)i;
    rs[i].caplat = 1u << 18;
    rs[i].lat = xcalloc(rs[i].caplat, sizeof *rs[i].lat);
    rs[i].rng = 99u + (uint64_t)i;
    if (pthread_create(&rt[i], NULL, reader_main, &rs[i])) die("pthread_create failed");
  }
  for (int i = 0; i < nw; i++)
    if (pthread_create(&wt[i], NULL, swriter_main, &ws[i])) die("pthread_create failed");
  atomic_store(&go, 1);
  struct timespec ts = {(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
  nanosleep(&ts, NULL);
  atomic_store(&stop, 1);
  for (int i = 0; i < nw; i++) pthread_join(wt[i], NULL);
  memset(rq, 0, sizeof *rq);
  size_t tot = 0;
  for (int i = 0; i < nr; i++) {
    pthread_join(rt[i], NULL);
    rq->nq += rs[i].nq, rq->bad += rs[i].bad, tot += rs[i].nlat;
    rq->q_s += (double)rs[i].nq / ((double)(rs[i].t1 - rs[i].t0) / 1e9);
  }
  uint32_t *all = xcalloc(tot + 1, sizeof *all);
  size_t at = 0;
  for (int i = 0; i < nr; i++) memcpy(all + at, rs[i].lat, rs[i].nlat * sizeof *all), at += rs[i].nlat, free(rs[i].lat);
  qsort(all, tot, sizeof *all, cmp_u32);
  rq->p50 = pct(all, tot, 0.5), rq->p99 = pct(all, tot, 0.99), rq->p999 = pct(all, tot, 0.999);
  uint64_t bo = 0, t0 = UINT64_MAX, t1 = 0;
  for (int i = 0; i < nw; i++) {
    bo += ws[i].blockops;
    if (ws[i].t0 < t0) t0 = ws[i].t0;
    if (ws[i].t1 > t1) t1 = ws[i].t1;
  }
  *wtotal = nw && t1 > t0 ? (double)bo / ((double)(t1 - t0) / 1e9) : 0;
  free(all), free(rs), free(rt), free(wt);
}

static void swriters_free(swriter_t *ws, int nw) {
  for (int i = 0; i < nw; i++) free(ws[i].idx), free(ws[i].workers);
}

static int run_scaling(const bench_t *B) {
  const opts_t *o = B->o;
  int kind = o->conc_kind, fail = 0;
  if (kind == KVIDX_REFERENCE) die("--scaling: the reference model allows no concurrency");
  char cfg[256];
  config_line(B, cfg, sizeof cfg);
  printf("scaling: kind=%s %s cores_online=%ld phase_secs=%.2f (default config except kind)\n", kind_name(kind),
         cfg, sysconf(_SC_NPROCESSORS_ONLN), o->conc_time);
  double one = 0;
  for (int s = 0; s < o->nscale; s++) {
    int nw = o->scale_writers[s];
    swriter_t *ws = xcalloc((size_t)nw, sizeof *ws);
    kvidx *ix = make_default_index(kind);
    rstat_t rq;
    double total;
    run_mixed(B, ix, ws, nw, 0, o->conc_time, &rq, &total);
    printf("scaling: writers=%d total_block_ops_per_s=%.0f per_thread=", nw, total);
    uint64_t bad = 0;
    for (int i = 0; i < nw; i++) {
      printf("%s%.0f", i ? "," : "", (double)ws[i].blockops / ((double)(ws[i].t1 - ws[i].t0) / 1e9));
      bad += ws[i].bad;
    }
    if (nw == 1) one = total;
    printf(" vs_1_writer=%.2f errors=%" PRIu64 "\n", one > 0 ? total / one : 0, bad);
    fail |= bad != 0;
    kvidx_destroy(ix);
    swriters_free(ws, nw);
    free(ws);
  }
  if (o->readers) {
    int nr = o->readers, nw = o->mixed_writers;
    kvidx *ix = make_default_index(kind);
    for (size_t i = 0; i < B->nops; i++)
      if (B->ops[i].type != OP_QUERY) (void)apply_event(ix, B, &B->ops[i]);
    rstat_t alone, mixed;
    double wt0, wt1;
    swriter_t *ws = xcalloc((size_t)(nw ? nw : 1), sizeof *ws);
    run_mixed(B, ix, ws, 0, nr, o->conc_time, &alone, &wt0);
    run_mixed(B, ix, ws, nw, nr, o->conc_time, &mixed, &wt1);
    printf("scaling: readers=%d alone_queries_per_s=%.0f alone_p99_ns=%.0f | with %d writer%s: queries_per_s=%.0f"
           " p99_ns=%.0f p999_ns=%.0f fraction_of_alone=%.2f writer_block_ops_per_s=%.0f bad_results=%" PRIu64 "\n",
           nr, alone.q_s, alone.p99, nw, nw == 1 ? "" : "s", mixed.q_s, mixed.p99, mixed.p999,
           alone.q_s > 0 ? mixed.q_s / alone.q_s : 0, wt1, alone.bad + mixed.bad);
    fail |= alone.bad + mixed.bad != 0;
    kvidx_destroy(ix);
    swriters_free(ws, nw);
    free(ws);
  }
  return fail;
}
#endif

/* ---- main ------------------------------------------------------------------------------- */
static void usage(void) {
  printf(
      "usage: kvidx-bench [options]\n"
      "workload:\n"
      "  --trace PATH        Mooncake-format JSONL trace, plain or .gz (default %s)\n"
      "  -W, --workers N     mock engine workers (16)\n"
      "  -C, --capacity N    blocks per worker LRU cache (2048)\n"
      "  -F, --length-factor N  blocks per trace hash id (1)\n"
      "  -D, --dup N         duplication: each worker's events replayed as N workers (1)\n"
      "  --dp-ranks N        dp ranks per worker id (1)\n"
      "  --collide RATE      fraction of blocks whose local hash collides with a pool (0)\n"
      "  --collide-pool N    size of that pool of colliding local hashes (64)\n"
      "  --block-tokens N    tokens hashed per block (32; tokens derive from the id)\n"
      "  --route random|kvidx  routing (random); kvidx = best match, minus load\n"
      "  --balance X         kvidx routing: weight of a worker's in-flight blocks (1)\n"
      "  --time-scale X      multiply request durations (1)\n"
      "  --max-requests N    first N requests only\n"
      "  --seed N            (1)\n"
      "replay:\n"
      "  --kinds LIST        comma list of radix,positional,reference (all)\n"
      "  --no-reference      skip the reference model\n"
      "  --ref-max-ops N     replay only the first N ops into reference (0 = all)\n"
      "  --jump N            positional jump size (library default)\n"
      "  --slots N           cfg.max_workers (default: the fleet size; 0 = library default 1024)\n"
      "  --min-time S        seconds of repetitions per kind and measure (1)\n"
      "  --writers N --readers M  concurrency mode (threads)\n"
      "  --conc-kind K       kind for the concurrency mode (positional)\n"
      "  --conc-time S       seconds per concurrency phase (1)\n"
      "  --sweep             offered-load sweep; --csv PATH (bench/results/sweep.csv), --png PATH\n"
      "  --sweep-step S      seconds of ops per sweep step (0.25)\n"
      "  --md PATH           append markdown results; --label TEXT heading\n"
      "  --demo              routing showcase: kvidx-guided vs random hit rate\n"
      "  -q, --quiet         no progress line\n",
      DEFAULT_TRACE);
  printf( /* two calls: one string literal of over 4,095 characters is not portable C */
      "event files (the format of ../shared/anchors/dynamo/README.md; see bench/README.md):\n"
      "  --write-events FILE write the mock engine's stream (S/R/C/Q lines) and exit\n"
      "  --opaque-seqs       with --write-events: every seq through a fixed bijection, as an engine\n"
      "                      with its own block hashes (vLLM, SGLang, TRT-LLM) publishes them\n"
      "  --replay FILE       replay an event file into a fresh default-config index;\n"
      "                      prints each query's worker:score line (as dynamo-replay)\n"
      "  --kind K            positional (default), radix or reference (--replay, --growth, --scaling)\n"
      "  --time REPS         with --replay: REPS timed replays, the median's key=value line\n"
      "  --no-event-buffers  with --time: apply payloads from the parsed file, not from a heap\n"
      "                      buffer per line freed after use (as dynamo-replay does; the default)\n"
      "  --expect ANSWERS    with --replay: compare each query's line to ANSWERS (exit 1 if any differ)\n"
      "  --blocks-per-worker N  cfg.blocks_per_worker = N in every index made (the engines' cache\n"
      "                      size: seq tables start with that room); --replay names it kvidx-K-sized\n"
      "  --seq-floor         with --replay [--time REPS (5)]: the S/R/C lines through kvidx and\n"
      "                      through the worker seq tables alone (kvidx's map code), medians\n"
      "  --walk-floor        with --replay [--time REPS (5)]: the slowest 1%% of queries' walk\n"
      "                      steps (child-map probes, runs read) beside the machine's\n"
      "                      latency for a load that misses every cache (miss_ns)\n"
      "growth and scaling (threads):\n"
      "  --growth            grow one index to --growth-blocks (4194304) held blocks by\n"
      "                      --growth-workers (256) workers, --growth-len (64) blocks per store,\n"
      "                      with --readers (1) querying; worst / p99.9 kvidx_store latency\n"
      "  --defer-free        with --growth: cfg.flags KVIDX_F_DEFER_FREE, kvidx_reclaim after\n"
      "                      each store (timed on its own)\n"
      "  --scaling           writer threads on disjoint workers (--scale-writers LIST, 1,2),\n"
      "                      then --readers (1) alone and with --mixed-writers (1) writers;\n"
      "                      --conc-time S per phase\n"
      "  --order-bench N[,D] result ordering alone: merge sort vs order-hint placement\n"
      "                      of N scores at D (1) depths, ns per call (median of 7)\n"
      "debugging:\n"
      "  --check-every N     kvidx__check after every N ops of the first pass\n"
      "  --dump-ops A[,B]    print ops A..B of the generated stream and exit\n"
      "exit status: 0 ok, 1 verification failed (kinds disagree, errors), 2 usage/IO\n");
}

static double num_arg(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) die("%s needs a value", argv[*i]);
  char *e;
  double v = strtod(argv[++*i], &e);
  if (*e || e == argv[*i] || !(v >= 0)) die("bad value for %s: %s", argv[*i - 1], argv[*i]);
  return v;
}
static const char *str_arg(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) die("%s needs a value", argv[*i]);
  return argv[++*i];
}

int main(int argc, char **argv) {
  opts_t o;
  memset(&o, 0, sizeof o);
  o.trace = DEFAULT_TRACE;
  o.slots = -1;
  o.W = 16, o.C = 2048, o.F = 1, o.D = 1, o.R = 1;
  o.collide_pool = 64, o.block_tokens = 32, o.seed = 1, o.balance = 1.0, o.time_scale = 1.0;
  o.min_time = 1.0, o.conc_time = 1.0, o.conc_kind = KVIDX_POSITIONAL, o.sweep_step = 0.25;
  o.csv = "bench/results/sweep.csv";
  o.kinds[0] = KVIDX_RADIX, o.kinds[1] = KVIDX_POSITIONAL, o.kinds[2] = KVIDX_REFERENCE, o.nkinds = 3;
  o.argc = argc, o.argv = argv;
  o.replay_kind = KVIDX_POSITIONAL;
  o.growth_blocks = 4u << 20, o.growth_workers = 256, o.growth_len = 64;
  o.scale_writers[0] = 1, o.scale_writers[1] = 2, o.nscale = 2, o.mixed_writers = 1;
  int no_ref = 0, readers_set = 0;
  for (int i = 1; i < argc; i++) readers_set |= !strcmp(argv[i], "--readers");
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
#define IS(s) (strcmp(a, s) == 0)
    if (IS("-h") || IS("--help")) { usage(); return 0; }
    else if (IS("--trace")) o.trace = str_arg(argc, argv, &i);
    else if (IS("-W") || IS("--workers")) o.W = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("-C") || IS("--capacity")) o.C = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("-F") || IS("--length-factor")) o.F = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("-D") || IS("--dup")) o.D = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("--dp-ranks")) o.R = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("--collide")) o.collide = num_arg(argc, argv, &i);
    else if (IS("--collide-pool")) o.collide_pool = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("--block-tokens")) o.block_tokens = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("--seed")) o.seed = (uint64_t)num_arg(argc, argv, &i);
    else if (IS("--route")) {
      const char *v = str_arg(argc, argv, &i);
      if (!strcmp(v, "kvidx")) o.route_kvidx = 1;
      else if (!strcmp(v, "random")) o.route_kvidx = 0;
      else die("--route random|kvidx");
    } else if (IS("--balance")) o.balance = num_arg(argc, argv, &i);
    else if (IS("--time-scale")) o.time_scale = num_arg(argc, argv, &i);
    else if (IS("--max-requests")) o.max_req = (size_t)num_arg(argc, argv, &i);
    else if (IS("--kinds")) {
      char buf[128];
      snprintf(buf, sizeof buf, "%s", str_arg(argc, argv, &i));
      o.nkinds = 0;
      for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        if (o.nkinds == 3) die("--kinds: at most three");
        o.kinds[o.nkinds++] = parse_kind(t);
      }
    } else if (IS("--no-reference")) no_ref = 1;
    else if (IS("--ref-max-ops")) o.ref_max_ops = (size_t)num_arg(argc, argv, &i);
    else if (IS("--jump")) o.jump = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("--slots")) o.slots = (int)num_arg(argc, argv, &i);
    else if (IS("--min-time")) o.min_time = num_arg(argc, argv, &i);
    else if (IS("--writers")) o.writers = (int)num_arg(argc, argv, &i);
    else if (IS("--readers")) o.readers = (int)num_arg(argc, argv, &i);
    else if (IS("--conc-kind")) o.conc_kind = parse_kind(str_arg(argc, argv, &i));
    else if (IS("--conc-time")) o.conc_time = num_arg(argc, argv, &i);
    else if (IS("--sweep")) o.sweep = 1;
    else if (IS("--sweep-step")) o.sweep_step = num_arg(argc, argv, &i);
    else if (IS("--csv")) o.csv = str_arg(argc, argv, &i);
    else if (IS("--png")) o.png = str_arg(argc, argv, &i);
    else if (IS("--md")) o.md = str_arg(argc, argv, &i);
    else if (IS("--label")) o.label = str_arg(argc, argv, &i);
    else if (IS("--demo")) o.demo = 1;
    else if (IS("--check-every")) o.check_every = (size_t)num_arg(argc, argv, &i);
    else if (IS("--dump-ops")) {
      const char *v = str_arg(argc, argv, &i);
      char *e;
      o.dump_from = (size_t)strtoull(v, &e, 10);
      o.dump_to = *e == ',' ? (size_t)strtoull(e + 1, NULL, 10) : o.dump_from;
      o.dump_to++;
    }
    else if (IS("--write-events")) o.write_events = str_arg(argc, argv, &i);
    else if (IS("--opaque-seqs")) o.opaque_seqs = 1;
    else if (IS("--replay")) o.replay = str_arg(argc, argv, &i);
    else if (IS("--no-event-buffers")) o.no_event_buffers = 1;
    else if (IS("--blocks-per-worker")) g_blocks_per_worker = (size_t)num_arg(argc, argv, &i);
    else if (IS("--seq-floor")) o.seq_floor = 1;
    else if (IS("--walk-floor")) o.walk_floor = 1;
    else if (IS("--kind")) o.replay_kind = o.conc_kind = parse_kind(str_arg(argc, argv, &i));
    else if (IS("--time")) {
      o.replay_reps = (int)num_arg(argc, argv, &i);
      if (o.replay_reps < 1 || o.replay_reps > 1000) die("--time REPS: 1..1000");
    } else if (IS("--expect")) o.expect = str_arg(argc, argv, &i);
    else if (IS("--growth")) o.growth = 1;
    else if (IS("--defer-free")) o.defer_free = 1;
    else if (IS("--order-bench")) {
      const char *v = str_arg(argc, argv, &i), *comma = strchr(v, ',');
      o.order_n = (size_t)strtoul(v, NULL, 10);
      o.order_depths = comma ? (size_t)strtoul(comma + 1, NULL, 10) : 1;
    }
    else if (IS("--growth-blocks")) o.growth_blocks = (size_t)num_arg(argc, argv, &i);
    else if (IS("--growth-workers")) o.growth_workers = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("--growth-len")) o.growth_len = (uint32_t)num_arg(argc, argv, &i);
    else if (IS("--scaling")) o.scaling = 1;
    else if (IS("--scale-writers")) {
      char buf[128];
      snprintf(buf, sizeof buf, "%s", str_arg(argc, argv, &i));
      o.nscale = 0;
      for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int v = atoi(t);
        if (o.nscale == 16 || v < 1 || v > 256) die("--scale-writers: up to 16 counts in 1..256");
        o.scale_writers[o.nscale++] = v;
      }
    } else if (IS("--mixed-writers")) o.mixed_writers = (int)num_arg(argc, argv, &i);
    else if (IS("-q") || IS("--quiet")) g_quiet = 1;
    else die("unknown option %s (see --help)", a);
#undef IS
  }
  if (!o.W || !o.C || !o.F || !o.D || !o.R || !o.block_tokens || !o.collide_pool)
    die("-W, -C, -F, -D, --dp-ranks, --block-tokens, --collide-pool must be >= 1");
  if (o.collide > 1) die("--collide is a fraction in [0, 1]");
  if (o.opaque_seqs && !o.write_events) die("--opaque-seqs: only with --write-events");
  if ((uint64_t)o.W * o.D > BENCH_WORKERS_MAX) die("W x D = %u exceeds KVIDX_WORKERS_MAX (%u)", o.W * o.D, BENCH_WORKERS_MAX);
  if (no_ref) {
    int n = 0;
    for (int i = 0; i < o.nkinds; i++)
      if (o.kinds[i] != KVIDX_REFERENCE) o.kinds[n++] = o.kinds[i];
    o.nkinds = n;
  }
  if (o.writers < 0 || o.readers < 0 || o.writers + o.readers > 256) die("bad --writers/--readers");
  if (o.replay) return run_replay(&o);
  if (o.order_n) return run_order_bench(&o);
  if ((o.growth || o.scaling) && !readers_set) o.readers = 1;
#if !BENCH_HAVE_THREADS
  if (o.writers || o.readers || o.growth || o.scaling)
    die("concurrency, --growth and --scaling need a build without KVIDX_NO_THREADS");
#else
  if (o.growth) return run_growth(&o);
#endif

  bench_t B;
  memset(&B, 0, sizeof B);
  B.o = &o;
  B.K = o.W * o.D;
  calibrate_timer();
  uint64_t t0 = now_ns();
  load_trace(&B.T, o.trace, o.max_req);
  double tload = (double)(now_ns() - t0) / 1e9;
  derive_blocks(&B);
  if (o.demo) return run_demo(&B);
  generate(&B);
  if (o.write_events) {
    write_events(&B, o.write_events);
    printf("wrote %s: %zu events, %zu queries, %" PRIu64 " block-ops (W=%u C=%u F=%u collide=%g, %zu requests)\n",
           o.write_events, B.n_events, B.n_queries, B.bo_query + B.bo_store + B.bo_remove, o.W, o.C, o.F,
           o.collide, B.T.nr);
    return 0;
  }
#if BENCH_HAVE_THREADS
  if (o.scaling) return run_scaling(&B);
#endif
  if (o.dump_to) {
    dump_ops(&B, o.dump_from, o.dump_to);
    return 0;
  }

  char cfg[256];
  config_line(&B, cfg, sizeof cfg);
  printf("kvidx-bench (kvidx %s)  %s\n", kvidx_version(), cfg);
  printf("trace: %s (parsed in %.2fs)\n", o.trace, tload);
  print_engine(&B, stdout, 0);
  FILE *md = open_md(&o);
  if (md) {
    fprintf(md, "\n### %s\n\n", o.label ? o.label : cfg);
    fprintf(md, "- config: %s\n- command: `", cfg);
    for (int i = 0; i < argc; i++)
      fprintf(md, strpbrk(argv[i], " ,();") ? "%s'%s'" : "%s%s", i ? " " : "", argv[i]);
    fprintf(md, "`\n");
    print_engine(&B, md, 1);
    fputc('\n', md);
  }
  size_t prefix_at = B.nops;
  int has_ref = 0;
  for (int i = 0; i < o.nkinds; i++) has_ref |= o.kinds[i] == KVIDX_REFERENCE;
  if (has_ref && o.ref_max_ops && o.ref_max_ops < B.nops) prefix_at = o.ref_max_ops;
  result_t res[3];
  for (int i = 0; i < o.nkinds; i++) {
    size_t limit = o.kinds[i] == KVIDX_REFERENCE ? prefix_at : B.nops;
    run_kind(&B, o.kinds[i], limit, prefix_at, &res[i]);
  }
  int fail = o.nkinds ? report(&B, res, o.nkinds, prefix_at, md) : 0;
  fflush(stdout);
#if BENCH_HAVE_THREADS
  if (o.writers || o.readers) fail |= run_concurrency(&B, md);
#endif
  if (o.sweep) run_sweep(&B, res, o.nkinds, md);
  if (md) fclose(md);
  for (int i = 0; i < o.nkinds; i++) free(res[i].lat), free(res[i].qh);
  free_ops(&B);
  free(B.locals), free(B.blocks), free(B.req_off), free(B.req_n);
  free(B.T.r), free(B.T.ids);
  return fail ? 1 : 0;
}
