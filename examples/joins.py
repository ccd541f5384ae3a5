"""Joining two out-of-order streams by key and event time, on an embedded two-worker Dask
cluster: which ad impression led to each click.

Impressions and clicks are two Parquet logs, each with up to 1 s of disorder. A click joins
the impressions of the same ad shown to it in the 10 seconds before it (an interval join).
A left join also keeps the impressions nobody clicked, once the watermark says no click can
come for them any more. A union merges two click logs into one stream first. The result is
checked against pandas.

Run: python examples/joins.py
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pandas as pd
from streamz import Stream

import streamlb

N = 5_000


def write(root: str, name: str, frame: pd.DataFrame) -> str:
    path = os.path.join(root, name)
    os.makedirs(path)
    frame.to_parquet(os.path.join(path, "part-0.parquet"))
    return path


def logs(root: str):
    rng = np.random.default_rng(1)
    t0 = pd.Timestamp("2026-01-01")

    def log(n, step_ms):
        arrival = t0 + pd.to_timedelta(np.arange(n) * step_ms, unit="ms")
        late = pd.to_timedelta(np.where(rng.random(n) < 0.1, rng.integers(0, 1_000, n), 0), unit="ms")
        return arrival - late

    shows = pd.DataFrame({"ad": rng.integers(0, 200, N), "impression": np.arange(N), "time": log(N, 20)})
    clicks = [pd.DataFrame({"ad": rng.integers(0, 200, N // 4), "click": np.arange(N // 4) + k * N,
                            "time": log(N // 4, 80)}) for k in range(2)]
    paths = (write(root, "impressions", shows), write(root, "clicks-a", clicks[0]),
             write(root, "clicks-b", clicks[1]))
    return paths, shows, pd.concat(clicks, ignore_index=True)


def expected(shows: pd.DataFrame, clicks: pd.DataFrame) -> pd.DataFrame:
    m = shows.merge(clicks, on="ad", suffixes=("_shown", "_clicked"))
    m = m[(m.time_clicked >= m.time_shown) & (m.time_clicked <= m.time_shown + pd.Timedelta("10s"))]
    unclicked = shows[~shows.impression.isin(m.impression)].rename(columns={"time": "time_shown"})
    return pd.concat([m, unclicked], ignore_index=True)


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        (shown, clicks_a, clicks_b), shows, clicks = logs(root)
        impressions = Stream.from_parquet(shown).with_watermark("time", delay="2s")
        a = Stream.from_parquet(clicks_a).with_watermark("time", delay="2s")
        b = Stream.from_parquet(clicks_b).with_watermark("time", delay="2s")
        out = []
        impressions.key_by("ad").join(a.union(b).key_by("ad"), how="left", between=("0s", "10s"),
                                      suffixes=("_shown", "_clicked"), name="attribution").sink(out.append)
        with streamlb.run(impressions, n_workers=2) as job:
            job.wait()
        got = pd.concat(out, ignore_index=True)
        want = expected(shows, clicks)
        cols = ["ad", "impression", "time_shown", "click", "time_clicked"]
        same = got[cols].sort_values(cols).reset_index(drop=True).equals(
            want[cols].sort_values(cols).reset_index(drop=True).astype(got[cols].dtypes.to_dict()))
        print(f"{len(got)} rows: {got.click.notna().sum()} clicks joined to their impression, "
              f"{got.click.isna().sum()} impressions never clicked; exact: {same}")
        assert same, "the join differs from pandas"


if __name__ == "__main__":
    main()
