"""A third-party streamlb balancer, registered through the ``streamlb.balancers`` entry point.

Each plan moves key groups from the hottest instance to the coldest, heaviest first, while a
move still lowers the hottest instance's load and leaves the coldest below it. Groups moved
in the last epochs (``report.recently_moved``) stay put.
"""
from __future__ import annotations

import numpy as np

from streamlb.balancer import Balancer, LoadReport, Move


class HottestToColdest(Balancer):
    """Move the heaviest groups of the hottest instance to the coldest one.

    Parameters
    ----------
    tolerance : float
        Plan nothing while the hottest instance is within this fraction of the mean.
    max_groups : int
        At most this many key groups per plan.
    """

    name = "hottest-to-coldest"

    def __init__(self, tolerance: float = 0.05, max_groups: int = 16) -> None:
        if tolerance < 0 or max_groups < 1:
            raise ValueError(f"hottest-to-coldest: tolerance must be >= 0 and max_groups >= 1, "
                             f"got {tolerance!r} and {max_groups!r}")
        self.tolerance = tolerance
        self.max_groups = max_groups

    def plan(self, report: LoadReport) -> list[Move]:
        load = report.instance_load()
        if report.instances < 2 or load.sum() <= 0:
            return []
        hot, cold = int(np.argmax(load)), int(np.argmin(load))
        if hot == cold or load[hot] <= (1 + self.tolerance) * load.mean():
            return []
        frozen = np.zeros(report.key_groups, bool)
        frozen[list(report.recently_moved)] = True
        mine = np.flatnonzero((report.owners == hot) & ~frozen & (report.group_load > 0))
        # heaviest first; ties by key group, so the plan is deterministic
        order = mine[np.lexsort((mine, -report.group_load[mine]))]
        hot_load, cold_load, moved = load[hot], load[cold], []
        for g in order:
            w = report.group_load[g]
            if cold_load + w >= hot_load:       # the move would not lower the maximum
                continue
            moved.append(int(g))
            hot_load, cold_load = hot_load - w, cold_load + w
            if len(moved) == self.max_groups:
                break
        return [Move(tuple(sorted(moved)), hot, cold)] if moved else []
