"""``hybrid``: move key groups where that suffices, split the keys that moving cannot balance."""
from __future__ import annotations

import math

import numpy as np

from streamlb.balancer import LoadReport, Split, apply_plan, group_moves, splits_after

from .autoflow import AutoFlowBalancer


class HybridBalancer(AutoFlowBalancer):
    """Split hot keys of combinable aggregates, then level the rest by moving key groups.

    A key whose load alone exceeds ``split_at`` × the mean instance load cannot be balanced
    by moving its key group: it is split over ``d = ceil(load / (piece × mean))``
    instances, its home and ``d - 1`` others, so each share is at most ``piece`` × the
    mean. Helpers go where the least load cannot move (shares of split keys and their
    pinned groups), then where the least load is, so shares do not pile up. A split key
    gets more helpers when its load grows, and is merged back once its load falls under
    ``merge_below`` × the mean (hysteresis: it is not split again until it passes
    ``split_at``). Then, as ``autoflow``, while some instance is above
    the mean by more than ``threshold``, the key group whose move from the hottest
    instance to the coldest cools the hottest most is moved. Groups holding a split key
    stay where they are. Where no single move helps, swapping a group of the hottest
    instance with a lighter one of the coldest may; and if the plan still leaves an
    instance above the threshold, the groups moved recently may move again (each move must
    still cool the hottest without raising the maximum). The plan lists merges, then splits, then moves: the order in
    which the plugin carries them out.

    Operators whose state is not combinable (``stateful_map``) only get moves.

    Parameters
    ----------
    threshold : float
        Relative excess over the mean tolerated before moving (default 0.05: per-window
        counts of a few hundred thousand records are that noisy, and chasing the noise only
        moves state).
    max_groups : int
        At most this many key groups moved per plan (default 64).
    split_at, piece, merge_below : float
        In units of the mean instance load (defaults 0.9, 0.8, 0.4).
    max_swaps : int
        Swaps of two groups tried per plan where no single move helps (default 8).

    Examples
    --------
    >>> import numpy as np
    >>> r = LoadReport("op", np.array([0, 0, 1, 1]), np.array([80.0, 10.0, 5.0, 5.0]), 2,
    ...                hot_keys=(("k", 0, 75.0),), splittable=True)
    >>> HybridBalancer().plan(r)
    [Split(key='k', helpers=(1,))]
    """

    name = "hybrid"
    wants_hot_keys = True

    def __init__(self, threshold: float = 0.05, max_groups: int = 64, split_at: float = 0.9,
                 piece: float = 0.8, merge_below: float = 0.4, max_swaps: int = 8) -> None:
        super().__init__(threshold, max_groups, max_swaps)
        if not 0 < merge_below < split_at or not 0 < piece <= split_at:
            raise ValueError("hybrid: need 0 < merge_below < split_at and 0 < piece <= split_at, got "
                             f"merge_below={merge_below!r}, piece={piece!r}, split_at={split_at!r}")
        self.split_at = split_at
        self.piece = piece
        self.merge_below = merge_below

    def plan(self, report: LoadReport) -> list:
        plan = self._plan(report, grow=True)
        if report.splittable and any(s.helpers for s in plan if isinstance(s, Split)):
            # a split never raises the hottest instance: where sharing a key out would (a
            # key as heavy as the mean on an instance that is not hot), plan without it
            after = report.instance_load(apply_plan(report.owners, plan), splits_after(report, plan))
            if after.max() > report.instance_load().max() * (1 + 1e-9):
                plan = self._plan(report, grow=False)
        return plan

    def _plan(self, report: LoadReport, grow: bool) -> list:
        n = report.instances
        total = float(report.group_load.sum())
        current = dict(report.splits)
        mean = total / n
        if n < 2 or not mean * self.piece > 0:      # no load (or too little for a float)
            return [Split(k) for k in current]
        owners = report.owners.copy()
        hot = {k: (g, w) for k, g, w in report.hot_keys}
        ways = self._ways(report, hot, current, mean, grow) if report.splittable else {k: 1 for k in current}
        # what each group weighs on its owner once its split keys are shared out
        gl = report.group_load.astype(np.float64).copy()
        pinned = np.zeros(len(owners), bool)
        for k, d in ways.items():
            if d > 1 and k in hot:
                g, w = hot[k]
                gl[g] -= w * (1 - 1 / d)
                pinned[g] = True
        load = np.bincount(owners, weights=gl, minlength=n)
        # load that cannot move away: split keys' groups and shares. New helpers go where
        # there is least of it (then least load), so shares do not pile up on one instance
        fixed = np.bincount(owners[pinned], weights=gl[pinned], minlength=n)
        helpers: dict = {}
        split_keys = sorted((k for k, d in ways.items() if d > 1), key=lambda k: -hot[k][1])
        for k in split_keys:
            keep = [h for h in current.get(k, ()) if h != owners[hot[k][0]]][: ways[k] - 1]
            fixed[keep] += hot[k][1] / ways[k]
            helpers[k] = keep
        for k in split_keys:
            g, w = hot[k]
            keep = helpers[k]
            while len(keep) < ways[k] - 1:
                free = np.flatnonzero(~np.isin(np.arange(n), keep + [int(owners[g])]))
                pick = int(free[np.lexsort((load[free], fixed[free]))[0]])
                keep.append(pick)
                fixed[pick] += w / ways[k]
            load[keep] += w / ways[k]
            helpers[k] = tuple(keep)
        frozen = pinned.copy()
        frozen[list(report.recently_moved)] = True
        owners = self._level(owners, gl, load, frozen)
        owners = self._unstick(report, owners, gl, load, pinned)
        merges = [Split(k) for k, d in ways.items() if d == 1 and k in current]
        splits = [Split(k, hs) for k, hs in helpers.items() if tuple(current.get(k, ())) != hs]
        return merges + splits + group_moves(report.owners, owners)

    def _ways(self, report: LoadReport, hot: dict, current: dict, mean: float, grow: bool) -> dict:
        """Instances each hot or split key is spread over (1: not split; with ``grow``
        false, no key gets more than it has)."""
        ways = {}
        for k, (g, w) in hot.items():
            now = 1 + len(current.get(k, ()))
            want = min(report.instances, max(1, math.ceil(w / (self.piece * mean))))
            if k in current:
                ways[k] = 1 if w < self.merge_below * mean else (max(now, want) if grow else now)
            elif grow and w > self.split_at * mean:
                ways[k] = want
        for k in current:
            ways.setdefault(k, 1)        # no longer among the hot keys: cooled down
        return {k: d for k, d in ways.items() if d > 1 or k in current}
