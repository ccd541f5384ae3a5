"""Datasets prepared with a real PySpark session, checked with numpy/pandas."""
import json
import os

import numpy as np
import pandas as pd
import pytest

from streamlb import datasets
from streamlb.datasets import _zipf

pytestmark = pytest.mark.spark


def test_zipf_layout_manifest_and_order(zipf_path, zipf_frame):
    man = datasets.read_manifest(zipf_path)
    assert man["rows"] == 300_000 == len(zipf_frame)
    assert len(man["files"]) == 4
    spans = []
    for f in man["files"]:
        part = pd.read_parquet(os.path.join(zipf_path, f["path"]))
        assert len(part) == f["rows"]
        p = int(f["path"].split("part=")[1].split(os.sep)[0])
        assert (part.key % 4 == p).all()                      # a keyed producer's partition
        assert part.event_time.is_monotonic_increasing        # ordered by event time
        spans.append((part.event_time.min(), part.event_time.max()))
        assert list(part.dtypes.astype(str)) == ["int64", "float64", "datetime64[us]"]
    starts, ends = zip(*spans)
    assert max(starts) - min(starts) < pd.Timedelta("1s") and max(ends) - min(ends) < pd.Timedelta("1s")


def test_zipf_keys_follow_the_distribution_and_drift(zipf_frame):
    df = zipf_frame.sort_values("event_time")
    assert df.key.between(0, 19_999).all()
    assert df.value.between(0, 999).all() and (df.value == df.value.round()).all()
    first = df.iloc[:100_000].key.value_counts()
    second = df.iloc[100_000:200_000].key.value_counts()
    # Zipf(1.2) over 20k ranks: the hottest key carries p1 = 1 / H(20k, 1.2)
    p1 = 1 / np.sum(np.arange(1, 20_001) ** -1.2)
    assert abs(first.iloc[0] / 100_000 - p1) < 0.01
    assert first.index[0] != second.index[0]                 # the hot key moved


def test_zipf_is_deterministic_by_seed(spark, tmp_path):
    batch = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(batch)
    a = datasets.zipf(str(tmp_path / "a"), rows=5000, keys=100, skew=1.0, partitions=2, seed=3)
    assert spark.conf.get(batch) == before           # the writer's larger batches are its own
    b = datasets.zipf(str(tmp_path / "b"), rows=5000, keys=100, skew=1.0, partitions=2, seed=3)
    c = datasets.zipf(str(tmp_path / "c"), rows=5000, keys=100, skew=1.0, partitions=2, seed=4)
    read = lambda p: pd.read_parquet(p).sort_values("event_time").reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(read(tmp_path / "a"), read(tmp_path / "b"))
    assert not read(tmp_path / "a").key.equals(read(tmp_path / "c").key)
    assert a["rows"] == b["rows"] == c["rows"] == 5000
    assert json.load(open(tmp_path / "a" / "_manifest.json"))["params"]["seed"] == 3
    keys = _zipf.zipf_keys(np.arange(5000), 100, 1.0, None, 3)
    np.testing.assert_array_equal(np.sort(keys), np.sort(read(tmp_path / "a").key.to_numpy()))


def test_nexmark_event_mix_and_hot_auctions(spark, tmp_path):
    man = datasets.nexmark(str(tmp_path / "nx"), events=50_000, partitions=3, seed=1, flat=True)
    df = pd.read_parquet(str(tmp_path / "nx"))
    assert man["rows"] == len(df) == 50_000
    mix = df.event_type.value_counts()
    assert (mix["person"], mix["auction"], mix["bid"]) == (1000, 3000, 46000)
    bids = df[df.event_type == "bid"]
    assert bids.price.notna().all() and bids.bidder.notna().all() and bids.seller.isna().all()
    # event ids from event time (one per ms); 50-event cycles hold 1 person and 3 auctions
    ids = (bids.event_time - pd.Timestamp("2026-01-01")) // pd.Timedelta("1ms")
    newest_auction = (ids // 50) * 3 + 2
    newest_person = ids // 50
    # hot auction ratio 2: half the bids (plus the uniform draws that land there) go to
    # one of the 5 newest auctions; hot bidder ratio 4: three quarters from the 10 newest people
    hot_a = (bids.auction_id > newest_auction - 5).mean()
    hot_b = (bids.bidder > newest_person - 10).mean()
    assert 0.5 <= hot_a < 0.56, hot_a
    assert 0.75 <= hot_b < 0.8, hot_b
    assert (bids.auction_id <= newest_auction).all() and (bids.bidder <= newest_person).all()
    # the same rows as the generator gives for every event id, whatever Spark's layout
    expect = datasets._nexmark_frame(np.arange(50_000), 1, 3, 2, 4, 4).drop(columns=["id", "part"])
    got = df.drop(columns="part").sort_values("event_time").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expect, check_dtype=False)


NX_COLUMNS = {
    "person": {"id": "int64", "name": "str", "email_address": "str", "credit_card": "str",
               "city": "str", "state": "str", "date_time": "datetime64[us]"},
    "auction": {"id": "int64", "item_name": "str", "description": "str", "initial_bid": "int64",
                "reserve": "int64", "date_time": "datetime64[us]", "expires": "datetime64[us]",
                "seller": "int64", "category": "int64"},
    "bid": {"auction": "int64", "bidder": "int64", "price": "int64", "channel": "str", "url": "str",
            "date_time": "datetime64[us]"},
}


@pytest.fixture(scope="module")
def nexmark_tables(spark, tmp_path_factory):
    """50k events in 3 partitions, read back per file: table -> [frame of partition i]."""
    path = str(tmp_path_factory.mktemp("data") / "nexmark")
    man = datasets.nexmark(path, events=50_000, partitions=3, seed=1)
    parts = {t: [None] * 3 for t in NX_COLUMNS}
    for t, entry in man["tables"].items():
        for f in entry["files"]:
            p = int(f["path"].split("part=")[1].split(os.sep)[0])
            parts[t][p] = pd.read_parquet(os.path.join(path, t, f["path"]))
            assert len(parts[t][p]) == f["rows"]
    return path, man, parts


def _generation_order(parts: list) -> pd.DataFrame:
    """A table's rows in generation order: row r is the (r // 3)-th of partition r % 3."""
    rows = pd.concat([df.assign(_row=np.arange(len(df)) * 3 + p) for p, df in enumerate(parts)])
    return rows.sort_values("_row").set_index("_row")


def test_nexmark_tables_layout_schema_and_mix(nexmark_tables):
    path, man, parts = nexmark_tables
    assert datasets.read_manifest(path) == man
    assert man["rows"] == 50_000 and len(man["files"]) == 9
    assert {t: e["rows"] for t, e in man["tables"].items()} == {"person": 1000, "auction": 3000, "bid": 46000}
    assert man["params"]["rate"] == 10_000 and man["params"]["disorder"] == 3.0
    for t, columns in NX_COLUMNS.items():
        assert [len(df) for df in parts[t]] == [-(-man["tables"][t]["rows"] // 3)] + [man["tables"][t]["rows"] // 3] * 2
        for df in parts[t]:
            assert dict(df.dtypes.astype(str)) == columns
    person, auction = _generation_order(parts["person"]), _generation_order(parts["auction"])
    np.testing.assert_array_equal(person.id, np.arange(1000))      # consecutive, in file order
    np.testing.assert_array_equal(auction.id, np.arange(3000))
    assert person.state.isin(["AZ", "CA", "ID", "OR", "WA", "WY"]).all() and person.city.nunique() == 10
    assert (person.name.str.split(" ").str.len() == 2).all()
    assert auction.category.between(10, 14).all() and auction.category.nunique() == 5
    assert (auction.reserve >= auction.initial_bid).all() and (auction.initial_bid > 0).all()
    assert (auction.expires > auction.date_time).all()
    # about 100 auctions open at a time: 3 auctions per 50 events at 10k events/s
    assert abs((auction.expires - auction.date_time).mean() / pd.Timedelta("1s") - 100 * 50 / 3 / 10_000) < 0.005


def test_nexmark_tables_references_and_hot_ratios(nexmark_tables):
    _, _, parts = nexmark_tables
    bid, auction = _generation_order(parts["bid"]), _generation_order(parts["auction"])
    cycle = bid.index.to_numpy() // 46
    newest = cycle * 3 + 2                                  # this cycle's three auctions come first
    assert bid.auction.isin(auction.id).all()
    assert (bid.auction <= newest).all() and (bid.auction > newest - 100).all()
    assert (bid.bidder <= cycle).all() and (bid.price > 0).all()
    # ratio 2: half the bids to the newest auction, plus the 1% of the others that land there
    assert 0.495 < (bid.auction == newest).mean() < 0.515
    assert 0.745 < (bid.bidder == cycle).mean() < 0.76      # ratio 4, plus a few uniform draws
    seller_cycle = auction.index.to_numpy() // 3
    assert (auction.seller <= seller_cycle).all()
    assert 0.72 < (auction.seller == seller_cycle).mean() < 0.78


def test_nexmark_tables_are_out_of_order_by_at_most_the_disorder(nexmark_tables):
    _, _, parts = nexmark_tables
    events = {"person": lambda r: r * 50, "auction": lambda r: r // 3 * 50 + 1 + r % 3,
              "bid": lambda r: r // 46 * 50 + 4 + r % 46}
    delays = []
    for t, event in events.items():
        rows = _generation_order(parts[t])
        due = pd.Timestamp("2026-01-01") + pd.to_timedelta(event(rows.index.to_numpy()) * 100, unit="us")
        delays.append((due - rows.date_time.to_numpy()) / pd.Timedelta("1s"))
        assert not all(df.date_time.is_monotonic_increasing for df in parts[t])  # as the log arrived
    delays = np.concatenate(delays)
    assert len(delays) == 50_000 and delays.min() >= 0 and delays.max() <= 3.0
    assert 0.095 < (delays > 0).mean() < 0.105 and delays.max() > 2.9


def test_nexmark_tables_are_deterministic_by_seed(spark, tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        datasets.nexmark(str(tmp_path / name), events=5000, partitions=2, seed=seed, rate=1000)
    for t in NX_COLUMNS:
        a, b, c = (pd.read_parquet(tmp_path / name / t) for name in "abc")
        pd.testing.assert_frame_equal(a, b)
        assert not a.date_time.equals(c.date_time)


def test_bad_arguments_name_the_parameter(tmp_path):
    with pytest.raises(ValueError, match="rows must be a positive integer, got 0"):
        datasets.zipf(str(tmp_path / "x"), rows=0, keys=10, skew=1.0, partitions=1)
    with pytest.raises(ValueError, match="skew must be >= 0"):
        datasets.zipf(str(tmp_path / "x"), rows=10, keys=10, skew=-1, partitions=1)
    with pytest.raises(ValueError, match="events must be a positive integer, got 0"):
        datasets.nexmark(str(tmp_path / "x"), events=0)
    with pytest.raises(ValueError, match="rate must be a positive number"):
        datasets.nexmark(str(tmp_path / "x"), events=10, rate=0)
    with pytest.raises(ValueError, match="in_flight_auctions must be a positive integer"):
        datasets.nexmark(str(tmp_path / "x"), events=10, in_flight_auctions=0)
    with pytest.raises(ValueError, match=r"late_fraction must be in \[0, 1\]"):
        datasets.nexmark(str(tmp_path / "x"), events=10, late_fraction=1.5)
    with pytest.raises(ValueError, match="hot_seller_ratio must be a positive integer"):
        datasets.nexmark(str(tmp_path / "x"), events=10, hot_seller_ratio=0)
