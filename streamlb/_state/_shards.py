"""Shards of aggregate state: each holds the keys of a range of key groups.

A shard knows its owner only as a :class:`ShardOwner` (what the aggregate store offers
its shards), so this module imports nothing of ``_aggregate``, which builds the shards.
"""
from __future__ import annotations

import concurrent.futures
from typing import Protocol

import numpy as np
import pandas as pd

from ._index import _grow, _KeyIndex

# A shard is rebuilt with only its live keys once fewer than this share of its slots are
# live, so the memory of state moved away is given back while a migration still runs.
COMPACT_BELOW = 0.75


def _add_float(target: np.ndarray, labels: np.ndarray, values: np.ndarray, n: int) -> None:
    """``target[labels] += values`` with repeats summed, in order.

    A bincount over the ``n`` slots in use is cheapest while they are few against the
    batch; past that, ``ufunc.at`` (fast in numpy 2) keeps the cost O(batch), not O(state).
    """
    if n <= 8 * len(labels):
        target[:n] += np.bincount(labels, weights=values, minlength=n)
    else:
        np.add.at(target, labels, values)


def _cuts(held: np.ndarray, lo: int, hi: int, parts: int) -> np.ndarray:
    """Key-group edges cutting the keys of groups ``lo..hi-1`` (``held``: keys per group)
    into ``parts`` about equal pieces."""
    cum = np.cumsum(held)
    cuts = lo + 1 + np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts)
    return np.unique(np.clip(np.concatenate(([lo], cuts, [hi])), lo, hi))


class ShardOwner(Protocol):
    """What a shard reads of the store that owns it
    (:class:`~streamlb._state._aggregate.AggregateState`)."""

    spec: dict                      # output column -> (input column, how)
    key_name: str
    groups: int                     # key groups of the operator
    hows: dict[str, set[str]]       # input column -> the aggregates kept of it
    dtypes: dict[str, np.dtype]     # input column -> dtype of its state

    def split_at(self, lo: int) -> int:
        """Keys past which the shard starting at key group ``lo`` splits."""


class _PendingSplit:
    """A shard split in the background: the hash tables of its pieces are built in a
    thread from a snapshot of its slots (dead ones too: a key cut away and then updated
    again comes back to life in its old slot); the shard keeps taking updates meanwhile.
    Once built, the pieces take the keys added since, and the values, on the event loop:
    a copy, no hashing of the snapshot's keys."""

    def __init__(self, sh: "_AggShard", parts: int, pool: concurrent.futures.Executor) -> None:
        self.shard, self.index, self.lo, self.hi = sh, sh.index, sh.lo, sh.hi
        n = self.n = sh.index.n
        # the snapshot is the index's arrays as they are: slots below n never change (new
        # keys take new slots; growing an array makes a new one), so the thread reads them
        keys, kg, dtype = sh.index.keys, sh.index.key_groups, sh.index.dtype
        edges = self.edges = _cuts(sh.held, sh.lo, sh.hi, parts)
        sizes = [sh.o.split_at(lo) + 1 for lo in edges[:-1].tolist()]
        self.slots: list = []

        def build() -> list:
            which = np.searchsorted(edges, kg[:n], side="right") - 1
            slots = [np.flatnonzero(which == i) for i in range(len(edges) - 1)]
            out = [_KeyIndex.of_unique(dtype, keys[sel], kg[sel], size)
                   for sel, size in zip(slots, sizes)]     # the snapshot's keys are distinct
            self.slots = slots
            return out

        self.future = pool.submit(build)

    def adopt(self, shards: list) -> "list[_AggShard] | None":
        """The pieces, filled; None when the shard changed shape meanwhile (compacted,
        carved, split at once, dropped): then the work is thrown away."""
        sh = self.shard
        if (not any(s is sh for s in shards) or sh.index is not self.index
                or (sh.lo, sh.hi) != (self.lo, self.hi) or self.future.exception() is not None):
            return None
        indexes = self.future.result()
        n = sh.index.n
        late = np.arange(self.n, n)                     # slots added since the snapshot
        late_kg = sh.index.key_groups[self.n:n]
        which = np.searchsorted(self.edges, late_kg, side="right") - 1
        pieces = []
        for i, (idx, sel) in enumerate(zip(indexes, self.slots)):
            extra = late[which == i]
            if len(extra):
                idx.slots(sh.index.keys[extra], late_kg[which == i], sh.o.groups, sh.o.key_name)
            src = np.concatenate([sel, extra])         # the old slot of each new slot
            piece = _AggShard(sh.o, int(self.edges[i]), int(self.edges[i + 1]))
            piece.index = idx
            piece._layout()
            piece.present[: len(src)] = sh.present[src]
            piece.held = sh.held[piece.lo - sh.lo:piece.hi - sh.lo].copy()
            for c in sh.o.dtypes:
                for name, table in sh._tables(c):
                    if c in table:
                        getattr(piece, name)[c][: len(src)] = table[c][src]
            pieces.append(piece)
        return pieces


class _AggShard:
    """The state of the keys of some key groups: a key index and one array per aggregate."""

    def __init__(self, owner: ShardOwner, lo: int, hi: int) -> None:
        self.o = owner
        self.lo, self.hi = lo, hi                       # key groups lo..hi-1
        self.index = _KeyIndex()
        self.present = np.zeros(0, bool)
        self.held = np.zeros(hi - lo, np.int64)       # live keys per key group lo..hi-1
        self.cnt: dict[str, np.ndarray] = {}
        self.sum: dict[str, np.ndarray] = {}
        self.min: dict[str, np.ndarray] = {}
        self.max: dict[str, np.ndarray] = {}

    @property
    def live(self) -> int:
        return int(self.held.sum())

    def _count(self, slots: np.ndarray) -> np.ndarray:
        """Keys per key group of this shard among ``slots``."""
        return np.bincount(self.index.key_groups[slots] - self.lo, minlength=self.hi - self.lo)

    def _mark_live(self, slots: np.ndarray, old_n: int) -> None:
        """``slots`` hold state now: the new ones (from ``old_n``) and dead ones revived (a
        key cut away and given state here again)."""
        # most slots of a batch hold state already: look at the few that do not (new or
        # revived), rather than gather and scatter every slot of the batch
        fresh = slots[~self.present[slots]]
        back = fresh[fresh < old_n]
        self.present[fresh] = True
        if old_n < self.index.n:
            self.held += self._count(np.arange(old_n, self.index.n))
        if len(back):
            self.held += self._count(np.unique(back))

    def widen(self, c: str) -> None:
        """Hold column ``c``'s sums, minima and maxima as float64 (its owner's dtype now);
        a minimum or maximum of no value becomes the float identity."""
        for name, table in self._tables(c):
            if name == "cnt" or c not in table:
                continue
            vals = table[c].astype(np.float64)
            if name in ("min", "max"):
                cnt = self.cnt[c]
                k = min(len(vals), len(cnt))
                vals[:k][cnt[:k] == 0] = self._identity(name, vals.dtype)
            table[c] = vals

    def _identity(self, table: str, dt: np.dtype):
        if table == "min":
            return np.inf if dt.kind == "f" else np.iinfo(dt).max
        if table == "max":
            return -np.inf if dt.kind == "f" else np.iinfo(dt).min
        return 0

    def _tables(self, c: str):
        hows = self.o.hows[c]
        yield "cnt", self.cnt
        if hows & {"sum", "mean"}:
            yield "sum", self.sum
        if "min" in hows:
            yield "min", self.min
        if "max" in hows:
            yield "max", self.max

    def _layout(self) -> None:
        """Arrays for every column known to the operator, grown to the slots in use."""
        n = self.index.n
        self.present = _grow(self.present, n, False)
        for c, dt in self.o.dtypes.items():
            for name, table in self._tables(c):
                if c not in table:
                    table[c] = np.full(len(self.present), self._identity(name, dt),
                                       np.int64 if name == "cnt" else dt)
                table[c] = _grow(table[c], n, self._identity(name, dt))

    def update(self, keys: np.ndarray, groups: np.ndarray, cols: dict) -> np.ndarray:
        old_n = self.index.n
        labels = self.index.slots(keys, groups, self.o.groups, self.o.key_name)
        self._layout()
        self._mark_live(labels, old_n)
        for c, arr in cols.items():
            dt = self.o.dtypes[c]
            if arr.dtype.kind == "f":
                valid = ~np.isnan(arr)
                lab, vals = (labels, arr) if valid.all() else (labels[valid], arr[valid])
            elif arr.dtype.kind in "iub":
                lab, vals = labels, arr.astype(dt, copy=False)
            else:
                lab, vals = labels[~pd.isna(arr)], None
            np.add.at(self.cnt[c], lab, 1)
            if vals is None:
                continue
            if c in self.sum:
                if dt.kind == "f":
                    _add_float(self.sum[c], lab, vals, self.index.n)
                else:
                    np.add.at(self.sum[c], lab, vals)   # int64 stays exact
            if c in self.min:
                np.minimum.at(self.min[c], lab, vals)
            if c in self.max:
                np.maximum.at(self.max[c], lab, vals)
        return labels

    def columns(self) -> dict:
        """Every state array of this shard by ``(table, column)`` (whole, not copies)."""
        return {(name, c): table[c] for c in self.o.dtypes for name, table in self._tables(c) if c in table}

    def _rows(self, sel: np.ndarray) -> dict:
        return {t: arr[sel].copy() for t, arr in self.columns().items()}

    def slots_of(self, groups, ordered: bool = False) -> np.ndarray:
        """Slots of the keys with state here in key groups ``groups`` (of this shard);
        ``ordered``: sorted by key group (stable), as a checkpoint file stores them."""
        n = self.index.n
        groups = np.asarray(groups, np.int64)
        if not self.held[groups - self.lo].any():        # nothing held for them: no scan
            return np.zeros(0, np.int64)
        if len(np.unique(groups)) == self.hi - self.lo:  # the whole shard: no membership test
            sel = np.flatnonzero(self.present[:n])
        else:
            sel = np.flatnonzero(self.present[:n] & np.isin(self.index.key_groups[:n], groups))
        if ordered and len(sel):
            # key groups of a shard span fewer than 2**16 values: a radix sort on uint16
            rel = (self.index.key_groups[sel] - self.lo).astype(np.uint16)
            sel = sel[np.argsort(rel, kind="stable")]
        return sel

    def held_slots(self, keys: np.ndarray) -> np.ndarray:
        """Slots of those of ``keys`` that have state here."""
        slots = self.index.lookup(keys)
        slots = slots[slots >= 0]
        return np.unique(slots[self.present[slots]])

    def part(self, sel: np.ndarray) -> dict:
        """The keys in slots ``sel`` and their rows, as a blob part (copies)."""
        n = self.index.n
        return {"keys": self.index.keys[sel].copy() if n else np.empty(0, np.int64),
                "key_groups": self.index.key_groups[sel].copy(), "tables": self._rows(sel)}

    def take(self, sel: np.ndarray) -> dict:
        """Cut the keys in slots ``sel`` out: their rows, as a blob part."""
        n = self.index.n
        blob = self.part(sel)
        if len(sel):
            self.present[sel] = False
            self.held -= self._count(sel)
            if self.live < COMPACT_BELOW * n:
                self._compact()
            else:
                for c, dt in self.o.dtypes.items():
                    for name, table in self._tables(c):
                        table[c][sel] = self._identity(name, dt)
        return blob

    def _compact(self) -> None:
        """Rebuild the shard with only its live keys: a fresh table and arrays, in slot order."""
        n = self.index.n
        keep = np.flatnonzero(self.present[:n])
        rows = self._rows(keep)
        self.index = _KeyIndex.of_unique(self.index.dtype, self.index.keys[keep], self.index.key_groups[keep])
        self.present = np.ones(len(keep), bool)
        self.cnt, self.sum, self.min, self.max = {}, {}, {}, {}
        for (name, c), vals in rows.items():
            getattr(self, name)[c] = vals

    def _put(self, keys: np.ndarray, key_groups: np.ndarray, tables: dict) -> np.ndarray:
        old_n = self.index.n
        slots = self.index.slots(keys, key_groups, self.o.groups, self.o.key_name)
        self._layout()
        for (name, c), vals in tables.items():
            merge_into(name, getattr(self, name)[c], slots, vals)
        self._mark_live(slots, old_n)
        return slots

    def split(self, parts: int = 2) -> list["_AggShard"]:
        """Up to ``parts`` shards with about equal shares of this one's live keys, cut at
        key-group boundaries, each table sized for its split size (no rehash until its
        next split)."""
        n = self.index.n
        keep = np.flatnonzero(self.present[:n])
        kg = self.index.key_groups[keep]
        edges = _cuts(self.held, self.lo, self.hi, parts)
        rows = self._rows(keep)
        which = np.searchsorted(edges, kg, side="right") - 1
        out = []
        for i, (lo, hi) in enumerate(zip(edges[:-1].tolist(), edges[1:].tolist())):
            sel = which == i
            sh = _AggShard(self.o, lo, hi)
            sh.index = _KeyIndex.of_unique(self.index.dtype, self.index.keys[keep[sel]], kg[sel],
                                           self.o.split_at(lo) + 1)
            sh.present = np.ones(int(sel.sum()), bool)
            sh.held = self.held[lo - self.lo:hi - self.lo].copy()
            for (name, c), vals in rows.items():
                getattr(sh, name)[c] = vals[sel]
            out.append(sh)
        return out

    def frame(self, slots: np.ndarray | None = None) -> pd.DataFrame:
        keys, values = self.arrays(slots)
        return pd.DataFrame(values, index=pd.Index(keys, name=self.o.key_name))

    def arrays(self, slots: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """What :meth:`frame` holds, as ``(keys, {aggregate: values})`` (no frame built)."""
        n = self.index.n
        sel = np.flatnonzero(self.present[:n]) if slots is None else slots
        keys = self.index.keys[sel] if self.index.keys is not None else np.empty(0, np.int64)
        wanted = {(how if how in ("min", "max") else "sum", c) for c, how in self.o.spec.values()}
        tables = {t: a[sel] for t, a in self.columns().items() if t[0] == "cnt" or t in wanted}
        return keys, values_of(self.o.spec, self.o.dtypes, len(keys), tables)


def merge_into(table: str, target: np.ndarray, at: np.ndarray, vals: np.ndarray) -> None:
    """Merge ``vals`` into ``target[at]`` (distinct positions) by the rule of ``table``:
    counts and sums add, minima and maxima take the extreme."""
    if table in ("cnt", "sum"):
        target[at] += vals
    elif table == "min":
        target[at] = np.minimum(target[at], vals)
    else:
        target[at] = np.maximum(target[at], vals)


def frame_of(spec: dict, dtypes: dict, key_name: str, keys: np.ndarray, tables: dict) -> pd.DataFrame:
    """The aggregates ``spec`` names, indexed by key, from the state tables of ``keys``
    (``(table, column)`` -> one value per key; a column not seen yet counts nothing)."""
    return pd.DataFrame(values_of(spec, dtypes, len(keys), tables), index=pd.Index(keys, name=key_name))


def values_of(spec: dict, dtypes: dict, n: int, tables: dict) -> dict:
    """The columns of :func:`frame_of`, for ``n`` keys."""
    out = {}
    for name, (c, how) in spec.items():
        if c not in dtypes or ("cnt", c) not in tables:
            out[name] = np.zeros(n, np.int64 if how == "count" else np.float64)
            continue
        cnt = tables[("cnt", c)]
        if how == "count":
            out[name] = cnt
        elif how == "sum":
            out[name] = tables[("sum", c)]
        elif how == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                out[name] = tables[("sum", c)] / np.where(cnt == 0, np.nan, cnt)
        else:
            v = tables[(how, c)]
            out[name] = np.where(cnt > 0, v, np.nan) if (cnt == 0).any() else v
    return out
