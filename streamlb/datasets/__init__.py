"""Partitioned input datasets prepared with PySpark (extra ``spark``).

Files are written as a producer fills a partitioned log: all partitions cover the same time
span, each in event-time order unless the dataset is out of order on purpose, when it is in
arrival order. Every row is a deterministic function of ``(seed, row id)``, so the same call
gives the same files whatever Spark's task layout.
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

import numpy as np
import pandas as pd

from ._parquet_out import _BASE_TIME, _STEP_US, _write
from ._zipf import _blocks, zipf_keys
from .._time import duration_s
from ..exceptions import JavaNotFoundError

__all__ = ["zipf", "nexmark", "spark_session", "check_java", "read_manifest"]

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


def _check(path, rows, partitions, what: str = "rows") -> None:
    _positive_int(what, rows)
    _positive_int("partitions", partitions)


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


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
    disorder : float, str or timedelta
        A duration (a number is seconds: docs/configuration.md). 0 (default): every file
        is in event-time order. Else the log arrives out of order the way NEXMark's does: a
        record's arrival time is one millisecond per row id, and ``late_fraction`` of the
        records carry an event time earlier than that by up to ``disorder`` seconds
        (uniform, in microseconds). Each file keeps arrival (row id) order, so a watermark
        ``delay`` of ``disorder`` seconds makes no record late.
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
    disorder = duration_s(disorder, "zipf: disorder")
    if not 0 <= late_fraction <= 1:
        raise ValueError(f"late_fraction must be in [0, 1], got {late_fraction!r}")
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


def _check_nexmark(ha, hb, hs, in_flight_auctions, rate, disorder, late_fraction) -> None:
    for name, r in (("hot_auction_ratio", ha), ("hot_bidder_ratio", hb), ("hot_seller_ratio", hs),
                    ("in_flight_auctions", in_flight_auctions)):
        _positive_int(name, r)
    if not (isinstance(rate, (int, float, np.number)) and 0 < rate < float("inf")):
        raise ValueError(f"rate must be a positive number of events per second, got {rate!r}")
    if not (0 <= late_fraction <= 1):
        raise ValueError(f"late_fraction must be in [0, 1], got {late_fraction!r}")


def nexmark(path, events: int, partitions: int = 4, seed: int = 0, hot_auction_ratio: int = 2,
            hot_bidder_ratio: int = 4, hot_seller_ratio: int = 4, progress: bool = False, *,
            rate: float = 10_000, in_flight_auctions: int = 100, disorder: float = 3.0,
            late_fraction: float = 0.1, flat: bool = False) -> dict:
    """Write ``events`` NEXMark events as three tables: ``person``, ``auction`` and ``bid``.

    Events are numbered ``0..events-1`` in cycles of 50: one person, then three auctions,
    then 46 bids (the standard mix 1:3:46). Event ``i`` happens ``i / rate`` seconds after
    2026-01-01; ``late_fraction`` of the events arrive late, their ``date_time`` moved back
    by up to ``disorder`` seconds. Each table is a directory ``path/<table>`` with one
    directory ``part=<i>`` per partition, rows dealt round-robin by row number
    (``row % partitions``) and written in generation order, so files are out of
    event-time order as a real log is.

    - ``person``: id, name, email_address, credit_card, city, state, date_time;
    - ``auction``: id, item_name, description, initial_bid, reserve, date_time, expires,
      seller, category (10..14);
    - ``bid``: auction, bidder, price (cents), channel, url, date_time.

    Person and auction ids count from 0 in generation order. An auction's seller is the
    newest person with probability ``1 - 1/hot_seller_ratio``, else any person so far; a
    bid's auction is the newest auction with probability ``1 - 1/hot_auction_ratio``, else
    one of the last ``in_flight_auctions``; its bidder is the newest person with probability
    ``1 - 1/hot_bidder_ratio``, else any person so far. An auction expires after
    ``uniform(0.5, 1.5) * in_flight_auctions * 50/3 / rate`` seconds, so about
    ``in_flight_auctions`` are open at a time.

    Parameters
    ----------
    path : str
        Output directory (replaced if it exists).
    events : int
        Events to write.
    partitions : int
        Log partitions: files per table.
    seed : int
        Same seed, same files.
    hot_auction_ratio, hot_bidder_ratio, hot_seller_ratio : int
        A bid goes to the hot auction, comes from the hot bidder, an auction from the hot
        seller, with probability ``1 - 1/ratio``.
    progress : bool
        Show a progress bar of Spark tasks.
    rate : float
        Events per second of event time.
    in_flight_auctions : int
        Auctions open at a time, and those a bid that is not hot picks from.
    disorder : float, str or timedelta
        A duration (a number is seconds): the most a late event's ``date_time`` is moved
        back (0: none is).
    late_fraction : float
        The share of events that arrive late, in [0, 1].
    flat : bool
        Write instead the older single table (``event_type``, ``person_id``, ``auction_id``,
        ``seller``, ``bidder``, ``price``, ``category``, ``event_time``, one event per
        millisecond, in event-time order); ``rate``, ``in_flight_auctions``, ``disorder`` and
        ``late_fraction`` do not apply to it.

    Returns
    -------
    dict
        The manifest: parameters, total ``rows``, every file (``files``) and, unless
        ``flat``, ``tables``: each table's ``rows`` and ``files`` (relative to its directory).

    See Also
    --------
    read_manifest, zipf
    """
    _check(path, events, partitions, "events")
    disorder = duration_s(disorder, "nexmark: disorder")
    _check_nexmark(hot_auction_ratio, hot_bidder_ratio, hot_seller_ratio, in_flight_auctions, rate, disorder,
                   late_fraction)
    from . import _nexmark as _nexmark_data

    spark = spark_session()
    if flat:
        return _nexmark_data.write_flat(spark, path, int(events), int(partitions), int(seed), hot_auction_ratio,
                                        hot_bidder_ratio, hot_seller_ratio, progress)
    return _nexmark_data.write_tables(spark, path, int(events), int(partitions), int(seed), int(hot_auction_ratio),
                                      int(hot_bidder_ratio), int(hot_seller_ratio), float(rate),
                                      int(in_flight_auctions), float(disorder), float(late_fraction), progress)


def _nexmark_frame(ids: np.ndarray, seed: int, partitions: int, ha: int, hb: int, hs: int) -> pd.DataFrame:
    """The flat table's events of ids ``ids`` (see :mod:`streamlb.datasets._nexmark`)."""
    from ._nexmark import nexmark_frame

    return nexmark_frame(ids, seed, partitions, ha, hb, hs)
