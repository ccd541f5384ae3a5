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

import weakref

import numpy as np
import pandas as pd

from ._aggregate import AggregateState, frame_of_blob
from ._base import StateStore
from ._rocksdb import KeyCodec, delete, delete_groups, open_for, put, runs, scan
from ._shards import merge_into, values_of

SCAN_CHUNK = 1 << 16            # rows of a range scan decoded at a time
MERGE_CHUNK = 1 << 16           # keys of a batch merged at a time
BUFFER_KEYS = 1 << 16           # keys the batches add in memory before they go to the database


class RocksAggregateState(StateStore):
    """count / sum / min / max / mean per key, in RocksDB (see the module's text).

    ``directory``: where the database goes (a directory of its own is made in it, and
    removed when the store is closed or collected). Or ``shared``: ``(db, base)``, a range
    of another owner's database, every key under the prefix ``base`` (a window's pane);
    closing the store (or collecting it) deletes that range.
    """

    def __init__(self, operator: str, spec: dict, key_name: str, key_groups: int, directory: str | None,
                 shared: tuple | None = None) -> None:
        self.operator, self.spec, self.key_name, self.groups = operator, spec, key_name, key_groups
        # holds no keys: the dtypes, the checks, each batch's own aggregate, partials of split keys
        self.mem = AggregateState(operator, spec, key_name, key_groups)
        if shared is None:
            self.db, self.path, self._closer = open_for(self, operator, directory)
            base = b""
        else:
            (self.db, base), self.path = shared, None
            self._closer = weakref.finalize(self, _drop_range, self.db, base, key_groups)
        self.base = base
        self.held = np.zeros(key_groups, np.int64)       # keys per key group
        self.tables: list[tuple] | None = None           # (table, column) of each value field
        self.row: np.dtype | None = None
        self.codec = KeyCodec(operator, key_name, base)
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
    @property
    def kind(self) -> str | None:
        """The keys' type: "i", "u" or "O" (str); None before any key."""
        return self.codec.kind

    def _encode(self, keys: np.ndarray, groups: np.ndarray) -> list:
        return self.codec.encode(keys, groups)

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
        for raw, vals in scan(self.db, 0, self.groups, SCAN_CHUNK, self.base):
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

    def columns_of(self, frame: pd.DataFrame) -> dict:
        return self.mem.columns_of(frame)

    def update(self, frame: pd.DataFrame, groups: np.ndarray | None = None) -> list:
        """Apply one batch (to the buffer); return its keys, for :meth:`frame`."""
        return self.update_columns(frame[self.key_name].to_numpy(), groups, self.columns_of(frame))

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
        put(self.db, raw, values)

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

    def arrays(self, groups=None, keys: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """:meth:`frame` as ``(keys, {aggregate: values})``: of every key, of key groups
        ``groups`` (range scans), or of those of ``keys`` held here (multi-gets)."""
        if keys is None and groups is None and self._in_buffer():
            return self.buffer.arrays()         # as the memory store's: no snapshot, no copy of the tables
        if keys is None and self._in_buffer():
            taken = self.buffer.snapshot(range(self.groups) if groups is None else groups)
            blob = self._blob([{"keys": p["keys"].copy(), "key_groups": p["key_groups"],
                                "tables": {t: v.copy() for t, v in p["tables"].items()}} for p in taken["parts"]])
            self.buffer.release(taken)
        elif keys is None:
            blob = self.snapshot(range(self.groups) if groups is None else groups)
        else:
            keys = pd.unique(np.asarray(keys))
            keys = keys[self.contains(keys)]
            gs = self._groups_of(keys)
            blob = self._blob([{"keys": keys, "key_groups": gs, "tables": self._read(keys, gs)}])
        if not blob["parts"]:
            return np.empty(0, np.int64), values_of(self.spec, {}, 0, {})
        part = blob["parts"][0]
        return part["keys"], values_of(self.spec, self.dtypes, len(part["keys"]), part["tables"])

    # -- key-group ranges --------------------------------------------------------------------------
    def _runs(self, groups) -> list[tuple[int, int]]:
        """``groups`` as ranges ``[lo, hi)`` of consecutive key groups that hold keys here."""
        return runs(self.held, groups)

    def _scan(self, lo: int, hi: int) -> dict:
        # decoded as it goes: never a list of every key
        chunks = [self._decoded(raw, vals) for raw, vals in scan(self.db, lo, hi, SCAN_CHUNK, self.base)]
        chunks = chunks or [self._decoded([], [])]
        if len(chunks) == 1:
            return chunks[0]
        return {"keys": np.concatenate([c["keys"] for c in chunks]),
                "key_groups": np.concatenate([c["key_groups"] for c in chunks]),
                "tables": {t: np.concatenate([c["tables"][t] for c in chunks]) for t in chunks[0]["tables"]}}

    def _decoded(self, raw: list, vals: list) -> dict:
        keys, groups = self.codec.decode(raw)
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
            delete_groups(self.db, lo, hi, self.base)
            self.held[lo:hi] = 0
        return self._blob(parts)

    def cut_keys(self, keys: np.ndarray, groups: np.ndarray | None = None) -> dict:
        """Take the state of single keys out (those held here)."""
        keys = np.asarray(keys)
        groups = self._groups_of(keys) if groups is None else np.asarray(groups, np.int64)
        self.flush()
        if not len(keys) or self.tables is None:
            return self._blob([])
        # a key asked for twice (several routers' requests joined) is taken once
        once = ~pd.Index(keys).duplicated()
        keys, groups = keys[once], groups[once]
        raw = self._encode(keys, groups)
        old = self.db.get(raw)
        found = np.fromiter((v is not None for v in old), bool, len(old))
        self.mark_dirty(groups[found])
        delete(self.db, [r for r, hit in zip(raw, found.tolist()) if hit])
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
    def _in_buffer(self) -> bool:
        """Whether the buffer holds the whole state (the database none of it yet): a pane
        of a few keys is then read from memory, never written (a window's pane fired and
        expired before the buffer filled)."""
        return self.buffer is not None and not self.held.any()

    def counts(self) -> np.ndarray:
        """Keys per key group, of every group (from the buffer while it holds the whole
        state: no flush)."""
        if self._in_buffer():
            return self.buffer.keys_per_group(np.arange(self.groups))
        self.flush()
        return self.held.copy()

    def keys_per_group(self, groups) -> np.ndarray:
        if self._in_buffer():       # a poll of the loads: the buffer stays where it is
            return self.buffer.keys_per_group(groups)
        self.flush()
        return self.held[np.asarray(groups, np.int64)]

    def __len__(self) -> int:
        if self._in_buffer():
            return len(self.buffer)
        self.flush()
        return int(self.held.sum())

    def approx_len(self) -> int:
        """Keys held, at most (the buffer's keys may be in the database already): no flush."""
        return int(self.held.sum()) + (len(self.buffer) if self.buffer is not None else 0)

    def read_estimate(self, groups=None) -> tuple[int, tuple[str, ...]]:
        """A row per key: the key, and a number per aggregate."""
        rows, kinds = super().read_estimate(groups)
        return rows, (kinds[0], *"f" * len(self.spec))

    def key_kind(self) -> str | None:
        return self.kind


def _drop_range(db, base: bytes, groups: int) -> None:
    """A shared database's range ``base`` (a closed pane) deleted; nothing if the database
    was closed first."""
    try:
        delete_groups(db, 0, groups, base)
    except Exception:
        pass


def _no_split(shards) -> None:
    """A batch's own aggregate is dropped after one merge: its shard never splits."""


def _identity(name: str, dt: np.dtype, n: int) -> np.ndarray:
    if name == "min":
        return np.full(n, np.inf if dt.kind == "f" else np.iinfo(dt).max, dt)
    if name == "max":
        return np.full(n, -np.inf if dt.kind == "f" else np.iinfo(dt).min, dt)
    return np.zeros(n, dt)
