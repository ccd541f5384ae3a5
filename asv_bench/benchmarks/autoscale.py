"""Autoscaling with ``ds2``: a step up in the input rate, then a step down.

One keyed count with an emulated cost of COST seconds per record (so one instance manages
1/COST records/s, whatever the machine), fed by an open-loop source replaying event time:
the log is dense in its middle part, so the offered rate steps LOW -> HIGH -> LOW records/s
(PHASES). The job starts with 2 instances and ``autoscale={"n": (1, MAX)}`` at the default
scaler settings (target utilisation 0.7, cool-down 5 s, catch-up 10 s), on a LocalCluster
of 2 worker processes.

Figures: how many scale-out decisions after the step up it took to reach a parallelism
that keeps up (parallelism / COST >= HIGH; target <= 2), the parallelism reached, whether
it scaled back in after the step down (the last parallelism below the peak: 1 = yes), and
the peak latency. The data are made by numpy here (no PySpark): they are tiny.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from ._common import _OneShot, cluster

COST = 1 / 2000                         # seconds per record: 2,000 records/s per instance
PHASES = [(12.0, 2_500), (8.0, 12_000), (14.0, 2_000)]    # (seconds, offered records/s)
MAX = 12


def _say(msg: str) -> None:
    print(f"[autoscale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _log(folder: str) -> tuple[str, float]:
    """A log whose replay at its mean rate offers PHASES: event time = wall seconds."""
    import pandas as pd

    t, t0 = [], 0.0
    for secs, rate in PHASES:
        n = int(secs * rate)
        t.append(t0 + np.arange(n) / rate)
        t0 += secs
    t = np.concatenate(t)
    rng = np.random.default_rng(0)
    path = os.path.join(folder, "step.parquet")
    pd.DataFrame({"key": rng.integers(0, 20_000, len(t)), "value": rng.random(len(t)), "t": t}).to_parquet(path)
    return path, len(t) / t0


def measure() -> dict:
    import streamlb
    from streamz import Stream

    with tempfile.TemporaryDirectory() as tmp:
        path, mean_rate = _log(tmp)
        cl, client = cluster(2)
        try:
            src = Stream.from_parquet(path, batch_size=1000, rate=mean_rate, event_time="t")
            src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=2, name="n", cost=COST)
            t0 = time.time()
            with streamlb.run(src, client=client, autoscale={"n": (1, MAX)}) as job:
                while True:
                    try:
                        job.wait(timeout=2)
                        break
                    except TimeoutError:
                        _say(f"{time.time() - t0:5.1f} s: {job.parallelism('n')} instances")
                decisions = [h for h in job.history if h.get("kind") == "autoscale" and h["status"] == "done"]
                m = job.metrics()
        finally:
            client.close()
            cl.close()
    step_up = PHASES[0][0]
    after = [d for d in decisions if d["completed"] - t0 >= step_up - 1.0]
    keeps_up = [i for i, d in enumerate(after) if d["to"] / COST >= PHASES[1][1]]
    peak = max((d["to"] for d in decisions), default=2)
    out = {
        "decisions_to_keep_up": (keeps_up[0] + 1) if keeps_up else float("nan"),
        "peak_parallelism": peak,
        "scaled_back_in": float(bool(decisions) and decisions[-1]["to"] < peak),
        "max_latency_ms": float(m[m.operator == "n"].latency_max_ms.max()),
        "decisions": [(round(d["completed"] - t0, 1), d["from"], d["to"]) for d in decisions],
    }
    _say(f"decisions (s, from, to): {out['decisions']}")
    return out


class Autoscale(_OneShot):
    """ds2 on a step in the offered rate (see the module docstring)."""

    def setup_cache(self):
        return measure()

    def track_decisions_to_keep_up(self, r):
        return r["decisions_to_keep_up"]

    track_decisions_to_keep_up.unit = "decisions"

    def track_peak_parallelism(self, r):
        return r["peak_parallelism"]

    track_peak_parallelism.unit = "instances"

    def track_scaled_back_in(self, r):
        return r["scaled_back_in"]

    track_scaled_back_in.unit = "1 = yes"

    def track_max_latency(self, r):
        return r["max_latency_ms"]

    track_max_latency.unit = "ms"


if __name__ == "__main__":
    print(measure())
