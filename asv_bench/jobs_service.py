"""The job service's figures (issue 48; docs/benchmarks.md, "Jobs on a cluster").

On real processes on loopback: a ``dask scheduler --preload streamlb.plugin
--streamlb-jobs-dir D`` and ``--workers`` ``dask worker --nthreads 1`` processes (with
nannies), each started with ``setsid`` and restarted by this script when it exits, as a
supervisor would. A submitted job reads a watched directory where a file lands every
``--land-every`` seconds (``--rows`` records, each carrying the time it landed), and keeps a
keyed aggregate written with ``to_parquet``, checkpointing every second. Two ``map`` steps
stamp each batch as it is processed (after the source reads it, and after the aggregate
updated its keys) with the wall time and the id of the run of the job that processed it:
the first record processed again after a loss is the first stamp of the new run.

(a) ``--rounds`` times: the driver process is SIGKILLed; the times from the kill to the
    registry starting a new driver, to "running" in the registry, and to the first record
    read and aggregated by the new run.
(b) ``--rounds`` times: the scheduler is SIGKILLed and started again at once on the same
    address and registry directory; the workers exit (a worker whose scheduler is lost
    exits) and are started again; the times from the kill to: the scheduler answering, the
    workers joined, the registry starting the driver, the job running, the first record.
(c) what a job's driver costs the scheduler: ``--windows`` windows of ``--window`` seconds
    with 0, then with ``--jobs`` running submitted jobs (each its own watched directory,
    ``--rows`` / ``--land-every`` records/s). Per window: the scheduler process's CPU
    seconds per wall second, its main thread's (the event loop's) CPU seconds per wall
    second, the lag of a 10 ms timer on its event loop (p50, p99, max), distributed's own
    observed tick interval (20 ms nominal), the drivers' and the workers' CPU, and what the
    whole machine used (other people's work included).

After (a) and (b) the job is stopped and its output checked against pandas over the
landed files (every key's final count and total). The suite's machine probe
(``np.add.at``, as ``benchmarks/checkpoint.py``) gives the machine's speed. Writes
``--out`` (JSON, every raw figure) and ``--plot`` (PNG). Run from the repository::

    PYTHONPATH=. python asv_bench/jobs_service.py --rounds 1 --windows 2    # a check
    PYTHONPATH=. python asv_bench/jobs_service.py                           # the figures

Uses ports ``--port`` and ``--port + 1`` (the dashboard) and a new temporary directory;
every process it started is killed when it ends.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SPEC = {"n": ("value", "count"), "total": ("value", "sum")}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- the machine ------------------------------------------------------------------------------

def machine_probe() -> dict:
    """The suite's machine probe (``benchmarks.checkpoint.probe``: M records/s of
    ``np.add.at`` count+sum on one core, 2 s), the CPUs and the load average."""
    sys.path.insert(0, HERE)
    from benchmarks.checkpoint import probe

    return {"probe_mrecords_s": round(probe(), 2), "cpus": os.cpu_count(), "loadavg": os.getloadavg()}


# -- the input --------------------------------------------------------------------------------

class Lander(threading.Thread):
    """Lands a Parquet file of ``rows`` records in each of ``dirs`` every ``every`` s
    (written as ``_tmp-...`` and renamed into place); each record carries ``landed``."""

    def __init__(self, dirs: list[str], rows: int, every: float) -> None:
        super().__init__(daemon=True, name="lander")
        self.dirs, self.rows, self.every = dirs, rows, every
        self.files = {d: 0 for d in dirs}
        self.halt = threading.Event()

    def frame(self, d: str, i: int):
        import numpy as np
        import pyarrow as pa

        rng = np.random.default_rng(i)
        n = self.rows
        keys = np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), rng.integers(0, 300, n))
        return pa.table({"id": np.arange(i * n, (i + 1) * n, dtype=np.int64), "key": keys.astype(np.int64),
                         "value": rng.integers(0, 1000, n).astype(np.int64),
                         "landed": np.full(n, time.time())})

    def land(self, d: str) -> None:
        import pyarrow.parquet as pq

        i = self.files[d]
        tmp, final = os.path.join(d, f"_tmp-{i}.parquet"), os.path.join(d, f"part-{i:06d}.parquet")
        pq.write_table(self.frame(d, i), tmp)
        os.rename(tmp, final)
        self.files[d] = i + 1

    def run(self) -> None:
        nxt = time.monotonic()
        while not self.halt.is_set():
            for d in self.dirs:
                self.land(d)
            nxt += self.every
            self.halt.wait(max(nxt - time.monotonic(), 0))

    def stop(self) -> None:
        self.halt.set()
        self.join()


class Stamp:
    """A ``map`` step: appends ``<wall time> <run> <where> <rows> <min landed> <max landed>`` to
    ``<dir>/<pid>.txt`` for each batch, and returns the batch. ``run`` is the id of the
    job run whose instance called it (found up the call stack), ``?`` if none is found."""

    def __init__(self, directory: str, where: str) -> None:
        self.dir, self.where = directory, where

    def __call__(self, df):
        now = time.time()
        if len(df):
            run, f = "?", sys._getframe(1)
            while f is not None:
                s = f.f_locals.get("self")
                if s is not None and hasattr(s, "job") and hasattr(s, "life") and hasattr(s, "label"):
                    run = str(s.job)
                    break
                f = f.f_back
            lo, hi = (float(df["landed"].min()), float(df["landed"].max())) if "landed" in df.columns else (0, 0)
            with open(os.path.join(self.dir, f"{os.getpid()}.txt"), "a") as out:
                out.write(f"{now:.6f} {run} {self.where} {len(df)} {lo:.6f} {hi:.6f}\n")
        return df


def pipeline(inp: str, out: str, stamps: str | None = None):
    from streamz import Stream

    import streamlb  # noqa: F401  (the nodes)

    src = Stream.from_parquet(inp, watch="200ms", batch_size=1_000)
    read = src.map(Stamp(stamps, "read")) if stamps else src
    agg = read.key_by("key").aggregate(dict(SPEC, landed=("landed", "max")), name="totals")
    if stamps:
        agg = agg.map(Stamp(stamps, "agg"))
    agg.to_parquet(out)
    return src


class Stamps:
    """Reads the stamp files as they grow."""

    def __init__(self, directory: str) -> None:
        self.dir, self.offsets, self.rows = directory, {}, []

    def read(self) -> list[tuple]:
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            with open(path) as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind("\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in chunk[:end].splitlines():
                t, run, where, n, lo, hi = line.split()
                self.rows.append((float(t), run, where, int(n), float(lo), float(hi)))
        return self.rows

    def first(self, run: str, where: str, after: float = 0.0) -> float | None:
        ts = [r[0] for r in self.read() if r[1] == run and r[2] == where and r[0] >= after]
        return min(ts) if ts else None

    def read_up_to(self, run: str) -> float:
        """The landing time of the newest record the run ``run`` read (0 if none)."""
        return max((r[5] for r in self.read() if r[1] == run and r[2] == "read"), default=0.0)


# -- the cluster ------------------------------------------------------------------------------

class Cluster:
    """A scheduler with the job registry and worker processes, each in its own session;
    a thread restarts a worker that exits while ``supervising``."""

    def __init__(self, root: str, port: int, workers: int, worker_preload: str | None = None) -> None:
        self.root, self.port, self.n, self.preload = root, port, workers, worker_preload
        self.address = f"tcp://127.0.0.1:{port}"
        self.http = f"http://127.0.0.1:{port + 1}"
        self.jobs_dir = os.path.join(root, "jobs")
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
        self.dask = os.path.join(os.path.dirname(sys.executable), "dask")
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.all: list[subprocess.Popen] = []
        self.supervising = False
        self.restarts: list[tuple[float, float]] = []     # (exit seen, started again)
        self._lock = threading.Lock()
        threading.Thread(target=self._supervise, daemon=True, name="supervisor").start()

    def _popen(self, args: list[str], name: str) -> subprocess.Popen:
        out = open(os.path.join(self.root, f"{name}.log"), "ab")
        p = subprocess.Popen([self.dask, *args], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.all.append(p)
        return p

    def start_scheduler(self) -> subprocess.Popen:
        self.scheduler = self._popen(["scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--dashboard-address", f"127.0.0.1:{self.port + 1}",
                                      "--preload", "streamlb.plugin", "--streamlb-jobs-dir", self.jobs_dir],
                                     "scheduler")
        return self.scheduler

    def start_worker(self, i: int) -> subprocess.Popen:
        preload = ["--preload", self.preload] if self.preload else []
        return self._popen(["worker", self.address, "--nthreads", "1", "--host", "127.0.0.1",
                            "--dashboard-address", ":0", *preload], f"worker{i}")

    def start(self) -> None:
        self.start_scheduler()
        wait_for(lambda: port_open(self.port), 60, "the scheduler did not come up")
        self.workers = [self.start_worker(i) for i in range(self.n)]
        wait_for(lambda: self.counts().get("workers", 0) >= self.n, 90, "the workers did not join")
        self.supervising = True

    def _supervise(self) -> None:
        while True:
            time.sleep(0.05)
            if not self.supervising:
                continue
            with self._lock:
                for i, w in enumerate(self.workers):
                    if w.poll() is not None:
                        seen = time.time()
                        self.workers[i] = self.start_worker(i)
                        self.restarts.append((seen, time.time()))

    def counts(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self.http}/json/counts.json", timeout=1) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return {}

    def jobs(self) -> dict:
        """The registry's records by name (its read-only JSON view); {} if it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.http}/streamlb/jobs.json", timeout=1) as r:
                return {j["name"]: j for j in json.loads(r.read())["jobs"]}
        except (OSError, ValueError, KeyError):
            return {}

    def drivers(self) -> list[int]:
        """The pids of the scheduler's driver processes (the registry's children: the jobs'
        drivers, and a standby driver if it keeps one)."""
        import psutil

        if self.scheduler is None or self.scheduler.poll() is not None:
            return []
        try:
            kids = psutil.Process(self.scheduler.pid).children()
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in kids:
            try:
                if any("streamlb.service._driver" in c for c in p.cmdline()):
                    out.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return out

    def kill_all(self) -> None:
        self.supervising = False
        for pid in self.drivers():      # they die with the scheduler too (PR_SET_PDEATHSIG)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        with self._lock:
            for p in self.all:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(cond, timeout: float, what: str, every: float = 0.05):
    deadline = time.time() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.time() > deadline:
            raise TimeoutError(what)
        time.sleep(every)


# -- one job under test -----------------------------------------------------------------------

class Watched:
    """The job of (a) and (b): its directories, its lander, its stamps."""

    def __init__(self, cluster: Cluster, name: str, rows: int, every: float) -> None:
        import streamlb

        self.cluster, self.name = cluster, name
        base = os.path.join(cluster.root, name)
        self.inp, self.out = os.path.join(base, "in"), os.path.join(base, "out")
        self.ck, self.stamp_dir = os.path.join(base, "ck"), os.path.join(base, "stamps")
        for d in (self.inp, self.stamp_dir):
            os.makedirs(d, exist_ok=True)
        self.lander = Lander([self.inp], rows, every)
        self.lander.start()
        self.stamps = Stamps(self.stamp_dir)
        streamlb.submit(pipeline(self.inp, self.out, self.stamp_dir), address=cluster.address, name=name,
                        checkpoint=self.ck, checkpoint_interval=1.0).close()

    def record(self) -> dict:
        return self.cluster.jobs().get(self.name, {})

    def settle(self, min_driver_age: float) -> dict:
        """Until the job runs, its current run aggregated records, read those landed up to 3 s
        ago (it caught up), a checkpoint of the run is complete, and its driver is
        ``min_driver_age`` s old (the registry fails a job whose drivers exit soon after
        starting, 5 in a row)."""
        def ready():
            r = self.record()
            info = r.get("info") or {}
            run, cp = info.get("run"), info.get("checkpoint") or {}
            if r.get("status") != "running" or not run or not r.get("started"):
                return None
            if self.stamps.first(run, "agg") is None or (cp.get("completed") or 0) < r["started"]:
                return None
            if self.stamps.read_up_to(run) < time.time() - 3.0:
                return None
            if time.time() - (r.get("driver") or {}).get("started", time.time()) < min_driver_age:
                return None
            return r
        return wait_for(ready, 180, f"job {self.name} did not settle", every=0.2)

    def resumed(self, old_run: str, killed: float, timeout: float = 120.0) -> dict:
        """Wait until a new run of the job aggregated a record; its times from ``killed``."""
        def running():
            r = self.record()
            run = (r.get("info") or {}).get("run")
            return r if r.get("status") == "running" and run and run != old_run else None
        r = wait_for(running, timeout, f"job {self.name} did not run again")
        run = r["info"]["run"]
        agg = wait_for(lambda: self.stamps.first(run, "agg", killed), timeout,
                       f"job {self.name}: its new run aggregated nothing")
        read = self.stamps.first(run, "read", killed)
        return {"run": run, "driver_started": r["driver"]["started"] - killed, "running": r["started"] - killed,
                "first_read": None if read is None else read - killed, "first_record": agg - killed,
                "restarts": r.get("restarts"), "status": r.get("status")}

    def check(self) -> dict:
        """Stop the job; its final count and total per key against pandas over the landed files."""
        import glob

        import pandas as pd

        import streamlb

        self.lander.stop()
        last = max(pd.read_parquet(f, columns=["landed"])["landed"].max()
                   for f in glob.glob(os.path.join(self.inp, "part-*.parquet")))
        run = self.record()["info"]["run"]
        wait_for(lambda: self.stamps.read_up_to(run) >= last - 1e-3, 120, "the job did not read the last file",
                 every=0.2)      # (the stamps keep microseconds)
        time.sleep(1.0)
        with streamlb.attach(self.cluster.address, self.name) as j:    # what was read is processed, committed
            j.stop()
        inp = pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(os.path.join(self.inp, "part-*.parquet")))])
        truth = inp.groupby("key").agg(n=("value", "count"), total=("value", "sum")).sort_index()
        out = pd.read_parquet(self.out)
        if "key" not in out.columns:
            out = out.reset_index()
        final = out.sort_values("n").groupby("key").last()[["n", "total"]].sort_index()
        exact = final.reindex(truth.index).astype("int64").equals(truth.astype("int64"))
        return {"records": int(len(inp)), "keys": int(len(truth)), "exact": bool(exact)}


# -- (a) and (b) -------------------------------------------------------------------------------

def driver_rounds(cluster: Cluster, job: Watched, rounds: int) -> list[dict]:
    out = []
    for i in range(rounds):
        r = job.settle(min_driver_age=12.0)
        pid, old_run = r["driver"]["pid"], r["info"]["run"]
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        res = job.resumed(old_run, killed)
        res.update(round=i, pid=pid, loadavg1=os.getloadavg()[0])
        out.append(res)
        log(f"(a) round {i + 1}/{rounds}: driver pid {pid} SIGKILLed; new driver started at "
            f"+{res['driver_started']:.2f} s, running +{res['running']:.2f} s, first record read "
            f"+{res['first_read']:.2f} s, aggregated +{res['first_record']:.2f} s")
    return out


def scheduler_rounds(cluster: Cluster, job: Watched, rounds: int) -> list[dict]:
    out = []
    for i in range(rounds):
        r = job.settle(min_driver_age=12.0)
        old_run = r["info"]["run"]
        cluster.supervising = True
        n_restarts = len(cluster.restarts)
        killed = time.time()
        cluster.scheduler.send_signal(signal.SIGKILL)
        cluster.scheduler.wait()
        attempts = 0
        while True:         # as a supervisor: start it again at once (again if it exits at once)
            attempts += 1
            p = cluster.start_scheduler()
            try:
                up = wait_for(lambda: port_open(cluster.port) and time.time(), 60, "the scheduler did not come up",
                              every=0.02)
                break
            except TimeoutError:
                if p.poll() is None or attempts > 5:
                    raise
        joined = wait_for(lambda: cluster.counts().get("workers", 0) >= cluster.n and time.time(), 120,
                          "the workers did not join again", every=0.05)
        res = job.resumed(old_run, killed, timeout=180)
        exits = cluster.restarts[n_restarts:]
        res.update(round=i, loadavg1=os.getloadavg()[0], scheduler_up=up - killed, workers_joined=joined - killed,
                   scheduler_starts=attempts,
                   worker_exits=[round(s - killed, 3) for s, _ in exits],
                   worker_starts=[round(t - killed, 3) for _, t in exits])
        out.append(res)
        log(f"(b) round {i + 1}/{rounds}: scheduler SIGKILLed; up +{res['scheduler_up']:.2f} s, workers exited "
            f"{res['worker_exits']} and joined +{res['workers_joined']:.2f} s, driver started "
            f"+{res['driver_started']:.2f} s, running +{res['running']:.2f} s, first record aggregated "
            f"+{res['first_record']:.2f} s")
    return out


# -- (c) ---------------------------------------------------------------------------------------

async def _install_lag_probe(dask_scheduler=None, every=0.01):
    import asyncio

    if getattr(dask_scheduler, "_bench_lag", None) is not None:
        dask_scheduler._bench_lag.clear()
        return
    lags: list[float] = []
    dask_scheduler._bench_lag = lags

    async def probe():
        while True:
            t = time.perf_counter()
            await asyncio.sleep(every)
            lags.append(time.perf_counter() - t - every)

    dask_scheduler._bench_lag_task = asyncio.get_running_loop().create_task(probe())


def _take_lags(dask_scheduler=None):
    lags = list(dask_scheduler._bench_lag)
    dask_scheduler._bench_lag.clear()
    return {"lags": lags, "tick": dask_scheduler._tick_interval_observed}


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _main_thread_cpu(proc) -> float:
    for th in proc.threads():
        if th.id == proc.pid:
            return th.user_time + th.system_time
    return float("nan")


def _group_cpu(pids: list[int]) -> dict:
    """CPU seconds of each of ``pids`` with its children, by pid (those that are gone left out)."""
    import psutil

    out = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out[pid] = _cpu(p) + sum(_cpu(c) for c in p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return out


def _delta(before: dict, after: dict) -> float:
    """CPU seconds used between two :func:`_group_cpu` by the processes in both."""
    return sum(max(after[p] - before[p], 0.0) for p in before.keys() & after.keys())


def load_windows(cluster: Cluster, client, windows: int, length: float, label: str) -> list[dict]:
    """``windows`` windows of ``length`` s: the scheduler's CPU, its event loop's."""
    import numpy as np
    import psutil

    sched = psutil.Process(cluster.scheduler.pid)
    client.run_on_scheduler(_install_lag_probe)
    out = []
    for w in range(windows):
        drivers = cluster.drivers()
        workers = [p.pid for p in cluster.workers]
        t0, c0, m0 = time.time(), _cpu(sched), _main_thread_cpu(sched)
        d0, w0, all0 = _group_cpu(drivers), _group_cpu(workers), psutil.cpu_times()
        client.run_on_scheduler(_take_lags)
        time.sleep(length)
        got = client.run_on_scheduler(_take_lags)
        t1, c1, m1 = time.time(), _cpu(sched), _main_thread_cpu(sched)
        d1, w1, all1 = _group_cpu(drivers), _group_cpu(workers), psutil.cpu_times()
        wall = t1 - t0
        lags = np.asarray(got["lags"]) * 1e3
        idle = (all1.idle - all0.idle) + (getattr(all1, "iowait", 0) - getattr(all0, "iowait", 0))
        busy = sum(all1) - sum(all0) - idle
        row = {"label": label, "window": w, "wall": wall, "sched_cpu": (c1 - c0) / wall,
               "loop_cpu": (m1 - m0) / wall, "drivers": len(drivers), "drivers_cpu": _delta(d0, d1) / wall,
               "workers_cpu": _delta(w0, w1) / wall, "machine_cpu": busy / wall,
               "lag_p50_ms": float(np.percentile(lags, 50)), "lag_p99_ms": float(np.percentile(lags, 99)),
               "lag_max_ms": float(lags.max()), "lag_samples": int(len(lags)),
               "tick_observed_ms": got["tick"] * 1e3, "loadavg1": os.getloadavg()[0]}
        out.append(row)
        log(f"(c) {label} window {w + 1}/{windows}: scheduler {row['sched_cpu']:.3f} CPU s/s, event loop "
            f"{row['loop_cpu']:.3f}, timer lag p50 {row['lag_p50_ms']:.2f} ms p99 {row['lag_p99_ms']:.2f} ms max "
            f"{row['lag_max_ms']:.1f} ms, tick {row['tick_observed_ms']:.1f} ms; drivers {row['drivers_cpu']:.2f}, "
            f"workers {row['workers_cpu']:.2f}, machine {row['machine_cpu']:.2f} CPU s/s")
    return out


def load_phase(cluster: Cluster, args) -> dict:
    import streamlb
    from distributed import Client

    client = Client(cluster.address, timeout=30, set_as_default=False)
    try:
        idle = load_windows(cluster, client, args.windows, args.window, "0 jobs")
        dirs, names = [], []
        for k in range(args.jobs):
            base = os.path.join(cluster.root, f"load{k}")
            dirs.append(os.path.join(base, "in"))
            os.makedirs(dirs[-1], exist_ok=True)
            names.append(f"load{k}")
        lander = Lander(dirs, args.rows, args.land_every)
        lander.start()
        for name, d in zip(names, dirs):
            base = os.path.dirname(d)
            streamlb.submit(pipeline(d, os.path.join(base, "out")), address=cluster.address, name=name,
                            checkpoint=os.path.join(base, "ck"), checkpoint_interval=1.0).close()
            log(f"(c) job {name} running")
        time.sleep(args.window)       # the jobs past their start
        busy = load_windows(cluster, client, args.windows, args.window, f"{args.jobs} jobs")
        records = {n: (cluster.jobs().get(n, {}).get("info") or {}).get("records") for n in names}
        lander.stop()
        for name in names:
            streamlb.attach(cluster.address, name, client=client).cancel()
        return {"windows": idle + busy, "records": records,
                "rate_per_job": args.rows / args.land_every}
    finally:
        client.close()


# -- the report ---------------------------------------------------------------------------------

def spread(xs) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarise(res: dict) -> dict:
    s = {}
    for part, keys in (("driver_loss", ("driver_started", "running", "first_read", "first_record")),
                       ("scheduler_loss", ("scheduler_up", "workers_joined", "driver_started", "running",
                                           "first_read", "first_record"))):
        if res.get(part):
            s[part] = {k: spread([r[k] for r in res[part]]) for k in keys}
    if res.get("load"):
        s["load"] = {}
        for label in sorted({w["label"] for w in res["load"]["windows"]}):
            ws = [w for w in res["load"]["windows"] if w["label"] == label]
            s["load"][label] = {k: spread([w[k] for w in ws]) for k in (
                "sched_cpu", "loop_cpu", "lag_p50_ms", "lag_p99_ms", "lag_max_ms", "tick_observed_ms",
                "drivers_cpu", "workers_cpu", "machine_cpu")}
    return s


def print_summary(s: dict) -> None:
    def line(name, d, unit="s", fmt="{:.2f}"):
        if d:
            print(f"  {name:<28} median {fmt.format(d['median'])} {unit}  (min {fmt.format(d['min'])}, "
                  f"max {fmt.format(d['max'])}, n={d['n']})")
    for part, title in (("driver_loss", "(a) from the driver's SIGKILL to"),
                        ("scheduler_loss", "(b) from the scheduler's SIGKILL to")):
        if part in s:
            print(title)
            for k, d in s[part].items():
                line(k.replace("_", " "), d)
    for label, d in s.get("load", {}).items():
        print(f"(c) scheduler with {label}")
        for k, v in d.items():
            line(k, v, unit="ms" if k.endswith("_ms") else "CPU s/s", fmt="{:.3f}")


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    a = res.get("driver_loss") or []
    keys = [("driver_started", "new driver\nstarted"), ("running", "running\n(registry)"),
            ("first_record", "first record\naggregated")]
    for j, (k, label) in enumerate(keys):
        ys = [r[k] for r in a]
        ax.scatter([j] * len(ys), ys, alpha=0.7, color=f"C{j}")
        if ys:
            ax.hlines(statistics.median(ys), j - 0.25, j + 0.25, color="k")
    ax.set_xticks(range(len(keys)), [lb for _, lb in keys])
    ax.set_ylabel("seconds after the SIGKILL")
    ax.set_title(f"(a) the driver's process SIGKILLed ({len(a)} rounds; line: median)")
    ax.set_ylim(bottom=0)

    ax = axes[0][1]
    b = res.get("scheduler_loss") or []
    steps = [("scheduler_up", "scheduler up"), ("workers_joined", "workers joined"),
             ("driver_started", "driver started"), ("running", "job running"), ("first_record", "first record")]
    for i, r in enumerate(b):
        prev = 0.0
        for j, (k, label) in enumerate(steps):
            ax.barh(i, r[k] - prev, left=prev, color=f"C{j}", label=f"... {label}" if i == 0 else None)
            prev = r[k]
        for t in r.get("worker_exits", []):
            ax.plot([t], [i], marker="x", color="k", label="a worker exited" if i == 0 and t == r["worker_exits"][0]
                    else None)
    ax.set_yticks(range(len(b)), [f"round {i + 1}" for i in range(len(b))])
    ax.invert_yaxis()
    ax.set_xlabel("seconds after the SIGKILL")
    ax.set_title(f"(b) the scheduler SIGKILLed, started again ({len(b)} rounds)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)

    load = (res.get("load") or {}).get("windows") or []
    labels = sorted({w["label"] for w in load})
    for ax, (key, scale, what) in zip(axes[1], (("loop_cpu", 100, "event loop (main thread) CPU, % of a core"),
                                                ("lag_p99_ms", 1, "10 ms timer on the event loop: lag p99, ms"))):
        if labels:
            ax.boxplot([[w[key] * scale for w in load if w["label"] == lb] for lb in labels])
            ax.set_xticks(range(1, len(labels) + 1), [f"{lb} running" for lb in labels])
        ax.set_ylabel(what)
        ax.set_ylim(bottom=0)
        ax.set_title(f"(c) the scheduler with and without jobs ({len(load) // max(len(labels), 1)} windows each)")
    m = res.get("machine", {})
    fig.suptitle(f"streamlb job service, commit {res.get('commit')}; machine: {m.get('cpus')} CPUs, np.add.at probe "
                 f"{m.get('probe_mrecords_s')} M records/s, 1-min load average {m.get('loadavg', [0])[0]:.1f}",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    log(f"plot: {path}")


# -- main ----------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="kills of the driver, and of the scheduler")
    ap.add_argument("--windows", type=int, default=6, help="(c): windows with 0 jobs, and with --jobs")
    ap.add_argument("--window", type=float, default=10.0, help="(c): seconds per window")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=500, help="records per landed file")
    ap.add_argument("--land-every", type=float, default=0.5, help="seconds between files (per job)")
    ap.add_argument("--port", type=int, default=8851, help="the scheduler's; the dashboard's is the next")
    ap.add_argument("--parts", default="abc", help="which figures: any of a, b, c")
    ap.add_argument("--worker-preload", default=None,
                    help="a module the workers import at start (dask worker --preload), e.g. streamlb._worker")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "jobs-service.json"))
    ap.add_argument("--plot", default=os.path.join(REPO, "docs", "images", "jobs-service.png"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--from-json", default=None, help="print the summary and draw the plot of a JSON written before")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
        print_summary(summarise(res))
        plot(res, args.plot)
        return 0

    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    changed = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "streamlb"], capture_output=True,
                             text=True).stdout.split("\n")
    changed = [line[3:] for line in changed if line.strip()]
    if changed:
        log(f"streamlb/ differs from {commit} in {len(changed)} file(s): {', '.join(changed)}")
    if port_open(args.port) or port_open(args.port + 1):
        print(f"port {args.port} or {args.port + 1} is taken: pick another with --port", file=sys.stderr)
        return 2
    root = tempfile.mkdtemp(prefix=f"streamlb-jobs-bench-{args.port}-")
    cluster = Cluster(root, args.port, args.workers, args.worker_preload)
    atexit.register(cluster.kill_all)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    res = {"commit": commit, "uncommitted": changed, "argv": sys.argv[1:], "started": time.time(), "root": root}
    log(f"machine probe; then a scheduler on {cluster.address} and {args.workers} workers (logs in {root})")
    res["machine"] = machine_probe()
    log(f"probe: {res['machine']}")
    try:
        cluster.start()
        if "a" in args.parts or "b" in args.parts:
            job = Watched(cluster, "watched", args.rows, args.land_every)
            log(f"job 'watched' submitted: {args.rows} records every {args.land_every} s into {job.inp}")
            if "a" in args.parts:
                res["driver_loss"] = driver_rounds(cluster, job, args.rounds)
            if "b" in args.parts:
                res["scheduler_loss"] = scheduler_rounds(cluster, job, args.rounds)
            job.settle(min_driver_age=0)
            res["check"] = job.check()
            log(f"stopped; output against pandas: {res['check']}")
        if "c" in args.parts:
            res["load"] = load_phase(cluster, args)
    finally:
        cluster.kill_all()
        res["ended"] = time.time()
        res["summary"] = summarise(res)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        log(f"raw figures: {args.out}")
    print_summary(res["summary"])
    plot(res, args.plot)
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0 if res.get("check", {}).get("exact", True) else 1


if __name__ == "__main__":
    sys.exit(main())
