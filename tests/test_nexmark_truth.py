"""The PySpark ground truth of the NEXMark queries against an independent pandas computation."""
import numpy as np
import pandas as pd
import pytest

from streamlb.nexmark import _truth

pytestmark = pytest.mark.spark

S = 1_000_000_000                           # nanoseconds per second


@pytest.fixture(scope="module")
def tables(nexmark_path):
    cols = {"person": ["id", "name", "email_address", "credit_card", "city", "state", "date_time"],
            "auction": ["id", "item_name", "description", "initial_bid", "reserve", "date_time",
                        "expires", "seller", "category"],
            "bid": ["auction", "bidder", "price", "channel", "url", "date_time"]}
    out = {}
    for t, c in cols.items():
        df = pd.read_parquet(f"{nexmark_path}/{t}", columns=c)
        for ts in ("date_time", "expires"):
            if ts in df:
                df[ts] = df[ts].astype("datetime64[ns]")
        out[t] = df
    return out


def _ns(ts: pd.Series) -> np.ndarray:
    return ts.astype("datetime64[ns]").astype("int64").to_numpy()


def _start(ts: pd.Series, size_s: int) -> pd.Series:
    """The epoch-aligned tumbling window of each timestamp."""
    return pd.Series((_ns(ts) // (size_s * S)) * size_s * S, index=ts.index).astype("datetime64[ns]")


def _closed(t) -> pd.DataFrame:
    m = t["auction"].merge(t["bid"], left_on="id", right_on="auction", suffixes=("", "_bid"))
    m = m[(m.date_time_bid >= m.date_time) & (m.date_time_bid <= m.expires)]
    return m.groupby(["id", "seller", "category", "expires"], as_index=False).price.max() \
        .rename(columns={"price": "final"})


def _sessions(bid: pd.DataFrame) -> pd.DataFrame:
    b = bid.sort_values(["bidder", "date_time"])
    gap = b.groupby("bidder").date_time.diff()
    b = b.assign(session=(gap.isna() | (gap > pd.Timedelta("10s"))).groupby(b.bidder).cumsum())
    g = b.groupby(["bidder", "session"]).date_time
    return pd.DataFrame({"bid_count": g.size(), "starttime": g.min(),
                         "endtime": g.max() + pd.Timedelta("10s")}).reset_index().drop(columns="session")


def _hot_items(bid: pd.DataFrame) -> pd.DataFrame:
    # a bid is in the five 10 s windows starting at its 2 s slot and the four before
    slot = _ns(bid.date_time) // (2 * S)
    hops = pd.DataFrame({"start": np.concatenate([slot - k for k in range(5)]),
                         "auction": np.tile(bid.auction.to_numpy(), 5)})
    counts = hops.groupby(["start", "auction"]).size().rename("num").reset_index()
    return counts[counts.num == counts.groupby("start").num.transform("max")][["auction", "num"]]


def _highest_bids(bid: pd.DataFrame) -> pd.DataFrame:
    top = bid.groupby(_start(bid.date_time, 10)).price.transform("max")
    return bid[bid.price == top][["auction", "price", "bidder", "date_time"]]


def _new_users(t) -> pd.DataFrame:
    p = t["person"].assign(starttime=_start(t["person"].date_time, 10))[["id", "name", "starttime"]]
    a = t["auction"].assign(starttime=_start(t["auction"].date_time, 10))[["seller", "starttime"]]
    both = p.merge(a, left_on=["id", "starttime"], right_on=["seller", "starttime"])
    return both[["id", "name", "starttime"]].drop_duplicates()


def _last_ten(t) -> pd.DataFrame:
    c = _closed(t).sort_values(["expires", "id"])
    return c.groupby("seller").tail(10).groupby("seller", as_index=False).final.mean() \
        .rename(columns={"final": "avg_price"})


PANDAS = {
    "q0": lambda t: t["bid"][["auction", "bidder", "price", "date_time"]],
    "q1": lambda t: t["bid"].assign(price=t["bid"].price * 0.908)[["auction", "bidder", "price", "date_time"]],
    "q2": lambda t: t["bid"][t["bid"].auction % 123 == 0][["auction", "price"]],
    "q3": lambda t: t["auction"][t["auction"].category == 10][["id", "seller"]].merge(
        t["person"][t["person"].state.isin(["OR", "ID", "CA"])][["id", "name", "city", "state"]]
        .rename(columns={"id": "seller"}), on="seller")[["name", "city", "state", "id"]],
    "q4": lambda t: _closed(t).groupby("category", as_index=False).final.mean()
    .rename(columns={"final": "avg_price"}),
    "q5": lambda t: _hot_items(t["bid"]),
    "q6": _last_ten,
    "q7": lambda t: _highest_bids(t["bid"]),
    "q8": _new_users,
    "q11": lambda t: _sessions(t["bid"]),
    "q12": lambda t: t["bid"].groupby("bidder").size().rename("bid_count").reset_index(),
}


def test_every_query_has_a_pandas_twin():
    assert _truth.queries() == tuple(PANDAS)


@pytest.mark.parametrize("query", list(PANDAS))
def test_truth_equals_pandas(spark, nexmark_path, tables, query):
    got = _truth.truth(query, nexmark_path, spark)
    expect = PANDAS[query](tables)
    expect = expect.sort_values(list(expect.columns)).reset_index(drop=True)
    assert len(got) > 0 and isinstance(got.index, pd.RangeIndex)
    pd.testing.assert_frame_equal(got, expect)


def test_truth_windows_and_sessions_are_not_trivial(spark, nexmark_path):
    q7 = _truth.truth("q7", nexmark_path, spark)
    assert _start(q7.date_time, 10).nunique() >= 10          # one top bid per window, or a tie
    q11 = _truth.truth("q11", nexmark_path, spark)
    assert (q11.groupby("bidder").size() > 1).any()          # bidders with several sessions
    assert ((q11.endtime - q11.starttime) >= pd.Timedelta("10s")).all()


def test_session_gaps_and_window_edges(spark, tmp_path):
    """Bids 10 s apart share a session, 10 s + 1 µs apart do not; a window holds its start
    and not its end."""
    t0 = pd.Timestamp("2026-01-01")
    at = [t0, t0 + pd.Timedelta("10s"), t0 + pd.Timedelta("20.000001s"), t0 + pd.Timedelta("9.999999s")]
    pd.DataFrame({"auction": [1, 1, 2, 2], "bidder": [7, 7, 7, 8], "price": [5, 9, 9, 3],
                  "channel": "Apple", "url": "u", "date_time": at}).to_parquet(tmp_path / "bid")
    pd.DataFrame({"id": [7], "name": "A B", "email_address": "e", "credit_card": "c", "city": "Kent",
                  "state": "WA", "date_time": [t0]}).to_parquet(tmp_path / "person")
    pd.DataFrame({"id": [1], "item_name": "i", "description": "d", "initial_bid": [1], "reserve": [1],
                  "date_time": [t0], "expires": [t0], "seller": [7], "category": [10]}) \
        .to_parquet(tmp_path / "auction")
    q11 = _truth.truth("q11", str(tmp_path), spark)
    ten = pd.Timedelta("10s")
    expect = pd.DataFrame({"bidder": [7, 7, 8], "bid_count": [1, 2, 1],     # sorted by all columns
                           "starttime": [at[2], at[0], at[3]], "endtime": [at[2] + ten, at[1] + ten, at[3] + ten]})
    pd.testing.assert_frame_equal(q11, expect.astype({"starttime": "datetime64[ns]", "endtime": "datetime64[ns]"}))
    q7 = _truth.truth("q7", str(tmp_path), spark)
    assert q7[["auction", "price"]].values.tolist() == [[1, 5], [1, 9], [2, 9]]
    assert q7.date_time.tolist() == at[:3]


def test_unknown_query_names_the_valid_ones(nexmark_path):
    with pytest.raises(ValueError, match="unknown NEXMark query 'q9'; valid: q0, q1, q2"):
        _truth.truth("q9", nexmark_path)
