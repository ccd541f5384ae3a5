"""The RocksDB state backend against the memory one (issue 28): a keyed count and sum over
the 5M-row Zipf(1.2) log of 100k keys (8 Parquet files), ``run()`` -> ``wait()`` on 2
worker processes at the defaults, ``state_backend="memory"`` and ``"rocksdb"`` alternating in
one sitting; and a uniform log of many distinct keys (every key a few times), where the
state is far larger than the hot set. Both backends' totals are checked against each other
every run.

``python -m benchmarks.state`` (from ``asv_bench/``) prints a line per run and the table:
records/s per backend, and the median over rounds of RocksDB's records/s over memory's.
Options: ``--rows``, ``--keys``, ``--rounds``, ``--distinct`` (rows of the uniform log; 0: skip it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from ._common import _Sitting, cluster, markdown_table, timed_totals, zipf_dataset

SKEW = 1.2


def backend_seconds(client, path: str, backend: str) -> tuple[float, object]:
    """Seconds from ``run()`` to ``wait()``'s return with ``backend``, and the totals."""
    took, totals = timed_totals(client, path, state_backend=backend)
    return took, totals.sort_index()


def _same(a, b) -> None:
    import pandas as pd

    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def sitting(datasets: list[tuple[str, int, int]], rounds: int = 3, out=sys.stdout) -> dict:
    """For each ``(label, rows, keys)``: alternate the two backends ``rounds`` times; returns
    the runs and the median ratio (RocksDB's records/s over memory's) per label."""
    cl, client = cluster(2)
    result: dict = {"runs": [], "ratio": {}}
    start = time.perf_counter()
    with cl, client:
        for label, rows, keys in datasets:
            skew = SKEW if label == "zipf" else 0.0
            path = zipf_dataset(rows, keys, skew, 8)
            backend_seconds(client, path, "memory")          # warm-ups
            backend_seconds(client, path, "rocksdb")
            ratios = []
            for r in range(rounds):
                m, a = backend_seconds(client, path, "memory")
                k, b = backend_seconds(client, path, "rocksdb")
                _same(a, b)
                ratios.append(m / k)
                result["runs"].append({"data": label, "rows": rows, "keys": keys, "round": r, "memory": m,
                                       "rocksdb": k})
                print(f"[{time.perf_counter() - start:6.0f} s] {label} {rows:,} rows, {keys:,} keys, round "
                      f"{r + 1}/{rounds}: memory {rows / m / 1e6:5.2f}M rec/s  rocksdb {rows / k / 1e6:5.2f}M rec/s  "
                      f"ratio {m / k:4.2f}", file=out, flush=True)
            result["ratio"][label] = statistics.median(ratios)
    markdown_table(["data", "round", "memory", "rocksdb", "rocksdb / memory"],
                   [[f"{r['data']} {r['rows']:,} rows, {r['keys']:,} keys", r["round"],
                     f"{r['rows'] / r['memory'] / 1e6:.2f}M rec/s", f"{r['rows'] / r['rocksdb'] / 1e6:.2f}M rec/s",
                     f"{r['memory'] / r['rocksdb']:.2f}"] for r in result["runs"]], out)
    for label, ratio in result["ratio"].items():
        print(f"{label}: RocksDB at {ratio:.2f}x the memory backend's records/s (median)", file=out)
    return result


class StateBackends(_Sitting):
    """asv: RocksDB's records/s over memory's, median of 3 alternating rounds, 5M rows Zipf(1.2)."""

    def setup_cache(self):
        return sitting([("zipf", 5_000_000, 100_000)])["ratio"]

    def track_rocksdb_over_memory_5M(self, ratio):
        return ratio["zipf"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.state", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--distinct", type=int, default=0, help="rows of a uniform log with rows/4 keys (0: skip)")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    data = [("zipf", a.rows, a.keys)]
    if a.distinct:
        data.append(("uniform", a.distinct, a.distinct // 4))
    sitting(data, a.rounds)


if __name__ == "__main__":
    main()
