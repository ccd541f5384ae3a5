"""Keyed values: one Python object per key, partitioned by key group, in memory or in
RocksDB behind one interface (a state primitive: an operator kind is written on it once,
and gets either backend).

A batch reads the values of its distinct keys with :meth:`KeyedValues.view`, changes the
returned dict (any key of the batch may be set; none is removed) and hands it back with
:meth:`KeyedValues.write`. In memory the view is the store's own dict and writing is free;
in RocksDB a view is one multi-get of the distinct keys and a write is one write batch,
never a call per record. Key groups are moved, snapshotted and restored as whole ranges
(``cut``, ``snapshot``, ``install``), single keys with ``cut_keys``.
"""
from __future__ import annotations

import abc
import pickle

import numpy as np

from ..keygroups import assign_to_key_group
from ._rocksdb import KeyCodec, delete, delete_groups, open_for, put, runs, scan

SCAN_CHUNK = 1 << 16            # rows of a range scan decoded at a time
WRITE_CHUNK = 1 << 16           # keys installed a write batch
CACHE_KEYS = 1 << 16            # values a RocksDB one keeps in memory between writes


def key_array(keys: list) -> np.ndarray:
    """Python keys as the array the key-group hash takes (strings as objects, not numpy's
    fixed-width unicode)."""
    return np.array(keys, dtype=object if keys and isinstance(keys[0], str) else None)


class KeyedValues(abc.ABC):
    """key -> one Python object, partitioned by ``key_groups`` key groups.

    Keys come as Python lists, their key groups as lists of int (or None: hashed here,
    by the column ``key_name``'s values, when needed). A value must not be changed in place
    once written: a snapshot may share it.
    """

    def __init__(self, key_name: str, key_groups: int) -> None:
        self.key_name, self.groups = key_name, key_groups

    def _hashed(self, keys: list) -> list:
        return assign_to_key_group(key_array(keys), self.groups, name=self.key_name).tolist() if keys else []

    @abc.abstractmethod
    def view(self, keys: list, groups: list | None) -> dict:
        """The values of ``keys`` (distinct; ``groups`` their key groups) held here, as a
        dict key -> value (absent keys absent), for the caller to change and :meth:`write`
        back. The dict may hold other keys too (the memory one is the whole state)."""

    @abc.abstractmethod
    def write(self, view: dict) -> None:
        """Keep what the last :meth:`view` returned, as changed since: every key of that
        view's ``keys`` now in it."""

    @abc.abstractmethod
    def snapshot(self, groups) -> tuple[dict, list]:
        """``({key: value}, [key group of each])`` of the keys of key groups ``groups``."""

    @abc.abstractmethod
    def cut(self, groups) -> tuple[dict, list]:
        """:meth:`snapshot`, the keys removed."""

    @abc.abstractmethod
    def cut_keys(self, keys: list, groups: list | None) -> tuple[dict, list]:
        """Remove single keys (those held here) and return them as :meth:`snapshot` does."""

    @abc.abstractmethod
    def install(self, values: dict, groups: list) -> None:
        """Add ``values`` (``groups``: the key group of each, in order), replacing what
        their keys held."""

    @abc.abstractmethod
    def contains(self, keys: list, groups: list | None) -> np.ndarray:
        """Whether each of ``keys`` has a value here (bool array)."""

    @abc.abstractmethod
    def keys_per_group(self, groups) -> np.ndarray:
        """Keys held of each key group of ``groups`` (int64 array)."""

    @abc.abstractmethod
    def items(self) -> tuple[list, list]:
        """``(keys, values)`` of every key held."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Keys held."""

    @abc.abstractmethod
    def key_kind(self) -> str | None:
        """numpy dtype kind of the keys as the key-group hash sees them (strings: ``"O"``);
        None before any key."""

    def close(self) -> None:
        """Give back what the values hold outside the process (nothing by default)."""


class MemoryValues(KeyedValues):
    """In a dict (``values``), with key group -> its keys (``by_group``) so that a cut is
    O(what moves)."""

    def __init__(self, key_name: str, key_groups: int) -> None:
        super().__init__(key_name, key_groups)
        self.values: dict = {}
        self.by_group: dict[int, set] = {}
        self._new: list = []                     # (key, group) of the keys the last view added

    def _index(self, keys: list, groups: list | None) -> list:
        """Add the keys of ``keys`` without a value yet to ``by_group``; returns them, with
        their key groups."""
        values, by_group = self.values, self.by_group
        if groups is None:
            keys = [k for k in keys if k not in values]
            groups = self._hashed(keys)
        new = [(k, g) for k, g in zip(keys, groups) if k not in values]
        for k, g in new:
            by_group.setdefault(g, set()).add(k)
        return new

    def view(self, keys: list, groups: list | None) -> dict:
        self._new = self._index(keys, groups)
        return self.values

    def write(self, view: dict) -> None:
        """The view was the values themselves: only the new keys a failed batch never
        reached leave ``by_group``."""
        values, by_group = self.values, self.by_group
        for k, g in self._new:
            if k not in values:
                by_group[g].discard(k)
        self._new = []

    def _held(self, groups) -> list:
        values = self.values
        return [(k, g) for g in dict.fromkeys(int(g) for g in groups)
                for k in self.by_group.get(g, ()) if k in values]

    def snapshot(self, groups) -> tuple[dict, list]:
        held, values = self._held(groups), self.values
        return {k: values[k] for k, _ in held}, [g for _, g in held]

    def cut(self, groups) -> tuple[dict, list]:
        groups = [int(g) for g in groups]
        held, values = self._held(groups), self.values
        for g in groups:
            self.by_group.pop(g, None)
        return {k: values.pop(k) for k, _ in held}, [g for _, g in held]

    def cut_keys(self, keys: list, groups: list | None) -> tuple[dict, list]:
        values, out, out_groups = self.values, {}, []
        for k, g in zip(keys, self._hashed(keys) if groups is None else groups):
            if k in values:
                out[k] = values.pop(k)
                out_groups.append(g)
                self.by_group.get(g, set()).discard(k)
        return out, out_groups

    def install(self, values: dict, groups: list) -> None:
        self._index(list(values), groups)
        self.values.update(values)

    def contains(self, keys: list, groups: list | None) -> np.ndarray:
        values = self.values
        return np.fromiter((k in values for k in keys), bool, len(keys))

    def keys_per_group(self, groups) -> np.ndarray:
        return np.array([len(self.by_group.get(int(g), ())) for g in groups], np.int64)

    def items(self) -> tuple[list, list]:
        return list(self.values), list(self.values.values())

    def __len__(self) -> int:
        return len(self.values)

    def key_kind(self) -> str | None:
        return key_array([next(iter(self.values))]).dtype.kind if self.values else None


class RocksValues(KeyedValues):
    """In a RocksDB database of its own (see ``._rocksdb``: key group first), values
    pickled. ``held`` counts the keys of each key group.

    The values a batch read or set stay in memory (``cache``, which is the view: a batch's
    keys already there cost nothing more than in memory) until ``CACHE_KEYS`` keys are
    there, or anything reads or moves the state: then they all go to the database, in one
    write batch (``flush``)."""

    def __init__(self, operator: str, key_name: str, key_groups: int, directory: str) -> None:
        super().__init__(key_name, key_groups)
        self.db, self.path, self._closer = open_for(self, operator, directory)
        self.codec = KeyCodec(operator, key_name)
        self.held = np.zeros(key_groups, np.int64)
        self.cache: dict = {}                    # key -> value, to be written
        self.raw: dict = {}                      # key -> its database key, of the cache's keys
        self._open: tuple | None = None          # (keys, groups, found) the last view read

    def close(self) -> None:
        """Close the database and remove its files."""
        self._closer()

    def _get(self, keys: list, groups: list | None) -> tuple:
        """``(groups, raw keys, stored values or None)`` of ``keys``: one multi-get."""
        if not keys:
            return [], [], []
        groups = self._hashed(keys) if groups is None else groups
        raw = self.codec.encode(key_array(keys), np.asarray(groups, np.int64))
        return groups, raw, self.db.get(raw)

    def view(self, keys: list, groups: list | None) -> dict:
        """The cache, with the values of the keys it lacks read from the database."""
        cache = self.cache
        if groups is None:
            keys = [k for k in keys if k not in cache]
        else:
            missed = [(k, g) for k, g in zip(keys, groups) if k not in cache]
            keys, groups = [k for k, _ in missed], [g for _, g in missed]
        groups, raw, old = self._get(keys, groups)
        loads = pickle.loads
        self.raw.update(zip(keys, raw))
        cache.update((k, loads(v)) for k, v in zip(keys, old) if v is not None)
        self._open = (keys, groups, [v is not None for v in old])
        return cache

    def write(self, view: dict) -> None:
        """Count the keys new to the key groups (a key a failed batch never reached is
        forgotten); flush a full cache."""
        if self._open is None:
            return
        (keys, groups, found), self._open = self._open, None
        cache, new = self.cache, []
        for k, g, f in zip(keys, groups, found):
            if not f:
                if k in cache:
                    new.append(g)
                else:
                    del self.raw[k]
        if new:
            self.held += np.bincount(new, minlength=self.groups)
        if len(cache) >= CACHE_KEYS:
            self.flush()

    def flush(self) -> None:
        """The cache to the database: one write batch, in the database's order."""
        if self.cache:
            dumps, proto, raw = pickle.dumps, pickle.HIGHEST_PROTOCOL, self.raw
            rows = sorted((raw[k], dumps(v, proto)) for k, v in self.cache.items())
            put(self.db, [r for r, _ in rows], [v for _, v in rows])
            self.cache, self.raw = {}, {}

    def _read(self, lo: int, hi: int):
        """``(keys, groups, values)`` of key groups ``[lo, hi)``, a chunk at a time."""
        loads = pickle.loads
        for raw, vals in scan(self.db, lo, hi, SCAN_CHUNK):
            keys, groups = self.codec.decode(raw)
            yield keys.tolist(), groups.tolist(), [loads(v) for v in vals]

    def snapshot(self, groups) -> tuple[dict, list]:
        self.flush()
        out, out_groups = {}, []
        for lo, hi in runs(self.held, groups):
            for keys, gs, vals in self._read(lo, hi):
                out.update(zip(keys, vals))
                out_groups += gs
        return out, out_groups

    def cut(self, groups) -> tuple[dict, list]:
        out, out_groups = self.snapshot(groups)
        for lo, hi in runs(self.held, groups):
            delete_groups(self.db, lo, hi)
            self.held[lo:hi] = 0
        return out, out_groups

    def cut_keys(self, keys: list, groups: list | None) -> tuple[dict, list]:
        self.flush()
        if not keys or self.codec.kind is None:
            return {}, []
        groups, raw, old = self._get(keys, groups)
        loads = pickle.loads
        first = {k: i for i, k in reversed(list(enumerate(keys)))}     # a key asked twice is taken once
        hit = [i for i, v in enumerate(old) if v is not None and first[keys[i]] == i]
        delete(self.db, [raw[i] for i in hit])
        out_groups = [groups[i] for i in hit]
        if hit:
            self.held -= np.bincount(out_groups, minlength=self.groups)
        return {keys[i]: loads(old[i]) for i in hit}, out_groups

    def install(self, values: dict, groups: list) -> None:
        self.flush()
        keys, groups = list(values), list(groups)
        dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
        for a in range(0, len(keys), WRITE_CHUNK):
            ks, gs = keys[a:a + WRITE_CHUNK], groups[a:a + WRITE_CHUNK]
            _, raw, old = self._get(ks, gs)
            put(self.db, raw, [dumps(values[k], proto) for k in ks])
            new = [g for g, v in zip(gs, old) if v is None]
            if new:
                self.held += np.bincount(new, minlength=self.groups)

    def contains(self, keys: list, groups: list | None) -> np.ndarray:
        self.flush()
        if not keys or self.codec.kind is None:
            return np.zeros(len(keys), bool)
        return np.fromiter((v is not None for v in self._get(keys, groups)[2]), bool, len(keys))

    def keys_per_group(self, groups) -> np.ndarray:
        return self.held[np.asarray(groups, np.int64)]

    def items(self) -> tuple[list, list]:
        self.flush()
        keys, vals = [], []
        for k, _, v in self._read(0, self.groups):
            keys += k
            vals += v
        return keys, vals

    def __len__(self) -> int:
        return int(self.held.sum())

    def key_kind(self) -> str | None:
        return self.codec.kind
