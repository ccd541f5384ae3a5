"""The in-memory source (``Stream.from_iterable``): its items are one split.

The split ``"items"`` holds the planned items (dicts, one record each, or DataFrames, one
batch each); its position is the rows before the next one to emit. A saved position keeps
it as ``{"rows": n}``, the form checkpoints and savepoints have always had, which is also
why such a source runs as one instance.
"""
from __future__ import annotations

import pandas as pd

from ..exceptions import PipelineError
from ._base import Split, SplitReader

ITEMS = "items"


class IterableReader(SplitReader):
    """Reads ``stage.items`` in batches of ``stage.batch_size`` records.

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(name="from_iterable", items=[{"v": i} for i in range(5)],
    ...                         batch_size=2, event_time=None)
    >>> reader = IterableReader(stage, 0)
    >>> reader.add_splits(reader.splits_at({"rows": 1}))    # one row emitted already
    >>> [(b.split_id, b.frame["v"].tolist()) for b in iter(reader.poll, None)]
    [('items', [1]), ('items', [2, 3]), ('items', [4])]
    >>> reader.snapshot(), reader.idle()
    ([Split(split_id='items', position=5)], {'items'})
    """

    def __init__(self, stage, index: int) -> None:
        super().__init__(stage, index)
        self._batches = iter(())

    def splits_at(self, saved: dict) -> list[Split]:
        return [Split(ITEMS, saved.get("rows", 0))]

    def save(self, splits: list[Split]) -> dict:
        return {"rows": s.position for s in splits if s.split_id == ITEMS}

    def _open(self, split: Split) -> None:
        st = self.stage
        self._batches = _skipping(iterable_batches(st.items, st.batch_size, st.name), split.position)

    def _close(self, split_id: str) -> None:
        self._batches = iter(())

    def read(self, split_id: str) -> pd.DataFrame | None:
        return next(self._batches, None)

    def offsets(self) -> dict:
        """Nothing: ``Job.offsets()`` reports the rows read per file, and items are no file."""
        return {}


def _skipping(frames, rows: int):
    """DataFrames without their first ``rows`` rows."""
    for df in frames:
        if rows >= len(df):
            rows -= len(df)
            continue
        yield df.iloc[rows:].reset_index(drop=True) if rows else df
        rows = 0


def iterable_batches(items, batch_size: int, name: str):
    """Turn the items of ``Stream.from_iterable`` into DataFrame batches.

    >>> [len(b) for b in iterable_batches([{"v": 1}, {"v": 2}, {"v": 3}], 2, "from_iterable")]
    [2, 1]
    """
    pending: list = []
    for i, item in enumerate(items):
        if isinstance(item, pd.DataFrame):
            if pending:
                yield pd.DataFrame.from_records(pending)
                pending = []
            yield item
        elif isinstance(item, dict):
            pending.append(item)
            if len(pending) >= batch_size:
                yield pd.DataFrame.from_records(pending)
                pending = []
        else:
            raise PipelineError(
                f"{name}: item {i} is a {type(item).__name__} ({item!r:.80}); items must be "
                "dicts (one record each) or pandas DataFrames (one batch each)"
            )
    if pending:
        yield pd.DataFrame.from_records(pending)
