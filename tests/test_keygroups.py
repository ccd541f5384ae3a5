import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamlb import KeyTypeError, RoutingTable, assign_to_key_group, stable_hash
from streamlb.keygroups import instance_for_key_group, key_group_range_for_instance


def test_hash_is_the_same_in_another_process_with_another_hash_seed():
    keys_i = np.arange(-50, 50, dtype=np.int64)
    keys_s = np.array([f"user-{i}" for i in range(100)], dtype=object)
    code = (
        "import numpy as np, sys; from streamlb import stable_hash;"
        "print(stable_hash(np.arange(-50, 50)).tolist());"
        "print(stable_hash(np.array([f'user-{i}' for i in range(100)], dtype=object)).tolist())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONHASHSEED="12345")).stdout.splitlines()
    assert eval(out[0]) == stable_hash(keys_i).tolist()
    assert eval(out[1]) == stable_hash(keys_s).tolist()


def test_int_widths_and_series_hash_alike():
    a = np.array([0, 1, 7, 2**31 - 1])
    assert (stable_hash(a.astype(np.int32)) == stable_hash(a.astype(np.int64))).all()
    assert (stable_hash(pd.Series(a)) == stable_hash(a)).all()
    s = pd.Series(["a", "bb", "ccc"], dtype="string")
    assert (stable_hash(s) == stable_hash(np.array(["a", "bb", "ccc"], dtype=object))).all()


def test_key_groups_spread_evenly():
    groups = assign_to_key_group(np.arange(200_000), 64)
    counts = np.bincount(groups, minlength=64)
    assert counts.min() > 0.9 * counts.mean() and counts.max() < 1.1 * counts.mean()


@pytest.mark.parametrize("keys,dtype", [
    (np.array([1.5, 2.0]), "float64"),
    (pd.Series(pd.to_datetime(["2026-01-01"])), "datetime64"),
])
def test_unhashable_key_types_name_the_column(keys, dtype):
    with pytest.raises(KeyTypeError, match=f"'price'.*{dtype}.*integers, booleans and strings"):
        assign_to_key_group(keys, 16, name="price")


def test_mixed_object_keys_name_the_column_and_value():
    with pytest.raises(KeyTypeError, match=r"'user'.*float.*1\.5"):
        stable_hash(np.array(["a", 1.5], dtype=object), name="user")


@given(G=st.integers(1, 4096), n=st.integers(1, 64))
def test_ranges_partition_all_key_groups(G, n):
    n = min(n, G)
    ranges = [key_group_range_for_instance(i, G, n) for i in range(n)]
    assert [g for r in ranges for g in r] == list(range(G))
    for i, r in enumerate(ranges):
        assert all(instance_for_key_group(g, G, n) == i for g in (r.start, r.stop - 1))
    table = RoutingTable.initial(G, n)
    assert table.owners.tolist() == [instance_for_key_group(g, G, n) for g in range(G)]


def test_out_of_range_arguments_are_refused():
    with pytest.raises(ValueError, match="key group 16 is outside 0..15"):
        instance_for_key_group(16, 16, 2)
    with pytest.raises(ValueError, match="instance 3 is outside 0..1"):
        key_group_range_for_instance(3, 16, 2)
    with pytest.raises(ValueError, match="names instance 5; valid instances are 0..1"):
        RoutingTable(np.array([0, 1, 5]), parallelism=2)
    with pytest.raises(ValueError, match="key-groups must be an integer"):
        assign_to_key_group(np.arange(3), 0)
