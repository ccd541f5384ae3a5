"""The StateStore contract, checked against pandas for every store, with no cluster.

One test class holds the contract; it is subclassed once per store (as toolz tests its
mappings), so a new store or backend passes the same tests by adding a subclass.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from streamlb import keygroups
from streamlb._state import AggregateState, StatefulMapState, StateStore
from streamlb._state._backends import BACKENDS, make_store
from streamlb._state import _aggregate
from streamlb.keygroups import assign_to_key_group

G = 8
SPEC = {"n": ("v", "count"), "s": ("v", "sum"), "lo": ("v", "min"), "hi": ("v", "max"), "avg": ("v", "mean")}


def running_sum(state, record):
    """A stateful map's function: the sum of ``v`` per key; outputs the previous sum."""
    total = (state or 0) + record["v"]
    return total, state


def _batches(kind: str, n: int = 600, seed: int = 3) -> list[pd.DataFrame]:
    """A stream in uneven batches, keys skewed, of integer or string keys."""
    rng = np.random.default_rng(seed)
    keys = rng.zipf(1.3, n) % 97
    df = pd.DataFrame({"k": keys if kind == "int" else np.array([f"k{x}" for x in keys], dtype=object),
                       "v": rng.integers(-50, 50, n)})
    return [df.iloc[a:b] for a, b in [(0, 7), (7, 250), (250, 251), (251, n)]]


def _groups(frame: pd.DataFrame) -> np.ndarray:
    return assign_to_key_group(frame["k"].to_numpy(), G, name="k")


def _assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    got, want = got.sort_index(), want.sort_index()
    assert got.index.tolist() == want.index.tolist()
    assert list(got.columns) == list(want.columns)
    for c in want.columns:
        np.testing.assert_array_equal(got[c].to_numpy(dtype=float), want[c].to_numpy(dtype=float), err_msg=c)


def _of_groups(frame: pd.DataFrame, groups) -> pd.DataFrame:
    """The rows of ``frame`` (indexed by key) whose key lies in key groups ``groups``."""
    return frame[np.isin(assign_to_key_group(frame.index.to_numpy(), G), list(groups))]


class StoreContract:
    """What every :class:`StateStore` does; a subclass says how to build one and what
    pandas says its state is."""

    def make(self) -> StateStore:
        raise NotImplementedError

    def truth(self, df: pd.DataFrame) -> pd.DataFrame:
        raise NotImplementedError

    @pytest.fixture(params=["int", "str"])
    def batches(self, request) -> list[pd.DataFrame]:
        return _batches(request.param)

    def filled(self, batches, with_groups: bool = True) -> StateStore:
        store = self.make()
        for b in batches:
            store.update(b, _groups(b) if with_groups else None)
        return store

    def test_is_a_state_store(self):
        assert isinstance(self.make(), StateStore)

    def test_update_with_and_without_groups_gives_the_same_frame(self, batches):
        want = self.truth(pd.concat(batches))
        _assert_same(self.filled(batches, with_groups=True).frame(), want)
        _assert_same(self.filled(batches, with_groups=False).frame(), want)

    def test_a_key_asked_for_twice_is_cut_once(self, batches):
        """Lazy pulls join several routers' requests: the same key may come twice."""
        df = pd.concat(batches)
        src, dst = self.filled(batches), self.make()
        keys = df["k"].drop_duplicates().to_numpy()[:5]
        twice = np.concatenate([keys, keys[::-1]])
        dst.install(src.cut_keys(twice, assign_to_key_group(twice, G)))
        assert len(src) + len(dst) == df["k"].nunique() and len(dst) == len(keys)
        _assert_same(dst.frame(), self.truth(df[df["k"].isin(keys)]))

    def test_snapshot_leaves_the_store_unchanged_and_reproduces_the_groups(self, batches):
        store = self.filled(batches)
        before = store.frame()
        moving = {1, 4, 5}
        snap = store.snapshot(moving)
        _assert_same(store.frame(), before)
        assert len(store) == len(before)
        copy = self.make()
        copy.install(snap)
        _assert_same(copy.frame(), _of_groups(before, moving))
        cut = self.make()
        cut.install(store.cut(moving))          # the blob cut gives is the snapshot's
        _assert_same(cut.frame(), copy.frame())

    def test_cut_and_install_conserve_state_exactly(self, batches):
        df = pd.concat(batches)
        owner = np.arange(G) % 2
        stores = [self.make(), self.make()]
        for b in batches:
            g = _groups(b)
            for i in (0, 1):
                rows = owner[g] == i
                stores[i].update(b[rows], g[rows])
        keys = df["k"].drop_duplicates().to_numpy()[:10]
        kg = assign_to_key_group(keys, G)
        from0 = owner[kg] == 0
        stores[1].install(stores[0].cut_keys(keys[from0], kg[from0]))     # single keys first
        assert stores[1].contains(keys[from0], kg[from0]).all()
        assert not stores[0].contains(keys[from0]).any()
        for g in (0, 2, 3):
            src = owner[g]
            stores[1 - src].reserve({g})
            stores[1 - src].install(stores[src].cut({g}))
            owner[g] = 1 - src
        got = pd.concat([s.frame() for s in stores])
        assert not got.index.duplicated().any()
        _assert_same(got, self.truth(df))
        assert len(stores[0]) + len(stores[1]) == df["k"].nunique()

    def test_keys_per_group_matches_pandas(self, batches):
        store = self.filled(batches)
        keys = pd.concat(batches)["k"].drop_duplicates().to_numpy()
        want = np.bincount(assign_to_key_group(keys, G), minlength=G)
        np.testing.assert_array_equal(store.keys_per_group(range(G)), want)
        np.testing.assert_array_equal(store.keys_per_group([3, 0]), want[[3, 0]])
        store.cut({3})
        assert store.keys_per_group([3]).tolist() == [0]
        assert len(store) == len(keys) - want[3]

    def test_key_kind(self, batches):
        store = self.make()
        assert store.key_kind() is None
        store.update(batches[0])
        assert store.key_kind() == ("i" if batches[0]["k"].dtype.kind == "i" else "O")

    def test_contains(self, batches):
        store = self.filled(batches[:1])
        held = batches[0]["k"].to_numpy()
        absent = np.array([10**6] if held.dtype.kind == "i" else ["nowhere"], dtype=held.dtype)
        assert store.contains(held).all()
        assert not store.contains(absent).any()

    def test_passed_groups_are_not_hashed_again(self, batches, monkeypatch):
        """A record's key group is computed once per exchange, by its router: with the
        groups passed, updating, cutting single keys, snapshots, cuts and installs hash
        nothing."""
        df = pd.concat(batches)
        groups = _groups(df)
        keys = df["k"].drop_duplicates().to_numpy()[:10]
        kg = assign_to_key_group(keys, G)
        calls = []
        real = keygroups.stable_hash

        def counted(*args, **kwargs):
            calls.append(len(args[0]))
            return real(*args, **kwargs)

        monkeypatch.setattr(keygroups, "stable_hash", counted)
        src, dst = self.make(), self.make()
        for a, b in [(0, 300), (300, len(df))]:
            src.update(df.iloc[a:b], groups[a:b])
        dst.install(src.cut_keys(keys, kg))
        assert dst.contains(keys, kg).all()
        src.snapshot(range(G))
        dst.install(src.cut({1, 2}))
        assert calls == []
        self.make().update(df)                  # the counter counts: no groups, a hash
        assert calls


class TestAggregateState(StoreContract):
    def make(self) -> AggregateState:
        return AggregateState("agg", SPEC, "k", G)

    def truth(self, df: pd.DataFrame) -> pd.DataFrame:
        return df.groupby("k").agg(**SPEC)

    def test_clean_marks_rows_whose_summed_value_is_not_a_number(self):
        store = self.make()
        frame = pd.DataFrame({"k": [1, 2, 3, 4], "v": pd.Series([1, "x", 2.5, "y"], dtype=object)})
        cleaned, bad, reasons = store.clean(frame)
        assert bad.tolist() == [False, True, False, True]
        assert reasons == ["column 'v' holds 'x', not a number", "column 'v' holds 'y', not a number"]
        assert len(cleaned) == len(frame) and cleaned["v"].dtype == np.float64
        store.update(cleaned[~bad])
        assert store.frame()["s"].to_dict() == {1: 1.0, 3: 2.5}

    def test_clean_passes_a_numeric_frame_whole(self):
        frame = pd.DataFrame({"k": [1, 2], "v": [1.0, 2.0]})
        cleaned, bad, reasons = self.make().clean(frame)
        assert cleaned is frame and bad is None and reasons == []

    def test_a_batch_that_touches_no_key_gives_no_row(self, batches):
        """Its output is empty (with multiple shards, an empty list of touched shards once
        gave the whole of the first shard's state)."""
        store = self.filled(batches)
        out = store.frame(store.update(batches[0].iloc[:0], _groups(batches[0].iloc[:0])))
        assert len(out) == 0 and list(out.columns) == list(SPEC) and out.index.name == "k"

    def test_each_batch_gives_its_keys_whole_values(self, batches):
        store = self.make()
        for i, b in enumerate(batches):
            got = store.frame(store.update(b, _groups(b)))
            want = self.truth(pd.concat(batches[:i + 1]))
            _assert_same(got, want.loc[pd.unique(b["k"])])

    def test_frame_of_some_key_groups(self, batches):
        store = self.filled(batches)
        for groups in ([0], [1, 2, 5], []):
            _assert_same(store.frame_of_groups(groups), _of_groups(self.truth(pd.concat(batches)), groups))


class TestAggregateStateInSmallShards(TestAggregateState):
    """The same contract while shards split mid-stream (at once: the background splits
    are test_state's), down to one key group a shard."""

    @pytest.fixture(autouse=True)
    def small_shards(self, monkeypatch):
        monkeypatch.setattr(_aggregate, "SHARD_KEYS", 4)

    def test_the_state_is_sharded(self, batches):
        assert len(self.filled(batches).shards) == G


class TestRocksAggregateState(TestAggregateState):
    """The same contract with the state in RocksDB (``state_backend="rocksdb"``)."""

    @pytest.fixture(autouse=True)
    def directory(self, tmp_path, monkeypatch):
        from streamlb._state import _rocks

        self.dir = str(tmp_path)
        monkeypatch.setattr(_rocks, "SCAN_CHUNK", 7)       # scans decoded in many chunks
        monkeypatch.setattr(_rocks, "BUFFER_KEYS", 5)      # batches flushed to the database mid-stream too

    def make(self) -> StateStore:
        from streamlb._state._rocks import RocksAggregateState

        return RocksAggregateState("agg", SPEC, "k", G, self.dir)

    def test_its_files_are_removed_when_it_is_closed(self, batches):
        import os

        store = self.filled(batches)
        assert os.listdir(store.path)
        store.close()
        assert not os.path.exists(store.path)

    def test_a_key_group_is_one_range_of_the_database(self, batches):
        store = self.filled(batches)
        raw = list(store.db.keys())
        groups = [int.from_bytes(bytes(k[:4]), "big") for k in raw]
        assert groups == sorted(groups) and set(groups) == set(np.flatnonzero(store.held).tolist())


class TestRocksAggregateStateBuffered(TestRocksAggregateState):
    """The same with the default buffer: batches stay in memory until a read flushes them."""

    @pytest.fixture(autouse=True)
    def directory(self, tmp_path, monkeypatch):
        from streamlb._state import _rocks

        self.dir = str(tmp_path)
        monkeypatch.setattr(_rocks, "SCAN_CHUNK", 7)


class TestRocksAggregateStateInARange(TestRocksAggregateState):
    """The same contract on a range of a database another owner holds (a window's pane):
    its keys under a prefix, beside another store's, which it never touches."""

    def make(self) -> StateStore:
        from streamlb._state._rocks import RocksAggregateState

        self.owner = RocksAggregateState("agg", SPEC, "k", G, self.dir)
        self.__dict__.setdefault("owners", []).append(self.owner)     # each store's database lives on
        self.owner.update(pd.DataFrame({"k": np.arange(50), "v": np.ones(50)}), np.arange(50) % G)
        self.owner.flush()
        return RocksAggregateState("agg", SPEC, "k", G, None, shared=(self.owner.db, b"pane0001"))

    def filled(self, batches, with_groups: bool = True):
        store = super().filled(batches, with_groups)
        assert len(self.owner) == 50 and self.owner.frame()["s"].sum() == 50
        return store

    def test_its_files_are_removed_when_it_is_closed(self, batches):
        store = self.filled(batches)
        store.close()
        assert next(iter(store.db.keys(from_key=b"pane")), b"x")[:4] != b"pane" and len(self.owner) == 50

    def test_a_key_group_is_one_range_of_the_database(self, batches):
        store = self.filled(batches)
        raw = [k for k in store.db.keys() if bytes(k[:8]) == b"pane0001"]
        groups = [int.from_bytes(bytes(k[8:12]), "big") for k in raw]
        assert groups == sorted(groups) and set(groups) == set(np.flatnonzero(store.held).tolist())


class TestStatefulMapState(StoreContract):
    def make(self) -> StatefulMapState:
        return self.make_with(running_sum, "k")

    def make_with(self, func, key_name: str) -> StatefulMapState:
        return StatefulMapState("smap", func, key_name, G)

    def truth(self, df: pd.DataFrame) -> pd.DataFrame:
        return df.groupby("k")["v"].sum().to_frame("state")

    def test_clean_finds_nothing_wrong(self):
        frame = pd.DataFrame({"k": [1], "v": ["x"]})
        assert self.make().clean(frame) == (frame, None, [])

    @pytest.mark.parametrize("key", ["k", "lambda"])
    def test_records_hold_every_column_by_name_and_a_failure_names_its_record(self, key):
        # the per-batch loop is compiled for the batch's column names (any text, quotes and
        # keywords too); timestamps come as datetime; the record that raised is named
        from streamlb.exceptions import UserFunctionError

        at = pd.to_datetime([0, 0, 10**6, 0], unit="us")
        frame = pd.DataFrame({"k": [1, 2, 1, 3], "it's \"v\"": [1.5, 2.0, 3.0, -1.0], "at": at,
                              "lambda": ["a", "b", "c", "d"]})
        seen = []

        def keep(state, record):
            seen.append(record)
            if record["it's \"v\""] < 0:
                raise ValueError("negative")
            return (state or 0) + 1, None

        store = self.make_with(keep, key)
        with pytest.raises(UserFunctionError, match=r"raised ValueError: negative on record .*'lambda': 'd'"):
            store.update(frame)
        want = frame.astype({"at": object}).to_dict("records")
        for r in want:
            r["at"] = r["at"].to_pydatetime()
        assert seen == want and all(type(r["at"]).__name__ == "datetime" for r in seen)
        assert sorted(store.frame().index) == ([1, 2] if key == "k" else ["a", "b", "c"])
        assert store.update(frame.iloc[:3]) == [None] * 3


class TestRocksStatefulMapState(TestStatefulMapState):
    """The same contract with the states in RocksDB (``state_backend="rocksdb"``)."""

    @pytest.fixture(autouse=True)
    def directory(self, tmp_path, monkeypatch):
        self.dir = str(tmp_path)
        # scans decoded in many chunks, batches to the database mid-stream too
        for name, size in {"SCAN_CHUNK": 7, "CACHE_KEYS": 5}.items():
            monkeypatch.setattr(f"streamlb._state._values.{name}", size)

    def make_with(self, func, key_name: str) -> StatefulMapState:
        from streamlb._state._values import RocksValues

        return StatefulMapState("smap", func, key_name, G, RocksValues("smap", key_name, G, self.dir))

    def test_make_store_puts_it_in_rocksdb(self):
        stage = SimpleNamespace(**vars(_stage("stateful_map")), state={"backend": "rocksdb", "dir": self.dir})
        store = make_store(stage, G)
        assert type(store.values).__name__ == "RocksValues"
        assert store.values.path.startswith(self.dir)


class TestRocksStatefulMapStateCached(TestRocksStatefulMapState):
    """The same with the default cache: batches stay in memory until a read flushes them."""

    @pytest.fixture(autouse=True)
    def directory(self, tmp_path):
        self.dir = str(tmp_path)


def _stage(kind: str) -> SimpleNamespace:
    return SimpleNamespace(kind=kind, name="op", spec=SPEC, func=running_sum, key_name="k")


def test_make_store_builds_the_store_of_each_stateful_kind():
    agg = make_store(_stage("aggregate"), G)
    assert isinstance(agg, AggregateState) and (agg.spec, agg.key_name, agg.groups) == (SPEC, "k", G)
    smap = make_store(_stage("stateful_map"), G, backend="memory")
    assert isinstance(smap, StatefulMapState) and (smap.func, smap.key_name, smap.groups) == (running_sum, "k", G)
    assert make_store(_stage("map"), G) is None


def test_make_store_rejects_an_unknown_backend_naming_the_valid_ones():
    assert BACKENDS == ("memory", "rocksdb")
    with pytest.raises(ValueError, match="'rocks'.*memory, rocksdb"):
        make_store(_stage("aggregate"), G, backend="rocks")
