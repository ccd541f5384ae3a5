"""``autoflow``: hotspot diminishing, after AutoFlow (seed 000)."""
from __future__ import annotations

import numpy as np

from streamlb.balancer import Balancer, LoadReport, Move, group_moves


class AutoFlowBalancer(Balancer):
    """While some instance is above the mean by more than ``threshold``, move the key group
    whose move from the hottest instance to the coldest lowers the maximum the most.

    Key groups in ``report.recently_moved`` stay put (hysteresis), and a move must lower the
    maximum, so a group is never bounced back and forth by noise.

    Parameters
    ----------
    threshold : float
        Relative excess over the mean load tolerated (default 0.02).
    max_groups : int
        At most this many key groups per plan (default 64).

    Examples
    --------
    >>> import numpy as np
    >>> r = LoadReport("op", np.array([0, 0, 0, 1]), np.array([40.0, 30.0, 20.0, 10.0]), 2)
    >>> AutoFlowBalancer().plan(r)
    [Move(key_groups=(0,), from_instance=0, to_instance=1)]
    """

    name = "autoflow"

    def __init__(self, threshold: float = 0.02, max_groups: int = 64) -> None:
        if threshold < 0:
            raise ValueError(f"autoflow: threshold must be >= 0, got {threshold!r}")
        if max_groups < 1:
            raise ValueError(f"autoflow: max_groups must be >= 1, got {max_groups!r}")
        self.threshold = threshold
        self.max_groups = max_groups

    def plan(self, report: LoadReport) -> list[Move]:
        n = report.instances
        if n < 2 or report.group_load.sum() <= 0:
            return []
        frozen = np.zeros(len(report.owners), bool)
        frozen[list(report.recently_moved)] = True
        owners = self._level(report.owners.copy(), report.group_load, report.instance_load(), frozen)
        return group_moves(report.owners, owners)

    def _level(self, owners: np.ndarray, gl: np.ndarray, load: np.ndarray, frozen: np.ndarray) -> np.ndarray:
        """Hotspot diminishing: move groups (``gl`` their load, ``frozen`` those that stay)
        from the hottest instance to the coldest while that lowers the maximum; updates
        ``owners``, ``load`` and ``frozen`` in place and returns ``owners``."""
        mean = load.mean()
        moved = 0
        while moved < self.max_groups:
            hot = int(np.argmax(load))          # argmax/argmin: lowest index wins ties
            cold = int(np.argmin(load))
            if load[hot] <= mean * (1 + self.threshold) or hot == cold:
                break
            cand = np.flatnonzero((owners == hot) & ~frozen & (gl > 0))
            if not len(cand):
                break
            others = np.delete(load, [hot, cold]).max(initial=0.0)
            new_max = np.maximum(np.maximum(load[hot] - gl[cand], load[cold] + gl[cand]), others)
            best = int(np.argmin(new_max))
            if new_max[best] >= load[hot]:
                break                            # no single move lowers the maximum
            g = int(cand[best])
            owners[g] = cold
            frozen[g] = True
            load[hot] -= gl[g]
            load[cold] += gl[g]
            moved += 1
        return owners
