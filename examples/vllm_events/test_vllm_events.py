#!/usr/bin/python3
"""End-to-end test of kvidx-vllm-events against stand-ins of two vLLM
publishers (vllm/distributed/kv_events.py, ZmqEventPublisher): multipart
[topic, seq (8 bytes big endian), msgpack EventBatch] on a PUB socket, and a
ROUTER replay socket answering [b"", start_seq] with the buffered batches.

  worker 1: the newest vLLM.  Map-encoded events, every field in vLLM's
            order with its default-omission rules (lora_id, medium and
            lora_name always present; extra_keys, group_idx,
            kv_cache_spec_kind ... only when set), data_parallel_rank always
            present (also 0), integer block hashes (vLLM's default), CPU
            offload events shaped as the offloading connector makes them
            (token_ids=[], no parent, block_size 0 or a multiple of the GPU
            block size, medium "CPU"), hybrid KV cache groups, extra_keys
            (cache salt, multimodal items, prompt embeds), a 300-character
            LoRA name; replay replies [topic, seq, payload].
  worker 2: a v0.9-era vLLM.  Positional events (tag first), two-element
            batch [ts, events], lora_id only (no lora_name, no medium);
            replay replies [seq, payload].

Every answer of the daemon is checked against a kvidx index fed directly
(through the Python binding) from the test's own model of what each worker
holds, with local hashes and extra-key seeds computed here independently.
Also covered: gaps healed by replay (a gap-free run's answers), a replay that
cannot cover its gap (the worker is cleared), a resent batch (a duplicate:
nothing wiped), a publisher restart (seq back to 0: a new generation), hostile
messages (a 4-billion-element array, block_size 2^63+8), warm restart from
--snapshot.  Loopback and a unix socket only; bounded run.

    /usr/bin/python3 test_vllm_events.py DAEMON TMPDIR LIBKVIDX_SO

Needs Debian's python3-zmq and python3-msgpack.
"""

import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import msgpack
import zmq

BS = 16
MASK = (1 << 64) - 1
END_SEQ = (-1).to_bytes(8, "big", signed=True)
checks = 0


def fail(msg, proc=None, log=None):
    print(f"test-vllm: FAIL: {msg}")
    if proc is not None:
        proc.kill()
    if log and os.path.exists(log):
        print("--- daemon log ---")
        print(open(log).read()[-4000:])
    sys.exit(1)


def expect(what, got, want, proc=None, log=None):
    global checks
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}", proc, log)
    checks += 1
    print(f"  ok  {what}: {got}", flush=True)


def wait_for(cond, what, proc, log, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.02)
    fail(f"timed out waiting for {what}", proc, log)


# ---- the two publishers ---------------------------------------------------------
class Publisher:
    """A vLLM ZmqEventPublisher stand-in: PUB + ROUTER replay socket.
    style "new": map events, [ts, events, dp] as a map, replies with topic;
    style "v09": positional events, [ts, events], replies without topic."""

    def __init__(self, ctx, style, dp_rank=0, topic=b"kv-events"):
        self.style, self.dp, self.topic = style, dp_rank, topic
        self.pub = ctx.socket(zmq.PUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = ctx.socket(zmq.ROUTER)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0
        self.buffer = {}
        self.lock = threading.Lock()
        self.replay_requests = 0
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop:
            if not poller.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3 or frames[1] != b"":
                continue
            cid, start = frames[0], int.from_bytes(frames[2], "big")
            with self.lock:
                self.replay_requests += 1
                items = sorted((s, p) for s, p in self.buffer.items() if s >= start)
            for s, p in items:
                if self.style == "new":
                    self.router.send_multipart([cid, b"", self.topic, s.to_bytes(8, "big"), p])
                else:
                    self.router.send_multipart([cid, b"", s.to_bytes(8, "big"), p])
            if self.style == "new":
                self.router.send_multipart([cid, b"", b"", END_SEQ, b""])
            else:
                self.router.send_multipart([cid, b"", END_SEQ, b""])

    def close(self):
        self.stop = True
        self.thread.join()
        self.pub.close(0)
        self.router.close(0)

    def payload(self, events):
        if self.style == "new":
            return msgpack.packb({"ts": time.time(), "events": events,
                                  "data_parallel_rank": self.dp}, use_bin_type=True)
        return msgpack.packb([time.time(), events], use_bin_type=True)

    def send_raw(self, payload, seq):
        self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def publish(self, events, drop=False):
        """Publishes a batch (buffered for replay); drop: lost on the wire."""
        seq, p = self.seq, self.payload(events)
        self.seq += 1
        with self.lock:
            self.buffer[seq] = p
        if not drop:
            self.send_raw(p, seq)
        return seq

    def forget(self, seq):
        with self.lock:
            del self.buffer[seq]

    def resend(self, seq):
        self.send_raw(self.buffer[seq], seq)

    def restart(self):
        with self.lock:
            self.buffer.clear()
        self.seq = 0

    # events, as vLLM encodes them
    def stored(self, hashes, parent, tokens, block_size=BS, lora_id=None, medium="GPU",
               lora_name=None, extra_keys=None, group_idx=None, kind=None):
        if self.style == "v09":  # v0.9: no medium, no lora_name, nothing after
            return ["BlockStored", hashes, parent, tokens, block_size, lora_id]
        m = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
             "token_ids": tokens, "block_size": block_size, "lora_id": lora_id,
             "medium": medium, "lora_name": lora_name}
        for k, v in (("extra_keys", extra_keys), ("group_idx", group_idx),
                     ("kv_cache_spec_kind", kind)):
            if v is not None:  # omit_defaults
                m[k] = v
        return m

    def removed(self, hashes, medium="GPU", group_idx=None):
        if self.style == "v09":
            return ["BlockRemoved", hashes]
        m = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
        if group_idx is not None:
            m["group_idx"] = group_idx
        return m

    def cleared(self):
        return ["AllBlocksCleared"] if self.style == "v09" else {"type": "AllBlocksCleared"}


# ---- the model: hashing done here, independently of the daemon ---------------
def canon(x):
    """Canonical bytes of one extra-keys element (README: extra keys)."""
    if x is None:
        return b"n"
    if x is True or x is False:
        return b"T" if x else b"F"
    if isinstance(x, int):
        return b"i" + struct.pack("<Q", x & MASK)
    if isinstance(x, str):
        b = x.encode()
        return b"s" + struct.pack("<I", len(b)) + b
    if isinstance(x, bytes):
        return b"b" + struct.pack("<I", len(x)) + x
    return b"t" + struct.pack("<I", len(x)) + b"".join(canon(e) for e in x)


def base_seed(kv, lora_name=None, lora_id=None):
    if lora_name:
        return kv.hash_seed(lora_name)
    if lora_id:
        return kv.hash_seed(None, f"vllm-lora-id:{lora_id}")
    return kv.SEED


def block_seed(kv, base, extra, lora_name=None):
    if extra is None:
        return base
    elems = [e for e in extra if not (lora_name and isinstance(e, str) and e == lora_name)]
    if not elems:
        return base
    data = b"".join(canon(e) for e in elems)
    data += b"\0" * (-len(data) % 4)
    words = struct.unpack("<%dI" % (len(data) // 4), data)
    return (base + kv.block_hash(list(words), 2)) & MASK


def vllm_extra_keys(nblocks, lora_name=None, mm=(), salt=None, embeds=None):
    """Per-block extra keys as vLLM's generate_block_hash_extra_keys makes
    them: LoRA name, mm items (identifier, offset in the block), cache salt
    on the first block, prompt-embeds hash."""
    out = []
    for i in range(nblocks):
        s, e = i * BS, (i + 1) * BS
        keys = [lora_name] if lora_name else []
        keys += [(mid, off - s) for mid, off, ln in mm if e > off and s < off + ln]
        if salt is not None and i == 0:
            keys.append(salt)
        if embeds is not None:
            keys.append(embeds[i])
        out.append(tuple(keys) if keys else None)
    return out


def locals_of(kv, tokens, lora_name=None, lora_id=None, extra=None):
    base = base_seed(kv, lora_name, lora_id)
    n = len(tokens) // BS
    return [kv.block_hash(tokens[i * BS:(i + 1) * BS],
                          block_seed(kv, base, extra[i] if extra else None, lora_name))
            for i in range(n)]


class Model:
    """What each (worker, dp) holds, by (engine hash, group)."""

    def __init__(self, kv):
        self.kv = kv
        self.ever = {}   # wd -> key -> (local, parent key)
        self.held = {}   # wd -> key -> set of tiers
        self.seqs = {}

    def store(self, wd, keys, locs, parent, tier="GPU"):
        ev, hd = self.ever.setdefault(wd, {}), self.held.setdefault(wd, {})
        for k, lo in zip(keys, locs):
            ev[k] = (lo, parent)
            hd.setdefault(k, set()).add(tier)
            parent = k

    def offload(self, wd, keys, tier="CPU"):
        for k in keys:
            self.held[wd].setdefault(k, set()).add(tier)

    def remove(self, wd, keys, tier="GPU"):
        hd = self.held.get(wd, {})
        for k in keys:
            if k in hd:
                hd[k].discard(tier)
                if not hd[k]:
                    del hd[k]

    def clear(self, wd):
        self.held[wd] = {}
        self.ever[wd] = {}

    def seq(self, k):
        return self.seqs.setdefault(k, (1 << 40) + len(self.seqs))

    def index(self):
        ix = self.kv.Index("positional")
        for wd, hd in self.held.items():
            ev, need = self.ever[wd], set()
            for k in hd:
                while k is not None and k in ev and k not in need:
                    need.add(k)
                    k = ev[k][1]
            done = set()
            while len(done) < len(need):
                progress = len(done)
                for k in sorted(need - done, key=str):
                    p = ev[k][1]
                    if p is None or p in done:
                        ix.store(wd[0], wd[1], [ev[k][0]], [self.seq(k)],
                                 None if p is None else self.seq(p))
                        done.add(k)
                if len(done) == progress:
                    raise RuntimeError(f"model: orphan blocks of {wd}")
            gone = [self.seq(k) for k in need if k not in hd]
            if gone:
                ix.remove(wd[0], wd[1], gone)
        return ix

    def answer(self, locs):
        ix = self.index()
        try:
            return " ".join(f"{s.worker_id}:{s.dp_rank}:{s.depth}" for s in ix.find_matches(locs))
        finally:
            ix.close()


class Client:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(path)
        self.f = self.s.makefile("r")

    def ask(self, line):
        self.s.sendall(line.encode() + b"\n")
        return self.f.readline().rstrip("\n")

    def stats(self):
        r = self.ask("STATS")
        return {k: int(v) for k, v in (x.split("=") for x in r.split()[1:])}

    def match(self, tokens, opts="", cmd="MATCH"):
        r = self.ask(f"{cmd} {opts} " + " ".join(map(str, tokens)))
        if not r.startswith("OK "):
            return r
        return r.split(" ", 3)[3] if r.count(" ") >= 3 else ""


def main():
    daemon, tmp, libkvidx = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ["KVIDX_LIB"] = libkvidx
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "bindings", "python"))
    import kvidx as kv
    os.makedirs(tmp, exist_ok=True)
    qpath = os.path.join(tmp, "q.sock")

    r = subprocess.run([daemon, "--endpoint", "tcp://127.0.0.1:1=1",
                        "--listen", "0.0.0.0:7070"], capture_output=True,
                       text=True, timeout=10)
    expect("non-loopback --listen refused", (r.returncode != 0, "loopback" in r.stderr),
           (True, True))

    ctx = zmq.Context()
    new = Publisher(ctx, "new", dp_rank=0)
    old = Publisher(ctx, "v09")
    snap = os.path.join(tmp, "kvidx.snap")
    for f in (snap, snap + ".tmp"):
        if os.path.exists(f):
            os.unlink(f)
    model = Model(kv)

    def start(logname, snapshot=snap):
        lg = os.path.join(tmp, logname)
        args = [daemon, "--endpoint", f"tcp://127.0.0.1:{new.port}=1",
                "--replay", f"tcp://127.0.0.1:{new.replay_port}",
                "--endpoint", f"tcp://127.0.0.1:{old.port}=2",
                "--replay", f"tcp://127.0.0.1:{old.replay_port}",
                "--listen", f"unix:{qpath}", "--block-size", str(BS),
                "--topic", "kv-events", "--max-seconds", "90", "--replay-timeout", "3000",
                "--blocks-per-worker", "64"]  # the answers are the model's either way
        if snapshot:
            args += ["--snapshot", snapshot]
        pr = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(lg, "w"), text=True)
        if pr.stdout.readline().strip() != "ready":
            fail("daemon did not start", pr, lg)
        return pr, lg, Client(qpath)

    def stop(pr, lg, what):
        pr.send_signal(signal.SIGTERM)
        try:
            rc = pr.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fail("daemon did not stop on SIGTERM", pr, lg)
        expect(f"clean exit on SIGTERM ({what})", (rc, os.path.exists(qpath)), (0, False))

    proc, log, cl = start("daemon.log")
    expect("PING", cl.ask("PING"), "OK pong", proc, log)

    def settle(pub_batches):
        wait_for(lambda: cl.stats()["batches"] >= pub_batches(), "batches", proc, log)

    # ZeroMQ drops what a PUB sends before the SUB has joined: until the
    # daemon has seen one batch from each publisher, send empty batches
    # outside the replay buffer (seq 0 again and again).
    for pub in (new, old):
        before = cl.stats()["batches"]

        def joined(pub=pub, before=before):
            pub.send_raw(pub.payload([]), 0)
            time.sleep(0.05)
            return cl.stats()["batches"] > before
        wait_for(joined, "subscription", proc, log)
        pub.seq = 1
        pub.buffer[0] = pub.payload([])
    total = [cl.stats()["batches"]]

    def send(pub, events, drop=False):
        s = pub.publish(events, drop)
        if not drop:
            total[0] += 1
        return s

    def sync(extra=0):
        total[0] += extra
        settle(lambda: total[0])

    def check(what, tokens, locs, opts="", want=None):
        got = cl.match(tokens, opts)
        ref = model.answer(locs)
        expect(what, got, ref if want is None else want, proc, log)
        if want is not None:
            expect(what + " (index fed directly)", ref, want, proc, log)

    W1, W2 = (1, 0), (2, 0)
    A = list(range(1000, 1000 + 10 * BS))
    la = locals_of(kv, A)
    ha = [0x1000 + i for i in range(10)]  # integer block hashes (vLLM's default)

    # 1. newest vLLM, single full-attention group, blocks 0-5 in two events
    send(new, [new.stored(ha[:3], None, A[:3 * BS], group_idx=0, kind="full_attention"),
               new.stored(ha[3:6], ha[2], A[3 * BS:6 * BS], group_idx=0,
                          kind="full_attention")])
    model.store(W1, [(h, 0) for h in ha[:6]], la[:6], None)
    # v0.9: the same prompt, blocks 0-3, positional
    send(old, [old.stored(ha[:4], None, A[:4 * BS])])
    model.store(W2, [(h, 0) for h in ha[:4]], la[:4], None)
    sync()
    check("device stores, both encodings", A, la, want="1:0:6 2:0:4")

    # 2. CPU offload as the offloading connector sends it: token_ids=[], no
    # parent, block_size 0 (newest) or 2 x the GPU block size; then the GPU
    # evicts: the CPU copies keep the depth.
    send(new, [new.stored(ha[:6], None, [], block_size=0, medium="CPU")])
    model.offload(W1, [(h, 0) for h in ha[:6]])
    send(new, [new.removed(ha[1:6])])
    model.remove(W1, [(h, 0) for h in ha[1:6]])
    sync()
    check("GPU evicted, CPU copies indexed", A, la, want="1:0:6 2:0:4")
    expect("MATCHT: 1 of 6 on the device", cl.match(A, cmd="MATCHT").split()[0], "1:0:6:1",
           proc, log)
    # blocks 6-9 on the GPU, offloaded in chunks of 2 GPU blocks (block_size
    # 32: each hash names a chunk's last block); a hash never stored on the
    # device is not indexed (unresolved)
    send(new, [new.stored(ha[6:10], ha[5], A[6 * BS:10 * BS], group_idx=0,
                          kind="full_attention")])
    model.store(W1, [(h, 0) for h in ha[6:10]], la[6:10], (ha[5], 0))
    send(new, [new.stored([ha[7], ha[9]], None, [], block_size=2 * BS, medium="CPU"),
               new.stored([0xdead], None, [], block_size=2 * BS, medium="CPU")])
    model.offload(W1, [(h, 0) for h in ha[6:10]])
    send(new, [new.removed(ha[6:10])])
    model.remove(W1, [(h, 0) for h in ha[6:10]])
    sync()
    st = cl.stats()
    check("2-block CPU chunks resolved", A, la, want="1:0:10 2:0:4")
    expect("unresolved CPU store counted", (st["unresolved"], st["malformed"]), (1, 0),
           proc, log)
    # a CPU eviction of a 2-block chunk drops both blocks' CPU copies
    send(new, [new.removed([ha[9]], medium="CPU")])
    model.remove(W1, [(h, 0) for h in ha[8:10]], "CPU")
    sync()
    check("CPU chunk removed", A, la, want="1:0:8 2:0:4")

    # 3. hybrid model: group 0 sliding window (not kept), group 1 full
    # attention (kept); same hashes in both groups, kept apart
    B = list(range(5000, 5000 + 4 * BS))
    lb = locals_of(kv, B)
    hb = [0x2000 + i for i in range(4)]
    send(new, [new.stored(hb, None, B, group_idx=0, kind="sliding_window"),
               new.stored(hb, None, B, group_idx=1, kind="full_attention")])
    model.store(W1, [(h, 1) for h in hb], lb, None)
    send(new, [new.removed(hb[:2], group_idx=0)])  # sliding window drops old blocks
    sync()
    check("hybrid: full-attention group kept", B, lb, want="1:0:4")
    send(new, [new.removed(hb[3:], group_idx=1)])
    model.remove(W1, [(h, 1) for h in hb[3:]])
    sync()
    check("hybrid: its own removal applies", B, lb, want="1:0:3")

    # 4. extra keys: cache salt, multimodal items, prompt embeds, LoRA name
    C = list(range(9000, 9000 + 4 * BS))
    mm = [("img-abc", 20, 24)]  # tokens 20..43: blocks 1 and 2
    ek = vllm_extra_keys(4, mm=mm, salt="tenant-7")
    lc = locals_of(kv, C, extra=ek)
    hc = [0x3000 + i for i in range(4)]
    send(new, [new.stored(hc, None, C, extra_keys=ek)])
    model.store(W1, [(h, 0) for h in hc], lc, None)
    emb = [bytes([i]) * 32 for i in range(2)]
    ekp = vllm_extra_keys(2, embeds=emb, lora_name="adapter-x")
    lp = locals_of(kv, C[:2 * BS], lora_name="adapter-x", extra=ekp)
    hp = [0x3100, 0x3101]
    send(new, [new.stored(hp, None, C[:2 * BS], lora_id=5, lora_name="adapter-x",
                          extra_keys=ekp)])
    model.store(W1, [(h, 0) for h in hp], lp, None)
    sync()
    q = "salt=tenant-7 mm=img-abc:20:24"
    check("salted mm prompt, full query", C, lc, q, want="1:0:4")
    check("no salt: no match", C, locals_of(kv, C), "", want="")
    check("other salt: no match", C, locals_of(kv, C, extra=vllm_extra_keys(4, mm=mm, salt="x")),
          "salt=x mm=img-abc:20:24", want="")
    check("other image: stops at block 1", C,
          locals_of(kv, C, extra=vllm_extra_keys(4, mm=[("img-zzz", 20, 24)], salt="tenant-7")),
          "salt=tenant-7 mm=img-zzz:20:24", want="1:0:1")
    pe = " ".join(f"pe={i}:{e.hex()}" for i, e in enumerate(emb))
    check("LoRA + prompt embeds", C[:2 * BS], lp, "lora=adapter-x " + pe, want="1:0:2")

    # 5. LoRA: lora_id only (v0.9), and a 300-character name (newest)
    D = list(range(20000, 20000 + 3 * BS))
    ld = locals_of(kv, D, lora_id=3)
    hd = [0x4000 + i for i in range(3)]
    send(old, [old.stored(hd, None, D, lora_id=3)])
    model.store(W2, [(h, 0) for h in hd], ld, None)
    long_name = "lora-" + "n" * 295
    ll = locals_of(kv, D, lora_name=long_name)
    hl = [0x4100 + i for i in range(3)]
    send(new, [new.stored(hl, None, D, lora_id=9, lora_name=long_name)])
    model.store(W1, [(h, 0) for h in hl], ll, None)
    sync()
    check("lora_id-only blocks: base query", D, locals_of(kv, D), want="")
    check("lora_id-only blocks: lora_id query", D, ld, "lora_id=3", want="2:0:3")
    check("300-character LoRA name", D, ll, "lora=" + long_name, want="1:0:3")

    # 6. a gap healed by replay: each publisher loses a batch on the wire;
    # the daemon asks the replay socket before the next one (both shapes)
    E = list(range(30000, 30000 + 3 * BS))
    le = locals_of(kv, E)
    he = [0x5000 + i for i in range(3)]
    send(new, [new.stored(he[:2], None, E[:2 * BS])], drop=True)
    model.store(W1, [(h, 0) for h in he[:2]], le[:2], None)
    send(new, [new.stored(he[2:], he[1], E[2 * BS:])])
    model.store(W1, [(h, 0) for h in he[2:]], le[2:], (he[1], 0))
    send(old, [old.stored(he, None, E)], drop=True)
    model.store(W2, [(h, 0) for h in he], le, None)
    send(old, [old.removed(he[2:])])
    model.remove(W2, [(h, 0) for h in he[2:]])
    sync(extra=2)  # the replayed batches count as batches too
    st = cl.stats()
    check("gap healed by replay (gap-free answers)", E, le, want="1:0:3 2:0:2")
    expect("replayed, no gap left", (st["replays"], st["replayed"], st["replay_failed"],
                                     st["gaps"]), (2, 2, 0, 0), proc, log)
    expect("replay requests served", (new.replay_requests, old.replay_requests), (1, 1),
           proc, log)
    # 7. a replay that cannot cover the gap (the batch left the publisher's
    # buffer): the worker is cleared, then the next batch applies
    s = send(old, [old.stored([0x6000], None, E[:BS])], drop=True)
    old.forget(s)
    send(old, [old.stored([0x6001], None, E[:BS])])
    model.clear(W2)
    model.store(W2, [(0x6001, 0)], le[:1], None)
    sync()
    st = cl.stats()
    check("uncovered gap: worker cleared", A, la, want="1:0:8")
    check("uncovered gap: next batch applied", E, le, want="1:0:3 2:0:1")
    expect("replay failure counted", (st["replay_failed"], st["gaps"]), (1, 1), proc, log)

    # 8. resent and reordered batches are duplicates: nothing applied again,
    # nothing wiped (the library no longer reads an older id as a restart)
    sref = send(new, [new.stored([0x7000], None, E[:BS])])
    model.store(W1, [(0x7000, 0)], le[:1], None)
    sync()
    before = cl.stats()
    for sq in (sref, sref - 3, 1):  # the last batch again, then older ones
        new.resend(sq)
    total[0] += 3
    sync()
    st = cl.stats()
    expect("resent batches: duplicates, no restart", (st["duplicates"] - before["duplicates"],
                                                       st["restarts"], st["gaps"]), (3, 0, 1),
           proc, log)
    check("resent batches wiped nothing", A, la, want="1:0:8")
    check("resent batches applied nothing again", E, le, want="1:0:3 2:0:1")

    # 9. hostile messages: counted as malformed, nothing changes
    huge = b"\x93\xcb" + struct.pack(">d", 1.0) + b"\xdd\xff\xff\xff\xff" + b"\x90" * 8
    wrap = new.payload([new.stored(ha[:2], None, A[:BS], block_size=2 ** 63 + 8)])
    before = cl.stats()
    t0 = time.time()
    new.send_raw(huge, new.seq)
    new.send_raw(wrap, new.seq)
    total[0] += 1  # a well-formed batch (its one event is not): the daemon counts it, and
    # sync() below must wait for it, or a later sync returns one batch early
    new.seq += 1  # that seq is used up; it is not in the replay buffer
    new.buffer[new.seq - 1] = new.payload([])
    rnd = random.Random(1)
    for i in range(200):
        old.send_raw(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64))), old.seq)
    wait_for(lambda: cl.stats()["malformed"] >= before["malformed"] + 150, "garbage", proc, log)
    sync()
    st = cl.stats()
    expect("4-billion-element array and wrapping block_size: malformed, fast",
           (st["malformed"] - before["malformed"] >= 2, time.time() - t0 < 10), (True, True),
           proc, log)
    check("garbage changed nothing", A, la, want="1:0:8")

    # 10. publisher restart: seq back to 0, a new generation: old blocks go
    new.restart()
    send(new, [new.stored(ha[:2], None, A[:2 * BS])])
    model.clear(W1)
    model.store(W1, [(h, 0) for h in ha[:2]], la[:2], None)
    sync()
    st = cl.stats()
    check("publisher restart drops old blocks", A, la, want="1:0:2")
    expect("restart counted", st["restarts"], 1, proc, log)
    send(new, [new.stored(ha[2:3], ha[1], A[2 * BS:3 * BS])])
    model.store(W1, [(ha[2], 0)], la[2:3], (ha[1], 0))
    sync()
    check("restarted stream goes on", A, la, want="1:0:3")

    # 11. warm restart from the snapshot: same answers; the publishers going
    # on are neither a restart nor a gap; identities come back (CPU offload of
    # a block stored before the restart resolves)
    queries = [(A, ""), (B, ""), (C, q), (D, "lora_id=3"), (E, "")]
    answers = [cl.match(t, o) for t, o in queries]
    stop(proc, log, "writes the snapshot")
    proc, log, cl = start("daemon2.log")
    expect("same answers after a warm restart", [cl.match(t, o) for t, o in queries], answers,
           proc, log)
    total[0] = cl.stats()["batches"]
    time.sleep(0.3)  # let the SUB sockets join
    for pub in (new, old):
        def joined(pub=pub):
            before = cl.stats()["batches"]
            pub.send_raw(pub.payload([]), pub.seq - 1)  # a duplicate: changes nothing
            time.sleep(0.05)
            return cl.stats()["batches"] > before
        wait_for(joined, "subscription after restart", proc, log)
    total[0] = cl.stats()["batches"]
    send(new, [new.stored(ha[:1], None, [], block_size=0, medium="CPU"),
               new.removed(ha[:1])])
    model.offload(W1, [(ha[0], 0)])
    model.remove(W1, [(ha[0], 0)])
    sync()
    st = cl.stats()
    check("identities survive the warm restart", A, la, want="1:0:3")
    expect("no restart, no gap after the warm restart", (st["restarts"], st["gaps"],
                                                          st["unresolved"]), (0, 0, 0),
           proc, log)
    stop(proc, log, "after the warm restart")

    # a damaged snapshot: the daemon logs why and starts empty
    good = open(snap, "rb").read()
    for what, data, msg in (("truncated", good[:len(good) // 2], "snapshot ended early"),
                            ("corrupt", good[:30] + bytes([good[30] ^ 1]) + good[31:],
                             "snapshot is corrupt")):
        open(snap, "wb").write(data)
        proc, log, cl = start(f"daemon-{what}.log")
        st = cl.stats()
        expect(f"{what} snapshot: starts empty", (st["blocks"], st["workers"],
                                                  msg in open(log).read()),
               (0, 0, True), proc, log)
        proc.kill()
        proc.wait()

    new.close()
    old.close()
    ctx.term()
    print(f"test-vllm: {checks} checks passed")


if __name__ == "__main__":
    main()
