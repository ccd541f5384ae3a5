"""Exactly-once checkpoints, recovery from a SIGKILLed `dask worker`, savepoints and restore.

Faults are real: a `dask scheduler` and three `dask worker` processes (with nannies, which
restart a killed worker at a new address) on loopback, and a worker process killed with
SIGKILL while the job runs. Every run is checked exactly against pandas over the same
input: the aggregate's state, the `stateful_map`'s outputs (each key's running counts
1..n once each, with the key's values), and the rows `to_parquet` wrote (each input row
once).
"""
from __future__ import annotations

import os
import signal
import threading
import time

import dask
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from streamz import Stream

import streamlb
from streamlb import CheckpointError, JobFailedError

from conftest import dask_cli_cluster
from test_pipeline import running_count

SPEC = {"n": ("value", "count"), "s": ("value", "sum")}
ROWS, FILES, KEYS = 45_000, 3, 3_000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three Parquet files of skewed integer keys; ``rid`` numbers every row."""
    root = tmp_path_factory.mktemp("ckpt-data")
    rng = np.random.default_rng(3)
    frames = []
    for i in range(FILES):
        df = pd.DataFrame({"key": (rng.zipf(1.3, ROWS) % KEYS).astype(np.int64),
                           "value": rng.integers(0, 100, ROWS)})
        df["rid"] = np.arange(ROWS) + i * ROWS
        df.to_parquet(root / f"part-{i}.parquet")
        frames.append(df)
    return str(root), pd.concat(frames, ignore_index=True)


def select_rows(df):
    return df[["rid", "key"]]


def build(path, out, rate=None, p_agg=3, p_map=2, batch_size=4_000, spec=SPEC, agg_name="totals"):
    src = Stream.from_parquet(path, batch_size=batch_size, rate=rate)
    src.key_by("key").aggregate(spec, name=agg_name, parallelism=p_agg)
    outs = src.key_by("key").stateful_map(running_count, name="running", parallelism=p_map).sink_to_list()
    src.map(select_rows).to_parquet(out)
    return src, outs


def check_exact(job, frame, outs, out):
    truth = frame.groupby("key")["value"].agg(["count", "sum"])
    state = job.state("totals")
    assert state.index.tolist() == truth.index.tolist()
    np.testing.assert_array_equal(state["n"].to_numpy(), truth["count"].to_numpy())
    np.testing.assert_array_equal(state["s"].to_numpy(), truth["sum"].to_numpy())
    got = pd.concat(outs, ignore_index=True)
    assert len(got) == len(frame)
    n = got["output"].map(lambda o: o[0])
    pairs = pd.DataFrame({"key": got["key"].to_numpy(), "n": n.to_numpy()})
    want = frame.groupby("key").size()
    by_key = pairs.groupby("key")["n"]
    # each key's running counts 1..count, each once: what a run with no fault emits
    pd.testing.assert_series_equal(by_key.nunique(), want, check_names=False)
    pd.testing.assert_series_equal(by_key.max(), want, check_names=False)
    vals = pd.DataFrame({"key": got["key"].to_numpy(), "value": got["output"].map(lambda o: o[1]).to_numpy()})
    # the same (key, value) pairs as the input, as multisets: both sorted, then compared
    ordered = lambda df: df.sort_values(["key", "value"], kind="stable").to_numpy()     # noqa: E731
    np.testing.assert_array_equal(ordered(vals), ordered(frame[["key", "value"]]))
    written = pd.read_parquet(out)
    assert len(written) == len(frame) and written["rid"].is_unique
    assert set(written["rid"]) == set(frame["rid"])


# -- on a LocalCluster ---------------------------------------------------------------------------
def test_checkpoints_are_exact_incremental_and_retained(two_workers, data, tmp_path):
    path, frame = data
    ck = str(tmp_path / "ck")
    # 40k records/s: the job runs long enough for three checkpoints 0.25 s apart on a loaded machine
    src, outs = build(path, str(tmp_path / "out"), rate=40_000)
    with dask.config.set({"streamlb.checkpoint.retained": 2, "streamlb.checkpoint.compression": "lz4"}):
        job = streamlb.run(src, client=two_workers, checkpoint=ck, checkpoint_interval=0.25)
        job.wait(timeout=120)
    check_exact(job, frame, outs, str(tmp_path / "out"))
    cps = job.checkpoints()
    assert len(cps) >= 3 and job.checkpoint_failures == 0
    assert cps["full"].iloc[0] and not cps["full"].iloc[1:].any()
    # a checkpoint taken before the sources' first rows holds no key (a slow start under load)
    assert (cps["bytes_written"][cps["keys"] > 0] > 0).all() and (cps["duration"] > 0).all()
    assert cps["keys"].iloc[-1] > 0
    assert list(cps["id"]) == sorted(cps["id"]) and cps["kind"].eq("checkpoint").all()
    # only the newest two are kept, and every file they name is there, unchanged
    kept = sorted(d for d in os.listdir(ck) if d.startswith("chk-"))
    assert [int(d[4:]) for d in kept] == list(cps["id"].iloc[-2:])
    from streamlb._checkpoint._manifest import read_manifest, verify

    manifest, base = read_manifest(ck)
    verify(base, manifest)
    assert manifest["id"] == cps["id"].iloc[-1]
    held = {int(g) for g in manifest["operators"]["totals"]["groups"]}
    assert held and max(held) < job.key_groups
    # the setting reached the instances: their files are LZ4-compressed (small keys and
    # counts pack well), and read back whole
    import pyarrow as pa

    files = [os.path.join(base, f) for f in manifest["files"]]
    assert files and all(pa.ipc.open_file(f).read_all().num_rows for f in files)
    assert sum(map(os.path.getsize, files)) < 0.8 * sum(pa.ipc.open_file(f).read_all().nbytes for f in files)
    job.stop()


def test_checkpoints_interleave_with_rescale_migration_and_split(two_workers, data, tmp_path):
    """Checkpoints every 100 ms while the aggregate is rescaled, has key groups moved and a
    hot key split and merged back: each checkpoint waits for the epoch in flight and holds
    the next, and the results stay exact."""
    path, frame = data
    src, outs = build(path, str(tmp_path / "out"), rate=18_000, p_agg=2)
    job = streamlb.run(src, client=two_workers, checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.1)
    steps = []
    try:
        time.sleep(0.5)
        t = time.time()
        job.rescale("totals", 3)
        steps.append(("rescale", time.time() - t))
        t = time.time()
        job.migrate("totals", range(0, 64), 2, strategy="fluid")
        steps.append(("migrate", time.time() - t))
        hot = int(frame["key"].value_counts().index[0])
        home = int(job.routing("totals").owners[streamlb.assign_to_key_group(np.array([hot]), job.key_groups)[0]])
        t = time.time()
        job.split("totals", hot, [(home + 1) % 3])
        time.sleep(0.4)
        job.split("totals", hot, [])
        steps.append(("split", time.time() - t))
        t = time.time()
        job.rescale("totals", 2, strategy="all-at-once")
        steps.append(("rescale", time.time() - t))
    except Exception:
        print(steps)
        job.stop()
        raise
    print(steps)
    job.wait(timeout=120)
    check_exact(job, frame, outs, str(tmp_path / "out"))
    cps = job.checkpoints()
    moves = [h for h in job.history if h.get("kind") in ("rescale", None)]
    assert len(cps) >= 5 and job.checkpoint_failures == 0 and moves
    # checkpoints completed between the first and the last reconfiguration
    first, last = job.history[0]["started"], job.history[-1]["completed"]
    assert ((cps["completed"] > first) & (cps["completed"] < last)).any()
    job.stop()


@pytest.fixture(scope="module")
def savepoint(two_workers, data, tmp_path_factory):
    """A savepoint of the job at parallelism 4, taken about 1 s in."""
    path, frame = data
    root = tmp_path_factory.mktemp("sp")
    src, _ = build(path, str(root / "out"), rate=60_000, p_agg=4)
    job = streamlb.run(src, client=two_workers)
    time.sleep(1.0)
    sp = job.savepoint(str(root / "savepoint"))
    cps = job.checkpoints()
    job.stop()
    assert len(cps) == 1 and cps["kind"].iloc[0] == "savepoint" and cps["full"].iloc[0]
    return sp


@pytest.mark.parametrize("parallelism", [2, 8])
def test_restore_a_savepoint_at_another_parallelism(two_workers, data, savepoint, tmp_path, parallelism):
    path, frame = data
    src, _ = build(path, str(tmp_path / "out"), p_agg=parallelism, p_map=parallelism)
    job = streamlb.run(src, client=two_workers, restore=savepoint)
    assert job.parallelism("totals") == parallelism
    job.wait(timeout=120)
    truth = frame.groupby("key")["value"].agg(["count", "sum"])
    state = job.state("totals")
    np.testing.assert_array_equal(state["n"].to_numpy(), truth["count"].to_numpy())
    np.testing.assert_array_equal(state["s"].to_numpy(), truth["sum"].to_numpy())
    counts = job.state("running")["state"]
    pd.testing.assert_series_equal(counts.astype(np.int64), frame.groupby("key").size().rename("state"),
                                   check_names=False)
    # the restored job read only what came after the savepoint
    assert 0 < job.summary()["records"] < len(frame)
    job.stop()


def test_bad_checkpoints_are_refused_naming_the_file(two_workers, data, savepoint, tmp_path):
    import shutil

    from streamlb._checkpoint._manifest import read_manifest

    path, _ = data
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    src, _ = build(path, str(tmp_path / "out"))
    with pytest.raises(CheckpointError, match="not writable"):
        streamlb.run(src, client=two_workers, checkpoint=str(blocker / "ck"))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        streamlb.run(src, client=two_workers, restore=str(tmp_path))
    with pytest.raises(CheckpointError, match="does not exist"):
        streamlb.run(src, client=two_workers, restore=str(tmp_path / "nowhere"))
    manifest, _ = read_manifest(savepoint)
    victim = sorted(manifest["files"])[0]
    # a missing file, then a flipped byte: each named
    broken = tmp_path / "broken"
    shutil.copytree(savepoint, broken)
    os.remove(broken / victim)
    with pytest.raises(CheckpointError, match=os.path.basename(victim)):
        streamlb.run(src, client=two_workers, restore=str(broken))
    shutil.rmtree(broken)
    shutil.copytree(savepoint, broken)
    raw = bytearray((broken / victim).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (broken / victim).write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=os.path.basename(victim)):
        streamlb.run(src, client=two_workers, restore=str(broken))
    # graphs that do not match
    other, _ = build(path, str(tmp_path / "out2"), spec={"n": ("value", "count")})
    with pytest.raises(CheckpointError, match="operator 'totals' has spec"):
        streamlb.run(other, client=two_workers, restore=savepoint)
    other, _ = build(path, str(tmp_path / "out3"), agg_name="sums")
    with pytest.raises(CheckpointError, match="'totals'"):
        streamlb.run(other, client=two_workers, restore=savepoint)
    with pytest.raises(CheckpointError, match="key_groups=1024"):
        streamlb.run(src, client=two_workers, restore=savepoint, key_groups=256)


def test_a_failing_checkpoint_write_does_not_stop_the_job(two_workers, data, tmp_path):
    """The aggregate's snapshot directory is a regular file at first: its writes fail, the
    job goes on and counts the failures; once the path is fixed, checkpoints complete (the
    first one in full)."""
    path, frame = data
    ck = tmp_path / "ck"
    (ck / "data").mkdir(parents=True)
    (ck / "data" / "totals").write_text("in the way")
    src, outs = build(path, str(tmp_path / "out"), rate=60_000)
    job = streamlb.run(src, client=two_workers, checkpoint=str(ck), checkpoint_interval=0.15)
    deadline = time.time() + 30
    while job.checkpoint_failures < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert job.checkpoint_failures >= 2 and job.checkpoints().empty
    os.remove(ck / "data" / "totals")
    job.wait(timeout=120)
    check_exact(job, frame, outs, str(tmp_path / "out"))
    cps = job.checkpoints()
    assert len(cps) >= 1 and cps["full"].iloc[0]
    job.stop()


# -- a `dask scheduler` and three `dask worker` processes; one is SIGKILLed ----------------------
@pytest.fixture(scope="module")
def cluster3():
    from distributed import Client

    with dask_cli_cluster(workers=3) as address, Client(address) as c:
        yield c


def _kill_one(client, job) -> str:
    """SIGKILL the process of a worker that holds instances of ``job``; its address."""
    pids = client.run(os.getpid)
    victim = sorted(set(job.workers_of.values()))[0]
    os.kill(pids[victim], signal.SIGKILL)
    return victim


def _wait_for_a_checkpoint_with_keys(job, timeout: float = 30.0) -> None:
    """Return once the job's latest complete checkpoint holds keys, or after ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = job.checkpoints()
        if len(done) and done["keys"].iloc[-1] > 0:
            return
        time.sleep(0.01)


def _faulty_run(client, data, tmp_path, when, **run_kw):
    """Run the job, call ``when(job)`` until it says the moment has come, kill a worker,
    wait; the job must be exact and record one recovery."""
    path, frame = data
    client.wait_for_workers(3, timeout=60)      # the nanny restarted the last victim
    out = str(tmp_path / "out")
    src, outs = build(path, out, rate=60_000)
    job = streamlb.run(src, client=client, checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3, **run_kw)
    deadline = time.time() + 30
    while not when(job) and time.time() < deadline:
        time.sleep(0.002)
    victim = _kill_one(client, job)
    job.wait(timeout=180)
    check_exact(job, frame, outs, out)
    recoveries = [h for h in job.history if h.get("kind") == "recovery"]
    assert len(recoveries) == 1 and recoveries[0]["lost_workers"] == [victim]
    assert victim not in job.workers_of.values()
    job.stop()
    return recoveries[0]


@pytest.mark.cluster
@settings(max_examples=3, deadline=None, phases=[Phase.generate], derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(moment=st.floats(0.05, 1.7))
def test_sigkill_of_a_worker_at_any_moment_is_recovered_exactly(cluster3, data, tmp_path_factory, moment):
    t0 = time.time()
    rec = _faulty_run(cluster3, data, tmp_path_factory.mktemp("kill"), lambda job: time.time() - t0 >= moment)
    assert rec["time_to_resume"] < 30


@pytest.mark.cluster
@pytest.mark.slow
@settings(max_examples=25, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
@given(moment=st.floats(0.0, 1.8))
def test_sigkill_at_any_moment_many_examples(cluster3, data, tmp_path_factory, moment):
    t0 = time.time()
    _faulty_run(cluster3, data, tmp_path_factory.mktemp("kill"), lambda job: time.time() - t0 >= moment)


@pytest.mark.cluster
def test_sigkill_with_the_state_in_rocksdb_is_recovered_exactly(cluster3, data, tmp_path):
    """The aggregate's and the stateful map's state in RocksDB (a database per instance):
    restored from the checkpoint's files on the workers left."""
    dbs = tmp_path / "db"
    seen = set()

    def after_a_checkpoint_with_keys(job):
        done = job.checkpoints()
        seen.update(d.split("-")[0] for d in (os.listdir(dbs) if dbs.exists() else ()))
        return len(done) and done["keys"].iloc[-1] > 0

    with dask.config.set({"streamlb.state.dir": str(dbs)}):
        rec = _faulty_run(cluster3, data, tmp_path, after_a_checkpoint_with_keys, state_backend="rocksdb")
    assert rec["restored_keys"] > 0
    assert seen == {"totals", "running"}


@pytest.mark.cluster
def test_sigkill_during_a_checkpoint(cluster3, data, tmp_path):
    seen = []

    def during(job):
        if job.checkpoints().shape[0] >= 1 and job.checkpointer.in_progress is not None:
            seen.append(job.checkpointer.in_progress)
            return True
        return False

    rec = _faulty_run(cluster3, data, tmp_path, during)
    assert seen and rec["checkpoint"] is not None and rec["checkpoint"] < seen[0] + 1


@pytest.mark.cluster
def test_sigkill_during_a_live_migration(cluster3, data, tmp_path):
    stop = threading.Event()
    moving = threading.Event()

    def mover(job):
        i = 0
        while not stop.is_set() and job.status == "running":
            try:
                moving.set()
                job.migrate("totals", range(i % 1024, i % 1024 + 200), (i // 200) % 3,
                            strategy=["fluid", "all-at-once", "lazy"][i % 3])
            except Exception:
                pass                        # the move lost its actors: the job recovers
            i += 200

    threads = []

    def when(job):
        if not threads:
            threads.append(threading.Thread(target=mover, args=(job,), daemon=True))
            threads[0].start()
        op = job.control.operators["totals"]
        return moving.is_set() and op.in_flight and job.checkpoints().shape[0] >= 1

    try:
        _faulty_run(cluster3, data, tmp_path, when)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)


@pytest.mark.cluster
def test_restart_attempts_exhausted_fails_naming_the_worker(cluster3, data, tmp_path):
    path, _ = data
    cluster3.wait_for_workers(3, timeout=60)
    src, _ = build(path, str(tmp_path / "out"), rate=40_000)
    job = streamlb.run(src, client=cluster3, checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.2,
                       restart_attempts=0)
    deadline = time.time() + 20
    while job.checkpoints().empty and time.time() < deadline:
        time.sleep(0.02)
    victim = _kill_one(cluster3, job)
    with pytest.raises(JobFailedError) as err:
        job.wait(timeout=60)
    msg = str(err.value)
    assert victim in msg and "restart_attempts=0" in msg and "last complete checkpoint: checkpoint" in msg
    job.stop()


# -- faults beyond one lost worker (docs/fault-tolerance.md, "Faults and what streamlb does") ---------
def _checkpointed_run(client, data, tmp_path, rate: int, **run_kw):
    """The job of :func:`build` at ``rate`` rows/s, checkpointed, once its first checkpoint
    completed: ``(job, frame, outs, out, pids)`` (pids: each worker's process id)."""
    path, frame = data
    client.wait_for_workers(3, timeout=60)
    out = str(tmp_path / "out")
    src, outs = build(path, out, rate=rate)
    job = streamlb.run(src, client=client, checkpoint=str(tmp_path / "ck"), **{"checkpoint_interval": 0.3, **run_kw})
    pids = client.run(os.getpid)
    deadline = time.time() + 20
    while job.checkpoints().empty and time.time() < deadline:
        time.sleep(0.02)
    return job, frame, outs, out, pids


def _job_worker(job, operator: str, exclude=()) -> str:
    """A worker holding an instance of ``operator`` (not one of ``exclude``)."""
    return sorted({w for k, w in job.workers_of.items()
                   if job.plan.stages[k[0]].name == operator and w not in exclude})[0]


@pytest.mark.cluster
def test_a_worker_lost_during_a_recovery_is_one_more_attempt(cluster3, data, tmp_path):
    """A second worker SIGKILLed while the job recovers from a first (as the recovery
    re-creates the instances, on one of the workers it places them on): one more recovery
    attempt, and ``wait()`` returns exact. At b858ae2 ``wait()`` raised ``OSError: Unable to
    contact Actor's worker`` while ``status`` said "running"."""
    job, frame, outs, out, pids = _checkpointed_run(cluster3, data, tmp_path, 60_000)
    killed = []
    deploy = job._deploy

    def deploy_after_a_second_kill(workers, restored, fresh_clock, run=0):
        """The recovery's deploy: SIGKILL one of the workers it is about to use, first."""
        if run and len(killed) == 1:
            killed.append(sorted(workers)[0])
            os.kill(pids[killed[-1]], signal.SIGKILL)
        return deploy(workers, restored, fresh_clock, run)

    job._deploy = deploy_after_a_second_kill
    killed.append(_job_worker(job, "totals"))
    os.kill(pids[killed[0]], signal.SIGKILL)
    job.wait(timeout=180)
    assert job.status == "done" and job.error is None
    check_exact(job, frame, outs, out)
    assert len(killed) == 2
    faults = job.failures()
    print("\n" + faults.to_string())
    assert faults["attempt"].max() >= 2 and (faults["action"] == "recovered").sum() >= 1
    assert not killed[0] in job.workers_of.values() and not killed[1] in job.workers_of.values()
    job.stop()


@pytest.mark.cluster
@pytest.mark.parametrize("change", ["rescale", "move"])
def test_a_worker_lost_during_a_rescale_or_move_ends_the_call_with_what_is_in_force(
        cluster3, data, tmp_path, change):
    """A worker SIGKILLed while ``rescale`` / ``move_instance`` runs: the job recovers
    exactly, and the call returns or raises a ReconfigurationError saying it was undone and
    the parallelism then in force; never Dask's own error (``RuntimeError: Worker holding
    Actor was lost``, ``OSError``, ``CommClosedError``), as at b858ae2."""
    from streamlb import ReconfigurationError

    job, frame, outs, out, pids = _checkpointed_run(cluster3, data, tmp_path, 30_000)
    deadline = time.time() + 20
    busy, killed = threading.Event(), []

    def kill_when_busy():
        while not job.reconfig._busy and time.time() < deadline + 30:
            time.sleep(0.0005)
        killed.append(_job_worker(job, "totals"))
        os.kill(pids[killed[0]], signal.SIGKILL)
        busy.set()

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    try:
        if change == "rescale":
            job.rescale("totals", 5)
        else:
            here = job.workers_of[(job.plan.stage("totals").id, 0)]
            job.move_instance("totals", 0, sorted(w for w in pids if w != here)[0])
        outcome = "returned"
    except ReconfigurationError as exc:
        outcome = str(exc)
        assert "undone" in outcome or "did not complete" in outcome, outcome
        if "undone" in outcome:
            assert f"'totals' runs {job.parallelism('totals')} instances now" in outcome, outcome
    killer.join(timeout=60)
    print(f"\n{change}: {outcome}")
    assert busy.is_set()
    job.wait(timeout=180)
    check_exact(job, frame, outs, out)
    assert any(h.get("kind") == "recovery" for h in job.history)
    job.stop()


@pytest.mark.cluster
def test_a_lost_scheduler_fails_the_job_naming_the_checkpoint_to_resume(data, tmp_path):
    """The `dask scheduler` SIGKILLed under a job of ``streamlb.run``: ``wait()`` raises a
    JobFailedError that says the scheduler was lost and names the latest complete checkpoint
    and the call that resumes it, and ``status``/``error`` say the same (at b858ae2: a raw
    ``OSError``/``CommClosedError`` with ``status`` "running"). Resumed as it says on a new
    cluster, the job ends exact."""
    from distributed import Client

    path, frame = data
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    with dask_cli_cluster(workers=2) as address, Client(address) as client:
        src, outs = build(path, out, rate=30_000)
        job = streamlb.run(src, client=client, checkpoint=ck, checkpoint_interval=0.3)
        deadline = time.time() + 20
        while len(job.checkpoints()) < 2 and time.time() < deadline:
            time.sleep(0.02)
        os.kill(client.run_on_scheduler(os.getpid), signal.SIGKILL)
        t0 = time.time()
        with pytest.raises(JobFailedError) as err:
            job.wait(timeout=120)
        took = time.time() - t0
        msg = str(err.value)
        print(f"\nfailed {took:.1f} s after the scheduler's SIGKILL: {msg}")
        cid = job.checkpointer.completed_id
        assert "scheduler" in msg and address.split("//")[1] in msg, msg
        assert f"checkpoint is {cid} in" in msg and f"checkpoint={ck!r}" in msg, msg
        assert job.status == "failed" and job.error is err.value
        job.stop()
    with dask_cli_cluster(workers=2) as address, Client(address) as client:
        src, outs2 = build(path, out, rate=None)
        job = streamlb.run(src, client=client, checkpoint=ck)
        job.wait(timeout=120)
        check_exact(job, frame, outs + outs2, out)
        job.stop()


@pytest.mark.cluster
def test_restart_attempts_bound_recoveries_in_a_row_not_a_jobs_life(cluster3, data, tmp_path):
    """``restart_attempts=1``: a worker lost, the job recovers and completes a checkpoint,
    then another worker lost: recovered too (a completed checkpoint starts the count afresh;
    it bounds a crash loop, not an unbounded job's life). Exact against pandas."""
    job, frame, outs, out, pids = _checkpointed_run(cluster3, data, tmp_path, 30_000, checkpoint_interval=0.2,
                                                    restart_attempts=1)
    for n in (1, 2):
        deadline = time.time() + 20
        done = job.checkpointer.completed_id
        while job.checkpointer.completed_id <= done and time.time() < deadline:
            time.sleep(0.02)                # a checkpoint completed since the start / the recovery
        os.kill(pids[_job_worker(job, "totals")], signal.SIGKILL)
        while sum(h.get("kind") == "recovery" for h in job.history) < n and time.time() < deadline + 30:
            time.sleep(0.02)
    job.wait(timeout=180)
    check_exact(job, frame, outs, out)
    faults = job.failures()
    assert list(faults["action"]) == ["recovered", "recovered"] and list(faults["attempt"]) == [1, 1], faults
    job.stop()
