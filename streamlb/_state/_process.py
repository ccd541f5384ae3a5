"""State of a ``process`` operator: per key, the user's state and its event-time timers, on
the keyed-values primitive (:mod:`._values`), so it lives in memory or in RocksDB.

A key's entry is ``[state, timers]`` (``timers``: a set of int64 ns); a key with neither
is dropped. A batch (and a watermark's due timers) opens one view of its distinct keys
(:meth:`ProcessState.open`: in RocksDB one multi-get), the user's functions change the
entries of that view through their :class:`Context`, and :meth:`ProcessState.write` keeps
them (one write batch, and one delete batch for the keys dropped). Due timers are found
with a heap of ``(time, seq, key, key group)`` held in memory with either backend (the
timer index; the timers themselves are in the entries), whose stale items (a timer
cancelled, or its key moved away) are skipped; timers of key groups held while they move
wait until the move is done here. Blobs are ``{"states": {key: [state, sorted timers]},
"key_groups": ...}`` with either backend, pickled per key in checkpoints.
"""
from __future__ import annotations

import copy
import heapq
import itertools

import numpy as np
import pandas as pd

from .._time import MIN_TIME, UNITS
from ..keygroups import assign_to_key_group
from ._base import StateStore
from ._keydict import KeyDict
from ._rocksdb import delete
from ._values import KeyedValues, MemoryValues, RocksValues, key_array

_ABSENT = object()


class MemoryEntries(MemoryValues):
    """Keyed values in memory that can also forget keys a view dropped."""

    def forget(self, gone: dict) -> None:
        """``gone``: key -> key group of keys removed from the view (the values dict itself)."""
        by_group = self.by_group
        for k, g in gone.items():
            ks = by_group.get(g)
            if ks is not None:
                ks.discard(k)


class RocksEntries(RocksValues):
    """Keyed values in RocksDB that can also forget keys a view dropped: one delete batch."""

    def forget(self, gone: dict) -> None:
        """``gone``: key -> key group of keys the last view held and the batch dropped."""
        keys, groups = list(gone), list(gone.values())
        delete(self.db, self.codec.encode(key_array(keys), np.asarray(groups, np.int64)))
        self.held -= np.bincount(groups, minlength=self.groups)


class Context:
    """What ``func`` and ``on_timer`` of ``process`` see of their key: ``state`` (read and
    assign), ``watermark``, ``timer(time)`` and ``cancel(time)``."""

    __slots__ = ("_store", "_key", "_group", "_entry")

    def __init__(self, store: ProcessState, key, group: int) -> None:
        self._store, self._key, self._group = store, key, group
        self._entry = store.view.get(key) or [None, set()]

    @property
    def state(self):
        return self._entry[0]

    @state.setter
    def state(self, value) -> None:
        self._entry[0] = value

    @property
    def watermark(self):
        """The operator's watermark, in the event-time column's type (None before the first)."""
        return self._store.from_ns(self._store.watermark) if self._store.watermark > MIN_TIME else None

    def timer(self, time) -> None:
        """Call ``on_timer(key, time, ctx)`` once the watermark passes ``time`` (a timestamp,
        or an integer in the event-time column's unit)."""
        t = self._store.to_ns(time)
        if t not in self._entry[1]:
            self._entry[1].add(t)
            heapq.heappush(self._store.heap, (t, next(self._store.seq), self._key, self._group))

    def cancel(self, time) -> None:
        self._entry[1].discard(self._store.to_ns(time))


class ProcessState(KeyDict, StateStore):
    """Entries ``[state, timers]`` per key in ``values`` (a :class:`~._values.KeyedValues`
    that can ``forget``: :class:`MemoryEntries` by default, or :class:`RocksEntries`)."""

    def __init__(self, operator: str, funcs, key_name: str, key_groups: int, clock: dict,
                 values: KeyedValues | None = None) -> None:
        self.operator, self.key_name, self.groups = operator, key_name, key_groups
        self.func, self.on_timer = (getattr(f, "func", f) if f is not None else None for f in funcs)
        self.unit = clock.get("unit")
        self.values = MemoryEntries(key_name, key_groups) if values is None else values
        self.shared = isinstance(self.values, MemoryValues)     # a view is the values themselves
        self.view: dict = self.values.values if self.shared else {}    # the open view: key -> [state, timers]
        self._gone: dict = {}               # key -> group of the view's keys dropped
        self._pending = False               # a view is open
        self.due_groups: dict = {}          # key -> group of the last due() timers
        self.heap: list = []
        self.seq = itertools.count()
        self.watermark = MIN_TIME
        self._no_holds(key_groups)

    def close(self) -> None:
        """Give back what the values hold outside the process (a RocksDB database)."""
        self.values.close()

    def to_ns(self, time) -> int:
        if self.unit is None:
            return int(pd.Timestamp(time).value)
        return int(time) * UNITS[self.unit]

    def from_ns(self, ns: int):
        return pd.Timestamp(ns) if self.unit is None else ns // UNITS[self.unit]

    # -- a batch's (or a watermark's) view ------------------------------------------------------
    def open(self, keys: list, groups: list) -> None:
        """Read the entries of ``keys`` (distinct; ``groups`` theirs): one view, until
        :meth:`write`."""
        self._pending = bool(keys)
        if self._pending:
            self.view, self._gone = self.values.view(keys, groups), {}

    def context(self, key, group: int) -> Context:
        return Context(self, key, group)

    def settle(self, key, g: int, ctx: Context) -> None:
        """Keep what ``ctx`` left of ``key`` in the view (drop the key when it holds nothing)."""
        entry = ctx._entry
        if entry[0] is None and not entry[1]:
            if self.view.pop(key, _ABSENT) is not _ABSENT:
                self._gone[key] = g
        else:
            self.view[key] = entry
            self._gone.pop(key, None)
        self.mark_dirty([g])

    def write(self) -> None:
        """Keep the open view (also after a function raised: what it set before stays)."""
        if not self._pending:
            return
        self._pending = False
        self.values.write(self.view)
        if self._gone:
            self.values.forget(self._gone)
        self._gone = {}
        if not self.shared:
            self.view = {}

    def due(self, watermark: int) -> list:
        """``(time, key)`` of each timer the watermark passed (time < watermark), in time order,
        each removed from its key; opens the view of their keys (:meth:`write` keeps it) and
        sets ``due_groups`` (key -> key group)."""
        self.watermark = max(self.watermark, watermark)
        held = self.held.any()       # even at +inf: until the move is done here (end lets go)
        popped, later = [], []
        while self.heap and self.heap[0][0] < self.watermark:
            item = heapq.heappop(self.heap)
            (later if held and self.held[item[3]] else popped).append(item)   # moving: after the move
        for item in later:
            heapq.heappush(self.heap, item)
        groups = {}
        for _, _, key, g in popped:
            groups.setdefault(key, g)
        self.open(list(groups), list(groups.values()))
        self.due_groups = groups
        out, view = [], self.view
        for t, _, key, _ in popped:
            entry = view.get(key)
            if entry is not None and t in entry[1]:
                entry[1].discard(t)
                out.append((t, key))
        return out

    def update(self, frame: pd.DataFrame, groups=None):
        """The batch's rows per key: ``[(key, group, rows)]`` in order of first appearance;
        opens the view of its keys (:meth:`write` keeps it)."""
        keys = frame[self.key_name].to_numpy()
        if groups is None:
            groups = assign_to_key_group(keys, self.groups, name=self.key_name)
        codes, uniq = pd.factorize(keys, sort=False)
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(codes, minlength=len(uniq)))))
        firsts = np.asarray(groups, np.int64)[order[bounds[:-1]]].tolist()
        uniq = uniq.tolist()
        self.open(uniq, firsts)
        # one take, then a slice per key: a view each, a fraction of a take's cost
        ordered = frame.take(order).reset_index(drop=True)
        return [(k, g, ordered.iloc[a:b])
                for k, g, a, b in zip(uniq, firsts, bounds[:-1].tolist(), bounds[1:].tolist())]

    # -- migration and checkpoints ------------------------------------------------------------
    @staticmethod
    def _blob(taken: tuple[dict, list]) -> dict:
        entries, groups = taken
        return {"states": {k: [e[0], sorted(e[1])] for k, e in entries.items()},
                "key_groups": np.array(groups, np.int64)}

    def cut(self, groups) -> dict:
        groups = [int(g) for g in groups]
        self.mark_dirty(groups)
        return self._blob(self.values.cut(groups))

    def snapshot(self, groups) -> dict:
        blob = self._blob(self.values.snapshot([int(g) for g in groups]))
        if self.shared:
            blob["states"] = copy.deepcopy(blob["states"])      # the user's state may change in place
        return blob

    def cut_keys(self, keys, groups=None) -> dict:
        keys = np.asarray(keys).tolist()
        # distinct (the primitive takes distinct keys): a lazy pull joins requests that may share keys
        if groups is None:
            keys = list(dict.fromkeys(keys))
        else:
            at = dict(zip(keys, np.asarray(groups).tolist()))
            keys, groups = list(at), list(at.values())
        taken = self.values.cut_keys(keys, groups)
        self.mark_dirty(taken[1])
        return self._blob(taken)

    def install(self, blob: dict) -> None:
        groups = blob["key_groups"].tolist()
        self.mark_dirty(groups)
        entries = {k: [state, set(timers)] for k, (state, timers) in blob["states"].items()}
        self.values.install(entries, groups)
        seq = self.seq
        self.heap.extend((t, next(seq), k, g) for (k, (_, timers)), g in zip(blob["states"].items(), groups)
                         for t in timers)
        heapq.heapify(self.heap)

    # -- reads --------------------------------------------------------------------------------
    def contains(self, keys, groups=None) -> np.ndarray:
        return self.values.contains(np.asarray(keys).tolist(), None if groups is None else np.asarray(groups).tolist())

    def keys_per_group(self, groups) -> np.ndarray:
        return self.values.keys_per_group(groups)

    def __len__(self) -> int:
        return len(self.values)

    def key_kind(self) -> str | None:
        return self.values.key_kind()

    def _frame(self, keys: list, entries: list) -> pd.DataFrame:
        return pd.DataFrame({"state": [e[0] for e in entries], "timers": [len(e[1]) for e in entries]},
                            index=pd.Index(keys, name=self.key_name))

    def frame(self, touched=None) -> pd.DataFrame:
        """Each key's state and pending timers."""
        return self._frame(*self.values.items())

    def frame_of_groups(self, groups) -> pd.DataFrame:
        """:meth:`frame` of the keys of key groups ``groups`` alone."""
        entries = self.values.snapshot([int(g) for g in groups])[0]
        return self._frame(list(entries), list(entries.values()))
