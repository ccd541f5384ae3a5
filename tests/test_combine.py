"""Map-side combining (streamlb/_worker/_combine.py): a keyed exchange into an aggregate
sends each batch summed per key. The state is the same as row by row, exact against pandas,
and what counts records still counts every record."""
from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb._state._aggregate import AggregateState
from streamlb._state._partials import RECORDS, blob_of, records_of
from streamlb._worker._combine import Combiner, combined, tables_for
from streamlb.keygroups import assign_to_key_group

from test_migration import _count_hashed_rows

SPEC = {"n": ("v", "count"), "total": ("v", "sum"), "avg": ("v", "mean"), "lo": ("i", "min"),
        "hi": ("i", "max"), "flag": ("b", "sum"), "fmax": ("v", "max")}


def _frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=n).round(3)
    v[rng.random(n) < 0.1] = np.nan                 # nulls: not counted, not summed
    return pd.DataFrame({"key": rng.zipf(1.3, n) % 500, "v": v, "i": rng.integers(-10**12, 10**12, n),
                         "b": rng.random(n) < 0.5})


def _truth(df: pd.DataFrame) -> pd.DataFrame:
    return df.groupby("key").agg(**{k: (c, how) for k, (c, how) in SPEC.items()})


def test_a_combined_batch_merges_into_the_same_state_as_its_rows():
    df = _frame(20_000, seed=1)
    groups = assign_to_key_group(df.key.to_numpy(), 64)
    rows, comb = AggregateState("op", SPEC, "key", 64), AggregateState("op", SPEC, "key", 64)
    half = len(df) // 2
    for part, g in ((df.iloc[:half], groups[:half]), (df.iloc[half:], groups[half:])):
        rows.update(part, g)
        c = combined(part, part.key.to_numpy(), "key", tables_for(SPEC))
        assert c is not None and len(c) < len(part) and records_of(c) == len(part)
        cg = assign_to_key_group(c.key.to_numpy(), 64)
        comb.combine(blob_of(c, cg, "key", comb.inputs, comb.dtypes))
    got, want = comb.frame().sort_index(), rows.frame().sort_index()
    pd.testing.assert_frame_equal(got[["n", "lo", "hi", "flag"]], want[["n", "lo", "hi", "flag"]])
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12)
    truth = _truth(df)
    assert (got["lo"] == truth["lo"]).all() and (got["hi"] == truth["hi"]).all()    # int64, exact
    assert (got["n"] == truth["n"]).all()


def test_a_batch_is_not_combined_where_it_would_not_pay_or_not_apply():
    spec = tables_for(SPEC)
    distinct = pd.DataFrame({"key": np.arange(100), "v": 1.0, "i": 1, "b": True})
    assert combined(distinct, distinct.key.to_numpy(), "key", spec) is None          # no repeats
    text = pd.DataFrame({"key": [1, 1, 1], "v": ["1", "2", "x"], "i": 1, "b": True})
    assert combined(text, text.key.to_numpy(), "key", spec) is None      # the owner dead-letters "x"
    assert combined(text.drop(columns="i"), text.key.to_numpy(), "key", spec) is None
    assert RECORDS not in distinct.columns and records_of(distinct) == 100


@pytest.mark.parametrize("keys", ["narrow ints", "negative ints", "uint64", "wide ints", "strings"])
def test_combined_rows_equal_pandas_whether_keys_are_counted_by_offset_or_hashed(keys):
    # integer keys spanning no more than the batch are counted by their offset in the range;
    # the rest are hashed: both give pandas' groups, one row per key, every record counted
    df = _frame(6_000, seed=4)
    k = df.key.to_numpy()
    df["key"] = {"narrow ints": k, "negative ints": k - 10**15, "uint64": k.astype(np.uint64) + np.uint64(2**63),
                 "wide ints": k * 10**9, "strings": np.array([f"k{x}" for x in k], object)}[keys]
    c = combined(df, df.key.to_numpy(), "key", tables_for(SPEC))
    assert c is not None and c.key.is_unique and c.key.dtype == df.key.dtype
    c = c.set_index("key").sort_index()
    want = df.groupby("key").agg(n=("v", "count"), total=("v", "sum"), lo=("i", "min"), hi=("i", "max"),
                                 flag=("b", "sum"), records=("v", "size"))
    assert (c.index == want.index).all()
    assert (c[RECORDS].to_numpy() == want.records.to_numpy()).all() and records_of(c) == len(df)
    assert (c["__streamlb_cnt__v"].to_numpy() == want.n.to_numpy()).all()
    assert np.allclose(c["__streamlb_sum__v"].to_numpy(), want.total.to_numpy(), rtol=1e-12)
    assert (c["__streamlb_min__i"].to_numpy() == want.lo.to_numpy()).all()
    assert (c["__streamlb_max__i"].to_numpy() == want.hi.to_numpy()).all()
    assert (c["__streamlb_sum__b"].to_numpy() == want.flag.to_numpy()).all()


def test_a_combiner_backs_off_after_batches_that_do_not_pay():
    spec = tables_for(SPEC)
    distinct = pd.DataFrame({"key": np.arange(0, 10**9, 10**6), "v": 1.0, "i": 1, "b": True})
    repeats = pd.DataFrame({"key": np.arange(1000) % 7, "v": 1.0, "i": 1, "b": True})
    comb = Combiner("key", spec)

    def tried(frame) -> list:
        return [comb.combine(frame, frame.key.to_numpy()) is not None for _ in range(Combiner.BACKOFF + 1)]

    assert tried(distinct) == [False] * 5           # a miss, then 4 batches passed unseen
    assert tried(distinct) == [False] * 5           # a second miss: 8 to pass now (4 left)
    assert tried(repeats) == [False] * 4 + [True]   # the 4 passed, then tried again: it pays
    assert tried(repeats) == [True] * 5
    assert tried(distinct) == [False] * 5 and tried(repeats) == [True] * 5


@pytest.mark.parametrize("combine", [True, False], ids=["combined", "rows"])
def test_a_job_is_exact_and_counts_every_record(two_workers, tmp_path, combine):
    df = _frame(120_000, seed=2)
    path = tmp_path / "in"
    path.mkdir()
    for i in range(4):
        df.iloc[i::4].to_parquet(path / f"part-{i}.parquet")
    src = Stream.from_parquet(str(path), batch_size=5_000)
    src.key_by("key").aggregate(SPEC, name="totals")
    two_workers.run(_count_hashed_rows, True)
    with dask.config.set({"streamlb.exchange.combine": combine}), \
            streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait(timeout=120)
        got, metrics = job.state("totals"), job.metrics()
    want = _truth(pd.concat([df.iloc[i::4] for i in range(4)]))
    got = got.sort_index()[want.columns]
    got.index = got.index.astype(np.int64)
    pd.testing.assert_frame_equal(got[["n", "lo", "hi"]], want[["n", "lo", "hi"]], check_dtype=False)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, check_exact=False, rtol=1e-9)
    assert metrics[metrics.operator == "totals"]["records"].sum() == len(df)
    hashed = sum(two_workers.run(_count_hashed_rows, False).values())    # keys the router hashed
    assert hashed < len(df) // 4 if combine else hashed == len(df)


def test_a_full_speed_parquet_source_takes_batches_within_a_row_cap_and_a_byte_budget(tmp_path):
    """Read at full speed by anything but aggregates alone: full-speed-batch-size rows at
    most, and no more than full-speed-batch-bytes of decoded columns (wide string rows
    take fewer); paced or chosen batches as before; a bad setting named."""
    import dask

    from streamlb.planner._checks import bytes_per_row
    from streamlb.exceptions import PipelineError
    from streamlb.planner import plan
    from streamlb.planner._checks import pace_batches

    narrow, wide = tmp_path / "narrow.parquet", tmp_path / "wide.parquet"
    _frame(1_000, seed=1).to_parquet(narrow)
    rng = np.random.default_rng(2)
    texts = ["x" * int(n) for n in rng.integers(120, 180, 1_000)]        # dictionary-encoded in the file
    pd.DataFrame({"key": np.arange(1_000), "text": texts}).to_parquet(wide)

    def batch_size(path, select=None, **kw) -> int:
        src = Stream.from_parquet(str(path), **kw)
        (src.select(select) if select else src).map(len).sink(print)
        p = plan(src, workers=2, key_groups=64, batch_size=65_536)
        pace_batches(p, 1.0)
        return p.stages[0].batch_size

    assert 24 <= bytes_per_row([str(narrow)], None) <= 26                # key, v, i: 8 each; b: bits
    assert batch_size(narrow) == 262_144                                # the row cap
    per = bytes_per_row([str(wide)], None)
    assert 8 + 120 < per < 8 + 180 + 16                                 # the strings decoded
    assert 65_536 < batch_size(wide) == int((16 << 20) // per) < 262_144  # the byte budget: fewer rows
    assert batch_size(wide, select=["key"]) == 262_144                  # only the column read counts
    assert batch_size(narrow, rate=100_000) < 65_536                    # paced: smaller
    assert batch_size(narrow, batch_size=1_000) == 1_000                # the user's choice
    with dask.config.set({"streamlb.full-speed-batch-size": 1_000, "streamlb.full-speed-batch-bytes": "1MiB"}):
        assert batch_size(narrow) == 65_536                             # never below batch-size
        assert batch_size(wide) == 65_536
    with dask.config.set({"streamlb.full-speed-batch-bytes": "lots"}):
        with pytest.raises(PipelineError, match=r"streamlb.full-speed-batch-size and full-speed-batch-bytes: must "
                                                r"be .*got 262144 and 'lots'"):
            batch_size(narrow)


def test_a_source_read_by_aggregates_alone_at_full_speed_takes_larger_batches(tmp_path):
    from streamlb.planner import plan
    from streamlb.planner._checks import pace_batches

    path = tmp_path / "in.parquet"
    _frame(100, seed=3).to_parquet(path)

    def batch_size(build, **kw) -> int:
        src = Stream.from_parquet(str(path), **kw)
        build(src)
        p = plan(src, workers=2, key_groups=64, batch_size=65_536)
        pace_batches(p, 1.0)
        return next(s for s in p.stages if s.is_source).batch_size

    def agg(src):
        src.key_by("key").aggregate(SPEC)

    def agg_and_map(src):
        agg(src)
        src.map(len).sink(print)

    assert batch_size(agg) == 524_288
    assert batch_size(agg, batch_size=1_000) == 1_000               # the user's choice
    assert batch_size(agg, rate=100_000) < 65_536                   # paced: smaller
    # a map sees the rows: any full-speed Parquet read's batch, full-speed-batch-size
    assert batch_size(agg_and_map) == 262_144
    assert batch_size(lambda s: s.key_by("key").aggregate(SPEC, cost=1e-6)) == 262_144
    with dask.config.set({"streamlb.exchange.combine": False}):
        assert batch_size(agg) == 262_144                           # not summed: as any other read


# -- into a window: combined per key and pane ---------------------------------------------------
S = 1_000_000_000
W_SPEC = {"n": ("value", "count"), "total": ("value", "sum")}
PANES = {"tumbling": ({"size": "10s"}, {"size": 10 * S, "slide": 10 * S}),
         "hopping": ({"size": "10s", "slide": "2s"}, {"size": 10 * S, "slide": 2 * S})}


def _timed(n: int, seed: int, disorder: float = 2.0) -> pd.DataFrame:
    """``n`` records over 200 keys and 60 s of event time, 10% of them up to ``disorder``
    seconds out of order."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 60, n)) + rng.uniform(0, disorder, n) * (rng.random(n) < 0.1)
    return pd.DataFrame({"key": rng.zipf(1.2, n) % 200, "value": rng.integers(0, 1000, n),
                         "event_time": pd.Timestamp("2026-01-01") + pd.to_timedelta(np.round(t, 6), unit="s")})


def test_rows_into_a_window_are_combined_per_key_and_pane_at_or_past_the_floor():
    from streamlb._worker._combine import PaneCombine

    whole = _timed(60_000, seed=4)
    df = whole[whole.event_time < whole.event_time.min() + pd.Timedelta("20s")]    # 10-11 panes
    ns = df.event_time.to_numpy().astype("datetime64[ns]").view(np.int64)
    panes = PaneCombine(tables_for(W_SPEC), "event_time", None, 2 * S)
    comb = Combiner("key", panes.hows, panes)
    got = comb.combine(df, df.key.to_numpy(), floor=int(ns.min()))
    pane_of = lambda t: (t.to_numpy().astype("datetime64[ns]").view(np.int64) // (2 * S)) * (2 * S)   # noqa: E731
    want = df.assign(pane=pane_of(df.event_time)).groupby(["key", "pane"]).value.agg(["count", "sum"])
    got = got.assign(pane=pane_of(got.event_time)).set_index(["key", "pane"]).sort_index()
    assert records_of(got) == len(df) and len(got) == len(want)
    assert (got[RECORDS].to_numpy() == want["count"].to_numpy()).all()
    assert (got["__streamlb_sum__value"].to_numpy() == want["sum"].to_numpy()).all()
    # not combined: no floor yet, a row behind it, an event time missing, too many panes
    assert comb.combine(df, df.key.to_numpy(), floor=None) is None
    assert comb.combine(df, df.key.to_numpy(), floor=int(ns.min()) + 1) is None
    bad = df.assign(event_time=df.event_time.where(df.index != 7))
    assert comb.combine(bad, bad.key.to_numpy(), floor=int(ns.min())) is None
    assert comb.combine(whole, whole.key.to_numpy(), floor=int(ns.min())) is None      # over 16 panes


@pytest.mark.parametrize("kind", list(PANES))
def test_a_window_state_fed_combined_rows_holds_what_it_would_from_the_rows(kind):
    from streamlb._state._window_panes import PaneWindowState
    from streamlb._worker._combine import PaneCombine

    win = {"kind": kind, **PANES[kind][1], "gap": 0, "lateness": 0, "mode": "aggregate"}
    df = _timed(30_000, seed=5)
    ns = df.event_time.to_numpy().astype("datetime64[ns]").view(np.int64)
    rows, comb = (PaneWindowState("w", win, "key", 64, spec=W_SPEC) for _ in range(2))
    pane = 2 * S if kind == "hopping" else 10 * S
    combiner = Combiner("key", tables_for(W_SPEC), PaneCombine(tables_for(W_SPEC), "event_time", None, pane))
    for part in (df.iloc[i * 10_000:(i + 1) * 10_000] for i in range(3)):
        rows.update(part, None, part.event_time.to_numpy().astype("datetime64[ns]").view(np.int64))
        c = combiner.combine(part, part.key.to_numpy(), floor=int(ns.min()))
        assert c is not None and len(c) < len(part) // 4
        comb.update(c, None, c.event_time.to_numpy().astype("datetime64[ns]").view(np.int64))
    for st in (rows, comb):
        st.time_type = np.dtype("datetime64[ns]")
    want = pd.concat(rows.advance(int(ns.max()) + 20 * S), ignore_index=True)
    got = pd.concat(comb.advance(int(ns.max()) + 20 * S), ignore_index=True)
    order = ["key", "window_start"]
    pd.testing.assert_frame_equal(got.sort_values(order).reset_index(drop=True),
                                  want.sort_values(order).reset_index(drop=True))


@pytest.mark.parametrize("kind", list(PANES))
def test_a_window_job_combined_per_pane_is_exact_and_counts_every_record(two_workers, tmp_path, kind):
    from windowing import check, emitted, expected

    df = _timed(200_000, seed=6)
    path = tmp_path / "in"
    path.mkdir()
    for i in range(4):                  # each file over the whole minute, as log partitions
        df.iloc[i::4].to_parquet(path / f"part-{i}.parquet")
    want = expected(df, kind, **PANES[kind][1])
    for combine in (True, False):
        src = Stream.from_parquet(str(path), batch_size=10_000).with_watermark("event_time", delay="3s")
        out: list = []
        src.key_by("key").window(**PANES[kind][0]).aggregate(W_SPEC, name="w").sink(out.append)
        two_workers.run(_count_hashed_rows, True)
        with dask.config.set({"streamlb.exchange.combine": combine}), \
                streamlb.run(src, client=two_workers, balancer="static") as job:
            job.wait(timeout=120)
            metrics, dead = job.metrics(), job.dead_letters()
        check(emitted(out), want)
        assert len(dead) == 0
        assert metrics[metrics.operator == "w"]["records"].sum() == len(df)
        hashed = sum(two_workers.run(_count_hashed_rows, False).values())
        # combined: the batches before a watermark went out go as rows, the rest per key and pane
        assert hashed < len(df) // 2 if combine else hashed == len(df), (combine, hashed)


def test_a_combined_window_job_is_exact_across_a_live_rescale_and_migration(two_workers, tmp_path):
    """Routers that go on combining while the window operator's key groups move and its
    instances change, and the new ones: exact against pandas, nothing late or lost."""
    import time

    from windowing import check, emitted, expected

    df = _timed(200_000, seed=7)
    path = tmp_path / "in"
    path.mkdir()
    for i in range(4):
        df.iloc[i::4].to_parquet(path / f"part-{i}.parquet")
    src = Stream.from_parquet(str(path), batch_size=5_000, rate=60_000).with_watermark("event_time", delay="3s")
    out: list = []
    src.key_by("key").window(**PANES["hopping"][0]).aggregate(W_SPEC, parallelism=2, name="w").sink(out.append)
    two_workers.run(_count_hashed_rows, True)
    with streamlb.run(src, client=two_workers, key_groups=64, balancer="static") as job:
        time.sleep(0.8)
        job.rescale("w", 3)
        time.sleep(0.5)
        table = job.routing("w")
        job.reassign("w", {g: (i + 1) % 3 for i in range(3) for g in table.key_groups_of(i)[::2]}, strategy="fluid")
        job.wait(timeout=120)
        dead, metrics = job.dead_letters(), job.metrics()
    assert {h.get("kind") for h in job.history} >= {"rescale"} and len(dead) == 0
    check(emitted(out), expected(df, "hopping", **PANES["hopping"][1]))
    assert metrics[metrics.operator == "w"]["records"].sum() == len(df)
    assert sum(two_workers.run(_count_hashed_rows, False).values()) < len(df) // 2     # it did combine


def test_late_records_reach_the_dead_letters_as_records_while_the_rest_is_combined(two_workers, tmp_path):
    """No watermark delay: the second half of the minute has records behind the watermark.
    The batches holding one go as rows, so each late record is in the dead letters as
    itself; the first half's batches are combined; the windows equal pandas over the
    records that were not late."""
    from windowing import check, emitted, expected

    df = _timed(120_000, seed=8, disorder=0.0)
    t = df.event_time.to_numpy().astype("datetime64[ns]").view(np.int64)
    rng = np.random.default_rng(9)
    late = (t >= np.median(t)) & (rng.random(len(df)) < 0.1)        # 10% of the second half
    df = df.assign(event_time=df.event_time.where(~late, df.event_time - pd.Timedelta("2s")))
    path = tmp_path / "in"
    path.mkdir()
    for i in range(2):
        df.iloc[i::2].to_parquet(path / f"part-{i}.parquet")
    src = Stream.from_parquet(str(path), batch_size=3_000).with_watermark("event_time")
    out: list = []
    src.key_by("key").window(size="10s").aggregate(W_SPEC, name="w").sink(out.append)
    two_workers.run(_count_hashed_rows, True)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait(timeout=120)
        dead = job.dead_letters()
    assert len(dead) and (dead.reason == "late").all()
    lf = pd.DataFrame(list(dead.record))
    assert list(lf.columns[:3]) == ["key", "value", "event_time"] and RECORDS not in lf.columns
    check(emitted(out), expected(df, "tumbling", lf, **PANES["tumbling"][1]))
    assert sum(two_workers.run(_count_hashed_rows, False).values()) < len(df) * 3 // 4     # the first half combined
