"""Aggregate state in RocksDB (``state_backend="rocksdb"``): state larger than memory.

One RocksDB database per instance, under ``streamlb.state.dir`` (default: the worker's local
directory), through the ``rocksdict`` binding. A record's row is laid out key group first,
so one key group is one contiguous range of the database: moving, cutting, snapshotting and
dropping a group are range scans and range deletes.

- key: the key group (4 bytes, big-endian), then the key: 8 bytes big-endian for integers
  (the sign bit flipped, so they sort by value), the UTF-8 bytes for strings;
- value: the key's accumulators (count, sum, min, max per input column, as the memory
  store keeps them), 8 bytes each, in a fixed order.

A batch costs one aggregate of its rows in memory (numpy, as the memory store does), one
multi-get of its distinct keys, the merge in numpy and one write batch: never a Python call
per record. RocksDB's block cache and memtables keep the hot keys in memory; the rest is on
disk. Checkpoints, savepoints and migrations see the same blobs as from the memory store, so
a checkpoint restores into either backend. The write-ahead log is off: a lost worker's
state comes back from the job's checkpoint, never from its local database.
"""
from __future__ import annotations

import os
import shutil
import uuid
import weakref

import numpy as np
import pandas as pd

from ..exceptions import KeyTypeError
from ._aggregate import AggregateState, frame_of_blob
from ._base import StateStore
from ._shards import merge_into

_FIXED = np.dtype([("g", ">u4"), ("k", ">u8")])     # a key group and an integer key
_SIGN = np.uint64(1 << 63)
CACHE_BYTES = 64 << 20          # block cache per instance
WRITE_BUFFER = 32 << 20         # memtable size per instance
SCAN_CHUNK = 1 << 16            # rows of a range scan decoded at a time
MERGE_CHUNK = 1 << 16           # keys of a batch merged at a time
BUFFER_KEYS = 1 << 16           # keys the batches add in memory before they go to the database


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


class RocksAggregateState(StateStore):
    """count / sum / min / max / mean per key, in RocksDB (see the module's text).

    ``directory``: where the database goes (a directory of its own is made in it, and
    removed when the store is closed or collected).
    """

    def __init__(self, operator: str, spec: dict, key_name: str, key_groups: int, directory: str) -> None:
        self.operator, self.spec, self.key_name, self.groups = operator, spec, key_name, key_groups
        # holds no keys: the dtypes, the checks, each batch's own aggregate, partials of split keys
        self.mem = AggregateState(operator, spec, key_name, key_groups)
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"{''.join(ch if ch.isalnum() else '_' for ch in operator)[:40]}-"
                                            f"{uuid.uuid4().hex[:12]}")
        self.db = _open(self.path)
        self._closer = weakref.finalize(self, _drop, self.db, self.path)
        self.held = np.zeros(key_groups, np.int64)       # keys per key group
        self.tables: list[tuple] | None = None           # (table, column) of each value field
        self.row: np.dtype | None = None
        self.kind: str | None = None                     # "i", "u" or "O" (str)
        self.buffer: AggregateState | None = None         # see _pending

    @property
    def dtypes(self) -> dict:
        return self.mem.dtypes

    @property
    def inputs(self) -> list:
        return self.mem.inputs

    def _groups_of(self, keys: np.ndarray) -> np.ndarray:
        return self.mem._groups_of(keys)

    def close(self) -> None:
        """Close the database and remove its files."""
        self._closer()

    # -- encoding ------------------------------------------------------------------------------
    def _encode(self, keys: np.ndarray, groups: np.ndarray) -> list:
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
                out.append(_prefix(g) + k.encode())
            return out
        if kind not in "iub":
            raise KeyTypeError(f"operator {self.operator!r}: key column {self.key_name!r} has {keys.dtype} keys; "
                               "with state_backend='rocksdb' keys are integers or strings")
        rows = np.empty(len(keys), _FIXED)
        rows["g"] = groups
        k = keys.astype(np.int64 if self.kind == "i" else np.uint64, copy=False).view(np.uint64)
        rows["k"] = k ^ _SIGN if self.kind == "i" else k
        return rows.view("V12").tolist()

    def _decode_keys(self, raw: list) -> tuple[np.ndarray, np.ndarray]:
        if not raw:
            return np.empty(0, object if self.kind == "O" else np.int64), np.empty(0, np.int64)
        if self.kind == "O":
            groups = np.frombuffer(b"".join(r[:4] for r in raw), ">u4").astype(np.int64)
            return np.array([bytes(r[4:]).decode() for r in raw], dtype=object), groups
        rows = np.frombuffer(b"".join(raw), _FIXED)
        k = rows["k"].astype(np.uint64)
        keys = (k ^ _SIGN).view(np.int64) if self.kind == "i" else k
        return keys, rows["g"].astype(np.int64)

    def _layout(self, tables: dict) -> None:
        if self.tables is None:
            self.tables = sorted(tables)
        row = np.dtype([(f"f{i}", np.int64 if name == "cnt" else self.dtypes[c])
                        for i, (name, c) in enumerate(self.tables)])
        if self.row is not None and row != self.row:
            self._rewrite(row)
        self.row = row

    def _rewrite(self, row: np.dtype) -> None:
        """Every value stored again in the layout ``row``: a column held as integers was
        widened to float64 (``AggregateState.widen``), once per column over the whole state.
        An iterator reads the database as it was when it began, so the writes go alongside."""
        raw, vals = [], []
        for k, v in self.db.items():
            raw.append(k)
            vals.append(v)
            if len(raw) == SCAN_CHUNK:
                self._put(raw, self._relaid(vals, row))
                raw, vals = [], []
        if raw:
            self._put(raw, self._relaid(vals, row))

    def _relaid(self, vals: list, row: np.dtype) -> list:
        """Stored values (in ``self.row``) in the layout ``row``; a minimum or maximum of no
        value becomes the new type's identity."""
        old = np.frombuffer(b"".join(vals), self.row)
        new = np.empty(len(old), row)
        for i, (name, c) in enumerate(self.tables):
            f = f"f{i}"
            new[f] = old[f]
            if name in ("min", "max") and row[f] != self.row[f] and ("cnt", c) in self.tables:
                empty = old[f"f{self.tables.index(('cnt', c))}"] == 0
                new[f][empty] = _identity(name, row[f], 1)[0]
        return new.view(f"V{row.itemsize}").tolist()

    def _values(self, tables: dict, n: int) -> list:
        rows = np.empty(n, self.row)
        for i, t in enumerate(self.tables):
            rows[f"f{i}"] = tables[t]
        return rows.view(f"V{self.row.itemsize}").tolist()

    def _tables_of(self, raw: list) -> dict:
        rows = np.frombuffer(b"".join(raw), self.row) if raw else np.empty(0, self.row)
        return {t: rows[f"f{i}"].copy() for i, t in enumerate(self.tables)}

    # -- data ------------------------------------------------------------------------------------
    def clean(self, frame: pd.DataFrame):
        return self.mem.clean(frame)

    def _pending(self) -> AggregateState:
        """The batches' aggregates not in the database yet (in memory, up to BUFFER_KEYS keys)."""
        if self.buffer is None:
            self.buffer = AggregateState(self.operator, self.spec, self.key_name, self.groups)
            self.buffer.dtypes = self.mem.dtypes      # the first batch sets them for both
            self.buffer._split_large = _no_split      # dropped at the next flush: never worth splitting
        return self.buffer

    def flush(self) -> list:
        """Merge what the batches since the last flush added into the database (before
        anything reads or moves the state, and whenever BUFFER_KEYS keys wait); returns
        ``(keys, their new tables)`` of what it merged."""
        buf, self.buffer = self.buffer, None
        if buf is None:
            return []
        merged = []
        for sh in buf.shards:
            if sh.index.n:
                part = sh.part(np.flatnonzero(sh.present[:sh.index.n]))
                merged.append(self._merge(part["keys"], part["key_groups"], part["tables"]))
        return merged

    def _buffered(self, keys: np.ndarray, groups: np.ndarray) -> list:
        """After a batch went to the buffer: flush if full; what :meth:`frame` reads back."""
        self.mark_dirty(groups)
        if self.kind is None and len(keys):
            self._encode(keys[:1], groups[:1])      # the keys' type, checked on the first batch
        if len(self.buffer) >= BUFFER_KEYS:
            self.flush()
        return [(keys, groups)]

    def update(self, frame: pd.DataFrame, groups: np.ndarray | None = None) -> list:
        """Apply one batch (to the buffer); return its keys, for :meth:`frame`."""
        return self.update_columns(frame[self.key_name].to_numpy(), groups, self.mem.columns_of(frame))

    def update_columns(self, keys: np.ndarray, groups: np.ndarray | None, cols: dict) -> list:
        groups = self._groups_of(keys) if groups is None else groups
        self._pending().update_columns(keys, groups, cols)
        return self._buffered(keys, groups)

    def _merge(self, keys: np.ndarray, groups: np.ndarray, tables: dict) -> tuple:
        """Add ``tables`` (one row per key) to what the keys hold: counts and sums add, minima
        and maxima take the extreme; ``MERGE_CHUNK`` keys at a time (one multi-get and one
        write batch each), so a large batch never holds a Python object per key of it.
        Returns ``(keys, their new tables)``."""
        tables = {t: a if a.flags.writeable else a.copy() for t, a in self.mem._as_held(tables).items()}
        self._layout(tables)
        for t in self.tables:
            if t not in tables:          # a partial without this table: its identity
                tables[t] = _identity(t[0], self.row[f"f{self.tables.index(t)}"], len(keys))
        if keys.dtype.kind in "iub" and len(keys) > 1:      # in the database's order: look-ups and inserts in key order
            order = np.lexsort((keys, groups))
            keys, groups, tables = keys[order], groups[order], {t: v[order] for t, v in tables.items()}
        for a in range(0, len(keys), MERGE_CHUNK):
            b = a + MERGE_CHUNK
            self._merge_chunk(keys[a:b], groups[a:b], {t: v[a:b] for t, v in tables.items()})
        return keys, tables

    def _merge_chunk(self, keys: np.ndarray, groups: np.ndarray, tables: dict) -> None:
        """:meth:`_merge` of one chunk; ``tables``' arrays (views) take the merged values."""
        raw = self._encode(keys, groups)
        old = self.db.get(raw)
        found = np.fromiter((v is not None for v in old), bool, len(old))
        if found.any():
            held = self._tables_of([v for v in old if v is not None])
            for (name, c), arr in held.items():
                merge_into(name, tables[(name, c)], found, arr)
        self.held += np.bincount(groups[~found], minlength=self.groups)
        self._put(raw, self._values(tables, len(keys)))

    def _put(self, raw: list, values: list) -> None:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        for k, v in zip(raw, values):
            wb.put(k, v)
        self.db.write(wb)

    def frame(self, touched: list | None = None) -> pd.DataFrame:
        """State as a DataFrame indexed by key; only the keys a batch touched if given."""
        if touched is None:
            return self.frame_of_groups(range(self.groups))
        merged = self.flush()
        wanted = sum(len(pd.unique(keys)) for keys, _ in touched)
        if merged and sum(len(k) for k, _ in merged) == wanted:
            # the buffer held this batch's keys alone (the usual case: each batch's update
            # is read at once): their new values are what the flush merged
            return frame_of_blob(self, {"parts": [{"keys": k, "tables": t} for k, t in merged]})
        parts = []
        for keys, groups in touched:
            keys, first = np.unique(keys, return_index=True)
            parts.append({"keys": keys, "tables": self._read(keys, np.asarray(groups)[first])})
        return frame_of_blob(self, {"parts": parts})

    def _read(self, keys: np.ndarray, groups: np.ndarray) -> dict:
        """The tables of ``keys`` (each held here), MERGE_CHUNK keys a multi-get."""
        chunks = [self._tables_of(self.db.get(self._encode(keys[a:a + MERGE_CHUNK], groups[a:a + MERGE_CHUNK])))
                  for a in range(0, len(keys), MERGE_CHUNK)]
        return {t: np.concatenate([c[t] for c in chunks]) for t in self.tables} if chunks else {}

    def frame_of_groups(self, groups) -> pd.DataFrame:
        """The state of key groups ``groups`` alone, as :meth:`frame` gives it."""
        return frame_of_blob(self, self.snapshot(groups))

    # -- key-group ranges --------------------------------------------------------------------------
    def _runs(self, groups) -> list[tuple[int, int]]:
        """``groups`` as ranges ``[lo, hi)`` of consecutive key groups that hold keys here."""
        gs = np.unique(np.asarray(groups if isinstance(groups, np.ndarray) else list(groups), np.int64))
        gs = gs[self.held[gs] > 0] if len(gs) else gs
        if not len(gs):
            return []
        breaks = np.flatnonzero(np.diff(gs) != 1) + 1
        return [(int(r[0]), int(r[-1]) + 1) for r in np.split(gs, breaks)]

    def _scan(self, lo: int, hi: int) -> dict:
        from rocksdict import ReadOptions

        ro = ReadOptions()
        ro.set_iterate_upper_bound(_prefix(hi))
        ro.fill_cache(False)
        chunks, raw, vals = [], [], []
        for k, v in self.db.items(from_key=_prefix(lo), read_opt=ro):
            raw.append(k)
            vals.append(v)
            if len(raw) == SCAN_CHUNK:          # decoded as it goes: never a list of every key
                chunks.append(self._decoded(raw, vals))
                raw, vals = [], []
        chunks.append(self._decoded(raw, vals))
        if len(chunks) == 1:
            return chunks[0]
        return {"keys": np.concatenate([c["keys"] for c in chunks]),
                "key_groups": np.concatenate([c["key_groups"] for c in chunks]),
                "tables": {t: np.concatenate([c["tables"][t] for c in chunks]) for t in chunks[0]["tables"]}}

    def _decoded(self, raw: list, vals: list) -> dict:
        keys, groups = self._decode_keys(raw)
        return {"keys": keys, "key_groups": groups, "tables": self._tables_of(vals) if self.tables is not None else {}}

    def _blob(self, parts: list) -> dict:
        parts = [p for p in parts if len(p["keys"])]
        if len(parts) > 1:
            parts = [{"keys": np.concatenate([p["keys"] for p in parts]),
                      "key_groups": np.concatenate([p["key_groups"] for p in parts]),
                      "tables": {t: np.concatenate([p["tables"][t] for p in parts]) for t in parts[0]["tables"]}}]
        return {"dtypes": dict(self.dtypes), "parts": parts}

    def snapshot(self, groups) -> dict:
        """A copy of the state of ``groups``, rows in key-group order."""
        self.flush()
        return self._blob([self._scan(lo, hi) for lo, hi in self._runs(groups)])

    def cut(self, groups) -> dict:
        """Take the state of ``groups`` out (a range scan, then a range delete each run)."""
        groups = list(groups)
        self.flush()
        self.mark_dirty(groups)
        parts = []
        for lo, hi in self._runs(groups):
            parts.append(self._scan(lo, hi))
            self.db.delete_range(_prefix(lo), _prefix(hi))
            self.held[lo:hi] = 0
        return self._blob(parts)

    def cut_keys(self, keys: np.ndarray, groups: np.ndarray | None = None) -> dict:
        """Take the state of single keys out (those held here)."""
        from rocksdict import WriteBatch

        keys = np.asarray(keys)
        groups = self._groups_of(keys) if groups is None else np.asarray(groups, np.int64)
        self.flush()
        if not len(keys) or self.tables is None:
            return self._blob([])
        raw = self._encode(keys, groups)
        old = self.db.get(raw)
        found = np.fromiter((v is not None for v in old), bool, len(old))
        self.mark_dirty(groups[found])
        wb = WriteBatch(raw_mode=True)
        for r, hit in zip(raw, found.tolist()):
            if hit:
                wb.delete(r)
        self.db.write(wb)
        self.held -= np.bincount(groups[found], minlength=self.groups)
        return self._blob([{"keys": keys[found], "key_groups": groups[found],
                            "tables": self._tables_of([v for v in old if v is not None])}])

    def install(self, blob: dict) -> None:
        """Merge state cut from another instance (or read from a checkpoint)."""
        for c, dt in blob["dtypes"].items():
            self.dtypes.setdefault(c, dt)
        self.flush()
        for part in blob["parts"]:
            if len(part["keys"]):
                self.mark_dirty(part["key_groups"])
                self._merge(np.asarray(part["keys"]), np.asarray(part["key_groups"], np.int64),
                            dict(part["tables"]))

    def contains(self, keys: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
        self.flush()
        keys = np.asarray(keys)
        if not len(keys) or self.tables is None:
            return np.zeros(len(keys), bool)
        groups = self._groups_of(keys) if groups is None else np.asarray(groups, np.int64)
        return np.fromiter((v is not None for v in self.db.get(self._encode(keys, groups))), bool, len(keys))

    # -- split keys ------------------------------------------------------------------------------
    def partial(self, frame: pd.DataFrame, groups: np.ndarray | None = None) -> dict:
        """The aggregate of ``frame``'s rows alone, for another instance's :meth:`combine`."""
        return self.mem.partial(frame, groups)

    def combine(self, blob: dict) -> list:
        """Partial aggregates (a helper's, or the router's per batch) into the buffer."""
        for c, dt in blob["dtypes"].items():
            self.dtypes.setdefault(c, dt)
        parts = [p for p in blob["parts"] if len(p["keys"])]
        if not parts:
            return []
        self._pending().combine({"dtypes": blob["dtypes"], "parts": parts})
        keys = np.concatenate([np.asarray(p["keys"]) for p in parts])
        return self._buffered(keys, np.concatenate([np.asarray(p["key_groups"], np.int64) for p in parts]))

    # -- sizes -----------------------------------------------------------------------------------
    def keys_per_group(self, groups) -> np.ndarray:
        self.flush()
        return self.held[np.asarray(groups, np.int64)]

    def __len__(self) -> int:
        self.flush()
        return int(self.held.sum())

    def approx_len(self) -> int:
        """Keys held, at most (the buffer's keys may be in the database already): no flush."""
        return int(self.held.sum()) + (len(self.buffer) if self.buffer is not None else 0)

    def key_kind(self) -> str | None:
        return self.kind


def _no_split(shards) -> None:
    """A batch's own aggregate is dropped after one merge: its shard never splits."""


def _identity(name: str, dt: np.dtype, n: int) -> np.ndarray:
    if name == "min":
        return np.full(n, np.inf if dt.kind == "f" else np.iinfo(dt).max, dt)
    if name == "max":
        return np.full(n, -np.inf if dt.kind == "f" else np.iinfo(dt).min, dt)
    return np.zeros(n, dt)
