"""Windowed aggregate throughput against Spark Structured Streaming and Bytewax, and the
latency of a window's row (docs/windows.md).

The log: 2M records of Zipf(1.2) over 100k keys in 8 Parquet files, 10% of them up to 3 s
out of order (``datasets.zipf(disorder=3.0)``; about 33 minutes of event time). The query:
per key and 10-second tumbling window, count and sum of ``value``, watermark 3 s behind the
largest event time. Each system reads the same files on this machine:

- streamlb: ``with_watermark`` + ``key_by().window(size="10s").aggregate()`` on 2 worker
  processes at the defaults (one window instance per worker); records/s from
  ``Job.summary()``. ``track_streamlb_4_instances`` runs 4 window instances.
- Spark Structured Streaming (``local[2]``, 2 shuffle partitions, warm session):
  ``readStream.parquet`` + ``withWatermark`` + ``groupBy(window(...), key)``, append mode to
  the memory sink, ``trigger(availableNow=True)``; records over the seconds from start to
  termination, second of two runs.
- Bytewax (``fold_window``, ``EventClock`` with the same 3 s, ``TumblingWindower``, one
  worker, ``run_main``): on the first 500k records, read into Python tuples beforehand (not
  timed).

Latency: the same streamlb job replayed at 200k records/s (``from_parquet(rate=,
event_time=)``); for each window row, the wall-clock time from the watermark that fired it
leaving its source (``attrs["watermark_made_at"]``) to the row reaching the sink.
"""
from __future__ import annotations

import time

from ._common import _OneShot, cluster, zipf_dataset

ROWS, KEYS, SKEW, FILES = 2_000_000, 100_000, 1.2, 8
BYTEWAX_ROWS = 500_000
SPEC = {"n": ("value", "count"), "total": ("value", "sum")}


def _path() -> str:
    return zipf_dataset(ROWS, KEYS, SKEW, partitions=FILES, disorder=3.0)


def streamlb_rate(path: str, runs: int = 2, parallelism: int | None = None) -> float:
    """Best records/s of ``runs`` (``parallelism``: window instances; None, the default:
    one per worker)."""
    from streamz import Stream

    import streamlb

    cl, client = cluster(2)
    rates = []
    with cl, client:
        for _ in range(runs):
            src = Stream.from_parquet(path).with_watermark("event_time", delay="3s")
            src.key_by("key").window(size="10s").aggregate(SPEC, parallelism=parallelism, name="w").sink(
                lambda df: None)
            with streamlb.run(src, client=client, balancer="static") as job:
                job.wait()
                rates.append(job.summary()["records_per_second"])
    return max(rates)


def spark_rate(path: str, runs: int = 2) -> float:
    from pyspark.sql import functions as F

    from streamlb import datasets

    spark = datasets.spark_session()
    schema = spark.read.parquet(path).schema
    secs = []
    for i in range(runs):
        q = (spark.readStream.schema(schema).parquet(path)
             .withColumn("event_time", F.col("event_time").cast("timestamp"))   # written as timestamp_ntz
             .withWatermark("event_time", "3 seconds")
             .groupBy(F.window("event_time", "10 seconds"), "key")
             .agg(F.count("value").alias("n"), F.sum("value").alias("total"))
             .writeStream.outputMode("append").format("memory").queryName(f"w{i}_{int(time.time())}")
             .trigger(availableNow=True))
        t0 = time.perf_counter()
        running = q.start()
        running.awaitTermination()
        secs.append(time.perf_counter() - t0)
    return ROWS / secs[-1]


def bytewax_rate(path: str) -> float:
    import datetime as dt

    import pandas as pd
    from bytewax import operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window
    from bytewax.testing import TestingSink, TestingSource, run_main

    frame = pd.read_parquet(path, columns=["key", "value", "event_time"]).head(BYTEWAX_ROWS)
    times = frame.event_time.dt.tz_localize("UTC").dt.to_pydatetime()
    records = list(zip(frame.key.astype(str).tolist(), frame.value.tolist(), times))
    out: list = []
    flow = Dataflow("windows")
    inp = op.input("in", flow, TestingSource(records, batch_size=10_000))
    keyed = op.key_on("key", inp, lambda r: r[0])
    clock = EventClock(lambda r: r[2], wait_for_system_duration=dt.timedelta(seconds=3))
    windower = TumblingWindower(length=dt.timedelta(seconds=10),
                                align_to=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    w = fold_window("fold", keyed, clock, windower, lambda: (0, 0.0),
                    lambda acc, r: (acc[0] + 1, acc[1] + r[1]), lambda a, b: (a[0] + b[0], a[1] + b[1]))
    op.output("out", w.down, TestingSink(out))
    t0 = time.perf_counter()
    run_main(flow)
    return len(records) / (time.perf_counter() - t0)


def latencies(path: str, rate: float = 200_000) -> tuple[float, float]:
    """p50 and p99, in ms, of watermark made -> window row at the sink."""
    import numpy as np
    from streamz import Stream

    import streamlb

    def stamp(df):
        return np.full(len(df), time.time() - df.attrs["watermark_made_at"])

    cl, client = cluster(2)
    with cl, client:
        src = Stream.from_parquet(path, rate=rate, event_time="event_time").with_watermark("event_time", delay="3s")
        lat = src.key_by("key").window(size="10s").aggregate(SPEC, name="w").map(stamp).sink_to_list()
        with streamlb.run(src, client=client, balancer="static") as job:
            job.wait()
    got = np.concatenate(lat) * 1e3
    return float(np.percentile(got, 50)), float(np.percentile(got, 99))


class WindowedAggregate(_OneShot):
    timeout = 3600

    def setup_cache(self):
        path = _path()
        s = streamlb_rate(path)
        s4 = streamlb_rate(path, parallelism=4)
        spark = spark_rate(path)
        bw = bytewax_rate(path)
        p50, p99 = latencies(path)
        return {"streamlb": s, "streamlb_4": s4, "spark": spark, "bytewax": bw, "p50": p50, "p99": p99}

    def track_streamlb_records_per_second(self, r):
        return r["streamlb"]

    track_streamlb_records_per_second.unit = "records/s"

    def track_streamlb_4_instances(self, r):
        return r["streamlb_4"]

    track_streamlb_4_instances.unit = "records/s"

    def track_over_spark_structured_streaming(self, r):
        return r["streamlb"] / r["spark"]

    track_over_spark_structured_streaming.unit = "x Spark SS"

    def track_over_bytewax(self, r):
        return r["streamlb"] / r["bytewax"]

    track_over_bytewax.unit = "x Bytewax"

    def track_window_row_latency_p50(self, r):
        return r["p50"]

    track_window_row_latency_p50.unit = "ms"

    def track_window_row_latency_p99(self, r):
        return r["p99"]

    track_window_row_latency_p99.unit = "ms"
