"""Sources meet bad input and say so: a corrupt Parquet file in a fixed input is refused
naming it."""
from __future__ import annotations


import pytest
from streamz import Stream

import streamlb
from streamlb import InputPathError

from test_directory_source import _frame


@pytest.mark.parametrize("which", ["first", "last"])
def test_a_corrupt_parquet_file_in_a_fixed_input_is_refused_naming_it(two_workers, tmp_path, which):
    root = tmp_path / "input"
    root.mkdir()
    for i in range(3):
        _frame(i, 2_000).to_parquet(root / f"part-{i}.parquet")
    whole = (root / "part-0.parquet").read_bytes()
    name = "a-corrupt.parquet" if which == "first" else "z-corrupt.parquet"
    (root / name).write_bytes(whole[: len(whole) // 2])      # cut short: no footer
    src = Stream.from_parquet(str(root), event_time="value")
    src.key_by("key").aggregate({"n": ("value", "count")}, name="totals")
    with pytest.raises(InputPathError) as err:
        streamlb.run(src, client=two_workers)
    msg = str(err.value)
    assert str(root / name) in msg and "not a readable Parquet file" in msg and "start with '_'" in msg, msg
