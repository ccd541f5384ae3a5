"""Dataset preparation speed (issue 27): rows/s of ``streamlb.datasets.zipf`` writing a
Zipf(1.2) log with PySpark (``local[2]``) at 100k keys and at 14M keys, 16M rows in 4
partitions each (the rescale benchmark's shape). Goal: >= 1M rows/s at both."""
from __future__ import annotations

import shutil
import tempfile
import time

from ._common import _OneShot

ROWS = 16_000_000


def rows_per_second(keys: int, rows: int = ROWS, skew: float = 1.2, partitions: int = 4) -> float:
    """Rows/s of one ``datasets.zipf`` call into a fresh directory (the Spark session warm)."""
    from streamlb import datasets

    datasets.spark_session(2)
    out = tempfile.mkdtemp(prefix="streamlb-bench-zipf-")
    try:
        t0 = time.perf_counter()
        datasets.zipf(f"{out}/z", rows=rows, keys=keys, skew=skew, partitions=partitions, seed=0)
        return rows / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(out, ignore_errors=True)


class DatasetPreparation(_OneShot):
    timeout = 1800
    unit = "rows/s"

    def setup_cache(self):
        rows_per_second(100_000, rows=1_000_000)        # warm: JVM, Python workers, imports
        return {"100k": rows_per_second(100_000), "14M": rows_per_second(14_000_000)}

    def track_zipf_100k_keys(self, r):
        return r["100k"]

    def track_zipf_14M_keys(self, r):
        return r["14M"]


if __name__ == "__main__":
    rows_per_second(100_000, rows=1_000_000)
    for keys in (100_000, 14_000_000):
        print(f"zipf, {ROWS:,} rows, {keys:,} keys: {rows_per_second(keys):,.0f} rows/s", flush=True)
