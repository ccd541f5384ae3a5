"""Source positions that survive a change of working directory, and restarts that resume.

A checkpoint or savepoint names each file it read by its path relative to the source's
root, so a restore finds it again whether the data directory is given as a relative or an
absolute path, from any working directory, or after the directory moved; a restore whose
positions match no file of the source is refused. A run on a ``checkpoint=`` directory that
already holds a complete checkpoint resumes from it. Every result is checked exactly
against pandas over the same input, on real worker processes (whose working directory is
not the driver's once the test changes it).
"""
from __future__ import annotations

import logging
import shutil
import time

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import CheckpointError

SPEC = {"n": ("value", "count"), "s": ("value", "sum")}
ROWS, KEYS = 20_000, 500


def write_parts(root, names, seed):
    """Parquet files ``names`` under ``root`` (created); their rows as one frame."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    frames = []
    for name in names:
        df = pd.DataFrame({"key": rng.integers(0, KEYS, ROWS), "value": rng.integers(0, 100, ROWS)})
        df.to_parquet(root / name)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def build(path, rate=None, spec=SPEC, watch=None):
    src = Stream.from_parquet(path, batch_size=2_000, rate=rate, watch=watch)
    src.key_by("key").aggregate(spec, name="totals", parallelism=2)
    return src


def assert_exact(job, frame):
    truth = frame.groupby("key")["value"].agg(["count", "sum"])
    state = job.state("totals")
    assert state.index.tolist() == truth.index.tolist()
    np.testing.assert_array_equal(state["n"].to_numpy(), truth["count"].to_numpy())
    np.testing.assert_array_equal(state["s"].to_numpy(), truth["sum"].to_numpy())


def wait_for_checkpoint(job, timeout=60):
    """Until a complete checkpoint holds some keys (the sources had emitted rows)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        cps = job.checkpoints()
        if len(cps) and (cps["keys"] > 0).any():
            return cps
        time.sleep(0.1)
    raise AssertionError("no checkpoint with keys completed")


def test_positions_saved_under_a_relative_path_restore_from_an_absolute_one(two_workers, tmp_path, monkeypatch):
    """Item 1: a job reads ``from_parquet("big")`` in one working directory (the workers'
    is another: the driver resolves the path) and writes checkpoints to ``"ck"`` and a
    savepoint to ``"sp"``, both relative. Restored from another working directory with the
    absolute path, and after the data directory moved, each continues where it was."""
    here = tmp_path / "a"
    frame = write_parts(here / "big", [f"part-{i}.parquet" for i in range(3)], seed=1)
    monkeypatch.chdir(here)
    job = streamlb.run(build("big", rate=25_000), client=two_workers, checkpoint="ck", checkpoint_interval=0.2)
    try:
        wait_for_checkpoint(job)
        sp = job.savepoint("sp")
        assert job.summary()["records"] < len(frame)
    finally:
        job.stop()
    elsewhere = tmp_path / "b"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for restore in (str(here / "ck"), sp):
        job = streamlb.run(build(str(here / "big")), client=two_workers, restore=restore)
        job.wait(timeout=60)
        assert_exact(job, frame)
        assert 0 < job.summary()["records"] < len(frame)    # only what came after the cut
    # the data directory moved: its files keep their names under it
    moved = tmp_path / "moved" / "data"
    moved.parent.mkdir()
    shutil.move(str(here / "big"), str(moved))
    job = streamlb.run(build(str(moved)), client=two_workers, restore=sp)
    job.wait(timeout=60)
    assert_exact(job, frame)
    assert 0 < job.summary()["records"] < len(frame)


def test_a_restore_whose_positions_match_no_file_is_refused(two_workers, tmp_path):
    """Item 1: positions that name none of the source's files fail the restore, naming the
    stored files and the source's path, for a Parquet source and a watched directory."""
    first = tmp_path / "first"
    write_parts(first, ["part-0.parquet", "part-1.parquet"], seed=2)
    job = streamlb.run(build(str(first), watch=0.1), client=two_workers, checkpoint=str(tmp_path / "ck"),
                       checkpoint_interval=0.2)
    try:
        wait_for_checkpoint(job)
        sp = job.savepoint(str(tmp_path / "sp"))
    finally:
        job.stop()
    other = tmp_path / "other"
    write_parts(other, ["events-0.parquet"], seed=3)
    with pytest.raises(CheckpointError, match=r"(?s)part-[01]\.parquet.*match no file.*" + str(other)):
        streamlb.run(build(str(other), watch=0.1), client=two_workers, restore=sp)
    # a Parquet source over a file set that shares no file with the savepoint's
    plain = tmp_path / "plain"
    write_parts(plain, ["part-0.parquet"], seed=4)
    job = streamlb.run(build(str(plain), rate=20_000), client=two_workers)
    try:
        time.sleep(0.3)
        sp2 = job.savepoint(str(tmp_path / "sp2"))
    finally:
        job.stop()
    with pytest.raises(CheckpointError, match=r"(?s)part-0\.parquet.*match no file.*" + str(other)):
        streamlb.run(build(str(other)), client=two_workers, restore=sp2)


def test_a_run_on_a_checkpoint_directory_that_holds_a_checkpoint_resumes(two_workers, tmp_path, caplog):
    """Item 5: run 1 checkpoints to ``ck`` and is stopped part way; run 2 on the same
    ``ck``, over the same directory with one more file, resumes from the latest checkpoint
    (logged at INFO), reads only the rest, and counts each record once. A graph that does
    not fit the checkpoints there is refused with what to do."""
    data, ck = tmp_path / "data", str(tmp_path / "ck")
    frame = write_parts(data, ["part-0.parquet", "part-1.parquet"], seed=5)
    job = streamlb.run(build(str(data), rate=20_000), client=two_workers, checkpoint=ck, checkpoint_interval=0.2)
    try:
        wait_for_checkpoint(job)
    finally:
        job.stop()
    last = int(job.checkpoints()["id"].max())
    frame = pd.concat([frame, write_parts(data, ["part-2.parquet"], seed=6)], ignore_index=True)
    with caplog.at_level(logging.INFO, logger="streamlb"):
        # paced, so that it lives through checkpoints of its own (their ids go on from run 1's)
        job = streamlb.run(build(str(data), rate=20_000), client=two_workers, checkpoint=ck, checkpoint_interval=0.2)
        wait_for_checkpoint(job)
        job.wait(timeout=60)
    assert_exact(job, frame)
    assert 0 < job.summary()["records"] < len(frame)
    assert any(r.levelno == logging.INFO and "resum" in r.getMessage() and f"checkpoint {last}" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert job.checkpoints()["id"].min() > last
    with pytest.raises(CheckpointError, match=r"(?s)spec.*new checkpoint directory.*restore="):
        streamlb.run(build(str(data), spec={"n": ("value", "count")}), client=two_workers, checkpoint=ck)
