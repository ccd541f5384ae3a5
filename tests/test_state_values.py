"""The keyed-values primitive (``streamlb._state._values``), one set of tests for both of its
backends, each checked against a plain dict fed the same batches."""
from __future__ import annotations

import numpy as np
import pytest

from streamlb._state._values import KeyedValues, MemoryValues, RocksValues
from streamlb.keygroups import assign_to_key_group

G = 8


@pytest.fixture(params=["memory", "rocksdb"])
def make(request, tmp_path, monkeypatch):
    from streamlb._state import _values

    monkeypatch.setattr(_values, "SCAN_CHUNK", 5)         # scans in many chunks
    monkeypatch.setattr(_values, "WRITE_CHUNK", 3)        # installs in many write batches
    monkeypatch.setattr(_values, "CACHE_KEYS", 10)        # batches go to the database mid-stream
    if request.param == "memory":
        return lambda: MemoryValues("k", G)
    return lambda: RocksValues("op", "k", G, str(tmp_path))


def _groups(keys: list) -> list:
    return assign_to_key_group(np.array(keys, dtype=object if isinstance(keys[0], str) else None), G).tolist()


@pytest.fixture(params=["int", "str"])
def stream(request) -> list[list]:
    """Batches of keys (skewed, repeated, negative integers too), as Python lists."""
    rng = np.random.default_rng(5)
    keys = (rng.zipf(1.3, 700) % 120 - 40).tolist()
    if request.param == "str":
        keys = [f"k{k}" for k in keys]
    return [keys[a:b] for a, b in [(0, 1), (1, 300), (300, 700)]]


def _apply(values: KeyedValues, stream: list[list], truth: dict | None = None, hashed: bool = True) -> None:
    """Count each key's records and keep its last batch number, through view and write."""
    for i, batch in enumerate(stream):
        distinct = list(dict.fromkeys(batch))
        view = values.view(distinct, _groups(distinct) if hashed else None)
        for k in batch:
            n, _ = view.get(k) or (0, None)
            view[k] = (n + 1, i)
            if truth is not None:
                truth[k] = (n + 1, i)
        values.write(view)


def _as_dict(values: KeyedValues) -> dict:
    keys, vals = values.items()
    assert len(keys) == len(set(keys)) == len(values)
    return dict(zip(keys, vals))


def test_view_and_write_keep_what_a_dict_keeps(make, stream):
    values, truth = make(), {}
    assert values.key_kind() is None and len(values) == 0
    _apply(values, stream, truth)
    assert _as_dict(values) == truth
    unhashed = make()
    _apply(unhashed, stream, hashed=False)
    assert _as_dict(unhashed) == truth
    assert values.key_kind() == ("O" if isinstance(stream[0][0], str) else "i")
    want = np.bincount(_groups(list(truth)), minlength=G)
    np.testing.assert_array_equal(values.keys_per_group(range(G)), want)
    held = list(truth)[:5]
    assert values.contains(held, _groups(held)).all() and values.contains(held, None).all()
    absent = [10**9] if isinstance(held[0], int) else ["nowhere"]
    assert not values.contains(absent, None).any()


def test_a_failed_batch_keeps_what_it_set_before_failing(make, stream):
    """The states set before a record raised are written; keys never reached hold nothing."""
    values = make()
    batch = list(dict.fromkeys(stream[1]))
    view = values.view(batch, _groups(batch))
    view[batch[0]] = "first"
    values.write(view)
    assert _as_dict(values) == {batch[0]: "first"}
    assert values.keys_per_group(range(G)).sum() == 1


def test_moves_conserve_every_value(make, stream):
    """Snapshots, cuts of key groups and of single keys, installed elsewhere, give back the
    whole state exactly, each key in one place."""
    a, b, truth = make(), make(), {}
    _apply(a, stream, truth)
    snap = a.snapshot({1, 2, 6})
    assert _as_dict(a) == truth
    assert snap[0] == {k: v for k, v in truth.items() if _groups([k])[0] in (1, 2, 6)}
    assert snap[1] == _groups(list(snap[0]))
    keys = [k for k in truth if _groups([k])[0] in (0, 3)][:6] + ([10**9] if isinstance(stream[0][0], int) else ["x"])
    single = a.cut_keys(keys + keys[:2], None)                  # a key asked twice is taken once
    assert list(single[0]) == keys[:-1] and single[1] == _groups(keys[:-1])
    b.install(*single)
    b.install(*a.cut([1, 2, 3, 0]))
    assert a.keys_per_group([0, 1, 2, 3]).tolist() == [0, 0, 0, 0]
    assert a.snapshot([0, 1, 2, 3]) == ({}, [])
    both = {**_as_dict(a), **_as_dict(b)}
    assert both == truth and len(a) + len(b) == len(truth)
    b.install({keys[0]: (100, None)}, _groups(keys[:1]))       # an install replaces a key's value
    assert _as_dict(b)[keys[0]] == (100, None) and len(a) + len(b) == len(truth)
    _apply(b, [[keys[0]] * 3])                                   # and batches go on over moved keys
    assert _as_dict(b)[keys[0]] == (103, 0)


def test_rocksdb_keeps_a_key_group_as_one_range_and_its_files_until_closed(tmp_path, stream):
    import os

    values = RocksValues("op", "k", G, str(tmp_path))
    _apply(values, stream)
    values.flush()
    assert not values.cache
    groups = [int.from_bytes(bytes(k[:4]), "big") for k in values.db.keys()]
    assert groups == sorted(groups) and set(groups) == set(np.flatnonzero(values.held).tolist())
    assert os.listdir(values.path)
    values.close()
    assert not os.path.exists(values.path)
