"""State of a batch-at-a-time ``process`` operator (``process(..., batch=True)``): per key, a
row of a state table, and event-time timers, all held in numpy arrays.

Keys get dense slots (:class:`~streamlb._state._index._KeyIndex`); each state column is one
array over the slots, and a slot is live while its key has state (a forgotten key's slot is
dead until the table is compacted). Timers are three parallel arrays (time in ns, key, key
group), scanned once per watermark. Nothing here runs Python per key on the data path; only
migration and checkpoint blobs are built per key, in the format the per-key ``process``
store uses (``{"states": {key: [state, sorted timers]}, "key_groups": ...}``, a key's state
a dict of its columns, or None for a key with only timers), so checkpoint files and
restores treat both alike.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .._time import MIN_TIME, UNITS
from ..keygroups import assign_to_key_group
from ._base import StateStore
from ._index import _KeyIndex, _grow, first_rows
from ._keydict import KeyDict
from ._stateful_map import _key_array

_FILL = {"f": np.nan, "c": np.nan, "M": np.datetime64("NaT"), "m": np.timedelta64("NaT"), "b": False, "O": None}


def _column(values) -> np.ndarray:
    """A state column as numpy holds it: text and anything mixed as objects."""
    arr = values.to_numpy() if isinstance(values, (pd.Series, pd.Index)) else np.asarray(values)
    return arr.astype(object) if arr.dtype.kind in "USV" else arr


def _widened(col: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``col``, widened when ``v`` does not fit it (int -> float, numbers -> objects...)."""
    if np.can_cast(v.dtype, col.dtype, "same_kind"):
        return col
    try:
        return col.astype(np.result_type(col.dtype, v.dtype))
    except TypeError:
        return col.astype(object)


class TableState(KeyDict, StateStore):
    """A state table and timers per key, for a vectorised ``process``."""

    def __init__(self, operator: str, funcs, key_name: str, key_groups: int, clock: dict) -> None:
        self.operator, self.key_name, self.groups = operator, key_name, key_groups
        self.func, self.on_timer = (getattr(f, "func", f) if f is not None else None for f in funcs)
        self.unit = clock.get("unit")
        self.index = _KeyIndex()
        self.live = np.zeros(0, bool)
        self.n_live = 0
        self.cols: dict[str, np.ndarray] = {}
        # pending timers: time (ns), key, key group; appended in chunks, joined when read
        self._timers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.watermark = MIN_TIME
        self._no_holds(key_groups)

    # -- time --------------------------------------------------------------------------------
    def to_ns(self, times, n: int) -> np.ndarray:
        """``times`` (one, or one per key) as int64 ns."""
        if self.unit is None:
            if np.ndim(times) == 0:
                return np.full(n, pd.Timestamp(times).as_unit("ns").value, np.int64)
            return pd.DatetimeIndex(times).as_unit("ns").asi8.copy()
        return np.broadcast_to(np.asarray(times, np.int64) * UNITS[self.unit], (n,)).copy()

    def from_ns(self, ns: np.ndarray) -> np.ndarray:
        return ns.view("datetime64[ns]") if self.unit is None else ns // UNITS[self.unit]

    # -- the table ---------------------------------------------------------------------------
    def distinct(self, keys: np.ndarray, groups) -> tuple[np.ndarray, np.ndarray]:
        """The distinct ``keys``, in order of first appearance, and their key groups (from
        ``groups``, a row's; hashed when None)."""
        codes, uniq = pd.factorize(keys, sort=False)
        first = first_rows(codes, len(uniq))
        if groups is None:
            return keys[first], assign_to_key_group(keys[first], self.groups, name=self.key_name)
        return keys[first], np.asarray(groups, np.int64)[first]

    def _slots_held(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key that has state here, -1 for the others."""
        slots = self.index.lookup(keys)
        ok = slots >= 0
        ok[ok] = self.live[slots[ok]]
        return np.where(ok, slots, -1)

    def view(self, keys: np.ndarray) -> pd.DataFrame:
        """The state of those of ``keys`` that have some, indexed by key, in their order."""
        slots = self._slots_held(keys)
        have = slots >= 0
        slots = slots[have]
        return pd.DataFrame({c: a[slots] for c, a in self.cols.items()},
                            index=pd.Index(keys[have], name=self.key_name))

    def put(self, keys: np.ndarray, groups: np.ndarray, values: dict) -> None:
        """Set ``keys``' state columns (``values``: column -> array); other columns keep their
        values (a new key's: missing, 0 or False)."""
        slots = self.index.slots(keys, groups, self.groups, self.key_name)
        n = self.index.n
        if len(self.live) < n:
            self.live = _grow(self.live, n, False)
        for c in list(self.cols):
            if len(self.cols[c]) < n:
                self.cols[c] = _grow(self.cols[c], n, _FILL.get(self.cols[c].dtype.kind, 0))
        fresh = slots[~self.live[slots]]
        for c, col in self.cols.items():
            col[fresh] = _FILL.get(col.dtype.kind, 0)      # a key forgotten before starts afresh
        for c, v in values.items():
            v = _column(v)
            if c not in self.cols:
                self.cols[c] = np.full(len(self.live), _FILL.get(v.dtype.kind, 0), dtype=v.dtype)
            self.cols[c] = _widened(self.cols[c], v)
            self.cols[c][slots] = v
        self.n_live += len(fresh)
        self.live[slots] = True
        self.mark_dirty(groups)

    def forget(self, keys: np.ndarray) -> None:
        """Drop ``keys``' state (their timers stay)."""
        slots = self._slots_held(keys)
        slots = np.unique(slots[slots >= 0])
        if len(slots):
            self.live[slots] = False
            self.n_live -= len(slots)
            self.mark_dirty(self.index.key_groups[slots])
            self._compact()

    def _compact(self) -> None:
        """Rebuild the slots once most of them are dead, so memory follows the keys held."""
        dead = self.index.n - self.n_live
        if dead < 4096 or dead < self.n_live:
            return
        keep = np.flatnonzero(self.live[: self.index.n])
        self.index = _KeyIndex.of_unique(self.index.dtype, self.index.keys[keep], self.index.key_groups[keep])
        self.cols = {c: a[keep] for c, a in self.cols.items()}
        self.live = np.ones(len(keep), bool)

    # -- timers ------------------------------------------------------------------------------
    def _pending(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if len(self._timers) != 1:
            if not self._timers:
                return np.zeros(0, np.int64), np.zeros(0, object), np.zeros(0, np.int64)
            self._timers = [tuple(np.concatenate(parts) for parts in zip(*self._timers))]
        return self._timers[0]

    def add_timers(self, times: np.ndarray, keys: np.ndarray, groups: np.ndarray) -> None:
        if len(times):
            self._timers.append((times, keys, groups))
            self.mark_dirty(groups)

    def _keep_timers(self, keep: np.ndarray) -> None:
        t, k, g = self._pending()
        self._timers = [(t[keep], k[keep], g[keep])] if keep.any() else []

    def cancel(self, times: np.ndarray, keys: np.ndarray, groups: np.ndarray) -> None:
        t, k, g = self._pending()
        if not len(t) or not len(times):
            return
        gone = pd.MultiIndex.from_arrays([k, t]).isin(pd.MultiIndex.from_arrays([keys, times]))
        if gone.any():
            self.mark_dirty(g[gone])
            self._keep_timers(~gone)

    def due(self, watermark: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The timers the watermark passed (time < watermark), each (key, time) once, in time
        order: times (ns), keys, key groups; removed. Timers of held groups wait."""
        self.watermark = max(self.watermark, watermark)
        t, k, g = self._pending()
        fire = t < self.watermark
        if self.held.any():
            fire &= ~self.held[g]
        if not fire.any():
            return t[:0], k[:0], g[:0]
        self.mark_dirty(g[fire])
        ft, fk, fg = t[fire], k[fire], g[fire]
        self._keep_timers(~fire)
        order = np.argsort(ft, kind="stable")
        ft, fk, fg = ft[order], fk[order], fg[order]
        once = ~pd.MultiIndex.from_arrays([fk, ft]).duplicated()
        return ft[once], fk[once], fg[once]

    # -- migration and checkpoints -----------------------------------------------------------
    def _blob(self, slots: np.ndarray, timers: np.ndarray) -> dict:
        """Per key: its state (a dict of its columns, or None) and its timers (sorted)."""
        names = list(self.cols)
        keys = self.index.keys[slots].tolist() if len(slots) else []
        groups = self.index.key_groups[slots].tolist()
        values = zip(*(list(self.cols[c][slots]) for c in names)) if names else ([] for _ in keys)
        states = {k: [dict(zip(names, v)), []] for k, v in zip(keys, values)}
        by_key = dict(zip(keys, groups))
        t, k, g = self._pending()
        for tk, tt, tg in zip(k[timers].tolist(), t[timers].tolist(), g[timers].tolist()):
            if tk not in states:
                states[tk], by_key[tk] = [None, []], tg
            states[tk][1].append(tt)
        for entry in states.values():
            entry[1].sort()
        return {"states": states, "key_groups": np.array([by_key[k] for k in states], np.int64)}

    def _live_slots(self, mask: np.ndarray) -> np.ndarray:
        n = self.index.n
        return np.flatnonzero(self.live[:n] & mask[:n])

    def _of_groups(self, groups) -> tuple[np.ndarray, np.ndarray]:
        wanted = np.zeros(self.groups, bool)
        wanted[np.asarray(list(groups), np.int64)] = True
        slots = self._live_slots(wanted[self.index.key_groups[: self.index.n]])
        return slots, wanted[self._pending()[2]]

    def _take(self, slots: np.ndarray, timers: np.ndarray) -> dict:
        blob = self._blob(slots, timers)
        if len(slots):
            self.live[slots] = False
            self.n_live -= len(slots)
        if timers.any():
            self._keep_timers(~timers)
        self.mark_dirty(blob["key_groups"])
        self._compact()
        return blob

    def cut(self, groups) -> dict:
        groups = [int(g) for g in groups]
        self.mark_dirty(groups)
        return self._take(*self._of_groups(groups))

    def snapshot(self, groups) -> dict:
        blob = self._blob(*self._of_groups(groups))
        if any(a.dtype == object for a in self.cols.values()):
            import copy

            blob["states"] = copy.deepcopy(blob["states"])     # a cell may be a list changed in place
        return blob

    def cut_keys(self, keys, groups=None) -> dict:
        keys = np.asarray(keys)
        slots = self._slots_held(keys)
        timers = pd.Index(self._pending()[1]).isin(keys) if len(keys) else np.zeros(len(self._pending()[0]), bool)
        return self._take(np.unique(slots[slots >= 0]), np.asarray(timers, bool))

    def install(self, blob: dict) -> None:
        states = blob["states"]
        if not states:
            return
        keys = _key_array(list(states))
        groups = np.asarray(blob["key_groups"], np.int64)
        with_state = np.array([s[0] is not None for s in states.values()], bool)
        rows = [s[0] for s in states.values() if s[0] is not None]
        if rows:
            names = list(dict.fromkeys(c for r in rows for c in r))
            self.put(keys[with_state], groups[with_state],
                     {c: _column(np.array([r.get(c) for r in rows])) for c in names})
        times = [(t, k, g) for (k, s), g in zip(states.items(), groups.tolist()) for t in s[1]]
        if times:
            t, k, g = zip(*times)
            karr = np.empty(len(k), keys.dtype)
            karr[:] = k
            self.add_timers(np.array(t, np.int64), karr, np.array(g, np.int64))
        self.mark_dirty(groups)

    # -- what the job reads ------------------------------------------------------------------
    def update(self, frame: pd.DataFrame, groups=None):
        raise NotImplementedError("a batch process store is updated by its operator (put, forget, add_timers)")

    def frame(self, touched=None) -> pd.DataFrame:
        """Each key's state columns and its number of pending timers."""
        slots = self._live_slots(np.ones(self.index.n, bool))
        keys = self.index.keys[slots] if len(slots) else np.zeros(0, object)
        out = pd.DataFrame({c: a[slots] for c, a in self.cols.items()}, index=pd.Index(keys, name=self.key_name))
        pending = pd.Index(self._pending()[1]).value_counts()
        out["timers"] = pending.reindex(out.index, fill_value=0).to_numpy(np.int64)
        return out

    def contains(self, keys, groups=None) -> np.ndarray:
        keys = np.asarray(keys)
        return (self._slots_held(keys) >= 0) | np.asarray(pd.Index(keys).isin(self._pending()[1]), bool)

    def keys_per_group(self, groups) -> np.ndarray:
        n = self.index.n
        counts = np.bincount(self.index.key_groups[:n][self.live[:n]], minlength=self.groups)
        return counts[np.asarray(list(groups), np.int64)].astype(np.int64)

    def __len__(self) -> int:
        return self.n_live

    def key_kind(self) -> str | None:
        return None if self.index.dtype is None else np.dtype(self.index.dtype).kind
