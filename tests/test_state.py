"""The state stores against pandas, batch by batch, with no cluster."""
import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamlb._state import AggregateState, StatefulMapState

SPEC = {"n": ("v", "count"), "s": ("v", "sum"), "lo": ("v", "min"), "hi": ("v", "max"),
        "avg": ("v", "mean"), "ni": ("i", "count"), "si": ("i", "sum"), "mi": ("i", "max")}


@settings(max_examples=60, deadline=None)
@given(
    keys=hnp.arrays(np.int64, st.integers(1, 300), elements=st.integers(-20, 20)),
    cuts=st.lists(st.integers(0, 300), max_size=5),
    data=st.data(),
)
def test_aggregate_state_equals_pandas(keys, cuts, data):
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
    got = store.frame().sort_index()
    want = df.groupby("k").agg(**SPEC)
    assert got.index.tolist() == want.index.tolist()
    for c in SPEC:
        np.testing.assert_array_equal(got[c].to_numpy(dtype=float), want[c].to_numpy(dtype=float), err_msg=c)


def test_string_keys_and_emitted_slots():
    store = AggregateState("agg", {"n": ("v", "count")}, "k", 16)
    labels = store.update(pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]}))
    labels = store.update(pd.DataFrame({"k": ["c", "a"], "v": [1, 2]}))
    touched = store.frame(pd.unique(labels))
    assert touched["n"].to_dict() == {"c": 1, "a": 3}


def test_stateful_map_keeps_per_key_order():
    store = StatefulMapState("m", lambda s, r: ((s or []) + [r["x"]], len(s or [])), "k")
    outs = store.update(pd.DataFrame({"k": [1, 2, 1, 1], "x": [10, 20, 30, 40]}))
    assert outs == [0, 0, 1, 2]
    assert store.frame()["state"].to_dict() == {1: [10, 30, 40], 2: [20]}
