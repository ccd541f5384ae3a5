"""``autoflow``: hotspot diminishing, after AutoFlow (seed 000)."""
from __future__ import annotations

import numpy as np

from streamlb.balancer import Balancer, LoadReport, Move, group_moves


class AutoFlowBalancer(Balancer):
    """While some instance is above the mean by more than ``threshold``, move the key group
    whose move from the hottest instance to the coldest lowers the larger of the two the
    most (so the maximum never rises, and falls once no other instance is as hot).

    Key groups in ``report.recently_moved`` stay put (hysteresis), and a move must cool the
    hottest instance without raising the maximum, so a group is never bounced back and
    forth by noise. Where no single move cools the hottest instance (its groups are all
    too heavy for the coldest), a swap of one of its groups with a lighter one of the
    coldest instance may. Hysteresis counts epochs, so when the plan would be stuck with
    only recently moved groups able to help, they may move after all: no plan means no
    epoch, and they would stay frozen for good.

    Parameters
    ----------
    threshold : float
        Relative excess over the mean load tolerated (default 0.02).
    max_groups : int
        At most this many key groups per plan (default 64).
    max_swaps : int
        Swaps of two groups tried per plan where no single move helps (default 8).

    Examples
    --------
    >>> import numpy as np
    >>> r = LoadReport("op", np.array([0, 0, 0, 1]), np.array([40.0, 30.0, 20.0, 10.0]), 2)
    >>> AutoFlowBalancer().plan(r)
    [Move(key_groups=(0,), from_instance=0, to_instance=1)]
    """

    name = "autoflow"

    def __init__(self, threshold: float = 0.02, max_groups: int = 64, max_swaps: int = 8) -> None:
        if threshold < 0:
            raise ValueError(f"autoflow: threshold must be >= 0, got {threshold!r}")
        if max_groups < 1:
            raise ValueError(f"autoflow: max_groups must be >= 1, got {max_groups!r}")
        if max_swaps < 0:
            raise ValueError(f"autoflow: max_swaps must be >= 0, got {max_swaps!r}")
        self.threshold = threshold
        self.max_groups = max_groups
        self.max_swaps = max_swaps

    def plan(self, report: LoadReport) -> list[Move]:
        n = report.instances
        if n < 2 or report.group_load.sum() <= 0:
            return []
        frozen = np.zeros(len(report.owners), bool)
        frozen[list(report.recently_moved)] = True
        load = report.instance_load()
        owners = self._level(report.owners.copy(), report.group_load, load, frozen)
        owners = self._unstick(report, owners, report.group_load, load, np.zeros(len(owners), bool))
        return group_moves(report.owners, owners)

    def _unstick(self, report: LoadReport, owners: np.ndarray, gl: np.ndarray, load: np.ndarray,
                 pinned: np.ndarray) -> np.ndarray:
        """Still above the threshold with the groups moved last frozen: level again with
        only ``pinned`` and this plan's groups frozen (moves must still cool the hottest,
        so nothing bounces on noise)."""
        if load.max() > load.mean() * (1 + self.threshold) and report.recently_moved:
            owners = self._level(owners, gl, load, pinned | (owners != report.owners))
        return owners

    def _level(self, owners: np.ndarray, gl: np.ndarray, load: np.ndarray, frozen: np.ndarray) -> np.ndarray:
        """Moves, and where they stop, a swap, then moves again (see :meth:`_moves`)."""
        for _ in range(self.max_swaps + 1):
            owners = self._moves(owners, gl, load, frozen)
            if load.max() <= load.mean() * (1 + self.threshold) or not self._swap(owners, gl, load, frozen):
                break
        return owners

    def _moves(self, owners: np.ndarray, gl: np.ndarray, load: np.ndarray, frozen: np.ndarray) -> np.ndarray:
        """Hotspot diminishing: move groups (``gl`` their load, ``frozen`` those that stay)
        from the hottest instance to the coldest while that cools the hottest; updates
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
            # the larger of the pair after the move: it must drop below the hottest's load.
            # Another instance as hot as this one keeps the maximum where it is for now;
            # the next pass levels that one (stopping there left two hot instances hot)
            pair = np.maximum(load[hot] - gl[cand], load[cold] + gl[cand])
            best = int(np.argmin(pair))
            if pair[best] >= load[hot]:
                break                            # no single move cools the hottest instance
            g = int(cand[best])
            owners[g] = cold
            frozen[g] = True
            load[hot] -= gl[g]
            load[cold] += gl[g]
            moved += 1
        return owners

    def _swap(self, owners: np.ndarray, gl: np.ndarray, load: np.ndarray, frozen: np.ndarray) -> bool:
        """Move a group ``g`` of the hottest instance to the coldest and, in exchange,
        lighter groups of the coldest (picked largest first, adding up to about what
        evens the two out) to the hottest, when that leaves both cooler than the hottest
        was; of the hottest's heaviest groups, the exchange that evens them out best.
        False when none does (a hot instance holding two heavy groups is left so by single
        moves, and by one-for-one swaps when the coldest has no group near their
        difference)."""
        hot, cold = int(np.argmax(load)), int(np.argmin(load))
        a = np.flatnonzero((owners == hot) & ~frozen & (gl > 0))
        b = np.flatnonzero((owners == cold) & ~frozen & (gl > 0))
        if hot == cold or not len(a):
            return False
        a = a[np.argsort(-gl[a], kind="stable")][:8]
        b = b[np.argsort(-gl[b], kind="stable")]
        best, best_max = None, load[hot]
        for g in a.tolist():
            even = (load[cold] - load[hot]) / 2 + gl[g]      # back, for equal loads after
            back, total = [], 0.0
            for h in b.tolist():
                if total + gl[h] <= even:
                    back.append(h)
                    total += gl[h]
            new_max = max(load[hot] - gl[g] + total, load[cold] + gl[g] - total)
            if new_max < best_max - 1e-12:
                best, best_max = (g, back, total), new_max
        if best is None:
            return False
        g, back, total = best
        owners[g] = cold
        owners[back] = hot
        frozen[[g, *back]] = True
        load[hot] += total - gl[g]
        load[cold] += gl[g] - total
        return True
