"""The Kafka source: one split per partition of ``stage.topic``.

A split's id is ``"<topic>:<partition>"``; its position is the offset of the next record
to read. A saved position keeps them as ``{"kafka": {split_id: offset}}``. Instance
``index`` of ``stage.parallelism`` owns the partitions ``p`` with
``p % parallelism == index``. Where a split starts without a saved offset, ``stage.offsets``
says: ``"committed"`` (the group's committed offset, else the earliest), ``"earliest"`` or
``"latest"``, resolved to a real offset before the split is opened, so a checkpoint never
holds a rule. A partition missing from a non-empty saved position was added after it was
saved, and starts at its earliest offset, like one found while running (:meth:`new_splits`).

Offsets have gaps: a transaction leaves a marker, a read_committed consumer skips aborted
records, compaction removes some. A position is therefore the offset after the last record
handed out, never a count of rows (see :meth:`KafkaReader.advance`). With
``stage.until == "end"`` a split ends at the end offset it had when opened (the high
watermark; under read_committed the last stable offset, before any open transaction).

Reading: one ``confluent_kafka.Consumer`` per reader, its partitions assigned by hand (no
group membership, nothing committed but by :meth:`KafkaReader.commit`). A ``consume`` call
fetches for every open split at once; its records wait per partition until :meth:`read`
asks for their split. A split with nothing waiting consumes again only while fewer than
``batch_size`` records per open split wait in all, so memory stays bounded; else it hands
out an empty batch while :meth:`poll` serves the others. (Not pause and resume: both make
librdkafka fetch again from the position, which some brokers answer wrongly, see
tests/test_kafka_broker.py.) A split read to its end is unassigned. Nothing blocks for
long: a read waits at most ``POLL_TIMEOUT`` for records and returns an empty frame if none
came.

Waiting for a broker: a metadata or offset look-up waits at most ``streamlb.kafka.timeout``
(read when the job is planned), then fails the job with :class:`BrokerUnreachableError`
naming the bootstrap address and the setting. librdkafka's own log lines (a broker that
refuses connections gets one per reconnection attempt, about twenty a second at first) go
to the logger ``streamlb.sources.kafka.librdkafka`` (:class:`LibrdkafkaLog`), not to the
worker's stderr.
"""
from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .. import config
from ..exceptions import BrokerUnreachableError, PipelineError
from ._base import Split, SplitBatch, SplitReader
from ._kafka_decode import Held, _decoded, _json_rows, no_collection

logger = logging.getLogger("streamlb.sources.kafka")

OFFSET_RULES = ("committed", "earliest", "latest")
UNTIL = (None, "end")
DECODERS = "None, 'json' or a callable(list[bytes]) -> DataFrame"
POLL_TIMEOUT = 0.1          # s a read waits for records
STARVED_CAP = 32            # batches per partition held at most, to reach a partition left behind
META = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp")


def split_id(topic: str, partition: int) -> str:
    """The id of a partition's split.

    >>> split_id("orders", 3)
    'orders:3'
    """
    return f"{topic}:{partition}"


def partition_of(split: str) -> int:
    """The partition of a split id (topic names hold no colon).

    >>> partition_of("orders:3")
    3
    """
    return int(split.rsplit(":", 1)[1])


@dataclass(frozen=True)
class KafkaOptions:
    """A Kafka source stage's settings, checked once (see :meth:`from_stage`)."""

    topic: str
    consumer_params: dict
    decode: None | str | Callable
    offsets: str = "committed"
    until: str | None = None
    batch_size: int = 10_000
    parallelism: int = 1
    group_given: bool = False       # commit() reports to the user's group
    timeout: float = 5.0            # s a metadata or offset look-up waits for a broker

    @classmethod
    def from_stage(cls, stage) -> KafkaOptions:
        """The options of ``stage``; a bad value raises a ``ValueError`` that lists the valid ones.

        >>> from types import SimpleNamespace
        >>> KafkaOptions.from_stage(SimpleNamespace(topic="t", consumer_params={}))
        Traceback (most recent call last):
        streamlb.exceptions.PipelineError: Kafka source of topic 't': consumer_params needs 'bootstrap.servers' ...
        >>> KafkaOptions.from_stage(SimpleNamespace(topic="t", consumer_params={"bootstrap.servers": "b:9092"},
        ...                                         offsets="newest"))
        Traceback (most recent call last):
        streamlb.exceptions.PipelineError: Kafka source of topic 't': offsets='newest'; valid: 'committed', ...
        """
        if isinstance(getattr(stage, "source", None), dict):     # a planned stage: its source's options
            from types import SimpleNamespace

            stage = SimpleNamespace(**stage.source, batch_size=stage.batch_size, parallelism=stage.parallelism)
        topic = stage.topic
        where = f"Kafka source of topic {topic!r}"
        params = dict(getattr(stage, "consumer_params", None) or {})
        if not params.get("bootstrap.servers"):
            raise PipelineError(f"{where}: consumer_params needs 'bootstrap.servers' (host:port[,host:port...])")
        offsets = getattr(stage, "offsets", None) or "committed"
        if offsets not in OFFSET_RULES:
            raise PipelineError(f"{where}: offsets={offsets!r}; valid: {', '.join(map(repr, OFFSET_RULES))}")
        until = getattr(stage, "until", None)
        if until not in UNTIL:
            raise PipelineError(f"{where}: until={until!r}; valid: None, 'end'")
        decode = getattr(stage, "decode", None)
        if not (decode is None or decode == "json" or callable(decode)):
            raise PipelineError(f"{where}: decode={decode!r}; valid: {DECODERS}")
        batch_size = getattr(stage, "batch_size", None) or 10_000
        parallelism = getattr(stage, "parallelism", None) or 1
        if batch_size < 1 or parallelism < 1:
            raise PipelineError(f"{where}: batch_size={batch_size}, parallelism={parallelism}; both must be >= 1")
        timeout = getattr(stage, "timeout", None)
        if timeout is None:
            try:
                timeout = config.seconds("kafka.timeout")
            except (TypeError, ValueError, KeyError):
                timeout = -1.0
        if not timeout > 0:
            raise PipelineError(f"{where}: setting streamlb.kafka.timeout is {config.get('kafka.timeout')!r}; "
                                "give a duration > 0 (such as '5s')")
        return cls(topic, params, decode, offsets, until, int(batch_size), int(parallelism),
                   group_given=bool(params.get("group.id")), timeout=float(timeout))

    @property
    def bootstrap(self) -> str:
        return self.consumer_params["bootstrap.servers"]

    def consumer_config(self, index: int) -> dict:
        """librdkafka's settings of instance ``index``'s consumer: the user's, with offsets
        never committed on their own; a private group unless the user named one (a group is
        where committed offsets live)."""
        conf = {"auto.offset.reset": "earliest", "logger": LibrdkafkaLog(), **self.consumer_params,
                "enable.auto.commit": False, "enable.auto.offset.store": False}
        if not self.group_given:
            conf["group.id"] = f"streamlb-{self.topic}-{index}-{uuid.uuid4().hex[:8]}"
        return conf


class KafkaReader(SplitReader):
    """Reads the partitions of ``stage.topic`` that instance ``index`` owns.

    Batches have the columns ``kafka_key`` (bytes or None), ``kafka_partition`` (int32),
    ``kafka_offset`` (int64) and ``kafka_timestamp`` (datetime64[ms]; NaT without one), and
    the record's value: a ``value`` column of bytes (``decode=None``), the fields of a JSON
    object (``"json"``) or the columns ``decode(values)`` returns (a decoded column of one of
    those four names is replaced by the source's). A value that cannot be decoded is left
    out, and ``(record, reason)`` goes to :attr:`dead_letters` for the engine to drain.
    """

    live = True
    #: s between two metadata look-ups of :meth:`new_splits`
    discovery_interval = 5.0

    def __init__(self, stage, index: int) -> None:
        from confluent_kafka import Consumer

        super().__init__(stage, index)
        self.opts = KafkaOptions.from_stage(stage)
        conf = self.opts.consumer_config(index)
        if self.opts.group_given:
            conf["on_commit"] = self._on_commit
        self._consumer = Consumer(conf)
        self._closed = False
        self._buffers: dict[int, Held] = {}     # partition -> records consumed, not handed out
        self._fetched: dict[int, int] = {}      # partition -> the consumer's position in it
        self._ends: dict[int, int] = {}         # partition -> its end offset (until="end")
        self._assigned: set[int] = set()        # partitions the consumer fetches
        self._served: dict[str, float] = {}     # split -> when it last handed out a batch
        self._looked_at = -np.inf               # last metadata look-up (monotonic s)
        # the batch of a split with no records yet: the columns of the last batch read
        self._empty = pd.DataFrame({"kafka_key": pd.Series([], dtype=object),
                                    "kafka_partition": np.empty(0, np.int32), "kafka_offset": np.empty(0, np.int64),
                                    "kafka_timestamp": np.empty(0, "datetime64[ms]")})
        if self.opts.decode is None:
            self._empty["value"] = pd.Series([], dtype=object)

    # -- where splits start --------------------------------------------------------------------
    def splits_at(self, saved: dict) -> list[Split]:
        positions = saved.get("kafka") or {}
        mine = self._owned()
        found = [p for p in mine if split_id(self.opts.topic, p) in positions]
        unsaved = [p for p in mine if p not in found]
        starts = self._earliest(unsaved) if positions else self._starts(unsaved)
        starts.update({p: int(positions[split_id(self.opts.topic, p)]) for p in found})
        return [Split(split_id(self.opts.topic, p), starts[p]) for p in mine]

    def save(self, splits: list[Split]) -> dict:
        return {"kafka": {s.split_id: s.position for s in splits}}

    def new_splits(self) -> list[Split]:
        """Splits of partitions this instance owns and has not opened (added to the topic
        while it runs), at their earliest offsets; ``[]`` until ``discovery_interval`` s
        have passed since the last look-up."""
        if time.monotonic() - self._looked_at < self.discovery_interval:
            return []
        try:
            new = [p for p in self._owned() if split_id(self.opts.topic, p) not in self._read]
            starts = self._earliest(new)
        except ConnectionError as e:        # the broker is away for now (restarting): look again later
            self._looked_at = time.monotonic()
            logger.warning("%s", e)
            return []
        return [Split(split_id(self.opts.topic, p), starts[p]) for p in new]

    def _owned(self) -> list[int]:
        """The topic's partitions that are this instance's (a metadata look-up)."""
        o = self.opts
        md = self._ask(lambda: self._consumer.list_topics(o.topic, timeout=o.timeout), "list its partitions")
        self._looked_at = time.monotonic()
        topic = md.topics.get(o.topic)
        if topic is None or topic.error is not None:
            why = f" ({topic.error.str()})" if topic is not None else ""
            raise PipelineError(f"Kafka topic {o.topic!r} does not exist at {o.bootstrap}{why}")
        return sorted(p for p in topic.partitions if p % o.parallelism == self.index)

    def _starts(self, partitions: list[int]) -> dict[int, int]:
        """Offsets to start reading at by the ``offsets`` rule."""
        rule = self.opts.offsets
        if rule == "latest":
            return {p: self._watermarks(p)[1] for p in partitions}
        starts = self._earliest(partitions)
        if rule == "committed" and partitions and self.opts.group_given:
            from confluent_kafka import TopicPartition

            tps = [TopicPartition(self.opts.topic, p) for p in partitions]
            got = self._ask(lambda: self._consumer.committed(tps, timeout=self.opts.timeout), "read committed offsets")
            starts.update({tp.partition: tp.offset for tp in got if tp.offset >= 0})
        return starts

    def _earliest(self, partitions: list[int]) -> dict[int, int]:
        return {p: self._watermarks(p)[0] for p in partitions}

    def _watermarks(self, p: int) -> tuple[int, int]:
        """(low, high) of partition ``p``; high is the last stable offset under read_committed."""
        from confluent_kafka import TopicPartition

        tp = TopicPartition(self.opts.topic, p)
        return self._ask(lambda: self._consumer.get_watermark_offsets(tp, timeout=self.opts.timeout),
                         f"look up the offsets of partition {p}")

    def _ask(self, call: Callable, what: str):
        """``call()``; a broker that does not answer within the timeout raises
        BrokerUnreachableError naming the address and the setting (a message, no traceback:
        the job's error is what the user reads)."""
        from confluent_kafka import KafkaException

        try:
            out = call()
        except KafkaException as e:
            why = e.args[0].str() if e.args else str(e)
        else:
            if out is not None:
                return out
            why = "no answer"
        o = self.opts
        raise BrokerUnreachableError(
            f"Kafka source of topic {o.topic!r} could not {what} at {o.bootstrap} within {o.timeout:g} s "
            f"(librdkafka: {why}); check that bootstrap.servers names brokers the workers can reach, or wait "
            "longer with the setting streamlb.kafka.timeout") from None

    # -- opening and reading ------------------------------------------------------------------
    def _open(self, split: Split) -> None:
        from confluent_kafka import TopicPartition

        p = self._partition(split.split_id)
        self._buffers[p], self._fetched[p] = Held(), int(split.position)
        if self.opts.until == "end":
            self._ends[p] = self._watermarks(p)[1]
        self._consumer.incremental_assign([TopicPartition(self.opts.topic, p, int(split.position))])
        self._assigned.add(p)

    def _close(self, split_id: str) -> None:
        from confluent_kafka import TopicPartition

        p = self._partition(split_id)
        if p in self._assigned:
            self._consumer.incremental_unassign([TopicPartition(self.opts.topic, p)])
            self._assigned.discard(p)
        for d in (self._buffers, self._fetched, self._ends):
            d.pop(p, None)
        self._served.pop(split_id, None)

    def _partition(self, split: str) -> int:
        topic, _, p = split.rpartition(":")
        if topic != self.opts.topic:
            raise ValueError(f"split {split!r} is not of Kafka topic {self.opts.topic!r}")
        return int(p)

    def _at_end(self, p: int) -> bool:
        """Partition ``p`` is read to its end offset (until="end")."""
        end = self._ends.get(p)
        return end is not None and self._fetched[p] >= end

    def read(self, split_id: str) -> pd.DataFrame | None:
        """Up to ``batch_size`` records of the split: None once it ended, an empty frame if
        none are there yet."""
        p = self._partition(split_id)
        if not self._buffers[p]:
            if self._at_end(p):
                return None
            held = sum(map(len, self._buffers.values()))
            if held < self.opts.batch_size * len(self._buffers) or \
                    (held < STARVED_CAP * self.opts.batch_size * len(self._buffers) and self._behind(p)):
                self._consume()
            if not self._buffers[p] and self._at_end(p):
                return None
        with no_collection():
            return self._batch(p)

    def _behind(self, p: int) -> bool:
        """Partition ``p`` has records at the broker that are not read yet (as far as the
        consumer's last fetch responses tell): its records may wait in the consumer's queue
        behind another partition's (a broker answers a fetch with as much of one partition
        as its limits allow), so the reader takes from that queue even with much buffered,
        rather than leave ``p`` behind and, for the watermark, idle."""
        from confluent_kafka import TopicPartition

        try:
            high = self._consumer.get_watermark_offsets(TopicPartition(self.opts.topic, p), cached=True)[1]
        except Exception:       # noqa: BLE001 - no fetch answer yet: it may well have records
            return True
        return high < 0 or self._fetched[p] < high

    def waiting(self) -> set[str]:
        """Partitions with records consumed and not handed out, or at the broker and not yet
        fetched (or not known yet: no fetch answer so far). Runs on the event loop while the
        reader thread may open or close partitions: one missing meanwhile is left out."""
        out = set()
        for p, held in list(self._buffers.items()):
            try:
                if len(held) or self._behind(p):
                    out.add(split_id(self.opts.topic, p))
            except KeyError:
                pass
        return out

    def _consume(self) -> None:
        """One ``consume`` call; its records wait by partition."""
        from confluent_kafka import TopicPartition

        topic = self.opts.topic
        with no_collection():
            msgs = self._consumer.consume(self.opts.batch_size, POLL_TIMEOUT)
            errors = [m.error() for m in msgs]
            if any(e is not None for e in errors):
                msgs = [m for m, e in zip(msgs, errors) if e is None or self._read_error(m, e)]
            if msgs:
                self._keep(msgs)
            del msgs
        # the position also moves past transaction markers and aborted records
        if not self._assigned:
            return
        for tp in self._consumer.position([TopicPartition(topic, p) for p in self._assigned]):
            if tp.offset >= 0:
                self._fetched[tp.partition] = max(self._fetched[tp.partition], tp.offset)
        done = [p for p in self._assigned if self._at_end(p)]
        if done:
            self._consumer.incremental_unassign([TopicPartition(topic, p) for p in done])
            self._assigned.difference_update(done)

    def _read_error(self, m, err) -> bool:
        """False for an error the consumer retries on its own (logged); raises the others."""
        from confluent_kafka import KafkaError

        if err.code() == KafkaError._PARTITION_EOF:
            return False
        away = err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT)
        if err.fatal() or not (err.retriable() or away):
            raise RuntimeError(f"Kafka source of topic {self.opts.topic!r} at {self.opts.bootstrap}, "
                               f"partition {m.partition()}: {err.str()}")
        logger.warning("Kafka topic %r partition %s: %s (retrying)", self.opts.topic, m.partition(), err.str())
        return False

    def _keep(self, msgs: list) -> None:
        """Put records in their partitions' buffers, in runs of one partition; records of a
        split closed meanwhile, delivered twice, or past an end offset are dropped."""
        parts = np.array([m.partition() for m in msgs], np.int64)
        offs = np.array([m.offset() for m in msgs], np.int64)
        cuts = [0, *(np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist(), len(msgs)]
        for i, j in zip(cuts, cuts[1:]):
            p = int(parts[i])
            if p not in self._buffers:
                continue
            run = offs[i:j]
            before = np.maximum.accumulate(np.concatenate([[self._fetched[p] - 1], run[:-1]]))
            new = run > before
            if not new.any():
                continue
            self._fetched[p] = max(self._fetched[p], int(run.max()) + 1)
            if p in self._ends:
                new &= run < self._ends[p]
            take = np.flatnonzero(new)
            got = msgs[i:j] if len(take) == j - i else [msgs[i + k] for k in take.tolist()]
            self._buffers[p].extend([m.value() for m in got], [m.key() for m in got],
                                    [m.timestamp()[1] for m in got], run[take].tolist())

    def _batch(self, p: int) -> pd.DataFrame:
        """The next batch waiting of partition ``p`` (empty: none), decoded."""
        values, keys, stamps, offsets = self._buffers[p].take(self.opts.batch_size)
        if not values:
            return self._empty.copy()
        frame = self._frame(keys, p, values, np.array(offsets, np.int64), np.array(stamps, np.int64))
        if len(frame):
            self._empty = frame.iloc[:0]
        return frame

    def _frame(self, keys: list, p: int, values: list, offsets: np.ndarray, stamps: np.ndarray) -> pd.DataFrame:
        """Records as a batch: the decoded values that decode, with the kafka_* columns."""
        decode = self.opts.decode
        keep = None
        if decode is None:
            data = {"value": pd.Series(values, dtype=object)}
        else:
            data, failed = (_json_rows(values) if decode == "json" else _decoded(decode, values))
            if failed:
                for i, reason in failed:
                    self._dead(p, int(offsets[i]), keys[i], values[i], int(stamps[i]), reason)
                keep = np.setdiff1d(np.arange(len(values)), [i for i, _ in failed])
        if keep is not None:
            keys, offsets, stamps = [keys[i] for i in keep], offsets[keep], stamps[keep]
        times = stamps.astype("datetime64[ms]")
        times[stamps < 0] = np.datetime64("NaT")
        meta = {"kafka_key": pd.Series(keys, dtype=object), "kafka_partition": np.full(len(offsets), p, np.int32),
                "kafka_offset": offsets, "kafka_timestamp": times}
        if isinstance(data, dict):          # columns as lists: one frame of them all
            return pd.DataFrame({**meta, **{c: v for c, v in data.items() if c not in META}})
        data = data.drop(columns=[c for c in META if c in data.columns]).reset_index(drop=True)
        return pd.concat([pd.DataFrame(meta), data], axis=1)

    def _dead(self, p: int, offset: int, key, value, stamp: int, reason: str) -> None:
        record = {"value": value, "kafka_key": key, "kafka_partition": p, "kafka_offset": offset,
                  "kafka_timestamp": pd.Timestamp(stamp, unit="ms") if stamp >= 0 else pd.NaT}
        self.dead_letters.append((record, f"Kafka topic {self.opts.topic!r} partition {p} offset {offset}: {reason}"))

    # -- positions ----------------------------------------------------------------------------
    def advance(self, position: int, rows: int, frame: pd.DataFrame | None = None) -> int:
        """The offset after the first ``rows`` rows of ``frame``, a batch of a split read
        from ``position``: after the last of them (offsets have gaps, so rows alone cannot
        say; the reader's own :meth:`poll` and :meth:`fetch` pass the batch)."""
        if frame is None:
            raise TypeError("KafkaReader.advance needs the batch: Kafka offsets have gaps "
                            "(transaction markers, aborted records, compaction), rows cannot count them")
        return int(frame["kafka_offset"].iat[rows - 1]) + 1 if rows else position

    def progress(self, split_id: str) -> float:
        """When the split last handed out a batch: :meth:`poll` takes turns between the
        splits that have records (offsets of two partitions say nothing of each other)."""
        return self._served.get(split_id, -np.inf)

    def poll(self) -> SplitBatch | None:
        """As :meth:`SplitReader.poll`; unbounded, it also looks for partitions added to the
        topic (every ``discovery_interval`` s) and opens those it owns in a poll that hands
        out an empty batch, so the runtime knows of them before any of their records goes out."""
        if self.opts.until is None and (new := self.new_splits()):
            self.add_splits(new)
            return SplitBatch(new[0].split_id, self._empty.copy())
        return super().poll()

    def _nothing_yet(self) -> SplitBatch | None:
        """No open split has records now: an empty batch (a live source), None once all ended."""
        waiting = [s for s in self._read if s not in self._ended]
        return SplitBatch(waiting[0], self._empty.copy()) if waiting else None

    def _taken(self, split_id: str, frame: pd.DataFrame) -> None:
        super()._taken(split_id, frame)
        self._served[split_id] = time.monotonic()

    # -- the consumer group and the end --------------------------------------------------------
    def commit(self, positions: dict[str, Any]) -> None:
        """Commit ``positions`` (split -> offset, as :meth:`save` holds them) to the user's
        consumer group, for monitoring tools; nothing without a ``group.id``. Asynchronous:
        a failure is logged as a warning, never raised."""
        from confluent_kafka import KafkaException, TopicPartition

        if not self.opts.group_given or self._closed:
            return
        tps = [TopicPartition(self.opts.topic, partition_of(s), int(off)) for s, off in positions.items()
               if s.rpartition(":")[0] == self.opts.topic and off is not None and int(off) >= 0]
        if not tps:
            return
        try:
            self._consumer.commit(offsets=tps, asynchronous=True)
        except (KafkaException, RuntimeError) as e:
            logger.warning("Kafka source of topic %r could not commit offsets to group %r: %s",
                           self.opts.topic, self.opts.consumer_params["group.id"], e)

    def _on_commit(self, err, partitions) -> None:
        failed = [tp for tp in partitions if tp.error is not None]
        if err is not None or failed:
            logger.warning("Kafka source of topic %r could not commit offsets to group %r: %s",
                           self.opts.topic, self.opts.consumer_params["group.id"], err or failed[0].error)

    def close(self) -> None:
        """Close the consumer (once)."""
        if not self._closed:
            self._closed = True
            self._consumer.close()


class LibrdkafkaLog:
    """librdkafka's ``logger``: its log lines go to the logger
    ``streamlb.sources.kafka.librdkafka``, each kind (facility and text, numbers aside) at
    its own level the first time and at DEBUG after, and :attr:`lines` counts them all. A
    broker that is away makes librdkafka log the same failure at every reconnection attempt,
    which on stderr would bury everything else. (The lines are handed over when the
    consumer is polled.)"""

    KINDS = 1_000           # kinds remembered; past that, every line at DEBUG

    def __init__(self) -> None:
        self.lines = 0
        self._kinds: set[str] = set()
        self._log = logging.getLogger("streamlb.sources.kafka.librdkafka")

    def log(self, level: int, fmt: str, *args) -> None:
        """What confluent_kafka calls with each line (a :class:`logging.Logger`'s signature)."""
        self.lines += 1
        kind = re.sub(r"\d+", "#", " ".join(map(str, args[:1] + args[2:])))
        if kind not in self._kinds and len(self._kinds) < self.KINDS:
            self._kinds.add(kind)
            self._log.log(level, fmt, *args)
        else:
            self._log.debug(fmt, *args)
