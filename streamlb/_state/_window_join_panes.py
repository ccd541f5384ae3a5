"""Vectorised window state for window joins (``key_by(...).window(size=...).join(other)``).

Each open pane keeps the batches' rows as they came, per side: one part per batch and pane
(its rows, with the key and side columns, and their key groups), not a payload per key. A
window, when it fires, gathers its panes' parts, keeps the rows of the key groups it fires
for, and joins its left rows with its right rows in one ``pandas.merge`` on the key; so no
Python runs per key or per pane, as for the pane store of window aggregates
(:mod:`._window_panes`), whose firing by window end (:class:`~._window_panes.PaneClock`)
this store shares.

Everything about time (``fired_to`` per key group, holds, lateness, late rows) is
:class:`~._windows.WindowState`'s. Blobs, for migration and checkpoints, read as
``WindowState``'s with :class:`~._window_join.JoinRows` payloads: per key,
``{pane: [Slice, ...]}``, plus a :class:`~._windows.Floor` per key group; a blob cut here
holds them as :class:`PaneParts` (the rows, a frame per pane and side) and travels so.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from .._time import from_ns
from ._index import first_rows
from ._joins import KEY, SIDE
from ._stateful_map import _key_array
from ._window_join import JoinRows, Slice
from ._window_panes import PaneClock
from ._windows import Floor

#: a pane's side holding more parts than this has them joined into one
COMPACT = 8


class PaneParts(Mapping):
    """A blob's ``states`` as the rows it holds, one frame per pane, side and part
    (``(pane, side, rows, their key groups)``), read as the mapping ``{Floor(g): fired_to,
    key: {pane: [Slice]}}`` the checkpoint format pickles per key (built on first read). It
    travels (a move, a lazy pull) as those frames: a frame per key and pane cost
    milliseconds each to pickle and unpickle, most of a move's time."""

    __slots__ = ("floors", "parts", "_states")

    def __init__(self, floors: dict, parts: list) -> None:
        self.floors, self.parts, self._states = floors, parts, None

    def __getstate__(self):
        return self.floors, self.parts

    def __setstate__(self, state) -> None:
        self.__init__(*state)

    def key_groups(self) -> np.ndarray:
        """The key group of each entry, in the mapping's order: the floors', then each
        key's (in the order the rows first show it)."""
        floors = np.array(list(self.floors), np.int64)
        if not self.parts:
            return floors
        keys = np.concatenate([rows[KEY].to_numpy() for _, _, rows, _ in self.parts])
        codes, uniq = pd.factorize(keys, sort=False)
        gs = np.concatenate([g for _, _, _, g in self.parts])
        return np.concatenate([floors, gs[first_rows(codes, len(uniq))]])

    def _mapping(self) -> dict:
        if self._states is None:
            states, order = {Floor(g): v for g, v in self.floors.items()}, list(self.floors)
            for p, side, rows, gs in self.parts:
                PaneJoinState._slices(states, order, p, side, rows, gs)
            self._states = states
        return self._states

    def __getitem__(self, key):
        return self._mapping()[key]

    def __iter__(self):
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._mapping())


class PaneJoinState(PaneClock):
    """Open panes of a window join: per pane, each side's rows as parts of batches."""

    def __init__(self, operator: str, window: dict, key_groups: int, join: dict) -> None:
        super().__init__(operator, window, KEY, key_groups, payload=JoinRows(operator, join))
        self.panes: dict[int, tuple[list, list]] = {}     # pane -> ([left parts], [right parts])
        self.fired: dict[int, np.ndarray] = {}          # window end -> key groups it fired for
        self._ends: list = []                           # heap of those ends

    # -- data ---------------------------------------------------------------------------------
    def _apply(self, frame, keys, groups, times) -> None:
        """Cut the batch by side and pane; keep each part."""
        self.mark_dirty(np.unique(groups))
        sides = frame[SIDE].to_numpy()
        for side in (0, 1):
            if sides[0] == side and (sides == side).all():
                return self._by_pane(side, frame, groups, times)
            sel = np.flatnonzero(sides == side)
            if len(sel):
                self._by_pane(side, frame.take(sel), groups[sel], times[sel])

    def _by_pane(self, side: int, frame, groups, times) -> None:
        panes = self.assigner.bucket(times)
        if (panes == panes[0]).all():
            return self._part(int(panes[0]), side, frame, groups)
        order = np.argsort(panes, kind="stable")
        p_sorted = panes[order]
        cuts = np.flatnonzero(np.diff(p_sorted)) + 1
        for a, b in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(order)])).tolist()):
            idx = order[a:b]
            self._part(int(p_sorted[a]), side, frame.take(idx), groups[idx])

    def _part(self, p: int, side: int, rows: pd.DataFrame, groups: np.ndarray) -> None:
        pane = self.panes.get(p)
        if pane is None:
            pane = self.panes[p] = ([], [])
            self._open_pane(p)
        parts = pane[side]
        parts.append((rows, groups))
        if len(parts) > COMPACT:        # small batches: one part, so what scans parts stays cheap
            parts[:] = [(pd.concat([r for r, _ in parts], ignore_index=True), np.concatenate([g for _, g in parts]))]

    # -- firing -------------------------------------------------------------------------------
    def _side(self, start: int, end: int, side: int, groups, keys=None) -> pd.DataFrame | None:
        """One side's rows in ``[start, end)``: of the key groups of mask ``groups`` (None:
        all), or of ``keys``."""
        parts = [part for p, pane in self.panes.items() if start <= p < end for part in pane[side]]
        if not parts:
            return None
        rows = parts[0][0] if len(parts) == 1 else pd.concat([r for r, _ in parts], ignore_index=True)
        sel = None
        if groups is not None:
            sel = groups[np.concatenate([g for _, g in parts])]
        if keys is not None:
            sel = rows[KEY].isin(keys).to_numpy() if sel is None else sel & rows[KEY].isin(keys).to_numpy()
        if sel is not None:
            rows = rows[sel]
        return rows if len(rows) else None

    def _window(self, start: int, end: int, groups, keys=None) -> pd.DataFrame | None:
        """The pairs of window ``[start, end)``, as ``pandas.merge`` gives them, with the
        window's bounds."""
        left = self._side(start, end, 0, groups, keys)
        right = self._side(start, end, 1, groups, keys) if left is not None else None
        if right is None:
            return None
        lk, rk = self.payload.key_names
        out = pd.merge(left.drop(columns=[SIDE, KEY]), right.drop(columns=[SIDE, KEY]), left_on=lk, right_on=rk,
                       suffixes=self.payload.suffixes, sort=False)
        if self.payload.where is not None and len(out):
            out = out[self.payload.where(out)].reset_index(drop=True)
        if not len(out):
            return None
        tt = self.time_type
        return out.assign(window_start=from_ns(np.full(len(out), start, np.int64), tt),
                          window_end=from_ns(np.full(len(out), end, np.int64), tt))

    # -- migration and checkpoints: blobs per key, as WindowState's ------------------------------
    def _per_key(self, select, groups: list[int], take: bool) -> dict:
        """The rows that ``select(rows, groups) -> mask`` picks, as :class:`PaneParts`
        (``take``: and no longer held here)."""
        parts = []
        for p, pane in list(self.panes.items()):
            for side in (0, 1):
                kept = []
                for rows, gs in pane[side]:
                    sel = select(rows, gs)
                    if sel.any():
                        parts.append((p, side, rows[sel], gs[sel]))
                    if not take:
                        kept.append((rows, gs))
                    elif not sel.all():
                        kept.append((rows[~sel], gs[~sel]))
                pane[side][:] = kept
            if not pane[0] and not pane[1]:
                del self.panes[p]
        states = PaneParts({g: int(self.fired_to[g]) for g in groups}, parts)
        return {"states": states, "key_groups": states.key_groups()}

    @staticmethod
    def _slices(states: dict, order: list, p: int, side: int, rows: pd.DataFrame, groups: np.ndarray) -> None:
        codes, uniq = pd.factorize(rows[KEY].to_numpy(), sort=False)
        by_key = np.argsort(codes, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(codes, minlength=len(uniq)))))
        for key, a, b in zip(uniq.tolist(), bounds[:-1].tolist(), bounds[1:].tolist()):
            idx = by_key[a:b]
            panes = states.get(key)
            if panes is None:
                panes = states[key] = {}
                order.append(int(groups[idx[0]]))
            panes.setdefault(p, []).append(Slice(rows, idx, side))

    def cut(self, groups) -> dict:
        groups = sorted({int(g) for g in groups})
        self.mark_dirty(groups)
        return self._per_key(lambda rows, gs: np.isin(gs, groups), groups, take=True)

    def snapshot(self, groups) -> dict:
        groups = sorted({int(g) for g in groups})
        return self._per_key(lambda rows, gs: np.isin(gs, groups), groups, take=False)

    def cut_keys(self, keys, groups=None) -> dict:
        keys, groups = self._keys_asked(keys, groups)
        asked = np.unique(groups)

        def select(rows, gs):
            sel = np.isin(gs, asked)
            return sel & rows[KEY].isin(keys).to_numpy() if sel.any() else sel

        return self._per_key(select, asked.tolist(), take=True)

    def install(self, blob: dict) -> None:
        states = blob["states"]
        if isinstance(states, PaneParts):       # as cut here: the parts as they are
            self.mark_dirty(blob["key_groups"].tolist())
            floors = states.floors
            for g, v in floors.items():
                self.fired_to[g] = max(self.fired_to[g], v)
            pieces = [((p, side), rows, gs) for p, side, rows, gs in states.parts]
        else:                                   # per key, as a checkpoint reads it back
            states, groups, floors = self._floors(blob)
            pieces = [((p, s.side), s.frame.take(s.idx), np.full(len(s.idx), g, np.int64))
                      for (k, panes), g in zip(states.items(), groups) if not isinstance(k, Floor)
                      for p, slices in panes.items() for s in slices]
        parts: dict[tuple[int, int], tuple[list, list]] = {}
        for at, frame, gs in pieces:
            frames, groups_of = parts.setdefault(at, ([], []))
            frames.append(frame)
            groups_of.append(gs)
        for (p, side), (frames, gs) in parts.items():
            gs = np.concatenate(gs)
            self._part(p, side, pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0], gs)
            self._due_from(p, gs, floors)
        self.wants_fire = True

    # -- what the store holds -------------------------------------------------------------------
    def _keys_and_groups(self) -> tuple[np.ndarray, np.ndarray]:
        parts = [part for pane in self.panes.values() for side in pane for part in side]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return (np.concatenate([r[KEY].to_numpy() for r, _ in parts]), np.concatenate([g for _, g in parts]))

    def contains(self, keys, groups=None) -> np.ndarray:
        held, _ = self._keys_and_groups()
        return pd.Series(np.asarray(keys)).isin(held).to_numpy()

    def keys_per_group(self, groups) -> np.ndarray:
        keys, gs = self._keys_and_groups()
        groups = np.asarray(list(groups), np.int64)
        if not len(keys):
            return np.zeros(len(groups), np.int64)
        codes = pd.factorize(keys)[0]
        width = int(codes.max()) + 1
        pairs = np.unique(gs * width + codes)
        return np.bincount(pairs // width, minlength=self.groups)[groups]

    def __len__(self) -> int:
        return len(pd.unique(self._keys_and_groups()[0]))

    def key_kind(self) -> str | None:
        keys, _ = self._keys_and_groups()
        return _key_array(keys[:1].tolist()).dtype.kind if len(keys) else None

    def frame(self, touched=None) -> pd.DataFrame:
        """The windows still open: per key and window, the rows (both sides) it holds."""
        parts = []
        for end, done in sorted(self.fired.items()):
            start = self.assigner.start_of(end)
            sides = [self._side(start, end, s, None if not done.any() else ~done) for s in (0, 1)]
            keys = [r[KEY] for r in sides if r is not None]
            if keys:
                n = pd.concat(keys).value_counts(sort=False)
                parts.append(pd.DataFrame({KEY: n.index.to_numpy(), "window_start": np.full(len(n), start),
                                           "window_end": np.full(len(n), end), "rows": n.to_numpy()}))
        out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
            {KEY: np.zeros(0, np.int64), "window_start": np.zeros(0, np.int64), "window_end": np.zeros(0, np.int64),
             "rows": np.zeros(0, np.int64)})
        tt = self.time_type
        return out.assign(window_start=from_ns(out.window_start.to_numpy(np.int64), tt),
                          window_end=from_ns(out.window_end.to_numpy(np.int64), tt))
