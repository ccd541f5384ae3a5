"""State of a ``process`` operator: per key, the user's state and its event-time timers.

A key's entry is ``[state, timers]`` (``timers``: a set of int64 ns); a key with neither
is dropped. Due timers are found with a heap of ``(time, seq, key)`` whose stale entries
(a timer cancelled, or its key moved away) are skipped; timers of key groups held while
they move wait until the move is done here. Blobs are ``{"states": {key:
[state, sorted timers]}, "key_groups": ...}``, pickled per key in checkpoints.
"""
from __future__ import annotations

import heapq
import itertools

import numpy as np
import pandas as pd

from .._time import MIN_TIME, UNITS
from ..keygroups import assign_to_key_group
from ._base import StateStore
from ._keydict import KeyDict


class Context:
    """What ``func`` and ``on_timer`` of ``process`` see of their key: ``state`` (read and
    assign), ``watermark``, ``timer(time)`` and ``cancel(time)``."""

    __slots__ = ("_store", "_key", "_entry")

    def __init__(self, store: ProcessState, key) -> None:
        self._store, self._key = store, key
        self._entry = store.keys.get(key) or [None, set()]

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
            heapq.heappush(self._store.heap, (t, next(self._store.seq), self._key))

    def cancel(self, time) -> None:
        self._entry[1].discard(self._store.to_ns(time))


class ProcessState(KeyDict, StateStore):
    def __init__(self, operator: str, funcs, key_name: str, key_groups: int, clock: dict) -> None:
        self.operator, self.key_name, self.groups = operator, key_name, key_groups
        self.func, self.on_timer = (getattr(f, "func", f) if f is not None else None for f in funcs)
        self.unit = clock.get("unit")
        self.keys: dict = {}                # key -> [state, timers]
        self.group_of: dict = {}
        self.by_group: dict[int, set] = {}
        self.heap: list = []
        self.seq = itertools.count()
        self.watermark = MIN_TIME
        self._no_holds(key_groups)

    def to_ns(self, time) -> int:
        if self.unit is None:
            return int(pd.Timestamp(time).value)
        return int(time) * UNITS[self.unit]

    def from_ns(self, ns: int):
        return pd.Timestamp(ns) if self.unit is None else ns // UNITS[self.unit]

    def context(self, key) -> Context:
        return Context(self, key)

    def settle(self, key, g: int, ctx: Context) -> None:
        """Keep what ``ctx`` left of ``key`` (drop the key when it holds nothing)."""
        entry = ctx._entry
        if entry[0] is None and not entry[1]:
            self._drop(key)
        elif key not in self.keys:
            self.keys[key], self.group_of[key] = entry, g
            self.by_group.setdefault(g, set()).add(key)
        self.mark_dirty([g])

    def _drop(self, key) -> None:
        if key in self.keys:
            del self.keys[key]
            g = self.group_of.pop(key)
            ks = self.by_group[g]
            ks.discard(key)
            if not ks:
                del self.by_group[g]

    def due(self, watermark: int) -> list:
        """``(time, key)`` of each timer the watermark passed (time < watermark), in time order,
        each removed from its key."""
        self.watermark = max(self.watermark, watermark)
        held = self.held.any()       # even at +inf: until the move is done here (end lets go)
        out, later = [], []
        while self.heap and self.heap[0][0] < self.watermark:
            item = heapq.heappop(self.heap)
            t, _, key = item
            entry = self.keys.get(key)
            if entry is not None and t in entry[1]:
                if held and self.held[self.group_of[key]]:
                    later.append(item)          # its group is moving: after the move
                    continue
                entry[1].discard(t)
                out.append((t, key))
        for item in later:
            heapq.heappush(self.heap, item)
        return out

    def update(self, frame: pd.DataFrame, groups=None):
        """The batch's rows per key: ``[(key, group, rows)]`` in order of first appearance."""
        keys = frame[self.key_name].to_numpy()
        if groups is None:
            groups = assign_to_key_group(keys, self.groups, name=self.key_name)
        codes, uniq = pd.factorize(keys, sort=False)
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(codes, minlength=len(uniq)))))
        groups = np.asarray(groups, np.int64)
        # one take, then a slice per key: a view each, a fraction of a take's cost
        ordered = frame.take(order).reset_index(drop=True)
        return [(k, int(groups[order[a]]), ordered.iloc[a:b])
                for k, a, b in zip(uniq.tolist(), bounds[:-1].tolist(), bounds[1:].tolist())]

    # -- migration and checkpoints ------------------------------------------------------------
    def _blob(self, items, take: bool) -> dict:
        states, order = {}, []
        for k, g in items:
            entry = self.keys[k]
            states[k] = [entry[0], sorted(entry[1])]
            order.append(g)
            if take:
                self._drop(k)
        return {"states": states, "key_groups": np.array(order, np.int64)}

    def _held(self, groups) -> list:
        return [(k, g) for g in dict.fromkeys(int(g) for g in groups) for k in list(self.by_group.get(g, ()))]

    def cut(self, groups) -> dict:
        self.mark_dirty([int(g) for g in groups])
        return self._blob(self._held(groups), take=True)

    def snapshot(self, groups) -> dict:
        import copy

        blob = self._blob(self._held(groups), take=False)
        blob["states"] = copy.deepcopy(blob["states"])      # the user's state may change in place
        return blob

    def cut_keys(self, keys, groups=None) -> dict:
        keys = np.asarray(keys).tolist()
        items = [(k, self.group_of[k]) for k in dict.fromkeys(keys) if k in self.keys]
        self.mark_dirty([g for _, g in items])
        return self._blob(items, take=True)

    def install(self, blob: dict) -> None:
        groups = blob["key_groups"].tolist()
        self.mark_dirty(groups)
        for (k, (state, timers)), g in zip(blob["states"].items(), groups):
            entry = [state, set(timers)]
            self.keys[k], self.group_of[k] = entry, g
            self.by_group.setdefault(g, set()).add(k)
            for t in timers:
                heapq.heappush(self.heap, (t, next(self.seq), k))

    def frame(self, touched=None) -> pd.DataFrame:
        """Each key's state and pending timers."""
        keys = list(self.keys)
        out = pd.DataFrame({"state": [self.keys[k][0] for k in keys],
                            "timers": [len(self.keys[k][1]) for k in keys]}, index=pd.Index(keys, name=self.key_name))
        return out
