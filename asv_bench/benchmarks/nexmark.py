"""The NEXMark queries (``streamlb.nexmark``) at the defaults, against Spark Structured
Streaming on the same files (docs/benchmarks.md).

The log: EVENTS NEXMark events (``datasets.nexmark``, seed 0, 4 files per table, 10,000
events/s of event time, 10% of them up to 3 s late), written by PySpark once into the data
directory; ``$STREAMLB_BENCH_NEXMARK_EVENTS`` sets another size. Each query reads the tables
it uses, with a watermark 4 s behind ``date_time`` as in the Flink suite's DDL:

- streamlb: ``nexmark.QUERIES[q](person, auction, bid)`` over ``Stream.from_parquet``
  sources into a sink that drops its rows, on 2 worker processes, every setting at its
  default (no balancer named); seconds from ``streamlb.run`` to ``Job.wait`` returning,
  best of 2 runs.
- Spark Structured Streaming (``local[2]``, 2 shuffle partitions, warm session): the same
  query written with DataFrame operators (:func:`spark_frame`) over
  ``readStream.schema(...).parquet(path/<table>)`` (``maxFilesPerTrigger`` unset),
  ``trigger(availableNow=True)``, into a ``foreachBatch`` sink that counts the rows and
  hashes every column (so no column is pruned away); seconds from ``start`` to termination,
  the second of 2 runs. Spark SS cannot run q4 and q6 (:data:`SPARK_CANNOT`): their Spark
  benchmarks are skipped.

Each system's runs of a query start once the machine is quiet (``_common.quiet``): Spark's
JVM goes on working for a second or two after a query returns, on the cores the next run
needs.

events/s = all the log's events (person, auction and bid) over those seconds, as Flink's
suite counts every event its generator makes whatever the query reads; a query over bids
alone does not open the other two tables (8% of the events).
"""
from __future__ import annotations

import os
import sys
import time

from ._common import DATA, _OneShot, cluster, quiet

EVENTS = int(os.environ.get("STREAMLB_BENCH_NEXMARK_EVENTS", 2_000_000))
FILES = 4
CORES = 2                     # streamlb's worker processes; Spark's local[2]
TABLES = ("person", "auction", "bid")
QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q11", "q12")
#: why Spark Structured Streaming cannot run a query (tried on PySpark 4.3; docs/benchmarks.md)
SPARK_CANNOT = {
    "q4": "the average per category is an aggregation with no event-time key after the join and the "
          "per-auction maximum: append mode refuses it (no watermark on its key), update mode refuses "
          "stateful operators before it (the global watermark correctness check)",
    "q6": "each seller's last 10 auctions needs ROW_NUMBER over a non-time window, refused on streams, "
          "and an aggregation per seller with no event-time key (as q4)",
}
#: the keys of each update stream that Spark emits: its last row per key is the result
SPARK_UPDATE_KEYS = {"q12": ["bidder", "starttime"]}


def _say(msg: str) -> None:
    print(f"[nexmark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def dataset(events: int = EVENTS) -> str:
    """Path of the NEXMark tables of ``events`` events, written by PySpark the first time."""
    from streamlb import datasets

    path = os.path.abspath(os.path.join(DATA, f"nexmark-{events}-{FILES}"))
    if not os.path.exists(os.path.join(path, "_manifest.json")):
        _say(f"writing {events:,} NEXMark events to {path}")
        datasets.nexmark(path, events=events, partitions=FILES, seed=0, progress=True)
    return path


# -- streamlb ----------------------------------------------------------------------------------
def streamlb_seconds(client, path: str, query: str, out: list | None = None) -> float:
    """Seconds from ``streamlb.run`` to ``Job.wait`` returning for ``query`` at the defaults.
    Its rows are dropped on the workers, or gathered into ``out`` in the driver."""
    from streamz import Stream

    import streamlb
    from streamlb import nexmark

    sources = [Stream.from_parquet(os.path.join(path, t)) for t in TABLES]
    node = nexmark.QUERIES[query](*sources)
    node.sink(out.append if out is not None else lambda df: None)
    root = next(s for s in sources if s.downstreams)
    t0 = time.perf_counter()
    with streamlb.run(root, client=client) as job:
        job.wait()
        return time.perf_counter() - t0


def streamlb_rate(client, path: str, query: str, events: int, runs: int = 2) -> float:
    """Best events/s of ``runs``."""
    return max(events / streamlb_seconds(client, path, query) for _ in range(runs))


# -- Spark Structured Streaming ----------------------------------------------------------------
class _Tables:
    """``tables(name)``: a table of ``path`` as a Spark stream, its times as timestamps (the
    files hold timestamp_ntz, which watermarks refuse), watermarked 4 s behind ``date_time``
    unless ``watermark=False``."""

    def __init__(self, spark, path: str):
        self.spark, self.path = spark, path

    def __call__(self, name: str, watermark: bool = True):
        from pyspark.sql import functions as F

        table = os.path.join(self.path, name)
        df = self.spark.readStream.schema(self.spark.read.parquet(table).schema).parquet(table)
        for c in ("date_time", "expires"):
            if c in df.columns:
                df = df.withColumn(c, F.col(c).cast("timestamp"))
        return df.withWatermark("date_time", "4 seconds") if watermark else df


def spark_can_run(query: str) -> None:
    """Raise NotImplementedError (as asv expects of a skipped benchmark), with the reason,
    if Spark Structured Streaming cannot run ``query``."""
    if query in SPARK_CANNOT:
        raise NotImplementedError(f"Spark Structured Streaming cannot run {query}: {SPARK_CANNOT[query]}")


def _best_rows(grouped, value: str, row: list[str]):
    """Per group, the rows whose ``value`` is the group's largest, ties kept: one
    aggregation collects the rows with the maximum, a filter after it keeps the best."""
    from pyspark.sql import functions as F

    return (grouped.agg(F.max(value).alias("top"), F.collect_list(F.struct(*row)).alias("rows"))
            .select("top", F.explode("rows").alias("r")).where(F.col(f"r.{value}") == F.col("top"))
            .select(*(f"r.{c}" for c in row)))


def spark_frame(spark, path: str, query: str):
    """``query`` as a Spark streaming DataFrame over the tables at ``path``, and its output
    mode. Raises NotImplementedError, with the reason, for a query Spark SS cannot run."""
    from pyspark.sql import functions as F

    spark_can_run(query)
    t = _Tables(spark, path)
    if query in ("q0", "q1", "q2"):
        bid = t("bid")
        price = F.col("price").cast("double") * F.lit(0.908) if query == "q1" else F.col("price")
        if query == "q2":
            return bid.where(F.col("auction") % 123 == 0).select("auction", "price"), "append"
        return bid.select("auction", "bidder", price.alias("price"), "date_time"), "append"
    if query == "q3":
        a = t("auction").where("category = 10").select(F.col("id").alias("auction_id"), "seller")
        p = t("person").where(F.col("state").isin("OR", "ID", "CA")).select("id", "name", "city", "state")
        return (a.join(p, F.expr("seller = id")).select("name", "city", "state", F.col("auction_id").alias("id")),
                "append")
    if query == "q5":       # count per hopping window and auction, then the top of each window
        counts = t("bid").groupBy(F.window("date_time", "10 seconds", "2 seconds"), "auction").agg(
            F.count("*").alias("num"))
        return _best_rows(counts.groupBy(F.window_time("window")), "num", ["auction", "num"]), "append"
    if query == "q7":
        return _best_rows(t("bid").groupBy(F.window("date_time", "10 seconds")), "price",
                          ["auction", "price", "bidder", "date_time"]), "append"
    if query == "q8":       # a join on equal windows; each (person, window) once
        p = t("person").select("id", "name", F.window("date_time", "10 seconds").alias("joined"))
        a = t("auction").select("seller", F.window("date_time", "10 seconds").alias("opened"))
        pairs = p.join(a, F.expr("id = seller AND joined = opened")).dropDuplicates(["id", "name", "joined"])
        return pairs.select("id", "name", F.col("joined.start").alias("starttime")), "append"
    if query == "q11":
        s = t("bid").groupBy(F.session_window("date_time", "10 seconds").alias("s"), "bidder").agg(
            F.count("*").alias("bid_count"))
        return s.select("bidder", "bid_count", F.col("s.start").alias("starttime"),
                        F.col("s.end").alias("endtime")), "append"
    if query == "q12":
        # processing time: append mode would never close a window (a watermark on
        # current_timestamp() moves only with new batches), so update mode; a second
        # watermark on date_time is refused ("Redefining watermark is disallowed")
        bids = t("bid", watermark=False).select("bidder").withColumn("processing_time", F.current_timestamp())
        w = bids.withWatermark("processing_time", "0 seconds").groupBy(
            F.window("processing_time", "10 seconds"), "bidder").agg(F.count("*").alias("bid_count"))
        return w.select("bidder", "bid_count", F.col("window.start").alias("starttime"),
                        F.col("window.end").alias("endtime")), "update"
    raise ValueError(f"unknown NEXMark query {query!r}; valid: {', '.join(QUERIES)}")


def _count_rows(counts: list):
    """A ``foreachBatch`` function appending each batch's row count to ``counts``; it
    hashes every column, so Spark computes all of them."""
    from pyspark.sql import functions as F

    def count(batch, batch_id):
        row = batch.agg(F.count(F.lit(1)).alias("n"), F.bit_xor(F.xxhash64(*batch.columns)).alias("h")).first()
        counts.append(row["n"])

    return count


def spark_seconds(spark, path: str, query: str, out: list | None = None) -> float:
    """Seconds from ``start`` to termination of ``query`` on Spark SS. Each batch's row
    count goes to a list, or each batch as pandas into ``out``."""
    frame, mode = spark_frame(spark, path, query)
    sink = (lambda batch, batch_id: out.append(batch.toPandas())) if out is not None else _count_rows([])
    writer = frame.writeStream.outputMode(mode).foreachBatch(sink).trigger(availableNow=True)
    t0 = time.perf_counter()
    writer.start().awaitTermination()
    return time.perf_counter() - t0


def spark_rate(spark, path: str, query: str, events: int, runs: int = 2) -> float:
    """events/s of the last of ``runs``."""
    return [events / spark_seconds(spark, path, query) for _ in range(runs)][-1]


def spark_result(query: str, frames: list):
    """What Spark SS emitted, as ``streamlb.nexmark._check.result`` makes streamlb's: for
    an update stream, the last row per key."""
    from streamlb.nexmark._check import result

    got = result(query, frames)
    keys = SPARK_UPDATE_KEYS.get(query)
    return got.groupby(keys, sort=False).tail(1) if keys and len(got) else got


# -- the benchmarks ------------------------------------------------------------------------------
class _Nexmark(_OneShot):
    """The runs of every query, once for both classes below (they share this
    ``setup_cache``: asv keys it by its function)."""

    params = list(QUERIES)
    param_names = ["query"]
    timeout = 7200          # at 2M events streamlb's q4, q6 and q7 take minutes a run

    def setup_cache(self):
        from streamlb import datasets

        path = dataset()
        spark = datasets.spark_session()
        out: dict = {"streamlb": {}, "spark": {}}
        cl, client = cluster(CORES)
        with cl, client:
            for q in QUERIES:       # each query on both systems in turn, so a drift of the machine hits both
                quiet()             # each once the JVM has stopped working on the last Spark query
                out["streamlb"][q] = streamlb_rate(client, path, q, EVENTS)
                _say(f"{q} streamlb {out['streamlb'][q]:,.0f} events/s")
                if q not in SPARK_CANNOT:
                    quiet()
                    out["spark"][q] = spark_rate(spark, path, q, EVENTS)
                    _say(f"{q} Spark SS {out['spark'][q]:,.0f} events/s")
        return out


class NexmarkStreamlb(_Nexmark):
    def track_events_per_second(self, r, query):
        return r["streamlb"][query]

    track_events_per_second.unit = "events/s"

    def track_events_per_second_per_core(self, r, query):
        return r["streamlb"][query] / CORES

    track_events_per_second_per_core.unit = "events/s/core"


class NexmarkSparkSS(_Nexmark):
    def setup(self, r, query):
        spark_can_run(query)

    def track_events_per_second(self, r, query):
        return r["spark"][query]

    track_events_per_second.unit = "events/s"

    def track_over_spark_structured_streaming(self, r, query):
        return r["streamlb"][query] / r["spark"][query]

    track_over_spark_structured_streaming.unit = "x Spark SS"


def main(argv=None) -> None:
    """``python -m benchmarks.nexmark --query q12 [--runs R]``: streamlb alone, one cluster,
    a warm-up run then ``R`` timed ones (:func:`streamlb_seconds`), one JSON line each
    (``asv_bench/ab.py --bench nexmark`` runs it with two commits alternating)."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    p.add_argument("--query", default="q12", choices=QUERIES)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    path = dataset()
    cl, client = cluster(CORES)
    with cl, client:
        streamlb_seconds(client, path, a.query)
        for _ in range(a.runs):
            s = streamlb_seconds(client, path, a.query)
            print(json.dumps({"query": a.query, "seconds": s, "events_per_second": EVENTS / s}), flush=True)


if __name__ == "__main__":
    main()
