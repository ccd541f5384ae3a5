"""The WindowedAggregate figures in one sitting, streamlb and Spark Structured Streaming
alternating twice, then Bytewax and the latency (docs/benchmarks.md, ``windows.py``).

Run from the repository: ``python asv_bench/windows_sitting.py`` (the ``bench`` extra).
Prints each figure as it comes and one JSON line at the end.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from benchmarks import windows as w

    path = w._path()
    here = os.path.dirname(os.path.abspath(__file__))
    out = {"commit": subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()}
    for r in range(2):
        out[f"streamlb_{r}"] = w.streamlb_rate(path, runs=2)
        print("streamlb records/s (defaults)", out[f"streamlb_{r}"], flush=True)
        out[f"streamlb4_{r}"] = w.streamlb_rate(path, runs=2, parallelism=4)
        print("streamlb records/s (4 window instances)", out[f"streamlb4_{r}"], flush=True)
        out[f"spark_{r}"] = w.spark_rate(path, runs=2)
        print("Spark SS records/s", out[f"spark_{r}"], flush=True)
        print("ratio", out[f"streamlb_{r}"] / out[f"spark_{r}"], flush=True)
    out["bytewax"] = w.bytewax_rate(path)
    print("Bytewax records/s", out["bytewax"], flush=True)
    out["p50_ms"], out["p99_ms"] = w.latencies(path)
    print("window row latency p50, p99 (ms)", out["p50_ms"], out["p99_ms"], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
