"""Errors that need only the graph come before any cluster is reached (issue 46, item 10);
every duration of the API follows one rule (item 17).

``streamlb.run`` with an ``address`` where no scheduler listens: a check made before
connecting raises the graph's error, a check made after would raise
``SchedulerUnreachableError`` instead. With ``address=None``, no ``LocalCluster`` may start.

Durations (docs/configuration.md, "Durations"): a number is seconds, a string carries its
unit, a timedelta is taken as it is; never in the ``unit=`` of an integer event-time column.
"""
from __future__ import annotations

import datetime
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
    df["ms"] = df.t.astype("int64") // 1_000_000       # the same event time, integer milliseconds
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


TEN_S = 10 * 10**9


@pytest.mark.parametrize("ten", [10, 10.0, "10", "10s", "10000ms", datetime.timedelta(seconds=10), pd.Timedelta("10s")],
                         ids=repr)
def test_every_duration_takes_a_number_as_seconds(data, ten):
    src = Stream.from_parquet(data[0], watch=ten)
    assert src.watch == 10.0
    wm = src.with_watermark("t", delay=ten, idle_timeout=ten)
    assert (wm.delay, wm.idle_timeout) == (TEN_S, TEN_S)
    win = wm.key_by("key").window(size=ten, slide=ten, lateness=ten)
    assert (win.size, win.slide, win.lateness) == (TEN_S, TEN_S, TEN_S)
    assert wm.key_by("key").window(gap=ten).gap == TEN_S
    left, right = wm.key_by("key"), Stream.from_parquet(data[0]).with_watermark("t").key_by("key")
    joined = left.join(right, between=(-ten if isinstance(ten, (int, float)) else "-10s", ten))
    assert (joined.between, left.join(right, ttl=ten).ttl) == ((-TEN_S, TEN_S), TEN_S)
    from streamlb._job import RunOptions

    options = RunOptions.build(window=ten, checkpoint_interval=ten)
    assert (options.window, options.checkpoint_interval) == (10.0, 10.0)
    with dask.config.set({"streamlb.window": ten}):
        assert RunOptions.build().window == 10.0


@pytest.mark.parametrize("bad", [True, "soon", float("nan"), -1, "0s", [10]], ids=repr)
def test_a_value_that_is_no_duration_is_refused_naming_the_argument(bad):
    with pytest.raises(PipelineError, match=r"window: size: .* is not a positive duration; give seconds as a number"):
        Stream.from_iterable([]).key_by("key").window(size=bad)
    with pytest.raises(PipelineError, match=r"run\(window=.*\): window must be a duration > 0"):
        streamlb.run(Stream.from_iterable([]), window=bad)


def test_a_bare_number_is_seconds_over_an_integer_event_time(cluster, data):
    """``window(size=10)`` over event times in integer milliseconds: windows of 10 s
    (10,000 of the column's units), exact against pandas; ``wait`` takes a duration too."""
    path, df = data
    src = Stream.from_parquet(path).with_watermark("ms", unit="ms", delay=0.5)
    out = []
    src.key_by("key").window(size=10).aggregate(SPEC, name="w").sink(out.append)
    with streamlb.run(src, address=cluster.scheduler_address, window=0.5) as job:
        job.wait(timeout="2min")
    got = pd.concat(out, ignore_index=True)[["key", "window_start", "window_end", "n", "total"]]
    start = df.ms // 10_000 * 10_000
    want = (df.assign(window_start=start, window_end=start + 10_000)
            .groupby(["key", "window_start", "window_end"], as_index=False)
            .agg(n=("value", "count"), total=("value", "sum")))
    pd.testing.assert_frame_equal(got.sort_values(["key", "window_start"]).reset_index(drop=True), want,
                                  check_dtype=False)
