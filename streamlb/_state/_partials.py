"""The row format of partial aggregates: what a router's map-side combining sends
(:mod:`streamlb._worker._combine`) and what the keyed aggregate and the window panes merge.

A *combined row* stands for the records of one key (of one pane, into a window) that a
router summed: the key, how many records it stands for (:data:`RECORDS`), and per input
column the partial tables :data:`PARTIAL` names (the count of non-null values, and the
sum, minimum and maximum where the operator needs them).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

RECORDS = "__streamlb_records__"        # records a combined row stands for
PARTIAL = "__streamlb_{}__{}"           # a partial table of a column: .format(table, column)


def whole(vals: np.ndarray) -> bool:
    """Whether float ``vals`` (NaN skipped) are all whole numbers that int64 holds: what a
    state of integers may take in without truncating (a column of integers that held
    nulls arrives as such floats).

    >>> whole(np.array([1.0, np.nan, -3.0])), whole(np.array([2.5])), whole(np.array([np.inf]))
    (True, False, False)
    """
    v = vals[~np.isnan(vals)]
    return bool(np.isfinite(v).all() and (np.round(v) == v).all() and (np.abs(v) < 2.0**63).all())


def records_of(frame: pd.DataFrame) -> int:
    """The records ``frame`` stands for: its rows, or the sum of a combined frame's
    :data:`RECORDS`."""
    if RECORDS in frame.columns:
        return int(frame[RECORDS].to_numpy().sum())
    return len(frame)


def blob_of(frame: pd.DataFrame, groups: np.ndarray, key_name: str, inputs: list, held: dict) -> dict:
    """Combined rows as the blob ``AggregateState.combine`` merges (``held``: the store's
    dtypes; a column seen only counted so far is held as int64)."""
    return blob_part(*partials_of(frame, inputs, held), frame[key_name].to_numpy(), groups)


def blob_part(tables: dict, dtypes: dict, keys: np.ndarray, groups: np.ndarray, at=slice(None)) -> dict:
    """The blob of the combined rows ``at`` of :func:`partials_of`'s ``tables``."""
    part = {"keys": keys[at], "key_groups": np.asarray(groups, np.int64)[at],
            "tables": {k: v[at] for k, v in tables.items()}}
    return {"dtypes": dtypes, "parts": [part] if len(part["keys"]) else []}


def partials_of(frame: pd.DataFrame, inputs: list, held: dict) -> tuple[dict, dict]:
    """``(tables, dtypes)``: the partial tables of combined rows per ``(table, column)``,
    and the dtype each column is held in."""
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
    return tables, dtypes
