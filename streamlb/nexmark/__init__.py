"""The NEXMark queries on streamlb's public API.

Each ``qN(person, auction, bid)`` takes the source nodes of the three tables that
:func:`streamlb.datasets.nexmark` writes (``Stream.from_parquet(path + "/person")`` and so
on), ignores those it does not use, gives the others their watermark itself (``date_time``,
4 s behind, as the Flink suite's DDL), builds the query and returns its output node, whose
rows have exactly the columns of the Flink suite's SELECT lists (snake_case, no ``extra``).
:mod:`streamlb.nexmark._truth` holds each query's semantics and its PySpark batch answer;
``docs/nexmark.md`` says how each one runs.

Q4 and Q6 are update streams: the last row per key is the result.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

__all__ = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q11", "q12", "closed_auctions", "QUERIES",
           "UPDATE_KEYS"]

DELAY = "4s"
#: The longest an auction may run and still close with its bids (the interval join's bound).
MAX_AUCTION = "1h"
_NS = pd.Timedelta("1ns")


def _timed(src, columns: list[str] | None = None, column: str = "date_time"):
    """``src`` with its watermark; with ``columns``, only those are read (``select``)."""
    src = src.with_watermark(column, delay=DELAY)
    return src.select(columns) if columns else src


_BID = ["auction", "bidder", "price", "date_time"]


def _columns(df: pd.DataFrame, names: dict, keep=None) -> pd.DataFrame:
    """The columns ``names`` ({new name: column of ``df``}) of ``df``'s rows ``keep`` (a
    boolean mask; None: all) as a new frame, built from the columns' arrays: per small
    batch, cheaper than ``loc`` and ``rename`` (each costs about a millisecond in pandas)."""
    if keep is None:        # the columns as they are (copy-on-write), under a fresh RangeIndex
        out = pd.DataFrame({new: df[old] for new, old in names.items()}, copy=False)
        out.index = pd.RangeIndex(len(out))
        return out
    keep = np.asarray(keep, bool)
    return pd.DataFrame({new: df[old].array[keep] for new, old in names.items()}, copy=False)


# -- q0-q2: stateless -------------------------------------------------------------------------
def q0(person, auction, bid):
    """Pass-through: every bid's auction, bidder, price, date_time."""
    return _timed(bid, _BID).map(lambda df: _columns(df, {c: c for c in _BID}))


def _q1(df):
    return pd.DataFrame({"auction": df.auction.to_numpy(), "bidder": df.bidder.to_numpy(),
                         "price": df.price.to_numpy(np.float64) * 0.908, "date_time": df.date_time.to_numpy()})


def q1(person, auction, bid):
    """Currency conversion: every bid with its price × 0.908."""
    return _timed(bid, _BID).map(_q1)


def q2(person, auction, bid):
    """Selection: the auction and price of bids on every 123rd auction."""
    return _timed(bid, ["auction", "price"]).map(
        lambda df: _columns(df, {"auction": "auction", "price": "price"}, df.auction.to_numpy() % 123 == 0))


# -- q3: a regular join ---------------------------------------------------------------------
def q3(person, auction, bid):
    """Local item suggestion: auctions of category 10 by sellers in OR, ID or CA."""
    a = _timed(auction, ["id", "seller", "category"]).map(
        lambda df: _columns(df, {"auction_id": "id", "seller": "seller"}, df.category.to_numpy() == 10))
    p = _timed(person, ["id", "name", "city", "state"]).map(
        lambda df: _columns(df, {c: c for c in ("id", "name", "city", "state")}, df.state.isin(["OR", "ID", "CA"])))
    j = a.key_by("seller").join(p.key_by("id"), name="q3_join")
    return j.map(lambda df: _columns(df, {"name": "name", "city": "city", "state": "state", "id": "auction_id"}))


# -- q4, q6: auctions closing with their highest bid -----------------------------------------
def _bid_in_time(joined):
    return (joined.date_time_y >= joined.date_time_x) & (joined.date_time_y <= joined.expires)


def _highest(rows, state, ctx):
    """Per auction (vectorised over the batch): the highest bid so far; an auction seen for
    the first time keeps its category, seller and expires, and closes at its ``expires``."""
    by = rows.groupby("id", sort=False)
    top = by["price"].max().astype(np.float64)
    new = ~top.index.isin(state.index)
    if new.any():
        fresh = by[["category", "seller", "expires"]].first()[new]
        ctx.put(fresh)
        ctx.timer(fresh.index, fresh["expires"])
    if "final" in state:
        top = np.fmax(top, state["final"].reindex(top.index))
    ctx.put(top.to_frame("final"))


def _close(due, state, ctx):
    ctx.forget(state.index)
    return state.reset_index()[["id", "category", "seller", "final", "expires"]]


def closed_auctions(auction, bid):
    """Each auction that had a bid within its lifetime, once the watermark passes its
    ``expires``: id, category, seller, final (its highest such bid), expires."""
    a = _timed(auction, ["id", "seller", "category", "date_time", "expires"])
    b = _timed(bid, ["auction", "price", "date_time"])
    pairs = a.key_by("id").join(b.key_by("auction"), between=("0s", MAX_AUCTION), where=_bid_in_time,
                                name="closing_join")
    return pairs.key_by("id").process(_highest, on_timer=_close, name="closing", batch=True)


def _avg(df):
    df = df.reset_index()
    return pd.DataFrame({"category": df.category.to_numpy(), "avg_price": df.total.to_numpy() / df.n.to_numpy()})


def q4(person, auction, bid):
    """Average closing price per category (an update stream)."""
    closed = closed_auctions(auction, bid)
    return closed.key_by("category").aggregate({"total": ("final", "sum"), "n": ("final", "count")},
                                               name="q4_avg").map(_avg)


def _seller_rows(rows, state, ctx):
    """Closed auctions of a seller wait until the watermark passes their ``expires``: then
    they count in (expires, id) order, whichever instance closed them."""
    arrived: dict = {}
    for s, e, i, f in zip(rows["seller"].tolist(), rows["expires"].tolist(), rows["id"].tolist(),
                          rows["final"].tolist()):
        arrived.setdefault(s, []).append((e, i, float(f)))
    sellers = list(arrived)
    before = state["waiting"].reindex(sellers).tolist() if "waiting" in state else [None] * len(sellers)
    ctx.put(pd.DataFrame({"waiting": [(b if isinstance(b, tuple) else ()) + tuple(arrived[s])
                                      for s, b in zip(sellers, before)]},
                         index=sellers))
    ctx.timer(rows["seller"], rows["expires"])


def _seller_avg(due, state, ctx):
    when = due.groupby("seller", sort=False)["time"].max()
    lasts = state["last"].tolist() if "last" in state else [None] * len(state)
    sellers, waiting, last = [], [], []
    for s, w, t, held in zip(state.index.tolist(), state["waiting"].tolist(), when.reindex(state.index).tolist(),
                             lasts):
        now = sorted(x for x in w if x[0] <= t)
        if now:
            sellers.append(s)
            waiting.append(tuple(x for x in w if x[0] > t))
            last.append(((held if isinstance(held, tuple) else ()) + tuple(x[2] for x in now))[-10:])
    if not sellers:
        return None
    ctx.put(pd.DataFrame({"waiting": waiting, "last": last}, index=sellers))
    return pd.DataFrame({"seller": sellers, "avg_price": [float(np.mean(x)) for x in last]})


def q6(person, auction, bid):
    """Average selling price of each seller's last 10 closed auctions (an update stream)."""
    closed = closed_auctions(auction, bid)
    return closed.key_by("seller").process(_seller_rows, on_timer=_seller_avg, name="q6_avg", batch=True)


# -- q5, q7: the top of each window -----------------------------------------------------------
def _window_key(df):
    return df.window_end.to_numpy().astype("datetime64[ns]").view(np.int64)


def _unwindowed(df):
    return df.drop(columns=["window"])


def _gather(key, rows, ctx):
    """Rows of one window (keyed by its end): kept until the watermark reaches the end."""
    st = ctx.state
    if st is None:
        st = []
        ctx.timer(rows.window_end.iloc[0] - _NS)
    st.append(rows)
    ctx.state = st


def _top_num(key, when, ctx):
    rows, ctx.state = pd.concat(ctx.state, ignore_index=True), None
    top = rows[rows.num == rows.num.max()]
    return pd.DataFrame({"auction": top.auction.to_numpy(), "num": top.num.to_numpy()})


def q5(person, auction, bid):
    """Hot items: per 10 s window sliding by 2 s, the auctions with the most bids."""
    counts = _timed(bid, ["auction", "date_time"]).key_by("auction").window(size="10s", slide="2s").aggregate(
        {"num": ("auction", "count")}, name="q5_count")
    top = counts.key_by(_window_key, name="window").process(_gather, on_timer=_top_num, name="q5_top")
    return top.map(_unwindowed)


def _in_window(df):
    """Each bid with the end of its tumbling 10 s window."""
    end = df.date_time.dt.floor("10s") + pd.Timedelta("10s")
    return df[["auction", "price", "bidder", "date_time"]].assign(window_end=end)


def _top_price(key, when, ctx):
    rows, ctx.state = pd.concat(ctx.state, ignore_index=True), None
    top = rows[rows.price == rows.price.max()]
    return pd.DataFrame({"auction": top.auction.to_numpy(), "price": top.price.to_numpy(),
                         "bidder": top.bidder.to_numpy(), "date_time": top.date_time.to_numpy()})


def q7(person, auction, bid):
    """Highest bid: per 10 s tumbling window, the bids at the window's highest price (a
    window's bids gathered under its end, taken once the watermark reaches it)."""
    b = _timed(bid, _BID).map(_in_window)
    top = b.key_by(_window_key, name="window").process(_gather, on_timer=_top_price, name="q7_top")
    return top.map(_unwindowed)


# -- q8: a window join ------------------------------------------------------------------------
def _new_users(df):
    out = df[["id", "name", "window_start"]].drop_duplicates().rename(columns={"window_start": "starttime"})
    return out.reset_index(drop=True)


def q8(person, auction, bid):
    """Monitor new users: people who opened auctions in the same 10 s window they joined."""
    p = _timed(person, ["id", "name", "date_time"])
    a = _timed(auction, ["seller", "date_time"])
    return p.key_by("id").window(size="10s").join(a.key_by("seller"), name="q8_join").map(_new_users)


# -- q11, q12: per bidder -----------------------------------------------------------------------
def _per_bidder(df):
    return pd.DataFrame({"bidder": df.bidder.to_numpy(), "bid_count": df.bid_count.to_numpy(),
                         "starttime": df.window_start.to_numpy(), "endtime": df.window_end.to_numpy()})


def q11(person, auction, bid):
    """User sessions: bids per bidder session (gap 10 s)."""
    return _timed(bid, ["bidder", "date_time"]).key_by("bidder").window(gap="10s").aggregate(
        {"bid_count": ("bidder", "count")}, name="q11_sessions").map(_per_bidder)


def _now(df):
    stamp = np.full(len(df), time.time_ns(), np.int64).view("datetime64[ns]")
    return pd.DataFrame({"bidder": df["bidder"].to_numpy(), "processing_time": stamp}, copy=False)


def q12(person, auction, bid):
    """Bids per bidder per 10 s processing-time window (processing time taken as the bid
    leaves its source)."""
    pt = bid.select(["bidder"]).map(_now).with_watermark("processing_time", delay="0s")
    return pt.key_by("bidder").window(size="10s").aggregate(
        {"bid_count": ("bidder", "count")}, name="q12_windows").map(_per_bidder)


#: query name -> its function
QUERIES = {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6, "q7": q7, "q8": q8,
           "q11": q11, "q12": q12}
#: the key of each update-stream query: its last row per key is the result
UPDATE_KEYS = {"q4": "category", "q6": "seller"}
