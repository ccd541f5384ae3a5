"""What a store that keeps one Python entry per key (``keys``: key -> entry, ``by_group``:
key group -> its keys) answers alike, and how it holds moving key groups: window state and
``process`` state."""
from __future__ import annotations

import numpy as np

from ._stateful_map import _key_array


class KeyDict:
    keys: dict
    by_group: dict
    holds: dict         # migration epoch -> the key groups it moves (out or in) here
    held: np.ndarray    # key group -> held by any epoch

    def _no_holds(self, key_groups: int) -> None:
        self.holds, self.held = {}, np.zeros(key_groups, bool)

    def hold(self, epoch: int, groups) -> None:
        """``groups`` move in ``epoch``: nothing of them fires (windows, timers) until
        :meth:`unhold`; a new owner may not have all of their state and rows yet."""
        groups = np.asarray(list(groups), np.int64)
        if len(groups):
            self.holds[epoch] = groups
            self.held[groups] = True

    def unhold(self, epoch: int) -> bool:
        """The move of ``epoch`` is done (or aborted) here; True if it held groups."""
        if self.holds.pop(epoch, None) is None:
            return False
        self.held[:] = False
        for gs in self.holds.values():
            self.held[gs] = True
        return True

    def end(self) -> None:
        """The instance finishes: no state or rows are on their way any more, so nothing
        is held (what a hold kept back fires with the end of stream)."""
        self.holds.clear()
        self.held[:] = False

    def contains(self, keys, groups=None) -> np.ndarray:
        return np.fromiter((k in self.keys for k in np.asarray(keys).tolist()), bool, len(keys))

    def keys_per_group(self, groups) -> np.ndarray:
        return np.array([len(self.by_group.get(int(g), ())) for g in groups], np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    def key_kind(self) -> str | None:
        return _key_array([next(iter(self.keys))]).dtype.kind if self.keys else None
