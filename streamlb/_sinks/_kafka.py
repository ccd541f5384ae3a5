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

from ..exceptions import PipelineError, SinkWriteError
from ._base import Committer, SinkWriter
from ._kafka_calls import GRACE, Stuck, bounded, left

logger = logging.getLogger("streamlb.sinks.kafka")

SLOTS = 4               # producers per instance: one taking rows, the others awaiting commit
COMMIT_EVERY = 1.0      # s between commits without checkpoints
TIMEOUT = 30.0          # s for the broker's answers to the driver (a resume's fencing and commits)
CALL = 5.0              # s for one broker call of a writer (init, mark, commit, flush, abort)
DEADLINE = 20.0         # s for a writer's commit of a checkpoint's transactions, rewrites included
SEAL_FLUSH = 3.0        # s a barrier waits for the transaction it seals to be flushed
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


def send_mark(producer, topic: str, mark: int, group, timeout: float = TIMEOUT) -> None:
    """Add ``mark`` to ``producer``'s open transaction: the committed offset of ``topic``'s
    partition 0 for consumer group ``group`` (its metadata), visible once it commits."""
    from confluent_kafka import TopicPartition

    producer.send_offsets_to_transaction([TopicPartition(topic, 0, mark)], group, timeout)


def produce(p, topic: str, values: list, keys: list, patience: float | None = None) -> None:
    """Messages (``values`` with ``keys``) to ``topic`` through producer ``p``; a full local
    queue is waited for (``patience``: for at most that many s in all, then BufferError)."""
    until = None if patience is None else time.monotonic() + patience
    for v, k in zip(values, keys):
        while True:
            try:
                p.produce(topic, v, k)
                break
            except BufferError:         # the local queue is full: let it drain
                if until is not None and time.monotonic() > until:
                    raise
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
    it) and writes its messages again in a new transaction. A producer whose call does not
    return within its bound (:mod:`._kafka_calls`) is given up the same way.

    With checkpoints, a complete checkpoint's transactions commit in the writer's commit
    thread, one checkpoint after another (:meth:`completed` returns the future the instance
    awaits), so the worker's event loop goes on meanwhile. A commit takes at most
    :data:`DEADLINE` s, rewrites and retries included; one that cannot be done by then
    raises a :class:`~streamlb.exceptions.SinkWriteError` (not permanent: the job recovers
    from its last complete checkpoint, whose transactions the resume commits), and the
    writer commits nothing after it (the marks must commit in order).
    """

    kind = "kafka_sink"
    segment = "kafka"

    def __init__(self, step, ctx) -> None:
        super().__init__(step, ctx)
        self.opts = step.kwargs        # topic, producer_config, key, encode
        self.where = f"to_kafka_topic({self.opts['topic']!r}) in {ctx.operator}[{ctx.index}]"
        self._base = {"linger.ms": 5, **self.opts["producer_config"]}
        # transactional ids: job, stage, instance, sink, slot (the same for a replacement)
        self._prefix = f"streamlb-{ctx.job}-{ctx.stage_id}-{ctx.index}-k{step.target}"
        self.kept: list[list] = [[] for _ in range(SLOTS)]      # per slot: (values, keys) written
        self.suspect: set[int] = set()      # slots whose producer lost its connection in a transaction
        self.producers: list = [None] * SLOTS
        self.fresh: set[int] = set()        # slots whose producer's init_transactions has not completed
        self.given_up: list = []            # producers with a call still running: kept, never destroyed
        self.current: int | None = None      # slot with an open transaction taking rows
        self.began = 0.0
        self.pending: dict[int, list[int]] = {}   # checkpoint id -> slots flushed, to commit
        self.busy: set[int] = set()         # slots whose commit runs in the commit thread
        self.broken: SinkWriteError | None = None     # a commit that failed: none after it
        self._pool = None                   # the commit thread
        self._work = None                   # the last commit handed to it (a Future)
        self._group = None                  # the consumer group metadata the marks are committed for
        self._marks = None                  # a consumer of that group: reads the committed mark

    def _checkpointed(self) -> bool:
        return self.ctx.staged

    def open(self) -> None:
        """The producers, opened when the instance starts: their ``init_transactions``
        aborts what a lost instance with the same ids left open (a replacement does so even
        if it writes nothing; one that moves is stopped by then)."""
        from confluent_kafka import KafkaException

        if any(p is None for p in self.producers):
            deadline = time.monotonic() + DEADLINE
            for slot in range(SLOTS):
                if self.producers[slot] is None:
                    try:
                        self._renew(slot, deadline, DEADLINE)
                    except (KafkaException, Stuck) as e:
                        raise self._error(f"could not start its transactional producers within {DEADLINE:g} s "
                                          f"({_reason(e)})", broken=False) from e

    def _renew(self, slot: int, deadline: float, cap: float | None = None) -> None:
        """A new producer for ``slot`` (or the last one, if its ``init_transactions`` only
        timed out); its ``init_transactions`` fences the one before (and aborts what an
        earlier holder of the id left open)."""
        from confluent_kafka import KafkaException, Producer

        if slot not in self.fresh:
            self.producers[slot] = Producer({**self._base, "transactional.id": f"{self._prefix}-s{slot}",
                                             "error_cb": self._on_error(slot, self._base.get("error_cb"))})
            self.fresh.add(slot)
        try:
            bounded("init_transactions", left(deadline, cap or CALL), self.producers[slot].init_transactions)
        except Stuck:
            self._give_up(slot)
            raise
        except KafkaException as e:
            if not (e.args and e.args[0].retriable()):      # a timeout is retried by the same producer
                self.fresh.discard(slot)
            raise
        self.fresh.discard(slot)

    def _give_up(self, slot: int) -> None:
        """Slot's producer has a call that did not return: it is kept (a thread still uses
        it), its transaction suspect; the next one fences it."""
        if not any(p is self.producers[slot] for p in self.given_up):
            self.given_up.append(self.producers[slot])
        self.fresh.discard(slot)
        self.suspect.add(slot)

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
        """Rows to the open transaction. A suspect one only keeps them: its commit writes
        them all again (so a write never waits for a broker that is away)."""
        from confluent_kafka import KafkaException

        p = self._open()
        slot = self.current
        self.kept[slot].append((values, keys))
        if slot not in self.suspect:
            try:
                produce(p, self.opts["topic"], values, keys, patience=CALL)
            except BufferError:             # the broker is away: the queue did not drain
                self.suspect.add(slot)
            except KafkaException as e:
                if not self._failed(slot, e):
                    raise
        if not self._checkpointed() and time.monotonic() - self.began > COMMIT_EVERY:
            self._commit(slot)
            self.current = None

    def _failed(self, slot: int, e: Exception) -> bool:
        """Whether ``e`` is a fatal error of slot's producer (its transaction is then suspect)."""
        from confluent_kafka import KafkaError

        err = e.args[0] if e.args else None
        if isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL):
            self.suspect.add(slot)
            return True
        return False

    def _free(self) -> list[int]:
        taken = {s for slots in self.pending.values() for s in slots} | self.busy
        return [s for s in range(SLOTS) if s not in taken]

    def _open(self):
        from confluent_kafka import KafkaException

        if self.current is None:
            free = self._free()
            if not free:        # checkpoints complete slower than they are taken
                if self.pending:
                    oldest = min(self.pending)
                    logger.warning("%s: %d checkpoints await completion; committing checkpoint %d's rows early",
                                   self.where, len(self.pending), oldest)
                    self._submit([(s, _mark(oldest)) for s in self.pending.pop(oldest)])
                self._wait()            # the commits under way end (each within DEADLINE)
                free = self._free()
            self.current = free[0]
            try:
                self._begin(self.current)
            except KafkaException as e:     # it failed since its last commit: the rows wait for a rewrite
                logger.warning("%s: could not begin a transaction (%s): its rows are written at its commit",
                               self.where, _reason(e))
                self.suspect.add(self.current)
            self.began = time.monotonic()
        return self.producers[self.current]

    def _begin(self, slot: int) -> None:
        self.producers[slot].poll(0)        # connection losses before this transaction do not count
        self.suspect.discard(slot)
        self.producers[slot].begin_transaction()

    def _submit(self, commits: list[tuple[int, int | None]]):
        """Commit ``(slot, mark)`` pairs, in order, in the commit thread; its future."""
        from concurrent.futures import ThreadPoolExecutor

        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="streamlb-kafka-commit")
        self.busy.update(s for s, _ in commits)
        self._work = self._pool.submit(self._commit_each, commits)
        return self._work

    def _commit_each(self, commits: list[tuple[int, int | None]]) -> None:
        deadline = time.monotonic() + DEADLINE
        try:
            for slot, mark in commits:
                self._commit(slot, mark, deadline)
        finally:
            self.busy.difference_update(s for s, _ in commits)

    def _wait(self) -> None:
        """Until the commit thread has done what it was given (raises what its last commit
        raised)."""
        if self._work is not None:
            self._work.result(DEADLINE + 2 * GRACE + 5)

    def _commit(self, slot: int, mark: int | None = None, deadline: float | None = None) -> None:
        """Commit slot's transaction (with ``mark``, the id of the checkpoint that sealed it,
        when the job checkpoints: see the module docstring) by ``deadline`` (a
        ``time.monotonic()``; :data:`DEADLINE` s from now if None). A suspect one (or one
        the broker refuses as abortable, or whose producer is stuck) is fenced and written
        again first; a commit that may have gone through before it was fenced is not written
        again if its mark is there. Raises a SinkWriteError if it is not done by then."""
        from confluent_kafka import KafkaException

        if self.broken is not None:
            raise self.broken
        deadline = time.monotonic() + DEADLINE if deadline is None else deadline
        marks = mark is not None and self._checkpointed()
        marked, tried = not marks, False        # tried: a commit was asked of this producer
        why, attempt = "", 0
        while True:
            try:
                self.producers[slot].poll(0)       # runs the error callbacks: is it suspect?
                if slot in self.suspect:
                    why = why or "its producer lost the broker connection during the transaction"
                    if self._redo(slot, why, deadline, mark if marks and tried else None):
                        break
                    marked, tried = not marks, False       # a new transaction: its mark too
                p = self.producers[slot]
                if not marked:
                    bounded("send_offsets_to_transaction", left(deadline, CALL), send_mark, p, self.opts["topic"],
                            mark, self._group_metadata())
                    marked = True
                tried = True
                bounded("commit_transaction", left(deadline, CALL), p.commit_transaction)
                break
            except Stuck as e:
                why = f"its producer is stuck: {e}"
                self._give_up(slot)
            except BufferError:
                why = "its local queue did not drain"
                self.suspect.add(slot)
            except KafkaException as e:
                err = e.args[0] if e.args else None
                why = _reason(e)
                if err is None or not (err.retriable() or err.txn_requires_abort() or err.fatal()):
                    raise self._error(f"could not commit a transaction of {self._count(slot)} messages: {why}") from e
                if err.txn_requires_abort() or err.fatal() or (marks and attempt >= 2):
                    self.suspect.add(slot)      # aborted and written again
            attempt += 1
            wait = min(0.1 * 2 ** attempt, 1.0)
            if time.monotonic() + wait + 0.5 >= deadline:
                raise self._error(f"could not commit a transaction of {self._count(slot)} messages within "
                                  f"{DEADLINE:g} s ({attempt} attempts): {why}")
            time.sleep(wait)            # the broker may still be on its way back
        self.kept[slot] = []

    def _count(self, slot: int) -> int:
        return sum(len(v) for v, _ in self.kept[slot])

    def _redo(self, slot: int, why: str, deadline: float, check: int | None) -> bool:
        """Write slot's kept messages again in a new transaction, of a new producer: its
        ``init_transactions`` aborts the suspect one (a producer after a fatal error could
        not go on anyway). ``check``: the mark of a transaction whose commit was asked, so
        may have gone through: if the writer's committed mark has reached it since the old
        producer was fenced, it did, and nothing is written again (returns True)."""
        logger.warning("%s: writing a transaction of %d messages again: %s", self.where, self._count(slot), why)
        self._renew(slot, deadline)
        if check is not None and self._committed(deadline) >= check:
            logger.warning("%s: the transaction of checkpoint %d had committed before its producer was fenced",
                           self.where, check)
            self.suspect.discard(slot)
            return True
        p = self.producers[slot]
        try:
            self._begin(slot)
            for values, keys in self.kept[slot]:
                produce(p, self.opts["topic"], values, keys, patience=left(deadline, DEADLINE))
            bounded("flush", left(deadline, CALL), p.flush)
        except BaseException:               # still suspect: the caller tries again
            self.suspect.add(slot)
            raise
        return False

    def _committed(self, deadline: float) -> int:
        """The mark committed for the writer's group (-1: none yet)."""
        if self._marks is None:
            self._marks = _group(self.opts["producer_config"], self._prefix)
        try:
            return bounded("committed", left(deadline, CALL), _committed_mark, self._marks, self.opts["topic"])
        except Stuck:
            self.given_up.append(self._marks)       # kept: a thread still uses it
            self._marks = None
            raise

    def _error(self, what: str, broken: bool = True) -> SinkWriteError:
        """The SinkWriteError of this writer that ``what``, naming the topic, the brokers and
        the cause; not permanent (a recovery may find the broker back). ``broken``: a commit
        failed, so no later one may commit."""
        topic = self.opts["topic"]
        servers = self.opts["producer_config"].get("bootstrap.servers")
        err = SinkWriteError(f"{self.where} {what}; topic {topic!r}, bootstrap.servers={servers!r} (it may succeed "
                             f"if retried: the job recovers from its last complete checkpoint)",
                             sink=self.where, path=topic, errno_name="", permanent=False)
        if broken:
            self.broken = err
        return err

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
        """Rows up to now are checkpoint ``cid``'s: flushed (for at most :data:`SEAL_FLUSH`
        s: the commit flushes what is left), committed once it completes (rows of an
        instance that ended before the barrier are that checkpoint's too)."""
        if cid != FINAL and FINAL in self.pending:
            self.pending.setdefault(cid, []).extend(self.pending.pop(FINAL))
        slot = self.current
        if slot is not None:
            if slot not in self.suspect:
                try:
                    bounded("flush", SEAL_FLUSH, self.producers[slot].flush)
                except Stuck:
                    self._give_up(slot)
                except Exception as e:          # its commit writes it again
                    if not self._failed(slot, e):
                        raise
            self.pending.setdefault(cid, []).append(slot)
            self.current = None

    def completed(self, cid: int):
        """Commit the transactions sealed up to ``cid``, in the order of their marks (a
        retired instance's last ones, -1, after every barrier it saw, with ``cid``'s), in
        the commit thread: returns its future (None: nothing to commit)."""
        due = sorted((c for c in self.pending if c <= cid), key=lambda c: (c < 0, c))
        if not due:
            return None
        _test_kill(self.where, cid)
        if self._checkpointed():
            self._group_metadata()          # made here rather than in the commit thread
        return self._submit([(s, cid if c < 0 else c) for c in due for s in self.pending.pop(c)])

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
        """The job finished: commit every transaction, in order (after those the commit
        thread holds)."""
        self._wait()
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
        """Abort the open transactions (within :data:`CALL` s in all; a suspect one, or
        one left when time is up, is aborted by whoever takes its id next, or by the
        broker's transaction timeout). Commits under way in the commit thread go on: their
        checkpoint is complete."""
        deadline = time.monotonic() + CALL
        for s in [*(x for v in self.pending.values() for x in v), *([self.current] if self.current is not None
                                                                    else [])]:
            if s not in self.suspect and time.monotonic() < deadline:
                try:
                    bounded("abort_transaction", left(deadline, CALL), self.producers[s].abort_transaction)
                except Stuck:
                    self._give_up(s)
                except Exception as e:         # the broker is gone: it aborts on its own timeout
                    logger.info("%s: could not abort a transaction: %s", self.where, e)
            self.kept[s] = []
        self.pending.clear()
        self.current = None


def _reason(e: BaseException) -> str:
    """librdkafka's reason for ``e`` (a KafkaException's error string), else ``e`` itself."""
    err = e.args[0] if e.args else None
    return err.str() if hasattr(err, "str") else f"{type(e).__name__}: {e}"


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


def _committed_mark(consumer, topic: str, timeout: float = TIMEOUT) -> int:
    """The mark committed for ``consumer``'s group with ``topic`` (-1: none yet)."""
    from confluent_kafka import TopicPartition

    [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=timeout)
    return tp.offset if tp.offset >= 0 else -1
