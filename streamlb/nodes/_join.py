"""streamlb's nodes that combine keyed streams or keep timers: ``join`` (interval, regular
and window joins) and ``process`` (a keyed function with state and event-time timers).

See docs/joins.md. Like every streamlb node they describe a step; :func:`streamlb.run`
plans and runs them. ``union`` is streamz's own node.
"""
from __future__ import annotations

from streamz import Stream

from .._time import duration_ns
from ..exceptions import PipelineError
from ._base import _check_name, _check_parallelism, _Described, _Late
from ._key import key_by

HOWS = ("inner", "left", "right", "outer")


def _keyed(node, what: str) -> None:
    if not isinstance(node, key_by):
        raise PipelineError(f"{what} takes a keyed stream (the node key_by returns), got {node}; "
                            "put .key_by(column) before it")


@Stream.register_api()
class join(_Late, _Described):
    """Join this keyed stream with ``other``, another keyed stream whose keys compare equal
    to this one's; after ``window(...)``, a window join.

    With ``between=(lower, upper)``: an **interval join**. A row ``r`` of ``other`` joins a
    row ``l`` of this stream when ``l.time + lower <= r.time <= l.time + upper`` (each
    side's watermarked event time); pairs are emitted as soon as both rows are there, and a
    row is dropped once the watermark makes a new match impossible (emitted with nulls
    then, for ``left``, ``right`` and ``outer``). Without ``between``: a **regular join**,
    incremental (each new pair emitted once), rows kept for ``ttl`` of event time behind
    the watermark, or for ever when ``ttl`` is None. After ``key_by(...).window(...)``: a
    **window join**, the pairs of each window emitted when it fires, with
    ``window_start`` and ``window_end``.

    Output rows have a ``RangeIndex`` and both sides' columns as ``pandas.merge(left,
    right, left_on=..., right_on=..., suffixes=suffixes)`` names them. Rows behind the
    watermark on arrival go to ``late()`` (or the dead letters, reason ``"late"``).

    Parameters
    ----------
    other : KeyedStream
        The right side: a node returned by ``key_by``.
    how : str
        ``inner``, ``left``, ``right`` or ``outer`` (interval joins); ``inner`` only for
        regular and window joins.
    between : (duration, duration), optional
        The interval of an interval join: durations (seconds as numbers, strings with a
        unit, timedeltas; docs/configuration.md, "Durations").
    ttl : duration, optional
        How long a regular join keeps a row behind the watermark (None: for ever).
    where : callable, optional
        ``where(joined: DataFrame) -> mask``: only the joined rows where it is True are
        emitted.
    suffixes : (str, str)
        For the columns both sides have, as in ``pandas.merge``.
    name : str, optional
        Operator name (default ``"join"``, ``"window_join"``).
    parallelism : int, optional
        Instances (default: setting ``streamlb.parallelism``, else one per worker).
    """

    def __init__(self, upstream, other, how="inner", between=None, ttl=None, where=None, suffixes=("_x", "_y"),
                 name=None, parallelism=None, **kwargs):
        from ._time import window

        what = f"join {name!r}" if name else "join"
        windowed = isinstance(upstream, window)
        _keyed(upstream.upstreams[0] if windowed else upstream, what)
        _keyed(other, f"{what}: other")
        if how not in HOWS:
            raise PipelineError(f"{what}: how={how!r} is not a join type; valid: {', '.join(HOWS)}")
        if between is not None:
            if windowed:
                raise PipelineError(f"{what}: a window join takes no between=; its windows say which rows meet")
            if ttl is not None:
                raise PipelineError(f"{what}: give between= (interval join) or ttl= (regular join), not both")
            if not (isinstance(between, (tuple, list)) and len(between) == 2):
                raise PipelineError(f"{what}: between must be a pair (lower, upper) of durations, got {between!r}")
            lo = duration_ns(between[0], f"{what}: between[0]", negative=True)
            hi = duration_ns(between[1], f"{what}: between[1]", negative=True)
            if lo > hi:
                raise PipelineError(f"{what}: between=({between[0]!r}, {between[1]!r}) has lower > upper")
            between = (lo, hi)
        elif how != "inner":
            kind = "window" if windowed else "regular"
            raise PipelineError(f"{what}: a {kind} join supports how='inner' only, got {how!r}; left, right and "
                                "outer need between= (an interval join)")
        if ttl is not None:
            if windowed:
                raise PipelineError(f"{what}: a window join takes no ttl=; its state ends with its windows")
            ttl = duration_ns(ttl, f"{what}: ttl")
        if where is not None and not callable(where):
            raise PipelineError(f"{what}: where must be a function of the joined rows returning a mask, got {where!r}")
        if not (isinstance(suffixes, (tuple, list)) and len(suffixes) == 2
                and all(isinstance(x, str) for x in suffixes)):
            raise PipelineError(f"{what}: suffixes must be a pair of strings, got {suffixes!r}")
        _check_parallelism(parallelism, what)
        _check_name(name, "join")
        self.how, self.between, self.ttl, self.where = how, between, ttl, where
        self.suffixes, self.op_name, self.parallelism, self.cost = tuple(suffixes), name, parallelism, None
        super().__init__(None, upstreams=[upstream, other], **kwargs)


@Stream.register_api()
class process(_Described):
    """A keyed function with state and event-time timers (Flink's ``KeyedProcessFunction``),
    for what windows and joins do not cover.

    ``func(key, rows, ctx)`` is called with each batch's rows of a key (a DataFrame);
    ``on_timer(key, time, ctx)`` when the watermark passes a time the key asked for with
    ``ctx.timer(time)``. Both may return a DataFrame of output rows, a dict (one row) or
    None; the key column is added when missing. ``ctx.state`` is the key's state (None at first; assign to it;
    it must be picklable), ``ctx.watermark`` the operator's watermark, ``ctx.cancel(time)``
    drops a timer. State and timers live in key groups: they move, split-free, with them.

    With ``batch=True`` both are called once per batch instead, vectorised:
    ``func(rows, state, ctx)`` with the whole batch and ``state``, a DataFrame indexed by key
    holding the state rows of the batch's keys that have one; ``on_timer(due, state, ctx)``
    with every timer the watermark passed (columns: the key, ``time``) and their keys'
    state. ``ctx.put(frame)`` sets keys' state columns, ``ctx.forget(keys)`` drops it,
    ``ctx.timer(keys, times)`` and ``ctx.cancel(keys, times)`` set and drop timers, for the
    keys of the call (``ctx.keys``); both return a DataFrame or None (docs/joins.md).

    Parameters
    ----------
    func : callable
        ``func(key, rows: DataFrame, ctx) -> DataFrame | dict | None``; with ``batch=True``,
        ``func(rows: DataFrame, state: DataFrame, ctx) -> DataFrame | None``.
    on_timer : callable, optional
        ``on_timer(key, time: Timestamp, ctx) -> DataFrame | dict | None``; with
        ``batch=True``, ``on_timer(due: DataFrame, state: DataFrame, ctx) -> DataFrame | None``.
    parallelism : int, optional
        Instances.
    name : str, optional
        Operator name (default ``"process"``).
    batch : bool, default False
        Call the functions once per batch, with a table of state (above), not once per key.
    """

    def __init__(self, upstream, func, on_timer=None, parallelism=None, name=None, batch=False, **kwargs):
        _keyed(upstream, "process")
        for what, f in (("func", func), ("on_timer", on_timer)):
            if f is not None and not callable(f) or what == "func" and f is None:
                raise PipelineError(f"process: {what} must be callable, got {f!r}")
        _check_parallelism(parallelism, "process")
        _check_name(name, "process")
        if not isinstance(batch, bool):
            raise PipelineError(f"process: batch must be True or False, got {batch!r}")
        self.func, self.on_timer, self.parallelism, self.op_name, self.cost = func, on_timer, parallelism, name, None
        self.batch = batch
        super().__init__(upstream, **kwargs)
