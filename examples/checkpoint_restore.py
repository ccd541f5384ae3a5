"""Checkpoint a keyed aggregate, take a savepoint midway, then restore it at another parallelism.

The first job checkpoints every 0.5 s and takes a savepoint halfway through the stream; it
runs to the end. A second job, built from the same graph, starts from the savepoint with 3
instances of the aggregate instead of 2 and replays only the rows after the savepoint. Its
final state must equal pandas over the whole input: every row counted exactly once.

Run: python examples/checkpoint_restore.py [output-dir]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np
import pandas as pd
from streamz import Stream

import streamlb

ROWS, FILES, RATE = 200_000, 2, 50_000         # a 4 s stream
SPEC = {"events": ("value", "count"), "total": ("value", "sum"), "largest": ("value", "max")}


def write_events(path: str) -> None:
    """Skewed integer keys with a value each, in a few Parquet files."""
    rng = np.random.default_rng(1)
    os.makedirs(path, exist_ok=True)
    for i in range(FILES):
        n = ROWS // FILES
        pd.DataFrame({"key": rng.zipf(1.5, n) % 5_000, "value": rng.random(n)}).to_parquet(
            f"{path}/part-{i}.parquet")


def build(path: str, parallelism: int) -> Stream:
    """The graph; a restore needs the same operators, keys, aggregates and input files."""
    source = Stream.from_parquet(path, rate=RATE, batch_size=5_000)
    source.key_by("key").aggregate(SPEC, name="per_key", parallelism=parallelism)
    return source


def main(workdir: str) -> int:
    path, ckpt, sp = f"{workdir}/events", f"{workdir}/ckpt", f"{workdir}/sp"
    write_events(path)
    truth = pd.read_parquet(path).groupby("key").agg(**SPEC)

    # 1. a checkpointed run, with a savepoint about halfway through
    with streamlb.run(build(path, 2), n_workers=2, key_groups=128,
                      checkpoint=ckpt, checkpoint_interval=0.5) as job:
        deadline = time.time() + 30
        while sum(job.offsets().values()) < ROWS // 2:
            if time.time() > deadline:
                raise TimeoutError(f"job {job.id} read {sum(job.offsets().values()):,} rows in 30 s")
            time.sleep(0.05)
        t = time.time()
        where = job.savepoint(sp)
        print(f"savepoint written to {where} in {time.time() - t:.2f} s")
        job.wait(timeout=60)
        first = job.state("per_key")
        table = job.checkpoints()
        failures = job.checkpoint_failures

    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table[["id", "kind", "duration", "bytes_written", "bytes_referenced", "keys", "full"]])

    # the savepoint's manifest says how many rows each source had emitted at its barrier
    with open(os.path.join(sp, "_manifest.json")) as fh:
        positions = json.load(fh)["sources"]
    at_savepoint = sum(n for instances in positions.values() for p in instances
                       for n in (p.get("files") or {}).values())
    print(f"the sources had emitted {at_savepoint:,} of {ROWS:,} rows at the savepoint")

    # 2. the same graph, restored from the savepoint with 3 instances of the aggregate
    with streamlb.run(build(path, 3), n_workers=2, key_groups=128, restore=sp) as job:
        job.wait(timeout=60)
        restored = job.state("per_key")
        replayed = job.summary()["records"]       # rows the restored job's sources emitted
        instances = job.parallelism("per_key")

    errors = []
    for label, state in [("the checkpointed run", first), ("the restored run", restored)]:
        try:
            pd.testing.assert_frame_equal(state.sort_index(), truth, check_dtype=False)
        except AssertionError as exc:
            errors.append(f"{label}: final state differs from pandas: {exc}")
    if failures:
        errors.append(f"{failures} checkpoint(s) failed")
    if not (table.kind == "checkpoint").any() or (table.kind == "savepoint").sum() != 1:
        errors.append(f"expected checkpoints and one savepoint, got kinds {table.kind.tolist()}")
    if not 0 < at_savepoint < ROWS:
        errors.append(f"the savepoint was not taken midway: {at_savepoint} rows emitted")
    if replayed != ROWS - at_savepoint:
        errors.append(f"the restored job emitted {replayed:,} rows; "
                      f"{ROWS - at_savepoint:,} came after the savepoint")
    if instances != 3:
        errors.append(f"the restored aggregate runs as {instances} instances, not 3")
    if errors:
        print("FAILED:\n" + "\n".join(errors), file=sys.stderr)
        return 1
    print(f"restored at 3 instances, replaying the {replayed:,} rows after the savepoint; "
          f"final state of {len(restored):,} keys equals pandas")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="streamlb-example-")))
