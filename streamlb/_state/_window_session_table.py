"""Vectorised window state for session window aggregates.

The sessions of every key live in one table of numpy columns: key, key group, start, last
event time, fired, closed (a *tombstone*: fired, past its lateness, its aggregates no longer
needed, kept ``gap`` longer so that a record that would join it is told late rather than
starting a session of its own), ``again`` (a fired session that took a late record and
fires again), and the partial aggregates each input column needs (count, and sum, min, max
as the spec asks). A batch joins the table as one-record sessions; sorted by key and start,
the sessions of a key merge where one starts within ``gap`` of the latest end before it
(one pass of numpy: a break where the key changes or a start is more than ``gap`` past the
running maximum of its key's last event times), and a run's aggregates are ``reduceat``
sums, minima and maxima. Firing and expiring are masks over the table. Per record, the work
stays in numpy, as for the pane store (:mod:`._window_panes`).

How far a session reaches is its assigner's (:class:`~._window_assigners.SessionWindows`);
what is late and how state moves are :class:`~._windows.WindowState`'s, which this store
extends for ``window(gap=...).aggregate(...)``; ``apply`` keeps the per-key store
(:class:`~._windows.KeyedSessions`). Blobs, for migration
and checkpoints, are the same as ``WindowState``'s: per key, its sessions as
``[start, last, payload, fired, closed]`` sorted by start (a payload is
``[count, sum, min, max]`` per input column, None for a tombstone), plus a
:class:`~._windows.Floor` per key group.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .._time import from_ns
from ._stateful_map import _key_array
from ._windows import Floor, WindowState

_FLAGS = ("fired", "closed", "again")
_REDUCE = {"cnt": np.add, "sum": np.add, "min": np.minimum, "max": np.maximum}


def _fills(dt: np.dtype) -> tuple:
    """What an empty min and max hold in ``dt``: the exact integer bounds, or infinities."""
    if dt.kind == "i":
        return np.iinfo(np.int64).max, np.iinfo(np.int64).min
    return np.inf, -np.inf


class SessionWindowState(WindowState):
    """Session windows of a window ``aggregate``, as one table of numpy columns."""

    def __init__(self, operator: str, window: dict, key_name: str, key_groups: int, spec=None, func=None) -> None:
        super().__init__(operator, window, key_name, key_groups, spec=spec)
        self.spec = spec
        self.stats: dict[str, list[str]] = {}       # input column -> the partials it keeps
        for c in self.payload.inputs:
            hows = {h for cc, h in spec.values() if cc == c}
            wanted = (("sum", {"sum", "mean"}), ("min", {"min"}), ("max", {"max"}))
            self.stats[c] = ["cnt"] + [s for s, want in wanted if hows & want]
        self.t: dict | None = None          # the table (None when it holds nothing)

    # -- the table ----------------------------------------------------------------------------
    def _dtype(self, c: str, values=None) -> np.dtype:
        """Input ``c``'s dtype as the batches gave it, else as ``values`` (installed) suggest."""
        dt = self.payload.dtypes.get(c)
        if dt is not None:
            return dt
        if values is None:
            return np.dtype(np.float64)
        return np.dtype(np.int64) if all(isinstance(v, (int, np.integer)) for v in values) else np.dtype(np.float64)

    def _keep(self, mask: np.ndarray) -> None:
        self.t = {c: v[mask] for c, v in self.t.items()} if mask.any() else None

    def _add(self, rows: dict) -> None:
        if not len(rows["key"]):
            return
        if self.t is None:
            self.t = rows
        else:
            self.t = {c: np.concatenate((v, rows[c])) for c, v in self.t.items()}

    # -- data: lateness and the late rows are WindowState's (update, _late) -------------------
    def _apply(self, frame, keys, groups, times) -> None:
        self.mark_dirty(np.unique(groups))
        self._merge(self._records(frame, keys, groups, times))

    def _tombstone_late(self, keys, times, thr, late, late_rows: list) -> None:
        """As :class:`~._windows.KeyedSessions`'s, with the tombstones found by one merge."""
        t = self.t
        if t is None or not t["closed"].any():
            return
        closed = t["closed"]
        cand = np.flatnonzero(~late & pd.Series(keys).isin(t["key"][closed]).to_numpy())
        if not len(cand):
            return
        rec = pd.DataFrame({"r": cand, "k": keys[cand], "t": times[cand]})
        tomb = pd.DataFrame({"k": t["key"][closed], "s0": t["start"][closed], "s1": t["last"][closed]})
        m = rec.merge(tomb, on="k")
        gap = self.assigner.gap
        m = m[(m.s0 - gap <= m.t) & (m.t <= m.s1 + gap)]
        if not len(m):
            return
        m = m.sort_values(["r", "s0"]).drop_duplicates("r")
        r = m.r.to_numpy()
        late[r] = True
        late_rows.append((r, m.s0.to_numpy(), self.assigner.end_of(m.s1.to_numpy()), thr[r]))

    def _records(self, frame, keys, groups, times) -> dict:
        """A batch as one-record sessions (``rec``: they come from records)."""
        n = len(times)
        rows = {"key": keys, "group": groups, "start": times, "last": times, "rec": np.ones(n, bool)}
        for f in _FLAGS:
            rows[f] = np.zeros(n, bool)
        for c, stats in self.stats.items():
            arr = self.payload._column(frame, c)
            valid = ~pd.isna(arr) if arr.dtype.kind not in "iub" else np.ones(n, bool)
            rows[("cnt", c)] = valid.astype(np.int64)
            if len(stats) == 1:
                continue
            dt = self._dtype(c)
            vals = np.where(valid, arr, 0).astype(dt)
            min_fill, max_fill = _fills(dt)
            for s in stats[1:]:
                rows[(s, c)] = vals if s == "sum" else np.where(valid, vals, min_fill if s == "min" else max_fill)
        return rows

    def _merge(self, rows: dict) -> None:
        """Merge new sessions (records, or installed state) into the table's open ones."""
        rec = rows.pop("rec")
        t = self.t
        if t is not None:
            open_ = ~t["closed"]
            rec = np.concatenate((np.zeros(int(open_.sum()), bool), rec))
            rows = {c: np.concatenate((v[open_], rows[c])) for c, v in t.items()}
            self._keep(~open_)             # the tombstones stay as they are
        codes = pd.factorize(rows["key"])[0]
        order = np.lexsort((rows["start"], codes))
        codes, rec = codes[order], rec[order]
        rows = {c: v[order] for c, v in rows.items()}
        reach = pd.Series(rows["last"]).groupby(codes, sort=False).cummax().to_numpy()
        brk = np.ones(len(codes), bool)
        brk[1:] = (codes[1:] != codes[:-1]) | (rows["start"][1:] > self.assigner.end_of(reach[:-1]))
        heads = np.flatnonzero(brk)
        new = {"key": rows["key"][heads], "group": rows["group"][heads], "start": rows["start"][heads],
               "last": np.maximum.reduceat(rows["last"], heads), "closed": np.zeros(len(heads), bool)}
        for c, v in rows.items():
            if isinstance(c, tuple):
                new[c] = _REDUCE[c[0]].reduceat(v, heads)
        fired = np.logical_or.reduceat(rows["fired"], heads)
        # a fired session that grew past its group's watermark fires again when that passes
        # it; one that took a late record within its lateness fires again at once
        fired &= self.assigner.end_of(new["last"]) <= self.fired_to[new["group"]]
        new["fired"] = fired
        new["again"] = fired & (np.logical_or.reduceat(rows["again"], heads) | np.logical_or.reduceat(rec, heads))
        self._add(new)
        if new["again"].any():
            a = np.flatnonzero(new["again"])
            self.refire.update(zip(new["key"][a].tolist(), new["start"][a].tolist(),
                                   self.assigner.end_of(new["last"][a]).tolist()))

    # -- firing -------------------------------------------------------------------------------
    def advance(self, watermark: int) -> list:
        self._raise_floor(watermark)
        self.refire.clear()
        t = self.t
        if t is None:
            return []
        ft = self.fired_to[t["group"]]
        free = ~self.held[t["group"]]
        out = []
        due = ~t["fired"] & ~t["closed"] & (self.assigner.end_of(t["last"]) <= ft) & free
        for mask in (due, t["again"] & ~t["closed"]):
            if mask.any():
                self.mark_dirty(np.unique(t["group"][mask]))
                out.append(self._output(mask))
        t["fired"] |= due
        t["again"][:] = False
        # fired sessions past lateness become tombstones, and go once a record that could
        # join them is late anyway (``gap`` further on); a moving group's wait (see advance)
        limit = ft - self.lateness
        past = t["fired"] & free & (self.assigner.end_of(t["last"]) <= limit)
        drop = past & (t["last"] + 2 * self.assigner.gap <= limit)
        changed = (past & ~t["closed"]) | drop
        if changed.any():
            self.mark_dirty(np.unique(t["group"][changed]))
            t["closed"] |= past
            if drop.any():
                self._keep(~drop)
        return out

    def _output(self, mask: np.ndarray) -> pd.DataFrame:
        """Output rows of the table's sessions under ``mask``, by end then start."""
        t = self.t
        idx = np.flatnonzero(mask)
        idx = idx[np.lexsort((t["start"][idx], t["last"][idx]))]
        keys = t["key"][idx]
        tt = self.time_type
        out = {self.key_name: _key_array(keys.tolist()) if keys.dtype == object else keys,
               "window_start": from_ns(t["start"][idx], tt),
               "window_end": from_ns(self.assigner.end_of(t["last"][idx]), tt)}
        for name, (c, how) in self.spec.items():
            cnt = t[("cnt", c)][idx]
            if how == "count":
                out[name] = cnt
                continue
            dt = self._dtype(c)
            if how in ("sum", "mean"):
                s = t[("sum", c)][idx]
                if how == "sum":
                    out[name] = s.astype(dt)
                    continue
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[name] = s.astype(np.float64) / np.where(cnt == 0, np.nan, cnt)
                continue
            v = t[(how, c)][idx]
            out[name] = v if dt.kind == "i" and (cnt > 0).all() else np.where(cnt > 0, v, np.nan).astype(np.float64)
        return pd.DataFrame(out)

    def rows(self, fired: list) -> pd.DataFrame | None:
        if not fired:
            return None
        return fired[0] if len(fired) == 1 else pd.concat(fired, ignore_index=True)

    # -- migration and checkpoints: blobs per key, as WindowState's ------------------------------
    def _blob(self, mask: np.ndarray | None, groups: list[int], take: bool) -> dict:
        states, order = {Floor(g): int(self.fired_to[g]) for g in groups}, list(groups)
        t = self.t
        if t is None or mask is None or not mask.any():
            return {"states": states, "key_groups": np.array(order, np.int64)}
        idx = np.flatnonzero(mask)
        idx = idx[np.lexsort((t["start"][idx], pd.factorize(t["key"][idx])[0]))]
        cols = {c: t[c][idx].tolist() for c in t}
        for i, (k, g) in enumerate(zip(cols["key"], cols["group"])):
            sessions = states.get(k)
            if sessions is None:
                sessions = states[k] = []
                order.append(g)
            sessions.append([cols["start"][i], cols["last"][i], None if cols["closed"][i] else self._payload(cols, i),
                             cols["fired"][i], cols["closed"][i]])
        if take:
            self._keep(~mask)
        return {"states": states, "key_groups": np.array(order, np.int64)}

    def _payload(self, cols: dict, i: int) -> list:
        """Row ``i`` of ``cols`` as a per-key payload: ``[count, sum, min, max]`` per input."""
        pay = []
        for c, stats in self.stats.items():
            k = cols[("cnt", c)][i]
            pay += [k, cols[("sum", c)][i] if "sum" in stats else 0,
                    cols[("min", c)][i] if "min" in stats and k else np.inf,
                    cols[("max", c)][i] if "max" in stats and k else -np.inf]
        return pay

    def _group_mask(self, groups) -> np.ndarray | None:
        return None if self.t is None else np.isin(self.t["group"], np.asarray(groups, np.int64))

    def cut(self, groups) -> dict:
        groups = sorted({int(g) for g in groups})
        self.mark_dirty(groups)
        return self._blob(self._group_mask(groups), groups, take=True)

    def snapshot(self, groups) -> dict:
        groups = sorted({int(g) for g in groups})
        return self._blob(self._group_mask(groups), groups, take=False)

    def cut_keys(self, keys, groups=None) -> dict:
        keys, groups = self._keys_asked(keys, groups)
        mask = None if self.t is None else pd.Series(self.t["key"]).isin(keys).to_numpy()
        return self._blob(mask, sorted(set(groups.tolist())), take=True)

    def install(self, blob: dict) -> None:
        states, groups, _ = self._floors(blob)
        sessions = [(k, g, s) for (k, ss), g in zip(states.items(), groups) if not isinstance(k, Floor) for s in ss]
        for closed in (True, False):
            part = [x for x in sessions if bool(x[2][4]) == closed]
            if not part:
                continue
            rows = self._installed(part)
            if closed:
                rows.pop("rec")
                self._add(rows)
            else:
                self._merge(rows)
        self.wants_fire = True

    def _installed(self, part: list) -> dict:
        """Installed sessions ``(key, group, [start, last, payload, fired, closed])`` as rows."""
        n = len(part)
        rows = {"key": _key_array([k for k, _, _ in part]), "group": np.array([g for _, g, _ in part], np.int64),
                "start": np.array([s[0] for _, _, s in part], np.int64),
                "last": np.array([s[1] for _, _, s in part], np.int64),
                "fired": np.array([bool(s[3]) for _, _, s in part], bool),
                "closed": np.array([bool(s[4]) for _, _, s in part], bool), "again": np.zeros(n, bool),
                "rec": np.zeros(n, bool)}
        for j, (c, stats) in enumerate(self.stats.items()):
            pays = [s[2] if s[2] is not None else [0, 0, np.inf, -np.inf] * len(self.stats) for _, _, s in part]
            rows[("cnt", c)] = np.array([p[4 * j] for p in pays], np.int64)
            if len(stats) == 1:
                continue
            dt = self._dtype(c, [p[4 * j + 1] for p in pays if p[4 * j]])
            min_fill, max_fill = _fills(dt)
            for s in stats[1:]:
                at = 4 * j + ("cnt", "sum", "min", "max").index(s)
                fill = 0 if s == "sum" else (min_fill if s == "min" else max_fill)
                rows[(s, c)] = np.array([p[at] if p[4 * j] else fill for p in pays], dt)
        if self.t is not None:          # the same columns, in the same order, as the table's
            rows = {c: rows[c] for c in list(self.t) + ["rec"] if c in rows}
        return rows

    # -- what the store holds -------------------------------------------------------------------
    def contains(self, keys, groups=None) -> np.ndarray:
        if self.t is None:
            return np.zeros(len(keys), bool)
        return pd.Series(np.asarray(keys)).isin(self.t["key"]).to_numpy()

    def keys_per_group(self, groups) -> np.ndarray:
        groups = np.asarray(list(groups), np.int64)
        if self.t is None:
            return np.zeros(len(groups), np.int64)
        codes = pd.factorize(self.t["key"])[0]
        pairs = np.unique(self.t["group"] * (int(codes.max()) + 1) + codes)
        counts = np.bincount(pairs // (int(codes.max()) + 1), minlength=self.groups)
        return counts[groups]

    def __len__(self) -> int:
        return 0 if self.t is None else len(pd.unique(self.t["key"]))

    def key_kind(self) -> str | None:
        return None if self.t is None else _key_array(self.t["key"][:1].tolist()).dtype.kind

    def frame(self, touched=None) -> pd.DataFrame:
        """The sessions still open (not fired), in the operator's output columns."""
        if self.t is not None:
            mask = ~self.t["fired"] & ~self.t["closed"]
            if mask.any():
                return self._output(mask)
        empty = {self.key_name: np.zeros(0, np.int64), "window_start": from_ns(np.zeros(0, np.int64), self.time_type),
                 "window_end": from_ns(np.zeros(0, np.int64), self.time_type)}
        return pd.DataFrame({**empty, **{c: np.zeros(0, np.int64 if how == "count" else np.float64)
                                         for c, (_, how) in self.spec.items()}})
