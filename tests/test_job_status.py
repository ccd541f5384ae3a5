"""A job's visible state: a failure shows without wait(), errors name the operator, an
endless from_iterable is refused, and Ctrl-C stops a job without a traceback."""
import itertools
import time

import dask
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import PipelineError, StreamlbError


def endless():
    """``{"v": 0}, {"v": 1}, ...`` without end. The fuse fails the test (instead of
    filling memory) if the whole stream was read before anything ran."""
    for i in itertools.count():
        if i > 500_000:
            raise AssertionError("the endless iterable was read at planning, without a bound")
        yield {"v": i}


def test_an_endless_iterable_is_refused_naming_the_node(two_workers):
    src = Stream.from_iterable(endless())
    src.key_by("v").aggregate({"n": ("v", "count")}, name="counts")
    t0 = time.time()
    with dask.config.set({"streamlb.iterable-max-records": 10_000}):
        with pytest.raises(PipelineError) as info:
            streamlb.run(src, client=two_workers)
    message = str(info.value)
    assert "from_iterable" in message and "10000" in message.replace(",", "")
    assert "streamlb.iterable-max-records" in message
    assert "list" in message and "from_kafka_topic" in message and "watch=" in message
    assert time.time() - t0 < 20


def test_a_bounded_iterable_under_the_bound_runs(two_workers):
    items = [{"v": i % 7} for i in range(500)]
    src = Stream.from_iterable(iter(items))           # an iterator, not a list: read up to the bound
    src.key_by("v").aggregate({"n": ("v", "count")}, name="counts")
    with dask.config.set({"streamlb.iterable-max-records": 500}):
        with streamlb.run(src, client=two_workers) as job:
            job.wait(timeout=60)
            counts = job.state("counts")["n"]
    truth = pd.DataFrame(items).groupby("v").size()
    pd.testing.assert_series_equal(counts.sort_index(), truth.astype(counts.dtype), check_names=False)


OPERATOR_CALLS = {
    "state": lambda job: job.state("typo"),
    "state_size": lambda job: job.state_size("typo"),
    "imbalance": lambda job: job.imbalance("typo"),
    "load_trace": lambda job: job.load_trace("typo"),
    "parallelism": lambda job: job.parallelism("typo"),
    "routing": lambda job: job.routing("typo"),
    "rescale": lambda job: job.rescale("typo", 2),
    "migrate": lambda job: job.migrate("typo", [0], 0),
    "reassign": lambda job: job.reassign("typo", {0: 0}),
    "split": lambda job: job.split("typo", 1, [0]),
    "move_instance": lambda job: job.move_instance("typo", 0, "tcp://127.0.0.1:1"),
    "update": lambda job: job.update("typo", lambda s, r: (s, None)),
}


def test_an_unknown_operator_name_is_a_streamlb_error_listing_the_operators(two_workers, tmp_path):
    watched = tmp_path / "in"
    watched.mkdir()
    src = Stream.from_parquet(str(watched), watch=0.2)
    src.key_by("k").aggregate({"n": ("v", "count")}, name="counts")
    with streamlb.run(src, client=two_workers) as job:
        for method, call in OPERATOR_CALLS.items():
            with pytest.raises(StreamlbError) as info:
                call(job)
            # update names what can be updated: stateful_map operators and named map nodes
            listed = "updatable: " if method == "update" else "operators in this job: counts"
            assert "'typo'" in str(info.value) and listed in str(info.value), (method, info.value)
            # rescale and the like raise ReconfigurationError; every other one is also a KeyError
            assert isinstance(info.value, KeyError) or method in (
                "rescale", "move_instance", "update", "parallelism"), method
        assert job.status == "running"


def test_key_by_followed_by_map_says_what_is_valid(two_workers):
    src = Stream.from_iterable([{"key": 1, "v": 2}])
    src.key_by("key").map(lambda df: df)
    with pytest.raises(PipelineError) as info:
        streamlb.run(src, client=two_workers)
    message = str(info.value)
    assert "key_by('key')" in message and "followed by nothing" not in message
    assert "aggregate" in message and "stateful_map" in message and "window" in message
    assert ".map(f).key_by('key')" in message
