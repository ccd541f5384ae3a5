"""The window operator: ``key_by(...).window(...).aggregate(...)`` or ``.apply(...)``.

Rows go into the operator's :class:`~streamlb._state._windows.WindowState` by their event
time; windows fire when the watermark passes their end (:meth:`on_watermark`), before the
watermark is forwarded. Rows too late for a window go to the operator's late stream, or to
the dead letters with reason ``"late"`` when it has none.
"""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pandas as pd

from .._state._joins import KEY, SIDE
from .._state._partials import RECORDS, records_of
from .._time import nulls, time_type, to_ns
from ._messages import Partial
from ._operators import OnEventTime


class WindowOperator(OnEventTime):
    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        w = self.stage.window
        self.column, self.unit = w["column"], w["unit"]
        self.what = f"window operator {self.stage.name!r} (event time {self.column!r})"
        self._typed = False

    def arrive(self, frame: pd.DataFrame, sender: int) -> pd.DataFrame:
        """A window join marks each batch's side (its sender's input slot)."""
        if self.stage.join is None:
            return frame
        from ._join_op import side_of

        side = side_of(self.stage, sender)
        return frame.assign(**{SIDE: np.int8(side), KEY: frame[self.stage.join["key_names"][side]]})

    def accept(self, frame: pd.DataFrame, groups):
        """Rows without an event time, and rows whose summed columns are not numbers, go to
        the dead letters."""
        col = frame.get(self.column)
        if col is None:
            from ..exceptions import SchemaError

            raise SchemaError(f"{self.what}: column {self.column!r} is not in the batch; columns: "
                              f"{', '.join(map(str, frame.columns))}")
        if RECORDS in frame.columns:        # combined by the router: numbers, every time set
            return frame, groups
        bad = nulls(col)
        if bad is not None:
            self.ctx.dead.add(self.stage.name, frame[bad], [f"event time {self.column!r} is null"] * int(bad.sum()))
            frame, groups = frame[~bad], (groups[~bad] if groups is not None else None)
        cleaned, bad, reasons = self.store.clean(frame)
        if bad is not None:
            self.ctx.dead.add(self.stage.name, frame[bad], reasons)
            cleaned, groups = cleaned[~bad], (groups[~bad] if groups is not None else None)
        return cleaned, groups

    async def on_batch(self, frame: pd.DataFrame, groups, emitted: float) -> None:
        ctx, store = self.ctx, self.store
        n = records_of(frame)
        ctx.meter.blocked = 0.0
        t1 = time.perf_counter()
        frame, groups = self.accept(frame, groups)
        late = None
        if len(frame):
            self._type(frame)
            late = store.update(frame, groups, to_ns(frame[self.column], self.unit, self.what))
        fired = store.advance(store.watermark) if (store.refire or store.wants_fire) else []
        applied = time.time()
        if late is not None:
            await self._late(late, emitted)
        await self._emit(fired, emitted)
        ctx.meter.account(n, time.perf_counter() - t1 - ctx.meter.blocked, (applied - emitted) * 1e3)

    def _type(self, frame) -> None:
        """The event-time column's type, for the window columns of the output."""
        if not self._typed:
            self.store.time_type, self._typed = time_type(frame[self.column], self.unit), True

    async def on_partials(self, partials, emitted: float) -> int:
        """Helper: the rows of split keys routed here, ``(home, rows, groups)``: late ones
        go to the late stream here, the others to their home as partial aggregates per
        key and pane. Nothing is kept here. Returns the rows taken."""
        ctx = self.ctx
        ctx.meter.blocked = 0.0
        t1 = time.perf_counter()
        n = 0
        for home, rows, groups in partials:
            rows, groups = self.accept(rows, groups)
            if not len(rows):
                continue
            self._type(rows)
            n += len(rows)
            late, blob = self.store.partial(rows, groups, to_ns(rows[self.column], self.unit, self.what))
            if blob is not None:
                ctx.tasks.spawn(ctx.send_control(home, Partial(blob, emitted)))
            if late is not None:
                await self._late(late, emitted)
        ctx.meter.account(n, time.perf_counter() - t1 - ctx.meter.blocked, (time.time() - emitted) * 1e3, split=n)
        return n

    async def on_combine(self, msg: Partial) -> None:
        """Home: merge a helper's partial aggregates (windows that fired within their
        lateness fire again)."""
        self.store.combine(msg.blob)
        if self.store.refire or self.store.wants_fire:
            await self._emit(self.store.advance(self.store.watermark), msg.emitted)

    async def on_watermark(self, watermark: int, made_at: float) -> None:
        await self._emit(self.store.advance(watermark), made_at)

    async def _emit(self, fired: list, made_at: float) -> None:
        """Rows of the windows fired by a watermark made at ``made_at`` (wall clock): it is
        their ``emitted`` time downstream (latency counts from it), also kept in the frame's
        ``attrs["watermark_made_at"]``."""
        if fired and not self.stage.children:
            self.store.discard(fired)
        elif fired:
            for i, out in enumerate(self.store.pieces(fired)):
                if i:
                    await asyncio.sleep(0)      # the worker answers between a large window's frames
                if len(out):
                    out.attrs["watermark_made_at"] = made_at
                    await self.ctx.steps.run(self.stage.children, out, made_at)

    async def _late(self, rows: pd.DataFrame, emitted: float) -> None:
        self.ctx.meter.late(len(rows))
        if SIDE in rows.columns:        # a window join's: which side each row is from
            rows = rows.assign(side=np.where(rows[SIDE].to_numpy() == 0, "left", "right")).drop(columns=[SIDE, KEY])
        if self.stage.late:
            await self.ctx.steps.run(self.stage.late, rows, emitted)
        else:
            self.ctx.dead.add(self.stage.name, rows, ["late"] * len(rows))
