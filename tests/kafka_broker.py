"""A Kafka broker for the tests: a real broker process, or an external cluster.

No Apache Kafka installs from PyPI; ``noida-db`` (the test extra) does, as one small binary
that speaks the Kafka protocol: produce and consume, consumer groups and committed offsets,
transactions read under ``read_committed``, ``offsets_for_times``, high watermarks, and
its data kept across a restart. :class:`Broker` runs it on a free 127.0.0.1 port with a
temporary data directory, in a process group of its own, and talks to it through
``confluent-kafka``. What noida-db 0.2.3 gets wrong (test_kafka_broker.py shows the last two): a
fetch answers with everything to the end whatever its size limit (consumers need
:attr:`Broker.consumer_conf`); a fetch from past an aborted transaction makes librdkafka
skip that producer's later committed records; writes acknowledged within about a second
of a SIGKILL are lost.

With ``STREAMLB_KAFKA_BOOTSTRAP=host:port`` set, a :class:`Broker` points at that cluster
instead (start nothing; :meth:`Broker.restart` and :meth:`Broker.kill` skip the test).
Topics there outlive a run, so tests name theirs with :func:`topic_name`.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence

import pytest

ENV = "STREAMLB_KAFKA_BOOTSTRAP"
START_TIMEOUT = 30.0


def topic_name(prefix: str = "t") -> str:
    """A topic name no earlier run used."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _noida_binary() -> str:
    """The broker binary itself (not the ``noida-db`` console script, a Python process
    that would stand between a signal and the broker)."""
    from importlib.resources import files

    try:
        path = str(files("noida_db").joinpath("noida-db"))
    except ModuleNotFoundError:
        pytest.skip("noida-db is not installed (pip install -e '.[test]')")
    if not os.path.isfile(path):
        pytest.skip(f"noida-db's binary is missing at {path}")
    os.chmod(path, 0o755)
    return path


def _encode(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return json.dumps(v).encode()


class Broker:
    """A Kafka broker: :meth:`start` one, or :meth:`connect` to ``$STREAMLB_KAFKA_BOOTSTRAP``.

    Attributes
    ----------
    bootstrap : str
        ``"127.0.0.1:PORT"``, for ``bootstrap.servers``.
    """

    def __init__(self, bootstrap: str, port: int | None = None, workdir: str | None = None) -> None:
        self.bootstrap, self.port, self.workdir = bootstrap, port, workdir
        self.proc: subprocess.Popen | None = None
        self.external = workdir is None
        # what a consumer of this broker needs: noida-db answers a fetch with everything
        # from the offset on, whatever fetch.max.bytes says, which past librdkafka's
        # default limit of 100 MB fails the fetch (and retries it, forever)
        self.consumer_conf = {"bootstrap.servers": bootstrap}
        if not self.external:
            self.consumer_conf["receive.message.max.bytes"] = 1 << 30

    # -- the process ----------------------------------------------------------------------
    @classmethod
    def start(cls) -> Broker:
        """A broker process of its own (or the external cluster, if the variable is set)."""
        pytest.importorskip("confluent_kafka")
        if os.environ.get(ENV):
            return cls(os.environ[ENV])
        port = _free_port()
        broker = cls(f"127.0.0.1:{port}", port, tempfile.mkdtemp(prefix="streamlb-kafka-"))
        broker._launch()
        return broker

    @property
    def data_dir(self) -> str:
        return os.path.join(self.workdir, "data")

    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "broker.log")

    def command(self) -> list[str]:
        return [_noida_binary(), "start", "--only", "kafka", "--kafka-port", str(self.port),
                "--data-dir", self.data_dir]

    def _launch(self) -> None:
        cmd = self.command()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self._wait_ready(cmd)

    def _wait_ready(self, cmd: list[str]) -> None:
        """Until the broker answers a metadata request."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # log_level 0: no "connection refused" lines while it boots
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited with code {self.proc.returncode}: "
                                   f"{' '.join(cmd)}\n{self._output()}")
            try:
                admin.list_topics(timeout=1)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"the Kafka broker did not answer on {self.bootstrap} within "
                                       f"{START_TIMEOUT:.0f} s: {' '.join(cmd)}\n{self._output()}") from None
                time.sleep(0.1)

    def _output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def _external(self, what: str) -> None:
        if self.external:
            pytest.skip(f"cannot {what} the external Kafka cluster at {self.bootstrap} (${ENV})")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if the broker is still there after ``timeout`` s."""
        self._external("stop")
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self._external("kill")
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        """Stop and start again, on the same port with the same data."""
        self._external("restart")
        self.stop()
        self._launch()

    def close(self) -> None:
        """End the broker process and delete its data (nothing, for an external cluster).
        A SIGKILL: its data goes next, so there is nothing to close cleanly (a SIGTERM took up
        to its 10 s timeout at the end of the suite, after the 2M-record topics)."""
        if self.external:
            return
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- clients --------------------------------------------------------------------------
    def admin(self, **conf):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, **conf})

    def producer(self, **conf):
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap, **conf})

    def consumer(self, **conf):
        """A consumer (a group id of its own unless ``group.id`` is given)."""
        from confluent_kafka import Consumer

        return Consumer({**self.consumer_conf, "group.id": topic_name("g"), "enable.auto.commit": False, **conf})

    def create_topic(self, name: str, partitions: int = 1) -> str:
        """Create topic ``name``; returns the name."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()     # kept until the answer: a client let go cancels its requests
        admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name].result(timeout=15)
        deadline = time.monotonic() + 10
        while len(self.partitions(name)) < partitions:      # until the metadata shows them
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name!r} has not shown {partitions} partitions")
            time.sleep(0.05)
        return name

    def partitions(self, topic: str) -> list[int]:
        md = self.admin().list_topics(topic, timeout=10).topics.get(topic)
        return sorted(md.partitions) if md is not None and md.error is None else []

    def produce(self, topic: str, values: Iterable, keys: Iterable | None = None,
                partition: int | Sequence[int] | None = None) -> int:
        """Produce ``values`` (bytes, str, or anything else as JSON; None: a tombstone) and
        wait until all are written; returns how many.

        ``keys`` go with the values one by one; ``partition`` is one partition for all, one
        per value, or None (the client's partitioner: by key, else sticky at random).
        """
        p = self.producer(**{"linger.ms": 20, "batch.num.messages": 10_000, "batch.size": 4_000_000,
                             "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576})
        failed: list = []
        values = list(values)
        keys = [None] * len(values) if keys is None else [_encode(k) for k in keys]
        if partition is None or isinstance(partition, int):
            parts = [-1 if partition is None else partition] * len(values)
        else:
            parts = list(partition)
        if not len(keys) == len(parts) == len(values):
            raise ValueError(f"{len(values)} values, {len(keys)} keys, {len(parts)} partitions")

        def report(err, msg):
            if err is not None:
                failed.append(err)

        send = p.produce
        for v, k, part in zip(values, keys, parts):
            v = _encode(v)
            while True:
                try:
                    send(topic, v, k, part, report)
                    break
                except BufferError:     # the local queue is full: let it drain
                    p.poll(0.05)
        left = p.flush(60)
        if left or failed:
            raise RuntimeError(f"producing to {topic!r}: {left} not delivered, errors: {failed[:3]}")
        return len(values)

    def read_all(self, topic: str, isolation: str = "read_committed", timeout: float = 30.0) -> list[tuple]:
        """Every record of ``topic`` up to its end offsets now, as ``(partition, offset,
        key, value)`` in partition and offset order."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        c = self.consumer(**{"isolation.level": isolation})
        try:
            ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in self.partitions(topic)}
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
            out: list[tuple] = []
            left = {p for p, end in ends.items() if end > 0}
            deadline = time.monotonic() + timeout
            while left:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic!r}: partitions {sorted(left)} not read to "
                                       f"their end offsets {ends}")
                for m in c.consume(10_000, 0.2):
                    if m.error():
                        raise RuntimeError(f"reading {topic!r}: {m.error()}")
                    if m.offset() < ends[m.partition()]:
                        out.append((m.partition(), m.offset(), m.key(), m.value()))
                for tp in c.position([TopicPartition(topic, p) for p in left]):
                    if tp.offset >= ends[tp.partition]:
                        left.discard(tp.partition)
            return sorted(out, key=lambda r: (r[0], r[1]))
        finally:
            c.close()
