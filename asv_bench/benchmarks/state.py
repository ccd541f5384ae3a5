"""The RocksDB state backend against the memory one (issue 28): a keyed count and sum over
the 5M-row Zipf(1.2) log of 100k keys (8 Parquet files), ``run()`` -> ``wait()`` on 2
worker processes at the defaults, ``state_backend="memory"`` and ``"rocksdb"`` alternating in
one sitting; and a uniform log of many distinct keys (every key a few times), where the
state is far larger than the hot set. Both backends' totals are checked against each other
every run.

``python -m benchmarks.state`` (from ``asv_bench/``) prints a line per run and the table:
records/s per backend, and the median over rounds of RocksDB's records/s over memory's.
Options: ``--rows``, ``--keys``, ``--rounds``, ``--distinct`` (rows of the uniform log; 0: skip it).
``--beyond-memory KEYS [--window]``: a keyed aggregate (or a hopping window aggregate) over
KEYS distinct keys on 2 workers of ``--limit`` memory, per backend (``--backends``).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

from ._common import _Sitting, cluster, markdown_table, timed_totals, zipf_dataset

SKEW = 1.2


def backend_seconds(client, path: str, backend: str) -> tuple[float, object]:
    """Seconds from ``run()`` to ``wait()``'s return with ``backend``, and the totals."""
    took, totals = timed_totals(client, path, state_backend=backend)
    return took, totals.sort_index()


def _same(a, b) -> None:
    import pandas as pd

    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def sitting(datasets: list[tuple[str, int, int]], rounds: int = 3, out=sys.stdout) -> dict:
    """For each ``(label, rows, keys)``: alternate the two backends ``rounds`` times; returns
    the runs and the median ratio (RocksDB's records/s over memory's) per label."""
    cl, client = cluster(2)
    result: dict = {"runs": [], "ratio": {}}
    start = time.perf_counter()
    with cl, client:
        for label, rows, keys in datasets:
            skew = SKEW if label == "zipf" else 0.0
            path = zipf_dataset(rows, keys, skew, 8)
            backend_seconds(client, path, "memory")          # warm-ups
            backend_seconds(client, path, "rocksdb")
            ratios = []
            for r in range(rounds):
                m, a = backend_seconds(client, path, "memory")
                k, b = backend_seconds(client, path, "rocksdb")
                _same(a, b)
                ratios.append(m / k)
                result["runs"].append({"data": label, "rows": rows, "keys": keys, "round": r, "memory": m,
                                       "rocksdb": k})
                print(f"[{time.perf_counter() - start:6.0f} s] {label} {rows:,} rows, {keys:,} keys, round "
                      f"{r + 1}/{rounds}: memory {rows / m / 1e6:5.2f}M rec/s  rocksdb {rows / k / 1e6:5.2f}M rec/s  "
                      f"ratio {m / k:4.2f}", file=out, flush=True)
            result["ratio"][label] = statistics.median(ratios)
    markdown_table(["data", "round", "memory", "rocksdb", "rocksdb / memory"],
                   [[f"{r['data']} {r['rows']:,} rows, {r['keys']:,} keys", r["round"],
                     f"{r['rows'] / r['memory'] / 1e6:.2f}M rec/s", f"{r['rows'] / r['rocksdb'] / 1e6:.2f}M rec/s",
                     f"{r['memory'] / r['rocksdb']:.2f}"] for r in result["runs"]], out)
    for label, ratio in result["ratio"].items():
        print(f"{label}: RocksDB at {ratio:.2f}x the memory backend's records/s (median)", file=out)
    return result


def distinct_log(keys: int, files: int = 16) -> str:
    """Every key of ``0..keys-1`` once, in random order, over ``files`` Parquet files;
    ``value = key % 1000``: the ground truth is known without holding the keys anywhere."""
    import os

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path: str) -> None:
        order = np.random.default_rng(0).permutation(keys)
        for i, part in enumerate(np.array_split(order, files)):
            pq.write_table(pa.table({"key": part, "value": (part % 1000).astype(np.float64)}),
                           os.path.join(path, f"part-{i:03d}.parquet"))

    return _written_once(f"distinct-{keys}-{files}", write)


def _written_once(name: str, write) -> str:
    """The directory ``name`` under the benchmarks' data directory, filled by
    ``write(path)`` the first time (a ``_done`` file marks it complete)."""
    import os

    from ._common import DATA

    path = os.path.abspath(os.path.join(DATA, name))
    done = os.path.join(path, "_done")
    if not os.path.exists(done):
        os.makedirs(path, exist_ok=True)
        write(path)
        open(done, "w").close()
    return path


@contextlib.contextmanager
def _watched_cluster(limit: str):
    """A LocalCluster of 2 workers of ``memory_limit=limit``: yields ``(client, peaks)``,
    ``peaks`` the peak RSS of each worker process so far (:func:`_watch_rss`, until the
    block ends)."""
    import threading

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=limit, dashboard_address=":0",
                      silence_logs=50) as cl, Client(cl) as client:
        peaks: dict = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_rss, args=(client, peaks, stop), daemon=True)
        watcher.start()
        try:
            yield client, peaks
        finally:
            stop.set()
            watcher.join()


def _watch_rss(client, peaks: dict, stop) -> None:
    """Peak resident memory of each worker process, sampled every 0.2 s until ``stop`` is set."""
    import os

    import psutil

    def rss():
        return psutil.Process(os.getpid()).memory_info().rss

    while not stop.wait(0.2):
        try:
            for w, r in client.run(rss).items():
                peaks[w] = max(peaks.get(w, 0), r)
        except Exception:
            pass


def _exact_by_slices(job, keys: int, step: int = 32) -> bool:
    """Whether the state holds every key of ``0..keys-1`` once, each with count 1 and sum
    ``key % 1000``: read ``step`` key groups at a time (never every key in one frame).
    Key groups partition the keys, so unique keys per slice and ``keys`` in all make the set."""
    import numpy as np

    seen = 0
    for lo in range(0, job.key_groups, step):
        part = job.state("totals", key_groups=range(lo, min(lo + step, job.key_groups)))
        k = part.index.to_numpy()
        if not (part.index.is_unique and ((k >= 0) & (k < keys)).all() and (part["count"].to_numpy() == 1).all()
                and np.array_equal(part["sum"].to_numpy(), (k % 1000).astype(float))):
            return False
        seen += len(part)
    return seen == keys


def _whole_read(job) -> tuple[str, int]:
    """What a whole ``job.state("totals")`` did (refused, as streamlb does for a frame that
    would not fit, or read), and the key groups a slice may then take (32 when it was read)."""
    import streamlb

    try:
        return f"read ({len(job.state('totals')):,} keys)", 32
    except streamlb.StateTooLargeError as exc:
        return f"refused: {exc}", exc.groups_per_read


def beyond_memory(keys: int = 30_000_000, limit: str = "1GiB", backends=("memory", "rocksdb"),
                  out=sys.stdout) -> dict:
    """A keyed count and sum over ``keys`` distinct keys on 2 workers of ``memory_limit=limit``,
    per backend: what happened (finished, or the error), records/s, the peak RSS per worker,
    and for a finished job whether its state is exact (count 1 and sum ``key % 1000`` for
    every key, checked in numpy)."""
    from streamz import Stream

    import streamlb

    path = distinct_log(keys)
    results = {}
    for backend in backends:
        with _watched_cluster(limit) as (client, peaks):
            src = Stream.from_parquet(path)
            src.key_by("key").aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="totals")
            t0 = time.perf_counter()
            job = streamlb.run(src, client=client, state_backend=backend)
            outcome, exact = "finished", None
            try:
                job.wait(timeout=1800, progress=out is sys.stdout)
                took = time.perf_counter() - t0
                whole, step = _whole_read(job)
                exact = _exact_by_slices(job, keys, step)
            except Exception as exc:
                took = time.perf_counter() - t0
                outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                job.stop()
        results[backend] = {"outcome": outcome, "seconds": took, "exact": exact,
                            "whole_read": whole if outcome == "finished" else None,
                            "peak_rss_mib": sorted(round(v / 2**20) for v in peaks.values())}
        rate = f"{keys / took / 1e6:.2f}M rec/s" if outcome == "finished" else "-"
        print(f"{backend}: {outcome} after {took:.1f} s ({rate}); exact: {exact}; peak RSS per worker "
              f"{results[backend]['peak_rss_mib']} MiB (limit {limit}); a whole job.state read: "
              f"{results[backend]['whole_read']}", file=out, flush=True)
    return results


def checkpoints(rows: int = 5_000_000, keys: int = 2_000_000, runs: int = 2, out=sys.stdout) -> dict:
    """Checkpoint duration and size per backend: a keyed count and sum over ``rows`` rows of
    ``keys`` uniform keys (every key group changes between checkpoints), ``checkpoint_interval=1.0``,
    ``runs`` runs per backend alternated on one 2-worker cluster. "full" is each run's first
    checkpoint, "incremental" the later ones (medians)."""
    import os
    import shutil

    from ._common import DATA

    path = zipf_dataset(rows, keys, 0.0, 4)
    cl, client = cluster(2)
    result: dict = {}
    with cl, client:
        for r in range(runs):
            for backend in ("memory", "rocksdb"):
                where = os.path.join(DATA, f"ck-{backend}")
                shutil.rmtree(where, ignore_errors=True)
                keep: dict = {}
                took, totals = timed_totals(client, path, keep, state_backend=backend, checkpoint=where,
                                            checkpoint_interval=1.0)
                shutil.rmtree(where, ignore_errors=True)
                if backend == "memory":
                    want = totals.sort_index()
                else:
                    _same(want, totals.sort_index())
                done = keep["checkpoints"]
                row = {"records_per_second": rows / took, "checkpoints": len(done)}
                for kind, part in (("full", done[done.full]), ("incremental", done[~done.full])):
                    if len(part):
                        row[kind] = {"seconds": float(part.duration.median()),
                                     "bytes": int(part.bytes_written.median()),
                                     "referenced": int(part.bytes_referenced.median()),
                                     "keys": int(part["keys"].median())}
                result.setdefault(backend, []).append(row)
                print(f"run {r + 1}/{runs} {backend}: {row}", file=out, flush=True)
    return result


def incremental_share(keys: int = 2_000_000, share: float = 0.01, backend: str = "rocksdb",
                      out=sys.stdout) -> dict:
    """Bytes of an incremental checkpoint where ``share`` of the key groups changed, against
    a full one: a keyed count and sum on 2 workers, ``checkpoint_interval=1s``, reading a
    watched directory; a first file of ``keys`` uniform keys (every group changes: the
    checkpoints after it write the whole state), then, once a checkpoint that changed nothing
    shows the first is in, a file updating the keys of ``share`` of the key groups. Returns
    the whole state's bytes as checkpoint files (written and referenced by that checkpoint),
    the bytes the checkpoints after the second file wrote, their ratio, and whether the
    totals are exact."""
    import os
    import shutil
    import tempfile

    import numpy as np
    import pandas as pd
    from streamz import Stream

    import streamlb

    work = tempfile.mkdtemp(prefix="streamlb-incr-")
    feed, ckpt = os.path.join(work, "in"), os.path.join(work, "ck")
    os.makedirs(feed)
    first = pd.DataFrame({"key": np.arange(keys, dtype=np.int64), "value": np.arange(keys, dtype=np.int64) % 1000})
    cl, client = cluster(2)
    try:
        with cl, client:
            src = Stream.from_parquet(feed, watch="1s")
            src.key_by("key").aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="totals")
            job = streamlb.run(src, client=client, state_backend=backend, checkpoint=ckpt, checkpoint_interval=1.0)
            groups = job.key_groups
            few = max(int(round(groups * share)), 1)
            # the second file updates the keys of ``few`` key groups: their state changes, no group grows
            second = first[streamlb.assign_to_key_group(first["key"].to_numpy(), groups) < few]
            _drop(first, feed, "part-0")
            settled = _checkpoint_after(job, lambda c: c["keys"].sum() >= keys and c["bytes_written"].iloc[-1] == 0)
            _drop(second, feed, "part-1")
            changed = _checkpoint_after(job, lambda c: c["bytes_written"].iloc[len(settled):].sum() > 0 and
                                        c["bytes_written"].iloc[-1] == 0)
            job.drain(timeout=300)
            got = job.state("totals").sort_index()
            job.stop()
        last = settled.iloc[-1]
        full = int(last["bytes_written"] + last["bytes_referenced"])       # the whole state, as files
        incr_bytes = int(changed["bytes_written"].iloc[len(settled):].sum())
        want = pd.concat([first, second]).groupby("key").agg(count=("value", "count"), sum=("value", "sum"))
        exact = np.array_equal(got.index.to_numpy(), want.index.to_numpy()) and \
            np.array_equal(got["count"].to_numpy(), want["count"].to_numpy()) and \
            np.array_equal(got["sum"].to_numpy(), want["sum"].to_numpy())
        result = {"backend": backend, "key_groups": groups, "changed_groups": few, "full_bytes": full,
                  "incremental_bytes": incr_bytes, "ratio": incr_bytes / full, "exact": bool(exact)}
        print(f"{backend}: the whole state {full / 2**20:.1f} MiB as checkpoint files; with {few} of {groups} key "
              f"groups changed ({len(second):,} keys updated), the checkpoints after wrote {incr_bytes / 2**20:.2f} "
              f"MiB: {100 * incr_bytes / full:.2f}% of a full one; exact: {exact}", file=out, flush=True)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _drop(frame, directory: str, name: str) -> None:
    """Write ``frame`` into a watched directory whole: under a hidden name, then renamed."""
    import os

    hidden = os.path.join(directory, f".{name}.parquet")
    frame.to_parquet(hidden)
    os.rename(hidden, os.path.join(directory, f"{name}.parquet"))


def _checkpoint_after(job, done, timeout: float = 600):
    """``job.checkpoints()`` once ``done(frame)`` holds for it (polled every 0.5 s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        c = job.checkpoints()
        if len(c) and done(c):
            return c
        time.sleep(0.5)
    raise TimeoutError(f"no such checkpoint within {timeout} s: {job.checkpoints()}")


class StateBackends(_Sitting):
    """asv: RocksDB's records/s over memory's, median of 3 alternating rounds, 5M rows Zipf(1.2)."""

    def setup_cache(self):
        return sitting([("zipf", 5_000_000, 100_000)])["ratio"]

    def track_rocksdb_over_memory_5M(self, ratio):
        return ratio["zipf"]


def distinct_times_log(keys: int, files: int = 16) -> str:
    """:func:`distinct_log` with an event time: row ``i`` of the log (keys in random order)
    at ``i * 2 s / keys``, so panes of 1 s hold ``keys / 2`` keys each, and the hopping window
    ``[0 s, 2 s)`` of size 2 s, slide 1 s, every key."""
    import os

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path: str) -> None:
        order = np.random.default_rng(0).permutation(keys)
        for i, part in enumerate(np.array_split(np.arange(keys), files)):
            k = order[part]
            t = (part * (2_000_000_000 / keys)).astype("int64").astype("datetime64[ns]")
            pq.write_table(pa.table({"key": k, "value": (k % 1000).astype(np.float64), "event_time": t}),
                           os.path.join(path, f"part-{i:03d}.parquet"))

    return _written_once(f"distinct-times-{keys}-{files}", write)


def window_truth(keys: int) -> dict:
    """Per window start (ns): ``(rows, keys' sum, values' sum)`` of the hopping windows over
    :func:`distinct_times_log` (each key once per window its row falls in; count 1 each)."""
    import numpy as np

    order = np.random.default_rng(0).permutation(keys)
    t = (np.arange(keys) * (2_000_000_000 / keys)).astype("int64")
    first = t < 1_000_000_000
    out = {}
    for start, sel in ((-1_000_000_000, first), (0, np.ones(keys, bool)), (1_000_000_000, ~first)):
        k = order[sel]
        out[start] = (int(sel.sum()), int(k.sum()), float((k % 1000).sum()))
    return out


def _window_totals(frame):
    """A fired frame of the window job, reduced on the worker to a row per window: rows,
    the keys' sum, the counts' sum and maximum, the values' sum (the driver never holds the
    windows' rows)."""
    import pandas as pd

    g = frame.assign(ws=frame["window_start"].astype("int64")).groupby("ws")
    return pd.DataFrame({"rows": g.size(), "keys": g["key"].sum(), "n": g["n"].sum(), "n_max": g["n"].max(),
                         "total": g["total"].sum()})


def beyond_memory_window(keys: int = 30_000_000, limit: str = "1GiB", backends=("memory", "rocksdb"),
                         out=sys.stdout) -> dict:
    """A hopping window aggregate (size 2 s, slide 1 s; count and sum per key) over ``keys``
    distinct keys (:func:`distinct_times_log`: two panes of ``keys / 2`` keys, one window of
    every key) on 2 workers of ``memory_limit=limit``, per backend: what happened (finished,
    or the error), the time, the peak RSS per worker, and whether each window's rows, keys,
    counts and sums are exact against numpy."""
    import pandas as pd
    from streamz import Stream

    import streamlb

    path = distinct_times_log(keys)
    truth = window_truth(keys)
    results = {}
    for backend in backends:
        with _watched_cluster(limit) as (client, peaks):
            src = Stream.from_parquet(path).with_watermark("event_time")
            win = src.key_by("key").window(size="2s", slide="1s").aggregate(
                {"n": ("value", "count"), "total": ("value", "sum")}, name="windows")
            parts = win.map(_window_totals).sink_to_list()
            t0 = time.perf_counter()
            job = streamlb.run(src, client=client, state_backend=backend)
            outcome, exact, frames = "finished", None, 0
            try:
                job.wait(timeout=3600, progress=out is sys.stdout)
                took = time.perf_counter() - t0
                got = pd.concat(parts).groupby(level=0).agg(
                    {"rows": "sum", "keys": "sum", "n": "sum", "n_max": "max", "total": "sum"})
                frames = len(parts)
                exact = (sorted(got.index.tolist()) == sorted(truth) and (got["n_max"] == 1).all()
                         and all((int(got.at[s, "rows"]), int(got.at[s, "keys"]), float(got.at[s, "total"]))
                                 == truth[s] and int(got.at[s, "n"]) == truth[s][0] for s in truth))
            except Exception as exc:
                took = time.perf_counter() - t0
                outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                job.stop()
        results[backend] = {"outcome": outcome, "seconds": took, "exact": exact, "frames": frames,
                            "peak_rss_mib": sorted(round(v / 2**20) for v in peaks.values())}
        print(f"window, {backend}: {outcome} after {took:.1f} s; exact: {exact} ({frames} frames out); peak RSS "
              f"per worker {results[backend]['peak_rss_mib']} MiB (limit {limit})", file=out, flush=True)
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.state", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--distinct", type=int, default=0, help="rows of a uniform log with rows/4 keys (0: skip)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--beyond-memory", type=int, default=0, metavar="KEYS",
                   help="instead: KEYS distinct keys on 2 workers of --limit memory, each backend once")
    p.add_argument("--limit", default="1GiB")
    p.add_argument("--window", action="store_true",
                   help="with --beyond-memory: a hopping window aggregate over KEYS distinct keys instead")
    p.add_argument("--backends", default="memory,rocksdb", help="with --beyond-memory: which, in order")
    p.add_argument("--checkpoints", action="store_true", help="instead: checkpoint duration and size per backend")
    p.add_argument("--incremental", action="store_true",
                   help="instead: an incremental checkpoint's bytes where 1%% of the key groups changed, against a "
                        "full one (--keys keys, default 2M)")
    a = p.parse_args(argv)
    if a.checkpoints:
        checkpoints()
        return
    if a.incremental:
        for backend in ("rocksdb", "memory"):
            incremental_share(a.keys if a.keys != 100_000 else 2_000_000, backend=backend)
        return
    if a.beyond_memory:
        run = beyond_memory_window if a.window else beyond_memory
        run(a.beyond_memory, a.limit, backends=tuple(a.backends.split(",")))
        return
    data = [("zipf", a.rows, a.keys)]
    if a.distinct:
        data.append(("uniform", a.distinct, a.distinct // 4))
    sitting(data, a.rounds)


if __name__ == "__main__":
    main()
