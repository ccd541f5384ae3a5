"""Rescaling a keyed aggregate that holds a large state, 4 -> 8 instances, while it runs.

The job is `LargeStateMigration`'s (``migration.py``) with a longer log: 16M rows over 14M
possible keys (uniform, 4 files), replayed in event time at RATE records/s (an open loop:
a record's latency counts from when it was due, so a stall shows however it is caused)
into a keyed count, 256 key groups, 100 ms windows, on a LocalCluster of 2 worker
processes. The count starts with 4 instances; MOVE_AT seconds in, with about 5.2M keys
held, it is rescaled to 8. The log lasts 26.7 s, so even a slow rescale ends long before
the sources do (a rescale still moving groups when they end is refused: the new instances
are finishing). Each case runs on a fresh cluster:

``lazy``, ``fluid``
    ``job.rescale("n", 8, strategy=...)`` while the sources keep emitting: 4 new instances
    are created and wired, then half of every old instance's key groups move onto them
    (about 2.6M keys). ``lazy`` on this job moves state by merging (the count feeds
    nothing downstream, see docs/migration.md#lazy-by-merging); ``fluid`` moves a few key
    groups per epoch.
``stop-restart``
    the baseline every production system offers (Flink, Bytewax, Spark: stop, snapshot,
    restart at the new parallelism), emulated with what the runtime has: pause every
    source instance (actor method ``pause``, as the ``pause`` migration strategy does),
    wait until every instance of the job is idle (``idle``: nothing queued, held or in
    flight), take the whole state to the driver (``job.state``: the snapshot, 5M rows),
    ``job.rescale("n", 8, strategy="all-at-once")`` while still paused, then ``resume``.
    Records keep falling due during the pause, so they wait as they would behind a
    restart. What it leaves out, so a real restart costs more than this: the snapshot is
    not written to durable storage; no actor is stopped or re-created (only the 4 new ones
    are created, while paused); the state is not loaded back from the snapshot (half of it
    moves between live actors in one epoch instead); the sources do not re-open their
    files and seek to their offsets. Its latency is therefore a lower bound of a restart's.

The rescale window is from 0.1 s before the request (the pause for ``stop-restart``) to
SETTLE seconds after it returned (after the resume): the backlog a pause leaves is
applied in it. Max latency is the largest per-window max latency of the aggregate's
instances in that window. "First record" is the time from the request to the first record
of a moved key group applied by a new instance: the earliest ``first_moved_record_applied``
of the rescale's epochs in ``job.history``. The baseline has none (n/a): its sources stay
paused until the state is in place, so no row of a moved group ever waits for it; its new
instances get their first rows at the resume, ``track_rescale_seconds`` after the request.
Every case also reports on stderr the cores that processes outside the benchmark used
while its job ran: the figures are only worth keeping when that is near 0.
"""
from __future__ import annotations

import os
import sys
import time

from ._common import _cpu, _OneShot, cluster, zipf_dataset
from .migration import BATCH, KEYS, MOVE_AT, RATE

ROWS = 16_000_000                  # 26.7 s at RATE: the stream outlasts the slowest rescale
FROM, TO = 4, 8
SETTLE = 2.0                       # seconds after the rescale returned that still count
CASES = ["lazy", "fluid", "stop-restart"]
LIVE = ["lazy", "fluid"]


def _say(msg: str) -> None:
    print(f"[rescale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _on_all(actors, cmd) -> list:
    """Send each actor the epoch command ``cmd``; their answers."""
    return [f.result() for f in [a.command(cmd) for a in actors]]


def _stop_snapshot_restart(job, op: str) -> dict:
    """The emulated baseline (see the module docstring); when each phase ended."""
    from streamlb._worker._commands import Idle, Pause, Resume

    sources = [a for (sid, _), a in job.actors.items() if job.plan.stages[sid].is_source]
    t = {"asked": time.time()}
    _on_all(sources, Pause())
    t["paused"] = time.time()
    while not all(_on_all(list(job.actors.values()), Idle())):
        time.sleep(0.002)
    t["idle"] = time.time()
    snapshot = job.state(op)
    t["snapshot"] = time.time()
    t["snapshot_keys"] = len(snapshot)
    del snapshot
    try:
        job.rescale(op, TO, strategy="all-at-once")
        t["rescaled"] = time.time()
    finally:
        _on_all(sources, Resume())
    t["resumed"] = time.time()
    return t


def _run(client, path: str, case: str, key_groups: int | None = 256) -> dict:
    from streamz import Stream

    import streamlb

    src = Stream.from_parquet(path, batch_size=BATCH, rate=RATE, event_time="event_time")
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=FROM, name="n")
    phases: dict = {}
    t0, cpu0 = time.time(), _cpu()
    with streamlb.run(src, client=client, key_groups=key_groups, window=0.1) as job:
        time.sleep(MOVE_AT)
        held = sum(job.state_size("n").values())
        _say(f"{case}: {held:,} keys held on {job.parallelism('n')} instances; rescaling to {TO}")
        if case == "stop-restart":
            phases = _stop_snapshot_restart(job, "n")
            asked, done = phases["asked"], phases["resumed"]
        else:
            asked = time.time()
            job.rescale("n", TO, strategy=case)
            done = time.time()
        assert job.parallelism("n") == TO
        _say(f"{case}: rescaled in {done - asked:.2f} s; waiting for the end of the stream")
        job.wait()
        cpu1, t1 = _cpu(), time.time()      # before the workers go: their CPU time counts
        m = job.metrics()
        history = job.history
    rec = next(e for e in history if e.get("kind") == "rescale")
    epochs = [e for e in history if "kind" not in e and e["operator"] == "n"
              and rec["started"] <= e["started"] <= rec["completed"]]
    first = [e["first_moved_record_applied"] for e in epochs if e["first_moved_record_applied"]]
    win = m[m.operator == "n"]
    t = win.window_start.astype("int64") / 1e9
    during = win[(t >= asked - 0.1) & (t <= done + SETTLE)]
    steady = win[(t >= asked - 1.6) & (t < asked - 0.2)]
    worst = during.loc[during.latency_max_ms.idxmax()]
    out = {
        "held_keys": held,
        "max_latency_ms": float(during.latency_max_ms.max()),
        "worst_window_after_request_s": float(worst.window_start.value / 1e9 - asked),
        "steady_max_latency_ms": float(steady.latency_max_ms.max()),
        "first_record_ms": (min(first) - asked) * 1e3 if first else float("nan"),
        "rescale_s": done - asked,
        "epochs": len(epochs),
        "moved_groups": sum(len(e["key_groups"]) for e in epochs),
        "phases_s": {k: v - asked for k, v in phases.items() if k not in ("asked", "snapshot_keys")},
        "snapshot_keys": phases.get("snapshot_keys"),
        # cores used on average by processes outside this benchmark while the job ran:
        # another job on the same cores shows in every latency figure
        "other_cpu_cores": max(0.0, (cpu1[0] - cpu0[0]) - (cpu1[1] - cpu0[1])) / (t1 - t0),
    }
    _say(f"{case}: max latency {out['max_latency_ms']:.0f} ms (steady {out['steady_max_latency_ms']:.0f} ms), "
         f"first record on a new instance {out['first_record_ms']:.0f} ms after the request, "
         f"{out['epochs']} epochs; other processes used {out['other_cpu_cores']:.2f} cores meanwhile")
    return out


def measure(path: str | None = None, key_groups: int | None = 256) -> dict:
    """Every case, each on a fresh 2-worker cluster: {case: figures}. ``key_groups=None``:
    the setting's default (``streamlb.key-groups``) instead of the benchmark's 256."""
    import streamlb

    path = path or zipf_dataset(ROWS, KEYS, 0.0, partitions=4)
    _say(f"streamlb from {os.path.dirname(streamlb.__file__)}")
    out = {}
    for case in CASES:
        cl, client = cluster(2)
        with cl, client:
            out[case] = _run(client, path, case, key_groups)
    return out


class Rescale(_OneShot):
    """Rescale a count holding 5M keys from 4 to 8 instances live (``lazy``, ``fluid``)
    against an emulated stop, snapshot and restart (see the module docstring)."""

    params = [CASES]
    param_names = ["strategy"]

    def setup_cache(self):
        return measure()

    def track_keys_held_at_rescale(self, r, strategy):
        return float(r[strategy]["held_keys"])

    track_keys_held_at_rescale.unit = "keys"

    def track_max_latency_during_rescale(self, r, strategy):
        return r[strategy]["max_latency_ms"]

    track_max_latency_during_rescale.unit = "ms"

    def track_stop_restart_max_latency_over_this(self, r, strategy):
        """Target ≥ 20 for ``lazy`` and ``fluid``; n/a for the baseline itself."""
        if strategy not in LIVE:
            return float("nan")
        return r["stop-restart"]["max_latency_ms"] / r[strategy]["max_latency_ms"]

    track_stop_restart_max_latency_over_this.unit = "ratio"

    def track_first_record_on_new_instance_after_request(self, r, strategy):
        """Target ≤ 1000 ms for ``lazy`` and ``fluid``."""
        return r[strategy]["first_record_ms"]

    track_first_record_on_new_instance_after_request.unit = "ms"

    def track_rescale_seconds(self, r, strategy):
        return r[strategy]["rescale_s"]

    track_rescale_seconds.unit = "s"


if __name__ == "__main__":      # python -m benchmarks.rescale [--default-key-groups], from asv_bench/
    import json

    print(json.dumps(measure(key_groups=None if "--default-key-groups" in sys.argv else 256), indent=1))
