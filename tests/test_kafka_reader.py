"""KafkaReader against a real broker process (the ``kafka`` fixture, see kafka_broker.py)."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from kafka_broker import topic_name
from test_kafka_broker import transactions
from streamlb._sources import Split
from streamlb._sources._kafka import KafkaReader
from streamlb.exceptions import PipelineError

ck = pytest.importorskip("confluent_kafka")


def make_stage(kafka, topic: str, **kw) -> SimpleNamespace:
    settings = dict(topic=topic, consumer_params=dict(kafka.consumer_conf), decode=None, offsets="earliest",
                    until="end", batch_size=1000, parallelism=1, event_time=None)
    return SimpleNamespace(**{**settings, **kw})


OPEN: list[KafkaReader] = []


@pytest.fixture(autouse=True)
def close_readers():
    """Close the readers a test opened, even when it fails (a consumer left open keeps
    calling a broker that is gone)."""
    yield
    while OPEN:
        OPEN.pop().close()


def reader_of(stage, index: int = 0) -> KafkaReader:
    OPEN.append(KafkaReader(stage, index))
    return OPEN[-1]


def opened(stage, index: int = 0, saved: dict | None = None) -> KafkaReader:
    reader = reader_of(stage, index)
    reader.add_splits(reader.splits_at(saved or {}))
    return reader


def drain(reader: KafkaReader, timeout: float = 15.0) -> list:
    """Every batch with rows until poll says every split ended."""
    out = []
    deadline = time.monotonic() + timeout
    while (b := reader.poll()) is not None:
        assert time.monotonic() < deadline, "the splits did not end"
        if len(b.frame):
            out.append(b)
    return out


def rows(batches) -> pd.DataFrame:
    return pd.concat([b.frame for b in batches], ignore_index=True).sort_values(
        ["kafka_partition", "kafka_offset"], ignore_index=True)


def test_every_record_read_once_by_two_instances(kafka):
    t = kafka.create_topic(topic_name(), 4)
    kafka.produce(t, [f"v{i}" for i in range(20_000)], keys=[f"k{i}" for i in range(20_000)],
                  partition=[i % 4 for i in range(20_000)])
    stage = make_stage(kafka, t, parallelism=2)
    readers = [opened(stage, i) for i in range(2)]
    got = [drain(r) for r in readers]
    assert {b.split_id for b in got[0]} == {f"{t}:0", f"{t}:2"}
    assert {b.split_id for b in got[1]} == {f"{t}:1", f"{t}:3"}
    assert all(b.split_id == f"{t}:{b.frame['kafka_partition'].iat[0]}" for bs in got for b in bs)
    assert max(len(b.frame) for bs in got for b in bs) == 1000
    df = rows(got[0] + got[1])
    truth = kafka.read_all(t)
    assert list(zip(df.kafka_partition, df.kafka_offset, df.kafka_key, df.value)) == truth
    assert df.dtypes.astype(str).to_dict() == {"kafka_key": "object", "kafka_partition": "int32",
                                               "kafka_offset": "int64", "kafka_timestamp": "datetime64[ms]",
                                               "value": "object"}
    assert df.kafka_timestamp.notna().all()
    for r in readers:
        assert r.idle() == set(r.offsets())
        assert set(r.offsets().values()) == {5000}
        r.close()


def test_saved_positions_resume_without_loss_or_duplicate(kafka):
    t = kafka.create_topic(topic_name(), 3)
    kafka.produce(t, [f"v{i}" for i in range(3000)], partition=[i % 3 for i in range(3000)])
    stage = make_stage(kafka, t, batch_size=70)
    first = opened(stage)
    before = [first.poll() for _ in range(10)]      # some splits part read, one maybe not at all
    saved = first.save(first.snapshot())
    first.close()
    assert set(saved) == {"kafka"} and set(saved["kafka"]) == {f"{t}:{p}" for p in range(3)}
    again = reader_of(stage)
    assert again.splits_at(saved) == [Split(s, off) for s, off in saved["kafka"].items()]
    again.add_splits(again.splits_at(saved))
    after = drain(again)
    df = rows([b for b in before if len(b.frame)] + after)
    assert list(zip(df.kafka_partition, df.kafka_offset)) == [r[:2] for r in kafka.read_all(t)]
    assert again.offsets() == {f"{t}:{p}": 1000 for p in range(3)}
    again.close()


def test_json_columns_equal_pandas(kafka):
    t = kafka.create_topic(topic_name(), 2)
    records = [{"id": i, "price": i * 0.5, "name": f"item{i % 7}", "ok": i % 3 == 0} for i in range(5000)]
    kafka.produce(t, records, partition=[i % 2 for i in range(5000)])
    reader = opened(make_stage(kafka, t, decode="json", batch_size=800))
    df = rows(drain(reader))
    reader.close()
    assert list(df.columns) == ["kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp",
                                "id", "price", "name", "ok"]
    order = [i for p in range(2) for i in range(p, 5000, 2)]    # by partition, then offset
    truth = pd.DataFrame([records[i] for i in order])
    pd.testing.assert_frame_equal(df[truth.columns], truth)


def test_undecodable_values_go_to_dead_letters(kafka):
    t = kafka.create_topic(topic_name(), 2)
    values = [json.dumps({"i": i}) for i in range(100)]
    values[13], values[40], values[77] = "not json", "[1, 2]", b"\xff\xfe"
    kafka.produce(t, values, partition=[i % 2 for i in range(100)])
    reader = opened(make_stage(kafka, t, decode="json", batch_size=30))
    df = rows(drain(reader))
    assert sorted(df.i) == [i for i in range(100) if i not in (13, 40, 77)]
    letters = sorted(reader.dead_letters, key=lambda d: d[0]["kafka_offset"])
    assert [(d["kafka_partition"], d["kafka_offset"], d["value"]) for d, _ in letters] == [
        (1, 6, b"not json"), (0, 20, b"[1, 2]"), (1, 38, b"\xff\xfe")]
    assert all(t in why and f"partition {d['kafka_partition']} offset {d['kafka_offset']}" in why
               for d, why in letters)
    assert "not JSON" in letters[0][1] and "not a JSON object" in letters[1][1]
    # the split's position is after its last record, dead or not, once the batch is out
    assert reader.offsets() == {f"{t}:0": 50, f"{t}:1": 50}
    reader.close()


def test_a_decode_function_that_raises_spares_the_other_values(kafka):
    t = kafka.create_topic(topic_name(), 1)
    kafka.produce(t, [b"1", b"2", b"x", b"4"], partition=0)

    def ints(values):
        return pd.DataFrame({"n": [int(v) for v in values]})

    reader = opened(make_stage(kafka, t, decode=ints))
    df = rows(drain(reader))
    assert df.n.tolist() == [1, 2, 4] and df.kafka_offset.tolist() == [0, 1, 3]
    [(record, why)] = reader.dead_letters
    assert record["value"] == b"x" and record["kafka_offset"] == 2
    assert "ints" in why and "ValueError" in why
    reader.close()


def test_transactional_topic_read_whole_with_offset_gaps(kafka):
    t = kafka.create_topic(topic_name(), 1)
    transactions(kafka, t, same_producer=True)
    # a0 a1 a2 | marker 3 | x0 x1 (aborted) | marker 6 | b0 b1 b2 (7-9) | marker 10
    reader = opened(make_stage(kafka, t, batch_size=2))
    batches = drain(reader)
    df = rows(batches)
    assert df.value.tolist() == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
    assert df.kafka_offset.tolist() == [0, 1, 2, 7, 8, 9]
    assert reader.offsets() == {f"{t}:0": 10}
    saved = reader.save(reader.snapshot())
    reader.close()
    # from the position saved mid-way (after a2) and at the end: nothing again, and it ends
    resumed = opened(make_stage(kafka, t, batch_size=2), saved={"kafka": {f"{t}:0": 3}})
    assert rows(drain(resumed)).value.tolist() == [b"b0", b"b1", b"b2"]
    resumed.close()
    at_end = opened(make_stage(kafka, t), saved=saved)
    assert drain(at_end) == [] and at_end.idle() == {f"{t}:0"}
    at_end.close()


def test_new_splits_finds_an_added_partition(kafka):
    t = kafka.create_topic(topic_name(), 2)
    readers = [opened(make_stage(kafka, t, until=None, parallelism=2), i) for i in range(2)]
    for r in readers:
        r.discovery_interval = 0
    assert [r.new_splits() for r in readers] == [[], []]
    admin = kafka.admin()
    admin.create_partitions([ck.admin.NewPartitions(t, 5)])[t].result(timeout=15)
    kafka.produce(t, ["new"], partition=3)
    deadline = time.monotonic() + 10
    while len(kafka.partitions(t)) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    found = [r.new_splits() for r in readers]
    assert found == [[Split(f"{t}:2", 0), Split(f"{t}:4", 0)], [Split(f"{t}:3", 0)]]
    readers[1].add_splits(found[1])
    assert readers[1].new_splits() == []
    deadline = time.monotonic() + 10
    while (b := readers[1].poll()) is not None and not len(b.frame):
        assert time.monotonic() < deadline
    assert (b.split_id, b.frame.value.tolist()) == (f"{t}:3", [b"new"])
    readers[0].discovery_interval = 60
    assert readers[0].new_splits() == []        # looked up just now
    for r in readers:
        r.close()


def test_unbounded_read_returns_empty_frames_not_none(kafka):
    t = kafka.create_topic(topic_name(), 2)
    reader = opened(make_stage(kafka, t, until=None))
    t0 = time.monotonic()
    frame = reader.read(f"{t}:0")
    assert time.monotonic() - t0 < 1
    assert frame is not None and len(frame) == 0
    assert list(frame.columns) == ["kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp", "value"]
    b = reader.poll()
    assert b is not None and len(b.frame) == 0 and reader.idle() == set()
    kafka.produce(t, ["x", "y"], partition=1)
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        got += reader.poll().frame.value.tolist()
    assert got == [b"x", b"y"]
    assert reader.poll() is not None and reader.offsets() == {f"{t}:0": 0, f"{t}:1": 2}
    reader.close()


def test_offsets_rules_and_commit(kafka):
    t = kafka.create_topic(topic_name(), 2)
    kafka.produce(t, [f"v{i}" for i in range(20)], partition=[i % 2 for i in range(20)])
    group = topic_name("g")
    params = {**kafka.consumer_conf, "group.id": group}
    latest = reader_of(make_stage(kafka, t, offsets="latest"))
    assert latest.splits_at({}) == [Split(f"{t}:0", 10), Split(f"{t}:1", 10)]
    reader = opened(make_stage(kafka, t, consumer_params=params, offsets="committed", batch_size=3))
    # nothing committed yet: from the earliest offset
    assert reader.offsets() == {f"{t}:0": 0, f"{t}:1": 0}
    reader.commit({f"{t}:0": 4, f"{t}:1": 7, "other-topic:0": 1})
    c = kafka.consumer(**{"group.id": group})
    deadline = time.monotonic() + 10
    while [tp.offset for tp in c.committed([ck.TopicPartition(t, 0), ck.TopicPartition(t, 1)], timeout=10)] != [4, 7]:
        assert time.monotonic() < deadline, "the offsets were not committed"
        time.sleep(0.1)
    c.close()
    committed = reader_of(make_stage(kafka, t, consumer_params=params, offsets="committed"))
    assert committed.splits_at({}) == [Split(f"{t}:0", 4), Split(f"{t}:1", 7)]
    # no group of the user's: nothing to commit to, and nothing raised
    private = opened(make_stage(kafka, t))
    private.commit({f"{t}:0": 4})
    for r in (latest, reader, committed, private):
        r.close()
    reader.commit({f"{t}:0": 5})        # closed: still never raises


def test_advance_needs_the_batch(kafka):
    t = kafka.create_topic(topic_name(), 1)
    reader = reader_of(make_stage(kafka, t))
    frame = pd.DataFrame({"kafka_offset": np.array([4, 9, 12], np.int64)})
    assert reader.advance(4, 2, frame) == 10 and reader.advance(4, 3, frame) == 13 and reader.advance(4, 0, frame) == 4
    with pytest.raises(TypeError, match="gaps"):
        reader.advance(4, 3)
    reader.close()


@pytest.mark.parametrize("change, message", [
    ({"consumer_params": {}}, "consumer_params needs 'bootstrap.servers'"),
    ({"offsets": "newest"}, "offsets='newest'; valid: 'committed', 'earliest', 'latest'"),
    ({"until": "forever"}, "until='forever'; valid: None, 'end'"),
    ({"decode": "avro"}, "decode='avro'; valid: None, 'json' or a callable"),
])
def test_bad_settings_raise_value_error(kafka, change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        KafkaReader(make_stage(kafka, "any", **change), 0)


def test_a_missing_topic_is_named_with_the_bootstrap_address(kafka):
    reader = reader_of(make_stage(kafka, "no-such-topic-xyz"))
    with pytest.raises(PipelineError, match=f"topic 'no-such-topic-xyz' does not exist at {kafka.bootstrap}"):
        reader.splits_at({})
    reader.close()


def test_what_waits_to_be_handed_out_stays_bounded(kafka):
    t = kafka.create_topic(topic_name(), 2)
    kafka.produce(t, [f"v{i}" for i in range(5000)], partition=0)
    kafka.produce(t, [f"w{i}" for i in range(50)], partition=1)
    reader = opened(make_stage(kafka, t, batch_size=100))
    order, most = [], 0
    deadline = time.monotonic() + 15
    while (b := reader.poll()) is not None:
        assert time.monotonic() < deadline
        most = max(most, sum(map(len, reader._buffers.values())))
        if len(b.frame):
            order.append(b.split_id)
    assert (order.count(f"{t}:0"), order.count(f"{t}:1")) == (50, 1)
    assert most <= 2 * 100 + 100        # a batch per split, and one consume call more


def test_partitions_with_records_not_handed_out_are_waiting(kafka):
    """``waiting()`` (the watermark never takes these splits for idle): a partition with
    records at the broker or consumed but not handed out, until it is read to its end."""
    t = kafka.create_topic(topic_name(), 3)
    kafka.produce(t, [f"v{i}" for i in range(3000)], partition=0)
    kafka.produce(t, [f"w{i}" for i in range(20)], partition=1)
    reader = opened(make_stage(kafka, t, batch_size=100, until=None))
    assert reader.waiting() >= {f"{t}:0", f"{t}:1"}        # nothing fetched yet
    deadline = time.monotonic() + 15
    while reader.waiting():
        assert time.monotonic() < deadline, reader.waiting()
        reader.poll()
    assert sum(reader.offsets().values()) == 3020       # read to the end of each: none waits
    kafka.produce(t, ["x"], partition=2)
    while f"{t}:2" not in reader.waiting():        # a new record: waiting once the consumer hears of it
        assert time.monotonic() < deadline + 15, reader.waiting()
        reader._consume()
