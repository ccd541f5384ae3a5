"""``sink_to_list`` (and ``.sink(L.append)``): outputs for a list of the driver.

The instance keeps what the step emits until the driver takes it: at each poll of a job
without checkpoints, else with the outputs of the next checkpoint barrier (committed, that
is appended to the user's list, once that checkpoint is complete)."""
from __future__ import annotations

from ._base import Committer, SinkWriter


class ListWriter(SinkWriter):
    """The items of list sink ``step.target`` (the sink's id in the plan) in one instance."""

    kind = "list_sink"
    segment = report = "lists"

    def __init__(self, step, ctx) -> None:
        super().__init__(step, ctx)
        self.items: list = []

    def write(self, x) -> None:
        self.items.append(x)

    def _take(self) -> dict | None:
        if not self.items:
            return None
        out, self.items = self.items, []
        return {self.step.target: out}

    def seal(self, cid: int) -> dict | None:
        return self._take()

    def poll(self) -> dict | None:
        return None if self.ctx.staged else self._take()


class ListCommitter(Committer):
    """Appends each list sink's items to the user's list (``plan.list_sinks``: sink id -> list)."""

    segment = report = "lists"

    def commit(self, part) -> None:
        for sid, items in (part or {}).items():
            self.plan.list_sinks[sid].extend(items)
