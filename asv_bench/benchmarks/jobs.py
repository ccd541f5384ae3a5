"""The data-path jobs of issue 27 as one command, for comparing commits in one sitting.

``python -m benchmarks.jobs --op aggregate|stateful_map [--rows N] [--rate R] [--runs K]
[--state-backend memory|rocksdb]`` (from ``asv_bench/``) starts 2 worker processes, runs
the job once to warm up and then ``--runs`` times at streamlb's defaults, and prints one JSON
line per run: seconds from ``run()`` to ``wait()``'s return, records/s, and the p99 and
maximum of the records' latency (from every instance's latency histogram). ``--rate`` reads
the log open loop at that many records/s in all (the sources' ``rate=``) instead of as fast
as it goes; ``--state-backend`` runs it with ``run(state_backend=...)`` (default: the
setting's). Each run's result is checked against pandas.

It uses only the public API, so ``asv_bench/ab.py`` can run it with the ``streamlb`` of
another commit on ``PYTHONPATH``.

- ``aggregate``: a keyed count and sum (``key_by("key").aggregate``);
- ``stateful_map``: the same count and sum in a Python function called per record.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ._common import cluster, zipf_dataset

KEYS, SKEW = 100_000, 1.2


def count_and_sum(state, record):
    """A count and a sum per key, one Python call per record (nothing emitted)."""
    n, s = state or (0, 0.0)
    return (n + 1, s + record["value"]), None


def build(path: str, op: str, rate: float | None = None):
    from streamz import Stream

    src = Stream.from_parquet(path, rate=rate) if rate else Stream.from_parquet(path)
    keyed = src.key_by("key")
    if op == "aggregate":
        keyed.aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="out")
    elif op == "stateful_map":
        keyed.stateful_map(count_and_sum, name="out")
    else:
        raise ValueError(f"op must be 'aggregate' or 'stateful_map', got {op!r}")
    return src


def run_once(client, path: str, op: str, rate: float | None = None, backend: str | None = None) -> dict:
    """One run: seconds, records/s, latency p99 and max (ms), and the state."""
    import streamlb
    from streamlb import latency

    src = build(path, op, rate)
    t0 = time.perf_counter()
    job = streamlb.run(src, client=client, **({"state_backend": backend} if backend else {}))
    try:
        job.wait()
        took = time.perf_counter() - t0
        state = job.state("out")
        m = job.metrics()
    finally:
        job.stop()
    m = m[m.operator == "out"]
    hist = np.sum(np.stack(m.latency_hist.to_list()), axis=0)
    return {"seconds": took, "records": int(m.records.sum()), "p99_ms": latency.quantile(hist, 0.99),
            "max_ms": float(m.latency_max_ms.max()), "state": state}


def truth(path: str):
    """pandas' count and sum per key of the log."""
    import pandas as pd

    df = pd.read_parquet(path, columns=["key", "value"])
    return df.groupby("key")["value"].agg(["count", "sum"])


def check(state, want, op: str) -> None:
    """The job's state equals pandas' (counts exactly, sums to 1e-9)."""
    got = np.array(state["state"].tolist(), float) if op == "stateful_map" else state[["count", "sum"]].to_numpy(float)
    keys = state.index.to_numpy()
    order = np.argsort(keys)
    keys, got = keys[order], got[order]
    if not (np.array_equal(keys.astype(np.int64), want.index.to_numpy(np.int64))
            and np.array_equal(got[:, 0], want["count"].to_numpy(float))
            and np.allclose(got[:, 1], want["sum"].to_numpy(), rtol=1e-9)):
        raise AssertionError(f"{op}: the job's state differs from pandas'")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.jobs", description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=("aggregate", "stateful_map"), default="aggregate")
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--rate", type=float, default=None)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--state-backend", choices=("memory", "rocksdb"), default=None)
    a = p.parse_args(argv)
    path = zipf_dataset(a.rows, KEYS, SKEW, 16 if a.rows >= 40_000_000 else 8)
    want = truth(path)
    cl, client = cluster(2)
    with cl, client:
        run_once(client, path, a.op, a.rate, a.state_backend)                 # warm-up
        for i in range(a.runs):
            r = run_once(client, path, a.op, a.rate, a.state_backend)
            check(r.pop("state"), want, a.op)
            r.update(run=i, op=a.op, rows=a.rows, rate=a.rate, state_backend=a.state_backend,
                     records_per_second=a.rows / r["seconds"])
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
