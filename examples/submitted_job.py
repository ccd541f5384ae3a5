"""A job that outlives the script that submitted it: submit, list, rescale, lose its driver, stop.

Starts a cluster of its own on loopback, as you would on real hosts: a Dask scheduler with
streamlb's preload and a job registry directory (``dask scheduler --preload streamlb.plugin
--streamlb-jobs-dir DIR``) and two ``dask worker`` processes. Parquet files land in a watched
directory while a keyed aggregate over them, with ``to_parquet`` outputs and checkpoints, runs
as a submitted job: its driver is a process the scheduler started, not this script. The
script lists the cluster's jobs, rescales the aggregate live, SIGKILLs the job's driver and
waits until the registry's new driver runs the job again from its latest complete checkpoint,
then stops the job with a savepoint. Every record must be in the output exactly once, and the
last update of each key must equal pandas over every file landed.

The same from a shell: ``streamlb submit``, ``streamlb jobs``, ``streamlb job rescale|stop``
(docs/cli.md). See docs/jobs.md.

Run: python examples/submitted_job.py [work-dir]
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd
from streamz import Stream

import streamlb

ROWS = 4_000                    # rows per file
SPEC = {"n": ("value", "count"), "total": ("value", "sum")}


def land(directory: str, i: int) -> None:
    """File ``i``: written under a name the source skips (``_``), then renamed into view."""
    rng = np.random.default_rng(i)
    hot = rng.random(ROWS) < 0.3
    keys = np.where(hot, rng.integers(0, 3, ROWS), rng.integers(0, 400, ROWS))
    df = pd.DataFrame({"id": np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64), "key": keys.astype(np.int64),
                       "value": rng.integers(0, 1_000, ROWS)})
    tmp = os.path.join(directory, f"_landing-{i}.parquet")
    df.to_parquet(tmp, index=False)
    os.rename(tmp, os.path.join(directory, f"part-{i:04d}.parquet"))


def build(inp: str, out: str) -> Stream:
    """Every record to ``out/raw`` (to check exactly once), running totals per key to ``out/agg``."""
    src = Stream.from_parquet(inp, watch="250ms", batch_size=1_000)
    src.to_parquet(os.path.join(out, "raw"))
    src.key_by("key").aggregate(SPEC, name="totals").to_parquet(os.path.join(out, "agg"))
    return src


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(work: str) -> tuple[str, list[subprocess.Popen]]:
    """``dask scheduler`` (with the job registry) and two ``dask worker`` processes."""
    address = f"tcp://127.0.0.1:{free_port()}"
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)

    def start(args: list[str], log: str) -> subprocess.Popen:
        # ``python -m distributed.cli.dask_scheduler`` is ``dask scheduler``, with this interpreter
        with open(os.path.join(logs, log), "ab") as out:
            return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    procs = [start(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                    "--no-dashboard", "--preload", "streamlb.plugin",
                    "--streamlb-jobs-dir", os.path.join(work, "jobs")], "scheduler.log")]
    for i in range(2):
        procs.append(start(["distributed.cli.dask_worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                            "--no-dashboard"], f"worker-{i}.log"))
    from distributed import Client

    with Client(address, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
    return address, procs


def wait_until(predicate, timeout: float, what: str):
    """``predicate()`` once it is true, polled every 0.2 s; TimeoutError after ``timeout``."""
    for _ in range(int(timeout / 0.2)):
        if value := predicate():
            return value
        time.sleep(0.2)
    raise TimeoutError(f"no {what} within {timeout:g} s")


def main(work: str) -> int:
    inp, out = os.path.join(work, "in"), os.path.join(work, "out")
    os.makedirs(inp, exist_ok=True)
    t_start = time.time()
    address, procs = start_cluster(work)
    try:
        print(f"cluster: scheduler {address} with its job registry in {work}/jobs, 2 workers "
              f"({time.time() - t_start:.1f} s)")
        landed = 0
        for _ in range(2):
            land(inp, landed)
            landed += 1

        job = streamlb.submit(build(inp, out), address=address, name="totals",
                              checkpoint=os.path.join(work, "ck"), checkpoint_interval="500ms")
        print(f"submitted job {job.name} ({job.id}): {job.status}")
        table = streamlb.jobs(address)
        print(table[["name", "id", "status", "parallelism", "checkpoint", "restarts"]].to_string(index=False))

        land(inp, landed)
        landed += 1
        print(f"rescaled totals live to {job.rescale('totals', 3)} instances")
        land(inp, landed)
        landed += 1
        wait_until(lambda: (job.describe()["info"].get("checkpoint") or {}).get("id"), 30, "checkpoint")

        old = job.describe()["driver"]["pid"]
        os.kill(old, signal.SIGKILL)
        killed = time.time()
        print(f"SIGKILLed the job's driver (pid {old})")
        land(inp, landed)               # lands while no driver runs the job
        landed += 1
        rec = wait_until(lambda: (r := job.describe())["status"] == "running" and r["driver"]["pid"] != old and r,
                         60, "new driver running the job")
        print(f"running again after {time.time() - killed:.1f} s: driver pid {rec['driver']['pid']} "
              f"(restart {rec['restarts']}), totals at {job.parallelism('totals')} instances "
              "(the parallelism of the checkpoint it resumed)")
        land(inp, landed)
        landed += 1

        wait_until(lambda: int(job.state("totals")["n"].sum()) == landed * ROWS, 60, "every record counted")
        savepoint = job.stop(savepoint=os.path.join(work, "savepoint"))
        print(f"stopped gracefully into the savepoint {savepoint}; status {job.status}")
        job.close()
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    # exact against pandas over every file landed
    truth_in = pd.concat([pd.read_parquet(os.path.join(inp, f)) for f in sorted(os.listdir(inp))
                          if f.startswith("part-")])
    raw = pd.read_parquet(os.path.join(out, "raw"))
    counts = raw["id"].value_counts()
    assert len(raw) == len(truth_in) and set(raw["id"]) == set(truth_in["id"]) and (counts == 1).all(), \
        f"raw output: {len(raw)} rows for {len(truth_in)} input rows, {(counts > 1).sum()} ids more than once"
    agg = pd.read_parquet(os.path.join(out, "agg"))
    agg = agg.reset_index() if "key" not in agg.columns else agg
    last = agg.sort_values("n").groupby("key").last()[["n", "total"]]
    truth = truth_in.groupby("key").agg(n=("value", "count"), total=("value", "sum"))
    assert last.reindex(truth.index).astype(truth.dtypes.to_dict()).equals(truth), "totals differ from pandas"
    print(f"output: {len(raw):,} records exactly once, last totals of {len(truth)} keys exact against pandas "
          f"({time.time() - t_start:.1f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="streamlb-submitted-")))
