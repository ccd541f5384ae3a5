"""Fused steps: the plain streamz nodes (map, filter, flatten, sinks...) run inside a stage,
and user-function errors. A sink step writes through its writer (``_sinks``)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np
import pandas as pd

from .._functions import describe
from ..exceptions import SchemaError, UserFunctionError
from .._plan._step import Step
from .._sinks import WRITERS
from ._sinks import Sinks

# pandas copies a shared column when a step writes into it (always from pandas 3): select
# may pass columns on without copying them
_COW = int(pd.__version__.split(".")[0]) >= 3 or pd.get_option("mode.copy_on_write") is True


def call_user(operator: str, step: Step, func, *args):
    """Call a user function; an exception it raises names the operator, the function and
    the record (or batch) it failed on."""
    try:
        return func(*args, *step.args, **step.kwargs)
    except Exception as exc:
        first = args[0]
        if isinstance(first, pd.DataFrame):
            rec = f"batch of {len(first)} rows starting {first.head(1).to_dict('records')}"
        else:
            rec = repr(first)[:200]
        raise UserFunctionError(
            f"operator {operator!r}: {step.kind} function {describe(func)} raised "
            f"{type(exc).__name__}: {exc} on {rec}",
            operator=operator, function=describe(func), record=rec,
        ) from exc


class StepRunner:
    """Runs a stage's fused steps on what its operator emits; ``exchange(target, x,
    emitted)`` sends a batch on to the next stage."""

    def __init__(self, operator: str, sinks: Sinks,
                 exchange: Callable[[int, object, float], Awaitable[None]],
                 observe: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> None:
        self.operator, self.sinks, self.exchange = operator, sinks, exchange
        self.observe = observe      # a source's with_watermark step (see _watermarks)

    async def run(self, steps: list[Step], x, emitted: float) -> None:
        for step in steps:
            await self._run(step, x, emitted)

    async def _run(self, step: Step, x, emitted: float) -> None:
        match step.kind:
            case "map":
                await self.run(step.children, call_user(self.operator, step, step.func, x), emitted)
            case "starmap":
                await self.run(step.children, call_user(self.operator, step, step.func, *x), emitted)
            case "filter":
                await self._filter(step, x, emitted)
            case "select":
                await self.run(step.children, self._select(step, x), emitted)
            case "flatten":
                for item in x:
                    await self.run(step.children, item, emitted)
            case "sink":
                call_user(self.operator, step, step.func, x)
            case "exchange":
                await self.exchange(step.target, x, emitted)
            case "watermark":
                x = self.observe(x)
                if len(x):
                    await self.run(step.children, x, emitted)
            case kind if kind in WRITERS:       # a sink of the seam: its writer
                self.sinks.write(step, x)

    def _select(self, step: Step, x):
        cols = list(step.args[0])
        have = getattr(x, "columns", None)
        if have is None:
            raise SchemaError(f"operator {self.operator!r}: select({cols}) takes DataFrame batches, got "
                              f"{type(x).__name__}")
        if len(have) == len(cols) and all(a == b for a, b in zip(have, cols)):
            # the source read only these (select pushed down): nothing to copy; a new frame
            # all the same, so a step writing into it leaves the batch as other branches see it
            return x.copy(deep=not _COW) if isinstance(x, pd.DataFrame) else x
        missing = [c for c in cols if c not in have]
        if missing:
            raise SchemaError(f"operator {self.operator!r}: select({cols}): column {missing[0]!r} is not in the "
                              f"batch; its columns: {', '.join(map(str, have))}")
        if _COW and isinstance(x, pd.DataFrame) and have.is_unique:     # (the planner refuses repeated columns)
            # the columns as they are, no copy (copy-on-write keeps the batch as it was if
            # a step writes into them): half of ``x[cols]``'s time, which builds an index
            return pd.DataFrame({c: x[c] for c in cols}, copy=False)
        return x[cols]

    async def _filter(self, step: Step, x, emitted: float) -> None:
        keep = call_user(self.operator, step, step.func, x)
        if isinstance(keep, (bool, np.bool_)):
            if keep:
                await self.run(step.children, x, emitted)
            return
        mask = np.asarray(keep, dtype=bool)
        if mask.shape != (len(x),):
            raise UserFunctionError(
                f"operator {self.operator!r}: filter predicate {describe(step.func)} returned "
                f"{mask.shape[0] if mask.ndim else 'a scalar'} values for a batch of {len(x)} rows; "
                "return one bool per row or one bool for the batch",
                operator=self.operator, function=describe(step.func),
            )
        await self.run(step.children, x[mask], emitted)
