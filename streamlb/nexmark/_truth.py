"""The exact results of the NEXMark queries, computed in batch with PySpark SQL.

A stream job's output is checked against these: each query reads the three tables that
:func:`streamlb.datasets.nexmark` writes (``path/person``, ``path/auction``, ``path/bid``)
as a whole and answers it once, with no notion of arrival order, watermarks or lateness.
Windows are aligned to the Unix epoch: the tumbling 10 s windows are
``[k * 10 s, (k + 1) * 10 s)``. Each query's semantics is its function's docstring.

This module imports PySpark (the ``spark`` extra); the runtime never imports it.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import pandas as pd

__all__ = ["truth", "queries"]

_TABLES = ("person", "auction", "bid")

# Auctions with their final price: the highest bid placed within the auction's lifetime.
_CLOSED = """
WITH closed AS (
    SELECT a.id, a.seller, a.category, a.expires, max(b.price) AS final
    FROM {auction} a JOIN {bid} b
      ON b.auction = a.id AND b.date_time >= a.date_time AND b.date_time <= a.expires
    GROUP BY a.id, a.seller, a.category, a.expires
)
"""


def _q0(sql):
    """q0, pass-through: every bid's auction, bidder, price, date_time."""
    return sql("SELECT auction, bidder, price, date_time FROM {bid}")


def _q1(sql):
    """q1, currency conversion: every bid's auction, bidder, price (``price * 0.908`` as a
    double) and date_time."""
    return sql("SELECT auction, bidder, CAST(price AS DOUBLE) * 0.908D AS price, date_time FROM {bid}")


def _q2(sql):
    """q2, selection: the auction and price of the bids with ``auction % 123 == 0``."""
    return sql("SELECT auction, price FROM {bid} WHERE auction % 123 = 0")


def _q3(sql):
    """q3, local item suggestion: each auction A of category 10 whose seller P lives in OR, ID
    or CA (``A.seller = P.id``): P's name, city, state and A's id."""
    return sql("""
        SELECT p.name, p.city, p.state, a.id
        FROM {auction} a JOIN {person} p ON a.seller = p.id
        WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')
    """)


def _q4(sql):
    """q4, average price per category: an auction A's final price is the highest price of
    the bids B on it with ``A.date_time <= B.date_time <= A.expires`` (an auction with no
    such bid has none and is left out); per category: category, avg_price (the mean of
    the final prices, a double)."""
    return sql(_CLOSED + "SELECT category, avg(final) AS avg_price FROM closed GROUP BY category")


def _q5(sql):
    """q5, hot items: hopping windows of 10 s every 2 s over bid.date_time (a bid at t is in
    every window ``[s, s + 10 s)`` with s a multiple of 2 s and ``s <= t``); per window and
    auction, num = its bids; per window, the auctions whose num is the window's largest:
    auction, num (a row per window and auction kept; the window is not a column)."""
    return sql("""
        WITH counts AS (
            SELECT window(date_time, '10 seconds', '2 seconds').start AS start, auction,
                   count(*) AS num
            FROM {bid} GROUP BY 1, 2
        )
        SELECT auction, num
        FROM (SELECT auction, num, max(num) OVER (PARTITION BY start) AS top FROM counts)
        WHERE num = top
    """)


def _q6(sql):
    """q6, average selling price by seller: the closed auctions of q4 (id, seller, final
    price, expires); per seller, its last 10 (or fewer) closed auctions in the order of
    (expires, id): seller, avg_price (the mean of their final prices)."""
    return sql(_CLOSED + """
        SELECT seller, avg(final) AS avg_price
        FROM (SELECT seller, final,
                     row_number() OVER (PARTITION BY seller ORDER BY expires DESC, id DESC) AS n
              FROM closed)
        WHERE n <= 10
        GROUP BY seller
    """)


def _q7(sql):
    """q7, highest bid: tumbling 10 s windows over bid.date_time; per window, the bids whose
    price is the window's highest: auction, price, bidder, date_time."""
    return sql("""
        SELECT auction, price, bidder, date_time
        FROM (SELECT auction, price, bidder, date_time,
                     max(price) OVER (PARTITION BY start) AS top
              FROM (SELECT *, window(date_time, '10 seconds').start AS start FROM {bid}))
        WHERE price = top
    """)


def _q8(sql):
    """q8, monitor new users: tumbling 10 s windows; a person P and an auction A with
    ``P.id = A.seller`` whose date_times fall in the same window: P's id, P's name and the
    window's start as starttime, each distinct row once."""
    return sql("""
        SELECT DISTINCT p.id, p.name, p.start AS starttime
        FROM (SELECT id, name, window(date_time, '10 seconds').start AS start FROM {person}) p
        JOIN (SELECT seller, window(date_time, '10 seconds').start AS start FROM {auction}) a
          ON p.id = a.seller AND p.start = a.start
    """)


def _q11(sql):
    """q11, user sessions: a bidder's bids in date_time order; a bid opens a new session when
    it comes more than 10 s after the bidder's previous bid (bids 10 s apart or less share a
    session); per session: bidder, bid_count, starttime (its first bid's date_time) and
    endtime (its last bid's date_time + 10 s)."""
    # the running sum ranges over equal date_times together, so ties never split a session
    return sql("""
        WITH flagged AS (
            SELECT bidder, date_time,
                   CASE WHEN date_time <= lag(date_time) OVER w + INTERVAL 10 SECONDS
                        THEN 0 ELSE 1 END AS opens
            FROM {bid} WINDOW w AS (PARTITION BY bidder ORDER BY date_time)
        ), sessions AS (
            SELECT bidder, date_time,
                   sum(opens) OVER (PARTITION BY bidder ORDER BY date_time
                                    RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS session
            FROM flagged
        )
        SELECT bidder, count(*) AS bid_count, min(date_time) AS starttime,
               max(date_time) + INTERVAL 10 SECONDS AS endtime
        FROM sessions GROUP BY bidder, session
    """)


def _q12(sql):
    """q12, processing-time windows cannot be recomputed from the files, so this is their
    sum over the whole stream: per bidder, bidder and bid_count (all its bids)."""
    return sql("SELECT bidder, count(*) AS bid_count FROM {bid} GROUP BY bidder")


_QUERIES: dict[str, Callable] = {
    "q0": _q0, "q1": _q1, "q2": _q2, "q3": _q3, "q4": _q4, "q5": _q5, "q6": _q6,
    "q7": _q7, "q8": _q8, "q11": _q11, "q12": _q12,
}


def queries() -> tuple[str, ...]:
    """The names of the queries :func:`truth` answers.

    Examples
    --------
    >>> queries()[:3]
    ('q0', 'q1', 'q2')
    """
    return tuple(_QUERIES)


def truth(query: str, path: str, spark=None) -> pd.DataFrame:
    """The exact result of NEXMark query ``query`` over the tables at ``path``.

    Parameters
    ----------
    query : str
        One of :func:`queries`; the semantics of each is in this module's ``_q<n>``
        docstrings.
    path : str
        A directory written by :func:`streamlb.datasets.nexmark` (three tables, not
        ``flat=True``).
    spark : pyspark.sql.SparkSession, optional
        The session to use (default: :func:`streamlb.datasets.spark_session`).

    Returns
    -------
    pandas.DataFrame
        The query's columns in order, rows sorted by all columns, a RangeIndex;
        timestamps as ``datetime64[ns]``.

    Raises
    ------
    ValueError
        If ``query`` is not one of :func:`queries`.
    """
    if query not in _QUERIES:
        raise ValueError(f"unknown NEXMark query {query!r}; valid: {', '.join(_QUERIES)}")
    if spark is None:
        from ..datasets import spark_session

        spark = spark_session()
    tables = {t: spark.read.parquet(os.path.join(str(path), t)) for t in _TABLES}
    df = _QUERIES[query](lambda text: spark.sql(text, **tables)).toPandas()
    for c in df.columns:
        if pd.api.types.is_datetime64_any_dtype(df[c]):
            df[c] = df[c].astype("datetime64[ns]")
    return df.sort_values(list(df.columns)).reset_index(drop=True)
