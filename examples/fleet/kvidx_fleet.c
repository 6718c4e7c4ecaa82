/* kvidx_fleet.c - a router fleet on NATS JetStream: engine events go into a
 * durable stream, any number of router replicas each keep a kvidx index fed
 * from it, and index snapshots kept in NATS let a replica start warm.
 * See examples/fleet/README.md for the topology, subjects and retention.
 *
 * ROLES
 *   bridge   reads engine events (an event file: S/R/C lines, Q lines are
 *            skipped; or vLLM's ZeroMQ feed, fleet_vllm.h) and publishes each to  P.ev.<worker>  of stream P-events
 *            with header Nats-Msg-Id "<worker>:<event id>"; the event id is
 *            the engine sequence of that worker (its 1-based ordinal).  On
 *            start and after any publish failure it asks the stream for each
 *            worker's last stored event and resumes after it, so a restarted
 *            bridge does not publish an event twice; the message id makes the
 *            stream drop any republished event within the duplicate window
 *            (--rewind K republishes K events per worker on purpose).
 *   replica  loads the newest snapshot from stream P-snap, then pulls events
 *            from the following stream sequence (durable pull consumer
 *            P-<name>_<pid>_<n>, ack-all after each batch), applies each with
 *            kvidx_apply and serves queries on a unix socket.  Every N events
 *            or T seconds it writes a snapshot (chunks + a head naming the
 *            stream sequence it covers).  If the stream no longer holds the
 *            events right after its snapshot (trimmed by retention), it says
 *            so, serves "ERR not ready" and rebuilds from a newer snapshot.
 *   direct   the reference: one index fed the file directly; writes a query
 *            set and prints its answers in the replica's reply format.
 *   ask      sends stdin lines to a replica socket, prints the replies.
 *   info     prints the event stream's first/last sequence and count.
 *   purge    drops all but the last K messages of the event stream.
 *
 * QUERIES (one line in, one line out, unix socket)
 *   PING -> OK pong;  MATCH [lora=NAME] tok ... (--block-size tokens per
 *   block) or MATCHH h h ... (local hashes, decimal) ->
 *   OK blocks=N matches=M wid:dp:depth ...;  WORKER wid -> OK blocks=N;
 *   STATUS -> OK ready=0|1 applied_seq=... (counters);  SNAPSHOT -> write a
 *   snapshot now (once caught up; skipped if the head covers as much)
 *
 * Build: make fleet (libnats-dev).  Test: make test-fleet (nats-server). */
#define _POSIX_C_SOURCE 200809L
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"

#include <errno.h>
#include <nats/nats.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_SCORES 1024
#define MAX_LINE (1u << 20)
#define MAX_CLIENTS 32
#define CHUNK_BYTES (256u * 1024u)
#define MAX_WORKERS 8192u

static const char *g_role = "fleet";
static const char *g_prefix = "kvidx";
static volatile sig_atomic_t g_stop;
static int g_debug; /* KVIDX_FLEET_DEBUG=1: log each fetch while catching up */
static size_t g_block_size = 16; /* replica: tokens per block for MATCH */

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One line on stderr, prefixed with this process's role. */
static void vlog_line(const char *fmt, va_list ap) {
  fprintf(stderr, "kvidx-fleet %s: ", g_role);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  fflush(stderr);
}

static void logf_(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog_line(fmt, ap);
  va_end(ap);
}

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog_line(fmt, ap);
  va_end(ap);
  exit(2);
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) die("out of memory");
  return q;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- names ------------------------------------------------------------------ */
static char g_ev_stream[128], g_snap_stream[128], g_ev_subjects[128],
    g_snap_subjects[128], g_snap_head[128];

static void set_names(void) {
  snprintf(g_ev_stream, sizeof g_ev_stream, "%s-events", g_prefix);
  snprintf(g_snap_stream, sizeof g_snap_stream, "%s-snap", g_prefix);
  snprintf(g_ev_subjects, sizeof g_ev_subjects, "%s.ev.>", g_prefix);
  snprintf(g_snap_subjects, sizeof g_snap_subjects, "%s.snap.>", g_prefix);
  snprintf(g_snap_head, sizeof g_snap_head, "%s.snap.head", g_prefix);
}

/* ---- event lines -------------------------------------------------------------
 * "S worker parent|- n local seq ...", "R worker n seq ...", "C worker".
 * Parsed into ev (pointing into the scratch buffers); 0 = ok, -1 = malformed.
 * Work is bounded by the line's length: n must match the tokens present. */
typedef struct {
  kvidx_block *blk;
  uint64_t *seqs;
  size_t cap;
  uint64_t parent;
} scratch;

static int next_u64(const char **p, const char *end, uint64_t *out) {
  const char *s = *p;
  uint64_t v = 0;
  while (s < end && *s == ' ') s++;
  if (s >= end || *s < '0' || *s > '9') return -1;
  for (; s < end && *s >= '0' && *s <= '9'; s++) {
    uint64_t d = (uint64_t)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  if (s < end && *s != ' ' && *s != '\n' && *s != '\r') return -1;
  *p = s;
  *out = v;
  return 0;
}

static int parse_event(const char *line, size_t len, scratch *sc, kvidx_event *ev) {
  const char *p = line + 1, *end = line + len;
  uint64_t w, n, i;
  memset(ev, 0, sizeof *ev); /* later kvidx_event fields stay zero */
  if (len < 3 || line[1] != ' ') return -1;
  if (next_u64(&p, end, &w)) return -1;
  ev->worker_id = w;
  ev->tier = KVIDX_TIER_DEVICE;
  if (line[0] == 'C') {
    ev->type = KVIDX_EV_CLEARED;
    return 0;
  }
  if (line[0] == 'S') {
    ev->type = KVIDX_EV_STORED;
    while (p < end && *p == ' ') p++;
    if (p < end && *p == '-') {
      p++;
      ev->parent = NULL;
    } else {
      if (next_u64(&p, end, &sc->parent)) return -1;
      ev->parent = &sc->parent;
    }
  } else if (line[0] == 'R') {
    ev->type = KVIDX_EV_REMOVED;
  } else {
    return -1;
  }
  if (next_u64(&p, end, &n)) return -1;
  /* each block needs at least two bytes per number on the line */
  if (n > len) return -1;
  if (n > sc->cap) {
    sc->cap = (size_t)n;
    sc->blk = xrealloc(sc->blk, sc->cap * sizeof *sc->blk);
    sc->seqs = xrealloc(sc->seqs, sc->cap * sizeof *sc->seqs);
  }
  for (i = 0; i < n; i++) {
    if (ev->type == KVIDX_EV_STORED) {
      if (next_u64(&p, end, &sc->blk[i].local) || next_u64(&p, end, &sc->blk[i].seq)) return -1;
    } else if (next_u64(&p, end, &sc->seqs[i])) {
      return -1;
    }
  }
  ev->n = (size_t)n;
  ev->blocks = sc->blk;
  ev->seqs = sc->seqs;
  return 0;
}

typedef struct {
  atomic_ullong events, dup_skipped, gaps, errors, malformed, redelivered;
} apply_counters;

/* Applies one event with its id.  An id the index already has for the
 * worker is skipped (never applied twice); an id past last + 1 is a gap in
 * the feed (counted: the test requires none). */
static int apply_line(kvidx *ix, uint64_t id, const char *line, size_t len,
                      scratch *sc, apply_counters *c) {
  kvidx_event ev;
  uint64_t last = 0;
  int have, rc;
  if (parse_event(line, len, sc, &ev)) {
    atomic_fetch_add(&c->malformed, 1);
    return -1;
  }
  ev.event_id = id;
  have = kvidx_last_event_id(ix, ev.worker_id, 0, &last) == KVIDX_OK;
  if (have && id <= last) {
    atomic_fetch_add(&c->dup_skipped, 1);
    return 0;
  }
  if ((have && id != last + 1) || (!have && id != 1)) atomic_fetch_add(&c->gaps, 1);
  rc = kvidx_apply(ix, &ev);
  if (rc < 0) atomic_fetch_add(&c->errors, 1);
  atomic_fetch_add(&c->events, 1);
  return 0;
}

/* ---- per-worker table (worker id -> event counter) ---------------------------- */
typedef struct {
  uint64_t wid[MAX_WORKERS];
  uint64_t next_id[MAX_WORKERS]; /* ids handed out so far (file order)       */
  uint64_t resume[MAX_WORKERS];  /* bridge: publish ids above this            */
  unsigned char used[MAX_WORKERS], known[MAX_WORKERS];
} worker_table;

static size_t worker_slot(worker_table *t, uint64_t wid) {
  size_t h = (size_t)((wid * 0x9E3779B97F4A7C15ull) >> 51) & (MAX_WORKERS - 1);
  size_t probes = 0;
  while (t->used[h] && t->wid[h] != wid) {
    h = (h + 1) & (MAX_WORKERS - 1);
    if (++probes == MAX_WORKERS) die("more than %u workers", MAX_WORKERS);
  }
  if (!t->used[h]) t->used[h] = 1, t->wid[h] = wid;
  return h;
}

/* worker id of an S/R/C line, -1 if none */
static int line_worker(const char *line, size_t len, uint64_t *w) {
  const char *p = line + 1;
  if (len < 3 || (line[0] != 'S' && line[0] != 'R' && line[0] != 'C') || line[1] != ' ') return -1;
  return next_u64(&p, line + len, w);
}

/* ---- NATS plumbing ------------------------------------------------------------ */
typedef struct {
  natsConnection *nc;
  jsCtx *js;
} nats_link;

static void nats_close(nats_link *l) {
  if (l->js) jsCtx_Destroy(l->js);
  if (l->nc) natsConnection_Destroy(l->nc);
  l->js = NULL;
  l->nc = NULL;
}

/* Connects, retrying until deadline_s (monotonic).  reconnect: let the
 * client reconnect by itself (replica); the bridge handles a lost connection
 * itself, so that a connection's unacknowledged publishes are one suffix. */
static int nats_open(nats_link *l, const char *url, int reconnect, double deadline_s,
                     jsOptions *jo) {
  natsOptions *o = NULL;
  natsStatus s;
  memset(l, 0, sizeof *l);
  if (natsOptions_Create(&o) != NATS_OK) die("natsOptions_Create failed");
  natsOptions_SetURL(o, url);
  natsOptions_SetTimeout(o, 1000);
  natsOptions_SetAllowReconnect(o, reconnect);
  natsOptions_SetMaxReconnect(o, -1);
  natsOptions_SetReconnectWait(o, 100);
  for (;;) {
    s = natsConnection_Connect(&l->nc, o);
    if (s == NATS_OK) break;
    if (now_s() > deadline_s || g_stop) {
      natsOptions_Destroy(o);
      logf_("cannot connect to %s: %s", url, natsStatus_GetText(s));
      return -1;
    }
    sleep_ms(100);
  }
  natsOptions_Destroy(o);
  if (natsConnection_JetStream(&l->js, l->nc, jo) != NATS_OK) {
    nats_close(l);
    return -1;
  }
  return 0;
}

typedef struct {
  int64_t max_age_s, max_msgs, max_bytes, dup_window_s;
} retention;

/* Creates the event and snapshot streams if missing (same config from every
 * role; an existing stream is left as it is). */
static int ensure_streams(jsCtx *js, const retention *r) {
  jsStreamConfig sc;
  jsErrCode je = 0;
  const char *ev_subj[1] = {g_ev_subjects}, *snap_subj[1] = {g_snap_subjects};
  natsStatus s;
  jsStreamInfo *si = NULL;

  jsStreamConfig_Init(&sc);
  sc.Name = g_ev_stream;
  sc.Subjects = ev_subj;
  sc.SubjectsLen = 1;
  sc.Storage = js_FileStorage;
  sc.Retention = js_LimitsPolicy;
  sc.MaxAge = r->max_age_s > 0 ? r->max_age_s * 1000000000LL : 0;
  sc.MaxMsgs = r->max_msgs > 0 ? r->max_msgs : -1;
  sc.MaxBytes = r->max_bytes > 0 ? r->max_bytes : -1;
  sc.Duplicates = (r->dup_window_s > 0 ? r->dup_window_s : 120) * 1000000000LL;
  s = js_AddStream(&si, js, &sc, NULL, &je);
  if (si) jsStreamInfo_Destroy(si), si = NULL;
  if (s != NATS_OK && je != JSStreamNameExistErr) {
    logf_("create stream %s: %s (%d)", g_ev_stream, natsStatus_GetText(s), (int)je);
    return -1;
  }
  jsStreamConfig_Init(&sc);
  sc.Name = g_snap_stream;
  sc.Subjects = snap_subj;
  sc.SubjectsLen = 1;
  sc.Storage = js_FileStorage;
  sc.MaxMsgsPerSubject = 1; /* the head: newest only; chunk subjects are unique */
  s = js_AddStream(&si, js, &sc, NULL, &je);
  if (si) jsStreamInfo_Destroy(si);
  if (s != NATS_OK && je != JSStreamNameExistErr) {
    logf_("create stream %s: %s (%d)", g_snap_stream, natsStatus_GetText(s), (int)je);
    return -1;
  }
  return 0;
}

static int stream_state(jsCtx *js, uint64_t *first, uint64_t *last, uint64_t *msgs) {
  jsStreamInfo *si = NULL;
  jsErrCode je = 0;
  if (js_GetStreamInfo(&si, js, g_ev_stream, NULL, &je) != NATS_OK || !si) return -1;
  *first = si->State.FirstSeq;
  *last = si->State.LastSeq;
  *msgs = si->State.Msgs;
  jsStreamInfo_Destroy(si);
  return 0;
}

/* ---- bridge -------------------------------------------------------------------- */
typedef struct {
  atomic_ullong acked, dups, failed;
} pub_counters;

static void on_pub_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure) {
  pub_counters *c = closure;
  (void)js;
  if (pa) {
    atomic_fetch_add(&c->acked, 1);
    if (pa->Duplicate) atomic_fetch_add(&c->dups, 1);
  } else if (pae) {
    atomic_fetch_add(&c->failed, 1);
  }
  natsMsg_Destroy(msg);
}

/* Last event id the stream holds for worker w (0 = none); -1 on error. */
static int stream_last_id(jsCtx *js, uint64_t w, uint64_t *out) {
  char subj[160];
  natsMsg *m = NULL;
  jsErrCode je = 0;
  natsStatus s;
  snprintf(subj, sizeof subj, "%s.ev.%llu", g_prefix, (unsigned long long)w);
  s = js_GetLastMsg(&m, js, g_ev_stream, subj, NULL, &je);
  if (s == NATS_NOT_FOUND || je == JSNoMessageFoundErr) {
    *out = 0;
    return 0;
  }
  if (s != NATS_OK) return -1;
  {
    const char *d = natsMsg_GetData(m), *p = d;
    int rc = next_u64(&p, d + natsMsg_GetDataLength(m), out);
    natsMsg_Destroy(m);
    return rc;
  }
}

static int run_bridge(int argc, char **argv) {
  const char *url = NULL, *file = NULL;
  double rate = 0, max_seconds = 0;
  long window = 256;
  uint64_t rewind_n = 0;
  retention ret = {0, 0, 0, 0};
  pub_counters pc;
  worker_table *wt = calloc(1, sizeof *wt);
  unsigned long long published = 0, skipped = 0, reconnects = 0, lines_total = 0;
  double t_start, t_first = 0;
  int i;
  if (!wt) die("out of memory");
  for (i = 2; i < argc; i++) {
#define ARG(name) (!strcmp(argv[i], name) && i + 1 < argc)
    if (ARG("--nats")) url = argv[++i];
    else if (ARG("--file")) file = argv[++i];
    else if (ARG("--rate")) rate = atof(argv[++i]);
    else if (ARG("--window")) window = atol(argv[++i]);
    else if (ARG("--rewind")) rewind_n = strtoull(argv[++i], NULL, 10);
    else if (ARG("--prefix")) g_prefix = argv[++i];
    else if (ARG("--max-seconds")) max_seconds = atof(argv[++i]);
    else if (ARG("--max-age")) ret.max_age_s = atol(argv[++i]);
    else if (ARG("--max-msgs")) ret.max_msgs = atol(argv[++i]);
    else if (ARG("--max-bytes")) ret.max_bytes = atol(argv[++i]);
    else if (ARG("--dup-window")) ret.dup_window_s = atol(argv[++i]);
    else die("bridge: unknown or incomplete option %s", argv[i]);
  }
  if (!url || !file) die("bridge needs --nats URL --file EVENTS (the vLLM ZMQ feed is not wired in yet)");
  if (window < 1) window = 1;
  set_names();
  memset(&pc, 0, sizeof pc);
  t_start = now_s();

  /* One pass over the file per connection: a lost connection ends the pass;
   * the next one resumes per worker after what the stream holds. */
  for (;;) {
    nats_link l;
    jsOptions jo;
    FILE *f;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long in_window = 0;
    int failed = 0;
    double t_rate0 = now_s();
    unsigned long long sent_this_pass = 0;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = window * 2;
    jo.PublishAsync.AckHandler = on_pub_ack;
    jo.PublishAsync.AckHandlerClosure = &pc;
    jo.Wait = 2000;
    if (nats_open(&l, url, 0, now_s() + 60, &jo) != 0) die("giving up");
    if (ensure_streams(l.js, &ret) != 0) {
      nats_close(&l);
      sleep_ms(200);
      continue;
    }
    memset(wt->next_id, 0, sizeof wt->next_id);
    memset(wt->known, 0, sizeof wt->known);
    f = fopen(file, "r");
    if (!f) die("%s: %s", file, strerror(errno));
    lines_total = 0;
    while (!g_stop && (len = getline(&line, &cap, f)) > 0) {
      uint64_t w, id;
      size_t k;
      natsMsg *m = NULL;
      char subj[160], msgid[64];
      lines_total++;
      if (line[len - 1] == '\n') line[--len] = 0;
      if (line_worker(line, (size_t)len, &w) != 0) continue; /* Q lines, blanks */
      k = worker_slot(wt, w);
      id = ++wt->next_id[k];
      if (!wt->known[k]) {
        uint64_t last;
        if (stream_last_id(l.js, w, &last) != 0) {
          failed = 1;
          break;
        }
        wt->resume[k] = last > rewind_n ? last - rewind_n : 0;
        wt->known[k] = 1;
        if (last) logf_("worker %llu: stream holds events up to %llu; resuming after %llu",
                        (unsigned long long)w, (unsigned long long)last,
                        (unsigned long long)wt->resume[k]);
      }
      if (id <= wt->resume[k]) {
        skipped++;
        continue;
      }
      snprintf(subj, sizeof subj, "%s.ev.%llu", g_prefix, (unsigned long long)w);
      snprintf(msgid, sizeof msgid, "%llu:%llu", (unsigned long long)w, (unsigned long long)id);
      {
        char *payload = xrealloc(NULL, (size_t)len + 24);
        int pl = snprintf(payload, (size_t)len + 24, "%llu %s", (unsigned long long)id, line);
        if (natsMsg_Create(&m, subj, NULL, payload, pl) != NATS_OK ||
            natsMsgHeader_Set(m, "Nats-Msg-Id", msgid) != NATS_OK) {
          free(payload);
          die("natsMsg_Create failed");
        }
        free(payload);
      }
      if (!t_first) t_first = now_s();
      if (js_PublishMsgAsync(l.js, &m, NULL) != NATS_OK) {
        natsMsg_Destroy(m);
        failed = 1;
        break;
      }
      published++;
      sent_this_pass++;
      if (++in_window >= window) {
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MaxWait = 5000;
        in_window = 0;
        if (js_PublishAsyncComplete(l.js, &po) != NATS_OK || atomic_load(&pc.failed)) {
          failed = 1;
          break;
        }
        if (rate > 0) {
          double due = t_rate0 + (double)sent_this_pass / rate, t = now_s();
          if (due > t) sleep_ms((long)((due - t) * 1000));
        }
        if (max_seconds > 0 && now_s() - t_start > max_seconds) g_stop = 1;
      }
    }
    free(line);
    fclose(f);
    if (!failed && !g_stop) {
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MaxWait = 5000;
      if (js_PublishAsyncComplete(l.js, &po) != NATS_OK || atomic_load(&pc.failed)) failed = 1;
    }
    if (failed) {
      natsMsgList pending = {NULL, 0};
      if (js_PublishAsyncGetPendingList(&pending, l.js) == NATS_OK) natsMsgList_Destroy(&pending);
      nats_close(&l);
      atomic_store(&pc.failed, 0);
      reconnects++;
      logf_("publish failed (connection lost?); reconnecting and resuming from the stream's state");
      sleep_ms(100);
      continue;
    }
    {
      double t_end = now_s(), span = t_first ? t_end - t_first : 0;
      uint64_t first = 0, last = 0, msgs = 0;
      stream_state(l.js, &first, &last, &msgs);
      printf("bridge: published=%llu acked=%llu duplicates_dropped_by_stream=%llu skipped_already_in_stream=%llu "
             "reconnects=%llu lines=%llu secs=%.3f events_per_s=%.0f stream_msgs=%llu stream_last=%llu\n",
             published, (unsigned long long)atomic_load(&pc.acked),
             (unsigned long long)atomic_load(&pc.dups), skipped, reconnects, lines_total, span,
             span > 0 ? (double)published / span : 0.0, (unsigned long long)msgs,
             (unsigned long long)last);
      fflush(stdout);
    }
    nats_close(&l);
    break;
  }
  free(wt);
  return g_stop ? 1 : 0;
}

/* ---- replica: shared state with the query thread ---------------------------------- */
static pthread_rwlock_t g_ix_lock = PTHREAD_RWLOCK_INITIALIZER; /* guards the swap */
static kvidx *g_ix;
static atomic_int g_ready;
static char g_not_ready[512] = "starting";
static pthread_mutex_t g_reason_lock = PTHREAD_MUTEX_INITIALIZER;
static apply_counters g_ac;
static atomic_ullong g_applied_seq, g_snap_written, g_snap_loaded_seq, g_rebuilds;
static atomic_int g_snap_request; /* SNAPSHOT: write one at the next chance */

static void set_not_ready(const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&g_reason_lock);
  va_start(ap, fmt);
  vsnprintf(g_not_ready, sizeof g_not_ready, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&g_reason_lock);
  atomic_store(&g_ready, 0);
}

typedef struct {
  char *p;
  size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    size_t room = b->cap - b->n;
    int k;
    va_start(ap, fmt);
    k = vsnprintf(b->p ? b->p + b->n : NULL, room, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < room) {
      b->n += (size_t)k;
      return;
    }
    b->cap = b->n + (size_t)k + 256;
    b->p = xrealloc(b->p, b->cap);
  }
}

/* One answer line for MATCHH: the format the reference (direct) prints too. */
static void answer_matches(const kvidx *ix, const uint64_t *loc, size_t n, sbuf *out) {
  static kvidx_score sc[MAX_SCORES];
  size_t m = kvidx_find_matches(ix, loc, n, sc, MAX_SCORES), i;
  sb_printf(out, "OK blocks=%zu matches=%zu", n, m);
  for (i = 0; i < m && i < MAX_SCORES; i++)
    sb_printf(out, " %llu:%u:%u", (unsigned long long)sc[i].worker_id, sc[i].dp_rank, sc[i].depth);
  sb_printf(out, "\n");
}

/* "h h h ..." -> locals; -1 if malformed */
static long parse_hashes(const char *p, const char *end, uint64_t **loc, size_t *cap) {
  size_t n = 0;
  for (;;) {
    uint64_t v;
    while (p < end && (*p == ' ' || *p == '\r')) p++;
    if (p >= end) break;
    if (next_u64(&p, end, &v)) return -1;
    if (n == *cap) {
      *cap = *cap ? *cap * 2 : 64;
      *loc = xrealloc(*loc, *cap * sizeof **loc);
    }
    (*loc)[n++] = v;
  }
  return (long)n;
}

/* 1 (and the reason told) while the replica is not ready to answer. */
static int refuse_not_ready(sbuf *out) {
  if (atomic_load(&g_ready)) return 0;
  pthread_mutex_lock(&g_reason_lock);
  sb_printf(out, "ERR not ready: %s\n", g_not_ready);
  pthread_mutex_unlock(&g_reason_lock);
  return 1;
}

static void on_query_line(char *line, size_t len, sbuf *out) {
  static uint64_t *loc;
  static size_t loc_cap;
  if (len && line[len - 1] == '\r') line[--len] = 0;
  if (!strcmp(line, "PING")) {
    sb_printf(out, "OK pong\n");
  } else if (!strncmp(line, "MATCHH", 6) && (len == 6 || line[6] == ' ')) {
    long n = parse_hashes(line + 6, line + len, &loc, &loc_cap);
    if (n < 0) {
      sb_printf(out, "ERR bad number\n");
    } else if (!refuse_not_ready(out)) {
      pthread_rwlock_rdlock(&g_ix_lock);
      answer_matches(g_ix, loc, (size_t)n, out);
      pthread_rwlock_unlock(&g_ix_lock);
    }
  } else if (!strncmp(line, "MATCH ", 6) || !strcmp(line, "MATCH")) {
    /* MATCH [lora=NAME] tok tok ...: local hashes of the full blocks */
    static uint32_t *tok;
    static size_t tok_cap;
    const char *p = line + 5, *end = line + len;
    uint64_t seed = KVIDX_SEED, v;
    size_t n = 0;
    int bad = 0;
    while (p < end && *p == ' ') p++;
    if (!strncmp(p, "lora=", 5)) {
      char name[256];
      size_t k = 0;
      for (p += 5; p < end && *p != ' ' && k < sizeof name - 1;) name[k++] = *p++;
      name[k] = 0;
      seed = kvidx_hash_seed(name, NULL);
    }
    for (;;) {
      while (p < end && *p == ' ') p++;
      if (p >= end) break;
      if (next_u64(&p, end, &v) || v > UINT32_MAX) {
        bad = 1;
        break;
      }
      if (n == tok_cap) tok_cap = tok_cap ? tok_cap * 2 : 256, tok = xrealloc(tok, tok_cap * sizeof *tok);
      tok[n++] = (uint32_t)v;
    }
    if (n / g_block_size + 1 > loc_cap) {
      loc_cap = n / g_block_size + 1;
      loc = xrealloc(loc, loc_cap * sizeof *loc);
    }
    if (bad) {
      sb_printf(out, "ERR bad number\n");
    } else if (!refuse_not_ready(out)) {
      n = kvidx_block_hashes(tok, n, g_block_size, seed, loc);
      pthread_rwlock_rdlock(&g_ix_lock);
      answer_matches(g_ix, loc, n, out);
      pthread_rwlock_unlock(&g_ix_lock);
    }
  } else if (!strncmp(line, "WORKER ", 7)) {
    const char *p = line + 7;
    uint64_t w;
    if (next_u64(&p, line + len, &w)) {
      sb_printf(out, "ERR usage: WORKER wid\n");
    } else if (!refuse_not_ready(out)) {
      pthread_rwlock_rdlock(&g_ix_lock);
      sb_printf(out, "OK blocks=%zu\n", kvidx_worker_blocks(g_ix, w, 0));
      pthread_rwlock_unlock(&g_ix_lock);
    }
  } else if (!strcmp(line, "SNAPSHOT")) {
    atomic_store(&g_snap_request, 1);
    sb_printf(out, "OK snapshot requested\n");
  } else if (!strcmp(line, "STATUS")) {
    sb_printf(out,
              "OK ready=%d applied_seq=%llu events=%llu dup_skipped=%llu redelivered=%llu gaps=%llu "
              "errors=%llu malformed=%llu snapshots_written=%llu snapshot_loaded_seq=%llu rebuilds=%llu\n",
              atomic_load(&g_ready), (unsigned long long)atomic_load(&g_applied_seq),
              (unsigned long long)atomic_load(&g_ac.events),
              (unsigned long long)atomic_load(&g_ac.dup_skipped),
              (unsigned long long)atomic_load(&g_ac.redelivered),
              (unsigned long long)atomic_load(&g_ac.gaps), (unsigned long long)atomic_load(&g_ac.errors),
              (unsigned long long)atomic_load(&g_ac.malformed),
              (unsigned long long)atomic_load(&g_snap_written),
              (unsigned long long)atomic_load(&g_snap_loaded_seq),
              (unsigned long long)atomic_load(&g_rebuilds));
  } else {
    sb_printf(out, "ERR unknown command (PING MATCH MATCHH WORKER STATUS SNAPSHOT)\n");
  }
}

typedef struct {
  int fd;
  char *buf;
  size_t len;
} client;

static void send_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    s += w;
    n -= (size_t)w;
  }
}

static int g_listen_fd = -1;

static void *query_thread(void *arg) {
  client cl[MAX_CLIENTS];
  sbuf out = {NULL, 0, 0};
  int nc = 0, k;
  (void)arg;
  memset(cl, 0, sizeof cl);
  while (!g_stop) {
    struct pollfd pf[MAX_CLIENTS + 1];
    pf[0].fd = g_listen_fd;
    pf[0].events = POLLIN;
    for (k = 0; k < nc; k++) pf[k + 1].fd = cl[k].fd, pf[k + 1].events = POLLIN;
    if (poll(pf, (nfds_t)nc + 1, 200) <= 0) continue;
    if (pf[0].revents & POLLIN) {
      int fd = accept(g_listen_fd, NULL, NULL);
      if (fd >= 0 && nc < MAX_CLIENTS) {
        cl[nc].fd = fd;
        cl[nc].len = 0;
        if (!cl[nc].buf) cl[nc].buf = xrealloc(NULL, MAX_LINE + 1);
        nc++;
      } else if (fd >= 0) {
        close(fd);
      }
    }
    for (k = nc - 1; k >= 0; k--) {
      char *nl;
      ssize_t r;
      if (!(pf[k + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      r = recv(cl[k].fd, cl[k].buf + cl[k].len, MAX_LINE - cl[k].len, 0);
      if (r > 0) {
        cl[k].len += (size_t)r;
        while ((nl = memchr(cl[k].buf, '\n', cl[k].len)) != NULL) {
          size_t ll = (size_t)(nl - cl[k].buf);
          *nl = 0;
          out.n = 0;
          on_query_line(cl[k].buf, ll, &out);
          send_all(cl[k].fd, out.p, out.n);
          memmove(cl[k].buf, nl + 1, cl[k].len - ll - 1);
          cl[k].len -= ll + 1;
        }
      }
      if (r <= 0 || cl[k].len == MAX_LINE) {
        char *keep = cl[k].buf;
        close(cl[k].fd);
        cl[k] = cl[nc - 1];
        cl[nc - 1].buf = keep;
        nc--;
      }
    }
  }
  for (k = 0; k < MAX_CLIENTS; k++) free(cl[k].buf);
  free(out.p);
  return NULL;
}

static int listen_unix(const char *path) {
  struct sockaddr_un a;
  int fd;
  if (strlen(path) >= sizeof a.sun_path) die("socket path too long: %s", path);
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, path, strlen(path) + 1);
  unlink(path);
  fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0)
    die("listen on %s: %s", path, strerror(errno));
  return fd;
}

/* ---- replica: snapshots in NATS --------------------------------------------------
 * A snapshot is chunks on  P.snap.chunk.<id>.<i>  (256 KiB each) and then a
 * head on  P.snap.head:  "v1 id=<id> covers=<stream seq> chunks=<n> bytes=<b>".
 * The head subject keeps one message (the newest).  After publishing a head
 * the writer purges the chunks older than the previous head's; a reader that
 * still loses that race sees a missing chunk and starts over from the new
 * head. */
typedef struct {
  unsigned char *p;
  size_t n, cap, off;
} membuf;

static int mem_write(void *ctx, const void *buf, size_t len) {
  membuf *b = ctx;
  if (b->n + len > b->cap) {
    b->cap = (b->n + len) * 2;
    b->p = xrealloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, buf, len);
  b->n += len;
  return 0;
}

static size_t mem_read(void *ctx, void *buf, size_t len) {
  membuf *b = ctx;
  size_t k = b->n - b->off < len ? b->n - b->off : len;
  memcpy(buf, b->p + b->off, k);
  b->off += k;
  return k;
}

typedef struct {
  char id[96];
  uint64_t covers, chunks, bytes, first; /* first: its first chunk's sequence */
} snap_head;

static int read_head(jsCtx *js, snap_head *h) {
  natsMsg *m = NULL;
  jsErrCode je = 0;
  char buf[256];
  int len;
  unsigned long long covers, chunks, bytes, first = 0;
  natsStatus s = js_GetLastMsg(&m, js, g_snap_stream, g_snap_head, NULL, &je);
  if (s != NATS_OK) return (s == NATS_NOT_FOUND || je == JSNoMessageFoundErr) ? 1 : -1;
  len = natsMsg_GetDataLength(m);
  if (len >= (int)sizeof buf) len = (int)sizeof buf - 1;
  memcpy(buf, natsMsg_GetData(m), (size_t)len);
  buf[len] = 0;
  natsMsg_Destroy(m);
  if (sscanf(buf, "v1 id=%95s covers=%llu chunks=%llu bytes=%llu first=%llu", h->id, &covers, &chunks,
             &bytes, &first) < 4)
    return -1;
  h->covers = covers, h->chunks = chunks, h->bytes = bytes, h->first = first;
  return 0;
}

/* Loads the newest snapshot into ix (empty).  1 = none, 0 = loaded, -1 =
 * unusable (ix left empty). */
static int snapshot_load(jsCtx *js, kvidx *ix, snap_head *h) {
  membuf b = {NULL, 0, 0, 0};
  uint64_t i;
  int rc = read_head(js, h);
  if (rc != 0) return rc;
  if (h->bytes > ((uint64_t)1 << 36) || h->chunks > h->bytes / CHUNK_BYTES + 1) return -1;
  for (i = 0; i < h->chunks; i++) {
    char subj[256];
    natsMsg *m = NULL;
    jsErrCode je = 0;
    snprintf(subj, sizeof subj, "%s.snap.chunk.%s.%llu", g_prefix, h->id, (unsigned long long)i);
    if (js_GetLastMsg(&m, js, g_snap_stream, subj, NULL, &je) != NATS_OK) {
      free(b.p);
      return -1; /* purged under us: a newer head exists */
    }
    mem_write(&b, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
    natsMsg_Destroy(m);
  }
  if (b.n != h->bytes) {
    free(b.p);
    return -1;
  }
  rc = kvidx_snapshot_read(ix, mem_read, &b);
  free(b.p);
  if (rc != KVIDX_OK) {
    logf_("snapshot %s: %s", h->id, kvidx_strerror(rc));
    return -1;
  }
  return 0;
}

/* Writes ix as a snapshot covering stream sequence `covers`, unless the head
 * already covers as much (another replica was faster). */
static int snapshot_write(jsCtx *js, const kvidx *ix, uint64_t covers, const char *name) {
  membuf b = {NULL, 0, 0, 0};
  snap_head h;
  char id[96], subj[256], head[256];
  size_t off;
  uint64_t i = 0, first_chunk_seq = 0;
  jsErrCode je = 0;
  int rc, have_prev = read_head(js, &h) == 0;
  if (have_prev && h.covers >= covers) return 0;
  rc = kvidx_snapshot_write(ix, mem_write, &b);
  if (rc != KVIDX_OK) {
    free(b.p);
    logf_("snapshot write: %s", kvidx_strerror(rc));
    return -1;
  }
  snprintf(id, sizeof id, "%s-%llu", name, (unsigned long long)covers);
  for (off = 0; off < b.n || (b.n == 0 && i == 0); off += CHUNK_BYTES, i++) {
    size_t k = b.n - off < CHUNK_BYTES ? b.n - off : CHUNK_BYTES;
    snprintf(subj, sizeof subj, "%s.snap.chunk.%s.%llu", g_prefix, id, (unsigned long long)i);
    jsPubAck *pa = NULL;
    if (js_Publish(&pa, js, subj, b.p ? b.p + off : (const void *)"", (int)k, NULL, &je) != NATS_OK) {
      free(b.p);
      return -1;
    }
    if (i == 0) first_chunk_seq = pa->Sequence;
    jsPubAck_Destroy(pa);
    if (b.n == 0) {
      i++;
      break;
    }
  }
  snprintf(head, sizeof head, "v1 id=%s covers=%llu chunks=%llu bytes=%zu first=%llu", id,
           (unsigned long long)covers, (unsigned long long)i, b.n, (unsigned long long)first_chunk_seq);
  free(b.p);
  if (js_Publish(NULL, js, g_snap_head, head, (int)strlen(head), NULL, &je) != NATS_OK) return -1;
  if (have_prev && h.first > 1) {
    /* the chunks before the previous head's go, whoever wrote them (also
     * those of a writer that died before its head).  The previous snapshot
     * stays loadable for one more interval: a replica still reading it is
     * not cut short.  (Sequence 1 would mean "no bound" to the server.) */
    jsOptions o;
    char filt[256];
    jsOptions_Init(&o);
    snprintf(filt, sizeof filt, "%s.snap.chunk.>", g_prefix);
    o.Stream.Purge.Subject = filt;
    o.Stream.Purge.Sequence = h.first;
    js_PurgeStream(js, g_snap_stream, &o, &je);
  }
  atomic_fetch_add(&g_snap_written, 1);
  return 0;
}

/* ---- replica main loop --------------------------------------------------------------- */
static size_t g_blocks_per_worker; /* --blocks-per-worker: the engines' KV cache size */

static kvidx *new_index(void) {
  kvidx_config cfg;
  kvidx *ix = NULL;
  memset(&cfg, 0, sizeof cfg);
  cfg.kind = KVIDX_POSITIONAL;
  cfg.blocks_per_worker = g_blocks_per_worker;
  if (kvidx_create(&ix, &cfg) != KVIDX_OK) die("kvidx_create failed");
  return ix;
}

static void swap_index(kvidx *ix) {
  kvidx *old;
  pthread_rwlock_wrlock(&g_ix_lock);
  old = g_ix;
  g_ix = ix;
  pthread_rwlock_unlock(&g_ix_lock);
  if (old) kvidx_destroy(old);
}

/* Deletes this replica's consumers but `keep`: a dead process's position is
 * void.  Done once caught up, not before: on nats-server 2.9.10 a pull
 * consumer created right after deleting the consumer of a killed client
 * delivered at a crawl (about 256 messages per 0.3 s) for seconds. */
static void delete_consumers(jsCtx *js, const char *base, const char *keep) {
  jsConsumerNamesList *names = NULL;
  jsErrCode je = 0;
  size_t bl = strlen(base);
  int k;
  if (js_ConsumerNames(&names, js, g_ev_stream, NULL, &je) != NATS_OK || !names) return;
  for (k = 0; k < names->Count; k++) {
    const char *n = names->List[k];
    if (!strncmp(n, base, bl) && n[bl] == '_' && (!keep || strcmp(n, keep)))
      js_DeleteConsumer(js, g_ev_stream, n, NULL, &je);
  }
  jsConsumerNamesList_Destroy(names);
}

static char g_consumer[192]; /* the current consumer's name */

static int make_consumer(jsCtx *js, natsSubscription **sub, const char *base, uint64_t start) {
  jsSubOptions so;
  jsErrCode je = 0;
  natsStatus s;
  char *durable = g_consumer;
  static unsigned serial;
  snprintf(g_consumer, sizeof g_consumer, "%s_%ld_%u", base, (long)getpid(), ++serial);
  jsSubOptions_Init(&so);
  so.Stream = g_ev_stream;
  so.Config.Durable = durable;
  so.Config.DeliverPolicy = js_DeliverByStartSequence;
  so.Config.OptStartSeq = start ? start : 1;
  so.Config.AckPolicy = js_AckAll;
  so.Config.MaxAckPending = 100000;
  so.Config.FilterSubject = g_ev_subjects;
  s = js_PullSubscribe(sub, js, g_ev_subjects, durable, NULL, &so, &je);
  if (s != NATS_OK) {
    logf_("pull subscribe from %llu: %s (%d)", (unsigned long long)start, natsStatus_GetText(s), (int)je);
    return -1;
  }
  return 0;
}

static int run_replica(int argc, char **argv) {
  const char *url = NULL, *name = NULL, *sock = NULL;
  uint64_t snap_every = 10000;
  double snap_secs = 5, max_seconds = 0;
  int use_snapshot = 1, batch = 256, i;
  retention ret = {0, 0, 0, 0};
  char durable[128];
  nats_link l;
  pthread_t qt;
  scratch sc = {NULL, NULL, 0, 0};
  double t0 = now_s();
  for (i = 2; i < argc; i++) {
    if (ARG("--nats")) url = argv[++i];
    else if (ARG("--name")) name = argv[++i];
    else if (ARG("--listen")) sock = argv[++i];
    else if (ARG("--snap-every")) snap_every = strtoull(argv[++i], NULL, 10);
    else if (ARG("--snap-secs")) snap_secs = atof(argv[++i]);
    else if (ARG("--batch")) batch = atoi(argv[++i]);
    else if (ARG("--block-size")) g_block_size = (size_t)strtoull(argv[++i], NULL, 10);
    else if (ARG("--blocks-per-worker")) g_blocks_per_worker = (size_t)strtoull(argv[++i], NULL, 10);
    else if (ARG("--prefix")) g_prefix = argv[++i];
    else if (ARG("--max-seconds")) max_seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--no-snapshot")) use_snapshot = 0;
    else die("replica: unknown or incomplete option %s", argv[i]);
  }
  if (!url || !name || !sock) die("replica needs --nats URL --name NAME --listen SOCKET_PATH");
  if (!g_block_size) die("--block-size must be >= 1");
  if (batch < 1) batch = 1;
  set_names();
  snprintf(durable, sizeof durable, "%s-%s", g_prefix, name);
  swap_index(new_index());
  g_listen_fd = listen_unix(sock);
  if (pthread_create(&qt, NULL, query_thread, NULL) != 0) die("pthread_create failed");
  if (nats_open(&l, url, 1, now_s() + 60, NULL) != 0) die("giving up");
  while (ensure_streams(l.js, &ret) != 0 && !g_stop) sleep_ms(200);

  /* One epoch per index: (re)build from the newest usable snapshot, then
   * follow the stream.  A hole in the stream ends the epoch. */
  while (!g_stop) {
    kvidx *ix = new_index();
    snap_head h;
    uint64_t start = 1, first = 0, last = 0, msgs = 0, target, since_snap = 0;
    double t_epoch = now_s(), t_loaded, t_last_snap, t_ready = 0;
    natsSubscription *sub = NULL;
    int rc = 1, tries, hole = 0, fetch_errors = 0;
    memset(&h, 0, sizeof h);
    if (use_snapshot) {
      for (tries = 0; tries < 10; tries++) {
        rc = snapshot_load(l.js, ix, &h);
        if (rc >= 0) break;
        kvidx_destroy(ix);
        ix = new_index();
        sleep_ms(100);
      }
      if (rc == 0) {
        start = h.covers + 1;
        atomic_store(&g_snap_loaded_seq, h.covers);
        logf_("loaded snapshot %s covering stream seq %llu in %.3f s", h.id,
              (unsigned long long)h.covers, now_s() - t_epoch);
      } else {
        logf_(rc > 0 ? "no snapshot yet: replaying the stream from the start"
                     : "no usable snapshot: replaying the stream from the start");
      }
    }
    t_loaded = now_s();
    if (stream_state(l.js, &first, &last, &msgs) != 0) {
      kvidx_destroy(ix);
      sleep_ms(200);
      continue;
    }
    /* an empty stream reports first = last + 1 (or 0 when never written) */
    if (first > start && !(msgs == 0 && last + 1 <= start)) {
      set_not_ready("stream trimmed past snapshot: it starts at seq %llu, the %s covers up to %llu; "
                    "events %llu..%llu are gone. Waiting for a newer snapshot (rebuild)",
                    (unsigned long long)first, rc == 0 ? "snapshot" : "empty index",
                    (unsigned long long)(start - 1), (unsigned long long)start,
                    (unsigned long long)(first - 1));
      logf_("%s", g_not_ready);
      kvidx_destroy(ix);
      atomic_fetch_add(&g_rebuilds, 1);
      for (tries = 0; tries < 10 && !g_stop; tries++) sleep_ms(100);
      continue;
    }
    target = last;
    atomic_store(&g_applied_seq, start - 1);
    if (make_consumer(l.js, &sub, durable, start) != 0) {
      kvidx_destroy(ix);
      sleep_ms(200);
      continue;
    }
    /* Queries see the new index only when it has caught up (never a cold or
     * partial one). */
    t_last_snap = now_s();
    if (start - 1 >= target) {
      swap_index(ix);
      atomic_store(&g_ready, 1);
      t_ready = now_s();
      delete_consumers(l.js, durable, g_consumer);
      printf("replica %s: caught up at seq %llu: snapshot %s (covers %llu) loaded in %.3f s, "
             "0 events replayed in 0.000 s, total %.3f s\n",
             name, (unsigned long long)target, rc == 0 ? h.id : "none",
             (unsigned long long)(start - 1), t_loaded - t_epoch, t_ready - t_epoch);
      fflush(stdout);
    } else {
      set_not_ready("catching up from seq %llu to %llu", (unsigned long long)start,
                    (unsigned long long)target);
    }
    while (!g_stop && !hole) {
      natsMsgList list = {NULL, 0};
      double t_fetch = now_s();
      natsStatus s = natsSubscription_Fetch(&list, sub, batch, 500, NULL);
      int k;
      if (g_debug && !t_ready)
        logf_("fetch: %s, %d msgs in %.3f s", natsStatus_GetText(s), list.Count, now_s() - t_fetch);
      natsMsg *to_ack = NULL;
      uint64_t applied = atomic_load(&g_applied_seq);
      if (max_seconds > 0 && now_s() - t0 > max_seconds) g_stop = 1;
      if (s != NATS_OK && s != NATS_TIMEOUT) {
        /* server restarting: the client reconnects by itself; if the
         * subscription stays broken, make a new consumer from where we are */
        if (++fetch_errors > 20) {
          natsSubscription_Destroy(sub);
          sub = NULL;
          while (!g_stop && make_consumer(l.js, &sub, durable, applied + 1) != 0) sleep_ms(200);
          fetch_errors = 0;
        } else {
          sleep_ms(100);
        }
        continue;
      }
      fetch_errors = 0;
      for (k = 0; k < list.Count; k++) {
        natsMsg *m = list.Msgs[k];
        jsMsgMetaData *md = NULL;
        uint64_t seq;
        if (natsMsg_GetMetaData(&md, m) != NATS_OK) continue;
        seq = md->Sequence.Stream;
        jsMsgMetaData_Destroy(md);
        if (seq <= applied) {
          atomic_fetch_add(&g_ac.redelivered, 1);
          to_ack = m;
          continue;
        }
        if (seq != applied + 1) {
          hole = 1;
          set_not_ready("stream trimmed under this replica: next event is seq %llu, applied up to %llu; rebuilding",
                        (unsigned long long)seq, (unsigned long long)applied);
          logf_("%s", g_not_ready);
          break;
        }
        {
          const char *d = natsMsg_GetData(m), *p = d, *end = d + natsMsg_GetDataLength(m);
          uint64_t id;
          if (next_u64(&p, end, &id) == 0 && p < end && *p == ' ') {
            p++;
            apply_line(ix, id, p, (size_t)(end - p), &sc, &g_ac);
          } else {
            atomic_fetch_add(&g_ac.malformed, 1);
          }
        }
        applied = seq;
        atomic_store(&g_applied_seq, seq);
        since_snap++;
        to_ack = m;
      }
      if (to_ack) natsMsg_Ack(to_ack, NULL); /* ack-all: everything up to it */
      natsMsgList_Destroy(&list);
      if (hole) break;
      if (!t_ready && applied >= target) {
        swap_index(ix);
        atomic_store(&g_ready, 1);
        t_ready = now_s();
        delete_consumers(l.js, durable, g_consumer);
        printf("replica %s: caught up at seq %llu: snapshot %s (covers %llu) loaded in %.3f s, "
               "%llu events replayed in %.3f s, total %.3f s\n",
               name, (unsigned long long)target, rc == 0 ? h.id : "none",
               (unsigned long long)(start - 1), t_loaded - t_epoch,
               (unsigned long long)(target - (start - 1)), t_ready - t_loaded, t_ready - t_epoch);
        fflush(stdout);
      }
      if (t_ready && (atomic_exchange(&g_snap_request, 0) ||
                      (since_snap > 0 && ((snap_every && since_snap >= snap_every) ||
                                          now_s() - t_last_snap >= snap_secs)))) {
        if (snapshot_write(l.js, ix, applied, name) == 0) since_snap = 0;
        t_last_snap = now_s();
      }
    }
    if (sub) natsSubscription_Destroy(sub);
    if (hole) {
      atomic_fetch_add(&g_rebuilds, 1);
      if (!t_ready) kvidx_destroy(ix);
      continue;
    }
    if (!t_ready) kvidx_destroy(ix);
  }
  atomic_store(&g_ready, 0);
  pthread_join(qt, NULL);
  close(g_listen_fd);
  unlink(sock);
  nats_close(&l);
  swap_index(NULL);
  free(sc.blk);
  free(sc.seqs);
  return 0;
}

/* ---- bridge input: vLLM's ZeroMQ KV event feed ------------------------------------- */
#include "fleet_vllm.h"

/* ---- direct (reference), ask, info, purge ----------------------------------------- */
static int run_direct(int argc, char **argv) {
  const char *file = NULL, *qout = NULL;
  long every = 10, max_q = 2000, nq = 0, nlines = 0;
  worker_table *wt = calloc(1, sizeof *wt);
  scratch sc = {NULL, NULL, 0, 0};
  apply_counters c;
  kvidx *ix = new_index();
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  FILE *f, *q;
  sbuf out = {NULL, 0, 0};
  uint64_t *loc = NULL;
  size_t loc_cap = 0, qcap = 0;
  char **qs = NULL;
  long i;
  if (!wt) die("out of memory");
  memset(&c, 0, sizeof c);
  for (i = 2; i < argc; i++) {
    if (ARG("--file")) file = argv[++i];
    else if (ARG("--queries-out")) qout = argv[++i];
    else if (ARG("--query-every")) every = atol(argv[++i]);
    else if (ARG("--max-queries")) max_q = atol(argv[++i]);
    else die("direct: unknown or incomplete option %s", argv[i]);
  }
  if (!file || !qout) die("direct needs --file EVENTS --queries-out PATH");
  if (every < 1) every = 1;
  f = fopen(file, "r");
  if (!f) die("%s: %s", file, strerror(errno));
  q = fopen(qout, "w");
  if (!q) die("%s: %s", qout, strerror(errno));
  while ((len = getline(&line, &cap, f)) > 0) {
    uint64_t w;
    if (line[len - 1] == '\n') line[--len] = 0;
    if (line[0] == 'Q' && len > 2) {
      /* "Q n h h ..." -> "MATCHH h h ..." for every `every`-th query */
      const char *p = line + 1;
      uint64_t n;
      if (nlines++ % every || next_u64(&p, line + len, &n)) continue;
      /* keep the last max_q: recent queries probe what the final index holds */
      if (nq == (long)qcap) {
        qcap = qcap ? qcap * 2 : 1024;
        qs = xrealloc(qs, qcap * sizeof *qs);
      }
      qs[nq] = xrealloc(NULL, strlen(p) + 1);
      memcpy(qs[nq++], p, strlen(p) + 1);
      continue;
    }
    if (line_worker(line, (size_t)len, &w) != 0) continue;
    apply_line(ix, ++wt->next_id[worker_slot(wt, w)], line, (size_t)len, &sc, &c);
  }
  fclose(f);
  for (i = 0; i < nq; i++) {
    if (i >= nq - max_q) fprintf(q, "MATCHH%s\n", qs[i]);
    free(qs[i]);
  }
  free(qs);
  if (nq > max_q) nq = max_q;
  /* and every worker's holdings count */
  for (i = 0; i < (long)MAX_WORKERS; i++)
    if (wt->used[i]) fprintf(q, "WORKER %llu\n", (unsigned long long)wt->wid[i]), nq++;
  fclose(q);
  /* answer the query set against the final index */
  q = fopen(qout, "r");
  if (!q) die("%s: %s", qout, strerror(errno));
  while ((len = getline(&line, &cap, q)) > 0) {
    long n;
    if (line[len - 1] == '\n') line[--len] = 0;
    out.n = 0;
    if (!strncmp(line, "WORKER ", 7)) {
      sb_printf(&out, "OK blocks=%zu\n", kvidx_worker_blocks(ix, strtoull(line + 7, NULL, 10), 0));
      fwrite(out.p, 1, out.n, stdout);
      continue;
    }
    n = parse_hashes(line + 6, line + len, &loc, &loc_cap);
    if (n < 0) sb_printf(&out, "ERR bad number\n");
    else answer_matches(ix, loc, (size_t)n, &out);
    fwrite(out.p, 1, out.n, stdout);
  }
  fclose(q);
  {
    kvidx_stats st;
    memset(&st, 0, sizeof st);
    kvidx_get_stats(ix, &st);
    fprintf(stderr, "direct: events=%llu errors=%llu gaps=%llu malformed=%llu blocks=%zu workers=%zu queries=%ld\n",
            (unsigned long long)c.events, (unsigned long long)c.errors, (unsigned long long)c.gaps,
            (unsigned long long)c.malformed, st.blocks, st.workers, nq);
  }
  free(line);
  free(loc);
  free(out.p);
  free(sc.blk);
  free(sc.seqs);
  free(wt);
  kvidx_destroy(ix);
  return 0;
}

static int run_ask(int argc, char **argv) {
  struct sockaddr_un a;
  int fd;
  char *line = NULL, buf[65536];
  size_t cap = 0, have = 0;
  ssize_t len;
  FILE *in;
  if (argc < 3) die("ask needs SOCKET_PATH (lines on stdin)");
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (strlen(argv[2]) >= sizeof a.sun_path) die("socket path too long");
  memcpy(a.sun_path, argv[2], strlen(argv[2]) + 1);
  fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("connect %s: %s", argv[2], strerror(errno));
  in = fdopen(fd, "r");
  if (!in) die("fdopen failed");
  /* one line out, one line back: keeps replies in order and bounded */
  while ((len = getline(&line, &cap, stdin)) > 0) {
    if (line[len - 1] != '\n') {
      line = xrealloc(line, (size_t)len + 2);
      line[len++] = '\n';
    }
    send_all(fd, line, (size_t)len);
    if (!fgets(buf, sizeof buf, in)) die("replica closed the connection");
    have = strlen(buf);
    fwrite(buf, 1, have, stdout);
    while (have && buf[have - 1] != '\n' && fgets(buf, sizeof buf, in)) {
      have = strlen(buf);
      fwrite(buf, 1, have, stdout);
    }
  }
  free(line);
  fclose(in);
  return 0;
}

static int run_info(int argc, char **argv, int purge) {
  const char *url = NULL;
  uint64_t keep = 0, first = 0, last = 0, msgs = 0;
  nats_link l;
  int i;
  for (i = 2; i < argc; i++) {
    if (ARG("--nats")) url = argv[++i];
    else if (ARG("--prefix")) g_prefix = argv[++i];
    else if (ARG("--keep")) keep = strtoull(argv[++i], NULL, 10);
    else die("unknown or incomplete option %s", argv[i]);
  }
  if (!url) die("needs --nats URL");
  set_names();
  if (nats_open(&l, url, 0, now_s() + 10, NULL) != 0) return 2;
  if (purge) {
    jsOptions o;
    jsErrCode je = 0;
    jsOptions_Init(&o);
    o.Stream.Purge.Keep = keep;
    if (keep == 0) die("purge needs --keep N (N >= 1)");
    if (js_PurgeStream(l.js, g_ev_stream, &o, &je) != NATS_OK) die("purge failed (%d)", (int)je);
  }
  if (stream_state(l.js, &first, &last, &msgs) != 0) {
    nats_close(&l);
    logf_("no stream %s", g_ev_stream);
    return 1;
  }
  printf("first=%llu last=%llu msgs=%llu\n", (unsigned long long)first, (unsigned long long)last,
         (unsigned long long)msgs);
  {
    jsStreamInfo *si = NULL;
    jsErrCode je = 0;
    if (js_GetStreamInfo(&si, l.js, g_snap_stream, NULL, &je) == NATS_OK && si) {
      printf("snapshot stream: msgs=%llu bytes=%llu\n", (unsigned long long)si->State.Msgs,
             (unsigned long long)si->State.Bytes);
      jsStreamInfo_Destroy(si);
    }
  }
  nats_close(&l);
  return 0;
}

int main(int argc, char **argv) {
  struct sigaction sa;
  int rc = 2;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    fprintf(stderr,
            "usage: kvidx-fleet bridge  --nats URL --file EVENTS [--rate EV_PER_S] [--rewind K] [--window N]\n"
            "       kvidx-fleet bridge  --nats URL --zmq tcp://HOST:PORT=WORKER [--zmq ...]  (vLLM KV events)\n"
            "                           [--max-age S] [--max-msgs N] [--max-bytes N] [--dup-window S]\n"
            "       kvidx-fleet replica --nats URL --name NAME --listen SOCKET [--snap-every N]\n"
            "                           [--snap-secs T] [--no-snapshot] [--batch N] [--block-size 16]\n"
            "                           [--blocks-per-worker N]  (the engines' KV cache size)\n"
            "       kvidx-fleet direct  --file EVENTS --queries-out PATH [--query-every K] [--max-queries M]\n"
            "       kvidx-fleet ask SOCKET < lines\n"
            "       kvidx-fleet info  --nats URL\n"
            "       kvidx-fleet purge --nats URL --keep N\n"
            "  every NATS role takes --prefix P (default kvidx): streams P-events, P-snap\n");
    return 2;
  }
  g_role = argv[1];
  g_debug = getenv("KVIDX_FLEET_DEBUG") != NULL;
  if (!strcmp(argv[1], "bridge")) {
    int zmq = 0, i;
    for (i = 2; i < argc; i++) zmq |= !strcmp(argv[i], "--zmq");
    rc = zmq ? run_bridge_zmq(argc, argv) : run_bridge(argc, argv);
  }
  else if (!strcmp(argv[1], "replica")) rc = run_replica(argc, argv);
  else if (!strcmp(argv[1], "direct")) rc = run_direct(argc, argv);
  else if (!strcmp(argv[1], "ask")) rc = run_ask(argc, argv);
  else if (!strcmp(argv[1], "info")) rc = run_info(argc, argv, 0);
  else if (!strcmp(argv[1], "purge")) rc = run_info(argc, argv, 1);
  else die("unknown role %s", argv[1]);
  nats_Close();
  return rc;
}
