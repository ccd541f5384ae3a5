"""Dead letters: records set aside instead of failing the job, with the reason.

Every instance has one :class:`DeadLetters` writer (the operators, exchanges and sources
add to it, not a plan step); the driver takes its rows like a list sink's items: at each
poll of a job without checkpoints, else with the outputs of the next checkpoint barrier,
into :attr:`streamlb.Job.dead_letters` once that checkpoint is complete."""
from __future__ import annotations

import pandas as pd

from ._base import Committer, SinkContext, SinkWriter


class DeadLetters(SinkWriter):
    """Records set aside in instance ``index``, until the driver takes them."""

    kind = "dead_letters"
    segment = "dead"
    report = "dead_letters"

    def __init__(self, index: int, ctx: SinkContext | None = None) -> None:
        super().__init__(None, ctx or SinkContext("", -1, index))
        self.index = index
        self._rows: list[dict] = []
        self.counts: dict[str, int] = {}    # operator -> records set aside here so far

    def add(self, operator: str, rows: pd.DataFrame, reasons: list[str]) -> None:
        self.counts[operator] = self.counts.get(operator, 0) + len(rows)
        for rec, why in zip(rows.to_dict("records"), reasons):
            self._rows.append({"operator": operator, "instance": self.index, "reason": why, "record": rec})

    def write(self, x) -> None:
        """``x``: ``(operator, rows, reasons)``, as :meth:`add` takes them."""
        self.add(*x)

    def take(self) -> list[dict]:
        out, self._rows = self._rows, []
        return out

    def seal(self, cid: int) -> list[dict]:
        return self.take()

    def poll(self) -> list[dict]:
        return [] if self.ctx.staged else self.take()


class DeadCommitter(Committer):
    """Adds the dead letters to the job's (``dead``: the list :attr:`streamlb.Job.dead_letters` reads)."""

    segment = "dead"
    report = "dead_letters"

    def commit(self, part) -> None:
        self.dead.extend(part or ())
