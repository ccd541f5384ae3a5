"""One NEXMark query run again and again on one cluster: a job's time once warm, and how
long warming up takes (docs/benchmark-log.md, session 26).

``python asv_bench/nexmark_repeat.py QUERY [--runs N] [--events E] [--spark]`` prepares the
log (PySpark, once, as ``benchmarks/nexmark.py``), starts one cluster of 2 worker
processes, and times ``--runs`` streamlb jobs of QUERY at the defaults, each as the asv
suite times it (rows dropped on the workers). Each run's seconds are printed as it ends,
then their median and minimum. With ``--spark``, a Spark Structured Streaming run of the
same query goes before each streamlb run, and its seconds are printed beside it (Spark's
own warm-up, and whether a Spark run slows the streamlb run after it). With ``--cpu``, the
CPU seconds per job of each worker process and of this process (the driver, and the
scheduler of the in-process ``LocalCluster``) over the runs after the first, from
``resource.getrusage``.

Settings come from the environment as usual, so an A/B of one setting alternates two
invocations, e.g. ``DASK_STREAMLB__DIRECT_CALLS=false`` and ``=true``.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None) -> int:
    from benchmarks import nexmark as nx
    from benchmarks._common import cluster, quiet

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("query", choices=sorted(nx.QUERIES))
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--spark", action="store_true", help="a Spark SS run before each streamlb run")
    ap.add_argument("--cpu", action="store_true", help="CPU per job of each worker and of the driver")
    ap.add_argument("--quiet", action="store_true",
                    help="with --spark: wait for the machine to be quiet after each Spark run")
    args = ap.parse_args(argv)
    path = nx.dataset(args.events)
    spark = None
    if args.spark:
        from streamlb import datasets

        spark = datasets.spark_session()
    times = []
    cl, client = cluster(nx.CORES)
    with cl, client:
        cpu0 = None
        for r in range(args.runs):
            if r == 1 and args.cpu:     # the first job warms the cluster up
                cpu0 = (client.run(_cpu_seconds), _cpu_seconds())
            before = ""
            if spark is not None:
                before = f"Spark SS {nx.spark_seconds(spark, path, args.query):.3f} s, then "
                if args.quiet:
                    before += f"{quiet():.1f} s for the machine to quieten, then "
            times.append(nx.streamlb_seconds(client, path, args.query))
            print(f"run {r + 1}/{args.runs}: {before}streamlb {times[-1]:.3f} s", flush=True)
        if cpu0 is not None:
            jobs, workers = args.runs - 1, client.run(_cpu_seconds)
            per = [f"{(workers[w] - cpu0[0][w]) / jobs * 1e3:.0f}" for w in sorted(workers)]
            print(f"CPU per job: workers {', '.join(per)} ms; driver and scheduler "
                  f"{(_cpu_seconds() - cpu0[1]) / jobs * 1e3:.0f} ms (a Spark run, if any, is in neither)", flush=True)
    print(f"{args.query} at {args.events:,} events: median {statistics.median(times):.3f} s, "
          f"min {min(times):.3f} s over {len(times)} runs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
