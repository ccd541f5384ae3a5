"""Operator logic: what a stage does with the rows that reach it.

One seam through which data and end of stream reach an operator (``on_batch``,
``on_end``) and state leaves it (``snapshot``): ``aggregate`` and ``stateful_map`` keep
keyed state in a :class:`streamlb._state.StateStore`; a stateless stage passes rows on,
balanced per batch (osg measures what each feature value costs here).
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from .. import _shuffle
from .._time import MAX_TIME
from ..exceptions import PipelineError
from .._state._partials import RECORDS, blob_of, records_of
from ._messages import Partial


class OperatorLogic:
    """The operator of one instance. ``ctx`` is the instance: its stage, store, steps,
    meter, cost server and dead letters."""

    stateful = False

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.stage = ctx.stage
        self.store = ctx.store

    def accept(self, frame: pd.DataFrame, groups):
        """The rows the operator takes (the rest go to the dead letters), with their groups."""
        return frame, groups

    def arrive(self, frame: pd.DataFrame, sender: int) -> pd.DataFrame:
        """A batch as it comes from ``sender``, before anything else sees it (a join marks
        which side it is from)."""
        return frame

    def output(self, frame: pd.DataFrame, groups) -> pd.DataFrame | None:
        """Apply ``frame`` (rows with their key groups) to the operator; what it emits."""
        return frame

    async def on_batch(self, frame: pd.DataFrame, groups, emitted: float) -> None:
        """Apply a batch, wait out its emulated cost, run the fused steps on what it emits
        and account it to the load window."""
        ctx = self.ctx
        n = records_of(frame)
        ctx.meter.blocked = 0.0
        t1 = time.perf_counter()
        frame, groups = self.accept(frame, groups)
        out = self.output(frame, groups)
        t1 = await ctx.cost.serve(self.cost_of(frame, n), t1, more=bool(ctx.inbox))
        applied = time.time()
        if out is not None:
            await ctx.steps.run(self.stage.children, out, emitted)
        ctx.meter.account(n, time.perf_counter() - t1 - ctx.meter.blocked, (applied - emitted) * 1e3)

    async def on_end(self) -> None:
        """Every input ended: an operator that buffers emits what it holds here."""

    async def on_watermark(self, watermark: int, made_at: float) -> None:
        """The instance's watermark rose to ``watermark`` (int64 ns; made by its source at
        wall-clock ``made_at``): an operator that waits on event time (windows) emits what
        is now final, before it is forwarded."""

    def reply(self, sender: int):
        """What the acknowledgement of a batch from ``sender`` carries back (None: nothing)."""
        return None

    def snapshot(self, groups) -> dict:
        """The state of key groups ``groups``, without removing it."""
        raise PipelineError(f"{self.stage.name!r} holds no keyed state")

    def cost_of(self, frame, n: int) -> float:
        cost = self.stage.cost
        if cost is None or not n:
            return 0.0
        if isinstance(cost, float):
            return cost * n
        try:
            return float(np.nansum(pd.to_numeric(frame[cost], errors="coerce").to_numpy(np.float64)))
        except KeyError:
            raise PipelineError(
                f"operator {self.stage.name!r}: cost column {cost!r} is not in the batch; "
                f"columns are {list(frame.columns)}"
            ) from None


class Stateless(OperatorLogic):
    """Rows pass on as they are."""


class ByFeature(OperatorLogic):
    """osg: run the stage on each feature value's rows in turn, timing each, so the
    sketches the routers read learn what a record of each value costs here."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.sketch = _shuffle.CostSketch()
        self._sent: dict[int, float] = {}

    def reply(self, sender: int):
        """Now and then, the cost sketches: what records cost here, for the router."""
        if time.time() - self._sent.get(sender, 0.0) > 0.05:
            self._sent[sender] = time.time()
            return self.sketch.snapshot()
        return None

    async def on_batch(self, frame: pd.DataFrame, groups, emitted: float) -> None:
        if not len(frame):
            await super().on_batch(frame, groups, emitted)
            return
        ctx = self.ctx
        values = _shuffle.features(frame, self.stage.shuffle["feature"], self.stage.name)
        codes, uniques = pd.factorize(values, sort=False, use_na_sentinel=False)   # NaN is a value too
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(codes, minlength=len(uniques)))))
        secs = np.zeros(len(uniques))
        for u in range(len(uniques)):
            part = frame.iloc[order[bounds[u]:bounds[u + 1]]]
            t1 = time.perf_counter()
            ctx.meter.blocked = 0.0
            t1 = await ctx.cost.serve(self.cost_of(part, len(part)), t1,
                                      more=u + 1 < len(uniques) or bool(ctx.inbox))
            applied = time.time()
            await ctx.steps.run(self.stage.children, part, emitted)
            busy = time.perf_counter() - t1 - ctx.meter.blocked
            secs[u] = busy
            ctx.meter.account(len(part), busy, (applied - emitted) * 1e3)
        self.sketch.add(uniques, secs, np.diff(bounds).astype(np.float64))


class _Keyed(OperatorLogic):
    stateful = True

    def snapshot(self, groups) -> dict:
        return self.store.snapshot(groups)


class OnEventTime(_Keyed):
    """A keyed operator whose output waits on event time (windows, joins, timers)."""

    async def on_end(self) -> None:
        """Every input ended and no state is on its way here (the instance finishes): what
        moving key groups held back goes by the watermark too, and everything fires."""
        self.store.end()
        await self.on_watermark(MAX_TIME, time.time())


class StatefulMap(_Keyed):
    """``func(state, record) -> (state, output)`` per key."""

    def output(self, frame: pd.DataFrame, groups) -> pd.DataFrame | None:
        if not self.stage.children:
            self.store.update(frame, groups, outputs=False)
            return None
        outs = self.store.update(frame, groups)
        return pd.DataFrame({self.stage.key_name: frame[self.stage.key_name].to_numpy(), "output": outs})


class Aggregate(_Keyed):
    """count / sum / min / max / mean per key; rows of split keys routed here as a helper
    are aggregated for their homes (``on_partials``) and merged there (``on_combine``)."""

    def accept(self, frame: pd.DataFrame, groups):
        """Rows whose summed columns are not numbers go to the dead letters."""
        if RECORDS in frame.columns:        # combined by the router (numbers only)
            return frame, groups
        cleaned, bad, reasons = self.store.clean(frame)
        if bad is None:
            return cleaned, groups
        self.ctx.dead.add(self.stage.name, frame[bad], reasons)
        return cleaned[~bad], (groups[~bad] if groups is not None else None)

    def output(self, frame: pd.DataFrame, groups) -> pd.DataFrame | None:
        st = self.store
        if RECORDS in frame.columns:
            if groups is None:
                groups = st._groups_of(frame[st.key_name].to_numpy())
            touched = st.combine(blob_of(frame, groups, st.key_name, st.inputs, st.dtypes))
        else:
            touched = st.update(frame, groups)
        return st.frame(touched) if self.stage.children else None

    async def on_partials(self, partials, emitted: float) -> int:
        """Helper: aggregate the rows of split keys routed here, ``(home, rows, groups)``,
        and send each home its partial aggregate. Nothing is kept here, so the key's state
        stays whole at its home, and so does what the home emits. Returns the rows taken."""
        ctx = self.ctx
        ctx.meter.blocked = 0.0
        t1 = time.perf_counter()
        n, secs = 0, 0.0
        for home, rows, groups in partials:
            rows, groups = self.accept(rows, groups)
            if len(rows):
                n += len(rows)
                secs += self.cost_of(rows, len(rows))
                ctx.tasks.spawn(ctx.send_control(home, Partial(self.store.partial(rows, groups), emitted)))
        t1 = await ctx.cost.serve(secs, t1, more=bool(ctx.inbox))
        ctx.meter.account(n, time.perf_counter() - t1 - ctx.meter.blocked, (time.time() - emitted) * 1e3, split=n)
        return n

    async def on_combine(self, msg: Partial) -> None:
        """Home: merge a helper's partial aggregate and emit the keys' whole values."""
        touched = self.store.combine(msg.blob)
        if self.stage.children:
            await self.ctx.steps.run(self.stage.children, self.store.frame(touched), msg.emitted)
