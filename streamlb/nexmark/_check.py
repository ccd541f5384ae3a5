"""A NEXMark query's output against its exact answer (:func:`streamlb.nexmark._truth.truth`).

:func:`result` makes one frame of what a query emitted (for an update stream, the last row
per key); :func:`differences` says briefly how it differs from the answer, or None when it
is the same to the last bit; :func:`same` asserts that, for tests.
"""
from __future__ import annotations

import pandas as pd

from . import UPDATE_KEYS

__all__ = ["result", "differences", "same"]

#: rows of each kind a difference shows at most
_SHOWN = 3
#: what q12 emits: per bidder and processing-time window
_Q12_COLUMNS = ["bidder", "bid_count", "starttime", "endtime"]


def result(query: str, frames: list) -> pd.DataFrame:
    """The query's output: every row of ``frames``, or for an update stream the last row
    per key.

    Examples
    --------
    >>> f = [pd.DataFrame({"category": [10, 11], "avg_price": [1.0, 2.0]}),
    ...      pd.DataFrame({"category": [10], "avg_price": [3.0]})]
    >>> result("q4", f).sort_values("category").avg_price.tolist()
    [3.0, 2.0]
    """
    got = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    key = UPDATE_KEYS.get(query)
    if key is not None and key in got.columns:
        got = got.groupby(key, sort=False).tail(1)
    return got


def _normal(query: str, got: pd.DataFrame) -> pd.DataFrame:
    """``got`` as :func:`~streamlb.nexmark._truth.truth` gives its answer: timestamps in
    nanoseconds, rows sorted by every column, a RangeIndex; q12's processing-time windows
    as their totals per bidder (all the answer can know of them)."""
    if query == "q12":
        got = got.groupby("bidder", as_index=False).bid_count.sum()
    got = got.copy()
    for c in got.columns:
        if pd.api.types.is_datetime64_any_dtype(got[c]):
            got[c] = got[c].astype("datetime64[ns]")
    return got.sort_values(list(got.columns)).reset_index(drop=True)


def differences(query: str, got: pd.DataFrame, want: pd.DataFrame) -> str | None:
    """How ``got`` (see :func:`result`) differs from ``want`` (the query's exact answer),
    in a few lines: columns, row counts, a few rows missing or extra; None if it equals it
    exactly (every value, no tolerance; dtypes may differ).

    Examples
    --------
    >>> want = pd.DataFrame({"auction": [1, 2], "price": [5, 6]})
    >>> differences("q2", want.iloc[::-1], want) is None
    True
    >>> print(differences("q2", want.iloc[:1], want))
    1 rows, expected 2: 1 missing, 0 extra
      missing: {'auction': 2, 'price': 6}
    """
    expected = _Q12_COLUMNS if query == "q12" else list(want.columns)
    if not len(got.columns):                        # nothing emitted
        got = want.iloc[:0]
    elif list(got.columns) != expected:
        return f"columns {list(got.columns)}, expected {expected}"
    else:
        got = _normal(query, got)
    try:
        pd.testing.assert_frame_equal(got, want, check_dtype=False, check_exact=True)
        return None
    except AssertionError as exc:
        failure = str(exc).strip().splitlines()
    # the same rows as multisets: each row numbered among its equals, then matched
    cols = list(want.columns)
    g = got.assign(_n=got.groupby(cols, dropna=False).cumcount())
    w = want.assign(_n=want.groupby(cols, dropna=False).cumcount())
    both = g.merge(w, on=cols + ["_n"], how="outer", indicator=True)
    missing, extra = both[both._merge == "right_only"], both[both._merge == "left_only"]
    lines = [f"{len(got):,} rows, expected {len(want):,}: {len(missing):,} missing, {len(extra):,} extra"]
    for what, rows in (("missing", missing), ("extra", extra)):
        for r in rows[cols].head(_SHOWN).to_dict("records"):
            lines.append(f"  {what}: {r}")
    if not len(missing) and not len(extra):          # the same rows, values of another type
        lines += [f"  {line}" for line in failure[:_SHOWN + 2]]
    return "\n".join(lines)


def same(query: str, got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Assert that ``got`` equals ``want`` exactly (see :func:`differences`)."""
    diff = differences(query, got, want)
    assert diff is None, f"{query} differs from PySpark: {diff}"
