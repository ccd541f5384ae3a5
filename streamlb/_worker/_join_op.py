"""The join operator: ``a.key_by(...).join(b.key_by(...), ...)`` (interval and regular joins).

Each batch comes from one side (its sender's input slot says which: :meth:`arrive` marks it
in a column, so rows held while their key group moves keep it). Rows behind the watermark,
past any match, go to the late stream (or the dead letters, reason ``"late"``); the others
are joined with the other side's rows held here, and kept (:class:`JoinState`). A rising
watermark drops rows no new row can match, and emits, for outer joins, those never matched.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from .._state._joins import SIDE
from .._time import nulls, to_ns
from ..exceptions import SchemaError
from .._plan._model import SENDERS
from ._operators import OnEventTime

SIDES = ("left", "right")


def _without_side(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` without the side column (a shallow copy: cheaper than ``drop`` per batch)."""
    rows = rows.copy(deep=False)
    del rows[SIDE]
    return rows


def side_of(stage, sender: int) -> int:
    """The side (0 left, 1 right) of what ``sender`` sends to ``stage``."""
    return stage.sides[sender // SENDERS]


class JoinOperator(OnEventTime):
    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        j = self.stage.join
        self.columns, self.units = j["columns"], j["units"]

    def arrive(self, frame: pd.DataFrame, sender: int) -> pd.DataFrame:
        return frame.assign(**{SIDE: np.int8(side_of(self.stage, sender))})

    def _times(self, side: int, rows: pd.DataFrame):
        """Event times (ns) of ``side``'s rows, and the rows without one (None: none)."""
        col = self.columns[side]
        if col is None:
            return None, None
        if col not in rows.columns:
            raise SchemaError(f"join {self.stage.name!r}: the {SIDES[side]} side's event-time column {col!r} is "
                              f"not in the batch; columns: {', '.join(map(str, rows.columns))}")
        bad = nulls(rows[col])
        ok = rows if bad is None else rows[~bad]
        return to_ns(ok[col], self.units[side], f"join {self.stage.name!r}"), bad

    async def on_batch(self, frame: pd.DataFrame, groups, emitted: float) -> None:
        ctx, store = self.ctx, self.store
        n = len(frame)
        ctx.meter.blocked = 0.0
        t1 = time.perf_counter()
        outs = []
        sides = frame[SIDE].to_numpy()
        for side in (0, 1):
            mine = sides == side
            if not mine.any():
                continue
            rows = _without_side(frame if mine.all() else frame[mine])
            g = None if groups is None else np.asarray(groups)[mine]
            times, bad = self._times(side, rows)
            if bad is not None:
                col = self.columns[side]
                ctx.dead.add(self.stage.name, rows[bad], [f"event time {col!r} is null"] * int(bad.sum()))
                rows, g = rows[~bad], (g[~bad] if g is not None else None)
            if times is not None:
                late = store.late(side, times, g if g is not None else store.groups_of(side, rows))
                if late.any():
                    await self._late(rows[late].assign(side=SIDES[side]), emitted)
                    rows, times = rows[~late], times[~late]
                    g = g[~late] if g is not None else None
            if len(rows):
                out = store.update(rows.reset_index(drop=True), g, times, side=side)
                if out is not None:
                    outs.append(out)
        applied = time.time()
        for out in outs:
            await ctx.steps.run(self.stage.children, out, emitted)
        ctx.meter.account(n, time.perf_counter() - t1 - ctx.meter.blocked, (applied - emitted) * 1e3)

    async def on_watermark(self, watermark: int, made_at: float) -> None:
        for side, rows in self.store.advance(watermark):
            if self.stage.children:
                await self.ctx.steps.run(self.stage.children, self.store.unmatched(side, rows), made_at)

    async def _late(self, rows: pd.DataFrame, emitted: float) -> None:
        self.ctx.meter.late(len(rows))
        rows = rows.assign(watermark=pd.Timestamp(self.store.watermark) if self.units[0] is None
                           else self.store.watermark)
        if self.stage.late:
            await self.ctx.steps.run(self.stage.late, rows.reset_index(drop=True), emitted)
        else:
            self.ctx.dead.add(self.stage.name, rows, ["late"] * len(rows))
