"""Sources behind one seam: a reader for each kind of source stage.

``_base`` holds the seam (:class:`Split`, :class:`SplitReader`); every other module holds
one source: ``_parquet`` (``Stream.from_parquet``, a split per file), ``_iterable``
(``Stream.from_iterable``, its items one split), ``_kafka`` (``Stream.from_kafka_topic``,
a split per partition) and ``_directory`` (``Stream.from_parquet(path, watch=...)``, a split
per file as files appear). A new source is one new module with a
``SplitReader`` and its entry in :data:`READERS`, under the kind of stage the planner
makes for it. Pacing, event-time replay, checkpoint barriers, what was emitted and the
watermark input are the runtime's, the same for every source
(:class:`streamlb._worker._sources.Source`); see docs/runtime.md, "The source seam".
"""
from __future__ import annotations

from ._base import Split, SplitBatch, SplitReader, event_times
from ._directory import DirectoryReader
from ._iterable import IterableReader
from ._parquet import ParquetReader


def _kafka(stage, index):
    from ._kafka import KafkaReader       # imports confluent_kafka: only for a Kafka source

    return KafkaReader(stage, index)


# kind of source stage -> its reader
READERS: dict[str, type[SplitReader]] = {"parquet_source": ParquetReader, "iterable_source": IterableReader,
                                         "kafka_source": _kafka, "directory_source": DirectoryReader}


def open_reader(stage, index: int) -> SplitReader:
    """The reader of ``stage``'s instance ``index`` (no split opened yet).

    >>> from types import SimpleNamespace
    >>> open_reader(SimpleNamespace(kind="kinesis_source"), 0)
    Traceback (most recent call last):
    ValueError: no reader for source kind 'kinesis_source'; kinds: parquet_source, iterable_source, kafka_source, ...
    """
    cls = READERS.get(stage.kind)
    if cls is None:
        raise ValueError(f"no reader for source kind {stage.kind!r}; kinds: {', '.join(READERS)}")
    return cls(stage, index)


__all__ = ["Split", "SplitBatch", "SplitReader", "READERS", "open_reader", "event_times"]
