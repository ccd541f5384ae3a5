"""NEXMark's generator for :func:`streamlb.datasets.nexmark`: the three tables (person,
auction, bid) and the older flat table of every event, generated in Spark with
``mapInPandas`` from per-block random streams (the same seed, the same files)."""
from __future__ import annotations

import dataclasses
import os
import shutil

import numpy as np
import pandas as pd

from ._parquet_out import _BASE_TIME, _STEP_US, _manifest, _write, _write_parts
from ._zipf import _blocks, _masked


def nexmark_frame(ids: np.ndarray, seed: int, partitions: int, ha: int, hb: int, hs: int) -> pd.DataFrame:
    """The NEXMark events of event ids ``ids`` (see :func:`nexmark`; ``ha``, ``hb``, ``hs``:
    its hot auction, bidder and seller ratios)."""
    r = _blocks(ids, seed, 3, lambda g, n: {
        "u1": g.random(n), "u2": g.random(n), "u3": g.random(n), "u4": g.random(n),
        "price": np.round(np.exp(g.normal(5.0, 1.0, n)), 2), "cat": g.integers(0, 10, n),
    })
    pos = ids % 50
    epoch = ids // 50
    persons = epoch + 1                      # persons seen so far (at least one)
    auctions = epoch * 3 + np.clip(pos, 0, 3)
    auctions = np.maximum(auctions, 1)
    kind = np.where(pos == 0, "person", np.where(pos <= 3, "auction", "bid"))
    hot_person = lambda u, ratio, hot: np.where(  # noqa: E731
        u < 1 - 1 / ratio, np.maximum(persons - 1 - (hot % 10), 0), (r["u4"] * persons).astype(np.int64))
    seller = hot_person(r["u1"], hs, (r["u2"] * 10).astype(np.int64))
    bidder = hot_person(r["u2"], hb, (r["u3"] * 10).astype(np.int64))
    hot_auction = np.maximum(auctions - 1 - (r["u4"] * 5).astype(np.int64), 0)
    auction = np.where(r["u3"] < 1 - 1 / ha, hot_auction, (r["u1"] * auctions).astype(np.int64))
    is_p, is_a, is_b = kind == "person", kind == "auction", kind == "bid"
    own_auction = epoch * 3 + pos - 1
    return pd.DataFrame({
        "id": ids,
        "event_type": kind,
        "person_id": _masked(np.where(is_p, epoch, 0), is_p),
        "auction_id": _masked(np.where(is_a, own_auction, auction), is_a | is_b),
        "seller": _masked(seller, is_a),
        "bidder": _masked(bidder, is_b),
        "price": np.where(is_b, r["price"], np.nan),
        "category": _masked(r["cat"], is_a),
        "event_time": _BASE_TIME + pd.to_timedelta(ids * _STEP_US, unit="us"),
        "part": ids % partitions,
    })


# NEXMark's fixed vocabularies; few states and categories so the queries find matches
_NX_STATES = np.array(["AZ", "CA", "ID", "OR", "WA", "WY"], dtype=object)
_NX_CITIES = np.array(["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
                       "Redmond", "Seattle", "Kent", "Cheyenne"], dtype=object)
_NX_FIRST = np.array(["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
                      "Deiter", "Walter"], dtype=object)
_NX_LAST = np.array(["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
                     "Noris"], dtype=object)
_NX_ADJECTIVES = np.array(["old", "rare", "signed", "vintage", "boxed", "mint", "used", "large"],
                          dtype=object)
_NX_NOUNS = np.array(["lamp", "clock", "guitar", "camera", "vase", "bicycle", "poster", "watch",
                      "chair", "record"], dtype=object)
_NX_CHANNELS = np.array(["Google", "Facebook", "Baidu", "Apple"], dtype=object)
_NX_CYCLE, _NX_AUCTIONS, _NX_BIDS = 50, 3, 46     # events per cycle: 1 person, then 3 auctions, 46 bids
_NX_CATEGORY0, _NX_CATEGORIES = 10, 5
_NX_SCHEMAS = {
    "person": "id long, name string, email_address string, credit_card string, city string, "
              "state string, date_time timestamp_ntz",
    "auction": "id long, item_name string, description string, initial_bid long, reserve long, "
               "date_time timestamp_ntz, expires timestamp_ntz, seller long, category long",
    "bid": "auction long, bidder long, price long, channel string, url string, date_time timestamp_ntz",
}


@dataclasses.dataclass(frozen=True)
class _Nexmark:
    """The generator's settings, validated (see :func:`nexmark`)."""

    seed: int
    partitions: int
    hot_auction_ratio: int
    hot_bidder_ratio: int
    hot_seller_ratio: int
    rate: float
    in_flight_auctions: int
    disorder_us: int
    late_fraction: float

    def rows(self, events: int) -> dict[str, int]:
        """Rows of each table among the first ``events`` events."""
        cycles, rest = divmod(events, _NX_CYCLE)
        return {"person": cycles + (rest > 0),
                "auction": cycles * _NX_AUCTIONS + min(max(rest - 1, 0), _NX_AUCTIONS),
                "bid": cycles * _NX_BIDS + max(rest - 1 - _NX_AUCTIONS, 0)}

    def times(self, events: np.ndarray) -> np.ndarray:
        """Microseconds after the base time of each event: ``event / rate`` seconds, minus a
        delay in (0, disorder] for the ``late_fraction`` of events that arrive late."""
        us = np.floor(events * 1e6 / self.rate).astype(np.int64)   # exact when a whole µs
        if self.disorder_us:
            frac = self.late_fraction
            lag = _blocks(events, self.seed, 20, lambda g, n: {
                "late": g.random(n) < frac, "d": g.integers(1, self.disorder_us + 1, n)})
            us = us - np.where(lag["late"], lag["d"], 0)
        return us

    def frame(self, table: str, rows: np.ndarray) -> pd.DataFrame:
        """Rows ``rows`` (numbered from 0 in generation order) of ``table``, with the helper
        columns ``_row`` and ``part``."""
        df = getattr(self, table)(rows)
        df.insert(0, "_row", rows)
        df["part"] = rows % self.partitions
        return df

    def person(self, ids: np.ndarray) -> pd.DataFrame:
        events = ids * _NX_CYCLE
        r = _blocks(events, self.seed, 21, lambda g, n: {
            "first": g.integers(0, len(_NX_FIRST), n), "last": g.integers(0, len(_NX_LAST), n),
            "city": g.integers(0, len(_NX_CITIES), n), "state": g.integers(0, len(_NX_STATES), n),
            "card": g.integers(0, 10_000, (n, 4))})
        first, last = pd.Series(_NX_FIRST[r["first"]]), pd.Series(_NX_LAST[r["last"]])
        groups = [pd.Series(r["card"][:, j]).astype(str).str.zfill(4) for j in range(4)]
        return pd.DataFrame({
            "id": ids,
            "name": first + " " + last,
            "email_address": (first + "." + last + pd.Series(ids).astype(str)).str.lower() + "@example.com",
            "credit_card": groups[0] + " " + groups[1] + " " + groups[2] + " " + groups[3],
            "city": _NX_CITIES[r["city"]],
            "state": _NX_STATES[r["state"]],
            "date_time": _at(self.times(events)),
        })

    def auction(self, ids: np.ndarray) -> pd.DataFrame:
        cycle = ids // _NX_AUCTIONS
        events = cycle * _NX_CYCLE + 1 + ids % _NX_AUCTIONS
        r = _blocks(events, self.seed, 22, lambda g, n: {
            "hot": g.random(n), "u": g.random(n), "cat": g.integers(0, _NX_CATEGORIES, n),
            "length": g.uniform(0.5, 1.5, n), "initial": g.lognormal(6.0, 1.0, n),
            "extra": g.lognormal(5.0, 1.0, n), "adj": g.integers(0, len(_NX_ADJECTIVES), n),
            "noun": g.integers(0, len(_NX_NOUNS), n)})
        # the hot seller is the newest person (this cycle's), else any person so far
        seller = np.where(r["hot"] < 1 - 1 / self.hot_seller_ratio, cycle,
                          (r["u"] * (cycle + 1)).astype(np.int64))
        # about in_flight_auctions auctions open at once: the mean length spans that many auctions
        mean_us = self.in_flight_auctions * _NX_CYCLE / _NX_AUCTIONS / self.rate * 1e6
        start = self.times(events)
        initial = np.ceil(r["initial"]).astype(np.int64)
        item = pd.Series(_NX_ADJECTIVES[r["adj"]]) + " " + pd.Series(_NX_NOUNS[r["noun"]])
        return pd.DataFrame({
            "id": ids,
            "item_name": item,
            "description": "lot " + pd.Series(ids).astype(str) + ": a " + item,
            "initial_bid": initial,
            "reserve": initial + np.floor(r["extra"]).astype(np.int64),
            "date_time": _at(start),
            "expires": _at(start + np.maximum((r["length"] * mean_us).astype(np.int64), 1)),
            "seller": seller,
            "category": _NX_CATEGORY0 + r["cat"],
        })

    def bid(self, rows: np.ndarray) -> pd.DataFrame:
        cycle = rows // _NX_BIDS
        events = cycle * _NX_CYCLE + 1 + _NX_AUCTIONS + rows % _NX_BIDS
        r = _blocks(events, self.seed, 23, lambda g, n: {
            "hot_a": g.random(n), "u_a": g.random(n), "hot_b": g.random(n), "u_b": g.random(n),
            "price": g.lognormal(6.0, 1.0, n), "channel": g.integers(0, len(_NX_CHANNELS), n),
            "query": g.integers(0, 1_000_000, n)})
        newest = cycle * _NX_AUCTIONS + _NX_AUCTIONS - 1      # this cycle's auctions come first
        recent = np.minimum(self.in_flight_auctions, newest + 1)
        auction = np.where(r["hot_a"] < 1 - 1 / self.hot_auction_ratio, newest,
                           newest - (r["u_a"] * recent).astype(np.int64))
        bidder = np.where(r["hot_b"] < 1 - 1 / self.hot_bidder_ratio, cycle,
                          (r["u_b"] * (cycle + 1)).astype(np.int64))
        channel = _NX_CHANNELS[r["channel"]]
        return pd.DataFrame({
            "auction": auction,
            "bidder": bidder,
            "price": np.ceil(r["price"]).astype(np.int64),
            "channel": channel,
            "url": ("https://www.nexmark.com/" + pd.Series(channel).str.lower() + "/item.htm?query="
                    + pd.Series(r["query"]).astype(str)),
            "date_time": _at(self.times(events)),
        })


def _at(us: np.ndarray) -> pd.DatetimeIndex:
    return _BASE_TIME + pd.to_timedelta(us, unit="us")


def write_tables(spark, path, events: int, partitions: int, seed: int, ha: int, hb: int, hs: int, rate: float,
                 in_flight_auctions: int, disorder: float, late_fraction: float, progress: bool) -> dict:
    """:func:`streamlb.datasets.nexmark`'s three tables (arguments checked there)."""
    spec = _Nexmark(seed, partitions, ha, hb, hs, rate, in_flight_auctions, int(round(disorder * 1e6)), late_fraction)
    out = os.path.abspath(str(path))
    if os.path.isdir(out):
        shutil.rmtree(out)
    n_tasks = max(2, min(spec.partitions, 16), int(events) // 2_000_000)
    for table, rows in spec.rows(int(events)).items():
        def gen(batches, table=table):
            for pdf in batches:
                yield spec.frame(table, pdf["id"].to_numpy())

        schema = f"_row long, {_NX_SCHEMAS[table]}, part long"
        sdf = spark.range(0, rows, 1, n_tasks).mapInPandas(gen, schema)
        _write_parts(sdf, os.path.join(out, table), spec.partitions, "part", ("_row",), "_row", progress)
    params = {"kind": "nexmark", "events": int(events), "partitions": spec.partitions, "seed": spec.seed,
              "hot_auction_ratio": spec.hot_auction_ratio, "hot_bidder_ratio": spec.hot_bidder_ratio,
              "hot_seller_ratio": spec.hot_seller_ratio, "rate": spec.rate,
              "in_flight_auctions": spec.in_flight_auctions, "disorder": float(disorder),
              "late_fraction": spec.late_fraction}
    return _manifest(out, params, tables=tuple(_NX_SCHEMAS))


def write_flat(spark, path, events: int, partitions: int, seed: int, ha: int, hb: int, hs: int,
               progress: bool) -> dict:
    """:func:`streamlb.datasets.nexmark` with ``flat=True``: the single table of every event."""

    def gen(batches):
        for pdf in batches:
            yield nexmark_frame(pdf["id"].to_numpy(), seed, partitions, ha, hb, hs)

    schema = ("id long, event_type string, person_id long, auction_id long, seller long, "
              "bidder long, price double, category long, event_time timestamp_ntz, part long")
    n_tasks = max(2, min(partitions, 16), events // 2_000_000)
    sdf = spark.range(0, events, 1, n_tasks).mapInPandas(gen, schema)
    params = {"kind": "nexmark", "events": events, "partitions": partitions, "seed": seed,
              "hot_auction_ratio": ha, "hot_bidder_ratio": hb, "hot_seller_ratio": hs}
    return _write(sdf, path, partitions, "part", params, progress)
