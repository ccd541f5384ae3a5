"""``Stream.from_kafka_topic`` and ``.to_kafka_topic``: Kafka as a source (the reader:
``_sources/_kafka.py``) and a sink (``_sinks/_kafka.py``).

The source is planned by :func:`plan` (registered in :data:`streamlb.planner.SOURCES`), one
stage of kind ``kafka_source`` whose instances own the topic's partitions
``p % parallelism == index``; the sink by :func:`plan_sink` (in ``streamlb.planner.SINKS``),
a ``kafka_sink`` step.
"""
from __future__ import annotations

from streamz import Sink, Source, Stream

from ._base import _check_parallelism
from ..exceptions import PipelineError


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
        from .._sources._kafka import KafkaOptions

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
    from .._sources._kafka import KafkaOptions

    return planner.new_stage(
        name=planner.unique_name(None, f"from_kafka_topic({n.topic})"), kind="kafka_source",
        parallelism=planner.default_parallelism(n.parallelism), batch_size=n.batch_size or 10_000,
        source={"topic": n.topic, "consumer_params": n.consumer_params, "decode": n.decode,
                "offsets": n.offsets, "until": n.until,
                # read here, on the driver: an existing cluster's workers have their own settings
                "timeout": KafkaOptions.from_stage(n).timeout})


@Stream.register_api()
class to_kafka_topic(Sink):
    """Write every row of every batch to a Kafka topic as one message, in transactions.

    Parameters
    ----------
    topic : str
        The topic to write to (it must exist).
    producer_config : dict
        librdkafka settings (``bootstrap.servers`` required). streamlb sets
        ``transactional.id`` itself, one per instance and producer.
    key : str, optional
        A column whose values become the messages' keys (bytes as they are, anything else as
        its ``str`` in UTF-8); the producer's default partitioner then places them.
    encode : "json" or callable
        ``"json"``: each row's columns as a JSON object (the index is not written; timestamps
        in ISO 8601); a callable ``encode(df) -> list[bytes]``, one value per row.

    With ``checkpoint=``, an instance's rows since the last checkpoint commit when that
    checkpoint completes, and what no checkpoint committed is aborted on a recovery or
    ``job.stop()``: a reader with ``isolation.level=read_committed`` sees each row the sink
    received once. Without, rows commit about every second and at the end. See docs/kafka.md.
    """

    def __init__(self, upstream, topic, producer_config, key=None, encode="json", **kwargs):
        what = f"to_kafka_topic({topic!r})"
        if not isinstance(topic, str) or not topic:
            raise PipelineError(f"to_kafka_topic: topic must be a non-empty string, got {topic!r}")
        if not isinstance(producer_config, dict) or not producer_config.get("bootstrap.servers"):
            raise PipelineError(f"{what}: producer_config must be a dict of librdkafka settings with "
                                f"'bootstrap.servers', got {producer_config!r}")
        if "transactional.id" in producer_config:
            raise PipelineError(f"{what}: producer_config must not set 'transactional.id': streamlb gives "
                                "each instance's producers their own")
        if not (encode == "json" or callable(encode)):
            raise PipelineError(f"{what}: encode={encode!r}; valid: 'json' or a callable(df) -> list[bytes]")
        if key is not None and not isinstance(key, str):
            raise PipelineError(f"{what}: key must be a column name or None, got {key!r}")
        self.topic, self.producer_config, self.key, self.encode = topic, dict(producer_config), key, encode
        super().__init__(upstream, **kwargs)

    def update(self, x, who=None, metadata=None):
        raise PipelineError("to_kafka_topic runs on a Dask cluster: use streamlb.run(...)")


def plan_sink(planner, n: to_kafka_topic, stage):
    """The step of a ``to_kafka_topic`` node (its number in the plan names its producers)."""
    from .._plan._step import Step, _ship

    planner.kafka_sinks = getattr(planner, "kafka_sinks", 0) + 1
    encode = _ship(n.encode, stage.name) if callable(n.encode) else n.encode
    return Step("kafka_sink", target=planner.kafka_sinks - 1,
                kwargs={"topic": n.topic, "producer_config": n.producer_config, "key": n.key, "encode": encode})
