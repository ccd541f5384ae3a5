"""Vectorised window state for tumbling and hopping window aggregates.

The panes of ``gcd(size, slide)`` that are open hold each a keyed aggregate
(:class:`~streamlb._state.AggregateState`, vectorised numpy in shards of key groups): a
batch is cut by pane (a few panes per batch) and each part applied whole, and a window
fires for every key at once, from its pane's state (tumbling) or the merge of its panes'
(hopping). Per-record work stays in numpy, as for the keyed aggregate.

Everything about time (``fired_to`` per key group, holds, lateness, the late rows) is
:class:`~._windows.WindowState`'s, which this store extends; only where state lives differs.
A window is tracked by its end, with the key groups it has fired for (they differ while a
migration holds some). Blobs, for migration and checkpoints, are the same as
``WindowState``'s: one entry per key, ``{pane: [count, sum, min, max] per input column]}``,
plus a :class:`~._windows.Floor` per key group.
"""
from __future__ import annotations

import heapq

import numpy as np
import pandas as pd

from .._time import from_ns
from ._aggregate import AggregateState
from ._partials import RECORDS, blob_part, partials_of
from ._stateful_map import _key_array
from ._windows import Floor, WindowState


class PaneClock(WindowState):
    """The base of the stores that keep whole panes (not a payload per key): firing by
    window end, a window tracked by its end with the key groups it has fired for (they
    differ while a migration holds some). The store gives ``panes`` (pane start -> its state) and
    ``_window(start, end, groups, keys=None)``: the output rows of a window, for the key
    groups of the mask ``groups`` (None: all) or only ``keys``."""

    def _open_pane(self, p: int) -> None:
        """Pane ``p`` opens: the windows it is in are tracked."""
        for _, end in self.assigner.windows_of_pane(p):
            self._track(end, self.fired_to >= end)

    def _due_from(self, p: int, groups: np.ndarray, floors: dict) -> None:
        """State of ``groups`` installed in pane ``p``: its windows that had not fired where
        it comes from (by the ``floors`` it came with) are due here."""
        gs = np.unique(groups)
        for _, end in self.assigner.windows_of_pane(p):
            was = np.array([end <= floors.get(g, self.fired_to[g]) for g in gs.tolist()], bool)
            if end not in self.fired:
                self._track(end, self.fired_to >= end)
            self.fired[end][gs] = was

    def _track(self, end: int, fired: np.ndarray) -> None:
        """Window ``end`` exists; ``fired``: the key groups it counts as fired for."""
        if end in self.fired:
            return
        self.fired[end] = fired.copy()
        heapq.heappush(self._ends, end)

    # -- firing -------------------------------------------------------------------------------
    def advance(self, watermark: int) -> list:
        self._raise_floor(watermark)
        out, later = [], []
        while self._ends and self._ends[0] <= self.watermark:
            end = heapq.heappop(self._ends)
            done = self.fired[end]
            ready = ~done & (self.fired_to >= end) & ~self.held     # moving groups wait (see _pop)
            if ready.any():
                frame = self._fire(self.assigner.start_of(end), end, None if ready.all() else ready)
                if frame is not None:
                    out.append(frame)
                done |= ready
            if done.all():
                del self.fired[end]
            else:
                later.append(end)
        for end in later:
            heapq.heappush(self._ends, end)
        out.extend(self._refired())
        self._expire_panes()
        return out

    def _refired(self) -> list:
        """Windows that took late records within their lateness, for the keys that did."""
        if not self.refire:
            return []
        by_window: dict = {}
        for key, start, end in self.refire:
            by_window.setdefault((start, end), []).append(key)
        self.refire.clear()
        out = []
        for (start, end), keys in sorted(by_window.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            frame = self._window(start, end, None, keys=keys)
            if frame is not None:
                out.append(frame)
        return out

    def _fire(self, start: int, end: int, groups: np.ndarray | None):
        """What window ``[start, end)`` emits as it fires (see :meth:`_window`); a store may
        give it in pieces (:meth:`~._windows.WindowState.pieces`)."""
        return self._window(start, end, groups)

    def _expire_panes(self) -> None:
        if self.held.any():
            return      # a moving group's windows wait to fire (see advance): so do their panes
        low = int(self.fired_to.min())
        for p in [p for p in self.panes if self.assigner.last_end(p) + self.lateness <= low]:
            del self.panes[p]

    def rows(self, fired: list) -> pd.DataFrame | None:
        if not fired:
            return None
        return fired[0] if len(fired) == 1 else pd.concat(fired, ignore_index=True)


_REDUCE = {"count": np.add, "sum": np.add, "min": np.fmin, "max": np.fmax}


def merge_partials(parts: list[tuple], raw: dict[str, tuple[str, str]]) -> tuple[np.ndarray, dict]:
    """Raw partials of several panes (each ``(keys, {column: values})``; ``raw``: column ->
    (input, how)) merged per key, keys in order of first appearance: counts and sums add,
    minima and maxima take the extreme, NaN skipped (as ``groupby(level=0, sort=False)``
    with ``sum``, ``min``, ``max`` gives them). In numpy, by sorting the keys' codes once,
    and on arrays rather than frames: a window of a hopping aggregate merges its panes at
    every slide, and pandas' per-column groupby, then building the frames, was most of a
    firing's time (NEXMark q5)."""
    numeric = all(isinstance(v[c].dtype, np.dtype) and v[c].dtype.kind in "iuf" for _, v in parts for c in raw)
    codes, uniques = pd.factorize(np.concatenate([k for k, _ in parts])) if numeric else (None, None)
    if not numeric or (len(codes) and codes.min() < 0):     # other types, or null keys: pandas
        hows = {name: ("sum" if how in ("count", "sum") else how) for name, (_, how) in raw.items()}
        frames = [pd.DataFrame(v, index=pd.Index(k)) for k, v in parts]
        merged = pd.concat(frames).groupby(level=0, sort=False).agg(hows)
        return merged.index.to_numpy(), {c: merged[c].to_numpy() for c in raw}
    order = np.argsort(codes, kind="stable")
    ranked = codes[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]]) if len(ranked) else np.zeros(0, np.intp)
    out = {}
    for name, (_, how) in raw.items():
        vals = np.concatenate([v[name] for _, v in parts])[order]
        if how in ("count", "sum") and vals.dtype.kind == "f":
            vals = np.nan_to_num(vals, nan=0.0)
        out[name] = _REDUCE[how].reduceat(vals, starts) if len(vals) else vals
    return np.asarray(uniques), out


class PaneWindowState(PaneClock):
    """Open panes of a tumbling or hopping window ``aggregate``, each a keyed aggregate."""

    def __init__(self, operator: str, window: dict, key_name: str, key_groups: int, spec=None, func=None) -> None:
        super().__init__(operator, window, key_name, key_groups, spec=spec)
        self.spec = spec
        # panes keep raw partials that combine across panes: a count per input column,
        # and its sum, min, max as the spec needs them (a mean is a sum over a count)
        self.raw: dict[str, tuple[str, str]] = {}
        for c in sorted({c for c, _ in spec.values()}):
            hows = {h for cc, h in spec.values() if cc == c}
            self.raw[f"count:{c}"] = (c, "count")
            for h in ("sum", "min", "max"):
                if h in hows or (h == "sum" and "mean" in hows):
                    self.raw[f"{h}:{c}"] = (c, h)
        self.panes: dict[int, AggregateState] = {}
        self.fired: dict[int, np.ndarray] = {}      # window end -> key groups it fired for
        self._checker: AggregateState | None = None  # checks batches (clean), holds nothing
        self._ends: list = []                       # heap of those ends

    def _pane(self, p: int) -> AggregateState:
        st = self.panes.get(p)
        if st is None:
            st = self.panes[p] = self._new_state()
            self._open_pane(p)
        return st

    # -- data ---------------------------------------------------------------------------------
    def _apply(self, frame, keys, groups, times) -> None:
        """Cut the batch by pane (sorted once, each pane a slice) and apply each part; a
        batch a router combined per key and pane is merged as partial aggregates."""
        self.mark_dirty(groups)
        panes = self.assigner.bucket(times)
        if RECORDS in frame.columns:
            first = self._pane(int(panes[0]))
            tables, dtypes = partials_of(frame, first.inputs, first.dtypes)
            order = np.argsort(panes, kind="stable")
            p_sorted = panes[order]
            cuts = np.flatnonzero(np.diff(p_sorted)) + 1
            for a, b in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(order)])).tolist()):
                self._pane(int(p_sorted[a])).combine(blob_part(tables, dtypes, keys, groups, order[a:b]))
            return
        first = self._pane(int(panes[0]))
        cols = first.columns_of(frame)
        if (panes == panes[0]).all():
            first.update_columns(keys, groups, cols)
            return
        order = np.argsort(panes, kind="stable")
        p_sorted, keys, groups = panes[order], keys[order], groups[order]
        cols = {c: arr[order] for c, arr in cols.items()}
        cuts = np.flatnonzero(np.diff(p_sorted)) + 1
        for a, b in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(order)])).tolist()):
            self._pane(int(p_sorted[a])).update_columns(keys[a:b], groups[a:b], {c: v[a:b] for c, v in cols.items()})

    def _parts(self, start: int, end: int, groups: np.ndarray | None) -> list:
        """The states of the panes in ``[start, end)``, whole or (``groups``) in part."""
        parts = [st for p, st in self.panes.items() if start <= p < end and len(st)]
        if groups is None:
            return parts
        out = []
        for st in parts:
            blob = st.snapshot(np.flatnonzero(groups))
            tmp = self._scratch()
            tmp.install(blob)
            st.release(blob)
            if len(tmp):
                out.append(tmp)
        return out

    def _window(self, start: int, end: int, groups: np.ndarray | None, keys=None) -> pd.DataFrame | None:
        """Output rows of window ``[start, end)``: every key (or those of ``groups``, or
        ``keys``)."""
        parts = self._parts(start, end, groups)
        if not parts:
            return None
        if len(parts) == 1:
            at, raw = parts[0].arrays()
        else:
            at, raw = merge_partials([st.arrays() for st in parts], self.raw)
        values = self._outputs(raw)
        if keys is not None:
            mine = pd.Index(at).isin(keys)
            at, values = at[mine], {c: v[mine] for c, v in values.items()}
        return self._rows(start, end, at, values)

    def _rows(self, start: int, end: int, at: np.ndarray, values: dict) -> pd.DataFrame | None:
        """Window ``[start, end)``'s output rows: keys ``at``, outputs ``values``."""
        if not len(at):
            return None
        tt = self.time_type
        head = {self.key_name: at,
                "window_start": from_ns(np.full(len(at), start, np.int64), tt),
                "window_end": from_ns(np.full(len(at), end, np.int64), tt)}
        return pd.DataFrame({**head, **values})

    def clean(self, frame: pd.DataFrame):
        """As the keyed aggregate's: values of summed columns that are not numbers are bad
        (checked by one empty keyed aggregate kept for it, not one made per batch)."""
        if self._checker is None:
            self._checker = self._scratch()
        return self._checker.clean(frame)

    def _new_state(self) -> AggregateState:
        """A pane's keyed aggregate."""
        return AggregateState(self.operator, self.raw, self.key_name, self.groups)

    def _scratch(self) -> AggregateState:
        """A keyed aggregate in memory for a moment (a check, a helper's partials)."""
        return AggregateState(self.operator, self.raw, self.key_name, self.groups)

    def _outputs(self, raw: dict) -> dict:
        """The spec's outputs from raw partials (one array each, in the keys' order)."""
        out = {}
        for name, (c, how) in self.spec.items():
            cnt = raw[f"count:{c}"]
            if how == "count":
                out[name] = cnt.astype(np.int64)
            elif how == "mean":
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[name] = raw[f"sum:{c}"] / np.where(cnt == 0, np.nan, cnt)
            else:
                out[name] = raw[f"{how}:{c}"]
        return out

    # -- split keys ---------------------------------------------------------------------------
    def partial(self, frame: pd.DataFrame, groups: np.ndarray, times: np.ndarray):
        late, taken = self._helper_rows(frame, groups, times)
        if taken is None:
            return late, None
        sub, _, groups, times = taken
        panes = self.assigner.bucket(times)
        tmp = self._scratch()
        blob = {}
        for p in np.unique(panes).tolist():
            sel = np.flatnonzero(panes == p)
            blob[p] = tmp.partial(sub.take(sel), groups[sel])
        return late, {"panes": blob}

    def combine(self, blob: dict) -> None:
        for p, part in blob["panes"].items():
            self._pane(p).combine(part)
            for s, end in self.assigner.windows_of_pane(p):
                for piece in part["parts"]:
                    thr = self.fired_to[piece["key_groups"]]
                    again = (end <= thr) & (thr < end + self.lateness)
                    self.refire.update((k, s, end) for k in piece["keys"][again].tolist())

    # -- migration and checkpoints: blobs per key, as WindowState's ------------------------------
    def _per_key(self, groups, take: bool) -> dict:
        states, order = {Floor(g): int(self.fired_to[g]) for g in groups}, list(groups)
        blobs = {p: (st.cut(groups) if take else st.snapshot(groups)) for p, st in self.panes.items()}
        for k, (g, panes) in self._as_per_key(blobs).items():
            states[k] = panes
            order.append(g)
        for p, blob in blobs.items():
            if not take:
                self.panes[p].release(blob)
            elif not len(self.panes[p]):
                del self.panes[p]
        return {"states": states, "key_groups": np.array(order, np.int64)}

    def cut(self, groups) -> dict:
        groups = sorted({int(g) for g in groups})
        self.mark_dirty(groups)
        return self._per_key(groups, take=True)

    def snapshot(self, groups) -> dict:
        return self._per_key(sorted({int(g) for g in groups}), take=False)

    def cut_keys(self, keys, groups=None) -> dict:
        keys, groups = self._keys_asked(keys, groups)
        present = [int(g) for g in np.unique(groups)]
        states, order = {Floor(g): int(self.fired_to[g]) for g in present}, list(present)
        for p, st in list(self.panes.items()):
            part_blob = st.cut_keys(keys, groups)
            one = self._as_per_key({p: part_blob})
            for k, (g, panes) in one.items():
                if k not in states:
                    states[k] = {}
                    order.append(g)
                states[k].update(panes)
            if not len(st):
                del self.panes[p]
        return {"states": states, "key_groups": np.array(order, np.int64)}

    def _as_per_key(self, blobs: dict) -> dict:
        """``{pane: AggregateState blob}`` as ``{key: (group, {pane: payload})}``."""
        where = {c: 4 * i for i, c in enumerate(self.payload.inputs)}
        width = 4 * len(self.payload.inputs)
        out: dict = {}
        for p, blob in blobs.items():
            for part in blob["parts"]:
                cols = {where[c] + ("cnt", "sum", "min", "max").index(name): arr.tolist()
                        for (name, c), arr in part["tables"].items()}
                for i, (k, g) in enumerate(zip(part["keys"].tolist(), part["key_groups"].tolist())):
                    pay = [0, 0, np.inf, -np.inf] * (width // 4)
                    for j, vals in cols.items():
                        pay[j] = vals[i]
                    for j in range(0, width, 4):        # an empty input holds no extreme
                        if not pay[j]:
                            pay[j + 2], pay[j + 3] = np.inf, -np.inf
                    out.setdefault(k, (g, {}))[1][p] = pay
        return out

    def install(self, blob: dict) -> None:
        states, groups, floors = self._floors(blob)
        by_pane: dict[int, list] = {}
        for (k, panes), g in zip(states.items(), groups):
            if isinstance(k, Floor):
                continue
            for p, pay in panes.items():
                by_pane.setdefault(p, []).append((k, g, pay))
        for p, rows in by_pane.items():
            self._install_pane(p, rows, floors)
        self.wants_fire = True

    def _install_pane(self, p: int, rows: list, floors: dict) -> None:
        st = self._pane(p)
        keys = _key_array([k for k, _, _ in rows])
        kg = np.array([g for _, g, _ in rows], np.int64)
        tables, dtypes = {}, {}
        for i, c in enumerate(self.payload.inputs):
            hows = {h for cc, h in self.spec.values() if cc == c}
            dt = self.payload.dtypes.get(c) or st.dtypes.get(c) or _dtype_of([pay[4 * i + 1] for _, _, pay in rows])
            dtypes[c] = dt
            tables[("cnt", c)] = np.array([pay[4 * i] for _, _, pay in rows], np.int64)
            if hows & {"sum", "mean"}:
                tables[("sum", c)] = np.array([pay[4 * i + 1] for _, _, pay in rows], dt)
            for j, name in ((2, "min"), (3, "max")):
                if name in hows:
                    fill = (np.iinfo(np.int64).max if name == "min" else np.iinfo(np.int64).min) \
                        if dt.kind == "i" else (np.inf if name == "min" else -np.inf)
                    tables[(name, c)] = np.array([pay[4 * i + j] if np.isfinite(pay[4 * i + j]) else fill
                                                  for _, _, pay in rows], dt)
        st.install({"dtypes": dtypes, "parts": [{"keys": keys, "key_groups": kg, "tables": tables}]})
        self._due_from(p, kg, floors)

    def contains(self, keys, groups=None) -> np.ndarray:
        out = np.zeros(len(keys), bool)
        for st in self.panes.values():
            out |= st.contains(keys, groups)
        return out

    def keys_per_group(self, groups) -> np.ndarray:
        out = np.zeros(len(list(groups)), np.int64)
        for st in self.panes.values():
            out += st.keys_per_group(groups)
        return out

    def __len__(self) -> int:
        return sum(len(st) for st in self.panes.values())

    def key_kind(self) -> str | None:
        kinds = [st.key_kind() for st in self.panes.values() if len(st)]
        return kinds[0] if kinds else None

    def frame(self, touched=None) -> pd.DataFrame:
        parts = [self._window(self.assigner.start_of(end), end, None if not done.any() else ~done)
                 for end, done in sorted(self.fired.items())]
        parts = [p for p in parts if p is not None]
        if parts:
            return pd.concat(parts, ignore_index=True)
        cols = {self.key_name: np.zeros(0, np.int64), "window_start": from_ns(np.zeros(0, np.int64), self.time_type),
                "window_end": from_ns(np.zeros(0, np.int64), self.time_type)}
        return pd.DataFrame({**cols, **{c: np.zeros(0) for c in self.spec}})


def _dtype_of(values: list) -> np.dtype:
    return np.dtype(np.int64) if all(isinstance(v, (int, np.integer)) for v in values) else np.dtype(np.float64)
