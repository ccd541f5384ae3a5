"""Shuffle balancing of a stateless stage: ``osg`` against ``round_robin`` (and ``jsq``).

Records carry a content-dependent cost: ``kind = key % 64`` and each kind costs a fixed,
log-normally drawn service time (sigma 1), scaled so that a record costs 25 us on average.
8 instances on 2 workers (capacity 320k records/s), open-loop source at 200k records/s,
batches of 8,192 rows. Completion time is the latency of each record (source emission to
processed), from the job's metrics: mean (records-weighted) and an approximate p99 (the
records-weighted 99th percentile of the per-window p99s). Target: osg mean <= 0.7 x
round_robin.
"""
from __future__ import annotations

import numpy as np

from ._common import _OneShot, cluster, zipf_dataset

ROWS, KEYS, SKEW = 3_200_000, 100_000, 1.0
RATE, N, BATCH, KINDS, MEAN_COST = 200_000, 8, 8_192, 64, 25e-6
BALANCERS = ["round_robin", "jsq", "osg"]


def _costs(path):
    import pandas as pd

    kind = pd.read_parquet(path, columns=["key"])["key"].to_numpy() % KINDS
    freq = np.bincount(kind, minlength=KINDS) / len(kind)
    raw = np.exp(np.random.default_rng(0).normal(0.0, 1.0, KINDS))
    return raw * MEAN_COST / (freq * raw).sum()


def _run(client, path, balancer, costs):
    from streamz import Stream

    import streamlb

    def with_cost(df):
        kind = df["key"].to_numpy() % KINDS
        return df.assign(kind=kind, secs=costs[kind])

    src = Stream.from_parquet(path, batch_size=BATCH, rate=RATE, columns=["key", "value"])
    src.map(with_cost).rebalance(parallelism=N, balancer=balancer, feature="kind", cost="secs")
    with streamlb.run(src, client=client, window="250ms") as job:
        job.wait()
        m = job.metrics()
    r = m[(m.operator == "rebalance") & (m.records > 0)]
    w = r.records.to_numpy(float)
    p99 = r.latency_p99_ms.to_numpy()
    order = np.argsort(p99)
    cum = np.cumsum(w[order]) / w.sum()
    return {"mean_ms": float((r.latency_mean_ms * w).sum() / w.sum()),
            "p99_ms": float(p99[order][np.searchsorted(cum, 0.99)])}


class ShuffleBalancing(_OneShot):
    params = [BALANCERS]
    param_names = ["balancer"]

    def setup_cache(self):
        path = zipf_dataset(ROWS, KEYS, SKEW, partitions=8)
        costs = _costs(path)
        cl, client = cluster(2)
        with cl, client:
            return {b: _run(client, path, b, costs) for b in BALANCERS}

    def track_mean_completion_ms(self, r, balancer):
        return r[balancer]["mean_ms"]

    track_mean_completion_ms.unit = "ms"

    def track_p99_completion_ms(self, r, balancer):
        return r[balancer]["p99_ms"]

    track_p99_completion_ms.unit = "ms"

    def track_mean_completion_vs_round_robin(self, r, balancer):
        return r[balancer]["mean_ms"] / r["round_robin"]["mean_ms"]

    track_mean_completion_vs_round_robin.unit = "ratio"
