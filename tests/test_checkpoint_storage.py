"""Checkpoint storage: snapshot files, manifests, checksums and retention, with no cluster.

Round trips go through real stores: a store's ``snapshot`` is written, some key groups are
read back and ``install``-ed into a fresh store, whose ``frame`` is compared with pandas
over the input rows of those groups.
"""
from __future__ import annotations

import json
import os
import time
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from streamlb._checkpoint import _files as files_io, _format as format_io, _manifest as manifest_io, \
    _paths as paths_io, _retention as retention_io
from streamlb._state import AggregateState, StatefulMapState
from streamlb.exceptions import CheckpointError
from streamlb.keygroups import assign_to_key_group

G = 64
SPEC = {"n": ("v", "count"), "s": ("v", "sum"), "lo": ("v", "min"), "hi": ("v", "max"), "m": ("v", "mean")}
SUBSET = [0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 63]


# -- helpers ---------------------------------------------------------------------------------

def _frame(kind: str, n: int = 3000, seed: int = 0) -> pd.DataFrame:
    """Rows of skewed int or string keys and float values (a few NaN)."""
    rng = np.random.default_rng(seed)
    keys = rng.zipf(1.2, n) % 500
    v = rng.normal(size=n)
    v[rng.random(n) < 0.02] = np.nan
    k = keys if kind == "int" else np.array([f"user-{x}" for x in keys], dtype=object)
    return pd.DataFrame({"k": k, "v": v})


def _in_groups(df: pd.DataFrame, groups) -> pd.DataFrame:
    g = assign_to_key_group(df["k"].to_numpy(), G, name="k")
    return df[np.isin(g, list(groups))]


def _manifest(operator: str, *written: dict, base: str = "..") -> dict:
    """A manifest over snapshot results, later results taking their groups over."""
    files, groups = {}, {}
    for w in written:
        if w["file"] is None:
            continue
        files[w["file"]] = {"bytes": w["bytes"], "crc32": w["crc32"]}
        groups.update({str(g): [w["file"], *loc] for g, loc in w["groups"].items()})
    return {"format": format_io.FORMAT, "base": base, "files": files,
            "operators": {operator: {"kind": "aggregate", "groups": groups}}}


def _agg_truth(df: pd.DataFrame) -> pd.DataFrame:
    g = df.groupby("k")["v"]
    return pd.DataFrame({"n": g.count(), "s": g.sum(), "lo": g.min(), "hi": g.max(), "m": g.mean()})


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_index()


def _groups_of_blob(blob: dict) -> set:
    return {int(g) for p in blob["parts"] for g in p["key_groups"]}


# -- aggregate -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["int", "str"])
def test_aggregate_round_trip_of_a_subset_of_groups(tmp_path, kind):
    df = _frame(kind)
    store = AggregateState("agg", SPEC, "k", G)
    store.update(df)
    written = files_io.write_snapshot(str(tmp_path), "data/agg/a.arrow", "aggregate", store.snapshot(range(G)))
    assert written["file"] == "data/agg/a.arrow"
    assert written["bytes"] == os.path.getsize(tmp_path / "data" / "agg" / "a.arrow")
    # [offset, rows(, keys)]: a group's keys lie in its rows (all of them, in a sorted file)
    assert sum(loc[-1] for loc in written["groups"].values()) == len(store)
    table = pa.ipc.open_file(str(tmp_path / "data" / "agg" / "a.arrow")).read_all()
    kg = table.column("key_group").to_numpy()
    for g, loc in written["groups"].items():
        assert (kg[loc[0]:loc[0] + loc[1]] == g).sum() == loc[-1] == (kg == g).sum()

    manifest_io.write_manifest(str(tmp_path), "chk-000001", _manifest("agg", written))
    manifest, base = manifest_io.read_manifest(str(tmp_path))
    assert base == str(tmp_path)
    manifest_io.verify(base, manifest)
    blob = files_io.read_groups(base, manifest, "agg", "aggregate", SUBSET)
    assert _groups_of_blob(blob) <= set(SUBSET)
    assert blob["dtypes"] == store.dtypes

    fresh = AggregateState("agg", SPEC, "k", G)
    fresh.install(blob)
    got = _sorted(fresh.frame())
    expected = _sorted(store.frame())
    expected = expected[np.isin(assign_to_key_group(expected.index.to_numpy(), G, name="k"), SUBSET)]
    pd.testing.assert_frame_equal(got, expected)                          # exact round trip
    pd.testing.assert_frame_equal(got, _sorted(_agg_truth(_in_groups(df, SUBSET))),
                                  check_dtype=False, check_exact=False, check_names=False)
    assert {p["keys"].dtype for p in blob["parts"]} == {np.dtype(np.int64 if kind == "int" else object)}


def test_aggregate_encode_decode_keeps_parts_tables_and_dtypes():
    """Parts with different tables come back as parts with exactly those tables."""
    keys = np.array(["a", "b", "c", "d"], dtype=object)
    blob = {"dtypes": {"v": np.dtype(np.int64), "w": np.dtype(np.float64)}, "parts": [
        {"keys": keys[:2], "key_groups": np.array([5, 1]),
         "tables": {("cnt", "v"): np.array([2, 3]), ("sum", "v"): np.array([-7, 2**62])}},
        {"keys": keys[2:], "key_groups": np.array([1, 0]),
         "tables": {("cnt", "v"): np.array([1, 1]), ("max", "w"): np.array([np.nan, -0.5])}},
    ]}
    table = format_io.encode("aggregate", blob)
    assert table.column_names[:2] == ["key_group", "key"]
    assert table.schema.field("key_group").type == pa.int32()
    assert table.column("key_group").to_pylist() == [0, 1, 1, 5]          # stable by group
    assert table.column("key").to_pylist() == ["d", "b", "c", "a"]
    back = format_io.decode("aggregate", table)
    assert back["dtypes"] == blob["dtypes"]
    rows = {}
    for part in back["parts"]:
        assert part["keys"].dtype == object and part["key_groups"].dtype == np.int64
        for i, k in enumerate(part["keys"]):
            rows[k] = (int(part["key_groups"][i]),
                       {t: (v[i], v.dtype) for t, v in part["tables"].items()})
    assert rows["a"] == (5, {("cnt", "v"): (2, np.int64), ("sum", "v"): (-7, np.int64)})
    assert rows["b"][1][("sum", "v")] == (2**62, np.int64)
    assert set(rows["c"][1]) == {("cnt", "v"), ("max", "w")}
    assert np.isnan(rows["c"][1][("max", "w")][0])
    assert rows["d"][1][("max", "w")] == (-0.5, np.float64)


@pytest.mark.parametrize("keys", [
    np.array([3, -1, 2**40], np.int64),
    np.array([1, 2, 2**63 + 5], np.uint64),
    np.array([True, False], dtype=object),
    np.array([1.5, "x", (1, 2)], dtype=object),          # mixed: pickled per key
])
def test_aggregate_keys_come_back_with_their_dtype(keys):
    blob = {"dtypes": {"v": np.dtype(np.int64)}, "parts": [
        {"keys": keys, "key_groups": np.arange(len(keys))[::-1].copy(),
         "tables": {("cnt", "v"): np.arange(len(keys))}}]}
    back = format_io.decode("aggregate", format_io.encode("aggregate", blob))
    (part,) = back["parts"]
    assert part["keys"].dtype == keys.dtype
    assert list(part["keys"]) == list(keys[::-1])
    assert [type(k) for k in part["keys"]] == [type(k) for k in keys[::-1]]


def test_empty_blob_writes_nothing(tmp_path):
    store = AggregateState("agg", SPEC, "k", G)
    out = files_io.write_snapshot(str(tmp_path), "data/agg/x.arrow", "aggregate", store.snapshot(range(G)))
    assert out == {"file": None, "bytes": 0, "crc32": 0, "groups": {}}
    assert not (tmp_path / "data").exists()
    smap = StatefulMapState("m", lambda s, r: (s, None), "k", G)
    out = files_io.write_snapshot(str(tmp_path), "data/m/x.arrow", "stateful_map", smap.snapshot(range(G)))
    assert out["file"] is None


def test_read_groups_holding_nothing_is_an_empty_blob(tmp_path):
    manifest = _manifest("agg")
    manifest["operators"]["m"] = {"groups": {}}
    assert files_io.read_groups(str(tmp_path), manifest, "agg", "aggregate", range(G)) == {"dtypes": {}, "parts": []}
    blob = files_io.read_groups(str(tmp_path), manifest, "m", "stateful_map", [1, 2])
    assert blob["states"] == {} and blob["key_groups"].dtype == np.int64 and len(blob["key_groups"]) == 0
    with pytest.raises(CheckpointError, match="'nope'"):
        files_io.read_groups(str(tmp_path), manifest, "nope", "aggregate", [1])


# -- stateful map ----------------------------------------------------------------------------

def history(state, record):
    """A stateful map's function: (count, last three values) per key, a tuple holding a list."""
    n, last = state or (0, [])
    return (n + 1, (last + [record["v"]])[-3:]), n


@pytest.mark.parametrize("kind", ["int", "str"])
def test_stateful_map_round_trip_of_a_subset_of_groups(tmp_path, kind):
    df = _frame(kind, n=2000, seed=1)
    store = StatefulMapState("m", history, "k", G)
    store.update(df)
    written = files_io.write_snapshot(str(tmp_path), "data/m/a.arrow", "stateful_map", store.snapshot(range(G)))
    manifest = _manifest("m", written, base=".")
    path = manifest_io.write_manifest(str(tmp_path), ".", manifest)            # a savepoint
    assert path == str(tmp_path / "_manifest.json")
    manifest, base = manifest_io.read_manifest(str(tmp_path))
    blob = files_io.read_groups(base, manifest, "m", "stateful_map", SUBSET)
    keys = list(blob["states"])
    assert blob["key_groups"].tolist() == assign_to_key_group(
        np.array(keys, dtype=object if kind == "str" else None), G, name="k").tolist()

    fresh = StatefulMapState("m", history, "k", G)
    fresh.install(blob)
    sub = _in_groups(df, SUBSET)
    truth = {k: (len(rows), rows["v"].tolist()[-3:]) for k, rows in sub.groupby("k", sort=False)}
    got = fresh.frame()["state"].to_dict()
    assert set(got) == set(truth)
    for k, (n, last) in truth.items():
        assert got[k][0] == n and type(got[k]) is tuple
        np.testing.assert_array_equal(got[k][1], last)
    assert [type(k) for k in got] == [int if kind == "int" else str] * len(got)
    held = store.keys_per_group(range(G)) * np.isin(np.arange(G), SUBSET)
    assert fresh.keys_per_group(range(G)).tolist() == held.tolist()


def test_stateful_map_keys_of_mixed_types_round_trip():
    blob = {"states": {1: "a", "1": ("b",), 2.5: None, 2**70: [1], (1, 2): {}},
            "key_groups": np.array([4, 3, 2, 1, 0])}
    back = format_io.decode("stateful_map", format_io.encode("stateful_map", blob))
    assert list(back["states"].items()) == [((1, 2), {}), (2**70, [1]), (2.5, None), ("1", ("b",)), (1, "a")]
    assert [type(k) for k in back["states"]] == [tuple, int, float, str, int]
    assert back["key_groups"].tolist() == [0, 1, 2, 3, 4]
    bools = {"states": {True: 1, False: 2}, "key_groups": np.array([0, 0])}
    back = format_io.decode("stateful_map", format_io.encode("stateful_map", bools))
    assert list(back["states"].items()) == [(True, 1), (False, 2)]
    assert [type(k) for k in back["states"]] == [bool, bool]


def test_decode_refuses_another_kind():
    table = format_io.encode("stateful_map", {"states": {1: 1}, "key_groups": np.array([0])})
    with pytest.raises(CheckpointError, match="stateful_map"):
        format_io.decode("aggregate", table)


# -- incremental -----------------------------------------------------------------------------

def test_incremental_manifest_reads_the_union_of_two_files(tmp_path):
    df1, df2 = _frame("int", seed=2), _frame("int", seed=3)
    store = AggregateState("agg", SPEC, "k", G)
    store.update(df1)
    first = files_io.write_snapshot(str(tmp_path), "data/agg/1.arrow", "aggregate", store.snapshot(range(G)))
    changed = list(range(0, G, 2))                        # then only the even groups change
    df2 = _in_groups(df2, changed)
    store.update(df2)
    second = files_io.write_snapshot(str(tmp_path), "data/agg/2.arrow", "aggregate", store.snapshot(changed))
    manifest = _manifest("agg", first, second)
    files = {loc[0] for loc in manifest["operators"]["agg"]["groups"].values()}
    assert files == {"data/agg/1.arrow", "data/agg/2.arrow"}
    manifest_io.write_manifest(str(tmp_path), "chk-000002", manifest)

    manifest, base = manifest_io.read_manifest(str(tmp_path / "chk-000002"))
    assert base == str(tmp_path)
    fresh = AggregateState("agg", SPEC, "k", G)
    fresh.install(files_io.read_groups(base, manifest, "agg", "aggregate", range(G)))
    pd.testing.assert_frame_equal(_sorted(fresh.frame()), _sorted(store.frame()))
    pd.testing.assert_frame_equal(_sorted(fresh.frame()), _sorted(_agg_truth(pd.concat([df1, df2]))),
                                  check_dtype=False, check_exact=False, check_names=False)

    os.remove(tmp_path / "data" / "agg" / "1.arrow")      # the even groups need the second file only
    blob = files_io.read_groups(base, manifest, "agg", "aggregate", changed)
    assert _groups_of_blob(blob) <= set(changed)
    with pytest.raises(CheckpointError, match="1.arrow"):
        files_io.read_groups(base, manifest, "agg", "aggregate", [1])


# -- manifests and errors --------------------------------------------------------------------

def test_read_manifest_takes_the_highest_complete_checkpoint(tmp_path):
    for i in (3, 12, 7):
        manifest_io.write_manifest(str(tmp_path), f"chk-{i:06d}", {"format": 1, "base": "..", "files": {},
                                   "operators": {}, "id": i})
    (tmp_path / "chk-000013").mkdir()                     # partial: no manifest
    path = manifest_io.write_manifest(str(tmp_path), "chk-000001", {"format": 1, "files": {}, "operators": {}})
    assert path == str(tmp_path / "chk-000001" / "_manifest.json")
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    assert manifest_io.checkpoint_ids(str(tmp_path)) == [1, 3, 7, 12]
    manifest, base = manifest_io.read_manifest(str(tmp_path))
    assert manifest["id"] == 12 and base == str(tmp_path)
    with pytest.raises(CheckpointError, match="chk-000013.*partial"):
        manifest_io.read_manifest(str(tmp_path / "chk-000013"))


def test_read_manifest_resolves_a_relative_path(tmp_path, monkeypatch):
    manifest_io.write_manifest(str(tmp_path), "chk-000004", {"format": 1, "base": "..", "files": {}, "operators": {}})
    monkeypatch.chdir(tmp_path)
    _, base = manifest_io.read_manifest("chk-000004")
    assert base == str(tmp_path)


def test_fsspec_urls(tmp_path):
    root = f"memory://streamlb-test-{uuid.uuid4().hex}"
    store = AggregateState("agg", SPEC, "k", G)
    store.update(_frame("int", n=500))
    paths_io.check_writable(root)
    w = files_io.write_snapshot(root, "data/agg/a.arrow", "aggregate", store.snapshot(range(G)))
    manifest_io.write_manifest(root, "chk-000001", _manifest("agg", w))
    manifest, base = manifest_io.read_manifest(root + "/chk-000001")
    assert base == root
    manifest_io.verify(base, manifest)
    fresh = AggregateState("agg", SPEC, "k", G)
    fresh.install(files_io.read_groups(base, manifest, "agg", "aggregate", range(G)))
    pd.testing.assert_frame_equal(_sorted(fresh.frame()), _sorted(store.frame()))
    assert retention_io.retain(root, 1) == []


def test_read_manifest_errors_name_the_path(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as err:
        manifest_io.read_manifest(str(tmp_path / "missing"))
    assert "missing" in str(err.value)
    with pytest.raises(CheckpointError, match="no complete checkpoint under") as err:
        manifest_io.read_manifest(str(tmp_path))
    assert str(tmp_path) in str(err.value) and "partial" in str(err.value)

    (tmp_path / "chk-000001").mkdir()
    (tmp_path / "chk-000001" / "_manifest.json").write_text('{"format": 1, "files": ')
    with pytest.raises(CheckpointError, match="not valid JSON") as err:
        manifest_io.read_manifest(str(tmp_path))
    assert "chk-000001/_manifest.json" in str(err.value)

    (tmp_path / "chk-000002").mkdir()
    (tmp_path / "chk-000002" / "_manifest.json").write_text(json.dumps({"format": 1, "files": {}}))
    with pytest.raises(CheckpointError, match="'operators'") as err:
        manifest_io.read_manifest(str(tmp_path))
    assert "chk-000002/_manifest.json" in str(err.value)


@pytest.fixture
def written(tmp_path):
    """A checkpoint of two snapshot files; returns (base, manifest)."""
    store = AggregateState("agg", SPEC, "k", G)
    store.update(_frame("int", n=1000))
    a = files_io.write_snapshot(str(tmp_path), "data/agg/a.arrow", "aggregate", store.snapshot(range(32)))
    b = files_io.write_snapshot(str(tmp_path), "data/agg/b.arrow", "aggregate", store.snapshot(range(32, G)))
    manifest_io.write_manifest(str(tmp_path), "chk-000001", _manifest("agg", a, b))
    return manifest_io.read_manifest(str(tmp_path))[::-1]


def test_verify_passes_an_intact_checkpoint(written):
    manifest_io.verify(*written)


def test_verify_finds_a_missing_file(written):
    base, manifest = written
    os.remove(os.path.join(base, "data", "agg", "b.arrow"))
    with pytest.raises(CheckpointError, match="data/agg/b.arrow is missing"):
        manifest_io.verify(base, manifest)


def test_verify_finds_a_truncated_file(written):
    base, manifest = written
    path = os.path.join(base, "data", "agg", "a.arrow")
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 10)
    with pytest.raises(CheckpointError, match="data/agg/a.arrow has .* bytes"):
        manifest_io.verify(base, manifest)
    with pytest.raises(CheckpointError, match="data/agg/a.arrow"):
        files_io.read_groups(base, manifest, "agg", "aggregate", range(G))


def test_verify_finds_a_flipped_byte(written):
    base, manifest = written
    path = os.path.join(base, "data", "agg", "b.arrow")
    with open(path, "r+b") as fh:
        fh.seek(os.path.getsize(path) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointError, match="data/agg/b.arrow fails its checksum"):
        manifest_io.verify(base, manifest)
    with pytest.raises(CheckpointError, match="data/agg/b.arrow fails its checksum"):
        files_io.read_groups(base, manifest, "agg", "aggregate", [40])
    files_io.read_groups(base, manifest, "agg", "aggregate", range(32))   # a.arrow alone is fine


# -- writable --------------------------------------------------------------------------------

def test_check_writable_creates_the_directory(tmp_path):
    target = tmp_path / "a" / "b"
    paths_io.check_writable(str(target))
    assert target.is_dir() and not list(target.iterdir())


def test_check_writable_fails_with_a_clear_message(tmp_path):
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        target = locked / "chk"
    else:                                                 # chmod does not stop root: a file as parent does
        (tmp_path / "plain").write_text("x")
        target = tmp_path / "plain" / "chk"
    try:
        with pytest.raises(CheckpointError, match="is not writable") as err:
            paths_io.check_writable(str(target))
    finally:
        if os.geteuid() != 0:
            (tmp_path / "locked").chmod(0o700)
    assert repr(str(target)) in str(err.value) and "workers and the driver" in str(err.value)


# -- retention -------------------------------------------------------------------------------

def _age(path, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(path, (t, t))


def test_retain_keeps_the_newest_and_the_files_they_reference(tmp_path):
    root = str(tmp_path)
    data = tmp_path / "data" / "op"
    data.mkdir(parents=True)
    (data / "shared.arrow").write_bytes(b"s")             # written by checkpoint 1, used by all
    _age(data / "shared.arrow", 1000)
    for i in range(1, 6):
        (data / f"own-{i}.arrow").write_bytes(b"x")
        _age(data / f"own-{i}.arrow", 1000 - 100 * i)
        files = {"data/op/shared.arrow": {}, f"data/op/own-{i}.arrow": {}}
        groups = {"0": ["data/op/shared.arrow", 0, 1], "1": [f"data/op/own-{i}.arrow", 0, 1]}
        path = manifest_io.write_manifest(root, f"chk-{i:06d}", {"format": 1, "base": "..", "files": files,
                                          "operators": {"op": {"groups": groups}}})
        _age(path, 1000 - 100 * i - 1)
    (data / "orphan.arrow").write_bytes(b"o")             # of a failed checkpoint
    _age(data / "orphan.arrow", 800)
    (tmp_path / "chk-000002x").mkdir()                    # not a checkpoint dir: left alone
    (tmp_path / "chk-000003" / "extra").write_text("")
    (tmp_path / "chk-000004" / "_manifest.json.tmp-dead").write_text("")
    os.rename(tmp_path / "chk-000004" / "_manifest.json", tmp_path / "chk-000004" / "_gone")  # 4: partial
    (tmp_path / "chk-000006").mkdir()                     # in progress: newer than the newest
    (data / "own-6.arrow").write_bytes(b"y")              # ... and its file, just written

    removed = retention_io.retain(root, 2)

    assert manifest_io.checkpoint_ids(root) == [3, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chk-000002x", "chk-000003", "chk-000005",
                                                          "chk-000006", "data"]
    assert sorted(p.name for p in data.iterdir()) == ["own-3.arrow", "own-5.arrow", "own-6.arrow",
                                                      "shared.arrow"]
    assert str(data / "orphan.arrow") in removed and str(data / "own-1.arrow") in removed
    assert str(tmp_path / "chk-000001" / "_manifest.json") in removed
    assert str(tmp_path / "chk-000004") in removed
    assert retention_io.retain(root, 2) == []                  # nothing more to do; no error
    with pytest.raises(ValueError):
        retention_io.retain(root, 0)


def test_retain_without_checkpoints_removes_nothing(tmp_path):
    (tmp_path / "data" / "op").mkdir(parents=True)
    (tmp_path / "data" / "op" / "f.arrow").write_bytes(b"x")
    assert retention_io.retain(str(tmp_path), 3) == []
    assert retention_io.retain(str(tmp_path / "missing"), 3) == []
    assert (tmp_path / "data" / "op" / "f.arrow").exists()


def test_column_names_that_are_not_strings_survive_a_file(tmp_path):
    """Input columns 1 and "1" both make a table "sum:1": read back by place, not name."""
    blob = {"dtypes": {1: np.dtype(np.int64), "1": np.dtype(np.float64), ("a", 2): np.dtype(np.float64)},
            "parts": [{"keys": np.array([5, 6]), "key_groups": np.array([1, 0]),
                       "tables": {("sum", 1): np.array([3, 4]), ("sum", "1"): np.array([0.5, 0.25]),
                                  ("min", ("a", 2)): np.array([-1.0, 2.0])}}]}
    w = files_io.write_snapshot(str(tmp_path), "data/agg/a.arrow", "aggregate", blob)
    back = files_io.read_groups(str(tmp_path), _manifest("agg", w), "agg", "aggregate", [0, 1])
    assert back["dtypes"] == blob["dtypes"]
    (part,) = back["parts"]
    assert part["keys"].tolist() == [6, 5]
    assert {t: v.tolist() for t, v in part["tables"].items()} == {
        ("sum", 1): [4, 3], ("sum", "1"): [0.25, 0.5], ("min", ("a", 2)): [2.0, -1.0]}


@pytest.mark.parametrize("compression", ["lz4", "zstd", "none"])
def test_compressed_snapshots_read_back_exactly(tmp_path, compression):
    df = _frame("int")
    store = AggregateState("agg", SPEC, "k", G)
    store.update(df)
    plain = files_io.write_snapshot(str(tmp_path), "data/agg/p.arrow", "aggregate", store.snapshot(range(G)))
    store = AggregateState("agg", SPEC, "k", G)        # a fresh store: its pool is free
    store.update(df)
    packed = files_io.write_snapshot(str(tmp_path), "data/agg/c.arrow", "aggregate", store.snapshot(range(G)),
                                     compression=compression)
    if compression != "none":
        assert packed["bytes"] < plain["bytes"]
    manifest_io.write_manifest(str(tmp_path), "chk-000001", _manifest("agg", packed))
    manifest, base = manifest_io.read_manifest(str(tmp_path))
    manifest_io.verify(base, manifest)
    fresh = AggregateState("agg", SPEC, "k", G)
    fresh.install(files_io.read_groups(base, manifest, "agg", "aggregate", range(G)))
    pd.testing.assert_frame_equal(_sorted(fresh.frame()), _sorted(store.frame()))


def test_an_unknown_compression_is_refused_by_name():
    with pytest.raises(ValueError, match=r"streamlb.checkpoint.compression is 'gzip'; valid values: none, lz4, zstd"):
        files_io.check_compression("gzip")
    assert files_io.check_compression(None) is None and files_io.check_compression("NONE") is None


def test_pooled_snapshot_arrays_are_lent_until_released():
    """A snapshot taken while the previous one is still being written gets arrays of its
    own; after release, the next reuses the kept ones. Both hold the state as it was."""
    df = _frame("int")
    store = AggregateState("agg", SPEC, "k", G)
    store.update(df)
    first = store.snapshot(range(G))
    before = _sorted(store.frame())
    store.update(df)                                       # the state moves on
    second = store.snapshot(range(G))
    assert "pooled" not in second                          # the pool was lent out
    for blob, times in ((first, 1), (second, 2)):
        fresh = AggregateState("agg", SPEC, "k", G)
        fresh.install(blob)
        got = _sorted(fresh.frame())
        assert (got["n"] == before["n"] * times).all()
    store.release(first)
    third = store.snapshot(range(G))
    assert third["pooled"] == first["pooled"]
    assert np.shares_memory(third["parts"][0]["keys"], first["parts"][0]["keys"])


def test_a_bad_compression_setting_fails_the_run_by_name(tmp_path):
    import dask

    from streamlb._recovery._coordinator import Checkpointer

    with dask.config.set({"streamlb.checkpoint.compression": "gzip"}):
        with pytest.raises(ValueError, match="streamlb.checkpoint.compression is 'gzip'"):
            Checkpointer(object(), str(tmp_path))
    with dask.config.set({"streamlb.checkpoint.compression": "lz4"}):
        assert Checkpointer(object(), str(tmp_path)).compression == "lz4"
