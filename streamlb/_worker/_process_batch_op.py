"""The batch-at-a-time process operator: ``key_by(...).process(func, on_timer=..., batch=True)``,
a keyed function called once per batch with a table of its keys' state
(:class:`~streamlb._state._process_table.TableState`).

``func(rows, state, ctx)`` gets the whole batch and the state rows of its keys (those that
have state, indexed by key, in order of first appearance); ``on_timer(due, state, ctx)``
gets every timer a watermark passed (columns: the key, ``time``; in time order) and the
state of their keys. Through ``ctx`` they set state (``put``), drop it (``forget``) and set
or cancel timers, for the keys of the call only (the others may live on another instance).
What they return (a DataFrame or None) is emitted.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from .._functions import describe
from .._time import MIN_TIME
from ..exceptions import UserFunctionError
from ._operators import OnEventTime


class BatchContext:
    """What a batch ``process`` function may do to the keys of its call (``ctx.keys``)."""

    __slots__ = ("_store", "_op", "keys", "_groups")

    def __init__(self, store, op: str, keys: np.ndarray, groups: np.ndarray) -> None:
        self._store, self._op = store, op
        self.keys = pd.Index(keys, name=store.key_name)
        self._groups = groups

    @property
    def watermark(self):
        """The operator's watermark, in the event-time column's type (None before the first)."""
        wm = self._store.watermark
        return None if wm == MIN_TIME else self._store.from_ns(np.array([wm], np.int64))[0]

    def _own(self, keys, what: str) -> tuple[np.ndarray, np.ndarray]:
        """``keys`` as an array and their key groups; refused unless all are the call's."""
        keys = np.asarray(keys.index if isinstance(keys, pd.DataFrame) else keys)
        if keys.ndim == 0:
            keys = keys.reshape(1)
        pos = self.keys.get_indexer(keys) if len(keys) else np.zeros(0, np.int64)
        if (pos < 0).any():
            bad = keys[pos < 0][:3].tolist()
            raise ValueError(f"process {self._op!r}: ctx.{what} got keys {bad} that are not this call's "
                             f"(ctx.keys: the keys of the batch's rows, or of the due timers)")
        return keys, self._groups[pos]

    def put(self, state: pd.DataFrame) -> None:
        """Set the state of the keys in ``state``'s index to its columns (a column left out
        keeps its value)."""
        if not isinstance(state, pd.DataFrame):
            raise TypeError(f"process {self._op!r}: ctx.put takes a DataFrame indexed by key, got "
                            f"{type(state).__name__}")
        if not state.index.is_unique:
            raise ValueError(f"process {self._op!r}: ctx.put got a key twice; give one row per key")
        keys, groups = self._own(state.index.to_numpy(), "put")
        if len(keys):
            self._store.put(keys, groups, {c: state[c] for c in state.columns})

    def forget(self, keys) -> None:
        """Drop the state of ``keys`` (a DataFrame: its index); their timers stay."""
        keys, _ = self._own(keys, "forget")
        self._store.forget(keys)

    def timer(self, keys, times) -> None:
        """Call ``on_timer`` for each key once the watermark passes its time (a timestamp
        or integer in the event-time column's unit: one for all, or one per key)."""
        keys, groups = self._own(keys, "timer")
        self._store.add_timers(self._times(times, len(keys), "timer"), keys, groups)

    def cancel(self, keys, times) -> None:
        """Drop the timers of ``keys`` at ``times`` (one for all, or one per key)."""
        keys, groups = self._own(keys, "cancel")
        self._store.cancel(self._times(times, len(keys), "cancel"), keys, groups)

    def _times(self, times, n: int, what: str) -> np.ndarray:
        ns = self._store.to_ns(times, n)
        if len(ns) != n:
            raise ValueError(f"process {self._op!r}: ctx.{what} got {n} keys and {len(ns)} times; give one time "
                             f"for all, or one per key")
        return ns


class ProcessBatchOperator(OnEventTime):
    def _call(self, what: str, func, first, state: pd.DataFrame, ctx: BatchContext):
        try:
            out = func(first, state, ctx)
        except Exception as exc:
            raise UserFunctionError(
                f"process {self.stage.name!r}: {what} {describe(func)} raised {type(exc).__name__}: {exc} "
                f"on a batch of {len(first)} rows", operator=self.stage.name, function=describe(func),
                record=f"{len(ctx.keys)} keys, first {ctx.keys[:3].tolist()}") from exc
        if out is not None and not isinstance(out, pd.DataFrame):
            raise UserFunctionError(
                f"process {self.stage.name!r}: {what} {describe(func)} returned {type(out).__name__}; "
                f"return a pandas DataFrame or None", operator=self.stage.name, function=describe(func))
        return out

    async def on_batch(self, frame: pd.DataFrame, groups, emitted: float) -> None:
        ctx, store = self.ctx, self.store
        ctx.meter.blocked = 0.0
        t1 = time.perf_counter()
        keys, kgroups = store.distinct(frame[self.stage.key_name].to_numpy(), groups)
        call = BatchContext(store, self.stage.name, keys, kgroups)
        out = self._call("func", store.func, frame, store.view(keys), call)
        applied = time.time()
        await self._emit(out, emitted)
        ctx.meter.account(len(frame), time.perf_counter() - t1 - ctx.meter.blocked, (applied - emitted) * 1e3)

    async def on_watermark(self, watermark: int, made_at: float) -> None:
        store = self.store
        times, keys, groups = store.due(watermark)
        if not len(times) or store.on_timer is None:
            return
        due = pd.DataFrame({self.stage.key_name: keys, "time": store.from_ns(times)})
        keys, groups = store.distinct(keys, groups)
        call = BatchContext(store, self.stage.name, keys, groups)
        await self._emit(self._call("on_timer", store.on_timer, due, store.view(keys), call), made_at)

    async def _emit(self, out, emitted: float) -> None:
        if out is not None and len(out) and self.stage.children:
            await self.ctx.steps.run(self.stage.children, out.reset_index(drop=True), emitted)
