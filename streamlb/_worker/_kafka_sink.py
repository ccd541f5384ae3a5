"""``to_kafka_topic`` in one instance: a batch's rows as messages, written in Kafka
transactions so a ``read_committed`` reader sees each row once.

Without checkpoints nothing is replayed, so a transaction commits about every second and at
the end of the stream. With checkpoints (two-phase commit, as Flink's Kafka sink): what the
instance wrote since the previous barrier is one transaction, flushed when the barrier
passes (:meth:`KafkaSinks.seal`) and committed once that checkpoint is complete
(:meth:`KafkaSinks.completed`); the next rows go to another producer's transaction
meanwhile. A recovery replays from the last complete checkpoint: what a lost instance wrote
after it was never committed, and its replacement, which takes the same transactional ids
(job, operator, instance, slot), aborts it when it starts (``init_transactions`` fences the
old producer). ``job.stop()`` aborts what no checkpoint committed.

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

logger = logging.getLogger("streamlb.sinks.kafka")

SLOTS = 4               # producers per instance: one taking rows, the others awaiting commit
COMMIT_EVERY = 1.0      # s between commits without checkpoints
TIMEOUT = 30.0          # s for the broker's answers (init, commit, abort, flush)


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


class _Topic:
    """The producers of one ``to_kafka_topic`` in one instance."""

    def __init__(self, step, prefix: str, checkpointed) -> None:
        from confluent_kafka import Producer

        self.opts = step.kwargs        # topic, producer_config, key, encode
        self._checkpointed = checkpointed     # () -> whether the job checkpoints (known later)
        self.where = f"to_kafka_topic({self.opts['topic']!r})"
        base = {"linger.ms": 5, **self.opts["producer_config"]}
        self.producers = []
        for slot in range(SLOTS):
            p = Producer({**base, "transactional.id": f"{prefix}-s{slot}"})
            p.init_transactions(TIMEOUT)     # aborts what an earlier holder of this id left open
            self.producers.append(p)
        self.current: int | None = None      # slot with an open transaction taking rows
        self.began = 0.0
        self.pending: dict[int, list[int]] = {}   # checkpoint id -> slots flushed, to commit

    def write(self, df: pd.DataFrame) -> None:
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
        p = self._open()
        topic = o["topic"]
        for v, k in zip(values, keys):
            while True:
                try:
                    p.produce(topic, v, k)
                    break
                except BufferError:         # the local queue is full: let it drain
                    p.poll(0.05)
        p.poll(0)
        if not self._checkpointed() and time.monotonic() - self.began > COMMIT_EVERY:
            self._commit(self.current)
            self.current = None

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
            self.producers[self.current].begin_transaction()
            self.began = time.monotonic()
        return self.producers[self.current]

    def _commit(self, slot: int) -> None:
        self.producers[slot].commit_transaction(TIMEOUT)

    def seal(self, cid: int) -> None:
        """Checkpoint ``cid``'s barrier passed: its rows are flushed, committed once it completes."""
        if self.current is not None:
            self.producers[self.current].flush(TIMEOUT)
            self.pending.setdefault(cid, []).append(self.current)
            self.current = None

    def completed(self, cid: int) -> None:
        for c in sorted(c for c in self.pending if c <= cid):
            for s in self.pending.pop(c):
                self._commit(s)

    def close(self) -> None:
        """End of stream: commit what is left (checkpoints pending first, in order)."""
        for c in sorted(self.pending):
            for s in self.pending.pop(c):
                self._commit(s)
        if self.current is not None:
            self._commit(self.current)
            self.current = None

    def abort(self) -> None:
        for s in [*(x for v in self.pending.values() for x in v), *([self.current] if self.current is not None
                                                                      else [])]:
            try:
                self.producers[s].abort_transaction(TIMEOUT)
            except Exception as e:         # the broker is gone: it aborts on its own timeout
                logger.info("%s: could not abort a transaction: %s", self.where, e)
        self.pending.clear()
        self.current = None


class KafkaSinks:
    """Every ``to_kafka_topic`` of one instance (``prefix``: its transactional ids' stem;
    ``checkpointed()``: whether the job checkpoints)."""

    def __init__(self, prefix: str, checkpointed) -> None:
        self.prefix, self.checkpointed = prefix, checkpointed
        self.topics: dict[int, _Topic] = {}

    def open(self, step) -> _Topic:
        """The producers of sink ``step`` (its number in the plan names them: the same for a
        replacement, whose ``init_transactions`` aborts what a lost instance left open)."""
        t = self.topics.get(step.target)
        if t is None:
            t = self.topics[step.target] = _Topic(step, f"{self.prefix}-k{step.target}", self.checkpointed)
        return t

    def write(self, step, df) -> None:
        self.open(step).write(df)

    def seal(self, cid: int) -> None:
        for t in self.topics.values():
            t.seal(cid)

    def completed(self, cid: int) -> None:
        for t in self.topics.values():
            t.completed(cid)

    def close(self) -> None:
        for t in self.topics.values():
            t.close()

    def abort(self) -> None:
        for t in self.topics.values():
            t.abort()


def kafka_steps(steps) -> list:
    """The ``kafka_sink`` steps among ``steps`` and their children."""
    out = []
    for st in steps:
        if st.kind == "kafka_sink":
            out.append(st)
        out.extend(kafka_steps(st.children))
    return out

