"""Window kinds as objects: what the window stores ask about time (Flink's ``WindowAssigner``).

A store holds one assigner, built once from the stage's ``window`` dict by
:func:`assigner_of`, and asks it instead of branching on the kind: the bucket a row goes
into, the windows a time or a pane falls into, when a window ends and when a pane may go.
:class:`SlidingWindows` covers tumbling (``slide == size``) and hopping windows, kept as
panes of ``gcd(size, slide)``; :class:`SessionWindows` merges (a store keeps its sessions
per key and merges them as records join). A new window kind is one class here and one entry
in :func:`assigner_of`; a store that keeps its state in another shape is chosen by
:attr:`WindowAssigner.merging` in ``_backends.make_store`` and ``WindowState``.

>>> a = assigner_of({"kind": "hopping", "size": 10, "slide": 4, "gap": None})
>>> a.pane, a.merging
(2, False)
>>> a.windows_of_pane(8)
[(8, 18), (4, 14), (0, 10)]
>>> [(s.tolist(), e.tolist(), v.tolist()) for s, e, v in a.windows_of(np.array([9]))]
[([8], [18], [True]), ([4], [14], [True]), ([0], [10], [True])]
>>> s = assigner_of({"kind": "session", "size": None, "slide": None, "gap": 5})
>>> s.merging, s.end_of(12)
(True, 17)
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np


class WindowAssigner:
    """What a window kind answers. ``pane``: the width of the buckets rows are kept in (0:
    none, a row is its own bucket); ``merging``: windows grow and merge as records join
    them (sessions), so which window a row is in is known only once merged."""

    pane: int = 0
    merging: bool = False

    def bucket(self, times: np.ndarray) -> np.ndarray:
        """The bucket of each row (ns): its pane's start, or its own time."""
        raise NotImplementedError

    def windows_of(self, times: np.ndarray) -> Iterator[tuple]:
        """``(start, end, valid)`` arrays, one triple per window a row may be in: the rows
        where ``valid`` is set are in window ``[start, end)``."""
        raise NotImplementedError


class SlidingWindows(WindowAssigner):
    """Windows of ``size`` every ``slide`` (ns): hopping, or tumbling where they are equal.
    Rows are kept in panes of ``gcd(size, slide)``; a window is the panes it spans."""

    def __init__(self, size: int, slide: int) -> None:
        self.size, self.slide = int(size), int(slide)
        self.pane = math.gcd(self.size, self.slide)
        self.per_row = -(-self.size // self.slide)      # windows a row may be in

    def bucket(self, times: np.ndarray) -> np.ndarray:
        return (times // self.pane) * self.pane

    def windows_of(self, times: np.ndarray) -> Iterator[tuple]:
        s0 = (times // self.slide) * self.slide
        for j in range(self.per_row):
            start = s0 - j * self.slide
            yield start, start + self.size, start + self.size > times

    def windows_of_pane(self, p: int) -> list[tuple[int, int]]:
        """``(start, end)`` of each window pane ``p`` is in, the latest first."""
        out, s = [], self.last_start(p)
        while s + self.size > p:
            out.append((s, s + self.size))
            s -= self.slide
        return out

    def last_start(self, p: int) -> int:
        """The start of the last window pane ``p`` is in."""
        return (p // self.slide) * self.slide

    def last_end(self, p: int) -> int:
        """The end of the last window pane ``p`` is in: past it (and lateness), it may go."""
        return self.last_start(p) + self.size

    def start_of(self, end: int) -> int:
        """The start of the window ending at ``end``."""
        return end - self.size

    def starts_near(self, panes) -> set[int]:
        """Starts of the windows that panes ``panes`` may be in."""
        return {self.last_start(p) - j * self.slide for p in panes for j in range(self.per_row)}


class TumblingWindows(SlidingWindows):
    """Windows of ``size`` back to back: a row is in one, a pane is a window."""

    def __init__(self, size: int) -> None:
        super().__init__(size, size)


class HoppingWindows(SlidingWindows):
    """Windows of ``size`` every ``slide`` (``slide < size``): a row is in about
    ``size / slide`` of them."""


class SessionWindows(WindowAssigner):
    """Sessions per key: records whose event times differ by at most ``gap`` share one,
    which ends ``gap`` after its last record. A row's own window is ``[t, t + gap)``."""

    merging = True

    def __init__(self, gap: int) -> None:
        self.gap = int(gap)

    def bucket(self, times: np.ndarray) -> np.ndarray:
        return times

    def windows_of(self, times: np.ndarray) -> Iterator[tuple]:
        yield times, times + self.gap, True

    def end_of(self, last):
        """The end of a session whose last record is at ``last`` (scalar or array)."""
        return last + self.gap


def assigner_of(window: dict) -> WindowAssigner:
    """The assigner of a stage's ``window`` (``kind``, ``size``, ``slide``, ``gap`` in ns):
    the one place that reads the kind."""
    kind = window["kind"]
    if kind == "session":
        return SessionWindows(window["gap"])
    if kind == "tumbling" or window["slide"] == window["size"]:
        return TumblingWindows(window["size"])
    if kind == "hopping":
        return HoppingWindows(window["size"], window["slide"])
    raise ValueError(f"unknown window kind {kind!r}; valid kinds: tumbling, hopping, session")


__all__ = ["WindowAssigner", "SlidingWindows", "TumblingWindows", "HoppingWindows", "SessionWindows", "assigner_of"]
