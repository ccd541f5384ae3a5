"""The Parquet source (``Stream.from_parquet``): one split per file.

A split's id is the file's absolute path as planned on the driver (``stage.assignment[index]``
lists the files of instance ``index``), so a worker whose working directory is not the
driver's opens the same file; its position is the rows of the file before the next one to
read. A saved position keeps them as ``{"files": {name: rows}}``, each file named by
:func:`file_key`, its path relative to the source's root (``stage.source["path"]``): a
checkpoint then finds its files again whatever the working directory, whether the root is
given as a relative or an absolute path, and after the directory moved.
"""
from __future__ import annotations

import os

import pandas as pd

from ._base import Split, SplitReader


class ParquetReader(SplitReader):
    """Reads the Parquet files of one source instance, ``stage.batch_size`` rows at a time
    (only ``stage.columns``, if given), every owned file at once, like a consumer of several
    log partitions (see :meth:`SplitReader.poll` for which goes next)."""

    def __init__(self, stage, index: int) -> None:
        super().__init__(stage, index)
        self._batches: dict = {}            # split -> its record batches from the position on
        self._rows: dict[str, int] = {}     # split -> rows of its file (at least 1)

    def splits_at(self, saved: dict) -> list[Split]:
        files = saved.get("files") or {}
        root = self.stage.source["path"]
        return [Split(f, files.get(file_key(root, f), 0)) for f in self.stage.assignment[self.index]]

    def save(self, splits: list[Split]) -> dict:
        root = self.stage.source["path"]
        return {"files": {file_key(root, s.split_id): s.position for s in splits}}

    def _open(self, split: Split) -> None:
        import pyarrow.parquet as pq

        st = self.stage
        pf = pq.ParquetFile(split.split_id)
        self._rows[split.split_id] = max(pf.metadata.num_rows, 1)
        self._batches[split.split_id] = _skipping(
            pf.iter_batches(batch_size=st.batch_size, columns=st.columns, use_threads=False), split.position)

    def _close(self, split_id: str) -> None:
        self._batches.pop(split_id, None)
        self._rows.pop(split_id, None)

    def read(self, split_id: str) -> pd.DataFrame | None:
        rb = next(self._batches[split_id], None)
        # a frame only aggregates read takes Arrow's buffers as they are (read-only numpy
        # arrays, no copy into one block: 0.09 ms against 1.1 ms a 524,288-row batch)
        if rb is None:
            return None
        return rb.to_pandas(use_threads=False, split_blocks=getattr(self.stage, "read_only", False))

    def progress(self, split_id: str) -> float:
        """The share of the file read: files of unequal size advance in proportion."""
        return self._read[split_id] / self._rows[split_id]

    def total_rows(self) -> int | None:
        st = self.stage
        mine = sum(st.file_rows.get(f, 0) for f in st.assignment[self.index]) if st.assignment else 0
        return mine or None


def file_key(root: str, path: str) -> str:
    """How a saved position names file ``path`` of a source rooted at ``root`` (both
    absolute): its path relative to the root, ``/``-separated.

    >>> file_key("/data/big", "/data/big/2024/part-0.parquet")
    '2024/part-0.parquet'
    """
    return os.path.relpath(path, root).replace(os.sep, "/")


def _skipping(batches, rows: int):
    """Record batches without their first ``rows`` rows."""
    for rb in batches:
        if rows >= rb.num_rows:
            rows -= rb.num_rows
            continue
        yield rb.slice(rows) if rows else rb
        rows = 0
