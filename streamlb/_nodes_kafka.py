"""``Stream.from_kafka_topic``: a Kafka topic as a source (the reader: ``_sources/_kafka.py``).

Planned by :func:`plan` (registered in :data:`streamlb.planner.SOURCES`), one stage of kind
``kafka_source`` whose instances own the topic's partitions ``p % parallelism == index``.
"""
from __future__ import annotations

from streamz import Source, Stream

from ._node_base import _check_parallelism
from .exceptions import PipelineError


@Stream.register_api(staticmethod)
class from_kafka_topic(Source):
    """A Kafka topic, read by streamlb's source instances (each owns some partitions).

    Parameters
    ----------
    topic : str
        The topic to read.
    consumer_params : dict
        librdkafka settings, as streamz's Kafka sources take them; ``bootstrap.servers`` is
        required. With ``group.id``, offsets are committed to that group after each
        checkpoint (for monitoring; streamlb's own positions are in its checkpoints).
    decode : None, "json" or callable, optional
        None: a ``value`` column of bytes; ``"json"``: each JSON object's fields as columns;
        a callable ``decode(values: list[bytes]) -> DataFrame`` (one row per value). A value
        that cannot be decoded goes to dead letters with its partition and offset.
    offsets : {"committed", "earliest", "latest"}
        Where a partition with no saved position starts (``committed`` falls back to the
        earliest offset).
    until : None or "end"
        ``"end"``: stop at the end offsets seen when each partition is opened (a bounded
        run); None: run until ``job.stop()``.
    parallelism : int, optional
        Source instances (default: one per worker).
    batch_size : int, optional
        Records per batch at most (default 10,000).

    Every batch also has ``kafka_key`` (bytes or None), ``kafka_partition``,
    ``kafka_offset`` and ``kafka_timestamp`` (datetime64[ms]). See docs/kafka.md.

    Examples
    --------
    >>> from streamz import Stream
    >>> src = Stream.from_kafka_topic("orders", {"bootstrap.servers": "127.0.0.1:9092"}, decode="json")
    >>> totals = src.key_by("customer").aggregate({"n": ("amount", "count")}, name="totals")
    """

    def __init__(self, topic, consumer_params, decode=None, offsets="committed", until=None, parallelism=None,
                 batch_size=None, **kwargs):
        from ._sources._kafka import KafkaOptions

        what = f"from_kafka_topic({topic!r})"
        if not isinstance(topic, str) or not topic:
            raise PipelineError(f"from_kafka_topic: topic must be a non-empty string, got {topic!r}")
        if not isinstance(consumer_params, dict):
            raise PipelineError(f"{what}: consumer_params must be a dict of librdkafka settings, "
                                f"got {type(consumer_params).__name__}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise PipelineError(f"{what}: batch_size must be a positive integer, got {batch_size!r}")
        _check_parallelism(parallelism, what)
        self.topic, self.consumer_params, self.decode = topic, dict(consumer_params), decode
        self.offsets, self.until = offsets, until
        self.parallelism, self.batch_size = parallelism, batch_size
        KafkaOptions.from_stage(self)       # every bad value refused here, naming it
        super().__init__(**kwargs)

    async def run(self):
        raise PipelineError("from_kafka_topic runs on a Dask cluster: use streamlb.run(...)")


def plan(planner, n: from_kafka_topic):
    """The stage of a ``from_kafka_topic`` node."""
    return planner.new_stage(
        name=planner.unique_name(None, f"from_kafka_topic({n.topic})"), kind="kafka_source",
        parallelism=planner.default_parallelism(n.parallelism), batch_size=n.batch_size or 10_000,
        source={"topic": n.topic, "consumer_params": n.consumer_params, "decode": n.decode,
                "offsets": n.offsets, "until": n.until})
