"""The session window store of ``window(gap=...).aggregate(...)`` (a table of numpy columns),
exact against pandas and, step by step, against the per-key store it stands in for
(docs/windows.md): the same rows fired, the same rows late, the same state moved."""
from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from streamlb._checkpoint._format import decode, encode
from streamlb._state._window_session_table import SessionWindowState
from streamlb._state._windows import WindowState
from streamlb._time import MAX_TIME

from windowing import S, check, emitted, expected

GROUPS = 8
SPEC = {"n": ("value", "count"), "total": ("value", "sum"), "low": ("value", "min"), "high": ("value", "max"),
        "avg": ("value", "mean")}


def _window(lateness: int) -> dict:
    return {"kind": "session", "size": 0, "slide": 0, "gap": 5 * S, "lateness": lateness, "mode": "aggregate"}


def _stores(lateness: int):
    return (SessionWindowState("w", _window(lateness), "key", GROUPS, spec=SPEC),
            WindowState("w", _window(lateness), "key", GROUPS, spec=SPEC))


def _feed(store, batch: pd.DataFrame, watermark: int, column: str = "event_time"):
    """What the window operator does with a batch, then a watermark: (late rows, fired rows)."""
    late = store.update(batch, None, batch[column].to_numpy().astype("datetime64[ns]").view(np.int64))
    fired = store.advance(store.watermark) if store.refire or store.wants_fire else []
    fired = fired + store.advance(watermark)
    return late, store.rows(fired)


def _canon(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    if frame is None or not len(frame):
        return None
    cols = [c for c in frame.columns if c != "avg"]
    return frame.sort_values(cols).reset_index(drop=True)


records = st.lists(st.tuples(st.sampled_from([1, 2, 3, 7, 11, 12]), st.integers(0, 60_000),
                             st.one_of(st.integers(-50, 50), st.just(None))), min_size=1, max_size=120)


def _frame(recs: list) -> pd.DataFrame:
    keys, ms, values = zip(*recs)
    return pd.DataFrame({"key": np.array(keys, np.int64), "value": pd.array(values, dtype="float64"),
                         "event_time": pd.to_datetime(np.array(ms, np.int64), unit="ms")})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records, cuts=st.lists(st.integers(1, 119), max_size=6), delay=st.sampled_from([0, 2, 8]),
       lateness=st.sampled_from([0, 3 * S]), move=st.lists(st.integers(0, GROUPS - 1), max_size=4),
       pull=st.lists(st.sampled_from([1, 2, 3, 7, 11]), max_size=3))
def test_the_table_fires_and_refuses_what_the_per_key_store_does(recs, cuts, delay, lateness, move, pull):
    frame = _frame(recs)
    new, old = _stores(lateness)
    bounds = sorted({0, len(frame), *[c for c in cuts if c < len(frame)]})
    seen = -(2 ** 62)
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        batch = frame.iloc[a:b].reset_index(drop=True)
        seen = max(seen, int(batch["event_time"].max().value))
        wm = seen - delay * S
        got, want = _feed(new, batch, wm), _feed(old, batch, wm)
        for g, w in zip(got, want):
            if w is None:
                assert g is None or not len(g)
            else:
                pd.testing.assert_frame_equal(_canon(g), _canon(w), check_dtype=False)
        if i == 1 and move:          # groups move out and back in, through the blob format
            back = SessionWindowState("w", _window(lateness), "key", GROUPS, spec=SPEC)
            back.install(new.cut(move))
            new.install(back.cut(move))
        if i == 2 and pull:          # keys pulled out (lazy) and back
            back = SessionWindowState("w", _window(lateness), "key", GROUPS, spec=SPEC)
            back.install(new.cut_keys(np.array(pull, np.int64)))
            new.install(back.cut_keys(np.array(pull, np.int64)))
            assert new.snapshot(range(GROUPS))["states"].keys() == old.snapshot(range(GROUPS))["states"].keys()
    assert sorted(map(str, new.snapshot(range(GROUPS))["states"].items())) == \
        sorted(map(str, old.snapshot(range(GROUPS))["states"].items()))
    g, w = new.rows(new.advance(MAX_TIME)), old.rows(old.advance(MAX_TIME))
    assert (_canon(g) is None) == (_canon(w) is None)
    if w is not None:
        pd.testing.assert_frame_equal(_canon(g), _canon(w), check_dtype=False)
    assert len(new) == 0 and new.frame().empty


@pytest.mark.parametrize("batches", [1, 7, 40])
def test_sessions_equal_pandas_over_the_records_not_late(batches):
    rng = np.random.default_rng(batches)
    n = 4000
    ms = np.sort(rng.integers(0, 400_000, n)) + rng.integers(-12_000, 0, n)
    frame = pd.DataFrame({"key": rng.integers(0, 50, n), "value": rng.integers(0, 100, n).astype(np.int64),
                          "event_time": pd.to_datetime(ms, unit="ms")})
    store, _ = _stores(0)
    out, late = [], []
    seen = -(2 ** 62)
    for idx in np.array_split(np.arange(n), batches):
        batch = frame.iloc[idx].reset_index(drop=True)
        seen = max(seen, int(batch["event_time"].max().value))
        lt, fired = _feed(store, batch, seen - 2 * S)
        out += [fired] if fired is not None else []
        late += [lt] if lt is not None else []
    out.append(store.rows(store.advance(MAX_TIME)))
    lf = pd.concat(late, ignore_index=True) if late else None
    got = pd.concat([f for f in out if f is not None], ignore_index=True)
    assert got["n"].sum() + (0 if lf is None else len(lf)) == n
    check(emitted([got]), expected(frame, "session", lf, gap=5 * S))
    if batches == 40:
        assert lf is not None and len(lf)       # 12 s of disorder outruns the 2 s delay and the gap


# -- window joins: one table of rows per pane and side ---------------------------------------
def _join_stores(kind: str, lateness: int):
    from streamlb._state._window_join import JoinRows
    from streamlb._state._window_join_panes import PaneJoinState
    from streamlb._state._joins import KEY

    size, slide = (6 * S, 6 * S) if kind == "tumbling" else (6 * S, 2 * S)
    window = {"kind": kind, "size": size, "slide": slide, "gap": 0, "lateness": lateness, "mode": "join"}
    join = {"key_names": ["id", "seller"], "suffixes": ("_x", "_y"), "where": None}
    return (PaneJoinState("j", window, GROUPS, join),
            WindowState("j", window, KEY, GROUPS, payload=JoinRows("j", join)))


def _join_batch(recs: list, side: int) -> pd.DataFrame:
    from streamlb._state._joins import KEY, SIDE

    keys, ms, values = zip(*recs)
    keys = np.array(keys, np.int64)
    cols = {"id": keys, "name": [f"p{v}" for v in values]} if side == 0 else {"seller": keys, "price": values}
    return pd.DataFrame({**cols, "date_time": pd.to_datetime(np.array(ms, np.int64), unit="ms"),
                         KEY: keys, SIDE: np.full(len(keys), side, np.int8)})


def _sorted(frame):
    if frame is None or not len(frame):
        return None
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


sides = st.lists(st.tuples(st.sampled_from([1, 2, 3, 7, 11]), st.integers(0, 40_000), st.integers(0, 9)),
                 min_size=1, max_size=25)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.tuples(sides, st.integers(0, 1)), min_size=1, max_size=8),
       kind=st.sampled_from(["tumbling", "hopping"]), delay=st.sampled_from([0, 3, 9]),
       lateness=st.sampled_from([0, 4 * S]), move=st.lists(st.integers(0, GROUPS - 1), max_size=4),
       pull=st.lists(st.sampled_from([1, 2, 3, 7, 11]), max_size=3))
def test_the_window_join_table_joins_what_the_per_key_store_does(batches, kind, delay, lateness, move, pull):
    new, old = _join_stores(kind, lateness)
    seen, joined = -(2 ** 62), []
    for i, (recs, side) in enumerate(batches):
        batch = _join_batch(recs, side)
        seen = max(seen, int(batch["date_time"].max().value))
        got = _feed(new, batch, seen - delay * S, "date_time")
        want = _feed(old, batch, seen - delay * S, "date_time")
        for g, w in zip(got, want):
            assert (g is None or not len(g)) == (w is None or not len(w))
            if w is not None:
                pd.testing.assert_frame_equal(_sorted(g), _sorted(w), check_dtype=False)
                joined.append(len(w))
        if i == 1 and move:         # there as a move ships it (pickled), back as a checkpoint keeps it
            back, _ = _join_stores(kind, lateness)
            back.install(pickle.loads(pickle.dumps(new.cut(move))))
            new.install(decode("window", encode("window", back.cut(move))))
        if i == 2 and pull:
            back, _ = _join_stores(kind, lateness)
            back.install(new.cut_keys(np.array(pull, np.int64)))
            new.install(back.cut_keys(np.array(pull, np.int64)))
        assert len(new) == len(old)
        assert new.keys_per_group(range(GROUPS)).tolist() == old.keys_per_group(range(GROUPS)).tolist()
    g, w = new.rows(new.advance(MAX_TIME)), old.rows(old.advance(MAX_TIME))
    assert (_sorted(g) is None) == (_sorted(w) is None)
    if w is not None:
        pd.testing.assert_frame_equal(_sorted(g), _sorted(w), check_dtype=False)
    event(f"pairs joined: {'some' if joined or w is not None else 'none'}")


_WINDOWS = {"tumbling": {"size": 6 * S, "slide": 6 * S}, "hopping": {"size": 6 * S, "slide": 2 * S},
            "session": {"gap": 5 * S}, "per-key": {"gap": 5 * S}}


def _aggregate_store(kind: str):
    from streamlb._state._window_panes import PaneWindowState

    if kind == "session":
        return SessionWindowState("w", _window(0), "key", GROUPS, spec=SPEC)
    if kind == "per-key":
        return _stores(0)[1]
    window = {"kind": kind, **_WINDOWS[kind], "gap": 0, "lateness": 0, "mode": "aggregate"}
    return PaneWindowState("w", window, "key", GROUPS, spec=SPEC)


@pytest.mark.parametrize("kind", ["tumbling", "hopping", "session", "per-key", "join"])
def test_rows_a_new_owner_held_back_are_not_late_by_the_end_of_its_inputs(kind):
    """A new owner whose routers all ended (watermark +inf) while a moving group's state was
    on its way: the rows it held back are applied after the state came, and are on time
    (a q8 run under fluid moves lost one this way, as late)."""
    if kind == "join":
        old, new = (_join_stores("tumbling", 0)[0] for _ in range(2))
        first, held = _join_batch([(3, 1_000, 1)], 0), _join_batch([(3, 2_000, 7)], 1)
    else:
        old, new = _aggregate_store(kind), _aggregate_store(kind)
        first, held = _frame([(3, 1_000, 1)]), _frame([(3, 2_000, 2)])
    col = "date_time" if kind == "join" else "event_time"
    late, fired = _feed(old, first, 0, col)
    assert late is None and fired is None
    g = int(np.flatnonzero(old.keys_per_group(range(GROUPS)))[0])
    new.hold(1, [g])                        # prepare: the group moves here
    assert new.rows(new.advance(MAX_TIME)) is None      # every router ended
    new.install(old.cut([g]))
    late = new.update(held, None, held[col].to_numpy().astype("datetime64[ns]").view(np.int64))
    assert late is None, late
    new.unhold(1)
    out = new.rows(new.advance(new.watermark))
    if kind == "join":
        assert out[["id", "name", "price"]].values.tolist() == [[3, "p1", 7]]
        return
    truth = "session" if kind == "per-key" else kind
    want = expected(pd.concat([first, held], ignore_index=True), truth, **_WINDOWS[kind])
    assert sorted(map(tuple, out[["key", "n", "total"]].values.tolist())) == \
        sorted(map(tuple, want[["key", "n", "total"]].values.tolist()))


def test_a_held_group_of_a_join_or_a_process_waits_past_the_end_of_the_inputs():
    """The same for the ``process`` store (no timer of a moving group fires at +inf: it fired
    at the old owner before the rows the new owner held back were applied) and the interval
    join store (the rows a held group keeps through +inf still match the rows the new owner
    held back; its frozen watermark kept this so before ae7433f too); the instance's finish
    (``end``) lets go."""
    from streamlb._state._joins import JoinState
    from streamlb._state._process import ProcessState
    from streamlb.keygroups import assign_to_key_group

    join = {"how": "left", "between": (0, 5 * S), "ttl": None, "key_names": ["id", "seller"],
            "suffixes": ("_x", "_y")}
    old, new = JoinState("j", join, GROUPS), JoinState("j", join, GROUPS)
    person = pd.DataFrame({"id": [3], "name": ["p3"], "date_time": pd.to_datetime([1_000], unit="ms")})
    bid = pd.DataFrame({"seller": [3], "price": [7], "date_time": pd.to_datetime([2_000], unit="ms")})
    g = int(assign_to_key_group(np.array([3]), GROUPS)[0])
    assert old.update(person, None, [1_000 * 10 ** 6], side=0) is None
    old.hold(1, [g])
    new.hold(1, [g])
    assert old.advance(MAX_TIME) == [] and new.advance(MAX_TIME) == []     # every router ended
    new.install(old.cut([g]))
    assert not new.late(1, np.array([2_000 * 10 ** 6]), np.array([g])).any()
    out = new.update(bid, None, [2_000 * 10 ** 6], side=1)
    assert out[["id", "name", "price"]].values.tolist() == [[3, "p3", 7]]
    new.unhold(1)
    new.end()
    assert new.advance(MAX_TIME) == [] and len(new) == 0       # matched: dropped, not emitted

    proc = ProcessState("p", (None, None), "key", GROUPS, {"unit": None})
    proc.open([3], [g])
    ctx = proc.context(3, g)
    ctx.timer(pd.Timestamp(1_000, unit="ms"))
    proc.settle(3, g, ctx)
    proc.write()
    proc.hold(1, [g])
    assert proc.due(MAX_TIME) == []
    proc.write()
    proc.end()
    assert proc.due(MAX_TIME) == [(1_000 * 10 ** 6, 3)]
    proc.write()
