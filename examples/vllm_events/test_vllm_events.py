#!/usr/bin/python3
"""End-to-end test of kvidx-vllm-events with a publisher that speaks vLLM's
KV event protocol (vllm/distributed/kv_events.py, ZmqEventPublisher):
multipart [topic, seq (8 bytes big endian), msgpack EventBatch].

Two publishers stand in for two vLLM instances: one encodes array-like
(older vLLM, array_like=True, integer block hashes, dp rank 1), the other
map-encoded (recent vLLM, msgspec's default, sha256 bytes block hashes).
Covered besides the formats: storage tiers (medium GPU/CPU, MATCHT), event
ids from the batch seq (a gap, a repeated batch, a publisher restart), and a
warm restart of the daemon from its --snapshot file (and from a damaged one).
Everything runs on 127.0.0.1 and a unix socket; the run is bounded.

    /usr/bin/python3 test_vllm_events.py build/kvidx-vllm-events TMPDIR [VECTORS]

Needs Debian's python3-zmq and python3-msgpack.
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import msgpack
import zmq

BS = 16
checks = 0


def fail(msg, proc=None, log=None):
    print(f"test-vllm: FAIL: {msg}")
    if proc is not None:
        proc.kill()
    if log and os.path.exists(log):
        print("--- daemon log ---")
        print(open(log).read()[-4000:])
    sys.exit(1)


class Publisher:
    """A vLLM-style PUB socket on loopback."""

    def __init__(self, ctx, array_like, dp_rank, topic=b"kv-events"):
        self.sock = ctx.socket(zmq.PUB)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.array_like, self.dp_rank, self.topic = array_like, dp_rank, topic
        self.seq = 0

    def send_raw(self, payload, seq=None):
        seq = self.seq if seq is None else seq
        self.sock.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        self.seq = seq + 1

    def send(self, events, seq=None):
        ts = time.time()
        if self.array_like:
            batch = [ts, [self._arr(e) for e in events], self.dp_rank]
        else:
            batch = {"ts": ts, "events": [self._map(e) for e in events]}
            if self.dp_rank:
                batch["data_parallel_rank"] = self.dp_rank
        self.send_raw(msgpack.packb(batch, use_bin_type=True), seq)

    @staticmethod
    def _arr(e):
        kind = e["type"]
        if kind == "BlockStored":
            return ["BlockStored", e["block_hashes"], e.get("parent_block_hash"),
                    e["token_ids"], e["block_size"], e.get("lora_id"),
                    e.get("medium", "GPU")] + (
                        [e["lora_name"]] if "lora_name" in e else [])
        if kind == "BlockRemoved":
            return ["BlockRemoved", e["block_hashes"], e.get("medium", "GPU")]
        if kind == "AllBlocksCleared":
            return ["AllBlocksCleared"]
        return [kind] + e.get("rest", [])

    @staticmethod
    def _map(e):
        m = {"type": e["type"]}
        if e["type"] == "BlockStored":
            m.update(block_hashes=e["block_hashes"],
                     parent_block_hash=e.get("parent_block_hash"),
                     token_ids=e["token_ids"], block_size=e["block_size"],
                     lora_id=e.get("lora_id"), medium=e.get("medium", "GPU"),
                     lora_name=e.get("lora_name"))
        elif e["type"] == "BlockRemoved":
            m.update(block_hashes=e["block_hashes"], medium=e.get("medium", "GPU"))
        if "group_idx" in e:
            m["group_idx"] = e["group_idx"]
        return m


class Client:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(5)
        self.s.connect(path)
        self.f = self.s.makefile("r")

    def ask(self, line):
        self.s.sendall(line.encode() + b"\n")
        return self.f.readline().rstrip("\n")

    def stats(self):
        r = self.ask("STATS")
        return {k: int(v) for k, v in (x.split("=") for x in r.split()[1:])}

    def match(self, tokens, lora=None, cmd="MATCH"):
        pre = f"lora={lora} " if lora else ""
        r = self.ask(cmd + " " + pre + " ".join(map(str, tokens)))
        if not r.startswith("OK "):
            return r
        return r.split(" ", 3)[3] if r.count(" ") >= 3 else ""

    def matcht(self, tokens, lora=None):
        """worker:dp:depth:device_blocks ... (depth on any tier)."""
        return self.match(tokens, lora, "MATCHT")


def expect(what, got, want, proc, log):
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


def sha(i):
    return hashlib.sha256(b"block-%d" % i).digest()


def main():
    daemon, tmp = sys.argv[1], sys.argv[2]
    vectors = sys.argv[3] if len(sys.argv) > 3 else None
    os.makedirs(tmp, exist_ok=True)
    qpath, log = os.path.join(tmp, "q.sock"), os.path.join(tmp, "daemon.log")

    # The daemon refuses a non-loopback query address before binding it.
    r = subprocess.run([daemon, "--endpoint", "tcp://127.0.0.1:1=1",
                        "--listen", "0.0.0.0:7070"], capture_output=True,
                       text=True, timeout=10)
    expect("non-loopback --listen refused", (r.returncode != 0,
           "loopback" in r.stderr), (True, True), None, None)

    ctx = zmq.Context()
    p1 = Publisher(ctx, array_like=True, dp_rank=1)
    p2 = Publisher(ctx, array_like=False, dp_rank=0)
    snap = os.path.join(tmp, "kvidx.snap")
    for f in (snap, snap + ".tmp"):
        if os.path.exists(f):
            os.unlink(f)

    def start(logname, snapshot=snap):
        lg = os.path.join(tmp, logname)
        args = [daemon, "--endpoint", f"tcp://127.0.0.1:{p1.port}=1",
                "--endpoint", f"tcp://127.0.0.1:{p2.port}=2", "--listen",
                f"unix:{qpath}", "--block-size", str(BS), "--topic", "kv-events",
                "--max-seconds", "60"]
        if snapshot:
            args += ["--snapshot", snapshot]
        pr = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(lg, "w"),
                              text=True)
        if pr.stdout.readline().strip() != "ready":
            fail("daemon did not start", pr, lg)
        return pr, lg, Client(qpath)

    def stop(pr, lg, what):
        pr.send_signal(signal.SIGTERM)
        try:
            rc = pr.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fail("daemon did not stop on SIGTERM", pr, lg)
        expect(f"clean exit on SIGTERM ({what})", (rc, os.path.exists(qpath)),
               (0, False), None, None)

    def join(cl, pr, lg):
        # ZeroMQ drops what a PUB sends before the SUB has joined: send empty
        # batches until the daemon has seen one from each publisher.
        for pub in (p1, p2):
            before = cl.stats()["batches"]
            def joined():
                pub.send([])
                time.sleep(0.05)
                return cl.stats()["batches"] > before
            wait_for(joined, "subscription", pr, lg)

    proc, log, cl = start("daemon.log")
    expect("PING", cl.ask("PING"), "OK pong", proc, log)
    join(cl, proc, log)
    base = cl.stats()["batches"]
    sent = 0

    A = list(range(100))            # 6 full blocks of 16 (+ a 4-token tail)
    toks = lambda i, j: A[i * BS:j * BS]  # noqa: E731
    w1 = [1001 + i for i in range(6)]     # integer block hashes
    w2 = [sha(i) for i in range(6)]       # sha256 bytes block hashes

    def settle():
        wait_for(lambda: cl.stats()["batches"] >= base + sent,
                 f"{sent} batches", proc, log)

    # Worker 1 (array-like, dp 1): all 6 blocks in one event.
    p1.send([{"type": "BlockStored", "block_hashes": w1, "token_ids": toks(0, 6),
              "block_size": BS}])
    # Worker 2 (map): blocks 0-1, then block 2 under block 1 (GPU), then
    # blocks 3-5 offloaded to the CPU tier, and an event of KV cache group 1
    # (skipped: only group 0 is indexed).
    p2.send([{"type": "BlockStored", "block_hashes": w2[:2], "token_ids": toks(0, 2),
              "block_size": BS},
             {"type": "BlockStored", "block_hashes": w2[2:3],
              "parent_block_hash": w2[1], "token_ids": toks(2, 3), "block_size": BS}])
    p2.send([{"type": "BlockStored", "block_hashes": w2[3:], "parent_block_hash":
              w2[2], "token_ids": toks(3, 6), "block_size": BS, "medium": "CPU"},
             {"type": "BlockStored", "block_hashes": [sha(99)], "token_ids": toks(0, 1),
              "block_size": BS, "group_idx": 1}])
    sent += 3
    settle()
    expect("both workers (any tier)", cl.match(A), "1:1:6 2:0:6", proc, log)
    expect("MATCHT: device blocks", cl.matcht(A), "1:1:6:6 2:0:6:3", proc, log)
    expect("WORKER 2", cl.ask("WORKER 2 0"), "OK blocks=6", proc, log)

    if vectors:  # given but unreadable: fail, never skip silently
        if not os.path.exists(vectors):
            fail(f"hash vectors not found: {vectors}", proc, log)
        case = json.load(open(vectors))["cases"][0]
        if case["block_size"] == BS and not case["lora_name"] and not case["namespace"]:
            r = cl.ask("MATCHH " + " ".join(case["local_hashes"]))
            expect("Dynamo vector hashes match the same blocks",
                   r.split(" ", 3)[3], cl.match(case["tokens"]), proc, log)

    # Tiers.  Worker 2 offloads blocks 0-2 too: each is then on GPU and CPU.
    p2.send([{"type": "BlockStored", "block_hashes": w2[:3], "token_ids": toks(0, 3),
              "block_size": BS, "medium": "CPU"}])
    sent += 1
    settle()
    expect("CPU copies of GPU blocks", (cl.matcht(A), cl.ask("WORKER 2 0")),
           ("1:1:6:6 2:0:6:3", "OK blocks=6"), proc, log)
    # The GPU evicts blocks 1 and 2: their CPU copies keep the depth, the
    # device count drops.
    p2.send([{"type": "BlockRemoved", "block_hashes": w2[1:3], "medium": "GPU"}])
    sent += 1
    settle()
    expect("GPU removal of offloaded blocks", (cl.match(A), cl.matcht(A)),
           ("1:1:6 2:0:6", "1:1:6:6 2:0:6:1"), proc, log)
    # The CPU tier evicts block 0: its GPU copy still matches; then blocks
    # 3-5, held on the CPU only, go.
    p2.send([{"type": "BlockRemoved", "block_hashes": w2[:1], "medium": "CPU"}])
    sent += 1
    settle()
    expect("CPU removal keeps the GPU copy", cl.matcht(A), "1:1:6:6 2:0:6:1", proc, log)
    p2.send([{"type": "BlockRemoved", "block_hashes": w2[3:], "medium": "CPU"}])
    sent += 1
    settle()
    expect("CPU removal of CPU-only blocks", (cl.matcht(A), cl.ask("WORKER 2 0")),
           ("1:1:6:6 2:0:3:1", "OK blocks=3"), proc, log)

    # Worker 1 evicts block 1 (medium absent = GPU): its depth stops at the hole.
    p1.send([{"type": "BlockRemoved", "block_hashes": [w1[1]], "medium": None}])
    sent += 1
    settle()
    expect("after BlockRemoved", cl.match(A), "2:0:3 1:1:1", proc, log)

    # Worker 2 is reset; then stores a LoRA prompt (seed salted by name).
    p2.send([{"type": "AllBlocksCleared"},
             {"type": "BlockStored", "block_hashes": [sha(100 + i) for i in range(4)],
              "token_ids": toks(0, 4), "block_size": BS, "lora_id": 1,
              "lora_name": "adapter-a"}])
    sent += 1
    settle()
    expect("after AllBlocksCleared", cl.match(A), "1:1:1", proc, log)
    expect("LoRA query", cl.match(toks(0, 4), lora="adapter-a"), "2:0:4", proc, log)
    expect("base-model query ignores LoRA blocks", cl.match(toks(0, 4)), "1:1:1",
           proc, log)

    # Unknown parent, unknown event kind, garbage payload, then two batches
    # missing from worker 1's seq (one gap, reported by kvidx_apply).
    p1.send([{"type": "BlockStored", "block_hashes": [5555], "parent_block_hash": 4444,
              "token_ids": toks(0, 1), "block_size": BS},
             {"type": "FutureEvent", "rest": [1, 2]}])
    p1.send_raw(b"\xc1")
    p1.send([], seq=p1.seq + 2)
    sent += 2
    settle()
    st = cl.stats()
    expect("error counters", (st["enoparent"], st["ignored"], st["malformed"],
                              st["skipped"], st["errors"]), (1, 1, 1, 1, 0), proc, log)
    expect("sequence gap counted", (st["gaps"], st["lost_batches"], st["restarts"],
                                    st["duplicates"]), (1, 2, 0, 0), proc, log)
    expect("gap logged", "batch seq jumped" in open(log).read(), True, proc, log)
    expect("index totals", (st["blocks"], st["workers"]), (5 + 4, 2), proc, log)

    # A gap in worker 2's seq: the batch after it is still applied.
    p2.send([{"type": "BlockStored", "block_hashes": [sha(200)],
              "token_ids": toks(0, 1), "block_size": BS}], seq=p2.seq + 1)
    sent += 1
    settle()
    st = cl.stats()
    expect("batch after a gap applied", (st["gaps"], st["blocks"], cl.match(A)),
           (2, 5 + 4 + 1, "1:1:1 2:0:1"), proc, log)
    # The same batch delivered again: a duplicate, not applied twice.
    p2.send([{"type": "BlockRemoved", "block_hashes": [sha(200)]}], seq=p2.seq - 1)
    sent += 1
    settle()
    st = cl.stats()
    expect("repeated batch is a duplicate", (st["duplicates"], st["restarts"],
                                             st["blocks"], cl.match(A)),
           (1, 0, 10, "1:1:1 2:0:1"), proc, log)
    expect("bad query", cl.ask("MATCH x").split(" ")[0], "ERR", proc, log)
    expect("bad MATCHT query", cl.ask("MATCHT 1 y").split(" ")[0], "ERR", proc, log)

    # Robustness: malformed batches and events of every wrong shape are
    # counted and dropped; the index and the daemon stay as they were.
    import random
    rnd = random.Random(1)
    bad_events = [["BlockStored"], ["BlockStored", "x", None, [1] * BS, BS],
                  ["BlockStored", [1], None, [1] * BS, 0],
                  ["BlockStored", [1, 2], None, [1] * BS, BS],  # too few tokens
                  ["BlockStored", [1], None, [2 ** 40] * BS, BS],
                  ["BlockStored", [1], None, [-1] * BS, BS],
                  ["BlockStored", [1.5], None, [1] * BS, BS],
                  ["BlockStored", [1], [], [1] * BS, BS],
                  ["BlockStored", [1], None, [1] * BS, BS, None, 7],  # medium
                  ["BlockRemoved", "abc"], ["BlockRemoved", [b""]],
                  ["BlockRemoved", [1], 3.5],
                  {"type": "BlockStored", "block_hashes": [1]},
                  {"type": 7}, [], 42, None, "AllBlocksCleared?"]
    before = cl.stats()
    for i in range(300):
        r = rnd.random()
        if r < 0.3:
            p1.send_raw(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64))))
        elif r < 0.4:
            p2.sock.send_multipart([b"kv-events", b"\x00" * 3, b"\x90"])  # bad seq
        elif r < 0.5:
            p1.send_raw(msgpack.packb(rnd.choice([[1.0], {"events": 3}, [1.0, [], -1],
                                                  [1.0, [], 2 ** 40], "x"])))
        else:
            p1.send_raw(msgpack.packb([time.time(), [rnd.choice(bad_events)], 1],
                                      use_bin_type=True))
    wait_for(lambda: cl.ask("PING") == "OK pong" and
             cl.stats()["malformed"] > before["malformed"] + 100, "garbage", proc, log)
    time.sleep(0.3)
    st = cl.stats()
    expect("garbage changed no holdings", (st["blocks"], st["enoparent"], st["efull"],
                                           st["restarts"]),
           (before["blocks"], before["enoparent"], 0, 0), proc, log)
    expect("still serving after garbage", cl.match(A), "1:1:1 2:0:1", proc, log)

    # Worker 1's publisher restarts: its seq starts again at 0.  kvidx_apply
    # sees the event id go back and drops worker 1's old blocks first.
    # (Unparseable batches above are lost batches: gaps were counted.)
    st0 = cl.stats()
    base, sent = st0["batches"], 0
    p1.send([{"type": "BlockStored", "block_hashes": [7001, 7002, 7003],
              "token_ids": toks(0, 3), "block_size": BS}], seq=0)
    sent += 1
    settle()
    st = cl.stats()
    expect("publisher restart drops old blocks", (st["restarts"], cl.match(A),
                                                  cl.ask("WORKER 1 1")),
           (1, "1:1:3 2:0:1", "OK blocks=3"), proc, log)
    expect("restart logged", "publisher restarted" in open(log).read(), True, proc, log)
    p1.send([{"type": "BlockStored", "block_hashes": [7004], "parent_block_hash": 7003,
              "token_ids": toks(3, 4), "block_size": BS}])
    sent += 1
    settle()
    st = cl.stats()
    expect("restarted stream goes on", (st["restarts"], st["gaps"], cl.match(A)),
           (1, st0["gaps"], "1:1:4 2:0:1"), proc, log)

    # Before the warm restart: worker 1 offloads blocks 0-1 to the CPU and
    # the GPU drops block 1 (tiers to keep); worker 2 stores blocks 1-2 and
    # drops block 1 (a hole to keep).
    p1.send([{"type": "BlockStored", "block_hashes": [7001, 7002], "token_ids": toks(0, 2),
              "block_size": BS, "medium": "CPU"},
             {"type": "BlockRemoved", "block_hashes": [7002], "medium": "GPU"}])
    p2.send([{"type": "BlockStored", "block_hashes": [sha(201), sha(202)],
              "parent_block_hash": sha(200), "token_ids": toks(1, 3), "block_size": BS},
             {"type": "BlockRemoved", "block_hashes": [sha(201)]}])
    sent += 2
    settle()
    expect("tiers and a hole before the snapshot", (cl.match(A), cl.matcht(A)),
           ("1:1:4 2:0:1", "1:1:4:3 2:0:1:1"), proc, log)

    # Warm restart: SIGTERM writes the snapshot; a new daemon loads it and
    # answers the same.
    queries = [("MATCH", A), ("MATCHT", A), ("MATCH", toks(0, 4)),
               ("MATCH lora=adapter-a", toks(0, 4)), ("MATCHT", toks(0, 2)),
               ("WORKER", [1, 1]), ("WORKER", [2, 0])]
    ask_all = lambda c: [c.ask(q + " " + " ".join(map(str, t)))  # noqa: E731
                         for q, t in queries]
    answers = ask_all(cl)
    st0 = cl.stats()
    stop(proc, log, "writes the snapshot")
    expect("snapshot written", (os.path.exists(snap), os.path.exists(snap + ".tmp"),
                                f"wrote {st0['blocks']} blocks of {st0['workers']} workers"
                                in open(log).read()),
           (True, False, True), None, None)

    proc, log, cl = start("daemon2.log")
    expect("snapshot loaded", f"loaded {st0['blocks']} blocks of {st0['workers']} workers"
           in open(log).read(), True, proc, log)
    expect("same answers after a warm restart", ask_all(cl), answers, proc, log)
    st = cl.stats()
    expect("same totals", (st["blocks"], st["workers"], st["entries"]),
           (st0["blocks"], st0["workers"], st0["entries"]), proc, log)
    # The event ids came back too: the publishers going on is no restart.
    join(cl, proc, log)
    base, sent = cl.stats()["batches"], 0
    p1.send([{"type": "BlockRemoved", "block_hashes": [7004]}])
    # The engines' own block hashes came back as keys: worker 2 fills its hole.
    p2.send([{"type": "BlockStored", "block_hashes": [sha(201)],
              "parent_block_hash": sha(200), "token_ids": toks(1, 2), "block_size": BS}])
    sent += 2
    settle()
    st = cl.stats()
    expect("event ids and block keys survive the restart",
           (st["restarts"], st["duplicates"], st["enoparent"], cl.matcht(A)),
           (0, 0, 0, "1:1:3:2 2:0:3:3"), proc, log)
    stop(proc, log, "after the warm restart")

    # A damaged snapshot: the daemon logs why and starts empty.
    good = open(snap, "rb").read()
    for what, data, msg in (
            ("truncated", good[:len(good) // 2], "snapshot ended early"),
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

    p1.sock.close(0)
    p2.sock.close(0)
    ctx.term()
    print(f"test-vllm: {checks} checks passed")


if __name__ == "__main__":
    main()
