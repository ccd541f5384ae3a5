"""streamlb against Spark batch on the same Parquet files (issue 27): a keyed count and sum
over a Zipf(1.2) log of 100k keys, streamlb's ``run()`` -> ``wait()`` on 2 worker processes
at its defaults against Spark's ``read.parquet().groupBy().agg()`` -> ``toPandas()`` in
``local[2]`` (a warm session, ``spark.sql.shuffle.partitions=2``), alternating in one
process. Both answers are checked against each other every run.

``python -m benchmarks.peers`` (from ``asv_bench/``) prints a line per run and the table:
seconds per run and the median of the per-round ratios (Spark's seconds over streamlb's:
above 1, streamlb is faster). Options: ``--rows 5000000 40000000``, ``--rounds 3``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from ._common import _Sitting, cluster, timed_totals, zipf_dataset

KEYS, SKEW = 100_000, 1.2
FILES = {5_000_000: 8, 40_000_000: 16}


def streamlb_seconds(client, path: str) -> tuple[float, object]:
    """Seconds from ``run()`` to ``wait()``'s return (the job's start-up included), and
    the totals."""
    return timed_totals(client, path)


def spark_seconds(spark, path: str) -> tuple[float, object]:
    """Seconds of Spark batch's group-by into pandas, and the totals."""
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    out = (spark.read.parquet(path).groupBy("key")
           .agg(F.count("value").alias("count"), F.sum("value").alias("sum")).toPandas())
    return time.perf_counter() - t0, out


def same(a, b, other: str = "Spark's") -> None:
    """The two systems' totals agree exactly (sums of integer-valued floats): ``a`` indexed
    by key, ``b`` with a ``key`` column."""
    import numpy as np

    a = a[["count", "sum"]].sort_index()
    b = b.set_index("key")[["count", "sum"]].sort_index()
    if not (np.array_equal(a.index.to_numpy(np.int64), b.index.to_numpy(np.int64))
            and np.array_equal(a["count"].to_numpy(), b["count"].to_numpy())
            and np.allclose(a["sum"].to_numpy(), b["sum"].to_numpy(), rtol=1e-12, atol=0)):
        raise AssertionError(f"streamlb's and {other} totals differ")


def sitting(rows_list=(5_000_000, 40_000_000), rounds: int = 3, out=sys.stdout) -> dict:
    """Alternate streamlb and Spark ``rounds`` times per size; returns the runs and the
    median ratios (Spark's seconds / streamlb's) per size."""
    from streamlb.datasets import spark_session

    spark = spark_session(2)
    cl, client = cluster(2)
    result: dict = {"runs": [], "ratio": {}}
    start = time.perf_counter()
    with cl, client:
        for rows in rows_list:
            path = zipf_dataset(rows, KEYS, SKEW, FILES.get(rows, 8))
            streamlb_seconds(client, path)          # warm-ups: imports, JIT, page cache
            spark_seconds(spark, path)
            ratios = []
            for r in range(rounds):
                s, got = streamlb_seconds(client, path)
                k, want = spark_seconds(spark, path)
                same(got, want)
                ratios.append(k / s)
                result["runs"].append({"rows": rows, "round": r, "streamlb": s, "spark": k})
                print(f"[{time.perf_counter() - start:7.0f} s] {rows:>11,} rows round {r + 1}/{rounds}: "
                      f"streamlb {s:6.2f} s ({rows / s / 1e6:5.1f}M rec/s)  Spark {k:6.2f} s "
                      f"({rows / k / 1e6:5.1f}M rec/s)  ratio {k / s:4.2f}", file=out, flush=True)
            result["ratio"][rows] = statistics.median(ratios)
    print("\n| rows | round | streamlb | Spark batch | Spark / streamlb |\n|---|---|---|---|---|", file=out)
    for run in result["runs"]:
        print(f"| {run['rows']:,} | {run['round']} | {run['streamlb']:.2f} s | {run['spark']:.2f} s | "
              f"{run['spark'] / run['streamlb']:.2f} |", file=out)
    for rows, ratio in result["ratio"].items():
        print(f"{rows:,} rows: median ratio {ratio:.2f}x Spark batch", file=out)
    return result


class Peers(_Sitting):
    """asv: the median ratio over 3 alternating rounds at 5M and 40M rows."""

    def setup_cache(self):
        return sitting()["ratio"]

    def track_ratio_5M(self, ratio):
        return ratio[5_000_000]

    def track_ratio_40M(self, ratio):
        return ratio[40_000_000]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[5_000_000, 40_000_000])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    sitting(a.rows, a.rounds)


if __name__ == "__main__":
    main()
