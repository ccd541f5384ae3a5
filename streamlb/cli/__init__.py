"""Command line: ``streamlb prepare zipf|nexmark ...``, ``streamlb demo``, ``streamlb simulate`` and
``streamlb nexmark QUERY`` (in ``_cli_nexmark``)."""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import warnings

from ._args import _balancer, _command, _instances, _latencies


def _prepare(args) -> int:
    from .. import datasets

    if args.kind == "zipf":
        man = datasets.zipf(args.path, rows=args.rows, keys=args.keys, skew=args.skew,
                            partitions=args.partitions, drift_every=args.drift_every,
                            seed=args.seed, progress=True)
    else:
        man = datasets.nexmark(args.path, events=args.rows, partitions=args.partitions,
                               seed=args.seed, progress=True, rate=args.rate, flat=args.flat)
    tables = ", ".join(f"{t} {e['rows']:,}" for t, e in man.get("tables", {}).items())
    print(f"wrote {man['rows']:,} rows in {len(man['files'])} files to {args.path}"
          + (f" ({tables})" if tables else ""))
    return 0


DEMO_SPEC = {"count": ("value", "count"), "sum": ("value", "sum"), "max": ("value", "max")}


def _demo_input(args):
    """The demo's dataset (prepared with PySpark if absent) and its pandas ground truth."""
    import pandas as pd

    from .. import datasets

    path = args.data
    if not os.path.exists(os.path.join(path, "_manifest.json")):
        print(f"preparing a drifting-Zipf dataset in {path} with PySpark ...")
        # one file per source instance of the default two workers: each is read in order,
        # so the hot keys drift in stream order
        datasets.zipf(path, rows=args.rows, keys=args.keys, skew=args.skew, partitions=2,
                      drift_every=max(args.rows // 5, 1), seed=0, progress=True)
    man = datasets.read_manifest(path)
    p = man["params"]
    print(f"input: {man['rows']:,} rows, {len(man['files'])} files, Zipf s={p.get('skew')} over "
          f"{p.get('keys'):,} keys, hot keys rotating every {p.get('drift_every') or 0:,} records")
    truth = pd.read_parquet(path, columns=["key", "value"]).groupby("key").agg(**DEMO_SPEC)
    return path, man, truth


def _exact(state, truth) -> bool:
    """Whether the demo's final state equals pandas' (sums to within float rounding)."""
    import numpy as np

    return (state.index.equals(truth.index)
            and np.array_equal(state["count"].to_numpy(), truth["count"].to_numpy())
            and np.allclose(state["sum"].to_numpy(), truth["sum"].to_numpy(), rtol=1e-12, atol=0)
            and np.array_equal(state["max"].to_numpy(), truth["max"].to_numpy()))


def _demo(args) -> int:
    import pandas as pd
    from streamz import Stream

    import streamlb
    from .._placement import cluster_workers

    if args.rescale:
        return _demo_rescale(args)
    path, _, truth = _demo_input(args)
    spec = DEMO_SPEC
    rate = args.rate or 200_000

    results, ok = {}, True
    for balancer in args.balancers:
        # every setting at its default unless an option says otherwise
        src = Stream.from_parquet(path, rate=rate, batch_size=args.batch_size)
        src.key_by("key").aggregate(spec, name="totals", parallelism=args.parallelism)
        with streamlb.run(src, n_workers=args.workers, window=args.window, balancer=balancer,
                          migration=args.migration) as job:
            print(f"\n[{balancer}] {args.parallelism} instances on an embedded Dask cluster of "
                  f"{len(cluster_workers(job.client))} worker processes, "
                  f"open-loop source at {rate:,.0f} records/s ...")
            job.wait(progress=True)
            summary, state, m, moves = job.summary(), job.state("totals"), job.metrics(), job.history
            imbalance = job.imbalance("totals")
        same = _exact(state, truth)
        ok &= same
        ops = m[m.operator == "totals"]
        lat = _latencies(ops)
        per_window = ops.pivot_table(index="window_start", columns="instance", values="records", aggfunc="sum")
        full = imbalance[imbalance["records"] > 0.5 * imbalance["records"].median()]
        results[balancer] = {
            "imbalance (median)": full["applied"].median(), "imbalance (p90)": full["applied"].quantile(0.9),
            "routed imbalance (median)": full["routed"].median(),
            "throughput (M rec/s)": summary["records_per_second"] / 1e6,
            "p99 latency (ms)": lat["p99"], "max latency (ms)": lat["max"],
            "moves (epochs)": len(moves),
            "key groups moved": sum(len(mv["key_groups"]) for mv in moves),
            "state exact": "yes" if same else "NO",
            "_load": per_window, "_moves": moves,
        }
        print(f"[{balancer}] final state of {len(state):,} keys "
              f"{'equals' if same else 'DIFFERS FROM'} pandas over the same files")

    table = pd.DataFrame({b: {k: v for k, v in r.items() if not k.startswith("_")} for b, r in results.items()})
    print("\n" + table.to_string(float_format=lambda v: f"{v:.2f}"))
    plot = args.plot or "streamlb-data/demo-load.png"
    _plot(results, plot)
    print(f"\nplot of per-instance load over time: {plot}")
    if not ok:
        print("FAILED: a final state differs from pandas over the same files", file=sys.stderr)
        return 1
    return 0


def _plot(results: dict, path: str):
    import pandas as pd

    from .._plot import figure, save

    fig = figure(figsize=(10, 3.2 * len(results)))
    axes = fig.subplots(len(results), 1, sharex=False, squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], results.items()):
        load = r["_load"]
        t0 = load.index.min()
        secs = (load.index - t0).total_seconds()
        for inst in load.columns:
            ax.plot(secs, load[inst].to_numpy(), drawstyle="steps-post", label=f"instance {inst}")
        for i, mv in enumerate(r["_moves"]):
            x = (pd.Timestamp(mv["completed"], unit="s") - t0).total_seconds()
            ax.axvline(x, color="k", alpha=0.25, lw=1, label="migration" if i == 0 else None)
        ax.set_title(f"{name}: records per instance per load window "
                     f"(median imbalance {r['imbalance (median)']:.2f}, {r['moves (epochs)']} migration epochs)")
        ax.set_xlabel("seconds")
        ax.set_ylabel("records")
        ax.legend(fontsize=7, ncol=5, loc="upper right")
    fig.tight_layout()
    return save(fig, path)


def _demo_rescale(args) -> int:
    """``streamlb demo --rescale FROM:TO``: the keyed aggregate starts with FROM instances and
    is rescaled to TO while it runs, a third of the way through the input (at the source rate)."""
    import pandas as pd
    from streamz import Stream

    import streamlb
    from .._placement import cluster_workers

    n_from, n_to = args.rescale
    path, man, truth = _demo_input(args)
    rate = args.rate or 200_000
    plot = args.plot or "streamlb-data/demo-rescale.png"
    # its plot shows each instance's load per 250 ms window as the new instances fill up
    src = Stream.from_parquet(path, rate=rate, batch_size=args.batch_size or 10_000, event_time="event_time")
    src.key_by("key").aggregate(DEMO_SPEC, name="totals", parallelism=n_from)
    with streamlb.run(src, n_workers=args.workers, window=args.window or "250ms", key_groups=256) as job:
        print(f"\n[rescale] {n_from} instances on an embedded Dask cluster of "
              f"{len(cluster_workers(job.client))} worker processes, open-loop source at "
              f"{rate:,.0f} records/s; rescaled to {n_to} a third of the way through ...")
        failed: list[BaseException] = []
        rescaler = threading.Thread(target=_rescale_at, args=(job, man["rows"] / 3 / rate, n_to,
                                                              args.rescale_strategy, failed))
        rescaler.start()
        try:
            job.wait(progress=True)
        finally:
            rescaler.join()
        if failed:
            print(f"FAILED: the rescale was refused: {failed[0]}", file=sys.stderr)
            return 1
        state, m, history = job.state("totals"), job.metrics(), job.history
    same = _exact(state, truth)
    rs = next(h for h in history if h.get("kind") == "rescale")
    epochs = [h for h in history if "kind" not in h and h["operator"] == "totals"]
    moved = sum(len(h["key_groups"]) for h in epochs)
    switched = min((h["routers_switched"] for h in epochs), default=rs["completed"])
    ops = m[m.operator == "totals"]
    load = ops.pivot_table(index="window_start", columns="instance", values="records", aggfunc="sum")
    win = pd.Timedelta(seconds=job.window)
    total = load.sum(axis=1)
    full = load[total > 0.5 * total.median()]
    asked, done = (pd.Timestamp(rs[k], unit="s") for k in ("started", "completed"))
    # the median, not the mean: the sources' start-up burst is no steady state
    before = full[full.index + win <= asked].max(axis=1).median()
    after = full[full.index >= done].max(axis=1).median()
    _plot_rescale(load, rs, switched, moved, plot)
    print(f"plot of instances and load over time: {plot}")
    print(f"rescaled 'totals' {n_from} -> {n_to} live in {rs['completed'] - rs['started']:.2f} s "
          f"({rs['strategy']}, {moved} of 256 key groups moved); busiest instance per window (median) "
          f"{before:,.0f} -> {after:,.0f} records; final state of {len(state):,} keys "
          f"{'equals' if same else 'DIFFERS FROM'} pandas over the same files")
    if not same:
        print("FAILED: the final state differs from pandas over the same files", file=sys.stderr)
        return 1
    return 0


def _rescale_at(job, delay: float, parallelism: int, strategy: str | None, failed: list) -> None:
    """Rescale the demo's aggregate ``delay`` seconds after the job started (beside
    ``job.wait``, which shows the progress meanwhile)."""
    time.sleep(max(job.started_at + delay - time.time(), 0.0))
    try:
        job.rescale("totals", parallelism, strategy=strategy)
    except Exception as exc:          # reported once the job finished: it runs on unchanged
        failed.append(exc)


def _plot_rescale(load, rs: dict, switched: float, moved: int, path: str):
    """Records per instance per window above, the instances receiving records as a step
    line below; the rescale marked from the request until ``rescale`` returned."""
    import pandas as pd

    from .._plot import colours as colour_map
    from .._plot import figure, save

    t0 = load.index.min()
    secs = (load.index - t0).total_seconds()
    at = lambda t: (pd.Timestamp(t, unit="s") - t0).total_seconds()  # noqa: E731
    asked, switch, done = at(rs["started"]), at(switched), at(rs["completed"])
    fig = figure(figsize=(10, 5.4))
    ax, count = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    colours = colour_map("tab10")
    for inst in load.columns:
        ax.plot(secs, load[inst].to_numpy(), drawstyle="steps-post", lw=1.3, color=colours(int(inst) % 10),
                label=f"instance {inst}")
    for a in (ax, count):
        a.axvline(asked, color="k", lw=1.2, ls="--",
                  label=f"rescale {rs['from']} \u2192 {rs['to']} asked" if a is ax else None)
        a.axvspan(asked, done, color="k", alpha=0.07, lw=0,
                  label="until rescale returned (state drained)" if a is ax else None)
    ax.set_ylabel("records per window")
    ax.set_ylim(0, 1.4 * float(load.max().max()))        # headroom: the legend above the lines
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    ax.set_title(f"live rescale of 'totals' {rs['from']} \u2192 {rs['to']} instances ({rs['strategy']}, "
                 f"{moved} key groups moved): records per instance per load window", fontsize=10)

    end = secs.max()
    count.plot([secs.min(), switch, end], [rs["from"], rs["to"], rs["to"]], drawstyle="steps-post",
               color="k", lw=2)
    count.set_ylabel("instances")
    count.set_ylim(0, max(rs["from"], rs["to"]) + 1)
    count.set_yticks(sorted({0, rs["from"], rs["to"]}))
    count.set_title("instances receiving records", fontsize=9, loc="left")
    count.set_xlabel("seconds")
    fig.tight_layout()
    return save(fig, path)


def _simulate(args) -> int:
    from ..simulator import Trace, plot, simulate, summarize, zipf_trace

    if args.trace:
        if not os.path.exists(args.trace):
            print(f"streamlb simulate: trace file {args.trace!r} does not exist", file=sys.stderr)
            return 2
        trace = Trace.load(args.trace)
        what = f"trace {args.trace}: {trace.windows:,} windows x {trace.key_groups:,} key groups"
    else:
        trace = zipf_trace(args.windows, args.key_groups, args.instances, keys=args.keys, skew=args.skew,
                           records_per_window=args.records_per_window, drift_every=args.drift_every,
                           seed=args.seed)
        what = (f"Zipf s={args.skew} over {args.keys:,} keys, {args.windows:,} windows x "
                f"{args.key_groups:,} key groups, hot keys rotating every {args.drift_every or 0} windows")
    n = args.instances if args.instances else trace.instances
    print(f"{what}, {n} instances")
    results = {b: simulate(trace, b, n, max_groups=args.max_groups, progress=True) for b in args.balancers}
    print(summarize(results).round(3).to_string())
    plot(results, args.plot, title=f"simulated imbalance, {n} instances")
    print(f"plot: {args.plot}")
    return 0


DESCRIPTION = ("streamlb runs stateful streamz pipelines on a Dask cluster and balances them live under key "
               "skew. Commands: prepare writes a dataset, demo compares balancers on a skewed stream (or "
               "rescales one live), simulate replays a load trace through balancers without a cluster, "
               "nexmark runs a NEXMark query checked against PySpark.")
EPILOG = "Run 'streamlb COMMAND --help' for a command's options; docs/cli.md describes each."


def parser() -> argparse.ArgumentParser:
    """The ``streamlb`` command's parser, every command on it."""
    from .. import __version__
    from .._migration._epochs import STRATEGIES

    p = argparse.ArgumentParser(prog="streamlb", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--version", action="version", version=f"streamlb {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    pr = _command(sub, "prepare", "write a partitioned Parquet dataset with PySpark")
    pr.add_argument("kind", choices=["zipf", "nexmark"],
                    help="zipf: (key, value) rows with Zipf keys; nexmark: the person, auction and bid tables")
    pr.add_argument("path", help="the directory to write, with a manifest of the files and parameters")
    pr.add_argument("--rows", type=int, default=1_000_000,
                    help="rows (zipf) or events (nexmark) (default 1,000,000)")
    pr.add_argument("--keys", type=int, default=100_000, help="zipf: distinct keys (default 100,000)")
    pr.add_argument("--skew", type=float, default=1.2, help="zipf: the Zipf exponent, 0 for uniform (default 1.2)")
    pr.add_argument("--partitions", type=int, default=8, help="files (log partitions) to write (default 8)")
    pr.add_argument("--drift-every", type=int, default=None,
                    help="zipf: rotate the hot keys every this many rows (default: never)")
    pr.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    pr.add_argument("--rate", type=float, default=10_000,
                    help="nexmark: events per second of event time (default 10,000)")
    pr.add_argument("--flat", action="store_true",
                    help="nexmark: the older single table of all events instead of person, auction, bid")
    pr.set_defaults(func=_prepare)

    d = _command(sub, "demo", "the same drifting-Zipf stream with static and autoflow balancing "
                              "(or, with --rescale, rescaled live), checked against pandas")
    d.add_argument("--data", default="streamlb-data/demo-zipf",
                   help="the dataset, prepared with PySpark if absent (default streamlb-data/demo-zipf)")
    d.add_argument("--rows", type=int, default=2_000_000, help="rows of a dataset to prepare (default 2,000,000)")
    d.add_argument("--keys", type=int, default=100_000,
                   help="distinct keys of a dataset to prepare (default 100,000)")
    d.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of a dataset to prepare (default 1.0)")
    d.add_argument("--workers", type=int, default=2, help="worker processes of the embedded cluster (default 2)")
    d.add_argument("--parallelism", type=int, default=8, help="instances of the keyed aggregate (default 8)")
    d.add_argument("--batch-size", type=int, default=None, help="rows per source batch (default: streamlb's)")
    d.add_argument("--rate", type=float, default=None,
                   help="open-loop source rate, records/s (default 200,000)")
    d.add_argument("--window", default=None, help="load window (default: setting streamlb.window, 1s)")
    d.add_argument("--migration", default="fluid", choices=STRATEGIES, help="how key groups move (default fluid)")
    d.add_argument("--balancers", nargs="+", default=["static", "autoflow"], type=_balancer,
                   help="balancers to compare, by registered name (default static autoflow)")
    d.add_argument("--plot", default=None, help="PNG of per-instance load (default "
                   "streamlb-data/demo-load.png; streamlb-data/demo-rescale.png with --rescale)")
    d.add_argument("--rescale", nargs="?", const=(2, 6), default=None, type=_instances, metavar="FROM:TO",
                   help="instead of comparing balancers: start the keyed aggregate with FROM instances "
                        "and rescale it to TO live a third of the way through (default 2:6); "
                        "plots instances and load over time and checks the final state against pandas")
    d.add_argument("--rescale-strategy", default=None, choices=STRATEGIES,
                   help="how key groups move onto the new instances: lazy (setting "
                        "streamlb.reconfiguration.strategy), fluid, all-at-once or pause")
    d.set_defaults(func=_demo)

    sm = _command(sub, "simulate", "replay a load trace (recorded or Zipf) through balancers, "
                                   "no cluster; writes a PNG of imbalance over time")
    sm.add_argument("--trace", help="a trace saved with Trace.save (e.g. job.load_trace(op).save(path)); "
                                    "default: generate one from Zipf")
    sm.add_argument("--balancers", nargs="+", default=["static", "autoflow", "greedy", "hybrid"], type=_balancer,
                    help="balancers to replay, by registered name (default static autoflow greedy hybrid)")
    sm.add_argument("--instances", type=int, default=None, help="instances (default: the trace's, else 8)")
    sm.add_argument("--windows", type=int, default=600, help="load windows of a generated trace (default 600)")
    sm.add_argument("--key-groups", type=int, default=1024, help="key groups of a generated trace (default 1024)")
    sm.add_argument("--keys", type=int, default=100_000, help="distinct keys of a generated trace (default 100,000)")
    sm.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of a generated trace (default 1.0)")
    sm.add_argument("--records-per-window", type=int, default=100_000,
                    help="records per window of a generated trace (default 100,000)")
    sm.add_argument("--drift-every", type=int, default=100, help="windows between hot-key rotations")
    sm.add_argument("--max-groups", type=int, default=64, help="cap on key groups per plan")
    sm.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    sm.add_argument("--plot", default="streamlb-data/simulate.png",
                    help="PNG of imbalance over time (default streamlb-data/simulate.png)")
    sm.set_defaults(func=_simulate)

    from ._nexmark import add_parser as add_nexmark

    add_nexmark(sub)
    from ._jobs import add_parsers as add_job_verbs

    add_job_verbs(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")
    args = parser().parse_args(argv)
    if args.command == "simulate" and not args.trace and args.instances is None:
        args.instances = 8
    try:
        return args.func(args)
    except KeyboardInterrupt:
        # the job that ran was stopped by Job.wait and its uncommitted outputs removed
        print(f"streamlb {args.command}: interrupted", file=sys.stderr)
        return 130
