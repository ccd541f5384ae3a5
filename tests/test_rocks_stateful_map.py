"""``stateful_map`` with its state in RocksDB (``state_backend="rocksdb"``), on a LocalCluster
of 2 worker processes: exact against pandas through every migration strategy, and
savepoints restored across backends at another parallelism. (A SIGKILLed worker with the
state in RocksDB: tests/test_checkpoint.py.)"""
from __future__ import annotations

import os
import time

import dask
import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb

ROWS, FILES, KEYS, G = 40_000, 3, 2_000, 32
STRATEGIES = ["all-at-once", "fluid", "lazy", "pause", "batched"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Skewed keys in three Parquet files (strings: the RocksDB key encoding of text)."""
    root = tmp_path_factory.mktemp("smap-data")
    rng = np.random.default_rng(11)
    n = ROWS * FILES
    frame = pd.DataFrame({"key": np.char.add("u", (rng.zipf(1.3, n) % KEYS).astype(str)).astype(object),
                          "value": rng.integers(0, 100, n)})
    for i, part in enumerate(np.array_split(np.arange(n), FILES)):
        frame.iloc[part].to_parquet(root / f"part-{i}.parquet")
    return str(root), frame


def running(state, record):
    """Each key's count and sum; emits the count so far and the record's value."""
    n, s = state or (0, 0)
    return (n + 1, s + record["value"]), (n + 1, record["value"])


def build(path, parallelism, rate=None):
    src = Stream.from_parquet(path, batch_size=4_000, rate=rate)
    outs = src.key_by("key").stateful_map(running, name="running", parallelism=parallelism).sink_to_list()
    return src, outs


def check_state(job, frame) -> None:
    truth = frame.groupby("key")["value"].agg(["count", "sum"])
    state = job.state("running")["state"].sort_index()
    assert state.index.tolist() == truth.index.tolist()
    assert state.tolist() == list(zip(truth["count"].tolist(), truth["sum"].tolist()))


def check_outputs(outs, frame) -> None:
    """Each key's running counts 1..n once each, with the input's (key, value) pairs."""
    got = pd.concat(outs, ignore_index=True)
    assert len(got) == len(frame)
    pairs = pd.DataFrame({"key": got["key"].to_numpy(), "n": got["output"].map(lambda o: o[0]).to_numpy(),
                          "value": got["output"].map(lambda o: o[1]).to_numpy()})
    want = frame.groupby("key").size()
    by_key = pairs.groupby("key")["n"]
    pd.testing.assert_series_equal(by_key.nunique(), want, check_names=False)
    pd.testing.assert_series_equal(by_key.max(), want, check_names=False)
    ordered = lambda df: df.sort_values(["key", "value"], kind="stable").to_numpy()     # noqa: E731
    np.testing.assert_array_equal(ordered(pairs[["key", "value"]]), ordered(frame[["key", "value"]]))


@pytest.fixture(scope="module")
def warm(two_workers, data):
    """The workers have run a stateful_map job once (imports, RocksDB loaded), so the first
    timed job's moves come as early in its stream as the others'."""
    src, _ = build(data[0], 2)
    with streamlb.run(src, client=two_workers, key_groups=G, state_backend="rocksdb") as job:
        job.wait(timeout=120)
    return two_workers


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_exact_under_each_strategy(warm, data, strategy, tmp_path):
    """Key groups move while the stream runs; the states are in a database per instance,
    and every output and state is exact."""
    path, frame = data
    src, outs = build(path, 3, rate=8_000)       # 15 s of stream: a move, on a machine loaded 10x
    with dask.config.set({"streamlb.state.dir": str(tmp_path)}), \
            streamlb.run(src, client=warm, key_groups=G, migration=strategy, state_backend="rocksdb") as job:
        time.sleep(0.3)
        job.migrate("running", range(0, 8), 2, strategy=strategy)
        assert job.summary()["records"] < len(frame), "the stream ended before the moves"
        dbs = os.listdir(tmp_path)
        job.wait(timeout=120)
        assert len(dbs) >= 3 and all(d.startswith("running-") for d in dbs), dbs
        assert sum(job.state_size("running").values()) == frame["key"].nunique()
        check_state(job, frame)
        check_outputs(outs, frame)
        assert "migration" in {h.get("kind", "migration") for h in job.history}


@pytest.mark.parametrize("first, second", [("memory", "rocksdb"), ("rocksdb", "memory")])
def test_a_savepoint_restores_across_state_backends(two_workers, data, tmp_path, first, second):
    """A savepoint taken with one backend restores into the other at another parallelism,
    and the job ends exact."""
    path, frame = data
    src, _ = build(path, 2, rate=60_000)
    with streamlb.run(src, client=two_workers, key_groups=G, state_backend=first) as job:
        time.sleep(0.8)
        sp = job.savepoint(str(tmp_path / "sp"))
    restored, _ = build(path, 3)
    with streamlb.run(restored, client=two_workers, key_groups=G, state_backend=second, restore=sp) as job:
        job.wait(timeout=120)
        assert 0 < job.summary()["records"] < len(frame)   # only what came after the savepoint
        check_state(job, frame)


def test_exact_across_a_live_rescale_3_2_3(warm, data, tmp_path):
    """The operator rescales 3 -> 2 -> 3 while the stream runs, its states in a database per
    instance: every state and output exact, each rescale in the job's history. (The stream
    is paced to 30 s; each rescale comes once 8-12k more records are read, so both move state
    and are done before the stream ends on a loaded machine.)"""
    path, frame = data
    src, outs = build(path, 3, rate=4_000)
    with dask.config.set({"streamlb.state.dir": str(tmp_path)}), \
            streamlb.run(src, client=warm, key_groups=G, state_backend="rocksdb") as job:
        _read_past(job, 12_000)
        job.rescale("running", 2)
        mid = _read_past(job, job.summary()["records"] + 8_000)
        job.rescale("running", 3)
        late = job.summary()["records"]
        print(f"records at the rescales: {mid:,} and {late:,} of {len(frame):,}")
        assert late < len(frame), "the stream ended before the rescales"
        job.wait(timeout=120)
        rescales = [(h["from"], h["to"]) for h in job.history if h.get("kind") == "rescale"]
        assert rescales == [(3, 2), (2, 3)], job.history
        assert sum(job.state_size("running").values()) == frame["key"].nunique()
        check_state(job, frame)
        check_outputs(outs, frame)


def _read_past(job, records: int, timeout: float = 60) -> int:
    """The job's records read once past ``records`` (polled)."""
    deadline = time.time() + timeout
    while (n := job.summary()["records"]) < records and time.time() < deadline:
        time.sleep(0.1)
    return n
