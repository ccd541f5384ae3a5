"""Counting a Kafka topic's records per key, on an embedded two-worker Dask cluster, exact
against pandas over the records produced.

Produces 50,000 JSON orders (and two records that are not JSON) into a new 4-partition
topic, then runs a bounded job (``until="end"``) that sums the orders per customer. The
undecodable records come out of ``job.dead_letters()`` with their partition and offset.

Needs a Kafka broker: ``STREAMLB_KAFKA_BOOTSTRAP=host:port`` (the tests start one).

Run: STREAMLB_KAFKA_BOOTSTRAP=127.0.0.1:9092 python examples/kafka_counts.py
"""
from __future__ import annotations

import json
import os
import sys
import uuid

import numpy as np
import pandas as pd
from streamz import Stream

import streamlb

ROWS = 50_000


def produce(bootstrap: str, topic: str) -> pd.DataFrame:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(timeout=15)
    rng = np.random.default_rng(0)
    orders = pd.DataFrame({"customer": rng.zipf(1.5, ROWS) % 1000, "amount": rng.integers(1, 500, ROWS)})
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i, row in enumerate(orders.to_dict("records")):
        p.produce(topic, json.dumps(row).encode(), partition=i % 4)
        if i % 10_000 == 0:
            p.poll(0)
    for bad in (b"not json", b"[1, 2, 3]"):
        p.produce(topic, bad, partition=0)
    if p.flush(60):
        raise RuntimeError(f"could not write every order to {topic!r}")
    return orders


def main() -> None:
    bootstrap = os.environ.get("STREAMLB_KAFKA_BOOTSTRAP")
    if not bootstrap:
        sys.exit("set STREAMLB_KAFKA_BOOTSTRAP=host:port to a Kafka broker (see docs/kafka.md)")
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    orders = produce(bootstrap, topic)
    # a broker that ignores fetch size limits sends large fetches: let the client take them
    params = {"bootstrap.servers": bootstrap, "receive.message.max.bytes": 1 << 30}
    src = Stream.from_kafka_topic(topic, params, decode="json", until="end")
    src.key_by("customer").aggregate({"orders": ("amount", "count"), "spent": ("amount", "sum")},
                                     name="per_customer")
    with streamlb.run(src, n_workers=2, balancer="autoflow") as job:
        job.wait()
        got = job.state("per_customer").sort_index()
        dead = job.dead_letters()
    want = orders.groupby("customer").agg(orders=("amount", "count"), spent=("amount", "sum")).sort_index()
    pd.testing.assert_frame_equal(got[["orders", "spent"]], want, check_dtype=False, check_index_type=False)
    assert len(dead) == 2 and all(r["kafka_partition"] == 0 for r in dead.record)
    print(f"{ROWS} orders from {topic!r}: {len(got)} customers, exact; the top three:")
    print(got.sort_values("spent", ascending=False).head(3).to_string())
    print(f"dead letters: {len(dead)} ({dead.reason.iloc[0]})")


if __name__ == "__main__":
    main()
