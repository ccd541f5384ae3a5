"""The balancer simulator: replay speed, and agreement with a real job.

- replay of 10,000 windows x 1,024 key groups through ``autoflow`` (target: < 10 s);
- a job balanced by ``autoflow`` on the drifting-Zipf data of ``balancing.py`` (skew 1.0)
  records its load trace; the trace replayed through ``autoflow`` must give a mean imbalance
  within 10% of the one the job measured (whole windows only).
"""
from __future__ import annotations

import time

from ._common import _OneShot, cluster, zipf_dataset
from .balancing import DRIFT, KEYS, N, RATE, ROWS, WINDOW


class Simulator(_OneShot):
    timeout = 1200

    def setup_cache(self):
        from streamz import Stream

        import streamlb
        from streamlb.simulator import simulate, zipf_trace

        trace = zipf_trace(10_000, 1_024, 8, skew=1.0, drift_every=100, seed=0)
        t0 = time.perf_counter()
        simulate(trace, "autoflow")
        replay = time.perf_counter() - t0

        path = zipf_dataset(ROWS, KEYS, 1.0, partitions=8, drift_every=DRIFT)
        cl, client = cluster(2)
        with cl, client:
            src = Stream.from_parquet(path, batch_size=10_000, rate=RATE, event_time="event_time")
            src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=N, name="agg")
            with streamlb.run(src, client=client, key_groups=256, window=WINDOW, balancer="autoflow") as job:
                job.wait()
                recorded = job.load_trace("agg")
        full = recorded.loads.sum(axis=1) > 0.8 * RATE * WINDOW
        sim = simulate(recorded, "autoflow")["imbalance"].to_numpy()
        measured = float(recorded.measured[full].mean())
        return {"replay_s": replay, "measured": measured, "simulated": float(sim[full].mean())}

    def track_replay_seconds_10k_windows_1024_groups_autoflow(self, r):
        return r["replay_s"]

    track_replay_seconds_10k_windows_1024_groups_autoflow.unit = "s"

    def track_recorded_job_mean_imbalance(self, r):
        return r["measured"]

    track_recorded_job_mean_imbalance.unit = "max/mean"

    def track_simulated_mean_imbalance(self, r):
        return r["simulated"]

    track_simulated_mean_imbalance.unit = "max/mean"

    def track_simulated_vs_measured_relative_error(self, r):
        return abs(r["simulated"] - r["measured"]) / r["measured"]

    track_simulated_vs_measured_relative_error.unit = "ratio"
