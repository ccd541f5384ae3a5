"""A keyed operator's first routing table from a sample of its keys (streamlb/_skew.py):
where it applies it spreads a skewed log's records about evenly, where it does not the
equal ranges stay, and a job on the planned table is exact."""
from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.planner._skew import first_tables
from streamlb.keygroups import assign_to_key_group
from streamlb.planner import plan
from streamlb.routing import RoutingTable

G = 256


def count(state, record):
    return (state or 0) + 1, None


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """A log in 4 files where key 7 is 30% of the records (the rest Zipf over 5,000 keys)."""
    rng = np.random.default_rng(11)
    n = 80_000
    keys = np.where(rng.random(n) < 0.3, 7, rng.zipf(1.1, n) % 5_000)
    df = pd.DataFrame({"key": keys, "value": rng.integers(0, 100, n).astype(float)})
    path = tmp_path_factory.mktemp("skewed")
    for i in range(4):
        df.iloc[i::4].to_parquet(path / f"part-{i}.parquet")
    return str(path), df


def _shares(table: RoutingTable, df: pd.DataFrame) -> np.ndarray:
    """Each instance's share of the log's records under ``table``."""
    groups = assign_to_key_group(df.key.to_numpy(), G)
    return np.bincount(table.owners[groups], minlength=table.parallelism) / len(df)


def _first(build, path: str, parallelism: int = 2) -> RoutingTable:
    src = Stream.from_parquet(path)
    build(src)
    p = plan(src, workers=2, key_groups=G, batch_size=65_536, parallelism=parallelism)
    (table,) = first_tables(p.stages, G).values()
    return table


def test_a_stateful_map_read_from_parquet_gets_its_records_spread_evenly(skewed):
    path, df = skewed
    groups = assign_to_key_group(df.key.to_numpy(), G)
    floor = np.bincount(groups).max() / len(df)         # the hot key's group, on one instance
    equal = _shares(RoutingTable.initial(G, 2), df)
    assert equal.max() > 0.6                            # the hot key's range holds most
    for parallelism in (2, 3):
        planned = _shares(_first(lambda s: s.key_by("key").stateful_map(count), path, parallelism), df)
        # no instance over the even share, or the hot group alone, by more than 3 points
        assert planned.max() < max(1 / parallelism, floor) + 0.03, (parallelism, floor, planned)


def test_the_equal_ranges_stay_where_a_sample_would_not_say_what_the_operator_gets(skewed):
    path, _ = skewed
    equal = RoutingTable.initial(G, 2).owners.tolist()
    cases = {
        "summed per key": lambda s: s.key_by("key").aggregate({"n": ("value", "count")}),
        "a step before": lambda s: s.map(lambda b: b.assign(key=b.key + 1)).key_by("key").stateful_map(count),
        "a key function": lambda s: s.key_by(lambda b: b.key % 3, name="k3").stateful_map(count),
    }
    for what, build in cases.items():
        assert _first(build, path).owners.tolist() == equal, what
    with dask.config.set({"streamlb.exchange.sample-keys": 0}):
        assert _first(lambda s: s.key_by("key").stateful_map(count), path).owners.tolist() == equal


def test_a_job_on_the_planned_table_is_exact_and_even(two_workers, skewed):
    path, df = skewed
    src = Stream.from_parquet(path)
    src.key_by("key").stateful_map(count, name="counts")
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        job.wait(timeout=120)
        got = job.state("counts")["state"]
        m = job.metrics()
    want = df.groupby("key").size()
    assert got.sort_index().tolist() == want.tolist() and got.index.sort_values().tolist() == want.index.tolist()
    per = m[m.operator == "counts"].groupby("instance").records.sum()
    assert per.sum() == len(df) and per.max() / len(df) < 0.53, per.tolist()
