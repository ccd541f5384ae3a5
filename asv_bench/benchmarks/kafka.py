"""Records/s from a Kafka topic into a keyed aggregate: streamlb on 2 worker processes
against a plain confluent-kafka consume loop in one process (the ceiling; goal >= 0.8x) and
against Bytewax's Kafka source (goal >= 5x) (docs/kafka.md, "Throughput").

The topic: ``ROWS`` JSON records ``{"key": int, "value": float}``, keys Zipf(1.2) over 100k
(the same keys as the Parquet benchmarks' ``datasets.zipf``), values integers 0..999 as
floats (sums exact), produced round-robin into 4 partitions without message keys, once per
sitting, into a noida-db broker process on loopback (``tests/kafka_broker.py``). The work,
the same on all three: read every record from the beginning to the end offsets, decode its
JSON, and keep per key the count and the sum of ``value``; a run is checked against pandas
over the produced records.

- streamlb: ``Stream.from_kafka_topic(topic, conf, decode="json", until="end")``
  ``.key_by("key").aggregate(...)``, ``streamlb.run`` on a warm ``LocalCluster`` of 2
  worker processes (one thread each) at the defaults (one source instance per worker, two
  partitions each, 10,000 records per batch); records/s from ``Job.summary()`` (the first
  source instance starting to the last instance finishing).
- consume loop: one ``confluent_kafka.Consumer`` in this process, all partitions assigned
  from the beginning, ``consume(10_000, 0.1)`` until every partition reached the end offset
  it had at the start; each call's values are decoded as streamlb decodes them (joined into
  one JSON array, one ``json.loads``, a DataFrame), grouped by key into count and sum, and
  the partial results combined every 64 calls and at the end. Timed from the consumer's
  creation to the final totals.
- Bytewax 0.21.1: ``op.input`` with ``KafkaSource(tail=False, batch_size=10_000)``,
  ``op.map`` of ``json.loads``, ``op.key_on`` (Bytewax keys are strings), ``op.fold_final``
  into ``(count, sum)``, two processes of one worker (``python -m bytewax.run -i N -a ...``,
  as a Bytewax user spreads a flow over cores). Timed from the first partition's consumer
  being built to the last process's sink closing after the final emit (process start and
  imports left out, as for the others); the launch-to-exit wall time is kept beside it.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from ._common import _cpu, _OneShot, cluster

ROWS, KEYS, SKEW, PARTITIONS = 1_000_000, 100_000, 1.2, 4
BATCH = 10_000
SPEC = {"count": ("value", "count"), "sum": ("value", "sum")}
SYSTEMS = ("streamlb", "consume_loop", "bytewax")
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "..", "tests")


def records(rows: int = ROWS, seed: int = 0):
    """The topic's records as a DataFrame ``key`` (int64), ``value`` (float64)."""
    import numpy as np
    import pandas as pd

    from streamlb import datasets

    keys = datasets.zipf_keys(np.arange(rows), KEYS, SKEW, None, seed)
    values = np.random.default_rng([seed, 1]).integers(0, 1000, rows).astype(np.float64)
    return pd.DataFrame({"key": keys, "value": values})


def truth(df):
    """count and sum of ``value`` per key, as every system must find them."""
    return df.groupby("key")["value"].agg(["count", "sum"]).sort_index()


class Topic:
    """A broker process holding the benchmark's topic: ``with Topic(rows) as t:``."""

    def __init__(self, rows: int = ROWS) -> None:
        self.rows = rows

    def __enter__(self) -> Topic:
        if TESTS not in sys.path:
            sys.path.insert(0, TESTS)
        from kafka_broker import Broker, topic_name

        df = records(self.rows)
        self.truth = truth(df)
        values = [b'{"key": %d, "value": %.1f}' % kv for kv in zip(df.key.tolist(), df.value.tolist())]
        self.broker = Broker.start()
        try:
            self.name = self.broker.create_topic(topic_name("bench"), PARTITIONS)
            self.broker.produce(self.name, values, partition=[i % PARTITIONS for i in range(len(values))])
        except BaseException:
            self.broker.close()
            raise
        self.conf = dict(self.broker.consumer_conf)
        return self

    def __exit__(self, *exc) -> None:
        self.broker.close()


def _checked(name: str, got, want) -> None:
    """Raise if ``got`` (count, sum per key) is not ``want``."""
    import numpy as np

    got = got[["count", "sum"]].sort_index()
    got.index = got.index.astype(np.int64)
    if not (got.index.equals(want.index) and np.array_equal(got["count"].to_numpy(np.int64),
                                                            want["count"].to_numpy(np.int64))
            and np.array_equal(got["sum"].to_numpy(np.float64), want["sum"].to_numpy(np.float64))):
        raise AssertionError(f"{name}: totals differ from pandas over the produced records "
                             f"({len(got)} keys, {got['count'].sum()} records; want {len(want)}, "
                             f"{want['count'].sum()})")


# -- the three systems: each returns {"rate": records/s, "wall": s, "totals": DataFrame} ------
def run_streamlb(client, topic: Topic) -> dict:
    from streamz import Stream

    import streamlb

    t0 = time.perf_counter()
    src = Stream.from_kafka_topic(topic.name, topic.conf, decode="json", until="end")
    src.key_by("key").aggregate(SPEC, name="totals")
    with streamlb.run(src, client=client) as job:
        job.wait()
        wall = time.perf_counter() - t0
        s = job.summary()
        totals = job.state("totals")
    return {"rate": s["records_per_second"], "wall": wall, "totals": totals, "records": s["records"]}


def _combined(partials: list):
    import pandas as pd

    return pd.concat(partials).groupby(level=0).sum()


def run_consume_loop(topic: Topic, batch: int = BATCH) -> dict:
    import pandas as pd
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    t0 = time.perf_counter()
    c = Consumer({**topic.conf, "group.id": f"bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        parts = sorted(c.list_topics(topic.name, timeout=10).topics[topic.name].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic.name, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic.name, p, OFFSET_BEGINNING) for p in parts])
        left = {p for p, end in ends.items() if end > 0}
        partials, n = [], 0
        while left:
            values = []
            for m in c.consume(batch, 0.1):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"consuming {topic.name!r}: {err.str()}")
                p, off = m.partition(), m.offset()
                if off < ends[p]:
                    values.append(m.value())
                if off >= ends[p] - 1:
                    left.discard(p)
            if values:
                n += len(values)
                frame = pd.DataFrame(json.loads(b"[" + b",".join(values) + b"]"))
                partials.append(frame.groupby("key")["value"].agg(["count", "sum"]))
                if len(partials) >= 64:
                    partials = [_combined(partials)]
        totals = _combined(partials)
    finally:
        c.close()
    wall = time.perf_counter() - t0
    return {"rate": n / wall, "wall": wall, "totals": totals, "records": n}


def bytewax_flow(bootstrap: str, topic: str, out: str, conf: dict):
    """The Bytewax dataflow (built in each ``bytewax.run`` process); ``out``: a directory
    where each partition's consumer stamps when it was built and each worker's sink writes
    its totals and when it closed."""
    from bytewax import operators as op
    from bytewax.connectors.kafka import KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class StampedSource(KafkaSource):
        def build_part(self, step_id, for_part, resume_state):
            part = super().build_part(step_id, for_part, resume_state)
            with open(os.path.join(out, f"start-{for_part}"), "w") as f:
                f.write(repr(time.time()))
            return part

    class Collect(StatelessSinkPartition):
        def __init__(self, path: str) -> None:
            self.path, self.rows = path, []

        def write_batch(self, items) -> None:
            self.rows.extend((int(k), c, s) for k, (c, s) in items)

        def close(self) -> None:
            with open(self.path, "w") as f:
                json.dump({"end": time.time(), "rows": self.rows}, f)

    class CollectSink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return Collect(os.path.join(out, f"out-{worker_index}.json"))

    flow = Dataflow("kafka_totals")
    msgs = op.input("kafka", flow, StampedSource([bootstrap], [topic], tail=False, batch_size=BATCH,
                                                 add_config=conf))
    rows = op.map("decode", msgs, lambda m: json.loads(m.value))
    keyed = op.key_on("key", rows, lambda r: str(r["key"]))
    totals = op.fold_final("totals", keyed, lambda: (0, 0.0), lambda acc, r: (acc[0] + 1, acc[1] + r["value"]))
    op.output("out", totals, CollectSink())
    return flow


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_bytewax(topic: Topic, processes: int = 2, timeout: float = 600) -> dict:
    import pandas as pd

    conf = {k: str(v) for k, v in topic.conf.items() if k != "bootstrap.servers"}
    with tempfile.TemporaryDirectory(prefix="bench-bytewax-") as out:
        flow = f"{__name__}:bytewax_flow({topic.conf['bootstrap.servers']!r}, {topic.name!r}, {out!r}, {conf!r})"
        addresses = ";".join(f"127.0.0.1:{p}" for p in _free_ports(processes))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [os.path.dirname(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "bytewax.run", flow, "-i", str(i), "-a", addresses],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for i in range(processes)]
        try:
            outputs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        wall = time.perf_counter() - t0
        for p, text in zip(procs, outputs):
            if p.returncode:
                raise RuntimeError(f"bytewax.run exited with {p.returncode}:\n{text[-3000:]}")
        starts, ends, rows = [], [], []
        for name in os.listdir(out):
            with open(os.path.join(out, name)) as f:
                if name.startswith("start-"):
                    starts.append(float(f.read()))
                else:
                    got = json.load(f)
                    ends.append(got["end"])
                    rows.extend(got["rows"])
    totals = pd.DataFrame(rows, columns=["key", "count", "sum"]).set_index("key")
    n = int(totals["count"].sum())
    return {"rate": n / (max(ends) - min(starts)), "wall": wall, "totals": totals, "records": n}


# -- a sitting ---------------------------------------------------------------------------
def _cpu_reaped() -> tuple[float, float]:
    """As ``_common._cpu``, with the CPU of this process's children that have exited (the
    Bytewax processes are gone before a run's second reading)."""
    import psutil

    machine, mine = _cpu()
    t = psutil.Process().cpu_times()
    return machine, mine + t.children_user + t.children_system


def sitting(rounds: int = 3, rows: int = ROWS, report=None) -> list[dict]:
    """``rounds`` rounds of streamlb, the consume loop and Bytewax, one after the other, on
    one topic and one warm cluster (an untimed streamlb run warms it first). Returns one
    dict per run: ``system``, ``round``, ``rate``, ``wall``, ``cpu`` (CPU seconds of this
    process and its children: the run itself, the broker, the idle or busy cluster),
    ``other_cores`` (cores that other processes used meanwhile); each run's totals are
    checked against pandas. ``report(run)`` is called after each run."""
    runs = []
    with Topic(rows) as topic:
        cl, client = cluster(2)
        with cl, client:
            _checked("streamlb (warm-up)", run_streamlb(client, topic)["totals"], topic.truth)
            for r in range(rounds):
                for system in SYSTEMS:
                    t0, (all0, mine0) = time.perf_counter(), _cpu_reaped()
                    if system == "streamlb":
                        got = run_streamlb(client, topic)
                    elif system == "consume_loop":
                        got = run_consume_loop(topic)
                    else:
                        got = run_bytewax(topic)
                    all1, mine1 = _cpu_reaped()
                    other = max(0.0, (all1 - all0) - (mine1 - mine0)) / (time.perf_counter() - t0)
                    _checked(system, got.pop("totals"), topic.truth)
                    runs.append({"system": system, "round": r, **got, "cpu": mine1 - mine0, "other_cores": other})
                    if report is not None:
                        report(runs[-1])
    return runs


def ratios(runs: list[dict], over: str) -> list[float]:
    """streamlb's records/s over ``over``'s, per round."""
    by = {(x["system"], x["round"]): x["rate"] for x in runs}
    return [by["streamlb", r] / by[over, r] for r in sorted({x["round"] for x in runs})]


class KafkaAggregate(_OneShot):
    timeout = 1800

    def setup_cache(self):
        runs = sitting(rounds=2)
        out = {s: statistics.median(x["rate"] for x in runs if x["system"] == s) for s in SYSTEMS}
        out["over_consume_loop"] = statistics.median(ratios(runs, "consume_loop"))
        out["over_bytewax"] = statistics.median(ratios(runs, "bytewax"))
        return out

    def track_streamlb_records_per_second(self, r):
        return r["streamlb"]

    track_streamlb_records_per_second.unit = "records/s"

    def track_consume_loop_records_per_second(self, r):
        return r["consume_loop"]

    track_consume_loop_records_per_second.unit = "records/s"

    def track_bytewax_records_per_second(self, r):
        return r["bytewax"]

    track_bytewax_records_per_second.unit = "records/s"

    def track_over_consume_loop(self, r):
        return r["over_consume_loop"]

    track_over_consume_loop.unit = "x consume loop"

    def track_over_bytewax(self, r):
        return r["over_bytewax"]

    track_over_bytewax.unit = "x Bytewax"
