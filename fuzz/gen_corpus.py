#!/usr/bin/env python3
"""Writes the seed inputs of fuzz/corpus/<target>/ (seed-*; regress-* files
are kept).  Op encoding: see fuzz/fuzz_common.h (fz_gen_op)."""
import os, struct

HERE = os.path.dirname(os.path.abspath(__file__))

def store(w, parent='root', pidx=0, locs=(0, 1, 2), seqmode='contract', n=None):
    pm = {'root': 0, 'held': 1, 'unknown': 3, 'other': 7}[parent]
    sm = {'contract': 0, 'opaque': 2, 'mixed': 3}[seqmode]
    k = len(locs) if n is None else n
    nb = (k - 1) if 1 <= k <= 8 else (0x80 | k)
    return bytes([0, w, pm, pidx, nb, sm] + list(locs))

def longstore(w, nb=255, seed=(1, 2), parent='root', pidx=0, seqmode='contract'):
    # op code 5: 64 + nb*3/4 blocks, locals from a PRNG seeded by two bytes
    pm = {'root': 0, 'held': 1, 'unknown': 3, 'other': 7}[parent]
    sm = {'contract': 0, 'opaque': 2, 'mixed': 3}[seqmode]
    return bytes([5, w, pm, pidx, nb, sm] + list(seed))

def remove(w, seqbytes=(0,)):
    k = len(seqbytes)
    nb = (k - 1) if 1 <= k <= 4 else (0x80 | k)
    return bytes([6, w, nb] + list(seqbytes))

def clear(wb): return bytes([9, wb])
def rmw(wb): return bytes([10, wb])
def find(src=0, ix=0, mut=0, arg=0, cap=200): return bytes([11, src, ix, mut, arg, cap])
def bulk(k, lo=0, remove=False, distinct=False, stair=False):
    kb = (0x40 | ((k - 1000) // 4)) if k >= 1000 else (k - 1)
    if remove: kb |= 0x80
    return bytes([14, kb, lo | (0x20 if distinct else 0) | (0x40 if stair else 0)])
def check(): return bytes([15])
def arm(a): return bytes([15, a])

def ops_cfg(sel=0, every=False, mw=0x80, jump=0, mb=0, k=0):
    # mw: 0x80 = 16 workers, 0x00 = 1, 0xF4 = default 1024, 0x40|1 = 64, 0xF2 = 1025, 0xFD = 4096
    # every: full check after every op; k: 0..3 -> every 64, 16, 256 ops, only at the end
    return bytes([sel | (4 if every else 0) | (k << 6), mw, jump, mb])

def cap_cfg(heap=False, kind=0, mw=3, mb=20, me=0, jump=4, c5=0, evict=False, pct50=False, defer=False):
    return bytes([(1 if heap else 0) | (kind << 1) | (0x10 if evict else 0) | (0x20 if pct50 else 0) | (0x40 if defer else 0),
                  mw, mb, me, jump, c5])

def ttl_workload():
    # expiry mode: every store carries one more byte (its expiry); op 13 = expire(now)
    def st(w, parent, pidx, locs, exp, sm=0):
        pm = {'root': 0, 'held': 1}[parent]
        return bytes([0, w, pm, pidx, len(locs) - 1, sm, exp] + list(locs))
    return b''.join([
        st(0, 'root', 0, (0, 1, 2, 3), 10), st(1, 'root', 0, (0, 1, 2), 20), st(2, 'root', 0, (0, 1, 3), 0),
        st(0, 'held', 1, (2, 2, 2), 5), st(3, 'root', 0, (0, 1, 2, 3, 0, 1, 2, 3), 30, 2),
        find(0, 0), find(1, 0, 0x41, 3), bytes([13, 6]), find(0, 2), st(0, 'root', 0, (0, 1), 40),
        bytes([13, 15]), find(2, 0), bytes([13, 25]), st(4, 'root', 0, (0, 1, 2, 3, 0, 1, 2, 3), 50), check(),
        bytes([13, 255]), find(0, 0), check(),
    ])

# a workload: shared prefixes, branches, opaque re-stores, holes, queries
def workload():
    return b''.join([
        store(0, locs=(0, 1, 2, 3)),
        store(2, locs=(0, 1, 2)),
        store(3, locs=(0, 1, 3)),
        store(0, 'held', 1, locs=(2, 2, 2)),
        store(1, locs=(0, 1, 2, 3), seqmode='opaque'),
        store(1, locs=(3, 3), seqmode='opaque'),          # re-stores opaque seqs
        store(4, 'unknown', 5, locs=(1,)),                 # ENOPARENT
        store(4, 'other', 0x10, locs=(1,)),                # another worker's seq
        find(0, 0), find(0, 1, 0x41, 3), find(2, 0, 0x81), find(240, 9, 0xC3, 0x21),
        remove(0, (1,)),                                   # hole
        find(0, 2), find(3, 0, 0x42, 1, 2),
        remove(2, (0, 250, 0)),                            # unknown + duplicate
        store(5, locs=(4, 5, 0, 1), seqmode='mixed'),
        store(6, locs=(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1), n=14),
        store(7, 'held', 0, locs=(1,) * 20, n=20),
        find(6, 0), find(6, 3, 0x45, 2, 3), check(),
        clear(0), rmw(1), rmw(3), find(6, 1), clear(250),
        store(0, locs=(0, 1, 2, 3)), find(0, 0, 0, 0, 1), check(),
    ])

def main():
    c = os.path.join(HERE, 'corpus')
    seeds = {
        'fuzz_ops': {
            'seed-basic': ops_cfg() + workload(),
            'seed-default-slots': ops_cfg(mw=0xF4) + workload(),
            'seed-radix-every': ops_cfg(sel=1, every=True, jump=1) + workload(),
            'seed-positional-jump64': ops_cfg(sel=2, jump=64, mw=0x20 | 3) + workload(),
            'seed-one-worker': ops_cfg(mw=0x00) + workload(),
            'seed-maxblocks': ops_cfg(mb=0x80 | 7, jump=3) + workload(),
            'seed-long': ops_cfg(jump=5) + store(0, locs=tuple(i % 4 for i in range(63)), n=63)
                         + store(1, locs=tuple((i * 3) % 4 for i in range(40)), n=40)
                         + find(0, 0) + find(0, 0, 0x40 | 37, 2) + find(1, 0, 0x80 | 9) + check(),
            'seed-bulk-1025': ops_cfg(mw=0xF2, jump=2) + bulk(1008) + bulk(40, 3)
                              + store(0, locs=(0, 1)) + find(240, 1, 0, 0) + find(0, 0)
                              + bulk(500 if False else 60, 0, remove=True) + bulk(20, 0) + check(),
            'seed-bulk-64': ops_cfg(mw=0x40 | 1) + bulk(64) + bulk(3, 2) + find(240, 1) + check()
                            + bulk(10, 5, remove=True) + bulk(12, 20) + check(),
            'seed-long-runs': ops_cfg(jump=7) + longstore(0) + longstore(1, 200, (3, 4)) + longstore(0, 255, (1, 2), 'held', 77)
                              + longstore(2, 255, (9, 9), seqmode='mixed') + longstore(3, 100, (1, 2)) + find(0, 5)
                              + find(0, 100, 0x40 | 50, 1) + find(3, 2, 0x80 | 20) + remove(0, (5, 6, 7, 8)) + find(0, 9) + check()
                              + longstore(4, 255, (5, 6)) + longstore(5, 255, (7, 8)) + longstore(6, 255, (10, 11)) + check(),
            'seed-bulk-distinct': ops_cfg(mw=0xF2, jump=4) + bulk(1200, 0, distinct=True) + store(0, locs=(0, 1, 2))
                                  + find(240, 3) + check() + bulk(300 - 256 + 1, 0, remove=True) + bulk(64, 1, distinct=True) + check(),
            'seed-staircase': ops_cfg(mw=0x40 | 2, jump=3) + bulk(64, 0, stair=True) + bulk(30, 10, stair=True)
                              + find(240, 1) + check() + bulk(12, 3, remove=True) + check(),
            'seed-staircase-1025': ops_cfg(mw=0xF2, jump=8) + bulk(1000, 0, stair=True) + check()
                              + bulk(40, 20, remove=True) + check(),
            'seed-evict-lrs': ops_cfg(mb=0xC0 | 9, jump=2) + workload() + longstore(2, 20) + find(2, 3) + check(),
            'seed-evict-lrs-pct50': ops_cfg(sel=0x20, mb=0xC0 | 20, jump=4) + workload() + bulk(30, 0, stair=True) + check(),
            'seed-evict-lrs-pct1': ops_cfg(sel=0x20 | 0x10, mb=0xC0 | 5) + workload(),
            'seed-evict-expiry': ops_cfg(sel=0x08, mb=0xC0 | 12, jump=3) + ttl_workload(),
            'seed-evict-expiry-big': ops_cfg(sel=0x08 | 0x30, mb=0xC0 | 63, jump=1) + ttl_workload() + ttl_workload(),
            'seed-bulk-4096': ops_cfg(mw=0xFD) + bulk(1252) + bulk(1252, 20) + find(240, 1) + check(),
        },
        'fuzz_capacity': {
            'seed-buffer-radix': cap_cfg(kind=0) + workload(),
            'seed-buffer-positional': cap_cfg(kind=1, mb=8, c5=3) + workload(),
            'seed-buffer-entries': cap_cfg(kind=1, mb=30, me=0x80 | 5) + workload(),
            'seed-buffer-reference': cap_cfg(kind=2, mb=12) + workload(),
            'seed-heap-radix-fail': cap_cfg(heap=True, kind=0, mb=0x80, c5=0x81) + arm(2) + workload()[:60] + arm(0x31) + workload()[60:],
            'seed-heap-positional-fail': cap_cfg(heap=True, kind=1, mb=0x80, c5=0x80) + arm(0x82) + workload() + arm(0) + workload(),
            'seed-heap-reference-fail': cap_cfg(heap=True, kind=2, mb=0x80, c5=0x82) + arm(1) + workload(),
            'seed-heap-grow': cap_cfg(heap=True, kind=1, mw=0x80, mb=0x80, c5=0) + longstore(0) + arm(0x05) + longstore(1, 255, (3, 4))
                              + arm(0x83) + longstore(2, 255, (5, 6)) + bulk(64, 0, distinct=True) + arm(0x20) + longstore(3, 255, (7, 8)),
            'seed-heap-grow-radix': cap_cfg(heap=True, kind=0, mw=0x80, mb=0x80, c5=0) + longstore(0) + arm(0x05) + longstore(1, 255, (3, 4))
                              + arm(0x83) + longstore(2, 255, (5, 6)) + bulk(64, 0, distinct=True) + arm(0x20) + longstore(3, 255, (7, 8)),
            'seed-buffer-evict': cap_cfg(kind=1, mb=10, evict=True) + workload(),
            'seed-buffer-evict-radix': cap_cfg(kind=0, mb=16, evict=True, pct50=True, me=0x80 | 7) + workload(),
            'seed-heap-evict-fail': cap_cfg(heap=True, kind=1, mb=12, evict=True, c5=0x83) + arm(0x03) + workload() + arm(0x85) + workload(),
            'seed-heap-workers': cap_cfg(heap=True, kind=1, mw=1, mb=0x80) + bulk(5) + arm(3) + bulk(5, 2, True) + workload(),
            'seed-heap-defer-free': cap_cfg(heap=True, kind=1, mw=0x80, mb=0x80, c5=0, defer=True) + longstore(0) + arm(0x05)
                              + longstore(1, 255, (3, 4)) + bulk(64, 0, distinct=True) + workload() + arm(0x83) + workload(),
            'seed-heap-defer-free-radix': cap_cfg(heap=True, kind=0, mb=0x80, c5=0x81, defer=True) + arm(2) + workload()
                              + longstore(2, 255, (5, 6)) + workload(),
            'seed-heap-defer-free-reference': cap_cfg(heap=True, kind=2, mb=0x80, c5=0, defer=True) + workload() + workload(),
        },
        'fuzz_snapshot': {
            'seed-roundtrip-basic': bytes([0x04 | (2 << 3)]) + workload(),
            'seed-roundtrip-bytewise': bytes([0x04]) + workload()[:120],
            'seed-roundtrip-long': bytes([0x04 | (3 << 3)]) + longstore(0) + longstore(1, 100, (3, 4)) + remove(0, (5, 6, 7))
                                   + bulk(20, 0, stair=True) + bulk(10, 3, distinct=True),
            'seed-parse-empty': bytes([0x00]),
            'seed-parse-junk': bytes([0x01]) + bytes(range(64)),
        },
        'fuzz_hash': {
            'seed-empty': b'',
            'seed-bs16': bytes([0x40, 0, 0, 0, 0, 0]) + bytes(range(256)),
            'seed-bs0': bytes([0x00, 0, 0, 0, 0, 0]) + bytes(64),
            'seed-bs1-seed': bytes([0x10, 5, 0, 2, 3]) + b'abc' + bytes([2]) + b'ns' + struct.pack('<Q', 42) + bytes(range(100)),
            'seed-bs3-tail': bytes([0x30, 1, 0, 1, 0, 0]) + bytes(range(1, 31)),
            'seed-salted': bytes([0x50, 0, 0, 3, 4]) + b'lora' + bytes([0xFF]) + bytes(range(200)),
            'seed-huge-bs': bytes([0xC0, 0, 0, 0, 0, 0]) + bytes(40),
            'seed-bs300': bytes([0xB0, 44, 0, 0, 0, 0]) + bytes(range(256)) * 5,
        },
    }
    for t, files in seeds.items():
        d = os.path.join(c, t)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith('seed-'):
                os.remove(os.path.join(d, f))
        for name, data in files.items():
            with open(os.path.join(d, name), 'wb') as fh:
                fh.write(data)

if __name__ == '__main__':
    main()
