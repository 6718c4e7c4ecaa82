/* vllm_decode.c - vLLM KV-event batches -> kvidx_apply (see vllm_decode.h).
 *
 * Input is untrusted: every msgpack length and count is checked against the
 * bytes left before anything is read or allocated (an element takes at least
 * one byte, so a count can never exceed the message size), nesting is
 * bounded, block_size is bounded and multiplied with an overflow check, and
 * scratch memory grows with the message, never with what it declares. */
#include "vllm_decode.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- bounded msgpack reader ---------------------------------------------- */
enum { MP_NIL, MP_BOOL, MP_UINT, MP_INT, MP_FLOAT, MP_STR, MP_BIN, MP_ARR, MP_MAP, MP_EXT };

typedef struct {
  const unsigned char *p, *end;
} mp;

typedef struct {
  int t;
  uint64_t u;          /* UINT, BOOL                      */
  int64_t i;           /* INT (negative)                  */
  const unsigned char *s; /* STR, BIN, EXT data           */
  uint32_t len;        /* STR/BIN/EXT bytes, ARR/MAP count */
} mpv;

static uint64_t be(const unsigned char *p, int n) {
  uint64_t v = 0;
  int i;
  for (i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

/* Reads one value's header: scalars and the bytes of STR/BIN/EXT are
 * consumed; for ARR/MAP the cursor stops at the first element. */
static int mp_head(mp *c, mpv *v) {
  size_t left;
  unsigned b;
  int n = 0; /* bytes of a following length / value */
  if (c->p >= c->end) return -1;
  b = *c->p++;
  left = (size_t)(c->end - c->p);
  memset(v, 0, sizeof *v);
  if (b <= 0x7f) { v->t = MP_UINT; v->u = b; return 0; }
  if (b >= 0xe0) { v->t = MP_INT; v->i = (int64_t)b - 256; return 0; }
  if ((b & 0xf0) == 0x80) { v->t = MP_MAP; v->len = b & 0x0f; goto container; }
  if ((b & 0xf0) == 0x90) { v->t = MP_ARR; v->len = b & 0x0f; goto container; }
  if ((b & 0xe0) == 0xa0) { v->t = MP_STR; v->len = b & 0x1f; goto bytes; }
  switch (b) {
  case 0xc0: v->t = MP_NIL; return 0;
  case 0xc2: case 0xc3: v->t = MP_BOOL; v->u = b & 1; return 0;
  case 0xc4: case 0xc5: case 0xc6:
    v->t = MP_BIN; n = 1 << (b - 0xc4); goto lenbytes;
  case 0xd9: case 0xda: case 0xdb:
    v->t = MP_STR; n = 1 << (b - 0xd9); goto lenbytes;
  case 0xca: case 0xcb:
    n = b == 0xca ? 4 : 8;
    if (left < (size_t)n) return -1;
    v->t = MP_FLOAT;
    c->p += n;
    return 0;
  case 0xcc: case 0xcd: case 0xce: case 0xcf:
    n = 1 << (b - 0xcc);
    if (left < (size_t)n) return -1;
    v->t = MP_UINT;
    v->u = be(c->p, n);
    c->p += n;
    return 0;
  case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
    uint64_t u;
    n = 1 << (b - 0xd0);
    if (left < (size_t)n) return -1;
    u = be(c->p, n);
    c->p += n;
    if (n < 8 && (u >> (8 * n - 1)) & 1) u |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    if ((int64_t)u >= 0) { v->t = MP_UINT; v->u = u; }
    else { v->t = MP_INT; v->i = (int64_t)u; }
    return 0;
  }
  case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: /* fixext */
    v->t = MP_EXT;
    v->len = 1u << (b - 0xd4);
    if (left < 1) return -1;
    c->p++; /* ext type */
    left--;
    goto bytes;
  case 0xc7: case 0xc8: case 0xc9:
    n = 1 << (b - 0xc7);
    if (left < (size_t)n + 1) return -1;
    v->t = MP_EXT;
    v->len = (uint32_t)be(c->p, n);
    c->p += n + 1;
    left -= (size_t)n + 1;
    goto bytes;
  case 0xdc: case 0xdd:
    n = b == 0xdc ? 2 : 4;
    if (left < (size_t)n) return -1;
    v->t = MP_ARR;
    v->len = (uint32_t)be(c->p, n);
    c->p += n;
    left -= (size_t)n;
    goto container;
  case 0xde: case 0xdf:
    n = b == 0xde ? 2 : 4;
    if (left < (size_t)n) return -1;
    v->t = MP_MAP;
    v->len = (uint32_t)be(c->p, n);
    c->p += n;
    left -= (size_t)n;
    goto container;
  default: return -1; /* 0xc1 (never used) */
  }
lenbytes:
  if (left < (size_t)n) return -1;
  v->len = (uint32_t)be(c->p, n);
  c->p += n;
  left -= (size_t)n;
bytes:
  if (v->len > left) return -1; /* declared longer than the message */
  v->s = c->p;
  c->p += v->len;
  return 0;
container:
  /* every element takes a byte at least: a count past the bytes left is a lie */
  if ((uint64_t)v->len * (v->t == MP_MAP ? 2u : 1u) > left) return -1;
  return 0;
}

/* Skips one whole value, without recursion. */
static int mp_skip(mp *c) {
  uint64_t todo = 1;
  while (todo) {
    mpv v;
    if (mp_head(c, &v)) return -1;
    todo--;
    if (v.t == MP_ARR) todo += v.len;
    else if (v.t == MP_MAP) todo += 2 * (uint64_t)v.len;
  }
  return 0;
}

static int mp_is_str(const mpv *v, const char *s) {
  size_t n = strlen(s);
  return v->t == MP_STR && v->len == n && memcmp(v->s, s, n) == 0;
}

/* Field `idx` of an array-encoded struct (events: idx 0 is the tag) or field
 * `name` of a map-encoded one, at `obj`.  1 found (*out at the value), 0
 * absent, -1 malformed. */
static int mp_field(mp obj, uint32_t idx, const char *name, mp *out) {
  mpv v;
  uint32_t i;
  if (mp_head(&obj, &v)) return -1;
  if (v.t == MP_ARR) {
    if (idx >= v.len) return 0;
    for (i = 0; i < idx; i++)
      if (mp_skip(&obj)) return -1;
    *out = obj;
    return 1;
  }
  if (v.t != MP_MAP) return -1;
  for (i = 0; i < v.len; i++) {
    mp at = obj;
    mpv k;
    if (mp_head(&obj, &k)) return -1;
    if (k.t == MP_STR) {
      if (mp_is_str(&k, name)) {
        *out = obj;
        return 1;
      }
    } else {
      obj = at;
      if (mp_skip(&obj)) return -1;
    }
    if (mp_skip(&obj)) return -1;
  }
  return 0;
}

/* A field's header: 1 present and not nil, 0 absent or nil, -1 malformed. */
static int get(mp obj, uint32_t idx, const char *name, mp *at, mpv *v) {
  mp c;
  int r = mp_field(obj, idx, name, &c);
  if (r <= 0) return r;
  if (at) *at = c;
  if (mp_head(&c, v)) return -1;
  return v->t == MP_NIL ? 0 : 1;
}

/* ---- scratch ------------------------------------------------------------- */
static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  size_t c = *cap ? *cap : 64;
  void *q;
  if (need <= *cap) return 0;
  while (c < need) {
    if (c > SIZE_MAX / 2 / elem) return -1;
    c *= 2;
  }
  q = realloc(*p, c * elem);
  if (!q) return -1;
  *p = q;
  *cap = c;
  return 0;
}
#define GROW(s, field, capf, need) grow((void **)&(s)->field, &(s)->capf, (need), sizeof *(s)->field)

static void logf_(vd_state *s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void logf_(vd_state *s, const char *fmt, ...) {
  char buf[256];
  va_list ap;
  if (!s->log) return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  s->log(s->log_ctx, buf);
}

/* ---- per (worker, dp rank) state: group kinds, offload block factors ------ */
#define VD_GROUPS 64
#define VD_MAX_WS 4096
struct vd_wstate {
  uint64_t wid;
  uint32_t dp;
  uint32_t factor[3];             /* per tier: device blocks per event block */
  unsigned char kind[VD_GROUPS];  /* 0 unknown, 1 kept, 2 skipped            */
};

static vd_wstate *wstate(vd_state *s, uint64_t wid, uint32_t dp) {
  size_t i;
  for (i = 0; i < s->ws_n; i++)
    if (s->ws[i].wid == wid && s->ws[i].dp == dp) return &s->ws[i];
  if (s->ws_n == VD_MAX_WS) return NULL; /* defaults from here on */
  i = s->ws_n++;
  memset(&s->ws[i], 0, sizeof s->ws[i]);
  s->ws[i].wid = wid;
  s->ws[i].dp = dp;
  s->ws[i].factor[0] = s->ws[i].factor[1] = s->ws[i].factor[2] = 1;
  return &s->ws[i];
}

static int full_attention(const mpv *kind) {
  return mp_is_str(kind, "full_attention") || mp_is_str(kind, "mla_attention") ||
         mp_is_str(kind, "sink_full_attention");
}

/* Keep this group?  g < 0: the event names none (a single group). */
static int keep_group(vd_state *s, vd_wstate *ws, int64_t g, const mpv *kind) {
  int keep;
  if (s->all_groups || g < 0) return 1;
  if (kind) {
    keep = full_attention(kind);
    if (ws && g < VD_GROUPS) ws->kind[g] = keep ? 1 : 2;
    return keep;
  }
  if (ws && g < VD_GROUPS && ws->kind[g]) return ws->kind[g] == 1;
  return g == 0; /* vLLM before kv_cache_spec_kind: group 0 only */
}

/* Engine hashes of different groups are kept apart: group g > 0 folds g in. */
static uint64_t gkey(uint64_t h, int64_t g) {
  return g > 0 ? kvidx_seq_hash_next(h, 0x6b76696478475250ull ^ (uint64_t)g) : h;
}

/* ---- identities: engine hash -> (local hash, parent) per worker ---------- */
struct vd_ident {
  uint64_t wid, key, local, parent;
  uint32_t dp;
  unsigned char used, tiers, has_parent, mark; /* mark: already in a list being built */
};

static size_t ihome(const vd_state *s, uint64_t wid, uint32_t dp, uint64_t key) {
  uint64_t h = kvidx_seq_hash_next(wid ^ ((uint64_t)dp << 40), key);
  return (size_t)h & (s->tab_cap - 1);
}

static vd_ident *ifind(const vd_state *s, uint64_t wid, uint32_t dp, uint64_t key) {
  size_t i;
  if (!s->tab_cap) return NULL;
  for (i = ihome(s, wid, dp, key); s->tab[i].used; i = (i + 1) & (s->tab_cap - 1))
    if (s->tab[i].key == key && s->tab[i].wid == wid && s->tab[i].dp == dp) return &s->tab[i];
  return NULL;
}

static void idel(vd_state *s, vd_ident *e) {
  size_t m = s->tab_cap - 1, i = (size_t)(e - s->tab), j;
  s->tab[i].used = 0;
  for (j = (i + 1) & m; s->tab[j].used; j = (j + 1) & m) {
    size_t h = ihome(s, s->tab[j].wid, s->tab[j].dp, s->tab[j].key);
    if (((j - h) & m) >= ((j - i) & m)) {
      s->tab[i] = s->tab[j];
      s->tab[j].used = 0;
      i = j;
    }
  }
  s->tab_n--;
}

static int irehash(vd_state *s, size_t cap, uint64_t drop_wid, uint32_t drop_dp, int drop) {
  vd_ident *old = s->tab, *t = calloc(cap, sizeof *t);
  size_t oc = s->tab_cap, i;
  if (!t) return -1;
  s->tab = t;
  s->tab_cap = cap;
  s->tab_n = 0;
  for (i = 0; i < oc; i++) {
    size_t j;
    if (!old[i].used || (drop && old[i].wid == drop_wid && old[i].dp == drop_dp)) continue;
    for (j = ihome(s, old[i].wid, old[i].dp, old[i].key); t[j].used; j = (j + 1) & (cap - 1)) {}
    t[j] = old[i];
    s->tab_n++;
  }
  free(old);
  return 0;
}

/* Finds or makes the identity; NULL when the bound is reached. */
static vd_ident *iput(vd_state *s, uint64_t wid, uint32_t dp, uint64_t key) {
  vd_ident *e = ifind(s, wid, dp, key);
  size_t i;
  if (e) return e;
  if (s->tab_n >= s->max_idents) {
    s->overflowed = 1;
    s->c.untracked++;
    return NULL;
  }
  if ((s->tab_n + 1) * 4 > s->tab_cap * 3 && irehash(s, s->tab_cap * 2, 0, 0, 0) != 0) {
    s->overflowed = 1;
    s->c.untracked++;
    return NULL;
  }
  for (i = ihome(s, wid, dp, key); s->tab[i].used; i = (i + 1) & (s->tab_cap - 1)) {}
  e = &s->tab[i];
  memset(e, 0, sizeof *e);
  e->used = 1;
  e->wid = wid;
  e->dp = dp;
  e->key = key;
  s->tab_n++;
  return e;
}

void vd_forget(vd_state *s, uint64_t wid, uint32_t dp) {
  size_t i, n = 0;
  for (i = 0; i < s->tab_cap; i++)
    if (s->tab[i].used && s->tab[i].wid == wid && s->tab[i].dp == dp) n++;
  if (n) irehash(s, s->tab_cap, wid, dp, 1);
}

static void learn(vd_state *s, uint64_t wid, uint32_t dp, const uint64_t *parent, const kvidx_block *b,
                  size_t n, int tier) {
  size_t i;
  for (i = 0; i < n; i++) {
    vd_ident *e = iput(s, wid, dp, b[i].seq);
    if (!e) continue;
    e->local = b[i].local;
    e->has_parent = i > 0 || parent != NULL;
    e->parent = i > 0 ? b[i - 1].seq : parent ? *parent : 0;
    e->tiers |= (unsigned char)(1u << tier);
  }
}

static void unlearn(vd_state *s, uint64_t wid, uint32_t dp, const uint64_t *keys, size_t n, int tier) {
  size_t i;
  for (i = 0; i < n; i++) {
    vd_ident *e = ifind(s, wid, dp, keys[i]);
    if (!e) continue;
    e->tiers &= (unsigned char)(tier == KVIDX_TIER_ALL ? 0 : ~(1u << tier));
    if (!e->tiers) idel(s, e);
  }
}

static int on_dump(void *ctx, const kvidx_event *ev) {
  vd_state *s = (vd_state *)ctx;
  if (ev->type == KVIDX_EV_STORED)
    learn(s, ev->worker_id, ev->dp_rank, ev->parent, ev->blocks, ev->n, ev->tier);
  else if (ev->type == KVIDX_EV_REMOVED)
    unlearn(s, ev->worker_id, ev->dp_rank, ev->seqs, ev->n, ev->tier);
  return 0;
}

int vd_check(const vd_state *s) {
  size_t i, n = 0;
  for (i = 0; i < s->tab_cap; i++) {
    const vd_ident *e = &s->tab[i];
    if (!e->used) continue;
    n++;
    if (!e->tiers || (e->tiers & ~7u) || e->mark || ifind(s, e->wid, e->dp, e->key) != e) return -1;
  }
  return n == s->tab_n && n <= s->max_idents && s->tab_n * 4 <= s->tab_cap * 3 + 4 ? 0 : -1;
}

int vd_rebuild(vd_state *s) { return kvidx_dump(s->ix, on_dump, s) == KVIDX_OK ? 0 : -1; }

/* ---- init ------------------------------------------------------------------ */
int vd_init(vd_state *s, kvidx *ix, size_t block_size, size_t max_idents) {
  memset(s, 0, sizeof *s);
  s->ix = ix;
  s->block_size = block_size;
  s->max_idents = max_idents ? max_idents : 1;
  s->offload_factor = 1;
  s->tab_cap = 1024;
  s->tab = calloc(s->tab_cap, sizeof *s->tab);
  s->ws = calloc(VD_MAX_WS, sizeof *s->ws);
  if (!s->tab || !s->ws || block_size == 0) {
    vd_free(s);
    return -1;
  }
  return 0;
}

void vd_free(vd_state *s) {
  free(s->tab);
  free(s->ws);
  free(s->tok);
  free(s->u64);
  free(s->u64b);
  free(s->blk);
  free(s->kbuf);
  free(s->name);
  memset(s, 0, sizeof *s);
}

/* ---- applying events with ids ------------------------------------------------ */
typedef struct {
  uint64_t wid, gen;
  uint32_t dp;
  vd_wstate *ws;
} batch_ctx;

static void count_status(vd_state *s, int rc) {
  if (rc == KVIDX_ENOPARENT) s->c.enoparent++;
  else if (rc == KVIDX_ENOENT) s->c.enoent++;
  else if (rc == KVIDX_EFULL) s->c.efull++;
  else if (rc < 0) s->c.errors++;
}

static void note(vd_state *s, int info, const kvidx_event *ev, uint64_t prev) {
  unsigned long long w = (unsigned long long)ev->worker_id;
  if (info == KVIDX_GAP) {
    uint64_t from = prev >> VD_EV_SHIFT, to = ev->event_id >> VD_EV_SHIFT;
    s->c.gaps++;
    logf_(s, "worker %llu dp %u: batch seq jumped from %llu to %llu (%llu batches lost): "
          "the index may be stale for this worker", w, ev->dp_rank, (unsigned long long)from,
          (unsigned long long)to, (unsigned long long)(to > from ? to - from - 1 : 0));
  } else if (info == KVIDX_RESTARTED) {
    s->c.restarts++;
    logf_(s, "worker %llu dp %u: publisher restarted (stream generation %llu, seq %llu): "
          "its old blocks were dropped", w, ev->dp_rank, (unsigned long long)ev->generation,
          (unsigned long long)(ev->event_id >> VD_EV_SHIFT));
  } else if (info == KVIDX_DUPLICATE) {
    s->c.duplicates++;
  }
}

/* An empty Removed with this id: uses the id up without changing holdings.
 * A batch's end marker jumps over the ids its events did not use: no gap. */
static int apply_noop(vd_state *s, const batch_ctx *b, uint64_t id) {
  kvidx_event ev;
  uint64_t prev = 0;
  int info;
  memset(&ev, 0, sizeof ev);
  ev.event_id = id;
  ev.worker_id = b->wid;
  ev.dp_rank = b->dp;
  ev.generation = b->gen;
  ev.type = KVIDX_EV_REMOVED;
  ev.tier = KVIDX_TIER_ALL;
  kvidx_last_event_id(s->ix, b->wid, b->dp, &prev);
  info = kvidx_apply(s->ix, &ev);
  if (info == KVIDX_GAP && (id & VD_EV_END) == VD_EV_END && prev + 1 >= (id & ~(uint64_t)VD_EV_END))
    info = KVIDX_OK;
  if (info < 0) count_status(s, info);
  else note(s, info, &ev, prev);
  return info;
}

/* Applies one event; a refused one still uses its id up (no false gap). */
static int apply_ev(vd_state *s, const batch_ctx *b, kvidx_event *ev) {
  uint64_t prev = 0, now = 0;
  int rc;
  ev->worker_id = b->wid;
  ev->dp_rank = b->dp;
  ev->generation = b->gen;
  kvidx_last_event_id(s->ix, b->wid, b->dp, &prev);
  rc = kvidx_apply(s->ix, ev);
  if (rc >= 0) {
    note(s, rc, ev, prev);
    return rc;
  }
  count_status(s, rc);
  if (!(kvidx_last_event_id(s->ix, b->wid, b->dp, &now) == KVIDX_OK && now == ev->event_id))
    apply_noop(s, b, ev->event_id);
  return rc;
}

static void malformed(vd_state *s, const batch_ctx *b, uint64_t id) {
  s->c.malformed++;
  apply_noop(s, b, id);
}

/* ---- field helpers ------------------------------------------------------------ */
/* An ExternalBlockHash: int, or bytes reduced to their last 8 (big endian). */
static int hash_of(const mpv *v, uint64_t *out) {
  uint32_t i;
  uint64_t h = 0;
  if (v->t == MP_UINT) { *out = v->u; return 0; }
  if (v->t == MP_INT) { *out = (uint64_t)v->i; return 0; }
  if ((v->t != MP_BIN && v->t != MP_STR) || v->len == 0) return -1;
  for (i = v->len > 8 ? v->len - 8 : 0; i < v->len; i++) h = (h << 8) | v->s[i];
  *out = h;
  return 0;
}

/* block_hashes into s->u64; count or -1. */
static long hashes_of(vd_state *s, mp ev, uint32_t idx) {
  mp c;
  mpv v;
  uint32_t i;
  if (mp_field(ev, idx, "block_hashes", &c) != 1 || mp_head(&c, &v) || v.t != MP_ARR) return -1;
  if (GROW(s, u64, u64_cap, (size_t)v.len + 1)) return -1;
  for (i = 0; i < v.len; i++) {
    mpv h;
    if (mp_head(&c, &h) || hash_of(&h, &s->u64[i])) return -1;
  }
  return (long)v.len;
}

/* medium: nil/absent = device; -1 when not a string. */
static int tier_of(mp ev, uint32_t idx) {
  mpv v;
  char name[32];
  uint32_t n;
  int r = get(ev, idx, "medium", NULL, &v);
  if (r < 0) return -1;
  if (r == 0) return KVIDX_TIER_DEVICE;
  if (v.t != MP_STR) return -1;
  n = v.len < sizeof name - 1 ? v.len : (uint32_t)sizeof name - 1;
  memcpy(name, v.s, n);
  name[n] = 0;
  return kvidx_tier_from_name(name);
}

/* group_idx (-1 none) and kv_cache_spec_kind (has_kind 0: none). */
static int group_of(mp ev, uint32_t gidx, uint32_t kidx, int64_t *g, mpv *kind, int *has_kind) {
  mpv v;
  int r = get(ev, gidx, "group_idx", NULL, &v);
  *g = -1;
  *has_kind = 0;
  if (r < 0) return -1;
  if (r == 1) {
    if (v.t != MP_UINT || v.u > 0x7fffffff) return -1;
    *g = (int64_t)v.u;
  }
  if (kidx) {
    r = get(ev, kidx, "kv_cache_spec_kind", NULL, kind);
    if (r < 0 || (r == 1 && kind->t != MP_STR)) return -1;
    *has_kind = r == 1;
  }
  return 0;
}

/* The base seed: lora_name (whole, any length), else lora_id (vLLM before
 * lora_name), else the base model's.  -1 malformed. */
static int seed_of(vd_state *s, mp ev, uint64_t *seed, mpv *lname) {
  mpv v;
  int r = get(ev, 7, "lora_name", NULL, lname);
  *seed = KVIDX_SEED;
  if (r < 0 || (r == 1 && lname->t != MP_STR)) return -1;
  if (r == 1 && lname->len > 0) {
    if (memchr(lname->s, 0, lname->len)) return -1;
    if (GROW(s, name, name_cap, (size_t)lname->len + 1)) return -1;
    memcpy(s->name, lname->s, lname->len);
    s->name[lname->len] = 0;
    *seed = kvidx_hash_seed(s->name, NULL);
    return 0;
  }
  lname->t = MP_NIL;
  r = get(ev, 5, "lora_id", NULL, &v);
  if (r < 0 || (r == 1 && v.t != MP_UINT)) return -1;
  if (r == 1 && v.u != 0) {
    char ns[40];
    snprintf(ns, sizeof ns, "vllm-lora-id:%llu", (unsigned long long)v.u);
    *seed = kvidx_hash_seed(NULL, ns);
  }
  return 0;
}

/* ---- extra keys: canonical bytes, folded into a block's seed -------------- */
static int kput(vd_state *s, size_t *n, const void *p, size_t len) {
  if (GROW(s, kbuf, kbuf_cap, *n + len + 4)) return -1;
  memcpy(s->kbuf + *n, p, len);
  *n += len;
  return 0;
}
static int kput_tag_u32(vd_state *s, size_t *n, char tag, uint32_t v) {
  unsigned char b[5];
  b[0] = (unsigned char)tag;
  b[1] = (unsigned char)v;
  b[2] = (unsigned char)(v >> 8);
  b[3] = (unsigned char)(v >> 16);
  b[4] = (unsigned char)(v >> 24);
  return kput(s, n, b, 5);
}
static int kput_int(vd_state *s, size_t *n, uint64_t v) {
  unsigned char b[9];
  int i;
  b[0] = 'i';
  for (i = 0; i < 8; i++) b[1 + i] = (unsigned char)(v >> (8 * i));
  return kput(s, n, b, 9);
}

/* One msgpack element of an extra-keys tuple, canonically. */
static int kenc(vd_state *s, mp *c, size_t *n, int depth) {
  mpv v;
  uint32_t i;
  if (depth > VD_MAX_DEPTH || mp_head(c, &v)) return -1;
  switch (v.t) {
  case MP_NIL: return kput(s, n, "n", 1);
  case MP_BOOL: return kput(s, n, v.u ? "T" : "F", 1);
  case MP_UINT: return kput_int(s, n, v.u);
  case MP_INT: return kput_int(s, n, (uint64_t)v.i);
  case MP_STR:
  case MP_BIN:
    return kput_tag_u32(s, n, v.t == MP_STR ? 's' : 'b', v.len) || kput(s, n, v.s, v.len);
  case MP_ARR:
    if (kput_tag_u32(s, n, 't', v.len)) return -1;
    for (i = 0; i < v.len; i++)
      if (kenc(s, c, n, depth + 1)) return -1;
    return 0;
  default: return -1; /* floats, maps, ext: not in vLLM's extra keys */
  }
}

/* XXH3-64 (seed 2) of the canonical bytes, zero-padded to 4 (kvidx hashes
 * u32 words little endian: the same bytes). */
static uint64_t kdigest(vd_state *s, size_t n) {
  size_t w = (n + 3) / 4, i;
  memset(s->kbuf + n, 0, w * 4 - n);
  if (GROW(s, tok, tok_cap, w + 1)) return 0;
  for (i = 0; i < w; i++)
    s->tok[i] = (uint32_t)s->kbuf[4 * i] | (uint32_t)s->kbuf[4 * i + 1] << 8 |
                (uint32_t)s->kbuf[4 * i + 2] << 16 | (uint32_t)s->kbuf[4 * i + 3] << 24;
  return kvidx_block_hash(s->tok, w, 2);
}

/* A block's extra keys (a msgpack array at c, or nil) -> seed offset; the
 * LoRA name, already in the seed, is left out.  1 folded, 0 nothing to fold,
 * -1 malformed. */
static int fold_extra(vd_state *s, mp c, const mpv *lname, uint64_t *out) {
  mpv v;
  size_t n = 0;
  uint32_t i, kept = 0;
  if (mp_head(&c, &v)) return -1;
  if (v.t == MP_NIL) return 0;
  if (v.t != MP_ARR) return -1;
  for (i = 0; i < v.len; i++) {
    mp at = c;
    mpv e;
    if (mp_head(&at, &e)) return -1;
    if (lname->t == MP_STR && e.t == MP_STR && e.len == lname->len && !memcmp(e.s, lname->s, e.len)) {
      c = at;
      continue;
    }
    if (kenc(s, &c, &n, 1)) return -1;
    kept++;
  }
  if (!kept) return 0;
  *out = kdigest(s, n);
  return 1;
}

/* ---- events ---------------------------------------------------------------- */
/* Clears the marks a walk over the chunks of hashes s->u64[0..n) set (an
 * offload store or a removal): the same walk, stopping at unmarked ones. */
static void unmark_chains(vd_state *s, const batch_ctx *b, int64_t g, long n, size_t factor) {
  size_t i, j;
  for (i = 0; i < (size_t)n; i++) {
    uint64_t key = gkey(s->u64[i], g);
    for (j = 0; j < factor; j++) {
      vd_ident *x = ifind(s, b->wid, b->dp, key);
      if (!x || !x->mark) break;
      x->mark = 0;
      if (!x->has_parent) break;
      key = x->parent;
    }
  }
}

/* CPU / disk copies the offloading connector reports without tokens: each
 * hash names the last device block of a chunk of `factor` device blocks;
 * identities come from the device-tier stores of the same hashes. */
static void on_offload(vd_state *s, const batch_ctx *b, uint64_t id, long n, int tier, int64_t g,
                       uint64_t bs) {
  size_t factor, total, k = 0, i, j;
  kvidx_event e;
  uint64_t parent = 0;
  int has_parent = 0, rc;
  if (bs == 0) factor = s->offload_factor; /* newest vLLM sends 0 */
  else if (bs % s->block_size == 0 && bs / s->block_size <= 4096) factor = (size_t)(bs / s->block_size);
  else { malformed(s, b, id); return; }
  if (factor == 0 || factor > 4096) { malformed(s, b, id); return; }
  if (b->ws) b->ws->factor[tier] = (uint32_t)factor;
  total = (size_t)n * factor;          /* n <= message bytes, factor <= 4096 */
  if (total > s->tab_n) {              /* cannot all be known blocks */
    s->c.unresolved += (unsigned long long)n;
    apply_noop(s, b, id);
    return;
  }
  if (GROW(s, blk, blk_cap, total + 1)) { s->c.errors++; apply_noop(s, b, id); return; }
  for (i = 0; i < (size_t)n; i++) {
    uint64_t key = gkey(s->u64[i], g);
    for (j = factor; j-- > 0;) { /* the chunk back to front */
      vd_ident *e2 = ifind(s, b->wid, b->dp, key);
      if (e2 && e2->mark) { /* a block twice (a cycle of parents): not one chain */
        s->c.unresolved += (unsigned long long)(n - (long)i);
        goto cut;
      }
      if (!e2) {
        s->c.unresolved += (unsigned long long)(n - (long)i);
        logf_(s, "worker %llu dp %u: offloaded block %016llx was never stored on the device: "
              "not indexed", (unsigned long long)b->wid, b->dp, (unsigned long long)key);
        goto cut;
      }
      s->blk[k + j].seq = key;
      s->blk[k + j].local = e2->local;
      e2->mark = 1;
      if (j == 0 && i == 0) {
        has_parent = e2->has_parent;
        parent = e2->parent;
      } else if (j == 0) {
        if (!e2->has_parent || e2->parent != s->blk[k - 1].seq) { /* not one chain */
          s->c.unresolved += (unsigned long long)(n - (long)i);
          goto cut;
        }
      }
      if (j > 0) {
        if (!e2->has_parent) { s->c.unresolved += (unsigned long long)(n - (long)i); goto cut; }
        key = e2->parent;
      }
    }
    k += factor;
  }
cut:
  unmark_chains(s, b, g, n, factor);
  memset(&e, 0, sizeof e);
  e.event_id = id;
  e.type = KVIDX_EV_STORED;
  e.tier = tier;
  e.parent = has_parent ? &parent : NULL;
  e.blocks = s->blk;
  e.n = k;
  if (k == 0) { apply_noop(s, b, id); return; }
  rc = apply_ev(s, b, &e);
  if (rc >= 0 && rc != KVIDX_DUPLICATE) {
    learn(s, b->wid, b->dp, e.parent, s->blk, k, tier);
    s->c.offloaded += k;
    s->c.stored += k;
  }
}

static void on_stored(vd_state *s, const batch_ctx *b, mp ev, uint64_t id) {
  mp tok_at, ek_at;
  mpv v, tv, kind, lname;
  int64_t g;
  int has_kind, tier, r, has_ek;
  uint64_t parent = 0, bs, seed, need;
  uint32_t ek_len = 0;
  long n;
  size_t i, k;
  kvidx_event e;

  if (group_of(ev, 9, 10, &g, &kind, &has_kind)) { malformed(s, b, id); return; }
  if (!keep_group(s, b->ws, g, has_kind ? &kind : NULL)) {
    s->c.skipped++;
    apply_noop(s, b, id);
    return;
  }
  n = hashes_of(s, ev, 1);
  tier = tier_of(ev, 6);
  if (n < 0 || tier < 0) { malformed(s, b, id); return; }
  r = get(ev, 2, "parent_block_hash", NULL, &v);
  if (r < 0 || (r == 1 && hash_of(&v, &parent))) { malformed(s, b, id); return; }
  if (r == 1) parent = gkey(parent, g);
  if (get(ev, 3, "token_ids", &tok_at, &tv) != 1 || tv.t != MP_ARR) { malformed(s, b, id); return; }
  if (get(ev, 4, "block_size", NULL, &v) != 1 || v.t != MP_UINT || v.u > VD_MAX_BLOCK_SIZE) {
    malformed(s, b, id);
    return;
  }
  bs = v.u;
  if (tv.len == 0 && tier != KVIDX_TIER_DEVICE && n > 0) { /* the offloading connector */
    on_offload(s, b, id, n, tier, g, bs);
    return;
  }
  if (bs == 0 || (n > 0 && bs > UINT64_MAX / (uint64_t)n)) { malformed(s, b, id); return; }
  need = (uint64_t)n * bs;
  if (tv.len < need) { malformed(s, b, id); return; } /* token_ids cover every block */
  if (bs != s->block_size) {
    static int warned;
    if (!warned) logf_(s, "event block_size %llu differs from --block-size %zu: queries will not match",
                       (unsigned long long)bs, s->block_size);
    warned = 1;
  }
  if (seed_of(s, ev, &seed, &lname)) { malformed(s, b, id); return; }
  r = get(ev, 8, "extra_keys", &ek_at, &v);
  if (r < 0 || (r == 1 && v.t != MP_ARR)) { malformed(s, b, id); return; }
  has_ek = r == 1;
  ek_len = has_ek ? v.len : 0;
  if (has_ek) { /* ek_at at the list header: step in */
    mpv h;
    if (mp_head(&ek_at, &h)) { malformed(s, b, id); return; }
  }
  if (GROW(s, blk, blk_cap, (size_t)n + 1) || GROW(s, u64b, u64b_cap, (size_t)need + 1)) {
    s->c.errors++;
    apply_noop(s, b, id);
    return;
  }
  { /* tokens (u64b as u32 storage is wasteful; keep them in u64b then pack) */
    mp c = tok_at;
    mpv h;
    mp_head(&c, &h);
    for (i = 0; i < (size_t)need; i++) {
      mpv t;
      if (mp_head(&c, &t) || t.t != MP_UINT || t.u > UINT32_MAX) { malformed(s, b, id); return; }
      s->u64b[i] = t.u;
    }
  }
  for (k = 0; k < (size_t)n; k++) {
    uint64_t bseed = seed, off;
    uint32_t tk[64], *tp = tk;
    if (has_ek && k < ek_len) {
      mp at = ek_at;
      int fr = fold_extra(s, at, &lname, &off);
      if (fr < 0 || mp_skip(&ek_at)) { malformed(s, b, id); return; }
      if (fr == 1) bseed += off;
    }
    if (bs > 64) {
      if (GROW(s, tok, tok_cap, (size_t)bs)) { s->c.errors++; apply_noop(s, b, id); return; }
      tp = s->tok;
    }
    for (i = 0; i < (size_t)bs; i++) tp[i] = (uint32_t)s->u64b[k * bs + i];
    s->blk[k].local = kvidx_block_hash(tp, (size_t)bs, bseed);
    s->blk[k].seq = gkey(s->u64[k], g);
  }
  memset(&e, 0, sizeof e);
  e.event_id = id;
  e.type = KVIDX_EV_STORED;
  e.tier = tier;
  e.parent = get(ev, 2, "parent_block_hash", NULL, &v) == 1 ? &parent : NULL;
  e.blocks = s->blk;
  e.n = (size_t)n;
  r = apply_ev(s, b, &e);
  if (r >= 0 && r != KVIDX_DUPLICATE) {
    learn(s, b->wid, b->dp, e.parent, s->blk, (size_t)n, tier);
    s->c.stored += (unsigned long long)n;
  } else if (r < 0) {
    logf_(s, "store worker %llu dp %u (%ld blocks, tier %d): %s", (unsigned long long)b->wid, b->dp, n,
          tier, kvidx_strerror(r));
  }
}

static void on_removed(vd_state *s, const batch_ctx *b, mp ev, uint64_t id) {
  int64_t g;
  mpv kind;
  int has_kind, tier, rc;
  long n;
  size_t i, j, k = 0, factor = 1;
  kvidx_event e;
  if (group_of(ev, 3, 0, &g, &kind, &has_kind)) { malformed(s, b, id); return; }
  /* Removed names no kind: skip groups learned as skipped; for the others
   * only hashes stored as kept blocks are removed (identities), so an
   * unknown group is harmless */
  if (!s->all_groups && g >= 0 && b->ws && g < VD_GROUPS && b->ws->kind[g] == 2) {
    s->c.skipped++;
    apply_noop(s, b, id);
    return;
  }
  n = hashes_of(s, ev, 1);
  tier = tier_of(ev, 2);
  if (n < 0 || tier < 0) { malformed(s, b, id); return; }
  if (b->ws && tier != KVIDX_TIER_DEVICE) factor = b->ws->factor[tier];
  if (GROW(s, u64b, u64b_cap, (size_t)n * factor + 1)) { s->c.errors++; apply_noop(s, b, id); return; }
  /* only copies the index holds: an unknown hash would refuse the whole event */
  for (i = 0; i < (size_t)n; i++) {
    uint64_t key = gkey(s->u64[i], g);
    for (j = 0; j < factor; j++) {
      vd_ident *x = ifind(s, b->wid, b->dp, key);
      if (!x) {
        if (j == 0 && s->overflowed) s->u64b[k++] = key;
        break;
      }
      if (x->mark) break; /* listed already: a seq twice would refuse the event */
      x->mark = 1;
      if (x->tiers & (1u << tier)) s->u64b[k++] = key;
      if (!x->has_parent) break;
      key = x->parent;
    }
  }
  unmark_chains(s, b, g, n, factor);
  memset(&e, 0, sizeof e);
  e.event_id = id;
  e.type = KVIDX_EV_REMOVED;
  e.tier = tier; /* this medium's copy only */
  e.seqs = s->u64b;
  e.n = k;
  rc = apply_ev(s, b, &e);
  if ((rc >= 0 && rc != KVIDX_DUPLICATE) || rc == KVIDX_ENOENT) { /* ENOENT: the held ones went */
    unlearn(s, b->wid, b->dp, s->u64b, k, tier);
    s->c.removed += k;
  }
}

static void on_event(vd_state *s, const batch_ctx *b, mp ev, uint64_t id) {
  mpv tag, v;
  mp c = ev;
  int have = 0;
  s->c.events++;
  if (mp_head(&c, &v) == 0) {
    if (v.t == MP_ARR && v.len > 0) have = mp_head(&c, &tag) == 0;
    else if (v.t == MP_MAP) have = get(ev, 0, "type", NULL, &tag) == 1;
  }
  if (have && mp_is_str(&tag, "BlockStored")) {
    on_stored(s, b, ev, id);
  } else if (have && mp_is_str(&tag, "BlockRemoved")) {
    on_removed(s, b, ev, id);
  } else if (have && mp_is_str(&tag, "AllBlocksCleared")) {
    kvidx_event e;
    int rc;
    memset(&e, 0, sizeof e);
    e.event_id = id;
    e.type = KVIDX_EV_CLEARED;
    rc = apply_ev(s, b, &e);
    if (rc >= 0 && rc != KVIDX_DUPLICATE) {
      vd_forget(s, b->wid, b->dp);
      s->c.cleared++;
    }
  } else {
    if (have && tag.t == MP_STR) s->c.ignored++; /* an event kind from a newer vLLM */
    else s->c.malformed++;
    apply_noop(s, b, id);
  }
}

/* ---- batches ------------------------------------------------------------------ */
/* root, events array and dp rank of a payload; -1 malformed. */
static int batch_parts(const unsigned char *p, size_t len, mp *events, uint32_t *dp) {
  mp root = {p, p + len}, c;
  mpv v;
  int r;
  if (len == 0 || len > VD_MAX_MSG) return -1;
  c = root;
  if (mp_head(&c, &v) || (v.t != MP_ARR && v.t != MP_MAP)) return -1;
  if (get(root, 1, "events", events, &v) != 1 || v.t != MP_ARR) return -1;
  *dp = 0;
  r = get(root, 2, "data_parallel_rank", NULL, &v);
  if (r < 0 || (r == 1 && (v.t != MP_UINT || v.u > UINT32_MAX))) return -1;
  if (r == 1) *dp = (uint32_t)v.u;
  /* the whole payload must be one well-formed value */
  c = root;
  if (mp_skip(&c) || c.p != root.end) return -1;
  return 0;
}

long vd_batch_dp(const unsigned char *p, size_t len) {
  mp events;
  uint32_t dp;
  return batch_parts(p, len, &events, &dp) ? -1 : (long)dp;
}

int vd_batch(vd_state *s, const unsigned char *p, size_t len, uint64_t seq, uint64_t wid, int fresh) {
  mp events;
  mpv v;
  batch_ctx b;
  uint64_t last = 0, gen = 0;
  uint32_t i;
  if (seq >= VD_MAX_SEQ || batch_parts(p, len, &events, &b.dp)) {
    s->c.malformed++;
    return -1;
  }
  b.wid = wid;
  b.ws = wstate(s, wid, b.dp);
  if (kvidx_last_event_id(s->ix, wid, b.dp, &last) == KVIDX_OK &&
      kvidx_last_event_gen(s->ix, wid, b.dp, &gen) == KVIDX_OK) {
    uint64_t lseq = last >> VD_EV_SHIFT;
    if ((seq == 0 && lseq > 0) || (fresh && seq < lseq)) {
      gen++; /* the publisher restarted: a new stream */
      vd_forget(s, wid, b.dp);
    } else if (seq < lseq || (seq == lseq && (last & VD_EV_END) == VD_EV_END)) {
      s->c.batches++;
      s->c.duplicates++; /* delivered before */
      return 1;
    }
  }
  b.gen = gen;
  s->c.batches++;
  mp_head(&events, &v);
  for (i = 0; i < v.len; i++) {
    mp at = events;
    if (i >= VD_EV_END) { /* more events than ids per batch */
      s->c.malformed += v.len - i;
      break;
    }
    on_event(s, &b, at, ((uint64_t)seq << VD_EV_SHIFT) | i);
    if (mp_skip(&events)) break; /* cannot happen: batch_parts walked it */
  }
  apply_noop(s, &b, ((uint64_t)seq << VD_EV_SHIFT) | VD_EV_END);
  return 0;
}

/* ---- queries ------------------------------------------------------------------ */
size_t vd_query_locals(vd_state *s, const uint32_t *tok, size_t n, const vd_query *q, uint64_t *out) {
  uint64_t seed = KVIDX_SEED;
  size_t nb = n / s->block_size, i, m;
  if (q->lora_name && *q->lora_name) {
    seed = kvidx_hash_seed(q->lora_name, NULL);
  } else if (q->has_lora_id && q->lora_id) {
    char ns[40];
    snprintf(ns, sizeof ns, "vllm-lora-id:%llu", (unsigned long long)q->lora_id);
    seed = kvidx_hash_seed(NULL, ns);
  }
  for (i = 0; i < nb; i++) {
    uint64_t start = (uint64_t)i * s->block_size, end = start + s->block_size, bseed = seed;
    size_t kn = 0;
    int any = 0;
    /* vLLM's order: LoRA name (left out), mm items, cache salt, prompt embeds */
    for (m = 0; m < q->n_mm; m++) {
      const vd_mm *x = &q->mm[m];
      size_t il = strlen(x->id);
      if (end > x->offset && start < x->offset + x->length) {
        if (kput_tag_u32(s, &kn, 't', 2) || kput_tag_u32(s, &kn, 's', (uint32_t)il) ||
            kput(s, &kn, x->id, il) || kput_int(s, &kn, x->offset - start))
          return 0;
        any = 1;
      }
    }
    if (i == 0 && q->salt) {
      size_t sl = strlen(q->salt);
      if (kput_tag_u32(s, &kn, 's', (uint32_t)sl) || kput(s, &kn, q->salt, sl)) return 0;
      any = 1;
    }
    if (i < q->n_pe && q->pe[i]) {
      if (kput_tag_u32(s, &kn, 'b', 32) || kput(s, &kn, q->pe[i], 32)) return 0;
      any = 1;
    }
    if (any) bseed += kdigest(s, kn);
    out[i] = kvidx_block_hash(tok + start, s->block_size, bseed);
  }
  return nb;
}
