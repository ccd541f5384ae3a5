"""streamlb's nodes on ``streamz.Stream``.

Between nodes, elements are micro-batches: pandas DataFrames. Plain streamz nodes placed
between streamlb nodes (``map``, ``starmap``, ``filter``, ``flatten``, ``sink``) apply to each
batch and are fused into the stage they sit in. These nodes describe a pipeline;
:func:`streamlb.run` plans and runs it on a Dask cluster.
"""
from __future__ import annotations

from collections.abc import Mapping

from streamz import Sink, Source, Stream

from ._base import _check_cost, _check_name, _check_parallelism, _Described, _Late
from ..exceptions import PipelineError
from ._key import key_by  # noqa: F401  (registered on streamz.Stream)

__all__ = ["from_parquet", "with_watermark", "select", "key_by", "window", "aggregate", "apply", "join", "process",
           "stateful_map", "rebalance", "to_parquet"]

AGGREGATIONS = ("count", "sum", "min", "max", "mean")


@Stream.register_api(staticmethod)
class from_parquet(Source):
    """Partitioned Parquet source: each instance owns whole files, read in order.

    Parameters
    ----------
    path : str
        A Parquet file or a directory searched recursively for ``*.parquet`` files.
    rate : float, optional
        Records per second, all instances together: emit open-loop at this fixed rate
        (for latency measurements); each instance takes the share its files hold of the
        rows, so they finish together. None reads as fast as the job takes data.
    batch_size : int, optional
        Rows per micro-batch (default: setting ``streamlb.batch-size``; with ``rate=``,
        smaller: about 16 batches per instance per load window, see docs/runtime.md).
    parallelism : int, optional
        Source instances (default: one per worker, at most one per file).
    columns : list of str, optional
        Columns to read (default all).
    event_time : str, optional
        A timestamp (or numeric) column each file is ordered by. Each instance then reads its
        files merged by this column, and with ``rate`` every instance replays the log on one
        shared clock (event time mapped to wall time), so the stream stays in event-time order
        across files and instances, as a log replayed at speed would be.
    watch : str or float, optional
        Keep watching the directory ``path``: list it every ``watch`` (a duration such as
        ``"1s"``, or seconds) and read each new file once, until ``job.stop()``. A file
        is taken once visible: write it under a name starting with ``_`` or ``.`` and
        rename it into place (atomic on POSIX), as Spark does. Each new file goes to one
        instance (one per worker by default) by a stable hash of its path; the files
        read, and the rows read of those being read, are in checkpoints and savepoints,
        so each is read exactly once across a recovery or a restore. The directory may
        be empty when the job starts. See docs/kafka.md, "A directory that grows".

    Examples
    --------
    >>> from streamz import Stream
    >>> src = Stream.from_parquet("data/zipf", batch_size=10_000)
    >>> counts = src.key_by("key").aggregate({"n": ("value", "count")}, name="counts")
    >>> landing = Stream.from_parquet("data/landing", watch="1s")
    """

    def __init__(self, path, rate=None, batch_size=None, parallelism=None, columns=None, event_time=None,
                 watch=None, **kwargs):
        if rate is not None and not rate > 0:
            raise PipelineError(f"from_parquet({path!r}): rate must be > 0 records/s, got {rate!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise PipelineError(
                f"from_parquet({path!r}): batch_size must be a positive integer, got {batch_size!r}"
            )
        _check_parallelism(parallelism, f"from_parquet({path!r})")
        self.path = str(path)
        self.rate = rate
        self.batch_size = batch_size
        self.parallelism = parallelism
        self.columns = list(columns) if columns is not None else None
        if event_time is not None and not isinstance(event_time, str):
            raise PipelineError(f"from_parquet({path!r}): event_time must be a column name, got {event_time!r}")
        self.event_time = event_time
        self.watch = _watch_seconds(watch, f"from_parquet({path!r})")
        super().__init__(**kwargs)

    async def run(self):
        raise PipelineError("from_parquet runs on a Dask cluster: use streamlb.run(...)")


def _watch_seconds(watch, what: str) -> float | None:
    """``from_parquet(watch=...)`` in seconds: None, or a positive duration (a number is
    seconds, a string carries its unit: see :func:`streamlb._time.duration_ns`).

    >>> _watch_seconds("200ms", "from_parquet('d')"), _watch_seconds(2, "from_parquet('d')")
    (0.2, 2.0)
    >>> _watch_seconds("soon", "from_parquet('d')")
    Traceback (most recent call last):
    streamlb.exceptions.PipelineError: from_parquet('d'): watch: 'soon' is not a positive duration; ...
    """
    from .._time import duration_s

    return None if watch is None else duration_s(watch, f"{what}: watch", positive=True)


@Stream.register_api()
class aggregate(_Late, _Described):
    """Vectorised keyed aggregation, as pandas named aggregation.

    Emits, per batch applied, a DataFrame indexed by key with the current value of every
    aggregate for the keys that batch touched (an update stream).

    Parameters
    ----------
    spec : mapping
        Output column → ``(input column, how)``, how in count, sum, min, max, mean.
    parallelism : int, optional
        Instances (default: setting ``streamlb.parallelism``, else one per worker).
    name : str, optional
        Operator name for ``Job.state(name)`` and metrics (default ``"aggregate"``).
    cost : float or str, optional
        Emulated service time per record, for benchmarks and capacity planning: seconds per
        record, or the name of a column holding each record's seconds. After applying a
        batch, the instance waits for the batch's total without blocking its worker, as an
        instance of fixed capacity would (see docs/runtime.md).

    Examples
    --------
    >>> from streamz import Stream
    >>> src = Stream.from_parquet("data/zipf")
    >>> totals = src.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")},
    ...                                      name="totals")
    """

    def __init__(self, upstream, spec, parallelism=None, name=None, cost=None, **kwargs):
        what = f"aggregate {name!r}" if name else "aggregate"
        if not isinstance(spec, Mapping) or not spec:
            raise PipelineError(
                f"{what}: spec must be a non-empty mapping of output column to "
                f"(input column, how), got {spec!r}"
            )
        clean = {}
        for out, item in spec.items():
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise PipelineError(
                    f"{what}: spec[{out!r}] must be a pair (input column, how), got {item!r}"
                )
            if item[1] not in AGGREGATIONS:
                raise PipelineError(
                    f"{what}: spec[{out!r}] asks for {item[1]!r}; valid aggregations are "
                    f"{', '.join(AGGREGATIONS)}"
                )
            clean[str(out)] = (item[0], item[1])
        _check_parallelism(parallelism, what)
        _check_name(name, "aggregate")
        self.cost = _check_cost(cost, what)
        self.spec = clean
        self.parallelism = parallelism
        self.op_name = name
        super().__init__(upstream, **kwargs)


@Stream.register_api()
class stateful_map(_Described):
    """Per-record function with per-key state.

    Emits a DataFrame with the key column and an ``output`` column, one row per record, in
    per-key order.

    Parameters
    ----------
    func : callable
        ``func(state, record) -> (state, output)``; ``state`` is None for a key's first
        record and ``record`` is a dict of column name to value. State must be picklable.
    parallelism : int, optional
        Instances (default: setting ``streamlb.parallelism``, else one per worker).
    name : str, optional
        Operator name for ``Job.state(name)``, ``Job.update`` and metrics (default
        ``"stateful_map"``).
    cost : float or str, optional
        Emulated service time per record, as for :meth:`aggregate`.

    Examples
    --------
    >>> from streamz import Stream
    >>> def running_total(state, record):
    ...     total = (state or 0) + record["value"]
    ...     return total, total
    >>> src = Stream.from_parquet("data/zipf")
    >>> totals = src.key_by("key").stateful_map(running_total, name="running")
    """

    def __init__(self, upstream, func, parallelism=None, name=None, cost=None, **kwargs):
        if not callable(func):
            raise PipelineError(f"stateful_map: func must be callable, got {func!r}")
        _check_parallelism(parallelism, "stateful_map")
        _check_name(name, "stateful_map")
        self.cost = _check_cost(cost, "stateful_map")
        self.func = func
        self.parallelism = parallelism
        self.op_name = name
        super().__init__(upstream, **kwargs)


@Stream.register_api()
class rebalance(_Described):
    """Exchange for stateless stages: spreads batches over the next stage's instances.

    Parameters
    ----------
    parallelism : int, optional
        Instances of the next stage.
    cost : float or str, optional
        Emulated service time per record in the next stage, as for :meth:`aggregate`.
    balancer : str
        ``round_robin`` (default: whole batches in turn), ``jsq`` (each batch to the
        instance with the fewest batches in flight) or ``osg`` (record groups to the
        instance that will finish them first, by costs learnt per ``feature``).
    feature : str or callable, optional
        For ``osg``: a column, or a function of the batch returning one value per row,
        whose value predicts a record's cost (tens to a few hundred distinct values).
    group : int
        For ``osg``: rows per record group (default 256).
    """

    def __init__(self, upstream, parallelism=None, cost=None, balancer="round_robin", feature=None,
                 group=256, **kwargs):
        from .._shuffle import check_shuffle

        _check_parallelism(parallelism, "rebalance")
        self.cost = _check_cost(cost, "rebalance")
        self.balancer = check_shuffle(balancer)
        if balancer == "osg" and not (callable(feature) or isinstance(feature, str) and feature):
            raise PipelineError(
                "rebalance(balancer='osg') needs feature=: a column name or a function of the batch "
                f"returning one value per row, got {feature!r}"
            )
        if not isinstance(group, int) or group < 1:
            raise PipelineError(f"rebalance: group must be a positive integer (rows per record group), got {group!r}")
        self.feature = feature
        self.group = group
        self.parallelism = parallelism
        super().__init__(upstream, **kwargs)


@Stream.register_api()
class to_parquet(Sink):
    """Write every batch to partitioned Parquet under ``path``.

    Each instance writes its own ``part-<stage>-<instance>.parquet``. Files appear only when
    the job completes, followed by a ``_SUCCESS`` marker; a failed job leaves neither. A job
    run with ``checkpoint=`` writes one file per instance per checkpoint
    (``part-<stage>-<instance>[-r<run>]-c<n>.parquet``) and commits each when its checkpoint
    completes, so each record's output is written exactly once across a recovery.

    Parameters
    ----------
    path : str
        Output directory.
    """

    def __init__(self, upstream, path, **kwargs):
        self.path = str(path)
        super().__init__(upstream, **kwargs)

    def update(self, x, who=None, metadata=None):
        raise PipelineError("to_parquet runs on a Dask cluster: use streamlb.run(...)")


from ._time import apply, window, with_watermark  # noqa: E402,F401  (registered on streamz.Stream)
from ._join import join, process  # noqa: E402,F401  (registered on streamz.Stream)
from ._kafka import from_kafka_topic, to_kafka_topic  # noqa: E402,F401  (registered on streamz.Stream)
from ._select import select  # noqa: E402,F401  (registered on streamz.Stream)
