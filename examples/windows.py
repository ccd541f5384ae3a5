"""Tumbling event-time windows over an out-of-order log, with watermarks and a late stream,
on an embedded two-worker Dask cluster.

Two Parquet files of clicks, one record per millisecond of arrival time; 10% of the records
carry an event time up to 2 s earlier than their arrival. Counted per page and 5-second
window twice: with a watermark delay of 2 s no record is late; with no delay some are, and
they come out of the late stream instead of being dropped.

The first few batches of windows are printed as the job emits them (``job.results``).

Run: python examples/windows.py
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pandas as pd
from streamz import Stream

import streamlb

ROWS = 20_000


def write_log(root: str) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frames = []
    for f in range(2):
        arrival = pd.Timestamp("2026-01-01") + pd.to_timedelta(np.arange(ROWS), unit="ms")
        delayed = rng.random(ROWS) < 0.1
        lag = pd.to_timedelta(np.where(delayed, rng.integers(0, 2_000_000, ROWS), 0), unit="us")
        frame = pd.DataFrame({"page": rng.integers(0, 20, ROWS), "ms": rng.integers(1, 500, ROWS),
                              "event_time": arrival - lag})
        frame.to_parquet(os.path.join(root, f"clicks-{f}.parquet"))     # in arrival order
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def count(root: str, delay: str):
    src = Stream.from_parquet(root, batch_size=500).with_watermark("event_time", delay=delay)
    windows = src.key_by("page").window(size="5s").aggregate(
        {"clicks": ("ms", "count"), "time_on_page": ("ms", "sum")}, name="per_page")
    out, late = [], []
    windows.sink(out.append)
    windows.late().sink(late.append)
    with streamlb.run(src, n_workers=2) as job:
        # the driver sees each batch of windows as the watermark passes their end (job.results
        # drives the job as wait() does, and ends with it)
        for i, batch in enumerate(job.results(out)):
            if i < 3:
                print(f"delay {delay}: {len(batch)} windows fired, ending up to {batch.window_end.max()}")
        job.wait(timeout=120)
        marks = job.watermarks()
    rows = pd.concat(out, ignore_index=True).sort_values(["page", "window_start"], ignore_index=True)
    return rows, (pd.concat(late, ignore_index=True) if late else pd.DataFrame()), marks


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        log = write_log(root)
        truth = (log.assign(window_start=log.event_time.dt.floor("5s"))
                 .groupby(["page", "window_start"]).ms.agg(clicks="count", time_on_page="sum").reset_index())

        rows, late, marks = count(root, delay="2s")
        print(rows.head())
        print(marks)
        assert late.empty
        assert rows[["page", "window_start", "clicks", "time_on_page"]].equals(truth)
        print(f"delay 2s: {len(rows)} windows, exactly pandas' result, no late record")

        rows, late, _ = count(root, delay="0s")
        assert len(late) > 0 and (late.window_end <= late.watermark).all()
        on_time = log.merge(late[["page", "ms", "event_time"]], how="left", indicator=True)
        on_time = on_time[on_time._merge == "left_only"]
        print(f"delay 0s: {len(late)} late records set aside, e.g.\n{late.head(3)}")
        assert rows.clicks.sum() + len(late) == len(log)
        assert len(on_time) == len(log) - len(late)


if __name__ == "__main__":
    main()
