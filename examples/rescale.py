"""Rescale a keyed aggregate 2 -> 4 -> 2 instances while it runs; the result is still exact.

Run: python examples/rescale.py [output-dir]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import pandas as pd
from streamz import Stream

import streamlb

ROWS, FILES, RATE = 900_000, 4, 100_000        # a 9 s stream


def write_events(path: str) -> None:
    """Skewed keys (Zipf) with a value each, in a few Parquet files."""
    rng = np.random.default_rng(0)
    os.makedirs(path, exist_ok=True)
    for i in range(FILES):
        n = ROWS // FILES
        pd.DataFrame({"key": rng.zipf(1.3, n) % 50_000, "value": rng.random(n)}).to_parquet(
            f"{path}/part-{i}.parquet")


def read_so_far(job) -> int:
    return sum(job.offsets().values())


def main(workdir: str) -> None:
    path = f"{workdir}/events"
    write_events(path)

    source = Stream.from_parquet(path, rate=RATE, batch_size=10_000)
    source.key_by("key").aggregate(
        {"events": ("value", "count"), "total": ("value", "sum"), "largest": ("value", "max")},
        name="per_key", parallelism=2,
    )
    with streamlb.run(source, n_workers=2, key_groups=256) as job:
        for share, parallelism in [(1 / 3, 4), (2 / 3, 2)]:
            while read_so_far(job) < share * ROWS:
                time.sleep(0.05)
            t = time.time()
            job.rescale("per_key", parallelism)            # returns once the new routing is in force
            print(f"at {read_so_far(job):,} records read: per_key runs as {job.parallelism('per_key')} "
                  f"instances ({time.time() - t:.2f} s to rescale)")
        job.wait(timeout=120)
        state = job.state("per_key")
        rescales = [h for h in job.history if h.get("kind") == "rescale"]
        metrics = job.metrics()

    truth = pd.read_parquet(path).groupby("key").agg(
        events=("value", "count"), total=("value", "sum"), largest=("value", "max"))
    pd.testing.assert_frame_equal(state, truth, check_dtype=False)
    assert [(h["from"], h["to"]) for h in rescales] == [(2, 4), (4, 2)]
    load = metrics[metrics.operator == "per_key"].groupby("instance").records.sum()
    print("records per instance over the run:", load.to_dict())
    print(f"final state of {len(state):,} keys equals pandas")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="streamlb-example-"))
