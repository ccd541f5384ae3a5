"""What every store in RocksDB shares (``state_backend="rocksdb"``): one database per
instance, its keys laid out key group first, so a key group is one contiguous range.

- a key: the key group (4 bytes, big-endian), then the key: 8 bytes big-endian for
  integers (the sign bit flipped, so they sort by value), the UTF-8 bytes for strings;
- the database: ``rocksdict`` in raw mode, a block cache and memtables per instance, bloom
  filters (most keys a batch looks up are new), no write-ahead log (a lost worker's state
  comes back from the job's checkpoint, never from its local database); in a directory of
  its own, removed when its owner is closed or collected.
"""
from __future__ import annotations

import os
import shutil
import uuid
import weakref

import numpy as np

from ..exceptions import KeyTypeError

_FIXED = np.dtype([("g", ">u4"), ("k", ">u8")])     # a key group and an integer key
_SIGN = np.uint64(1 << 63)
CACHE_BYTES = 64 << 20          # block cache per instance
WRITE_BUFFER = 32 << 20         # memtable size per instance


def _open(path: str):
    from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteOptions

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_write_buffer_size(WRITE_BUFFER)
    opts.set_max_write_buffer_number(2)
    table = BlockBasedOptions()
    table.set_block_cache(Cache(CACHE_BYTES))
    table.set_bloom_filter(10, False)       # a new key's look-up skips the files (most keys of a batch)
    opts.set_block_based_table_factory(table)
    opts.set_memtable_prefix_bloom_ratio(0.1)
    opts.set_memtable_whole_key_filtering(True)
    db = Rdict(path, opts)
    wo = WriteOptions()
    wo.disable_wal = True
    db.set_write_options(wo)
    return db


def _drop(db, path: str) -> None:
    try:
        db.close()
    except Exception:
        pass
    shutil.rmtree(path, ignore_errors=True)


def _prefix(g: int) -> bytes:
    return int(g).to_bytes(4, "big")


def open_for(owner, operator: str, directory: str) -> tuple:
    """A new database for ``owner`` (a store) in a directory of its own under ``directory``:
    ``(db, path, closer)``; ``closer()`` (called at the latest when ``owner`` is collected)
    closes it and removes its files."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{''.join(ch if ch.isalnum() else '_' for ch in operator)[:40]}-"
                                   f"{uuid.uuid4().hex[:12]}")
    db = _open(path)
    return db, path, weakref.finalize(owner, _drop, db, path)


class KeyCodec:
    """Keys and their key groups as the database's keys, and back. The keys' type (``kind``:
    ``"i"``, ``"u"`` or ``"O"`` for strings) is set by the first keys encoded; another type
    later is refused naming the operator and its key column. ``base``: bytes before every
    key (several stores in one database, each its own range: a window's panes)."""

    def __init__(self, operator: str, key_name: str, base: bytes = b"") -> None:
        self.operator, self.key_name, self.base = operator, key_name, base
        self.kind: str | None = None

    def encode(self, keys: np.ndarray, groups: np.ndarray) -> list:
        kind = keys.dtype.kind
        if self.kind is None:
            self.kind = "O" if kind in "OUST" else ("u" if kind == "u" else "i")
        if self.kind == "O":
            if kind not in "OUST":
                raise KeyTypeError(f"operator {self.operator!r}: key column {self.key_name!r} held strings "
                                   f"and now has {keys.dtype} keys; one type of key per operator")
            out = []
            for g, k in zip(groups.tolist(), keys.tolist()):
                if not isinstance(k, str):
                    raise KeyTypeError(f"operator {self.operator!r}: key {k!r} in column {self.key_name!r} is a "
                                       f"{type(k).__name__}; with state_backend='rocksdb' keys are integers or "
                                       "strings")
                out.append(self.base + _prefix(g) + k.encode())
            return out
        if kind not in "iub":
            raise KeyTypeError(f"operator {self.operator!r}: key column {self.key_name!r} has {keys.dtype} keys; "
                               "with state_backend='rocksdb' keys are integers or strings")
        rows = np.empty(len(keys), _FIXED)
        rows["g"] = groups
        k = keys.astype(np.int64 if self.kind == "i" else np.uint64, copy=False).view(np.uint64)
        rows["k"] = k ^ _SIGN if self.kind == "i" else k
        if self.base:
            return [self.base + r for r in rows.view("V12").tolist()]
        return rows.view("V12").tolist()

    def decode(self, raw: list) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, key groups)`` of the database's keys ``raw``."""
        if not raw:
            return np.empty(0, object if self.kind == "O" else np.int64), np.empty(0, np.int64)
        if self.base:
            n = len(self.base)
            raw = [r[n:] for r in raw]
        if self.kind == "O":
            groups = np.frombuffer(b"".join(r[:4] for r in raw), ">u4").astype(np.int64)
            return np.array([bytes(r[4:]).decode() for r in raw], dtype=object), groups
        rows = np.frombuffer(b"".join(raw), _FIXED)
        k = rows["k"].astype(np.uint64)
        keys = (k ^ _SIGN).view(np.int64) if self.kind == "i" else k
        return keys, rows["g"].astype(np.int64)


def put(db, raw: list, values: list) -> None:
    """Write ``values`` under the keys ``raw``: one write batch."""
    from rocksdict import WriteBatch

    wb = WriteBatch(raw_mode=True)
    for k, v in zip(raw, values):
        wb.put(k, v)
    db.write(wb)


def delete(db, raw: list) -> None:
    """Delete the keys ``raw``: one write batch."""
    from rocksdict import WriteBatch

    wb = WriteBatch(raw_mode=True)
    for k in raw:
        wb.delete(k)
    db.write(wb)


def delete_groups(db, lo: int, hi: int, base: bytes = b"") -> None:
    """Delete every key of key groups ``[lo, hi)`` (under ``base``): one range delete."""
    db.delete_range(base + _prefix(lo), base + _prefix(hi))


def runs(held: np.ndarray, groups) -> list[tuple[int, int]]:
    """``groups`` as ranges ``[lo, hi)`` of consecutive key groups of ``groups``, each
    from its first to its last group that holds keys (``held``: keys per key group): the
    groups between that hold none cost a scan nothing, a scan per run of held groups cost
    a window's firing most of its time where keys are few per group."""
    gs = np.unique(np.asarray(groups if isinstance(groups, np.ndarray) else list(groups), np.int64))
    if not len(gs):
        return []
    out = []
    for r in np.split(gs, np.flatnonzero(np.diff(gs) != 1) + 1):
        full = np.flatnonzero(held[r] > 0)
        if len(full):
            out.append((int(r[full[0]]), int(r[full[-1]]) + 1))
    return out


def scan(db, lo: int, hi: int, chunk: int, base: bytes = b""):
    """The rows of key groups ``[lo, hi)`` (under ``base``) as ``(keys, values)`` lists of at
    most ``chunk`` rows each, in key order (an empty range yields nothing); the block cache
    is left as it was."""
    from rocksdict import ReadOptions

    ro = ReadOptions()
    ro.set_iterate_upper_bound(base + _prefix(hi))
    ro.fill_cache(False)
    raw, vals = [], []
    for k, v in db.items(from_key=base + _prefix(lo), read_opt=ro):
        raw.append(k)
        vals.append(v)
        if len(raw) == chunk:
            yield raw, vals
            raw, vals = [], []
    if raw:
        yield raw, vals
