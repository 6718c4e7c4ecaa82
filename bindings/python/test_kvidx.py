"""unittest for the ctypes binding: Dynamo hash vectors and index semantics.

    make test-python          (builds build/libkvidx.so first)
    KVIDX_VECTORS=path/to/dynamo_hash_vectors.json python3 -m unittest ...
"""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvidx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# vendored in the repository (tests/PROVENANCE.md); missing = a failure
VECTORS = os.environ.get("KVIDX_VECTORS") or os.path.join(
    HERE, "..", "..", "tests", "dynamo_hash_vectors.json")
KINDS = ("radix", "positional", "reference")


def prompt(n_blocks, block_size=16, base=0):
    return [base + i for i in range(n_blocks * block_size)]


class TestHashVectors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(VECTORS):
            raise FileNotFoundError(
                f"hash vectors not found at {VECTORS} (set KVIDX_VECTORS)")
        with open(VECTORS) as f:
            cls.vec = json.load(f)

    def test_cases(self):
        self.assertGreater(len(self.vec["cases"]), 0)
        for case in self.vec["cases"]:
            with self.subTest(case=case["name"]):
                seed = kvidx.hash_seed(case["lora_name"], case["namespace"])
                self.assertEqual(seed, int(case["seed"]))
                loc = kvidx.block_hashes(case["tokens"], case["block_size"], seed)
                self.assertEqual(loc, [int(x) for x in case["local_hashes"]])
                self.assertEqual(kvidx.seq_hashes(loc),
                                 [int(x) for x in case["seq_hashes"]])

    def test_single_block_and_chain(self):
        case = self.vec["cases"][0]
        bs, toks = case["block_size"], case["tokens"]
        self.assertEqual(kvidx.block_hash(toks[:bs], kvidx.SEED),
                         int(case["local_hashes"][0]))
        seqs = [int(x) for x in case["seq_hashes"]]
        locs = [int(x) for x in case["local_hashes"]]
        self.assertEqual(kvidx.seq_hash_next(seqs[0], locs[1]), seqs[1])

    def test_seed_defaults(self):
        self.assertEqual(kvidx.hash_seed(), kvidx.SEED)
        self.assertEqual(kvidx.hash_seed("", ""), kvidx.SEED)
        self.assertNotEqual(kvidx.hash_seed(None, "ns"), kvidx.SEED)

    def test_tail_and_zero_block(self):
        self.assertEqual(kvidx.block_hashes(list(range(10)), 16), [])
        self.assertEqual(kvidx.block_hashes(list(range(40)), 0), [])
        self.assertEqual(len(kvidx.block_hashes(list(range(40)), 16)), 2)


class TestIndex(unittest.TestCase):
    def test_version(self):
        self.assertRegex(kvidx.version(), r"^\d+\.\d+\.\d+$")

    def test_two_workers_scores_and_order(self):
        loc = kvidx.block_hashes(prompt(6), 16)
        for kind in KINDS:
            with self.subTest(kind=kind), kvidx.Index(kind) as ix:
                ix.store(2, 0, loc)
                ix.store(1, 3, loc[:3])
                ix.store(1, 1, loc[:3])
                ix.store(9, 0, loc[:1])
                self.assertEqual(ix.find_matches(loc), [
                    kvidx.Score(2, 0, 6), kvidx.Score(1, 1, 3),
                    kvidx.Score(1, 3, 3), kvidx.Score(9, 0, 1)])
                self.assertEqual(ix.find_matches(loc, cap=2),
                                 [kvidx.Score(2, 0, 6), kvidx.Score(1, 1, 3)])
                self.assertEqual(ix.count_matches(loc), 4)
                self.assertEqual(ix.find_matches(loc[1:]), [])
                self.assertEqual(ix.worker_blocks(1, 1), 3)
                st = ix.stats()
                self.assertEqual((st.blocks, st.workers), (13, 4))
                self.assertEqual(ix.check(), 0)

    def test_parent_chain_and_opaque_seqs(self):
        loc = kvidx.block_hashes(prompt(4), 16)
        opaque = [1000 + i for i in range(4)]  # engine seq hashes, any value
        for kind in KINDS:
            with self.subTest(kind=kind), kvidx.Index(kind) as ix:
                ix.store(5, 0, loc[:2], seq=opaque[:2])
                ix.store(5, 0, loc[2:], seq=opaque[2:], parent=opaque[1])
                self.assertEqual(ix.find_matches(loc), [kvidx.Score(5, 0, 4)])
                with self.assertRaises(kvidx.NoParent):
                    ix.store(5, 0, loc[:1], seq=[7], parent=424242)
                self.assertEqual(ix.worker_blocks(5, 0), 4)

    def test_remove_leaves_hole_no_cascade(self):
        loc = kvidx.block_hashes(prompt(5), 16)
        for kind in KINDS:
            with self.subTest(kind=kind), kvidx.Index(kind) as ix:
                seq = ix.store(1, 0, loc)
                ix.remove(1, 0, [seq[2]])
                self.assertEqual(ix.find_matches(loc), [kvidx.Score(1, 0, 2)])
                self.assertEqual(ix.worker_blocks(1, 0), 4)
                with self.assertRaises(kvidx.NotFound):
                    ix.remove(1, 0, [seq[3], 12345])
                self.assertEqual(ix.worker_blocks(1, 0), 3)  # known one went
                ix.store(1, 0, loc)  # re-store fills the hole
                self.assertEqual(ix.find_matches(loc), [kvidx.Score(1, 0, 5)])

    def test_clear_and_remove_worker(self):
        loc = kvidx.block_hashes(prompt(3), 16)
        for kind in KINDS:
            with self.subTest(kind=kind), kvidx.Index(kind) as ix:
                ix.store(1, 0, loc)
                ix.store(1, 1, loc)
                ix.store(2, 0, loc)
                ix.clear(2, 0)
                ix.clear(77, 0)  # unknown worker: fine
                self.assertEqual([s.worker_id for s in ix.find_matches(loc)], [1, 1])
                ix.remove_worker(1)
                self.assertEqual(ix.find_matches(loc), [])
                self.assertEqual(ix.stats().blocks, 0)

    def test_blocks_per_worker_makes_room(self):
        # the config field reaches the library: the room is paid for at the
        # first store, the answers are the same
        loc = kvidx.block_hashes(prompt(8), 16)
        with kvidx.Index("positional") as plain, \
                kvidx.Index("positional", blocks_per_worker=100000) as roomy:
            plain.store(1, 0, loc)
            roomy.store(1, 0, loc)
            self.assertEqual(roomy.find_matches(loc), plain.find_matches(loc))
            self.assertGreater(roomy.stats().bytes, plain.stats().bytes + 1000000)

    def test_capacity_full_changes_nothing(self):
        loc = kvidx.block_hashes(prompt(8), 16)
        for kind in KINDS:
            with self.subTest(kind=kind), kvidx.Index(kind, max_blocks=10) as ix:
                ix.store(1, 0, loc)
                with self.assertRaises(kvidx.Full):
                    ix.store(2, 0, loc[:3])
                self.assertEqual(ix.stats().blocks, 8)
                self.assertEqual(ix.find_matches(loc), [kvidx.Score(1, 0, 8)])
                ix.store(2, 0, loc[:2])
                self.assertEqual(ix.stats().blocks, 10)

    def test_kinds_agree_on_random_workload(self):
        import random
        rnd = random.Random(7)
        prompts = [kvidx.block_hashes(prompt(rnd.randint(1, 10), 16, 1000 * p), 16)
                   for p in range(6)]
        # a shared prefix between prompts 0..2
        for p in (1, 2):
            prompts[p] = prompts[0][:2] + prompts[p][2:]
        ixs = [kvidx.Index(k) for k in KINDS]
        try:
            for step in range(300):
                w, p = rnd.randint(0, 4), rnd.randrange(len(prompts))
                loc = prompts[p]
                op = rnd.random()
                seqs = kvidx.seq_hashes(loc)
                k = rnd.randrange(len(seqs))
                for ix in ixs:
                    if op < 0.6:
                        ix.store(w, 0, loc)
                    elif op < 0.9:
                        try:
                            ix.remove(w, 0, [seqs[k]])
                        except kvidx.NotFound:
                            pass
                    else:
                        ix.clear(w, 0)
                for q in prompts:
                    got = [ix.find_matches(q) for ix in ixs]
                    self.assertEqual(got[0], got[2], f"step {step}")
                    self.assertEqual(got[1], got[2], f"step {step}")
            for ix in ixs:
                self.assertEqual(ix.check(), 0)
        finally:
            for ix in ixs:
                ix.close()

    def test_closed_index(self):
        ix = kvidx.Index()
        ix.close()
        ix.close()
        with self.assertRaises(ValueError):
            ix.find_matches([1])

    def test_error_codes(self):
        with self.assertRaises(kvidx.Error) as cm:
            kvidx.Index(kind=99)
        self.assertEqual(cm.exception.status, -1)


if __name__ == "__main__":
    unittest.main()
