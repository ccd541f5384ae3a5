"""The process operator: ``key_by(...).process(func, on_timer=...)``, a keyed function with
state and event-time timers (:class:`~streamlb._state._process.ProcessState`).

``func(key, rows, ctx)`` runs once per key per batch, in the order of each key's first row;
timers fire when the watermark passes them (before it is forwarded), in time order. What
either returns is emitted (the key column added when missing): a DataFrame, or a dict for
one row (the rows of all the calls of a batch or a watermark become one frame).
"""
from __future__ import annotations

import time

import pandas as pd

from .._functions import describe
from ..exceptions import UserFunctionError
from ._operators import OnEventTime


class ProcessOperator(OnEventTime):
    def _call(self, what: str, func, key, arg, ctx, outs: list, rows: list) -> None:
        """Call ``func`` for ``key``; what it returns goes to ``outs`` (frames) or ``rows``
        (a dict is one row: thousands of keys firing at once make one frame, not thousands)."""
        try:
            out = func(key, arg, ctx)
        except Exception as exc:
            raise UserFunctionError(
                f"process {self.stage.name!r}: {what} {describe(func)} raised {type(exc).__name__}: {exc} "
                f"on key {key!r}", operator=self.stage.name, function=describe(func), record=repr(key)) from exc
        if out is None:
            return
        name = self.stage.key_name
        if isinstance(out, dict):
            rows.append(out if name in out else {name: key, **out})
            return
        if not isinstance(out, pd.DataFrame):
            raise UserFunctionError(
                f"process {self.stage.name!r}: {what} {describe(func)} returned {type(out).__name__} for key "
                f"{key!r}; return a pandas DataFrame, a dict (one row) or None", operator=self.stage.name,
                function=describe(func), record=repr(key))
        if len(out) and name not in out.columns:
            out = out.reset_index(drop=True)
            out.insert(0, name, [key] * len(out))
        if len(out):
            outs.append(out)

    async def on_batch(self, frame: pd.DataFrame, groups, emitted: float) -> None:
        ctx, store = self.ctx, self.store
        n = len(frame)
        ctx.meter.blocked = 0.0
        t1 = time.perf_counter()
        outs, dicts = [], []
        try:
            for key, g, rows in store.update(frame, groups):      # one view of the batch's keys
                c = store.context(key, g)
                self._call("func", store.func, key, rows, c, outs, dicts)
                store.settle(key, g, c)
        finally:
            store.write()                   # one write; what was set before a raise stays
        applied = time.time()
        await self._emit(outs, dicts, emitted)
        ctx.meter.account(n, time.perf_counter() - t1 - ctx.meter.blocked, (applied - emitted) * 1e3)

    async def on_watermark(self, watermark: int, made_at: float) -> None:
        store, outs, dicts = self.store, [], []
        try:
            for t, key in store.due(watermark):                  # one view of the due keys
                g = store.due_groups[key]
                c = store.context(key, g)
                if store.on_timer is not None:
                    self._call("on_timer", store.on_timer, key, store.from_ns(t), c, outs, dicts)
                store.settle(key, g, c)
        finally:
            store.write()
        await self._emit(outs, dicts, made_at)

    async def _emit(self, outs: list, dicts: list, emitted: float) -> None:
        if dicts:
            outs.append(pd.DataFrame.from_records(dicts))
        if outs and self.stage.children:
            out = pd.concat(outs, ignore_index=True) if len(outs) > 1 else outs[0].reset_index(drop=True)
            await self.ctx.steps.run(self.stage.children, out, emitted)
