"""Command line: ``streamlb prepare zipf|nexmark ...`` and ``streamlb demo``."""
from __future__ import annotations

import argparse
import os
import sys
import warnings


def _prepare(args) -> int:
    from . import datasets

    if args.kind == "zipf":
        man = datasets.zipf(args.path, rows=args.rows, keys=args.keys, skew=args.skew,
                            partitions=args.partitions, drift_every=args.drift_every,
                            seed=args.seed, progress=True)
    else:
        man = datasets.nexmark(args.path, events=args.rows, partitions=args.partitions,
                               seed=args.seed, progress=True)
    print(f"wrote {man['rows']:,} rows in {len(man['files'])} files to {args.path}")
    return 0


def _demo(args) -> int:
    import numpy as np
    import pandas as pd
    from streamz import Stream

    import streamlb

    from . import datasets

    path = args.data
    if not os.path.exists(os.path.join(path, "_manifest.json")):
        print(f"preparing a drifting-Zipf dataset in {path} with PySpark ...")
        datasets.zipf(path, rows=args.rows, keys=args.keys, skew=args.skew, partitions=8,
                      drift_every=max(args.rows // 5, 1), seed=0, progress=True)
    man = datasets.read_manifest(path)
    print(f"input: {man['rows']:,} rows, {len(man['files'])} files, "
          f"Zipf s={man['params'].get('skew')} over {man['params'].get('keys'):,} keys")

    src = Stream.from_parquet(path, rate=args.rate, batch_size=args.batch_size)
    src.key_by("key").aggregate(
        {"count": ("value", "count"), "sum": ("value", "sum"), "max": ("value", "max")},
        name="totals", parallelism=args.parallelism,
    )
    with streamlb.run(src, n_workers=args.workers) as job:
        print(f"running on an embedded Dask cluster with {len(job.client.scheduler_info()['workers'])} "
              "worker processes ...")
        job.wait(progress=True)
        summary = job.summary()
        state = job.state("totals")
        m = job.metrics()
    ops = m[m.operator == "totals"]
    print(f"\nthroughput: {summary['records_per_second'] / 1e6:.2f} M records/s "
          f"({summary['records']:,} records in {summary['seconds']:.2f} s)")
    print("latency (ms, per load window, over all instances): "
          f"p50 {ops.latency_p50_ms.median():.1f}  p99 {ops.latency_p99_ms.max():.1f}  "
          f"max {ops.latency_max_ms.max():.1f}")
    load = ops.groupby("instance").agg(records=("records", "sum"), busy_s=("busy_seconds", "sum"))
    load["share"] = load.records / load.records.sum()
    print("per-instance load:")
    print(load.to_string(float_format=lambda v: f"{v:.3f}"))
    imb = load.records.max() / load.records.mean()
    print(f"imbalance (max/mean records): {imb:.2f}")

    truth = pd.read_parquet(path, columns=["key", "value"]).groupby("key").agg(
        count=("value", "count"), sum=("value", "sum"), max=("value", "max"))
    same = (state.index.equals(truth.index)
            and np.array_equal(state["count"].to_numpy(), truth["count"].to_numpy())
            and np.allclose(state["sum"].to_numpy(), truth["sum"].to_numpy(), rtol=1e-12, atol=0)
            and np.array_equal(state["max"].to_numpy(), truth["max"].to_numpy()))
    if not same:
        print("FAILED: the final state differs from pandas over the same files", file=sys.stderr)
        return 1
    print(f"check: final state of {len(state):,} keys equals pandas over the same files")
    return 0


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")
    p = argparse.ArgumentParser(prog="streamlb", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("prepare", help="write a partitioned Parquet dataset with PySpark")
    pr.add_argument("kind", choices=["zipf", "nexmark"])
    pr.add_argument("path")
    pr.add_argument("--rows", type=int, default=1_000_000, help="rows (zipf) or events (nexmark)")
    pr.add_argument("--keys", type=int, default=100_000)
    pr.add_argument("--skew", type=float, default=1.2)
    pr.add_argument("--partitions", type=int, default=8)
    pr.add_argument("--drift-every", type=int, default=None)
    pr.add_argument("--seed", type=int, default=0)
    pr.set_defaults(func=_prepare)

    d = sub.add_parser("demo", help="keyed aggregation over drifting Zipf data, checked against pandas")
    d.add_argument("--data", default="streamlb-data/demo-zipf")
    d.add_argument("--rows", type=int, default=2_000_000)
    d.add_argument("--keys", type=int, default=100_000)
    d.add_argument("--skew", type=float, default=1.2)
    d.add_argument("--workers", type=int, default=2)
    d.add_argument("--parallelism", type=int, default=None)
    d.add_argument("--batch-size", type=int, default=None)
    d.add_argument("--rate", type=float, default=None, help="open-loop source rate, records/s")
    d.set_defaults(func=_demo)

    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
