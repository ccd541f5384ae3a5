"""``to_kafka_topic`` in one instance: a batch's rows as messages, written in Kafka
transactions so a ``read_committed`` reader sees each row once.

Without checkpoints nothing is replayed, so a transaction commits about every second and at
the end of the stream. With checkpoints (two-phase commit, as Flink's Kafka sink): what the
instance wrote since the previous barrier is one transaction, flushed when the barrier
passes (:meth:`KafkaWriter.seal`) and committed once that checkpoint is complete
(:meth:`KafkaWriter.completed`); the next rows go to another producer's transaction
meanwhile. A recovery replays from the last complete checkpoint: what a lost instance wrote
after it was never committed, and its replacement, which takes the same transactional ids
(job, operator, instance, slot), aborts it when it starts (``init_transactions`` fences the
old producer). ``job.stop()`` aborts what no checkpoint committed.

The commit is the writer's own (:meth:`KafkaWriter.completed`, :meth:`KafkaWriter.commit_all`):
a transaction can only be committed by the producer that holds it; the driver's part is to
tell the instances that a checkpoint completed or the job finished.

A transaction of a dead producer cannot be committed by anyone else (librdkafka has no
KIP-939), so what a checkpoint sealed is also kept for whoever resumes it, should its
driver or a worker die between the manifest and the commit. Each sealed transaction's
messages go to the driver with the instance's acknowledgement (:meth:`KafkaWriter.seal`),
which keeps them beside the manifest (:meth:`KafkaCommitter.sealed`); and each sealed
transaction commits, atomically with its messages, a *mark*: the id of the checkpoint
that sealed it, as the committed offset of partition 0 of the topic for a consumer group
of the writer's own (its transactional ids' prefix; ``send_offsets_to_transaction``). A
writer commits its transactions in the order of their marks. Whoever resumes the
checkpoint (:meth:`KafkaCommitter.resume`) first fences every transactional id of the
writers the checkpoint names (their ``init_transactions`` aborts what was left open, so a
``read_committed`` reader is not held back by it), then reads each writer's mark: a sealed
transaction whose mark is not there was never committed, and is written again from the
kept messages, in one transaction with its mark. A second resume, or one after a resume
that stopped half-way, finds the marks and writes nothing twice.

Test hook: with ``STREAMLB_TEST_KILL_BEFORE_KAFKA_COMMIT=<file>`` in a worker's
environment, the first writer to be told a checkpoint completed while it holds a
transaction for it creates ``<file>`` and SIGKILLs its worker process before committing
(once: a file already there does nothing), so a test can lose a worker in that gap
(tests/test_sealed_outputs.py). Not for use outside tests.
"""
from __future__ import annotations

import logging
import os
import signal
import time

import numpy as np
import pandas as pd

from ..exceptions import PipelineError
from ._base import Committer, SinkWriter

logger = logging.getLogger("streamlb.sinks.kafka")

SLOTS = 4               # producers per instance: one taking rows, the others awaiting commit
COMMIT_EVERY = 1.0      # s between commits without checkpoints
TIMEOUT = 30.0          # s for the broker's answers (init, commit, abort, flush)
RETRIES = 5             # rewrites of a transaction the broker may have lost
FINAL = 2 ** 62         # the pending "checkpoint" of rows after an instance's last barrier
KILL_BEFORE_COMMIT = "STREAMLB_TEST_KILL_BEFORE_KAFKA_COMMIT"     # the test hook (module docstring)


def _test_kill(where: str, cid: int) -> None:
    """The test hook: the first writer here dies before committing checkpoint ``cid``'s rows."""
    flag = os.environ.get(KILL_BEFORE_COMMIT)
    if not flag:
        return
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    logger.warning("%s=%s: SIGKILL before committing checkpoint %d's transaction of %s", KILL_BEFORE_COMMIT, flag,
                   cid, where)
    os.kill(os.getpid(), signal.SIGKILL)


def _mark(cid: int) -> int | None:
    """The mark a transaction sealed for checkpoint ``cid`` commits with: ``cid``; None for
    the final rows (-1, :data:`FINAL`), whose checkpoint is not known yet or never comes."""
    return cid if 0 <= cid < FINAL else None


def connection(config: dict) -> dict:
    """What of a producer's ``config`` a consumer of the same cluster needs: where it is,
    how to authenticate.

    >>> connection({"bootstrap.servers": "b:9092", "linger.ms": 5, "sasl.mechanism": "PLAIN"})
    {'bootstrap.servers': 'b:9092', 'sasl.mechanism': 'PLAIN'}
    """
    keep = ("bootstrap.servers", "client.id", "security.protocol", "socket.", "sasl.", "ssl.")
    return {k: v for k, v in config.items() if k.startswith(keep)}


def send_mark(producer, topic: str, mark: int, group) -> None:
    """Add ``mark`` to ``producer``'s open transaction: the committed offset of ``topic``'s
    partition 0 for consumer group ``group`` (its metadata), visible once it commits."""
    from confluent_kafka import TopicPartition

    producer.send_offsets_to_transaction([TopicPartition(topic, 0, mark)], group, TIMEOUT)


def produce(p, topic: str, values: list, keys: list) -> None:
    """Messages (``values`` with ``keys``) to ``topic`` through producer ``p``."""
    for v, k in zip(values, keys):
        while True:
            try:
                p.produce(topic, v, k)
                break
            except BufferError:         # the local queue is full: let it drain
                p.poll(0.05)
    p.poll(0)


def encoded(df: pd.DataFrame, encode, where: str) -> list:
    """The rows of ``df`` as message values: a JSON object per row (``"json"``: columns,
    not the index; timestamps in ISO 8601), or ``encode(df)``'s list of bytes.

    >>> encoded(pd.DataFrame({"a": [1, 2], "b": ["x", None]}), "json", "t")
    [b'{"a":1,"b":"x"}', b'{"a":2,"b":null}']
    """
    if encode == "json":
        if not len(df):
            return []
        text = df.to_json(orient="records", lines=True, date_format="iso", date_unit="ms")
        return [line.encode() for line in text.splitlines()]
    out = encode(df)
    if not isinstance(out, (list, tuple)) or len(out) != len(df):
        got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
        raise PipelineError(f"{where}: encode function must return a list of bytes, one per row: got {got} "
                            f"for {len(df)} rows")
    return list(out)


class KafkaWriter(SinkWriter):
    """The producers of one ``to_kafka_topic`` (``step``) in one instance.

    Each transaction's messages are kept until it commits. A transaction during which a
    producer lost its broker connection, or had a fatal error (a broker that restarted and
    forgot the producer's sequence numbers), is suspect: before it would commit, a new
    producer with the same transactional id fences it (its ``init_transactions`` aborts
    it) and writes its messages again in a new transaction.
    """

    kind = "kafka_sink"
    segment = "kafka"

    def __init__(self, step, ctx) -> None:
        super().__init__(step, ctx)
        self.opts = step.kwargs        # topic, producer_config, key, encode
        self.where = f"to_kafka_topic({self.opts['topic']!r})"
        self._base = {"linger.ms": 5, **self.opts["producer_config"]}
        # transactional ids: job, stage, instance, sink, slot (the same for a replacement)
        self._prefix = f"streamlb-{ctx.job}-{ctx.stage_id}-{ctx.index}-k{step.target}"
        self.kept: list[list] = [[] for _ in range(SLOTS)]      # per slot: (values, keys) written
        self.suspect: set[int] = set()      # slots whose producer lost its connection in a transaction
        self.producers: list = [None] * SLOTS
        self.current: int | None = None      # slot with an open transaction taking rows
        self.began = 0.0
        self.pending: dict[int, list[int]] = {}   # checkpoint id -> slots flushed, to commit
        self._group = None                  # the consumer group metadata the marks are committed for

    def _checkpointed(self) -> bool:
        return self.ctx.staged

    def open(self) -> None:
        """The producers, opened when the instance starts: their ``init_transactions``
        aborts what a lost instance with the same ids left open (a replacement does so even
        if it writes nothing; one that moves is stopped by then)."""
        if self.producers[0] is None:
            for slot in range(SLOTS):
                self._renew(slot)

    def _renew(self, slot: int) -> None:
        """A new producer for ``slot``; its ``init_transactions`` fences the one before (and
        aborts what an earlier holder of the id left open)."""
        from confluent_kafka import Producer

        p = Producer({**self._base, "transactional.id": f"{self._prefix}-s{slot}",
                      "error_cb": self._on_error(slot, self._base.get("error_cb"))})
        p.init_transactions(TIMEOUT)
        self.producers[slot] = p

    def _on_error(self, slot: int, user_cb):
        from confluent_kafka import KafkaError

        lost = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}

        def on_error(err) -> None:
            if err.code() in lost or err.fatal():
                self.suspect.add(slot)
            if user_cb is not None:
                user_cb(err)
        return on_error

    def write(self, df: pd.DataFrame) -> None:
        self.open()
        if not isinstance(df, pd.DataFrame):
            raise PipelineError(f"{self.where} got {type(df).__name__}; it writes DataFrames")
        o = self.opts
        values = encoded(df, o["encode"], self.where)
        keys = [None] * len(values)
        if o["key"] is not None:
            if o["key"] not in df.columns:
                raise PipelineError(f"{self.where}: key column {o['key']!r} is not in the batch; columns: "
                                    f"{', '.join(map(str, df.columns))}")
            keys = [None if k is None or (isinstance(k, float) and np.isnan(k)) else
                    (k if isinstance(k, bytes) else str(k).encode()) for k in df[o["key"]].tolist()]
        self._send(values, keys)

    def _send(self, values: list, keys: list) -> None:
        from confluent_kafka import KafkaException

        p = self._open()
        self.kept[self.current].append((values, keys))
        try:
            self._produce(p, values, keys)
        except KafkaException as e:
            if not self._failed(self.current, e):
                raise
            self._redo(self.current, f"its producer failed ({e.args[0].str()})")
        if not self._checkpointed() and time.monotonic() - self.began > COMMIT_EVERY:
            self._commit(self.current)
            self.current = None

    def _failed(self, slot: int, e: Exception) -> bool:
        """Whether ``e`` is a fatal error of slot's producer (its transaction is then suspect)."""
        from confluent_kafka import KafkaError

        err = e.args[0] if e.args else None
        if isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL):
            self.suspect.add(slot)
            return True
        return False

    def _produce(self, p, values: list, keys: list) -> None:
        produce(p, self.opts["topic"], values, keys)

    def _open(self):
        if self.current is None:
            busy = {s for slots in self.pending.values() for s in slots}
            free = [s for s in range(SLOTS) if s not in busy]
            if not free:        # checkpoints complete slower than they are taken
                oldest = min(self.pending)
                logger.warning("%s: %d checkpoints await completion; committing checkpoint %d's rows early",
                               self.where, len(self.pending), oldest)
                for s in self.pending.pop(oldest):
                    self._commit(s, _mark(oldest))
                free = [s for s in range(SLOTS) if s not in {x for v in self.pending.values() for x in v}]
            self.current = free[0]
            self._begin(self.current)
            self.began = time.monotonic()
        return self.producers[self.current]

    def _begin(self, slot: int) -> None:
        self.producers[slot].poll(0)        # connection losses before this transaction do not count
        self.suspect.discard(slot)
        self.producers[slot].begin_transaction()

    def _commit(self, slot: int, mark: int | None = None) -> None:
        """Commit slot's transaction (with ``mark``, the id of the checkpoint that sealed it,
        when the job checkpoints: see the module docstring); a suspect one (or one the
        broker refuses as abortable) is aborted and written again first, up to ``RETRIES``
        times."""
        from confluent_kafka import KafkaException

        marked = mark is None or not self._checkpointed()
        for attempt in range(RETRIES + 1):
            p = self.producers[slot]         # (a new one after a rewrite)
            p.poll(0)                        # runs the error callbacks: is it suspect?
            try:
                if slot not in self.suspect:
                    if not marked:
                        send_mark(p, self.opts["topic"], mark, self._group_metadata())
                        marked = True
                    p.commit_transaction(TIMEOUT)
                    self.kept[slot] = []
                    return
                why = "its producer lost the broker connection during the transaction"
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if err is None or attempt == RETRIES or not (err.txn_requires_abort() or err.retriable()
                                                             or err.fatal()):
                    raise
                if err.retriable() and not err.txn_requires_abort():
                    continue                 # the commit itself is retried
                why = f"the broker refused its commit ({err.str()})"
            if attempt == RETRIES:
                break
            if attempt:
                time.sleep(0.5 * 2 ** (attempt - 1))      # the broker may still be on its way back
            self._redo(slot, why)
            marked = mark is None or not self._checkpointed()     # a new transaction: its mark too
        n = sum(len(v) for v, _ in self.kept[slot])
        raise PipelineError(f"{self.where}: could not commit a transaction of {n} "
                            f"messages after {RETRIES} retries ({why}); bootstrap.servers="
                            f"{self.opts['producer_config'].get('bootstrap.servers')!r}")

    def _redo(self, slot: int, why: str) -> None:
        """Write slot's kept messages again in a new transaction, of a new producer: its
        ``init_transactions`` aborts the suspect one (a producer after a fatal error could
        not go on anyway)."""
        from confluent_kafka import KafkaException

        n = sum(len(v) for v, _ in self.kept[slot])
        logger.warning("%s: writing a transaction of %d messages again: %s", self.where, n, why)
        try:
            self._renew(slot)
            p = self.producers[slot]
            self._begin(slot)
            for values, keys in self.kept[slot]:
                self._produce(p, values, keys)
            p.flush(TIMEOUT)
        except KafkaException as e:          # still suspect: the caller tries again
            self._failed(slot, e)
            self.suspect.add(slot)
            logger.warning("%s: the rewrite failed: %s", self.where, e)

    def _group_metadata(self):
        """The consumer group the marks are committed for: the writer's own (its prefix)."""
        if self._group is None:
            from confluent_kafka import Consumer

            self._group = Consumer({**connection(self.opts["producer_config"]),
                                    "group.id": self._prefix}).consumer_group_metadata()
        return self._group

    def seal(self, cid: int) -> list[dict] | None:
        """Checkpoint ``cid``'s barrier passed: the rows since the previous one wait for it
        (the final outputs, -1, are committed by :meth:`commit_all` or :meth:`linger`'s).
        Returns, for the driver to keep, this writer (its transactional ids) and the
        transactions that wait for ``cid`` (or, -1, for the next checkpoint to complete),
        each with its messages and mark."""
        if not self._checkpointed():
            return None
        if cid >= 0:
            self._seal(cid)
        sealed = [{"slot": s, "mark": _mark(cid), "messages": self.kept[s]} for s in self.pending.get(cid, ())]
        return [{"topic": self.opts["topic"], "prefix": self._prefix, "slots": SLOTS, "sealed": sealed}]

    def _seal(self, cid: int) -> None:
        """Rows up to now are checkpoint ``cid``'s: flushed, committed once it completes
        (rows of an instance that ended before the barrier are that checkpoint's too)."""
        if cid != FINAL and FINAL in self.pending:
            self.pending.setdefault(cid, []).extend(self.pending.pop(FINAL))
        if self.current is not None:
            try:
                self.producers[self.current].flush(TIMEOUT)
            except Exception as e:          # its commit writes it again
                if not self._failed(self.current, e):
                    raise
            self.pending.setdefault(cid, []).append(self.current)
            self.current = None

    def completed(self, cid: int) -> None:
        """Commit the transactions sealed up to ``cid``, in the order of their marks: a
        retired instance's last ones (-1, after every barrier it saw) with ``cid``'s."""
        due = sorted((c for c in self.pending if c <= cid), key=lambda c: (c < 0, c))
        if due:
            _test_kill(self.where, cid)
        for c in due:
            for s in self.pending.pop(c):
                self._commit(s, cid if c < 0 else c)

    def close(self) -> None:
        """End of stream: commit what is left (checkpoints pending first, in order). With
        checkpoints, what came after the last barrier only waits (flushed) for
        :meth:`commit_all`: the job has not finished until every instance has, and a worker
        lost before that replays from the last checkpoint."""
        if self._checkpointed():
            self._seal(FINAL)
            return
        self.commit_all()

    def commit_all(self) -> None:
        """The job finished: commit every transaction, in order."""
        for c in sorted(self.pending, key=lambda c: (c < 0, c)):
            for s in self.pending.pop(c):
                self._commit(s, _mark(c))
        if self.current is not None:
            self._commit(self.current)
            self.current = None

    def linger(self) -> bool:
        """A retired instance: what it wrote after its last barrier commits with the next
        checkpoint to complete (none is under way while an operator rescales); whether any
        transaction waits for it."""
        self._seal(-1)
        return bool(self.pending)

    def hand_off(self) -> list | None:
        """Every message not committed yet, in the order written (for the instance that
        takes this one's place); this one's transactions are aborted."""
        slots = [s for c in sorted(self.pending) for s in self.pending[c]]
        out = [m for s in slots + ([self.current] if self.current is not None else []) for m in self.kept[s]]
        self.abort()
        return out or None

    def adopt(self, handed: list) -> None:
        """Write what another instance handed off (before any row of this one's own)."""
        self.open()
        for values, keys in handed:
            self._send(values, keys)

    def abort(self) -> None:
        for s in [*(x for v in self.pending.values() for x in v), *([self.current] if self.current is not None
                                                                    else [])]:
            try:
                self.producers[s].abort_transaction(TIMEOUT)
            except Exception as e:         # the broker is gone: it aborts on its own timeout
                logger.info("%s: could not abort a transaction: %s", self.where, e)
            self.kept[s] = []
        self.pending.clear()
        self.current = None


class KafkaCommitter(Committer):
    """The driver's side of ``to_kafka_topic``: nothing to commit (each writer commits its
    own transactions), but what a checkpoint sealed is kept for whoever resumes it, and
    written again there if it never committed (see the module docstring)."""

    name = "kafka"
    segment = "kafka"

    def sealed(self, part, keep, cid: int) -> dict | None:
        """The writers of ``part`` (every one whose instance acknowledged: their
        transactional ids are fenced on a resume) and the transactions it sealed, with their
        marks (a retired instance's last ones: ``cid``'s); the messages in one file,
        ``kafka.arrow`` (``txn``: the transaction's index in ``transactions``, ``key``,
        ``value``)."""
        import pyarrow as pa

        writers: dict[str, dict] = {}
        txns, cols = [], {"txn": [], "key": [], "value": []}
        for w in part or ():
            writers[w["prefix"]] = {"topic": w["topic"], "prefix": w["prefix"], "slots": w["slots"]}
            for t in w["sealed"]:
                n = 0
                for values, keys in t["messages"]:
                    cols["value"].extend(values)
                    cols["key"].extend(keys)
                    n += len(values)
                cols["txn"].extend([len(txns)] * n)
                txns.append({"id": f"{w['prefix']}-s{t['slot']}", "group": w["prefix"], "topic": w["topic"],
                             "mark": cid if t["mark"] is None else t["mark"], "messages": n})
        if not writers:
            return None
        out = {"writers": sorted(writers.values(), key=lambda w: w["prefix"]), "transactions": txns}
        if txns:
            table = pa.table({"txn": pa.array(cols["txn"], pa.int32()), "key": pa.array(cols["key"], pa.binary()),
                              "value": pa.array(cols["value"], pa.binary())})

            def write(fh) -> None:
                with pa.ipc.new_file(fh, table.schema) as w:
                    w.write_table(table)
            out["file"] = keep("kafka.arrow", write)
        return out

    def resume(self, recorded, read) -> None:
        """Fence every transactional id of the recorded writers, then write again, each in
        one transaction with its mark, the sealed transactions whose mark is not there."""
        if not recorded:
            return
        from concurrent.futures import ThreadPoolExecutor

        configs = self._configs()
        ids = {}        # transactional id -> its producer's config
        for w in recorded["writers"]:
            config = configs.get(w["topic"])
            if config is None:
                logger.warning("to_kafka_topic(%r) is not in this graph: the transactions the checkpoint sealed "
                               "for it are not committed, nor those its writers left open aborted", w["topic"])
                continue
            ids.update({f"{w['prefix']}-s{slot}": config for slot in range(w["slots"])})
        with ThreadPoolExecutor(min(16, len(ids) or 1)) as pool:     # a round trip or two each
            producers = dict(zip(ids, pool.map(lambda tid: _fenced(ids[tid], tid), ids)))
        txns = [t for t in recorded["transactions"] if t["id"] in producers]
        if not txns:
            return
        groups = {}         # group -> a consumer of it: its committed mark, its metadata
        try:
            for t in txns:
                if t["group"] not in groups:
                    groups[t["group"]] = _group(configs[t["topic"]], t["group"])
            redo = [(i, t) for i, t in enumerate(recorded["transactions"])
                    if t["id"] in producers and t["mark"] > _committed_mark(groups[t["group"]], t["topic"])]
            if redo:
                self._redo(redo, producers, groups, read(recorded["file"]))
        finally:
            for c in groups.values():
                c.close()

    @staticmethod
    def _redo(redo: list, producers: dict, groups: dict, fh) -> None:
        """Write each transaction of ``redo`` (``(index, record)``) again, with its mark,
        from the kept messages (file ``fh``)."""
        import pyarrow as pa

        with fh:
            table = pa.ipc.open_file(fh).read_all()
        txn = table["txn"].to_numpy()
        for i, t in sorted(redo, key=lambda it: it[1]["mark"]):
            rows = table.filter(pa.array(txn == i))
            p = producers[t["id"]]
            p.begin_transaction()
            produce(p, t["topic"], rows["value"].to_pylist(), rows["key"].to_pylist())
            send_mark(p, t["topic"], t["mark"], groups[t["group"]].consumer_group_metadata())
            p.commit_transaction(TIMEOUT)
            logger.warning("to_kafka_topic(%r): %d messages that checkpoint %d sealed had not been committed: "
                           "written again", t["topic"], len(rows), t["mark"])

    def _configs(self) -> dict[str, dict]:
        """Topic -> producer config of this graph's ``to_kafka_topic`` sinks."""
        from . import sink_steps

        out = {}
        for st in self.plan.stages:
            for step in sink_steps([*st.children, *st.late]):
                if step.kind == "kafka_sink":
                    out[step.kwargs["topic"]] = {"linger.ms": 5, **step.kwargs["producer_config"]}
        return out


def _fenced(config: dict, tid: str):
    """A producer with transactional id ``tid``: its ``init_transactions`` aborts what an
    earlier producer of that id left open."""
    from confluent_kafka import Producer

    p = Producer({**config, "transactional.id": tid})
    p.init_transactions(TIMEOUT)
    return p


def _group(config: dict, group: str):
    """A consumer of consumer group ``group`` (joining nothing): to read its marks."""
    from confluent_kafka import Consumer

    return Consumer({**connection(config), "group.id": group, "isolation.level": "read_committed"})


def _committed_mark(consumer, topic: str) -> int:
    """The mark committed for ``consumer``'s group with ``topic`` (-1: none yet)."""
    from confluent_kafka import TopicPartition

    [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)
    return tp.offset if tp.offset >= 0 else -1
