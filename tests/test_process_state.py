"""The ``process`` store (``streamlb._state._process``) on both keyed-values primitives,
memory and RocksDB, driven as its operator drives it (one view per batch and per
watermark), checked against plain Python over the same input; blobs cross backends."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from streamlb._state._process import ProcessState, RocksEntries
from streamlb._time import MAX_TIME
from streamlb.keygroups import assign_to_key_group

G, GAP = 16, 50


def sessions(key, rows, ctx):
    """Sum a key's values; a timer GAP after its latest row closes the sum (an older timer
    is cancelled)."""
    total, at = ctx.state or (0, None)
    if at is not None:
        ctx.cancel(at)
    at = int(rows["t"].max()) + GAP
    ctx.timer(at)
    ctx.state = (total + int(rows["v"].sum()), at)


def close(key, when, ctx):
    total, _ = ctx.state
    ctx.state = None
    return {"k": key, "total": total, "when": when}


def make(backend, tmp_path):
    values = RocksEntries("p", "k", G, str(tmp_path)) if backend == "rocksdb" else None
    return ProcessState("p", (sessions, close), "k", G, {"unit": "ns"}, values)


def apply(store, frame) -> None:
    try:
        for key, g, rows in store.update(frame, assign_to_key_group(frame["k"].to_numpy(), G)):
            c = store.context(key, g)
            store.func(key, rows, c)
            store.settle(key, g, c)
    finally:
        store.write()


def fire(store, watermark, out: list) -> None:
    try:
        for t, key in store.due(watermark):
            g = store.due_groups[key]
            c = store.context(key, g)
            out.append(store.on_timer(key, store.from_ns(t), c))
            store.settle(key, g, c)
    finally:
        store.write()


def truth(frame) -> list:
    """Plain Python: per key, runs of rows whose times are within GAP of the run's latest,
    as batches and watermarks see them (batches of 200 rows, watermark = batch's max t)."""
    out, open_ = [], {}
    for a in range(0, len(frame), 200):
        batch = frame.iloc[a:a + 200]
        for k, rows in batch.groupby("k", sort=False):
            total, _ = open_.get(k, (0, None))
            open_[k] = (total + int(rows.v.sum()), int(rows.t.max()) + GAP)
        wm = int(batch.t.max()) if a + 200 < len(frame) else MAX_TIME
        for k in [k for k, (_, at) in sorted(open_.items(), key=lambda kv: kv[1][1]) if at < wm]:
            total, at = open_.pop(k)
            out.append({"k": k, "total": total, "when": at})
    return sorted(map(tuple, pd.DataFrame(out)[["k", "total", "when"]].values.tolist()))


@pytest.fixture(scope="module", params=["int", "str"])
def frame(request):
    rng = np.random.default_rng(7)
    n = 3_000
    keys = rng.zipf(1.4, n) % 300
    f = pd.DataFrame({"k": keys if request.param == "int" else np.char.add("k", keys.astype(str)).astype(object),
                      "v": rng.integers(0, 10, n), "t": np.sort(rng.integers(0, 3_000, n))})
    return f


def run(stores, frame, switch=None) -> list:
    """Feed ``frame`` in batches of 200 to ``stores[0]``; at batch ``switch`` move every key
    group to ``stores[1]`` (a cut and an install) and go on there."""
    out, store = [], stores[0]
    for i, a in enumerate(range(0, len(frame), 200)):
        if i == switch:
            stores[1].install(store.cut(range(G)))
            assert len(store) == 0 and store.keys_per_group(range(G)).sum() == 0
            store = stores[1]
        batch = frame.iloc[a:a + 200]
        apply(store, batch)
        fire(store, int(batch.t.max()) if a + 200 < len(frame) else MAX_TIME, out)
    assert len(store) == 0 and store.keys_per_group(range(G)).sum() == 0, "every key closed and dropped"
    return sorted((o["k"], o["total"], o["when"]) for o in out)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_timers_and_states_exact(backend, frame, tmp_path):
    assert run([make(backend, tmp_path)], frame) == truth(frame)


@pytest.mark.parametrize("first, second", [("memory", "rocksdb"), ("rocksdb", "memory")])
def test_key_groups_move_across_backends(first, second, frame, tmp_path):
    assert run([make(first, tmp_path), make(second, tmp_path)], frame, switch=7) == truth(frame)


def test_blobs_reads_and_single_keys_are_the_same_on_both(frame, tmp_path):
    mem, rocks = make("memory", tmp_path), make("rocksdb", tmp_path)
    for s in (mem, rocks):
        apply(s, frame.iloc[:1_000])
        fire(s, int(frame.t.iloc[600]), [])
    a, b = mem.snapshot(range(G)), rocks.snapshot(range(G))
    assert a["states"] == b["states"] and a["key_groups"].tolist() == b["key_groups"].tolist()
    assert all(isinstance(e[1], list) and e[1] == sorted(e[1]) for e in a["states"].values())
    pd.testing.assert_frame_equal(mem.frame().sort_index(), rocks.frame().sort_index())
    pd.testing.assert_frame_equal(mem.frame_of_groups([1, 2]).sort_index(), rocks.frame_of_groups([1, 2]).sort_index())
    np.testing.assert_array_equal(mem.keys_per_group(range(G)), rocks.keys_per_group(range(G)))
    keys = list(a["states"])[:5] + [frame.k.iloc[-1]]
    assert mem.contains(keys).tolist() == rocks.contains(keys).tolist()
    ca, cb = mem.cut_keys(keys), rocks.cut_keys(keys)
    assert ca["states"] == cb["states"] and len(mem) == len(rocks) == len(a["states"]) - len(ca["states"])
    assert not rocks.contains(keys).any() and mem.key_kind() == rocks.key_kind()


def test_a_raising_function_keeps_what_the_rows_before_set(tmp_path):
    for backend in ("memory", "rocksdb"):
        s = make(backend, tmp_path)
        calls = []

        def func(key, rows, ctx):
            calls.append(key)
            if key == 2:
                raise ValueError("boom")
            ctx.state = key * 10

        s.func = func
        with pytest.raises(ValueError):
            apply(s, pd.DataFrame({"k": [1, 2, 3], "v": 0, "t": 0}))
        assert s.frame()["state"].to_dict() == {1: 10}, backend


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_cut_keys_takes_repeated_keys_once(backend, tmp_path):
    """A lazy pull joins key requests that may share keys: each key is taken once, with
    its group, and the counts per group stay right."""
    s = make(backend, tmp_path)
    apply(s, pd.DataFrame({"k": [1, 2, 3], "v": 1, "t": 0}))
    gs = assign_to_key_group(np.array([1, 1, 2]), G)
    blob = s.cut_keys([1, 1, 2], gs)
    assert list(blob["states"]) == [1, 2] and blob["key_groups"].tolist() == gs[1:].tolist()
    assert len(s) == 1 and s.keys_per_group(range(G)).tolist() == np.bincount(
        assign_to_key_group(np.array([3]), G), minlength=G).tolist()
