"""Window state: per key, open panes (tumbling, hopping) or sessions, in key groups.

Tumbling and hopping windows keep *panes* of ``gcd(size, slide)``: a record goes into one
pane, and a window, when it fires, combines the panes it spans, so a hopping window never
copies a record into each of its windows. Sessions are kept per key as
``[start, last, payload, fired]``, merged as records join them. A payload is the pane's or
session's partial aggregates, or its rows (:mod:`._window_payload`).

Each key group has ``fired_to``: the watermark up to which its windows have fired. A window
ending at or before it has fired; a record all of whose windows end ``lateness`` or more
before it is late. It is the operator's watermark, except for key groups *held* while a
migration moves them (:meth:`hold`): an old owner stops firing a group it gives away from
the moment it is told, and a new owner judges the rows of a group it takes in by the
watermark both had then, so no window fires twice and no record is called late by one
owner that the other would have taken (docs/windows.md, "How window state moves").
Blobs carry ``fired_to`` per key group (:class:`Floor` entries), so it moves, and is
checkpointed and restored, with the state.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._time import MAX_TIME, MIN_TIME, from_ns
from ..keygroups import assign_to_key_group
from ._base import StateStore
from ._index import first_rows
from ._keydict import KeyDict
from ._stateful_map import _key_array
from ._window_payload import Accumulators, Rows
from ._window_sessions import Sessions


@dataclass(frozen=True)
class Floor:
    """A blob entry (in place of a key) carrying key group ``group``'s ``fired_to``."""

    group: int


def _floordiv(t: np.ndarray, step: int) -> np.ndarray:
    return (t // step) * step


class WindowState(Sessions, KeyDict, StateStore):
    """Open windows of one window operator instance.

    ``window``: the stage's window (kind, size, slide, gap, lateness in nanoseconds, mode
    ``aggregate`` or ``apply``). ``spec`` for an aggregate, ``func`` for apply.
    """

    def __init__(self, operator: str, window: dict, key_name: str, key_groups: int, spec=None, func=None,
                 payload=None) -> None:
        self.operator, self.key_name, self.groups = operator, key_name, key_groups
        self.kind = window["kind"]
        self.size, self.slide, self.gap = window["size"], window["slide"], window["gap"]
        self.lateness = window["lateness"]
        self.pane = math.gcd(self.size, self.slide) if self.kind != "session" else 0
        self.payload = payload or (Accumulators(operator, spec) if window["mode"] == "aggregate"
                                   else Rows(operator, func))
        self.keys: dict = {}                 # key -> {pane start: payload} or [session, ...]
        self.group_of: dict = {}
        self.by_group: dict[int, set] = {}
        self.fired_to = np.full(key_groups, MIN_TIME, np.int64)
        self.watermark = MIN_TIME
        self._no_holds(key_groups)          # moving groups: KeyDict.hold (fired_to stops for them)
        self._due: list = []                 # (window end, n, key): windows to fire
        self._expire: list = []              # (time, n, key): panes or sessions to drop
        self._n = itertools.count()
        self.refire: set = set()             # (key, start, end) updated after they fired
        self.closed: set = set()             # keys with session tombstones
        self.time_type = np.dtype("datetime64[ns]")
        self.wants_fire = False

    # -- holding key groups while they move ----------------------------------------------------
    def unhold(self, epoch: int) -> bool:
        if not super().unhold(epoch):
            return False
        self.wants_fire = True
        return True

    # -- data ---------------------------------------------------------------------------------
    def update(self, frame: pd.DataFrame, groups: np.ndarray | None = None, times: np.ndarray | None = None):
        """Apply a batch (``times``: its event times in ns). Returns the late rows: a frame
        of the records' columns plus window_start, window_end, watermark (None if none)."""
        keys = frame[self.key_name].to_numpy()
        if groups is None:
            groups = assign_to_key_group(keys, self.groups, name=self.key_name) if len(keys) else np.zeros(0, np.int64)
        groups = np.asarray(groups, np.int64)
        thr = self.fired_to[groups]
        if self.kind == "session":
            late_rows, late = self._session_late(times, thr, keys)
            applied = ~late
        else:
            late_rows, applied = self._pane_late(times, thr, keys, refire=True)
        if applied.any():
            idx = np.flatnonzero(applied) if not applied.all() else None
            sub = frame if idx is None else frame.take(idx)
            self._apply(sub, keys if idx is None else keys[idx], groups if idx is None else groups[idx],
                        times if idx is None else times[idx])
        return self._late_frame(frame, late_rows)

    def _late_frame(self, frame: pd.DataFrame, late_rows: list):
        """The late rows: the records' columns plus window_start, window_end, watermark."""
        if not late_rows:
            return None
        rows, starts, ends, marks = zip(*late_rows)
        rows = np.concatenate(rows)
        out = frame.take(rows).reset_index(drop=True)
        tt = self.time_type
        return out.assign(window_start=from_ns(np.concatenate(starts), tt),
                          window_end=from_ns(np.concatenate(ends), tt), watermark=from_ns(np.concatenate(marks), tt))

    def _windows_of(self, times: np.ndarray):
        """``(start, end, valid)`` arrays of each window a row is in (tumbling, hopping)."""
        s0 = _floordiv(times, self.slide)
        for j in range(-(-self.size // self.slide)):
            start = s0 - j * self.slide
            yield start, start + self.size, start + self.size > times

    def _pane_late(self, times, thr, keys, refire: bool):
        late_rows, applied = [], np.zeros(len(times), bool)
        for start, end, valid in self._windows_of(times):
            missed = valid & (end + self.lateness <= thr)
            applied |= valid & ~missed
            if missed.any():
                r = np.flatnonzero(missed)
                late_rows.append((r, start[r], end[r], thr[r]))
            again = np.flatnonzero(valid & ~missed & (end <= thr)) if refire else ()
            if len(again):
                self.refire.update(zip(keys[again].tolist(), start[again].tolist(), end[again].tolist()))
        return late_rows, applied

    def _apply(self, frame, keys, groups, times) -> None:
        self.mark_dirty(groups)
        bucket = _floordiv(times, self.pane) if self.kind != "session" else times
        codes, uniq_keys = pd.factorize(keys, sort=False)
        uniq_keys = uniq_keys.tolist()          # Python keys: hashable alike, and stored as such
        if self.kind == "session":
            return self._apply_sessions(frame, codes, uniq_keys, groups, times)
        pair = pd.MultiIndex.from_arrays([codes, bucket])
        pcodes, pairs = pd.factorize(pair, sort=False)
        payloads = self.payload.build(frame, np.asarray(pcodes), len(pairs))
        first = first_rows(pcodes, len(pairs))
        gs = groups[first].tolist()
        for (kc, p), g, pay in zip(pairs.tolist(), gs, payloads):
            key = uniq_keys[kc]
            panes = self.keys.get(key)
            if panes is None:
                panes = self._new_key(key, g, {})
            old = panes.get(p)
            if old is None:
                panes[p] = pay
                self._schedule_pane(key, g, p)
            else:
                self.payload.merge(old, pay)

    # -- split keys: a helper's partial aggregates, merged at the key's home -------------------
    def partial(self, frame: pd.DataFrame, groups: np.ndarray, times: np.ndarray):
        """A helper's part of a split key's rows: ``(late rows, blob)``. The rows late by
        this instance's watermark are the late ones (the home waits for this instance's
        watermark before it fires, see docs/windows.md); the others are aggregated per key
        and pane, for :meth:`combine` at the home. Nothing is kept here."""
        late, taken = self._helper_rows(frame, groups, times)
        if taken is None:
            return late, None
        sub, keys, groups, times = taken
        codes, uniq = pd.factorize(keys, sort=False)
        pcodes, pairs = pd.factorize(pd.MultiIndex.from_arrays([codes, _floordiv(times, self.pane)]), sort=False)
        payloads = self.payload.build(sub, np.asarray(pcodes), len(pairs))
        first = first_rows(pcodes, len(pairs))
        uniq = uniq.tolist()
        return late, {"panes": [(uniq[kc], g, p, pay) for (kc, p), g, pay in
                                zip(pairs.tolist(), groups[first].tolist(), payloads)]}

    def _helper_rows(self, frame: pd.DataFrame, groups, times):
        """A helper's rows of split keys: ``(late rows, (rows, keys, groups, times) of the
        others)``, late by this instance's watermark; the second is None if none is left."""
        keys = frame[self.key_name].to_numpy()
        groups = np.asarray(groups, np.int64)
        late_rows, applied = self._pane_late(times, self.fired_to[groups], keys, refire=False)
        late = self._late_frame(frame, late_rows)
        idx = np.flatnonzero(applied)
        if not len(idx):
            return late, None
        return late, (frame.take(idx), keys[idx], groups[idx], times[idx])

    def combine(self, blob: dict) -> None:
        """Merge a helper's partial aggregates; windows that fired already (within their
        lateness) fire again."""
        for key, g, p, pay in blob["panes"]:
            self.mark_dirty([g])
            panes = self.keys.get(key)
            if panes is None:
                panes = self._new_key(key, g, {})
            if p in panes:
                self.payload.merge(panes[p], pay)
            else:
                panes[p] = pay
                self._schedule_pane(key, g, p)
            s = (p // self.slide) * self.slide
            while s + self.size > p:
                if s + self.size <= self.fired_to[g] < s + self.size + self.lateness:
                    self.refire.add((key, s, s + self.size))
                s -= self.slide

    def _new_key(self, key, g: int, state):
        self.keys[key] = state
        self.group_of[key] = g
        self.by_group.setdefault(g, set()).add(key)
        return state

    def _schedule_pane(self, key, g: int, p: int, fired: int | None = None) -> None:
        """A new pane: the windows it is in that have not fired (that end after
        ``fired``, by default the group's ``fired_to``) are due; it expires when its last
        window is past lateness."""
        fired = self.fired_to[g] if fired is None else fired
        last_start = (p // self.slide) * self.slide
        s = last_start
        while s + self.size > p:
            if s + self.size > fired:
                heapq.heappush(self._due, (s + self.size, next(self._n), key))
            s -= self.slide
        heapq.heappush(self._expire, (last_start + self.size + self.lateness, next(self._n), key))

    def _raise_floor(self, watermark: int) -> None:
        """The operator's watermark is ``watermark``: ``fired_to`` follows it, but for the
        key groups held while they move, even at the end of the inputs (+inf): a new owner
        whose routers have all ended may still hold rows of a moving group back until its
        state is in, and they must not be late by then (:meth:`end` lets go at the finish)."""
        self.watermark = max(self.watermark, int(watermark))
        free = ~self.held
        self.fired_to[free] = np.maximum(self.fired_to[free], self.watermark)
        self.wants_fire = False

    def advance(self, watermark: int) -> list:
        """The operator's watermark is ``watermark``: fire what is due, drop what expired.
        Returns ``(key, start, end, payload)`` of every window fired (late firings too)."""
        self._raise_floor(watermark)
        out = self._fire_due()
        for key, start, end in sorted(self.refire, key=lambda r: (r[2], r[1])):
            w = self._window(key, start, end)
            if w is not None:
                out.append(w)
        self.refire.clear()
        self._expire_due()
        return out

    def _pop(self, heap: list):
        """Entries of ``heap`` due by their key group's ``fired_to`` (others wait)."""
        later = []
        while heap and heap[0][0] <= self.watermark:
            t, n, key = heapq.heappop(heap)
            g = self.group_of.get(key)
            if g is None:
                continue            # the key moved away or expired
            if t > self.fired_to[g] or self.held[g]:
                # not due by its group's watermark, or its group is moving: a new owner fires
                # (and drops) nothing of a group until all of its state and held rows are in
                later.append((t, n, key))
                continue
            yield t, key
        for item in later:
            heapq.heappush(heap, item)

    def _fire_due(self) -> list:
        out, seen = [], set()
        for end, key in self._pop(self._due):
            if (key, end) in seen:
                continue
            seen.add((key, end))
            self.mark_dirty([self.group_of[key]])
            if self.kind == "session":
                for s in self.keys[key]:
                    if not s[3] and not s[4] and s[1] + self.gap == end:
                        s[3] = True
                        out.append((key, s[0], end, s[2]))
                        heapq.heappush(self._expire, (end + self.lateness, next(self._n), key))
            else:
                w = self._window(key, end - self.size, end)
                if w is not None:
                    out.append(w)
        return out

    def _window(self, key, start: int, end: int):
        """``(key, start, end, payload)`` of one window of ``key`` now (None: nothing held)."""
        state = self.keys.get(key)
        if state is None:
            return None
        if self.kind == "session":
            for s in state:
                if s[0] == start and not s[4]:
                    return key, start, s[1] + self.gap, s[2]
            return None
        parts = [pay for p, pay in state.items() if start <= p < end]
        if not parts:
            return None
        acc = self.payload.copy(parts[0])
        for pay in parts[1:]:
            self.payload.merge(acc, pay)
        return key, start, end, acc

    def _expire_due(self) -> None:
        for _, key in self._pop(self._expire):
            g = self.group_of[key]
            limit = self.fired_to[g] - self.lateness
            state = self.keys[key]
            self.mark_dirty([g])
            if self.kind == "session":
                self._close_sessions(key, state, limit)
            else:
                for p in [p for p in state if (p // self.slide) * self.slide + self.size <= limit]:
                    del state[p]
            if not state:
                self._drop(key)

    def _drop(self, key) -> None:
        self.closed.discard(key)
        g = self.group_of.pop(key)
        del self.keys[key]
        ks = self.by_group.get(g)
        if ks is not None:
            ks.discard(key)
            if not ks:
                del self.by_group[g]

    def rows(self, fired: list) -> pd.DataFrame | None:
        """Fired windows as the operator's output rows (aggregate), or None for none."""
        if not fired:
            return None
        keys, starts, ends, payloads = zip(*fired)
        tt = self.time_type
        cols = {self.key_name: _key_array(list(keys)), "window_start": from_ns(np.array(starts, np.int64), tt),
                "window_end": from_ns(np.array(ends, np.int64), tt)}
        if isinstance(self.payload, Accumulators):
            cols.update(self.payload.columns(list(payloads), fired))
            return pd.DataFrame(cols)
        if hasattr(self.payload, "rows"):       # a window join: its pairs, then the window's bounds
            return self.payload.rows(fired, tt)
        parts = []
        for key, s, e, pay in fired:
            out = self.payload.call(key, from_ns(np.array([s]), tt)[0], from_ns(np.array([e]), tt)[0], pay)
            out = out.reset_index(drop=True)
            head = pd.DataFrame({self.key_name: [key] * len(out), "window_start": from_ns(np.full(len(out), s), tt),
                                 "window_end": from_ns(np.full(len(out), e), tt)})
            parts.append(pd.concat([head, out.drop(columns=[c for c in head if c in out])], axis=1))
        return pd.concat(parts, ignore_index=True)

    # -- migration and checkpoints ------------------------------------------------------------
    def _held(self, groups) -> list:
        return [(k, g) for g in dict.fromkeys(int(g) for g in groups) for k in self.by_group.get(g, ())]

    def _blob(self, items: list, groups: list[int], take: bool) -> dict:
        states = {Floor(g): int(self.fired_to[g]) for g in groups}
        order = list(groups)
        for k, g in items:
            states[k] = self._take(k) if take else _copy_state(self.keys[k], self.payload)
            order.append(g)
        return {"states": states, "key_groups": np.array(order, np.int64)}

    def _take(self, key):
        state = self.keys[key]
        self._drop(key)
        return state

    def cut(self, groups) -> dict:
        groups = [int(g) for g in groups]
        self.mark_dirty(groups)
        return self._blob(self._held(groups), groups, take=True)

    def snapshot(self, groups) -> dict:
        groups = [int(g) for g in groups]
        return self._blob(self._held(groups), groups, take=False)

    def _keys_asked(self, keys, groups) -> tuple[np.ndarray, np.ndarray]:
        """Keys a lazy migration pulls and their key groups (found if not given), marked
        changed."""
        keys = np.asarray(keys)
        if groups is None:
            groups = assign_to_key_group(keys, self.groups, name=self.key_name) if len(keys) else np.zeros(0, np.int64)
        groups = np.asarray(groups, np.int64)
        self.mark_dirty(groups)
        return keys, groups

    def cut_keys(self, keys, groups=None) -> dict:
        keys = np.asarray(keys).tolist()
        if groups is None:
            groups = assign_to_key_group(_key_array(keys), self.groups, name=self.key_name) if keys else []
        groups = np.asarray(groups, np.int64).tolist()
        self.mark_dirty(groups)
        # a key asked for twice (by routers of both inputs of a join) goes once
        items = list(dict.fromkeys((k, g) for k, g in zip(keys, groups) if k in self.keys))
        return self._blob(items, sorted(set(groups)), take=True)

    def _floors(self, blob: dict) -> tuple[dict, list, dict]:
        """An installed blob's ``(states, key groups, {group: fired_to})``; each group's
        ``fired_to`` here is raised to the one it comes with."""
        states, groups = blob["states"], blob["key_groups"].tolist()
        self.mark_dirty(groups)
        floors = {k.group: v for k, v in states.items() if isinstance(k, Floor)}
        for g, v in floors.items():
            self.fired_to[g] = max(self.fired_to[g], v)
        return states, groups, floors

    def install(self, blob: dict) -> None:
        states, groups, floors = self._floors(blob)
        for (k, state), g in zip(states.items(), groups):
            if isinstance(k, Floor):
                continue
            # windows that had not fired where the state comes from are due here, even
            # those whose end this owner's watermark passed already
            self._install_key(k, g, state, floors.get(g, MIN_TIME))
        self.wants_fire = True

    def _install_key(self, key, g: int, state, fired: int) -> None:
        mine = self.keys.get(key)
        if self.kind == "session":
            if mine is None:
                mine = self._new_key(key, g, [])
            for s in state:
                self._merge_session(key, g, mine, list(s), record=False)
                if s[3] or s[4]:
                    heapq.heappush(self._expire, (s[1] + (2 if s[4] else 1) * self.gap + self.lateness,
                                                  next(self._n), key))
            return
        if mine is None:
            mine = self._new_key(key, g, {})
        for p, pay in state.items():
            if p in mine:
                self.payload.merge(mine[p], pay)
            else:
                mine[p] = pay
                self._schedule_pane(key, g, p, fired)

    def frame(self, touched=None) -> pd.DataFrame:
        """The windows still open (not fired), in the operator's output columns; for
        ``apply``, each open window's ``rows`` held."""
        return _open_windows(self)


def _copy_state(state, payload):
    """A copy a snapshot can hold while the store goes on changing its own."""
    if isinstance(state, dict):
        return {p: payload.copy(v) for p, v in state.items()}
    return [[s[0], s[1], payload.copy(s[2]) if s[2] is not None else None, s[3], s[4]] for s in state]


def _open_windows(self) -> pd.DataFrame:
    """``WindowState.frame``: its windows not fired yet."""
    open_ = []
    for key, state in self.keys.items():
        g = self.group_of[key]
        if self.kind == "session":
            open_ += [(key, s[0], s[1] + self.gap, s[2]) for s in state if not s[3] and not s[4]]
            continue
        starts = {(p // self.slide) * self.slide - j * self.slide for p in state
                  for j in range(-(-self.size // self.slide))}
        for s in sorted(starts):
            if s + self.size > self.fired_to[g] and (w := self._window(key, s, s + self.size)) is not None:
                open_.append(w)
    if isinstance(self.payload, Accumulators):
        out = self.rows(open_)
        if out is None:
            out = self.rows([(0, 0, 0, [0] * (4 * len(self.payload.inputs)))]).iloc[:0]
        return out
    tt = self.time_type
    return pd.DataFrame({self.key_name: [w[0] for w in open_],
                         "window_start": from_ns(np.array([w[1] for w in open_], np.int64), tt),
                         "window_end": from_ns(np.array([w[2] for w in open_], np.int64), tt),
                         "rows": [self.payload.size(w[3]) for w in open_]})


__all__ = ["WindowState", "Floor", "MAX_TIME"]
