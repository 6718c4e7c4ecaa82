"""kvidx - Python binding (ctypes, standard library only) for kvidx.h.

A KV-block index for LLM routers: feed it the KV events of every worker
(Stored / Removed / Cleared), ask it per request how many leading blocks of
the prompt each worker already caches.  Hashing is NVIDIA Dynamo's, byte for
byte, so block hashes agree with Dynamo and with engines that use it.

The shared library is built from the header by ``pip install
./bindings/python`` (installed next to this module) or by ``make python``
(build/libkvidx.so).  It is found, in order: the ``KVIDX_LIB`` environment
variable (a path), the installed package's ``_kvidx_native*.so``,
``build/libkvidx.so`` of the source tree this file sits in, then the system's
``libkvidx.so`` (``ctypes.util.find_library``).

    import kvidx
    ix = kvidx.Index(kind="positional")
    loc = kvidx.block_hashes(tokens, 16)          # local block hashes
    ix.store(worker_id=1, dp_rank=0, local=loc)   # a Stored event
    ix.find_matches(loc)   # [Score(worker_id=1, dp_rank=0, depth=len(loc))]

Errors are raised as ``kvidx.Error`` (``.status`` is the negative code;
subclasses ``NoParent``, ``NotFound``, ``Full``).  ``Index.remove`` raises
``NotFound`` only after removing the seqs it knows, as the C API does.

Thread safety follows the C library: ``find_matches`` may run in any thread
at any time; writes for one worker from one thread at a time.  ctypes drops
the GIL during each call.
"""

import ctypes
import ctypes.util
import importlib.machinery
import os
from collections import namedtuple

__all__ = [
    "SEED", "RADIX", "POSITIONAL", "REFERENCE", "Error", "NoParent",
    "NotFound", "Full", "Score", "Stats", "Index", "hash_seed", "block_hash",
    "block_hashes", "seq_hash_next", "seq_hashes", "version", "library_path",
]

SEED = 1337
RADIX, POSITIONAL, REFERENCE = 0, 1, 2
_KINDS = {"radix": RADIX, "positional": POSITIONAL, "reference": REFERENCE}

OK, EINVAL, ENOMEM, EFULL, ENOPARENT, ENOENT, ENOTSUP = 0, -1, -2, -3, -4, -5, -6

Score = namedtuple("Score", "worker_id dp_rank depth")
Stats = namedtuple("Stats", "blocks workers entries bytes peak_bytes")

_U64 = ctypes.c_uint64
_U32 = ctypes.c_uint32
_SZ = ctypes.c_size_t
_P = ctypes.c_void_p


class _Block(ctypes.Structure):
    _fields_ = [("local", _U64), ("seq", _U64)]


class _Score(ctypes.Structure):
    _fields_ = [("worker_id", _U64), ("dp_rank", _U32), ("depth", _U32)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int), ("max_workers", _U32), ("max_blocks", _SZ),
        ("max_entries", _SZ), ("jump", _U32), ("flags", _U32),
        ("alloc", _P), ("free", _P), ("alloc_ctx", _P),
        ("evict", ctypes.c_int), ("evict_target_pct", _U32),
        ("seed", _U64), ("blocks_per_worker", _SZ),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [(f, _SZ) for f in Stats._fields]


class Error(Exception):
    """A kvidx call failed; ``status`` is the C status code."""

    def __init__(self, status, what=""):
        self.status = status
        msg = _lib.kvidx_strerror(status).decode() if _lib else str(status)
        super().__init__(f"{what}: {msg}" if what else msg)


class NoParent(Error):
    """Stored named a parent the worker does not hold (nothing changed)."""


class NotFound(Error):
    """Removed named seqs the worker does not hold (the known ones were removed)."""


class Full(Error):
    """max_blocks / max_workers / max_entries reached (nothing changed)."""


_ERRORS = {ENOPARENT: NoParent, ENOENT: NotFound, EFULL: Full}


def _check(status, what):
    if status != OK:
        raise _ERRORS.get(status, Error)(status, what)


def _find_library():
    env = os.environ.get("KVIDX_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    # installed package (pip install ./bindings/python): the library setup.py
    # built, next to this file
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        shipped = os.path.join(here, "_kvidx_native" + suffix)
        if os.path.exists(shipped):
            return shipped
    tree = os.path.join(here, "..", "..", "build", "libkvidx.so")
    if os.path.exists(tree):
        return os.path.normpath(tree)
    found = ctypes.util.find_library("kvidx")
    if found:
        return found
    raise OSError("libkvidx.so not found: run `make python` in the kvidx "
                  "tree, or set KVIDX_LIB to its path")


def _load(path):
    lib = ctypes.CDLL(path)
    sig = {
        "kvidx_hash_seed": (_U64, [ctypes.c_char_p, ctypes.c_char_p]),
        "kvidx_block_hash": (_U64, [ctypes.POINTER(_U32), _SZ, _U64]),
        "kvidx_block_hashes": (_SZ, [ctypes.POINTER(_U32), _SZ, _SZ, _U64,
                                     ctypes.POINTER(_U64)]),
        "kvidx_seq_hash_next": (_U64, [_U64, _U64]),
        "kvidx_seq_hashes": (None, [ctypes.POINTER(_U64), _SZ,
                                    ctypes.POINTER(_U64)]),
        "kvidx_create": (ctypes.c_int, [ctypes.POINTER(_P),
                                        ctypes.POINTER(_Config)]),
        "kvidx_destroy": (None, [_P]),
        "kvidx_store": (ctypes.c_int, [_P, _U64, _U32, ctypes.POINTER(_U64),
                                       ctypes.POINTER(_Block), _SZ]),
        "kvidx_remove": (ctypes.c_int, [_P, _U64, _U32, ctypes.POINTER(_U64),
                                        _SZ]),
        "kvidx_clear": (ctypes.c_int, [_P, _U64, _U32]),
        "kvidx_remove_worker": (ctypes.c_int, [_P, _U64]),
        "kvidx_find_matches": (_SZ, [_P, ctypes.POINTER(_U64), _SZ,
                                     ctypes.POINTER(_Score), _SZ]),
        "kvidx_worker_blocks": (_SZ, [_P, _U64, _U32]),
        "kvidx_get_stats": (ctypes.c_int, [_P, ctypes.POINTER(_Stats)]),
        "kvidx_strerror": (ctypes.c_char_p, [ctypes.c_int]),
        "kvidx_version": (ctypes.c_char_p, []),
        "kvidx__check": (ctypes.c_int, [_P]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


_lib = None
library_path = _find_library()
_lib = _load(library_path)


def _u32s(tokens):
    tokens = list(tokens)
    return (_U32 * len(tokens))(*tokens), len(tokens)


def _u64s(values):
    values = [int(v) & 0xFFFFFFFFFFFFFFFF for v in values]
    return (_U64 * len(values))(*values), len(values)


def version():
    """The library's version string, e.g. "0.2.0"."""
    return _lib.kvidx_version().decode()


def hash_seed(lora_name=None, namespace=None):
    """Dynamo's salted seed: 1337 (+ lora name) (+ namespace)."""
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    return _lib.kvidx_hash_seed(enc(lora_name), enc(namespace))


def block_hash(tokens, seed=SEED):
    """XXH3-64 of one block of token ids (u32 little endian)."""
    arr, n = _u32s(tokens)
    return _lib.kvidx_block_hash(arr, n, seed)


def block_hashes(tokens, block_size, seed=SEED):
    """Local hashes of the full blocks of ``tokens`` (the tail is dropped)."""
    arr, n = _u32s(tokens)
    if block_size <= 0:
        return []
    out = (_U64 * (n // block_size + 1))()
    k = _lib.kvidx_block_hashes(arr, n, block_size, seed, out)
    return list(out[:k])


def seq_hash_next(parent_seq, local):
    """The sequence hash of a block whose parent has ``parent_seq``."""
    return _lib.kvidx_seq_hash_next(parent_seq, local)


def seq_hashes(local):
    """Sequence (prefix-chained) hashes of a run of local hashes."""
    arr, n = _u64s(local)
    out = (_U64 * max(n, 1))()
    _lib.kvidx_seq_hashes(arr, n, out)
    return list(out[:n])


class Index:
    """One kvidx index.  Use as a context manager or call close()."""

    def __init__(self, kind="positional", max_workers=0, max_blocks=0,
                 max_entries=0, jump=0, blocks_per_worker=0):
        """blocks_per_worker: the engines' KV cache size in blocks, if known
        (each worker's seq table starts with that room: see kvidx.h)."""
        cfg = _Config()
        cfg.kind = _KINDS[kind] if isinstance(kind, str) else int(kind)
        cfg.max_workers = max_workers
        cfg.max_blocks = max_blocks
        cfg.max_entries = max_entries
        cfg.jump = jump
        cfg.blocks_per_worker = blocks_per_worker
        h = _P()
        _check(_lib.kvidx_create(ctypes.byref(h), ctypes.byref(cfg)), "create")
        self._h = h

    def close(self):
        if self._h:
            _lib.kvidx_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _handle(self):
        if not self._h:
            raise ValueError("index is closed")
        return self._h

    def store(self, worker_id, dp_rank=0, local=(), seq=None, parent=None):
        """A Stored event: blocks ``local`` (with engine seq hashes ``seq``;
        default: computed from ``local`` as Dynamo does, chained from
        ``parent`` if given) appended under ``parent`` (a seq hash the worker
        holds, or None for the root)."""
        local = [int(x) for x in local]
        if seq is None:
            seq, prev = [], parent
            for lo in local:
                prev = lo if prev is None else seq_hash_next(prev, lo)
                seq.append(prev)
        if len(seq) != len(local):
            raise ValueError("local and seq differ in length")
        blocks = (_Block * max(len(local), 1))()
        for i, (lo, sq) in enumerate(zip(local, seq)):
            blocks[i].local = lo & 0xFFFFFFFFFFFFFFFF
            blocks[i].seq = int(sq) & 0xFFFFFFFFFFFFFFFF
        par = None if parent is None else ctypes.byref(
            _U64(int(parent) & 0xFFFFFFFFFFFFFFFF))
        _check(_lib.kvidx_store(self._handle(), worker_id, dp_rank, par,
                                blocks, len(local)), "store")
        return list(seq)

    def remove(self, worker_id, dp_rank=0, seq=()):
        """A Removed event for the given seq hashes (no cascade)."""
        arr, n = _u64s(seq)
        _check(_lib.kvidx_remove(self._handle(), worker_id, dp_rank, arr, n),
               "remove")

    def clear(self, worker_id, dp_rank=0):
        """AllBlocksCleared for one worker."""
        _check(_lib.kvidx_clear(self._handle(), worker_id, dp_rank), "clear")

    def remove_worker(self, worker_id):
        """Forget every dp_rank of worker_id."""
        _check(_lib.kvidx_remove_worker(self._handle(), worker_id),
               "remove_worker")

    def find_matches(self, local, cap=None):
        """Per-worker depth of the longest held prefix of ``local``, as a
        list of Score sorted by depth desc, worker_id, dp_rank asc."""
        arr, n = _u64s(local)
        size = 64 if cap is None else max(int(cap), 0)
        while True:
            out = (_Score * max(size, 1))()
            m = _lib.kvidx_find_matches(self._handle(), arr, n, out, size)
            if cap is not None or m <= size:
                break
            size = m
        return [Score(s.worker_id, s.dp_rank, s.depth)
                for s in out[:min(m, size)]]

    def count_matches(self, local):
        """How many workers hold at least the first block of ``local``."""
        arr, n = _u64s(local)
        out = (_Score * 1)()
        return _lib.kvidx_find_matches(self._handle(), arr, n, out, 0)

    def worker_blocks(self, worker_id, dp_rank=0):
        return _lib.kvidx_worker_blocks(self._handle(), worker_id, dp_rank)

    def stats(self):
        st = _Stats()
        _check(_lib.kvidx_get_stats(self._handle(), ctypes.byref(st)), "stats")
        return Stats(*(getattr(st, f) for f in Stats._fields))

    def check(self):
        """The internal invariant checker: 0 when every invariant holds."""
        return _lib.kvidx__check(self._handle())
