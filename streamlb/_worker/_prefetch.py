"""Router side of a lazy epoch: ask the old owners for the state of moving keys as their
rows leave for the new owners."""
from __future__ import annotations

import collections

import numpy as np

from .._state import KeySet
from ._messages import LazyNeed


class Prefetch:
    """As the rows of moving key groups leave for their new owners, ask the old owners for
    those keys' state, once per key, and number the requests per (old owner, new owner);
    each batch to a new owner carries the counts so far (:meth:`need`), so the new owner
    knows which requests cover its keys.

    ``old``: moving key group -> old owner; ``limit``: keys remembered as asked for before
    starting afresh (asking again for a key is harmless: the old owner has nothing left).
    """

    def __init__(self, epoch: int, old: dict, key_groups: int, new_owners, limit: int) -> None:
        self.epoch = epoch
        self.key_groups = key_groups
        self.old = np.full(key_groups, -1, np.int64)
        self.old[np.fromiter(old, np.int64, len(old))] = np.fromiter(old.values(), np.int64, len(old))
        self.new_owners = {int(o) for o in new_owners}
        self.limit = max(1, int(limit))
        self.asked = KeySet()
        self.sent: dict[tuple[int, int], int] = collections.defaultdict(int)

    def need(self, dest: int) -> LazyNeed | None:
        """What a batch to ``dest`` needs, or None if ``dest`` takes no moving group."""
        if dest not in self.new_owners:
            return None
        return LazyNeed(self.epoch, {o: n for (o, d), n in self.sent.items() if d == dest})

    def requests(self, keys: np.ndarray, groups: np.ndarray, dest: np.ndarray):
        """The key requests a batch routed to ``dest`` calls for: ``(old owner, new owner,
        keys, groups, request number)`` for the moving keys asked for the first time."""
        olds = self.old[groups]
        moving = olds >= 0
        if not moving.any():
            return []
        k, g, o, d = keys[moving], groups[moving], olds[moving], dest[moving]
        if self.asked.n > self.limit:
            # forget the keys asked so far rather than grow (and rehash) without end
            self.asked = KeySet(k.dtype, 2 * self.limit)
        n_before = self.asked.n
        slots, first = np.unique(self.asked.slots(k, g, self.key_groups, "key"), return_index=True)
        first = first[slots >= n_before]        # keys asked for the first time, once each
        if not len(first):
            return []
        k, g, o, d = k[first], g[first], o[first], d[first]
        out = []
        for src in np.unique(o).tolist():
            for to in np.unique(d[o == src]).tolist():
                sel = (o == src) & (d == to)
                self.sent[(src, to)] += 1
                out.append((src, to, k[sel], g[sel], self.sent[(src, to)]))
        return out
