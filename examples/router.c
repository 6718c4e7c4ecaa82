/* router.c - KV-aware routing over a simulated fleet, with a cost model like
 * NVIDIA Dynamo's KV router.
 *
 * For a request of R blocks and each worker w:
 *     overlap(w)  = leading blocks of the prompt w already caches (kvidx)
 *     prefill(w)  = R - overlap(w)             blocks w would have to compute
 *     load(w)     = KV blocks of w's requests still in flight
 *     cost(w)     = overlap_weight * prefill(w) + load(w)
 * Temperature 0 picks the cheapest worker (ties broken by a seeded generator);
 * temperature T > 0 samples from softmax(-(cost - min) / (max - min) / T),
 * Dynamo's normalized softmax, with the same seeded generator, so a run is
 * reproducible.  The overlap credit is the blocks a worker does not prefill:
 * a larger overlap_weight favours cache hits over balance.
 *
 * The fleet: N workers with a fixed KV cache each (LRU eviction, emitting
 * Removed events), multi-turn conversations over a few shared system
 * prompts, one arrival per tick, each request in flight for a few ticks.
 * Every policy sees the same request stream; the program checks at each
 * request that kvidx's overlap equals the simulator's ground truth.
 *
 *   build/examples/router                       compare policies
 *   build/examples/router --temperature 0.5 --seed 7 --requests 300
 *                         --workers 4 --overlap-weight 1.0 --verbose
 */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  BLOCK = 16,         /* tokens per block                                */
  MAX_WORKERS = 16,
  CACHE_BLOCKS = 160, /* KV cache size of each worker, in blocks         */
  N_TEMPLATES = 4,    /* shared system prompts                           */
  TEMPLATE_BLOCKS = 8,
  N_CONVS = 24,       /* conversations (each grows turn by turn)         */
  MAX_REQ_BLOCKS = 48,
  MAX_TOKENS = MAX_REQ_BLOCKS * BLOCK + BLOCK,
  MAX_REQUESTS = 5000,
  MAX_INFLIGHT = 64
};

/* ---- seeded generator (splitmix64) --------------------------------------- */
static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { /* [0, 1) */
  return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}
static uint32_t rng_below(uint64_t *s, uint32_t n) {
  return (uint32_t)(rng_next(s) % n);
}

/* ---- the request stream ---------------------------------------------------- */
typedef struct {
  size_t n_tokens;
  uint32_t tokens[MAX_TOKENS];
  uint32_t duration; /* ticks in flight */
} request;

static request g_req[MAX_REQUESTS];

static void make_requests(size_t n_req, uint64_t seed) {
  static uint32_t conv[N_CONVS][MAX_TOKENS];
  static size_t conv_len[N_CONVS];
  uint64_t s = seed;
  size_t r, c, i;
  for (c = 0; c < N_CONVS; c++) conv_len[c] = 0;
  for (r = 0; r < n_req; r++) {
    request *q = &g_req[r];
    size_t add;
    /* Skewed choice: low-numbered conversations are busier. */
    c = rng_below(&s, N_CONVS);
    if (rng_unit(&s) < 0.5) c /= 3;
    if (conv_len[c] == 0 || conv_len[c] + 4 * BLOCK > MAX_REQ_BLOCKS * BLOCK) {
      uint32_t t = (uint32_t)(c % N_TEMPLATES); /* new conversation */
      for (i = 0; i < TEMPLATE_BLOCKS * BLOCK; i++)
        conv[c][i] = 1000u * (t + 1) + (uint32_t)i;
      conv_len[c] = TEMPLATE_BLOCKS * BLOCK;
    }
    add = BLOCK + rng_below(&s, 3 * BLOCK); /* the new user turn */
    for (i = 0; i < add; i++)
      conv[c][conv_len[c] + i] = 50000u + rng_below(&s, 30000);
    conv_len[c] += add;
    q->n_tokens = conv_len[c];
    memcpy(q->tokens, conv[c], conv_len[c] * sizeof(uint32_t));
    q->duration = 4 + rng_below(&s, 9);
  }
}

/* ---- a simulated worker: LRU block cache + in-flight requests -------------- */
typedef struct {
  uint64_t seq[CACHE_BLOCKS + MAX_REQ_BLOCKS];
  uint64_t used[CACHE_BLOCKS + MAX_REQ_BLOCKS]; /* last tick used         */
  uint32_t pos[CACHE_BLOCKS + MAX_REQ_BLOCKS];  /* position in its prompt */
  size_t n;
  uint32_t inflight_blocks[MAX_INFLIGHT], inflight_left[MAX_INFLIGHT];
  size_t n_inflight;
  size_t requests;
} worker;

static long cache_find(const worker *w, uint64_t seq) {
  size_t i;
  for (i = 0; i < w->n; i++)
    if (w->seq[i] == seq) return (long)i;
  return -1;
}
static uint32_t worker_load(const worker *w) {
  uint32_t l = 0;
  size_t i;
  for (i = 0; i < w->n_inflight; i++) l += w->inflight_blocks[i];
  return l;
}
/* Ground truth: leading blocks of the prompt the worker caches. */
static uint32_t true_overlap(const worker *w, const uint64_t *seq, size_t n) {
  uint32_t k = 0;
  while (k < n && cache_find(w, seq[k]) >= 0) k++;
  return k;
}

typedef struct {
  const char *name;
  int kind;       /* 0 kv-aware, 1 least-loaded, 2 random */
  double temperature;
} policy;

typedef struct {
  size_t prompt_blocks, cached_blocks, removed, mismatches;
  uint32_t peak_load;
  size_t per_worker[MAX_WORKERS];
} result;

static int g_verbose;

static int fail(const char *what, int rc) {
  fprintf(stderr, "router: %s: %s\n", what, kvidx_strerror(rc));
  return rc;
}

/* Picks a worker from the costs with the seeded generator. */
static size_t pick(const double *cost, size_t nw, double temperature,
                   uint64_t *rng) {
  double lo = cost[0], hi = cost[0], p[MAX_WORKERS], sum = 0, u;
  size_t i, ties[MAX_WORKERS], nt = 0;
  for (i = 1; i < nw; i++) {
    if (cost[i] < lo) lo = cost[i];
    if (cost[i] > hi) hi = cost[i];
  }
  if (temperature <= 0 || hi == lo) {
    for (i = 0; i < nw; i++)
      if (cost[i] == lo) ties[nt++] = i;
    return ties[rng_below(rng, (uint32_t)nt)];
  }
  for (i = 0; i < nw; i++) {
    p[i] = exp(-((cost[i] - lo) / (hi - lo)) / temperature);
    sum += p[i];
  }
  u = rng_unit(rng) * sum;
  for (i = 0; i < nw; i++) {
    if (u < p[i]) return i;
    u -= p[i];
  }
  return nw - 1;
}

static int run(const policy *pol, size_t nw, size_t n_req, double ow,
               uint64_t seed, result *res) {
  static worker fleet[MAX_WORKERS];
  kvidx_config cfg = {0};
  kvidx *ix;
  uint64_t rng = seed ^ 0xD1B54A32D192ED03ull;
  size_t r, w, i;
  int rc;

  memset(fleet, 0, sizeof fleet);
  memset(res, 0, sizeof *res);
  cfg.kind = KVIDX_POSITIONAL;
  cfg.max_workers = MAX_WORKERS;
  if ((rc = kvidx_create(&ix, &cfg)) != KVIDX_OK) return fail("create", rc);

  for (r = 0; r < n_req; r++) {
    const request *q = &g_req[r];
    uint64_t loc[MAX_REQ_BLOCKS + 1], seq[MAX_REQ_BLOCKS + 1];
    kvidx_block blk[MAX_REQ_BLOCKS + 1];
    kvidx_score sc[MAX_WORKERS];
    uint32_t overlap[MAX_WORKERS], load[MAX_WORKERS];
    double cost[MAX_WORKERS];
    size_t n = kvidx_block_hashes(q->tokens, q->n_tokens, BLOCK, KVIDX_SEED, loc);
    size_t m, chosen;
    worker *wk;

    kvidx_seq_hashes(loc, n, seq);

    /* Time passes: finished requests leave their workers. */
    for (w = 0; w < nw; w++) {
      worker *x = &fleet[w];
      for (i = 0; i < x->n_inflight;) {
        if (--x->inflight_left[i] == 0) {
          x->n_inflight--;
          x->inflight_left[i] = x->inflight_left[x->n_inflight];
          x->inflight_blocks[i] = x->inflight_blocks[x->n_inflight];
        } else {
          i++;
        }
      }
    }

    /* Ask the index, then price every worker. */
    m = kvidx_find_matches(ix, loc, n, sc, MAX_WORKERS);
    for (w = 0; w < nw; w++) overlap[w] = 0;
    for (i = 0; i < m && i < MAX_WORKERS; i++) overlap[sc[i].worker_id] = sc[i].depth;
    for (w = 0; w < nw; w++) {
      if (overlap[w] != true_overlap(&fleet[w], seq, n)) res->mismatches++;
      load[w] = worker_load(&fleet[w]);
      cost[w] = ow * (double)(n - overlap[w]) + (double)load[w];
    }
    switch (pol->kind) {
    case 0: chosen = pick(cost, nw, pol->temperature, &rng); break;
    case 1: {
      double lc[MAX_WORKERS];
      for (w = 0; w < nw; w++) lc[w] = load[w];
      chosen = pick(lc, nw, 0, &rng);
      break;
    }
    default: chosen = rng_below(&rng, (uint32_t)nw); break;
    }
    if (g_verbose && r < 12)
      printf("  req %3zu: %2zu blocks -> worker %zu (overlap %u, load %u, "
             "cost %.1f)\n", r, n, chosen, overlap[chosen], load[chosen],
             cost[chosen]);

    /* The chosen worker serves it: prefix hits, new blocks Stored. */
    wk = &fleet[chosen];
    res->prompt_blocks += n;
    res->cached_blocks += overlap[chosen];
    res->per_worker[chosen]++;
    for (i = 0; i < n; i++) {
      long at = cache_find(wk, seq[i]);
      if (at < 0) {
        at = (long)wk->n++;
        wk->seq[at] = seq[i];
      }
      wk->used[at] = r + 1;
      wk->pos[at] = (uint32_t)i;
      blk[i].local = loc[i];
      blk[i].seq = seq[i];
    }
    /* Re-storing blocks the worker holds is a no-op, so one event from the
     * root covers hits and misses alike. */
    if ((rc = kvidx_store(ix, chosen, 0, NULL, blk, n)) != KVIDX_OK)
      return fail("store", rc);
    /* Over capacity: evict least recently used, deepest first (Removed). */
    while (wk->n > CACHE_BLOCKS) {
      size_t v = 0;
      for (i = 1; i < wk->n; i++)
        if (wk->used[i] < wk->used[v] ||
            (wk->used[i] == wk->used[v] && wk->pos[i] > wk->pos[v]))
          v = i;
      if ((rc = kvidx_remove(ix, chosen, 0, &wk->seq[v], 1)) != KVIDX_OK)
        return fail("remove", rc);
      res->removed++;
      wk->n--;
      wk->seq[v] = wk->seq[wk->n];
      wk->used[v] = wk->used[wk->n];
      wk->pos[v] = wk->pos[wk->n];
    }
    if (wk->n_inflight < MAX_INFLIGHT) {
      wk->inflight_blocks[wk->n_inflight] = (uint32_t)n;
      wk->inflight_left[wk->n_inflight++] = q->duration;
    }
    if (worker_load(wk) > res->peak_load) res->peak_load = worker_load(wk);
  }
  if ((rc = kvidx__check(ix)) != 0) {
    fprintf(stderr, "router: kvidx__check failed: %d\n", rc);
    return rc;
  }
  kvidx_destroy(ix);
  return 0;
}

static void usage(void) {
  fprintf(stderr, "usage: router [--workers N] [--requests N] [--seed S] "
                  "[--temperature T] [--overlap-weight W] [--verbose]\n");
  exit(2);
}

int main(int argc, char **argv) {
  size_t nw = 4, n_req = 600, i, w;
  uint64_t seed = 42;
  double ow = 1.0, temp = -1;
  policy pols[5] = {{"kv-aware T=0", 0, 0},
                    {"kv-aware T=0.5", 0, 0.5},
                    {"least-loaded", 1, 0},
                    {"random", 2, 0},
                    {"kv-aware T=?", 0, 0}};
  size_t npol = 4;
  double hit[5];
  size_t bad = 0;

  for (i = 1; i < (size_t)argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--verbose")) { g_verbose = 1; continue; }
    if (i + 1 >= (size_t)argc) usage();
    if (!strcmp(a, "--workers")) nw = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(a, "--requests")) n_req = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(a, "--seed")) seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(a, "--temperature")) temp = strtod(argv[++i], NULL);
    else if (!strcmp(a, "--overlap-weight")) ow = strtod(argv[++i], NULL);
    else usage();
  }
  if (nw < 1 || nw > MAX_WORKERS || n_req < 1 || n_req > MAX_REQUESTS) usage();
  if (temp >= 0) { /* one policy, the temperature asked for */
    static char name[40];
    snprintf(name, sizeof name, "kv-aware T=%g", temp);
    pols[0].name = name;
    pols[0].temperature = temp;
    npol = 1;
  }

  make_requests(n_req, seed);
  printf("router: %zu workers x %d-block KV cache, %zu requests, block %d, "
         "overlap_weight %.2f, seed %llu\n", nw, CACHE_BLOCKS, n_req, BLOCK,
         ow, (unsigned long long)seed);
  printf("%-16s %9s %14s %8s %9s  %s\n", "policy", "hit-rate",
         "prefill-blocks", "evicted", "peak-load", "requests per worker");
  for (i = 0; i < npol; i++) {
    result res;
    if (g_verbose) printf("%s:\n", pols[i].name);
    if (run(&pols[i], nw, n_req, ow, seed, &res) != 0) return 1;
    hit[i] = 100.0 * (double)res.cached_blocks / (double)res.prompt_blocks;
    printf("%-16s %8.1f%% %14zu %8zu %9u ", pols[i].name, hit[i],
           res.prompt_blocks - res.cached_blocks, res.removed, res.peak_load);
    for (w = 0; w < nw; w++) printf(" %zu", res.per_worker[w]);
    printf("\n");
    bad += res.mismatches;
  }
  if (bad) {
    printf("router: index disagrees with the simulated caches %zu times\n", bad);
    return 1;
  }
  printf("router: index overlap matched the simulated caches on every request\n");
  if (npol == 4) {
    printf("router: kv-aware routing hits %.1f%% of prompt blocks vs %.1f%% "
           "random: %s\n", hit[0], hit[3], hit[0] > hit[3] ? "better" : "WORSE");
    if (!(hit[0] > hit[3])) return 1;
  }
  return 0;
}
