"""Errors that need only the graph come before any cluster is reached (issue 46, item 10).

``streamlb.run`` with an ``address`` where no scheduler listens: a check made before
connecting raises the graph's error, a check made after would raise
``SchedulerUnreachableError`` instead. With ``address=None``, no ``LocalCluster`` may start.
"""
from __future__ import annotations

import threading

import dask.config
import distributed
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.exceptions import (InputPathError, PipelineError, SchedulerUnreachableError, SchemaError,
                                 UnpicklableFunctionError)

from conftest import free_port

SPEC = {"n": ("value", "count"), "total": ("value", "sum")}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two small Parquet files of ``key, value, t`` and the same rows as the ground truth."""
    path = tmp_path_factory.mktemp("preflight") / "d"
    path.mkdir()
    df = pd.DataFrame({"key": [i % 7 for i in range(400)], "value": range(400),
                       "t": pd.date_range("2026-01-01", periods=400, freq="100ms")})
    df.iloc[:200].to_parquet(path / "part-0.parquet", index=False)
    df.iloc[200:].to_parquet(path / "part-1.parquet", index=False)
    return str(path), df


@pytest.fixture(scope="module")
def nowhere():
    """The address of a port nobody listens on, and a short wait for it (a run that
    connected first would fail with SchedulerUnreachableError after it)."""
    with dask.config.set({"streamlb.connect-timeout": "2s"}):
        yield f"tcp://127.0.0.1:{free_port()}"


def _missing_path(path):
    return Stream.from_parquet(path + "-absent")


def _wrong_column(path):
    src = Stream.from_parquet(path)
    src.key_by("key").aggregate({"n": ("valu", "count")}, name="agg")
    return src


def _window_without_watermark(path):
    src = Stream.from_parquet(path)
    src.key_by("key").window(size="1s").aggregate(SPEC, name="w")
    return src


def _unsupported_node(path):
    src = Stream.from_parquet(path)
    src.sliding_window(2).sink(print)
    return src


def _duplicate_names(path):
    src = Stream.from_parquet(path)
    src.key_by("key").aggregate(SPEC, name="agg")
    src.key_by("key").aggregate(SPEC, name="agg")
    return src


def _unpicklable_function(path):
    lock = threading.Lock()
    src = Stream.from_parquet(path)
    src.map(lambda df: (lock, df)[1]).sink(print)
    return src


GRAPH_ERRORS = [
    (_missing_path, InputPathError, "does not exist"),
    (_wrong_column, SchemaError, "needs column 'valu'"),
    (_window_without_watermark, PipelineError, "needs event time"),
    (_unsupported_node, PipelineError, "is not supported by streamlb"),
    (_duplicate_names, PipelineError, "two operators are named 'agg'"),
    (_unpicklable_function, UnpicklableFunctionError, "cannot be pickled"),
]


@pytest.mark.parametrize("graph, error, match", GRAPH_ERRORS, ids=[g.__name__[1:] for g, _, _ in GRAPH_ERRORS])
def test_a_graph_error_comes_before_connecting(data, nowhere, graph, error, match):
    with pytest.raises(error, match=match) as info:
        streamlb.run(graph(data[0]), address=nowhere, n_workers=2)
    assert not isinstance(info.value, SchedulerUnreachableError)


def test_a_graph_error_starts_no_cluster(data, monkeypatch):
    def no_cluster(*args, **kwargs):
        raise AssertionError("run() started a LocalCluster for a graph that cannot run")

    monkeypatch.setattr(distributed, "LocalCluster", no_cluster)
    with pytest.raises(SchemaError, match="needs column 'valu'"):
        streamlb.run(_wrong_column(data[0]), n_workers=2)


def test_a_valid_graph_still_reaches_for_the_scheduler(data, nowhere):
    src = Stream.from_parquet(data[0])
    src.key_by("key").aggregate(SPEC, name="agg")
    with pytest.raises(SchedulerUnreachableError, match=nowhere):
        streamlb.run(src, address=nowhere)


@pytest.fixture(scope="module")
def cluster():
    """One LocalCluster of 2 worker processes for the jobs of this module."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cl:
        yield cl


def test_a_generator_is_read_once_for_both_plans(cluster):
    """The check before connecting plans the graph once, the real plan on the workers again:
    the records of a generator must reach the job all the same."""
    rows = [{"key": i % 3, "value": i} for i in range(30)]
    src = Stream.from_iterable(r for r in rows)
    src.key_by("key").aggregate(SPEC, name="agg")
    with streamlb.run(src, address=cluster.scheduler_address) as job:
        job.wait(timeout=60)
        got = job.state("agg")
    want = pd.DataFrame(rows).groupby("key").agg(n=("value", "count"), total=("value", "sum"))
    pd.testing.assert_frame_equal(got.sort_index(), want, check_names=False, check_dtype=False)
