"""The NEXMark queries on streamlb, exact against PySpark batch SQL over the same tables
(streamlb.nexmark._truth), on LocalCluster worker processes."""
from __future__ import annotations

import os

import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import nexmark
from streamlb.nexmark import _truth
from streamlb.nexmark._check import result, same

pytestmark = pytest.mark.spark


def sources(path, **kw):
    return [Stream.from_parquet(os.path.join(path, t), **kw) for t in ("person", "auction", "bid")]


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


# -- live: autoflow, rescale, a SIGKILLed worker ---------------------------------------------
def paced_sources(path, seconds=3.0, **kw):
    """The three tables replayed open loop over about ``seconds`` (each at its share of the
    events), so balancers and rescales act while the query runs."""
    import pyarrow.parquet as pq

    out = []
    for t in ("person", "auction", "bid"):
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in _files(os.path.join(path, t)))
        out.append(Stream.from_parquet(os.path.join(path, t), rate=max(rows / seconds, 1.0), batch_size=200, **kw))
    return out


def _files(path):
    from streamlb.planner import parquet_files

    return parquet_files(path)


def run_live(client, path, query, during=None, seconds=3.0, **run_kw):
    person, auction, bid = paced_sources(path, seconds)
    out = []
    nexmark.QUERIES[query](person, auction, bid).sink(out.append)
    roots = [s for s in (person, auction, bid) if s.downstreams]
    with streamlb.run(roots[0], client=client, key_groups=64, **run_kw) as job:
        if during is not None:
            during(job)
        job.wait(timeout=180)
    return result(query, out), job


@pytest.mark.parametrize("query", ["q3", "q5", "q8"])
def test_queries_exact_while_autoflow_balances(two_workers, nexmark_path, truths, query):
    got, job = run_live(two_workers, nexmark_path, query, balancer="autoflow", window=0.2)
    moves = [h for h in job.history if "kind" not in h]
    assert moves, "autoflow moved nothing"
    same(query, got, truths[query])


@pytest.mark.parametrize("query, operators", [("q4", ["closing_join", "closing"]), ("q8", ["q8_join"])])
def test_queries_exact_across_live_rescales_of_their_join_and_window_operators(two_workers, nexmark_path, truths,
                                                                               query, operators):
    import time

    def rescale(job):
        for n in (4, 3):
            time.sleep(0.6)
            for op in operators:        # the default strategy, lazy
                job.rescale(op, n)
        assert all(job.parallelism(op) == 3 for op in operators)

    # q4: lazy rescales of two operators, twice: a longer stream (12 s: its batch closing keeps
    # up with the paced input), so it does not end first (not
    # for q8: its person files are one 200-row batch each, which then comes after the 5 s
    # idle timeout, and all of it late)
    got, job = run_live(two_workers, nexmark_path, query, during=rescale, seconds=12.0 if query == "q4" else 3.0,
                        balancer="static")
    assert {h["kind"] for h in job.history if "kind" in h} >= {"rescale"}
    same(query, got, truths[query])


@pytest.mark.cluster
def test_a_query_outputs_exactly_once_across_a_sigkill(nexmark_path, truths, tmp_path):
    import time

    from distributed import Client

    from conftest import dask_cli_cluster
    from test_checkpoint import _kill_one

    with dask_cli_cluster(workers=3) as address, Client(address) as c:
        c.wait_for_workers(3, timeout=60)
        person, auction, bid = paced_sources(nexmark_path)
        nexmark.q8(person, auction, bid).to_parquet(str(tmp_path / "out"))
        job = streamlb.run(person, client=c, checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3)
        time.sleep(1.0)
        victim = _kill_one(c, job)
        job.wait(timeout=180)
        recoveries = [h for h in job.history if h.get("kind") == "recovery"]
        assert len(recoveries) == 1 and recoveries[0]["lost_workers"] == [victim]
        job.stop()
    same("q8", pd.read_parquet(tmp_path / "out"), truths["q8"])
