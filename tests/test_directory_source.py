"""A directory that grows (``Stream.from_parquet(path, watch=...)``): jobs on worker processes
read the files written into a directory (renamed into place) before and while they run,
each file exactly once, also across a SIGKILLed worker and a savepoint-stop-restore; each
run is exact against pandas over the files written."""
from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import InputPathError, PipelineError
from streamlb._checkpoint._manifest import read_manifest
from streamlb.planner import plan

from conftest import dask_cli_cluster
from test_checkpoint import _kill_one

SPEC = {"n": ("value", "count"), "total": ("value", "sum")}


def _frame(i: int, rows: int = 5_000) -> pd.DataFrame:
    rng = np.random.default_rng(i)
    keys = np.where(rng.random(rows) < 0.3, rng.integers(0, 3, rows), rng.integers(0, 300, rows))
    return pd.DataFrame({"key": keys.astype(np.int64), "value": rng.integers(0, 1000, rows)})


def _land(root, name: str, df: pd.DataFrame) -> None:
    """Write ``df`` as ``root/name`` the way a writer should: under a name starting with
    ``_``, then renamed into place."""
    final = os.path.join(root, name)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    tmp = os.path.join(os.path.dirname(final), "_tmp-" + os.path.basename(final))
    df.to_parquet(tmp)
    os.rename(tmp, final)


def _truth(frames) -> pd.DataFrame:
    return pd.concat(frames).groupby("key").agg(n=("value", "count"), total=("value", "sum")).sort_index()


def _state(job) -> pd.DataFrame | None:
    """The aggregate's state; None while the job is not running (recovering)."""
    if job.status != "running":
        return None
    try:
        got = job.state("totals")[["n", "total"]].sort_index()
    except Exception:       # an instance lost or being replaced: ask again
        return None
    got.index = got.index.astype(np.int64)
    return got


def _wait_exact(job, frames, timeout: float = 40.0) -> None:
    """Wait until the job holds as many records as ``frames``; then it must be exact."""
    want = _truth(frames)
    deadline = time.time() + timeout
    while True:
        got = _state(job)
        if got is not None and got.n.sum() >= want.n.sum():
            break
        assert time.time() < deadline, f"{None if got is None else got.n.sum()} of {want.n.sum()} records read"
        time.sleep(0.1)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def _job(root, client, **run_kw):
    src = Stream.from_parquet(str(root), watch="200ms", batch_size=1_000, **run_kw.pop("source", {}))
    src.key_by("key").aggregate(SPEC, name="totals")
    return streamlb.run(src, client=client, balancer="static", **run_kw)


def test_files_written_before_and_while_a_job_runs_are_each_read_once(two_workers, tmp_path):
    root = tmp_path / "landing"
    root.mkdir()
    frames = [_frame(i) for i in range(6)]
    for i in range(2):
        _land(root, f"part-{i}.parquet", frames[i])
    job = _job(root, two_workers)
    try:
        _wait_exact(job, frames[:2])
        for i in range(2, 5):
            _land(root, f"part-{i}.parquet", frames[i])
            time.sleep(0.1)
        _land(root, "2026/part-5.parquet", frames[5])       # in a new subdirectory
        _wait_exact(job, frames)
        time.sleep(0.6)             # more listings: nothing is read twice
        _wait_exact(job, frames)
        assert job.status == "running"      # it runs until stopped
        offsets = job.offsets()
        assert sorted(offsets) == sorted([f"part-{i}.parquet" for i in range(5)] + ["2026/part-5.parquet"])
        assert set(offsets.values()) == {5_000}
    finally:
        job.stop()


def test_files_being_written_are_ignored_until_renamed_into_place(two_workers, tmp_path):
    root = tmp_path / "landing"
    root.mkdir()            # empty when the job starts
    first, hidden = _frame(10), _frame(11)
    job = _job(root, two_workers)
    try:
        _land(root, "a.parquet", first)
        hidden.to_parquet(root / "_tmp-b.parquet")
        hidden.to_parquet(root / ".c.parquet")
        (root / "_temporary").mkdir()
        hidden.to_parquet(root / "_temporary" / "d.parquet")
        _wait_exact(job, [first])
        time.sleep(0.6)             # three listings saw them and left them
        _wait_exact(job, [first])
        os.rename(root / "_tmp-b.parquet", root / "b.parquet")
        _wait_exact(job, [first, hidden])
    finally:
        job.stop()


def test_savepoint_stop_and_restore_with_files_added_meanwhile(two_workers, tmp_path):
    root = tmp_path / "landing"
    root.mkdir()
    frames = [_frame(20, 1_000)] + [_frame(20 + i, 8_000) for i in range(1, 6)]
    for i in range(3):
        _land(root, f"part-{i}.parquet", frames[i])
    # paced, so the savepoint falls with files half read and others not begun
    job = _job(root, two_workers, source={"rate": 12_000})
    try:
        deadline = time.time() + 20
        while ((_state(job) is None or _state(job).n.sum() < 4_000) and time.time() < deadline):
            time.sleep(0.05)
        sp = job.savepoint(str(tmp_path / "savepoint"))
    finally:
        job.stop()
    manifest, _ = read_manifest(sp)
    saved = [pos["directory"] for pos in manifest["sources"]["from_parquet(landing)"]]
    done = [f for pos in saved for f in pos["done"]]
    reading = {f: n for pos in saved for f, n in pos["files"].items()}
    assert "part-0.parquet" in done and any(0 < n < 8_000 for n in reading.values()), saved
    for i in range(3, 6):
        _land(root, f"part-{i}.parquet", frames[i])
    job = _job(root, two_workers, restore=sp)
    try:
        _wait_exact(job, frames)
        # the restored job read only what came after the savepoint
        assert 0 < job.summary()["records"] < sum(map(len, frames))
        time.sleep(0.5)
        _wait_exact(job, frames)
    finally:
        job.stop()


def test_a_savepoint_restores_at_another_source_parallelism(two_workers, tmp_path):
    """Files done and half read are merged over the old instances; each new one takes the
    files it owns now (a half-read file goes on at its row)."""
    root = tmp_path / "landing"
    root.mkdir()
    frames = [_frame(60 + i, 6_000) for i in range(6)]
    for i in range(4):
        _land(root, f"part-{i}.parquet", frames[i])
    job = _job(root, two_workers, source={"rate": 12_000, "parallelism": 2})
    try:
        deadline = time.time() + 20
        while (_state(job) is None or _state(job).n.sum() < 8_000) and time.time() < deadline:
            time.sleep(0.05)
        sp = job.savepoint(str(tmp_path / "savepoint"))
    finally:
        job.stop()
    for i in range(4, 6):
        _land(root, f"part-{i}.parquet", frames[i])
    job = _job(root, two_workers, source={"parallelism": 3}, restore=sp)
    try:
        _wait_exact(job, frames)
        time.sleep(0.5)
        _wait_exact(job, frames)
    finally:
        job.stop()


@pytest.mark.cluster
def test_a_sigkilled_worker_is_recovered_and_each_file_read_exactly_once(tmp_path):
    from distributed import Client

    root = tmp_path / "landing"
    root.mkdir()
    frames = [_frame(40 + i, 8_000) for i in range(8)]
    for i in range(4):
        _land(root, f"part-{i}.parquet", frames[i])
    with dask_cli_cluster(workers=2) as address, Client(address) as client:
        job = _job(root, client, source={"rate": 15_000}, checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3)
        try:
            deadline = time.time() + 30
            while (job.checkpoints().shape[0] < 2 or (_state(job) is None or _state(job).n.sum() < 8_000)) \
                    and time.time() < deadline:
                time.sleep(0.05)
            assert time.time() < deadline, "no checkpoint completed"
            victim = _kill_one(client, job)
            for i in range(4, 8):
                _land(root, f"part-{i}.parquet", frames[i])
            _wait_exact(job, frames, timeout=60)
            recoveries = [h for h in job.history if h.get("kind") == "recovery"]
            assert len(recoveries) == 1 and recoveries[0]["lost_workers"] == [victim]
            assert recoveries[0]["checkpoint"] is not None
            time.sleep(0.5)
            _wait_exact(job, frames)
        finally:
            job.stop()


@pytest.mark.parametrize("watch", ["soon", 0, -1, "0s", "-2s", float("nan"), True, [1]])
def test_bad_watch_values_are_refused_naming_them(watch):
    with pytest.raises(PipelineError, match=r"from_parquet\('d'\): watch: .* is not a positive duration; give seconds"):
        Stream.from_parquet("d", watch=watch)


def test_a_watched_path_must_be_an_existing_directory(tmp_path):
    def planned(path):
        src = Stream.from_parquet(str(path), watch=1)
        src.key_by("key").aggregate(SPEC, name="totals")
        return plan(src, workers=2, key_groups=64, batch_size=1_000)

    with pytest.raises(InputPathError, match="does not exist; watch= watches a directory, which must exist"):
        planned(tmp_path / "nowhere")
    _frame(0).to_parquet(tmp_path / "a.parquet")
    with pytest.raises(InputPathError, match="is a file"):
        planned(tmp_path / "a.parquet")
    st = planned(tmp_path).stages[0]       # files there or not, the directory is watched
    assert (st.kind, st.parallelism, st.source["watch"]) == ("directory_source", 2, 1.0)
    assert Stream.from_parquet("d", watch="1500ms").watch == 1.5
    assert Stream.from_parquet("d").watch is None
