"""Every error names the thing involved and says what would be valid."""
import os
import threading

import pandas as pd
import pytest
from streamz import Stream

import streamlb
from conftest import free_port
from streamlb import (InputPathError, JavaNotFoundError, KeyTypeError, PipelineError,
                      SchedulerUnreachableError, SchemaError, UnpicklableFunctionError,
                      UserFunctionError)


@pytest.fixture
def small_parquet(tmp_path):
    df = pd.DataFrame({"key": [1, 2, 3, 1], "value": [1.0, 2.0, 3.0, 4.0], "price": [0.5] * 4})
    path = tmp_path / "in"
    path.mkdir()
    df.to_parquet(path / "part-0.parquet", index=False)
    return str(path)


def test_missing_column_is_named_before_the_job_starts(client, small_parquet):
    src = Stream.from_parquet(small_parquet)
    src.key_by("key").aggregate({"total": ("amount", "sum")}, name="totals")
    with pytest.raises(SchemaError, match=r"'totals' needs column 'amount'.*columns there: key, value, price"):
        streamlb.run(src, client=client)


def test_missing_cost_column_is_named_before_the_job_starts(client, small_parquet):
    src = Stream.from_parquet(small_parquet)
    src.rebalance(cost="seconds").sink(print)
    with pytest.raises(SchemaError, match=r"'rebalance' needs column 'seconds'.*columns there: key, value, price"):
        streamlb.run(src, client=client)


def test_missing_key_column_at_run_time_is_named(client):
    src = Stream.from_iterable([{"k": 1, "v": 2}])
    src.map(lambda df: df.rename(columns={"k": "kk"})).key_by("k").aggregate({"n": ("v", "count")}, name="agg")
    with streamlb.run(src, client=client) as job:
        with pytest.raises(SchemaError, match=r"'agg' keys by column 'k'.*columns: kk, v"):
            job.wait(timeout=60)


def test_unpicklable_function_names_operator_and_function(client, small_parquet):
    lock = threading.Lock()

    def tally(state, record):
        with lock:
            return (state or 0) + 1, None

    src = Stream.from_parquet(small_parquet)
    src.key_by("key").stateful_map(tally, name="tally")
    with pytest.raises(UnpicklableFunctionError, match=r"operator 'tally': function .*tally cannot be pickled"):
        streamlb.run(src, client=client)


def test_float_key_column_is_refused_before_start(client, small_parquet):
    src = Stream.from_parquet(small_parquet)
    src.key_by("price").aggregate({"n": ("value", "count")}, name="by_price")
    with pytest.raises(KeyTypeError,
                       match=r"'by_price': key column 'price' has type double.*integers, booleans and strings"):
        streamlb.run(src, client=client)


def test_unhashable_key_from_a_function_fails_the_job_naming_it(client):
    src = Stream.from_iterable([{"v": 1.5}])
    src.key_by(lambda df: df.v, name="vk").aggregate({"n": ("v", "count")}, name="agg")
    with streamlb.run(src, client=client) as job:
        with pytest.raises(KeyTypeError, match=r"key 'vk' has dtype float64"):
            job.wait(timeout=60)


def test_unreachable_scheduler_names_the_address(small_parquet):
    address = f"tcp://127.0.0.1:{free_port()}"
    src = Stream.from_parquet(small_parquet)
    src.key_by("key").aggregate({"n": ("value", "count")})
    with pytest.raises(SchedulerUnreachableError, match=f"no Dask scheduler answered at '{address}'"):
        with pytest.MonkeyPatch.context() as mp:
            import dask

            mp.setitem(dask.config.config, "streamlb", {**dask.config.get("streamlb"), "connect-timeout": "2s"})
            streamlb.run(src, address=address)


def test_absent_and_empty_input_paths_are_named(client, tmp_path):
    absent = str(tmp_path / "nowhere")
    src = Stream.from_parquet(absent)
    src.key_by("key").aggregate({"n": ("value", "count")})
    with pytest.raises(InputPathError, match=f"input path '{absent}' does not exist"):
        streamlb.run(src, client=client)
    empty = tmp_path / "empty"
    empty.mkdir()
    src = Stream.from_parquet(str(empty))
    src.key_by("key").aggregate({"n": ("value", "count")})
    with pytest.raises(InputPathError, match=f"input path '{empty}' holds no \\*.parquet files"):
        streamlb.run(src, client=client)


def test_pyspark_without_java_is_named(monkeypatch, tmp_path):
    from streamlb import datasets

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(JavaNotFoundError, match="JAVA_HOME is .*no-jdk.*does not exist"):
        datasets.check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="PySpark needs Java 17 or newer and no `java` is on PATH"):
        datasets.check_java()


def test_bad_specs_list_what_is_valid():
    src = Stream.from_iterable([])
    with pytest.raises(PipelineError, match="asks for 'median'; valid aggregations are count, sum, min, max, mean"):
        src.key_by("k").aggregate({"m": ("v", "median")})
    with pytest.raises(PipelineError, match="aggregate 'x' needs a keyed input: put .key_by"):
        src = Stream.from_iterable([])
        src.aggregate({"n": ("v", "count")}, name="x")
        streamlb.planner.plan(src, workers=1, key_groups=16, batch_size=10)
    with pytest.raises(PipelineError, match=r"aggregate: cost must be None, a number of seconds per record >= 0, "
                                            r"or the name of a column of seconds per record, got -1"):
        src.key_by("k").aggregate({"n": ("v", "count")}, cost=-1)
    with pytest.raises(PipelineError, match="item 0 is a int"):
        s2 = Stream.from_iterable([1, 2])
        s2.key_by("k").aggregate({"n": ("v", "count")})
        streamlb.planner.plan(s2, workers=1, key_groups=16, batch_size=10)


def boom(state, record):
    if record["key"] == 3:
        raise ValueError("bad record")
    return state, None


def test_user_function_error_names_operator_function_and_record(client, small_parquet, tmp_path):
    out = str(tmp_path / "out")
    src = Stream.from_parquet(small_parquet)
    src.key_by("key").stateful_map(boom, parallelism=1, name="explode").to_parquet(out)
    with streamlb.run(src, client=client) as job:
        with pytest.raises(UserFunctionError) as info:
            job.wait(timeout=60)
    err = info.value
    assert "'explode'" in str(err) and "boom" in str(err) and "ValueError: bad record" in str(err)
    assert err.operator == "explode" and err.function.endswith("boom")
    assert err.record == {"key": 3, "value": 3.0, "price": 0.5}
    # nothing half-written looks complete: no _SUCCESS, no part files
    assert not os.path.exists(os.path.join(out, "_SUCCESS"))
    assert not [f for f in (os.listdir(out) if os.path.exists(out) else []) if f.endswith(".parquet")]


def test_bad_records_go_to_dead_letters_and_the_job_goes_on(client):
    records = [
        {"user": "ann", "amount": 5}, {"user": None, "amount": 1}, {"user": "bob", "amount": "7"},
        {"user": 42, "amount": 2}, {"user": "ann", "amount": "lots"}, {"user": "bob", "amount": 3},
    ]
    src = Stream.from_iterable(records)
    src.key_by("user").aggregate({"total": ("amount", "sum"), "n": ("amount", "count")}, name="spend")
    with streamlb.run(src, client=client, batch_size=2) as job:
        job.wait(timeout=60)
        state = job.state("spend")
        dead = job.dead_letters()
        assert job.summary()["dead_letters"] == 3
    good = pd.DataFrame([records[i] for i in (0, 2, 5)]).astype({"amount": float})
    want = good.groupby("user").agg(total=("amount", "sum"), n=("amount", "count"))
    pd.testing.assert_frame_equal(state, want, check_dtype=False)
    assert sorted(dead.reason) == sorted([
        "key 'user' is null",
        "key 'user' is int 42; this column's keys are strings",
        "column 'amount' holds 'lots', not a number",
    ])
    assert {r["amount"] for r in dead.record} == {1, 2, "lots"}
    assert set(dead.operator) == {"spend"}


def _shipped(x):
    return x + 1


def test_shipping_a_function_keeps_the_users_own_pickle_by_value_registration():
    """A module the user registered with cloudpickle to pickle by value stays registered
    after streamlb ships one of its functions (streamlb undoes only its own registration),
    and one streamlb registered for shipping is unregistered again."""
    import sys

    import cloudpickle

    from streamlb._functions import UserFunction

    name = __name__
    cloudpickle.register_pickle_by_value(sys.modules[name])
    try:
        assert UserFunction(_shipped).payload()
        assert name in cloudpickle.list_registry_pickle_by_value()
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[name])
    assert cloudpickle.loads(UserFunction(_shipped).payload())(1) == 2
    assert name not in cloudpickle.list_registry_pickle_by_value()


def test_a_worker_restarted_for_its_memory_is_named_with_the_limit_and_rocksdb(tmp_path):
    """Keyed state past the workers' memory limit: the nanny restarts the worker, and the
    job's error says so (the limit, the keys held there) and names state_backend='rocksdb'."""
    import numpy as np
    from distributed import Client, LocalCluster

    from streamlb import JobFailedError

    keys = np.random.default_rng(0).permutation(6_000_000)
    path = tmp_path / "distinct"
    path.mkdir()
    for i, part in enumerate(np.array_split(keys, 6)):
        pd.DataFrame({"key": part, "value": part % 7}).to_parquet(path / f"part-{i}.parquet", index=False)
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="450MiB", dashboard_address=":0",
                      silence_logs=50) as cl, Client(cl) as c:
        src = Stream.from_parquet(str(path))
        src.key_by("key").aggregate({"n": ("value", "count")}, name="totals")
        job = streamlb.run(src, client=c)
        with pytest.raises(JobFailedError) as info:
            job.wait(timeout=120)
        job.stop()
    msg = str(info.value)
    assert "exceeding its memory limit" in msg and "memory_limit 0.44 GiB" in msg, msg
    assert "state_backend='rocksdb'" in msg, msg
