"""Faults beyond one lost worker (issue 49), caused for real: a network partition between two
workers, a frozen worker, two workers killed at once.

The cluster is a `dask scheduler` and three `dask worker` processes, each worker in a network
namespace of its own (tests/_faults.py, ``NetnsCluster``), so that the link between two of
them can be cut while both still reach the scheduler and the driver; where namespaces cannot
be made (not root, no ``ip``), a ``LocalCluster`` stands in and the partition test skips.
Every job is checkpointed, reads Parquet at a fixed rate into a keyed aggregate, a
``stateful_map`` and ``to_parquet``; each is checked exactly against pandas (state, each
record emitted once, each row written once).
"""
from __future__ import annotations

import itertools
import os
import time

import dask
import numpy as np
import pandas as pd
import pytest

import streamlb
from streamlb._recovery._reach import EXACT_UP_TO, largest_linked_set

from _faults import LocalFaultCluster, NetnsCluster, netns_unavailable
from test_checkpoint import build, check_exact

#: The workers' ``distributed.comm.timeouts.tcp`` (TCP_USER_TIMEOUT: how long unacknowledged
#: data may wait before the kernel fails the connection; Dask's least is 11 s) and
#: ``.connect`` (a new connection into the partition). Both are 30 s by default, and a
#: partition is then recovered from ~32 s after the cut.
TCP_TIMEOUT = 12
#: How long the partition test cuts the link: longer than the TCP timeout, as in issue 49.
PARTITION = 35
HEARTBEAT = 5       # s: streamlb.fault.heartbeat-timeout in the frozen worker's test


# -- which workers a recovery keeps (a pure function; the probe is exercised below) ----------
def _cut(*pairs) -> dict[str, set[str]]:
    """Unreached peers for links cut both ways."""
    out: dict[str, set[str]] = {}
    for a, b in pairs:
        out.setdefault(a, set()).add(b)
        out.setdefault(b, set()).add(a)
    return out


def test_the_largest_set_of_workers_that_reach_each_other_is_kept():
    ws = ["a", "b", "c", "d"]
    assert largest_linked_set(ws, {}) == ws
    assert largest_linked_set(ws, _cut(("a", "b"))) in (["a", "c", "d"], ["b", "c", "d"])
    # one direction is enough to cut a link
    assert largest_linked_set(["a", "b", "c"], {"c": {"a"}}) == ["a", "b"]
    # a worker cut off from all: the others; two halves: the first half in sorted order
    assert largest_linked_set(ws, _cut(("d", "a"), ("d", "b"), ("d", "c"))) == ["a", "b", "c"]
    assert largest_linked_set(ws, _cut(("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"))) == ["a", "b"]
    assert largest_linked_set(["a", "b"], _cut(("a", "b"))) == ["a"]
    assert largest_linked_set([], {}) == []


def test_a_tie_goes_to_the_set_holding_more_of_the_current_workers():
    halves = _cut(("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"))
    assert largest_linked_set("abcd", halves, current=["c", "d"]) == ["c", "d"]
    assert largest_linked_set("abcd", halves, current=["a", "c", "d"]) == ["c", "d"]
    assert largest_linked_set(["a", "b"], _cut(("a", "b")), current=["b"]) == ["b"]
    # size first: a larger set of new workers beats a smaller one of current workers
    assert largest_linked_set("abc", _cut(("a", "b"), ("a", "c")), current=["a"]) == ["b", "c"]


def _clique(nodes, cut) -> bool:
    return all(b not in cut.get(a, ()) and a not in cut.get(b, ()) for a, b in itertools.combinations(nodes, 2))


@pytest.mark.parametrize("seed", range(40))
def test_the_exact_search_finds_a_largest_set_and_the_greedy_one_a_valid_one(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(1, EXACT_UP_TO) if seed % 2 else rng.randint(EXACT_UP_TO + 1, 30)
    ws = [f"w{i:02d}" for i in range(n)]
    cut = _cut(*[p for p in itertools.combinations(ws, 2) if rng.random() < 0.3])
    kept = largest_linked_set(ws, cut, current=ws[: n // 2])
    assert kept and _clique(kept, cut) and kept == sorted(kept) and set(kept) <= set(ws)
    # nothing can be added to it
    assert not [w for w in ws if w not in kept and _clique(kept + [w], cut)]
    if n <= 9:      # against every subset, by brute force here too
        best = max(len(g) for k in range(1, n + 1) for g in itertools.combinations(ws, k) if _clique(g, cut))
        assert len(kept) == best


# -- on real processes ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    """Three workers in network namespaces of their own, or a LocalCluster where namespaces
    cannot be made (the partition test then skips, saying why)."""
    if netns_unavailable():
        made = LocalFaultCluster(3)
    else:
        made = NetnsCluster(3, env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": f"{TCP_TIMEOUT}s",
                                    "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": f"{TCP_TIMEOUT}s"})
    with made:
        yield made


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three Parquet files, 90k rows of Zipf-distributed keys; ``rid`` numbers every row."""
    root = tmp_path_factory.mktemp("fault-data")
    rng = np.random.default_rng(49)
    n = 30_000
    frames = [pd.DataFrame({"key": (rng.zipf(1.3, n) % 2_000).astype(np.int64), "value": rng.integers(0, 100, n),
                            "rid": np.arange(n) + i * n}) for i in range(3)]
    for i, df in enumerate(frames):
        df.to_parquet(root / f"part-{i}.parquet")
    return str(root), pd.concat(frames, ignore_index=True)


def _start(cluster, data, tmp_path, rate):
    """A checkpointed job at ``rate`` records/s, once its first checkpoint holding keys is
    complete: the job, the input, the ``stateful_map``'s outputs and the output directory."""
    path, frame = data
    cluster.wait_for_workers()
    out = str(tmp_path / "out")
    src, outs = build(path, out, rate=rate, batch_size=1_000)
    job = streamlb.run(src, client=cluster.client, checkpoint=str(tmp_path / "ck"), checkpoint_interval="1s")
    deadline = time.time() + 60
    while time.time() < deadline:
        done = job.checkpoints()
        if len(done) and done["keys"].iloc[-1] > 0:
            return job, frame, outs, out
        time.sleep(0.05)
    job.stop()
    pytest.fail(f"no checkpoint holding keys within 60 s: {job.status} {job.error!r}")


def _recoveries(job) -> list[dict]:
    return [h for h in job.history if h.get("kind") == "recovery"]


def _first_recovery(job, timeout: float) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline and job.status == "running":
        if _recoveries(job):
            return _recoveries(job)[0]
        time.sleep(0.05)
    recs = _recoveries(job)
    if recs:
        return recs[0]
    pytest.fail(f"no recovery within {timeout} s: status {job.status}, error {job.error!r}\n{job.failures()}")


def _twice(out: str) -> dict[str, int]:
    """The files of ``out`` holding rows another file holds too: file -> such rows."""
    import pyarrow.parquet as pq

    rids = {f: set(pq.read_table(os.path.join(out, f), columns=["rid"]).column("rid").to_pylist())
            for f in sorted(os.listdir(out)) if f.endswith(".parquet")}
    seen = pd.Series([r for v in rids.values() for r in v])
    dup = set(seen[seen.duplicated()])
    return {f: len(v & dup) for f, v in rids.items() if v & dup}


def _finish_exact(job, frame, outs, out) -> None:
    """Wait for the job; exact; and nothing more is written after it ended (an instance of
    an attempt given up, frozen or cut off meanwhile, writes nothing)."""
    job.wait(timeout=240)
    assert not _twice(out), f"rows written twice, by file: {_twice(out)}\n{job.failures().to_string()}"
    check_exact(job, frame, outs, out)
    written = sorted(os.listdir(out))
    time.sleep(2)
    assert sorted(os.listdir(out)) == written
    check_exact(job, frame, outs, out)


def test_a_partition_between_two_workers_is_recovered_exactly(cluster, data, tmp_path):
    """Issue 49, item 1: two workers that exchange records cannot reach each other for 35 s,
    both still seen by the scheduler. The sender's connection times out (TCP timeout), the
    job recovers from its last checkpoint on workers that reach each other, and ends exact."""
    if not isinstance(cluster, NetnsCluster):
        pytest.skip(f"no network namespaces here: {netns_unavailable()}")
    job, frame, outs, out = _start(cluster, data, tmp_path, rate=3_000)
    try:
        sources = {w for (s, _), w in job.workers_of.items() if job.plan.stages[s].kind == "parquet_source"}
        a = sorted(sources)[0]
        b = sorted(set(job.workers_of.values()) - {a})[0]    # a keyed exchange sends from a to b
        t0 = time.time()
        cluster.partition(a, b)
        try:
            rec = _first_recovery(job, PARTITION)
            on = set(job.workers_of.values())
            time.sleep(max(PARTITION - (time.time() - t0), 0))
        finally:
            cluster.heal()
        healed = time.time() - t0
        print(f"partition {a} | {b}: recovery started {rec['started'] - t0:.1f} s after the cut "
              f"(TCP timeout {TCP_TIMEOUT} s), resumed in {rec['time_to_resume']:.1f} s on {sorted(on)}; "
              f"healed after {healed:.1f} s")
        assert rec["fault"] == "peer unreachable"
        assert "PeerUnreachableError" in rec["error"] and (a in rec["error"] or b in rec["error"])
        assert not {a, b} <= on                 # the new instances do not span the cut
        assert rec["started"] - t0 < TCP_TIMEOUT + 30
        _finish_exact(job, frame, outs, out)
        faults = job.failures()
        assert faults["kind"].iloc[0] == "peer unreachable" and faults["action"].iloc[0] == "recovered"
        assert len(_recoveries(job)) == 1, faults.to_string()     # one fault, one recovery
    finally:
        job.stop()


def test_a_frozen_worker_is_recovered_without_it(cluster, data, tmp_path):
    """Issue 49, item 3: a worker SIGSTOPped for longer than ``streamlb.fault.heartbeat-timeout``
    is detected, the job recovers on the others and ends exact; SIGCONTed later, the frozen
    worker's old instances write nothing."""
    with dask.config.set({"streamlb.fault.heartbeat-timeout": f"{HEARTBEAT}s"}):
        job, frame, outs, out = _start(cluster, data, tmp_path, rate=6_000)
        pid = None
        try:
            victim = sorted(set(job.workers_of.values()))[0]
            t0 = time.time()
            pid = cluster.freeze(victim)
            rec = _first_recovery(job, HEARTBEAT + 60)
            assert victim not in job.workers_of.values()
            time.sleep(2)                       # the job goes on without it a while
            cluster.thaw(pid)
            thawed = time.time() - t0
            print(f"frozen {victim}: recovery started {rec['started'] - t0:.1f} s after SIGSTOP (heartbeat timeout "
                  f"{HEARTBEAT} s), resumed in {rec['time_to_resume']:.1f} s; SIGCONT after {thawed:.1f} s")
            assert rec["fault"] == "worker unresponsive" and victim in rec["left_out"]
            assert rec["started"] - t0 < HEARTBEAT + 30
            _finish_exact(job, frame, outs, out)
            assert len(_recoveries(job)) == 1, job.failures().to_string()
        finally:
            if pid is not None:
                cluster.thaw(pid)
            job.stop()


def test_two_workers_killed_at_once_are_recovered_exactly(cluster, data, tmp_path):
    """Two of three workers SIGKILLed at the same moment: one recovery (or one more attempt if
    the second loss is seen during it) on the worker left and those the nannies restarted."""
    job, frame, outs, out = _start(cluster, data, tmp_path, rate=8_000)
    try:
        victims = sorted(set(job.workers_of.values()))[:2]
        t0 = time.time()
        cluster.kill(*victims)
        rec = _first_recovery(job, 60)
        _finish_exact(job, frame, outs, out)
        recs = _recoveries(job)
        lost = {w for r in recs for w in r["lost_workers"]}
        print(f"killed {victims}: {len(recs)} recoveries, the first started {rec['started'] - t0:.1f} s after "
              f"the kill and resumed in {rec['time_to_resume']:.1f} s; lost {sorted(lost)}")
        assert set(victims) <= lost and not set(victims) & set(job.workers_of.values())
        assert len(recs) <= 2 and all(r["fault"] == "worker lost" for r in recs)
    finally:
        job.stop()
