"""``streamlb nexmark QUERY``: one NEXMark query on an embedded Dask cluster, its
throughput and latency, and its output checked exactly against PySpark.

The tables are prepared with PySpark once per (events, seed) in a cache directory and
reused while their manifest matches. :func:`prepared` and :func:`build` are what
``asv_bench/nexmark_megaphone.py`` runs the queries with too.
"""
from __future__ import annotations

import argparse
import os
import sys

__all__ = ["add_parser", "default_data", "prepared", "tables_of", "build"]

TABLES = ("person", "auction", "bid")
#: files per table: a source instance each on up to four workers
PARTITIONS = 4


def default_data() -> str:
    """Where prepared tables are kept by default: ``streamlb/nexmark`` under the user's cache
    (``$XDG_CACHE_HOME``, else ``~/.cache``), or ``./nexmark-data`` without a home."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if base.startswith("~"):
        return os.path.abspath("nexmark-data")
    return os.path.join(base, "streamlb", "nexmark")


def prepared(root: str, events: int, seed: int) -> tuple[str, dict]:
    """``(path, manifest)`` of ``events`` NEXMark events written with ``seed`` under ``root``:
    the tables already there if their manifest says so, else written now with PySpark."""
    from .. import datasets

    path = os.path.join(os.path.abspath(root), f"events-{events}-seed-{seed}")
    try:
        man = datasets.read_manifest(path)
    except (OSError, ValueError):
        man = {}
    params = man.get("params", {})
    if (params.get("kind"), params.get("events"), params.get("seed")) == ("nexmark", events, seed) \
            and set(man.get("tables", {})) == set(TABLES):
        print(f"reusing {events:,} NEXMark events (seed {seed}) in {path}")
        return path, man
    print(f"preparing {events:,} NEXMark events (seed {seed}) with PySpark in {path} ...", flush=True)
    return path, datasets.nexmark(path, events=events, partitions=PARTITIONS, seed=seed, progress=True)


def tables_of(query: str) -> list[str]:
    """The tables ``query`` reads (its graph built once on throwaway nodes).

    >>> tables_of("q3"), tables_of("q5")
    (['person', 'auction'], ['bid'])
    """
    from streamz import Stream

    from ..nexmark import QUERIES

    probe = [Stream() for _ in TABLES]
    QUERIES[query](*probe)
    return [t for t, node in zip(TABLES, probe) if node.downstreams]


def build(query: str, path: str, manifest: dict, rate: float | None = None, batch_size: int | None = None):
    """``(node, out)``: ``query`` over the tables at ``path``, a node of its graph to run and
    the list its output frames are appended to.

    ``rate`` (events/s) and ``batch_size`` (events) are the log's, as NEXMark counts events
    (every event of the three tables): each table the query reads is read at the share of
    the events it holds, so that every query goes through event time at the same pace and
    its sources together. None: as fast as the job takes data, and the setting's batch size.
    """
    from streamz import Stream

    from ..nexmark import QUERIES

    rows = {t: manifest["tables"][t]["rows"] for t in TABLES}
    events = sum(rows.values())
    nodes = {t: Stream() for t in TABLES}           # a table the query ignores: never read
    for t in tables_of(query):
        share = rows[t] / events
        nodes[t] = Stream.from_parquet(os.path.join(path, t), rate=rate * share if rate else None,
                                       batch_size=max(1, round(batch_size * share)) if batch_size else None)
    out: list = []
    QUERIES[query](*(nodes[t] for t in TABLES)).sink(out.append)
    return next(n for n in nodes.values() if n.downstreams), out


def _operators(plan) -> list[str]:
    """The operators after an exchange, in plan order (the sources measure no latency)."""
    return [st.name for st in plan.stages if not st.is_source]


def _throughput(events: int, summary: dict, query: str, workers: int) -> str:
    """The line on throughput: the log's ``events`` (as NEXMark counts them, whatever the
    query reads) over the job's seconds (``summary`` of :meth:`streamlb.Job.summary`), in
    all and per core (worker threads, at most the machine's cores)."""
    cores = min(workers, os.cpu_count() or 1)
    rate = events / summary["seconds"]
    return (f"throughput: {events:,} events in {summary['seconds']:.2f} s = {rate:,.0f} events/s, "
            f"{rate / cores:,.0f} events/s per core ({cores} cores; {summary['records']:,} rows read from "
            f"{', '.join(tables_of(query))})")


def _nexmark(args) -> int:
    import streamlb

    from ._args import _latencies
    from ..nexmark._check import differences, result
    from ..nexmark._truth import truth

    path, man = prepared(args.data or default_data(), args.events, args.seed)
    node, out = build(args.query, path, man, rate=args.rate, batch_size=args.batch_size)
    pace = f"replayed open loop at {args.rate:,.0f} events/s" if args.rate else "read as fast as it goes"
    with streamlb.run(node, n_workers=args.workers, balancer=args.balancer) as job:
        print(f"\n[{args.query}] {', '.join(f'{st.name} x{st.parallelism}' for st in job.plan.stages)} on an "
              f"embedded Dask cluster of {args.workers} worker processes; the log of {man['rows']:,} events "
              f"{pace} ...", flush=True)
        job.wait(progress=True)
        summary, metrics, operators = job.summary(), job.metrics(), _operators(job.plan)
    print(_throughput(man["rows"], summary, args.query, args.workers))
    if operators:
        print("latency (ms), from each record's source emit to its apply:")
        for op in operators:
            ops = metrics[metrics.operator == op]
            lat = _latencies(ops)
            print(f"  {op:<14} p50 {lat['p50']:9.1f}  p99 {lat['p99']:9.1f}  max {lat['max']:9.1f}  "
                  f"({int(ops.records.sum()):,} records)")
    else:
        print("latency: not measured (the query runs inside its sources: no operator after an exchange)")
    print("checking the output against PySpark batch SQL over the same tables ...", flush=True)
    got = result(args.query, out)
    diff = differences(args.query, got, truth(args.query, path))
    if diff is None:
        print(f"output: {len(got):,} rows, exact against PySpark")
        return 0
    print(f"output DIFFERS from PySpark: {diff}")
    print(f"FAILED: {args.query}'s output differs from PySpark's answer", file=sys.stderr)
    return 1


def _positive(cast):
    """An argparse type: a number of type ``cast`` above 0."""
    def check(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a {'whole ' if cast is int else ''}number above 0, "
                                             f"got {text!r}")
        return value

    return check


def add_parser(sub) -> None:
    """``streamlb nexmark`` on the CLI's subparsers ``sub``."""
    from ._args import _balancer, _command
    from ..nexmark import QUERIES

    n = _command(sub, "nexmark", "run one NEXMark query on an embedded Dask cluster: throughput, latency, "
                                 "and its output checked exactly against PySpark")
    n.add_argument("query", choices=list(QUERIES), metavar="QUERY",
                   help=f"one of {', '.join(QUERIES)}")
    n.add_argument("--events", type=_positive(int), default=1_000_000, help="NEXMark events (default 1,000,000)")
    n.add_argument("--rate", type=_positive(float), default=None,
                   help="replay the log open loop at this many events/s, each table the query reads at its "
                        "share of the events (default: as fast as it goes)")
    n.add_argument("--balancer", default=None, type=_balancer,
                   help="a registered balancer to run with (default none: the initial routing throughout)")
    n.add_argument("--workers", type=_positive(int), default=2, help="worker processes (default 2)")
    n.add_argument("--data", default=None, help=f"where prepared tables are kept (default {default_data()})")
    n.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    n.add_argument("--batch-size", type=_positive(int), default=None,
                   help="events of the log per source batch, shared as --rate (default: streamlb's)")
    n.set_defaults(func=_nexmark)
