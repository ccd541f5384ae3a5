"""Map-side combining: a keyed exchange into an ``aggregate`` sends each batch summed per
key (Spark's partial aggregation before a shuffle, a combiner in MapReduce) rather than
row by row; into a tumbling or hopping window ``aggregate``, summed per key and pane
(:class:`PaneCombine`, Flink's local-global window aggregation).

The router reduces a batch to one *combined row* per distinct key: the key, how many
records it stands for (:data:`RECORDS`), and per input column the partial tables of the
aggregate's store (:data:`PARTIAL` names them: the count of non-null values, and the sum,
minimum and maximum where the operator needs them). The owner merges the rows into its
state as it merges a helper's partial aggregate (``AggregateState.combine``). Combined rows
are ordinary rows to everything between (routing by key group, holds and deferrals while a
key group moves, checkpoint barriers), so nothing there changes; what counts records reads
:func:`records_of`.

The router combines only when it helps and nothing else depends on rows: every input
column numeric, no split keys in its table, no lazy epoch under way, no emulated cost, and
at most half as many distinct keys as rows. Into a window, no combined row may be late (the
late stream and the dead letters hold records): see :meth:`Combiner.combine`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._state._index import factorize_sized, first_rows
from .._time import nulls, to_ns
from ..exceptions import SchemaError
from .._state._partials import PARTIAL, RECORDS

WORTH = 0.5                             # combine when distinct keys / rows is at most this
PANES = 16                              # into a window: a batch over more panes goes as rows


def combined(frame: pd.DataFrame, keys: np.ndarray, key_name: str, hows: tuple) -> pd.DataFrame | None:
    """``frame`` as one row per distinct key (``keys``: its key column), with the partial
    tables of ``hows`` (``(column, tables)`` pairs, tables among ``cnt``, ``sum``, ``min``,
    ``max``); None where combining does not apply (a column missing or not numeric) or
    does not pay. A router keeps a :class:`Combiner` instead, which learns from its batches.

    >>> f = pd.DataFrame({"k": [1, 2, 1, 1], "v": [1.0, 5.0, np.nan, 3.0]})
    >>> out = combined(f, f["k"].to_numpy(), "k", (("v", ("cnt", "sum", "max")),))
    >>> out.columns.tolist()
    ['k', '__streamlb_records__', '__streamlb_cnt__v', '__streamlb_sum__v', '__streamlb_max__v']
    >>> out.to_numpy().tolist()
    [[1.0, 3.0, 2.0, 4.0, 3.0], [2.0, 1.0, 1.0, 5.0, 5.0]]
    """
    return Combiner(key_name, hows).combine(frame, keys)


class Combiner:
    """The map-side combiner of one router: :meth:`combine` reduces a batch to one row per
    distinct key. It remembers what its batches were like:

    - integer keys in a range no wider than the batch (ids, codes) are counted by their
      offset in the range, with no hashing;
    - other keys are factorised in a hash table sized by the distinct keys of the batch
      before (a table sized by the rows costs 4-6x as much on a batch of 524,288 rows);
    - after a batch where combining did not pay, the next :data:`BACKOFF` batches go row
      by row unseen, and each further miss doubles the wait (up to 64 batches), as Spark
      stops partial aggregation that does not reduce its rows.
    """

    BACKOFF = 4

    def __init__(self, key_name: str, hows: tuple, panes: PaneCombine | None = None) -> None:
        self.key_name, self.hows, self.panes = key_name, hows, panes
        self._distinct = 0          # distinct keys of the last hashed batch
        self._skip = 0              # batches still to pass row by row
        self._wait = self.BACKOFF   # the next miss's wait

    @classmethod
    def of(cls, key_name: str, spec) -> Combiner | None:
        """The combiner ``ExchangeSpec.combine`` asks for: partial tables (into an
        aggregate), a :class:`PaneCombine` (into a window), or None."""
        if spec is None:
            return None
        return cls(key_name, spec.hows, spec) if isinstance(spec, PaneCombine) else cls(key_name, spec)

    def combine(self, frame: pd.DataFrame, keys: np.ndarray, floor: int | None = None) -> pd.DataFrame | None:
        """``frame`` combined per key (and pane, into a window), or None (see
        :func:`combined`). ``floor``: into a window, the watermark this router sent last
        (None: none, or not one the owners' can be trusted to stay within); only a batch
        with every event time at or past it is combined, so no combined row is late."""
        if self._skip:
            self._skip -= 1
            return None
        cols_in = {}
        for c, _ in self.hows:
            if c not in frame.columns:
                return None         # the owner names the missing column
            arr = frame[c].to_numpy()
            if arr.dtype.kind not in "iufb":
                return None         # the owner cleans text that should be numbers
            cols_in[c] = arr
        panes = None
        if self.panes is not None and (panes := self.panes.of(frame, floor)) is None:
            return None
        dense = _dense(keys)
        pick = None                 # codes that occur, where not all do
        if dense is None:
            codes, uniq = factorize_sized(keys, self._distinct)
            self._distinct = n = len(uniq)
        else:
            codes, n, lo = dense
        k, rows = 1, None           # panes in the batch, a row of each (its event time)
        if panes is not None:
            if (by := _by_pane(codes, n, panes, self.panes.pane)) is None:
                return None
            codes, n, k, rows = by
        records = np.bincount(codes, minlength=n)
        if dense is not None or panes is not None:
            pick = np.flatnonzero(records)
            if len(pick) > WORTH * len(keys):
                return self._missed()
            at = pick // k              # the key code of each (key, pane) code
            uniq = at.astype(keys.dtype) + lo if dense is not None else uniq[at]
        elif len(uniq) > WORTH * len(keys):
            return self._missed()
        self._wait = self.BACKOFF
        out = {self.key_name: uniq, RECORDS: records if pick is None else records[pick]}
        if rows is not None:
            out[self.panes.column] = _take(frame[self.panes.column], rows[pick % k])
        for c, tables in self.hows:
            arr = cols_in[c]
            cc, counted = codes, records         # counted: non-null values per code
            if arr.dtype.kind == "f":
                valid = ~np.isnan(arr)
                if not valid.all():
                    cc, arr, counted = codes[valid], arr[valid], None
            else:
                arr = arr.astype(np.int64, copy=False)
            for t in tables:
                got = counted if t == "cnt" and counted is not None else _reduce(t, cc, arr, n)
                out[PARTIAL.format(t, c)] = got if pick is None else got[pick]
        return pd.DataFrame(out, copy=False)

    def _missed(self) -> None:
        """Combining did not pay: the next batches go row by row unseen."""
        self._skip, self._wait = self._wait, min(2 * self._wait, 64)
        return None


@dataclass(frozen=True)
class PaneCombine:
    """``ExchangeSpec.combine`` into a tumbling or hopping window ``aggregate``: its partial
    tables (``hows``, as for an aggregate), its event-time column and unit, and its pane
    (``gcd(size, slide)``, ns). Rows are combined per key and pane; a combined row carries
    the event time of one of its rows, which falls in the same pane and so in the same
    windows."""

    hows: tuple
    column: str
    unit: str | None
    pane: int

    def of(self, frame: pd.DataFrame, floor: int | None) -> np.ndarray | None:
        """Each row's pane (its start, ns), or None where the batch is not combined: no
        floor, an event time missing, null, of a type the owner refuses, or behind
        ``floor``."""
        col = frame.get(self.column)
        if floor is None or col is None or nulls(col) is not None:
            return None
        try:
            times = to_ns(col, self.unit, "")
        except SchemaError:
            return None             # the owner names the column and the valid types
        if not len(times) or times.min() < floor:
            return None
        return (times // self.pane) * self.pane


def _by_pane(codes: np.ndarray, n: int, panes: np.ndarray, pane: int) -> tuple:
    """Key codes (``0..n-1``) made codes of (key, pane), ``key * k + pane``: ``(codes, how
    many, k, a row of each pane)``; any row of a pane will do for its time."""
    lo = panes.min()
    at = ((panes - lo) // pane).astype(np.intp, copy=False)
    k = int(at.max()) + 1
    if k > PANES:
        return None
    if k == 1:
        return codes, n, 1, np.zeros(1, np.intp)
    return codes * k + at, n * k, k, first_rows(at, k)     # a row of each pane


def _take(col: pd.Series, rows: np.ndarray):
    """``col``'s values at ``rows``, in its type (numpy where it is numpy)."""
    if isinstance(col.dtype, np.dtype):
        return col.to_numpy()[rows]
    return col.take(rows).reset_index(drop=True)


def _dense(keys: np.ndarray) -> tuple | None:
    """``(codes, span, least)``: integer ``keys`` as their offsets from the least, where the
    range they span is no wider than the batch; None otherwise."""
    if keys.dtype.kind not in "iu" or not len(keys):
        return None
    lo, hi = keys.min(), keys.max()
    span = int(hi) - int(lo) + 1
    if span > max(len(keys), 1024):
        return None
    return (keys - lo).astype(np.intp, copy=False), span, lo


def _reduce(table: str, codes: np.ndarray, arr: np.ndarray, n: int) -> np.ndarray:
    """Table ``table`` of ``arr`` per code (0..n-1), in the owner's dtypes (int64 counts;
    int64 or float64 values; an empty minimum or maximum is the type's identity)."""
    if table == "cnt":
        return np.bincount(codes, minlength=n)
    if table == "sum" and arr.dtype.kind == "f":
        return np.bincount(codes, weights=arr, minlength=n)
    if table == "sum":
        out = np.zeros(n, np.int64)
        np.add.at(out, codes, arr)
        return out
    big = np.inf if arr.dtype.kind == "f" else np.iinfo(np.int64).max
    out = np.full(n, big if table == "min" else -big, arr.dtype)
    (np.minimum if table == "min" else np.maximum).at(out, codes, arr)
    return out


def tables_for(spec: dict) -> tuple:
    """The partial tables an aggregate's ``spec`` needs per input column, as the
    ``ExchangeSpec.combine`` of its exchange: ``((column, tables), ...)``."""
    hows: dict[str, set] = {}
    for c, how in spec.values():
        hows.setdefault(c, set()).add(how)
    out = []
    for c in sorted(hows):
        h = hows[c]
        t = ["cnt"]
        if h & {"sum", "mean"}:
            t.append("sum")
        t += [x for x in ("min", "max") if x in h]
        out.append((c, tuple(t)))
    return tuple(out)
