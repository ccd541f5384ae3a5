"""Map-side combining: a keyed exchange into an ``aggregate`` sends each batch summed per
key (Spark's partial aggregation before a shuffle, a combiner in MapReduce) rather than
row by row.

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
at most half as many distinct keys as rows.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

RECORDS = "__streamlb_records__"        # records a combined row stands for
PARTIAL = "__streamlb_{}__{}"           # a partial table of a column: .format(table, column)
WORTH = 0.5                             # combine when distinct keys / rows is at most this


def records_of(frame: pd.DataFrame) -> int:
    """The records ``frame`` stands for: its rows, or the sum of a combined frame's
    :data:`RECORDS`."""
    if RECORDS in frame.columns:
        return int(frame[RECORDS].to_numpy().sum())
    return len(frame)


def combined(frame: pd.DataFrame, keys: np.ndarray, key_name: str, hows: tuple) -> pd.DataFrame | None:
    """``frame`` as one row per distinct key (``keys``: its key column), with the partial
    tables of ``hows`` (``(column, tables)`` pairs, tables among ``cnt``, ``sum``, ``min``,
    ``max``); None where combining does not apply (a column missing or not numeric) or
    does not pay.

    >>> f = pd.DataFrame({"k": [1, 2, 1, 1], "v": [1.0, 5.0, np.nan, 3.0]})
    >>> out = combined(f, f["k"].to_numpy(), "k", (("v", ("cnt", "sum", "max")),))
    >>> out.columns.tolist()
    ['k', '__streamlb_records__', '__streamlb_cnt__v', '__streamlb_sum__v', '__streamlb_max__v']
    >>> out.to_numpy().tolist()
    [[1.0, 3.0, 2.0, 4.0, 3.0], [2.0, 1.0, 1.0, 5.0, 5.0]]
    """
    cols_in = {}
    for c, _ in hows:
        if c not in frame.columns:
            return None         # the owner names the missing column
        arr = frame[c].to_numpy()
        if arr.dtype.kind not in "iufb":
            return None         # the owner cleans text that should be numbers
        cols_in[c] = arr
    codes, uniq = pd.factorize(keys)
    n = len(uniq)
    if n > WORTH * len(keys):
        return None
    out = {key_name: uniq, RECORDS: np.bincount(codes, minlength=n)}
    for c, tables in hows:
        arr = cols_in[c]
        cc = codes
        if arr.dtype.kind == "f":
            valid = ~np.isnan(arr)
            if not valid.all():
                cc, arr = codes[valid], arr[valid]
        else:
            arr = arr.astype(np.int64, copy=False)
        for t in tables:
            out[PARTIAL.format(t, c)] = _reduce(t, cc, arr, n)
    return pd.DataFrame(out)


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


def blob_of(frame: pd.DataFrame, groups: np.ndarray, key_name: str, inputs: list, held: dict) -> dict:
    """Combined rows as the blob ``AggregateState.combine`` merges (``held``: the store's
    dtypes; a column seen only counted so far is held as int64)."""
    tables, dtypes = {}, {}
    for c in inputs:
        for t in ("cnt", "sum", "min", "max"):
            name = PARTIAL.format(t, c)
            if name in frame.columns:
                vals = frame[name].to_numpy()
                tables[(t, c)] = vals
                if t != "cnt":
                    dtypes[c] = np.dtype(np.float64) if vals.dtype.kind == "f" else np.dtype(np.int64)
        dtypes.setdefault(c, held.get(c, np.dtype(np.int64)))
    part = {"keys": frame[key_name].to_numpy(), "key_groups": np.asarray(groups, np.int64), "tables": tables}
    return {"dtypes": dtypes, "parts": [part] if len(frame) else []}


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
