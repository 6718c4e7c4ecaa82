/* fleet_vllm.h - the bridge's vLLM ZeroMQ input (included by kvidx_fleet.c).
 *
 * vLLM's KV event publisher (vllm/distributed/kv_events.py) sends multipart
 * [topic, seq (8 bytes big endian), msgpack EventBatch]; the batch and event
 * encodings (array-like or map, int or bytes block hashes) are decoded as in
 * examples/vllm_events/kvidx_vllm.c.  Each event becomes an event line:
 *   BlockStored      -> S worker parent|- n local seq ...  (local hashes from
 *                       token_ids, Dynamo's XXH3 scheme, seed by lora_name)
 *   BlockRemoved     -> R worker n seq ...
 *   AllBlocksCleared -> C worker
 * Events on another medium than the device, or of KV cache groups other than
 * 0, are not published (the fleet's index holds device blocks of group 0).
 *
 * Ids: the bridge numbers each worker's events after the last one the stream
 * holds (the same scheme as the file input), Nats-Msg-Id "<worker>:<id>",
 * and a header Kvidx-Engine-Pos "<zmq seq>:<k>" (k = event index + 1).  A
 * batch is published and acknowledged as a whole; after a failure the bridge
 * reconnects, reads each worker's last stored message and republishes only
 * the events of the batch after that position.  A batch seq below the stored
 * one means the engine restarted: a Cleared is published first (the engine's
 * cache is empty).  Batches sent while no bridge runs are lost (ZeroMQ PUB);
 * one endpoint per worker, dp rank 0. */
#include <msgpack.h>
#include <zmq.h>

#define ZB_MAX_ENDPOINTS 64

static int mp_str_eq(const msgpack_object *o, const char *s) {
  size_t n = strlen(s);
  return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
         memcmp(o->via.str.ptr, s, n) == 0;
}

static const msgpack_object *mp_map_get(const msgpack_object *m, const char *key) {
  uint32_t i;
  if (!m || m->type != MSGPACK_OBJECT_MAP) return NULL;
  for (i = 0; i < m->via.map.size; i++)
    if (mp_str_eq(&m->via.map.ptr[i].key, key)) return &m->via.map.ptr[i].val;
  return NULL;
}

/* field idx of an array-like struct, or field name of a map-encoded one */
static const msgpack_object *mp_field(const msgpack_object *o, uint32_t idx, const char *name) {
  if (o->type == MSGPACK_OBJECT_ARRAY) return idx < o->via.array.size ? &o->via.array.ptr[idx] : NULL;
  return mp_map_get(o, name);
}

static int mp_nil(const msgpack_object *o) { return !o || o->type == MSGPACK_OBJECT_NIL; }

/* An ExternalBlockHash: int, or bytes reduced to their last 8 (big endian). */
static int mp_hash(const msgpack_object *o, uint64_t *out) {
  const unsigned char *p;
  uint32_t n, i;
  uint64_t h = 0;
  switch (o->type) {
  case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = o->via.u64; return 0;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (uint64_t)o->via.i64; return 0;
  case MSGPACK_OBJECT_BIN: p = (const unsigned char *)o->via.bin.ptr, n = o->via.bin.size; break;
  case MSGPACK_OBJECT_STR: p = (const unsigned char *)o->via.str.ptr, n = o->via.str.size; break;
  default: return -1;
  }
  if (n == 0) return -1;
  for (i = n > 8 ? n - 8 : 0; i < n; i++) h = (h << 8) | p[i];
  *out = h;
  return 0;
}

/* 1 if the event is for the device tier and KV cache group 0 */
static int mp_device_group0(const msgpack_object *medium, const msgpack_object *group) {
  char name[32];
  uint32_t n;
  if (!mp_nil(group) && !(group->type == MSGPACK_OBJECT_POSITIVE_INTEGER && group->via.u64 == 0)) return 0;
  if (mp_nil(medium)) return 1;
  if (medium->type != MSGPACK_OBJECT_STR) return 0;
  n = medium->via.str.size < sizeof name - 1 ? medium->via.str.size : (uint32_t)sizeof name - 1;
  memcpy(name, medium->via.str.ptr, n);
  name[n] = 0;
  return kvidx_tier_from_name(name) == KVIDX_TIER_DEVICE;
}

/* The lines of one batch, each with its position k (event index + 1). */
typedef struct {
  sbuf text;       /* lines, '\n' separated */
  size_t *k, cap, n;
  unsigned long long skipped, malformed;
} zb_lines;

static void zb_add(zb_lines *L, size_t k) {
  if (L->n == L->cap) {
    L->cap = L->cap ? L->cap * 2 : 16;
    L->k = xrealloc(L->k, L->cap * sizeof *L->k);
  }
  L->k[L->n++] = k;
  sb_printf(&L->text, "\n");
}

static void zb_stored(zb_lines *L, const msgpack_object *ev, uint64_t w, size_t k) {
  const msgpack_object *hs = mp_field(ev, 1, "block_hashes"), *par = mp_field(ev, 2, "parent_block_hash"),
                       *tok = mp_field(ev, 3, "token_ids"), *bs_o = mp_field(ev, 4, "block_size"),
                       *lora = mp_field(ev, 7, "lora_name");
  static uint32_t *toks;
  static uint64_t *loc;
  static size_t toks_cap, loc_cap;
  uint64_t parent = 0, bs, seed = KVIDX_SEED, h;
  size_t n, ntok, i, nloc;
  if (!mp_device_group0(mp_field(ev, 6, "medium"), mp_field(ev, 9, "group_idx"))) {
    L->skipped++;
    return;
  }
  if (!hs || hs->type != MSGPACK_OBJECT_ARRAY || !tok || tok->type != MSGPACK_OBJECT_ARRAY || !bs_o ||
      bs_o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || (bs = bs_o->via.u64) == 0 ||
      (!mp_nil(par) && mp_hash(par, &parent) != 0)) {
    L->malformed++;
    return;
  }
  n = hs->via.array.size;
  if (tok->via.array.size / bs < n) { /* token_ids must cover every block */
    L->malformed++;
    return;
  }
  ntok = n * (size_t)bs;
  if (ntok > toks_cap) toks_cap = ntok, toks = xrealloc(toks, toks_cap * sizeof *toks);
  if (n > loc_cap) loc_cap = n, loc = xrealloc(loc, loc_cap * sizeof *loc);
  for (i = 0; i < ntok; i++) {
    const msgpack_object *t = &tok->via.array.ptr[i];
    if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX) {
      L->malformed++;
      return;
    }
    toks[i] = (uint32_t)t->via.u64;
  }
  if (!mp_nil(lora) && lora->type == MSGPACK_OBJECT_STR && lora->via.str.size) {
    char name[256];
    uint32_t ln = lora->via.str.size < 255 ? lora->via.str.size : 255;
    memcpy(name, lora->via.str.ptr, ln);
    name[ln] = 0;
    seed = kvidx_hash_seed(name, NULL);
  }
  nloc = kvidx_block_hashes(toks, ntok, (size_t)bs, seed, loc);
  for (i = 0; i < nloc; i++)
    if (mp_hash(&hs->via.array.ptr[i], &h) != 0) {
      L->malformed++;
      return;
    }
  sb_printf(&L->text, "S %llu ", (unsigned long long)w);
  if (mp_nil(par)) sb_printf(&L->text, "-");
  else sb_printf(&L->text, "%llu", (unsigned long long)parent);
  sb_printf(&L->text, " %zu", nloc);
  for (i = 0; i < nloc; i++) {
    mp_hash(&hs->via.array.ptr[i], &h);
    sb_printf(&L->text, " %llu %llu", (unsigned long long)loc[i], (unsigned long long)h);
  }
  zb_add(L, k);
}

static void zb_removed(zb_lines *L, const msgpack_object *ev, uint64_t w, size_t k) {
  const msgpack_object *hs = mp_field(ev, 1, "block_hashes");
  uint32_t i;
  uint64_t h;
  if (!mp_device_group0(mp_field(ev, 2, "medium"), mp_field(ev, 3, "group_idx"))) {
    L->skipped++;
    return;
  }
  if (!hs || hs->type != MSGPACK_OBJECT_ARRAY) {
    L->malformed++;
    return;
  }
  for (i = 0; i < hs->via.array.size; i++)
    if (mp_hash(&hs->via.array.ptr[i], &h) != 0) {
      L->malformed++;
      return;
    }
  sb_printf(&L->text, "R %llu %u", (unsigned long long)w, hs->via.array.size);
  for (i = 0; i < hs->via.array.size; i++) {
    mp_hash(&hs->via.array.ptr[i], &h);
    sb_printf(&L->text, " %llu", (unsigned long long)h);
  }
  zb_add(L, k);
}

/* Decodes one EventBatch into L (cleared first). */
static void zb_decode(zb_lines *L, const char *data, size_t len, uint64_t w) {
  msgpack_unpacked up;
  size_t off = 0;
  const msgpack_object *root, *events;
  uint32_t i;
  L->text.n = 0;
  L->n = 0;
  msgpack_unpacked_init(&up);
  if (msgpack_unpack_next(&up, data, len, &off) != MSGPACK_UNPACK_SUCCESS) {
    L->malformed++;
    msgpack_unpacked_destroy(&up);
    return;
  }
  root = &up.data;
  events = (root->type == MSGPACK_OBJECT_ARRAY || root->type == MSGPACK_OBJECT_MAP)
               ? mp_field(root, 1, "events") : NULL;
  if (!events || events->type != MSGPACK_OBJECT_ARRAY) {
    L->malformed++;
  } else {
    for (i = 0; i < events->via.array.size; i++) {
      const msgpack_object *ev = &events->via.array.ptr[i], *tag = NULL;
      if (ev->type == MSGPACK_OBJECT_ARRAY && ev->via.array.size > 0) tag = &ev->via.array.ptr[0];
      else if (ev->type == MSGPACK_OBJECT_MAP) tag = mp_map_get(ev, "type");
      if (mp_str_eq(tag, "BlockStored")) zb_stored(L, ev, w, (size_t)i + 1);
      else if (mp_str_eq(tag, "BlockRemoved")) zb_removed(L, ev, w, (size_t)i + 1);
      else if (mp_str_eq(tag, "AllBlocksCleared")) {
        sb_printf(&L->text, "C %llu", (unsigned long long)w);
        zb_add(L, (size_t)i + 1);
      } else {
        L->skipped++;
      }
    }
  }
  msgpack_unpacked_destroy(&up);
}

typedef struct {
  const char *url;
  uint64_t worker;
  void *sock;
  uint64_t last_id;           /* last event id in the stream for the worker */
  uint64_t last_seq, last_k;  /* its engine position (have_pos)            */
  int have_pos;
} zb_endpoint;

/* Reads the worker's last stored event: id and engine position. */
static int zb_resync(jsCtx *js, zb_endpoint *e) {
  char subj[160];
  natsMsg *m = NULL;
  jsErrCode je = 0;
  natsStatus s;
  const char *pos = NULL;
  snprintf(subj, sizeof subj, "%s.ev.%llu", g_prefix, (unsigned long long)e->worker);
  s = js_GetLastMsg(&m, js, g_ev_stream, subj, NULL, &je);
  e->last_id = 0;
  e->have_pos = 0;
  if (s == NATS_NOT_FOUND || je == JSNoMessageFoundErr) return 0;
  if (s != NATS_OK) return -1;
  {
    const char *d = natsMsg_GetData(m), *p = d;
    if (next_u64(&p, d + natsMsg_GetDataLength(m), &e->last_id) != 0) e->last_id = 0;
  }
  if (natsMsgHeader_Get(m, "Kvidx-Engine-Pos", &pos) == NATS_OK && pos) {
    unsigned long long sq, k;
    if (sscanf(pos, "%llu:%llu", &sq, &k) == 2) e->last_seq = sq, e->last_k = k, e->have_pos = 1;
  }
  natsMsg_Destroy(m);
  return 0;
}

static int zb_publish(jsCtx *js, uint64_t w, uint64_t id, uint64_t seq, size_t k, const char *line, size_t len) {
  char subj[160], msgid[64], pos[64];
  natsMsg *m = NULL;
  char *payload = xrealloc(NULL, len + 24);
  int pl = snprintf(payload, len + 24, "%llu ", (unsigned long long)id);
  memcpy(payload + pl, line, len);
  snprintf(subj, sizeof subj, "%s.ev.%llu", g_prefix, (unsigned long long)w);
  snprintf(msgid, sizeof msgid, "%llu:%llu", (unsigned long long)w, (unsigned long long)id);
  snprintf(pos, sizeof pos, "%llu:%zu", (unsigned long long)seq, k);
  if (natsMsg_Create(&m, subj, NULL, payload, pl + (int)len) != NATS_OK ||
      natsMsgHeader_Set(m, "Nats-Msg-Id", msgid) != NATS_OK ||
      natsMsgHeader_Set(m, "Kvidx-Engine-Pos", pos) != NATS_OK) {
    free(payload);
    natsMsg_Destroy(m);
    return -1;
  }
  free(payload);
  if (js_PublishMsgAsync(js, &m, NULL) != NATS_OK) {
    natsMsg_Destroy(m);
    return -1;
  }
  return 0;
}

/* Publishes the batch's events after the endpoint's stored position and
 * waits for their acknowledgements.  0 = done; -1 = connection trouble. */
static int zb_publish_batch(jsCtx *js, zb_endpoint *e, uint64_t seq, zb_lines *L, pub_counters *pc,
                            unsigned long long *published) {
  uint64_t id = e->last_id, last_k = e->last_k;
  int restarted = e->have_pos && seq < e->last_seq;
  const char *p = L->text.p;
  size_t j, n = 0;
  jsPubOptions po;
  if (restarted) { /* the engine restarted: its cache is empty */
    char c[40];
    int cl = snprintf(c, sizeof c, "C %llu", (unsigned long long)e->worker);
    if (zb_publish(js, e->worker, ++id, seq, 0, c, (size_t)cl) != 0) return -1;
    last_k = 0;
    n++;
  }
  for (j = 0; j < L->n; j++) {
    const char *nl = strchr(p, '\n');
    size_t len = (size_t)(nl - p);
    /* already stored (a retry after a failure mid-batch) */
    int stored = e->have_pos && !restarted && seq == e->last_seq && L->k[j] <= e->last_k;
    if (!stored) {
      if (zb_publish(js, e->worker, ++id, seq, L->k[j], p, len) != 0) return -1;
      last_k = L->k[j];
      n++;
    }
    p = nl + 1;
  }
  if (n == 0) return 0;
  jsPubOptions_Init(&po);
  po.MaxWait = 5000;
  if (js_PublishAsyncComplete(js, &po) != NATS_OK || atomic_load(&pc->failed)) return -1;
  e->last_id = id;
  e->last_seq = seq;
  e->last_k = last_k;
  e->have_pos = 1;
  *published += n;
  return 0;
}

static int run_bridge_zmq(int argc, char **argv) {
  zb_endpoint ep[ZB_MAX_ENDPOINTS];
  int nep = 0, i;
  const char *url = NULL;
  double max_seconds = 0, t0 = now_s();
  retention ret = {0, 0, 0, 0};
  void *ctx = zmq_ctx_new();
  zmq_pollitem_t items[ZB_MAX_ENDPOINTS];
  zb_lines L;
  pub_counters pc;
  nats_link l;
  jsOptions jo;
  unsigned long long batches = 0, published = 0, reconnects = 0, restarts = 0;
  memset(&L, 0, sizeof L);
  memset(&pc, 0, sizeof pc);
  memset(ep, 0, sizeof ep);
  for (i = 2; i < argc; i++) {
    if (ARG("--nats")) url = argv[++i];
    else if (ARG("--zmq")) {
      char *spec = argv[++i], *eq = strrchr(spec, '=');
      if (!eq || nep == ZB_MAX_ENDPOINTS) die("--zmq ENDPOINT=WORKER (at most %d)", ZB_MAX_ENDPOINTS);
      *eq = 0;
      ep[nep].url = spec;
      ep[nep].worker = strtoull(eq + 1, NULL, 10);
      nep++;
    } else if (ARG("--prefix")) g_prefix = argv[++i];
    else if (ARG("--max-seconds")) max_seconds = atof(argv[++i]);
    else if (ARG("--max-age")) ret.max_age_s = atol(argv[++i]);
    else if (ARG("--max-msgs")) ret.max_msgs = atol(argv[++i]);
    else if (ARG("--max-bytes")) ret.max_bytes = atol(argv[++i]);
    else if (ARG("--dup-window")) ret.dup_window_s = atol(argv[++i]);
    else if (!strcmp(argv[i], "--file")) die("--file and --zmq are exclusive");
    else die("bridge: unknown or incomplete option %s", argv[i]);
  }
  if (!url || !nep) die("bridge --zmq needs --nats URL --zmq ENDPOINT=WORKER ...");
  set_names();
  for (i = 0; i < nep; i++) {
    ep[i].sock = zmq_socket(ctx, ZMQ_SUB);
    if (!ep[i].sock || zmq_setsockopt(ep[i].sock, ZMQ_SUBSCRIBE, "", 0) != 0 ||
        zmq_connect(ep[i].sock, ep[i].url) != 0)
      die("zmq connect %s: %s", ep[i].url, zmq_strerror(zmq_errno()));
    items[i].socket = ep[i].sock;
    items[i].fd = 0;
    items[i].events = ZMQ_POLLIN;
  }
  jsOptions_Init(&jo);
  jo.PublishAsync.AckHandler = on_pub_ack;
  jo.PublishAsync.AckHandlerClosure = &pc;
  jo.Wait = 2000;
  memset(&l, 0, sizeof l);
  while (!g_stop) {
    if (!l.js) { /* (re)connect and learn where each worker stands */
      int ok = nats_open(&l, url, 0, now_s() + 60, &jo) == 0 && ensure_streams(l.js, &ret) == 0;
      for (i = 0; ok && i < nep; i++) ok = zb_resync(l.js, &ep[i]) == 0;
      if (!ok) {
        nats_close(&l);
        sleep_ms(200);
        continue;
      }
      logf_("connected; %d endpoint(s)", nep);
    }
    if (max_seconds > 0 && now_s() - t0 > max_seconds) break;
    if (zmq_poll(items, nep, 200) <= 0) continue;
    for (i = 0; i < nep; i++) {
      zmq_msg_t part[3];
      int np = 0, more = 1, k;
      uint64_t seq = 0;
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      while (more) { /* one multipart message: [topic, seq, payload] */
        zmq_msg_t extra, *m = np < 3 ? &part[np] : &extra;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, ep[i].sock, 0) < 0) {
          zmq_msg_close(m);
          break;
        }
        more = zmq_msg_more(m);
        if (m == &extra) zmq_msg_close(m);
        np++;
      }
      if (np == 3 && zmq_msg_size(&part[1]) == 8) {
        const unsigned char *s = zmq_msg_data(&part[1]);
        for (k = 0; k < 8; k++) seq = (seq << 8) | s[k];
        zb_decode(&L, zmq_msg_data(&part[2]), zmq_msg_size(&part[2]), ep[i].worker);
        batches++;
        if (ep[i].have_pos && seq < ep[i].last_seq) restarts++;
        /* publish; on trouble reconnect, resync, publish what is missing */
        while (!g_stop && zb_publish_batch(l.js, &ep[i], seq, &L, &pc, &published) != 0) {
          natsMsgList pending = {NULL, 0};
          int j, ok = 0;
          if (l.js && js_PublishAsyncGetPendingList(&pending, l.js) == NATS_OK) natsMsgList_Destroy(&pending);
          nats_close(&l);
          atomic_store(&pc.failed, 0);
          reconnects++;
          logf_("publish failed; reconnecting and resuming from the stream's state");
          while (!g_stop && !ok) {
            ok = nats_open(&l, url, 0, now_s() + 60, &jo) == 0 && ensure_streams(l.js, &ret) == 0;
            for (j = 0; ok && j < nep; j++) ok = zb_resync(l.js, &ep[j]) == 0;
            if (!ok) {
              nats_close(&l);
              sleep_ms(200);
            }
          }
        }
      } else {
        L.malformed++;
      }
      for (k = 0; k < np && k < 3; k++) zmq_msg_close(&part[k]);
    }
  }
  printf("bridge: zmq batches=%llu published=%llu acked=%llu duplicates_dropped_by_stream=%llu "
         "skipped_events=%llu malformed=%llu engine_restarts=%llu reconnects=%llu\n",
         batches, published, (unsigned long long)atomic_load(&pc.acked),
         (unsigned long long)atomic_load(&pc.dups), L.skipped, L.malformed, restarts, reconnects);
  fflush(stdout);
  for (i = 0; i < nep; i++) zmq_close(ep[i].sock);
  zmq_ctx_destroy(ctx);
  nats_close(&l);
  free(L.text.p);
  free(L.k);
  return 0;
}
