"""End-to-end throughput on 5M rows of Zipf(1.2) over 100k keys, Parquet source,
2 worker processes (targets: aggregate >= 10M records/s, stateful_map >= 1M records/s)."""
from __future__ import annotations

from ._common import _OneShot, cluster, median_rate, quiet, zipf_dataset

ROWS, KEYS, SKEW = 5_000_000, 100_000, 1.2
BATCH = 131_072


def _noop(state, record):
    return state, None


def _build(path: str, op: str):
    from streamz import Stream

    src = Stream.from_parquet(path, batch_size=BATCH)
    keyed = src.key_by("key")
    if op == "aggregate":
        keyed.aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="totals")
    else:
        keyed.stateful_map(_noop, name="noop")
    return src


class Throughput(_OneShot):
    timeout = 900
    unit = "records/s"

    def setup_cache(self):
        return zipf_dataset(ROWS, KEYS, SKEW)

    def track_aggregate(self, path):
        cl, client = cluster(2)
        with cl, client:
            return median_rate(client, lambda: _build(path, "aggregate"))

    track_aggregate.unit = "records/s"

    def track_stateful_map(self, path):
        cl, client = cluster(2)
        with cl, client:
            return median_rate(client, lambda: _build(path, "stateful_map"))

    track_stateful_map.unit = "records/s"


def main(argv=None) -> None:
    """``python -m benchmarks.throughput --op aggregate|stateful_map``: one of the two figures
    above (a fresh 2-worker cluster, a warm-up, the median of three jobs) as a JSON line,
    after waiting for a quiet machine (``asv_bench/ab.py --bench throughput`` runs it with two
    commits alternating)."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    p.add_argument("--op", default="aggregate", choices=["aggregate", "stateful_map"])
    a = p.parse_args(argv)
    path = zipf_dataset(ROWS, KEYS, SKEW)
    quiet()
    cl, client = cluster(2)
    with cl, client:
        print(json.dumps({"records_per_second": median_rate(client, lambda: _build(path, a.op))}), flush=True)


if __name__ == "__main__":
    main()
