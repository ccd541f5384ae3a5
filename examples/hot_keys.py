"""One key is a third of the stream: let the ``hybrid`` balancer split it, check the result.

Run: python examples/hot_keys.py [output-dir]
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import pandas as pd
from streamz import Stream

import streamlb


def main(workdir: str) -> None:
    rng = np.random.default_rng(0)
    n = 600_000
    keys = np.where(rng.random(n) < 1 / 3, 0, rng.integers(1, 20_000, n))     # key 0: a third
    path = os.path.join(workdir, "hot")
    os.makedirs(path, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(n), 4)):
        pd.DataFrame({"key": keys[part], "value": rng.integers(0, 100, len(part))}).to_parquet(
            os.path.join(path, f"part-{i}.parquet"))

    source = Stream.from_parquet(path, batch_size=8_192, rate=200_000)
    source.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")}, parallelism=4,
                                   name="per_key")
    with streamlb.run(source, n_workers=2, window=0.5, balancer="hybrid", migration="all-at-once") as job:
        job.wait(progress=True)
        state = job.state("per_key")
        metrics = job.metrics()
        splits = [e["splits"] for e in job.history if e["strategy"] == "split"]
        trace = job.load_trace("per_key")          # load per window, hottest keys included

    frame = pd.concat(pd.read_parquet(os.path.join(path, f)) for f in sorted(os.listdir(path)))
    truth = frame.groupby("key").agg(n=("value", "count"), total=("value", "sum"))
    pd.testing.assert_frame_equal(state, truth, check_dtype=False)          # exact, split or not
    assert splits, "the hot key was never split"
    per = metrics[metrics.operator == "per_key"].groupby("instance")[["records", "split_records"]].sum()
    print("split epochs (key, helpers):", splits)
    print(per.to_string())
    print("state equals pandas over the same files")

    # the recorded load, replayed with no cluster: moving groups alone cannot balance it
    from streamlb.simulator import simulate, summarize

    replay = summarize({b: simulate(trace, b) for b in ("static", "autoflow", "hybrid")})
    print(replay[["mean_imbalance", "max_split_keys"]].to_string())
    assert replay.loc["hybrid", "max_split_keys"] >= 1
    assert replay.loc["hybrid", "mean_imbalance"] < replay.loc["autoflow", "mean_imbalance"]


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="streamlb-example-"))
