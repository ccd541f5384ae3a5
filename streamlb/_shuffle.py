"""Shuffle balancing for stateless stages: ``.rebalance(balancer=...)``.

- ``round_robin``: whole batches to the instances in turn;
- ``jsq`` (join the shortest queue): each batch to the instance with the fewest batches sent
  and not yet processed;
- ``osg`` (Online Shuffle Grouping, seed 003): every instance keeps count-min sketches of
  the execution time of records by a feature (a column or a function of the batch) and
  ships them back to the routers with its acknowledgements; a router cuts each batch into
  record groups, estimates each group's cost from the merged sketches, and gives each group
  to the instance whose estimated backlog finishes first (largest groups first). Until the
  sketches have seen enough records, every record counts the same.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

SHUFFLE_BALANCERS = ("round_robin", "jsq", "osg")
DEPTH, WIDTH = 4, 1024          # count-min sketch: rows x buckets
_SEEDS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93],
                  dtype=np.uint64)


def check_shuffle(balancer: str, what: str = "rebalance") -> str:
    from .exceptions import PipelineError

    if balancer not in SHUFFLE_BALANCERS:
        raise PipelineError(f"{what}: unknown shuffle balancer {balancer!r}; valid ones are "
                            f"{', '.join(SHUFFLE_BALANCERS)}")
    return balancer


def features(frame: pd.DataFrame, feature, stage: str) -> np.ndarray:
    """The feature value of every row: a column, or ``feature(frame)``."""
    from .exceptions import PipelineError

    if isinstance(feature, str):
        if feature not in frame.columns:
            raise PipelineError(f"rebalance to {stage!r}: feature column {feature!r} is not in the batch; "
                                f"columns are {list(map(str, frame.columns))}")
        return frame[feature].to_numpy()
    out = np.asarray(feature(frame))
    if out.shape != (len(frame),):
        raise PipelineError(f"rebalance to {stage!r}: the feature function returned {out.shape} values "
                            f"for a batch of {len(frame)} rows; return one value per row")
    return out


def _buckets(values: np.ndarray) -> np.ndarray:
    """(DEPTH, n) bucket of each value in each sketch row."""
    # pandas' hash is keyed and fixed: the same in every process, for any dtype
    h = pd.util.hash_array(np.asarray(values, dtype=object) if np.asarray(values).dtype.kind == "M"
                           else np.asarray(values), categorize=False)
    with np.errstate(over="ignore"):
        mixed = (h[None, :] ^ _SEEDS[:, None]) * np.uint64(0xBF58476D1CE4E5B9)
        mixed ^= mixed >> np.uint64(31)
    return (mixed % np.uint64(WIDTH)).astype(np.intp)


class CostSketch:
    """Count-min sketches of seconds and records per feature value (instance side)."""

    def __init__(self) -> None:
        self.seconds = np.zeros((DEPTH, WIDTH))
        self.records = np.zeros((DEPTH, WIDTH))

    def add(self, values: np.ndarray, seconds: np.ndarray, counts: np.ndarray) -> None:
        """Add ``seconds`` spent on ``counts`` records of each feature value in ``values``."""
        b = _buckets(values)
        for r in range(DEPTH):
            np.add.at(self.seconds[r], b[r], seconds)
            np.add.at(self.records[r], b[r], counts)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        return self.seconds.copy(), self.records.copy()


class ShuffleRouter:
    """Router side of one round-robin exchange: picks instances for batches or record groups."""

    def __init__(self, policy: str, instances: int, feature=None, group: int = 256, min_records: int = 2000):
        self.policy = check_shuffle(policy)
        self.n = instances
        self.feature = feature
        self.group = max(1, int(group))
        self.min_records = min_records
        self.rr = 0
        self.backlog = np.zeros(instances)           # estimated seconds sent, not yet processed
        self.in_flight = np.zeros(instances, np.int64)
        self.sketches: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def resize(self, instances: int) -> None:
        """Instances were added or the last ones retired (indices stay ``0..instances-1``)."""
        n = self.n
        self.n = instances
        grow = max(instances - n, 0)
        self.backlog = np.pad(self.backlog[:instances], (0, grow))
        self.in_flight = np.pad(self.in_flight[:instances], (0, grow))
        self.sketches = {i: s for i, s in self.sketches.items() if i < instances}

    # -- feedback -------------------------------------------------------------------------------
    def done(self, instance: int, cost: float, reply) -> None:
        """A batch sent to ``instance`` was processed; ``reply`` may carry its sketches."""
        if instance >= self.n:
            return                      # retired since
        self.backlog[instance] = max(self.backlog[instance] - cost, 0.0)
        self.in_flight[instance] -= 1
        if reply is not None:
            self.sketches[instance] = reply

    def _merged(self):
        """Seconds and records summed over every instance's sketch."""
        return (sum(s for s, _ in self.sketches.values()), sum(c for _, c in self.sketches.values()))

    def _estimate(self, values: np.ndarray) -> np.ndarray | None:
        """Seconds per record for each feature value, or None while too little is known."""
        if not self.sketches:
            return None
        sec, cnt = self._merged()
        if cnt[0].sum() < self.min_records:
            return None
        mean = sec[0].sum() / cnt[0].sum()
        b = _buckets(values)
        rows = np.arange(DEPTH)[:, None]
        c, s = cnt[rows, b], sec[rows, b]
        # the row whose bucket holds the fewest records collides least: use its mean
        best = np.argmin(c, axis=0)
        cols = np.arange(len(values))
        cb, sb = c[best, cols], s[best, cols]
        return np.where(cb > 0, sb / np.maximum(cb, 1), mean)

    # -- routing ---------------------------------------------------------------------------------
    def route(self, frame: pd.DataFrame, stage: str) -> list[tuple[int, pd.DataFrame, float]]:
        """(instance, rows, estimated seconds) for each piece of ``frame`` to send."""
        n = self.n
        if self.policy == "round_robin" or n == 1:
            i = self.rr % n
            self.rr += 1
            return self._sent([(i, frame, float(len(frame)))])
        if self.policy == "jsq":
            order = (np.arange(n) + self.rr) % n          # ties go round-robin
            self.rr += 1
            i = int(order[np.argmin(self.in_flight[order])])
            return self._sent([(i, frame, float(len(frame)))])
        values = features(frame, self.feature, stage)
        per = self._estimate(values)
        if per is None:
            per = np.full(len(frame), self._unit())
        starts = np.arange(0, len(frame), self.group)
        costs = np.add.reduceat(per, starts) if len(frame) else np.zeros(0)
        finish = self.backlog.copy()
        owner = np.empty(len(starts), np.int64)
        for gi in np.argsort(-costs, kind="stable"):     # largest first onto the earliest finish
            i = int(np.argmin(finish))
            owner[gi] = i
            finish[i] += costs[gi]
        rows = np.repeat(owner, np.diff(np.append(starts, len(frame))))
        out = []
        for i in range(n):
            sel = np.flatnonzero(rows == i)
            if len(sel):
                out.append((i, frame.iloc[sel], float(per[sel].sum())))
        return self._sent(out)

    def _unit(self) -> float:
        """Cost of a record while nothing is known: the mean seen so far, else 1."""
        if self.sketches:
            sec, cnt = self._merged()
            if cnt[0].sum() > 0:
                return float(sec[0].sum() / cnt[0].sum())
        return 1.0

    def _sent(self, pieces):
        for i, _, cost in pieces:
            self.backlog[i] += cost
            self.in_flight[i] += 1
        return pieces
