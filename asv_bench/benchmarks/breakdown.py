"""Where a record's time goes, stage by stage (issue 27), in the worker processes of a job.

``python -m benchmarks.breakdown`` (from ``asv_bench/``) runs a keyed count and sum (or,
with ``--op stateful_map``, a count and sum per record in a Python function) over the Zipf
log of ``--rows`` rows on 2 worker processes at streamlb's defaults: first unprofiled, for
its seconds and each worker's CPU seconds and page faults; then once more while py-spy
samples both workers. Each sample of a worker's event loop is put in the stage of the
innermost frame a rule below knows (combine, hash and route, split per destination,
serialise and send, receive and order, key index, state update, user function,
bookkeeping), idle when the loop waits; a sample of a source's reader thread at work (it
reads and decodes one batch ahead) is "read and decode". The table gives each stage's
share of the busy samples and, from the unprofiled run's CPU time, its nanoseconds per
record.

Needs py-spy (``pip install 'streamlb[bench]'``) and the right to attach to the workers
(root, or ``kernel.yama.ptrace_scope=0``).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

from ._common import cluster, markdown_table, zipf_dataset

KEYS, SKEW = 100_000, 1.2

# (stage, patterns): a sample goes to the stage of the innermost frame matching a pattern
# (a frame reads "Class.function (file.py)"); rules earlier in the list win at one frame
STAGES = [
    ("idle", (r"^EpollSelector\.select ", r"^select ", r"^BaseSelector")),
    ("read and decode", (r"_parquet\.py\)", r"^SplitReader\.poll ", r"^_skipping ")),
    ("combine per key", (r"^Combiner\.", r"_combine\.py\)")),
    ("key index", (r"^_KeyIndex\.", r"_index\.py\)")),
    ("user function", (r"^StatefulMapState\.update ", r"_stateful_map\.py\)")),
    ("state update", (r"_aggregate\.py\)", r"_shards\.py\)", r"^Aggregate\.output ", r"^StatefulMap\.output ")),
    ("hash and route", (r"^assign_to_key_group ", r"^stable_hash", r"keygroups\.py\)", r"routing\.py\)",
                        r"^bad_keys ", r"^KeyedRouter\._keys ")),
    ("split per destination", (r"\.take ", r"^take ")),
    ("serialise and send", (r"^OutChannel\.", r"\.write", r"^dumps ", r"^serialize", r"^to_frames ",
                            r"^pickle_dumps", r"^_encode_default")),
    ("receive and order", (r"^Inbox\.", r"\.read", r"^loads ", r"^deserialize", r"^from_frames ",
                           r"^pickle_loads", r"^_decode_default", r"^Instance\.receive")),
    ("bookkeeping", (r"\(streamlb/",)),
]
_COMPILED = [(name, [re.compile(p) for p in pats]) for name, pats in STAGES]
LOOP = re.compile(r"^BaseEventLoop\.run_forever ")


def frame_name(frame: str) -> str:
    """py-spy's ``function (path:line)`` as ``function (file.py)`` (streamlb's own files keep
    ``streamlb/`` in front, so the bookkeeping rule can tell them from the libraries')."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    func, path = m.groups()
    base = os.path.basename(path)
    return f"{func} (streamlb/{base})" if "/streamlb/" in path else f"{func} ({base})"


READER = re.compile(r"_parquet\.py\)|_sources\.py\)|pyarrow")


def stage_of(frames: list[str]) -> str | None:
    """The stage of one sample (its frames root first); None for a thread that is neither
    the event loop nor a source's reader thread at work (Dask's own threads, idle ones)."""
    names = [frame_name(f) for f in frames]
    if not any(LOOP.match(n) for n in names):
        # the source reads and decodes one batch ahead in a thread of its own
        return "read and decode" if any(READER.search(n) for n in names) else None
    for n in reversed(names):
        for stage, pats in _COMPILED:
            if any(p.search(n) for p in pats):
                return stage
    return "dask and tornado"


def classify(raw_lines) -> collections.Counter:
    """Samples per stage of py-spy's ``--format raw`` output (``a;b;c count`` lines)."""
    out: collections.Counter = collections.Counter()
    for line in raw_lines:
        line = line.rstrip("\n")
        if not line or " " not in line:
            continue
        stack, count = line.rsplit(" ", 1)
        stage = stage_of(stack.split(";"))
        if stage is not None:
            out[stage] += int(count)
    return out


def _usage():
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def _job(client, path: str, op: str) -> tuple[float, object]:
    """One run of the job: seconds from ``run()`` to ``wait()``'s return, and its state."""
    from streamz import Stream

    import streamlb

    src = Stream.from_parquet(path)
    keyed = src.key_by("key")
    if op == "aggregate":
        keyed.aggregate({"count": ("value", "count"), "sum": ("value", "sum")}, name="out")
    else:
        keyed.stateful_map(count_and_sum, name="out")
    t0 = time.perf_counter()
    job = streamlb.run(src, client=client)
    try:
        job.wait()
        return time.perf_counter() - t0, job.state("out")
    finally:
        job.stop()


def count_and_sum(state, record):
    """The ``stateful_map`` of the issue: a count and a sum per key, the pair emitted."""
    n, s = state or (0, 0.0)
    n, s = n + 1, s + record["value"]
    return (n, s), None


def breakdown(rows: int, op: str, rate: int = 250, out=sys.stdout) -> dict:
    path = zipf_dataset(rows, KEYS, SKEW, 16 if rows >= 40_000_000 else 8)
    cl, client = cluster(2)
    with cl, client:
        pids = client.run(os.getpid)
        _job(client, path, op)                       # warm-up
        before = client.run(_usage)
        seconds, _ = _job(client, path, op)
        after = client.run(_usage)
        cpu = sum(after[w][0] - before[w][0] for w in pids)
        faults = sum(after[w][1] - before[w][1] for w in pids)
        with tempfile.TemporaryDirectory() as tmp:
            spies = [subprocess.Popen(["py-spy", "record", "-p", str(pid), "-r", str(rate), "-f", "raw",
                                       "-o", os.path.join(tmp, f"{pid}.txt"), "--nonblocking", "--idle"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for pid in pids.values()]
            time.sleep(1.0)                          # py-spy attached
            profiled, _ = _job(client, path, op)
            for s in spies:
                s.send_signal(2)                     # SIGINT: py-spy writes what it sampled
            for s in spies:
                s.wait(timeout=60)
            counts: collections.Counter = collections.Counter()
            for pid in pids.values():
                with open(os.path.join(tmp, f"{pid}.txt")) as f:
                    counts += classify(f)
    busy = sum(c for s, c in counts.items() if s != "idle")
    result = {"rows": rows, "op": op, "seconds": seconds, "cpu": cpu, "faults": faults, "profiled": profiled,
              "samples": dict(counts)}
    print(f"{op} over {rows:,} rows: {seconds:.2f} s unprofiled ({rows / seconds / 1e6:.1f}M rec/s), workers' CPU "
          f"{cpu:.2f} s, {faults:,} page faults; {profiled:.2f} s under py-spy ({sum(counts.values()):,} samples "
          f"of the workers' event loops and reader threads)", file=out)
    table = []
    for stage, _ in STAGES[1:] + [("dask and tornado", ())]:
        c = counts.get(stage, 0)
        table.append([stage, f"{c / max(busy, 1):.1%}", f"{cpu * c / max(busy, 1) / rows * 1e9:.1f}"])
    table.append(["(event loop idle)", f"{counts.get('idle', 0):,} samples", ""])
    markdown_table(["stage", "share of busy samples", "ns per record (of the CPU time)"], table, out)
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=40_000_000)
    ap.add_argument("--op", choices=("aggregate", "stateful_map"), default="aggregate")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    args = ap.parse_args(argv)
    breakdown(args.rows, args.op, args.rate)


if __name__ == "__main__":
    main()
