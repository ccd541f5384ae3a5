"""Latency and memory while a large state migrates, per strategy.

About 5.3M keys are held by a keyed count (2 instances, one per worker) fed by an open-loop
event-time replay at RATE records/s; then every other key group of each instance moves to
the other instance: half the state (about 2.6M keys) moves, in both directions, and each
instance keeps the same load. Latency per 100 ms window comes from the job's metrics; memory
is the workers' resident set sampled every 20 ms. Each strategy runs on a fresh cluster.

``lazy`` moves this job's state by merging (its aggregate feeds nothing downstream, see
docs/migration.md#lazy-by-merging); ``lazy-pull`` is the same job with a step after the
aggregate (a map that keeps no row, into a list sink), so a ``lazy`` move pulls keys and
holds rows, as it must for an operator whose values are read per batch.

p99 during / steady is the 99th percentile of the latencies of all records applied during
the migration over that of the records of the 1.4 s before it, from the windows' latency
histograms added up (``streamlb.latency``). The window figure kept beside it is the 99th
percentile of the windows' own p99s, during over steady: with some 40 windows it is about
the worst window's p99 over the worst steady window's.
"""
from __future__ import annotations

import time

import numpy as np

from ._common import DATA, _OneShot, cluster, quiet, zipf_dataset

ROWS, KEYS = 10_000_000, 14_000_000
RATE = 600_000
BATCH = 20_000                     # rows per source batch: each source emits every 67 ms
MOVE_AT = 11.0                     # seconds into the replay: ~6.6M rows read, ~5.3M keys held
PHASE = 0.005                      # the move starts this long after a source's batch
STRATEGIES = ["all-at-once", "fluid", "lazy", "pause", "lazy-pull"]
#: keys of the log of repeated moves (main's --moves): as many as LargeStateMigration holds
#: at its move; and the seconds between those moves
HELD, GAP = 5_250_000, 10.0


def _sampler(dask_worker):
    import threading

    import psutil

    proc = psutil.Process()
    samples = dask_worker._streamlb_rss = []

    def loop():
        while not getattr(dask_worker, "_streamlb_rss_stop", False):
            samples.append((time.time(), proc.memory_info().rss))
            time.sleep(0.02)

    dask_worker._streamlb_rss_stop = False
    threading.Thread(target=loop, daemon=True).start()


def _collect(dask_worker):
    dask_worker._streamlb_rss_stop = True
    return list(getattr(dask_worker, "_streamlb_rss", []))


def _by_value() -> None:
    """Workers cannot import this benchmark module: ship its functions by value."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _clock(dask_worker):
    """``(epoch0, seconds per slice, parallelism)`` of each replaying source instance on this
    worker that has started: the shared replay clock, read from the instances themselves."""
    out = []
    for inst in dask_worker.state.actors.values():
        src = getattr(inst, "source", None)
        if src is not None and getattr(src, "epoch0", 0):
            st = src.stage
            out.append((src.epoch0, st.batch_size / (st.rate / st.parallelism), st.parallelism))
    return out


def _move_time(client, at: float, after: float) -> float:
    """The wall time ``at`` seconds into the replay, moved onto the sources' clock: ``after``
    seconds past the nearest batch a source emits (instance ``i`` of ``P`` emits every
    slice, offset by ``(i + 1) / P`` of one, so together they emit every ``slice / P``).
    Starting every move at the same phase of that clock takes out of the figures the up to
    67 ms a move otherwise waits for the next batch, which varied from run to run."""
    deadline = time.time() + 30
    while not (clocks := [c for cs in client.run(_clock).values() for c in cs]):
        if time.time() > deadline:
            raise RuntimeError("no replaying source instance started within 30 s")
        time.sleep(0.01)
    epoch0, per_slice, parallelism = clocks[0]
    grid = per_slice / parallelism
    return epoch0 + round(at / grid) * grid + after


def _nothing(frame):
    return frame.iloc[:0]


def _p99(windows) -> float:
    """p99 latency of every record applied in ``windows`` (metrics rows)."""
    from streamlb import latency

    return latency.quantile(np.sum(np.stack(windows.latency_hist.to_list()), axis=0), 0.99)


def _run(client, path, strategy, batch=BATCH):
    """LargeStateMigration's job and its one move: the move's figures."""
    return _moves(client, path, strategy, batch, [MOVE_AT])[0]


def _moves(client, path, strategy, batch, at: list[float]) -> list[dict]:
    """The job, with the same move asked at each of ``at`` (seconds into the replay): every
    other key group of each instance to the other one. The figures of each move."""
    from streamz import Stream

    import streamlb

    _by_value()
    client.run(_sampler)
    src = Stream.from_parquet(path, batch_size=batch, rate=RATE, event_time="event_time")
    agg = src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=2, name="n")
    if strategy == "lazy-pull":
        agg.map(_nothing).sink_to_list()        # its values are read per batch: lazy must pull
        strategy = "lazy"
    moves = []
    with streamlb.run(src, client=client, key_groups=256, window=0.1) as job:
        for t in at:
            time.sleep(max(0.0, _move_time(client, t, PHASE) - time.time()))
            held = sum(job.state_size("n").values())
            table = job.routing("n")
            # every other key group of each instance moves to the other one: half the state
            # moves and the load per instance stays the same
            swap = {g: 1 - i for i in (0, 1) for g in table.key_groups_of(i)[::2]}
            before = len(job.history)
            job.reassign("n", swap, strategy=strategy)
            moves.append((held, job.history[before:]))
        job.wait()
        m = job.metrics()
    rss = client.run(_collect)
    ops = m[m.operator == "n"].copy()
    ops["t"] = ops.window_start.astype("int64") / 1e9
    return [_figures(ops, rss, held, epochs) for held, epochs in moves]


def _figures(ops, rss, held: int, epochs: list) -> dict:
    """One move's figures from the operator's load windows and the workers' memory."""
    start, end = epochs[0]["started"], epochs[-1]["completed"]
    during = ops[(ops.t >= start - 0.1) & (ops.t <= end + 0.3)]
    steady = ops[(ops.t >= start - 1.6) & (ops.t < start - 0.2)]
    mem_during = max(r for samples in rss.values() for t, r in samples if start <= t <= end + 0.3)
    mem_steady = max(r for samples in rss.values() for t, r in samples if start - 1.0 <= t < start)
    first = [e["first_moved_record_applied"] for e in epochs if e["first_moved_record_applied"]]
    return {
        "held_keys": held,
        "max_latency_ms": float(during.latency_max_ms.max()),
        "p99_during_ms": _p99(during),
        "p99_steady_ms": _p99(steady),
        "window_p99_during_ms": float(during.latency_p99_ms.quantile(0.99)),
        "window_p99_steady_ms": float(steady.latency_p99_ms.quantile(0.99)),
        "rss_ratio": mem_during / mem_steady,
        "first_record_ms": (min(first) - start) * 1e3 if first else float("nan"),
        # the same of the first epoch alone (fluid: the figure above comes from whichever
        # epoch first held a row for its state, which differs from run to run)
        "first_epoch_record_ms": ((epochs[0]["first_moved_record_applied"] - start) * 1e3
                                  if epochs[0]["first_moved_record_applied"] else float("nan")),
        # the plan until every router routes by the new table (no source clock in it)
        "switch_ms": (epochs[0].get("routers_switched", float("nan")) - start) * 1e3,
        "migration_s": end - start,
        "epochs": len(epochs),
        "epochs_that_held": len(first),       # epochs in which a row waited for its state
        "first_held_epoch": next((i for i, e in enumerate(epochs) if e["first_moved_record_applied"]), -1),
    }


class LargeStateMigration(_OneShot):
    params = [STRATEGIES]
    param_names = ["strategy"]

    def setup_cache(self):
        path = zipf_dataset(ROWS, KEYS, 0.0, partitions=4)
        out = {}
        for s in STRATEGIES:        # a fresh cluster each: memory freed by one run would
            cl, client = cluster(2)  # otherwise raise the next one's steady-state base
            with cl, client:
                out[s] = _run(client, path, s)
        return out

    def track_keys_held_at_migration(self, r, strategy):
        return float(r[strategy]["held_keys"])

    track_keys_held_at_migration.unit = "keys"

    def track_max_latency_during_migration(self, r, strategy):
        return r[strategy]["max_latency_ms"]

    track_max_latency_during_migration.unit = "ms"

    def track_p99_during_over_steady(self, r, strategy):
        return r[strategy]["p99_during_ms"] / r[strategy]["p99_steady_ms"]

    track_p99_during_over_steady.unit = "ratio"

    def track_window_p99_during_over_steady(self, r, strategy):
        return r[strategy]["window_p99_during_ms"] / r[strategy]["window_p99_steady_ms"]

    track_window_p99_during_over_steady.unit = "ratio"

    def track_peak_memory_during_over_steady(self, r, strategy):
        return r[strategy]["rss_ratio"]

    track_peak_memory_during_over_steady.unit = "ratio"

    def track_first_moved_record_applied_after_plan(self, r, strategy):
        return r[strategy]["first_record_ms"]

    track_first_moved_record_applied_after_plan.unit = "ms"

    def track_migration_seconds(self, r, strategy):
        return r[strategy]["migration_s"]

    track_migration_seconds.unit = "s"


def steady_dataset(moves: int, gap: float = GAP) -> str:
    """A log for ``moves`` moves ``gap`` seconds apart, the first at MOVE_AT: its first HELD
    rows hold every key once (shuffled), the rest are keys drawn uniformly among them, so
    from MOVE_AT on every move finds the same HELD keys (about LargeStateMigration's state
    at its move) where a log of new keys would grow the state from move to move. Written
    with numpy and pyarrow (no streamlb: any commit's ``ab.py`` run reads the same files):
    4 files, rows dealt round robin, a millisecond of event time a row (as in the Zipf log
    LargeStateMigration reads)."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = int(RATE * (MOVE_AT + moves * gap + 1.0))
    path = os.path.abspath(os.path.join(DATA, f"steady-{rows}-{HELD}"))
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return path
    rng = np.random.default_rng(0)
    keys = np.concatenate([rng.permutation(HELD), rng.integers(0, HELD, max(0, rows - HELD))])[:rows]
    values = rng.integers(0, 1000, rows).astype(np.float64)
    times = np.datetime64("2026-01-01", "us") + np.arange(rows) * np.timedelta64(1, "ms")
    for p in range(4):
        os.makedirs(os.path.join(path, f"part={p}"), exist_ok=True)
        pq.write_table(pa.table({"key": keys[p::4], "value": values[p::4], "event_time": times[p::4]}),
                       os.path.join(path, f"part={p}", "part-0.parquet"))
    open(os.path.join(path, "_SUCCESS"), "w").close()
    return path


def main(argv=None) -> None:
    """``python -m benchmarks.migration --strategy lazy [--batch N] [--runs R] [--moves K]``:
    ``_run`` (K moves: ``_moves``) on a fresh 2-worker cluster per run, one JSON line per
    move (``asv_bench/ab.py --bench migration`` runs it with two commits alternating).
    ``--batch`` sets the sources' rows per batch: at the default 20,000 a source emits every
    67 ms, and the phase of that clock against the plan dominates ``first_record_ms``;
    smaller batches show the protocol's own share."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    p.add_argument("--strategy", default="lazy", choices=STRATEGIES)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--moves", type=int, default=1,
                   help="moves per run, GAP s apart, over steady_dataset's log (default 1: "
                        "LargeStateMigration's job and move)")
    a = p.parse_args(argv)
    at = [MOVE_AT + k * GAP for k in range(a.moves)]
    path = zipf_dataset(ROWS, KEYS, 0.0, partitions=4) if a.moves == 1 else steady_dataset(a.moves)
    for _ in range(a.runs):
        quiet()
        cl, client = cluster(2)
        with cl, client:
            for k, fig in enumerate(_moves(client, path, a.strategy, a.batch, at)):
                print(json.dumps({"move": k, **fig}), flush=True)


if __name__ == "__main__":
    main()
