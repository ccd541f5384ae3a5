"""Event time: durations, event-time columns as integer nanoseconds, and back.

Inside streamlb every event time, watermark and window boundary is an ``int64`` count of
nanoseconds since the epoch, so window assignment is exact integer arithmetic whatever
the column's precision. :data:`MIN_TIME` is "nothing seen yet" and :data:`MAX_TIME` the
end of the stream.
"""
from __future__ import annotations

import datetime
import re

import numpy as np
import pandas as pd

from .exceptions import PipelineError, SchemaError

MIN_TIME = np.iinfo(np.int64).min
MAX_TIME = np.iinfo(np.int64).max

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")

#: ``unit=`` of an integer event-time column, and nanoseconds per unit.
UNITS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def duration_ns(value, what: str, *, positive: bool = False, negative: bool = False) -> int:
    """A duration as integer nanoseconds, by the one rule of every duration streamlb takes
    (docs/configuration.md, "Durations"); ``what`` names the argument in errors.

    A number is seconds; a string carries its unit (``"10s"``, ``"250ms"``, ``"2 min"``; a
    string of a bare number is seconds too); a ``datetime.timedelta``, ``pd.Timedelta`` or
    ``np.timedelta64`` is taken as it is. A number never counts in the ``unit=`` of an
    integer event-time column: that says what the column holds, not what durations mean.

    >>> duration_ns(10, "size"), duration_ns("1500ms", "delay"), duration_ns(datetime.timedelta(seconds=2), "gap")
    (10000000000, 1500000000, 2000000000)
    >>> duration_ns("0.5", "watch")
    500000000

    ``positive=True`` refuses 0; ``negative=True`` takes durations below zero too (a join's
    interval bounds); else a duration must be >= 0.
    """
    ns = None
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        if np.isfinite(value):
            ns = int(round(float(value) * 1e9)) if isinstance(value, (float, np.floating)) else int(value) * 10**9
    elif isinstance(value, (str, datetime.timedelta, pd.Timedelta, np.timedelta64)):
        try:
            ns = int(pd.Timedelta(value).value)
        except (ValueError, TypeError, OverflowError):
            ns = None
    if ns is not None and abs(ns) < MAX_TIME and (negative or ns >= 0) and (ns > 0 or not positive):
        return ns
    need = "a positive duration" if positive else "a duration" if negative else "a duration >= 0"
    raise PipelineError(
        f"{what}: {value!r} is not {need}; give seconds as a number (10, 0.25), a string with a unit "
        "such as '10s' or '250ms', a datetime.timedelta or a pd.Timedelta"
    )


def duration_s(value, what: str, *, positive: bool = False, negative: bool = False) -> float:
    """:func:`duration_ns` in float seconds, for the durations of the job itself (polls,
    timeouts, intervals).

    >>> duration_s("200ms", "watch"), duration_s(2, "watch")
    (0.2, 2.0)
    """
    return duration_ns(value, what, positive=positive, negative=negative) / 1e9


def check_unit(unit, what: str) -> str | None:
    if unit is None or unit in UNITS:
        return unit
    raise PipelineError(f"{what}: unit must be None (datetime64 column) or one of {', '.join(UNITS)}, got {unit!r}")


def to_ns(col: pd.Series | np.ndarray, unit: str | None, what: str) -> np.ndarray:
    """An event-time column as int64 nanoseconds: ``datetime64`` of any precision (with
    ``unit=None``), or integers counted in ``unit``. Nulls are refused by the caller first
    (they go to the dead letters)."""
    if isinstance(col, pd.Series) and isinstance(col.dtype, pd.DatetimeTZDtype):
        col = col.dt.tz_convert("UTC").dt.tz_localize(None)
    arr = col.to_numpy() if isinstance(col, pd.Series) else np.asarray(col)
    if arr.dtype.kind == "M":
        if unit is not None:
            raise SchemaError(f"{what}: the column holds {arr.dtype} timestamps; drop unit={unit!r} (it is "
                              "for integer columns)")
        return arr.astype("datetime64[ns]").view(np.int64)
    if arr.dtype.kind in "iu":
        if unit is None:
            raise SchemaError(f"{what}: the column holds integers ({arr.dtype}); say what they count with "
                              f"unit= one of {', '.join(UNITS)}")
        return arr.astype(np.int64) * UNITS[unit]
    raise SchemaError(f"{what}: the column has dtype {arr.dtype}; event times must be datetime64 or integers "
                      f"with unit= one of {', '.join(UNITS)}")


def nulls(col: pd.Series) -> np.ndarray | None:
    """Rows whose event time is null (None when there are none)."""
    null = col.isna().to_numpy()
    return null if null.any() else None


def from_ns(ns: np.ndarray, like) -> np.ndarray:
    """Nanoseconds back in the column's own type: ``like`` is a numpy dtype (``datetime64``
    of its precision), or a unit string of an integer column."""
    ns = np.asarray(ns, np.int64)
    if isinstance(like, str):
        return ns // UNITS[like]
    return ns.view("datetime64[ns]").astype(like)


def time_type(col: pd.Series | np.ndarray, unit: str | None):
    """What :func:`from_ns` takes to give times back as the column holds them."""
    dtype = col.dtype if isinstance(col, (pd.Series, np.ndarray)) else np.asarray(col).dtype
    if unit is not None:
        return unit
    if getattr(dtype, "kind", None) == "M" and isinstance(dtype, np.dtype):
        return dtype
    return np.dtype("datetime64[ns]")    # tz-aware or object timestamps: as nanoseconds


def age(seconds) -> str:
    """A duration for people to read in a table: ``"12.3s"``, ``"4.5min"``, ``"2.0h"``;
    ``"-"`` for None or NaN (the job service's listings)."""
    if seconds is None or seconds != seconds:
        return "-"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"
