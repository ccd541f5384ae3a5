"""The data-path jobs of issue 27 as one command, for comparing commits in one sitting.

``python -m benchmarks.jobs --op aggregate|stateful_map|window [--rows N] [--rate R] [--runs K]
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
- ``stateful_map``: the same count and sum in a Python function called per record;
- ``window``: a count and sum per key and hopping window of 10 s sliding by 5 s over the
  log's event time (one row a millisecond: 1,000 windows over 5M rows), each fired frame
  reduced to its windows' totals on the worker (rows, keys' sum, counts' sum, values' sum),
  checked against pandas per window.
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


def window_totals(frame):
    """A fired frame's totals per window start (ns): rows, keys' sum, counts' sum, values' sum."""
    import pandas as pd

    g = frame.assign(ws=frame["window_start"].to_numpy().astype("datetime64[ns]").view("int64")).groupby("ws")
    return pd.DataFrame({"rows": g.size(), "keys": g["key"].sum(), "count": g["count"].sum(),
                         "sum": g["sum"].sum()})


def build(path: str, op: str, rate: float | None = None):
    from streamz import Stream

    src = Stream.from_parquet(path, rate=rate) if rate else Stream.from_parquet(path)
    if op == "aggregate":
        src.key_by("key").aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="out")
    elif op == "stateful_map":
        src.key_by("key").stateful_map(count_and_sum, name="out")
    elif op == "window":
        win = src.with_watermark("event_time").key_by("key").window(size="10s", slide="5s").aggregate(
            {"count": ("value", "count"), "sum": ("value", "sum")}, name="out")
        src.fired = win.map(window_totals).sink_to_list()
    else:
        raise ValueError(f"op must be 'aggregate', 'stateful_map' or 'window', got {op!r}")
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
        state = _per_window(src.fired) if op == "window" else job.state("out")
        m = job.metrics()
    finally:
        job.stop()
    m = m[m.operator == "out"]
    hist = np.sum(np.stack(m.latency_hist.to_list()), axis=0)
    return {"seconds": took, "records": int(m.records.sum()), "p99_ms": latency.quantile(hist, 0.99),
            "max_ms": float(m.latency_max_ms.max()), "state": state}


def _per_window(parts: list):
    import pandas as pd

    return pd.concat(parts).groupby(level=0).sum().sort_index()


def truth(path: str, op: str = "aggregate"):
    """pandas' count and sum per key of the log (per window: :func:`window_totals` of
    every key's window)."""
    import pandas as pd

    if op != "window":
        df = pd.read_parquet(path, columns=["key", "value"])
        return df.groupby("key")["value"].agg(["count", "sum"])
    df = pd.read_parquet(path, columns=["key", "value", "event_time"])
    t = df["event_time"].to_numpy().astype("datetime64[ns]").view(np.int64)
    slide = 5_000_000_000
    parts = []
    for back in (0, 1):         # each row is in the window of its slide and the one before
        ws = (t // slide - back) * slide
        parts.append(df.assign(ws=ws).groupby(["ws", "key"])["value"].agg(["count", "sum"]).reset_index())
    per = pd.concat(parts).groupby(["ws", "key"]).sum().reset_index()
    g = per.groupby("ws")
    return pd.DataFrame({"rows": g.size(), "keys": g["key"].sum(), "count": g["count"].sum(),
                         "sum": g["sum"].sum()}).sort_index()


def check(state, want, op: str) -> None:
    """The job's state equals pandas' (counts exactly, sums to 1e-9)."""
    if op == "window":
        ints = ["rows", "keys", "count"]
        ok = (state.index.equals(want.index)
              and (state[ints].to_numpy(np.int64) == want[ints].to_numpy(np.int64)).all()
              and np.allclose(state["sum"].to_numpy(), want["sum"].to_numpy(), rtol=1e-9))
        if not ok:
            raise AssertionError("window: the windows' totals differ from pandas'")
        return
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
    p.add_argument("--op", choices=("aggregate", "stateful_map", "window"), default="aggregate")
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--rate", type=float, default=None)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--state-backend", choices=("memory", "rocksdb"), default=None)
    a = p.parse_args(argv)
    path = zipf_dataset(a.rows, KEYS, SKEW, 16 if a.rows >= 40_000_000 else 8)
    want = truth(path, a.op)
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
