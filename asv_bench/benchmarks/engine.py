"""streamlb's keyed aggregate against two raw Dask actors fed the same batches (issue 27):
the engine's overhead over the runtime it is built on.

The raw side is what a hand-written Dask program would do with none of streamlb: one
*feeder* actor per worker reads the Parquet files streamlb's planner gives that worker's
source instance, in batches of streamlb's batch size for this job (the setting
``streamlb.aggregate-batch-size``; pyarrow, key and value columns, zero-copy to numpy), and
sends each batch as pickled numpy arrays to the *counter* actors of the two workers in turn
(so half the records cross between processes, as about half of streamlb's keyed exchange
does), keeping up to ``credits`` calls in flight. A counter adds each batch into dense
tables indexed by the key (``np.bincount``; it knows the keys are 0..99,999, so it neither
hashes nor routes). No key groups, no combining, no checkpoints or epochs, no balancer
counts, no start-up: its clock runs from the first batch read to the last one added.

With ``--from-memory`` the feeders hold their batches decoded before the clock starts (the
issue's first reference: "no Parquet"): the runtime alone, with nothing to read.

streamlb runs ``run()`` -> ``wait()`` at its defaults on the same cluster (start-up
included), reading the files itself. Both answers are checked against each other.

``python -m benchmarks.engine`` (from ``asv_bench/``) alternates the two ``--rounds`` times
at ``--rows`` and prints the median of the per-round ratios (raw seconds over streamlb's:
at least 0.9 is the target). ``--batch`` sets the raw side's batch size (default: streamlb's).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import numpy as np

from ._common import _Sitting, cluster, timed_totals, zipf_dataset
from .peers import same

KEYS, SKEW = 100_000, 1.2
FILES = {5_000_000: 8, 40_000_000: 16}


class Counter:
    """Dense count and sum per key 0..keys-1 of the batches it is sent."""

    def __init__(self, keys: int) -> None:
        self.count = np.zeros(keys, np.int64)
        self.sum = np.zeros(keys, np.float64)

    async def add(self, keys: np.ndarray, values: np.ndarray) -> int:
        n = len(self.count)
        self.count += np.bincount(keys, minlength=n)
        self.sum += np.bincount(keys, weights=values, minlength=n)
        return len(keys)

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        return self.count, self.sum


class Feeder:
    """Sends one worker's share of the log to the counters, read from its files (or held
    in memory, decoded before the clock starts)."""

    def __init__(self, files: list, batch: int, from_memory: bool = False) -> None:
        self.files, self.batch = files, batch
        self.held = list(self._read()) if from_memory else None

    def _read(self):
        import pyarrow.parquet as pq

        for f in self.files:
            for rb in pq.ParquetFile(f).iter_batches(batch_size=self.batch, columns=["key", "value"],
                                                     use_threads=False):
                yield rb.column(0).to_numpy(), rb.column(1).to_numpy()

    async def feed(self, counters: list, credits: int) -> float:
        """Send the batches to ``counters`` in turn with up to ``credits`` calls in flight;
        the seconds from the first read to the last batch added."""
        t0 = time.perf_counter()
        pending: set = set()
        for i, (keys, values) in enumerate(self.held if self.held is not None else self._read()):
            counter = counters[i % len(counters)]
            if len(pending) >= credits:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for d in done:
                    d.result()
            pending.add(asyncio.ensure_future(counter.add(keys, values)))
        if pending:
            for d in (await asyncio.wait(pending))[0]:
                d.result()
        return time.perf_counter() - t0


def _shares(path: str, workers: list[str]) -> tuple[dict[str, list], int]:
    """The files streamlb's planner gives each worker's source instance, by worker, and
    the source's batch size."""
    from streamz import Stream

    import dask

    from streamlb.planner import plan
    from streamlb.planner._checks import pace_batches

    src = Stream.from_parquet(path)
    src.key_by("key").aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="totals")
    p = plan(src, workers=len(workers), key_groups=dask.config.get("streamlb.key-groups"),
             batch_size=dask.config.get("streamlb.batch-size"))
    pace_batches(p, 1.0)
    st = next(s for s in p.stages if s.is_source)
    return {w: list(st.assignment[i]) for i, w in enumerate(workers)}, st.batch_size


def raw_seconds(client, path: str, batch: int | None = None, credits: int = 4,
                from_memory: bool = False) -> tuple[float, object]:
    """Seconds of the raw actors over ``path`` (their longest feed), and the totals."""
    import pandas as pd
    from distributed import wait

    workers = sorted(client.scheduler_info()["workers"])
    shares, planned = _shares(path, workers)
    batch = batch or planned
    counters = [client.submit(Counter, KEYS, actor=True, workers=[w], pure=False) for w in workers]
    feeders = [client.submit(Feeder, shares[w], batch, from_memory, actor=True, workers=[w], pure=False)
               for w in workers]
    wait(counters + feeders)
    counters = [c.result() for c in counters]
    feeders = [f.result() for f in feeders]
    t0 = time.perf_counter()
    futs = [f.feed(counters[i:] + counters[:i], credits) for i, f in enumerate(feeders)]
    for f in futs:
        f.result()
    took = time.perf_counter() - t0
    tables = [c.tables().result() for c in counters]
    count = sum(t[0] for t in tables)
    total = sum(t[1] for t in tables)
    seen = np.flatnonzero(count)
    return took, pd.DataFrame({"key": seen, "count": count[seen], "sum": total[seen]})


def sitting(rows: int = 40_000_000, rounds: int = 6, batch: int | None = None, from_memory: bool = False,
            out=sys.stdout) -> dict:
    """Alternate streamlb and the raw actors ``rounds`` times; the runs and the median of
    the per-round ratios (raw seconds / streamlb's)."""
    path = zipf_dataset(rows, KEYS, SKEW, FILES.get(rows, 8))
    cl, client = cluster(2)
    result: dict = {"runs": []}
    with cl, client:
        timed_totals(client, path)                  # warm-ups
        raw_seconds(client, path, batch, from_memory=from_memory)
        for r in range(rounds):
            s, got = timed_totals(client, path)
            k, want = raw_seconds(client, path, batch, from_memory=from_memory)
            same(got, want, "the raw actors'")
            result["runs"].append({"round": r, "streamlb": s, "raw": k})
            print(f"{rows:>11,} rows round {r + 1}/{rounds}: streamlb {s:6.3f} s ({rows / s / 1e6:5.1f}M rec/s)  "
                  f"raw actors {k:6.3f} s ({rows / k / 1e6:5.1f}M rec/s)  ratio {k / s:4.2f}", file=out, flush=True)
    result["ratio"] = statistics.median(r["raw"] / r["streamlb"] for r in result["runs"])
    print(f"median ratio (raw actors' seconds / streamlb's): {result['ratio']:.2f}", file=out)
    return result


class EngineOverhead(_Sitting):
    """asv: streamlb's keyed aggregate over two raw actors fed the same batches (40M rows)."""

    def setup_cache(self):
        return sitting()["ratio"]

    def track_ratio_to_raw_actors(self, ratio):
        return ratio


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=40_000_000)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--from-memory", action="store_true", help="the raw feeders hold their batches decoded")
    a = p.parse_args(argv)
    sitting(a.rows, a.rounds, a.batch, a.from_memory)


if __name__ == "__main__":
    main()
