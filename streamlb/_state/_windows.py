"""Window state: per key, open panes (tumbling, hopping) or sessions, in key groups.

What a window kind means for time is its assigner's (:mod:`._window_assigners`), which
every window store asks. Fixed windows (tumbling, hopping) keep *panes* of
``gcd(size, slide)``: a record goes into one pane, and a window, when it fires, combines the
panes it spans, so a hopping window never copies a record into each of its windows
(:class:`KeyedPanes`). Merging windows (sessions) are kept per key as
``[start, last, payload, fired, closed]``, merged as records join them
(:class:`KeyedSessions`). A payload is the pane's or session's partial aggregates, or its
rows (:mod:`._window_payload`).

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
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._time import MAX_TIME, MIN_TIME, from_ns
from ..keygroups import assign_to_key_group
from ._base import StateStore
from ._index import first_rows
from ._keydict import KeyDict
from ._stateful_map import _key_array
from ._window_assigners import assigner_of
from ._window_payload import Accumulators, Rows


@dataclass(frozen=True)
class Floor:
    """A blob entry (in place of a key) carrying key group ``group``'s ``fired_to``."""

    group: int


class WindowState(KeyDict, StateStore):
    """Open windows of one window operator instance.

    ``window``: the stage's window (kind, size, slide, gap, lateness in nanoseconds, mode
    ``aggregate`` or ``apply``). ``spec`` for an aggregate, ``func`` for apply. What time
    means (buckets, the windows a row or pane is in, when they end) is the window's
    assigner's (:mod:`._window_assigners`); this class holds what every store shares
    (``fired_to``, holds, lateness, blobs). Built as such, it keeps per key the panes of
    fixed windows or the sessions of merging ones (:class:`KeyedPanes`,
    :class:`KeyedSessions`, chosen by the assigner).
    """

    def __new__(cls, *args, **kwargs):
        if cls is WindowState:          # the per-key store of the window's kind
            window = kwargs["window"] if "window" in kwargs else args[1]
            cls = KeyedSessions if assigner_of(window).merging else KeyedPanes
        return super().__new__(cls)

    def __init__(self, operator: str, window: dict, key_name: str, key_groups: int, spec=None, func=None,
                 payload=None) -> None:
        self.operator, self.key_name, self.groups = operator, key_name, key_groups
        self.assigner = assigner_of(window)
        self.lateness = window["lateness"]
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
        # a record late for a fixed window that fired within lateness fires it again; a
        # merging window fires again when the merge says so
        late_rows, applied = self._late(times, self.fired_to[groups], keys, refire=not self.assigner.merging)
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

    def _late(self, times, thr, keys, refire: bool):
        """``(late rows, applied)``: a record is late when every window it is in (by the
        assigner) ended ``lateness`` or more before ``thr``, its key group's ``fired_to``,
        or when it would join a session closed for good (:meth:`_tombstone_late`);
        ``refire``: windows that fired and take a record within lateness fire again."""
        late_rows, applied = [], np.zeros(len(times), bool)
        for start, end, valid in self.assigner.windows_of(times):
            missed = valid & (end + self.lateness <= thr)
            applied |= valid & ~missed
            if missed.any():
                r = np.flatnonzero(missed)
                late_rows.append((r, start[r], end[r], thr[r]))
            again = np.flatnonzero(valid & ~missed & (end <= thr)) if refire else ()
            if len(again):
                self.refire.update(zip(keys[again].tolist(), start[again].tolist(), end[again].tolist()))
        late = ~applied
        self._tombstone_late(keys, times, thr, late, late_rows)
        return late_rows, ~late

    def _tombstone_late(self, keys, times, thr, late, late_rows: list) -> None:
        """Records that would join a session closed for good are late (``late`` set in
        place, their rows added to ``late_rows``): none here, where nothing is closed for
        good (see :class:`KeyedSessions`)."""

    def _helper_rows(self, frame: pd.DataFrame, groups, times):
        """A helper's rows of split keys: ``(late rows, (rows, keys, groups, times) of the
        others)``, late by this instance's watermark; the second is None if none is left."""
        keys = frame[self.key_name].to_numpy()
        groups = np.asarray(groups, np.int64)
        late_rows, applied = self._late(times, self.fired_to[groups], keys, refire=False)
        late = self._late_frame(frame, late_rows)
        idx = np.flatnonzero(applied)
        if not len(idx):
            return late, None
        return late, (frame.take(idx), keys[idx], groups[idx], times[idx])

    def _new_key(self, key, g: int, state):
        self.keys[key] = state
        self.group_of[key] = g
        self.by_group.setdefault(g, set()).add(key)
        return state

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
            out += self._fire(key, end)
        return out

    def _expire_due(self) -> None:
        for _, key in self._pop(self._expire):
            g = self.group_of[key]
            state = self.keys[key]
            self.mark_dirty([g])
            self._expire_key(key, state, self.fired_to[g] - self.lateness)
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

    def pieces(self, fired: list):
        """The output rows of what :meth:`advance` fired, as frames to send on one after
        the other: :meth:`rows`, one frame (a store in RocksDB gives a large window's rows
        a range of key groups at a time, never all in memory)."""
        out = self.rows(fired)
        return [] if out is None else [out]

    def discard(self, fired: list) -> None:
        """What :meth:`advance` fired goes nowhere (an operator with nothing after it)."""

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
            states[k] = self._take(k) if take else self._copy(self.keys[k])
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

    def frame(self, touched=None) -> pd.DataFrame:
        """The windows still open (not fired), in the operator's output columns; for
        ``apply``, each open window's ``rows`` held."""
        open_ = []
        for key, state in self.keys.items():
            open_ += self._open(key, self.group_of[key], state)
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


class KeyedPanes(WindowState):
    """Per key, the panes of fixed windows (tumbling, hopping): ``{pane start: payload}``.
    A window, when it fires, combines the panes it spans."""

    def _apply(self, frame, keys, groups, times) -> None:
        self.mark_dirty(groups)
        codes, uniq_keys = pd.factorize(keys, sort=False)
        uniq_keys = uniq_keys.tolist()          # Python keys: hashable alike, and stored as such
        pair = pd.MultiIndex.from_arrays([codes, self.assigner.bucket(times)])
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
        pcodes, pairs = pd.factorize(pd.MultiIndex.from_arrays([codes, self.assigner.bucket(times)]), sort=False)
        payloads = self.payload.build(sub, np.asarray(pcodes), len(pairs))
        first = first_rows(pcodes, len(pairs))
        uniq = uniq.tolist()
        return late, {"panes": [(uniq[kc], g, p, pay) for (kc, p), g, pay in
                                zip(pairs.tolist(), groups[first].tolist(), payloads)]}

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
            for s, end in self.assigner.windows_of_pane(p):
                if end <= self.fired_to[g] < end + self.lateness:
                    self.refire.add((key, s, end))

    def _schedule_pane(self, key, g: int, p: int, fired: int | None = None) -> None:
        """A new pane: the windows it is in that have not fired (that end after
        ``fired``, by default the group's ``fired_to``) are due; it expires when its last
        window is past lateness."""
        fired = self.fired_to[g] if fired is None else fired
        for _, end in self.assigner.windows_of_pane(p):
            if end > fired:
                heapq.heappush(self._due, (end, next(self._n), key))
        heapq.heappush(self._expire, (self.assigner.last_end(p) + self.lateness, next(self._n), key))

    # -- firing -------------------------------------------------------------------------------
    def _fire(self, key, end: int) -> list:
        w = self._window(key, self.assigner.start_of(end), end)
        return [] if w is None else [w]

    def _window(self, key, start: int, end: int):
        state = self.keys.get(key)
        if state is None:
            return None
        parts = [pay for p, pay in state.items() if start <= p < end]
        if not parts:
            return None
        acc = self.payload.copy(parts[0])
        for pay in parts[1:]:
            self.payload.merge(acc, pay)
        return key, start, end, acc

    def _expire_key(self, key, state: dict, limit: int) -> None:
        for p in [p for p in state if self.assigner.last_end(p) <= limit]:
            del state[p]

    def _open(self, key, g: int, state: dict) -> list:
        out = []
        for s in sorted(self.assigner.starts_near(state)):
            end = s + self.assigner.size
            if end > self.fired_to[g] and (w := self._window(key, s, end)) is not None:
                out.append(w)
        return out

    # -- migration and checkpoints ------------------------------------------------------------
    def _copy(self, state: dict) -> dict:
        return {p: self.payload.copy(v) for p, v in state.items()}

    def _install_key(self, key, g: int, state: dict, fired: int) -> None:
        mine = self.keys.get(key)
        if mine is None:
            mine = self._new_key(key, g, {})
        for p, pay in state.items():
            if p in mine:
                self.payload.merge(mine[p], pay)
            else:
                mine[p] = pay
                self._schedule_pane(key, g, p, fired)


class KeyedSessions(WindowState):
    """Per key, the sessions of merging windows: ``[start, last, payload, fired, closed]``
    sorted by start, merged as records join them (two records of a key share a session when
    their event times differ by at most ``gap``). A session that fired and is past its
    lateness becomes a *tombstone* (``closed``, payload dropped), kept for ``gap`` longer so
    that a record that would join it is told late rather than starting a session of its own.

    The :class:`~._window_assigners.SessionWindows` assigner says how far a session reaches.
    A record whose own window ``[t, t + gap)`` is past lateness is late
    (``WindowState._late``), and so is one that would join a session closed for good (kept as
    a tombstone, without its payload, until no record can reach it any more): it is not
    applied at all."""

    def _tombstone_late(self, keys, times, thr, late, out: list) -> None:
        """Records that would join a tombstone of their key are late (``late`` set in place,
        their rows added to ``out``), reported in the window of the first such tombstone."""
        if self.closed:
            gap = self.assigner.gap
            rows, starts, ends = [], [], []
            for r in np.flatnonzero(~late & pd.Index(keys).isin(list(self.closed))).tolist():
                t = int(times[r])
                for s in self.keys[keys[r]]:
                    if s[4] and s[0] - gap <= t <= s[1] + gap:
                        rows.append(r)
                        starts.append(s[0])
                        ends.append(s[1] + gap)
                        late[r] = True
                        break
            if rows:
                r = np.array(rows, np.int64)
                out.append((r, np.array(starts, np.int64), np.array(ends, np.int64), thr[r]))

    def _apply(self, frame, keys, groups, times) -> None:
        self.mark_dirty(groups)
        codes, uniq_keys = pd.factorize(keys, sort=False)
        uniq_keys = uniq_keys.tolist()          # Python keys: hashable alike, and stored as such
        order = np.lexsort((times, codes))
        c, t = codes[order], times[order]
        brk = np.ones(len(t), bool)
        brk[1:] = (c[1:] != c[:-1]) | (t[1:] - t[:-1] > self.assigner.gap)
        sess = np.cumsum(brk) - 1
        n = int(sess[-1]) + 1 if len(sess) else 0
        payloads = self.payload.build(frame.take(order), sess, n)
        heads = np.flatnonzero(brk)
        tails = np.concatenate((heads[1:] - 1, [len(t) - 1])) if len(heads) else heads
        for h, e, pay in zip(heads.tolist(), tails.tolist(), payloads):
            key = uniq_keys[c[h]]
            g = int(groups[order[h]])
            sessions = self.keys.get(key)
            if sessions is None:
                sessions = self._new_key(key, g, [])
            self._merge_session(key, g, sessions, [int(t[h]), int(t[e]), pay, False, False], record=True)

    def _merge_session(self, key, g: int, sessions: list, new: list, record: bool) -> None:
        """Merge session ``new`` into ``sessions`` of ``key`` (``record``: new records,
        which re-fire a fired session they join; else installed state)."""
        keep, merged, gap = [], new, self.assigner.gap
        if merged[4]:       # a tombstone (installed): kept as it is
            sessions.append(merged)
            sessions.sort(key=lambda s: s[0])
            self.closed.add(key)
            return
        for s in sessions:
            if not s[4] and s[0] <= merged[1] + gap and s[1] + gap >= merged[0]:
                merged = [min(s[0], merged[0]), max(s[1], merged[1]), self.payload.merge(s[2], merged[2]),
                          s[3] or merged[3], False]
            else:
                keep.append(s)
        end = self.assigner.end_of(merged[1])
        if merged[3]:
            if end > self.fired_to[g]:
                merged[3] = False
            elif record:
                self.refire.add((key, merged[0], end))      # a fired session took a late record
        if not merged[3]:       # due (at once if its end has passed: installed, never fired)
            heapq.heappush(self._due, (end, next(self._n), key))
        keep.append(merged)
        keep.sort(key=lambda s: s[0])
        sessions[:] = keep

    # -- firing -------------------------------------------------------------------------------
    def _fire(self, key, end: int) -> list:
        """The sessions of ``key`` that end at ``end`` and have not fired."""
        out = []
        for s in self.keys[key]:
            if not s[3] and not s[4] and self.assigner.end_of(s[1]) == end:
                s[3] = True
                out.append((key, s[0], end, s[2]))
                heapq.heappush(self._expire, (end + self.lateness, next(self._n), key))
        return out

    def _window(self, key, start: int, end: int):
        """``(key, start, end, payload)`` of the session of ``key`` starting at ``start``
        (its end as it is now; None: none)."""
        state = self.keys.get(key)
        if state is None:
            return None
        for s in state:
            if s[0] == start and not s[4]:
                return key, start, self.assigner.end_of(s[1]), s[2]
        return None

    def _expire_key(self, key, state: list, limit: int) -> None:
        """Fired sessions past lateness become tombstones; a tombstone goes once a record
        that could join it is late anyway (``gap`` further on)."""
        keep, gap = [], self.assigner.gap
        for s in state:
            if s[3] and s[1] + gap <= limit:
                if s[1] + 2 * gap <= limit:
                    continue
                if not s[4]:
                    s[2], s[4] = None, True
                    heapq.heappush(self._expire, (s[1] + 2 * gap + self.lateness, next(self._n), key))
            keep.append(s)
        state[:] = keep
        if any(s[4] for s in keep):
            self.closed.add(key)
        else:
            self.closed.discard(key)

    def _open(self, key, g: int, state: list) -> list:
        return [(key, s[0], self.assigner.end_of(s[1]), s[2]) for s in state if not s[3] and not s[4]]

    # -- migration and checkpoints ------------------------------------------------------------
    def _copy(self, state: list) -> list:
        return [[s[0], s[1], self.payload.copy(s[2]) if s[2] is not None else None, s[3], s[4]] for s in state]

    def _install_key(self, key, g: int, state: list, fired: int) -> None:
        mine = self.keys.get(key)
        if mine is None:
            mine = self._new_key(key, g, [])
        for s in state:
            self._merge_session(key, g, mine, list(s), record=False)
            if s[3] or s[4]:
                heapq.heappush(self._expire, (s[1] + (2 if s[4] else 1) * self.assigner.gap + self.lateness,
                                              next(self._n), key))


__all__ = ["WindowState", "KeyedPanes", "KeyedSessions", "Floor", "MAX_TIME"]
