"""``Job.drain``: a graceful stop of an unbounded job (Flink's ``stop``), with and without a
savepoint. Jobs on LocalCluster worker processes read a watched directory (and a Kafka
topic); once drained, what `to_parquet` committed is exact against pandas over what was
read, each record once, and a job restored from the drain's savepoint goes on after it:
the two runs' outputs together are exact over every input, each record once."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import CheckpointError, StreamlbError
from streamlb._checkpoint._manifest import read_manifest

SPEC = {"n": ("value", "count"), "total": ("value", "sum")}
S = 1_000_000_000


def _frame(i: int, rows: int = 4_000) -> pd.DataFrame:
    rng = np.random.default_rng(i)
    keys = np.where(rng.random(rows) < 0.3, rng.integers(0, 3, rows), rng.integers(0, 200, rows))
    return pd.DataFrame({"rid": np.arange(rows, dtype=np.int64) + i * 1_000_000,
                         "key": keys.astype(np.int64), "value": rng.integers(0, 1000, rows)})


def _land(root, name: str, df: pd.DataFrame) -> None:
    """Write ``df`` as ``root/name`` under a name starting with ``_``, then rename it into place."""
    tmp = os.path.join(root, "_tmp-" + name)
    df.to_parquet(tmp)
    os.rename(tmp, os.path.join(root, name))


def _truth(frames) -> pd.DataFrame:
    return pd.concat(frames).groupby("key").agg(n=("value", "count"), total=("value", "sum")).sort_index()


def _job(root, out, client, rate=None, **run_kw):
    """Every record to ``out/rows``; the keyed totals' update stream to ``out/totals``."""
    src = Stream.from_parquet(str(root), watch="200ms", batch_size=1_000, rate=rate)
    src.to_parquet(os.path.join(out, "rows"))
    src.key_by("key").aggregate(SPEC, name="totals").to_parquet(os.path.join(out, "totals"))
    return streamlb.run(src, client=client, balancer="static", **run_kw)


def _read(job) -> int:
    try:
        return int(job.state("totals")["n"].sum()) if job.status == "running" else -1
    except Exception:
        return -1


def _wait_read(job, rows: int, timeout: float = 40.0) -> None:
    deadline = time.time() + timeout
    while _read(job) < rows:
        assert time.time() < deadline, f"{_read(job)} of {rows} records read"
        time.sleep(0.05)


def _written(outs, what: str) -> pd.DataFrame:
    """What the runs writing to ``outs`` committed under ``what`` (``rows`` or ``totals``)."""
    parts = [pd.read_parquet(os.path.join(o, what)) for o in outs if os.path.isdir(os.path.join(o, what))]
    parts = [p.reset_index() if p.index.name else p for p in parts]     # the totals: indexed by key
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _check(outs, frames) -> None:
    """Every record once in the rows written; the last update of each key (its largest
    count) is the key's total over ``frames``."""
    rows = _written(outs, "rows")
    want = pd.concat(frames, ignore_index=True)
    assert len(rows) == len(want), f"{len(rows)} rows written, {len(want)} read"
    assert rows["rid"].is_unique and set(rows["rid"]) == set(want["rid"])
    totals = _written(outs, "totals")
    last = totals.sort_values(["key", "n"]).groupby("key").last()[["n", "total"]].sort_index()
    last.index = last.index.astype(np.int64)
    pd.testing.assert_frame_equal(last, _truth(frames), check_dtype=False)


def test_drain_commits_what_was_read_and_finishes(client, tmp_path):
    root, out = tmp_path / "landing", str(tmp_path / "out")
    root.mkdir()
    frames = [_frame(i) for i in range(4)]
    for i in range(2):
        _land(root, f"part-{i}.parquet", frames[i])
    job = _job(root, out, client)
    try:
        _wait_read(job, 8_000)
        for i in range(2, 4):
            _land(root, f"part-{i}.parquet", frames[i])
        _wait_read(job, 16_000)
        waited = []
        waiter = threading.Thread(target=lambda: waited.append(job.wait(timeout=60)))
        waiter.start()              # a wait under way returns once the drain finished the job
        assert job.drain(timeout=60) is None
        assert job.status == "done"
        waiter.join(timeout=10)
        assert waited == [job]
        assert job.wait(timeout=5) is job         # returns at once: the job finished
        _check([out], frames)
        state = job.state("totals")[["n", "total"]].sort_index()
        state.index = state.index.astype(np.int64)
        pd.testing.assert_frame_equal(state, _truth(frames), check_dtype=False)
        with pytest.raises(StreamlbError, match="is done"):
            job.drain()
    finally:
        job.stop()


@pytest.mark.parametrize("checkpoint", [False, True], ids=["savepoint-only", "checkpointed"])
def test_drain_with_a_savepoint_then_restore_reads_the_rest_once(two_workers, tmp_path, checkpoint):
    root, sp = tmp_path / "landing", str(tmp_path / "savepoint")
    root.mkdir()
    outs = [str(tmp_path / "out1"), str(tmp_path / "out2")]
    frames = [_frame(20 + i, 6_000) for i in range(5)]
    for i in range(3):
        _land(root, f"part-{i}.parquet", frames[i])
    ck = {"checkpoint": str(tmp_path / "ck"), "checkpoint_interval": 0.3} if checkpoint else {}
    # paced, so the drain falls with files half read and others not begun
    job = _job(root, outs[0], two_workers, rate=12_000, **ck)
    try:
        _wait_read(job, 4_000)
        assert job.drain(savepoint=sp, timeout=60) == sp
        assert job.status == "done"
        read = job.state("totals")["n"].sum()
    finally:
        job.stop()
    assert 4_000 <= read < 18_000
    manifest, _ = read_manifest(sp)
    saved = [pos["directory"] for pos in manifest["sources"]["from_parquet(landing)"]]
    reading = {f: n for pos in saved for f, n in pos["files"].items()}
    done = [f for pos in saved for f in pos["done"]]
    assert sum(reading.values()) + sum(len(frames[int(f[5])]) for f in done) == read
    assert len(_written(outs[:1], "rows")) == read         # the first run committed what it read
    for i in range(3, 5):
        _land(root, f"part-{i}.parquet", frames[i])
    job = _job(root, outs[1], two_workers, restore=sp)
    try:
        _wait_read(job, sum(map(len, frames)))
        time.sleep(0.5)             # more listings: nothing is read twice
        assert job.drain(timeout=60) is None
    finally:
        job.stop()
    _check(outs, frames)
    assert len(_written(outs[1:], "rows")) == sum(map(len, frames)) - read


def test_bad_drains_are_refused_before_anything_changes(two_workers, tmp_path):
    root, out = tmp_path / "landing", str(tmp_path / "out")
    root.mkdir()
    frames = [_frame(40)]
    _land(root, "part-0.parquet", frames[0])
    taken = tmp_path / "taken"
    taken.mkdir()
    job = _job(root, out, two_workers)
    try:
        _wait_read(job, 4_000)
        with pytest.raises(CheckpointError, match="taken"):
            job.drain(savepoint=str(taken))
        assert job.status == "running" and os.listdir(taken) == []
        frames.append(_frame(41))
        _land(root, "part-1.parquet", frames[1])        # it still reads
        _wait_read(job, 8_000)
        assert job.drain() is None
        _check([out], frames)
    finally:
        job.stop()
    stopped = _job(root, str(tmp_path / "out2"), two_workers)
    stopped.stop()
    with pytest.raises(StreamlbError, match="stopped"):
        stopped.drain(savepoint=str(tmp_path / "never"))
    assert not os.path.exists(tmp_path / "never")


def _timed(i: int, rows: int = 3_000) -> pd.DataFrame:
    """File ``i``: rows in event-time order over seconds ``10 i`` to ``10 (i + 1)``."""
    rng = np.random.default_rng(100 + i)
    t = np.sort(rng.integers(i * 10 * S, (i + 1) * 10 * S, rows))
    return pd.DataFrame({"key": rng.integers(0, 20, rows).astype(np.int64), "value": rng.integers(0, 1000, rows),
                         "event_time": pd.to_datetime(t, unit="ns")})


def _windowed(root, out, client, **run_kw):
    """5 s tumbling windows per key to ``out/windows`` (late rows to ``out/late``); the keyed
    totals count what was read."""
    src = Stream.from_parquet(str(root), watch="200ms", batch_size=250, rate=4_000, parallelism=1,
                              event_time="event_time")
    src.key_by("key").aggregate(SPEC, name="totals")
    w = src.with_watermark("event_time", delay="1s").key_by("key").window(size="5s").aggregate(SPEC, name="w")
    w.to_parquet(os.path.join(out, "windows"))
    w.late().to_parquet(os.path.join(out, "late"))
    return streamlb.run(src, client=client, balancer="static", **run_kw)


def test_windows_open_at_a_drain_savepoint_are_emitted_once_by_the_restored_job(two_workers, tmp_path):
    """Into a savepoint, event time stops: what is open is fired by the restored job only."""
    from windowing import check, emitted, expected

    root, sp = tmp_path / "landing", str(tmp_path / "savepoint")
    root.mkdir()
    outs = [str(tmp_path / "out1"), str(tmp_path / "out2")]
    frames = [_timed(0, 6_000)] + [_timed(i) for i in range(1, 4)]
    _land(root, "part-0.parquet", frames[0])
    job = _windowed(root, outs[0], two_workers)
    try:
        # past 6 s of event time the first window [0 s, 5 s) has fired; the drain comes
        # before the file's end (which would take the watermark to its end)
        _wait_read(job, 4_000)
        assert job.drain(savepoint=sp, timeout=60) == sp
        read = job.state("totals")["n"].sum()
    finally:
        job.stop()
    assert read < 6_000
    first = _written(outs[:1], "windows")
    for i in range(1, 4):
        _land(root, f"part-{i}.parquet", frames[i])
    job = _windowed(root, outs[1], two_workers, restore=sp)
    try:
        _wait_read(job, sum(map(len, frames)))
        assert job.drain(timeout=60) is None        # without a savepoint: every window fires
    finally:
        job.stop()
    assert _written(outs, "late").empty
    got = emitted([_written(outs, "windows")])
    check(got, expected(pd.concat(frames, ignore_index=True), "tumbling", size=5 * S, slide=5 * S))
    assert 0 < len(first) < len(got)


def test_a_kafka_fed_job_drains_into_a_savepoint_and_the_restored_job_reads_the_rest_once(two_workers, kafka,
                                                                                          tmp_path):
    """Offsets in the savepoint; running counts written to a topic in transactions: read
    committed, the two runs' outputs hold one count per record, exact."""
    from kafka_broker import topic_name
    from test_kafka import _expected_counts, _read_counts, _records, _running_counts, _same_rows, _values

    topic, out = kafka.create_topic(topic_name("drain"), partitions=2), kafka.create_topic(topic_name("dout"), 2)
    parts = [_records(4_000, seed=s) for s in (31, 32)]
    kafka.produce(topic, _values(parts[0]))
    sp = str(tmp_path / "savepoint")

    def job_of(**kw):
        src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", offsets="earliest",
                                      batch_size=500)
        src.key_by("key").aggregate(SPEC, name="totals")
        _running_counts(src, out, kafka)
        return streamlb.run(src, client=two_workers, balancer="static", **kw)

    job = job_of(checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3)
    try:
        _wait_read(job, len(parts[0]), timeout=90)
        assert job.drain(savepoint=sp, timeout=60) == sp
        assert job.status == "done"
    finally:
        job.stop()
    _same_rows(_read_counts(kafka, out), _expected_counts(parts[0]))
    kafka.produce(topic, _values(parts[1]))         # while no job runs
    job = job_of(restore=sp)
    try:
        _wait_read(job, len(parts[0]) + len(parts[1]), timeout=90)
        assert job.drain(timeout=60) is None
    finally:
        job.stop()
    _same_rows(_read_counts(kafka, out), _expected_counts(pd.concat(parts)))
