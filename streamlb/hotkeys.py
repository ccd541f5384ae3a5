"""Heavy hitters: the hottest keys of a stream in bounded memory. Pure, no Dask.

Routers of a job whose balancer splits hot keys (``hybrid``) keep one :class:`SpaceSaving`
summary per keyed exchange and load window, fed one batch at a time, and send its entries
with their load report.

Examples
--------
>>> import numpy as np
>>> s = SpaceSaving(capacity=2)
>>> s.add(np.array([1, 1, 1, 2, 3, 1, 2]))
>>> s.add(np.array([1, 4, 4]))
>>> s.top()          # key 4 replaced key 2: its count 4 may be 2 too high
[(1, 5, 0), (4, 4, 2)]
"""
from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["SpaceSaving"]


class SpaceSaving:
    """SpaceSaving over micro-batches: at most ``capacity`` counters.

    Each batch is counted exactly and summarised by its ``capacity`` most frequent keys (a key
    of the window's summary left out is counted as the most a left-out key can have had);
    that summary is merged into the window's as two SpaceSaving summaries merge (Agarwal
    et al., "Mergeable summaries", 2012): a key new to a full summary starts from the
    summary's smallest count, which is also its possible error, and only the ``capacity``
    largest counts are kept. With ``capacity`` well above the number of keys that can be
    hot (a key is worth splitting only past about 1/n of the load), every such key is in
    the summary, counted to within its error.

    Parameters
    ----------
    capacity : int
        Counters kept (default 64).
    """

    def __init__(self, capacity: int = 64) -> None:
        if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"SpaceSaving: capacity must be a positive integer, got {capacity!r}")
        self.capacity = int(capacity)
        self._entries: dict = {}            # key -> [count, error]

    def add(self, keys: np.ndarray) -> None:
        """Count one batch of keys."""
        if not len(keys):
            return
        vc = pd.Series(keys, copy=False).value_counts(sort=False)
        cut = 0
        if len(vc) > self.capacity:
            top = vc.nlargest(self.capacity + 1)
            cut = int(top.iloc[-1])         # a key left out had at most this many
            vc = top.iloc[: self.capacity]
        kept = set(vc.index.tolist()) if cut else ()
        self.merge(vc.index.tolist(), vc.to_numpy().tolist())
        if cut:
            # keys of the summary left out of this batch's top: count them as if they had
            # ``cut`` rows, with that much error, so counts never fall short
            for k, e in self._entries.items():
                if k not in kept:
                    e[0] += cut
                    e[1] += cut

    def merge(self, keys, counts) -> None:
        """Merge exact counts of ``keys`` into the summary."""
        e = self._entries
        floor = min(c for c, _ in e.values()) if len(e) >= self.capacity else 0
        for k, c in zip(keys, counts):
            have = e.get(k)
            if have is None:
                e[k] = [int(c) + floor, floor]
            else:
                have[0] += int(c)
        if len(e) > self.capacity:
            keep = sorted(e.items(), key=lambda kv: -kv[1][0])[: self.capacity]
            self._entries = dict(keep)

    def top(self) -> list[tuple]:
        """``(key, count, error)`` by decreasing count; the true count is in
        ``[count - error, count]``."""
        return [(k.item() if isinstance(k, np.generic) else k, c, err)
                for k, (c, err) in sorted(self._entries.items(), key=lambda kv: -kv[1][0])]

    def clear(self) -> None:
        """Start a new window."""
        self._entries = {}

    def __len__(self) -> int:
        return len(self._entries)
