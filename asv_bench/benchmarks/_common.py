"""Shared set-up for the benchmarks: datasets prepared once with PySpark, clusters per run."""
from __future__ import annotations

import os
import statistics
import time
import warnings

warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")

DATA = os.environ.get(
    "STREAMLB_BENCH_DATA",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".data"),
)


def zipf_dataset(rows: int, keys: int, skew: float, partitions: int = 8, drift_every=None,
                 disorder: float = 0.0) -> str:
    """Path of a Zipf dataset, written by PySpark the first time it is asked for."""
    from streamlb import datasets

    name = f"zipf-{rows}-{keys}-{skew}-{partitions}-{drift_every}" + (f"-disorder{disorder}" if disorder else "")
    path = os.path.abspath(os.path.join(DATA, name))
    if not os.path.exists(os.path.join(path, "_manifest.json")):
        extra = {"disorder": disorder} if disorder else {}     # older commits have no disorder
        datasets.zipf(path, rows=rows, keys=keys, skew=skew, partitions=partitions,
                      drift_every=drift_every, seed=0, progress=True, **extra)
    return path


class _OneShot:
    """asv settings for a benchmark whose ``setup_cache`` runs the jobs once and whose
    ``track_`` methods read the figures."""

    timeout = 1800
    number = 1
    repeat = 1


class _Sitting(_OneShot):
    """asv settings of a sitting that alternates two systems and tracks their ratio."""

    timeout = 3600
    unit = "ratio"


def timed_totals(client, path: str, keep: dict | None = None, **run_kw) -> tuple[float, object]:
    """Seconds from ``run()`` to ``wait()``'s return (start-up included) of a keyed count
    and sum over the Parquet log ``path``, and the totals (``job.state``); ``keep`` gets
    the job's ``checkpoints()`` under "checkpoints"."""
    from streamz import Stream

    import streamlb

    src = Stream.from_parquet(path)
    src.key_by("key").aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="totals")
    t0 = time.perf_counter()
    job = streamlb.run(src, client=client, **run_kw)
    try:
        job.wait()
        took = time.perf_counter() - t0
        totals = job.state("totals")
        if keep is not None:
            keep["checkpoints"] = job.checkpoints()
    finally:
        job.stop()
    return took, totals


def markdown_table(header: list, rows: list, out) -> None:
    """Print ``rows`` (lists of cells) under ``header`` as a Markdown table."""
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header), file=out)
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |", file=out)


#: A keyed operator's first routing table: ``sampled`` (the default since issue 27, planned
#: on a sample of the keys, so ``static`` starts about balanced) or ``ranges`` (equal
#: contiguous ranges of key groups, ``streamlb.exchange.sample-keys: 0``: the ``static`` the
#: balancing targets were set against).
FIRST_TABLES = ["sampled", "ranges"]


def first_table(name: str):
    """The settings under which a job starts from the first table ``name``."""
    import contextlib

    import dask

    import streamlb  # noqa: F401  (its defaults first: a setting made before them is undone whole)

    if name not in FIRST_TABLES:
        raise ValueError(f"first table {name!r} is not one of {FIRST_TABLES}")
    return dask.config.set({"streamlb.exchange.sample-keys": 0}) if name == "ranges" else contextlib.nullcontext()


class _SpeedupOverStatic(_OneShot):
    """Tracks for a ``setup_cache`` returning records/s per (balancer, first table), ``static``
    included."""

    param_names = ["balancer", "first_table"]     # a subclass's params: [its balancers, FIRST_TABLES]

    def track_records_per_second(self, r, balancer, first_table):
        return r[(balancer, first_table)]

    track_records_per_second.unit = "records/s"

    def track_speedup_over_static(self, r, balancer, first_table):
        return r[(balancer, first_table)] / r[("static", first_table)]

    track_speedup_over_static.unit = "x static"


def cluster(n_workers: int = 2):
    from distributed import Client, LocalCluster

    c = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                     dashboard_address=":0", silence_logs=40)
    return c, Client(c)


def median_rate(client, build, runs: int = 3, **run_kw) -> float:
    """records/s of the pipeline ``build()`` returns, median of ``runs`` after one warm-up."""
    import streamlb

    rates = []
    for i in range(runs + 1):
        job = streamlb.run(build(), client=client, **run_kw)
        try:
            job.wait()
            s = job.summary()
        finally:
            job.stop()
        if i:
            rates.append(s["records_per_second"])
    return statistics.median(rates)


def _cpu() -> tuple[float, float]:
    """CPU seconds used so far by the whole machine and by this process and its children
    (the cluster's scheduler, nannies and workers)."""
    import psutil

    t = psutil.cpu_times()
    me = psutil.Process()
    mine = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            c = p.cpu_times()
            mine += c.user + c.system
        except psutil.Error:
            pass
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0), mine


def quiet(busy: float = 0.15, longest: float = 15.0) -> float:
    """Wait until the machine is quiet: its CPUs busy at most ``busy`` (a fraction of all
    cores) over a quarter of a second, or ``longest`` seconds passed. Returns the seconds
    waited. A JVM keeps working (garbage collection, compilation) for a while after a Spark
    query returns, on the cores the next run needs: timing that run right away measured
    the JVM too (streamlb's q5 at half its speed after five alternated rounds)."""
    import psutil

    t0 = time.perf_counter()
    while psutil.cpu_percent(interval=0.25) > busy * 100 and time.perf_counter() - t0 < longest:
        pass
    return time.perf_counter() - t0
