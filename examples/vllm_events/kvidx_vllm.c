/* kvidx_vllm.c - a small daemon that indexes vLLM's KV-cache events.
 *
 * It subscribes (ZeroMQ SUB) to the KV event publishers of one or more vLLM
 * instances, feeds every event into a kvidx index through kvidx_apply (with
 * an event id and a stream generation, so lost, repeated and restarted
 * streams are recognised), heals gaps from vLLM's replay socket when one is
 * given, and answers routing queries on a local socket (a unix socket, or
 * TCP on a loopback address only).
 *
 * Decoding is in vllm_decode.c (no ZeroMQ there: the fuzz target
 * fuzz/fuzz_vllm_decode.c links it too); README.md has a table of vLLM's
 * fields by version and what is done with each.
 *
 * WIRE FORMAT (vllm/distributed/kv_events.py, ZmqEventPublisher)
 *   multipart [topic, seq (8 bytes, big endian), payload]; payload is a
 *   msgpack EventBatch, either array-like  [ts, [event...], dp_rank?]  or a
 *   map  {"ts":..., "events":[...], "data_parallel_rank":...}.
 *
 * EVENT IDS AND GENERATIONS
 *   seq numbers the batches of one publisher (one vLLM engine, one DP rank).
 *   Event i of batch seq gets id  seq << 24 | i  for its (worker, dp_rank),
 *   and after the batch an empty Removed with id  seq << 24 | 0xFFFFFF
 *   closes it.  The stream generation starts a new value when seq returns
 *   to 0, or when the first batch after the daemon (re)connected has a seq
 *   below the last one: then kvidx drops the worker's old blocks
 *   (KVIDX_RESTARTED).  Any other batch at or below the last seq is a
 *   duplicate and is not applied again; a batch past the last seq + 1 is a
 *   gap.
 *
 * REPLAY (--replay URL after an --endpoint)
 *   Before applying a batch that follows a gap the daemon asks the
 *   publisher's replay socket (vLLM's ROUTER: request [b"", start_seq])
 *   for the missing batches; replies are [b"", topic, seq, payload] (newest
 *   vLLM) or [b"", seq, payload] (before), ended by seq -1.  It waits at
 *   most --replay-timeout ms.  When the replies do not cover the gap, the
 *   worker (that dp rank) is cleared: its holdings are unknown.
 *
 * QUERIES (one line in, one line out)
 *   PING                           -> OK pong
 *   MATCH [opts] tok tok ...       -> OK blocks=N matches=M wid:dp:depth ...
 *     opts: lora=NAME  lora_id=N  salt=CACHE_SALT  mm=ID:OFFSET:LENGTH ...
 *           pe=BLOCK:HEX64 ...  (see README.md: building a query)
 *   MATCHH hash hash ...           -> same, from local block hashes (decimal)
 *   MATCHT [opts] tok tok ...      -> OK blocks=N matches=M
 *                                     wid:dp:depth:device_blocks ...
 *   WORKER wid [dp]                -> OK blocks=N
 *   STATS                          -> OK batches=... events=... ...
 *   anything else                  -> ERR ...
 *
 * USAGE
 *   kvidx-vllm-events --endpoint tcp://127.0.0.1:5557=1 [--replay tcp://127.0.0.1:5558]
 *                     [--endpoint tcp://127.0.0.1:5559=2 ...]
 *                     --listen unix:/run/kvidx.sock | --listen 127.0.0.1:7070
 *                     [--block-size 16] [--topic T] [--kind positional|radix]
 *                     [--snapshot PATH] [--all-groups] [--max-blocks N]
 *                     [--offload-block-factor N] [--replay-timeout MS]
 *                     [--max-seconds S] [--quiet]
 *   Each --endpoint is a vLLM publisher (its kv-events endpoint; one per DP
 *   rank, whose events carry the rank) and the worker id its events are
 *   filed under; --replay names that publisher's replay endpoint.
 *   --max-blocks bounds the blocks whose identities the decoder remembers
 *   (for CPU offload events and removals; default 1048576).
 *   --offload-block-factor N: GPU blocks per offloaded block when the
 *   offloading connector's events say block_size 0 (default 1).
 *   --snapshot PATH: warm restart.  At start the index (and each worker's
 *   last event id and generation) is loaded from PATH if it exists; on a
 *   clean stop (SIGTERM, SIGINT, --max-seconds) it is written to PATH.tmp,
 *   synced and renamed over PATH.
 *
 * Build: make vllm-events (needs libzmq3-dev).
 */
#define _POSIX_C_SOURCE 200809L
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"
#include "vllm_decode.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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
#define MAX_MM 256

typedef struct {
  const char *url, *replay_url;
  uint64_t worker_id;
  void *sock, *replay;
  int have_seq, fresh;
  uint64_t last_seq;
} endpoint;

typedef struct {
  int fd;
  char *buf;
  size_t len;
} client;

static volatile sig_atomic_t g_stop;
static int g_quiet;
static unsigned long long g_queries, g_lost_batches, g_replays, g_replayed,
    g_replay_failed;
static kvidx *g_ix;
static vd_state g_vd;
static size_t g_block_size = 16;
static long g_replay_ms = 1000;

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

static void vd_log(void *ctx, const char *msg) {
  (void)ctx;
  logf_("%s", msg);
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
static uint64_t *g_loc;
static size_t g_loc_cap;

/* ---- batches, gaps and replay ------------------------------------------------ */
static uint64_t seq_of(const zmq_msg_t *m) {
  const unsigned char *s = zmq_msg_data((zmq_msg_t *)m);
  uint64_t v = 0;
  int k;
  for (k = 0; k < 8; k++) v = (v << 8) | s[k];
  return v;
}

/* Receives one multipart message (up to 4 parts kept) from sock; returns the
 * number of parts, 0 when none is waiting, -1 on error. */
static int recv_parts(void *sock, zmq_msg_t *part, int flags) {
  int n = 0, more = 1;
  while (more) {
    zmq_msg_t extra, *m = n < 4 ? &part[n] : &extra;
    zmq_msg_init(m);
    if (zmq_msg_recv(m, sock, n == 0 ? flags : 0) < 0) {
      int k;
      zmq_msg_close(m);
      for (k = 0; k < n && k < 4; k++) zmq_msg_close(&part[k]);
      return n == 0 && zmq_errno() == EAGAIN ? 0 : -1;
    }
    more = zmq_msg_more(m);
    if (m == &extra) zmq_msg_close(m);
    n++;
  }
  return n;
}

static void close_parts(zmq_msg_t *part, int n) {
  int k;
  for (k = 0; k < n && k < 4; k++) zmq_msg_close(&part[k]);
}

/* Asks e's replay socket for batches from..to-1 and applies them in order.
 * Returns 1 when the worker's stream now ends at batch to-1. */
static int replay(endpoint *e, uint64_t from, uint64_t to, uint32_t dp) {
  unsigned char req[8];
  double deadline = now_s() + (double)g_replay_ms / 1000.0;
  uint64_t last = 0;
  int k, done = 0;
  zmq_msg_t part[4];
  g_replays++;
  while ((k = recv_parts(e->replay, part, ZMQ_DONTWAIT)) > 0) close_parts(part, k); /* stale */
  for (k = 0; k < 8; k++) req[k] = (unsigned char)(from >> (56 - 8 * k));
  if (zmq_send(e->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
      zmq_send(e->replay, req, 8, ZMQ_DONTWAIT) < 0) {
    logf_("replay %s: cannot send the request: %s", e->replay_url, zmq_strerror(zmq_errno()));
    return 0;
  }
  while (!done) {
    zmq_pollitem_t it;
    long left = (long)((deadline - now_s()) * 1000.0);
    if (left <= 0) {
      logf_("replay %s: no end marker within %ld ms", e->replay_url, g_replay_ms);
      break;
    }
    it.socket = e->replay;
    it.fd = 0;
    it.events = ZMQ_POLLIN;
    it.revents = 0;
    if (zmq_poll(&it, 1, left) <= 0) continue;
    while ((k = recv_parts(e->replay, part, ZMQ_DONTWAIT)) > 0) {
      /* [b"", seq, payload] or [b"", topic, seq, payload] */
      int si = k == 3 ? 1 : k == 4 ? 2 : -1;
      if (si < 0 || zmq_msg_size(&part[0]) != 0 || zmq_msg_size(&part[si]) != 8) {
        g_vd.c.malformed++;
      } else {
        uint64_t seq = seq_of(&part[si]);
        if (seq == UINT64_MAX) {
          done = 1; /* end marker: seq -1 */
        } else if (seq >= from && seq < to) {
          vd_batch(&g_vd, zmq_msg_data(&part[si + 1]), zmq_msg_size(&part[si + 1]), seq,
                   e->worker_id, 0);
          g_replayed++;
        }
      }
      close_parts(part, k);
      if (done) break;
    }
  }
  return kvidx_last_event_id(g_ix, e->worker_id, dp, &last) == KVIDX_OK &&
         last == (((to - 1) << VD_EV_SHIFT) | VD_EV_END);
}

/* A batch from the SUB socket: heals a gap first when it can. */
static void on_batch(endpoint *e, const unsigned char *p, size_t len, uint64_t seq) {
  long dp = vd_batch_dp(p, len);
  uint64_t last;
  if (dp >= 0 && kvidx_last_event_id(g_ix, e->worker_id, (uint32_t)dp, &last) == KVIDX_OK) {
    uint64_t lseq = last >> VD_EV_SHIFT;
    int restart = (seq == 0 && lseq > 0) || (e->fresh && seq < lseq);
    if (!restart && seq > lseq + 1 && seq < VD_MAX_SEQ) {
      if (e->replay && replay(e, lseq + 1, seq, (uint32_t)dp)) {
        logf_("worker %llu dp %ld: batches %llu..%llu replayed", (unsigned long long)e->worker_id,
              dp, (unsigned long long)(lseq + 1), (unsigned long long)(seq - 1));
      } else if (e->replay) {
        /* the replay cannot cover the gap: what the worker holds is unknown */
        g_replay_failed++;
        kvidx_clear(g_ix, e->worker_id, (uint32_t)dp);
        vd_forget(&g_vd, e->worker_id, (uint32_t)dp);
        logf_("worker %llu dp %ld: replay did not cover batches %llu..%llu: worker cleared",
              (unsigned long long)e->worker_id, dp, (unsigned long long)(lseq + 1),
              (unsigned long long)(seq - 1));
      }
    }
  }
  vd_batch(&g_vd, p, len, seq, e->worker_id, e->fresh);
  e->fresh = 0;
}

/* Drains one SUB socket: each message is [topic, seq, payload]. */
static void on_sub(endpoint *e) {
  zmq_msg_t part[4];
  int n;
  while ((n = recv_parts(e->sock, part, ZMQ_DONTWAIT)) > 0) {
    if (n != 3 || zmq_msg_size(&part[1]) != 8) {
      g_vd.c.malformed++;
    } else {
      uint64_t seq = seq_of(&part[1]);
      /* batches this endpoint skipped */
      if (e->have_seq && seq > e->last_seq + 1) g_lost_batches += seq - e->last_seq - 1;
      e->have_seq = 1;
      e->last_seq = seq;
      on_batch(e, zmq_msg_data(&part[2]), zmq_msg_size(&part[2]), seq);
    }
    close_parts(part, n);
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

static int hexval(int c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The rest of a MATCH / MATCHT (options, then tokens) or MATCHH (local
 * hashes) line into g_loc; returns the number of blocks, or -1 after
 * writing an ERR reply.  Options (before the first token):
 *   lora=NAME  lora_id=N  salt=S  mm=ID:OFFSET:LENGTH  pe=BLOCK:HEX64 */
static long query_locals(char **save, int hashes, sbuf *out) {
  static vd_mm mm[MAX_MM];
  static unsigned char pe_store[MAX_MM][32];
  static const unsigned char *pe[MAX_MM];
  vd_query q;
  size_t n = 0, i;
  char *t;
  memset(&q, 0, sizeof q);
  memset(pe, 0, sizeof pe);
  q.mm = mm;
  q.pe = pe;
  while ((t = strtok_r(NULL, " \t\r", save)) != NULL) {
    char *end;
    unsigned long long v;
    if (!hashes && n == 0 && strchr(t, '=')) {
      char *val = strchr(t, '=') + 1;
      if (!strncmp(t, "lora=", 5)) {
        q.lora_name = val;
      } else if (!strncmp(t, "lora_id=", 8)) {
        q.has_lora_id = 1;
        q.lora_id = strtoull(val, NULL, 10);
      } else if (!strncmp(t, "salt=", 5)) {
        q.salt = val;
      } else if (!strncmp(t, "mm=", 3)) {
        char *c2 = strrchr(val, ':'), *c1;
        if (!c2 || q.n_mm == MAX_MM) goto bad_opt;
        *c2 = 0;
        if (!(c1 = strrchr(val, ':'))) goto bad_opt;
        *c1 = 0;
        mm[q.n_mm].id = val;
        mm[q.n_mm].offset = strtoull(c1 + 1, NULL, 10);
        mm[q.n_mm].length = strtoull(c2 + 1, NULL, 10);
        if (mm[q.n_mm].offset > UINT32_MAX || mm[q.n_mm].length > UINT32_MAX) goto bad_opt;
        q.n_mm++;
      } else if (!strncmp(t, "pe=", 3)) {
        char *c = strchr(val, ':');
        unsigned long blk;
        if (!c || strlen(c + 1) != 64) goto bad_opt;
        blk = strtoul(val, NULL, 10);
        if (blk >= MAX_MM) goto bad_opt;
        for (i = 0; i < 32; i++) {
          int hi = hexval(c[1 + 2 * i]), lo = hexval(c[2 + 2 * i]);
          if (hi < 0 || lo < 0) goto bad_opt;
          pe_store[blk][i] = (unsigned char)(hi << 4 | lo);
        }
        pe[blk] = pe_store[blk];
        if (blk + 1 > q.n_pe) q.n_pe = blk + 1;
      } else {
        goto bad_opt;
      }
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
    n = vd_query_locals(&g_vd, g_tok, n, &q, g_loc);
  }
  return (long)n;
bad_opt:
  sb_printf(out, "ERR bad option: %s (lora=NAME lora_id=N salt=S mm=ID:OFFSET:LENGTH pe=BLOCK:HEX64)\n", t);
  return -1;
}

static void on_line(char *line, sbuf *out) {
  char *save = NULL, *cmd = strtok_r(line, " \t\r", &save);
  long n;
  g_queries++;
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
    const vd_counters *c = &g_vd.c;
    sb_printf(out,
              "OK batches=%llu events=%llu stored=%llu removed=%llu "
              "cleared=%llu skipped=%llu ignored=%llu malformed=%llu "
              "enoparent=%llu enoent=%llu efull=%llu errors=%llu gaps=%llu "
              "restarts=%llu duplicates=%llu lost_batches=%llu offloaded=%llu "
              "unresolved=%llu untracked=%llu replays=%llu replayed=%llu "
              "replay_failed=%llu queries=%llu identities=%zu "
              "blocks=%zu workers=%zu entries=%zu bytes=%zu\n",
              c->batches, c->events, c->stored, c->removed, c->cleared,
              c->skipped, c->ignored, c->malformed, c->enoparent,
              c->enoent, c->efull, c->errors, c->gaps, c->restarts,
              c->duplicates, g_lost_batches, c->offloaded, c->unresolved,
              c->untracked, g_replays, g_replayed, g_replay_failed, g_queries,
              g_vd.tab_n, st.blocks, st.workers, st.entries, st.bytes);
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
  if (vd_rebuild(&g_vd) != 0) logf_("snapshot %s: identities not rebuilt", path);
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
          "usage: kvidx-vllm-events --endpoint URL=WORKER_ID [--replay URL] [--endpoint ...]\n"
          "         --listen unix:PATH|127.0.0.1:PORT [--block-size N] [--topic T]\n"
          "         [--kind positional|radix] [--snapshot PATH] [--all-groups]\n"
          "         [--max-blocks N] [--offload-block-factor N] [--replay-timeout MS]\n"
          "         [--blocks-per-worker N]\n"
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
  int lfd, rc, a, status = 0, all_groups = 0;
  size_t max_idents = 1u << 20, offload_factor = 1;
  struct sigaction sa;

  cfg.kind = KVIDX_POSITIONAL;
#ifdef KVIDX_F_TIERS
  cfg.flags |= KVIDX_F_TIERS; /* host and disk copies beside device ones */
#endif
  for (a = 1; a < argc; a++) {
    const char *s = argv[a];
    if (!strcmp(s, "--quiet")) { g_quiet = 1; continue; }
    if (!strcmp(s, "--all-media")) continue; /* old flag: every medium is indexed now */
    if (!strcmp(s, "--all-groups")) { all_groups = 1; continue; }
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
      ep[nep].replay_url = NULL;
      ep[nep].have_seq = 0;
      ep[nep].fresh = 1;
      nep++;
    } else if (!strcmp(s, "--replay")) {
      if (nep == 0) usage();
      ep[nep - 1].replay_url = argv[++a];
    } else if (!strcmp(s, "--replay-timeout")) g_replay_ms = strtol(argv[++a], NULL, 10);
    else if (!strcmp(s, "--max-blocks")) max_idents = strtoul(argv[++a], NULL, 10);
    else if (!strcmp(s, "--offload-block-factor")) offload_factor = strtoul(argv[++a], NULL, 10);
    else if (!strcmp(s, "--blocks-per-worker")) cfg.blocks_per_worker = strtoul(argv[++a], NULL, 10);
    else if (!strcmp(s, "--listen")) listen_spec = argv[++a];
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
  if (vd_init(&g_vd, g_ix, g_block_size, max_idents) != 0) {
    fprintf(stderr, "kvidx-vllm: out of memory\n");
    return 1;
  }
  g_vd.all_groups = all_groups;
  if (offload_factor) g_vd.offload_factor = offload_factor;
  g_vd.log = vd_log;
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
    ep[i].replay = NULL;
    if (ep[i].replay_url) {
      int zero = 0;
      ep[i].replay = zmq_socket(zctx, ZMQ_DEALER);
      zmq_setsockopt(ep[i].replay, ZMQ_LINGER, &zero, sizeof zero);
      if (zmq_connect(ep[i].replay, ep[i].replay_url) != 0) {
        fprintf(stderr, "kvidx-vllm: connect %s: %s\n", ep[i].replay_url,
                zmq_strerror(zmq_errno()));
        return 1;
      }
      logf_("replay requests for worker %llu go to %s", (unsigned long long)ep[i].worker_id,
            ep[i].replay_url);
    }
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
        "%llu malformed, %llu gaps, %llu restarts, %llu duplicates", g_vd.c.batches,
        g_vd.c.events, g_vd.c.stored, g_vd.c.removed, g_vd.c.malformed, g_vd.c.gaps,
        g_vd.c.restarts, g_vd.c.duplicates);
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
    if (ep[i].replay) zmq_close(ep[i].replay);
  }
  zmq_ctx_term(zctx);
  kvidx_destroy(g_ix);
  free(g_tok);
  free(g_loc);
  vd_free(&g_vd);
  return status;
}
