"""Writing a prepared dataset: its Parquet files, one directory per partition, written by
Spark with a progress bar over its tasks, and the ``_manifest.json`` that lists them
(used by :mod:`streamlb.datasets` and its NEXMark generator, ``_nexmark_data``)."""
from __future__ import annotations

import contextlib
import json
import os
import threading

import pandas as pd

from ._zipf import _BLOCK
from ..exceptions import InputPathError

_BASE_TIME = pd.Timestamp("2026-01-01T00:00:00")
_STEP_US = 1000                  # one record per millisecond of event time
_ARROW_BATCH = 4 * _BLOCK         # rows per mapInPandas batch while writing: each draws few blocks


class _Progress:
    """A tqdm bar over Spark tasks, fed by the status tracker from a thread."""

    def __init__(self, spark, desc: str, enabled: bool) -> None:
        self.spark, self.desc, self.enabled = spark, desc, enabled
        self._stop = threading.Event()

    def __enter__(self):
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(desc=self.desc, unit="task")
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()
        return self

    def _loop(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        done_before = 0
        while not self._stop.wait(0.2):
            infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            infos = [i for i in infos if i is not None]
            total = sum(i.numTasks for i in infos)
            done = sum(i.numCompletedTasks for i in infos)
            if total:
                self.bar.total = done_before + total
                self.bar.n = done_before + done
                self.bar.refresh()
            elif self.bar.total:
                done_before = self.bar.total

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._stop.set()
            self.thread.join()
            self.bar.n = self.bar.total or self.bar.n
            self.bar.close()


def _write(sdf, path: str, partitions: int, part_col: str, params: dict, progress: bool,
           order: tuple = ("event_time", "id")) -> dict:
    out = os.path.abspath(str(path))
    _write_parts(sdf, out, partitions, part_col, order, "id", progress)
    return _manifest(out, params)


def _write_parts(sdf, out: str, partitions: int, part_col: str, order: tuple, drop: str,
                 progress: bool) -> None:
    """Write ``sdf`` as one directory ``<part_col>=<i>`` per partition, each file ordered by
    ``order``; ``drop`` is a helper column left out of the files."""
    with _Progress(sdf.sparkSession, f"writing {os.path.basename(out)}", progress), \
            _arrow_batches(sdf.sparkSession, _ARROW_BATCH):
        (sdf.repartition(partitions, part_col)
            .sortWithinPartitions(part_col, *order)
            .drop(drop)
            .write.mode("overwrite").partitionBy(part_col).parquet(out))


@contextlib.contextmanager
def _arrow_batches(spark, rows: int):
    """Run the body with ``mapInPandas`` handing out batches of ``rows`` rows (Spark's
    default is 10,000), restoring the session's setting after."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key, None)
    spark.conf.set(key, str(rows))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def _files(out: str) -> list[dict]:
    """Each Parquet file below ``out``: its ``path`` relative to ``out`` and its ``rows``."""
    import pyarrow.parquet as pq

    from ..planner import parquet_files

    try:
        found = parquet_files(out)
    except InputPathError:           # a table with no rows (fewer than 50 events)
        return []
    return [{"path": os.path.relpath(f, out), "rows": pq.ParquetFile(f).metadata.num_rows}
            for f in found]


def _manifest(out: str, params: dict, tables: tuple[str, ...] = ()) -> dict:
    """Write ``out/_manifest.json``; with ``tables``, also each table's rows and files."""
    files = _files(out)
    man = {"params": params, "rows": sum(f["rows"] for f in files), "files": files}
    if tables:
        man["tables"] = {}
        for t in tables:
            tf = _files(os.path.join(out, t))
            man["tables"][t] = {"rows": sum(f["rows"] for f in tf), "files": tf}
    with open(os.path.join(out, "_manifest.json"), "w") as fh:
        json.dump(man, fh, indent=1)
    return man
