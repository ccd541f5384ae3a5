"""A join's state store alone (``streamlb._state._joins.JoinState``): taking rows in, and
cutting key groups out of it as a move in small steps does.

One side takes ``ROWS`` rows in batches of ``BATCH`` (bid-like columns: an int key over 10M
values, two ints, two text columns), then ``CUTS`` cuts of 4 of its 1,024 key groups each
(a ``fluid`` epoch of 4 groups). Figures: seconds to take the rows in (rows/s), and the
median milliseconds of a cut.

``python -m benchmarks.joinstate [--rows N] [--runs R]`` (from ``asv_bench/``) prints one JSON
line per run; run it with another commit's ``streamlb`` first on ``PYTHONPATH`` to compare
(the store's constructor and ``update``/``cut`` are the same since session 24).
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ._common import _OneShot

ROWS, BATCH, GROUPS, CUTS = 1_200_000, 4_000, 1024, 8


def _store():
    from streamlb._state._joins import JoinState

    spec = {"how": "inner", "between": None, "ttl": None, "key_names": ["auction", "id"],
            "suffixes": ("_x", "_y")}
    return JoinState("bench", spec, GROUPS)


def _batches(rows: int, seed: int = 0):
    import pandas as pd

    rng = np.random.default_rng(seed)
    channels = np.array(["apple", "google", "facebook", "baidu"], object)
    urls = np.array([f"https://www.nexmark.com/item.htm?query={i}" for i in range(BATCH)], object)
    for b in range(rows // BATCH):
        yield b, pd.DataFrame({"auction": rng.integers(0, 10_000_000, BATCH), "bidder": rng.integers(0, 100_000, BATCH),
                               "price": rng.integers(1, 10_000, BATCH), "channel": channels[rng.integers(0, 4, BATCH)],
                               "url": urls[rng.permutation(BATCH)]})


def run(rows: int = ROWS) -> dict:
    """One store: rows/s taken in, and the median ms of :data:`CUTS` cuts of 4 groups."""
    store = _store()
    batches = list(_batches(rows))
    t0 = time.perf_counter()
    for b, frame in batches:
        store.update(frame, times=np.full(len(frame), b, np.int64), side=0)
    took = time.perf_counter() - t0
    cuts = []
    for c in range(CUTS):
        t = time.perf_counter()
        store.cut(list(range(4 * c, 4 * c + 4)))
        cuts.append((time.perf_counter() - t) * 1e3)
    return {"rows": rows, "take_in_rows_per_second": rows / took, "cut_ms": statistics.median(cuts),
            "chunks": len(store.sides[0])}


class JoinStateStore(_OneShot):
    timeout = 300

    def setup_cache(self):
        return run()

    def track_take_in_rows_per_second(self, r):
        return r["take_in_rows_per_second"]

    track_take_in_rows_per_second.unit = "rows/s"

    def track_cut_4_groups_ms(self, r):
        return r["cut_ms"]

    track_cut_4_groups_ms.unit = "ms"


def main(argv=None) -> None:
    import argparse
    import json

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    for _ in range(a.runs):
        print(json.dumps(run(a.rows)), flush=True)


if __name__ == "__main__":
    main()
