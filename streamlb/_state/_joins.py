"""State of an interval or regular join: each side's rows, in key groups.

Each side keeps its rows in *chunks*, one per batch taken in, each sorted by key hash, so
the other side's rows find their matches with a binary search per chunk (no hash table
rebuilt per batch). The newest chunks are merged as a binary counter carries: a chunk no
larger than the one after it is merged with it, so a side of ``n`` rows keeps about
``log2(n / batch)`` chunks and each row is merged about that many times (merging every
chunk into one every few batches rewrote the whole side each time: a cost per batch that
grew with the state).
Rows leave when the watermark makes a new match impossible (interval joins: a left row
once ``time + upper`` is behind it, a right row once ``time - lower`` is; regular joins
with ``ttl``: once ``time + ttl`` is), and for ``left``, ``right`` and ``outer`` joins those
never matched are emitted then, with nulls for the other side. Rows of key groups held
while they move stay until the move is done here.

Blobs hold, per key group, the rows of both sides (``{"states": {Part(g): (left, right)},
"key_groups": ...}``: pickled per key group in checkpoints, as window state is per key). A
blob cut here holds them as :class:`GroupRows`, one frame per side, and travels so.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._time import MAX_TIME, MIN_TIME
from ..keygroups import assign_to_key_group, stable_hash
from ._base import StateStore

#: The most chunks a side keeps: past it the newest two are merged whatever their sizes.
MAX_CHUNKS = 24
SIDE = "_streamlb_side"         # the column a join's instance marks each arriving row's side in
KEY = "_streamlb_key"           # a window join's key, whatever each side calls its key column
_T, _M, _P = "_streamlb_t", "_streamlb_matched", "_streamlb_pair"


@dataclass(frozen=True)
class Part:
    """A blob entry (in place of a key): the rows of key group ``group``."""

    group: int


class _Chunk:
    """Rows of one side, sorted by key hash: ``frame`` (the rows' own columns), ``h``
    (hashes), ``keys``, ``t`` (event times, ns), ``g`` (key groups), ``m`` (matched).

    Rows cut out (a move, a lazy pull) are only marked gone in ``alive`` (None: every row
    is there) until half the chunk is gone: copying the rest of the chunk at every cut
    made each step of a move in small steps cost as much as moving the whole side. Every
    reader skips the rows gone; ``len()`` counts the rows there, :attr:`size` every row."""

    __slots__ = ("frame", "h", "keys", "t", "g", "m", "alive", "live")

    def __init__(self, frame, h, keys, t, g, m, *, sort: bool = True) -> None:
        if sort and len(h) > 1:
            o = np.argsort(h, kind="stable")
            frame, h, keys, t, g, m = frame.take(o), h[o], keys[o], t[o], g[o], m[o]
        self.frame = frame.reset_index(drop=True)
        self.h, self.keys, self.t, self.g, self.m = h, keys, t, g, m
        self.alive: np.ndarray | None = None
        self.live = len(h)

    def take(self, rows: np.ndarray) -> _Chunk:
        """A chunk of ``rows`` (rows that are there)."""
        return _Chunk(self.frame.take(rows), self.h[rows], self.keys[rows], self.t[rows], self.g[rows],
                      self.m[rows], sort=False)

    @property
    def size(self) -> int:
        return len(self.h)

    def there(self, mask: np.ndarray) -> np.ndarray:
        """``mask`` without the rows gone."""
        return mask if self.alive is None else mask & self.alive

    def drop(self, mask: np.ndarray) -> _Chunk | None:
        """Without the rows of ``mask`` (rows there): this chunk with them marked gone, a
        copy of the rest once half of it is gone, or None when nothing is left."""
        self.alive = ~mask if self.alive is None else self.alive & ~mask
        self.live = int(self.alive.sum())
        if not self.live:
            return None
        return self.take(np.flatnonzero(self.alive)) if self.live * 2 <= self.size else self

    def compact(self) -> _Chunk:
        return self if self.alive is None else self.take(np.flatnonzero(self.alive))

    def __len__(self) -> int:
        return self.live


def _concat(chunks: list) -> _Chunk:
    chunks = [c.compact() for c in chunks]
    return _Chunk(pd.concat([c.frame for c in chunks], ignore_index=True),
                  *(np.concatenate([getattr(c, a) for c in chunks]) for a in ("h", "keys", "t", "g", "m")))


class GroupRows(Mapping):
    """A blob's ``states`` as one frame per side in key-group order (``None``: no rows of
    that side), read as the mapping ``{Part(g): (left rows, right rows)}`` the checkpoint
    format pickles per key group. It travels (a move, a lazy pull) as those two frames: a
    frame per group cost milliseconds each to pickle and unpickle, most of a move's time."""

    __slots__ = ("groups", "sides", "bounds")

    def __init__(self, groups: np.ndarray, sides: list) -> None:
        self.groups, self.sides = groups, sides      # sides: (row groups, frame) or None each
        self.bounds = [None if s is None else (np.searchsorted(s[0], groups, "left"),
                                               np.searchsorted(s[0], groups, "right")) for s in sides]

    def __getstate__(self):
        return self.groups, self.sides

    def __setstate__(self, state) -> None:
        self.__init__(*state)

    def __getitem__(self, part: Part) -> tuple:
        n = int(np.searchsorted(self.groups, part.group))
        if n == len(self.groups) or self.groups[n] != part.group:
            raise KeyError(part)
        return tuple(None if s is None or b[0][n] == b[1][n] else s[1].iloc[b[0][n]:b[1][n]]
                     for s, b in zip(self.sides, self.bounds))

    def __iter__(self):
        return (Part(g) for g in self.groups.tolist())

    def __len__(self) -> int:
        return len(self.groups)


def _side_rows(states, groups: list, side: int):
    """``(frame, key group per row)`` of ``side``'s rows in a blob's ``states`` (None: none)."""
    if isinstance(states, GroupRows):
        s = states.sides[side]
        return (s[1], s[0]) if s is not None and len(s[1]) else None
    frames = [(rows[side], g) for rows, g in zip(states.values(), groups)
              if rows[side] is not None and len(rows[side])]
    if not frames:
        return None
    return (pd.concat([f for f, _ in frames], ignore_index=True),
            np.repeat(np.array([g for _, g in frames], np.int64), [len(f) for f, _ in frames]))


class JoinState(StateStore):
    """Rows of both sides of a join instance. ``join``: the stage's ``join`` (how,
    between, ttl in ns, key_names, suffixes); ``where(joined) -> mask``: the pairs kept
    (and counted as matches)."""

    def __init__(self, operator: str, join: dict, key_groups: int, where=None) -> None:
        self.operator, self.groups, self.where = operator, key_groups, where
        self.how, self.between, self.ttl = join["how"], join["between"], join["ttl"]
        self.key_names = list(join["key_names"])
        self.key_name = self.key_names[0]
        self.suffixes = tuple(join["suffixes"])
        self.sides: list[list[_Chunk]] = [[], []]
        self.schema: list = [None, None]        # each side's columns, as an empty frame
        self.watermark = MIN_TIME
        # key groups moving in a migration judge rows, and drop them, by the watermark they
        # had when the move began (as window state does): rows a new owner held back until
        # the state came are not late by a watermark that rose meanwhile
        self.frozen = np.full(key_groups, MAX_TIME, np.int64)
        self.holds: dict[int, np.ndarray] = {}
        self.released = False

    def hold(self, epoch: int, groups) -> None:
        groups = np.asarray(list(groups), np.int64)
        if len(groups):
            self.holds[epoch] = groups
            self.frozen[groups] = np.minimum(self.frozen[groups], self.watermark)

    def unhold(self, epoch: int) -> None:
        """The move is done here; its groups keep their watermark until the next one comes
        (a new owner applies the rows it held back right after)."""
        if self.holds.pop(epoch, None) is not None:
            self.released = True

    def end(self) -> None:
        """The instance finishes: nothing moves any more; every row goes by the watermark."""
        self.holds.clear()
        self.frozen[:] = MAX_TIME
        self.released = False

    def _thaw(self) -> None:
        """A watermark came after a move ended: its groups go by the watermark again."""
        if self.released:
            self.released = False
            keep = np.zeros(self.groups, bool)
            for gs in self.holds.values():
                keep[gs] = True
            self.frozen[~keep] = MAX_TIME

    def _marks(self, groups: np.ndarray) -> np.ndarray:
        """The watermark each row's key group goes by."""
        return np.minimum(self.frozen[groups], self.watermark)

    # -- data ---------------------------------------------------------------------------------
    def late(self, side: int, times: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Rows of ``side`` behind the watermark, past any match: interval joins take no row
        behind the watermark, regular joins with ``ttl`` none older than it behind it."""
        if self.between is None and self.ttl is None or self.watermark == MIN_TIME:
            return np.zeros(len(times), bool)
        marks = self._marks(np.asarray(groups, np.int64))
        return times < marks if self.between is not None else times + self.ttl < marks

    def update(self, frame: pd.DataFrame, groups=None, times=None, side: int = 0):
        """Join the rows of ``side`` (without the side column) with the other side's rows
        held here, then keep them. Returns the joined rows (pandas.merge's columns) that
        ``where`` keeps, or None."""
        keys = frame[self.key_names[side]].to_numpy()
        if groups is None:
            groups = assign_to_key_group(keys, self.groups, name=self.key_names[side])
        groups = np.asarray(groups, np.int64)
        times = np.zeros(len(frame), np.int64) if times is None else np.asarray(times, np.int64)
        if self.schema[side] is None:
            self.schema[side] = frame.iloc[:0]
        h = stable_hash(keys, name=self.key_names[side])
        found = []
        for c in self.sides[1 - side]:
            i, j = self._matches(c, h, keys, times, side)
            if len(i):
                found.append((c, i, j))
        new_matched = np.zeros(len(frame), bool)
        out = None
        if found:
            mine = np.concatenate([i for _, i, _ in found])
            new = frame.take(mine).reset_index(drop=True)
            old = pd.concat([c.frame.take(j) for c, _, j in found], ignore_index=True)
            out = self.merged(*((new, old) if side == 0 else (old, new)))
            keep = np.ones(len(out), bool) if self.where is None else self.where(out)
            at = 0
            for c, i, j in found:
                c.m[j[keep[at:at + len(j)]]] = True
                at += len(j)
            new_matched[mine[keep]] = True
            out = out[keep].reset_index(drop=True) if not keep.all() else out
        self.mark_dirty(np.unique(groups))
        self._keep(side, _Chunk(frame, h, keys, times, groups, new_matched))
        return out if out is not None and len(out) else None

    def groups_of(self, side: int, rows: pd.DataFrame) -> np.ndarray:
        """Key groups of ``side``'s rows (for callers that pass none)."""
        return assign_to_key_group(rows[self.key_names[side]].to_numpy(), self.groups, name=self.key_names[side])

    def merged(self, left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        """Pairs ``left.iloc[i]``, ``right.iloc[i]`` as one frame, in the columns
        ``pandas.merge(left, right, left_on=..., right_on=..., suffixes=...)`` gives: both
        sides' columns, the key once when both sides call it the same, the other names both
        sides have with the suffixes. Built from the columns' arrays (``pandas.merge`` costs
        milliseconds a batch in its own set-up), unless a case is unusual (names the
        suffixes would make twice, a shared key of two types): then by ``pandas.merge``."""
        lk, rk = self.key_names
        right_cols = [c for c in right.columns if not (c == rk == lk)]
        both = set(left.columns).intersection(right_cols)
        sl, sr = self.suffixes
        names = ([f"{c}{sl}" if c in both else c for c in left.columns]
                 + [f"{c}{sr}" if c in both else c for c in right_cols])
        if (len(set(names)) < len(names) or not left.columns.is_unique or not right.columns.is_unique
                or (lk == rk and left[lk].dtype != right[rk].dtype)):
            return self._merged_by_pandas(left, right)
        arrays = [left[c]._values for c in left.columns] + [right[c]._values for c in right_cols]
        return pd.DataFrame(dict(zip(names, arrays)), index=pd.RangeIndex(len(left)), copy=False)

    def _merged_by_pandas(self, left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        lk, rk = self.key_names
        n = np.arange(len(left))
        out = pd.merge(left.assign(**{_P: n}), right.assign(**{_P: n}), left_on=[lk, _P], right_on=[rk, _P],
                       suffixes=self.suffixes, sort=False)
        return out.drop(columns=[_P])

    def unmatched(self, side: int, rows: pd.DataFrame) -> pd.DataFrame:
        """Rows of ``side`` that never matched, with nulls in the other side's columns."""
        other = self.schema[1 - side]
        if other is None:
            return rows
        lk, rk = self.key_names
        left, right = (rows, other) if side == 0 else (other, rows)
        return pd.merge(left, right, how="left" if side == 0 else "right", left_on=lk, right_on=rk,
                        suffixes=self.suffixes, sort=False)

    @staticmethod
    def _equal(c: _Chunk, h, keys):
        """Pairs (i, j): key ``i`` of ``keys`` (hashes ``h``) equals row ``j``'s of chunk ``c``."""
        lo = np.searchsorted(c.h, h, "left")
        n = np.searchsorted(c.h, h, "right") - lo
        total = int(n.sum())
        if not total:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        i = np.repeat(np.arange(len(h)), n)
        starts = np.cumsum(n) - n
        j = lo[i] + (np.arange(total) - starts[i])
        ok = c.keys[j] == keys[i]
        if c.alive is not None:
            ok &= c.alive[j]
        return i[ok], j[ok]

    def _matches(self, c: _Chunk, h, keys, times, side: int):
        """Pairs (row of the batch, row of chunk ``c`` of the other side) with equal keys
        and, in an interval join, event times in the interval."""
        i, j = self._equal(c, h, keys)
        ok = np.ones(len(i), bool)
        if self.between is not None and len(i):
            lower, upper = self.between
            lt, rt = (times[i], c.t[j]) if side == 0 else (c.t[j], times[i])
            ok &= (lt + lower <= rt) & (rt <= lt + upper)
        return i[ok], j[ok]

    def _keep(self, side: int, chunk: _Chunk) -> None:
        if not len(chunk):
            return
        chunks = self.sides[side]
        chunks.append(chunk)
        while len(chunks) > 1 and (len(chunks[-2]) <= len(chunks[-1]) or len(chunks) > MAX_CHUNKS):
            chunks[-2:] = [_concat(chunks[-2:])]

    def advance(self, watermark: int) -> list:
        """The watermark rose: drop the rows no new row can match. Returns, for an outer
        join, ``(side, rows)`` of those dropped that never matched."""
        self.watermark = max(self.watermark, watermark)
        self._thaw()
        # a group moving here or away drops nothing until the move is done here, even at the
        # end of the inputs: a new owner may still hold rows back that match the rows it
        # installed (:meth:`end` lets go once the instance finishes)
        moving = np.zeros(self.groups, bool)
        for gs in self.holds.values():
            moving[gs] = True
        out = []
        for side in (0, 1):
            limit = self._limit(side)
            if limit is None:
                continue
            emit = self.how == "outer" or self.how == ("left", "right")[side]
            kept, gone = [], []
            held = bool((self.frozen < MAX_TIME).any())
            for c in self.sides[side]:
                drop = c.t < (limit if not held else self._limit(side, self._marks(c.g)))
                drop = c.there(drop & ~moving[c.g])
                if not drop.any():
                    kept.append(c)
                    continue
                self.mark_dirty(np.unique(c.g[drop]))
                if emit and (drop & ~c.m).any():
                    gone.append(c.frame[drop & ~c.m])
                if (rest := c.there(~drop)).any():
                    kept.append(c.take(np.flatnonzero(rest)))
            self.sides[side] = kept
            if gone:
                out.append((side, pd.concat(gone, ignore_index=True)))
        return out

    def _limit(self, side: int, marks=None):
        """Rows of ``side`` with an event time below this are past any match (per row, by
        ``marks``, the watermark of each row's key group, when given)."""
        if self.watermark == MIN_TIME:
            return None
        wm = self.watermark if marks is None else marks.astype(object)
        if self.between is not None:
            lower, upper = self.between
            limit = wm - upper if side == 0 else wm + lower
        elif self.ttl is not None:
            limit = wm - self.ttl
        else:
            return None
        if marks is not None:
            return np.clip(limit, MIN_TIME, MAX_TIME).astype(np.int64)
        return min(max(limit, MIN_TIME), MAX_TIME)

    # -- migration and checkpoints ------------------------------------------------------------
    def _split(self, pick, remove: bool = False) -> dict:
        """``pick(chunk) -> bool mask`` of rows to give: their blob (each side's rows in
        key-group order, as :class:`GroupRows`); ``remove``: and they leave this store."""
        per_side = []
        for side in (0, 1):
            parts, kept = [], []
            for c in self.sides[side]:
                mask = c.there(pick(c))
                if not mask.any():
                    kept.append(c)
                    continue
                parts.append(c.take(np.flatnonzero(mask)))
                if remove and (rest := c.drop(mask)) is not None:
                    kept.append(rest)
            if remove:
                self.sides[side] = kept
            if not parts:
                per_side.append(None)
                continue
            g = np.concatenate([c.g for c in parts])
            o = np.argsort(g, kind="stable")
            frame = pd.concat([c.frame for c in parts], ignore_index=True) if len(parts) > 1 else parts[0].frame
            t, m = (np.concatenate([getattr(c, a) for c in parts])[o] for a in ("t", "m"))
            frame = frame.take(o).reset_index(drop=True)
            frame[_T], frame[_M] = t, m
            per_side.append((g[o], frame))
        present = [s[0] for s in per_side if s is not None]
        groups = np.unique(np.concatenate(present)).astype(np.int64) if present else np.zeros(0, np.int64)
        return {"states": GroupRows(groups, per_side), "key_groups": groups}

    def _of_groups(self, groups):
        gs = np.asarray(sorted({int(g) for g in groups}), np.int64)
        return lambda c: np.isin(c.g, gs)

    def cut(self, groups) -> dict:
        blob = self._split(self._of_groups(groups), remove=True)
        self.mark_dirty(list(groups))
        return blob

    def snapshot(self, groups) -> dict:
        return self._split(self._of_groups(groups))

    def cut_keys(self, keys, groups=None) -> dict:
        keys = np.asarray(keys)
        if not len(keys):
            return {"states": {}, "key_groups": np.zeros(0, np.int64)}
        h = stable_hash(keys, name=self.key_name)

        def pick(c):            # the rows whose key is one of ``keys``: by hash, then exactly
            mask = np.zeros(c.size, bool)
            mask[self._equal(c, h, keys)[1]] = True
            return mask
        blob = self._split(pick, remove=True)
        self.mark_dirty(blob["key_groups"])
        return blob

    def install(self, blob: dict) -> None:
        """Take the rows of ``blob``'s key groups: each side's in one chunk (a chunk per
        group would have the side's chunks merged, and sorted, every few groups)."""
        groups = blob["key_groups"].tolist()
        self.mark_dirty(groups)
        for side in (0, 1):
            got = _side_rows(blob["states"], groups, side)
            if got is None:
                continue
            frame, g = got
            frame = frame.reset_index(drop=True)
            t, m = frame[_T].to_numpy(np.int64), frame[_M].to_numpy(bool).copy()
            frame = frame.drop(columns=[_T, _M])
            if self.schema[side] is None:
                self.schema[side] = frame.iloc[:0]
            keys = frame[self.key_names[side]].to_numpy()
            self._keep(side, _Chunk(frame, stable_hash(keys, name=self.key_names[side]), keys, t, g, m))

    def contains(self, keys, groups=None) -> np.ndarray:
        keys = np.asarray(keys)
        out = np.zeros(len(keys), bool)
        if len(keys):
            h = stable_hash(keys, name=self.key_name)
            for side in self.sides:
                for c in side:
                    out[self._equal(c, h, keys)[0]] = True
        return out

    def keys_per_group(self, groups) -> np.ndarray:
        """Rows held (both sides) of each key group of ``groups``."""
        counts = np.zeros(self.groups, np.int64)
        for side in self.sides:
            for c in side:
                counts += np.bincount(c.g if c.alive is None else c.g[c.alive], minlength=self.groups)
        return counts[np.asarray(groups, np.int64)] if len(groups) else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return sum(len(c) for side in self.sides for c in side)

    def key_kind(self) -> str | None:
        for side in self.sides:
            for c in side:
                if len(c):
                    return c.keys.dtype.kind
        return None

    def frame(self, touched=None) -> pd.DataFrame:
        """Rows held per key: ``left_rows`` and ``right_rows``, indexed by key."""
        counts = []
        for side, name in ((0, "left_rows"), (1, "right_rows")):
            keys = [k for c in self.sides[side] for k in (c.keys if c.alive is None else c.keys[c.alive]).tolist()]
            counts.append(pd.Series(keys, dtype=object).value_counts().rename(name))
        out = pd.concat(counts, axis=1).fillna(0).astype(np.int64)
        out.index.name = self.key_name
        return out.sort_index()
