"""streamlb's event-time nodes: ``with_watermark``, ``window`` and what follows a window
(``aggregate``, ``apply``), and the late stream of a window operator (``late()``).

See docs/windows.md. Like every streamlb node they describe a step; :func:`streamlb.run`
plans and runs them.
"""
from __future__ import annotations

from streamz import Stream

from .._time import check_unit, duration_ns
from ..exceptions import PipelineError
from ._base import _check_name, _check_parallelism, _Described, _Late


@Stream.register_api()
class with_watermark(_Described):
    """Declare the event-time column of a source's records and how its watermark advances.

    Place it in a source's stage (before its first ``key_by`` or ``rebalance``). Watermarks
    are kept per split (a Parquet file): a split's watermark is the largest event time
    emitted from it minus ``delay``; a source instance's is the minimum over its unfinished,
    non-idle splits; end of stream is a watermark of +inf.

    Parameters
    ----------
    column : str
        The event-time column: ``datetime64`` of any precision, or integers with ``unit=``.
    delay : duration
        How far behind the largest event time seen the watermark stays (the disorder the
        stream may have without records becoming late). Seconds (a number), a string with
        a unit (``"10s"``), ``datetime.timedelta`` or ``pd.Timedelta`` (docs/configuration.md,
        "Durations"); never in the column's ``unit``.
    idle_timeout : duration
        A split or source instance that emits nothing for this long (processing time) is
        idle and holds no watermark back until it emits again. With ``rate=`` the time
        counts in the source's pace: while the job holds the source back (backpressure,
        a loaded machine) its batches are late, not its splits idle.
    unit : str, optional
        For an integer column: what it counts, one of ``s``, ``ms``, ``us``, ``ns``.

    Examples
    --------
    >>> from streamz import Stream
    >>> src = Stream.from_parquet("data/events").with_watermark("event_time", delay="3s")
    """

    def __init__(self, upstream, column, delay="0s", idle_timeout="5s", unit=None, **kwargs):
        what = f"with_watermark({column!r})"
        if not isinstance(column, str) or not column:
            raise PipelineError(f"with_watermark: column must be a column name, got {column!r}")
        self.column = column
        self.delay = duration_ns(delay, f"{what}: delay")
        self.idle_timeout = duration_ns(idle_timeout, f"{what}: idle_timeout", positive=True)
        self.unit = check_unit(unit, what)
        super().__init__(upstream, **kwargs)


@Stream.register_api()
class window(_Described):
    """Event-time windows over a keyed stream (the node ``key_by`` returns).

    ``size`` alone: tumbling windows; ``size`` and ``slide``: hopping windows (a record is
    in about ``size / slide`` of them); ``gap`` alone: session windows per key (records of
    a key whose event times differ by at most ``gap`` share a session, which ends ``gap``
    after its last record). Windows are aligned to the epoch, half-open
    ``[window_start, window_end)``, and fire once the operator's watermark reaches
    ``window_end``. Follow it with :meth:`aggregate` or :meth:`apply`.

    Parameters
    ----------
    size, slide, gap : duration, optional
        See above.
    lateness : duration
        How long after firing a window still takes late records: each one updates it and
        its row is emitted again. Records later than that go to ``late()``.

    Examples
    --------
    >>> from streamz import Stream
    >>> src = Stream.from_parquet("data/events").with_watermark("event_time", delay="3s")
    >>> counts = src.key_by("key").window(size="10s").aggregate({"n": ("value", "count")}, name="counts")
    """

    def __init__(self, upstream, size=None, slide=None, gap=None, lateness="0s", **kwargs):
        if gap is not None:
            if size is not None or slide is not None:
                raise PipelineError("window: give size (tumbling), size and slide (hopping) or gap (session "
                                    f"windows), not gap with size or slide; got size={size!r}, slide={slide!r}, "
                                    f"gap={gap!r}")
            self.kind, self.gap = "session", duration_ns(gap, "window: gap", positive=True)
            self.size = self.slide = 0
        elif size is None:
            raise PipelineError("window: give size= (tumbling), size= and slide= (hopping) or gap= (session windows)")
        else:
            self.size = duration_ns(size, "window: size", positive=True)
            self.slide = self.size if slide is None else duration_ns(slide, "window: slide", positive=True)
            if self.slide > self.size:
                raise PipelineError(f"window: slide ({slide!r}) must not be longer than size ({size!r}); records "
                                    "would fall between windows")
            self.kind = "tumbling" if self.slide == self.size else "hopping"
            self.gap = 0
        self.lateness = duration_ns(lateness, "window: lateness")
        super().__init__(upstream, **kwargs)

    def describe(self) -> dict:
        """The window as the planner carries it (durations in nanoseconds)."""
        return {"kind": self.kind, "size": self.size, "slide": self.slide, "gap": self.gap,
                "lateness": self.lateness}


@Stream.register_api()
class apply(_Late, _Described):
    """Call ``func(key, window_start, window_end, rows)`` once per fired window (after
    ``window``); its DataFrame gets the key and window columns added.

    Parameters
    ----------
    func : callable
        ``func(key, window_start, window_end, rows: DataFrame) -> DataFrame``.
    parallelism : int, optional
        Instances (default: setting ``streamlb.parallelism``, else one per worker).
    name : str, optional
        Operator name (default ``"apply"``).
    """

    def __init__(self, upstream, func, parallelism=None, name=None, **kwargs):
        if not callable(func):
            raise PipelineError(f"apply: func must be callable, got {func!r}")
        _check_parallelism(parallelism, "apply")
        _check_name(name, "apply")
        self.func, self.parallelism, self.op_name, self.cost = func, parallelism, name, None
        super().__init__(upstream, **kwargs)
