"""Session windows of :class:`~._windows.WindowState`, per key: ``[start, last, payload,
fired, closed]`` sorted by start, merged as records join them (two records of a key share a
session when their event times differ by at most ``gap``). A session that fired and is past
its lateness becomes a *tombstone* (``closed``, payload dropped), kept for ``gap`` longer so
that a record that would join it is told late rather than starting a session of its own.
"""
from __future__ import annotations

import heapq

import numpy as np
import pandas as pd


class Sessions:
    """The per-key part of :class:`~._windows.KeyedSessions` (a
    :class:`~._windows.WindowState`, which holds ``keys``, ``fired_to``, ``refire``,
    ``closed``, the heaps, and the :class:`~._window_assigners.SessionWindows` assigner
    that says how far a session reaches). A record whose own window ``[t, t + gap)`` is
    past lateness is late (``WindowState._late``), and so is one that would join a session
    closed for good (kept as a tombstone, without its payload, until no record can reach it
    any more): it is not applied at all."""

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
