"""Balance a drifting skewed stream with every setting at its default, and read how even
the instances were, window by window, with ``job.imbalance``.

Run: python examples/reading_imbalance.py [output-dir]
"""
from __future__ import annotations

import sys
import tempfile

import pandas as pd
from streamz import Stream

import streamlb
from streamlb import datasets

RATE = 40_000       # records/s, open loop


def main(workdir: str) -> None:
    path = f"{workdir}/drifting"
    # 8s of stream whose hot keys move every 2s; one file per source instance
    datasets.zipf(path, rows=8 * RATE, keys=50_000, skew=1.0, partitions=2, drift_every=2 * RATE)
    truth = pd.read_parquet(path).groupby("key").agg(n=("value", "count"), total=("value", "sum"))

    for balancer in ("static", "autoflow"):
        source = Stream.from_parquet(path, rate=RATE)
        source.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")},
                                       parallelism=8, name="per_key")
        with streamlb.run(source, n_workers=2, balancer=balancer) as job:
            job.wait(progress=True)
            state = job.state("per_key")
            imbalance = job.imbalance("per_key")
            moves = len(job.history)
        pd.testing.assert_frame_equal(state, truth, check_dtype=False)
        full = imbalance[imbalance["records"] > 0.8 * imbalance["records"].median()]
        print(f"\n{balancer}: {moves} migrations; per full window (applied = what the instances did, "
              "routed = what they were sent, batches = the fewest an instance applied):")
        print(full[["window_start", "applied", "routed", "floor", "batches"]].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
        print(f"median applied imbalance: {full['applied'].median():.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="streamlb-example-"))
