"""End-to-end throughput on 5M rows of Zipf(1.2) over 100k keys, Parquet source,
2 worker processes (targets: aggregate >= 10M records/s, stateful_map >= 1M records/s)."""
from __future__ import annotations

from ._common import _OneShot, cluster, median_rate, zipf_dataset

ROWS, KEYS, SKEW = 5_000_000, 100_000, 1.2
BATCH = 131_072


def _noop(state, record):
    return state, None


class Throughput(_OneShot):
    timeout = 900
    unit = "records/s"

    def setup_cache(self):
        return zipf_dataset(ROWS, KEYS, SKEW)

    def track_aggregate(self, path):
        from streamz import Stream

        def build():
            src = Stream.from_parquet(path, batch_size=BATCH)
            src.key_by("key").aggregate({"count": ("value", "count"), "sum": ("value", "sum")},
                                        name="totals")
            return src

        cl, client = cluster(2)
        with cl, client:
            return median_rate(client, build)

    track_aggregate.unit = "records/s"

    def track_stateful_map(self, path):
        from streamz import Stream

        def build():
            src = Stream.from_parquet(path, batch_size=BATCH)
            src.key_by("key").stateful_map(_noop, name="noop")
            return src

        cl, client = cluster(2)
        with cl, client:
            return median_rate(client, build)

    track_stateful_map.unit = "records/s"
