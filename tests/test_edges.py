"""The edges a user meets first: a script that never stops its job, a cluster closed under
a held job, the interpreter exiting while a job runs, Ctrl-C during ``wait``.

Each case runs as its own Python program with real worker processes, because what is
checked is how the program ends: by itself, soon, with exit 0 (or by the interrupt), and
without a traceback or an error logged by streamlb or distributed on the way out.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.cluster

DEADLINE = 30           # seconds each program has to end by itself

PRELUDE = """
import json, sys
import numpy as np, pandas as pd
from distributed import Client, LocalCluster
from streamz import Stream
import streamlb

rng = np.random.default_rng(0)
frames = [pd.DataFrame({"key": rng.integers(0, 50, 1000), "value": rng.integers(0, 100, 1000)})
          for _ in range(5)]


def dump(frame):
    print("STATE " + json.dumps({str(k): int(v) for k, v in frame["n"].items()}), flush=True)
"""


def _frames() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.concat([pd.DataFrame({"key": rng.integers(0, 50, 1000), "value": rng.integers(0, 100, 1000)})
                      for _ in range(5)])


def _expected_counts() -> dict:
    counts = _frames().groupby("key")["value"].count()
    return {str(k): int(v) for k, v in counts.items()}


def _program(tmp_path, body: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(PRELUDE + "\n\nif __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(body), "    "))
    return str(path)


def _run(path: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, path, *args], capture_output=True, text=True, timeout=DEADLINE, **kw)


def _quiet(stderr: str, tracebacks: int = 0) -> None:
    """No error logged by streamlb or distributed (nor tornado, which logs for them), and
    at most ``tracebacks`` tracebacks."""
    errors = [ln for ln in stderr.splitlines()
              if any(f"{name}" in ln for name in ("streamlb", "distributed", "tornado")) and " ERROR " in ln
              or " - ERROR - " in ln or " - CRITICAL - " in ln]
    assert not errors, stderr[-4000:]
    assert stderr.count("Traceback (most recent call last)") <= tracebacks, stderr[-4000:]


def _state(stdout: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("STATE "))
    return json.loads(line[len("STATE "):])


def test_unstopped_job_in_a_closing_cluster_exits(tmp_path):
    """The issue's script: the with-block closes the cluster; the job is never stopped."""
    prog = _program(tmp_path, """
        with LocalCluster(n_workers=2, processes=True, dashboard_address=":0") as cl:
            src = Stream.from_iterable(frames)
            src.key_by("key").aggregate({"n": ("value", "count")}, name="counts")
            job = streamlb.run(src, address=cl.scheduler_address, balancer="static")
            job.wait()
            dump(job.state("counts"))
        try:
            job.state("counts")
        except streamlb.JobReleasedError as exc:
            print("RELEASED " + str(exc), flush=True)
    """)
    t0 = time.time()
    r = _run(prog)
    assert r.returncode == 0, r.stderr[-4000:]
    assert time.time() - t0 < DEADLINE
    _quiet(r.stderr)
    assert _state(r.stdout) == _expected_counts()
    released = next(ln for ln in r.stdout.splitlines() if ln.startswith("RELEASED "))
    assert "job " in released and "workers are gone" in released


def test_client_and_cluster_closed_before_the_job_stops(tmp_path):
    prog = _program(tmp_path, """
        cl = LocalCluster(n_workers=2, processes=True, dashboard_address=":0")
        client = Client(cl)
        src = Stream.from_iterable(frames)
        src.key_by("key").aggregate({"n": ("value", "count")}, name="counts")
        job = streamlb.run(src, client=client, balancer="autoflow")
        job.wait()
        dump(job.state("counts"))
        seen = (len(job.imbalance("counts")), len(job.history), sorted(job.balancer_state()))
        client.close()
        cl.close()
        after = (len(job.imbalance("counts")), len(job.history), sorted(job.balancer_state()))
        print("KEPT %s" % (after == seen and seen[0] > 0), flush=True)
        try:
            job.state("counts")
        except streamlb.JobReleasedError as exc:
            print("RELEASED " + str(exc), flush=True)
    """)
    r = _run(prog)
    assert r.returncode == 0, r.stderr[-4000:]
    _quiet(r.stderr)
    assert _state(r.stdout) == _expected_counts()
    assert any(ln.startswith("RELEASED ") and "workers are gone" in ln for ln in r.stdout.splitlines())
    assert "KEPT True" in r.stdout, r.stdout        # what the driver held stays readable


@pytest.fixture(scope="module")
def paced_log(tmp_path_factory):
    """Two Parquet files of 100k rows each, read at 20k rows/s: a job of about 10 s."""
    path = tmp_path_factory.mktemp("edges") / "log"
    path.mkdir()
    rng = np.random.default_rng(1)
    for i in range(2):
        pd.DataFrame({"key": rng.integers(0, 50, 100_000), "value": rng.random(100_000)}).to_parquet(
            path / f"part-{i}.parquet")
    return str(path)


@pytest.mark.parametrize("where", ["embedded", "address"])
def test_interpreter_exits_while_a_job_runs(tmp_path, paced_log, where):
    """Never stopped: the exit hook stops the job (on the cluster ``run`` started, or on a
    LocalCluster the program left open) before Dask closes the clusters."""
    prog = _program(tmp_path, """
        import time
        src = Stream.from_parquet(sys.argv[1], rate=20_000)
        src.key_by("key").aggregate({"n": ("value", "count")}, name="counts")
        if sys.argv[2] == "embedded":
            job = streamlb.run(src, n_workers=2, balancer="autoflow", checkpoint=sys.argv[3])
        else:
            cl = LocalCluster(n_workers=2, processes=True, dashboard_address=":0")
            job = streamlb.run(src, address=cl.scheduler_address, balancer="autoflow", checkpoint=sys.argv[3])
        time.sleep(1.5)
        import logging
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("streamlb.job").setLevel(logging.INFO)
        print("LEAVING " + job.id + " " + job.status, flush=True)
    """)
    r = _run(prog, paced_log, where, str(tmp_path / "ckpt"))
    assert r.returncode == 0, r.stderr[-4000:]
    job, status = r.stdout.split("LEAVING ")[1].split()
    assert status == "running"
    assert f"job {job} stopped" in r.stderr, r.stderr[-3000:]      # by the exit hook
    _quiet(r.stderr)


def test_ctrl_c_during_wait_stops_the_job_and_removes_outputs(tmp_path, paced_log):
    out = tmp_path / "out"
    prog = _program(tmp_path, """
        src = Stream.from_parquet(sys.argv[1], rate=20_000)
        src.map(lambda df: df.assign(twice=df.value * 2)).to_parquet(sys.argv[2])
        job = streamlb.run(src, n_workers=2)
        print("RUNNING", flush=True)
        job.wait(progress=True)
    """)
    # its own process group, which gets the SIGINT as from a terminal's Ctrl-C: the
    # program and the worker processes of its embedded cluster alike
    p = subprocess.Popen([sys.executable, prog, paced_log, str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "RUNNING"
        staged = out / "_temporary"
        deadline = time.time() + 15
        while not (staged.is_dir() and any(staged.iterdir())) and time.time() < deadline:
            time.sleep(0.1)
        assert staged.is_dir() and any(staged.iterdir()), "the job wrote no part file to interrupt"
        time.sleep(1.0)
        t0 = time.time()
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=DEADLINE)
        took = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode in (-signal.SIGINT, 130), err[-4000:]
    assert took < 10, took
    _quiet(err, tracebacks=1)
    assert err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]
    left = [f for _, _, files in os.walk(out) for f in files]
    assert left == [], left


def test_embedded_workers_drop_only_the_heartbeat_error_of_their_own_close(tmp_path):
    """A worker closing under an in-flight heartbeat logs it broken (distributed's own race;
    it failed the Ctrl-C test above once in CI): the embedded cluster's
    workers drop that record while they close, and keep it, and every other, otherwise."""
    prog = _program(tmp_path, """
        import logging
        from distributed import Status

        def emit(dask_worker):
            log = logging.getLogger("distributed.worker")
            seen = []
            handler = logging.Handler()
            handler.emit = lambda record: seen.append((dask_worker.status.name, record.getMessage()))
            log.addHandler(handler)
            before = dask_worker.status
            try:
                for status in (Status.running, Status.closing):
                    dask_worker.status = status
                    log.error("Failed to communicate with scheduler during heartbeat.")
                    log.error("Worker stream died during communication: x")
            finally:
                dask_worker.status = before
                log.removeHandler(handler)
            core = logging.getLogger("distributed.core")
            calls = logging.Handler()
            calls.emit = lambda record: seen.append(("call", str(record.exc_info[1].args[0])))
            core.addHandler(calls)
            held = next(iter(dask_worker.state.actors), "")
            try:        # calls that came for a freed streamlb actor, a held one, another actor
                for key in ("streamlb-gone-0-1", held, "other-actor"):
                    try:
                        raise KeyError(key)
                    except KeyError:
                        core.exception("Exception while handling op actor_execute")
            finally:
                core.removeHandler(calls)
            return seen, held

        src = Stream.from_iterable(frames)
        src.key_by("key").aggregate({"n": ("value", "count")}, name="counts")
        job = streamlb.run(src, n_workers=1)
        job.wait()
        seen = list(job.client.run(emit).values())[0]
        print("SEEN " + json.dumps(seen), flush=True)
        job.stop()
    """)
    out = _run(prog)
    assert out.returncode == 0, out.stderr[-4000:]
    seen, held = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("SEEN "))[5:])
    assert held.startswith("streamlb-"), held       # the finished job's instance, still held
    # dropped: the heartbeat while closing, and the call for a streamlb actor the worker no
    # longer holds; kept: the rest
    assert seen == [["running", "Failed to communicate with scheduler during heartbeat."],
                    ["running", "Worker stream died during communication: x"],
                    ["closing", "Worker stream died during communication: x"],
                    ["call", held], ["call", "other-actor"]]


def test_a_held_finished_job_lets_the_cluster_scale_down_and_close(tmp_path):
    prog = _program(tmp_path, """
        import time
        cl = LocalCluster(n_workers=2, processes=True, dashboard_address=":0")
        client = Client(cl)
        src = Stream.from_iterable(frames)
        src.key_by("key").aggregate({"n": ("value", "count")}, name="counts", parallelism=2)
        job = streamlb.run(src, client=client, balancer="autoflow")
        job.wait()
        dump(job.state("counts"))
        windows = len(job.metrics())
        cl.scale(1)
        client.wait_for_workers(1)
        deadline = time.time() + 15
        while len(client.scheduler_info()["workers"]) > 1 and time.time() < deadline:
            time.sleep(0.1)
        print("WORKERS %d" % len(client.scheduler_info()["workers"]), flush=True)
        print("METRICS %s" % (len(job.metrics()) >= windows > 0), flush=True)
        try:
            job.state("counts")
            print("ANSWERED", flush=True)
        except streamlb.JobReleasedError as exc:
            print("RELEASED " + str(exc), flush=True)
        client.close()
        cl.close()
        print("CLOSED", flush=True)
    """)
    r = _run(prog)
    assert r.returncode == 0, r.stderr[-4000:]
    _quiet(r.stderr)
    assert _state(r.stdout) == _expected_counts()
    assert "WORKERS 1" in r.stdout and "CLOSED" in r.stdout and "METRICS True" in r.stdout, r.stdout
    assert any(ln.startswith("RELEASED ") and "retired" in ln for ln in r.stdout.splitlines()), r.stdout
