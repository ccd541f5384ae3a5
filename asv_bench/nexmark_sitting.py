"""The NEXMark figures in one sitting: each query on streamlb and on Spark Structured
Streaming, alternating (docs/benchmarks.md, ``benchmarks/nexmark.py``).

PySpark writes the log once (``--events``, default 2M, kept in the data directory); then, on
one cluster of 2 worker processes and one warm Spark session, for each query of
``--queries``:

1. one run of each system whose rows are gathered and checked against PySpark batch SQL
   (``streamlb.nexmark._truth``), exactly; it also warms both up;
2. ``--rounds`` rounds (default 3) of one timed streamlb run then one timed Spark SS run,
   each as ``benchmarks/nexmark.py`` times it (rows dropped or counted, not gathered), each
   once the machine is quiet (``benchmarks._common.quiet``: Spark's JVM goes on working for
   up to a second or two after its query returns, which slowed the streamlb run after it);
3. a table: each round's events/s of both, their ratio, streamlb's events/s per core,
   and the cores other processes used meanwhile (figures are only worth keeping when that
   is near 0).

Then a table of every query (medians over the rounds) beside the Flink suite's published
per-core figures, one JSON line with every figure, and a PNG bar chart (``--plot``). Exit
code 1 if an output of streamlb differs from PySpark's answer.

Run from the repository (the ``bench`` extra)::

    python asv_bench/nexmark_sitting.py --events 100000 --rounds 1    # a check that it works
    python asv_bench/nexmark_sitting.py                               # the figures
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

#: the Flink NEXMark suite's published events/s per core (nexmark/nexmark README, Flink 1.13)
FLINK_PER_CORE = {"q0": 155_000, "q3": 152_000, "q4": 34_000, "q5": 22_000, "q7": 12_000, "q8": 146_000,
                  "q11": 39_700, "q12": 75_700}
FLINK_NOTE = ("Flink: the nexmark suite's published events/s per core: throughput over the CPU its "
              "TaskManagers used, on 8-core nodes, events made by a generator inside the job (no files read)")


def _timed(run, *args) -> tuple[float, float]:
    """``(seconds, cores)``: what ``run(*args)`` returns, and the cores that processes other
    than this one and its children (the cluster, Spark's JVM) used while it ran."""
    from benchmarks._common import _cpu

    t0, (all0, mine0) = time.perf_counter(), _cpu()
    secs = run(*args)
    all1, mine1 = _cpu()
    return secs, max(0.0, (all1 - all0) - (mine1 - mine0)) / (time.perf_counter() - t0)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None else f"{a / b:.2f}"


def check(q: str, path: str, spark, client) -> dict:
    """One gathered run of each system against the exact answer: ``None`` where exact,
    else how it differs ("not run" for a query Spark SS cannot run)."""
    from benchmarks import nexmark as nx

    from streamlb.nexmark._check import differences, result
    from streamlb.nexmark._truth import truth

    want = truth(q, path, spark)
    out: list = []
    nx.streamlb_seconds(client, path, q, out)
    found = {"streamlb": differences(q, result(q, out), want), "spark": "not run"}
    if q not in nx.SPARK_CANNOT:
        out = []
        nx.spark_seconds(spark, path, q, out)
        found["spark"] = differences(q, nx.spark_result(q, out), want)
    return found


def sitting(events: int, queries: list[str], rounds: int) -> dict:
    from benchmarks import nexmark as nx
    from benchmarks._common import cluster, quiet

    from streamlb import datasets

    path = nx.dataset(events)
    spark = datasets.spark_session()
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")   # the checks' toPandas
    figures: dict = {}
    cl, client = cluster(nx.CORES)
    with cl, client:
        for i, q in enumerate(queries):
            nx._say(f"{q} ({i + 1}/{len(queries)}): checking both outputs against PySpark batch SQL")
            f = figures[q] = {"check": check(q, path, spark, client), "streamlb": [], "spark": [], "others": []}
            for system, diff in f["check"].items():
                nx._say(f"{q} {system}: {'exact' if diff is None else diff}")
            for r in range(rounds):
                quiet()                     # Spark's JVM works on after its query returns
                secs, others = _timed(nx.streamlb_seconds, client, path, q)
                f["streamlb"].append(events / secs)
                nx._say(f"{q} round {r + 1}/{rounds}: streamlb {events / secs:,.0f} events/s ({secs:.1f} s)")
                if q not in nx.SPARK_CANNOT:
                    quiet()
                    secs, spark_others = _timed(nx.spark_seconds, spark, path, q)
                    f["spark"].append(events / secs)
                    others = max(others, spark_others)
                    nx._say(f"{q} round {r + 1}/{rounds}: Spark SS {events / secs:,.0f} events/s ({secs:.1f} s)")
                f["others"].append(others)
            print(query_table(q, f, nx.CORES), flush=True)
    return figures


def query_table(q: str, f: dict, cores: int) -> str:
    spark = f["spark"] or [None] * len(f["streamlb"])
    lines = [f"\n{q}: streamlb {'exact' if f['check']['streamlb'] is None else 'DIFFERS'}; Spark SS "
             f"{'exact' if f['check']['spark'] is None else f['check']['spark'].splitlines()[0]}",
             "| round | streamlb events/s | Spark SS events/s | streamlb / Spark SS | streamlb events/s per core "
             "| Flink events/s per core | other processes' cores |",
             "|---|---|---|---|---|---|---|"]
    for r, (s, k, others) in enumerate(zip(f["streamlb"], spark, f["others"])):
        lines.append(f"| {r + 1} | {_fmt(s)} | {_fmt(k)} | {_ratio(s, k)} | {_fmt(s / cores)} | "
                     f"{_fmt(FLINK_PER_CORE.get(q))} | {others:.2f} |")
    return "\n".join(lines + [FLINK_NOTE + "."])


def medians(f: dict) -> tuple[float, float | None]:
    return statistics.median(f["streamlb"]), statistics.median(f["spark"]) if f["spark"] else None


def summary_table(figures: dict, cores: int) -> str:
    lines = ["| query | streamlb events/s | Spark SS events/s | streamlb / Spark SS | streamlb per core "
             "| Spark SS per core | Flink per core | streamlb = PySpark | Spark SS = PySpark |",
             "|---|---|---|---|---|---|---|---|---|"]
    for q, f in figures.items():
        s, k = medians(f)
        spark_check = f["check"]["spark"]
        lines.append(f"| {q} | {_fmt(s)} | {_fmt(k)} | {_ratio(s, k)} | {_fmt(s / cores)} | "
                     f"{_fmt(None if k is None else k / cores)} | {_fmt(FLINK_PER_CORE.get(q))} | "
                     f"{'exact' if f['check']['streamlb'] is None else 'DIFFERS'} | "
                     f"{'exact' if spark_check is None else spark_check.splitlines()[0]} |")
    return "\n".join(lines)


def plot(figures: dict, events: int, cores: int, path: str) -> None:
    """Bars per query: streamlb and Spark SS events/s (medians; n/a where Spark SS cannot
    run the query), Flink's per-core figure times ``cores``; log scale."""
    from streamlb._plot import colours, figure, save

    qs = list(figures)
    fig = figure(figsize=(max(6.0, 0.9 * len(qs) + 2), 4.0))
    ax = fig.add_subplot()
    c = colours()
    width = 0.27
    for j, (label, values) in enumerate([
            ("streamlb", [medians(figures[q])[0] for q in qs]),
            ("Spark Structured Streaming", [medians(figures[q])[1] for q in qs]),
            (f"Flink per core × {cores} (published, 8-core nodes, CPU time)",
             [FLINK_PER_CORE[q] * cores if q in FLINK_PER_CORE else None for q in qs])]):
        xs = [i + (j - 1) * width for i, v in enumerate(values) if v is not None]
        ax.bar(xs, [v for v in values if v is not None], width, label=label, color=c(j))
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 10)                  # room for the legend above the bars
    for i, q in enumerate(qs):
        if medians(figures[q])[1] is None:
            ax.text(i, low * 1.2, "n/a", ha="center", va="bottom", fontsize=7, color=c(1))
    ax.set_xticks(range(len(qs)), qs)
    ax.set_ylabel("events/s")
    ax.set_title(f"NEXMark, {events:,} events from Parquet, {cores} cores (median of rounds)", fontsize=9)
    ax.legend(fontsize=7, ncols=3, loc="upper center")
    fig.tight_layout()
    save(fig, path)


def main(argv=None) -> int:
    from benchmarks import nexmark as nx

    p = argparse.ArgumentParser(description="NEXMark on streamlb and Spark Structured Streaming in one sitting "
                                            "(docs/benchmarks.md).")
    p.add_argument("--events", type=int, default=2_000_000, help="events in the log (default 2,000,000)")
    p.add_argument("--rounds", type=int, default=3, help="timed runs of each system per query (default 3)")
    p.add_argument("--queries", default=",".join(nx.QUERIES),
                   help=f"comma-separated, among {','.join(nx.QUERIES)} (default: all)")
    p.add_argument("--plot", default=os.path.join(HERE, "..", "docs", "images", "nexmark.png"),
                   help="where the PNG goes (default docs/images/nexmark.png)")
    args = p.parse_args(argv)
    queries = args.queries.split(",")
    unknown = [q for q in queries if q not in nx.QUERIES]
    if unknown or args.rounds < 1 or args.events < 50:
        p.error(f"unknown queries {unknown}" if unknown else "--rounds must be >= 1 and --events >= 50")
    figures = sitting(args.events, queries, args.rounds)
    print(f"\nAll queries, {args.events:,} events, medians of {args.rounds} rounds; "
          f"per core: events/s / {nx.CORES}.")
    print(summary_table(figures, nx.CORES))
    print(FLINK_NOTE + ".")
    print("Spark SS cannot run: " + "; ".join(f"{q}: {why}" for q, why in nx.SPARK_CANNOT.items()))
    plot(figures, args.events, nx.CORES, os.path.abspath(args.plot))
    print(f"chart: {os.path.abspath(args.plot)}")
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(json.dumps({"commit": commit.stdout.strip(), "events": args.events, "rounds": args.rounds,
                      "figures": figures}))
    wrong = [q for q, f in figures.items() if f["check"]["streamlb"] is not None]
    if wrong:
        print(f"FAILED: streamlb's output differs from PySpark's answer for {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
