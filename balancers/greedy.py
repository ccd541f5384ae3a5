"""``greedy``: re-pack all key groups longest-first, moving as little as possible."""
from __future__ import annotations

import numpy as np

from streamlb.balancer import Balancer, LoadReport, Move, group_moves


class GreedyBalancer(Balancer):
    """Longest-processing-time re-packing with minimum movement.

    Key groups are taken heaviest first. A group stays on its current owner while that keeps
    the owner within ``slack`` of the ideal share (total / n); otherwise it goes to the
    instance with the least load so far. Groups with no load never move.

    Examples
    --------
    >>> import numpy as np
    >>> r = LoadReport("op", np.array([0, 0, 0, 0]), np.array([4.0, 3.0, 2.0, 1.0]), 2)
    >>> GreedyBalancer().plan(r)
    [Move(key_groups=(1, 2), from_instance=0, to_instance=1)]
    """

    name = "greedy"

    def __init__(self, slack: float = 0.02) -> None:
        if slack < 0:
            raise ValueError(f"greedy: slack must be >= 0, got {slack!r}")
        self.slack = slack

    def plan(self, report: LoadReport) -> list[Move]:
        n = report.instances
        gl = report.group_load
        if n < 2 or gl.sum() <= 0:
            return []
        target = gl.sum() / n * (1 + self.slack)
        owners = report.owners.copy()
        load = np.zeros(n)
        order = np.lexsort((np.arange(len(gl)), -gl))   # heaviest first, then by key group
        for g in order:
            if gl[g] <= 0:
                break
            cur = owners[g]
            if load[cur] + gl[g] <= target:
                load[cur] += gl[g]
                continue
            dest = int(np.argmin(load))
            if load[dest] + gl[g] >= load[cur] + gl[g]:
                dest = cur                       # moving would not help
            owners[g] = dest
            load[dest] += gl[g]
        return group_moves(report.owners, owners)
