"""Prepare a skewed dataset with PySpark, aggregate it by key, look at the load per instance.

Run: python examples/zipf_aggregate.py [output-dir]
"""
from __future__ import annotations

import sys
import tempfile

import pandas as pd
from streamz import Stream

import streamlb
from streamlb import datasets


def main(workdir: str) -> None:
    path = f"{workdir}/zipf"
    datasets.zipf(path, rows=400_000, keys=50_000, skew=1.2, partitions=4, drift_every=100_000)

    source = Stream.from_parquet(path, batch_size=50_000)
    source.key_by("key").aggregate(
        {"events": ("value", "count"), "total": ("value", "sum"), "mean": ("value", "mean")},
        name="per_key",
    )
    with streamlb.run(source, n_workers=2) as job:
        job.wait(progress=True)
        state = job.state("per_key")
        metrics = job.metrics()
        print(job.summary())

    truth = pd.read_parquet(path).groupby("key").agg(
        events=("value", "count"), total=("value", "sum"), mean=("value", "mean"))
    pd.testing.assert_frame_equal(state, truth, check_dtype=False)
    load = metrics[metrics.operator == "per_key"].groupby("instance").records.sum()
    print("records per instance:", load.to_dict(), f"imbalance {load.max() / load.mean():.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="streamlb-example-"))
