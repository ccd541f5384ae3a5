"""``process(..., batch=True)``: a keyed function called once per batch with a table of its
keys' state. The store on its own (state, timers, moves and checkpoint blobs), then end to
end on LocalCluster worker processes, exact against pandas, across live migrations and a
rescale."""
from __future__ import annotations

import pickle
import time

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import PipelineError, UserFunctionError
from streamlb._checkpoint._format import decode, encode
from streamlb._state._process_table import TableState
from test_joins import _write

BASE = pd.Timestamp("2026-01-01")
S = pd.Timedelta("1s")
END = BASE + 1000 * S           # past every row: fires with the end of the stream


# -- the store -------------------------------------------------------------------------------
def _store(groups=8):
    return TableState("pb", (None, None), "k", groups, {"unit": None})


def _g(keys, groups=8):
    from streamlb.keygroups import assign_to_key_group

    return assign_to_key_group(np.asarray(keys), groups, name="k")


def test_state_columns_put_view_and_forget():
    st = _store()
    keys = np.array([5, 3, 9])
    st.put(keys, _g(keys), {"n": np.array([1, 2, 3]), "name": pd.Series(["a", "b", "c"])})
    got = st.view(np.array([9, 4, 5]))
    assert got.index.tolist() == [9, 5] and got.n.tolist() == [3, 1] and got.name.tolist() == ["c", "a"]
    # a column left out keeps its value; a float into an int column widens it
    st.put(np.array([3]), _g([3]), {"n": np.array([2.5])})
    assert st.view(np.array([3, 5])).n.tolist() == [2.5, 1.0]
    # a new key put with one column: the others missing
    st.put(np.array([7]), _g([7]), {"n": np.array([7.0])})
    row = st.view(np.array([7]))
    assert row.n.tolist() == [7.0] and row.name.tolist() == [None]
    st.forget(np.array([5, 4]))
    assert len(st) == 3 and st.view(np.array([5])).empty
    st.put(np.array([5]), _g([5]), {"n": np.array([8.0])})     # forgotten, then new again
    assert st.view(np.array([5])).name.tolist() == [None]
    st.forget(np.array([5]))
    assert sorted(st.frame().index) == [3, 7, 9] and st.frame().timers.tolist() == [0, 0, 0]
    assert st.contains(np.array([3, 5, 4])).tolist() == [True, False, False]


def test_timers_fire_in_time_order_once_and_wait_for_held_groups():
    st = _store()
    keys = np.array([1, 2, 3])
    st.add_timers(st.to_ns(pd.Series(BASE + pd.to_timedelta([3, 1, 2], unit="s")), 3), keys, _g(keys))
    st.add_timers(st.to_ns(BASE + 1 * S, 1), np.array([2]), _g([2]))        # the same timer again
    st.cancel(st.to_ns(BASE + 2 * S, 1), np.array([3]), _g([3]))
    assert st.contains(np.array([1, 3])).tolist() == [True, False]          # a key with a timer only
    held = int(_g([1])[0])
    st.hold(1, [held])
    t, k, _ = st.due(int((BASE + 10 * S).value))
    assert k.tolist() == [2] and list(st.from_ns(t)) == [np.datetime64(BASE + S, "ns")]
    assert st.due(int((BASE + 10 * S).value))[1].tolist() == []
    st.unhold(1)
    assert st.due(int((BASE + 10 * S).value))[1].tolist() == [1]


def test_cut_snapshot_install_and_checkpoint_blobs_keep_state_and_timers():
    a, b = _store(), _store()
    keys = np.arange(200)
    groups = _g(keys)
    a.put(keys, groups, {"total": keys * 2.0, "first": BASE + pd.to_timedelta(keys, unit="s"),
                         "tag": pd.Series([f"k{i}" for i in keys])})
    a.add_timers(a.to_ns(BASE + pd.to_timedelta(keys % 7, unit="s"), 200), keys, groups)
    a.add_timers(a.to_ns(END, 1), np.array([1000]), _g([1000]))           # a key with a timer only
    want = a.frame().sort_index()
    snap = a.snapshot(range(8))
    assert len(a) == 200                                                      # a snapshot removes nothing
    # through the checkpoint file format and back
    back = decode("process", encode("process", pickle.loads(pickle.dumps(snap))))
    b.install(back)
    pd.testing.assert_frame_equal(b.frame().sort_index(), want)
    # a cut moves half the groups with their timers; a cut of single keys the rest
    c = _store()
    c.install(a.cut([0, 1, 2, 3]))
    c.install(a.cut_keys(np.concatenate([keys, [1000]])))
    assert len(a) == 0 and a.due(np.iinfo(np.int64).max)[1].tolist() == []
    pd.testing.assert_frame_equal(c.frame().sort_index(), want)
    t, k, _ = c.due(np.iinfo(np.int64).max)
    assert sorted(k.tolist()) == [*range(200), 1000] and (np.diff(t) >= 0).all()


def test_forgotten_keys_are_compacted_away():
    st = _store(64)
    keys = np.arange(20_000)
    st.put(keys, _g(keys, 64), {"v": keys})
    st.forget(keys[:15_000])
    assert len(st) == 5_000 and st.index.n == 5_000                          # slots rebuilt
    assert st.view(np.array([14_999, 15_000, 19_999])).v.tolist() == [15_000, 19_999]
    st.put(np.array([3]), _g([3], 64), {"v": np.array([3])})
    assert len(st) == 5_001 and st.view(np.array([3])).v.tolist() == [3]


# -- end to end ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """20,000 rows over 100 s of event time, 500 keys (30% of rows on 3 hot ones), 10% up to
    1 s out of order (the watermark stays 2 s behind: none late)."""
    rng = np.random.default_rng(11)
    n = 20_000
    ms = np.arange(n) * 5 - np.where(rng.random(n) < 0.1, rng.integers(0, 1000, n), 0)
    keys = np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), rng.integers(0, 500, n))
    df = pd.DataFrame({"k": keys, "v": rng.integers(0, 100, n), "t": BASE + pd.to_timedelta(ms, unit="ms")})
    return _write(str(tmp_path_factory.mktemp("pb")), "t", df), df


def _tally(rows, state, ctx):
    """Per key: total and count of v, and the earliest t; a timer 5 s after the first batch
    a key came in (a "seen" row), and one at END (the key's totals)."""
    by = rows.groupby("k", sort=False)
    agg = by.agg(total=("v", "sum"), n=("v", "size"), first=("t", "min"))
    new = ~agg.index.isin(state.index)
    if "total" in state:
        old = state.reindex(agg.index)
        agg = agg.assign(total=agg.total + old.total.fillna(0).astype(np.int64),
                         n=agg.n + old.n.fillna(0).astype(np.int64),
                         first=agg["first"].where(~(old["first"] < agg["first"]), old["first"]))
    ctx.put(agg)
    ctx.timer(agg.index[new], agg["first"][new] + 5 * S)
    ctx.timer(agg.index[new], END)


def _fired(due, state, ctx):
    assert (due.time < ctx.watermark).all(), "a timer fired before the watermark passed it"
    end = due[due.time == END].k
    done = state.loc[end].reset_index()
    ctx.forget(end)
    seen = due[due.time != END]
    return pd.concat([done.assign(kind="total"), pd.DataFrame({"k": seen.k, "kind": "seen", "first": seen.time})],
                     ignore_index=True)


def _expect(df):
    want = df.groupby("k").agg(total=("v", "sum"), n=("v", "size"), first=("t", "min")).sort_index()
    return want


def _check(got, df):
    totals = got[got.kind == "total"].set_index("k").sort_index()
    want = _expect(df)
    assert totals.index.is_unique
    pd.testing.assert_frame_equal(totals[["total", "n", "first"]].astype({"total": np.int64, "n": np.int64}),
                                  want, check_dtype=False, check_index_type=False, check_names=False)
    seen = got[got.kind == "seen"]
    assert sorted(seen.k) == sorted(want.index), "each key's first timer fires once"
    assert (seen.set_index("k")["first"].sort_index() >= want["first"] + 5 * S).all()


def test_batch_process_matches_pandas(two_workers, table):
    out = []
    src = Stream.from_parquet(table[0]).with_watermark("t", delay="2s")
    src.key_by("k").process(_tally, on_timer=_fired, name="pb", batch=True).sink(out.append)
    with streamlb.run(src, client=two_workers, balancer="static") as job:
        job.wait(timeout=120)
    _check(pd.concat(out, ignore_index=True), table[1])


@pytest.mark.parametrize("strategy", ["all-at-once", "lazy", "fluid"])
def test_batch_process_exact_across_live_migrations_and_a_rescale(two_workers, table, strategy):
    out = []
    src = Stream.from_parquet(table[0], batch_size=250, rate=8_000).with_watermark("t", delay="2s")
    src.key_by("k").process(_tally, on_timer=_fired, name="pb", batch=True, parallelism=4).sink(out.append)
    from streamlb import MigrationError

    moved = 0
    with streamlb.run(src, client=two_workers, key_groups=64, balancer="static") as job:
        time.sleep(0.6)
        table_ = job.routing("pb")
        n = table_.parallelism
        try:
            job.reassign("pb", {g: (i + 1) % n for i in range(n) for g in table_.key_groups_of(i)[::2]},
                         strategy=strategy)
            moved += 1
            time.sleep(0.4)
            job.rescale("pb", 3)
            moved += 1
        except MigrationError as exc:           # the stream ended first
            assert "it cannot take part" in str(exc)
        job.wait(timeout=120)
    assert moved >= 1
    _check(pd.concat(out, ignore_index=True), table[1])


def _foreign(rows, state, ctx):
    ctx.put(pd.DataFrame({"x": [1]}, index=[-1]))


def _not_a_frame(rows, state, ctx):
    return {"x": 1}


def _times_mismatch(rows, state, ctx):
    ctx.timer(ctx.keys, rows.t)


@pytest.mark.parametrize("func, message", [
    (_foreign, r"process 'pb': func .*_foreign raised ValueError: process 'pb': ctx.put got keys \[-1\] that are "
               r"not this call's"),
    (_not_a_frame, r"process 'pb': func .*_not_a_frame returned dict; return a pandas DataFrame or None"),
    (_times_mismatch, r"ctx.timer got \d+ keys and \d+ times; give one time for all, or one per key"),
])
def test_batch_process_errors_name_the_operator(two_workers, table, func, message):
    src = Stream.from_parquet(table[0]).with_watermark("t", delay="2s")
    src.key_by("k").process(func, name="pb", batch=True).sink(lambda df: None)
    with pytest.raises(UserFunctionError, match=message):
        with streamlb.run(src, client=two_workers, balancer="static") as job:
            job.wait(timeout=60)


def test_batch_must_be_a_bool(table):
    src = Stream.from_parquet(table[0]).with_watermark("t")
    with pytest.raises(PipelineError, match="process: batch must be True or False, got 'yes'"):
        src.key_by("k").process(_tally, batch="yes")
