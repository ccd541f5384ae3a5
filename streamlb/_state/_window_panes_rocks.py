"""Tumbling and hopping window aggregates in RocksDB (``state_backend="rocksdb"``).

:class:`~._window_panes.PaneWindowState`'s logic (time, firing, lateness, blobs) with its
panes in RocksDB: each open pane is a :class:`~._rocks.RocksAggregateState` on a range of
one database per instance, its keys under the pane's own 8-byte prefix (then the key group
and the key, as every RocksDB store lays them out). A pane opens as a prefix, not a
database (opening one cost 107 ms, and each would have its own memtables and block cache),
and closes as one range delete when it expires, so the files do not grow with the job.

A window fires a run of key groups at a time: each pane's rows of those groups (range
scans), merged with :func:`~._window_panes.merge_partials`, about ``PIECE_ROWS`` keys a
frame. A window of more keys than that fires as a :class:`Firing`: its frames are made one at
a time as the operator sends them on (:meth:`pieces`; the worker answers in between, and
never holds the whole window); should the store change before they are all sent (a batch, a
cut, a snapshot), what is left of them goes to disk first (:class:`Spilled`), and the panes
expire once no firing reads them.
"""
from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pandas as pd

from ._rocks import RocksAggregateState
from ._rocksdb import open_for
from ._window_panes import PaneWindowState, merge_partials

PIECE_ROWS = 1 << 18        # keys of a window per output frame, about (a key group is not split)


class Spilled:
    """A fired window's frames, on disk until sent (each read once, then removed)."""

    def __init__(self, directory: str) -> None:
        self.directory, self.n = directory, 0
        os.makedirs(directory, exist_ok=True)

    def add(self, frame: pd.DataFrame) -> None:
        with open(os.path.join(self.directory, str(self.n)), "wb") as f:
            pickle.dump(frame, f, protocol=5)
        self.n += 1

    def frames(self):
        try:
            for i in range(self.n):
                path = os.path.join(self.directory, str(i))
                with open(path, "rb") as f:
                    frame = pickle.load(f)
                os.remove(path)
                yield frame
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


class Firing:
    """A large window's frames (``frames``: a generator), made as they are read; ``settle``
    makes the rest at once, to disk, before the store changes; ``done`` is called once."""

    def __init__(self, frames, directory: str, done) -> None:
        self.gen, self.directory, self.done = frames, directory, done
        self.spill: Spilled | None = None

    def settle(self) -> None:
        if self.gen is None:
            return
        gen, self.gen = self.gen, None
        self.spill = Spilled(self.directory)
        for frame in gen:
            self.spill.add(frame)
        self.done(self)

    def drop(self) -> None:
        """Nobody reads the frames (an operator with nothing after it)."""
        if self.gen is not None:
            self.gen = None
            self.done(self)

    def frames(self):
        while self.gen is not None:
            frame = next(self.gen, None)
            if frame is None:
                if self.gen is not None:       # not settled while its last frame was out
                    self.gen = None
                    self.done(self)
                break
            yield frame
        if self.spill is not None:
            yield from self.spill.frames()


class RocksPaneWindowState(PaneWindowState):
    """Open panes of a tumbling or hopping window ``aggregate``, in RocksDB."""

    def __init__(self, operator: str, window: dict, key_name: str, key_groups: int, directory: str,
                 spec=None) -> None:
        super().__init__(operator, window, key_name, key_groups, spec=spec)
        self.db, self.path, self._closer = open_for(self, operator, directory)
        self._opened = 0            # panes opened so far: the next one's prefix
        self._spills = 0
        self._firing: list[Firing] = []     # large windows whose frames are being read
        self._expire_later = False

    def close(self) -> None:
        """Close the database and remove its files."""
        for f in list(self._firing):
            f.drop()
        self.panes.clear()
        self._closer()

    # -- a firing under way: settled before the store changes or is read whole ---------------------
    def _settle(self) -> None:
        for f in list(self._firing):
            f.settle()

    def _fired(self, f: Firing) -> None:
        self._firing.remove(f)
        if not self._firing and self._expire_later:
            self._expire_later = False
            self._expire_panes()

    def _expire_panes(self) -> None:
        if self._firing:
            self._expire_later = True       # a firing reads them still
            return
        super()._expire_panes()

    def discard(self, fired: list) -> None:
        for item in fired:
            if isinstance(item, Firing):
                item.drop()

    def update(self, frame, groups=None, times=None):
        self._settle()
        return super().update(frame, groups, times)

    def advance(self, watermark: int) -> list:
        self._settle()
        return super().advance(watermark)

    def combine(self, blob: dict) -> None:
        self._settle()
        super().combine(blob)

    def cut(self, groups) -> dict:
        self._settle()
        return super().cut(groups)

    def snapshot(self, groups) -> dict:
        self._settle()
        return super().snapshot(groups)

    def cut_keys(self, keys, groups=None) -> dict:
        self._settle()
        return super().cut_keys(keys, groups)

    def install(self, blob: dict) -> None:
        self._settle()
        super().install(blob)

    def frame(self, touched=None):
        self._settle()
        return super().frame(touched)

    def _new_state(self) -> RocksAggregateState:
        self._opened += 1
        return RocksAggregateState(self.operator, self.raw, self.key_name, self.groups, None,
                                   shared=(self.db, self._opened.to_bytes(8, "big")))

    # -- firing -------------------------------------------------------------------------------------
    def _panes_of(self, start: int, end: int) -> list:
        """``(pane state, its keys per key group)`` of the panes of ``[start, end)`` that hold keys."""
        parts = [(st, st.counts()) for p, st in self.panes.items() if start <= p < end]
        return [(st, c) for st, c in parts if c.any()]

    def _buffered(self, start: int, end: int) -> list | None:
        """``(pane state, None)`` of the panes of ``[start, end)`` that hold keys, if each
        holds them all in its buffer and together fewer than PIECE_ROWS (the window is then
        one frame, as in memory: no keys per key group counted); None otherwise."""
        parts, n = [], 0
        for p, st in self.panes.items():
            if start <= p < end:
                if st.held.any():
                    return None
                if st.buffer is not None and len(st.buffer):
                    parts.append((st, None))
                    n += len(st.buffer)
        return parts if n < PIECE_ROWS else None

    def _chunks(self, parts: list, groups: np.ndarray | None) -> list:
        """The key groups to read (those of the mask ``groups``, all if None), cut into
        runs of about PIECE_ROWS keys over the panes ``parts``: consecutive groups, each
        run one range scan a pane (the groups that hold nothing in it cost nothing)."""
        counts = sum(c for _, c in parts)
        gs = np.arange(self.groups) if groups is None else np.flatnonzero(groups)
        if not counts[gs].any():
            return []
        piece = np.cumsum(counts[gs]) // PIECE_ROWS
        chunks = np.split(gs, np.flatnonzero(np.diff(piece)) + 1)
        return [c for c in chunks if counts[c].any()]

    def _frames(self, start: int, end: int, groups: np.ndarray | None, keys=None, chunks=None, parts=None):
        """The output rows of window ``[start, end)``, a frame per run of key groups (or of
        ``keys`` alone, read by multi-gets); ``parts``: :meth:`_panes_of`, if known."""
        parts = self._panes_of(start, end) if parts is None else parts
        if not parts:
            return
        if chunks is None:
            chunks = [None] if keys is not None else self._chunks(parts, groups)
        for gs in chunks:
            arrays = [st.arrays(gs, keys) for st, _ in parts]
            arrays = [a for a in arrays if len(a[0])]
            if not arrays:
                continue
            at, raw = arrays[0] if len(arrays) == 1 else merge_partials(arrays, self.raw)
            frame = self._rows(start, end, at, self._outputs(raw))
            if frame is not None:
                yield frame

    def _window(self, start: int, end: int, groups: np.ndarray | None, keys=None,
                chunks=None, parts=None) -> pd.DataFrame | None:
        frames = list(self._frames(start, end, groups, keys, chunks, parts))
        if not frames:
            return None
        return _joined(frames)

    def _fire(self, start: int, end: int, groups: np.ndarray | None):
        """A window of at most PIECE_ROWS keys as one frame; a larger one as a
        :class:`Firing`, its frames made as they are sent on."""
        parts = self._buffered(start, end) if groups is None else None
        if parts is not None:       # each pane read whole from its buffer, as memory reads its pane
            return self._window(start, end, None, chunks=[None], parts=parts)
        parts = self._panes_of(start, end)
        chunks = self._chunks(parts, groups) if parts else []
        if not chunks:
            return None
        if len(chunks) == 1:        # every key group of the window at once
            return self._window(start, end, groups, chunks=[None] if groups is None else chunks, parts=parts)
        self._spills += 1
        f = Firing(self._frames(start, end, groups, chunks=chunks, parts=parts),
                   f"{self.path}-fired-{self._spills}", self._fired)
        self._firing.append(f)
        return f

    def pieces(self, fired: list):
        """The windows a watermark fired as one frame, as in memory (a frame per window
        cost the steps after the operator a call each: most of the job's time on the
        cluster), but a large window's (a :class:`Firing`'s) frames one at a time."""
        small = []
        for item in fired:
            if isinstance(item, Firing):
                if small:
                    yield _joined(small)
                    small = []
                yield from item.frames()
            else:
                small.append(item)
        if small:
            yield _joined(small)

    def rows(self, fired: list) -> pd.DataFrame | None:
        frames = list(self.pieces(fired))
        return _joined(frames) if frames else None


def _joined(frames: list) -> pd.DataFrame:
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
