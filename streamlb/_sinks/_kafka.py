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
a transaction can only be committed by the producer that holds it, so this sink has no
driver-side committer; the driver's part is to tell the instances that a checkpoint
completed or the job finished.

The one gap, shared with every Kafka client without KIP-939: a worker lost after a
checkpoint completed but before its instance committed loses that transaction's rows
(the replay starts after them).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from ..exceptions import PipelineError
from ._base import SinkWriter

logger = logging.getLogger("streamlb.sinks.kafka")

SLOTS = 4               # producers per instance: one taking rows, the others awaiting commit
COMMIT_EVERY = 1.0      # s between commits without checkpoints
TIMEOUT = 30.0          # s for the broker's answers (init, commit, abort, flush)
RETRIES = 5             # rewrites of a transaction the broker may have lost
FINAL = 2 ** 62         # the pending "checkpoint" of rows after an instance's last barrier


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
        topic = self.opts["topic"]
        for v, k in zip(values, keys):
            while True:
                try:
                    p.produce(topic, v, k)
                    break
                except BufferError:         # the local queue is full: let it drain
                    p.poll(0.05)
        p.poll(0)

    def _open(self):
        if self.current is None:
            busy = {s for slots in self.pending.values() for s in slots}
            free = [s for s in range(SLOTS) if s not in busy]
            if not free:        # checkpoints complete slower than they are taken
                oldest = min(self.pending)
                logger.warning("%s: %d checkpoints await completion; committing checkpoint %d's rows early",
                               self.where, len(self.pending), oldest)
                for s in self.pending.pop(oldest):
                    self._commit(s)
                free = [s for s in range(SLOTS) if s not in {x for v in self.pending.values() for x in v}]
            self.current = free[0]
            self._begin(self.current)
            self.began = time.monotonic()
        return self.producers[self.current]

    def _begin(self, slot: int) -> None:
        self.producers[slot].poll(0)        # connection losses before this transaction do not count
        self.suspect.discard(slot)
        self.producers[slot].begin_transaction()

    def _commit(self, slot: int) -> None:
        """Commit slot's transaction; a suspect one (or one the broker refuses as abortable)
        is aborted and written again first, up to ``RETRIES`` times."""
        from confluent_kafka import KafkaException

        for attempt in range(RETRIES + 1):
            p = self.producers[slot]         # (a new one after a rewrite)
            p.poll(0)                        # runs the error callbacks: is it suspect?
            try:
                if slot not in self.suspect:
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

    def seal(self, cid: int) -> None:
        """Checkpoint ``cid``'s barrier passed: the rows since the previous one wait for it
        (the final outputs, -1, are committed by :meth:`commit_all` or :meth:`linger`'s)."""
        if cid >= 0:
            self._seal(cid)

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
        for c in sorted(c for c in self.pending if c <= cid):
            for s in self.pending.pop(c):
                self._commit(s)

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
        for c in sorted(self.pending):
            for s in self.pending.pop(c):
                self._commit(s)
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
