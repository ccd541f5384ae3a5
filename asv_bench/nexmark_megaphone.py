"""The Megaphone experiment on NEXMark: latency while a quarter of a query's key groups
move, for each migration strategy.

Megaphone (seed 001) moved the state of NEXMark queries while they ran at a fixed rate and
showed that a migration in small steps keeps the latency near its steady level where an
all-at-once move spikes it. Here, for each query of ``--queries`` (default q3 q4 q5 q7 q8):

1. **Capacity.** The query reads the log of ``--events`` NEXMark events (prepared with
   PySpark once, as ``streamlb nexmark`` does) as fast as it goes on an embedded cluster of
   ``--workers`` (2) worker processes: events/s, counted as NEXMark counts them (every event
   of the log, whatever the query reads).
2. **Runs.** For each strategy (all-at-once, fluid, lazy, pause), on a fresh cluster: the
   log replayed open loop at ``--load`` (0.6) of that capacity, each table at the share of
   the events it holds; a third of the way through, a quarter of the key groups of the
   operator below move (from each instance, every fourth group it owns to the next
   instance: the load per instance stays the same) with ``Job.reassign(op, assignment,
   strategy=s)``. Both the capacity run and these use batches of ``--batch-size`` events of
   the log (4096), shared out in the same way, and load windows of 100 ms.
3. **Figures.** From the moved operator's load windows (``Job.metrics()``, as
   ``benchmarks/migration.py``'s LargeStateMigration reads them): max and p99 latency of the
   records it applied in the windows that overlap the move, from the plan's first epoch
   start to 0.5 s after its last epoch completed (rows held during the move are applied
   then); p99 is of every record, from the windows' histograms added up. Steady p99: the
   same over the 2 s before the move. Max outside the move: the highest latency of the
   rest of the run (every window before the move or from 0.5 s after it, past the first
   5 s of reading): what the query reaches with nothing moving. The move's seconds: first
   epoch start to last epoch completed (``Job.history``). Exact: the output against PySpark batch SQL
   (``streamlb.nexmark._truth``), every row and value.

The operator moved (the query's keyed join, window or process that holds its state):

======  ================  =====================================================================
query   operator          why this one
======  ================  =====================================================================
q3      ``q3_join``       the regular join of auctions and sellers: every row of both sides
q4      ``closing_join``  the interval join of auctions and their bids (an hour of event time:
                          all of them); ``closing`` and ``q4_avg`` (5 categories) hold little
q5      ``q5_count``      the sliding-window bid counts per auction; ``q5_top`` holds one
                          window at a time, keyed by its end
q7      ``q7_top``        each open tumbling window's bids, keyed by the window's end: few
                          keys, so the move carries whichever open windows fall in its groups
q8      ``q8_join``       the window join of new people and their auctions
======  ================  =====================================================================

Prints a table per query (strategy, max ms, p99 ms, steady p99 ms, max outside the move ms,
move s, epochs, the rows the operator held when the move was asked for (a join: both
sides), exact),
the ratio of all-at-once's max latency to fluid's and lazy's (the goal: 10x or more), one
JSON line with every figure (and when the first epoch passed each phase: ``phases``; per
operator, batches applied and busy seconds per second in the 10 s before the move and after
it: ``operators``), and
writes a PNG of latency over time per strategy, one panel per query (``--out``, default
``docs/images/nexmark-megaphone.png``). Exit code 1 if an output is not exact or a move
failed (the run goes on to the next).

Run from the repository (the ``bench`` and ``spark`` extras)::

    python asv_bench/nexmark_megaphone.py --events 200000 --queries q5    # a check that it works
    python asv_bench/nexmark_megaphone.py                                 # the experiment (5M events)
    python asv_bench/nexmark_megaphone.py --fluid-keys 1                  # fluid a few groups at a time

A query's runs last about 7.7 times the log over its capacity in all (the capacity run and
four runs at 60% of it), so the slowest query sets the time (q4: 20,000-60,000 events/s at
200,000 events on the 2-core machine, q5 and q7 above 250,000). They must be long enough
for a steady state before the move and for the move to end before the input does: a run
whose move outlasted its input is flagged, and a move still going when the instances
finish fails (flagged too). Fluid moves in epochs of at most ``streamlb.migration.fluid-keys``
keys (65,536): a smaller state moves in one epoch, as all-at-once does; ``--fluid-keys 1``
moves ``fluid-step`` (4) key groups per epoch (and groups holding nothing with them), as
Megaphone's fluid migration moves a bin at a time. ``--strategies ... fluid@1`` runs that
as one more strategy beside ``fluid`` at the default, in the same sitting::

    python asv_bench/nexmark_megaphone.py --strategies all-at-once fluid fluid@1 lazy pause batched
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

#: the operator each query moves (see the table above)
MOVED = {"q3": "q3_join", "q4": "closing_join", "q5": "q5_count", "q7": "q7_top", "q8": "q8_join"}
STRATEGIES = ("all-at-once", "fluid", "lazy", "pause")
WINDOW = 0.1            # seconds per load window: the resolution of latency over time
WARMUP = 1 / 3          # of the run's expected length, before the move
SETTLE = 0.5            # seconds after the move whose windows still count as during it
STEADY = 2.0            # seconds before the move that give its steady latency
SKIP = 5.0              # seconds from the first read that ``max_outside_ms`` leaves out (start-up)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _say(msg: str) -> None:
    print(f"[megaphone {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def moved_operator(job, query: str):
    """The stage of ``job`` that ``query`` moves: by name, a keyed join, window or process."""
    name = MOVED[query]
    stage = next((st for st in job.plan.stages if st.name == name), None)
    if stage is None or stage.exchange != "keyed" or stage.kind not in ("join", "window", "process"):
        kinds = {st.name: st.kind for st in job.plan.stages}
        raise RuntimeError(f"{query}: expected a keyed join, window or process named {name!r}, the plan has {kinds}")
    return stage


def quarter(table, parallelism: int) -> dict[int, int]:
    """From each instance, every fourth key group it owns to the next instance: a quarter
    of the key groups move and every instance keeps its share."""
    return {int(g): (i + 1) % parallelism for i in range(parallelism) for g in table.key_groups_of(i)[::4]}


def capacity(query: str, path: str, man: dict, workers: int, batch: int) -> float:
    """Events/s of the log when ``query`` reads it as fast as it goes."""
    import streamlb
    from streamlb.cli._nexmark import build

    node, _ = build(query, path, man, batch_size=batch)
    with streamlb.run(node, n_workers=workers, window=WINDOW) as job:
        job.wait(progress=True)
        return man["rows"] / job.summary()["seconds"]


def _move_at(job, delay: float, query: str, strategy: str, box: dict) -> None:
    """Move a quarter of the key groups ``delay`` seconds after the job started (beside
    ``job.wait``, which shows the progress meanwhile); what happened goes into ``box``."""
    time.sleep(max(job.started_at + delay - time.time(), 0.0))
    try:
        stage = moved_operator(job, query)
        plan = quarter(job.routing(stage.name), job.parallelism(stage.name))
        held = job.state_size(stage.name)       # rows (a join's: both sides') per instance
        box.update(operator=stage.name, kind=stage.kind, groups=len(plan), key_groups=job.key_groups,
                   held=sum(held.values()), asked=time.time())
        job.reassign(stage.name, plan, strategy=strategy)
    except Exception as exc:          # reported once the job finished
        box["error"] = exc
    box["returned"] = time.time()


def strategy_of(label: str) -> tuple[str, int | None]:
    """``fluid@N`` is ``fluid`` with ``streamlb.migration.fluid-keys`` N (the moves are planned
    in this process); any other label is a strategy at the settings in force."""
    name, _, keys = label.partition("@")
    return name, (int(keys) if keys else None)


def _label(text: str) -> str:
    from streamlb._migration._epochs import STRATEGIES as KNOWN

    name, _, keys = text.partition("@")
    if name not in KNOWN or (keys and (name != "fluid" or not keys.isdigit())):
        raise argparse.ArgumentTypeError(f"{text!r}: a strategy of {', '.join(KNOWN)}, or fluid@N "
                                         "(fluid with streamlb.migration.fluid-keys N, N a whole number)")
    return text


def run(query: str, path: str, man: dict, rate: float, label: str, workers: int, batch: int, want) -> dict:
    """One paced run of ``query`` with a move by the strategy ``label`` names: its figures."""
    import dask

    strategy, keys = strategy_of(label)
    with dask.config.set({} if keys is None else {"streamlb.migration.fluid-keys": keys}):
        return _run(query, path, man, rate, strategy, workers, batch, want)


def _run(query: str, path: str, man: dict, rate: float, strategy: str, workers: int, batch: int, want) -> dict:
    import streamlb
    from streamlb.cli._nexmark import build
    from streamlb.cli._args import _latencies
    from streamlb.nexmark._check import differences, result

    node, out = build(query, path, man, rate=rate, batch_size=batch)
    box: dict = {}
    with streamlb.run(node, n_workers=workers, window=WINDOW) as job:
        mover = threading.Thread(target=_move_at, args=(job, WARMUP * man["rows"] / rate, query, strategy, box))
        mover.start()
        try:
            job.wait(progress=True)
        finally:
            mover.join()
        if "asked" not in box:              # no move was asked for: nothing to measure
            raise RuntimeError(f"{query}: no {strategy} move: {box['error']}") from box["error"]
        epochs = [h for h in job.history if "kind" not in h and h["operator"] == box["operator"]]
        metrics, sources = job.metrics(), [st.name for st in job.plan.stages if st.is_source]
    # a move that failed (e.g. its instances had finished) counts until it gave up
    start = epochs[0]["started"] if epochs else box["asked"]
    end = epochs[-1]["completed"] if epochs and "error" not in box else box["returned"]
    metrics["t"] = metrics.window_start.astype("int64") / 1e9
    read = metrics[metrics.operator.isin(sources) & (metrics.records > 0)]
    ops = metrics[metrics.operator == box["operator"]]
    during = ops[(ops.t + WINDOW > start) & (ops.t < end + SETTLE)]
    steady = ops[(ops.t >= start - STEADY) & (ops.t + WINDOW <= start)]
    # the rest of the run, past its first seconds: how high latency goes with no move at all
    outside = ops[(ops.t >= read.t.min() + SKIP) & ((ops.t + WINDOW <= start) | (ops.t >= end + SETTLE))]
    lat, calm = _latencies(during), _latencies(steady)
    series = ops.groupby("t").latency_max_ms.max()
    diff = differences(query, result(query, out), want)
    return {
        "operator": box["operator"], "kind": box["kind"], "groups": box["groups"], "key_groups": box["key_groups"],
        "held": box["held"], "max_ms": lat["max"], "p99_ms": lat["p99"], "steady_p99_ms": calm["p99"],
        "max_outside_ms": _latencies(outside)["max"], "move_s": end - start,
        "epochs": len(epochs), "exact": diff is None, "difference": diff, "phases": phases(epochs),
        "failed": str(box["error"]).splitlines()[0][:200] if "error" in box else None,
        # the sources had read all the input before the move completed
        "outlasted": bool(end > read.t.max() + WINDOW),
        "operators": around(metrics, start, end),
        "series": {"t": (series.index - start).tolist(), "max_ms": series.tolist()},
    }


def around(metrics, start: float, end: float, span: float = 10.0) -> dict:
    """Per operator, batches applied and busy seconds per second (all its instances) over
    the ``span`` seconds before the move and the ``span`` seconds from 0.5 s after it: what
    the move changed in the work of every operator, not only the one moved."""
    out = {}
    for name, ops in metrics.groupby("operator"):
        out[name] = {}
        for when, lo in (("before", start - span), ("after", end + SETTLE)):
            w = ops[(ops.t >= lo) & (ops.t + WINDOW <= lo + span)]
            out[name][when] = {"batches_per_s": round(float(w.batches.sum()) / span, 1),
                               "busy_per_s": round(float(w.busy_seconds.sum()) / span, 3)}
    return out


def phases(epochs: list) -> dict | None:
    """When the move's first epoch passed each phase, ms after it started (``Job.history``):
    routers switched, old owners aligned (state cut and shipped from then), state installed
    at the last new owner, epoch completed."""
    if not epochs:
        return None
    e = epochs[0]
    return {k: None if e.get(k) is None else round((e[k] - e["started"]) * 1e3, 1)
            for k in ("routers_switched", "aligned", "installed", "completed")}


def _table(runs: dict) -> str:
    """The figures of ``runs`` (strategy -> :func:`run`'s), a line each."""
    lines = [f"{'strategy':<14} {'max ms':>9} {'p99 ms':>9} {'steady p99 ms':>14} {'max outside ms':>15} "
             f"{'move s':>7} {'epochs':>6} {'rows held':>10}  exact"]
    for s, r in runs.items():
        lines.append(f"{s:<14} {r['max_ms']:>9,.1f} {r['p99_ms']:>9,.1f} {r['steady_p99_ms']:>14,.1f} "
                     f"{r['max_outside_ms']:>15,.1f} "
                     f"{r['move_s']:>7.2f} {r['epochs']:>6} {r['held']:>10,}  {'yes' if r['exact'] else 'NO'}"
                     + (f"  (the move failed: {r['failed']})" if r["failed"]
                        else "  (the move outlasted the input)" if r["outlasted"] else ""))
    return "\n".join(lines)


def ratios(runs: dict) -> dict[str, float]:
    """All-at-once's max latency over each other strategy's."""
    base = runs.get("all-at-once", {}).get("max_ms")
    return {s: base / r["max_ms"] for s, r in runs.items() if s != "all-at-once" and base and r["max_ms"]}


def plot(results: dict, path: str):
    """Latency over time (the moved operator's max per load window), a line per strategy,
    the move's span shaded in its colour, one panel per query."""
    from streamlb._plot import colours, figure, save

    palette = colours("tab10")
    fig = figure(figsize=(10, 2.9 * len(results)))
    axes = fig.subplots(len(results), 1, squeeze=False)[:, 0]
    for ax, (query, q) in zip(axes, results.items()):
        for i, (strategy, r) in enumerate(q["runs"].items()):
            c = palette(i)
            ax.plot(r["series"]["t"], r["series"]["max_ms"], drawstyle="steps-post", lw=1.2, color=c,
                    label=f"{strategy} (max {r['max_ms']:,.0f} ms, move {r['move_s']:.2f} s)")
            ax.axvspan(0, r["move_s"], color=c, alpha=0.08, lw=0)
        ax.axvline(0, color="k", lw=1, ls="--")
        ax.set_yscale("log")
        ax.set_ylabel("max latency (ms)")
        ax.set_title(f"{query}: {q['groups']} of {q['key_groups']} key groups of {q['operator']} ({q['kind']}) "
                     f"moved at {q['rate']:,.0f} events/s ({q['load']:.0%} of capacity)", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("seconds from the move's start (shaded: until it completed)")
    fig.tight_layout()
    return save(fig, path)


def main(argv=None) -> int:
    sys.path.insert(0, REPO)
    from streamlb import datasets
    from streamlb.cli._nexmark import default_data, prepared
    from streamlb._migration._epochs import STRATEGIES as KNOWN
    from streamlb.nexmark._truth import truth

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=5_000_000, help="NEXMark events in the log (default 5M)")
    p.add_argument("--queries", nargs="+", default=list(MOVED), choices=list(MOVED))
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), type=_label,
                   help=f"of {', '.join(KNOWN)}, or fluid@N: fluid with streamlb.migration.fluid-keys N "
                        f"(default {' '.join(STRATEGIES)})")
    p.add_argument("--out", default=os.path.join(REPO, "docs", "images", "nexmark-megaphone.png"),
                   help="the PNG (default docs/images/nexmark-megaphone.png)")
    p.add_argument("--load", type=float, default=0.6, help="the rate, as a share of the capacity (default 0.6)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4096, help="events of the log per source batch (default 4096)")
    p.add_argument("--data", default=None, help=f"where prepared tables are kept (default {default_data()})")
    p.add_argument("--fluid-keys", type=int, default=None,
                   help="a fluid epoch takes more than streamlb.migration.fluid-step key groups (4) while "
                        "their keys stay within this (setting streamlb.migration.fluid-keys, 65,536); "
                        "1: four groups per epoch, as Megaphone moves a bin at a time")
    args = p.parse_args(argv)
    if args.fluid_keys is not None:         # the moves are coordinated in this process
        import dask

        dask.config.set({"streamlb.migration.fluid-keys": args.fluid_keys})

    path, man = prepared(args.data or default_data(), args.events, 0)
    spark = datasets.spark_session()
    results, ok = {}, True
    for query in args.queries:
        want = truth(query, path, spark)
        _say(f"{query}: capacity, reading the log of {man['rows']:,} events as fast as it goes ...")
        cap = capacity(query, path, man, args.workers, args.batch_size)
        rate = args.load * cap
        _say(f"{query}: capacity {cap:,.0f} events/s; runs at {rate:,.0f} events/s, about "
             f"{man['rows'] / rate:,.1f} s each, the move a third of the way through")
        runs = {}
        for strategy in args.strategies:
            _say(f"{query} {strategy}: moving a quarter of {MOVED[query]}'s key groups ...")
            runs[strategy] = r = run(query, path, man, rate, strategy, args.workers, args.batch_size, want)
            _say(f"{query} {strategy}: max {r['max_ms']:,.1f} ms, p99 {r['p99_ms']:,.1f} ms during a move of "
                 f"{r['move_s']:.2f} s" + (f" that FAILED: {r['failed']}" if r["failed"] else "")
                 + f"; output {'exact' if r['exact'] else 'DIFFERS: ' + str(r['difference'])}")
            ok &= r["exact"] and not r["failed"]
        first = next(iter(runs.values()))
        results[query] = {"capacity": cap, "rate": rate, "load": args.load, "runs": runs,
                          **{k: first[k] for k in ("operator", "kind", "groups", "key_groups")}}
        print(f"\n{query}: {first['groups']} of {first['key_groups']} key groups of {first['operator']} "
              f"({first['kind']}) moved at {rate:,.0f} events/s, {args.load:.0%} of its capacity {cap:,.0f}")
        print(_table(runs))
        rs = ratios(runs)
        if rs:
            print("all-at-once's max latency over " + ", ".join(f"{s}'s: {v:,.1f}x" for s, v in rs.items())
                  + " (the goal: fluid and lazy 10x or more)")
        print(flush=True)
    plot(results, args.out)
    print(f"plot of latency over time per strategy: {args.out}")
    print(json.dumps({q: {**{k: v for k, v in r.items() if k != "runs"},
                          "runs": {s: {k: v for k, v in x.items() if k != "series"} for s, x in r["runs"].items()},
                          "ratios": ratios(r["runs"])} for q, r in results.items()}))
    if not ok:
        print("FAILED: an output differs from PySpark's answer, or a move failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("nexmark_megaphone: interrupted", file=sys.stderr)
        sys.exit(130)
