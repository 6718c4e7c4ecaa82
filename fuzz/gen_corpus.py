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

def remove(w, seqbytes=(0,)):
    k = len(seqbytes)
    nb = (k - 1) if 1 <= k <= 4 else (0x80 | k)
    return bytes([6, w, nb] + list(seqbytes))

def clear(wb): return bytes([9, wb])
def rmw(wb): return bytes([10, wb])
def find(src=0, ix=0, mut=0, arg=0, cap=200): return bytes([11, src, ix, mut, arg, cap])
def bulk(k, lo=0, remove=False):
    kb = (0x40 | ((k - 1000) // 4)) if k >= 1000 else (k - 1)
    if remove: kb |= 0x80
    return bytes([14, kb, lo])
def check(): return bytes([15])
def arm(a): return bytes([15, a])

def ops_cfg(sel=0, every=False, mw=0x80, jump=0, mb=0):
    # mw: 0x80 = 16 workers, 0x00 = 1, 0xA0 = default 1024, 0x40|1 = 64, 0xC0|2 = 1025, 0xE0|3 = 4096
    return bytes([sel | (4 if every else 0), mw, jump, mb])

def cap_cfg(heap=False, kind=0, mw=3, mb=20, me=0, jump=4, c5=0):
    return bytes([(1 if heap else 0) | (kind << 1), mw, mb, me, jump, c5])

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
            'seed-default-slots': ops_cfg(mw=0xA0) + workload(),
            'seed-radix-every': ops_cfg(sel=1, every=True, jump=1) + workload(),
            'seed-positional-jump64': ops_cfg(sel=2, jump=64, mw=0x20 | 3) + workload(),
            'seed-one-worker': ops_cfg(mw=0x00) + workload(),
            'seed-maxblocks': ops_cfg(mb=0x80 | 7, jump=3) + workload(),
            'seed-long': ops_cfg(jump=5) + store(0, locs=tuple(i % 4 for i in range(63)), n=63)
                         + store(1, locs=tuple((i * 3) % 4 for i in range(40)), n=40)
                         + find(0, 0) + find(0, 0, 0x40 | 37, 2) + find(1, 0, 0x80 | 9) + check(),
            'seed-bulk-1025': ops_cfg(mw=0xC0 | 2, jump=2) + bulk(1008) + bulk(40, 3)
                              + store(0, locs=(0, 1)) + find(240, 1, 0, 0) + find(0, 0)
                              + bulk(500 if False else 60, 0, remove=True) + bulk(20, 0) + check(),
            'seed-bulk-64': ops_cfg(mw=0x40 | 1) + bulk(64) + bulk(3, 2) + find(240, 1) + check()
                            + bulk(10, 5, remove=True) + bulk(12, 20) + check(),
            'seed-bulk-4096': ops_cfg(mw=0xE0 | 3) + bulk(1252) + bulk(1252, 20) + find(240, 1) + check(),
        },
        'fuzz_capacity': {
            'seed-buffer-radix': cap_cfg(kind=0) + workload(),
            'seed-buffer-positional': cap_cfg(kind=1, mb=8, c5=3) + workload(),
            'seed-buffer-entries': cap_cfg(kind=1, mb=30, me=0x80 | 5) + workload(),
            'seed-buffer-reference': cap_cfg(kind=2, mb=12) + workload(),
            'seed-heap-radix-fail': cap_cfg(heap=True, kind=0, mb=0x80, c5=0x81) + arm(2) + workload()[:60] + arm(0x31) + workload()[60:],
            'seed-heap-positional-fail': cap_cfg(heap=True, kind=1, mb=0x80, c5=0x80) + arm(0x82) + workload() + arm(0) + workload(),
            'seed-heap-reference-fail': cap_cfg(heap=True, kind=2, mb=0x80, c5=0x82) + arm(1) + workload(),
            'seed-heap-workers': cap_cfg(heap=True, kind=1, mw=1, mb=0x80) + bulk(5) + arm(3) + bulk(5, 2, True) + workload(),
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
