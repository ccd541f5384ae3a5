"""Kafka sources end to end: a job on LocalCluster worker processes reads a topic of a real
broker process (the ``kafka`` fixture), exact against pandas over the records produced."""
from __future__ import annotations

import io
import time

import numpy as np
import pandas as pd
import pytest
from pyarrow import json as pa_json
from streamz import Stream

import streamlb
from streamlb import PipelineError

from kafka_broker import topic_name


def _records(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    keys = np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), rng.integers(0, 200, n))
    return pd.DataFrame({"key": keys, "value": rng.integers(0, 1000, n)})


def _values(df: pd.DataFrame) -> list[bytes]:
    """Each row as a JSON object (as pandas writes them, one per line)."""
    return [line.encode() for line in df.to_json(orient="records", lines=True).splitlines()]


def _truth(df: pd.DataFrame) -> pd.DataFrame:
    return df.groupby("key").agg(n=("value", "count"), total=("value", "sum")).sort_index()


def _state(job) -> pd.DataFrame:
    got = job.state("totals")[["n", "total"]].sort_index()
    got.index = got.index.astype(np.int64)
    return got


def test_a_keyed_aggregate_over_a_topic_is_exact_and_bad_records_go_to_dead_letters(two_workers, kafka):
    topic = kafka.create_topic(topic_name("agg"), partitions=4)
    df = _records(40_000, seed=1)
    values = _values(df)
    bad = {7: b"{not json", 20_001: b"[1, 2]", 39_999: b"\xff\xfe"}
    for i, v in bad.items():
        values[i] = v
    kafka.produce(topic, values, partition=[i % 4 for i in range(len(values))])
    src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", until="end", batch_size=5_000)
    src.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")}, name="totals")
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait(timeout=120)
        got, dead = _state(job), job.dead_letters()
    pd.testing.assert_frame_equal(got, _truth(df.drop(index=list(bad))), check_dtype=False)
    assert len(dead) == len(bad)
    where = sorted((r["kafka_partition"], r["kafka_offset"]) for r in dead.record)
    assert where == sorted((i % 4, i // 4) for i in bad)        # partition i % 4, offset i // 4 there
    assert all(f"Kafka topic {topic!r} partition" in why for why in dead.reason)
    assert {bytes(r["value"]) for r in dead.record} == set(bad.values())


def test_an_unbounded_job_reads_what_is_produced_while_it_runs_until_stopped(two_workers, kafka):
    topic = kafka.create_topic(topic_name("live"), partitions=3)
    df = _records(9_000, seed=2)
    parts = [df.iloc[i::3] for i in range(3)]
    kafka.produce(topic, _values(parts[0]))
    src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", offsets="earliest")
    src.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")}, name="totals")
    job = streamlb.run(src, client=two_workers, balancer="static")
    try:
        for i, part in enumerate(parts, 1):
            if i > 1:
                kafka.produce(topic, _values(part))
            want = _truth(pd.concat(parts[:i]))
            deadline = time.time() + 60
            while True:
                got = _state(job) if job.status == "running" else None
                if got is not None and got.n.sum() >= want.n.sum():
                    break
                assert time.time() < deadline, f"after batch {i}: {None if got is None else got.n.sum()} " \
                                               f"of {want.n.sum()} records read"
                time.sleep(0.2)
            pd.testing.assert_frame_equal(got, want, check_dtype=False)
        assert job.status == "running"      # an unbounded job does not end on its own
    finally:
        job.stop()


def test_bad_kafka_source_arguments_are_refused_naming_them():
    with pytest.raises(PipelineError, match="bootstrap.servers"):
        Stream.from_kafka_topic("t", {})
    with pytest.raises(PipelineError, match="offsets='newest'; valid: 'committed'"):
        Stream.from_kafka_topic("t", {"bootstrap.servers": "127.0.0.1:1"}, offsets="newest")
    with pytest.raises(PipelineError, match="until='forever'; valid: None, 'end'"):
        Stream.from_kafka_topic("t", {"bootstrap.servers": "127.0.0.1:1"}, until="forever")
    with pytest.raises(PipelineError, match="decode='xml'"):
        Stream.from_kafka_topic("t", {"bootstrap.servers": "127.0.0.1:1"}, decode="xml")


def _wait_for(job, want: pd.DataFrame, what: str, timeout: float = 90) -> pd.DataFrame:
    """Poll the job's state until it holds as many records as ``want``; returns it."""
    deadline = time.time() + timeout
    while True:
        try:
            got = _state(job) if job.status == "running" else None
        except (OSError, RuntimeError, streamlb.StreamlbError):     # a lost worker, until recovered
            got = None
        if got is not None and got.n.sum() >= want.n.sum():
            return got
        assert time.time() < deadline, f"{what}: {None if got is None else got.n.sum()} of {want.n.sum()} records read"
        time.sleep(0.2)


def _totals(src):
    src.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")}, name="totals")


@pytest.mark.cluster
def test_exactly_once_into_state_across_a_sigkilled_worker(kafka, tmp_path):
    """The partitions' offsets are in the checkpoints: after a worker is SIGKILLed mid-stream
    the job goes on from the last checkpoint, and every record counts once."""
    from distributed import Client

    from conftest import dask_cli_cluster
    from test_checkpoint import _kill_one

    topic = kafka.create_topic(topic_name("kill"), partitions=4)
    first, second = _records(60_000, seed=3), _records(200_000, seed=4)
    kafka.produce(topic, _values(first))
    with dask_cli_cluster(workers=3) as address, Client(address) as c:
        c.wait_for_workers(3, timeout=60)
        src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", offsets="earliest",
                                      batch_size=2_000)
        _totals(src)
        job = streamlb.run(src, client=c, checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3,
                           balancer="static")
        try:
            _wait_for(job, _truth(first), "before the kill")
            kafka.produce(topic, _values(second))
            deadline = time.time() + 30
            while _state(job).n.sum() < len(first) + len(second) // 10 and time.time() < deadline:
                time.sleep(0.05)
            victim = _kill_one(c, job)
            want = _truth(pd.concat([first, second]))
            got = _wait_for(job, want, "after the kill", timeout=180)
            pd.testing.assert_frame_equal(got, want, check_dtype=False)
            recoveries = [h for h in job.history if h.get("kind") == "recovery"]
            assert len(recoveries) == 1 and recoveries[0]["lost_workers"] == [victim]
        finally:
            job.stop()


def test_a_savepoint_then_stop_then_restore_reads_the_rest_once(two_workers, kafka, tmp_path):
    topic = kafka.create_topic(topic_name("save"), partitions=2)
    parts = [_records(5_000, seed=s) for s in (5, 6, 7)]
    kafka.produce(topic, _values(parts[0]))

    def job_of(**kw):
        src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", offsets="earliest")
        _totals(src)
        return streamlb.run(src, client=two_workers, balancer="static", **kw)

    job = job_of()
    try:
        _wait_for(job, _truth(parts[0]), "first job")
        kafka.produce(topic, _values(parts[1]))
        _wait_for(job, _truth(pd.concat(parts[:2])), "first job, more")
        path = job.savepoint(str(tmp_path / "sp"))
    finally:
        job.stop()
    kafka.produce(topic, _values(parts[2]))         # while no job runs
    job = job_of(restore=path)
    try:
        want = _truth(pd.concat(parts))
        pd.testing.assert_frame_equal(_wait_for(job, want, "restored job"), want, check_dtype=False)
        time.sleep(1.0)                              # nothing more comes: nothing read twice
        pd.testing.assert_frame_equal(_state(job), want, check_dtype=False)
    finally:
        job.stop()


def test_offsets_are_committed_to_the_group_after_each_checkpoint(two_workers, kafka, tmp_path):
    """For monitoring tools: the user's group shows the offsets of the last complete checkpoint."""
    from confluent_kafka import TopicPartition

    topic = kafka.create_topic(topic_name("commit"), partitions=3)
    df = _records(6_000, seed=8)
    kafka.produce(topic, _values(df), partition=[i % 3 for i in range(len(df))])
    group = topic_name("group")
    src = Stream.from_kafka_topic(topic, {**kafka.consumer_conf, "group.id": group}, decode="json")
    _totals(src)
    job = streamlb.run(src, client=two_workers, balancer="static", checkpoint=str(tmp_path / "ck"),
                       checkpoint_interval=0.2)
    try:
        _wait_for(job, _truth(df), "reading")
        c = kafka.consumer(**{"group.id": group})
        tps = [TopicPartition(topic, p) for p in range(3)]
        deadline = time.time() + 30
        while True:
            committed = {tp.partition: tp.offset for tp in c.committed(tps, timeout=10)}
            if committed == {p: 2_000 for p in range(3)} or time.time() > deadline:
                break
            time.sleep(0.2)
        c.close()
        assert committed == {p: 2_000 for p in range(3)}
    finally:
        job.stop()


def test_partitions_added_while_a_job_runs_are_read(two_workers, kafka):
    from confluent_kafka.admin import NewPartitions

    topic = kafka.create_topic(topic_name("grow"), partitions=2)
    first, second = _records(4_000, seed=9), _records(3_000, seed=10)
    kafka.produce(topic, _values(first))
    src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", offsets="earliest")
    _totals(src)
    job = streamlb.run(src, client=two_workers, balancer="static")
    try:
        _wait_for(job, _truth(first), "two partitions")
        admin = kafka.admin()
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=15)
        while len(kafka.partitions(topic)) < 4:
            time.sleep(0.05)
        kafka.produce(topic, _values(second), partition=[2 + i % 2 for i in range(len(second))])
        want = _truth(pd.concat([first, second]))
        pd.testing.assert_frame_equal(_wait_for(job, want, "partitions 2 and 3"), want, check_dtype=False)
    finally:
        job.stop()


def test_a_kafka_fed_job_is_exact_while_autoflow_balances_and_across_a_live_rescale(two_workers, kafka):
    """The operators behind a Kafka source move and rescale like any others."""
    topic = kafka.create_topic(topic_name("move"), partitions=4)
    df = _records(150_000, seed=11)
    kafka.produce(topic, _values(df))
    src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", until="end", batch_size=1_000)
    src.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")}, name="totals",
                                parallelism=4)
    with streamlb.run(src, client=two_workers, balancer="autoflow", window=0.2, key_groups=64) as job:
        time.sleep(0.5)
        job.rescale("totals", 3)
        job.wait(timeout=120)
        got = _state(job)
        kinds = {h.get("kind", "migration") for h in job.history}
    pd.testing.assert_frame_equal(got, _truth(df), check_dtype=False)
    assert kinds >= {"rescale", "migration"}, kinds


# -- to_kafka_topic ---------------------------------------------------------------------------
def _running_counts(src, out_topic, kafka, parallelism=None):
    """A running count per key (one output per input record) written to ``out_topic``."""
    counts = src.key_by("key").stateful_map(lambda s, r: ((s or 0) + 1, (s or 0) + 1), name="running",
                                            parallelism=parallelism)
    counts.to_kafka_topic(out_topic, {"bootstrap.servers": kafka.bootstrap}, key="key")


def _read_counts(kafka, topic: str, isolation: str = "read_committed") -> pd.DataFrame:
    """The topic's JSON values, parsed by Arrow (``json.loads`` one by one took 15 s at 2M)."""
    values = [v for _, _, _, v in kafka.read_all(topic, isolation=isolation)]
    if not values:
        return pd.DataFrame(columns=["key", "output"])
    return pa_json.read_json(io.BytesIO(b"\n".join(values))).select(["key", "output"]).to_pandas()


def _expected_counts(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"key": df.key.to_numpy(), "output": df.groupby("key").cumcount().to_numpy() + 1})


def _same_rows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    cols = ["key", "output"]
    a = got[cols].astype(np.int64).sort_values(cols).reset_index(drop=True)
    b = want[cols].astype(np.int64).sort_values(cols).reset_index(drop=True)
    assert len(a) == len(b), f"{len(a)} rows read committed, {len(b)} expected"
    pd.testing.assert_frame_equal(a, b)


def test_to_kafka_topic_writes_each_row_once_read_committed(two_workers, kafka):
    src_topic = kafka.create_topic(topic_name("in"), partitions=4)
    out_topic = kafka.create_topic(topic_name("out"), partitions=3)
    df = _records(30_000, seed=12)
    kafka.produce(src_topic, _values(df))
    src = Stream.from_kafka_topic(src_topic, kafka.consumer_conf, decode="json", until="end")
    _running_counts(src, out_topic, kafka)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait(timeout=120)
    _same_rows(_read_counts(kafka, out_topic), _expected_counts(df))
    # keys as the producer's partitioner places them: one key, one partition
    placed = {}
    for p, _, k, _ in kafka.read_all(out_topic):
        assert placed.setdefault(k, p) == p


def test_bad_kafka_sink_arguments_are_refused_naming_them():
    src = Stream.from_iterable([{"a": 1}])
    with pytest.raises(PipelineError, match="bootstrap.servers"):
        src.to_kafka_topic("t", {})
    with pytest.raises(PipelineError, match="encode='xml'; valid: 'json' or a callable"):
        src.to_kafka_topic("t", {"bootstrap.servers": "127.0.0.1:1"}, encode="xml")
    with pytest.raises(PipelineError, match="must not set 'transactional.id'"):
        src.to_kafka_topic("t", {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "x"})


@pytest.mark.cluster
def test_to_kafka_topic_exactly_once_across_a_sigkilled_worker(kafka, tmp_path):
    """With checkpoints, what a lost instance wrote after the last complete checkpoint is
    aborted and written again by the replay: each row once under read_committed."""
    from distributed import Client

    from conftest import dask_cli_cluster

    src_topic = kafka.create_topic(topic_name("in"), partitions=4)
    out_topic = kafka.create_topic(topic_name("out"), partitions=3)
    df = _records(120_000, seed=13)
    kafka.produce(src_topic, _values(df))
    with dask_cli_cluster(workers=3) as address, Client(address) as c:
        c.wait_for_workers(3, timeout=60)
        src = Stream.from_kafka_topic(src_topic, kafka.consumer_conf, decode="json", until="end",
                                      batch_size=1_000)
        _running_counts(src, out_topic, kafka, parallelism=3)
        job = streamlb.run(src, client=c, checkpoint=str(tmp_path / "ck"), checkpoint_interval=1.0,
                           balancer="static")
        try:
            _kill_after_a_checkpoint(c, job, read=40_000)
        finally:
            job.stop()
    _same_rows(_read_counts(kafka, out_topic), _expected_counts(df))


def _kill_after_a_checkpoint(client, job, read: int) -> None:
    """Once ``read`` records were read and a checkpoint is complete, SIGKILL a worker of
    ``job`` just after the next checkpoint completed and its transactions committed, not
    in the gap between the two (docs/kafka.md: librdkafka cannot resume another process's
    transaction, so a worker lost in it loses that checkpoint's rows); the job must then
    end with one recovery, of that worker."""
    from test_checkpoint import _kill_one

    deadline = time.time() + 120
    while (job.checkpoints().empty or sum(job.offsets().values()) < read) and time.time() < deadline:
        time.sleep(0.05)
    seen = set(job.checkpoints()["id"])
    while not set(job.checkpoints()["id"]) - seen and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    victim = _kill_one(client, job)
    job.wait(timeout=600)
    recoveries = [h for h in job.history if h.get("kind") == "recovery"]
    assert len(recoveries) == 1 and recoveries[0]["lost_workers"] == [victim]


@pytest.mark.slow
@pytest.mark.cluster
def test_two_million_records_exactly_once_across_a_sigkilled_worker(kafka, tmp_path):
    """The issue's size with ``checkpoint=`` and a SIGKILLed ``dask worker`` a quarter of the
    way in (STREAMLB_SLOW=1; about a minute): the aggregate's state exact against pandas, and
    the running counts read back with read_committed each exactly once."""
    from distributed import Client

    from conftest import dask_cli_cluster

    src_topic = kafka.create_topic(topic_name("bigkill"), partitions=4)
    out_topic = kafka.create_topic(topic_name("bigkillout"), partitions=4)
    df = _records(2_000_000, seed=23)
    kafka.produce(src_topic, _values(df), partition=[i % 4 for i in range(len(df))])
    with dask_cli_cluster(workers=3) as address, Client(address) as c:
        c.wait_for_workers(3, timeout=60)
        src = Stream.from_kafka_topic(src_topic, kafka.consumer_conf, decode="json", until="end")
        _aggregate_and_running_counts(src, out_topic, kafka.bootstrap)
        job = streamlb.run(src, client=c, checkpoint=str(tmp_path / "ck"), checkpoint_interval=1.0,
                           balancer="static")
        try:
            _kill_after_a_checkpoint(c, job, read=len(df) // 4)
            pd.testing.assert_frame_equal(_state(job), _truth(df), check_dtype=False)
        finally:
            job.stop()
    _same_rows(_read_counts(kafka, out_topic), _expected_counts(df))


def test_a_savepoint_restores_at_another_source_parallelism(two_workers, kafka, tmp_path):
    """Partitions' offsets are merged over the old instances and each new one takes its own."""
    topic = kafka.create_topic(topic_name("repar"), partitions=4)
    first, second = _records(6_000, seed=14), _records(4_000, seed=15)
    kafka.produce(topic, _values(first))

    def job_of(par, **kw):
        src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", offsets="earliest", parallelism=par)
        _totals(src)
        return streamlb.run(src, client=two_workers, balancer="static", **kw)

    job = job_of(2)
    try:
        _wait_for(job, _truth(first), "at parallelism 2")
        path = job.savepoint(str(tmp_path / "sp"))
    finally:
        job.stop()
    kafka.produce(topic, _values(second))
    job = job_of(3, restore=path)
    try:
        want = _truth(pd.concat([first, second]))
        _wait_for(job, want, "at parallelism 3")
        time.sleep(1.0)
        pd.testing.assert_frame_equal(_state(job), want, check_dtype=False)
        assert job.summary()["records"] == len(second)      # only what came after the savepoint
    finally:
        job.stop()


def test_a_topic_that_does_not_exist_fails_the_job_naming_it(two_workers, kafka):
    topic = topic_name("missing")
    src = Stream.from_kafka_topic(topic, kafka.consumer_conf, until="end")
    _totals(src)
    with pytest.raises(Exception, match=f"Kafka topic '{topic}' does not exist at {kafka.bootstrap}"):
        with streamlb.run(src, client=two_workers, balancer="static") as job:
            job.wait(timeout=60)


# -- at the size, and across a broker restart ----------------------------------------
def _aggregate_and_running_counts(src, out_topic: str, bootstrap: str) -> None:
    keyed = src.key_by("key")
    keyed.aggregate({"n": ("value", "count"), "total": ("value", "sum")}, name="totals")
    keyed.stateful_map(lambda s, r: ((s or 0) + 1, (s or 0) + 1), name="running") \
        .to_kafka_topic(out_topic, {"bootstrap.servers": bootstrap}, key="key")


def test_two_million_records_into_an_aggregate_and_a_stateful_map_written_to_kafka(two_workers, kafka):
    """The issue's size: 2M JSON records of 4 partitions; state exact against pandas, and the
    running counts read back with read_committed each exactly once."""
    src_topic = kafka.create_topic(topic_name("big"), partitions=4)
    out_topic = kafka.create_topic(topic_name("bigout"), partitions=4)
    df = _records(2_000_000, seed=21)
    kafka.produce(src_topic, _values(df), partition=[i % 4 for i in range(len(df))])
    src = Stream.from_kafka_topic(src_topic, kafka.consumer_conf, decode="json", until="end")
    _aggregate_and_running_counts(src, out_topic, kafka.bootstrap)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait(timeout=600)
        pd.testing.assert_frame_equal(_state(job), _truth(df), check_dtype=False)
    _same_rows(_read_counts(kafka, out_topic), _expected_counts(df))


def _a_quarter_read(broker, client, tmp_path, name: str, rows: int, seed: int):
    """A checkpointed job from a topic of ``rows`` records of the test's own ``broker`` into
    the aggregate and the running counts written to another topic, once a checkpoint
    completed and a quarter of the records was read: ``(job, records, output topic)``."""
    src_topic = broker.create_topic(topic_name(name), partitions=4)
    out_topic = broker.create_topic(topic_name(name + "out"), partitions=3)
    df = _records(rows, seed=seed)
    broker.produce(src_topic, _values(df))
    src = Stream.from_kafka_topic(src_topic, broker.consumer_conf, decode="json", until="end", batch_size=2_000)
    _aggregate_and_running_counts(src, out_topic, broker.bootstrap)
    job = streamlb.run(src, client=client, checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3,
                       balancer="static")
    deadline = time.time() + 60
    while (job.checkpoints().empty or sum(job.offsets().values()) < len(df) // 4) and time.time() < deadline:
        time.sleep(0.05)
    return job, df, out_topic


@pytest.mark.cluster
@pytest.mark.parametrize("rows", [300_000, pytest.param(2_000_000, marks=pytest.mark.slow)])
def test_exact_across_a_broker_restart(two_workers, tmp_path, rows):
    """The broker process is stopped and started again while the job reads and writes (a
    broker of this test's own; skipped against an external cluster): the source reconnects
    and every record counts once in state; the sink goes on writing to the end (each key's
    last running count is in the topic's log), and no output is read twice.

    That no output is lost across the restart cannot be checked with noida-db: it drops
    records of transactions open when it restarts, and it never ends those it forgets, so a
    read_committed reader stops at the first of them (docs/kafka.md, "The broker the tests
    use"). The issue's 2M records run with STREAMLB_SLOW=1."""
    from kafka_broker import Broker

    broker = Broker.start()
    try:
        if broker.external:
            pytest.skip("cannot restart the external Kafka cluster ($STREAMLB_KAFKA_BOOTSTRAP)")
        job, df, out_topic = _a_quarter_read(broker, two_workers, tmp_path, "rs", rows, seed=22)
        try:
            read_before = sum(job.offsets().values())
            broker.restart()
            job.wait(timeout=300)
            pd.testing.assert_frame_equal(_state(job), _truth(df), check_dtype=False)
        finally:
            job.stop()
        assert read_before < len(df), "the job had read everything before the restart"
        got = _read_counts(broker, out_topic).astype(np.int64)
        assert not got.duplicated().any(), got[got.duplicated(keep=False)].head()
        want = _expected_counts(df)
        assert len(got.merge(want, on=["key", "output"])) == len(got), "outputs that no input gives"
        logged = _read_counts(broker, out_topic, isolation="read_uncommitted").astype(np.int64)
        last = logged.groupby("key").output.max()
        pd.testing.assert_series_equal(last, df.groupby("key").size().rename("output"), check_dtype=False)
    finally:
        broker.close()


@pytest.mark.cluster
def test_a_broker_away_longer_than_a_commit_may_take_is_a_sink_write_fault_recovered(two_workers, tmp_path):
    """The broker process is stopped for longer than a sink's commit may take (its
    deadline): the commit fails its instance with a SinkWriteError naming the sink, the
    topic and the brokers, a fault the job recovers from, from its last complete checkpoint,
    once the broker is back; every record counts once in state."""
    from kafka_broker import Broker
    from streamlb._sinks._kafka import DEADLINE

    broker = Broker.start()
    try:
        if broker.external:
            pytest.skip("cannot stop the external Kafka cluster ($STREAMLB_KAFKA_BOOTSTRAP)")
        job, df, out_topic = _a_quarter_read(broker, two_workers, tmp_path, "away", 100_000, seed=23)
        try:
            broker.stop()
            time.sleep(DEADLINE + 8)
            broker.restart()            # (started again: it is stopped already)
            job.wait(timeout=240)
            pd.testing.assert_frame_equal(_state(job), _truth(df), check_dtype=False)
            faults = job.failures()
        finally:
            job.stop()
        print(faults.to_string())
        sink = faults[faults.kind == "sink write"]
        assert len(sink) and (sink.action == "recovered").all(), faults.to_string()
        detail = sink.detail.iloc[0]
        assert "to_kafka_topic" in detail and out_topic in detail and broker.bootstrap in detail, detail
    finally:
        broker.close()


def test_a_sink_commit_after_a_broker_restart_ends_within_its_deadline():
    """After the broker restarts, a producer's ``send_offsets_to_transaction`` waits for ever
    whatever its timeout (its group coordinator went with the broker: librdkafka#5456; 4 of 4
    tries with noida-db). The writer's commit of a transaction begun after the restart gives
    that producer up, fences it with a new one and writes the transaction again, in its commit
    thread, within its deadline; every checkpoint's mark commits, in order.

    That the given-up transaction is aborted cannot be checked with noida-db: a producer of
    before the restart is one it forgot, so fencing does not end its transaction and a
    read_committed reader stops there (docs/kafka.md, "The broker the tests use")."""
    from collections import Counter
    from types import SimpleNamespace

    from kafka_broker import Broker
    from streamlb._sinks._base import SinkContext
    from streamlb._sinks._kafka import DEADLINE, KafkaWriter, _committed_mark, _group

    broker = Broker.start()
    writer = None
    try:
        if broker.external:
            pytest.skip("cannot restart the external Kafka cluster ($STREAMLB_KAFKA_BOOTSTRAP)")
        topic = broker.create_topic(topic_name("bounded"), partitions=2)
        config = {"bootstrap.servers": broker.bootstrap}
        step = SimpleNamespace(target=0, kwargs={"topic": topic, "producer_config": config, "key": "key",
                                                 "encode": "json"})
        writer = KafkaWriter(step, SinkContext("sink", 0, 0, 0, "bounded", staged=True))
        df = _records(3_000, seed=30)
        parts = [df.iloc[:1_000], df.iloc[1_000:2_000], df.iloc[2_000:]]
        writer.write(parts[0])
        writer.seal(1)
        writer.completed(1).result(60)
        broker.restart()
        writer.write(parts[1])
        writer.seal(2)
        t0 = time.monotonic()
        writer.completed(2).result(DEADLINE + 15)     # was: no return
        print(f"commit after the restart: {time.monotonic() - t0:.1f} s (deadline {DEADLINE:g} s)")
        writer.write(parts[2])
        writer.seal(3)
        writer.completed(3).result(60)
        marks = _group(config, writer._prefix)
        try:
            assert _committed_mark(marks, topic) == 3
        finally:
            marks.close()
        committed = Counter(v for _, _, _, v in broker.read_all(topic))
        assert committed == Counter(_values(parts[0]))
        logged = Counter(v for _, _, _, v in broker.read_all(topic, isolation="read_uncommitted"))
        assert not Counter(_values(df)) - logged, "rows never written"
    finally:
        if writer is not None:
            writer.abort()
        broker.close()


def test_watermarks_per_partition_with_an_idle_one(two_workers, kafka):
    """One source instance reads four partitions at different paces (partition 0 holds ten
    times the records of the others per second of event time; partition 3 stops at 20 s):
    its watermark is the minimum over the non-idle partitions, so partition 0's records are
    not late when the others are read ahead, and partition 3 going idle does not hold the
    windows back. Windows exact against pandas; nothing late."""
    from windowing import S, check, emitted, expected

    rng = np.random.default_rng(23)
    parts = []
    for p, (n, until) in enumerate([(40_000, 100), (4_000, 100), (4_000, 100), (800, 20)]):
        t = np.sort(rng.uniform(0, until, n)) + rng.uniform(-1, 0, n)      # disorder under 1 s
        parts.append(pd.DataFrame({"key": rng.integers(0, 10, n), "value": rng.integers(0, 100, n),
                                   "ms": np.maximum(t, 0) * 1000 // 1, "p": p}).astype({"ms": np.int64}))
    df = pd.concat(parts, ignore_index=True)
    topic = kafka.create_topic(topic_name("wm"), partitions=4)
    kafka.produce(topic, _values(df.drop(columns="p")), partition=df.p.tolist())
    src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", offsets="earliest",
                                  parallelism=1, batch_size=500)
    op = src.with_watermark("ms", delay="1s", idle_timeout="1s", unit="ms") \
        .key_by("key").window(size="10s").aggregate({"n": ("value", "count"), "total": ("value", "sum")},
                                                    name="w")
    out, late = [], []
    op.sink(out.append)
    op.late().sink(late.append)
    frame = df.assign(event_time=pd.to_datetime(df.ms, unit="ms"))
    want = expected(frame, "tumbling", size=10 * S, slide=10 * S)
    want = want[want.we <= 90 * S].reset_index(drop=True)     # the watermark passes 90 s, not 100 s
    job = streamlb.run(src, client=two_workers, balancer="static")
    try:
        deadline = time.time() + 60
        while time.time() < deadline and (not out or emitted(out).we.max() < 90_000):     # (ms)
            job.offsets()               # a poll: brings the sink's batches to the driver
            time.sleep(0.2)
        time.sleep(1.0)                 # nothing more may fire while the job runs
        job.offsets()
        assert job.status == "running"
        got = emitted(out)
        got[["ws", "we"]] *= 1_000_000      # windows of an integer column: in its unit (ms)
    finally:
        job.stop()
    assert not late, f"{sum(map(len, late))} records late"
    check(got, want)


def _slowly(df):
    time.sleep(0.02)        # the stream lasts several seconds: reconfigured while it runs
    return df


def test_to_kafka_topic_exactly_once_across_a_move_and_a_rescale(two_workers, kafka, tmp_path):
    """An instance that writes to Kafka moves to another worker, and its operator rescales
    down and up again (the new instance 2 takes over what the old one had not committed),
    with checkpoints: what each wrote since the last checkpoint is neither lost nor written
    twice."""
    src_topic = kafka.create_topic(topic_name("in"), partitions=4)
    out_topic = kafka.create_topic(topic_name("out"), partitions=3)
    df = _records(60_000, seed=16)
    kafka.produce(src_topic, _values(df))
    src = Stream.from_kafka_topic(src_topic, kafka.consumer_conf, decode="json", until="end", batch_size=250)
    _running_counts(src.map(_slowly), out_topic, kafka, parallelism=3)
    with streamlb.run(src, client=two_workers, balancer="static", checkpoint=str(tmp_path / "ck"),
                      checkpoint_interval=0.5) as job:
        deadline = time.time() + 60
        while job.checkpoints().empty and time.time() < deadline:
            time.sleep(0.05)
        workers = sorted(set(job.workers_of.values()))
        key = next(k for k in job.actors if job.plan.stages[k[0]].name == "running")
        other = next(w for w in workers if w != job.workers_of[key])
        job.move_instance("running", key[1], other)
        job.rescale("running", 2, strategy="all-at-once")
        job.rescale("running", 3, strategy="all-at-once")
        read = sum(job.offsets().values())
        job.wait(timeout=120)
        kinds = [h.get("kind") for h in job.history]
    assert read < len(df), f"the job had read all {read} records before the move and rescale were done"
    assert "rescale" in kinds, kinds
    _same_rows(_read_counts(kafka, out_topic), _expected_counts(df))
