"""Jobs that outlive the script that started them (docs/jobs.md), on real processes: a
``dask scheduler --preload streamlb.plugin --streamlb-jobs-dir D`` and ``dask worker``
processes on loopback; jobs submitted from other processes (``streamlb submit``) and
operated with the CLI verbs; drivers and the scheduler SIGKILLed. Every output is checked
against pandas over the same input: each record exactly once."""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

import streamlb
from streamlb import JobServiceError

from conftest import HERE, free_port

pytestmark = pytest.mark.cluster

SPEC = {"n": ("value", "count"), "total": ("value", "sum")}
SCRIPT = '''
from streamz import Stream


def pipeline(inp, out):
    src = Stream.from_parquet(inp, watch="200ms", batch_size=1_000)
    src.to_parquet(out + "/raw")
    src.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")},
                                name="totals").to_parquet(out + "/agg")
    return src


def to_a_list(inp):
    src = Stream.from_parquet(inp, watch="200ms")
    src.key_by("key").aggregate({"n": ("value", "count")}, name="totals").sink_to_list()
    return src


def state_only(inp):
    src = Stream.from_parquet(inp, watch="200ms")
    src.key_by("key").aggregate({"n": ("value", "count")}, name="totals")
    return src


def with_kafka(inp, out, topic, bootstrap):
    src = pipeline(inp, out)
    src.to_kafka_topic(topic, {"bootstrap.servers": bootstrap}, key="key")
    return src


def kafka(topic, conf, out):
    src = Stream.from_kafka_topic(topic, {"bootstrap.servers": conf}, decode="json", offsets="earliest",
                                  batch_size=1_000)
    src.to_parquet(out + "/raw")
    src.key_by("key").aggregate({"n": ("value", "count"), "total": ("value", "sum")},
                                name="totals").to_parquet(out + "/agg")
    return src
'''


class Cluster:
    """A scheduler with the job registry and worker processes, started as a supervisor would."""

    def __init__(self, root, workers: int = 2, env: dict | None = None) -> None:
        self.root, self.n = str(root), workers
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.jobs_dir = os.path.join(self.root, "jobs")
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
                        DASK_SCHEDULER_ADDRESS=self.address, **(env or {}))
        self.dask = shutil.which("dask") or os.path.join(os.path.dirname(sys.executable), "dask")
        self.scheduler = None
        self.workers: list[subprocess.Popen] = []
        self.logs = os.environ.get("STREAMLB_CLUSTER_LOGS")

    def _out(self, name: str) -> dict:
        if not self.logs:
            return {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        os.makedirs(self.logs, exist_ok=True)
        return {"stdout": open(os.path.join(self.logs, f"{self.port}-{name}.log"), "ab"),
                "stderr": subprocess.STDOUT}

    def start_scheduler(self) -> None:
        self.scheduler = subprocess.Popen(
            [self.dask, "scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--dashboard-address", ":0",
             "--preload", "streamlb.plugin", "--streamlb-jobs-dir", self.jobs_dir],
            env=self.env, **self._out("scheduler"))

    def start_workers(self) -> None:
        self.workers = [subprocess.Popen([self.dask, "worker", self.address, "--nthreads", "1", "--host",
                                          "127.0.0.1", "--dashboard-address", ":0"], env=self.env,
                                         **self._out(f"worker{i}")) for i in range(self.n)]
        from distributed import Client

        deadline = time.time() + 60
        while True:
            try:
                with Client(self.address, timeout=5) as c:
                    c.wait_for_workers(self.n, timeout=60)
                return
            except OSError:
                assert time.time() < deadline, "the cluster did not come up"
                time.sleep(0.5)

    def start(self) -> Cluster:
        self.start_scheduler()
        self.start_workers()
        return self

    def kill_scheduler(self) -> None:
        self.scheduler.send_signal(signal.SIGKILL)
        self.scheduler.wait(timeout=10)
        for w in self.workers:           # a worker exits when its scheduler is lost (distributed 2026.8)
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(timeout=10)

    def close(self) -> None:
        for group in (self.workers, [self.scheduler]):
            for p in group:
                if p is not None and p.poll() is None:
                    p.terminate()
            for p in group:
                if p is None:
                    continue
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "streamlb.cli", *args], env=self.env, cwd=self.root,
                           capture_output=True, text=True, timeout=180)
        if check:
            assert r.returncode == 0, f"streamlb {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One cluster for the module. Its drivers die after a checkpoint's manifest once a
    test writes that checkpoint's id into ``cluster.kill_after`` (the test hook of
    streamlb._recovery._coordinator); the last test kills its scheduler."""
    root = tmp_path_factory.mktemp("service")
    with open(root / "job.py", "w") as f:
        f.write(SCRIPT)
    kill_after = str(root / "kill-after")
    cluster = Cluster(root, env={"STREAMLB_TEST_KILL_AFTER_MANIFEST": kill_after})
    cluster.kill_after = kill_after
    cluster.start()
    yield cluster
    cluster.close()


def pipelines(service) -> dict:
    """The functions of the module's job script, to build pipelines in this process."""
    namespace: dict = {}
    exec(compile(SCRIPT, str(os.path.join(service.root, "job.py")), "exec"), namespace)
    return namespace


class Files:
    """A watched directory that files land in, each ``rows`` records with unique ids."""

    def __init__(self, root) -> None:
        self.dir = os.path.join(str(root), "in")
        os.makedirs(self.dir, exist_ok=True)
        self.frames: list[pd.DataFrame] = []

    def land(self, count: int = 1, rows: int = 3_000) -> None:
        for _ in range(count):
            i = len(self.frames)
            rng = np.random.default_rng(i)
            keys = np.where(rng.random(rows) < 0.3, rng.integers(0, 3, rows), rng.integers(0, 300, rows))
            df = pd.DataFrame({"id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64),
                               "key": keys.astype(np.int64), "value": rng.integers(0, 1000, rows)})
            tmp = os.path.join(self.dir, f"_tmp-{i}.parquet")
            df.to_parquet(tmp)
            os.rename(tmp, os.path.join(self.dir, f"part-{i:04d}.parquet"))
            self.frames.append(df)

    @property
    def records(self) -> int:
        return sum(len(f) for f in self.frames)


def exactly_once(out: str, frames: list[pd.DataFrame]) -> None:
    """``out/raw`` holds every input record once; the last update per key in ``out/agg`` is
    pandas' aggregate of all of them."""
    inp = pd.concat(frames, ignore_index=True)
    raw = pd.read_parquet(os.path.join(out, "raw"))
    counts = raw["id"].value_counts()
    assert not (counts > 1).any(), f"{int((counts > 1).sum())} records written more than once"
    assert len(raw) == len(inp), f"{len(raw)} records written, {len(inp)} read"
    assert set(raw["id"]) == set(inp["id"])
    agg = pd.read_parquet(os.path.join(out, "agg"))
    agg = agg.reset_index() if "key" not in agg.columns else agg
    final = agg.sort_values("n", kind="stable").groupby("key").last()[["n", "total"]].astype(np.int64)
    truth = inp.groupby("key").agg(n=("value", "count"), total=("value", "sum")).astype(np.int64)
    pd.testing.assert_frame_equal(final.sort_index(), truth.sort_index(), check_names=False)


def until(what, check, timeout: float = 60.0, every: float = 0.1):
    deadline = time.time() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.time() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(every)


def read_all(job, want: int, timeout: float = 60.0) -> None:
    """Until the job's aggregate holds ``want`` records."""
    until(f"{want} records in the state", lambda: job.state("totals")["n"].sum() >= want, timeout, 0.2)


def submit(service, name: str, files: Files, out: str, *extra: str) -> streamlb.RemoteJob:
    r = service.cli("submit", "job.py", files.dir, out, "--name", name, *extra)
    assert f"job {name} (" in r.stdout
    return streamlb.attach(service.address, name)


def test_a_submitted_job_outlives_its_script_and_is_operated_from_other_processes(service, tmp_path):
    files, out, ck = Files(tmp_path), str(tmp_path / "out"), str(tmp_path / "ck")
    files.land(2)
    # the submitting process (streamlb submit) has exited when this returns
    job = submit(service, "watched", files, out, "--checkpoint", ck, "--checkpoint-interval", "1s")
    read_all(job, files.records)
    listed = service.cli("jobs").stdout
    assert "watched" in listed and "running" in listed, listed
    table = json.loads(service.cli("jobs", "--json").stdout)
    row = next(r for r in table if r["name"] == "watched")
    assert row["status"] == "running" and row["parallelism"]["totals"] == 2 and row["restarts"] == 0
    files.land(1)
    assert "runs as 3 instances" in service.cli("job", "rescale", "watched", "totals", "3").stdout
    assert job.parallelism("totals") == 3
    sp = str(tmp_path / "sp")
    service.cli("job", "savepoint", "watched", sp)
    assert os.path.exists(os.path.join(sp, "_manifest.json")) or glob.glob(os.path.join(sp, "*manifest*"))
    files.land(2)
    read_all(job, files.records)
    described = service.cli("job", "describe", "watched").stdout
    assert "totals x3" in described and "driver" in described
    service.cli("job", "stop", "watched")
    assert job.status == "finished"
    exactly_once(out, files.frames)
    job.close()


def test_a_killed_driver_is_replaced_and_the_job_stays_exactly_once(service, tmp_path):
    files, out, ck = Files(tmp_path), str(tmp_path / "out"), str(tmp_path / "ck")
    files.land(2)
    job = streamlb.submit(pipelines(service)["pipeline"](files.dir, out), address=service.address,
                          name="driver-kill", checkpoint=ck, checkpoint_interval="1s")
    read_all(job, files.records)
    for round in range(2):
        pid = job.describe()["driver"]["pid"]
        os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        files.land(1)
        rec = until("a new driver running the job",
                    lambda: (lambda r: r if r["status"] == "running" and r["driver"]["pid"] != pid else None)(
                        job.describe()), timeout=60)
        print(f"driver {round + 1} SIGKILLed: running again after {time.time() - t0:.2f} s")
        assert rec["restarts"] == round + 1
        read_all(job, files.records)
    job.stop()
    exactly_once(out, files.frames)
    assert job.describe()["status"] == "finished"
    job.close()


def kafka_ids(kafka, topic: str) -> pd.Series:
    """The ``id`` of every record ``topic`` holds, read committed."""
    values = [v for _, _, _, v in kafka.read_all(topic, isolation="read_committed")]
    return pd.Series([json.loads(v)["id"] for v in values], dtype=np.int64)


def test_a_driver_killed_between_a_manifest_and_its_commit_loses_no_output(service, kafka, tmp_path):
    from kafka_broker import topic_name

    files, out, ck = Files(tmp_path), str(tmp_path / "out"), str(tmp_path / "ck")
    topic = kafka.create_topic(topic_name("sealed"), partitions=2)
    files.land(2)
    job = streamlb.submit(pipelines(service)["with_kafka"](files.dir, out, topic, kafka.bootstrap),
                          address=service.address, name="sealed", checkpoint=ck, checkpoint_interval="1s")
    read_all(job, files.records)
    done = until("a checkpoint", lambda: (job.describe()["info"].get("checkpoint") or {}).get("id"))
    pid = job.describe()["driver"]["pid"]
    with open(service.kill_after + ".tmp", "w") as f:
        f.write(str(done + 2))
    os.rename(service.kill_after + ".tmp", service.kill_after)      # armed: the driver dies at that manifest
    files.land(2)           # outputs the checkpoint seals when the driver dies
    until("the driver killed at the manifest and a new one running",
          lambda: (lambda r: r["status"] == "running" and r["driver"]["pid"] != pid)(job.describe()), timeout=90)
    assert not os.path.exists(service.kill_after), "the hook did not fire"
    files.land(1)
    read_all(job, files.records)
    job.stop()
    exactly_once(out, files.frames)
    ids = kafka_ids(kafka, topic)
    assert not ids.duplicated().any() and set(ids) == set(pd.concat(files.frames)["id"])
    assert len(ids) == files.records
    job.close()


def test_stop_with_a_savepoint_then_submit_with_restore_at_another_parallelism(service, tmp_path):
    files, out = Files(tmp_path), str(tmp_path / "out")
    files.land(2)
    job = submit(service, "upgrade", files, out, "--checkpoint", str(tmp_path / "ck1"))
    read_all(job, files.records)
    sp = str(tmp_path / "sp")
    assert f"savepoint at {sp}" in service.cli("job", "stop", "upgrade", "--savepoint", sp).stdout
    assert job.status == "finished"
    files.land(2)          # while no job runs
    job = submit(service, "upgrade", files, out, "--restore", sp, "--parallelism", "3",
                 "--checkpoint", str(tmp_path / "ck2"))
    assert job.parallelism("totals") == 3
    read_all(job, files.records)
    job.stop()
    exactly_once(out, files.frames)
    job.close()


def test_bad_commands_are_refused_and_change_nothing(service, tmp_path):
    from streamlb import ReconfigurationError

    files, out = Files(tmp_path), str(tmp_path / "out")
    files.land(1)
    made = pipelines(service)
    job = streamlb.submit(made["pipeline"](files.dir, out), address=service.address, name="steady",
                          checkpoint=str(tmp_path / "ck"))
    read_all(job, files.records)

    def refused(*args, says: str):
        r = service.cli(*args, check=False)
        assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
        assert says in r.stderr, (args, r.stderr)

    refused("job", "stop", "nope", says="no job named 'nope' on this cluster")
    refused("job", "rescale", "steady", "totals", "0", says="parallelism must be an integer in 1..")
    sp = tmp_path / "taken"
    sp.mkdir()
    refused("job", "savepoint", "steady", str(sp), says=f"savepoint path '{sp}' exists already")
    refused("submit", "job.py:to_a_list", files.dir, "--name", "listed", says="sink_to_list")
    with pytest.raises(ReconfigurationError, match="no operator named 'nope'"):
        job.rescale("nope", 3)
    with pytest.raises(JobServiceError, match="a job named 'steady' is running"):
        streamlb.submit(made["pipeline"](files.dir, out), address=service.address, name="steady")
    with pytest.raises(JobServiceError, match="no sink: its results could only be read with job.state()"):
        streamlb.submit(made["state_only"](files.dir), address=service.address, name="stateonly")
    with pytest.raises(JobServiceError, match="no job named 'nope'"):
        streamlb.attach(service.address, "nope")
    # nothing changed: the same job runs on, as it was, and reads what lands
    rec = job.describe()
    assert rec["status"] == "running" and rec["restarts"] == 0
    assert job.parallelism("totals") == 2 and os.listdir(sp) == []
    assert {"listed", "stateonly"}.isdisjoint(streamlb.jobs(service.address)["name"])
    files.land(1)
    read_all(job, files.records)
    job.cancel()
    assert job.status == "cancelled"
    with pytest.raises(JobServiceError, match="job 'steady' is cancelled"):
        job.savepoint(str(tmp_path / "late"))
    job.close()


def test_a_definition_another_version_wrote_is_refused_naming_both(tmp_path):
    from streamlb.service import _definition

    data = _definition.dump("j", plan=None, options=None, ranges={})
    head, _, body = data.partition(b"\n")
    other = json.dumps({**json.loads(head), "streamlb": "0.0.1"}).encode() + b"\n" + body
    here = streamlb.__version__
    with pytest.raises(JobServiceError, match=r"written by streamlb 0\.0\.1 .*this is streamlb " + here):
        _definition.load(other, "d.pkl")
    # a body that needs a module this process cannot import
    mod = tmp_path / "gone_mod.py"
    mod.write_text("class Thing:\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import pickle

        import gone_mod
        body = pickle.dumps({"plan": gone_mod.Thing(), "options": None, "ranges": {}})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("gone_mod", None)
    with pytest.raises(JobServiceError, match="cannot be loaded here: ModuleNotFoundError: No module named 'gone_mod'"):
        _definition.load(head + b"\n" + body, "d.pkl")


def test_every_job_resumes_by_itself_after_the_scheduler_is_killed_and_started_again(service, kafka, tmp_path):
    """The last test of the module: it kills the module's scheduler. A watched-directory job
    and a Kafka-fed one (submitted from a script, rescaled, savepointed, its driver killed
    first) both resume from their latest complete checkpoints, exactly once."""
    from kafka_broker import topic_name

    files, out = Files(tmp_path), str(tmp_path / "out")
    files.land(2)
    job = submit(service, "survivor", files, out, "--checkpoint", str(tmp_path / "ck"),
                 "--checkpoint-interval", "1s")
    topic = kafka.create_topic(topic_name("svc"), partitions=2)
    frames: list[pd.DataFrame] = []

    def produce(rows: int = 3_000) -> None:
        i = len(frames)
        rng = np.random.default_rng(100 + i)
        df = pd.DataFrame({"id": np.arange(i * rows, (i + 1) * rows), "key": rng.integers(0, 200, rows),
                           "value": rng.integers(0, 1000, rows)})
        kafka.produce(topic, [line.encode() for line in df.to_json(orient="records", lines=True).splitlines()])
        frames.append(df)

    produce()
    kout = str(tmp_path / "kout")
    r = service.cli("submit", "job.py:kafka", topic, kafka.bootstrap, kout, "--name", "fed",
                    "--checkpoint", str(tmp_path / "kck"), "--checkpoint-interval", "1s")
    assert "job fed (" in r.stdout
    fed = streamlb.attach(service.address, "fed")
    read_all(fed, sum(map(len, frames)))
    produce()
    assert "runs as 3 instances" in service.cli("job", "rescale", "fed", "totals", "3").stdout
    service.cli("job", "savepoint", "fed", str(tmp_path / "sp"))
    read_all(fed, sum(map(len, frames)))
    pid = fed.describe()["driver"]["pid"]
    os.kill(pid, signal.SIGKILL)
    produce()
    until("a new driver for the Kafka-fed job",
          lambda: (lambda r: r["status"] == "running" and r["driver"]["pid"] != pid)(fed.describe()))
    read_all(fed, sum(map(len, frames)))
    read_all(job, files.records)
    for j in (job, fed):
        j.close()
    # a job another streamlb version wrote is in the registry too: listed as failed, with the reason
    bad = os.path.join(service.jobs_dir, "old")
    os.makedirs(bad)
    with open(os.path.join(bad, "definition.pkl"), "wb") as f:
        f.write(json.dumps({"format": 1, "name": "old", "streamlb": "0.0.1", "python": "3.9"}).encode() + b"\n")
    with open(os.path.join(bad, "job.json"), "w") as f:
        json.dump({"name": "old", "id": "deadbeef", "status": "running", "submitted": time.time(),
                   "checkpoint": str(tmp_path / "ck-old"), "workers": 1}, f)
    time.sleep(2.5)         # a checkpoint of each since the last records
    service.kill_scheduler()
    t0 = time.time()
    files.land(1)
    produce()
    service.start_scheduler()
    service.start_workers()       # as a supervisor restarts them
    job, fed = streamlb.attach(service.address, "survivor"), streamlb.attach(service.address, "fed")
    for j in (job, fed):
        until("the job running again", lambda: j.describe()["status"] == "running", timeout=90)
    print(f"scheduler SIGKILLed: both jobs run again after {time.time() - t0:.1f} s")
    read_all(job, files.records)
    read_all(fed, sum(map(len, frames)))
    listed = json.loads(service.cli("jobs", "--json").stdout)
    restarts = {r["name"]: r["restarts"] for r in listed}
    assert restarts["survivor"] == 1 and restarts["fed"] == 2, restarts
    old = next(r for r in listed if r["name"] == "old")
    assert old["status"] == "failed" and "written by streamlb 0.0.1" in old["error"], old
    files.land(1)
    service.cli("job", "stop", "survivor")
    fed.stop()
    exactly_once(out, files.frames)
    exactly_once(kout, frames)
    for j in (job, fed):
        assert j.status == "finished"
        j.close()


def test_a_record_that_cannot_be_read_is_listed_as_failed_with_the_reason(tmp_path):
    from streamlb._jobs import JobRecord

    good = JobRecord(name="good", id="1234abcd", status="running", submitted=time.time(), checkpoint="ck")
    good.save(str(tmp_path))
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "job.json").write_text('{"name": "torn", "id": ')
    records, unreadable = JobRecord.load_all(str(tmp_path))
    assert records["good"].status == "running" and records["good"].checkpoint == "ck"
    assert records["torn"].status == "failed" and "torn/job.json" in records["torn"].error
    assert "JSONDecodeError" in records["torn"].error and len(unreadable) == 1
