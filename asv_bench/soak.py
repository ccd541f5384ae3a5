"""Soak: an unbounded job run for minutes while a worker is SIGKILLed every few minutes.

``python asv_bench/soak.py --minutes 10 --kill-every 120 --out DIR``

A writer thread lands a Parquet file in a watched directory every ``--file-every`` seconds
(``--rate`` rows a second; each row a unique ``id``, a ``key`` from a Zipf distribution, a
``value`` and its ``created`` time in ns). The job reads the directory
(``Stream.from_parquet(dir, watch="1s")``), writes every row to ``to_parquet`` and keeps a
keyed aggregate (count and sum of ``value`` per key), on a LocalCluster of 2 worker
processes with nannies, checkpointing every second. Every ``--kill-every`` seconds (the
first at half of it) one worker process is SIGKILLed, the two in turn; its nanny starts it
again and the job recovers from its last checkpoint.

Every second the script samples: RSS of each worker process and of the driver (which holds
the LocalCluster's scheduler too), the checkpoint directory's size, the end-to-end latency
of the rows committed since the last sample (the committed file's ctime, when the driver
renamed it into place, minus each row's creation time), the staleness of the output (now
minus the newest committed row's creation time), rows committed per second and, every 5 s,
the p50 latency the aggregate's instances report (``job.metrics()``, emit to applied).

At the end the writer stops, the job reads every row written, drains, and its aggregate
state and its committed rows are checked against pandas over every row written (each id
once). ``DIR`` gets ``soak-samples.json`` (every sample), ``soak-summary.json`` (kills,
recoveries, RSS slopes, checkpoint size, latency around each kill, the exactness check),
``soak.png`` and ``soak.log`` (the streamlb and distributed log). See docs/benchmarks.md,
"Soak: a long run with kills".
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import tracemalloc

import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

SPEC = {"n": ("value", "count"), "total": ("value", "sum")}
KEYS = 1_000
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTLE = 10.0           # seconds after a restart left out of the RSS slopes


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--kill-every", type=float, default=120.0, help="seconds between SIGKILLs (first at half)")
    p.add_argument("--out", required=True, help="directory for the JSON, the PNG and the log")
    p.add_argument("--rate", type=int, default=5_000, help="rows written per second")
    p.add_argument("--file-every", type=float, default=1.0, help="seconds between landed files")
    p.add_argument("--skew", type=float, default=1.2, help="Zipf exponent of the keys")
    p.add_argument("--port", type=int, default=18_493, help="scheduler port")
    p.add_argument("--work", default=None, help="landing/output/checkpoint directory (default: a temp dir)")
    p.add_argument("--trace-driver", action="store_true",
                   help="tracemalloc in the driver: what grew from the first minute to the end, in the summary")
    p.add_argument("--replot", action="store_true",
                   help="no run: the summary and the PNG again from the JSON files already in --out")
    return p.parse_args(argv)


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)


class Writer(threading.Thread):
    """Lands ``rate * every`` rows in ``root`` every ``every`` seconds until stopped."""

    def __init__(self, root: str, rate: int, every: float, skew: float) -> None:
        super().__init__(daemon=True, name="soak-writer")
        self.root, self.every = root, every
        self.rows = max(1, int(rate * every))
        p = 1.0 / np.arange(1, KEYS + 1) ** skew
        self.p = p / p.sum()
        self.rng = np.random.default_rng(0)
        self.written = 0
        self.files = 0
        self.halt = threading.Event()

    def run(self) -> None:
        nxt = time.time()
        while not self.halt.is_set():
            n = self.rows
            df = pd.DataFrame({
                "id": np.arange(self.written, self.written + n, dtype=np.int64),
                "key": self.rng.choice(KEYS, n, p=self.p).astype(np.int64),
                "value": self.rng.integers(0, 1_000, n, dtype=np.int64),
                "created": np.full(n, time.time_ns(), dtype=np.int64),
            })
            name = f"part-{self.files:06d}.parquet"
            tmp = os.path.join(self.root, "_tmp-" + name)
            df.to_parquet(tmp, index=False)
            os.rename(tmp, os.path.join(self.root, name))      # the source ignores names starting with _
            self.written += n
            self.files += 1
            nxt += self.every
            self.halt.wait(max(0.0, nxt - time.time()))


class Output:
    """The rows committed under a ``to_parquet`` path, read file by file as they appear."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: set[str] = set()
        self.rows = 0
        self.newest_created = 0

    def poll(self) -> tuple[int, list[float]]:
        """Rows committed since the last call, and their latencies (commit ctime - created) in s."""
        try:
            names = [f for f in os.listdir(self.path) if f.endswith(".parquet") and f not in self.seen]
        except FileNotFoundError:
            return 0, []
        rows, lat = 0, []
        for f in sorted(names):
            full = os.path.join(self.path, f)
            try:
                ctime = os.stat(full).st_ctime_ns
                created = pq.read_table(full, columns=["created"]).column("created").to_numpy()
            except (FileNotFoundError, OSError):
                continue
            self.seen.add(f)
            rows += len(created)
            if len(created):
                lat.extend(((ctime - created) / 1e9).tolist())
                self.newest_created = max(self.newest_created, int(created.max()))
        self.rows += rows
        return rows, lat


def dir_bytes(path: str) -> tuple[int, int]:
    total = files = 0
    for root, _, names in os.walk(path):
        for f in names:
            try:
                total += os.stat(os.path.join(root, f)).st_size
                files += 1
            except FileNotFoundError:
                pass
    return total, files


class Workers:
    """The worker processes by worker name (0, 1), their pids refreshed after each restart."""

    def __init__(self, client) -> None:
        self.client = client
        self.pids: dict[str, int] = {}
        self.procs: dict[str, psutil.Process] = {}
        self.restarts: list[dict] = []
        self.known = 0                  # workers the scheduler lists
        self.error: str | None = None   # the last refresh that failed, and why

    def refresh(self, now: float) -> None:
        try:
            pids = self.client.run(os.getpid, wait=True, on_error="return")
            info = self.client.scheduler_info()["workers"]
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"[:200]
            return
        self.known = len(info)
        for addr, pid in pids.items():
            if not isinstance(pid, int):        # a worker that did not answer
                self.error = f"{addr}: {type(pid).__name__}: {pid}"[:200]
                continue
            name = str(info.get(addr, {}).get("name", addr))
            if self.pids.get(name) != pid:
                if name in self.pids:
                    self.restarts.append({"worker": name, "pid": pid, "seen": now})
                self.pids[name] = pid
                self.procs[name] = psutil.Process(pid)

    def rss(self, now: float) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        stale = False
        for name, proc in self.procs.items():
            try:
                out[name] = proc.memory_info().rss / 2**20
            except psutil.Error:
                out[name] = None
                stale = True
        if stale or len(self.procs) < 2:
            self.refresh(now)
        else:
            try:
                self.known = len(self.client.scheduler_info()["workers"])
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"[:200]
        return out


def metrics_p50(job, operator: str, after: float) -> tuple[float | None, float]:
    """p50 latency (s) of the records ``operator`` applied in the windows after ``after``."""
    from streamlb.latency import quantile

    m = job.metrics()
    m = m[(m["operator"] == operator)]
    if m.empty:
        return None, after
    ws = pd.to_datetime(m["window_start"]).astype("int64") / 1e9
    new = m[ws > after]
    hist = [h for h in new["latency_hist"] if h is not None]
    if not hist or new["records"].sum() <= 0:
        return None, after
    return quantile(np.sum([np.asarray(h) for h in hist], axis=0), 0.5) / 1e3, float(ws.max())


class Sampler:
    """One sample a second of the job, its processes, its checkpoints and its output."""

    def __init__(self, job, client, workers: Workers, writer: Writer, output: Output, ck: str) -> None:
        self.job, self.client, self.workers = job, client, workers
        self.writer, self.output, self.ck = writer, output, ck
        self.proc = psutil.Process()
        self.last: dict | None = None
        self.last_latency = float("nan")
        self.metrics_after, self.next_metrics = 0.0, 5.0

    def take(self, now: float) -> dict:
        rss = self.workers.rss(now)
        committed, lat = self.output.poll()
        written = self.writer.written
        ck_bytes, ck_files = dir_bytes(self.ck)
        dt = max(1e-3, now - self.last["t"]) if self.last else None
        s = {"t": now, "rss_mb": rss, "pids": dict(self.workers.pids),
             "driver_rss_mb": self.proc.memory_info().rss / 2**20,
             "driver_arrow_mb": pa.total_allocated_bytes() / 2**20, "driver_py_blocks": sys.getallocatedblocks(),
             "checkpoint_bytes": ck_bytes, "checkpoint_files": ck_files,
             "latency_p50_s": float(np.median(lat)) if lat else None,
             "latency_max_s": float(np.max(lat)) if lat else None,
             "staleness_s": (time.time_ns() - self.output.newest_created) / 1e9 if self.output.newest_created else None,
             "committed_per_s": committed / dt if dt else 0.0,
             "written_per_s": (written - self.last["written"]) / dt if dt else 0.0,
             "written": written, "committed": self.output.rows, "status": self.job.status,
             "metrics_p50_s": None, "job_workers": job_workers(self.job, self.client),
             "scheduler_workers": self.workers.known, "refresh_error": self.workers.error}
        self.workers.error = None
        if now >= self.next_metrics:
            self.next_metrics = now + 5.0
            try:
                s["metrics_p50_s"], self.metrics_after = metrics_p50(self.job, "totals", self.metrics_after)
            except Exception as exc:        # instances being replaced by a recovery
                s["metrics_error"] = f"{type(exc).__name__}: {exc}"[:200]
        if s["latency_p50_s"] is not None:
            self.last_latency = s["latency_p50_s"]
        self.last = s
        return s


def kill(workers: Workers, n: int, now: float, t0: float) -> dict:
    """SIGKILL the n-th kill's worker process (the workers by name, in turn)."""
    name = sorted(workers.pids)[n % 2]
    pid = workers.pids[name]
    os.kill(pid, signal.SIGKILL)
    log(t0, f"SIGKILL worker {name} (pid {pid})")
    return {"t": now, "worker": name, "pid": pid}


def progress(t0: float, s: dict, latency: float) -> None:
    rss = " ".join(f"w{k}={v:.0f}" if v else f"w{k}=?" for k, v in sorted(s["rss_mb"].items()))
    log(t0, f"written {s['written']:,} committed {s['committed']:,} | RSS {rss} driver={s['driver_rss_mb']:.0f} MiB"
            f" | job on workers {s['job_workers']} | checkpoints {s['checkpoint_bytes'] / 2**20:.1f} MiB "
            f"({s['checkpoint_files']} files) | latency p50 {latency:.2f} s, "
            f"staleness {s['staleness_s'] or float('nan'):.2f} s | load {os.getloadavg()[0]:.1f}")


def job_workers(job, client) -> list[str] | None:
    """The names of the workers that hold the job's instances now."""
    try:
        info = client.scheduler_info()["workers"]
        return sorted({str(info.get(a, {}).get("name", a)) for a, _ in job.topology()["instances"]})
    except Exception:
        return None


def slope_mb_per_min(t: np.ndarray, y: np.ndarray, proc: np.ndarray) -> float | None:
    """Least-squares slope of ``y`` over ``t`` in MB/min, one intercept per process
    (``proc``: a restarted worker starts again from its own level)."""
    ok = ~np.isnan(y)
    num = den = 0.0
    points = 0
    for p in set(proc[ok].tolist()):
        m = ok & (proc == p)
        if m.sum() < 5:
            continue
        dt, dy = t[m] - t[m].mean(), y[m] - y[m].mean()
        num += float(dt @ dy)
        den += float(dt @ dt)
        points += int(m.sum())
    if points < 10 or den == 0:
        return None
    return num / den * 60.0


def rss_slopes(samples: list[dict], t: np.ndarray, keep: np.ndarray, duration: float) -> tuple[dict, dict]:
    """RSS slope (MB/min) per worker and of the driver, over the samples ``keep`` of the run and
    of its second half; one intercept per process and per role (holding instances of the job
    or not: a worker a recovery gives instances to steps up once)."""
    late = keep & (t >= duration / 2)
    drv = np.array([s["driver_rss_mb"] for s in samples], float)
    one = np.zeros(len(t))
    slope = {"driver": {"run": slope_mb_per_min(t[keep], drv[keep], one[keep]),
                        "second_half": slope_mb_per_min(t[late], drv[late], one[late])}}
    span = {"driver": [float(np.min(drv[keep])), float(np.max(drv[keep]))] if keep.any() else None}
    for name in sorted({n for s in samples for n in s["rss_mb"]}):
        y = np.array([np.nan if s["rss_mb"].get(name) is None else s["rss_mb"][name] for s in samples], float)
        seg = np.array([f"{s.get('pids', {}).get(name, -1)}:{name in (s.get('job_workers') or [])}"
                        for s in samples])
        slope[name] = {"run": slope_mb_per_min(t[keep], y[keep], seg[keep]),
                       "second_half": slope_mb_per_min(t[late], y[late], seg[late])}
        span[name] = [float(np.nanmin(y[keep])), float(np.nanmax(y[keep]))] if keep.any() else None
    return slope, span


def summarize(samples: list[dict], kills: list[dict], recoveries: list[dict], restarts: list[dict],
              duration: float) -> dict:
    t = np.array([s["t"] for s in samples])
    # the windows left out of the RSS slopes: from each kill to SETTLE s after its worker came back
    # and the job recovered
    holes = []
    for k in kills:
        back = [r["seen"] for r in restarts if r["seen"] >= k["t"]]
        rec = [r["completed_t"] for r in recoveries if r["completed_t"] >= k["t"]]
        end = max(min(back) if back else k["t"], min(rec) if rec else k["t"]) + SETTLE
        holes.append((k["t"], end))
    keep = np.ones(len(t), bool)
    for a, b in holes:
        keep &= ~((t >= a) & (t <= b))
    rss_slope, rss_range = rss_slopes(samples, t, keep, duration)
    ck = np.array([s["checkpoint_bytes"] for s in samples], float)
    ck_files = np.array([s["checkpoint_files"] for s in samples], float)
    warm = t >= 60
    lat = np.array([np.nan if s["latency_p50_s"] is None else s["latency_p50_s"] for s in samples])
    around = []
    done = sorted(r["completed_t"] for r in recoveries)
    for k in kills:
        prev = max([d for d in done if d < k["t"]], default=0.0)       # the level since the last recovery
        before = lat[(t >= max(prev, k["t"] - 60)) & (t < k["t"])]
        base = float(np.nanmedian(before)) if np.isfinite(before).any() else None
        rec = [r for r in recoveries if r["completed_t"] >= k["t"]]
        entry = {"kill_t": k["t"], "worker": k["worker"], "latency_before_s": base,
                 "recovery_completed_t": rec[0]["completed_t"] if rec else None,
                 "detected_after_s": rec[0]["started_t"] - k["t"] if rec else None,
                 "time_to_resume_s": rec[0]["time_to_resume"] if rec else None, "back_within_1.5x_s": None}
        if base is not None and rec:
            after = (t >= rec[0]["completed_t"]) & (lat <= 1.5 * base)
            if after.any():
                entry["back_within_1.5x_s"] = float(t[after][0] - rec[0]["completed_t"])
                entry["back_within_1.5x_after_kill_s"] = float(t[after][0] - k["t"])
        around.append(entry)
    return {
        "kills": len(kills), "recoveries": len(recoveries),
        "time_to_resume_s": [r["time_to_resume"] for r in recoveries],
        "rss_slope_mb_per_min": rss_slope, "rss_mb_range": rss_range,
        "checkpoint_bytes_min_max": [float(np.min(ck)), float(np.max(ck))] if len(ck) else None,
        "checkpoint_bytes_min_max_after_1min": [float(np.min(ck[warm])), float(np.max(ck[warm]))]
        if warm.any() else None,
        "checkpoint_files_min_max_after_1min": [float(np.min(ck_files[warm])), float(np.max(ck_files[warm]))]
        if warm.any() else None,
        "checkpoint_bytes_median_second_and_last_minute": [
            float(np.median(ck[(t >= 60) & (t < 120)])) if ((t >= 60) & (t < 120)).any() else None,
            float(np.median(ck[t > t[-1] - 60])) if len(t) else None],
        "latency_p50_s_median": float(np.nanmedian(lat)) if np.isfinite(lat).any() else None,
        "around_kills": around,
    }


def plot(samples: list[dict], kills: list[dict], recoveries: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([s["t"] for s in samples]) / 60
    fig, ax = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    names = sorted({n for s in samples for n in s["rss_mb"]})
    for name in names:
        ax[0].plot(t, [s["rss_mb"].get(name) for s in samples], label=f"worker {name}")
    ax[0].plot(t, [s["driver_rss_mb"] for s in samples], label="driver (+ scheduler)")
    ax[0].set_ylabel("RSS (MiB)")
    ax[0].legend(loc="upper left", fontsize=8)
    ax[1].plot(t, [s["checkpoint_bytes"] / 2**20 for s in samples])
    ax[1].set_ylabel("checkpoint dir (MiB)")
    ax[2].plot(t, [s["latency_p50_s"] for s in samples], ".", ms=3, label="p50 of rows committed (creation → commit)")
    ax[2].plot(t, [s["staleness_s"] for s in samples], lw=0.8, label="staleness (now − newest committed row)")
    mt = [(s["t"] / 60, s["metrics_p50_s"]) for s in samples if s.get("metrics_p50_s") is not None]
    if mt:
        ax[2].plot(*zip(*mt), "x", ms=3, label="aggregate p50, job.metrics() (emit → applied)")
    ax[2].set_ylabel("latency (s)")
    ax[2].set_yscale("log")
    ax[2].legend(loc="upper left", fontsize=8)
    for key, label in (("committed_per_s", "rows committed / s"), ("written_per_s", "rows written / s")):
        rate = pd.Series([s[key] for s in samples]).rolling(5, min_periods=1).mean()
        ax[3].plot(t, rate, lw=0.8, label=label + " (5 s mean)")
    ax[3].set_ylabel("records/s")
    ax[3].set_xlabel("minutes")
    ax[3].legend(loc="upper left", fontsize=8)
    for a in ax:
        for k in kills:
            a.axvline(k["t"] / 60, color="red", lw=0.8, ls="--")
        for r in recoveries:
            a.axvline(r["completed_t"] / 60, color="green", lw=0.6, ls=":")
    ax[0].set_title(title + "\n(red dashed: SIGKILL of a worker; green dotted: recovery completed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def check(job, landing: str, rows_path: str) -> dict:
    """The aggregate's state and the committed rows against pandas over every row written."""
    truth = pd.read_parquet(landing)
    want = truth.groupby("key").agg(**{k: v for k, v in SPEC.items()}).sort_index()
    state = job.state("totals")[["n", "total"]].sort_index()
    state.index = state.index.astype(np.int64)
    out = {"rows_written": len(truth), "keys": len(want)}
    try:
        pd.testing.assert_frame_equal(state, want, check_dtype=False, check_names=False)
        out["state_exact"] = True
    except AssertionError as exc:
        out["state_exact"] = False
        out["state_diff"] = str(exc)[:2000]
    got = pd.read_parquet(rows_path)
    dup = int(got["id"].duplicated().sum())
    missing = int(len(set(truth["id"]) - set(got["id"])))
    extra = int(len(set(got["id"]) - set(truth["id"])))
    out.update({"rows_committed": len(got), "duplicate_ids": dup, "missing_ids": missing, "unknown_ids": extra})
    same = False
    if not dup and not missing and not extra:
        a = got.sort_values("id").reset_index(drop=True)[list(truth.columns)]
        b = truth.sort_values("id").reset_index(drop=True)
        same = bool(a.equals(b.astype(a.dtypes.to_dict())))
    out["rows_exact"] = same
    out["exact"] = bool(out["state_exact"] and same)
    return out


def finish(job, writer: Writer, landing: str, rows_path: str, t0: float) -> dict:
    """Stop the writer, wait until the job read every row written, drain it, check it."""
    writer.halt.set()
    writer.join()
    total = writer.written
    log(t0, f"writer stopped at {total:,} rows in {writer.files} files; waiting for the job to read them")
    deadline = time.time() + 600
    read = -1
    while job.status == "running" and time.time() < deadline:
        try:
            read = int(job.state("totals")["n"].sum())
        except Exception:
            read = -1
        if read >= total:
            break
        time.sleep(1.0)
    log(t0, f"job read {read:,} of {total:,}; draining")
    began = time.time()
    job.drain(timeout=600)
    drained = time.time() - began
    log(t0, f"drained in {drained:.1f} s, status {job.status}")
    result = check(job, landing, rows_path)
    log(t0, f"check: {result}")
    return {"check": result, "drain_s": drained}


def recoveries_of(job, t0: float) -> list[dict]:
    keep = ("fault", "lost_workers", "checkpoint", "attempt", "error")
    return [{"completed_t": h["completed"] - t0, "started_t": h["started"] - t0,
             "time_to_resume": h["time_to_resume"], **{k: v for k, v in h.items() if k in keep}}
            for h in job.history if h.get("kind") == "recovery"]


def report(args, job, samples, kills, restarts, end: dict, duration: float, t0: float) -> None:
    """soak-samples.json, soak-summary.json and soak.png under ``args.out``."""
    recoveries = recoveries_of(job, t0)
    summary = summarize(samples, kills, recoveries, restarts, duration) if samples else {}
    try:
        checkpoints = len(job.checkpoints())
    except Exception:
        checkpoints = None
    summary.update({"args": vars(args), **end, "job_status": job.status,
                    "job_error": None if job.error is None else repr(job.error),
                    "failures": failures(job), "restarts_seen": restarts,
                    "recoveries_detail": recoveries, "kill_times": kills,
                    "machine": {"cpus": os.cpu_count(), "load_average_end": os.getloadavg()},
                    "checkpoints_complete": checkpoints})
    with open(os.path.join(args.out, "soak-samples.json"), "w") as f:
        json.dump({"samples": samples, "kills": kills, "recoveries": recoveries}, f, default=str)
    with open(os.path.join(args.out, "soak-summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    if samples:
        exact = end.get("check", {}).get("exact")
        plot(samples, kills, recoveries, os.path.join(args.out, "soak.png"),
             f"soak: {args.minutes:g} min, {args.rate} rows/s, a worker SIGKILLed every {args.kill_every:g} s; "
             f"exact={exact}")
    brief = ("kills", "recoveries", "time_to_resume_s", "rss_slope_mb_per_min", "checkpoint_bytes_min_max",
             "around_kills")
    log(t0, "summary: " + json.dumps({k: summary.get(k) for k in brief}, default=str))


def driver_growth(first) -> list[str]:
    """The 15 places whose allocations in the driver grew most since the snapshot ``first``."""
    diff = tracemalloc.take_snapshot().compare_to(first, "traceback")
    out = []
    for d in diff[:15]:
        frames = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in d.traceback[:6]]
        out.append(f"{d.size_diff / 2**20:+.2f} MiB in {d.count_diff:+d} blocks at " + " < ".join(frames))
    tracemalloc.stop()          # the check at the end reads every row: not under tracemalloc
    return out


def failures(job):
    """``job.failures()`` as JSON can hold it (a count, or a frame of the failures)."""
    f = job.failures()
    return f.to_dict("records") if isinstance(f, pd.DataFrame) else f


def replot(out: str) -> int:
    """soak-summary.json and soak.png again from soak-samples.json (and the run's summary)."""
    with open(os.path.join(out, "soak-samples.json")) as f:
        run = json.load(f)
    with open(os.path.join(out, "soak-summary.json")) as f:
        old = json.load(f)
    a = old["args"]
    summary = {**old, **summarize(run["samples"], run["kills"], run["recoveries"], old["restarts_seen"],
                                  a["minutes"] * 60.0)}
    with open(os.path.join(out, "soak-summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    plot(run["samples"], run["kills"], run["recoveries"], os.path.join(out, "soak.png"),
         f"soak: {a['minutes']:g} min, {a['rate']} rows/s, a worker SIGKILLed every {a['kill_every']:g} s; "
         f"exact={old.get('check', {}).get('exact')}")
    return 0


def setup_logging(path: str) -> None:
    h = logging.FileHandler(path)
    h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name, level in (("streamlb", logging.INFO), ("distributed", logging.WARNING)):
        lg = logging.getLogger(name)
        lg.addHandler(h)
        lg.setLevel(level)


def main(argv=None) -> int:
    args = parse(argv)
    if args.replot:
        return replot(args.out)
    os.makedirs(args.out, exist_ok=True)
    sys.path.insert(0, REPO)        # this checkout's streamlb, in the driver and in the worker processes
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    from dask.distributed import Client, LocalCluster
    from streamz import Stream

    import streamlb

    work = args.work or tempfile.mkdtemp(prefix="streamlb-soak-")
    landing, out, ck = (os.path.join(work, d) for d in ("landing", "out", "ck"))
    for d in (landing, out, ck):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(landing)
    duration = args.minutes * 60.0
    kill_at = list(np.arange(args.kill_every / 2, duration, args.kill_every))
    t0 = time.time()
    log(t0, f"soak: {args.minutes} min, SIGKILL at {[round(k) for k in kill_at]} s, {args.rate} rows/s, "
            f"work dir {work}, load average {os.getloadavg()}")
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, scheduler_port=args.port,
                           dashboard_address=":0", silence_logs=logging.ERROR)
    client = Client(cluster)
    setup_logging(os.path.join(args.out, "soak.log"))      # after silence_logs set every handler's level
    writer = Writer(landing, args.rate, args.file_every, args.skew)
    samples: list[dict] = []
    kills: list[dict] = []
    job = None
    try:
        workers = Workers(client)
        workers.refresh(0.0)
        writer.start()
        src = Stream.from_parquet(landing, watch="1s")
        src.to_parquet(os.path.join(out, "rows"))
        src.key_by("key").aggregate(SPEC, name="totals")
        # every setting at its default (restart_attempts bounds recoveries in a row: a checkpoint
        # completed between two kills starts its count afresh)
        job = streamlb.run(src, client=client, checkpoint=ck, checkpoint_interval="1s")
        t0 = time.time()        # the run's clock starts with the job
        log(t0, f"job {job.id} running on {sorted(workers.pids.items())}")
        sampler = Sampler(job, client, workers, writer, Output(os.path.join(out, "rows")), ck)
        traced = None
        if args.trace_driver:
            tracemalloc.start(8)
        tick = t0
        while time.time() - t0 < duration:
            now = time.time() - t0
            if kill_at and now >= kill_at[0]:
                kill_at.pop(0)
                kills.append(kill(workers, len(kills), now, t0))
            samples.append(sampler.take(now))
            if args.trace_driver and traced is None and now >= 60:
                traced = tracemalloc.take_snapshot()
            if job.status != "running":
                log(t0, f"job is {job.status}: {job.error!r}")
                break
            if len(samples) % 10 == 0:
                progress(t0, samples[-1], sampler.last_latency)
            tick += 1.0
            time.sleep(max(0.0, tick - time.time()))
        end = {"driver_growth": driver_growth(traced)} if traced is not None else {}
        try:
            end.update(finish(job, writer, landing, os.path.join(out, "rows"), t0))
        except Exception as exc:        # still write what was sampled
            end["error"] = f"{type(exc).__name__}: {exc}"
            log(t0, f"the end of the run failed: {end['error']}")
        report(args, job, samples, kills, workers.restarts, end, duration, t0)
        return 0 if end.get("check", {}).get("exact") and job.status == "done" else 1
    finally:
        writer.halt.set()
        if job is not None:
            try:
                job.stop()
            except Exception as exc:
                print(f"stop: {exc!r}", file=sys.stderr)
        client.close()
        cluster.close()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
