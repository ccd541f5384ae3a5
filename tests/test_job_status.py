"""A job's visible state: a failure shows without wait(), errors name the operator, an
endless from_iterable is refused, and Ctrl-C stops a job without a traceback."""
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time

import dask
import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import PipelineError, StreamlbError, UserFunctionError


def write(directory, name: str, frame: pd.DataFrame) -> None:
    """A file appears whole in a watched directory: written aside, then renamed."""
    frame.to_parquet(os.path.join(directory, f"_tmp-{name}"), index=False)
    os.replace(os.path.join(directory, f"_tmp-{name}"), os.path.join(directory, name))


def until(predicate, timeout: float, what) -> None:
    """Wait for ``predicate()``; fail saying ``what()`` was awaited if it is not within ``timeout``."""
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"not within {timeout}s: {what() if callable(what) else what}"
        time.sleep(0.1)


def refuse_13(state, record):
    if record["v"] == 13:
        raise ValueError("unlucky 13")
    return (state or 0) + 1, None


def test_a_failure_shows_in_status_and_error_without_wait(two_workers, tmp_path):
    watched = tmp_path / "in"
    watched.mkdir()
    rng = np.random.default_rng(4)
    good = pd.DataFrame({"k": rng.integers(0, 20, 2_000), "v": rng.integers(100, 1000, 2_000)})
    src = Stream.from_parquet(str(watched), watch=0.2)
    src.key_by("k").aggregate({"n": ("v", "count")}, name="counts")
    src.key_by("k").stateful_map(refuse_13, name="explode")
    job = streamlb.run(src, client=two_workers)
    try:
        write(watched, "good.parquet", good)
        truth = good.groupby("k").size()
        until(lambda: job.state("counts")["n"].sum() == len(good), 30, "the first file counted")
        assert job.status == "running" and job.error is None
        write(watched, "bad.parquet", pd.DataFrame({"k": [1, 2, 3], "v": [7, 13, 8]}))
        until(lambda: job.status == "failed", 20, lambda: f"status 'failed' (it is {job.status!r})")
        err = job.error
        assert isinstance(err, UserFunctionError)
        assert "'explode'" in str(err) and "refuse_13" in str(err) and "unlucky 13" in str(err)
        assert err.operator == "explode" and err.function.endswith("refuse_13")
        # the other instances stopped: a file written now is never read
        write(watched, "late.parquet", good)
        time.sleep(1.5)
        counts = job.state("counts")["n"]
        # the bad file's rows may or may not have reached the aggregate before it stopped
        bad_counted = counts.sum() - len(good)
        assert bad_counted in (0, 3)
        expected = truth.add(pd.Series(1, index=[1, 2, 3]), fill_value=0) if bad_counted else truth
        pd.testing.assert_series_equal(counts.sort_index(), expected.astype(counts.dtype).sort_index(),
                                       check_names=False)
        with pytest.raises(UserFunctionError):
            job.wait(timeout=5)
    finally:
        job.stop()


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


CTRL_C_JOB = textwrap.dedent("""
    import os, signal, sys, threading, time
    import numpy as np
    import pandas as pd
    from streamz import Stream
    import streamlb

    address, watched, busy = sys.argv[1:]
    pd.DataFrame({"k": np.arange(1000) % 10, "v": 1}).to_parquet(watched + "/a.parquet")
    src = Stream.from_parquet(watched, watch=0.05)
    src.key_by("k").aggregate({"n": ("v", "count")}, name="counts")
    job = streamlb.run(src, address=address)
    print("running", flush=True)
    if busy == "busy":
        # the client's event loop is busy (as with an embedded scheduler at work) when Ctrl-C
        # comes: the wait's next call to the cluster is queued behind it
        job.client.loop.add_callback(time.sleep, 1.5)
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        job.wait()
    except KeyboardInterrupt:
        print("interrupted", job.status, flush=True)
""")


@pytest.mark.parametrize("busy", ["busy", "idle"])
def test_ctrl_c_in_wait_stops_the_job_without_a_traceback(two_workers, tmp_path, busy):
    """distributed's ``sync`` (2026.8) interrupted before the loop ran its call logs an ERROR
    with a NameError traceback ("cannot access free variable 'future'"): a busy loop makes
    that certain at b858ae2; the wait must take Ctrl-C between calls instead."""
    script = tmp_path / "job.py"
    script.write_text(CTRL_C_JOB)
    watched = tmp_path / "in"
    watched.mkdir()
    # the streamlb this test imports (a checkout's, run from it), not only the installed one
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(streamlb.__file__))}
    proc = subprocess.Popen([sys.executable, str(script), two_workers.scheduler.address, str(watched), busy],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path), env=env)
    try:
        assert proc.stdout.readline().strip() == "running"
        if busy == "idle":
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.strip() == "interrupted stopped", (out, err)
    noise = [line for line in err.splitlines() if "Traceback" in line or "ERROR" in line or "free variable" in line]
    assert not noise, err
