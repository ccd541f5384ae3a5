"""The NEXMark queries on streamlb, exact against PySpark batch SQL over the same tables
(streamlb.nexmark._truth), on LocalCluster worker processes."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import nexmark
from streamlb.nexmark import _truth

pytestmark = pytest.mark.spark


def sources(path, **kw):
    return [Stream.from_parquet(os.path.join(path, t), **kw) for t in ("person", "auction", "bid")]


def result(query: str, frames: list) -> pd.DataFrame:
    """The query's output: every row, or for an update stream the last row per key."""
    got = pd.concat(frames, ignore_index=True)
    key = nexmark.UPDATE_KEYS.get(query)
    if key is not None:
        got = got.groupby(key, sort=False).tail(1)
    return got


def same(query: str, got: pd.DataFrame, want: pd.DataFrame) -> None:
    if query == "q12":          # processing-time windows: their totals per bidder
        assert list(got.columns) == ["bidder", "bid_count", "starttime", "endtime"]
        got = got.groupby("bidder", as_index=False).bid_count.sum()
    assert list(got.columns) == list(want.columns), (query, list(got.columns), list(want.columns))
    got = got.copy()
    for c in got.columns:
        if pd.api.types.is_datetime64_any_dtype(got[c]):
            got[c] = got[c].astype("datetime64[ns]")
    cols = list(want.columns)
    got = got.sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, check_exact=True)


def run_query(client, path, query, **run_kw):
    person, auction, bid = sources(path)
    out = []
    nexmark.QUERIES[query](person, auction, bid).sink(out.append)
    roots = [s for s in (person, auction, bid) if s.downstreams]
    with streamlb.run(roots[0], client=client, **run_kw) as job:
        job.wait(timeout=120)
    return result(query, out), job


@pytest.fixture(scope="module")
def truths(spark, nexmark_path):
    return {q: _truth.truth(q, nexmark_path, spark) for q in _truth.queries()}


@pytest.mark.parametrize("query", list(nexmark.QUERIES))
def test_query_matches_pyspark(two_workers, nexmark_path, truths, query):
    got, _ = run_query(two_workers, nexmark_path, query, balancer="static")
    assert len(got), f"{query} emitted nothing"
    same(query, got, truths[query])
