"""Partitioned input datasets prepared with PySpark (extra ``spark``).

Files are written as a keyed producer fills a partitioned log: each partition is ordered by
event time and all partitions cover the same time span. Every row is a deterministic function
of ``(seed, row id)``, so the same call gives the same files whatever Spark's task layout.
A ``_manifest.json`` beside the data lists every file with its row count.

The runtime never imports this module: datasets are just files.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable

import numpy as np
import pandas as pd

from .exceptions import JavaNotFoundError

__all__ = ["zipf", "nexmark", "spark_session", "check_java", "read_manifest"]

_BLOCK = 1 << 16                 # rows per RNG block: randomness depends on the row id only
_BASE_TIME = pd.Timestamp("2026-01-01T00:00:00")
_STEP_US = 1000                  # one record per millisecond of event time
_session = None


def check_java(min_version: int = 17) -> str:
    """Return the path of a usable ``java``.

    Parameters
    ----------
    min_version : int
        The oldest Java major version accepted (PySpark 4 needs 17).

    Returns
    -------
    str
        ``$JAVA_HOME/bin/java`` if ``JAVA_HOME`` is set, else the ``java`` on ``PATH``.

    Raises
    ------
    JavaNotFoundError
        If there is no ``java`` or it is older than ``min_version``, saying what to install.
    """
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.path.exists(java):
            raise JavaNotFoundError(
                f"JAVA_HOME is {home!r} but {java!r} does not exist; point JAVA_HOME at a Java "
                f"{min_version}+ installation (PySpark 4 needs it) or unset it"
            )
    else:
        java = shutil.which("java")
        if java is None:
            raise JavaNotFoundError(
                f"PySpark needs Java {min_version} or newer and no `java` is on PATH and JAVA_HOME "
                "is unset; install one (Debian: apt-get install openjdk-17-jre-headless)"
            )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m.group(2):
        major = int(m.group(2))
    if major < min_version:
        raise JavaNotFoundError(
            f"{java!r} is Java {major or 'of unknown version'}; PySpark needs Java {min_version}+"
        )
    return java


def spark_session(shuffle_partitions: int = 2):
    """One local Spark session per process, on loopback, with the settings that matter here.

    Parameters
    ----------
    shuffle_partitions : int
        ``spark.sql.shuffle.partitions`` (used only by the call that creates the session).

    Returns
    -------
    pyspark.sql.SparkSession

    Raises
    ------
    JavaNotFoundError
        If no usable Java runtime is found (see :func:`check_java`).
    """
    global _session
    if _session is not None:
        return _session
    check_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", __import__("sys").executable)
    from pyspark.sql import SparkSession

    tmp = tempfile.mkdtemp(prefix="streamlb-spark-")
    _session = (
        SparkSession.builder.master("local[2]").appName("streamlb-datasets")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", os.path.join(tmp, "local"))
        .config("spark.sql.warehouse.dir", os.path.join(tmp, "warehouse"))
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    _session.sparkContext.setLogLevel("ERROR")
    return _session


def _blocks(ids: np.ndarray, seed: int, salt: int, draw: Callable[[np.random.Generator, int], dict]):
    """Columns for ``ids`` where each 65536-row block has its own RNG stream."""
    out: dict[str, list] = {}
    for b in np.unique(ids // _BLOCK):
        sel = ids[(ids // _BLOCK) == b]
        cols = draw(np.random.default_rng([seed, salt, int(b)]), _BLOCK)
        for k, v in cols.items():
            out.setdefault(k, []).append(v[sel - b * _BLOCK])
    return {k: np.concatenate(v) for k, v in out.items()}


def _masked(values: np.ndarray, keep: np.ndarray):
    """Nullable Int64 with nulls where ``keep`` is False."""
    out = pd.array(values, dtype="Int64")
    out[~keep] = pd.NA
    return out


def _zipf_cdf(keys: int, skew: float) -> np.ndarray:
    w = np.arange(1, keys + 1, dtype=np.float64) ** -float(skew)
    cdf = np.cumsum(w)
    return cdf / cdf[-1]


def zipf_keys(ids: np.ndarray, keys: int, skew: float, drift_every: int | None, seed: int) -> np.ndarray:
    """The key of each row id: Zipf(skew) ranks mapped to key ids; hot set rotates with drift."""
    cdf = _zipf_cdf(keys, skew)
    ranks = _blocks(ids, seed, 1, lambda r, n: {"u": r.random(n)})["u"]
    ranks = np.minimum(np.searchsorted(cdf, ranks, side="right"), keys - 1)
    if drift_every:
        ranks = (ranks + (ids // drift_every) * (keys // 3 + 7)) % keys
    perm = np.random.default_rng([seed, 0]).permutation(keys)
    return perm[ranks].astype(np.int64)


def _check(path, rows, partitions) -> None:
    if not isinstance(rows, (int, np.integer)) or rows < 1:
        raise ValueError(f"rows must be a positive integer, got {rows!r}")
    if not isinstance(partitions, (int, np.integer)) or partitions < 1:
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")


class _Progress:
    """A tqdm bar over Spark tasks, fed by the status tracker from a thread."""

    def __init__(self, spark, desc: str, enabled: bool) -> None:
        self.spark, self.desc, self.enabled = spark, desc, enabled
        self._stop = threading.Event()

    def __enter__(self):
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(desc=self.desc, unit="task")
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()
        return self

    def _loop(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        done_before = 0
        while not self._stop.wait(0.2):
            infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            infos = [i for i in infos if i is not None]
            total = sum(i.numTasks for i in infos)
            done = sum(i.numCompletedTasks for i in infos)
            if total:
                self.bar.total = done_before + total
                self.bar.n = done_before + done
                self.bar.refresh()
            elif self.bar.total:
                done_before = self.bar.total

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._stop.set()
            self.thread.join()
            self.bar.n = self.bar.total or self.bar.n
            self.bar.close()


def _write(sdf, path: str, partitions: int, part_col: str, params: dict, progress: bool,
           order: tuple = ("event_time", "id")) -> dict:
    spark = sdf.sparkSession
    out = os.path.abspath(str(path))
    with _Progress(spark, f"writing {os.path.basename(out)}", progress):
        (sdf.repartition(partitions, part_col)
            .sortWithinPartitions(part_col, *order)
            .drop("id")
            .write.mode("overwrite").partitionBy(part_col).parquet(out))
    return _manifest(out, params)


def _manifest(out: str, params: dict) -> dict:
    import pyarrow.parquet as pq

    from .planner import parquet_files

    files = [{"path": os.path.relpath(f, out), "rows": pq.ParquetFile(f).metadata.num_rows}
             for f in parquet_files(out)]
    man = {"params": params, "rows": sum(f["rows"] for f in files), "files": files}
    with open(os.path.join(out, "_manifest.json"), "w") as fh:
        json.dump(man, fh, indent=1)
    return man


def read_manifest(path: str) -> dict:
    """The ``_manifest.json`` of a prepared dataset.

    Parameters
    ----------
    path : str
        The dataset's directory, as given to :func:`zipf` or :func:`nexmark`.

    Returns
    -------
    dict
        ``params`` (the arguments it was written with), ``rows`` (total) and ``files``
        (each file's ``path``, relative to ``path``, and ``rows``).
    """
    with open(os.path.join(path, "_manifest.json")) as fh:
        return json.load(fh)


def zipf(path, rows: int, keys: int, skew: float, partitions: int, drift_every: int | None = None,
         seed: int = 0, progress: bool = False, disorder: float = 0.0, late_fraction: float = 0.1) -> dict:
    """Write ``rows`` rows of Zipf-distributed keys as partitioned Parquet.

    Columns: ``key`` int64, ``value`` float64 (integers 0..999, so sums are exact),
    ``event_time`` timestamp (one row per millisecond from 2026-01-01, by row id).

    Parameters
    ----------
    path : str
        Output directory (replaced if it exists).
    rows, keys : int
        Rows to write; distinct keys (ids ``0..keys-1``).
    skew : float
        Zipf exponent s: P(rank r) ∝ r**-s over ``keys`` ranks (s=0 is uniform).
    partitions : int
        Log partitions, one directory ``part=<i>`` each, by ``key % partitions``.
    drift_every : int, optional
        Rotate the set of hot keys every this many records (by row order, i.e. event time).
    seed : int
        Same seed, same files.
    progress : bool
        Show a progress bar of Spark tasks.
    disorder : float
        Seconds. 0 (default): every file is in event-time order. Else the log arrives out
        of order the way NEXMark's does: a record's arrival time is one millisecond per
        row id, and ``late_fraction`` of the records carry an event time earlier than that
        by up to ``disorder`` seconds (uniform, in microseconds). Each file keeps arrival
        (row id) order, so a watermark ``delay`` of ``disorder`` seconds makes no record late.
    late_fraction : float
        With ``disorder``: the share of records delayed (default 0.1).

    Returns
    -------
    dict
        The manifest: parameters, total rows and rows per file.

    See Also
    --------
    read_manifest, nexmark
    """
    _check(path, rows, partitions)
    if not isinstance(keys, (int, np.integer)) or keys < 1:
        raise ValueError(f"keys must be a positive integer, got {keys!r}")
    if skew < 0:
        raise ValueError(f"skew must be >= 0, got {skew!r}")
    if drift_every is not None and drift_every < 1:
        raise ValueError(f"drift_every must be a positive integer or None, got {drift_every!r}")
    if not (disorder >= 0 and 0 <= late_fraction <= 1):
        raise ValueError(f"disorder must be >= 0 seconds and late_fraction in [0, 1], got {disorder!r}, "
                         f"{late_fraction!r}")
    spark = spark_session()
    k, s, d, sd, P = int(keys), float(skew), drift_every, int(seed), int(partitions)
    dis_us, frac = int(round(float(disorder) * 1e6)), float(late_fraction)

    def gen(batches):
        for pdf in batches:
            ids = pdf["id"].to_numpy()
            key = zipf_keys(ids, k, s, d, sd)
            value = _blocks(ids, sd, 2, lambda r, n: {"v": r.integers(0, 1000, n).astype(np.float64)})["v"]
            us = ids * _STEP_US
            if dis_us:
                lag = _blocks(ids, sd, 3, lambda r, n: {"late": r.random(n) < frac, "d": r.integers(0, dis_us + 1, n)})
                us = us - np.where(lag["late"], lag["d"], 0)
            yield pd.DataFrame({
                "id": ids, "key": key, "value": value,
                "event_time": _BASE_TIME + pd.to_timedelta(us, unit="us"),
                "part": key % P,
            })

    schema = "id long, key long, value double, event_time timestamp_ntz, part long"
    n_tasks = max(2, min(P, 16), int(rows) // 2_000_000)
    sdf = spark.range(0, int(rows), 1, n_tasks).mapInPandas(gen, schema)
    params = {"kind": "zipf", "rows": int(rows), "keys": k, "skew": s, "partitions": P,
              "drift_every": d, "seed": sd}
    if dis_us:
        params.update(disorder=float(disorder), late_fraction=frac)
    return _write(sdf, path, P, "part", params, progress, order=("id",) if dis_us else ("event_time", "id"))


def _nexmark_frame(ids: np.ndarray, seed: int, partitions: int, ha: int, hb: int, hs: int) -> pd.DataFrame:
    """The NEXMark events of event ids ``ids`` (see :func:`nexmark`; ``ha``, ``hb``, ``hs``:
    its hot auction, bidder and seller ratios)."""
    r = _blocks(ids, seed, 3, lambda g, n: {
        "u1": g.random(n), "u2": g.random(n), "u3": g.random(n), "u4": g.random(n),
        "price": np.round(np.exp(g.normal(5.0, 1.0, n)), 2), "cat": g.integers(0, 10, n),
    })
    pos = ids % 50
    epoch = ids // 50
    persons = epoch + 1                      # persons seen so far (at least one)
    auctions = epoch * 3 + np.clip(pos, 0, 3)
    auctions = np.maximum(auctions, 1)
    kind = np.where(pos == 0, "person", np.where(pos <= 3, "auction", "bid"))
    hot_person = lambda u, ratio, hot: np.where(  # noqa: E731
        u < 1 - 1 / ratio, np.maximum(persons - 1 - (hot % 10), 0), (r["u4"] * persons).astype(np.int64))
    seller = hot_person(r["u1"], hs, (r["u2"] * 10).astype(np.int64))
    bidder = hot_person(r["u2"], hb, (r["u3"] * 10).astype(np.int64))
    hot_auction = np.maximum(auctions - 1 - (r["u4"] * 5).astype(np.int64), 0)
    auction = np.where(r["u3"] < 1 - 1 / ha, hot_auction, (r["u1"] * auctions).astype(np.int64))
    is_p, is_a, is_b = kind == "person", kind == "auction", kind == "bid"
    own_auction = epoch * 3 + pos - 1
    return pd.DataFrame({
        "id": ids,
        "event_type": kind,
        "person_id": _masked(np.where(is_p, epoch, 0), is_p),
        "auction_id": _masked(np.where(is_a, own_auction, auction), is_a | is_b),
        "seller": _masked(seller, is_a),
        "bidder": _masked(bidder, is_b),
        "price": np.where(is_b, r["price"], np.nan),
        "category": _masked(r["cat"], is_a),
        "event_time": _BASE_TIME + pd.to_timedelta(ids * _STEP_US, unit="us"),
        "part": ids % partitions,
    })


def nexmark(path, events: int, partitions: int = 4, seed: int = 0, hot_auction_ratio: int = 2,
            hot_bidder_ratio: int = 4, hot_seller_ratio: int = 4, progress: bool = False) -> dict:
    """Write ``events`` NEXMark-style events (person : auction : bid = 1 : 3 : 46).

    One flat table: ``event_type`` (person, auction or bid), ``person_id`` (persons),
    ``auction_id`` (auctions and bids), ``seller`` (auctions), ``bidder`` and ``price``
    (bids), ``category`` (auctions), ``event_time``. Hot ratios as in NEXMark: a bid goes to
    one of the few hottest auctions with probability 1 - 1/hot_auction_ratio, and likewise
    bidders and sellers. Partitioned round-robin by event id (``id % partitions``).

    Parameters
    ----------
    path : str
        Output directory (replaced if it exists).
    events : int
        Events to write.
    partitions : int
        Log partitions, one directory ``part=<i>`` each.
    seed : int
        Same seed, same files.
    hot_auction_ratio, hot_bidder_ratio, hot_seller_ratio : int
        A bid goes to a hot auction, a bid comes from a hot bidder, an auction from a hot
        seller, with probability ``1 - 1/ratio``.
    progress : bool
        Show a progress bar of Spark tasks.

    Returns
    -------
    dict
        The manifest: parameters, total rows and rows per file.
    """
    _check(path, events, partitions)
    for name, r in (("hot_auction_ratio", hot_auction_ratio), ("hot_bidder_ratio", hot_bidder_ratio),
                    ("hot_seller_ratio", hot_seller_ratio)):
        if not isinstance(r, int) or r < 1:
            raise ValueError(f"{name} must be a positive integer, got {r!r}")
    spark = spark_session()
    sd, P = int(seed), int(partitions)
    ha, hb, hs = hot_auction_ratio, hot_bidder_ratio, hot_seller_ratio

    def gen(batches):
        for pdf in batches:
            yield _nexmark_frame(pdf["id"].to_numpy(), sd, P, ha, hb, hs)

    schema = ("id long, event_type string, person_id long, auction_id long, seller long, "
              "bidder long, price double, category long, event_time timestamp_ntz, part long")
    n_tasks = max(2, min(P, 16), int(events) // 2_000_000)
    sdf = spark.range(0, int(events), 1, n_tasks).mapInPandas(gen, schema)
    params = {"kind": "nexmark", "events": int(events), "partitions": P, "seed": sd,
              "hot_auction_ratio": ha, "hot_bidder_ratio": hb, "hot_seller_ratio": hs}
    return _write(sdf, path, P, "part", params, progress)
