"""The state stores against pandas, batch by batch, with no cluster."""
import contextlib

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamlb._state import _aggregate as _state
from streamlb._state import AggregateState, StatefulMapState

SPEC = {"n": ("v", "count"), "s": ("v", "sum"), "lo": ("v", "min"), "hi": ("v", "max"),
        "avg": ("v", "mean"), "ni": ("i", "count"), "si": ("i", "sum"), "mi": ("i", "max")}


@settings(max_examples=60, deadline=None)
@given(
    keys=hnp.arrays(np.int64, st.integers(1, 300), elements=st.integers(-20, 20)),
    cuts=st.lists(st.integers(0, 300), max_size=5),
    shard_keys=st.sampled_from([1 << 18, 2, 5]),
    threaded=st.booleans(),
    data=st.data(),
)
def test_aggregate_state_equals_pandas(keys, cuts, shard_keys, threaded, data):
    """Tiny shard sizes make shards split mid-stream, down to one key group each, at once
    or in the background thread."""
    with _shard_size(shard_keys, threaded):
        _check_aggregate(keys, cuts, data)


@contextlib.contextmanager
def _shard_size(keys: int, threaded: bool = False):
    saved = _state.SHARD_KEYS, _state.SPLIT_IN_THREAD
    _state.SHARD_KEYS = keys
    _state.SPLIT_IN_THREAD = 0 if threaded else saved[1]
    try:
        yield
    finally:
        _state.SHARD_KEYS, _state.SPLIT_IN_THREAD = saved


def _maybe_settle(store: AggregateState, data) -> None:
    """Sometimes let a background split finish before the next step, so its pieces are
    put in place then, not at an arbitrary later one."""
    settle = data.draw(st.booleans())       # drawn every time: hypothesis replays the draws
    if settle and store._splitting is not None:
        store._splitting.future.result()


def _check_counts(store: AggregateState) -> None:
    """Each shard's live keys per key group match its slots (what carving, compaction and
    cuts go by)."""
    for sh in store.shards:
        n = sh.index.n
        kg = sh.index.key_groups[:n][sh.present[:n]]
        assert ((kg >= sh.lo) & (kg < sh.hi)).all()
        np.testing.assert_array_equal(sh.held, np.bincount(kg - sh.lo, minlength=sh.hi - sh.lo))


def _check_aggregate(keys, cuts, data):
    n = len(keys)
    v = data.draw(hnp.arrays(np.float64, n, elements=st.one_of(
        st.integers(-1000, 1000).map(float), st.just(np.nan))))
    i = data.draw(hnp.arrays(np.int64, n, elements=st.integers(-10**12, 10**12)))
    df = pd.DataFrame({"k": keys, "v": v, "i": i})
    store = AggregateState("agg", SPEC, "k", 16)
    bounds = sorted({0, n, *[c % (n + 1) for c in cuts]})
    for lo, hi in zip(bounds, bounds[1:]):
        part = df.iloc[lo:hi]
        store.update(part)
        _maybe_settle(store, data)
    if _state.SHARD_KEYS == 2 and df.k.nunique() > 3 and _state.SPLIT_IN_THREAD:   # split sizes: 2 to 3 keys
        assert len(store.shards) > 1
    _check_counts(store)
    got = store.frame().sort_index()
    want = df.groupby("k").agg(**SPEC)
    assert got.index.tolist() == want.index.tolist()
    for c in SPEC:
        np.testing.assert_array_equal(got[c].to_numpy(dtype=float), want[c].to_numpy(dtype=float), err_msg=c)


def test_background_splits_keep_every_update():
    """Shards split in the background while batches keep coming and key groups move out
    and back: updates made between the snapshot and the pieces' adoption (new keys, keys
    cut away, keys back in their old slots) are all kept, and nothing cut comes back."""
    from streamlb.keygroups import assign_to_key_group

    rng = np.random.default_rng(7)
    G = 32
    owner = np.zeros(G, np.int64)
    with _shard_size(64, threaded=True):
        stores = [AggregateState("agg", SPEC, "k", G), AggregateState("agg", SPEC, "k", G)]
        frames = []
        for step in range(300):
            keys = rng.integers(0, 4000, 40)
            df = pd.DataFrame({"k": keys, "v": rng.integers(-9, 9, 40).astype(float), "i": keys})
            frames.append(df)
            mine = owner[assign_to_key_group(keys, G)]
            for i in (0, 1):
                stores[i].update(df[mine == i])
            if step % 7 == 0 and stores[0]._splitting is not None:
                stores[0]._splitting.future.result()
            # groups 0..15 leave store 0 (dead slots there); 0..3 come back (revived slots)
            if step % 10 == 5 and (step < 160 or 200 < step < 240):
                g = step // 10 if step < 160 else step // 10 - 20
                src = owner[g]
                stores[1 - src].install(stores[src].cut({g}))
                owner[g] = 1 - src
        assert len(stores[0].shards) > 16
    got = pd.concat([s.frame() for s in stores]).sort_index()
    want = pd.concat(frames).groupby("k").agg(**SPEC)
    assert got.index.tolist() == want.index.tolist()
    for c in SPEC:
        np.testing.assert_array_equal(got[c].to_numpy(dtype=float), want[c].to_numpy(dtype=float), err_msg=c)


def test_string_keys_and_emitted_slots():
    store = AggregateState("agg", {"n": ("v", "count")}, "k", 16)
    store.update(pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]}))
    touched = store.frame(store.update(pd.DataFrame({"k": ["c", "a"], "v": [1, 2]})))
    assert touched["n"].to_dict() == {"c": 1, "a": 3}


def test_stateful_map_keeps_per_key_order():
    store = StatefulMapState("m", lambda s, r: ((s or []) + [r["x"]], len(s or [])), "k", 16)
    outs = store.update(pd.DataFrame({"k": [1, 2, 1, 1], "x": [10, 20, 30, 40]}))
    assert outs == [0, 0, 1, 2]
    assert store.frame()["state"].to_dict() == {1: [10, 30, 40], 2: [20]}


@settings(max_examples=60, deadline=None)
@given(
    keys=hnp.arrays(np.int64, st.integers(1, 400), elements=st.integers(0, 60)),
    moves=st.lists(st.tuples(st.integers(0, 400), st.sets(st.integers(0, 7), min_size=1)), max_size=6),
    shard_keys=st.sampled_from([1 << 18, 2, 5]),
    threaded=st.booleans(),
    data=st.data(),
)
def test_cut_and_install_move_state_without_loss(keys, moves, shard_keys, threaded, data):
    """Two owners, key groups moving between them mid-stream: merged state equals pandas,
    with shards splitting (tiny shard sizes; at once or in the background) as state comes
    and goes. Some keys of a group are pulled one by one first (the lazy strategy), then
    the rest of the group."""
    with _shard_size(shard_keys, threaded):
        _check_moves(keys, moves, data)


def _check_moves(keys, moves, data):
    from streamlb.keygroups import assign_to_key_group

    G = 8
    n = len(keys)
    v = data.draw(hnp.arrays(np.float64, n, elements=st.one_of(
        st.integers(-50, 50).map(float), st.just(np.nan))))
    df = pd.DataFrame({"k": keys, "v": v, "i": keys * 3})
    groups = assign_to_key_group(keys, G)
    owner = np.array([g % 2 for g in range(G)])
    stores = [AggregateState("agg", SPEC, "k", G), AggregateState("agg", SPEC, "k", G)]
    at = sorted(moves, key=lambda m: m[0])
    pos = 0
    for cut_at, moved in at + [(n, set())]:
        cut_at = min(cut_at, n)
        if cut_at > pos:
            part, g = df.iloc[pos:cut_at], groups[pos:cut_at]
            for i in (0, 1):
                rows = part[owner[g] == i]
                if len(rows):
                    stores[i].update(rows)
                _maybe_settle(stores[i], data)
            pos = cut_at
        for grp in moved:
            src = owner[grp]
            pulled = np.array(data.draw(st.lists(st.integers(-5, 65), max_size=4)), np.int64)
            pulled = pulled[assign_to_key_group(pulled, G) == grp] if len(pulled) else pulled
            if data.draw(st.booleans()):
                stores[1 - src].reserve({grp})      # as the new owner does when prepared
            before = stores[src].contains(pulled)
            stores[1 - src].install(stores[src].cut_keys(pulled))
            assert (stores[1 - src].contains(pulled) == before).all()
            assert not stores[src].contains(pulled).any()
            stores[1 - src].install(stores[src].cut({grp}))
            owner[grp] = 1 - src
            for i in (0, 1):
                _maybe_settle(stores[i], data)
                _check_counts(stores[i])
    got = pd.concat([s.frame() for s in stores]).sort_index()
    assert not got.index.duplicated().any()
    want = df.groupby("k").agg(**SPEC)
    assert got.index.tolist() == want.index.tolist()
    for c in SPEC:
        np.testing.assert_array_equal(got[c].to_numpy(dtype=float), want[c].to_numpy(dtype=float), err_msg=c)
    for i in (0, 1):   # every key sits with the owner of its group
        held = stores[i].frame().index.to_numpy()
        assert (owner[assign_to_key_group(held, G)] == i).all() if len(held) else True


def test_stateful_map_cut_and_install():
    a = StatefulMapState("m", lambda s, r: ((s or 0) + 1, None), "k", 8)
    b = StatefulMapState("m", lambda s, r: ((s or 0) + 1, None), "k", 8)
    a.update(pd.DataFrame({"k": list(range(20))}))
    from streamlb.keygroups import assign_to_key_group

    g = set(assign_to_key_group(np.arange(20), 8)[:3].tolist())
    b.install(a.cut(g))
    ka, kb = set(a.frame().index), set(b.frame().index)
    assert ka | kb == set(range(20)) and not ka & kb
    assert set(assign_to_key_group(np.array(list(kb)), 8).tolist()) <= g


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 5000), labels=hnp.arrays(np.int64, st.integers(0, 300), elements=st.integers(0, 4999)))
def test_float_scatter_add_matches_ufunc_at(n, labels):
    from streamlb._state._shards import _add_float

    labels = labels % n
    values = np.arange(len(labels), dtype=float)
    want = np.zeros(n)
    np.add.at(want, labels, values)
    got = np.zeros(n)
    _add_float(got, labels, values, n)
    np.testing.assert_array_equal(got, want)


def test_partial_aggregates_combine_to_the_unsplit_state_even_across_dtypes():
    # a helper that saw the column only as float (a null in its batch) sends float partials
    # to a home holding ints: the result is what one state applying every batch holds
    spec = {"n": ("v", "count"), "s": ("v", "sum"), "lo": ("v", "min"), "hi": ("v", "max"), "m": ("v", "mean")}
    first = pd.DataFrame({"k": [1, 1, 2], "v": np.array([5, 7, 9], dtype=np.int64)})
    second = pd.DataFrame({"k": [1, 2, 3], "v": [3.0, np.nan, np.nan]})
    home, helper, whole = (AggregateState("a", spec, "k", 64) for _ in range(3))
    home.update(first)
    touched = home.combine(helper.partial(second))
    assert sorted(home.frame(touched).index) == [1, 2, 3]
    assert len(helper) == 0                              # a helper keeps nothing
    whole.update(first)
    whole.update(second)
    pd.testing.assert_frame_equal(home.frame().sort_index(), whole.frame().sort_index())


def test_a_shard_that_gives_a_quarter_of_its_keys_away_is_rebuilt_with_the_rest():
    """Memory follows the keys held: once a quarter of a shard's slots are dead it holds
    only its live keys, and keeps counting exactly afterwards (moved keys may come back)."""
    from streamlb.keygroups import assign_to_key_group

    G = 16
    keys = np.arange(4000, dtype=np.int64)
    df = pd.DataFrame({"k": np.concatenate([keys, keys[::3]]), "v": 1.0, "i": 1})
    groups = assign_to_key_group(keys, G)
    a, b = AggregateState("agg", SPEC, "k", G), AggregateState("agg", SPEC, "k", G)
    a.update(df)
    sh = a.shards[0]
    small = [0]                                  # about 1/16 of the keys: no rebuild yet
    b.install(a.cut(small))
    assert sh.index.n == len(keys) and sh.live == len(keys) - (groups == 0).sum()
    more = [1, 2, 3, 4]                          # now past a quarter dead
    b.install(a.cut(more))
    live = ~np.isin(groups, small + more)
    assert sh.index.n == sh.live == live.sum()
    assert sorted(sh.index.keys[: sh.index.n].tolist()) == keys[live].tolist()
    later = pd.DataFrame({"k": np.array([7, 8, 9, 4001], np.int64), "v": 2.0, "i": 1})
    on_a = ~np.isin(assign_to_key_group(later.k.to_numpy(), G), small + more)
    a.update(later[on_a])
    b.update(later[~on_a])
    got = pd.concat([a.frame(), b.frame()]).sort_index()
    want = pd.concat([df, later]).groupby("k").agg(**SPEC)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_installs_of_a_few_groups_at_a_time_do_not_fragment_the_new_owner():
    """A fluid migration installs a few key groups per epoch, each epoch's groups prepared
    (reserved) first. The new owner's state keeps few shards (one per epoch would make
    every batch pay the per-shard cost that many times) and stays exact."""
    from streamlb.keygroups import assign_to_key_group

    G, per_epoch = 256, 3
    with _shard_size(4096):
        keys = np.arange(60_000, dtype=np.int64)
        df = pd.DataFrame({"k": keys, "v": 1.0, "i": 1})
        groups = assign_to_key_group(keys, G)
        old, new = AggregateState("agg", SPEC, "k", G), AggregateState("agg", SPEC, "k", G)
        old.update(df)
        moving = list(range(G // 2, G))
        for i in range(0, len(moving), per_epoch):
            step = moving[i:i + per_epoch]
            new.reserve(step)
            new.install(old.cut(step))
            if new._splitting is not None:
                new._splitting.future.result()
        held = int(np.isin(groups, moving).sum())
        assert len(new) == held
        # a shard takes installs until it holds SHARD_KEYS / 2 keys, so with the pieces of
        # splits they average over SHARD_KEYS / 4: 31 here, where one per epoch made 43
        assert len([sh for sh in new.shards if sh.live]) <= held // (4096 // 4) + 2
        _check_counts(new)
        got = pd.concat([old.frame(), new.frame()]).sort_index()
        pd.testing.assert_frame_equal(got, df.groupby("k").agg(**SPEC), check_dtype=False)


@settings(max_examples=40, deadline=None)
@given(keys=hnp.arrays(np.int64, st.integers(2, 200), elements=st.integers(0, 30)), data=st.data())
def test_install_merges_into_keys_the_new_owner_already_holds(keys, data):
    """Lazy by merging: the new owner applies a moved group's rows at once, then the old
    state is installed on top; the result equals pandas over all rows, whichever side saw
    a null (a float column) or only integers."""
    from streamlb.keygroups import assign_to_key_group

    G = 4
    n = len(keys)
    v = data.draw(hnp.arrays(np.float64, n, elements=st.one_of(st.integers(-50, 50).map(float), st.just(np.nan))))
    df = pd.DataFrame({"k": keys, "v": v, "i": keys * 3})
    split = data.draw(st.integers(1, n - 1))
    old, new = AggregateState("agg", SPEC, "k", G), AggregateState("agg", SPEC, "k", G)
    old.update(df.iloc[:split])                 # before the switch, at the old owner
    later = df.iloc[split:]
    moving = assign_to_key_group(later.k.to_numpy(), G) == 0
    new.update(later[moving])                   # after it: the moving group's rows at the new owner
    old.update(later[~moving])
    new.install(old.cut({0}))                   # the old state drains in
    got = pd.concat([old.frame(), new.frame()]).sort_index()
    assert not got.index.duplicated().any()
    want = df.groupby("k").agg(**SPEC)
    for c in SPEC:
        np.testing.assert_array_equal(got[c].to_numpy(dtype=float), want[c].to_numpy(dtype=float), err_msg=c)
