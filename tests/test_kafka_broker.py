"""What the Kafka source relies on, shown against the real broker process of the tests.

Each test checks one behaviour of the broker (``noida-db``) and the client
(``confluent-kafka``) that the Kafka source builds on: partitions, transactions under
read_committed, high watermarks, seeking by assignment, committed offsets, restarts.
"""
from __future__ import annotations

import json
import time

import pytest

from kafka_broker import topic_name

ck = pytest.importorskip("confluent_kafka")
TopicPartition = ck.TopicPartition


def consume_until(consumer, n: int, timeout: float = 10.0) -> list:
    """At least ``n`` messages (fewer only once ``timeout`` s have passed)."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.1):
            assert m.error() is None, m.error()
            out.append(m)
    return out


def high(consumer, topic: str, p: int = 0) -> int:
    return consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]


def test_produce_and_consume_across_four_partitions(kafka):
    t = kafka.create_topic(topic_name(), 4)
    values = [json.dumps({"i": i}) for i in range(1000)]
    kafka.produce(t, values, keys=[str(i) for i in range(1000)], partition=[i % 4 for i in range(1000)])
    records = kafka.read_all(t)
    assert len(records) == 1000
    for p in range(4):
        mine = [r for r in records if r[0] == p]
        assert [r[1] for r in mine] == list(range(250))
        assert [json.loads(r[3])["i"] for r in mine] == list(range(p, 1000, 4))
        assert [r[2] for r in mine] == [str(i).encode() for i in range(p, 1000, 4)]


def test_bulk_produce_of_two_million_records_is_fast(kafka):
    t = kafka.create_topic(topic_name(), 4)
    values = [b'{"i":%d,"k":%d}' % (i, i % 100) for i in range(2_000_000)]
    t0 = time.perf_counter()
    kafka.produce(t, values, partition=[i % 4 for i in range(len(values))])
    took = time.perf_counter() - t0
    c = kafka.consumer()
    assert sum(high(c, t, p) for p in range(4)) == 2_000_000
    c.close()
    assert took < 30, f"2M records took {took:.1f} s"


def test_aborted_transaction_is_invisible_and_committed_one_seen_once(kafka):
    t = kafka.create_topic(topic_name(), 1)
    p = kafka.producer(**{"transactional.id": topic_name("tx")})
    p.init_transactions(10)
    c = kafka.consumer()
    highs = []
    for values, commit in [([b"a0", b"a1", b"a2"], True), ([b"x0", b"x1", b"x2"], False), ([b"b0", b"b1"], True)]:
        p.begin_transaction()
        for v in values:
            p.produce(t, v, partition=0)
        if commit:
            p.commit_transaction(10)
        else:
            p.flush(10)
            p.abort_transaction(10)
        highs.append(high(c, t))
    # each transaction ends in a marker, one offset of its own
    assert highs == [4, 8, 11]
    assert [(r[1], r[3]) for r in kafka.read_all(t)] == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (8, b"b0"), (9, b"b1")]
    assert [r[3] for r in kafka.read_all(t, isolation="read_uncommitted")] == [
        b"a0", b"a1", b"a2", b"x0", b"x1", b"x2", b"b0", b"b1"]
    # past the last record the position skips the commit marker, to the high watermark
    c.assign([TopicPartition(t, 0, 0)])
    assert [m.offset() for m in consume_until(c, 5)] == [0, 1, 2, 8, 9]
    assert c.position([TopicPartition(t, 0)])[0].offset == 11
    c.close()


def test_an_open_transaction_holds_read_committed_back(kafka):
    t = kafka.create_topic(topic_name(), 1)
    kafka.produce(t, [b"before"], partition=0)
    p = kafka.producer(**{"transactional.id": topic_name("tx")})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce(t, b"pending", partition=0)
    p.flush(10)
    c = kafka.consumer()
    c.assign([TopicPartition(t, 0, 0)])
    assert [m.value() for m in consume_until(c, 2, timeout=2)] == [b"before"]
    p.commit_transaction(10)
    assert [m.value() for m in consume_until(c, 1)] == [b"pending"]
    c.close()


def test_assign_at_an_offset_per_partition_and_seek(kafka):
    t = kafka.create_topic(topic_name(), 3)
    kafka.produce(t, [f"{i}" for i in range(300)], partition=[i % 3 for i in range(300)])
    c = kafka.consumer()
    c.assign([TopicPartition(t, 0, 10), TopicPartition(t, 1, 95), TopicPartition(t, 2, 100)])
    got = consume_until(c, 90 + 5)
    first = {}
    for m in got:
        first.setdefault(m.partition(), m.offset())
    assert first == {0: 10, 1: 95} and len(got) == 95
    c.seek(TopicPartition(t, 0, 40))
    again = consume_until(c, 60)
    assert [m.offset() for m in again] == list(range(40, 100))
    c.close()


def test_committed_offsets_of_a_group_read_back(kafka):
    t = kafka.create_topic(topic_name(), 2)
    group = topic_name("g")
    c = kafka.consumer(**{"group.id": group})
    c.commit(offsets=[TopicPartition(t, 0, 7), TopicPartition(t, 1, 3)], asynchronous=False)
    c.close()
    c = kafka.consumer(**{"group.id": group})
    got = c.committed([TopicPartition(t, 0), TopicPartition(t, 1)], timeout=10)
    assert [(tp.partition, tp.offset) for tp in got] == [(0, 7), (1, 3)]
    nothing = kafka.consumer().committed([TopicPartition(t, 0)], timeout=10)
    assert nothing[0].offset == ck.OFFSET_INVALID
    c.close()


def test_offsets_for_times(kafka):
    """The first offset at or after a time. The records are known written first (all
    acknowledged, the high watermark at 10): in a loaded fresh-clone run the lookup once
    answered -1 ("none that late"), and ``flush``'s own answer was not checked then. The
    broker has just taken the 2M records of the bulk test, so it is given 60 s."""
    t = kafka.create_topic(topic_name(), 1)
    p = kafka.producer()
    for i in range(10):
        p.produce(t, b"%d" % i, partition=0, timestamp=1_000_000 + 1000 * i)
    assert p.flush(60) == 0, "records not acknowledged within 60 s"
    c = kafka.consumer()
    assert c.get_watermark_offsets(TopicPartition(t, 0), timeout=30) == (0, 10)
    got = c.offsets_for_times([TopicPartition(t, 0, 1_004_500)], timeout=30)
    assert got[0].offset == 5
    got = c.offsets_for_times([TopicPartition(t, 0, 1_009_500)], timeout=30)
    assert got[0].offset == -1, "no record is that late: the lookup answers the end (-1)"
    c.close()


def test_data_kept_across_a_restart():
    """A broker of this test's own: the session's holds what every Kafka test wrote (2M
    records and more), which a restarted broker loads for tens of seconds on a slow machine
    while it already answers metadata, so its topics read as empty meanwhile."""
    from kafka_broker import Broker

    kafka = Broker.start()
    if kafka.external:
        pytest.skip("cannot restart the external Kafka cluster ($STREAMLB_KAFKA_BOOTSTRAP)")
    try:
        _kept_across_a_restart(kafka)
    finally:
        kafka.close()


def _kept_across_a_restart(kafka):
    t = kafka.create_topic(topic_name(), 2)
    kafka.produce(t, [f"v{i}" for i in range(500)], partition=[i % 2 for i in range(500)])
    group = topic_name("g")
    c = kafka.consumer(**{"group.id": group})
    c.commit(offsets=[TopicPartition(t, 1, 42)], asynchronous=False)
    c.close()
    before = kafka.read_all(t)
    kafka.restart()
    # the broker answers metadata before it has loaded its logs: wait for what was there
    deadline = time.monotonic() + 30
    while (after := kafka.read_all(t)) != before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert after == before
    c = kafka.consumer(**{"group.id": group})
    assert c.committed([TopicPartition(t, 1)], timeout=10)[0].offset == 42
    assert high(c, t, 1) == 250
    c.close()
    kafka.produce(t, ["after"], partition=0)
    assert kafka.read_all(t)[250] == (0, 250, None, b"after")


def transactions(kafka, topic: str, same_producer: bool) -> None:
    """a0 a1 a2 committed (marker 3), x0 x1 aborted (marker 6), b0 b1 b2 committed (7-9, marker 10)."""
    producers = [kafka.producer(**{"transactional.id": topic_name("tx")}) for _ in range(1 if same_producer else 3)]
    for p in producers:
        p.init_transactions(10)
    for i, (values, commit) in enumerate([([b"a0", b"a1", b"a2"], True), ([b"x0", b"x1"], False),
                                          ([b"b0", b"b1", b"b2"], True)]):
        p = producers[i % len(producers)]
        p.begin_transaction()
        for v in values:
            p.produce(topic, v, partition=0)
        if commit:
            p.commit_transaction(10)
        else:
            p.flush(10)
            p.abort_transaction(10)


def test_a_fetch_from_past_an_aborted_transaction_of_another_producer(kafka):
    t = kafka.create_topic(topic_name(), 1)
    transactions(kafka, t, same_producer=False)
    c = kafka.consumer()
    c.assign([TopicPartition(t, 0, 7)])
    assert [m.value() for m in consume_until(c, 3)] == [b"b0", b"b1", b"b2"]
    c.close()


def test_a_fetch_from_past_an_aborted_transaction_of_the_same_producer(kafka, request):
    """Where a read_committed consumer starts (a restore, a seek, a pause and resume) past an
    aborted transaction, it still gets that producer's later committed records."""
    if not kafka.external:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "noida-db 0.2.3 lists, in a fetch response, aborted transactions that ended before the fetch "
            "offset: librdkafka then skips the producer's records as aborted up to its next marker")))
    t = kafka.create_topic(topic_name(), 1)
    transactions(kafka, t, same_producer=True)
    c = kafka.consumer()
    c.assign([TopicPartition(t, 0, 7)])
    assert [m.value() for m in consume_until(c, 3, timeout=3)] == [b"b0", b"b1", b"b2"]
    c.close()
