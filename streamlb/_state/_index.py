"""Dense slots for keys: one incrementally grown hash table per shard of state."""
from __future__ import annotations

import numpy as np
import pandas as pd
from pandas._libs import hashtable as _ht

from ..keygroups import assign_to_key_group


def _grow(arr: np.ndarray, n: int, fill) -> np.ndarray:
    """``arr`` with room for ``n`` items (new room set to ``fill``): at least doubled, so
    appending key by key costs amortised O(1)."""
    if n <= len(arr):
        return arr
    new = np.full(max(n, 2 * len(arr), 1024), fill, dtype=arr.dtype)
    new[: len(arr)] = arr
    return new


def factorize_sized(values, last_distinct: int) -> tuple[np.ndarray, object]:
    """``pd.factorize(values)`` with its hash table sized by the distinct keys of the batch
    before (``last_distinct``; doubled, at least 1,024, at most the rows): sized by the rows,
    as pandas does unless told, a batch of 524,288 rows over a few thousand keys costs about
    6x more (12.9 against 2.2 ms, docs/benchmark-log.md, session 18)."""
    return pd.factorize(values, sort=False, size_hint=min(len(values), max(1024, 2 * last_distinct)))


def first_rows(codes: np.ndarray, n: int) -> np.ndarray:
    """The first row of each code ``0..n-1`` (``codes``: each row's code; 0 for a code no
    row has), vectorised: written back to front, so the first row is written last."""
    first = np.zeros(n, np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    return first


class _KeyIndex:
    """Stable dense slots for keys, grown incrementally (one hash table per shard).

    Each batch is labelled against the table with a fresh vector for its new keys, so the
    cost is O(batch) whatever the number of keys held (pandas' Factorizer copies all its
    keys on every call).
    """

    def __init__(self, dtype=None, size: int = 1024) -> None:
        self._table = None
        self.keys: np.ndarray | None = None
        self.key_groups = np.zeros(0, dtype=np.int64)
        self.n = 0
        if dtype is not None:
            self._make(np.dtype(dtype), max(size, 1024))

    def _make(self, dtype: np.dtype, size: int) -> None:
        if dtype.kind in "iu" and dtype != np.uint64:
            self._table, self._vector, self._dtype = _ht.Int64HashTable(size), _ht.Int64Vector, np.int64
        elif dtype == np.uint64:
            self._table, self._vector, self._dtype = _ht.UInt64HashTable(size), _ht.UInt64Vector, np.uint64
        else:
            self._table, self._vector, self._dtype = _ht.PyObjectHashTable(size), _ht.ObjectVector, object
        self.keys = np.empty(0, dtype=self._dtype)

    @classmethod
    def of_unique(cls, dtype, keys: np.ndarray, key_groups: np.ndarray, size: int = 0) -> "_KeyIndex":
        """An index holding distinct ``keys`` in slots 0..len-1, in their order (its table
        sized for ``size`` keys, at least those): one pass that stores each key's position,
        no labelling, and for integer keys no GIL held."""
        index = cls(dtype, max(size, len(keys)))
        if len(keys):
            index._table.map_locations(np.require(keys, dtype=index._dtype, requirements=["C", "A"]))
        index.keys, index.key_groups, index.n = keys, key_groups, len(keys)
        return index

    @property
    def dtype(self):
        return None if self._table is None else self._dtype

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key, -1 where the key has none."""
        if self._table is None or not len(keys):
            return np.full(len(keys), -1, np.int64)
        try:
            keys = np.require(keys, dtype=self._dtype, requirements=["C", "A"])
        except (TypeError, ValueError, OverflowError):
            return np.full(len(keys), -1, np.int64)     # keys of another type are not here
        return np.asarray(self._table.lookup(keys), dtype=np.int64)

    def slots(self, keys: np.ndarray, groups: np.ndarray | None, n_groups: int, key_name: str) -> np.ndarray:
        """Slots of ``keys``, new keys appended.

        ``groups`` are the keys' key groups. The stores always pass them (a record's group
        is computed once, by its router); None hashes the new keys, for a :class:`KeySet`
        whose caller has no groups.
        """
        if self._table is None:
            self._make(keys.dtype, max(1024, len(keys)))
        keys = np.require(keys, dtype=self._dtype, requirements=["C", "A"])
        old = self.n
        fresh = self._vector()
        labels = self._table.get_labels(keys, fresh, old, -1).astype(np.int64, copy=False)
        added = fresh.to_array()            # keys new in this batch, in slot order from ``old``
        if len(added):
            n = old + len(added)
            self.keys = _grow(self.keys, n, 0 if self._dtype is not object else None)
            self.key_groups = _grow(self.key_groups, n, -1)
            self.keys[old:n] = added
            if groups is None:
                self.key_groups[old:n] = assign_to_key_group(added, n_groups, name=key_name)
            else:
                rows = np.flatnonzero(labels >= old)      # rows of new keys (one pass, not two)
                self.key_groups[labels[rows]] = groups[rows]
            self.n = n
        return labels


class KeySet(_KeyIndex):
    """A set of keys with vectorised membership (``lookup(keys) >= 0``) and insertion
    (``slots``)."""
