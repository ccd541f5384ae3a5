"""The Kafka throughput figures in one sitting: streamlb, a plain confluent-kafka consume
loop and Bytewax, alternating (docs/kafka.md, "Throughput"; ``benchmarks/kafka.py`` says
what each one does).

One noida-db broker process and one topic of ``--rows`` records (4 partitions), produced
once; one warm cluster of 2 worker processes; an untimed streamlb run; then ``--rounds``
rounds (default 3) of streamlb, the consume loop and Bytewax in that order. Every run's
totals are checked against pandas over the produced records (exit code 1 if one differs).
Prints a line per run, a table, the medians and the median over rounds of streamlb's
records/s over each other's, and one JSON line with every figure. ``CPU s`` is what this
process and its children used during a run (the system measured, the broker, the cluster
idle or busy); ``other cores`` is what other processes used meanwhile: figures are only
worth keeping when it is near 0.

Run from the repository (the ``bench`` and ``test`` extras: Bytewax, confluent-kafka,
noida-db)::

    PYTHONPATH=. python asv_bench/kafka_sitting.py --rows 50000 --rounds 1    # a check
    PYTHONPATH=. python asv_bench/kafka_sitting.py                            # the figures
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main() -> int:
    from benchmarks import kafka

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=kafka.ROWS)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    t0 = time.perf_counter()

    def report(run: dict) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] round {run['round'] + 1}/{args.rounds} {run['system']:<12} "
              f"{run['rate']:>11,.0f} records/s  wall {run['wall']:5.2f} s  CPU {run['cpu']:5.2f} s  "
              f"other cores {run['other_cores']:.2f}",
              flush=True)

    print(f"producing {args.rows:,} records into 4 partitions, then a warm-up run of streamlb", flush=True)
    try:
        runs = kafka.sitting(args.rounds, args.rows, report=report)
    except AssertionError as e:
        print(f"WRONG: {e}", flush=True)
        return 1
    print()
    print(f"{'round':>5}  {'system':<12} {'records/s':>11}  {'wall s':>6}  {'CPU s':>6}  {'other cores':>11}")
    for r in runs:
        print(f"{r['round'] + 1:>5}  {r['system']:<12} {r['rate']:>11,.0f}  {r['wall']:>6.2f}  {r['cpu']:>6.2f}  "
              f"{r['other_cores']:>11.2f}")
    print()
    medians = {s: statistics.median(r["rate"] for r in runs if r["system"] == s) for s in kafka.SYSTEMS}
    for s, m in medians.items():
        print(f"median {s:<12} {m:>11,.0f} records/s")
    out = {"commit": commit, "rows": args.rows, "runs": runs, "medians": medians}
    for over, goal in (("consume_loop", 0.8), ("bytewax", 5.0)):
        per_round = kafka.ratios(runs, over)
        out[f"over_{over}"] = statistics.median(per_round)
        print(f"streamlb / {over}: median {out[f'over_{over}']:.2f}x (goal >= {goal}x), per round "
              + ", ".join(f"{x:.2f}" for x in per_round))
    print("all totals equal pandas over the produced records")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
