"""Datasets prepared with a real PySpark session, checked with numpy/pandas."""
import json
import os

import numpy as np
import pandas as pd
import pytest

from streamlb import datasets

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
    a = datasets.zipf(str(tmp_path / "a"), rows=5000, keys=100, skew=1.0, partitions=2, seed=3)
    b = datasets.zipf(str(tmp_path / "b"), rows=5000, keys=100, skew=1.0, partitions=2, seed=3)
    c = datasets.zipf(str(tmp_path / "c"), rows=5000, keys=100, skew=1.0, partitions=2, seed=4)
    read = lambda p: pd.read_parquet(p).sort_values("event_time").reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(read(tmp_path / "a"), read(tmp_path / "b"))
    assert not read(tmp_path / "a").key.equals(read(tmp_path / "c").key)
    assert a["rows"] == b["rows"] == c["rows"] == 5000
    assert json.load(open(tmp_path / "a" / "_manifest.json"))["params"]["seed"] == 3
    keys = datasets.zipf_keys(np.arange(5000), 100, 1.0, None, 3)
    np.testing.assert_array_equal(np.sort(keys), np.sort(read(tmp_path / "a").key.to_numpy()))


def test_nexmark_event_mix_and_hot_auctions(spark, tmp_path):
    man = datasets.nexmark(str(tmp_path / "nx"), events=50_000, partitions=3, seed=1)
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


def test_bad_arguments_name_the_parameter(tmp_path):
    with pytest.raises(ValueError, match="rows must be a positive integer, got 0"):
        datasets.zipf(str(tmp_path / "x"), rows=0, keys=10, skew=1.0, partitions=1)
    with pytest.raises(ValueError, match="skew must be >= 0"):
        datasets.zipf(str(tmp_path / "x"), rows=10, keys=10, skew=-1, partitions=1)
