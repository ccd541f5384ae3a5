"""Exactly-once checkpoints: their cost to throughput, their size, and recovery from a lost worker.

Every figure comes from one run of :func:`measure` (``python -m benchmarks.checkpoint`` from
asv_bench/, or asv's ``setup_cache``); each part runs on a fresh LocalCluster of worker
processes with one thread each (nannies, as LocalCluster has by default). The job is always
the same keyed ``aggregate`` ({"count": ("value", "count"), "sum": ("value", "sum")}, named
``totals``) of a Parquet log; checkpoints go to a fresh directory under the data directory,
removed after each run.

``throughput`` (2 workers)
    THROUGHPUT_ROWS rows over THROUGHPUT_KEYS possible keys, uniform (Zipf 0), 4 files:
    about 2.0M distinct keys held by the end (over 1.5M from the first checkpoint on). Closed loop (no
    ``rate=``: the sources read as fast as the job takes the rows), every setting at its
    default. The same job runs without ``checkpoint=`` (``none``) and with
    ``checkpoint=<dir>, checkpoint_interval=1.0`` (``checkpoint``), alternated, PAIRS runs
    of each (none, checkpoint, none, checkpoint, ...), on one cluster; records/s is
    ``job.summary()["records_per_second"]`` (rows read over the wall time from the first
    source start to the last instance finish) and each case reports its median; the ratio
    is checkpoint over none (target >= 0.9). Every run's final state is checked: its
    distinct keys and the sum of its counts (= rows) against pandas. The coordinator waits
    the interval after a checkpoint completes, so checkpoints start every interval plus a
    checkpoint's duration (a run of 7-9 s takes 5-6). Beside the ratio of the medians,
    ``pair_ratio`` is the median of each pair's ratio (a run with checkpoints over the run
    without just before it): the machine's drift over the whole part cancels out of it.

Checkpoint duration and size (from ``job.checkpoints()``)
    ``uniform``: the checkpointed runs above. "full" is each run's first checkpoint (it
    writes every key group); "incremental" the later ones, which write only the key groups
    changed since the previous complete checkpoint and reference the others' files
    (``bytes_referenced``). With uniform keys every key group changes every second, so here
    an incremental checkpoint writes about as much as a full one: the figure shows what
    incremental checkpoints cost when they cannot save anything. Figures: median over the
    runs of the full one; median over every later one of every run.

    ``local``: a log written here with pandas (LOCAL_KEYS keys, 4 files, float
    ``event_time`` in seconds), replayed in event time at LOCAL_RATE records/s so that one
    event second is one wall second, on 2 workers, default key groups, LOCAL_BATCH rows per
    batch (so the replay's event-time slices are short and the load below is emitted in
    small batches, by about 0.7 s): first every key once, in random order, within LOAD_SPAN
    s, so the state is loaded before the first checkpoint (at 1 s); nothing until WALK_START
    s; then LOCAL_WALK_ROWS rows whose keys are drawn at random and *sorted by key group*
    over WALK_SPAN s, every file walking the groups in the same order, so each second
    touches about 1/WALK_SPAN of the key groups. The first checkpoint is full (LOCAL_KEYS
    keys); the later ones write only the groups the walk touched since the previous one.
    Figures: the full one's bytes written and duration, and the median of the later ones'
    (bytes written, bytes referenced, duration, and written / full). Should the first
    checkpoint hold less than the whole loaded state (the load fell behind, or the sources
    of a cluster just started had emitted nothing yet: seen 4 times in about 37 runs), the
    run is made again, LOCAL_ATTEMPTS times at most; the figures say how many it took and
    are flagged if none succeeded.

``recovery`` (3 workers)
    RECOVERY_ROWS rows over THROUGHPUT_KEYS keys (uniform, 4 files), replayed in event time
    at RECOVERY_RATE records/s (an open loop: the log lasts about 20 s; after the restore
    the sources are behind their clock and catch up as fast as the job goes), 1 s
    checkpoints, metrics windows of WINDOW s. Once at least 2 checkpoints are complete and
    the aggregate holds >= KILL_AT_KEYS keys, one worker process holding instances of
    ``totals`` (the first by address) is killed with SIGKILL (its pid from ``client.run(os.getpid)``); its nanny
    starts a new one. The driver restores the whole job from the latest complete
    checkpoint on the workers it finds and replays the records after it; ``job.wait()``
    runs all along, in the main thread. Figures:

    - time to resume: SIGKILL -> the end of the first metrics window in which an instance
      of ``totals`` created by the recovery applied records (``records`` > 0 in
      ``job.metrics()``, read after the job ended; the old instances' windows went with
      their actors, and only windows starting after the recovery started are taken).
      The window's end is an upper bound: the first record was applied at most WINDOW s
      earlier. Target <= 5 s. Broken down: SIGKILL -> the driver starts the recovery
      (detection: ``started`` of the ``recovery`` record of ``job.history``), the
      recovery itself (its ``time_to_resume``: stop, re-create, install state, start
      sources), recovery done -> first applied record;
    - restored keys: ``restored_keys`` of the recovery record (the checkpoint's keys);
      keys held at the SIGKILL for comparison;
    - replayed records: records the old source instances had emitted (polled just before
      the SIGKILL for the killed worker's, and until they stop for the others) minus the
      records the checkpoint's positions had emitted (``resumed_from_records``): the rows
      read before the failure and read again after it. A lower bound by at most one poll
      interval (20 ms) of the surviving sources;
    - exactness: the final ``job.state("totals")`` must equal pandas' count and sum per
      key over the input files, exactly (values are integers 0..999); else AssertionError.

Every part also reports the 1-minute load average before it started and the cores that
processes outside the benchmark used while it ran (as ``rescale.py`` does): the figures
are only worth keeping when that is near 0. ``measure`` starts with the machine probe of
docs/benchmarks.md (np.add.at on 65536 random keys for 2 s, M records/s).
"""
from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from ._common import DATA, _cpu, _OneShot, cluster, zipf_dataset

THROUGHPUT_ROWS, THROUGHPUT_KEYS = 30_000_000, 2_000_000
PAIRS = 5                          # runs of each throughput case, alternated
INTERVAL = 1.0                     # checkpoint_interval, seconds

LOCAL_KEYS = 1_000_000
LOCAL_WALK_ROWS = 4_000_000
LOAD_SPAN, WALK_START, WALK_SPAN = 0.4, 2.0, 8.0      # event seconds (= wall seconds)
LOCAL_RATE = (LOCAL_KEYS + LOCAL_WALK_ROWS) / (WALK_START + WALK_SPAN)
LOCAL_BATCH = 16_384               # event-time slices of 66 ms: the load is emitted by ~0.7 s
LOCAL_ATTEMPTS = 3

RECOVERY_ROWS = 6_000_000
RECOVERY_RATE = 300_000            # records/s: the log lasts 20 s
KILL_AT_KEYS = 1_100_000
WINDOW = 0.1                       # metrics window of the recovery run, seconds

SPEC = {"count": ("value", "count"), "sum": ("value", "sum")}
PROBE = """
import numpy as np, time
k = np.random.randint(0, 100000, 65536); v = np.random.rand(65536)
c = np.zeros(100000); s = np.zeros(100000)
t = time.perf_counter(); n = 0
while time.perf_counter() - t < 2:
    np.add.at(c, k, 1); np.add.at(s, k, v); n += 65536
print(n / (time.perf_counter() - t) / 1e6)
"""


def _say(msg: str) -> None:
    print(f"[checkpoint {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class _Others:
    """Cores used on average by processes outside the benchmark between enter and exit."""

    def __enter__(self):
        self.load = os.getloadavg()[0]
        self.t0, self.cpu0 = time.time(), _cpu()
        return self

    def __exit__(self, *exc):
        cpu1, t1 = _cpu(), time.time()
        self.cores = max(0.0, (cpu1[0] - self.cpu0[0]) - (cpu1[1] - self.cpu0[1])) / (t1 - self.t0)


def probe() -> float:
    """The machine probe: M records/s of np.add.at (count and sum) on one core."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def _build(path: str, **kw):
    from streamz import Stream

    src = Stream.from_parquet(path, **kw)
    src.key_by("key").aggregate(SPEC, name="totals")
    return src


def _expected(path: str):
    """count and sum per key over every file of ``path``, by pandas."""
    import pandas as pd

    from streamlb.planner import parquet_files

    df = pd.concat([pd.read_parquet(f, columns=["key", "value"]) for f in parquet_files(path)],
                   ignore_index=True)
    return df.groupby("key")["value"].agg(["count", "sum"]).sort_index()


def _scratch() -> str:
    os.makedirs(DATA, exist_ok=True)
    return tempfile.mkdtemp(prefix="checkpoints-", dir=os.path.abspath(DATA))


# -- the local dataset -----------------------------------------------------------------------------
def local_dataset() -> str:
    """Path of the ``local`` log (see the module docstring), written with pandas the first
    time it is asked for. Its key groups are those of the default ``streamlb.key-groups``."""
    import json

    import pandas as pd

    from streamlb import assign_to_key_group, config

    G = int(config.get("key-groups"))
    name = f"local-{LOCAL_KEYS}-{LOCAL_WALK_ROWS}-{LOAD_SPAN}-{WALK_START}-{WALK_SPAN}-{G}"
    path = os.path.abspath(os.path.join(DATA, name))
    if os.path.exists(os.path.join(path, "_manifest.json")):
        return path
    _say(f"writing {path}")
    rng = np.random.default_rng(0)
    load_keys = rng.permutation(LOCAL_KEYS).astype(np.int64)
    load_t = np.sort(rng.uniform(0.0, LOAD_SPAN, LOCAL_KEYS))
    walk_keys = rng.integers(0, LOCAL_KEYS, LOCAL_WALK_ROWS).astype(np.int64)
    walk_keys = walk_keys[np.argsort(assign_to_key_group(walk_keys, G), kind="stable")]
    walk_t = WALK_START + WALK_SPAN * np.arange(LOCAL_WALK_ROWS) / LOCAL_WALK_ROWS
    keys = np.concatenate([load_keys, walk_keys])
    df = pd.DataFrame({"key": keys, "value": rng.integers(0, 1000, len(keys)).astype(np.float64),
                       "event_time": np.concatenate([load_t, walk_t])})
    shutil.rmtree(path, ignore_errors=True)
    files = []
    for i in range(4):        # row i to file i % 4: every file walks the key groups together
        os.makedirs(os.path.join(path, f"part={i}"))
        f = os.path.join(path, f"part={i}", "part-0.parquet")
        df.iloc[i::4].reset_index(drop=True).to_parquet(f, index=False, row_group_size=65536)
        files.append({"path": os.path.relpath(f, path), "rows": len(df.iloc[i::4])})
    with open(os.path.join(path, "_manifest.json"), "w") as fh:
        json.dump({"params": {"kind": "local", "keys": LOCAL_KEYS, "walk_rows": LOCAL_WALK_ROWS,
                              "load_span": LOAD_SPAN, "walk_start": WALK_START, "walk_span": WALK_SPAN,
                              "key_groups": G}, "rows": len(df), "files": files}, fh, indent=1)
    return path


# -- throughput, and the uniform checkpoints ---------------------------------------------------------
def _throughput_run(client, path: str, checkpointed: bool, expected, backend: str = "memory") -> dict:
    import streamlb

    where = _scratch() if checkpointed else None
    try:
        job = streamlb.run(_build(path), client=client, checkpoint=where, state_backend=backend,
                           checkpoint_interval=INTERVAL if checkpointed else None)
        try:
            job.wait()
            s = job.summary()
            cps = job.checkpoints()
            state = job.state("totals")
        finally:
            job.stop()
    finally:
        if where:
            shutil.rmtree(where, ignore_errors=True)
    if len(state) != len(expected) or int(state["count"].sum()) != int(expected["count"].sum()):
        raise AssertionError(f"throughput run ({'checkpoint' if checkpointed else 'none'}): "
                             f"{len(state):,} keys and {int(state['count'].sum()):,} records counted, "
                             f"pandas: {len(expected):,} keys, {int(expected['count'].sum()):,} records")
    return {"records_per_second": s["records_per_second"], "seconds": s["seconds"],
            "keys": len(state), "checkpoints": cps.to_dict("records")}


def throughput(path: str | None = None, backend: str = "memory", rows: int = THROUGHPUT_ROWS,
               pairs: int = PAIRS) -> dict:
    """The ``throughput`` part: none and checkpoint alternated, ``pairs`` of each, the state
    in ``backend``."""
    path = path or zipf_dataset(rows, THROUGHPUT_KEYS, 0.0, partitions=4)
    expected = _expected(path)
    runs: dict[str, list] = {"none": [], "checkpoint": []}
    cl, client = cluster(2)
    with cl, client, _Others() as others:
        for i in range(pairs):
            for case in ("none", "checkpoint"):
                r = _throughput_run(client, path, case == "checkpoint", expected, backend)
                runs[case].append(r)
                _say(f"throughput {case} #{i + 1}: {r['records_per_second']:,.0f} records/s "
                     f"({r['seconds']:.2f} s, {r['keys']:,} keys, {len(r['checkpoints'])} checkpoints)")
    med = {c: statistics.median(r["records_per_second"] for r in rs) for c, rs in runs.items()}
    cps = [r["checkpoints"] for r in runs["checkpoint"]]
    pairs = [c["records_per_second"] / n["records_per_second"] for n, c in zip(runs["none"], runs["checkpoint"])]
    out = {"records_per_second": med, "ratio": med["checkpoint"] / med["none"],
           "pair_ratios": pairs, "pair_ratio": statistics.median(pairs),
           "runs": {c: [r["records_per_second"] for r in rs] for c, rs in runs.items()},
           "keys": runs["none"][-1]["keys"], "rows": int(expected["count"].sum()),
           "uniform": _sizes(cps), "load": others.load, "other_cores": others.cores}
    _say(f"throughput: none {med['none']:,.0f}, checkpoint {med['checkpoint']:,.0f} records/s "
         f"(ratio {out['ratio']:.3f}; median of the pairs' ratios {out['pair_ratio']:.3f}); "
         f"other processes used {others.cores:.2f} cores meanwhile")
    return out


def _sizes(runs: list[list[dict]]) -> dict:
    """Full (each run's first checkpoint) vs incremental (the later ones) of checkpointed runs."""
    full = [r[0] for r in runs if r]
    inc = [c for r in runs for c in r[1:]]
    if any(not c["full"] for c in full) or any(c["full"] for c in inc):
        raise AssertionError("expected every run's first checkpoint full and the later ones incremental: "
                             f"{[[c['full'] for c in r] for r in runs]}")
    nan = float("nan")
    med = lambda rows, k: statistics.median(c[k] for c in rows) if rows else nan  # noqa: E731
    out = {"full_count": len(full), "incremental_count": len(inc)}
    for k in ("duration", "bytes_written", "bytes_referenced", "keys"):
        out[f"full_{k}"] = med(full, k)
        out[f"incremental_{k}"] = med(inc, k)
    out["incremental_over_full_bytes"] = (out["incremental_bytes_written"] / out["full_bytes_written"]
                                          if out["full_bytes_written"] else nan)
    return out


# -- the local checkpoints ---------------------------------------------------------------------------
def local(path: str | None = None) -> dict:
    """The ``local`` part: one checkpointed replay on 2 workers (up to LOCAL_ATTEMPTS if the
    first checkpoint missed part of the load)."""
    path = path or local_dataset()
    for attempt in range(1, LOCAL_ATTEMPTS + 1):
        out = _local_run(path)
        out["attempts"] = attempt
        out["whole_state_in_full"] = out["full_keys"] >= LOCAL_KEYS
        if out["whole_state_in_full"]:
            break
        _say(f"local: the first checkpoint ({out['first_checkpoint_at_s']:.2f} s after the start) holds "
             f"{out['full_keys']:,.0f} keys, not the whole state loaded first ({LOCAL_KEYS:,}): the load fell "
             f"behind (attempt {attempt} of {LOCAL_ATTEMPTS})")
    _say(f"local: full {out['full_bytes_written'] / 1e6:.1f} MB in {out['full_duration']:.2f} s, "
         f"incremental {out['incremental_bytes_written'] / 1e6:.1f} MB in {out['incremental_duration']:.2f} s "
         f"(median of {out['incremental_count']}); other processes used {out['other_cores']:.2f} cores meanwhile")
    return out


def _local_run(path: str) -> dict:
    import streamlb
    from streamlb import config

    where = _scratch()
    cl, client = cluster(2)
    try:
        with cl, client, _Others() as others:
            job = streamlb.run(_build(path, rate=LOCAL_RATE, event_time="event_time", batch_size=LOCAL_BATCH),
                               client=client,
                               key_groups=int(config.get("key-groups")), checkpoint=where,
                               checkpoint_interval=INTERVAL)
            try:
                job.wait()
                cps = job.checkpoints()
                keys = sum(job.state_size("totals").values())
                started = job.started_at
            finally:
                job.stop()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    rows = cps.to_dict("records")
    out = _sizes([rows])
    out.update(keys=keys, checkpoints=rows, load=others.load, other_cores=others.cores,
               first_checkpoint_at_s=rows[0]["started"] - started if rows else float("nan"))
    return out


# -- recovery ----------------------------------------------------------------------------------------
def _poll_sum(actors: dict, timeout: float = 2.0) -> tuple[int, list]:
    """records_out of ``actors`` polled at once; (total, statuses). Raises the first
    failure once every answer is in or timed out. (A call to an actor its worker no longer
    holds never answers: distributed's ``wait_then_set_result`` raises the worker's
    KeyError in its own task, so the future is never set; hence the timeout.)"""
    res, errors = [], []
    for f in [a.poll() for a in actors.values()]:
        try:
            res.append(f.result(timeout=timeout))
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
    return sum(r["records_out"] for r in res), [r["status"] for r in res]


def _watch(job, client, out: dict) -> None:
    """Wait for 2 checkpoints and KILL_AT_KEYS keys, SIGKILL a worker, follow the old sources."""
    try:
        pids = client.run(os.getpid)
        while job.status == "running":
            done = len(job.checkpoints())
            held = sum(job.state_size("totals").values())
            if done >= 2 and held >= KILL_AT_KEYS:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the job ended ({job.status}) before it could be killed")
        stages = {st.id: st for st in job.plan.stages}
        holders = sorted({w for k, w in job.workers_of.items() if stages[k[0]].name == "totals"})
        victim = holders[0]
        sources = {k: a for k, a in job.actors.items() if stages[k[0]].is_source}
        doomed = {k: a for k, a in sources.items() if job.workers_of[k] == victim}
        others = {k: a for k, a in sources.items() if job.workers_of[k] != victim}
        doomed_at_kill, _ = _poll_sum(doomed) if doomed else (0, [])
        last, _ = _poll_sum(others) if others else (0, [])
        at_kill = doomed_at_kill + last
        out.update(victim=victim, victim_instances=sorted(
                       f"{stages[s].name}[{i}]" for (s, i), w in job.workers_of.items() if w == victim),
                   held_at_kill=held, checkpoints_at_kill=done, emitted_at_kill=at_kill)
        out["kill"] = time.time()
        os.kill(pids[victim], signal.SIGKILL)
        _say(f"recovery: SIGKILL to {victim} (pid {pids[victim]}; {', '.join(out['victim_instances'])}) "
             f"with {held:,} keys held, {done} checkpoints complete, {at_kill:,} records emitted")
        while others:           # until the recovery stops them (or drops them: the poll fails)
            if any(job.actors.get(k) is not a for k, a in others.items()):
                break           # dropped by the recovery: they emit nothing more
            try:
                n, status = _poll_sum(others)
            except Exception:
                break
            last = max(last, n)
            if any(s != "running" for s in status):
                break
            time.sleep(0.02)
        out["emitted_before_stop"] = doomed_at_kill + last
    except BaseException as exc:       # reported by the main thread
        out["error"] = exc


def recovery(path: str | None = None) -> dict:
    """The ``recovery`` part: a 3-worker job, one worker SIGKILLed mid-stream."""
    import streamlb

    path = path or zipf_dataset(RECOVERY_ROWS, THROUGHPUT_KEYS, 0.0, partitions=4)
    expected = _expected(path)
    where = _scratch()
    cl, client = cluster(3)
    watched: dict = {}
    try:
        with cl, client, _Others() as others:
            job = streamlb.run(_build(path, rate=RECOVERY_RATE, event_time="event_time"), client=client,
                               checkpoint=where, checkpoint_interval=INTERVAL, window=WINDOW)
            try:
                t = threading.Thread(target=_watch, args=(job, client, watched), daemon=True)
                t.start()
                job.wait()
                t.join(30)
                if t.is_alive():
                    raise RuntimeError("recovery: the thread following the old sources did not end")
                if "error" in watched:
                    raise watched["error"]
                state = job.state("totals")
                m = job.metrics()
                cps = job.checkpoints()
                history = job.history
            finally:
                job.stop()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    recs = [e for e in history if e.get("kind") == "recovery"]
    if len(recs) != 1:
        raise AssertionError(f"expected one recovery in job.history, found {len(recs)}: {recs}")
    rec = recs[0]
    kill = watched["kill"]
    agg = m[(m.operator == "totals") & (m.records > 0)]
    starts = agg.window_start.astype("int64") / 1e9
    after = starts[starts >= rec["started"] - WINDOW]
    if after.empty:
        raise AssertionError("no restored instance of 'totals' applied a record")
    first = float(after.min()) + WINDOW
    # exactness: the restored and replayed job counted every record once
    got = state[["count", "sum"]].sort_index()
    exact = (len(got) == len(expected) and bool((got.index.to_numpy() == expected.index.to_numpy()).all())
             and bool((got["count"].to_numpy() == expected["count"].to_numpy()).all())
             and bool((got["sum"].to_numpy() == expected["sum"].to_numpy()).all()))
    if not exact:
        both = got.join(expected, how="outer", lsuffix="_job", rsuffix="_pandas")
        bad = both[(both.count_job != both.count_pandas) | (both.sum_job != both.sum_pandas)]
        raise AssertionError(
            f"recovery: the final state differs from pandas on {len(bad):,} of {len(both):,} keys "
            f"(job counted {int(got['count'].sum()):,} records, pandas {int(expected['count'].sum()):,}); "
            f"first ones:\n{bad.head(10)}")
    out = {
        "time_to_resume_s": first - kill,
        "detect_s": rec["started"] - kill,
        "recover_s": rec["time_to_resume"],
        "first_record_after_recovery_s": first - rec["completed"],
        "restored_keys": int(rec["restored_keys"]),
        "held_at_kill": int(watched["held_at_kill"]),
        "replayed_records": int(watched["emitted_before_stop"] - rec["resumed_from_records"]),
        "emitted_at_kill_after_checkpoint": int(watched["emitted_at_kill"] - rec["resumed_from_records"]),
        "checkpoint": rec["checkpoint"], "checkpoints_at_kill": watched["checkpoints_at_kill"],
        "checkpoints": len(cps), "victim_instances": watched["victim_instances"],
        "lost_workers": rec["lost_workers"], "final_keys": len(got), "rows": int(expected["count"].sum()),
        "exact": exact, "load": others.load, "other_cores": others.cores,
    }
    _say(f"recovery: resumed {out['time_to_resume_s']:.2f} s after the SIGKILL (detected after "
         f"{out['detect_s']:.2f} s, restored in {out['recover_s']:.2f} s), {out['restored_keys']:,} keys "
         f"restored, {out['replayed_records']:,} records replayed; final state exact; other processes "
         f"used {others.cores:.2f} cores meanwhile")
    return out


def _code() -> str:
    """The commit of the streamlb measured, "+dirty" if its files differ from it."""
    import streamlb

    where = os.path.dirname(streamlb.__file__)
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=where, capture_output=True, text=True,  # noqa: E731
                                        check=True).stdout.strip()
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "--", ".") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure() -> dict:
    """Every part (see the module docstring): {"probe", "throughput", "local", "recovery"}."""
    import streamlb

    _say(f"streamlb from {os.path.dirname(streamlb.__file__)} at {_code()}; load average {os.getloadavg()}")
    paths = (zipf_dataset(THROUGHPUT_ROWS, THROUGHPUT_KEYS, 0.0, partitions=4), local_dataset(),
             zipf_dataset(RECOVERY_ROWS, THROUGHPUT_KEYS, 0.0, partitions=4))
    t0 = time.time()
    out = {"code": _code(), "probe_mrec_s": probe(), "load_at_start": os.getloadavg()}
    _say(f"machine probe: {out['probe_mrec_s']:.1f} M records/s")
    out["throughput"] = throughput(paths[0])
    out["local"] = local(paths[1])
    out["recovery"] = recovery(paths[2])
    out["seconds"] = time.time() - t0
    return out


class Checkpoints(_OneShot):
    """Throughput with and without 1 s checkpoints, checkpoint sizes full vs incremental, and
    time to resume after a SIGKILLed worker (see the module docstring)."""

    timeout = 900

    def setup_cache(self):
        return measure()

    def track_records_per_second_without_checkpoints(self, r):
        return r["throughput"]["records_per_second"]["none"]

    track_records_per_second_without_checkpoints.unit = "records/s"

    def track_records_per_second_with_checkpoints(self, r):
        return r["throughput"]["records_per_second"]["checkpoint"]

    track_records_per_second_with_checkpoints.unit = "records/s"

    def track_throughput_with_over_without_checkpoints(self, r):
        """Target >= 0.9."""
        return r["throughput"]["ratio"]

    track_throughput_with_over_without_checkpoints.unit = "ratio"

    def track_throughput_pair_ratio(self, r):
        """Median over pairs of (with checkpoints / without, run just before)."""
        return r["throughput"]["pair_ratio"]

    track_throughput_pair_ratio.unit = "ratio"

    def track_uniform_full_checkpoint_seconds(self, r):
        return r["throughput"]["uniform"]["full_duration"]

    track_uniform_full_checkpoint_seconds.unit = "s"

    def track_uniform_full_checkpoint_bytes(self, r):
        return float(r["throughput"]["uniform"]["full_bytes_written"])

    track_uniform_full_checkpoint_bytes.unit = "bytes"

    def track_uniform_incremental_checkpoint_seconds(self, r):
        return r["throughput"]["uniform"]["incremental_duration"]

    track_uniform_incremental_checkpoint_seconds.unit = "s"

    def track_uniform_incremental_checkpoint_bytes(self, r):
        return float(r["throughput"]["uniform"]["incremental_bytes_written"])

    track_uniform_incremental_checkpoint_bytes.unit = "bytes"

    def track_uniform_incremental_bytes_referenced(self, r):
        return float(r["throughput"]["uniform"]["incremental_bytes_referenced"])

    track_uniform_incremental_bytes_referenced.unit = "bytes"

    def track_local_full_checkpoint_seconds(self, r):
        return r["local"]["full_duration"]

    track_local_full_checkpoint_seconds.unit = "s"

    def track_local_full_checkpoint_bytes(self, r):
        return float(r["local"]["full_bytes_written"])

    track_local_full_checkpoint_bytes.unit = "bytes"

    def track_local_incremental_checkpoint_seconds(self, r):
        return r["local"]["incremental_duration"]

    track_local_incremental_checkpoint_seconds.unit = "s"

    def track_local_incremental_checkpoint_bytes(self, r):
        return float(r["local"]["incremental_bytes_written"])

    track_local_incremental_checkpoint_bytes.unit = "bytes"

    def track_local_incremental_bytes_referenced(self, r):
        return float(r["local"]["incremental_bytes_referenced"])

    track_local_incremental_bytes_referenced.unit = "bytes"

    def track_local_incremental_over_full_bytes(self, r):
        return r["local"]["incremental_over_full_bytes"]

    track_local_incremental_over_full_bytes.unit = "ratio"

    def track_recovery_time_to_resume(self, r):
        """SIGKILL -> first record applied by a restored instance; target <= 5 s."""
        return r["recovery"]["time_to_resume_s"]

    track_recovery_time_to_resume.unit = "s"

    def track_recovery_detection_seconds(self, r):
        return r["recovery"]["detect_s"]

    track_recovery_detection_seconds.unit = "s"

    def track_recovery_restored_keys(self, r):
        return float(r["recovery"]["restored_keys"])

    track_recovery_restored_keys.unit = "keys"

    def track_recovery_replayed_records(self, r):
        return float(r["recovery"]["replayed_records"])

    track_recovery_replayed_records.unit = "records"

    def track_machine_probe(self, r):
        return r["probe_mrec_s"]

    track_machine_probe.unit = "M records/s"


def table(r: dict) -> str:
    """The figures of :func:`measure` as a Markdown table."""
    tp, u, lo, rc = r["throughput"], r["throughput"]["uniform"], r["local"], r["recovery"]
    mb = lambda b: f"{b / 1e6:.1f} MB"  # noqa: E731
    runs = lambda c: ", ".join(f"{x / 1e6:.2f}" for x in tp["runs"][c])  # noqa: E731
    rows = [
        ("streamlb", r["code"], "commit measured"),
        ("machine probe", f"{r['probe_mrec_s']:.1f} M rec/s", "np.add.at, 1 core"),
        ("(a) records/s, no checkpoints", f"{tp['records_per_second']['none']:,.0f}",
         f"median of {len(tp['runs']['none'])}: {runs('none')} M"),
        ("(a) records/s, 1 s checkpoints", f"{tp['records_per_second']['checkpoint']:,.0f}",
         f"median of {len(tp['runs']['checkpoint'])}: {runs('checkpoint')} M"),
        ("(a) ratio (target >= 0.9)", f"{tp['ratio']:.3f}",
         f"{tp['keys']:,} keys held at the end, {tp['rows']:,} rows"),
        ("(a) median of the pairs' ratios", f"{tp['pair_ratio']:.3f}",
         ", ".join(f"{x:.3f}" for x in tp["pair_ratios"])),
        ("(b) uniform: full checkpoint", f"{mb(u['full_bytes_written'])} in {u['full_duration']:.2f} s",
         f"{u['full_keys']:,.0f} keys; median of {u['full_count']}"),
        ("(b) uniform: incremental", f"{mb(u['incremental_bytes_written'])} in {u['incremental_duration']:.2f} s",
         f"{mb(u['incremental_bytes_referenced'])} referenced, {u['incremental_keys']:,.0f} keys; "
         f"median of {u['incremental_count']}"),
        ("(b) local: full checkpoint", f"{mb(lo['full_bytes_written'])} in {lo['full_duration']:.2f} s",
         f"{lo['full_keys']:,.0f} keys" + ("" if lo["whole_state_in_full"] else " (PARTIAL: the load fell behind)")
         + (f"; run {lo['attempts']} times" if lo["attempts"] > 1 else "")),
        ("(b) local: incremental", f"{mb(lo['incremental_bytes_written'])} in {lo['incremental_duration']:.2f} s",
         f"{lo['incremental_over_full_bytes']:.2f} of full; {mb(lo['incremental_bytes_referenced'])} referenced; "
         f"median of {lo['incremental_count']}"),
        ("(c) time to resume (target <= 5 s)", f"{rc['time_to_resume_s']:.2f} s",
         f"detect {rc['detect_s']:.2f} s + recover {rc['recover_s']:.2f} s + first record "
         f"{rc['first_record_after_recovery_s']:.2f} s (window {WINDOW} s)"),
        ("(c) restored keys", f"{rc['restored_keys']:,}",
         f"checkpoint {rc['checkpoint']}; {rc['held_at_kill']:,} held at the SIGKILL"),
        ("(c) replayed records", f"{rc['replayed_records']:,}",
         f"{rc['emitted_at_kill_after_checkpoint']:,} emitted after the checkpoint by the SIGKILL"),
        ("(c) final state = pandas", "exact" if rc["exact"] else "DIFFERS",
         f"{rc['final_keys']:,} keys, {rc['rows']:,} rows; killed {', '.join(rc['victim_instances'])}"),
        ("load average / other cores", f"{r['load_at_start'][0]:.2f}",
         f"other processes' cores: (a) {tp['other_cores']:.2f}, (b) local {lo['other_cores']:.2f}, "
         f"(c) {rc['other_cores']:.2f}"),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    lines = [f"| {'figure':<{w0}} | {'value':<{w1}} | notes |", f"|{'-' * (w0 + 2)}|{'-' * (w1 + 2)}|-------|"]
    lines += [f"| {a:<{w0}} | {b:<{w1}} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


if __name__ == "__main__":      # python -m benchmarks.checkpoint [--json], from asv_bench/
    import json

    if "--throughput" in sys.argv:      # [--state-backend B] [--rows N] [--pairs P]: that part alone
        def _arg(name, default):
            return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default

        res = throughput(backend=_arg("--state-backend", "memory"), rows=int(float(_arg("--rows", THROUGHPUT_ROWS))),
                         pairs=int(_arg("--pairs", PAIRS)))
        print(json.dumps(res, indent=1, default=str))
        sys.exit(0)
    res = measure()
    if "--json" in sys.argv:
        print(json.dumps(res, indent=1, default=str))
    print(table(res))
    print(f"\n{res['seconds']:.0f} s in all")
