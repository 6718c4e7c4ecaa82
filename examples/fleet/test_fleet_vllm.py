#!/usr/bin/python3
"""The fleet bridge on vLLM's ZeroMQ KV event feed, against the vLLM daemon.

Two vLLM-style publishers (array-like with integer block hashes; map-encoded
with sha256 bytes hashes) feed both the kvidx-vllm-events daemon (the
reference: one index fed directly) and `kvidx-fleet bridge --zmq`, which
publishes to JetStream (nats-server -js started here on loopback); a fleet
replica consumes the stream. Mid-run the bridge is killed (-9) and restarted,
nats-server restarts, and one engine restarts (its batch seq starts again at 0). At the end the
replica answers every query (MATCH over stored prompts, WORKER counts)
exactly as the daemon, and the stream holds no duplicate.

    /usr/bin/python3 test_fleet_vllm.py build/kvidx-fleet build/kvidx-vllm-events TMPDIR
"""

import hashlib
import os
import random
import socket
import subprocess
import sys
import time

import msgpack
import zmq

BS = 16
procs = []


def fail(msg):
    print(f"test-fleet-vllm: FAIL: {msg}")
    for p in procs:
        p.kill()
    for name in ("bridge1.log", "bridge2.log", "replica.log", "daemon.log", "nats.log"):
        path = os.path.join(TMP, name)
        if os.path.exists(path):
            print(f"--- {name}")
            print(open(path).read()[-1500:])
    sys.exit(1)


class Publisher:
    def __init__(self, ctx, array_like):
        self.sock = ctx.socket(zmq.PUB)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.array_like = array_like
        self.seq = 0

    def send(self, events):
        if self.array_like:
            evs = []
            for e in events:
                if e["type"] == "BlockStored":
                    evs.append(["BlockStored", e["block_hashes"], e.get("parent_block_hash"),
                                e["token_ids"], BS, None, e.get("medium", "GPU")])
                elif e["type"] == "BlockRemoved":
                    evs.append(["BlockRemoved", e["block_hashes"], e.get("medium", "GPU")])
                else:
                    evs.append(["AllBlocksCleared"])
            batch = [time.time(), evs]
        else:
            evs = []
            for e in events:
                m = {"type": e["type"]}
                if e["type"] == "BlockStored":
                    m.update(block_hashes=e["block_hashes"], parent_block_hash=e.get("parent_block_hash"),
                             token_ids=e["token_ids"], block_size=BS, lora_id=None,
                             medium=e.get("medium", "GPU"))
                    if "group_idx" in e:
                        m["group_idx"] = e["group_idx"]
                elif e["type"] == "BlockRemoved":
                    m.update(block_hashes=e["block_hashes"], medium=e.get("medium", "GPU"))
                evs.append(m)
            batch = {"ts": time.time(), "events": evs}
        self.sock.send_multipart([b"kv-events", self.seq.to_bytes(8, "big"),
                                  msgpack.packb(batch, use_bin_type=True)])
        self.seq += 1


class Client:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.f = self.s.makefile("rb")

    def ask(self, line):
        self.s.sendall(line.encode() + b"\n")
        return self.f.readline().decode().strip()


def wait_for(cond, what, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.05)
    fail(f"timed out waiting for {what}")


def field(line, key):
    for tok in line.split():
        if tok.startswith(key + "="):
            return int(tok.split("=", 1)[1])
    return None


class Engine:
    """A worker's cache: chains of blocks it holds, by hash."""

    def __init__(self, pub, wid, byte_hashes):
        self.pub, self.wid, self.byte_hashes = pub, wid, byte_hashes
        self.held = {}  # hash -> (parent hash, tokens of the chain up to it)
        self.n = 0

    def h(self):
        self.n += 1
        v = (self.wid << 40) + self.n
        return hashlib.sha256(v.to_bytes(8, "big")).digest() if self.byte_hashes else v

    def events(self, rnd, prompts):
        evs = []
        if self.held and rnd.random() < 0.3:
            leaves = [h for h in self.held if all(p != h for p, _ in self.held.values())]
            drop = rnd.sample(leaves, min(len(leaves), rnd.randint(1, 3)))
            for h in drop:
                del self.held[h]
            evs.append({"type": "BlockRemoved", "block_hashes": drop})
        # a new prompt, or an extension of a held chain
        if self.held and rnd.random() < 0.5:
            parent = rnd.choice(list(self.held))
            base = self.held[parent][1]
        else:
            parent, base = None, []
        nb = rnd.randint(1, 4)
        toks = [rnd.randrange(50) if rnd.random() < 0.5 else rnd.randrange(1 << 20) for _ in range(nb * BS)]
        hashes, chain, p = [], list(base), parent
        for b in range(nb):
            chain = chain + toks[b * BS:(b + 1) * BS]
            hsh = self.h()
            self.held[hsh] = (p, chain)
            hashes.append(hsh)
            p = hsh
        ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": toks}
        evs.append(ev)
        prompts.append(chain)
        if not self.pub.array_like and rnd.random() < 0.05:  # another KV cache group: both skip it
            evs.append(dict(ev, block_hashes=[self.h()], parent_block_hash=None,
                            token_ids=toks[:BS], group_idx=1))
        return evs


def main():
    global TMP
    if len(sys.argv) != 4:
        print(__doc__)
        sys.exit(2)
    fleet, daemon, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(TMP, exist_ok=True)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"nats://127.0.0.1:{port}"
    logf = lambda n: open(os.path.join(TMP, n), "ab")
    ns = subprocess.Popen(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port),
                           "-sd", os.path.join(TMP, "store")], stdout=logf("nats.log"), stderr=subprocess.STDOUT)
    procs.append(ns)
    ctx = zmq.Context()
    p1, p2 = Publisher(ctx, True), Publisher(ctx, False)
    e1, e2 = Engine(p1, 1, False), Engine(p2, 2, True)
    eps = [f"tcp://127.0.0.1:{p1.port}", f"tcp://127.0.0.1:{p2.port}"]
    dsock, rsock = os.path.join(TMP, "d.sock"), os.path.join(TMP, "r.sock")
    d = subprocess.Popen([daemon, "--endpoint", f"{eps[0]}=1", "--endpoint", f"{eps[1]}=2",
                          "--listen", "unix:" + dsock, "--kind", "positional"],
                         stdout=logf("daemon.log"), stderr=subprocess.STDOUT)
    procs.append(d)

    def start_bridge(log):
        b = subprocess.Popen([fleet, "bridge", "--nats", url, "--prefix", "zv",
                              "--zmq", f"{eps[0]}=1", "--zmq", f"{eps[1]}=2"],
                             stdout=logf(log), stderr=subprocess.STDOUT)
        procs.append(b)
        return b

    b = start_bridge("bridge1.log")
    r = subprocess.Popen([fleet, "replica", "--nats", url, "--prefix", "zv", "--name", "z1",
                          "--listen", rsock, "--snap-secs", "1"], stdout=logf("replica.log"), stderr=subprocess.STDOUT)
    procs.append(r)
    wait_for(lambda: os.path.exists(dsock) and os.path.exists(rsock), "sockets")
    dc, rc = Client(dsock), Client(rsock)

    def stream_last():
        out = subprocess.run([fleet, "info", "--nats", url, "--prefix", "zv"], capture_output=True, text=True)
        return field(out.stdout, "last") or 0

    def joined():
        """ZeroMQ subscribers join late: rounds of one Cleared per engine
        until the daemon and the stream both got the whole round."""
        for _ in range(200):
            base_d, base_s = field(dc.ask("STATS"), "batches"), stream_last()
            for pub in (p1, p2):
                pub.send([{"type": "AllBlocksCleared"}])
            time.sleep(0.1)
            if field(dc.ask("STATS"), "batches") == base_d + 2 and stream_last() == base_s + 2:
                return
        fail("subscribers did not join")

    wait_for(lambda: stream_last() is not None, "nats")
    joined()
    for eng in (e1, e2):
        eng.held.clear()
    rnd = random.Random(16)
    prompts = []

    def run(n):
        for _ in range(n):
            for eng in (e1, e2):
                eng.pub.send(eng.events(rnd, prompts))
            time.sleep(0.002)

    run(150)
    time.sleep(0.5)  # everything published before the bridge dies
    b.kill()
    b.wait()
    b = start_bridge("bridge2.log")
    joined()  # batches sent while no bridge runs are lost to it: start anew
    e1.held.clear()
    e2.held.clear()
    run(75)
    # nats-server restarts (file store): the bridge's next publish fails, it
    # reconnects and resumes from the stream; ZeroMQ queues the batches
    ns.terminate()
    ns.wait()
    ns2 = subprocess.Popen(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port),
                            "-sd", os.path.join(TMP, "store")], stdout=logf("nats.log"), stderr=subprocess.STDOUT)
    procs.append(ns2)
    run(75)
    # engine 1 restarts: empty cache, batch seq from 0 (no Cleared sent)
    p1.seq = 0
    e1.held.clear()
    run(100)
    # the bridge may still be catching up (its reconnect after the server
    # restart takes a while on a loaded machine: once the replica compared
    # before the engine restart's Cleared reached the stream): wait until the
    # stream's last sequence has not moved for 1.5 s
    last, still, t_end = stream_last(), 0, time.time() + 60
    while still < 6 and time.time() < t_end:
        time.sleep(0.25)
        now = stream_last()
        still = still + 1 if now == last else 0
        last = now
    wait_for(lambda: field(rc.ask("STATUS"), "applied_seq") == last, f"replica at seq {last}", 20)
    st = rc.ask("STATUS")
    for k in ("gaps", "errors", "malformed", "dup_skipped"):
        if field(st, k) != 0:
            fail(f"replica {k} != 0: {st}")
    n = 0
    for chain in prompts[-300:]:
        line = "MATCH " + " ".join(map(str, chain))
        want, got = dc.ask(line), rc.ask(line)
        if want != got:
            fail(f"{line[:60]}...: daemon {want!r}, replica {got!r}")
        n += 1
    for w in (1, 2):
        want, got = dc.ask(f"WORKER {w}"), rc.ask(f"WORKER {w}")
        if want != got or want == "OK blocks=0":
            fail(f"WORKER {w}: daemon {want!r}, replica {got!r}")
        n += 1
    def depth(ans):
        return max([int(t.split(":")[2]) for t in ans.split()[3:]] or [0])
    deep = sum(1 for chain in prompts[-300:] if depth(dc.ask("MATCH " + " ".join(map(str, chain)))) >= 2)
    if deep < 10:
        fail(f"only {deep} queries matched 2+ blocks: the comparison proves little")
    b.terminate()
    b.wait()
    out = open(os.path.join(TMP, "bridge2.log")).read()
    if "engine_restarts=1" not in out or "reconnects=0" in out:
        fail(f"bridge did not see the engine restart and the server restart: {out[-300:]}")
    print(f"test-fleet-vllm: {n} queries ({deep} matching 2+ blocks) identical to the vLLM daemon "
          f"(bridge killed and restarted, nats-server restarted, engine restarted); {st}")
    print("test-fleet-vllm: " + [l for l in out.splitlines() if l.startswith("bridge:")][-1])
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
    print("test-fleet-vllm: ok")


if __name__ == "__main__":
    main()
