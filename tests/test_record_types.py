"""Types of keys and of aggregated columns (issue 46, items 2-4), on real worker processes.

- A record whose key is of another type than the operator's keys is set aside alone; the
  rest of its batch is counted.
- Integer count / sum / min / max stay exact int64, whatever the number of keys, the
  instances that hold none, the map-side combining, the state backend or the window.
- A numeric aggregate over a column that is not numeric fails the job with SchemaError
  (before it starts for Parquet), while an odd bad value in a numeric column is set aside.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.exceptions import SchemaError
from streamlb.keygroups import assign_to_key_group

from kafka_broker import topic_name

HOWS = {"s": ("v", "sum"), "lo": ("v", "min"), "hi": ("v", "max"), "n": ("v", "count"), "avg": ("v", "mean")}


def _truth(frame: pd.DataFrame, key: str, spec: dict = HOWS) -> pd.DataFrame:
    return frame.groupby(key).agg(**spec)


def _same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal values and column dtypes (the key index compared by value)."""
    assert got.dtypes.to_dict() == want.dtypes.to_dict(), (got.dtypes, want.dtypes)
    pd.testing.assert_frame_equal(got, want, check_index_type=False)


def test_a_key_of_another_type_sets_aside_that_record_alone(two_workers):
    """1,000 records keyed by integers with one "x" (in the first batch for one operator,
    in a later one for another), and string keys with one integer: each operator sets
    aside the one record and counts the 999 others exactly as pandas does."""
    n = 1000
    data = pd.DataFrame({"customer": np.arange(n) % 37, "early": np.arange(n) % 11,
                         "name": [f"c{i % 13}" for i in range(n)], "v": np.arange(n)})
    records = data.to_dict("records")
    records[500]["customer"] = "x"          # batch 3 of 4: the operator's keys are ints by then
    records[10]["early"] = "x"              # the first batch: most of its keys are ints
    records[700]["name"] = 77
    src = Stream.from_iterable(records)
    for key in ("customer", "early", "name"):
        src.key_by(key).aggregate({"n": ("v", "count"), "s": ("v", "sum")}, name=f"by_{key}")
    with streamlb.run(src, client=two_workers, parallelism=2, batch_size=250) as job:
        job.wait(timeout=120)
        states = {k: job.state(f"by_{k}") for k in ("customer", "early", "name")}
        dead = job.dead_letters()
    spec = {"n": ("v", "count"), "s": ("v", "sum")}
    for key, bad in (("customer", 500), ("early", 10), ("name", 700)):
        want = _truth(data.drop(index=bad), key, spec)
        _same(states[key], want)
    assert len(dead) == 3, dead
    got = {op: (reason, rec["v"]) for op, reason, rec in zip(dead.operator, dead.reason, dead.record)}
    assert got == {
        "by_customer": ("key 'customer' is str 'x'; this column's keys are integers", 500),
        "by_early": ("key 'early' is str 'x'; this column's keys are integers", 10),
        "by_name": ("key 'name' is int 77; this column's keys are strings", 700),
    }


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_integer_aggregates_stay_exact_int64(two_workers, tmp_path, backend):
    """One key, as in the issue ([2**53+1, 2] and [1, 2]); many keys, combined by the
    router (several rows per key) and not (one row per key): the same values and dtypes
    as pandas, in either state backend."""
    one = pd.DataFrame({"k": ["a", "a"], "v": [2**53 + 1, 2]})
    small = pd.DataFrame({"k": ["a", "a"], "v": [1, 2]})
    rng = np.random.default_rng(3)
    many = pd.DataFrame({"k": rng.integers(0, 50, 2000), "v": rng.integers(-2**55, 2**55, 2000)})
    single = pd.DataFrame({"k": np.arange(300), "v": 2**53 + np.arange(300)})
    frames = {"one": one, "small": small, "many": many, "single": single}
    states = {}
    for name, frame in frames.items():
        src = Stream.from_iterable([frame])
        src.key_by("k").aggregate(HOWS, name=name)
        with streamlb.run(src, client=two_workers, parallelism=2, state_backend=backend) as job:
            job.wait(timeout=120)
            states[name] = job.state(name)
    for name, frame in frames.items():
        want = _truth(frame, "k")
        _same(states[name], want)
    assert states["one"].loc["a", "s"] == 2**53 + 3
    assert states["one"].loc["a", "hi"] == 2**53 + 1


def test_window_integer_aggregates_stay_int64(two_workers, tmp_path):
    """A tumbling window's sums, minima and maxima of an integer column are int64."""
    n = 400
    frame = pd.DataFrame({"k": np.arange(n) % 3, "v": 2**53 + np.arange(n),
                          "t": pd.Timestamp("2026-01-01") + pd.to_timedelta(np.arange(n), "s")})
    out = str(tmp_path / "win")
    src = Stream.from_iterable([frame]).with_watermark("t")
    src.key_by("k").window(size="100s").aggregate(HOWS, name="win").to_parquet(out)
    with streamlb.run(src, client=two_workers, parallelism=2) as job:
        job.wait(timeout=120)
    got = pd.read_parquet(out).sort_values(["k", "window_start"]).reset_index(drop=True)
    frame["window_start"] = frame["t"].dt.floor("100s")
    want = frame.groupby(["k", "window_start"]).agg(**HOWS).reset_index()
    for c in HOWS:
        assert got[c].dtype == want[c].dtype, (c, got[c].dtype, want[c].dtype)
        assert got[c].tolist() == want[c].tolist(), c


def test_a_text_column_summed_fails_the_job_naming_it(two_workers, tmp_path):
    """A sum over a column of strings fails: before anything starts for Parquet (its schema
    says string), at the first batch for a source without a schema."""
    path = tmp_path / "words"
    path.mkdir()
    pd.DataFrame({"k": [1, 2, 1], "word": ["p", "q", "r"]}).to_parquet(path / "part-0.parquet")
    src = Stream.from_parquet(str(path))
    src.key_by("k").aggregate({"total": ("word", "sum")}, name="totals")
    with pytest.raises(SchemaError) as info:
        streamlb.run(src, client=two_workers)
    msg = str(info.value)
    assert "'totals'" in msg and "'word'" in msg and "string" in msg, msg

    src = Stream.from_iterable([{"k": "a", "word": w} for w in ("p", "q", "r")])
    src.key_by("k").aggregate({"total": ("word", "sum")}, name="totals")
    with streamlb.run(src, client=two_workers) as job:
        with pytest.raises(SchemaError) as info:
            job.wait(timeout=120)
    msg = str(info.value)
    assert "'totals'" in msg and "'word'" in msg and "str" in msg and "not a number" in msg, msg


def test_an_odd_bad_value_in_a_numeric_column_is_set_aside(two_workers):
    """A column of integers (as JSON decodes them: Python objects) with one word in the
    first batch: that record alone goes to the dead letters, and the others' sums stay
    exact int64."""
    data = pd.DataFrame({"k": np.arange(600) % 5, "v": 2**53 + np.arange(600)})
    records = data.to_dict("records")
    records[3]["v"] = "lots"
    src = Stream.from_iterable(records)
    src.key_by("k").aggregate(HOWS, name="totals")
    with streamlb.run(src, client=two_workers, parallelism=2, batch_size=200) as job:
        job.wait(timeout=120)
        state, dead = job.state("totals"), job.dead_letters()
    _same(state, _truth(data.drop(index=3), "k"))
    assert dead.reason.tolist() == ["column 'v' holds 'lots', not a number"]
    assert dead.record.tolist()[0]["k"] == 3


def test_split_hot_key_aggregates_stay_exact_int64(two_workers, tmp_path):
    """A hot key split over helpers while the stream runs: the helpers' partials merged at
    its home keep exact int64 sums (past 2**53), minima and maxima, as pandas does."""
    rng = np.random.default_rng(5)
    keys = np.where(rng.random(24_000) < 0.5, 0, rng.integers(1, 10, 24_000))
    frame = pd.DataFrame({"k": keys, "v": 2**40 + rng.integers(0, 1000, 24_000)})
    path = tmp_path / "hot"
    path.mkdir()
    frame.to_parquet(path / "part-0.parquet")
    src = Stream.from_parquet(str(path), batch_size=1000, rate=16_000)     # about 1.5 s of stream
    src.key_by("k").aggregate(HOWS, parallelism=3, name="hot")
    with streamlb.run(src, client=two_workers, key_groups=64) as job:
        home = int(job.routing("hot").owners[assign_to_key_group(np.array([0]), 64)[0]])
        job.split("hot", 0, [i for i in range(3) if i != home])
        job.wait(timeout=120)
        state = job.state("hot")
        split = job.metrics().query("operator == 'hot'")["split_records"].sum()
    assert split > 0                        # helpers did aggregate rows of the hot key
    _same(state, _truth(frame, "k"))


def test_kafka_json_sets_aside_an_odd_key_and_an_odd_value_alone(two_workers, kafka):
    """From a topic of JSON objects over 2 partitions: one record keyed "x" among integer
    keys and one whose value is "lots" go to the dead letters; the 5,998 others are
    counted, in int64, as pandas counts them. (The broker is the session's: in a whole
    run the Kafka tests started it already.)"""
    topic = kafka.create_topic(topic_name("types"), partitions=2)
    rng = np.random.default_rng(1)
    data = pd.DataFrame({"customer": rng.integers(0, 50, 6000), "v": rng.integers(0, 1000, 6000)})
    records = data.to_dict("records")
    records[100]["customer"] = "x"
    records[4000]["v"] = "lots"
    kafka.produce(topic, [json.dumps(r).encode() for r in records], partition=[i % 2 for i in range(6000)])
    src = Stream.from_kafka_topic(topic, kafka.consumer_conf, decode="json", until="end", batch_size=2000)
    src.key_by("customer").aggregate(HOWS, name="totals")
    with streamlb.run(src, client=two_workers, parallelism=2) as job:
        job.wait(timeout=120)
        state, dead = job.state("totals"), job.dead_letters()
    _same(state, _truth(data.drop(index=[100, 4000]), "customer"))
    assert sorted(dead.reason) == ["column 'v' holds 'lots', not a number",
                                   "key 'customer' is str 'x'; this column's keys are integers"]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_floats_after_integers_widen_the_column_never_truncate(two_workers, backend):
    """A column whose first batches hold integers and a later one floats (as JSON gives 1
    and 2.5): sums, minima and maxima become float64, as pandas gives them over all the
    rows, whether the router combined a batch per key (several rows a key) or not."""
    ints = pd.DataFrame({"k": [0, 0, 1, 1, 2, 2], "v": [1, 2, 3, 4, 5, 6]})
    floats = pd.DataFrame({"k": [0, 0, 1, 1, 2, 2], "v": [2.5, 0.25, 1.5, 4.75, -3.5, 8.0]})
    single = pd.DataFrame({"k": [0, 1, 2], "v": [0.5, 7.0, -1.25]})
    src = Stream.from_iterable([ints, single, floats, ints])
    # an output after it: each batch's update is read back, so RocksDB holds the integers
    # (not only its buffer) when the floats come
    emitted = src.key_by("k").aggregate(HOWS, name="widened").sink_to_list()
    with streamlb.run(src, client=two_workers, parallelism=2, state_backend=backend) as job:
        job.wait(timeout=120)
        state = job.state("widened")
    want = _truth(pd.concat([ints, single, floats, ints]), "k")
    _same(state, want)
    last = pd.concat(emitted).groupby(level=0).last().sort_index()
    pd.testing.assert_frame_equal(last, want, check_dtype=False, check_index_type=False)


def test_window_floats_after_integers_widen_the_column(two_workers, tmp_path):
    """The same in a tumbling window and a session window."""
    t0 = pd.Timestamp("2026-01-01")
    ints = pd.DataFrame({"k": [0, 0, 1, 1], "v": [1, 2, 3, 4], "t": t0 + pd.to_timedelta([0, 1, 2, 3], "s")})
    floats = ints.assign(v=[2.5, 0.25, 1.5, 4.75], t=t0 + pd.to_timedelta([4, 5, 6, 7], "s"))
    src = Stream.from_iterable([ints, floats]).with_watermark("t")
    keyed = src.key_by("k")
    keyed.window(size="100s").aggregate(HOWS, name="tumbling").to_parquet(str(tmp_path / "tumbling"))
    keyed.window(gap="10s").aggregate(HOWS, name="session").to_parquet(str(tmp_path / "session"))
    with streamlb.run(src, client=two_workers, parallelism=2) as job:
        job.wait(timeout=120)
    want = _truth(pd.concat([ints, floats]), "k")
    for name in ("tumbling", "session"):
        got = pd.read_parquet(tmp_path / name).set_index("k").sort_index()[list(HOWS)]
        _same(got, want)
