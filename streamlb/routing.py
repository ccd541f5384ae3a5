"""Routing tables: key group → instance, versioned by epoch. Pure, no Dask."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .keygroups import check_key_groups, key_group_range_for_instance

__all__ = ["RoutingTable"]


@dataclass(frozen=True)
class RoutingTable:
    """Which instance owns each key group, in a given epoch.

    Examples
    --------
    >>> t = RoutingTable.initial(key_groups=8, parallelism=2)
    >>> t.owners.tolist(), t.epoch
    ([0, 0, 0, 0, 1, 1, 1, 1], 0)
    >>> t.route(np.array([0, 5, 7])).tolist()
    [0, 1, 1]

    A split key's rows are spread over its home (the owner of its key group) and helpers:

    >>> s = RoutingTable(t.owners, 2, 1, splits=((7, (1,)),))
    >>> seen = {}
    >>> dest, partial = s.spread(np.array([7, 3, 7, 7]), np.array([0, 5, 0, 0]), seen)
    >>> dest.tolist(), partial.tolist(), seen
    ([0, 1, 1, 0], [False, False, True, False], {7: 3})
    """

    owners: np.ndarray = field(repr=False)
    parallelism: int
    epoch: int = 0
    #: ``((key, (helper, ...)), ...)``: hot keys of a combinable aggregate whose rows are
    #: spread over their home instance and these helpers (see docs/splitting.md)
    splits: tuple = ()

    def __post_init__(self) -> None:
        owners = np.asarray(self.owners, dtype=np.int64)
        check_key_groups(len(owners))
        if len(owners) and (owners.min() < 0 or owners.max() >= self.parallelism):
            bad = int(owners[(owners < 0) | (owners >= self.parallelism)][0])
            raise ValueError(
                f"routing table names instance {bad}; valid instances are "
                f"0..{self.parallelism - 1}"
            )
        owners.setflags(write=False)
        object.__setattr__(self, "owners", owners)
        splits = []
        for key, helpers in self.splits:
            helpers = tuple(int(h) for h in helpers)
            bad = [h for h in helpers if not 0 <= h < self.parallelism]
            if bad or len(set(helpers)) != len(helpers) or not helpers:
                raise ValueError(
                    f"split key {key!r}: helpers {helpers} must be distinct instances in "
                    f"0..{self.parallelism - 1}, at least one"
                )
            splits.append((_plain(key), helpers))
        object.__setattr__(self, "splits", tuple(splits))

    @classmethod
    def initial(cls, key_groups: int, parallelism: int) -> RoutingTable:
        """Contiguous ranges of key groups per instance, epoch 0."""
        owners = np.empty(key_groups, dtype=np.int64)
        for i in range(parallelism):
            owners[key_group_range_for_instance(i, key_groups, parallelism).start:
                   key_group_range_for_instance(i, key_groups, parallelism).stop] = i
        return cls(owners, parallelism, 0)

    @property
    def key_groups(self) -> int:
        """The number of key groups G."""
        return len(self.owners)

    def route(self, key_groups: np.ndarray) -> np.ndarray:
        """Owner instance of each key group in ``key_groups``."""
        return self.owners[key_groups]

    def key_groups_of(self, instance: int) -> np.ndarray:
        """Key groups that ``instance`` owns."""
        return np.flatnonzero(self.owners == instance)

    def split_map(self) -> dict:
        """Split key -> its helpers."""
        return dict(self.splits)

    def spread(self, keys: np.ndarray, groups: np.ndarray, seen: dict) -> tuple[np.ndarray, np.ndarray]:
        """Destination of each row, and which rows go to a helper as partial records.

        The rows of a split key go in turn to its home and each helper, continuing from
        ``seen[key]``, the rows of that key this router spread before (updated here), so a
        key with one row per batch still spreads evenly.
        """
        dest = self.owners[groups]
        partial = np.zeros(len(dest), bool)
        if not self.splits or not len(keys):
            return dest, partial
        import pandas as pd

        try:
            which = pd.Index([k for k, _ in self.splits]).get_indexer(keys)
        except (TypeError, ValueError):
            return dest, partial        # keys of another type: none is split
        rows = np.flatnonzero(which >= 0)
        for j, (key, helpers) in enumerate(self.splits):
            r = rows[which[rows] == j]
            if not len(r):
                continue
            choices = np.array((int(dest[r[0]]),) + helpers, np.int64)
            start = seen.get(key, 0)
            seen[key] = start + len(r)
            pick = (start + np.arange(len(r))) % len(choices)
            dest[r] = choices[pick]
            partial[r] = pick > 0
        return dest, partial


def _plain(key):
    """A numpy scalar key as the Python value it equals (picklable, msgpack-able)."""
    return key.item() if isinstance(key, np.generic) else key
