#!/usr/bin/python3
"""Seeds for fuzz_vllm_decode (fuzz/corpus/fuzz_vllm_decode/seed-*): vLLM
KV-event batches shaped as vllm/distributed/kv_events.py makes them (map and
positional encodings, CPU offload events as the offloading connector makes
them, hybrid groups, extra keys, lora_id-only events, restarts) plus hostile
messages (huge declared counts, block_size 2^63+8).  Needs python3-msgpack.

Input format (see fuzz_vllm_decode.c): config byte, then messages
[flags, seq, len_lo, len_hi, payload]."""
import os
import struct

import msgpack

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "fuzz_vllm_decode")
BS = 4  # config bits 2-3 = 2 -> device block size 4


def stored(hashes, parent, toks, bs=BS, lora_id=None, medium="GPU", lora_name=None,
           extra_keys=None, group_idx=None, kind=None, array=False):
    if array:
        e = ["BlockStored", hashes, parent, toks, bs, lora_id, medium, lora_name]
        tail = [extra_keys, group_idx, kind]
        while tail and tail[-1] is None:
            tail.pop()
        return e + tail
    m = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
         "token_ids": toks, "block_size": bs, "lora_id": lora_id, "medium": medium,
         "lora_name": lora_name}
    for k, v in (("extra_keys", extra_keys), ("group_idx", group_idx),
                 ("kv_cache_spec_kind", kind)):
        if v is not None:
            m[k] = v
    return m


def removed(hashes, medium="GPU", group_idx=None, array=False):
    if array:
        return ["BlockRemoved", hashes, medium] + ([group_idx] if group_idx is not None else [])
    m = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    if group_idx is not None:
        m["group_idx"] = group_idx
    return m


def batch(events, dp=0, array=False, two=False):
    if array:
        b = [1.5, events] if two else [1.5, events, dp]
    else:
        b = {"ts": 1.5, "events": events, "data_parallel_rank": dp}
    return msgpack.packb(b, use_bin_type=True)


def msg(payload, seq, worker=0, fresh=0):
    return bytes([(worker & 1) | (fresh << 1) | ((seq >> 8) << 2 & 0xFC), seq & 0xFF,
                  len(payload) & 0xFF, len(payload) >> 8]) + payload


def write(name, cfg, msgs):
    with open(os.path.join(OUT, "seed-" + name), "wb") as f:
        f.write(bytes([cfg]) + b"".join(msgs))


def toks(i, j):
    return list(range(i * BS, j * BS))


def main():
    os.makedirs(OUT, exist_ok=True)
    cfg = (2 << 2) | 2 | (5 << 5)  # positional, tiers, block size 4, 1024 identities
    h = [1000 + i for i in range(8)]
    # newest vLLM: map encoding, device stores, CPU offload (no tokens, no
    # parent, block_size 0 and 2x), removals per medium, a clear
    write("offload", cfg, [
        msg(batch([stored(h[:4], None, toks(0, 4))]), 0),
        msg(batch([stored(h[4:6], h[3], toks(4, 6))]), 1),
        msg(batch([stored([h[0], h[1]], None, [], bs=0, medium="CPU")]), 2),
        msg(batch([stored([h[3], h[5]], None, [], bs=2 * BS, medium="CPU")]), 3),
        msg(batch([stored([777], None, [], bs=0, medium="CPU")]), 4),
        msg(batch([removed(h[:2]), removed([h[5]], "CPU")]), 5),
        msg(batch([removed(h[:4], "CPU"), {"type": "AllBlocksCleared"}]), 6),
    ])
    # v0.9-era publisher: positional events, two-element batch
    write("v09", cfg, [
        msg(batch([stored(h[:2], None, toks(0, 2), array=True)], array=True, two=True), 0),
        msg(batch([stored(h[2:3], h[1], toks(2, 3), array=True),
                   removed([h[0]], array=True), ["AllBlocksCleared"]], array=True, two=True), 1),
        msg(batch([stored([b"\x01" * 32], None, toks(0, 1), array=True)], array=True, dp=3), 2),
    ])
    # hybrid: group 0 sliding window, group 1 full attention, group 2 MLA
    write("hybrid", cfg, [
        msg(batch([stored(h[:2], None, toks(0, 2), group_idx=0, kind="sliding_window"),
                   stored(h[:2], None, toks(0, 2), group_idx=1, kind="full_attention"),
                   stored(h[:2], None, toks(0, 2), group_idx=2, kind="mla_attention")]), 0),
        msg(batch([removed(h[:1], group_idx=0), removed(h[1:2], group_idx=2),
                   removed(h[:1], group_idx=7)]), 1),
    ])
    # extra keys: cache salt on block 0, mm tuples (new) and ids (old), embeds
    write("extra", cfg, [
        msg(batch([stored(h[:3], None, toks(0, 3), lora_name="ad",
                          extra_keys=[("ad", ("img1", 2), "salt-x"), ("ad", ("img1", -2)),
                                      None])]), 0),
        msg(batch([stored(h[4:6], None, toks(0, 2),
                          extra_keys=[("img-old", b"\x05" * 32), [True, None]])]), 1),
        msg(batch([stored(h[6:7], None, toks(0, 1), extra_keys=[(1.5,)])]), 2),
    ])
    # LoRA: lora_id only (old vLLM), a long name, restarts, duplicates, fresh
    write("lora-restart", cfg, [
        msg(batch([stored(h[:2], None, toks(0, 2), lora_id=7)]), 5),
        msg(batch([stored(h[2:4], None, toks(0, 2), lora_name="n" * 300)]), 6),
        msg(batch([removed(h[:1])]), 6),
        msg(batch([removed(h[:1])]), 4),
        msg(batch([stored(h[:1], None, toks(0, 1))]), 0),
        msg(batch([stored(h[1:2], h[0], toks(1, 2))]), 3, fresh=1),
        msg(batch([stored(h[:1], None, toks(0, 1))], dp=1), 9, worker=1),
        msg(batch([stored(h[:1], None, toks(0, 1))], dp=1), 2, worker=1, fresh=1),
    ])
    # hostile: a 4-billion-element array, a huge map, block_size 2^63+8,
    # truncated and trailing bytes, deep nesting, bad types
    huge_arr = b"\x93\xcb" + struct.pack(">d", 1.0) + b"\xdd\xff\xff\xff\xff" + b"\x00" * 8
    huge_map = b"\xdf\xff\xff\xff\xff" + b"\x00" * 8
    bs_wrap = batch([stored(h[:2], None, toks(0, 1), bs=2 ** 63 + 8)])
    deep = b"\x91" * 200 + b"\xc0"
    tok_huge = msgpack.packb({"ts": 1.0, "events": [
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
         "token_ids": [], "block_size": BS}]})[:-1] + b"\xdd\xff\xff\xff\xf0"
    write("hostile", cfg, [
        msg(huge_arr, 0), msg(huge_map, 1), msg(bs_wrap, 2), msg(deep, 3),
        msg(batch([stored(h[:1], None, toks(0, 1))])[:-3], 4),
        msg(batch([stored(h[:1], None, toks(0, 1))]) + b"\x00", 5),
        msg(tok_huge, 6),
        msg(batch([{"type": 7}, ["FutureEvent", 1], [], 42, {"type": "BlockStored"}]), 7),
        msg(b"\xc1", 8),
    ])
    # radix kind, no tiers flag (non-device copies refused), all groups
    write("radix-notiers", 1 | (3 << 2) | (1 << 4) | (1 << 5), [
        msg(batch([stored(list(range(1, 5)), None, list(range(64)), bs=16)]), 0),
        msg(batch([stored([1, 2], None, [], bs=32, medium="CPU")]), 1),
        msg(batch([stored([9], None, list(range(16)), bs=16, group_idx=3, kind="mamba")]), 2),
    ])


if __name__ == "__main__":
    main()
