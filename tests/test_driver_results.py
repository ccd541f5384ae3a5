"""Results reach the driver while the job runs, through ``Job.results``; a sink whose function
holds a driver-side container is warned about when the job is planned.

Real worker processes (one module-scoped LocalCluster of two), exact against pandas.
"""
from __future__ import annotations

import collections
import os
import signal
import time
import warnings

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import PipelineError
from streamlb.planner import plan

ROWS = 12_000


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> tuple[str, pd.DataFrame]:
    """Two Parquet files of (key, value), 12,000 rows, 50 integer keys."""
    path = tmp_path_factory.mktemp("log")
    rng = np.random.default_rng(7)
    df = pd.DataFrame({"key": rng.integers(0, 50, ROWS), "value": rng.integers(0, 1_000, ROWS)})
    half = ROWS // 2
    df.iloc[:half].to_parquet(path / "a.parquet", index=False)
    df.iloc[half:].to_parquet(path / "b.parquet", index=False)
    return str(path), df


def _drain(job, sink) -> list[tuple[float, str, object]]:
    """``(arrival time, job status then, batch)`` for each item ``job.results(sink)`` yields."""
    return [(time.monotonic(), job.status, batch) for batch in job.results(sink)]


def test_results_arrive_while_the_job_runs(two_workers, log):
    path, df = log
    src = Stream.from_parquet(path, batch_size=500, rate=4_000)       # about 3 s of input
    updates = src.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")},
                                          name="totals").sink_to_list()
    with streamlb.run(src, client=two_workers) as job:
        got = _drain(job, updates)
        end = time.monotonic()
        assert job.status == "done"          # the iterator ends when the job ends
    running = [t for t, status, _ in got if status == "running"]
    assert running and end - min(running) > 1.0, "no result reached the driver well before the job ended"
    assert [b for _, _, b in got] == updates and len(updates) > 1
    last = pd.concat([b for _, _, b in got]).groupby(level=0).last()      # an update stream
    want = df.groupby("key")["value"].agg(n="count", total="sum")
    pd.testing.assert_frame_equal(last.sort_index(), want, check_names=False, check_dtype=False)
    assert last["total"].dtype == np.int64


def test_results_with_checkpoints_are_exactly_once(two_workers, log, tmp_path):
    path, df = log
    src = Stream.from_parquet(path, batch_size=500, rate=4_000)
    rows: list = []
    src.map(lambda b: b[b["value"] % 7 == 0]).sink(rows.append)         # a list sink, as sink_to_list
    job = streamlb.run(src, client=two_workers, checkpoint=str(tmp_path / "ck"), checkpoint_interval="300ms")
    got, committed = [], []
    with job:
        for batch in job.results(rows):      # each after the checkpoint that covers it completed
            got.append(batch)
            if job.status == "running":
                committed.append(len(job.checkpoints()))
    assert committed and min(committed) >= 1, "nothing came while the job ran, or before a checkpoint"
    out = pd.concat(got).sort_values(["key", "value"]).reset_index(drop=True)
    want = df[df["value"] % 7 == 0].sort_values(["key", "value"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(out, want)


def test_results_are_exactly_once_across_a_lost_worker(two_workers, log, tmp_path):
    """A worker SIGKILLed while the driver iterates: the job recovers from its last
    checkpoint inside the iteration, and every row comes exactly once."""
    path, df = log
    src = Stream.from_parquet(path, batch_size=500, rate=4_000)
    rows = src.map(lambda b: b[b["value"] % 3 == 0]).sink_to_list()
    job = streamlb.run(src, client=two_workers, checkpoint=str(tmp_path / "ck"), checkpoint_interval="300ms")
    got, victim = [], None
    with job:
        for batch in job.results(rows):
            got.append(batch)
            if victim is None:
                victim = sorted(set(job.workers_of.values()))[0]
                os.kill(two_workers.run(os.getpid)[victim], signal.SIGKILL)
        assert job.status == "done"
        recoveries = [h for h in job.history if h.get("kind") == "recovery"]
    assert len(recoveries) == 1 and recoveries[0]["lost_workers"] == [victim]
    out = pd.concat(got).sort_values(["key", "value"]).reset_index(drop=True)
    want = df[df["value"] % 3 == 0].sort_values(["key", "value"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(out, want)
    two_workers.wait_for_workers(2, timeout=60)     # the nanny restarts it, for the tests after


def test_results_names_the_sink(two_workers):
    src = Stream.from_iterable([pd.DataFrame({"key": [1, 2], "value": [3, 4]})])
    a = src.sink_to_list()
    b = src.map(lambda d: d.assign(value=d["value"] * 2)).sink_to_list()
    with streamlb.run(src, client=two_workers) as job:
        with pytest.raises(PipelineError, match="2 list sinks"):
            job.results()
        with pytest.raises(PipelineError, match="not a list sink of this job"):
            job.results([])
        assert [d["value"].tolist() for d in job.results(b)] == [[6, 8]]
        assert [d["value"].tolist() for d in job.results(a)] == [[3, 4]]


HELD: dict = {}


def test_warns_when_a_sink_closes_over_a_driver_container(two_workers):
    lst: list = []
    src = Stream.from_iterable([pd.DataFrame({"key": [1, 2], "value": [3, 4]})])
    src.sink(lambda df: lst.append(df), stream_name="collect")
    with pytest.warns(streamlb.StreamlbWarning) as seen:
        job = streamlb.run(src, client=two_workers)
    with job:
        job.wait()
    msg = str(seen[0].message)
    assert "'collect'" in msg and "'lst'" in msg and "list" in msg and "results" in msg, msg
    assert seen[0].filename == __file__          # points at the run() call
    assert lst == []                             # as the warning says: the worker had its own copy


def _planned(build) -> list[str]:
    src = Stream.from_iterable([{"key": 1, "value": 2}])
    build(src)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plan(src, workers=2, key_groups=8, batch_size=100)
    return [str(w.message) for w in seen if issubclass(w.category, streamlb.StreamlbWarning)]


def _default(df, acc=[]):      # noqa: B006 (the case warned about)
    acc.append(df)


def _global(df):
    HELD[len(HELD)] = df


@pytest.mark.parametrize("build, names", [
    (lambda s: s.sink(_default), ["'acc'", "list"]),
    (lambda s: s.sink(_global), ["'HELD'", "dict"]),
    (lambda s: s.sink(set().add), ["set"]),
    (lambda s: s.sink(collections.deque(maxlen=3).append), ["deque"]),
])
def test_warning_cases(build, names):
    msgs = _planned(build)
    assert len(msgs) == 1 and all(n in msgs[0] for n in names), msgs


@pytest.mark.parametrize("build", [
    lambda s: s.sink_to_list(),
    lambda s: s.sink([].append),
    lambda s: s.sink(print),
    lambda s: s.sink(lambda df: len(df)),
])
def test_no_warning_for_sinks_that_hold_nothing_of_the_driver(build):
    assert _planned(build) == []
