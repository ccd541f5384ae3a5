"""A sink whose writes fail (issue 49, item 4): a full output directory fails the job at once
with a SinkWriteError naming the sink, the path and the cause, and leaves no record twice
nor anything half-written in the output.

The disk is real: a small tmpfs mounted (as root) as the ``to_parquet`` directory, which the
job's output fills part of the way through; the workers are LocalCluster processes."""
from __future__ import annotations

import errno
import os
import pickle
import subprocess
import threading
import time

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.exceptions import SinkWriteError
from streamlb._sinks._errors import PERMANENT, write_error

ROWS, FILES = 150_000, 4            # 4.8 MB of raw columns: far more than the tmpfs holds


@pytest.mark.parametrize("code", sorted(errno.errorcode))
def test_errno_decides_whether_a_retry_can_help(code):
    exc = OSError(code, "the system's words")
    err = write_error("to_parquet('out') in agg[1]", "/out/_temporary/part.parquet", exc)
    name = errno.errorcode[code]
    assert err.permanent == (name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM"))
    assert err.permanent == (code in PERMANENT)
    assert err.errno_name == name and err.__cause__ is exc
    assert str(err).startswith(f"to_parquet('out') in agg[1] could not write /out/_temporary/part.parquet: "
                               f"{name}: {os.strerror(code)}")
    back = pickle.loads(pickle.dumps(err))          # crosses from a worker to the driver
    assert (type(back), str(back), back.sink, back.path, back.errno_name, back.permanent) == \
        (SinkWriteError, str(err), err.sink, err.path, name, err.permanent)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``FILES`` Parquet files of random floats (they hardly compress); ``rid`` numbers every row."""
    root = tmp_path_factory.mktemp("sink-errors-data")
    n = ROWS * FILES
    rng = np.random.default_rng(49)
    frame = pd.DataFrame({"rid": np.arange(n, dtype=np.int64), "key": rng.integers(0, 500, n),
                          "x": rng.random(n), "y": rng.random(n)})
    for i, part in enumerate(np.array_split(np.arange(n), FILES)):
        frame.iloc[part].to_parquet(root / f"part-{i}.parquet")
    return str(root), frame


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs: the job's output fills it part of the way through."""
    mnt = tmp_path / "out"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"mount -t tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


class FillWatch:
    """When the free space of ``path`` first fell below ``low`` bytes, less than two batches of
    output (a thread looks every 20 ms): the disk is about to be full."""

    def __init__(self, path: str, low: int = 512 << 10) -> None:
        self.path, self.low, self.at = path, low, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            st = os.statvfs(self.path)
            if st.f_bavail * st.f_frsize < self.low:
                self.at = time.time()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def ident(df):
    return df


@pytest.mark.parametrize("checkpointed", [True, False], ids=["checkpoints", "no-checkpoints"])
def test_a_full_output_directory_fails_the_job_at_once_naming_the_sink(two_workers, data, small_disk, tmp_path,
                                                                       checkpointed):
    path, frame = data
    src = Stream.from_parquet(path, batch_size=10_000, rate=60_000)
    src.rebalance(parallelism=2).map(ident).to_parquet(small_disk)
    opts = {"checkpoint": str(tmp_path / "ck"), "checkpoint_interval": 0.3} if checkpointed else {}
    watch = FillWatch(small_disk)
    job = streamlb.run(src, client=two_workers, **opts)
    try:
        with pytest.raises(SinkWriteError) as err:
            job.wait(timeout=120)
        raised = time.time()
    finally:
        watch.stop()
        job.stop()
    e = err.value
    assert watch.at is not None, "the output never filled the disk"
    print(f"SinkWriteError {raised - watch.at:.2f} s after the disk filled: {e}")
    assert raised - watch.at < 20          # at b858ae2: 73 s (checkpoint.timeout + 13 s), no name, a traceback
    assert e.errno_name == "ENOSPC" and e.permanent and e.path.startswith(small_disk)
    assert e.sink.startswith(f"to_parquet({small_disk!r}) in rebalance[")
    assert f"to_parquet({small_disk!r})" in str(e) and "ENOSPC: No space left on device" in str(e)
    assert e.path in str(e) and "Traceback" not in str(e)
    assert job.status == "failed" and job.error is not None and isinstance(job.error, SinkWriteError)
    # the final directory holds only committed, whole files; what was staged is gone
    left = sorted(os.listdir(small_disk))
    assert "_temporary" not in left and "_SUCCESS" not in left
    committed = [f for f in left if f.endswith(".parquet")]
    assert left == committed
    if checkpointed:
        assert committed, "no checkpoint committed output before the disk filled"
        got = pd.concat([pd.read_parquet(os.path.join(small_disk, f)) for f in committed], ignore_index=True)
        assert got["rid"].is_unique and 0 < len(got) < len(frame)      # each record at most once
        pd.testing.assert_frame_equal(got.sort_values("rid").reset_index(drop=True),
                                      frame[frame["rid"].isin(got["rid"])].reset_index(drop=True))
    else:
        assert not committed            # without checkpoints, output is committed when the job finishes


def test_the_drivers_commit_on_a_read_only_disk_names_the_sink_and_keeps_the_staged_file(small_disk):
    from types import SimpleNamespace

    from streamlb._sinks._parquet import ParquetCommitter

    staged = os.path.join(small_disk, "_temporary", "part-001-0000-j-c00000.parquet")
    os.makedirs(os.path.dirname(staged))
    pd.DataFrame({"rid": [1, 2]}).to_parquet(staged)
    subprocess.run(["mount", "-o", "remount,ro", small_disk], check=True)
    committer = ParquetCommitter(SimpleNamespace(parquet_paths=[small_disk]), [], "j")
    final = os.path.join(small_disk, os.path.basename(staged))
    with pytest.raises(SinkWriteError) as err:
        committer.commit([[small_disk, staged]])
    e = err.value
    assert (e.sink, e.path, e.errno_name, e.permanent) == (f"to_parquet({small_disk!r})", final, "EROFS", True)
    assert str(e) == f"to_parquet({small_disk!r}) could not commit {final}: EROFS: Read-only file system " \
                     f"(retrying cannot help)"
    assert os.path.exists(staged) and not os.path.exists(final)
    with pytest.raises(SinkWriteError, match="EROFS"):
        committer.finish()


@pytest.fixture
def immutable(tmp_path):
    """A directory whose entries ``chattr +i`` freezes when asked (its subdirectories stay
    writable): a commit into it fails with EPERM while the instances write on."""
    out = tmp_path / "out"
    out.mkdir()
    probe = subprocess.run(["chattr", "+i", str(out)], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"chattr +i is not permitted here: {probe.stderr.strip()}")
    subprocess.run(["chattr", "-i", str(out)], check=True)
    try:
        yield str(out)
    finally:
        subprocess.run(["chattr", "-i", str(out)], capture_output=True)


def test_a_commit_that_fails_leaves_its_files_for_the_run_that_resumes(two_workers, data, immutable, tmp_path):
    path, frame = data
    ck = str(tmp_path / "ck")

    def pipeline():
        src = Stream.from_parquet(path, batch_size=10_000, rate=100_000)
        src.rebalance(parallelism=2).map(ident).to_parquet(immutable)
        return src

    job = streamlb.run(pipeline(), client=two_workers, checkpoint=ck, checkpoint_interval=0.3)
    try:
        deadline = time.time() + 60
        while not [f for f in os.listdir(immutable) if f.endswith(".parquet")] and time.time() < deadline:
            time.sleep(0.02)
        subprocess.run(["chattr", "+i", immutable], check=True)   # the next commit cannot move a file in
        with pytest.raises(SinkWriteError) as err:
            job.wait(timeout=120)
    finally:
        subprocess.run(["chattr", "-i", immutable], check=True)
        job.stop()
    e = err.value
    assert (e.errno_name, e.permanent, e.sink) == ("EPERM", True, f"to_parquet({immutable!r})")
    assert str(e).startswith(f"to_parquet({immutable!r}) could not commit {immutable}/part-") and \
        "EPERM: Operation not permitted" in str(e)
    assert job.status == "failed" and os.listdir(os.path.join(immutable, "_temporary"))   # left for a resume
    # the run that resumes the checkpoint moves them in: every record once
    job = streamlb.run(pipeline(), client=two_workers, checkpoint=ck, checkpoint_interval=0.3)
    job.wait(timeout=120)
    job.stop()
    got = pd.read_parquet(immutable)
    assert got["rid"].is_unique and len(got) == len(frame)
    pd.testing.assert_frame_equal(got.sort_values("rid").reset_index(drop=True), frame)
