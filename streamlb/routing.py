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
    """

    owners: np.ndarray = field(repr=False)
    parallelism: int
    epoch: int = 0

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
        return len(self.owners)

    def route(self, key_groups: np.ndarray) -> np.ndarray:
        """Owner instance of each key group in ``key_groups``."""
        return self.owners[key_groups]

    def key_groups_of(self, instance: int) -> np.ndarray:
        """Key groups that ``instance`` owns."""
        return np.flatnonzero(self.owners == instance)
