"""The source seam: a source is read as splits, each source instance through one reader.

A **split** is what a source is cut into for its instances to read (Flink FLIP-27): a
Parquet file, the items of ``Stream.from_iterable``, later a Kafka partition or a file
found in a growing directory. A :class:`Split` is its id plus its *position*, the next
thing to read, as a JSON value (the rows of a file read before it, an offset).

Each source instance reads its splits through one :class:`SplitReader`: the reader opens
splits at their positions, hands out the next batch tagged by its split, says how far it
has read each one, seeks and tells which splits have nothing left. It knows nothing of
pacing, replay, checkpoint barriers or what was *emitted*: those are the runtime's, the
same for every reader (:class:`streamlb._worker._sources.Source`), which also keeps the
watermark input (the largest event time emitted per split). A reader's methods run in the
source's reading thread, never on the worker's event loop, so they may block on I/O.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Split:
    """A split of a source and its position (the next thing to read, a JSON value).

    >>> Split("part-0.parquet", 4096)
    Split(split_id='part-0.parquet', position=4096)
    """

    split_id: str
    position: Any = 0


class SplitBatch(NamedTuple):
    """A batch read from one split."""

    split_id: str
    frame: pd.DataFrame


class SplitReader(ABC):
    """Reads the splits of one source instance (``stage``'s instance ``index``).

    A source module implements the five abstract methods: where its splits start
    (:meth:`splits_at`) and how their positions are saved (:meth:`save`), how one is opened
    (:meth:`_open`) and closed (:meth:`_close`), and how the next batch of one is read
    (:meth:`read`). The rest is shared: :meth:`add_splits`, :meth:`remove_splits`,
    :meth:`seek`, :meth:`poll` (the next batch of the split that should go next),
    :meth:`fetch` (the next batch of a given split), :meth:`snapshot` and :meth:`idle`.
    Positions count rows unless a reader overrides :meth:`advance`.

    A source that waits for data (``live = True``: Kafka, a watched directory) hands out an
    empty batch from :meth:`poll` when none of its open splits has rows now, and None only
    once every split ended; its splits may go idle (the watermark leaves them out). Hooks a
    source may implement: :meth:`new_splits` (splits found while running), :meth:`commit`
    (a checkpoint completed at these positions), :meth:`close`, and :attr:`dead_letters`
    (``(record, reason)`` of records it could not decode, drained by the runtime).
    """

    #: the source waits for data that is not there yet (its splits may go idle)
    live = False

    def __init__(self, stage, index: int) -> None:
        self.stage, self.index = stage, index
        self.event_time: str | None = stage.event_time      # the column batches are merged by
        self._read: dict[str, Any] = {}         # split -> position after the batches handed out
        self._ahead: dict[str, pd.DataFrame] = {}   # split -> its next batch, read ahead by poll
        self._ended: set[str] = set()           # splits read to their end
        self.dead_letters: list[tuple[dict, str]] = []

    # -- what a source implements -----------------------------------------------------------
    @abstractmethod
    def splits_at(self, saved: dict) -> list[Split]:
        """This instance's splits at the positions ``saved`` holds (a position its runtime
        saved for a checkpoint or a hand-over; ``{}``: every split from its start)."""

    @abstractmethod
    def save(self, splits: list[Split]) -> dict:
        """The fields of a saved position that hold ``splits`` (what :meth:`splits_at` reads)."""

    @abstractmethod
    def _open(self, split: Split) -> None:
        """Get ready to read ``split`` from its position."""

    @abstractmethod
    def _close(self, split_id: str) -> None:
        """Let go of split ``split_id`` (it may be opened again, at another position)."""

    @abstractmethod
    def read(self, split_id: str) -> pd.DataFrame | None:
        """The next batch of split ``split_id`` from the source itself; None at its end."""

    # -- shared -------------------------------------------------------------------------------
    def advance(self, position: Any, rows: int, frame: pd.DataFrame | None = None) -> Any:
        """The position after the first ``rows`` rows of ``frame``, a batch of a split read
        from ``position`` (rows count here; a source whose positions are not row counts,
        such as Kafka offsets, reads them off ``frame``)."""
        return position + rows

    def new_splits(self) -> list[Split]:
        """Splits of this instance that appeared since it opened its splits (none here)."""
        return []

    def commit(self, positions: dict[str, Any]) -> None:
        """A checkpoint of this instance at ``positions`` (split -> position) completed."""

    def close(self) -> None:
        """The stream ended or stopped here: let go of what the reader holds."""

    def progress(self, split_id: str) -> float:
        """How far split ``split_id`` is read, to compare splits by: :meth:`poll` reads the
        one furthest behind next (without an event-time column)."""
        return self._read[split_id]

    def add_splits(self, splits: Iterable[Split]) -> None:
        """Open ``splits``, each to be read from its position."""
        splits = list(splits)
        for s in splits:
            self._open(s)
            self._ended.discard(s.split_id)
        # one new dict: the event loop may copy the positions (offsets) meanwhile
        self._read = {**self._read, **{s.split_id: s.position for s in splits}}

    def remove_splits(self, split_ids: Iterable[str]) -> list[Split]:
        """Close splits ``split_ids``; returns them at the position of the batches handed
        out (a batch read ahead is dropped: it is read again from there)."""
        gone = [s for s in split_ids if s in self._read]
        for s in gone:
            self._close(s)
            self._ahead.pop(s, None)
            self._ended.discard(s)
        out = [Split(s, self._read[s]) for s in gone]
        self._read = {s: p for s, p in self._read.items() if s not in gone}
        return out

    def seek(self, split_id: str, position: Any) -> None:
        """Read split ``split_id`` from ``position`` on."""
        self.remove_splits([split_id])
        self.add_splits([Split(split_id, position)])

    def fetch(self, split_id: str) -> pd.DataFrame | None:
        """The next batch of split ``split_id``; None once it ended (an event-time replay
        takes every split's rows by time itself)."""
        frame = self.read(split_id)
        if frame is None:
            self._ended.add(split_id)
            return None
        if len(frame):
            self._taken(split_id, frame)
        return frame

    def poll(self) -> SplitBatch | None:
        """The next batch, tagged by its split; None once every split ended.

        With an event-time column the batch that starts earliest goes first; else the next
        batch of the split furthest behind (:meth:`progress`), so splits that cover the
        same time advance through it together (each split is still read in order).
        """
        for s in [s for s in self._read if s not in self._ahead and s not in self._ended]:
            frame = self.read(s)
            if frame is None:
                self._ended.add(s)
            elif len(frame):
                self._ahead[s] = frame
        if not self._ahead:
            return self._nothing_yet()
        if self.event_time:
            col = self.event_time
            s = min(self._ahead, key=lambda name: (event_second(self._ahead[name][col].iloc[0]), name))
        else:
            s = min(self._ahead, key=lambda name: (self.progress(name), name))
        frame = self._ahead.pop(s)
        self._taken(s, frame)
        return SplitBatch(s, frame)

    def _nothing_yet(self) -> SplitBatch | None:
        """What :meth:`poll` hands out when no split has rows: None (every split ended)
        for a bounded source; a live one returns an empty batch while splits are open."""
        return None

    def _taken(self, split_id: str, frame: pd.DataFrame) -> None:
        """``frame`` of split ``split_id`` is handed out: the split's position moves past it."""
        self._read = {**self._read, split_id: self.advance(self._read[split_id], len(frame), frame)}

    def snapshot(self) -> list[Split]:
        """Every open split at the position of the batches handed out."""
        return [Split(s, p) for s, p in self._read.items()]

    def offsets(self) -> dict[str, Any]:
        """What ``Job.offsets()`` reports of this reader: each split's position."""
        return dict(self._read)

    def idle(self) -> set[str]:
        """Splits with nothing left to hand out (for a bounded source: read to their end).
        Called on the event loop while the thread reading ahead may add to the sets: a copy
        first (one call, atomic under the GIL), or the iteration could fail."""
        return {s for s in list(self._ended) if s not in self._ahead}

    def waiting(self) -> set[str]:
        """Splits known to have rows not handed out yet: the watermark never takes them for
        idle, however long since they last emitted (none known, by default)."""
        return set()

    def total_rows(self) -> int | None:
        """Rows of this instance's splits in all, if known (``rate=`` is shared by them)."""
        return None


def event_times(col: pd.Series) -> np.ndarray:
    """An event-time column as float seconds.

    >>> event_times(pd.Series(pd.to_datetime([1.0, 2.5], unit="s"))).tolist()
    [1.0, 2.5]
    """
    arr = col.to_numpy()
    if arr.dtype.kind == "M":
        return arr.astype("datetime64[ns]").astype(np.int64) / 1e9
    return arr.astype(np.float64)


def event_second(v) -> float:
    """One event time as float seconds.

    >>> event_second(3), event_second(pd.Timestamp("1970-01-01 00:00:02"))
    (3.0, 2.0)
    """
    return pd.Timestamp(v).value / 1e9 if not isinstance(v, (int, float, np.number)) else float(v)
