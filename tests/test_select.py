"""``select``: the columns kept, and the columns a Parquet source reads because of it
(docs/user-guide.md, "Reading only the columns you use")."""
from __future__ import annotations

import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.exceptions import PipelineError, SchemaError
from streamlb.planner import plan


def _plan(src):
    return plan(src, workers=2, key_groups=64, batch_size=1000)


def test_select_prunes_the_read_and_the_output_is_exact(two_workers, disordered, disordered_frame):
    src = Stream.from_parquet(disordered, batch_size=5000).with_watermark("event_time", delay="3s")
    out = []
    src.select(["value", "key"]).sink(out.append)
    assert _plan(src).stages[0].columns == ["key", "value", "event_time"]      # the files' order
    with streamlb.run(src, client=two_workers) as job:
        job.wait()
    got = pd.concat(out, ignore_index=True)
    assert list(got.columns) == ["value", "key"]
    want = disordered_frame[["value", "key"]]
    pd.testing.assert_frame_equal(got.sort_values(["key", "value"]).reset_index(drop=True),
                                  want.sort_values(["key", "value"]).reset_index(drop=True))


def _write_into(df):
    df["value"] += 1000.0               # in place, into the selected frame
    df.loc[df.index[:3], "key"] = -1
    return df


@pytest.mark.parametrize("other", ["map", "select"])
def test_a_step_writing_into_selected_columns_leaves_the_batch_as_it_was(
        two_workers, disordered, disordered_frame, other):
    """``select`` passes its columns on uncopied; a step that writes into them must not
    change the batch another branch of the same source reads (copy-on-write). ``other``:
    the other branch without ``select`` (the source reads every column, so the selected
    ones go on in a new frame), or with the same one (the batch holds exactly them)."""
    src = Stream.from_parquet(disordered, batch_size=5000)
    written, plain = [], []
    src.select(["key", "value"]).map(_write_into).sink(written.append)      # runs first
    if other == "map":
        src.map(lambda df: df[["key", "value"]]).sink(plain.append)
    else:
        src.select(["key", "value"]).sink(plain.append)
        assert _plan(src).stages[0].columns == ["key", "value"]
    with streamlb.run(src, client=two_workers) as job:
        job.wait()
    got = pd.concat(plain, ignore_index=True)
    want = disordered_frame[["key", "value"]]
    pd.testing.assert_frame_equal(got.sort_values(["key", "value"]).reset_index(drop=True),
                                  want.sort_values(["key", "value"]).reset_index(drop=True))
    changed = pd.concat(written, ignore_index=True)
    assert changed.value.sum() == pytest.approx(want.value.sum() + 1000.0 * len(want))


def test_a_consumer_without_select_reads_every_column(disordered):
    src = Stream.from_parquet(disordered)
    src.select(["key"]).sink(print)
    assert _plan(src).stages[0].columns == ["key"]
    src.map(lambda df: df).sink(print)          # a second path that may read anything
    assert _plan(src).stages[0].columns is None
    both = Stream.from_parquet(disordered)
    both.select(["key"]).sink(print)
    both.select(["value"]).sink(print)
    assert _plan(both).stages[0].columns == ["key", "value"]


def test_select_of_a_column_not_in_the_files_is_refused_when_planned(disordered):
    src = Stream.from_parquet(disordered)
    src.select(["key", "price"]).sink(print)
    with pytest.raises(SchemaError, match=r"select: column 'price' is not in the files of source .*their columns: key, "
                                          r"value, event_time"):
        _plan(src)


def test_select_of_a_column_a_batch_lacks_fails_the_job_naming_it(client):
    src = Stream.from_iterable([{"k": 1, "v": 2}])
    src.map(lambda df: df.rename(columns={"k": "kk"})).select(["k"]).sink(print)
    with streamlb.run(src, client=client) as job:
        with pytest.raises(SchemaError, match=r"select\(\['k'\]\): column 'k' is not in the batch; its columns: kk, v"):
            job.wait(timeout=60)


@pytest.mark.parametrize("bad", ["key", [], ["key", "key"], [1], None])
def test_bad_columns_are_refused_naming_what_is_valid(bad):
    with pytest.raises(PipelineError, match="select: columns must be a non-empty list of distinct column names"):
        Stream.from_iterable([]).select(bad)


def test_a_key_that_select_drops_is_named_before_the_job_starts(disordered):
    src = Stream.from_parquet(disordered)
    src.select(["value"]).key_by("key").aggregate({"n": ("value", "count")}, name="agg")
    with pytest.raises(SchemaError, match=r"operator 'agg' needs column 'key', which is not in .* after "
                                          r"select\(\['value'\]\); columns there: value"):
        _plan(src)
